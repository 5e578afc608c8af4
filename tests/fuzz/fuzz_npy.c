/* libFuzzer target: qkv_npy_parse on arbitrary bytes (a .npy file is
 * untrusted input). Beyond "no crash, no leak, no out-of-bounds read" it
 * checks the documented contract: on failure *out is zeroed and a reason is
 * written; on success the shape is valid, the data fits in the input, and
 * the array converts to every dtype (or refuses with a documented status).
 * The same bytes written to a file are then read by qkv_npy_load_header and
 * qkv_npy_load_rows (each MPI rank's reader), which must agree with the
 * parse: the same status on failure, and on success the same header and, for
 * a range of rows chosen from the input's last bytes, the parsed array's
 * slice. */
#define _POSIX_C_SOURCE 200809L /* getpid */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "fuzz.h"
#include "fuzz_check.h"
#include "qkv.h"

/* The file readers on the same bytes; a: the parse's result (status s). */
static void check_file_readers(const uint8_t *data, size_t size, qkv_status s, const qkv_array *a) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/qkv_fuzz_npy_rows.%ld.npy", (long)getpid());
    FILE *f = fopen(path, "wb");
    if (!f) return; /* no temporary file here: the parse was checked */
    int ok = fwrite(data, 1, size, f) == size;
    if (fclose(f) != 0 || !ok) {
        remove(path);
        return;
    }
    qkv_array h, r;
    char why[128];
    qkv_status hs = qkv_npy_load_header(path, &h, why, sizeof why);
    if (s == QKV_ERR_OUT_OF_MEMORY || hs == QKV_ERR_OUT_OF_MEMORY) {
        remove(path);
        return;
    }
    FUZZ_CHECK(hs == s, "load_header status %d, parse %d", (int)hs, (int)s);
    if (hs == QKV_OK) {
        FUZZ_CHECK(h.data == NULL && h.dtype == a->dtype && h.ndim == a->ndim, "load_header header");
        for (int i = 0; i < h.ndim; i++) FUZZ_CHECK(h.shape[i] == a->shape[i], "load_header shape");
    }
    /* Two ranges of one axis, from the last bytes (in range or not). */
    uint8_t t[6] = {0};
    for (size_t i = 0; i < 6 && i < size; i++) t[i] = data[size - 1 - i];
    int axis = a->ndim > 0 ? t[0] % a->ndim : 0;
    int64_t len = a->ndim > 0 ? a->shape[axis] : 0;
    int64_t st[2] = {t[1] % (len + 2), t[3] % (len + 2)}, ln[2] = {t[2] % (len + 2), t[4] % (len + 2)};
    int nr = 1 + t[5] % 2;
    int64_t full = -1;
    qkv_status rs = qkv_npy_load_rows(path, axis, nr, st, ln, &r, &full, why, sizeof why);
    remove(path);
    if (rs == QKV_ERR_OUT_OF_MEMORY) return;
    int valid = a->ndim > 0;
    for (int k = 0; k < nr; k++) valid = valid && st[k] + ln[k] <= len;
    if (s != QKV_OK) {
        FUZZ_CHECK(rs == s, "load_rows status %d, parse %d", (int)rs, (int)s);
    } else if (!valid) {
        FUZZ_CHECK(rs == QKV_ERR_BAD_SIZE, "load_rows accepted bad ranges (status %d)", (int)rs);
    } else if (rs == QKV_ERR_SIZE_OVERFLOW) {
        /* Documented: ranges may repeat rows, so the result's axis (their
         * total) can exceed the file's, and with it the shape's product of
         * non-zero dimensions can overflow even when a zero dimension
         * leaves the file itself empty (found by CI's fuzzing). */
        int64_t total = 0;
        for (int k = 0; k < nr; k++) total += ln[k];
        FUZZ_CHECK(total > len, "load_rows SIZE_OVERFLOW for ranges within the axis (total %lld of %lld)",
                   (long long)total, (long long)len);
    } else {
        FUZZ_CHECK(rs == QKV_OK, "load_rows status %d (%s)", (int)rs, why);
        if (rs != QKV_OK) return;
        FUZZ_CHECK(full == len && r.ndim == a->ndim && r.dtype == a->dtype, "load_rows header");
        size_t esz = qkv_dtype_size(a->dtype);
        if (qkv_array_count(&r) > 0) { /* then no dim is 0: the products fit */
            int64_t outer = 1, inner = 1;
            for (int i = 0; i < axis; i++) outer *= a->shape[i];
            for (int i = axis + 1; i < a->ndim; i++) inner *= a->shape[i];
            const unsigned char *p = r.data;
            for (int64_t o = 0; o < outer; o++)
                for (int k = 0; k < nr; k++) {
                    size_t bytes = (size_t)(ln[k] * inner) * esz;
                    const unsigned char *src = (const unsigned char *)a->data + (size_t)((o * len + st[k]) * inner) * esz;
                    FUZZ_CHECK(memcmp(src, p, bytes) == 0, "load_rows rows differ from the parse's");
                    p += bytes;
                }
        }
        qkv_array_free(&r);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    qkv_array a;
    char why[128];
    memset(&a, 0x5a, sizeof a);
    why[0] = '\0';
    qkv_status s = qkv_npy_parse(data, size, &a, why, sizeof why);
    if (s != QKV_OK) {
        FUZZ_CHECK(s == QKV_ERR_FORMAT || s == QKV_ERR_DTYPE || s == QKV_ERR_SIZE_OVERFLOW ||
                       s == QKV_ERR_OUT_OF_MEMORY,
                   "undocumented status %d", (int)s);
        FUZZ_CHECK(a.data == NULL && a.ndim == 0, "failed parse left *out non-zero");
        FUZZ_CHECK(why[0] != '\0' && memchr(why, '\0', sizeof why) != NULL, "no reason given");
        check_file_readers(data, size, s, &a);
        return 0;
    }
    FUZZ_CHECK(a.ndim >= 0 && a.ndim <= QKV_NPY_MAX_DIMS, "ndim %d", a.ndim);
    int64_t count = qkv_array_count(&a);
    size_t esz = qkv_dtype_size(a.dtype);
    FUZZ_CHECK(esz != 0, "dtype %d", (int)a.dtype);
    for (int i = 0; i < a.ndim; i++) FUZZ_CHECK(a.shape[i] >= 0, "negative dim");
    FUZZ_CHECK((uint64_t)count <= size / esz, "%lld elements cannot come from %zu bytes",
               (long long)count, size);
    FUZZ_CHECK(a.data != NULL, "no data buffer");
    /* The data are the file's last count*esz bytes before any trailing ones;
     * touch every byte so ASan checks the buffer's extent. */
    volatile unsigned char sink = 0;
    for (size_t i = 0; i < (size_t)count * esz; i++) sink ^= ((const unsigned char *)a.data)[i];
    (void)sink;
    for (int to = 0; to < 6; to++) { /* F32, F64, I32, I64, BF16, F16 */
        qkv_array b;
        qkv_status c = qkv_array_convert(&a, (qkv_dtype)to, &b);
        /* SIZE_OVERFLOW is documented (as qkv_array_alloc): a shape with a
         * zero dim holds no element but its other dims, at a wider element
         * size, may not fit size_t (regression seed: zero_dim_wide.npy). */
        FUZZ_CHECK(c == QKV_OK || c == QKV_ERR_BAD_PARAMETER || c == QKV_ERR_OUT_OF_MEMORY ||
                       c == QKV_ERR_SIZE_OVERFLOW,
                   "convert status %d", (int)c);
        if (c == QKV_OK) {
            FUZZ_CHECK(qkv_array_count(&b) == count && b.dtype == (qkv_dtype)to, "convert shape");
            qkv_array_free(&b);
        }
    }
    check_file_readers(data, size, s, &a);
    qkv_array_free(&a);
    FUZZ_CHECK(a.data == NULL, "qkv_array_free did not zero");
    return 0;
}
