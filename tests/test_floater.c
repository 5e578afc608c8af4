/* FLOATER: gradients through the RK4 solver by finite differences in double,
 * an exact solution, and extrapolation: trained on positions 0..15 to follow
 * a rotation (the flow that sinusoidal encodings come from), it keeps
 * following it at positions it never saw. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "layers/floater_internal.h"
#include "test_util.h"

static void test_gradcheck(void) {
    floater_core c;
    memset(&c, 0, sizeof c);
    c.dim = 3;
    c.hidden = 4;
    c.substeps = 3;
    c.delta = 0.4;
    c.work = calloc((size_t)(9 * c.dim + 3 * c.hidden), sizeof(double));
    int64_t np = floater_n_params(c.dim, c.hidden);
    double *th = malloc((size_t)np * sizeof(double)), *g = calloc((size_t)np, sizeof(double));
    enum { N = 6 };
    double pos[N * 3], w[N * 3];
    tu_rng r;
    tu_rng_seed(&r, 8);
    tu_fill_normal_f64(&r, th, (size_t)np, 0.7);
    tu_fill_normal_f64(&r, w, N * 3, 1.0);
    CHECK_STATUS(floater_core_forward(&c, th, N, pos), QKV_OK);
    CHECK_STATUS(floater_core_backward(&c, th, w, g), QKV_OK);
    double worst = 0;
    for (int64_t i = 0; i < np; i++) {
        double keep = th[i], h = 1e-6, lp = 0, lm = 0;
        th[i] = keep + h;
        floater_core_forward(&c, th, N, pos);
        for (int j = 0; j < N * 3; j++) lp += pos[j] * w[j];
        th[i] = keep - h;
        floater_core_forward(&c, th, N, pos);
        for (int j = 0; j < N * 3; j++) lm += pos[j] * w[j];
        th[i] = keep;
        double fd = (lp - lm) / (2 * h), e = fabs(fd - g[i]) / (1e-6 + fabs(fd));
        if (e > worst) worst = e;
    }
    /* Central differences in double: ~1e-9 truncation and rounding. */
    CHECK(worst < 1e-5, "FLOATER gradient through RK4: worst relative error %g", worst);
    free(c.work);
    qkv_free(c.traj); /* the library allocated it (qkv_alloc) */
    free(th);
    free(g);
}

/* With W2 = 0 the field is the constant b2: p(t) = p0 + b2 t, which RK4
 * integrates exactly. */
static void test_exact(void) {
    qkv_floater *f = NULL;
    CHECK_STATUS(qkv_floater_create(2, 3, 0.5, 2, 1, &f), QKV_OK);
    if (!f) return;
    int64_t np;
    float *p = qkv_floater_params(f, &np);
    memset(p, 0, (size_t)np * sizeof(float));
    p[0] = 1.0f;                    /* p0 */
    p[np - 2] = 2.0f;               /* b2 */
    p[np - 1] = -1.0f;
    float pos[10 * 2];
    CHECK_STATUS(qkv_floater_forward(f, 10, pos), QKV_OK);
    double e = 0;
    for (int i = 0; i < 10; i++) {
        e = fmax(e, fabs(pos[2 * i] - (1.0 + 2.0 * 0.5 * i)));
        e = fmax(e, fabs(pos[2 * i + 1] - (-1.0 * 0.5 * i)));
    }
    CHECK(e < 1e-6, "constant field integrates exactly: %g", e);
    qkv_floater_free(f);
}

static void test_extrapolation(void) {
    enum { TRAIN = 16, TEST = 48, D = 2, HID = 32 };
    const double w = 0.35; /* radians per position */
    qkv_floater *f = NULL;
    CHECK_STATUS(qkv_floater_create(D, HID, 1.0, 4, 3, &f), QKV_OK);
    if (!f) return;
    int64_t np;
    float *p = qkv_floater_params(f, &np), *g = qkv_floater_grads(f, NULL);
    double *m = calloc((size_t)np, sizeof(double)), *v = calloc((size_t)np, sizeof(double));
    float pos[TEST * D], dpos[TEST * D];
    double loss = 0;
    /* An autonomous field (w_t = 0, kept there by the optimiser below): a
     * flow that does not depend on the clock is what carries over to times
     * never seen; FLOATER's field may use t, this experiment chooses not to. */
    const int64_t wt_at = D + HID * D;
    for (int a = 0; a < HID; a++) p[wt_at + a] = 0.0f;
    p[0] = 1.0f; /* p(0) starts where the curve does; it is still trained */
    p[1] = 0.0f;
    /* Adam on the mean squared distance to (cos wt, sin wt), t < 16 only. */
    for (int step = 1; step <= 3000; step++) {
        qkv_floater_forward(f, TRAIN, pos);
        loss = 0;
        for (int i = 0; i < TRAIN; i++) {
            double tx = cos(w * i), ty = sin(w * i);
            dpos[2 * i] = (float)(2 * (pos[2 * i] - tx) / TRAIN);
            dpos[2 * i + 1] = (float)(2 * (pos[2 * i + 1] - ty) / TRAIN);
            loss += ((pos[2 * i] - tx) * (pos[2 * i] - tx) + (pos[2 * i + 1] - ty) * (pos[2 * i + 1] - ty)) / TRAIN;
        }
        qkv_floater_zero_grad(f);
        qkv_floater_backward(f, dpos);
        for (int a = 0; a < HID; a++) g[wt_at + a] = 0.0f;
        double lr = step < 2000 ? 1e-2 : 2e-3; /* tuned: 3e-2 diverges, 3e-3 is slow */
        for (int64_t i = 0; i < np; i++) {
            m[i] = 0.9 * m[i] + 0.1 * g[i];
            v[i] = 0.999 * v[i] + 0.001 * (double)g[i] * g[i];
            double mh = m[i] / (1 - pow(0.9, step)), vh = v[i] / (1 - pow(0.999, step));
            p[i] -= (float)(lr * mh / (sqrt(vh) + 1e-8));
        }
    }
    CHECK(loss < 1e-4, "FLOATER fits the training positions: loss %g", loss);
    qkv_floater_forward(f, TEST, pos);
    double worst = 0;
    for (int i = TRAIN; i < TEST; i++)
        worst = fmax(worst, hypot(pos[2 * i] - cos(w * i), pos[2 * i + 1] - sin(w * i)));
    printf("FLOATER: training loss %.2e on positions 0..%d; largest distance to the rotation at positions "
           "%d..%d (never trained): %.3f\n", loss, TRAIN - 1, TRAIN, TEST - 1, worst);
    /* A learned table has no rows past 15 at all; FLOATER stays on the circle. */
    CHECK(worst < 0.25, "FLOATER extrapolates to unseen positions: distance %g", worst);
    float table[TRAIN * D], x[TEST * D];
    memset(x, 0, sizeof x);
    CHECK_STATUS(qkv_posenc_learned_forward(table, TRAIN, D, 1, TEST, 0, x), QKV_ERR_POSITION);
    free(m);
    free(v);
    qkv_floater_free(f);
}

static void test_errors(void) {
    qkv_floater *f = NULL;
    float x[4];
    CHECK_STATUS(qkv_floater_create(0, 3, 1.0, 1, 1, &f), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_floater_create(2, 3, 0.0, 1, 1, &f), QKV_ERR_BAD_PARAMETER);
    CHECK_STATUS(qkv_floater_create(2, 3, NAN, 1, 1, &f), QKV_ERR_BAD_PARAMETER);
    CHECK_STATUS(qkv_floater_create(2, 3, 1.0, 0, 1, &f), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_floater_create(2, 3, 1.0, 1, 1, NULL), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_floater_create(2, 3, 1.0, 1, 1, &f), QKV_OK);
    CHECK_STATUS(qkv_floater_backward(f, x), QKV_ERR_UNSUPPORTED);
    CHECK_STATUS(qkv_floater_forward(f, 0, x), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_floater_forward(f, 2, NULL), QKV_ERR_NULL_POINTER);
    qkv_floater_free(f);
    qkv_floater_free(NULL);
}

int main(void) {
    test_gradcheck();
    test_exact();
    test_extrapolation();
    test_errors();
    return tu_finish();
}
