/* Incremental decoding: the model's forward for t new tokens at positions
 * L .. L+t-1, each attention layer reading its KV cache (qkv_mha_decode).
 * Built on the transformer (transformer.c: the model object, its LayerNorm
 * and GELU; layers/linear.h), which never calls in here: the decoding state
 * is part of the model and released with it (model_decode_free). */
#include <math.h>
#include <string.h>

#include "core/internal.h"
#include "kernels/kernels.h"
#include "layers/linear.h"
#include "model/model_internal.h"

qkv_status qkv_model_decode_begin(qkv_model *m, int64_t max_len) {
    return qkv_model_decode_begin_typed(m, max_len, QKV_KV_F32);
}

qkv_status qkv_model_decode_begin_typed(qkv_model *m, int64_t max_len, qkv_kv_storage storage) {
    if (!m) return QKV_ERR_NULL_POINTER;
    if (storage != QKV_KV_F32 && storage != QKV_KV_BF16 && storage != QKV_KV_INT8) return QKV_ERR_BAD_ENUM;
    if (!m->cfg.causal) return QKV_ERR_UNSUPPORTED;
    if (max_len <= 0) return QKV_ERR_BAD_SIZE;
    if (max_len > m->cfg.max_seq) return QKV_ERR_POSITION;
    model_decode_free(m);
    m->cache = qkv_alloc_zeroed((size_t)m->cfg.layers * sizeof(qkv_kv_cache *));
    if (!m->cache) return QKV_ERR_OUT_OF_MEMORY;
    for (int64_t l = 0; l < m->cfg.layers; l++) {
        qkv_mha_set_dropout(m->attn[l], 0.0, 0); /* inference */
        qkv_status s = qkv_kv_cache_create_typed(m->attn[l], 1, max_len, storage, &m->cache[l]);
        if (s != QKV_OK) {
            model_decode_free(m);
            return s;
        }
    }
    if (m->floater) {
        /* The ODE's positions for the whole budget, once. */
        if (!(m->dec_floater = qkv_alloc((size_t)(max_len * m->cfg.dim) * sizeof(float)))) {
            model_decode_free(m);
            return QKV_ERR_OUT_OF_MEMORY;
        }
        qkv_status s = qkv_floater_forward(m->floater, max_len, m->dec_floater);
        if (s != QKV_OK) {
            model_decode_free(m);
            return s;
        }
    }
    m->dec_max = max_len;
    return QKV_OK;
}

qkv_status qkv_model_decode_step(qkv_model *m, int64_t t, const int32_t *tokens, float *logits) {
    if (!m || !tokens || !logits) return QKV_ERR_NULL_POINTER;
    if (!m->cache) return QKV_ERR_UNSUPPORTED;
    if (t <= 0) return QKV_ERR_BAD_SIZE;
    if (t > m->dec_max - m->dec_len) return QKV_ERR_POSITION;
    const int64_t E = m->cfg.dim, F = m->F, V = m->cfg.vocab, L0 = m->dec_len;
    for (int64_t i = 0; i < t; i++)
        if (tokens[i] < 0 || tokens[i] >= V) return QKV_ERR_BAD_PARAMETER;
    if (m->dec_buf_rows < t) {
        float *b = qkv_alloc((size_t)(t * (5 * E + 2 * F + 2)) * sizeof(float));
        if (!b) return QKV_ERR_OUT_OF_MEMORY;
        qkv_free(m->dec_buf);
        m->dec_buf = b;
        m->dec_buf_rows = t;
    }
    float *x = m->dec_buf, *ln = x + t * E, *a = ln + t * E, *mid = a + t * E, *h = mid + t * E;
    float *pre = h + t * E, *act = pre + t * F, *stat = act + t * F; /* LN mean, rstd */
    const float *P = m->params;
    const float scale = model_emb_scale(m);
    for (int64_t r = 0; r < t; r++) model_embed_row(m, scale, tokens[r], L0 + r, h + r * E);
    qkv_status s;
    const int thr = m->cfg.threads;
    for (int64_t l = 0; l < m->cfg.layers; l++) {
        for (int64_t r = 0; r < t; r++)
            for (int64_t i = 0; i < E; i++)
                x[r * E + i] = h[r * E + i] + (m->floater ? m->dec_floater[(L0 + r) * E + i] : 0.0f);
        model_layernorm_forward(x, P + m->o_ln1_w[l], P + m->o_ln1_b[l], t, E, ln, stat, stat + t);
        if ((s = qkv_mha_decode(m->attn[l], m->cache[l], t, ln, a)) != QKV_OK) return s;
        for (int64_t i = 0; i < t * E; i++) mid[i] = x[i] + a[i];
        model_layernorm_forward(mid, P + m->o_ln2_w[l], P + m->o_ln2_b[l], t, E, ln, stat, stat + t);
        if ((s = nn_linear(ln, t, E, P + m->o_fc1_w[l], P + m->o_fc1_b[l], F, pre, thr)) != QKV_OK) return s;
        qkv_nn_kernels_active()->gelu_grad(act, pre, (size_t)(t * F), 0);
        if ((s = nn_linear(act, t, F, P + m->o_fc2_w[l], P + m->o_fc2_b[l], E, a, thr)) != QKV_OK) return s;
        for (int64_t i = 0; i < t * E; i++) h[i] = mid[i] + a[i];
    }
    model_layernorm_forward(h, P + m->o_lnf_w, P + m->o_lnf_b, t, E, ln, stat, stat + t);
    if ((s = nn_linear(ln, t, E, P + m->o_head, NULL, V, logits, thr)) != QKV_OK) return s;
    m->dec_len = L0 + t;
    return QKV_OK;
}
