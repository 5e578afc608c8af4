/* The fast backward path against the double reference on every ISA path
 * the CPU has: dQ, dK, dV and dbias for every score x normaliser x
 * mask, soft-cap, bias, GQA, n_q != n_k, D_v != D, packed sequences, key
 * lengths; with the forward's out/lse given and recomputed; fully masked
 * rows give zero gradients; guard bytes; bitwise identical for threads 1, 2,
 * 3. Tolerance: see test_fast_common.h, k = 4 (the backward chains more
 * float operations than the forward: dP, D = rowsum(dO O), dS, and three
 * products, each adding rounding that naive32 also has but in another order). */
#include <stdio.h>

#include "test_fast_common.h"

#define KB 4.0

static int g_arch;

typedef struct bwd_out { float *dq, *dk, *dv, *db; qkv_status st; } bwd_out;

static bwd_out run_fast(const fprob *p, int threads, int give_fwd) {
    bwd_out r;
    qkv_attn_desc d = p->d;
    d.impl = QKV_IMPL_FAST;
    d.threads = threads;
    r.dq = tu_guarded_alloc((size_t)p->nq_el * sizeof(float));
    r.dk = tu_guarded_alloc((size_t)p->nk_el * sizeof(float));
    r.dv = tu_guarded_alloc((size_t)p->nv_el * sizeof(float));
    r.db = p->nb_el ? tu_guarded_alloc((size_t)p->nb_el * sizeof(float)) : NULL;
    float *o = NULL, *l = NULL;
    if (give_fwd) {
        o = malloc((size_t)p->no_el * sizeof(float));
        l = malloc((size_t)p->nl_el * sizeof(float));
        r.st = qkv_attention_forward(&d, p->q, p->k, p->v, o, NULL, l);
        if (r.st != QKV_OK) { free(o); free(l); return r; }
    }
    qkv_attn_grads g;
    memset(&g, 0, sizeof g);
    g.dq = r.dq;
    g.dk = r.dk;
    g.dv = r.dv;
    g.dbias = r.db;
    r.st = qkv_attention_backward(&d, p->q, p->k, p->v, o, l, p->dout, &g);
    free(o);
    free(l);
    return r;
}

static void free_out(bwd_out *r) {
    tu_guarded_free(r->dq);
    tu_guarded_free(r->dk);
    tu_guarded_free(r->dv);
    tu_guarded_free(r->db);
}

static void describe(const fprob *p, char *buf, size_t len) {
    const qkv_attn_desc *d = &p->d;
    snprintf(buf, len,
             "[%s] B=%lld nq=%lld nk=%lld H=%lld Hkv=%lld D=%lld Dv=%lld score=%d norm=%d%s mask=%d(%lld,%lld) "
             "cap=%g bias=%d kl=%d packed=%lld dropout=%g",
             qkv_arch_name(g_arch), (long long)d->batch, (long long)d->n_q, (long long)d->n_k,
             (long long)d->heads, (long long)d->heads_kv, (long long)d->dim, (long long)d->dim_v,
             d->score, d->norm, d->relu_divide_by_count ? "/cnt" : "", d->mask,
             (long long)d->window_left, (long long)d->window_right, d->softcap, d->bias_kind,
             d->key_lengths != NULL, (long long)d->num_seqs, d->dropout);
}

/* Relative part of the error floor: 0 (the rule's absolute 1e-5) except in
 * test_extreme_logits, whose gradients reach 1e15 (see there). */
static double g_rel_floor;

static void cmp(const char *name, const float *fast, const float *naive, const double *ref, int64_t n,
                const char *what) {
    double e = fp_err(fast, ref, n), b = fp_err(naive, ref, n), big = 0.0;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(ref[i]) && fabs(ref[i]) > big) big = fabs(ref[i]);
    double floor = 1e-5 + g_rel_floor * big;
    CHECK(e <= KB * b + floor, "%s err %.3g > %g * naive %.3g + %.3g %s", name, e, KB, b, floor, what);
    CHECK(!fp_any_nan(fast, n) || tu_has_nan_f64(ref, (size_t)n), "NaN in %s %s", name, what);
}

static void check_problem(fprob *p, int check_threads) {
    char what[400];
    describe(p, what, sizeof what);
    fp_sync(p);
    qkv_attn_desc d64 = fp_desc64(p);
    double *rq = malloc((size_t)p->nq_el * sizeof(double)), *rk = malloc((size_t)p->nk_el * sizeof(double)),
           *rv = malloc((size_t)p->nv_el * sizeof(double)),
           *rb = p->nb_el ? malloc((size_t)p->nb_el * sizeof(double)) : NULL;
    qkv_attn_grads g64;
    memset(&g64, 0, sizeof g64);
    g64.dq = rq;
    g64.dk = rk;
    g64.dv = rv;
    g64.dbias = rb;
    qkv_status st = qkv_attention_backward(&d64, p->qd, p->kd, p->vd, NULL, NULL, p->doutd, &g64);
    CHECK(st == QKV_OK, "reference backward failed %d %s", st, what);

    float *nq = malloc((size_t)p->nq_el * sizeof(float)), *nk = malloc((size_t)p->nk_el * sizeof(float)),
          *nv = malloc((size_t)p->nv_el * sizeof(float)),
          *nb = p->nb_el ? malloc((size_t)p->nb_el * sizeof(float)) : NULL;
    n32_backward(p, nq, nk, nv, nb, NULL);

    for (int give = 0; give <= 1; give++) {
        bwd_out f = run_fast(p, 1, give);
        CHECK(f.st == QKV_OK, "fast backward failed %d %s", f.st, what);
        CHECK(tu_guarded_ok(f.dq) && tu_guarded_ok(f.dk) && tu_guarded_ok(f.dv) && (!f.db || tu_guarded_ok(f.db)),
              "guard bytes overwritten %s", what);
        cmp(give ? "dq(fwd given)" : "dq", f.dq, nq, rq, p->nq_el, what);
        cmp(give ? "dk(fwd given)" : "dk", f.dk, nk, rk, p->nk_el, what);
        cmp(give ? "dv(fwd given)" : "dv", f.dv, nv, rv, p->nv_el, what);
        if (p->nb_el) cmp("dbias", f.db, nb, rb, p->nb_el, what);
        if (check_threads && !give) {
            for (int t = 2; t <= 3; t++) {
                bwd_out h = run_fast(p, t, 0);
                CHECK(h.st == QKV_OK, "fast backward failed threads=%d %s", t, what);
                CHECK(memcmp(h.dq, f.dq, (size_t)p->nq_el * sizeof(float)) == 0 &&
                          memcmp(h.dk, f.dk, (size_t)p->nk_el * sizeof(float)) == 0 &&
                          memcmp(h.dv, f.dv, (size_t)p->nv_el * sizeof(float)) == 0 &&
                          (!p->nb_el || memcmp(h.db, f.db, (size_t)p->nb_el * sizeof(float)) == 0),
                      "threads=%d not bitwise identical to threads=1 %s", t, what);
                free_out(&h);
            }
        }
        free_out(&f);
    }
    free(rq); free(rk); free(rv); free(rb); free(nq); free(nk); free(nv); free(nb);
}

static void base_desc(qkv_attn_desc *d, int64_t B, int64_t nq, int64_t nk, int64_t H, int64_t Hkv,
                      int64_t D, int64_t Dv) {
    qkv_attn_desc_init(d);
    d->batch = B;
    d->n_q = nq;
    d->n_k = nk;
    d->heads = H;
    d->heads_kv = Hkv;
    d->dim = D;
    d->dim_v = Dv;
}

static void set_mask(qkv_attn_desc *d, int mask, int64_t wl, int64_t wr) {
    d->mask = mask;
    if (mask == QKV_MASK_WINDOW) { d->window_left = wl; d->window_right = wr; }
    if (mask == QKV_MASK_CAUSAL_WINDOW) d->window_left = wl;
}

static void run_case(fprob *p, uint64_t seed, int thr) {
    if (!fp_make(p, seed, 1.0)) {
        CHECK(0, "bad test descriptor (seed %llu)", (unsigned long long)seed);
        return;
    }
    check_problem(p, thr);
    fp_free(p);
}

static void test_shapes(void) {
    static const int64_t ns[] = {1, 2, 7, 63, 64, 65, 129, 1000};
    static const int64_t Ds[] = {1, 3, 8, 16, 31, 64, 80, 128, 256};
    int idx = 0;
    for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
        for (size_t b = 0; b < sizeof Ds / sizeof *Ds; b++, idx++) {
            int64_t n = ns[a], D = Ds[b];
            if (n == 1000 && D != 64 && D != 3) continue;
            if (n == 129 && D == 256) continue;
            fprob p;
            memset(&p, 0, sizeof p);
            base_desc(&p.d, 1, n, n, 2, 1, D, D);
            set_mask(&p.d, idx % 4, 17, 5);
            run_case(&p, 11000 + (uint64_t)idx, n >= 63 && D <= 64 && n < 1000);
        }
}

static void test_features(void) {
    int idx = 0;
    for (int score = 0; score <= 2; score++)
        for (int norm = 0; norm <= 2; norm++)
            for (int mask = 0; mask <= 3; mask++)
                for (int bias = 0; bias <= 2; bias++)
                    for (int cap = 0; cap <= 1; cap++, idx++) {
                        if ((idx % 3) && bias == 0 && cap == 0) continue; /* keep the count moderate */
                        fprob p;
                        memset(&p, 0, sizeof p);
                        base_desc(&p.d, 2, 70, 70, 2, idx % 2 ? 1 : 2, 19, 21);
                        p.d.score = score;
                        p.d.norm = norm;
                        p.d.relu_divide_by_count = idx % 3 == 0;
                        p.d.temperature = 0.3;
                        if (score == QKV_SCORE_SCALED_DOT && idx % 5 == 0) p.d.scale = 0.7;
                        set_mask(&p.d, mask, 9, 12);
                        p.d.bias_kind = bias;
                        p.d.softcap = cap ? 2.5 : 0.0;
                        if (idx % 2) {
                            p.key_lengths[0] = 70;
                            p.key_lengths[1] = 33;
                            p.d.key_lengths = p.key_lengths;
                        }
                        run_case(&p, 12000 + (uint64_t)idx, idx % 7 == 0);
                    }
}

static void test_cross(void) {
    static const int64_t pairs[][2] = {{7, 129}, {129, 7}, {65, 200}, {200, 65}, {1, 300}, {300, 1}};
    int idx = 0;
    for (size_t a = 0; a < sizeof pairs / sizeof *pairs; a++)
        for (int mask = 0; mask <= 3; mask++, idx++) {
            fprob p;
            memset(&p, 0, sizeof p);
            base_desc(&p.d, 2, pairs[a][0], pairs[a][1], 4, 2, 16, idx % 2 ? 40 : 8);
            set_mask(&p.d, mask, 20, 3);
            p.d.bias_kind = idx % 5 == 0 ? QKV_BIAS_PER_HEAD : QKV_BIAS_NONE;
            run_case(&p, 13000 + (uint64_t)idx, idx % 3 == 0);
        }
}

static void test_negative_scale(void) {
    for (int mask = 0; mask <= 1; mask++) {
        fprob p;
        memset(&p, 0, sizeof p);
        base_desc(&p.d, 1, 150, 140, 2, 1, 24, 24);
        p.d.scale = -0.4;
        p.d.mask = mask;
        run_case(&p, 13500 + (uint64_t)mask, 1);
    }
}

static void test_packed(void) {
    int idx = 0;
    for (int mask = 0; mask <= 3; mask++)
        for (int same = 0; same <= 1; same++, idx++) {
            fprob p;
            memset(&p, 0, sizeof p);
            if (same) {
                base_desc(&p.d, 1, 150, 150, 2, 1, 16, 16);
                int64_t o[] = {0, 10, 10, 90, 150};
                memcpy(p.offq, o, sizeof o);
                p.d.num_seqs = 4;
                p.d.seq_offsets_q = p.offq;
            } else {
                base_desc(&p.d, 1, 100, 170, 2, 2, 16, 24);
                int64_t oq[] = {0, 30, 100}, ok[] = {0, 50, 170};
                memcpy(p.offq, oq, sizeof oq);
                memcpy(p.offk, ok, sizeof ok);
                p.d.num_seqs = 2;
                p.d.seq_offsets_q = p.offq;
                p.d.seq_offsets_k = p.offk;
            }
            set_mask(&p.d, mask, 7, 2);
            p.d.bias_kind = idx % 3 == 1 ? QKV_BIAS_SHARED : QKV_BIAS_NONE;
            run_case(&p, 14000 + (uint64_t)idx, idx % 2 == 0);
        }
}

/* Fully masked rows: zero gradients, never NaN. */
static void test_fully_masked(void) {
    for (int v = 0; v < 3; v++) {
        fprob p;
        memset(&p, 0, sizeof p);
        base_desc(&p.d, 2, v == 1 ? 90 : 40, 40, 2, 2, 8, 8);
        if (v == 0) {
            p.key_lengths[0] = 0;
            p.key_lengths[1] = 13;
            p.d.key_lengths = p.key_lengths;
        }
        if (v == 1) p.d.mask = QKV_MASK_CAUSAL;
        if (v == 2) p.d.bias_kind = QKV_BIAS_PER_HEAD;
        if (!fp_make(&p, 15000 + (uint64_t)v, 1.0)) continue;
        if (v == 2)
            for (int64_t j = 0; j < 40; j++) p.bias[(1 * 40 + 5) * 40 + j] = -INFINITY;
        check_problem(&p, 1);
        bwd_out f = run_fast(&p, 2, 0);
        CHECK(!fp_any_nan(f.dq, p.nq_el) && !fp_any_nan(f.dk, p.nk_el) && !fp_any_nan(f.dv, p.nv_el),
              "NaN with masked rows v=%d", v);
        if (v == 0) {
            int zero = 1;
            for (int64_t x = 0; x < 40 * 2 * 8; x++) zero &= f.dq[x] == 0.0f && f.dk[x] == 0.0f && f.dv[x] == 0.0f;
            CHECK(zero, "batch with key length 0: gradients not 0");
        }
        if (v == 1) CHECK(f.dq[0] == 0.0f, "early causal row: dq not 0");
        free_out(&f);
        fp_free(&p);
    }
}

static void test_threads(void) {
    for (int mask = 0; mask <= 3; mask++) {
        fprob p;
        memset(&p, 0, sizeof p);
        base_desc(&p.d, 2, 333, 301, 3, 1, 32, 48);
        set_mask(&p.d, mask, 50, 40);
        p.d.bias_kind = mask == 2 ? QKV_BIAS_PER_HEAD : mask == 3 ? QKV_BIAS_SHARED : QKV_BIAS_NONE;
        run_case(&p, 16000 + (uint64_t)mask, 1);
    }
}

/* Logits of +-1e4 and +-1e30 (dot score, unscaled): half of the queries are
 * (+-sqrt(L), 0, ..., 0) and every key has +-sqrt(L) in dimension 0, so
 * those queries' logits are exactly +-L (ties are exact in float too); the
 * other queries are ordinary (0 in dimension 0). Recomputing
 * P = 2^(sc s - lse2) with lse rounded to float, whose error at
 * |lse| ~ 1e30 is ~1e22, would overflow P (NaN gradients). It must match
 * the reference, with the forward's out/lse given (a caller's float lse that
 * large cannot pin P down: the backward recomputes the statistics) and
 * without, for threads 1, 2 and 3 bitwise alike, causal and not. Gradients
 * scale with sqrt(L) (up to 1e15), so the absolute floor of the rule is
 * replaced by 1e-5 of the largest reference gradient: float keeps 7 digits
 * of a 1e15, not 1e-5 absolute. */
static void test_extreme_logits(void) {
    static const double Ls[] = {1e4, 1e30};
    for (int li = 0; li < 2; li++)
        for (int causal = 0; causal <= 1; causal++) {
            fprob p;
            memset(&p, 0, sizeof p);
            base_desc(&p.d, 1, 70, 70, 2, 1, 8, 8);
            p.d.score = QKV_SCORE_DOT;
            p.d.mask = causal ? QKV_MASK_CAUSAL : QKV_MASK_NONE;
            if (!fp_make(&p, 17000 + (uint64_t)(li * 2 + causal), 1.0)) {
                CHECK(0, "bad extreme-logit descriptor");
                continue;
            }
            const float a = (float)sqrt(Ls[li]);
            for (int64_t i = 0; i < 70; i++) {
                for (int64_t h = 0; h < 2; h++) {
                    float *qi = p.q + fp_idx(0, i, h, 70, 2, 8);
                    if ((i * 7 + h * 3) % 5 < 3) { /* a huge query */
                        qi[0] = (i + h) % 2 ? a : -a;
                        for (int t = 1; t < 8; t++) qi[t] = 0.0f;
                    } else {
                        qi[0] = 0.0f;
                    }
                }
                p.k[fp_idx(0, i, 0, 70, 1, 8)] = (i * 5) % 3 ? a : -a;
            }
            g_rel_floor = 1e-5;
            check_problem(&p, 1);
            g_rel_floor = 0.0;
            for (int give = 0; give <= 1; give++) {
                bwd_out f = run_fast(&p, 2, give);
                int finite = 1;
                for (int64_t x = 0; x < p.nq_el; x++) finite &= isfinite(f.dq[x]) != 0;
                for (int64_t x = 0; x < p.nk_el; x++) finite &= isfinite(f.dk[x]) != 0;
                for (int64_t x = 0; x < p.nv_el; x++) finite &= isfinite(f.dv[x]);
                CHECK(f.st == QKV_OK && finite, "[%s] logits +-%g%s%s: non-finite gradient",
                      qkv_arch_name(g_arch), Ls[li], causal ? " causal" : "", give ? " (fwd given)" : "");
                free_out(&f);
            }
            fp_free(&p);
        }
}

/* NaN planted in one query's q and dO rows, then in one key's k and v rows:
 * every gradient that cannot see it stays finite and unchanged. On a mask's
 * edge the backward multiplies the rows that some but not all keys (or
 * queries) of a group of 8 see by exact zeros in one product, but only when
 * those rows are finite (fa_pv_zeros); with a NaN among them the group goes
 * row by row instead, which sums in another order (and the forward's O,
 * hence D = rowsum(dO O), moves by rounding the same way): equal within
 * 2e-5 of the row's largest entry (sums of up to 200 terms, ~200 float
 * roundings at worst), not bitwise. Query and key 100 sit inside such
 * a group on the causal diagonal and on a window's edges. */
static int sees(const fprob *p, int64_t i, int64_t j) {
    int64_t lo, hi;
    qkv_plan_key_range(&p->plan, 0, i, &lo, &hi);
    return lo <= j && j < hi;
}

static int rows_equal(const float *a, const float *b, int64_t n) {
    double scale = 1e-6;
    for (int64_t t = 0; t < n; t++) scale = fmax(scale, fabs((double)a[t]));
    int ok = 1;
    for (int64_t t = 0; t < n; t++) ok &= isfinite(b[t]) && fabs((double)a[t] - b[t]) <= 2e-5 * scale;
    return ok;
}

static void test_nan_masked(void) {
    for (int v = 0; v < 3; v++) {
        fprob p;
        memset(&p, 0, sizeof p);
        base_desc(&p.d, 1, 200, 200, 1, 1, 16, 16);
        if (v == 1) set_mask(&p.d, QKV_MASK_WINDOW, 30, 20);
        else p.d.mask = QKV_MASK_CAUSAL;
        if (v == 2) p.d.norm = QKV_NORM_RELU;
        if (!fp_make(&p, 17000 + (uint64_t)v, 1.0)) continue;
        const int64_t x = 100, n = 200, D = 16;
        bwd_out clean = run_fast(&p, 1, 1);
        for (int which = 0; which < 2; which++) {
            float *a = which == 0 ? p.q : p.k, *b = which == 0 ? p.dout : p.v, sa[16], sb[16];
            memcpy(sa, a + x * D, sizeof sa);
            memcpy(sb, b + x * D, sizeof sb);
            for (int64_t t = 0; t < D; t++) a[x * D + t] = b[x * D + t] = NAN;
            bwd_out dirty = run_fast(&p, 1, 1);
            int same = dirty.st == QKV_OK, checked = 0;
            if (which == 0) /* query x: every other query's dQ, the dK, dV of keys x cannot see */
                for (int64_t j = 0; j < n; j++) {
                    if (j != x) same &= rows_equal(clean.dq + j * D, dirty.dq + j * D, D);
                    if (!sees(&p, x, j)) {
                        same &= rows_equal(clean.dk + j * D, dirty.dk + j * D, D) &&
                                rows_equal(clean.dv + j * D, dirty.dv + j * D, D);
                        checked++;
                    }
                }
            else /* key x: the dQ of queries that cannot see it */
                for (int64_t i = 0; i < n; i++)
                    if (!sees(&p, i, x)) {
                        same &= rows_equal(clean.dq + i * D, dirty.dq + i * D, D);
                        checked++;
                    }
            CHECK(same && checked > 50, "[%s] NaN in %s %lld changed gradients that cannot see it (v=%d, %d checked)",
                  qkv_arch_name(g_arch), which == 0 ? "query" : "key", (long long)x, v, checked);
            free_out(&dirty);
            memcpy(a + x * D, sa, sizeof sa);
            memcpy(b + x * D, sb, sizeof sb);
        }
        free_out(&clean);
        fp_free(&p);
    }
}

/* Attention dropout (fp_dropout_case): dq, dk, dv (and dbias) against the
 * reference, naive32 dropping the same entries; the forward's out and lse
 * given (O with dropout, so D = rowsum(dO O) matches) and recomputed;
 * threads 1, 2, 3 bitwise. */
static void test_dropout(void) {
    for (int idx = 0; idx < FP_DROPOUT_CASES; idx++) {
        fprob p;
        fp_dropout_case(&p, idx);
        if (idx / 2 != 11) {
            run_case(&p, 18000 + (uint64_t)idx, idx % 3 == 0);
            continue;
        }
        /* key length 0 for batch 0: exactly zero gradients there */
        if (!fp_make(&p, 18000 + (uint64_t)idx, 1.0)) continue;
        check_problem(&p, 1);
        bwd_out f = run_fast(&p, 2, 0);
        int zero = f.st == QKV_OK;
        for (int64_t x = 0; x < p.nq_el / 2; x++) zero &= f.dq[x] == 0.0f;
        for (int64_t x = 0; x < p.nk_el / 2; x++) zero &= f.dk[x] == 0.0f && f.dv[x] == 0.0f;
        CHECK(zero, "dropout %g: batch 0 without keys has a gradient", p.d.dropout);
        free_out(&f);
        fp_free(&p);
    }
}

static void all_tests(void) {
    test_shapes();
    test_features();
    test_cross();
    test_negative_scale();
    test_packed();
    test_fully_masked();
    test_nan_masked();
    test_threads();
    test_extreme_logits();
    test_dropout();
}

int main(void) { return fp_each_arch(&g_arch, all_tests); }
