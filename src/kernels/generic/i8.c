/* Portable int8 kernels: the contract of kernels/i8.h in plain C loops. */
#include <math.h>

#include "kernels/i8.h"

static float quant_row_generic(const float *x, size_t k, size_t kp, uint8_t *a, int32_t *oidx, float *oval,
                               int *nout) {
    float lane[16] = {0}, sum = 0.0f; /* 16 lanes of t mod 16, then in lane order: the vector order */
    for (size_t t = 0; t < k; t++) lane[t % 16] += fabsf(x[t]);
    for (int l = 0; l < 16; l++) sum += lane[l];
    const float thr = QKV_I8_OUTLIER * (sum / (float)k);
    int no = 0;
    size_t last = 0; /* outliers are the t <= last with |x[t]| > thr */
    for (size_t t = 0; t < k && no < QKV_I8_MAX_OUT; t++)
        if (fabsf(x[t]) > thr) {
            oidx[no] = (int32_t)t;
            oval[no++] = x[t];
            last = t;
        }
    *nout = no;
    float m = 0.0f;
    for (size_t t = 0; t < k; t++) {
        float v = fabsf(x[t]);
        if (no && t <= last && v > thr) continue;
        if (v > m) m = v;
    }
    float inv = m > 0.0f ? 127.0f / m : 0.0f;
    for (size_t t = 0; t < k; t++) {
        if (no && t <= last && fabsf(x[t]) > thr) {
            a[t] = 128;
            continue;
        }
        float v = rintf(x[t] * inv);
        if (!(v >= -127.0f)) v = -127.0f; /* NaN too */
        if (v > 127.0f) v = 127.0f;
        a[t] = (uint8_t)((int)v + 128);
    }
    for (size_t t = k; t < kp; t++) a[t] = 128;
    return m > 0.0f ? m / 127.0f : 0.0f;
}

static void tile_generic(size_t kp, const uint8_t *a, size_t lda, const int8_t *bp, const int32_t *wsum,
                         const float *sa, const float *sw, const float *bias, float *c, size_t ldc, int m, int n,
                         const int *nout, const int32_t *oidx, const float *oval) {
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            int32_t acc = 0;
            for (size_t t = 0; t < kp; t++)
                acc += (int32_t)a[(size_t)i * lda + t] * (int32_t)bp[(t / 4) * QKV_I8_NR * 4 + (size_t)j * 4 + t % 4];
            float v = (float)(acc - 128 * wsum[j]) * sa[i];
            for (int o = 0; o < nout[i]; o++) {
                size_t col = (size_t)oidx[i * QKV_I8_MAX_OUT + o];
                v = v + oval[i * QKV_I8_MAX_OUT + o] * (float)bp[(col / 4) * QKV_I8_NR * 4 + (size_t)j * 4 + col % 4];
            }
            v = v * sw[j];
            c[(size_t)i * ldc + (size_t)j] = bias ? v + bias[j] : v;
        }
}

void qkv_i8_init_generic(qkv_i8_kernels *k) { *k = (qkv_i8_kernels){"generic", 0, 4, quant_row_generic, tile_generic, NULL, NULL, NULL}; }
