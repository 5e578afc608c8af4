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
 * B panel; MC mattered little (within noise from 56 to 504). NC = 512: a
 * kc x 512 B block (768 KB at K = 384) stays in L2 while every row passes
 * it, the rows of A packed once for all NC blocks (gemm.c's bands). The
 * kernel alone, kc = 384, 8 A panels, on an AMX Xeon (2 MB L2): 217 GFLOP/s
 * with the B panels in L2, 192-200 with 48 of them (2.3 MB) streaming from
 * L3, as they did with NC = 4096 at N = 1536; bench_encoder, workload A on
 * 1 thread, three pairs: 6.41 / 6.20 / 6.17 s -> 6.09 / 5.64 / 5.94 s; 2
 * threads unchanged. */
/* A few rows of A against rows of B [N, K] (kernels/gemm.h): m x 4 zmm
 * accumulators over K in steps of 16 (plain loads, a masked tail), m fixed at compile time
 * in each of the six bodies below (no work on rows past m); then each row's
 * four accumulators reduced together to four sums (reduce4: 7 shuffles for
 * the four, where one reduction each takes 4). Columns past n repeat the
 * last one: computed, never stored. Memory-bound by design: every weight is
 * loaded once and used for the m rows. */
static inline __m128 reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
    /* per 128-bit lane: (a0+a2, b0+b2, a1+a3, b1+b3) and the same for c, d */
    __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    /* per lane: (a, b, c, d) partial sums */
    __m512 x = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, 0x44), _mm512_shuffle_ps(ab, cd, 0xEE));
    __m256 y = _mm256_add_ps(_mm512_castps512_ps256(x), _mm512_extractf32x8_ps(x, 1));
    return _mm_add_ps(_mm256_castps256_ps128(y), _mm256_extractf128_ps(y, 1));
}

/* Weights prefetched FEW_PF floats ahead along each of the four rows, into
 * the next four rows past a row's end: the hardware streamers alone left
 * the loop waiting on L3 (M = 10, 1536 x 384 from L3 on 2 threads: 130 us
 * without, 83-88 us with; 192 to 1536 ahead within the noise of that). Into
 * L2, not L1: a prefetch into L1 evicts the rows of x the loop reuses
 * (M = 10 from a 42 MB set of weights, 2 threads, medians: 1536 x 384 77 ->
 * 58 us, 384 x 1536 67 -> 59 us, 384 x 384 19.6 -> 15.0 us). */
#define FEW_PF 384
static inline __attribute__((always_inline)) void few_body(const int M, int64_t K, const float *a, int64_t lda,
                                                           const float *b, int64_t ldb, float *c, int64_t ldc,
                                                           const float *bias, int add, int n) {
    const float *b0 = b, *b1 = b + (n > 1 ? 1 : n - 1) * ldb, *b2 = b + (n > 2 ? 2 : n - 1) * ldb,
                *b3 = b + (n > 3 ? 3 : n - 1) * ldb;
#define Z(i) __m512 s##i##0 = _mm512_setzero_ps(), s##i##1 = s##i##0, s##i##2 = s##i##0, s##i##3 = s##i##0;
    Z(0) Z(1) Z(2) Z(3) Z(4) Z(5)
#define PF(p)                                                                   \
    {                                                                           \
        const int64_t q = (p) + FEW_PF, jump = q < K ? q : q + 4 * ldb - K;     \
        _mm_prefetch((const char *)(b0 + jump), _MM_HINT_T1);                     \
        _mm_prefetch((const char *)(b1 + jump), _MM_HINT_T1);                     \
        _mm_prefetch((const char *)(b2 + jump), _MM_HINT_T1);                     \
        _mm_prefetch((const char *)(b3 + jump), _MM_HINT_T1);                     \
    }
#define ROW(i, LOAD)                                                \
    if ((i) < M) {                                                  \
        __m512 x = LOAD(a + (i) * lda + p);                         \
        s##i##0 = _mm512_fmadd_ps(x, w0, s##i##0);                  \
        s##i##1 = _mm512_fmadd_ps(x, w1, s##i##1);                  \
        s##i##2 = _mm512_fmadd_ps(x, w2, s##i##2);                  \
        s##i##3 = _mm512_fmadd_ps(x, w3, s##i##3);                  \
    }
#define STEP(LOAD)                                                                              \
    {                                                                                           \
        __m512 w0 = LOAD(b0 + p), w1 = LOAD(b1 + p), w2 = LOAD(b2 + p), w3 = LOAD(b3 + p);      \
        ROW(0, LOAD) ROW(1, LOAD) ROW(2, LOAD) ROW(3, LOAD) ROW(4, LOAD) ROW(5, LOAD)           \
    }
    /* Plain loads in the loop and masked ones in the tail only: a masked
     * load also takes an FMA port's slot on some cores (10 per 24 FMAs). */
#define FULL(ptr) _mm512_loadu_ps(ptr)
#define TAIL(ptr) _mm512_maskz_loadu_ps(mk, ptr)
    int64_t p = 0;
    for (; p + 16 <= K; p += 16) {
        PF(p)
        STEP(FULL)
    }
    /* and the last line of the next rows' chunk, which a row not aligned
     * to 64 bytes (safetensors data sits at any multiple of 4) spills into
     * past the last prefetch: a demand miss per row and chunk otherwise
     * (384 x 1536 at 24 bytes off: 74 -> 62 us) */
    {
        const int64_t last = 4 * ldb + K - 1;
        _mm_prefetch((const char *)(b0 + last), _MM_HINT_T1);
        _mm_prefetch((const char *)(b1 + last), _MM_HINT_T1);
        _mm_prefetch((const char *)(b2 + last), _MM_HINT_T1);
        _mm_prefetch((const char *)(b3 + last), _MM_HINT_T1);
    }
    if (p < K) {
        const __mmask16 mk = (__mmask16)((1u << (K - p)) - 1u);
        STEP(TAIL)
    }
    const __mmask8 cm = (__mmask8)((1u << n) - 1u);
    const __m128 bb = bias ? _mm_maskz_loadu_ps(cm, bias) : _mm_setzero_ps();
#define OUT(i)                                                                                 \
    if ((i) < M) {                                                                             \
        __m128 r = _mm_add_ps(reduce4(s##i##0, s##i##1, s##i##2, s##i##3), bb);                \
        if (add) r = _mm_add_ps(_mm_maskz_loadu_ps(cm, c + (i) * ldc), r);                     \
        _mm_mask_storeu_ps(c + (i) * ldc, cm, r);                                              \
    }
    OUT(0) OUT(1) OUT(2) OUT(3) OUT(4) OUT(5)
#undef Z
#undef ROW
#undef STEP
#undef FULL
#undef TAIL
#undef OUT
#undef PF
}

static void few_rows_avx512(int64_t K, const float *a, int64_t lda, const float *b, int64_t ldb, float *c,
                            int64_t ldc, const float *bias, int add, int m, int n) {
    switch (m) {
    case 1: few_body(1, K, a, lda, b, ldb, c, ldc, bias, add, n); break;
    case 2: few_body(2, K, a, lda, b, ldb, c, ldc, bias, add, n); break;
    case 3: few_body(3, K, a, lda, b, ldb, c, ldc, bias, add, n); break;
    case 4: few_body(4, K, a, lda, b, ldb, c, ldc, bias, add, n); break;
    case 5: few_body(5, K, a, lda, b, ldb, c, ldc, bias, add, n); break;
    default: few_body(6, K, a, lda, b, ldb, c, ldc, bias, add, n); break;
    }
}

void qkv_gemm_init_avx512(qkv_gemm_kernel *k) {
    *k = (qkv_gemm_kernel){"avx512 14x32", MR, NR, MR * 8, 512, 512, ukr_avx512, pack_t_avx512, few_rows_avx512, 0};
}
