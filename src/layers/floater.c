/* FLOATER positions (Liu et al. 2020): a neural ODE integrated with
 * fixed-step RK4 and differentiated through the solver step by step (the
 * adjoint of the discrete scheme, so gradients are exact for what the
 * forward computed). All arithmetic in double. */
#include <math.h>
#include <string.h>

#include "core/internal.h"
#include "core/rng.h"
#include "layers/floater_internal.h"

/* out = f(t, u); s receives the hidden activations tanh(z). */
static void field(const floater_core *c, const double *th, double t, const double *u, double *out,
                  double *s) {
    const int64_t d = c->dim, h = c->hidden;
    const double *W1 = th + FL_W1(c), *wt = th + FL_WT(c), *b1 = th + FL_B1(c), *W2 = th + FL_W2(c),
                 *b2 = th + FL_B2(c);
    for (int64_t a = 0; a < h; a++) {
        double z = b1[a] + wt[a] * t;
        for (int64_t i = 0; i < d; i++) z += W1[a * d + i] * u[i];
        s[a] = tanh(z);
    }
    for (int64_t i = 0; i < d; i++) {
        double acc = b2[i];
        for (int64_t a = 0; a < h; a++) acc += W2[i * h + a] * s[a];
        out[i] = acc;
    }
}

/* Vector-Jacobian product of f at (t, u) with cotangent g: adds dθ into
 * gth and writes du = (df/du)ᵀ g. */
static void field_vjp(const floater_core *c, const double *th, double t, const double *u, const double *g,
                      double *gth, double *du, double *s, double *dz) {
    const int64_t d = c->dim, h = c->hidden;
    const double *W1 = th + FL_W1(c), *W2 = th + FL_W2(c);
    field(c, th, t, u, du, s); /* recompute s; du is scratch here */
    for (int64_t a = 0; a < h; a++) {
        double ds = 0.0;
        for (int64_t i = 0; i < d; i++) {
            ds += W2[i * h + a] * g[i];
            gth[FL_W2(c) + i * h + a] += g[i] * s[a];
        }
        dz[a] = ds * (1.0 - s[a] * s[a]);
        gth[FL_WT(c) + a] += dz[a] * t;
        gth[FL_B1(c) + a] += dz[a];
        for (int64_t i = 0; i < d; i++) gth[FL_W1(c) + a * d + i] += dz[a] * u[i];
    }
    for (int64_t i = 0; i < d; i++) {
        gth[FL_B2(c) + i] += g[i];
        double acc = 0.0;
        for (int64_t a = 0; a < h; a++) acc += W1[a * d + i] * dz[a];
        du[i] = acc;
    }
}

int64_t floater_n_params(int64_t dim, int64_t hidden) { return 2 * dim + hidden * (2 * dim + 2); }

qkv_status floater_core_forward(floater_core *c, const double *th, int64_t n, double *pos) {
    const int64_t d = c->dim, steps = (n - 1) * c->substeps;
    int64_t f[2] = {steps + 1, d}, cnt;
    if (!qkv_count_ok(&cnt, sizeof(double), 2, f)) return QKV_ERR_SIZE_OVERFLOW;
    if (!qkv_reserve(&c->traj, &c->traj_cap, cnt, sizeof(double))) return QKV_ERR_OUT_OF_MEMORY;
    double *y = c->traj, *k = c->work, *u = k + 4 * d, *s = u + d;
    const double dt = c->delta / (double)c->substeps;
    memcpy(y, th + FL_P0(c), (size_t)d * sizeof(double));
    for (int64_t st = 0; st < steps; st++) {
        const double *yk = y + st * d, t = (double)st * dt;
        double *yn = y + (st + 1) * d, *k1 = k, *k2 = k + d, *k3 = k + 2 * d, *k4 = k + 3 * d;
        field(c, th, t, yk, k1, s);
        for (int64_t i = 0; i < d; i++) u[i] = yk[i] + 0.5 * dt * k1[i];
        field(c, th, t + 0.5 * dt, u, k2, s);
        for (int64_t i = 0; i < d; i++) u[i] = yk[i] + 0.5 * dt * k2[i];
        field(c, th, t + 0.5 * dt, u, k3, s);
        for (int64_t i = 0; i < d; i++) u[i] = yk[i] + dt * k3[i];
        field(c, th, t + dt, u, k4, s);
        for (int64_t i = 0; i < d; i++) yn[i] = yk[i] + dt / 6.0 * (k1[i] + 2.0 * k2[i] + 2.0 * k3[i] + k4[i]);
    }
    for (int64_t p = 0; p < n; p++) memcpy(pos + p * d, y + p * c->substeps * d, (size_t)d * sizeof(double));
    c->n = n;
    return QKV_OK;
}

qkv_status floater_core_backward(floater_core *c, const double *th, const double *dpos, double *gth) {
    const int64_t d = c->dim, n = c->n, steps = (n - 1) * c->substeps;
    const double dt = c->delta / (double)c->substeps;
    double *w = c->work;
    double *k1 = w, *k2 = w + d, *k3 = w + 2 * d, *u = w + 4 * d, *s = u + d; /* w + 3d: unused (k4) */
    double *a = s + c->hidden, *g = a + d, *du = g + d, *dz = du + d, *acc = dz + c->hidden;
    /* a = dL/dy at the current step, walking the trajectory backwards and
     * adding each position's own gradient as its step is reached. */
    memcpy(a, dpos + (n - 1) * d, (size_t)d * sizeof(double));
    for (int64_t st = steps - 1; st >= 0; st--) {
        const double *yk = c->traj + st * d, t = (double)st * dt;
        /* Recompute the four stages of this step. */
        field(c, th, t, yk, k1, s);
        for (int64_t i = 0; i < d; i++) u[i] = yk[i] + 0.5 * dt * k1[i];
        field(c, th, t + 0.5 * dt, u, k2, s);
        for (int64_t i = 0; i < d; i++) u[i] = yk[i] + 0.5 * dt * k2[i];
        field(c, th, t + 0.5 * dt, u, k3, s);
        memcpy(acc, a, (size_t)d * sizeof(double)); /* dL/dy_k starts with the skip term */
        /* k4 = f(t + dt, y + dt k3), weight dt/6 */
        for (int64_t i = 0; i < d; i++) {
            u[i] = yk[i] + dt * k3[i];
            g[i] = a[i] * dt / 6.0;
        }
        field_vjp(c, th, t + dt, u, g, gth, du, s, dz);
        for (int64_t i = 0; i < d; i++) {
            acc[i] += du[i];
            g[i] = a[i] * dt / 3.0 + dt * du[i]; /* dL/dk3 */
            u[i] = yk[i] + 0.5 * dt * k2[i];
        }
        field_vjp(c, th, t + 0.5 * dt, u, g, gth, du, s, dz);
        for (int64_t i = 0; i < d; i++) {
            acc[i] += du[i];
            g[i] = a[i] * dt / 3.0 + 0.5 * dt * du[i]; /* dL/dk2 */
            u[i] = yk[i] + 0.5 * dt * k1[i];
        }
        field_vjp(c, th, t + 0.5 * dt, u, g, gth, du, s, dz);
        for (int64_t i = 0; i < d; i++) {
            acc[i] += du[i];
            g[i] = a[i] * dt / 6.0 + 0.5 * dt * du[i]; /* dL/dk1 */
        }
        field_vjp(c, th, t, yk, g, gth, du, s, dz);
        for (int64_t i = 0; i < d; i++) a[i] = acc[i] + du[i];
        if (st % c->substeps == 0)
            for (int64_t i = 0; i < d; i++) a[i] += dpos[(st / c->substeps) * d + i];
    }
    for (int64_t i = 0; i < d; i++) gth[FL_P0(c) + i] += a[i];
    return QKV_OK;
}

/* ---- the public object: float parameters around the double core ---------- */

struct qkv_floater {
    floater_core c;
    int64_t np;
    float *params, *grads;
    double *th, *gth, *pos;  /* double copies and the last forward's positions */
    int64_t pos_cap;
};

qkv_status qkv_floater_create(int64_t dim, int64_t hidden, double delta, int substeps, uint64_t seed,
                              qkv_floater **out) {
    if (!out) return QKV_ERR_NULL_POINTER;
    *out = NULL;
    if (dim <= 0 || hidden <= 0 || substeps <= 0 || dim > (1 << 20) || hidden > (1 << 20)) return QKV_ERR_BAD_SIZE;
    if (!(isfinite(delta) && delta > 0.0)) return QKV_ERR_BAD_PARAMETER;
    qkv_floater *f = qkv_alloc_zeroed(sizeof *f);
    if (!f) return QKV_ERR_OUT_OF_MEMORY;
    f->c.dim = dim;
    f->c.hidden = hidden;
    f->c.delta = delta;
    f->c.substeps = substeps;
    f->np = floater_n_params(dim, hidden);
    f->params = qkv_alloc_zeroed((size_t)f->np * sizeof(float));
    f->grads = qkv_alloc_zeroed((size_t)f->np * sizeof(float));
    f->th = qkv_alloc((size_t)f->np * sizeof(double));
    f->gth = qkv_alloc((size_t)f->np * sizeof(double));
    f->c.work = qkv_alloc((size_t)(9 * dim + 3 * hidden) * sizeof(double));
    if (!f->params || !f->grads || !f->th || !f->gth || !f->c.work) {
        qkv_floater_free(f);
        return QKV_ERR_OUT_OF_MEMORY;
    }
    /* Uniform(-a, a) weights with fan-in scaling, p0 and biases small: the
     * field is then a smooth, non-trivial flow from the start. */
    uint64_t z = seed;
    for (int64_t i = 0; i < f->np; i++) {
        double r = 2.0 * splitmix64_unit(&z) - 1.0;
        double scale = i < FL_W1(&f->c) ? 1.0 : (i < FL_W2(&f->c) ? 1.0 / sqrt((double)dim + 1.0)
                                                                : 1.0 / sqrt((double)hidden));
        f->params[i] = (float)(r * scale);
    }
    *out = f;
    return QKV_OK;
}

void qkv_floater_free(qkv_floater *f) {
    if (!f) return;
    void *const bufs[] = {f->params, f->grads, f->th, f->gth, f->pos, f->c.work, f->c.traj, f};
    qkv_free_each(bufs, sizeof bufs / sizeof bufs[0]);
}

qkv_status qkv_floater_forward(qkv_floater *f, int64_t n, float *pos) {
    if (!f || !pos) return QKV_ERR_NULL_POINTER;
    if (n <= 0) return QKV_ERR_BAD_SIZE;
    int64_t fac[2] = {n, f->c.dim}, cnt;
    if (!qkv_count_ok(&cnt, sizeof(double), 2, fac)) return QKV_ERR_SIZE_OVERFLOW;
    if (!qkv_reserve(&f->pos, &f->pos_cap, cnt, sizeof(double))) return QKV_ERR_OUT_OF_MEMORY;
    for (int64_t i = 0; i < f->np; i++) f->th[i] = f->params[i];
    f->c.n = 0;
    qkv_status s = floater_core_forward(&f->c, f->th, n, f->pos);
    if (s != QKV_OK) return s;
    for (int64_t i = 0; i < cnt; i++) pos[i] = (float)f->pos[i];
    return QKV_OK;
}

qkv_status qkv_floater_backward(qkv_floater *f, const float *dpos) {
    if (!f || !dpos) return QKV_ERR_NULL_POINTER;
    if (f->c.n == 0) return QKV_ERR_UNSUPPORTED;
    int64_t cnt = f->c.n * f->c.dim;
    /* The positions buffer is free after the forward: reuse it for dpos. */
    for (int64_t i = 0; i < cnt; i++) f->pos[i] = dpos[i];
    memset(f->gth, 0, (size_t)f->np * sizeof(double));
    qkv_status s = floater_core_backward(&f->c, f->th, f->pos, f->gth);
    if (s != QKV_OK) return s;
    for (int64_t i = 0; i < f->np; i++) f->grads[i] += (float)f->gth[i];
    return QKV_OK;
}

float *qkv_floater_params(qkv_floater *f, int64_t *count) {
    return qkv_param_view(f ? f->params : NULL, f ? f->np : 0, count);
}

float *qkv_floater_grads(qkv_floater *f, int64_t *count) {
    return qkv_param_view(f ? f->grads : NULL, f ? f->np : 0, count);
}

void qkv_floater_zero_grad(qkv_floater *f) {
    if (f) memset(f->grads, 0, (size_t)f->np * sizeof(float));
}
