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

static void bias_act_generic(float *y, const float *bias, size_t n, int act) {
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

void qkv_nn_init_generic(qkv_nn_kernels *k) {
    *k = (qkv_nn_kernels){"generic", bias_act_generic, add_layernorm_generic, gelu_grad_generic};
}
