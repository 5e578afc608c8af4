/* check_finite (qkv_attn_desc): reject NaN and infinities in the inputs of
 * an attention call before anything is computed or written. Off by default:
 * then non-finite values propagate as the header documents. The entry points
 * (attn/attention.c, dist/ring.c) call it with the call's plan. */
#include <math.h>

#include "core/internal.h"

/* 1 when every element is finite; allow_neg_inf: -inf is allowed (the bias's
 * mask, the log-sum-exp of a row without keys). */
static int all_finite(const void *x, int64_t n, qkv_dtype dt, int allow_neg_inf) {
    if (!x) return 1;
    if (dt != QKV_F32 && dt != QKV_F64) return 1; /* other storage types: not scanned */
    if (dt == QKV_F32) {
        const float *f = x;
        for (int64_t i = 0; i < n; i++)
            if (!isfinite(f[i]) && !(allow_neg_inf && f[i] == -INFINITY)) return 0;
    } else {
        const double *d = x;
        for (int64_t i = 0; i < n; i++)
            if (!isfinite(d[i]) && !(allow_neg_inf && d[i] == -INFINITY)) return 0;
    }
    return 1;
}

qkv_status qkv_plan_check_finite(const qkv_plan *p, const void *q, const void *k, const void *v,
                                 const void *dout, const void *out, const void *lse) {
    const qkv_attn_desc *d = &p->d;
    /* q, k, v, out, dout are of the descriptor's dtype; the other tensors
     * are float64 in a float64 call and float32 otherwise. */
    qkv_dtype t = d->dtype, ta = t == QKV_F64 ? QKV_F64 : QKV_F32;
    int ok = all_finite(q, p->n_q_elems, t, 0) && all_finite(k, p->n_k_elems, t, 0) &&
             all_finite(v, p->n_v_elems, t, 0) && all_finite(dout, p->n_o_elems, t, 0) &&
             all_finite(out, p->n_o_elems, t, 0) && all_finite(lse, p->n_lse_elems, ta, 1);
    t = ta;
    if (ok && d->bias_kind != QKV_BIAS_NONE) ok = all_finite(d->bias, p->n_bias_elems, t, 1);
    if (ok && d->score == QKV_SCORE_ADDITIVE)
        ok = all_finite(d->additive_w1, p->n_add_w_elems, t, 0) &&
             all_finite(d->additive_w2, p->n_add_w_elems, t, 0) &&
             all_finite(d->additive_w, p->n_add_v_elems, t, 0);
    if (ok) ok = all_finite(d->alibi_slopes, d->heads, t, 0);
    if (ok && d->rel_table) ok = all_finite(d->rel_table, p->n_rel_elems, t, 0);
    return ok ? QKV_OK : QKV_ERR_NOT_FINITE;
}
