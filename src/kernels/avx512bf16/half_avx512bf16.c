/* AVX512-BF16 kernels of the bf16 forward (contract: attn/half_kernels.h).
 * vdpbf16ps multiplies 16 pairs of bf16 and adds both products into 16
 * float lanes: one instruction is a 16 x 2 slice of a matrix product, so the
 * reduction dimension is consumed two at a time (the VNNI pair layout). */
#include <immintrin.h>
#include <string.h>

#include "attn/half_kernels.h"

static inline __m512bh as_bh(__m512i x) { return (__m512bh)x; }

static inline __m512bh bcast_pair(const uint32_t *x) {
    uint32_t w;
    memcpy(&w, x, sizeof w);
    return as_bh(_mm512_set1_epi32((int)w));
}

/* 8 rows x 32 keys: 16 accumulators, the K pairs loaded once per t for all
 * eight rows. */
void qkv_bf16_qk_avx512bf16(const uint32_t *qp, size_t ldq, const uint32_t *kp, size_t dp2,
                            size_t rows, size_t npanels, float *s, size_t lds) {
    for (size_t p = 0; p < npanels; p++) {
        const uint32_t *kpp = kp + p * dp2 * 32;
        for (size_t r0 = 0; r0 < rows; r0 += 8) {
            const uint32_t *q = qp + r0 * ldq;
            __m512 c00 = _mm512_setzero_ps(), c01 = _mm512_setzero_ps(), c10 = _mm512_setzero_ps(),
                   c11 = _mm512_setzero_ps(), c20 = _mm512_setzero_ps(), c21 = _mm512_setzero_ps(),
                   c30 = _mm512_setzero_ps(), c31 = _mm512_setzero_ps(), c40 = _mm512_setzero_ps(),
                   c41 = _mm512_setzero_ps(), c50 = _mm512_setzero_ps(), c51 = _mm512_setzero_ps(),
                   c60 = _mm512_setzero_ps(), c61 = _mm512_setzero_ps(), c70 = _mm512_setzero_ps(),
                   c71 = _mm512_setzero_ps();
            for (size_t t = 0; t < dp2; t++) {
                __m512bh k0 = as_bh(_mm512_loadu_si512((const void *)(kpp + t * 32)));
                __m512bh k1 = as_bh(_mm512_loadu_si512((const void *)(kpp + t * 32 + 16)));
                __m512bh a;
                a = bcast_pair(q + t);
                c00 = _mm512_dpbf16_ps(c00, a, k0); c01 = _mm512_dpbf16_ps(c01, a, k1);
                a = bcast_pair(q + ldq + t);
                c10 = _mm512_dpbf16_ps(c10, a, k0); c11 = _mm512_dpbf16_ps(c11, a, k1);
                a = bcast_pair(q + 2 * ldq + t);
                c20 = _mm512_dpbf16_ps(c20, a, k0); c21 = _mm512_dpbf16_ps(c21, a, k1);
                a = bcast_pair(q + 3 * ldq + t);
                c30 = _mm512_dpbf16_ps(c30, a, k0); c31 = _mm512_dpbf16_ps(c31, a, k1);
                a = bcast_pair(q + 4 * ldq + t);
                c40 = _mm512_dpbf16_ps(c40, a, k0); c41 = _mm512_dpbf16_ps(c41, a, k1);
                a = bcast_pair(q + 5 * ldq + t);
                c50 = _mm512_dpbf16_ps(c50, a, k0); c51 = _mm512_dpbf16_ps(c51, a, k1);
                a = bcast_pair(q + 6 * ldq + t);
                c60 = _mm512_dpbf16_ps(c60, a, k0); c61 = _mm512_dpbf16_ps(c61, a, k1);
                a = bcast_pair(q + 7 * ldq + t);
                c70 = _mm512_dpbf16_ps(c70, a, k0); c71 = _mm512_dpbf16_ps(c71, a, k1);
            }
            float *d = s + r0 * lds + p * 32;
            _mm512_storeu_ps(d, c00); _mm512_storeu_ps(d + 16, c01); d += lds;
            _mm512_storeu_ps(d, c10); _mm512_storeu_ps(d + 16, c11); d += lds;
            _mm512_storeu_ps(d, c20); _mm512_storeu_ps(d + 16, c21); d += lds;
            _mm512_storeu_ps(d, c30); _mm512_storeu_ps(d + 16, c31); d += lds;
            _mm512_storeu_ps(d, c40); _mm512_storeu_ps(d + 16, c41); d += lds;
            _mm512_storeu_ps(d, c50); _mm512_storeu_ps(d + 16, c51); d += lds;
            _mm512_storeu_ps(d, c60); _mm512_storeu_ps(d + 16, c61); d += lds;
            _mm512_storeu_ps(d, c70); _mm512_storeu_ps(d + 16, c71);
        }
    }
}

/* Up to 4 rows x 64 columns per pass (16 accumulators), the P pairs
 * broadcast, the V pairs loaded once per u for all rows. */
void qkv_bf16_pv_avx512bf16(float *o, size_t ldo, const uint32_t *pp, size_t ldp, const uint32_t *vp,
                            size_t ldv, size_t u0, size_t u1, size_t dvp, size_t rows) {
    for (size_t c0 = 0; c0 < dvp; c0 += 64) {
        size_t nv = (dvp - c0) / 16;
        if (nv > 4) nv = 4;
        __m512 acc[4][4];
        for (size_t r = 0; r < 4; r++)
            for (size_t j = 0; j < 4; j++)
                acc[r][j] = (r < rows && j < nv) ? _mm512_loadu_ps(o + r * ldo + c0 + 16 * j)
                                                 : _mm512_setzero_ps();
        if (rows == 4 && nv == 4) {
            for (size_t u = u0; u < u1; u++) {
                const uint32_t *vr = vp + u * ldv + c0;
                __m512bh v0 = as_bh(_mm512_loadu_si512((const void *)vr));
                __m512bh v1 = as_bh(_mm512_loadu_si512((const void *)(vr + 16)));
                __m512bh v2 = as_bh(_mm512_loadu_si512((const void *)(vr + 32)));
                __m512bh v3 = as_bh(_mm512_loadu_si512((const void *)(vr + 48)));
                for (size_t r = 0; r < 4; r++) {
                    __m512bh a = bcast_pair(pp + r * ldp + u);
                    acc[r][0] = _mm512_dpbf16_ps(acc[r][0], a, v0);
                    acc[r][1] = _mm512_dpbf16_ps(acc[r][1], a, v1);
                    acc[r][2] = _mm512_dpbf16_ps(acc[r][2], a, v2);
                    acc[r][3] = _mm512_dpbf16_ps(acc[r][3], a, v3);
                }
            }
        } else {
            for (size_t u = u0; u < u1; u++) {
                const uint32_t *vr = vp + u * ldv + c0;
                for (size_t j = 0; j < nv; j++) {
                    __m512bh vj = as_bh(_mm512_loadu_si512((const void *)(vr + 16 * j)));
                    for (size_t r = 0; r < rows; r++)
                        acc[r][j] = _mm512_dpbf16_ps(acc[r][j], bcast_pair(pp + r * ldp + u), vj);
                }
            }
        }
        for (size_t r = 0; r < rows; r++)
            for (size_t j = 0; j < nv; j++) _mm512_storeu_ps(o + r * ldo + c0 + 16 * j, acc[r][j]);
    }
}

void qkv_bf16_pack_p_avx512bf16(uint32_t *pp, size_t ldp, const float *p, size_t lds, size_t rows,
                                size_t npairs) {
    for (size_t r = 0; r < rows; r++) {
        const float *src = p + r * lds;
        uint32_t *dst = pp + r * ldp;
        size_t u = 0;
        for (; u + 16 <= npairs; u += 16) {
            __m512 lo = _mm512_loadu_ps(src + 2 * u), hi = _mm512_loadu_ps(src + 2 * u + 16);
            __m512bh b = _mm512_cvtne2ps_pbh(hi, lo);
            _mm512_storeu_si512((void *)(dst + u), (__m512i)b);
        }
        if (u < npairs) {
            size_t left = 2 * (npairs - u); /* floats, 2..30 */
            __mmask16 m0 = (__mmask16)(left >= 16 ? 0xffff : (1u << left) - 1u);
            __mmask16 m1 = (__mmask16)(left > 16 ? (1u << (left - 16)) - 1u : 0);
            __m512 lo = _mm512_maskz_loadu_ps(m0, src + 2 * u);
            __m512 hi = _mm512_maskz_loadu_ps(m1, src + 2 * u + 16);
            __m512bh b = _mm512_cvtne2ps_pbh(hi, lo);
            _mm512_mask_storeu_epi32(dst + u, (__mmask16)((1u << (npairs - u)) - 1u), (__m512i)b);
        }
    }
}
