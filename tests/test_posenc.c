/* Positional encodings: sinusoidal at any position, RoPE (orthogonal,
 * relative), learned tables, ALiBi slopes, T5 buckets, and the in-kernel
 * ALiBi / relative biases against the same biases materialised as a matrix. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

static void test_sinusoidal(void) {
    const int64_t E = 16;
    float out[3 * 16];
    int64_t offsets[] = {0, 129, 1000000};
    for (int c = 0; c < 3; c++) {
        CHECK_STATUS(qkv_posenc_sinusoidal(3, E, offsets[c], out), QKV_OK);
        double worst = 0.0;
        for (int64_t i = 0; i < 3; i++)
            for (int64_t t = 0; t < E; t++) {
                double pos = (double)(offsets[c] + i);
                double w = pos / pow(10000.0, (double)(t - t % 2) / (double)E);
                double want = t % 2 ? cos(w) : sin(w);
                double e = fabs(want - out[i * E + t]);
                if (e > worst) worst = e;
            }
        /* float rounding of values in [-1, 1]: 6e-8; angles in double. */
        CHECK(worst < 1e-6, "sinusoidal at offset %lld: error %g", (long long)offsets[c], worst);
    }
    CHECK(out[0] == (float)sin(1000000.0), "position 10^6 dim 0");
    float odd[5];
    CHECK_STATUS(qkv_posenc_sinusoidal(1, 5, 2, odd), QKV_OK);
    CHECK(fabs(odd[4] - sin(2.0 / pow(10000.0, 4.0 / 5.0))) < 1e-6, "odd embedding dim, last column");
    CHECK_STATUS(qkv_posenc_sinusoidal(1, 4, 0, NULL), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_posenc_sinusoidal(0, 4, 0, out), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_posenc_sinusoidal(1, 4, -1, out), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_posenc_sinusoidal(INT64_MAX / 2, 4, 0, out), QKV_ERR_SIZE_OVERFLOW);
}

static void test_rope(void) {
    tu_rng r;
    tu_rng_seed(&r, 11);
    enum { B = 2, N = 5, H = 3, D = 8 };
    float x[B * N * H * D], y[B * N * H * D];
    tu_fill_normal_f32(&r, x, B * N * H * D, 1.0);
    memcpy(y, x, sizeof x);
    CHECK_STATUS(qkv_rope_apply(y, B, N, H, D, 7, 10000.0, 0), QKV_OK);
    /* Norms are kept (a rotation) ... */
    for (int row = 0; row < B * N * H; row++) {
        double a = 0, b = 0;
        for (int t = 0; t < D; t++) {
            a += (double)x[row * D + t] * x[row * D + t];
            b += (double)y[row * D + t] * y[row * D + t];
        }
        CHECK(fabs(a - b) < 1e-5 * (1 + a), "rope keeps the norm of row %d", row);
    }
    /* ... position 0 is the identity, and the inverse undoes it. */
    float z[B * N * H * D];
    memcpy(z, x, sizeof x);
    CHECK_STATUS(qkv_rope_apply(z, B, 1, H * N, D, 0, 10000.0, 0), QKV_OK);
    CHECK(memcmp(z, x, sizeof x) == 0, "rope at position 0 is the identity");
    CHECK_STATUS(qkv_rope_apply(y, B, N, H, D, 7, 10000.0, 1), QKV_OK);
    double worst = 0;
    for (int i = 0; i < B * N * H * D; i++) worst = fmax(worst, fabs(y[i] - x[i]));
    CHECK(worst < 1e-5, "inverse rope undoes rope: %g", worst);
    /* q(m).k(n) depends only on m - n: the relative property RoPE exists for. */
    float q[D], k[D], qa[D], ka[D], qb[D], kb[D];
    tu_fill_normal_f32(&r, q, D, 1.0);
    tu_fill_normal_f32(&r, k, D, 1.0);
    memcpy(qa, q, sizeof q);
    memcpy(ka, k, sizeof k);
    memcpy(qb, q, sizeof q);
    memcpy(kb, k, sizeof k);
    qkv_rope_apply(qa, 1, 1, 1, D, 10, 10000.0, 0);
    qkv_rope_apply(ka, 1, 1, 1, D, 3, 10000.0, 0);
    qkv_rope_apply(qb, 1, 1, 1, D, 1010, 10000.0, 0);
    qkv_rope_apply(kb, 1, 1, 1, D, 1003, 10000.0, 0);
    double da = 0, db = 0;
    for (int t = 0; t < D; t++) {
        da += (double)qa[t] * ka[t];
        db += (double)qb[t] * kb[t];
    }
    CHECK(fabs(da - db) < 1e-4, "rope score depends on the offset only: %g vs %g", da, db);
    CHECK_STATUS(qkv_rope_apply(x, 1, 1, 1, 7, 0, 10000.0, 0), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_rope_apply(x, 1, 1, 1, 8, 0, 1.0, 0), QKV_ERR_BAD_PARAMETER);
    CHECK_STATUS(qkv_rope_apply(x, 1, 1, 1, 8, 0, NAN, 0), QKV_ERR_BAD_PARAMETER);
    CHECK_STATUS(qkv_rope_apply(NULL, 1, 1, 1, 8, 0, 10000.0, 0), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_rope_apply(x, 1, 1, 1, 8, -1, 10000.0, 0), QKV_ERR_BAD_SIZE);
}

static void test_learned(void) {
    float table[4 * 3], x[2 * 2 * 3], dtable[4 * 3];
    for (int i = 0; i < 12; i++) table[i] = (float)i;
    memset(x, 0, sizeof x);
    CHECK_STATUS(qkv_posenc_learned_forward(table, 4, 3, 2, 2, 2, x), QKV_OK);
    CHECK(x[0] == 6.0f && x[5] == 11.0f && x[6] == 6.0f, "learned rows 2 and 3 added to both batches");
    memset(dtable, 0, sizeof dtable);
    for (int i = 0; i < 12; i++) x[i] = 1.0f;
    CHECK_STATUS(qkv_posenc_learned_backward(dtable, 4, 3, 2, 2, 2, x), QKV_OK);
    CHECK(dtable[0] == 0.0f && dtable[6] == 2.0f && dtable[11] == 2.0f, "learned gradient summed over batch");
    CHECK_STATUS(qkv_posenc_learned_forward(table, 4, 3, 2, 2, 3, x), QKV_ERR_POSITION);
    CHECK_STATUS(qkv_posenc_learned_forward(table, 4, 3, 1, 5, 0, x), QKV_ERR_POSITION);
    CHECK_STATUS(qkv_posenc_learned_backward(dtable, 4, 3, 1, 1, 4, x), QKV_ERR_POSITION);
    CHECK_STATUS(qkv_posenc_learned_forward(NULL, 4, 3, 1, 1, 0, x), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_posenc_learned_forward(table, 0, 3, 1, 1, 0, x), QKV_ERR_BAD_SIZE);
    CHECK(strstr(qkv_status_string(QKV_ERR_POSITION), "position") != NULL, "position status text");
}

static void test_alibi_slopes(void) {
    float s[12];
    CHECK_STATUS(qkv_alibi_slopes(8, s), QKV_OK);
    for (int h = 0; h < 8; h++) CHECK(s[h] == ldexpf(1.0f, -(h + 1)), "alibi 8 heads: slope %d = 2^-%d", h, h + 1);
    /* 12 heads: the 8-head slopes, then 16-head slopes 1, 3, 5, 7 (0-based odd exponents). */
    CHECK_STATUS(qkv_alibi_slopes(12, s), QKV_OK);
    CHECK(s[7] == ldexpf(1.0f, -8) && fabsf(s[8] - powf(2.0f, -0.5f)) < 1e-7f &&
              fabsf(s[11] - powf(2.0f, -3.5f)) < 1e-7f,
          "alibi 12 heads interpolation: %g %g", s[8], s[11]);
    CHECK_STATUS(qkv_alibi_slopes(0, s), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_alibi_slopes(4, NULL), QKV_ERR_NULL_POINTER);
}

static void test_buckets(void) {
    /* Values of T5's _relative_position_bucket(32 buckets, max distance 128). */
    CHECK(qkv_relpos_bucket(0, 32, 128, 1) == 0, "bidi 0");
    CHECK(qkv_relpos_bucket(-1, 32, 128, 1) == 1, "bidi -1");
    CHECK(qkv_relpos_bucket(1, 32, 128, 1) == 17, "bidi +1");
    CHECK(qkv_relpos_bucket(-7, 32, 128, 1) == 7, "bidi -7 exact");
    CHECK(qkv_relpos_bucket(-8, 32, 128, 1) == 8, "bidi -8 first log bucket");
    CHECK(qkv_relpos_bucket(-20, 32, 128, 1) == 10, "bidi -20 -> 10");
    CHECK(qkv_relpos_bucket(-1000, 32, 128, 1) == 15, "bidi far -> last");
    CHECK(qkv_relpos_bucket(1000, 32, 128, 1) == 31, "bidi far future -> last");
    CHECK(qkv_relpos_bucket(5, 32, 128, 0) == 0, "causal: future is bucket 0");
    CHECK(qkv_relpos_bucket(-15, 32, 128, 0) == 15, "causal: exact up to 15");
    CHECK(qkv_relpos_bucket(-16, 32, 128, 0) == 16, "causal: first log bucket");
    CHECK(qkv_relpos_bucket(-100000, 32, 128, 0) == 31, "causal far");
    CHECK(qkv_relpos_bucket(0, 3, 128, 1) == -1, "bad parameters");
}

/* The in-kernel biases equal the same biases passed as a [H, n_q, n_k] matrix. */
static void test_inkernel_biases(qkv_dtype dt, qkv_impl impl) {
    tu_rng r;
    tu_rng_seed(&r, 5);
    enum { H = 4, NQ = 9, NK = 13, D = 8, BK = 8 };
    double qd[NQ * H * D], kd[NK * H * D], vd[NK * H * D], slopes[H], rel[H * BK], bias[H * NQ * NK];
    tu_fill_normal_f64(&r, qd, NQ * H * D, 1.0);
    tu_fill_normal_f64(&r, kd, NK * H * D, 1.0);
    tu_fill_normal_f64(&r, vd, NK * H * D, 1.0);
    tu_fill_normal_f64(&r, rel, H * BK, 1.0);
    float sf[H];
    qkv_alibi_slopes(H, sf);
    for (int h = 0; h < H; h++) slopes[h] = sf[h];
    for (int kind = 0; kind < 2; kind++)
        for (int mask = 0; mask < 2; mask++) {
            qkv_attn_desc d;
            qkv_attn_desc_init(&d);
            d.batch = 1;
            d.n_q = NQ;
            d.n_k = NK;
            d.heads = H;
            d.dim = D;
            d.mask = mask ? QKV_MASK_CAUSAL : QKV_MASK_NONE;
            int64_t p0 = NK - NQ; /* bottom-right aligned position of query 0 */
            for (int h = 0; h < H; h++)
                for (int i = 0; i < NQ; i++)
                    for (int j = 0; j < NK; j++) {
                        int64_t rr = j - (i + p0);
                        bias[(h * NQ + i) * NK + j] =
                            kind == 0 ? -slopes[h] * (double)llabs(rr)
                                      : rel[h * BK + qkv_relpos_bucket(rr, BK, 6, !mask)];
                    }
            /* Materialised, in double with the reference: the oracle. */
            double want[NQ * H * D], dq_w[NQ * H * D], dk_w[NK * H * D], dv_w[NK * H * D], dout[NQ * H * D];
            double dbias[H * NQ * NK];
            tu_fill_normal_f64(&r, dout, NQ * H * D, 1.0);
            qkv_attn_desc m = d;
            m.dtype = QKV_F64;
            m.impl = QKV_IMPL_REFERENCE;
            m.bias_kind = QKV_BIAS_PER_HEAD;
            m.bias = bias;
            CHECK_STATUS(qkv_attention_forward(&m, qd, kd, vd, want, NULL, NULL), QKV_OK);
            qkv_attn_grads gw = {.dq = dq_w, .dk = dk_w, .dv = dv_w, .dbias = dbias};
            CHECK_STATUS(qkv_attention_backward(&m, qd, kd, vd, NULL, NULL, dout, &gw), QKV_OK);
            double drel_w[H * BK];
            memset(drel_w, 0, sizeof drel_w);
            for (int h = 0; h < H; h++)
                for (int i = 0; i < NQ; i++)
                    for (int j = 0; j < NK; j++)
                        drel_w[h * BK + qkv_relpos_bucket(j - (i + p0), BK, 6, !mask)] += dbias[(h * NQ + i) * NK + j];

            /* In-kernel, in the requested dtype and implementation. */
            d.dtype = dt;
            d.impl = impl;
            float sl32[H], rel32[H * BK];
            for (int i = 0; i < H; i++) sl32[i] = (float)slopes[i];
            for (int i = 0; i < H * BK; i++) rel32[i] = (float)rel[i];
            int f64 = dt == QKV_F64;
            if (kind == 0) d.alibi_slopes = f64 ? (const void *)slopes : (const void *)sl32;
            else {
                d.rel_table = f64 ? (const void *)rel : (const void *)rel32;
                d.rel_buckets = BK;
                d.rel_max_distance = 6;
                d.rel_bidirectional = !mask;
            }
            static float qf[NQ * H * D], kf[NK * H * D], vf[NK * H * D], of[NQ * H * D], doutf[NQ * H * D];
            static float dqf[NQ * H * D], dkf[NK * H * D], dvf[NK * H * D], drelf[H * BK];
            double got[NQ * H * D], dq[NQ * H * D], dk[NK * H * D], dv[NK * H * D], drel[H * BK];
            for (int i = 0; i < NQ * H * D; i++) qf[i] = (float)qd[i], doutf[i] = (float)dout[i];
            for (int i = 0; i < NK * H * D; i++) kf[i] = (float)kd[i], vf[i] = (float)vd[i];
            qkv_attn_grads g = {.dq = f64 ? (void *)dq : (void *)dqf, .dk = f64 ? (void *)dk : (void *)dkf,
                                .dv = f64 ? (void *)dv : (void *)dvf,
                                .d_rel_table = f64 ? (void *)drel : (void *)drelf};
            if (f64) {
                CHECK_STATUS(qkv_attention_forward(&d, qd, kd, vd, got, NULL, NULL), QKV_OK);
                CHECK_STATUS(qkv_attention_backward(&d, qd, kd, vd, NULL, NULL, dout, &g), QKV_OK);
            } else {
                CHECK_STATUS(qkv_attention_forward(&d, qf, kf, vf, of, NULL, NULL), QKV_OK);
                CHECK_STATUS(qkv_attention_backward(&d, qf, kf, vf, NULL, NULL, doutf, &g), QKV_OK);
                for (int i = 0; i < NQ * H * D; i++) got[i] = of[i], dq[i] = dqf[i];
                for (int i = 0; i < NK * H * D; i++) dk[i] = dkf[i], dv[i] = dvf[i];
                for (int i = 0; i < H * BK; i++) drel[i] = drelf[i];
            }
            /* Same math, different summation order: 1e-12 in double; float
             * inputs and outputs: a few float ulps of O(1) values. */
            double tol = f64 ? 1e-12 : 2e-5;
            const char *what = kind ? "relative" : "alibi";
            CHECK(tu_max_abs_diff_f64(got, want, NQ * H * D) < tol, "%s mask %d dtype %d: forward", what, mask, dt);
            CHECK(tu_max_abs_diff_f64(dq, dq_w, NQ * H * D) < 10 * tol, "%s mask %d: dq", what, mask);
            CHECK(tu_max_abs_diff_f64(dk, dk_w, NK * H * D) < 10 * tol, "%s mask %d: dk", what, mask);
            CHECK(tu_max_abs_diff_f64(dv, dv_w, NK * H * D) < 10 * tol, "%s mask %d: dv", what, mask);
            if (kind == 1)
                CHECK(tu_max_abs_diff_f64(drel, drel_w, H * BK) < 10 * tol, "relative mask %d: d_rel_table", mask);
        }
    /* Validation of the relative parameters. */
    qkv_attn_desc d;
    qkv_attn_desc_init(&d);
    d.batch = d.n_q = d.n_k = d.heads = d.dim = 1;
    d.rel_table = rel;
    d.rel_buckets = 1;
    d.rel_max_distance = 4;
    CHECK_STATUS(qkv_attn_desc_check(&d), QKV_ERR_BAD_PARAMETER);
    d.rel_buckets = 2;
    d.rel_bidirectional = 1;
    CHECK_STATUS(qkv_attn_desc_check(&d), QKV_ERR_BAD_PARAMETER);
    d.rel_buckets = 4;
    d.rel_max_distance = 0;
    CHECK_STATUS(qkv_attn_desc_check(&d), QKV_ERR_BAD_PARAMETER);
    d.rel_max_distance = 1;
    CHECK_STATUS(qkv_attn_desc_check(&d), QKV_OK);
}

int main(void) {
    test_sinusoidal();
    test_rope();
    test_learned();
    test_alibi_slopes();
    test_buckets();
    test_inkernel_biases(QKV_F64, QKV_IMPL_REFERENCE);
    test_inkernel_biases(QKV_F32, QKV_IMPL_REFERENCE);
    test_inkernel_biases(QKV_F32, QKV_IMPL_AUTO);
    return tu_finish();
}
