/* Heads owned by threads (internal), for the fast forward at small n.
 *
 * The usual schedule packs K and V of every head in one parallel pass, then
 * lets threads take query blocks of any head. When one head's packed K and V
 * fit in a core's L2 with room to spare, that costs a round trip to memory:
 * the pass writes all heads (2 MB at 8 heads, n = 512) before the first
 * block reads one back. Here a thread claims a whole head instead, packs it
 * into its own slot (reused head after head, so the slot's lines are already
 * in its L2 and ordinary stores neither read memory nor leave it) and runs
 * the head's units. Once every head is claimed, a thread that runs out of
 * work helps with the units left in heads still in progress, reading the
 * owner's slot: no thread idles while another has a head to finish.
 *
 * A slot is repacked only after its owner claims another head, and helping
 * starts only once no head is left to claim, so a helper never reads a slot
 * being repacked. A unit computes the same whoever runs it, so the results
 * do not depend on the thread count (core/threads.h). */
#ifndef QKV_ATTN_HEAD_SCHED_H
#define QKV_ATTN_HEAD_SCHED_H

#include <stddef.h>
#include <stdint.h>

/* Pack head `head` into `slot` (slot_stride bytes, 64-byte aligned). */
typedef void (*fa_head_pack_fn)(void *ctx, int64_t head, void *slot);
/* Run unit j (0 <= j < units_per_head, in increasing order of claim) of
 * `head`, whose packed data is `slot`; t picks the per-thread scratch. */
typedef void (*fa_head_unit_fn)(void *ctx, int64_t head, int64_t j, const void *slot, int t);

/* Bytes of scheduler state for `heads` heads (64-byte multiple). */
size_t fa_heads_state_bytes(int64_t heads);

/* Runs every unit of every head on up to `threads` threads. state: 64-byte
 * aligned, fa_heads_state_bytes(heads); slots: threads * slot_stride bytes
 * (slot_stride a multiple of 64). Returns when all units are done. */
void fa_heads_run(int threads, int64_t heads, int64_t units_per_head, void *state, unsigned char *slots,
                  size_t slot_stride, fa_head_pack_fn pack, fa_head_unit_fn unit, void *ctx);

#endif
