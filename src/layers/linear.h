/* The linear layer y = x Wᵀ + b (torch's nn.Linear: W [out, in]) and its
 * backward, through qkv_sgemm (or the bf16 product, gemm/gemm.h); shared by the multi-head layer's projections
 * (mha.c, kv_cache.c) and the transformer's MLP and head (src/model).
 * Internal. */
#ifndef QKV_LAYERS_LINEAR_H
#define QKV_LAYERS_LINEAR_H

#include "qkv.h"

/* y[r, :] = x[r, :] Wᵀ + b for rows r < rows: x [rows, in], W [out, in],
 * b [out] or NULL. Bias rows added in parallel chunks of whole rows: the
 * same bits for any thread count. */
qkv_status nn_linear(const float *x, int64_t rows, int64_t in, const float *w, const float *b, int64_t out,
                     float *y, int threads);

/* y = act(x Wᵀ + b) (act a QKV_NN_ACT_* of kernels/nn.h, b may be NULL):
 * the bias and the activation applied to each block of y by the product's
 * epilogue while the block is in cache, instead of a pass over y; the same
 * bits as nn_linear and then bias_act over the rows. */
qkv_status nn_linear_act(const float *x, int64_t rows, int64_t in, const float *w, const float *b, int64_t out,
                         float *y, int act, int threads);

/* A step on whole rows of y after a linear layer (a residual + LayerNorm):
 * fn(ctx, y_i0, ldy, i0, m) on rows i0 .. i0 + m - 1 (y_i0 at their first),
 * each row exactly once, after its bias and activation; in the product's
 * loop nest while the rows are in cache where its thread grid keeps rows
 * whole on one thread, else in a pass after it (gemm/gemm.h,
 * qkv_gemm_epi.rows). fn must treat each row alone. */
typedef struct nn_rows_step {
    void (*fn)(void *ctx, float *y, int64_t ldy, int64_t i0, int64_t m);
    void *ctx;
} nn_rows_step;

/* nn_linear_act, then `then` (NULL: nothing) on the rows of y. */
qkv_status nn_linear_act_then(const float *x, int64_t rows, int64_t in, const float *w, const float *b, int64_t out,
                              float *y, int act, const nn_rows_step *then, int threads);

/* y_s = x W_sᵀ + b_s for s < count (<= QKV_GEMM_MAX_SEGS): several linear
 * layers of one input, W_s [out_s, in], b_s [out_s] or NULL, y_s [rows,
 * out_s], as one product where their shapes allow (gemm/gemm.h,
 * qkv_gemm_run_segs: A packed once, one thread team); the same bits as
 * nn_linear on each. */
qkv_status nn_linear_multi(const float *x, int64_t rows, int64_t in, int count, const float *const *w,
                           const float *const *b, const int64_t *out, float *const *y, int threads);

/* The same for weights packed for the bf16 product (gemm/gemm.h): y [rows,
 * w->N] = act(x [rows, w->K] Wᵀ + b), the bias added in the product's
 * tiles, the activation in its epilogue. */
struct qkv_gemm_bf16_b;
qkv_status nn_linear_bf16_act(const float *x, int64_t rows, const struct qkv_gemm_bf16_b *w, const float *b,
                              float *y, int act, int threads);
qkv_status nn_linear_bf16_act_then(const float *x, int64_t rows, const struct qkv_gemm_bf16_b *w, const float *b,
                                   float *y, int act, const nn_rows_step *then, int threads);

/* The backward of nn_linear given dy [rows, out]: dW += dyᵀ x (when dw is
 * not NULL), db += Σ_r dy[r] (when db is not NULL; columns in parallel
 * chunks, each summed over the rows in order), then dx = dy W, or
 * dx += dy W with accumulate_dx (when dx is not NULL). */
qkv_status nn_linear_backward(const float *x, const float *dy, int64_t rows, int64_t in, int64_t out,
                              const float *w, float *dw, float *db, float *dx, int accumulate_dx, int threads);

/* The same in a precision of products: QKV_BF16 multiplies through
 * qkv_gemm_bf16 (x, W, dy rounded to bf16 as they are packed, products
 * summed in float; W packed per call since it changes between steps; the
 * bias, its gradient, dW and dx accumulate in float32); any other value is
 * nn_linear / nn_linear_backward exactly. Every element computed as on one
 * thread, whatever the thread count. */
qkv_status nn_linear_p(qkv_dtype prec, const float *x, int64_t rows, int64_t in, const float *w, const float *b,
                       int64_t out, float *y, int threads);
qkv_status nn_linear_backward_p(qkv_dtype prec, const float *x, const float *dy, int64_t rows, int64_t in,
                                int64_t out, const float *w, float *dw, float *db, float *dx, int accumulate_dx,
                                int threads);

#endif
