/* The bf16 fast forward: FlashAttention-2 (Dao 2023) with the two matrix
 * products on bf16 dot-product units and everything else in float.
 *
 * Per (b, kv head), once per call: K packed into panels of 32 keys in the
 * pair layout of kernels/half.h (two consecutive dimensions of a key in
 * one 32-bit word), V interleaved likewise (two consecutive keys of a value
 * column in one word). Per block of 64 query rows of one (b, h): for each
 * tile of 128 keys some row sees, S = Q K^T by bf16 dot products with float
 * accumulation; keys outside each row's range set to -inf; one online-softmax
 * step (running max from -inf, rescale alpha, P rounded to bf16, nearest
 * even, in one kernel) and O = alpha O + P V by bf16 dot products
 * into a float accumulator. The output is rounded to bf16 once at the end;
 * lse is float. So the error is that of a plain bf16 implementation with
 * float accumulation (docs/HALF.md), without its n x n buffer.
 *
 * Masked keys are never multiplied into the output: the P V product runs on
 * the pairs of keys every row of a 4-row group sees; each row's remaining
 * visible keys are added one at a time. Keys past n_k are zero padding.
 *
 * Chosen at run time: the active kernel set must hold native bf16 kernels,
 * i.e. be the AVX-512 one on a CPU with AVX512-BF16 (core/cpu.c detects it;
 * QKV_ARCH=avx2 or generic turns this path off); otherwise the portable path
 * (half_attn.c) runs.
 * AMX (TDPBF16PS) would slot in as another pair of kernels with the same
 * packed layouts; it is not implemented (docs/HALF.md). */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "attn/half.h"
#include "core/half.h"
#include "core/threads.h"
#include "kernels/kernels.h"

#define HF_BQ 64  /* query rows per block */
#define HF_BK 256 /* keys per tile (8 panels of 32) */
#define HF_LOG2E 1.4426950408889634
#define HF_LN2 0.6931471805599453

static atomic_int g_portable_only;

int qkv_half_fast_available(void) {
    return !atomic_load(&g_portable_only) && qkv_half_kernels_active()->native;
}

void qkv_half_force_portable(int on) { atomic_store(&g_portable_only, on ? 1 : 0); }

typedef struct hf_ctx {
    const qkv_plan *p;
    const qkv_half_kernels *HK;
    int64_t B, nq, nk, H, Hkv, G, D, Dv;
    int64_t dp2;      /* pairs of dimensions: ceil(D / 2) */
    int64_t dvp;      /* value columns padded to 16 */
    int64_t nkp;      /* keys padded to 32 */
    const uint16_t *q, *k, *v;
    uint16_t *out;
    float *lse;
    float sc;         /* q.k -> base-2 logit */
    uint32_t *kp, *vp;
    int64_t kp_stride, vp_stride; /* words per (b, kv head) */
    int64_t nqb;
    unsigned char *ws;
    size_t ws_stride;
} hf_ctx;

typedef struct hf_ws {
    uint32_t *qp, *pp;
    float *s, *o, *m, *l;
    int64_t *lo, *hi;
    int *a, *e;
} hf_ws;

static size_t ws_layout(const hf_ctx *c, unsigned char *base, hf_ws *w) {
    size_t at = 0;
    QKV_CARVE(qp, uint32_t, HF_BQ * c->dp2);
    QKV_CARVE(pp, uint32_t, HF_BQ * HF_BK / 2);
    QKV_CARVE(s, float, HF_BQ * HF_BK);
    QKV_CARVE(o, float, HF_BQ * c->dvp);
    QKV_CARVE(m, float, HF_BQ);
    QKV_CARVE(l, float, HF_BQ);
    QKV_CARVE(lo, int64_t, HF_BQ);
    QKV_CARVE(hi, int64_t, HF_BQ);
    QKV_CARVE(a, int, HF_BQ);
    QKV_CARVE(e, int, HF_BQ);
    return at;
}

static uint32_t pair(uint16_t lo, uint16_t hi) { return (uint32_t)lo | ((uint32_t)hi << 16); }

static void pack_unit(void *vc, int64_t u, int t) {
    (void)t;
    hf_ctx *c = vc;
    const qkv_half_kernels *HK = c->HK;
    const int64_t b = u / c->Hkv, kv = u % c->Hkv, D = c->D, Dv = c->Dv, dp2 = c->dp2;
    uint32_t *kp = c->kp + u * c->kp_stride, *vp = c->vp + u * c->vp_stride;
    /* K: key j's pairs down column j % 32 of panel j / 32; V: keys 2 pu and
     * 2 pu + 1 interleaved column by column */
    qkv_half_pack_panels(HK, kp, dp2, c->k + (b * c->nk * c->Hkv + kv) * D, c->Hkv * D, c->nk, c->nkp, D);
    qkv_half_pack_row_pairs(HK, vp, c->dvp, c->v + (b * c->nk * c->Hkv + kv) * Dv, c->Hkv * Dv, c->nk, c->nkp, Dv);
}

/* The value of key j (of this (b, kv head)) in column cc, from the pairs. */
static float v_at(const uint32_t *vp, int64_t dvp, int64_t j, int64_t cc) {
    uint32_t w = vp[(j / 2) * dvp + cc];
    return qkv_bf16_to_f32((uint16_t)(j & 1 ? w >> 16 : w & 0xffffu));
}

static void fwd_unit(void *vc, int64_t u, int t) {
    hf_ctx *c = vc;
    hf_ws w;
    ws_layout(c, c->ws + (size_t)t * c->ws_stride, &w);
    const qkv_half_kernels *HK = c->HK;
    const int64_t qb = u % c->nqb, bh = u / c->nqb, h = bh % c->H, b = bh / c->H;
    const int64_t i0 = qb * HF_BQ, D = c->D, Dv = c->Dv, dp2 = c->dp2, dvp = c->dvp, kv = h / c->G;
    const int nr = (int)(c->nq - i0 < HF_BQ ? c->nq - i0 : HF_BQ);
    const int rows = (nr + 7) / 8 * 8;
    const size_t ldp = HF_BK / 2;
    int64_t blo = INT64_MAX, bhi = 0;
    for (int r = 0; r < rows; r++) {
        uint32_t *dst = w.qp + (size_t)r * dp2;
        if (r < nr) {
            const uint16_t *src = c->q + ((b * c->nq + i0 + r) * c->H + h) * D;
            if (D % 2 == 0) /* the pairs are the row's bf16 in memory order (little-endian) */
                memcpy(dst, src, (size_t)D * sizeof(uint16_t));
            else
                for (int64_t tt = 0; tt < dp2; tt++)
                    dst[tt] = pair(src[2 * tt], 2 * tt + 1 < D ? src[2 * tt + 1] : 0);
            qkv_plan_key_range(c->p, b, i0 + r, &w.lo[r], &w.hi[r]);
            if (w.lo[r] < w.hi[r]) {
                if (w.lo[r] < blo) blo = w.lo[r];
                if (w.hi[r] > bhi) bhi = w.hi[r];
            }
        } else {
            memset(dst, 0, (size_t)dp2 * sizeof(uint32_t));
            w.lo[r] = w.hi[r] = 0;
        }
        w.m[r] = -INFINITY;
        w.l[r] = 0.0f;
        memset(w.o + (size_t)r * dvp, 0, (size_t)dvp * sizeof(float));
    }
    const uint32_t *kpb = c->kp + (b * c->Hkv + kv) * c->kp_stride;
    const uint32_t *vpb = c->vp + (b * c->Hkv + kv) * c->vp_stride;
    for (int64_t kt = blo / 32 * 32; kt < bhi; kt += HF_BK) {
        const int ncols = (int)(bhi - kt < HF_BK ? bhi - kt : HF_BK);
        const size_t np = (size_t)(ncols + 31) / 32;
        HK->qk(w.qp, (size_t)dp2, kpb + (kt / 32) * dp2 * 32, (size_t)dp2, (size_t)rows, np, w.s, HF_BK);
        for (int r = 0; r < nr; r++) {
            float *sr = w.s + (size_t)r * HF_BK;
            int64_t x = w.lo[r] - kt, y = w.hi[r] - kt;
            if (x < 0) x = 0;
            if (y > ncols) y = ncols;
            if (y < x) x = y = 0;
            w.a[r] = (int)x;
            w.e[r] = (int)y;
            for (int j = 0; j < (int)x; j++) sr[j] = -INFINITY;
            for (int j = (int)y; j < ncols; j++) sr[j] = -INFINITY;
        }
        HK->softmax_pack(w.s, HF_BK, (size_t)nr, (size_t)ncols, c->sc, w.m, w.l, w.o, (size_t)dvp, (size_t)dvp,
                         w.pp, ldp);
        for (int g = 0; g < nr; g += 4) {
            const int gn = nr - g < 4 ? nr - g : 4;
            int A = 0, E = HF_BK;
            for (int r = g; r < g + gn; r++) {
                if (w.a[r] > A) A = w.a[r];
                if (w.e[r] < E) E = w.e[r];
            }
            int ua = (A + 1) / 2, ub = E > A ? E / 2 : 0;
            if (ub > ua)
                HK->pv(w.o + (size_t)g * dvp, (size_t)dvp, w.pp + (size_t)g * ldp, ldp, vpb + (kt / 2) * dvp,
                       (size_t)dvp, (size_t)ua, (size_t)ub, (size_t)dvp, (size_t)gn);
            else
                ua = ub = 0;
            /* each row's visible keys outside the common pairs, one at a time */
            for (int r = g; r < g + gn; r++) {
                float *orow = w.o + (size_t)r * dvp;
                const uint32_t *pr2 = w.pp + (size_t)r * ldp;
                for (int j = w.a[r]; j < w.e[r]; j++) {
                    if (j == 2 * ua && ub > ua) j = 2 * ub; /* past the common pairs */
                    if (j >= w.e[r]) break;
                    float pr = qkv_bf16_to_f32((uint16_t)(j & 1 ? pr2[j / 2] >> 16 : pr2[j / 2] & 0xffffu));
                    if (pr == 0.0f) continue;
                    for (int64_t cc = 0; cc < Dv; cc++) orow[cc] += pr * v_at(vpb, dvp, kt + j, cc);
                }
            }
        }
    }
    for (int r = 0; r < nr; r++) {
        const float *orow = w.o + (size_t)r * dvp;
        uint16_t *dst = c->out + ((b * c->nq + i0 + r) * c->H + h) * Dv;
        int empty = w.l[r] == 0.0f;
        float mul = empty ? 0.0f : 1.0f / w.l[r];
        for (int64_t cc = 0; cc < Dv; cc++) dst[cc] = empty ? 0 : qkv_f32_to_bf16(orow[cc] * mul);
        double l2 = empty ? -INFINITY : (double)c->sc * w.m[r] + log2((double)w.l[r]);
        if (c->lse) c->lse[(b * c->H + h) * c->nq + i0 + r] = (float)(l2 * HF_LN2);
    }
}

qkv_status qkv_half_fast_forward(const qkv_plan *p, const uint16_t *q, const uint16_t *k,
                                 const uint16_t *v, uint16_t *out, float *lse) {
    const qkv_attn_desc *d = &p->d;
    if (d->dtype != QKV_BF16 || !qkv_half_fast_available()) return QKV_ERR_UNSUPPORTED;
    if ((d->score != QKV_SCORE_SCALED_DOT && d->score != QKV_SCORE_DOT) || !(d->scale > 0.0) ||
        d->norm != QKV_NORM_SOFTMAX || d->softcap != 0.0 || d->bias_kind != QKV_BIAS_NONE ||
        d->alibi_slopes || d->rel_table || d->dropout != 0.0)
        return QKV_ERR_UNSUPPORTED;
    hf_ctx c;
    memset(&c, 0, sizeof c);
    c.p = p;
    c.HK = qkv_half_kernels_active();
    c.B = d->batch; c.nq = d->n_q; c.nk = d->n_k; c.H = d->heads; c.Hkv = d->heads_kv;
    c.G = p->group; c.D = d->dim; c.Dv = d->dim_v;
    c.dp2 = (c.D + 1) / 2;
    c.dvp = (c.Dv + 15) / 16 * 16;
    c.nkp = (c.nk + 31) / 32 * 32;
    c.q = q; c.k = k; c.v = v; c.out = out; c.lse = lse;
    c.sc = (float)((d->score == QKV_SCORE_DOT ? 1.0 : d->scale) * HF_LOG2E);
    c.kp_stride = c.nkp * c.dp2;
    c.vp_stride = c.nkp / 2 * c.dvp;
    c.nqb = (c.nq + HF_BQ - 1) / HF_BQ;
    /* sizes: every count is at most a few times an input tensor's, whose
     * byte sizes the plan checked; the products below cannot overflow then */
    size_t kv_units = (size_t)(c.B * c.Hkv);
    size_t kbytes = qkv_round64(kv_units * (size_t)c.kp_stride * 4), vbytes = qkv_round64(kv_units * (size_t)c.vp_stride * 4);
    int64_t units = c.B * c.H * c.nqb;
    int threads = qkv_threads_resolve(d->threads);
    if (threads > QKV_MAX_THREADS) threads = QKV_MAX_THREADS;
    if (threads > units) threads = (int)units;
    c.ws_stride = ws_layout(&c, NULL, NULL);
    unsigned char *mem = qkv_alloc(kbytes + vbytes + c.ws_stride * (size_t)threads + 64);
    if (!mem) return QKV_ERR_OUT_OF_MEMORY;
    unsigned char *base = (unsigned char *)(((uintptr_t)mem + 63) & ~(uintptr_t)63);
    c.kp = (uint32_t *)(void *)base;
    c.vp = (uint32_t *)(void *)(base + kbytes);
    c.ws = base + kbytes + vbytes;
    qkv_parallel_for(threads, (int64_t)kv_units, pack_unit, &c);
    qkv_parallel_for(threads, units, fwd_unit, &c);
    qkv_free(mem);
    return QKV_OK;
}
