/* PNG through libpng's classic API: the one PNG reader and the one PNG
 * writer of the library (images, heatmaps, plots). libpng reports errors by
 * longjmp; the error handler here stores the message (no printing) and the
 * allocator hooks route libpng's memory through qkv_alloc. Without libpng
 * (QKV_WITH_PNG=OFF) both return QKV_ERR_UNSUPPORTED. */
#include "image/png_io.h"

#include <stdio.h>
#include <string.h>

#include "core/internal.h"

#if QKV_WITH_PNG

#include <png.h>
#include <setjmp.h>

typedef struct png_ctx {
    jmp_buf jmp;
    char msg[160];
    const unsigned char *src;
    size_t len, pos;
    atomic_file *file;   /* writing */
    int alloc_failed;
} png_ctx;

static void png_err(png_structp png, png_const_charp msg) {
    png_ctx *ctx = png_get_error_ptr(png);
    snprintf(ctx->msg, sizeof ctx->msg, "%s", msg ? msg : "libpng error");
    longjmp(ctx->jmp, 1);
}

static void png_warn(png_structp png, png_const_charp msg) {
    (void)png;
    (void)msg; /* a library does not print */
}

/* No buffer libpng needs for an image we accept (rows, a chunk of data the
 * input really holds) comes near this; a chunk header can claim 2 GiB before
 * its data is read, and some libpng versions allocate that up front
 * (found by fuzz_image: an sPLT chunk of length 0x7f000006). */
#define PNG_ALLOC_CAP ((png_alloc_size_t)256 << 20)

static png_voidp png_mem_alloc(png_structp png, png_alloc_size_t size) {
    void *p = size <= PNG_ALLOC_CAP ? qkv_alloc(size) : NULL;
    if (!p) {
        png_ctx *ctx = png_get_error_ptr(png);
        if (ctx) ctx->alloc_failed = 1;
    }
    return p;
}

static void png_mem_free(png_structp png, png_voidp ptr) {
    (void)png;
    qkv_free(ptr);
}

static void png_read_mem(png_structp png, png_bytep data, size_t n) {
    png_ctx *ctx = png_get_io_ptr(png);
    if (n > ctx->len - ctx->pos) png_error(png, "truncated file");
    memcpy(data, ctx->src + ctx->pos, n);
    ctx->pos += n;
}

/* The state of one decode, kept outside the function that calls setjmp so
 * that nothing it needs after a longjmp lives in a clobberable local. */
typedef struct png_read_job {
    png_ctx ctx;
    png_structp png;
    png_infop info;
    unsigned char *row;
    qkv_image img;
    qkv_status status;
} png_read_job;

static void png_read_body(png_read_job *j) {
    if (setjmp(j->ctx.jmp)) {
        if (j->status == QKV_OK)
            j->status = j->ctx.alloc_failed ? QKV_ERR_OUT_OF_MEMORY : QKV_ERR_FORMAT;
        return;
    }
    png_set_read_fn(j->png, &j->ctx, png_read_mem);
    /* Our own bound on the dimensions (libpng's default is 1e6); the real
     * guard is the size check against the compressed bytes below. */
    png_set_user_limits(j->png, 0x7fffffffu, 0x7fffffffu);
    png_set_chunk_malloc_max(j->png, 64u << 20);
    png_read_info(j->png, j->info);
    png_uint_32 w = png_get_image_width(j->png, j->info), h = png_get_image_height(j->png, j->info);
    int color = png_get_color_type(j->png, j->info);
    int depth = png_get_bit_depth(j->png, j->info);
    /* Palette -> RGB, gray < 8 bits -> 8 bits, tRNS -> alpha; 16 -> 8 bits. */
    if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(j->png);
    if (color == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(j->png);
    if (png_get_valid(j->png, j->info, PNG_INFO_tRNS)) png_set_tRNS_to_alpha(j->png);
    if (depth == 16) png_set_scale_16(j->png);
    int passes = png_set_interlace_handling(j->png);
    png_read_update_info(j->png, j->info);
    int ch = png_get_channels(j->png, j->info);
    size_t rowbytes = png_get_rowbytes(j->png, j->info);
    if (ch < 1 || ch > 4 || png_get_bit_depth(j->png, j->info) != 8 || rowbytes != (size_t)w * (size_t)ch) {
        j->status = QKV_ERR_FORMAT;
        png_error(j->png, "unsupported pixel layout after conversion");
    }
    /* Deflate expands at most 1032:1, so a stream of len bytes cannot hold
     * more than about 1032*len bytes of filtered rows: a header claiming more
     * is a truncated or lying file, refused before allocating. */
    uint64_t raw = (uint64_t)h * ((uint64_t)rowbytes + 1);
    if (raw / 1032u > (uint64_t)j->ctx.len + 1024u) {
        j->status = QKV_ERR_FORMAT;
        snprintf(j->ctx.msg, sizeof j->ctx.msg, "%u x %u pixels cannot fit in a %zu-byte file (truncated?)",
                 (unsigned)w, (unsigned)h, j->ctx.len);
        longjmp(j->ctx.jmp, 1);
    }
    qkv_status s = qkv_image_alloc(&j->img, (int64_t)h, (int64_t)w, ch);
    if (s != QKV_OK) {
        j->status = s;
        snprintf(j->ctx.msg, sizeof j->ctx.msg, "%s", qkv_status_string(s));
        longjmp(j->ctx.jmp, 1);
    }
    size_t plane = (size_t)h * rowbytes;
    if (passes > 1) {
        /* Interlaced: keep the whole byte image (libpng combines passes in it). */
        j->row = qkv_alloc(plane);
        if (!j->row) {
            j->status = QKV_ERR_OUT_OF_MEMORY;
            png_error(j->png, "out of memory");
        }
        for (int pass = 0; pass < passes; pass++)
            for (png_uint_32 y = 0; y < h; y++) png_read_row(j->png, j->row + (size_t)y * rowbytes, NULL);
        for (size_t i = 0; i < plane; i++) j->img.data[i] = (float)j->row[i] / 255.0f;
    } else {
        j->row = qkv_alloc(rowbytes);
        if (!j->row) {
            j->status = QKV_ERR_OUT_OF_MEMORY;
            png_error(j->png, "out of memory");
        }
        for (png_uint_32 y = 0; y < h; y++) {
            png_read_row(j->png, j->row, NULL);
            float *dst = j->img.data + (size_t)y * rowbytes;
            for (size_t i = 0; i < rowbytes; i++) dst[i] = (float)j->row[i] / 255.0f;
        }
    }
    png_read_end(j->png, NULL);
}

qkv_status image_png_parse(const unsigned char *p, size_t len, qkv_image *out, char *why, size_t why_len) {
    png_read_job *j = qkv_alloc_zeroed(sizeof *j);
    if (!j) return QKV_ERR_OUT_OF_MEMORY;
    j->ctx.src = p;
    j->ctx.len = len;
    j->status = QKV_OK;
    j->png = png_create_read_struct_2(PNG_LIBPNG_VER_STRING, &j->ctx, png_err, png_warn, &j->ctx,
                                      png_mem_alloc, png_mem_free);
    if (j->png) j->info = png_create_info_struct(j->png);
    if (!j->png || !j->info) {
        if (j->png) png_destroy_read_struct(&j->png, NULL, NULL);
        qkv_free(j);
        return QKV_ERR_OUT_OF_MEMORY;
    }
    png_read_body(j);
    png_destroy_read_struct(&j->png, &j->info, NULL);
    qkv_free(j->row);
    qkv_status s = j->status;
    if (s == QKV_OK) {
        *out = j->img;
    } else {
        qkv_image_free(&j->img);
        if (why && why_len) snprintf(why, why_len, "PNG: %s", j->ctx.msg[0] ? j->ctx.msg : qkv_status_string(s));
    }
    qkv_free(j);
    return s;
}

/* The writer's output goes to the atomic file; a failed write stops libpng
 * at once (then the file is not kept). */
static void png_write_file(png_structp png, png_bytep data, size_t n) {
    png_ctx *ctx = png_get_io_ptr(png);
    if (atomic_file_write(ctx->file, data, n) != 0) png_error(png, "write failed");
}

static void png_flush_file(png_structp png) { (void)png; }

typedef struct png_write_job {
    png_ctx ctx;
    png_structp png;
    png_infop info;
    unsigned char *row;
    int64_t width, height;
    int channels;
    image_png_row_fn row_fn;
    void *user;
    qkv_status status;
} png_write_job;

static void png_write_body(png_write_job *j) {
    if (setjmp(j->ctx.jmp)) {
        if (j->status == QKV_OK) j->status = j->ctx.alloc_failed ? QKV_ERR_OUT_OF_MEMORY : QKV_ERR_IO;
        return;
    }
    static const int types[5] = {0, PNG_COLOR_TYPE_GRAY, PNG_COLOR_TYPE_GRAY_ALPHA, PNG_COLOR_TYPE_RGB,
                                 PNG_COLOR_TYPE_RGB_ALPHA};
    png_set_write_fn(j->png, &j->ctx, png_write_file, png_flush_file);
    png_set_IHDR(j->png, j->info, (png_uint_32)j->width, (png_uint_32)j->height, 8, types[j->channels],
                 PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_write_info(j->png, j->info);
    for (int64_t y = 0; y < j->height; y++) png_write_row(j->png, j->row_fn(j->user, y, j->row));
    png_write_end(j->png, NULL);
}

qkv_status image_png_save(const char *path, int64_t width, int64_t height, int channels,
                          image_png_row_fn row, void *user) {
    png_write_job *j = qkv_alloc(sizeof *j);
    if (!j) return QKV_ERR_OUT_OF_MEMORY;
    *j = (png_write_job){.width = width, .height = height, .channels = channels, .row_fn = row, .user = user,
                         .status = QKV_OK};
    j->row = qkv_alloc((size_t)width * (size_t)channels);
    atomic_file file;
    qkv_status s = j->row ? atomic_file_open(&file, path) : QKV_ERR_OUT_OF_MEMORY;
    if (s != QKV_OK) {
        qkv_free(j->row);
        qkv_free(j);
        return s;
    }
    j->ctx.file = &file;
    j->png = png_create_write_struct_2(PNG_LIBPNG_VER_STRING, &j->ctx, png_err, png_warn, &j->ctx,
                                       png_mem_alloc, png_mem_free);
    if (j->png) j->info = png_create_info_struct(j->png);
    if (!j->png || !j->info) {
        j->status = QKV_ERR_OUT_OF_MEMORY;
    } else {
        png_write_body(j);
    }
    if (j->png) png_destroy_write_struct(&j->png, j->info ? &j->info : NULL);
    s = j->status;
    qkv_status fs = atomic_file_close(&file, s == QKV_OK);
    if (s == QKV_OK) s = fs;
    qkv_free(j->row);
    qkv_free(j);
    return s;
}

#else /* !QKV_WITH_PNG */

qkv_status image_png_parse(const unsigned char *p, size_t len, qkv_image *out, char *why, size_t why_len) {
    (void)p;
    (void)len;
    (void)out;
    if (why && why_len) snprintf(why, why_len, "PNG: not supported by this build of qkv (built without libpng)");
    return QKV_ERR_UNSUPPORTED;
}

qkv_status image_png_save(const char *path, int64_t width, int64_t height, int channels,
                          image_png_row_fn row, void *user) {
    (void)path;
    (void)width;
    (void)height;
    (void)channels;
    (void)row;
    (void)user;
    return QKV_ERR_UNSUPPORTED;
}

#endif
