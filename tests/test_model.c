/* The transformer: gradients of every parameter by central differences for
 * every positional encoding, decoder and encoder, tied and untied, with and
 * without dropout; determinism across thread counts; checkpoints; and a
 * short training run that must learn to copy. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"
#include "model/model_internal.h"

enum { B = 2, N = 5, V = 7 };

static qkv_model *make(qkv_posenc pos, int causal, int tie, double dropout, int threads) {
    qkv_model_config c;
    qkv_model_config_init(&c, V, 8);
    c.dim = 8;
    c.heads = 2;
    c.layers = 2;
    c.mlp_dim = 12;
    c.pos = pos;
    c.causal = causal;
    c.tie_embeddings = tie;
    c.dropout = dropout;
    c.threads = threads;
    qkv_model *m = NULL;
    CHECK_STATUS(qkv_model_create(&c, 17, &m), QKV_OK);
    if (!m) return NULL;
    /* Larger weights than the training init, so every gradient is well
     * above the float rounding noise of the finite differences. */
    tu_rng r;
    tu_rng_seed(&r, 5);
    for (int64_t s = 0; s < qkv_model_segment_count(m); s++) {
        const char *name;
        float *p;
        int64_t n;
        qkv_model_segment(m, s, &name, &p, NULL, &n);
        for (int64_t i = 0; i < n; i++) p[i] += (float)(0.3 * tu_rng_normal(&r));
    }
    return m;
}

static const int32_t TOK[B * N] = {1, 3, 5, 2, 6, 0, 4, 4, 1, 2};
static const int32_t TGT[B * N] = {3, 5, -1, 6, 0, 4, 4, 1, 2, -1};

static double loss_of(qkv_model *m, int train) {
    double l = NAN;
    qkv_model_set_step(m, 99, 3);
    if (qkv_model_forward(m, B, N, TOK, TGT, train, NULL, &l) != QKV_OK) return NAN;
    return l;
}

/* Central differences on a spread sample of every segment. The model runs
 * in float (its loss is ~2): with step 3e-3 the rounding error of a
 * difference is ~1e-7 * 2 / 3e-3 ~ 1e-4, so agreement within 2e-3 absolute
 * plus 2% relative separates right from wrong wiring (errors O(grad)). The
 * attention core and FLOATER are checked in double in their own tests. */
static void gradcheck(qkv_posenc pos, int causal, int tie, double dropout) {
    qkv_model *m = make(pos, causal, tie, dropout, 1);
    if (!m) return;
    int train = dropout > 0;
    qkv_model_zero_grad(m);
    loss_of(m, train);
    CHECK_STATUS(qkv_model_backward(m), QKV_OK);
    int bad = 0;
    for (int64_t s = 0; s < qkv_model_segment_count(m) && !bad; s++) {
        const char *name;
        float *p, *g;
        int64_t n;
        qkv_model_segment(m, s, &name, &p, &g, &n);
        float *gc = malloc((size_t)n * sizeof(float));
        memcpy(gc, g, (size_t)n * sizeof(float));
        int64_t step = n > 12 ? n / 12 : 1;
        for (int64_t i = 0; i < n; i += step) {
            float keep = p[i];
            const double h = 3e-3;
            p[i] = (float)(keep + h);
            double lp = loss_of(m, train);
            p[i] = (float)(keep - h);
            double lm = loss_of(m, train);
            p[i] = keep;
            double fd = (lp - lm) / (2 * h);
            if (fabs(fd - gc[i]) > 2e-3 + 2e-2 * fabs(fd)) {
                fprintf(stderr, "  pos %d causal %d tie %d dropout %g: %s[%lld]: fd %.6g backward %.6g\n", pos, causal,
                        tie, dropout, name, (long long)i, fd, (double)gc[i]);
                bad = 1;
                break;
            }
        }
        free(gc);
    }
    CHECK(!bad, "model gradients: pos %d causal %d tie %d dropout %g", pos, causal, tie, dropout);
    qkv_model_free(m);
}

static void test_dropout_and_determinism(void) {
    qkv_model *a = make(QKV_POSENC_SINUSOIDAL, 1, 1, 0.2, 1), *b = make(QKV_POSENC_SINUSOIDAL, 1, 1, 0.2, 2);
    if (!a || !b) return;
    double l1 = loss_of(a, 1), l2 = loss_of(a, 1), l3 = loss_of(b, 1), l0 = loss_of(a, 0);
    CHECK(l1 == l2, "dropout is a function of (seed, step): %g %g", l1, l2);
    CHECK(l1 == l3, "the same with 2 threads: %g %g", l1, l3);
    CHECK(l1 != l0, "dropout changes the training loss");
    qkv_model_set_step(a, 99, 4);
    double l4 = NAN;
    qkv_model_forward(a, B, N, TOK, TGT, 1, NULL, &l4);
    CHECK(l4 != l1, "another step draws another mask");
    qkv_model_free(a);
    qkv_model_free(b);
}

static void test_checkpoint(void) {
    qkv_model *a = make(QKV_POSENC_RELATIVE, 1, 0, 0.0, 1);
    qkv_model_config c = *qkv_model_get_config(a);
    qkv_model *b = NULL;
    CHECK_STATUS(qkv_model_create(&c, 1234, &b), QKV_OK);
    if (!a || !b) return;
    qkv_safetensors *st = NULL;
    CHECK_STATUS(qkv_safetensors_create(&st), QKV_OK);
    CHECK_STATUS(qkv_model_save(a, st), QKV_OK);
    qkv_model_config c2;
    char why[256];
    CHECK_STATUS(qkv_model_config_from(st, &c2, why, sizeof why), QKV_OK);
    CHECK(c2.dim == c.dim && c2.layers == c.layers && c2.pos == c.pos && c2.tie_embeddings == 0, "config round trip");
    CHECK_STATUS(qkv_model_load(b, st, why, sizeof why), QKV_OK);
    float la[B * N * V], lb[B * N * V];
    CHECK_STATUS(qkv_model_forward(a, B, N, TOK, NULL, 0, la, NULL), QKV_OK);
    CHECK_STATUS(qkv_model_forward(b, B, N, TOK, NULL, 0, lb, NULL), QKV_OK);
    CHECK(memcmp(la, lb, sizeof la) == 0, "a loaded checkpoint gives the same logits");
    qkv_safetensors_free(st);
    /* A checkpoint of another shape is refused. */
    qkv_model *other = make(QKV_POSENC_RELATIVE, 1, 1, 0.0, 1);
    CHECK_STATUS(qkv_safetensors_create(&st), QKV_OK);
    CHECK_STATUS(qkv_model_save(other, st), QKV_OK);
    CHECK_STATUS(qkv_model_load(b, st, why, sizeof why), QKV_ERR_SHAPE);
    qkv_safetensors_free(st);
    qkv_model_free(other);
    qkv_model_free(a);
    qkv_model_free(b);
}

/* A few hundred AdamW steps on "copy the first half": the loss must fall
 * well below chance (log 6 = 1.8), with each kind of position. */
static void test_learns_copy(qkv_posenc pos, int STEPS, int64_t dim) {
    qkv_model_config c;
    qkv_model_config_init(&c, 8, 16);
    c.dim = dim;
    c.heads = 2;
    c.layers = 2;
    c.pos = pos;
    qkv_model *m = NULL;
    CHECK_STATUS(qkv_model_create(&c, 3, &m), QKV_OK);
    qkv_adamw *opt = NULL;
    CHECK_STATUS(qkv_adamw_create(m, 0.9, 0.99, 1e-8, 0.0, &opt), QKV_OK);
    if (!m || !opt) return;
    enum { BT = 16, HALF = 6, NS = 2 * HALF + 1 };
    int32_t tok[BT * NS], tgt[BT * NS];
    tu_rng r;
    tu_rng_seed(&r, 1);
    double loss = 0;
    for (int step = 0; step < STEPS; step++) {
        for (int b = 0; b < BT; b++) {
            for (int i = 0; i < HALF; i++) tok[b * NS + i] = 1 + (int32_t)(tu_rng_u64(&r) % 6);
            tok[b * NS + HALF] = 7; /* separator */
            for (int i = 0; i < HALF; i++) tok[b * NS + HALF + 1 + i] = tok[b * NS + i];
            for (int i = 0; i < NS; i++) tgt[b * NS + i] = (i >= HALF && i + 1 < NS) ? tok[b * NS + i + 1] : -1;
        }
        qkv_model_zero_grad(m);
        CHECK_STATUS(qkv_model_forward(m, BT, NS, tok, tgt, 1, NULL, &loss), QKV_OK);
        CHECK_STATUS(qkv_model_backward(m), QKV_OK);
        CHECK_STATUS(qkv_adamw_step(opt, qkv_lr_schedule(step, 30, STEPS, 3e-3, 3e-4), 1.0, NULL), QKV_OK);
    }
    printf("copy task, positions %d: loss %.4f after %d steps (chance %.3f)\n", pos, loss, STEPS, log(6.0));
    CHECK(loss < 0.3, "the transformer learns to copy with positions %d: loss %g", pos, loss);
    qkv_adamw_free(opt);
    qkv_model_free(m);
}

/* Decoding with the KV caches gives the logits of one full forward. */
static void test_decode(qkv_posenc pos) {
    qkv_model *m = make(pos, 1, 0, 0.0, 1);
    if (!m) return;
    float full[N * V], step[N * V];
    CHECK_STATUS(qkv_model_forward(m, 1, N, TOK, NULL, 0, full, NULL), QKV_OK);
    CHECK_STATUS(qkv_model_decode_begin(m, N), QKV_OK);
    CHECK_STATUS(qkv_model_decode_step(m, 2, TOK, step), QKV_OK);
    for (int i = 2; i < N; i++) CHECK_STATUS(qkv_model_decode_step(m, 1, TOK + i, step + i * V), QKV_OK);
    double e = 0;
    for (int i = 0; i < N * V; i++) e = fmax(e, fabs(full[i] - step[i]));
    CHECK(e < 1e-4, "decode with positions %d equals the forward: %g", pos, e);
    CHECK_STATUS(qkv_model_decode_step(m, 1, TOK, step), QKV_ERR_POSITION);
    qkv_model_free(m);
}

static void test_errors(void) {
    qkv_model_config c;
    qkv_model *m = NULL;
    qkv_model_config_init(&c, 1, 8);
    CHECK_STATUS(qkv_model_create(&c, 1, &m), QKV_ERR_BAD_SIZE);
    qkv_model_config_init(&c, 8, 8);
    c.heads = 3;
    CHECK_STATUS(qkv_model_create(&c, 1, &m), QKV_ERR_HEADS);
    qkv_model_config_init(&c, 8, 8);
    c.dropout = 1.0;
    CHECK_STATUS(qkv_model_create(&c, 1, &m), QKV_ERR_BAD_PARAMETER);
    qkv_model_config_init(&c, 8, 8);
    c.pos = (qkv_posenc)42;
    CHECK_STATUS(qkv_model_create(&c, 1, &m), QKV_ERR_BAD_ENUM);
    qkv_model_config_init(&c, 8, 4);
    c.dim = 16;
    CHECK_STATUS(qkv_model_create(&c, 1, &m), QKV_OK);
    int32_t tok[6] = {0, 1, 2, 3, 4, 5}, bad[2] = {0, 8};
    double l;
    CHECK_STATUS(qkv_model_forward(m, 1, 6, tok, NULL, 0, NULL, NULL), QKV_ERR_POSITION);
    CHECK_STATUS(qkv_model_forward(m, 1, 2, bad, NULL, 0, NULL, NULL), QKV_ERR_BAD_PARAMETER);
    CHECK_STATUS(qkv_model_forward(m, 1, 2, tok, bad, 0, NULL, &l), QKV_ERR_BAD_PARAMETER);
    CHECK_STATUS(qkv_model_forward(m, 1, 2, tok, tok, 0, NULL, NULL), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_model_backward(m), QKV_ERR_UNSUPPORTED);
    qkv_model_free(m);
    qkv_model_free(NULL);
}

/* The libm-free GELU (model_internal.h) against double erf and exp on
 * [-12, 12] in steps of 1/1024 plus the special points. Tolerances: the
 * erf approximation's bound 1.5e-7 (Abramowitz & Stegun 7.1.26) gives
 * <= 0.75e-7 |x| in GELU; with the float roundings measured 1.74e-7
 * max(1, |x|), so 2.5e-7 max(1, |x|); GELU' measured 2.9e-7, checked at 4e-7. */
static void test_gelu_accuracy(void) {
    double worst = 0, worst_g = 0;
    for (int i = -12 * 1024; i <= 12 * 1024; i++) {
        float x = (float)i / 1024.0f, g;
        float v = qkv_nn_gelu_eval(x, &g);
        double xd = x, cdf = 0.5 * (1.0 + erf(xd / sqrt(2.0)));
        double e = fabs(v - xd * cdf) / fmax(1.0, fabs(xd));
        double eg = fabs(g - (cdf + xd * exp(-0.5 * xd * xd) / sqrt(2.0 * 3.14159265358979323846)));
        if (e > worst) worst = e;
        if (eg > worst_g) worst_g = eg;
    }
    CHECK(worst <= 2.5e-7, "GELU within 2.5e-7 max(1, |x|) of double: %g", worst);
    CHECK(worst_g <= 4e-7, "GELU' within 4e-7 of double: %g", worst_g);
    float g;
    CHECK(qkv_nn_gelu_eval(0.0f, &g) == 0.0f && g == 0.5f, "GELU(0) = 0, GELU'(0) = 1/2");
    /* exp is clamped at exp(-87) ~ 1.6e-38 (still normal), so far left GELU
     * is a few 1e-39 instead of 0 (the true value underflows any float). */
    CHECK(fabsf(qkv_nn_gelu_eval(-100.0f, &g)) < 1e-36f && fabsf(g) < 1e-35f, "GELU(-100) ~ 0 and GELU'(-100) ~ 0");
    CHECK(qkv_nn_gelu_eval(100.0f, &g) == 100.0f && g == 1.0f, "GELU(100) = 100 and GELU'(100) = 1");
    CHECK(isnan(qkv_nn_gelu_eval(NAN, &g)), "GELU(NaN) is NaN");
}

int main(void) {
    const qkv_posenc kinds[] = {QKV_POSENC_NONE,  QKV_POSENC_SINUSOIDAL, QKV_POSENC_LEARNED, QKV_POSENC_ROPE,
                                QKV_POSENC_ALIBI, QKV_POSENC_RELATIVE,   QKV_POSENC_FLOATER};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) gradcheck(kinds[k], 1, 1, 0.0);
    gradcheck(QKV_POSENC_SINUSOIDAL, 0, 0, 0.0);
    gradcheck(QKV_POSENC_LEARNED, 0, 1, 0.0);
    gradcheck(QKV_POSENC_ROPE, 1, 0, 0.25);
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) test_decode(kinds[k]);
    test_gelu_accuracy();
    test_dropout_and_determinism();
    test_checkpoint();
    test_learns_copy(QKV_POSENC_SINUSOIDAL, 300, 32);
    test_learns_copy(QKV_POSENC_LEARNED, 300, 32);
    test_learns_copy(QKV_POSENC_ROPE, 300, 32);
    /* FLOATER's positions must be learned first. At E = 32 this run ends
     * either near 0.01 or on a plateau near 1.3 depending on the data seed
     * (4 of 8 seeds; a one-ulp change of any constant flips it), so the check
     * could not judge numerics changes; at E = 64 all 8 seeds tried (and 8
     * more with another model seed) end at 0.001-0.015, far below 0.3. */
    test_learns_copy(QKV_POSENC_FLOATER, 600, 64);
    test_errors();
    return tu_finish();
}
