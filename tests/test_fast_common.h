/* Shared by test_fast_fwd.c and test_fast_bwd.c: one attention problem with
 * float inputs and double copies of them, the library's reference in double
 * (the oracle), and "naive32": the plain algorithm in float (two-pass softmax,
 * dot products summed left to right) that sets the error scale of the
 * tolerance rule every float fast path is tested against (as FlashAttention's
 * tests do):
 *
 *     max|fast - ref64| <= k * max|naive32 - ref64| + 1e-5
 *
 * k = 2 forward, 4 backward. Why this and not a fixed relative tolerance:
 * the float error of attention grows with the length of the rows, with D
 * and with the spread of the logits (exp amplifies an absolute logit error
 * into a relative weight error), so a constant would be either too loose
 * for small problems or too tight for large ones; a plain float
 * implementation of the same problem measures what float32 can do on it,
 * and FlashAttention states its guarantee the same way ("at most twice the
 * error of a standard float implementation"). The 1e-5 floor covers
 * problems where naive32 happens to be (nearly) exact. */
#ifndef QKV_TEST_FAST_COMMON_H
#define QKV_TEST_FAST_COMMON_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu.h"
#include "core/internal.h"
#include "kernels/kernels.h"
#include "qkv.h"
#include "test_util.h"

typedef struct fprob {
    qkv_attn_desc d;  /* F32 descriptor; pointer fields set to the float arrays */
    qkv_plan plan;
    int64_t nq_el, nk_el, nv_el, no_el, nl_el, na_el, nb_el;
    float *q, *k, *v, *bias, *dout;
    double *qd, *kd, *vd, *biasd, *doutd;
    int64_t key_lengths[8];
    int64_t offq[40], offk[40];
} fprob;

static inline double *fp_to_f64(const float *x, int64_t n) {
    double *d = malloc((size_t)(n ? n : 1) * sizeof(double));
    for (int64_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

/* Fill a problem for a descriptor (sizes and options already set in d;
 * key_lengths / offsets arrays copied in by the caller before, if used). */
static inline int fp_make(fprob *p, uint64_t seed, double sd_qk) {
    tu_rng r;
    tu_rng_seed(&r, seed);
    if (p->d.key_lengths) p->d.key_lengths = p->key_lengths;
    if (p->d.seq_offsets_q) p->d.seq_offsets_q = p->offq;
    if (p->d.seq_offsets_k) p->d.seq_offsets_k = p->offk;
    if (p->d.bias_kind != QKV_BIAS_NONE) p->d.bias = (const void *)1; /* for plan_make */
    if (qkv_plan_make(&p->d, &p->plan) != QKV_OK) return 0;
    const qkv_plan *pl = &p->plan;
    p->nq_el = pl->n_q_elems;
    p->nk_el = pl->n_k_elems;
    p->nv_el = pl->n_v_elems;
    p->no_el = pl->n_o_elems;
    p->nl_el = pl->n_lse_elems;
    p->na_el = pl->n_attn_elems;
    p->nb_el = p->d.bias_kind != QKV_BIAS_NONE ? pl->n_bias_elems : 0;
    p->q = malloc((size_t)p->nq_el * sizeof(float));
    p->k = malloc((size_t)p->nk_el * sizeof(float));
    p->v = malloc((size_t)p->nv_el * sizeof(float));
    p->dout = malloc((size_t)p->no_el * sizeof(float));
    p->bias = malloc((size_t)(p->nb_el ? p->nb_el : 1) * sizeof(float));
    tu_fill_normal_f32(&r, p->q, (size_t)p->nq_el, sd_qk);
    tu_fill_normal_f32(&r, p->k, (size_t)p->nk_el, sd_qk);
    tu_fill_normal_f32(&r, p->v, (size_t)p->nv_el, 1.0);
    tu_fill_normal_f32(&r, p->dout, (size_t)p->no_el, 1.0);
    for (int64_t i = 0; i < p->nb_el; i++) {
        double u = tu_rng_uniform(&r);
        p->bias[i] = u < 0.1 ? -INFINITY : (float)(2.0 * tu_rng_normal(&r));
    }
    p->d.bias = p->nb_el ? p->bias : NULL;
    p->d.dtype = QKV_F32;
    p->plan.d.bias = p->d.bias;
    p->qd = p->kd = p->vd = p->biasd = p->doutd = NULL;
    return 1;
}

/* Refresh the double copies after the caller edited the float inputs. */
static inline void fp_sync(fprob *p) {
    free(p->qd); free(p->kd); free(p->vd); free(p->biasd); free(p->doutd);
    p->qd = fp_to_f64(p->q, p->nq_el);
    p->kd = fp_to_f64(p->k, p->nk_el);
    p->vd = fp_to_f64(p->v, p->nv_el);
    p->biasd = fp_to_f64(p->bias, p->nb_el);
    p->doutd = fp_to_f64(p->dout, p->no_el);
}

static inline void fp_free(fprob *p) {
    free(p->q); free(p->k); free(p->v); free(p->bias); free(p->dout);
    free(p->qd); free(p->kd); free(p->vd); free(p->biasd); free(p->doutd);
}

/* The descriptor for a reference run in double. */
static inline qkv_attn_desc fp_desc64(const fprob *p) {
    qkv_attn_desc d = p->d;
    d.dtype = QKV_F64;
    d.impl = QKV_IMPL_REFERENCE;
    d.bias = p->nb_el ? p->biasd : NULL;
    return d;
}

static inline int64_t fp_idx(int64_t b, int64_t i, int64_t h, int64_t n, int64_t H, int64_t D) {
    return ((b * n + i) * H + h) * D;
}

/* naive32 logits of one row into s[lo..hi) (float, -inf masked) and the raw
 * (pre-cap) logits into raw; returns the visible count. */
static inline int64_t n32_row(const fprob *p, int64_t b, int64_t h, int64_t i, int64_t lo, int64_t hi,
                       float *raw, float *s) {
    const qkv_attn_desc *d = &p->plan.d;
    int64_t D = d->dim, hk = h / p->plan.group, vis = 0;
    const float *qi = p->q + fp_idx(b, i, h, d->n_q, d->heads, D);
    const float *slopes = d->alibi_slopes, *rel = d->rel_table; /* float in these problems */
    const int64_t pos = slopes || rel ? qkv_plan_query_position(&p->plan, i) : 0;
    float qn = 1.0f;
    if (d->score == QKV_SCORE_COSINE) {
        float ss = 0.0f;
        for (int64_t t = 0; t < D; t++) ss += qi[t] * qi[t];
        qn = sqrtf(ss) > 1e-12f ? sqrtf(ss) : 1e-12f;
    }
    for (int64_t j = lo; j < hi; j++) {
        const float *kj = p->k + fp_idx(b, j, hk, d->n_k, d->heads_kv, D);
        float acc = 0.0f;
        for (int64_t t = 0; t < D; t++) acc += qi[t] * kj[t];
        if (d->score == QKV_SCORE_SCALED_DOT) acc *= (float)d->scale;
        if (d->score == QKV_SCORE_COSINE) {
            float ss = 0.0f;
            for (int64_t t = 0; t < D; t++) ss += kj[t] * kj[t];
            float kn = sqrtf(ss) > 1e-12f ? sqrtf(ss) : 1e-12f;
            acc = acc / (qn * kn) / (float)d->temperature;
        }
        raw[j] = acc;
        float x = d->softcap > 0 ? (float)d->softcap * tanhf(acc / (float)d->softcap) : acc;
        if (d->bias_kind == QKV_BIAS_SHARED) x += p->bias[i * d->n_k + j];
        if (d->bias_kind == QKV_BIAS_PER_HEAD) x += p->bias[(h * d->n_q + i) * d->n_k + j];
        if (slopes) x -= slopes[h] * (float)(j > pos ? j - pos : pos - j);
        if (rel) x += rel[h * d->rel_buckets + qkv_plan_rel_bucket(&p->plan, pos, j)];
        s[j] = x;
        if (x != -INFINITY) vis++;
    }
    return vis;
}

/* naive32 weights of one row (and lse), float. */
static inline void n32_norm(const fprob *p, const float *s, float *w, int64_t lo, int64_t hi, int64_t vis,
                     float *lse) {
    const qkv_attn_desc *d = &p->plan.d;
    float m = -INFINITY, sum = 0.0f;
    for (int64_t j = lo; j < hi; j++) m = s[j] > m ? s[j] : m;
    if (m != -INFINITY)
        for (int64_t j = lo; j < hi; j++) sum += expf(s[j] - m);
    *lse = m == -INFINITY ? -INFINITY : m + logf(sum);
    for (int64_t j = lo; j < hi; j++) {
        float x = s[j];
        if (x == -INFINITY) { w[j] = 0.0f; continue; }
        if (d->norm == QKV_NORM_SOFTMAX) w[j] = expf(x - m) / sum;
        else if (d->norm == QKV_NORM_RELU) w[j] = (x < 0 ? 0.0f : x) / (d->relu_divide_by_count ? (float)vis : 1.0f);
        else w[j] = 1.0f / (1.0f + expf(-x));
    }
}

/* The dropout factor of entry (b, h, i, j) in float, 1 without dropout:
 * naive32 drops what the reference drops. */
static inline float n32_drop(const fprob *p, int64_t b, int64_t h, int64_t i, int64_t j) {
    return p->plan.d.dropout > 0.0 ? (float)qkv_attn_dropout_keep(&p->plan, b, h, i, j) : 1.0f;
}

/* naive32 forward: out, lse (may be NULL), attn (may be NULL, before dropout). */
static inline void n32_forward(const fprob *p, float *out, float *lse, float *attn) {
    const qkv_attn_desc *d = &p->plan.d;
    int64_t nk = d->n_k, Dv = d->dim_v;
    float *raw = malloc((size_t)nk * sizeof(float)), *s = malloc((size_t)nk * sizeof(float)),
          *w = malloc((size_t)nk * sizeof(float));
    for (int64_t b = 0; b < d->batch; b++)
        for (int64_t h = 0; h < d->heads; h++)
            for (int64_t i = 0; i < d->n_q; i++) {
                int64_t lo, hi;
                qkv_plan_key_range(&p->plan, b, i, &lo, &hi);
                int64_t vis = n32_row(p, b, h, i, lo, hi, raw, s);
                float l;
                n32_norm(p, s, w, lo, hi, vis, &l);
                float *o = out + fp_idx(b, i, h, d->n_q, d->heads, Dv);
                for (int64_t t = 0; t < Dv; t++) o[t] = 0.0f;
                for (int64_t j = lo; j < hi; j++) {
                    if (s[j] == -INFINITY) continue;
                    const float *vj = p->v + fp_idx(b, j, h / p->plan.group, nk, d->heads_kv, Dv);
                    const float wz = w[j] * n32_drop(p, b, h, i, j);
                    for (int64_t t = 0; t < Dv; t++) o[t] += wz * vj[t];
                }
                int64_t row = (b * d->heads + h) * d->n_q + i;
                if (lse) lse[row] = l;
                if (attn)
                    for (int64_t j = 0; j < nk; j++) attn[row * nk + j] = (j >= lo && j < hi) ? w[j] : 0.0f;
            }
    free(raw); free(s); free(w);
}

/* naive32 backward in float (the reference's algorithm, float arithmetic);
 * drel (NULL: not wanted): the gradient of the relative-position table. */
static inline void n32_backward(const fprob *p, float *dq, float *dk, float *dv, float *dbias, float *drel) {
    const qkv_attn_desc *d = &p->plan.d;
    int64_t nk = d->n_k, D = d->dim, Dv = d->dim_v, G = p->plan.group;
    memset(dq, 0, (size_t)p->nq_el * sizeof(float));
    memset(dk, 0, (size_t)p->nk_el * sizeof(float));
    memset(dv, 0, (size_t)p->nv_el * sizeof(float));
    if (dbias) memset(dbias, 0, (size_t)p->nb_el * sizeof(float));
    if (drel) memset(drel, 0, (size_t)p->plan.n_rel_elems * sizeof(float));
    float *raw = malloc((size_t)nk * sizeof(float)), *s = malloc((size_t)nk * sizeof(float)),
          *w = malloc((size_t)nk * sizeof(float)), *dp = malloc((size_t)nk * sizeof(float));
    float *dqh = malloc((size_t)D * sizeof(float));
    float *kn = malloc((size_t)(p->nk_el / D) * sizeof(float));
    int cos = d->score == QKV_SCORE_COSINE;
    for (int64_t r = 0; r < p->nk_el / D; r++) {
        float ss = 0.0f;
        for (int64_t t = 0; t < D; t++) ss += p->k[r * D + t] * p->k[r * D + t];
        kn[r] = sqrtf(ss) > 1e-12f ? sqrtf(ss) : 1e-12f;
    }
    float scale = d->score == QKV_SCORE_SCALED_DOT ? (float)d->scale
                  : cos ? 1.0f / (float)d->temperature : 1.0f;
    for (int64_t b = 0; b < d->batch; b++)
        for (int64_t h = 0; h < d->heads; h++)
            for (int64_t i = 0; i < d->n_q; i++) {
                int64_t lo, hi, hk = h / G;
                qkv_plan_key_range(&p->plan, b, i, &lo, &hi);
                int64_t vis = n32_row(p, b, h, i, lo, hi, raw, s);
                float l;
                n32_norm(p, s, w, lo, hi, vis, &l);
                if (vis == 0) continue;
                const float *dorow = p->dout + fp_idx(b, i, h, d->n_q, d->heads, Dv);
                const float *qi = p->q + fp_idx(b, i, h, d->n_q, d->heads, D);
                float *dqi = dq + fp_idx(b, i, h, d->n_q, d->heads, D);
                float qn = 1.0f;
                if (cos) {
                    float ss = 0.0f;
                    for (int64_t t = 0; t < D; t++) ss += qi[t] * qi[t];
                    qn = sqrtf(ss) > 1e-12f ? sqrtf(ss) : 1e-12f;
                    memset(dqh, 0, (size_t)D * sizeof(float));
                }
                float pdp = 0.0f;
                for (int64_t j = lo; j < hi; j++) {
                    if (s[j] == -INFINITY) continue;
                    const float *vj = p->v + fp_idx(b, j, hk, nk, d->heads_kv, Dv);
                    float *dvj = dv + fp_idx(b, j, hk, nk, d->heads_kv, Dv);
                    float acc = 0.0f, wz = w[j] * n32_drop(p, b, h, i, j);
                    for (int64_t t = 0; t < Dv; t++) {
                        acc += dorow[t] * vj[t];
                        dvj[t] += wz * dorow[t];
                    }
                    dp[j] = acc * n32_drop(p, b, h, i, j);
                    pdp += w[j] * acc;
                }
                for (int64_t j = lo; j < hi; j++) {
                    if (s[j] == -INFINITY) continue;
                    float ds;
                    if (d->norm == QKV_NORM_SOFTMAX) ds = w[j] * (dp[j] - pdp);
                    else if (d->norm == QKV_NORM_RELU)
                        ds = (w[j] > 0 ? dp[j] : 0.0f) / (d->relu_divide_by_count ? (float)vis : 1.0f);
                    else ds = dp[j] * w[j] * (1.0f - w[j]);
                    if (dbias) {
                        int64_t bi = d->bias_kind == QKV_BIAS_PER_HEAD ? (h * d->n_q + i) * nk + j : i * nk + j;
                        dbias[bi] += ds;
                    }
                    if (drel)
                        drel[h * d->rel_buckets +
                             qkv_plan_rel_bucket(&p->plan, qkv_plan_query_position(&p->plan, i), j)] += ds;
                    if (d->softcap > 0) {
                        float t = tanhf(raw[j] / (float)d->softcap);
                        ds *= 1.0f - t * t;
                    }
                    const float *kj = p->k + fp_idx(b, j, hk, nk, d->heads_kv, D);
                    float *dkj = dk + fp_idx(b, j, hk, nk, d->heads_kv, D);
                    int64_t kr = (b * nk + j) * d->heads_kv + hk;
                    if (!cos) {
                        for (int64_t t = 0; t < D; t++) {
                            dqi[t] += scale * ds * kj[t];
                            dkj[t] += scale * ds * qi[t];
                        }
                    } else {
                        for (int64_t t = 0; t < D; t++) {
                            dqh[t] += scale * ds * kj[t] / kn[kr];
                            dkj[t] += scale * ds * qi[t] / qn;
                        }
                    }
                }
                if (cos) {
                    float dot = 0.0f, ss = qn * qn;
                    for (int64_t t = 0; t < D; t++) dot += qi[t] * dqh[t];
                    for (int64_t t = 0; t < D; t++)
                        dqi[t] += qn <= 1e-12f ? dqh[t] / 1e-12f : (dqh[t] - qi[t] * dot / ss) / qn;
                }
            }
    if (cos)
        for (int64_t r = 0; r < p->nk_el / D; r++) {
            const float *x = p->k + r * D;
            float *g = dk + r * D, dot = 0.0f, n = kn[r];
            for (int64_t t = 0; t < D; t++) dot += x[t] * g[t];
            for (int64_t t = 0; t < D; t++) g[t] = n <= 1e-12f ? g[t] / 1e-12f : (g[t] - x[t] * dot / (n * n)) / n;
        }
    free(raw); free(s); free(w); free(dp); free(dqh); free(kn);
}

/* Packed sequences: num_seqs + 1 query offsets oq and key offsets ok (NULL:
 * the same as the queries) into p and its descriptor. */
static inline void fp_set_packed(fprob *p, int64_t num_seqs, const int64_t *oq, const int64_t *ok) {
    memcpy(p->offq, oq, (size_t)(num_seqs + 1) * sizeof(int64_t));
    if (ok) memcpy(p->offk, ok, (size_t)(num_seqs + 1) * sizeof(int64_t));
    p->d.num_seqs = num_seqs;
    p->d.seq_offsets_q = p->offq;
    p->d.seq_offsets_k = ok ? p->offk : NULL;
}

/* The dropout sweep of test_fast_fwd.c and test_fast_bwd.c: case idx <
 * FP_DROPOUT_CASES into p (zeroed here), p = 0.1 for even idx and 0.5 for
 * odd: every mask kind on awkward sizes, n_q != n_k, GQA, D_v != D, key
 * lengths (one of 0: a fully masked batch), packed sequences, the other
 * normalisers, bias and soft-cap (tiles in logit units), and D = 64 over
 * several tiles inside and on a mask's edge. */
#define FP_DROPOUT_CASES 40
static inline void fp_dropout_case(fprob *p, int idx) {
    static const int64_t sq[] = {1, 2, 7, 63, 65, 129}, cross[][2] = {{7, 129}, {129, 7}, {65, 200}, {200, 65}};
    const int k = idx / 2;
    int64_t B = 1, nq = 70, nk = 70, H = 2, Hkv = 1, D = 16, Dv = 16;
    qkv_mask mask = (qkv_mask)(k % 4);
    memset(p, 0, sizeof *p);
    if (k < 6) nq = nk = sq[k];
    else if (k < 10) B = 2, nq = cross[k - 6][0], nk = cross[k - 6][1], H = 4, Hkv = 2, Dv = 24;
    else if (k < 12) B = 2, nq = nk = k == 10 ? 130 : 70, mask = k == 10 ? QKV_MASK_CAUSAL : QKV_MASK_NONE;
    else if (k == 12) nq = nk = 150, mask = QKV_MASK_CAUSAL;
    else if (k == 13) nq = 100, nk = 170, Hkv = 2, Dv = 24, mask = QKV_MASK_WINDOW;
    else if (k >= 17 && k <= 18) nq = nk = 300, D = Dv = 64, Hkv = k == 17 ? 2 : 1, mask = (qkv_mask)(k - 17);
    else if (k == 19) nq = nk = 260, D = Dv = 32, mask = QKV_MASK_WINDOW;
    qkv_attn_desc_init(&p->d);
    qkv_attn_desc *d = &p->d;
    d->batch = B, d->n_q = nq, d->n_k = nk, d->heads = H, d->heads_kv = Hkv, d->dim = D, d->dim_v = Dv;
    d->mask = mask;
    d->window_left = mask == QKV_MASK_WINDOW || mask == QKV_MASK_CAUSAL_WINDOW ? (k == 19 ? 40 : 17) : 0;
    d->window_right = mask == QKV_MASK_WINDOW ? (k == 19 ? 40 : 5) : 0;
    if (k == 10 || k == 11) {
        p->key_lengths[0] = k == 10 ? 130 : 0;
        p->key_lengths[1] = 33;
        d->key_lengths = p->key_lengths;
    }
    const int64_t o4[] = {0, 10, 10, 90, 150}, oq[] = {0, 30, 100}, ok[] = {0, 50, 170};
    if (k == 12) fp_set_packed(p, 4, o4, NULL);
    if (k == 13) fp_set_packed(p, 2, oq, ok);
    if (k == 14) d->norm = QKV_NORM_RELU, d->relu_divide_by_count = 1, d->bias_kind = QKV_BIAS_SHARED;
    if (k == 15) d->norm = QKV_NORM_SIGMOID, d->bias_kind = QKV_BIAS_PER_HEAD, d->softcap = 2.5;
    if (k == 16) d->softcap = 2.5, d->bias_kind = QKV_BIAS_PER_HEAD;
    d->dropout = idx % 2 ? 0.5 : 0.1;
    d->dropout_seed = 0x5EED0000u + (uint64_t)idx;
}

/* max |a - b| (float vs double), NaN on one side only = inf; -inf == -inf. */
static inline double fp_err(const float *a, const double *b, int64_t n) {
    return tu_max_abs_diff_f32_f64(a, b, (size_t)n);
}

static inline int fp_any_nan(const float *x, int64_t n) { return tu_has_nan_f32(x, (size_t)n); }

/* Runs tests() once on every ISA path the CPU has (forced in turn, the
 * active one named in *arch for messages), printing each path's verdict;
 * fails when none ran. Returns tu_finish(). */
static inline int fp_each_arch(int *arch, void (*tests)(void)) {
    int ran = 0;
    for (int a = 0; a < QKV_ARCH_COUNT; a++) {
        if (!qkv_cpu_has((qkv_arch)a)) {
            printf("arch %s: not available here, skipped\n", qkv_arch_name(a));
            continue;
        }
        CHECK(qkv_cpu_force_arch(a) == 1, "cannot force %s", qkv_arch_name(a));
        CHECK(strcmp(qkv_kernels_active()->name, qkv_arch_name(a)) == 0, "forced arch not active");
        *arch = a;
        long before = tu_failed;
        tests();
        printf("arch %s: %s\n", qkv_arch_name(a), tu_failed == before ? "ok" : "FAILED");
        ran++;
    }
    qkv_cpu_force_arch(-1);
    CHECK(ran >= 1, "no arch ran");
    return tu_finish();
}

#endif
