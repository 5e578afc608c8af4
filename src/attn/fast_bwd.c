/* Fast backward (FlashAttention-2, Dao 2023, Algorithm 2, on CPU): the
 * weights are recomputed tile by tile from Q, K and the saved log-sum-exp
 * (P = exp(s - lse)), never stored; D_i = rowsum(dO_i * O_i). When the
 * lse is too large for float to pin P down (|lse| >~ 89, see lse_precise:
 * logits of +-1e30 would give NaN) the forward's own statistics are
 * used instead: P = 2^(sc (s - m) - log2 l), the difference first as in the
 * forward, exact for logits of any size; either way the exponent is
 * clamped so that P never overflows (kernel contract, kernels/attn.h).
 *
 * One pass over key blocks computes everything, and no two threads ever add
 * into the same memory, so the result is bitwise identical for any thread
 * count. For each key block of a (b, kv head) and every query block of every
 * query head sharing it: S^T = K Q^T, dP^T = V dO^T, P, dS = P (dP - D), then
 * dV += P^T dO and dK += dS^T Q into the block's accumulators (5 tile
 * products in all, as FlashAttention-2), and dQ += dS K into a partial dQ.
 * The partial dQ belongs to a "chunk" of key blocks (block kb is in chunk
 * kb mod C, C = min(blocks, FA_DQ_CHUNKS), a function of the problem only):
 * a work unit is one chunk of one (b, kv head) and owns that chunk's partial
 * rows; a last, cheap pass sums the C partials in chunk order. With a bias
 * gradient a unit is one chunk of every (b, kv head), so that each dbias
 * column block has one owner summing over batch and heads in a fixed order.
 * Masks skip tiles as in the forward. The scale (and 1/temperature) is
 * applied once to the finished dQ and dK rows; cosine scores apply the
 * normalisation's chain rule there too. */
#include <math.h>
#include <string.h>

#include "attn/fast.h"
#include "attn/fast_common.h"
#include "attn/fast_posbias.h"
#include "attn/fast_dropout.h"
#include "core/threads.h"

typedef struct bwd_ctx {
    fa_ctx c;
    const float *dout, *out, *lse; /* out and lse: the forward's (or recomputed) */
    float *dq, *dk, *dv, *dbias;
    float *drel;          /* partial sums of d_rel_table by offset (fast_posbias.h), or NULL */
    int64_t nqb, nkb;
    int64_t *LO, *HI;     /* [B, n_q] key range of every query */
    int64_t *BLO, *BHI;   /* [B, nqb] union range of every query block (BHI = 0: empty) */
    float *L2;            /* [B, H, n_q] lse in base 2 (+inf for an empty row), or with M2
                             log2 of the forward's row sum */
    float *M2;            /* [B, H, n_q] the forward's row max (tile units), or NULL */
    float *Dd;            /* [B, H, n_q] rowsum(dO * O) (softmax) */
    float *cnt;           /* [B, H, n_q] visible keys (ReLU divided by count) */
    float *qt, *dot;      /* Q and dO packed in panels of 32 queries per (b, h) */
    const float *qr, *dor; /* contiguous rows per (b, h): Q [nq, D], dO [nq, Dv]
                              (the inputs themselves when one head: already so) */
    float *qr_own, *dor_own; /* inside qt's block */
    int64_t qt_stride, dot_stride;
    int64_t chunks;       /* C: partial dQ copies */
    float *dqp;           /* [C, B, H, n_q, D] partial dQ */
    int64_t ldD, ldDv;    /* accumulator row strides */
    unsigned char *ws;
    size_t ws_stride;
} bwd_ctx;

#define FA_DQ_CHUNKS 4

typedef struct bwd_ws {
    float *xb, *yb;       /* block copies: K and V rows */
    float *s, *dp, *dcap; /* tiles, key-major [FA_BK, FA_BQ] */
    float *dz;            /* the tile's dropout factors (fast_dropout.h) */
    float *acc1, *acc2;   /* dK, dV accumulators of the key block */
    float *dqt;           /* dQ of one query block from one key block [FA_BQ, ldD] */
    int *a, *e;           /* per key: visible queries of the tile */
    int *qa, *qe;         /* per query: visible keys of the tile */
} bwd_ws;

#define BT (FA_BK > FA_BQ ? FA_BK : FA_BQ) /* rows of the biggest block */

static size_t bwd_ws_layout(const bwd_ctx *f, unsigned char *base, bwd_ws *w) {
    size_t at = 0;
    QKV_CARVE(xb, float, BT * f->c.D);
    QKV_CARVE(yb, float, BT * f->c.Dv);
    QKV_CARVE(s, float, FA_BK * FA_BQ);
    QKV_CARVE(dp, float, FA_BK * FA_BQ);
    QKV_CARVE(dcap, float, FA_BK * FA_BQ);
    QKV_CARVE(dz, float, fa_dropout_on(&f->c) ? FA_BK * FA_BQ : 0);
    QKV_CARVE(acc1, float, BT * f->ldD);
    QKV_CARVE(acc2, float, BT * f->ldDv);
    QKV_CARVE(dqt, float, FA_BQ * f->ldD);
    QKV_CARVE(a, int, BT);
    QKV_CARVE(e, int, BT);
    QKV_CARVE(qa, int, FA_BQ);
    QKV_CARVE(qe, int, FA_BQ);
    return at;
}

/* Copy rows [r0, r0+n) of a [.., ld] matrix (row r at src + r*ld) into a
 * dense [rows, D] block, zero-padded to `rows`. */
static void copy_rows(float *dst, const float *src, int64_t ld, int n, int rows, int64_t D) {
    for (int r = 0; r < rows; r++) {
        if (r < n) memcpy(dst + (size_t)r * D, src + r * ld, (size_t)D * sizeof(float));
        else memset(dst + (size_t)r * D, 0, (size_t)D * sizeof(float));
    }
}

/* ReLU / sigmoid: weights and dS from the tile (natural logit = s * s2nat),
 * elementwise over the visible entries [a, e) of each row; the rest 0.
 * perc: the count divisor per row (percol = 0) or per column (1), or NULL. */
static void elementwise_bwd(const fa_ctx *c, float *s, float *dp, size_t ld, int rows, int cols,
                            const int *a, const int *e, const float *cnt, int percol) {
    for (int r = 0; r < rows; r++) {
        float *sr = s + (size_t)r * ld, *dr = dp + (size_t)r * ld;
        for (int i = 0; i < cols; i++) {
            if (i < a[r] || i >= e[r] || sr[i] == -INFINITY) {
                sr[i] = 0.0f;
                dr[i] = 0.0f;
                continue;
            }
            double x = (double)sr[i] * c->s2nat, w, ds;
            if (c->norm == QKV_NORM_RELU) {
                w = x < 0.0 ? 0.0 : x;
                ds = w > 0.0 ? dr[i] : 0.0;
                if (cnt) {
                    double n = percol ? cnt[i] : cnt[r];
                    w /= n;
                    ds /= n;
                }
            } else {
                w = 1.0 / (1.0 + exp(-x));
                ds = dr[i] * w * (1.0 - w);
            }
            sr[i] = (float)w;
            dr[i] = (float)ds;
        }
    }
}

/* Rows r < n of acc (stride ld) times mul into dst rows (stride ldd), with
 * the cosine chain rule against the caller's rows x (stride ldx) if given. */
static void store_grad(float *dst, int64_t ldd, const float *acc, int64_t ld, int n, int64_t D,
                       double mul, const float *x, int64_t ldx) {
    for (int r = 0; r < n; r++) {
        float *d = dst + r * ldd;
        const float *s = acc + r * ld;
        for (int64_t t = 0; t < D; t++) d[t] = (float)(s[t] * mul);
        if (x) fa_normalise_backward(x + r * ldx, d, D);
    }
}

/* ---- the key-block pass -------------------------------------------------- */

/* Key blocks of FA_BK (128), as the forward's tiles. 64 halves a step's
 * working set (~200 -> ~100 KB) and was 1-4% faster on AVX2 at n = 2048, but
 * reuses the streamed Q and dO rows over half as many keys: 2-9% slower at
 * n = 4096 on both ISAs (one core each, side by side), even at 1024. */

static void kv_block(bwd_ctx *f, bwd_ws *w, int64_t b, int64_t kv, int64_t kb, float *dqp_c) {
    const fa_ctx *c = &f->c;
    const qkv_kernels *K = c->K;
    const int64_t D = c->D, Dv = c->Dv, j0 = kb * FA_BK;
    const int nkr = (int)(c->nk - j0 < FA_BK ? c->nk - j0 : FA_BK);
    const int rows = (int)fa_round_up(nkr, 8);
    const int softmax = c->norm == QKV_NORM_SOFTMAX;
    const size_t ldD = (size_t)f->ldD, ldDv = (size_t)f->ldDv;

    copy_rows(w->xb, c->k + ((b * c->nk + j0) * c->Hkv + kv) * D, c->ldk, nkr, rows, D);
    copy_rows(w->yb, c->v + ((b * c->nk + j0) * c->Hkv + kv) * Dv, c->ldv, nkr, rows, Dv);
    memset(w->acc1, 0, (size_t)rows * ldD * sizeof(float));
    memset(w->acc2, 0, (size_t)rows * ldDv * sizeof(float));
    for (int r = nkr; r < rows; r++) w->a[r] = w->e[r] = 0;

    for (int64_t g = 0; g < c->G; g++) {
        const int64_t h = kv * c->G + g, bh = b * c->H + h;
        for (int64_t qb = 0; qb < f->nqb; qb++) {
            const int64_t blo = f->BLO[b * f->nqb + qb], bhi = f->BHI[b * f->nqb + qb];
            if (bhi <= j0 || blo >= j0 + nkr || bhi <= blo) continue;
            const int64_t i0 = qb * FA_BQ;
            const int nqc = (int)(c->nq - i0 < FA_BQ ? c->nq - i0 : FA_BQ);
            const int64_t *lo = f->LO + b * c->nq + i0, *hi = f->HI + b * c->nq + i0;
            int interior = 1;
            for (int i = 0; i < nqc && interior; i++) interior = lo[i] <= j0 && hi[i] >= j0 + nkr;
            K->qk(w->xb, (size_t)D, f->qt + bh * f->qt_stride + (i0 / QKV_PANEL) * D * QKV_PANEL,
                  (size_t)D, (size_t)rows, (size_t)nqc, w->s, FA_BQ);
            K->qk(w->yb, (size_t)Dv, f->dot + bh * f->dot_stride + (i0 / QKV_PANEL) * Dv * QKV_PANEL,
                  (size_t)Dv, (size_t)rows, (size_t)nqc, w->dp, FA_BQ);
            fa_scores_cols(c, w->s, FA_BQ, h, i0, nqc, j0, nkr, lo, hi, interior, w->a, w->e, w->dcap,
                           FA_BQ);
            const int64_t at = bh * c->nq + i0;
            if (fa_dropout_on(c)) fa_dropout_cols(c, b, h, i0, nqc, j0, nkr, w->dp, w->dz, FA_BQ);
            if (softmax) {
                K->bwd_softmax(w->s, w->dp, FA_BQ, (size_t)nkr, (size_t)nqc, c->sc,
                               f->M2 ? f->M2 + at : NULL, f->L2 + at, f->Dd + at, 1);
            } else {
                elementwise_bwd(c, w->s, w->dp, FA_BQ, nkr, nqc, w->a, w->e,
                                f->cnt ? f->cnt + at : NULL, 1);
            }
            if (fa_dropout_on(c)) fa_dropout_mul(w->s, w->dz, FA_BQ, nkr, nqc);
            for (int r = nkr; r < rows; r++)
                for (int i = 0; i < nqc; i++) w->s[r * FA_BQ + i] = w->dp[r * FA_BQ + i] = 0.0f;
            if (f->dbias) {
                float *db = f->dbias + (c->bias_head_stride ? h * c->bias_head_stride : 0) + i0 * c->nk + j0;
                for (int r = 0; r < nkr; r++)
                    for (int i = w->a[r]; i < w->e[r]; i++) db[(int64_t)i * c->nk + r] += w->dp[r * FA_BQ + i];
            }
            if (f->drel) fa_posbias_grad_tile(c, f->drel, kb % f->chunks, b, h, w->dp, FA_BQ, i0, j0, nkr, w->a, w->e);
            if (c->cap > 0.0)
                for (int r = 0; r < nkr; r++)
                    for (int i = w->a[r]; i < w->e[r]; i++) w->dp[r * FA_BQ + i] *= w->dcap[r * FA_BQ + i];
            const float *qrows = f->qr + (bh * c->nq + i0) * D;
            const float *dorows = f->dor + (bh * c->nq + i0) * Dv;
            /* A tile every key sees whole goes to the kernel at once (its own
             * row tiling: 6 rows on AVX2), else 8 keys at a time with their
             * ranges. Padding keys (r >= nkr) have zero weights and are never
             * stored. */
            if (interior) {
                K->pv(w->acc2, ldDv, NULL, w->s, FA_BQ, 1, dorows, (size_t)Dv, (size_t)nqc, (size_t)Dv,
                      (size_t)rows);
                K->pv(w->acc1, ldD, NULL, w->dp, FA_BQ, 1, qrows, (size_t)D, (size_t)nqc, (size_t)D,
                      (size_t)rows);
            } else {
                for (int r0 = 0; r0 < rows; r0 += 8) {
                    int nv = nkr - r0 < 8 ? nkr - r0 : 8;
                    fa_pv_zeros(c, w->acc2 + r0 * ldDv, ldDv, NULL, w->s + r0 * FA_BQ, FA_BQ, 1, dorows,
                                 (size_t)Dv, (size_t)Dv, w->a + r0, w->e + r0, nv);
                    fa_pv_zeros(c, w->acc1 + r0 * ldD, ldD, NULL, w->dp + r0 * FA_BQ, FA_BQ, 1, qrows,
                                 (size_t)D, (size_t)D, w->a + r0, w->e + r0, nv);
                }
            }
            /* dQ (this block's part) = dS K, reading the key-major dS tile
             * transposed (row stride 1, column stride FA_BQ). */
            const int qrows8 = (int)fa_round_up(nqc, 8);
            for (int i = 0; i < nqc; i++) fa_tile_range(lo[i], hi[i], j0, nkr, &w->qa[i], &w->qe[i]);
            memset(w->dqt, 0, (size_t)qrows8 * ldD * sizeof(float));
            if (interior)
                K->pv(w->dqt, ldD, NULL, w->dp, 1, FA_BQ, w->xb, (size_t)D, (size_t)nkr, (size_t)D,
                      (size_t)qrows8);
            else
                for (int g0 = 0; g0 < qrows8; g0 += 8)
                    fa_pv_zeros(c, w->dqt + g0 * ldD, ldD, NULL, w->dp + g0, 1, FA_BQ, w->xb, (size_t)D,
                                 (size_t)D, w->qa + g0, w->qe + g0, nqc - g0 < 8 ? nqc - g0 : 8);
            float *dst = dqp_c + (bh * c->nq + i0) * D;
            for (int i = 0; i < nqc; i++)
                for (int64_t t = 0; t < D; t++) dst[i * D + t] += w->dqt[i * ldD + t];
        }
    }
    const int64_t off_k = ((b * c->nk + j0) * c->Hkv + kv) * D;
    store_grad(f->dk + off_k, c->ldk, w->acc1, (int64_t)ldD, nkr, D, c->scale_nat,
               c->p->d.score == QKV_SCORE_COSINE ? c->k_in + off_k : NULL, c->ldk);
    store_grad(f->dv + ((b * c->nk + j0) * c->Hkv + kv) * Dv, c->ldv, w->acc2, (int64_t)ldDv, nkr,
               Dv, 1.0, NULL, 0);
}

/* Unit: chunk ch of one (b, kv head), or of all of them with a bias
 * gradient; its partial dQ rows are zeroed here and only written by it. */
static void kv_unit(void *vf, int64_t u, int t) {
    bwd_ctx *f = vf;
    const fa_ctx *c = &f->c;
    bwd_ws w;
    bwd_ws_layout(f, f->ws + (size_t)t * f->ws_stride, &w);
    const int64_t C = f->chunks, ch = u % C, per_chunk = c->B * c->H * c->nq * c->D;
    float *dqp_c = f->dqp + ch * per_chunk;
    if (f->dbias) {
        memset(dqp_c, 0, (size_t)per_chunk * sizeof(float));
        for (int64_t b = 0; b < c->B; b++)
            for (int64_t kv = 0; kv < c->Hkv; kv++)
                for (int64_t kb = ch; kb < f->nkb; kb += C) kv_block(f, &w, b, kv, kb, dqp_c);
    } else {
        int64_t bk = u / C, b = bk / c->Hkv, kv = bk % c->Hkv;
        for (int64_t g = 0; g < c->G; g++)
            memset(dqp_c + ((b * c->H + kv * c->G + g) * c->nq) * c->D, 0,
                   (size_t)(c->nq * c->D) * sizeof(float));
        for (int64_t kb = ch; kb < f->nkb; kb += C) kv_block(f, &w, b, kv, kb, dqp_c);
    }
}

/* dQ = scale * (sum of the chunks' partials, in chunk order), then the
 * cosine chain rule; unit = one (b, h). */
static void dq_unit(void *vf, int64_t u, int t) {
    (void)t;
    bwd_ctx *f = vf;
    const fa_ctx *c = &f->c;
    const int64_t b = u / c->H, h = u % c->H, D = c->D, per_chunk = c->B * c->H * c->nq * D;
    const int cosine = c->p->d.score == QKV_SCORE_COSINE;
    for (int64_t i = 0; i < c->nq; i++) {
        const float *src = f->dqp + (u * c->nq + i) * D;
        int64_t at = ((b * c->nq + i) * c->H + h) * D;
        float *dst = f->dq + at;
        for (int64_t d = 0; d < D; d++) {
            float acc = src[d];
            for (int64_t ch = 1; ch < f->chunks; ch++) acc += src[ch * per_chunk + d];
            dst[d] = (float)(acc * c->scale_nat);
        }
        if (cosine) fa_normalise_backward(c->q_in + at, dst, D);
    }
}

/* ---- preparation ------------------------------------------------------- */

/* Per-row tables of query row i of (b, h): lse in base 2, D = rowsum(dO * O),
 * visible count (after prepare_ranges). */
static void prepare_row(bwd_ctx *f, int64_t b, int64_t h, int64_t i) {
    const fa_ctx *c = &f->c;
    const int64_t row = (b * c->H + h) * c->nq + i;
    if (f->L2) {
        if (!f->M2) {
            float l = f->lse[row];
            f->L2[row] = l == -INFINITY ? INFINITY : (float)((double)l * FA_LOG2E);
        }
        const float *o = f->out + ((b * c->nq + i) * c->H + h) * c->Dv;
        const float *g = f->dout + ((b * c->nq + i) * c->H + h) * c->Dv;
        /* Four partial sums in double: independent chains (one would wait
         * on the add latency per element), same order every call. */
        double acc[4] = {0.0, 0.0, 0.0, 0.0};
        int64_t t = 0;
        for (; t + 4 <= c->Dv; t += 4)
            for (int k = 0; k < 4; k++) acc[k] += (double)o[t + k] * g[t + k];
        for (; t < c->Dv; t++) acc[t % 4] += (double)o[t] * g[t];
        f->Dd[row] = (float)((acc[0] + acc[1]) + (acc[2] + acc[3]));
    }
    if (f->cnt) {
        int64_t lo = f->LO[b * c->nq + i], hi = f->HI[b * c->nq + i], n = hi > lo ? hi - lo : 0;
        if (c->bias && n > 0) {
            const float *br = c->bias + h * c->bias_head_stride + i * c->nk;
            n = 0;
            for (int64_t j = lo; j < hi; j++) n += br[j] != -INFINITY;
        }
        f->cnt[row] = (float)n;
    }
}

/* Unit: FA_PACK_ROWS query rows of one batch, every head: their per-row
 * tables, Q and dO packed in panels (and copied to contiguous rows). Rows
 * outer, heads inner: O, dO and Q are read in order (see fa_pack_block). */
static void pack_unit(void *vf, int64_t u, int t) {
    (void)t;
    bwd_ctx *f = vf;
    const fa_ctx *c = &f->c;
    const int64_t nrb = (c->nq + FA_PACK_ROWS - 1) / FA_PACK_ROWS, b = u / nrb, r0 = u % nrb * FA_PACK_ROWS;
    const int64_t r1 = c->nq - r0 < FA_PACK_ROWS ? c->nq : r0 + FA_PACK_ROWS;
    for (int64_t i = r0; i < r1; i++)
        for (int64_t h = 0; h < c->H; h++) prepare_row(f, b, h, i);
    fa_pack_block(c->K, f->qt, f->qt_stride, f->qr_own, c->q, c->ldq, b, c->nq, c->H, c->D, r0, r1, 0);
    fa_pack_block(c->K, f->dot, f->dot_stride, f->dor_own, f->dout, c->ldo, b, c->nq, c->H, c->Dv, r0, r1, 0);
}

/* The key range of every query and the union range of every query block
 * (cheap: per batch, not per head). */
static void prepare_ranges(bwd_ctx *f) {
    const fa_ctx *c = &f->c;
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t qb = 0; qb < f->nqb; qb++) {
            int64_t i0 = qb * FA_BQ, blo, bhi;
            int n = (int)(c->nq - i0 < FA_BQ ? c->nq - i0 : FA_BQ);
            int any = fa_query_ranges(c, b, i0, n, f->LO + b * c->nq + i0, f->HI + b * c->nq + i0, &blo, &bhi);
            f->BLO[b * f->nqb + qb] = any ? blo : 0;
            f->BHI[b * f->nqb + qb] = any ? bhi : 0;
        }
}

/* Whether a caller's log-sum-exp pins the weights down to float accuracy:
 * P = 2^(sc s - L2) with L2 = lse log2(e) rounded to float, whose rounding
 * (half an ulp: at most 2^-18 for |L2| < 128) is, times ln 2, the relative
 * error it puts into P (< 2.7e-6, the size of the float rounding of the
 * logits themselves at these magnitudes). Beyond that (logits of ~90 and more) the
 * error grows with |lse| and at |lse| ~ 1e30 the exponent is off by far more
 * than 128: the backward then recomputes the statistics itself. */
#define FA_LSE_PRECISE 128.0
static int lse_precise(const float *lse, int64_t rows) {
    for (int64_t i = 0; i < rows; i++) {
        double l2 = (double)lse[i] * FA_LOG2E;
        if (isfinite(l2) && fabs(l2) >= FA_LSE_PRECISE) return 0;
    }
    return 1;
}

qkv_status qkv_fast_backward(const qkv_plan *p, const float *q, const float *k, const float *v,
                             const float *out, const float *lse, const float *dout,
                             const qkv_attn_grads *g) {
    bwd_ctx f;
    memset(&f, 0, sizeof f);
    fa_ctx *c = &f.c;
    fa_ctx_init(c, p, q, k, v);
    qkv_status st = fa_posbias_init(c);
    if (st != QKV_OK) return st;
    f.dout = dout;
    f.dq = g->dq;
    f.dk = g->dk;
    f.dv = g->dv;
    f.dbias = p->d.bias_kind != QKV_BIAS_NONE ? g->dbias : NULL;
    f.nqb = (c->nq + FA_BQ - 1) / FA_BQ;
    f.nkb = (c->nk + FA_BK - 1) / FA_BK;
    f.ldD = fa_round_up(c->D, 16);
    f.ldDv = fa_round_up(c->Dv, 16);
    const int softmax = c->norm == QKV_NORM_SOFTMAX;
    const int64_t rows_q = c->B * c->H * c->nq;

    float *o_tmp = NULL, *lse_tmp = NULL;
    void *normed = NULL;
    if (softmax && (!out || !lse || !lse_precise(lse, rows_q))) {
        /* Run the forward (without out: O, for D; without lse: the lse) and
         * keep its own statistics (row max and log2 of the row sum). With a
         * precise lse they are dropped again, so that the result does not
         * depend on whether the caller passed out and lse (bitwise); else
         * the weights are recomputed from them: P = 2^(sc (s - m) - lg),
         * the difference first, exactly as the forward weighs. */
        if (!out) o_tmp = fa_alloc((size_t)p->n_o_elems * sizeof(float));
        if (!lse) lse_tmp = fa_alloc((size_t)rows_q * sizeof(float));
        f.M2 = fa_alloc((size_t)rows_q * sizeof(float));
        f.L2 = fa_alloc((size_t)rows_q * sizeof(float));
        if ((!out && !o_tmp) || (!lse && !lse_tmp) || !f.M2 || !f.L2) st = QKV_ERR_OUT_OF_MEMORY;
        if (st == QKV_OK) st = qkv_fast_forward_stats(p, q, k, v, o_tmp, lse_tmp, f.M2, f.L2);
        if (!out) out = o_tmp;
        if (!lse) lse = lse_tmp;
        if (st == QKV_OK && lse_precise(lse, rows_q)) {
            fa_free(f.M2); /* L2 is refilled from lse (prepare_row) */
            f.M2 = NULL;
        }
    }
    if (st == QKV_OK && p->d.score == QKV_SCORE_COSINE) st = fa_normalise_inputs(c, &normed);

    const int64_t npq = (c->nq + QKV_PANEL - 1) / QKV_PANEL;
    f.qt_stride = npq * QKV_PANEL * c->D;
    f.dot_stride = npq * QKV_PANEL * c->Dv;
    f.chunks = f.nkb < FA_DQ_CHUNKS ? f.nkb : FA_DQ_CHUNKS;
    int64_t units1 = f.dbias ? f.chunks : c->B * c->Hkv * f.chunks, units2 = c->B * c->H;
    int64_t umax = units1 > units2 ? units1 : units2;
    int threads = c->threads < umax ? c->threads : (int)umax;
    if (st == QKV_OK) {
        f.LO = fa_alloc((size_t)(c->B * c->nq) * sizeof(int64_t));
        f.HI = fa_alloc((size_t)(c->B * c->nq) * sizeof(int64_t));
        f.BLO = fa_alloc((size_t)(c->B * f.nqb) * sizeof(int64_t));
        f.BHI = fa_alloc((size_t)(c->B * f.nqb) * sizeof(int64_t));
        if (softmax) {
            if (!f.L2) f.L2 = fa_alloc((size_t)rows_q * sizeof(float));
            f.Dd = fa_alloc((size_t)rows_q * sizeof(float));
        }
        if (c->norm == QKV_NORM_RELU && c->relu_div) f.cnt = fa_alloc((size_t)rows_q * sizeof(float));
        /* The large buffers in one block (freed as f.qt): one block of the
         * same size at every call stays mapped in malloc between calls,
         * where several were unmapped and faulted in afresh each time.
         * Rows are copied only when the layout interleaves heads. */
        f.ws_stride = bwd_ws_layout(&f, NULL, NULL);
        size_t b_qt = qkv_round64((size_t)(f.qt_stride * c->B * c->H) * sizeof(float));
        size_t b_dot = qkv_round64((size_t)(f.dot_stride * c->B * c->H) * sizeof(float));
        size_t b_dqp = qkv_round64((size_t)(f.chunks * rows_q * c->D) * sizeof(float));
        size_t b_qr = c->H > 1 ? qkv_round64((size_t)(c->nq * c->D * c->B * c->H) * sizeof(float)) : 0;
        size_t b_dor = c->H > 1 ? qkv_round64((size_t)(c->nq * c->Dv * c->B * c->H) * sizeof(float)) : 0;
        unsigned char *blk = fa_alloc(b_qt + b_dot + b_dqp + b_qr + b_dor + f.ws_stride * (size_t)threads);
        if (blk) {
            f.qt = (float *)(void *)blk;
            f.dot = (float *)(void *)(blk + b_qt);
            f.dqp = (float *)(void *)(blk + b_qt + b_dot);
            if (c->H > 1) {
                f.qr_own = (float *)(void *)(blk + b_qt + b_dot + b_dqp);
                f.dor_own = (float *)(void *)(blk + b_qt + b_dot + b_dqp + b_qr);
            }
            f.ws = blk + b_qt + b_dot + b_dqp + b_qr + b_dor;
        }
        f.qr = c->H > 1 ? f.qr_own : c->q;
        f.dor = c->H > 1 ? f.dor_own : dout;
        const int want_drel = p->d.rel_table && g->d_rel_table;
        if (want_drel) f.drel = fa_posbias_grad_alloc(c, f.chunks);
        if (!f.LO || !f.HI || !f.BLO || !f.BHI || (softmax && (!f.L2 || !f.Dd)) || (want_drel && !f.drel) ||
            (c->norm == QKV_NORM_RELU && c->relu_div && !f.cnt) || !blk)
            st = QKV_ERR_OUT_OF_MEMORY;
    }
    if (st == QKV_OK) {
        f.out = out;
        f.lse = lse;
        prepare_ranges(&f);
        qkv_parallel_for(threads, c->B * ((c->nq + FA_PACK_ROWS - 1) / FA_PACK_ROWS), pack_unit, &f);
        if (f.dbias) memset(f.dbias, 0, (size_t)p->n_bias_elems * sizeof(float));
        qkv_parallel_for(threads, units1, kv_unit, &f);
        qkv_parallel_for(threads, units2, dq_unit, &f);
        if (f.drel) fa_posbias_grad_reduce(c, f.drel, f.chunks, g->d_rel_table);
    }
    fa_free(f.LO); fa_free(f.HI); fa_free(f.BLO); fa_free(f.BHI);
    fa_free(f.L2); fa_free(f.M2); fa_free(f.Dd); fa_free(f.cnt);
    fa_free(f.qt); /* and dot, dqp, qr_own, dor_own, ws: one block */
    fa_free(normed); fa_free(o_tmp); fa_free(lse_tmp); fa_free(f.drel);
    fa_posbias_free(c);
    return st;
}
