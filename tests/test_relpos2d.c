/* 2-D relative positions for self-attention over an image: the in-kernel
 * bias table indexed by the clipped offset (dy, dx) equals the same biases
 * materialised as a [H, n, n] matrix, forward and backward (the table's
 * gradient is the bias gradient summed per offset), F64 and F32; known
 * buckets; validation. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

enum { IH = 5, IW = 6, N = IH * IW, H = 2, D = 4, M = 2, SIDE = 2 * M + 1, NB = SIDE * SIDE };

static int64_t bucket(int64_t i, int64_t j) {
    int64_t dy = j / IW - i / IW, dx = j % IW - i % IW;
    dy = dy < -M ? -M : (dy > M ? M : dy);
    dx = dx < -M ? -M : (dx > M ? M : dx);
    return (dy + M) * SIDE + dx + M;
}

static void run(qkv_dtype dt, qkv_mask mask) {
    tu_rng r;
    tu_rng_seed(&r, 31);
    static double q[N * H * D], k[N * H * D], v[N * H * D], dout[N * H * D], table[H * NB], bias[H * N * N];
    tu_fill_normal_f64(&r, q, N * H * D, 1.0);
    tu_fill_normal_f64(&r, k, N * H * D, 1.0);
    tu_fill_normal_f64(&r, v, N * H * D, 1.0);
    tu_fill_normal_f64(&r, dout, N * H * D, 1.0);
    tu_fill_normal_f64(&r, table, H * NB, 1.0);
    for (int h = 0; h < H; h++)
        for (int i = 0; i < N; i++)
            for (int j = 0; j < N; j++) bias[(h * N + i) * N + j] = table[h * NB + bucket(i, j)];
    qkv_attn_desc d;
    qkv_attn_desc_init(&d);
    d.dtype = QKV_F64;
    d.batch = 1;
    d.n_q = d.n_k = N;
    d.heads = H;
    d.dim = D;
    d.mask = mask;
    d.window_left = d.window_right = 7;
    /* Oracle: the materialised bias through the reference. */
    static double o_w[N * H * D], dq_w[N * H * D], dk_w[N * H * D], dv_w[N * H * D], db[H * N * N], dt_w[H * NB];
    qkv_attn_desc m = d;
    m.impl = QKV_IMPL_REFERENCE;
    m.bias_kind = QKV_BIAS_PER_HEAD;
    m.bias = bias;
    CHECK_STATUS(qkv_attention_forward(&m, q, k, v, o_w, NULL, NULL), QKV_OK);
    qkv_attn_grads gw = {.dq = dq_w, .dk = dk_w, .dv = dv_w, .dbias = db};
    CHECK_STATUS(qkv_attention_backward(&m, q, k, v, NULL, NULL, dout, &gw), QKV_OK);
    memset(dt_w, 0, sizeof dt_w);
    for (int h = 0; h < H; h++)
        for (int i = 0; i < N; i++)
            for (int j = 0; j < N; j++) dt_w[h * NB + bucket(i, j)] += db[(h * N + i) * N + j];
    /* In-kernel 2-D table. */
    d.dtype = dt;
    d.rel2d_width = IW;
    d.rel_max_distance = M;
    d.rel_buckets = NB;
    static float qf[N * H * D], kf[N * H * D], vf[N * H * D], df[N * H * D], tf[H * NB], of[N * H * D];
    static float dqf[N * H * D], dkf[N * H * D], dvf[N * H * D], dtf[H * NB];
    static double o[N * H * D], dq[N * H * D], dk[N * H * D], dv[N * H * D], dtab[H * NB];
    int f64 = dt == QKV_F64;
    if (f64) {
        d.rel_table = table;
        qkv_attn_grads g = {.dq = dq, .dk = dk, .dv = dv, .d_rel_table = dtab};
        CHECK_STATUS(qkv_attention_forward(&d, q, k, v, o, NULL, NULL), QKV_OK);
        CHECK_STATUS(qkv_attention_backward(&d, q, k, v, NULL, NULL, dout, &g), QKV_OK);
    } else {
        for (int i = 0; i < N * H * D; i++) qf[i] = (float)q[i], kf[i] = (float)k[i], vf[i] = (float)v[i], df[i] = (float)dout[i];
        for (int i = 0; i < H * NB; i++) tf[i] = (float)table[i];
        d.rel_table = tf;
        qkv_attn_grads g = {.dq = dqf, .dk = dkf, .dv = dvf, .d_rel_table = dtf};
        CHECK_STATUS(qkv_attention_forward(&d, qf, kf, vf, of, NULL, NULL), QKV_OK);
        CHECK_STATUS(qkv_attention_backward(&d, qf, kf, vf, NULL, NULL, df, &g), QKV_OK);
        for (int i = 0; i < N * H * D; i++) o[i] = of[i], dq[i] = dqf[i], dk[i] = dkf[i], dv[i] = dvf[i];
        for (int i = 0; i < H * NB; i++) dtab[i] = dtf[i];
    }
    /* Same math in double: 1e-12; float inputs/outputs of O(1): 2e-5 (1e-4
     * for the table gradient, a sum of up to n^2 / NB terms). */
    double tol = f64 ? 1e-12 : 2e-5;
    CHECK(tu_max_abs_diff_f64(o, o_w, N * H * D) < tol, "2-D relative forward, dtype %d mask %d", dt, mask);
    CHECK(tu_max_abs_diff_f64(dq, dq_w, N * H * D) < 5 * tol, "dq, dtype %d mask %d", dt, mask);
    CHECK(tu_max_abs_diff_f64(dk, dk_w, N * H * D) < 5 * tol, "dk, dtype %d mask %d", dt, mask);
    CHECK(tu_max_abs_diff_f64(dv, dv_w, N * H * D) < 5 * tol, "dv, dtype %d mask %d", dt, mask);
    CHECK(tu_max_abs_diff_f64(dtab, dt_w, H * NB) < 5 * tol, "d_rel_table, dtype %d mask %d: %g", dt, mask,
          tu_max_abs_diff_f64(dtab, dt_w, H * NB));
}

int main(void) {
    CHECK(bucket(1 * IW + 1, 3 * IW + 0) == 4 * SIDE + 1, "pixel (1,1) to (3,0): dy = 2, dx = -1");
    CHECK(bucket(0, N - 1) == NB - 1, "far corner clips to (+m, +m)");
    run(QKV_F64, QKV_MASK_NONE);
    run(QKV_F64, QKV_MASK_WINDOW);
    run(QKV_F32, QKV_MASK_NONE);
    run(QKV_F32, QKV_MASK_CAUSAL);
    qkv_attn_desc d;
    qkv_attn_desc_init(&d);
    d.batch = 1;
    d.n_q = d.n_k = N;
    d.heads = 1;
    d.dim = 4;
    float t[NB];
    d.rel_table = t;
    d.rel2d_width = IW;
    d.rel_max_distance = M;
    d.rel_buckets = NB - 1;
    CHECK_STATUS(qkv_attn_desc_check(&d), QKV_ERR_BAD_PARAMETER);
    d.rel_buckets = NB;
    CHECK_STATUS(qkv_attn_desc_check(&d), QKV_OK);
    d.rel2d_width = -1;
    CHECK_STATUS(qkv_attn_desc_check(&d), QKV_ERR_BAD_PARAMETER);
    d.rel2d_width = IW;
    d.rel_max_distance = 0;
    d.rel_buckets = 1;
    CHECK_STATUS(qkv_attn_desc_check(&d), QKV_ERR_BAD_PARAMETER);
    d.rel_max_distance = M;
    d.rel_buckets = NB;
    int64_t off[3] = {0, 10, N};
    d.num_seqs = 2;
    d.seq_offsets_q = off;
    CHECK_STATUS(qkv_attn_desc_check(&d), QKV_ERR_UNSUPPORTED);
    return tu_finish();
}
