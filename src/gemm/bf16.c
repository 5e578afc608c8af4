/* The bf16 product (gemm.h): the loop nest of gemm.c with bf16 panels.
 *
 * op(B) is packed whole, once (qkv_gemm_bf16_pack_b) or per call (one-shot),
 * into KC blocks of NR-column panels of bf16 pairs; op(A) is rounded and
 * packed per thread, MC x KC at a time, into MR-row panels of pairs. Per
 * thread, over its own rectangle of C (borders multiples of MR and NR):
 *     for jc in steps of NC
 *       for pc in steps of KC (in order; beta' = beta, then 1)
 *         for ic in steps of MC: pack A[ic.., pc..]
 *           for jr in steps of NR, ir in steps of MR: the micro-kernel
 *           (after the last KC block, the bias on the panel just finished)
 * Every element of C is computed by the same kernel from the same packed
 * values in the same order whatever the thread count or path. */
#include <stdint.h>
#include <string.h>

#include "core/half.h"
#include "core/internal.h"
#include "core/threads.h"
#include "gemm/gemm.h"

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

#define ALIGN_WORDS 16 /* 64 bytes */

/* Pairs per panel row of a KC block of kc values: ceil(kc / 2), rounded up
 * to the kernel's kstep with zero pairs (a tile kernel's K step). */
static int64_t pairs_of_kc(const qkv_gemm_bf16_kernel *k, int64_t kc) {
    const int64_t kc2 = (kc + 1) / 2, step = k->kstep > 1 ? k->kstep : 1;
    return (kc2 + step - 1) / step * step;
}

static uint32_t pair_of(float lo, float hi) {
    return (uint32_t)qkv_f32_to_bf16(lo) | ((uint32_t)qkv_f32_to_bf16(hi) << 16);
}

/* One panel of width W (w <= W valid) over kc values of K, kc2p pair rows,
 * zero past w and past kc. by_rows: the pair's two values are in
 * consecutive source rows (src[2t*ld + i], src[(2t+1)*ld + i]); else they
 * are adjacent in source row i (src[i*ld + 2t], src[i*ld + 2t + 1]). */
static void pack_panel(const qkv_gemm_bf16_kernel *k, int by_rows, const float *src, int64_t ld, int64_t kc, int w,
                       int W, int64_t kc2p, uint32_t *restrict dst) {
    void (*simd)(const float *, int64_t, int64_t, int, uint32_t *) = by_rows ? k->pack_pairs_rows : k->pack_pairs_t;
    const int64_t kc2 = (kc + 1) / 2;
    if (kc2p > kc2) memset(dst + kc2 * W, 0, (size_t)((kc2p - kc2) * W) * sizeof *dst);
    if (w == W && simd) {
        simd(src, ld, kc, W, dst);
        return;
    }
    for (int64_t t = 0; t < kc2; t++) {
        const int two = 2 * t + 1 < kc;
        uint32_t *d = dst + t * W;
        int i = 0;
        if (by_rows) {
            const float *r0 = src + 2 * t * ld, *r1 = r0 + ld;
            for (; i < w; i++) d[i] = pair_of(r0[i], two ? r1[i] : 0.0f);
        } else {
            for (; i < w; i++) {
                const float *s = src + i * ld + 2 * t;
                d[i] = pair_of(s[0], two ? s[1] : 0.0f);
            }
        }
        for (; i < W; i++) d[i] = 0;
    }
}

/* One A panel of a_rows kernels (kernels/gemm.h: W rows of ks pairs per K
 * step of ks = kstep pairs), zero on rows past w and pairs past kc; trans:
 * op(A) stored [K, M]. */
static void pack_a_rows(const qkv_gemm_bf16_kernel *k, int trans, const float *src, int64_t ld, int64_t kc, int w,
                        int W, int64_t kc2p, uint32_t *restrict dst) {
    if (!trans && k->pack_a_rows) {
        k->pack_a_rows(src, ld, kc, w, kc2p, dst);
        return;
    }
    const int64_t kc2 = (kc + 1) / 2, ks = k->kstep > 1 ? k->kstep : 1;
    for (int64_t t = 0; t < kc2p; t++)
        for (int r = 0; r < W; r++) {
            const int two = 2 * t + 1 < kc;
            uint32_t v = 0;
            if (r < w && t < kc2)
                v = trans ? pair_of(src[2 * t * ld + r], two ? src[(2 * t + 1) * ld + r] : 0.0f)
                          : pair_of(src[r * ld + 2 * t], two ? src[r * ld + 2 * t + 1] : 0.0f);
            dst[(t - t % ks) * W + r * ks + t % ks] = v;
        }
}

/* op(A) rows [i0, i0 + mc), K [p0, p0 + kc) into MR-row panels (panel r at
 * ap + r * MR * kc2p). */
static void pack_a(const qkv_gemm_bf16_kernel *k, int trans, const float *a, int64_t lda, int64_t i0, int64_t p0,
                   int64_t mc, int64_t kc, uint32_t *ap) {
    const int mr = k->mr;
    const int64_t kc2p = pairs_of_kc(k, kc);
    for (int64_t i = 0; i < mc; i += mr) {
        const int w = (int)min64(mr, mc - i);
        const float *src = trans ? a + p0 * lda + i0 + i : a + (i0 + i) * lda + p0;
        if (k->a_rows)
            pack_a_rows(k, trans, src, lda, kc, w, mr, kc2p, ap + i * kc2p);
        else
            pack_panel(k, trans, src, lda, kc, w, mr, kc2p, ap + i * kc2p);
    }
}

/* ---- packing op(B) whole ---------------------------------------------- */

typedef struct {
    const qkv_gemm_bf16_kernel *k;
    int trans;
    const float *b;
    int64_t ldb, K, N, npanels;
    uint32_t *panels;
} bpack_job;

/* Words before KC block `blk` (every earlier block has kc = KC, KC / 2 a
 * multiple of kstep). */
static int64_t block_offset(const qkv_gemm_bf16_kernel *k, int64_t npanels, int64_t blk) {
    return blk * npanels * k->nr * (k->kc / 2);
}

/* One unit = one panel of one KC block. */
static void bpack_unit(void *ctx, int64_t unit, int t) {
    (void)t;
    const bpack_job *j = ctx;
    const qkv_gemm_bf16_kernel *k = j->k;
    const int64_t blk = unit / j->npanels, r = unit % j->npanels;
    const int64_t p0 = blk * k->kc, kc = min64(k->kc, j->K - p0), j0 = r * k->nr;
    const int w = (int)min64(k->nr, j->N - j0);
    /* trans: B stored [N, K], the pair adjacent in row j; else [K, N], the
     * pair in rows p, p + 1. */
    const float *src = j->trans ? j->b + j0 * j->ldb + p0 : j->b + p0 * j->ldb + j0;
    const int64_t kc2p = pairs_of_kc(k, kc);
    uint32_t *dst = j->panels + block_offset(k, j->npanels, blk) + j0 * kc2p;
    pack_panel(k, !j->trans, src, j->ldb, kc, w, k->nr, kc2p, dst);
}

static int b_args_ok(int trans_b, int64_t K, int64_t N, const float *B, int64_t ldb, qkv_status *st) {
    if (K < 0 || N < 0) *st = QKV_ERR_BAD_SIZE;
    else if (K > 0 && N > 0 && !B) *st = QKV_ERR_NULL_POINTER;
    else if (ldb < (trans_b ? K : N)) *st = QKV_ERR_BAD_SIZE;
    else if (!qkv_gemm_extent_ok(trans_b ? N : K, trans_b ? K : N, ldb)) *st = QKV_ERR_SIZE_OVERFLOW;
    else return 1;
    return 0;
}

qkv_status qkv_gemm_bf16_pack_b_with(const qkv_gemm_bf16_kernel *k, int trans_b, int64_t K, int64_t N,
                                     const float *B, int64_t ldb, int threads, qkv_gemm_bf16_b *out) {
    memset(out, 0, sizeof *out);
    out->k = k;
    out->K = K;
    out->N = N;
    if (K == 0 || N == 0) return QKV_OK;
    /* every KC block but the last has KC / 2 pairs per column */
    const int64_t nblk = ceil_div(K, k->kc);
    const int64_t npanels = ceil_div(N, k->nr),
                  words_per_col = (nblk - 1) * (k->kc / 2) + pairs_of_kc(k, K - (nblk - 1) * k->kc);
    int64_t words;
    if (!qkv_mul_ok(npanels * k->nr, words_per_col, &words) ||
        (uint64_t)words > (SIZE_MAX - 64) / sizeof(uint32_t))
        return QKV_ERR_SIZE_OVERFLOW;
    out->panels = qkv_gemm_alloc_aligned((size_t)words * sizeof(uint32_t), &out->raw);
    if (!out->panels) {
        memset(out, 0, sizeof *out);
        return QKV_ERR_OUT_OF_MEMORY;
    }
    out->npanels = npanels;
    out->bytes = (size_t)words * sizeof(uint32_t);
    bpack_job j = {k, trans_b != 0, B, ldb, K, N, npanels, out->panels};
    const int64_t units = ceil_div(K, k->kc) * npanels;
    if (threads <= 1 || units == 1)
        for (int64_t u = 0; u < units; u++) bpack_unit(&j, u, 0);
    else
        qkv_parallel_for(threads, units, bpack_unit, &j);
    return QKV_OK;
}

qkv_status qkv_gemm_bf16_pack_b(int trans_b, int64_t K, int64_t N, const float *B, int64_t ldb, int threads,
                                qkv_gemm_bf16_b *out) {
    if (!out) return QKV_ERR_NULL_POINTER;
    memset(out, 0, sizeof *out);
    qkv_status st;
    if (threads < 0) return QKV_ERR_BAD_SIZE;
    if (!b_args_ok(trans_b, K, N, B, ldb, &st)) return st;
    /* Packing is O(K N): as many threads as a product of K x N x 64 would get. */
    int t = qkv_gemm_threads_for(64, N, K, threads);
    return qkv_gemm_bf16_pack_b_with(qkv_gemm_bf16_kernel_active(), trans_b, K, N, B, ldb, t, out);
}

void qkv_gemm_bf16_b_free(qkv_gemm_bf16_b *b) {
    if (!b) return;
    qkv_free(b->raw);
    memset(b, 0, sizeof *b);
}

/* ---- the product ------------------------------------------------------- */

typedef struct {
    const qkv_gemm_bf16_kernel *k;
    const qkv_gemm_bf16_b *B;
    int trans_a;
    int64_t M;
    float alpha, beta;
    const float *A;
    int64_t lda, ldc;
    float *C;
    const float *bias;
    int tm, tn;
    int64_t mtiles, ntiles;
    uint32_t *buf; /* per thread: ap_len words */
    int64_t ap_len;
    const qkv_gemm_epi *epi; /* NULL: none */
    int rows_inside;         /* epi->rows called in the loop nest */
} bgemm_job;

static void add_bias(float *restrict c, int64_t ldc, const float *restrict bias, int m, int n) {
    for (int i = 0; i < m; i++)
        for (int jj = 0; jj < n; jj++) c[i * ldc + jj] += bias[jj];
}

static void bgemm_thread(void *ctx, int64_t unit, int t) {
    const bgemm_job *j = ctx;
    const qkv_gemm_bf16_kernel *k = j->k;
    const int64_t MR = k->mr, NR = k->nr, K = j->B->K, N = j->B->N;
    int64_t m0, m1, n0, n1;
    if (!qkv_gemm_rect(unit, j->tm, j->tn, j->mtiles, j->ntiles, k->mr, k->nr, j->M, N, &m0, &m1, &n0, &n1))
        return;

    uint32_t *ap = j->buf + (int64_t)t * j->ap_len;
    if (k->begin) k->begin();
    for (int64_t jc = n0; jc < n1; jc += k->nc) {
        const int64_t nc = min64(k->nc, n1 - jc);
        for (int64_t pc = 0; pc < K; pc += k->kc) {
            const int64_t kc = min64(k->kc, K - pc), kc2 = pairs_of_kc(k, kc);
            const float beta = pc == 0 ? j->beta : 1.0f;
            const int last = pc + kc == K;
            const uint32_t *bblock = j->B->panels + block_offset(k, j->B->npanels, pc / k->kc) + jc * kc2;
            for (int64_t ic = m0; ic < m1; ic += k->mc) {
                const int64_t mc = min64(k->mc, m1 - ic);
                pack_a(k, j->trans_a, j->A, j->lda, ic, pc, mc, kc, ap);
                for (int64_t jr = 0; jr < nc; jr += NR) {
                    const int n = (int)min64(NR, nc - jr);
                    const uint32_t *b = bblock + jr * kc2;
                    float *c = j->C + ic * j->ldc + jc + jr;
                    for (int64_t ir = 0; ir < mc; ir += MR) {
                        const int m = (int)min64(MR, mc - ir);
                        k->ukr(kc2, ap + ir * kc2, b, c + ir * j->ldc, j->ldc, j->alpha, beta, m, n);
                    }
                    /* the bias once the panel's tiles are all out (added
                     * right behind a tile's stores, it waited on them) */
                    if (last && j->bias) add_bias(c, j->ldc, j->bias + jc + jr, (int)mc, n);
                    if (last && j->epi) j->epi->fn(j->epi->ctx, c, j->ldc, ic, jc + jr, mc, n);
                }
                if (last && j->rows_inside && j->epi->rows) /* rows ic .. ic + mc - 1 are whole */
                    j->epi->rows(j->epi->ctx, j->C + ic * j->ldc, j->ldc, ic, mc);
            }
        }
    }
    if (k->end) k->end();
}

qkv_status qkv_gemm_bf16_packed_run(int trans_a, int64_t M, float alpha, const float *A, int64_t lda,
                                    const qkv_gemm_bf16_b *Bp, float beta, float *C, int64_t ldc,
                                    const float *bias, int threads) {
    return qkv_gemm_bf16_packed_epi(trans_a, M, alpha, A, lda, Bp, beta, C, ldc, bias, threads, NULL);
}

qkv_status qkv_gemm_bf16_packed_epi(int trans_a, int64_t M, float alpha, const float *A, int64_t lda,
                                    const qkv_gemm_bf16_b *Bp, float beta, float *C, int64_t ldc, const float *bias,
                                    int threads, const qkv_gemm_epi *epi) {
    const int64_t N = Bp->N, K = Bp->K;
    if (M == 0 || N == 0) return QKV_OK;
    if (K == 0 || alpha == 0.0f) {
        qkv_gemm_scale_c(M, N, beta, C, ldc);
        if (bias)
            for (int64_t i = 0; i < M; i++)
                for (int64_t jj = 0; jj < N; jj++) C[i * ldc + jj] += bias[jj];
        if (epi) epi->fn(epi->ctx, C, ldc, 0, 0, M, N);
        qkv_gemm_rows_after(epi, C, ldc, M, threads);
        return QKV_OK;
    }
    const qkv_gemm_bf16_kernel *k = Bp->k;
    bgemm_job j = {.k = k, .B = Bp, .trans_a = trans_a != 0, .M = M, .alpha = alpha, .beta = beta, .A = A,
                   .lda = lda, .ldc = ldc, .C = C, .bias = bias, .mtiles = ceil_div(M, k->mr),
                   .ntiles = ceil_div(N, k->nr), .epi = epi};
    qkv_gemm_grid(j.mtiles, j.ntiles, k->mr, k->nr, k->nc, threads, &j.tm, &j.tn);
    const int nthreads = j.tm * j.tn;
    const int64_t rows = ceil_div(j.mtiles, j.tm) * k->mr, kc2 = pairs_of_kc(k, min64(k->kc, K));
    j.ap_len = ceil_div(min64(k->mc, rows) * kc2, ALIGN_WORDS) * ALIGN_WORDS;
    void *raw;
    j.buf = qkv_gemm_alloc_aligned((size_t)nthreads * (size_t)j.ap_len * sizeof(uint32_t), &raw);
    if (!j.buf) return QKV_ERR_OUT_OF_MEMORY;
    j.rows_inside = epi && qkv_gemm_rows_inside(j.tn, N, k->nc);
    qkv_gemm_run_units(nthreads, bgemm_thread, &j);
    qkv_free(raw);
    if (!j.rows_inside) qkv_gemm_rows_after(epi, C, ldc, M, threads);
    return QKV_OK;
}

/* The checks of op(A) and C shared by both paths (B's are b_args_ok). */
static int ac_args_ok(int trans_a, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *C,
                      int64_t ldc, int threads, qkv_status *st) {
    if (M < 0 || threads < 0) *st = QKV_ERR_BAD_SIZE;
    else if ((M > 0 && N > 0 && !C) || (M > 0 && K > 0 && !A)) *st = QKV_ERR_NULL_POINTER;
    else if (lda < (trans_a ? M : K) || ldc < N) *st = QKV_ERR_BAD_SIZE;
    else if (!qkv_gemm_extent_ok(trans_a ? K : M, trans_a ? M : K, lda) || !qkv_gemm_extent_ok(M, N, ldc))
        *st = QKV_ERR_SIZE_OVERFLOW;
    else return 1;
    return 0;
}

qkv_status qkv_gemm_bf16_packed(int trans_a, int64_t M, float alpha, const float *A, int64_t lda,
                                const qkv_gemm_bf16_b *Bp, float beta, float *C, int64_t ldc, const float *bias,
                                int threads) {
    if (!Bp) return QKV_ERR_NULL_POINTER;
    if (Bp->K < 0 || Bp->N < 0 || !Bp->k) return QKV_ERR_BAD_PARAMETER;
    if (Bp->K > 0 && Bp->N > 0 && !Bp->panels) return QKV_ERR_NULL_POINTER;
    qkv_status st;
    if (!ac_args_ok(trans_a, M, Bp->N, Bp->K, A, lda, C, ldc, threads, &st)) return st;
    return qkv_gemm_bf16_packed_run(trans_a, M, alpha, A, lda, Bp, beta, C, ldc, bias,
                                    qkv_gemm_threads_for(M, Bp->N, Bp->K, threads));
}

qkv_status qkv_gemm_bf16_run(const qkv_gemm_bf16_kernel *k, int trans_a, int trans_b, int64_t M, int64_t N,
                             int64_t K, float alpha, const float *A, int64_t lda, const float *B, int64_t ldb,
                             float beta, float *C, int64_t ldc, const float *bias, int threads) {
    if (M == 0 || N == 0) return QKV_OK;
    qkv_gemm_bf16_b bp;
    /* K == 0 or alpha == 0: B is not read (packing nothing). */
    qkv_status st = K == 0 || alpha == 0.0f ? qkv_gemm_bf16_pack_b_with(k, trans_b, 0, N, B, ldb, 1, &bp)
                                            : qkv_gemm_bf16_pack_b_with(k, trans_b, K, N, B, ldb, threads, &bp);
    if (st != QKV_OK) return st;
    bp.K = K;
    st = qkv_gemm_bf16_packed_run(trans_a, M, alpha, A, lda, &bp, beta, C, ldc, bias, threads);
    qkv_gemm_bf16_b_free(&bp);
    return st;
}

qkv_status qkv_gemm_bf16(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                         int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc,
                         const float *bias, int threads) {
    qkv_status st;
    if (N < 0 || K < 0) return QKV_ERR_BAD_SIZE;
    if (!ac_args_ok(trans_a, M, N, K, A, lda, C, ldc, threads, &st) || !b_args_ok(trans_b, K, N, B, ldb, &st))
        return st;
    return qkv_gemm_bf16_run(qkv_gemm_bf16_kernel_active(), trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta,
                             C, ldc, bias, qkv_gemm_threads_for(M, N, K, threads));
}
