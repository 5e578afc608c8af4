/* float32, bf16 and int8 storage of a KV cache, streamed by the decode
 * kernels (internal; kv_cache.c owns the cache
 * object and calls these). See qkv_kv_storage in qkv.h and docs/HALF.md. */
#ifndef QKV_LAYERS_KV_TYPED_H
#define QKV_LAYERS_KV_TYPED_H

#include "core/internal.h"

typedef struct kv_typed kv_typed;

/* Whether a layer's attention is one the typed cache computes (qkv.h). */
qkv_status kv_typed_supported(const qkv_mha *m);

/* Storage for [batch, max_len] tokens of H_kv heads of Dh values. Errors: QKV_ERR_SIZE_OVERFLOW, QKV_ERR_OUT_OF_MEMORY. */
qkv_status kv_typed_create(kv_typed **out, qkv_kv_storage storage, int64_t batch, int64_t max_len,
                           int64_t heads_kv, int64_t head_dim);
void kv_typed_free(kv_typed *t);

/* Store n tokens' keys and values k, v [n, H_kv, Dh] (float) of batch row b
 * at positions pos .. pos+n-1, rounded or quantised. */
void kv_typed_store(kv_typed *t, int64_t b, int64_t pos, int64_t n, const float *k, const float *v);

/* Attention of t new queries q [B, t, H, Dh] at positions L .. L+t-1 over
 * the cached tokens 0 .. L+t-1 of every batch row (their keys already
 * stored): o [B, t, H, Dh]. p: the plan of the call (mha_decode_desc, B
 * batch rows, t queries, L + t keys), whose key ranges are the causal
 * (window) mask and whose scale, soft-cap and ALiBi slopes the scores use.
 * Errors: QKV_ERR_OUT_OF_MEMORY. */
qkv_status kv_typed_attend(kv_typed *t, const qkv_plan *p, const float *q, float *o);

#endif
