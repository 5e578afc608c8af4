/* AVX-512 kernels of the typed KV cache (contract: kernels/kv.h).
 * Keys and values are widened in registers: int8 with vpmovsxbd + vcvtdq2ps,
 * bf16 by a 16-bit shift into the top half of a float. Products accumulate
 * per int8 block of 32 values (two 16-lane chunks) and are then scaled, so
 * the int8 kernels do one multiply by the scale per block, not per value.
 * A row's values are read in one pass (up to 64 per pass: one cache line of
 * int8, two of bf16), so each cache line of the cache is fetched once. */
#include <immintrin.h>

#include "kernels/kv.h"

static inline __mmask16 tail16(size_t left) {
    return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
}

static inline __m512 ld_i8(const int8_t *p, __mmask16 m) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, p)));
}

static inline __m512 ld_bf16(const uint16_t *p, __mmask16 m) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

static void qk_f32_avx512(const float *q, const float *k, size_t ld, size_t D, size_t n, float *s) {
    if (D == 64) {
        const __m512 q0 = _mm512_loadu_ps(q), q1 = _mm512_loadu_ps(q + 16);
        const __m512 q2 = _mm512_loadu_ps(q + 32), q3 = _mm512_loadu_ps(q + 48);
        for (size_t j = 0; j < n; j++) {
            const float *r = k + j * ld;
            __m512 a0 = _mm512_mul_ps(q0, _mm512_loadu_ps(r)), a1 = _mm512_mul_ps(q1, _mm512_loadu_ps(r + 16));
            a0 = _mm512_fmadd_ps(q2, _mm512_loadu_ps(r + 32), a0);
            a1 = _mm512_fmadd_ps(q3, _mm512_loadu_ps(r + 48), a1);
            s[j] = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
        }
        return;
    }
    for (size_t j = 0; j < n; j++) {
        const float *r = k + j * ld;
        __m512 a = _mm512_setzero_ps();
        for (size_t c = 0; c < D; c += 16) {
            __mmask16 m = tail16(D - c);
            a = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + c), _mm512_maskz_loadu_ps(m, r + c), a);
        }
        s[j] = _mm512_reduce_add_ps(a);
    }
}

static void pv_f32_avx512(float *o, const float *p, const float *v, size_t ld, size_t D, size_t n) {
    for (size_t g0 = 0; g0 < D; g0 += 64) {
        const size_t left = D - g0;
        const __mmask16 m0 = tail16(left), m1 = left > 16 ? tail16(left - 16) : 0;
        const __mmask16 m2 = left > 32 ? tail16(left - 32) : 0, m3 = left > 48 ? tail16(left - 48) : 0;
        __m512 a0 = _mm512_maskz_loadu_ps(m0, o + g0), a1 = _mm512_maskz_loadu_ps(m1, o + g0 + 16);
        __m512 a2 = _mm512_maskz_loadu_ps(m2, o + g0 + 32), a3 = _mm512_maskz_loadu_ps(m3, o + g0 + 48);
        for (size_t j = 0; j < n; j++) {
            const float *r = v + j * ld + g0;
            const __m512 w = _mm512_set1_ps(p[j]);
            a0 = _mm512_fmadd_ps(w, _mm512_maskz_loadu_ps(m0, r), a0);
            a1 = _mm512_fmadd_ps(w, _mm512_maskz_loadu_ps(m1, r + 16), a1);
            a2 = _mm512_fmadd_ps(w, _mm512_maskz_loadu_ps(m2, r + 32), a2);
            a3 = _mm512_fmadd_ps(w, _mm512_maskz_loadu_ps(m3, r + 48), a3);
        }
        _mm512_mask_storeu_ps(o + g0, m0, a0);
        _mm512_mask_storeu_ps(o + g0 + 16, m1, a1);
        _mm512_mask_storeu_ps(o + g0 + 32, m2, a2);
        _mm512_mask_storeu_ps(o + g0 + 48, m3, a3);
    }
}

static void qk_i8_avx512(const float *q, const int8_t *k, size_t ld, const float *ks, size_t lds, size_t D,
                         size_t n, float *s) {
    if (D == 64) { /* the common head size: q in registers, no masks */
        const __m512 q0 = _mm512_loadu_ps(q), q1 = _mm512_loadu_ps(q + 16);
        const __m512 q2 = _mm512_loadu_ps(q + 32), q3 = _mm512_loadu_ps(q + 48);
        for (size_t j = 0; j < n; j++) {
            const int8_t *r = k + j * ld;
            const float *sc = ks + j * lds;
            __m512 a0 = _mm512_mul_ps(q0, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)r))));
            __m512 a1 = _mm512_mul_ps(q2, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(r + 32)))));
            a0 = _mm512_fmadd_ps(q1, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(r + 16)))), a0);
            a1 = _mm512_fmadd_ps(q3, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(r + 48)))), a1);
            __m512 t = _mm512_fmadd_ps(a1, _mm512_set1_ps(sc[1]), _mm512_mul_ps(a0, _mm512_set1_ps(sc[0])));
            s[j] = _mm512_reduce_add_ps(t);
        }
        return;
    }
    for (size_t j = 0; j < n; j++) {
        const int8_t *r = k + j * ld;
        const float *sc = ks + j * lds;
        __m512 t = _mm512_setzero_ps();
        for (size_t b0 = 0; b0 < D; b0 += KV_BLOCK) {
            __m512 a = _mm512_setzero_ps();
            for (size_t c = b0; c < D && c < b0 + KV_BLOCK; c += 16) {
                __mmask16 m = tail16(D - c);
                a = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + c), ld_i8(r + c, m), a);
            }
            t = _mm512_fmadd_ps(a, _mm512_set1_ps(sc[b0 / KV_BLOCK]), t);
        }
        s[j] = _mm512_reduce_add_ps(t);
    }
}

static void qk_bf16_avx512(const float *q, const uint16_t *k, size_t ld, size_t D, size_t n, float *s) {
    if (D == 64) {
        const __m512 q0 = _mm512_loadu_ps(q), q1 = _mm512_loadu_ps(q + 16);
        const __m512 q2 = _mm512_loadu_ps(q + 32), q3 = _mm512_loadu_ps(q + 48);
        const __mmask16 all = 0xffff;
        for (size_t j = 0; j < n; j++) {
            const uint16_t *r = k + j * ld;
            __m512 a0 = _mm512_mul_ps(q0, ld_bf16(r, all)), a1 = _mm512_mul_ps(q1, ld_bf16(r + 16, all));
            a0 = _mm512_fmadd_ps(q2, ld_bf16(r + 32, all), a0);
            a1 = _mm512_fmadd_ps(q3, ld_bf16(r + 48, all), a1);
            s[j] = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
        }
        return;
    }
    for (size_t j = 0; j < n; j++) {
        const uint16_t *r = k + j * ld;
        __m512 a = _mm512_setzero_ps();
        for (size_t c = 0; c < D; c += 16) {
            __mmask16 m = tail16(D - c);
            a = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + c), ld_bf16(r + c, m), a);
        }
        s[j] = _mm512_reduce_add_ps(a);
    }
}

/* o[g0 .. g0+64) += sum_j w_j(block) v_j[...], four 16-lane accumulators. */
static void pv_i8_avx512(float *o, const float *p, const int8_t *v, size_t ld, const float *vs, size_t lds,
                         size_t D, size_t n) {
    for (size_t g0 = 0; g0 < D; g0 += 64) {
        const size_t left = D - g0;
        const __mmask16 m0 = tail16(left), m1 = left > 16 ? tail16(left - 16) : 0;
        const __mmask16 m2 = left > 32 ? tail16(left - 32) : 0, m3 = left > 48 ? tail16(left - 48) : 0;
        const size_t blk = g0 / KV_BLOCK, two = left > 32; /* a second block in this group */
        __m512 a0 = _mm512_maskz_loadu_ps(m0, o + g0), a1 = _mm512_maskz_loadu_ps(m1, o + g0 + 16);
        __m512 a2 = _mm512_maskz_loadu_ps(m2, o + g0 + 32), a3 = _mm512_maskz_loadu_ps(m3, o + g0 + 48);
        for (size_t j = 0; j < n; j++) {
            const int8_t *r = v + j * ld + g0;
            const float *sc = vs + j * lds + blk;
            const __m512 w0 = _mm512_set1_ps(p[j] * sc[0]);
            a0 = _mm512_fmadd_ps(w0, ld_i8(r, m0), a0);
            a1 = _mm512_fmadd_ps(w0, ld_i8(r + 16, m1), a1);
            if (two) {
                const __m512 w1 = _mm512_set1_ps(p[j] * sc[1]);
                a2 = _mm512_fmadd_ps(w1, ld_i8(r + 32, m2), a2);
                a3 = _mm512_fmadd_ps(w1, ld_i8(r + 48, m3), a3);
            }
        }
        _mm512_mask_storeu_ps(o + g0, m0, a0);
        _mm512_mask_storeu_ps(o + g0 + 16, m1, a1);
        _mm512_mask_storeu_ps(o + g0 + 32, m2, a2);
        _mm512_mask_storeu_ps(o + g0 + 48, m3, a3);
    }
}

static void pv_bf16_avx512(float *o, const float *p, const uint16_t *v, size_t ld, size_t D, size_t n) {
    for (size_t g0 = 0; g0 < D; g0 += 64) {
        const size_t left = D - g0;
        const __mmask16 m0 = tail16(left), m1 = left > 16 ? tail16(left - 16) : 0;
        const __mmask16 m2 = left > 32 ? tail16(left - 32) : 0, m3 = left > 48 ? tail16(left - 48) : 0;
        __m512 a0 = _mm512_maskz_loadu_ps(m0, o + g0), a1 = _mm512_maskz_loadu_ps(m1, o + g0 + 16);
        __m512 a2 = _mm512_maskz_loadu_ps(m2, o + g0 + 32), a3 = _mm512_maskz_loadu_ps(m3, o + g0 + 48);
        for (size_t j = 0; j < n; j++) {
            const uint16_t *r = v + j * ld + g0;
            const __m512 w = _mm512_set1_ps(p[j]);
            a0 = _mm512_fmadd_ps(w, ld_bf16(r, m0), a0);
            a1 = _mm512_fmadd_ps(w, ld_bf16(r + 16, m1), a1);
            a2 = _mm512_fmadd_ps(w, ld_bf16(r + 32, m2), a2);
            a3 = _mm512_fmadd_ps(w, ld_bf16(r + 48, m3), a3);
        }
        _mm512_mask_storeu_ps(o + g0, m0, a0);
        _mm512_mask_storeu_ps(o + g0 + 16, m1, a1);
        _mm512_mask_storeu_ps(o + g0 + 32, m2, a2);
        _mm512_mask_storeu_ps(o + g0 + 48, m3, a3);
    }
}

QKV_KV_DEFINE_INIT(avx512)
