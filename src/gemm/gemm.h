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

/* An epilogue of a product: fn(ctx, c, ldc, i0, j0, m, n) on a finished
 * block of C, rows i0 .. i0 + m - 1 and columns j0 .. j0 + n - 1 (c points
 * at C[i0][j0]), while it is still in cache: every element of C passes
 * through exactly one block, once its sum (and beta C, and a bf16
 * product's bias) is complete, on the thread that computed it. The block
 * boundaries depend on the blocking and the thread grid, so fn must treat
 * each element alone (then the results do not depend on them).
 *
 * rows (NULL: none) is for what needs whole rows, as a LayerNorm does:
 * rows(ctx, c, ldc, i0, m) on rows i0 .. i0 + m - 1 of C (c at C[i0][0]),
 * once every element of them has been through fn. Each row passes through
 * exactly one call (none for a product or segment without columns). When
 * one thread computes whole rows (the thread grid splits rows only, and the
 * columns fit one NC block or op(A) is packed in bands) it is called on that
 * thread for each block of MC rows after its last block, while they are in
 * cache; otherwise after the product, over the rows split among the threads
 * (qkv_gemm_rows_after). Either way rows must treat each row alone. */
typedef struct qkv_gemm_epi {
    void (*fn)(void *ctx, float *c, int64_t ldc, int64_t i0, int64_t j0, int64_t m, int64_t n);
    void *ctx;
    void (*rows)(void *ctx, float *c, int64_t ldc, int64_t i0, int64_t m);
} qkv_gemm_epi;

/* Whether a product of N columns blocked by nc, on a tm x tn thread grid,
 * calls an epilogue's rows for each MC block inside a loop nest without
 * bands (the bf16 one; the float one also does in bands): tn == 1, N <= nc. */
int qkv_gemm_rows_inside(int tn, int64_t N, int64_t nc);
/* epi->rows over rows [0, M) of C in chunks on up to `threads` threads
 * (nothing when epi or epi->rows is NULL). */
void qkv_gemm_rows_after(const qkv_gemm_epi *epi, float *C, int64_t ldc, int64_t M, int threads);

/* qkv_gemm_run with an epilogue (NULL: none). */
qkv_status qkv_gemm_run_epi(const qkv_gemm_kernel *k, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K,
                            float alpha, const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                            float *C, int64_t ldc, int threads, const qkv_gemm_epi *epi);

/* Products sharing A: for each segment s < nseg, C_s [M, n_s] (row stride
 * ldc_s) = alpha op(A) op(B_s) + beta C_s, then the segment's epilogue
 * (NULL: none) with i0, j0 relative to C_s. When every segment but the last
 * has a multiple of NR columns (and nseg <= QKV_GEMM_MAX_SEGS) they run as
 * one product over the columns of all (Q, K and V from one packing of A,
 * one thread team); otherwise one after the other. Either way every element
 * gets the bits qkv_gemm_run_epi gives it. Returns QKV_OK or
 * QKV_ERR_OUT_OF_MEMORY. */
#define QKV_GEMM_MAX_SEGS 4
typedef struct qkv_gemm_seg {
    const float *B;
    int64_t ldb;
    float *C;
    int64_t ldc;
    int64_t n;
    const qkv_gemm_epi *epi;
} qkv_gemm_seg;
qkv_status qkv_gemm_run_segs(const qkv_gemm_kernel *k, int trans_a, int trans_b, int64_t M, int64_t K, float alpha,
                             const float *A, int64_t lda, float beta, const qkv_gemm_seg *seg, int nseg,
                             int threads);

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

/* Pieces of the framework shared with the bf16 product (bf16.c).
 * qkv_gemm_split: tiles [lo, hi) of `tiles` for part idx of `parts` (sizes
 * differ by <= 1). qkv_gemm_grid: the thread grid tm x tn <= threads for C
 * of mtiles x ntiles register tiles. qkv_gemm_threads_for: the thread count
 * qkv_sgemm uses for an M x N x K product given `threads` (0: the default).
 * qkv_gemm_extent_ok: a rows x cols float matrix of row stride ld fits in
 * int64 and size_t bytes. qkv_gemm_scale_c: C = beta C (beta == 0 writes
 * zeros without reading C; what K == 0 or alpha == 0 leaves). */
void qkv_gemm_split(int64_t tiles, int parts, int idx, int64_t *lo, int64_t *hi);
void qkv_gemm_grid(int64_t mtiles, int64_t ntiles, int mr, int nr, int nc, int threads, int *tm, int *tn);
int qkv_gemm_threads_for(int64_t M, int64_t N, int64_t K, int threads);
int qkv_gemm_extent_ok(int64_t rows, int64_t cols, int64_t ld);
void qkv_gemm_scale_c(int64_t M, int64_t N, float beta, float *C, int64_t ldc);
/* The rectangle [m0, m1) x [n0, n1) of C (borders multiples of mr and nr)
 * that thread unit `unit` of a tm x tn grid owns; 0 when it is empty. */
int qkv_gemm_rect(int64_t unit, int tm, int tn, int64_t mtiles, int64_t ntiles, int mr, int nr, int64_t M,
                  int64_t N, int64_t *m0, int64_t *m1, int64_t *n0, int64_t *n1);
/* qkv_alloc of bytes + 64; *raw gets the allocation (for qkv_free), the
 * result its first 64-byte-aligned address (NULL when out of memory). */
void *qkv_gemm_alloc_aligned(size_t bytes, void **raw);
/* fn(ctx, unit, t) for units 0 .. nthreads - 1, on the calling thread alone
 * when nthreads == 1, else one unit per thread of the pool. */
void qkv_gemm_run_units(int nthreads, void (*fn)(void *ctx, int64_t unit, int t), void *ctx);

/* ---- a few rows (a short input to a linear layer) -------------------------
 * y [M, N] = x [M, K] W^T + b with W stored [N, K] (a linear layer's weight,
 * row stride ldw), b NULL or N floats, for M <= QKV_GEMM_FEW_ROWS: the
 * kernel's few_rows reads every weight once, straight from W (no packing),
 * and uses it for all M rows; threads split the output columns. The sums'
 * order differs from qkv_sgemm's (within the float bound); results are
 * bitwise identical for any thread count. Larger M, or a table without
 * few_rows, runs the packed path and adds b. Errors as qkv_sgemm. */
#define QKV_GEMM_FEW_ROWS 16
qkv_status qkv_gemm_few_rows(int64_t M, int64_t N, int64_t K, const float *x, int64_t ldx, const float *w,
                             int64_t ldw, const float *b, float *y, int64_t ldy, int threads);
qkv_status qkv_gemm_few_rows_with(const qkv_gemm_kernel *k, int64_t M, int64_t N, int64_t K, const float *x,
                                  int64_t ldx, const float *w, int64_t ldw, const float *b, float *y, int64_t ldy,
                                  int threads);

/* ---- bf16 products (bf16.c) ------------------------------------------------
 * C = alpha op(A) op(B) + beta C (+ bias) with op(A) and op(B) rounded to
 * bf16 (nearest even) while they are packed, products of bf16 values summed
 * in float by the bf16 micro-kernel (kernels/gemm.h: the active table's,
 * AVX512-BF16 where the CPU has it, else the portable one). A, B, C are
 * float, row-major, with the transposes, strides and argument rules of
 * qkv_sgemm (include/qkv/core.h); bias is NULL or N floats added to every
 * row of C after the merge: c = (alpha ab + beta c) + bias[j]. Threads split
 * C only (K is never split, the KC blocks always the same), so results are
 * bitwise identical for any thread count, and the pre-packed and one-shot
 * paths give the same bits. Errors: QKV_ERR_BAD_SIZE, QKV_ERR_NULL_POINTER,
 * QKV_ERR_SIZE_OVERFLOW as qkv_sgemm, QKV_ERR_OUT_OF_MEMORY (C untouched). */

/* op(B) [K, N] packed once into bf16 panels for one kernel table's layout:
 * for each KC block of K in order, ceil(N / NR) panels of ceil(kc / 2) x NR
 * pairs. Fill with qkv_gemm_bf16_pack_b, release with qkv_gemm_bf16_b_free.
 * `bytes` is the size of the panels (ceil(N / NR) NR ceil(K / 2) 4 bytes);
 * the struct may be copied but its panels are freed once. Read-only while
 * products use it, so any number of threads may share one. */
typedef struct qkv_gemm_bf16_b {
    const qkv_gemm_bf16_kernel *k; /* the table whose layout it holds */
    int64_t K, N;
    int64_t npanels;               /* ceil(N / NR) */
    uint32_t *panels;              /* NULL when K or N is 0 */
    size_t bytes;
    void *raw;                     /* the allocation (aligned panels inside) */
} qkv_gemm_bf16_b;

/* Packs op(B) (trans_b: B stored [N, K], else [K, N], row stride ldb) for
 * the active bf16 table, on up to `threads` threads (0: the default). On
 * error *out is zeroed (qkv_gemm_bf16_b_free on it is harmless). */
qkv_status qkv_gemm_bf16_pack_b(int trans_b, int64_t K, int64_t N, const float *B, int64_t ldb, int threads,
                                qkv_gemm_bf16_b *out);
/* Frees the panels and zeroes *b; NULL or a zeroed struct is a no-op. */
void qkv_gemm_bf16_b_free(qkv_gemm_bf16_b *b);

/* C [M, N] = alpha op(A) Bp + beta C (+ bias), Bp a packed op(B) [K, N]
 * (its K and N); op(A) [M, K]: trans_a: A stored [K, M], else [M, K]. No
 * weight packing per call; only A is rounded and packed, per thread. */
qkv_status qkv_gemm_bf16_packed(int trans_a, int64_t M, float alpha, const float *A, int64_t lda,
                                const qkv_gemm_bf16_b *Bp, float beta, float *C, int64_t ldc, const float *bias,
                                int threads);
/* The same with an epilogue after the bias (arguments already valid). */
qkv_status qkv_gemm_bf16_packed_epi(int trans_a, int64_t M, float alpha, const float *A, int64_t lda,
                                    const qkv_gemm_bf16_b *Bp, float beta, float *C, int64_t ldc, const float *bias,
                                    int threads, const qkv_gemm_epi *epi);

/* The one-shot product: packs op(B) per call (for weights that change, as
 * in training), then as qkv_gemm_bf16_packed; the same bits. */
qkv_status qkv_gemm_bf16(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                         int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc,
                         const float *bias, int threads);

/* For the tests: packing for a given table, and the products with exactly
 * `threads` >= 1 threads (fewer when C has fewer tiles), arguments already
 * valid. */
qkv_status qkv_gemm_bf16_pack_b_with(const qkv_gemm_bf16_kernel *k, int trans_b, int64_t K, int64_t N,
                                     const float *B, int64_t ldb, int threads, qkv_gemm_bf16_b *out);
qkv_status qkv_gemm_bf16_packed_run(int trans_a, int64_t M, float alpha, const float *A, int64_t lda,
                                    const qkv_gemm_bf16_b *Bp, float beta, float *C, int64_t ldc,
                                    const float *bias, int threads);
qkv_status qkv_gemm_bf16_run(const qkv_gemm_bf16_kernel *k, int trans_a, int trans_b, int64_t M, int64_t N,
                             int64_t K, float alpha, const float *A, int64_t lda, const float *B, int64_t ldb,
                             float beta, float *C, int64_t ldc, const float *bias, int threads);

#endif
