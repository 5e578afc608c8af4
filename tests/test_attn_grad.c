/* Gradient checks of qkv_attention_backward by central finite differences
 * of the forward, in double, for every score x normaliser x mask (the mask
 * configurations of tests/util/attn_oracle.c: none, causal, windows, key
 * lengths with a 0, packed sequences, shared and per-head bias with -inf,
 * and combinations), on every shape of the list below
 * over shapes with GQA/MQA, n_q < n_k and n_q > n_k, D_v != D, n = 1, D = 1
 * and odd sizes; soft-capping, custom scales and temperatures along the way.
 *
 * Loss L = sum(dout * out) with random dout; each input element x is moved by
 * +-h (h = 1e-6) and dL/dx ~ (L(x+h) - L(x-h)) / 2h. The error of that
 * estimate is ~h^2 |L'''| (truncation, ~1e-12 here) plus ~eps |L| / h
 * (rounding, ~1e-9 for |L| ~ 10), so the check
 *     |analytic - fd| <= 1e-6 + 1e-4 |fd|
 * leaves two orders of margin while any real mistake (a missing term, a
 * wrong mask, a factor) is off by far more. Kinks are avoided: for relu no
 * visible logit is within 1e-3 of 0 (the problem is re-drawn), inputs are
 * O(1) so soft-capping and cosine norms stay smooth.
 *
 * Then, per case: out/lse passed vs NULL give bitwise the same gradients;
 * the optional gradients may be NULL (dq, dk, dv unchanged bitwise); F32
 * gradients equal the F64 ones on the same float-rounded inputs to within
 * one float rounding (checked as 1e-7 + 1e-6 relative); AUTO agrees with
 * REFERENCE to 1e-10 in F64, and in F32 to 2e-5 of the largest gradient. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn_oracle.h"
#include "test_util.h"

typedef struct shape {
    int64_t B, nq, nk, H, Hkv, D, Dv;
} shape;

static const shape SHAPES[] = {
    {2, 4, 4, 4, 2, 3, 3},  /* GQA */
    {1, 3, 5, 2, 1, 2, 3},  /* n_q < n_k, MQA, D_v != D */
    {2, 5, 3, 2, 2, 1, 2},  /* n_q > n_k, D = 1 */
    {1, 1, 1, 1, 1, 1, 1},  /* n = 1 */
    {1, 7, 7, 2, 1, 3, 1},  /* odd, D_v = 1 */
    {1, 13, 3, 1, 1, 2, 2}, /* odd, n_q >> n_k */
};
#define NSHAPES ((int)(sizeof SHAPES / sizeof SHAPES[0]))

static const char *NORM_NAMES[4] = {"softmax", "relu", "relu/count", "sigmoid"};
static const char *TENSOR_NAMES[AO_W + 1] = {"dq", "dk", "dv", "dbias", "d_w1", "d_w2", "d_w"};

#define FD_STEP 1e-6
#define FD_ATOL 1e-6
#define FD_RTOL 1e-4

static double worst_seen = 0.0;   /* largest FD error / tolerance over all checks */
static double worst_auto32 = 0.0; /* largest F32 AUTO error / tolerance */

static double *dalloc(size_t n) {
    double *x = calloc(n ? n : 1, sizeof *x);
    if (!x) abort();
    return x;
}

static void desc_from(qkv_attn_desc *d, const shape *s, int score, int norm4) {
    qkv_attn_desc_init(d);
    d->dtype = QKV_F64;
    d->impl = QKV_IMPL_REFERENCE;
    d->batch = s->B;
    d->n_q = s->nq;
    d->n_k = s->nk;
    d->heads = s->H;
    d->heads_kv = s->Hkv;
    d->dim = s->D;
    d->dim_v = s->Dv;
    d->score = (qkv_score)score;
    d->norm = norm4 == 0 ? QKV_NORM_SOFTMAX : norm4 == 3 ? QKV_NORM_SIGMOID : QKV_NORM_RELU;
    d->relu_divide_by_count = norm4 == 2;
    if (score == QKV_SCORE_ADDITIVE) d->additive_dim = 2;
}

static double loss(const ao_prob *p, const double *dout, double *out) {
    qkv_status s = ao_lib_forward(p, QKV_F64, QKV_IMPL_REFERENCE, 1, out, NULL, NULL, NULL);
    if (s != QKV_OK) return NAN;
    double L = 0.0;
    for (size_t i = 0; i < p->n[AO_O]; i++) L += dout[i] * out[i];
    return L;
}

static void grads_alloc(ao_grads *g, const ao_prob *p) {
    g->dq = dalloc(p->n[AO_Q]);
    g->dk = dalloc(p->n[AO_K]);
    g->dv = dalloc(p->n[AO_V]);
    g->dbias = p->n[AO_BIAS] ? dalloc(p->n[AO_BIAS]) : NULL;
    g->dw1 = p->n[AO_W1] ? dalloc(p->n[AO_W1]) : NULL;
    g->dw2 = p->n[AO_W2] ? dalloc(p->n[AO_W2]) : NULL;
    g->dw = p->n[AO_W] ? dalloc(p->n[AO_W]) : NULL;
}

static void grads_free(ao_grads *g) {
    free(g->dq);
    free(g->dk);
    free(g->dv);
    free(g->dbias);
    free(g->dw1);
    free(g->dw2);
    free(g->dw);
}

static double *grad_of(const ao_grads *g, int t) {
    double *a[AO_W + 1] = {g->dq, g->dk, g->dv, g->dbias, g->dw1, g->dw2, g->dw};
    return a[t];
}

static int same_bits(const double *a, const double *b, size_t n) {
    return n == 0 || memcmp(a, b, n * sizeof(double)) == 0;
}

/* Draw a problem for d; for relu, re-draw until no visible logit is near the
 * kink. Returns the seed used. */
static uint64_t draw(ao_prob *p, const qkv_attn_desc *d, uint64_t seed) {
    for (int attempt = 0;; attempt++) {
        tu_rng r;
        tu_rng_seed(&r, seed);
        ao_prob_init(p, d, &r, 1.0);
        ao_bias_plant_inf(p, &r);
        if (d->norm != QKV_NORM_RELU || ao_min_abs_logit(p) > 1e-3 || attempt == 200) return seed;
        ao_prob_free(p);
        seed += 0x10000u;
    }
}

static void grad_case(const qkv_attn_desc *d, uint64_t seed0, const char *label) {
    ao_prob p;
    uint64_t seed = draw(&p, d, seed0);
    char desc[400];
    ao_describe(&p.d, desc, sizeof desc);
    tu_rng r;
    tu_rng_seed(&r, seed ^ 0xD0D0u);
    double *dout = dalloc(p.n[AO_O]), *out = dalloc(p.n[AO_O]);
    tu_fill_normal_f64(&r, dout, p.n[AO_O], 1.0);

    ao_grads g;
    grads_alloc(&g, &p);
    int guards = 0;
    qkv_status s = ao_lib_backward(&p, QKV_F64, QKV_IMPL_REFERENCE, 1, dout, 0, &g, &guards);
    CHECK(s == QKV_OK, "%s seed %llu: backward status %d (%s): %s", label, (unsigned long long)seed, (int)s,
          qkv_status_string(s), desc);
    CHECK(guards, "%s seed %llu: backward wrote outside a buffer: %s", label, (unsigned long long)seed, desc);
    if (s != QKV_OK) goto done;

    /* Finite differences for every input element. */
    for (int t = AO_Q; t <= AO_W; t++) {
        double *an = grad_of(&g, t);
        if (!p.n[t] || !an) continue;
        double worst = 0.0, w_fd = 0.0, w_an = 0.0;
        size_t wi = 0;
        for (size_t i = 0; i < p.n[t]; i++) {
            double save = p.x[t][i];
            p.x[t][i] = save + FD_STEP;
            double Lp = loss(&p, dout, out);
            p.x[t][i] = save - FD_STEP;
            double Lm = loss(&p, dout, out);
            p.x[t][i] = save;
            double fd = save == -INFINITY ? 0.0 : (Lp - Lm) / (2.0 * FD_STEP);
            double e = fabs(an[i] - fd) / (FD_ATOL + FD_RTOL * fabs(fd));
            if (!(e <= worst)) { /* also catches NaN */
                worst = isnan(e) ? INFINITY : e;
                wi = i;
                w_fd = fd;
                w_an = an[i];
            }
        }
        if (worst > worst_seen) worst_seen = worst;
        CHECK(worst <= 1.0,
              "%s seed %llu: %s[%zu] analytic %.12g vs finite difference %.12g (%.3g tolerances): %s", label,
              (unsigned long long)seed, TENSOR_NAMES[t], wi, w_an, w_fd, worst, desc);
    }

    /* out and lse passed: bitwise the same (the reference recomputes). */
    {
        ao_grads g2;
        grads_alloc(&g2, &p);
        CHECK_STATUS(ao_lib_backward(&p, QKV_F64, QKV_IMPL_REFERENCE, 1, dout, 1, &g2, NULL), QKV_OK);
        int same = 1;
        for (int t = AO_Q; t <= AO_W; t++)
            if (grad_of(&g, t)) same &= same_bits(grad_of(&g, t), grad_of(&g2, t), p.n[t]);
        CHECK(same, "%s seed %llu: gradients differ with out/lse passed vs NULL: %s", label,
              (unsigned long long)seed, desc);
        grads_free(&g2);
    }
    /* Optional gradients NULL: the required ones are unchanged. */
    {
        ao_grads g3 = {dalloc(p.n[AO_Q]), dalloc(p.n[AO_K]), dalloc(p.n[AO_V]), NULL, NULL, NULL, NULL};
        CHECK_STATUS(ao_lib_backward(&p, QKV_F64, QKV_IMPL_REFERENCE, 2, dout, 0, &g3, &guards), QKV_OK);
        CHECK(same_bits(g.dq, g3.dq, p.n[AO_Q]) && same_bits(g.dk, g3.dk, p.n[AO_K]) &&
                  same_bits(g.dv, g3.dv, p.n[AO_V]),
              "%s seed %llu: dq/dk/dv change when the optional gradients are NULL: %s", label,
              (unsigned long long)seed, desc);
        grads_free(&g3);
    }
    /* AUTO in F64 agrees with REFERENCE. */
    {
        ao_grads g4;
        grads_alloc(&g4, &p);
        CHECK_STATUS(ao_lib_backward(&p, QKV_F64, QKV_IMPL_AUTO, 0, dout, 1, &g4, &guards), QKV_OK);
        CHECK(guards, "%s: AUTO backward wrote outside a buffer", label);
        for (int t = AO_Q; t <= AO_W; t++) {
            if (!grad_of(&g, t)) continue;
            size_t w;
            double e = ao_cmp(grad_of(&g4, t), grad_of(&g, t), p.n[t], 1e-10, 1e-10, &w);
            CHECK(e <= 1.0, "%s seed %llu: AUTO %s[%zu] %.17g vs REFERENCE %.17g: %s", label,
                  (unsigned long long)seed, TENSOR_NAMES[t], w, grad_of(&g4, t)[w], grad_of(&g, t)[w], desc);
        }
        grads_free(&g4);
    }
    /* F32: the same problem rounded to float, against F64 on those values. */
    {
        ao_prob_round_f32(&p);
        for (size_t i = 0; i < p.n[AO_O]; i++) dout[i] = (double)(float)dout[i];
        ao_grads g64, g32;
        grads_alloc(&g64, &p);
        grads_alloc(&g32, &p);
        CHECK_STATUS(ao_lib_backward(&p, QKV_F64, QKV_IMPL_REFERENCE, 1, dout, 0, &g64, NULL), QKV_OK);
        CHECK_STATUS(ao_lib_backward(&p, QKV_F32, QKV_IMPL_REFERENCE, 1, dout, 1, &g32, &guards), QKV_OK);
        CHECK(guards, "%s: F32 backward wrote outside a buffer", label);
        for (int t = AO_Q; t <= AO_W; t++) {
            if (!grad_of(&g, t)) continue;
            size_t w;
            double e = ao_cmp(grad_of(&g32, t), grad_of(&g64, t), p.n[t], 1e-7, 1e-6, &w);
            CHECK(e <= 1.0, "%s seed %llu: F32 %s[%zu] %.9g vs F64 %.17g: %s", label, (unsigned long long)seed,
                  TENSOR_NAMES[t], w, grad_of(&g32, t)[w], grad_of(&g64, t)[w], desc);
        }
        /* AUTO in F32 (a float fast path where there is one): no naive
         * float backward exists here to size the fast-path k * naive32 rule,
         * so a fixed bound: 2e-5 of the tensor's largest magnitude (>= 1).
         * A float row of <= 13 terms errs by ~1e-6 relative; a wrong term
         * is off by far more. */
        ao_grads ga;
        grads_alloc(&ga, &p);
        CHECK_STATUS(ao_lib_backward(&p, QKV_F32, QKV_IMPL_AUTO, 0, dout, 1, &ga, &guards), QKV_OK);
        CHECK(guards, "%s: F32 AUTO backward wrote outside a buffer", label);
        for (int t = AO_Q; t <= AO_W; t++) {
            if (!grad_of(&g, t)) continue;
            double big = 1.0;
            for (size_t i = 0; i < p.n[t]; i++) big = fmax(big, fabs(grad_of(&g64, t)[i]));
            size_t w;
            double e = ao_cmp(grad_of(&ga, t), grad_of(&g64, t), p.n[t], 2e-5 * big, 0.0, &w);
            if (e > worst_auto32) worst_auto32 = e;
            CHECK(e <= 1.0, "%s seed %llu: F32 AUTO %s[%zu] %.9g vs F64 %.17g (%.3g tolerances): %s", label,
                  (unsigned long long)seed, TENSOR_NAMES[t], w, grad_of(&ga, t)[w], grad_of(&g64, t)[w], e, desc);
        }
        grads_free(&ga);
        grads_free(&g64);
        grads_free(&g32);
    }
done:
    grads_free(&g);
    free(dout);
    free(out);
    ao_prob_free(&p);
}

/* Every score x normaliser x mask x shape. */
static void test_sweep(void) {
    int n = 0;
    for (int score = 0; score < 4; score++)
        for (int norm4 = 0; norm4 < 4; norm4++)
            for (int m = 0; m < AO_NUM_MASKS; m++)
                for (int si = 0; si < NSHAPES; si++) {
                    qkv_attn_desc d;
                    ao_mask_store st;
                    desc_from(&d, &SHAPES[si], score, norm4);
                    const char *mname = ao_mask_config(&d, m, &st);
                    int v = n++ % 3;
                    if (v == 1) d.softcap = 1.5;
                    if (score == QKV_SCORE_SCALED_DOT && v == 2) d.scale = 0.8;
                    if (score == QKV_SCORE_COSINE && v != 0) d.temperature = 0.4;
                    char label[128];
                    snprintf(label, sizeof label, "grad %s %s shape %d", NORM_NAMES[norm4], mname, si);
                    grad_case(&d, 20000u + (uint64_t)n, label);
                }
}

/* A few larger logit scales and the default threads (0) path, plus a case
 * where every head shares one key/value head and keys outnumber queries. */
static void test_extra(void) {
    shape s = {2, 3, 6, 4, 1, 2, 3};
    for (int score = 0; score < 4; score++) {
        qkv_attn_desc d;
        desc_from(&d, &s, score, 0);
        d.mask = QKV_MASK_CAUSAL_WINDOW;
        d.window_left = 3;
        d.softcap = 4.0;
        grad_case(&d, 30000u + (uint64_t)score, "grad extra causal-window(3) softcap 4 MQA");
    }
}

int main(void) {
    test_sweep();
    test_extra();
    printf("largest finite-difference error: %.3g of the tolerance (%g + %g |fd|)\n", worst_seen, FD_ATOL,
           FD_RTOL);
    printf("largest F32 AUTO backward error: %.3g of the tolerance\n", worst_auto32);
    return tu_finish();
}
