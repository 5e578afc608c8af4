/* The multi-head layer's two optional parts, checked against an oracle of
 * the whole layer written here in double from the formulas (it shares no
 * code with src/):
 *   - torch's add_bias_kv: learned bias_k, bias_v appended LAST to every
 *     sequence's keys and values and visible to every query (torch pads its
 *     masks with a visible column). The library places them first inside
 *     (src/layers/mha_internal.h); the oracle does it torch's way, so the
 *     placement is checked, not assumed. Also against torch itself:
 *     tests/data/mha/torch_mha_bias_kv.safetensors, made by
 *     tests/data/mha/make_torch_bias_kv_fixture.py.
 *   - the additive (MLP) score with the layer's own per-head W1, W2, w.
 * Forward against the oracle; every parameter and input gradient of the
 * layer against central finite differences of the oracle in double;
 * decoding with the KV cache against one causal forward; safetensors names;
 * errors. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

typedef struct xcase {
    const char *name;
    int64_t E, H, Hkv, Dh, kdim, vdim, nq, nk, A;
    int bias, cross, bkv, additive, causal, lengths;
} xcase;

enum { B = 2 };

static const xcase CASES[] = {
    /* name                                   E  H Hkv Dh kd vd nq nk A  bias cross bkv add causal len */
    {"bias_kv, self, causal, padding", 8, 2, 0, 0, 0, 0, 5, 5, 0, 1, 0, 1, 0, 1, 1},
    {"bias_kv, GQA cross kdim/vdim, padding", 8, 4, 2, 3, 6, 5, 5, 6, 0, 1, 1, 1, 0, 0, 1},
    {"bias_kv, cross n_q = n_k + 1, causal, no bias", 8, 2, 0, 0, 6, 5, 5, 4, 0, 0, 1, 1, 0, 1, 0},
    {"additive, self", 8, 2, 0, 0, 0, 0, 5, 5, 0, 1, 0, 0, 1, 0, 0},
    {"additive A=3, GQA cross, causal, padding", 8, 4, 2, 3, 6, 5, 5, 6, 3, 1, 1, 0, 1, 1, 1},
    {"additive + bias_kv, self, causal, padding", 8, 2, 0, 0, 0, 0, 5, 5, 5, 1, 0, 1, 1, 1, 1},
};

static int64_t hkv_of(const xcase *c) { return c->Hkv ? c->Hkv : c->H; }
static int64_t dh_of(const xcase *c) { return c->Dh ? c->Dh : c->E / c->H; }
static int64_t kd_of(const xcase *c) { return c->kdim ? c->kdim : c->E; }
static int64_t vd_of(const xcase *c) { return c->vdim ? c->vdim : c->E; }
static int64_t a_of(const xcase *c) { return c->A ? c->A : dh_of(c); }

static qkv_mha *make(const xcase *c, uint64_t seed) {
    qkv_mha_config cfg;
    qkv_mha_config_init(&cfg, c->E, c->H);
    cfg.heads_kv = c->Hkv;
    cfg.head_dim = c->Dh;
    cfg.kdim = c->kdim;
    cfg.vdim = c->vdim;
    cfg.bias = c->bias;
    cfg.add_bias_kv = c->bkv;
    cfg.attn.mask = c->causal ? QKV_MASK_CAUSAL : QKV_MASK_NONE;
    if (c->additive) {
        cfg.attn.score = QKV_SCORE_ADDITIVE;
        cfg.attn.additive_dim = c->A;
    }
    qkv_mha *m = NULL;
    CHECK_STATUS(qkv_mha_create(&cfg, seed, &m), QKV_OK);
    if (m) {
        /* Non-zero biases, so that their gradients matter. */
        int64_t n;
        float *p = qkv_mha_params(m, &n);
        tu_perturb_f32(p, n, seed + 1, 0.1);
    }
    return m;
}

/* ---- the oracle ------------------------------------------------------------ */

/* The layer's tensors by torch name, as double master copies. */
enum { T_IN, T_Q, T_K, T_V, T_BIN, T_WO, T_BO, T_BK, T_BV, T_W1, T_W2, T_W, T_COUNT };
static const char *const TNAME[T_COUNT] = {"in_proj_weight", "q_proj_weight", "k_proj_weight",
                                           "v_proj_weight",  "in_proj_bias",  "out_proj.weight",
                                           "out_proj.bias",  "bias_k",        "bias_v",
                                           "additive.w1",    "additive.w2",   "additive.w"};

typedef struct oparams {
    double *t[T_COUNT];  /* NULL: the layer has no such tensor */
    float *g[T_COUNT];   /* the layer's gradient of it (float) */
    int64_t n[T_COUNT];
} oparams;

/* Read the layer's parameters (and gradients) by name: save the parameters,
 * then save again with the gradients copied over them. */
static int oparams_get(qkv_mha *m, oparams *op) {
    memset(op, 0, sizeof *op);
    int64_t np;
    float *p = qkv_mha_params(m, &np), *g = qkv_mha_grads(m, NULL);
    float *keep = malloc((size_t)np * sizeof(float));
    qkv_safetensors *sp = NULL, *sg = NULL;
    CHECK_STATUS(qkv_safetensors_create(&sp), QKV_OK);
    CHECK_STATUS(qkv_safetensors_create(&sg), QKV_OK);
    if (!keep || !sp || !sg) return 0;
    memcpy(keep, p, (size_t)np * sizeof(float));
    CHECK_STATUS(qkv_mha_save(m, sp, ""), QKV_OK);
    memcpy(p, g, (size_t)np * sizeof(float));
    CHECK_STATUS(qkv_mha_save(m, sg, ""), QKV_OK);
    memcpy(p, keep, (size_t)np * sizeof(float));
    free(keep);
    for (int t = 0; t < T_COUNT; t++) {
        const qkv_array *a = qkv_safetensors_get(sp, TNAME[t]), *ag = qkv_safetensors_get(sg, TNAME[t]);
        if (!a) continue;
        op->n[t] = qkv_array_count(a);
        op->t[t] = malloc((size_t)op->n[t] * sizeof(double));
        op->g[t] = malloc((size_t)op->n[t] * sizeof(float));
        for (int64_t i = 0; i < op->n[t]; i++) {
            op->t[t][i] = ((const float *)a->data)[i];
            op->g[t][i] = ((const float *)ag->data)[i];
        }
    }
    qkv_safetensors_free(sp);
    qkv_safetensors_free(sg);
    return 1;
}

static void oparams_free(oparams *op) {
    for (int t = 0; t < T_COUNT; t++) {
        free(op->t[t]);
        free(op->g[t]);
    }
}

typedef struct oinputs {
    double xq[B * 8 * 8], xk[B * 8 * 8], xv[B * 8 * 8], dy[B * 8 * 8];
    int64_t len[B];
} oinputs;

/* y [B, nq, E] (and attn [B, H, nq, nk + bkv] when not NULL) of the layer,
 * torch's way: extra key and value appended last, always visible. */
static void oracle(const xcase *c, const oparams *op, const oinputs *in, double *y, double *attn) {
    const int64_t E = c->E, H = c->H, Hk = hkv_of(c), Dh = dh_of(c), kd = kd_of(c), vd = vd_of(c);
    const int64_t nq = c->nq, nk = c->nk, nkt = nk + c->bkv, Dq = H * Dh, Dkv = Hk * Dh, A = a_of(c);
    const double *Wq = op->t[T_IN] ? op->t[T_IN] : op->t[T_Q];
    const double *Wk = op->t[T_IN] ? op->t[T_IN] + Dq * E : op->t[T_K];
    const double *Wv = op->t[T_IN] ? op->t[T_IN] + (Dq + Dkv) * E : op->t[T_V];
    const double *bin = op->t[T_BIN];
    const double *xk = c->cross ? in->xk : in->xq, *xv = c->cross ? in->xv : in->xq;
    double q[8 * 8], k[9 * 8], v[9 * 8], o[8 * 8], s[9], u1[8], u2[8];
    for (int64_t b = 0; b < B; b++) {
        for (int64_t i = 0; i < nq; i++)
            for (int64_t a = 0; a < Dq; a++) {
                double acc = bin ? bin[a] : 0.0;
                for (int64_t e = 0; e < E; e++) acc += Wq[a * E + e] * in->xq[(b * nq + i) * E + e];
                q[i * Dq + a] = acc;
            }
        for (int64_t j = 0; j < nkt; j++)
            for (int64_t a = 0; a < Dkv; a++) {
                if (j == nk) { /* the extra key and value */
                    k[j * Dkv + a] = op->t[T_BK][a];
                    v[j * Dkv + a] = op->t[T_BV][a];
                    continue;
                }
                double ak = bin ? bin[Dq + a] : 0.0, av = bin ? bin[Dq + Dkv + a] : 0.0;
                for (int64_t e = 0; e < kd; e++) ak += Wk[a * kd + e] * xk[(b * nk + j) * kd + e];
                for (int64_t e = 0; e < vd; e++) av += Wv[a * vd + e] * xv[(b * nk + j) * vd + e];
                k[j * Dkv + a] = ak;
                v[j * Dkv + a] = av;
            }
        for (int64_t h = 0; h < H; h++) {
            const int64_t hk = h / (H / Hk);
            for (int64_t i = 0; i < nq; i++) {
                double mx = -INFINITY, sum = 0.0;
                for (int64_t j = 0; j < nkt; j++) {
                    int vis = j == nk || ((!c->causal || j <= i + nk - nq) && (!c->lengths || j < in->len[b]));
                    s[j] = -INFINITY;
                    if (!vis) continue;
                    const double *qi = q + i * Dq + h * Dh, *kj = k + j * Dkv + hk * Dh;
                    double acc = 0.0;
                    if (c->additive) {
                        const double *w1 = op->t[T_W1] + h * A * Dh, *w2 = op->t[T_W2] + h * A * Dh;
                        for (int64_t a = 0; a < A; a++) {
                            u1[a] = u2[a] = 0.0;
                            for (int64_t d = 0; d < Dh; d++) {
                                u1[a] += w1[a * Dh + d] * qi[d];
                                u2[a] += w2[a * Dh + d] * kj[d];
                            }
                            acc += op->t[T_W][h * A + a] * tanh(u1[a] + u2[a]);
                        }
                    } else {
                        for (int64_t d = 0; d < Dh; d++) acc += qi[d] * kj[d];
                        acc /= sqrt((double)Dh);
                    }
                    s[j] = acc;
                    mx = fmax(mx, acc);
                }
                for (int64_t j = 0; j < nkt; j++) sum += s[j] == -INFINITY ? 0.0 : exp(s[j] - mx);
                for (int64_t d = 0; d < Dh; d++) {
                    double acc = 0.0;
                    for (int64_t j = 0; j < nkt; j++)
                        if (s[j] != -INFINITY) acc += exp(s[j] - mx) / sum * v[j * Dkv + hk * Dh + d];
                    o[i * Dq + h * Dh + d] = acc;
                }
                if (attn)
                    for (int64_t j = 0; j < nkt; j++)
                        attn[((b * H + h) * nq + i) * nkt + j] = s[j] == -INFINITY ? 0.0 : exp(s[j] - mx) / sum;
            }
        }
        for (int64_t i = 0; i < nq; i++)
            for (int64_t e = 0; e < E; e++) {
                double acc = op->t[T_BO] ? op->t[T_BO][e] : 0.0;
                for (int64_t a = 0; a < Dq; a++) acc += op->t[T_WO][e * Dq + a] * o[i * Dq + a];
                y[(b * nq + i) * E + e] = acc;
            }
    }
}

static double oloss(const xcase *c, const oparams *op, const oinputs *in) {
    double y[B * 8 * 8];
    oracle(c, op, in, y, NULL);
    double l = 0.0;
    for (int64_t i = 0; i < B * c->nq * c->E; i++) l += y[i] * in->dy[i];
    return l;
}

/* Central differences of the oracle's loss in double (step 1e-6: truncation
 * O(h^2) ~ 1e-12, rounding ~ 1e-16 |L| / h ~ 1e-10) against the layer's
 * float gradient g. The analytic side is computed in float from O(1) values
 * through sums of at most ~50 terms: error ~ 1e-6; tolerance 2e-5 absolute
 * plus 1e-3 relative. Returns the worst |g - fd| / (2e-5 + 1e-3 |fd|). */
static double fd_worst(const xcase *c, const oparams *op, oinputs *in, double *x, const float *g, int64_t n,
                       const char *what) {
    const double h = 1e-6;
    double worst = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double keep = x[i];
        x[i] = keep + h;
        double lp = oloss(c, op, in);
        x[i] = keep - h;
        double lm = oloss(c, op, in);
        x[i] = keep;
        double fd = (lp - lm) / (2 * h), r = fabs(fd - g[i]) / (2e-5 + 1e-3 * fabs(fd));
        if (r > 1.0 && worst <= 1.0)
            fprintf(stderr, "  %s: %s[%lld]: finite difference %.9g, backward %.9g\n", c->name, what, (long long)i,
                    fd, (double)g[i]);
        worst = fmax(worst, r);
    }
    return worst;
}

static void fill_inputs(const xcase *c, tu_rng *r, oinputs *in, float *xq, float *xk, float *xv, float *dy) {
    const int64_t nq = B * c->nq * c->E, nk = B * c->nk * kd_of(c), nv = B * c->nk * vd_of(c);
    tu_fill_normal_f32(r, xq, (size_t)nq, 1.0);
    tu_fill_normal_f32(r, xk, (size_t)nk, 1.0);
    tu_fill_normal_f32(r, xv, (size_t)nv, 1.0);
    tu_fill_normal_f32(r, dy, (size_t)nq, 1.0);
    for (int64_t i = 0; i < nq; i++) in->xq[i] = xq[i], in->dy[i] = dy[i];
    for (int64_t i = 0; i < nk; i++) in->xk[i] = xk[i];
    for (int64_t i = 0; i < nv; i++) in->xv[i] = xv[i];
    in->len[0] = c->nk - 2; /* a padded row */
    in->len[1] = 0;         /* no key at all: only the extra one, if any */
}

static void test_case(const xcase *c) {
    tu_rng r;
    tu_rng_seed(&r, 31);
    qkv_mha *m = make(c, 2024);
    if (!m) return;
    oinputs *in = calloc(1, sizeof *in);
    float xq[B * 8 * 8], xk[B * 8 * 8], xv[B * 8 * 8], dy[B * 8 * 8], y[B * 8 * 8];
    float dxq[B * 8 * 8], dxk[B * 8 * 8], dxv[B * 8 * 8], attn[B * 4 * 8 * 9];
    fill_inputs(c, &r, in, xq, xk, xv, dy);
    const int64_t *len = c->lengths ? in->len : NULL;
    const int64_t nkt = c->nk + c->bkv, na = B * c->H * c->nq * nkt;
    if (!c->bkv && c->lengths) in->len[1] = 1; /* without the extra key a row with no key is just 0 */
    CHECK_STATUS(qkv_mha_forward(m, B, c->nq, c->nk, xq, c->cross ? xk : NULL, c->cross ? xv : NULL, len, y, attn),
                 QKV_OK);
    qkv_mha_zero_grad(m);
    CHECK_STATUS(qkv_mha_backward(m, xq, c->cross ? xk : NULL, c->cross ? xv : NULL, dy, dxq, c->cross ? dxk : NULL,
                                  c->cross ? dxv : NULL),
                 QKV_OK);
    oparams op;
    if (!oparams_get(m, &op)) return;
    CHECK(!c->bkv || (op.t[T_BK] && op.t[T_BV]), "%s: bias_k, bias_v saved", c->name);
    CHECK(!c->additive || (op.t[T_W1] && op.t[T_W2] && op.t[T_W]), "%s: additive.* saved", c->name);
    if ((c->bkv && !op.t[T_BK]) || (c->additive && !op.t[T_W1])) {
        oparams_free(&op);
        free(in);
        qkv_mha_free(m);
        return;
    }

    /* Forward: float layer against the double oracle. */
    double yo[B * 8 * 8], ao[B * 4 * 8 * 9], ey = 0.0, ea = 0.0;
    oracle(c, &op, in, yo, ao);
    for (int64_t i = 0; i < B * c->nq * c->E; i++) ey = fmax(ey, fabs(y[i] - yo[i]));
    for (int64_t i = 0; i < na; i++) ea = fmax(ea, fabs(attn[i] - ao[i]));
    /* float projections and scores of O(1) values through <= 16-term sums. */
    CHECK(ey < 2e-5 && ea < 2e-5, "%s: forward equals the oracle: output error %g, attention error %g", c->name, ey,
          ea);
    printf("%-48s forward  |y - oracle| %.2e  |attn - oracle| %.2e\n", c->name, ey, ea);

    /* Gradients: every parameter tensor, then the inputs. */
    double worst = 0.0;
    for (int t = 0; t < T_COUNT; t++) {
        if (!op.t[t]) continue;
        double w = fd_worst(c, &op, in, op.t[t], op.g[t], op.n[t], TNAME[t]);
        CHECK(w <= 1.0, "%s: d %s by finite differences (worst %.3g of the tolerance)", c->name, TNAME[t], w);
        if (t == T_BK || t == T_BV || t >= T_W1)
            printf("%-48s d%-15s worst |g - fd| / (2e-5 + 1e-3 |fd|) = %.3f\n", c->name, TNAME[t], w);
        worst = fmax(worst, w);
    }
    float gx[3][B * 8 * 8];
    memcpy(gx[0], dxq, sizeof dxq);
    memcpy(gx[1], dxk, sizeof dxk);
    memcpy(gx[2], dxv, sizeof dxv);
    double wx = fd_worst(c, &op, in, in->xq, gx[0], B * c->nq * c->E, "x_q");
    if (c->cross) {
        wx = fmax(wx, fd_worst(c, &op, in, in->xk, gx[1], B * c->nk * kd_of(c), "x_k"));
        wx = fmax(wx, fd_worst(c, &op, in, in->xv, gx[2], B * c->nk * vd_of(c), "x_v"));
    }
    CHECK(wx <= 1.0, "%s: input gradients by finite differences (worst %.3g of the tolerance)", c->name, wx);
    printf("%-48s all parameters worst %.3f, inputs worst %.3f (of the tolerance)\n", c->name, worst, wx);

    /* Gradients accumulate over backward calls until zeroed. */
    int64_t np;
    float *g = qkv_mha_grads(m, &np), *g1 = malloc((size_t)np * sizeof(float));
    memcpy(g1, g, (size_t)np * sizeof(float));
    CHECK_STATUS(qkv_mha_forward(m, B, c->nq, c->nk, xq, c->cross ? xk : NULL, c->cross ? xv : NULL, len, y, NULL),
                 QKV_OK);
    CHECK_STATUS(qkv_mha_backward(m, xq, c->cross ? xk : NULL, c->cross ? xv : NULL, dy, NULL, NULL, NULL), QKV_OK);
    double acc = 0.0;
    for (int64_t i = 0; i < np; i++) acc = fmax(acc, fabs(g[i] - 2.0f * g1[i]));
    CHECK(acc < 1e-5, "%s: a second backward adds the same gradient (%g)", c->name, acc);
    free(g1);
    oparams_free(&op);
    free(in);
    qkv_mha_free(m);
}

/* ---- torch ------------------------------------------------------------------ */

static const float *tensor(const qkv_safetensors *st, const char *name, int64_t count) {
    const qkv_array *a = qkv_safetensors_get(st, name);
    CHECK(a && a->dtype == QKV_F32 && qkv_array_count(a) == count, "fixture tensor %s", name);
    return a && a->dtype == QKV_F32 && qkv_array_count(a) == count ? a->data : NULL;
}

/* nn.MultiheadAttention(add_bias_kv=True) and qkv's layer from the same
 * state_dict: same outputs and attention weights (extra key last). */
static void test_torch_bias_kv(void) {
    char path[1024], why[256];
    const char *src = getenv("QKV_SOURCE_DIR");
    snprintf(path, sizeof path, "%s/tests/data/mha/torch_mha_bias_kv.safetensors", src ? src : ".");
    qkv_safetensors *st = NULL;
    CHECK_STATUS(qkv_safetensors_load(path, &st, why, sizeof why), QKV_OK);
    if (!st) {
        fprintf(stderr, "  %s: %s\n", path, why);
        return;
    }
    static const struct {
        const char *prefix;
        int bias, cross;
        int64_t nq, nk, len[B];
    } layers[] = {{"self.", 1, 0, 5, 5, {3, 0}}, {"nobias.", 0, 0, 5, 5, {4, 0}}, {"cross.", 1, 1, 7, 6, {6, 2}}};
    static const char *const cases[] = {"plain", "causal", "padded", "causal_padded"};
    double worst_y = 0.0, worst_a = 0.0;
    for (size_t li = 0; li < sizeof layers / sizeof layers[0]; li++) {
        const char *pre = layers[li].prefix;
        const int64_t nq = layers[li].nq, nk = layers[li].nk;
        for (int ci = 0; ci < 4; ci++) {
            qkv_mha_config cfg;
            qkv_mha_config_init(&cfg, 8, 2);
            cfg.bias = layers[li].bias;
            cfg.add_bias_kv = 1;
            if (layers[li].cross) cfg.kdim = 6, cfg.vdim = 5;
            if (ci & 1) cfg.attn.mask = QKV_MASK_CAUSAL;
            qkv_mha *m = NULL;
            CHECK_STATUS(qkv_mha_create(&cfg, 0, &m), QKV_OK);
            if (!m) continue;
            CHECK_STATUS(qkv_mha_load(m, st, pre, why, sizeof why), QKV_OK);
            char name[64];
            snprintf(name, sizeof name, "%sx", pre);
            const float *x = tensor(st, name, B * nq * 8);
            snprintf(name, sizeof name, "%sxk", pre);
            const float *xk = layers[li].cross ? tensor(st, name, B * nk * 6) : NULL;
            snprintf(name, sizeof name, "%sxv", pre);
            const float *xv = layers[li].cross ? tensor(st, name, B * nk * 5) : NULL;
            snprintf(name, sizeof name, "%sy_%s", pre, cases[ci]);
            const float *want_y = tensor(st, name, B * nq * 8);
            snprintf(name, sizeof name, "%sattn_%s", pre, cases[ci]);
            const float *want_a = tensor(st, name, B * 2 * nq * (nk + 1));
            float y[B * 7 * 8], attn[B * 2 * 7 * 7];
            if (x && want_y && want_a && (!layers[li].cross || (xk && xv))) {
                CHECK_STATUS(qkv_mha_forward(m, B, nq, nk, x, xk, xv, ci >= 2 ? layers[li].len : NULL, y, attn),
                             QKV_OK);
                double ey = 0, ea = 0;
                for (int64_t i = 0; i < B * nq * 8; i++) ey = fmax(ey, fabs(y[i] - want_y[i]));
                for (int64_t i = 0; i < B * 2 * nq * (nk + 1); i++) ea = fmax(ea, fabs(attn[i] - want_a[i]));
                /* Both sides in float, different summation orders: a few ulps. */
                CHECK(ey < 1e-5 && ea < 1e-5, "torch add_bias_kv %s%s: output error %g, attention error %g", pre,
                      cases[ci], ey, ea);
                worst_y = fmax(worst_y, ey);
                worst_a = fmax(worst_a, ea);
            }
            /* What the layer saves is what torch's state_dict holds. */
            qkv_safetensors *out = NULL;
            CHECK_STATUS(qkv_safetensors_create(&out), QKV_OK);
            CHECK_STATUS(qkv_mha_save(m, out, pre), QKV_OK);
            snprintf(name, sizeof name, "%sbias_k", pre);
            const qkv_array *a = qkv_safetensors_get(out, name), *t = qkv_safetensors_get(st, name);
            CHECK(a && t && a->ndim == 3 && a->shape[0] == 1 && a->shape[1] == 1 && a->shape[2] == 8 &&
                      memcmp(a->data, t->data, 8 * sizeof(float)) == 0,
                  "%s: saved as torch's [1, 1, E]", name);
            qkv_safetensors_free(out);
            qkv_mha_free(m);
        }
    }
    printf("torch add_bias_kv fixture (3 layers x 4 masks): worst |y - torch| %.2e, |attn - torch| %.2e\n",
           worst_y, worst_a);
    qkv_safetensors_free(st);
}

/* ---- decoding, names, errors ------------------------------------------------- */

/* Decoding token by token equals one causal forward, with the extra key and
 * the additive score. */
static void test_decode(int bkv, int additive, qkv_pos_kind pos) {
    qkv_mha_config cfg;
    qkv_mha_config_init(&cfg, 8, 4);
    cfg.heads_kv = 2;
    cfg.add_bias_kv = bkv;
    cfg.pos = pos;
    cfg.attn.mask = QKV_MASK_CAUSAL;
    if (additive) cfg.attn.score = QKV_SCORE_ADDITIVE;
    qkv_mha *m = NULL;
    CHECK_STATUS(qkv_mha_create(&cfg, 9, &m), QKV_OK);
    if (!m) return;
    enum { N = 6 };
    tu_rng r;
    tu_rng_seed(&r, 5);
    float x[B * N * 8], y[B * N * 8], yd[B * N * 8], xt[B * 8], yt[B * 8];
    tu_fill_normal_f32(&r, x, B * N * 8, 1.0);
    CHECK_STATUS(qkv_mha_forward(m, B, N, N, x, NULL, NULL, NULL, y, NULL), QKV_OK);
    qkv_kv_cache *kc = NULL;
    CHECK_STATUS(qkv_kv_cache_create(m, B, N, &kc), QKV_OK);
    if (!kc) return;
    for (int64_t at = 0; at < N; at++) {
        for (int64_t b = 0; b < B; b++) memcpy(xt + b * 8, x + (b * N + at) * 8, 8 * sizeof(float));
        CHECK_STATUS(qkv_mha_decode(m, kc, 1, xt, yt), QKV_OK);
        for (int64_t b = 0; b < B; b++) memcpy(yd + (b * N + at) * 8, yt + b * 8, 8 * sizeof(float));
    }
    double e = 0.0;
    for (int i = 0; i < B * N * 8; i++) e = fmax(e, fabs(y[i] - yd[i]));
    CHECK(e < 1e-5, "decode (bias_kv %d, additive %d, pos %d) equals the causal forward: %g", bkv, additive, pos, e);
    qkv_kv_cache_free(kc);
    qkv_mha_free(m);
}

static void test_save_load(void) {
    const xcase *c = &CASES[5]; /* additive + bias_kv */
    qkv_mha *a = make(c, 1), *b = make(c, 2);
    if (!a || !b) return;
    qkv_safetensors *st = NULL;
    char path[512], why[256];
    CHECK_STATUS(qkv_safetensors_create(&st), QKV_OK);
    CHECK_STATUS(qkv_mha_save(a, st, "blk."), QKV_OK);
    const qkv_array *w1 = qkv_safetensors_get(st, "blk.additive.w1"), *w = qkv_safetensors_get(st, "blk.additive.w");
    CHECK(w1 && w1->ndim == 3 && w1->shape[0] == 2 && w1->shape[1] == 5 && w1->shape[2] == 4,
          "additive.w1 saved as [H, A, Dh]");
    CHECK(w && w->ndim == 2 && w->shape[0] == 2 && w->shape[1] == 5, "additive.w saved as [H, A]");
    tu_tmp_path(path, sizeof path, "mha_extra.safetensors");
    CHECK_STATUS(qkv_safetensors_save(st, path), QKV_OK);
    qkv_safetensors_free(st);
    st = NULL;
    CHECK_STATUS(qkv_safetensors_load(path, &st, why, sizeof why), QKV_OK);
    remove(path);
    if (!st) return;
    CHECK_STATUS(qkv_mha_load(b, st, "blk.", why, sizeof why), QKV_OK);
    int64_t n;
    float *pa = qkv_mha_params(a, &n), *pb = qkv_mha_params(b, NULL);
    CHECK(memcmp(pa, pb, (size_t)n * sizeof(float)) == 0, "bias_kv and additive parameters survive a round trip");

    /* A layer without them loads the same file (extra tensors are ignored);
     * one with them refuses a file that lacks them, by name. */
    xcase plain = *c;
    plain.bkv = plain.additive = 0;
    qkv_mha *p = make(&plain, 3);
    CHECK_STATUS(qkv_mha_load(p, st, "blk.", why, sizeof why), QKV_OK);
    qkv_safetensors *st2 = NULL;
    CHECK_STATUS(qkv_safetensors_create(&st2), QKV_OK);
    CHECK_STATUS(qkv_mha_save(p, st2, ""), QKV_OK);
    CHECK_STATUS(qkv_mha_load(b, st2, "", why, sizeof why), QKV_ERR_FORMAT);
    CHECK(strstr(why, "bias_k") != NULL, "missing bias_k named: '%s'", why);
    xcase add_only = *c;
    add_only.bkv = 0;
    qkv_mha *ao = make(&add_only, 4);
    CHECK_STATUS(qkv_mha_load(ao, st2, "", why, sizeof why), QKV_ERR_FORMAT);
    CHECK(strstr(why, "additive.w1") != NULL, "missing additive.w1 named: '%s'", why);
    /* Misshapen: A = 5 saved, A = 3 wanted. */
    xcase a3 = *c;
    a3.A = 3;
    qkv_mha *m3 = make(&a3, 5);
    CHECK_STATUS(qkv_mha_load(m3, st, "blk.", why, sizeof why), QKV_ERR_SHAPE);
    CHECK(strstr(why, "additive.w1") && strstr(why, "[2, 3, 4]"), "shape error names tensor and shape: '%s'", why);
    qkv_mha_free(m3);
    qkv_mha_free(ao);
    qkv_mha_free(p);
    qkv_safetensors_free(st2);
    qkv_safetensors_free(st);
    qkv_mha_free(a);
    qkv_mha_free(b);
}

/* Bitwise the same results for 1 and 2 threads, and NaN in the
 * inputs of padded keys never reaches the output, with the extra key and
 * the additive score. */
static void test_threads_and_nan(void) {
    xcase c = CASES[5]; /* additive + bias_kv, causal, padding */
    float y[2][B * 8 * 8], g[2][512], x[B * 8 * 8], dy[B * 8 * 8];
    tu_rng r;
    tu_rng_seed(&r, 8);
    tu_fill_normal_f32(&r, x, B * 5 * 8, 1.0);
    tu_fill_normal_f32(&r, dy, B * 5 * 8, 1.0);
    const int64_t len[B] = {3, 0};
    for (int variant = 0; variant < 2; variant++) { /* scaled dot (fast path), additive */
        c.additive = variant;
        int64_t np = 0;
        for (int t = 0; t < 2; t++) {
            qkv_mha_config cfg;
            qkv_mha_config_init(&cfg, 8, 2);
            cfg.add_bias_kv = 1;
            cfg.attn.mask = QKV_MASK_CAUSAL;
            cfg.attn.threads = t + 1;
            if (c.additive) cfg.attn.score = QKV_SCORE_ADDITIVE;
            qkv_mha *m = NULL;
            CHECK_STATUS(qkv_mha_create(&cfg, 11, &m), QKV_OK);
            if (!m) return;
            qkv_mha_params(m, &np);
            CHECK(np <= 512, "parameter count %lld", (long long)np);
            if (np > 512) return;
            CHECK_STATUS(qkv_mha_forward(m, B, 5, 5, x, NULL, NULL, len, y[t], NULL), QKV_OK);
            CHECK_STATUS(qkv_mha_backward(m, x, NULL, NULL, dy, NULL, NULL, NULL), QKV_OK);
            memcpy(g[t], qkv_mha_grads(m, NULL), (size_t)np * sizeof(float));
            if (t == 1) {
                /* NaN in every input row past the key lengths (self-attention:
                 * those rows are also queries, so compare only the others). */
                float xn[B * 5 * 8], yn[B * 5 * 8];
                memcpy(xn, x, sizeof xn);
                for (int64_t b = 0; b < B; b++)
                    for (int64_t j = len[b]; j < 5; j++)
                        for (int e = 0; e < 8; e++) xn[(b * 5 + j) * 8 + e] = NAN;
                CHECK_STATUS(qkv_mha_forward(m, B, 5, 5, xn, NULL, NULL, len, yn, NULL), QKV_OK);
                int same = 1;
                for (int64_t j = 0; j < len[0]; j++)
                    for (int e = 0; e < 8; e++) same &= yn[j * 8 + e] == y[1][j * 8 + e];
                CHECK(same, "additive %d: NaN in padded keys does not reach the visible rows", variant);
            }
            qkv_mha_free(m);
        }
        CHECK(memcmp(y[0], y[1], (size_t)(B * 5 * 8) * sizeof(float)) == 0 &&
                  memcmp(g[0], g[1], (size_t)np * sizeof(float)) == 0,
              "additive %d, bias_kv: forward and gradients bitwise the same for 1 and 2 threads", variant);
    }
}

static void test_errors(void) {
    qkv_mha_config cfg;
    qkv_mha *m = NULL;
    /* The extra key would fall outside a window. */
    qkv_mha_config_init(&cfg, 8, 2);
    cfg.add_bias_kv = 1;
    cfg.attn.mask = QKV_MASK_WINDOW;
    cfg.attn.window_left = cfg.attn.window_right = 1;
    CHECK_STATUS(qkv_mha_create(&cfg, 1, &m), QKV_ERR_UNSUPPORTED);
    cfg.attn.mask = QKV_MASK_CAUSAL_WINDOW;
    cfg.attn.window_right = 0;
    CHECK_STATUS(qkv_mha_create(&cfg, 1, &m), QKV_ERR_UNSUPPORTED);
    /* The additive score has no fast path. */
    qkv_mha_config_init(&cfg, 8, 2);
    cfg.attn.score = QKV_SCORE_ADDITIVE;
    cfg.attn.impl = QKV_IMPL_FAST;
    CHECK_STATUS(qkv_mha_create(&cfg, 1, &m), QKV_ERR_UNSUPPORTED);
    cfg.attn.impl = QKV_IMPL_AUTO;
    cfg.attn.additive_dim = -1;
    CHECK_STATUS(qkv_mha_create(&cfg, 1, &m), QKV_ERR_BAD_SIZE);
    cfg.attn.additive_dim = 0;
    CHECK_STATUS(qkv_mha_create(&cfg, 1, &m), QKV_OK);
    int64_t np;
    qkv_mha_params(m, &np);
    /* 3 E^2 + 3 E + E^2 + E projections, + 2 H A Dh + H A with A = Dh = 4. */
    CHECK(np == 4 * 64 + 4 * 8 + 2 * 2 * 4 * 4 + 2 * 4, "additive parameter count %lld", (long long)np);
    qkv_mha_free(m);
    m = NULL;
    /* Causal with the extra key first: every query must sit at p >= 0. */
    qkv_mha_config_init(&cfg, 8, 2);
    cfg.kdim = cfg.vdim = 6;
    cfg.add_bias_kv = 1;
    cfg.attn.mask = QKV_MASK_CAUSAL;
    CHECK_STATUS(qkv_mha_create(&cfg, 1, &m), QKV_OK);
    float xq[8 * 8], xk[2 * 6], y[8 * 8];
    memset(xq, 0, sizeof xq);
    memset(xk, 0, sizeof xk);
    CHECK_STATUS(qkv_mha_forward(m, 1, 4, 2, xq, xk, NULL, NULL, y, NULL), QKV_ERR_UNSUPPORTED);
    CHECK_STATUS(qkv_mha_forward(m, 1, 3, 2, xq, xk, NULL, NULL, y, NULL), QKV_OK);
    int64_t bad = 3;
    CHECK_STATUS(qkv_mha_forward(m, 1, 3, 2, xq, xk, NULL, &bad, y, NULL), QKV_ERR_KEY_LENGTHS);
    qkv_mha_free(m);
}

int main(void) {
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) test_case(&CASES[i]);
    test_torch_bias_kv();
    test_decode(1, 0, QKV_POS_NONE);
    test_decode(1, 0, QKV_POS_ROPE);
    test_decode(1, 1, QKV_POS_ALIBI);
    test_decode(0, 1, QKV_POS_NONE);
    test_save_load();
    test_threads_and_nan();
    test_errors();
    return tu_finish();
}
