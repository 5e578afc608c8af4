/* The fast float32 additive score (attn/fast_additive.h).
 *
 * Per (batch b, query head h): U = Q W1_h^T [n_q, A] and V' = W2_h K^T
 * stored key-major [A, n_k rounded up to 16] (zero padding), both by the
 * GEMM. A query row meets its visible keys 16 at a time: the kernel gives
 * the 16 raw scores (and, in the backward, the tanh values t [A][16]),
 * then soft-cap, bias and mask turn them into logits (-inf = masked).
 *
 * Forward: units of 32 query rows of one (b, h), in any order; each keeps
 * per row the running max m and sum l of the online softmax and its output
 * row, rescaled when the max grows; P V goes through the attention PV
 * kernel over runs of visible keys (a masked key's value is never read).
 * lse = m + log l. The attn output, when asked for, holds the logits while
 * the row runs and becomes weights at its end.
 *
 * Backward: with P_ij recomputed from the lse (softmax) and
 * D_i = dO_i . O_i, dP_ij = dO_i . V_j, dS_ij the normaliser's chain rule
 * (times 1 - tanh^2 of the cap when soft-capped):
 *   key pass   (units: b, kv head, 64 keys; every b and kv head in one
 *               unit when dbias is asked for, so that each dbias element has
 *               one owner): dV_j += P_ij dO_i, dV'_j += dS_ij w (1 - t^2),
 *               dbias_ij += dS_ij;
 *   query pass (units: b, h, 32 rows): dU_i += dS_ij w (1 - t^2) and
 *               partial dw += dS_ij t per unit, summed in unit order;
 * then by GEMM dq = dU W1, dk = sum over the group's heads of dV'^T W2,
 * dW1 = sum_b dU^T Q, dW2 = sum_b dV' K. Each pass recomputes t: no n x n
 * or n x n x A buffer. */
#include "attn/fast_additive.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "attn/fast_common.h" /* fa_alloc, fa_free, fa_round_up */
#include "core/threads.h"
#include "gemm/gemm.h"
#include "kernels/kernels.h"

#define AD_BQ 32           /* query rows per forward / query-pass unit */
#define AD_BK 64           /* keys per key-pass unit (a multiple of AD_L) */
#define AD_L QKV_ADD_KEYS  /* keys per kernel call */

typedef struct ad_ctx {
    fa_ctx f; /* sizes, threads, bias, inputs and the attention kernels (pv) */
    const qkv_additive_kernels *K;
    const qkv_gemm_kernel *KG;
    int64_t A, nkp, nqb, nkb;
    const float *w1, *w2, *w;
    float cap;
    int relu_div;
    int64_t *lo, *hi; /* [B n_q]: each query's visible keys */
    float *U, *Vt;    /* [B H][n_q][A], [B H][A][nkp] */
    float *out, *attn, *lse; /* forward outputs */
    /* backward */
    const float *dout, *o_in, *lse_in;
    float *Dd, *cnt; /* [B H n_q]: dO . O (softmax), visible keys (relu / count) */
    float *Vv;       /* [B Hkv][Dv][nkp]: V key-major */
    float *dU, *dVt; /* as U, Vt */
    float *dv, *dbias, *dwp; /* dwp [B H nqb][A]: the query pass's dw partials */
    float *dq, *dk, *dw1, *dw2;
    int want_dw;
    int64_t n_kpass; /* key-pass units (the query pass follows them) */
    unsigned char *scratch;
    size_t scratch_bytes; /* per thread */
    atomic_int failed;
} ad_ctx;

int qkv_fast_additive_supported(const qkv_plan *p) {
    const qkv_attn_desc *d = &p->d;
    return d->dtype == QKV_F32 && d->score == QKV_SCORE_ADDITIVE && !d->alibi_slopes && !d->rel_table &&
           d->dropout == 0.0;
}

static float *ad_scratch(const ad_ctx *c, int thread) {
    return (float *)(void *)(c->scratch + (size_t)thread * c->scratch_bytes);
}

static void ad_ctx_init(ad_ctx *c, const qkv_plan *p, const float *q, const float *k, const float *v) {
    const qkv_attn_desc *d = &p->d;
    memset(c, 0, sizeof *c);
    fa_ctx_init(&c->f, p, q, k, v);
    c->K = qkv_additive_kernels_active();
    c->KG = qkv_gemm_kernel_active();
    c->A = d->additive_dim;
    c->nkp = fa_round_up(d->n_k, AD_L);
    c->nqb = (d->n_q + AD_BQ - 1) / AD_BQ;
    c->nkb = (d->n_k + AD_BK - 1) / AD_BK;
    c->w1 = d->additive_w1;
    c->w2 = d->additive_w2;
    c->w = d->additive_w;
    c->cap = (float)d->softcap;
    c->relu_div = d->norm == QKV_NORM_RELU && d->relu_divide_by_count;
    atomic_init(&c->failed, 0);
}

/* Workspace: the byte offsets of the pieces of one allocation. */
typedef struct ad_layout {
    size_t total;
    int overflow;
} ad_layout;

static size_t ad_take(ad_layout *l, size_t elem, int64_t a, int64_t b, int64_t c) {
    int64_t f[3] = {a, b, c}, n;
    size_t at = l->total;
    if (!qkv_count_ok(&n, elem, 3, f) || (size_t)n * elem > SIZE_MAX / 2 - l->total) {
        l->overflow = 1;
        return 0;
    }
    l->total += qkv_round64((size_t)n * elem);
    return at;
}

static void ad_key_ranges(ad_ctx *c) {
    const int64_t nq = c->f.nq;
    for (int64_t b = 0; b < c->f.B; b++)
        for (int64_t i = 0; i < nq; i++) qkv_plan_key_range(c->f.p, b, i, &c->lo[b * nq + i], &c->hi[b * nq + i]);
}

/* Logits of row i of (b, h) at keys c0 .. c0+15: s (-inf outside [lo, hi)
 * and where the bias is -inf), tc = tanh(raw / cap) when soft-capped, t
 * the kernel's tanh values (NULL: not kept). */
static void ad_logits(const ad_ctx *c, int64_t b, int64_t h, int64_t i, int64_t lo, int64_t hi, int64_t c0, float *t,
                      float *s, float *tc) {
    const int64_t bh = b * c->f.H + h;
    c->K->scores(c->U + (bh * c->f.nq + i) * c->A, c->w + h * c->A, c->Vt + bh * c->A * c->nkp + c0, (size_t)c->nkp,
                 (size_t)c->A, s, t);
    if (c->cap > 0.0f) {
        for (int x = 0; x < AD_L; x++) tc[x] = s[x] / c->cap;
        c->K->tanh_n(tc, AD_L);
        for (int x = 0; x < AD_L; x++) s[x] = c->cap * tc[x];
    }
    const float *brow = c->f.bias ? c->f.bias + h * c->f.bias_head_stride + i * c->f.nk : NULL;
    for (int x = 0; x < AD_L; x++) {
        int64_t j = c0 + x;
        if (j < lo || j >= hi)
            s[x] = -INFINITY;
        else if (brow)
            s[x] = brow[j] == -INFINITY ? -INFINITY : s[x] + brow[j];
    }
}

/* ---- projections ---------------------------------------------------------- */

/* Units [0, B H): U and V' of (b, h); then [B H, B H + B Hkv) when Vv is
 * wanted: V of (b, kv head) key-major. */
static void ad_proj_unit(void *vc, int64_t unit, int thread) {
    ad_ctx *c = vc;
    (void)thread;
    const int64_t BH = c->f.B * c->f.H, nkp = c->nkp, nk = c->f.nk;
    if (unit < BH) {
        const int64_t b = unit / c->f.H, h = unit % c->f.H, hk = h / c->f.G, A = c->A, D = c->f.D;
        float *vt = c->Vt + unit * A * nkp;
        qkv_status s1 = qkv_gemm_run(c->KG, 0, 1, c->f.nq, A, D, 1.0f, c->f.q + b * c->f.nq * c->f.H * D + h * D,
                                     c->f.H * D, c->w1 + h * A * D, D, 0.0f, c->U + unit * c->f.nq * A, A, 1);
        qkv_status s2 = qkv_gemm_run(c->KG, 0, 1, A, nk, D, 1.0f, c->w2 + h * A * D, D,
                                     c->f.k + b * nk * c->f.Hkv * D + hk * D, c->f.Hkv * D, 0.0f, vt, nkp, 1);
        if (s1 != QKV_OK || s2 != QKV_OK) atomic_store(&c->failed, 1);
        for (int64_t a = 0; a < A; a++) memset(vt + a * nkp + nk, 0, (size_t)(nkp - nk) * sizeof(float));
    } else {
        const int64_t u = unit - BH, b = u / c->f.Hkv, hk = u % c->f.Hkv, Dv = c->f.Dv, ld = c->f.Hkv * Dv;
        float *vv = c->Vv + u * Dv * nkp;
        const float *src = c->f.v + b * nk * ld + hk * Dv;
        for (int64_t j = 0; j < nk; j++)
            for (int64_t d = 0; d < Dv; d++) vv[d * nkp + j] = src[j * ld + d];
        for (int64_t d = 0; d < Dv; d++) memset(vv + d * nkp + nk, 0, (size_t)(nkp - nk) * sizeof(float));
    }
}

/* ---- forward -------------------------------------------------------------- */

/* o = alpha o + sum of pw[x] V_{c0+x} over the lanes whose logit is not
 * -inf, by runs of such lanes (masked keys' values are never read). */
static void ad_pv(const ad_ctx *c, float *o, float alpha, const float *pw, const float *s, int64_t c0,
                  const float *vb, size_t ldv) {
    const float *al = alpha != 1.0f ? &alpha : NULL;
    int x = 0;
    while (x < AD_L) {
        while (x < AD_L && s[x] == -INFINITY) x++;
        int x0 = x;
        while (x < AD_L && s[x] != -INFINITY) x++;
        if (x > x0) {
            c->f.K->pv(o, (size_t)c->f.Dv, al, pw + x0, AD_L, 1, vb + (size_t)(c0 + x0) * ldv, ldv, (size_t)(x - x0),
                      (size_t)c->f.Dv, 1);
            al = NULL;
        }
    }
}

static void ad_fwd_unit(void *vc, int64_t unit, int thread) {
    ad_ctx *c = vc;
    const int64_t qb = unit % c->nqb, bh = unit / c->nqb, b = bh / c->f.H, h = bh % c->f.H, hk = h / c->f.G;
    const int64_t nq = c->f.nq, nk = c->f.nk, Dv = c->f.Dv, i0 = qb * AD_BQ;
    const int rows = (int)(nq - i0 < AD_BQ ? nq - i0 : AD_BQ);
    float *o = ad_scratch(c, thread), *m = o + AD_BQ * Dv, *l = m + AD_BQ, *vis = l + AD_BQ, *s = vis + AD_BQ,
          *tc = s + AD_L, *pw = tc + AD_L;
    const int64_t *lo = c->lo + b * nq + i0, *hi = c->hi + b * nq + i0;
    memset(o, 0, (size_t)(rows * Dv) * sizeof(float));
    int64_t jmin = nk, jmax = 0;
    for (int r = 0; r < rows; r++) {
        m[r] = -INFINITY;
        l[r] = vis[r] = 0.0f;
        if (lo[r] < hi[r]) {
            if (lo[r] < jmin) jmin = lo[r];
            if (hi[r] > jmax) jmax = hi[r];
        }
    }
    const size_t ldv = (size_t)(c->f.Hkv * Dv);
    const float *vb = c->f.v + b * nk * c->f.Hkv * Dv + hk * Dv;
    const int softmax = c->f.norm == QKV_NORM_SOFTMAX;
    for (int64_t c0 = jmin / AD_L * AD_L; c0 < jmax; c0 += AD_L)
        for (int r = 0; r < rows; r++) {
            if (lo[r] >= hi[r] || hi[r] <= c0 || lo[r] >= c0 + AD_L) continue;
            const int64_t i = i0 + r;
            ad_logits(c, b, h, i, lo[r], hi[r], c0, NULL, s, tc);
            float mx = -INFINITY;
            int nvis = 0;
            for (int x = 0; x < AD_L; x++) {
                if (s[x] > mx) mx = s[x];
                nvis += s[x] != -INFINITY;
            }
            vis[r] += (float)nvis;
            if (c->attn) {
                float *arow = c->attn + (bh * nq + i) * nk;
                int64_t a = lo[r] > c0 ? lo[r] : c0, e = hi[r] < c0 + AD_L ? hi[r] : c0 + AD_L;
                for (int64_t j = a; j < e; j++) arow[j] = s[j - c0];
            }
            const float mn = mx > m[r] ? mx : m[r];
            if (mn == -INFINITY) continue; /* nothing visible yet */
            const float alpha = expf(m[r] - mn);
            float sum = 0.0f;
            for (int x = 0; x < AD_L; x++) {
                if (s[x] == -INFINITY) {
                    pw[x] = 0.0f;
                    continue;
                }
                float e = expf(s[x] - mn);
                sum += e;
                pw[x] = softmax                         ? e
                        : c->f.norm == QKV_NORM_RELU ? (s[x] < 0.0f ? 0.0f : s[x])
                                                     : 1.0f / (1.0f + expf(-s[x]));
            }
            l[r] = l[r] * alpha + sum;
            m[r] = mn;
            ad_pv(c, o + r * Dv, softmax ? alpha : 1.0f, pw, s, c0, vb, ldv);
        }
    for (int r = 0; r < rows; r++) {
        const int64_t i = i0 + r, row = bh * nq + i;
        float mul = 1.0f;
        if (softmax) mul = m[r] == -INFINITY ? 0.0f : 1.0f / l[r];
        if (c->relu_div) mul = vis[r] > 0.0f ? 1.0f / vis[r] : 0.0f;
        float *orow = c->out + ((b * nq + i) * c->f.H + h) * Dv;
        for (int64_t d = 0; d < Dv; d++) orow[d] = o[r * Dv + d] * mul;
        if (c->lse) c->lse[row] = m[r] == -INFINITY ? -INFINITY : (float)((double)m[r] + log((double)l[r]));
        if (c->attn) {
            float *arow = c->attn + row * nk;
            for (int64_t j = 0; j < nk; j++) {
                if (j < lo[r] || j >= hi[r] || arow[j] == -INFINITY) {
                    arow[j] = 0.0f;
                    continue;
                }
                float x = arow[j];
                arow[j] = softmax ? expf(x - m[r]) / l[r]
                          : c->f.norm == QKV_NORM_RELU ? (x < 0.0f ? 0.0f : x) / (c->relu_div ? vis[r] : 1.0f)
                                                     : 1.0f / (1.0f + expf(-x));
            }
        }
    }
}

static size_t ad_fwd_scratch(const ad_ctx *c) {
    return qkv_round64((size_t)(AD_BQ * c->f.Dv + 3 * AD_BQ + 3 * AD_L) * sizeof(float));
}

static void ad_run(ad_ctx *c, int64_t units, qkv_unit_fn fn) {
    if (units > 0) qkv_parallel_for(c->f.threads, units, fn, c);
}

qkv_status qkv_fast_additive_forward(const qkv_plan *p, const float *q, const float *k, const float *v,
                                     float *out, float *attn, float *lse) {
    ad_ctx c;
    ad_ctx_init(&c, p, q, k, v);
    const int64_t BH = c.f.B * c.f.H;
    c.scratch_bytes = ad_fwd_scratch(&c);
    ad_layout L = {0, 0};
    size_t o_lo = ad_take(&L, sizeof(int64_t), c.f.B, c.f.nq, 1), o_hi = ad_take(&L, sizeof(int64_t), c.f.B, c.f.nq, 1);
    size_t o_u = ad_take(&L, sizeof(float), BH, c.f.nq, c.A), o_vt = ad_take(&L, sizeof(float), BH, c.A, c.nkp);
    size_t o_s = ad_take(&L, c.scratch_bytes, c.f.threads, 1, 1);
    if (L.overflow) return QKV_ERR_SIZE_OVERFLOW;
    unsigned char *mem = fa_alloc(L.total);
    if (!mem) return QKV_ERR_OUT_OF_MEMORY;
    c.lo = (int64_t *)(void *)(mem + o_lo);
    c.hi = (int64_t *)(void *)(mem + o_hi);
    c.U = (float *)(void *)(mem + o_u);
    c.Vt = (float *)(void *)(mem + o_vt);
    c.scratch = mem + o_s;
    c.out = out;
    c.attn = attn;
    c.lse = lse;
    ad_key_ranges(&c);
    ad_run(&c, BH, ad_proj_unit);
    if (!atomic_load(&c.failed)) ad_run(&c, BH * c.nqb, ad_fwd_unit);
    int failed = atomic_load(&c.failed);
    fa_free(mem);
    return failed ? QKV_ERR_OUT_OF_MEMORY : QKV_OK;
}

/* ---- backward ------------------------------------------------------------- */

/* Per row of (b, h), units of AD_BQ rows: D_i = dO_i . O_i (softmax) and
 * the visible count (relu divided by it). Scratch: (Dv + 1) 16 floats. */
static void ad_table_unit(void *vc, int64_t unit, int thread) {
    ad_ctx *c = vc;
    const int64_t qb = unit % c->nqb, bh = unit / c->nqb, b = bh / c->f.H, h = bh % c->f.H, nq = c->f.nq;
    const int64_t i1 = (qb + 1) * AD_BQ < nq ? (qb + 1) * AD_BQ : nq;
    float *col = ad_scratch(c, thread); /* [Dv][16], O_i in lane 0; then 16 results */
    memset(col, 0, (size_t)((c->f.Dv + 1) * AD_L) * sizeof(float));
    for (int64_t i = qb * AD_BQ; i < i1; i++) {
        const int64_t row = bh * nq + i, lo = c->lo[b * nq + i], hi = c->hi[b * nq + i];
        if (c->f.norm == QKV_NORM_SOFTMAX) {
            /* By the kernel that gives dP = dO . V, in lane 0: with one
             * visible key O = V exactly, and then dP - D is exactly 0. */
            const int64_t at = ((b * nq + i) * c->f.H + h) * c->f.Dv;
            for (int64_t d = 0; d < c->f.Dv; d++) col[d * AD_L] = c->o_in[at + d];
            c->K->dots(c->dout + at, col, AD_L, (size_t)c->f.Dv, col + c->f.Dv * AD_L);
            c->Dd[row] = col[c->f.Dv * AD_L];
        }
        if (c->relu_div) {
            int64_t n = lo < hi ? hi - lo : 0;
            const float *brow = c->f.bias ? c->f.bias + h * c->f.bias_head_stride + i * c->f.nk : NULL;
            if (brow)
                for (int64_t j = lo; j < hi; j++) n -= brow[j] == -INFINITY;
            c->cnt[row] = (float)n;
        }
    }
}

/* One row against 16 keys: the logits, the weights P, dS (ds) and dS
 * through the soft-cap (dr); masked lanes get 0 in all three. sc holds t
 * [A][16] then 3 x 16 floats of scratch. */
static void ad_chunk_grads(const ad_ctx *c, int64_t b, int64_t h, int64_t i, int64_t lo, int64_t hi, int64_t c0,
                           float *sc, float *P, float *ds, float *dr) {
    float *t = sc, *s = t + c->A * AD_L, *tc = s + AD_L, *dp = tc + AD_L;
    ad_logits(c, b, h, i, lo, hi, c0, t, s, tc);
    const int64_t row = (b * c->f.H + h) * c->f.nq + i, hk = h / c->f.G;
    const float *dO = c->dout + ((b * c->f.nq + i) * c->f.H + h) * c->f.Dv;
    c->K->dots(dO, c->Vv + (b * c->f.Hkv + hk) * c->f.Dv * c->nkp + c0, (size_t)c->nkp, (size_t)c->f.Dv, dp);
    const float L = c->f.norm == QKV_NORM_SOFTMAX ? c->lse_in[row] : 0.0f;
    const float Dd = c->f.norm == QKV_NORM_SOFTMAX ? c->Dd[row] : 0.0f;
    const float cnt = c->relu_div ? c->cnt[row] : 1.0f;
    for (int x = 0; x < AD_L; x++) {
        if (s[x] == -INFINITY) {
            P[x] = ds[x] = dr[x] = 0.0f;
            continue;
        }
        float pr, d;
        switch (c->f.norm) {
        case QKV_NORM_SOFTMAX:
            pr = expf(s[x] - L);
            d = pr * (dp[x] - Dd);
            break;
        case QKV_NORM_RELU:
            pr = s[x] < 0.0f ? 0.0f : s[x]; /* NaN stays NaN */
            d = pr > 0.0f ? dp[x] : 0.0f;
            pr /= cnt;
            d /= cnt;
            break;
        default: /* sigmoid */
            pr = 1.0f / (1.0f + expf(-s[x]));
            d = dp[x] * pr * (1.0f - pr);
            break;
        }
        P[x] = pr;
        ds[x] = d;
        dr[x] = c->cap > 0.0f ? d * (1.0f - tc[x] * tc[x]) : d;
    }
}

/* Key pass: unit = (b, kv head, 64 keys), or (64 keys) over every b and
 * kv head in order when dbias is wanted. Owns dV of its keys, the columns
 * of dV' of its keys for the group's heads, and (dbias) those of dbias. */
static void ad_kpass_unit(ad_ctx *c, int64_t unit, int thread) {
    const int64_t kb = unit % c->nkb, rest = unit / c->nkb, nq = c->f.nq, nk = c->f.nk, nkp = c->nkp, A = c->A;
    const int64_t Dv = c->f.Dv, j0 = kb * AD_BK, j1 = j0 + AD_BK < nk ? j0 + AD_BK : nk;
    const int64_t jw = (j0 + AD_BK < nkp ? j0 + AD_BK : nkp) - j0;
    int64_t b0 = 0, b1 = c->f.B, k0 = 0, k1 = c->f.Hkv;
    if (!c->dbias) {
        b0 = rest / c->f.Hkv;
        b1 = b0 + 1;
        k0 = rest % c->f.Hkv;
        k1 = k0 + 1;
    }
    float *sc = ad_scratch(c, thread), *P = sc + A * AD_L + 3 * AD_L, *ds = P + AD_L, *dr = ds + AD_L;
    float *dva = dr + AD_L; /* [Dv][AD_BK] */
    for (int64_t b = b0; b < b1; b++)
        for (int64_t hk = k0; hk < k1; hk++) {
            memset(dva, 0, (size_t)(Dv * AD_BK) * sizeof(float));
            for (int64_t g = 0; g < c->f.G; g++) {
                const int64_t h = hk * c->f.G + g, bh = b * c->f.H + h;
                float *dvt = c->dVt + bh * A * nkp;
                for (int64_t a = 0; a < A; a++) memset(dvt + a * nkp + j0, 0, (size_t)jw * sizeof(float));
                float *dbh = c->dbias ? c->dbias + (c->f.bias_head_stride ? h * nq * nk : 0) : NULL;
                for (int64_t i = 0; i < nq; i++) {
                    const int64_t lo = c->lo[b * nq + i], hi = c->hi[b * nq + i];
                    if (lo >= hi || hi <= j0 || lo >= j1) continue;
                    const int64_t cs = lo / AD_L * AD_L > j0 ? lo / AD_L * AD_L : j0, ce = hi < j1 ? hi : j1;
                    const float *dO = c->dout + ((b * nq + i) * c->f.H + h) * Dv;
                    for (int64_t c0 = cs; c0 < ce; c0 += AD_L) {
                        ad_chunk_grads(c, b, h, i, lo, hi, c0, sc, P, ds, dr);
                        c->K->dscore(sc, c->w + h * A, (size_t)A, dr, dvt + c0, (size_t)nkp, NULL);
                        c->K->outer(dva + (c0 - j0), AD_BK, dO, (size_t)Dv, P);
                        if (dbh) {
                            float *drow = dbh + i * nk;
                            for (int x = 0; x < AD_L; x++) {
                                int64_t j = c0 + x;
                                if (j >= lo && j < hi) drow[j] += ds[x];
                            }
                        }
                    }
                }
            }
            for (int64_t j = j0; j < j1; j++) {
                float *dvr = c->dv + ((b * nk + j) * c->f.Hkv + hk) * Dv;
                for (int64_t d = 0; d < Dv; d++) dvr[d] = dva[d * AD_BK + (j - j0)];
            }
        }
}

/* Query pass: unit = (b, h, 32 rows). Owns dU of its rows and its dw
 * partial. */
static void ad_qpass_unit(ad_ctx *c, int64_t unit, int thread) {
    const int64_t qb = unit % c->nqb, bh = unit / c->nqb, b = bh / c->f.H, h = bh % c->f.H, nq = c->f.nq, A = c->A;
    const int64_t i1 = (qb + 1) * AD_BQ < nq ? (qb + 1) * AD_BQ : nq;
    float *sc = ad_scratch(c, thread), *P = sc + A * AD_L + 3 * AD_L, *ds = P + AD_L, *dr = ds + AD_L;
    float *du = dr + AD_L, *dwl = du + A * AD_L;
    if (c->want_dw) memset(dwl, 0, (size_t)(A * AD_L) * sizeof(float));
    for (int64_t i = qb * AD_BQ; i < i1; i++) {
        const int64_t lo = c->lo[b * nq + i], hi = c->hi[b * nq + i];
        float *durow = c->dU + (bh * nq + i) * A;
        if (lo >= hi) {
            memset(durow, 0, (size_t)A * sizeof(float));
            continue;
        }
        memset(du, 0, (size_t)(A * AD_L) * sizeof(float));
        for (int64_t c0 = lo / AD_L * AD_L; c0 < hi; c0 += AD_L) {
            ad_chunk_grads(c, b, h, i, lo, hi, c0, sc, P, ds, dr);
            c->K->dscore(sc, c->w + h * A, (size_t)A, dr, du, AD_L, c->want_dw ? dwl : NULL);
        }
        for (int64_t a = 0; a < A; a++) {
            float acc = 0.0f;
            for (int x = 0; x < AD_L; x++) acc += du[a * AD_L + x];
            durow[a] = acc;
        }
    }
    if (c->want_dw)
        for (int64_t a = 0; a < A; a++) {
            float acc = 0.0f;
            for (int x = 0; x < AD_L; x++) acc += dwl[a * AD_L + x];
            c->dwp[unit * A + a] = acc;
        }
}

static void ad_pass_unit(void *vc, int64_t unit, int thread) {
    ad_ctx *c = vc;
    if (unit < c->n_kpass)
        ad_kpass_unit(c, unit, thread);
    else
        ad_qpass_unit(c, unit - c->n_kpass, thread);
}

/* The GEMMs: units [0, B H) dq of (b, h); then B Hkv units dk of (b, kv
 * head) summed over the group in order; then H units dW1_h and H units
 * dW2_h, each summed over b in order (when wanted). */
static void ad_gemm_unit(void *vc, int64_t unit, int thread) {
    ad_ctx *c = vc;
    (void)thread;
    const int64_t BH = c->f.B * c->f.H, BK = c->f.B * c->f.Hkv, H = c->f.H, A = c->A, D = c->f.D;
    const int64_t nq = c->f.nq, nk = c->f.nk;
    const int64_t nkp = c->nkp;
    qkv_status s = QKV_OK;
    if (unit >= BH + BK && !c->dw1) unit += H; /* no dW1 units */
    if (unit < BH) {
        const int64_t b = unit / H, h = unit % H;
        s = qkv_gemm_run(c->KG, 0, 0, nq, D, A, 1.0f, c->dU + unit * nq * A, A, c->w1 + h * A * D, D, 0.0f,
                         c->dq + b * nq * H * D + h * D, H * D, 1);
    } else if (unit < BH + BK) {
        const int64_t u = unit - BH, b = u / c->f.Hkv, hk = u % c->f.Hkv;
        for (int64_t g = 0; g < c->f.G && s == QKV_OK; g++) {
            const int64_t h = hk * c->f.G + g;
            s = qkv_gemm_run(c->KG, 1, 0, nk, D, A, 1.0f, c->dVt + (b * H + h) * A * nkp, nkp, c->w2 + h * A * D, D,
                             g ? 1.0f : 0.0f, c->dk + b * nk * c->f.Hkv * D + hk * D, c->f.Hkv * D, 1);
        }
    } else if (unit < BH + BK + H) {
        const int64_t h = unit - BH - BK;
        for (int64_t b = 0; b < c->f.B && s == QKV_OK; b++)
            s = qkv_gemm_run(c->KG, 1, 0, A, D, nq, 1.0f, c->dU + (b * H + h) * nq * A, A,
                             c->f.q + b * nq * H * D + h * D, H * D, b ? 1.0f : 0.0f, c->dw1 + h * A * D, D, 1);
    } else {
        const int64_t h = unit - BH - BK - H, hk = h / c->f.G;
        for (int64_t b = 0; b < c->f.B && s == QKV_OK; b++)
            s = qkv_gemm_run(c->KG, 0, 0, A, D, nk, 1.0f, c->dVt + (b * H + h) * A * nkp, nkp,
                             c->f.k + b * nk * c->f.Hkv * D + hk * D, c->f.Hkv * D, b ? 1.0f : 0.0f,
                             c->dw2 + h * A * D, D, 1);
    }
    if (s != QKV_OK) atomic_store(&c->failed, 1);
}

qkv_status qkv_fast_additive_backward(const qkv_plan *p, const float *q, const float *k, const float *v,
                                      const float *out, const float *lse, const float *dout,
                                      const qkv_attn_grads *g) {
    ad_ctx c;
    ad_ctx_init(&c, p, q, k, v);
    const int64_t BH = c.f.B * c.f.H, BK = c.f.B * c.f.Hkv, A = c.A;
    const int softmax = c.f.norm == QKV_NORM_SOFTMAX, refwd = softmax && (!out || !lse);
    size_t sb = qkv_round64((size_t)(2 * A * AD_L + 6 * AD_L) * sizeof(float)) +
                qkv_round64((size_t)(A * AD_L + c.f.Dv * AD_BK) * sizeof(float));
    size_t fb = ad_fwd_scratch(&c);
    c.scratch_bytes = sb > fb ? sb : fb;
    ad_layout L = {0, 0};
    size_t o_lo = ad_take(&L, sizeof(int64_t), c.f.B, c.f.nq, 1), o_hi = ad_take(&L, sizeof(int64_t), c.f.B, c.f.nq, 1);
    size_t o_u = ad_take(&L, sizeof(float), BH, c.f.nq, A), o_vt = ad_take(&L, sizeof(float), BH, A, c.nkp);
    size_t o_du = ad_take(&L, sizeof(float), BH, c.f.nq, A), o_dvt = ad_take(&L, sizeof(float), BH, A, c.nkp);
    size_t o_vv = ad_take(&L, sizeof(float), BK, c.f.Dv, c.nkp);
    size_t o_dd = ad_take(&L, sizeof(float), BH, c.f.nq, 1), o_cnt = ad_take(&L, sizeof(float), BH, c.f.nq, 1);
    size_t o_dwp = ad_take(&L, sizeof(float), BH, c.nqb, A);
    size_t o_out = refwd ? ad_take(&L, sizeof(float), p->n_o_elems, 1, 1) : 0;
    size_t o_lse = refwd ? ad_take(&L, sizeof(float), BH, c.f.nq, 1) : 0;
    size_t o_s = ad_take(&L, c.scratch_bytes, c.f.threads, 1, 1);
    if (L.overflow) return QKV_ERR_SIZE_OVERFLOW;
    unsigned char *mem = fa_alloc(L.total);
    if (!mem) return QKV_ERR_OUT_OF_MEMORY;
#define AD_AT(type, off) ((type *)(void *)(mem + (off)))
    c.lo = AD_AT(int64_t, o_lo);
    c.hi = AD_AT(int64_t, o_hi);
    c.U = AD_AT(float, o_u);
    c.Vt = AD_AT(float, o_vt);
    c.dU = AD_AT(float, o_du);
    c.dVt = AD_AT(float, o_dvt);
    c.Vv = AD_AT(float, o_vv);
    c.Dd = AD_AT(float, o_dd);
    c.cnt = AD_AT(float, o_cnt);
    c.dwp = AD_AT(float, o_dwp);
    c.scratch = mem + o_s;
    c.dout = dout, c.o_in = out, c.lse_in = lse;
    c.dq = g->dq, c.dk = g->dk, c.dv = g->dv;
    c.dw1 = g->d_additive_w1, c.dw2 = g->d_additive_w2;
    c.want_dw = g->d_additive_w != NULL;
    c.dbias = c.f.bias ? g->dbias : NULL;
    ad_key_ranges(&c);
    ad_run(&c, BH + BK, ad_proj_unit);
    if (refwd && !atomic_load(&c.failed)) {
        c.out = AD_AT(float, o_out);
        c.lse = AD_AT(float, o_lse);
        ad_run(&c, BH * c.nqb, ad_fwd_unit);
        c.o_in = c.out;
        c.lse_in = c.lse;
    }
#undef AD_AT
    if (!atomic_load(&c.failed)) {
        ad_run(&c, BH * c.nqb, ad_table_unit);
        if (c.dbias) memset(c.dbias, 0, (size_t)p->n_bias_elems * sizeof(float));
        c.n_kpass = c.dbias ? c.nkb : BK * c.nkb;
        ad_run(&c, c.n_kpass + BH * c.nqb, ad_pass_unit);
        ad_run(&c, BH + BK + (c.dw1 ? c.f.H : 0) + (c.dw2 ? c.f.H : 0), ad_gemm_unit);
    }
    if (!atomic_load(&c.failed) && c.want_dw) {
        float *dw = g->d_additive_w;
        for (int64_t h = 0; h < c.f.H; h++)
            for (int64_t a = 0; a < A; a++) {
                float acc = 0.0f;
                for (int64_t b = 0; b < c.f.B; b++)
                    for (int64_t qb = 0; qb < c.nqb; qb++) acc += c.dwp[((b * c.f.H + h) * c.nqb + qb) * A + a];
                dw[h * A + a] = acc;
            }
    }
    int failed = atomic_load(&c.failed);
    fa_free(mem);
    return failed ? QKV_ERR_OUT_OF_MEMORY : QKV_OK;
}
