/* All allocations of the library go through one pair of hooks so that a
 * caller (or a test injecting failures) controls memory. */
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"

static void *default_malloc(size_t size, void *user) { (void)user; return malloc(size); }
static void default_free(void *ptr, void *user) { (void)user; free(ptr); }

static qkv_malloc_fn g_malloc = default_malloc;
static qkv_free_fn g_free = default_free;
static void *g_user = NULL;

qkv_status qkv_set_allocator(qkv_malloc_fn alloc, qkv_free_fn release, void *user) {
    if (!alloc && !release) {
        g_malloc = default_malloc;
        g_free = default_free;
        g_user = NULL;
        return QKV_OK;
    }
    if (!alloc || !release) return QKV_ERR_NULL_POINTER;
    g_malloc = alloc;
    g_free = release;
    g_user = user;
    return QKV_OK;
}

void *qkv_alloc(size_t bytes) { return g_malloc(bytes ? bytes : 1, g_user); }

void *qkv_alloc_zeroed(size_t bytes) {
    void *p = qkv_alloc(bytes);
    if (p) memset(p, 0, bytes ? bytes : 1);
    return p;
}

void qkv_free(void *p) {
    if (p) g_free(p, g_user);
}

int qkv_count_ok(int64_t *out, size_t elem, int n, const int64_t *factors) {
    int64_t c = 1;
    for (int i = 0; i < n; i++)
        if (!qkv_mul_ok(c, factors[i], &c)) return 0;
    if (elem && (uint64_t)c > (uint64_t)(SIZE_MAX / elem)) return 0;
    *out = c;
    return 1;
}
