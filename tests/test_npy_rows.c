/* qkv_npy_load_header and qkv_npy_load_rows (each MPI rank's own rows of
 * `qkv attend --distributed`'s inputs): every layout the CLI reads ([n, D],
 * [n, H, D], [B, n, H, D] along the sequence axis, the bias [n, n] and
 * [H, n, n] along the query axis) and a few more axes, dtypes <f4, <f8, <i4,
 * <f2, random sets of one or two ranges (as qkv_dist_partition cuts them)
 * compared with slicing the whole array from qkv_npy_load, ranges at the
 * edges, empty ranges, zero-sized arrays, bad arguments, and a file
 * truncated at many lengths (always QKV_ERR_FORMAT, never a short read). */
#define _POSIX_C_SOURCE 200809L /* truncate, mkdir */

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_util.h"

static int is_zeroed(const qkv_array *a) {
    qkv_array z;
    memset(&z, 0, sizeof z);
    return memcmp(a, &z, sizeof z) == 0;
}

/* A file of `dtype` and shape with element i holding the value i (exact in
 * every dtype tested, as the arrays hold at most 2048 elements). */
static void write_file(const char *path, qkv_dtype dtype, int ndim, const int64_t *shape) {
    qkv_array a, f;
    CHECK_STATUS(qkv_array_alloc(&f, QKV_F64, ndim, shape), QKV_OK);
    int64_t n = qkv_array_count(&f);
    for (int64_t i = 0; i < n; i++) ((double *)f.data)[i] = (double)(i % 2048);
    if (dtype == QKV_F64) {
        a = f;
    } else {
        CHECK_STATUS(qkv_array_convert(&f, dtype, &a), QKV_OK);
        qkv_array_free(&f);
    }
    CHECK_STATUS(qkv_npy_save(path, &a), QKV_OK);
    qkv_array_free(&a);
}

/* Load rows of `path` and compare with slicing the whole array. */
static void check_rows(const char *path, int axis, int nr, const int64_t *st, const int64_t *ln) {
    qkv_array whole, part;
    char why[200];
    CHECK_STATUS(qkv_npy_load(path, &whole, why, sizeof why), QKV_OK);
    int64_t len = -1;
    qkv_status s = qkv_npy_load_rows(path, axis, nr, st, ln, &part, &len, why, sizeof why);
    CHECK(s == QKV_OK, "load_rows axis %d: %d (%s)", axis, (int)s, why);
    if (s != QKV_OK) {
        qkv_array_free(&whole);
        return;
    }
    CHECK(len == whole.shape[axis], "axis_len %lld != %lld", (long long)len, (long long)whole.shape[axis]);
    CHECK(part.dtype == whole.dtype && part.ndim == whole.ndim, "dtype/ndim differ");
    int64_t total = 0;
    for (int r = 0; r < nr; r++) total += ln[r];
    for (int i = 0; i < whole.ndim; i++)
        CHECK(part.shape[i] == (i == axis ? total : whole.shape[i]), "shape[%d] = %lld", i,
              (long long)part.shape[i]);
    size_t elem = qkv_dtype_size(whole.dtype);
    int64_t outer = 1, inner = 1;
    for (int i = 0; i < axis; i++) outer *= whole.shape[i];
    for (int i = axis + 1; i < whole.ndim; i++) inner *= whole.shape[i];
    const unsigned char *w = whole.data, *p = part.data;
    int bad = 0;
    for (int64_t o = 0; o < outer && !bad; o++)
        for (int r = 0; r < nr && !bad; r++) {
            size_t bytes = (size_t)(ln[r] * inner) * elem;
            const unsigned char *src = w + (size_t)((o * whole.shape[axis] + st[r]) * inner) * elem;
            if (bytes && memcmp(src, p, bytes) != 0) bad = 1;
            p += bytes;
        }
    CHECK(!bad, "rows differ from the whole array's (axis %d, %d ranges)", axis, nr);
    qkv_array_free(&whole);
    qkv_array_free(&part);
}

static void expect_fail(const char *path, int axis, int nr, const int64_t *st, const int64_t *ln,
                        qkv_status want, const char *want_why) {
    qkv_array a;
    char why[200] = "x";
    memset(&a, 0xAB, sizeof a);
    qkv_status s = qkv_npy_load_rows(path, axis, nr, st, ln, &a, NULL, why, sizeof why);
    CHECK(s == want, "axis %d nr %d: got %d (%s), want %d", axis, nr, (int)s, why, (int)want);
    CHECK(is_zeroed(&a), "out not zeroed on failure");
    CHECK(why[0] != '\0' && strchr(why, '\n') == NULL, "why '%s' empty or not one line", why);
    if (want_why) CHECK(strstr(why, want_why) != NULL, "why '%s' lacks '%s'", why, want_why);
}

static void layouts(tu_rng *rng) {
    static const struct { int ndim; int64_t shape[4]; int axis; } L[] = {
        {2, {13, 5}, 0},          /* q [n, D] */
        {3, {13, 3, 4}, 0},       /* q [n, H, D] */
        {4, {2, 13, 3, 4}, 1},    /* q [B, n, H, D] */
        {4, {2, 3, 13, 4}, 2},    /* [B, H, n, D] */
        {2, {13, 11}, 0},         /* bias [n_q, n_k] */
        {3, {3, 13, 11}, 1},      /* bias [H, n_q, n_k] */
        {3, {3, 4, 13}, 2},       /* the last axis */
        {1, {13}, 0},
    };
    static const qkv_dtype dts[] = {QKV_F32, QKV_F64, QKV_I32, QKV_F16};
    char path[512];
    tu_tmp_path(path, sizeof path, "npy_rows.npy");
    for (size_t l = 0; l < sizeof L / sizeof L[0]; l++)
        for (size_t t = 0; t < sizeof dts / sizeof dts[0]; t++) {
            write_file(path, dts[t], L[l].ndim, L[l].shape);
            qkv_array h;
            char why[200];
            CHECK_STATUS(qkv_npy_load_header(path, &h, why, sizeof why), QKV_OK);
            CHECK(h.data == NULL && h.ndim == L[l].ndim && h.dtype == dts[t], "header");
            for (int i = 0; i < h.ndim; i++) CHECK(h.shape[i] == L[l].shape[i], "header shape");
            const int64_t n = L[l].shape[L[l].axis];
            /* Edges: everything; the first and the last row; empty ranges at
             * 0 and at n; no ranges at all; the zig-zag pair of 2 ranks. */
            const int64_t cases[][4] = {{0, n, 0, 0},     {0, 1, n - 1, 1}, {n - 1, 1, 0, 1},
                                        {0, 0, n, 0},     {n, 0, 0, 0},     {0, 3, 10, 3},
                                        {3, 3, 7, 3},     {5, 0, 5, 4}};
            for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
                int64_t st[2] = {cases[c][0], cases[c][2]}, ln[2] = {cases[c][1], cases[c][3]};
                check_rows(path, L[l].axis, 2, st, ln);
                check_rows(path, L[l].axis, 1, st, ln);
            }
            check_rows(path, L[l].axis, 0, NULL, NULL);
            for (int k = 0; k < 20; k++) {
                int64_t st[2], ln[2];
                for (int r = 0; r < 2; r++) {
                    st[r] = (int64_t)(tu_rng_u64(rng) % (uint64_t)(n + 1));
                    ln[r] = (int64_t)(tu_rng_u64(rng) % (uint64_t)(n - st[r] + 1));
                }
                check_rows(path, L[l].axis, 1 + (int)(tu_rng_u64(rng) % 2), st, ln);
            }
        }
    unlink(path);
}

static void zero_sized(void) {
    char path[512];
    tu_tmp_path(path, sizeof path, "npy_rows_zero.npy");
    const int64_t s1[2] = {0, 4}, s2[3] = {2, 5, 0};
    write_file(path, QKV_F32, 2, s1);
    int64_t st[2] = {0, 0}, ln[2] = {0, 0};
    check_rows(path, 0, 2, st, ln);
    ln[0] = 1;
    expect_fail(path, 0, 1, st, ln, QKV_ERR_BAD_SIZE, "outside");
    write_file(path, QKV_F64, 3, s2);
    st[0] = 1;
    ln[0] = 3;
    check_rows(path, 1, 1, st, ln);
    unlink(path);
}

static void bad_arguments(void) {
    char path[512];
    tu_tmp_path(path, sizeof path, "npy_rows_bad.npy");
    const int64_t shape[3] = {2, 7, 3};
    write_file(path, QKV_F32, 3, shape);
    int64_t st[2] = {0, 0}, ln[2] = {1, 1};
    expect_fail(path, -1, 1, st, ln, QKV_ERR_BAD_SIZE, "axis");
    expect_fail(path, 3, 1, st, ln, QKV_ERR_BAD_SIZE, "axis");
    expect_fail(path, 1, -1, st, ln, QKV_ERR_BAD_SIZE, NULL);
    expect_fail(path, 1, 1, NULL, ln, QKV_ERR_NULL_POINTER, NULL);
    expect_fail(path, 1, 1, st, NULL, QKV_ERR_NULL_POINTER, NULL);
    expect_fail(NULL, 1, 1, st, ln, QKV_ERR_NULL_POINTER, NULL);
    const int64_t bad[][2] = {{-1, 1}, {0, -1}, {0, 8}, {7, 1}, {8, 0}, {6, 2}, {INT64_MAX, 1}, {1, INT64_MAX}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int64_t s2[2] = {0, bad[i][0]}, l2[2] = {1, bad[i][1]};
        expect_fail(path, 1, 2, s2, l2, QKV_ERR_BAD_SIZE, "outside");
    }
    CHECK_STATUS(qkv_npy_load_rows(path, 1, 1, st, ln, NULL, NULL, NULL, 0), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_npy_load_header(path, NULL, NULL, 0), QKV_ERR_NULL_POINTER);
    qkv_array a;
    CHECK_STATUS(qkv_npy_load_header(NULL, &a, NULL, 0), QKV_ERR_NULL_POINTER);
    /* Missing file, a directory: QKV_ERR_IO. */
    char missing[512], dir[512];
    tu_tmp_path(missing, sizeof missing, "npy_rows_missing.npy");
    unlink(missing);
    expect_fail(missing, 0, 1, st, ln, QKV_ERR_IO, "cannot open");
    tu_tmp_path(dir, sizeof dir, "npy_rows_dir");
    mkdir(dir, 0700);
    expect_fail(dir, 0, 1, st, ln, QKV_ERR_IO, NULL);
    rmdir(dir);
    /* Not a .npy file, and an unsupported dtype: as qkv_npy_load. */
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL, "cannot write %s", path);
    if (f) {
        fputs("not a numpy file at all, just text", f);
        fclose(f);
    }
    expect_fail(path, 0, 1, st, ln, QKV_ERR_FORMAT, "magic");
    unlink(path);
}

/* Truncated at every length from 0 to the whole file less one byte: every
 * call fails with QKV_ERR_FORMAT (the header's data size is checked against
 * the file before any row is read, so even rows that are still in the file
 * are refused), and the header-only reader says the same. */
static void truncated(void) {
    char path[512];
    tu_tmp_path(path, sizeof path, "npy_rows_trunc.npy");
    const int64_t shape[4] = {2, 9, 2, 3};
    write_file(path, QKV_F64, 4, shape);
    struct stat st_;
    CHECK(stat(path, &st_) == 0, "stat");
    off_t size = st_.st_size;
    int64_t st[2] = {0, 4}, ln[2] = {1, 2};
    check_rows(path, 1, 2, st, ln);
    for (off_t len = size - 1; len >= 0; len -= (len > 200 ? 7 : 1)) {
        CHECK(truncate(path, len) == 0, "truncate");
        expect_fail(path, 1, 2, st, ln, QKV_ERR_FORMAT, NULL);
        qkv_array h;
        char why[200];
        CHECK_STATUS(qkv_npy_load_header(path, &h, why, sizeof why), QKV_ERR_FORMAT);
        CHECK(is_zeroed(&h), "header out not zeroed");
    }
    write_file(path, QKV_F64, 4, shape);
    CHECK(truncate(path, size - 8) == 0, "truncate");
    expect_fail(path, 1, 2, st, ln, QKV_ERR_FORMAT, "truncated");
    unlink(path);
}

int main(void) {
    tu_rng rng;
    tu_rng_seed(&rng, 9);
    layouts(&rng);
    zero_sized();
    bad_arguments();
    truncated();
    return tu_finish();
}
