/* The recurrent and convolutional baselines of `qkv complexity`: not part
 * of the library; built into the CLI's support library (tools/support),
 * which the CLI and its tests link. */
#ifndef QKV_TOOLS_BASELINES_H
#define QKV_TOOLS_BASELINES_H

#include <stddef.h>
#include <stdint.h>

#include "qkv.h"

/* The layers of the complexity comparison (Vaswani et al. 2017, Table 1):
 * plain forward/backward pairs over caller-owned buffers, one sequence of n
 * vectors of dimension d, accumulating in float. Backward functions
 * *accumulate* into the parameter gradients and *overwrite* dx. */

/* Elman RNN: h_t = tanh(W_x x_t + W_h h_{t-1} + b), h_{-1} = 0.
 * x [n, d_in], W_x [d, d_in], W_h [d, d], b [d] (or NULL), h [n, d] written.
 * n sequential steps: the dependency chain has length n. Errors:
 * QKV_ERR_NULL_POINTER, QKV_ERR_BAD_SIZE, QKV_ERR_SIZE_OVERFLOW. */
qkv_status qkv_rnn_forward(int64_t n, int64_t d_in, int64_t d, const float *w_x, const float *w_h,
                           const float *b, const float *x, float *h);

/* Backpropagation through time: dh [n, d] = dL/dh given (h from the
 * forward); dx [n, d_in] written (may be NULL); dW_x, dW_h, db accumulated
 * (db may be NULL). Errors as the forward, QKV_ERR_OUT_OF_MEMORY. */
qkv_status qkv_rnn_backward(int64_t n, int64_t d_in, int64_t d, const float *w_x, const float *w_h,
                            const float *x, const float *h, const float *dh, float *dx, float *dw_x,
                            float *dw_h, float *db);

/* LSTM (Hochreiter & Schmidhuber 1997, gates in torch's order i, f, g, o):
 *   [i f g o] = W_x x_t + W_h h_{t-1} + b;  c_t = s(f) c_{t-1} + s(i) tanh(g);
 *   h_t = s(o) tanh(c_t),  h_{-1} = c_{-1} = 0.
 * W_x [4d, d_in], W_h [4d, d], b [4d] (or NULL), h [n, d] written,
 * cache [n, 6d] written (gate activations and cell state, for the backward).
 * Errors as qkv_rnn_forward. */
qkv_status qkv_lstm_forward(int64_t n, int64_t d_in, int64_t d, const float *w_x, const float *w_h,
                            const float *b, const float *x, float *h, float *cache);
qkv_status qkv_lstm_backward(int64_t n, int64_t d_in, int64_t d, const float *w_x, const float *w_h,
                             const float *x, const float *h, const float *cache, const float *dh,
                             float *dx, float *dw_x, float *dw_h, float *db);

/* 1-D convolution over a sequence, "same" length: kernel k (odd), dilation
 * r >= 1, zero padding r (k - 1) / 2 on each side:
 *   y[t, o] = b[o] + sum_{c, j} w[o, c, j] x[t + r (j - (k-1)/2), c]
 * x [n, c_in], w [c_out, c_in, k] (torch's Conv1d layout), b [c_out] or NULL,
 * y [n, c_out]. Errors: QKV_ERR_NULL_POINTER, QKV_ERR_BAD_SIZE (k even, a
 * size <= 0), QKV_ERR_SIZE_OVERFLOW. */
qkv_status qkv_conv1d_forward(int64_t n, int64_t c_in, int64_t c_out, int64_t kernel,
                              int64_t dilation, const float *w, const float *b, const float *x,
                              float *y);
/* dy [n, c_out] given; dx [n, c_in] written (may be NULL); dw, db
 * accumulated (db may be NULL). Errors as the forward. */
qkv_status qkv_conv1d_backward(int64_t n, int64_t c_in, int64_t c_out, int64_t kernel,
                               int64_t dilation, const float *w, const float *x, const float *dy,
                               float *dx, float *dw, float *db);

#endif /* QKV_TOOLS_BASELINES_H */
