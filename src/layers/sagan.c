/* The self-attention block of SAGAN (Zhang, Goodfellow, Metaxas & Odena,
 * "Self-Attention Generative Adversarial Networks", ICML 2019), forward and
 * backward, over a feature map stored pixel-major [H*W, C]:
 *
 *   f = x W_fᵀ + b_f,  g = x W_gᵀ + b_g  [N, C_k]     1x1 convolutions
 *   h = x W_hᵀ + b_h                     [N, C]
 *   beta[j, i] = softmax_i(f_i . g_j)    position j attends over all i
 *   o_j = sum_i beta[j, i] h_i;   y = gamma o + x
 *
 * The 1x1 convolutions are matrix products (qkv_sgemm); the attention is the
 * core with query g, key f, value h and the plain DOT score (the paper does
 * not scale), so no N x N matrix is built unless the caller asks for beta.
 * gamma starts at 0 as in the paper: the block starts as the identity and
 * learns how much non-local evidence to mix in. */
#include <math.h>
#include <string.h>

#include "core/internal.h"
#include "core/rng.h"

struct qkv_sagan {
    int64_t C, Ck;
    int64_t n_params;
    float *params, *grads;   /* W_f, b_f, W_g, b_g, W_h, b_h, gamma */
    /* activations of the last forward */
    int64_t N, cap;
    float *f, *g, *h, *o;
    int have_forward;
};

/* Offsets of the parameter blocks. */
static float *p_wf(float *p, const qkv_sagan *s) {
    (void)s;
    return p;
}
static float *p_bf(float *p, const qkv_sagan *s) { return p + s->Ck * s->C; }
static float *p_wg(float *p, const qkv_sagan *s) { return p + s->Ck * s->C + s->Ck; }
static float *p_bg(float *p, const qkv_sagan *s) { return p + 2 * s->Ck * s->C + s->Ck; }
static float *p_wh(float *p, const qkv_sagan *s) { return p + 2 * (s->Ck * s->C + s->Ck); }
static float *p_bh(float *p, const qkv_sagan *s) { return p_wh(p, s) + s->C * s->C; }
static float *p_gamma(float *p, const qkv_sagan *s) { return p_bh(p, s) + s->C; }

static void xavier(float *w, int64_t fan_out, int64_t fan_in, uint64_t *st) {
    double a = sqrt(6.0 / (double)(fan_in + fan_out));
    for (int64_t i = 0; i < fan_out * fan_in; i++)
        w[i] = (float)(a * (2.0 * splitmix64_unit(st) - 1.0));
}

qkv_status qkv_sagan_create(int64_t channels, int64_t key_channels, uint64_t seed, qkv_sagan **out) {
    if (!out) return QKV_ERR_NULL_POINTER;
    *out = NULL;
    if (channels <= 0 || key_channels <= 0) return QKV_ERR_BAD_SIZE;
    int64_t a, b;
    if (!qkv_mul_ok(channels, key_channels, &a) || !qkv_mul_ok(channels, channels, &b) || a > INT64_MAX / 4 ||
        b > INT64_MAX / 4)
        return QKV_ERR_SIZE_OVERFLOW;
    int64_t n = 2 * (a + key_channels) + b + channels + 1;
    if ((uint64_t)n > SIZE_MAX / sizeof(float) / 2) return QKV_ERR_SIZE_OVERFLOW;
    qkv_sagan *s = qkv_alloc_zeroed(sizeof *s);
    if (!s) return QKV_ERR_OUT_OF_MEMORY;
    s->C = channels;
    s->Ck = key_channels;
    s->n_params = n;
    s->params = qkv_alloc_zeroed((size_t)n * sizeof(float));
    s->grads = qkv_alloc_zeroed((size_t)n * sizeof(float));
    if (!s->params || !s->grads) {
        qkv_sagan_free(s);
        return QKV_ERR_OUT_OF_MEMORY;
    }
    uint64_t st = seed;
    xavier(p_wf(s->params, s), key_channels, channels, &st);
    xavier(p_wg(s->params, s), key_channels, channels, &st);
    xavier(p_wh(s->params, s), channels, channels, &st);
    *out = s;
    return QKV_OK;
}

static void free_acts(qkv_sagan *s) {
    QKV_FREE_ALL(s->f, s->g, s->h, s->o);
    s->f = s->g = s->h = s->o = NULL;
    s->cap = 0;
}

void qkv_sagan_free(qkv_sagan *s) {
    if (!s) return;
    free_acts(s);
    QKV_FREE_ALL(s->params, s->grads, s);
}

float *qkv_sagan_params(qkv_sagan *s, int64_t *count) {
    return qkv_param_view(s ? s->params : NULL, s ? s->n_params : 0, count);
}

float *qkv_sagan_grads(qkv_sagan *s, int64_t *count) {
    return qkv_param_view(s ? s->grads : NULL, s ? s->n_params : 0, count);
}

void qkv_sagan_zero_grad(qkv_sagan *s) {
    if (s) memset(s->grads, 0, (size_t)s->n_params * sizeof(float));
}

/* y[N, out] = x[N, in] Wᵀ + b */
static qkv_status proj(int64_t N, int64_t in, int64_t outd, const float *x, const float *w, const float *b,
                       float *y) {
    qkv_status st = qkv_sgemm(0, 1, N, outd, in, 1.0f, x, in, w, in, 0.0f, y, outd, 0);
    if (st != QKV_OK) return st;
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < outd; j++) y[i * outd + j] += b[j];
    return QKV_OK;
}

static void core_desc(const qkv_sagan *s, int64_t N, qkv_attn_desc *d) {
    qkv_attn_desc_init(d);
    d->dtype = QKV_F32;
    d->batch = 1;
    d->n_q = d->n_k = N;
    d->heads = 1;
    d->dim = s->Ck;
    d->dim_v = s->C;
    d->score = QKV_SCORE_DOT;
}

qkv_status qkv_sagan_forward(qkv_sagan *s, int64_t height, int64_t width, const float *x, float *y,
                             float *attn) {
    if (!s || !x || !y) return QKV_ERR_NULL_POINTER;
    if (height <= 0 || width <= 0) return QKV_ERR_BAD_SIZE;
    int64_t N, t;
    if (!qkv_mul_ok(height, width, &N) || !qkv_mul_ok(N, s->C, &t) || t > INT64_MAX / 8 ||
        (uint64_t)t > SIZE_MAX / sizeof(float))
        return QKV_ERR_SIZE_OVERFLOW;
    if (attn && (!qkv_mul_ok(N, N, &t) || (uint64_t)t > SIZE_MAX / sizeof(float))) return QKV_ERR_SIZE_OVERFLOW;
    s->have_forward = 0;
    if (N > s->cap) {
        free_acts(s);
        s->f = qkv_alloc((size_t)(N * s->Ck) * sizeof(float));
        s->g = qkv_alloc((size_t)(N * s->Ck) * sizeof(float));
        s->h = qkv_alloc((size_t)(N * s->C) * sizeof(float));
        s->o = qkv_alloc((size_t)(N * s->C) * sizeof(float));
        if (!s->f || !s->g || !s->h || !s->o) {
            free_acts(s);
            return QKV_ERR_OUT_OF_MEMORY;
        }
        s->cap = N;
    }
    const int64_t C = s->C, Ck = s->Ck;
    float *P = s->params;
    qkv_status st = proj(N, C, Ck, x, p_wf(P, s), p_bf(P, s), s->f);
    if (st == QKV_OK) st = proj(N, C, Ck, x, p_wg(P, s), p_bg(P, s), s->g);
    if (st == QKV_OK) st = proj(N, C, C, x, p_wh(P, s), p_bh(P, s), s->h);
    qkv_attn_desc d;
    core_desc(s, N, &d);
    /* Query g_j, key f_i: beta[j, i] = softmax_i(f_i . g_j). */
    if (st == QKV_OK) st = qkv_attention_forward(&d, s->g, s->f, s->h, s->o, attn, NULL);
    if (st != QKV_OK) return st;
    const float gamma = *p_gamma(P, s);
    for (int64_t i = 0; i < N * C; i++) y[i] = gamma * s->o[i] + x[i];
    s->N = N;
    s->have_forward = 1;
    return QKV_OK;
}

qkv_status qkv_sagan_backward(qkv_sagan *s, const float *x, const float *dy, float *dx) {
    if (!s || !x || !dy) return QKV_ERR_NULL_POINTER;
    if (!s->have_forward) return QKV_ERR_UNSUPPORTED;
    const int64_t N = s->N, C = s->C, Ck = s->Ck;
    float *P = s->params, *G = s->grads;
    float *dO = qkv_alloc((size_t)(N * C) * sizeof(float));
    float *df = qkv_alloc((size_t)(N * Ck) * sizeof(float));
    float *dg = qkv_alloc((size_t)(N * Ck) * sizeof(float));
    float *dh = qkv_alloc((size_t)(N * C) * sizeof(float));
    qkv_status st = QKV_OK;
    if (!dO || !df || !dg || !dh) {
        st = QKV_ERR_OUT_OF_MEMORY;
        goto done;
    }
    /* y = gamma o + x: dgamma = sum dy . o, do = gamma dy, dx = dy + ... */
    const float gamma = *p_gamma(P, s);
    double dgamma = 0.0;
    for (int64_t i = 0; i < N * C; i++) {
        dgamma += (double)dy[i] * s->o[i];
        dO[i] = gamma * dy[i];
    }
    qkv_attn_desc d;
    core_desc(s, N, &d);
    qkv_attn_grads gr;
    memset(&gr, 0, sizeof gr);
    gr.dq = dg;
    gr.dk = df;
    gr.dv = dh;
    st = qkv_attention_backward(&d, s->g, s->f, s->h, s->o, NULL, dO, &gr);
    if (st != QKV_OK) goto done;
    *p_gamma(G, s) += (float)dgamma;
    /* Each projection y = x Wᵀ + b: dW += dyᵀ x, db += column sums, dx += dy W. */
    const float *dys[3] = {df, dg, dh};
    float *ws[3] = {p_wf(P, s), p_wg(P, s), p_wh(P, s)};
    float *dws[3] = {p_wf(G, s), p_wg(G, s), p_wh(G, s)};
    float *dbs[3] = {p_bf(G, s), p_bg(G, s), p_bh(G, s)};
    const int64_t outs[3] = {Ck, Ck, C};
    if (dx) memcpy(dx, dy, (size_t)(N * C) * sizeof(float));
    for (int k = 0; k < 3 && st == QKV_OK; k++) {
        st = qkv_sgemm(1, 0, outs[k], C, N, 1.0f, dys[k], outs[k], x, C, 1.0f, dws[k], C, 0);
        if (st != QKV_OK) break;
        for (int64_t j = 0; j < outs[k]; j++) {
            double acc = 0.0;
            for (int64_t i = 0; i < N; i++) acc += dys[k][i * outs[k] + j];
            dbs[k][j] += (float)acc;
        }
        if (dx) st = qkv_sgemm(0, 0, N, C, outs[k], 1.0f, dys[k], outs[k], ws[k], C, 1.0f, dx, C, 0);
    }
done:
    qkv_free(dO);
    qkv_free(df);
    qkv_free(dg);
    qkv_free(dh);
    return st;
}
