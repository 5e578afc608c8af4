/* Attention dropout inside the kernel: gradients by central differences in
 * double (the mask is regenerated, not stored), the mask is a function of
 * the seed, on average dropout leaves the output unchanged, and the float32
 * and half paths agree with the float64 reference within the suite's
 * tolerance (the fast path's own sweep: test_fast_fwd.c, test_fast_bwd.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

enum { B = 2, NQ = 5, NK = 6, H = 2, D = 3 };

static void setup(qkv_attn_desc *d, qkv_norm norm, qkv_mask mask, double p, uint64_t seed) {
    qkv_attn_desc_init(d);
    d->dtype = QKV_F64;
    d->batch = B;
    d->n_q = NQ;
    d->n_k = NK;
    d->heads = H;
    d->dim = D;
    d->norm = norm;
    d->mask = mask;
    d->dropout = p;
    d->dropout_seed = seed;
}

static double loss(const qkv_attn_desc *d, const double *q, const double *k, const double *v, const double *w) {
    double o[B * NQ * H * D], l = 0;
    if (qkv_attention_forward(d, q, k, v, o, NULL, NULL) != QKV_OK) return NAN;
    for (int i = 0; i < B * NQ * H * D; i++) l += o[i] * w[i];
    return l;
}

static void gradcheck(qkv_norm norm, qkv_mask mask) {
    tu_rng r;
    tu_rng_seed(&r, 21);
    double q[B * NQ * H * D], k[B * NK * H * D], v[B * NK * H * D], w[B * NQ * H * D];
    double dq[B * NQ * H * D], dk[B * NK * H * D], dv[B * NK * H * D];
    tu_fill_normal_f64(&r, q, B * NQ * H * D, 1.0);
    tu_fill_normal_f64(&r, k, B * NK * H * D, 1.0);
    tu_fill_normal_f64(&r, v, B * NK * H * D, 1.0);
    tu_fill_normal_f64(&r, w, B * NQ * H * D, 1.0);
    qkv_attn_desc d;
    setup(&d, norm, mask, 0.3, 77);
    qkv_attn_grads g = {.dq = dq, .dk = dk, .dv = dv};
    CHECK_STATUS(qkv_attention_backward(&d, q, k, v, NULL, NULL, w, &g), QKV_OK);
    double *xs[3] = {q, k, v}, *gs[3] = {dq, dk, dv};
    int ns[3] = {B * NQ * H * D, B * NK * H * D, B * NK * H * D};
    double worst = 0;
    for (int t = 0; t < 3; t++)
        for (int i = 0; i < ns[t]; i++) {
            double keep = xs[t][i], h = 1e-6;
            xs[t][i] = keep + h;
            double lp = loss(&d, q, k, v, w);
            xs[t][i] = keep - h;
            double lm = loss(&d, q, k, v, w);
            xs[t][i] = keep;
            double fd = (lp - lm) / (2 * h);
            worst = fmax(worst, fabs(fd - gs[t][i]) / (1e-6 + fabs(fd)));
        }
    /* relu has a kink at 0: the random inputs keep logits away from it. */
    CHECK(worst < 1e-4, "dropout gradients (norm %d, mask %d): worst relative error %g", norm, mask, worst);
}

static void test_mask_and_mean(void) {
    tu_rng r;
    tu_rng_seed(&r, 4);
    double q[B * NQ * H * D], k[B * NK * H * D], v[B * NK * H * D];
    tu_fill_normal_f64(&r, q, B * NQ * H * D, 1.0);
    tu_fill_normal_f64(&r, k, B * NK * H * D, 1.0);
    tu_fill_normal_f64(&r, v, B * NK * H * D, 1.0);
    qkv_attn_desc d;
    double o0[B * NQ * H * D], o1[B * NQ * H * D], o2[B * NQ * H * D], mean[B * NQ * H * D];
    setup(&d, QKV_NORM_SOFTMAX, QKV_MASK_NONE, 0.0, 0);
    CHECK_STATUS(qkv_attention_forward(&d, q, k, v, o0, NULL, NULL), QKV_OK);
    setup(&d, QKV_NORM_SOFTMAX, QKV_MASK_NONE, 0.25, 5);
    CHECK_STATUS(qkv_attention_forward(&d, q, k, v, o1, NULL, NULL), QKV_OK);
    CHECK_STATUS(qkv_attention_forward(&d, q, k, v, o2, NULL, NULL), QKV_OK);
    CHECK(memcmp(o1, o2, sizeof o1) == 0, "the same seed drops the same weights");
    CHECK(memcmp(o0, o1, sizeof o1) != 0, "dropout changes the output");
    memset(mean, 0, sizeof mean);
    const int S = 4000;
    for (int s = 0; s < S; s++) {
        d.dropout_seed = 1000 + (uint64_t)s;
        qkv_attention_forward(&d, q, k, v, o1, NULL, NULL);
        for (int i = 0; i < B * NQ * H * D; i++) mean[i] += o1[i] / S;
    }
    double e = 0;
    for (int i = 0; i < B * NQ * H * D; i++) e = fmax(e, fabs(mean[i] - o0[i]));
    /* Each output is a mean of 4000 draws with sd <~ 1.5: 5 sd ~ 0.12. */
    CHECK(e < 0.12, "on average dropout leaves the output unchanged: %g", e);
    /* The attention matrix output is A' before dropout. */
    double a0[B * H * NQ * NK], a1[B * H * NQ * NK];
    setup(&d, QKV_NORM_SOFTMAX, QKV_MASK_NONE, 0.0, 0);
    qkv_attention_forward(&d, q, k, v, o0, a0, NULL);
    setup(&d, QKV_NORM_SOFTMAX, QKV_MASK_NONE, 0.5, 9);
    qkv_attention_forward(&d, q, k, v, o1, a1, NULL);
    CHECK(memcmp(a0, a1, sizeof a0) == 0, "attn is the matrix before dropout");
    setup(&d, QKV_NORM_SOFTMAX, QKV_MASK_NONE, 1.0, 0);
    CHECK_STATUS(qkv_attn_desc_check(&d), QKV_ERR_BAD_PARAMETER);
    d.dropout = -0.1;
    CHECK_STATUS(qkv_attn_desc_check(&d), QKV_ERR_BAD_PARAMETER);
    d.dropout = NAN;
    CHECK_STATUS(qkv_attn_desc_check(&d), QKV_ERR_BAD_PARAMETER);
}

/* The float32 paths against the float64 reference, by the tolerance rule of
 * the suite: max|f32 - ref64| <= 2 max|naive32 - ref64| + 1e-5, where
 * naive32 is the plain algorithm in float with the same dropped entries.
 * Both runs see the same (float) inputs; AUTO takes the fast path, which
 * drops in-kernel, and gives FAST's bits. The dropped entries are read from the
 * library: with V the identity over the keys (D_v = n_k) the output row is
 * row i of A' with dropout applied, which is 0 exactly where j is dropped. */
static void test_float_paths(void) {
    enum { NQD = NQ * H * D, NKD = NK * H * D };
    const double p = 0.5;
    tu_rng r;
    tu_rng_seed(&r, 31);
    double q[B * NQD], k[B * NKD], v[B * NKD], o64[B * NQD], eye[B * NK * H * NK], kept[B * NQ * H * NK];
    float qf[B * NQD], kf[B * NKD], vf[B * NKD], of[B * NQD];
    tu_fill_normal_f64(&r, q, B * NQD, 1.0);
    tu_fill_normal_f64(&r, k, B * NKD, 1.0);
    tu_fill_normal_f64(&r, v, B * NKD, 1.0);
    for (int i = 0; i < B * NQD; i++) q[i] = qf[i] = (float)q[i];
    for (int i = 0; i < B * NKD; i++) k[i] = kf[i] = (float)k[i], v[i] = vf[i] = (float)v[i];
    qkv_attn_desc d;
    setup(&d, QKV_NORM_SOFTMAX, QKV_MASK_CAUSAL, p, 12345);
    CHECK_STATUS(qkv_attention_forward(&d, q, k, v, o64, NULL, NULL), QKV_OK);
    /* which entries the seed drops: V = I over the keys */
    for (int b = 0; b < B; b++)
        for (int j = 0; j < NK; j++)
            for (int h = 0; h < H; h++)
                for (int c = 0; c < NK; c++) eye[((b * NK + j) * H + h) * NK + c] = c == j;
    qkv_attn_desc de = d;
    de.dim_v = NK;
    CHECK_STATUS(qkv_attention_forward(&de, q, k, eye, kept, NULL, NULL), QKV_OK);
    /* naive32: logits, max, exp, sum, dropout and PV in float */
    double n32[B * NQD];
    const float scale = (float)(1.0 / sqrt((double)D)), keep = (float)(1.0 / (1.0 - p));
    for (int b = 0; b < B; b++)
        for (int i = 0; i < NQ; i++)
            for (int h = 0; h < H; h++) {
                float s[NK], mx = -INFINITY, sum = 0.0f, acc[D] = {0};
                const int hi = i + NK - NQ + 1; /* causal, bottom-right */
                for (int j = 0; j < hi; j++) {
                    float dot = 0.0f;
                    const float *qr = qf + ((b * NQ + i) * H + h) * D, *kr = kf + ((b * NK + j) * H + h) * D;
                    for (int t = 0; t < D; t++) dot += qr[t] * kr[t];
                    s[j] = dot * scale;
                    mx = fmaxf(mx, s[j]);
                }
                for (int j = 0; j < hi; j++) sum += s[j] = expf(s[j] - mx);
                for (int j = 0; j < hi; j++) {
                    float w = kept[((b * NQ + i) * H + h) * NK + j] != 0.0 ? s[j] / sum * keep : 0.0f;
                    for (int t = 0; t < D; t++) acc[t] += w * vf[((b * NK + j) * H + h) * D + t];
                }
                for (int t = 0; t < D; t++) n32[((b * NQ + i) * H + h) * D + t] = acc[t];
            }
    const double e32 = tu_max_abs_diff_f64(n32, o64, B * NQD), tol = 2.0 * e32 + 1e-5;
    int dropped = 0;
    for (int i = 0; i < B * NQ * H * NK; i++) dropped += kept[i] == 0.0;
    CHECK(dropped > B * NQ * H, "the seed drops some visible weights (%d of the entries are 0)", dropped);
    CHECK(e32 < 1e-3, "naive32 with the library's dropped entries is near ref64: %g", e32);
    const qkv_impl impls[3] = {QKV_IMPL_AUTO, QKV_IMPL_REFERENCE, QKV_IMPL_FAST};
    float oauto[B * NQD];
    for (int m = 0; m < 3; m++) {
        qkv_attn_desc f = d;
        f.dtype = QKV_F32;
        f.impl = impls[m];
        CHECK_STATUS(qkv_attention_forward(&f, qf, kf, vf, of, NULL, NULL), QKV_OK);
        double e = tu_max_abs_diff_f32_f64(of, o64, B * NQD);
        CHECK(e <= tol, "F32 dropout (impl %d) vs F64: %g > 2 * %g + 1e-5 (seed 31)", (int)impls[m], e, e32);
        if (m == 0) memcpy(oauto, of, sizeof oauto);
        if (impls[m] == QKV_IMPL_FAST) CHECK(memcmp(oauto, of, sizeof of) == 0, "AUTO with dropout is the fast path");
    }
}

/* max over n of |half - ref| - (2^-8 |ref| + 1e-4 max|ref|): > 0 fails.
 * The half result is the float one rounded (2^-9 relative for bf16, less
 * for fp16), and the float one is within ~1e-6 of the reference; a wrong
 * dropped entry moves an output by a whole weight (~1e-2 here). */
static double half_excess(qkv_dtype dt, const uint16_t *h, const double *ref, int64_t n) {
    double big = 0.0, worst = -INFINITY;
    for (int64_t i = 0; i < n; i++) big = fmax(big, fabs(ref[i]));
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)tu_half_to_f32(dt, h[i]) - ref[i]) - (0x1p-8 * fabs(ref[i]) + 1e-4 * big);
        worst = fmax(worst, isnan(e) ? INFINITY : e);
    }
    return worst;
}

/* bf16 and fp16 with dropout: widened to float, the float32 fast path (the
 * bf16 kernels do not drop), rounded back: forward and backward against the
 * reference in double on the same (half) values, causal, GQA, n_q != n_k. */
static void test_half_paths(void) {
    enum { HB = 2, HQ = 70, HK = 90, HH = 4, HKV = 2, HD = 16 };
    const qkv_dtype dts[2] = {QKV_BF16, QKV_F16};
    for (int t = 0; t < 2; t++) {
        const qkv_dtype dt = dts[t];
        const int64_t nq = HB * HQ * HH * HD, nk = HB * HK * HKV * HD;
        tu_rng r;
        tu_rng_seed(&r, 60 + (uint64_t)t);
        double *qd, *kd, *vd, *dod;
        uint16_t *q = tu_half_random(&r, dt, nq, 1.0, &qd), *k = tu_half_random(&r, dt, nk, 1.0, &kd);
        uint16_t *v = tu_half_random(&r, dt, nk, 1.0, &vd), *dout = tu_half_random(&r, dt, nq, 1.0, &dod);
        qkv_attn_desc d;
        qkv_attn_desc_init(&d);
        d.batch = HB, d.n_q = HQ, d.n_k = HK, d.heads = HH, d.heads_kv = HKV, d.dim = HD;
        d.mask = QKV_MASK_CAUSAL;
        d.dropout = 0.3;
        d.dropout_seed = 4242;
        qkv_attn_desc d64 = d;
        d64.dtype = QKV_F64;
        d64.impl = QKV_IMPL_REFERENCE;
        d.dtype = dt;
        double *ro = malloc((size_t)nq * sizeof(double)), *rq = malloc((size_t)nq * sizeof(double));
        double *rk = malloc((size_t)nk * sizeof(double)), *rv = malloc((size_t)nk * sizeof(double));
        uint16_t *ho = malloc((size_t)nq * 2), *hq = malloc((size_t)nq * 2), *hk = malloc((size_t)nk * 2),
                 *hv = malloc((size_t)nk * 2);
        qkv_attn_grads g64 = {.dq = rq, .dk = rk, .dv = rv}, gh = {.dq = hq, .dk = hk, .dv = hv};
        CHECK_STATUS(qkv_attention_forward(&d64, qd, kd, vd, ro, NULL, NULL), QKV_OK);
        CHECK_STATUS(qkv_attention_backward(&d64, qd, kd, vd, NULL, NULL, dod, &g64), QKV_OK);
        CHECK_STATUS(qkv_attention_forward(&d, q, k, v, ho, NULL, NULL), QKV_OK);
        CHECK_STATUS(qkv_attention_backward(&d, q, k, v, NULL, NULL, dout, &gh), QKV_OK);
        const char *name = t ? "fp16" : "bf16";
        double e;
        CHECK((e = half_excess(dt, ho, ro, nq)) <= 0, "%s dropout out off by %g beyond the bound", name, e);
        CHECK((e = half_excess(dt, hq, rq, nq)) <= 0, "%s dropout dq off by %g beyond the bound", name, e);
        CHECK((e = half_excess(dt, hk, rk, nk)) <= 0, "%s dropout dk off by %g beyond the bound", name, e);
        CHECK((e = half_excess(dt, hv, rv, nk)) <= 0, "%s dropout dv off by %g beyond the bound", name, e);
        free(q); free(k); free(v); free(dout); free(qd); free(kd); free(vd); free(dod);
        free(ro); free(rq); free(rk); free(rv); free(ho); free(hq); free(hk); free(hv);
    }
}

int main(void) {
    gradcheck(QKV_NORM_SOFTMAX, QKV_MASK_NONE);
    gradcheck(QKV_NORM_SOFTMAX, QKV_MASK_CAUSAL);
    gradcheck(QKV_NORM_SIGMOID, QKV_MASK_NONE);
    gradcheck(QKV_NORM_RELU, QKV_MASK_CAUSAL);
    test_mask_and_mean();
    test_float_paths();
    test_half_paths();
    return tu_finish();
}
