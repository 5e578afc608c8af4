/* A 16 x 16 transpose of 32-bit elements in AVX-512F registers, shared by
 * the kernels of the AVX-512 folders (internal; include only from sources
 * compiled with -mavx512f). */
#ifndef QKV_KERNELS_AVX512_TRANSPOSE_H
#define QKV_KERNELS_AVX512_TRANSPOSE_H

#include <immintrin.h>

/* In-register 16 x 16 transpose: on return r[c] holds column c of the input
 * rows (element i = old r[i][c]). Three stages of 128-bit-lane shuffles. */
static inline void qkv_transpose16_ps(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    /* r[4i + k], 128-bit lane L: column 4L + k of rows 4i .. 4i + 3 */
    for (int i = 0; i < 4; i++) {
        __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
        __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
        r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    for (int k = 0; k < 4; k++) {
        t[k] = _mm512_shuffle_f32x4(r[k], r[4 + k], 0x88);
        t[k + 4] = _mm512_shuffle_f32x4(r[k], r[4 + k], 0xdd);
        t[k + 8] = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], 0x88);
        t[k + 12] = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], 0xdd);
    }
    for (int k = 0; k < 4; k++) {
        r[k] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0x88);
        r[k + 8] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0xdd);
        r[k + 4] = _mm512_shuffle_f32x4(t[k + 4], t[k + 12], 0x88);
        r[k + 12] = _mm512_shuffle_f32x4(t[k + 4], t[k + 12], 0xdd);
    }
}

#endif
