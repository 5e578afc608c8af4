/* Portable matmul micro-kernel: a 4 x 8 register tile in plain C, written so
 * that the compiler keeps the 32 accumulators in vector registers (the j loop
 * is one SSE2 pair / one NEON pair per row) with no ISA flags. */
#include <stddef.h>

#include "kernels/gemm.h"

#define MR 4
#define NR 8

/* c[i*ldc + j] = (alpha * acc[i*lda + j]) + (beta * c[i*ldc + j]) for
 * i < m, j < n, in separate statements: no contraction into an FMA, the
 * same two roundings in every ISA's merge; beta == 0 does not read c. */
static void merge_tile(const float *acc, int lda, float *c, int64_t ldc, float alpha, float beta, int m, int n) {
    for (int i = 0; i < m; i++) {
        float *ci = c + i * ldc;
        for (int j = 0; j < n; j++) {
            float s = alpha * acc[i * lda + j];
            if (beta != 0.0f) {
                float t = beta * ci[j];
                s = s + t;
            }
            ci[j] = s;
        }
    }
}

static void ukr_generic(int64_t kc, const float *ap, const float *bp, float *c, int64_t ldc,
                        float alpha, float beta, int m, int n) {
    float acc[MR][NR] = {{0.0f}};
    for (int64_t p = 0; p < kc; p++) {
        const float *a = ap + p * MR, *b = bp + p * NR;
        for (int i = 0; i < MR; i++)
            for (int j = 0; j < NR; j++) acc[i][j] += a[i] * b[j];
    }
    merge_tile(&acc[0][0], NR, c, ldc, alpha, beta, m, n);
}

static void few_rows_generic(int64_t K, const float *a, int64_t lda, const float *b, int64_t ldb, float *c,
                             int64_t ldc, const float *bias, int add, int m, int n) {
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            float s = 0.0f;
            for (int64_t p = 0; p < K; p++) s += a[i * lda + p] * b[j * ldb + p];
            if (bias) s += bias[j];
            c[i * ldc + j] = add ? c[i * ldc + j] + s : s;
        }
}

/* KC = 512 as for the SIMD kernels (one K block for the layer's E = 512);
 * MC = 128: a 128 x 512 A block (256 KB) in L2. */
void qkv_gemm_init_generic(qkv_gemm_kernel *k) {
    *k = (qkv_gemm_kernel){"generic 4x8", MR, NR, 128, 512, 4096, ukr_generic, NULL, few_rows_generic, 0};
}

/* ---- bf16: the contract of kernels/gemm.h in plain C ---------------------
 * A 4 x 16 tile; the halves of a pair widen to float by a shift and a mask
 * (exact), each product of two bf16 is exact in float, so the sum below is
 * the contract's, fused or not. Slow next to a bf16 dot-product
 * instruction, but correct on every CPU. */
#define BMR 4
#define BNR 16

static float hi_f(uint32_t w) {
    union { uint32_t u; float f; } x = {w & 0xffff0000u};
    return x.f;
}
static float lo_f(uint32_t w) {
    union { uint32_t u; float f; } x = {w << 16};
    return x.f;
}

static void ukr_bf16_generic(int64_t kc2, const uint32_t *ap, const uint32_t *bp, float *c, int64_t ldc,
                             float alpha, float beta, int m, int n) {
    float acc[BMR][BNR] = {{0.0f}};
    for (int64_t t = 0; t < kc2; t++) {
        const uint32_t *a = ap + t * BMR, *b = bp + t * BNR;
        float bh[BNR], bl[BNR];
        for (int j = 0; j < BNR; j++) {
            bh[j] = hi_f(b[j]);
            bl[j] = lo_f(b[j]);
        }
        for (int i = 0; i < BMR; i++) {
            const float ah = hi_f(a[i]), al = lo_f(a[i]);
            for (int j = 0; j < BNR; j++) {
                float s = acc[i][j] + ah * bh[j];
                acc[i][j] = s + al * bl[j];
            }
        }
    }
    merge_tile(&acc[0][0], BNR, c, ldc, alpha, beta, m, n);
}

/* KC = 512 (256 pairs) as for the float kernels. */
void qkv_gemm_bf16_init_generic(qkv_gemm_bf16_kernel *k) {
    *k = (qkv_gemm_bf16_kernel){"generic bf16 4x16", 0, BMR, BNR, 128, 512, 4096, ukr_bf16_generic, NULL, NULL, 0, 0, NULL, NULL, NULL};
}
