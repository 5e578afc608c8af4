/* The bf16 fast backward: FlashAttention-2's backward (Dao 2023, Algorithm
 * 2) with its five tile products on bf16 dot products (AVX512-BF16
 * vdpbf16ps, float accumulation) and the softmax gradient in float.
 *
 * The weights are recomputed from Q, K and the forward's float lse,
 * P = 2^(sc s - lse log2 e), never stored; D_i = rowsum(dO_i * O_i) in
 * double. For each block of 128 keys of a (b, kv head), and every block of
 * 64 queries of every query head sharing it, on key-major tiles:
 *   S^T  = K Q^T                (bf16 products, float sums)
 *   dP^T = V dO^T               (same)
 *   P    = exp2(...), dS = P (dP - D)     in float
 *   dV  += P^T dO               (P rounded to bf16)
 *   dK  += dS^T Q               (dS rounded to bf16)
 *   dQ^T += K^T dS              (dS rounded to bf16) into a partial dQ
 * dK and dV of the key block are accumulated in float and rounded once.
 * As in the float32 backward (fast_bwd.c) the partial dQ belongs to a chunk
 * of key blocks (kb mod C, C = min(key blocks, 4), a function of the shape
 * only), one work unit = one chunk of one (b, kv head) owning its partial
 * rows, and a last pass sums the C partials in chunk order: no two threads
 * ever add into the same memory, so results are bitwise identical for any
 * thread count. The scale is applied to the finished dQ and dK in float.
 *
 * Layouts (kernels/half.h: bf16 pairs in 32-bit words), once per call:
 * per (b, kv head) K and V rows in pairs along D (resp. D_v), and K^T in
 * pairs of consecutive keys; per (b, head) Q and dO in 32-query panels
 * (pairs along D, D_v) and in pairs of consecutive queries. Memory: about
 * four times the bf16 inputs, plus C float copies of dQ: O(n (H + H_kv) D),
 * never n x n.
 *
 * Masks: tiles no query sees are skipped; in the others a masked (key,
 * query) gets s = -inf, so P = 0 and dS = 0 exactly, and the products add
 * exact zeros for it. That is only harmless when every multiplied value is
 * finite, so this path runs only when q, k, v and dout hold no inf or NaN
 * and lse no NaN (checked while packing, which reads every element anyway);
 * otherwise it returns QKV_ERR_UNSUPPORTED and the portable path (which
 * never multiplies a masked key) runs.
 *
 * Applies when the forward's fast path does (half_fwd.c: bf16, scaled-dot or
 * dot score with a positive scale, softmax, no bias, soft-cap, ALiBi, T5
 * buckets or dropout), with every mask (causal, windows, key lengths, packed
 * sequences), GQA and n_q != n_k. */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "attn/half.h"
#include "core/half.h"
#include "core/threads.h"
#include "kernels/kernels.h"

#define HB_BK 128 /* keys per block (tile rows) */
#define HB_BQ 64  /* queries per block (tile columns) */
#define HB_CHUNKS 4
#define HB_LOG2E 1.4426950408889634

typedef struct hb_ctx {
    const qkv_plan *p;
    const qkv_half_kernels *HK;
    int64_t B, nq, nk, H, Hkv, G, D, Dv;
    int64_t dp2, dvp2;  /* pairs along D, D_v: ceil(D / 2), ceil(D_v / 2) */
    int64_t ldD, ldDv;  /* D, D_v padded to 16 (rows of the pair layouts, accumulators) */
    int64_t D8;         /* D padded to 8 (rows of K^T and of the partial dQ^T) */
    int64_t nkp, nqp;   /* n_k, n_q padded to 32 */
    int64_t nqb, nkb, C;
    float sc;           /* q.k -> base-2 logit */
    double scale;       /* d(logit)/d(q.k) */
    const uint16_t *q, *k, *v, *out, *dout;
    const float *lse;
    uint16_t *dq, *dk, *dv;
    uint32_t *kr, *vr, *kt;                /* per (b, kv head) */
    uint32_t *qpan, *dopan, *qpair, *dopair; /* per (b, head) */
    int64_t kr_st, vr_st, kt_st, qpan_st, dopan_st, qpair_st, dopair_st;
    float *L2, *Dd;                        /* [B, H, n_q] */
    int64_t *LO, *HI;                      /* [B, n_q] */
    int64_t *BLO, *BHI;                    /* [B, nqb]; BHI = 0: no key */
    float *dqt;                            /* [C, B, H, nqb, D8, 64] partial dQ^T */
    int64_t dqt_st;                        /* per (b, head): nqb * D8 * 64 */
    unsigned char *ws;
    size_t ws_stride;
    atomic_int bad;                        /* a non-finite input was seen */
} hb_ctx;

typedef struct hb_ws {
    float *s, *dp;       /* key-major tiles [HB_BK, HB_BQ] */
    uint32_t *pp;        /* P or dS in pairs of queries [HB_BK, HB_BQ / 2] */
    uint32_t *kd;        /* dS in pairs of keys, 32-query panels */
    float *acck, *accv;  /* dK, dV of the key block [HB_BK, ldD / ldDv] */
} hb_ws;

static int64_t up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

static size_t ws_layout(const hb_ctx *c, unsigned char *base, hb_ws *w) {
    size_t at = 0;
    QKV_CARVE(s, float, HB_BK * HB_BQ);
    QKV_CARVE(dp, float, HB_BK * HB_BQ);
    QKV_CARVE(pp, uint32_t, HB_BK * HB_BQ / 2);
    QKV_CARVE(kd, uint32_t, HB_BK * HB_BQ / 2);
    QKV_CARVE(acck, float, HB_BK * c->ldD);
    QKV_CARVE(accv, float, HB_BK * c->ldDv);
    return at;
}


/* The loops below are written without branches inside (selects, fixed
 * trip counts) so that the compiler vectorizes them: at short sequences
 * (n ~ 100, D 32) packing and unpacking cost as much as the products. */

/* 1 if one of x[0 .. n) is inf or NaN (all exponent bits set). */
static int any_nonfinite(const uint16_t *x, int64_t n) {
    uint16_t acc = 0;
    for (int64_t t = 0; t < n; t++) acc |= (uint16_t)((x[t] & 0x7f80u) + 0x0080u);
    return (acc & 0x8000u) != 0;
}

/* rows [0, n) of a [n, ld] bf16 matrix (row r at x + r * ld, D columns):
 * pairs along the row:  dst[r * w + t] = (x[r][2t], x[r][2t+1]), r < npad, t < w,
 * zero past the row's end and past n. Returns 1 if a value is inf or NaN. */
static int pack_rows(uint32_t *dst, int64_t w, const uint16_t *x, int64_t ld, int64_t n, int64_t npad,
                     int64_t D) {
    int bad = 0;
    for (int64_t r = 0; r < npad; r++) {
        uint32_t *d = dst + r * w;
        if (r >= n) {
            memset(d, 0, (size_t)w * sizeof *d);
            continue;
        }
        bad |= any_nonfinite(x + r * ld, D);
        qkv_half_pairs_of_row(d, w, x + r * ld, D);
    }
    return bad;
}

/* sum_x a[x] b[x] of two bf16 rows: each product exact in float, the sum in
 * double over four interleaved partial sums (added in a fixed order). */
static double dot_bf16(const uint16_t *a, const uint16_t *b, int64_t n) {
    double s[4] = {0.0, 0.0, 0.0, 0.0};
    int64_t x = 0;
    for (; x + 4 <= n; x += 4)
        for (int k = 0; k < 4; k++) s[k] += (double)(qkv_bf16_to_f32(a[x + k]) * qkv_bf16_to_f32(b[x + k]));
    for (; x < n; x++) s[0] += (double)(qkv_bf16_to_f32(a[x]) * qkv_bf16_to_f32(b[x]));
    return (s[0] + s[1]) + (s[2] + s[3]);
}

static void pack_kv_unit(void *vc, int64_t u, int t) {
    (void)t;
    hb_ctx *c = vc;
    const int64_t b = u / c->Hkv, kv = u % c->Hkv;
    const uint16_t *k0 = c->k + (b * c->nk * c->Hkv + kv) * c->D;
    const uint16_t *v0 = c->v + (b * c->nk * c->Hkv + kv) * c->Dv;
    int bad = pack_rows(c->kr + u * c->kr_st, c->dp2, k0, c->Hkv * c->D, c->nk, c->nkp, c->D);
    bad |= pack_rows(c->vr + u * c->vr_st, c->dvp2, v0, c->Hkv * c->Dv, c->nk, c->nkp, c->Dv);
    /* K^T in pairs of keys, per key block (rows of 64 words, so that the
     * 8 rows one product reads are close, not n_k apart):
     * kt[(kb * D8 + d) * 64 + u] = (K[128 kb + 2u][d], K[128 kb + 2u + 1][d]) */
    /* 16 pairs of keys x 64 dimensions at a time: interleaved, then transposed */
    uint32_t *kt = c->kt + u * c->kt_st, tmp[16 * 64];
    const int64_t ldk = c->Hkv * c->D, HP = HB_BK / 2;
    for (int64_t kb = 0; kb < c->nkb; kb++) {
        uint32_t *blk = kt + kb * c->D8 * HP;
        for (int64_t u0 = 0; u0 < HP; u0 += 16)
            for (int64_t d0 = 0; d0 < c->D; d0 += 64) {
                const int64_t dc = c->D - d0 < 64 ? c->D - d0 : 64;
                for (int64_t q = 0; q < 16; q++) {
                    const int64_t j = 2 * (kb * HP + u0 + q);
                    if (j < c->nk)
                        c->HK->interleave(tmp + q * 64, k0 + j * ldk + d0, j + 1 < c->nk ? k0 + (j + 1) * ldk + d0 : NULL,
                                          (size_t)dc);
                    else
                        memset(tmp + q * 64, 0, (size_t)dc * sizeof *tmp);
                }
                c->HK->words_t(blk + d0 * HP + u0, (size_t)HP, tmp, 64, 16, (size_t)dc);
            }
        if (c->D8 > c->D) memset(blk + c->D * HP, 0, (size_t)((c->D8 - c->D) * HP) * sizeof *blk);
    }
    if (bad) atomic_store(&c->bad, 1);
}

static void pack_q_unit(void *vc, int64_t u, int t) {
    (void)t;
    hb_ctx *c = vc;
    const int64_t b = u / c->H, h = u % c->H, D = c->D, Dv = c->Dv;
    const uint16_t *q0 = c->q + (b * c->nq * c->H + h) * D;
    const uint16_t *g0 = c->dout + (b * c->nq * c->H + h) * Dv;
    const uint16_t *o0 = c->out + (b * c->nq * c->H + h) * Dv;
    int bad = 0;
    for (int64_t i = 0; i < c->nq; i++)
        bad |= any_nonfinite(q0 + i * c->H * D, D) | any_nonfinite(g0 + i * c->H * Dv, Dv);
    qkv_half_pack_panels(c->HK, c->qpan + u * c->qpan_st, c->dp2, q0, c->H * D, c->nq, c->nqp, D);
    qkv_half_pack_panels(c->HK, c->dopan + u * c->dopan_st, c->dvp2, g0, c->H * Dv, c->nq, c->nqp, Dv);
    qkv_half_pack_row_pairs(c->HK, c->qpair + u * c->qpair_st, c->ldD, q0, c->H * D, c->nq, c->nqp, D);
    qkv_half_pack_row_pairs(c->HK, c->dopair + u * c->dopair_st, c->ldDv, g0, c->H * Dv, c->nq, c->nqp, Dv);
    for (int64_t i = 0; i < c->nq; i++) {
        const int64_t row = u * c->nq + i;
        const float l = c->lse[row];
        if (isnan(l)) bad = 1;
        c->L2[row] = l == -INFINITY ? INFINITY : (float)((double)l * HB_LOG2E);
        c->Dd[row] = (float)dot_bf16(o0 + i * c->H * Dv, g0 + i * c->H * Dv, Dv);
    }
    if (bad) atomic_store(&c->bad, 1);
}

/* ---- the key-block pass -------------------------------------------------- */

static void kv_block(hb_ctx *c, hb_ws *w, int64_t b, int64_t kv, int64_t kb, float *dqt_ch) {
    const qkv_half_kernels *HK = c->HK;
    const int64_t D = c->D, Dv = c->Dv, j0 = kb * HB_BK, ukv = b * c->Hkv + kv;
    const int nkr = (int)(c->nk - j0 < HB_BK ? c->nk - j0 : HB_BK);
    const int rows = (int)up(nkr, 8);
    const size_t ldD = (size_t)c->ldD, ldDv = (size_t)c->ldDv, ldp = HB_BQ / 2;
    const uint32_t *krb = c->kr + ukv * c->kr_st + j0 * c->dp2;
    const uint32_t *vrb = c->vr + ukv * c->vr_st + j0 * c->dvp2;
    const uint32_t *ktb = c->kt + ukv * c->kt_st + kb * c->D8 * (HB_BK / 2);
    memset(w->acck, 0, (size_t)rows * ldD * sizeof(float));
    memset(w->accv, 0, (size_t)rows * ldDv * sizeof(float));

    for (int64_t g = 0; g < c->G; g++) {
        const int64_t h = kv * c->G + g, bh = b * c->H + h;
        for (int64_t qb = 0; qb < c->nqb; qb++) {
            const int64_t blo = c->BLO[b * c->nqb + qb], bhi = c->BHI[b * c->nqb + qb];
            if (bhi <= j0 || blo >= j0 + nkr || bhi <= blo) continue;
            const int64_t i0 = qb * HB_BQ;
            const int nqc = (int)(c->nq - i0 < HB_BQ ? c->nq - i0 : HB_BQ);
            const int64_t *lo = c->LO + b * c->nq + i0, *hi = c->HI + b * c->nq + i0;
            const size_t np = (size_t)(nqc + 31) / 32, ncp = (size_t)(nqc + 1) / 2;
            /* only the keys some query of the block sees: rows ra .. rb - 1
             * of the key block (ra a multiple of 8), a tile of nt rows */
            const int ra = (int)(blo > j0 ? (blo - j0) / 8 * 8 : 0), rb = (int)(bhi - j0 < nkr ? bhi - j0 : nkr);
            const int nr = rb - ra, nt = (int)up(nr, 8);
            const int64_t jb = j0 + ra;
            HK->qk(krb + (size_t)ra * c->dp2, (size_t)c->dp2, c->qpan + bh * c->qpan_st + (i0 / 32) * c->dp2 * 32,
                   (size_t)c->dp2, (size_t)nt, np, w->s, HB_BQ);
            HK->qk(vrb + (size_t)ra * c->dvp2, (size_t)c->dvp2, c->dopan + bh * c->dopan_st + (i0 / 32) * c->dvp2 * 32,
                   (size_t)c->dvp2, (size_t)nt, np, w->dp, HB_BQ);
            /* masked (key, query): s = -inf, row by row over the block's
             * queries (their ranges clamped to the tile; queries past n_q
             * and keys past n_k are zero padding, never turned into weights) */
            int32_t xs[HB_BQ], ys[HB_BQ];
            int edge = 0;
            for (int i = 0; i < HB_BQ; i++) {
                int64_t x = 0, y = nr;
                if (i < nqc) {
                    x = lo[i] - jb;
                    y = hi[i] - jb;
                    if (x < 0) x = 0;
                    if (y > nr) y = nr;
                    if (y < x) x = y = 0;
                }
                xs[i] = (int32_t)x;
                ys[i] = (int32_t)y;
                edge |= x > 0 || y < nr;
            }
            if (edge)
                for (int r = 0; r < nr; r++) {
                    float *sr = w->s + (size_t)r * HB_BQ;
                    for (int i = 0; i < HB_BQ; i++) sr[i] = r < xs[i] || r >= ys[i] ? -INFINITY : sr[i];
                }
            const int64_t at = bh * c->nq + i0;
            HK->bwd_softmax(w->s, w->dp, HB_BQ, (size_t)nr, (size_t)nqc, c->sc, c->L2 + at, c->Dd + at);
            /* the tile's rows past rb: keys of the block this query block does
             * not see; dS = 0 there for the dQ product */
            if (nt > nr) memset(w->dp + (size_t)nr * HB_BQ, 0, (size_t)(nt - nr) * HB_BQ * sizeof(float));
            /* dV += P^T dO */
            HK->pack_p(w->pp, ldp, w->s, HB_BQ, (size_t)nr, ncp);
            const uint32_t *dop = c->dopair + bh * c->dopair_st + (i0 / 2) * c->ldDv;
            HK->pv_acc(w->accv + (size_t)ra * ldDv, ldDv, w->pp, ldp, dop, ldDv, ncp, ldDv, (size_t)nr);
            /* dK += dS^T Q */
            HK->pack_p(w->pp, ldp, w->dp, HB_BQ, (size_t)nr, ncp);
            const uint32_t *qpr = c->qpair + bh * c->qpair_st + (i0 / 2) * c->ldD;
            HK->pv_acc(w->acck + (size_t)ra * ldD, ldD, w->pp, ldp, qpr, ldD, ncp, ldD, (size_t)nr);
            /* dQ^T += K^T dS, into this chunk's partial */
            HK->pack_rowpairs(w->kd, w->dp, HB_BQ, (size_t)(nt / 2), np);
            HK->qk_acc(ktb + ra / 2, HB_BK / 2, w->kd, (size_t)(nt / 2), (size_t)c->D8, np,
                       dqt_ch + bh * c->dqt_st + qb * c->D8 * HB_BQ, HB_BQ);
        }
    }
    for (int r = 0; r < nkr; r++) {
        uint16_t *dk = c->dk + ((b * c->nk + j0 + r) * c->Hkv + kv) * D;
        uint16_t *dv = c->dv + ((b * c->nk + j0 + r) * c->Hkv + kv) * Dv;
        const float *ak = w->acck + (size_t)r * ldD, *av = w->accv + (size_t)r * ldDv;
        for (int64_t x = 0; x < D; x++) dk[x] = qkv_f32_to_bf16((float)(ak[x] * c->scale));
        for (int64_t x = 0; x < Dv; x++) dv[x] = qkv_f32_to_bf16(av[x]);
    }
}

/* Unit: chunk ch of one (b, kv head); zeroes and owns its partial dQ^T rows
 * of the heads sharing the kv head. */
static void kv_unit(void *vc, int64_t u, int t) {
    hb_ctx *c = vc;
    hb_ws w;
    ws_layout(c, c->ws + (size_t)t * c->ws_stride, &w);
    const int64_t ch = u % c->C, bk = u / c->C, b = bk / c->Hkv, kv = bk % c->Hkv;
    float *dqt_ch = c->dqt + ch * (c->B * c->H * c->dqt_st);
    for (int64_t g = 0; g < c->G; g++)
        memset(dqt_ch + (b * c->H + kv * c->G + g) * c->dqt_st, 0, (size_t)c->dqt_st * sizeof(float));
    for (int64_t kb = ch; kb < c->nkb; kb += c->C) kv_block(c, &w, b, kv, kb, dqt_ch);
}

/* dQ = scale * (the chunks' partials summed in chunk order); unit = (b, h). */
static void dq_unit(void *vc, int64_t u, int t) {
    (void)t;
    hb_ctx *c = vc;
    const int64_t b = u / c->H, h = u % c->H, per = c->B * c->H * c->dqt_st;
    for (int64_t qb = 0; qb < c->nqb; qb++) {
        const int64_t i0 = qb * HB_BQ;
        const int nqc = (int)(c->nq - i0 < HB_BQ ? c->nq - i0 : HB_BQ);
        c->HK->dq_out(c->dq + ((b * c->nq + i0) * c->H + h) * c->D, (size_t)(c->H * c->D),
                      c->dqt + u * c->dqt_st + qb * c->D8 * HB_BQ, HB_BQ, (size_t)per, (size_t)c->C, (size_t)c->D,
                      (size_t)nqc, c->scale);
    }
}

/* Sum of byte counts, each rounded to 64; 0 on overflow. */
static size_t carve_total(const size_t *n, int cnt) {
    size_t t = 0;
    for (int i = 0; i < cnt; i++) {
        if (n[i] > SIZE_MAX / 2 || t > SIZE_MAX / 2) return 0;
        t += qkv_round64(n[i]);
    }
    return t;
}

qkv_status qkv_half_fast_backward(const qkv_plan *p, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                                  const uint16_t *out, const float *lse, const uint16_t *dout, uint16_t *dq,
                                  uint16_t *dk, uint16_t *dv) {
    const qkv_attn_desc *d = &p->d;
    if (d->dtype != QKV_BF16 || !qkv_half_fast_available() || d->check_finite) return QKV_ERR_UNSUPPORTED;
    if ((d->score != QKV_SCORE_SCALED_DOT && d->score != QKV_SCORE_DOT) || !(d->scale > 0.0) ||
        d->norm != QKV_NORM_SOFTMAX || d->softcap != 0.0 || d->bias_kind != QKV_BIAS_NONE ||
        d->alibi_slopes || d->rel_table || d->dropout != 0.0)
        return QKV_ERR_UNSUPPORTED;
    /* the forward's outputs, recomputed by the bf16 forward when not given */
    uint16_t *o_tmp = NULL;
    float *l_tmp = NULL;
    qkv_status st = QKV_OK;
    if (!out || !lse) {
        o_tmp = qkv_alloc((size_t)(p->n_o_elems ? p->n_o_elems : 1) * sizeof(uint16_t));
        l_tmp = qkv_alloc((size_t)(p->n_lse_elems ? p->n_lse_elems : 1) * sizeof(float));
        st = o_tmp && l_tmp ? qkv_half_fast_forward(p, q, k, v, o_tmp, l_tmp) : QKV_ERR_OUT_OF_MEMORY;
        out = o_tmp;
        lse = l_tmp;
    }
    hb_ctx c;
    memset(&c, 0, sizeof c);
    c.p = p;
    c.HK = qkv_half_kernels_active();
    c.B = d->batch; c.nq = d->n_q; c.nk = d->n_k; c.H = d->heads; c.Hkv = d->heads_kv;
    c.G = p->group; c.D = d->dim; c.Dv = d->dim_v;
    c.dp2 = (c.D + 1) / 2; c.dvp2 = (c.Dv + 1) / 2;
    c.ldD = up(c.D, 16); c.ldDv = up(c.Dv, 16); c.D8 = up(c.D, 8);
    c.nkp = up(c.nk, 32); c.nqp = up(c.nq, 32);
    c.nqb = (c.nq + HB_BQ - 1) / HB_BQ;
    c.nkb = (c.nk + HB_BK - 1) / HB_BK;
    c.C = c.nkb < HB_CHUNKS ? c.nkb : HB_CHUNKS;
    c.scale = d->score == QKV_SCORE_DOT ? 1.0 : d->scale;
    c.sc = (float)(c.scale * HB_LOG2E);
    c.q = q; c.k = k; c.v = v; c.out = out; c.dout = dout; c.lse = lse;
    c.dq = dq; c.dk = dk; c.dv = dv;
    atomic_init(&c.bad, 0);
    c.kr_st = c.nkp * c.dp2;
    c.vr_st = c.nkp * c.dvp2;
    c.kt_st = c.nkb * c.D8 * (HB_BK / 2);
    c.qpan_st = c.nqp * c.dp2;
    c.dopan_st = c.nqp * c.dvp2;
    c.qpair_st = c.nqp / 2 * c.ldD;
    c.dopair_st = c.nqp / 2 * c.ldDv;
    c.dqt_st = c.nqb * c.D8 * HB_BQ;
    const size_t nkvu = (size_t)(c.B * c.Hkv), nbh = (size_t)(c.B * c.H), rows_q = nbh * (size_t)c.nq;
    const int64_t units = c.B * c.Hkv * c.C;
    int threads = qkv_threads_resolve(d->threads);
    if (threads > QKV_MAX_THREADS) threads = QKV_MAX_THREADS;
    int tkv = threads < units ? threads : (int)(units > 0 ? units : 1);
    c.ws_stride = ws_layout(&c, NULL, NULL);
    /* sizes: each a small multiple of a tensor the plan size-checked */
    size_t sz[15] = {
        nkvu * (size_t)c.kr_st * 4, nkvu * (size_t)c.vr_st * 4, nkvu * (size_t)c.kt_st * 4,
        nbh * (size_t)c.qpan_st * 4, nbh * (size_t)c.dopan_st * 4, nbh * (size_t)c.qpair_st * 4,
        nbh * (size_t)c.dopair_st * 4, rows_q * 4, rows_q * 4,
        (size_t)(c.B * c.nq) * 8, (size_t)(c.B * c.nq) * 8, (size_t)(c.B * c.nqb) * 8, (size_t)(c.B * c.nqb) * 8,
        (size_t)c.C * nbh * (size_t)c.dqt_st * 4, c.ws_stride * (size_t)tkv};
    size_t total = carve_total(sz, 15);
    unsigned char *mem = NULL;
    if (st == QKV_OK) {
        mem = total ? qkv_alloc(total + 64) : NULL;
        if (!mem) st = QKV_ERR_OUT_OF_MEMORY;
    }
    if (st == QKV_OK) {
        unsigned char *at = (unsigned char *)(((uintptr_t)mem + 63) & ~(uintptr_t)63);
        void *ptr[15];
        for (int i = 0; i < 15; i++) {
            ptr[i] = at;
            at += qkv_round64(sz[i]);
        }
        c.kr = ptr[0]; c.vr = ptr[1]; c.kt = ptr[2];
        c.qpan = ptr[3]; c.dopan = ptr[4]; c.qpair = ptr[5]; c.dopair = ptr[6];
        c.L2 = ptr[7]; c.Dd = ptr[8];
        c.LO = ptr[9]; c.HI = ptr[10]; c.BLO = ptr[11]; c.BHI = ptr[12];
        c.dqt = ptr[13]; c.ws = ptr[14];
        qkv_parallel_for(threads, (int64_t)nkvu, pack_kv_unit, &c);
        qkv_parallel_for(threads, (int64_t)nbh, pack_q_unit, &c);
        if (atomic_load(&c.bad)) st = QKV_ERR_UNSUPPORTED;
    }
    if (st == QKV_OK) {
        for (int64_t b = 0; b < c.B; b++)
            for (int64_t qb = 0; qb < c.nqb; qb++) {
                int64_t i0 = qb * HB_BQ, lo = INT64_MAX, hi = 0;
                int n = (int)(c.nq - i0 < HB_BQ ? c.nq - i0 : HB_BQ);
                for (int r = 0; r < n; r++) {
                    int64_t *l = c.LO + b * c.nq + i0 + r, *h = c.HI + b * c.nq + i0 + r;
                    qkv_plan_key_range(p, b, i0 + r, l, h);
                    if (*l < *h) {
                        if (*l < lo) lo = *l;
                        if (*h > hi) hi = *h;
                    }
                }
                c.BLO[b * c.nqb + qb] = hi > 0 ? lo : 0;
                c.BHI[b * c.nqb + qb] = hi;
            }
        if (units > 0) qkv_parallel_for(tkv, units, kv_unit, &c);
        else memset(c.dqt, 0, sz[13]);
        /* keys of a batch with n_k = 0 do not exist; with n_k > 0 every dK,
         * dV row was written by its block */
        qkv_parallel_for(threads, (int64_t)nbh, dq_unit, &c);
    }
    qkv_free(mem);
    qkv_free(o_tmp);
    qkv_free(l_tmp);
    return st;
}
