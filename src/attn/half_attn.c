/* The portable half-precision path: widen q, k, v (and out, dout) to float
 * (exact for both bf16 and fp16), run the float32 attention with every
 * feature it has (masks, GQA, scores, biases, the fast and reference
 * implementations), and round what is stored back to half (nearest-even).
 * Costs O(size of the tensors) in conversions and float copies, nothing
 * n x n. Where the CPU has bf16 dot products the bf16 forward and backward
 * take the fast paths (half_fwd.c, half_bwd.c) instead. */
#include "attn/half.h"
#include "core/half.h"

typedef void (*widen_fn)(float *, const uint16_t *, size_t);
typedef void (*narrow_fn)(uint16_t *, const float *, size_t);

/* A float copy of a half tensor (n elements), or NULL for NULL. *fail is
 * set when the allocation fails. */
static float *widen(const void *x, int64_t n, widen_fn f, int *fail) {
    if (!x) return NULL;
    float *y = qkv_alloc((size_t)(n ? n : 1) * sizeof(float));
    if (!y) {
        *fail = 1;
        return NULL;
    }
    f(y, x, (size_t)n);
    return y;
}

static float *scratch(int64_t n, int *fail) {
    float *y = qkv_alloc((size_t)(n ? n : 1) * sizeof(float));
    if (!y) *fail = 1;
    return y;
}

qkv_status qkv_half_forward(const qkv_attn_desc *desc, const void *q, const void *k, const void *v,
                            void *out, void *attn, void *lse) {
    qkv_plan p;
    qkv_status s = qkv_plan_make(desc, &p);
    if (s != QKV_OK) return s;
    if (!q || !k || !v || !out) return QKV_ERR_NULL_POINTER;
    const int bf = desc->dtype == QKV_BF16;
    /* The bf16 fast path when it applies (it checks everything else itself;
     * check_finite needs the scan of the float path below). */
    if (bf && !desc->check_finite && p.d.impl != QKV_IMPL_REFERENCE && !attn) {
        s = qkv_half_fast_forward(&p, q, k, v, out, lse);
        if (s != QKV_ERR_UNSUPPORTED) return s == QKV_ERR_OUT_OF_MEMORY ? qkv_alloc_failure_status() : s;
    }
    widen_fn wf = bf ? qkv_bf16_to_f32_array : qkv_f16_to_f32_array;
    narrow_fn nf = bf ? qkv_f32_to_bf16_array : qkv_f32_to_f16_array;
    int fail = 0;
    float *qf = widen(q, p.n_q_elems, wf, &fail);
    float *kf = fail ? NULL : widen(k, p.n_k_elems, wf, &fail);
    float *vf = fail ? NULL : widen(v, p.n_v_elems, wf, &fail);
    float *of = fail ? NULL : scratch(p.n_o_elems, &fail);
    if (fail) {
        s = qkv_alloc_failure_status();
    } else {
        qkv_attn_desc d32 = *desc;
        d32.dtype = QKV_F32;
        s = qkv_attention_forward(&d32, qf, kf, vf, of, attn, lse);
        if (s == QKV_OK) nf(out, of, (size_t)p.n_o_elems);
    }
    qkv_free(qf);
    qkv_free(kf);
    qkv_free(vf);
    qkv_free(of);
    return s;
}

qkv_status qkv_half_backward(const qkv_attn_desc *desc, const void *q, const void *k,
                             const void *v, const void *out, const void *lse, const void *dout,
                             const qkv_attn_grads *grads) {
    qkv_plan p;
    qkv_status s = qkv_plan_make(desc, &p);
    if (s != QKV_OK) return s;
    if (!q || !k || !v || !dout || !grads || !grads->dq || !grads->dk || !grads->dv)
        return QKV_ERR_NULL_POINTER;
    const int bf = desc->dtype == QKV_BF16;
    /* The bf16 fast backward when it applies (it checks the rest itself). */
    if (bf && !desc->check_finite && p.d.impl != QKV_IMPL_REFERENCE) {
        s = qkv_half_fast_backward(&p, q, k, v, out, lse, dout, grads->dq, grads->dk, grads->dv);
        if (s != QKV_ERR_UNSUPPORTED) return s == QKV_ERR_OUT_OF_MEMORY ? qkv_alloc_failure_status() : s;
    }
    widen_fn wf = bf ? qkv_bf16_to_f32_array : qkv_f16_to_f32_array;
    narrow_fn nf = bf ? qkv_f32_to_bf16_array : qkv_f32_to_f16_array;
    int fail = 0;
    float *qf = widen(q, p.n_q_elems, wf, &fail);
    float *kf = fail ? NULL : widen(k, p.n_k_elems, wf, &fail);
    float *vf = fail ? NULL : widen(v, p.n_v_elems, wf, &fail);
    float *of = fail ? NULL : widen(out, p.n_o_elems, wf, &fail);
    float *gf = fail ? NULL : widen(dout, p.n_o_elems, wf, &fail);
    float *dq = fail ? NULL : scratch(p.n_q_elems, &fail);
    float *dk = fail ? NULL : scratch(p.n_k_elems, &fail);
    float *dv = fail ? NULL : scratch(p.n_v_elems, &fail);
    if (fail) {
        s = qkv_alloc_failure_status();
    } else {
        qkv_attn_desc d32 = *desc;
        d32.dtype = QKV_F32;
        qkv_attn_grads g = *grads;
        g.dq = dq;
        g.dk = dk;
        g.dv = dv;
        s = qkv_attention_backward(&d32, qf, kf, vf, of, lse, gf, &g);
        if (s == QKV_OK) {
            nf(grads->dq, dq, (size_t)p.n_q_elems);
            nf(grads->dk, dk, (size_t)p.n_k_elems);
            nf(grads->dv, dv, (size_t)p.n_v_elems);
        }
    }
    qkv_free(qf);
    qkv_free(kf);
    qkv_free(vf);
    qkv_free(of);
    qkv_free(gf);
    qkv_free(dq);
    qkv_free(dk);
    qkv_free(dv);
    return s;
}
