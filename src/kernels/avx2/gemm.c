/* AVX2 + FMA matmul micro-kernel: a 6 x 16 register tile (12 ymm accumulators,
 * two ymm of B and one broadcast of A per step: 15 of the 16 registers).
 * Edge tiles are computed whole (the packed panels are zero-padded) into a
 * small stack tile and merged with scalar code. */
#include <immintrin.h>

#include <stddef.h>

#include "kernels/gemm.h"

#define MR 6
#define NR 16

#define REP6(X) X(0) X(1) X(2) X(3) X(4) X(5)

static void ukr_avx2(int64_t kc, const float *ap, const float *bp, float *c, int64_t ldc,
                     float alpha, float beta, int m, int n) {
#define DECL(r) __m256 c0_##r = _mm256_setzero_ps(), c1_##r = _mm256_setzero_ps();
    REP6(DECL)
#undef DECL
    /* Start fetching the C tile now: its lines arrive while the FMAs run. */
#define PF(r) \
    if ((r) < m) _mm_prefetch((const char *)(c + (r) * ldc), _MM_HINT_T0); \
    if ((r) < m) _mm_prefetch((const char *)(c + (r) * ldc + 15), _MM_HINT_T0);
    REP6(PF)
#undef PF
    for (int64_t p = 0; p < kc; p++) {
        __m256 b0 = _mm256_loadu_ps(bp), b1 = _mm256_loadu_ps(bp + 8);
#define FMA(r)                                                 \
    {                                                          \
        __m256 x = _mm256_broadcast_ss(ap + (r));              \
        c0_##r = _mm256_fmadd_ps(x, b0, c0_##r);               \
        c1_##r = _mm256_fmadd_ps(x, b1, c1_##r);               \
    }
        REP6(FMA)
#undef FMA
        ap += MR;
        bp += NR;
    }
    __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
    if (m == MR && n == NR) {
        if (beta == 0.0f) {
#define ST(r)                                                                   \
    _mm256_storeu_ps(c + (r) * ldc, _mm256_mul_ps(va, c0_##r));                \
    _mm256_storeu_ps(c + (r) * ldc + 8, _mm256_mul_ps(va, c1_##r));
            REP6(ST)
#undef ST
        } else {
#define ST(r)                                                                   \
    _mm256_storeu_ps(c + (r) * ldc, _mm256_add_ps(_mm256_mul_ps(va, c0_##r),    \
                            _mm256_mul_ps(vb, _mm256_loadu_ps(c + (r) * ldc)))); \
    _mm256_storeu_ps(c + (r) * ldc + 8, _mm256_add_ps(_mm256_mul_ps(va, c1_##r),\
                            _mm256_mul_ps(vb, _mm256_loadu_ps(c + (r) * ldc + 8))));
            REP6(ST)
#undef ST
        }
        return;
    }
    float t[MR * NR];
#define ST(r)                                                    \
    _mm256_storeu_ps(t + (r) * NR, _mm256_mul_ps(va, c0_##r));  \
    _mm256_storeu_ps(t + (r) * NR + 8, _mm256_mul_ps(va, c1_##r));
    REP6(ST)
#undef ST
    for (int i = 0; i < m; i++) {
        float *ci = c + i * ldc;
        for (int j = 0; j < n; j++) {
            float s = t[i * NR + j];
            if (beta != 0.0f) {
                float u = beta * ci[j]; /* separate statement: no FMA contraction */
                s = s + u;
            }
            ci[j] = s;
        }
    }
}

/* KC = 512 (see avx512/gemm.c for why a K of 512 is taken in one block);
 * MC = 144: a 144 x 512 A block (288 KB) stays in the 1 MB L2. */
void qkv_gemm_init_avx2(qkv_gemm_kernel *k) {
    *k = (qkv_gemm_kernel){"avx2 6x16", MR, NR, 144, 512, 4096, ukr_avx2, NULL, NULL, 0};
}
