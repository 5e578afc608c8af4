/* AVX-512F matmul micro-kernel: a 14 x 32 register tile (28 zmm accumulators,
 * two zmm of B and one broadcast of A per step: 31 of the 32 registers; 28
 * FMAs per 16 loads keeps the FMA pipes, not the load ports, the limit).
 * Edge tiles use masked loads and stores on columns and stop at row m. */
#include <immintrin.h>

#include "kernels/avx512_common.h"
#include "kernels/gemm.h"

#ifndef QKV_GEMM_AVX512_MR
#define QKV_GEMM_AVX512_MR 14
#endif
#define MR QKV_GEMM_AVX512_MR
#define NR 32

#if MR == 14
#define ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13)
#elif MR == 12
#define ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#elif MR == 8
#define ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#else
#error "unsupported QKV_GEMM_AVX512_MR"
#endif

static void ukr_avx512(int64_t kc, const float *ap, const float *bp, float *c, int64_t ldc,
                       float alpha, float beta, int m, int n) {
    QKV_AVX512_TILE_BEGIN(ROWS)
    for (int64_t p = 0; p < kc; p++) {
        __m512 b0 = _mm512_loadu_ps(bp), b1 = _mm512_loadu_ps(bp + 16);
#define FMA(r)                                                 \
    {                                                          \
        __m512 x = _mm512_set1_ps(ap[r]);                      \
        c0_##r = _mm512_fmadd_ps(x, b0, c0_##r);               \
        c1_##r = _mm512_fmadd_ps(x, b1, c1_##r);               \
    }
        ROWS(FMA)
#undef FMA
        ap += MR;
        bp += NR;
    }
    /* (alpha * ab) + (beta * c): two roundings, no FMA, as every ISA. */
    QKV_AVX512_TILE_MERGE(ROWS);
}

/* dst[p * w + i] = src[i * ld + p], i < w (<= 32), p < kc: blocks of 16 rows
 * x 16 p transposed in registers; masked loads for the last p < 16 and the
 * rows past w, masked stores for a block narrower than 16 rows. */
static void pack_t_avx512(const float *src, int64_t ld, int64_t kc, int w, float *dst) {
    for (int i0 = 0; i0 < w; i0 += 16) {
        int rows = w - i0 < 16 ? w - i0 : 16;
        __mmask16 row_mask = (__mmask16)((1u << rows) - 1u);
        for (int64_t p = 0; p < kc; p += 16) {
            int n = kc - p < 16 ? (int)(kc - p) : 16;
            __mmask16 pm = (__mmask16)((1u << n) - 1u);
            __m512 r[16];
            for (int i = 0; i < 16; i++)
                r[i] = i < rows ? _mm512_maskz_loadu_ps(pm, src + (i0 + i) * ld + p)
                                : _mm512_setzero_ps();
            qkv_transpose16_ps(r);
            for (int c = 0; c < n; c++) _mm512_mask_storeu_ps(dst + (p + c) * w + i0, row_mask, r[c]);
        }
    }
}

/* Blocking, tuned on the development machine (AMD EPYC Zen 4: 32 KB L1d and
 * 1 MB L2 per core, 32 MB L3; `bench_gemm --sweep` measures it):
 * KC = 512 takes the layer's K = E = 512 in one block, so C is written once
 * instead of read back and rewritten per K block (measured: KC = 256 costs
 * about 10% at M = 4096, N = K = 512, KC = 128 about 20%), and the 14-row A
 * panel (28 KB) streams from L2 while the 64 KB B panel is reused from L1/L2.
 * MC = 112 (8 panels): a 112 x 512 A block (224 KB) stays in L2 next to the
 * B panel; MC mattered little (within noise from 56 to 504). NC = 4096: a
 * 512 x 4096 B block (8 MB) stays in L3; the layer's N (512, 1536) is one
 * block. */
/* A few rows of A against rows of B [N, K] (kernels/gemm.h): 6 x 4 zmm
 * accumulators over K in steps of 16 (masked tail), then each reduced
 * across its lanes. Rows past m (n) repeat the last one: computed, never
 * stored, so the loop has no branch. Memory-bound by design: every weight
 * is loaded once and used for the m rows. */
static void few_rows_avx512(int64_t K, const float *a, int64_t lda, const float *b, int64_t ldb, float *c,
                            int64_t ldc, const float *bias, int m, int n) {
#define AR(i) const float *a##i = a + ((i) < m ? (i) : m - 1) * lda;
#define BR(j) const float *b##j = b + ((j) < n ? (j) : n - 1) * ldb;
    AR(0) AR(1) AR(2) AR(3) AR(4) AR(5)
    BR(0) BR(1) BR(2) BR(3)
#define Z(i) __m512 s##i##0 = _mm512_setzero_ps(), s##i##1 = s##i##0, s##i##2 = s##i##0, s##i##3 = s##i##0;
    Z(0) Z(1) Z(2) Z(3) Z(4) Z(5)
#define ROW(i)                                                  \
    {                                                           \
        __m512 x = _mm512_maskz_loadu_ps(mk, a##i + p);         \
        s##i##0 = _mm512_fmadd_ps(x, w0, s##i##0);              \
        s##i##1 = _mm512_fmadd_ps(x, w1, s##i##1);              \
        s##i##2 = _mm512_fmadd_ps(x, w2, s##i##2);              \
        s##i##3 = _mm512_fmadd_ps(x, w3, s##i##3);              \
    }
    for (int64_t p = 0; p < K; p += 16) {
        __mmask16 mk = K - p >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (K - p)) - 1u);
        __m512 w0 = _mm512_maskz_loadu_ps(mk, b0 + p), w1 = _mm512_maskz_loadu_ps(mk, b1 + p);
        __m512 w2 = _mm512_maskz_loadu_ps(mk, b2 + p), w3 = _mm512_maskz_loadu_ps(mk, b3 + p);
        ROW(0) ROW(1) ROW(2) ROW(3) ROW(4) ROW(5)
    }
#define OUT(i)                                                                                          \
    if ((i) < m) {                                                                                      \
        float r[4] = {_mm512_reduce_add_ps(s##i##0), _mm512_reduce_add_ps(s##i##1),                    \
                      _mm512_reduce_add_ps(s##i##2), _mm512_reduce_add_ps(s##i##3)};                   \
        for (int j = 0; j < n; j++) c[(i) * ldc + j] = bias ? r[j] + bias[j] : r[j];                    \
    }
    OUT(0) OUT(1) OUT(2) OUT(3) OUT(4) OUT(5)
#undef AR
#undef BR
#undef Z
#undef ROW
#undef OUT
}

void qkv_gemm_init_avx512(qkv_gemm_kernel *k) {
    *k = (qkv_gemm_kernel){"avx512 14x32", MR, NR, MR * 8, 512, 4096, ukr_avx512, pack_t_avx512, few_rows_avx512};
}
