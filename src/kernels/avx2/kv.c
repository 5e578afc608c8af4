/* AVX2 kernels of the typed KV cache (contract: kernels/kv.h): the
 * AVX-512 design with 8 lanes. AVX2 has no masked byte loads, so the last
 * D % 8 values of a row are done in scalar code (never a read past the row). */
#include <immintrin.h>

#include "core/half.h"
#include "kernels/kv.h"

static inline __m256 ld_i8(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

static inline __m256 ld_bf16(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

static inline float hsum(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

static void qk_f32_avx2(const float *q, const float *k, size_t ld, size_t D, size_t n, float *s) {
    for (size_t j = 0; j < n; j++) {
        const float *r = k + j * ld;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        size_t c = 0;
        for (; c + 16 <= D; c += 16) {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + c), _mm256_loadu_ps(r + c), a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + c + 8), _mm256_loadu_ps(r + c + 8), a1);
        }
        for (; c + 8 <= D; c += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + c), _mm256_loadu_ps(r + c), a0);
        float tail = 0.0f;
        for (; c < D; c++) tail += q[c] * r[c];
        s[j] = hsum(_mm256_add_ps(a0, a1)) + tail;
    }
}

static void pv_f32_avx2(float *o, const float *p, const float *v, size_t ld, size_t D, size_t n) {
    for (size_t g0 = 0; g0 < D; g0 += 32) {
        const size_t len = D - g0 < 32 ? D - g0 : 32, full = len / 8;
        __m256 a[4];
        for (size_t c = 0; c < full; c++) a[c] = _mm256_loadu_ps(o + g0 + 8 * c);
        for (size_t j = 0; j < n; j++) {
            const float *r = v + j * ld + g0;
            const __m256 vw = _mm256_set1_ps(p[j]);
            for (size_t c = 0; c < full; c++) a[c] = _mm256_fmadd_ps(vw, _mm256_loadu_ps(r + 8 * c), a[c]);
            for (size_t d = 8 * full; d < len; d++) o[g0 + d] += p[j] * r[d];
        }
        for (size_t c = 0; c < full; c++) _mm256_storeu_ps(o + g0 + 8 * c, a[c]);
    }
}

static void qk_i8_avx2(const float *q, const int8_t *k, size_t ld, const float *ks, size_t lds, size_t D,
                       size_t n, float *s) {
    for (size_t j = 0; j < n; j++) {
        const int8_t *r = k + j * ld;
        const float *sc = ks + j * lds;
        __m256 t = _mm256_setzero_ps();
        float tail = 0.0f;
        for (size_t b0 = 0; b0 < D; b0 += KV_BLOCK) {
            const size_t e = b0 + KV_BLOCK < D ? b0 + KV_BLOCK : D;
            __m256 a = _mm256_setzero_ps();
            size_t c = b0;
            for (; c + 8 <= e; c += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(q + c), ld_i8(r + c), a);
            float ta = 0.0f;
            for (; c < e; c++) ta += q[c] * (float)r[c];
            t = _mm256_fmadd_ps(a, _mm256_set1_ps(sc[b0 / KV_BLOCK]), t);
            tail += ta * sc[b0 / KV_BLOCK];
        }
        s[j] = hsum(t) + tail;
    }
}

static void qk_bf16_avx2(const float *q, const uint16_t *k, size_t ld, size_t D, size_t n, float *s) {
    for (size_t j = 0; j < n; j++) {
        const uint16_t *r = k + j * ld;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        size_t c = 0;
        for (; c + 16 <= D; c += 16) {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + c), ld_bf16(r + c), a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + c + 8), ld_bf16(r + c + 8), a1);
        }
        for (; c + 8 <= D; c += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + c), ld_bf16(r + c), a0);
        float tail = 0.0f;
        for (; c < D; c++) tail += q[c] * qkv_bf16_to_f32(r[c]);
        s[j] = hsum(_mm256_add_ps(a0, a1)) + tail;
    }
}

/* Groups of 32 values (one int8 block, four 8-lane accumulators) per pass. */
static void pv_i8_avx2(float *o, const float *p, const int8_t *v, size_t ld, const float *vs, size_t lds,
                       size_t D, size_t n) {
    for (size_t g0 = 0; g0 < D; g0 += KV_BLOCK) {
        const size_t len = D - g0 < KV_BLOCK ? D - g0 : KV_BLOCK, full = len / 8;
        __m256 a[4];
        for (size_t c = 0; c < full; c++) a[c] = _mm256_loadu_ps(o + g0 + 8 * c);
        for (size_t j = 0; j < n; j++) {
            const int8_t *r = v + j * ld + g0;
            const float w = p[j] * vs[j * lds + g0 / KV_BLOCK];
            const __m256 vw = _mm256_set1_ps(w);
            for (size_t c = 0; c < full; c++) a[c] = _mm256_fmadd_ps(vw, ld_i8(r + 8 * c), a[c]);
            for (size_t d = 8 * full; d < len; d++) o[g0 + d] += w * (float)r[d];
        }
        for (size_t c = 0; c < full; c++) _mm256_storeu_ps(o + g0 + 8 * c, a[c]);
    }
}

static void pv_bf16_avx2(float *o, const float *p, const uint16_t *v, size_t ld, size_t D, size_t n) {
    for (size_t g0 = 0; g0 < D; g0 += 32) {
        const size_t len = D - g0 < 32 ? D - g0 : 32, full = len / 8;
        __m256 a[4];
        for (size_t c = 0; c < full; c++) a[c] = _mm256_loadu_ps(o + g0 + 8 * c);
        for (size_t j = 0; j < n; j++) {
            const uint16_t *r = v + j * ld + g0;
            const __m256 vw = _mm256_set1_ps(p[j]);
            for (size_t c = 0; c < full; c++) a[c] = _mm256_fmadd_ps(vw, ld_bf16(r + 8 * c), a[c]);
            for (size_t d = 8 * full; d < len; d++) o[g0 + d] += p[j] * qkv_bf16_to_f32(r[d]);
        }
        for (size_t c = 0; c < full; c++) _mm256_storeu_ps(o + g0 + 8 * c, a[c]);
    }
}

QKV_KV_DEFINE_INIT(avx2)
