/* 2-D neighbourhood attention (each pixel attends to the K x K window around
 * it; Ramachandran et al. 2019 "stand-alone self-attention", Hassani et al.
 * 2023 "Neighborhood Attention" with truncated borders), at cost linear in
 * the number of pixels.
 *
 * The core's masks leave one contiguous range of keys per query, which a
 * 2-D window is not (it is K row segments of the flattened image), and an
 * additive -inf bias would be an (HW) x (HW) matrix. So each pixel's window
 * is gathered into a short key sequence of its own: a block of P pixels
 * becomes a batch of P problems with n_q = 1 and n_k = (window rows) x
 * (window columns), border windows being shorter (key_lengths). The core
 * then runs its usual (fast) path on them. The backward is direct (see
 * there). Work O(HW K^2 heads (D + D_v)), memory O(P K^2 heads (D + D_v)). */
#include <math.h>
#include <string.h>

#include "core/internal.h"

#define NB_BLOCK 256 /* pixels per core call */

typedef struct nb_geom {
    int64_t H, W, heads, D, Dv, K, r, win_h, win_w, nk, hw;
    double scale;
    int threads;
} nb_geom;

static qkv_status nb_check(nb_geom *g, int64_t height, int64_t width, int64_t heads, int64_t dim,
                           int64_t dim_v, int64_t kernel, double scale, int threads) {
    if (height <= 0 || width <= 0 || heads <= 0 || dim <= 0 || dim_v <= 0 || kernel <= 0 ||
        kernel % 2 == 0 || threads < 0)
        return QKV_ERR_BAD_SIZE;
    if (scale != scale || scale - scale != 0.0) return QKV_ERR_BAD_PARAMETER;
    const int64_t win_h = kernel < height ? kernel : height, win_w = kernel < width ? kernel : width;
    *g = (nb_geom){.H = height, .W = width, .heads = heads, .D = dim, .Dv = dim_v, .K = kernel, .r = kernel / 2,
                   .win_h = win_h, .win_w = win_w, .nk = win_h * win_w, .scale = scale, .threads = threads};
    int64_t f[4] = {height, width, heads, dim > dim_v ? dim : dim_v}, n;
    if (!qkv_count_ok(&n, sizeof(float), 4, f)) return QKV_ERR_SIZE_OVERFLOW;
    int64_t f2[4] = {NB_BLOCK, g->nk, heads, dim > dim_v ? dim : dim_v};
    if (!qkv_count_ok(&n, sizeof(float), 4, f2)) return QKV_ERR_SIZE_OVERFLOW;
    g->hw = height * width;
    return QKV_OK;
}

/* The window of pixel p, clipped to the image: rows [*y0, *y1), columns [*x0, *x1). */
static void nb_window(const nb_geom *g, int64_t p, int64_t *y0, int64_t *y1, int64_t *x0, int64_t *x1) {
    int64_t y = p / g->W, x = p % g->W;
    *y0 = y - g->r < 0 ? 0 : y - g->r;
    *y1 = y + g->r + 1 > g->H ? g->H : y + g->r + 1;
    *x0 = x - g->r < 0 ? 0 : x - g->r;
    *x1 = x + g->r + 1 > g->W ? g->W : x + g->r + 1;
}

/* Gather the keys (and values) of pixels p0 .. p0+np-1 into kg [np, nk, heads, D]
 * and vg [np, nk, heads, Dv]; lens[i] = the window size of pixel p0+i. */
static void nb_gather(const nb_geom *g, int64_t p0, int64_t np, const float *k, const float *v, float *kg,
                      float *vg, int64_t *lens) {
    const size_t krow = (size_t)(g->heads * g->D), vrow = (size_t)(g->heads * g->Dv);
    for (int64_t i = 0; i < np; i++) {
        int64_t y0, y1, x0, x1, j = 0;
        nb_window(g, p0 + i, &y0, &y1, &x0, &x1);
        float *kd = kg + (size_t)(i * g->nk) * krow, *vd = vg + (size_t)(i * g->nk) * vrow;
        for (int64_t yy = y0; yy < y1; yy++) {
            size_t n = (size_t)(x1 - x0);
            int64_t src = yy * g->W + x0;
            memcpy(kd + (size_t)j * krow, k + (size_t)src * krow, n * krow * sizeof(float));
            memcpy(vd + (size_t)j * vrow, v + (size_t)src * vrow, n * vrow * sizeof(float));
            j += (int64_t)n;
        }
        /* Slots past the window are never read (key_lengths), but keep them
         * defined. */
        if (j < g->nk) {
            memset(kd + (size_t)j * krow, 0, (size_t)(g->nk - j) * krow * sizeof(float));
            memset(vd + (size_t)j * vrow, 0, (size_t)(g->nk - j) * vrow * sizeof(float));
        }
        lens[i] = j;
    }
}

static void nb_desc(const nb_geom *g, int64_t np, const int64_t *lens, qkv_attn_desc *d) {
    qkv_attn_desc_init(d);
    d->dtype = QKV_F32;
    d->batch = np;
    d->n_q = 1;
    d->n_k = g->nk;
    d->heads = g->heads;
    d->dim = g->D;
    d->dim_v = g->Dv;
    d->score = QKV_SCORE_SCALED_DOT;
    d->scale = g->scale;
    d->key_lengths = lens;
    d->threads = g->threads;
}

qkv_status qkv_neighborhood2d_forward(int64_t height, int64_t width, int64_t heads, int64_t dim,
                                      int64_t dim_v, int64_t kernel, double scale, int threads,
                                      const float *q, const float *k, const float *v, float *out,
                                      float *attn) {
    if (!q || !k || !v || !out) return QKV_ERR_NULL_POINTER;
    nb_geom g;
    qkv_status s = nb_check(&g, height, width, heads, dim, dim_v, kernel, scale, threads);
    if (s != QKV_OK) return s;
    const size_t krow = (size_t)(heads * dim), vrow = (size_t)(heads * dim_v);
    float *kg = qkv_alloc((size_t)(NB_BLOCK * g.nk) * krow * sizeof(float));
    float *vg = qkv_alloc((size_t)(NB_BLOCK * g.nk) * vrow * sizeof(float));
    float *ag = attn ? qkv_alloc((size_t)(NB_BLOCK * heads * g.nk) * sizeof(float)) : NULL;
    int64_t *lens = qkv_alloc(NB_BLOCK * sizeof(int64_t));
    if (!kg || !vg || !lens || (attn && !ag)) {
        s = QKV_ERR_OUT_OF_MEMORY;
        goto done;
    }
    const int64_t KK = kernel * kernel;
    for (int64_t p0 = 0; p0 < g.hw && s == QKV_OK; p0 += NB_BLOCK) {
        int64_t np = g.hw - p0 < NB_BLOCK ? g.hw - p0 : NB_BLOCK;
        nb_gather(&g, p0, np, k, v, kg, vg, lens);
        qkv_attn_desc d;
        nb_desc(&g, np, lens, &d);
        s = qkv_attention_forward(&d, q + (size_t)p0 * krow, kg, vg, out + (size_t)p0 * vrow, ag, NULL);
        if (s != QKV_OK || !attn) continue;
        /* ag [np, heads, 1, nk] in window order -> attn [np, heads, K*K] slots. */
        for (int64_t i = 0; i < np; i++) {
            int64_t y0, y1, x0, x1, p = p0 + i, y = p / width, x = p % width;
            nb_window(&g, p, &y0, &y1, &x0, &x1);
            for (int64_t h = 0; h < heads; h++) {
                float *dst = attn + (size_t)((p * heads + h) * KK);
                const float *src = ag + (size_t)((i * heads + h) * g.nk);
                memset(dst, 0, (size_t)KK * sizeof(float));
                int64_t j = 0;
                for (int64_t yy = y0; yy < y1; yy++)
                    for (int64_t xx = x0; xx < x1; xx++)
                        dst[(yy - y + g.r) * kernel + (xx - x + g.r)] = src[j++];
            }
        }
    }
done:
    qkv_free(kg);
    qkv_free(vg);
    qkv_free(ag);
    qkv_free(lens);
    return s;
}

/* The backward runs directly per pixel rather than through the core: the
 * core's fast backward pads every (batch, head) problem to a panel of query
 * rows, and with n_q = 1 that padding cost ~7x the forward (measured at
 * 1024 x 1024, K = 7). Per pixel and head, with w the softmax weights over
 * its window and g = dL/do:
 *   dP_j = g . v_j,  Delta = sum_j w_j dP_j,  dS_j = w_j (dP_j - Delta),
 *   dq = scale sum_j dS_j k_j,  dk_j += scale dS_j q,  dv_j += w_j g.
 * Sums are accumulated in double; keys are visited in the same order for
 * every call, so the result is deterministic. One thread: the scatter into
 * dk and dv is shared between neighbouring pixels. */
qkv_status qkv_neighborhood2d_backward(int64_t height, int64_t width, int64_t heads, int64_t dim,
                                       int64_t dim_v, int64_t kernel, double scale, int threads,
                                       const float *q, const float *k, const float *v,
                                       const float *dout, float *dq, float *dk, float *dv) {
    if (!q || !k || !v || !dout || !dq || !dk || !dv) return QKV_ERR_NULL_POINTER;
    nb_geom g;
    qkv_status s = nb_check(&g, height, width, heads, dim, dim_v, kernel, scale, threads);
    if (s != QKV_OK) return s;
    const double sc = scale != 0.0 ? scale : 1.0 / sqrt((double)dim);
    const size_t krow = (size_t)(heads * dim), vrow = (size_t)(heads * dim_v);
    double *w = qkv_alloc((size_t)g.nk * sizeof(double)), *dp = qkv_alloc((size_t)g.nk * sizeof(double));
    double *acc = qkv_alloc((size_t)dim * sizeof(double));
    int64_t *idx = qkv_alloc((size_t)g.nk * sizeof(int64_t));
    if (!w || !dp || !acc || !idx) {
        s = QKV_ERR_OUT_OF_MEMORY;
        goto done;
    }
    memset(dk, 0, (size_t)g.hw * krow * sizeof(float));
    memset(dv, 0, (size_t)g.hw * vrow * sizeof(float));
    for (int64_t p = 0; p < g.hw; p++) {
        int64_t y0, y1, x0, x1, n = 0;
        nb_window(&g, p, &y0, &y1, &x0, &x1);
        for (int64_t yy = y0; yy < y1; yy++)
            for (int64_t xx = x0; xx < x1; xx++) idx[n++] = yy * width + xx;
        for (int64_t h = 0; h < heads; h++) {
            const float *qp = q + (size_t)p * krow + (size_t)(h * dim);
            const float *gp = dout + (size_t)p * vrow + (size_t)(h * dim_v);
            double m = -INFINITY, sum = 0.0, delta = 0.0;
            for (int64_t j = 0; j < n; j++) {
                const float *kj = k + (size_t)idx[j] * krow + (size_t)(h * dim);
                double t = 0.0;
                for (int64_t e = 0; e < dim; e++) t += (double)qp[e] * kj[e];
                w[j] = sc * t;
                if (w[j] > m) m = w[j];
            }
            for (int64_t j = 0; j < n; j++) sum += (w[j] = exp(w[j] - m));
            for (int64_t j = 0; j < n; j++) {
                w[j] /= sum;
                const float *vj = v + (size_t)idx[j] * vrow + (size_t)(h * dim_v);
                double t = 0.0;
                for (int64_t e = 0; e < dim_v; e++) t += (double)gp[e] * vj[e];
                dp[j] = t;
                delta += w[j] * t;
            }
            for (int64_t e = 0; e < dim; e++) acc[e] = 0.0;
            for (int64_t j = 0; j < n; j++) {
                const double ds = w[j] * (dp[j] - delta) * sc;
                const float *kj = k + (size_t)idx[j] * krow + (size_t)(h * dim);
                float *dkj = dk + (size_t)idx[j] * krow + (size_t)(h * dim);
                float *dvj = dv + (size_t)idx[j] * vrow + (size_t)(h * dim_v);
                for (int64_t e = 0; e < dim; e++) {
                    acc[e] += ds * kj[e];
                    dkj[e] += (float)(ds * qp[e]);
                }
                for (int64_t e = 0; e < dim_v; e++) dvj[e] += (float)(w[j] * gp[e]);
            }
            float *dqp = dq + (size_t)p * krow + (size_t)(h * dim);
            for (int64_t e = 0; e < dim; e++) dqp[e] = (float)acc[e];
        }
    }
done:
    qkv_free(w);
    qkv_free(dp);
    qkv_free(acc);
    qkv_free(idx);
    return s;
}
