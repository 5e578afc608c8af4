/* The bf16 kernels' contract (internal), for the bf16 fast forward and
 * backward (attn/half_fwd.c, attn/half_bwd.c). Data are bf16 pairs in 32-bit
 * words (low half = the even index), the layout of the VNNI-style dot
 * products (AVX512-BF16 vdpbf16ps, and AMX's TDPBF16PS):
 *   Q block   qp[r * ldq + t]                 = (Q[r][2t], Q[r][2t+1])
 *   K panels  kp[(p * dp2 + t) * 32 + c]      = (K[32p+c][2t], K[32p+c][2t+1])
 *   V pairs   vp[u * ldv + c]                 = (V[2u][c], V[2u+1][c])
 *   P pairs   pp[r * ldp + u]                 = (P[r][2u], P[r][2u+1])
 * with zeros past the last key, dimension or value column. A pair product
 * a . b is a.lo * b.lo + a.hi * b.hi; accumulation is float32. Kernels never
 * allocate.
 *
 * The generic table (kernels/generic/half.c) states the contract in plain C;
 * the AVX512-BF16 init (kernels/avx512bf16/half.c) overrides every slot and
 * sets `native`. The fast bf16 paths run only on a native table (elsewhere
 * the portable path through the float kernels is faster); the generic slots
 * serve the kernel tests. */
#ifndef QKV_KERNELS_HALF_H
#define QKV_KERNELS_HALF_H

#include <stddef.h>
#include <stdint.h>

typedef struct qkv_half_kernels {
    const char *name;
    int native; /* 1: bf16 dot-product instructions (the fast paths apply) */
    /* s[r*lds + c] = sum_{t<dp2} qp[r*ldq+t] . kp[((c/32)*dp2 + t)*32 + c%32]
     * for r < rows (a multiple of 8), c < 32 * npanels. */
    void (*qk)(const uint32_t *qp, size_t ldq, const uint32_t *kp, size_t dp2, size_t rows,
               size_t npanels, float *s, size_t lds);
    /* o[r*ldo + c] += sum_{u0<=u<u1} pp[r*ldp+u] . vp[u*ldv + c] for r < rows
     * (1..4), c < dvp (a multiple of 16). */
    void (*pv)(float *o, size_t ldo, const uint32_t *pp, size_t ldp, const uint32_t *vp, size_t ldv,
               size_t u0, size_t u1, size_t dvp, size_t rows);
    /* pp[r*ldp + u] = bf16 pairs of p[r*lds + 2u], p[r*lds + 2u+1] (nearest
     * even) for r < rows, u < npairs (reads 2*npairs floats per row). */
    void (*pack_p)(uint32_t *pp, size_t ldp, const float *p, size_t lds, size_t rows, size_t npairs);
    /* The forward's online-softmax step, P going out as bf16 pairs only. For
     * r < rows, over the cols logits of s's row r (s is only read): as the
     * float table's softmax, mt = max_c s, mn = max(m[r], mt), alpha =
     * 2^(c (m[r] - mn)) (1 when mn = -inf, where 0 stands for mn), e_c =
     * 2^((s_c - mn) c) (0 for -inf; exactly 0 below 2^-126; relative error
     * within kernels' EXP_REL of exp2), l[r] = alpha l[r] + sum_c e_c (of the
     * unrounded e_c), m[r] = mn; o's row r (dvp floats, stride ldo) scaled
     * by alpha; pp[r*ldp + u] = bf16 pairs (e_2u, e_2u+1), nearest even, for
     * u < ceil(cols / 2), the column past an odd cols 0. */
    void (*softmax_pack)(const float *s, size_t lds, size_t rows, size_t cols, float c, float *m, float *l,
                         float *o, size_t ldo, size_t dvp, uint32_t *pp, size_t ldp);

    /* The backward's own kernels. */

    /* As qk but s += the product (rows a multiple of 8). */
    void (*qk_acc)(const uint32_t *qp, size_t ldq, const uint32_t *kp, size_t dp2, size_t rows,
                   size_t npanels, float *s, size_t lds);
    /* o[r*ldo + c] += sum_{u<nu} pp[r*ldp + u] . vp[u*ldv + c] for r < rows
     * (any count), c < dvp (a multiple of 16). */
    void (*pv_acc)(float *o, size_t ldo, const uint32_t *pp, size_t ldp, const uint32_t *vp, size_t ldv,
                   size_t nu, size_t dvp, size_t rows);
    /* Softmax gradient of a key-major tile (rows = keys, columns = queries),
     * in float: for r < rows, c < cols, p = 2^min(cm s - L2[c], 0) (the
     * product and difference rounded once, as an fma; 0 for s = -inf or
     * L2[c] = +inf; exactly 0 below 2^-126; NaN stays NaN), ds = (p == 0 ?
     * 0 : p (dp - Dd[c])); s <- p, dp <- ds. Rows have stride ld in both. */
    void (*bwd_softmax)(float *s, float *dp, size_t ld, size_t rows, size_t cols, float cm,
                        const float *L2, const float *Dd);
    /* Pairs of rows of a float tile into panels of the K-panel layout:
     * kp[(p * npairs + u) * 32 + c] = (x[2u][32p + c], x[2u+1][32p + c])
     * rounded to bf16 (nearest even), for u < npairs, p < npanels (row
     * stride ldx; reads 32 * npanels floats of rows 0 .. 2 npairs - 1). */
    void (*pack_rowpairs)(uint32_t *kp, const float *x, size_t ldx, size_t npairs, size_t npanels);

    /* Packing of bf16 inputs (the forward's K and V, the backward's Q, dO,
     * K, V) and the backward's dQ output: pure data movement and one
     * rounding, bitwise the same on every ISA. */

    /* A transpose of 32-bit words: dst[c * ldd + r] = word r * lds + c of
     * src, for r < rows, c < cols (src read by memcpy: any alignment). */
    void (*words_t)(uint32_t *dst, size_t ldd, const void *src, size_t lds, size_t rows, size_t cols);
    /* Two bf16 rows into pairs: dst[i] = (a[i], b[i]) (b NULL: (a[i], 0)),
     * i < n. */
    void (*interleave)(uint32_t *dst, const uint16_t *a, const uint16_t *b, size_t n);
    /* dQ out of its transposed float partials: for r < rows, c < cols,
     * dst[c * ldd + r] = qkv_f32_to_bf16((float)(acc * scale)), acc = the
     * float sum over ch < chunks, in order, of src[ch * cstride + r * lds + c]
     * (the product in double). */
    void (*dq_out)(uint16_t *dst, size_t ldd, const float *src, size_t lds, size_t cstride, size_t chunks,
                   size_t rows, size_t cols, double scale);
} qkv_half_kernels;

/* The generic table; the AVX512-BF16 init overrides every slot. */
void qkv_half_init_generic(qkv_half_kernels *k);
void qkv_half_init_avx512bf16(qkv_half_kernels *k);

/* Defines qkv_half_init_<isa> (native: 1 where the ISA has bf16 dot
 * products): the other slots, in the struct's order, get <slot>_<isa>. */
#define QKV_HALF_DEFINE_INIT(isa, is_native)                                                       \
    void qkv_half_init_##isa(qkv_half_kernels *k) {                                                \
        *k = (qkv_half_kernels){#isa, is_native, qk_##isa, pv_##isa, pack_p_##isa, softmax_pack_##isa, qk_acc_##isa, pv_acc_##isa, \
                                bwd_softmax_##isa, pack_rowpairs_##isa, words_t_##isa, interleave_##isa,  \
                                dq_out_##isa};                                                     \
    }

#endif
