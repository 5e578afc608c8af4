/* The multi-head attention layer: forward against the formula computed by
 * hand in double, gradients of every parameter and input by central finite
 * differences, decoding with the KV cache against one causal forward,
 * safetensors round trips with torch's names, and errors. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

typedef struct mha_case {
    const char *name;
    int64_t E, H, H_kv, Dh, kdim, vdim;
    int bias, cross, kv_same, use_lengths;
    qkv_head_join join;
    qkv_pos_kind pos;
    qkv_mask mask;
} mha_case;

static const mha_case CASES[] = {
    {"fused self-attention", 8, 2, 0, 0, 0, 0, 1, 0, 0, 0, QKV_JOIN_CONCAT, QKV_POS_NONE, QKV_MASK_NONE},
    {"causal self-attention, no bias, padding", 8, 2, 0, 0, 0, 0, 0, 0, 0, 1, QKV_JOIN_CONCAT, QKV_POS_NONE,
     QKV_MASK_CAUSAL},
    {"GQA cross-attention kdim/vdim", 8, 4, 2, 3, 6, 5, 1, 1, 0, 0, QKV_JOIN_CONCAT, QKV_POS_NONE, QKV_MASK_NONE},
    {"cross-attention, keys = values", 8, 2, 1, 0, 6, 6, 1, 1, 1, 1, QKV_JOIN_CONCAT, QKV_POS_NONE, QKV_MASK_NONE},
    {"mean of heads", 8, 2, 0, 0, 0, 0, 1, 0, 0, 0, QKV_JOIN_MEAN, QKV_POS_NONE, QKV_MASK_NONE},
    {"RoPE causal", 8, 2, 0, 0, 0, 0, 1, 0, 0, 0, QKV_JOIN_CONCAT, QKV_POS_ROPE, QKV_MASK_CAUSAL},
    {"ALiBi causal", 8, 2, 0, 0, 0, 0, 1, 0, 0, 0, QKV_JOIN_CONCAT, QKV_POS_ALIBI, QKV_MASK_CAUSAL},
    {"relative bidirectional", 8, 2, 0, 0, 0, 0, 1, 0, 0, 0, QKV_JOIN_CONCAT, QKV_POS_RELATIVE, QKV_MASK_NONE},
};

enum { B = 2, NQ = 5, NK = 6 };

static qkv_mha *make(const mha_case *c, uint64_t seed) {
    qkv_mha_config cfg;
    qkv_mha_config_init(&cfg, c->E, c->H);
    cfg.heads_kv = c->H_kv;
    cfg.head_dim = c->Dh;
    cfg.kdim = c->kdim;
    cfg.vdim = c->vdim;
    cfg.bias = c->bias;
    cfg.join = c->join;
    cfg.pos = c->pos;
    cfg.rel_buckets = 8;
    cfg.rel_max_distance = 4;
    cfg.attn.mask = c->mask;
    qkv_mha *m = NULL;
    CHECK_STATUS(qkv_mha_create(&cfg, seed, &m), QKV_OK);
    if (m) {
        /* Non-zero biases and relative table, so their gradients matter. */
        int64_t n;
        float *p = qkv_mha_params(m, &n);
        tu_perturb_f32(p, n, seed + 1, 0.1);
    }
    return m;
}

typedef struct io {
    int64_t nk, kdim, vdim;
    float xq[B * NQ * 8], xk[B * NK * 8], xv[B * NK * 8], y[B * NQ * 8], dy[B * NQ * 8];
    float dxq[B * NQ * 8], dxk[B * NK * 8], dxv[B * NK * 8];
    int64_t lengths[B];
} io;

static void io_fill(io *t, const mha_case *c, tu_rng *r) {
    memset(t, 0, sizeof *t);
    t->nk = c->cross ? NK : NQ;
    t->kdim = c->kdim ? c->kdim : c->E;
    t->vdim = c->vdim ? c->vdim : c->E;
    tu_fill_normal_f32(r, t->xq, B * NQ * 8, 1.0);
    tu_fill_normal_f32(r, t->xk, B * NK * 8, 1.0);
    tu_fill_normal_f32(r, t->xv, B * NK * 8, 1.0);
    tu_fill_normal_f32(r, t->dy, B * NQ * 8, 1.0);
    t->lengths[0] = t->nk;
    t->lengths[1] = t->nk - 2;
}

static qkv_status run_fwd(qkv_mha *m, const mha_case *c, io *t) {
    return qkv_mha_forward(m, B, NQ, t->nk, t->xq, c->cross ? t->xk : NULL,
                           c->cross && !c->kv_same ? t->xv : NULL, c->use_lengths ? t->lengths : NULL, t->y,
                           NULL);
}

static double loss(qkv_mha *m, const mha_case *c, io *t) {
    qkv_status s = run_fwd(m, c, t);
    if (s != QKV_OK) return NAN;
    double l = 0.0;
    for (int i = 0; i < B * NQ * c->E; i++) l += (double)t->y[i] * t->dy[i];
    return l;
}

/* Central difference of the loss at x[i] against the analytic g. The layer
 * runs in float: with step 4e-3 the rounding error of the difference is
 * about 1e-6 * |L| / 4e-3 ~ 1e-3 here, far below the O(0.1..1) error a
 * wrong wiring gives. The attention core itself is checked in double. */
static int fd_check(qkv_mha *m, const mha_case *c, io *t, float *x, const float *g, int64_t n,
                    const char *what) {
    const double h = 4e-3;
    int bad = 0;
    int64_t step = n > 40 ? n / 40 : 1; /* a spread sample keeps the suite fast */
    for (int64_t i = 0; i < n; i += step) {
        float keep = x[i];
        x[i] = (float)(keep + h);
        double lp = loss(m, c, t);
        x[i] = (float)(keep - h);
        double lm = loss(m, c, t);
        x[i] = keep;
        double fd = (lp - lm) / (2 * h);
        if (fabs(fd - g[i]) > 5e-3 + 1e-2 * fabs(fd)) {
            if (!bad)
                fprintf(stderr, "  %s: %s[%lld]: finite difference %.6g, backward %.6g\n", c->name, what,
                        (long long)i, fd, (double)g[i]);
            bad = 1;
        }
    }
    return !bad;
}

static void test_gradients(const mha_case *c) {
    tu_rng r;
    tu_rng_seed(&r, 99);
    qkv_mha *m = make(c, 1234);
    if (!m) return;
    io *t = calloc(1, sizeof *t);
    io_fill(t, c, &r);
    CHECK_STATUS(run_fwd(m, c, t), QKV_OK);
    qkv_mha_zero_grad(m);
    CHECK_STATUS(qkv_mha_backward(m, t->xq, c->cross ? t->xk : NULL, c->cross && !c->kv_same ? t->xv : NULL, t->dy,
                                  t->dxq, c->cross ? t->dxk : NULL, c->cross && !c->kv_same ? t->dxv : NULL),
                 QKV_OK);
    int64_t np;
    float *p = qkv_mha_params(m, &np);
    float *g = malloc((size_t)np * sizeof(float));
    memcpy(g, qkv_mha_grads(m, NULL), (size_t)np * sizeof(float));
    float *dxq = malloc(sizeof t->dxq), *dxk = malloc(sizeof t->dxk), *dxv = malloc(sizeof t->dxv);
    memcpy(dxq, t->dxq, sizeof t->dxq);
    memcpy(dxk, t->dxk, sizeof t->dxk);
    memcpy(dxv, t->dxv, sizeof t->dxv);
    CHECK(fd_check(m, c, t, p, g, np, "params"), "%s: parameter gradients", c->name);
    CHECK(fd_check(m, c, t, t->xq, dxq, B * NQ * c->E, "x_q"), "%s: dx_q", c->name);
    if (c->cross) {
        CHECK(fd_check(m, c, t, t->xk, dxk, B * NK * t->kdim, "x_k"), "%s: dx_k", c->name);
        if (!c->kv_same) CHECK(fd_check(m, c, t, t->xv, dxv, B * NK * t->vdim, "x_v"), "%s: dx_v", c->name);
    }
    /* Gradients accumulate over backward calls until zeroed. */
    CHECK_STATUS(run_fwd(m, c, t), QKV_OK);
    CHECK_STATUS(qkv_mha_backward(m, t->xq, c->cross ? t->xk : NULL, c->cross && !c->kv_same ? t->xv : NULL, t->dy,
                                  NULL, NULL, NULL),
                 QKV_OK);
    float *g2 = qkv_mha_grads(m, NULL);
    double worst = 0;
    for (int64_t i = 0; i < np; i++) worst = fmax(worst, fabs(g2[i] - 2 * g[i]));
    CHECK(worst < 1e-4, "%s: a second backward adds the same gradient (%g)", c->name, worst);
    free(g);
    free(dxq);
    free(dxk);
    free(dxv);
    free(t);
    qkv_mha_free(m);
}

/* y by the formula, in double, from the layer's own parameters (torch's
 * layout): q = x Wqᵀ + bq, ..., o_h = softmax(q_h k_hᵀ/√Dh) v_h, y = [o_h] Woᵀ + bo. */
static void test_formula(void) {
    const mha_case *c = &CASES[2]; /* GQA cross-attention with kdim, vdim */
    tu_rng r;
    tu_rng_seed(&r, 7);
    qkv_mha *m = make(c, 42);
    if (!m) return;
    io *t = calloc(1, sizeof *t);
    io_fill(t, c, &r);
    CHECK_STATUS(run_fwd(m, c, t), QKV_OK);
    const int64_t E = c->E, H = c->H, Hk = c->H_kv, Dh = c->Dh, kd = c->kdim, vd = c->vdim;
    const float *P = qkv_mha_params(m, NULL);
    const float *Wq = P, *Wk = Wq + H * Dh * E, *Wv = Wk + Hk * Dh * kd, *bin = Wv + Hk * Dh * vd;
    const float *Wo = bin + (H + 2 * Hk) * Dh, *bo = Wo + E * H * Dh;
    double *q = calloc(B * NQ * H * Dh, 8), *k = calloc(B * NK * Hk * Dh, 8), *v = calloc(B * NK * Hk * Dh, 8);
    double *o = calloc(B * NQ * H * Dh, 8);
    for (int64_t row = 0; row < B * NQ; row++)
        for (int64_t a = 0; a < H * Dh; a++) {
            double acc = bin[a];
            for (int64_t e = 0; e < E; e++) acc += (double)t->xq[row * E + e] * Wq[a * E + e];
            q[row * H * Dh + a] = acc;
        }
    for (int64_t row = 0; row < B * NK; row++)
        for (int64_t a = 0; a < Hk * Dh; a++) {
            double ak = bin[H * Dh + a], av = bin[(H + Hk) * Dh + a];
            for (int64_t e = 0; e < kd; e++) ak += (double)t->xk[row * kd + e] * Wk[a * kd + e];
            for (int64_t e = 0; e < vd; e++) av += (double)t->xv[row * vd + e] * Wv[a * vd + e];
            k[row * Hk * Dh + a] = ak;
            v[row * Hk * Dh + a] = av;
        }
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < NQ; i++) {
                double s[NK], mx = -INFINITY, sum = 0;
                int64_t hk = h / (H / Hk);
                for (int64_t j = 0; j < NK; j++) {
                    double acc = 0;
                    for (int64_t d = 0; d < Dh; d++)
                        acc += q[((b * NQ + i) * H + h) * Dh + d] * k[((b * NK + j) * Hk + hk) * Dh + d];
                    s[j] = acc / sqrt((double)Dh);
                    mx = fmax(mx, s[j]);
                }
                for (int64_t j = 0; j < NK; j++) sum += exp(s[j] - mx);
                for (int64_t d = 0; d < Dh; d++) {
                    double acc = 0;
                    for (int64_t j = 0; j < NK; j++) acc += exp(s[j] - mx) / sum * v[((b * NK + j) * Hk + hk) * Dh + d];
                    o[((b * NQ + i) * H + h) * Dh + d] = acc;
                }
            }
    double worst = 0;
    for (int64_t row = 0; row < B * NQ; row++)
        for (int64_t e = 0; e < E; e++) {
            double acc = bo[e];
            for (int64_t a = 0; a < H * Dh; a++) acc += o[row * H * Dh + a] * Wo[e * H * Dh + a];
            worst = fmax(worst, fabs(acc - t->y[row * E + e]));
        }
    /* float projections of O(1) values through K <= 12 terms: ~1e-6. */
    CHECK(worst < 2e-5, "layer output equals the formula: error %g", worst);
    free(q);
    free(k);
    free(v);
    free(o);
    free(t);
    qkv_mha_free(m);
}

/* Decoding token by token (and in chunks) equals one causal forward. */
static void test_decode(qkv_pos_kind pos, qkv_head_join join) {
    mha_case c = {"decode", 8, 4, 2, 0, 0, 0, 1, 0, 0, 0, join, pos, QKV_MASK_CAUSAL};
    qkv_mha *m = make(&c, 77);
    if (!m) return;
    enum { N = 7 };
    tu_rng r;
    tu_rng_seed(&r, 3);
    float x[B * N * 8], y[B * N * 8], yd[B * N * 8], xt[B * 4 * 8], yt[B * 4 * 8];
    tu_fill_normal_f32(&r, x, B * N * 8, 1.0);
    CHECK_STATUS(qkv_mha_forward(m, B, N, N, x, NULL, NULL, NULL, y, NULL), QKV_OK);
    qkv_kv_cache *kc = NULL;
    CHECK_STATUS(qkv_kv_cache_create(m, B, N, &kc), QKV_OK);
    if (!kc) return;
    const int chunks[2][3] = {{1, 0, 0}, {3, 4, 0}};
    for (int mode = 0; mode < 2; mode++) {
        qkv_kv_cache_reset(kc);
        int64_t at = 0;
        while (at < N) {
            int64_t t = mode == 0 ? 1 : chunks[1][at == 0 ? 0 : 1];
            for (int64_t b = 0; b < B; b++)
                memcpy(xt + b * t * 8, x + (b * N + at) * 8, (size_t)(t * 8) * sizeof(float));
            CHECK_STATUS(qkv_mha_decode(m, kc, t, xt, yt), QKV_OK);
            for (int64_t b = 0; b < B; b++)
                memcpy(yd + (b * N + at) * 8, yt + b * t * 8, (size_t)(t * 8) * sizeof(float));
            at += t;
        }
        CHECK(qkv_kv_cache_length(kc) == N, "cache length");
        double e = 0.0;
        for (int i = 0; i < B * N * 8; i++) e = fmax(e, fabs(y[i] - yd[i]));
        CHECK(e < 1e-5, "decode (pos %d, join %d, %s) equals the causal forward: %g", pos, join,
              mode ? "chunks" : "one token at a time", e);
    }
    CHECK_STATUS(qkv_mha_decode(m, kc, 1, xt, yt), QKV_ERR_POSITION);
    CHECK_STATUS(qkv_mha_decode(m, kc, 0, xt, yt), QKV_ERR_BAD_SIZE);
    CHECK(qkv_kv_cache_length(kc) == N, "a refused decode appends nothing");
    qkv_kv_cache_free(kc);
    qkv_mha_free(m);
}

static void test_save_load(void) {
    for (int ci = 0; ci < 3; ci++) {
        const mha_case *c = &CASES[ci == 2 ? 7 : ci * 2]; /* fused, separate projections, relative */
        qkv_mha *a = make(c, 5), *b = make(c, 6);
        if (!a || !b) return;
        qkv_safetensors *st = NULL;
        CHECK_STATUS(qkv_safetensors_create(&st), QKV_OK);
        CHECK_STATUS(qkv_mha_save(a, st, "layers.0.attn."), QKV_OK);
        if (ci == 0)
            CHECK(qkv_safetensors_get(st, "layers.0.attn.in_proj_weight") != NULL &&
                      qkv_safetensors_get(st, "layers.0.attn.out_proj.bias") != NULL,
                  "fused layer saves in_proj_weight and out_proj.bias");
        if (ci == 1)
            CHECK(qkv_safetensors_get(st, "layers.0.attn.k_proj_weight") != NULL, "separate projections saved");
        char path[512], why[256];
        tu_tmp_path(path, sizeof path, "mha_roundtrip.safetensors");
        CHECK_STATUS(qkv_safetensors_save(st, path), QKV_OK);
        qkv_safetensors_free(st);
        st = NULL;
        CHECK_STATUS(qkv_safetensors_load(path, &st, why, sizeof why), QKV_OK);
        CHECK_STATUS(qkv_mha_load(b, st, "layers.0.attn.", why, sizeof why), QKV_OK);
        int64_t n;
        float *pa = qkv_mha_params(a, &n), *pb = qkv_mha_params(b, NULL);
        CHECK(memcmp(pa, pb, (size_t)n * sizeof(float)) == 0, "%s: parameters survive a round trip", c->name);
        /* Wrong prefix: the first tensor is reported missing, by name. */
        CHECK_STATUS(qkv_mha_load(b, st, "nope.", why, sizeof why), QKV_ERR_FORMAT);
        CHECK(strstr(why, "nope.") != NULL, "missing tensor named in '%s'", why);
        qkv_safetensors_free(st);
        remove(path);
        qkv_mha_free(a);
        qkv_mha_free(b);
    }
    /* A misshapen tensor: a layer of another size. */
    qkv_mha *small = make(&CASES[0], 1);
    mha_case big = CASES[0];
    big.E = 16;
    qkv_mha *large = make(&big, 1);
    qkv_safetensors *st = NULL;
    char why[256];
    CHECK_STATUS(qkv_safetensors_create(&st), QKV_OK);
    CHECK_STATUS(qkv_mha_save(large, st, ""), QKV_OK);
    CHECK_STATUS(qkv_mha_load(small, st, "", why, sizeof why), QKV_ERR_SHAPE);
    CHECK(strstr(why, "in_proj_weight") && strstr(why, "[24, 8]"), "shape error names tensor and shape: '%s'", why);
    qkv_safetensors_free(st);
    qkv_mha_free(small);
    qkv_mha_free(large);
}

/* The same weights and inputs as torch.nn.MultiheadAttention (batch_first)
 * give the same outputs and attention weights: fixture made by
 * tests/data/mha/make_torch_fixture.py. */
static const float *tensor(const qkv_safetensors *st, const char *name, int64_t count) {
    const qkv_array *a = qkv_safetensors_get(st, name);
    CHECK(a && a->dtype == QKV_F32 && qkv_array_count(a) == count, "fixture tensor %s", name);
    return a && qkv_array_count(a) == count ? a->data : NULL;
}

static void test_torch(void) {
    char path[1024], why[256];
    const char *src = getenv("QKV_SOURCE_DIR");
    snprintf(path, sizeof path, "%s/tests/data/mha/torch_mha.safetensors", src ? src : ".");
    qkv_safetensors *st = NULL;
    CHECK_STATUS(qkv_safetensors_load(path, &st, why, sizeof why), QKV_OK);
    if (!st) {
        fprintf(stderr, "  %s: %s\n", path, why);
        return;
    }
    const char *cases[] = {"plain", "causal", "padded"};
    const int64_t lengths[B] = {5, 3};
    for (int cross = 0; cross < 2; cross++) {
        const char *prefix = cross ? "cross." : "self.";
        int64_t nk = cross ? NK : NQ;
        for (int ci = 0; ci < 3; ci++) {
            if (cross && ci == 1) continue; /* causal only for self-attention */
            qkv_mha_config cfg;
            qkv_mha_config_init(&cfg, 8, 2);
            if (cross) {
                cfg.kdim = 6;
                cfg.vdim = 5;
            }
            if (ci == 1) cfg.attn.mask = QKV_MASK_CAUSAL;
            qkv_mha *m = NULL;
            CHECK_STATUS(qkv_mha_create(&cfg, 0, &m), QKV_OK);
            if (!m) continue;
            CHECK_STATUS(qkv_mha_load(m, st, prefix, why, sizeof why), QKV_OK);
            char name[64];
            snprintf(name, sizeof name, "%sx", prefix);
            const float *x = tensor(st, name, B * NQ * 8);
            snprintf(name, sizeof name, "%sxk", prefix);
            const float *xk = cross ? tensor(st, name, B * NK * 6) : NULL;
            snprintf(name, sizeof name, "%sxv", prefix);
            const float *xv = cross ? tensor(st, name, B * NK * 5) : NULL;
            snprintf(name, sizeof name, "%sy_%s", prefix, cases[ci]);
            const float *want_y = tensor(st, name, B * NQ * 8);
            snprintf(name, sizeof name, "%sattn_%s", prefix, cases[ci]);
            const float *want_a = tensor(st, name, B * 2 * NQ * nk);
            float y[B * NQ * 8], attn[B * 2 * NQ * NK];
            if (x && want_y && want_a && (!cross || (xk && xv))) {
                CHECK_STATUS(qkv_mha_forward(m, B, NQ, nk, x, xk, xv, ci == 2 ? lengths : NULL, y, attn), QKV_OK);
                double ey = 0, ea = 0;
                for (int i = 0; i < B * NQ * 8; i++) ey = fmax(ey, fabs(y[i] - want_y[i]));
                for (int i = 0; i < B * 2 * NQ * nk; i++) ea = fmax(ea, fabs(attn[i] - want_a[i]));
                /* Both sides in float, different summation orders: a few ulps. */
                CHECK(ey < 1e-5 && ea < 1e-5, "torch %s%s: output error %g, attention error %g", prefix, cases[ci],
                      ey, ea);
            }
            qkv_mha_free(m);
        }
    }
    qkv_safetensors_free(st);
}

static void test_errors(void) {
    qkv_mha_config cfg;
    qkv_mha *m = NULL;
    qkv_mha_config_init(&cfg, 10, 3);
    CHECK_STATUS(qkv_mha_create(&cfg, 1, &m), QKV_ERR_HEADS);
    qkv_mha_config_init(&cfg, 8, 4);
    cfg.heads_kv = 3;
    CHECK_STATUS(qkv_mha_create(&cfg, 1, &m), QKV_ERR_HEADS);
    qkv_mha_config_init(&cfg, 8, 1);
    cfg.head_dim = 3;
    cfg.pos = QKV_POS_ROPE;
    CHECK_STATUS(qkv_mha_create(&cfg, 1, &m), QKV_ERR_BAD_SIZE);
    qkv_mha_config_init(&cfg, 0, 1);
    CHECK_STATUS(qkv_mha_create(&cfg, 1, &m), QKV_ERR_BAD_SIZE);
    qkv_mha_config_init(&cfg, 8, 2);
    cfg.pos = (qkv_pos_kind)9;
    CHECK_STATUS(qkv_mha_create(&cfg, 1, &m), QKV_ERR_BAD_ENUM);
    qkv_mha_config_init(&cfg, 8, 2);
    cfg.attn.mask = QKV_MASK_WINDOW;
    cfg.attn.window_left = -1;
    CHECK_STATUS(qkv_mha_create(&cfg, 1, &m), QKV_ERR_WINDOW);
    CHECK_STATUS(qkv_mha_create(NULL, 1, &m), QKV_ERR_NULL_POINTER);
    CHECK(m == NULL, "no layer on error");
    qkv_mha_config_init(&cfg, 8, 2);
    CHECK_STATUS(qkv_mha_create(&cfg, 1, &m), QKV_OK);
    float x[2 * 8], y[2 * 8];
    memset(x, 0, sizeof x);
    CHECK_STATUS(qkv_mha_backward(m, x, NULL, NULL, y, y, NULL, NULL), QKV_ERR_UNSUPPORTED);
    CHECK_STATUS(qkv_mha_forward(m, 1, 2, 3, x, NULL, NULL, NULL, y, NULL), QKV_ERR_SHAPE);
    CHECK_STATUS(qkv_mha_forward(m, 0, 2, 2, x, NULL, NULL, NULL, y, NULL), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_mha_forward(m, 1, 2, 2, NULL, NULL, NULL, NULL, y, NULL), QKV_ERR_NULL_POINTER);
    int64_t bad_len = 3;
    CHECK_STATUS(qkv_mha_forward(m, 1, 2, 2, x, NULL, NULL, &bad_len, y, NULL), QKV_ERR_KEY_LENGTHS);
    CHECK_STATUS(qkv_mha_forward(m, 1, 2, 2, x, NULL, NULL, NULL, y, NULL), QKV_OK);
    CHECK_STATUS(qkv_mha_backward(m, x, x, NULL, y, y, NULL, NULL), QKV_ERR_BAD_PARAMETER);
    qkv_kv_cache *kc = NULL;
    CHECK_STATUS(qkv_kv_cache_create(m, 0, 4, &kc), QKV_ERR_BAD_SIZE);
    qkv_mha_free(m);
    qkv_mha_free(NULL);
    qkv_kv_cache_free(NULL);
    CHECK(qkv_mha_params(NULL, NULL) == NULL, "params of NULL");
}

int main(void) {
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) test_gradients(&CASES[i]);
    test_formula();
    test_decode(QKV_POS_NONE, QKV_JOIN_CONCAT);
    test_decode(QKV_POS_ROPE, QKV_JOIN_CONCAT);
    test_decode(QKV_POS_ALIBI, QKV_JOIN_MEAN);
    test_decode(QKV_POS_RELATIVE, QKV_JOIN_CONCAT);
    test_save_load();
    test_torch();
    test_errors();
    return tu_finish();
}
