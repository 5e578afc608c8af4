/* AVX-512F row kernels (kernels/nn.h), 16 floats per step, masked tails.
 *
 * GELU: x Phi(x) with Phi(x) = erfc(-x / sqrt 2) / 2 computed for z = |x| /
 * sqrt 2 and reflected by the sign of x, so that both tails keep their
 * relative accuracy: erfc(z) = exp(-z^2) P(t), t = 1 / (1 + z / 2), P of
 * degree 10 fitted for qkv (Lawson-weighted least squares toward minimax
 * on the relative error, each coefficient rounded to float in turn and the
 * rest refitted): 6.7e-9 relative on [0, 6] (beyond, Phi(-x) < 1e-16),
 * 2.1e-7 evaluated in float; exp(-z^2) as exp(-x^2 / 2) with its argument
 * as a float pair. One branch-free piece for every z (a separate erf
 * polynomial below z = 1/2 cost every vector with lanes on both sides both
 * pieces). Measured against libm in double over |x| <= 6: within 5.4e-7
 * relative of GELU (kernels/nn.h allows 6e-7). */
#include <immintrin.h>
#include <math.h>

#include "kernels/avx512/vmath.h"
#include "kernels/nn.h"

static inline __mmask16 tail_mask(size_t rem) {
    return rem >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << rem) - 1u);
}

#define FMA_C(p, x, c) _mm512_fmadd_ps(p, x, _mm512_set1_ps(c))

/* 2^a for a = k * f(x) given in double (two vectors of 8): the float part
 * through the polynomial, the rest folded in as 2^hi (1 + lo ln 2). The
 * argument of an exponential is the sensitive part - an error of d in it is
 * a relative error of d in the result - and in float its rounding alone
 * would be |a| units in the last place (~20 in GELU's tails). */
static inline __m512 exp2_split_ps(__m512d a0, __m512d a1) {
    __m256 h0 = _mm512_cvtpd_ps(a0), h1 = _mm512_cvtpd_ps(a1);
    __m256 l0 = _mm512_cvtpd_ps(_mm512_sub_pd(a0, _mm512_cvtps_pd(h0)));
    __m256 l1 = _mm512_cvtpd_ps(_mm512_sub_pd(a1, _mm512_cvtps_pd(h1)));
    __m512 hi = _mm512_insertf32x8(_mm512_castps256_ps512(h0), h1, 1);
    __m512 lo = _mm512_insertf32x8(_mm512_castps256_ps512(l0), l1, 1);
    lo = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(lo, lo, _CMP_ORD_Q), lo); /* inf - inf: 0 */
    return _mm512_mul_ps(exp2_ps(hi), _mm512_fmadd_ps(lo, _mm512_set1_ps(0.69314718055994530942f), _mm512_set1_ps(1.0f)));
}

static inline __m512d lo8(__m512 x) { return _mm512_cvtps_pd(_mm512_castps512_ps256(x)); }
static inline __m512d hi8(__m512 x) { return _mm512_cvtps_pd(_mm512_extractf32x8_ps(x, 1)); }

/* exp(-x^2 / 2) = 2^a, a = -x^2 log2(e) / 2 carried as a float pair a + lo
 * (x^2 split exactly by an FMA, the constant in two floats): the argument
 * keeps the accuracy it had in double, without the conversions. Only for
 * |x| <= 6 sqrt 2 (phi_ps clamps it): a >= -52, where 2^a needs neither
 * exp2_ps' clamps nor its underflow test. */
static inline __m512 exp_neg_half_sq_ps(__m512 x) {
    const __m512 ch = _mm512_set1_ps(-0.72134751081466675f), cl = _mm512_set1_ps(-9.62981494545545e-09f);
    __m512 h = _mm512_mul_ps(x, x), l = _mm512_fmsub_ps(x, x, h);
    __m512 a = _mm512_mul_ps(h, ch);
    __m512 lo = _mm512_add_ps(_mm512_fmsub_ps(h, ch, a), _mm512_fmadd_ps(l, ch, _mm512_mul_ps(h, cl)));
    return _mm512_mul_ps(exp2_core_ps(a), _mm512_fmadd_ps(lo, _mm512_set1_ps(0.69314718055994530942f), _mm512_set1_ps(1.0f)));
}

/* Phi(x), the standard normal distribution function; 1 / (1 + z / 2) by
 * the reciprocal estimate and one Newton step (relative error ~1e-7, a
 * division's is 0.6e-7). */
static inline __m512 phi_ps(__m512 x) {
    const __m512 half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f);
    const __m512 big = _mm512_set1_ps(6.0f * 1.41421356237309504880f);
    __m512 xc = _mm512_min_ps(_mm512_abs_ps(x), big);
    __m512 zc = _mm512_mul_ps(xc, _mm512_set1_ps(0.70710678118654752440f));
    __m512 d = _mm512_fmadd_ps(zc, half, one), r = _mm512_rcp14_ps(d);
    __m512 t = _mm512_mul_ps(r, _mm512_fnmadd_ps(d, r, _mm512_set1_ps(2.0f)));
    /* P / 2 (each coefficient halved, exactly): erfc(z) / 2 with no
     * multiplication by one half, the same bits */
    __m512 q = _mm512_set1_ps(0.5f * 3.974774480e-02f);
    q = FMA_C(q, t, 0.5f * -2.805910110e-01f);
    q = FMA_C(q, t, 0.5f * 8.235822916e-01f);
    q = FMA_C(q, t, 0.5f * -1.239815116e+00f);
    q = FMA_C(q, t, 0.5f * 9.447966814e-01f);
    q = FMA_C(q, t, 0.5f * -4.177131951e-01f);
    q = FMA_C(q, t, 0.5f * 3.564386070e-01f);
    q = FMA_C(q, t, 0.5f * 2.030815035e-01f);
    q = FMA_C(q, t, 0.5f * 2.889880240e-01f);
    q = FMA_C(q, t, 0.5f * 2.814583182e-01f);
    q = FMA_C(q, t, 0.5f * 2.614825462e-05f);
    __m512 lower = _mm512_mul_ps(exp_neg_half_sq_ps(xc), q);
    /* Phi(x) = erfc(z) / 2 for x < 0, 1 - erfc(z) / 2 otherwise */
    __mmask16 neg = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
    return _mm512_mask_blend_ps(neg, _mm512_sub_ps(one, lower), lower);
}

/* x / (1 + exp(-2 u)), u = sqrt(2/pi) (x + 0.044715 x^3): the tanh form
 * without its cancellation near u = 0 (0.5 (1 + tanh u) = 1 / (1 + e^-2u)),
 * the exponent in double. */
static inline __m512 gelu_tanh_ps(__m512 x) {
    const __m512d k = _mm512_set1_pd(-2.0 * 0.79788456080286535588 * 1.44269504088896340736);
    const __m512d c = _mm512_set1_pd(0.044715);
    __m512d x0 = lo8(x), x1 = hi8(x);
    __m512d a0 = _mm512_mul_pd(k, _mm512_fmadd_pd(_mm512_mul_pd(_mm512_mul_pd(x0, x0), x0), c, x0));
    __m512d a1 = _mm512_mul_pd(k, _mm512_fmadd_pd(_mm512_mul_pd(_mm512_mul_pd(x1, x1), x1), c, x1));
    return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), exp2_split_ps(a0, a1)));
}

static inline __m512 act_ps(__m512 x, int act) {
    switch (act) {
    case QKV_NN_ACT_GELU: return _mm512_mul_ps(x, phi_ps(x));
    case QKV_NN_ACT_GELU_TANH: return gelu_tanh_ps(x);
    case QKV_NN_ACT_RELU:
        return _mm512_mask_mov_ps(x, _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ), _mm512_setzero_ps());
    default: return x;
    }
}

static void bias_act_row(float *y, const float *bias, size_t n, int act) {
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        __m512 x = _mm512_maskz_loadu_ps(m, y + i);
        if (bias) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(m, bias + i));
        _mm512_mask_storeu_ps(y + i, m, act_ps(x, act));
    }
}

static void bias_act_avx512(float *y, size_t ldy, size_t rows, const float *bias, size_t n, int act) {
    for (size_t r = 0; r < rows; r++, y += ldy) bias_act_row(y, bias, n, act);
}

/* Sums in 16 float lanes (rows of a few hundred to a few thousand), the
 * variance from the centred values. */
static void add_layernorm_avx512(float *x, const float *res, const float *g, const float *b, size_t n, float eps) {
    __m512 s = _mm512_setzero_ps();
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        if (res) {
            v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, res + i));
            _mm512_mask_storeu_ps(x + i, m, v);
        }
        s = _mm512_add_ps(s, v);
    }
    /* The mean in float is off by a few units of its last place; the second
     * pass sums the offsets from it too and corrects both the centre and
     * the variance (sum d^2 / n - (sum d / n)^2), so rows whose mean is far
     * from 0 against their spread lose nothing. */
    const float c0 = _mm512_reduce_add_ps(s) / (float)n;
    const __m512 vc = _mm512_set1_ps(c0);
    __m512 sd = _mm512_setzero_ps(), sq = _mm512_setzero_ps();
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        __m512 d = _mm512_maskz_sub_ps(m, _mm512_maskz_loadu_ps(m, x + i), vc);
        sd = _mm512_add_ps(sd, d);
        sq = _mm512_fmadd_ps(d, d, sq);
    }
    const float delta = _mm512_reduce_add_ps(sd) / (float)n;
    float var = _mm512_reduce_add_ps(sq) / (float)n - delta * delta;
    if (var < 0.0f) var = 0.0f;
    const __m512 rs = _mm512_set1_ps(1.0f / sqrtf(var + eps)), vd = _mm512_set1_ps(delta);
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        __m512 d = _mm512_mul_ps(_mm512_sub_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), vc), vd), rs);
        __m512 o = _mm512_fmadd_ps(d, _mm512_maskz_loadu_ps(m, g + i), _mm512_maskz_loadu_ps(m, b + i));
        _mm512_mask_storeu_ps(x + i, m, o);
    }
}

/* qkv_nn_gelu_eval (kernels/nn.h) sixteen lanes at a time: the same IEEE
 * single operations in the same order, no FMA (the file is compiled with
 * -mfma, but intrinsics are not contracted), so the results are bitwise
 * those of the scalar definition. */
#define V1(c) _mm512_set1_ps(c)
#define ADD _mm512_add_ps
#define MUL _mm512_mul_ps
static inline __m512 gelu_eval_ps(__m512 x, __m512 *grad) {
    const __m512i xb = _mm512_castps_si512(x);
    __m512 a = MUL(_mm512_castsi512_ps(_mm512_and_si512(xb, _mm512_set1_epi32(0x7fffffff))), V1(0.70710678f));
    /* min over the bit patterns, as the scalar form does (a NaN's bits are above 87's) */
    __m512 a2 = _mm512_castsi512_ps(_mm512_min_epu32(_mm512_castps_si512(MUL(a, a)), _mm512_castps_si512(V1(87.0f))));
    __m512 y = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(a2), _mm512_set1_epi32((int)0x80000000u)));
    __m512 fn = _mm512_sub_ps(ADD(MUL(y, V1(1.44269504f)), V1(12582912.0f)), V1(12582912.0f));
    __m512 r = _mm512_sub_ps(_mm512_sub_ps(y, MUL(fn, V1(0.693359375f))), MUL(fn, V1(-2.12194440e-4f)));
    __m512 e = ADD(V1(1.3888889e-3f), MUL(r, V1(1.9841270e-4f)));
    e = ADD(V1(8.3333338e-3f), MUL(r, e));
    e = ADD(V1(4.1666668e-2f), MUL(r, e));
    e = ADD(V1(1.6666667e-1f), MUL(r, e));
    e = ADD(V1(0.5f), MUL(r, e));
    e = ADD(V1(1.0f), MUL(r, e));
    e = ADD(V1(1.0f), MUL(r, e));
    __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(fn), _mm512_set1_epi32(127)), 23);
    e = MUL(e, _mm512_castsi512_ps(bits));
    __m512 t = _mm512_div_ps(V1(1.0f), ADD(V1(1.0f), MUL(V1(0.3275911f), a)));
    __m512 p = ADD(V1(-1.453152027f), MUL(t, V1(1.061405429f)));
    p = ADD(V1(1.421413741f), MUL(t, p));
    p = ADD(V1(-0.284496736f), MUL(t, p));
    p = ADD(V1(0.254829592f), MUL(t, p));
    __m512 erfc_a = MUL(MUL(t, p), e);
    __m512 lo = MUL(V1(0.5f), erfc_a), hi = _mm512_sub_ps(V1(1.0f), lo);
    __m512 cdf = _mm512_mask_blend_ps(_mm512_test_epi32_mask(xb, _mm512_set1_epi32((int)0x80000000u)), hi, lo);
    *grad = ADD(cdf, MUL(x, MUL(e, V1(0.39894228f))));
    return MUL(x, cdf);
}
#undef V1
#undef ADD
#undef MUL

static void gelu_grad_avx512(float *act, float *pre, size_t n, int keep_grad) {
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        __m512 g, x = _mm512_maskz_loadu_ps(m, pre + i);
        _mm512_mask_storeu_ps(act + i, m, gelu_eval_ps(x, &g));
        if (keep_grad) _mm512_mask_storeu_ps(pre + i, m, g);
    }
}

/* The training LayerNorm (kernels/nn.h): eight doubles per vector, lane l
 * of the accumulator holding exactly the generic's partial sum s[l] (the
 * elements i = l mod 8 in order; masked tails add +0, which leaves a sum
 * started from +0 as it is), reduced in qkv_nn_sum8's order, no FMA. */
static inline __mmask8 tail8(size_t rem) { return rem >= 8 ? (__mmask8)0xFF : (__mmask8)((1u << rem) - 1u); }

static inline __m512d load8(__mmask8 m, const float *p) { return _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, p)); }

static inline double sum8_pd(__m512d v) {
    __m256d h = _mm256_add_pd(_mm512_castpd512_pd256(v), _mm512_extractf64x4_pd(v, 1)); /* s_l + s_l+4 */
    __m128d q = _mm_add_pd(_mm256_castpd256_pd128(h), _mm256_extractf128_pd(h, 1));    /* (0+4)+(2+6), (1+5)+(3+7) */
    return _mm_cvtsd_f64(_mm_add_sd(q, _mm_unpackhi_pd(q, q)));
}

static void ln_forward_avx512(const float *x, const float *g, const float *b, size_t n, double eps, float *y,
                              float *mean, float *rstd) {
    __m512d s = _mm512_setzero_pd();
    for (size_t i = 0; i < n; i += 8) s = _mm512_add_pd(s, load8(tail8(n - i), x + i));
    const double mu = sum8_pd(s) / (double)n;
    const __m512d vmu = _mm512_set1_pd(mu);
    s = _mm512_setzero_pd();
    for (size_t i = 0; i < n; i += 8) {
        const __mmask8 m = tail8(n - i);
        const __m512d d = _mm512_maskz_sub_pd(m, load8(m, x + i), vmu);
        s = _mm512_add_pd(s, _mm512_mul_pd(d, d));
    }
    const double rs = 1.0 / sqrt(sum8_pd(s) / (double)n + eps);
    const __m512d vrs = _mm512_set1_pd(rs);
    for (size_t i = 0; i < n; i += 8) {
        const __mmask8 m = tail8(n - i);
        __m512d v = _mm512_mul_pd(_mm512_sub_pd(load8(m, x + i), vmu), vrs);
        v = _mm512_add_pd(_mm512_mul_pd(v, load8(m, g + i)), load8(m, b + i));
        _mm256_mask_storeu_ps(y + i, m, _mm512_cvtpd_ps(v));
    }
    *mean = (float)mu;
    *rstd = (float)rs;
}

static void ln_backward_row_avx512(const float *x, const float *g, float mean, float rstd, const float *dy, size_t n,
                                   float *dx, int accumulate) {
    const __m512d vm = _mm512_set1_pd((double)mean), vr = _mm512_set1_pd((double)rstd);
    __m512d sa = _mm512_setzero_pd(), sb = _mm512_setzero_pd();
    for (size_t i = 0; i < n; i += 8) {
        const __mmask8 m = tail8(n - i);
        const __m512d xh = _mm512_mul_pd(_mm512_sub_pd(load8(m, x + i), vm), vr);
        const __m512d gh = _mm512_mul_pd(load8(m, dy + i), load8(m, g + i)); /* 0 in the tail */
        sa = _mm512_add_pd(sa, gh);
        sb = _mm512_add_pd(sb, _mm512_mul_pd(gh, xh));
    }
    const __m512d A = _mm512_set1_pd(sum8_pd(sa) / (double)n), B = _mm512_set1_pd(sum8_pd(sb) / (double)n);
    for (size_t i = 0; i < n; i += 8) {
        const __mmask8 m = tail8(n - i);
        const __m512d xh = _mm512_mul_pd(_mm512_sub_pd(load8(m, x + i), vm), vr);
        const __m512d gh = _mm512_mul_pd(load8(m, dy + i), load8(m, g + i));
        __m256 v = _mm512_cvtpd_ps(_mm512_mul_pd(vr, _mm512_sub_pd(_mm512_sub_pd(gh, A), _mm512_mul_pd(xh, B))));
        if (accumulate) v = _mm256_add_ps(_mm256_maskz_loadu_ps(m, dx + i), v);
        _mm256_mask_storeu_ps(dx + i, m, v);
    }
}

/* Columns in blocks of 32 (dg and db of the block in registers over all
 * the rows), 8 at a time in the last block. */
static void ln_grad_cols_avx512(const float *x, const float *dy, const float *mean, const float *rstd, size_t rows,
                                size_t ld, size_t n, float *dg, float *db) {
    size_t i0 = 0;
    for (; i0 + 32 <= n; i0 += 32) {
        __m256 g0 = _mm256_loadu_ps(dg + i0), g1 = _mm256_loadu_ps(dg + i0 + 8), g2 = _mm256_loadu_ps(dg + i0 + 16),
               g3 = _mm256_loadu_ps(dg + i0 + 24);
        __m256 b0 = _mm256_loadu_ps(db + i0), b1 = _mm256_loadu_ps(db + i0 + 8), b2 = _mm256_loadu_ps(db + i0 + 16),
               b3 = _mm256_loadu_ps(db + i0 + 24);
        for (size_t r = 0; r < rows; r++) {
            const float *xr = x + r * ld + i0, *dr = dy + r * ld + i0;
            const __m512d vm = _mm512_set1_pd((double)mean[r]), vr = _mm512_set1_pd((double)rstd[r]);
#define COL(k, G, Bv)                                                                                           \
    {                                                                                                           \
        const __m256 d8 = _mm256_loadu_ps(dr + 8 * (k));                                                        \
        const __m512d xh = _mm512_mul_pd(_mm512_sub_pd(_mm512_cvtps_pd(_mm256_loadu_ps(xr + 8 * (k))), vm), vr); \
        G = _mm256_add_ps(G, _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_cvtps_pd(d8), xh)));                          \
        Bv = _mm256_add_ps(Bv, d8);                                                                             \
    }
            COL(0, g0, b0) COL(1, g1, b1) COL(2, g2, b2) COL(3, g3, b3)
#undef COL
        }
        _mm256_storeu_ps(dg + i0, g0); _mm256_storeu_ps(dg + i0 + 8, g1);
        _mm256_storeu_ps(dg + i0 + 16, g2); _mm256_storeu_ps(dg + i0 + 24, g3);
        _mm256_storeu_ps(db + i0, b0); _mm256_storeu_ps(db + i0 + 8, b1);
        _mm256_storeu_ps(db + i0 + 16, b2); _mm256_storeu_ps(db + i0 + 24, b3);
    }
    for (; i0 < n; i0 += 8) {
        const __mmask8 m = tail8(n - i0);
        __m256 G = _mm256_maskz_loadu_ps(m, dg + i0), Bv = _mm256_maskz_loadu_ps(m, db + i0);
        for (size_t r = 0; r < rows; r++) {
            const __m256 d8 = _mm256_maskz_loadu_ps(m, dy + r * ld + i0);
            const __m512d xh = _mm512_mul_pd(
                _mm512_sub_pd(load8(m, x + r * ld + i0), _mm512_set1_pd((double)mean[r])), _mm512_set1_pd((double)rstd[r]));
            G = _mm256_add_ps(G, _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_cvtps_pd(d8), xh)));
            Bv = _mm256_add_ps(Bv, d8);
        }
        _mm256_mask_storeu_ps(dg + i0, m, G);
        _mm256_mask_storeu_ps(db + i0, m, Bv);
    }
}

/* 64 columns (four vectors) in registers over all the rows, then 16 at a time. */
static void col_sums_avx512(float *db, const float *x, size_t rows, size_t ld, size_t n) {
    size_t i0 = 0;
    for (; i0 + 64 <= n; i0 += 64) {
        __m512 s0 = _mm512_loadu_ps(db + i0), s1 = _mm512_loadu_ps(db + i0 + 16), s2 = _mm512_loadu_ps(db + i0 + 32),
               s3 = _mm512_loadu_ps(db + i0 + 48);
        for (size_t r = 0; r < rows; r++) {
            const float *xr = x + r * ld + i0;
            s0 = _mm512_add_ps(s0, _mm512_loadu_ps(xr));
            s1 = _mm512_add_ps(s1, _mm512_loadu_ps(xr + 16));
            s2 = _mm512_add_ps(s2, _mm512_loadu_ps(xr + 32));
            s3 = _mm512_add_ps(s3, _mm512_loadu_ps(xr + 48));
        }
        _mm512_storeu_ps(db + i0, s0);
        _mm512_storeu_ps(db + i0 + 16, s1);
        _mm512_storeu_ps(db + i0 + 32, s2);
        _mm512_storeu_ps(db + i0 + 48, s3);
    }
    for (; i0 < n; i0 += 16) {
        const __mmask16 m = tail_mask(n - i0);
        __m512 s = _mm512_maskz_loadu_ps(m, db + i0);
        for (size_t r = 0; r < rows; r++) s = _mm512_add_ps(s, _mm512_maskz_loadu_ps(m, x + r * ld + i0));
        _mm512_mask_storeu_ps(db + i0, m, s);
    }
}

void qkv_nn_init_avx512(qkv_nn_kernels *k) {
    *k = (qkv_nn_kernels){"avx512",          bias_act_avx512,        add_layernorm_avx512, gelu_grad_avx512,
                          ln_forward_avx512, ln_backward_row_avx512, ln_grad_cols_avx512, col_sums_avx512};
}
