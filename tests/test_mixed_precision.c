/* Mixed-precision training (docs/HALF.md "Mixed-precision training"): the
 * multi-head layer with its attention core in bf16 / fp16 against the same
 * layer in float32, the dynamic loss scaler (overflow -> skipped step, scale
 * halved, weights unchanged; exact unscaling; growth), reproducibility, and
 * short training runs on a copy task in fp32, bf16 and fp16 that must reach
 * the same loss. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/half.h"
#include "layers/linear.h"
#include "qkv.h"
#include "test_util.h"

/* ---- the layer ---------------------------------------------------------------
 * Tolerance. Let u be the unit roundoff of the half type (bf16 2^-8, fp16
 * 2^-11). The half path rounds q, k, v once (relative u each); inside the
 * core P is rounded before P V (bf16 fast path) and O once when stored. A
 * score s = sc q.k then moves by at most 2u |s|, which moves the softmax
 * weights by a relative 2u |s| to first order, so
 *     |dO| <= u max|v| (3 + 4 max|s|)
 * (v rounding, P rounding, O rounding, score change on both sides of the
 * normalisation). The inputs below give |s| <= about 2, so |dO| <= 11 u
 * max|v|. In bf16 the projections are bf16 products too (x, W, O and the
 * gradients rounded as the GEMM packs them): each product moves by at most
 * 2u relative, a projected value by 2u sum|x w|, which for these random
 * inputs is a few u max|q| more (fp16 keeps float32 projections). The
 * backward rounds dO too, and dS, dq, dk, dv once each; dS = P (dP - D) is
 * a difference, so its relative error can be larger than its parts' where
 * dP and D nearly cancel. We check every output and gradient (y, dx, all
 * parameter gradients) as
 *     max|half - f32| <= 16 u max|f32|
 * (16 = 11 rounded up to the next power of two with the cancellation
 * margin); the worst measured ratio is printed (about 1-3 here): a wrong
 * path (a missed conversion, a swapped buffer, a gradient left in half)
 * gives errors of order 1, far beyond it. */

static double max_abs(const float *a, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fabs(a[i]) > m ? fabs(a[i]) : m;
    return m;
}

static double max_diff(const float *a, const float *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= m)) m = d; /* NaN propagates */
    }
    return m;
}

static double worst_ratio[2];

static void check_close(const char *what, const char *cfg, qkv_dtype dt, const float *got, const float *want,
                        int64_t n) {
    const double u = dt == QKV_BF16 ? 0x1.0p-8 : 0x1.0p-11;
    double scale = max_abs(want, n), err = max_diff(got, want, n);
    double ratio = scale > 0 ? err / (u * scale) : err;
    int k = dt == QKV_BF16 ? 0 : 1;
    if (ratio > worst_ratio[k]) worst_ratio[k] = ratio;
    CHECK(err <= 16 * u * scale, "%s %s (%s): error %g > 16 u max|f32| = %g (ratio %.2f)", cfg, what,
          dt == QKV_BF16 ? "bf16" : "fp16", err, 16 * u * scale, ratio);
}

typedef struct layer_case {
    const char *name;
    int64_t E, H, Hkv, B, nq, nk;
    qkv_mask mask;
    qkv_pos_kind pos;
    int cross, key_lengths, bias_kv;
} layer_case;

static void run_layer_case(const layer_case *lc, qkv_dtype dt) {
    qkv_mha_config c;
    qkv_mha_config_init(&c, lc->E, lc->H);
    c.heads_kv = lc->Hkv;
    c.attn.mask = lc->mask;
    c.pos = lc->pos;
    c.add_bias_kv = lc->bias_kv;
    qkv_mha *a = NULL, *b = NULL;
    CHECK_STATUS(qkv_mha_create(&c, 11, &a), QKV_OK);
    CHECK_STATUS(qkv_mha_create(&c, 11, &b), QKV_OK);
    if (!a || !b) return;
    CHECK_STATUS(qkv_mha_set_precision(b, dt), QKV_OK);
    CHECK(qkv_mha_get_precision(b) == dt && qkv_mha_get_precision(a) == QKV_F32, "precision read back");
    const int64_t E = lc->E, B = lc->B, nq = lc->nq, nk = lc->cross ? lc->nk : lc->nq;
    int64_t np = 0;
    qkv_mha_params(a, &np);
    float *xq = malloc((size_t)(B * nq * E) * sizeof(float)), *xk = malloc((size_t)(B * nk * E) * sizeof(float));
    float *dy = malloc((size_t)(B * nq * E) * sizeof(float));
    float *ya = malloc((size_t)(B * nq * E) * sizeof(float)), *yb = malloc((size_t)(B * nq * E) * sizeof(float));
    float *dqa = calloc((size_t)(B * nq * E), sizeof(float)), *dqb = calloc((size_t)(B * nq * E), sizeof(float));
    float *dka = calloc((size_t)(B * nk * E), sizeof(float)), *dkb = calloc((size_t)(B * nk * E), sizeof(float));
    tu_rng r;
    tu_rng_seed(&r, 5 + (uint64_t)lc->nq);
    tu_fill_normal_f32(&r, xq, (size_t)(B * nq * E), 1.0);
    tu_fill_normal_f32(&r, xk, (size_t)(B * nk * E), 1.0);
    tu_fill_normal_f32(&r, dy, (size_t)(B * nq * E), 1.0);
    int64_t kl[4] = {nk, nk / 2, 1, nk - 1};
    const int64_t *klp = lc->key_lengths ? kl : NULL;
    const float *xkp = lc->cross ? xk : NULL;
    CHECK_STATUS(qkv_mha_forward(a, B, nq, nk, xq, xkp, NULL, klp, ya, NULL), QKV_OK);
    CHECK_STATUS(qkv_mha_forward(b, B, nq, nk, xq, xkp, NULL, klp, yb, NULL), QKV_OK);
    check_close("y", lc->name, dt, yb, ya, B * nq * E);
    CHECK(max_diff(yb, ya, B * nq * E) > 0, "%s: the half path ran (y differs from float32)", lc->name);
    CHECK_STATUS(qkv_mha_backward(a, xq, xkp, NULL, dy, dqa, lc->cross ? dka : NULL, NULL), QKV_OK);
    CHECK_STATUS(qkv_mha_backward(b, xq, xkp, NULL, dy, dqb, lc->cross ? dkb : NULL, NULL), QKV_OK);
    check_close("dx_q", lc->name, dt, dqb, dqa, B * nq * E);
    if (lc->cross) check_close("dx_k", lc->name, dt, dkb, dka, B * nk * E);
    check_close("parameter gradients", lc->name, dt, qkv_mha_grads(b, NULL), qkv_mha_grads(a, NULL), np);
    /* back to float32: bitwise the float32 layer again */
    CHECK_STATUS(qkv_mha_set_precision(b, QKV_F32), QKV_OK);
    CHECK_STATUS(qkv_mha_backward(b, xq, xkp, NULL, dy, dqb, NULL, NULL), QKV_ERR_UNSUPPORTED); /* forward forgotten */
    CHECK_STATUS(qkv_mha_forward(b, B, nq, nk, xq, xkp, NULL, klp, yb, NULL), QKV_OK);
    CHECK(memcmp(ya, yb, (size_t)(B * nq * E) * sizeof(float)) == 0, "%s: float32 again is bitwise float32", lc->name);
    free(xq);
    free(xk);
    free(dy);
    free(ya);
    free(yb);
    free(dqa);
    free(dqb);
    free(dka);
    free(dkb);
    qkv_mha_free(a);
    qkv_mha_free(b);
}

/* The linear layer under QKV_BF16 really multiplies in bf16: y, dW and dx
 * against double products of the bf16-rounded operands within the float
 * sum bound 2 (K + 4) 2^-24 sum|terms| (a float32 product misses it by
 * about 2^-9 relative); any other precision is nn_linear bitwise. */
static double bf(float x) { return qkv_bf16_to_f32(qkv_f32_to_bf16(x)); }

/* c [rows, cols] (row stride cols) against sum_k A(r, k) B(k, c) (+ bias[c])
 * of the rounded operands, A(r, k) = a[r*ar + k*ak], B(k, c) = b[k*bk + c*bc]. */
static int product_ok(const float *c, int rows, int cols, int K, const float *a, int ar, int ak, const float *b,
                      int bk, int bc, const float *bias) {
    const double u = 0x1.0p-24;
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < cols; j++) {
            double sum = bias ? bias[j] : 0.0, mag = bias ? fabs(bias[j]) : 0.0;
            for (int k = 0; k < K; k++) {
                double t = bf(a[r * ar + k * ak]) * bf(b[k * bk + j * bc]);
                sum += t;
                mag += fabs(t);
            }
            if (fabs(c[r * cols + j] - sum) > 2.0 * (K + 5) * u * mag) return 0;
        }
    return 1;
}

static void test_linear_bf16(void) {
    enum { R = 37, I = 65, O = 23 };
    static float x[R * I], w[O * I], b[O], dy[R * O], y[R * O], y2[R * O], dw[O * I], dx[R * I];
    tu_rng r;
    tu_rng_seed(&r, 3);
    tu_fill_normal_f32(&r, x, R * I, 1.0);
    tu_fill_normal_f32(&r, w, O * I, 1.0);
    tu_fill_normal_f32(&r, b, O, 1.0);
    tu_fill_normal_f32(&r, dy, R * O, 1.0);
    CHECK_STATUS(nn_linear_p(QKV_BF16, x, R, I, w, b, O, y, 2), QKV_OK);
    memset(dw, 0, sizeof dw);
    CHECK_STATUS(nn_linear_backward_p(QKV_BF16, x, dy, R, I, O, w, dw, NULL, dx, 0, 2), QKV_OK);
    /* y[i][o] = sum_k x[i][k] w[o][k] + b[o]; dW[o][k] = sum_i dy[i][o] x[i][k]; dx[i][k] = sum_o dy[i][o] w[o][k] */
    CHECK(product_ok(y, R, O, I, x, I, 1, w, 1, I, b), "bf16 linear forward: y = x Wt + b of the rounded operands");
    CHECK(product_ok(dw, O, I, R, dy, 1, O, x, I, 1, NULL), "bf16 linear backward: dW = dyT x of the rounded operands");
    CHECK(product_ok(dx, R, I, O, dy, O, 1, w, I, 1, NULL), "bf16 linear backward: dx = dy W of the rounded operands");
    CHECK_STATUS(nn_linear_p(QKV_F16, x, R, I, w, b, O, y, 2), QKV_OK);
    CHECK_STATUS(nn_linear(x, R, I, w, b, O, y2, 2), QKV_OK);
    CHECK(memcmp(y, y2, sizeof y) == 0, "linear in another precision is nn_linear bitwise");
}

static void test_layer(void) {
    static const layer_case cases[] = {
        {"self causal", 32, 4, 0, 2, 37, 0, QKV_MASK_CAUSAL, QKV_POS_NONE, 0, 0, 0},
        {"self causal RoPE GQA", 48, 4, 2, 2, 70, 0, QKV_MASK_CAUSAL, QKV_POS_ROPE, 0, 0, 0},
        {"self no mask ALiBi", 32, 2, 0, 1, 129, 0, QKV_MASK_NONE, QKV_POS_ALIBI, 0, 0, 0},
        {"cross key lengths", 32, 4, 0, 4, 9, 23, QKV_MASK_NONE, QKV_POS_NONE, 1, 1, 0},
        {"self causal bias_kv", 32, 4, 0, 2, 16, 0, QKV_MASK_CAUSAL, QKV_POS_NONE, 0, 0, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        run_layer_case(&cases[i], QKV_BF16);
        run_layer_case(&cases[i], QKV_F16);
    }
    printf("layer: worst error / (u max|f32|): bf16 %.2f, fp16 %.2f (bound 16)\n", worst_ratio[0], worst_ratio[1]);

    qkv_mha_config c;
    qkv_mha_config_init(&c, 8, 2);
    qkv_mha *m = NULL;
    CHECK_STATUS(qkv_mha_create(&c, 1, &m), QKV_OK);
    CHECK_STATUS(qkv_mha_set_precision(NULL, QKV_BF16), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_mha_set_precision(m, QKV_F64), QKV_ERR_BAD_ENUM);
    CHECK_STATUS(qkv_mha_set_precision(m, QKV_I32), QKV_ERR_BAD_ENUM);
    CHECK_STATUS(qkv_mha_set_precision(m, (qkv_dtype)99), QKV_ERR_BAD_ENUM);
    CHECK(qkv_mha_get_precision(m) == QKV_F32, "a refused precision leaves the layer as it was");
    qkv_mha_free(m);
}

/* ---- the model and the loss scaler ---------------------------------------- */

enum { BT = 16, HALF = 6, NS = 2 * HALF + 1 };

/* Copy the first half after a separator (as test_model.c). */
static void copy_batch(tu_rng *r, int32_t *tok, int32_t *tgt) {
    for (int b = 0; b < BT; b++) {
        for (int i = 0; i < HALF; i++) tok[b * NS + i] = 1 + (int32_t)(tu_rng_u64(r) % 6);
        tok[b * NS + HALF] = 7;
        for (int i = 0; i < HALF; i++) tok[b * NS + HALF + 1 + i] = tok[b * NS + i];
        for (int i = 0; i < NS; i++) tgt[b * NS + i] = (i >= HALF && i + 1 < NS) ? tok[b * NS + i + 1] : -1;
    }
}

static qkv_model *make_model(int layers, int threads) {
    qkv_model_config c;
    qkv_model_config_init(&c, 8, 16);
    c.dim = 32;
    c.heads = 2;
    c.layers = layers;
    c.threads = threads;
    qkv_model *m = NULL;
    CHECK_STATUS(qkv_model_create(&c, 3, &m), QKV_OK);
    return m;
}

/* All parameters, concatenated (count from qkv_model_param_count). */
static void params_of(qkv_model *m, float *out) {
    int64_t at = 0;
    for (int64_t i = 0; i < qkv_model_segment_count(m); i++) {
        float *p;
        int64_t n;
        qkv_model_segment(m, i, NULL, &p, NULL, &n);
        memcpy(out + at, p, (size_t)n * sizeof(float));
        at += n;
    }
}

static void test_scaler(void) {
    qkv_loss_scaler ls;
    qkv_loss_scaler_init(&ls);
    CHECK(ls.scale == 32768.0 && ls.growth_interval == 1000 && ls.clean == 0 && ls.skipped == 0, "init");
    qkv_model *a = make_model(1, 1), *b = make_model(1, 1);
    qkv_adamw *oa = NULL, *ob = NULL;
    CHECK_STATUS(qkv_adamw_create(a, 0.9, 0.99, 1e-8, 0.01, &oa), QKV_OK);
    CHECK_STATUS(qkv_adamw_create(b, 0.9, 0.99, 1e-8, 0.01, &ob), QKV_OK);
    if (!a || !b || !oa || !ob) return;
    const int64_t np = qkv_model_param_count(a);
    float *pa = malloc((size_t)np * sizeof(float)), *pb = malloc((size_t)np * sizeof(float));
    int32_t tok[BT * NS], tgt[BT * NS];
    tu_rng r;
    tu_rng_seed(&r, 7);
    double la = 0, lb = 0, na = 0, nb = 0;
    int skipped = -1;

    /* Exact unscaling: in float32, scaling the loss gradient by 2^15 scales
     * every rounding in the backward by 2^15 too (no overflow or underflow at
     * these sizes), so after unscaling the step is bitwise the plain one. */
    for (int step = 0; step < 3; step++) {
        copy_batch(&r, tok, tgt);
        qkv_model_zero_grad(a);
        qkv_model_zero_grad(b);
        CHECK_STATUS(qkv_model_set_loss_scale(b, ls.scale), QKV_OK);
        CHECK_STATUS(qkv_model_forward(a, BT, NS, tok, tgt, 1, NULL, &la), QKV_OK);
        CHECK_STATUS(qkv_model_forward(b, BT, NS, tok, tgt, 1, NULL, &lb), QKV_OK);
        CHECK(la == lb, "the loss does not see the scale");
        CHECK_STATUS(qkv_model_backward(a), QKV_OK);
        CHECK_STATUS(qkv_model_backward(b), QKV_OK);
        CHECK_STATUS(qkv_adamw_step(oa, 1e-3, 1.0, &na), QKV_OK);
        CHECK_STATUS(qkv_loss_scaler_step(&ls, b, ob, 1e-3, 1.0, &nb, &skipped), QKV_OK);
        CHECK(skipped == 0 && na == nb, "clean step %d: norm %g vs %g", step, na, nb);
    }
    params_of(a, pa);
    params_of(b, pb);
    CHECK(memcmp(pa, pb, (size_t)np * sizeof(float)) == 0, "scaled + unscaled steps are bitwise the plain ones");
    CHECK(ls.clean == 3 && ls.scale == 32768.0 && ls.skipped == 0, "three clean steps counted");

    /* Overflow: fp16 attention with a scale of 2^40 - the attention core's
     * dout (about 2^40 / 96 times the true one) is beyond fp16's 65504, so
     * gradients are inf / NaN: the step is skipped, the scale halves, the
     * clean count restarts and neither weights nor optimiser move. */
    CHECK_STATUS(qkv_model_set_precision(b, QKV_F16), QKV_OK);
    ls.scale = 0x1.0p40;
    copy_batch(&r, tok, tgt);
    qkv_model_zero_grad(b);
    CHECK_STATUS(qkv_model_set_loss_scale(b, ls.scale), QKV_OK);
    CHECK_STATUS(qkv_model_forward(b, BT, NS, tok, tgt, 1, NULL, &lb), QKV_OK);
    CHECK_STATUS(qkv_model_backward(b), QKV_OK);
    CHECK_STATUS(qkv_loss_scaler_step(&ls, b, ob, 1e-3, 1.0, &nb, &skipped), QKV_OK);
    CHECK(skipped == 1 && isinf(nb), "an fp16 overflow skips the step (skipped %d, norm %g)", skipped, nb);
    CHECK(ls.scale == 0x1.0p39 && ls.clean == 0 && ls.skipped == 1, "scale halved to 2^39: %g", ls.scale);
    params_of(b, pb);
    CHECK(memcmp(pa, pb, (size_t)np * sizeof(float)) == 0, "a skipped step leaves the weights unchanged");

    /* A single NaN (or inf) gradient anywhere is enough. */
    CHECK_STATUS(qkv_model_set_precision(a, QKV_F32), QKV_OK);
    for (int kind = 0; kind < 2; kind++) {
        copy_batch(&r, tok, tgt);
        qkv_model_zero_grad(a);
        qkv_loss_scaler la_s;
        qkv_loss_scaler_init(&la_s);
        CHECK_STATUS(qkv_model_set_loss_scale(a, la_s.scale), QKV_OK);
        CHECK_STATUS(qkv_model_forward(a, BT, NS, tok, tgt, 1, NULL, &la), QKV_OK);
        CHECK_STATUS(qkv_model_backward(a), QKV_OK);
        float *g;
        int64_t n, last = qkv_model_segment_count(a) - 1;
        qkv_model_segment(a, last, NULL, NULL, &g, &n);
        g[n - 1] = kind ? INFINITY : NAN;
        params_of(a, pa);
        CHECK_STATUS(qkv_loss_scaler_step(&la_s, a, oa, 1e-3, 1.0, NULL, &skipped), QKV_OK);
        CHECK(skipped == 1 && la_s.scale == 16384.0, "planted %s: skipped", kind ? "inf" : "NaN");
        params_of(a, pb);
        CHECK(memcmp(pa, pb, (size_t)np * sizeof(float)) == 0, "planted %s: weights unchanged", kind ? "inf" : "NaN");
    }

    /* Growth after growth_interval clean steps; the bounds. */
    qkv_loss_scaler g;
    qkv_loss_scaler_init(&g);
    g.growth_interval = 2;
    for (int step = 0; step < 4; step++) {
        copy_batch(&r, tok, tgt);
        qkv_model_zero_grad(a);
        CHECK_STATUS(qkv_model_set_loss_scale(a, g.scale), QKV_OK);
        CHECK_STATUS(qkv_model_forward(a, BT, NS, tok, tgt, 1, NULL, &la), QKV_OK);
        CHECK_STATUS(qkv_model_backward(a), QKV_OK);
        CHECK_STATUS(qkv_loss_scaler_step(&g, a, oa, 1e-3, 1.0, NULL, &skipped), QKV_OK);
        CHECK(skipped == 0, "clean");
        if (step == 0) CHECK(g.scale == 32768.0 && g.clean == 1, "not yet");
        if (step == 1) CHECK(g.scale == 65536.0 && g.clean == 0, "doubled after 2 clean steps: %g", g.scale);
    }
    CHECK(g.scale == 131072.0, "doubled twice in 4 steps: %g", g.scale);
    g.scale = 0x1.0p-24;
    qkv_model_zero_grad(a);
    float *g0;
    qkv_model_segment(a, 0, NULL, NULL, &g0, NULL);
    g0[0] = NAN;
    CHECK_STATUS(qkv_loss_scaler_step(&g, a, oa, 1e-3, 1.0, NULL, &skipped), QKV_OK);
    CHECK(skipped == 1 && g.scale == 0x1.0p-24, "the scale stays at 2^-24 at least: %g", g.scale);

    /* Errors. */
    qkv_loss_scaler bad = g;
    bad.scale = 3.0;
    CHECK_STATUS(qkv_loss_scaler_step(&bad, a, oa, 1e-3, 1.0, NULL, NULL), QKV_ERR_BAD_PARAMETER);
    bad.scale = 0.0;
    CHECK_STATUS(qkv_loss_scaler_step(&bad, a, oa, 1e-3, 1.0, NULL, NULL), QKV_ERR_BAD_PARAMETER);
    bad.scale = NAN;
    CHECK_STATUS(qkv_loss_scaler_step(&bad, a, oa, 1e-3, 1.0, NULL, NULL), QKV_ERR_BAD_PARAMETER);
    bad = g;
    bad.growth_interval = 0;
    CHECK_STATUS(qkv_loss_scaler_step(&bad, a, oa, 1e-3, 1.0, NULL, NULL), QKV_ERR_BAD_PARAMETER);
    CHECK_STATUS(qkv_loss_scaler_step(NULL, a, oa, 1e-3, 1.0, NULL, NULL), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_loss_scaler_step(&g, NULL, oa, 1e-3, 1.0, NULL, NULL), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_loss_scaler_step(&g, a, NULL, 1e-3, 1.0, NULL, NULL), QKV_ERR_NULL_POINTER);
    qkv_loss_scaler_init(NULL); /* no crash */
    CHECK_STATUS(qkv_model_set_loss_scale(a, 0.0), QKV_ERR_BAD_PARAMETER);
    CHECK_STATUS(qkv_model_set_loss_scale(a, INFINITY), QKV_ERR_BAD_PARAMETER);
    CHECK_STATUS(qkv_model_set_loss_scale(NULL, 1.0), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_model_set_precision(a, QKV_F64), QKV_ERR_BAD_ENUM);
    CHECK_STATUS(qkv_model_set_precision(NULL, QKV_BF16), QKV_ERR_NULL_POINTER);
    /* changing precision forgets the forward */
    CHECK_STATUS(qkv_model_forward(a, BT, NS, tok, tgt, 1, NULL, &la), QKV_OK);
    CHECK_STATUS(qkv_model_set_precision(a, QKV_BF16), QKV_OK);
    CHECK_STATUS(qkv_model_backward(a), QKV_ERR_UNSUPPORTED);

    free(pa);
    free(pb);
    qkv_adamw_free(oa);
    qkv_adamw_free(ob);
    qkv_model_free(a);
    qkv_model_free(b);
}

/* ---- training --------------------------------------------------------------- */

/* STEPS AdamW steps on the copy task in the given precision (fp16 with the
 * loss scaler); returns the mean loss of the last 20 steps and the
 * exact-sequence accuracy of the float32 model (the master weights, as
 * qkv eval reads them) on 4 fresh batches. */
static double train_copy(qkv_dtype dt, int threads, int steps, double *acc, float *params_out) {
    qkv_model *m = make_model(2, threads);
    qkv_adamw *opt = NULL;
    CHECK_STATUS(qkv_adamw_create(m, 0.9, 0.99, 1e-8, 0.0, &opt), QKV_OK);
    if (!m || !opt) return NAN;
    CHECK_STATUS(qkv_model_set_precision(m, dt), QKV_OK);
    qkv_loss_scaler ls;
    qkv_loss_scaler_init(&ls);
    int32_t tok[BT * NS], tgt[BT * NS];
    float logits[BT * NS * 8];
    tu_rng r;
    tu_rng_seed(&r, 1);
    double loss = 0, tail = 0;
    for (int step = 0; step < steps; step++) {
        copy_batch(&r, tok, tgt);
        qkv_model_zero_grad(m);
        if (dt == QKV_F16) CHECK_STATUS(qkv_model_set_loss_scale(m, ls.scale), QKV_OK);
        CHECK_STATUS(qkv_model_forward(m, BT, NS, tok, tgt, 1, NULL, &loss), QKV_OK);
        CHECK_STATUS(qkv_model_backward(m), QKV_OK);
        double lr = qkv_lr_schedule(step, 30, steps, 3e-3, 3e-4);
        if (dt == QKV_F16) {
            int skipped;
            CHECK_STATUS(qkv_loss_scaler_step(&ls, m, opt, lr, 1.0, NULL, &skipped), QKV_OK);
        } else {
            CHECK_STATUS(qkv_adamw_step(opt, lr, 1.0, NULL), QKV_OK);
        }
        if (step >= steps - 20) tail += loss / 20;
    }
    CHECK_STATUS(qkv_model_set_precision(m, QKV_F32), QKV_OK);
    int ok = 0;
    for (int k = 0; k < 4; k++) {
        copy_batch(&r, tok, tgt);
        CHECK_STATUS(qkv_model_forward(m, BT, NS, tok, tgt, 0, logits, &loss), QKV_OK);
        for (int b = 0; b < BT; b++) {
            int all = 1;
            for (int i = 0; i < NS; i++) {
                if (tgt[b * NS + i] < 0) continue;
                const float *z = logits + (b * NS + i) * 8;
                int best = 0;
                for (int v = 1; v < 8; v++)
                    if (z[v] > z[best]) best = v;
                all &= best == tgt[b * NS + i];
            }
            ok += all;
        }
    }
    *acc = ok / (4.0 * BT);
    if (params_out) params_of(m, params_out);
    if (dt == QKV_F16) printf("  fp16: %lld steps skipped, final loss scale %g\n", (long long)ls.skipped, ls.scale);
    qkv_adamw_free(opt);
    qkv_model_free(m);
    return tail;
}

static void test_training(void) {
    const int STEPS = 300;
    double acc32, acc16b, acc16h;
    double l32 = train_copy(QKV_F32, 1, STEPS, &acc32, NULL);
    double lbf = train_copy(QKV_BF16, 1, STEPS, &acc16b, NULL);
    double lfp = train_copy(QKV_F16, 1, STEPS, &acc16h, NULL);
    printf("copy task, %d steps: mean loss of the last 20 steps fp32 %.4f, bf16 %.4f, fp16 %.4f (chance %.3f);\n"
           "  exact-sequence accuracy fp32 %.1f%%, bf16 %.1f%%, fp16 %.1f%%\n",
           STEPS, l32, lbf, lfp, log(6.0), 100 * acc32, 100 * acc16b, 100 * acc16h);
    /* The same task as test_model.c's (which asks fp32 for loss < 0.3). */
    CHECK(l32 < 0.3 && lbf < 0.3 && lfp < 0.3, "every precision learns to copy: %g %g %g", l32, lbf, lfp);
    CHECK(fabs(lbf - l32) < 0.1 && fabs(lfp - l32) < 0.1, "the same loss as fp32: %g, %g vs %g", lbf, lfp, l32);
    CHECK(acc16b >= acc32 - 0.1 && acc16h >= acc32 - 0.1, "the same accuracy as fp32: %g, %g vs %g", acc16b, acc16h,
          acc32);
}

/* Reproducible: the same run twice, and with 1 and 2 threads, gives bitwise
 * the same weights (the half kernels are deterministic for any thread
 * count, and the loss scaler's decisions depend on the gradients alone). */
static void test_reproducible(void) {
    qkv_model *m = make_model(2, 1);
    if (!m) return;
    const int64_t np = qkv_model_param_count(m);
    qkv_model_free(m);
    float *p1 = malloc((size_t)np * sizeof(float)), *p2 = malloc((size_t)np * sizeof(float));
    double acc;
    const qkv_dtype dts[2] = {QKV_BF16, QKV_F16};
    for (int k = 0; k < 2; k++) {
        train_copy(dts[k], 1, 12, &acc, p1);
        train_copy(dts[k], 2, 12, &acc, p2);
        CHECK(memcmp(p1, p2, (size_t)np * sizeof(float)) == 0, "%s: 1 and 2 threads give the same weights",
              k ? "fp16" : "bf16");
    }
    free(p1);
    free(p2);
}

int main(void) {
    test_linear_bf16();
    test_layer();
    test_scaler();
    test_reproducible();
    test_training();
    return tu_finish();
}
