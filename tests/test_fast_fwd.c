/* The fast forward path against the double reference, on every ISA path
 * the CPU has: shape sweeps, every score x normaliser x mask, soft-cap,
 * bias, GQA, n_q != n_k, D_v != D, packed sequences, key lengths, fully
 * masked rows, huge logits, NaN planted in masked keys, the attention matrix
 * and log-sum-exp outputs, guard bytes, and bitwise identity across thread
 * counts 1, 2, 3. Tolerance: see test_fast_common.h (k = 2). */
#include <stdio.h>

#include "test_fast_common.h"
#include "core/internal.h"

static int g_arch;
/* Extra absolute tolerance for huge logits (test_large_logits only): a float
 * logit of magnitude L carries a rounding error ~L * 2^-24 that no float
 * implementation avoids, and which moves the output by up to that times
 * max|v|; naive32 may be luckier or unluckier on a given row. */
static double g_extra_tol;

/* Run the fast forward with `threads`; outputs in guarded buffers. */
typedef struct fwd_out { float *o, *lse, *attn; qkv_status st; } fwd_out;

static fwd_out run_fast(const fprob *p, int threads, int want_attn) {
    fwd_out r;
    qkv_attn_desc d = p->d;
    d.impl = QKV_IMPL_FAST;
    d.threads = threads;
    r.o = tu_guarded_alloc((size_t)p->no_el * sizeof(float));
    r.lse = tu_guarded_alloc((size_t)p->nl_el * sizeof(float));
    r.attn = want_attn ? tu_guarded_alloc((size_t)p->na_el * sizeof(float)) : NULL;
    r.st = qkv_attention_forward(&d, p->q, p->k, p->v, r.o, r.attn, r.lse);
    return r;
}

static void free_out(fwd_out *r) {
    tu_guarded_free(r->o);
    tu_guarded_free(r->lse);
    tu_guarded_free(r->attn);
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

/* Compare fast vs ref64 vs naive32 for one problem. */
static void check_problem(fprob *p, int want_attn, int check_threads) {
    char what[400];
    describe(p, what, sizeof what);
    fp_sync(p);
    qkv_attn_desc d64 = fp_desc64(p);
    double *ro = malloc((size_t)p->no_el * sizeof(double)), *rl = malloc((size_t)p->nl_el * sizeof(double));
    double *ra = want_attn ? malloc((size_t)p->na_el * sizeof(double)) : NULL;
    qkv_status st = qkv_attention_forward(&d64, p->qd, p->kd, p->vd, ro, ra, rl);
    CHECK(st == QKV_OK, "reference failed %d %s", st, what);

    float *no = malloc((size_t)p->no_el * sizeof(float)), *nl = malloc((size_t)p->nl_el * sizeof(float));
    float *na = want_attn ? malloc((size_t)p->na_el * sizeof(float)) : NULL;
    n32_forward(p, no, nl, na);

    fwd_out f = run_fast(p, 1, want_attn);
    CHECK(f.st == QKV_OK, "fast failed %d %s", f.st, what);
    CHECK(tu_guarded_ok(f.o) && tu_guarded_ok(f.lse) && (!f.attn || tu_guarded_ok(f.attn)),
          "guard bytes overwritten %s", what);

    double eo = fp_err(f.o, ro, p->no_el), bo = fp_err(no, ro, p->no_el);
    double el = fp_err(f.lse, rl, p->nl_el), bl = fp_err(nl, rl, p->nl_el);
    CHECK(eo <= 2 * bo + 1e-5 + g_extra_tol, "out err %.3g > 2 * naive %.3g + 1e-5 %s", eo, bo, what);
    CHECK(el <= 2 * bl + 1e-5, "lse err %.3g > 2 * naive %.3g + 1e-5 %s", el, bl, what);
    CHECK(!fp_any_nan(f.o, p->no_el) || tu_has_nan_f64(ro, (size_t)p->no_el), "NaN in out %s", what);
    if (want_attn) {
        double ea = fp_err(f.attn, ra, p->na_el), ba = fp_err(na, ra, p->na_el);
        CHECK(ea <= 2 * ba + 1e-5, "attn err %.3g > 2 * naive %.3g + 1e-5 %s", ea, ba, what);
    }
    if (check_threads) {
        for (int t = 2; t <= 3; t++) {
            fwd_out g = run_fast(p, t, want_attn);
            CHECK(g.st == QKV_OK, "fast failed threads=%d %s", t, what);
            CHECK(memcmp(g.o, f.o, (size_t)p->no_el * sizeof(float)) == 0 &&
                      memcmp(g.lse, f.lse, (size_t)p->nl_el * sizeof(float)) == 0 &&
                      (!want_attn || memcmp(g.attn, f.attn, (size_t)p->na_el * sizeof(float)) == 0),
                  "threads=%d not bitwise identical to threads=1 %s", t, what);
            free_out(&g);
        }
    }
    free_out(&f);
    free(ro); free(rl); free(ra); free(no); free(nl); free(na);
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

static void run_case(fprob *p, uint64_t seed, double sd, int attn, int thr) {
    if (!fp_make(p, seed, sd)) {
        CHECK(0, "bad test descriptor (seed %llu)", (unsigned long long)seed);
        return;
    }
    check_problem(p, attn, thr);
    fp_free(p);
}

/* 1. Shapes: n x D sweep, scaled dot softmax, GQA, masks rotating. */
static void test_shapes(void) {
    static const int64_t ns[] = {1, 2, 7, 63, 64, 65, 129, 1000};
    static const int64_t Ds[] = {1, 3, 8, 16, 31, 64, 80, 128, 256};
    int idx = 0;
    for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
        for (size_t b = 0; b < sizeof Ds / sizeof *Ds; b++, idx++) {
            int64_t n = ns[a], D = Ds[b];
            if (n == 1000 && D != 64 && D != 80 && D != 3) continue;
            fprob p;
            memset(&p, 0, sizeof p);
            base_desc(&p.d, 1, n, n, 2, 1, D, D);
            set_mask(&p.d, idx % 4, 17, 5);
            run_case(&p, 1000 + (uint64_t)idx, 1.0, n <= 129, n >= 63 && D <= 64);
        }
}

/* 2. Every score x normaliser x mask x bias x soft-cap, with key lengths. */
static void test_features(void) {
    int idx = 0;
    for (int score = 0; score <= 2; score++)
        for (int norm = 0; norm <= 2; norm++)
            for (int mask = 0; mask <= 3; mask++)
                for (int bias = 0; bias <= 2; bias++)
                    for (int cap = 0; cap <= 1; cap++, idx++) {
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
                        run_case(&p, 2000 + (uint64_t)idx, 1.0, 1, idx % 7 == 0);
                    }
}

/* 3. n_q != n_k both ways, D_v != D, windows of 0, 1, tile-1, tile, >= n. */
/* A negative scale (valid: only 0 means the default): the raw scores'
 * maximum is then not the logits' maximum. */
static void test_negative_scale(void) {
    for (int mask = 0; mask <= 1; mask++) {
        fprob p;
        memset(&p, 0, sizeof p);
        base_desc(&p.d, 1, 150, 140, 2, 1, 24, 24);
        p.d.scale = -0.4;
        p.d.mask = mask;
        run_case(&p, 3500 + (uint64_t)mask, 1.0, 1, 1);
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
            run_case(&p, 3000 + (uint64_t)idx, 1.0, 1, idx % 3 == 0);
        }
    static const int64_t widths[] = {0, 1, 127, 128, 129, 400};
    for (size_t a = 0; a < sizeof widths / sizeof *widths; a++)
        for (int mask = 2; mask <= 3; mask++, idx++) {
            fprob p;
            memset(&p, 0, sizeof p);
            base_desc(&p.d, 1, 300, 300, 1, 1, 8, 8);
            set_mask(&p.d, mask, widths[a], mask == 2 ? widths[a] : 0);
            run_case(&p, 3000 + (uint64_t)idx, 1.0, 0, a == 2);
        }
}

/* 4. Packed variable-length sequences (with an empty one; different key
 * offsets), causal and not. */
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
            run_case(&p, 4000 + (uint64_t)idx, 1.0, 1, idx % 2 == 0);
        }
}

/* 4b. Many short packed sequences: the per-sequence blocks (short ones
 * joined up to QKV_PLAN_JOIN_ROWS rows), V read in place and each block's
 * keys packed on their own (every sequence within 64 rows, its keys within
 * one tile), and the fallbacks: a sequence of 65 rows, keys beyond a tile.
 * Every score and normaliser, masks, biases, GQA, the attention matrix. */
static void test_packed_short(void) {
    static const int64_t lens[] = {1, 2, 7, 15, 1, 16, 17, 0, 63, 64, 3, 5, 31, 2, 2, 9};
    const int ns = (int)(sizeof lens / sizeof *lens);
    int idx = 0;
    for (int variant = 0; variant < 4; variant++)
        for (int mask = 0; mask <= 3; mask++, idx++) {
            fprob p;
            memset(&p, 0, sizeof p);
            int64_t nq = 0, nk = 0;
            p.offq[0] = p.offk[0] = 0;
            for (int s = 0; s < ns; s++) {
                int64_t lq = lens[s] + (variant == 2 && s == 5 ? 49 : 0); /* 65 rows: two blocks */
                /* cross: keys of their own, up to 190 (one tile) or, variant 3, 250 */
                int64_t lk = variant == 1 ? (lens[s] * 3 + s) % 191 : variant == 3 && s == 9 ? 250 : lq;
                p.offq[s + 1] = nq += lq;
                p.offk[s + 1] = nk += lk;
            }
            base_desc(&p.d, 1, nq, nk, idx % 2 ? 4 : 3, idx % 2 ? 2 : 1, idx % 3 ? 32 : 13, idx % 3 ? 32 : 40);
            p.d.num_seqs = ns;
            p.d.seq_offsets_q = p.offq;
            p.d.seq_offsets_k = variant == 1 || variant == 3 ? p.offk : NULL;
            set_mask(&p.d, mask, 5, 3);
            p.d.score = idx % 5 == 3 ? QKV_SCORE_COSINE : idx % 5 == 4 ? QKV_SCORE_DOT : QKV_SCORE_SCALED_DOT;
            p.d.norm = idx % 7 == 5 ? QKV_NORM_RELU : idx % 7 == 6 ? QKV_NORM_SIGMOID : QKV_NORM_SOFTMAX;
            p.d.temperature = 0.5;
            p.d.softcap = idx % 6 == 1 ? 3.0 : 0.0;
            p.d.bias_kind = idx % 4 == 2 ? QKV_BIAS_PER_HEAD : idx % 4 == 3 ? QKV_BIAS_SHARED : QKV_BIAS_NONE;
            run_case(&p, 4500 + (uint64_t)idx, 1.0, 1, idx % 3 == 0);
        }
}

/* 4c. The query blocks of a plan: they tile [0, n_q) in order, hold at
 * most bq rows, and rows of two sequences only when every sequence in the
 * block is shorter than QKV_PLAN_JOIN_ROWS and the block within that many
 * rows; a sequence of QKV_PLAN_JOIN_ROWS rows or more starts a block.
 * Unpacked: blocks of bq from row 0. */
static void test_query_blocks(void) {
    static const int64_t lens[][12] = {{5, 1, 2, 7, 15, 1, 16, 17, 0, 63, 64, 200},
                                       {0, 0, 3, 3, 3, 3, 3, 3, 3, 3, 3, 0},
                                       {129, 1, 64, 65, 0, 15, 15, 2, 14, 1, 1, 1}};
    for (int t = 0; t < 3; t++)
        for (int64_t bq = 16; bq <= 64; bq += 48) {
            qkv_attn_desc d;
            base_desc(&d, 1, 0, 0, 1, 1, 8, 8);
            int64_t off[13] = {0};
            for (int s = 0; s < 12; s++) off[s + 1] = off[s] + lens[t][s];
            d.n_q = d.n_k = off[12];
            d.num_seqs = 12;
            d.seq_offsets_q = off;
            qkv_plan p;
            CHECK_STATUS(qkv_plan_make(&d, &p), QKV_OK);
            int64_t count = qkv_plan_query_blocks(&p, bq, NULL), st[64];
            CHECK(count > 0 && count < 64, "query blocks: count %lld", (long long)count);
            if (count <= 0 || count >= 64) continue;
            CHECK(qkv_plan_query_blocks(&p, bq, st) == count, "query blocks: counts differ");
            CHECK(st[0] == 0 && st[count] == d.n_q, "query blocks do not tile the rows");
            for (int64_t u = 0; u < count; u++) {
                int64_t a = st[u], z = st[u + 1], seqs = 0, shortest_ok = 1;
                CHECK(z > a && z - a <= bq, "block %lld: rows [%lld, %lld), bq %lld", (long long)u, (long long)a,
                      (long long)z, (long long)bq);
                for (int s = 0; s < 12; s++)
                    if (off[s + 1] > a && off[s] < z) {
                        seqs++;
                        shortest_ok &= off[s + 1] - off[s] < QKV_PLAN_JOIN_ROWS && off[s] >= a && off[s + 1] <= z;
                    }
                CHECK(seqs == 1 || (shortest_ok && z - a <= QKV_PLAN_JOIN_ROWS),
                      "block %lld [%lld, %lld) joins %lld sequences", (long long)u, (long long)a, (long long)z,
                      (long long)seqs);
            }
            for (int s = 0; s < 12; s++) {
                int starts = 0;
                for (int64_t u = 0; u < count; u++) starts |= st[u] == off[s];
                CHECK(off[s + 1] - off[s] < QKV_PLAN_JOIN_ROWS || starts, "sequence %d of %lld rows starts no block",
                      s, (long long)(off[s + 1] - off[s]));
            }
            d.num_seqs = 0;
            d.seq_offsets_q = NULL;
            CHECK_STATUS(qkv_plan_make(&d, &p), QKV_OK);
            count = qkv_plan_query_blocks(&p, bq, st);
            CHECK(count == (d.n_q + bq - 1) / bq && st[1] == (count > 1 ? bq : d.n_q) && st[count] == d.n_q, "unpacked blocks");
        }
}

/* 5. Fully masked rows give 0 and lse -inf, never NaN: key length 0, causal
 * with n_q > n_k (early rows see nothing), a -inf bias row. */
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
        if (!fp_make(&p, 5000 + (uint64_t)v, 1.0)) continue;
        if (v == 2)
            for (int64_t j = 0; j < 40; j++) p.bias[(1 * 40 + 5) * 40 + j] = -INFINITY; /* h 1, row 5 */
        check_problem(&p, 1, 1);
        fwd_out f = run_fast(&p, 2, 0);
        CHECK(!fp_any_nan(f.o, p.no_el) && !fp_any_nan(f.lse, p.nl_el), "NaN with masked rows v=%d", v);
        if (v == 0) {
            for (int64_t x = 0; x < 40 * 2 * 8; x++) CHECK(f.o[x] == 0.0f, "masked row out != 0");
            CHECK(f.lse[0] == -INFINITY && f.lse[79] == -INFINITY, "masked row lse != -inf");
        }
        if (v == 1) CHECK(f.o[0] == 0.0f && f.lse[0] == -INFINITY, "early causal row not 0 / -inf");
        if (v == 2) CHECK(f.o[(5 * 2 + 1) * 8] == 0.0f && f.lse[40 + 5] == -INFINITY, "bias-masked row");
        free_out(&f);
        fp_free(&p);
    }
}

/* 6. Huge logits (+-1e4 and more): no overflow, the row is not lost. */
static void test_large_logits(void) {
    static const double sds[] = {8.0, 30.0, 100.0};
    for (int a = 0; a < 3; a++)
        for (int mask = 0; mask <= 1; mask++) {
            fprob p;
            memset(&p, 0, sizeof p);
            base_desc(&p.d, 1, 130, 130, 1, 1, 16, 16);
            p.d.mask = mask;
            if (!fp_make(&p, 6000 + (uint64_t)(a * 2 + mask), sds[a])) continue;
            fp_sync(&p);
            {
                qkv_attn_desc d64 = fp_desc64(&p);
                double *ro = malloc((size_t)p.no_el * sizeof(double)), *rl = malloc((size_t)p.nl_el * sizeof(double));
                qkv_attention_forward(&d64, p.qd, p.kd, p.vd, ro, NULL, rl);
                double L = 0.0, vmax = 0.0;
                for (int64_t x = 0; x < p.nl_el; x++) L = fabs(rl[x]) > L ? fabs(rl[x]) : L;
                for (int64_t x = 0; x < p.nv_el; x++) vmax = fabs(p.v[x]) > vmax ? fabs(p.v[x]) : vmax;
                g_extra_tol = 4.0 * L * 0x1p-24 * vmax;
                free(ro);
                free(rl);
            }
            check_problem(&p, 0, 0);
            g_extra_tol = 0.0;
            fwd_out f = run_fast(&p, 1, 0);
            CHECK(!fp_any_nan(f.o, p.no_el) && !fp_any_nan(f.lse, p.nl_el), "NaN at large logits");
            int finite = 1;
            for (int64_t x = 0; x < p.nl_el; x++) finite &= isfinite(f.lse[x]) != 0;
            CHECK(finite, "lse not finite at large logits sd=%g", sds[a]);
            free_out(&f);
            fp_free(&p);
        }
}

/* 7. NaN planted in masked keys/values changes nothing (key lengths,
 * causal future positions, packed other sequences). */
static void test_nan_masked(void) {
    for (int v = 0; v < 3; v++) {
        fprob p;
        memset(&p, 0, sizeof p);
        base_desc(&p.d, 1, 200, 200, 1, 1, 16, 16);
        if (v == 0) { p.key_lengths[0] = 77; p.d.key_lengths = p.key_lengths; }
        if (v == 1) p.d.mask = QKV_MASK_CAUSAL;
        if (v == 2) { int64_t o[] = {0, 64, 101, 200}; memcpy(p.offq, o, sizeof o); p.d.num_seqs = 3; p.d.seq_offsets_q = p.offq; p.d.mask = QKV_MASK_CAUSAL; }
        if (!fp_make(&p, 7000 + (uint64_t)v, 1.0)) continue;
        fwd_out clean = run_fast(&p, 1, 0);
        int64_t j = v == 0 ? 150 : v == 1 ? 100 : 101; /* a key masked for the rows checked */
        for (int64_t t = 0; t < 16; t++) { p.k[j * 16 + t] = NAN; p.v[j * 16 + t] = NAN; }
        fwd_out dirty = run_fast(&p, 1, 0);
        int64_t rows = v == 0 ? 200 : 100; /* rows that cannot see key j */
        if (v == 2) rows = 101;
        CHECK(memcmp(clean.o, dirty.o, (size_t)(rows * 16) * sizeof(float)) == 0,
              "NaN in a masked key changed the output (v=%d)", v);
        free_out(&clean);
        free_out(&dirty);
        fp_free(&p);
    }
}

/* 8. Bigger problems for thread determinism (several units per thread). */
static void test_threads(void) {
    for (int mask = 0; mask <= 3; mask++) {
        fprob p;
        memset(&p, 0, sizeof p);
        base_desc(&p.d, 2, 333, 301, 3, 1, 32, 48);
        set_mask(&p.d, mask, 50, 40);
        p.d.bias_kind = mask == 2 ? QKV_BIAS_PER_HEAD : QKV_BIAS_NONE;
        run_case(&p, 8000 + (uint64_t)mask, 1.0, mask == 1, 1);
    }
}

/* 8b. The two schedules (fast_fwd.c): heads owned by threads, each packing
 * its kv head into a slot of its own (when there are at least as many
 * (b, kv head) pairs as threads and a head's packed K and V take at most
 * FWD_HEAD_SLOT_MAX_BYTES, 512 KB), else every head packed first. Both are
 * checked against the reference, and check_problem's thread sweep compares
 * them bitwise: with 2 pairs, 1 and 2 threads own heads, 3 do not; with 3
 * pairs and 2 threads one thread helps the other finish a head. GQA: 2
 * query heads per kv head, units over both. At D = Dv = 128, n = 512 fills
 * a slot exactly and n = 513 goes over (every head first at any thread
 * count). */
static void test_schedules(void) {
    static const struct {
        int64_t B, n, Hkv, D;
    } cases[] = {{1, 65, 2, 64}, {1, 65, 3, 64}, {2, 65, 1, 64}, {1, 300, 2, 64}, {1, 300, 3, 64},
                 {2, 300, 1, 64}, {1, 512, 2, 128}, {1, 513, 2, 128}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        fprob p;
        memset(&p, 0, sizeof p);
        base_desc(&p.d, cases[c].B, cases[c].n, cases[c].n, 2 * cases[c].Hkv, cases[c].Hkv, cases[c].D,
                  cases[c].D);
        set_mask(&p.d, (int)(c % 3), 40, 9);
        run_case(&p, 8500 + (uint64_t)c, 1.0, 0, 1);
    }
}

/* 7b. A key masked by a -inf bias: a NaN in its value changes nothing; a
 * NaN in a visible key reaches its rows' outputs and lse. */
static void test_nan_bias_and_visible(void) {
    for (int norm = 0; norm <= 2; norm++) {
        fprob p;
        memset(&p, 0, sizeof p);
        base_desc(&p.d, 1, 150, 150, 1, 1, 16, 16);
        p.d.norm = norm;
        p.d.bias_kind = QKV_BIAS_SHARED;
        if (!fp_make(&p, 7100 + (uint64_t)norm, 1.0)) continue;
        for (int64_t i = 0; i < 150; i++) p.bias[i * 150 + 40] = -INFINITY;
        fwd_out clean = run_fast(&p, 1, 1);
        for (int64_t t = 0; t < 16; t++) p.v[40 * 16 + t] = NAN;
        fwd_out dirty = run_fast(&p, 1, 1);
        CHECK(memcmp(clean.o, dirty.o, (size_t)p.no_el * sizeof(float)) == 0 &&
                  memcmp(clean.attn, dirty.attn, (size_t)p.na_el * sizeof(float)) == 0,
              "NaN in a value masked by a -inf bias changed the output (norm %d)", norm);
        free_out(&dirty);
        p.v[40 * 16 + 3] = 1.0f;
        for (int64_t t = 0; t < 16; t++) p.v[40 * 16 + t] = 0.0f;
        p.k[77 * 16 + 2] = NAN; /* visible to every row */
        dirty = run_fast(&p, 1, 0);
        int all = 1;
        for (int64_t i = 0; i < 150; i++) all &= isnan(dirty.o[i * 16]) && isnan(dirty.lse[i]);
        CHECK(all, "NaN in a visible key did not reach every row (norm %d)", norm);
        free_out(&clean);
        free_out(&dirty);
        fp_free(&p);
    }
}

/* 8. Streaming stores. An output of 256 KB or more whose rows start on
 * 64-byte lines is stored with them (fast_fwd.c, FWD_STREAM_MIN_BYTES); one
 * that does not keeps ordinary stores. Both must give the same bits, write
 * nothing outside the output (64 bytes of canary either side of the aligned
 * one), and agree with the reference (check_problem, through the ordinary
 * path). Here every head is packed first (one head's K and V take over
 * FWD_HEAD_SLOT_MAX_BYTES) and all take over 1 MiB, so the packing streams
 * too (fa_pack_kv, FA_PACK_STREAM_MIN_BYTES): panels always, V rows for
 * Dv = 64; Dv = 72 (rows of 288 bytes share lines) keeps ordinary stores
 * for V rows and O. */
static void test_streamed_output(void) {
    static const int64_t dvs[] = {64, 72};
    for (int di = 0; di < 2; di++)
        for (int mask = 0; mask <= 1; mask++) {
            fprob p;
            memset(&p, 0, sizeof p);
            base_desc(&p.d, 1, 700, 700, 4, 4, 128, dvs[di]);
            set_mask(&p.d, mask, 0, 0);
            if (!fp_make(&p, 9100 + (uint64_t)(2 * di + mask), 1.0)) {
                CHECK(0, "bad test descriptor");
                return;
            }
            char what[400];
            describe(&p, what, sizeof what);
            const size_t bytes = (size_t)p.no_el * sizeof(float);
            unsigned char *raw = aligned_alloc(64, bytes + 128);
            if (!raw) {
                CHECK(0, "out of memory");
                fp_free(&p);
                return;
            }
            memset(raw, 0xA5, bytes + 128);
            float *aligned = (float *)(void *)(raw + 64);
            for (int threads = 1; threads <= 3; threads += 2) {
                qkv_attn_desc d = p.d;
                d.impl = QKV_IMPL_FAST;
                d.threads = threads;
                fwd_out plain = run_fast(&p, threads, 0); /* guarded: not 64-byte aligned */
                qkv_status st = qkv_attention_forward(&d, p.q, p.k, p.v, aligned, NULL, NULL);
                CHECK(st == QKV_OK && plain.st == QKV_OK, "fast failed %s", what);
                CHECK(memcmp(aligned, plain.o, bytes) == 0, "streamed output differs from stored (threads %d) %s",
                      threads, what);
                int guard = 1;
                for (size_t x = 0; x < 64; x++) guard &= raw[x] == 0xA5 && raw[64 + bytes + x] == 0xA5;
                CHECK(guard, "streamed output wrote outside its buffer %s", what);
                free_out(&plain);
            }
            free(raw);
            check_problem(&p, 0, 0);
            fp_free(&p);
        }
}

/* 13. Attention dropout (fp_dropout_case): out and lse against the
 * reference (naive32 drops the same entries), attn (before dropout) too,
 * threads 1, 2, 3 bitwise. Then the mask itself: with V the identity over
 * the keys (D_v = n_k) output row i is row i of A' times the factors, 0
 * exactly where an entry is dropped: the fast path must drop exactly the
 * reference's entries (GQA, batches, packed sequences, several tiles). */
static void test_dropout(void) {
    for (int idx = 0; idx < FP_DROPOUT_CASES; idx++) {
        fprob p;
        fp_dropout_case(&p, idx);
        if (idx / 2 != 11) {
            run_case(&p, 17000 + (uint64_t)idx, 1.0, p.d.n_q <= 200, idx % 3 == 0);
            continue;
        }
        /* key length 0 for batch 0: its rows are exactly 0, lse -inf */
        if (!fp_make(&p, 17000 + (uint64_t)idx, 1.0)) continue;
        check_problem(&p, 1, 1);
        fwd_out f = run_fast(&p, 3, 0);
        int zero = f.st == QKV_OK;
        for (int64_t x = 0; x < p.no_el / 2; x++) zero &= f.o[x] == 0.0f;
        for (int64_t h = 0; h < p.d.heads; h++) zero &= f.lse[h * p.d.n_q] == -INFINITY;
        CHECK(zero, "dropout %g: a row without keys is not 0 / -inf", p.d.dropout);
        free_out(&f);
        fp_free(&p);
    }
    for (int v = 0; v < 4; v++) {
        fprob p;
        memset(&p, 0, sizeof p);
        const int packed = v >= 2;
        base_desc(&p.d, packed ? 1 : 2, 150, 140, 4, 2, 8, 140);
        p.d.mask = v % 2 ? QKV_MASK_CAUSAL : QKV_MASK_NONE;
        const int64_t oq[] = {0, 70, 150}, ok[] = {0, 61, 140};
        if (packed) fp_set_packed(&p, 2, oq, ok);
        p.d.dropout = v < 2 ? 0.5 : 0.1;
        p.d.dropout_seed = 99 + (uint64_t)v;
        if (!fp_make(&p, 17100 + (uint64_t)v, 0.3)) {
            CHECK(0, "bad dropout mask descriptor %d", v);
            continue;
        }
        const int64_t B = p.d.batch, nk = p.d.n_k, Hkv = p.d.heads_kv;
        for (int64_t b = 0; b < B; b++)
            for (int64_t j = 0; j < nk; j++)
                for (int64_t hk = 0; hk < Hkv; hk++)
                    for (int64_t c = 0; c < nk; c++) p.v[((b * nk + j) * Hkv + hk) * nk + c] = c == j;
        check_problem(&p, 0, v == 0);
        fwd_out f = run_fast(&p, 2, 0);
        qkv_attn_desc d64 = fp_desc64(&p);
        double *ro = malloc((size_t)p.no_el * sizeof(double));
        CHECK_STATUS(qkv_attention_forward(&d64, p.qd, p.kd, p.vd, ro, NULL, NULL), QKV_OK);
        int64_t differ = 0, dropped = 0, kept = 0;
        for (int64_t x = 0; x < p.no_el; x++) {
            differ += (f.o[x] == 0.0f) != (ro[x] == 0.0);
            dropped += ro[x] == 0.0;
            kept += ro[x] != 0.0;
        }
        CHECK(f.st == QKV_OK && differ == 0, "dropout mask %d: %lld entries dropped by one path only", v,
              (long long)differ);
        CHECK(dropped > 0 && kept > 0, "dropout mask %d: %lld dropped, %lld kept", v, (long long)dropped,
              (long long)kept);
        free(ro);
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
    test_packed_short();
    test_query_blocks();
    test_fully_masked();
    test_large_logits();
    test_nan_masked();
    test_nan_bias_and_visible();
    test_threads();
    test_schedules();
    test_streamed_output();
    test_dropout();
}

int main(void) { return fp_each_arch(&g_arch, all_tests); }
