/* fp16 <-> float conversions in integer arithmetic (exact, portable, no
 * dependence on F16C or the rounding mode of the FPU), and the array loops
 * for both half formats. See core/half.h. */
#include "core/half.h"

float qkv_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f) return qkv_f32_from_bits(sign | 0x7f800000u | (man << 13)); /* inf, NaN */
    if (exp != 0) return qkv_f32_from_bits(sign | ((exp + 112u) << 23) | (man << 13));
    /* zero or subnormal: man * 2^-24, exact in float */
    float x = (float)man * 0x1p-24f;
    return sign ? -x : x;
}

uint16_t qkv_f32_to_f16(float x) {
    uint32_t u = qkv_f32_bits(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN, quiet */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
    if (a >= 0x38800000u) {                                   /* normal in fp16 (>= 2^-14) */
        uint32_t r = a - 0x38000000u;                         /* rebias 127 -> 15 */
        r += 0xfffu + ((r >> 13) & 1u);                       /* ties to even */
        return (uint16_t)(sign | (r >> 13));
    }
    if (a < 0x33000000u) return sign; /* < 2^-25: rounds to 0 (2^-25 itself is a tie to 0) */
    /* subnormal in fp16: shift the 24-bit significand into man * 2^-24 */
    uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e; /* 14..24 */
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint16_t)(sign | q);
}

void qkv_bf16_to_f32_array(float *dst, const uint16_t *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = qkv_bf16_to_f32(src[i]);
}

void qkv_f32_to_bf16_array(uint16_t *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = qkv_f32_to_bf16(src[i]);
}

void qkv_f16_to_f32_array(float *dst, const uint16_t *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = qkv_f16_to_f32(src[i]);
}

void qkv_f32_to_f16_array(uint16_t *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = qkv_f32_to_f16(src[i]);
}
