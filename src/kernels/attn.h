/* The attention tile kernels' contract (internal).
 *
 * The fast attention framework (src/attn/fast_*.c) owns loops, tiling,
 * masking, online-softmax bookkeeping and threading; these kernels own the
 * registers. The generic table (kernels/generic/attn.c) fills every slot;
 * an ISA's init (kernels/<isa>/attn.c) overrides the slots it has, and the
 * dispatcher (kernels/kernels.h) picks the table of the active ISA. */
#ifndef QKV_KERNELS_ATTN_H
#define QKV_KERNELS_ATTN_H

#include <stddef.h>
#include <stdint.h>

#include "core/rng.h"

/* Keys per packed K panel. A packed K holds, for panel p (keys 32p..32p+31)
 * and dimension d, the 32 keys' values contiguous:
 *     kp[(p * D + d) * QKV_PANEL + c] = K[32p + c][d]   (0 past the last key). */
#define QKV_PANEL 32
/* The columns a qk call writes for ncols asked: ncols rounded up to 16. */
#define QKV_QK_COLS(ncols) (((ncols) + 15) / 16 * 16)

/* Upper bound of the backward's weight exponent (see bwd_softmax). */
#define QKV_BWD_EXP_MAX 0.015625f

/* For a kernel's register-tile helpers, compiled once per constant argument. */
#if defined(__GNUC__)
#define QKV_INLINE static inline __attribute__((always_inline))
#else
#define QKV_INLINE static inline
#endif

/* The micro-kernel contract. All pointers are float; "ld" are row strides in
 * elements. Kernels never allocate and never read outside the ranges given
 * (tails use masked or scalar accesses). */
typedef struct qkv_kernels {
    const char *name;
    /* s[r*lds + c] = sum_{d<D} q[r*ldq + d] * kp[(p*D + d)*32 + c%32], p = c/32,
     * for r < rows (a multiple of 8) and c < QKV_QK_COLS(ncols); writes no
     * other element of s. Reads the panels' columns up to that bound only.
     * (Columns in steps of 16, not whole panels: a causal diagonal's groups
     * of 8 rows need keys up to a multiple of 8, and a whole last panel
     * computed on average 8 more columns per row than steps of 16.) */
    void (*qk)(const float *q, size_t ldq, const float *kp, size_t D, size_t rows,
               size_t ncols, float *s, size_t lds);
    /* o[r*ldo + c] = a_r * o[r*ldo + c] + sum_{j<nk} p[r*ldp + j*pcs] * v[j*ldv + c]
     * for r < rows (any count: the fast paths pass 1..8, or a whole tile of
     * rows when every row sees the same keys), c < dv; a_r = alpha[r], or 1
     * when alpha is NULL.
     * pcs = 1 reads p row by row; pcs = its row stride with ldp = 1 reads the
     * transpose (the backward's dQ from a key-major tile). Reads exactly
     * v[j*ldv + c] for j < nk, c < dv. */
    void (*pv)(float *o, size_t ldo, const float *alpha, const float *p, size_t ldp, size_t pcs,
               const float *v, size_t ldv, size_t nk, size_t dv, size_t rows);
    /* One online-softmax step over rows r < rows of s (cols entries each,
     * -inf = masked), whose logits in base 2 are c * s (c > 0):
     * mn = max(m[r], max_c s); alpha[r] = 2^(c (m[r] - mn));
     * s = 2^(c (s - mn)) in place (the difference first: exact near the max,
     * so the max itself gives exactly 1 and huge logits lose nothing);
     * l[r] = l[r]*alpha[r] + sum_c s; m[r] = mn. A row still all -inf keeps
     * m = -inf, alpha = 1, s = 0 (never exp(-inf - -inf)). */
    void (*softmax)(float *s, size_t lds, size_t rows, size_t cols, float c, float *m, float *l,
                    float *alpha);
    /* Backward softmax tile: for r < rows, c < cols, with mu, x, y = M[r],
     * L[r], Dd[r] (percol = 0) or M[c], L[c], Dd[c] (percol = 1), mu = 0 when
     * M is NULL: p = 2^min(fma(cm, s - mu, -x), QKV_BWD_EXP_MAX) (0 for
     * s = -inf or x = +inf; NaN stays NaN), ds = (p == 0 ? 0 : p * (dp - y));
     * s <- p, dp <- ds. With mu = the forward's row max and x = log2 of its
     * row sum, p is the forward's weight computed the forward's way (the
     * difference s - mu first), exact at any magnitude of the logits. A
     * weight never exceeds 1; the clamp keeps p <= 2^(1/64) whatever the
     * rounding in x, so p never overflows (no inf * 0). Why not exactly 1:
     * normal inputs give exponents up to ~3e-6 above 0 (float rounding of
     * the lse); clamping them would change results at that level for no
     * gain, and a chaotic training test (tests/test_model.c) is that
     * sensitive. Rows have stride ld in both s and dp. */
    void (*bwd_softmax)(float *s, float *dp, size_t ld, size_t rows, size_t cols, float cm,
                        const float *M, const float *L, const float *Dd, int percol);
    /* x[i] = 2^x[i] in place: exactly 0 for x < -126 (no subnormals), +inf on
     * overflow, NaN stays NaN. */
    void (*exp2)(float *x, size_t n);
    /* One packed panel from rows r < nrows (nrows <= 32) of a row-major
     * block, row stride ld: panel[d*32 + r] = src[r*ld + d] for d < D, and 0
     * for the rows nrows..31. Reads exactly src[r*ld + d], r < nrows, d < D;
     * writes exactly the panel's D*32 floats. (A transposition: by vector
     * blocks in registers, every store a whole 64-byte line; element by
     * element, each of 64 consecutive stores went to another line.) With
     * stream != 0 and panel 64-byte aligned, streaming stores (then
     * stream_fence before another thread reads the panel; generic: ignored). */
    void (*pack_panel)(float *panel, const float *src, size_t ld, size_t nrows, size_t D, int stream);
    /* o[i] = x[i] * mul for i < n: the whole 64-byte lines of o with
     * streaming (non-temporal) stores, the partial lines at either end with
     * ordinary ones (a neighbouring row may share them). A streaming store
     * does not read the line first; for an output that is not in cache
     * (the forward's O, rows of one head H*Dv floats apart) that read was
     * most of the store's cost. Call stream_fence() before another thread
     * may read o. Generic: ordinary stores. */
    void (*scale_stream)(float *o, const float *x, float mul, size_t n);
    /* Orders this thread's streaming stores before its later stores. */
    void (*stream_fence)(void);
    /* 1 if none of x[0..n) is inf or NaN (no exponent field all ones), else
     * 0. Integer tests on the bits: reads exactly x[i], i < n. (The forward
     * asks it of the value rows that a causal diagonal's group of 8 rows
     * sees in part, before multiplying them by exact zeros in one 8-row
     * product: as a portable loop, SSE2 at best, it was half of fwd_unit's
     * own time in a causal forward at n = 512.) */
    int (*all_finite)(const float *x, size_t n);
    /* Attention dropout on a tile (core/internal.h: the hash), for r < rows,
     * c < cols:
     *     z = splitmix64_mix(R[r] + C[c])   (64-bit, wrapping; core/rng.h)
     *     f = (z >> 11) >= thr ? scale : 0
     *     x[r*ld + c] *= f, and y[r*ld + c] = f when y is not NULL.
     * R and C carry the hash of the entry's position but for the last step
     * (rows = queries: R the rows' keys, C the keys' multiples of the
     * increment; a key-major tile the other way round). Integer hashing and
     * one float product per element: every ISA gives the generic bits.
     * thr < 2^53 (p < 1). Reads exactly R[r], C[c] and x, writes only x and y, in those ranges. */
    void (*dropout)(float *x, float *y, size_t ld, size_t rows, size_t cols, const uint64_t *R, const uint64_t *C,
                    uint64_t thr, float scale);
    /* Logits in natural units with an additive bias, for i < n:
     *     x[i] = (float)((double)x[i] * mul) + add[i]   (no add when add is NULL)
     * the product in double, rounded once to float, then one float sum:
     * every ISA gives the generic bits (-inf in add stays -inf, NaN stays
     * NaN). Reads exactly x[i] and add[i], i < n. (As a portable loop, SSE2
     * at best, it took as long as the tile products themselves for a call
     * with a bias.) */
    void (*scale_bias)(float *x, size_t n, double mul, const float *add);
} qkv_kernels;

/* One entry of the dropout kernel: the factor f for R[r] + C[c] = a (the
 * generic kernel, and the tails of the others). */
static inline float qkv_dropout_factor(uint64_t a, uint64_t thr, float scale) {
    return (splitmix64_mix(a) >> 11) >= thr ? scale : 0.0f;
}

/* The generic table; each ISA's init overrides the slots it implements. */
void qkv_attn_init_generic(qkv_kernels *k);
void qkv_attn_init_avx2(qkv_kernels *k);
void qkv_attn_init_avx512(qkv_kernels *k);

/* Defines qkv_attn_init_<isa>: every slot gets the kernel <slot>_<isa> of
 * the including file, one list of slots for every ISA. */
#define QKV_ATTN_DEFINE_INIT(isa)                                                                  \
    void qkv_attn_init_##isa(qkv_kernels *k) {                                                     \
        *k = (qkv_kernels){#isa, qk_##isa, pv_##isa, softmax_##isa, bwd_softmax_##isa, exp2_##isa, \
                           pack_panel_##isa, scale_stream_##isa, stream_fence_##isa, all_finite_##isa, \
                           dropout_##isa, scale_bias_##isa};                                       \
    }

#endif
