/* The RGB canvas the pictures are drawn on: rectangles, thick lines, text in
 * the built-in font, colour maps, and its PNG file (through the library's
 * one PNG writer, image/png_io.h). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/internal.h"
#include "image/png_io.h"
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

static const unsigned char *canvas_row(void *user, int64_t y, unsigned char *buf) {
    (void)buf;
    const viz_canvas *c = user;
    return c->rgb + 3 * y * c->width;
}

qkv_status viz_png_save(const char *path, const viz_canvas *c) {
    if (!path || !c || !c->rgb) return QKV_ERR_NULL_POINTER;
    return image_png_save(path, c->width, c->height, 3, canvas_row, (void *)c);
}
