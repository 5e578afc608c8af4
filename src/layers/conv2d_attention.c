/* A 2-D convolution, directly and as multi-head self-attention.
 *
 * Cordonnier, Loukas & Jaggi (ICLR 2020), Theorem 1: a multi-head
 * self-attention layer with K^2 heads, each using the quadratic relative
 * positional encoding s_h(q, k) = -alpha |delta - Delta_h|^2 (delta the
 * shift from the query pixel to the key pixel) and a value/output projection
 * carrying one tap of the kernel, computes any K x K convolution as alpha
 * grows: head h's softmax concentrates on the single key at shift Delta_h.
 *
 * The score is a dot product in disguise, which lets the attention core run
 * it: with key position k and query position q (centred coordinates),
 *     -alpha |k - q - Delta|^2 = 2 alpha k.(q + Delta) - alpha |k|^2 - alpha |q + Delta|^2,
 * and the last term is the same for every key of a row, so softmax ignores
 * it. Hence Q_h(q) = (2 alpha (q + Delta_h), -alpha) and K(k) = (k, |k|^2):
 * a 3-dimensional DOT score, K^2 query heads sharing one key/value head.
 *
 * Zero padding: the convolution reads zeros outside the image. If the keys
 * were only the image's pixels, a head whose shift leaves the image would
 * concentrate on the nearest pixel inside it instead - wrong. So the keys
 * are the pixels of the zero-padded image, (H + 2p) x (W + 2p), p = K/2:
 * padded keys have position and value 0 (W_v = I, no value bias), they are
 * attended like any other key and contribute exactly the zero the
 * convolution reads. */
#include <math.h>
#include <string.h>

#include "core/internal.h"

static qkv_status conv_check(int64_t c_in, int64_t height, int64_t width, const float *x, int64_t c_out,
                             int64_t kernel, const float *weight, const float *y) {
    if (!x || !weight || !y) return QKV_ERR_NULL_POINTER;
    if (c_in <= 0 || height <= 0 || width <= 0 || c_out <= 0 || kernel <= 0 || kernel % 2 == 0)
        return QKV_ERR_BAD_SIZE;
    int64_t n;
    int64_t fx[3] = {c_in, height, width}, fy[3] = {c_out, height, width},
            fw[4] = {c_out, c_in, kernel, kernel};
    if (!qkv_count_ok(&n, sizeof(double), 3, fx) || !qkv_count_ok(&n, sizeof(double), 3, fy) ||
        !qkv_count_ok(&n, sizeof(double), 4, fw))
        return QKV_ERR_SIZE_OVERFLOW;
    return QKV_OK;
}

qkv_status qkv_conv2d_forward(int64_t c_in, int64_t height, int64_t width, const float *x,
                              int64_t c_out, int64_t kernel, const float *weight, const float *bias,
                              float *y) {
    qkv_status s = conv_check(c_in, height, width, x, c_out, kernel, weight, y);
    if (s != QKV_OK) return s;
    const int64_t p = kernel / 2, HW = height * width;
    for (int64_t o = 0; o < c_out; o++)
        for (int64_t i = 0; i < height; i++)
            for (int64_t j = 0; j < width; j++) {
                double acc = bias ? (double)bias[o] : 0.0;
                for (int64_t c = 0; c < c_in; c++)
                    for (int64_t a = 0; a < kernel; a++) {
                        int64_t yy = i + a - p;
                        if (yy < 0 || yy >= height) continue; /* zero padding */
                        for (int64_t b = 0; b < kernel; b++) {
                            int64_t xx = j + b - p;
                            if (xx < 0 || xx >= width) continue;
                            acc += (double)weight[((o * c_in + c) * kernel + a) * kernel + b] *
                                   (double)x[c * HW + yy * width + xx];
                        }
                    }
                y[o * HW + i * width + j] = (float)acc;
            }
    return QKV_OK;
}

qkv_status qkv_conv2d_as_attention(int64_t c_in, int64_t height, int64_t width, const float *x,
                                   int64_t c_out, int64_t kernel, const float *weight,
                                   const float *bias, double alpha, float *y) {
    qkv_status s = conv_check(c_in, height, width, x, c_out, kernel, weight, y);
    if (s != QKV_OK) return s;
    if (!(alpha > 0.0) || !isfinite(alpha)) return QKV_ERR_BAD_PARAMETER;
    const int64_t p = kernel / 2, KK = kernel * kernel;
    const int64_t Hp = height + 2 * p, Wp = width + 2 * p;
    int64_t nq = height * width, nk, n_out, n_wo, n_q3, n_kv;
    int64_t fk[2] = {Hp, Wp}, fo[3] = {nq, KK, c_in}, fwo[3] = {c_out, KK, c_in}, fq[3] = {nq, KK, 3};
    if (!qkv_count_ok(&nk, sizeof(float) * 3, 2, fk) || !qkv_count_ok(&n_out, sizeof(float), 3, fo) ||
        !qkv_count_ok(&n_wo, sizeof(float), 3, fwo) || !qkv_count_ok(&n_q3, sizeof(float), 3, fq) ||
        !qkv_mul_ok(nk, c_in, &n_kv) || n_kv > (int64_t)(SIZE_MAX / sizeof(float)))
        return QKV_ERR_SIZE_OVERFLOW;

    float *Q = qkv_alloc((size_t)n_q3 * sizeof(float));
    float *K = qkv_alloc((size_t)(nk * 3) * sizeof(float));
    float *V = qkv_alloc_zeroed((size_t)n_kv * sizeof(float));
    float *O = qkv_alloc((size_t)n_out * sizeof(float));
    float *Wo = qkv_alloc((size_t)n_wo * sizeof(float));
    float *Yt = qkv_alloc((size_t)(nq * c_out) * sizeof(float));
    if (!Q || !K || !V || !O || !Wo || !Yt) {
        s = QKV_ERR_OUT_OF_MEMORY;
        goto done;
    }
    /* Centred coordinates keep |k|^2 small, so float32 logits stay exact
     * enough to separate the best key from the next by alpha. */
    const double cy = 0.5 * (double)(height - 1), cx = 0.5 * (double)(width - 1);
    for (int64_t i = 0; i < Hp; i++)
        for (int64_t j = 0; j < Wp; j++) {
            double ky = (double)(i - p) - cy, kx = (double)(j - p) - cx;
            float *kr = K + (i * Wp + j) * 3;
            kr[0] = (float)ky;
            kr[1] = (float)kx;
            kr[2] = (float)(ky * ky + kx * kx);
            if (i >= p && i < p + height && j >= p && j < p + width)
                for (int64_t c = 0; c < c_in; c++)
                    V[(i * Wp + j) * c_in + c] = x[c * nq + (i - p) * width + (j - p)];
        }
    for (int64_t i = 0; i < height; i++)
        for (int64_t j = 0; j < width; j++)
            for (int64_t a = 0; a < kernel; a++)
                for (int64_t b = 0; b < kernel; b++) {
                    /* Head h = (a, b) looks at the shift Delta = (a - p, b - p). */
                    float *qr = Q + ((i * width + j) * KK + a * kernel + b) * 3;
                    qr[0] = (float)(2.0 * alpha * ((double)i - cy + (double)(a - p)));
                    qr[1] = (float)(2.0 * alpha * ((double)j - cx + (double)(b - p)));
                    /* K(k)[2] = |k|^2 is exact in float for these small integers
                     * and half-integers; -alpha times it is one rounding. */
                    qr[2] = (float)(-alpha);
                }
    qkv_attn_desc d;
    qkv_attn_desc_init(&d);
    d.dtype = QKV_F32;
    d.batch = 1;
    d.n_q = nq;
    d.n_k = nk;
    d.heads = KK;
    d.heads_kv = 1;
    d.dim = 3;
    d.dim_v = c_in;
    d.score = QKV_SCORE_DOT;
    s = qkv_attention_forward(&d, Q, K, V, O, NULL, NULL);
    if (s != QKV_OK) goto done;
    /* Output projection: W_o [C_out, K^2 C_in], block h = w[:, :, a, b]. */
    for (int64_t o = 0; o < c_out; o++)
        for (int64_t h = 0; h < KK; h++)
            for (int64_t c = 0; c < c_in; c++)
                Wo[(o * KK + h) * c_in + c] = weight[(o * c_in + c) * KK + h];
    s = qkv_sgemm(0, 1, nq, c_out, KK * c_in, 1.0f, O, KK * c_in, Wo, KK * c_in, 0.0f, Yt, c_out, 0);
    if (s != QKV_OK) goto done;
    for (int64_t o = 0; o < c_out; o++)
        for (int64_t t = 0; t < nq; t++) y[o * nq + t] = Yt[t * c_out + o] + (bias ? bias[o] : 0.0f);
done:
    qkv_free(Q);
    qkv_free(K);
    qkv_free(V);
    qkv_free(O);
    qkv_free(Wo);
    qkv_free(Yt);
    return s;
}
