/* The matmul micro-kernel's contract (internal), BLIS-style: the framework
 * (src/gemm/) owns everything but the registers (argument checks, cache
 * blocking, packing, the thread partition, edge tiles); a micro-kernel only
 * multiplies one packed MR x kc panel of A by one packed kc x NR panel of B
 * and merges the product into an MR x NR tile of C. One table per ISA
 * (kernels/<isa>/gemm.c) holds the kernel and the blocking that suits its
 * register tile; the dispatcher (kernels/kernels.h) picks the active one.
 *
 * Packed layouts (zero-padded past the matrix edge, so kernels always run
 * full tiles and only the final store looks at m and n):
 *     A panel:  ap[p * MR + i] = op(A)[i0 + i][p0 + p]     i < MR, p < kc
 *     B panel:  bp[p * NR + j] = op(B)[p0 + p][j0 + j]     j < NR, p < kc
 */
#ifndef QKV_KERNELS_GEMM_H
#define QKV_KERNELS_GEMM_H

#include <stdint.h>

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

/* The generic table; an ISA's init replaces it whole (the kernel, its
 * register tile and blocking go together). */
void qkv_gemm_init_generic(qkv_gemm_kernel *k);
void qkv_gemm_init_avx2(qkv_gemm_kernel *k);
void qkv_gemm_init_avx512(qkv_gemm_kernel *k);

#endif
