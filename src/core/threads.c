/* Worker threads kept between calls (a pool grown on demand). Creating and
 * joining threads at every call cost ~40 us per parallel loop here (two per
 * fast forward: 1% of a causal forward at n = 1024, 3% at n = 512); a
 * parked worker takes a new job in a few microseconds. A call uses at most
 * nthreads - 1 idle workers besides its own thread; calls running at the
 * same time take different workers (the pool grows for them), so no call
 * waits for another's work and the threads running units never exceed what
 * the calls asked for. Units are scheduled dynamically (see job). */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
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
    atomic_int running; /* workers given this job that have not finished it */
} job;

typedef struct worker {
    pthread_t tid;
    pthread_cond_t wake;      /* signalled when a job arrives while it sleeps */
    _Atomic(job *) assigned; /* the job it runs, NULL when idle */
    int t;                    /* its thread index in that job */
    int sleeping;             /* under g_mu */
    struct worker *next_idle; /* under g_mu */
} worker;

/* Most workers the pool keeps: enough for QKV_MAX_THREADS-thread calls, two at once. */
#define POOL_MAX (2 * QKV_MAX_THREADS)
/* How long a wait polls an atomic before it sleeps on a condition variable:
 * a worker between the two loops of one call, or between calls made back to
 * back, picks the next job up without a wake-up through the kernel. 100 us:
 * a fixed 20000 polls lasted only 10-18 us here, less than the time a worker
 * that finished its last unit first waits for the caller to finish its own
 * and start the next call (up to one unit, ~50 us at n = 512); it then slept,
 * and waking it cost 15-35 us at the start of the next call. */
#define POLL_NS 100000

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Whether a polling loop may go on at its iteration i; *t0 (0 at first)
 * holds the time it started. Reads the clock every 256 polls only. */
static int keep_polling(unsigned i, int64_t *t0) {
    if (i & 255u) return 1;
    int64_t t = now_ns();
    if (*t0 == 0) *t0 = t;
    return t - *t0 < POLL_NS;
}

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_done = PTHREAD_COND_INITIALIZER; /* some job's last worker finished */
static worker g_pool[POOL_MAX];
static int g_pool_n;      /* workers started (under g_mu) */
static worker *g_idle;    /* idle workers, a stack (under g_mu) */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static atomic_int g_shutdown; /* set at exit: idle workers end */

static void run_share(job *j, int t) {
    for (;;) {
        int64_t u = (int64_t)atomic_fetch_add(&j->next, 1);
        if (u >= j->units) break;
        j->fn(j->ctx, u, t);
    }
}

static void *worker_main(void *arg) {
    worker *w = arg;
    for (;;) {
        job *j = NULL;
        int64_t t0 = 0;
        for (unsigned i = 0; !j && keep_polling(i, &t0); i++)
            j = atomic_load_explicit(&w->assigned, memory_order_acquire);
        if (!j) {
            pthread_mutex_lock(&g_mu);
            while (!(j = atomic_load(&w->assigned)) && !atomic_load(&g_shutdown)) {
                w->sleeping = 1;
                pthread_cond_wait(&w->wake, &g_mu);
            }
            w->sleeping = 0;
            pthread_mutex_unlock(&g_mu);
            if (!j) return NULL; /* shut down while idle */
        }
        run_share(j, w->t);
        /* Idle again before the job is released: its caller may return
         * (and the job, on its stack, vanish) once running reaches 0. */
        pthread_mutex_lock(&g_mu);
        atomic_store(&w->assigned, NULL);
        w->next_idle = g_idle;
        g_idle = w;
        if (atomic_fetch_sub(&j->running, 1) == 1) pthread_cond_broadcast(&g_done);
        pthread_mutex_unlock(&g_mu);
    }
    return NULL;
}

/* A forked child has none of the parent's threads: start from an empty pool
 * (its first call starts new workers). The parent holds g_mu across fork(),
 * so the child's copy of the pool is consistent. */
static void fork_prepare(void) { pthread_mutex_lock(&g_mu); }
static void fork_parent(void) { pthread_mutex_unlock(&g_mu); }
static void fork_child(void) {
    pthread_mutex_init(&g_mu, NULL);
    pthread_cond_init(&g_done, NULL);
    g_pool_n = 0;
    g_idle = NULL;
    atomic_store(&g_busy, 0);
}
/* At exit the workers end and are joined, so that nothing of theirs is left
 * behind (valgrind counted each live worker's thread-local block as
 * possibly lost). A worker still running a job finishes it first. */
static void pool_shutdown(void) {
    pthread_mutex_lock(&g_mu);
    atomic_store(&g_shutdown, 1);
    int n = g_pool_n;
    for (int i = 0; i < n; i++) pthread_cond_signal(&g_pool[i].wake);
    pthread_mutex_unlock(&g_mu);
    for (int i = 0; i < n; i++) pthread_join(g_pool[i].tid, NULL);
}

static void pool_init(void) {
    pthread_atfork(fork_prepare, fork_parent, fork_child);
    atexit(pool_shutdown);
}

/* An idle worker, or a new one; NULL when the pool is full or a thread
 * cannot be started. Under g_mu. */
static worker *take_worker(void) {
    worker *w = g_idle;
    if (w) {
        g_idle = w->next_idle;
        return w;
    }
    if (g_pool_n >= POOL_MAX) return NULL;
    w = &g_pool[g_pool_n];
    if (pthread_cond_init(&w->wake, NULL) != 0) return NULL;
    atomic_init(&w->assigned, NULL);
    w->sleeping = 0;
    if (pthread_create(&w->tid, NULL, worker_main, w) != 0) {
        pthread_cond_destroy(&w->wake);
        return NULL;
    }
    g_pool_n++;
    return w;
}

void qkv_parallel_for(int nthreads, int64_t units, qkv_unit_fn fn, void *ctx) {
    if (units <= 0) return;
    if (nthreads < 1) nthreads = 1;
    if ((int64_t)nthreads > units) nthreads = (int)units;
    if (nthreads > QKV_MAX_THREADS) nthreads = QKV_MAX_THREADS;
    job j;
    atomic_init(&j.next, 0);
    atomic_init(&j.running, 0);
    j.units = units;
    j.fn = fn;
    j.ctx = ctx;
    atomic_fetch_add(&g_busy, nthreads);
    if (nthreads > 1) {
        pthread_once(&g_once, pool_init);
        pthread_mutex_lock(&g_mu);
        for (int t = 1; t < nthreads && !atomic_load(&g_shutdown); t++) {
            worker *w = take_worker();
            if (!w) break; /* fewer threads: the units are shared all the same */
            w->t = t;
            atomic_fetch_add(&j.running, 1);
            atomic_store_explicit(&w->assigned, &j, memory_order_release);
            if (w->sleeping) pthread_cond_signal(&w->wake);
        }
        pthread_mutex_unlock(&g_mu);
    }
    run_share(&j, 0);
    int64_t t0 = 0;
    for (unsigned i = 0; atomic_load(&j.running) > 0 && keep_polling(i, &t0); i++) {
    }
    if (atomic_load(&j.running) > 0) {
        pthread_mutex_lock(&g_mu);
        while (atomic_load(&j.running) > 0) pthread_cond_wait(&g_done, &g_mu);
        pthread_mutex_unlock(&g_mu);
    }
    atomic_fetch_sub(&g_busy, nthreads);
}
