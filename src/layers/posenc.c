/* Positional encodings that live outside the attention kernel: sinusoidal
 * (Vaswani et al. 2017), learned absolute, and rotary (Su et al. 2021).
 * ALiBi and T5 relative biases are computed inside the core (core/plan.c). */
#include <math.h>

#include "core/internal.h"

qkv_status qkv_posenc_sinusoidal(int64_t n, int64_t embed_dim, int64_t offset, float *out) {
    if (!out) return QKV_ERR_NULL_POINTER;
    if (n <= 0 || embed_dim <= 0 || offset < 0) return QKV_ERR_BAD_SIZE;
    int64_t f[2] = {n, embed_dim}, c;
    if (!qkv_count_ok(&c, sizeof(float), 2, f) || offset > INT64_MAX - n) return QKV_ERR_SIZE_OVERFLOW;
    for (int64_t i = 0; i < n; i++) {
        /* Angles in double: position 10^6 still has ~1e-10 absolute error,
         * so no table and no length limit is needed. */
        double pos = (double)(offset + i);
        for (int64_t t = 0; t < embed_dim; t += 2) {
            double w = pos * exp(-log(10000.0) * (double)t / (double)embed_dim);
            out[i * embed_dim + t] = (float)sin(w);
            if (t + 1 < embed_dim) out[i * embed_dim + t + 1] = (float)cos(w);
        }
    }
    return QKV_OK;
}

qkv_status qkv_rope_apply(float *x, int64_t batch, int64_t n, int64_t heads, int64_t dim,
                          int64_t offset, double base, int inverse) {
    if (!x) return QKV_ERR_NULL_POINTER;
    if (batch <= 0 || n <= 0 || heads <= 0 || dim <= 0 || dim % 2 != 0 || offset < 0)
        return QKV_ERR_BAD_SIZE;
    if (!(isfinite(base) && base > 1.0)) return QKV_ERR_BAD_PARAMETER;
    int64_t f[4] = {batch, n, heads, dim}, c;
    if (!qkv_count_ok(&c, sizeof(float), 4, f) || offset > INT64_MAX - n) return QKV_ERR_SIZE_OVERFLOW;
    const int64_t half = dim / 2;
    const double sign = inverse ? -1.0 : 1.0;
    for (int64_t i = 0; i < n; i++) {
        double pos = (double)(offset + i);
        for (int64_t t = 0; t < half; t++) {
            double a = sign * pos * pow(base, -2.0 * (double)t / (double)dim);
            double cs = cos(a), sn = sin(a);
            for (int64_t b = 0; b < batch; b++)
                for (int64_t h = 0; h < heads; h++) {
                    float *row = x + ((b * n + i) * heads + h) * dim;
                    double x0 = row[t], x1 = row[t + half];
                    row[t] = (float)(x0 * cs - x1 * sn);
                    row[t + half] = (float)(x0 * sn + x1 * cs);
                }
        }
    }
    return QKV_OK;
}

static qkv_status learned_check(const void *table, const void *x, int64_t max_len, int64_t embed_dim,
                                int64_t batch, int64_t n, int64_t offset) {
    if (!table || !x) return QKV_ERR_NULL_POINTER;
    if (max_len <= 0 || embed_dim <= 0 || batch <= 0 || n <= 0 || offset < 0) return QKV_ERR_BAD_SIZE;
    int64_t f[3] = {batch, n, embed_dim}, g[2] = {max_len, embed_dim}, c;
    if (!qkv_count_ok(&c, sizeof(float), 3, f) || !qkv_count_ok(&c, sizeof(float), 2, g))
        return QKV_ERR_SIZE_OVERFLOW;
    if (offset > max_len - n) return QKV_ERR_POSITION;
    return QKV_OK;
}

qkv_status qkv_posenc_learned_forward(const float *table, int64_t max_len, int64_t embed_dim,
                                      int64_t batch, int64_t n, int64_t offset, float *x) {
    qkv_status s = learned_check(table, x, max_len, embed_dim, batch, n, offset);
    if (s != QKV_OK) return s;
    for (int64_t b = 0; b < batch; b++)
        for (int64_t i = 0; i < n; i++)
            for (int64_t t = 0; t < embed_dim; t++)
                x[(b * n + i) * embed_dim + t] += table[(offset + i) * embed_dim + t];
    return QKV_OK;
}

qkv_status qkv_posenc_learned_backward(float *dtable, int64_t max_len, int64_t embed_dim,
                                       int64_t batch, int64_t n, int64_t offset, const float *dx) {
    qkv_status s = learned_check(dtable, dx, max_len, embed_dim, batch, n, offset);
    if (s != QKV_OK) return s;
    /* Batch in a fixed order: the same sum for any caller. */
    for (int64_t b = 0; b < batch; b++)
        for (int64_t i = 0; i < n; i++)
            for (int64_t t = 0; t < embed_dim; t++)
                dtable[(offset + i) * embed_dim + t] += dx[(b * n + i) * embed_dim + t];
    return QKV_OK;
}
