/* AVX-512F micro-kernels (compiled with -mavx512f/dq/bw/vl -mfma only here).
 * Register tiles of 8 rows x 32 columns (16 zmm accumulators) for QK^T and
 * PV, and for PV at 64 value columns 6 (or 4) rows x 64 columns, so each
 * step reads a whole row of V; tails use masked loads and stores, so
 * nothing outside the given ranges is read or written. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "kernels/attn.h"
#include "kernels/avx512/vmath.h"

#define REP8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)

/* 2^x for the softmax's arguments x = c (s - max) <= 0 (or NaN): no upper
 * clamp, and a degree-5 polynomial 1 + f P4(f) fitted (Lawson-weighted least
 * squares toward minimax) to the relative error, 1.8e-7 in float: below the
 * float rounding of the logits themselves. Same exact 0 below -126. */
static inline __m512 exp2_neg_ps(__m512 x) {
    __m512 xc = _mm512_max_ps(_mm512_set1_ps(-127.0f), x);
    __m512 n = _mm512_roundscale_ps(xc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(xc, n);
    __m512 p = _mm512_set1_ps(1.321933655e-3f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.671698888e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550890648e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402223798e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931468577e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-126.0f), _CMP_NLT_UQ);
    return _mm512_maskz_scalef_ps(keep, p, n);
}

static inline __mmask16 tail_mask(size_t rem) {
    return rem >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << rem) - 1u);
}

/* 8 rows x 32 columns (one panel) of s, or its first 16 columns (half). */
QKV_INLINE void qk_8x32(const int half, const float *q0, size_t ldq, const float *panel, size_t D,
                        float *s0, size_t lds) {
    __m512 a0[8], a1[8];
#define ZERO(r) a0[r] = _mm512_setzero_ps(); a1[r] = _mm512_setzero_ps();
    REP8(ZERO)
#undef ZERO
    for (size_t d = 0; d < D; d++) {
        __m512 k0 = _mm512_loadu_ps(panel + d * QKV_PANEL);
        __m512 k1 = half ? k0 : _mm512_loadu_ps(panel + d * QKV_PANEL + 16);
#define FMA(r)                                                \
    {                                                         \
        __m512 x = _mm512_set1_ps(q0[(r) * ldq + d]);         \
        a0[r] = _mm512_fmadd_ps(x, k0, a0[r]);                \
        if (!half) a1[r] = _mm512_fmadd_ps(x, k1, a1[r]);     \
    }
        REP8(FMA)
#undef FMA
    }
#define STORE(r) _mm512_storeu_ps(s0 + (r) * lds, a0[r]); if (!half) _mm512_storeu_ps(s0 + (r) * lds + 16, a1[r]);
    REP8(STORE)
#undef STORE
}

static void qk_avx512(const float *q, size_t ldq, const float *kp, size_t D, size_t rows,
                      size_t ncols, float *s, size_t lds) {
    const size_t nc = QKV_QK_COLS(ncols);
    for (size_t p = 0; p * QKV_PANEL < nc; p++) {
        const float *panel = kp + p * D * QKV_PANEL;
        const int half = nc - p * QKV_PANEL <= 16;
        for (size_t r0 = 0; r0 < rows; r0 += 8) {
            if (half) qk_8x32(1, q + r0 * ldq, ldq, panel, D, s + r0 * lds + p * QKV_PANEL, lds);
            else qk_8x32(0, q + r0 * ldq, ldq, panel, D, s + r0 * lds + p * QKV_PANEL, lds);
        }
    }
}

static void pv8(float *o, size_t ldo, const float *alpha, const float *p, size_t ldp, size_t pcs,
                const float *v, size_t ldv, size_t nk, size_t dv) {
    for (size_t c = 0; c < dv; c += 32) {
        __mmask16 m0 = tail_mask(dv - c), m1 = dv - c > 16 ? tail_mask(dv - c - 16) : 0;
        __m512 a0[8], a1[8];
        float *oc = o + c;
#define LOAD(r)                                                             \
    a0[r] = _mm512_maskz_loadu_ps(m0, oc + (r) * ldo);                      \
    a1[r] = _mm512_maskz_loadu_ps(m1, oc + (r) * ldo + 16);                 \
    if (alpha) {                                                            \
        __m512 al = _mm512_set1_ps(alpha[r]);                               \
        a0[r] = _mm512_mul_ps(al, a0[r]);                                   \
        a1[r] = _mm512_mul_ps(al, a1[r]);                                   \
    }
        REP8(LOAD)
#undef LOAD
        const float *vc = v + c;
#define FMA(r)                                                \
    {                                                         \
        __m512 x = _mm512_set1_ps(p[(r) * ldp + j * pcs]);    \
        a0[r] = _mm512_fmadd_ps(x, v0, a0[r]);                \
        a1[r] = _mm512_fmadd_ps(x, v1, a1[r]);                \
    }
        if (dv - c >= 32) { /* whole columns: plain loads */
            for (size_t j = 0; j < nk; j++) {
                __m512 v0 = _mm512_loadu_ps(vc + j * ldv), v1 = _mm512_loadu_ps(vc + j * ldv + 16);
                REP8(FMA)
            }
        } else {
            for (size_t j = 0; j < nk; j++) {
                __m512 v0 = _mm512_maskz_loadu_ps(m0, vc + j * ldv);
                __m512 v1 = _mm512_maskz_loadu_ps(m1, vc + j * ldv + 16);
                REP8(FMA)
            }
        }
#undef FMA
#define STORE(r)                                                            \
    _mm512_mask_storeu_ps(oc + (r) * ldo, m0, a0[r]);                       \
    _mm512_mask_storeu_ps(oc + (r) * ldo + 16, m1, a1[r]);
        REP8(STORE)
#undef STORE
    }
}

/* R rows x 64 columns (4R accumulators): each step reads one whole row of
 * V (256 bytes in order) for R rows of P. */
QKV_INLINE void pv_rx64(const int R, float *o, size_t ldo, const float *alpha, const float *p, size_t ldp,
                        size_t pcs, const float *v, size_t ldv, size_t nk) {
    __m512 a[6][4];
    for (int r = 0; r < R; r++)
        for (int q = 0; q < 4; q++) {
            a[r][q] = _mm512_loadu_ps(o + r * ldo + 16 * q);
            if (alpha) a[r][q] = _mm512_mul_ps(_mm512_set1_ps(alpha[r]), a[r][q]);
        }
    for (size_t j = 0; j < nk; j++) {
        const float *vj = v + j * ldv;
        __m512 v0 = _mm512_loadu_ps(vj), v1 = _mm512_loadu_ps(vj + 16), v2 = _mm512_loadu_ps(vj + 32),
               v3 = _mm512_loadu_ps(vj + 48);
        for (int r = 0; r < R; r++) {
            __m512 x = _mm512_set1_ps(p[r * ldp + j * pcs]);
            a[r][0] = _mm512_fmadd_ps(x, v0, a[r][0]);
            a[r][1] = _mm512_fmadd_ps(x, v1, a[r][1]);
            a[r][2] = _mm512_fmadd_ps(x, v2, a[r][2]);
            a[r][3] = _mm512_fmadd_ps(x, v3, a[r][3]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int q = 0; q < 4; q++) _mm512_storeu_ps(o + r * ldo + 16 * q, a[r][q]);
}

static void pv1(float *o, const float *alpha, const float *p, size_t pcs, const float *v, size_t ldv,
                size_t nk, size_t dv) {
    for (size_t c = 0; c < dv; c += 16) {
        __mmask16 m0 = tail_mask(dv - c);
        __m512 a = _mm512_maskz_loadu_ps(m0, o + c);
        if (alpha) a = _mm512_mul_ps(_mm512_set1_ps(alpha[0]), a);
        for (size_t j = 0; j < nk; j++)
            a = _mm512_fmadd_ps(_mm512_set1_ps(p[j * pcs]), _mm512_maskz_loadu_ps(m0, v + j * ldv + c), a);
        _mm512_mask_storeu_ps(o + c, m0, a);
    }
}

static void pv_avx512(float *o, size_t ldo, const float *alpha, const float *p, size_t ldp,
                      size_t pcs, const float *v, size_t ldv, size_t nk, size_t dv, size_t rows) {
    size_t r = 0;
    if (dv == 64) { /* 64 rows: 10 x 6 + 4 */
        for (; r + 6 <= rows; r += 6) pv_rx64(6, o + r * ldo, ldo, alpha ? alpha + r : NULL, p + r * ldp, ldp, pcs, v, ldv, nk);
        for (; r + 4 <= rows; r += 4) pv_rx64(4, o + r * ldo, ldo, alpha ? alpha + r : NULL, p + r * ldp, ldp, pcs, v, ldv, nk);
    }
    for (; r + 8 <= rows; r += 8) pv8(o + r * ldo, ldo, alpha ? alpha + r : NULL, p + r * ldp, ldp, pcs, v, ldv, nk, dv);
    for (; r < rows; r++) pv1(o + r * ldo, alpha ? alpha + r : NULL, p + r * ldp, pcs, v, ldv, nk, dv);
}

static void exp2_avx512(float *x, size_t n) {
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(x + i, m, exp2_ps(_mm512_maskz_loadu_ps(m, x + i)));
    }
}


/* Rows in blocks of 16: the row maxima and sums are reduced row by row
 * (independent, so they overlap), but the per-row statistics (new max,
 * rescale factor, running sum) are updated 16 rows at once in one vector,
 * with the vector exp2 instead of a libm call per row. */
static void softmax_avx512(float *s, size_t lds, size_t rows, size_t cols, float cm, float *m,
                           float *l, float *alpha) {
    const __m512 vc = _mm512_set1_ps(cm);
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    float mts[16], bases[16], sums[16];
    for (size_t r0 = 0; r0 < rows; r0 += 16) {
        size_t nb = rows - r0 < 16 ? rows - r0 : 16;
        __mmask16 bm = tail_mask(nb);
        for (size_t i = 0; i < nb; i++) {
            const float *row = s + (r0 + i) * lds;
            __m512 mx = ninf;
            for (size_t c = 0; c < cols; c += 16)
                mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(ninf, tail_mask(cols - c), row + c));
            mts[i] = _mm512_reduce_max_ps(mx);
        }
        __m512 mold = _mm512_mask_loadu_ps(ninf, bm, m + r0);
        __m512 mn = _mm512_max_ps(mold, _mm512_maskz_loadu_ps(bm, mts)); /* as m > mt ? m : mt */
        __mmask16 empty = _mm512_cmp_ps_mask(mn, ninf, _CMP_EQ_OQ);
        __m512 base = _mm512_mask_mov_ps(mn, empty, _mm512_setzero_ps());
        __m512 a = exp2_neg_ps(_mm512_mul_ps(_mm512_sub_ps(mold, base), vc));
        a = _mm512_mask_mov_ps(a, empty, _mm512_set1_ps(1.0f));
        _mm512_storeu_ps(bases, base);
        for (size_t i = 0; i < nb; i++) {
            float *row = s + (r0 + i) * lds;
            __m512 vb = _mm512_set1_ps(bases[i]), acc = _mm512_setzero_ps();
            for (size_t c = 0; c < cols; c += 16) {
                __mmask16 tm = tail_mask(cols - c);
                __m512 e = exp2_neg_ps(_mm512_mul_ps(_mm512_sub_ps(_mm512_mask_loadu_ps(ninf, tm, row + c), vb), vc));
                _mm512_mask_storeu_ps(row + c, tm, e);
                acc = _mm512_add_ps(acc, e);
            }
            sums[i] = _mm512_reduce_add_ps(acc);
        }
        __m512 lv = _mm512_maskz_loadu_ps(bm, l + r0);
        lv = _mm512_add_ps(_mm512_mul_ps(lv, a), _mm512_maskz_loadu_ps(bm, sums));
        _mm512_mask_storeu_ps(l + r0, bm, lv);
        _mm512_mask_storeu_ps(m + r0, bm, mn);
        _mm512_mask_storeu_ps(alpha + r0, bm, a);
    }
}

static void bwd_softmax_avx512(float *s, float *dp, size_t ld, size_t rows, size_t cols, float cm,
                               const float *M, const float *L, const float *Dd, int percol) {
    const __m512 vc = _mm512_set1_ps(cm), zero = _mm512_setzero_ps(), emax = _mm512_set1_ps(QKV_BWD_EXP_MAX);
    for (size_t r = 0; r < rows; r++) {
        float *sr = s + r * ld, *dr = dp + r * ld;
        __m512 x = _mm512_set1_ps(percol ? 0.0f : L[r]), y = _mm512_set1_ps(percol ? 0.0f : Dd[r]);
        __m512 mu = _mm512_set1_ps(percol || !M ? 0.0f : M[r]);
        for (size_t c = 0; c < cols; c += 16) {
            __mmask16 tm = tail_mask(cols - c);
            if (percol) {
                x = _mm512_maskz_loadu_ps(tm, L + c);
                y = _mm512_maskz_loadu_ps(tm, Dd + c);
                if (M) mu = _mm512_maskz_loadu_ps(tm, M + c);
            }
            __m512 sv = _mm512_maskz_loadu_ps(tm, sr + c);
            if (M) sv = _mm512_sub_ps(sv, mu);
            /* min(emax, e): the second operand (e) when e is NaN, so NaN stays. */
            __m512 p = exp2_ps(_mm512_min_ps(emax, _mm512_fmsub_ps(vc, sv, x)));
            __m512 d = _mm512_mul_ps(p, _mm512_sub_ps(_mm512_maskz_loadu_ps(tm, dr + c), y));
            __mmask16 nz = _mm512_cmp_ps_mask(p, zero, _CMP_NEQ_UQ);
            _mm512_mask_storeu_ps(sr + c, tm, p);
            _mm512_mask_storeu_ps(dr + c, tm, _mm512_maskz_mov_ps(nz, d));
        }
    }
}

/* In place: x[c] <- column c of the 16 x 16 block whose row r is x[r]. */
static inline void transpose16(__m512 x[16]) {
    __m512 t[16], u[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(x[i], x[i + 1]); /* per lane: a0 b0 a1 b1 */
        t[i + 1] = _mm512_unpackhi_ps(x[i], x[i + 1]); /* a2 b2 a3 b3 */
    }
    for (int g = 0; g < 16; g += 4) { /* rows g..g+3, per lane L: column 4L + k in u[g + k] */
        u[g] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[g]), _mm512_castps_pd(t[g + 2])));
        u[g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[g]), _mm512_castps_pd(t[g + 2])));
        u[g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[g + 1]), _mm512_castps_pd(t[g + 3])));
        u[g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[g + 1]), _mm512_castps_pd(t[g + 3])));
    }
    for (int k = 0; k < 4; k++) { /* column k + 4L: lane L of u[k], u[4+k], u[8+k], u[12+k] */
        __m512 lo0 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0x44), hi0 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0xEE);
        __m512 lo1 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0x44), hi1 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0xEE);
        x[k] = _mm512_shuffle_f32x4(lo0, lo1, 0x88);
        x[k + 4] = _mm512_shuffle_f32x4(lo0, lo1, 0xDD);
        x[k + 8] = _mm512_shuffle_f32x4(hi0, hi1, 0x88);
        x[k + 12] = _mm512_shuffle_f32x4(hi0, hi1, 0xDD);
    }
}

/* 16 x 16 blocks transposed in registers: each store is 16 rows of one
 * dimension, a whole 64-byte line of the panel. */
static void pack_panel_avx512(float *panel, const float *src, size_t ld, size_t nrows, size_t D, int stream) {
    for (size_t r0 = 0; r0 < QKV_PANEL; r0 += 16) {
        size_t nr = nrows > r0 ? (nrows - r0 < 16 ? nrows - r0 : 16) : 0;
        for (size_t d0 = 0; d0 < D; d0 += 16) {
            size_t nd = D - d0 < 16 ? D - d0 : 16;
            __mmask16 m = tail_mask(nd);
            __m512 x[16];
            for (size_t r = 0; r < 16; r++)
                x[r] = r < nr ? _mm512_maskz_loadu_ps(m, src + (r0 + r) * ld + d0) : _mm512_setzero_ps();
            transpose16(x);
            if (stream) /* panel + (d0 + c) * 32 + r0: a whole aligned line */
                for (size_t c = 0; c < nd; c++) _mm512_stream_ps(panel + (d0 + c) * QKV_PANEL + r0, x[c]);
            else
                for (size_t c = 0; c < nd; c++) _mm512_storeu_ps(panel + (d0 + c) * QKV_PANEL + r0, x[c]);
        }
    }
}

/* A masked ordinary store up to o's first 64-byte boundary, whole lines
 * streamed, a masked ordinary store for the rest. */
static void scale_stream_avx512(float *o, const float *x, float mul, size_t n) {
    size_t head = (size_t)(-(uintptr_t)o & 63) / sizeof(float), i = 0;
    if (head > n) head = n;
    __m512 m = _mm512_set1_ps(mul);
    if (head) {
        __mmask16 k = tail_mask(head);
        _mm512_mask_storeu_ps(o, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x), m));
        i = head;
    }
    for (; i + 16 <= n; i += 16) _mm512_stream_ps(o + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), m));
    if (i < n) {
        __mmask16 k = tail_mask(n - i);
        _mm512_mask_storeu_ps(o + i, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), m));
    }
}

static void stream_fence_avx512(void) { _mm_sfence(); }

static int all_finite_avx512(const float *x, size_t n) {
    const __m512i e = _mm512_set1_epi32(0x7f800000);
    __mmask16 bad = 0;
    for (size_t i = 0; i < n; i += 16) {
        __m512i u = _mm512_and_si512(_mm512_maskz_loadu_epi32(tail_mask(n - i), x + i), e);
        bad |= _mm512_cmpeq_epi32_mask(u, e);
    }
    return bad == 0;
}

/* splitmix64_mix of 8 lanes (vpmullq: AVX-512DQ). */
static inline __m512i mix64(__m512i z) {
    z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 30)),
                           _mm512_set1_epi64((long long)0xBF58476D1CE4E5B9ull));
    z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 27)),
                           _mm512_set1_epi64((long long)0x94D049BB133111EBull));
    return _mm512_xor_si512(z, _mm512_srli_epi64(z, 31));
}

/* 16 columns at a time, tails masked (masked-off lanes are neither read nor
 * written). (z >> 11) >= thr is z >= thr 2^11: thr < 2^53, no overflow. */
static void dropout_avx512(float *x, float *y, size_t ld, size_t rows, size_t cols, const uint64_t *R,
                           const uint64_t *C, uint64_t thr, float scale) {
    const __m512i vt = _mm512_set1_epi64((long long)(thr << 11));
    const __m512 vs = _mm512_set1_ps(scale);
    for (size_t r = 0; r < rows; r++) {
        const __m512i vr = _mm512_set1_epi64((long long)R[r]);
        float *xr = x + r * ld, *yr = y ? y + r * ld : NULL;
        for (size_t c = 0; c < cols; c += 16) {
            const __mmask16 t = tail_mask(cols - c);
            __m512i c0 = _mm512_maskz_loadu_epi64((__mmask8)t, C + c);
            __m512i c1 = _mm512_maskz_loadu_epi64((__mmask8)(t >> 8), t >> 8 ? C + c + 8 : C);
            __mmask8 k0 = _mm512_cmpge_epu64_mask(mix64(_mm512_add_epi64(vr, c0)), vt);
            __mmask8 k1 = _mm512_cmpge_epu64_mask(mix64(_mm512_add_epi64(vr, c1)), vt);
            __m512 f = _mm512_maskz_mov_ps((__mmask16)(k0 | (unsigned)k1 << 8), vs);
            _mm512_mask_storeu_ps(xr + c, t, _mm512_mul_ps(_mm512_maskz_loadu_ps(t, xr + c), f));
            if (yr) _mm512_mask_storeu_ps(yr + c, t, f);
        }
    }
}

/* 16 floats at a time as two halves of 8 doubles, the tail masked. */
static void scale_bias_avx512(float *x, size_t n, double mul, const float *add) {
    const __m512d m = _mm512_set1_pd(mul);
    for (size_t i = 0; i < n; i += 16) {
        const __mmask16 k = tail_mask(n - i);
        __m512 v = _mm512_maskz_loadu_ps(k, x + i);
        __m256 lo = _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(v)), m));
        __m256 hi = _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1)), m));
        __m512 r = _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
        if (add) r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(k, add + i));
        _mm512_mask_storeu_ps(x + i, k, r);
    }
}

QKV_ATTN_DEFINE_INIT(avx512)
