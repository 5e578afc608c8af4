/* 1-D convolution over a sequence ("same" length, zero padding, optional
 * dilation), forward and backward: the convolutional layer of the
 * complexity comparison (Vaswani et al. 2017, Table 1: O(k n d^2) work,
 * O(1) sequential operations, maximum path length O(n/k) contiguous or
 * O(log_k n) dilated).
 *
 * Each kernel tap j is one matrix product over the rows whose shifted input
 * exists: Y[t] += X[t + r (j - (k-1)/2)] W_jᵀ, W_j = w[:, :, j], so the work
 * goes through qkv_sgemm. */
#include <string.h>

#include "core/internal.h"
#include "support/baselines.h"

static qkv_status c1_check(int64_t n, int64_t c_in, int64_t c_out, int64_t kernel, int64_t dilation) {
    if (n <= 0 || c_in <= 0 || c_out <= 0 || kernel <= 0 || kernel % 2 == 0 || dilation <= 0)
        return QKV_ERR_BAD_SIZE;
    int64_t a, b, c, e;
    if (!qkv_mul_ok(n, c_in > c_out ? c_in : c_out, &a) || !qkv_mul_ok(c_in, c_out, &b) ||
        !qkv_mul_ok(b, kernel, &c) || !qkv_mul_ok(dilation, kernel, &e) || (uint64_t)a > SIZE_MAX / 4 ||
        (uint64_t)c > SIZE_MAX / 4)
        return QKV_ERR_SIZE_OVERFLOW;
    return QKV_OK;
}

/* Rows t in [*t0, *t1) have input row t + off inside [0, n). */
static void tap_rows(int64_t n, int64_t off, int64_t *t0, int64_t *t1) {
    *t0 = off < 0 ? -off : 0;
    *t1 = off > 0 ? n - off : n;
    if (*t1 < *t0) *t1 = *t0;
}

qkv_status qkv_conv1d_forward(int64_t n, int64_t c_in, int64_t c_out, int64_t kernel,
                              int64_t dilation, const float *w, const float *b, const float *x,
                              float *y) {
    if (!w || !x || !y) return QKV_ERR_NULL_POINTER;
    qkv_status s = c1_check(n, c_in, c_out, kernel, dilation);
    if (s != QKV_OK) return s;
    float *wj = qkv_alloc((size_t)(c_out * c_in) * sizeof(float));
    if (!wj) return QKV_ERR_OUT_OF_MEMORY;
    for (int64_t t = 0; t < n; t++)
        for (int64_t o = 0; o < c_out; o++) y[t * c_out + o] = b ? b[o] : 0.0f;
    const int64_t half = (kernel - 1) / 2;
    for (int64_t j = 0; j < kernel && s == QKV_OK; j++) {
        int64_t off = dilation * (j - half), t0, t1;
        tap_rows(n, off, &t0, &t1);
        if (t1 <= t0) continue;
        for (int64_t o = 0; o < c_out; o++)
            for (int64_t c = 0; c < c_in; c++) wj[o * c_in + c] = w[(o * c_in + c) * kernel + j];
        s = qkv_sgemm(0, 1, t1 - t0, c_out, c_in, 1.0f, x + (t0 + off) * c_in, c_in, wj, c_in, 1.0f,
                      y + t0 * c_out, c_out, 0);
    }
    qkv_free(wj);
    return s;
}

qkv_status qkv_conv1d_backward(int64_t n, int64_t c_in, int64_t c_out, int64_t kernel,
                               int64_t dilation, const float *w, const float *x, const float *dy,
                               float *dx, float *dw, float *db) {
    if (!w || !x || !dy || !dw) return QKV_ERR_NULL_POINTER;
    qkv_status s = c1_check(n, c_in, c_out, kernel, dilation);
    if (s != QKV_OK) return s;
    float *wj = qkv_alloc((size_t)(c_out * c_in) * sizeof(float));
    float *dwj = qkv_alloc((size_t)(c_out * c_in) * sizeof(float));
    if (!wj || !dwj) {
        qkv_free(wj);
        qkv_free(dwj);
        return QKV_ERR_OUT_OF_MEMORY;
    }
    if (dx) memset(dx, 0, (size_t)(n * c_in) * sizeof(float));
    const int64_t half = (kernel - 1) / 2;
    for (int64_t j = 0; j < kernel && s == QKV_OK; j++) {
        int64_t off = dilation * (j - half), t0, t1;
        tap_rows(n, off, &t0, &t1);
        if (t1 <= t0) continue;
        for (int64_t o = 0; o < c_out; o++)
            for (int64_t c = 0; c < c_in; c++) wj[o * c_in + c] = w[(o * c_in + c) * kernel + j];
        /* dW_j = dY[t0:t1]ᵀ X[t0+off : t1+off];  dX[t+off] += dY[t] W_j */
        s = qkv_sgemm(1, 0, c_out, c_in, t1 - t0, 1.0f, dy + t0 * c_out, c_out, x + (t0 + off) * c_in, c_in,
                      0.0f, dwj, c_in, 0);
        if (s != QKV_OK) break;
        for (int64_t o = 0; o < c_out; o++)
            for (int64_t c = 0; c < c_in; c++) dw[(o * c_in + c) * kernel + j] += dwj[o * c_in + c];
        if (dx)
            s = qkv_sgemm(0, 0, t1 - t0, c_in, c_out, 1.0f, dy + t0 * c_out, c_out, wj, c_in, 1.0f,
                          dx + (t0 + off) * c_in, c_in, 0);
    }
    if (s == QKV_OK && db)
        for (int64_t o = 0; o < c_out; o++) {
            double acc = 0.0;
            for (int64_t t = 0; t < n; t++) acc += dy[t * c_out + o];
            db[o] += (float)acc;
        }
    qkv_free(wj);
    qkv_free(dwj);
    return s;
}
