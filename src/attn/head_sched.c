/* Heads owned by threads: see head_sched.h. */
#define _POSIX_C_SOURCE 200809L /* sched_yield */
#include "attn/head_sched.h"

#include <sched.h>
#include <stdatomic.h>

#include "core/threads.h"

/* One head's state, a line of its own (owner and helpers poll it). */
typedef struct head_state {
    atomic_llong next;          /* units of this head claimed so far */
    _Atomic(const void *) slot; /* its packed data, set (release) once packed */
    unsigned char pad[64 - sizeof(atomic_llong) - sizeof(void *)];
} head_state;

typedef struct heads_job {
    int64_t heads, per_head;
    atomic_llong next_head;
    head_state *st;
    unsigned char *slots;
    size_t slot_stride;
    fa_head_pack_fn pack;
    fa_head_unit_fn unit;
    void *ctx;
} heads_job;

size_t fa_heads_state_bytes(int64_t heads) { return (size_t)heads * sizeof(head_state); }

static void run_head_units(heads_job *j, int64_t h, const void *slot, int t) {
    for (;;) {
        int64_t u = (int64_t)atomic_fetch_add(&j->st[h].next, 1);
        if (u >= j->per_head) return;
        j->unit(j->ctx, h, u, slot, t);
    }
}

static void heads_worker(void *vj, int64_t w, int t) {
    (void)w;
    heads_job *j = vj;
    void *slot = j->slots + (size_t)t * j->slot_stride;
    for (;;) {
        int64_t h = (int64_t)atomic_fetch_add(&j->next_head, 1);
        if (h >= j->heads) break;
        j->pack(j->ctx, h, slot);
        atomic_store_explicit(&j->st[h].slot, slot, memory_order_release);
        run_head_units(j, h, slot, t);
    }
    /* Every head is claimed: help with the units left. A head whose owner
     * is still packing it is waited for (its owner is running: a head is
     * claimed only by a running worker, which packs it at once): polled
     * for a few microseconds, then yielding the core, which the owner may
     * need on a machine with more threads than cores. */
    for (int64_t h = 0; h < j->heads; h++) {
        if (atomic_load_explicit(&j->st[h].next, memory_order_relaxed) >= j->per_head) continue;
        const void *s;
        for (unsigned i = 0; !(s = atomic_load_explicit(&j->st[h].slot, memory_order_acquire)); i++)
            if (i >= 4096) sched_yield();
        run_head_units(j, h, s, t);
    }
}

void fa_heads_run(int threads, int64_t heads, int64_t units_per_head, void *state, unsigned char *slots,
                  size_t slot_stride, fa_head_pack_fn pack, fa_head_unit_fn unit, void *ctx) {
    heads_job j = {.heads = heads, .per_head = units_per_head, .st = state, .slots = slots,
                   .slot_stride = slot_stride, .pack = pack, .unit = unit, .ctx = ctx};
    atomic_init(&j.next_head, 0);
    for (int64_t h = 0; h < heads; h++) {
        atomic_init(&j.st[h].next, 0);
        atomic_init(&j.st[h].slot, NULL);
    }
    if (threads > heads) threads = (int)heads;
    qkv_parallel_for(threads, threads, heads_worker, &j);
}
