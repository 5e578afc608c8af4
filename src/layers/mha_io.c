/* The layer's parameters under torch.nn.MultiheadAttention's state_dict
 * names, so weights move between qkv and PyTorch unchanged. */
#include <stdio.h>
#include <string.h>

#include "core/internal.h"
#include "layers/mha_internal.h"

typedef struct named_block {
    const char *name;
    float *data;
    int ndim;
    int64_t shape[3];
} named_block;

enum { MAX_BLOCKS = 12 };

/* The tensors of a layer, by torch name; returns how many. */
static int blocks(const qkv_mha *m, named_block *nb) {
    const qkv_mha_config *c = &m->cfg;
    int64_t E = c->embed_dim, Dq = c->heads * c->head_dim, Dkv = c->heads_kv * c->head_dim;
    int64_t Do = c->join == QKV_JOIN_MEAN ? c->head_dim : Dq;
    float *P = m->params;
    int n = 0;
    if (m->fused) {
        nb[n++] = (named_block){"in_proj_weight", P + m->off[MHA_WQ], 2, {3 * E, E, 0}};
    } else {
        nb[n++] = (named_block){"q_proj_weight", P + m->off[MHA_WQ], 2, {Dq, E, 0}};
        nb[n++] = (named_block){"k_proj_weight", P + m->off[MHA_WK], 2, {Dkv, c->kdim, 0}};
        nb[n++] = (named_block){"v_proj_weight", P + m->off[MHA_WV], 2, {Dkv, c->vdim, 0}};
    }
    if (c->bias) nb[n++] = (named_block){"in_proj_bias", P + m->off[MHA_BIN], 1, {Dq + 2 * Dkv, 0, 0}};
    nb[n++] = (named_block){"out_proj.weight", P + m->off[MHA_WO], 2, {E, Do, 0}};
    if (c->bias) nb[n++] = (named_block){"out_proj.bias", P + m->off[MHA_BO], 1, {E, 0, 0}};
    if (c->pos == QKV_POS_RELATIVE)
        nb[n++] = (named_block){"rel_table", P + m->off[MHA_REL], 2, {c->heads, c->rel_buckets, 0}};
    if (c->add_bias_kv) { /* torch's shape [1, 1, E]; E = H_kv Dh here */
        nb[n++] = (named_block){"bias_k", P + m->off[MHA_BK], 3, {1, 1, Dkv}};
        nb[n++] = (named_block){"bias_v", P + m->off[MHA_BV], 3, {1, 1, Dkv}};
    }
    if (c->attn.score == QKV_SCORE_ADDITIVE) { /* qkv's own names: torch has no additive score */
        int64_t A = c->attn.additive_dim, Dh = c->head_dim;
        nb[n++] = (named_block){"additive.w1", P + m->off[MHA_AW1], 3, {c->heads, A, Dh}};
        nb[n++] = (named_block){"additive.w2", P + m->off[MHA_AW2], 3, {c->heads, A, Dh}};
        nb[n++] = (named_block){"additive.w", P + m->off[MHA_AW], 2, {c->heads, A, 0}};
    }
    return n;
}

enum { NAME_CAP = 512 };

/* blocks(), each with its full name (prefix + torch name) in names[i]. */
static int named_blocks(const qkv_mha *m, const char *prefix, named_block *nb, char (*names)[NAME_CAP]) {
    int n = blocks(m, nb);
    for (int i = 0; i < n; i++) snprintf(names[i], NAME_CAP, "%s%s", prefix ? prefix : "", nb[i].name);
    return n;
}

qkv_status qkv_mha_load(qkv_mha *m, const qkv_safetensors *st, const char *prefix, char *why,
                        size_t why_len) {
    if (why && why_len) why[0] = '\0';
    if (!m || !st) return QKV_ERR_NULL_POINTER;
    named_block nb[MAX_BLOCKS];
    char names[MAX_BLOCKS][NAME_CAP];
    int n = named_blocks(m, prefix, nb, names);
    /* Check everything before changing anything: a failed load keeps the
     * layer as it was. */
    for (int i = 0; i < n; i++) {
        const char *name = names[i];
        const qkv_array *a = qkv_safetensors_get(st, name);
        if (!a) {
            if (why) snprintf(why, why_len, "tensor '%s' is missing", name);
            return QKV_ERR_FORMAT;
        }
        int ok = a->ndim == nb[i].ndim;
        for (int k = 0; ok && k < nb[i].ndim; k++) ok = a->shape[k] == nb[i].shape[k];
        if (!ok) {
            if (why) {
                if (nb[i].ndim == 1)
                    snprintf(why, why_len, "tensor '%s' should have shape [%lld]", name,
                             (long long)nb[i].shape[0]);
                else if (nb[i].ndim == 2)
                    snprintf(why, why_len, "tensor '%s' should have shape [%lld, %lld]", name,
                             (long long)nb[i].shape[0], (long long)nb[i].shape[1]);
                else
                    snprintf(why, why_len, "tensor '%s' should have shape [%lld, %lld, %lld]", name,
                             (long long)nb[i].shape[0], (long long)nb[i].shape[1], (long long)nb[i].shape[2]);
            }
            return QKV_ERR_SHAPE;
        }
        if (a->dtype != QKV_F32 && a->dtype != QKV_F64) {
            if (why) snprintf(why, why_len, "tensor '%s' is not floating point", name);
            return QKV_ERR_DTYPE;
        }
    }
    for (int i = 0; i < n; i++) {
        const qkv_array *a = qkv_safetensors_get(st, names[i]);
        int64_t cnt = qkv_array_count(a);
        for (int64_t j = 0; j < cnt; j++)
            nb[i].data[j] = a->dtype == QKV_F32 ? ((const float *)a->data)[j]
                                                : (float)((const double *)a->data)[j];
    }
    return QKV_OK;
}

qkv_status qkv_mha_save(const qkv_mha *m, qkv_safetensors *st, const char *prefix) {
    if (!m || !st) return QKV_ERR_NULL_POINTER;
    named_block nb[MAX_BLOCKS];
    char names[MAX_BLOCKS][NAME_CAP];
    int n = named_blocks(m, prefix, nb, names);
    for (int i = 0; i < n; i++) {
        qkv_array a = {.dtype = QKV_F32, .ndim = nb[i].ndim, .data = nb[i].data};
        for (int k = 0; k < nb[i].ndim; k++) a.shape[k] = nb[i].shape[k];
        qkv_status s = qkv_safetensors_put(st, names[i], &a);
        if (s != QKV_OK) return s;
    }
    return QKV_OK;
}
