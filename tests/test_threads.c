/* The worker pool behind the fast paths (src/core/threads.c): every unit runs
 * exactly once for any thread and unit count; no thread index is used by two
 * units at the same time (per-thread scratch depends on it); calls made back
 * to back, from several threads at once and from inside a unit all complete;
 * a forked child, whose pool threads do not exist, still runs its calls. */
#define _POSIX_C_SOURCE 200809L /* fork, waitpid, alarm */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/threads.h"
#include "test_util.h"

#define MAX_UNITS 5000

typedef struct count_ctx {
    atomic_int runs[MAX_UNITS];
    atomic_int in_use[QKV_MAX_THREADS];
    atomic_int bad_t, overlap;
    int nthreads;
} count_ctx;

static void count_unit(void *vc, int64_t u, int t) {
    count_ctx *c = vc;
    if (t < 0 || t >= c->nthreads || t >= QKV_MAX_THREADS) {
        atomic_fetch_add(&c->bad_t, 1);
        return;
    }
    if (atomic_exchange(&c->in_use[t], 1)) atomic_fetch_add(&c->overlap, 1);
    atomic_fetch_add(&c->runs[u], 1);
    for (volatile int spin = 0; spin < (int)(u % 7) * 50; spin++) {
    }
    atomic_store(&c->in_use[t], 0);
}

/* Runs one loop and returns 1 when every unit ran once on a valid, unshared t. */
static int run_counted(count_ctx *c, int nthreads, int64_t units) {
    memset(c, 0, sizeof *c);
    c->nthreads = nthreads < 1 ? 1 : nthreads;
    qkv_parallel_for(nthreads, units, count_unit, c);
    int ok = atomic_load(&c->bad_t) == 0 && atomic_load(&c->overlap) == 0;
    for (int64_t u = 0; u < units; u++) ok &= atomic_load(&c->runs[u]) == 1;
    return ok;
}

static void test_counts(void) {
    static const int threads[] = {0, 1, 2, 3, 4, 8, 64, 100};
    static const int64_t units[] = {0, 1, 2, 3, 7, 64, 1000};
    count_ctx *c = malloc(sizeof *c);
    if (!c) {
        CHECK(0, "out of memory");
        return;
    }
    for (size_t a = 0; a < sizeof threads / sizeof threads[0]; a++)
        for (size_t b = 0; b < sizeof units / sizeof units[0]; b++)
            CHECK(run_counted(c, threads[a], units[b]), "threads %d, units %lld", threads[a], (long long)units[b]);
    int ok = 1;
    for (int i = 0; i < 2000 && ok; i++) ok = run_counted(c, 2 + i % 3, 1 + i % 9);
    CHECK(ok, "2000 small loops back to back");
    free(c);
}

/* Several caller threads, each running loops of 3 threads at once. */
static void *caller_main(void *arg) {
    int *ok = arg;
    count_ctx *c = malloc(sizeof *c);
    *ok = c != NULL;
    for (int i = 0; i < 300 && *ok; i++) *ok = run_counted(c, 3, 50 + i % 13);
    free(c);
    return NULL;
}

static void test_concurrent_callers(void) {
    pthread_t tid[4];
    int ok[4] = {0, 0, 0, 0}, started[4];
    for (int i = 0; i < 4; i++) started[i] = pthread_create(&tid[i], NULL, caller_main, &ok[i]) == 0;
    for (int i = 0; i < 4; i++) {
        if (started[i]) pthread_join(tid[i], NULL);
        CHECK(started[i] && ok[i], "caller thread %d", i);
    }
}

/* A unit that runs a loop of its own (as a layer calling the fast path from
 * inside a parallel region would). */
typedef struct nest_ctx {
    count_ctx inner[8];
    atomic_int bad;
} nest_ctx;

static void nest_unit(void *vc, int64_t u, int t) {
    (void)t;
    nest_ctx *n = vc;
    if (!run_counted(&n->inner[u], 2, 40)) atomic_fetch_add(&n->bad, 1);
}

static void test_nested(void) {
    nest_ctx *n = calloc(1, sizeof *n);
    if (!n) {
        CHECK(0, "out of memory");
        return;
    }
    qkv_parallel_for(3, 8, nest_unit, n);
    CHECK(atomic_load(&n->bad) == 0, "loops inside units");
    free(n);
}

/* ThreadSanitizer does not support threads started after a fork of a
 * multithreaded process: the fork case runs in the other builds. */
#if defined(__SANITIZE_THREAD__)
#define QKV_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define QKV_TSAN 1
#endif
#endif

#ifndef QKV_TSAN
/* fork() after the pool has workers: the child has none of them and must
 * neither hang nor lose units (an alarm ends a hung child). */
static void test_fork(void) {
    count_ctx *c = malloc(sizeof *c);
    if (!c) {
        CHECK(0, "out of memory");
        return;
    }
    CHECK(run_counted(c, 3, 100), "before fork");
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(30);
        int ok = run_counted(c, 3, 100) && run_counted(c, 2, 1000);
        free(c);
        exit(ok ? 0 : 1); /* exit, not _exit: the child's own workers end (atexit) */
    }
    CHECK(pid > 0, "fork");
    if (pid > 0) {
        int status = 0;
        while (waitpid(pid, &status, 0) < 0)
            if (errno != EINTR) break;
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child's loops (status %d)", status);
    }
    CHECK(run_counted(c, 3, 100), "parent after fork");
    free(c);
}
#endif

int main(void) {
    test_counts();
    test_concurrent_callers();
    test_nested();
#ifndef QKV_TSAN
    test_fork();
#endif
    return tu_finish();
}
