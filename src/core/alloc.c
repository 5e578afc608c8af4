/* All allocations of the library go through one pair of hooks so that a
 * caller (or a test injecting failures) controls memory, and through one
 * accountant so that a process-wide limit can refuse a request before any
 * memory is taken (qkv_set_memory_limit).
 *
 * Each block carries a small header in front of what the caller gets: its
 * size, so that qkv_free can subtract it from the running total of live
 * bytes. The header is as large as max_align_t, so the pointer handed out is
 * as aligned as the hook's (malloc's). */
#include <stdalign.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"

static void *default_malloc(size_t size, void *user) { (void)user; return malloc(size); }
static void default_free(void *ptr, void *user) { (void)user; free(ptr); }

static qkv_malloc_fn g_malloc = default_malloc;
static qkv_free_fn g_free = default_free;
static void *g_user = NULL;

/* The limit (0: none) and the bytes live now (headers excluded). */
static atomic_size_t g_limit = 0;
static atomic_size_t g_live = 0;
/* The size of the last request the limit refused on this thread, 0 if none
 * since it was last read (qkv_alloc_take_refusal). */
static _Thread_local size_t t_refused = 0;
static _Thread_local size_t t_refused_seen = 0;

#define HEADER (alignof(max_align_t) > sizeof(size_t) ? alignof(max_align_t) : sizeof(size_t))

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

qkv_status qkv_set_memory_limit(size_t bytes) {
    atomic_store(&g_limit, bytes);
    return QKV_OK;
}

size_t qkv_memory_limit(void) { return atomic_load(&g_limit); }

size_t qkv_memory_in_use(void) { return atomic_load(&g_live); }

size_t qkv_memory_refused(void) { return t_refused_seen; }

/* Reserve `bytes` against the limit: 1 on success (counted as live), 0 when
 * the limit refuses them (nothing counted). */
static int reserve(size_t bytes) {
    size_t limit = atomic_load(&g_limit);
    size_t live = atomic_load(&g_live);
    for (;;) {
        if (limit != 0 && (bytes > limit || live > limit - bytes)) return 0;
        if (atomic_compare_exchange_weak(&g_live, &live, live + bytes)) return 1;
    }
}

void *qkv_alloc(size_t bytes) {
    if (bytes == 0) bytes = 1;
    if (bytes > SIZE_MAX - HEADER) return NULL;
    if (!reserve(bytes)) {
        t_refused = bytes;
        t_refused_seen = bytes;
        return NULL;
    }
    unsigned char *raw = g_malloc(bytes + HEADER, g_user);
    if (!raw) {
        atomic_fetch_sub(&g_live, bytes);
        return NULL;
    }
    memcpy(raw, &bytes, sizeof bytes);
    return raw + HEADER;
}

void *qkv_alloc_zeroed(size_t bytes) {
    void *p = qkv_alloc(bytes);
    if (p) memset(p, 0, bytes ? bytes : 1);
    return p;
}

void qkv_free(void *p) {
    if (!p) return;
    unsigned char *raw = (unsigned char *)p - HEADER;
    size_t bytes;
    memcpy(&bytes, raw, sizeof bytes);
    atomic_fetch_sub(&g_live, bytes);
    g_free(raw, g_user);
}

size_t qkv_alloc_take_refusal(void) {
    size_t r = t_refused;
    t_refused = 0;
    return r;
}

qkv_status qkv_alloc_failure_status(void) {
    return qkv_alloc_take_refusal() ? QKV_ERR_MEMORY_LIMIT : QKV_ERR_OUT_OF_MEMORY;
}

int qkv_count_ok(int64_t *out, size_t elem, int n, const int64_t *factors) {
    int64_t c = 1;
    for (int i = 0; i < n; i++)
        if (!qkv_mul_ok(c, factors[i], &c)) return 0;
    if (elem && (uint64_t)c > (uint64_t)(SIZE_MAX / elem)) return 0;
    *out = c;
    return 1;
}

int qkv_shape_count(int ndim, const int64_t *shape, size_t elem, int64_t *count) {
    int64_t nz = 1;
    int zero = 0;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] == 0)
            zero = 1;
        else if (!qkv_mul_ok(nz, shape[i], &nz))
            return 0;
    }
    if (elem && (uint64_t)nz > (uint64_t)(SIZE_MAX / elem)) return 0;
    *count = zero ? 0 : nz;
    return 1;
}

int qkv_reserve(void *pbuf, int64_t *cap, int64_t n, size_t elem) {
    if (*cap >= n) return 1;
    void *p = qkv_alloc((size_t)n * elem), *old;
    if (!p) return 0;
    memcpy(&old, pbuf, sizeof old);
    qkv_free(old);
    memcpy(pbuf, &p, sizeof p);
    *cap = n;
    return 1;
}

void qkv_free_each(void *const *p, size_t n) {
    for (size_t i = 0; i < n; i++) qkv_free(p[i]);
}
