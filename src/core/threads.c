/* Per-call worker threads. A pool would save the ~20 us of thread creation
 * per call, which only matters for tiny problems; per-call threads cannot
 * oversubscribe a caller that runs several calls concurrently with a small
 * desc.threads each. Units are scheduled dynamically (see job). */
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

/* Units are handed out in increasing order from one shared counter, to
 * whichever thread asks first: work units of unequal cost (causal query
 * blocks) and threads slowed by other processes on a shared machine still
 * finish together. Which thread runs a unit never changes what the unit
 * computes (the unit functions own their output and use the thread index
 * only to pick scratch memory), so results stay bitwise identical. */
typedef struct job {
    atomic_llong next;
    int64_t units;
    qkv_unit_fn fn;
    void *ctx;
} job;

typedef struct worker {
    pthread_t tid;
    int started;
    int t;
    job *j;
} worker;

static void run_share(const worker *w) {
    job *j = w->j;
    for (;;) {
        int64_t u = (int64_t)atomic_fetch_add(&j->next, 1);
        if (u >= j->units) break;
        j->fn(j->ctx, u, w->t);
    }
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
    job j;
    atomic_init(&j.next, 0);
    j.units = units;
    j.fn = fn;
    j.ctx = ctx;
    for (int t = 0; t < nthreads; t++) {
        w[t].t = t;
        w[t].j = &j;
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
