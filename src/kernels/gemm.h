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
    /* Optional (NULL: the packed path serves every M): the product for a
     * few rows of A read straight from B stored [N, K], as a linear layer
     * with a short input needs it (no panel packed: every weight is read
     * once, from memory, and used for all the rows): for i < m (1 ..
     * QKV_GEMM_FEW_M), j < n (1 .. QKV_GEMM_FEW_N), c[i*ldc + j] = (add ?
     * c[i*ldc + j] : 0) + sum_{p < K} a[i*lda + p] b[j*ldb + p] (+ bias[j]
     * when bias != NULL), the sum in float in the kernel's own order (within
     * the float sum bound of any other); add lets a caller split K into
     * blocks. Loads exactly those rows of a and b (a kernel may prefetch
     * the next QKV_GEMM_FEW_N rows of b: a hint, never a fault). */
    void (*few_rows)(int64_t K, const float *a, int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc,
                     const float *bias, int add, int m, int n);
    /* Rows of op(A) packed at once (a multiple of mc) when a thread's
     * columns span several NC blocks, so that they share the packing; 0:
     * as many as 4 MB of packed floats hold (src/gemm/gemm.c). */
    int mb;
} qkv_gemm_kernel;

#define QKV_GEMM_FEW_M 6 /* rows of A per few_rows call */
#define QKV_GEMM_FEW_N 4 /* rows of B per few_rows call */
#define QKV_GEMM_FEW_KC 384 /* K per few_rows call: a 16-row block of A (24 KB) stays in L1 */

/* The generic table; an ISA's init replaces it whole (the kernel, its
 * register tile and blocking go together). */
void qkv_gemm_init_generic(qkv_gemm_kernel *k);
void qkv_gemm_init_avx2(qkv_gemm_kernel *k);
void qkv_gemm_init_avx512(qkv_gemm_kernel *k);

/* The bf16 micro-kernel (products of bf16 values, fp32 accumulation; the
 * framework is src/gemm/bf16.c). The packed panels hold bf16 pairs in 32-bit
 * words (low half = the even k), the layout of vdpbf16ps, zero past the
 * matrix edge and past an odd kc:
 *     A panel:  ap[t * MR + i] = (op(A)[i0 + i][p0 + 2t], op(A)[i0 + i][p0 + 2t + 1])
 *               (a kernel with a_rows: in steps of kstep pairs, each step MR rows of
 *               kstep pairs, ap[(t - t % kstep) * MR + i * kstep + t % kstep]: a
 *               tile is a contiguous block of rows)
 *     B panel:  bp[t * NR + j] = (op(B)[p0 + 2t][j0 + j], op(B)[p0 + 2t + 1][j0 + j])
 * for t < kc2 = ceil(kc / 2), rounded up to a multiple of the kernel's kstep
 * with zero pairs (kstep 0 or 1: no rounding; the kernel gets that kc2).
 *
 * c[i*ldc + j] = alpha * ab[i][j] + beta * c[i*ldc + j] for i < m, j < n
 * (merge as the float kernel's: two roundings; beta == 0 does not read c),
 * where ab starts at +0 and, for t = 0, 1, ..., kc2 - 1 in order,
 *     ab += hi(a) * hi(b);  ab += lo(a) * lo(b)
 * with a = ap[t*MR + i], b = bp[t*NR + j]: each product of two bf16 is exact
 * in float, each addition rounds once (the order of vdpbf16ps as Intel
 * documents it). The hardware flushes subnormal inputs and results to zero
 * and may order the two adds of a pair differently, so the kernels of two
 * ISAs agree within the float sum bound (tests/test_kernels.c), not
 * bitwise; one table's results never depend on tile positions or threads.
 * 1 <= m <= MR, 1 <= n <= NR, kc2 >= 1; nothing outside the tile written. */
typedef void (*qkv_gemm_bf16_ukr_fn)(int64_t kc2, const uint32_t *ap, const uint32_t *bp, float *c,
                                     int64_t ldc, float alpha, float beta, int m, int n);

typedef struct qkv_gemm_bf16_kernel {
    const char *name;
    int native;         /* 1: bf16 dot-product instructions */
    int mr, nr;         /* register tile */
    int mc, kc, nc;     /* cache blocks in elements: kc even, mc % mr == 0, nc % nr == 0 */
    qkv_gemm_bf16_ukr_fn ukr;
    /* Optional SIMD packings (NULL: the portable loops of src/gemm/bf16.c)
     * of one whole panel of width w = MR or NR over kc elements of K (kc2 =
     * ceil(kc / 2) pairs, the high half of the last pair 0 when kc is odd),
     * rounding as qkv_f32_to_bf16 (nearest even, NaN quieted):
     *   pack_pairs_t:    dst[t*w + i] = (src[i*ld + 2t], src[i*ld + 2t + 1])
     *                    (A stored [M, K], B stored [N, K])
     *   pack_pairs_rows: dst[t*w + i] = (src[2t*ld + i], src[(2t+1)*ld + i])
     *                    (A stored [K, M], B stored [K, N])
     * reading only elements of the kc x w block. */
    void (*pack_pairs_t)(const float *src, int64_t ld, int64_t kc, int w, uint32_t *dst);
    void (*pack_pairs_rows)(const float *src, int64_t ld, int64_t kc, int w, uint32_t *dst);
    /* Tile kernels (0 / NULL for the register-tile ones):
     *   kstep:       kc2 padded to a multiple of it in both panels (kc / 2 is one)
     *   a_rows:      A panels by rows within each K step (above); pack_pairs_t
     *                then packs B only
     *   pack_a_rows: optional SIMD packing of a whole A panel stored [M, K] in
     *                that layout, pair (src[i*ld + 2t], src[i*ld + 2t + 1]) for
     *                i < w, t < kc2p (a multiple of kstep), zero past kc and on
     *                rows w .. MR - 1
     *   begin, end:  each thread calls begin before its first micro-kernel of
     *                a product and end after its last (tile configuration and
     *                release); nothing else runs on the thread in between */
    int kstep;
    int a_rows;
    void (*pack_a_rows)(const float *src, int64_t ld, int64_t kc, int w, int64_t kc2p, uint32_t *dst);
    void (*begin)(void);
    void (*end)(void);
} qkv_gemm_bf16_kernel;

void qkv_gemm_bf16_init_generic(qkv_gemm_bf16_kernel *k);
void qkv_gemm_bf16_init_avx512bf16(qkv_gemm_bf16_kernel *k);
/* AMX-BF16 (kernels/amx/gemm.c): the AVX512-BF16 table's packings of B with
 * a 32 x 32 tile kernel; only where qkv_cpu_has_amx_bf16. */
void qkv_gemm_bf16_init_amx(qkv_gemm_bf16_kernel *k);

#endif
