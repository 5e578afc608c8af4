/* The layers' row kernels (internal): the elementwise and per-row steps
 * that sit between a model's matrix products - bias + activation after a
 * projection, residual + LayerNorm after a block - one row at a time, so a
 * caller runs rows in parallel and each row is computed the same way
 * whatever the thread count. The encoder (model/encoder.c) runs on them.
 *
 * The generic table (kernels/generic/nn.c) states the contract in plain C
 * with libm and statistics in double; the AVX-512 one (kernels/avx512/nn.c)
 * computes the same functions with polynomials in float. Tolerances, as
 * tests/test_kernels.c checks them against the generic table:
 *   bias_act:      6e-7 |y| + 1e-12 for every activation (the erf and exp
 *                  polynomials are within 5e-10 and 2e-7 relative, the
 *                  exponentials' arguments are formed in double);
 *   add_layernorm: 2e-6 * (|g| * 8 + |b|) absolute on standardised rows. */
#ifndef QKV_KERNELS_NN_H
#define QKV_KERNELS_NN_H

#include <stddef.h>

enum {
    QKV_NN_ACT_NONE = 0,
    QKV_NN_ACT_GELU = 1,      /* x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)) */
    QKV_NN_ACT_GELU_TANH = 2, /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
    QKV_NN_ACT_RELU = 3       /* max(x, 0); NaN stays NaN */
};

typedef struct qkv_nn_kernels {
    const char *name;
    /* y[i] = act(y[i] + bias[i]) for i < n (bias NULL: y[i] alone). NaN
     * stays NaN; GELU(+inf) = +inf. */
    void (*bias_act)(float *y, const float *bias, size_t n, int act);
    /* With z = x + res (res NULL: z = x) over i < n: x[i] = (z[i] - mean)
     * / sqrt(var + eps) * g[i] + b[i], mean and biased variance of z. */
    void (*add_layernorm)(float *x, const float *res, const float *g, const float *b, size_t n, float eps);
} qkv_nn_kernels;

void qkv_nn_init_generic(qkv_nn_kernels *k);
void qkv_nn_init_avx512(qkv_nn_kernels *k);

#endif
