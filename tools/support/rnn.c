/* Recurrent layers of the complexity comparison (Vaswani et al. 2017,
 * Table 1): an Elman RNN and an LSTM, forward and backpropagation through
 * time, over one sequence [n, d].
 *
 * The input projections of all steps are one matrix product (parallel over
 * time); the recurrence is n dependent steps of a d x d matrix-vector
 * product: O(n d^2) work and O(n) sequential operations, which is exactly
 * what the table contrasts with self-attention's O(1). */
#include <math.h>
#include <string.h>

#include "core/internal.h"
#include "support/baselines.h"

static qkv_status rnn_check(int64_t n, int64_t d_in, int64_t d, int64_t gates) {
    if (n <= 0 || d_in <= 0 || d <= 0) return QKV_ERR_BAD_SIZE;
    int64_t a, b, c;
    if (!qkv_mul_ok(n, d * gates, &a) || !qkv_mul_ok(d * gates, d_in > d ? d_in : d, &b) ||
        !qkv_mul_ok(n, d_in, &c) || (uint64_t)a > SIZE_MAX / sizeof(float) / 2 ||
        (uint64_t)b > SIZE_MAX / sizeof(float) || d > INT64_MAX / 8)
        return QKV_ERR_SIZE_OVERFLOW;
    return QKV_OK;
}

/* y[0..m) += W[m, k] x[k]  (row-major W) */
static void matvec_add(int64_t m, int64_t k, const float *W, const float *x, float *y) {
    for (int64_t i = 0; i < m; i++) {
        const float *w = W + i * k;
        float acc = 0.0f;
        for (int64_t j = 0; j < k; j++) acc += w[j] * x[j];
        y[i] += acc;
    }
}

/* y[0..k) += W[m, k]ᵀ x[m] */
static void matvec_t_add(int64_t m, int64_t k, const float *W, const float *x, float *y) {
    for (int64_t i = 0; i < m; i++) {
        const float *w = W + i * k;
        const float xi = x[i];
        for (int64_t j = 0; j < k; j++) y[j] += w[j] * xi;
    }
}

qkv_status qkv_rnn_forward(int64_t n, int64_t d_in, int64_t d, const float *w_x, const float *w_h,
                           const float *b, const float *x, float *h) {
    if (!w_x || !w_h || !x || !h) return QKV_ERR_NULL_POINTER;
    qkv_status s = rnn_check(n, d_in, d, 1);
    if (s != QKV_OK) return s;
    /* h <- X W_xᵀ (all steps at once), then the recurrence in place. */
    s = qkv_sgemm(0, 1, n, d, d_in, 1.0f, x, d_in, w_x, d_in, 0.0f, h, d, 0);
    if (s != QKV_OK) return s;
    for (int64_t t = 0; t < n; t++) {
        float *ht = h + t * d;
        if (b)
            for (int64_t i = 0; i < d; i++) ht[i] += b[i];
        if (t > 0) matvec_add(d, d, w_h, h + (t - 1) * d, ht);
        for (int64_t i = 0; i < d; i++) ht[i] = tanhf(ht[i]);
    }
    return QKV_OK;
}

qkv_status qkv_rnn_backward(int64_t n, int64_t d_in, int64_t d, const float *w_x, const float *w_h,
                            const float *x, const float *h, const float *dh, float *dx, float *dw_x,
                            float *dw_h, float *db) {
    if (!w_x || !w_h || !x || !h || !dh || !dw_x || !dw_h) return QKV_ERR_NULL_POINTER;
    qkv_status s = rnn_check(n, d_in, d, 1);
    if (s != QKV_OK) return s;
    float *da = qkv_alloc((size_t)(n * d) * sizeof(float));
    float *carry = qkv_alloc_zeroed((size_t)d * sizeof(float));
    if (!da || !carry) {
        qkv_free(da);
        qkv_free(carry);
        return QKV_ERR_OUT_OF_MEMORY;
    }
    /* Backwards in time: dL/dh_t = dh[t] + W_hᵀ da_{t+1}; da_t = that * (1 - h_t^2). */
    for (int64_t t = n - 1; t >= 0; t--) {
        float *a = da + t * d;
        const float *ht = h + t * d;
        for (int64_t i = 0; i < d; i++) a[i] = (dh[t * d + i] + carry[i]) * (1.0f - ht[i] * ht[i]);
        memset(carry, 0, (size_t)d * sizeof(float));
        if (t > 0) {
            matvec_t_add(d, d, w_h, a, carry);
            /* dW_h += da_t h_{t-1}ᵀ */
            const float *hp = h + (t - 1) * d;
            for (int64_t i = 0; i < d; i++)
                for (int64_t j = 0; j < d; j++) dw_h[i * d + j] += a[i] * hp[j];
        }
    }
    /* The input side, all steps at once: dW_x += dAᵀ X, dX = dA W_x. */
    s = qkv_sgemm(1, 0, d, d_in, n, 1.0f, da, d, x, d_in, 1.0f, dw_x, d_in, 0);
    if (s == QKV_OK && dx) s = qkv_sgemm(0, 0, n, d_in, d, 1.0f, da, d, w_x, d_in, 0.0f, dx, d_in, 0);
    if (s == QKV_OK && db)
        for (int64_t i = 0; i < d; i++) {
            double acc = 0.0;
            for (int64_t t = 0; t < n; t++) acc += da[t * d + i];
            db[i] += (float)acc;
        }
    qkv_free(da);
    qkv_free(carry);
    return s;
}

static float sigm(float z) { return 1.0f / (1.0f + expf(-z)); }

/* cache row t: [i, f, g, o, c, tanh(c)], each d. */
qkv_status qkv_lstm_forward(int64_t n, int64_t d_in, int64_t d, const float *w_x, const float *w_h,
                            const float *b, const float *x, float *h, float *cache) {
    if (!w_x || !w_h || !x || !h || !cache) return QKV_ERR_NULL_POINTER;
    qkv_status s = rnn_check(n, d_in, d, 6);
    if (s != QKV_OK) return s;
    float *z = qkv_alloc((size_t)(n * 4 * d) * sizeof(float));
    if (!z) return QKV_ERR_OUT_OF_MEMORY;
    s = qkv_sgemm(0, 1, n, 4 * d, d_in, 1.0f, x, d_in, w_x, d_in, 0.0f, z, 4 * d, 0);
    if (s != QKV_OK) {
        qkv_free(z);
        return s;
    }
    for (int64_t t = 0; t < n; t++) {
        float *zt = z + t * 4 * d, *ct = cache + t * 6 * d;
        if (b)
            for (int64_t i = 0; i < 4 * d; i++) zt[i] += b[i];
        if (t > 0) matvec_add(4 * d, d, w_h, h + (t - 1) * d, zt);
        for (int64_t i = 0; i < d; i++) {
            float ig = sigm(zt[i]), fg = sigm(zt[d + i]), gg = tanhf(zt[2 * d + i]), og = sigm(zt[3 * d + i]);
            float cprev = t > 0 ? cache[(t - 1) * 6 * d + 4 * d + i] : 0.0f;
            float c = fg * cprev + ig * gg, tc = tanhf(c);
            ct[i] = ig;
            ct[d + i] = fg;
            ct[2 * d + i] = gg;
            ct[3 * d + i] = og;
            ct[4 * d + i] = c;
            ct[5 * d + i] = tc;
            h[t * d + i] = og * tc;
        }
    }
    qkv_free(z);
    return QKV_OK;
}

qkv_status qkv_lstm_backward(int64_t n, int64_t d_in, int64_t d, const float *w_x, const float *w_h,
                             const float *x, const float *h, const float *cache, const float *dh,
                             float *dx, float *dw_x, float *dw_h, float *db) {
    if (!w_x || !w_h || !x || !h || !cache || !dh || !dw_x || !dw_h) return QKV_ERR_NULL_POINTER;
    qkv_status s = rnn_check(n, d_in, d, 6);
    if (s != QKV_OK) return s;
    float *dz = qkv_alloc((size_t)(n * 4 * d) * sizeof(float));
    float *carry_h = qkv_alloc_zeroed((size_t)d * sizeof(float));
    float *carry_c = qkv_alloc_zeroed((size_t)d * sizeof(float));
    if (!dz || !carry_h || !carry_c) {
        s = QKV_ERR_OUT_OF_MEMORY;
        goto done;
    }
    for (int64_t t = n - 1; t >= 0; t--) {
        const float *ct = cache + t * 6 * d;
        float *z = dz + t * 4 * d;
        for (int64_t i = 0; i < d; i++) {
            float ig = ct[i], fg = ct[d + i], gg = ct[2 * d + i], og = ct[3 * d + i], tc = ct[5 * d + i];
            float cprev = t > 0 ? cache[(t - 1) * 6 * d + 4 * d + i] : 0.0f;
            float dht = dh[t * d + i] + carry_h[i];
            float dc = dht * og * (1.0f - tc * tc) + carry_c[i];
            float dog = dht * tc, dig = dc * gg, dgg = dc * ig, dfg = dc * cprev;
            z[i] = dig * ig * (1.0f - ig);
            z[d + i] = dfg * fg * (1.0f - fg);
            z[2 * d + i] = dgg * (1.0f - gg * gg);
            z[3 * d + i] = dog * og * (1.0f - og);
            carry_c[i] = dc * fg; /* dL/dc_{t-1} through c_t = f c_{t-1} + ... */
        }
        memset(carry_h, 0, (size_t)d * sizeof(float));
        if (t > 0) {
            matvec_t_add(4 * d, d, w_h, z, carry_h);
            const float *hp = h + (t - 1) * d;
            for (int64_t i = 0; i < 4 * d; i++)
                for (int64_t j = 0; j < d; j++) dw_h[i * d + j] += z[i] * hp[j];
        }
    }
    s = qkv_sgemm(1, 0, 4 * d, d_in, n, 1.0f, dz, 4 * d, x, d_in, 1.0f, dw_x, d_in, 0);
    if (s == QKV_OK && dx) s = qkv_sgemm(0, 0, n, d_in, 4 * d, 1.0f, dz, 4 * d, w_x, d_in, 0.0f, dx, d_in, 0);
    if (s == QKV_OK && db)
        for (int64_t i = 0; i < 4 * d; i++) {
            double acc = 0.0;
            for (int64_t t = 0; t < n; t++) acc += dz[t * 4 * d + i];
            db[i] += (float)acc;
        }
done:
    qkv_free(dz);
    qkv_free(carry_h);
    qkv_free(carry_c);
    return s;
}
