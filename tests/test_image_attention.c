/* 2-D attention over images: neighbourhood attention (forward, attention
 * slots, backward) against the dense core with an explicit -inf bias outside
 * each K x K window (an (HW)^2 oracle, fine at these sizes), windows larger
 * than the image equal full attention, and DETR's 2-D sinusoidal encoding. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

/* Dense oracle: bias [HW, HW] = 0 inside pixel i's window, -inf outside. */
static float *window_bias(int64_t H, int64_t W, int64_t K) {
    int64_t n = H * W, r = K / 2;
    float *b = malloc((size_t)(n * n) * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < n; j++) {
            int64_t dy = j / W - i / W, dx = j % W - i % W;
            b[i * n + j] = (llabs(dy) <= r && llabs(dx) <= r) ? 0.0f : -INFINITY;
        }
    return b;
}

static void dense_desc(qkv_attn_desc *d, int64_t n, int64_t heads, int64_t D, int64_t Dv, const float *bias) {
    qkv_attn_desc_init(d);
    d->batch = 1;
    d->n_q = d->n_k = n;
    d->heads = heads;
    d->dim = D;
    d->dim_v = Dv;
    d->impl = QKV_IMPL_REFERENCE;
    if (bias) {
        d->bias_kind = QKV_BIAS_SHARED;
        d->bias = bias;
    }
}

static void check_case(tu_rng *r, int64_t H, int64_t W, int64_t heads, int64_t D, int64_t Dv, int64_t K) {
    int64_t n = H * W, KK = K * K;
    size_t nq = (size_t)(n * heads * D), nv = (size_t)(n * heads * Dv);
    float *q = malloc(nq * 4), *k = malloc(nq * 4), *v = malloc(nv * 4), *dout = malloc(nv * 4);
    float *o = tu_guarded_alloc(nv * 4), *o_ref = malloc(nv * 4);
    float *attn = tu_guarded_alloc((size_t)(n * heads * KK) * 4), *attn_ref = malloc((size_t)(heads * n * n) * 4);
    float *dq = tu_guarded_alloc(nq * 4), *dk = tu_guarded_alloc(nq * 4), *dv = tu_guarded_alloc(nv * 4);
    float *dq_r = malloc(nq * 4), *dk_r = malloc(nq * 4), *dv_r = malloc(nv * 4);
    tu_fill_normal_f32(r, q, nq, 1.0);
    tu_fill_normal_f32(r, k, nq, 1.0);
    tu_fill_normal_f32(r, v, nv, 1.0);
    tu_fill_normal_f32(r, dout, nv, 1.0);
    float *bias = window_bias(H, W, K);
    qkv_attn_desc d;
    dense_desc(&d, n, heads, D, Dv, bias);
    CHECK_STATUS(qkv_attention_forward(&d, q, k, v, o_ref, attn_ref, NULL), QKV_OK);
    qkv_attn_grads g;
    memset(&g, 0, sizeof g);
    g.dq = dq_r;
    g.dk = dk_r;
    g.dv = dv_r;
    CHECK_STATUS(qkv_attention_backward(&d, q, k, v, NULL, NULL, dout, &g), QKV_OK);

    CHECK_STATUS(qkv_neighborhood2d_forward(H, W, heads, D, Dv, K, 0.0, 1, q, k, v, o, attn), QKV_OK);
    CHECK_STATUS(qkv_neighborhood2d_backward(H, W, heads, D, Dv, K, 0.0, 1, q, k, v, dout, dq, dk, dv), QKV_OK);
    double eo = 0, ea = 0, eq = 0, ek = 0, ev = 0;
    for (size_t i = 0; i < nv; i++) eo = fmax(eo, fabs(o[i] - o_ref[i]));
    for (size_t i = 0; i < nq; i++) eq = fmax(eq, fabs(dq[i] - dq_r[i]));
    for (size_t i = 0; i < nq; i++) ek = fmax(ek, fabs(dk[i] - dk_r[i]));
    for (size_t i = 0; i < nv; i++) ev = fmax(ev, fabs(dv[i] - dv_r[i]));
    int64_t r2 = K / 2;
    for (int64_t p = 0; p < n; p++)
        for (int64_t h = 0; h < heads; h++)
            for (int64_t a = 0; a < K; a++)
                for (int64_t b = 0; b < K; b++) {
                    int64_t y = p / W + a - r2, x = p % W + b - r2;
                    double want = (y < 0 || y >= H || x < 0 || x >= W)
                                      ? 0.0
                                      : attn_ref[(h * n + p) * n + y * W + x];
                    ea = fmax(ea, fabs(attn[(p * heads + h) * KK + a * K + b] - want));
                }
    CHECK(eo < 2e-5 && ea < 2e-6 && eq < 5e-5 && ek < 5e-5 && ev < 5e-5,
          "H %lld W %lld heads %lld D %lld Dv %lld K %lld: errors out %g attn %g dq %g dk %g dv %g",
          (long long)H, (long long)W, (long long)heads, (long long)D, (long long)Dv, (long long)K, eo, ea, eq, ek,
          ev);
    CHECK(tu_guarded_ok(o) && tu_guarded_ok(attn) && tu_guarded_ok(dq) && tu_guarded_ok(dk) && tu_guarded_ok(dv),
          "guard bytes");
    free(q), free(k), free(v), free(dout), free(o_ref), free(attn_ref), free(dq_r), free(dk_r), free(dv_r);
    free(bias);
    tu_guarded_free(o), tu_guarded_free(attn), tu_guarded_free(dq), tu_guarded_free(dk), tu_guarded_free(dv);
}

static void test_neighborhood(void) {
    tu_rng r;
    tu_rng_seed(&r, 7);
    static const int64_t cases[][6] = {
        /* H, W, heads, D, Dv, K */
        {1, 1, 1, 1, 1, 1},  {4, 5, 1, 3, 2, 1},  {4, 5, 2, 4, 3, 3},  {7, 6, 1, 8, 8, 5},
        {3, 9, 3, 2, 5, 3},  {5, 5, 1, 4, 4, 11}, {17, 19, 2, 4, 4, 3}, {9, 30, 1, 5, 3, 7},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check_case(&r, cases[i][0], cases[i][1], cases[i][2], cases[i][3], cases[i][4], cases[i][5]);

    /* A window covering the whole image is full attention (no bias). */
    int64_t H = 6, W = 7, n = H * W, D = 4;
    float *q = malloc((size_t)(n * D) * 4), *k = malloc((size_t)(n * D) * 4), *v = malloc((size_t)(n * D) * 4);
    float *o = malloc((size_t)(n * D) * 4), *o2 = malloc((size_t)(n * D) * 4);
    tu_fill_normal_f32(&r, q, (size_t)(n * D), 1.0);
    tu_fill_normal_f32(&r, k, (size_t)(n * D), 1.0);
    tu_fill_normal_f32(&r, v, (size_t)(n * D), 1.0);
    qkv_attn_desc d;
    dense_desc(&d, n, 1, D, D, NULL);
    CHECK_STATUS(qkv_attention_forward(&d, q, k, v, o, NULL, NULL), QKV_OK);
    CHECK_STATUS(qkv_neighborhood2d_forward(H, W, 1, D, D, 13, 0.0, 0, q, k, v, o2, NULL), QKV_OK);
    double e = 0;
    for (int64_t i = 0; i < n * D; i++) e = fmax(e, fabs(o[i] - o2[i]));
    CHECK(e < 2e-5, "window >= image vs full attention: %g", e);

    /* Errors. */
    CHECK_STATUS(qkv_neighborhood2d_forward(H, W, 1, D, D, 4, 0.0, 0, q, k, v, o2, NULL), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_neighborhood2d_forward(0, W, 1, D, D, 3, 0.0, 0, q, k, v, o2, NULL), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_neighborhood2d_forward(H, W, 1, D, D, 3, NAN, 0, q, k, v, o2, NULL), QKV_ERR_BAD_PARAMETER);
    CHECK_STATUS(qkv_neighborhood2d_forward(H, W, 1, D, D, 3, 0.0, 0, q, NULL, v, o2, NULL), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_neighborhood2d_forward(INT64_MAX / 4, 8, 1, D, D, 3, 0.0, 0, q, k, v, o2, NULL),
                 QKV_ERR_SIZE_OVERFLOW);
    CHECK_STATUS(qkv_neighborhood2d_backward(H, W, 1, D, D, 3, 0.0, 0, q, k, v, o, NULL, o2, o2),
                 QKV_ERR_NULL_POINTER);
    free(q), free(k), free(v), free(o), free(o2);
}

static void test_posenc2d(void) {
    int64_t H = 3, W = 4, D = 8;
    float *p = tu_guarded_alloc((size_t)(H * W * D) * 4);
    CHECK_STATUS(qkv_posenc_sinusoidal2d(H, W, D, 0, p), QKV_OK);
    /* Pixel (y=2, x=1): y half uses pos 3, x half pos 2; freq 10000^(-t/4). */
    const float *e = p + (2 * W + 1) * D;
    double want[8] = {sin(3.0), cos(3.0), sin(3.0 / 100.0), cos(3.0 / 100.0),
                      sin(2.0), cos(2.0), sin(2.0 / 100.0), cos(2.0 / 100.0)};
    double err = 0;
    for (int i = 0; i < 8; i++) err = fmax(err, fabs(e[i] - want[i]));
    CHECK(err < 1e-6, "posenc2d known values: %g", err);
    CHECK_STATUS(qkv_posenc_sinusoidal2d(H, W, D, 1, p), QKV_OK);
    e = p + (2 * W + 3) * D; /* last row and column: normalised to 2 pi (1 - tiny) */
    CHECK(fabs(e[0] - sin(6.283185307179586 * 3 / (3 + 1e-6))) < 1e-6 && fabs(e[4] - sin(6.283185307179586 * 4 / (4 + 1e-6))) < 1e-6,
          "normalised %g %g", e[0], e[4]);
    CHECK(tu_guarded_ok(p), "guard");
    CHECK_STATUS(qkv_posenc_sinusoidal2d(H, W, 6, 0, p), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_posenc_sinusoidal2d(0, W, 8, 0, p), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_posenc_sinusoidal2d(H, W, 8, 0, NULL), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_posenc_sinusoidal2d(INT64_MAX / 2, 4, 8, 0, p), QKV_ERR_SIZE_OVERFLOW);
    tu_guarded_free(p);
}

int main(void) {
    test_neighborhood();
    test_posenc2d();
    return tu_finish();
}
