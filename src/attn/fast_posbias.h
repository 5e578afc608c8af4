/* The in-kernel position biases of the fast paths: ALiBi (-slope_h |r|) and
 * T5's 1-D relative buckets (rel_table[h, bucket(r)]), r = j - p the offset
 * between key j and the query's aligned position p (per sequence when
 * packed, qkv_plan_query_position).
 *
 * The bias depends on (head, offset) only, and the visible pairs of a call
 * have offsets in [1 - n_k, n_q - 1] (packed sequences too: each is at most
 * as long as the whole; the table spans [-max p, n_k - 1 - min p], which is
 * that range). So once per call, before any tile, the bias of every head
 * and offset is computed (the bucket of each offset once, shared by the
 * heads) into a table of H (n_q + n_k - 1) floats in tile units (the
 * natural bias divided by the tile's scale, see fast_common.h: adding it to
 * a raw q.k tile keeps the raw mode and its exp2 trick). A tile then adds,
 * per query row, a contiguous slice of its head's table: no bucket math and
 * no per-logit index arithmetic. The backward's transposed tiles read the
 * slice backwards (the offset falls as the query rises), or through the
 * queries' positions when packed sequences shift them differently.
 *
 * The gradient of rel_table: dS summed per (chunk, batch, head, offset) by
 * the one unit that owns that slot (fast_bwd.c's chunks), in the unit's
 * fixed order; then summed per bucket in a fixed order (batch, chunk,
 * offset) in double. Bitwise the same for any thread count. */
#ifndef QKV_ATTN_FAST_POSBIAS_H
#define QKV_ATTN_FAST_POSBIAS_H

#include "attn/fast_common.h"

typedef struct fa_posbias {
    float *tab;         /* [H, n_off]: bias of offset omin + x at tab[h n_off + x], tile units */
    int64_t n_off, omin;
    int64_t *pos;       /* [n_q] aligned position of every query */
    int linear;         /* pos[i] = i + shift for every query (not packed, or packed alike) */
    int64_t shift;
    int32_t *bucket;    /* [n_off] T5 bucket of every offset; NULL without rel_table */
} fa_posbias;

/* Whether the fast paths compute the plan's position biases: none, or
 * ALiBi and / or T5's 1-D buckets (not the 2-D image offsets) with finite
 * parameters (a -inf would mask keys inside a row's range, which the
 * reference handles). */
int fa_posbias_supported(const qkv_plan *p);

/* c->pb: the table of the plan's biases (after fa_ctx_init), or NULL when
 * it has none. QKV_ERR_OUT_OF_MEMORY. fa_posbias_free(c) frees it. */
qkv_status fa_posbias_init(fa_ctx *c);
void fa_posbias_free(fa_ctx *c);

/* Rows of a tile (row r: query i0 + r, columns: keys kt + col): add the
 * bias to columns [a[r], e[r]) of rows r < nr, or to [0, ncols) of every
 * row when a is NULL. */
void fa_posbias_rows(const fa_ctx *c, float *s, size_t lds, int64_t h, int64_t i0, int nr, int64_t kt,
                     int ncols, const int *a, const int *e);

/* One row of a transposed tile: key j, columns queries i0 + [x, y). */
void fa_posbias_col(const fa_ctx *c, float *row, int64_t h, int64_t j, int64_t i0, int x, int y);

/* Backward. The partial sums [chunks, B, H, n_off], zeroed; NULL when out
 * of memory. Free with fa_free. */
float *fa_posbias_grad_alloc(const fa_ctx *c, int64_t chunks);

/* dS of a transposed tile (row r: key j0 + r, r < nkr, columns: queries
 * i0 + [a[r], e[r]), stride ld) added by offset into the slot of chunk ch,
 * batch b, head h. */
void fa_posbias_grad_tile(const fa_ctx *c, float *part, int64_t ch, int64_t b, int64_t h, const float *ds,
                          size_t ld, int64_t i0, int64_t j0, int nkr, const int *a, const int *e);

/* d_rel_table [H, rel_buckets] from the partial sums (overwritten). */
void fa_posbias_grad_reduce(const fa_ctx *c, const float *part, int64_t chunks, float *drel);

#endif
