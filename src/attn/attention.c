/* The public attention entry points: make the plan (validate once), then
 * hand it to an implementation. Every implementation sees the same
 * validated plan, so argument checking lives in core/plan.c and nowhere
 * else; the half-precision path runs the float32 dispatch below on float
 * copies under the same plan (dtype F32), it does not enter the API again. */
#include "attn/attention.h"
#include "attn/fast.h"
#include "attn/fast_additive.h"
#include "attn/half.h"
#include "ref/ref.h"

/* The fast kernels compute the in-kernel position biases (ALiBi, T5's 1-D
 * buckets: fast_posbias.c; qkv_fast_supported leaves the 2-D image offsets
 * and non-finite bias parameters to the reference) and attention dropout
 * (fast_dropout.c). */
static int fast_ok(const qkv_plan *p) {
    return qkv_fast_supported(p);
}

/* F32 / F64: the optional scan for non-finite inputs (check_finite) before
 * anything is written, the NULL checks, then an implementation. AUTO: the
 * fast path for F32 when it supports the request, the additive score's own
 * fast path (fast_additive.c) for it; F64 and what neither supports: the
 * reference. */
static qkv_status forward_float(const qkv_plan *p, const void *q, const void *k, const void *v, void *out,
                                void *attn, void *lse) {
    qkv_status s;
    if (p->d.check_finite && q && k && v && (s = qkv_plan_check_finite(p, q, k, v, NULL, NULL, NULL)) != QKV_OK)
        return s;
    if (!q || !k || !v || !out) return QKV_ERR_NULL_POINTER;
    if (attn && p->n_attn_elems < 0) return QKV_ERR_SIZE_OVERFLOW;
    if (p->d.impl != QKV_IMPL_REFERENCE) {
        if (qkv_fast_additive_supported(p)) return qkv_fast_additive_forward(p, q, k, v, out, attn, lse);
        if (fast_ok(p)) return qkv_fast_forward(p, q, k, v, out, attn, lse);
        if (p->d.impl == QKV_IMPL_FAST) return QKV_ERR_UNSUPPORTED;
    }
    return qkv_ref_forward(p, q, k, v, out, attn, lse);
}

static qkv_status backward_float(const qkv_plan *p, const void *q, const void *k, const void *v,
                                 const void *out, const void *lse, const void *dout,
                                 const qkv_attn_grads *grads) {
    qkv_status s;
    if (p->d.check_finite && q && k && v && (s = qkv_plan_check_finite(p, q, k, v, dout, out, lse)) != QKV_OK)
        return s;
    if (!q || !k || !v || !dout || !grads || !grads->dq || !grads->dk || !grads->dv)
        return QKV_ERR_NULL_POINTER;
    if (p->d.impl != QKV_IMPL_REFERENCE) {
        if (qkv_fast_additive_supported(p)) return qkv_fast_additive_backward(p, q, k, v, out, lse, dout, grads);
        if (fast_ok(p)) return qkv_fast_backward(p, q, k, v, out, lse, dout, grads);
        if (p->d.impl == QKV_IMPL_FAST) return QKV_ERR_UNSUPPORTED;
    }
    /* the reference recomputes the forward in double: out and lse unused */
    return qkv_ref_backward(p, q, k, v, dout, grads);
}

/* BF16 / F16: the bf16 fast path when it applies (check_finite needs the
 * scan of the float copies), else the float32 dispatch on float copies. */
static qkv_status forward_half(const qkv_plan *p, const void *q, const void *k, const void *v, void *out,
                               void *attn, void *lse) {
    if (!q || !k || !v || !out) return QKV_ERR_NULL_POINTER;
    qkv_status s;
    if (p->d.dtype == QKV_BF16 && !p->d.check_finite && p->d.impl != QKV_IMPL_REFERENCE && !attn &&
        (s = qkv_half_fast_forward(p, q, k, v, out, lse)) != QKV_ERR_UNSUPPORTED)
        return s;
    qkv_half_copy c;
    if ((s = qkv_half_widen(p, q, k, v, NULL, NULL, 0, &c)) != QKV_OK) return s;
    qkv_plan p32 = *p;
    p32.d.dtype = QKV_F32;
    s = forward_float(&p32, c.q, c.k, c.v, c.out, attn, lse);
    if (s == QKV_OK) qkv_half_narrow(p, out, c.out, p->n_o_elems);
    qkv_half_copy_free(&c);
    return s;
}

static qkv_status backward_half(const qkv_plan *p, const void *q, const void *k, const void *v,
                                const void *out, const void *lse, const void *dout,
                                const qkv_attn_grads *grads) {
    if (!q || !k || !v || !dout || !grads || !grads->dq || !grads->dk || !grads->dv)
        return QKV_ERR_NULL_POINTER;
    qkv_status s;
    if (p->d.dtype == QKV_BF16 && !p->d.check_finite && p->d.impl != QKV_IMPL_REFERENCE &&
        (s = qkv_half_fast_backward(p, q, k, v, out, lse, dout, grads->dq, grads->dk, grads->dv)) !=
            QKV_ERR_UNSUPPORTED)
        return s;
    qkv_half_copy c;
    if ((s = qkv_half_widen(p, q, k, v, out, dout, 1, &c)) != QKV_OK) return s;
    qkv_plan p32 = *p;
    p32.d.dtype = QKV_F32;
    qkv_attn_grads g = *grads;
    g.dq = c.dq;
    g.dk = c.dk;
    g.dv = c.dv;
    s = backward_float(&p32, c.q, c.k, c.v, c.out, lse, c.dout, &g);
    if (s == QKV_OK) {
        qkv_half_narrow(p, grads->dq, c.dq, p->n_q_elems);
        qkv_half_narrow(p, grads->dk, c.dk, p->n_k_elems);
        qkv_half_narrow(p, grads->dv, c.dv, p->n_v_elems);
    }
    qkv_half_copy_free(&c);
    return s;
}

/* An allocation refused by qkv_set_memory_limit is reported as such (see
 * core/alloc.c): the refusals of earlier calls are forgotten first. */
qkv_status qkv_attn_forward_plan(const qkv_plan *p, const void *q, const void *k, const void *v, void *out,
                                 void *attn, void *lse) {
    (void)qkv_alloc_take_refusal();
    qkv_status s = qkv_half_dtype(p->d.dtype) ? forward_half(p, q, k, v, out, attn, lse)
                                              : forward_float(p, q, k, v, out, attn, lse);
    return s == QKV_ERR_OUT_OF_MEMORY ? qkv_alloc_failure_status() : s;
}

qkv_status qkv_attn_backward_plan(const qkv_plan *p, const void *q, const void *k, const void *v,
                                  const void *out, const void *lse, const void *dout,
                                  const qkv_attn_grads *grads) {
    (void)qkv_alloc_take_refusal();
    qkv_status s = qkv_half_dtype(p->d.dtype) ? backward_half(p, q, k, v, out, lse, dout, grads)
                                              : backward_float(p, q, k, v, out, lse, dout, grads);
    return s == QKV_ERR_OUT_OF_MEMORY ? qkv_alloc_failure_status() : s;
}

qkv_status qkv_attention_forward(const qkv_attn_desc *desc, const void *q, const void *k,
                                 const void *v, void *out, void *attn, void *lse) {
    qkv_plan p;
    qkv_status s = qkv_plan_make(desc, &p);
    return s != QKV_OK ? s : qkv_attn_forward_plan(&p, q, k, v, out, attn, lse);
}

qkv_status qkv_attention_backward(const qkv_attn_desc *desc, const void *q, const void *k,
                                  const void *v, const void *out, const void *lse,
                                  const void *dout, const qkv_attn_grads *grads) {
    qkv_plan p;
    qkv_status s = qkv_plan_make(desc, &p);
    return s != QKV_OK ? s : qkv_attn_backward_plan(&p, q, k, v, out, lse, dout, grads);
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
