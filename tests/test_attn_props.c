/* The attention forward pass against the tests' own dense oracle
 * (tests/util/attn_oracle.c), over every score x normaliser x mask with
 * awkward shapes, in F64 and F32; then the properties of the numerical
 * contract: rows sum to 1, permutation invariance,
 * causality, fully masked rows, NaN planted in masked positions, NaN
 * propagation, huge logits, determinism across thread counts.
 *
 * Tolerances (checked as |lib - oracle| <= atol + rtol * |oracle|):
 *  - F64 REFERENCE: 1e-12 / 1e-12. Both sides compute in double on O(1)
 *    values with rows of <= 13 terms; they differ only in summation order
 *    and in where exp/log are applied (a few ulps, ~1e-15).
 *  - F32 REFERENCE: 1e-7 / 1e-6. The reference computes in double from the
 *    float inputs and rounds each output once (<= 6e-8 relative); the oracle
 *    runs on the same float-rounded inputs.
 *  - AUTO (whatever fast path the build picks): F64 1e-10 / 1e-10; F32
 *    the fast-path rule |fast - ref64| <= 2 max|naive32 - ref64| + 1e-5 per
 *    tensor (the 1e-5 scaled by the tensor's largest magnitude when > 1),
 *    naive32 being the plain algorithm in float (ao_forward_naive32).
 * Seeds are fixed; every failure prints the problem and the worst index. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn_oracle.h"
#include "test_util.h"

typedef struct shape {
    int64_t B, nq, nk, H, Hkv, D, Dv;
} shape;

/* GQA, MQA, n_q < n_k, n_q > n_k, D = 1, D_v != D, n = 1, odd sizes. */
static const shape SHAPES[] = {
    {2, 5, 5, 4, 2, 3, 3},  {1, 7, 13, 4, 1, 5, 2}, {2, 13, 7, 2, 2, 1, 4},
    {1, 1, 1, 1, 1, 1, 1},  {3, 1, 6, 2, 1, 4, 3},  {1, 6, 1, 3, 3, 2, 2},
    {2, 7, 7, 4, 2, 13, 7},
};
#define NSHAPES ((int)(sizeof SHAPES / sizeof SHAPES[0]))

static const char *NORM_NAMES[4] = {"softmax", "relu", "relu/count", "sigmoid"};

static void desc_from(qkv_attn_desc *d, const shape *s, int score, int norm4) {
    qkv_attn_desc_init(d);
    d->dtype = QKV_F64;
    d->impl = QKV_IMPL_REFERENCE;
    d->batch = s->B;
    d->n_q = s->nq;
    d->n_k = s->nk;
    d->heads = s->H;
    d->heads_kv = s->Hkv;
    d->dim = s->D;
    d->dim_v = s->Dv;
    d->score = (qkv_score)score;
    d->norm = norm4 == 0 ? QKV_NORM_SOFTMAX : norm4 == 3 ? QKV_NORM_SIGMOID : QKV_NORM_RELU;
    d->relu_divide_by_count = norm4 == 2;
    if (score == QKV_SCORE_ADDITIVE) d->additive_dim = 3;
}

static int masked_entries_zero(const ao_prob *p, const double *attn) {
    const qkv_attn_desc *d = &p->d;
    for (int64_t b = 0; b < d->batch; b++)
        for (int64_t h = 0; h < d->heads; h++)
            for (int64_t i = 0; i < d->n_q; i++)
                for (int64_t j = 0; j < d->n_k; j++)
                    if (!ao_visible(d, p->x[AO_BIAS], b, h, i, j) &&
                        attn[((b * d->heads + h) * d->n_q + i) * d->n_k + j] != 0.0)
                        return 0;
    return 1;
}

/* The rule for a float fast path: the absolute tolerance of a
 * tensor is 2 max|naive32 - ref64| + 1e-5. Outputs of ao_forward_naive32
 * for p's inputs (out, attn, lse). */
typedef struct naive32 {
    double *t[3];
} naive32;

static void naive32_make(naive32 *nv, const ao_prob *p) {
    double *x[AO_NT];
    memcpy(x, p->x, sizeof x);
    x[AO_O] = nv->t[0] = calloc(p->n[AO_O] + 1, sizeof(double));
    x[AO_ATTN] = nv->t[1] = calloc(p->n[AO_ATTN] + 1, sizeof(double));
    x[AO_LSE] = nv->t[2] = calloc(p->n[AO_LSE] + 1, sizeof(double));
    if (!nv->t[0] || !nv->t[1] || !nv->t[2]) abort();
    ao_forward_naive32(&p->d, x);
}

static void naive32_free(naive32 *nv) {
    for (int i = 0; i < 3; i++) free(nv->t[i]);
}

static double fast_atol(const naive32 *nv, const ao_prob *p, int which) {
    static const int ids[3] = {AO_O, AO_ATTN, AO_LSE};
    const double *ref = p->x[ids[which]];
    size_t n = p->n[ids[which]];
    /* The 1e-5 term is meant for O(1) values: scale it with the tensor's
     * largest magnitude (relu outputs of huge logits are ~1e4). */
    double big = 1.0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(ref[i]) && fabs(ref[i]) > big) big = fabs(ref[i]);
    return 2.0 * tu_max_abs_diff_f64(nv->t[which], ref, n) + 1e-5 * big;
}

/* One library run against the oracle results held in p; with nv, the
 * tolerance is the fast-path rule instead of atol / rtol. */
static void check_against_oracle(const ao_prob *p, qkv_dtype dt, qkv_impl impl, int threads,
                                 double atol, double rtol, const naive32 *nv, const char *what) {
    char buf[400];
    double *out = calloc(p->n[AO_O] + 1, sizeof(double));
    double *attn = calloc(p->n[AO_ATTN] + 1, sizeof(double));
    double *lse = calloc(p->n[AO_LSE] + 1, sizeof(double));
    int guards = 0;
    qkv_status s = ao_lib_forward(p, dt, impl, threads, out, attn, lse, &guards);
    qkv_attn_desc dd = p->d;
    dd.dtype = dt;
    ao_describe(&dd, buf, sizeof buf);
    CHECK(s == QKV_OK, "%s: status %d (%s) for %s impl=%d", what, (int)s, qkv_status_string(s), buf,
          (int)impl);
    CHECK(guards, "%s: write outside an output buffer: %s", what, buf);
    if (s == QKV_OK) {
        size_t w;
        double e = ao_cmp(out, p->x[AO_O], p->n[AO_O], nv ? fast_atol(nv, p, 0) : atol, nv ? 0.0 : rtol, &w);
        CHECK(e <= 1.0, "%s: out off by %.3g tolerances at %zu (got %.17g want %.17g): %s impl=%d",
              what, e, w, out[w], p->x[AO_O][w], buf, (int)impl);
        e = ao_cmp(attn, p->x[AO_ATTN], p->n[AO_ATTN], nv ? fast_atol(nv, p, 1) : atol, nv ? 0.0 : rtol, &w);
        CHECK(e <= 1.0, "%s: attn off by %.3g tolerances at %zu (got %.17g want %.17g): %s impl=%d",
              what, e, w, attn[w], p->x[AO_ATTN][w], buf, (int)impl);
        CHECK(masked_entries_zero(p, attn), "%s: a masked attn entry is not exactly 0: %s", what,
              buf);
        e = ao_cmp(lse, p->x[AO_LSE], p->n[AO_LSE], nv ? fast_atol(nv, p, 2) : atol, nv ? 0.0 : rtol, &w);
        CHECK(e <= 1.0, "%s: lse off by %.3g tolerances at %zu (got %.17g want %.17g): %s impl=%d",
              what, e, w, lse[w], p->x[AO_LSE][w], buf, (int)impl);
    }
    free(out);
    free(attn);
    free(lse);
}

/* The sweep: every score x normaliser x mask x shape, F64 and F32. */
static void test_oracle_sweep(void) {
    long count = 0;
    for (int score = 0; score < 4; score++)
        for (int norm4 = 0; norm4 < 4; norm4++)
            for (int m = 0; m < AO_NUM_MASKS; m++)
                for (int si = 0; si < NSHAPES; si++) {
                    qkv_attn_desc d;
                    ao_mask_store st;
                    desc_from(&d, &SHAPES[si], score, norm4);
                    ao_mask_config(&d, m, &st);
                    /* Vary the parameters along the sweep. */
                    int v = (int)(count++ % 3);
                    if (v == 1) d.softcap = 2.5;
                    if (score == QKV_SCORE_SCALED_DOT && v == 2) d.scale = 0.7;
                    if (score == QKV_SCORE_COSINE && v != 0) d.temperature = 0.3;
                    tu_rng r;
                    uint64_t seed = 1000u + (uint64_t)(((score * 4 + norm4) * 16 + m) * 16 + si);
                    tu_rng_seed(&r, seed);
                    ao_prob p;
                    ao_prob_init(&p, &d, &r, 1.0);
                    ao_bias_plant_inf(&p, &r);
                    ao_forward(&p.d, p.x);
                    char what[160];
                    snprintf(what, sizeof what, "sweep seed=%llu %s/%s", (unsigned long long)seed,
                             NORM_NAMES[norm4], "f64");
                    check_against_oracle(&p, QKV_F64, QKV_IMPL_REFERENCE, 1, 1e-12, 1e-12, NULL, what);
                    check_against_oracle(&p, QKV_F64, QKV_IMPL_AUTO, 0, 1e-10, 1e-10, NULL, what);
                    /* F32: the same problem rounded to float. */
                    ao_prob_round_f32(&p);
                    ao_forward(&p.d, p.x);
                    snprintf(what, sizeof what, "sweep seed=%llu %s/%s", (unsigned long long)seed,
                             NORM_NAMES[norm4], "f32");
                    check_against_oracle(&p, QKV_F32, QKV_IMPL_REFERENCE, 2, 1e-7, 1e-6, NULL, what);
                    naive32 nv;
                    naive32_make(&nv, &p);
                    check_against_oracle(&p, QKV_F32, QKV_IMPL_AUTO, 0, 0.0, 0.0, &nv, what);
                    naive32_free(&nv);
                    ao_prob_free(&p);
                }
}

/* The property tests run in several modes (dtype, implementation), with
 * tolerances for comparisons that depend on summation order: F64 1e-12; F32
 * REFERENCE 1e-6 (one float rounding of a double result); F32 AUTO 1e-5 (a
 * float fast path). Row sums of A' in F32: 1e-5 (n float-rounded terms).
 * Bitwise checks (masked data unread, causality, zeros) hold in every mode. */
static qkv_dtype g_dt = QKV_F64;
static qkv_impl g_impl = QKV_IMPL_REFERENCE;
static double g_tol = 1e-12, g_tol_sum = 1e-12;

static void set_mode(qkv_dtype dt, qkv_impl impl) {
    g_dt = dt;
    g_impl = impl;
    g_tol = dt == QKV_F64 ? (impl == QKV_IMPL_REFERENCE ? 1e-12 : 1e-10) : (impl == QKV_IMPL_REFERENCE ? 1e-6 : 1e-5);
    g_tol_sum = dt == QKV_F64 ? 1e-12 : 1e-5;
}

/* Long rows against the oracle, in F32 (REFERENCE and AUTO: a tiled fast
 * path's block edges: 64-query blocks, 128-key tiles) and F64 AUTO: sizes
 * one off the tile sizes, several tiles, odd D; every mask configuration;
 * then rows of steadily increasing logits (a rescale at every tile),
 * windows of tile - 1, tile and tile + 1, and a whole key tile masked by a
 * -inf bias while its row is not. */
static void check_long(ao_prob *p, const char *what) {
    ao_forward(&p->d, p->x);
    check_against_oracle(p, QKV_F64, QKV_IMPL_AUTO, 0, 1e-10, 1e-10, NULL, what);
    ao_prob_round_f32(p);
    ao_forward(&p->d, p->x);
    check_against_oracle(p, QKV_F32, QKV_IMPL_REFERENCE, 3, 1e-7, 1e-6, NULL, what);
    naive32 nv;
    naive32_make(&nv, p);
    check_against_oracle(p, QKV_F32, QKV_IMPL_AUTO, 0, 0.0, 0.0, &nv, what);
    naive32_free(&nv);
}

static void test_long_rows(void) {
    static const shape LS[] = {
        {1, 65, 129, 2, 1, 17, 9}, {2, 63, 257, 2, 2, 8, 8}, {1, 130, 127, 4, 2, 33, 16}, {1, 203, 203, 1, 1, 64, 64}};
    for (int si = 0; si < 4; si++)
        for (int sc = 0; sc < 2; sc++)
            for (int m = 0; m < AO_NUM_MASKS; m++) {
                int score = sc ? QKV_SCORE_COSINE : QKV_SCORE_SCALED_DOT, norm4 = (m + si + sc) % 4;
                qkv_attn_desc d;
                ao_mask_store st;
                desc_from(&d, &LS[si], score, norm4);
                ao_mask_config(&d, m, &st);
                if (m % 3 == 1) d.softcap = 3.0;
                ao_prob p;
                uint64_t seed = 9000u + (uint64_t)((si * 2 + sc) * 16 + m);
                tu_rng r;
                tu_rng_seed(&r, seed);
                ao_prob_init(&p, &d, &r, 1.0);
                ao_bias_plant_inf(&p, &r);
                char what[96];
                snprintf(what, sizeof what, "long rows seed=%llu %s", (unsigned long long)seed, NORM_NAMES[norm4]);
                check_long(&p, what);
                ao_prob_free(&p);
            }
    /* Steadily increasing logits along every row: key j = (1 + j / 8) * u
     * with q = u, so the running max grows at every tile. */
    for (int norm4 = 0; norm4 < 4; norm4 += 3)
        for (int mask = 0; mask < 2; mask++) {
            shape s = {1, 70, 300, 2, 1, 8, 4};
            qkv_attn_desc d;
            desc_from(&d, &s, QKV_SCORE_DOT, norm4);
            d.mask = mask ? QKV_MASK_CAUSAL : QKV_MASK_NONE;
            ao_prob p;
            tu_rng r;
            tu_rng_seed(&r, 9500u + (uint64_t)(norm4 + mask));
            ao_prob_init(&p, &d, &r, 1.0);
            for (int64_t i = 0; i < s.nq * s.H; i++)
                for (int64_t t = 0; t < s.D; t++) p.x[AO_Q][i * s.D + t] = t == 0 ? 1.0 : 0.0;
            for (int64_t j = 0; j < s.nk; j++)
                for (int64_t t = 0; t < s.D; t++) p.x[AO_K][j * s.D + t] = t == 0 ? 1.0 + (double)j / 8.0 : 0.0;
            check_long(&p, "increasing logits");
            ao_prob_free(&p);
        }
    /* Windows around the tile size (keys >= 2 tiles). */
    static const int64_t wl[] = {0, 1, 63, 64, 65, 127, 128, 129, 255, 256};
    for (size_t w = 0; w < sizeof wl / sizeof wl[0]; w++)
        for (int two_sided = 0; two_sided < 2; two_sided++) {
            shape s = {1, 66, 260, 2, 1, 5, 3};
            qkv_attn_desc d;
            desc_from(&d, &s, QKV_SCORE_SCALED_DOT, (int)(w % 4));
            d.mask = two_sided ? QKV_MASK_WINDOW : QKV_MASK_CAUSAL_WINDOW;
            d.window_left = wl[w];
            d.window_right = two_sided ? wl[(w + 3) % 10] : 0;
            ao_prob p;
            tu_rng r;
            tu_rng_seed(&r, 9600u + (uint64_t)(w * 2 + (size_t)two_sided));
            ao_prob_init(&p, &d, &r, 1.0);
            char what[96];
            snprintf(what, sizeof what, "window (%lld, %lld)", (long long)d.window_left, (long long)d.window_right);
            check_long(&p, what);
            ao_prob_free(&p);
        }
    /* A whole key tile (keys 0..127) masked by -inf bias, rows not empty;
     * and random 16-key blocks of -inf. */
    for (int blocks = 0; blocks < 2; blocks++) {
        shape s = {1, 20, 300, 2, 2, 6, 5};
        qkv_attn_desc d;
        desc_from(&d, &s, QKV_SCORE_SCALED_DOT, 0);
        d.bias_kind = QKV_BIAS_PER_HEAD;
        ao_prob p;
        tu_rng r;
        tu_rng_seed(&r, 9700u + (uint64_t)blocks);
        ao_prob_init(&p, &d, &r, 1.0);
        for (int64_t h = 0; h < s.H; h++)
            for (int64_t i = 0; i < s.nq; i++)
                for (int64_t j0 = 0; j0 < s.nk; j0 += 16) {
                    int kill = blocks ? tu_rng_uniform(&r) < 0.5 : j0 < 128;
                    if (kill)
                        for (int64_t j = j0; j < j0 + 16 && j < s.nk; j++)
                            p.x[AO_BIAS][(h * s.nq + i) * s.nk + j] = -INFINITY;
                }
        check_long(&p, blocks ? "random -inf blocks" : "first key tile all -inf");
        ao_prob_free(&p);
    }
}

/* A problem for the property tests (inputs rounded to float in F32 mode). */
static void make_prob(ao_prob *p, const qkv_attn_desc *d, uint64_t seed, double sd) {
    tu_rng r;
    tu_rng_seed(&r, seed);
    ao_prob_init(p, d, &r, sd);
    if (g_dt == QKV_F32) ao_prob_round_f32(p);
}

static double *dalloc(size_t n) {
    double *x = calloc(n ? n : 1, sizeof *x);
    if (!x) abort();
    return x;
}

/* Rows of A' sum to 1 under softmax (g_tol_sum: in F64 the weights are
 * computed in double and normalised by their sum); fully masked rows sum to
 * exactly 0. */
static void test_rows_sum_to_one(void) {
    for (int m = 0; m < AO_NUM_MASKS; m++)
        for (int si = 0; si < NSHAPES; si++) {
            qkv_attn_desc d;
            ao_mask_store st;
            desc_from(&d, &SHAPES[si], QKV_SCORE_SCALED_DOT, 0);
            ao_mask_config(&d, m, &st);
            ao_prob p;
            uint64_t seed = 77u + (uint64_t)(m * 16 + si);
            make_prob(&p, &d, seed, 2.0);
            tu_rng r;
            tu_rng_seed(&r, seed);
            ao_bias_plant_inf(&p, &r);
            double *out = dalloc(p.n[AO_O]), *attn = dalloc(p.n[AO_ATTN]);
            double *lse = dalloc(p.n[AO_LSE]);
            CHECK_STATUS(ao_lib_forward(&p, g_dt, g_impl, 1, out, attn, lse, NULL),
                         QKV_OK);
            double worst = 0.0;
            long bad_empty = 0;
            for (size_t row = 0; row < p.n[AO_LSE]; row++) {
                double sum = 0.0;
                for (int64_t j = 0; j < d.n_k; j++) sum += attn[row * (size_t)d.n_k + (size_t)j];
                if (lse[row] == -INFINITY) {
                    if (sum != 0.0) bad_empty++;
                } else if (fabs(sum - 1.0) > worst) {
                    worst = fabs(sum - 1.0);
                }
            }
            CHECK(worst <= g_tol_sum, "mask %d shape %d seed %llu: row sum off by %.3g", m, si,
                  (unsigned long long)seed, worst);
            CHECK(bad_empty == 0, "mask %d shape %d: %ld fully masked rows with nonzero weights", m,
                  si, bad_empty);
            free(out);
            free(attn);
            free(lse);
            ao_prob_free(&p);
        }
}

/* Permuting keys and values together (same permutation for every batch and
 * kv head) leaves O unchanged when nothing is masked: every score and
 * normaliser. g_tol: only the summation order changes. */
static void test_permutation(void) {
    for (int score = 0; score < 4; score++)
        for (int norm4 = 0; norm4 < 4; norm4++) {
            shape s = {2, 5, 7, 4, 2, 3, 2};
            qkv_attn_desc d;
            desc_from(&d, &s, score, norm4);
            ao_prob p;
            uint64_t seed = 500u + (uint64_t)(score * 4 + norm4);
            make_prob(&p, &d, seed, 1.0);
            double *o1 = dalloc(p.n[AO_O]), *o2 = dalloc(p.n[AO_O]);
            double *a1 = dalloc(p.n[AO_ATTN]), *a2 = dalloc(p.n[AO_ATTN]);
            CHECK_STATUS(ao_lib_forward(&p, g_dt, g_impl, 1, o1, a1, NULL, NULL),
                         QKV_OK);
            static const int perm[7] = {3, 6, 0, 5, 1, 4, 2};
            double *k2 = dalloc(p.n[AO_K]), *v2 = dalloc(p.n[AO_V]);
            size_t krow = (size_t)(s.Hkv * s.D), vrow = (size_t)(s.Hkv * s.Dv);
            for (int64_t b = 0; b < s.B; b++)
                for (int j = 0; j < 7; j++) {
                    memcpy(k2 + ((size_t)b * 7 + (size_t)j) * krow,
                           p.x[AO_K] + ((size_t)b * 7 + (size_t)perm[j]) * krow, krow * sizeof(double));
                    memcpy(v2 + ((size_t)b * 7 + (size_t)j) * vrow,
                           p.x[AO_V] + ((size_t)b * 7 + (size_t)perm[j]) * vrow, vrow * sizeof(double));
                }
            free(p.x[AO_K]);
            free(p.x[AO_V]);
            p.x[AO_K] = k2;
            p.x[AO_V] = v2;
            CHECK_STATUS(ao_lib_forward(&p, g_dt, g_impl, 1, o2, a2, NULL, NULL),
                         QKV_OK);
            size_t w;
            double e = ao_cmp(o2, o1, p.n[AO_O], g_tol, g_tol, &w);
            CHECK(e <= 1.0, "permutation changes O (score %d norm %s seed %llu) at %zu: %.17g vs %.17g",
                  score, NORM_NAMES[norm4], (unsigned long long)seed, w, o2[w], o1[w]);
            /* The attention matrix's columns are permuted the same way. */
            double worst = 0.0;
            for (size_t row = 0; row < p.n[AO_LSE]; row++)
                for (int j = 0; j < 7; j++) {
                    double x = fabs(a2[row * 7 + (size_t)j] - a1[row * 7 + (size_t)perm[j]]);
                    if (x > worst) worst = x;
                }
            CHECK(worst <= g_tol_sum, "permutation: attn columns not permuted (off by %.3g)", worst);
            free(o1);
            free(o2);
            free(a1);
            free(a2);
            ao_prob_free(&p);
        }
}

/* Causal output at query i is unchanged (bitwise: masked data is never read)
 * when queries after i and keys/values after its aligned position change;
 * n_q == n_k and both n_q != n_k alignments. */
static void test_causality(void) {
    static const shape S[] = {{2, 6, 6, 2, 1, 3, 2}, {1, 4, 9, 2, 2, 2, 3}, {2, 9, 4, 2, 1, 3, 3}};
    for (int si = 0; si < 3; si++)
        for (int score = 0; score < 4; score++)
            for (int cw = 0; cw < 2; cw++) {
                const shape *s = &S[si];
                qkv_attn_desc d;
                desc_from(&d, s, score, score % 4);
                d.mask = cw ? QKV_MASK_CAUSAL_WINDOW : QKV_MASK_CAUSAL;
                d.window_left = 2;
                ao_prob p;
                uint64_t seed = 900u + (uint64_t)(si * 8 + score * 2 + cw);
                make_prob(&p, &d, seed, 1.0);
                double *o1 = dalloc(p.n[AO_O]), *o2 = dalloc(p.n[AO_O]);
                CHECK_STATUS(ao_lib_forward(&p, g_dt, g_impl, 1, o1, NULL, NULL, NULL),
                             QKV_OK);
                tu_rng r;
                tu_rng_seed(&r, seed + 1);
                for (int64_t i = 0; i < s->nq; i++) {
                    ao_prob p2;
                    make_prob(&p2, &d, seed, 1.0); /* same data */
                    int64_t pos = i + s->nk - s->nq;
                    /* Change everything after i / pos. */
                    for (int64_t b = 0; b < s->B; b++) {
                        for (int64_t ii = i + 1; ii < s->nq; ii++)
                            tu_fill_normal_f64(&r, p2.x[AO_Q] + ((size_t)(b * s->nq + ii) * (size_t)(s->H * s->D)),
                                               (size_t)(s->H * s->D), 5.0);
                        for (int64_t j = pos + 1; j < s->nk; j++) {
                            if (j < 0) continue;
                            tu_fill_normal_f64(&r, p2.x[AO_K] + ((size_t)(b * s->nk + j) * (size_t)(s->Hkv * s->D)),
                                               (size_t)(s->Hkv * s->D), 5.0);
                            tu_fill_normal_f64(&r, p2.x[AO_V] + ((size_t)(b * s->nk + j) * (size_t)(s->Hkv * s->Dv)),
                                               (size_t)(s->Hkv * s->Dv), 5.0);
                        }
                    }
                    CHECK_STATUS(ao_lib_forward(&p2, g_dt, g_impl, 1, o2, NULL, NULL, NULL),
                                 QKV_OK);
                    long diff = 0;
                    for (int64_t b = 0; b < s->B; b++)
                        for (int64_t ii = 0; ii <= i; ii++)
                            for (int64_t t = 0; t < s->H * s->Dv; t++) {
                                size_t at = (size_t)((b * s->nq + ii) * s->H * s->Dv + t);
                                if (memcmp(&o1[at], &o2[at], sizeof(double)) != 0) diff++;
                            }
                    CHECK(diff == 0, "causal (shape %d score %d cw %d seed %llu): %ld outputs at rows <= %lld changed",
                          si, score, cw, (unsigned long long)seed, diff, (long long)i);
                    ao_prob_free(&p2);
                }
                free(o1);
                free(o2);
                ao_prob_free(&p);
            }
}

/* Fully masked rows: output 0, attn row 0, lse -inf, no NaN, zero gradient
 * and no contribution to dK/dV; for every normaliser and every way a row can
 * be fully masked. */
static void test_fully_masked(void) {
    for (int norm4 = 0; norm4 < 4; norm4++)
        for (int way = 0; way < 5; way++) {
            shape s = {2, 6, 3, 2, 1, 3, 2};
            qkv_attn_desc d;
            desc_from(&d, &s, way == 4 ? QKV_SCORE_ADDITIVE : QKV_SCORE_SCALED_DOT, norm4);
            int64_t lens[2] = {3, 0};
            int64_t oq[3] = {0, 4, 6}, ok[3] = {0, 0, 3};
            switch (way) {
            case 0: d.key_lengths = lens; break;          /* batch 1 has no keys */
            case 1: d.mask = QKV_MASK_CAUSAL; break;      /* n_q > n_k: rows 0..2 see nothing */
            case 2:
                d.mask = QKV_MASK_WINDOW;                 /* window(0,0) at p = i - 3 */
                break;
            case 3:                                       /* packed, empty key sequence */
                d.batch = 1;
                d.num_seqs = 2;
                d.seq_offsets_q = oq;
                d.seq_offsets_k = ok;
                break;
            default: d.bias_kind = QKV_BIAS_PER_HEAD; break; /* a row of -inf bias */
            }
            ao_prob p;
            uint64_t seed = 3000u + (uint64_t)(norm4 * 8 + way);
            make_prob(&p, &d, seed, 1.0);
            if (way == 4)
                for (int64_t h = 0; h < s.H; h++)
                    for (int64_t j = 0; j < s.nk; j++) p.x[AO_BIAS][(h * s.nq + 2) * s.nk + j] = -INFINITY;
            ao_forward(&p.d, p.x);
            double *out = dalloc(p.n[AO_O]), *attn = dalloc(p.n[AO_ATTN]), *lse = dalloc(p.n[AO_LSE]);
            int guards = 0;
            CHECK_STATUS(ao_lib_forward(&p, g_dt, g_impl, 1, out, attn, lse, &guards),
                         QKV_OK);
            CHECK(guards, "fully masked way %d: guard bytes overwritten", way);
            long masked_rows = 0, bad = 0;
            for (int64_t b = 0; b < p.d.batch; b++)
                for (int64_t h = 0; h < s.H; h++)
                    for (int64_t i = 0; i < s.nq; i++) {
                        int any = 0;
                        for (int64_t j = 0; j < s.nk; j++) any |= ao_visible(&p.d, p.x[AO_BIAS], b, h, i, j);
                        if (any) continue;
                        masked_rows++;
                        size_t row = (size_t)((b * s.H + h) * s.nq + i);
                        if (lse[row] != -INFINITY) bad++;
                        for (int64_t j = 0; j < s.nk; j++)
                            if (attn[row * (size_t)s.nk + (size_t)j] != 0.0) bad++;
                        for (int64_t e = 0; e < s.Dv; e++)
                            if (out[(size_t)(((b * s.nq + i) * s.H + h) * s.Dv + e)] != 0.0) bad++;
                    }
            CHECK(masked_rows > 0, "fully masked way %d: the test has no fully masked row", way);
            CHECK(bad == 0, "fully masked way %d norm %s: %ld entries not 0 / -inf", way,
                  NORM_NAMES[norm4], bad);
            CHECK(!tu_has_nan_f64(out, p.n[AO_O]) && !tu_has_nan_f64(attn, p.n[AO_ATTN]) &&
                      !tu_has_nan_f64(lse, p.n[AO_LSE]),
                  "fully masked way %d: NaN in the output", way);
            size_t w;
            CHECK(ao_cmp(out, p.x[AO_O], p.n[AO_O], g_tol, g_tol, &w) <= 1.0,
                  "fully masked way %d: out differs from the oracle at %zu", way, w);

            /* Backward: zero gradients for masked rows; dK, dV untouched by
             * them. With dout nonzero only on the masked rows, every
             * gradient must be exactly 0. */
            double *dout = dalloc(p.n[AO_O]);
            for (int64_t b = 0; b < p.d.batch; b++)
                for (int64_t h = 0; h < s.H; h++)
                    for (int64_t i = 0; i < s.nq; i++) {
                        int any = 0;
                        for (int64_t j = 0; j < s.nk; j++) any |= ao_visible(&p.d, p.x[AO_BIAS], b, h, i, j);
                        if (!any)
                            for (int64_t e = 0; e < s.Dv; e++)
                                dout[(size_t)(((b * s.nq + i) * s.H + h) * s.Dv + e)] = 1.0 + (double)e;
                    }
            ao_grads g = {dalloc(p.n[AO_Q]), dalloc(p.n[AO_K]), dalloc(p.n[AO_V]),
                          dalloc(p.n[AO_BIAS]), dalloc(p.n[AO_W1]), dalloc(p.n[AO_W2]),
                          dalloc(p.n[AO_W])};
            for (int pass = 0; pass < 2; pass++) {
                CHECK_STATUS(ao_lib_backward(&p, g_dt, g_impl, 1, dout, pass, &g, &guards),
                             QKV_OK);
                CHECK(guards, "fully masked way %d backward: guard bytes overwritten", way);
                double *gs[7] = {g.dq, g.dk, g.dv, g.dbias, g.dw1, g.dw2, g.dw};
                size_t ns[7] = {p.n[AO_Q], p.n[AO_K], p.n[AO_V], p.n[AO_BIAS],
                                p.n[AO_W1], p.n[AO_W2], p.n[AO_W]};
                for (int t = 0; t < 7; t++) {
                    long nz = 0;
                    for (size_t i = 0; i < ns[t]; i++)
                        if (gs[t][i] != 0.0) nz++;
                    CHECK(nz == 0, "fully masked way %d norm %s pass %d: gradient %d has %ld nonzero entries",
                          way, NORM_NAMES[norm4], pass, t, nz);
                }
            }
            free(g.dq);
            free(g.dk);
            free(g.dv);
            free(g.dbias);
            free(g.dw1);
            free(g.dw2);
            free(g.dw);
            free(dout);
            free(out);
            free(attn);
            free(lse);
            ao_prob_free(&p);
        }
}

/* NaN planted at key j (in K and V, or in V only for bias-masked keys): rows
 * for which j is masked are bitwise unchanged and NaN-free; rows for which j
 * is visible get NaN (no silent fixing). Then NaN in a query row reaches
 * exactly that row. */
static void test_nan_planting(void) {
    for (int m = 0; m < AO_NUM_MASKS; m++)
        for (int norm4 = 0; norm4 < 4; norm4++) {
            shape s = {2, 5, 7, 2, 1, 3, 2};
            qkv_attn_desc d;
            ao_mask_store st;
            desc_from(&d, &s, norm4 == 1 ? QKV_SCORE_COSINE : QKV_SCORE_SCALED_DOT, norm4);
            ao_mask_config(&d, m, &st);
            ao_prob p;
            uint64_t seed = 4000u + (uint64_t)(m * 4 + norm4);
            make_prob(&p, &d, seed, 1.0);
            tu_rng r;
            tu_rng_seed(&r, seed);
            ao_bias_plant_inf(&p, &r);
            int64_t B = p.d.batch, nq = p.d.n_q, nk = p.d.n_k, H = p.d.heads;
            double *o1 = dalloc(p.n[AO_O]), *o2 = dalloc(p.n[AO_O]);
            double *l1 = dalloc(p.n[AO_LSE]), *l2 = dalloc(p.n[AO_LSE]);
            CHECK_STATUS(ao_lib_forward(&p, g_dt, g_impl, 1, o1, NULL, l1, NULL), QKV_OK);
            for (int kind = 0; kind < 2; kind++) /* 0: K and V, 1: V only */
                for (int64_t j = 0; j < nk; j++) {
                    double *kk = p.x[AO_K], *vv = p.x[AO_V];
                    double *k2 = dalloc(p.n[AO_K]), *v2 = dalloc(p.n[AO_V]);
                    memcpy(k2, kk, p.n[AO_K] * sizeof(double));
                    memcpy(v2, vv, p.n[AO_V] * sizeof(double));
                    for (int64_t b = 0; b < B; b++) {
                        if (kind == 0) k2[(size_t)((b * nk + j) * s.D)] = NAN; /* Hkv = 1 */
                        v2[(size_t)((b * nk + j) * s.Dv + 1)] = NAN;
                    }
                    p.x[AO_K] = k2;
                    p.x[AO_V] = v2;
                    CHECK_STATUS(ao_lib_forward(&p, g_dt, g_impl, 1, o2, NULL, l2, NULL), QKV_OK);
                    for (int64_t b = 0; b < B; b++)
                        for (int64_t h = 0; h < H; h++)
                            for (int64_t i = 0; i < nq; i++) {
                                /* With K poisoned only the structural mask
                                 * protects (a bias of -inf is added to a
                                 * computed score); with V only, both do. */
                                int vis_struct = ao_visible(&p.d, NULL, b, h, i, j);
                                int vis = ao_visible(&p.d, p.x[AO_BIAS], b, h, i, j);
                                int visible = kind == 0 ? vis_struct : vis;
                                const double *a = o1 + (size_t)(((b * nq + i) * H + h) * s.Dv);
                                const double *c = o2 + (size_t)(((b * nq + i) * H + h) * s.Dv);
                                size_t row = (size_t)((b * H + h) * nq + i);
                                if (!visible || kind == 1)
                                    CHECK(memcmp(&l1[row], &l2[row], sizeof(double)) == 0,
                                          "NaN planted in %s key %lld (%s) changed lse of row b%lld h%lld i%lld: mask %d norm %s seed %llu (got %g, was %g)",
                                          visible ? "visible" : "masked", (long long)j, kind ? "V" : "K+V",
                                          (long long)b, (long long)h, (long long)i, m, NORM_NAMES[norm4],
                                          (unsigned long long)seed, l2[row], l1[row]);
                                else if (vis)
                                    CHECK(isnan(l2[row]),
                                          "NaN in visible key %lld (K) did not reach lse of row b%lld h%lld i%lld: mask %d norm %s (got %g)",
                                          (long long)j, (long long)b, (long long)h, (long long)i, m,
                                          NORM_NAMES[norm4], l2[row]);
                                if (!visible) {
                                    CHECK(memcmp(a, c, (size_t)s.Dv * sizeof(double)) == 0,
                                          "NaN planted in masked key %lld (%s) changed row b%lld h%lld i%lld: mask %d norm %s seed %llu (got %g)",
                                          (long long)j, kind ? "V" : "K+V", (long long)b, (long long)h,
                                          (long long)i, m, NORM_NAMES[norm4], (unsigned long long)seed, c[1]);
                                } else if (vis) {
                                    CHECK(isnan(c[1]),
                                          "NaN in visible key %lld (%s) did not reach row b%lld h%lld i%lld: mask %d norm %s (got %g)",
                                          (long long)j, kind ? "V" : "K+V", (long long)b, (long long)h,
                                          (long long)i, m, NORM_NAMES[norm4], c[1]);
                                }
                            }
                    p.x[AO_K] = kk;
                    p.x[AO_V] = vv;
                    free(k2);
                    free(v2);
                }
            /* NaN in query row (b=0, i=nq-1... any row with a visible key). */
            double *qq = p.x[AO_Q];
            double *q2 = dalloc(p.n[AO_Q]);
            memcpy(q2, qq, p.n[AO_Q] * sizeof(double));
            int64_t ib = 0, ii = 1 % nq, ih = 1 % H;
            q2[(size_t)(((ib * nq + ii) * H + ih) * s.D)] = NAN;
            p.x[AO_Q] = q2;
            CHECK_STATUS(ao_lib_forward(&p, g_dt, g_impl, 1, o2, NULL, l2, NULL), QKV_OK);
            int any = 0;
            for (int64_t j = 0; j < nk; j++) any |= ao_visible(&p.d, p.x[AO_BIAS], ib, ih, ii, j);
            for (int64_t b = 0; b < B; b++)
                for (int64_t i = 0; i < nq; i++)
                    for (int64_t h = 0; h < H; h++) {
                        size_t at = (size_t)(((b * nq + i) * H + h) * s.Dv);
                        size_t row = (size_t)((b * H + h) * nq + i);
                        if (b == ib && i == ii && h == ih) {
                            if (any) {
                                CHECK(isnan(o2[at]) && isnan(o2[at + 1]),
                                      "NaN in query row did not propagate: mask %d norm %s (got %g %g)",
                                      m, NORM_NAMES[norm4], o2[at], o2[at + 1]);
                                CHECK(isnan(l2[row]), "NaN in query row did not reach its lse: mask %d norm %s (got %g)",
                                      m, NORM_NAMES[norm4], l2[row]);
                            } else {
                                CHECK(o2[at] == 0.0 && o2[at + 1] == 0.0 && l2[row] == -INFINITY,
                                      "NaN query of a fully masked row: out not 0 / lse not -inf: mask %d norm %s", m,
                                      NORM_NAMES[norm4]);
                            }
                        } else {
                            CHECK(memcmp(o1 + at, o2 + at, (size_t)s.Dv * sizeof(double)) == 0 &&
                                      memcmp(&l1[row], &l2[row], sizeof(double)) == 0,
                                  "NaN in one query row changed another row: mask %d norm %s", m,
                                  NORM_NAMES[norm4]);
                        }
                    }
            p.x[AO_Q] = qq;
            free(q2);
            free(o1);
            free(o2);
            free(l1);
            free(l2);
            ao_prob_free(&p);
        }
}

/* NaN planted in keys and values no query sees: out and every gradient are
 * bitwise unchanged, and those keys' dK and dV are exactly 0. */
static void test_nan_unseen_keys_backward(void) {
    for (int way = 0; way < 2; way++)
        for (int norm4 = 0; norm4 < 4; norm4++) {
            shape s = {2, 3, 8, 2, 1, 3, 2};
            qkv_attn_desc d;
            desc_from(&d, &s, QKV_SCORE_SCALED_DOT, norm4);
            int64_t lens[2] = {5, 2};
            if (way == 0) {
                d.key_lengths = lens; /* keys >= len unseen */
            } else {
                d.mask = QKV_MASK_CAUSAL_WINDOW; /* p = i + 5: keys 0..3 unseen */
                d.window_left = 1;
            }
            ao_prob p;
            uint64_t seed = 5000u + (uint64_t)(way * 4 + norm4);
            make_prob(&p, &d, seed, 1.0);
            double *dout = dalloc(p.n[AO_O]);
            tu_rng r;
            tu_rng_seed(&r, seed + 7);
            tu_fill_normal_f64(&r, dout, p.n[AO_O], 1.0);
            ao_grads g1 = {dalloc(p.n[AO_Q]), dalloc(p.n[AO_K]), dalloc(p.n[AO_V]), NULL, NULL, NULL, NULL};
            ao_grads g2 = {dalloc(p.n[AO_Q]), dalloc(p.n[AO_K]), dalloc(p.n[AO_V]), NULL, NULL, NULL, NULL};
            double *o1 = dalloc(p.n[AO_O]), *o2 = dalloc(p.n[AO_O]);
            CHECK_STATUS(ao_lib_forward(&p, g_dt, g_impl, 1, o1, NULL, NULL, NULL), QKV_OK);
            CHECK_STATUS(ao_lib_backward(&p, g_dt, g_impl, 1, dout, 0, &g1, NULL), QKV_OK);
            unsigned char unseen[2][8];
            for (int64_t b = 0; b < 2; b++)
                for (int64_t j = 0; j < 8; j++) {
                    int seen = 0;
                    for (int64_t i = 0; i < 3; i++) seen |= ao_visible(&p.d, NULL, b, 0, i, j);
                    unseen[b][j] = (unsigned char)!seen;
                    if (!seen) {
                        for (int64_t t = 0; t < s.D; t++) p.x[AO_K][(size_t)((b * 8 + j) * s.D + t)] = NAN;
                        for (int64_t t = 0; t < s.Dv; t++) p.x[AO_V][(size_t)((b * 8 + j) * s.Dv + t)] = NAN;
                    }
                }
            CHECK_STATUS(ao_lib_forward(&p, g_dt, g_impl, 1, o2, NULL, NULL, NULL), QKV_OK);
            for (int pass = 0; pass < 2; pass++) {
                CHECK_STATUS(ao_lib_backward(&p, g_dt, g_impl, 1, dout, pass, &g2, NULL), QKV_OK);
                CHECK(memcmp(o1, o2, p.n[AO_O] * sizeof(double)) == 0,
                      "NaN in unseen keys changed out (way %d norm %s)", way, NORM_NAMES[norm4]);
                CHECK(memcmp(g1.dq, g2.dq, p.n[AO_Q] * sizeof(double)) == 0,
                      "NaN in unseen keys changed dq (way %d norm %s pass %d)", way, NORM_NAMES[norm4], pass);
                long bad = 0;
                for (int64_t b = 0; b < 2; b++)
                    for (int64_t j = 0; j < 8; j++) {
                        for (int64_t t = 0; t < s.D; t++) {
                            size_t at = (size_t)((b * 8 + j) * s.D + t);
                            if (unseen[b][j] ? g2.dk[at] != 0.0 : memcmp(&g1.dk[at], &g2.dk[at], 8) != 0) bad++;
                        }
                        for (int64_t t = 0; t < s.Dv; t++) {
                            size_t at = (size_t)((b * 8 + j) * s.Dv + t);
                            if (unseen[b][j] ? g2.dv[at] != 0.0 : memcmp(&g1.dv[at], &g2.dv[at], 8) != 0) bad++;
                        }
                    }
                CHECK(bad == 0, "NaN in unseen keys: %ld dk/dv entries wrong (way %d norm %s pass %d)", bad,
                      way, NORM_NAMES[norm4], pass);
            }
            free(g1.dq); free(g1.dk); free(g1.dv);
            free(g2.dq); free(g2.dk); free(g2.dv);
            free(o1);
            free(o2);
            free(dout);
            ao_prob_free(&p);
        }
}

/* Huge logits: finite, correct output (max subtracted). F64 up to 1e30; F32
 * logits near 80, 89 (expf overflows at ~88.7) and 1e4; rows all ~ -1e5. */
static void test_huge_logits(void) {
    static const double f64_scales[] = {1e2, 1e4, 1e15, 1e30};
    static const double f32_target[] = {80.0, 89.0, 1e4};
    for (int norm4 = 0; norm4 < 4; norm4++)
        for (int dt = 0; dt < 2; dt++)
            for (int t = 0; t < (dt ? 3 : 4); t++) {
                shape s = {2, 5, 6, 2, 1, 4, 3};
                qkv_attn_desc d;
                desc_from(&d, &s, QKV_SCORE_DOT, norm4);
                ao_prob p;
                uint64_t seed = 6000u + (uint64_t)(norm4 * 16 + dt * 8 + t);
                make_prob(&p, &d, seed, 1.0);
                /* Scale q so the largest |logit| is the target (dot score). */
                double target = dt ? f32_target[t] : f64_scales[t];
                ao_forward(&p.d, p.x);
                double big = 0.0;
                {
                    size_t nn = (size_t)(s.nq * s.nk);
                    double *S = dalloc(nn);
                    unsigned char *vis = malloc(nn);
                    for (int64_t b = 0; b < s.B; b++)
                        for (int64_t h = 0; h < s.H; h++) {
                            ao_logits(&p.d, p.x, b, h, S, vis);
                            for (size_t i = 0; i < nn; i++) big = fmax(big, fabs(S[i]));
                        }
                    free(S);
                    free(vis);
                }
                for (size_t i = 0; i < p.n[AO_Q]; i++) p.x[AO_Q][i] *= target / big;
                if (dt) ao_prob_round_f32(&p);
                ao_forward(&p.d, p.x);
                double *out = dalloc(p.n[AO_O]), *attn = dalloc(p.n[AO_ATTN]), *lse = dalloc(p.n[AO_LSE]);
                qkv_dtype dtype = dt ? QKV_F32 : QKV_F64;
                for (int impl = 0; impl < 2; impl++) {
                    CHECK_STATUS(ao_lib_forward(&p, dtype, impl ? QKV_IMPL_REFERENCE : QKV_IMPL_AUTO, 1, out,
                                                attn, lse, NULL),
                                 QKV_OK);
                    int finite = 1;
                    for (size_t i = 0; i < p.n[AO_O]; i++) finite &= isfinite(out[i]) != 0;
                    for (size_t i = 0; i < p.n[AO_ATTN]; i++) finite &= isfinite(attn[i]) != 0;
                    for (size_t i = 0; i < p.n[AO_LSE]; i++) finite &= isfinite(lse[i]) != 0;
                    CHECK(finite, "huge logits %g (%s, norm %s, impl %d): non-finite output", target,
                          dt ? "f32" : "f64", NORM_NAMES[norm4], impl);
                    double at = dt ? 1e-7 : 1e-12, rt = dt ? 1e-6 : 1e-12;
                    /* relu and sigmoid weights are not normalised: with
                     * relu the output is ~target, so the absolute floor
                     * scales with it (cancellation between terms). */
                    if (norm4 == 1 || norm4 == 2) at *= target;
                    naive32 nv;
                    int fast = dt && !impl; /* F32 AUTO: the fast-path rule */
                    if (fast) naive32_make(&nv, &p);
                    size_t w;
                    double e = ao_cmp(out, p.x[AO_O], p.n[AO_O], fast ? fast_atol(&nv, &p, 0) : at, fast ? 0.0 : rt, &w);
                    CHECK(e <= 1.0, "huge logits %g (%s, norm %s, impl %d): out[%zu] %.17g want %.17g", target,
                          dt ? "f32" : "f64", NORM_NAMES[norm4], impl, w, out[w], p.x[AO_O][w]);
                    e = ao_cmp(lse, p.x[AO_LSE], p.n[AO_LSE], fast ? fast_atol(&nv, &p, 2) : at, fast ? 0.0 : rt, &w);
                    CHECK(e <= 1.0, "huge logits %g (%s, norm %s, impl %d): lse[%zu] %.17g want %.17g", target,
                          dt ? "f32" : "f64", NORM_NAMES[norm4], impl, w, lse[w], p.x[AO_LSE][w]);
                    if (fast) naive32_free(&nv);
                }
                free(out);
                free(attn);
                free(lse);
                ao_prob_free(&p);
            }
    /* Every logit ~ -1e5 (through a bias): softmax still a proper average. */
    for (int norm4 = 0; norm4 < 4; norm4++)
        for (int dt = 0; dt < 2; dt++) {
            shape s = {1, 4, 5, 2, 2, 3, 2};
            qkv_attn_desc d;
            desc_from(&d, &s, QKV_SCORE_SCALED_DOT, norm4);
            d.bias_kind = QKV_BIAS_PER_HEAD;
            ao_prob p;
            make_prob(&p, &d, 6500u + (uint64_t)(norm4 * 2 + dt), 1.0);
            for (size_t i = 0; i < p.n[AO_BIAS]; i++) p.x[AO_BIAS][i] = -1e5 + p.x[AO_BIAS][i];
            if (dt) ao_prob_round_f32(&p);
            ao_forward(&p.d, p.x);
            double *out = dalloc(p.n[AO_O]), *lse = dalloc(p.n[AO_LSE]);
            for (int impl = 0; impl < 2; impl++) {
                CHECK_STATUS(ao_lib_forward(&p, dt ? QKV_F32 : QKV_F64, impl ? QKV_IMPL_AUTO : QKV_IMPL_REFERENCE, 1,
                                            out, NULL, lse, NULL),
                             QKV_OK);
                double at = dt ? 1e-7 : 1e-12, rt = dt ? 1e-6 : 1e-12;
                naive32 nv;
                int fast = dt && impl; /* F32 AUTO: the fast-path rule */
                if (fast) naive32_make(&nv, &p);
                size_t w;
                double e = ao_cmp(out, p.x[AO_O], p.n[AO_O], fast ? fast_atol(&nv, &p, 0) : at, fast ? 0.0 : rt, &w);
                CHECK(e <= 1.0, "logits ~ -1e5 (%s norm %s impl %d): out[%zu] %.17g want %.17g", dt ? "f32" : "f64",
                      NORM_NAMES[norm4], impl, w, out[w], p.x[AO_O][w]);
                e = ao_cmp(lse, p.x[AO_LSE], p.n[AO_LSE], fast ? fast_atol(&nv, &p, 2) : at, fast ? 0.0 : rt, &w);
                CHECK(e <= 1.0, "logits ~ -1e5 (%s norm %s impl %d): lse[%zu] %.17g want %.17g", dt ? "f32" : "f64",
                      NORM_NAMES[norm4], impl, w, lse[w], p.x[AO_LSE][w]);
                if (fast) naive32_free(&nv);
                if (norm4 == 0) {
                    double nz = 0.0;
                    for (size_t i = 0; i < p.n[AO_O]; i++) nz += fabs(out[i]);
                    CHECK(nz > 0.1, "logits ~ -1e5: softmax output collapsed to 0 (finite max sentinel?)");
                }
            }
            free(out);
            free(lse);
            ao_prob_free(&p);
        }
}

/* Bitwise identical results for threads = 1, 2, 3, 0 (default) and over
 * repeated calls, forward and backward. */
static void test_threads_deterministic(void) {
    for (int m = 0; m < AO_NUM_MASKS; m += 2)
        for (int dt = 0; dt < 2; dt++)
            for (int impl = 0; impl < 2; impl++) {
                shape s = {3, 9, 11, 4, 2, 5, 3};
                qkv_attn_desc d;
                ao_mask_store st;
                desc_from(&d, &s, m % 4, m % 3);
                ao_mask_config(&d, m, &st);
                ao_prob p;
                uint64_t seed = 7000u + (uint64_t)(m * 4 + dt * 2 + impl);
                make_prob(&p, &d, seed, 1.0);
                tu_rng r;
                tu_rng_seed(&r, seed);
                ao_bias_plant_inf(&p, &r);
                double *dout = dalloc(p.n[AO_O]);
                tu_fill_normal_f64(&r, dout, p.n[AO_O], 1.0);
                qkv_dtype dtype = dt ? QKV_F32 : QKV_F64;
                qkv_impl im = impl ? QKV_IMPL_AUTO : QKV_IMPL_REFERENCE;
                double *o[5], *a[5], *l[5];
                ao_grads g[5];
                static const int th[5] = {1, 2, 3, 0, 3};
                for (int t = 0; t < 5; t++) {
                    o[t] = dalloc(p.n[AO_O]);
                    a[t] = dalloc(p.n[AO_ATTN]);
                    l[t] = dalloc(p.n[AO_LSE]);
                    g[t].dq = dalloc(p.n[AO_Q]);
                    g[t].dk = dalloc(p.n[AO_K]);
                    g[t].dv = dalloc(p.n[AO_V]);
                    g[t].dbias = dalloc(p.n[AO_BIAS]);
                    g[t].dw1 = dalloc(p.n[AO_W1]);
                    g[t].dw2 = dalloc(p.n[AO_W2]);
                    g[t].dw = dalloc(p.n[AO_W]);
                    int guards = 0;
                    CHECK_STATUS(ao_lib_forward(&p, dtype, im, th[t], o[t], a[t], l[t], &guards), QKV_OK);
                    CHECK(guards, "threads %d: forward wrote outside a buffer", th[t]);
                    CHECK_STATUS(ao_lib_backward(&p, dtype, im, th[t], dout, t & 1, &g[t], &guards), QKV_OK);
                    CHECK(guards, "threads %d: backward wrote outside a buffer", th[t]);
                }
                for (int t = 1; t < 5; t++) {
                    int same = memcmp(o[0], o[t], p.n[AO_O] * 8) == 0 &&
                               memcmp(a[0], a[t], p.n[AO_ATTN] * 8) == 0 &&
                               memcmp(l[0], l[t], p.n[AO_LSE] * 8) == 0;
                    CHECK(same, "forward differs between threads=1 and threads=%d (mask %d %s impl %d)", th[t], m,
                          dt ? "f32" : "f64", impl);
                    same = memcmp(g[0].dq, g[t].dq, p.n[AO_Q] * 8) == 0 &&
                           memcmp(g[0].dk, g[t].dk, p.n[AO_K] * 8) == 0 &&
                           memcmp(g[0].dv, g[t].dv, p.n[AO_V] * 8) == 0 &&
                           memcmp(g[0].dbias, g[t].dbias, p.n[AO_BIAS] * 8) == 0 &&
                           memcmp(g[0].dw1, g[t].dw1, p.n[AO_W1] * 8) == 0 &&
                           memcmp(g[0].dw2, g[t].dw2, p.n[AO_W2] * 8) == 0 &&
                           memcmp(g[0].dw, g[t].dw, p.n[AO_W] * 8) == 0;
                    CHECK(same, "backward differs between threads=1 and threads=%d (mask %d %s impl %d)", th[t],
                          m, dt ? "f32" : "f64", impl);
                }
                for (int t = 0; t < 5; t++) {
                    free(o[t]);
                    free(a[t]);
                    free(l[t]);
                    free(g[t].dq);
                    free(g[t].dk);
                    free(g[t].dv);
                    free(g[t].dbias);
                    free(g[t].dw1);
                    free(g[t].dw2);
                    free(g[t].dw);
                }
                free(dout);
                ao_prob_free(&p);
            }
}

/* A window at least as wide as the sequence equals no mask; a causal window
 * that wide equals causal. */
static void test_wide_windows(void) {
    for (int si = 0; si < NSHAPES; si++) {
        qkv_attn_desc d;
        desc_from(&d, &SHAPES[si], QKV_SCORE_SCALED_DOT, 0);
        ao_prob p;
        make_prob(&p, &d, 8000u + (uint64_t)si, 1.0);
        double *o1 = dalloc(p.n[AO_O]), *o2 = dalloc(p.n[AO_O]);
        int64_t wide = SHAPES[si].nq + SHAPES[si].nk;
        for (int c = 0; c < 2; c++) {
            p.d.mask = c ? QKV_MASK_CAUSAL : QKV_MASK_NONE;
            p.d.window_left = p.d.window_right = 0;
            CHECK_STATUS(ao_lib_forward(&p, g_dt, g_impl, 1, o1, NULL, NULL, NULL), QKV_OK);
            p.d.mask = c ? QKV_MASK_CAUSAL_WINDOW : QKV_MASK_WINDOW;
            p.d.window_left = wide;
            p.d.window_right = c ? 0 : wide;
            CHECK_STATUS(ao_lib_forward(&p, g_dt, g_impl, 1, o2, NULL, NULL, NULL), QKV_OK);
            size_t w;
            CHECK(ao_cmp(o2, o1, p.n[AO_O], g_tol, g_tol, &w) <= 1.0,
                  "shape %d: a window of %lld differs from %s at %zu", si, (long long)wide,
                  c ? "causal" : "no mask", w);
            /* Huge extents (any value >= 0 is valid) must not overflow
             * position arithmetic either (p may be negative when n_q > n_k). */
            static const int64_t huge[3] = {INT64_MAX / 2, INT64_MAX - 1, INT64_MAX};
            for (int hi = 0; hi < 3; hi++) {
                p.d.window_left = huge[hi];
                p.d.window_right = c ? 0 : huge[hi];
                CHECK_STATUS(ao_lib_forward(&p, g_dt, g_impl, 1, o2, NULL, NULL, NULL), QKV_OK);
                CHECK(ao_cmp(o2, o1, p.n[AO_O], g_tol, g_tol, &w) <= 1.0,
                      "shape %d: a window of %lld differs from %s at %zu", si, (long long)huge[hi],
                      c ? "causal" : "no mask", w);
            }
        }
        free(o1);
        free(o2);
        ao_prob_free(&p);
    }
}

int main(void) {
    test_oracle_sweep();
    static const struct {
        qkv_dtype dt;
        qkv_impl impl;
    } modes[4] = {{QKV_F64, QKV_IMPL_REFERENCE}, {QKV_F32, QKV_IMPL_REFERENCE}, {QKV_F32, QKV_IMPL_AUTO},
                  {QKV_F64, QKV_IMPL_AUTO}};
    for (int m = 0; m < 4; m++) {
        long failed_before = tu_failed;
        set_mode(modes[m].dt, modes[m].impl);
        test_rows_sum_to_one();
        test_permutation();
        test_causality();
        test_fully_masked();
        test_nan_planting();
        test_nan_unseen_keys_backward();
        if (tu_failed != failed_before)
            fprintf(stderr, "(the failures above: property tests in %s, impl %s)\n", g_dt == QKV_F64 ? "F64" : "F32",
                    g_impl == QKV_IMPL_REFERENCE ? "REFERENCE" : "AUTO");
    }
    set_mode(QKV_F64, QKV_IMPL_REFERENCE);
    test_long_rows();
    test_huge_logits();
    test_threads_deterministic();
    /* Last: it probes window extents near INT64_MAX (signed overflow in the
     * position arithmetic aborts a sanitizer build). */
    for (int m = 0; m < 4; m++) {
        set_mode(modes[m].dt, modes[m].impl);
        test_wide_windows();
    }
    return tu_finish();
}
