/* libFuzzer target: qkv_safetensors_parse on arbitrary bytes (weights files
 * are untrusted input). Checks the contract beyond "no crash": on failure
 * *out is NULL with a reason; on success every tensor is reachable by its
 * name, has a valid shape whose data fit in the input, and the set can be
 * extended (put, metadata) and freed without leaks. */
#include <string.h>

#include "fuzz.h"
#include "fuzz_check.h"
#include "qkv.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    qkv_safetensors *st = (qkv_safetensors *)(uintptr_t)1;
    char why[160];
    why[0] = '\0';
    qkv_status s = qkv_safetensors_parse(data, size, &st, why, sizeof why);
    if (s != QKV_OK) {
        FUZZ_CHECK(s == QKV_ERR_FORMAT || s == QKV_ERR_DTYPE || s == QKV_ERR_SIZE_OVERFLOW ||
                       s == QKV_ERR_OUT_OF_MEMORY,
                   "undocumented status %d", (int)s);
        FUZZ_CHECK(st == NULL, "failed parse left *out set");
        FUZZ_CHECK(why[0] != '\0' && memchr(why, '\0', sizeof why) != NULL, "no reason given");
        return 0;
    }
    FUZZ_CHECK(st != NULL, "OK without a set");
    int64_t n = qkv_safetensors_count(st);
    FUZZ_CHECK(n >= 0, "count %lld", (long long)n);
    uint64_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        const char *name = qkv_safetensors_name(st, i);
        FUZZ_CHECK(name != NULL && name[0] != '\0', "tensor %lld has no name", (long long)i);
        const qkv_array *a = qkv_safetensors_get(st, name);
        FUZZ_CHECK(a != NULL, "tensor '%s' not found by its name", name);
        FUZZ_CHECK(a->ndim >= 0 && a->ndim <= QKV_NPY_MAX_DIMS, "ndim %d", a->ndim);
        int64_t count = qkv_array_count(a);
        size_t esz = qkv_dtype_size(a->dtype);
        FUZZ_CHECK(esz != 0, "dtype %d", (int)a->dtype);
        /* F16/BF16 load as F32: at most 2x the bytes of the file. */
        FUZZ_CHECK((uint64_t)count <= 2 * (uint64_t)size / esz + 1, "tensor '%s' too large", name);
        FUZZ_CHECK(count == 0 || a->data != NULL, "tensor '%s' has no data", name);
        volatile unsigned char sink = 0;
        for (size_t b = 0; b < (size_t)count * esz; b++) sink ^= ((const unsigned char *)a->data)[b];
        (void)sink;
        total += (uint64_t)count * esz;
    }
    FUZZ_CHECK(qkv_safetensors_name(st, n) == NULL, "name past the end");
    (void)total;
    (void)qkv_safetensors_get_meta(st, "format");
    /* The parsed set must be a normal set: extend and replace. */
    float one = 1.0f;
    qkv_array x = {QKV_F32, 1, {1}, &one};
    qkv_status p = qkv_safetensors_put(st, "fuzz.extra", &x);
    FUZZ_CHECK(p == QKV_OK || p == QKV_ERR_OUT_OF_MEMORY, "put status %d", (int)p);
    if (p == QKV_OK) {
        const qkv_array *g = qkv_safetensors_get(st, "fuzz.extra");
        FUZZ_CHECK(g && g->ndim == 1 && g->shape[0] == 1 && ((const float *)g->data)[0] == 1.0f,
                   "put then get");
    }
    p = qkv_safetensors_set_meta(st, "fuzz", "yes");
    FUZZ_CHECK(p == QKV_OK || p == QKV_ERR_OUT_OF_MEMORY, "set_meta status %d", (int)p);
    qkv_safetensors_free(st);
    return 0;
}
