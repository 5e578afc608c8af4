/* AVX512-BF16 kernels of the bf16 forward and backward (contract:
 * kernels/half.h).
 * vdpbf16ps multiplies 16 pairs of bf16 and adds both products into 16
 * float lanes: one instruction is a 16 x 2 slice of a matrix product, so the
 * reduction dimension is consumed two at a time (the VNNI pair layout). */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels/avx512_common.h"
#include "kernels/half.h"

static inline __m512bh as_bh(__m512i x) { return (__m512bh)x; }

static inline __m512bh bcast_pair(const uint32_t *x) {
    uint32_t w;
    memcpy(&w, x, sizeof w);
    return as_bh(_mm512_set1_epi32((int)w));
}

/* 8 rows x 32 keys: 16 accumulators, the K pairs loaded once per t for all
 * eight rows. */
static void qk_avx512bf16(const uint32_t *qp, size_t ldq, const uint32_t *kp, size_t dp2,
                          size_t rows, size_t npanels, float *s, size_t lds) {
    for (size_t p = 0; p < npanels; p++) {
        const uint32_t *kpp = kp + p * dp2 * 32;
        for (size_t r0 = 0; r0 < rows; r0 += 8) {
            const uint32_t *q = qp + r0 * ldq;
            __m512 c00 = _mm512_setzero_ps(), c01 = _mm512_setzero_ps(), c10 = _mm512_setzero_ps(),
                   c11 = _mm512_setzero_ps(), c20 = _mm512_setzero_ps(), c21 = _mm512_setzero_ps(),
                   c30 = _mm512_setzero_ps(), c31 = _mm512_setzero_ps(), c40 = _mm512_setzero_ps(),
                   c41 = _mm512_setzero_ps(), c50 = _mm512_setzero_ps(), c51 = _mm512_setzero_ps(),
                   c60 = _mm512_setzero_ps(), c61 = _mm512_setzero_ps(), c70 = _mm512_setzero_ps(),
                   c71 = _mm512_setzero_ps();
            for (size_t t = 0; t < dp2; t++) {
                __m512bh k0 = as_bh(_mm512_loadu_si512((const void *)(kpp + t * 32)));
                __m512bh k1 = as_bh(_mm512_loadu_si512((const void *)(kpp + t * 32 + 16)));
                __m512bh a;
                a = bcast_pair(q + t);
                c00 = _mm512_dpbf16_ps(c00, a, k0); c01 = _mm512_dpbf16_ps(c01, a, k1);
                a = bcast_pair(q + ldq + t);
                c10 = _mm512_dpbf16_ps(c10, a, k0); c11 = _mm512_dpbf16_ps(c11, a, k1);
                a = bcast_pair(q + 2 * ldq + t);
                c20 = _mm512_dpbf16_ps(c20, a, k0); c21 = _mm512_dpbf16_ps(c21, a, k1);
                a = bcast_pair(q + 3 * ldq + t);
                c30 = _mm512_dpbf16_ps(c30, a, k0); c31 = _mm512_dpbf16_ps(c31, a, k1);
                a = bcast_pair(q + 4 * ldq + t);
                c40 = _mm512_dpbf16_ps(c40, a, k0); c41 = _mm512_dpbf16_ps(c41, a, k1);
                a = bcast_pair(q + 5 * ldq + t);
                c50 = _mm512_dpbf16_ps(c50, a, k0); c51 = _mm512_dpbf16_ps(c51, a, k1);
                a = bcast_pair(q + 6 * ldq + t);
                c60 = _mm512_dpbf16_ps(c60, a, k0); c61 = _mm512_dpbf16_ps(c61, a, k1);
                a = bcast_pair(q + 7 * ldq + t);
                c70 = _mm512_dpbf16_ps(c70, a, k0); c71 = _mm512_dpbf16_ps(c71, a, k1);
            }
            float *d = s + r0 * lds + p * 32;
            _mm512_storeu_ps(d, c00); _mm512_storeu_ps(d + 16, c01); d += lds;
            _mm512_storeu_ps(d, c10); _mm512_storeu_ps(d + 16, c11); d += lds;
            _mm512_storeu_ps(d, c20); _mm512_storeu_ps(d + 16, c21); d += lds;
            _mm512_storeu_ps(d, c30); _mm512_storeu_ps(d + 16, c31); d += lds;
            _mm512_storeu_ps(d, c40); _mm512_storeu_ps(d + 16, c41); d += lds;
            _mm512_storeu_ps(d, c50); _mm512_storeu_ps(d + 16, c51); d += lds;
            _mm512_storeu_ps(d, c60); _mm512_storeu_ps(d + 16, c61); d += lds;
            _mm512_storeu_ps(d, c70); _mm512_storeu_ps(d + 16, c71);
        }
    }
}

/* One tile of o += P V: R rows x NV vectors of 16 columns, the pairs u0 <=
 * u < u1 in order onto the loaded o (so an element's sum does not depend
 * on the tile it falls in); R and NV are constants at every call, so the
 * R x NV accumulators stay in registers (R x NV <= 16). */
static inline __attribute__((always_inline)) void pv_tile(const int R, const int NV, float *o, size_t ldo,
                                                          const uint32_t *pp, size_t ldp, const uint32_t *vp,
                                                          size_t ldv, size_t u0, size_t u1) {
    __m512 acc[8][4];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int j = 0; j < NV; j++) acc[r][j] = _mm512_loadu_ps(o + (size_t)r * ldo + 16 * j);
    for (size_t u = u0; u < u1; u++) {
        __m512bh v[4];
#pragma GCC unroll 4
        for (int j = 0; j < NV; j++) v[j] = as_bh(_mm512_loadu_si512((const void *)(vp + u * ldv + 16 * j)));
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            const __m512bh a = bcast_pair(pp + (size_t)r * ldp + u);
#pragma GCC unroll 4
            for (int j = 0; j < NV; j++) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], a, v[j]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int j = 0; j < NV; j++) _mm512_storeu_ps(o + (size_t)r * ldo + 16 * j, acc[r][j]);
}

/* Rows r0 .. rows - 1 of one column block of NV vectors, R rows at a time
 * while R fit, then 4, 2 and 1: every chain of products has at least as
 * many independent neighbours as the row count allows. */
static inline __attribute__((always_inline)) void pv_cols(const int NV, const int R, float *o, size_t ldo,
                                                          const uint32_t *pp, size_t ldp, const uint32_t *vp,
                                                          size_t ldv, size_t u0, size_t u1, size_t rows) {
    size_t r = 0;
    for (; r + (size_t)R <= rows; r += (size_t)R) pv_tile(R, NV, o + r * ldo, ldo, pp + r * ldp, ldp, vp, ldv, u0, u1);
    if (R > 4 && r + 4 <= rows) {
        pv_tile(4, NV, o + r * ldo, ldo, pp + r * ldp, ldp, vp, ldv, u0, u1);
        r += 4;
    }
    if (r + 2 <= rows) {
        pv_tile(2, NV, o + r * ldo, ldo, pp + r * ldp, ldp, vp, ldv, u0, u1);
        r += 2;
    }
    if (r < rows) pv_tile(1, NV, o + r * ldo, ldo, pp + r * ldp, ldp, vp, ldv, u0, u1);
}

/* o[r*ldo + c] += sum_{u0<=u<u1} pp[r*ldp + u] . vp[u*ldv + c] for r < rows,
 * c < dvp (a multiple of 16): column blocks of 64 (4 rows at a time, 16
 * accumulators), the last 48, 32 or 16 columns with 4, 8 and 8 rows; the V
 * pairs loaded once per u for the tile's rows, the P pairs broadcast. */
static void pv_rows(float *o, size_t ldo, const uint32_t *pp, size_t ldp, const uint32_t *vp, size_t ldv,
                    size_t u0, size_t u1, size_t dvp, size_t rows) {
    size_t c0 = 0;
    for (; c0 + 64 <= dvp; c0 += 64) pv_cols(4, 4, o + c0, ldo, pp, ldp, vp + c0, ldv, u0, u1, rows);
    switch ((dvp - c0) / 16) {
    case 3: pv_cols(3, 4, o + c0, ldo, pp, ldp, vp + c0, ldv, u0, u1, rows); break;
    case 2: pv_cols(2, 8, o + c0, ldo, pp, ldp, vp + c0, ldv, u0, u1, rows); break;
    case 1: pv_cols(1, 8, o + c0, ldo, pp, ldp, vp + c0, ldv, u0, u1, rows); break;
    default: break;
    }
}

static void pv_avx512bf16(float *o, size_t ldo, const uint32_t *pp, size_t ldp, const uint32_t *vp,
                          size_t ldv, size_t u0, size_t u1, size_t dvp, size_t rows) {
    pv_rows(o, ldo, pp, ldp, vp, ldv, u0, u1, dvp, rows);
}

static void pack_p_avx512bf16(uint32_t *pp, size_t ldp, const float *p, size_t lds, size_t rows,
                              size_t npairs) {
    for (size_t r = 0; r < rows; r++) {
        const float *src = p + r * lds;
        uint32_t *dst = pp + r * ldp;
        size_t u = 0;
        for (; u + 16 <= npairs; u += 16) {
            __m512 lo = _mm512_loadu_ps(src + 2 * u), hi = _mm512_loadu_ps(src + 2 * u + 16);
            __m512bh b = _mm512_cvtne2ps_pbh(hi, lo);
            _mm512_storeu_si512((void *)(dst + u), (__m512i)b);
        }
        if (u < npairs) {
            size_t left = 2 * (npairs - u); /* floats, 2..30 */
            __mmask16 m0 = (__mmask16)(left >= 16 ? 0xffff : (1u << left) - 1u);
            __mmask16 m1 = (__mmask16)(left > 16 ? (1u << (left - 16)) - 1u : 0);
            __m512 lo = _mm512_maskz_loadu_ps(m0, src + 2 * u);
            __m512 hi = _mm512_maskz_loadu_ps(m1, src + 2 * u + 16);
            __m512bh b = _mm512_cvtne2ps_pbh(hi, lo);
            _mm512_mask_storeu_epi32(dst + u, (__mmask16)((1u << (npairs - u)) - 1u), (__m512i)b);
        }
    }
}

static inline __mmask16 tail_mask(size_t n) { return (__mmask16)(n >= 16 ? 0xffffu : (1u << n) - 1u); }

/* 2^x for the forward's x = (s - max) c <= 0, -inf or NaN, for P that is
 * rounded to bf16 next: 1 + f P3(f) on |f| <= 1/2 (fitted toward minimax of
 * the relative error: 2.9e-6 in float, 700 times below bf16's rounding),
 * scaled by 2^n. No clamp: below -126 (and -inf, whose f is NaN) the mask
 * gives exactly 0; NaN stays NaN. */
static inline __m512 exp2_fwd(__m512 x) {
    __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(9.582851082086563e-3f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.590642988681793e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4024099111557007e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931241750717163e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-126.0f), _CMP_NLT_UQ);
    return _mm512_maskz_scalef_ps(keep, p, n);
}

/* Rows in blocks of 16 as the float softmax (row maxima one row at a time,
 * the statistics of 16 rows in one vector); then per row, 32 logits at a
 * time, two exponentials rounded into 16 pairs by one vcvtne2ps2bf16. */
static void softmax_pack_avx512bf16(const float *s, size_t lds, size_t rows, size_t cols, float cm, float *m,
                                    float *l, float *o, size_t ldo, size_t dvp, uint32_t *pp, size_t ldp) {
    const __m512 vc = _mm512_set1_ps(cm), ninf = _mm512_set1_ps(-INFINITY);
    float mts[16], bases[16], sums[16], als[16];
    for (size_t r0 = 0; r0 < rows; r0 += 16) {
        const size_t nb = rows - r0 < 16 ? rows - r0 : 16;
        const __mmask16 bm = tail_mask(nb);
        for (size_t i = 0; i < nb; i++) {
            const float *row = s + (r0 + i) * lds;
            __m512 mx = ninf;
            for (size_t c = 0; c < cols; c += 16)
                mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(ninf, tail_mask(cols - c), row + c));
            mts[i] = _mm512_reduce_max_ps(mx);
        }
        __m512 mold = _mm512_mask_loadu_ps(ninf, bm, m + r0);
        __m512 mn = _mm512_max_ps(mold, _mm512_maskz_loadu_ps(bm, mts));
        __mmask16 empty = _mm512_cmp_ps_mask(mn, ninf, _CMP_EQ_OQ);
        __m512 base = _mm512_mask_mov_ps(mn, empty, _mm512_setzero_ps());
        __m512 a = exp2_fwd(_mm512_mul_ps(_mm512_sub_ps(mold, base), vc));
        a = _mm512_mask_mov_ps(a, empty, _mm512_set1_ps(1.0f));
        _mm512_storeu_ps(bases, base);
        _mm512_storeu_ps(als, a);
        for (size_t i = 0; i < nb; i++) {
            const float *row = s + (r0 + i) * lds;
            uint32_t *dst = pp + (r0 + i) * ldp;
            const __m512 vb = _mm512_set1_ps(bases[i]);
            __m512 acc = _mm512_setzero_ps();
            size_t c = 0;
            for (; c + 32 <= cols; c += 32) {
                __m512 e0 = exp2_fwd(_mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(row + c), vb), vc));
                __m512 e1 = exp2_fwd(_mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(row + c + 16), vb), vc));
                acc = _mm512_add_ps(acc, _mm512_add_ps(e0, e1));
                _mm512_storeu_si512((void *)(dst + c / 2), (__m512i)_mm512_cvtne2ps_pbh(e1, e0));
            }
            if (c < cols) {
                const size_t left = cols - c; /* 1..31 */
                __m512 x0 = _mm512_mask_loadu_ps(ninf, tail_mask(left), row + c);
                __m512 x1 = _mm512_mask_loadu_ps(ninf, left > 16 ? tail_mask(left - 16) : 0, row + c + 16);
                __m512 e0 = exp2_fwd(_mm512_mul_ps(_mm512_sub_ps(x0, vb), vc));
                __m512 e1 = exp2_fwd(_mm512_mul_ps(_mm512_sub_ps(x1, vb), vc));
                acc = _mm512_add_ps(acc, _mm512_add_ps(e0, e1));
                _mm512_mask_storeu_epi32(dst + c / 2, tail_mask((left + 1) / 2),
                                         (__m512i)_mm512_cvtne2ps_pbh(e1, e0));
            }
            sums[i] = _mm512_reduce_add_ps(acc);
            if (als[i] != 1.0f) {
                const __m512 va = _mm512_set1_ps(als[i]);
                float *orow = o + (r0 + i) * ldo;
                for (size_t cc = 0; cc < dvp; cc += 16)
                    _mm512_storeu_ps(orow + cc, _mm512_mul_ps(va, _mm512_loadu_ps(orow + cc)));
            }
        }
        __m512 lv = _mm512_maskz_loadu_ps(bm, l + r0);
        lv = _mm512_add_ps(_mm512_mul_ps(lv, a), _mm512_maskz_loadu_ps(bm, sums));
        _mm512_mask_storeu_ps(l + r0, bm, lv);
        _mm512_mask_storeu_ps(m + r0, bm, mn);
    }
}

/* The backward's own kernels: an accumulating form of the 8 x 32 product
 * (dQ^T += K^T dS), the softmax gradient of a key-major tile in float, and
 * the packing of pairs of tile rows into the VNNI pair layout. */

/* As qk_avx512bf16, but s += the product (8 rows x 32 columns per
 * pass, 16 accumulators loaded from s and stored back). */
static void qk_acc_avx512bf16(const uint32_t *qp, size_t ldq, const uint32_t *kp, size_t dp2,
                              size_t rows, size_t npanels, float *s, size_t lds) {
    for (size_t p = 0; p < npanels; p++) {
        const uint32_t *kpp = kp + p * dp2 * 32;
        for (size_t r0 = 0; r0 < rows; r0 += 8) {
            const uint32_t *q = qp + r0 * ldq;
            float *d = s + r0 * lds + p * 32;
            __m512 c[8][2];
            for (int r = 0; r < 8; r++) {
                c[r][0] = _mm512_loadu_ps(d + (size_t)r * lds);
                c[r][1] = _mm512_loadu_ps(d + (size_t)r * lds + 16);
            }
            for (size_t t = 0; t < dp2; t++) {
                __m512bh k0 = as_bh(_mm512_loadu_si512((const void *)(kpp + t * 32)));
                __m512bh k1 = as_bh(_mm512_loadu_si512((const void *)(kpp + t * 32 + 16)));
                for (int r = 0; r < 8; r++) {
                    __m512bh a = bcast_pair(q + (size_t)r * ldq + t);
                    c[r][0] = _mm512_dpbf16_ps(c[r][0], a, k0);
                    c[r][1] = _mm512_dpbf16_ps(c[r][1], a, k1);
                }
            }
            for (int r = 0; r < 8; r++) {
                _mm512_storeu_ps(d + (size_t)r * lds, c[r][0]);
                _mm512_storeu_ps(d + (size_t)r * lds + 16, c[r][1]);
            }
        }
    }
}

static void pv_acc_avx512bf16(float *o, size_t ldo, const uint32_t *pp, size_t ldp, const uint32_t *vp,
                              size_t ldv, size_t nu, size_t dvp, size_t rows) {
    pv_rows(o, ldo, pp, ldp, vp, ldv, 0, nu, dvp, rows);
}

/* 2^x for x <= 0 (the caller clamps), exactly 0 below -126 (no subnormals,
 * and -inf gives 0), NaN stays NaN. Range reduction x = n + f, |f| <= 1/2,
 * and the degree-7 Taylor polynomial of 2^f (truncation < 5e-9 relative,
 * below float's rounding), scaled by 2^n with vscalefps. */
static inline __m512 exp2_nonpos(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-126.0f);
    __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    __m512 xc = _mm512_max_ps(x, lo); /* NaN in x: the second operand... */
    xc = _mm512_mask_mov_ps(xc, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x); /* ...so keep NaN */
    __m512 n = _mm512_roundscale_ps(xc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(xc, n);
    __m512 y = _mm512_set1_ps(1.5252733804059841e-05f);             /* ln2^7 / 7! */
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.5403530393381609e-04f)); /* ln2^6 / 6! */
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.3333558146428443e-03f)); /* ln2^5 / 5! */
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(9.6181291076284772e-03f)); /* ln2^4 / 4! */
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(5.5504108664821580e-02f)); /* ln2^3 / 3! */
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(2.4022650695910071e-01f)); /* ln2^2 / 2 */
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(6.9314718055994531e-01f)); /* ln2 */
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.0f));
    y = _mm512_scalef_ps(y, n);
    return _mm512_maskz_mov_ps((__mmask16)~under, y);
}

static void bwd_softmax_avx512bf16(float *s, float *dp, size_t ld, size_t rows, size_t cols, float cm,
                                   const float *L2, const float *Dd) {
    const __m512 vc = _mm512_set1_ps(cm), zero = _mm512_setzero_ps();
    for (size_t r = 0; r < rows; r++) {
        float *sr = s + r * ld, *dr = dp + r * ld;
        for (size_t c = 0; c < cols; c += 16) {
            __mmask16 tm = tail_mask(cols - c);
            __m512 x = _mm512_maskz_loadu_ps(tm, L2 + c), y = _mm512_maskz_loadu_ps(tm, Dd + c);
            __m512 sv = _mm512_maskz_loadu_ps(tm, sr + c);
            /* min(0, e) returns e when e is NaN: NaN stays NaN */
            __m512 pv = exp2_nonpos(_mm512_min_ps(zero, _mm512_fmsub_ps(vc, sv, x)));
            __m512 d = _mm512_mul_ps(pv, _mm512_sub_ps(_mm512_maskz_loadu_ps(tm, dr + c), y));
            __mmask16 nz = _mm512_cmp_ps_mask(pv, zero, _CMP_NEQ_UQ);
            _mm512_mask_storeu_ps(sr + c, tm, pv);
            _mm512_mask_storeu_ps(dr + c, tm, _mm512_maskz_mov_ps(nz, d));
        }
    }
}

/* Rows 2u and 2u+1, 16 columns at a time: both rounded to bf16 by one
 * vcvtne2ps2bf16 (row 2u in the low half), then interleaved so that each
 * 32-bit word holds (row 2u, row 2u+1) of one column. */
static void pack_rowpairs_avx512bf16(uint32_t *kp, const float *x, size_t ldx, size_t npairs,
                                     size_t npanels) {
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7,
                                         22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    for (size_t p = 0; p < npanels; p++)
        for (size_t u = 0; u < npairs; u++) {
            const float *a = x + 2 * u * ldx + 32 * p, *b = a + ldx;
            uint32_t *dst = kp + (p * npairs + u) * 32;
            for (int h = 0; h < 2; h++) {
                __m512bh ab = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(b + 16 * h), _mm512_loadu_ps(a + 16 * h));
                _mm512_storeu_si512((void *)(dst + 16 * h), _mm512_permutexvar_epi16(idx, (__m512i)ab));
            }
        }
}

/* 16 x 16 blocks of words through the float transpose (shuffles move bits
 * as they are, NaN patterns included); masked at the edges. */
static void words_t_avx512bf16(uint32_t *dst, size_t ldd, const void *src, size_t lds, size_t rows, size_t cols) {
    const float *s = src;
    for (size_t r0 = 0; r0 < rows; r0 += 16) {
        const size_t nr = rows - r0 < 16 ? rows - r0 : 16;
        const __mmask16 rm = tail_mask(nr);
        for (size_t c0 = 0; c0 < cols; c0 += 16) {
            const size_t nc = cols - c0 < 16 ? cols - c0 : 16;
            const __mmask16 cm = tail_mask(nc);
            __m512 t[16];
            for (size_t i = 0; i < 16; i++)
                t[i] = i < nr ? _mm512_maskz_loadu_ps(cm, s + (r0 + i) * lds + c0) : _mm512_setzero_ps();
            qkv_transpose16_ps(t);
            for (size_t c = 0; c < nc; c++) _mm512_mask_storeu_ps((float *)(dst + (c0 + c) * ldd + r0), rm, t[c]);
        }
    }
}

static void interleave_avx512bf16(uint32_t *dst, const uint16_t *a, const uint16_t *b, size_t n) {
    /* word k of the first half: (a[k], b[k]); of the second: (a[16 + k], b[16 + k]) */
    const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                        37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i hi = _mm512_set_epi16(63, 31, 62, 30, 61, 29, 60, 28, 59, 27, 58, 26, 57, 25, 56, 24, 55, 23, 54,
                                        22, 53, 21, 52, 20, 51, 19, 50, 18, 49, 17, 48, 16);
    for (size_t i = 0; i < n; i += 32) {
        const size_t m = n - i < 32 ? n - i : 32;
        const __mmask32 k = m == 32 ? 0xffffffffu : (__mmask32)((1u << m) - 1u);
        const __m512i va = _mm512_maskz_loadu_epi16(k, a + i);
        const __m512i vb = b ? _mm512_maskz_loadu_epi16(k, b + i) : _mm512_setzero_si512();
        _mm512_mask_storeu_epi32(dst + i, tail_mask(m), _mm512_permutex2var_epi16(va, lo, vb));
        if (m > 16) _mm512_mask_storeu_epi32(dst + i + 16, tail_mask(m - 16), _mm512_permutex2var_epi16(va, hi, vb));
    }
}

/* qkv_f32_to_bf16 on 16 lanes: nearest even; a NaN keeps its top half with
 * the quiet bit set. */
static inline __m256i round_bf16(__m512 x) {
    const __m512i u = _mm512_castps_si512(x);
    const __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)),
                         _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    const __m512i q = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(r, nan, q));
}

/* 16 rows x 16 columns at a time: the chunks summed in order, transposed in
 * registers, scaled in double, rounded, 16 bf16 stored per column. */
static void dq_out_avx512bf16(uint16_t *dst, size_t ldd, const float *src, size_t lds, size_t cstride,
                              size_t chunks, size_t rows, size_t cols, double scale) {
    const __m512d vs = _mm512_set1_pd(scale);
    for (size_t r0 = 0; r0 < rows; r0 += 16) {
        const size_t nr = rows - r0 < 16 ? rows - r0 : 16;
        for (size_t c0 = 0; c0 < cols; c0 += 16) {
            const size_t nc = cols - c0 < 16 ? cols - c0 : 16;
            const __mmask16 cm = tail_mask(nc);
            __m512 t[16];
            for (size_t i = 0; i < 16; i++) {
                if (i >= nr) {
                    t[i] = _mm512_setzero_ps();
                    continue;
                }
                const float *p = src + (r0 + i) * lds + c0;
                __m512 acc = _mm512_maskz_loadu_ps(cm, p);
                for (size_t ch = 1; ch < chunks; ch++) acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(cm, p + ch * cstride));
                t[i] = acc;
            }
            qkv_transpose16_ps(t);
            const __mmask16 rm = tail_mask(nr);
            for (size_t c = 0; c < nc; c++) {
                const __m256 lo = _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(t[c])), vs));
                const __m256 hi = _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_cvtps_pd(_mm512_extractf32x8_ps(t[c], 1)), vs));
                const __m512 v = _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
                _mm256_mask_storeu_epi16(dst + (c0 + c) * ldd + r0, rm, round_bf16(v));
            }
        }
    }
}

QKV_HALF_DEFINE_INIT(avx512bf16, 1)
