/* qkv_set_memory_limit: a request whose buffers would take the library's
 * live memory above the limit is refused before allocating, with
 * QKV_ERR_MEMORY_LIMIT from the attention functions (QKV_ERR_OUT_OF_MEMORY
 * from the others), qkv_memory_refused() naming the size, nothing leaked,
 * and the same call succeeding once the limit allows it. */
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

static long g_hook_calls;
static void *hook_malloc(size_t n, void *user) {
    (void)user;
    g_hook_calls++;
    return malloc(n);
}
static void hook_free(void *p, void *user) {
    (void)user;
    free(p);
}

static void test_attention(void) {
    /* float32 through the reference: it converts the inputs to float64
     * copies, B*n*H*D*8 = 2 MiB for q alone. */
    qkv_attn_desc d;
    qkv_attn_desc_init(&d);
    d.batch = 1;
    d.n_q = d.n_k = 1024;
    d.heads = 4;
    d.dim = 64;
    d.impl = QKV_IMPL_REFERENCE;
    d.threads = 1;
    size_t n = (size_t)(d.n_q * d.heads * d.dim);
    float *q = calloc(n, sizeof(float)), *k = calloc(n, sizeof(float)), *v = calloc(n, sizeof(float));
    float *out = malloc(n * sizeof(float));
    if (!q || !k || !v || !out) {
        CHECK(0, "test out of memory");
        free(q), free(k), free(v), free(out);
        return;
    }
    for (size_t i = 0; i < n; i++) q[i] = k[i] = v[i] = (float)(i % 7) / 7.0f;

    CHECK(qkv_memory_in_use() == 0, "live bytes before any call: %zu", qkv_memory_in_use());
    CHECK_STATUS(qkv_set_memory_limit(1u << 20), QKV_OK);
    CHECK(qkv_memory_limit() == 1u << 20, "limit reads back");
    g_hook_calls = 0;
    CHECK_STATUS(qkv_set_allocator(hook_malloc, hook_free, NULL), QKV_OK);
    memset(out, 0x7f, n * sizeof(float));
    CHECK_STATUS(qkv_attention_forward(&d, q, k, v, out, NULL, NULL), QKV_ERR_MEMORY_LIMIT);
    size_t refused = qkv_memory_refused();
    CHECK(refused > (1u << 20), "the refused size is named: %zu", refused);
    CHECK(qkv_memory_in_use() == 0, "nothing held after the refusal: %zu", qkv_memory_in_use());
    long calls_refused = g_hook_calls;

    qkv_attn_grads g = {out, out, out, NULL, NULL, NULL, NULL, NULL};
    float *dout = q;
    float *dq = malloc(n * sizeof(float)), *dk = malloc(n * sizeof(float)), *dv = malloc(n * sizeof(float));
    if (dq && dk && dv) {
        g.dq = dq, g.dk = dk, g.dv = dv;
        CHECK_STATUS(qkv_attention_backward(&d, q, k, v, NULL, NULL, dout, &g), QKV_ERR_MEMORY_LIMIT);
        CHECK(qkv_memory_in_use() == 0, "nothing held after the refused backward");
    }

    /* Room enough: the same call works, and gives everything back. */
    CHECK_STATUS(qkv_set_memory_limit(64u << 20), QKV_OK);
    CHECK_STATUS(qkv_attention_forward(&d, q, k, v, out, NULL, NULL), QKV_OK);
    CHECK(g_hook_calls > calls_refused, "allocations go through the hooks");
    CHECK(qkv_memory_in_use() == 0, "live bytes after the call: %zu", qkv_memory_in_use());
    CHECK_STATUS(qkv_set_memory_limit(0), QKV_OK);
    CHECK_STATUS(qkv_attention_forward(&d, q, k, v, out, NULL, NULL), QKV_OK);
    CHECK_STATUS(qkv_set_allocator(NULL, NULL, NULL), QKV_OK);
    free(q), free(k), free(v), free(out), free(dq), free(dk), free(dv);
}

/* Objects that hold memory: live bytes count them until freed; a lower limit
 * refuses new requests but frees nothing. */
static void test_live_objects(void) {
    qkv_mha_config cfg;
    qkv_mha_config_init(&cfg, 64, 4);
    qkv_mha *m = NULL;
    CHECK_STATUS(qkv_mha_create(&cfg, 1, &m), QKV_OK);
    size_t live = qkv_memory_in_use();
    CHECK(live >= (size_t)(4 * 64 * 64) * sizeof(float), "a layer's parameters are live: %zu", live);
    CHECK_STATUS(qkv_set_memory_limit(live / 2), QKV_OK);
    qkv_mha *m2 = NULL;
    qkv_status s = qkv_mha_create(&cfg, 2, &m2);
    CHECK(s == QKV_ERR_OUT_OF_MEMORY || s == QKV_ERR_MEMORY_LIMIT,
          "a second layer over the limit: %s", qkv_status_string(s));
    CHECK(m2 == NULL, "no layer returned on failure");
    CHECK(qkv_memory_refused() > 0, "the refused size is named");
    CHECK(qkv_memory_in_use() == live, "the first layer is untouched: %zu != %zu",
          qkv_memory_in_use(), live);
    CHECK_STATUS(qkv_set_memory_limit(0), QKV_OK);
    qkv_mha_free(m);
    CHECK(qkv_memory_in_use() == 0, "all freed: %zu", qkv_memory_in_use());

    /* A .npy header announcing 4 MiB: refused before the data are copied. */
    size_t data = 4u << 20;
    unsigned char *file = calloc(1, 128 + data);
    if (!file) {
        CHECK(0, "test out of memory");
        return;
    }
    const char *hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (1048576,), }";
    size_t hl = strlen(hdr), total = 10 + hl + 1;
    size_t pad = (64 - total % 64) % 64;
    memcpy(file, "\x93NUMPY\x01\x00", 8);
    file[8] = (unsigned char)((hl + 1 + pad) & 0xff);
    file[9] = (unsigned char)((hl + 1 + pad) >> 8);
    memcpy(file + 10, hdr, hl);
    memset(file + 10 + hl, ' ', pad);
    file[10 + hl + pad] = '\n';
    qkv_array a;
    CHECK_STATUS(qkv_npy_parse(file, 10 + hl + pad + 1 + data, &a, NULL, 0), QKV_OK);
    qkv_array_free(&a);
    CHECK_STATUS(qkv_set_memory_limit(1u << 20), QKV_OK);
    s = qkv_npy_parse(file, 10 + hl + pad + 1 + data, &a, NULL, 0);
    CHECK(s == QKV_ERR_OUT_OF_MEMORY || s == QKV_ERR_MEMORY_LIMIT, ".npy over the limit: %s",
          qkv_status_string(s));
    CHECK(qkv_memory_refused() >= data, "refused %zu bytes", qkv_memory_refused());
    CHECK(qkv_memory_in_use() == 0, "nothing held: %zu", qkv_memory_in_use());
    CHECK_STATUS(qkv_set_memory_limit(0), QKV_OK);
    free(file);
}

int main(void) {
    test_attention();
    test_live_objects();
    return tu_finish();
}
