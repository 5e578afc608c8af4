/* Half-precision storage (QKV_BF16, QKV_F16) for the attention entry points
 * (docs/HALF.md). Internal; called by attention.c before anything else. */
#ifndef QKV_ATTN_HALF_H
#define QKV_ATTN_HALF_H

#include "core/internal.h"

static inline int qkv_half_dtype(qkv_dtype t) { return t == QKV_BF16 || t == QKV_F16; }

/* qkv_attention_forward / _backward for a descriptor of dtype BF16 or F16:
 * the same contract, with the half tensors and float32 others of qkv.h. */
qkv_status qkv_half_forward(const qkv_attn_desc *desc, const void *q, const void *k, const void *v,
                            void *out, void *attn, void *lse);
qkv_status qkv_half_backward(const qkv_attn_desc *desc, const void *q, const void *k,
                             const void *v, const void *out, const void *lse, const void *dout,
                             const qkv_attn_grads *grads);

/* The bf16 fast forward (half_fwd.c): tiles multiplied from bf16 by the
 * AVX512-BF16 kernels, softmax in float. Returns QKV_ERR_UNSUPPORTED, having
 * written nothing, when it does not apply (no such CPU, forced off by
 * QKV_ARCH, or a feature it lacks); then the portable path runs. */
qkv_status qkv_half_fast_forward(const qkv_plan *p, const uint16_t *q, const uint16_t *k,
                                 const uint16_t *v, uint16_t *out, float *lse);

/* The bf16 fast backward (half_bwd.c): the five tile products on the same
 * kernels, softmax gradient in float; out and lse may be NULL (recomputed
 * by the fast forward). Returns QKV_ERR_UNSUPPORTED, having written no
 * gradient, when it does not apply (as the forward, plus: an inf or NaN in
 * q, k, v or dout, or a NaN in lse); then the portable path runs. */
qkv_status qkv_half_fast_backward(const qkv_plan *p, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                                  const uint16_t *out, const float *lse, const uint16_t *dout, uint16_t *dq,
                                  uint16_t *dk, uint16_t *dv);

/* Whether the bf16 fast forward (and backward) runs here (CPU, OS and QKV_ARCH); and, for
 * tests, force the portable path (on != 0) or restore the default. */
int qkv_half_fast_available(void);
void qkv_half_force_portable(int on);

#endif
