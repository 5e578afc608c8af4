/* The public attention entry points: validate once, then hand the plan to an
 * implementation. Every implementation sees the same validated plan, so
 * argument checking lives here and nowhere else. */
#include "attn/fast.h"
#include "attn/half.h"
#include "core/internal.h"
#include "ref/ref.h"

/* The fast kernels do not compute the in-kernel position biases (ALiBi,
 * T5 relative) nor attention dropout yet: such calls go to the reference,
 * which computes them per logit (still no n x n buffer). */
static int fast_ok(const qkv_plan *p) {
    return !p->d.alibi_slopes && !p->d.rel_table && p->d.dropout == 0.0 && qkv_fast_supported(p);
}

static qkv_status attention_forward(const qkv_attn_desc *desc, const void *q, const void *k,
                                   const void *v, void *out, void *attn, void *lse) {
    qkv_plan p;
    qkv_status s = qkv_plan_make(desc, &p);
    if (s != QKV_OK) return s;
    if (!q || !k || !v || !out) return QKV_ERR_NULL_POINTER;
    if (attn && p.n_attn_elems < 0) return QKV_ERR_SIZE_OVERFLOW;
    /* AUTO: the fast path for F32 when it supports the request (F64 and the
     * additive score: the reference). */
    if (p.d.impl != QKV_IMPL_REFERENCE) {
        if (fast_ok(&p)) return qkv_fast_forward(&p, q, k, v, out, attn, lse);
        if (p.d.impl == QKV_IMPL_FAST) return QKV_ERR_UNSUPPORTED;
    }
    return qkv_ref_forward(&p, q, k, v, out, attn, lse);
}

static qkv_status attention_backward(const qkv_attn_desc *desc, const void *q, const void *k,
                                    const void *v, const void *out, const void *lse,
                                    const void *dout, const qkv_attn_grads *grads) {
    qkv_plan p;
    qkv_status s = qkv_plan_make(desc, &p);
    if (s != QKV_OK) return s;
    if (!q || !k || !v || !dout || !grads || !grads->dq || !grads->dk || !grads->dv)
        return QKV_ERR_NULL_POINTER;
    if (p.d.impl != QKV_IMPL_REFERENCE) {
        if (fast_ok(&p)) return qkv_fast_backward(&p, q, k, v, out, lse, dout, grads);
        if (p.d.impl == QKV_IMPL_FAST) return QKV_ERR_UNSUPPORTED;
    }
    (void)out; /* the reference recomputes the forward in double */
    (void)lse;
    return qkv_ref_backward(&p, q, k, v, dout, grads);
}

/* The public entry points: the optional scan for non-finite inputs
 * (check_finite) before anything is written, and an allocation refused by
 * qkv_set_memory_limit reported as such (see core/alloc.c, core/finite.c). */
qkv_status qkv_attention_forward(const qkv_attn_desc *desc, const void *q, const void *k,
                                 const void *v, void *out, void *attn, void *lse) {
    (void)qkv_alloc_take_refusal();
    if (desc && qkv_half_dtype(desc->dtype)) return qkv_half_forward(desc, q, k, v, out, attn, lse);
    qkv_status s = qkv_attn_check_finite(desc, q, k, v, NULL, NULL, NULL);
    if (s == QKV_OK) s = attention_forward(desc, q, k, v, out, attn, lse);
    return s == QKV_ERR_OUT_OF_MEMORY ? qkv_alloc_failure_status() : s;
}

qkv_status qkv_attention_backward(const qkv_attn_desc *desc, const void *q, const void *k,
                                  const void *v, const void *out, const void *lse,
                                  const void *dout, const qkv_attn_grads *grads) {
    (void)qkv_alloc_take_refusal();
    if (desc && qkv_half_dtype(desc->dtype))
        return qkv_half_backward(desc, q, k, v, out, lse, dout, grads);
    qkv_status s = qkv_attn_check_finite(desc, q, k, v, dout, out, lse);
    if (s == QKV_OK) s = attention_backward(desc, q, k, v, out, lse, dout, grads);
    return s == QKV_ERR_OUT_OF_MEMORY ? qkv_alloc_failure_status() : s;
}

qkv_status qkv_attention_rows(const qkv_attn_desc *desc, const void *q, const void *k, int64_t row0,
                              int64_t rows, void *attn_rows) {
    qkv_plan p;
    qkv_status s = qkv_plan_make(desc, &p);
    if (s != QKV_OK) return s;
    if (!q || !k || !attn_rows) return QKV_ERR_NULL_POINTER;
    if (p.d.dtype != QKV_F32 && p.d.dtype != QKV_F64) return QKV_ERR_DTYPE;
    if (row0 < 0 || rows <= 0 || row0 > p.d.n_q - rows) return QKV_ERR_BAD_SIZE;
    int64_t f[4] = {p.d.batch, p.d.heads, rows, p.d.n_k}, n;
    if (!qkv_count_ok(&n, sizeof(double), 4, f)) return QKV_ERR_SIZE_OVERFLOW;
    return qkv_ref_attention_rows(&p, q, k, row0, rows, attn_rows);
}
