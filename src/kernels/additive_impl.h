/* The additive score's kernels (kernels/additive.h), written once. An ISA's
 * file defines ADD_VL (floats per native vector: 4, 8 or 16) and ADD_ISA
 * (its name), then includes this file under its own compiler flags; GNU C
 * vector extensions (gcc, clang) turn every operation on add_vf into that
 * ISA's instructions. Only native widths cross function boundaries, so no
 * ABI question arises. */
#include <stdint.h>
#include <string.h>

#include "kernels/additive.h"

#if !defined(ADD_VL) || !defined(ADD_ISA)
#error "define ADD_VL and ADD_ISA before including kernels/additive_impl.h"
#endif

#define ADD_NV (QKV_ADD_KEYS / ADD_VL) /* vectors per 16 keys */
#define ADD_CAT2(a, b) a##_##b
#define ADD_CAT(a, b) ADD_CAT2(a, b)
#define ADD_FN(name) ADD_CAT(name, ADD_ISA)
#define ADD_STR2(x) #x
#define ADD_STR(x) ADD_STR2(x)

typedef float add_vf __attribute__((vector_size(ADD_VL * sizeof(float))));
typedef int32_t add_vi __attribute__((vector_size(ADD_VL * sizeof(float))));

#if defined(__GNUC__)
#define ADD_INLINE static inline __attribute__((always_inline))
#else
#define ADD_INLINE static inline
#endif

ADD_INLINE add_vf add_load(const float *p) {
    add_vf v;
    memcpy(&v, p, sizeof v);
    return v;
}
ADD_INLINE void add_store(float *p, add_vf v) { memcpy(p, &v, sizeof v); }
ADD_INLINE add_vf add_splat(float x) { return (add_vf){0} + x; }
/* m ? a : b lane by lane (m: all ones or zero, as comparisons give). */
ADD_INLINE add_vf add_sel(add_vi m, add_vf a, add_vf b) { return (add_vf)((m & (add_vi)a) | (~m & (add_vi)b)); }

/* tanh lane by lane, as tanh|x| = m / (m + 2) with m = e^{2|x|} - 1 and
 * the sign restored last (tanh is odd). m without cancellation: with
 * n = round(2|x| / ln 2) and r = 2|x| - n ln 2 (two-part ln 2, |r| <=
 * ln2 / 2), m = 2^n (e^r - 1) + (2^n - 1), e^r - 1 by its Taylor series
 * through r^8 (truncation below 2e-8 relative), 2^n in the exponent
 * field; both terms are exact products or sums of exact values, so small
 * |x| keep full relative accuracy. |x| is clamped to 9 first (tanh rounds
 * to 1 there; n <= 26). NaN propagates. */
ADD_INLINE add_vf add_tanh(add_vf x) {
    const add_vi signbit = (add_vi){0} + INT32_MIN;
    add_vi sign = (add_vi)x & signbit;
    add_vf ax = (add_vf)((add_vi)x ^ sign);
    add_vf y = add_sel(ax > 9.0f, add_splat(9.0f), ax);
    add_vf z = y + y;
    add_vi ni = __builtin_convertvector(z * 1.44269504088896341f + 0.5f, add_vi);
    add_vf n = __builtin_convertvector(ni, add_vf);
    add_vf r = z - n * 0.693145751953125f;
    r = r - n * 1.42860682030941723212e-6f;
    add_vf q = add_splat(1.0f / 40320.0f);
    q = q * r + 1.0f / 5040.0f;
    q = q * r + 1.0f / 720.0f;
    q = q * r + 1.0f / 120.0f;
    q = q * r + 1.0f / 24.0f;
    q = q * r + 1.0f / 6.0f;
    q = q * r + 0.5f;
    q = q * r + 1.0f;
    q = q * r; /* e^r - 1 */
    add_vf two_n = (add_vf)((ni + 127) << 23);
    add_vf m = two_n * q + (two_n - 1.0f);
    add_vf t = m / (m + 2.0f);
    return (add_vf)((add_vi)t | sign);
}

ADD_INLINE void add_scores_body(const float *u, const float *w, const float *vt, size_t ldv, size_t A, float *s,
                                float *t, int keep) {
    add_vf acc[ADD_NV];
    for (int h = 0; h < ADD_NV; h++) acc[h] = add_splat(0.0f);
    for (size_t a = 0; a < A; a++) {
        const float ua = u[a], wa = w[a];
        const float *va = vt + a * ldv;
        for (int h = 0; h < ADD_NV; h++) {
            add_vf th = add_tanh(ua + add_load(va + h * ADD_VL));
            if (keep) add_store(t + a * QKV_ADD_KEYS + h * ADD_VL, th);
            acc[h] += wa * th;
        }
    }
    for (int h = 0; h < ADD_NV; h++) add_store(s + h * ADD_VL, acc[h]);
}

static void ADD_FN(add_scores)(const float *u, const float *w, const float *vt, size_t ldv, size_t A, float *s,
                               float *t) {
    if (t)
        add_scores_body(u, w, vt, ldv, A, s, t, 1);
    else
        add_scores_body(u, w, vt, ldv, A, s, NULL, 0);
}

static void ADD_FN(add_dscore)(const float *t, const float *w, size_t A, const float *ds, float *out, size_t ldo,
                               float *dw) {
    add_vf dsv[ADD_NV];
    add_vi nz[ADD_NV]; /* the lanes that add: dS != 0 */
    for (int h = 0; h < ADD_NV; h++) {
        dsv[h] = add_load(ds + h * ADD_VL);
        nz[h] = dsv[h] != 0.0f;
    }
    const add_vf zero = add_splat(0.0f);
    for (size_t a = 0; a < A; a++) {
        const float wa = w[a];
        for (int h = 0; h < ADD_NV; h++) {
            add_vf th = add_load(t + a * QKV_ADD_KEYS + h * ADD_VL);
            float *o = out + a * ldo + h * ADD_VL;
            add_store(o, add_load(o) + add_sel(nz[h], (dsv[h] * wa) * (1.0f - th * th), zero));
            if (dw) {
                float *e = dw + a * QKV_ADD_KEYS + h * ADD_VL;
                add_store(e, add_load(e) + add_sel(nz[h], dsv[h] * th, zero));
            }
        }
    }
}

static void ADD_FN(add_dots)(const float *x, const float *yt, size_t ldy, size_t n, float *out) {
    add_vf acc[ADD_NV];
    for (int h = 0; h < ADD_NV; h++) acc[h] = add_splat(0.0f);
    for (size_t d = 0; d < n; d++)
        for (int h = 0; h < ADD_NV; h++) acc[h] += x[d] * add_load(yt + d * ldy + h * ADD_VL);
    for (int h = 0; h < ADD_NV; h++) add_store(out + h * ADD_VL, acc[h]);
}

static void ADD_FN(add_outer)(float *acc, size_t lda, const float *x, size_t n, const float *p) {
    add_vf pv[ADD_NV];
    for (int h = 0; h < ADD_NV; h++) pv[h] = add_load(p + h * ADD_VL);
    for (size_t d = 0; d < n; d++)
        for (int h = 0; h < ADD_NV; h++) {
            float *o = acc + d * lda + h * ADD_VL;
            add_store(o, add_load(o) + x[d] * pv[h]);
        }
}

static void ADD_FN(add_tanh_n)(float *x, size_t n) {
    size_t i = 0;
    for (; i + ADD_VL <= n; i += ADD_VL) add_store(x + i, add_tanh(add_load(x + i)));
    if (i < n) {
        float tail[ADD_VL] = {0};
        memcpy(tail, x + i, (n - i) * sizeof(float));
        add_store(tail, add_tanh(add_load(tail)));
        memcpy(x + i, tail, (n - i) * sizeof(float));
    }
}

void ADD_CAT(qkv_additive_init, ADD_ISA)(qkv_additive_kernels *k) {
    k->name = ADD_STR(ADD_ISA);
    k->scores = ADD_FN(add_scores);
    k->dscore = ADD_FN(add_dscore);
    k->dots = ADD_FN(add_dots);
    k->outer = ADD_FN(add_outer);
    k->tanh_n = ADD_FN(add_tanh_n);
}
