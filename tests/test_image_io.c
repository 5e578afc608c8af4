/* Image I/O: the fixtures of tests/data/image (made by make_fixtures.py,
 * expected pixels from its formula), round trips through PNG and PGM/PPM,
 * and malformed input (bad magic, zero and huge dimensions, truncation at
 * every length, corrupt bytes, lying headers): always an error, never a
 * crash or an allocation the file cannot justify. In a build without
 * libpng: the PGM/PPM parts, and every PNG refused. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "test_util.h"

static char g_dir[1024];

static int val(int y, int x, int c, int maxval) { return (y * 7 + x * 13 + c * 29) % (maxval + 1); }

#if QKV_WITH_PNG
static unsigned char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return b;
}
#endif

static void fixture_path(char *buf, size_t len, const char *name) {
    snprintf(buf, len, "%s/%s", g_dir, name);
}

/* Load a fixture and compare with value/maxval on every sample. */
static void check_fixture(const char *name, int w, int h, int ch, int maxval) {
    char path[1200], why[256];
    fixture_path(path, sizeof path, name);
    qkv_image img;
    qkv_status s = qkv_image_load(path, &img, why, sizeof why);
    CHECK(s == QKV_OK, "%s: %s (%s)", name, qkv_status_string(s), why);
    if (s != QKV_OK) return;
    CHECK(img.width == w && img.height == h && img.channels == ch, "%s: %lld x %lld x %lld", name,
          (long long)img.height, (long long)img.width, (long long)img.channels);
    if (img.width == w && img.height == h && img.channels == ch) {
        double worst = 0;
        for (int y = 0; y < h; y++)
            for (int x = 0; x < w; x++)
                for (int c = 0; c < ch; c++) {
                    double want = (double)val(y, x, c, maxval) / maxval;
                    double d = fabs(img.data[(y * w + x) * ch + c] - want);
                    if (d > worst) worst = d;
                }
        CHECK(worst < 1e-6, "%s: worst sample error %g", name, worst);
    }
    qkv_image_free(&img);
}

static void test_fixtures(void) {
    check_fixture("rgb.ppm", 5, 3, 3, 255);
    check_fixture("gray16.pgm", 5, 3, 1, 65535);
#if QKV_WITH_PNG
    check_fixture("rgb8.png", 5, 3, 3, 255);
    check_fixture("gray8.png", 5, 3, 1, 255);
    check_fixture("graya8.png", 5, 3, 2, 255);
    check_fixture("rgba8.png", 5, 3, 4, 255);
    check_fixture("rgb16.png", 5, 3, 3, 255); /* 16-bit v*257 scales back to v */
    check_fixture("gray1.png", 5, 3, 1, 1);
    check_fixture("gray4.png", 5, 3, 1, 15);
    check_fixture("interlaced.png", 9, 10, 3, 255);

    /* Palette with a transparent entry: RGBA. */
    char path[1200], why[256];
    fixture_path(path, sizeof path, "palette.png");
    qkv_image img;
    CHECK_STATUS(qkv_image_load(path, &img, why, sizeof why), QKV_OK);
    if (img.data) {
        CHECK(img.channels == 4, "palette channels %lld", (long long)img.channels);
        static const float pal[4][4] = {{1, 0, 0, 1}, {0, 1, 0, 1}, {0, 0, 1, 1},
                                        {10 / 255.f, 20 / 255.f, 30 / 255.f, 0}};
        int bad = 0;
        for (int y = 0; y < 3; y++)
            for (int x = 0; x < 5; x++)
                for (int c = 0; c < 4; c++)
                    if (fabsf(img.data[(y * 5 + x) * 4 + c] - pal[(y + x) % 4][c]) > 1e-6f) bad++;
        CHECK(bad == 0, "palette: %d wrong samples", bad);
    }
    qkv_image_free(&img);
#endif
}

static void test_round_trips(void) {
    tu_rng r;
    tu_rng_seed(&r, 42);
    char path[1024];
    for (int ch = 1; ch <= 4; ch++) {
        int64_t h = 1 + (int64_t)(tu_rng_u64(&r) % 40), w = 1 + (int64_t)(tu_rng_u64(&r) % 40);
        qkv_image a, b;
        CHECK_STATUS(qkv_image_alloc(&a, h, w, ch), QKV_OK);
        int64_t n = qkv_image_count(&a);
        for (int64_t i = 0; i < n; i++) a.data[i] = (float)(tu_rng_u64(&r) % 256) / 255.0f;
#if QKV_WITH_PNG
        tu_tmp_path(path, sizeof path, "img_rt.png");
        CHECK_STATUS(qkv_image_save_png(path, &a), QKV_OK);
        CHECK_STATUS(qkv_image_load(path, &b, NULL, 0), QKV_OK);
        CHECK(b.data && b.height == h && b.width == w && b.channels == ch, "png round trip shape, C %d", ch);
        if (b.data) CHECK(memcmp(a.data, b.data, (size_t)n * sizeof(float)) == 0, "png round trip C %d", ch);
        qkv_image_free(&b);
#endif
        if (ch == 1 || ch == 3) {
            tu_tmp_path(path, sizeof path, "img_rt.pnm");
            CHECK_STATUS(qkv_image_save_pnm(path, &a), QKV_OK);
            CHECK_STATUS(qkv_image_load(path, &b, NULL, 0), QKV_OK);
            if (b.data)
                CHECK(b.channels == ch && memcmp(a.data, b.data, (size_t)n * sizeof(float)) == 0,
                      "pnm round trip C %d", ch);
            qkv_image_free(&b);
        } else {
            tu_tmp_path(path, sizeof path, "img_rt_bad.pnm");
            CHECK_STATUS(qkv_image_save_pnm(path, &a), QKV_ERR_SHAPE);
        }
        qkv_image_free(&a);
    }
#if QKV_WITH_PNG
    /* Clamping on write: out-of-range and NaN. */
    qkv_image a, b;
    CHECK_STATUS(qkv_image_alloc(&a, 1, 4, 1), QKV_OK);
    a.data[0] = -1.0f;
    a.data[1] = 2.0f;
    a.data[2] = NAN;
    a.data[3] = 0.5f;
    tu_tmp_path(path, sizeof path, "img_clamp.png");
    CHECK_STATUS(qkv_image_save_png(path, &a), QKV_OK);
    CHECK_STATUS(qkv_image_load(path, &b, NULL, 0), QKV_OK);
    if (b.data)
        CHECK(b.data[0] == 0.0f && b.data[1] == 1.0f && b.data[2] == 0.0f && b.data[3] == 128 / 255.0f,
              "clamped %g %g %g %g", b.data[0], b.data[1], b.data[2], b.data[3]);
    qkv_image_free(&b);
    /* No temporary file is left beside the output; an unwritable folder is IO. */
    CHECK_STATUS(qkv_image_save_png("/nonexistent-dir/x.png", &a), QKV_ERR_IO);
    a.channels = 5;
    CHECK_STATUS(qkv_image_save_png(path, &a), QKV_ERR_SHAPE);
    a.channels = 1;
    qkv_image_free(&a);
    CHECK_STATUS(qkv_image_save_png(path, &a), QKV_ERR_NULL_POINTER);
#endif
}

static void expect_parse(const void *bytes, size_t len, qkv_status want, const char *label) {
    qkv_image img;
    char why[256] = "";
    qkv_status s = qkv_image_parse(bytes, len, &img, why, sizeof why);
    CHECK(s == want, "%s: got %s (%s), want %s", label, qkv_status_string(s), why, qkv_status_string(want));
    CHECK(img.data == NULL || s == QKV_OK, "%s: data left on error", label);
    if (s != QKV_OK) CHECK(why[0] != '\0', "%s: no reason given", label);
    qkv_image_free(&img);
}

static void test_malformed(void) {
    expect_parse("", 0, QKV_ERR_FORMAT, "empty");
    expect_parse("GIF89a", 6, QKV_ERR_FORMAT, "gif");
    expect_parse("P3\n1 1\n255\n0 0 0\n", 17, QKV_ERR_FORMAT, "ascii ppm");
    expect_parse("P5\n0 1\n255\n", 11, QKV_ERR_FORMAT, "zero width");
    expect_parse("P5\n1 1\n0\n\x01", 10, QKV_ERR_FORMAT, "maxval 0");
    expect_parse("P5\n1 1\n65536\n\x01\x01", 15, QKV_ERR_FORMAT, "maxval too big");
    expect_parse("P5\n2 2\n255\n\x01\x02\x03", 14, QKV_ERR_FORMAT, "truncated pgm");
    expect_parse("P6\n2147483647 2147483647\n65535\n\x01", 33, QKV_ERR_SIZE_OVERFLOW, "huge ppm");
    expect_parse("P6\n100000 100000\n255\n\x01", 23, QKV_ERR_FORMAT, "ppm header lies");
    expect_parse("P5\n99999999999 1\n255\n\x01", 22, QKV_ERR_FORMAT, "width > 10 digits/int32");
    expect_parse("P5\n1 1\n255", 10, QKV_ERR_FORMAT, "no whitespace after maxval");
    expect_parse("P5 1 1 255 \x07", 12, QKV_OK, "minimal pgm");
    /* Samples above maxval are clamped as netpbm does. */
    qkv_image img;
    CHECK_STATUS(qkv_image_parse("P5 1 1 3 \x09", 10, &img, NULL, 0), QKV_OK);
    if (img.data) CHECK(img.data[0] == 1.0f, "clamped sample %g", img.data[0]);
    qkv_image_free(&img);
    CHECK_STATUS(qkv_image_parse(NULL, 4, &img, NULL, 0), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_image_parse("x", 1, NULL, NULL, 0), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_image_load("/nonexistent/x.png", &img, NULL, 0), QKV_ERR_IO);
    CHECK_STATUS(qkv_image_load(g_dir, &img, NULL, 0), QKV_ERR_IO); /* a folder */

#if QKV_WITH_PNG
    /* Every truncation of every PNG fixture is an error (never a crash), and
     * every single corrupted byte either still decodes or is an error. */
    const char *names[] = {"rgb8.png", "palette.png", "rgb16.png", "interlaced.png", "gray1.png", "rgb.ppm",
                           "gray16.pgm"};
    for (size_t f = 0; f < sizeof names / sizeof names[0]; f++) {
        char path[1200];
        size_t len;
        fixture_path(path, sizeof path, names[f]);
        unsigned char *b = read_all(path, &len);
        CHECK(b != NULL, "read %s", path);
        if (!b) continue;
        int truncated_ok = 0, corrupt_crash = 0;
        for (size_t cut = 0; cut < len; cut++) {
            qkv_image t;
            unsigned char *copy = malloc(cut ? cut : 1); /* exact size: ASan sees over-reads */
            memcpy(copy, b, cut);
            qkv_status s = qkv_image_parse(copy, cut, &t, NULL, 0);
            /* A PNG cut inside IEND's chunk still has all its pixels; libpng
             * reads IEND, so any cut is an error. PNM ignores nothing after
             * the data, so only a cut inside the data is an error. */
            if (s == QKV_OK) truncated_ok++;
            qkv_image_free(&t);
            free(copy);
        }
        CHECK(truncated_ok == 0, "%s: %d truncations decoded", names[f], truncated_ok);
        unsigned char *copy = malloc(len);
        for (size_t i = 0; i < len; i++) {
            memcpy(copy, b, len);
            copy[i] ^= 0x5A;
            qkv_image t;
            qkv_status s = qkv_image_parse(copy, len, &t, NULL, 0);
            if (s != QKV_OK && s != QKV_ERR_FORMAT && s != QKV_ERR_SIZE_OVERFLOW) corrupt_crash++;
            if (s == QKV_OK && (t.width > 1000000 || t.height > 1000000)) corrupt_crash++;
            qkv_image_free(&t);
        }
        CHECK(corrupt_crash == 0, "%s: %d corrupt bytes gave odd statuses", names[f], corrupt_crash);
        free(copy);
        free(b);
    }

    /* A PNG whose header claims 100000 x 100000 pixels (with a valid CRC) in
     * a file of a hundred bytes: refused before allocating 120 GB. */
    char path[1200];
    size_t len;
    fixture_path(path, sizeof path, "rgb8.png");
    unsigned char *b = read_all(path, &len);
    if (b) {
        /* IHDR data at offset 16: width, height (big-endian); CRC at 29..32. */
        unsigned char big[4] = {0x00, 0x01, 0x86, 0xA0};
        memcpy(b + 16, big, 4);
        memcpy(b + 20, big, 4);
        /* Recompute the CRC of "IHDR" + 13 data bytes. */
        uint32_t crc = 0xFFFFFFFFu;
        for (int i = 12; i < 12 + 17; i++) {
            crc ^= b[i];
            for (int k = 0; k < 8; k++) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
        }
        crc ^= 0xFFFFFFFFu;
        b[29] = (unsigned char)(crc >> 24);
        b[30] = (unsigned char)(crc >> 16);
        b[31] = (unsigned char)(crc >> 8);
        b[32] = (unsigned char)crc;
        expect_parse(b, len, QKV_ERR_FORMAT, "png claiming 1e10 pixels");
        free(b);
    }
#endif
}

#if !QKV_WITH_PNG
/* Without libpng: a PNG is refused as unsupported (with a reason), reading
 * and writing, and no file is written. */
static void test_without_png(void) {
    char path[1200], why[256] = "";
    fixture_path(path, sizeof path, "rgb8.png");
    qkv_image img;
    CHECK_STATUS(qkv_image_load(path, &img, why, sizeof why), QKV_ERR_UNSUPPORTED);
    CHECK(img.data == NULL && why[0] != '\0', "refused PNG: no data, a reason");
    CHECK_STATUS(qkv_image_alloc(&img, 2, 3, 3), QKV_OK);
    tu_tmp_path(path, sizeof path, "img_nopng.png");
    remove(path);
    CHECK_STATUS(qkv_image_save_png(path, &img), QKV_ERR_UNSUPPORTED);
    struct stat st;
    CHECK(stat(path, &st) != 0, "no PNG written");
    img.channels = 5;
    CHECK_STATUS(qkv_image_save_png(path, &img), QKV_ERR_SHAPE);
    img.channels = 3;
    qkv_image_free(&img);
}
#endif

static void test_alloc(void) {
    qkv_image img;
    CHECK_STATUS(qkv_image_alloc(&img, 0, 1, 1), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_image_alloc(&img, INT64_MAX / 2, 4, 4), QKV_ERR_SIZE_OVERFLOW);
    CHECK_STATUS(qkv_image_alloc(NULL, 1, 1, 1), QKV_ERR_NULL_POINTER);
    CHECK(qkv_image_count(NULL) == 0, "count NULL");
    qkv_image_free(NULL);
}

int main(void) {
    const char *src = getenv("QKV_SOURCE_DIR");
    snprintf(g_dir, sizeof g_dir, "%s/tests/data/image", src ? src : ".");
    test_fixtures();
    test_round_trips();
    test_malformed();
    test_alloc();
#if !QKV_WITH_PNG
    test_without_png();
#endif
    return tu_finish();
}
