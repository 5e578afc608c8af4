/* Pieces of the AVX-512F matmul kernels shared by the avx512 and avx512bf16
 * folders (internal; include only from sources compiled with -mavx512f):
 * the 16 x 16 transpose of 32-bit elements, and the prefetch and merge of
 * one row of a 32-column C tile. */
#ifndef QKV_KERNELS_AVX512_COMMON_H
#define QKV_KERNELS_AVX512_COMMON_H

#include <immintrin.h>

/* In-register 16 x 16 transpose: on return r[c] holds column c of the input
 * rows (element i = old r[i][c]). Three stages of 128-bit-lane shuffles. */
static inline void qkv_transpose16_ps(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    /* r[4i + k], 128-bit lane L: column 4L + k of rows 4i .. 4i + 3 */
    for (int i = 0; i < 4; i++) {
        __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
        __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
        r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    for (int k = 0; k < 4; k++) {
        t[k] = _mm512_shuffle_f32x4(r[k], r[4 + k], 0x88);
        t[k + 4] = _mm512_shuffle_f32x4(r[k], r[4 + k], 0xdd);
        t[k + 8] = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], 0x88);
        t[k + 12] = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], 0xdd);
    }
    for (int k = 0; k < 4; k++) {
        r[k] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0x88);
        r[k + 8] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0xdd);
        r[k + 4] = _mm512_shuffle_f32x4(t[k + 4], t[k + 12], 0x88);
        r[k + 12] = _mm512_shuffle_f32x4(t[k + 4], t[k + 12], 0xdd);
    }
}

/* Column masks of a tile row of n <= 32 columns: the first 16, the next 16. */
static inline __mmask16 qkv_avx512_mask_lo(int n) {
    return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u);
}
static inline __mmask16 qkv_avx512_mask_hi(int n) {
    return n >= 32 ? (__mmask16)0xFFFF : n > 16 ? (__mmask16)((1u << (n - 16)) - 1u) : 0;
}

/* Start fetching a row of the C tile (its lines arrive while the kernel runs). */
static inline void qkv_avx512_prefetch_row(const float *cr) {
    _mm_prefetch((const char *)cr, _MM_HINT_T0);
    _mm_prefetch((const char *)(cr + 31), _MM_HINT_T0);
}

/* cr[j] = (alpha * ab[j]) + (beta * cr[j]) for the masked columns, ab the
 * two accumulators a0, a1: two roundings, no FMA, as every ISA's merge;
 * read_c == 0 (beta == 0): cr = alpha * ab without reading cr. */
static inline void qkv_avx512_merge_row(float *cr, __m512 a0, __m512 a1, __m512 va, __m512 vb, int read_c,
                                        __mmask16 k0, __mmask16 k1) {
    __m512 s0 = _mm512_mul_ps(va, a0), s1 = _mm512_mul_ps(va, a1);
    if (read_c) {
        s0 = _mm512_add_ps(s0, _mm512_mul_ps(vb, _mm512_maskz_loadu_ps(k0, cr)));
        s1 = _mm512_add_ps(s1, _mm512_mul_ps(vb, _mm512_maskz_loadu_ps(k1, cr + 16)));
    }
    _mm512_mask_storeu_ps(cr, k0, s0);
    _mm512_mask_storeu_ps(cr + 16, k1, s1);
}

/* The two ends of a 32-column micro-kernel whose rows are listed by
 * ROWS(X) = X(0) X(1) ...: QKV_AVX512_TILE_BEGIN declares the accumulators
 * c0_r, c1_r (zero) and prefetches the C rows r < m; QKV_AVX512_TILE_MERGE
 * merges them into C (qkv_avx512_merge_row). Both use c, ldc, m, n, alpha,
 * beta of the kernel's signature. */
#define QKV_AVX512_TILE_DECL_(r) __m512 c0_##r = _mm512_setzero_ps(), c1_##r = _mm512_setzero_ps();
#define QKV_AVX512_TILE_PF_(r) \
    if ((r) < m) qkv_avx512_prefetch_row(c + (r) * ldc);
#define QKV_AVX512_TILE_BEGIN(ROWS) \
    ROWS(QKV_AVX512_TILE_DECL_)     \
    ROWS(QKV_AVX512_TILE_PF_)
#define QKV_AVX512_TILE_ST_(r) \
    if ((r) < m) qkv_avx512_merge_row(c + (r) * ldc, c0_##r, c1_##r, va_, vb_, read_c_, k0_, k1_);
#define QKV_AVX512_TILE_MERGE(ROWS)                                                      \
    do {                                                                                 \
        const __m512 va_ = _mm512_set1_ps(alpha), vb_ = _mm512_set1_ps(beta);            \
        const __mmask16 k0_ = qkv_avx512_mask_lo(n), k1_ = qkv_avx512_mask_hi(n);        \
        const int read_c_ = beta != 0.0f;                                                \
        ROWS(QKV_AVX512_TILE_ST_)                                                        \
    } while (0)

#endif
