/* libFuzzer target: qkv_npy_parse on arbitrary bytes (a .npy file is
 * untrusted input). Beyond "no crash, no leak, no out-of-bounds read" it
 * checks the documented contract: on failure *out is zeroed and a reason is
 * written; on success the shape is valid, the data fits in the input, and
 * the array converts to every dtype (or refuses with a documented status). */
#include <string.h>

#include "fuzz.h"
#include "fuzz_check.h"
#include "qkv.h"

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
    qkv_array_free(&a);
    FUZZ_CHECK(a.data == NULL, "qkv_array_free did not zero");
    return 0;
}
