/* The pictures' private toolbox: an RGB canvas with rectangles, lines and
 * text in a built-in 5x7 bitmap font, colour maps, and the canvas as a PNG
 * file. Shared by the files of src/viz only. */
#ifndef QKV_VIZ_INTERNAL_H
#define QKV_VIZ_INTERNAL_H

#include <stdint.h>

#include "qkv.h"

/* 8-bit RGB pixels, row-major [height, width, 3]. */
typedef struct viz_canvas {
    int64_t width, height;
    unsigned char *rgb;
} viz_canvas;

typedef struct viz_rgb {
    unsigned char r, g, b;
} viz_rgb;

/* The largest side a picture may have (a guard against absurd sizes). */
#define VIZ_MAX_SIDE 16384

/* A canvas filled with `bg`. QKV_ERR_BAD_SIZE outside 1..VIZ_MAX_SIDE,
 * QKV_ERR_OUT_OF_MEMORY. */
qkv_status viz_canvas_init(viz_canvas *c, int64_t width, int64_t height, viz_rgb bg);
void viz_canvas_free(viz_canvas *c);

/* Drawing clips to the canvas: anything outside is silently not drawn. */
void viz_fill_rect(viz_canvas *c, int64_t x, int64_t y, int64_t w, int64_t h, viz_rgb col);
void viz_line(viz_canvas *c, int64_t x0, int64_t y0, int64_t x1, int64_t y1, int thickness, viz_rgb col);

/* The font: glyphs are 5x7 pixels in a 6x9 cell (one column and two rows of
 * spacing) times `scale`. Bytes outside printable ASCII draw as '?'. */
#define VIZ_GLYPH_W 6
#define VIZ_GLYPH_H 9
int64_t viz_text_width(const char *s, int scale);
void viz_text(viz_canvas *c, int64_t x, int64_t y, const char *s, int scale, viz_rgb col);
/* Text rotated 90 degrees counter-clockwise (reads bottom to top), its
 * lower-left corner at (x, y + width). */
void viz_text_vertical(viz_canvas *c, int64_t x, int64_t y, const char *s, int scale, viz_rgb col);
/* The 7 rows of a glyph, bit 4 the leftmost pixel. */
void viz_glyph_rows(unsigned char ch, unsigned char rows[7]);

/* Colour maps of t in [0, 1] (clamped; NaN gives grey). */
viz_rgb viz_colormap_sequential(double t);   /* dark blue .. green .. yellow (viridis-like) */
viz_rgb viz_colormap_diverging(double t);    /* blue (0) .. white (0.5) .. red (1) */
/* Black or white, whichever reads better on `bg`. */
viz_rgb viz_contrast(viz_rgb bg);

/* Write the canvas as an 8-bit RGB PNG: a temporary file next to path,
 * renamed over it when complete (no partial file on any failure).
 * QKV_ERR_UNSUPPORTED in a build without libpng. */
qkv_status viz_png_save(const char *path, const viz_canvas *c);

/* "%.*g" into buf, with "-0" written as "0". */
void viz_format_number(char *buf, size_t cap, double v, int digits);

#endif
