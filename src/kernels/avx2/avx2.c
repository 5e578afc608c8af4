/* AVX2 + FMA micro-kernels (compiled with -mavx2 -mfma only here). With 16
 * ymm registers the register tiles are 4 rows x 16 columns (8 accumulators);
 * tails use vmaskmov, so nothing outside the given ranges is read or written. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "core/cpu.h"

#define REP4(X) X(0) X(1) X(2) X(3)

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

static inline __m256i tail_mask(size_t rem) {
    int k = rem >= 8 ? 8 : (int)rem;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

static void qk_avx2(const float *q, size_t ldq, const float *kp, size_t D, size_t rows,
                    size_t npanels, float *s, size_t lds) {
    for (size_t p = 0; p < npanels; p++) {
        for (size_t h = 0; h < QKV_PANEL; h += 16) {
            const float *panel = kp + p * D * QKV_PANEL + h;
            for (size_t r0 = 0; r0 < rows; r0 += 4) {
                const float *q0 = q + r0 * ldq;
                __m256 a0[4], a1[4];
#define ZERO(r) a0[r] = _mm256_setzero_ps(); a1[r] = _mm256_setzero_ps();
                REP4(ZERO)
#undef ZERO
                for (size_t d = 0; d < D; d++) {
                    __m256 k0 = _mm256_loadu_ps(panel + d * QKV_PANEL);
                    __m256 k1 = _mm256_loadu_ps(panel + d * QKV_PANEL + 8);
#define FMA(r)                                                \
    {                                                         \
        __m256 x = _mm256_broadcast_ss(q0 + (r) * ldq + d);   \
        a0[r] = _mm256_fmadd_ps(x, k0, a0[r]);                \
        a1[r] = _mm256_fmadd_ps(x, k1, a1[r]);                \
    }
                    REP4(FMA)
#undef FMA
                }
                float *s0 = s + r0 * lds + p * QKV_PANEL + h;
#define STORE(r) _mm256_storeu_ps(s0 + (r) * lds, a0[r]); _mm256_storeu_ps(s0 + (r) * lds + 8, a1[r]);
                REP4(STORE)
#undef STORE
            }
        }
    }
}

static void pv4(float *o, size_t ldo, const float *alpha, const float *p, size_t ldp,
                const float *v, size_t ldv, size_t nk, size_t dv) {
    for (size_t c = 0; c < dv; c += 16) {
        __m256i m0 = tail_mask(dv - c), m1 = tail_mask(dv - c > 8 ? dv - c - 8 : 0);
        __m256 a0[4], a1[4];
        float *oc = o + c;
#define LOAD(r)                                                             \
    a0[r] = _mm256_maskload_ps(oc + (r) * ldo, m0);                         \
    a1[r] = _mm256_maskload_ps(oc + (r) * ldo + 8, m1);                     \
    if (alpha) {                                                            \
        __m256 al = _mm256_set1_ps(alpha[r]);                               \
        a0[r] = _mm256_mul_ps(al, a0[r]);                                   \
        a1[r] = _mm256_mul_ps(al, a1[r]);                                   \
    }
        REP4(LOAD)
#undef LOAD
        const float *vc = v + c;
        for (size_t j = 0; j < nk; j++) {
            __m256 v0 = _mm256_maskload_ps(vc + j * ldv, m0);
            __m256 v1 = _mm256_maskload_ps(vc + j * ldv + 8, m1);
#define FMA(r)                                                \
    {                                                         \
        __m256 x = _mm256_broadcast_ss(p + (r) * ldp + j);    \
        a0[r] = _mm256_fmadd_ps(x, v0, a0[r]);                \
        a1[r] = _mm256_fmadd_ps(x, v1, a1[r]);                \
    }
            REP4(FMA)
#undef FMA
        }
#define STORE(r)                                                            \
    _mm256_maskstore_ps(oc + (r) * ldo, m0, a0[r]);                         \
    _mm256_maskstore_ps(oc + (r) * ldo + 8, m1, a1[r]);
        REP4(STORE)
#undef STORE
    }
}

static void pv1(float *o, const float *alpha, const float *p, const float *v, size_t ldv,
                size_t nk, size_t dv) {
    for (size_t c = 0; c < dv; c += 8) {
        __m256i m0 = tail_mask(dv - c);
        __m256 a = _mm256_maskload_ps(o + c, m0);
        if (alpha) a = _mm256_mul_ps(_mm256_set1_ps(alpha[0]), a);
        for (size_t j = 0; j < nk; j++)
            a = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), _mm256_maskload_ps(v + j * ldv + c, m0), a);
        _mm256_maskstore_ps(o + c, m0, a);
    }
}

static void pv_avx2(float *o, size_t ldo, const float *alpha, const float *p, size_t ldp,
                    const float *v, size_t ldv, size_t nk, size_t dv, size_t rows) {
    size_t r = 0;
    for (; r + 4 <= rows; r += 4)
        pv4(o + r * ldo, ldo, alpha ? alpha + r : NULL, p + r * ldp, ldp, v, ldv, nk, dv);
    for (; r < rows; r++)
        pv1(o + r * ldo, alpha ? alpha + r : NULL, p + r * ldp, v, ldv, nk, dv);
}

static void exp2_avx2(float *x, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, exp2_ps(_mm256_loadu_ps(x + i)));
    if (i < n) {
        __m256i m = tail_mask(n - i);
        _mm256_maskstore_ps(x + i, m, exp2_ps(_mm256_maskload_ps(x + i, m)));
    }
}

static float exp2_scalar(float x) { return x < -126.0f ? 0.0f : exp2f(x); }

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

static void softmax_avx2(float *s, size_t lds, size_t rows, size_t cols, float cm, float *m,
                         float *l, float *alpha) {
    const __m256 vc = _mm256_set1_ps(cm);
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    for (size_t r = 0; r < rows; r++) {
        float *row = s + r * lds;
        __m256 mx = ninf;
        for (size_t c = 0; c < cols; c += 8) {
            __m256i tm = tail_mask(cols - c);
            __m256 x = _mm256_blendv_ps(ninf, _mm256_maskload_ps(row + c, tm), _mm256_castsi256_ps(tm));
            mx = _mm256_max_ps(mx, x);
        }
        float mt = hmax(mx);
        float mn = m[r] > mt ? m[r] : mt;
        float a = 1.0f, base = 0.0f;
        if (mn != -INFINITY) {
            base = mn;
            a = exp2_scalar((m[r] - mn) * cm);
        }
        __m256 vb = _mm256_set1_ps(base), acc = _mm256_setzero_ps();
        for (size_t c = 0; c < cols; c += 8) {
            __m256i tm = tail_mask(cols - c);
            __m256 x = _mm256_blendv_ps(ninf, _mm256_maskload_ps(row + c, tm), _mm256_castsi256_ps(tm));
            __m256 e = exp2_ps(_mm256_mul_ps(_mm256_sub_ps(x, vb), vc));
            _mm256_maskstore_ps(row + c, tm, e);
            acc = _mm256_add_ps(acc, e);
        }
        l[r] = l[r] * a + hsum(acc);
        m[r] = mn;
        alpha[r] = a;
    }
}

static void bwd_softmax_avx2(float *s, float *dp, size_t ld, size_t rows, size_t cols, float cm,
                             const float *L, const float *Dd, int percol) {
    const __m256 vc = _mm256_set1_ps(cm);
    for (size_t r = 0; r < rows; r++) {
        float *sr = s + r * ld, *dr = dp + r * ld;
        __m256 x = _mm256_set1_ps(percol ? 0.0f : L[r]), y = _mm256_set1_ps(percol ? 0.0f : Dd[r]);
        for (size_t c = 0; c < cols; c += 8) {
            __m256i tm = tail_mask(cols - c);
            if (percol) {
                x = _mm256_maskload_ps(L + c, tm);
                y = _mm256_maskload_ps(Dd + c, tm);
            }
            __m256 p = exp2_ps(_mm256_fmsub_ps(vc, _mm256_maskload_ps(sr + c, tm), x));
            __m256 d = _mm256_mul_ps(p, _mm256_sub_ps(_mm256_maskload_ps(dr + c, tm), y));
            __m256 nz = _mm256_cmp_ps(p, _mm256_setzero_ps(), _CMP_NEQ_UQ);
            _mm256_maskstore_ps(sr + c, tm, p);
            _mm256_maskstore_ps(dr + c, tm, _mm256_and_ps(nz, d));
        }
    }
}

const qkv_kernels qkv_kernels_avx2 = {
    "avx2", qk_avx2, pv_avx2, softmax_avx2, bwd_softmax_avx2, exp2_avx2,
};
