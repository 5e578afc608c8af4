/* The library's PNG reader and writer (libpng), shared by the image I/O
 * (src/image) and the pictures (src/viz). Internal. */
#ifndef QKV_IMAGE_PNG_IO_H
#define QKV_IMAGE_PNG_IO_H

#include <stddef.h>
#include <stdint.h>

#include "io/atomic_write.h"
#include "qkv.h"

/* Decode a PNG held in memory (its signature already checked) into *out, as
 * qkv_image_parse documents; on failure *out stays zeroed and a one-line
 * reason goes to why. QKV_ERR_UNSUPPORTED in a build without libpng. */
qkv_status image_png_parse(const unsigned char *p, size_t len, qkv_image *out, char *why, size_t why_len);

/* The 8-bit samples of row y (width * channels bytes): either written into
 * buf (that many bytes) and buf returned, or a pointer to the caller's own
 * row. */
typedef const unsigned char *(*image_png_row_fn)(void *user, int64_t y, unsigned char *buf);

/* Write a width x height 8-bit PNG of 1..4 channels (gray, gray+alpha, RGB,
 * RGBA; sides 1 .. 2^31 - 1, checked by the caller), row by row from row(),
 * atomically (io/atomic_write.h): no failure leaves a file behind. Errors:
 * QKV_ERR_OUT_OF_MEMORY, QKV_ERR_IO; QKV_ERR_UNSUPPORTED in a build without
 * libpng (nothing is written). */
qkv_status image_png_save(const char *path, int64_t width, int64_t height, int channels,
                          image_png_row_fn row, void *user);

#endif
