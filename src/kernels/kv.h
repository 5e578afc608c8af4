/* The KV-decode kernels' contract (internal), for the typed KV cache
 * (layers/kv_typed.c): dot products of one query with many cached keys, and
 * weighted sums of cached values, reading float32, bf16 or int8 storage
 * (widened in registers) - the cache is never expanded to float32 in memory
 * (docs/HALF.md). The generic table (kernels/generic/kv.c) fills every slot,
 * an ISA's init (kernels/<isa>/kv.c) overrides them, chosen with the
 * attention kernels (kernels/kernels.h; QKV_ARCH applies).
 *
 * Layouts: key (or value) j is a row of D elements at k + j*ld. int8 rows
 * carry one float32 scale per block of KV_BLOCK consecutive elements (the
 * last block of a row may be shorter), at ks + j*lds + blk; element d of row
 * j stands for k[j*ld + d] * ks[j*lds + d / KV_BLOCK]. Kernels never read
 * past element D-1 of a row or the scales of its ceil(D / KV_BLOCK) blocks,
 * and accumulate in float32. */
#ifndef QKV_KERNELS_KV_H
#define QKV_KERNELS_KV_H

#include <stddef.h>
#include <stdint.h>

#define KV_BLOCK 32 /* int8 elements per scale */

typedef struct kv_kernels {
    const char *name;
    /* s[j] = sum_{d<D} q[d] * key_j[d], j < n */
    void (*qk_f32)(const float *q, const float *k, size_t ld, size_t D, size_t n, float *s);
    void (*qk_bf16)(const float *q, const uint16_t *k, size_t ld, size_t D, size_t n, float *s);
    void (*qk_i8)(const float *q, const int8_t *k, size_t ld, const float *ks, size_t lds, size_t D,
                  size_t n, float *s);
    /* o[d] += sum_{j<n} p[j] * value_j[d], d < D */
    void (*pv_f32)(float *o, const float *p, const float *v, size_t ld, size_t D, size_t n);
    void (*pv_bf16)(float *o, const float *p, const uint16_t *v, size_t ld, size_t D, size_t n);
    void (*pv_i8)(float *o, const float *p, const int8_t *v, size_t ld, const float *vs, size_t lds,
                  size_t D, size_t n);
} kv_kernels;

/* Defines qkv_kv_init_<isa>: every slot, in the struct's order, gets the
 * kernel <slot>_<isa> of the including file. */
#define QKV_KV_DEFINE_INIT(isa)                                                                    \
    void qkv_kv_init_##isa(kv_kernels *k) {                                                        \
        *k = (kv_kernels){#isa, qk_f32_##isa, qk_bf16_##isa, qk_i8_##isa, pv_f32_##isa, pv_bf16_##isa, pv_i8_##isa}; \
    }

/* The generic table; each ISA's init overrides the slots it implements. */
void qkv_kv_init_generic(kv_kernels *k);
void qkv_kv_init_avx2(kv_kernels *k);
void qkv_kv_init_avx512(kv_kernels *k);

#endif
