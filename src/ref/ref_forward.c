/* Reference forward: for every (b, h, i) the row of logits over the visible
 * keys, its normalisation, and O_i = sum_j A'_ij V_j, all in double. */
#include <math.h>
#include <string.h>

#include "ref/ref.h"
#include "ref/ref_common.h"

qkv_status qkv_ref_forward(const qkv_plan *p, const void *q, const void *k, const void *v,
                           void *out, void *attn, void *lse) {
    const qkv_attn_desc *d = &p->d;
    ref_inputs in;
    qkv_status st = ref_inputs_make(p, q, k, v, &in);
    if (st != QKV_OK) return st;
    double *orow = qkv_alloc((size_t)d->dim_v * sizeof(double));
    if (!orow) {
        ref_inputs_free(&in);
        return QKV_ERR_OUT_OF_MEMORY;
    }
    const int64_t Dv = d->dim_v;
    for (int64_t b = 0; b < d->batch; b++) {
        for (int64_t h = 0; h < d->heads; h++) {
            int64_t hk = h / p->group;
            ref_prepare_head(p, &in, b, h);
            for (int64_t i = 0; i < d->n_q; i++) {
                int64_t lo, hi;
                qkv_plan_key_range(p, b, i, &lo, &hi);
                int64_t visible = ref_row_logits(p, &in, b, h, i, lo, hi);
                double row_lse;
                ref_row_normalise(p, &in, lo, hi, visible, &row_lse);

                memset(orow, 0, (size_t)Dv * sizeof(double));
                for (int64_t j = lo; j < hi; j++) {
                    if (in.s[j] == -INFINITY) continue; /* masked: V_j is never read */
                    double w = in.p[j];
                    if (d->dropout > 0.0) w *= qkv_attn_dropout_keep(p, b, h, i, j);
                    if (w == 0.0 && d->dropout > 0.0) continue; /* dropped */
                    const double *vj = in.v + ref_idx(b, j, hk, d->n_k, d->heads_kv, Dv);
                    for (int64_t t = 0; t < Dv; t++) orow[t] += w * vj[t];
                }
                int64_t o_at = ref_idx(b, i, h, d->n_q, d->heads, Dv);
                for (int64_t t = 0; t < Dv; t++) ref_store(out, d->dtype, o_at + t, orow[t]);

                int64_t row = (b * d->heads + h) * d->n_q + i;
                if (lse) ref_store(lse, d->dtype, row, row_lse);
                if (attn)
                    for (int64_t j = 0; j < d->n_k; j++)
                        ref_store(attn, d->dtype, row * d->n_k + j,
                                  (j >= lo && j < hi) ? in.p[j] : 0.0);
            }
        }
    }
    qkv_free(orow);
    ref_inputs_free(&in);
    return QKV_OK;
}

qkv_status qkv_ref_attention_rows(const qkv_plan *p, const void *q, const void *k, int64_t row0, int64_t rows,
                                  void *attn_rows) {
    const qkv_attn_desc *d = &p->d;
    ref_inputs in;
    /* V is never read: the logits and weights need only Q and K. */
    qkv_status st = ref_inputs_make(p, q, k, NULL, &in);
    if (st != QKV_OK) return st;
    for (int64_t b = 0; b < d->batch; b++)
        for (int64_t h = 0; h < d->heads; h++) {
            ref_prepare_head(p, &in, b, h);
            for (int64_t r = 0; r < rows; r++) {
                int64_t i = row0 + r, lo, hi;
                qkv_plan_key_range(p, b, i, &lo, &hi);
                int64_t visible = ref_row_logits(p, &in, b, h, i, lo, hi);
                double row_lse;
                ref_row_normalise(p, &in, lo, hi, visible, &row_lse);
                int64_t at = ((b * d->heads + h) * rows + r) * d->n_k;
                for (int64_t j = 0; j < d->n_k; j++)
                    ref_store(attn_rows, d->dtype, at + j, (j >= lo && j < hi) ? in.p[j] : 0.0);
            }
        }
    ref_inputs_free(&in);
    return QKV_OK;
}
