/* Multi-head attention layer: projections through qkv_sgemm (the bf16 GEMM
 * under QKV_BF16), the attention
 * core for the heads, and the output projection; forward and backward in the
 * style of llm.c (activations kept in the layer for the backward). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/half.h"
#include "core/internal.h"
#include "core/rng.h"
#include "layers/linear.h"
#include "layers/mha_internal.h"

void qkv_mha_config_init(qkv_mha_config *cfg, int64_t embed_dim, int64_t heads) {
    static const qkv_mha_config defaults = {.bias = 1, .join = QKV_JOIN_CONCAT, .pos = QKV_POS_NONE};
    if (!cfg) return;
    memcpy(cfg, &defaults, sizeof *cfg);
    cfg->embed_dim = embed_dim;
    cfg->heads = heads;
    qkv_attn_desc_init(&cfg->attn);
}

/* Resolve defaults and check the configuration. */
static qkv_status resolve(const qkv_mha_config *in, qkv_mha_config *c) {
    *c = *in;
    if (c->embed_dim <= 0 || c->heads <= 0 || c->heads_kv < 0 || c->head_dim < 0 || c->kdim < 0 ||
        c->vdim < 0)
        return QKV_ERR_BAD_SIZE;
    if (c->heads_kv == 0) c->heads_kv = c->heads;
    if (c->heads % c->heads_kv != 0) return QKV_ERR_HEADS;
    if (c->head_dim == 0) {
        if (c->embed_dim % c->heads != 0) return QKV_ERR_HEADS;
        c->head_dim = c->embed_dim / c->heads;
    }
    if (c->kdim == 0) c->kdim = c->embed_dim;
    if (c->vdim == 0) c->vdim = c->embed_dim;
    if ((unsigned)c->join > QKV_JOIN_MEAN || (unsigned)c->pos > QKV_POS_RELATIVE) return QKV_ERR_BAD_ENUM;
    if (c->rope_base == 0.0) c->rope_base = 10000.0;
    if (c->pos == QKV_POS_ROPE && (c->head_dim % 2 != 0)) return QKV_ERR_BAD_SIZE;
    if (c->pos == QKV_POS_ROPE && !(isfinite(c->rope_base) && c->rope_base > 1.0))
        return QKV_ERR_BAD_PARAMETER;
    if (c->rel_buckets == 0) c->rel_buckets = 32;
    if (c->rel_max_distance == 0) c->rel_max_distance = 128;
    /* Validate the attention options on a 1-token problem of this shape. */
    qkv_attn_desc d = c->attn;
    d.dtype = QKV_F32;
    d.batch = d.n_q = d.n_k = 1;
    d.heads = c->heads;
    d.heads_kv = c->heads_kv;
    d.dim = d.dim_v = c->head_dim;
    d.bias_kind = QKV_BIAS_NONE;
    d.key_lengths = NULL;
    d.num_seqs = 0;
    d.seq_offsets_q = d.seq_offsets_k = NULL;
    d.alibi_slopes = d.rel_table = NULL;
    if (d.score == QKV_SCORE_ADDITIVE) {
        /* The layer owns W1, W2 [H, A, Dh] and w [H, A]; under AUTO the
         * core computes this score on its fast additive path (the
         * reference with ALiBi, relative positions or dropout); FAST stays
         * refused. */
        if (c->attn.additive_dim < 0) return QKV_ERR_BAD_SIZE;
        if (c->attn.additive_dim == 0) c->attn.additive_dim = c->head_dim;
        if (c->attn.impl == QKV_IMPL_FAST) return QKV_ERR_UNSUPPORTED;
        d.additive_dim = c->attn.additive_dim;
        d.additive_w1 = d.additive_w2 = d.additive_w = &d; /* non-NULL: only sizes are checked */
    }
    if (c->add_bias_kv && (c->attn.mask == QKV_MASK_WINDOW || c->attn.mask == QKV_MASK_CAUSAL_WINDOW))
        return QKV_ERR_UNSUPPORTED; /* a window would hide the extra key from far queries */
    c->add_bias_kv = c->add_bias_kv != 0;
    qkv_status s = qkv_attn_desc_check(&d);
    if (s != QKV_OK) return s;
    if (c->pos == QKV_POS_RELATIVE) {
        d.rel_table = &d; /* any non-NULL pointer: only the sizes are checked */
        d.rel_buckets = c->rel_buckets;
        d.rel_max_distance = c->rel_max_distance;
        d.rel_bidirectional = c->attn.mask != QKV_MASK_CAUSAL && c->attn.mask != QKV_MASK_CAUSAL_WINDOW;
        s = qkv_attn_desc_check(&d);
        if (s != QKV_OK) return s;
    }
    return QKV_OK;
}

/* Lay the parameters out in one block (see mha_internal.h). */
static int layout(qkv_mha *m) {
    const qkv_mha_config *c = &m->cfg;
    int64_t E = c->embed_dim, Dq = c->heads * c->head_dim, Dkv = c->heads_kv * c->head_dim;
    int64_t Do = c->join == QKV_JOIN_MEAN ? c->head_dim : Dq;
    int64_t A = c->attn.score == QKV_SCORE_ADDITIVE ? c->attn.additive_dim : 0;
    int64_t aw = 0, av = 0, f3[3] = {c->heads, A, c->head_dim}, f2[2] = {c->heads, A};
    if (A > 0 && (!qkv_count_ok(&aw, sizeof(float), 3, f3) || !qkv_count_ok(&av, sizeof(float), 2, f2)))
        return 0;
    int64_t sizes[MHA_PARAM_COUNT] = {Dq * E, Dkv * c->kdim, Dkv * c->vdim, c->bias ? Dq + 2 * Dkv : 0, E * Do,
                                      c->bias ? E : 0, c->pos == QKV_POS_RELATIVE ? c->heads * c->rel_buckets : 0,
                                      c->add_bias_kv ? Dkv : 0, c->add_bias_kv ? Dkv : 0, aw, aw, av};
    int64_t off = 0;
    for (int i = 0; i < MHA_PARAM_COUNT; i++) {
        if (sizes[i] < 0 || off > INT64_MAX / 8 - sizes[i]) return 0;
        m->off[i] = off;
        off += sizes[i];
    }
    m->n_params = off;
    m->fused = c->kdim == E && c->vdim == E && c->heads_kv == c->heads && Dq == E;
    return 1;
}

/* xavier_uniform_ like torch: U(-a, a), a = sqrt(6 / (fan_in + fan_out)),
 * from a splitmix64 stream so that a seed gives the same layer everywhere. */
static void xavier(float *w, int64_t rows, int64_t cols, uint64_t *seed) {
    double a = sqrt(6.0 / (double)(rows + cols));
    for (int64_t i = 0; i < rows * cols; i++) w[i] = (float)(a * (2.0 * splitmix64_unit(seed) - 1.0));
}

/* N(0, std^2) by Box-Muller. */
static void normal_fill(float *w, int64_t n, double std, uint64_t *seed) {
    for (int64_t i = 0; i < n; i++) {
        double u = 1.0 - splitmix64_unit(seed), v = splitmix64_unit(seed); /* u in (0, 1] */
        w[i] = (float)(std * sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
    }
}

qkv_status qkv_mha_create(const qkv_mha_config *cfg, uint64_t seed, qkv_mha **out) {
    if (!cfg || !out) return QKV_ERR_NULL_POINTER;
    *out = NULL;
    qkv_mha_config c;
    qkv_status s = resolve(cfg, &c);
    if (s != QKV_OK) return s;
    qkv_mha *m = qkv_alloc_zeroed(sizeof *m);
    if (!m) return QKV_ERR_OUT_OF_MEMORY;
    m->cfg = c;
    if (!layout(m)) {
        qkv_free(m);
        return QKV_ERR_SIZE_OVERFLOW;
    }
    m->params = qkv_alloc_zeroed((size_t)m->n_params * sizeof(float));
    m->grads = qkv_alloc_zeroed((size_t)m->n_params * sizeof(float));
    m->slopes = qkv_alloc((size_t)c.heads * sizeof(float));
    if (!m->params || !m->grads || !m->slopes) {
        qkv_mha_free(m);
        return QKV_ERR_OUT_OF_MEMORY;
    }
    qkv_alibi_slopes(c.heads, m->slopes);
    int64_t Dq = c.heads * c.head_dim, Dkv = c.heads_kv * c.head_dim;
    if (m->fused) {
        xavier(m->params + m->off[MHA_WQ], 3 * Dq, c.embed_dim, &seed); /* torch: one [3E, E] matrix */
    } else {
        xavier(m->params + m->off[MHA_WQ], Dq, c.embed_dim, &seed);
        xavier(m->params + m->off[MHA_WK], Dkv, c.kdim, &seed);
        xavier(m->params + m->off[MHA_WV], Dkv, c.vdim, &seed);
    }
    int64_t Do = c.join == QKV_JOIN_MEAN ? c.head_dim : Dq;
    /* torch's out_proj (a Linear) uses kaiming-uniform: U(+-1/sqrt(fan_in)). */
    uint64_t s2 = seed ^ 0x5DEECE66Dull;
    float *wo = m->params + m->off[MHA_WO];
    for (int64_t i = 0; i < c.embed_dim * Do; i++)
        wo[i] = (float)((2.0 * ((double)(splitmix64_next(&s2) >> 11) * 0x1.0p-53) - 1.0) / sqrt((double)Do));
    /* The optional parameters draw from streams of their own, so that turning
     * them on leaves the others as they were. */
    if (c.add_bias_kv) {
        /* torch: xavier_normal_ of [1, 1, E]: std = sqrt(2 / (E + E)). */
        uint64_t s3 = seed ^ 0xB1A5CAFEull;
        normal_fill(m->params + m->off[MHA_BK], Dkv, 1.0 / sqrt((double)Dkv), &s3);
        normal_fill(m->params + m->off[MHA_BV], Dkv, 1.0 / sqrt((double)Dkv), &s3);
    }
    if (c.attn.score == QKV_SCORE_ADDITIVE) {
        /* W1, W2 xavier-uniform per head ([A, Dh] each), w like a Linear of
         * fan-in A: U(+-1/sqrt(A)). Scores then start at O(1). */
        uint64_t s4 = seed ^ 0xADD17F0Eull;
        int64_t A = c.attn.additive_dim;
        for (int64_t h = 0; h < c.heads; h++) {
            xavier(m->params + m->off[MHA_AW1] + h * A * c.head_dim, A, c.head_dim, &s4);
            xavier(m->params + m->off[MHA_AW2] + h * A * c.head_dim, A, c.head_dim, &s4);
        }
        float *w = m->params + m->off[MHA_AW];
        for (int64_t i = 0; i < c.heads * A; i++) w[i] = (float)((2.0 * splitmix64_unit(&s4) - 1.0) / sqrt((double)A));
    }
    *out = m;
    return QKV_OK;
}

void qkv_mha_free(qkv_mha *m) {
    if (!m) return;
    void *const bufs[] = {m->params, m->grads, m->slopes, m->key_lengths};
    qkv_free_each(bufs, sizeof bufs / sizeof bufs[0]);
    for (int i = 0; i < MHA_ACT_COUNT; i++) qkv_free(m->act[i]);
    for (int i = 0; i < 8; i++) qkv_free(m->half[i]);
    qkv_free(m);
}

float *qkv_mha_params(qkv_mha *m, int64_t *count) {
    return qkv_param_view(m ? m->params : NULL, m ? m->n_params : 0, count);
}

float *qkv_mha_grads(qkv_mha *m, int64_t *count) {
    return qkv_param_view(m ? m->grads : NULL, m ? m->n_params : 0, count);
}

void qkv_mha_zero_grad(qkv_mha *m) {
    if (m) memset(m->grads, 0, (size_t)m->n_params * sizeof(float));
}

qkv_status qkv_mha_set_dropout(qkv_mha *m, double p, uint64_t seed) {
    if (!m) return QKV_ERR_NULL_POINTER;
    if (!(p >= 0.0 && p < 1.0)) return QKV_ERR_BAD_PARAMETER;
    m->cfg.attn.dropout = p;
    m->cfg.attn.dropout_seed = seed;
    return QKV_OK;
}

qkv_status qkv_mha_set_precision(qkv_mha *m, qkv_dtype compute) {
    if (!m) return QKV_ERR_NULL_POINTER;
    if (compute != QKV_F32 && compute != QKV_BF16 && compute != QKV_F16) return QKV_ERR_BAD_ENUM;
    m->compute = compute;
    m->have_forward = 0; /* a backward must follow a forward of the same precision */
    return QKV_OK;
}

qkv_dtype qkv_mha_get_precision(const qkv_mha *m) { return m ? m->compute : QKV_F32; }

/* The projections' products: bf16 under QKV_BF16 (the bf16 GEMM), float32
 * otherwise (fp16 has no fast product here). */
static qkv_dtype mha_linear_precision(const qkv_mha *m) { return m->compute == QKV_BF16 ? QKV_BF16 : QKV_F32; }

/* ---- activations ---------------------------------------------------------- */

/* Grow activation buffer i to at least n floats. */
static int act_reserve(qkv_mha *m, int i, int64_t n) {
    return qkv_reserve(&m->act[i], &m->act_cap[i], n, sizeof(float));
}

/* Grow half buffer i to at least n elements. */
static int half_reserve(qkv_mha *m, int i, int64_t n) {
    return qkv_reserve(&m->half[i], &m->half_cap[i], n, sizeof(uint16_t));
}

/* float32 <-> the layer's half type (round to nearest even; exact widening). */
static void to_half(const qkv_mha *m, uint16_t *dst, const float *src, int64_t n) {
    if (m->compute == QKV_BF16) qkv_f32_to_bf16_array(dst, src, (size_t)n);
    else qkv_f32_to_f16_array(dst, src, (size_t)n);
}
static void from_half(const qkv_mha *m, float *dst, const uint16_t *src, int64_t n) {
    if (m->compute == QKV_BF16) qkv_bf16_to_f32_array(dst, src, (size_t)n);
    else qkv_f16_to_f32_array(dst, src, (size_t)n);
}

/* The attention descriptor of this layer for a call of the given sizes. */
void mha_desc(const qkv_mha *m, int64_t batch, int64_t n_q, int64_t n_k, const int64_t *key_lengths,
              qkv_attn_desc *d) {
    const qkv_mha_config *c = &m->cfg;
    *d = c->attn;
    d->dtype = QKV_F32;
    d->batch = batch;
    d->n_q = n_q;
    d->n_k = n_k;
    d->heads = c->heads;
    d->heads_kv = c->heads_kv;
    d->dim = d->dim_v = c->head_dim;
    d->key_lengths = key_lengths;
    d->bias_kind = QKV_BIAS_NONE;
    d->bias = NULL;
    d->num_seqs = 0;
    d->seq_offsets_q = d->seq_offsets_k = NULL;
    d->alibi_slopes = c->pos == QKV_POS_ALIBI ? m->slopes : NULL;
    d->rel_table = NULL;
    d->additive_w1 = d->additive_w2 = d->additive_w = NULL;
    if (c->attn.score == QKV_SCORE_ADDITIVE) {
        d->additive_dim = c->attn.additive_dim;
        d->additive_w1 = m->params + m->off[MHA_AW1];
        d->additive_w2 = m->params + m->off[MHA_AW2];
        d->additive_w = m->params + m->off[MHA_AW];
    }
    if (c->pos == QKV_POS_RELATIVE) {
        d->rel_table = m->params + m->off[MHA_REL];
        d->rel_buckets = c->rel_buckets;
        d->rel_max_distance = c->rel_max_distance;
        d->rel_bidirectional = c->attn.mask != QKV_MASK_CAUSAL && c->attn.mask != QKV_MASK_CAUSAL_WINDOW;
    }
}

void mha_decode_desc(const qkv_mha *m, int64_t batch, int64_t n_q, int64_t n_k, qkv_attn_desc *d) {
    mha_desc(m, batch, n_q, n_k, NULL, d);
    if (d->mask != QKV_MASK_CAUSAL_WINDOW) d->mask = QKV_MASK_CAUSAL;
}

/* add_bias_kv: [B n, w] rows -> [B, n + 1, w] with the extra row first in
 * every batch, in place (x holds B (n + 1) w floats). Batches move from the
 * last down, so no source is overwritten before it is read. */
static void spread_extra(float *x, int64_t B, int64_t n, int64_t w, const float *extra) {
    for (int64_t b = B - 1; b >= 0; b--) {
        memmove(x + (b * (n + 1) + 1) * w, x + b * n * w, (size_t)(n * w) * sizeof(float));
        memcpy(x + b * (n + 1) * w, extra, (size_t)w * sizeof(float));
    }
}

/* The backward of spread_extra: dextra += sum over batches of the extra
 * rows (in double, batch by batch: a fixed order), then [B, n + 1, w] ->
 * [B n, w] in place. */
static void gather_extra(float *x, int64_t B, int64_t n, int64_t w, float *dextra) {
    for (int64_t t = 0; t < w; t++) {
        double acc = 0.0;
        for (int64_t b = 0; b < B; b++) acc += x[b * (n + 1) * w + t];
        dextra[t] += (float)acc;
    }
    for (int64_t b = 0; b < B; b++)
        memmove(x + b * n * w, x + (b * (n + 1) + 1) * w, (size_t)(n * w) * sizeof(float));
}

static qkv_status check_call(const qkv_mha *m, int64_t batch, int64_t n_q, int64_t n_k) {
    if (batch <= 0 || n_q <= 0 || n_k <= 0) return QKV_ERR_BAD_SIZE;
    const qkv_mha_config *c = &m->cfg;
    int64_t big = c->embed_dim;
    if (c->kdim > big) big = c->kdim;
    if (c->vdim > big) big = c->vdim;
    if (c->heads * c->head_dim > big) big = c->heads * c->head_dim;
    int64_t f1[3] = {batch, n_q > n_k ? n_q : n_k, big}, f2[3] = {batch, c->heads, n_q}, x;
    if (!qkv_count_ok(&x, sizeof(float), 3, f1) || !qkv_count_ok(&x, sizeof(float), 3, f2))
        return QKV_ERR_SIZE_OVERFLOW;
    return QKV_OK;
}

qkv_status qkv_mha_forward(qkv_mha *m, int64_t batch, int64_t n_q, int64_t n_k, const float *x_q,
                           const float *x_k, const float *x_v, const int64_t *key_lengths, float *y,
                           float *attn) {
    if (!m || !x_q || !y) return QKV_ERR_NULL_POINTER;
    const qkv_mha_config *c = &m->cfg;
    const int self = x_k == NULL;
    if (self && (n_k != n_q || c->kdim != c->embed_dim || c->vdim != c->embed_dim)) return QKV_ERR_SHAPE;
    if (!x_k) x_k = x_q;
    if (!x_v) {
        if (c->vdim != c->kdim) return QKV_ERR_SHAPE;
        x_v = x_k;
    }
    qkv_status s = check_call(m, batch, n_q, n_k);
    if (s != QKV_OK) return s;
    /* add_bias_kv: the core sees nkc = n_k + 1 keys, the extra one first
     * (mha_internal.h). Under the bottom-right causal alignment query i then
     * sits at p = i + n_k + 1 - n_q and sees keys 0 .. p: the extra key and
     * the same n_k keys as without it - as long as p >= 0 for every query,
     * that is n_q <= n_k + 1 (torch's padded mask shows the extra key to all). */
    const int bkv = c->add_bias_kv;
    if (bkv && n_k == INT64_MAX) return QKV_ERR_SIZE_OVERFLOW;
    const int64_t nkc = n_k + bkv;
    if (bkv && (s = check_call(m, batch, n_q, nkc)) != QKV_OK) return s;
    if (bkv && c->attn.mask == QKV_MASK_CAUSAL && n_q > nkc) return QKV_ERR_UNSUPPORTED;
    if (key_lengths)
        for (int64_t b = 0; b < batch; b++)
            if (key_lengths[b] < 0 || key_lengths[b] > n_k) return QKV_ERR_KEY_LENGTHS;

    const int64_t E = c->embed_dim, H = c->heads, Dh = c->head_dim, Dq = H * Dh, Dkv = c->heads_kv * Dh;
    const int thr = c->attn.threads;
    const qkv_dtype lp = mha_linear_precision(m);
    m->have_forward = 0;
    if (!act_reserve(m, MHA_Q, batch * n_q * Dq) || !act_reserve(m, MHA_K, batch * nkc * Dkv) ||
        !act_reserve(m, MHA_V, batch * nkc * Dkv) || !act_reserve(m, MHA_O, batch * n_q * Dq) ||
        !act_reserve(m, MHA_LSE, batch * H * n_q) ||
        (c->join == QKV_JOIN_MEAN && !act_reserve(m, MHA_OMEAN, batch * n_q * Dh)))
        return QKV_ERR_OUT_OF_MEMORY;
    const float *P = m->params, *bin = c->bias ? P + m->off[MHA_BIN] : NULL;
    float *Q = m->act[MHA_Q], *K = m->act[MHA_K], *V = m->act[MHA_V], *O = m->act[MHA_O];

    /* q, k, v projections */
    if ((s = nn_linear_p(lp, x_q, batch * n_q, E, P + m->off[MHA_WQ], bin, Dq, Q, thr)) != QKV_OK ||
        (s = nn_linear_p(lp, x_k, batch * n_k, c->kdim, P + m->off[MHA_WK], bin ? bin + Dq : NULL, Dkv, K,
                        thr)) != QKV_OK ||
        (s = nn_linear_p(lp, x_v, batch * n_k, c->vdim, P + m->off[MHA_WV], bin ? bin + Dq + Dkv : NULL, Dkv,
                        V, thr)) != QKV_OK)
        return s;
    if (c->pos == QKV_POS_ROPE) {
        /* Queries sit at the bottom-right aligned positions, as masks do. */
        qkv_rope_apply(Q, batch, n_q, H, Dh, n_k >= n_q ? n_k - n_q : 0, c->rope_base, 0);
        qkv_rope_apply(K, batch, n_k, c->heads_kv, Dh, 0, c->rope_base, 0);
    }
    if (bkv) { /* the extra key and value, unrotated, first in every batch row */
        spread_extra(K, batch, n_k, Dkv, P + m->off[MHA_BK]);
        spread_extra(V, batch, n_k, Dkv, P + m->off[MHA_BV]);
    }

    /* Remember the key lengths (as the core sees them) for the backward. */
    if (key_lengths) {
        if (!qkv_reserve(&m->key_lengths, &m->key_lengths_cap, batch, sizeof(int64_t)))
            return QKV_ERR_OUT_OF_MEMORY;
        for (int64_t b = 0; b < batch; b++) m->key_lengths[b] = key_lengths[b] + bkv; /* extra key visible */
    }

    qkv_attn_desc d;
    mha_desc(m, batch, n_q, nkc, key_lengths ? m->key_lengths : NULL, &d);
    if (m->compute != QKV_F32) {
        /* Mixed precision: the core on half copies of q, k, v; O widened back. */
        const int64_t nQ = batch * n_q * Dq, nK = batch * nkc * Dkv;
        if (!half_reserve(m, MHA_HQ, nQ) || !half_reserve(m, MHA_HK, nK) || !half_reserve(m, MHA_HV, nK) ||
            !half_reserve(m, MHA_HO, nQ))
            return QKV_ERR_OUT_OF_MEMORY;
        to_half(m, m->half[MHA_HQ], Q, nQ);
        to_half(m, m->half[MHA_HK], K, nK);
        to_half(m, m->half[MHA_HV], V, nK);
        d.dtype = m->compute;
        s = qkv_attention_forward(&d, m->half[MHA_HQ], m->half[MHA_HK], m->half[MHA_HV], m->half[MHA_HO], attn,
                                  m->act[MHA_LSE]);
        if (s != QKV_OK) return s;
        from_half(m, O, m->half[MHA_HO], nQ);
    } else {
        s = qkv_attention_forward(&d, Q, K, V, O, attn, m->act[MHA_LSE]);
        if (s != QKV_OK) return s;
    }
    if (bkv && attn) {
        /* torch's order: the extra key's weight last in every row. */
        float *a = attn;
        for (int64_t r = 0; r < batch * H * n_q; r++, a += nkc) {
            float first = a[0];
            memmove(a, a + 1, (size_t)n_k * sizeof(float));
            a[n_k] = first;
        }
    }

    const float *bo = c->bias ? P + m->off[MHA_BO] : NULL;
    if (c->join == QKV_JOIN_MEAN) {
        float *Om = m->act[MHA_OMEAN];
        for (int64_t r = 0; r < batch * n_q; r++)
            for (int64_t t = 0; t < Dh; t++) {
                double acc = 0.0;
                for (int64_t h = 0; h < H; h++) acc += O[(r * H + h) * Dh + t];
                Om[r * Dh + t] = (float)(acc / (double)H);
            }
        s = nn_linear_p(lp, Om, batch * n_q, Dh, P + m->off[MHA_WO], bo, E, y, thr);
    } else {
        s = nn_linear_p(lp, O, batch * n_q, Dq, P + m->off[MHA_WO], bo, E, y, thr);
    }
    if (s != QKV_OK) return s;

    /* Remember the call for the backward. */
    m->has_key_lengths = key_lengths != NULL;
    m->batch = batch;
    m->n_q = n_q;
    m->n_k = n_k;
    m->self = self;
    m->kv_same = x_v == x_k;
    m->have_forward = 1;
    return QKV_OK;
}

qkv_status qkv_mha_backward(qkv_mha *m, const float *x_q, const float *x_k, const float *x_v,
                            const float *dy, float *dx_q, float *dx_k, float *dx_v) {
    if (!m || !x_q || !dy) return QKV_ERR_NULL_POINTER;
    if (!m->have_forward) return QKV_ERR_UNSUPPORTED;
    if (m->self && (x_k || dx_k || dx_v)) return QKV_ERR_BAD_PARAMETER;
    if (!m->self && !x_k) return QKV_ERR_NULL_POINTER;
    if (m->kv_same && (x_v && x_v != x_k)) return QKV_ERR_BAD_PARAMETER;
    if (m->kv_same && dx_v) return QKV_ERR_BAD_PARAMETER;
    if (!x_k) x_k = x_q;
    if (!x_v) x_v = x_k;

    const qkv_mha_config *c = &m->cfg;
    const int64_t B = m->batch, nq = m->n_q, nk = m->n_k, E = c->embed_dim, H = c->heads, Dh = c->head_dim;
    const int64_t Dq = H * Dh, Dkv = c->heads_kv * Dh, Do = c->join == QKV_JOIN_MEAN ? Dh : Dq;
    const int thr = c->attn.threads;
    const qkv_dtype lp = mha_linear_precision(m);
    const int bkv = c->add_bias_kv;
    const int64_t nkc = nk + bkv; /* keys the core saw */
    if (!act_reserve(m, MHA_DO, B * nq * Dq) || !act_reserve(m, MHA_DQ, B * nq * Dq) ||
        !act_reserve(m, MHA_DK, B * nkc * Dkv) || !act_reserve(m, MHA_DV, B * nkc * Dkv) ||
        (c->join == QKV_JOIN_MEAN && !act_reserve(m, MHA_DOMEAN, B * nq * Dh)))
        return QKV_ERR_OUT_OF_MEMORY;
    const float *P = m->params;
    float *G = m->grads;
    float *dO = m->act[MHA_DO], *dQ = m->act[MHA_DQ], *dK = m->act[MHA_DK], *dV = m->act[MHA_DV];
    qkv_status s;

    /* Output projection. */
    float *dbo = c->bias ? G + m->off[MHA_BO] : NULL;
    const float *ojoin = c->join == QKV_JOIN_MEAN ? m->act[MHA_OMEAN] : m->act[MHA_O];
    float *dOm = c->join == QKV_JOIN_MEAN ? m->act[MHA_DOMEAN] : dO;
    if ((s = nn_linear_backward_p(lp, ojoin, dy, B * nq, Do, E, P + m->off[MHA_WO], G + m->off[MHA_WO], dbo, dOm, 0,
                                thr)) != QKV_OK)
        return s;
    if (c->join == QKV_JOIN_MEAN)
        for (int64_t r = 0; r < B * nq; r++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t t = 0; t < Dh; t++) dO[(r * H + h) * Dh + t] = dOm[r * Dh + t] / (float)H;

    /* Attention core. */
    qkv_attn_desc d;
    mha_desc(m, B, nq, nkc, m->has_key_lengths ? m->key_lengths : NULL, &d);
    qkv_attn_grads g;
    memset(&g, 0, sizeof g);
    g.dq = dQ;
    g.dk = dK;
    g.dv = dV;
    /* The core overwrites the gradients of the relative table and the
     * additive weights; the layer accumulates them: one scratch block
     * [rel | W1 | W2 | w], laid out as the parameters are. */
    const int64_t t0 = m->off[MHA_REL], t1 = m->off[MHA_REL + 1], a0 = m->off[MHA_AW1], a1 = m->n_params;
    const int64_t nrel = t1 - t0, nadd = a1 - a0;
    float *tmp = NULL;
    if (nrel + nadd > 0) {
        tmp = qkv_alloc((size_t)(nrel + nadd) * sizeof(float));
        if (!tmp) return QKV_ERR_OUT_OF_MEMORY;
        if (nrel) g.d_rel_table = tmp;
        if (nadd) {
            g.d_additive_w1 = tmp + nrel;
            g.d_additive_w2 = tmp + nrel + (m->off[MHA_AW2] - a0);
            g.d_additive_w = tmp + nrel + (m->off[MHA_AW] - a0);
        }
    }
    if (m->compute != QKV_F32) {
        /* Mixed precision: q, k, v, o as the forward stored them in half, dO
         * rounded to half; dq, dk, dv widened back to float32. */
        const int64_t nQ = B * nq * Dq, nK = B * nkc * Dkv;
        if (!half_reserve(m, MHA_HDO, nQ) || !half_reserve(m, MHA_HDQ, nQ) || !half_reserve(m, MHA_HDK, nK) ||
            !half_reserve(m, MHA_HDV, nK)) {
            s = QKV_ERR_OUT_OF_MEMORY;
        } else {
            to_half(m, m->half[MHA_HDO], dO, nQ);
            d.dtype = m->compute;
            g.dq = m->half[MHA_HDQ];
            g.dk = m->half[MHA_HDK];
            g.dv = m->half[MHA_HDV];
            s = qkv_attention_backward(&d, m->half[MHA_HQ], m->half[MHA_HK], m->half[MHA_HV], m->half[MHA_HO],
                                       m->act[MHA_LSE], m->half[MHA_HDO], &g);
            if (s == QKV_OK) {
                from_half(m, dQ, m->half[MHA_HDQ], nQ);
                from_half(m, dK, m->half[MHA_HDK], nK);
                from_half(m, dV, m->half[MHA_HDV], nK);
            }
        }
    } else {
        s = qkv_attention_backward(&d, m->act[MHA_Q], m->act[MHA_K], m->act[MHA_V], m->act[MHA_O],
                                   m->act[MHA_LSE], dO, &g);
    }
    if (s == QKV_OK) {
        for (int64_t i = 0; i < nrel; i++) G[t0 + i] += tmp[i];
        for (int64_t i = 0; i < nadd; i++) G[a0 + i] += tmp[nrel + i];
    }
    qkv_free(tmp);
    if (s != QKV_OK) return s;
    if (bkv) { /* d bias_k, d bias_v; then dK, dV of the projected keys alone */
        gather_extra(dK, B, nk, Dkv, G + m->off[MHA_BK]);
        gather_extra(dV, B, nk, Dkv, G + m->off[MHA_BV]);
    }
    if (c->pos == QKV_POS_ROPE) {
        qkv_rope_apply(dQ, B, nq, H, Dh, nk >= nq ? nk - nq : 0, c->rope_base, 1);
        qkv_rope_apply(dK, B, nk, c->heads_kv, Dh, 0, c->rope_base, 1);
    }

    /* Input projections: parameter gradients, then input gradients. */
    float *dbin = c->bias ? G + m->off[MHA_BIN] : NULL;
    const float *Wq = P + m->off[MHA_WQ], *Wk = P + m->off[MHA_WK], *Wv = P + m->off[MHA_WV];
    float *dbk = dbin ? dbin + Dq : NULL, *dbv = dbin ? dbin + Dq + Dkv : NULL;
    if ((s = nn_linear_backward_p(lp, x_q, dQ, B * nq, E, Dq, Wq, G + m->off[MHA_WQ], dbin, NULL, 0, thr)) != QKV_OK ||
        (s = nn_linear_backward_p(lp, x_k, dK, B * nk, c->kdim, Dkv, Wk, G + m->off[MHA_WK], dbk, NULL, 0, thr)) !=
            QKV_OK ||
        (s = nn_linear_backward_p(lp, x_v, dV, B * nk, c->vdim, Dkv, Wv, G + m->off[MHA_WV], dbv, NULL, 0, thr)) != QKV_OK)
        return s;
    float *dxk = m->self ? dx_q : dx_k, *dxv = m->self ? dx_q : (m->kv_same ? dx_k : dx_v);
    if ((dx_q && (s = nn_linear_backward_p(lp, NULL, dQ, B * nq, E, Dq, Wq, NULL, NULL, dx_q, 0, thr)) != QKV_OK) ||
        (dxk && (s = nn_linear_backward_p(lp, NULL, dK, B * nk, c->kdim, Dkv, Wk, NULL, NULL, dxk, m->self, thr)) !=
                    QKV_OK) ||
        (dxv && (s = nn_linear_backward_p(lp, NULL, dV, B * nk, c->vdim, Dkv, Wv, NULL, NULL, dxv, m->self || m->kv_same,
                                        thr)) != QKV_OK))
        return s;
    return QKV_OK;
}
