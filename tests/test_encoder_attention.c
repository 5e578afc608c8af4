/* qkv_encoder_attention against transformers: the tiny model of
 * tests/data/encoder/tiny on lines 0, 1 and 4 of sentences.txt (the last cut
 * at the model's 24 tokens), every layer and head, compared with the
 * float64 maps of output_attentions=True that make_attention.py wrote
 * (tests/data/encoder/expected_attention_s<line>.npy, [layers, heads, n, n]).
 *
 * Accuracy rule: max |qkv - ref| <= 1e-5 over every map (the weights lie in
 * [0, 1]); every row sums to 1 within 1e-5. */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qkv.h"
#include "test_util.h"

#define TOL 1e-5

static char g_dir[1024]; /* tests/data/encoder */
static double g_worst;

/* Line `line` of sentences.txt into buf (without its newline); 0 or -1. */
static int sentence(int line, char *buf, size_t cap) {
    char path[1100];
    snprintf(path, sizeof path, "%s/sentences.txt", g_dir);
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL, "%s: cannot open", path);
    if (!f) return -1;
    int got = -1;
    for (int i = 0; i <= line && fgets(buf, (int)cap, f); i++)
        if (i == line) got = 0;
    fclose(f);
    CHECK(got == 0, "%s has no line %d", path, line);
    if (got == 0) buf[strcspn(buf, "\n")] = '\0';
    return got;
}

static void check_line(qkv_encoder *enc, int line) {
    char text[1024], path[1100], why[256] = "";
    if (sentence(line, text, sizeof text) != 0) return;
    snprintf(path, sizeof path, "%s/expected_attention_s%d.npy", g_dir, line);
    qkv_array ref;
    qkv_status s = qkv_npy_load(path, &ref, why, sizeof why);
    CHECK(s == QKV_OK, "%s: %s (python3 tests/data/encoder/make_attention.py writes it)", path, why);
    if (s != QKV_OK) return;
    qkv_encoder_info info;
    qkv_encoder_get_info(enc, &info);
    const int64_t n = ref.ndim == 4 ? ref.shape[2] : 0;
    CHECK(ref.dtype == QKV_F64 && ref.ndim == 4 && ref.shape[0] == info.layers && ref.shape[1] == info.heads &&
              ref.shape[3] == n && n > 0,
          "%s: float64 [%lld, %lld, n, n] expected", path, (long long)info.layers, (long long)info.heads);
    if (ref.dtype != QKV_F64 || ref.ndim != 4 || ref.shape[0] != info.layers || ref.shape[1] != info.heads || n < 1) {
        qkv_array_free(&ref);
        return;
    }
    const int64_t per_layer = info.heads * n * n;
    float *a = malloc((size_t)per_layer * sizeof *a);
    CHECK(a != NULL, "out of memory");
    for (int64_t l = 0; a && l < info.layers; l++) {
        int64_t got = 0;
        CHECK_STATUS(qkv_encoder_attention(enc, text, strlen(text), l, a, per_layer, &got, why, sizeof why), QKV_OK);
        CHECK(got == n, "line %d: %lld tokens, transformers %lld", line, (long long)got, (long long)n);
        if (got != n) break;
        const double *want = (const double *)ref.data + l * per_layer;
        double err = tu_max_abs_diff_f32_f64(a, want, (size_t)per_layer), worst_row = 0;
        for (int64_t r = 0; r < info.heads * n; r++) {
            double sum = 0;
            for (int64_t j = 0; j < n; j++) sum += a[r * n + j];
            if (fabs(sum - 1) > worst_row) worst_row = fabs(sum - 1);
        }
        CHECK(err <= TOL, "line %d layer %lld: max |qkv - transformers| = %.3g", line, (long long)l, err);
        CHECK(worst_row <= TOL, "line %d layer %lld: a row sums to 1 %+.3g", line, (long long)l, worst_row);
        if (err > g_worst) g_worst = err;
    }
    free(a);
    qkv_array_free(&ref);
}

int main(void) {
    const char *src = getenv("QKV_SOURCE_DIR");
    snprintf(g_dir, sizeof g_dir, "%s/tests/data/encoder", src && *src ? src : ".");
    char model[1100], why[256] = "";
    snprintf(model, sizeof model, "%s/tiny", g_dir);
    for (int threads = 1; threads <= 2; threads++) {
        qkv_encoder_options opt = {.threads = threads};
        qkv_encoder *enc = NULL;
        CHECK_STATUS(qkv_encoder_load(model, &opt, &enc, why, sizeof why), QKV_OK);
        if (!enc) break;
        check_line(enc, 0);
        check_line(enc, 1);
        check_line(enc, 4);
        qkv_encoder_free(enc);
    }
    printf("largest error against transformers' maps: %.3g (allowed %.0e)\n", g_worst, TOL);
    return tu_finish();
}
