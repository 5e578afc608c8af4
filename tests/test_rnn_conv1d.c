/* The layers of the complexity table: Elman RNN, LSTM and 1-D convolution.
 * Forward against plain double loops of the defining equations; backward
 * against central finite differences of L = sum(out * r) over every weight,
 * bias and input (float forward: step 1e-2, tolerance covering L's float
 * rounding / step); gradients accumulate; error paths. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "support/baselines.h"
#include "test_util.h"

enum { RNN, LSTM, CONV };

typedef struct prob {
    int kind;
    int64_t n, din, d, k, dil;  /* conv: din = c_in, d = c_out */
    float *wx, *wh, *b, *x, *r, *out, *cache;
    int64_t nwx, nwh, nb, nx, nout;
} prob;

static double run_loss(prob *p) {
    qkv_status s;
    if (p->kind == RNN)
        s = qkv_rnn_forward(p->n, p->din, p->d, p->wx, p->wh, p->b, p->x, p->out);
    else if (p->kind == LSTM)
        s = qkv_lstm_forward(p->n, p->din, p->d, p->wx, p->wh, p->b, p->x, p->out, p->cache);
    else
        s = qkv_conv1d_forward(p->n, p->din, p->d, p->k, p->dil, p->wx, p->b, p->x, p->out);
    if (s != QKV_OK) return NAN;
    double l = 0;
    for (int64_t i = 0; i < p->nout; i++) l += (double)p->out[i] * p->r[i];
    return l;
}

static void ref_forward(const prob *p, double *y) {
    const int64_t n = p->n, di = p->din, d = p->d;
    if (p->kind == CONV) {
        for (int64_t t = 0; t < n; t++)
            for (int64_t o = 0; o < d; o++) {
                double acc = p->b[o];
                for (int64_t c = 0; c < di; c++)
                    for (int64_t j = 0; j < p->k; j++) {
                        int64_t tt = t + p->dil * (j - (p->k - 1) / 2);
                        if (tt >= 0 && tt < n) acc += (double)p->wx[(o * di + c) * p->k + j] * p->x[tt * di + c];
                    }
                y[t * d + o] = acc;
            }
        return;
    }
    const int64_t G = p->kind == LSTM ? 4 : 1;
    double *h = calloc((size_t)d, 8), *c = calloc((size_t)d, 8), *z = malloc((size_t)(G * d) * 8);
    for (int64_t t = 0; t < n; t++) {
        for (int64_t i = 0; i < G * d; i++) {
            double a = p->b[i];
            for (int64_t j = 0; j < di; j++) a += (double)p->wx[i * di + j] * p->x[t * di + j];
            for (int64_t j = 0; j < d; j++) a += (double)p->wh[i * d + j] * h[j];
            z[i] = a;
        }
        for (int64_t i = 0; i < d; i++) {
            if (p->kind == RNN) {
                h[i] = tanh(z[i]);
            } else {
                double ig = 1 / (1 + exp(-z[i])), fg = 1 / (1 + exp(-z[d + i])), gg = tanh(z[2 * d + i]),
                       og = 1 / (1 + exp(-z[3 * d + i]));
                c[i] = fg * c[i] + ig * gg;
                h[i] = og * tanh(c[i]);
            }
        }
        for (int64_t i = 0; i < d; i++) y[t * d + i] = h[i];
    }
    free(h), free(c), free(z);
}

static void check(tu_rng *rng, int kind, int64_t n, int64_t din, int64_t d, int64_t k, int64_t dil) {
    prob p;
    memset(&p, 0, sizeof p);
    p.kind = kind;
    p.n = n, p.din = din, p.d = d, p.k = k, p.dil = dil;
    int64_t G = kind == LSTM ? 4 : 1;
    p.nwx = kind == CONV ? d * din * k : G * d * din;
    p.nwh = kind == CONV ? 0 : G * d * d;
    p.nb = G * d;
    p.nx = n * din;
    p.nout = n * d;
    p.wx = malloc((size_t)p.nwx * 4);
    p.wh = malloc((size_t)(p.nwh + 1) * 4);
    p.b = malloc((size_t)p.nb * 4);
    p.x = malloc((size_t)p.nx * 4);
    p.r = malloc((size_t)p.nout * 4);
    p.out = tu_guarded_alloc((size_t)p.nout * 4);
    p.cache = tu_guarded_alloc((size_t)(n * 6 * d) * 4);
    tu_fill_normal_f32(rng, p.wx, (size_t)p.nwx, 0.5);
    tu_fill_normal_f32(rng, p.wh, (size_t)p.nwh + 1, 0.5);
    tu_fill_normal_f32(rng, p.b, (size_t)p.nb, 0.5);
    tu_fill_normal_f32(rng, p.x, (size_t)p.nx, 1.0);
    tu_fill_normal_f32(rng, p.r, (size_t)p.nout, 1.0);
    const char *name = kind == RNN ? "rnn" : kind == LSTM ? "lstm" : "conv1d";

    double l0 = run_loss(&p);
    double *yr = malloc((size_t)p.nout * 8);
    ref_forward(&p, yr);
    double ef = tu_max_abs_diff_f32_f64(p.out, yr, (size_t)p.nout);
    CHECK(ef < 1e-5 && !isnan(l0), "%s n %lld: forward vs double %g", name, (long long)n, ef);
    free(yr);

    float *dwx = calloc((size_t)p.nwx, 4), *dwh = calloc((size_t)p.nwh + 1, 4), *db = calloc((size_t)p.nb, 4);
    float *dx = tu_guarded_alloc((size_t)p.nx * 4);
    qkv_status s;
    if (kind == RNN)
        s = qkv_rnn_backward(n, din, d, p.wx, p.wh, p.x, p.out, p.r, dx, dwx, dwh, db);
    else if (kind == LSTM)
        s = qkv_lstm_backward(n, din, d, p.wx, p.wh, p.x, p.out, p.cache, p.r, dx, dwx, dwh, db);
    else
        s = qkv_conv1d_backward(n, din, d, k, dil, p.wx, p.x, p.r, dx, dwx, db);
    CHECK(s == QKV_OK, "%s backward: %s", name, qkv_status_string(s));
    CHECK(tu_guarded_ok(p.out) && tu_guarded_ok(dx) && tu_guarded_ok(p.cache), "%s guards", name);

    float *arrs[4] = {p.wx, p.wh, p.b, p.x};
    const float *grads[4] = {dwx, dwh, db, dx};
    int64_t counts[4] = {p.nwx, p.nwh, p.nb, p.nx};
    const float eps = 1e-2f;
    double worst = 0;
    int worst_a = -1;
    int64_t worst_i = -1;
    for (int a = 0; a < 4; a++)
        for (int64_t i = 0; i < counts[a]; i++) {
            float keep = arrs[a][i];
            arrs[a][i] = keep + eps;
            double lp = run_loss(&p);
            arrs[a][i] = keep - eps;
            double lm = run_loss(&p);
            arrs[a][i] = keep;
            double num = (lp - lm) / (2.0 * eps);
            double bad = fabs(num - grads[a][i]) / (3e-3 + 1e-2 * fabs(num));
            if (bad > worst) worst = bad, worst_a = a, worst_i = i;
        }
    CHECK(worst <= 1.0, "%s n %lld din %lld d %lld k %lld dil %lld: finite differences, worst array %d index %lld "
          "(%g of tolerance)", name, (long long)n, (long long)din, (long long)d, (long long)k, (long long)dil, worst_a,
          (long long)worst_i, worst);
    /* Accumulation of parameter gradients (dx is overwritten); the forward
     * again first, so h and the cache are those of the unperturbed inputs. */
    run_loss(&p);
    float *dwx2 = malloc((size_t)p.nwx * 4);
    memcpy(dwx2, dwx, (size_t)p.nwx * 4);
    if (kind == RNN)
        s = qkv_rnn_backward(n, din, d, p.wx, p.wh, p.x, p.out, p.r, NULL, dwx, dwh, NULL);
    else if (kind == LSTM)
        s = qkv_lstm_backward(n, din, d, p.wx, p.wh, p.x, p.out, p.cache, p.r, NULL, dwx, dwh, NULL);
    else
        s = qkv_conv1d_backward(n, din, d, k, dil, p.wx, p.x, p.r, NULL, dwx, NULL);
    int acc_ok = s == QKV_OK;
    for (int64_t i = 0; i < p.nwx; i++)
        if (fabsf(dwx[i] - 2 * dwx2[i]) > 1e-5f * (1 + fabsf(dwx2[i]))) acc_ok = 0;
    CHECK(acc_ok, "%s: gradients accumulate", name);
    free(dwx2);
    free(p.wx), free(p.wh), free(p.b), free(p.x), free(p.r), free(dwx), free(dwh), free(db);
    tu_guarded_free(p.out), tu_guarded_free(p.cache), tu_guarded_free(dx);
}

int main(void) {
    tu_rng rng;
    tu_rng_seed(&rng, 1997);
    check(&rng, RNN, 1, 2, 3, 0, 0);
    check(&rng, RNN, 7, 3, 4, 0, 0);
    check(&rng, RNN, 12, 5, 2, 0, 0);
    check(&rng, LSTM, 1, 2, 3, 0, 0);
    check(&rng, LSTM, 6, 3, 4, 0, 0);
    check(&rng, LSTM, 9, 2, 3, 0, 0);
    check(&rng, CONV, 1, 2, 3, 3, 1);
    check(&rng, CONV, 9, 3, 2, 3, 1);
    check(&rng, CONV, 10, 2, 3, 5, 2);
    check(&rng, CONV, 4, 2, 2, 7, 3); /* taps beyond both ends */
    check(&rng, CONV, 13, 1, 1, 1, 1);

    float w[8] = {0}, x[8] = {0}, y[8];
    CHECK_STATUS(qkv_rnn_forward(0, 1, 1, w, w, NULL, x, y), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_rnn_forward(2, 1, 1, NULL, w, NULL, x, y), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_rnn_forward(INT64_MAX / 2, 1, 4, w, w, NULL, x, y), QKV_ERR_SIZE_OVERFLOW);
    CHECK_STATUS(qkv_lstm_forward(2, 1, 1, w, w, NULL, x, y, NULL), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_lstm_backward(2, 1, 0, w, w, x, y, y, y, NULL, w, w, NULL), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_conv1d_forward(4, 1, 1, 2, 1, w, NULL, x, y), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_conv1d_forward(4, 1, 1, 3, 0, w, NULL, x, y), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_conv1d_backward(4, 1, 1, 3, 1, w, x, y, NULL, NULL, NULL), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_conv1d_forward(4, 1, 1, 3, INT64_MAX / 2, w, NULL, x, y), QKV_ERR_SIZE_OVERFLOW);
    return tu_finish();
}
