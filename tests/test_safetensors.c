/* safetensors: round trips of every dtype and awkward shapes, metadata,
 * names, a hand-built torch.nn.MultiheadAttention state_dict file, F16/BF16
 * conversion, fixtures written by the reference Python package, and every
 * malformed input we could think of, each with its own status code. Also:
 * every truncation of a valid file, allocation failure at every step, and
 * failed saves leaving no file behind. */
#define _POSIX_C_SOURCE 200809L

#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_util.h"

/* ---- helpers ----------------------------------------------------------- */

static void put_u64le(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void put_f32le(unsigned char *p, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(u >> (8 * i));
}

/* A file: 8-byte length, the JSON (header_len bytes, so a test can lie in
 * the length field separately), then data. malloc'ed, exactly *len bytes so
 * that ASan catches any read past the end. */
static unsigned char *mkfile_raw(uint64_t claimed, const char *json, size_t json_len,
                                 const void *data, size_t data_len, size_t *len) {
    *len = 8 + json_len + data_len;
    unsigned char *b = malloc(*len);
    put_u64le(b, claimed);
    memcpy(b + 8, json, json_len);
    if (data_len) {
        if (data)
            memcpy(b + 8 + json_len, data, data_len);
        else
            memset(b + 8 + json_len, 0, data_len);
    }
    return b;
}

static unsigned char *mkfile(const char *json, const void *data, size_t data_len, size_t *len) {
    return mkfile_raw(strlen(json), json, strlen(json), data, data_len, len);
}

/* Parse json + data_len zero bytes and expect `want`, a NULL set and a
 * one-line reason containing `needle`. */
static void expect_bad(const char *json, size_t data_len, qkv_status want, const char *needle) {
    size_t len;
    unsigned char *b = mkfile(json, NULL, data_len, &len);
    qkv_safetensors *st = (qkv_safetensors *)&len; /* must be overwritten with NULL */
    char why[256] = "";
    qkv_status s = qkv_safetensors_parse(b, len, &st, why, sizeof why);
    CHECK(s == want, "header %.80s: got %s, want %s (why: %s)", json, qkv_status_string(s),
          qkv_status_string(want), why);
    CHECK(st == NULL, "header %.80s: *out not NULL on failure", json);
    CHECK(why[0] != '\0' && strchr(why, '\n') == NULL, "header %.80s: why '%s'", json, why);
    CHECK(!needle || strstr(why, needle), "header %.80s: why '%s' lacks '%s'", json, why, needle);
    if (s == QKV_OK) qkv_safetensors_free(st);
    free(b);
}

/* Parse and expect success; returns the set (caller frees). */
static qkv_safetensors *expect_ok(const char *json, const void *data, size_t data_len) {
    size_t len;
    unsigned char *b = mkfile(json, data, data_len, &len);
    qkv_safetensors *st = NULL;
    char why[256] = "";
    qkv_status s = qkv_safetensors_parse(b, len, &st, why, sizeof why);
    CHECK(s == QKV_OK && st, "header %.80s: got %s (%s)", json, qkv_status_string(s), why);
    free(b);
    return s == QKV_OK ? st : NULL;
}

static int same_array(const qkv_array *a, const qkv_array *b) {
    if (!a || !b || a->dtype != b->dtype || a->ndim != b->ndim) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    int64_t n = qkv_array_count(a);
    return n == 0 || memcmp(a->data, b->data, (size_t)n * qkv_dtype_size(a->dtype)) == 0;
}

static unsigned char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(n > 0 ? (size_t)n : 1);
    *len = fread(b, 1, (size_t)n, f);
    fclose(f);
    return b;
}

static int file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

static int dir_entries(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

static int bits_f32(float f, uint32_t want) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u == want;
}

/* ---- a counting allocator that fails the k-th call --------------------- */

static long g_live, g_calls, g_fail_at;

static void *fail_malloc(size_t n, void *user) {
    (void)user;
    if (++g_calls == g_fail_at) return NULL;
    void *p = malloc(n);
    if (p) g_live++;
    return p;
}

static void fail_free(void *p, void *user) {
    (void)user;
    g_live--;
    free(p);
}

static void alloc_fail_at(long k) {
    g_calls = 0;
    g_fail_at = k;
    g_live = 0;
    qkv_set_allocator(fail_malloc, fail_free, NULL);
}

/* ---- round trips ------------------------------------------------------- */

static qkv_array make_array(qkv_dtype dt, int ndim, const int64_t *shape, double base) {
    qkv_array a;
    qkv_status s = qkv_array_alloc(&a, dt, ndim, shape);
    CHECK(s == QKV_OK, "qkv_array_alloc: %s", qkv_status_string(s));
    int64_t n = qkv_array_count(&a);
    for (int64_t i = 0; i < n; i++) {
        double v = base + (double)i * 0.25 - 3.0;
        switch (dt) {
        case QKV_F32: ((float *)a.data)[i] = (float)v; break;
        case QKV_F64: ((double *)a.data)[i] = v / 3.0; break;
        case QKV_I32: ((int32_t *)a.data)[i] = (int32_t)(i * 7 - 100000 + (int64_t)base); break;
        case QKV_I64: ((int64_t *)a.data)[i] = (int64_t)i * 3000000000LL - 5 + (int64_t)base; break;
        case QKV_BF16: case QKV_F16: break; /* not array dtypes */
        }
    }
    return a;
}

static void test_round_trip(void) {
    qkv_safetensors *st = NULL;
    CHECK_STATUS(qkv_safetensors_create(&st), QKV_OK);
    if (!st) return;
    CHECK(qkv_safetensors_count(st) == 0, "new set not empty");

    const int64_t s23[] = {2, 3}, s5[] = {5}, s203[] = {2, 0, 3}, s4d[] = {2, 1, 3, 2}, s7[] = {7};
    qkv_array arrs[7];
    const char *names[7] = {"f32.matrix", "f64.vector", "i32.scalar", "i64.empty",
                            "four_dims", "i32.vec", "z last/with:odd-chars (ok)"};
    arrs[0] = make_array(QKV_F32, 2, s23, 1);
    arrs[1] = make_array(QKV_F64, 1, s5, 2);
    arrs[2] = make_array(QKV_I32, 0, NULL, 42);
    arrs[3] = make_array(QKV_I64, 3, s203, 0);
    arrs[4] = make_array(QKV_F32, 4, s4d, 5);
    arrs[5] = make_array(QKV_I32, 1, s7, -9);
    arrs[6] = make_array(QKV_I64, 1, s7, 11);
    ((float *)arrs[0].data)[1] = NAN;
    ((float *)arrs[0].data)[2] = -INFINITY;
    ((double *)arrs[1].data)[0] = -0.0;
    for (int i = 0; i < 7; i++) CHECK_STATUS(qkv_safetensors_put(st, names[i], &arrs[i]), QKV_OK);
    CHECK_STATUS(qkv_safetensors_set_meta(st, "format", "pt"), QKV_OK);
    CHECK_STATUS(qkv_safetensors_set_meta(st, "note", "qkv test: {not json} [x] 'quoted'"), QKV_OK);
    CHECK(qkv_safetensors_count(st) == 7, "count %lld", (long long)qkv_safetensors_count(st));

    char path[512];
    tu_tmp_path(path, sizeof path, "st_round_trip.safetensors");
    remove(path);
    mode_t old_mask = umask(022);
    CHECK_STATUS(qkv_safetensors_save(st, path), QKV_OK);
    umask(old_mask);
    struct stat sb;
    CHECK(stat(path, &sb) == 0 && (sb.st_mode & 0777) == 0644, "saved file mode %o, want 0644 (umask 022)",
          (unsigned)(sb.st_mode & 0777));

    qkv_safetensors *ld = NULL;
    char why[256] = "";
    qkv_status s = qkv_safetensors_load(path, &ld, why, sizeof why);
    CHECK(s == QKV_OK, "load: %s (%s)", qkv_status_string(s), why);
    if (ld) {
        CHECK(qkv_safetensors_count(ld) == 7, "loaded count %lld", (long long)qkv_safetensors_count(ld));
        for (int i = 0; i < 7; i++) {
            const char *nm = qkv_safetensors_name(ld, i);
            CHECK(nm && strcmp(nm, names[i]) == 0, "name %d: %s (insertion order)", i, nm ? nm : "NULL");
            CHECK(same_array(qkv_safetensors_get(ld, names[i]), &arrs[i]), "tensor %s differs", names[i]);
        }
        const char *m = qkv_safetensors_get_meta(ld, "format");
        CHECK(m && strcmp(m, "pt") == 0, "meta format %s", m ? m : "NULL");
        m = qkv_safetensors_get_meta(ld, "note");
        CHECK(m && strcmp(m, "qkv test: {not json} [x] 'quoted'") == 0, "meta note %s", m ? m : "NULL");
        CHECK(qkv_safetensors_get_meta(ld, "absent") == NULL, "absent meta");
        CHECK(qkv_safetensors_get(ld, "absent") == NULL, "absent tensor");
        CHECK(qkv_safetensors_name(ld, 7) == NULL && qkv_safetensors_name(ld, -1) == NULL, "name out of range");
        qkv_safetensors_free(ld);
    }

    /* The file itself: data starts at a multiple of 8, metadata first, no
     * holes (the last tensor ends at the end of the file), and parsing the
     * bytes gives the same as loading. */
    size_t len = 0;
    unsigned char *b = read_all(path, &len);
    CHECK(b && len > 8, "read back %s", path);
    if (b) {
        uint64_t n = 0;
        for (int i = 7; i >= 0; i--) n = (n << 8) | b[i];
        CHECK((8 + n) % 8 == 0, "data starts at %llu, not a multiple of 8", (unsigned long long)(8 + n));
        CHECK(n + 8 <= len && memcmp(b + 8, "{\"__metadata__\":{", 17) == 0, "header starts %.20s", b + 8);
        uint64_t total = 0;
        for (int i = 0; i < 7; i++) total += (uint64_t)qkv_array_count(&arrs[i]) * qkv_dtype_size(arrs[i].dtype);
        CHECK(8 + n + total == len, "file %zu bytes, want %llu (no holes)", len, (unsigned long long)(8 + n + total));
        s = qkv_safetensors_parse(b, len, &ld, why, sizeof why);
        CHECK(s == QKV_OK, "parse: %s (%s)", qkv_status_string(s), why);
        if (ld) {
            for (int i = 0; i < 7; i++)
                CHECK(same_array(qkv_safetensors_get(ld, names[i]), &arrs[i]), "parsed tensor %s differs", names[i]);
            qkv_safetensors_free(ld);
        }
        free(b);
    }

    /* Saving over an existing file replaces it. */
    CHECK_STATUS(qkv_safetensors_put(st, "f32.matrix", &arrs[5]), QKV_OK);
    CHECK_STATUS(qkv_safetensors_save(st, path), QKV_OK);
    s = qkv_safetensors_load(path, &ld, why, sizeof why);
    CHECK(s == QKV_OK, "reload: %s (%s)", qkv_status_string(s), why);
    if (ld) {
        CHECK(same_array(qkv_safetensors_get(ld, "f32.matrix"), &arrs[5]), "replaced tensor after save");
        CHECK(strcmp(qkv_safetensors_name(ld, 0), "f32.matrix") == 0, "replacement keeps the position");
        qkv_safetensors_free(ld);
    }
    remove(path);

    /* An empty set saves to a valid file and loads back empty. */
    qkv_safetensors *empty = NULL;
    CHECK_STATUS(qkv_safetensors_create(&empty), QKV_OK);
    CHECK_STATUS(qkv_safetensors_save(empty, path), QKV_OK);
    s = qkv_safetensors_load(path, &ld, why, sizeof why);
    CHECK(s == QKV_OK && qkv_safetensors_count(ld) == 0, "empty set: %s (%s)", qkv_status_string(s), why);
    qkv_safetensors_free(ld);
    qkv_safetensors_free(empty);
    remove(path);

    for (int i = 0; i < 7; i++) qkv_array_free(&arrs[i]);
    qkv_safetensors_free(st);
}

static void test_put_and_names(void) {
    qkv_safetensors *st = NULL;
    CHECK_STATUS(qkv_safetensors_create(&st), QKV_OK);
    if (!st) return;
    const int64_t s2[] = {2}, s3[] = {3, 1};
    qkv_array a = make_array(QKV_F32, 1, s2, 0), b = make_array(QKV_F64, 2, s3, 1);

    CHECK_STATUS(qkv_safetensors_put(st, "a", &a), QKV_OK);
    CHECK_STATUS(qkv_safetensors_put(st, "b", &a), QKV_OK);
    CHECK_STATUS(qkv_safetensors_put(st, "a", &b), QKV_OK); /* replaces, keeps position 0 */
    CHECK(qkv_safetensors_count(st) == 2, "count after replace %lld", (long long)qkv_safetensors_count(st));
    CHECK(strcmp(qkv_safetensors_name(st, 0), "a") == 0 && strcmp(qkv_safetensors_name(st, 1), "b") == 0,
          "order after replace");
    CHECK(same_array(qkv_safetensors_get(st, "a"), &b), "replaced value");
    /* put of an array the set itself owns (copy made before anything moves) */
    CHECK_STATUS(qkv_safetensors_put(st, "a", qkv_safetensors_get(st, "b")), QKV_OK);
    CHECK(same_array(qkv_safetensors_get(st, "a"), &a), "self put");
    for (int i = 0; i < 40; i++) { /* growth of the table */
        char nm[16];
        snprintf(nm, sizeof nm, "t%d", i);
        CHECK_STATUS(qkv_safetensors_put(st, nm, qkv_safetensors_get(st, "a")), QKV_OK);
    }
    CHECK(qkv_safetensors_count(st) == 42, "count after growth");
    CHECK(same_array(qkv_safetensors_get(st, "t39"), &a), "t39");

    /* The name rule: 1..255 bytes of printable ASCII except '"' and '\\'. */
    char longname[300];
    memset(longname, 'x', sizeof longname);
    longname[255] = '\0';
    CHECK_STATUS(qkv_safetensors_put(st, longname, &a), QKV_OK);
    longname[255] = 'x';
    longname[256] = '\0';
    CHECK_STATUS(qkv_safetensors_put(st, longname, &a), QKV_ERR_BAD_PARAMETER);
    const char *bad[] = {"", "with\"quote", "back\\slash", "new\nline", "tab\t", "del\x7f", "caf\xc3\xa9",
                         "__metadata__"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK(qkv_safetensors_put(st, bad[i], &a) == QKV_ERR_BAD_PARAMETER, "name %zu accepted", i);
    CHECK_STATUS(qkv_safetensors_put(st, " spaces and ~!@#$%^&*()[]{}<>?/.,;:'` ok", &a), QKV_OK);

    CHECK_STATUS(qkv_safetensors_put(NULL, "a", &a), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_safetensors_put(st, NULL, &a), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_safetensors_put(st, "a", NULL), QKV_ERR_NULL_POINTER);
    qkv_array bad_arr = a;
    bad_arr.dtype = (qkv_dtype)77;
    CHECK_STATUS(qkv_safetensors_put(st, "x", &bad_arr), QKV_ERR_DTYPE);
    bad_arr = a;
    bad_arr.data = NULL;
    CHECK_STATUS(qkv_safetensors_put(st, "x", &bad_arr), QKV_ERR_NULL_POINTER);
    bad_arr = a;
    bad_arr.shape[0] = -1;
    CHECK(qkv_safetensors_put(st, "x", &bad_arr) == QKV_ERR_BAD_SIZE, "negative dim");
    bad_arr = a;
    bad_arr.ndim = 2;
    bad_arr.shape[0] = bad_arr.shape[1] = (int64_t)1 << 40;
    CHECK_STATUS(qkv_safetensors_put(st, "x", &bad_arr), QKV_ERR_SIZE_OVERFLOW);
    CHECK(qkv_safetensors_get(st, "x") == NULL, "failed puts added nothing");

    /* Metadata: same rule, up to 65535 bytes; set replaces. */
    char *big = malloc(65537);
    memset(big, 'm', 65536);
    big[65535] = '\0';
    CHECK_STATUS(qkv_safetensors_set_meta(st, "k", big), QKV_OK);
    CHECK_STATUS(qkv_safetensors_set_meta(st, big, "v"), QKV_OK);
    big[65535] = 'm';
    big[65536] = '\0';
    CHECK_STATUS(qkv_safetensors_set_meta(st, "k", big), QKV_ERR_BAD_PARAMETER);
    CHECK_STATUS(qkv_safetensors_set_meta(st, big, "v"), QKV_ERR_BAD_PARAMETER);
    CHECK_STATUS(qkv_safetensors_set_meta(st, "", "v"), QKV_ERR_BAD_PARAMETER);
    CHECK_STATUS(qkv_safetensors_set_meta(st, "k", "a\"b"), QKV_ERR_BAD_PARAMETER);
    CHECK_STATUS(qkv_safetensors_set_meta(st, NULL, "v"), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_safetensors_set_meta(NULL, "k", "v"), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_safetensors_set_meta(st, "k", "second"), QKV_OK);
    CHECK(strcmp(qkv_safetensors_get_meta(st, "k"), "second") == 0, "meta replaced");
    free(big);

    /* NULL-tolerant queries */
    CHECK(qkv_safetensors_count(NULL) == 0, "count(NULL)");
    CHECK(qkv_safetensors_name(NULL, 0) == NULL, "name(NULL)");
    CHECK(qkv_safetensors_get(NULL, "a") == NULL && qkv_safetensors_get(st, NULL) == NULL, "get(NULL)");
    CHECK(qkv_safetensors_get_meta(NULL, "k") == NULL && qkv_safetensors_get_meta(st, NULL) == NULL, "get_meta(NULL)");
    CHECK_STATUS(qkv_safetensors_create(NULL), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_safetensors_save(NULL, "x"), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_safetensors_save(st, NULL), QKV_ERR_NULL_POINTER);
    qkv_safetensors *o = NULL;
    CHECK_STATUS(qkv_safetensors_parse(NULL, 10, &o, NULL, 0), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_safetensors_parse("x", 1, NULL, NULL, 0), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_safetensors_load(NULL, &o, NULL, 0), QKV_ERR_NULL_POINTER);
    qkv_safetensors_free(NULL);

    qkv_array_free(&a);
    qkv_array_free(&b);
    qkv_safetensors_free(st);
}

/* ---- torch.nn.MultiheadAttention(E=4, H=2).state_dict(), byte by byte -- */

#define MHA_JSON                                                                           \
    "{\"__metadata__\":{\"format\":\"pt\"},"                                               \
    "\"in_proj_weight\":{\"dtype\":\"F32\",\"shape\":[12,4],\"data_offsets\":[0,192]},"     \
    "\"in_proj_bias\":{\"dtype\":\"F32\",\"shape\":[12],\"data_offsets\":[192,240]},"       \
    "\"out_proj.weight\":{\"dtype\":\"F32\",\"shape\":[4,4],\"data_offsets\":[240,304]},"   \
    "\"out_proj.bias\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[304,320]}}"

static unsigned char *mha_file(size_t *len) {
    unsigned char data[320];
    for (int i = 0; i < 80; i++) put_f32le(data + 4 * i, (float)i * 0.125f - 5.0f);
    return mkfile(MHA_JSON, data, sizeof data, len);
}

static void test_mha_names(void) {
    size_t len;
    unsigned char *b = mha_file(&len);
    qkv_safetensors *st = NULL;
    char why[256] = "";
    qkv_status s = qkv_safetensors_parse(b, len, &st, why, sizeof why);
    CHECK(s == QKV_OK, "MHA file: %s (%s)", qkv_status_string(s), why);
    if (st) {
        static const char *names[4] = {"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"};
        static const int nd[4] = {2, 1, 2, 1};
        static const int64_t d0[4] = {12, 12, 4, 4}, first[4] = {0, 48, 60, 76};
        CHECK(qkv_safetensors_count(st) == 4, "count");
        for (int i = 0; i < 4; i++) {
            const qkv_array *a = qkv_safetensors_get(st, names[i]);
            CHECK(a && a->dtype == QKV_F32 && a->ndim == nd[i] && a->shape[0] == d0[i] &&
                      (nd[i] == 1 || a->shape[1] == 4),
                  "%s: shape", names[i]);
            CHECK(strcmp(qkv_safetensors_name(st, i), names[i]) == 0, "order %d", i);
            if (a) {
                int64_t n = qkv_array_count(a);
                int ok = 1;
                for (int64_t k = 0; k < n; k++)
                    ok &= ((const float *)a->data)[k] == (float)(first[i] + k) * 0.125f - 5.0f;
                CHECK(ok, "%s: values", names[i]);
            }
        }
        CHECK(strcmp(qkv_safetensors_get_meta(st, "format"), "pt") == 0, "format pt");
        qkv_safetensors_free(st);
    }
    free(b);
}

/* ---- F16 / BF16 -------------------------------------------------------- */

static void test_half_conversion(void) {
    static const uint16_t f16[] = {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x03FF, 0x0400, 0x7C00,
                                   0xFC00, 0x7E00, 0x8000, 0x3555, 0x0000, 0x8001, 0x7C01};
    /* binary32 bit patterns: 1, -2, 65504, 2^-24, 1023 * 2^-24, 2^-14, inf, -inf, NaN
     * (quiet, payload kept), -0, 0.333251953125, 0, -2^-24, signalling NaN kept */
    static const uint32_t f16_want[] = {0x3F800000, 0xC0000000, 0x477FE000, 0x33800000, 0x387FC000,
                                        0x38800000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x80000000,
                                        0x3EAAA000, 0x00000000, 0xB3800000, 0x7F802000};
    static const uint16_t bf16[] = {0x3F80, 0xC040, 0x7F80, 0xFF80, 0x7FC0, 0x0001, 0x4049, 0x8000};
    enum { NF = sizeof f16 / sizeof f16[0], NB = sizeof bf16 / sizeof bf16[0] };
    unsigned char data[2 * NF + 2 * NB];
    for (int i = 0; i < NF; i++) {
        data[2 * i] = (unsigned char)f16[i];
        data[2 * i + 1] = (unsigned char)(f16[i] >> 8);
    }
    for (int i = 0; i < NB; i++) {
        data[2 * NF + 2 * i] = (unsigned char)bf16[i];
        data[2 * NF + 2 * i + 1] = (unsigned char)(bf16[i] >> 8);
    }
    char json[256];
    snprintf(json, sizeof json,
             "{\"h\":{\"dtype\":\"F16\",\"shape\":[%d],\"data_offsets\":[0,%d]},"
             "\"b\":{\"dtype\":\"BF16\",\"shape\":[2,%d],\"data_offsets\":[%d,%d]}}",
             NF, 2 * NF, NB / 2, 2 * NF, 2 * NF + 2 * NB);
    qkv_safetensors *st = expect_ok(json, data, sizeof data);
    if (!st) return;
    const qkv_array *h = qkv_safetensors_get(st, "h"), *b = qkv_safetensors_get(st, "b");
    CHECK(h && h->dtype == QKV_F32 && h->ndim == 1 && h->shape[0] == NF, "F16 loads as F32");
    CHECK(b && b->dtype == QKV_F32 && b->ndim == 2 && b->shape[1] == NB / 2, "BF16 loads as F32");
    if (h)
        for (int i = 0; i < NF; i++)
            CHECK(bits_f32(((const float *)h->data)[i], f16_want[i]), "F16 0x%04x -> %.9g", f16[i],
                  (double)((const float *)h->data)[i]);
    CHECK(h && ((const float *)h->data)[3] == ldexpf(1.0f, -24), "smallest F16 subnormal");
    if (b) {
        const float *v = b->data;
        CHECK(v[0] == 1.0f && v[1] == -3.0f && isinf(v[2]) && v[2] > 0 && isinf(v[3]) && v[3] < 0,
              "BF16 values");
        CHECK(isnan(v[4]), "BF16 NaN");
        CHECK(bits_f32(v[5], 0x00010000) && v[5] > 0 && v[5] < 1e-38f, "BF16 subnormal");
        CHECK(v[6] == 3.140625f && bits_f32(v[7], 0x80000000), "BF16 pi, -0");
    }
    /* F16 sets save as F32 (what they hold now). */
    char path[512];
    tu_tmp_path(path, sizeof path, "st_half.safetensors");
    CHECK_STATUS(qkv_safetensors_save(st, path), QKV_OK);
    qkv_safetensors *ld = NULL;
    CHECK_STATUS(qkv_safetensors_load(path, &ld, NULL, 0), QKV_OK);
    CHECK(ld && same_array(qkv_safetensors_get(ld, "h"), h), "F16 as F32 round trip");
    qkv_safetensors_free(ld);
    remove(path);
    qkv_safetensors_free(st);
}

/* ---- valid but unusual headers ----------------------------------------- */

static void test_valid_oddities(void) {
    unsigned char data[64] = {0};
    qkv_safetensors *st;

    /* padding, whitespace everywhere, an empty header object */
    st = expect_ok(" \t\r\n{ \"a\" :\n{ \"shape\" : [ 2 ] , \"data_offsets\" : [ 0 , 8 ] , \"dtype\" : \"F32\" } }   ",
                   data, 8);
    CHECK(st && qkv_safetensors_get(st, "a"), "whitespace and key order");
    qkv_safetensors_free(st);
    st = expect_ok("{}        ", NULL, 0);
    CHECK(st && qkv_safetensors_count(st) == 0, "empty header");
    qkv_safetensors_free(st);
    st = expect_ok("{\"__metadata__\":{}}", NULL, 0);
    CHECK(st && qkv_safetensors_count(st) == 0, "empty metadata");
    qkv_safetensors_free(st);

    /* holes are accepted (documented), both between and after tensors; zero
     * sized tensors overlap nothing, wherever they point */
    st = expect_ok("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]},"
                   "\"b\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[24,32]},"
                   "\"e\":{\"dtype\":\"F64\",\"shape\":[0,3],\"data_offsets\":[10,10]},"
                   "\"e2\":{\"dtype\":\"F64\",\"shape\":[0],\"data_offsets\":[10,10]}}",
                   data, 64);
    CHECK(st && qkv_safetensors_count(st) == 4, "holes accepted");
    if (st) {
        const qkv_array *e = qkv_safetensors_get(st, "e");
        CHECK(e && e->ndim == 2 && e->shape[0] == 0 && e->shape[1] == 3 && qkv_array_count(e) == 0,
              "zero-sized tensor");
    }
    qkv_safetensors_free(st);

    /* tensors listed out of data order; adjacent ranges touch but do not overlap */
    st = expect_ok("{\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]},"
                   "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                   data, 8);
    CHECK(st && strcmp(qkv_safetensors_name(st, 0), "b") == 0, "file order kept");
    qkv_safetensors_free(st);

    /* escapes: \u00e9, a surrogate pair, \/ and \" in names; metadata may be
     * any string (loaded leniently), and the set saves and reloads them */
    st = expect_ok("{\"__metadata__\":{\"k\\\"q\":\"\",\"json\":\"{\\\"a\\\": [1, 2]}\\n\"},"
                   "\"caf\\u00e9\\ud83d\\ude00\\/x\\\"y\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}",
                   data, 4);
    if (st) {
        const char *want = "caf\xc3\xa9\xf0\x9f\x98\x80/x\"y";
        CHECK(strcmp(qkv_safetensors_name(st, 0), want) == 0, "decoded name '%s'", qkv_safetensors_name(st, 0));
        CHECK(qkv_safetensors_get(st, want) && qkv_safetensors_get(st, want)->ndim == 0, "0-dim by name");
        const char *m = qkv_safetensors_get_meta(st, "json");
        CHECK(m && strcmp(m, "{\"a\": [1, 2]}\n") == 0, "metadata with escapes '%s'", m ? m : "NULL");
        m = qkv_safetensors_get_meta(st, "k\"q");
        CHECK(m && m[0] == '\0', "empty metadata value");
        char path[512];
        tu_tmp_path(path, sizeof path, "st_escapes.safetensors");
        CHECK_STATUS(qkv_safetensors_save(st, path), QKV_OK);
        qkv_safetensors *ld = NULL;
        CHECK_STATUS(qkv_safetensors_load(path, &ld, NULL, 0), QKV_OK);
        CHECK(ld && qkv_safetensors_get(ld, want), "escaped name round trip");
        m = qkv_safetensors_get_meta(ld, "json");
        CHECK(m && strcmp(m, "{\"a\": [1, 2]}\n") == 0, "escaped metadata round trip");
        qkv_safetensors_free(ld);
        remove(path);
        qkv_safetensors_free(st);
    }
    /* raw UTF-8 is fine too */
    st = expect_ok("{\"\xce\xb8.w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", data, 4);
    CHECK(st && qkv_safetensors_get(st, "\xce\xb8.w"), "raw UTF-8 name");
    qkv_safetensors_free(st);
}

/* ---- malformed files --------------------------------------------------- */

#define T1(dt, shape, offs) "{\"t\":{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":" offs "}}"

static void test_bad_header_length(void) {
    qkv_safetensors *st = (qkv_safetensors *)&st;
    char why[256];
    size_t len;
    unsigned char *b;

    /* shorter than the length field */
    for (size_t n = 0; n < 8; n++) {
        unsigned char z[8] = {2, 0, 0, 0, 0, 0, 0, 0};
        unsigned char *c = malloc(n ? n : 1);
        memcpy(c, z, n);
        CHECK_STATUS(qkv_safetensors_parse(c, n, &st, why, sizeof why), QKV_ERR_FORMAT);
        CHECK(st == NULL, "out NULL");
        free(c);
    }
    /* length 0 */
    b = mkfile_raw(0, "{}", 2, NULL, 0, &len);
    CHECK_STATUS(qkv_safetensors_parse(b, len, &st, why, sizeof why), QKV_ERR_FORMAT);
    CHECK(strstr(why, "length 0"), "why: %s", why);
    free(b);
    /* larger than the file, by one and by a lot */
    b = mkfile_raw(3, "{}", 2, NULL, 0, &len);
    CHECK_STATUS(qkv_safetensors_parse(b, len, &st, why, sizeof why), QKV_ERR_FORMAT);
    CHECK(strstr(why, "exceeds"), "why: %s", why);
    free(b);
    b = mkfile_raw(UINT64_MAX, "{}", 2, NULL, 0, &len);
    CHECK_STATUS(qkv_safetensors_parse(b, len, &st, why, sizeof why), QKV_ERR_FORMAT);
    free(b);
    /* over the 100 MB limit: a real file of that size, header of spaces */
    size_t big = 100000001;
    unsigned char *h = malloc(big + 8);
    if (h) {
        put_u64le(h, big);
        memset(h + 8, ' ', big);
        h[8] = '{';
        h[9] = '}';
        CHECK_STATUS(qkv_safetensors_parse(h, big + 8, &st, why, sizeof why), QKV_ERR_FORMAT);
        CHECK(strstr(why, "limit"), "why: %s", why);
        put_u64le(h, big - 1); /* exactly the limit: fine */
        CHECK_STATUS(qkv_safetensors_parse(h, big + 8, &st, why, sizeof why), QKV_OK);
        qkv_safetensors_free(st);
        free(h);
    }
    /* header shorter than its JSON: the JSON is cut */
    b = mkfile_raw(5, "{\"a\":1}", 7, NULL, 0, &len);
    CHECK_STATUS(qkv_safetensors_parse(b, len, &st, why, sizeof why), QKV_ERR_FORMAT);
    free(b);
}

static void test_truncation(void) {
    size_t len;
    unsigned char *full = mha_file(&len);
    for (size_t k = 0; k < len; k++) {
        unsigned char *c = malloc(k ? k : 1);
        memcpy(c, full, k);
        qkv_safetensors *st = (qkv_safetensors *)&len;
        char why[256] = "";
        qkv_status s = qkv_safetensors_parse(c, k, &st, why, sizeof why);
        if (s != QKV_ERR_FORMAT || st != NULL || !why[0])
            CHECK(0, "truncated at %zu: %s (%s)", k, qkv_status_string(s), why);
        else
            tu_passed++;
        free(c);
    }
    /* the header length still saying the full size, header cut short */
    free(full);
}

static void test_bad_json(void) {
    /* each is a complete header whose length field is right */
    expect_bad("[]", 0, QKV_ERR_FORMAT, "not a JSON object");
    expect_bad("\"x\"", 0, QKV_ERR_FORMAT, NULL);
    expect_bad("{", 0, QKV_ERR_FORMAT, "byte");
    expect_bad("{\"t", 0, QKV_ERR_FORMAT, "unterminated string");
    expect_bad("{\"t\":{\"dtype\":\"F32", 0, QKV_ERR_FORMAT, "unterminated string");
    expect_bad("{\"t\\", 0, QKV_ERR_FORMAT, "unterminated");
    expect_bad("{\"t\" {}}", 0, QKV_ERR_FORMAT, "':'");
    expect_bad("{\"t\":{\"dtype\" \"F32\"}}", 0, QKV_ERR_FORMAT, "':'");
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},}", 4, QKV_ERR_FORMAT, "trailing comma");
    expect_bad(T1("F32", "[1,]", "[0,4]"), 4, QKV_ERR_FORMAT, "trailing comma");
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],}}", 4, QKV_ERR_FORMAT, "trailing comma");
    expect_bad("{\"__metadata__\":{\"a\":\"b\",}}", 0, QKV_ERR_FORMAT, "trailing comma");
    expect_bad(T1("F32", "[1]", "[0,4,]"), 4, QKV_ERR_FORMAT, NULL);
    expect_bad(T1("F32", "[1]", "[0,4]") "x", 4, QKV_ERR_FORMAT, "after the header");
    expect_bad(T1("F32", "[1]", "[0,4]") "}", 4, QKV_ERR_FORMAT, "after the header");
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]} \"u\":{}}", 4, QKV_ERR_FORMAT, NULL);
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],,\"data_offsets\":[0,4]}}", 4, QKV_ERR_FORMAT, NULL);
    expect_bad("{'t':{}}", 0, QKV_ERR_FORMAT, NULL);
    {
        /* trailing NUL padding is not JSON whitespace */
        static const char j[] = T1("F32", "[1]", "[0,4]") "  \0";
        size_t len;
        unsigned char *b = mkfile_raw(sizeof j - 1, j, sizeof j - 1, NULL, 4, &len);
        qkv_safetensors *st;
        char why[256] = "";
        CHECK_STATUS(qkv_safetensors_parse(b, len, &st, why, sizeof why), QKV_ERR_FORMAT);
        CHECK(strstr(why, "after the header"), "why: %s", why);
        free(b);
    }
    /* strings: bad escapes, control characters, bad UTF-8, surrogates */
    expect_bad("{\"a\\x\":{}}", 0, QKV_ERR_FORMAT, "escape");
    expect_bad("{\"a\\u12\":{}}", 0, QKV_ERR_FORMAT, "\\u");
    expect_bad("{\"a\\u12g4\":{}}", 0, QKV_ERR_FORMAT, "\\u");
    expect_bad("{\"a\\udc00\":{}}", 0, QKV_ERR_FORMAT, "surrogate");
    expect_bad("{\"a\\ud800\":{}}", 0, QKV_ERR_FORMAT, "surrogate");
    expect_bad("{\"a\\ud800\\u0041\":{}}", 0, QKV_ERR_FORMAT, "surrogate");
    expect_bad("{\"a\tb\":{}}", 0, QKV_ERR_FORMAT, "control");
    expect_bad("{\"a\xff\":{}}", 0, QKV_ERR_FORMAT, "UTF-8");
    expect_bad("{\"a\xc0\xaf\":{}}", 0, QKV_ERR_FORMAT, "UTF-8");         /* overlong '/' */
    expect_bad("{\"a\xed\xa0\x80\":{}}", 0, QKV_ERR_FORMAT, "UTF-8");     /* encoded surrogate */
    expect_bad("{\"a\xf4\x90\x80\x80\":{}}", 0, QKV_ERR_FORMAT, "UTF-8"); /* past U+10FFFF */
    expect_bad("{\"a\xe2\x82\":{}}", 0, QKV_ERR_FORMAT, "UTF-8");         /* cut sequence */
    expect_bad("{\"a\\u0000b\":{}}", 0, QKV_ERR_FORMAT, "NUL");
    expect_bad("{\"\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}", 4, QKV_ERR_FORMAT, "empty");
    /* numbers */
    expect_bad(T1("F32", "[-1]", "[0,4]"), 4, QKV_ERR_FORMAT, "negative");
    expect_bad(T1("F32", "[-0]", "[0,0]"), 4, QKV_ERR_FORMAT, "negative");
    expect_bad(T1("F32", "[1]", "[-4,0]"), 4, QKV_ERR_FORMAT, "negative");
    expect_bad(T1("F32", "[1.5]", "[0,4]"), 4, QKV_ERR_FORMAT, "non-integer");
    expect_bad(T1("F32", "[1.0]", "[0,4]"), 4, QKV_ERR_FORMAT, "non-integer");
    expect_bad(T1("F32", "[1e0]", "[0,4]"), 4, QKV_ERR_FORMAT, "non-integer");
    expect_bad(T1("F32", "[1]", "[0,4.0]"), 4, QKV_ERR_FORMAT, "non-integer");
    expect_bad(T1("F32", "[01]", "[0,4]"), 4, QKV_ERR_FORMAT, "leading zero");
    expect_bad(T1("F32", "[+1]", "[0,4]"), 4, QKV_ERR_FORMAT, "number");
    expect_bad(T1("F32", "[1.]", "[0,4]"), 4, QKV_ERR_FORMAT, "fraction");
    expect_bad(T1("F32", "[1e]", "[0,4]"), 4, QKV_ERR_FORMAT, "exponent");
    expect_bad(T1("F32", "[-]", "[0,4]"), 4, QKV_ERR_FORMAT, "number");
    expect_bad(T1("F32", "[\"1\"]", "[0,4]"), 4, QKV_ERR_FORMAT, "number");
    expect_bad(T1("F32", "[null]", "[0,4]"), 4, QKV_ERR_FORMAT, "number");
    expect_bad(T1("F32", "[1]", "[0,99999999999999999999]"), 4, QKV_ERR_FORMAT, "2^64");
    expect_bad(T1("F32", "1", "[0,4]"), 4, QKV_ERR_FORMAT, "array");
    expect_bad(T1("F32", "[1]", "[0]"), 4, QKV_ERR_FORMAT, "two numbers");
    expect_bad(T1("F32", "[1]", "[0,4,8]"), 8, QKV_ERR_FORMAT, "two numbers");
    expect_bad(T1("F32", "[1]", "4"), 4, QKV_ERR_FORMAT, "array");
    /* structure */
    expect_bad("{\"t\":[]}", 0, QKV_ERR_FORMAT, "not an object");
    expect_bad("{\"t\":\"F32\"}", 0, QKV_ERR_FORMAT, "not an object");
    expect_bad("{\"t\":{\"dtype\":32,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, QKV_ERR_FORMAT, "not a string");
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"extra\":1}}", 4, QKV_ERR_FORMAT, "unknown key");
    expect_bad("{\"__metadata__\":[]}", 0, QKV_ERR_FORMAT, "__metadata__");
    expect_bad("{\"__metadata__\":{\"a\":1}}", 0, QKV_ERR_FORMAT, "not a string");
    expect_bad("{\"__metadata__\":{\"a\":{\"b\":\"c\"}}}", 0, QKV_ERR_FORMAT, "not a string");
    expect_bad("{\"__metadata__\":{\"a\":\"b\",\"a\":\"c\"}}", 0, QKV_ERR_FORMAT, "twice");
    expect_bad("{\"__metadata__\":{},\"__metadata__\":{}}", 0, QKV_ERR_FORMAT, "twice");
    expect_bad("{\"__metadata__\":{\"a\":\"b\\u0000\"}}", 0, QKV_ERR_FORMAT, "NUL");
    expect_bad("{\"__metadata__\":{\"a\\u0000\":\"b\"}}", 0, QKV_ERR_FORMAT, "NUL");
    expect_bad("{\"__metadata__\":{\"a\":\"b\"", 0, QKV_ERR_FORMAT, NULL);
}

static void test_nesting_bombs(void) {
    size_t n = 100000;
    const char *prefixes[] = {"", "{\"t\":", "{\"t\":{\"shape\":", "{\"__metadata__\":{\"a\":",
                              "{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":"};
    for (size_t p = 0; p < sizeof prefixes / sizeof prefixes[0]; p++) {
        for (int kind = 0; kind < 2; kind++) {
            size_t pl = strlen(prefixes[p]);
            char *j = malloc(pl + n + 1);
            memcpy(j, prefixes[p], pl);
            memset(j + pl, kind ? '{' : '[', n);
            j[pl + n] = '\0';
            expect_bad(j, 0, QKV_ERR_FORMAT, NULL);
            free(j);
        }
    }
}

static void test_bad_tensors(void) {
    /* missing keys */
    expect_bad("{\"t\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, QKV_ERR_FORMAT, "missing \"dtype\"");
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, QKV_ERR_FORMAT, "missing \"shape\"");
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, QKV_ERR_FORMAT, "missing \"data_offsets\"");
    expect_bad("{\"t\":{}}", 4, QKV_ERR_FORMAT, "missing");
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
               QKV_ERR_FORMAT, "twice");
    /* offsets */
    expect_bad(T1("F32", "[1]", "[0,8]"), 4, QKV_ERR_FORMAT, "past the end of the 4-byte data buffer");
    expect_bad(T1("F32", "[1]", "[4,8]"), 4, QKV_ERR_FORMAT, "past the end");
    expect_bad(T1("F32", "[1]", "[18446744073709551615,18446744073709551615]"), 4, QKV_ERR_FORMAT, "past the end");
    expect_bad(T1("F32", "[0]", "[8,4]"), 8, QKV_ERR_FORMAT, "begin after end");
    expect_bad(T1("F32", "[1]", "[4,0]"), 8, QKV_ERR_FORMAT, "begin after end");
    /* size / shape disagreement, the example of the brief */
    expect_bad("{\"out_proj.weight\":{\"dtype\":\"F32\",\"shape\":[4,4],\"data_offsets\":[0,96]}}", 96,
               QKV_ERR_FORMAT, "tensor 'out_proj.weight': data_offsets [0, 96] but shape [4, 4] of F32 needs 64 bytes");
    expect_bad(T1("F64", "[2]", "[0,8]"), 16, QKV_ERR_FORMAT, "needs 16 bytes");
    expect_bad(T1("F16", "[3]", "[0,8]"), 8, QKV_ERR_FORMAT, "needs 6 bytes");
    expect_bad(T1("F32", "[]", "[0,0]"), 8, QKV_ERR_FORMAT, "needs 4 bytes");
    expect_bad(T1("F32", "[0]", "[0,4]"), 8, QKV_ERR_FORMAT, "needs 0 bytes");
    /* overflow */
    expect_bad(T1("F32", "[4294967296,4294967296]", "[0,0]"), 0, QKV_ERR_SIZE_OVERFLOW, "too large");
    expect_bad(T1("F32", "[2147483648,2147483648]", "[0,0]"), 0, QKV_ERR_SIZE_OVERFLOW, "too large");
    expect_bad(T1("F64", "[0,4294967296,4294967296]", "[0,0]"), 0, QKV_ERR_SIZE_OVERFLOW, "too large");
    expect_bad(T1("F32", "[9223372036854775808]", "[0,0]"), 0, QKV_ERR_SIZE_OVERFLOW, "2^63");
    expect_bad(T1("F32", "[99999999999999999999999]", "[0,0]"), 0, QKV_ERR_SIZE_OVERFLOW, "2^63");
    expect_bad(T1("F16", "[3,3,3,3,3,3,3,3,3]", "[0,0]"), 0, QKV_ERR_FORMAT, "more than 8");
    {
        qkv_safetensors *st = expect_ok(T1("F32", "[1,1,1,1,1,1,1,2]", "[0,8]"), NULL, 8);
        CHECK(st && qkv_safetensors_get(st, "t")->ndim == 8, "8 dims are fine");
        qkv_safetensors_free(st);
    }
    /* overlap and duplicates */
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
               12, QKV_ERR_FORMAT, "overlap");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
               16, QKV_ERR_FORMAT, "overlap");
    expect_bad("{\"c\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[20,24]},"
               "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
               24, QKV_ERR_FORMAT, "overlap");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
               "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
               8, QKV_ERR_FORMAT, "tensor 'a' appears twice");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
               "\"\\u0061\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
               8, QKV_ERR_FORMAT, "appears twice");
    /* dtypes */
    expect_bad(T1("Q4", "[1]", "[0,1]"), 4, QKV_ERR_DTYPE, "tensor 't': unknown dtype 'Q4'");
    expect_bad(T1("f32", "[1]", "[0,4]"), 4, QKV_ERR_DTYPE, "unknown dtype");
    expect_bad(T1("F32 ", "[1]", "[0,4]"), 4, QKV_ERR_DTYPE, "unknown dtype");
    expect_bad(T1("A_VERY_LONG_DTYPE_NAME_THAT_GOES_ON", "[1]", "[0,4]"), 4, QKV_ERR_DTYPE, "unknown dtype");
    static const char *unsupported[] = {"BOOL", "U8", "I8", "I16", "U16", "U32", "U64", "F8_E5M2", "F8_E4M3"};
    for (size_t i = 0; i < sizeof unsupported / sizeof unsupported[0]; i++) {
        char json[200], needle[64];
        snprintf(json, sizeof json, "{\"w\":{\"dtype\":\"%s\",\"shape\":[1],\"data_offsets\":[0,1]}}", unsupported[i]);
        snprintf(needle, sizeof needle, "tensor 'w': dtype %s is not supported", unsupported[i]);
        expect_bad(json, 8, QKV_ERR_DTYPE, needle);
    }
    /* a long and unprintable name is shown shortened in the message */
    expect_bad("{\"0123456789012345678901234567890123456789012345678901234567890123456789\\n\":"
               "{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,8]}}",
               8, QKV_ERR_FORMAT, "'012345678901234567890123456789012345678901234567...'");
    expect_bad("{\"a\\nb\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8, QKV_ERR_FORMAT, "'a?b'");
}

/* A why buffer of every size from 0 up is filled without overflow. */
static void test_why_buffer(void) {
    size_t len;
    unsigned char *b = mkfile(T1("F32", "[4,4]", "[0,96]"), NULL, 96, &len);
    for (size_t n = 0; n < 40; n++) {
        char *why = tu_guarded_alloc(n ? n : 1);
        qkv_safetensors *st;
        CHECK_STATUS(qkv_safetensors_parse(b, len, &st, n ? why : NULL, n), QKV_ERR_FORMAT);
        CHECK(tu_guarded_ok(why), "why[%zu] overflowed", n);
        CHECK(n == 0 || strlen(why) == n - 1, "why[%zu] holds %zu chars", n, strlen(why));
        tu_guarded_free(why);
    }
    free(b);
}

/* ---- allocation failure ------------------------------------------------ */

static void test_alloc_failure(void) {
    size_t len;
    unsigned char *b = mha_file(&len);
    char path[512];
    tu_tmp_path(path, sizeof path, "st_oom.safetensors");

    /* parse: every allocation in turn fails */
    long k, ok_at = 0;
    for (k = 1; k < 1000; k++) {
        alloc_fail_at(k);
        qkv_safetensors *st = (qkv_safetensors *)&len;
        char why[256] = "";
        qkv_status s = qkv_safetensors_parse(b, len, &st, why, sizeof why);
        if (s == QKV_OK) {
            qkv_safetensors_free(st);
            CHECK(g_live == 0, "parse leaked %ld after success", g_live);
            ok_at = k;
            break;
        }
        CHECK(s == QKV_ERR_OUT_OF_MEMORY && st == NULL && g_live == 0,
              "parse, allocation %ld fails: %s (%s), out %p, %ld live", k, qkv_status_string(s), why,
              (void *)st, g_live);
    }
    CHECK(ok_at > 5, "parse succeeded after %ld allocations", ok_at);

    /* load: the same, from the file */
    qkv_set_allocator(NULL, NULL, NULL);
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite(b, 1, len, f);
        fclose(f);
    }
    for (k = 1; k < 1000; k++) {
        alloc_fail_at(k);
        qkv_safetensors *st = NULL;
        qkv_status s = qkv_safetensors_load(path, &st, NULL, 0);
        if (s == QKV_OK) {
            qkv_safetensors_free(st);
            CHECK(g_live == 0, "load leaked");
            break;
        }
        CHECK(s == QKV_ERR_OUT_OF_MEMORY && st == NULL && g_live == 0, "load, allocation %ld fails: %s, %ld live",
              k, qkv_status_string(s), g_live);
    }
    CHECK(k > 5 && k < 1000, "load succeeded after %ld allocations", k);
    qkv_set_allocator(NULL, NULL, NULL);
    remove(path);

    /* building and saving: create, puts, metas, save. A failed save leaves
     * neither the file nor a temporary one. */
    char dir[400];
    tu_tmp_path(dir, sizeof dir, "st_oom_dir");
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/out.safetensors", dir);
    const int64_t s3[] = {3, 2};
    qkv_array a = make_array(QKV_F64, 2, s3, 0);
    for (k = 1; k < 1000; k++) {
        alloc_fail_at(k);
        qkv_safetensors *st = NULL;
        qkv_status s = qkv_safetensors_create(&st);
        char nm[8] = "w0";
        for (int i = 0; i < 12 && s == QKV_OK; i++) {
            nm[1] = (char)('a' + i);
            s = qkv_safetensors_put(st, nm, &a);
            CHECK(s == QKV_OK || qkv_safetensors_get(st, nm) == NULL, "failed put left a tensor");
        }
        if (s == QKV_OK) s = qkv_safetensors_put(st, "wa", &a); /* replacement */
        for (int i = 0; i < 10 && s == QKV_OK; i++) {
            nm[1] = (char)('a' + i);
            s = qkv_safetensors_set_meta(st, nm, "value");
        }
        if (s == QKV_OK) s = qkv_safetensors_set_meta(st, "wa", "other");
        if (s == QKV_OK) s = qkv_safetensors_save(st, path);
        qkv_safetensors_free(st);
        if (s == QKV_OK) {
            CHECK(g_live == 0, "build + save leaked %ld", g_live);
            break;
        }
        CHECK(s == QKV_ERR_OUT_OF_MEMORY && g_live == 0, "build/save, allocation %ld fails: %s, %ld live", k,
              qkv_status_string(s), g_live);
        CHECK(dir_entries(dir) == 0, "allocation %ld failed: %d files left in %s", k, dir_entries(dir), dir);
    }
    qkv_set_allocator(NULL, NULL, NULL);
    CHECK(k > 20 && k < 1000, "build + save succeeded after %ld allocations", k);
    qkv_safetensors *ld = NULL;
    CHECK_STATUS(qkv_safetensors_load(path, &ld, NULL, 0), QKV_OK);
    CHECK(qkv_safetensors_count(ld) == 12 && same_array(qkv_safetensors_get(ld, "wl"), &a), "saved set");
    CHECK(strcmp(qkv_safetensors_get_meta(ld, "wa"), "other") == 0, "saved meta");
    qkv_safetensors_free(ld);
    remove(path);

    /* save failing for I/O: the folder does not exist, the path is a folder */
    qkv_safetensors *st = NULL;
    CHECK_STATUS(qkv_safetensors_create(&st), QKV_OK);
    CHECK_STATUS(qkv_safetensors_put(st, "a", &a), QKV_OK);
    snprintf(path, sizeof path, "%s/missing/out.safetensors", dir);
    CHECK_STATUS(qkv_safetensors_save(st, path), QKV_ERR_IO);
    CHECK(!file_exists(path), "failed save left a file");
    CHECK_STATUS(qkv_safetensors_save(st, ""), QKV_ERR_IO);
    snprintf(path, sizeof path, "%s/sub", dir);
    mkdir(path, 0755);
    CHECK_STATUS(qkv_safetensors_save(st, path), QKV_ERR_IO);
    CHECK(dir_entries(path) == 0 && dir_entries(dir) == 1, "save over a folder left files");
    rmdir(path);
    rmdir(dir);
    qkv_safetensors_free(st);
    qkv_array_free(&a);
    free(b);
}

static void test_load_errors(void) {
    qkv_safetensors *st = (qkv_safetensors *)&st;
    char why[256] = "";
    char path[512];
    tu_tmp_path(path, sizeof path, "st_does_not_exist.safetensors");
    remove(path);
    CHECK_STATUS(qkv_safetensors_load(path, &st, why, sizeof why), QKV_ERR_IO);
    CHECK(st == NULL && why[0] && !strchr(why, '\n'), "why: %s", why);
    tu_tmp_path(path, sizeof path, "");
    CHECK_STATUS(qkv_safetensors_load(path, &st, why, sizeof why), QKV_ERR_IO); /* a folder */
    /* an empty file and a truncated one are format errors */
    tu_tmp_path(path, sizeof path, "st_empty.safetensors");
    FILE *f = fopen(path, "wb");
    if (f) fclose(f);
    CHECK_STATUS(qkv_safetensors_load(path, &st, why, sizeof why), QKV_ERR_FORMAT);
    size_t len;
    unsigned char *b = mha_file(&len);
    f = fopen(path, "wb");
    if (f) {
        fwrite(b, 1, len - 1, f);
        fclose(f);
    }
    CHECK_STATUS(qkv_safetensors_load(path, &st, why, sizeof why), QKV_ERR_FORMAT);
    CHECK(strstr(why, "past the end"), "why: %s", why);
    remove(path);
    free(b);
}

/* ---- fixtures written by the Python safetensors package ---------------- */

static void test_fixtures(void) {
    const char *src = getenv("QKV_SOURCE_DIR");
    if (!src || !*src) {
        fprintf(stderr, "note: QKV_SOURCE_DIR unset, fixtures skipped\n");
        return;
    }
    char path[1024], why[256] = "";
    qkv_safetensors *st = NULL;

    /* mha.safetensors: safetensors.numpy.save_file of an nn.MultiheadAttention
     * (E = 4) state_dict with values arange(n) / 8 - k, metadata format=pt. */
    snprintf(path, sizeof path, "%s/tests/data/safetensors/mha.safetensors", src);
    qkv_status s = qkv_safetensors_load(path, &st, why, sizeof why);
    CHECK(s == QKV_OK, "%s: %s (%s)", path, qkv_status_string(s), why);
    if (st) {
        static const char *names[4] = {"in_proj_bias", "in_proj_weight", "out_proj.bias", "out_proj.weight"};
        static const int64_t n0[4] = {12, 12, 4, 4};
        CHECK(qkv_safetensors_count(st) == 4, "fixture count");
        for (int i = 0; i < 4; i++) {
            const qkv_array *a = qkv_safetensors_get(st, names[i]);
            CHECK(a && a->dtype == QKV_F32 && a->shape[0] == n0[i], "fixture %s", names[i]);
            if (!a) continue;
            int ok = 1;
            for (int64_t k = 0; k < qkv_array_count(a); k++)
                ok &= ((const float *)a->data)[k] == (float)k / 8.0f - (float)i;
            CHECK(ok, "fixture %s values", names[i]);
        }
        const char *m = qkv_safetensors_get_meta(st, "format");
        CHECK(m && strcmp(m, "pt") == 0, "fixture metadata");
        qkv_safetensors_free(st);
    }

    /* dtypes.safetensors: F16 (incl. subnormal, inf, NaN), F64, I32, I64 and
     * a 0-dim, written by numpy; values listed in make_fixtures.py. */
    snprintf(path, sizeof path, "%s/tests/data/safetensors/dtypes.safetensors", src);
    s = qkv_safetensors_load(path, &st, why, sizeof why);
    CHECK(s == QKV_OK, "%s: %s (%s)", path, qkv_status_string(s), why);
    if (st) {
        const qkv_array *h = qkv_safetensors_get(st, "half");
        static const float hv[6] = {1.0f, -2.5f, 65504.0f, 0x1p-24f, INFINITY, 0.0f};
        CHECK(h && h->dtype == QKV_F32 && h->ndim == 2 && h->shape[0] == 2 && h->shape[1] == 4, "half shape");
        if (h) {
            const float *v = h->data;
            for (int i = 0; i < 6; i++) CHECK(v[i] == hv[i], "half[%d] = %g", i, (double)v[i]);
            CHECK(isnan(v[6]) && v[7] == -0.0f && signbit(v[7]), "half NaN, -0");
        }
        const qkv_array *d = qkv_safetensors_get(st, "double");
        CHECK(d && d->dtype == QKV_F64 && d->ndim == 1 && d->shape[0] == 3 &&
                  ((const double *)d->data)[0] == 0.1 && ((const double *)d->data)[2] == -1e300,
              "double");
        const qkv_array *i32 = qkv_safetensors_get(st, "int32");
        CHECK(i32 && i32->dtype == QKV_I32 && ((const int32_t *)i32->data)[1] == -2147483647 - 1, "int32");
        const qkv_array *i64 = qkv_safetensors_get(st, "int64");
        CHECK(i64 && i64->dtype == QKV_I64 && ((const int64_t *)i64->data)[0] == INT64_MAX, "int64");
        const qkv_array *sc = qkv_safetensors_get(st, "scalar");
        CHECK(sc && sc->ndim == 0 && ((const float *)sc->data)[0] == 3.5f, "scalar");
        const qkv_array *z = qkv_safetensors_get(st, "empty");
        CHECK(z && z->ndim == 2 && z->shape[0] == 0 && z->shape[1] == 5, "empty");
        qkv_safetensors_free(st);
    }
}

int main(void) {
    test_round_trip();
    test_put_and_names();
    test_mha_names();
    test_half_conversion();
    test_valid_oddities();
    test_bad_header_length();
    test_truncation();
    test_bad_json();
    test_nesting_bombs();
    test_bad_tensors();
    test_why_buffer();
    test_alloc_failure();
    test_load_errors();
    test_fixtures();
    return tu_finish();
}
