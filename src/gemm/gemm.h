/* The matrix-multiplication framework (internal), BLIS-style.
 *
 * The framework (src/gemm/gemm.c) owns everything but the registers: argument
 * checks, cache blocking (NC, KC, MC), packing of A into MR-row panels and of
 * B into NR-column panels (pack.c), the static partition of C among threads
 * and the edge tiles. The micro-kernels and their contract are in
 * src/kernels/ (kernels/gemm.h). */
#ifndef QKV_GEMM_GEMM_H
#define QKV_GEMM_GEMM_H

#include <stdint.h>

#include "kernels/gemm.h"
#include "kernels/kernels.h" /* qkv_gemm_kernel_active */
#include "qkv.h"

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
