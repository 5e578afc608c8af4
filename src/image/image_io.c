/* Images in and out: PNG through the library's PNG reader and writer
 * (png_io.c, libpng), binary PGM/PPM (P5/P6) by hand.
 *
 * An image is H x W pixels of C channels, stored [H, W, C] as floats in
 * [0, 1]: exactly H*W vectors of dimension C, the form the attention core
 * takes. Every file is untrusted: dimensions are checked for overflow, the
 * data size is checked against what the bytes can hold before anything is
 * allocated (for PNG with deflate's maximum ratio), and a truncated or
 * corrupt stream is an error, never a crash. */
#define _POSIX_C_SOURCE 200809L /* open, fstat */

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/internal.h"
#include "image/png_io.h"
#include "io/atomic_write.h"

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
    *out = (qkv_image){.height = height, .width = width, .channels = channels, .data = d};
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
    if (pnm_number(&c, INT32_MAX, &w) != 0 || pnm_number(&c, INT32_MAX, &h) != 0)
        return qkv_fail(why, why_len, QKV_ERR_FORMAT, "PNM header: bad or missing width/height");
    if (pnm_number(&c, 65535, &maxval) != 0 || maxval < 1)
        return qkv_fail(why, why_len, QKV_ERR_FORMAT, "PNM header: maxval must be 1..65535");
    if (w < 1 || h < 1)
        return qkv_fail(why, why_len, QKV_ERR_FORMAT, "PNM header: zero width or height (%lld x %lld)",
                        (long long)w, (long long)h);
    if (c.pos >= len || !pnm_is_space(p[c.pos]))
        return qkv_fail(why, why_len, QKV_ERR_FORMAT, "PNM header: no whitespace after maxval");
    c.pos++;
    int64_t bps = maxval < 256 ? 1 : 2, need;
    int64_t f[4] = {w, h, channels, bps};
    if (!qkv_count_ok(&need, 1, 4, f))
        return qkv_fail(why, why_len, QKV_ERR_SIZE_OVERFLOW, "PNM: %lld x %lld pixels overflow", (long long)w,
                        (long long)h);
    if ((uint64_t)need > (uint64_t)(len - c.pos))
        return qkv_fail(why, why_len, QKV_ERR_FORMAT,
                        "PNM: truncated: %lld x %lld x %lld needs %lld data bytes, file has %zu", (long long)h,
                        (long long)w, (long long)channels, (long long)need, len - c.pos);
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

static const unsigned char png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

qkv_status qkv_image_parse(const void *bytes, size_t len, qkv_image *out, char *why, size_t why_len) {
    if (why && why_len) why[0] = '\0';
    if (!out) return QKV_ERR_NULL_POINTER;
    memset(out, 0, sizeof *out);
    if (!bytes && len > 0) return QKV_ERR_NULL_POINTER;
    const unsigned char *p = bytes;
    if (len >= 8 && memcmp(p, png_sig, 8) == 0) return image_png_parse(p, len, out, why, why_len);
    if (len >= 2 && p[0] == 'P' && (p[1] == '5' || p[1] == '6')) return parse_pnm(p, len, out, why, why_len);
    if (len >= 2 && p[0] == 'P' && p[1] >= '1' && p[1] <= '7')
        return qkv_fail(why, why_len, QKV_ERR_FORMAT,
                        "netpbm P%c is not supported (only binary P5 PGM and P6 PPM)", p[1]);
    return qkv_fail(why, why_len, QKV_ERR_FORMAT, "not a PNG, PGM (P5) or PPM (P6) file");
}

qkv_status qkv_image_load(const char *path, qkv_image *out, char *why, size_t why_len) {
    if (why && why_len) why[0] = '\0';
    if (!out) return QKV_ERR_NULL_POINTER;
    memset(out, 0, sizeof *out);
    if (!path) return QKV_ERR_NULL_POINTER;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return qkv_fail(why, why_len, QKV_ERR_IO, "cannot open: %s", strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return qkv_fail(why, why_len, QKV_ERR_IO, "not a regular file");
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
        return qkv_fail(why, why_len, QKV_ERR_IO, "read error");
    }
    qkv_status s = qkv_image_parse(buf, len, out, why, why_len);
    qkv_free(buf);
    return s;
}

/* ------------------------------------------------------------------------- */
/* Writing: atomically (io/atomic_write.h), so a failure never leaves a
 * partial file. */

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

/* Row y of an image as 8-bit samples. */
static const unsigned char *image_row_u8(void *user, int64_t y, unsigned char *buf) {
    const qkv_image *img = user;
    size_t rowbytes = (size_t)img->width * (size_t)img->channels;
    const float *src = img->data + (size_t)y * rowbytes;
    for (size_t i = 0; i < rowbytes; i++) buf[i] = to_u8(src[i]);
    return buf;
}

qkv_status qkv_image_save_png(const char *path, const qkv_image *img) {
    if (!path) return QKV_ERR_NULL_POINTER;
    qkv_status s = check_image(img, 4);
    if (s != QKV_OK) return s;
    return image_png_save(path, img->width, img->height, (int)img->channels, image_row_u8, (void *)img);
}

qkv_status qkv_image_save_pnm(const char *path, const qkv_image *img) {
    if (!path) return QKV_ERR_NULL_POINTER;
    qkv_status s = check_image(img, 3);
    if (s != QKV_OK) return s;
    if (img->channels == 2) return QKV_ERR_SHAPE;
    size_t rowbytes = (size_t)img->width * (size_t)img->channels;
    unsigned char *row = qkv_alloc(rowbytes);
    if (!row) return QKV_ERR_OUT_OF_MEMORY;
    atomic_file f;
    s = atomic_file_open(&f, path);
    if (s != QKV_OK) {
        qkv_free(row);
        return s;
    }
    char head[64];
    int hn = snprintf(head, sizeof head, "P%c\n%lld %lld\n255\n", img->channels == 1 ? '5' : '6',
                      (long long)img->width, (long long)img->height);
    atomic_file_write(&f, head, (size_t)hn);
    for (int64_t y = 0; y < img->height; y++) atomic_file_write(&f, image_row_u8((void *)img, y, row), rowbytes);
    qkv_free(row);
    return atomic_file_close(&f, 1);
}
