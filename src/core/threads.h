/* Threads for the fast paths (internal): a pool of worker threads, started
 * on demand and kept between calls, with dynamic scheduling of work units.
 * Which thread runs a unit never changes what the unit computes, so results
 * are bitwise identical for any thread count. Idle workers poll for ~100
 * us after a job, then sleep on a condition variable; they end and are
 * joined at exit (atexit). A program must not unload the shared library
 * (dlclose) while they exist, as with OpenMP runtimes. A forked child
 * starts with an empty pool. */
#ifndef QKV_CORE_THREADS_H
#define QKV_CORE_THREADS_H

#include <stdint.h>

/* Most threads one call uses (callers size per-thread workspace with it). */
#define QKV_MAX_THREADS 64

/* The thread count for a call: `requested` when > 0, else QKV_NUM_THREADS
 * when set to a positive integer, else the online cores not already busy with
 * other qkv calls of this process (so a multithreaded caller is never
 * oversubscribed by the default); at least 1. */
int qkv_threads_resolve(int requested);

/* Calls fn(ctx, unit, t) once for every unit in [0, units) on T threads
 * (T = nthreads, clamped to [1, min(units, QKV_MAX_THREADS)]): the calling
 * thread (t = 0) and T - 1 idle pool workers (t = 1 .. T - 1). Units are
 * started in increasing order, each by whichever thread is free first
 * (dynamic: balanced for units of unequal cost and for threads slowed by
 * other processes), so which t runs a unit is not fixed: fn must use t only
 * to pick per-thread scratch, never to decide what the unit computes; then
 * results are bitwise identical for any thread count. If no worker is idle
 * and none can be started, fewer threads (at least the caller) run all
 * units. fn may itself call qkv_parallel_for. Returns when all units are
 * done and no worker touches the call's data any more. Thread-safe. */
typedef void (*qkv_unit_fn)(void *ctx, int64_t unit, int thread);
void qkv_parallel_for(int nthreads, int64_t units, qkv_unit_fn fn, void *ctx);

#endif
