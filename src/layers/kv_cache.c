/* Incremental decoding: keys and values of past tokens are kept, new tokens
 * are projected, appended and attended with the bottom-right causal
 * alignment of the core, so position L + i sees keys 0 .. L + i. With
 * add_bias_kv each batch row of the cache starts with one more slot that
 * holds bias_k / bias_v (refreshed on every call), as the forward places
 * them (mha_internal.h). */
#include <string.h>

#include "attn/attention.h"
#include "core/internal.h"
#include "layers/kv_typed.h"
#include "layers/linear.h"
#include "layers/mha_internal.h"

struct qkv_kv_cache {
    int64_t batch, max_len, len, dkv;  /* dkv = H_kv * Dh floats per token */
    int64_t extra;                     /* 1 with add_bias_kv: slot 0 of each row */
    float *k, *v;                      /* [B, extra + max_len, H_kv, Dh] */
    float *scratch;                    /* q, k, v, o (and mean) of the new tokens */
    int64_t scratch_cap;
    const qkv_mha *owner;
    kv_typed *typed;                   /* bf16 / int8 storage (kv_typed.c); NULL: float32 k, v */
};

qkv_status qkv_kv_cache_create(const qkv_mha *m, int64_t batch, int64_t max_len, qkv_kv_cache **out) {
    if (!m || !out) return QKV_ERR_NULL_POINTER;
    *out = NULL;
    if (batch <= 0 || max_len <= 0) return QKV_ERR_BAD_SIZE;
    const qkv_mha_config *c = &m->cfg;
    if (c->kdim != c->embed_dim || c->vdim != c->embed_dim) return QKV_ERR_UNSUPPORTED; /* self-attention only */
    if (max_len == INT64_MAX) return QKV_ERR_SIZE_OVERFLOW;
    int64_t dkv = c->heads_kv * c->head_dim, f[3] = {batch, max_len + c->add_bias_kv, dkv}, n;
    if (!qkv_count_ok(&n, sizeof(float), 3, f)) return QKV_ERR_SIZE_OVERFLOW;
    qkv_kv_cache *kc = qkv_alloc(sizeof *kc);
    if (!kc) return QKV_ERR_OUT_OF_MEMORY;
    *kc = (qkv_kv_cache){.batch = batch, .max_len = max_len, .dkv = dkv, .extra = c->add_bias_kv, .owner = m};
    kc->k = qkv_alloc((size_t)n * sizeof(float));
    kc->v = qkv_alloc((size_t)n * sizeof(float));
    if (!kc->k || !kc->v) {
        qkv_kv_cache_free(kc);
        return QKV_ERR_OUT_OF_MEMORY;
    }
    *out = kc;
    return QKV_OK;
}

void qkv_kv_cache_free(qkv_kv_cache *c) {
    if (!c) return;
    kv_typed_free(c->typed);
    QKV_FREE_ALL(c->k, c->v, c->scratch, c);
}

void qkv_kv_cache_reset(qkv_kv_cache *c) {
    if (c) c->len = 0;
}

int64_t qkv_kv_cache_length(const qkv_kv_cache *c) { return c ? c->len : 0; }

qkv_status qkv_mha_decode(qkv_mha *m, qkv_kv_cache *kc, int64_t t, const float *x, float *y) {
    if (!m || !kc || !x || !y) return QKV_ERR_NULL_POINTER;
    if (kc->owner != m) return QKV_ERR_SHAPE;
    if (t <= 0) return QKV_ERR_BAD_SIZE;
    if (t > kc->max_len - kc->len) return QKV_ERR_POSITION;
    const qkv_mha_config *c = &m->cfg;
    const int64_t B = kc->batch, E = c->embed_dim, H = c->heads, Dh = c->head_dim, Dq = H * Dh;
    const int64_t Dkv = kc->dkv, L = kc->len, thr = c->attn.threads, X = kc->extra;
    const int64_t rowlen = X + kc->max_len; /* slots per batch row */
    int64_t need = B * t * (2 * Dq + 2 * Dkv + Dh);
    if (!qkv_reserve(&kc->scratch, &kc->scratch_cap, need, sizeof(float))) return QKV_ERR_OUT_OF_MEMORY;
    float *q = kc->scratch, *k = q + B * t * Dq, *v = k + B * t * Dkv, *o = v + B * t * Dkv;
    float *om = o + B * t * Dq;
    const float *P = m->params, *bin = c->bias ? P + m->off[MHA_BIN] : NULL;
    qkv_status s;
    if ((s = nn_linear(x, B * t, E, P + m->off[MHA_WQ], bin, Dq, q, (int)thr)) != QKV_OK ||
        (s = nn_linear(x, B * t, E, P + m->off[MHA_WK], bin ? bin + Dq : NULL, Dkv, k, (int)thr)) != QKV_OK ||
        (s = nn_linear(x, B * t, E, P + m->off[MHA_WV], bin ? bin + Dq + Dkv : NULL, Dkv, v, (int)thr)) !=
            QKV_OK)
        return s;
    if (c->pos == QKV_POS_ROPE) {
        qkv_rope_apply(q, B, t, H, Dh, L, c->rope_base, 0);
        qkv_rope_apply(k, B, t, c->heads_kv, Dh, L, c->rope_base, 0);
    }
    qkv_attn_desc d;
    qkv_plan plan;
    if (kc->typed) {
        /* bf16 / int8: store the new keys and values rounded or quantised,
         * then attend reading the stored ones (never widened in memory),
         * over the key ranges of the call's plan. */
        mha_decode_desc(m, B, t, L + t, &d);
        if (d.dropout > 0.0) return QKV_ERR_UNSUPPORTED;
        if ((s = qkv_plan_make(&d, &plan)) != QKV_OK) return s;
        for (int64_t b = 0; b < B; b++) kv_typed_store(kc->typed, b, L, t, k + b * t * Dkv, v + b * t * Dkv);
        if ((s = kv_typed_attend(kc->typed, &plan, q, o)) != QKV_OK) return s;
        goto join_heads; /* past the float32 cache's copies and attention calls */
    }
    for (int64_t b = 0; b < B; b++) {
        memcpy(kc->k + (b * rowlen + X + L) * Dkv, k + b * t * Dkv, (size_t)(t * Dkv) * sizeof(float));
        memcpy(kc->v + (b * rowlen + X + L) * Dkv, v + b * t * Dkv, (size_t)(t * Dkv) * sizeof(float));
        if (X) {
            memcpy(kc->k + b * rowlen * Dkv, P + m->off[MHA_BK], (size_t)Dkv * sizeof(float));
            memcpy(kc->v + b * rowlen * Dkv, P + m->off[MHA_BV], (size_t)Dkv * sizeof(float));
        }
    }
    /* One attention call per batch row (the cache rows of a batch are
     * contiguous, [X + L + t, H_kv, Dh]), all under one plan. */
    mha_decode_desc(m, 1, t, X + L + t, &d);
    if ((s = qkv_plan_make(&d, &plan)) != QKV_OK) return s;
    for (int64_t b = 0; b < B; b++) {
        s = qkv_attn_forward_plan(&plan, q + b * t * Dq, kc->k + b * rowlen * Dkv, kc->v + b * rowlen * Dkv,
                                  o + b * t * Dq, NULL, NULL);
        if (s != QKV_OK) return s;
    }
join_heads:;
    const float *bo = c->bias ? P + m->off[MHA_BO] : NULL;
    if (c->join == QKV_JOIN_MEAN) {
        for (int64_t r = 0; r < B * t; r++)
            for (int64_t j = 0; j < Dh; j++) {
                double acc = 0.0;
                for (int64_t h = 0; h < H; h++) acc += o[(r * H + h) * Dh + j];
                om[r * Dh + j] = (float)(acc / (double)H);
            }
        s = nn_linear(om, B * t, Dh, P + m->off[MHA_WO], bo, E, y, (int)thr);
    } else {
        s = nn_linear(o, B * t, Dq, P + m->off[MHA_WO], bo, E, y, (int)thr);
    }
    if (s != QKV_OK) return s;
    kc->len = L + t;
    return QKV_OK;
}

qkv_status qkv_kv_cache_create_typed(const qkv_mha *m, int64_t batch, int64_t max_len,
                                     qkv_kv_storage storage, qkv_kv_cache **out) {
    if (!m || !out) return QKV_ERR_NULL_POINTER;
    *out = NULL;
    if (storage != QKV_KV_F32 && storage != QKV_KV_BF16 && storage != QKV_KV_INT8) return QKV_ERR_BAD_ENUM;
    if (batch <= 0 || max_len <= 0) return QKV_ERR_BAD_SIZE;
    const qkv_mha_config *c = &m->cfg;
    if (c->kdim != c->embed_dim || c->vdim != c->embed_dim) return QKV_ERR_UNSUPPORTED; /* self-attention only */
    qkv_status s = kv_typed_supported(m);
    /* float32 for a layer the decode kernels do not serve: the general cache */
    if (s != QKV_OK && storage == QKV_KV_F32) return qkv_kv_cache_create(m, batch, max_len, out);
    if (s != QKV_OK) return s;
    qkv_kv_cache *kc = qkv_alloc_zeroed(sizeof *kc);
    if (!kc) return QKV_ERR_OUT_OF_MEMORY;
    s = kv_typed_create(&kc->typed, storage, batch, max_len, c->heads_kv, c->head_dim);
    if (s != QKV_OK) {
        qkv_kv_cache_free(kc);
        return s;
    }
    kc->batch = batch;
    kc->max_len = max_len;
    kc->dkv = c->heads_kv * c->head_dim;
    kc->owner = m;
    *out = kc;
    return QKV_OK;
}

size_t qkv_kv_cache_bytes_per_token(const qkv_mha *m, qkv_kv_storage storage) {
    if (!m) return 0;
    const size_t hkv = (size_t)m->cfg.heads_kv, dh = (size_t)m->cfg.head_dim;
    switch (storage) {
    case QKV_KV_F32: return 2 * hkv * dh * sizeof(float);
    case QKV_KV_BF16: return 2 * hkv * dh * sizeof(uint16_t);
    case QKV_KV_INT8: return 2 * hkv * (dh + sizeof(float) * ((dh + 31) / 32));
    }
    return 0;
}
