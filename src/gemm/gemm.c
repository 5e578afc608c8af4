/* qkv_sgemm: argument checks, the thread partition and the BLIS loop nest
 * (Van Zee & van de Geijn, "BLIS: A Framework for Rapidly Instantiating BLAS
 * Functionality", ACM TOMS 2015; Goto & van de Geijn, "Anatomy of
 * High-Performance Matrix Multiplication", ACM TOMS 2008).
 *
 * Per thread, over its own rectangle of C:
 *     for jc in steps of NC          columns of C and B
 *       for pc in steps of KC        the shared dimension, in order
 *         pack B[pc.., jc..] into NR-column panels     (kc x nc, L3-resident)
 *         for ic in steps of MC      rows of C and A
 *           pack A[ic.., pc..] into MR-row panels      (mc x kc, L2-resident)
 *           for jr in steps of NR    one B panel stays in L1 ...
 *             for ir in steps of MR  ... while the A panels stream past it
 *               micro-kernel: C tile = alpha * A panel . B panel + beta' * C tile
 * with beta' = beta for the first KC block and 1 after it.
 *
 * Determinism: threads own disjoint rectangles of C whose borders are
 * multiples of MR and NR, and K is never split, so every element of C is
 * computed by the same kernel with the same KC blocks in the same order
 * whatever the thread count: results are bitwise identical for any count. */
#include <stdint.h>
#include <string.h>

#include "core/internal.h"
#include "core/threads.h"
#include "gemm/gemm.h"

#ifdef QKV_USE_CBLAS
#include <cblas.h>
#include <limits.h>
#endif

int qkv_gemm_uses_cblas(void) {
#ifdef QKV_USE_CBLAS
    return 1;
#else
    return 0;
#endif
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Floats per buffer are rounded up to a whole 64-byte line so that every
 * thread's buffers start aligned. */
#define ALIGN_FLOATS 16
#define PACK_WEIGHT 8
/* The most floats of packed op(A) a thread keeps for its NC blocks to share
 * unless the kernel table says how many rows (4 MB: 2048 rows of K = 512). */
#define GEMM_BAND_FLOATS ((int64_t)1 << 20)

typedef struct gemm_job {
    const qkv_gemm_kernel *k;
    int trans_a, trans_b;
    int64_t M, N, K;         /* N: the segments' columns together */
    float alpha, beta;
    const float *A;
    int64_t lda;
    const qkv_gemm_seg *seg; /* nseg products sharing A; their columns follow */
    int nseg;                /* one another, each but the last a multiple of NR */
    int64_t off[QKV_GEMM_MAX_SEGS + 1]; /* seg s: columns [off[s], off[s + 1]) */
    int tm, tn;              /* thread grid: tm row bands x tn column bands */
    int64_t mtiles, ntiles;  /* MR-row / NR-column tiles of C */
    float *buf;              /* per thread: ap_len floats, then bp_len floats */
    int64_t ap_len, bp_len;
    int rows_inside;         /* epilogues' rows called in the loop nest */
    int64_t band_rows;       /* > 0: op(A) packed that many rows at a time, once per K block */
} gemm_job;

/* The segment holding column col of the joined product. */
static int seg_of(const gemm_job *j, int64_t col) {
    int s = 0;
    while (s + 1 < j->nseg && col >= j->off[s + 1]) s++;
    return s;
}

/* op(B)'s rows [pc, pc + kc) and columns [c0, c1) packed from dst on (c0 a
 * panel border), segment by segment: each piece starts a whole panel (the
 * segments' borders are multiples of NR). */
static void pack_b_cols(const gemm_job *j, int64_t pc, int64_t kc, int64_t c0, int64_t c1, float *dst) {
    for (int64_t x = c0; x < c1;) {
        int s = seg_of(j, x);
        int64_t x1 = min64(c1, j->off[s + 1]);
        qkv_gemm_pack_b(j->k, j->trans_b, j->seg[s].B, j->seg[s].ldb, pc, x - j->off[s], kc, x1 - x,
                        dst + (x - c0) * kc);
        x = x1;
    }
}

void qkv_gemm_split(int64_t tiles, int parts, int idx, int64_t *lo, int64_t *hi) {
    int64_t base = tiles / parts, rem = tiles % parts;
    *lo = idx * base + min64(idx, rem);
    *hi = *lo + base + (idx < rem ? 1 : 0);
}

int qkv_gemm_rect(int64_t unit, int tm, int tn, int64_t mtiles, int64_t ntiles, int mr, int nr, int64_t M,
                  int64_t N, int64_t *m0, int64_t *m1, int64_t *n0, int64_t *n1) {
    int64_t lo, hi;
    qkv_gemm_split(mtiles, tm, (int)(unit / tn), &lo, &hi);
    *m0 = lo * mr;
    *m1 = min64(hi * mr, M);
    qkv_gemm_split(ntiles, tn, (int)(unit % tn), &lo, &hi);
    *n0 = lo * nr;
    *n1 = min64(hi * nr, N);
    return *m0 < *m1 && *n0 < *n1;
}

void *qkv_gemm_alloc_aligned(size_t bytes, void **raw) {
    *raw = bytes <= SIZE_MAX - 64 ? qkv_alloc(bytes + 64) : NULL;
    if (!*raw) return NULL;
    uintptr_t addr = (uintptr_t)*raw;
    return (void *)((addr + 63) & ~(uintptr_t)63);
}

void qkv_gemm_run_units(int nthreads, void (*fn)(void *ctx, int64_t unit, int t), void *ctx) {
    if (nthreads == 1)
        fn(ctx, 0, 0);
    else
        qkv_parallel_for(nthreads, nthreads, fn, ctx);
}

/* Rows [ic, ic + mc) of C against the packed op(B) block bp (columns [jc,
 * jc + nc), K rows [pc, pc + kc)), op(A)'s rows packed at ap; the blocks'
 * epilogues once the last K block is in. */
static void gemm_macro(const gemm_job *j, const float *ap, const float *bp, int64_t ic, int64_t mc, int64_t jc,
                       int64_t nc, int64_t pc, int64_t kc) {
    const qkv_gemm_kernel *k = j->k;
    const int64_t MR = k->mr, NR = k->nr;
    const float beta = pc == 0 ? j->beta : 1.0f;
    for (int64_t jr = 0; jr < nc; jr += NR) {
        const int si = seg_of(j, jc + jr);
        const qkv_gemm_seg *sg = &j->seg[si];
        const int64_t col = jc + jr - j->off[si], ldc = sg->ldc;
        int n = (int)min64(NR, nc - jr);
        const float *b = bp + jr * kc;
        float *c = sg->C + ic * ldc + col;
        for (int64_t ir = 0; ir < mc; ir += MR) {
            int m = (int)min64(MR, mc - ir);
            k->ukr(kc, ap + ir * kc, b, c + ir * ldc, ldc, j->alpha, beta, m, n);
        }
        if (sg->epi && pc + kc == j->K) sg->epi->fn(sg->epi->ctx, c, ldc, ic, col, mc, n);
    }
}

/* The epilogues' step on rows [ic, ic + mc), whole once their last block is in. */
static void gemm_rows(const gemm_job *j, int64_t ic, int64_t mc) {
    for (int s = 0; s < j->nseg; s++) {
        const qkv_gemm_seg *sg = &j->seg[s];
        if (sg->n > 0 && sg->epi && sg->epi->rows) sg->epi->rows(sg->epi->ctx, sg->C + ic * sg->ldc, sg->ldc, ic, mc);
    }
}

static void gemm_thread(void *ctx, int64_t unit, int t) {
    const gemm_job *j = ctx;
    const qkv_gemm_kernel *k = j->k;
    int64_t m0, m1, n0, n1;
    if (!qkv_gemm_rect(unit, j->tm, j->tn, j->mtiles, j->ntiles, k->mr, k->nr, j->M, j->N, &m0, &m1, &n0, &n1))
        return;

    float *ap = j->buf + (int64_t)t * (j->ap_len + j->bp_len);
    float *bp = ap + j->ap_len;
    if (j->band_rows > 0) {
        /* Several NC blocks of columns: op(A) is packed once per K block for
         * up to band_rows rows and read from there by every NC block, so
         * each kc x nc block of op(B) stays in L2 while all those rows pass
         * it, and no row of A is packed twice. */
        for (int64_t pc = 0; pc < j->K; pc += k->kc) {
            int64_t kc = min64(k->kc, j->K - pc);
            for (int64_t b0 = m0; b0 < m1; b0 += j->band_rows) {
                int64_t b1 = min64(m1, b0 + j->band_rows);
                for (int64_t ic = b0; ic < b1; ic += k->mc)
                    qkv_gemm_pack_a(k, j->trans_a, j->A, j->lda, ic, pc, min64(k->mc, b1 - ic), kc,
                                    ap + (ic - b0) * kc);
                for (int64_t jc = n0; jc < n1; jc += k->nc) {
                    int64_t nc = min64(k->nc, n1 - jc);
                    pack_b_cols(j, pc, kc, jc, jc + nc, bp);
                    for (int64_t ic = b0; ic < b1; ic += k->mc) {
                        int64_t mc = min64(k->mc, b1 - ic);
                        gemm_macro(j, ap + (ic - b0) * kc, bp, ic, mc, jc, nc, pc, kc);
                        if (j->rows_inside && pc + kc == j->K && jc + nc == n1) gemm_rows(j, ic, mc);
                    }
                }
            }
        }
        return;
    }
    for (int64_t jc = n0; jc < n1; jc += k->nc) {
        int64_t nc = min64(k->nc, n1 - jc);
        for (int64_t pc = 0; pc < j->K; pc += k->kc) {
            int64_t kc = min64(k->kc, j->K - pc);
            pack_b_cols(j, pc, kc, jc, jc + nc, bp);
            for (int64_t ic = m0; ic < m1; ic += k->mc) {
                int64_t mc = min64(k->mc, m1 - ic);
                qkv_gemm_pack_a(k, j->trans_a, j->A, j->lda, ic, pc, mc, kc, ap);
                gemm_macro(j, ap, bp, ic, mc, jc, nc, pc, kc);
                if (j->rows_inside && pc + kc == j->K) gemm_rows(j, ic, mc); /* rows ic .. ic + mc - 1 are whole */
            }
        }
    }
}

int qkv_gemm_rows_inside(int tn, int64_t N, int64_t nc) { return tn == 1 && N <= nc; }

typedef struct rows_job {
    const qkv_gemm_epi *epi;
    float *C;
    int64_t ldc;
} rows_job;

static void rows_chunk(void *ctx, int64_t r0, int64_t r1) {
    const rows_job *j = ctx;
    j->epi->rows(j->epi->ctx, j->C + r0 * j->ldc, j->ldc, r0, r1 - r0);
}

void qkv_gemm_rows_after(const qkv_gemm_epi *epi, float *C, int64_t ldc, int64_t M, int threads) {
    if (!epi || !epi->rows || M <= 0) return;
    rows_job j = {epi, C, ldc};
    qkv_par_range(threads, M, 8 * ldc, rows_chunk, &j);
}

void qkv_gemm_scale_c(int64_t M, int64_t N, float beta, float *C, int64_t ldc) {
    for (int64_t i = 0; i < M; i++) {
        float *c = C + i * ldc;
        if (beta == 0.0f)
            memset(c, 0, (size_t)N * sizeof(float));
        else if (beta != 1.0f)
            for (int64_t jj = 0; jj < N; jj++) c[jj] *= beta;
    }
}

void qkv_gemm_grid(int64_t mtiles, int64_t ntiles, int mr, int nr, int nc, int threads, int *tm_out,
                   int *tn_out) {
    /* The thread grid tm x tn <= threads with the least work on its busiest
     * thread, per unit of K: its tile area (multiply-adds) plus its packing
     * (each thread packs its rows of A once per NC block and its columns of B
     * once), a packed element weighted as PACK_WEIGHT multiply-adds. Ties go
     * to more row bands. */
    if (threads < 1) threads = 1;
    if (threads > QKV_MAX_THREADS) threads = QKV_MAX_THREADS;
    int best_tm = 1, best_tn = 1;
    double best_cost = 0.0;
    for (int tm = threads; tm >= 1; tm--) {
        int tn = threads / tm;
        int64_t rm = tm > mtiles ? mtiles : tm, rn = tn > ntiles ? ntiles : tn;
        int64_t rows = ceil_div(mtiles, rm) * mr, cols = ceil_div(ntiles, rn) * nr;
        double cost = (double)rows * (double)cols +
                      PACK_WEIGHT * ((double)rows * (double)ceil_div(cols, nc) + (double)cols);
        if (tm == threads || cost < best_cost) {
            best_cost = cost;
            best_tm = (int)rm;
            best_tn = (int)rn;
        }
    }
    *tm_out = best_tm;
    *tn_out = best_tn;
}

qkv_status qkv_gemm_run(const qkv_gemm_kernel *k, int trans_a, int trans_b, int64_t M, int64_t N,
                        int64_t K, float alpha, const float *A, int64_t lda, const float *B,
                        int64_t ldb, float beta, float *C, int64_t ldc, int threads) {
    return qkv_gemm_run_epi(k, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, threads, NULL);
}

qkv_status qkv_gemm_run_epi(const qkv_gemm_kernel *k, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K,
                            float alpha, const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                            float *C, int64_t ldc, int threads, const qkv_gemm_epi *epi) {
    const qkv_gemm_seg seg = {B, ldb, C, ldc, N, epi};
    return qkv_gemm_run_segs(k, trans_a, trans_b, M, K, alpha, A, lda, beta, &seg, 1, threads);
}

qkv_status qkv_gemm_run_segs(const qkv_gemm_kernel *k, int trans_a, int trans_b, int64_t M, int64_t K, float alpha,
                             const float *A, int64_t lda, float beta, const qkv_gemm_seg *seg, int nseg,
                             int threads) {
    int joined = nseg == 1 || (nseg <= QKV_GEMM_MAX_SEGS && k->nc % k->nr == 0);
    for (int s = 0; joined && s + 1 < nseg; s++) joined = seg[s].n % k->nr == 0;
    if (M == 0 || nseg < 1) return QKV_OK;
    if (K == 0 || alpha == 0.0f) {
        for (int s = 0; s < nseg; s++) {
            if (seg[s].n == 0) continue;
            qkv_gemm_scale_c(M, seg[s].n, beta, seg[s].C, seg[s].ldc);
            if (seg[s].epi) seg[s].epi->fn(seg[s].epi->ctx, seg[s].C, seg[s].ldc, 0, 0, M, seg[s].n);
            qkv_gemm_rows_after(seg[s].epi, seg[s].C, seg[s].ldc, M, threads);
        }
        return QKV_OK;
    }
    if (!joined) { /* one product after the other */
        for (int s = 0; s < nseg; s++) {
            qkv_status st = qkv_gemm_run_segs(k, trans_a, trans_b, M, K, alpha, A, lda, beta, seg + s, 1, threads);
            if (st != QKV_OK) return st;
        }
        return QKV_OK;
    }
    gemm_job j;
    j.k = k;
    j.trans_a = trans_a != 0;
    j.trans_b = trans_b != 0;
    j.M = M;
    j.K = K;
    j.alpha = alpha;
    j.beta = beta;
    j.A = A;
    j.lda = lda;
    j.seg = seg;
    j.nseg = nseg;
    j.off[0] = 0;
    for (int s = 0; s < nseg; s++) j.off[s + 1] = j.off[s] + seg[s].n;
    j.N = j.off[nseg];
    if (j.N == 0) return QKV_OK;
    j.mtiles = ceil_div(M, k->mr);
    j.ntiles = ceil_div(j.N, k->nr);

    qkv_gemm_grid(j.mtiles, j.ntiles, k->mr, k->nr, k->nc, threads, &j.tm, &j.tn);
    int nthreads = j.tm * j.tn;

    /* Pack buffers, all taken up front (one allocation) so that running out
     * of memory is reported before C is touched. */
    int64_t rows = ceil_div(j.mtiles, j.tm) * k->mr, cols = ceil_div(j.ntiles, j.tn) * k->nr;
    int64_t kc = min64(k->kc, K);
    /* A thread with several NC blocks of columns packs its rows of op(A)
     * once per K block, in bands of at most GEMM_BAND_FLOATS floats (whole
     * MC blocks); with one NC block, one MC block at a time. */
    j.band_rows = 0;
    if (cols > k->nc && rows > k->mc) {
        int64_t mcs = k->mb > 0 ? k->mb / k->mc : GEMM_BAND_FLOATS / (k->mc * kc);
        j.band_rows = (mcs < 1 ? 1 : mcs) * k->mc;
        if (j.band_rows > rows) j.band_rows = ceil_div(rows, k->mc) * k->mc;
    }
    j.ap_len = ceil_div((j.band_rows > 0 ? j.band_rows : min64(k->mc, rows)) * kc, ALIGN_FLOATS) * ALIGN_FLOATS;
    j.bp_len = ceil_div(min64(k->nc, cols) * kc, ALIGN_FLOATS) * ALIGN_FLOATS;
    void *raw;
    j.buf = qkv_gemm_alloc_aligned((size_t)nthreads * (size_t)(j.ap_len + j.bp_len) * sizeof(float), &raw);
    if (!j.buf) return QKV_ERR_OUT_OF_MEMORY;
    /* In bands, a thread's rows are whole after its last NC block. */
    j.rows_inside = j.band_rows > 0 ? j.tn == 1 : qkv_gemm_rows_inside(j.tn, j.N, k->nc);
    qkv_gemm_run_units(nthreads, gemm_thread, &j);
    qkv_free(raw);
    if (!j.rows_inside)
        for (int s = 0; s < nseg; s++)
            if (seg[s].n > 0) qkv_gemm_rows_after(seg[s].epi, seg[s].C, seg[s].ldc, M, threads);
    return QKV_OK;
}

/* Extent of a rows x cols matrix with row stride ld, in elements, must fit
 * in int64 and in size_t bytes: (rows - 1) * ld + cols. */
int qkv_gemm_extent_ok(int64_t rows, int64_t cols, int64_t ld) {
    if (rows == 0 || cols == 0) return 1;
    int64_t e;
    if (!qkv_mul_ok(rows - 1, ld, &e) || e > INT64_MAX - cols) return 0;
    e += cols;
    return (uint64_t)e <= (uint64_t)(SIZE_MAX / sizeof(float));
}

/* Smallest problem (in multiply-adds) worth one more thread: starting and
 * joining a thread costs some tens of microseconds. */
#define GEMM_MIN_WORK_PER_THREAD ((int64_t)1 << 20)

int qkv_gemm_threads_for(int64_t M, int64_t N, int64_t K, int threads) {
    int t = qkv_threads_resolve(threads);
    int64_t work = 0; /* M * N * K, saturating */
    if (!qkv_mul_ok(M, N, &work) || !qkv_mul_ok(work, K, &work)) work = INT64_MAX;
    int64_t useful = work / GEMM_MIN_WORK_PER_THREAD;
    if (useful < 1) useful = 1;
    if ((int64_t)t > useful) t = (int)useful;
    return t;
}

qkv_status qkv_sgemm(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                     const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                     float *C, int64_t ldc, int threads) {
    if (M < 0 || N < 0 || K < 0 || threads < 0) return QKV_ERR_BAD_SIZE;
    /* op(A) is M x K: stored M x K (row stride lda >= K) or K x M (>= M). */
    int64_t a_rows = trans_a ? K : M, a_cols = trans_a ? M : K;
    int64_t b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;
    /* A pointer is required when its matrix has an element to read or write
     * (A and B are not read when alpha == 0, but are still asked for). */
    if ((M > 0 && N > 0 && !C) || (M > 0 && K > 0 && !A) || (K > 0 && N > 0 && !B))
        return QKV_ERR_NULL_POINTER;
    if (lda < a_cols || ldb < b_cols || ldc < N) return QKV_ERR_BAD_SIZE;
    if (!qkv_gemm_extent_ok(a_rows, a_cols, lda) || !qkv_gemm_extent_ok(b_rows, b_cols, ldb) ||
        !qkv_gemm_extent_ok(M, N, ldc))
        return QKV_ERR_SIZE_OVERFLOW;
    if (M == 0 || N == 0) return QKV_OK;

#ifdef QKV_USE_CBLAS
    /* The system BLAS, when the build asked for it (QKV_USE_CBLAS) and the
     * sizes fit its int; its own threading applies (`threads` is ignored). */
    if (M <= INT_MAX && N <= INT_MAX && K <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX &&
        ldc <= INT_MAX) {
        if (K == 0 || alpha == 0.0f) {
            qkv_gemm_scale_c(M, N, beta, C, ldc);
            return QKV_OK;
        }
        cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                    trans_b ? CblasTrans : CblasNoTrans, (int)M, (int)N, (int)K, alpha, A,
                    (int)(lda ? lda : 1), B, (int)(ldb ? ldb : 1), beta, C, (int)ldc);
        return QKV_OK;
    }
#endif

    int t = qkv_gemm_threads_for(M, N, K, threads);
    return qkv_gemm_run(qkv_gemm_kernel_active(), trans_a, trans_b, M, N, K, alpha, A, lda, B,
                        ldb, beta, C, ldc, t);
}

/* ---- a few rows: y = x W^T + b read straight from W --------------------- */

typedef struct few_job {
    const qkv_gemm_kernel *k;
    const float *x, *w, *b;
    float *y;
    int64_t M, N, K, ldx, ldw, ldy, cols; /* cols: columns of y per unit */
} few_job;

static void few_unit(void *ctx, int64_t unit, int t) {
    (void)t;
    const few_job *j = ctx;
    int64_t j0 = unit * j->cols, j1 = j0 + j->cols < j->N ? j0 + j->cols : j->N;
    /* K in blocks of QKV_GEMM_FEW_KC: the rows' block of x stays in L1 while
     * the unit's weights stream past it (x of K = 1536 is 60 KB at 10 rows) */
    for (int64_t k0 = 0; k0 < j->K; k0 += QKV_GEMM_FEW_KC) {
        const int64_t kc = j->K - k0 < QKV_GEMM_FEW_KC ? j->K - k0 : QKV_GEMM_FEW_KC;
        for (int64_t jj = j0; jj < j1; jj += QKV_GEMM_FEW_N) {
            int n = (int)(j1 - jj < QKV_GEMM_FEW_N ? j1 - jj : QKV_GEMM_FEW_N);
            for (int64_t i = 0; i < j->M; i += QKV_GEMM_FEW_M) {
                int m = (int)(j->M - i < QKV_GEMM_FEW_M ? j->M - i : QKV_GEMM_FEW_M);
                j->k->few_rows(kc, j->x + i * j->ldx + k0, j->ldx, j->w + jj * j->ldw + k0, j->ldw,
                               j->y + i * j->ldy + jj, j->ldy, k0 == 0 && j->b ? j->b + jj : NULL, k0 > 0, m, n);
            }
        }
    }
}

qkv_status qkv_gemm_few_rows_with(const qkv_gemm_kernel *k, int64_t M, int64_t N, int64_t K, const float *x,
                                  int64_t ldx, const float *w, int64_t ldw, const float *b, float *y, int64_t ldy,
                                  int threads) {
    if (M < 0 || N < 0 || K < 0 || threads < 0) return QKV_ERR_BAD_SIZE;
    if ((M > 0 && N > 0 && (!y || (K > 0 && (!x || !w))))) return QKV_ERR_NULL_POINTER;
    if (ldx < K || ldw < K || ldy < N) return QKV_ERR_BAD_SIZE;
    if (!qkv_gemm_extent_ok(M, K, ldx) || !qkv_gemm_extent_ok(N, K, ldw) || !qkv_gemm_extent_ok(M, N, ldy))
        return QKV_ERR_SIZE_OVERFLOW;
    if (M == 0 || N == 0) return QKV_OK;
    if (M > QKV_GEMM_FEW_ROWS || !k->few_rows || K == 0) { /* the packed path, then the bias */
        qkv_status s = qkv_gemm_run(k, 0, 1, M, N, K, 1.0f, x, ldx, w, ldw, 0.0f, y, ldy,
                                    qkv_gemm_threads_for(M, N, K, threads));
        if (s != QKV_OK || !b) return s;
        for (int64_t i = 0; i < M; i++)
            for (int64_t jj = 0; jj < N; jj++) y[i * ldy + jj] += b[jj];
        return QKV_OK;
    }
    /* units of 64 output columns: each element has one owner, in the same order for any thread count */
    few_job j = {k, x, w, b, y, M, N, K, ldx, ldw, ldy, 64};
    int64_t units = (N + j.cols - 1) / j.cols;
    /* The weights' reading is the cost: every core streams a share once
     * they are too big for a core's cache (256 KB and up), however few the
     * rows (the products alone would call for one thread). */
    int t = N * K >= 65536 ? qkv_threads_resolve(threads) : qkv_gemm_threads_for(M, N, K, threads);
    if (t > units) t = (int)units;
    if (t <= 1)
        for (int64_t u = 0; u < units; u++) few_unit(&j, u, 0);
    else
        qkv_parallel_for(t, units, few_unit, &j);
    return QKV_OK;
}

qkv_status qkv_gemm_few_rows(int64_t M, int64_t N, int64_t K, const float *x, int64_t ldx, const float *w,
                             int64_t ldw, const float *b, float *y, int64_t ldy, int threads) {
    return qkv_gemm_few_rows_with(qkv_gemm_kernel_active(), M, N, K, x, ldx, w, ldw, b, y, ldy, threads);
}
