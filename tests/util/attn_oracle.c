/* The tests' own dense attention oracle: see attn_oracle.h. Written from the
 * header's formulas only; every index is spelled out, nothing is clever. */
#include "attn_oracle.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int64_t heads_kv_of(const qkv_attn_desc *d) { return d->heads_kv ? d->heads_kv : d->heads; }
static int64_t dim_v_of(const qkv_attn_desc *d) { return d->dim_v ? d->dim_v : d->dim; }

void ao_counts(const qkv_attn_desc *d, size_t n[AO_NT]) {
    size_t B = (size_t)d->batch, nq = (size_t)d->n_q, nk = (size_t)d->n_k, H = (size_t)d->heads;
    size_t Hkv = (size_t)heads_kv_of(d), D = (size_t)d->dim, Dv = (size_t)dim_v_of(d);
    size_t A = d->score == QKV_SCORE_ADDITIVE ? (size_t)d->additive_dim : 0;
    n[AO_Q] = B * nq * H * D;
    n[AO_K] = B * nk * Hkv * D;
    n[AO_V] = B * nk * Hkv * Dv;
    n[AO_BIAS] = d->bias_kind == QKV_BIAS_SHARED ? nq * nk
                 : d->bias_kind == QKV_BIAS_PER_HEAD ? H * nq * nk : 0;
    n[AO_W1] = H * A * D;
    n[AO_W2] = H * A * D;
    n[AO_W] = H * A;
    n[AO_O] = B * nq * H * Dv;
    n[AO_ATTN] = B * H * nq * nk;
    n[AO_LSE] = B * H * nq;
}

static double bias_at(const qkv_attn_desc *d, const double *bias, int64_t h, int64_t i, int64_t j) {
    if (d->bias_kind == QKV_BIAS_SHARED) return bias[i * d->n_k + j];
    if (d->bias_kind == QKV_BIAS_PER_HEAD) return bias[(h * d->n_q + i) * d->n_k + j];
    return 0.0;
}

int ao_visible(const qkv_attn_desc *d, const double *bias, int64_t b, int64_t h, int64_t i,
               int64_t j) {
    int64_t il = i, jl = j, nq = d->n_q, nk = d->n_k;
    if (d->seq_offsets_q) {
        const int64_t *oq = d->seq_offsets_q;
        const int64_t *ok = d->seq_offsets_k ? d->seq_offsets_k : oq;
        int64_t s;
        for (s = 0; s < d->num_seqs; s++)
            if (oq[s] <= i && i < oq[s + 1]) break;
        if (s == d->num_seqs) return 0;
        if (j < ok[s] || j >= ok[s + 1]) return 0;
        il = i - oq[s];
        jl = j - ok[s];
        nq = oq[s + 1] - oq[s];
        nk = ok[s + 1] - ok[s];
    }
    if (d->key_lengths && jl >= d->key_lengths[b]) return 0;
    int64_t pos = il + nk - nq; /* bottom-right alignment */
    switch (d->mask) {
    case QKV_MASK_NONE: break;
    case QKV_MASK_CAUSAL:
        if (jl > pos) return 0;
        break;
    case QKV_MASK_WINDOW:
        if (jl < pos - d->window_left || jl > pos + d->window_right) return 0;
        break;
    case QKV_MASK_CAUSAL_WINDOW:
        if (jl < pos - d->window_left || jl > pos) return 0;
        break;
    }
    if (d->bias_kind != QKV_BIAS_NONE && bias && bias_at(d, bias, h, i, j) == -INFINITY) return 0;
    return 1;
}

void ao_logits(const qkv_attn_desc *d, double *const x[AO_NT], int64_t b, int64_t h, double *S,
               unsigned char *vis) {
    int64_t nq = d->n_q, nk = d->n_k, H = d->heads, Hkv = heads_kv_of(d), D = d->dim;
    int64_t hk = h / (H / Hkv), A = d->additive_dim;
    for (int64_t i = 0; i < nq; i++) {
        const double *q = x[AO_Q] + ((b * nq + i) * H + h) * D;
        for (int64_t j = 0; j < nk; j++) {
            S[i * nk + j] = 0.0;
            vis[i * nk + j] = (unsigned char)ao_visible(d, x[AO_BIAS], b, h, i, j);
            if (!vis[i * nk + j]) continue;
            const double *k = x[AO_K] + ((b * nk + j) * Hkv + hk) * D;
            double s = 0.0;
            if (d->score == QKV_SCORE_SCALED_DOT || d->score == QKV_SCORE_DOT) {
                for (int64_t t = 0; t < D; t++) s += q[t] * k[t];
                if (d->score == QKV_SCORE_SCALED_DOT)
                    s *= d->scale != 0.0 ? d->scale : 1.0 / sqrt((double)D);
            } else if (d->score == QKV_SCORE_COSINE) {
                double qq = 0.0, kk = 0.0;
                for (int64_t t = 0; t < D; t++) {
                    qq += q[t] * q[t];
                    kk += k[t] * k[t];
                }
                double nqn = fmax(sqrt(qq), 1e-12), nkn = fmax(sqrt(kk), 1e-12);
                for (int64_t t = 0; t < D; t++) s += (q[t] / nqn) * (k[t] / nkn);
                s /= d->temperature;
            } else { /* additive: w_h . tanh(W1_h q + W2_h k) */
                for (int64_t a = 0; a < A; a++) {
                    const double *w1 = x[AO_W1] + (h * A + a) * D, *w2 = x[AO_W2] + (h * A + a) * D;
                    double u = 0.0;
                    for (int64_t t = 0; t < D; t++) u += w1[t] * q[t] + w2[t] * k[t];
                    s += x[AO_W][h * A + a] * tanh(u);
                }
            }
            if (d->softcap > 0.0) s = d->softcap * tanh(s / d->softcap);
            s += bias_at(d, x[AO_BIAS], h, i, j);
            S[i * nk + j] = s;
        }
    }
}

void ao_forward(const qkv_attn_desc *d, double *const x[AO_NT]) {
    int64_t B = d->batch, nq = d->n_q, nk = d->n_k, H = d->heads, Hkv = heads_kv_of(d);
    int64_t Dv = dim_v_of(d), hk_group = H / Hkv;
    double *S = malloc((size_t)(nq * nk) * sizeof *S);
    unsigned char *vis = malloc((size_t)(nq * nk));
    double *w = malloc((size_t)nk * sizeof *w);
    if (!S || !vis || !w) abort();
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            ao_logits(d, x, b, h, S, vis);
            for (int64_t i = 0; i < nq; i++) {
                double *o = x[AO_O] + ((b * nq + i) * H + h) * Dv;
                int64_t count = 0;
                double m = -INFINITY;
                for (int64_t j = 0; j < nk; j++)
                    if (vis[i * nk + j]) {
                        count++;
                        if (S[i * nk + j] > m) m = S[i * nk + j];
                    }
                double sum = 0.0;
                for (int64_t j = 0; j < nk; j++)
                    if (vis[i * nk + j]) sum += exp(S[i * nk + j] - m);
                for (int64_t j = 0; j < nk; j++) {
                    double s = S[i * nk + j], a = 0.0;
                    if (vis[i * nk + j]) {
                        if (d->norm == QKV_NORM_SOFTMAX) {
                            a = exp(s - m) / sum;
                        } else if (d->norm == QKV_NORM_RELU) {
                            a = isnan(s) ? s : (s > 0.0 ? s : 0.0);
                            if (d->relu_divide_by_count) a /= (double)count;
                        } else {
                            a = 1.0 / (1.0 + exp(-s));
                        }
                    }
                    w[j] = a;
                    if (x[AO_ATTN]) x[AO_ATTN][((b * H + h) * nq + i) * nk + j] = a;
                }
                if (x[AO_LSE]) x[AO_LSE][(b * H + h) * nq + i] = count ? m + log(sum) : -INFINITY;
                for (int64_t e = 0; e < Dv; e++) {
                    double acc = 0.0;
                    for (int64_t j = 0; j < nk; j++)
                        if (vis[i * nk + j])
                            acc += w[j] * x[AO_V][((b * nk + j) * Hkv + h / hk_group) * Dv + e];
                    o[e] = acc;
                }
            }
        }
    free(S);
    free(vis);
    free(w);
}

void ao_forward_naive32(const qkv_attn_desc *d, double *const x[AO_NT]) {
    int64_t B = d->batch, nq = d->n_q, nk = d->n_k, H = d->heads, Hkv = heads_kv_of(d);
    int64_t D = d->dim, Dv = dim_v_of(d), group = H / Hkv, A = d->additive_dim;
    float *S = malloc((size_t)nk * sizeof *S), *w = malloc((size_t)nk * sizeof *w);
    if (!S || !w) abort();
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < nq; i++) {
                const double *q = x[AO_Q] + ((b * nq + i) * H + h) * D;
                int64_t count = 0;
                float m = -INFINITY;
                for (int64_t j = 0; j < nk; j++) {
                    S[j] = -INFINITY;
                    if (!ao_visible(d, x[AO_BIAS], b, h, i, j)) continue;
                    count++;
                    const double *k = x[AO_K] + ((b * nk + j) * Hkv + h / group) * D;
                    float s = 0.0f;
                    if (d->score == QKV_SCORE_SCALED_DOT || d->score == QKV_SCORE_DOT) {
                        for (int64_t t = 0; t < D; t++) s += (float)q[t] * (float)k[t];
                        if (d->score == QKV_SCORE_SCALED_DOT)
                            s *= (float)(d->scale != 0.0 ? d->scale : 1.0 / sqrt((double)D));
                    } else if (d->score == QKV_SCORE_COSINE) {
                        float qq = 0.0f, kk = 0.0f;
                        for (int64_t t = 0; t < D; t++) {
                            qq += (float)q[t] * (float)q[t];
                            kk += (float)k[t] * (float)k[t];
                            s += (float)q[t] * (float)k[t];
                        }
                        s = s / (fmaxf(sqrtf(qq), 1e-12f) * fmaxf(sqrtf(kk), 1e-12f)) / (float)d->temperature;
                    } else {
                        for (int64_t a = 0; a < A; a++) {
                            float u = 0.0f;
                            for (int64_t t = 0; t < D; t++)
                                u += (float)x[AO_W1][(h * A + a) * D + t] * (float)q[t] +
                                     (float)x[AO_W2][(h * A + a) * D + t] * (float)k[t];
                            s += (float)x[AO_W][h * A + a] * tanhf(u);
                        }
                    }
                    if (d->softcap > 0.0) s = (float)d->softcap * tanhf(s / (float)d->softcap);
                    if (d->bias_kind != QKV_BIAS_NONE) s += (float)bias_at(d, x[AO_BIAS], h, i, j);
                    S[j] = s;
                    if (s > m) m = s;
                }
                float sum = 0.0f;
                for (int64_t j = 0; j < nk; j++)
                    if (S[j] != -INFINITY) sum += expf(S[j] - m);
                for (int64_t j = 0; j < nk; j++) {
                    float a = 0.0f, s = S[j];
                    if (s != -INFINITY) {
                        if (d->norm == QKV_NORM_SOFTMAX) a = expf(s - m) / sum;
                        else if (d->norm == QKV_NORM_RELU)
                            a = (isnan(s) ? s : (s > 0.0f ? s : 0.0f)) /
                                (d->relu_divide_by_count ? (float)count : 1.0f);
                        else a = 1.0f / (1.0f + expf(-s));
                    }
                    w[j] = a;
                    if (x[AO_ATTN]) x[AO_ATTN][((b * H + h) * nq + i) * nk + j] = a;
                }
                if (x[AO_LSE]) x[AO_LSE][(b * H + h) * nq + i] = count ? (double)(m + logf(sum)) : -INFINITY;
                for (int64_t e = 0; e < Dv; e++) {
                    float acc = 0.0f;
                    for (int64_t j = 0; j < nk; j++)
                        if (S[j] != -INFINITY) acc += w[j] * (float)x[AO_V][((b * nk + j) * Hkv + h / group) * Dv + e];
                    x[AO_O][((b * nq + i) * H + h) * Dv + e] = acc;
                }
            }
    free(S);
    free(w);
}

static double *alloc_d(size_t n) {
    double *p = calloc(n ? n : 1, sizeof *p);
    if (!p) abort();
    return p;
}

void ao_prob_init(ao_prob *p, const qkv_attn_desc *d, tu_rng *r, double sd) {
    memset(p, 0, sizeof *p);
    p->d = *d;
    ao_counts(d, p->n);
    for (int t = 0; t < AO_NT; t++) p->x[t] = alloc_d(p->n[t]);
    tu_fill_normal_f64(r, p->x[AO_Q], p->n[AO_Q], sd);
    tu_fill_normal_f64(r, p->x[AO_K], p->n[AO_K], sd);
    tu_fill_normal_f64(r, p->x[AO_V], p->n[AO_V], 1.0);
    tu_fill_normal_f64(r, p->x[AO_BIAS], p->n[AO_BIAS], 1.0);
    double ws = 1.0 / sqrt((double)d->dim);
    tu_fill_normal_f64(r, p->x[AO_W1], p->n[AO_W1], ws);
    tu_fill_normal_f64(r, p->x[AO_W2], p->n[AO_W2], ws);
    tu_fill_normal_f64(r, p->x[AO_W], p->n[AO_W], 1.0);
}

void ao_prob_free(ao_prob *p) {
    for (int t = 0; t < AO_NT; t++) free(p->x[t]);
    memset(p, 0, sizeof *p);
}

void ao_prob_round_f32(ao_prob *p) {
    for (int t = AO_Q; t <= AO_W; t++)
        for (size_t i = 0; i < p->n[t]; i++) p->x[t][i] = (double)(float)p->x[t][i];
}

double ao_min_abs_logit(const ao_prob *p) {
    const qkv_attn_desc *d = &p->d;
    size_t nn = (size_t)(d->n_q * d->n_k);
    double *S = alloc_d(nn), m = INFINITY;
    unsigned char *vis = malloc(nn ? nn : 1);
    if (!vis) abort();
    for (int64_t b = 0; b < d->batch; b++)
        for (int64_t h = 0; h < d->heads; h++) {
            ao_logits(d, p->x, b, h, S, vis);
            for (size_t i = 0; i < nn; i++)
                if (vis[i] && fabs(S[i]) < m) m = fabs(S[i]);
        }
    free(S);
    free(vis);
    return m;
}

/* A library-typed copy of a double tensor (NULL when n == 0). */
static void *to_lib(const double *x, size_t n, qkv_dtype dt) {
    if (n == 0) return NULL;
    if (dt == QKV_F64) {
        double *c = malloc(n * sizeof *c);
        if (!c) abort();
        memcpy(c, x, n * sizeof *c);
        return c;
    }
    float *c = malloc(n * sizeof *c);
    if (!c) abort();
    for (size_t i = 0; i < n; i++) c[i] = (float)x[i];
    return c;
}

static void from_lib(double *dst, const void *src, size_t n, qkv_dtype dt) {
    if (dt == QKV_F64) {
        memcpy(dst, src, n * sizeof(double));
    } else {
        const float *f = src;
        for (size_t i = 0; i < n; i++) dst[i] = (double)f[i];
    }
}

static size_t esize(qkv_dtype dt) { return dt == QKV_F64 ? sizeof(double) : sizeof(float); }

/* Guarded output buffer of n elements, pre-filled with a NaN pattern (so a
 * forgotten write shows) unless n == 0. */
static void *out_buf(size_t n, qkv_dtype dt) {
    void *p = tu_guarded_alloc(n * esize(dt));
    if (!p) abort();
    if (dt == QKV_F64)
        for (size_t i = 0; i < n; i++) ((double *)p)[i] = NAN;
    else
        for (size_t i = 0; i < n; i++) ((float *)p)[i] = NAN;
    return p;
}

typedef struct lib_inputs {
    qkv_attn_desc d;
    void *t[AO_W + 1];
} lib_inputs;

static void lib_inputs_make(lib_inputs *li, const ao_prob *p, qkv_dtype dt, qkv_impl impl,
                            int threads) {
    li->d = p->d;
    li->d.dtype = dt;
    li->d.impl = impl;
    li->d.threads = threads;
    for (int t = AO_Q; t <= AO_W; t++) li->t[t] = to_lib(p->x[t], p->n[t], dt);
    li->d.bias = p->d.bias_kind != QKV_BIAS_NONE ? li->t[AO_BIAS] : NULL;
    if (p->d.score == QKV_SCORE_ADDITIVE) {
        li->d.additive_w1 = li->t[AO_W1];
        li->d.additive_w2 = li->t[AO_W2];
        li->d.additive_w = li->t[AO_W];
    }
}

/* The library must not write into its inputs. */
static int lib_inputs_intact(const lib_inputs *li, const ao_prob *p, qkv_dtype dt) {
    for (int t = AO_Q; t <= AO_W; t++) {
        if (!p->n[t]) continue;
        void *fresh = to_lib(p->x[t], p->n[t], dt);
        int same = memcmp(fresh, li->t[t], p->n[t] * esize(dt)) == 0;
        free(fresh);
        if (!same) return 0;
    }
    return 1;
}

static void lib_inputs_free(lib_inputs *li) {
    for (int t = AO_Q; t <= AO_W; t++) free(li->t[t]);
}

qkv_status ao_lib_forward(const ao_prob *p, qkv_dtype dt, qkv_impl impl, int threads,
                          double *out, double *attn, double *lse, int *guards_ok) {
    lib_inputs li;
    lib_inputs_make(&li, p, dt, impl, threads);
    void *o = out_buf(p->n[AO_O], dt);
    void *a = attn ? out_buf(p->n[AO_ATTN], dt) : NULL;
    void *l = lse ? out_buf(p->n[AO_LSE], dt) : NULL;
    qkv_status s = qkv_attention_forward(&li.d, li.t[AO_Q], li.t[AO_K], li.t[AO_V], o, a, l);
    int ok = tu_guarded_ok(o) && (!a || tu_guarded_ok(a)) && (!l || tu_guarded_ok(l)) &&
             lib_inputs_intact(&li, p, dt);
    if (guards_ok) *guards_ok = ok;
    if (s == QKV_OK) {
        from_lib(out, o, p->n[AO_O], dt);
        if (attn) from_lib(attn, a, p->n[AO_ATTN], dt);
        if (lse) from_lib(lse, l, p->n[AO_LSE], dt);
    }
    tu_guarded_free(o);
    tu_guarded_free(a);
    tu_guarded_free(l);
    lib_inputs_free(&li);
    return s;
}

qkv_status ao_lib_backward(const ao_prob *p, qkv_dtype dt, qkv_impl impl, int threads,
                           const double *dout, int pass_fwd, const ao_grads *g, int *guards_ok) {
    lib_inputs li;
    lib_inputs_make(&li, p, dt, impl, threads);
    void *o = NULL, *l = NULL;
    qkv_status s = QKV_OK;
    int ok = 1;
    if (pass_fwd) {
        o = out_buf(p->n[AO_O], dt);
        l = out_buf(p->n[AO_LSE], dt);
        s = qkv_attention_forward(&li.d, li.t[AO_Q], li.t[AO_K], li.t[AO_V], o, NULL, l);
        ok = tu_guarded_ok(o) && tu_guarded_ok(l);
    }
    void *dout_l = to_lib(dout, p->n[AO_O], dt);
    qkv_attn_grads lg;
    memset(&lg, 0, sizeof lg);
    lg.dq = out_buf(p->n[AO_Q], dt);
    lg.dk = out_buf(p->n[AO_K], dt);
    lg.dv = out_buf(p->n[AO_V], dt);
    if (g->dbias && p->n[AO_BIAS]) lg.dbias = out_buf(p->n[AO_BIAS], dt);
    if (g->dw1 && p->n[AO_W1]) lg.d_additive_w1 = out_buf(p->n[AO_W1], dt);
    if (g->dw2 && p->n[AO_W2]) lg.d_additive_w2 = out_buf(p->n[AO_W2], dt);
    if (g->dw && p->n[AO_W]) lg.d_additive_w = out_buf(p->n[AO_W], dt);
    if (s == QKV_OK)
        s = qkv_attention_backward(&li.d, li.t[AO_Q], li.t[AO_K], li.t[AO_V], o, l, dout_l, &lg);
    if (!lib_inputs_intact(&li, p, dt)) ok = 0;
    {
        void *fresh = to_lib(dout, p->n[AO_O], dt);
        if (memcmp(fresh, dout_l, p->n[AO_O] * esize(dt)) != 0) ok = 0;
        free(fresh);
    }
    if (pass_fwd && !(tu_guarded_ok(o) && tu_guarded_ok(l))) ok = 0;
    void *bufs[7] = {lg.dq, lg.dk, lg.dv, lg.dbias, lg.d_additive_w1, lg.d_additive_w2,
                     lg.d_additive_w};
    double *dst[7] = {g->dq, g->dk, g->dv, g->dbias, g->dw1, g->dw2, g->dw};
    size_t cnt[7] = {p->n[AO_Q], p->n[AO_K], p->n[AO_V], p->n[AO_BIAS],
                     p->n[AO_W1], p->n[AO_W2], p->n[AO_W]};
    for (int t = 0; t < 7; t++) {
        if (!bufs[t]) continue;
        if (!tu_guarded_ok(bufs[t])) ok = 0;
        if (s == QKV_OK && dst[t]) from_lib(dst[t], bufs[t], cnt[t], dt);
        tu_guarded_free(bufs[t]);
    }
    if (guards_ok) *guards_ok = ok;
    tu_guarded_free(o);
    tu_guarded_free(l);
    free(dout_l);
    lib_inputs_free(&li);
    return s;
}

double ao_cmp(const double *a, const double *b, size_t n, double atol, double rtol,
              size_t *worst) {
    double m = 0.0;
    size_t wi = 0;
    for (size_t i = 0; i < n; i++) {
        double e;
        if (isnan(a[i]) && isnan(b[i])) e = 0.0;
        else if (isnan(a[i]) || isnan(b[i])) e = INFINITY;
        else if (a[i] == b[i]) e = 0.0; /* equal infinities too */
        else e = fabs(a[i] - b[i]) / (atol + rtol * fabs(b[i]));
        if (e > m) {
            m = e;
            wi = i;
        }
    }
    if (worst) *worst = wi;
    return m;
}

const char *ao_mask_config(qkv_attn_desc *d, int m, ao_mask_store *st) {
    memset(st, 0, sizeof *st);
    d->mask = QKV_MASK_NONE;
    d->window_left = d->window_right = 0;
    d->key_lengths = NULL;
    d->num_seqs = 0;
    d->seq_offsets_q = d->seq_offsets_k = NULL;
    d->bias_kind = QKV_BIAS_NONE;
    const int64_t nk = d->n_k;
    switch (m) {
    case 0: return "none";
    case 1: d->mask = QKV_MASK_CAUSAL; return "causal";
    case 2:
        d->mask = QKV_MASK_WINDOW;
        d->window_left = 1;
        d->window_right = 2;
        return "window(1,2)";
    case 3:
        d->mask = QKV_MASK_CAUSAL_WINDOW;
        d->window_left = 2;
        return "causal-window(2)";
    case 4:
    case 5:
        for (int64_t b = 0; b < d->batch && b < 16; b++) {
            static const int pattern[4] = {0, 1, 2, 3};
            int64_t v = pattern[b % 4] == 0 ? nk : pattern[b % 4] == 1 ? (nk + 1) / 2
                        : pattern[b % 4] == 2 ? 0 : 1;
            st->key_lengths[b] = v;
        }
        d->key_lengths = st->key_lengths;
        if (m == 5) {
            d->mask = QKV_MASK_CAUSAL;
            return "key-lengths+causal";
        }
        return "key-lengths";
    case 6:
    case 7:
    case 8:
    case 12:
        d->batch = 1;
        if (m == 7 || m == 8) d->n_k = d->n_q;
        /* Three sequences (some empty) where n >= 2; two where n = 1 (the
         * library rejects num_seqs > n + 1; test_attn_errors checks that
         * separately against the header, which allows it). */
        d->num_seqs = (d->n_q >= 2 && d->n_k >= 2) ? 3 : 2;
        for (int64_t s = 0; s <= d->num_seqs; s++) {
            st->off_q[s] = (s * d->n_q + 1) / d->num_seqs;
            st->off_k[s] = (s * d->n_k) / d->num_seqs;
        }
        st->off_q[d->num_seqs] = d->n_q;
        st->off_k[d->num_seqs] = d->n_k;
        d->seq_offsets_q = st->off_q;
        if (m == 6 || m == 12) {
            d->seq_offsets_k = st->off_k;
            if (m == 12) {
                d->bias_kind = QKV_BIAS_SHARED;
                return "packed(q!=k)+bias-shared";
            }
            d->mask = QKV_MASK_CAUSAL;
            return "packed(q!=k)+causal";
        }
        if (m == 8) {
            d->mask = QKV_MASK_WINDOW;
            d->window_left = 1;
            d->window_right = 1;
            return "packed+window(1,1)";
        }
        return "packed";
    case 9: d->bias_kind = QKV_BIAS_SHARED; return "bias-shared";
    case 13:
        for (int64_t b = 0; b < d->batch && b < 16; b++) st->key_lengths[b] = (b % 2) ? nk - 1 : nk;
        d->key_lengths = st->key_lengths;
        d->bias_kind = QKV_BIAS_PER_HEAD;
        d->mask = QKV_MASK_WINDOW;
        d->window_left = 2;
        d->window_right = 1;
        return "key-lengths+bias-per-head+window(2,1)";
    case 10:
        d->bias_kind = QKV_BIAS_PER_HEAD;
        d->mask = QKV_MASK_CAUSAL;
        return "bias-per-head+causal";
    case 11:
        d->mask = QKV_MASK_WINDOW;
        return "window(0,0)";
    default: return "none";
    }
}

void ao_bias_plant_inf(ao_prob *p, tu_rng *r) {
    if (p->n[AO_BIAS] == 0) return;
    for (size_t i = 0; i < p->n[AO_BIAS]; i++)
        if (tu_rng_uniform(r) < 0.15) p->x[AO_BIAS][i] = -INFINITY;
    /* One whole row -inf (the last query row of the first bias matrix), when
     * there is more than one row so the rest stays interesting. */
    if (p->d.n_q > 1)
        for (int64_t j = 0; j < p->d.n_k; j++)
            p->x[AO_BIAS][(p->d.n_q - 1) * p->d.n_k + j] = -INFINITY;
}

const char *ao_describe(const qkv_attn_desc *d, char *buf, size_t len) {
    static const char *sc[] = {"scaled", "dot", "cosine", "additive"};
    static const char *nm[] = {"softmax", "relu", "sigmoid"};
    static const char *mk[] = {"none", "causal", "window", "causal-window"};
    snprintf(buf, len,
             "%s B=%lld nq=%lld nk=%lld H=%lld Hkv=%lld D=%lld Dv=%lld score=%s norm=%s%s "
             "mask=%s(L=%lld,R=%lld)%s%s bias=%d softcap=%g scale=%g temp=%g",
             d->dtype == QKV_F64 ? "f64" : "f32", (long long)d->batch, (long long)d->n_q,
             (long long)d->n_k, (long long)d->heads, (long long)heads_kv_of(d), (long long)d->dim,
             (long long)dim_v_of(d), sc[(unsigned)d->score & 3u],
             nm[(unsigned)d->norm % 3u], d->relu_divide_by_count ? "/count" : "",
             mk[(unsigned)d->mask & 3u], (long long)d->window_left, (long long)d->window_right,
             d->key_lengths ? " key_lengths" : "", d->seq_offsets_q ? " packed" : "",
             (int)d->bias_kind, d->softcap, d->scale, d->temperature);
    return buf;
}
