/* .npy I/O and qkv_array: round trips, hand-built files of every version,
 * header variants, every malformed case with its status, truncation at every
 * byte, random mutations, atomic save, allocation failure, NULL arguments,
 * dtype conversion. */
#define _POSIX_C_SOURCE 200809L /* mkdir, opendir, stat, umask */

#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "test_util.h"

/* ---- helpers ------------------------------------------------------------- */

/* A .npy file built by hand: magic, version major.minor, the header length
 * (2 bytes for major 1, else 4), the header text as given, the data. The
 * buffer is exactly *len bytes so that ASan catches any over-read. */
static unsigned char *make_npy(int major, int minor, const char *header, const void *data,
                               size_t nbytes, size_t *len) {
    size_t hl = strlen(header), lb = major == 1 ? 2 : 4;
    *len = 8 + lb + hl + nbytes;
    unsigned char *b = malloc(*len ? *len : 1);
    if (!b) abort();
    memcpy(b, "\x93NUMPY", 6);
    b[6] = (unsigned char)major;
    b[7] = (unsigned char)minor;
    for (size_t i = 0; i < lb; i++) b[8 + i] = (unsigned char)(hl >> (8 * i));
    memcpy(b + 8 + lb, header, hl);
    if (nbytes) memcpy(b + 8 + lb + hl, data, nbytes);
    return b;
}

static int is_zeroed(const qkv_array *a) {
    qkv_array z;
    memset(&z, 0, sizeof z);
    return memcmp(a, &z, sizeof z) == 0;
}

static const double k_data6[6] = {1.5, -2.0, 3.25, 0.0, 1e300, -7.0};

/* Parse header (version major.0) with data; check the status, that `why`
 * contains want_why (when given), and that *out is zeroed on failure. */
static void expect_parse_v(int line, int major, const char *header, const void *data, size_t nbytes,
                           qkv_status want, const char *want_why) {
    size_t len;
    unsigned char *b = make_npy(major, 0, header, data, nbytes, &len);
    qkv_array a;
    char why[200];
    memset(&a, 0xAB, sizeof a);
    qkv_status s = qkv_npy_parse(b, len, &a, why, sizeof why);
    CHECK(s == want, "line %d: header %s: got %d (%s), want %d", line, header, (int)s, why, (int)want);
    if (want_why) CHECK(strstr(why, want_why) != NULL, "line %d: why '%s' lacks '%s'", line, why, want_why);
    if (s != QKV_OK) {
        CHECK(is_zeroed(&a), "line %d: out not zeroed on failure", line);
        CHECK(why[0] != '\0' && strchr(why, '\n') == NULL, "line %d: why '%s' not one line", line, why);
    } else {
        CHECK(why[0] == '\0', "line %d: why '%s' on success", line, why);
    }
    qkv_array_free(&a);
    free(b);
}
#define EXPECT_PARSE(header, data, nbytes, want, why) \
    expect_parse_v(__LINE__, 1, header, data, nbytes, want, why)

static void write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (n && fwrite(p, 1, n, f) != n) abort();
    if (fclose(f) != 0) abort();
}

static unsigned char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    unsigned char *b = malloc(cap);
    size_t r;
    while (b && (r = fread(b + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) b = realloc(b, cap *= 2);
    }
    fclose(f);
    *len = n;
    return b;
}

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* Entries of a folder other than . and .. */
static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) n++;
    closedir(d);
    return n;
}

/* Fill an array with distinct values of its dtype. */
static void fill_pattern(qkv_array *a) {
    int64_t n = qkv_array_count(a);
    for (int64_t i = 0; i < n; i++) {
        double v = (double)(i * 7 % 23) - 11.0 + (double)i * 0.001;
        switch (a->dtype) {
        case QKV_F32: ((float *)a->data)[i] = (float)v; break;
        case QKV_F64: ((double *)a->data)[i] = v * 1e-5; break;
        case QKV_I32: ((int32_t *)a->data)[i] = (int32_t)(i * 1000003 % 2000000011 - 1000000000); break;
        case QKV_I64: ((int64_t *)a->data)[i] = (int64_t)i * 3000000000007LL - INT64_C(4000000000000000000); break;
        case QKV_BF16: case QKV_F16: ((uint16_t *)a->data)[i] = (uint16_t)(i * 40503u + 12345u); break;
        }
    }
}

static int same_array(const qkv_array *a, const qkv_array *b) {
    if (a->dtype != b->dtype || a->ndim != b->ndim) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    size_t bytes = (size_t)qkv_array_count(a) * qkv_dtype_size(a->dtype);
    return bytes == 0 || memcmp(a->data, b->data, bytes) == 0;
}

/* ---- a counting allocator that fails on demand -------------------------- */

static long g_live;       /* allocations not yet freed */
static long g_fail_at;    /* the allocation (0-based) that fails; -1 never */
static long g_calls;

static void *test_malloc(size_t size, void *user) {
    (void)user;
    if (g_fail_at >= 0 && g_calls++ == g_fail_at) return NULL;
    void *p = malloc(size);
    if (p) g_live++;
    return p;
}

static void test_free(void *p, void *user) {
    (void)user;
    if (p) g_live--;
    free(p);
}

static void failing_allocator(long fail_at) {
    g_fail_at = fail_at;
    g_calls = 0;
    qkv_set_allocator(test_malloc, test_free, NULL);
}

static void default_allocator(void) { qkv_set_allocator(NULL, NULL, NULL); }

/* ---- tests ---------------------------------------------------------------- */

static void test_dtype_size(void) {
    CHECK(qkv_dtype_size(QKV_F32) == 4, "f32");
    CHECK(qkv_dtype_size(QKV_F64) == 8, "f64");
    CHECK(qkv_dtype_size(QKV_I32) == 4, "i32");
    CHECK(qkv_dtype_size(QKV_I64) == 8, "i64");
    CHECK(qkv_dtype_size(QKV_BF16) == 2, "bf16");
    CHECK(qkv_dtype_size(QKV_F16) == 2, "f16");
    CHECK(qkv_dtype_size((qkv_dtype)6) == 0, "unknown");
    CHECK(qkv_dtype_size((qkv_dtype)-1) == 0, "unknown");
}

static void test_alloc_count_free(void) {
    qkv_array a;
    int64_t shape[QKV_NPY_MAX_DIMS + 1] = {2, 3, 1, 1, 1, 1, 1, 2, 1};

    for (int ndim = 0; ndim <= QKV_NPY_MAX_DIMS; ndim++) {
        memset(&a, 0xAB, sizeof a);
        CHECK_STATUS(qkv_array_alloc(&a, QKV_F64, ndim, shape), QKV_OK);
        CHECK(a.ndim == ndim && a.dtype == QKV_F64 && a.data != NULL, "ndim %d", ndim);
        int64_t want = 1;
        for (int i = 0; i < ndim; i++) want *= shape[i];
        CHECK(qkv_array_count(&a) == want, "count %lld, want %lld", (long long)qkv_array_count(&a), (long long)want);
        int zero = 1;
        for (int64_t i = 0; i < want; i++) zero &= ((double *)a.data)[i] == 0.0;
        CHECK(zero, "alloc zero-fills");
        qkv_array_free(&a);
        CHECK(is_zeroed(&a), "free zeroes");
        qkv_array_free(&a); /* already freed: fine */
    }
    CHECK_STATUS(qkv_array_alloc(&a, QKV_I32, 0, NULL), QKV_OK); /* shape may be NULL for ndim 0 */
    CHECK(qkv_array_count(&a) == 1, "ndim 0 has one element");
    qkv_array_free(&a);

    int64_t zshape[3] = {4, 0, 5};
    CHECK_STATUS(qkv_array_alloc(&a, QKV_F32, 3, zshape), QKV_OK);
    CHECK(qkv_array_count(&a) == 0 && a.data != NULL, "0-dim array still owns a buffer");
    qkv_array_free(&a);

    memset(&a, 0xAB, sizeof a);
    CHECK_STATUS(qkv_array_alloc(NULL, QKV_F32, 1, shape), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_array_alloc(&a, QKV_F32, 1, NULL), QKV_ERR_NULL_POINTER);
    CHECK(is_zeroed(&a), "zeroed on failure");
    CHECK_STATUS(qkv_array_alloc(&a, QKV_F32, -1, shape), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_array_alloc(&a, QKV_F32, QKV_NPY_MAX_DIMS + 1, shape), QKV_ERR_BAD_SIZE);
    int64_t neg[2] = {2, -1};
    CHECK_STATUS(qkv_array_alloc(&a, QKV_F32, 2, neg), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_array_alloc(&a, (qkv_dtype)9, 2, shape), QKV_ERR_DTYPE);
    int64_t big[2] = {INT64_MAX, 2};
    CHECK_STATUS(qkv_array_alloc(&a, QKV_F32, 2, big), QKV_ERR_SIZE_OVERFLOW);
    int64_t big2[1] = {INT64_MAX / 4 + 1};
    CHECK_STATUS(qkv_array_alloc(&a, QKV_F64, 1, big2), QKV_ERR_SIZE_OVERFLOW); /* bytes overflow size_t */
    int64_t big0[3] = {INT64_C(1) << 62, INT64_C(1) << 62, 0};
    CHECK_STATUS(qkv_array_alloc(&a, QKV_F32, 3, big0), QKV_ERR_SIZE_OVERFLOW); /* strides would overflow */
    int64_t big0b[3] = {0, INT64_C(1) << 62, INT64_C(1) << 62};
    CHECK_STATUS(qkv_array_alloc(&a, QKV_F32, 3, big0b), QKV_ERR_SIZE_OVERFLOW); /* wherever the 0 is */
    CHECK(is_zeroed(&a), "zeroed on failure");

    /* count is documented as unable to fail: invalid arrays have none. */
    CHECK(qkv_array_count(NULL) == 0, "NULL");
    memset(&a, 0, sizeof a);
    CHECK(qkv_array_count(&a) == 1, "zeroed array is a 0-d scalar shape");
    a.ndim = 9;
    CHECK(qkv_array_count(&a) == 0, "bad ndim");
    a.ndim = 2;
    a.shape[0] = 3;
    a.shape[1] = -2;
    CHECK(qkv_array_count(&a) == 0, "negative dim");
    a.shape[1] = INT64_MAX;
    CHECK(qkv_array_count(&a) == 0, "overflow");
    a.shape[0] = 0;
    a.shape[1] = 5;
    CHECK(qkv_array_count(&a) == 0, "zero dim");
    qkv_array_free(NULL);
}

/* Save then load every dtype over shapes of ndim 0..8, with zero dims. */
static void test_round_trips(void) {
    static const struct { int ndim; int64_t shape[QKV_NPY_MAX_DIMS]; } shapes[] = {
        {0, {0}},          {1, {1}},          {1, {5}},          {2, {2, 3}},       {3, {2, 3, 4}},
        {4, {2, 1, 3, 2}}, {1, {0}},          {2, {3, 0}},       {3, {2, 0, 4}},    {4, {0, 0, 0, 0}},
        {8, {1, 2, 1, 2, 1, 2, 1, 3}},        {1, {70000}},      {2, {12345678901LL, 0}},
    };
    static const qkv_dtype dtypes[] = {QKV_F32, QKV_F64, QKV_I32, QKV_I64, QKV_BF16, QKV_F16};
    char path[512];
    tu_tmp_path(path, sizeof path, "npy_round_trip.npy");
    for (size_t d = 0; d < 6; d++)
        for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
            qkv_array a, b, c;
            char why[200];
            CHECK_STATUS(qkv_array_alloc(&a, dtypes[d], shapes[k].ndim, shapes[k].shape), QKV_OK);
            fill_pattern(&a);
            CHECK_STATUS(qkv_npy_save(path, &a), QKV_OK);
            CHECK_STATUS(qkv_npy_load(path, &b, why, sizeof why), QKV_OK);
            CHECK(same_array(&a, &b), "dtype %d shape #%zu differs after load (%s)", (int)dtypes[d], k, why);
            size_t len = 0;
            unsigned char *bytes = read_file(path, &len);
            CHECK(bytes != NULL, "read back");
            if (bytes) {
                /* numpy's layout: version 1.0, data aligned to 64, header ends in '\n'. */
                size_t hl = (size_t)bytes[8] | (size_t)bytes[9] << 8;
                size_t nbytes = (size_t)qkv_array_count(&a) * qkv_dtype_size(a.dtype);
                CHECK(bytes[6] == 1 && bytes[7] == 0, "version 1.0");
                CHECK((10 + hl) % 64 == 0, "data offset %zu not a multiple of 64", 10 + hl);
                CHECK(bytes[10 + hl - 1] == '\n', "header ends in newline");
                CHECK(len == 10 + hl + nbytes, "file size %zu, want %zu", len, 10 + hl + nbytes);
                CHECK_STATUS(qkv_npy_parse(bytes, len, &c, why, sizeof why), QKV_OK);
                CHECK(same_array(&a, &c), "parse of the saved bytes");
                qkv_array_free(&c);
                free(bytes);
            }
            qkv_array_free(&a);
            qkv_array_free(&b);
        }
    unlink(path);
}

/* The exact bytes numpy writes (np.save of np.zeros(..., dtype) with numpy 2.x). */
static void test_exact_header(void) {
    static const struct { qkv_dtype dtype; int ndim; int64_t shape[3]; const char *dict; } cases[] = {
        {QKV_F32, 2, {2, 3}, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"},
        {QKV_F64, 1, {3}, "{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }"},
        {QKV_I64, 0, {0}, "{'descr': '<i8', 'fortran_order': False, 'shape': (), }"},
        {QKV_I32, 3, {10, 0, 7}, "{'descr': '<i4', 'fortran_order': False, 'shape': (10, 0, 7), }"},
    };
    char path[512];
    tu_tmp_path(path, sizeof path, "npy_exact.npy");
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        qkv_array a;
        CHECK_STATUS(qkv_array_alloc(&a, cases[k].dtype, cases[k].ndim, cases[k].shape), QKV_OK);
        CHECK_STATUS(qkv_npy_save(path, &a), QKV_OK);
        qkv_array_free(&a);
        /* numpy: dict, then 21 - digits(shape[0]) spaces (room to grow axis 0),
         * then spaces and '\n' up to 64-byte alignment. */
        char want[256];
        size_t n = (size_t)snprintf(want, sizeof want, "%s", cases[k].dict);
        if (cases[k].ndim > 0) {
            int digits = snprintf(NULL, 0, "%lld", (long long)cases[k].shape[0]);
            for (int i = digits; i < 21; i++) want[n++] = ' ';
        }
        while ((10 + n + 1) % 64 != 0) want[n++] = ' ';
        want[n++] = '\n';
        size_t len;
        unsigned char *bytes = read_file(path, &len);
        CHECK(bytes && len >= 10 + n, "read back");
        if (bytes && len >= 10 + n) {
            CHECK(memcmp(bytes, "\x93NUMPY\x01\x00", 8) == 0, "magic and version");
            CHECK(((size_t)bytes[8] | (size_t)bytes[9] << 8) == n, "header length");
            CHECK(memcmp(bytes + 10, want, n) == 0, "header of case %zu: '%.*s'", k, (int)n, (const char *)bytes + 10);
        }
        free(bytes);
    }
    unlink(path);
}

static void test_versions(void) {
    const char *h = "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }";
    for (int major = 1; major <= 3; major++) {
        size_t len;
        unsigned char *b = make_npy(major, 0, h, k_data6, sizeof k_data6, &len);
        qkv_array a;
        char why[200];
        CHECK_STATUS(qkv_npy_parse(b, len, &a, why, sizeof why), QKV_OK);
        CHECK(a.dtype == QKV_F64 && a.ndim == 2 && a.shape[0] == 2 && a.shape[1] == 3, "version %d.0", major);
        CHECK(a.data && memcmp(a.data, k_data6, sizeof k_data6) == 0, "data of version %d.0", major);
        qkv_array_free(&a);
        /* the same through a file */
        char path[512];
        tu_tmp_path(path, sizeof path, "npy_version.npy");
        write_file(path, b, len);
        CHECK_STATUS(qkv_npy_load(path, &a, why, sizeof why), QKV_OK);
        CHECK(a.data && a.ndim == 2 && memcmp(a.data, k_data6, sizeof k_data6) == 0, "load of version %d.0", major);
        qkv_array_free(&a);
        unlink(path);
        free(b);
    }
    /* A 2.0 header longer than 65535 bytes (numpy writes those for huge
     * structured dtypes): only the padding is long here. */
    size_t hl = 70000;
    char *big = malloc(hl + 1);
    int k = snprintf(big, hl + 1, "%s", h);
    memset(big + k, ' ', hl - (size_t)k - 1);
    big[hl - 1] = '\n';
    big[hl] = '\0';
    expect_parse_v(__LINE__, 2, big, k_data6, sizeof k_data6, QKV_OK, NULL);
    expect_parse_v(__LINE__, 3, big, k_data6, sizeof k_data6, QKV_OK, NULL);
    free(big);

    /* Python 2 longs "3L": numpy reads them in 1.0 and 2.0, not 3.0. */
    const char *hl2 = "{'descr': '<f8', 'fortran_order': False, 'shape': (2L, 3L), }";
    expect_parse_v(__LINE__, 1, hl2, k_data6, sizeof k_data6, QKV_OK, NULL);
    expect_parse_v(__LINE__, 2, hl2, k_data6, sizeof k_data6, QKV_OK, NULL);
    expect_parse_v(__LINE__, 3, hl2, k_data6, sizeof k_data6, QKV_ERR_FORMAT, "not an integer");

    /* Unknown versions. */
    static const int bad[][2] = {{0, 0}, {1, 1}, {2, 1}, {3, 1}, {4, 0}, {255, 0}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t len;
        unsigned char *b = make_npy(bad[i][0], bad[i][1], h, k_data6, sizeof k_data6, &len);
        qkv_array a;
        char why[200];
        CHECK_STATUS(qkv_npy_parse(b, len, &a, why, sizeof why), QKV_ERR_FORMAT);
        CHECK(strstr(why, "version") != NULL, "why: %s", why);
        free(b);
    }
}

static void test_header_variants(void) {
    const double *d = k_data6;
    const size_t n = sizeof k_data6;
    /* every key order */
    static const char *const orders[] = {
        "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }",
        "{'descr': '<f8', 'shape': (2, 3), 'fortran_order': False, }",
        "{'fortran_order': False, 'descr': '<f8', 'shape': (2, 3), }",
        "{'fortran_order': False, 'shape': (2, 3), 'descr': '<f8', }",
        "{'shape': (2, 3), 'descr': '<f8', 'fortran_order': False, }",
        "{'shape': (2, 3), 'fortran_order': False, 'descr': '<f8', }",
    };
    for (size_t i = 0; i < 6; i++) EXPECT_PARSE(orders[i], d, n, QKV_OK, NULL);
    /* whitespace, trailing commas or none, double quotes, padding */
    EXPECT_PARSE("{'descr':'<f8','fortran_order':False,'shape':(2,3)}", d, n, QKV_OK, NULL);
    EXPECT_PARSE("  {  'descr' : '<f8' ,\t'fortran_order' :\nFalse , 'shape' : ( 2 , 3 , ) , }  \n", d, n, QKV_OK, NULL);
    EXPECT_PARSE("{\"descr\": \"<f8\", \"fortran_order\": False, \"shape\": (2, 3)}", d, n, QKV_OK, NULL);
    EXPECT_PARSE("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3,), }\r\n", d, n, QKV_OK, NULL);
    EXPECT_PARSE("{'descr': '<f8', 'fortran_order': False, 'shape': (6,), }", d, n, QKV_OK, NULL);
    EXPECT_PARSE("{'descr': '<f8', 'fortran_order': False, 'shape': (6, ), }", d, n, QKV_OK, NULL);
    EXPECT_PARSE("{'descr': '<f8', 'fortran_order': False, 'shape': (), }", d, 8, QKV_OK, NULL);
    EXPECT_PARSE("{'descr': '<f8', 'fortran_order': False, 'shape': ( ), }", d, 8, QKV_OK, NULL);
    EXPECT_PARSE("{'descr': '<f8', 'fortran_order': False, 'shape': (1, 1, 6, 1, 1, 1, 1, 1), }", d, n, QKV_OK, NULL);
    EXPECT_PARSE("{'descr': '<f8', 'fortran_order': False, 'shape': (0,), }", NULL, 0, QKV_OK, NULL);
    EXPECT_PARSE("{'descr': '<f8', 'fortran_order': False, 'shape': (0, 1152921504606846975), }", NULL, 0, QKV_OK, NULL);
    /* ... but not when a stride would overflow, whatever the zero dim */
    EXPECT_PARSE("{'descr': '<f8', 'fortran_order': False, 'shape': (0, 9223372036854775807), }", NULL, 0,
                 QKV_ERR_SIZE_OVERFLOW, NULL);
    EXPECT_PARSE("{'descr': '<f8', 'fortran_order': False, 'shape': (003,), }", d, 24, QKV_OK, NULL);
    EXPECT_PARSE("{'descr': '<f8', 'fortran_order': False, 'shape': (-0,), }", NULL, 0, QKV_OK, NULL);
    /* Extra bytes after the data are ignored, as numpy.load ignores them. */
    EXPECT_PARSE("{'descr': '<f8', 'fortran_order': False, 'shape': (5,), }", d, n, QKV_OK, NULL);

    /* the parsed shapes and values */
    size_t len;
    unsigned char *b = make_npy(1, 0, "{'shape':(3,),'fortran_order':False,'descr':'<i4'}", "\1\0\0\0\2\0\0\0\xff\xff\xff\xff", 12, &len);
    qkv_array a;
    CHECK_STATUS(qkv_npy_parse(b, len, &a, NULL, 0), QKV_OK);
    CHECK(a.dtype == QKV_I32 && a.ndim == 1 && a.shape[0] == 3, "1-d i4");
    CHECK(a.data && ((int32_t *)a.data)[0] == 1 && ((int32_t *)a.data)[2] == -1, "i4 values little-endian");
    qkv_array_free(&a);
    free(b);
    b = make_npy(1, 0, "{'descr': '<i8', 'fortran_order': False, 'shape': (), }", "\x2a\0\0\0\0\0\0\x80", 8, &len);
    CHECK_STATUS(qkv_npy_parse(b, len, &a, NULL, 0), QKV_OK);
    CHECK(a.dtype == QKV_I64 && a.ndim == 0 && qkv_array_count(&a) == 1, "0-d i8");
    CHECK(a.data && ((int64_t *)a.data)[0] == INT64_MIN + 42, "i8 value");
    qkv_array_free(&a);
    free(b);
}

static void test_malformed(void) {
    const double *d = k_data6;
    const size_t n = sizeof k_data6;
    qkv_array a;
    char why[200];

    /* magic */
    unsigned char *b;
    size_t len;
    b = make_npy(1, 0, "{'descr': '<f8', 'fortran_order': False, 'shape': (6,), }", d, n, &len);
    for (int i = 0; i < 6; i++) {
        b[i] ^= 0x20;
        CHECK_STATUS(qkv_npy_parse(b, len, &a, why, sizeof why), QKV_ERR_FORMAT);
        CHECK(strstr(why, "bad magic") != NULL, "why: %s", why);
        b[i] ^= 0x20;
    }
    CHECK_STATUS(qkv_npy_parse("PK\3\4 a zip file, say", 21, &a, why, sizeof why), QKV_ERR_FORMAT);
    CHECK_STATUS(qkv_npy_parse(b, 0, &a, why, sizeof why), QKV_ERR_FORMAT);
    CHECK(strstr(why, "truncated") != NULL, "empty: %s", why);
    /* header length past the end */
    b[8] = (unsigned char)(b[8] + 1);
    len -= n;
    CHECK_STATUS(qkv_npy_parse(b, len, &a, why, sizeof why), QKV_ERR_FORMAT);
    CHECK(strstr(why, "past the end") != NULL, "why: %s", why);
    b[8] = 0xff;
    b[9] = 0xff;
    CHECK_STATUS(qkv_npy_parse(b, len, &a, why, sizeof why), QKV_ERR_FORMAT);
    CHECK(is_zeroed(&a), "zeroed");
    free(b);

    /* not a dict, or a broken one */
    EXPECT_PARSE("", d, n, QKV_ERR_FORMAT, "not a Python dict");
    EXPECT_PARSE("    \n", d, n, QKV_ERR_FORMAT, "not a Python dict");
    EXPECT_PARSE("[1, 2, 3]", d, n, QKV_ERR_FORMAT, "not a Python dict");
    EXPECT_PARSE("garbage", d, n, QKV_ERR_FORMAT, "not a Python dict");
    EXPECT_PARSE("{", d, n, QKV_ERR_FORMAT, NULL);
    EXPECT_PARSE("{}", d, n, QKV_ERR_FORMAT, "no 'descr'");
    EXPECT_PARSE("{,}", d, n, QKV_ERR_FORMAT, NULL);
    EXPECT_PARSE("{'descr': '<f8', 'fortran_order': False, 'shape': (6,)", d, n, QKV_ERR_FORMAT, NULL);
    EXPECT_PARSE("{'descr': '<f8', 'fortran_order': False, 'shape': (6,), }}", d, n, QKV_ERR_FORMAT, "after the dict");
    EXPECT_PARSE("{'descr': '<f8', 'fortran_order': False, 'shape': (6,), } x", d, n, QKV_ERR_FORMAT, "after the dict");
    EXPECT_PARSE("{'descr': '<f8', 'fortran_order': False, 'shape': (6,),, }", d, n, QKV_ERR_FORMAT, NULL);
    EXPECT_PARSE("{'descr': '<f8' 'fortran_order': False, 'shape': (6,)}", d, n, QKV_ERR_FORMAT, NULL);
    EXPECT_PARSE("{'descr' '<f8', 'fortran_order': False, 'shape': (6,)}", d, n, QKV_ERR_FORMAT, "':'");
    EXPECT_PARSE("{descr: '<f8', 'fortran_order': False, 'shape': (6,)}", d, n, QKV_ERR_FORMAT, "quoted key");
    EXPECT_PARSE("{'descr: '<f8', 'fortran_order': False, 'shape': (6,)}", d, n, QKV_ERR_FORMAT, NULL);
    EXPECT_PARSE("{'descr': <f8, 'fortran_order': False, 'shape': (6,)}", d, n, QKV_ERR_FORMAT, "not a string");
    EXPECT_PARSE("{'descr': '<f8\\', 'fortran_order': False, 'shape': (6,)}", d, n, QKV_ERR_FORMAT, NULL);
    EXPECT_PARSE("{'descr': '<f8', 'fortran_order': False}", d, n, QKV_ERR_FORMAT, "no 'shape'");
    EXPECT_PARSE("{'descr': '<f8', 'shape': (6,)}", d, n, QKV_ERR_FORMAT, "no 'fortran_order'");
    EXPECT_PARSE("{'fortran_order': False, 'shape': (6,)}", d, n, QKV_ERR_FORMAT, "no 'descr'");
    EXPECT_PARSE("{'descr': '<f8', 'fortran_order': False, 'shape': (6,), 'extra': 1}", d, n, QKV_ERR_FORMAT, "'extra'");
    EXPECT_PARSE("{'descr': '<f8', 'descr': '<f8', 'fortran_order': False, 'shape': (6,)}", d, n, QKV_ERR_FORMAT, "duplicate");
    EXPECT_PARSE("{'descr': '<f8', 'fortran_order': False, 'fortran_order': False, 'shape': (6,)}", d, n, QKV_ERR_FORMAT, "duplicate");
    EXPECT_PARSE("{'descr': '<f8', 'fortran_order': False, 'shape': (6,), 'shape': (6,)}", d, n, QKV_ERR_FORMAT, "duplicate");
    EXPECT_PARSE("{'descr': '<f8', 'fortran_order': 0, 'shape': (6,)}", d, n, QKV_ERR_FORMAT, "True or False");
    EXPECT_PARSE("{'descr': '<f8', 'fortran_order': false, 'shape': (6,)}", d, n, QKV_ERR_FORMAT, "True or False");
    EXPECT_PARSE("{'descr': '<f8', 'fortran_order': Falsey, 'shape': (6,)}", d, n, QKV_ERR_FORMAT, "True or False");
    EXPECT_PARSE("{'descr': '<f8', 'fortran_order': , 'shape': (6,)}", d, n, QKV_ERR_FORMAT, "True or False");
    /* Fortran order */
    EXPECT_PARSE("{'descr': '<f8', 'fortran_order': True, 'shape': (2, 3), }", d, n, QKV_ERR_FORMAT,
                 "Fortran order is not supported");
    /* shapes */
    EXPECT_PARSE("{'descr': '<f8', 'fortran_order': False, 'shape': [2, 3]}", d, n, QKV_ERR_FORMAT, "not a tuple");
    EXPECT_PARSE("{'descr': '<f8', 'fortran_order': False, 'shape': 6}", d, n, QKV_ERR_FORMAT, "not a tuple");
    EXPECT_PARSE("{'descr': '<f8', 'fortran_order': False, 'shape': (6)}", d, n, QKV_ERR_FORMAT, "not a tuple");
    EXPECT_PARSE("{'descr': '<f8', 'fortran_order': False, 'shape': (6.0,)}", d, n, QKV_ERR_FORMAT, "not an integer");
    EXPECT_PARSE("{'descr': '<f8', 'fortran_order': False, 'shape': (6e0,)}", d, n, QKV_ERR_FORMAT, "not an integer");
    EXPECT_PARSE("{'descr': '<f8', 'fortran_order': False, 'shape': (0x6,)}", d, n, QKV_ERR_FORMAT, "not an integer");
    EXPECT_PARSE("{'descr': '<f8', 'fortran_order': False, 'shape': ('6',)}", d, n, QKV_ERR_FORMAT, "not an integer");
    EXPECT_PARSE("{'descr': '<f8', 'fortran_order': False, 'shape': (None,)}", d, n, QKV_ERR_FORMAT, "not an integer");
    EXPECT_PARSE("{'descr': '<f8', 'fortran_order': False, 'shape': (2 3)}", d, n, QKV_ERR_FORMAT, "tuple of integers");
    EXPECT_PARSE("{'descr': '<f8', 'fortran_order': False, 'shape': (,)}", d, n, QKV_ERR_FORMAT, "not an integer");
    EXPECT_PARSE("{'descr': '<f8', 'fortran_order': False, 'shape': (6,,)}", d, n, QKV_ERR_FORMAT, "not an integer");
    EXPECT_PARSE("{'descr': '<f8', 'fortran_order': False, 'shape': (6,}", d, n, QKV_ERR_FORMAT, NULL);
    EXPECT_PARSE("{'descr': '<f8', 'fortran_order': False, 'shape': (-6,)}", d, n, QKV_ERR_FORMAT, "negative");
    EXPECT_PARSE("{'descr': '<f8', 'fortran_order': False, 'shape': (2, -3)}", d, n, QKV_ERR_FORMAT, "negative");
    EXPECT_PARSE("{'descr': '<f8', 'fortran_order': False, 'shape': (-99999999999999999999,)}", d, n, QKV_ERR_FORMAT, "negative");
    EXPECT_PARSE("{'descr': '<f8', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1, 1, 1, 1, 6), }", d, n,
                 QKV_ERR_FORMAT, "9 dimensions");
    /* dtypes: big-endian is a format error, anything else a dtype error naming it */
    static const char *const big_endian[] = {">f4", ">f8", ">i4", ">i8", ">f2", ">u2"};
    static const char *const other[] = {"|O", "<c8", "|u2", "=f2", "<f2 ", "<c16", "<u4", "<u8", "|b1",
                                        "|u1", "|i1", "<i2", "=f4", "|f4", "<f16", "f4", "<f4 ", "", "<U3", "|S4", "<M8[ns]", "<V8"};
    char h[200];
    for (size_t i = 0; i < sizeof big_endian / sizeof big_endian[0]; i++) {
        snprintf(h, sizeof h, "{'descr': '%s', 'fortran_order': False, 'shape': (2,), }", big_endian[i]);
        EXPECT_PARSE(h, d, 16, QKV_ERR_FORMAT, "big-endian");
        EXPECT_PARSE(h, d, 16, QKV_ERR_FORMAT, big_endian[i]);
    }
    for (size_t i = 0; i < sizeof other / sizeof other[0]; i++) {
        snprintf(h, sizeof h, "{'descr': '%s', 'fortran_order': False, 'shape': (2,), }", other[i]);
        char named[40];
        snprintf(named, sizeof named, "'%s'", other[i]);
        EXPECT_PARSE(h, d, 16, QKV_ERR_DTYPE, named);
    }
    EXPECT_PARSE("{'descr': [('a', '<f4'), ('b', '<i4')], 'fortran_order': False, 'shape': (2,), }", d, 16,
                 QKV_ERR_DTYPE, "structured");
    /* a dtype with odd bytes is shown safely */
    EXPECT_PARSE("{'descr': '\x01\x7f\xff', 'fortran_order': False, 'shape': (2,), }", d, 16, QKV_ERR_DTYPE, "'?\?\?'");

    /* sizes: overflow before allocating */
    EXPECT_PARSE("{'descr': '<f8', 'fortran_order': False, 'shape': (99999999999999999999,), }", d, n,
                 QKV_ERR_SIZE_OVERFLOW, "64 bits");
    EXPECT_PARSE("{'descr': '<f8', 'fortran_order': False, 'shape': (9223372036854775808,), }", d, n,
                 QKV_ERR_SIZE_OVERFLOW, NULL);
    EXPECT_PARSE("{'descr': '<f4', 'fortran_order': False, 'shape': (9223372036854775807,), }", d, n,
                 QKV_ERR_SIZE_OVERFLOW, "overflows");
    EXPECT_PARSE("{'descr': '<i4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }", d, n,
                 QKV_ERR_SIZE_OVERFLOW, "overflows");
    EXPECT_PARSE("{'descr': '<i8', 'fortran_order': False, 'shape': (2305843009213693952,), }", d, n,
                 QKV_ERR_SIZE_OVERFLOW, NULL); /* 2^61 * 8 = 2^64 bytes */
    EXPECT_PARSE("{'descr': '<f8', 'fortran_order': False, 'shape': (0, 4611686018427387904, 4), }", d, n,
                 QKV_ERR_SIZE_OVERFLOW, NULL);
    /* huge but representable: truncated, and nothing allocated (ASan would fail) */
    EXPECT_PARSE("{'descr': '<i8', 'fortran_order': False, 'shape': (1152921504606846976,), }", d, n,
                 QKV_ERR_FORMAT, "truncated: header says 9223372036854775808 bytes of data, file has 48");
    EXPECT_PARSE("{'descr': '<f4', 'fortran_order': False, 'shape': (65536, 65536, 16), }", d, n,
                 QKV_ERR_FORMAT, "truncated");
    /* data shorter than the header says */
    EXPECT_PARSE("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }", d, n - 1, QKV_ERR_FORMAT,
                 "truncated: header says 48 bytes of data, file has 47");
    EXPECT_PARSE("{'descr': '<f8', 'fortran_order': False, 'shape': (7,), }", d, n, QKV_ERR_FORMAT,
                 "truncated: header says 56 bytes of data, file has 48");
    EXPECT_PARSE("{'descr': '<f8', 'fortran_order': False, 'shape': (), }", NULL, 0, QKV_ERR_FORMAT,
                 "truncated: header says 8 bytes of data, file has 0");

    /* why: NULL, zero length and a short buffer are all fine */
    b = make_npy(1, 0, "{'descr': '<c8', 'fortran_order': False, 'shape': (2,), }", d, 16, &len);
    CHECK_STATUS(qkv_npy_parse(b, len, &a, NULL, 0), QKV_ERR_DTYPE);
    CHECK_STATUS(qkv_npy_parse(b, len, &a, why, 0), QKV_ERR_DTYPE);
    memset(why, 'x', sizeof why);
    CHECK_STATUS(qkv_npy_parse(b, len, &a, why, 6), QKV_ERR_DTYPE);
    CHECK(strlen(why) == 5 && why[6] == 'x', "why cut to its buffer: '%s'", why);
    free(b);
}

/* A small valid file cut at every length must fail cleanly (FORMAT), never
 * crash or read past the end: parse from an exact-size heap buffer, and load. */
static void test_truncation(void) {
    static const qkv_dtype dtypes[] = {QKV_F32, QKV_I64};
    char path[512];
    tu_tmp_path(path, sizeof path, "npy_trunc.npy");
    for (size_t t = 0; t < 2; t++) {
        qkv_array a;
        int64_t shape[2] = {2, 3};
        CHECK_STATUS(qkv_array_alloc(&a, dtypes[t], 2, shape), QKV_OK);
        fill_pattern(&a);
        CHECK_STATUS(qkv_npy_save(path, &a), QKV_OK);
        qkv_array_free(&a);
        size_t full;
        unsigned char *bytes = read_file(path, &full);
        if (!bytes) {
            CHECK(0, "read back");
            continue;
        }
        long bad = 0, unzeroed = 0;
        for (size_t len = 0; len < full; len++) {
            unsigned char *cut = malloc(len ? len : 1);
            memcpy(cut, bytes, len);
            char why[200];
            memset(&a, 0xAB, sizeof a);
            if (qkv_npy_parse(cut, len, &a, why, sizeof why) != QKV_ERR_FORMAT) bad++;
            if (!is_zeroed(&a)) unzeroed++;
            qkv_array_free(&a);
            write_file(path, cut, len);
            memset(&a, 0xAB, sizeof a);
            if (qkv_npy_load(path, &a, why, sizeof why) != QKV_ERR_FORMAT) bad++;
            if (!is_zeroed(&a)) unzeroed++;
            qkv_array_free(&a);
            free(cut);
        }
        CHECK(bad == 0, "%ld truncated files not rejected as FORMAT", bad);
        CHECK(unzeroed == 0, "%ld failures left *out set", unzeroed);
        free(bytes);
    }
    unlink(path);
}

/* Random byte mutations of a valid file: any status, never a crash, and a
 * success is a consistent array. */
static void test_mutations(void) {
    const char *h = "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }";
    size_t len;
    unsigned char *orig = make_npy(1, 0, h, k_data6, sizeof k_data6, &len);
    unsigned char *b = malloc(len);
    tu_rng rng;
    tu_rng_seed(&rng, 12345);
    long bad = 0, ok = 0;
    for (int it = 0; it < 20000; it++) {
        memcpy(b, orig, len);
        int flips = 1 + (int)(tu_rng_u64(&rng) % 4);
        for (int f = 0; f < flips; f++) {
            size_t at = (size_t)(tu_rng_u64(&rng) % (10 + strlen(h))); /* mostly the header */
            static const char alphabet[] = "{}()[],:'\" 0123456789-<>|=fi48TrueFalsL\n\\\x93\xff";
            b[at] = (tu_rng_u64(&rng) & 1) ? (unsigned char)alphabet[tu_rng_u64(&rng) % (sizeof alphabet - 1)]
                                          : (unsigned char)tu_rng_u64(&rng);
        }
        size_t cut = len - (size_t)(tu_rng_u64(&rng) % 3 == 0 ? tu_rng_u64(&rng) % len : 0);
        qkv_array a;
        char why[200];
        qkv_status s = qkv_npy_parse(b, cut, &a, why, sizeof why);
        if (s == QKV_OK) {
            ok++;
            int64_t cnt = qkv_array_count(&a);
            if (!(a.data && a.ndim >= 0 && a.ndim <= QKV_NPY_MAX_DIMS && cnt >= 0 &&
                  (size_t)cnt * qkv_dtype_size(a.dtype) <= cut))
                bad++;
            qkv_array_free(&a);
        } else if (!(s == QKV_ERR_FORMAT || s == QKV_ERR_DTYPE || s == QKV_ERR_SIZE_OVERFLOW) || !is_zeroed(&a) ||
                   why[0] == '\0') {
            bad++;
        }
    }
    CHECK(bad == 0, "%ld mutated files gave inconsistent results", bad);
    CHECK(ok > 0, "some mutations still parse");
    free(b);
    free(orig);
}

static void test_load_errors(void) {
    qkv_array a;
    char why[200], path[512];
    memset(&a, 0xAB, sizeof a);
    tu_tmp_path(path, sizeof path, "npy_does_not_exist.npy");
    unlink(path);
    CHECK_STATUS(qkv_npy_load(path, &a, why, sizeof why), QKV_ERR_IO);
    CHECK(strstr(why, "cannot open") != NULL && strstr(why, "No such file") != NULL, "why: %s", why);
    CHECK(strstr(why, "npy_does_not_exist") == NULL, "why names no file: %s", why);
    CHECK(is_zeroed(&a), "zeroed");
    tu_tmp_path(path, sizeof path, "");
    memset(&a, 0xAB, sizeof a);
    CHECK_STATUS(qkv_npy_load(path, &a, why, sizeof why), QKV_ERR_IO); /* a directory */
    CHECK(strstr(why, "directory") != NULL, "why: %s", why);
    CHECK(is_zeroed(&a), "zeroed");
    CHECK_STATUS(qkv_npy_load(NULL, &a, why, sizeof why), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_npy_load(path, NULL, why, sizeof why), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_npy_load(NULL, NULL, NULL, 0), QKV_ERR_NULL_POINTER);
    /* trailing bytes after the data are ignored by load too */
    size_t len;
    unsigned char *b = make_npy(2, 0, "{'descr': '<f8', 'fortran_order': False, 'shape': (5,), }", k_data6,
                                sizeof k_data6, &len);
    tu_tmp_path(path, sizeof path, "npy_trailing.npy");
    write_file(path, b, len);
    CHECK_STATUS(qkv_npy_load(path, &a, why, sizeof why), QKV_OK);
    CHECK(a.ndim == 1 && a.shape[0] == 5 && a.data && memcmp(a.data, k_data6, 40) == 0, "trailing ignored");
    qkv_array_free(&a);
    /* load gives the same reason as parse */
    b[8] = 0xff;
    write_file(path, b, len);
    CHECK_STATUS(qkv_npy_load(path, &a, why, sizeof why), QKV_ERR_FORMAT);
    CHECK(strstr(why, "past the end") != NULL, "why: %s", why);
    free(b);
    b = make_npy(1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (65536, 65536, 16), }", k_data6, 5, &len);
    write_file(path, b, len);
    CHECK_STATUS(qkv_npy_load(path, &a, why, sizeof why), QKV_ERR_FORMAT); /* no 256 GiB allocation first */
    CHECK(strstr(why, "truncated: header says 274877906944 bytes of data, file has 5") != NULL, "why: %s", why);
    free(b);
    unlink(path);
}

static void test_save(void) {
    char dir[512], path[600], sub[600];
    qkv_array a, b;
    int64_t shape[2] = {3, 4};
    char why[200];

    /* a private folder so that leftovers can be counted */
    tu_tmp_path(dir, sizeof dir, "npy_save_dir");
    snprintf(path, sizeof path, "%s/x.npy", dir);
    unlink(path);
    snprintf(sub, sizeof sub, "%s/target.npy", dir);
    rmdir(sub);
    rmdir(dir);
    CHECK(mkdir(dir, 0777) == 0, "mkdir %s", dir);

    CHECK_STATUS(qkv_array_alloc(&a, QKV_F32, 2, shape), QKV_OK);
    fill_pattern(&a);

    /* folder does not exist: IO, nothing created */
    char nodir[700];
    snprintf(nodir, sizeof nodir, "%s/no/such/folder/x.npy", dir);
    CHECK_STATUS(qkv_npy_save(nodir, &a), QKV_ERR_IO);
    CHECK(!file_exists(nodir) && count_entries(dir) == 0, "nothing left in %s", dir);

    /* path is a folder (empty or not): IO, folder untouched, no temp file left */
    CHECK(mkdir(sub, 0777) == 0, "mkdir %s", sub);
    CHECK_STATUS(qkv_npy_save(sub, &a), QKV_ERR_IO);
    struct stat st;
    CHECK(stat(sub, &st) == 0 && S_ISDIR(st.st_mode), "folder still there");
    CHECK(count_entries(dir) == 1, "only the folder in %s (%d entries)", dir, count_entries(dir));
    char inner[700];
    snprintf(inner, sizeof inner, "%s/inner.npy", sub);
    CHECK_STATUS(qkv_npy_save(inner, &a), QKV_OK);
    CHECK_STATUS(qkv_npy_save(sub, &a), QKV_ERR_IO);
    CHECK(count_entries(dir) == 1 && count_entries(sub) == 1, "no leftovers");
    unlink(inner);
    rmdir(sub);

    /* a new file gets 0666 less the umask, like numpy's (not mkstemp's 0600) */
    mode_t old = umask(022);
    CHECK_STATUS(qkv_npy_save(path, &a), QKV_OK);
    umask(old);
    CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0644, "mode %o", (unsigned)(st.st_mode & 0777));

    /* overwrite: a smaller array replaces a larger one completely */
    int64_t big_shape[1] = {100000};
    CHECK_STATUS(qkv_array_alloc(&b, QKV_F64, 1, big_shape), QKV_OK);
    CHECK_STATUS(qkv_npy_save(path, &b), QKV_OK);
    qkv_array_free(&b);
    CHECK_STATUS(qkv_npy_save(path, &a), QKV_OK);
    CHECK_STATUS(qkv_npy_load(path, &b, why, sizeof why), QKV_OK);
    CHECK(same_array(&a, &b), "overwritten");
    qkv_array_free(&b);
    CHECK(count_entries(dir) == 1, "only x.npy in %s", dir);

    /* failed saves leave the old file as it was */
    qkv_array bad = a;
    bad.ndim = 9;
    CHECK_STATUS(qkv_npy_save(path, &bad), QKV_ERR_BAD_SIZE);
    bad.ndim = -1;
    CHECK_STATUS(qkv_npy_save(path, &bad), QKV_ERR_BAD_SIZE);
    bad = a;
    bad.shape[1] = -4;
    CHECK_STATUS(qkv_npy_save(path, &bad), QKV_ERR_BAD_SIZE);
    bad = a;
    bad.dtype = (qkv_dtype)7;
    CHECK_STATUS(qkv_npy_save(path, &bad), QKV_ERR_DTYPE);
    bad = a;
    bad.shape[0] = INT64_MAX;
    CHECK_STATUS(qkv_npy_save(path, &bad), QKV_ERR_SIZE_OVERFLOW);
    bad = a;
    bad.data = NULL;
    CHECK_STATUS(qkv_npy_save(path, &bad), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_npy_save(NULL, &a), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_npy_save(path, NULL), QKV_ERR_NULL_POINTER);
    failing_allocator(0);
    CHECK_STATUS(qkv_npy_save(path, &a), QKV_ERR_OUT_OF_MEMORY);
    default_allocator();
    CHECK_STATUS(qkv_npy_load(path, &b, why, sizeof why), QKV_OK);
    CHECK(same_array(&a, &b), "old file intact after failed saves");
    qkv_array_free(&b);
    CHECK(count_entries(dir) == 1, "no temp files left");

    /* no data is fine when there are no elements */
    bad = a;
    bad.shape[0] = 0;
    bad.data = NULL;
    CHECK_STATUS(qkv_npy_save(path, &bad), QKV_OK);
    CHECK_STATUS(qkv_npy_load(path, &b, why, sizeof why), QKV_OK);
    CHECK(b.ndim == 2 && b.shape[0] == 0 && b.shape[1] == 4 && qkv_array_count(&b) == 0, "empty array");
    qkv_array_free(&b);

    qkv_array_free(&a);
    unlink(path);
    rmdir(dir);
}

/* Fail each allocation in turn: OUT_OF_MEMORY (or success once there are no
 * more to fail), *out zeroed, nothing leaked. */
static void test_out_of_memory(void) {
    char path[512], why[200];
    tu_tmp_path(path, sizeof path, "npy_oom.npy");
    qkv_array src, a;
    int64_t shape[3] = {2, 3, 5};
    CHECK_STATUS(qkv_array_alloc(&src, QKV_F64, 3, shape), QKV_OK);
    fill_pattern(&src);
    CHECK_STATUS(qkv_npy_save(path, &src), QKV_OK);
    size_t len = 0;
    unsigned char *bytes = read_file(path, &len);

    for (int op = 0; op < 5; op++) {
        int succeeded = 0;
        for (long k = 0; k < 20 && !succeeded; k++) {
            g_live = 0;
            failing_allocator(k);
            memset(&a, 0xAB, sizeof a);
            qkv_status s = QKV_OK;
            switch (op) {
            case 0: s = qkv_npy_parse(bytes, len, &a, why, sizeof why); break;
            case 1: s = qkv_npy_load(path, &a, why, sizeof why); break;
            case 2: s = qkv_array_alloc(&a, QKV_I32, 3, shape); break;
            case 3: s = qkv_array_convert(&src, QKV_F32, &a); break;
            case 4: s = qkv_npy_save(path, &src); memset(&a, 0, sizeof a); break;
            }
            CHECK(s == QKV_OK || s == QKV_ERR_OUT_OF_MEMORY, "op %d fail at %ld: %d", op, k, (int)s);
            if (s == QKV_OK) {
                succeeded = 1;
                if (op != 4) CHECK(a.data != NULL && a.ndim == 3, "op %d", op);
                qkv_array_free(&a);
            } else {
                CHECK(is_zeroed(&a), "op %d fail at %ld: out zeroed", op, k);
            }
            CHECK(g_live == 0, "op %d fail at %ld: %ld allocations leaked", op, k, g_live);
            default_allocator();
        }
        CHECK(succeeded, "op %d eventually succeeds", op);
    }
    /* the file is still intact after the failed saves */
    CHECK_STATUS(qkv_npy_load(path, &a, why, sizeof why), QKV_OK);
    CHECK(same_array(&a, &src), "intact");
    qkv_array_free(&a);
    free(bytes);
    qkv_array_free(&src);
    unlink(path);
}

static void test_null_args(void) {
    qkv_array a;
    char why[200];
    size_t len;
    unsigned char *b = make_npy(1, 0, "{'descr': '<f8', 'fortran_order': False, 'shape': (6,), }", k_data6,
                                sizeof k_data6, &len);
    memset(&a, 0xAB, sizeof a);
    CHECK_STATUS(qkv_npy_parse(NULL, len, &a, why, sizeof why), QKV_ERR_NULL_POINTER);
    CHECK(is_zeroed(&a) && why[0] != '\0', "zeroed, with a reason");
    CHECK_STATUS(qkv_npy_parse(b, len, NULL, why, sizeof why), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_npy_parse(NULL, 0, NULL, NULL, 0), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_npy_parse(b, len, &a, NULL, 0), QKV_OK);
    qkv_array_free(&a);
    free(b);
    CHECK_STATUS(qkv_array_convert(NULL, QKV_F32, &a), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_array_convert(&a, QKV_F32, NULL), QKV_ERR_NULL_POINTER);
}

static void test_convert(void) {
    static const qkv_dtype dt[] = {QKV_F32, QKV_F64, QKV_I32, QKV_I64};
    const double vals[5] = {0, 1, -2, 100, -65536};
    int64_t shape[2] = {1, 5};
    /* every pair on values every dtype holds exactly */
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) {
            qkv_array a, b;
            CHECK_STATUS(qkv_array_alloc(&a, dt[i], 2, shape), QKV_OK);
            for (int k = 0; k < 5; k++) switch (dt[i]) {
                case QKV_F32: ((float *)a.data)[k] = (float)vals[k]; break;
                case QKV_F64: ((double *)a.data)[k] = vals[k]; break;
                case QKV_I32: ((int32_t *)a.data)[k] = (int32_t)vals[k]; break;
                case QKV_I64: ((int64_t *)a.data)[k] = (int64_t)vals[k]; break;
                case QKV_BF16: case QKV_F16: break; /* not array dtypes */
                }
            CHECK_STATUS(qkv_array_convert(&a, dt[j], &b), QKV_OK);
            CHECK(b.dtype == dt[j] && b.ndim == 2 && b.shape[0] == 1 && b.shape[1] == 5, "%d -> %d", i, j);
            int same = 1;
            for (int k = 0; k < 5 && b.data; k++) switch (dt[j]) {
                case QKV_F32: same &= ((float *)b.data)[k] == (float)vals[k]; break;
                case QKV_F64: same &= ((double *)b.data)[k] == vals[k]; break;
                case QKV_I32: same &= ((int32_t *)b.data)[k] == (int32_t)vals[k]; break;
                case QKV_I64: same &= ((int64_t *)b.data)[k] == (int64_t)vals[k]; break;
                case QKV_BF16: case QKV_F16: break; /* not array dtypes */
                }
            CHECK(same, "values %d -> %d", i, j);
            qkv_array_free(&a);
            qkv_array_free(&b);
        }

    /* float -> integer: truncation toward zero, and the edges of the range */
    struct { double v; qkv_dtype to; qkv_status want; int64_t out; } cases[] = {
        {3.9, QKV_I32, QKV_OK, 3},
        {-3.9, QKV_I32, QKV_OK, -3},
        {-0.5, QKV_I64, QKV_OK, 0},
        {2147483647.9, QKV_I32, QKV_OK, 2147483647},
        {-2147483648.9, QKV_I32, QKV_OK, -2147483647 - 1},
        {2147483648.0, QKV_I32, QKV_ERR_BAD_PARAMETER, 0},
        {-2147483649.0, QKV_I32, QKV_ERR_BAD_PARAMETER, 0},
        {-0x1p63, QKV_I64, QKV_OK, INT64_MIN},
        {0x1p63, QKV_I64, QKV_ERR_BAD_PARAMETER, 0},
        {0x1.fffffffffffffp62, QKV_I64, QKV_OK, INT64_C(0x7ffffffffffffc00)},
        {NAN, QKV_I32, QKV_ERR_BAD_PARAMETER, 0},
        {NAN, QKV_I64, QKV_ERR_BAD_PARAMETER, 0},
        {INFINITY, QKV_I64, QKV_ERR_BAD_PARAMETER, 0},
        {-INFINITY, QKV_I32, QKV_ERR_BAD_PARAMETER, 0},
        {1e300, QKV_I64, QKV_ERR_BAD_PARAMETER, 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        qkv_array a, b;
        int64_t three[1] = {3};
        CHECK_STATUS(qkv_array_alloc(&a, QKV_F64, 1, three), QKV_OK);
        ((double *)a.data)[1] = cases[c].v; /* the odd value in the middle */
        memset(&b, 0xAB, sizeof b);
        qkv_status s = qkv_array_convert(&a, cases[c].to, &b);
        CHECK(s == cases[c].want, "case %zu: %d", c, (int)s);
        if (s == QKV_OK) {
            int64_t got = cases[c].to == QKV_I32 ? ((int32_t *)b.data)[1] : ((int64_t *)b.data)[1];
            CHECK(got == cases[c].out, "case %zu: %lld, want %lld", c, (long long)got, (long long)cases[c].out);
        } else {
            CHECK(is_zeroed(&b), "case %zu: zeroed", c);
        }
        qkv_array_free(&b);
        /* and from f32 where the value is a float */
        double v = cases[c].v;
        if (isnan(v) || isinf(v) || (fabs(v) < 1e38 && (double)(float)v == v)) {
            qkv_array f;
            CHECK_STATUS(qkv_array_convert(&a, QKV_F32, &f), QKV_OK);
            s = qkv_array_convert(&f, cases[c].to, &b);
            CHECK(s == cases[c].want, "f32 case %zu: %d", c, (int)s);
            qkv_array_free(&b);
            qkv_array_free(&f);
        }
        qkv_array_free(&a);
    }

    /* f64 -> f32 rounds; overflow gives infinity, NaN stays NaN (as numpy's astype) */
    {
        qkv_array a, b;
        int64_t five[1] = {5};
        CHECK_STATUS(qkv_array_alloc(&a, QKV_F64, 1, five), QKV_OK);
        double *x = a.data;
        x[0] = 1e39;
        x[1] = -1e300;
        x[2] = NAN;
        x[3] = 0x1.fffffefffffffp127; /* just below the rounding edge: FLT_MAX */
        x[4] = 0x1.ffffffp127;        /* the edge: rounds to infinity */
        CHECK_STATUS(qkv_array_convert(&a, QKV_F32, &b), QKV_OK);
        float *y = b.data;
        CHECK(isinf(y[0]) && y[0] > 0, "1e39 -> inf");
        CHECK(isinf(y[1]) && y[1] < 0, "-1e300 -> -inf");
        CHECK(isnan(y[2]), "NaN");
        CHECK(y[3] == 0x1.fffffep127f, "FLT_MAX");
        CHECK(isinf(y[4]), "edge -> inf");
        qkv_array_free(&b);
        qkv_array_free(&a);
    }
    /* integer conversions */
    {
        qkv_array a, b;
        int64_t two[1] = {2};
        CHECK_STATUS(qkv_array_alloc(&a, QKV_I64, 1, two), QKV_OK);
        int64_t *x = a.data;
        x[0] = (INT64_C(1) << 24) + 1;
        x[1] = INT64_MAX;
        CHECK_STATUS(qkv_array_convert(&a, QKV_F32, &b), QKV_OK);
        CHECK(((float *)b.data)[0] == 16777216.0f && ((float *)b.data)[1] == 0x1p63f, "i64 -> f32 rounds");
        qkv_array_free(&b);
        CHECK_STATUS(qkv_array_convert(&a, QKV_I32, &b), QKV_ERR_BAD_PARAMETER);
        x[1] = INT32_MIN;
        CHECK_STATUS(qkv_array_convert(&a, QKV_I32, &b), QKV_OK);
        CHECK(((int32_t *)b.data)[1] == INT32_MIN, "i64 -> i32");
        qkv_array_free(&b);
        x[1] = (int64_t)INT32_MIN - 1;
        CHECK_STATUS(qkv_array_convert(&a, QKV_I32, &b), QKV_ERR_BAD_PARAMETER);

        /* in == out: success replaces it (the caller keeps the old data),
         * failure leaves it unchanged */
        qkv_array same = a;
        CHECK_STATUS(qkv_array_convert(&same, QKV_I32, &same), QKV_ERR_BAD_PARAMETER);
        CHECK(memcmp(&same, &a, sizeof a) == 0, "in == out unchanged on failure");
        x[1] = 7;
        CHECK_STATUS(qkv_array_convert(&same, QKV_F64, &same), QKV_OK);
        CHECK(same.dtype == QKV_F64 && same.data != a.data && ((double *)same.data)[1] == 7.0, "in == out");
        qkv_array_free(&same);

        /* bad inputs */
        qkv_array bad = a;
        CHECK_STATUS(qkv_array_convert(&bad, (qkv_dtype)6, &b), QKV_ERR_DTYPE);
        bad.dtype = (qkv_dtype)6;
        CHECK_STATUS(qkv_array_convert(&bad, QKV_F32, &b), QKV_ERR_DTYPE);
        bad = a;
        bad.ndim = 9;
        CHECK_STATUS(qkv_array_convert(&bad, QKV_F32, &b), QKV_ERR_BAD_SIZE);
        bad = a;
        bad.shape[0] = -1;
        CHECK_STATUS(qkv_array_convert(&bad, QKV_F32, &b), QKV_ERR_BAD_SIZE);
        bad = a;
        bad.shape[0] = INT64_MAX;
        CHECK_STATUS(qkv_array_convert(&bad, QKV_F32, &b), QKV_ERR_SIZE_OVERFLOW);
        bad = a;
        bad.data = NULL;
        CHECK_STATUS(qkv_array_convert(&bad, QKV_F32, &b), QKV_ERR_NULL_POINTER);
        CHECK(is_zeroed(&b), "zeroed");
        bad.shape[0] = 0; /* no elements: no data needed */
        CHECK_STATUS(qkv_array_convert(&bad, QKV_F32, &b), QKV_OK);
        CHECK(b.ndim == 1 && b.shape[0] == 0 && b.data != NULL, "empty convert");
        qkv_array_free(&b);
        qkv_array_free(&a);
    }
}

int main(void) {
    test_dtype_size();
    test_alloc_count_free();
    test_round_trips();
    test_exact_header();
    test_versions();
    test_header_variants();
    test_malformed();
    test_truncation();
    test_mutations();
    test_load_errors();
    test_save();
    test_out_of_memory();
    test_null_args();
    test_convert();
    return tu_finish();
}
