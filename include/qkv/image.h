/*
 * qkv/image.h - images and pictures: loading and saving images (PNG,
 * binary PGM/PPM), attention heatmaps (PNG and terminal text), line plots
 * and matrix pictures.
 *
 * PNG is an optional part of the build (CMake option QKV_WITH_PNG, on by
 * default; it needs libpng). qkv/config.h tells which build this is:
 * QKV_WITH_PNG is 1 when qkv was built with libpng, 0 when not. Every
 * function here exists in both builds; without PNG, those that read or
 * write PNG files (qkv_image_parse and qkv_image_load of a PNG,
 * qkv_image_save_png, qkv_heatmap_save_png, qkv_plot_save_png,
 * qkv_loss_curve_save_png, qkv_matrix_save_png) check their arguments as
 * usual, then return QKV_ERR_UNSUPPORTED, writing nothing. PGM/PPM images
 * and the terminal heatmap work in every build.
 */
#ifndef QKV_IMAGE_H
#define QKV_IMAGE_H

#include "qkv/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------- */
/* Images.
 *
 * An image (or a feature map) of H x W pixels with C channels is stored
 * [H, W, C] row-major: it *is* H*W vectors of dimension C, the sequence the
 * attention core takes (pixel p = y*W + x). Loaded images hold floats in
 * [0, 1]. */

typedef struct qkv_image {
    int64_t height, width, channels;    /* H, W, C */
    float *data;                        /* [H, W, C]; owned: free with qkv_image_free */
} qkv_image;

/* H*W*C, or 0 for NULL, a negative size or an overflowing product. */
QKV_API int64_t qkv_image_count(const qkv_image *img);

/* A zero-filled image (H, W, C >= 1). Errors: QKV_ERR_NULL_POINTER,
 * QKV_ERR_BAD_SIZE, QKV_ERR_SIZE_OVERFLOW, QKV_ERR_OUT_OF_MEMORY (then *out
 * is zeroed). */
QKV_API qkv_status qkv_image_alloc(qkv_image *out, int64_t height, int64_t width, int64_t channels);

/* Free an image's data and zero it; NULL and zeroed images are fine. */
QKV_API void qkv_image_free(qkv_image *img);

/* Decode an in-memory image, the format told by its first bytes:
 *   PNG (libpng): 8-bit gray (C 1), gray+alpha (2), RGB (3), RGBA (4);
 *     palettes become RGB (RGBA with transparency), 1/2/4-bit gray becomes
 *     8-bit, 16-bit samples are scaled to 8 bits; interlaced files work.
 *   binary PGM (P5, C 1) and PPM (P6, C 3), maxval 1..65535 (2-byte
 *     big-endian samples above 255); samples above maxval are clamped.
 * Values are sample / maxval (255 for PNG). Untrusted input: dimensions are
 * checked for overflow and against the bytes present before allocating (a
 * PNG cannot claim more pixels than deflate's 1032:1 ratio allows), and
 * a truncated or corrupt stream is an error. On failure *out is zeroed and a
 * one-line reason (no file name) goes to why[why_len] when why != NULL.
 * Errors: QKV_ERR_NULL_POINTER, QKV_ERR_FORMAT (unknown magic, bad header,
 * truncated or corrupt data, ASCII netpbm), QKV_ERR_SIZE_OVERFLOW,
 * QKV_ERR_OUT_OF_MEMORY. */
QKV_API qkv_status qkv_image_parse(const void *bytes, size_t len, qkv_image *out, char *why, size_t why_len);

/* As qkv_image_parse on the contents of a file; also QKV_ERR_IO. */
QKV_API qkv_status qkv_image_load(const char *path, qkv_image *out, char *why, size_t why_len);

/* Write an 8-bit PNG (C 1..4: gray, gray+alpha, RGB, RGBA) or a binary
 * PGM/PPM (C 1 or 3, maxval 255). Values are clamped to [0, 1] and rounded
 * to v*255 (NaN writes 0). Atomic like qkv_npy_save: a temporary file in the
 * same folder, renamed over path when complete. Errors:
 * QKV_ERR_NULL_POINTER, QKV_ERR_BAD_SIZE, QKV_ERR_SHAPE (a channel count the
 * format cannot hold), QKV_ERR_SIZE_OVERFLOW (a side over 2^31 - 1),
 * QKV_ERR_OUT_OF_MEMORY, QKV_ERR_IO. */
QKV_API qkv_status qkv_image_save_png(const char *path, const qkv_image *img);
QKV_API qkv_status qkv_image_save_pnm(const char *path, const qkv_image *img);

/* ------------------------------------------------------------------------- */
/* Pictures: attention heatmaps (per layer and head) as PNG files and as
 * coloured text for a terminal, line plots such as loss curves, and matrix
 * images such as the sinusoidal positional encoding (the articles' figure,
 * one column per position's e^i).
 *
 * PNGs are 8-bit RGB written with libpng, atomically like qkv_npy_save: a
 * temporary file in the same folder, renamed over the path when complete, so
 * no failure leaves a partial or broken file (and an existing file at path
 * stays as it was). Labels, titles and ticks are drawn with a built-in 5x7
 * bitmap font: printable ASCII; any other byte is drawn as '?'. The
 * functions here never print: the terminal heatmap is returned as text. */

/* One attention matrix, or several drawn side by side (the heads of a
 * layer). Initialise with qkv_heatmap_init, then set what you want. */
typedef struct qkv_heatmap {
    int64_t panels;                   /* P maps side by side, 1 .. 64 (default 1) */
    int64_t rows, cols;               /* each map rows x cols (queries x keys), 1 .. 4096 */
    const float *values;              /* [P, rows, cols] (borrowed); NaN is drawn grey */
    const char *const *row_labels;    /* [rows] query tokens, or NULL for 0, 1, ...; cut to 12 chars */
    const char *const *col_labels;    /* [cols] key tokens, or NULL */
    const char *const *panel_titles;  /* [P] ("head 0", ...), or NULL */
    const char *title;                /* above everything, or NULL */
    double vmin, vmax;                /* colour range; vmin >= vmax (default): [min(0, min), max] of
                                         the finite values */
    int show_values;                  /* write each value in its cell (".42") where it fits */
    int64_t cell;                     /* PNG cell side in pixels, 0 .. 256; 0 (default): from the size */
} qkv_heatmap;

/* Defaults (above) for one rows x cols map of values. NULL h is ignored. */
QKV_API void qkv_heatmap_init(qkv_heatmap *h, const float *values, int64_t rows, int64_t cols);

/* A PNG: the maps coloured dark blue (low) .. yellow (high), row labels on
 * the left (queries), column labels written upwards above each map (keys),
 * the panel titles, the title and a colour bar. Errors:
 * QKV_ERR_NULL_POINTER (path, h or values), QKV_ERR_BAD_SIZE (a size < 1 or
 * cell < 0), QKV_ERR_SIZE_OVERFLOW (sizes above the limits, or a picture
 * over 16384 pixels on a side), QKV_ERR_BAD_PARAMETER (vmin or vmax not
 * finite), QKV_ERR_OUT_OF_MEMORY, QKV_ERR_IO (cannot create or write the file,
 * e.g. a missing folder; nothing is left behind). */
QKV_API qkv_status qkv_heatmap_save_png(const char *path, const qkv_heatmap *h);

typedef enum qkv_ansi_colors {
    QKV_ANSI_24BIT = 0,         /* "\x1b[48;2;R;G;Bm": most terminals today */
    QKV_ANSI_256 = 1            /* the xterm 256-colour cube */
} qkv_ansi_colors;

/* The heatmap as text for a terminal: a header line of key labels (each cut
 * to the cell width, at most 6 characters), then one line per query: its
 * label and one coloured block per key (with the value when show_values),
 * panels side by side, and a colour scale line; lines end in '\n', every
 * colour is reset at the end of its cell. The caller decides whether its
 * output is a terminal. *len receives the text's length (without the
 * terminating NUL) in every successful case. buf == NULL asks for the length
 * only; otherwise cap must exceed it (else QKV_ERR_BAD_SIZE and buf holds ""),
 * and buf receives the NUL-terminated text. Errors: those of
 * qkv_heatmap_save_png that concern h, QKV_ERR_NULL_POINTER (len),
 * QKV_ERR_BAD_ENUM (colors). */
QKV_API qkv_status qkv_heatmap_format_ansi(const qkv_heatmap *h, qkv_ansi_colors colors, char *buf, size_t cap,
                                           size_t *len);

/* Line plots: up to 8 series, each a polyline in its own colour. */
typedef struct qkv_plot_series {
    const char *label;          /* legend entry, or NULL (no entry) */
    const double *x;            /* [count] (borrowed), or NULL for 0, 1, 2, ... */
    const double *y;            /* [count] (borrowed); a non-finite point is a gap in the line */
    int64_t count;              /* >= 0 */
} qkv_plot_series;

typedef struct qkv_plot {
    const char *title, *x_label, *y_label;    /* each optional (NULL) */
    const qkv_plot_series *series;
    int64_t n_series;                         /* 1 .. 8 */
    int log_x, log_y;           /* logarithmic axis (points <= 0 on it are left out) */
    int markers;                /* a dot on every point */
    int64_t width, height;      /* pixels; 0 means 720 x 440; at least 200 x 150 */
} qkv_plot;

/* All zero: no titles, no series, linear axes, default size. */
QKV_API void qkv_plot_init(qkv_plot *p);

/* A PNG with axes, grid, tick labels (1-2-5 steps; on a log axis decades,
 * plus 2x and 5x when at most three decades show), axis labels, title and
 * a legend of the labelled series. The axes span the usable points (all of
 * the series together); with none, [0, 1]. Errors: QKV_ERR_NULL_POINTER
 * (path, p, series, or y of a non-empty series), QKV_ERR_BAD_SIZE (n_series
 * outside 1..8, a negative count, a size too small), QKV_ERR_SIZE_OVERFLOW,
 * QKV_ERR_OUT_OF_MEMORY, QKV_ERR_IO (nothing left behind). */
QKV_API qkv_status qkv_plot_save_png(const char *path, const qkv_plot *p);

/* A loss curve: loss[i] against steps[i] (steps NULL: 0, 1, ...), titled
 * `title` (NULL: "training loss"), axes "step" and "loss". Errors as
 * qkv_plot_save_png; QKV_ERR_BAD_SIZE for count < 1. */
QKV_API qkv_status qkv_loss_curve_save_png(const char *path, const double *steps, const double *loss, int64_t count,
                                           const char *title);

/* A matrix m [rows, cols] (row-major) as coloured cells: blue (negative),
 * white (0), red (positive), symmetric about 0 at the largest |value|, with
 * row and column indices, optional title and axis labels, and a colour bar.
 * For the positional-encoding figure pass the transpose of
 * qkv_posenc_sinusoidal's [n, E] output, so that column i is e^i. Errors:
 * QKV_ERR_NULL_POINTER, QKV_ERR_BAD_SIZE (rows or cols < 1),
 * QKV_ERR_SIZE_OVERFLOW (above 4096), QKV_ERR_OUT_OF_MEMORY, QKV_ERR_IO. */
QKV_API qkv_status qkv_matrix_save_png(const char *path, const float *m, int64_t rows, int64_t cols, const char *title,
                                       const char *x_label, const char *y_label);

#ifdef __cplusplus
}
#endif

#endif /* QKV_IMAGE_H */
