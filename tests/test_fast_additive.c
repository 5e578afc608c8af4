/* The fast float32 additive score (src/attn/fast_additive.c) against the
 * double reference on every ISA path the CPU has: forward out, lse and
 * attn; backward dq, dk, dv, dbias, dW1, dW2, dw; awkward sizes, n_q != n_k,
 * A and D from 1, every normaliser, soft-cap, bias, masks, key lengths,
 * packed sequences, GQA, D_v != D; with the forward's out/lse given and
 * recomputed; fully masked rows give zeros; NaN in masked keys changes
 * nothing; bitwise identical results for 1, 2 and 3 threads; the kernel's
 * tanh within a few ulp. Tolerance: the rule of test_fast_common.h, with
 * naive32 here the additive score's plain float algorithm (projections,
 * tanhf, two-pass softmax, sums left to right): k = 2 forward, 4 backward.
 * The reference's gradients are checked by finite differences in
 * test_attn_grad.c. */
#include <stdio.h>

#include "test_fast_common.h"

#define KF 2.0
#define KB 4.0

static int g_arch;

typedef struct aprob {
    fprob f;
    int64_t nw, nwv;   /* elements of W1 (= W2) and w */
    float *w1, *w2, *w;
    double *w1d, *w2d, *wd;
} aprob;

typedef struct cfg {
    int64_t B, nq, nk, H, Hkv, D, Dv, A;
    qkv_norm norm;
    int relu_div;
    qkv_mask mask;
    int64_t wl, wr;
    double cap;
    qkv_bias_kind bias;
    int kl, packed;
    double sd;  /* of q and k */
} cfg;

static int ap_make(aprob *p, const cfg *c, uint64_t seed) {
    memset(p, 0, sizeof *p);
    qkv_attn_desc *d = &p->f.d;
    qkv_attn_desc_init(d);
    d->batch = c->B, d->n_q = c->nq, d->n_k = c->nk;
    d->heads = c->H, d->heads_kv = c->Hkv;
    d->dim = c->D, d->dim_v = c->Dv;
    d->score = QKV_SCORE_ADDITIVE;
    d->additive_dim = c->A;
    d->additive_w1 = d->additive_w2 = d->additive_w = (const void *)1; /* for plan_make */
    d->norm = c->norm;
    d->relu_divide_by_count = c->relu_div;
    d->mask = c->mask;
    d->window_left = c->wl;
    d->window_right = c->wr;
    d->softcap = c->cap;
    d->bias_kind = c->bias;
    if (c->kl) {
        d->key_lengths = p->f.key_lengths;
        for (int64_t b = 0; b < c->B; b++) p->f.key_lengths[b] = (b * 7 + 3) % (c->nk + 1);
        p->f.key_lengths[0] = c->nk > 1 ? c->nk - 1 : c->nk;
    }
    if (c->packed) { /* three sequences, one of them empty on the key side when possible */
        d->num_seqs = 3;
        p->f.offq[0] = 0;
        p->f.offq[1] = c->nq / 3;
        p->f.offq[2] = 2 * c->nq / 3;
        p->f.offq[3] = c->nq;
        p->f.offk[0] = 0;
        p->f.offk[1] = c->nk / 2;
        p->f.offk[2] = c->nk / 2;
        p->f.offk[3] = c->nk;
        d->seq_offsets_q = p->f.offq;
        d->seq_offsets_k = p->f.offk;
    }
    if (!fp_make(&p->f, seed, c->sd)) return 0;
    tu_rng r;
    tu_rng_seed(&r, seed ^ 0x5eed);
    p->nw = c->H * c->A * c->D;
    p->nwv = c->H * c->A;
    p->w1 = malloc((size_t)p->nw * sizeof(float));
    p->w2 = malloc((size_t)p->nw * sizeof(float));
    p->w = malloc((size_t)p->nwv * sizeof(float));
    double sw = 1.0 / sqrt((double)c->D);
    tu_fill_normal_f32(&r, p->w1, (size_t)p->nw, sw);
    tu_fill_normal_f32(&r, p->w2, (size_t)p->nw, sw);
    tu_fill_normal_f32(&r, p->w, (size_t)p->nwv, 1.5 / sqrt((double)c->A));
    d->additive_w1 = p->f.plan.d.additive_w1 = p->w1;
    d->additive_w2 = p->f.plan.d.additive_w2 = p->w2;
    d->additive_w = p->f.plan.d.additive_w = p->w;
    fp_sync(&p->f);
    p->w1d = fp_to_f64(p->w1, p->nw);
    p->w2d = fp_to_f64(p->w2, p->nw);
    p->wd = fp_to_f64(p->w, p->nwv);
    return 1;
}

static void ap_free(aprob *p) {
    fp_free(&p->f);
    free(p->w1); free(p->w2); free(p->w);
    free(p->w1d); free(p->w2d); free(p->wd);
}

static qkv_attn_desc ap_desc64(const aprob *p) {
    qkv_attn_desc d = fp_desc64(&p->f);
    d.additive_w1 = p->w1d;
    d.additive_w2 = p->w2d;
    d.additive_w = p->wd;
    return d;
}

static void describe(const aprob *p, char *buf, size_t len) {
    const qkv_attn_desc *d = &p->f.d;
    snprintf(buf, len,
             "[%s] B=%lld nq=%lld nk=%lld H=%lld Hkv=%lld D=%lld Dv=%lld A=%lld norm=%d%s mask=%d(%lld,%lld) "
             "cap=%g bias=%d kl=%d packed=%lld",
             qkv_arch_name(g_arch), (long long)d->batch, (long long)d->n_q, (long long)d->n_k, (long long)d->heads,
             (long long)d->heads_kv, (long long)d->dim, (long long)d->dim_v, (long long)d->additive_dim, (int)d->norm,
             d->relu_divide_by_count ? "/n" : "", (int)d->mask, (long long)d->window_left,
             (long long)d->window_right, d->softcap, (int)d->bias_kind, d->key_lengths != NULL,
             (long long)d->num_seqs);
}

/* ---- naive32: the plain float algorithm ---------------------------------- */

/* u [n, A] = rows of x (one head, stride ld) times W^T, sums in float. */
static void n32_project(const float *W, const float *x, int64_t n, int64_t ld, int64_t D, int64_t A, float *u) {
    for (int64_t r = 0; r < n; r++)
        for (int64_t a = 0; a < A; a++) {
            float acc = 0.0f;
            for (int64_t t = 0; t < D; t++) acc += W[a * D + t] * x[r * ld + t];
            u[r * A + a] = acc;
        }
}

typedef struct n32 {
    float *uq, *uk, *raw, *s, *wt, *dp, *duq, *duk;
} n32;

static void n32_alloc(n32 *z, const aprob *p) {
    const qkv_attn_desc *d = &p->f.plan.d;
    z->uq = malloc((size_t)(d->n_q * d->additive_dim) * sizeof(float));
    z->uk = malloc((size_t)(d->n_k * d->additive_dim) * sizeof(float));
    z->duq = malloc((size_t)(d->n_q * d->additive_dim) * sizeof(float));
    z->duk = malloc((size_t)(d->n_k * d->additive_dim) * sizeof(float));
    z->raw = malloc((size_t)d->n_k * sizeof(float));
    z->s = malloc((size_t)d->n_k * sizeof(float));
    z->wt = malloc((size_t)d->n_k * sizeof(float));
    z->dp = malloc((size_t)d->n_k * sizeof(float));
}

static void n32_release(n32 *z) {
    free(z->uq); free(z->uk); free(z->duq); free(z->duk); free(z->raw); free(z->s); free(z->wt); free(z->dp);
}

static void n32_head(const aprob *p, n32 *z, int64_t b, int64_t h) {
    const qkv_attn_desc *d = &p->f.plan.d;
    int64_t D = d->dim, A = d->additive_dim, hk = h / p->f.plan.group;
    n32_project(p->w1 + h * A * D, p->f.q + fp_idx(b, 0, h, d->n_q, d->heads, D), d->n_q, d->heads * D, D, A, z->uq);
    n32_project(p->w2 + h * A * D, p->f.k + fp_idx(b, 0, hk, d->n_k, d->heads_kv, D), d->n_k, d->heads_kv * D, D, A,
                z->uk);
}

/* Logits of row i into z->s (and raw); returns the visible count. */
static int64_t n32_logits(const aprob *p, n32 *z, int64_t h, int64_t i, int64_t lo, int64_t hi) {
    const qkv_attn_desc *d = &p->f.plan.d;
    int64_t A = d->additive_dim, vis = 0;
    for (int64_t j = lo; j < hi; j++) {
        float bias = 0.0f;
        if (d->bias_kind == QKV_BIAS_SHARED) bias = p->f.bias[i * d->n_k + j];
        if (d->bias_kind == QKV_BIAS_PER_HEAD) bias = p->f.bias[(h * d->n_q + i) * d->n_k + j];
        if (bias == -INFINITY) {
            z->raw[j] = 0.0f;
            z->s[j] = -INFINITY;
            continue;
        }
        float r = 0.0f;
        for (int64_t a = 0; a < A; a++) r += p->w[h * A + a] * tanhf(z->uq[i * A + a] + z->uk[j * A + a]);
        z->raw[j] = r;
        float x = d->softcap > 0 ? (float)d->softcap * tanhf(r / (float)d->softcap) : r;
        z->s[j] = x + bias;
        vis++;
    }
    return vis;
}

static void n32_forward_add(const aprob *p, float *out, float *lse, float *attn) {
    const qkv_attn_desc *d = &p->f.plan.d;
    int64_t nk = d->n_k, Dv = d->dim_v;
    n32 z;
    n32_alloc(&z, p);
    for (int64_t b = 0; b < d->batch; b++)
        for (int64_t h = 0; h < d->heads; h++) {
            n32_head(p, &z, b, h);
            for (int64_t i = 0; i < d->n_q; i++) {
                int64_t lo, hi;
                qkv_plan_key_range(&p->f.plan, b, i, &lo, &hi);
                int64_t vis = n32_logits(p, &z, h, i, lo, hi);
                float l;
                n32_norm(&p->f, z.s, z.wt, lo, hi, vis, &l);
                float *o = out + fp_idx(b, i, h, d->n_q, d->heads, Dv);
                for (int64_t t = 0; t < Dv; t++) o[t] = 0.0f;
                for (int64_t j = lo; j < hi; j++) {
                    if (z.s[j] == -INFINITY) continue;
                    const float *vj = p->f.v + fp_idx(b, j, h / p->f.plan.group, nk, d->heads_kv, Dv);
                    for (int64_t t = 0; t < Dv; t++) o[t] += z.wt[j] * vj[t];
                }
                int64_t row = (b * d->heads + h) * d->n_q + i;
                lse[row] = l;
                for (int64_t j = 0; j < nk; j++) attn[row * nk + j] = (j >= lo && j < hi) ? z.wt[j] : 0.0f;
            }
        }
    n32_release(&z);
}

typedef struct grads {
    float *dq, *dk, *dv, *db, *dw1, *dw2, *dw;
} grads;

static void grads_alloc(grads *g, const aprob *p) {
    g->dq = tu_guarded_alloc((size_t)p->f.nq_el * sizeof(float));
    g->dk = tu_guarded_alloc((size_t)p->f.nk_el * sizeof(float));
    g->dv = tu_guarded_alloc((size_t)p->f.nv_el * sizeof(float));
    g->db = p->f.nb_el ? tu_guarded_alloc((size_t)p->f.nb_el * sizeof(float)) : NULL;
    g->dw1 = tu_guarded_alloc((size_t)p->nw * sizeof(float));
    g->dw2 = tu_guarded_alloc((size_t)p->nw * sizeof(float));
    g->dw = tu_guarded_alloc((size_t)p->nwv * sizeof(float));
}

static int grads_guards_ok(const grads *g) {
    return tu_guarded_ok(g->dq) && tu_guarded_ok(g->dk) && tu_guarded_ok(g->dv) && (!g->db || tu_guarded_ok(g->db)) &&
           tu_guarded_ok(g->dw1) && tu_guarded_ok(g->dw2) && tu_guarded_ok(g->dw);
}

static void grads_free(grads *g) {
    tu_guarded_free(g->dq); tu_guarded_free(g->dk); tu_guarded_free(g->dv); tu_guarded_free(g->db);
    tu_guarded_free(g->dw1); tu_guarded_free(g->dw2); tu_guarded_free(g->dw);
}

static void n32_backward_add(const aprob *p, grads *g) {
    const qkv_attn_desc *d = &p->f.plan.d;
    const int64_t nq = d->n_q, nk = d->n_k, D = d->dim, Dv = d->dim_v, A = d->additive_dim, G = p->f.plan.group;
    memset(g->dq, 0, (size_t)p->f.nq_el * sizeof(float));
    memset(g->dk, 0, (size_t)p->f.nk_el * sizeof(float));
    memset(g->dv, 0, (size_t)p->f.nv_el * sizeof(float));
    if (g->db) memset(g->db, 0, (size_t)p->f.nb_el * sizeof(float));
    memset(g->dw1, 0, (size_t)p->nw * sizeof(float));
    memset(g->dw2, 0, (size_t)p->nw * sizeof(float));
    memset(g->dw, 0, (size_t)p->nwv * sizeof(float));
    n32 z;
    n32_alloc(&z, p);
    for (int64_t b = 0; b < d->batch; b++)
        for (int64_t h = 0; h < d->heads; h++) {
            const int64_t hk = h / G;
            n32_head(p, &z, b, h);
            memset(z.duq, 0, (size_t)(nq * A) * sizeof(float));
            memset(z.duk, 0, (size_t)(nk * A) * sizeof(float));
            for (int64_t i = 0; i < nq; i++) {
                int64_t lo, hi;
                qkv_plan_key_range(&p->f.plan, b, i, &lo, &hi);
                int64_t vis = n32_logits(p, &z, h, i, lo, hi);
                float l;
                n32_norm(&p->f, z.s, z.wt, lo, hi, vis, &l);
                if (vis == 0) continue;
                const float *dorow = p->f.dout + fp_idx(b, i, h, nq, d->heads, Dv);
                float pdp = 0.0f;
                for (int64_t j = lo; j < hi; j++) {
                    if (z.s[j] == -INFINITY) continue;
                    const float *vj = p->f.v + fp_idx(b, j, hk, nk, d->heads_kv, Dv);
                    float *dvj = g->dv + fp_idx(b, j, hk, nk, d->heads_kv, Dv);
                    float acc = 0.0f;
                    for (int64_t t = 0; t < Dv; t++) {
                        acc += dorow[t] * vj[t];
                        dvj[t] += z.wt[j] * dorow[t];
                    }
                    z.dp[j] = acc;
                    pdp += z.wt[j] * acc;
                }
                for (int64_t j = lo; j < hi; j++) {
                    if (z.s[j] == -INFINITY) continue;
                    float ds, wj = z.wt[j];
                    if (d->norm == QKV_NORM_SOFTMAX)
                        ds = wj * (z.dp[j] - pdp);
                    else if (d->norm == QKV_NORM_RELU)
                        ds = (wj > 0 ? z.dp[j] : 0.0f) / (d->relu_divide_by_count ? (float)vis : 1.0f);
                    else
                        ds = z.dp[j] * wj * (1.0f - wj);
                    if (g->db) g->db[d->bias_kind == QKV_BIAS_PER_HEAD ? (h * nq + i) * nk + j : i * nk + j] += ds;
                    if (d->softcap > 0) {
                        float t = tanhf(z.raw[j] / (float)d->softcap);
                        ds *= 1.0f - t * t;
                    }
                    for (int64_t a = 0; a < A; a++) {
                        float t = tanhf(z.uq[i * A + a] + z.uk[j * A + a]);
                        g->dw[h * A + a] += ds * t;
                        float ga = ds * p->w[h * A + a] * (1.0f - t * t);
                        z.duq[i * A + a] += ga;
                        z.duk[j * A + a] += ga;
                    }
                }
            }
            /* dx += W^T du, dW += du x^T, for both sides */
            for (int side = 0; side < 2; side++) {
                int64_t n = side ? nk : nq, hx = side ? hk : h, hn = side ? d->heads_kv : d->heads;
                const float *x = side ? p->f.k : p->f.q, *W = (side ? p->w2 : p->w1) + h * A * D;
                float *dx = side ? g->dk : g->dq, *dW = (side ? g->dw2 : g->dw1) + h * A * D;
                const float *du = side ? z.duk : z.duq;
                for (int64_t r = 0; r < n; r++) {
                    const float *xr = x + fp_idx(b, r, hx, n, hn, D);
                    float *dxr = dx + fp_idx(b, r, hx, n, hn, D);
                    for (int64_t a = 0; a < A; a++)
                        for (int64_t t = 0; t < D; t++) {
                            dxr[t] += W[a * D + t] * du[r * A + a];
                            dW[a * D + t] += du[r * A + a] * xr[t];
                        }
                }
            }
        }
    n32_release(&z);
}

/* ---- runs ----------------------------------------------------------------- */

static qkv_status fast_fwd(const aprob *p, int threads, float *out, float *lse, float *attn) {
    qkv_attn_desc d = p->f.d;
    d.impl = QKV_IMPL_FAST;
    d.threads = threads;
    return qkv_attention_forward(&d, p->f.q, p->f.k, p->f.v, out, attn, lse);
}

static qkv_status fast_bwd(const aprob *p, int threads, int give_fwd, grads *g) {
    qkv_attn_desc d = p->f.d;
    d.impl = QKV_IMPL_FAST;
    d.threads = threads;
    float *o = NULL, *l = NULL;
    qkv_status s = QKV_OK;
    if (give_fwd) {
        o = malloc((size_t)p->f.no_el * sizeof(float));
        l = malloc((size_t)p->f.nl_el * sizeof(float));
        s = qkv_attention_forward(&d, p->f.q, p->f.k, p->f.v, o, NULL, l);
    }
    qkv_attn_grads gr = {g->dq, g->dk, g->dv, g->db, g->dw1, g->dw2, g->dw, NULL};
    if (s == QKV_OK) s = qkv_attention_backward(&d, p->f.q, p->f.k, p->f.v, o, l, p->f.dout, &gr);
    free(o);
    free(l);
    return s;
}

static double *ref_f64(int64_t n) { return calloc((size_t)(n ? n : 1), sizeof(double)); }

/* One problem: forward and backward of the fast path against the
 * reference with the tolerance rule; then threads 2 and 3 bitwise. */
static void check_problem(const cfg *c, uint64_t seed, int give_fwd) {
    aprob p;
    char what[400];
    if (!ap_make(&p, c, seed)) {
        CHECK(0, "bad test problem (seed %llu)", (unsigned long long)seed);
        return;
    }
    describe(&p, what, sizeof what);
    const fprob *f = &p.f;
    /* forward */
    float *o = malloc((size_t)f->no_el * sizeof(float)), *l = malloc((size_t)f->nl_el * sizeof(float));
    float *a = malloc((size_t)f->na_el * sizeof(float));
    float *no = malloc((size_t)f->no_el * sizeof(float)), *nl = malloc((size_t)f->nl_el * sizeof(float));
    float *na = malloc((size_t)f->na_el * sizeof(float));
    double *ro = ref_f64(f->no_el), *rl = ref_f64(f->nl_el), *ra = ref_f64(f->na_el);
    qkv_attn_desc d64 = ap_desc64(&p);
    CHECK_STATUS(qkv_attention_forward(&d64, f->qd, f->kd, f->vd, ro, ra, rl), QKV_OK);
    CHECK_STATUS(fast_fwd(&p, 1, o, l, a), QKV_OK);
    n32_forward_add(&p, no, nl, na);
    double eo = fp_err(o, ro, f->no_el), el = fp_err(l, rl, f->nl_el), ea = fp_err(a, ra, f->na_el);
    double bo = KF * fp_err(no, ro, f->no_el) + 1e-5, bl = KF * fp_err(nl, rl, f->nl_el) + 1e-5,
           ba = KF * fp_err(na, ra, f->na_el) + 1e-5;
    CHECK(eo <= bo, "%s: out err %.3g > %.3g", what, eo, bo);
    CHECK(el <= bl, "%s: lse err %.3g > %.3g", what, el, bl);
    CHECK(ea <= ba, "%s: attn err %.3g > %.3g", what, ea, ba);
    /* backward */
    grads g, ng;
    grads_alloc(&g, &p);
    grads_alloc(&ng, &p);
    double *rdq = ref_f64(f->nq_el), *rdk = ref_f64(f->nk_el), *rdv = ref_f64(f->nv_el), *rdb = ref_f64(f->nb_el);
    double *rw1 = ref_f64(p.nw), *rw2 = ref_f64(p.nw), *rw = ref_f64(p.nwv);
    qkv_attn_grads rg = {rdq, rdk, rdv, f->nb_el ? rdb : NULL, rw1, rw2, rw, NULL};
    CHECK_STATUS(qkv_attention_backward(&d64, f->qd, f->kd, f->vd, NULL, NULL, f->doutd, &rg), QKV_OK);
    CHECK_STATUS(fast_bwd(&p, 1, give_fwd, &g), QKV_OK);
    CHECK(grads_guards_ok(&g), "%s: guard bytes overwritten", what);
    n32_backward_add(&p, &ng);
    struct {
        const char *name;
        const float *x, *n;
        const double *r;
        int64_t len;
    } cmp[7] = {{"dq", g.dq, ng.dq, rdq, f->nq_el},   {"dk", g.dk, ng.dk, rdk, f->nk_el},
                {"dv", g.dv, ng.dv, rdv, f->nv_el},   {"dbias", g.db, ng.db, rdb, f->nb_el},
                {"dW1", g.dw1, ng.dw1, rw1, p.nw},    {"dW2", g.dw2, ng.dw2, rw2, p.nw},
                {"dw", g.dw, ng.dw, rw, p.nwv}};
    for (int t = 0; t < 7; t++) {
        if (!cmp[t].len) continue;
        double e = fp_err(cmp[t].x, cmp[t].r, cmp[t].len), bound = KB * fp_err(cmp[t].n, cmp[t].r, cmp[t].len) + 1e-5;
        CHECK(e <= bound, "%s%s: %s err %.3g > %.3g", what, give_fwd ? " (out, lse given)" : "", cmp[t].name, e,
              bound);
    }
    /* threads: bitwise */
    for (int th = 2; th <= 3; th++) {
        float *o2 = malloc((size_t)f->no_el * sizeof(float)), *l2 = malloc((size_t)f->nl_el * sizeof(float));
        float *a2 = malloc((size_t)f->na_el * sizeof(float));
        CHECK_STATUS(fast_fwd(&p, th, o2, l2, a2), QKV_OK);
        CHECK(!memcmp(o, o2, (size_t)f->no_el * sizeof(float)) && !memcmp(l, l2, (size_t)f->nl_el * sizeof(float)) &&
                  !memcmp(a, a2, (size_t)f->na_el * sizeof(float)),
              "%s: forward differs with %d threads", what, th);
        grads g2;
        grads_alloc(&g2, &p);
        CHECK_STATUS(fast_bwd(&p, th, give_fwd, &g2), QKV_OK);
        int same = 1;
        for (int t = 0; t < 7; t++) {
            const float *x2 = t == 0 ? g2.dq : t == 1 ? g2.dk : t == 2 ? g2.dv : t == 3 ? g2.db
                              : t == 4 ? g2.dw1 : t == 5 ? g2.dw2 : g2.dw;
            same &= !cmp[t].len || !memcmp(cmp[t].x, x2, (size_t)cmp[t].len * sizeof(float));
        }
        CHECK(same, "%s: backward differs with %d threads", what, th);
        grads_free(&g2);
        free(o2); free(l2); free(a2);
    }
    grads_free(&g);
    grads_free(&ng);
    free(rdq); free(rdk); free(rdv); free(rdb); free(rw1); free(rw2); free(rw);
    free(o); free(l); free(a); free(no); free(nl); free(na); free(ro); free(rl); free(ra);
    ap_free(&p);
}

static cfg base_cfg(int64_t nq, int64_t nk, int64_t D, int64_t A) {
    cfg c = {1, nq, nk, 2, 2, D, D, A, QKV_NORM_SOFTMAX, 0, QKV_MASK_NONE, 0, 0, 0.0, QKV_BIAS_NONE, 0, 0, 1.0};
    return c;
}

static void test_shapes(void) {
    const int64_t ns[] = {1, 2, 7, 63, 65, 129};
    const int64_t As[] = {1, 3, 17, 64}, Ds[] = {1, 7, 64};
    uint64_t seed = 100;
    for (int a = 0; a < 6; a++)
        for (int b = 0; b < 6; b += (a == b ? 1 : 2)) {
            cfg c = base_cfg(ns[a], ns[b], Ds[(a + b) % 3], As[(a + 2 * b) % 4]);
            c.mask = (a + b) % 3 == 0 ? QKV_MASK_CAUSAL : QKV_MASK_NONE;
            check_problem(&c, seed++, (a + b) % 2);
        }
    for (int ai = 0; ai < 4; ai++)
        for (int di = 0; di < 3; di++) {
            cfg c = base_cfg(65, 63, Ds[di], As[ai]);
            c.Dv = Ds[(di + 1) % 3];
            check_problem(&c, seed++, 0);
        }
}

static void test_features(void) {
    uint64_t seed = 500;
    for (int norm = 0; norm < 3; norm++)
        for (int mask = 0; mask < 4; mask++) {
            cfg c = base_cfg(63 + 2 * mask, 65 - mask, 7, 17);
            c.norm = (qkv_norm)norm;
            c.relu_div = norm == QKV_NORM_RELU && mask % 2;
            c.mask = (qkv_mask)mask;
            c.wl = mask >= 2 ? 9 : 0;
            c.wr = mask == QKV_MASK_WINDOW ? 4 : 0;
            c.cap = mask == 1 ? 1.5 : 0.0;
            c.bias = (qkv_bias_kind)((norm + mask) % 3);
            c.B = 1 + mask % 2;
            c.kl = mask == 3;
            c.H = 4;
            c.Hkv = norm == 1 ? 1 : 2; /* GQA / multi-query */
            check_problem(&c, seed++, mask % 2);
        }
    /* packed sequences, with a causal mask and a per-head bias */
    cfg c = base_cfg(65, 63, 7, 3);
    c.packed = 1;
    c.mask = QKV_MASK_CAUSAL;
    c.bias = QKV_BIAS_PER_HEAD;
    check_problem(&c, seed++, 0);
    c.mask = QKV_MASK_NONE;
    c.bias = QKV_BIAS_NONE;
    c.norm = QKV_NORM_SIGMOID;
    c.H = 3;
    c.Hkv = 1;
    check_problem(&c, seed++, 1);
    /* large spread of logits, soft-capped and not */
    c = base_cfg(129, 129, 64, 64);
    c.sd = 4.0;
    check_problem(&c, seed++, 1);
    c.cap = 3.0;
    c.mask = QKV_MASK_CAUSAL;
    check_problem(&c, seed++, 0);
    /* B = 3 with key lengths and SHARED bias: dbias summed over batch and heads */
    c = base_cfg(33, 47, 5, 9);
    c.B = 3;
    c.kl = 1;
    c.bias = QKV_BIAS_SHARED;
    c.mask = QKV_MASK_WINDOW;
    c.wl = 5;
    c.wr = 2;
    check_problem(&c, seed++, 0);
}

/* Rows with no visible key: out 0, lse -inf, attn 0, no gradient, no NaN. */
static void test_fully_masked(void) {
    cfg c = base_cfg(20, 8, 7, 5); /* causal, n_q > n_k: the first 12 queries see nothing */
    c.mask = QKV_MASK_CAUSAL;
    c.B = 2;
    c.kl = 1; /* batch 1: key length 3 */
    aprob p;
    CHECK(ap_make(&p, &c, 900), "problem");
    p.f.key_lengths[1] = 0; /* batch 1 fully masked */
    const fprob *f = &p.f;
    float *o = malloc((size_t)f->no_el * 4), *l = malloc((size_t)f->nl_el * 4), *a = malloc((size_t)f->na_el * 4);
    CHECK_STATUS(fast_fwd(&p, 2, o, l, a), QKV_OK);
    CHECK(!fp_any_nan(o, f->no_el) && !fp_any_nan(a, f->na_el), "NaN in a fully masked forward");
    int ok = 1;
    for (int64_t b = 0; b < 2; b++)
        for (int64_t h = 0; h < 2; h++)
            for (int64_t i = 0; i < 20; i++) {
                if (b == 0 && i >= 12) continue;
                int64_t row = (b * 2 + h) * 20 + i;
                ok &= l[row] == -INFINITY;
                for (int64_t t = 0; t < c.Dv; t++) ok &= o[fp_idx(b, i, h, 20, 2, c.Dv) + t] == 0.0f;
                for (int64_t j = 0; j < 8; j++) ok &= a[row * 8 + j] == 0.0f;
            }
    CHECK(ok, "fully masked rows not zero / lse not -inf");
    for (int give = 0; give < 2; give++) {
        grads g;
        grads_alloc(&g, &p);
        CHECK_STATUS(fast_bwd(&p, 3, give, &g), QKV_OK);
        ok = !fp_any_nan(g.dq, f->nq_el) && !fp_any_nan(g.dk, f->nk_el) && !fp_any_nan(g.dv, f->nv_el);
        for (int64_t i = 0; i < 20; i++)
            for (int64_t t = 0; t < c.D * 2; t++) ok &= g.dq[(20 + i) * 2 * c.D + t] == 0.0f; /* batch 1 */
        for (int64_t j = 0; j < 8 * 2 * c.D; j++) ok &= g.dk[8 * 2 * c.D + j] == 0.0f;
        CHECK(ok, "fully masked rows give a gradient or NaN (out, lse given: %d)", give);
        grads_free(&g);
    }
    free(o); free(l); free(a);
    ap_free(&p);
}

/* NaN in the keys and values a key length hides changes nothing. */
static void test_nan_masked(void) {
    cfg c = base_cfg(17, 40, 7, 17);
    c.kl = 1;
    c.B = 2;
    aprob p;
    CHECK(ap_make(&p, &c, 901), "problem");
    const fprob *f = &p.f;
    float *o1 = malloc((size_t)f->no_el * 4), *o2 = malloc((size_t)f->no_el * 4), *l = malloc((size_t)f->nl_el * 4);
    grads g1, g2;
    grads_alloc(&g1, &p);
    grads_alloc(&g2, &p);
    CHECK_STATUS(fast_fwd(&p, 2, o1, l, NULL), QKV_OK);
    CHECK_STATUS(fast_bwd(&p, 2, 0, &g1), QKV_OK);
    for (int64_t b = 0; b < 2; b++)
        for (int64_t j = f->key_lengths[b]; j < 40; j++)
            for (int64_t h = 0; h < 2; h++) {
                for (int64_t t = 0; t < c.D; t++) p.f.k[fp_idx(b, j, h, 40, 2, c.D) + t] = NAN;
                for (int64_t t = 0; t < c.Dv; t++) p.f.v[fp_idx(b, j, h, 40, 2, c.Dv) + t] = NAN;
            }
    CHECK_STATUS(fast_fwd(&p, 2, o2, l, NULL), QKV_OK);
    CHECK_STATUS(fast_bwd(&p, 2, 0, &g2), QKV_OK);
    CHECK(!memcmp(o1, o2, (size_t)f->no_el * 4), "NaN in masked keys changed the forward");
    CHECK(!memcmp(g1.dq, g2.dq, (size_t)f->nq_el * 4) && !memcmp(g1.dw, g2.dw, (size_t)p.nwv * 4) &&
              !memcmp(g1.dw1, g2.dw1, (size_t)p.nw * 4),
          "NaN in masked keys changed dq, dw or dW1");
    /* dk, dv of visible keys unchanged; of masked keys zero */
    int ok = 1;
    for (int64_t b = 0; b < 2; b++)
        for (int64_t j = 0; j < 40; j++)
            for (int64_t h = 0; h < 2; h++) {
                int masked = j >= f->key_lengths[b];
                for (int64_t t = 0; t < c.D; t++) {
                    int64_t at = fp_idx(b, j, h, 40, 2, c.D) + t;
                    ok &= masked ? g2.dk[at] == 0.0f : g2.dk[at] == g1.dk[at];
                    ok &= masked ? g2.dv[at] == 0.0f : g2.dv[at] == g1.dv[at];
                }
            }
    CHECK(ok, "NaN in masked keys reached dk or dv");
    grads_free(&g1);
    grads_free(&g2);
    free(o1); free(o2); free(l);
    ap_free(&p);
}

/* The kernel's tanh against tanh in double: within 4 ulp of the result
 * (or 1e-45 absolute near 0), odd, and NaN stays NaN. */
static void test_tanh(void) {
    const qkv_additive_kernels *K = qkv_additive_kernels_active();
    enum { N = 20011 };
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
    for (int i = 0; i < N; i++) {
        double u = -12.0 + 24.0 * i / (N - 1);
        x[i] = (float)(i % 3 == 0 ? u : i % 3 == 1 ? u * 1e-3 : u * 1e-6);
    }
    x[0] = 0.0f;
    x[1] = -0.0f;
    x[2] = NAN;
    x[3] = INFINITY;
    x[4] = -INFINITY;
    x[5] = 0.5f;
    x[6] = nextafterf(0.5f, 0.0f);
    memcpy(y, x, N * sizeof(float));
    K->tanh_n(y, N - 3); /* a tail that is not a whole vector */
    double worst = 0.0;
    for (int i = 0; i < N - 3; i++) {
        if (isnan(x[i])) {
            CHECK(isnan(y[i]), "tanh(NaN) is %g", y[i]);
            continue;
        }
        double r = tanh((double)x[i]);
        double ulp = fabs(r) < 1e-37 ? 1e-45 : fabs(nextafterf((float)fabs(r), INFINITY) - (float)fabs(r));
        double e = fabs(y[i] - r) / ulp;
        if (e > worst) worst = e;
        if (!(e <= 4.0)) {
            CHECK(0, "[%s] tanh(%.9g) = %.9g, want %.9g (%.2f ulp)", K->name, x[i], y[i], r, e);
            break;
        }
    }
    CHECK(y[N - 3] == x[N - 3] && y[N - 1] == x[N - 1], "tanh_n wrote past n");
    printf("  [%s] tanh: worst %.2f ulp\n", K->name, worst);
    free(x);
    free(y);
}

/* AUTO takes the fast path for F32; ALiBi stays with the reference under
 * AUTO and is refused under FAST. */
static void test_dispatch(void) {
    cfg c = base_cfg(9, 9, 4, 3);
    aprob p;
    CHECK(ap_make(&p, &c, 902), "problem");
    const fprob *f = &p.f;
    float *o1 = malloc((size_t)f->no_el * 4), *o2 = malloc((size_t)f->no_el * 4);
    qkv_attn_desc d = f->d;
    CHECK_STATUS(qkv_attention_forward(&d, f->q, f->k, f->v, o1, NULL, NULL), QKV_OK);
    CHECK_STATUS(fast_fwd(&p, 1, o2, NULL, NULL), QKV_OK);
    CHECK(!memcmp(o1, o2, (size_t)f->no_el * 4), "AUTO is not the fast additive path");
    float slopes[2] = {0.5f, 0.25f};
    d.alibi_slopes = slopes;
    CHECK_STATUS(qkv_attention_forward(&d, f->q, f->k, f->v, o1, NULL, NULL), QKV_OK);
    d.impl = QKV_IMPL_FAST;
    CHECK_STATUS(qkv_attention_forward(&d, f->q, f->k, f->v, o1, NULL, NULL), QKV_ERR_UNSUPPORTED);
    d.alibi_slopes = NULL;
    d.dropout = 0.1;
    CHECK_STATUS(qkv_attention_forward(&d, f->q, f->k, f->v, o1, NULL, NULL), QKV_ERR_UNSUPPORTED);
    free(o1);
    free(o2);
    ap_free(&p);
}

/* Allocation failures: each allocation of a call refused in turn (the
 * workspace, then the GEMM's packing buffers inside the units) gives
 * QKV_ERR_OUT_OF_MEMORY and frees everything taken. One thread, so that
 * the countdown is not shared. */
static long g_countdown = -1; /* allocations left before one fails; -1: none fails */
static void *countdown_alloc(size_t n, void *user) {
    (void)user;
    if (g_countdown == 0) return NULL;
    if (g_countdown > 0) g_countdown--;
    return malloc(n);
}
static void countdown_free(void *ptr, void *user) {
    (void)user;
    free(ptr);
}

static void test_alloc_failures(void) {
    cfg c = base_cfg(40, 33, 8, 5);
    c.bias = QKV_BIAS_SHARED;
    aprob p;
    CHECK(ap_make(&p, &c, 903), "problem");
    const fprob *f = &p.f;
    float *o = malloc((size_t)f->no_el * 4), *l = malloc((size_t)f->nl_el * 4);
    grads g;
    grads_alloc(&g, &p);
    const size_t base = qkv_memory_in_use();
    CHECK_STATUS(qkv_set_allocator(countdown_alloc, countdown_free, NULL), QKV_OK);
    for (int backward = 0; backward < 2; backward++) {
        long k = 0;
        qkv_status st;
        do {
            g_countdown = k++;
            st = backward ? fast_bwd(&p, 1, 0, &g) : fast_fwd(&p, 1, o, l, NULL);
            CHECK(st == QKV_OK || st == QKV_ERR_OUT_OF_MEMORY, "allocation %ld refused: status %d", k - 1, st);
            CHECK(qkv_memory_in_use() == base, "allocation %ld refused: %zu bytes left", k - 1,
                  qkv_memory_in_use() - base);
        } while (st != QKV_OK && k < 1000);
        CHECK(st == QKV_OK && k >= 3, "%s: %ld allocations (want the workspace and the GEMM's)",
              backward ? "backward" : "forward", k - 1);
    }
    g_countdown = -1;
    CHECK_STATUS(qkv_set_allocator(NULL, NULL, NULL), QKV_OK);
    grads_free(&g);
    free(o); free(l);
    ap_free(&p);
}

/* Every test on one ISA path; 0 when the CPU or the build lacks it. */
static int run_arch(int arch) {
    if (!qkv_cpu_force_arch(arch)) {
        printf("arch %s: not available here, skipped\n", qkv_arch_name(arch));
        return 0;
    }
    static void (*const tests[])(void) = {test_tanh,         test_shapes,     test_features,      test_fully_masked,
                                          test_nan_masked,   test_dispatch,   test_alloc_failures};
    g_arch = arch;
    long failed_before = tu_failed;
    for (size_t t = 0; t < sizeof tests / sizeof tests[0]; t++) tests[t]();
    printf("arch %s: %s\n", qkv_arch_name(arch), tu_failed == failed_before ? "ok" : "FAILED");
    return 1;
}

int main(void) {
    int ran = 0;
    for (int arch = 0; arch < QKV_ARCH_COUNT; arch++) ran += run_arch(arch);
    qkv_cpu_force_arch(-1);
    CHECK(ran >= 1 && qkv_cpu_has(QKV_ARCH_GENERIC), "no arch ran");
    return tu_finish();
}
