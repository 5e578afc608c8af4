/* The reference attention: plain loops accumulating in double. It is the
 * oracle of every test and a selectable implementation (QKV_IMPL_REFERENCE).
 * Memory: O(n_k + n*A) workspace per call, never an n x n buffer. */
#ifndef QKV_REF_H
#define QKV_REF_H

#include "core/internal.h"

qkv_status qkv_ref_forward(const qkv_plan *p, const void *q, const void *k, const void *v,
                           void *out, void *attn, void *lse);

qkv_status qkv_ref_backward(const qkv_plan *p, const void *q, const void *k, const void *v,
                            const void *dout, const qkv_attn_grads *g);

/* Rows [row0, row0 + rows) of A' into attn_rows [B, H, rows, n_k]. */
qkv_status qkv_ref_attention_rows(const qkv_plan *p, const void *q, const void *k, int64_t row0, int64_t rows,
                                  void *attn_rows);

#endif
