/* The int8 tile's dequantisation of one row (kernels/i8.h), shared by the
 * AVX512-VNNI and AMX-INT8 kernels (internal; AVX-512F intrinsics only):
 * the exact int32 sums of 32 channels in, the row's floats out, every
 * operation in the contract's order. */
#ifndef QKV_KERNELS_AVX512_I8_EPI_H
#define QKV_KERNELS_AVX512_I8_EPI_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/i8.h"

/* The per-panel constants: 128 wsum, the weights' scales, the bias. */
typedef struct {
    __m512i w128_0, w128_1;
    __m512 sw0, sw1, b0, b1;
    __mmask16 k0, k1;
    int bias;
} qkv_i8_epi;

static inline qkv_i8_epi qkv_i8_epi_make(const int32_t *wsum, const float *sw, const float *bias, int n) {
    qkv_i8_epi e;
    e.k0 = n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u);
    e.k1 = n > 16 ? (n >= 32 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - 16)) - 1u)) : 0;
    e.w128_0 = _mm512_slli_epi32(_mm512_maskz_loadu_epi32(e.k0, wsum), 7);
    e.w128_1 = _mm512_slli_epi32(_mm512_maskz_loadu_epi32(e.k1, wsum + 16), 7);
    e.sw0 = _mm512_maskz_loadu_ps(e.k0, sw);
    e.sw1 = _mm512_maskz_loadu_ps(e.k1, sw + 16);
    e.bias = bias != NULL;
    e.b0 = bias ? _mm512_maskz_loadu_ps(e.k0, bias) : _mm512_setzero_ps();
    e.b1 = bias ? _mm512_maskz_loadu_ps(e.k1, bias + 16) : _mm512_setzero_ps();
    return e;
}

/* Row r's sums c0 (channels 0-15), c1 (16-31): v = (acc - 128 wsum) sa, the
 * row's outliers times their int8 weights (read from the panel), v sw + b,
 * stored to crow (n channels). */
static inline void qkv_i8_epi_row(const qkv_i8_epi *e, __m512i c0, __m512i c1, float sa, int nout,
                                  const int32_t *oidx, const float *oval, const int8_t *panel, float *crow) {
    __m512 s = _mm512_set1_ps(sa);
    __m512 v0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(c0, e->w128_0)), s);
    __m512 v1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(c1, e->w128_1)), s);
    for (int o = 0; o < nout; o++) { /* the row's outliers: weight bytes to floats */
        int32_t col = oidx[o];
        const int8_t *blk = panel + (size_t)(col / 4) * QKV_I8_NR * 4;
        __m512i sh = _mm512_set1_epi32(24 - 8 * (col % 4));
        __m512 w0 = _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_sllv_epi32(_mm512_loadu_si512(blk), sh), 24));
        __m512 w1 = _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_sllv_epi32(_mm512_loadu_si512(blk + 64), sh), 24));
        __m512 xv = _mm512_set1_ps(oval[o]);
        v0 = _mm512_add_ps(v0, _mm512_mul_ps(xv, w0));
        v1 = _mm512_add_ps(v1, _mm512_mul_ps(xv, w1));
    }
    v0 = _mm512_mul_ps(v0, e->sw0);
    v1 = _mm512_mul_ps(v1, e->sw1);
    if (e->bias) {
        v0 = _mm512_add_ps(v0, e->b0);
        v1 = _mm512_add_ps(v1, e->b1);
    }
    _mm512_mask_storeu_ps(crow, e->k0, v0);
    _mm512_mask_storeu_ps(crow + 16, e->k1, v1);
}

#endif
