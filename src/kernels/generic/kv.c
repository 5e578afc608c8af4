/* Portable kernels of the typed KV cache (contract: kernels/kv.h).
 * Plain loops in the order the vector kernels use (per block, then scaled),
 * so every ISA computes the same sums up to the order inside a block. */
#include "core/half.h"
#include "kernels/kv.h"

static void qk_f32_generic(const float *q, const float *k, size_t ld, size_t D, size_t n, float *s) {
    for (size_t j = 0; j < n; j++) {
        const float *r = k + j * ld;
        float acc = 0.0f;
        for (size_t d = 0; d < D; d++) acc += q[d] * r[d];
        s[j] = acc;
    }
}

static void pv_f32_generic(float *o, const float *p, const float *v, size_t ld, size_t D, size_t n) {
    for (size_t j = 0; j < n; j++) {
        const float *r = v + j * ld;
        for (size_t d = 0; d < D; d++) o[d] += p[j] * r[d];
    }
}

static void qk_bf16_generic(const float *q, const uint16_t *k, size_t ld, size_t D, size_t n, float *s) {
    for (size_t j = 0; j < n; j++) {
        const uint16_t *r = k + j * ld;
        float acc = 0.0f;
        for (size_t d = 0; d < D; d++) acc += q[d] * qkv_bf16_to_f32(r[d]);
        s[j] = acc;
    }
}

static void qk_i8_generic(const float *q, const int8_t *k, size_t ld, const float *ks, size_t lds,
                          size_t D, size_t n, float *s) {
    for (size_t j = 0; j < n; j++) {
        const int8_t *r = k + j * ld;
        const float *sc = ks + j * lds;
        float acc = 0.0f;
        for (size_t b0 = 0; b0 < D; b0 += KV_BLOCK) {
            size_t e = b0 + KV_BLOCK < D ? b0 + KV_BLOCK : D;
            float blk = 0.0f;
            for (size_t d = b0; d < e; d++) blk += q[d] * (float)r[d];
            acc += blk * sc[b0 / KV_BLOCK];
        }
        s[j] = acc;
    }
}

static void pv_bf16_generic(float *o, const float *p, const uint16_t *v, size_t ld, size_t D, size_t n) {
    for (size_t j = 0; j < n; j++) {
        const uint16_t *r = v + j * ld;
        for (size_t d = 0; d < D; d++) o[d] += p[j] * qkv_bf16_to_f32(r[d]);
    }
}

static void pv_i8_generic(float *o, const float *p, const int8_t *v, size_t ld, const float *vs, size_t lds,
                          size_t D, size_t n) {
    for (size_t j = 0; j < n; j++) {
        const int8_t *r = v + j * ld;
        const float *sc = vs + j * lds;
        for (size_t b0 = 0; b0 < D; b0 += KV_BLOCK) {
            size_t e = b0 + KV_BLOCK < D ? b0 + KV_BLOCK : D;
            float w = p[j] * sc[b0 / KV_BLOCK];
            for (size_t d = b0; d < e; d++) o[d] += w * (float)r[d];
        }
    }
}

QKV_KV_DEFINE_INIT(generic)
