/* Attention heatmaps: PNG (cells coloured by weight, tokens on both axes,
 * optional values in the cells, a colour bar) and ANSI-coloured text. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/internal.h"
#include "viz/viz_internal.h"

#define LABEL_MAX 12 /* longer labels are cut */

void qkv_heatmap_init(qkv_heatmap *h, const float *values, int64_t rows, int64_t cols) {
    if (!h) return;
    memset(h, 0, sizeof *h);
    h->panels = 1;
    h->rows = rows;
    h->cols = cols;
    h->values = values;
}

static qkv_status check(const qkv_heatmap *h) {
    if (!h || !h->values) return QKV_ERR_NULL_POINTER;
    if (h->panels < 1 || h->rows < 1 || h->cols < 1 || h->cell < 0) return QKV_ERR_BAD_SIZE;
    if (h->panels > 64 || h->rows > 4096 || h->cols > 4096 || h->cell > 256) return QKV_ERR_SIZE_OVERFLOW;
    if (h->vmin != h->vmin || h->vmax != h->vmax || isinf(h->vmin) || isinf(h->vmax)) return QKV_ERR_BAD_PARAMETER;
    return QKV_OK;
}

/* The colour range: the caller's, or [min(0, min), max] of the finite values. */
static void value_range(const qkv_heatmap *h, double *lo, double *hi) {
    if (h->vmin < h->vmax) {
        *lo = h->vmin;
        *hi = h->vmax;
        return;
    }
    double a = 0.0, b = -INFINITY;
    int64_t n = h->panels * h->rows * h->cols;
    for (int64_t i = 0; i < n; i++) {
        double v = h->values[i];
        if (!isfinite(v)) continue;
        if (v < a) a = v;
        if (v > b) b = v;
    }
    if (!(b > a)) b = a + 1.0;
    *lo = a;
    *hi = b;
}

/* A label cut to LABEL_MAX characters, or the index when there is none. */
static void label_of(const char *const *labels, int64_t i, char *buf, size_t cap) {
    if (labels && labels[i]) {
        snprintf(buf, cap, "%.*s", LABEL_MAX, labels[i]);
    } else {
        snprintf(buf, cap, "%lld", (long long)i);
    }
}

static void format_cell(char *buf, size_t cap, double v) {
    if (v != v)
        snprintf(buf, cap, "nan");
    else if (v >= 0.0 && v < 0.995)
        snprintf(buf, cap, ".%02d", (int)lround(v * 100.0)); /* attention weights: ".42" */
    else
        viz_format_number(buf, cap, v, 2);
}

qkv_status qkv_heatmap_save_png(const char *path, const qkv_heatmap *h) {
    qkv_status s = check(h);
    if (s != QKV_OK) return s;
    if (!path) return QKV_ERR_NULL_POINTER;
    const int64_t P = h->panels, R = h->rows, C = h->cols;
    int64_t cell = h->cell;
    if (cell == 0) {
        int64_t big = R > C ? R : C;
        cell = 480 / big;
        if (cell > 48) cell = 48;
        if (cell < 3) cell = 3;
    }
    /* Labels read at twice the font size when the cells are large enough. */
    const int ls = cell >= 24 ? 2 : 1;
    int64_t row_w = 0, col_h = 0, panel_title_h = 0;
    char buf[64];
    for (int64_t i = 0; i < R; i++) {
        label_of(h->row_labels, i, buf, sizeof buf);
        int64_t w = viz_text_width(buf, ls);
        if (w > row_w) row_w = w;
    }
    for (int64_t j = 0; j < C; j++) {
        label_of(h->col_labels, j, buf, sizeof buf);
        int64_t w = viz_text_width(buf, ls);
        if (w > col_h) col_h = w;
    }
    if (h->panel_titles) panel_title_h = VIZ_GLYPH_H * 2 + 6;
    const int64_t pad = 10, gap = 24, bar_w = 14;
    const int64_t title_h = h->title ? VIZ_GLYPH_H * 2 + 10 : 0;
    const int64_t left = pad + row_w + 6, top = pad + title_h + panel_title_h + col_h + 6;
    const int64_t map_w = C * cell, map_h = R * cell;
    int64_t bar_label_w = 0;
    double lo, hi;
    value_range(h, &lo, &hi);
    char lo_s[32], hi_s[32];
    viz_format_number(lo_s, sizeof lo_s, lo, 3);
    viz_format_number(hi_s, sizeof hi_s, hi, 3);
    bar_label_w = viz_text_width(strlen(lo_s) > strlen(hi_s) ? lo_s : hi_s, 1);
    int64_t width = left + P * map_w + (P - 1) * gap + gap + bar_w + 6 + bar_label_w + pad;
    int64_t height = top + map_h + pad;
    if (h->title) {
        int64_t tw = 2 * pad + viz_text_width(h->title, 2);
        if (tw > width) width = tw;
    }
    if (width > VIZ_MAX_SIDE || height > VIZ_MAX_SIDE) return QKV_ERR_SIZE_OVERFLOW;

    const viz_rgb white = {255, 255, 255}, black = {0, 0, 0}, grey = {90, 90, 90};
    viz_canvas cv;
    s = viz_canvas_init(&cv, width, height, white);
    if (s != QKV_OK) return s;
    if (h->title) viz_text(&cv, pad, pad, h->title, 2, black);
    for (int64_t p = 0; p < P; p++) {
        const int64_t x0 = left + p * (map_w + gap);
        if (h->panel_titles && h->panel_titles[p]) {
            snprintf(buf, sizeof buf, "%.40s", h->panel_titles[p]);
            viz_text(&cv, x0, pad + title_h, buf, 2, black);
        }
        for (int64_t j = 0; j < C; j++) {
            label_of(h->col_labels, j, buf, sizeof buf);
            /* Vertical, reading upwards, ending just above the column. */
            int64_t tw = viz_text_width(buf, ls);
            viz_text_vertical(&cv, x0 + j * cell + (cell - 7 * ls) / 2, top - 6 - tw, buf, ls, grey);
        }
        for (int64_t i = 0; i < R; i++) {
            if (p == 0) {
                label_of(h->row_labels, i, buf, sizeof buf);
                viz_text(&cv, left - 6 - viz_text_width(buf, ls), top + i * cell + (cell - 7 * ls) / 2, buf, ls,
                         grey);
            }
            for (int64_t j = 0; j < C; j++) {
                double v = h->values[(p * R + i) * C + j];
                viz_rgb col = viz_colormap_sequential((v - lo) / (hi - lo));
                viz_fill_rect(&cv, x0 + j * cell, top + i * cell, cell, cell, col);
                if (h->show_values) {
                    format_cell(buf, sizeof buf, v);
                    int64_t tw = viz_text_width(buf, 1);
                    if (tw + 4 <= cell && cell >= 11)
                        viz_text(&cv, x0 + j * cell + (cell - tw) / 2, top + i * cell + (cell - 7) / 2, buf, 1,
                                 viz_contrast(col));
                }
            }
        }
    }
    /* Colour bar: hi at the top, lo at the bottom. */
    const int64_t bx = left + P * map_w + (P - 1) * gap + gap;
    for (int64_t y = 0; y < map_h; y++)
        viz_fill_rect(&cv, bx, top + y, bar_w, 1,
                      viz_colormap_sequential(map_h > 1 ? 1.0 - (double)y / (double)(map_h - 1) : 1.0));
    viz_text(&cv, bx + bar_w + 6, top, hi_s, 1, black);
    viz_text(&cv, bx + bar_w + 6, top + map_h - 7, lo_s, 1, black);
    s = viz_png_save(path, &cv);
    viz_canvas_free(&cv);
    return s;
}

/* ---- terminal -------------------------------------------------------------- */

/* Text appended to a caller's buffer, counting what does not fit. */
typedef struct sink {
    char *buf;
    size_t cap, len;
} sink;

static void put_str(sink *k, const char *s) {
    size_t n = strlen(s);
    if (k->buf && k->len + n < k->cap) memcpy(k->buf + k->len, s, n);
    k->len += n;
}

static void put_pad(sink *k, const char *s, int64_t width, int right_align) {
    char buf[64];
    int64_t n = (int64_t)strlen(s);
    if (n > width) n = width;
    snprintf(buf, sizeof buf, "%.*s", (int)n, s);
    /* Bytes the terminal would not show as one character become '?'. */
    for (char *c = buf; *c; c++)
        if ((unsigned char)*c < 32 || (unsigned char)*c > 126) *c = '?';
    if (right_align)
        for (int64_t i = n; i < width; i++) put_str(k, " ");
    put_str(k, buf);
    if (!right_align)
        for (int64_t i = n; i < width; i++) put_str(k, " ");
}

static int cube(unsigned char v) { return v < 48 ? 0 : v < 115 ? 1 : (v - 35) / 40; }

static void put_color(sink *k, int background, viz_rgb c, qkv_ansi_colors mode) {
    char buf[48];
    if (mode == QKV_ANSI_256)
        snprintf(buf, sizeof buf, "\x1b[%d;5;%dm", background ? 48 : 38, 16 + 36 * cube(c.r) + 6 * cube(c.g) + cube(c.b));
    else
        snprintf(buf, sizeof buf, "\x1b[%d;2;%d;%d;%dm", background ? 48 : 38, c.r, c.g, c.b);
    put_str(k, buf);
}

qkv_status qkv_heatmap_format_ansi(const qkv_heatmap *h, qkv_ansi_colors colors, char *buf, size_t cap,
                                   size_t *len) {
    qkv_status s = check(h);
    if (s != QKV_OK) return s;
    if (!len) return QKV_ERR_NULL_POINTER;
    if (colors != QKV_ANSI_24BIT && colors != QKV_ANSI_256) return QKV_ERR_BAD_ENUM;
    const int64_t P = h->panels, R = h->rows, C = h->cols;
    sink k = {buf, buf ? cap : 0, 0};
    char lab[64];
    int64_t row_w = 1, col_w = 1;
    for (int64_t i = 0; i < R; i++) {
        label_of(h->row_labels, i, lab, sizeof lab);
        if ((int64_t)strlen(lab) > row_w) row_w = (int64_t)strlen(lab);
    }
    for (int64_t j = 0; j < C; j++) {
        label_of(h->col_labels, j, lab, sizeof lab);
        if ((int64_t)strlen(lab) > col_w) col_w = (int64_t)strlen(lab);
    }
    /* Each cell is w characters: room for the value, or for the key's label
     * (cut to 6 characters) and a space. */
    int64_t w = col_w + 1 < 2 ? 2 : col_w + 1;
    if (w > 7) w = 7;
    if (h->show_values && w < 4) w = 4;
    double lo, hi;
    value_range(h, &lo, &hi);
    const int64_t panel_w = row_w + 1 + C * w;
    if (h->title) {
        put_str(&k, h->title);
        put_str(&k, "\n");
    }
    if (h->panel_titles) {
        for (int64_t p = 0; p < P; p++) {
            put_pad(&k, h->panel_titles[p] ? h->panel_titles[p] : "", panel_w, 0);
            put_str(&k, p + 1 < P ? "   " : "\n");
        }
    }
    for (int64_t p = 0; p < P; p++) {
        put_pad(&k, "", row_w + 1, 0);
        for (int64_t j = 0; j < C; j++) {
            label_of(h->col_labels, j, lab, sizeof lab);
            put_pad(&k, lab, w - 1, 0);
            put_str(&k, " ");
        }
        put_str(&k, p + 1 < P ? "   " : "\n");
    }
    for (int64_t i = 0; i < R; i++) {
        for (int64_t p = 0; p < P; p++) {
            label_of(h->row_labels, i, lab, sizeof lab);
            put_pad(&k, lab, row_w, 1);
            put_str(&k, " ");
            for (int64_t j = 0; j < C; j++) {
                double v = h->values[(p * R + i) * C + j];
                viz_rgb col = viz_colormap_sequential((v - lo) / (hi - lo));
                put_color(&k, 1, col, colors);
                if (h->show_values) {
                    char cellbuf[32];
                    format_cell(cellbuf, sizeof cellbuf, v);
                    put_color(&k, 0, viz_contrast(col), colors);
                    /* Centred: the value's first digit under the key's label. */
                    put_str(&k, " ");
                    put_pad(&k, cellbuf, w - 1, 0);
                } else {
                    put_pad(&k, "", w, 0);
                }
                put_str(&k, "\x1b[0m");
            }
            put_str(&k, p + 1 < P ? "   " : "\n");
        }
    }
    /* The scale: ten steps from lo to hi. */
    char num[32];
    viz_format_number(num, sizeof num, lo, 3);
    put_pad(&k, "", row_w + 1, 0);
    put_str(&k, num);
    put_str(&k, " ");
    for (int t = 0; t < 10; t++) {
        put_color(&k, 1, viz_colormap_sequential(t / 9.0), colors);
        put_str(&k, "  \x1b[0m");
    }
    viz_format_number(num, sizeof num, hi, 3);
    put_str(&k, " ");
    put_str(&k, num);
    put_str(&k, "\n");

    *len = k.len;
    if (!buf) return QKV_OK;
    if (k.len >= cap) {
        if (cap > 0) buf[0] = '\0';
        return QKV_ERR_BAD_SIZE;
    }
    buf[k.len] = '\0';
    return QKV_OK;
}
