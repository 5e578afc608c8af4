/* The matrix-multiplication framework (internal), BLIS-style.
 *
 * The framework (src/gemm/gemm.c) owns everything but the registers: argument
 * checks, cache blocking (NC, KC, MC), packing of A into MR-row panels and of
 * B into NR-column panels (pack.c), the static partition of C among threads
 * and the edge tiles. A micro-kernel (src/kernels/<isa>/gemm_<isa>.c) only
 * multiplies one packed MR x kc panel of A by one packed kc x NR panel of B
 * and merges the product into an MR x NR tile of C. One table per ISA holds
 * the kernel and the blocking that suits its register tile.
 *
 * Packed layouts (zero-padded past the matrix edge, so kernels always run
 * full tiles and only the final store looks at m and n):
 *     A panel:  ap[p * MR + i] = op(A)[i0 + i][p0 + p]     i < MR, p < kc
 *     B panel:  bp[p * NR + j] = op(B)[p0 + p][j0 + j]     j < NR, p < kc
 */
#ifndef QKV_GEMM_GEMM_H
#define QKV_GEMM_GEMM_H

#include <stdint.h>

#include "qkv.h"

/* c[i*ldc + j] = alpha * ab[i][j] + beta * c[i*ldc + j] for i < m, j < n,
 * where ab = sum_{p < kc} ap[p*MR + i] * bp[p*NR + j], accumulated in float in
 * order p = 0, 1, ... (one FMA or one multiply-add per step, the same for
 * every element). beta == 0 writes c without reading it. 1 <= m <= MR,
 * 1 <= n <= NR, kc >= 1. Nothing outside the m x n tile is read or written.
 * The merge is computed as (alpha * ab) + (beta * c), two roundings, whether
 * the tile is full or an edge, so an element's value does not depend on where
 * the tile boundaries fall. */
typedef void (*qkv_gemm_ukr_fn)(int64_t kc, const float *ap, const float *bp, float *c,
                                int64_t ldc, float alpha, float beta, int m, int n);

typedef struct qkv_gemm_kernel {
    const char *name;
    int mr, nr;         /* register tile */
    int mc, kc, nc;     /* cache blocks: mc % mr == 0, nc % nr == 0 */
    qkv_gemm_ukr_fn ukr;
    /* Optional (NULL: portable code): the transposing pack of one whole
     * panel, dst[p * w + i] = src[i * ld + p] for i < w, p < kc, w = MR or NR
     * (A as stored [M, K], B transposed). */
    void (*pack_t)(const float *src, int64_t ld, int64_t kc, int w, float *dst);
} qkv_gemm_kernel;

extern const qkv_gemm_kernel qkv_gemm_kernel_generic;
#ifdef QKV_HAVE_X86
extern const qkv_gemm_kernel qkv_gemm_kernel_avx2;
extern const qkv_gemm_kernel qkv_gemm_kernel_avx512;
#endif

/* The table matching the active arch of core/cpu.h (QKV_ARCH, or the arch a
 * test forced with qkv_cpu_force_arch, else the best the CPU has). */
const qkv_gemm_kernel *qkv_gemm_kernel_active(void);

/* The product after validation (sizes >= 0, strides large enough, pointers
 * set where their matrix is not empty) with a given kernel table and exactly
 * `threads` >= 1 worker threads (fewer when C has fewer tiles); the tests
 * use it to run every kernel, small blockings and exact thread counts.
 * Returns QKV_OK or QKV_ERR_OUT_OF_MEMORY (nothing written to C then). */
qkv_status qkv_gemm_run(const qkv_gemm_kernel *k, int trans_a, int trans_b, int64_t M, int64_t N,
                        int64_t K, float alpha, const float *A, int64_t lda, const float *B,
                        int64_t ldb, float beta, float *C, int64_t ldc, int threads);

/* 1 when this build forwards qkv_sgemm to a system CBLAS (CMake option
 * QKV_USE_CBLAS found one): then the `threads` argument and the allocator
 * hooks do not apply to it (the BLAS threads and allocates on its own). */
int qkv_gemm_uses_cblas(void);

/* Packing (pack.c). A: op(A) rows [i0, i0 + mc), columns [p0, p0 + kc) into
 * ceil(mc / MR) panels of MR x kc (panel r starts at ap + r*MR*kc). trans:
 * A is stored [K, M] (op(A)[i][p] = a[p*lda + i]), else [M, K]. */
void qkv_gemm_pack_a(const qkv_gemm_kernel *k, int trans, const float *a, int64_t lda,
                     int64_t i0, int64_t p0, int64_t mc, int64_t kc, float *ap);
/* B: op(B) rows [p0, p0 + kc), columns [j0, j0 + nc) into ceil(nc / NR)
 * panels of kc x NR (panel r starts at bp + r*NR*kc). trans: B is stored
 * [N, K] (op(B)[p][j] = b[j*ldb + p]), else [K, N]. */
void qkv_gemm_pack_b(const qkv_gemm_kernel *k, int trans, const float *b, int64_t ldb,
                     int64_t p0, int64_t j0, int64_t kc, int64_t nc, float *bp);

#endif
