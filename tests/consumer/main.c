/* A program outside the qkv tree that uses an installed qkv: the articles'
 * four-word example through qkv_attention_forward, checked against a few
 * lines of plain C. Built by tests/consumer/CMakeLists.txt (find_package)
 * and tests/consumer/Makefile (pkg-config); .ci/run builds and runs both.
 * It also checks that qkv/config.h tells the truth about PNG. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <qkv.h>

int main(void) {
    /* "Hello, I love you": four tokens, D = 3. */
    const float x[4][3] = {{1, 0, 1}, {0, 1, 0}, {1, 1, 0}, {0, 0, 1}};
    float out[4][3], attn[4][4];
    qkv_attn_desc d;
    qkv_attn_desc_init(&d);
    d.batch = 1;
    d.n_q = d.n_k = 4;
    d.heads = 1;
    d.dim = 3;
    qkv_status s = qkv_attention_forward(&d, x, x, x, out, attn, NULL);
    if (s != QKV_OK) {
        fprintf(stderr, "consumer: qkv_attention_forward: %s\n", qkv_status_string(s));
        return 1;
    }
    if (strcmp(qkv_version(), QKV_VERSION_STRING) != 0) {
        fprintf(stderr, "consumer: library %s, header %s\n", qkv_version(), QKV_VERSION_STRING);
        return 1;
    }
    /* A PNG into a folder that does not exist: an I/O error with libpng,
     * unsupported without it (nothing is written either way). */
    qkv_image img;
    if (qkv_image_alloc(&img, 1, 1, 3) != QKV_OK) return 1;
    s = qkv_image_save_png("/nonexistent-qkv-dir/x.png", &img);
    qkv_image_free(&img);
    if (s != (QKV_WITH_PNG ? QKV_ERR_IO : QKV_ERR_UNSUPPORTED)) {
        fprintf(stderr, "consumer: QKV_WITH_PNG %d but qkv_image_save_png: %s\n", QKV_WITH_PNG,
                qkv_status_string(s));
        return 1;
    }
    double worst = 0.0;
    for (int i = 0; i < 4; i++) {
        double sc[4], m = -INFINITY, sum = 0.0;
        for (int j = 0; j < 4; j++) {
            sc[j] = 0.0;
            for (int t = 0; t < 3; t++) sc[j] += (double)x[i][t] * x[j][t];
            sc[j] /= sqrt(3.0);
            if (sc[j] > m) m = sc[j];
        }
        for (int j = 0; j < 4; j++) sum += (sc[j] = exp(sc[j] - m));
        for (int t = 0; t < 3; t++) {
            double o = 0.0;
            for (int j = 0; j < 4; j++) o += sc[j] / sum * x[j][t];
            if (fabs(o - out[i][t]) > worst) worst = fabs(o - out[i][t]);
        }
    }
    printf("consumer: qkv %s (PNG %s), attention row 0: %.4f %.4f %.4f %.4f, max error %.2g\n",
           qkv_version(), QKV_WITH_PNG ? "on" : "off", attn[0][0], attn[0][1], attn[0][2], attn[0][3], worst);
    return worst < 1e-5 ? 0 : 1;
}
