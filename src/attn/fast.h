/* The fast exact attention paths (FlashAttention-2 style, float32): tiled,
 * fused, online softmax, never an n x n buffer unless the caller passes one.
 * Internal; called by the dispatcher in attention.c with a validated plan. */
#ifndef QKV_ATTN_FAST_H
#define QKV_ATTN_FAST_H

#include "core/internal.h"

/* Whether the fast path computes this plan (F32, and not the additive score). */
int qkv_fast_supported(const qkv_plan *p);

qkv_status qkv_fast_forward(const qkv_plan *p, const float *q, const float *k, const float *v,
                            float *out, float *attn, float *lse);

qkv_status qkv_fast_backward(const qkv_plan *p, const float *q, const float *k, const float *v,
                             const float *out, const float *lse, const float *dout,
                             const qkv_attn_grads *g);

#endif
