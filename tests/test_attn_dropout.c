/* Attention dropout inside the kernel: gradients by central differences in
 * double (the mask is regenerated, not stored), the mask is a function of
 * the seed, on average dropout leaves the output unchanged, and the float32
 * paths agree with the float64 reference within the suite's tolerance. */
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
 * Both runs see the same (float) inputs. The fast kernels do not compute
 * dropout: AUTO takes the reference, FAST must say so (or, once it has
 * dropout, pass the same bound). The dropped entries are read from the
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
    for (int m = 0; m < 3; m++) {
        qkv_attn_desc f = d;
        f.dtype = QKV_F32;
        f.impl = impls[m];
        qkv_status st = qkv_attention_forward(&f, qf, kf, vf, of, NULL, NULL);
        if (impls[m] == QKV_IMPL_FAST && st == QKV_ERR_UNSUPPORTED) continue;
        CHECK_STATUS(st, QKV_OK);
        double e = tu_max_abs_diff_f32_f64(of, o64, B * NQD);
        CHECK(e <= tol, "F32 dropout (impl %d) vs F64: %g > 2 * %g + 1e-5 (seed 31)", (int)impls[m], e, e32);
    }
}

int main(void) {
    gradcheck(QKV_NORM_SOFTMAX, QKV_MASK_NONE);
    gradcheck(QKV_NORM_SOFTMAX, QKV_MASK_CAUSAL);
    gradcheck(QKV_NORM_SIGMOID, QKV_MASK_NONE);
    gradcheck(QKV_NORM_RELU, QKV_MASK_CAUSAL);
    test_mask_and_mean();
    test_float_paths();
    return tu_finish();
}
