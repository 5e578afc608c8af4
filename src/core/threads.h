/* Threads for the fast paths (internal): per-call worker threads with
 * dynamic scheduling of work units. Which thread runs a unit never changes what the
 * unit computes, so results are bitwise identical for any thread count. */
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
 * (T = nthreads, clamped to [1, min(units, QKV_MAX_THREADS)]); the calling
 * thread is t = 0. Units are started in increasing order, each by whichever
 * thread is free first (dynamic: balanced for units of unequal cost and for
 * threads slowed by other processes), so which t runs a unit is not fixed:
 * fn must use t only to pick per-thread scratch, never to decide what the
 * unit computes; then results are bitwise identical for any thread count.
 * If a worker cannot be started, the others (at least the caller) run all
 * units. Returns when all units are done. */
typedef void (*qkv_unit_fn)(void *ctx, int64_t unit, int thread);
void qkv_parallel_for(int nthreads, int64_t units, qkv_unit_fn fn, void *ctx);

#endif
