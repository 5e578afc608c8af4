/* Vector math shared by the AVX-512 kernel files (included only from
 * src/kernels/avx512/, compiled with that folder's flags). */
#ifndef QKV_KERNELS_AVX512_VMATH_H
#define QKV_KERNELS_AVX512_VMATH_H

#include <immintrin.h>

/* 2^x for finite x in [-126, 127]: range reduction x = n + f, |f| <= 1/2,
 * 2^f = 1 + f*P(f) with Cephes' degree-5 P (relative error ~1e-7), scaled
 * by 2^n with vscalefps. Callers whose argument is bounded so by
 * construction call this; exp2_ps takes any x. */
static inline __m512 exp2_core_ps(__m512 x) {
    __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(1.535336188319500e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.339887440266574e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618437357674640e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550332471162809e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402264791363012e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931472028550421e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* 2^x for every x: clamped to [-127, 128] first (so the result of an
 * argument out of range is 0 or +inf as it should be), inputs below -126
 * give exactly 0 (the result would be subnormal), NaN stays NaN
 * (vmaxps/vminps return the second operand when one is NaN). */
static inline __m512 exp2_ps(__m512 x) {
    __m512 xc = _mm512_min_ps(_mm512_set1_ps(128.0f), _mm512_max_ps(_mm512_set1_ps(-127.0f), x));
    __m512 r = exp2_core_ps(xc);
    __mmask16 under = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-126.0f), _CMP_LT_OQ);
    return _mm512_maskz_mov_ps((__mmask16)~under, r);
}

#endif
