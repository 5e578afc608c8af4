/* NumPy .npy files: parse (untrusted input), load and save.
 *
 * The format (numpy/lib/format.py): the magic "\x93NUMPY", a major and minor
 * version byte, the header length (2 bytes little-endian in 1.0, 4 bytes in
 * 2.0 and 3.0), then the header: a Python dict literal such as
 *     {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
 * padded with spaces and a final '\n' so that the data starts at a multiple of
 * 64 bytes, then the raw elements in C order.
 *
 * Everything in a file is untrusted: the header is parsed by a small
 * hand-written scanner (no recursion, no allocation), every size is checked
 * for overflow, and the data size is checked against what the file holds
 * before the array is allocated. Bytes after the data are ignored, as
 * numpy.load ignores them. */
#define _POSIX_C_SOURCE 200809L /* open, fstat, pread, strerror_r */

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "core/internal.h"
#include "io/atomic_write.h"
#include "io/byte_order.h"

#define NPY_MAGIC "\x93NUMPY"
#define NPY_MAGIC_LEN 6
#define NPY_ALIGN 64             /* numpy's ARRAY_ALIGN */
#define NPY_GROWTH_DIGITS 21     /* numpy's GROWTH_AXIS_MAX_DIGITS */

/* ---- small helpers ------------------------------------------------------ */

/* Return `status` with a reason; for functions that have why, why_len. */
#define FAIL(status, ...) return qkv_fail(why, why_len, (status), __VA_ARGS__)

/* strerror is not thread-safe; the XSI strerror_r is (POSIX 2008). */
static const char *errtext(int e, char *buf, size_t n) {
    if (strerror_r(e, buf, n) != 0) snprintf(buf, n, "error %d", e);
    return buf;
}

/* At most cap-1 bytes of s, with anything but printable ASCII shown as '?'
 * and "..." when cut: safe to put in a one-line message. */
static const char *printable(char *buf, size_t cap, const unsigned char *s, size_t n) {
    size_t k = 0, room = cap - 1;
    int cut = n > room;
    if (cut) room = room > 3 ? room - 3 : 0;
    for (; k < n && k < room; k++) buf[k] = (s[k] >= 0x20 && s[k] < 0x7f) ? (char)s[k] : '?';
    if (cut)
        for (int d = 0; d < 3 && k < cap - 1; d++) buf[k++] = '.';
    buf[k] = '\0';
    return buf;
}

/* ---- the header --------------------------------------------------------- */

typedef struct npy_header {
    qkv_dtype dtype;
    int ndim;
    int64_t shape[QKV_NPY_MAX_DIMS];
    size_t nbytes;               /* of the data, overflow-checked */
} npy_header;

/* Magic, version and header length from the first bytes of a file. On
 * success the header text starts at *start and is *hlen bytes long (not yet
 * checked against the file's length). */
static qkv_status parse_prefix(const unsigned char *b, size_t len, int *major, size_t *start,
                               size_t *hlen, char *why, size_t why_len) {
    size_t m = len < NPY_MAGIC_LEN ? len : NPY_MAGIC_LEN;
    if (memcmp(b, NPY_MAGIC, m) != 0) FAIL(QKV_ERR_FORMAT, "bad magic: not a .npy file");
    if (len < 8) FAIL(QKV_ERR_FORMAT, "truncated: %zu bytes is too short for a .npy file", len);
    if (b[6] < 1 || b[6] > 3 || b[7] != 0)
        FAIL(QKV_ERR_FORMAT, "unknown .npy format version %u.%u", (unsigned)b[6], (unsigned)b[7]);
    size_t lb = b[6] == 1 ? 2 : 4;
    if (len < 8 + lb) FAIL(QKV_ERR_FORMAT, "truncated: %zu bytes is too short for a .npy file", len);
    uint32_t h = (uint32_t)b[8] | (uint32_t)b[9] << 8;
    if (lb == 4) h |= (uint32_t)b[10] << 16 | (uint32_t)b[11] << 24;
    *major = b[6];
    *start = 8 + lb;
    *hlen = h;
    return QKV_OK;
}

typedef struct hcur {
    const unsigned char *p, *end;
} hcur;

static int at(const hcur *c, int ch) { return c->p < c->end && *c->p == ch; }

static int at_digit(const hcur *c) { return c->p < c->end && *c->p >= '0' && *c->p <= '9'; }

/* Letters, digits and '_': what may continue a Python name or number. */
static int at_word(const hcur *c) {
    if (c->p >= c->end) return 0;
    unsigned char ch = *c->p;
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_';
}

static void skip_ws(hcur *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r' ||
                             *c->p == '\f' || *c->p == '\v'))
        c->p++;
}

/* A '...' or "..." literal without escapes (numpy never writes any). */
static int parse_string(hcur *c, const unsigned char **s, size_t *n) {
    if (!at(c, '\'') && !at(c, '"')) return 0;
    unsigned char q = *c->p++;
    const unsigned char *b = c->p;
    while (c->p < c->end && *c->p != q) {
        if (*c->p == '\\' || *c->p == '\n') return 0;
        c->p++;
    }
    if (c->p == c->end) return 0;
    *s = b;
    *n = (size_t)(c->p - b);
    c->p++;
    return 1;
}

static int str_is(const unsigned char *s, size_t n, const char *lit) {
    return n == strlen(lit) && memcmp(s, lit, n) == 0;
}

/* A tuple of non-negative integers: "()", "(3,)", "(2, 3)", "(2, 3,)". Python
 * 2 wrote longs as "3L"; numpy still reads those in 1.0 and 2.0 files. */
static qkv_status parse_shape(hcur *c, int major, npy_header *hd, char *why, size_t why_len) {
    size_t n = 0, commas = 0;
    if (!at(c, '(')) FAIL(QKV_ERR_FORMAT, "header: 'shape' is not a tuple");
    c->p++;
    skip_ws(c);
    while (!at(c, ')')) {
        int neg = 0, big = 0;
        int64_t v = 0;
        if (at(c, '-')) {
            neg = 1;
            c->p++;
        }
        if (!at_digit(c)) FAIL(QKV_ERR_FORMAT, "header: 'shape' has a dimension that is not an integer");
        while (at_digit(c)) {
            int d = *c->p++ - '0';
            if (v > (INT64_MAX - d) / 10)
                big = 1;
            else
                v = v * 10 + d;
        }
        if (major < 3 && (at(c, 'L') || at(c, 'l'))) c->p++;
        if (at_word(c) || at(c, '.'))
            FAIL(QKV_ERR_FORMAT, "header: 'shape' has a dimension that is not an integer");
        if (neg && big) FAIL(QKV_ERR_FORMAT, "header: 'shape' has a negative dimension");
        if (neg && v != 0) FAIL(QKV_ERR_FORMAT, "header: 'shape' has a negative dimension (-%" PRId64 ")", v);
        if (big) FAIL(QKV_ERR_SIZE_OVERFLOW, "header: a dimension of 'shape' does not fit in 64 bits");
        if (n < QKV_NPY_MAX_DIMS) hd->shape[n] = v;
        n++;
        skip_ws(c);
        if (at(c, ',')) {
            c->p++;
            commas++;
            skip_ws(c);
        } else if (!at(c, ')')) {
            FAIL(QKV_ERR_FORMAT, "header: 'shape' is not a tuple of integers");
        }
    }
    c->p++;
    if (n == 1 && commas == 0)
        FAIL(QKV_ERR_FORMAT, "header: 'shape' is (%" PRId64 "), an integer, not a tuple (%" PRId64 ",)",
             hd->shape[0], hd->shape[0]);
    if (n > QKV_NPY_MAX_DIMS)
        FAIL(QKV_ERR_FORMAT, "header: 'shape' has %zu dimensions, more than the %d supported", n,
             QKV_NPY_MAX_DIMS);
    hd->ndim = (int)n;
    return QKV_OK;
}

/* The header dict: exactly the keys 'descr', 'fortran_order' and 'shape' (as
 * numpy requires), in any order, with any whitespace and optional trailing
 * commas. Fills hd; the data size is checked by the caller. */
static qkv_status parse_header(const unsigned char *text, size_t len, int major, npy_header *hd,
                               char *why, size_t why_len) {
    hcur c = {text, text + len};
    const unsigned char *descr = NULL, *key;
    size_t descr_len = 0, key_len;
    int have_descr = 0, have_fortran = 0, have_shape = 0, fortran = 0;
    char shown[40];
    qkv_status s;

    memset(hd, 0, sizeof *hd);
    skip_ws(&c);
    if (!at(&c, '{')) FAIL(QKV_ERR_FORMAT, "header is not a Python dict literal");
    c.p++;
    for (;;) {
        skip_ws(&c);
        if (at(&c, '}')) break;
        if (!parse_string(&c, &key, &key_len)) FAIL(QKV_ERR_FORMAT, "header: expected a quoted key or '}'");
        skip_ws(&c);
        if (!at(&c, ':')) FAIL(QKV_ERR_FORMAT, "header: expected ':' after a key");
        c.p++;
        skip_ws(&c);
        if (str_is(key, key_len, "descr")) {
            if (have_descr) FAIL(QKV_ERR_FORMAT, "header: duplicate key 'descr'");
            have_descr = 1;
            if (at(&c, '[')) FAIL(QKV_ERR_DTYPE, "unsupported dtype: structured arrays are not supported");
            if (!parse_string(&c, &descr, &descr_len)) FAIL(QKV_ERR_FORMAT, "header: 'descr' is not a string");
        } else if (str_is(key, key_len, "fortran_order")) {
            if (have_fortran) FAIL(QKV_ERR_FORMAT, "header: duplicate key 'fortran_order'");
            have_fortran = 1;
            const unsigned char *w = c.p;
            while (at_word(&c)) c.p++;
            if (str_is(w, (size_t)(c.p - w), "True"))
                fortran = 1;
            else if (!str_is(w, (size_t)(c.p - w), "False"))
                FAIL(QKV_ERR_FORMAT, "header: 'fortran_order' is not True or False");
        } else if (str_is(key, key_len, "shape")) {
            if (have_shape) FAIL(QKV_ERR_FORMAT, "header: duplicate key 'shape'");
            have_shape = 1;
            s = parse_shape(&c, major, hd, why, why_len);
            if (s != QKV_OK) return s;
        } else {
            FAIL(QKV_ERR_FORMAT, "header: unexpected key '%s'", printable(shown, sizeof shown, key, key_len));
        }
        skip_ws(&c);
        if (at(&c, ','))
            c.p++;
        else if (!at(&c, '}'))
            FAIL(QKV_ERR_FORMAT, "header: expected ',' or '}' after a value");
    }
    c.p++;
    skip_ws(&c);
    if (c.p != c.end) FAIL(QKV_ERR_FORMAT, "header: unexpected text after the dict");
    if (!have_descr) FAIL(QKV_ERR_FORMAT, "header has no 'descr' key");
    if (!have_fortran) FAIL(QKV_ERR_FORMAT, "header has no 'fortran_order' key");
    if (!have_shape) FAIL(QKV_ERR_FORMAT, "header has no 'shape' key");

    /* Only explicit little-endian: numpy writes '<' for these types on every
     * host; '=' (native) and '|' never occur for them in a numpy file.
     * '<u2' is read as bf16 bit patterns (qkv's convention: NumPy has no
     * bfloat16, so qkv writes bf16 arrays as uint16; docs/HALF.md). */
    static const struct { const char *code; qkv_dtype dtype; } known[] = {
        {"f4", QKV_F32}, {"f8", QKV_F64}, {"i4", QKV_I32},
        {"i8", QKV_I64}, {"f2", QKV_F16}, {"u2", QKV_BF16}};
    int found = 0;
    printable(shown, sizeof shown, descr, descr_len);
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        if (descr_len != 3 || memcmp(descr + 1, known[i].code, 2) != 0) continue;
        if (descr[0] == '>') FAIL(QKV_ERR_FORMAT, "big-endian dtype '%s' is not supported", shown);
        if (descr[0] == '<') {
            hd->dtype = known[i].dtype;
            found = 1;
        }
        break;
    }
    if (!found) FAIL(QKV_ERR_DTYPE, "unsupported dtype '%s' (qkv reads <f4, <f8, <i4, <i8, <f2, and <u2 as bf16)",
                     shown);
    if (fortran) FAIL(QKV_ERR_FORMAT, "Fortran order is not supported");

    int64_t count;
    size_t elem = qkv_dtype_size(hd->dtype);
    if (!qkv_shape_count(hd->ndim, hd->shape, elem, &count))
        FAIL(QKV_ERR_SIZE_OVERFLOW, "header: 'shape' has too many elements (the size overflows)");
    hd->nbytes = (size_t)count * elem;
    return QKV_OK;
}

/* Give `data` (nbytes of hd's array, from qkv_alloc) to *out. */
static void adopt(qkv_array *out, const npy_header *hd, void *data) {
    if (!qkv_host_is_le()) qkv_swap_bytes(data, hd->nbytes / qkv_dtype_size(hd->dtype), qkv_dtype_size(hd->dtype));
    out->dtype = hd->dtype;
    out->ndim = hd->ndim;
    for (int i = 0; i < hd->ndim; i++) out->shape[i] = hd->shape[i];
    out->data = data;
}

qkv_status qkv_npy_parse(const void *bytes, size_t len, qkv_array *out, char *why, size_t why_len) {
    qkv_set_why(why, why_len, "%s", "");
    if (out) memset(out, 0, sizeof *out);
    if (!out || !bytes) FAIL(QKV_ERR_NULL_POINTER, "a required pointer is NULL");
    const unsigned char *b = bytes;
    int major;
    size_t start, hlen;
    npy_header hd;
    qkv_status s = parse_prefix(b, len, &major, &start, &hlen, why, why_len);
    if (s != QKV_OK) return s;
    if (hlen > len - start)
        FAIL(QKV_ERR_FORMAT, "header length %zu goes past the end of the file (%zu bytes)", hlen, len);
    s = parse_header(b + start, hlen, major, &hd, why, why_len);
    if (s != QKV_OK) return s;
    size_t have = len - start - hlen;
    if (hd.nbytes > have)
        FAIL(QKV_ERR_FORMAT, "truncated: header says %zu bytes of data, file has %zu", hd.nbytes, have);
    void *data = qkv_alloc(hd.nbytes);
    if (!data) FAIL(QKV_ERR_OUT_OF_MEMORY, "out of memory");
    memcpy(data, b + start + hlen, hd.nbytes);
    adopt(out, &hd, data);
    return QKV_OK;
}

/* ---- load --------------------------------------------------------------- */

/* Read up to n bytes; *got < n only at end of file. -1 on a read error. */
static int read_full(int fd, unsigned char *p, size_t n, size_t *got) {
    *got = 0;
    while (*got < n) {
        size_t chunk = n - *got < ((size_t)1 << 30) ? n - *got : ((size_t)1 << 30);
        ssize_t r = read(fd, p + *got, chunk);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) break;
        *got += (size_t)r;
    }
    return 0;
}

/* Read `want` bytes, the first npre of which are already in pre, into a new
 * buffer; fewer (*got < want) at end of file. The buffer grows as data
 * arrives, so a header that lies about the size costs at most twice what the
 * file holds, never what it claims. hint: the size expected (0 = unknown). */
static qkv_status read_upto(int fd, const unsigned char *pre, size_t npre, size_t want, size_t hint,
                            unsigned char **buf_out, size_t *got_out, char *why, size_t why_len) {
    size_t cap = hint ? hint : 65536;
    if (cap > want) cap = want;
    if (cap < npre) cap = npre;
    unsigned char *buf = qkv_alloc(cap);
    if (!buf) FAIL(QKV_ERR_OUT_OF_MEMORY, "out of memory");
    if (npre) memcpy(buf, pre, npre);
    size_t got = npre;
    for (;;) {
        if (got == cap) {
            if (cap == want) break;
            size_t ncap = cap > want / 2 ? want : 2 * cap;
            unsigned char *nb = qkv_alloc(ncap);
            if (!nb) {
                qkv_free(buf);
                FAIL(QKV_ERR_OUT_OF_MEMORY, "out of memory");
            }
            memcpy(nb, buf, got);
            qkv_free(buf);
            buf = nb;
            cap = ncap;
        }
        size_t r;
        if (read_full(fd, buf + got, cap - got, &r) != 0) {
            char e[128];
            errtext(errno, e, sizeof e);
            qkv_free(buf);
            FAIL(QKV_ERR_IO, "cannot read: %s", e);
        }
        got += r;
        if (got < cap) break; /* end of file */
    }
    *buf_out = buf;
    *got_out = got;
    return QKV_OK;
}

static qkv_status load_fd(int fd, qkv_array *out, char *why, size_t why_len) {
    char e[128];
    struct stat st;
    if (fstat(fd, &st) != 0) FAIL(QKV_ERR_IO, "cannot read: %s", errtext(errno, e, sizeof e));
    if (S_ISDIR(st.st_mode)) FAIL(QKV_ERR_IO, "cannot read: %s", errtext(EISDIR, e, sizeof e));
    /* The size of a regular file is a hint only: reads stop at the real end. */
    size_t size = 0;
    if (S_ISREG(st.st_mode) && st.st_size > 0 && (uintmax_t)st.st_size <= SIZE_MAX) size = (size_t)st.st_size;

    /* Magic and version, then the 2 or 4 bytes of header length. */
    unsigned char pre[12];
    size_t n, more = 0;
    if (read_full(fd, pre, 8, &n) != 0) FAIL(QKV_ERR_IO, "cannot read: %s", errtext(errno, e, sizeof e));
    if (n == 8 && read_full(fd, pre + 8, pre[6] == 1 ? 2 : 4, &more) != 0)
        FAIL(QKV_ERR_IO, "cannot read: %s", errtext(errno, e, sizeof e));
    n += more;
    int major;
    size_t start, hlen;
    qkv_status s = parse_prefix(pre, n, &major, &start, &hlen, why, why_len);
    if (s != QKV_OK) return s;

    unsigned char *head;
    size_t got;
    if (hlen > SIZE_MAX - start) FAIL(QKV_ERR_FORMAT, "header length %zu goes past the end of the file", hlen);
    s = read_upto(fd, pre, start, start + hlen, size, &head, &got, why, why_len);
    if (s != QKV_OK) return s;
    if (got < start + hlen) {
        qkv_free(head);
        FAIL(QKV_ERR_FORMAT, "header length %zu goes past the end of the file (%zu bytes)", hlen, got);
    }
    npy_header hd;
    s = parse_header(head + start, hlen, major, &hd, why, why_len);
    qkv_free(head);
    if (s != QKV_OK) return s;

    unsigned char *data;
    size_t left = size > start + hlen ? size - start - hlen : 0;
    s = read_upto(fd, NULL, 0, hd.nbytes, left, &data, &got, why, why_len);
    if (s != QKV_OK) return s;
    if (got < hd.nbytes) {
        qkv_free(data);
        FAIL(QKV_ERR_FORMAT, "truncated: header says %zu bytes of data, file has %zu", hd.nbytes, got);
    }
    adopt(out, &hd, data);
    return QKV_OK;
}

qkv_status qkv_npy_load(const char *path, qkv_array *out, char *why, size_t why_len) {
    qkv_set_why(why, why_len, "%s", "");
    if (out) memset(out, 0, sizeof *out);
    if (!out || !path) FAIL(QKV_ERR_NULL_POINTER, "a required pointer is NULL");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        char e[128];
        FAIL(QKV_ERR_IO, "cannot open: %s", errtext(errno, e, sizeof e));
    }
    qkv_status s = load_fd(fd, out, why, why_len);
    close(fd); /* read-only: nothing to lose */
    return s;
}

/* ---- header only, and ranges of rows ------------------------------------- */

/* Read exactly n bytes at offset off; 1 when the file ends first, -1 on a
 * read error, 0 on success. */
static int pread_full(int fd, unsigned char *p, size_t n, off_t off) {
    while (n > 0) {
        size_t chunk = n < ((size_t)1 << 30) ? n : ((size_t)1 << 30);
        ssize_t r = pread(fd, p, chunk, off);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) return 1;
        p += r;
        n -= (size_t)r;
        off += (off_t)r;
    }
    return 0;
}

/* Open path (a regular file: the reads seek), parse its header and check
 * that the file holds all the data the header declares. On success *fd_out
 * is open and *data_off is where the data starts. */
static qkv_status open_header(const char *path, int *fd_out, npy_header *hd, off_t *data_off,
                              char *why, size_t why_len) {
    char e[128];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) FAIL(QKV_ERR_IO, "cannot open: %s", errtext(errno, e, sizeof e));
    struct stat st;
    qkv_status s = QKV_OK;
    unsigned char pre[12], *head = NULL;
    int major, rr;
    size_t start = 0, hlen = 0, n = 0;
    if (fstat(fd, &st) != 0) {
        qkv_set_why(why, why_len, "cannot read: %s", errtext(errno, e, sizeof e));
        s = QKV_ERR_IO;
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        qkv_set_why(why, why_len, "%s", "cannot read by rows: not a regular file");
        s = QKV_ERR_IO;
        goto fail;
    }
    /* Magic, version and the 2 or 4 bytes of header length. */
    n = (uintmax_t)st.st_size < sizeof pre ? (size_t)st.st_size : sizeof pre;
    rr = pread_full(fd, pre, n, 0);
    if (rr != 0) {
        qkv_set_why(why, why_len, "cannot read: %s", rr < 0 ? errtext(errno, e, sizeof e) : "the file shrank");
        s = rr < 0 ? QKV_ERR_IO : QKV_ERR_FORMAT;
        goto fail;
    }
    s = parse_prefix(pre, n, &major, &start, &hlen, why, why_len);
    if (s != QKV_OK) goto fail;
    if ((uintmax_t)hlen > (uintmax_t)st.st_size - start) {
        qkv_set_why(why, why_len, "header length %zu goes past the end of the file (%jd bytes)", hlen,
                    (intmax_t)st.st_size);
        s = QKV_ERR_FORMAT;
        goto fail;
    }
    head = qkv_alloc(hlen);
    if (!head) {
        qkv_set_why(why, why_len, "%s", "out of memory");
        s = QKV_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    rr = pread_full(fd, head, hlen, (off_t)start);
    if (rr != 0) {
        qkv_set_why(why, why_len, "cannot read: %s", rr < 0 ? errtext(errno, e, sizeof e) : "the file shrank");
        s = rr < 0 ? QKV_ERR_IO : QKV_ERR_FORMAT;
        goto fail;
    }
    s = parse_header(head, hlen, major, hd, why, why_len);
    qkv_free(head);
    head = NULL;
    if (s != QKV_OK) goto fail;
    uintmax_t have = (uintmax_t)st.st_size - start - hlen;
    if ((uintmax_t)hd->nbytes > have) {
        qkv_set_why(why, why_len, "truncated: header says %zu bytes of data, file has %ju", hd->nbytes, have);
        s = QKV_ERR_FORMAT;
        goto fail;
    }
    *fd_out = fd;
    *data_off = (off_t)(start + hlen);
    return QKV_OK;
fail:
    qkv_free(head);
    close(fd);
    return s;
}

qkv_status qkv_npy_load_header(const char *path, qkv_array *out, char *why, size_t why_len) {
    qkv_set_why(why, why_len, "%s", "");
    if (out) memset(out, 0, sizeof *out);
    if (!out || !path) FAIL(QKV_ERR_NULL_POINTER, "a required pointer is NULL");
    int fd;
    off_t off;
    npy_header hd;
    qkv_status s = open_header(path, &fd, &hd, &off, why, why_len);
    if (s != QKV_OK) return s;
    close(fd);
    out->dtype = hd.dtype;
    out->ndim = hd.ndim;
    for (int i = 0; i < hd.ndim; i++) out->shape[i] = hd.shape[i];
    return QKV_OK;
}

qkv_status qkv_npy_load_rows(const char *path, int axis, int nranges, const int64_t *starts,
                             const int64_t *counts, qkv_array *out, int64_t *axis_len, char *why,
                             size_t why_len) {
    qkv_set_why(why, why_len, "%s", "");
    if (out) memset(out, 0, sizeof *out);
    if (!out || !path || (nranges > 0 && (!starts || !counts)))
        FAIL(QKV_ERR_NULL_POINTER, "a required pointer is NULL");
    if (nranges < 0) FAIL(QKV_ERR_BAD_SIZE, "negative number of ranges %d", nranges);
    int fd;
    off_t off;
    npy_header hd;
    qkv_status s = open_header(path, &fd, &hd, &off, why, why_len);
    if (s != QKV_OK) return s;
    if (axis < 0 || axis >= hd.ndim) {
        close(fd);
        FAIL(QKV_ERR_BAD_SIZE, "axis %d is outside the array's %d dimensions", axis, hd.ndim);
    }
    const int64_t rows = hd.shape[axis];
    int64_t total = 0;
    for (int r = 0; r < nranges; r++) {
        if (starts[r] < 0 || counts[r] < 0 || starts[r] > rows || counts[r] > rows - starts[r]) {
            close(fd);
            FAIL(QKV_ERR_BAD_SIZE, "rows %" PRId64 " + %" PRId64 " are outside 0..%" PRId64 " of axis %d",
                 starts[r], counts[r], rows, axis);
        }
        if (counts[r] > INT64_MAX - total) {
            close(fd);
            FAIL(QKV_ERR_SIZE_OVERFLOW, "%s", "the ranges hold too many rows (the size overflows)");
        }
        total += counts[r];
    }
    size_t elem = qkv_dtype_size(hd.dtype);
    npy_header oh = hd;
    oh.shape[axis] = total;
    int64_t count;
    if (!qkv_shape_count(oh.ndim, oh.shape, elem, &count)) {
        close(fd);
        FAIL(QKV_ERR_SIZE_OVERFLOW, "%s", "the ranges hold too many elements (the size overflows)");
    }
    oh.nbytes = (size_t)count * elem;
    unsigned char *data = qkv_alloc(oh.nbytes);
    if (!data) {
        close(fd);
        FAIL(QKV_ERR_OUT_OF_MEMORY, "out of memory");
    }
    /* outer blocks of `rows` rows of `inner` bytes: with nothing to read
     * (a zero dimension or empty ranges) the loops below do nothing. Every
     * offset lies inside the data, whose size fits in the file (checked). */
    if (oh.nbytes > 0) {
        int64_t outer = 1;
        size_t inner = elem;
        for (int i = 0; i < axis; i++) outer *= hd.shape[i];
        for (int i = axis + 1; i < hd.ndim; i++) inner *= (size_t)hd.shape[i];
        unsigned char *p = data;
        for (int64_t o = 0; o < outer; o++) {
            for (int r = 0; r < nranges; r++) {
                if (counts[r] == 0) continue;
                uintmax_t first = ((uintmax_t)o * (uintmax_t)rows + (uintmax_t)starts[r]) * inner;
                size_t len = (size_t)counts[r] * inner;
                if (first > hd.nbytes || len > hd.nbytes - first) { /* cannot happen: checked above */
                    qkv_free(data);
                    close(fd);
                    FAIL(QKV_ERR_SIZE_OVERFLOW, "%s", "a row range goes past the data");
                }
                int rr = pread_full(fd, p, len, off + (off_t)first);
                if (rr != 0) {
                    char e[128];
                    if (rr < 0) errtext(errno, e, sizeof e);
                    qkv_free(data);
                    close(fd);
                    if (rr < 0) FAIL(QKV_ERR_IO, "cannot read: %s", e);
                    FAIL(QKV_ERR_FORMAT, "truncated: the file ended while reading rows (%zu bytes of data expected)",
                         hd.nbytes);
                }
                p += len;
            }
        }
    }
    close(fd);
    adopt(out, &oh, data);
    if (axis_len) *axis_len = rows;
    return QKV_OK;
}

/* ---- save --------------------------------------------------------------- */

/* The whole prefix + header as numpy 1.x/2.x writes it (same bytes):
 * "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", then room to
 * grow the first axis in place, then spaces and '\n' up to a multiple of 64.
 * Returns its length. With at most 8 dims it is always far below 65535, so
 * version 1.0; 2.0 is kept for the rule's sake. */
static size_t build_header(const qkv_array *a, unsigned char *out, size_t cap) {
    /* Indexed by qkv_dtype; bf16 is written as uint16 bit patterns. */
    static const char *const descr[] = {"<f4", "<f8", "<i4", "<i8", "<u2", "<f2"};
    char dict[400];
    int k = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr[a->dtype]);
    for (int i = 0; i < a->ndim; i++)
        k += snprintf(dict + k, sizeof dict - (size_t)k, "%s%" PRId64, i ? ", " : "", a->shape[i]);
    k += snprintf(dict + k, sizeof dict - (size_t)k, "%s), }", a->ndim == 1 ? "," : "");
    if (a->ndim > 0) {
        int digits = snprintf(NULL, 0, "%" PRId64, a->shape[0]);
        for (int i = digits; i < NPY_GROWTH_DIGITS; i++) dict[k++] = ' ';
    }
    size_t hlen = (size_t)k + 1; /* + '\n' */
    size_t lb = 2;
    size_t pad = NPY_ALIGN - (8 + lb + hlen) % NPY_ALIGN;
    if (hlen + pad > 65535) {
        lb = 4;
        pad = NPY_ALIGN - (8 + lb + hlen) % NPY_ALIGN;
    }
    size_t total = 8 + lb + hlen + pad;
    if (total > cap) return 0;
    uint32_t h = (uint32_t)(hlen + pad);
    memcpy(out, NPY_MAGIC, NPY_MAGIC_LEN);
    out[6] = lb == 2 ? 1 : 2;
    out[7] = 0;
    for (size_t i = 0; i < lb; i++) out[8 + i] = (unsigned char)(h >> (8 * i));
    memcpy(out + 8 + lb, dict, (size_t)k);
    memset(out + 8 + lb + (size_t)k, ' ', pad);
    out[total - 1] = '\n';
    return total;
}

qkv_status qkv_npy_save(const char *path, const qkv_array *a) {
    if (!path || !a) return QKV_ERR_NULL_POINTER;
    if (a->ndim < 0 || a->ndim > QKV_NPY_MAX_DIMS) return QKV_ERR_BAD_SIZE;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] < 0) return QKV_ERR_BAD_SIZE;
    size_t elem = qkv_dtype_size(a->dtype);
    if (elem == 0) return QKV_ERR_DTYPE;
    int64_t count;
    if (!qkv_shape_count(a->ndim, a->shape, elem, &count)) return QKV_ERR_SIZE_OVERFLOW;
    if (count > 0 && !a->data) return QKV_ERR_NULL_POINTER;

    unsigned char head[640];
    size_t hn = build_header(a, head, sizeof head);
    if (hn == 0) return QKV_ERR_UNSUPPORTED; /* cannot happen with <= 8 dims */

    atomic_file f;
    qkv_status s = atomic_file_open(&f, path);
    if (s != QKV_OK) return s;
    atomic_file_write(&f, head, hn);
    atomic_file_write_le(&f, a->data, (size_t)count, elem);
    return atomic_file_close(&f, 1);
}
