/* safetensors files: the weight format of the PyTorch / Hugging Face
 * ecosystem (https://github.com/huggingface/safetensors, "Format").
 *
 *   [8 bytes] N, little-endian u64
 *   [N bytes] JSON: {"__metadata__": {str: str}?,
 *                    name: {"dtype": "F32", "shape": [2, 3], "data_offsets": [b, e]}, ...}
 *   [rest]    the data buffer; tensor bytes are [b, e) of it, little-endian, C order
 *
 * Files are untrusted input: the header is parsed by a strict tokenizer that
 * walks the expected grammar (no recursion, so no nesting bomb), every offset
 * and size is checked (with overflow checks) before anything is read or
 * allocated for the data, and names and metadata are validated. Loading reads
 * the header, checks all of it, then reads each tensor straight into its
 * array (no second copy of the file in memory).
 *
 * Decisions beyond the format text:
 *  - holes: bytes of the data buffer that no tensor covers are accepted (the
 *    reference implementation rejects them); overlapping tensors are not.
 *  - names on load: any non-empty valid UTF-8 without NUL (put is stricter,
 *    see qkv.h); "__metadata__" is always the metadata map; duplicate tensor
 *    names or metadata keys are FORMAT errors; a tensor object must hold
 *    exactly "dtype", "shape" and "data_offsets".
 *  - mapped sets (qkv_safetensors_map, io/safetensors_map.h): the same
 *    parse and checks over a read-only mmap of the file; F32, F64, I32 and
 *    I64 tensors whose bytes are aligned for their type point into the
 *    mapping (on a little-endian host), the others (F16 and BF16, widened
 *    to F32, or a misaligned tensor) are converted or copied once into
 *    owned arrays. The mapping lives until the set is freed.
 *  - save: insertion order, metadata first, tensors packed back to back (no
 *    holes, so the reference loader accepts the file), the header padded
 *    with spaces so the data buffer starts at a multiple of 8 bytes.
 */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* madvise */
#define _FILE_OFFSET_BITS 64

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/internal.h"
#include "io/atomic_write.h"
#include "io/byte_order.h"
#include "io/json.h"
#include "io/safetensors_map.h"

#define ST_MAX_HEADER 100000000u /* the reference implementation's limit */
#define ST_NAME_MAX 255
#define ST_META_MAX 65535

typedef struct st_tensor {
    char *name;
    qkv_array arr;
    int borrowed; /* arr.data points into the set's mapping: not freed */
} st_tensor;

typedef struct st_meta {
    char *key, *value;
} st_meta;

struct qkv_safetensors {
    st_tensor *t;
    int64_t n, cap;
    st_meta *m;
    int64_t nm, capm;
    void *map;      /* the read-only mapping of a mapped set, or NULL */
    size_t map_len;
};

/* ---- dtypes of the file ------------------------------------------------ */

enum { ST_LOAD_NONE = -1 };

typedef struct st_dtype_info {
    const char *name;
    size_t elem;   /* bytes per element in the file */
    int load;      /* the qkv_dtype it loads as, or ST_LOAD_NONE */
} st_dtype_info;

static const st_dtype_info st_dtypes[] = {
    {"F32", 4, QKV_F32},  {"F64", 8, QKV_F64},   {"I32", 4, QKV_I32},
    {"I64", 8, QKV_I64},  {"F16", 2, QKV_F32},   {"BF16", 2, QKV_F32},
    /* known to the format, not loadable by qkv */
    {"BOOL", 1, ST_LOAD_NONE}, {"U8", 1, ST_LOAD_NONE},  {"I8", 1, ST_LOAD_NONE},
    {"I16", 2, ST_LOAD_NONE},  {"U16", 2, ST_LOAD_NONE}, {"U32", 4, ST_LOAD_NONE},
    {"U64", 8, ST_LOAD_NONE},  {"F8_E5M2", 1, ST_LOAD_NONE}, {"F8_E4M3", 1, ST_LOAD_NONE},
    {"F8_E8M0", 1, ST_LOAD_NONE}, {"F6_E2M3", 1, ST_LOAD_NONE}, {"F6_E3M2", 1, ST_LOAD_NONE},
    {"F4", 1, ST_LOAD_NONE}, {"C64", 8, ST_LOAD_NONE},
};
#define ST_F16 4
#define ST_BF16 5
#define ST_NDTYPES ((int)(sizeof st_dtypes / sizeof st_dtypes[0]))

static const char *st_dtype_name(qkv_dtype d) {
    switch (d) {
    case QKV_F32: return "F32";
    case QKV_F64: return "F64";
    case QKV_I32: return "I32";
    case QKV_I64: return "I64";
    case QKV_BF16: return "BF16"; /* saved as such; loading widens them to F32 */
    case QKV_F16: return "F16";
    }
    return NULL;
}

/* ---- small helpers ----------------------------------------------------- */

/* IEEE binary16 -> binary32, exact for every value: subnormals become
 * normal floats, infinities stay infinite, NaNs keep sign and payload. */
static float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu, bits;
    float f;
    if (exp == 0) {
        f = (float)mant * 0x1p-24f; /* subnormal (or zero): mant * 2^-24, exact */
        return sign ? -f : f;
    }
    if (exp == 31)
        bits = sign | 0x7F800000u | (mant << 13);
    else
        bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    memcpy(&f, &bits, 4);
    return f;
}

/* bfloat16 is the top half of a binary32. */
static float bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static char *str_dup_n(const char *s, size_t n) {
    char *d = qkv_alloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

/* Grow an array of `elem`-byte items to hold `need`; 0 when out of memory. */
static int grow(void **items, int64_t *cap, int64_t need, size_t elem) {
    if (need <= *cap) return 1;
    int64_t c = *cap ? *cap : 8;
    while (c < need) c *= 2;
    if ((uint64_t)c > SIZE_MAX / elem) return 0;
    void *p = qkv_alloc((size_t)c * elem);
    if (!p) return 0;
    if (*items) memcpy(p, *items, (size_t)*cap * elem);
    qkv_free(*items);
    *items = p;
    *cap = c;
    return 1;
}

/* A name quoted for a message: at most 48 bytes, non-printable bytes as '?'. */
static const char *show(const char *s, char out[64]) {
    size_t i = 0, o = 0;
    for (; s[i] && o < 48; i++) {
        unsigned char c = (unsigned char)s[i];
        out[o++] = (c >= 0x20 && c < 0x7F) ? (char)c : '?';
    }
    if (s[i]) {
        memcpy(out + o, "...", 3);
        o += 3;
    }
    out[o] = '\0';
    return out;
}

/* ---- set: create, free, query ------------------------------------------ */

qkv_status qkv_safetensors_create(qkv_safetensors **out) {
    if (!out) return QKV_ERR_NULL_POINTER;
    *out = qkv_alloc_zeroed(sizeof **out);
    return *out ? QKV_OK : QKV_ERR_OUT_OF_MEMORY;
}

void qkv_safetensors_free(qkv_safetensors *st) {
    if (!st) return;
    for (int64_t i = 0; i < st->n; i++) {
        qkv_free(st->t[i].name);
        if (!st->t[i].borrowed) qkv_array_free(&st->t[i].arr);
    }
    for (int64_t i = 0; i < st->nm; i++) {
        qkv_free(st->m[i].key);
        qkv_free(st->m[i].value);
    }
    qkv_free(st->t);
    qkv_free(st->m);
    if (st->map) munmap(st->map, st->map_len);
    qkv_free(st);
}

int64_t qkv_safetensors_count(const qkv_safetensors *st) { return st ? st->n : 0; }

const char *qkv_safetensors_name(const qkv_safetensors *st, int64_t i) {
    if (!st || i < 0 || i >= st->n) return NULL;
    return st->t[i].name;
}

static int64_t find_tensor(const qkv_safetensors *st, const char *name) {
    for (int64_t i = 0; i < st->n; i++)
        if (strcmp(st->t[i].name, name) == 0) return i;
    return -1;
}

static int64_t find_meta(const qkv_safetensors *st, const char *key) {
    for (int64_t i = 0; i < st->nm; i++)
        if (strcmp(st->m[i].key, key) == 0) return i;
    return -1;
}

const qkv_array *qkv_safetensors_get(const qkv_safetensors *st, const char *name) {
    if (!st || !name) return NULL;
    int64_t i = find_tensor(st, name);
    return i < 0 ? NULL : &st->t[i].arr;
}

const char *qkv_safetensors_get_meta(const qkv_safetensors *st, const char *key) {
    if (!st || !key) return NULL;
    int64_t i = find_meta(st, key);
    return i < 0 ? NULL : st->m[i].value;
}

/* The rule of qkv.h: 1..max bytes of printable ASCII except '"' and '\\'. */
static int name_ok(const char *s, size_t max) {
    size_t n = 0;
    for (; s[n]; n++) {
        unsigned char c = (unsigned char)s[n];
        if (n >= max || c < 0x20 || c > 0x7E || c == '"' || c == '\\') return 0;
    }
    return n >= 1;
}

qkv_status qkv_safetensors_put(qkv_safetensors *st, const char *name, const qkv_array *a) {
    if (!st || !name || !a) return QKV_ERR_NULL_POINTER;
    /* "__metadata__" is the metadata map in a file, never a tensor. */
    if (!name_ok(name, ST_NAME_MAX) || strcmp(name, "__metadata__") == 0)
        return QKV_ERR_BAD_PARAMETER;
    size_t elem = qkv_dtype_size(a->dtype);
    if (elem == 0) return QKV_ERR_DTYPE;

    /* Copy first: `a` may live inside this set, and a failure must leave the
     * set as it was. */
    qkv_array copy;
    qkv_status s = qkv_array_alloc(&copy, a->dtype, a->ndim, a->shape);
    if (s != QKV_OK) return s;
    int64_t count = qkv_array_count(&copy);
    if (count > 0) {
        if (!a->data) {
            qkv_array_free(&copy);
            return QKV_ERR_NULL_POINTER;
        }
        memcpy(copy.data, a->data, (size_t)count * elem);
    }

    int64_t i = find_tensor(st, name);
    if (i >= 0) {
        if (!st->t[i].borrowed) qkv_array_free(&st->t[i].arr);
        st->t[i].arr = copy;
        st->t[i].borrowed = 0;
        return QKV_OK;
    }
    char *nm = str_dup_n(name, strlen(name));
    if (!nm || !grow((void **)&st->t, &st->cap, st->n + 1, sizeof *st->t)) {
        qkv_free(nm);
        qkv_array_free(&copy);
        return QKV_ERR_OUT_OF_MEMORY;
    }
    st->t[st->n].name = nm;
    st->t[st->n].arr = copy;
    st->t[st->n].borrowed = 0;
    st->n++;
    return QKV_OK;
}

/* Append or replace a metadata entry, taking ownership of key and value
 * (freed on failure). No rule is checked: loading accepts any string. */
static qkv_status meta_add(qkv_safetensors *st, char *key, char *value) {
    int64_t i = find_meta(st, key);
    if (i >= 0) {
        qkv_free(key);
        qkv_free(st->m[i].value);
        st->m[i].value = value;
        return QKV_OK;
    }
    if (!grow((void **)&st->m, &st->capm, st->nm + 1, sizeof *st->m)) {
        qkv_free(key);
        qkv_free(value);
        return QKV_ERR_OUT_OF_MEMORY;
    }
    st->m[st->nm].key = key;
    st->m[st->nm].value = value;
    st->nm++;
    return QKV_OK;
}

qkv_status qkv_safetensors_set_meta(qkv_safetensors *st, const char *key, const char *value) {
    if (!st || !key || !value) return QKV_ERR_NULL_POINTER;
    if (!name_ok(key, ST_META_MAX) || !name_ok(value, ST_META_MAX)) return QKV_ERR_BAD_PARAMETER;
    char *k = str_dup_n(key, strlen(key));
    char *v = str_dup_n(value, strlen(value));
    if (!k || !v) {
        qkv_free(k);
        qkv_free(v);
        return QKV_ERR_OUT_OF_MEMORY;
    }
    return meta_add(st, k, v);
}

/* ---- reading ----------------------------------------------------------- */

/* Where the bytes of a file come from: memory (parse) or a descriptor (load). */
typedef struct st_src {
    const unsigned char *mem;  /* the whole file, or NULL */
    int fd;
    uint64_t len;
    int borrow;                /* mem is a mapping the set keeps: tensors may point into it */
} st_src;

/* Read n bytes at off (the caller checked off + n <= len). */
static int src_read(const st_src *src, uint64_t off, void *buf, size_t n) {
    if (src->mem) {
        memcpy(buf, src->mem + off, n);
        return 1;
    }
    unsigned char *p = buf;
    while (n > 0) {
        size_t chunk = n > (1u << 30) ? (1u << 30) : n;
        ssize_t r = pread(src->fd, p, chunk, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return 0; /* error, or the file shrank under us */
        p += r;
        off += (uint64_t)r;
        n -= (size_t)r;
    }
    return 1;
}

/* One tensor of the header, as parsed. */
typedef struct st_entry {
    char *name;
    int dtype;                 /* index in st_dtypes, or -1 when unknown */
    char dtype_text[24];       /* the dtype as written (for messages) */
    int ndim;
    int64_t shape[QKV_NPY_MAX_DIMS];
    uint64_t begin, end;
} st_entry;

typedef struct st_ctx {
    const st_src *src;
    uint64_t data_start, data_size;
    qkv_json j;
    char *why;
    size_t why_len;
    qkv_status status;
    st_entry *e;
    int64_t ne, cape;
    qkv_safetensors *set;
} st_ctx;

static qkv_status st_fail(st_ctx *c, qkv_status s, const char *fmt, ...) {
    if (c->status == QKV_OK) {
        c->status = s;
        va_list ap;
        va_start(ap, fmt);
        qkv_vset_why(c->why, c->why_len, fmt, ap);
        va_end(ap);
    }
    return c->status;
}

static qkv_status json_error(st_ctx *c) {
    return st_fail(c, QKV_ERR_FORMAT, "header JSON, byte %zu: %s", c->j.err_pos,
                   c->j.err ? c->j.err : "syntax error");
}

/* The ',' between members or elements, not followed by the closing `close`
 * (JSON has no trailing commas). */
static int comma(st_ctx *c, char close, const char *msg) {
    if (!qkv_json_expect(&c->j, ',', msg)) return 0;
    if (qkv_json_peek(&c->j) == (unsigned char)close) return qkv_json_fail(&c->j, "trailing comma");
    return 1;
}

/* Read the string at the cursor into a new buffer. *has_nul tells whether
 * it holds a NUL byte (from \u0000). */
static qkv_status read_string(st_ctx *c, char **out, size_t *len, int *has_nul) {
    *out = NULL;
    if (!qkv_json_string_measure(&c->j, len)) return json_error(c);
    char *s = qkv_alloc(*len + 1);
    if (!s) return st_fail(c, QKV_ERR_OUT_OF_MEMORY, "out of memory");
    qkv_json_string_read(&c->j, s, *len + 1, len, has_nul);
    *out = s;
    return QKV_OK;
}

/* A key of a small fixed set: read into buf, "" when too long to match. */
static qkv_status read_key(st_ctx *c, char *buf, size_t cap) {
    size_t len;
    int nul;
    if (!qkv_json_string_read(&c->j, buf, cap, &len, &nul)) return json_error(c);
    if (len >= cap || nul) buf[0] = '\0';
    return QKV_OK;
}

static int shape_text(const st_entry *e, char *out, size_t cap) {
    size_t o = 0;
    o += (size_t)snprintf(out, cap, "[");
    for (int i = 0; i < e->ndim && o < cap; i++)
        o += (size_t)snprintf(out + o, cap - o, "%s%lld", i ? ", " : "", (long long)e->shape[i]);
    if (o < cap) snprintf(out + o, cap - o, "]");
    return 1;
}

static qkv_status parse_shape(st_ctx *c, st_entry *e, const char *nm) {
    if (!qkv_json_expect(&c->j, '[', "\"shape\" must be an array")) return json_error(c);
    e->ndim = 0;
    if (qkv_json_peek(&c->j) == ']') {
        c->j.p++;
        return QKV_OK;
    }
    for (;;) {
        uint64_t v;
        switch (qkv_json_uint(&c->j, &v)) {
        case QKV_JSON_UINT_OK: break;
        case QKV_JSON_UINT_NEGATIVE:
            return st_fail(c, QKV_ERR_FORMAT, "tensor '%s': negative number in \"shape\"", nm);
        case QKV_JSON_UINT_FRACTION:
            return st_fail(c, QKV_ERR_FORMAT, "tensor '%s': non-integer number in \"shape\"", nm);
        case QKV_JSON_UINT_TOO_LARGE: v = UINT64_MAX; break;
        case QKV_JSON_UINT_SYNTAX: return json_error(c);
        }
        if (v > (uint64_t)INT64_MAX)
            return st_fail(c, QKV_ERR_SIZE_OVERFLOW, "tensor '%s': a dimension of \"shape\" exceeds 2^63 - 1", nm);
        if (e->ndim == QKV_NPY_MAX_DIMS)
            return st_fail(c, QKV_ERR_FORMAT, "tensor '%s': \"shape\" has more than %d dimensions", nm,
                           QKV_NPY_MAX_DIMS);
        e->shape[e->ndim++] = (int64_t)v;
        int ch = qkv_json_peek(&c->j);
        if (ch == ']') {
            c->j.p++;
            return QKV_OK;
        }
        if (!comma(c, ']', "expected ',' or ']' in \"shape\"")) return json_error(c);
    }
}

static qkv_status parse_offsets(st_ctx *c, st_entry *e, const char *nm) {
    uint64_t v[2];
    if (!qkv_json_expect(&c->j, '[', "\"data_offsets\" must be an array")) return json_error(c);
    for (int i = 0; i < 2; i++) {
        if (i && !qkv_json_expect(&c->j, ',', "\"data_offsets\" needs two numbers")) return json_error(c);
        switch (qkv_json_uint(&c->j, &v[i])) {
        case QKV_JSON_UINT_OK: break;
        case QKV_JSON_UINT_NEGATIVE:
            return st_fail(c, QKV_ERR_FORMAT, "tensor '%s': negative number in \"data_offsets\"", nm);
        case QKV_JSON_UINT_FRACTION:
            return st_fail(c, QKV_ERR_FORMAT, "tensor '%s': non-integer number in \"data_offsets\"", nm);
        case QKV_JSON_UINT_TOO_LARGE:
            return st_fail(c, QKV_ERR_FORMAT, "tensor '%s': \"data_offsets\" beyond 2^64", nm);
        case QKV_JSON_UINT_SYNTAX: return json_error(c);
        }
    }
    if (!qkv_json_expect(&c->j, ']', "\"data_offsets\" must hold exactly two numbers")) return json_error(c);
    e->begin = v[0];
    e->end = v[1];
    return QKV_OK;
}

/* Everything about one tensor that can be checked alone. */
static qkv_status check_entry(st_ctx *c, const st_entry *e, const char *nm) {
    if (e->dtype < 0)
        return st_fail(c, QKV_ERR_DTYPE, "tensor '%s': unknown dtype '%s'", nm, e->dtype_text);
    const st_dtype_info *d = &st_dtypes[e->dtype];
    if (d->load == ST_LOAD_NONE)
        return st_fail(c, QKV_ERR_DTYPE,
                       "tensor '%s': dtype %s is not supported (qkv loads F32, F64, I32, I64, F16, BF16)",
                       nm, d->name);
    char sh[256];
    shape_text(e, sh, sizeof sh);
    /* The product of the non-zero dims must fit, in the file's bytes and in
     * the loaded array's (F16 doubles), whatever position a zero dim has. */
    int64_t nz = 1;
    int zero = 0;
    size_t load_elem = qkv_dtype_size((qkv_dtype)d->load);
    for (int i = 0; i < e->ndim; i++) {
        if (e->shape[i] == 0) zero = 1;
        else if (!qkv_mul_ok(nz, e->shape[i], &nz)) nz = -1;
        if (nz < 0) break;
    }
    if (nz < 0 || (uint64_t)nz > (uint64_t)INT64_MAX / 8 || (uint64_t)nz > SIZE_MAX / load_elem)
        return st_fail(c, QKV_ERR_SIZE_OVERFLOW, "tensor '%s': shape %s of %s is too large", nm, sh, d->name);
    uint64_t need = zero ? 0 : (uint64_t)nz * d->elem;
    if (e->begin > e->end)
        return st_fail(c, QKV_ERR_FORMAT, "tensor '%s': data_offsets [%llu, %llu] begin after end", nm,
                       (unsigned long long)e->begin, (unsigned long long)e->end);
    if (e->end > c->data_size)
        return st_fail(c, QKV_ERR_FORMAT,
                       "tensor '%s': data_offsets [%llu, %llu] past the end of the %llu-byte data buffer", nm,
                       (unsigned long long)e->begin, (unsigned long long)e->end,
                       (unsigned long long)c->data_size);
    if (e->end - e->begin != need)
        return st_fail(c, QKV_ERR_FORMAT, "tensor '%s': data_offsets [%llu, %llu] but shape %s of %s needs %llu bytes",
                       nm, (unsigned long long)e->begin, (unsigned long long)e->end, sh, d->name,
                       (unsigned long long)need);
    return QKV_OK;
}

/* The value of a tensor key: {"dtype": .., "shape": [..], "data_offsets": [b, e]}. */
static qkv_status parse_tensor(st_ctx *c, st_entry *e) {
    char nm[64], key[16];
    int seen[3] = {0, 0, 0};
    static const char *const keys[3] = {"dtype", "shape", "data_offsets"};
    qkv_status s;
    show(e->name, nm);
    if (qkv_json_peek(&c->j) != '{')
        return st_fail(c, QKV_ERR_FORMAT, "tensor '%s': the value is not an object", nm);
    c->j.p++;
    if (qkv_json_peek(&c->j) == '}') {
        c->j.p++;
    } else {
        for (;;) {
            if ((s = read_key(c, key, sizeof key)) != QKV_OK) return s;
            int k = 0;
            while (k < 3 && strcmp(key, keys[k]) != 0) k++;
            if (k == 3) return st_fail(c, QKV_ERR_FORMAT, "tensor '%s': unknown key (only dtype, shape, data_offsets)", nm);
            if (seen[k]) return st_fail(c, QKV_ERR_FORMAT, "tensor '%s': key \"%s\" appears twice", nm, keys[k]);
            seen[k] = 1;
            if (!qkv_json_expect(&c->j, ':', "expected ':' after a key")) return json_error(c);
            if (k == 0) {
                size_t len;
                int nul;
                if (qkv_json_peek(&c->j) != '"')
                    return st_fail(c, QKV_ERR_FORMAT, "tensor '%s': \"dtype\" is not a string", nm);
                if (!qkv_json_string_read(&c->j, e->dtype_text, sizeof e->dtype_text, &len, &nul))
                    return json_error(c);
                e->dtype = -1;
                for (int d = 0; d < ST_NDTYPES && !nul && len < sizeof e->dtype_text; d++)
                    if (strcmp(e->dtype_text, st_dtypes[d].name) == 0) e->dtype = d;
                char tmp[64];
                show(e->dtype_text, tmp);
                memcpy(e->dtype_text, tmp, sizeof e->dtype_text - 1);
                e->dtype_text[sizeof e->dtype_text - 1] = '\0';
            } else if (k == 1) {
                if ((s = parse_shape(c, e, nm)) != QKV_OK) return s;
            } else {
                if ((s = parse_offsets(c, e, nm)) != QKV_OK) return s;
            }
            int ch = qkv_json_peek(&c->j);
            if (ch == '}') {
                c->j.p++;
                break;
            }
            if (!comma(c, '}', "expected ',' or '}' in a tensor object")) return json_error(c);
        }
    }
    for (int k = 0; k < 3; k++)
        if (!seen[k]) return st_fail(c, QKV_ERR_FORMAT, "tensor '%s': missing \"%s\"", nm, keys[k]);
    return check_entry(c, e, nm);
}

static qkv_status parse_metadata(st_ctx *c) {
    qkv_status s;
    if (qkv_json_peek(&c->j) != '{')
        return st_fail(c, QKV_ERR_FORMAT, "\"__metadata__\" is not an object of strings");
    c->j.p++;
    if (qkv_json_peek(&c->j) == '}') {
        c->j.p++;
        return QKV_OK;
    }
    for (;;) {
        char *k, *v;
        size_t len;
        int nul;
        if ((s = read_string(c, &k, &len, &nul)) != QKV_OK) return s;
        if (nul) {
            qkv_free(k);
            return st_fail(c, QKV_ERR_FORMAT, "a \"__metadata__\" key contains a NUL character");
        }
        if (!qkv_json_expect(&c->j, ':', "expected ':' after a key")) {
            qkv_free(k);
            return json_error(c);
        }
        if (qkv_json_peek(&c->j) != '"') {
            char nm[64];
            st_fail(c, QKV_ERR_FORMAT, "\"__metadata__\" '%s': the value is not a string", show(k, nm));
            qkv_free(k);
            return c->status;
        }
        if ((s = read_string(c, &v, &len, &nul)) != QKV_OK) {
            qkv_free(k);
            return s;
        }
        if (nul) {
            char nm[64];
            st_fail(c, QKV_ERR_FORMAT, "\"__metadata__\" '%s': the value contains a NUL character", show(k, nm));
            qkv_free(k);
            qkv_free(v);
            return c->status;
        }
        /* appended as is: duplicates are found by check_set, in O(n log n) */
        qkv_safetensors *set = c->set;
        if (!grow((void **)&set->m, &set->capm, set->nm + 1, sizeof *set->m)) {
            qkv_free(k);
            qkv_free(v);
            return st_fail(c, QKV_ERR_OUT_OF_MEMORY, "out of memory");
        }
        set->m[set->nm].key = k;
        set->m[set->nm].value = v;
        set->nm++;
        int ch = qkv_json_peek(&c->j);
        if (ch == '}') {
            c->j.p++;
            return QKV_OK;
        }
        if (!comma(c, '}', "expected ',' or '}' in \"__metadata__\"")) return json_error(c);
    }
}

static qkv_status parse_header(st_ctx *c) {
    qkv_status s;
    int seen_meta = 0;
    if (qkv_json_peek(&c->j) != '{') return st_fail(c, QKV_ERR_FORMAT, "the header is not a JSON object");
    c->j.p++;
    if (qkv_json_peek(&c->j) == '}') {
        c->j.p++;
    } else {
        for (;;) {
            char *name;
            size_t len;
            int nul;
            if ((s = read_string(c, &name, &len, &nul)) != QKV_OK) return s;
            if (strcmp(name, "__metadata__") == 0 && !nul) {
                qkv_free(name);
                if (seen_meta) return st_fail(c, QKV_ERR_FORMAT, "\"__metadata__\" appears twice");
                seen_meta = 1;
                if (!qkv_json_expect(&c->j, ':', "expected ':' after a key")) return json_error(c);
                if ((s = parse_metadata(c)) != QKV_OK) return s;
            } else {
                if (nul || len == 0) {
                    qkv_free(name);
                    return st_fail(c, QKV_ERR_FORMAT, "a tensor name is empty or contains a NUL character");
                }
                if (!grow((void **)&c->e, &c->cape, c->ne + 1, sizeof *c->e)) {
                    qkv_free(name);
                    return st_fail(c, QKV_ERR_OUT_OF_MEMORY, "out of memory");
                }
                st_entry *e = &c->e[c->ne++];
                memset(e, 0, sizeof *e);
                e->name = name;
                if (!qkv_json_expect(&c->j, ':', "expected ':' after a key")) return json_error(c);
                if ((s = parse_tensor(c, e)) != QKV_OK) return s;
            }
            int ch = qkv_json_peek(&c->j);
            if (ch == '}') {
                c->j.p++;
                break;
            }
            if (!comma(c, '}', "expected ',' or '}' after a tensor")) return json_error(c);
        }
    }
    if (!qkv_json_at_end(&c->j)) {
        qkv_json_fail(&c->j, "characters after the header object");
        return json_error(c);
    }
    return QKV_OK;
}

static int cmp_entry_name(const void *a, const void *b) {
    return strcmp((*(const st_entry *const *)a)->name, (*(const st_entry *const *)b)->name);
}

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int cmp_entry_range(const void *a, const void *b) {
    const st_entry *x = *(const st_entry *const *)a, *y = *(const st_entry *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* Duplicate names and overlapping byte ranges, in O(n log n) so that a
 * header of a million tensors cannot stall the loader. */
static qkv_status check_set(st_ctx *c) {
    char a[64], b[64];
    const qkv_safetensors *set = c->set;
    if (set->nm > 1) {
        const char **k = qkv_alloc((size_t)set->nm * sizeof *k);
        if (!k) return st_fail(c, QKV_ERR_OUT_OF_MEMORY, "out of memory");
        for (int64_t i = 0; i < set->nm; i++) k[i] = set->m[i].key;
        qsort((void *)k, (size_t)set->nm, sizeof *k, cmp_str_ptr);
        for (int64_t i = 1; i < set->nm && c->status == QKV_OK; i++)
            if (strcmp(k[i - 1], k[i]) == 0)
                st_fail(c, QKV_ERR_FORMAT, "\"__metadata__\" key '%s' appears twice", show(k[i], a));
        qkv_free((void *)k);
        if (c->status != QKV_OK) return c->status;
    }
    if (c->ne < 2) return QKV_OK;
    const st_entry **v = qkv_alloc((size_t)c->ne * sizeof *v);
    if (!v) return st_fail(c, QKV_ERR_OUT_OF_MEMORY, "out of memory");
    for (int64_t i = 0; i < c->ne; i++) v[i] = &c->e[i];
    qsort(v, (size_t)c->ne, sizeof *v, cmp_entry_name);
    for (int64_t i = 1; i < c->ne && c->status == QKV_OK; i++)
        if (strcmp(v[i - 1]->name, v[i]->name) == 0)
            st_fail(c, QKV_ERR_FORMAT, "tensor '%s' appears twice", show(v[i]->name, a));
    /* Sorted by begin, any overlap shows between neighbours; empty tensors
     * occupy no bytes and overlap nothing. */
    int64_t m = 0;
    for (int64_t i = 0; i < c->ne; i++)
        if (c->e[i].end > c->e[i].begin) v[m++] = &c->e[i];
    qsort(v, (size_t)m, sizeof *v, cmp_entry_range);
    for (int64_t i = 1; i < m && c->status == QKV_OK; i++)
        if (v[i - 1]->end > v[i]->begin)
            st_fail(c, QKV_ERR_FORMAT, "tensors '%s' [%llu, %llu] and '%s' [%llu, %llu] overlap",
                    show(v[i - 1]->name, a), (unsigned long long)v[i - 1]->begin,
                    (unsigned long long)v[i - 1]->end, show(v[i]->name, b),
                    (unsigned long long)v[i]->begin, (unsigned long long)v[i]->end);
    qkv_free((void *)v);
    return c->status;
}

/* Read the tensor's bytes into its (allocated) array, converting to the
 * host's byte order and F16/BF16 to F32. */
static qkv_status load_data(st_ctx *c, const st_entry *e, qkv_array *arr) {
    const st_dtype_info *d = &st_dtypes[e->dtype];
    uint64_t off = c->data_start + e->begin, nbytes = e->end - e->begin;
    size_t count = (size_t)(nbytes / d->elem);
    if (e->dtype != ST_F16 && e->dtype != ST_BF16) {
        if (nbytes && !src_read(c->src, off, arr->data, (size_t)nbytes))
            return st_fail(c, QKV_ERR_IO, "read error (did the file change while loading?)");
        if (!qkv_host_is_le()) qkv_swap_bytes(arr->data, count, d->elem);
        return QKV_OK;
    }
    unsigned char buf[4096];
    float *dst = arr->data;
    for (size_t i = 0; i < count;) {
        size_t n = count - i < sizeof buf / 2 ? count - i : sizeof buf / 2;
        if (!src_read(c->src, off + 2 * (uint64_t)i, buf, 2 * n))
            return st_fail(c, QKV_ERR_IO, "read error (did the file change while loading?)");
        for (size_t k = 0; k < n; k++) {
            uint16_t h = (uint16_t)(buf[2 * k] | (buf[2 * k + 1] << 8));
            dst[i + k] = e->dtype == ST_F16 ? f16_to_f32(h) : bf16_to_f32(h);
        }
        i += n;
    }
    return QKV_OK;
}

static qkv_status st_read(const st_src *src, qkv_safetensors **out, char *why, size_t why_len) {
    st_ctx c;
    memset(&c, 0, sizeof c);
    c.src = src;
    c.why = why;
    c.why_len = why_len;
    if (why && why_len) why[0] = '\0';
    unsigned char *header = NULL;
    unsigned char lenbuf[8];

    if (src->len < 8) {
        st_fail(&c, QKV_ERR_FORMAT, "file of %llu bytes, shorter than the 8-byte header length",
                (unsigned long long)src->len);
        goto done;
    }
    if (!src_read(src, 0, lenbuf, 8)) {
        st_fail(&c, QKV_ERR_IO, "read error");
        goto done;
    }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | lenbuf[i];
    if (n == 0) {
        st_fail(&c, QKV_ERR_FORMAT, "header length 0: no JSON header");
        goto done;
    }
    if (n > src->len - 8) {
        st_fail(&c, QKV_ERR_FORMAT, "header length %llu exceeds the %llu bytes after it",
                (unsigned long long)n, (unsigned long long)(src->len - 8));
        goto done;
    }
    if (n > ST_MAX_HEADER) {
        st_fail(&c, QKV_ERR_FORMAT, "header length %llu exceeds the limit of %u bytes",
                (unsigned long long)n, ST_MAX_HEADER);
        goto done;
    }
    c.data_start = 8 + n;
    c.data_size = src->len - 8 - n;
    if (!(c.set = qkv_alloc_zeroed(sizeof *c.set))) {
        st_fail(&c, QKV_ERR_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    if (src->mem) {
        qkv_json_init(&c.j, src->mem + 8, (size_t)n);
    } else {
        if (!(header = qkv_alloc((size_t)n))) {
            st_fail(&c, QKV_ERR_OUT_OF_MEMORY, "out of memory");
            goto done;
        }
        if (!src_read(src, 8, header, (size_t)n)) {
            st_fail(&c, QKV_ERR_IO, "read error");
            goto done;
        }
        qkv_json_init(&c.j, header, (size_t)n);
    }
    if (parse_header(&c) != QKV_OK || check_set(&c) != QKV_OK) goto done;

    /* All checked: build the tensors. */
    if (c.ne > 0) {
        if (!(c.set->t = qkv_alloc_zeroed((size_t)c.ne * sizeof *c.set->t))) {
            st_fail(&c, QKV_ERR_OUT_OF_MEMORY, "out of memory");
            goto done;
        }
        c.set->cap = c.ne;
    }
    for (int64_t i = 0; i < c.ne; i++) {
        st_entry *e = &c.e[i];
        st_tensor *t = &c.set->t[i];
        const st_dtype_info *d = &st_dtypes[e->dtype];
        const unsigned char *at = src->mem ? src->mem + c.data_start + e->begin : NULL;
        if (src->borrow && qkv_host_is_le() && e->dtype != ST_F16 && e->dtype != ST_BF16 &&
            (uintptr_t)at % d->elem == 0) {
            t->arr.dtype = (qkv_dtype)d->load;
            t->arr.ndim = e->ndim;
            memcpy(t->arr.shape, e->shape, sizeof e->shape);
            t->arr.data = (void *)(uintptr_t)at; /* read-only pages */
            t->borrowed = 1;
            t->name = e->name;
            e->name = NULL;
            c.set->n = i + 1;
            continue;
        }
        qkv_status s = qkv_array_alloc(&t->arr, (qkv_dtype)st_dtypes[e->dtype].load, e->ndim, e->shape);
        if (s != QKV_OK) {
            char nm[64];
            st_fail(&c, s, "tensor '%s': %s", show(e->name, nm), qkv_status_string(s));
            goto done;
        }
        t->name = e->name; /* ownership moves to the set */
        e->name = NULL;
        c.set->n = i + 1;
        if (load_data(&c, e, &t->arr) != QKV_OK) goto done;
    }

done:
    for (int64_t i = 0; i < c.ne; i++) qkv_free(c.e[i].name);
    qkv_free(c.e);
    qkv_free(header);
    if (c.status != QKV_OK) {
        qkv_safetensors_free(c.set);
        c.set = NULL;
    }
    *out = c.set;
    return c.status;
}

qkv_status qkv_safetensors_parse(const void *bytes, size_t len, qkv_safetensors **out,
                                 char *why, size_t why_len) {
    if (out) *out = NULL;
    if (!out || (!bytes && len > 0)) {
        if (why && why_len) snprintf(why, why_len, "NULL argument");
        return QKV_ERR_NULL_POINTER;
    }
    st_src src = {bytes ? (const unsigned char *)bytes : (const unsigned char *)"", -1, len, 0};
    return st_read(&src, out, why, why_len);
}

/* Opens path for reading and checks that it is a regular file: *fd and
 * *sb on success; else a status and why, nothing left open. */
static qkv_status st_open(const char *path, qkv_safetensors **out, int *fd, struct stat *sb, char *why,
                          size_t why_len) {
    if (out) *out = NULL;
    if (!out || !path) return qkv_fail(why, why_len, QKV_ERR_NULL_POINTER, "NULL argument");
    do *fd = open(path, O_RDONLY | O_CLOEXEC);
    while (*fd < 0 && errno == EINTR);
    if (*fd < 0) return qkv_fail(why, why_len, QKV_ERR_IO, "cannot open: %s", strerror(errno));
    if (fstat(*fd, sb) != 0 || !S_ISREG(sb->st_mode)) {
        close(*fd);
        return qkv_fail(why, why_len, QKV_ERR_IO, "not a regular file");
    }
    return QKV_OK;
}

/* Read the whole file open at fd (size bytes), then close it. */
static qkv_status st_read_fd(int fd, uint64_t size, qkv_safetensors **out, char *why, size_t why_len) {
    st_src src = {NULL, fd, size, 0};
    qkv_status s = st_read(&src, out, why, why_len);
    close(fd);
    return s;
}

qkv_status qkv_safetensors_load(const char *path, qkv_safetensors **out, char *why, size_t why_len) {
    int fd;
    struct stat sb;
    qkv_status os = st_open(path, out, &fd, &sb, why, why_len);
    if (os != QKV_OK) return os;
    return st_read_fd(fd, (uint64_t)sb.st_size, out, why, why_len);
}

qkv_status qkv_safetensors_map(const char *path, qkv_safetensors **out, char *why, size_t why_len) {
    int fd;
    struct stat sb;
    qkv_status os = st_open(path, out, &fd, &sb, why, why_len);
    if (os != QKV_OK) return os;
    if ((uint64_t)sb.st_size < 8 || (uint64_t)sb.st_size > SIZE_MAX) {
        /* Too short for a header (st_read names the problem), or too large
         * to map: read it the ordinary way. */
        return st_read_fd(fd, (uint64_t)sb.st_size, out, why, why_len);
    }
    size_t len = (size_t)sb.st_size;
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd); /* the mapping keeps the file */
    if (map == MAP_FAILED) {
        if (why && why_len) snprintf(why, why_len, "cannot map: %s", strerror(errno));
        return QKV_ERR_IO;
    }
    st_src src = {map, -1, len, 1};
    qkv_status s = st_read(&src, out, why, why_len);
    if (s != QKV_OK) {
        munmap(map, len);
        return s;
    }
    (*out)->map = map;
    (*out)->map_len = len;
    return QKV_OK;
}

/* ---- writing ----------------------------------------------------------- */

typedef struct sbuf {
    char *p;
    size_t len, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->len + n + 1) {
            if (c > SIZE_MAX / 2) {
                b->oom = 1;
                return;
            }
            c *= 2;
        }
        char *q = qkv_alloc(c);
        if (!q) {
            b->oom = 1;
            return;
        }
        if (b->p) memcpy(q, b->p, b->len);
        qkv_free(b->p);
        b->p = q;
        b->cap = c;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_u64(sbuf *b, uint64_t v) {
    char t[24];
    sb_put(b, t, (size_t)snprintf(t, sizeof t, "%llu", (unsigned long long)v));
}

/* A JSON string literal. Names from put need no escapes; loaded ones may
 * hold anything but NUL (already valid UTF-8, so bytes >= 0x80 pass). */
static void sb_json(sbuf *b, const char *s) {
    sb_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            sb_put(b, e, 2);
        } else if (c < 0x20) {
            char e[8];
            sb_put(b, e, (size_t)snprintf(e, sizeof e, "\\u%04x", c));
        } else {
            sb_put(b, (const char *)&c, 1);
        }
    }
    sb_put(b, "\"", 1);
}

qkv_status qkv_safetensors_save(const qkv_safetensors *st, const char *path) {
    if (!st || !path) return QKV_ERR_NULL_POINTER;
    if (!*path) return QKV_ERR_IO;

    /* The header: metadata first, then the tensors packed in order. */
    sbuf h = {NULL, 0, 0, 0};
    sb_str(&h, "{");
    if (st->nm > 0) {
        sb_str(&h, "\"__metadata__\":{");
        for (int64_t i = 0; i < st->nm; i++) {
            if (i) sb_str(&h, ",");
            sb_json(&h, st->m[i].key);
            sb_str(&h, ":");
            sb_json(&h, st->m[i].value);
        }
        sb_str(&h, "}");
    }
    uint64_t off = 0;
    for (int64_t i = 0; i < st->n; i++) {
        const qkv_array *a = &st->t[i].arr;
        uint64_t bytes = (uint64_t)qkv_array_count(a) * qkv_dtype_size(a->dtype);
        if (i || st->nm > 0) sb_str(&h, ",");
        sb_json(&h, st->t[i].name);
        sb_str(&h, ":{\"dtype\":\"");
        sb_str(&h, st_dtype_name(a->dtype));
        sb_str(&h, "\",\"shape\":[");
        for (int d = 0; d < a->ndim; d++) {
            if (d) sb_str(&h, ",");
            sb_u64(&h, (uint64_t)a->shape[d]);
        }
        sb_str(&h, "],\"data_offsets\":[");
        sb_u64(&h, off);
        sb_str(&h, ",");
        sb_u64(&h, off + bytes);
        sb_str(&h, "]}");
        off += bytes;
    }
    sb_str(&h, "}");
    while (!h.oom && (8 + h.len) % 8 != 0) sb_str(&h, " "); /* data starts 8-aligned */
    /* A fresh file next to path, renamed over it when complete. */
    if (h.oom) {
        qkv_free(h.p);
        return QKV_ERR_OUT_OF_MEMORY;
    }
    atomic_file f;
    qkv_status s = atomic_file_open(&f, path);
    if (s == QKV_OK) {
        unsigned char lenbuf[8];
        for (int i = 0; i < 8; i++) lenbuf[i] = (unsigned char)((uint64_t)h.len >> (8 * i));
        atomic_file_write(&f, lenbuf, 8);
        atomic_file_write(&f, h.p, h.len);
        for (int64_t i = 0; i < st->n; i++) {
            const qkv_array *a = &st->t[i].arr;
            size_t count = (size_t)qkv_array_count(a);
            if (count) atomic_file_write_le(&f, a->data, count, qkv_dtype_size(a->dtype));
        }
        s = atomic_file_close(&f, 1);
    }
    qkv_free(h.p);
    return s;
}

void qkv_safetensors_release(const qkv_safetensors *st, const void *data, size_t bytes) {
#ifdef MADV_DONTNEED
    if (!st || !st->map || !data) return;
    uintptr_t lo = (uintptr_t)data, hi = lo + bytes, m0 = (uintptr_t)st->map, m1 = m0 + st->map_len;
    if (lo < m0 || hi > m1 || hi < lo) return;
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0) return;
    uintptr_t a = (lo + (uintptr_t)page - 1) / (uintptr_t)page * (uintptr_t)page, b = hi / (uintptr_t)page * (uintptr_t)page;
    if (b > a) (void)madvise((void *)a, b - a, MADV_DONTNEED);
#else
    (void)st;
    (void)data;
    (void)bytes;
#endif
}
