/* bfloat16 and IEEE binary16 (fp16) storage: scalar conversions with
 * round-to-nearest-even (NaN stays NaN, keeping its sign and as much of its
 * payload as fits, and is quieted; infinities and signed zeros kept; fp16
 * subnormals exact), and whole-array conversions. Arithmetic is never done
 * in half precision: the attention paths widen to float, accumulate in float
 * and narrow only what they store (docs/HALF.md). Internal. */
#ifndef QKV_CORE_HALF_H
#define QKV_CORE_HALF_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline uint32_t qkv_f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static inline float qkv_f32_from_bits(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* bf16 is the top half of a float: widening is exact. */
static inline float qkv_bf16_to_f32(uint16_t h) { return qkv_f32_from_bits((uint32_t)h << 16); }

/* Round to nearest, ties to even; overflow rounds to +-inf as IEEE does. A
 * NaN is quieted (bit 6 of the bf16 set) so that truncating its payload can
 * never turn it into an infinity. */
static inline uint16_t qkv_f32_to_bf16(float x) {
    const uint32_t u = qkv_f32_bits(x);
    const uint32_t nan = (u >> 16) | 0x0040u, rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    /* a select, not a branch: loops over arrays of these vectorize */
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

float qkv_f16_to_f32(uint16_t h);
uint16_t qkv_f32_to_f16(float x);

/* Array conversions (n elements; dst and src do not overlap). */
void qkv_bf16_to_f32_array(float *dst, const uint16_t *src, size_t n);
void qkv_f32_to_bf16_array(uint16_t *dst, const float *src, size_t n);
void qkv_f16_to_f32_array(float *dst, const uint16_t *src, size_t n);
void qkv_f32_to_f16_array(uint16_t *dst, const float *src, size_t n);

#endif
