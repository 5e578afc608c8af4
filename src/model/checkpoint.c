/* A model in a safetensors set: every parameter under a readable name (the
 * attention layers with torch.nn.MultiheadAttention's names) and the
 * configuration as "__metadata__" strings, so a checkpoint is self-describing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "model/model_internal.h"

static const char *const KEYS[] = {"vocab", "dim", "heads", "layers", "mlp_dim", "max_seq", "causal",
                                   "tie_embeddings", "pos", "dropout"};
enum { NKEYS = sizeof KEYS / sizeof KEYS[0] };

qkv_status qkv_model_save(const qkv_model *m, qkv_safetensors *st) {
    if (!m || !st) return QKV_ERR_NULL_POINTER;
    const qkv_model_config *c = &m->cfg;
    char v[NKEYS][48];
    snprintf(v[0], 48, "%lld", (long long)c->vocab);
    snprintf(v[1], 48, "%lld", (long long)c->dim);
    snprintf(v[2], 48, "%lld", (long long)c->heads);
    snprintf(v[3], 48, "%lld", (long long)c->layers);
    snprintf(v[4], 48, "%lld", (long long)m->F);
    snprintf(v[5], 48, "%lld", (long long)c->max_seq);
    snprintf(v[6], 48, "%d", c->causal);
    snprintf(v[7], 48, "%d", c->tie_embeddings);
    snprintf(v[8], 48, "%d", (int)c->pos);
    snprintf(v[9], 48, "%.17g", c->dropout);
    qkv_status s = qkv_safetensors_set_meta(st, "format", "qkv-transformer-1");
    for (int i = 0; i < NKEYS && s == QKV_OK; i++) s = qkv_safetensors_set_meta(st, KEYS[i], v[i]);
    for (int64_t i = 0; i < m->n_seg && s == QKV_OK; i++) {
        const model_segment *sg = &m->seg[i];
        if (sg->is_mha) {
            s = qkv_mha_save(m->attn[sg->layer], st, sg->name);
            continue;
        }
        qkv_array a;
        memset(&a, 0, sizeof a);
        a.dtype = QKV_F32;
        a.ndim = sg->ndim;
        a.shape[0] = sg->shape[0];
        a.shape[1] = sg->shape[1];
        a.data = sg->param;
        s = qkv_safetensors_put(st, sg->name, &a);
    }
    return s;
}

static int parse_i64(const char *s, int64_t *out) {
    if (!s || !*s) return 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (*end) return 0;
    *out = v;
    return 1;
}

qkv_status qkv_model_config_from(const qkv_safetensors *st, qkv_model_config *cfg, char *why, size_t why_len) {
    if (!st || !cfg) return QKV_ERR_NULL_POINTER;
    const char *fmt = qkv_safetensors_get_meta(st, "format");
    if (!fmt || strcmp(fmt, "qkv-transformer-1") != 0) {
        if (why) snprintf(why, why_len, "not a qkv transformer checkpoint (metadata 'format' missing or unknown)");
        return QKV_ERR_FORMAT;
    }
    int64_t v[NKEYS - 1];
    for (int i = 0; i < NKEYS - 1; i++)
        if (!parse_i64(qkv_safetensors_get_meta(st, KEYS[i]), &v[i])) {
            if (why) snprintf(why, why_len, "configuration entry '%s' missing or not an integer", KEYS[i]);
            return QKV_ERR_FORMAT;
        }
    const char *d = qkv_safetensors_get_meta(st, "dropout");
    char *end = NULL;
    double dropout = d ? strtod(d, &end) : -1;
    if (!d || *end) {
        if (why) snprintf(why, why_len, "configuration entry 'dropout' missing or not a number");
        return QKV_ERR_FORMAT;
    }
    qkv_model_config_init(cfg, v[0], v[5]);
    cfg->dim = v[1];
    cfg->heads = v[2];
    cfg->layers = v[3];
    cfg->mlp_dim = v[4];
    cfg->causal = (int)v[6];
    cfg->tie_embeddings = (int)v[7];
    cfg->pos = (qkv_posenc)v[8];
    cfg->dropout = dropout;
    return QKV_OK;
}

qkv_status qkv_model_load(qkv_model *m, const qkv_safetensors *st, char *why, size_t why_len) {
    if (!m || !st) return QKV_ERR_NULL_POINTER;
    qkv_model_config c;
    qkv_status s = qkv_model_config_from(st, &c, why, why_len);
    if (s != QKV_OK) return s;
    const qkv_model_config *h = &m->cfg;
    if (c.vocab != h->vocab || c.dim != h->dim || c.heads != h->heads || c.layers != h->layers || c.mlp_dim != m->F ||
        c.max_seq != h->max_seq || c.causal != h->causal || c.tie_embeddings != h->tie_embeddings || c.pos != h->pos) {
        if (why) snprintf(why, why_len, "the checkpoint's configuration differs from the model's");
        return QKV_ERR_SHAPE;
    }
    /* Check every tensor before writing any, so a failed load changes nothing. */
    for (int pass = 0; pass < 2; pass++)
        for (int64_t i = 0; i < m->n_seg; i++) {
            model_segment *sg = &m->seg[i];
            if (sg->is_mha) {
                if (pass == 1 && (s = qkv_mha_load(m->attn[sg->layer], st, sg->name, why, why_len)) != QKV_OK) return s;
                continue;
            }
            const qkv_array *a = qkv_safetensors_get(st, sg->name);
            if (!a || a->dtype != QKV_F32 || qkv_array_count(a) != sg->count) {
                if (why) snprintf(why, why_len, "tensor '%s' missing or misshapen", sg->name);
                return QKV_ERR_FORMAT;
            }
            if (pass == 1) memcpy(sg->param, a->data, (size_t)sg->count * sizeof(float));
        }
    return QKV_OK;
}
