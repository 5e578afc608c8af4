/* Line plots (loss curves, measurements against a parameter) and matrix
 * images (the positional-encoding figure of the articles). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/internal.h"
#include "viz/viz_internal.h"

#define MAX_SERIES 8

static const viz_rgb palette[MAX_SERIES] = {{31, 119, 180}, {255, 127, 14}, {44, 160, 44},  {214, 39, 40},
                                            {148, 103, 189}, {140, 86, 75}, {227, 119, 194}, {127, 127, 127}};

void qkv_plot_init(qkv_plot *p) {
    if (p) memset(p, 0, sizeof *p);
}

/* An axis: data range [lo, hi] (in log10 units on a log axis) and its ticks. */
typedef struct axis {
    int log;
    double lo, hi;
    double ticks[32];
    int n_ticks;
} axis;

static double nice_step(double range, int target) {
    double raw = range / target, mag = pow(10.0, floor(log10(raw))), f = raw / mag;
    return (f <= 1.0 ? 1.0 : f <= 2.0 ? 2.0 : f <= 5.0 ? 5.0 : 10.0) * mag;
}

static void axis_ticks(axis *a) {
    a->n_ticks = 0;
    if (a->log) {
        /* Decades; with at most three of them also 2x and 5x. */
        int d0 = (int)floor(a->lo), d1 = (int)ceil(a->hi);
        int dense = d1 - d0 <= 3;
        for (int d = d0; d <= d1 && a->n_ticks < 32; d++) {
            static const double mult[3] = {1, 2, 5};
            for (int m = 0; m < (dense ? 3 : 1) && a->n_ticks < 32; m++) {
                double t = d + log10(mult[m]);
                if (t >= a->lo - 1e-9 && t <= a->hi + 1e-9) a->ticks[a->n_ticks++] = t;
            }
        }
        return;
    }
    double step = nice_step(a->hi - a->lo, 5);
    for (double t = ceil(a->lo / step - 1e-9) * step; t <= a->hi + 1e-9 * step && a->n_ticks < 32; t += step)
        a->ticks[a->n_ticks++] = fabs(t) < 1e-12 * step ? 0.0 : t;
}

static int usable(double v, int log) { return isfinite(v) && (!log || v > 0.0); }
static double tr(double v, int log) { return log ? log10(v) : v; }

/* The data range of one coordinate over every series, padded a little. */
static void axis_range(axis *a, const qkv_plot *p, int is_y) {
    double lo = INFINITY, hi = -INFINITY;
    for (int64_t s = 0; s < p->n_series; s++) {
        const qkv_plot_series *se = &p->series[s];
        for (int64_t i = 0; i < se->count; i++) {
            double x = se->x ? se->x[i] : (double)i, y = se->y[i];
            if (!usable(x, p->log_x) || !usable(y, p->log_y)) continue;
            double v = tr(is_y ? y : x, a->log);
            if (v < lo) lo = v;
            if (v > hi) hi = v;
        }
    }
    if (!(lo <= hi)) {
        lo = 0.0;
        hi = 1.0;
    }
    if (hi - lo < 1e-12 * (fabs(lo) + 1.0)) {
        double d = a->log ? 0.5 : (fabs(lo) > 0 ? fabs(lo) * 0.1 : 1.0);
        lo -= d;
        hi += d;
    }
    if (is_y || a->log) {
        double m = (hi - lo) * 0.05;
        lo -= m;
        hi += m;
    }
    a->lo = lo;
    a->hi = hi;
}

static void tick_text(char *buf, size_t cap, double t, int log) {
    viz_format_number(buf, cap, log ? pow(10.0, t) : t, 4);
}

qkv_status qkv_plot_save_png(const char *path, const qkv_plot *p) {
    if (!path || !p || !p->series) return QKV_ERR_NULL_POINTER;
    if (p->n_series < 1 || p->n_series > MAX_SERIES || p->width < 0 || p->height < 0) return QKV_ERR_BAD_SIZE;
    for (int64_t s = 0; s < p->n_series; s++) {
        if (p->series[s].count < 0) return QKV_ERR_BAD_SIZE;
        if (p->series[s].count > 0 && !p->series[s].y) return QKV_ERR_NULL_POINTER;
    }
    const int64_t W = p->width ? p->width : 720, H = p->height ? p->height : 440;
    if (W < 200 || H < 150) return QKV_ERR_BAD_SIZE;
    if (W > VIZ_MAX_SIDE || H > VIZ_MAX_SIDE) return QKV_ERR_SIZE_OVERFLOW;

    axis ax = {.log = p->log_x != 0}, ay = {.log = p->log_y != 0};
    axis_range(&ax, p, 0);
    axis_range(&ay, p, 1);
    axis_ticks(&ax);
    axis_ticks(&ay);
    char buf[64];
    int64_t ytick_w = 0;
    for (int i = 0; i < ay.n_ticks; i++) {
        tick_text(buf, sizeof buf, ay.ticks[i], ay.log);
        int64_t w = viz_text_width(buf, 1);
        if (w > ytick_w) ytick_w = w;
    }
    const int64_t left = 12 + (p->y_label ? VIZ_GLYPH_H + 6 : 0) + ytick_w + 8;
    const int64_t top = p->title ? 16 + 2 * VIZ_GLYPH_H : 16;
    const int64_t bottom = 12 + VIZ_GLYPH_H + 6 + (p->x_label ? VIZ_GLYPH_H + 8 : 0);
    const int64_t right = 20;
    const int64_t pw = W - left - right, ph = H - top - bottom;
    if (pw < 50 || ph < 50) return QKV_ERR_BAD_SIZE;

    const viz_rgb white = {255, 255, 255}, black = {0, 0, 0}, light = {225, 225, 225}, grey = {70, 70, 70};
    viz_canvas cv;
    qkv_status s = viz_canvas_init(&cv, W, H, white);
    if (s != QKV_OK) return s;
#define PX(v) (left + (int64_t)lround(((v) - ax.lo) / (ax.hi - ax.lo) * (double)(pw - 1)))
#define PY(v) (top + ph - 1 - (int64_t)lround(((v) - ay.lo) / (ay.hi - ay.lo) * (double)(ph - 1)))
    /* Grid and tick labels. */
    for (int i = 0; i < ax.n_ticks; i++) {
        int64_t x = PX(ax.ticks[i]);
        viz_fill_rect(&cv, x, top, 1, ph, light);
        viz_fill_rect(&cv, x, top + ph, 1, 4, black);
        tick_text(buf, sizeof buf, ax.ticks[i], ax.log);
        viz_text(&cv, x - viz_text_width(buf, 1) / 2, top + ph + 7, buf, 1, grey);
    }
    for (int i = 0; i < ay.n_ticks; i++) {
        int64_t y = PY(ay.ticks[i]);
        viz_fill_rect(&cv, left, y, pw, 1, light);
        viz_fill_rect(&cv, left - 4, y, 4, 1, black);
        tick_text(buf, sizeof buf, ay.ticks[i], ay.log);
        viz_text(&cv, left - 7 - viz_text_width(buf, 1), y - 3, buf, 1, grey);
    }
    /* Axes. */
    viz_fill_rect(&cv, left, top, 1, ph, black);
    viz_fill_rect(&cv, left, top + ph - 1, pw, 1, black);
    if (p->title) {
        /* Twice the font size when the title fits, else the plain size. */
        int ts = viz_text_width(p->title, 2) <= W - left - 8 ? 2 : 1;
        viz_text(&cv, ts == 2 ? left : 8, ts == 2 ? 8 : 12, p->title, ts, black);
    }
    if (p->x_label)
        viz_text(&cv, left + (pw - viz_text_width(p->x_label, 1)) / 2, H - 8 - VIZ_GLYPH_H, p->x_label, 1, black);
    if (p->y_label) viz_text_vertical(&cv, 10, top + (ph - viz_text_width(p->y_label, 1)) / 2, p->y_label, 1, black);
    /* The series: lines between consecutive usable points (a gap at others). */
    for (int64_t si = 0; si < p->n_series; si++) {
        const qkv_plot_series *se = &p->series[si];
        int have = 0;
        int64_t px = 0, py = 0;
        for (int64_t i = 0; i < se->count; i++) {
            double x = se->x ? se->x[i] : (double)i, y = se->y[i];
            if (!usable(x, p->log_x) || !usable(y, p->log_y)) {
                have = 0;
                continue;
            }
            int64_t cx = PX(tr(x, ax.log)), cy = PY(tr(y, ay.log));
            if (have) viz_line(&cv, px, py, cx, cy, 2, palette[si]);
            if (p->markers) viz_fill_rect(&cv, cx - 2, cy - 2, 5, 5, palette[si]);
            px = cx;
            py = cy;
            have = 1;
        }
    }
#undef PX
#undef PY
    /* Legend, top right inside the plot. */
    int64_t lw = 0, n_lab = 0;
    for (int64_t si = 0; si < p->n_series; si++)
        if (p->series[si].label) {
            int64_t w = viz_text_width(p->series[si].label, 1);
            if (w > lw) lw = w;
            n_lab++;
        }
    if (n_lab > 0) {
        int64_t bw = lw + 34, bh = n_lab * 14 + 8, bx = left + pw - bw - 8, by = top + 8, row = 0;
        /* The corner that covers the fewest data points (top right on a tie). */
        const int64_t cx[4] = {left + pw - bw - 8, left + pw - bw - 8, left + 8, left + 8},
                      cy[4] = {top + 8, top + ph - bh - 8, top + 8, top + ph - bh - 8};
        int64_t best = -1;
        for (int k = 0; k < 4; k++) {
            int64_t hits = 0;
            for (int64_t si = 0; si < p->n_series; si++) {
                const qkv_plot_series *se = &p->series[si];
                for (int64_t i = 0; i < se->count; i++) {
                    double x = se->x ? se->x[i] : (double)i, y = se->y[i];
                    if (!usable(x, p->log_x) || !usable(y, p->log_y)) continue;
                    int64_t X = left + (int64_t)lround((tr(x, ax.log) - ax.lo) / (ax.hi - ax.lo) * (double)(pw - 1));
                    int64_t Y = top + ph - 1 - (int64_t)lround((tr(y, ay.log) - ay.lo) / (ay.hi - ay.lo) * (double)(ph - 1));
                    hits += X >= cx[k] - 4 && X < cx[k] + bw + 4 && Y >= cy[k] - 4 && Y < cy[k] + bh + 4;
                }
            }
            if (best < 0 || hits < best) {
                best = hits;
                bx = cx[k];
                by = cy[k];
            }
        }
        viz_fill_rect(&cv, bx, by, bw, bh, white);
        viz_fill_rect(&cv, bx, by, bw, 1, grey);
        viz_fill_rect(&cv, bx, by + bh - 1, bw, 1, grey);
        viz_fill_rect(&cv, bx, by, 1, bh, grey);
        viz_fill_rect(&cv, bx + bw - 1, by, 1, bh, grey);
        for (int64_t si = 0; si < p->n_series; si++) {
            if (!p->series[si].label) continue;
            int64_t y = by + 6 + row * 14;
            viz_fill_rect(&cv, bx + 6, y + 3, 18, 3, palette[si]);
            viz_text(&cv, bx + 28, y, p->series[si].label, 1, black);
            row++;
        }
    }
    s = viz_png_save(path, &cv);
    viz_canvas_free(&cv);
    return s;
}

qkv_status qkv_loss_curve_save_png(const char *path, const double *steps, const double *loss, int64_t count,
                                   const char *title) {
    if (!loss) return QKV_ERR_NULL_POINTER;
    if (count < 1) return QKV_ERR_BAD_SIZE;
    qkv_plot_series se = {.label = NULL, .x = steps, .y = loss, .count = count};
    qkv_plot p;
    qkv_plot_init(&p);
    p.title = title ? title : "training loss";
    p.x_label = "step";
    p.y_label = "loss";
    p.series = &se;
    p.n_series = 1;
    return qkv_plot_save_png(path, &p);
}

/* ---- matrix images --------------------------------------------------------- */

qkv_status qkv_matrix_save_png(const char *path, const float *m, int64_t rows, int64_t cols, const char *title,
                               const char *x_label, const char *y_label) {
    if (!path || !m) return QKV_ERR_NULL_POINTER;
    if (rows < 1 || cols < 1) return QKV_ERR_BAD_SIZE;
    if (rows > 4096 || cols > 4096) return QKV_ERR_SIZE_OVERFLOW;
    int64_t cell = 640 / (cols > rows ? cols : rows);
    if (cell > 32) cell = 32;
    if (cell < 1) cell = 1;
    double amax = 0.0;
    for (int64_t i = 0; i < rows * cols; i++)
        if (isfinite(m[i]) && fabs(m[i]) > amax) amax = fabs(m[i]);
    if (amax == 0.0) amax = 1.0;
    char buf[64];
    /* Index labels every `every` rows/columns so that they never collide. */
    int64_t every_c = 1, every_r = 1;
    viz_format_number(buf, sizeof buf, (double)(cols - 1), 6);
    while (every_c * cell < viz_text_width(buf, 1) + 6) every_c = every_c < 5 ? (every_c == 1 ? 2 : 5) : every_c * 2;
    while (every_r * cell < VIZ_GLYPH_H + 2) every_r = every_r < 5 ? (every_r == 1 ? 2 : 5) : every_r * 2;
    viz_format_number(buf, sizeof buf, (double)(rows - 1), 6);
    const int64_t rlab_w = viz_text_width(buf, 1);
    const int64_t left = 12 + (y_label ? VIZ_GLYPH_H + 6 : 0) + rlab_w + 6;
    const int64_t top = (title ? 16 + 2 * VIZ_GLYPH_H : 12);
    const int64_t mw = cols * cell, mh = rows * cell, bar_w = 14;
    const int64_t width = left + mw + 20 + bar_w + 6 + 7 * VIZ_GLYPH_W + 10;
    const int64_t height = top + mh + 6 + VIZ_GLYPH_H + (x_label ? VIZ_GLYPH_H + 10 : 0) + 10;
    int64_t W = width;
    if (title && 2 * 10 + viz_text_width(title, 2) > W) W = 2 * 10 + viz_text_width(title, 2);
    if (W > VIZ_MAX_SIDE || height > VIZ_MAX_SIDE) return QKV_ERR_SIZE_OVERFLOW;
    const viz_rgb white = {255, 255, 255}, black = {0, 0, 0}, grey = {70, 70, 70};
    viz_canvas cv;
    qkv_status s = viz_canvas_init(&cv, W, height, white);
    if (s != QKV_OK) return s;
    if (title) viz_text(&cv, 10, 8, title, 2, black);
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++)
            viz_fill_rect(&cv, left + j * cell, top + i * cell, cell, cell,
                          viz_colormap_diverging(0.5 + 0.5 * m[i * cols + j] / amax));
    for (int64_t j = 0; j < cols; j += every_c) {
        viz_format_number(buf, sizeof buf, (double)j, 6);
        viz_text(&cv, left + j * cell + cell / 2 - viz_text_width(buf, 1) / 2, top + mh + 4, buf, 1, grey);
    }
    for (int64_t i = 0; i < rows; i += every_r) {
        viz_format_number(buf, sizeof buf, (double)i, 6);
        viz_text(&cv, left - 5 - viz_text_width(buf, 1), top + i * cell + cell / 2 - 3, buf, 1, grey);
    }
    if (x_label)
        viz_text(&cv, left + (mw - viz_text_width(x_label, 1)) / 2, top + mh + 8 + VIZ_GLYPH_H, x_label, 1, black);
    if (y_label) viz_text_vertical(&cv, 10, top + (mh - viz_text_width(y_label, 1)) / 2, y_label, 1, black);
    const int64_t bx = left + mw + 20;
    for (int64_t y = 0; y < mh; y++)
        viz_fill_rect(&cv, bx, top + y, bar_w, 1,
                      viz_colormap_diverging(mh > 1 ? 1.0 - (double)y / (double)(mh - 1) : 1.0));
    viz_format_number(buf, sizeof buf, amax, 3);
    viz_text(&cv, bx + bar_w + 5, top, buf, 1, black);
    viz_text(&cv, bx + bar_w + 5, top + mh / 2 - 3, "0", 1, black);
    viz_format_number(buf, sizeof buf, -amax, 3);
    viz_text(&cv, bx + bar_w + 5, top + mh - 7, buf, 1, black);
    s = viz_png_save(path, &cv);
    viz_canvas_free(&cv);
    return s;
}
