/* Loops over [0, total) split into chunks of whole items on the worker
 * pool (core/threads.c): each item is computed by exactly the code and in
 * exactly the order of the serial loop, so the result is bitwise the same
 * for any thread count. Small problems stay on the calling thread (starting
 * workers costs more than they save). Used by the linear layer and the
 * model's own loops (LayerNorm, GELU, the loss gradient, AdamW). */
#include "core/internal.h"
#include "core/threads.h"

enum { PAR_MIN_ELEMS = 1 << 15, PAR_CHUNKS_PER_THREAD = 4 };

typedef struct {
    qkv_range_fn fn;
    void *ctx;
    int64_t total, chunk;
} range_job;

static void range_unit(void *ctx, int64_t unit, int thread) {
    (void)thread;
    const range_job *j = ctx;
    int64_t b = unit * j->chunk, e = b + j->chunk < j->total ? b + j->chunk : j->total;
    j->fn(j->ctx, b, e);
}

void qkv_par_range(int threads, int64_t total, int64_t work_per_item, qkv_range_fn fn, void *ctx) {
    int t = qkv_threads_resolve(threads);
    if (t <= 1 || total < 2 || total * work_per_item < PAR_MIN_ELEMS) {
        fn(ctx, 0, total);
        return;
    }
    int64_t units = (int64_t)t * PAR_CHUNKS_PER_THREAD;
    if (units > total) units = total;
    range_job j = {fn, ctx, total, (total + units - 1) / units};
    qkv_parallel_for(t, (total + j.chunk - 1) / j.chunk, range_unit, &j);
}
