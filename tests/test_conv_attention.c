/* A convolution as multi-head self-attention (Cordonnier, Loukas & Jaggi,
 * ICLR 2020): the direct convolution's known answers, then the attention
 * layer's output against it: the error falls as alpha grows, and reaches
 * float32 rounding for large alpha, for K in {1, 3, 5}, several channel
 * counts and image sizes (including images smaller than the kernel, where
 * most keys are padding), with and without bias. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

static void test_direct_known(void) {
    /* 1 channel 2x3 image, all-ones 3x3 kernel: each output is the sum of
     * the in-image neighbours (zero padding). */
    const float x[6] = {1, 2, 3, 4, 5, 6};
    float w[9], y[6];
    for (int i = 0; i < 9; i++) w[i] = 1.0f;
    CHECK_STATUS(qkv_conv2d_forward(1, 2, 3, x, 1, 3, w, NULL, y), QKV_OK);
    const float want[6] = {12, 21, 16, 12, 21, 16};
    CHECK(memcmp(y, want, sizeof want) == 0, "ones kernel: %g %g %g %g %g %g", y[0], y[1], y[2], y[3], y[4], y[5]);
    /* Cross-correlation orientation: w[.., a, b] reads x[i + a - 1, j + b - 1];
     * a kernel with a single 1 at (0, 2) reads the pixel up-right. */
    memset(w, 0, sizeof w);
    w[2] = 1.0f;
    const float bias = 0.5f;
    CHECK_STATUS(qkv_conv2d_forward(1, 2, 3, x, 1, 3, w, &bias, y), QKV_OK);
    const float want2[6] = {0.5f, 0.5f, 0.5f, 2.5f, 3.5f, 0.5f};
    CHECK(memcmp(y, want2, sizeof want2) == 0, "shift kernel: %g %g %g %g %g %g", y[0], y[1], y[2], y[3], y[4],
          y[5]);
    /* Two input channels, two outputs, K = 1: a channel mix. */
    const float x2[4] = {1, 2, 10, 20}; /* [2, 1, 2] */
    const float w2[4] = {1, 1, 2, -1};  /* [2, 2, 1, 1] */
    float y2[4];
    CHECK_STATUS(qkv_conv2d_forward(2, 1, 2, x2, 2, 1, w2, NULL, y2), QKV_OK);
    CHECK(y2[0] == 11 && y2[1] == 22 && y2[2] == -8 && y2[3] == -16, "1x1 mix %g %g %g %g", y2[0], y2[1], y2[2],
          y2[3]);
    /* Errors. */
    CHECK_STATUS(qkv_conv2d_forward(1, 2, 3, x, 1, 2, w, NULL, y), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_conv2d_forward(0, 2, 3, x, 1, 3, w, NULL, y), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_conv2d_forward(1, 2, 3, NULL, 1, 3, w, NULL, y), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_conv2d_forward(1, INT64_MAX / 2, 3, x, 1, 3, w, NULL, y), QKV_ERR_SIZE_OVERFLOW);
    CHECK_STATUS(qkv_conv2d_as_attention(1, 2, 3, x, 1, 3, w, NULL, 0.0, y), QKV_ERR_BAD_PARAMETER);
    CHECK_STATUS(qkv_conv2d_as_attention(1, 2, 3, x, 1, 3, w, NULL, INFINITY, y), QKV_ERR_BAD_PARAMETER);
    CHECK_STATUS(qkv_conv2d_as_attention(1, 2, 3, x, 1, 3, w, NULL, NAN, y), QKV_ERR_BAD_PARAMETER);
    CHECK_STATUS(qkv_conv2d_as_attention(1, 2, 3, x, 1, 4, w, NULL, 1.0, y), QKV_ERR_BAD_SIZE);
}

/* max |attention - conv| / max |conv| at alpha. */
static double rel_error(int64_t ci, int64_t H, int64_t W, int64_t co, int64_t K, const float *x, const float *w,
                        const float *b, double alpha, double *abs_err) {
    size_t ny = (size_t)(co * H * W);
    float *y = malloc(ny * 4), *ya = tu_guarded_alloc(ny * 4);
    qkv_conv2d_forward(ci, H, W, x, co, K, w, b, y);
    qkv_status s = qkv_conv2d_as_attention(ci, H, W, x, co, K, w, b, alpha, ya);
    CHECK(s == QKV_OK, "as_attention: %s", qkv_status_string(s));
    CHECK(tu_guarded_ok(ya), "guard");
    double e = 0, m = 0;
    for (size_t i = 0; i < ny; i++) {
        e = fmax(e, fabs((double)ya[i] - y[i]));
        m = fmax(m, fabs(y[i]));
        if (isnan(ya[i])) e = INFINITY;
    }
    free(y);
    tu_guarded_free(ya);
    *abs_err = e;
    return e / (m > 0 ? m : 1);
}

static void test_attention_matches(void) {
    tu_rng r;
    tu_rng_seed(&r, 2020);
    static const int64_t cases[][5] = {
        /* C_in, H, W, C_out, K */
        {1, 1, 1, 1, 1}, {3, 4, 5, 2, 1}, {1, 5, 4, 1, 3}, {2, 6, 7, 3, 3}, {4, 8, 8, 4, 3},
        {3, 2, 2, 2, 3}, {2, 7, 5, 2, 5}, {1, 3, 3, 2, 5}, {5, 9, 6, 3, 5}, {2, 1, 9, 1, 5},
    };
    static const double alphas[] = {0.5, 1, 2, 4, 8, 16, 32, 1e3, 1e6};
    const size_t na = sizeof alphas / sizeof alphas[0];
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t ci = cases[c][0], H = cases[c][1], W = cases[c][2], co = cases[c][3], K = cases[c][4];
        size_t nx = (size_t)(ci * H * W), nw = (size_t)(co * ci * K * K);
        float *x = malloc(nx * 4), *w = malloc(nw * 4), *b = malloc((size_t)co * 4);
        tu_fill_normal_f32(&r, x, nx, 1.0);
        tu_fill_normal_f32(&r, w, nw, 1.0);
        tu_fill_normal_f32(&r, b, (size_t)co, 1.0);
        double prev = INFINITY, e_abs, e[16];
        int monotone = 1;
        for (size_t a = 0; a < na; a++) {
            e[a] = rel_error(ci, H, W, co, K, x, w, (c % 2) ? b : NULL, alphas[a], &e_abs);
            /* Falls with alpha until it reaches rounding (then it may wobble). */
            if (e[a] > prev * 1.0001 && e[a] > 1e-6) monotone = 0;
            prev = e[a];
        }
        CHECK(monotone, "case %zu: error not falling with alpha", c);
        /* Large alpha: every head's softmax is exactly one-hot (exp underflows
         * to 0 for the others), so what is left is the float32 output
         * projection's rounding: a few ulps of the sum's terms. */
        CHECK(e[na - 2] < 1e-6 && e[na - 1] < 1e-6, "case %zu (C_in %lld, %lldx%lld, C_out %lld, K %lld): "
              "error at alpha 1e3 %g, 1e6 %g", c, (long long)ci, (long long)H, (long long)W, (long long)co,
              (long long)K, e[na - 2], e[na - 1]);
        /* K = 1 with one pixel: the single head has a single key: exact for any alpha. */
        if (K > 1 && H * W > 1) CHECK(e[0] > 1e-3, "case %zu: alpha 0.5 should be far from the conv (%g)", c, e[0]);
        free(x), free(w), free(b);
    }
}

/* Against an independent oracle: numpy's cross-correlation with zero
 * padding (tests/data/image/conv, made alongside the fixtures). */
static void test_numpy_oracle(void) {
    const char *src = getenv("QKV_SOURCE_DIR");
    char p[1024];
    qkv_array w, x, b, yr;
    snprintf(p, sizeof p, "%s/tests/data/image/conv/w3.npy", src ? src : ".");
    CHECK_STATUS(qkv_npy_load(p, &w, NULL, 0), QKV_OK);
    snprintf(p, sizeof p, "%s/tests/data/image/conv/x3.npy", src ? src : ".");
    CHECK_STATUS(qkv_npy_load(p, &x, NULL, 0), QKV_OK);
    snprintf(p, sizeof p, "%s/tests/data/image/conv/b4.npy", src ? src : ".");
    CHECK_STATUS(qkv_npy_load(p, &b, NULL, 0), QKV_OK);
    snprintf(p, sizeof p, "%s/tests/data/image/conv/y3_ref.npy", src ? src : ".");
    CHECK_STATUS(qkv_npy_load(p, &yr, NULL, 0), QKV_OK);
    if (w.data && x.data && b.data && yr.data) {
        float y[4 * 10 * 12], ya[4 * 10 * 12];
        CHECK_STATUS(qkv_conv2d_forward(3, 10, 12, x.data, 4, 3, w.data, b.data, y), QKV_OK);
        CHECK_STATUS(qkv_conv2d_as_attention(3, 10, 12, x.data, 4, 3, w.data, b.data, 100.0, ya), QKV_OK);
        double e = 0, ea = 0;
        const float *ref = yr.data;
        for (int i = 0; i < 480; i++) {
            e = fmax(e, fabs(y[i] - ref[i]));
            ea = fmax(ea, fabs(ya[i] - ref[i]));
        }
        CHECK(e < 1e-5 && ea < 1e-5, "vs numpy: direct %g, attention %g", e, ea);
    }
    qkv_array_free(&w), qkv_array_free(&x), qkv_array_free(&b), qkv_array_free(&yr);
}

int main(void) {
    test_direct_known();
    test_numpy_oracle();
    test_attention_matches();
    return tu_finish();
}
