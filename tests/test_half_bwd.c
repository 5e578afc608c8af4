/* The half-precision backward (docs/HALF.md): the bf16 fast backward
 * (AVX512-BF16, attn/half_bwd.c) where the CPU has it, the portable path
 * everywhere (and for fp16), against the reference in double on the same
 * half inputs, with FlashAttention's rule for gradients:
 *
 *     max|grad - ref64| <= 5 * max|plain_half - ref64| + 1e-5   for dq, dk, dv,
 *
 * the baseline being the plain half implementation written below:
 * matmul - softmax - matmul in half with float accumulation (S = Q K^T in
 * float from half inputs, float softmax, P rounded to half before P V and
 * P^T dO, dP = dO V^T in float, dS = P (dP - rowsum(P dP)) rounded to half
 * before dS K and dS^T Q, every stored result rounded to half).
 *
 * Swept over n in {1, 2, 7, 63, 65, 129}, D in {1, 8, 31, 64, 80}, every
 * mask (none, causal, window, causal window, key lengths with an empty
 * batch, packed sequences), each with n_q = n_k, GQA with n_k > n_q, and
 * n_q > n_k (fully masked rows under causal). Also: fully masked rows and
 * unseen keys give exactly 0; 1, 2 and 3 threads give identical bits; the
 * public call takes the fast path when it applies (its result is bitwise
 * the direct call's) and the portable one when it does not (QKV_ARCH forced
 * to avx2 or generic, fp16, NaN in a masked key); larger problems with
 * several key blocks, chunks and query blocks. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn/half.h"
#include "core/cpu.h"
#include "core/half.h"
#include "core/internal.h"
#include "qkv.h"
#include "test_util.h"


typedef struct prob {
    qkv_attn_desc d; /* dtype = the half type */
    qkv_plan pl;
    qkv_dtype dt;
    int64_t kl[4], off[4];
    int64_t nq, nk, nv, no, nl;
    uint16_t *q, *k, *v, *dout;
    double *qd, *kd, *vd, *dod;
} prob;

static int make(prob *p, qkv_dtype dt, uint64_t seed, double sd) {
    tu_rng r;
    tu_rng_seed(&r, seed);
    p->dt = dt;
    p->d.dtype = dt;
    if (p->d.key_lengths) p->d.key_lengths = p->kl;
    if (p->d.seq_offsets_q) p->d.seq_offsets_q = p->d.seq_offsets_k = p->off;
    if (qkv_plan_make(&p->d, &p->pl) != QKV_OK) return 0;
    p->nq = p->pl.n_q_elems;
    p->nk = p->pl.n_k_elems;
    p->nv = p->pl.n_v_elems;
    p->no = p->pl.n_o_elems;
    p->nl = p->pl.n_lse_elems;
    p->q = tu_half_random(&r, dt, p->nq, sd, &p->qd);
    p->k = tu_half_random(&r, dt, p->nk, sd, &p->kd);
    p->v = tu_half_random(&r, dt, p->nv, 1.0, &p->vd);
    p->dout = tu_half_random(&r, dt, p->no, 1.0, &p->dod);
    return 1;
}

static void unmake(prob *p) {
    free(p->q); free(p->k); free(p->v); free(p->dout);
    free(p->qd); free(p->kd); free(p->vd); free(p->dod);
}

static int64_t at4(int64_t b, int64_t i, int64_t h, int64_t n, int64_t H, int64_t D) {
    return ((b * n + i) * H + h) * D;
}

/* The plain half implementations, dense per (b, h); gradients as floats
 * holding half values. Products always take half inputs and sum in float.
 *
 * ops = 1 (the baseline of the rule): every operation's result stored in
 * half, as a framework running matmul - softmax - matmul in bf16 does and
 * as FlashAttention's tests run their reference in bf16 with autograd:
 * qs = half(q scale), S = half(qs K^T), P = half(softmax(S)) (float
 * inside), dP = half(dO V^T), dS = half(P (dP - rowsum(P dP))) (float
 * inside), dV = half(P^T dO), dK = half(dS^T qs), dQ = half(half(dS K) scale).
 *
 * ops = 0 (stricter, reported only): S, softmax and dP kept in float, only
 * P (before P^T dO) and dS (before dS K, dS^T Q) rounded, D = rowsum(P dP)
 * from the float weights (test_half.c's baseline). */
static void plain_half(const prob *p, int ops, float *dq, float *dk, float *dv) {
    const qkv_plan *pl = &p->pl;
    const qkv_attn_desc *d = &pl->d;
    const qkv_dtype dt = p->dt;
    const int64_t nq = d->n_q, nk = d->n_k, D = d->dim, Dv = d->dim_v, H = d->heads, Hk = d->heads_kv;
    const float scale = (float)d->scale;
    float *S = malloc((size_t)(nq * nk) * sizeof(float)), *dP = malloc((size_t)(nq * nk) * sizeof(float));
    /* one head's rows, dense: qs [nq, D], kh [nk, D], vh [nk, Dv], gh [nq, Dv] */
    float *qs = malloc((size_t)(nq * D) * sizeof(float)), *kh = malloc((size_t)(nk * D) * sizeof(float));
    float *vh = malloc((size_t)(nk * Dv) * sizeof(float)), *gh = malloc((size_t)(nq * Dv) * sizeof(float));
    float *dka = calloc((size_t)p->nk, sizeof(float)), *dva = calloc((size_t)p->nv, sizeof(float));
    float *dkh = malloc((size_t)(nk * D) * sizeof(float)), *dvh = malloc((size_t)(nk * Dv) * sizeof(float));
    for (int64_t b = 0; b < d->batch; b++)
        for (int64_t h = 0; h < H; h++) {
            const int64_t hk = h / pl->group;
            for (int64_t i = 0; i < nq; i++) {
                for (int64_t t = 0; t < D; t++) {
                    float x = (float)p->qd[at4(b, i, h, nq, H, D) + t];
                    qs[i * D + t] = ops ? tu_half_round(dt, x * scale) : x;
                }
                for (int64_t t = 0; t < Dv; t++) gh[i * Dv + t] = (float)p->dod[at4(b, i, h, nq, H, Dv) + t];
            }
            for (int64_t j = 0; j < nk; j++) {
                for (int64_t t = 0; t < D; t++) kh[j * D + t] = (float)p->kd[at4(b, j, hk, nk, Hk, D) + t];
                for (int64_t t = 0; t < Dv; t++) vh[j * Dv + t] = (float)p->vd[at4(b, j, hk, nk, Hk, Dv) + t];
            }
            /* S (masked: -inf), softmax */
            for (int64_t i = 0; i < nq; i++) {
                int64_t lo, hi;
                qkv_plan_key_range(pl, b, i, &lo, &hi);
                float *s = S + i * nk, m = -INFINITY, sum = 0.0f;
                for (int64_t j = 0; j < nk; j++) {
                    s[j] = -INFINITY;
                    if (j < lo || j >= hi) continue;
                    float acc = 0.0f;
                    for (int64_t t = 0; t < D; t++) acc += qs[i * D + t] * kh[j * D + t];
                    s[j] = ops ? tu_half_round(dt, acc) : acc * scale;
                    if (s[j] > m) m = s[j];
                }
                for (int64_t j = lo; j < hi; j++) sum += expf(s[j] - m);
                for (int64_t j = 0; j < nk; j++) {
                    float w = j >= lo && j < hi ? expf(s[j] - m) / sum : 0.0f;
                    s[j] = ops ? tu_half_round(dt, w) : w;
                }
                /* dP = dO V^T, D_i = rowsum(P dP), dS = P (dP - D_i) in half */
                float di = 0.0f;
                for (int64_t j = 0; j < nk; j++) {
                    float acc = 0.0f;
                    if (j >= lo && j < hi)
                        for (int64_t t = 0; t < Dv; t++) acc += gh[i * Dv + t] * vh[j * Dv + t];
                    dP[i * nk + j] = ops ? tu_half_round(dt, acc) : acc;
                    di += s[j] * dP[i * nk + j];
                }
                for (int64_t j = 0; j < nk; j++) {
                    dP[i * nk + j] = tu_half_round(dt, s[j] * (dP[i * nk + j] - di));
                    s[j] = tu_half_round(dt, s[j]); /* P in half for P^T dO */
                }
            }
            /* dV += P^T dO (P in half), dK += dS^T qs, dQ = dS K: float sums
             * over i (resp. j) in increasing order, the inner loops over the
             * columns (independent sums) */
            const float ks = ops ? 1.0f : scale;
            memset(dkh, 0, (size_t)(nk * D) * sizeof(float));
            memset(dvh, 0, (size_t)(nk * Dv) * sizeof(float));
            for (int64_t i = 0; i < nq; i++)
                for (int64_t j = 0; j < nk; j++) {
                    const float w = S[i * nk + j], ds = dP[i * nk + j];
                    for (int64_t t = 0; t < Dv; t++) dvh[j * Dv + t] += w * gh[i * Dv + t];
                    for (int64_t t = 0; t < D; t++) dkh[j * D + t] += ds * qs[i * D + t];
                }
            for (int64_t j = 0; j < nk; j++) {
                float *dvj = dva + at4(b, j, hk, nk, Hk, Dv), *dkj = dka + at4(b, j, hk, nk, Hk, D);
                for (int64_t t = 0; t < Dv; t++) dvj[t] += dvh[j * Dv + t];
                for (int64_t t = 0; t < D; t++) dkj[t] += dkh[j * D + t] * ks;
            }
            for (int64_t i = 0; i < nq; i++) {
                float *acc = dkh; /* reused: [D] */
                for (int64_t t = 0; t < D; t++) acc[t] = 0.0f;
                for (int64_t j = 0; j < nk; j++) {
                    const float ds = dP[i * nk + j];
                    for (int64_t t = 0; t < D; t++) acc[t] += ds * kh[j * D + t];
                }
                for (int64_t t = 0; t < D; t++)
                    dq[at4(b, i, h, nq, H, D) + t] = ops ? tu_half_round(dt, tu_half_round(dt, acc[t]) * scale) : tu_half_round(dt, acc[t] * scale);
            }
        }
    /* (with ops = 1 a framework would round dK and dV per head before the
     * GQA sum; summing in float is the kinder choice) */
    for (int64_t x = 0; x < p->nk; x++) dk[x] = tu_half_round(dt, dka[x]);
    for (int64_t x = 0; x < p->nv; x++) dv[x] = tu_half_round(dt, dva[x]);
    free(S); free(dP); free(qs); free(kh); free(vh); free(gh); free(dka); free(dva); free(dkh); free(dvh);
}

static double err_half(qkv_dtype dt, const uint16_t *a, const double *ref, int64_t n) {
    double m = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)tu_half_to_f32(dt, a[i]) - ref[i]);
        if (isnan(e)) return INFINITY;
        if (e > m) m = e;
    }
    return m;
}

static double err_f32(const float *a, const double *ref, int64_t n) {
    double m = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - ref[i]);
        if (isnan(e)) return INFINITY;
        if (e > m) m = e;
    }
    return m;
}

/* What FlashAttention-2's identity D_i = rowsum(dO_i * O_i) costs when O is
 * the stored half output (as every such backward, the portable path's too,
 * is given): with d_i = dO_i . (O_half_i - O_i) in double, the exact
 * gradients change by dQ_i -= scale d_i sum_j P_ij K_j and
 * dK_j -= scale sum_i d_i P_ij Q_i (dV is unaffected). Returns the largest
 * change of dq (e[0]) and dk (e[1]), computed in double. This is an error
 * of the stored output, not of the kernels; it dominates only where the
 * gradient itself is tiny (n = 2, D = 1: P_0 P_1 (V_0 - V_1)(K_0 - K_1)). */
static void d_term(const prob *p, const uint16_t *o_half, double e[2]) {
    const qkv_plan *pl = &p->pl;
    const qkv_attn_desc *d = &pl->d;
    const int64_t nq = d->n_q, nk = d->n_k, D = d->dim, Dv = d->dim_v, H = d->heads, Hk = d->heads_kv;
    const double scale = d->scale;
    qkv_attn_desc d64 = p->d;
    d64.dtype = QKV_F64;
    d64.impl = QKV_IMPL_REFERENCE;
    double *o64 = malloc((size_t)p->no * 8), *l64 = malloc((size_t)p->nl * 8), *dk = calloc((size_t)p->nk, 8);
    double *P = malloc((size_t)nk * 8), *kbar = malloc((size_t)D * 8);
    e[0] = e[1] = 0.0;
    if (qkv_attention_forward(&d64, p->qd, p->kd, p->vd, o64, NULL, l64) != QKV_OK) e[0] = e[1] = INFINITY;
    for (int64_t b = 0; b < d->batch && e[0] < INFINITY; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < nq; i++) {
                int64_t lo, hi;
                qkv_plan_key_range(pl, b, i, &lo, &hi);
                if (lo >= hi) continue;
                const int64_t hk = h / pl->group, row = (b * H + h) * nq + i;
                double di = 0.0;
                for (int64_t t = 0; t < Dv; t++) {
                    int64_t x = at4(b, i, h, nq, H, Dv) + t;
                    di += p->dod[x] * ((double)tu_half_to_f32(p->dt, o_half[x]) - o64[x]);
                }
                for (int64_t t = 0; t < D; t++) kbar[t] = 0.0;
                for (int64_t j = lo; j < hi; j++) {
                    double sj = 0.0;
                    for (int64_t t = 0; t < D; t++)
                        sj += p->qd[at4(b, i, h, nq, H, D) + t] * p->kd[at4(b, j, hk, nk, Hk, D) + t];
                    P[j] = exp(sj * scale - l64[row]);
                    for (int64_t t = 0; t < D; t++) {
                        kbar[t] += P[j] * p->kd[at4(b, j, hk, nk, Hk, D) + t];
                        dk[at4(b, j, hk, nk, Hk, D) + t] += scale * di * P[j] * p->qd[at4(b, i, h, nq, H, D) + t];
                    }
                }
                for (int64_t t = 0; t < D; t++)
                    if (fabs(scale * di * kbar[t]) > e[0]) e[0] = fabs(scale * di * kbar[t]);
            }
    for (int64_t x = 0; x < p->nk; x++)
        if (fabs(dk[x]) > e[1]) e[1] = fabs(dk[x]);
    free(o64); free(l64); free(dk); free(P); free(kbar);
}

typedef struct grads16 {
    uint16_t *dq, *dk, *dv;
} grads16;

static void g_alloc(grads16 *g, const prob *p) {
    g->dq = tu_guarded_alloc((size_t)p->nq * 2);
    g->dk = tu_guarded_alloc((size_t)p->nk * 2);
    g->dv = tu_guarded_alloc((size_t)p->nv * 2);
}
static void g_free(grads16 *g) {
    tu_guarded_free(g->dq); tu_guarded_free(g->dk); tu_guarded_free(g->dv);
}
static int g_same(const grads16 *a, const grads16 *b, const prob *p) {
    return !memcmp(a->dq, b->dq, (size_t)p->nq * 2) && !memcmp(a->dk, b->dk, (size_t)p->nk * 2) &&
           !memcmp(a->dv, b->dv, (size_t)p->nv * 2);
}
static qkv_status g_run(prob *p, grads16 *g, const void *out, const float *lse, int threads) {
    qkv_attn_grads gg = {0};
    gg.dq = g->dq; gg.dk = g->dk; gg.dv = g->dv;
    p->d.threads = threads;
    return qkv_attention_backward(&p->d, p->q, p->k, p->v, out, lse, p->dout, &gg);
}

static int g_fast_calls, g_fast_expected;
/* worst error / (baseline error + 1e-5): bf16 fast, bf16 portable, fp16 */
static double g_worst[3], g_worst_strict[3];
static int g_dterm_needed; /* checks where 5 x plain alone was not met */
static int g_rule_checks;

/* Everything about one problem. expect_fast: the bf16 fast backward must
 * apply (checked by calling it directly). */
static void check(prob *p, const char *what, int expect_fast) {
    const qkv_attn_desc *d = &p->pl.d;
    const qkv_dtype dt = p->dt;
    qkv_attn_desc d64 = p->d;
    d64.dtype = QKV_F64;
    d64.impl = QKV_IMPL_REFERENCE;
    d64.threads = 1;
    double *dq64 = malloc((size_t)p->nq * 8), *dk64 = malloc((size_t)p->nk * 8), *dv64 = malloc((size_t)p->nv * 8);
    qkv_attn_grads g64 = {0};
    g64.dq = dq64; g64.dk = dk64; g64.dv = dv64;
    CHECK_STATUS(qkv_attention_backward(&d64, p->qd, p->kd, p->vd, NULL, NULL, p->dod, &g64), QKV_OK);
    float *dqb = malloc((size_t)p->nq * 4), *dkb = malloc((size_t)p->nk * 4), *dvb = malloc((size_t)p->nv * 4);
    plain_half(p, 1, dqb, dkb, dvb);
    const double eb[3] = {err_f32(dqb, dq64, p->nq), err_f32(dkb, dk64, p->nk), err_f32(dvb, dv64, p->nv)};
    plain_half(p, 0, dqb, dkb, dvb);
    const double es[3] = {err_f32(dqb, dq64, p->nq), err_f32(dkb, dk64, p->nk), err_f32(dvb, dv64, p->nv)};

    uint16_t *o = malloc((size_t)p->no * 2);
    float *l = malloc((size_t)p->nl * 4);
    p->d.threads = 1;
    CHECK_STATUS(qkv_attention_forward(&p->d, p->q, p->k, p->v, o, NULL, l), QKV_OK);
    grads16 g[3], direct;
    for (int t = 0; t < 3; t++) g_alloc(&g[t], p);
    g_alloc(&direct, p);
    for (int t = 0; t < 3; t++) CHECK(g_run(p, &g[t], o, l, t + 1) == QKV_OK, "%s: status", what);
    CHECK(g_same(&g[0], &g[1], p) && g_same(&g[0], &g[2], p), "%s: 2 or 3 threads differ from 1", what);
    /* the route: the direct fast call must apply, and equal the public one */
    qkv_plan pl;
    p->d.threads = 1;
    CHECK_STATUS(qkv_plan_make(&p->d, &pl), QKV_OK);
    qkv_status fs = qkv_half_fast_backward(&pl, p->q, p->k, p->v, o, l, p->dout, direct.dq, direct.dk, direct.dv);
    if (expect_fast) {
        g_fast_expected++;
        g_fast_calls += fs == QKV_OK;
        CHECK(fs == QKV_OK, "%s: the fast backward did not apply (%d)", what, (int)fs);
        CHECK(fs != QKV_OK || g_same(&direct, &g[0], p), "%s: the public call did not take the fast path", what);
    } else {
        CHECK(fs == QKV_ERR_UNSUPPORTED, "%s: the fast backward applied where it must not (%d)", what, (int)fs);
    }
    const double e[3] = {err_half(dt, g[0].dq, dq64, p->nq), err_half(dt, g[0].dk, dk64, p->nk),
                         err_half(dt, g[0].dv, dv64, p->nv)};
    const char *nm[3] = {"dq", "dk", "dv"};
    double ed[3] = {0.0, 0.0, 0.0};
    d_term(p, o, ed);
    for (int t = 0; t < 3; t++) {
        g_rule_checks++;
        CHECK(e[t] <= 5.0 * eb[t] + ed[t] + 1e-5, "%s: %s error %.3g > 5 x plain half %.3g + D term %.3g", what,
              nm[t], e[t], eb[t], ed[t]);
        if (e[t] > 5.0 * eb[t] + 1e-5) {
            g_dterm_needed++;
            printf("note: %s: %s error %.3g is over 5 x plain half %.3g, within it + the D term %.3g\n", what, nm[t],
                   e[t], eb[t], ed[t]);
        }
        double r = e[t] / (eb[t] + 1e-5), rs = e[t] / (es[t] + 1e-5);
        int ix = p->dt == QKV_BF16 ? (expect_fast ? 0 : 1) : 2;
        if (r > g_worst[ix]) g_worst[ix] = r;
        if (getenv("HB_VERBOSE") && r > 2.0) printf("ratio %.2f %s %s (e %.3g eb %.3g)\n", r, what, nm[t], e[t], eb[t]);
        if (rs > g_worst_strict[ix]) g_worst_strict[ix] = rs;
    }
    for (int t = 0; t < 3; t++)
        CHECK(tu_guarded_ok(g[t].dq) && tu_guarded_ok(g[t].dk) && tu_guarded_ok(g[t].dv), "%s: guard bytes", what);
    /* fully masked query rows: dq exactly 0; keys no query sees: dk, dv 0 */
    int zero_ok = 1;
    char *seen = calloc((size_t)(d->batch * d->n_k), 1);
    for (int64_t b = 0; b < d->batch; b++)
        for (int64_t i = 0; i < d->n_q; i++) {
            int64_t lo, hi;
            qkv_plan_key_range(&p->pl, b, i, &lo, &hi);
            for (int64_t j = lo; j < hi; j++) seen[b * d->n_k + j] = 1;
            if (lo < hi) continue;
            for (int64_t h = 0; h < d->heads; h++)
                for (int64_t t = 0; t < d->dim; t++)
                    zero_ok &= tu_half_to_f32(dt, g[0].dq[at4(b, i, h, d->n_q, d->heads, d->dim) + t]) == 0.0f;
        }
    for (int64_t b = 0; b < d->batch; b++)
        for (int64_t j = 0; j < d->n_k; j++) {
            if (seen[b * d->n_k + j]) continue;
            for (int64_t h = 0; h < d->heads_kv; h++) {
                for (int64_t t = 0; t < d->dim; t++)
                    zero_ok &= tu_half_to_f32(dt, g[0].dk[at4(b, j, h, d->n_k, d->heads_kv, d->dim) + t]) == 0.0f;
                for (int64_t t = 0; t < d->dim_v; t++)
                    zero_ok &= tu_half_to_f32(dt, g[0].dv[at4(b, j, h, d->n_k, d->heads_kv, d->dim_v) + t]) == 0.0f;
            }
        }
    CHECK(zero_ok, "%s: a fully masked row or unseen key has a nonzero gradient", what);
    free(seen);
    /* out and lse not given: recomputed, same rule */
    CHECK_STATUS(g_run(p, &g[1], NULL, NULL, 2), QKV_OK);
    const double e2[3] = {err_half(dt, g[1].dq, dq64, p->nq), err_half(dt, g[1].dk, dk64, p->nk),
                          err_half(dt, g[1].dv, dv64, p->nv)};
    for (int t = 0; t < 3; t++)
        CHECK(e2[t] <= 5.0 * eb[t] + ed[t] + 1e-5, "%s (out, lse recomputed): %s error %.3g > 5 x %.3g + %.3g", what,
              nm[t], e2[t], eb[t], ed[t]);
    for (int t = 0; t < 3; t++) g_free(&g[t]);
    g_free(&direct);
    free(o); free(l); free(dq64); free(dk64); free(dv64); free(dqb); free(dkb); free(dvb);
}

enum { M_NONE, M_CAUSAL, M_WINDOW, M_CWINDOW, M_LENGTHS, M_PACKED, M_COUNT };
static const char *mask_name[M_COUNT] = {"none", "causal", "window", "causal-window", "key-lengths", "packed"};

/* shape variant: 0 n_q = n_k, H = H_kv = 2; 1 GQA 4:2 with n_k = n_q + 3;
 * 2 GQA 3:1 with n_q = n_k + 4 (causal: the first rows see no key). */
static int setup(prob *p, int64_t n, int64_t D, int mask, int variant) {
    memset(p, 0, sizeof *p);
    qkv_attn_desc_init(&p->d);
    p->d.batch = 2;
    p->d.n_q = p->d.n_k = n;
    p->d.heads = 2;
    p->d.dim = D;
    if (variant == 1) {
        p->d.heads = 4; p->d.heads_kv = 2;
        p->d.n_k = n + 3;
    } else if (variant == 2) {
        p->d.heads = 3; p->d.heads_kv = 1;
        p->d.n_q = n + 4;
    }
    switch (mask) {
    case M_CAUSAL: p->d.mask = QKV_MASK_CAUSAL; break;
    case M_WINDOW: p->d.mask = QKV_MASK_WINDOW; p->d.window_left = 3; p->d.window_right = 2; break;
    case M_CWINDOW: p->d.mask = QKV_MASK_CAUSAL_WINDOW; p->d.window_left = 5; break;
    case M_LENGTHS:
        p->kl[0] = p->d.n_k;
        p->kl[1] = p->d.n_k / 2; /* n_k = 1: a batch with no key at all */
        p->d.key_lengths = p->kl;
        break;
    case M_PACKED:
        p->d.batch = 1;
        p->d.n_k = p->d.n_q;
        p->d.num_seqs = 2;
        p->off[0] = 0; p->off[1] = p->d.n_q / 2; p->off[2] = p->d.n_q;
        p->d.seq_offsets_q = p->off;
        p->d.mask = QKV_MASK_CAUSAL;
        break;
    default: break;
    }
    return 1;
}

static void test_sweep(qkv_dtype dt) {
    static const int64_t ns[] = {1, 2, 7, 63, 65, 129}, Ds[] = {1, 8, 31, 64, 80};
    const int fast = dt == QKV_BF16 && qkv_half_fast_available();
    int count = 0;
    for (size_t in = 0; in < 6; in++)
        for (size_t iD = 0; iD < 5; iD++)
            for (int m = 0; m < M_COUNT; m++)
                for (int var = 0; var < 3; var++) {
                    /* fp16 (the portable path, tested at length in
                     * test_half.c): one variant per shape and mask */
                    if (dt == QKV_F16 && var != (int)((in + iD + (size_t)m) % 3)) continue;
                    prob p;
                    setup(&p, ns[in], Ds[iD], m, var);
                    if (!make(&p, dt, 1000 + 97 * in + 13 * iD + 3 * (size_t)m + (size_t)var, 1.5)) {
                        CHECK(0, "invalid problem n %lld D %lld mask %d", (long long)ns[in], (long long)Ds[iD], m);
                        continue;
                    }
                    char what[160];
                    snprintf(what, sizeof what, "%s n %lld D %lld mask %s variant %d (n_q %lld n_k %lld H %lld:%lld)",
                             dt == QKV_BF16 ? "bf16" : "fp16", (long long)ns[in], (long long)Ds[iD], mask_name[m], var,
                             (long long)p.d.n_q, (long long)p.d.n_k, (long long)p.d.heads,
                             (long long)(p.d.heads_kv ? p.d.heads_kv : p.d.heads));
                    check(&p, what, fast);
                    unmake(&p);
                    count++;
                }
    printf("%s: %d problems swept\n", dt == QKV_BF16 ? "bf16" : "fp16", count);
}

/* Several key blocks (128 keys), chunks (4) and query blocks (64), D_v != D,
 * odd windows, a batch with few keys. */
static void test_large(void) {
    typedef struct big {
        int64_t B, nq, nk, H, Hkv, D, Dv;
        qkv_mask mask;
        int64_t wl, wr;
        int lengths;
    } big;
    static const big bigs[] = {
        {1, 700, 700, 2, 1, 64, 0, QKV_MASK_CAUSAL, 0, 0, 0},
        {2, 300, 650, 2, 2, 80, 48, QKV_MASK_WINDOW, 100, 20, 1},
        {1, 530, 530, 1, 0, 128, 0, QKV_MASK_NONE, 0, 0, 0},
        {1, 257, 1100, 4, 2, 64, 0, QKV_MASK_CAUSAL_WINDOW, 300, 0, 0},
        {2, 200, 140, 2, 1, 31, 33, QKV_MASK_CAUSAL, 0, 0, 1},
    };
    const int fast = qkv_half_fast_available();
    for (size_t c = 0; c < sizeof bigs / sizeof bigs[0]; c++) {
        const big *f = &bigs[c];
        prob p;
        memset(&p, 0, sizeof p);
        qkv_attn_desc_init(&p.d);
        p.d.batch = f->B; p.d.n_q = f->nq; p.d.n_k = f->nk; p.d.heads = f->H; p.d.heads_kv = f->Hkv;
        p.d.dim = f->D; p.d.dim_v = f->Dv; p.d.mask = f->mask; p.d.window_left = f->wl; p.d.window_right = f->wr;
        if (f->lengths) {
            p.kl[0] = f->nk - 5;
            p.kl[1] = f->nk / 3;
            p.d.key_lengths = p.kl;
        }
        if (!make(&p, QKV_BF16, 500 + c, 2.0)) {
            CHECK(0, "invalid large problem %zu", c);
            continue;
        }
        char what[64];
        snprintf(what, sizeof what, "bf16 large %zu", c);
        check(&p, what, fast);
        unmake(&p);
    }
}

/* Where the fast path must not run: other kernel tables forced (QKV_ARCH),
 * the path turned off, fp16, scores and options it lacks, NaN or inf in the
 * inputs (even in masked keys): the portable path gives the result, within
 * the same rule. */
static void test_routes(void) {
    prob p;
    setup(&p, 65, 31, M_LENGTHS, 1);
    if (!make(&p, QKV_BF16, 77, 1.5)) return;
    for (int arch = 0; arch < QKV_ARCH_COUNT; arch++) {
        if (!qkv_cpu_force_arch(arch)) continue;
        char what[64];
        snprintf(what, sizeof what, "bf16 arch %s", qkv_arch_name(arch));
        check(&p, what, arch == QKV_ARCH_AVX512 && qkv_half_fast_available());
    }
    qkv_cpu_force_arch(-1);
    qkv_half_force_portable(1);
    check(&p, "bf16 portable forced", 0);
    qkv_half_force_portable(0);
    /* NaN in a key and a value past batch 1's length (masked everywhere) */
    const int64_t j = p.d.n_k - 1, Hk = 2;
    p.k[at4(1, j, 1, p.d.n_k, Hk, p.d.dim) + 3] = 0x7fc0;
    p.v[at4(1, j, 0, p.d.n_k, Hk, p.d.dim) + 0] = 0x7f80; /* +inf */
    check(&p, "bf16 NaN/inf in a masked key", 0);
    unmake(&p);
    /* options the fast backward lacks: the portable path */
    setup(&p, 63, 8, M_CAUSAL, 0);
    p.d.softcap = 5.0;
    if (make(&p, QKV_BF16, 78, 1.5)) {
        grads16 g;
        g_alloc(&g, &p);
        qkv_plan pl;
        CHECK_STATUS(qkv_plan_make(&p.d, &pl), QKV_OK);
        CHECK_STATUS(qkv_half_fast_backward(&pl, p.q, p.k, p.v, NULL, NULL, p.dout, g.dq, g.dk, g.dv),
                     QKV_ERR_UNSUPPORTED);
        CHECK_STATUS(g_run(&p, &g, NULL, NULL, 2), QKV_OK);
        g_free(&g);
        unmake(&p);
    }
}

int main(void) {
    printf("bf16 fast backward (AVX512-BF16) %s\n", qkv_half_fast_available() ? "available" : "not available here");
    test_sweep(QKV_BF16);
    test_sweep(QKV_F16);
    test_large();
    test_routes();
    if (g_fast_expected) printf("fast backward applied in %d of %d checks\n", g_fast_calls, g_fast_expected);
    printf("checks that needed the D term beside 5 x plain half: %d of %d\n", g_dterm_needed, g_rule_checks);
    const char *path[3] = {"bf16 fast", "bf16 portable", "fp16 portable"};
    for (int i = 0; i < 3; i++)
        printf("%s: worst error / (plain half error + 1e-5) = %.2f (rule: 5); against the stricter "
               "float-intermediate baseline %.2f (not asserted)\n",
               path[i], g_worst[i], g_worst_strict[i]);
    return tu_finish();
}
