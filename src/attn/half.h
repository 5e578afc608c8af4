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

/* Whether the bf16 fast forward runs here (CPU, OS and QKV_ARCH); and, for
 * tests, force the portable path (on != 0) or restore the default. */
int qkv_half_fast_available(void);
void qkv_half_force_portable(int on);

#endif
