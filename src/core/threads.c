/* Per-call worker threads. A pool would save the ~20 us of thread creation
 * per call, which only matters for tiny problems; per-call threads cannot
 * oversubscribe a caller that runs several calls concurrently with a small
 * desc.threads each. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "core/threads.h"

/* Threads currently running units of any qkv call in this process. */
static atomic_int g_busy;

int qkv_threads_resolve(int requested) {
    if (requested > 0) return requested;
    const char *env = getenv("QKV_NUM_THREADS");
    if (env && *env) {
        char *end = NULL;
        long v = strtol(env, &end, 10);
        if (end && *end == '\0' && v > 0 && v <= 4096) return (int)v;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    if (n > 4096) n = 4096;
    /* The default never oversubscribes a caller that runs several qkv calls
     * at once: take only the cores the calls in flight leave (at least one).
     * Safe for determinism: results do not depend on the thread count. */
    long free_cores = n - atomic_load(&g_busy);
    return (int)(free_cores < 1 ? 1 : free_cores);
}

typedef struct worker {
    pthread_t tid;
    int started;
    int t, nthreads;
    int64_t units;
    qkv_unit_fn fn;
    void *ctx;
} worker;

static void run_share(const worker *w) {
    for (int64_t u = w->t; u < w->units; u += w->nthreads) w->fn(w->ctx, u, w->t);
}

static void *worker_main(void *arg) {
    run_share((const worker *)arg);
    return NULL;
}

void qkv_parallel_for(int nthreads, int64_t units, qkv_unit_fn fn, void *ctx) {
    if (units <= 0) return;
    if (nthreads < 1) nthreads = 1;
    if ((int64_t)nthreads > units) nthreads = (int)units;
    if (nthreads > QKV_MAX_THREADS) nthreads = QKV_MAX_THREADS;
    worker w[QKV_MAX_THREADS];
    for (int t = 0; t < nthreads; t++) {
        w[t].t = t;
        w[t].nthreads = nthreads;
        w[t].units = units;
        w[t].fn = fn;
        w[t].ctx = ctx;
        w[t].started = 0;
    }
    atomic_fetch_add(&g_busy, nthreads);
    for (int t = 1; t < nthreads; t++)
        w[t].started = pthread_create(&w[t].tid, NULL, worker_main, &w[t]) == 0;
    run_share(&w[0]);
    for (int t = 1; t < nthreads; t++) {
        if (w[t].started)
            pthread_join(w[t].tid, NULL);
        else
            run_share(&w[t]);
    }
    atomic_fetch_sub(&g_busy, nthreads);
}
