/* The attention entry points at the level of a plan (attention.c): what
 * qkv_attention_forward / _backward do once they have made the call's plan.
 * For code inside the library that made the plan itself (the KV cache's
 * decoding), so that a call is validated once and no mask is derived twice.
 * Internal. */
#ifndef QKV_ATTN_ATTENTION_H
#define QKV_ATTN_ATTENTION_H

#include "core/internal.h"

/* The check_finite scan (when the plan asks for it), the NULL checks, then
 * the half-precision path, the fast path or the reference; an allocation
 * refused by qkv_set_memory_limit reported as QKV_ERR_MEMORY_LIMIT. Every
 * status as qkv_attention_forward / _backward with the descriptor of p. */
qkv_status qkv_attn_forward_plan(const qkv_plan *p, const void *q, const void *k, const void *v, void *out,
                                 void *attn, void *lse);
qkv_status qkv_attn_backward_plan(const qkv_plan *p, const void *q, const void *k, const void *v,
                                  const void *out, const void *lse, const void *dout,
                                  const qkv_attn_grads *grads);

#endif
