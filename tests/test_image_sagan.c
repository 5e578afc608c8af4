/* The SAGAN self-attention block: forward against a plain double
 * implementation of the paper's equations (beta, o, gamma o + x), the
 * identity at initialisation (gamma = 0), and the backward against central
 * finite differences of L = sum(y * r) for every parameter and input. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

/* Plain double forward: y [N, C], beta [N, N]. */
static void ref_forward(const float *P, int64_t N, int64_t C, int64_t Ck, const float *x, double *y, double *beta) {
    const float *wf = P, *bf = wf + Ck * C, *wg = bf + Ck, *bg = wg + Ck * C, *wh = bg + Ck, *bh = wh + C * C,
                *gamma = bh + C;
    double *f = malloc((size_t)(N * Ck) * 8), *g = malloc((size_t)(N * Ck) * 8), *h = malloc((size_t)(N * C) * 8);
    for (int64_t n = 0; n < N; n++) {
        for (int64_t k = 0; k < Ck; k++) {
            double a = bf[k], b = bg[k];
            for (int64_t c = 0; c < C; c++) {
                a += (double)wf[k * C + c] * x[n * C + c];
                b += (double)wg[k * C + c] * x[n * C + c];
            }
            f[n * Ck + k] = a;
            g[n * Ck + k] = b;
        }
        for (int64_t k = 0; k < C; k++) {
            double a = bh[k];
            for (int64_t c = 0; c < C; c++) a += (double)wh[k * C + c] * x[n * C + c];
            h[n * C + k] = a;
        }
    }
    for (int64_t j = 0; j < N; j++) {
        double m = -INFINITY, sum = 0;
        for (int64_t i = 0; i < N; i++) {
            double s = 0;
            for (int64_t k = 0; k < Ck; k++) s += f[i * Ck + k] * g[j * Ck + k];
            beta[j * N + i] = s;
            if (s > m) m = s;
        }
        for (int64_t i = 0; i < N; i++) sum += (beta[j * N + i] = exp(beta[j * N + i] - m));
        for (int64_t i = 0; i < N; i++) beta[j * N + i] /= sum;
        for (int64_t c = 0; c < C; c++) {
            double o = 0;
            for (int64_t i = 0; i < N; i++) o += beta[j * N + i] * h[i * C + c];
            y[j * C + c] = *gamma * o + x[j * C + c];
        }
    }
    free(f), free(g), free(h);
}

static double loss(qkv_sagan *s, int64_t H, int64_t W, const float *x, const float *r, float *y) {
    int64_t count;
    qkv_sagan_params(s, &count);
    (void)count;
    qkv_status st = qkv_sagan_forward(s, H, W, x, y, NULL);
    if (st != QKV_OK) return NAN;
    int64_t n = H * W * 4; /* C = 4 in the gradient test */
    double l = 0;
    for (int64_t i = 0; i < n; i++) l += (double)y[i] * r[i];
    return l;
}

int main(void) {
    tu_rng rng;
    tu_rng_seed(&rng, 19);
    /* Forward against the double reference, also the attention matrix. */
    {
        int64_t H = 5, W = 6, N = H * W, C = 8, Ck = 2;
        qkv_sagan *s;
        CHECK_STATUS(qkv_sagan_create(C, Ck, 3, &s), QKV_OK);
        int64_t np;
        float *P = qkv_sagan_params(s, &np);
        CHECK(np == 2 * (Ck * C + Ck) + C * C + C + 1, "param count %lld", (long long)np);
        float *x = malloc((size_t)(N * C) * 4), *y = tu_guarded_alloc((size_t)(N * C) * 4);
        float *beta = tu_guarded_alloc((size_t)(N * N) * 4);
        double *yr = malloc((size_t)(N * C) * 8), *br = malloc((size_t)(N * N) * 8);
        tu_fill_normal_f32(&rng, x, (size_t)(N * C), 1.0);
        /* Identity at initialisation (gamma = 0). */
        CHECK_STATUS(qkv_sagan_forward(s, H, W, x, y, NULL), QKV_OK);
        CHECK(memcmp(x, y, (size_t)(N * C) * 4) == 0, "gamma = 0 is the identity");
        tu_fill_normal_f32(&rng, P, (size_t)np, 0.5);
        CHECK_STATUS(qkv_sagan_forward(s, H, W, x, y, beta), QKV_OK);
        ref_forward(P, N, C, Ck, x, yr, br);
        double ey = tu_max_abs_diff_f32_f64(y, yr, (size_t)(N * C)), eb = tu_max_abs_diff_f32_f64(beta, br, (size_t)(N * N));
        CHECK(ey < 1e-4 && eb < 1e-5, "forward vs double: y %g beta %g", ey, eb);
        CHECK(tu_guarded_ok(y) && tu_guarded_ok(beta), "guards");
        CHECK_STATUS(qkv_sagan_forward(s, 0, W, x, y, NULL), QKV_ERR_BAD_SIZE);
        CHECK_STATUS(qkv_sagan_forward(s, H, W, NULL, y, NULL), QKV_ERR_NULL_POINTER);
        CHECK_STATUS(qkv_sagan_forward(s, INT64_MAX / 2, 4, x, y, NULL), QKV_ERR_SIZE_OVERFLOW);
        qkv_sagan_free(s);
        free(x), free(yr), free(br);
        tu_guarded_free(y), tu_guarded_free(beta);
    }
    /* Errors of create/backward. */
    {
        qkv_sagan *s = NULL;
        CHECK_STATUS(qkv_sagan_create(0, 1, 1, &s), QKV_ERR_BAD_SIZE);
        CHECK_STATUS(qkv_sagan_create(4, 1, 1, NULL), QKV_ERR_NULL_POINTER);
        CHECK_STATUS(qkv_sagan_create(INT64_MAX / 2, 4, 1, &s), QKV_ERR_SIZE_OVERFLOW);
        CHECK_STATUS(qkv_sagan_create(4, 2, 1, &s), QKV_OK);
        float x[8] = {0}, dy[8] = {0};
        CHECK_STATUS(qkv_sagan_backward(s, x, dy, NULL), QKV_ERR_UNSUPPORTED);
        qkv_sagan_free(s);
        qkv_sagan_free(NULL);
    }
    /* Gradients by central differences (float forward: step 1e-2, checked
     * with a tolerance that covers the float rounding of L / step). */
    {
        int64_t H = 3, W = 4, N = H * W, C = 4, Ck = 2;
        qkv_sagan *s;
        CHECK_STATUS(qkv_sagan_create(C, Ck, 11, &s), QKV_OK);
        int64_t np;
        float *P = qkv_sagan_params(s, &np), *G = qkv_sagan_grads(s, NULL);
        tu_fill_normal_f32(&rng, P, (size_t)np, 0.6);
        P[np - 1] = 0.8f; /* gamma */
        float *x = malloc((size_t)(N * C) * 4), *r = malloc((size_t)(N * C) * 4), *y = malloc((size_t)(N * C) * 4);
        float *dx = malloc((size_t)(N * C) * 4);
        tu_fill_normal_f32(&rng, x, (size_t)(N * C), 1.0);
        tu_fill_normal_f32(&rng, r, (size_t)(N * C), 1.0);
        qkv_sagan_zero_grad(s);
        loss(s, H, W, x, r, y);
        CHECK_STATUS(qkv_sagan_backward(s, x, r, dx), QKV_OK);
        /* Accumulation: a second backward doubles the parameter gradients. */
        float *G1 = malloc((size_t)np * 4);
        memcpy(G1, G, (size_t)np * 4);
        CHECK_STATUS(qkv_sagan_backward(s, x, r, NULL), QKV_OK);
        int accum_ok = 1;
        for (int64_t i = 0; i < np; i++)
            if (fabsf(G[i] - 2 * G1[i]) > 1e-5f * (1 + fabsf(G1[i]))) accum_ok = 0;
        CHECK(accum_ok, "gradients accumulate");
        const float eps = 1e-2f;
        double worst = 0;
        int64_t worst_i = -1;
        for (int64_t i = 0; i < np + N * C; i++) {
            float *t = i < np ? &P[i] : &x[i - np];
            float keep = *t;
            *t = keep + eps;
            double lp = loss(s, H, W, x, r, y);
            *t = keep - eps;
            double lm = loss(s, H, W, x, r, y);
            *t = keep;
            double num = (lp - lm) / (2.0 * eps), ana = i < np ? G1[i] : dx[i - np];
            double bad = fabs(num - ana) / (2e-3 + 1e-2 * fabs(num));
            if (bad > worst) {
                worst = bad;
                worst_i = i;
            }
        }
        CHECK(worst <= 1.0, "finite differences: worst index %lld (ratio to tolerance %g)", (long long)worst_i, worst);
        printf("sagan: %lld parameters + %lld inputs checked, worst error / tolerance %.3g\n", (long long)np,
               (long long)(N * C), worst);
        qkv_sagan_free(s);
        free(x), free(r), free(y), free(dx), free(G1);
    }
    return tu_finish();
}
