/* float32, bf16 and int8 storage of a KV cache, and the attention of new
 * tokens over it (decoding), streaming the cache once per query row.
 * Storing copies, rounds each value to bf16, or quantises each block
 * of KV_BLOCK values of a head's key or value row to int8 with one float32
 * scale (symmetric: s = max|x| / 127, q = round(x / s)). Attending reads the
 * stored rows through the kv kernels, which widen them in registers: the
 * cache is never expanded to float32, and per query row the only workspace
 * is its scores (O(n) floats, never n x n).
 *
 * Per query row (b, i, h) at position p = L + i: keys lo .. p (the call's
 * plan: causal, or a causal window), scores in base 2 (q pre-multiplied by scale * log2 e, or
 * soft-capped first), ALiBi's -slope |p - j|, one online-softmax step of the
 * attention kernel table over the whole row (the max first: a two-pass
 * softmax, exact at any magnitude of the logits), then O = sum_j p_j v_j / l.
 * Rows are independent units spread over the threads statically, so results
 * do not depend on the thread count. */
#include <math.h>
#include <string.h>

#include "core/half.h"
#include "core/internal.h"
#include "core/threads.h"
#include "kernels/kernels.h"
#include "layers/kv_typed.h"
#include "layers/mha_internal.h"

#define LOG2E 1.4426950408889634

struct kv_typed {
    qkv_kv_storage storage;
    int64_t batch, max_len, hkv, dh, nb; /* nb: scale blocks per head row */
    /* Head-major, [B, H_kv, max_len, Dh]: a query row streams one
     * contiguous run of memory per head. */
    float *kf, *vf;                      /* float32 */
    uint16_t *kb, *vb;                   /* bf16 */
    int8_t *k8, *v8;                     /* int8 */
    float *ks, *vs;                      /* int8 scales [B, H_kv, max_len, nb] */
    float *ws;                           /* per-thread workspace */
    int64_t ws_cap;                      /* floats */
};

qkv_status kv_typed_supported(const qkv_mha *m) {
    const qkv_mha_config *c = &m->cfg;
    const qkv_attn_desc *a = &c->attn;
    if (a->score != QKV_SCORE_SCALED_DOT && a->score != QKV_SCORE_DOT) return QKV_ERR_UNSUPPORTED;
    if (a->norm != QKV_NORM_SOFTMAX) return QKV_ERR_UNSUPPORTED;
    if (c->pos == QKV_POS_RELATIVE || c->add_bias_kv) return QKV_ERR_UNSUPPORTED;
    return QKV_OK;
}

qkv_status kv_typed_create(kv_typed **out, qkv_kv_storage storage, int64_t batch, int64_t max_len,
                           int64_t heads_kv, int64_t head_dim) {
    *out = NULL;
    int64_t nb = (head_dim + KV_BLOCK - 1) / KV_BLOCK;
    int64_t f[4] = {batch, max_len, heads_kv, head_dim}, g[4] = {batch, max_len, heads_kv, nb}, n, ns = 0;
    size_t elem = storage == QKV_KV_F32 ? sizeof(float) : storage == QKV_KV_BF16 ? sizeof(uint16_t) : 1;
    if (!qkv_count_ok(&n, elem, 4, f)) return QKV_ERR_SIZE_OVERFLOW;
    if (storage == QKV_KV_INT8 && !qkv_count_ok(&ns, sizeof(float), 4, g)) return QKV_ERR_SIZE_OVERFLOW;
    kv_typed *t = qkv_alloc(sizeof *t);
    if (!t) return QKV_ERR_OUT_OF_MEMORY;
    *t = (kv_typed){.storage = storage, .batch = batch, .max_len = max_len, .hkv = heads_kv, .dh = head_dim, .nb = nb};
    int ok;
    if (storage == QKV_KV_F32) {
        t->kf = qkv_alloc((size_t)n * elem);
        t->vf = qkv_alloc((size_t)n * elem);
        ok = t->kf && t->vf;
    } else if (storage == QKV_KV_BF16) {
        t->kb = qkv_alloc((size_t)n * elem);
        t->vb = qkv_alloc((size_t)n * elem);
        ok = t->kb && t->vb;
    } else {
        t->k8 = qkv_alloc((size_t)n);
        t->v8 = qkv_alloc((size_t)n);
        t->ks = qkv_alloc((size_t)ns * sizeof(float));
        t->vs = qkv_alloc((size_t)ns * sizeof(float));
        ok = t->k8 && t->v8 && t->ks && t->vs;
    }
    if (!ok) {
        kv_typed_free(t);
        return QKV_ERR_OUT_OF_MEMORY;
    }
    *out = t;
    return QKV_OK;
}

void kv_typed_free(kv_typed *t) {
    if (!t) return;
    void *const bufs[] = {t->kf, t->vf, t->kb, t->vb, t->k8, t->v8, t->ks, t->vs, t->ws, t};
    qkv_free_each(bufs, sizeof bufs / sizeof bufs[0]);
}

/* One block of n values as int8 and its scale. A block holding NaN or an
 * infinity gets a NaN scale (every value of it then reads as NaN, as a
 * non-finite input makes the attention row NaN anyway); an all-zero block
 * gets scale 0. */
static void quantise(const float *x, int64_t n, int8_t *q, float *scale) {
    float amax = 0.0f;
    int finite = 1;
    for (int64_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (!(a <= 3.402823466e38f)) finite = 0; /* NaN or inf */
        else if (a > amax) amax = a;
    }
    if (!finite || amax == 0.0f) {
        for (int64_t i = 0; i < n; i++) q[i] = 0;
        *scale = finite ? 0.0f : NAN;
        return;
    }
    float inv = 127.0f / amax;
    for (int64_t i = 0; i < n; i++) {
        float r = roundf(x[i] * inv); /* half away from zero: symmetric */
        if (r > 127.0f) r = 127.0f;
        if (r < -127.0f) r = -127.0f;
        q[i] = (int8_t)r;
    }
    *scale = amax / 127.0f;
}

void kv_typed_store(kv_typed *t, int64_t b, int64_t pos, int64_t n, const float *k, const float *v) {
    const int64_t Dh = t->dh;
    for (int64_t i = 0; i < n; i++)
        for (int64_t g = 0; g < t->hkv; g++) { /* one head row of one token */
            const float *kr = k + (i * t->hkv + g) * Dh, *vr = v + (i * t->hkv + g) * Dh;
            const int64_t slot = (b * t->hkv + g) * t->max_len + pos + i, at = slot * Dh;
            if (t->storage == QKV_KV_F32) {
                memcpy(t->kf + at, kr, (size_t)Dh * sizeof(float));
                memcpy(t->vf + at, vr, (size_t)Dh * sizeof(float));
            } else if (t->storage == QKV_KV_BF16) {
                qkv_f32_to_bf16_array(t->kb + at, kr, (size_t)Dh);
                qkv_f32_to_bf16_array(t->vb + at, vr, (size_t)Dh);
            } else {
                for (int64_t blk = 0; blk < t->nb; blk++) {
                    int64_t d0 = blk * KV_BLOCK, len = Dh - d0 < KV_BLOCK ? Dh - d0 : KV_BLOCK;
                    quantise(kr + d0, len, t->k8 + at + d0, t->ks + slot * t->nb + blk);
                    quantise(vr + d0, len, t->v8 + at + d0, t->vs + slot * t->nb + blk);
                }
            }
        }
}

/* The kv kernels matching the attention kernel table in use (so QKV_ARCH and
 * the tests' forcing choose both). */
static const kv_kernels *kv_active(const qkv_kernels *k) {
    (void)k; /* of the same kernel set (kernels/kernels.h) */
    return qkv_kv_kernels_active();
}

typedef struct attend_ctx {
    const kv_typed *t;
    const qkv_plan *p;
    const qkv_kernels *K;
    const kv_kernels *KV;
    const float *q, *slopes;
    float *o;
    int64_t H, tq;
    float qmul, softcap;
    float *ws;
    int64_t ws_stride;
} attend_ctx;

static void attend_row(void *vctx, int64_t u, int thread) {
    const attend_ctx *c = vctx;
    const kv_typed *t = c->t;
    const int64_t H = c->H, Dh = t->dh, Hkv = t->hkv;
    const int64_t h = u % H, i = (u / H) % c->tq, b = u / (H * c->tq), g = h / (H / Hkv);
    int64_t lo, hi;
    qkv_plan_key_range(c->p, b, i, &lo, &hi);
    const int64_t p = qkv_plan_query_position(c->p, i), n = hi - lo; /* the keys lo .. p */
    float *s = c->ws + (int64_t)thread * c->ws_stride, *qs = s + t->max_len, *acc = qs + Dh;
    const float *qr = c->q + ((b * c->tq + i) * H + h) * Dh;
    float *orow = c->o + ((b * c->tq + i) * H + h) * Dh;
    for (int64_t d = 0; d < Dh; d++) qs[d] = qr[d] * c->qmul;

    const int64_t slot = (b * Hkv + g) * t->max_len + lo, at = slot * Dh, ld = Dh, lds = t->nb;
    if (t->storage == QKV_KV_F32)
        c->KV->qk_f32(qs, t->kf + at, (size_t)ld, (size_t)Dh, (size_t)n, s);
    else if (t->storage == QKV_KV_BF16)
        c->KV->qk_bf16(qs, t->kb + at, (size_t)ld, (size_t)Dh, (size_t)n, s);
    else
        c->KV->qk_i8(qs, t->k8 + at, (size_t)ld, t->ks + slot * t->nb,
                     (size_t)lds, (size_t)Dh, (size_t)n, s);
    if (c->softcap > 0.0f)
        for (int64_t j = 0; j < n; j++) s[j] = c->softcap * tanhf(s[j] / c->softcap) * (float)LOG2E;
    if (c->slopes) {
        const float sl = c->slopes[h] * (float)LOG2E;
        for (int64_t j = 0; j < n; j++) s[j] -= sl * (float)(p - lo - j);
    }
    float m = -INFINITY, l = 0.0f, alpha;
    c->K->softmax(s, (size_t)n, 1, (size_t)n, 1.0f, &m, &l, &alpha);
    memset(acc, 0, (size_t)Dh * sizeof(float));
    if (t->storage == QKV_KV_F32)
        c->KV->pv_f32(acc, s, t->vf + at, (size_t)ld, (size_t)Dh, (size_t)n);
    else if (t->storage == QKV_KV_BF16)
        c->KV->pv_bf16(acc, s, t->vb + at, (size_t)ld, (size_t)Dh, (size_t)n);
    else
        c->KV->pv_i8(acc, s, t->v8 + at, (size_t)ld, t->vs + slot * t->nb,
                     (size_t)lds, (size_t)Dh, (size_t)n);
    /* l > 0 always (the row sees key p; the max gives 2^0 = 1), unless the
     * logits are NaN or all -inf: then the row is NaN or 0 as 1/l makes it. */
    const float inv = l > 0.0f ? 1.0f / l : (l == l ? 0.0f : l);
    for (int64_t d = 0; d < Dh; d++) orow[d] = acc[d] * inv;
}

qkv_status kv_typed_attend(kv_typed *t, const qkv_plan *p, const float *q, float *o) {
    const qkv_attn_desc *d = &p->d;
    const int64_t units = d->batch * d->n_q * d->heads;
    int nthreads = qkv_threads_resolve(d->threads);
    if (nthreads > QKV_MAX_THREADS) nthreads = QKV_MAX_THREADS;
    if ((int64_t)nthreads > units) nthreads = (int)units;
    const int64_t stride = t->max_len + 2 * t->dh;
    if (!qkv_reserve(&t->ws, &t->ws_cap, stride * nthreads, sizeof(float))) return QKV_ERR_OUT_OF_MEMORY;
    const double scale = d->score == QKV_SCORE_DOT ? 1.0 : d->scale; /* resolved by the plan */
    attend_ctx c;
    c.t = t;
    c.p = p;
    c.K = qkv_kernels_active();
    c.KV = kv_active(c.K);
    c.q = q;
    c.o = o;
    c.slopes = d->alibi_slopes;
    c.H = d->heads;
    c.tq = d->n_q;
    c.softcap = (float)d->softcap;
    c.qmul = (float)(d->softcap > 0.0 ? scale : scale * LOG2E);
    c.ws = t->ws;
    c.ws_stride = stride;
    qkv_parallel_for(nthreads, units, attend_row, &c);
    return QKV_OK;
}
