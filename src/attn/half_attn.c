/* The portable half-precision path's conversions: q, k, v (and out, dout)
 * widened to float (exact for both bf16 and fp16) and float results rounded
 * back to half (nearest-even). attention.c runs the float32 attention on the
 * copies with every feature it has (masks, GQA, scores, biases, the fast and
 * reference implementations) under the call's own plan. Costs O(size of the
 * tensors) in conversions and float copies, nothing n x n. Where the CPU has
 * bf16 dot products the bf16 forward and backward take the fast paths
 * (half_fwd.c, half_bwd.c) instead. */
#include <string.h>

#include "attn/half.h"
#include "core/half.h"

/* A float copy of a half tensor (n elements), or NULL for NULL. *fail is
 * set when the allocation fails. */
static float *widen(const void *x, int64_t n, qkv_dtype dt, int *fail) {
    if (!x || *fail) return NULL;
    float *y = qkv_alloc((size_t)(n ? n : 1) * sizeof(float));
    if (!y) {
        *fail = 1;
        return NULL;
    }
    if (dt == QKV_BF16) qkv_bf16_to_f32_array(y, x, (size_t)n);
    else qkv_f16_to_f32_array(y, x, (size_t)n);
    return y;
}

static float *scratch(int64_t n, int *fail) {
    if (*fail) return NULL;
    float *y = qkv_alloc((size_t)(n ? n : 1) * sizeof(float));
    if (!y) *fail = 1;
    return y;
}

qkv_status qkv_half_widen(const qkv_plan *p, const void *q, const void *k, const void *v, const void *out,
                          const void *dout, int backward, qkv_half_copy *c) {
    const qkv_dtype dt = p->d.dtype;
    int fail = 0;
    memset(c, 0, sizeof *c);
    c->q = widen(q, p->n_q_elems, dt, &fail);
    c->k = widen(k, p->n_k_elems, dt, &fail);
    c->v = widen(v, p->n_v_elems, dt, &fail);
    if (!backward) {
        c->out = scratch(p->n_o_elems, &fail);
    } else {
        c->out = widen(out, p->n_o_elems, dt, &fail);
        c->dout = widen(dout, p->n_o_elems, dt, &fail);
        c->dq = scratch(p->n_q_elems, &fail);
        c->dk = scratch(p->n_k_elems, &fail);
        c->dv = scratch(p->n_v_elems, &fail);
    }
    if (!fail) return QKV_OK;
    qkv_half_copy_free(c);
    return QKV_ERR_OUT_OF_MEMORY;
}

void qkv_half_narrow(const qkv_plan *p, void *dst, const float *src, int64_t n) {
    if (p->d.dtype == QKV_BF16) qkv_f32_to_bf16_array(dst, src, (size_t)n);
    else qkv_f32_to_f16_array(dst, src, (size_t)n);
}

void qkv_half_copy_free(qkv_half_copy *c) {
    QKV_FREE_ALL(c->q, c->k, c->v, c->out, c->dout, c->dq, c->dk, c->dv);
    memset(c, 0, sizeof *c);
}
