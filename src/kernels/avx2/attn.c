/* AVX2 + FMA micro-kernels (compiled with -mavx2 -mfma only here). With 16
 * ymm registers the register tiles are 6 rows x 16 columns (12 accumulators);
 * tails use vmaskmov, so nothing outside the given ranges is read or written. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "kernels/attn.h"

/* 2^x as in the AVX-512 kernels, with 2^n built in the exponent field. */
static inline __m256 exp2_ps(__m256 x) {
    __m256 xc = _mm256_min_ps(_mm256_set1_ps(128.0f), _mm256_max_ps(_mm256_set1_ps(-127.0f), x));
    __m256 n = _mm256_round_ps(xc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_sub_ps(xc, n);
    __m256 p = _mm256_set1_ps(1.535336188319500e-4f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.339887440266574e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.618437357674640e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550332471162809e-2f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.402264791363012e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931472028550421e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    /* n in [-127, 128]: biased exponent 0 (x < -126, zeroed below) .. 255 (inf). */
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 r = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(-126.0f), _CMP_LT_OQ);
    return _mm256_andnot_ps(under, r);
}

/* 2^x for the softmax's arguments x <= 0 (or NaN): no upper clamp, the
 * degree-5 polynomial of the AVX-512 kernels (relative error 1.8e-7). */
static inline __m256 exp2_neg_ps(__m256 x) {
    __m256 xc = _mm256_max_ps(_mm256_set1_ps(-127.0f), x);
    __m256 n = _mm256_round_ps(xc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_sub_ps(xc, n);
    __m256 p = _mm256_set1_ps(1.321933655e-3f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.671698888e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550890648e-2f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.402223798e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931468577e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 r = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(-126.0f), _CMP_LT_OQ);
    return _mm256_andnot_ps(under, r);
}

static inline __m256i tail_mask(size_t rem) {
    int k = rem >= 8 ? 8 : (int)rem;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}


/* R rows (R <= 6) x 16 columns: 12 accumulators, enough independent FMA
 * chains to hide the FMA latency on two pipes, and 15 of the 16 registers. */
QKV_INLINE void qk_tile(const int R, const float *q0, size_t ldq, const float *panel, size_t D,
                        float *s0, size_t lds) {
    __m256 a0[6], a1[6];
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) a0[r] = a1[r] = _mm256_setzero_ps();
    for (size_t d = 0; d < D; d++) {
        __m256 k0 = _mm256_loadu_ps(panel + d * QKV_PANEL);
        __m256 k1 = _mm256_loadu_ps(panel + d * QKV_PANEL + 8);
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            __m256 x = _mm256_broadcast_ss(q0 + (size_t)r * ldq + d);
            a0[r] = _mm256_fmadd_ps(x, k0, a0[r]);
            a1[r] = _mm256_fmadd_ps(x, k1, a1[r]);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        _mm256_storeu_ps(s0 + (size_t)r * lds, a0[r]);
        _mm256_storeu_ps(s0 + (size_t)r * lds + 8, a1[r]);
    }
}

static void qk_avx2(const float *q, size_t ldq, const float *kp, size_t D, size_t rows,
                    size_t ncols, float *s, size_t lds) {
    const size_t nc = QKV_QK_COLS(ncols);
    for (size_t p = 0; p * QKV_PANEL < nc; p++) {
        for (size_t h = 0; h < QKV_PANEL && p * QKV_PANEL + h < nc; h += 16) {
            const float *panel = kp + p * D * QKV_PANEL + h;
            float *sp = s + p * QKV_PANEL + h;
            size_t r0 = 0;
            for (; r0 + 6 <= rows; r0 += 6) qk_tile(6, q + r0 * ldq, ldq, panel, D, sp + r0 * lds, lds);
            switch (rows - r0) {
            case 5: qk_tile(5, q + r0 * ldq, ldq, panel, D, sp + r0 * lds, lds); break;
            case 4: qk_tile(4, q + r0 * ldq, ldq, panel, D, sp + r0 * lds, lds); break;
            case 3: qk_tile(3, q + r0 * ldq, ldq, panel, D, sp + r0 * lds, lds); break;
            case 2: qk_tile(2, q + r0 * ldq, ldq, panel, D, sp + r0 * lds, lds); break;
            case 1: qk_tile(1, q + r0 * ldq, ldq, panel, D, sp + r0 * lds, lds); break;
            default: break;
            }
        }
    }
}

/* R rows (R <= 6) x 16 output columns of o = alpha o + p v. */
QKV_INLINE void pv_tile(const int R, float *o, size_t ldo, const float *alpha, const float *p,
                        size_t ldp, size_t pcs, const float *v, size_t ldv, size_t nk, size_t dv) {
    for (size_t c = 0; c < dv; c += 16) {
        __m256i m0 = tail_mask(dv - c), m1 = tail_mask(dv - c > 8 ? dv - c - 8 : 0);
        __m256 a0[6], a1[6];
        float *oc = o + c;
        const int full = dv - c >= 16; /* vmaskmov is slow on some cores: only for tails */
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            if (full) {
                a0[r] = _mm256_loadu_ps(oc + (size_t)r * ldo);
                a1[r] = _mm256_loadu_ps(oc + (size_t)r * ldo + 8);
            } else {
                a0[r] = _mm256_maskload_ps(oc + (size_t)r * ldo, m0);
                a1[r] = _mm256_maskload_ps(oc + (size_t)r * ldo + 8, m1);
            }
            if (alpha) {
                __m256 al = _mm256_set1_ps(alpha[r]);
                a0[r] = _mm256_mul_ps(al, a0[r]);
                a1[r] = _mm256_mul_ps(al, a1[r]);
            }
        }
        const float *vc = v + c;
        if (full) {
            for (size_t j = 0; j < nk; j++) {
                __m256 v0 = _mm256_loadu_ps(vc + j * ldv);
                __m256 v1 = _mm256_loadu_ps(vc + j * ldv + 8);
#pragma GCC unroll 6
                for (int r = 0; r < R; r++) {
                    __m256 x = _mm256_broadcast_ss(p + (size_t)r * ldp + j * pcs);
                    a0[r] = _mm256_fmadd_ps(x, v0, a0[r]);
                    a1[r] = _mm256_fmadd_ps(x, v1, a1[r]);
                }
            }
        } else {
            for (size_t j = 0; j < nk; j++) {
                __m256 v0 = _mm256_maskload_ps(vc + j * ldv, m0);
                __m256 v1 = _mm256_maskload_ps(vc + j * ldv + 8, m1);
#pragma GCC unroll 6
                for (int r = 0; r < R; r++) {
                    __m256 x = _mm256_broadcast_ss(p + (size_t)r * ldp + j * pcs);
                    a0[r] = _mm256_fmadd_ps(x, v0, a0[r]);
                    a1[r] = _mm256_fmadd_ps(x, v1, a1[r]);
                }
            }
        }
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            if (full) {
                _mm256_storeu_ps(oc + (size_t)r * ldo, a0[r]);
                _mm256_storeu_ps(oc + (size_t)r * ldo + 8, a1[r]);
            } else {
                _mm256_maskstore_ps(oc + (size_t)r * ldo, m0, a0[r]);
                _mm256_maskstore_ps(oc + (size_t)r * ldo + 8, m1, a1[r]);
            }
        }
    }
}

static void pv_avx2(float *o, size_t ldo, const float *alpha, const float *p, size_t ldp,
                    size_t pcs, const float *v, size_t ldv, size_t nk, size_t dv, size_t rows) {
    size_t r = 0;
#define PV_AT(R) pv_tile(R, o + r * ldo, ldo, alpha ? alpha + r : NULL, p + r * ldp, ldp, pcs, v, ldv, nk, dv)
    /* 6-row tiles (12 FMA chains); 8 rows left go as 4 + 4, each keeping 8
     * chains busy (6 + 2 would leave 4). */
    for (; rows - r >= 6 && rows - r != 8; r += 6) PV_AT(6);
    if (rows - r == 8) {
        PV_AT(4);
        r += 4;
        PV_AT(4);
        return;
    }
    switch (rows - r) {
    case 5: PV_AT(5); break;
    case 4: PV_AT(4); break;
    case 3: PV_AT(3); break;
    case 2: PV_AT(2); break;
    case 1: PV_AT(1); break;
    default: break;
    }
#undef PV_AT
}

static void exp2_avx2(float *x, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, exp2_ps(_mm256_loadu_ps(x + i)));
    if (i < n) {
        __m256i m = tail_mask(n - i);
        _mm256_maskstore_ps(x + i, m, exp2_ps(_mm256_maskload_ps(x + i, m)));
    }
}

static float hmax(__m256 v) {
    __m128 a = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_max_ps(a, _mm_movehl_ps(a, a));
    a = _mm_max_ss(a, _mm_shuffle_ps(a, a, 1));
    return _mm_cvtss_f32(a);
}

static float hsum(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_shuffle_ps(a, a, 1));
    return _mm_cvtss_f32(a);
}

/* Rows in blocks of 8 (as the AVX-512 kernel, 16): the row maxima and sums
 * are reduced row by row, the statistics (new max, rescale factor, running
 * sum) updated 8 rows at once with the vector exp2, no libm call per row. */
static void softmax_avx2(float *s, size_t lds, size_t rows, size_t cols, float cm, float *m,
                         float *l, float *alpha) {
    const __m256 vc = _mm256_set1_ps(cm);
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    float mts[8], bases[8], sums[8];
    for (size_t r0 = 0; r0 < rows; r0 += 8) {
        size_t nb = rows - r0 < 8 ? rows - r0 : 8;
        __m256i bm = tail_mask(nb);
        for (size_t i = 0; i < nb; i++) {
            const float *row = s + (r0 + i) * lds;
            __m256 mx = ninf;
            size_t c = 0;
            for (; c + 8 <= cols; c += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(row + c));
            if (c < cols) {
                __m256i tm = tail_mask(cols - c);
                __m256 x = _mm256_blendv_ps(ninf, _mm256_maskload_ps(row + c, tm), _mm256_castsi256_ps(tm));
                mx = _mm256_max_ps(mx, x);
            }
            mts[i] = hmax(mx);
        }
        for (size_t i = nb; i < 8; i++) mts[i] = -INFINITY;
        __m256 mold = _mm256_blendv_ps(ninf, _mm256_maskload_ps(m + r0, bm), _mm256_castsi256_ps(bm));
        /* as m > mt ? m : mt (vmaxps returns its second operand unless the first is greater) */
        __m256 mn = _mm256_max_ps(mold, _mm256_loadu_ps(mts));
        __m256 empty = _mm256_cmp_ps(mn, ninf, _CMP_EQ_OQ);
        __m256 base = _mm256_andnot_ps(empty, mn);
        __m256 a = exp2_neg_ps(_mm256_mul_ps(_mm256_sub_ps(mold, base), vc));
        a = _mm256_blendv_ps(a, _mm256_set1_ps(1.0f), empty);
        _mm256_storeu_ps(bases, base);
        for (size_t i = 0; i < nb; i++) {
            float *row = s + (r0 + i) * lds;
            __m256 vb = _mm256_set1_ps(bases[i]), acc = _mm256_setzero_ps();
            size_t c = 0;
            for (; c + 8 <= cols; c += 8) {
                __m256 e = exp2_neg_ps(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(row + c), vb), vc));
                _mm256_storeu_ps(row + c, e);
                acc = _mm256_add_ps(acc, e);
            }
            if (c < cols) {
                __m256i tm = tail_mask(cols - c);
                __m256 x = _mm256_blendv_ps(ninf, _mm256_maskload_ps(row + c, tm), _mm256_castsi256_ps(tm));
                __m256 e = exp2_neg_ps(_mm256_mul_ps(_mm256_sub_ps(x, vb), vc));
                _mm256_maskstore_ps(row + c, tm, e);
                acc = _mm256_add_ps(acc, e);
            }
            sums[i] = hsum(acc);
        }
        for (size_t i = nb; i < 8; i++) sums[i] = 0.0f;
        __m256 lv = _mm256_maskload_ps(l + r0, bm);
        lv = _mm256_add_ps(_mm256_mul_ps(lv, a), _mm256_loadu_ps(sums));
        _mm256_maskstore_ps(l + r0, bm, lv);
        _mm256_maskstore_ps(m + r0, bm, mn);
        _mm256_maskstore_ps(alpha + r0, bm, a);
    }
}

/* p = 2^min(QKV_BWD_EXP_MAX, fma(c, s - mu, -x)) (min's second operand, e,
 * is kept when it is NaN), ds = p (dp - y) or 0 where p = 0. */
QKV_INLINE void bwd_softmax_vec(__m256 vc, __m256 sv, __m256 dv, __m256 mu, int has_mu, __m256 x,
                                __m256 y, __m256 *p_out, __m256 *d_out) {
    if (has_mu) sv = _mm256_sub_ps(sv, mu);
    __m256 p = exp2_ps(_mm256_min_ps(_mm256_set1_ps(QKV_BWD_EXP_MAX), _mm256_fmsub_ps(vc, sv, x)));
    __m256 d = _mm256_mul_ps(p, _mm256_sub_ps(dv, y));
    __m256 nz = _mm256_cmp_ps(p, _mm256_setzero_ps(), _CMP_NEQ_UQ);
    *p_out = p;
    *d_out = _mm256_and_ps(nz, d);
}

static void bwd_softmax_avx2(float *s, float *dp, size_t ld, size_t rows, size_t cols, float cm,
                             const float *M, const float *L, const float *Dd, int percol) {
    const __m256 vc = _mm256_set1_ps(cm);
    const int has_mu = M != NULL;
    for (size_t r = 0; r < rows; r++) {
        float *sr = s + r * ld, *dr = dp + r * ld;
        __m256 x = _mm256_set1_ps(percol ? 0.0f : L[r]), y = _mm256_set1_ps(percol ? 0.0f : Dd[r]);
        __m256 mu = _mm256_set1_ps(percol || !M ? 0.0f : M[r]), p, d;
        size_t c = 0;
        for (; c + 8 <= cols; c += 8) {
            if (percol) {
                x = _mm256_loadu_ps(L + c);
                y = _mm256_loadu_ps(Dd + c);
                if (has_mu) mu = _mm256_loadu_ps(M + c);
            }
            bwd_softmax_vec(vc, _mm256_loadu_ps(sr + c), _mm256_loadu_ps(dr + c), mu, has_mu, x, y, &p, &d);
            _mm256_storeu_ps(sr + c, p);
            _mm256_storeu_ps(dr + c, d);
        }
        if (c < cols) {
            __m256i tm = tail_mask(cols - c);
            if (percol) {
                x = _mm256_maskload_ps(L + c, tm);
                y = _mm256_maskload_ps(Dd + c, tm);
                if (has_mu) mu = _mm256_maskload_ps(M + c, tm);
            }
            bwd_softmax_vec(vc, _mm256_maskload_ps(sr + c, tm), _mm256_maskload_ps(dr + c, tm), mu, has_mu,
                            x, y, &p, &d);
            _mm256_maskstore_ps(sr + c, tm, p);
            _mm256_maskstore_ps(dr + c, tm, d);
        }
    }
}

/* In place: x[c] <- column c of the 8 x 8 block whose row r is x[r]. */
static inline void transpose8(__m256 x[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(x[i], x[i + 1]); /* per lane: a0 b0 a1 b1 */
        t[i + 1] = _mm256_unpackhi_ps(x[i], x[i + 1]); /* a2 b2 a3 b3 */
    }
    for (int g = 0; g < 8; g += 4) { /* rows g..g+3, per lane L: columns 4L + k in u[g + k] */
        u[g] = _mm256_shuffle_ps(t[g], t[g + 2], 0x44);
        u[g + 1] = _mm256_shuffle_ps(t[g], t[g + 2], 0xEE);
        u[g + 2] = _mm256_shuffle_ps(t[g + 1], t[g + 3], 0x44);
        u[g + 3] = _mm256_shuffle_ps(t[g + 1], t[g + 3], 0xEE);
    }
    for (int k = 0; k < 4; k++) {
        x[k] = _mm256_permute2f128_ps(u[k], u[4 + k], 0x20);
        x[k + 4] = _mm256_permute2f128_ps(u[k], u[4 + k], 0x31);
    }
}

/* 8 x 8 blocks transposed in registers, two at a time (rows r0..r0+15):
 * each dimension's 16 rows are one whole 64-byte line of the panel, stored
 * as two adjacent halves (a streaming store then fills its line at once). */
static void pack_panel_avx2(float *panel, const float *src, size_t ld, size_t nrows, size_t D, int stream) {
    for (size_t r0 = 0; r0 < QKV_PANEL; r0 += 16)
        for (size_t d0 = 0; d0 < D; d0 += 8) {
            size_t nd = D - d0 < 8 ? D - d0 : 8;
            __m256i m = tail_mask(nd);
            __m256 x[2][8];
            for (size_t h = 0; h < 2; h++) {
                size_t rb = r0 + 8 * h, nr = nrows > rb ? (nrows - rb < 8 ? nrows - rb : 8) : 0;
                for (size_t r = 0; r < 8; r++)
                    x[h][r] = r < nr ? _mm256_maskload_ps(src + (rb + r) * ld + d0, m) : _mm256_setzero_ps();
                transpose8(x[h]);
            }
            float *dst = panel + d0 * QKV_PANEL + r0;
            if (stream) /* dst + c * 32: 64-byte aligned */
                for (size_t c = 0; c < nd; c++) {
                    _mm256_stream_ps(dst + c * QKV_PANEL, x[0][c]);
                    _mm256_stream_ps(dst + c * QKV_PANEL + 8, x[1][c]);
                }
            else
                for (size_t c = 0; c < nd; c++) {
                    _mm256_storeu_ps(dst + c * QKV_PANEL, x[0][c]);
                    _mm256_storeu_ps(dst + c * QKV_PANEL + 8, x[1][c]);
                }
        }
}

/* Ordinary stores up to o's first 64-byte boundary and after its last;
 * between them two 32-byte streaming stores per line, so that every line
 * is written whole. */
static void scale_stream_avx2(float *o, const float *x, float mul, size_t n) {
    size_t head = (size_t)(-(uintptr_t)o & 63) / sizeof(float), i = 0;
    if (head > n) head = n;
    for (; i < head; i++) o[i] = x[i] * mul;
    __m256 m = _mm256_set1_ps(mul);
    for (; i + 16 <= n; i += 16) {
        _mm256_stream_ps(o + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), m));
        _mm256_stream_ps(o + i + 8, _mm256_mul_ps(_mm256_loadu_ps(x + i + 8), m));
    }
    for (; i < n; i++) o[i] = x[i] * mul;
}

static void stream_fence_avx2(void) { _mm_sfence(); }

static int all_finite_avx2(const float *x, size_t n) {
    const __m256i e = _mm256_set1_epi32(0x7f800000);
    __m256i bad = _mm256_setzero_si256();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i u = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(const void *)(x + i)), e);
        bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(u, e));
    }
    if (i < n) {
        __m256i u = _mm256_and_si256(_mm256_castps_si256(_mm256_maskload_ps(x + i, tail_mask(n - i))), e);
        bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(u, e));
    }
    return _mm256_testz_si256(bad, bad);
}

/* a * b mod 2^64 for 4 lanes and a constant b (halves blo, bhi): AVX2 has
 * only the 32 x 32 -> 64 product, and a b = alo blo + 2^32 (ahi blo + alo bhi). */
static inline __m256i mul64(__m256i a, __m256i blo, __m256i bhi) {
    __m256i lo = _mm256_mul_epu32(a, blo);
    __m256i cross = _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(a, 32), blo), _mm256_mul_epu32(a, bhi));
    return _mm256_add_epi64(lo, _mm256_slli_epi64(cross, 32));
}

/* splitmix64_mix of 4 lanes, shifted right by 11 (the uniform's 53 bits). */
static inline __m256i mix53(__m256i z, const __m256i m[4]) {
    z = mul64(_mm256_xor_si256(z, _mm256_srli_epi64(z, 30)), m[0], m[1]);
    z = mul64(_mm256_xor_si256(z, _mm256_srli_epi64(z, 27)), m[2], m[3]);
    return _mm256_srli_epi64(_mm256_xor_si256(z, _mm256_srli_epi64(z, 31)), 11);
}

/* 8 columns at a time: two vectors of 4 hashes, their dropped lanes (the
 * 53 bits < thr: a signed comparison is right below 2^63) packed into one
 * float mask; the tail column by column. */
static void dropout_avx2(float *x, float *y, size_t ld, size_t rows, size_t cols, const uint64_t *R,
                         const uint64_t *C, uint64_t thr, float scale) {
    const __m256i m[4] = {_mm256_set1_epi64x(0x1CE4E5B9), _mm256_set1_epi64x(0xBF58476D),
                          _mm256_set1_epi64x(0x133111EB), _mm256_set1_epi64x(0x94D049BB)};
    const __m256i vt = _mm256_set1_epi64x((long long)thr);
    const __m256 vs = _mm256_set1_ps(scale);
    for (size_t r = 0; r < rows; r++) {
        const __m256i vr = _mm256_set1_epi64x((long long)R[r]);
        float *xr = x + r * ld, *yr = y ? y + r * ld : NULL;
        size_t c = 0;
        for (; c + 8 <= cols; c += 8) {
            __m256i z0 = mix53(_mm256_add_epi64(vr, _mm256_loadu_si256((const __m256i *)(const void *)(C + c))), m);
            __m256i z1 = mix53(_mm256_add_epi64(vr, _mm256_loadu_si256((const __m256i *)(const void *)(C + c + 4))), m);
            __m256 d = _mm256_shuffle_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi64(vt, z0)),
                                         _mm256_castsi256_ps(_mm256_cmpgt_epi64(vt, z1)), _MM_SHUFFLE(2, 0, 2, 0));
            d = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(d), _MM_SHUFFLE(3, 1, 2, 0)));
            __m256 f = _mm256_andnot_ps(d, vs);
            _mm256_storeu_ps(xr + c, _mm256_mul_ps(_mm256_loadu_ps(xr + c), f));
            if (yr) _mm256_storeu_ps(yr + c, f);
        }
        for (; c < cols; c++) {
            float f = qkv_dropout_factor(R[r] + C[c], thr, scale);
            xr[c] *= f;
            if (yr) yr[c] = f;
        }
    }
}

/* 8 floats at a time as two halves of 4 doubles, the tail one by one. */
static void scale_bias_avx2(float *x, size_t n, double mul, const float *add) {
    const __m256d m = _mm256_set1_pd(mul);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m128 lo = _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)), m));
        __m128 hi = _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)), m));
        __m256 r = _mm256_insertf128_ps(_mm256_castps128_ps256(lo), hi, 1);
        if (add) r = _mm256_add_ps(r, _mm256_loadu_ps(add + i));
        _mm256_storeu_ps(x + i, r);
    }
    for (; i < n; i++) {
        float t = (float)((double)x[i] * mul);
        x[i] = add ? t + add[i] : t;
    }
}

QKV_ATTN_DEFINE_INIT(avx2)
