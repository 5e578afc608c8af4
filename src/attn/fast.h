/* The fast exact attention paths (FlashAttention-2 style, float32): tiled,
 * fused, online softmax, never an n x n buffer unless the caller passes one.
 * Internal; called by the dispatcher in attention.c with a validated plan. */
#ifndef QKV_ATTN_FAST_H
#define QKV_ATTN_FAST_H

#include "core/internal.h"

/* Whether the fast path computes this plan (F32, not the additive score,
 * position biases as fa_posbias_supported allows). */
int qkv_fast_supported(const qkv_plan *p);

qkv_status qkv_fast_forward(const qkv_plan *p, const float *q, const float *k, const float *v,
                            float *out, float *attn, float *lse);

/* The forward with its softmax statistics in base 2 for the backward:
 * m2[row] = the row max in tile units (0 for a row without a finite max) and
 * lg2[row] = log2 of the row sum (+inf for an empty row), [B, H, n_q] each,
 * so that a weight is 2^(sc (s - m2) - lg2), computed as the forward does.
 * out may be NULL: then only the statistics are computed (no PV product). */
qkv_status qkv_fast_forward_stats(const qkv_plan *p, const float *q, const float *k, const float *v,
                                  float *out, float *lse, float *m2, float *lg2);

qkv_status qkv_fast_backward(const qkv_plan *p, const float *q, const float *k, const float *v,
                             const float *out, const float *lse, const float *dout,
                             const qkv_attn_grads *g);

#endif
