/* Pictures: heatmaps, line plots and matrix images written as PNG and read
 * back with libpng (size, pixel colours), the terminal heatmap's text, the
 * font, and every error path (bad arguments, unwritable paths, failed
 * allocations), with no file left behind by a failure. In a build without
 * libpng: the font, the terminal heatmap, and every PNG refused. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_util.h"
#include "viz/viz_internal.h"
#if QKV_WITH_PNG
#include <png.h>
#endif

static const char *const words[] = {"Hello", ",", "I"};
static const char *const keys[] = {"Hello", ",", "I", "love"};

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

#if QKV_WITH_PNG

typedef struct picture {
    int64_t w, h;
    unsigned char *rgb; /* [h, w, 3] */
} picture;

/* Read a PNG with libpng's simplified API as 8-bit RGB. */
static int read_png(const char *path, picture *p) {
    png_image img;
    memset(&img, 0, sizeof img);
    memset(p, 0, sizeof *p);
    img.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_file(&img, path)) return 0;
    img.format = PNG_FORMAT_RGB;
    p->rgb = malloc(PNG_IMAGE_SIZE(img));
    if (!p->rgb || !png_image_finish_read(&img, NULL, p->rgb, 0, NULL)) {
        png_image_free(&img);
        free(p->rgb);
        p->rgb = NULL;
        return 0;
    }
    p->w = img.width;
    p->h = img.height;
    return 1;
}

static int px_is(const picture *p, int64_t x, int64_t y, viz_rgb c) {
    const unsigned char *q = p->rgb + 3 * (y * p->w + x);
    return q[0] == c.r && q[1] == c.g && q[2] == c.b;
}

static int64_t count_color(const picture *p, viz_rgb c) {
    int64_t n = 0;
    for (int64_t y = 0; y < p->h; y++)
        for (int64_t x = 0; x < p->w; x++) n += px_is(p, x, y, c);
    return n;
}

/* The first pixel (row-major) of colour c left of the colour bar (which
 * takes the rightmost 72 pixels or less), and whether the side x side block
 * from there is all c. */
static int find_block(const picture *p, viz_rgb c, int64_t side, int64_t *fx, int64_t *fy) {
    for (int64_t y = 0; y < p->h; y++)
        for (int64_t x = 0; x < p->w - 75; x++)
            if (px_is(p, x, y, c)) {
                *fx = x;
                *fy = y;
                if (x + side > p->w || y + side > p->h) return 0;
                for (int64_t j = 0; j < side; j++)
                    for (int64_t i = 0; i < side; i++)
                        if (!px_is(p, x + i, y + j, c)) return 0;
                return 1;
            }
    return 0;
}

/* No temporary file "<base>.tmp..." left in dir. */
static int no_temp_left(const char *dir, const char *base) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    size_t bl = strlen(base);
    int ok = 1;
    while ((e = readdir(d)) != NULL)
        if (strncmp(e->d_name, base, bl) == 0 && strncmp(e->d_name + bl, ".tmp", 4) == 0) ok = 0;
    closedir(d);
    return ok;
}

static void test_heatmap_png(void) {
    char path[512];
    tu_tmp_path(path, sizeof path, "viz_heat.png");
    float v[2 * 3 * 4];
    for (int i = 0; i < 12; i++) v[i] = (float)i / 11.0f;
    for (int i = 0; i < 12; i++) v[12 + i] = 1.0f - (float)i / 11.0f;
    qkv_heatmap h;
    qkv_heatmap_init(&h, v, 3, 4);
    h.row_labels = words;
    h.col_labels = keys;
    h.title = "attention";
    h.cell = 30;
    h.vmin = 0.0;
    h.vmax = 1.0;
    unlink(path);
    CHECK_STATUS(qkv_heatmap_save_png(path, &h), QKV_OK);
    picture p;
    CHECK(read_png(path, &p), "read back %s", path);
    if (p.rgb) {
        CHECK(p.w > 4 * 30 && p.h > 3 * 30 && p.w < 400 && p.h < 400, "size %lld x %lld", (long long)p.w,
              (long long)p.h);
        CHECK(px_is(&p, 0, 0, (viz_rgb){255, 255, 255}), "white background");
        /* Every cell is one cell x cell square of its value's colour. */
        for (int i = 0; i < 12; i++) {
            viz_rgb c = viz_colormap_sequential(v[i]);
            int64_t x = -1, y = -1;
            CHECK(find_block(&p, c, 30, &x, &y), "cell %d is a 30x30 block of its colour", i);
            if (i == 0) {
                int64_t x5 = -1, y5 = -1;
                find_block(&p, viz_colormap_sequential(v[5]), 30, &x5, &y5);
                CHECK(x5 == x + 30 && y5 == y + 30, "cell (1,1) at (%lld,%lld), cell (0,0) at (%lld,%lld)",
                      (long long)x5, (long long)y5, (long long)x, (long long)y);
            }
        }
        /* Labels are drawn (grey text) left of and above the map. */
        CHECK(count_color(&p, (viz_rgb){90, 90, 90}) > 50, "labels drawn");
        free(p.rgb);
    }
    /* Two panels side by side: wider, same height; values in the cells. */
    h.panels = 2;
    const char *const titles[] = {"head 0", "head 1"};
    h.panel_titles = titles;
    h.show_values = 1;
    CHECK_STATUS(qkv_heatmap_save_png(path, &h), QKV_OK);
    picture p2;
    CHECK(read_png(path, &p2), "read back two panels");
    if (p2.rgb) {
        CHECK(p2.w > 8 * 30, "two panels wide: %lld", (long long)p2.w);
        /* The top-left cell (value 0, dark) carries white text ".00". */
        viz_rgb c0 = viz_colormap_sequential(0.0);
        int64_t x = -1, y = -1;
        CHECK(!find_block(&p2, c0, 30, &x, &y), "a value is written in the first cell");
        int white_in_cell = 0;
        for (int64_t j = 0; j < 30 && y + j < p2.h; j++)
            for (int64_t i = 0; i < 30 && x + i < p2.w; i++) white_in_cell |= px_is(&p2, x + i, y + j, (viz_rgb){255, 255, 255});
        CHECK(white_in_cell, "white digits on the dark cell");
        free(p2.rgb);
    }
    /* Automatic range and cell size, no labels, a long sequence. */
    float big[64 * 64];
    for (int i = 0; i < 64 * 64; i++) big[i] = (float)(i % 64) / 63.0f;
    qkv_heatmap_init(&h, big, 64, 64);
    CHECK_STATUS(qkv_heatmap_save_png(path, &h), QKV_OK);
    picture p3;
    CHECK(read_png(path, &p3), "read back 64x64");
    if (p3.rgb) {
        CHECK(p3.w >= 64 * 7 && p3.h >= 64 * 7, "64x64 at 7 px cells: %lld x %lld", (long long)p3.w, (long long)p3.h);
        free(p3.rgb);
    }
}

static void test_heatmap_errors(void) {
    char path[512], dir[512];
    tu_tmp_path(path, sizeof path, "viz_err.png");
    unlink(path);
    float v[4] = {0.1f, 0.9f, 0.5f, 0.5f};
    qkv_heatmap h;
    qkv_heatmap_init(&h, v, 2, 2);
    CHECK_STATUS(qkv_heatmap_save_png(NULL, &h), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_heatmap_save_png(path, NULL), QKV_ERR_NULL_POINTER);
    h.values = NULL;
    CHECK_STATUS(qkv_heatmap_save_png(path, &h), QKV_ERR_NULL_POINTER);
    h.values = v;
    h.rows = 0;
    CHECK_STATUS(qkv_heatmap_save_png(path, &h), QKV_ERR_BAD_SIZE);
    h.rows = 2;
    h.panels = 0;
    CHECK_STATUS(qkv_heatmap_save_png(path, &h), QKV_ERR_BAD_SIZE);
    h.panels = 1;
    h.cell = -1;
    CHECK_STATUS(qkv_heatmap_save_png(path, &h), QKV_ERR_BAD_SIZE);
    h.cell = 0;
    h.cols = 5000;
    CHECK_STATUS(qkv_heatmap_save_png(path, &h), QKV_ERR_SIZE_OVERFLOW);
    h.cols = 2;
    h.cell = 256;
    h.panels = 1;
    h.rows = 2;
    h.vmax = NAN;
    CHECK_STATUS(qkv_heatmap_save_png(path, &h), QKV_ERR_BAD_PARAMETER);
    h.vmax = 0.0;
    CHECK(!file_exists(path), "no file after argument errors");
    h.cell = 0;
    CHECK_STATUS(qkv_heatmap_save_png("/nonexistent-dir/x.png", &h), QKV_ERR_IO);
    CHECK_STATUS(qkv_heatmap_save_png("", &h), QKV_ERR_IO);
    /* Renaming over a folder fails: the temporary file is removed. */
    tu_tmp_path(dir, sizeof dir, "viz_dir_target");
    mkdir(dir, 0777);
    CHECK_STATUS(qkv_heatmap_save_png(dir, &h), QKV_ERR_IO);
    char parent[512];
    tu_tmp_path(parent, sizeof parent, "");
    CHECK(no_temp_left(parent, "viz_dir_target"), "temporary file removed after a failed rename");
    rmdir(dir);
    /* A failed write leaves an existing file as it was. */
    FILE *f = fopen(path, "wb");
    if (f) {
        fputs("old", f);
        fclose(f);
    }
    h.rows = 0;
    CHECK_STATUS(qkv_heatmap_save_png(path, &h), QKV_ERR_BAD_SIZE);
    f = fopen(path, "rb");
    char buf[8] = {0};
    if (f) {
        size_t got = fread(buf, 1, sizeof buf - 1, f);
        (void)got;
        fclose(f);
    }
    CHECK(strcmp(buf, "old") == 0, "existing file untouched");
    unlink(path);
}

/* Failing allocations: every one of them is reported as out of memory, nothing leaks, no file appears. */
static long g_calls, g_fail_at, g_live;
static void *failing_malloc(size_t n, void *user) {
    (void)user;
    if (++g_calls == g_fail_at) return NULL;
    g_live++;
    return malloc(n);
}
static void counting_free(void *p, void *user) {
    (void)user;
    if (p) g_live--;
    free(p);
}

static void test_out_of_memory(void) {
    char path[512];
    tu_tmp_path(path, sizeof path, "viz_oom.png");
    unlink(path);
    float v[6] = {0, 0.2f, 0.4f, 0.6f, 0.8f, 1};
    qkv_heatmap h;
    qkv_heatmap_init(&h, v, 2, 3);
    CHECK_STATUS(qkv_set_allocator(failing_malloc, counting_free, NULL), QKV_OK);
    long k;
    for (k = 1; k < 1000; k++) {
        g_calls = 0;
        g_live = 0;
        g_fail_at = k;
        qkv_status s = qkv_heatmap_save_png(path, &h);
        CHECK(g_live == 0, "%ld blocks leaked when allocation %ld fails", g_live, k);
        if (s == QKV_OK) break;
        CHECK(s == QKV_ERR_OUT_OF_MEMORY, "allocation %ld failing gives %s", k, qkv_status_string(s));
        CHECK(!file_exists(path), "no file when allocation %ld fails", k);
    }
    CHECK(k > 1 && k < 1000, "the save allocates (%ld)", k);
    qkv_set_allocator(NULL, NULL, NULL);
    unlink(path);
}

#endif /* QKV_WITH_PNG */

static void test_ansi(void) {
    float v[12];
    for (int i = 0; i < 12; i++) v[i] = (float)i / 11.0f;
    qkv_heatmap h;
    qkv_heatmap_init(&h, v, 3, 4);
    h.row_labels = words;
    h.col_labels = keys;
    size_t len = 0;
    CHECK_STATUS(qkv_heatmap_format_ansi(&h, QKV_ANSI_24BIT, NULL, 0, &len), QKV_OK);
    CHECK(len > 100, "length %zu", len);
    char *buf = malloc(len + 1);
    size_t len2 = 0;
    CHECK_STATUS(qkv_heatmap_format_ansi(&h, QKV_ANSI_24BIT, buf, len + 1, &len2), QKV_OK);
    CHECK(len2 == len && strlen(buf) == len, "length %zu = %zu = strlen %zu", len2, len, strlen(buf));
    CHECK(strstr(buf, "Hello") && strstr(buf, "love") && strstr(buf, "\x1b[48;2;"), "labels and colours");
    /* One line per query, plus the header and the scale. */
    int lines = 0;
    for (size_t i = 0; i < len; i++) lines += buf[i] == '\n';
    CHECK(lines == 3 + 2, "%d lines", lines);
    /* The last cell of the first row has value 3/11 -> its 24-bit colour. */
    viz_rgb c = viz_colormap_sequential(3.0 / 11.0);
    char want[48];
    snprintf(want, sizeof want, "\x1b[48;2;%d;%d;%dm", c.r, c.g, c.b);
    CHECK(strstr(buf, want) != NULL, "colour of value 3/11 present");
    CHECK_STATUS(qkv_heatmap_format_ansi(&h, QKV_ANSI_24BIT, buf, len, &len2), QKV_ERR_BAD_SIZE);
    CHECK(buf[0] == '\0', "too small a buffer holds \"\"");
    free(buf);
    h.show_values = 1;
    h.panels = 1;
    CHECK_STATUS(qkv_heatmap_format_ansi(&h, QKV_ANSI_256, NULL, 0, &len), QKV_OK);
    buf = malloc(len + 1);
    CHECK_STATUS(qkv_heatmap_format_ansi(&h, QKV_ANSI_256, buf, len + 1, &len), QKV_OK);
    CHECK(strstr(buf, "\x1b[48;5;") && !strstr(buf, "48;2;") && strstr(buf, ".27"), "256 colours with values");
    free(buf);
    CHECK_STATUS(qkv_heatmap_format_ansi(&h, (qkv_ansi_colors)7, NULL, 0, &len), QKV_ERR_BAD_ENUM);
    CHECK_STATUS(qkv_heatmap_format_ansi(&h, QKV_ANSI_24BIT, NULL, 0, NULL), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_heatmap_format_ansi(NULL, QKV_ANSI_24BIT, NULL, 0, &len), QKV_ERR_NULL_POINTER);
    h.cols = 0;
    CHECK_STATUS(qkv_heatmap_format_ansi(&h, QKV_ANSI_24BIT, NULL, 0, &len), QKV_ERR_BAD_SIZE);
}

#if QKV_WITH_PNG
static void test_plot(void) {
    char path[512];
    tu_tmp_path(path, sizeof path, "viz_plot.png");
    double x[5] = {8, 16, 32, 64, 128}, y1[5] = {1, 2, 3, 4, 5}, y2[5] = {5, NAN, 3, 2, 1};
    qkv_plot_series s[2] = {{"with scale", x, y1, 5}, {"without", x, y2, 5}};
    qkv_plot p;
    qkv_plot_init(&p);
    p.title = "entropy";
    p.x_label = "d";
    p.y_label = "bits";
    p.series = s;
    p.n_series = 2;
    p.log_x = 1;
    p.markers = 1;
    CHECK_STATUS(qkv_plot_save_png(path, &p), QKV_OK);
    picture pic;
    CHECK(read_png(path, &pic), "read plot");
    if (pic.rgb) {
        CHECK(pic.w == 720 && pic.h == 440, "default size %lld x %lld", (long long)pic.w, (long long)pic.h);
        CHECK(count_color(&pic, (viz_rgb){31, 119, 180}) > 200, "first series drawn");
        CHECK(count_color(&pic, (viz_rgb){255, 127, 14}) > 100, "second series drawn");
        free(pic.rgb);
    }
    p.width = 400;
    p.height = 300;
    p.log_y = 1;
    CHECK_STATUS(qkv_plot_save_png(path, &p), QKV_OK);
    CHECK(read_png(path, &pic) && pic.w == 400 && pic.h == 300, "custom size");
    free(pic.rgb);
    /* A loss curve. */
    double loss[100];
    for (int i = 0; i < 100; i++) loss[i] = 3.0 * exp(-i / 20.0) + 0.1;
    CHECK_STATUS(qkv_loss_curve_save_png(path, NULL, loss, 100, NULL), QKV_OK);
    CHECK(read_png(path, &pic) && count_color(&pic, (viz_rgb){31, 119, 180}) > 300, "loss curve drawn");
    free(pic.rgb);
    /* Constant and empty series still draw axes. */
    double c1[3] = {2, 2, 2};
    qkv_plot_series sc = {NULL, NULL, c1, 3};
    p.series = &sc;
    p.n_series = 1;
    p.log_y = 0;
    CHECK_STATUS(qkv_plot_save_png(path, &p), QKV_OK);
    sc.count = 0;
    CHECK_STATUS(qkv_plot_save_png(path, &p), QKV_OK);
    /* Errors. */
    CHECK_STATUS(qkv_loss_curve_save_png(path, NULL, loss, 0, NULL), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_loss_curve_save_png(path, NULL, NULL, 5, NULL), QKV_ERR_NULL_POINTER);
    p.n_series = 9;
    CHECK_STATUS(qkv_plot_save_png(path, &p), QKV_ERR_BAD_SIZE);
    p.n_series = 1;
    p.width = 100;
    CHECK_STATUS(qkv_plot_save_png(path, &p), QKV_ERR_BAD_SIZE);
    p.width = 100000;
    CHECK_STATUS(qkv_plot_save_png(path, &p), QKV_ERR_SIZE_OVERFLOW);
    p.width = 0;
    sc.count = 3;
    sc.y = NULL;
    CHECK_STATUS(qkv_plot_save_png(path, &p), QKV_ERR_NULL_POINTER);
    sc.y = c1;
    sc.count = -1;
    CHECK_STATUS(qkv_plot_save_png(path, &p), QKV_ERR_BAD_SIZE);
    sc.count = 3;
    CHECK_STATUS(qkv_plot_save_png(NULL, &p), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_plot_save_png("/nonexistent-dir/p.png", &p), QKV_ERR_IO);
    unlink(path);
}

static void test_matrix(void) {
    char path[512];
    tu_tmp_path(path, sizeof path, "viz_matrix.png");
    /* The articles' figure: column i is position i's e^i. */
    enum { N = 20, E = 16 };
    float pe[N * E], t[E * N];
    CHECK_STATUS(qkv_posenc_sinusoidal(N, E, 0, pe), QKV_OK);
    for (int i = 0; i < N; i++)
        for (int j = 0; j < E; j++) t[j * N + i] = pe[i * E + j];
    CHECK_STATUS(qkv_matrix_save_png(path, t, E, N, "sinusoidal e^i", "position i", "dimension"), QKV_OK);
    picture p;
    CHECK(read_png(path, &p), "read matrix");
    if (p.rgb) {
        /* 640 / 20 = 32 px cells; cos(0) = 1 in row 1 of column 0 is the reddest. */
        int64_t x = -1, y = -1;
        CHECK(find_block(&p, viz_colormap_diverging(1.0), 32, &x, &y), "a full red cell");
        CHECK(p.w > 20 * 32 && p.h > 16 * 32, "size %lld x %lld", (long long)p.w, (long long)p.h);
        free(p.rgb);
    }
    CHECK_STATUS(qkv_matrix_save_png(path, NULL, E, N, NULL, NULL, NULL), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_matrix_save_png(path, t, 0, N, NULL, NULL, NULL), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_matrix_save_png(path, t, 5000, 1, NULL, NULL, NULL), QKV_ERR_SIZE_OVERFLOW);
    float zeros[4] = {0};
    CHECK_STATUS(qkv_matrix_save_png(path, zeros, 2, 2, NULL, NULL, NULL), QKV_OK);
    unlink(path);
}

#else
/* Without libpng every picture is refused as unsupported, after its
 * arguments are checked, and no file is written. */
static void test_without_png(void) {
    char path[1024];
    tu_tmp_path(path, sizeof path, "viz_nopng.png");
    remove(path);
    float v[12] = {0};
    qkv_heatmap h;
    qkv_heatmap_init(&h, v, 3, 4);
    CHECK_STATUS(qkv_heatmap_save_png(path, &h), QKV_ERR_UNSUPPORTED);
    CHECK_STATUS(qkv_heatmap_save_png(NULL, &h), QKV_ERR_NULL_POINTER);
    double y[3] = {1, 2, 3};
    qkv_plot_series ser = {"loss", NULL, y, 3};
    qkv_plot p;
    qkv_plot_init(&p);
    p.series = &ser;
    p.n_series = 1;
    CHECK_STATUS(qkv_plot_save_png(path, &p), QKV_ERR_UNSUPPORTED);
    CHECK_STATUS(qkv_loss_curve_save_png(path, NULL, y, 3, NULL), QKV_ERR_UNSUPPORTED);
    CHECK_STATUS(qkv_matrix_save_png(path, v, 3, 4, NULL, NULL, NULL), QKV_ERR_UNSUPPORTED);
    CHECK_STATUS(qkv_matrix_save_png(path, v, 0, 4, NULL, NULL, NULL), QKV_ERR_BAD_SIZE);
    CHECK(!file_exists(path), "no file written without PNG");
}
#endif /* QKV_WITH_PNG */

static void test_font(void) {
    unsigned char a[7], q[7], hi[7], sp[7];
    viz_glyph_rows('A', a);
    viz_glyph_rows('?', q);
    viz_glyph_rows(200, hi);
    viz_glyph_rows(' ', sp);
    CHECK(memcmp(q, hi, 7) == 0, "non-ASCII draws as '?'");
    int on = 0, blank = 1;
    for (int r = 0; r < 7; r++) {
        on += a[r] != 0;
        blank &= sp[r] == 0;
    }
    CHECK(on == 7 && blank, "'A' has ink in every row, ' ' none");
    CHECK(a[0] == 0x0E && a[6] == 0x11, "'A' top 0x%02x bottom 0x%02x", a[0], a[6]);
    /* Every printable glyph but the space has ink and fits 5 columns. */
    for (int ch = 33; ch < 127; ch++) {
        unsigned char g[7];
        viz_glyph_rows((unsigned char)ch, g);
        int ink = 0;
        for (int r = 0; r < 7; r++) ink |= g[r];
        CHECK(ink != 0 && ink < 32, "glyph %c", ch);
    }
    CHECK(viz_text_width("abc", 2) == (3 * 6 - 1) * 2 && viz_text_width("", 1) == 0, "text width");
}

int main(void) {
    test_font();
    test_ansi();
#if QKV_WITH_PNG
    test_heatmap_png();
    test_heatmap_errors();
    test_out_of_memory();
    test_plot();
    test_matrix();
#else
    test_without_png();
#endif
    return tu_finish();
}
