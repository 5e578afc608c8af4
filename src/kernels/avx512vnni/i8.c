/* AVX512-VNNI int8 kernels (compiled with -mavx512f/bw/vl/vnni only here):
 * a 14 x 32 tile, 28 zmm int32 accumulators, two zmm of weights (32
 * channels x 4 k) and one broadcast of 4 activation bytes per step: each
 * vpdpbusd adds 64 exact u8 x s8 products, four times an fp32 FMA's work. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels/avx512_i8_epi.h"
#include "kernels/i8.h"

#define MR 14
#define ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13)

static inline __mmask16 tail_mask(size_t rem) {
    return rem >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << rem) - 1u);
}

static float quant_row_vnni(const float *x, size_t k, size_t kp, uint8_t *a, int32_t *oidx, float *oval, int *nout) {
    __m512 sv = _mm512_setzero_ps();
    for (size_t t = 0; t < k; t += 16) sv = _mm512_add_ps(sv, _mm512_abs_ps(_mm512_maskz_loadu_ps(tail_mask(k - t), x + t)));
    float lane[16], sum = 0.0f;
    _mm512_storeu_ps(lane, sv);
    for (int l = 0; l < 16; l++) sum += lane[l];
    const float thr = QKV_I8_OUTLIER * (sum / (float)k);
    const __m512 vt = _mm512_set1_ps(thr);
    /* the outliers, first ones first, and the largest of the others, in one pass */
    int no = 0;
    size_t last = 0;
    __m512 mx = _mm512_setzero_ps();
    for (size_t t = 0; t < k; t += 16) {
        __mmask16 mk = tail_mask(k - t);
        __m512 v = _mm512_abs_ps(_mm512_maskz_loadu_ps(mk, x + t));
        __mmask16 out = 0;
        if (no < QKV_I8_MAX_OUT) {
            for (unsigned bits = _mm512_mask_cmp_ps_mask(mk, v, vt, _CMP_GT_OQ); bits && no < QKV_I8_MAX_OUT;
                 bits &= bits - 1) {
                unsigned l = (unsigned)__builtin_ctz(bits);
                size_t i = t + l;
                oidx[no] = (int32_t)i;
                oval[no++] = x[i];
                last = i;
                out |= (__mmask16)(1u << l);
            }
        }
        mx = _mm512_mask_max_ps(mx, (__mmask16)(mk & ~out), v, mx); /* NaN in v: mx kept */
    }
    *nout = no;
    const __m512i lane_idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i vlast = _mm512_set1_epi32(no ? (int)last : -1);
    float m = _mm512_reduce_max_ps(mx);
    float inv = m > 0.0f ? 127.0f / m : 0.0f;
    const __m512 vi = _mm512_set1_ps(inv);
    const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127), off = _mm512_set1_epi32(128);
    for (size_t t = 0; t < k; t += 16) {
        __mmask16 mk = tail_mask(k - t);
        __m512 xv = _mm512_maskz_loadu_ps(mk, x + t);
        __mmask16 out = _mm512_cmp_ps_mask(_mm512_abs_ps(xv), vt, _CMP_GT_OQ) &
                        _mm512_cmple_epi32_mask(_mm512_add_epi32(lane_idx, _mm512_set1_epi32((int)t)), vlast);
        __m512i q = _mm512_cvt_roundps_epi32(_mm512_mul_ps(xv, vi), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        q = _mm512_min_epi32(_mm512_max_epi32(q, lo), hi); /* NaN: INT_MIN -> -127 */
        q = _mm512_maskz_mov_epi32((__mmask16)~out, q); /* an outlier: 0 */
        _mm_mask_storeu_epi8(a + t, mk, _mm512_cvtepi32_epi8(_mm512_add_epi32(q, off)));
    }
    if (kp > k) memset(a + k, 128, kp - k);
    return m > 0.0f ? m / 127.0f : 0.0f;
}

static void tile_vnni(size_t kp, const uint8_t *a, size_t lda, const int8_t *bp, const int32_t *wsum,
                      const float *sa, const float *sw, const float *bias, float *c, size_t ldc, int m, int n,
                      const int *nout, const int32_t *oidx, const float *oval) {
    const int8_t *panel = bp;
    /* Rows past m read row m - 1 again (never stored), so the loop has no branch. */
#define DECL(r)                                                                \
    __m512i c0_##r = _mm512_setzero_si512(), c1_##r = _mm512_setzero_si512(); \
    const uint8_t *a_##r = a + (size_t)((r) < m ? (r) : m - 1) * lda;
    ROWS(DECL)
#undef DECL
    for (size_t t = 0; t < kp; t += 4) {
        __m512i b0 = _mm512_loadu_si512(bp), b1 = _mm512_loadu_si512(bp + 64);
#define DOT(r)                                                    \
    {                                                             \
        int32_t w;                                                \
        memcpy(&w, a_##r + t, 4);                                 \
        __m512i x = _mm512_set1_epi32(w);                         \
        c0_##r = _mm512_dpbusd_epi32(c0_##r, x, b0);              \
        c1_##r = _mm512_dpbusd_epi32(c1_##r, x, b1);              \
    }
        ROWS(DOT)
#undef DOT
        bp += QKV_I8_NR * 4;
    }
    const qkv_i8_epi e = qkv_i8_epi_make(wsum, sw, bias, n);
#define ST(r)                                                                                            \
    if ((r) < m)                                                                                         \
        qkv_i8_epi_row(&e, c0_##r, c1_##r, sa[r], nout[r], oidx + (r) * QKV_I8_MAX_OUT, oval + (r) * QKV_I8_MAX_OUT, \
                       panel, c + (size_t)(r) * ldc);
    ROWS(ST)
#undef ST
}

void qkv_i8_init_avx512vnni(qkv_i8_kernels *k) { *k = (qkv_i8_kernels){"avx512vnni", 1, MR, quant_row_vnni, tile_vnni, NULL, NULL, NULL}; }
