/* The fast attention framework (FlashAttention-2 on CPU), shared between the
 * forward and the backward: the per-call context, packing, the score
 * transform of one tile (soft-cap, bias, mask) and the masked PV product.
 * Loops, tiling and masking live here once; the registers are the kernels'
 * (kernels/attn.h).
 *
 * Units: a tile of scores holds either the raw dot products q.k ("raw
 * mode": no soft-cap, no bias, positive scale: the common case, nothing to do
 * per element) or the final natural logits (soft-cap and bias applied by
 * fa_scores_rows). Either way c->sc times a tile value is the logit in base 2,
 * and the softmax kernel applies exp2(sc * (s - m)) directly
 * (FlashAttention-2's exp2 trick; the difference is taken first, exact near
 * the max, so huge logits lose no accuracy where the weights are). */
#ifndef QKV_ATTN_FAST_COMMON_H
#define QKV_ATTN_FAST_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "core/internal.h"
#include "kernels/kernels.h"

#define FA_BQ 64   /* query rows per block */
#define FA_BK 128  /* keys per tile (4 panels) */
#define FA_LOG2E 1.4426950408889634
#define FA_LN2 0.6931471805599453
#define FA_COSINE_EPS 1e-12 /* as the reference and torch.nn.functional.normalize */

typedef struct fa_ctx {
    const qkv_plan *p;
    const qkv_kernels *K;
    int threads;
    int64_t B, nq, nk, H, Hkv, G, D, Dv;
    qkv_norm norm;
    int relu_div;
    double cap;            /* soft-cap c, 0 = off */
    double scale_nat;      /* ds/d(q.k) on the (normalised) vectors: scale, 1 or 1/T */
    int natural;           /* tiles hold natural logits (else raw q.k) */
    float sc;              /* tile value -> base-2 logit multiplier (> 0) */
    double s2nat;          /* tile value -> natural logit multiplier */
    const float *bias;     /* base of the bias for head 0, or NULL */
    int64_t bias_head_stride; /* n_q * n_k for PER_HEAD, 0 for SHARED */
    const float *q, *k, *v;   /* the inputs (normalised copies for cosine) */
    const float *q_in, *k_in; /* the caller's q, k */
    int64_t ldq, ldk, ldv, ldo; /* row strides: H*D, Hkv*D, Hkv*Dv, H*Dv */
    float *kt;             /* K packed in panels per (b, kv head) */
    int64_t kt_stride;     /* floats per (b, kv head) in kt */
    const float *vr;       /* V rows of every (b, kv head) contiguous ([n_k, Dv]): a copy
                              (vr_own) when H_kv > 1, else v itself; v itself (rows ldv
                              apart) when v_direct */
    int v_direct;          /* set before fa_kv_alloc: V read where it is, never copied (a
                              caller whose every key is read by one query block) */
    float *vr_own;         /* inside kt's block: never freed on its own */
    int stream_pack;       /* kt and vr_own written with streaming stores (fa_pack_kv) */
    const struct fa_posbias *pb; /* ALiBi / T5 biases (fast_posbias.h), or NULL */
} fa_ctx;

/* 64-byte aligned allocation through qkv_alloc; fa_free(NULL) is a no-op. */
void *fa_alloc(size_t bytes);
void fa_free(void *p);
static inline int64_t fa_round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* A row's visible range [lo, hi) as columns [*a, *e) of a tile of n columns
 * starting at at: clamped to the tile, [0, 0) when empty. */
static inline void fa_tile_range(int64_t lo, int64_t hi, int64_t at, int64_t n, int *a, int *e) {
    int64_t x = lo - at, y = hi - at;
    if (x < 0) x = 0;
    if (y > n) y = n;
    if (y < x) y = x = 0;
    *a = (int)x;
    *e = (int)y;
}

/* Fill the context's fields from a plan (no allocation). */
void fa_ctx_init(fa_ctx *c, const qkv_plan *p, const float *q, const float *k, const float *v);

/* COSINE: copies of q and k with every row divided by max(|row|, eps) (norms
 * in double); c->q, c->k then point to them. fa_normalise_into writes them
 * into mem (fa_normalised_bytes, 64-byte aligned); fa_normalise_inputs
 * allocates that (free *mem with fa_free) or returns QKV_ERR_OUT_OF_MEMORY. */
size_t fa_normalised_bytes(const fa_ctx *c);
void fa_normalise_into(fa_ctx *c, void *mem);
qkv_status fa_normalise_inputs(fa_ctx *c, void **mem);

/* fa_kv_alloc: the block for K packed per (b, kv head) (c->kt) and V rows
 * copied contiguous (c->vr), with extra_bytes more at *extra, 64-byte
 * aligned, for the caller's own buffers (per-thread tiles, cosine copies):
 * one allocation per call; free all with fa_free(c->kt). fa_pack_kv: fill
 * it, in parallel by
 * row blocks of every head (fa_pack_block). The copy of V matters: in the
 * [B, n, H, D] layout consecutive keys of one head are H*D floats apart, a
 * power-of-two stride that folds a tile of V onto a few L1 cache sets. (A
 * copy of Q likewise was measured slower than each unit copying its 64 rows:
 * paired causal/full 0.556-0.581 without it against 0.574-0.585 with.)
 * From FA_PACK_STREAM_MIN_BYTES of packed K and V on, the copies are
 * written with streaming stores: the block comes back at every call, but
 * the lines of the last call's copy have left the cache by then, and
 * ordinary stores read each line from memory before writing it. The
 * units then read the copies from memory in long sequential runs (a head's
 * panels, a head's rows), which the hardware prefetchers follow. Against
 * ordinary stores, alternating in one process, 2 threads, 8 heads of 64
 * (Zen 4, see docs/BENCHMARKS.md): causal -13% / full -8% at n = 512, -6% / -4% at
 * 1024, n = 256 faster too, n = 2048 even; below 1 MiB (n = 128) full
 * was slower. */
#define FA_PACK_STREAM_MIN_BYTES ((size_t)1 << 20)
qkv_status fa_kv_alloc(fa_ctx *c, size_t extra_bytes, void **extra);
void fa_pack_kv(fa_ctx *c);

/* Rows [r0, r1) of batch b of every head hh < nh of a [B, n, nh, D] array
 * (row stride ld): into panels of 32 rows at panels + (b nh + hh) pstride,
 * panel[(p D + d) 32 + r % 32] = row r's element d with p = r / 32
 * (K->pack_panel), and/or plain copies at rows + (b nh + hh) n D (either may
 * be NULL). r0 must start a panel; with r1 = n the last panel's padding rows
 * are zeroed. Blocks of rows in memory order, heads inside a block: head by
 * head, its rows lie ld floats apart (2 KB for 8 heads of 64), two per 4 KB
 * page, which the hardware prefetchers do not follow: from memory every row
 * was a full miss in turn (one head's K and V took 150-350 us where the copy
 * itself takes 30). stream != 0: streaming stores (panels and rows 64-byte
 * aligned), fenced before returning. */
#define FA_PACK_ROWS 64
void fa_pack_block(const qkv_kernels *K, float *panels, int64_t pstride, float *rows, const float *src,
                   int64_t ld, int64_t b, int64_t n, int64_t nh, int64_t D, int64_t r0, int64_t r1, int stream);

/* The visible range [lo, hi) of the queries i0 .. i0+n-1 of batch b;
 * returns 1 if any is non-empty and sets *blo, *bhi to the union's bounds. */
int fa_query_ranges(const fa_ctx *c, int64_t b, int64_t i0, int n, int64_t *lo, int64_t *hi,
                    int64_t *blo, int64_t *bhi);
/* The same for ranges already in lo, hi (n rows). */
int fa_range_bounds(const int64_t *lo, const int64_t *hi, int n, int64_t *blo, int64_t *bhi);

/* Turn a row-major tile of raw scores q.k (rows = queries i0+r, r < nr;
 * columns = keys kt+col, col < ncols) into tile units (see the top): in
 * natural mode scale, soft-cap and bias; the position biases (c->pb, in
 * either mode); always -inf outside each row's range. When dcap is given it receives
 * 1 - tanh^2 (the soft-cap's derivative) at stride ldd. a[r], e[r] receive the
 * row's visible columns [a, e) within the tile. */
void fa_scores_rows(const fa_ctx *c, float *s, size_t lds, int64_t h, int64_t i0, int nr,
                    int64_t kt, int ncols, const int64_t *lo, const int64_t *hi, int *a, int *e,
                    float *dcap, size_t ldd);

/* The transposed tile of the backward's key-block pass: rows = keys j0+r,
 * r < nkr; columns = queries i0+col, col < nqc, with the queries' ranges in
 * lo[col], hi[col]. Same transform as fa_scores_rows; a[r], e[r] receive the
 * key's visible queries [a, e) (contiguous: every mask's lo and hi are
 * nondecreasing in the query index). interior != 0 promises that every
 * (key, query) of the tile is visible (no masking work). */
void fa_scores_cols(const fa_ctx *c, float *s, size_t lds, int64_t h, int64_t i0, int nqc,
                    int64_t j0, int nkr, const int64_t *lo, const int64_t *hi, int interior,
                    int *a, int *e, float *dcap, size_t ldd);

/* o (8 rows) += p . v over a tile where row r may only use columns [a[r], e[r])
 * (rows >= nvalid are padding and follow the common range): the common range
 * goes through the 8-row kernel (with the rescale alpha), the rest row by row,
 * so a masked key's value is never multiplied, not even by 0. */
void fa_pv_ranges(const fa_ctx *c, float *o, size_t ldo, const float *alpha, const float *p,
                  size_t ldp, size_t pcs, const float *v, size_t ldv, size_t dv, const int *a, const int *e,
                  int nvalid);

/* The same product when p is exactly 0 outside each valid row's range (the
 * softmax's 2^-inf, the backward's zeroed weights): when the ranges differ
 * (a mask's edge), the value rows some but not all rows see are multiplied
 * by those zeros in one 8-row product, if they are all finite (0 * v = 0
 * changes nothing then; K->all_finite decides); otherwise fa_pv_ranges, so
 * that a masked NaN or inf never reaches a row. Row by row, the edge of a
 * causal diagonal took one 1-row product per row and range. */
void fa_pv_zeros(const fa_ctx *c, float *o, size_t ldo, const float *alpha, const float *p, size_t ldp,
                 size_t pcs, const float *v, size_t ldv, size_t dv, const int *a, const int *e, int nvalid);

/* COSINE backward: g <- J(x)^T g for x -> x / max(|x|, eps), in place, with
 * x the caller's row (float) and g the gradient w.r.t. the normalised row. */
void fa_normalise_backward(const float *x, float *g, int64_t D);

#endif
