/* The in-kernel position biases on the fast path (src/attn/fast_posbias.c)
 * against the double reference, on every ISA path the CPU has: ALiBi and
 * T5's relative buckets (decoder and bidirectional, alone and together),
 * with causal, window and causal-window masks, key lengths, packed
 * sequences (self and cross, so positions shift per sequence), GQA, soft-cap,
 * a negative scale and the ReLU / sigmoid normalisers, at awkward sizes
 * (1, 2, 7, 63, 65, 129, 300, n_q != n_k). Forward out and lse (k = 2),
 * backward dq, dk, dv and d_rel_table (k = 4), tolerance rule of
 * test_fast_common.h; bitwise identical for 1, 2, 3 threads; fully masked
 * rows give zeros; the requests that stay with the reference (2-D image
 * offsets, a non-finite parameter) are refused by QKV_IMPL_FAST and still
 * computed by AUTO; bf16 inputs with ALiBi agree with float32. */
#include <stdio.h>

#include "test_fast_common.h"

#define KF 2.0
#define KB 4.0

static int g_arch;

typedef struct pcase {
    int64_t B, nq, nk, H, Hkv, D, Dv;
    int mask;
    int64_t wl, wr;
    int alibi, rel, bidir;
    int64_t buckets, maxd;
    int packed;       /* 1: self (same offsets), 2: cross (own key offsets) */
    int kl;           /* key lengths */
    int norm, score;
    double cap, scale;
    int threads;      /* also check 2 and 3 threads */
} pcase;

typedef struct pb_prob {
    fprob f;
    float slopes[16], *rel;
    double slopes64[16], *rel64;
} pb_prob;

static void describe(const pb_prob *p, char *buf, size_t len) {
    const qkv_attn_desc *d = &p->f.d;
    snprintf(buf, len,
             "[%s] B=%lld nq=%lld nk=%lld H=%lld Hkv=%lld D=%lld Dv=%lld mask=%d(%lld,%lld) kl=%d packed=%lld "
             "alibi=%d rel=%d(bidir %d, %lld buckets, max %lld) norm=%d score=%d cap=%g",
             qkv_arch_name(g_arch), (long long)d->batch, (long long)d->n_q, (long long)d->n_k, (long long)d->heads,
             (long long)d->heads_kv, (long long)d->dim, (long long)d->dim_v, d->mask, (long long)d->window_left,
             (long long)d->window_right, d->key_lengths != NULL, (long long)d->num_seqs, d->alibi_slopes != NULL,
             d->rel_table != NULL, d->rel_bidirectional, (long long)d->rel_buckets, (long long)d->rel_max_distance,
             d->norm, d->score, d->softcap);
}

static int make(pb_prob *p, const pcase *c, uint64_t seed) {
    memset(p, 0, sizeof *p);
    qkv_attn_desc *d = &p->f.d;
    qkv_attn_desc_init(d);
    d->batch = c->B;
    d->n_q = c->nq;
    d->n_k = c->nk;
    d->heads = c->H;
    d->heads_kv = c->Hkv;
    d->dim = c->D;
    d->dim_v = c->Dv;
    d->mask = c->mask;
    if (c->mask == QKV_MASK_WINDOW) {
        d->window_left = c->wl;
        d->window_right = c->wr;
    }
    if (c->mask == QKV_MASK_CAUSAL_WINDOW) d->window_left = c->wl;
    d->norm = c->norm;
    d->score = c->score;
    d->softcap = c->cap;
    d->scale = c->scale;
    if (c->kl)
        for (int64_t b = 0; b < c->B; b++) p->f.key_lengths[b] = b % 2 ? c->nk / 2 + 1 : c->nk;
    d->key_lengths = c->kl ? p->f.key_lengths : NULL;
    if (c->packed) {
        /* Three sequences of uneven lengths (one empty query run in the cross case). */
        int64_t q1 = c->nq / 3, q2 = c->packed == 2 ? q1 : 2 * c->nq / 3;
        int64_t k1 = c->packed == 2 ? c->nk / 4 : q1, k2 = c->packed == 2 ? 3 * c->nk / 5 : q2;
        int64_t oq[4] = {0, q1, q2, c->nq}, ok[4] = {0, k1, k2, c->nk};
        memcpy(p->f.offq, oq, sizeof oq);
        memcpy(p->f.offk, ok, sizeof ok);
        d->num_seqs = 3;
        d->seq_offsets_q = p->f.offq;
        d->seq_offsets_k = c->packed == 2 ? p->f.offk : NULL;
    }
    tu_rng r;
    tu_rng_seed(&r, seed ^ 0x9E3779B97F4A7C15ull);
    if (c->alibi) {
        qkv_alibi_slopes(c->H, p->slopes);
        for (int64_t h = 0; h < c->H; h++) {
            p->slopes[h] *= (float)(1.0 + tu_rng_uniform(&r)); /* not only the paper's */
            p->slopes64[h] = p->slopes[h];
        }
        d->alibi_slopes = p->slopes;
    }
    if (c->rel) {
        d->rel_buckets = c->buckets;
        d->rel_max_distance = c->maxd;
        d->rel_bidirectional = c->bidir;
        int64_t n = c->H * c->buckets;
        p->rel = malloc((size_t)n * sizeof(float));
        p->rel64 = malloc((size_t)n * sizeof(double));
        for (int64_t t = 0; t < n; t++) {
            p->rel[t] = (float)(1.5 * tu_rng_normal(&r));
            p->rel64[t] = p->rel[t];
        }
        d->rel_table = p->rel;
    }
    if (!fp_make(&p->f, seed, 1.0)) return 0;
    fp_sync(&p->f);
    return 1;
}

static void release(pb_prob *p) {
    fp_free(&p->f);
    free(p->rel);
    free(p->rel64);
}

static qkv_attn_desc desc64(const pb_prob *p) {
    qkv_attn_desc d = fp_desc64(&p->f);
    if (d.alibi_slopes) d.alibi_slopes = p->slopes64;
    if (d.rel_table) d.rel_table = p->rel64;
    return d;
}

static void cmp(const char *name, const float *fast, const float *naive, const double *ref, int64_t n, double k,
                const char *what) {
    double e = fp_err(fast, ref, n), b = fp_err(naive, ref, n);
    CHECK(e <= k * b + 1e-5, "%s err %.3g > %g * naive %.3g + 1e-5 %s", name, e, k, b, what);
    CHECK(!fp_any_nan(fast, n), "NaN in %s %s", name, what);
}

typedef struct fast_run {
    float *o, *lse, *dq, *dk, *dv, *drel;
    qkv_status sf, sb;
} fast_run;

static fast_run run_fast(const pb_prob *p, int threads, int give_fwd) {
    const fprob *f = &p->f;
    fast_run r;
    qkv_attn_desc d = f->d;
    d.impl = QKV_IMPL_FAST;
    d.threads = threads;
    r.o = tu_guarded_alloc((size_t)f->no_el * sizeof(float));
    r.lse = tu_guarded_alloc((size_t)f->nl_el * sizeof(float));
    r.dq = tu_guarded_alloc((size_t)f->nq_el * sizeof(float));
    r.dk = tu_guarded_alloc((size_t)f->nk_el * sizeof(float));
    r.dv = tu_guarded_alloc((size_t)f->nv_el * sizeof(float));
    r.drel = d.rel_table ? tu_guarded_alloc((size_t)f->plan.n_rel_elems * sizeof(float)) : NULL;
    r.sf = qkv_attention_forward(&d, f->q, f->k, f->v, r.o, NULL, r.lse);
    qkv_attn_grads g;
    memset(&g, 0, sizeof g);
    g.dq = r.dq;
    g.dk = r.dk;
    g.dv = r.dv;
    g.d_rel_table = r.drel;
    r.sb = qkv_attention_backward(&d, f->q, f->k, f->v, give_fwd ? r.o : NULL, give_fwd ? r.lse : NULL, f->dout,
                                  &g);
    return r;
}

static void free_run(fast_run *r) {
    tu_guarded_free(r->o);
    tu_guarded_free(r->lse);
    tu_guarded_free(r->dq);
    tu_guarded_free(r->dk);
    tu_guarded_free(r->dv);
    tu_guarded_free(r->drel);
}

static int same(const float *a, const float *b, int64_t n) {
    return (!a && !b) || memcmp(a, b, (size_t)n * sizeof(float)) == 0;
}

static void check_case(const pcase *c, uint64_t seed) {
    pb_prob p;
    if (!make(&p, c, seed)) {
        CHECK(0, "bad test descriptor (seed %llu)", (unsigned long long)seed);
        release(&p);
        return;
    }
    char what[512];
    describe(&p, what, sizeof what);
    const fprob *f = &p.f;
    const int64_t nrel = f->d.rel_table ? f->plan.n_rel_elems : 0;

    /* The oracle, in double. */
    qkv_attn_desc d64 = desc64(&p);
    double *ro = malloc((size_t)f->no_el * sizeof(double)), *rl = malloc((size_t)f->nl_el * sizeof(double)),
           *ra = malloc((size_t)f->na_el * sizeof(double));
    double *rq = malloc((size_t)f->nq_el * sizeof(double)), *rk = malloc((size_t)f->nk_el * sizeof(double)),
           *rv = malloc((size_t)f->nv_el * sizeof(double)), *rr = nrel ? malloc((size_t)nrel * sizeof(double)) : NULL;
    CHECK(qkv_attention_forward(&d64, f->qd, f->kd, f->vd, ro, ra, rl) == QKV_OK, "reference forward %s", what);
    qkv_attn_grads g64;
    memset(&g64, 0, sizeof g64);
    g64.dq = rq;
    g64.dk = rk;
    g64.dv = rv;
    g64.d_rel_table = rr;
    CHECK(qkv_attention_backward(&d64, f->qd, f->kd, f->vd, NULL, NULL, f->doutd, &g64) == QKV_OK,
          "reference backward %s", what);

    /* The error scale: the same problem in plain float. */
    float *no = malloc((size_t)f->no_el * sizeof(float)), *nl = malloc((size_t)f->nl_el * sizeof(float)),
          *na = malloc((size_t)f->na_el * sizeof(float));
    float *nq = malloc((size_t)f->nq_el * sizeof(float)), *nk = malloc((size_t)f->nk_el * sizeof(float)),
          *nv = malloc((size_t)f->nv_el * sizeof(float)), *nr = nrel ? malloc((size_t)nrel * sizeof(float)) : NULL;
    n32_forward(f, no, nl, na);

    /* The attention matrix (the forward's second sweep over its tiles). */
    qkv_attn_desc df = f->d;
    df.impl = QKV_IMPL_FAST;
    float *fo = malloc((size_t)f->no_el * sizeof(float)), *fa = malloc((size_t)f->na_el * sizeof(float));
    CHECK(qkv_attention_forward(&df, f->q, f->k, f->v, fo, fa, NULL) == QKV_OK, "fast forward with attn %s", what);
    cmp("attn", fa, na, ra, f->na_el, KF, what);
    free(fo);
    free(fa);
    n32_backward(f, nq, nk, nv, NULL, nr);

    for (int give = 0; give <= 1; give++) {
        fast_run r = run_fast(&p, 1, give);
        CHECK(r.sf == QKV_OK && r.sb == QKV_OK, "fast failed %d %d %s", r.sf, r.sb, what);
        if (r.sf == QKV_OK && r.sb == QKV_OK) {
            CHECK(tu_guarded_ok(r.o) && tu_guarded_ok(r.lse) && tu_guarded_ok(r.dq) && tu_guarded_ok(r.dk) &&
                      tu_guarded_ok(r.dv) && (!r.drel || tu_guarded_ok(r.drel)),
                  "guard bytes overwritten %s", what);
            if (!give) {
                cmp("out", r.o, no, ro, f->no_el, KF, what);
                /* lse of fully masked rows: -inf on all sides (fp_err takes -inf == -inf). */
                CHECK(fp_err(r.lse, rl, f->nl_el) <= KF * fp_err(nl, rl, f->nl_el) + 1e-5, "lse err %.3g %s",
                      fp_err(r.lse, rl, f->nl_el), what);
            }
            cmp(give ? "dq(fwd given)" : "dq", r.dq, nq, rq, f->nq_el, KB, what);
            cmp(give ? "dk(fwd given)" : "dk", r.dk, nk, rk, f->nk_el, KB, what);
            cmp(give ? "dv(fwd given)" : "dv", r.dv, nv, rv, f->nv_el, KB, what);
            if (nrel) cmp(give ? "d_rel_table(fwd given)" : "d_rel_table", r.drel, nr, rr, nrel, KB, what);
        }
        if (c->threads && !give)
            for (int t = 2; t <= 3; t++) {
                fast_run h = run_fast(&p, t, 0);
                CHECK(h.sf == QKV_OK && h.sb == QKV_OK && same(h.o, r.o, f->no_el) && same(h.lse, r.lse, f->nl_el) &&
                          same(h.dq, r.dq, f->nq_el) && same(h.dk, r.dk, f->nk_el) && same(h.dv, r.dv, f->nv_el) &&
                          same(h.drel, r.drel, nrel),
                      "threads=%d not bitwise identical to threads=1 %s", t, what);
                free_run(&h);
            }
        free_run(&r);
    }
    free(ro); free(rl); free(ra); free(na); free(rq); free(rk); free(rv); free(rr);
    free(no); free(nl); free(nq); free(nk); free(nv); free(nr);
    release(&p);
}

static pcase base(int64_t nq, int64_t nk, int64_t H, int64_t Hkv, int64_t D) {
    pcase c;
    memset(&c, 0, sizeof c);
    c.B = 1;
    c.nq = nq;
    c.nk = nk;
    c.H = H;
    c.Hkv = Hkv;
    c.D = D;
    c.Dv = D;
    c.buckets = 32;
    c.maxd = 128;
    return c;
}

/* ALiBi, T5 decoder, T5 bidirectional and both, over sizes and masks. */
static void test_shapes(void) {
    static const int64_t ns[] = {1, 2, 7, 63, 65, 129, 300};
    int idx = 0;
    for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
        for (int kind = 0; kind < 4; kind++)
            for (int mask = 0; mask <= 3; mask++, idx++) {
                pcase c = base(ns[a], ns[a], 2, 1, idx % 3 ? 16 : 64);
                c.alibi = kind == 0 || kind == 3;
                c.rel = kind >= 1;
                c.bidir = kind == 2 || (kind == 3 && mask == 0);
                c.mask = mask;
                c.wl = 17;
                c.wr = 40;
                if (idx % 5 == 0) { /* small tables: the logarithmic buckets early */
                    c.buckets = 8;
                    c.maxd = 20;
                }
                c.threads = ns[a] >= 63 && idx % 3 == 0;
                check_case(&c, 31000 + (uint64_t)idx);
            }
}

/* n_q != n_k (positions aligned bottom-right), GQA, batches with key
 * lengths, packed self and cross attention, other normalisers and scores. */
static void test_features(void) {
    static const int64_t nqs[] = {7, 65, 129, 200}, nks[] = {129, 63, 300, 65};
    int idx = 0;
    for (size_t a = 0; a < 4; a++)
        for (int kind = 0; kind < 3; kind++, idx++) {
            pcase c = base(nqs[a], nks[a], 4, 2, 24);
            c.Dv = 20;
            c.B = 2;
            c.kl = 1;
            c.alibi = kind != 1;
            c.rel = kind >= 1;
            c.bidir = a % 2;
            c.mask = (int)(idx % 4);
            c.wl = 30;
            c.wr = 9;
            c.threads = idx % 2;
            check_case(&c, 32000 + (uint64_t)idx);
        }
    for (int packed = 1; packed <= 2; packed++)
        for (int kind = 0; kind < 3; kind++)
            for (int mask = 0; mask <= 1; mask++, idx++) {
                pcase c = base(packed == 1 ? 260 : 190, 260, 4, 4, 16);
                c.alibi = kind != 1;
                c.rel = kind >= 1;
                c.bidir = kind == 2;
                c.packed = packed;
                c.mask = mask;
                c.threads = 1;
                check_case(&c, 33000 + (uint64_t)idx);
            }
    for (int v = 0; v < 5; v++, idx++) {
        pcase c = base(150, 150, 2, 2, 32);
        c.alibi = 1;
        c.rel = v % 2;
        c.bidir = 1;
        c.mask = v % 2;
        if (v == 0) c.cap = 3.0;               /* natural mode */
        if (v == 1) c.scale = -0.2;            /* natural mode, negative scale */
        if (v == 2) c.norm = QKV_NORM_SIGMOID;
        if (v == 3) c.norm = QKV_NORM_RELU;
        if (v == 4) c.score = QKV_SCORE_COSINE;
        c.threads = 1;
        check_case(&c, 34000 + (uint64_t)idx);
    }
}

/* A batch whose keys are all masked (key length 0) and a window that sees
 * nothing: zeros, lse -inf, zero gradients, never NaN. */
static void test_fully_masked(void) {
    pb_prob p;
    pcase c = base(70, 70, 2, 2, 16);
    c.B = 2;
    c.alibi = 1;
    c.rel = 1;
    c.bidir = 1;
    if (!make(&p, &c, 35000)) {
        CHECK(0, "bad test descriptor");
        release(&p);
        return;
    }
    p.f.key_lengths[0] = 0;
    p.f.key_lengths[1] = 70;
    p.f.d.key_lengths = p.f.key_lengths;
    qkv_plan_make(&p.f.d, &p.f.plan);
    fast_run r = run_fast(&p, 2, 0);
    CHECK(r.sf == QKV_OK && r.sb == QKV_OK, "fast failed on masked rows");
    const int64_t half_o = p.f.no_el / 2, half_l = p.f.nl_el / 2, half_q = p.f.nq_el / 2;
    int zero = 1;
    for (int64_t t = 0; t < half_o; t++) zero &= r.o[t] == 0.0f;
    for (int64_t t = 0; t < half_l; t++) zero &= r.lse[t] == -INFINITY;
    for (int64_t t = 0; t < half_q; t++) zero &= r.dq[t] == 0.0f;
    for (int64_t t = 0; t < p.f.nk_el / 2; t++) zero &= r.dk[t] == 0.0f;
    CHECK(zero, "fully masked rows not zero (lse -inf)");
    CHECK(!fp_any_nan(r.o, p.f.no_el) && !fp_any_nan(r.dq, p.f.nq_el) && !fp_any_nan(r.drel, p.f.plan.n_rel_elems),
          "NaN with fully masked rows");
    free_run(&r);
    release(&p);
}

/* What stays with the reference: 2-D image offsets and non-finite
 * parameters. QKV_IMPL_FAST refuses them; AUTO computes them. */
static void test_reference_only(void) {
    pb_prob p;
    pcase c = base(36, 36, 2, 2, 8);
    c.alibi = 1;
    if (!make(&p, &c, 36000)) {
        CHECK(0, "bad test descriptor");
        release(&p);
        return;
    }
    float *o = malloc((size_t)p.f.no_el * sizeof(float));
    qkv_attn_desc d = p.f.d;
    d.impl = QKV_IMPL_FAST;
    p.slopes[1] = INFINITY;
    CHECK(qkv_attention_forward(&d, p.f.q, p.f.k, p.f.v, o, NULL, NULL) == QKV_ERR_UNSUPPORTED,
          "fast path took an infinite ALiBi slope");
    d.impl = QKV_IMPL_AUTO;
    CHECK(qkv_attention_forward(&d, p.f.q, p.f.k, p.f.v, o, NULL, NULL) == QKV_OK, "AUTO refused an infinite slope");
    p.slopes[1] = 0.5f;
    float table[2 * 9];
    for (int t = 0; t < 18; t++) table[t] = 0.1f * (float)t;
    d.alibi_slopes = NULL;
    d.rel_table = table;
    d.rel_max_distance = 1;
    d.rel_buckets = 9;
    d.rel2d_width = 6;
    d.impl = QKV_IMPL_FAST;
    CHECK(qkv_attention_forward(&d, p.f.q, p.f.k, p.f.v, o, NULL, NULL) == QKV_ERR_UNSUPPORTED,
          "fast path took 2-D relative positions");
    d.impl = QKV_IMPL_AUTO;
    CHECK(qkv_attention_forward(&d, p.f.q, p.f.k, p.f.v, o, NULL, NULL) == QKV_OK, "AUTO refused 2-D offsets");
    free(o);
    release(&p);
}

/* bf16 storage with ALiBi and T5 buckets (widened, then the float32 fast
 * path): forward and backward close to the float32 fast path on the same
 * (rounded) inputs, within bf16's rounding of the results. */
static void to_bf16(uint16_t *dst, const float *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = tu_f32_to_half(QKV_BF16, src[i]);
}
static void from_bf16(float *dst, const uint16_t *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = tu_half_to_f32(QKV_BF16, src[i]);
}

static void test_bf16(void) {
    pb_prob p;
    pcase c = base(100, 100, 2, 2, 16);
    c.alibi = 1;
    c.rel = 1;
    c.mask = QKV_MASK_CAUSAL;
    if (!make(&p, &c, 37000)) {
        CHECK(0, "bad test descriptor");
        release(&p);
        return;
    }
    fprob *f = &p.f;
    uint16_t *q = malloc((size_t)f->nq_el * 2), *k = malloc((size_t)f->nk_el * 2), *v = malloc((size_t)f->nv_el * 2),
             *go = malloc((size_t)f->no_el * 2), *o = malloc((size_t)f->no_el * 2);
    uint16_t *dq = malloc((size_t)f->nq_el * 2), *dk = malloc((size_t)f->nk_el * 2), *dv = malloc((size_t)f->nv_el * 2);
    to_bf16(q, f->q, f->nq_el);
    to_bf16(k, f->k, f->nk_el);
    to_bf16(v, f->v, f->nv_el);
    to_bf16(go, f->dout, f->no_el);
    /* the float32 problem on the rounded inputs */
    from_bf16(f->q, q, f->nq_el);
    from_bf16(f->k, k, f->nk_el);
    from_bf16(f->v, v, f->nv_el);
    from_bf16(f->dout, go, f->no_el);
    fast_run r = run_fast(&p, 1, 0);
    qkv_attn_desc d = f->d;
    d.dtype = QKV_BF16;
    float *drel = malloc((size_t)f->plan.n_rel_elems * sizeof(float));
    qkv_attn_grads g;
    memset(&g, 0, sizeof g);
    g.dq = dq;
    g.dk = dk;
    g.dv = dv;
    g.d_rel_table = drel;
    CHECK(qkv_attention_forward(&d, q, k, v, o, NULL, NULL) == QKV_OK, "bf16 forward failed");
    CHECK(qkv_attention_backward(&d, q, k, v, NULL, NULL, go, &g) == QKV_OK, "bf16 backward failed");
    float *w = malloc((size_t)(f->no_el > f->nq_el ? (f->no_el > f->nk_el ? f->no_el : f->nk_el)
                                                   : (f->nq_el > f->nk_el ? f->nq_el : f->nk_el)) *
                      sizeof(float));
    struct { const uint16_t *x; const float *ref; int64_t n; const char *name; } t[4] = {
        {o, r.o, f->no_el, "out"}, {dq, r.dq, f->nq_el, "dq"}, {dk, r.dk, f->nk_el, "dk"}, {dv, r.dv, f->nv_el, "dv"}};
    for (int s = 0; s < 4; s++) {
        from_bf16(w, t[s].x, t[s].n);
        double e = 0.0;
        for (int64_t x = 0; x < t[s].n; x++) {
            double diff = fabs((double)w[x] - t[s].ref[x]) - fabs(t[s].ref[x]) * 0x1p-8;
            if (!(diff <= e)) e = diff;
        }
        CHECK(e <= 1e-6, "bf16 %s off the float32 result by %.3g beyond bf16 rounding", t[s].name, e);
    }
    double e = 0.0;
    for (int64_t x = 0; x < f->plan.n_rel_elems; x++) {
        double diff = fabs((double)drel[x] - r.drel[x]);
        if (!(diff <= e)) e = diff;
    }
    CHECK(e <= 1e-4, "bf16 d_rel_table off the float32 result by %.3g", e);
    free_run(&r);
    free(q); free(k); free(v); free(go); free(o); free(dq); free(dk); free(dv); free(drel); free(w);
    release(&p);
}

static void all_tests(void) {
    test_shapes();
    test_features();
    test_fully_masked();
    test_reference_only();
    test_bf16();
}

int main(void) { return fp_each_arch(&g_arch, all_tests); }
