/* qkv_attention_rows: any block of rows of A' equals the same rows of the
 * forward's full matrix, for every mask, GQA and n_q != n_k, in F32 and F64,
 * with guard bytes around the block; and its errors. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

enum { B = 2, NQ = 37, NK = 41, H = 4, HK = 2, D = 5, DV = 7 };

static void check(qkv_dtype dt, qkv_mask mask, qkv_norm norm) {
    tu_rng r;
    tu_rng_seed(&r, 12);
    size_t es = dt == QKV_F64 ? 8 : 4;
    size_t nq = B * NQ * H * D, nk = B * NK * HK * D, nv = B * NK * HK * DV, na = (size_t)B * H * NQ * NK;
    double *qd = malloc(nq * 8), *kd = malloc(nk * 8), *vd = malloc(nv * 8);
    tu_fill_normal_f64(&r, qd, nq, 1.0);
    tu_fill_normal_f64(&r, kd, nk, 1.0);
    tu_fill_normal_f64(&r, vd, nv, 1.0);
    void *q = malloc(nq * es), *k = malloc(nk * es), *v = malloc(nv * es), *o = malloc((size_t)B * NQ * H * DV * es);
    void *full = malloc(na * es);
    for (size_t i = 0; i < nq; i++) dt == QKV_F64 ? (void)(((double *)q)[i] = qd[i]) : (void)(((float *)q)[i] = (float)qd[i]);
    for (size_t i = 0; i < nk; i++) dt == QKV_F64 ? (void)(((double *)k)[i] = kd[i]) : (void)(((float *)k)[i] = (float)kd[i]);
    for (size_t i = 0; i < nv; i++) dt == QKV_F64 ? (void)(((double *)v)[i] = vd[i]) : (void)(((float *)v)[i] = (float)vd[i]);
    qkv_attn_desc d;
    qkv_attn_desc_init(&d);
    d.dtype = dt;
    d.batch = B;
    d.n_q = NQ;
    d.n_k = NK;
    d.heads = H;
    d.heads_kv = HK;
    d.dim = D;
    d.dim_v = DV;
    d.mask = mask;
    d.norm = norm;
    d.window_left = 3;
    d.window_right = mask == QKV_MASK_WINDOW ? 2 : 0;
    CHECK_STATUS(qkv_attention_forward(&d, q, k, v, o, full, NULL), QKV_OK);
    const int64_t blocks[][2] = {{0, 1}, {0, NQ}, {5, 7}, {NQ - 3, 3}, {16, 16}};
    for (size_t t = 0; t < sizeof blocks / sizeof blocks[0]; t++) {
        int64_t r0 = blocks[t][0], rows = blocks[t][1];
        size_t n = (size_t)B * H * rows * NK;
        void *got = tu_guarded_alloc(n * es);
        CHECK_STATUS(qkv_attention_rows(&d, q, k, r0, rows, got), QKV_OK);
        double worst = 0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t i = 0; i < rows; i++)
                    for (int64_t j = 0; j < NK; j++) {
                        size_t a = (size_t)(((b * H + h) * rows + i) * NK + j);
                        size_t f = (size_t)(((b * H + h) * NQ + r0 + i) * NK + j);
                        double x = dt == QKV_F64 ? ((double *)got)[a] : ((float *)got)[a];
                        double y = dt == QKV_F64 ? ((double *)full)[f] : ((float *)full)[f];
                        worst = fmax(worst, fabs(x - y));
                    }
        /* Both round the same double-precision weights (F64: the same
         * reference; F32: the fast path's float weights, ~1e-7 each). */
        CHECK(worst <= (dt == QKV_F64 ? 1e-15 : 2e-6), "rows %lld+%lld dtype %d mask %d norm %d: %g", (long long)r0,
              (long long)rows, dt, mask, norm, worst);
        CHECK(tu_guarded_ok(got), "rows %lld+%lld: no write outside the block", (long long)r0, (long long)rows);
        tu_guarded_free(got);
    }
    float tmp[4];
    CHECK_STATUS(qkv_attention_rows(&d, q, k, NQ, 1, tmp), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_attention_rows(&d, q, k, -1, 1, tmp), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_attention_rows(&d, q, k, 0, 0, tmp), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_attention_rows(&d, q, NULL, 0, 1, tmp), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_attention_rows(NULL, q, k, 0, 1, tmp), QKV_ERR_NULL_POINTER);
    free(qd);
    free(kd);
    free(vd);
    free(q);
    free(k);
    free(v);
    free(o);
    free(full);
}

int main(void) {
    const qkv_mask masks[] = {QKV_MASK_NONE, QKV_MASK_CAUSAL, QKV_MASK_WINDOW, QKV_MASK_CAUSAL_WINDOW};
    for (int m = 0; m < 4; m++) {
        check(QKV_F64, masks[m], QKV_NORM_SOFTMAX);
        check(QKV_F32, masks[m], QKV_NORM_SOFTMAX);
    }
    check(QKV_F32, QKV_MASK_CAUSAL, QKV_NORM_SIGMOID);
    check(QKV_F64, QKV_MASK_NONE, QKV_NORM_RELU);
    return tu_finish();
}
