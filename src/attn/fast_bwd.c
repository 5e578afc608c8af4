/* Fast backward (FlashAttention-2, Dao 2023, Algorithm 2, on CPU): the
 * weights are recomputed tile by tile from Q, K and the saved log-sum-exp
 * (P = exp(s - lse)), never stored; D_i = rowsum(dO_i * O_i).
 *
 * Two passes, so that no two threads ever add into the same memory and the
 * result is bitwise identical for any thread count:
 *  1. key blocks (unit = one block of FA_BK keys of one (b, kv head); with a
 *     bias gradient, one key block of every (b, kv head), so that each dbias
 *     column block has one owner summing over batch and heads in a fixed
 *     order): for every query block of every query head sharing the kv head,
 *     S^T = K Q^T, dP^T = V dO^T, P, dS = P (dP - D), then dV += P^T dO and
 *     dK += dS^T Q into the block's accumulators;
 *  2. query blocks (unit = one block of FA_BQ queries of one (b, h)): S, dP,
 *     dS again and dQ += dS K.
 * Pass 2 recomputes two products that pass 1 had (7 tile products instead of
 * 5): the price of determinism without atomics or per-thread dQ copies.
 * Masks skip tiles as in the forward. The scale (and 1/temperature) is
 * applied once to the finished dQ and dK rows; cosine scores apply the
 * normalisation's chain rule there too. */
#include <math.h>
#include <string.h>

#include "attn/fast.h"
#include "attn/fast_common.h"
#include "core/threads.h"

typedef struct bwd_ctx {
    fa_ctx c;
    const float *dout;
    float *dq, *dk, *dv, *dbias;
    int64_t nqb, nkb;
    int64_t *LO, *HI;     /* [B, n_q] key range of every query */
    int64_t *BLO, *BHI;   /* [B, nqb] union range of every query block (BHI = 0: empty) */
    float *L2;            /* [B, H, n_q] lse in base 2 (+inf for an empty row) */
    float *Dd;            /* [B, H, n_q] rowsum(dO * O) (softmax) */
    float *cnt;           /* [B, H, n_q] visible keys (ReLU divided by count) */
    float *kt, *vt, *qt, *dot; /* packed panels */
    const float *kr, *qr, *dor; /* contiguous rows per head: K [nk, D], Q [nq, D], dO [nq, Dv]
                                   (the inputs themselves when one head: already so) */
    float *kr_own, *qr_own, *dor_own;
    int64_t kt_stride, vt_stride, qt_stride, dot_stride;
    int64_t ldD, ldDv;    /* accumulator row strides */
    unsigned char *ws;
    size_t ws_stride;
} bwd_ctx;

typedef struct bwd_ws {
    float *xb, *yb;       /* block copies: K and V rows (pass 1), Q and dO rows (pass 2) */
    float *s, *dp, *dcap; /* tiles */
    float *acc1, *acc2;   /* dK, dV (pass 1) or dQ (pass 2) accumulators */
    int *a, *e;
} bwd_ws;

#define BT (FA_BK > FA_BQ ? FA_BK : FA_BQ) /* rows of the biggest block */

static size_t bwd_ws_layout(const bwd_ctx *f, unsigned char *base, bwd_ws *w) {
    size_t at = 0;
#define CARVE(field, type, count)                                   \
    do {                                                            \
        if (w) w->field = (type *)(void *)(base + at);              \
        at += fa_round64((size_t)(count) * sizeof(type));           \
    } while (0)
    CARVE(xb, float, BT * f->c.D);
    CARVE(yb, float, BT * f->c.Dv);
    CARVE(s, float, FA_BK * FA_BQ);
    CARVE(dp, float, FA_BK * FA_BQ);
    CARVE(dcap, float, FA_BK * FA_BQ);
    CARVE(acc1, float, BT * f->ldD);
    CARVE(acc2, float, BT * f->ldDv);
    CARVE(a, int, BT);
    CARVE(e, int, BT);
#undef CARVE
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

/* ---- pass 1: key blocks -------------------------------------------------- */

static void kv_block(bwd_ctx *f, bwd_ws *w, int64_t b, int64_t kv, int64_t kb) {
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
            size_t np = (size_t)(nqc + QKV_PANEL - 1) / QKV_PANEL;
            K->qk(w->xb, (size_t)D, f->qt + bh * f->qt_stride + (i0 / QKV_PANEL) * D * QKV_PANEL,
                  (size_t)D, (size_t)rows, np, w->s, FA_BQ);
            K->qk(w->yb, (size_t)Dv, f->dot + bh * f->dot_stride + (i0 / QKV_PANEL) * Dv * QKV_PANEL,
                  (size_t)Dv, (size_t)rows, np, w->dp, FA_BQ);
            fa_scores_cols(c, w->s, FA_BQ, h, i0, nqc, j0, nkr, lo, hi, interior, w->a, w->e, w->dcap,
                           FA_BQ);
            const int64_t at = bh * c->nq + i0;
            if (softmax) {
                K->bwd_softmax(w->s, w->dp, FA_BQ, (size_t)nkr, (size_t)nqc, c->sc, f->L2 + at,
                               f->Dd + at, 1);
            } else {
                elementwise_bwd(c, w->s, w->dp, FA_BQ, nkr, nqc, w->a, w->e,
                                f->cnt ? f->cnt + at : NULL, 1);
            }
            for (int r = nkr; r < rows; r++)
                for (int i = 0; i < nqc; i++) w->s[r * FA_BQ + i] = w->dp[r * FA_BQ + i] = 0.0f;
            if (f->dbias) {
                float *db = f->dbias + (c->bias_head_stride ? h * c->bias_head_stride : 0) + i0 * c->nk + j0;
                for (int r = 0; r < nkr; r++)
                    for (int i = w->a[r]; i < w->e[r]; i++) db[(int64_t)i * c->nk + r] += w->dp[r * FA_BQ + i];
            }
            if (c->cap > 0.0)
                for (int r = 0; r < nkr; r++)
                    for (int i = w->a[r]; i < w->e[r]; i++) w->dp[r * FA_BQ + i] *= w->dcap[r * FA_BQ + i];
            const float *qrows = f->qr + (bh * c->nq + i0) * D;
            const float *dorows = f->dor + (bh * c->nq + i0) * Dv;
            for (int r0 = 0; r0 < rows; r0 += 8) {
                int nv = nkr - r0 < 8 ? nkr - r0 : 8;
                fa_pv_ranges(c, w->acc2 + r0 * ldDv, ldDv, NULL, w->s + r0 * FA_BQ, FA_BQ, 1, dorows,
                             (size_t)Dv, (size_t)Dv, w->a + r0, w->e + r0, nv);
                fa_pv_ranges(c, w->acc1 + r0 * ldD, ldD, NULL, w->dp + r0 * FA_BQ, FA_BQ, 1, qrows,
                             (size_t)D, (size_t)D, w->a + r0, w->e + r0, nv);
            }
        }
    }
    const int64_t off_k = ((b * c->nk + j0) * c->Hkv + kv) * D;
    store_grad(f->dk + off_k, c->ldk, w->acc1, (int64_t)ldD, nkr, D, c->scale_nat,
               c->p->d.score == QKV_SCORE_COSINE ? c->k_in + off_k : NULL, c->ldk);
    store_grad(f->dv + ((b * c->nk + j0) * c->Hkv + kv) * Dv, c->ldv, w->acc2, (int64_t)ldDv, nkr,
               Dv, 1.0, NULL, 0);
}

static void kv_unit(void *vf, int64_t u, int t) {
    bwd_ctx *f = vf;
    bwd_ws w;
    bwd_ws_layout(f, f->ws + (size_t)t * f->ws_stride, &w);
    if (f->dbias) {
        for (int64_t b = 0; b < f->c.B; b++)
            for (int64_t kv = 0; kv < f->c.Hkv; kv++) kv_block(f, &w, b, kv, u);
    } else {
        int64_t kb = u % f->nkb, bk = u / f->nkb;
        kv_block(f, &w, bk / f->c.Hkv, bk % f->c.Hkv, kb);
    }
}

/* ---- pass 2: query blocks ------------------------------------------------ */

static void q_unit(void *vf, int64_t u, int t) {
    bwd_ctx *f = vf;
    const fa_ctx *c = &f->c;
    const qkv_kernels *K = c->K;
    bwd_ws w;
    bwd_ws_layout(f, f->ws + (size_t)t * f->ws_stride, &w);
    const int64_t qb = u % f->nqb, bh = u / f->nqb, h = bh % c->H, b = bh / c->H, kv = h / c->G;
    const int64_t i0 = qb * FA_BQ, D = c->D, Dv = c->Dv;
    const int nr = (int)(c->nq - i0 < FA_BQ ? c->nq - i0 : FA_BQ);
    const int rows = (int)fa_round_up(nr, 8);
    const int softmax = c->norm == QKV_NORM_SOFTMAX;
    const size_t ldD = (size_t)f->ldD;
    const int64_t blo = f->BLO[b * f->nqb + qb], bhi = f->BHI[b * f->nqb + qb];
    const int64_t *lo = f->LO + b * c->nq + i0, *hi = f->HI + b * c->nq + i0;
    const int64_t off_q = ((b * c->nq + i0) * c->H + h) * D;

    memset(w.acc1, 0, (size_t)rows * ldD * sizeof(float));
    if (bhi > blo) {
        copy_rows(w.xb, c->q + off_q, c->ldq, nr, rows, D);
        copy_rows(w.yb, f->dout + ((b * c->nq + i0) * c->H + h) * Dv, c->ldo, nr, rows, Dv);
        for (int r = nr; r < rows; r++) w.a[r] = w.e[r] = 0;
        const float *ktb = f->kt + (b * c->Hkv + kv) * f->kt_stride;
        const float *vtb = f->vt + (b * c->Hkv + kv) * f->vt_stride;
        const float *krows = f->kr + (b * c->Hkv + kv) * c->nk * D;
        const int64_t at = bh * c->nq + i0;
        for (int64_t kt = blo / QKV_PANEL * QKV_PANEL; kt < bhi; kt += FA_BK) {
            int ncols = (int)(bhi - kt < FA_BK ? bhi - kt : FA_BK);
            size_t np = (size_t)(ncols + QKV_PANEL - 1) / QKV_PANEL;
            K->qk(w.xb, (size_t)D, ktb + (kt / QKV_PANEL) * D * QKV_PANEL, (size_t)D, (size_t)rows,
                  np, w.s, FA_BK);
            K->qk(w.yb, (size_t)Dv, vtb + (kt / QKV_PANEL) * Dv * QKV_PANEL, (size_t)Dv,
                  (size_t)rows, np, w.dp, FA_BK);
            fa_scores_rows(c, w.s, FA_BK, h, i0, nr, kt, ncols, lo, hi, w.a, w.e, w.dcap, FA_BK);
            if (softmax)
                K->bwd_softmax(w.s, w.dp, FA_BK, (size_t)nr, (size_t)ncols, c->sc, f->L2 + at,
                               f->Dd + at, 0);
            else
                elementwise_bwd(c, w.s, w.dp, FA_BK, nr, ncols, w.a, w.e, f->cnt ? f->cnt + at : NULL, 0);
            for (int r = nr; r < rows; r++)
                for (int j = 0; j < ncols; j++) w.dp[r * FA_BK + j] = 0.0f;
            if (c->cap > 0.0)
                for (int r = 0; r < nr; r++)
                    for (int j = w.a[r]; j < w.e[r]; j++) w.dp[r * FA_BK + j] *= w.dcap[r * FA_BK + j];
            for (int r0 = 0; r0 < rows; r0 += 8)
                fa_pv_ranges(c, w.acc1 + r0 * ldD, ldD, NULL, w.dp + r0 * FA_BK, FA_BK, 1,
                             krows + kt * D, (size_t)D, (size_t)D, w.a + r0, w.e + r0,
                             nr - r0 < 8 ? nr - r0 : 8);
        }
    }
    store_grad(f->dq + off_q, c->ldq, w.acc1, (int64_t)ldD, nr, D, c->scale_nat,
               c->p->d.score == QKV_SCORE_COSINE ? c->q_in + off_q : NULL, c->ldq);
}

/* ---- preparation ------------------------------------------------------- */

static void pack_unit(void *vf, int64_t u, int t) {
    (void)t;
    bwd_ctx *f = vf;
    const fa_ctx *c = &f->c;
    const int64_t nkv = c->B * c->Hkv, nh = c->B * c->H;
    if (u < nkv) {
        int64_t b = u / c->Hkv, kv = u % c->Hkv;
        fa_pack_panels(f->kt + u * f->kt_stride, c->k + (b * c->nk * c->Hkv + kv) * c->D, c->nk,
                       c->ldk, c->D, 1.0f);
        fa_pack_panels(f->vt + u * f->vt_stride, c->v + (b * c->nk * c->Hkv + kv) * c->Dv, c->nk,
                       c->ldv, c->Dv, 1.0f);
        if (f->kr_own) fa_copy_rows(f->kr_own + u * c->nk * c->D, c->k + (b * c->nk * c->Hkv + kv) * c->D, c->nk, c->ldk,
                     c->D);
    } else if (u < nkv + nh) {
        u -= nkv;
        int64_t b = u / c->H, h = u % c->H;
        fa_pack_panels(f->qt + u * f->qt_stride, c->q + (b * c->nq * c->H + h) * c->D, c->nq, c->ldq,
                       c->D, 1.0f);
        fa_pack_panels(f->dot + u * f->dot_stride, f->dout + (b * c->nq * c->H + h) * c->Dv, c->nq,
                       c->ldo, c->Dv, 1.0f);
        if (f->qr_own) fa_copy_rows(f->qr_own + u * c->nq * c->D, c->q + (b * c->nq * c->H + h) * c->D, c->nq, c->ldq, c->D);
        if (f->dor_own) fa_copy_rows(f->dor_own + u * c->nq * c->Dv, f->dout + (b * c->nq * c->H + h) * c->Dv, c->nq, c->ldo,
                     c->Dv);
    }
}

/* Per-row tables: ranges, lse in base 2, D = rowsum(dO * O), visible counts. */
static void prepare_rows(bwd_ctx *f, const float *out, const float *lse) {
    const fa_ctx *c = &f->c;
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t qb = 0; qb < f->nqb; qb++) {
            int64_t i0 = qb * FA_BQ, blo, bhi;
            int n = (int)(c->nq - i0 < FA_BQ ? c->nq - i0 : FA_BQ);
            int any = fa_query_ranges(c, b, i0, n, f->LO + b * c->nq + i0, f->HI + b * c->nq + i0, &blo, &bhi);
            f->BLO[b * f->nqb + qb] = any ? blo : 0;
            f->BHI[b * f->nqb + qb] = any ? bhi : 0;
        }
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < c->H; h++)
            for (int64_t i = 0; i < c->nq; i++) {
                int64_t row = (b * c->H + h) * c->nq + i;
                if (f->L2) {
                    float l = lse[row];
                    f->L2[row] = l == -INFINITY ? INFINITY : (float)((double)l * FA_LOG2E);
                    const float *o = out + ((b * c->nq + i) * c->H + h) * c->Dv;
                    const float *g = f->dout + ((b * c->nq + i) * c->H + h) * c->Dv;
                    double acc = 0.0;
                    for (int64_t t = 0; t < c->Dv; t++) acc += (double)o[t] * g[t];
                    f->Dd[row] = (float)acc;
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
}

qkv_status qkv_fast_backward(const qkv_plan *p, const float *q, const float *k, const float *v,
                             const float *out, const float *lse, const float *dout,
                             const qkv_attn_grads *g) {
    bwd_ctx f;
    memset(&f, 0, sizeof f);
    fa_ctx *c = &f.c;
    fa_ctx_init(c, p, q, k, v);
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

    float *qn = NULL, *kn = NULL, *o_tmp = NULL, *lse_tmp = NULL;
    qkv_status st = QKV_OK;
    if (softmax && (!out || !lse)) {
        /* The weights are recomputed from the log-sum-exp, and D from O. */
        o_tmp = fa_alloc((size_t)p->n_o_elems * sizeof(float));
        lse_tmp = fa_alloc((size_t)rows_q * sizeof(float));
        if (!o_tmp || !lse_tmp) st = QKV_ERR_OUT_OF_MEMORY;
        if (st == QKV_OK) st = qkv_fast_forward(p, q, k, v, o_tmp, NULL, lse_tmp);
        out = o_tmp;
        lse = lse_tmp;
    }
    if (st == QKV_OK && p->d.score == QKV_SCORE_COSINE) st = fa_normalise_inputs(c, &qn, &kn);

    const int64_t npk = (c->nk + QKV_PANEL - 1) / QKV_PANEL, npq = (c->nq + QKV_PANEL - 1) / QKV_PANEL;
    f.kt_stride = npk * QKV_PANEL * c->D;
    f.vt_stride = npk * QKV_PANEL * c->Dv;
    f.qt_stride = npq * QKV_PANEL * c->D;
    f.dot_stride = npq * QKV_PANEL * c->Dv;
    int64_t units1 = f.dbias ? f.nkb : c->B * c->Hkv * f.nkb, units2 = c->B * c->H * f.nqb;
    int64_t umax = units1 > units2 ? units1 : units2;
    int threads = c->threads < umax ? c->threads : (int)umax;
    if (st == QKV_OK) {
        f.LO = fa_alloc((size_t)(c->B * c->nq) * sizeof(int64_t));
        f.HI = fa_alloc((size_t)(c->B * c->nq) * sizeof(int64_t));
        f.BLO = fa_alloc((size_t)(c->B * f.nqb) * sizeof(int64_t));
        f.BHI = fa_alloc((size_t)(c->B * f.nqb) * sizeof(int64_t));
        if (softmax) {
            f.L2 = fa_alloc((size_t)rows_q * sizeof(float));
            f.Dd = fa_alloc((size_t)rows_q * sizeof(float));
        }
        if (c->norm == QKV_NORM_RELU && c->relu_div) f.cnt = fa_alloc((size_t)rows_q * sizeof(float));
        f.kt = fa_alloc((size_t)(f.kt_stride * c->B * c->Hkv) * sizeof(float));
        f.vt = fa_alloc((size_t)(f.vt_stride * c->B * c->Hkv) * sizeof(float));
        f.qt = fa_alloc((size_t)(f.qt_stride * c->B * c->H) * sizeof(float));
        f.dot = fa_alloc((size_t)(f.dot_stride * c->B * c->H) * sizeof(float));
        /* Page faults on fresh workspace are a visible cost for small
         * problems: copy rows only when the layout interleaves heads. */
        if (c->Hkv > 1) f.kr_own = fa_alloc((size_t)(c->nk * c->D * c->B * c->Hkv) * sizeof(float));
        if (c->H > 1) f.qr_own = fa_alloc((size_t)(c->nq * c->D * c->B * c->H) * sizeof(float));
        if (c->H > 1) f.dor_own = fa_alloc((size_t)(c->nq * c->Dv * c->B * c->H) * sizeof(float));
        f.kr = c->Hkv > 1 ? f.kr_own : c->k;
        f.qr = c->H > 1 ? f.qr_own : c->q;
        f.dor = c->H > 1 ? f.dor_own : dout;
        f.ws_stride = bwd_ws_layout(&f, NULL, NULL);
        f.ws = fa_alloc(f.ws_stride * (size_t)threads);
        if (!f.LO || !f.HI || !f.BLO || !f.BHI || (softmax && (!f.L2 || !f.Dd)) ||
            (c->norm == QKV_NORM_RELU && c->relu_div && !f.cnt) || !f.kt || !f.vt || !f.qt || !f.dot ||
            !f.kr || !f.qr || !f.dor || !f.ws)
            st = QKV_ERR_OUT_OF_MEMORY;
    }
    if (st == QKV_OK) {
        prepare_rows(&f, out, lse);
        qkv_parallel_for(threads, c->B * (c->Hkv + c->H), pack_unit, &f);
        if (f.dbias) memset(f.dbias, 0, (size_t)p->n_bias_elems * sizeof(float));
        qkv_parallel_for(threads, units1, kv_unit, &f);
        qkv_parallel_for(threads, units2, q_unit, &f);
    }
    fa_free(f.LO); fa_free(f.HI); fa_free(f.BLO); fa_free(f.BHI);
    fa_free(f.L2); fa_free(f.Dd); fa_free(f.cnt);
    fa_free(f.kt); fa_free(f.vt); fa_free(f.qt); fa_free(f.dot);
    fa_free(f.kr_own); fa_free(f.qr_own); fa_free(f.dor_own);
    fa_free(f.ws);
    fa_free(qn); fa_free(kn); fa_free(o_tmp); fa_free(lse_tmp);
    return st;
}
