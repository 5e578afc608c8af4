/* Images in and out: PNG through libpng, binary PGM/PPM (P5/P6) by hand.
 *
 * An image is H x W pixels of C channels, stored [H, W, C] as floats in
 * [0, 1]: exactly H*W vectors of dimension C, the form the attention core
 * takes. Every file is untrusted: dimensions are checked for overflow, the
 * data size is checked against what the bytes can hold before anything is
 * allocated (for PNG with deflate's maximum ratio), and a truncated or
 * corrupt stream is an error, never a crash. libpng reports errors by
 * longjmp; the error handler here stores the message (no printing) and the
 * allocator hooks route libpng's memory through qkv_alloc. */
#define _POSIX_C_SOURCE 200809L /* open/O_EXCL, fsync, getpid, fdopen */

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <png.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/internal.h"

static void set_why(char *why, size_t why_len, const char *fmt, ...) {
    if (!why || why_len == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, why_len, fmt, ap);
    va_end(ap);
}

int64_t qkv_image_count(const qkv_image *img) {
    if (!img || img->height < 0 || img->width < 0 || img->channels < 0) return 0;
    int64_t f[3] = {img->height, img->width, img->channels}, n;
    if (!qkv_count_ok(&n, sizeof(float), 3, f)) return 0;
    return n;
}

qkv_status qkv_image_alloc(qkv_image *out, int64_t height, int64_t width, int64_t channels) {
    if (!out) return QKV_ERR_NULL_POINTER;
    memset(out, 0, sizeof *out);
    if (height <= 0 || width <= 0 || channels <= 0) return QKV_ERR_BAD_SIZE;
    int64_t f[3] = {height, width, channels}, n;
    if (!qkv_count_ok(&n, sizeof(float), 3, f)) return QKV_ERR_SIZE_OVERFLOW;
    float *d = qkv_alloc_zeroed((size_t)n * sizeof(float));
    if (!d) return QKV_ERR_OUT_OF_MEMORY;
    out->height = height;
    out->width = width;
    out->channels = channels;
    out->data = d;
    return QKV_OK;
}

void qkv_image_free(qkv_image *img) {
    if (!img) return;
    qkv_free(img->data);
    memset(img, 0, sizeof *img);
}

/* ------------------------------------------------------------------------- */
/* PGM / PPM (netpbm binary formats P5 and P6). The header is the magic, then
 * width, height and maxval as decimal numbers separated by whitespace, with
 * '#' comments running to the end of a line, then exactly one whitespace
 * byte, then the samples (1 byte each when maxval < 256, else 2 bytes
 * big-endian), row by row. */

typedef struct pnm_cursor {
    const unsigned char *p;
    size_t len, pos;
} pnm_cursor;

static int pnm_is_space(unsigned char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* Skip whitespace and comments, then read a decimal number (at most 10
 * digits, <= limit). Returns 0 on success. */
static int pnm_number(pnm_cursor *c, int64_t limit, int64_t *out) {
    for (;;) {
        if (c->pos >= c->len) return -1;
        unsigned char ch = c->p[c->pos];
        if (pnm_is_space(ch)) {
            c->pos++;
        } else if (ch == '#') {
            while (c->pos < c->len && c->p[c->pos] != '\n' && c->p[c->pos] != '\r') c->pos++;
        } else {
            break;
        }
    }
    int64_t v = 0;
    int digits = 0;
    while (c->pos < c->len && c->p[c->pos] >= '0' && c->p[c->pos] <= '9') {
        if (++digits > 10) return -1;
        v = v * 10 + (c->p[c->pos] - '0');
        c->pos++;
    }
    if (digits == 0 || v > limit) return -1;
    *out = v;
    return 0;
}

static qkv_status parse_pnm(const unsigned char *p, size_t len, qkv_image *out, char *why, size_t why_len) {
    int64_t channels = p[1] == '5' ? 1 : 3;
    pnm_cursor c = {p, len, 2};
    int64_t w, h, maxval;
    if (pnm_number(&c, INT32_MAX, &w) != 0 || pnm_number(&c, INT32_MAX, &h) != 0) {
        set_why(why, why_len, "PNM header: bad or missing width/height");
        return QKV_ERR_FORMAT;
    }
    if (pnm_number(&c, 65535, &maxval) != 0 || maxval < 1) {
        set_why(why, why_len, "PNM header: maxval must be 1..65535");
        return QKV_ERR_FORMAT;
    }
    if (w < 1 || h < 1) {
        set_why(why, why_len, "PNM header: zero width or height (%lld x %lld)", (long long)w,
                (long long)h);
        return QKV_ERR_FORMAT;
    }
    if (c.pos >= len || !pnm_is_space(p[c.pos])) {
        set_why(why, why_len, "PNM header: no whitespace after maxval");
        return QKV_ERR_FORMAT;
    }
    c.pos++;
    int64_t bps = maxval < 256 ? 1 : 2, need;
    int64_t f[4] = {w, h, channels, bps};
    if (!qkv_count_ok(&need, 1, 4, f)) {
        set_why(why, why_len, "PNM: %lld x %lld pixels overflow", (long long)w, (long long)h);
        return QKV_ERR_SIZE_OVERFLOW;
    }
    if ((uint64_t)need > (uint64_t)(len - c.pos)) {
        set_why(why, why_len, "PNM: truncated: %lld x %lld x %lld needs %lld data bytes, file has %zu",
                (long long)h, (long long)w, (long long)channels, (long long)need, len - c.pos);
        return QKV_ERR_FORMAT;
    }
    qkv_status s = qkv_image_alloc(out, h, w, channels);
    if (s != QKV_OK) return s;
    const unsigned char *d = p + c.pos;
    int64_t n = h * w * channels;
    double inv = 1.0 / (double)maxval;
    for (int64_t i = 0; i < n; i++) {
        unsigned v = bps == 1 ? d[i] : ((unsigned)d[2 * i] << 8) | d[2 * i + 1];
        /* Samples above maxval are malformed; netpbm clamps them, so do we. */
        if (v > (unsigned)maxval) v = (unsigned)maxval;
        out->data[i] = (float)(v * inv);
    }
    return QKV_OK;
}

/* ------------------------------------------------------------------------- */
/* PNG through libpng's classic API. */

typedef struct png_ctx {
    jmp_buf jmp;
    char msg[160];
    const unsigned char *src;
    size_t len, pos;
    FILE *file;          /* writing */
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

static qkv_status parse_png(const unsigned char *p, size_t len, qkv_image *out, char *why, size_t why_len) {
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
        set_why(why, why_len, "PNG: %s", j->ctx.msg[0] ? j->ctx.msg : qkv_status_string(s));
    }
    qkv_free(j);
    return s;
}

/* ------------------------------------------------------------------------- */

static const unsigned char png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

qkv_status qkv_image_parse(const void *bytes, size_t len, qkv_image *out, char *why, size_t why_len) {
    if (why && why_len) why[0] = '\0';
    if (!out) return QKV_ERR_NULL_POINTER;
    memset(out, 0, sizeof *out);
    if (!bytes && len > 0) return QKV_ERR_NULL_POINTER;
    const unsigned char *p = bytes;
    if (len >= 8 && memcmp(p, png_sig, 8) == 0) return parse_png(p, len, out, why, why_len);
    if (len >= 2 && p[0] == 'P' && (p[1] == '5' || p[1] == '6')) return parse_pnm(p, len, out, why, why_len);
    if (len >= 2 && p[0] == 'P' && p[1] >= '1' && p[1] <= '7') {
        set_why(why, why_len, "netpbm P%c is not supported (only binary P5 PGM and P6 PPM)", p[1]);
        return QKV_ERR_FORMAT;
    }
    set_why(why, why_len, "not a PNG, PGM (P5) or PPM (P6) file");
    return QKV_ERR_FORMAT;
}

qkv_status qkv_image_load(const char *path, qkv_image *out, char *why, size_t why_len) {
    if (why && why_len) why[0] = '\0';
    if (!out) return QKV_ERR_NULL_POINTER;
    memset(out, 0, sizeof *out);
    if (!path) return QKV_ERR_NULL_POINTER;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        set_why(why, why_len, "cannot open: %s", strerror(errno));
        return QKV_ERR_IO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        set_why(why, why_len, "not a regular file");
        return QKV_ERR_IO;
    }
    size_t len = (size_t)st.st_size;
    unsigned char *buf = qkv_alloc(len ? len : 1);
    if (!buf) {
        close(fd);
        return QKV_ERR_OUT_OF_MEMORY;
    }
    size_t got = 0;
    while (got < len) {
        ssize_t r = read(fd, buf + got, len - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    if (got != len) {
        qkv_free(buf);
        set_why(why, why_len, "read error");
        return QKV_ERR_IO;
    }
    qkv_status s = qkv_image_parse(buf, len, out, why, why_len);
    qkv_free(buf);
    return s;
}

/* ------------------------------------------------------------------------- */
/* Writing: to a fresh temporary file beside path, renamed over it when
 * complete, so a failure never leaves a partial file. */

static atomic_uint g_img_tmp_seq;

/* A new temporary file beside path; NULL with *oom set when memory ran out. */
static FILE *open_tmp(const char *path, char **tmp_out, int *oom) {
    size_t tcap = strlen(path) + 48;
    char *tmp = qkv_alloc(tcap);
    *oom = tmp == NULL;
    if (!tmp) return NULL;
    int fd = -1;
    for (int attempt = 0; attempt < 100 && fd < 0; attempt++) {
        snprintf(tmp, tcap, "%s.tmp%ld.%u", path, (long)getpid(), atomic_fetch_add(&g_img_tmp_seq, 1u));
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
        qkv_free(tmp);
        return NULL;
    }
    FILE *f = fdopen(fd, "wb");
    if (!f) {
        close(fd);
        unlink(tmp);
        qkv_free(tmp);
        return NULL;
    }
    *tmp_out = tmp;
    return f;
}

static qkv_status finish_tmp(FILE *f, char *tmp, const char *path, int ok) {
    if (fflush(f) != 0 || ferror(f)) ok = 0;
    if (ok && fsync(fileno(f)) != 0) ok = 0;
    if (fclose(f) != 0) ok = 0;
    if (ok && rename(tmp, path) != 0) ok = 0;
    if (!ok) unlink(tmp);
    qkv_free(tmp);
    return ok ? QKV_OK : QKV_ERR_IO;
}

static unsigned char to_u8(float v) {
    if (!(v > 0.0f)) return 0; /* also NaN */
    if (v >= 1.0f) return 255;
    return (unsigned char)lrintf(v * 255.0f);
}

static qkv_status check_image(const qkv_image *img, int max_channels) {
    if (!img || !img->data) return QKV_ERR_NULL_POINTER;
    if (img->height <= 0 || img->width <= 0 || img->channels <= 0) return QKV_ERR_BAD_SIZE;
    if (img->channels > max_channels) return QKV_ERR_SHAPE;
    if (img->height > 0x7fffffff || img->width > 0x7fffffff) return QKV_ERR_SIZE_OVERFLOW;
    if (qkv_image_count(img) == 0) return QKV_ERR_SIZE_OVERFLOW;
    return QKV_OK;
}

typedef struct png_write_job {
    png_ctx ctx;
    png_structp png;
    png_infop info;
    unsigned char *row;
    const qkv_image *img;
    qkv_status status;
} png_write_job;

static void png_write_body(png_write_job *j) {
    if (setjmp(j->ctx.jmp)) {
        if (j->status == QKV_OK) j->status = j->ctx.alloc_failed ? QKV_ERR_OUT_OF_MEMORY : QKV_ERR_IO;
        return;
    }
    const qkv_image *img = j->img;
    static const int types[5] = {0, PNG_COLOR_TYPE_GRAY, PNG_COLOR_TYPE_GRAY_ALPHA, PNG_COLOR_TYPE_RGB,
                                 PNG_COLOR_TYPE_RGB_ALPHA};
    png_init_io(j->png, j->ctx.file);
    png_set_IHDR(j->png, j->info, (png_uint_32)img->width, (png_uint_32)img->height, 8,
                 types[img->channels], PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
                 PNG_FILTER_TYPE_DEFAULT);
    png_write_info(j->png, j->info);
    size_t rowbytes = (size_t)img->width * (size_t)img->channels;
    for (int64_t y = 0; y < img->height; y++) {
        const float *src = img->data + (size_t)y * rowbytes;
        for (size_t i = 0; i < rowbytes; i++) j->row[i] = to_u8(src[i]);
        png_write_row(j->png, j->row);
    }
    png_write_end(j->png, NULL);
}

qkv_status qkv_image_save_png(const char *path, const qkv_image *img) {
    if (!path) return QKV_ERR_NULL_POINTER;
    qkv_status s = check_image(img, 4);
    if (s != QKV_OK) return s;
    png_write_job *j = qkv_alloc_zeroed(sizeof *j);
    if (!j) return QKV_ERR_OUT_OF_MEMORY;
    j->img = img;
    j->status = QKV_OK;
    j->row = qkv_alloc((size_t)img->width * (size_t)img->channels);
    char *tmp = NULL;
    int oom = 1;
    j->ctx.file = j->row ? open_tmp(path, &tmp, &oom) : NULL;
    if (!j->ctx.file) {
        s = oom ? QKV_ERR_OUT_OF_MEMORY : QKV_ERR_IO;
        qkv_free(j->row);
        qkv_free(j);
        return s;
    }
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
    qkv_status fs = finish_tmp(j->ctx.file, tmp, path, s == QKV_OK);
    if (s == QKV_OK) s = fs;
    qkv_free(j->row);
    qkv_free(j);
    return s;
}

qkv_status qkv_image_save_pnm(const char *path, const qkv_image *img) {
    if (!path) return QKV_ERR_NULL_POINTER;
    qkv_status s = check_image(img, 3);
    if (s != QKV_OK) return s;
    if (img->channels == 2) return QKV_ERR_SHAPE;
    char *tmp = NULL;
    int oom;
    FILE *f = open_tmp(path, &tmp, &oom);
    if (!f) return oom ? QKV_ERR_OUT_OF_MEMORY : QKV_ERR_IO;
    int ok = fprintf(f, "P%c\n%lld %lld\n255\n", img->channels == 1 ? '5' : '6', (long long)img->width,
                     (long long)img->height) > 0;
    size_t n = (size_t)qkv_image_count(img);
    for (size_t i = 0; ok && i < n; i++)
        if (putc(to_u8(img->data[i]), f) == EOF) ok = 0;
    return finish_tmp(f, tmp, path, ok);
}
