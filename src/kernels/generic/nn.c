/* Portable row kernels (kernels/nn.h): libm's erf and tanh, the LayerNorm
 * statistics in double. */
#include <math.h>

#include "kernels/nn.h"

static double act_of(double x, int act) {
    switch (act) {
    case QKV_NN_ACT_GELU: return 0.5 * x * erfc(-x * 0.70710678118654752440);
    case QKV_NN_ACT_GELU_TANH: /* 0.5 (1 + tanh u) = 1 / (1 + e^-2u), without the cancellation */
        return x / (1.0 + exp(-2.0 * 0.79788456080286535588 * (x + 0.044715 * x * x * x)));
    case QKV_NN_ACT_RELU: return x < 0 ? 0.0 : x;
    default: return x;
    }
}

static void bias_act_generic(float *y, size_t ldy, size_t rows, const float *bias, size_t n, int act) {
    for (size_t r = 0; r < rows; r++, y += ldy)
        for (size_t i = 0; i < n; i++) {
            float z = bias ? y[i] + bias[i] : y[i];
            y[i] = (float)act_of(z, act);
        }
}

static void add_layernorm_generic(float *x, const float *res, const float *g, const float *b, size_t n, float eps) {
    double sum = 0, sq = 0;
    for (size_t i = 0; i < n; i++) {
        if (res) x[i] += res[i];
        sum += x[i];
    }
    const double mean = sum / (double)n;
    for (size_t i = 0; i < n; i++) sq += (x[i] - mean) * (x[i] - mean);
    const double rs = 1.0 / sqrt(sq / (double)n + (double)eps);
    for (size_t i = 0; i < n; i++) x[i] = (float)((x[i] - mean) * rs * g[i] + b[i]);
}

static void gelu_grad_generic(float *act, float *pre, size_t n, int keep_grad) {
    for (size_t i = 0; i < n; i++) {
        float g;
        act[i] = qkv_nn_gelu_eval(pre[i], &g);
        if (keep_grad) pre[i] = g;
    }
}

static void ln_forward_generic(const float *x, const float *g, const float *b, size_t n, double eps, float *y,
                               float *mean, float *rstd) {
    double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (size_t i = 0; i < n; i++) s[i % 8] += (double)x[i];
    const double mu = qkv_nn_sum8(s) / (double)n;
    for (int l = 0; l < 8; l++) s[l] = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double d = (double)x[i] - mu;
        s[i % 8] += d * d;
    }
    const double rs = 1.0 / sqrt(qkv_nn_sum8(s) / (double)n + eps);
    for (size_t i = 0; i < n; i++) y[i] = (float)((((double)x[i] - mu) * rs) * (double)g[i] + (double)b[i]);
    *mean = (float)mu;
    *rstd = (float)rs;
}

static void ln_backward_row_generic(const float *x, const float *g, float mean, float rstd, const float *dy, size_t n,
                                    float *dx, int accumulate) {
    const double m = mean, r = rstd;
    double sa[8] = {0, 0, 0, 0, 0, 0, 0, 0}, sb[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (size_t i = 0; i < n; i++) {
        const double xh = ((double)x[i] - m) * r, gh = (double)dy[i] * (double)g[i];
        sa[i % 8] += gh;
        sb[i % 8] += gh * xh;
    }
    const double A = qkv_nn_sum8(sa) / (double)n, B = qkv_nn_sum8(sb) / (double)n;
    for (size_t i = 0; i < n; i++) {
        const double xh = ((double)x[i] - m) * r, gh = (double)dy[i] * (double)g[i];
        const float v = (float)(r * ((gh - A) - xh * B));
        dx[i] = accumulate ? dx[i] + v : v;
    }
}

static void ln_grad_cols_generic(const float *x, const float *dy, const float *mean, const float *rstd, size_t rows,
                                 size_t ld, size_t n, float *dg, float *db) {
    for (size_t r = 0; r < rows; r++) {
        const float *xr = x + r * ld, *dr = dy + r * ld;
        const double m = mean[r], rs = rstd[r];
        for (size_t i = 0; i < n; i++) {
            dg[i] += (float)((double)dr[i] * (((double)xr[i] - m) * rs));
            db[i] += dr[i];
        }
    }
}

static void col_sums_generic(float *db, const float *x, size_t rows, size_t ld, size_t n) {
    for (size_t r = 0; r < rows; r++)
        for (size_t i = 0; i < n; i++) db[i] += x[r * ld + i];
}

void qkv_nn_init_generic(qkv_nn_kernels *k) {
    *k = (qkv_nn_kernels){"generic",          bias_act_generic,        add_layernorm_generic, gelu_grad_generic,
                          ln_forward_generic, ln_backward_row_generic, ln_grad_cols_generic, col_sums_generic};
}
