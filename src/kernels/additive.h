/* The additive (Bahdanau / MLP) score's kernels (internal), used by
 * src/attn/fast_additive.c: s = w . tanh(u + v') for 16 keys at a time,
 * and its chain rule. Written once, in portable C with GNU vector
 * extensions (kernels/additive_impl.h), and compiled per ISA from
 * kernels/<isa>/additive.c with that folder's flags, so each ISA gets its
 * native vector width; the table is the `add` family of the kernel sets
 * (kernels/kernels.h: qkv_additive_kernels_active()).
 *
 * Layout: a block of keys is "key-major per feature": vt[a * ldv + c] is
 * feature a of key c (a < A, c < 16), i.e. V' = W2 K stored transposed, so
 * that every operation runs across 16 keys in vector lanes whatever A is.
 * t, du and dw are [A][16] blocks (row stride 16). Sums over a run in
 * increasing a, one lane per key: results do not depend on the caller's
 * threading. */
#ifndef QKV_KERNELS_ADDITIVE_H
#define QKV_KERNELS_ADDITIVE_H

#include <stddef.h>

#define QKV_ADD_KEYS 16 /* keys per kernel call (one lane each) */

typedef struct qkv_additive_kernels {
    const char *name;
    /* s[c] = sum_{a<A} w[a] * tanh(u[a] + vt[a*ldv + c]) for c < 16; when t
     * is not NULL also t[a*16 + c] = that tanh. Reads vt[a*ldv + c] for
     * a < A, c < 16 only. */
    void (*scores)(const float *u, const float *w, const float *vt, size_t ldv, size_t A, float *s,
                   float *t);
    /* The chain rule through the tanh: with g = ds[c] * w[a] * (1 - t^2)
     * (t = t[a*16 + c]), out[a*ldo + c] += g for a < A, c < 16 (the keys'
     * dV' with ldo its row stride, or a query's per-lane dU with ldo 16)
     * and, when dw is not NULL, dw[a*16 + c] += ds[c] * t (per-lane
     * partial sums; the caller adds the 16 lanes in order). Lanes with
     * ds[c] == 0 add exactly nothing (a masked key's t may be NaN). */
    void (*dscore)(const float *t, const float *w, size_t A, const float *ds, float *out, size_t ldo, float *dw);
    /* out[c] = sum_{d<n} x[d] * yt[d*ldy + c] for c < 16 (dot products of x
     * with 16 key-major columns, d increasing). */
    void (*dots)(const float *x, const float *yt, size_t ldy, size_t n, float *out);
    /* acc[d*lda + c] += x[d] * p[c] for d < n, c < 16 (an outer product). */
    void (*outer)(float *acc, size_t lda, const float *x, size_t n, const float *p);
    /* x[i] = tanh(x[i]) for i < n, float, within a few ulp (m / (m + 2)
     * with m = e^{2|x|} - 1 computed without cancellation, 1 from |x| = 9
     * on; NaN stays NaN). The scores use the same function. */
    void (*tanh_n)(float *x, size_t n);
} qkv_additive_kernels;

void qkv_additive_init_generic(qkv_additive_kernels *k);
void qkv_additive_init_avx2(qkv_additive_kernels *k);
void qkv_additive_init_avx512(qkv_additive_kernels *k);

#endif
