/* Portable matmul micro-kernel: a 4 x 8 register tile in plain C, written so
 * that the compiler keeps the 32 accumulators in vector registers (the j loop
 * is one SSE2 pair / one NEON pair per row) with no ISA flags. */
#include <stddef.h>

#include "kernels/gemm.h"

#define MR 4
#define NR 8

static void ukr_generic(int64_t kc, const float *ap, const float *bp, float *c, int64_t ldc,
                        float alpha, float beta, int m, int n) {
    float acc[MR][NR] = {{0.0f}};
    for (int64_t p = 0; p < kc; p++) {
        const float *a = ap + p * MR, *b = bp + p * NR;
        for (int i = 0; i < MR; i++)
            for (int j = 0; j < NR; j++) acc[i][j] += a[i] * b[j];
    }
    /* (alpha * ab) + (beta * c) in separate statements: no contraction into
     * an FMA, the same two roundings in every ISA's merge. */
    for (int i = 0; i < m; i++) {
        float *ci = c + i * ldc;
        for (int j = 0; j < n; j++) {
            float s = alpha * acc[i][j];
            if (beta != 0.0f) {
                float t = beta * ci[j];
                s = s + t;
            }
            ci[j] = s;
        }
    }
}

/* KC = 512 as for the SIMD kernels (one K block for the layer's E = 512);
 * MC = 128: a 128 x 512 A block (256 KB) in L2. */
void qkv_gemm_init_generic(qkv_gemm_kernel *k) {
    *k = (qkv_gemm_kernel){"generic 4x8", MR, NR, 128, 512, 4096, ukr_generic, NULL};
}
