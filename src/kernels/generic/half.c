/* Portable bf16 kernels: plain C loops over the contract in kernels/half.h,
 * in the order of the AVX512-BF16 instruction (per pair, the high product
 * then the low one added into the float sum; each product of two bf16 is
 * exact in float). The fast bf16 paths do not run on them (`native` = 0):
 * they state the contract and are what the kernel tests compare with. */
#include <math.h>
#include <string.h>

#include "core/half.h"
#include "kernels/half.h"

static float lo_of(uint32_t w) { return qkv_bf16_to_f32((uint16_t)(w & 0xffffu)); }
static float hi_of(uint32_t w) { return qkv_bf16_to_f32((uint16_t)(w >> 16)); }

static float dot_pair(float acc, uint32_t a, uint32_t b) {
    acc += hi_of(a) * hi_of(b);
    acc += lo_of(a) * lo_of(b);
    return acc;
}

static void qk_tile(const uint32_t *qp, size_t ldq, const uint32_t *kp, size_t dp2, size_t rows,
                    size_t npanels, float *s, size_t lds, int acc) {
    for (size_t p = 0; p < npanels; p++) {
        const uint32_t *kpp = kp + p * dp2 * 32;
        for (size_t r = 0; r < rows; r++)
            for (size_t c = 0; c < 32; c++) {
                float *d = s + r * lds + p * 32 + c, x = acc ? *d : 0.0f;
                for (size_t t = 0; t < dp2; t++) x = dot_pair(x, qp[r * ldq + t], kpp[t * 32 + c]);
                *d = x;
            }
    }
}

static void qk_generic(const uint32_t *qp, size_t ldq, const uint32_t *kp, size_t dp2, size_t rows,
                       size_t npanels, float *s, size_t lds) {
    qk_tile(qp, ldq, kp, dp2, rows, npanels, s, lds, 0);
}

static void qk_acc_generic(const uint32_t *qp, size_t ldq, const uint32_t *kp, size_t dp2, size_t rows,
                           size_t npanels, float *s, size_t lds) {
    qk_tile(qp, ldq, kp, dp2, rows, npanels, s, lds, 1);
}

static void pv_generic(float *o, size_t ldo, const uint32_t *pp, size_t ldp, const uint32_t *vp, size_t ldv,
                       size_t u0, size_t u1, size_t dvp, size_t rows) {
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < dvp; c++) {
            float x = o[r * ldo + c];
            for (size_t u = u0; u < u1; u++) x = dot_pair(x, pp[r * ldp + u], vp[u * ldv + c]);
            o[r * ldo + c] = x;
        }
}

static void pv_acc_generic(float *o, size_t ldo, const uint32_t *pp, size_t ldp, const uint32_t *vp,
                           size_t ldv, size_t nu, size_t dvp, size_t rows) {
    pv_generic(o, ldo, pp, ldp, vp, ldv, 0, nu, dvp, rows);
}

static uint32_t pair_of(float lo, float hi) {
    return (uint32_t)qkv_f32_to_bf16(lo) | ((uint32_t)qkv_f32_to_bf16(hi) << 16);
}

static void pack_p_generic(uint32_t *pp, size_t ldp, const float *p, size_t lds, size_t rows, size_t npairs) {
    for (size_t r = 0; r < rows; r++)
        for (size_t u = 0; u < npairs; u++) pp[r * ldp + u] = pair_of(p[r * lds + 2 * u], p[r * lds + 2 * u + 1]);
}

static float exp2_flush(float x) { return x < -126.0f ? 0.0f : exp2f(x); } /* -inf: 0, NaN stays */

static void softmax_pack_generic(const float *s, size_t lds, size_t rows, size_t cols, float cm, float *m,
                                 float *l, float *o, size_t ldo, size_t dvp, uint32_t *pp, size_t ldp) {
    for (size_t r = 0; r < rows; r++) {
        const float *row = s + r * lds;
        float mt = -INFINITY;
        for (size_t c = 0; c < cols; c++) mt = row[c] > mt ? row[c] : mt;
        float mn = m[r] > mt ? m[r] : mt, a = 1.0f, base = 0.0f;
        if (mn != -INFINITY) {
            base = mn;
            a = exp2_flush((m[r] - mn) * cm);
        }
        float sum = 0.0f;
        for (size_t u = 0; 2 * u < cols; u++) {
            float e0 = exp2_flush((row[2 * u] - base) * cm);
            float e1 = 2 * u + 1 < cols ? exp2_flush((row[2 * u + 1] - base) * cm) : 0.0f;
            sum += e0;
            sum += e1;
            pp[r * ldp + u] = pair_of(e0, e1);
        }
        l[r] = l[r] * a + sum;
        m[r] = mn;
        for (size_t c = 0; c < dvp; c++) o[r * ldo + c] *= a;
    }
}

static void bwd_softmax_generic(float *s, float *dp, size_t ld, size_t rows, size_t cols, float cm,
                                const float *L2, const float *Dd) {
    for (size_t r = 0; r < rows; r++) {
        float *sr = s + r * ld, *dr = dp + r * ld;
        for (size_t c = 0; c < cols; c++) {
            float e = (float)((double)cm * sr[c] - L2[c]); /* exact product, as an fma */
            if (e > 0.0f) e = 0.0f;                        /* NaN stays */
            float p = e < -126.0f ? 0.0f : exp2f(e);       /* no subnormals; -inf gives 0 */
            sr[c] = p;
            dr[c] = p == 0.0f ? 0.0f : p * (dr[c] - Dd[c]);
        }
    }
}

static void pack_rowpairs_generic(uint32_t *kp, const float *x, size_t ldx, size_t npairs, size_t npanels) {
    for (size_t p = 0; p < npanels; p++)
        for (size_t u = 0; u < npairs; u++)
            for (size_t c = 0; c < 32; c++)
                kp[(p * npairs + u) * 32 + c] = pair_of(x[2 * u * ldx + 32 * p + c], x[(2 * u + 1) * ldx + 32 * p + c]);
}

static void words_t_generic(uint32_t *dst, size_t ldd, const void *src, size_t lds, size_t rows, size_t cols) {
    const unsigned char *s = src;
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++) memcpy(dst + c * ldd + r, s + 4 * (r * lds + c), 4);
}

static void interleave_generic(uint32_t *dst, const uint16_t *a, const uint16_t *b, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = (uint32_t)a[i] | (b ? (uint32_t)b[i] << 16 : 0u);
}

static void dq_out_generic(uint16_t *dst, size_t ldd, const float *src, size_t lds, size_t cstride, size_t chunks,
                           size_t rows, size_t cols, double scale) {
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++) {
            float acc = src[r * lds + c];
            for (size_t ch = 1; ch < chunks; ch++) acc += src[ch * cstride + r * lds + c];
            dst[c * ldd + r] = qkv_f32_to_bf16((float)(acc * scale));
        }
}

QKV_HALF_DEFINE_INIT(generic, 0)
