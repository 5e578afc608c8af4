/* The layers' row kernels (internal): the elementwise and per-row steps
 * that sit between a model's matrix products - bias + activation after a
 * projection, residual + LayerNorm after a block - one row at a time, so a
 * caller runs rows in parallel and each row is computed the same way
 * whatever the thread count. The encoder (model/encoder.c) runs on them,
 * and the transformer's training step (model/transformer.c) on gelu_grad
 * and the ln_* kernels.
 *
 * The generic table (kernels/generic/nn.c) states the contract in plain C
 * with libm and statistics in double; the AVX-512 one (kernels/avx512/nn.c)
 * computes the same functions with polynomials in float. Tolerances, as
 * tests/test_kernels.c checks them against the generic table:
 *   bias_act:      6e-7 |y| + 1e-12 for every activation (the erfc and
 *                  exp polynomials are within 7e-9 and 2e-7 relative, the
 *                  exponentials' arguments are formed as float pairs or in
 *                  double);
 *   add_layernorm: 2e-6 * (|g| * 8 + |b|) absolute on standardised rows;
 *   gelu_grad:     bitwise equal (qkv_nn_gelu_eval, the same float ops);
 *   ln_forward, ln_backward_row, ln_grad_cols, col_sums: bitwise equal
 *                  (the same operations in the same order). */
#ifndef QKV_KERNELS_NN_H
#define QKV_KERNELS_NN_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum {
    QKV_NN_ACT_NONE = 0,
    QKV_NN_ACT_GELU = 1,      /* x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)) */
    QKV_NN_ACT_GELU_TANH = 2, /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
    QKV_NN_ACT_RELU = 3       /* max(x, 0); NaN stays NaN */
};

typedef struct qkv_nn_kernels {
    const char *name;
    /* For each of `rows` rows at y + r * ldy (ldy >= n): y[i] = act(y[i] +
     * bias[i]) for i < n (bias NULL: y[i] alone); nothing between the rows
     * is touched, and a row's result does not depend on the others. NaN
     * stays NaN; GELU(+inf) = +inf. One call for a block of rows keeps the
     * constants of the activation in registers across them. */
    void (*bias_act)(float *y, size_t ldy, size_t rows, const float *bias, size_t n, int act);
    /* With z = x + res (res NULL: z = x) over i < n: x[i] = (z[i] - mean)
     * / sqrt(var + eps) * g[i] + b[i], mean and biased variance of z. */
    void (*add_layernorm)(float *x, const float *res, const float *g, const float *b, size_t n, float eps);
    /* The training GELU: act[i] = GELU(pre[i]) by qkv_nn_gelu_eval below,
     * bitwise; with keep_grad pre[i] is replaced by GELU'(pre[i]). act and
     * pre do not overlap. */
    void (*gelu_grad)(float *act, float *pre, size_t n, int keep_grad);

    /* The training LayerNorm (the transformer's forward and backward), in
     * double. Sums over i < n run in eight interleaved partial sums, lane
     * i % 8 from +0 in order of i, combined as qkv_nn_sum8 does; every
     * other operation is elementwise. Every ISA computes these double
     * operations in this order without FMA: bitwise the generic's.
     *
     * ln_forward: mu = sum(x) / n, var = sum((x - mu)^2) / n (biased), rs =
     * 1 / sqrt(var + eps); y[i] = (float)(((x[i] - mu) rs) g[i] + b[i]);
     * mean = (float)mu, rstd = (float)rs. y may not overlap x. */
    void (*ln_forward)(const float *x, const float *g, const float *b, size_t n, double eps, float *y,
                       float *mean, float *rstd);
    /* ln_backward_row: the input gradient of one row from the forward's
     * mean and rstd (m, r): with xh[i] = (x[i] - m) r and gh[i] = dy[i] g[i],
     * A = sum(gh) / n, B = sum(gh xh) / n,
     * v[i] = (float)(r ((gh[i] - A) - xh[i] B)); dx[i] = accumulate ?
     * dx[i] + v[i] (in float) : v[i]. */
    void (*ln_backward_row)(const float *x, const float *g, float mean, float rstd, const float *dy, size_t n,
                            float *dx, int accumulate);
    /* ln_grad_cols: the parameter gradients of columns i < n over rows r <
     * rows in order (row r at x + r ld, dy + r ld): dg[i] += (float)(dy xh),
     * db[i] += dy (float sums), xh as above with mean[r], rstd[r]. */
    void (*ln_grad_cols)(const float *x, const float *dy, const float *mean, const float *rstd, size_t rows,
                         size_t ld, size_t n, float *dg, float *db);
    /* col_sums: a bias gradient, db[i] += x[r ld + i] for r < rows in
     * order (float sums), i < n. */
    void (*col_sums)(float *db, const float *x, size_t rows, size_t ld, size_t n);
} qkv_nn_kernels;

/* The combination of eight partial sums every LayerNorm kernel uses (the
 * order of an AVX-512 reduction: halves, then quarters, then the pair). */
static inline double qkv_nn_sum8(const double s[8]) {
    return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

/* GELU(x) = x * Phi(x) with the exact-erf definition (torch.nn.GELU's
 * default), evaluated without libm so that loops over it vectorise (the
 * scalar erff and expf calls were about a quarter of a training step at
 * E = 128, measured: 4.2M erff take ~75 ms, the step ~290 ms).
 *
 * Phi(x) = 1 - erfc(a)/2 for x >= 0 and erfc(a)/2 for x < 0, a = |x|/sqrt 2,
 * with erfc(a) = t (c1 + c2 t + .. + c5 t^4) exp(-a^2), t = 1 / (1 + p a)
 * (Abramowitz & Stegun 7.1.26, |error in erf| <= 1.5e-7 for all a). So
 * Phi has absolute error <= 0.75e-7 (about one float ulp of Phi near 1),
 * GELU absolute error <= 0.75e-7 |x| plus rounding. Measured against
 * double erf on [-12, 12] in steps of 1e-4: |error| <= 1.74e-7 max(1, |x|)
 * for GELU (the libm erff version: 1.0e-7), <= 2.9e-7 for GELU'.
 * exp(-a^2) = exp(-x^2/2) is computed once and also gives the derivative
 * GELU'(x) = Phi(x) + x phi(x), phi(x) = exp(-x^2/2) / sqrt(2 pi).
 * exp(y), y in [-87, 0] (clamped below: exp(-87) ~ 1.6e-38 is still normal,
 * and erfc or phi there is zero to float precision anyway): y = n ln2 + r,
 * |r| <= ln2/2, n rounded by the 1.5 * 2^23 trick (exact for |y log2 e| < 2^22),
 * ln2 split in two so n ln2 is exact, e^r by its Taylor series to r^7
 * (truncation < 3e-9 relative), 2^n built in the exponent bits. Branch-free,
 * every operation IEEE single (no FMA contraction on the baseline target),
 * elementwise: results do not depend on vector width or thread count.
 * The gelu_grad kernels compute exactly these operations, bit for bit. */
static inline float qkv_nn_gelu_eval(float x, float *grad) {
    float a = fabsf(x) * 0.70710678f;
    /* The clamp and the sign select below go through the bit patterns:
     * gcc does not if-convert float comparisons under its default
     * -ftrapping-math, and the loop would stay scalar. Non-negative floats
     * order like their bits as unsigned integers. */
    float a2 = a * a, lim = 87.0f, y;
    uint32_t ab, lb;
    memcpy(&ab, &a2, sizeof ab);
    memcpy(&lb, &lim, sizeof lb);
    ab = ab < lb ? ab : lb;
    memcpy(&a2, &ab, sizeof a2);
    y = -a2;
    float fn = (y * 1.44269504f + 12582912.0f) - 12582912.0f;
    float r = (y - fn * 0.693359375f) - fn * -2.12194440e-4f;
    float e = 1.0f + r * (1.0f + r * (0.5f + r * (1.6666667e-1f + r * (4.1666668e-2f +
              r * (8.3333338e-3f + r * (1.3888889e-3f + r * 1.9841270e-4f))))));
    int32_t n = (int32_t)fn;
    uint32_t bits = (uint32_t)(n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    e *= scale;
    float t = 1.0f / (1.0f + 0.3275911f * a);
    float erfc_a = t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f +
                   t * (-1.453152027f + t * 1.061405429f)))) * e;
    float lo = 0.5f * erfc_a, hi = 1.0f - lo, cdf;
    uint32_t xb, lob, hib;
    memcpy(&xb, &x, sizeof xb);
    memcpy(&lob, &lo, sizeof lob);
    memcpy(&hib, &hi, sizeof hib);
    uint32_t neg = 0u - (xb >> 31); /* all ones when x < 0 (or x = -0) */
    hib = (lob & neg) | (hib & ~neg);
    memcpy(&cdf, &hib, sizeof cdf);
    *grad = cdf + x * (e * 0.39894228f);
    return x * cdf;
}

void qkv_nn_init_generic(qkv_nn_kernels *k);
void qkv_nn_init_avx512(qkv_nn_kernels *k);

#endif
