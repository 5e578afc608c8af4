/* AVX512-BF16 matmul micro-kernel (contract: the bf16 part of
 * kernels/gemm.h): a 14 x 32 register tile as the float AVX-512 kernel's
 * (28 zmm accumulators, two zmm of B pairs and one broadcast A pair per
 * step), but each vdpbf16ps consumes two values of K, so a step does twice
 * the multiply-adds of an FMA step for the same loads. Edge tiles use masked
 * stores on columns and stop at row m. The packings round floats to bf16
 * with vcvtne2ps2bf16 (nearest even) and put pairs in place with one
 * permutation or a 16 x 16 transpose. */
#include <immintrin.h>
#include <string.h>

#include "kernels/avx512_common.h"
#include "kernels/gemm.h"

#define MR 14
#define NR 32
#define ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13)

static inline __m512bh as_bh(__m512i x) { return (__m512bh)x; }

static void ukr_avx512bf16(int64_t kc2, const uint32_t *ap, const uint32_t *bp, float *c, int64_t ldc,
                           float alpha, float beta, int m, int n) {
    QKV_AVX512_TILE_BEGIN(ROWS)
    for (int64_t t = 0; t < kc2; t++) {
        __m512bh b0 = as_bh(_mm512_loadu_si512((const void *)bp));
        __m512bh b1 = as_bh(_mm512_loadu_si512((const void *)(bp + 16)));
#define DOT(r)                                                \
    {                                                         \
        uint32_t w;                                           \
        memcpy(&w, ap + (r), sizeof w);                       \
        __m512bh x = as_bh(_mm512_set1_epi32((int)w));        \
        c0_##r = _mm512_dpbf16_ps(c0_##r, x, b0);             \
        c1_##r = _mm512_dpbf16_ps(c1_##r, x, b1);             \
    }
        ROWS(DOT)
#undef DOT
        ap += MR;
        bp += NR;
    }
    /* (alpha * ab) + (beta * c): two roundings, no FMA, as every ISA. */
    QKV_AVX512_TILE_MERGE(ROWS);
}

static inline __mmask16 mask16(int64_t n) {
    return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u);
}

/* 32 floats (masked to n) as 16 bf16 pairs in order: word t = (x[2t], x[2t+1]). */
static inline __m512 pairs_of(const float *x, int64_t n) {
    __m512 lo = _mm512_maskz_loadu_ps(mask16(n), x);
    __m512 hi = n > 16 ? _mm512_maskz_loadu_ps(mask16(n - 16), x + 16) : _mm512_setzero_ps();
    return _mm512_castsi512_ps((__m512i)_mm512_cvtne2ps_pbh(hi, lo));
}

/* dst[t*w + i] = (src[i*ld + 2t], src[i*ld + 2t + 1]): each row's pairs are
 * its floats converted in order; blocks of 16 rows x 16 pairs are then
 * transposed in registers. */
static void pack_pairs_t_avx512bf16(const float *src, int64_t ld, int64_t kc, int w, uint32_t *dst) {
    const int64_t kc2 = (kc + 1) / 2;
    for (int i0 = 0; i0 < w; i0 += 16) {
        const int rows = w - i0 < 16 ? w - i0 : 16;
        const __mmask16 row_mask = mask16(rows);
        for (int64_t t = 0; t < kc2; t += 16) {
            const int64_t nf = kc - 2 * t < 32 ? kc - 2 * t : 32;
            const int np = (int)((nf + 1) / 2);
            __m512 r[16];
            for (int i = 0; i < 16; i++)
                r[i] = i < rows ? pairs_of(src + (i0 + i) * ld + 2 * t, nf) : _mm512_setzero_ps();
            qkv_transpose16_ps(r);
            for (int q = 0; q < np; q++) _mm512_mask_storeu_ps((float *)(dst + (t + q) * w + i0), row_mask, r[q]);
        }
    }
}

/* dst[t*w + i] = (src[2t*ld + i], src[(2t+1)*ld + i]): the two rows of a
 * pair converted together, then interleaved by one 16-bit permutation. */
static void pack_pairs_rows_avx512bf16(const float *src, int64_t ld, int64_t kc, int w, uint32_t *dst) {
    const __m512i inter = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7,
                                           22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    for (int64_t p = 0; p < kc; p += 2) {
        const float *r0 = src + p * ld, *r1 = r0 + ld;
        const int two = p + 1 < kc;
        uint32_t *d = dst + (p / 2) * w;
        for (int i = 0; i < w; i += 16) {
            const __mmask16 k = mask16(w - i);
            __m512 a = _mm512_maskz_loadu_ps(k, r0 + i);
            __m512 b = two ? _mm512_maskz_loadu_ps(k, r1 + i) : _mm512_setzero_ps();
            __m512i x = _mm512_permutexvar_epi16(inter, (__m512i)_mm512_cvtne2ps_pbh(b, a));
            _mm512_mask_storeu_epi32(d + i, k, x);
        }
    }
}

/* Blocking as the float AVX-512 kernel's (KC = 512 values of K: a 14 x 512
 * A panel is 14 KB of pairs, a 512 x 32 B panel 32 KB). */
void qkv_gemm_bf16_init_avx512bf16(qkv_gemm_bf16_kernel *k) {
    *k = (qkv_gemm_bf16_kernel){"avx512bf16 14x32", 1, MR, NR, MR * 8, 512, 4096, ukr_avx512bf16,
                                pack_pairs_t_avx512bf16, pack_pairs_rows_avx512bf16, 0, 0, NULL, NULL, NULL};
}
