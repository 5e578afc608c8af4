/* int8 linear layers (internal): y = x W^T + b with W quantised once per
 * output channel and x per row at run time, the products exact in int32
 * (kernels/i8.h). The encoder's --precision int8 runs its projections on
 * them.
 *
 * Accuracy: a weight is within s_w / 2 of its value (s_w = max |W[j, :]| /
 * 127), an activation within s_x / 2; the products and their sums add no
 * error, the dequantisation two roundings. Results are bitwise identical
 * for any thread count and on every ISA. */
#ifndef QKV_GEMM_I8_H
#define QKV_GEMM_I8_H

#include <stdint.h>

#include "kernels/i8.h"
#include "qkv.h"

/* Quantised weights: n output channels of k inputs, kp = k rounded up to 4,
 * ceil(n / QKV_I8_NR) panels of kp * QKV_I8_NR bytes (kernels/i8.h), one
 * scale and one sum per channel. Owned: free with qkv_i8_matrix_free. */
typedef struct qkv_i8_matrix {
    int64_t n, k, kp;
    int8_t *panels;
    int32_t *wsum; /* [panels * QKV_I8_NR], 0 past n */
    float *scale;  /* [panels * QKV_I8_NR], 0 past n */
} qkv_i8_matrix;

/* Quantise w (row-major [n, k], row stride ldw >= k: a linear layer's
 * weight [out, in]) into *out (zeroed first; freed on failure). Errors:
 * QKV_ERR_NULL_POINTER, QKV_ERR_BAD_SIZE (n, k < 1, ldw < k, k >
 * QKV_I8_MAX_K), QKV_ERR_NOT_FINITE (a weight is NaN or infinite),
 * QKV_ERR_OUT_OF_MEMORY. */
qkv_status qkv_i8_matrix_make(const float *w, int64_t n, int64_t k, int64_t ldw, qkv_i8_matrix *out);
void qkv_i8_matrix_free(qkv_i8_matrix *m);
/* Bytes the matrix holds. */
int64_t qkv_i8_matrix_bytes(const qkv_i8_matrix *m);

/* y[r * ldy + j] = sum_t x[r * ldx + t] W[j, t] + b[j] (b NULL: 0) for r <
 * rows, j < n, through the quantised W, on `threads` threads (0: the
 * default). Errors: QKV_ERR_NULL_POINTER, QKV_ERR_BAD_SIZE (rows < 1, ldx <
 * k, ldy < n), QKV_ERR_OUT_OF_MEMORY (y untouched). With a given kernel
 * table (the tests run each): qkv_i8_linear_with. */
qkv_status qkv_i8_linear(const float *x, int64_t rows, int64_t ldx, const qkv_i8_matrix *w, const float *b, float *y,
                         int64_t ldy, int threads);
qkv_status qkv_i8_linear_with(const qkv_i8_kernels *k, const float *x, int64_t rows, int64_t ldx,
                              const qkv_i8_matrix *w, const float *b, float *y, int64_t ldy, int threads);

#endif
