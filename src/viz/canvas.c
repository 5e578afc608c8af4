/* The RGB canvas the pictures are drawn on: rectangles, thick lines, text in
 * the built-in font, colour maps, and the atomic PNG writer. */
#define _POSIX_C_SOURCE 200809L /* open/O_EXCL, fdopen, fsync, getpid */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <png.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/internal.h"
#include "viz/viz_internal.h"

qkv_status viz_canvas_init(viz_canvas *c, int64_t width, int64_t height, viz_rgb bg) {
    memset(c, 0, sizeof *c);
    if (width < 1 || height < 1 || width > VIZ_MAX_SIDE || height > VIZ_MAX_SIDE) return QKV_ERR_BAD_SIZE;
    c->rgb = qkv_alloc((size_t)(width * height * 3));
    if (!c->rgb) return QKV_ERR_OUT_OF_MEMORY;
    c->width = width;
    c->height = height;
    for (int64_t i = 0; i < width * height; i++) {
        c->rgb[3 * i] = bg.r;
        c->rgb[3 * i + 1] = bg.g;
        c->rgb[3 * i + 2] = bg.b;
    }
    return QKV_OK;
}

void viz_canvas_free(viz_canvas *c) {
    if (!c) return;
    qkv_free(c->rgb);
    memset(c, 0, sizeof *c);
}

static void put(viz_canvas *c, int64_t x, int64_t y, viz_rgb col) {
    if (x < 0 || y < 0 || x >= c->width || y >= c->height) return;
    unsigned char *p = c->rgb + 3 * (y * c->width + x);
    p[0] = col.r;
    p[1] = col.g;
    p[2] = col.b;
}

void viz_fill_rect(viz_canvas *c, int64_t x, int64_t y, int64_t w, int64_t h, viz_rgb col) {
    int64_t x0 = x < 0 ? 0 : x, y0 = y < 0 ? 0 : y;
    int64_t x1 = x + w > c->width ? c->width : x + w, y1 = y + h > c->height ? c->height : y + h;
    for (int64_t j = y0; j < y1; j++)
        for (int64_t i = x0; i < x1; i++) put(c, i, j, col);
}

/* Bresenham, each point a thickness x thickness square. */
void viz_line(viz_canvas *c, int64_t x0, int64_t y0, int64_t x1, int64_t y1, int thickness, viz_rgb col) {
    int64_t dx = x1 > x0 ? x1 - x0 : x0 - x1, dy = y1 > y0 ? y0 - y1 : y1 - y0;
    int64_t sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1, err = dx + dy;
    int64_t half = (thickness - 1) / 2;
    /* Lines far outside the canvas (a wild value) are not walked pixel by pixel. */
    if (dx > 4 * VIZ_MAX_SIDE || -dy > 4 * VIZ_MAX_SIDE) return;
    for (;;) {
        viz_fill_rect(c, x0 - half, y0 - half, thickness, thickness, col);
        if (x0 == x1 && y0 == y1) break;
        int64_t e2 = 2 * err;
        if (e2 >= dy) {
            err += dy;
            x0 += sx;
        }
        if (e2 <= dx) {
            err += dx;
            y0 += sy;
        }
    }
}

int64_t viz_text_width(const char *s, int scale) {
    if (!s) return 0;
    int64_t n = (int64_t)strlen(s);
    return n > 0 ? (n * VIZ_GLYPH_W - 1) * scale : 0;
}

void viz_text(viz_canvas *c, int64_t x, int64_t y, const char *s, int scale, viz_rgb col) {
    if (!s) return;
    for (; *s; s++, x += VIZ_GLYPH_W * scale) {
        unsigned char rows[7];
        viz_glyph_rows((unsigned char)*s, rows);
        for (int r = 0; r < 7; r++)
            for (int b = 0; b < 5; b++)
                if (rows[r] & (0x10 >> b)) viz_fill_rect(c, x + b * scale, y + r * scale, scale, scale, col);
    }
}

void viz_text_vertical(viz_canvas *c, int64_t x, int64_t y, const char *s, int scale, viz_rgb col) {
    if (!s) return;
    int64_t bottom = y + viz_text_width(s, scale);
    for (; *s; s++, bottom -= VIZ_GLYPH_W * scale) {
        unsigned char rows[7];
        viz_glyph_rows((unsigned char)*s, rows);
        /* Glyph pixel (b, r) goes to (x + r, bottom - b): a quarter turn left. */
        for (int r = 0; r < 7; r++)
            for (int b = 0; b < 5; b++)
                if (rows[r] & (0x10 >> b))
                    viz_fill_rect(c, x + r * scale, bottom - (b + 1) * scale, scale, scale, col);
    }
}

static viz_rgb ramp(const double stops[][4], int n, double t) {
    if (t != t) return (viz_rgb){128, 128, 128};
    if (t < 0) t = 0;
    if (t > 1) t = 1;
    int i = 0;
    while (i < n - 2 && t > stops[i + 1][0]) i++;
    double u = (t - stops[i][0]) / (stops[i + 1][0] - stops[i][0]);
    viz_rgb out;
    out.r = (unsigned char)lround(stops[i][1] + u * (stops[i + 1][1] - stops[i][1]));
    out.g = (unsigned char)lround(stops[i][2] + u * (stops[i + 1][2] - stops[i][2]));
    out.b = (unsigned char)lround(stops[i][3] + u * (stops[i + 1][3] - stops[i][3]));
    return out;
}

viz_rgb viz_colormap_sequential(double t) {
    static const double stops[][4] = {{0.0, 68, 1, 84},      {0.25, 59, 82, 139}, {0.5, 33, 145, 140},
                                      {0.75, 94, 201, 98},   {1.0, 253, 231, 37}};
    return ramp(stops, 5, t);
}

viz_rgb viz_colormap_diverging(double t) {
    static const double stops[][4] = {{0.0, 33, 102, 172},   {0.25, 146, 197, 222}, {0.5, 247, 247, 247},
                                      {0.75, 244, 165, 130}, {1.0, 178, 24, 43}};
    return ramp(stops, 5, t);
}

viz_rgb viz_contrast(viz_rgb bg) {
    double lum = 0.299 * bg.r + 0.587 * bg.g + 0.114 * bg.b;
    return lum > 140 ? (viz_rgb){0, 0, 0} : (viz_rgb){255, 255, 255};
}

void viz_format_number(char *buf, size_t cap, double v, int digits) {
    snprintf(buf, cap, "%.*g", digits, v);
    if (strcmp(buf, "-0") == 0) snprintf(buf, cap, "0");
}

/* ---- PNG ------------------------------------------------------------------ */

/* libpng reports errors through these: no printing, a longjmp back. */
static void png_error_cb(png_structp png, png_const_charp msg) {
    (void)msg;
    png_longjmp(png, 1);
}
static void png_warning_cb(png_structp png, png_const_charp msg) {
    (void)png;
    (void)msg;
}
#ifdef PNG_USER_MEM_SUPPORTED
/* A failed allocation is remembered (in the caller's flag that libpng
 * hands back as mem_ptr) so that it is reported as such, not as an I/O error. */
static png_voidp png_alloc_cb(png_structp png, png_alloc_size_t size) {
    void *p = qkv_alloc(size);
    if (!p) *(int *)png_get_mem_ptr(png) = 1;
    return p;
}
static void png_free_cb(png_structp png, png_voidp p) {
    (void)png;
    qkv_free(p);
}
#endif

/* png and info are not changed after setjmp, so they need not be volatile;
 * *oom lives in the caller's frame, which the longjmp does not unwind. */
static qkv_status write_png(FILE *f, const viz_canvas *c, int *oom) {
#ifdef PNG_USER_MEM_SUPPORTED
    png_structp png = png_create_write_struct_2(PNG_LIBPNG_VER_STRING, NULL, png_error_cb, png_warning_cb, oom,
                                                png_alloc_cb, png_free_cb);
#else
    (void)oom;
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, png_error_cb, png_warning_cb);
#endif
    if (!png) return QKV_ERR_OUT_OF_MEMORY;
    png_infop info = png_create_info_struct(png);
    if (!info) {
        png_destroy_write_struct(&png, NULL);
        return QKV_ERR_OUT_OF_MEMORY;
    }
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_write_struct(&png, &info);
        return *oom ? QKV_ERR_OUT_OF_MEMORY : QKV_ERR_IO;
    }
    png_init_io(png, f);
    png_set_IHDR(png, info, (png_uint_32)c->width, (png_uint_32)c->height, 8, PNG_COLOR_TYPE_RGB,
                 PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_write_info(png, info);
    for (int64_t y = 0; y < c->height; y++) png_write_row(png, c->rgb + 3 * y * c->width);
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    return QKV_OK;
}

static atomic_uint g_tmp_seq;

qkv_status viz_png_save(const char *path, const viz_canvas *c) {
    if (!path || !c || !c->rgb) return QKV_ERR_NULL_POINTER;
    if (!path[0]) return QKV_ERR_IO;
    size_t tcap = strlen(path) + 48;
    char *tmp = qkv_alloc(tcap);
    if (!tmp) return QKV_ERR_OUT_OF_MEMORY;
    /* A fresh file next to path (O_EXCL: never an existing file or link),
     * renamed over path once complete and synced. */
    int fd = -1;
    for (int attempt = 0; attempt < 100 && fd < 0; attempt++) {
        snprintf(tmp, tcap, "%s.tmp%ld.%u", path, (long)getpid(), atomic_fetch_add(&g_tmp_seq, 1u));
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
        qkv_free(tmp);
        return QKV_ERR_IO;
    }
    FILE *f = fdopen(fd, "wb");
    if (!f) {
        close(fd);
        unlink(tmp);
        qkv_free(tmp);
        return QKV_ERR_IO;
    }
    int oom = 0;
    qkv_status s = write_png(f, c, &oom);
    if (s == QKV_OK && (fflush(f) != 0 || fsync(fd) != 0)) s = QKV_ERR_IO;
    if (fclose(f) != 0 && s == QKV_OK) s = QKV_ERR_IO;
    if (s == QKV_OK && rename(tmp, path) != 0) s = QKV_ERR_IO;
    if (s != QKV_OK) unlink(tmp);
    qkv_free(tmp);
    return s;
}
