/* The int8 linear layer (gemm/i8.h) on awkward shapes: against the float
 * product of the same x and W within the quantisation's bound, against a
 * double product of the dequantised operands to float rounding, the same
 * bits for 1, 2, 3 threads and for every kernel table, and bad arguments.
 *
 * The bound for one output: with s_x = max |x_r| / 127 and s_w = max |W_j|
 * / 127, |x_t - x'_t| <= s_x / 2 and |w_t - w'_t| <= s_w / 2, so |y - y'|
 * <= sum_t (|x_t| s_w / 2 + |w_t| s_x / 2 + s_x s_w / 4), plus float
 * rounding of the dequantisation (a few units of |y'|). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu.h"
#include "gemm/i8.h"
#include "kernels/kernels.h"
#include "test_util.h"

static tu_rng g_rng;

static void check_shape(int64_t rows, int64_t n, int64_t k) {
    int64_t ldx = k + (k % 3), ldy = n + 1;
    float *x = malloc((size_t)(rows * ldx) * sizeof *x), *w = malloc((size_t)(n * k) * sizeof *w);
    float *b = malloc((size_t)n * sizeof *b), *y = malloc((size_t)(rows * ldy) * sizeof *y);
    float *y2 = malloc((size_t)(rows * ldy) * sizeof *y2);
    tu_fill_normal_f32(&g_rng, x, (size_t)(rows * ldx), 1.0);
    tu_fill_normal_f32(&g_rng, w, (size_t)(n * k), 0.05);
    tu_fill_normal_f32(&g_rng, b, (size_t)n, 0.1);
    if (rows > 2) x[ldx + k / 2] = 40.0f; /* an outlier in row 1 */
    qkv_i8_matrix m;
    CHECK_STATUS(qkv_i8_matrix_make(w, n, k, k, &m), QKV_OK);
    CHECK_STATUS(qkv_i8_linear(x, rows, ldx, &m, b, y, ldy, 1), QKV_OK);
    double worst = 0;
    for (int64_t r = 0; r < rows; r++) {
        double mx = 0;
        for (int64_t t = 0; t < k; t++) mx = fmax(mx, fabs(x[r * ldx + t]));
        for (int64_t j = 0; j < n; j++) {
            double mw = 0, exact = b[j], bound = 0;
            for (int64_t t = 0; t < k; t++) mw = fmax(mw, fabs(w[j * k + t]));
            double sx = mx / 127, sw = mw / 127;
            for (int64_t t = 0; t < k; t++) {
                exact += (double)x[r * ldx + t] * w[j * k + t];
                bound += fabs(x[r * ldx + t]) * sw / 2 + fabs(w[j * k + t]) * sx / 2 + sx * sw / 4;
            }
            double e = fabs(y[r * ldy + j] - exact) / (bound + 1e-6 * (fabs(exact) + 1e-30));
            if (!(e <= worst)) worst = e;
        }
    }
    CHECK(worst <= 1.0, "rows %lld n %lld k %lld: within the quantisation bound (%.3f of it)", (long long)rows,
          (long long)n, (long long)k, worst);
    /* threads and kernel tables: the same bits */
    for (int t = 2; t <= 3; t++) {
        memset(y2, 0, (size_t)(rows * ldy) * sizeof *y2);
        CHECK_STATUS(qkv_i8_linear(x, rows, ldx, &m, b, y2, ldy, t), QKV_OK);
        int same = 1;
        for (int64_t r = 0; r < rows; r++) same &= memcmp(y + r * ldy, y2 + r * ldy, (size_t)n * sizeof *y) == 0;
        CHECK(same, "rows %lld n %lld k %lld: %d threads give 1 thread's bits", (long long)rows, (long long)n,
              (long long)k, t);
    }
    for (int arch = 0; arch < QKV_ARCH_COUNT; arch++) {
        const qkv_kernel_set *s = qkv_kernel_set_of(arch);
        if (!s) continue;
        CHECK_STATUS(qkv_i8_linear_with(&s->i8, x, rows, ldx, &m, b, y2, ldy, 2), QKV_OK);
        int same = 1;
        for (int64_t r = 0; r < rows; r++) same &= memcmp(y + r * ldy, y2 + r * ldy, (size_t)n * sizeof *y) == 0;
        CHECK(same, "rows %lld n %lld k %lld: table %s gives the same bits", (long long)rows, (long long)n,
              (long long)k, s->i8.name);
    }
    qkv_i8_matrix_free(&m);
    free(x);
    free(w);
    free(b);
    free(y);
    free(y2);
}

int main(void) {
    tu_rng_seed(&g_rng, 88);
    static const int64_t R[] = {1, 2, 7, 15, 63, 129}, N[] = {1, 7, 33, 65, 384}, K[] = {1, 5, 63, 129, 384};
    for (size_t a = 0; a < 6; a++)
        for (size_t b = 0; b < 5; b++)
            for (size_t c = 0; c < 5; c++)
                if (R[a] * N[b] * K[c] <= 129 * 384 * 129) check_shape(R[a], N[b], K[c]);
    check_shape(300, 1536, 384); /* an encoder's MLP, several row blocks */

    /* bad arguments */
    float w[8] = {1, 2, 3, 4, 5, 6, 7, 8}, x[8] = {0}, y[8];
    qkv_i8_matrix m;
    CHECK_STATUS(qkv_i8_matrix_make(NULL, 2, 4, 4, &m), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_i8_matrix_make(w, 0, 4, 4, &m), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_i8_matrix_make(w, 2, 4, 3, &m), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_i8_matrix_make(w, 1, QKV_I8_MAX_K + 1, QKV_I8_MAX_K + 1, &m), QKV_ERR_BAD_SIZE);
    w[3] = NAN;
    CHECK_STATUS(qkv_i8_matrix_make(w, 2, 4, 4, &m), QKV_ERR_NOT_FINITE);
    CHECK(m.panels == NULL, "nothing held after a failure");
    w[3] = 4;
    CHECK_STATUS(qkv_i8_matrix_make(w, 2, 4, 4, &m), QKV_OK);
    CHECK_STATUS(qkv_i8_linear(NULL, 1, 4, &m, NULL, y, 2, 1), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_i8_linear(x, 0, 4, &m, NULL, y, 2, 1), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_i8_linear(x, 1, 3, &m, NULL, y, 2, 1), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_i8_linear(x, 1, 4, &m, NULL, y, 1, 1), QKV_ERR_BAD_SIZE);
    /* a zero row gives the bias exactly */
    float bias[2] = {0.25f, -3.0f};
    CHECK_STATUS(qkv_i8_linear(x, 1, 4, &m, bias, y, 2, 1), QKV_OK);
    CHECK(y[0] == 0.25f && y[1] == -3.0f, "a zero row gives the bias: %g %g", y[0], y[1]);
    /* one panel of 32 channels, K = 4 padded to QKV_I8_KSTEP, a sum and a scale each */
    CHECK(qkv_i8_matrix_bytes(&m) == 32 * (QKV_I8_KSTEP + 8), "bytes held: %lld", (long long)qkv_i8_matrix_bytes(&m));
    qkv_i8_matrix_free(&m);
    qkv_i8_matrix_free(NULL);
    return tu_finish();
}
