/* Ring attention (src/dist/ring.c) against one process: run under
 * mpirun -np 1..4 (tests/CMakeLists.txt). Every rank builds the whole
 * problem from a seed, computes the single-process forward and backward
 * with qkv_attention_forward/backward, then the ring versions on its own
 * slices (qkv_dist_partition), and compares its slices: out, lse, dq, dk,
 * dv equal to float rounding. Shapes: causal and not, GQA, uneven n/p
 * (n < p too), both layouts, key lengths with a fully masked batch row.
 * Then error paths: unsupported requests and a NULL tensor on one rank give
 * an error on every rank (never a hang).
 *
 * "--bench ...": the timings of docs/DISTRIBUTED.md (see bench()).
 * "--kill-rank R": rank R kills itself (SIGKILL) in the middle of the
 * sweep; tests/dist/kill_rank.sh checks that mpirun then fails, in time. */
#define _POSIX_C_SOURCE 200809L /* getrusage */
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <sys/resource.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qkv.h"
#include "test_util.h"

static int g_rank, g_size, g_kill = -1;

typedef struct shape {
    int64_t B, n_q, n_k, H, Hkv, D, Dv;
    qkv_mask mask;
    int key_lengths; /* batch 0 sees only part of the keys, the last batch none */
    qkv_score score;
    double softcap;
    int64_t wl, wr;  /* WINDOW / CAUSAL_WINDOW sides */
    qkv_norm norm;
    int relu_div;
    int bias;        /* 0 none, 1 SHARED, 2 PER_HEAD with some -inf (masked) entries */
    int packed;      /* 0 no; else packed sequences (B = 1): the offsets of packs[packed] */
    int pos;         /* position biases: 1 ALiBi, 2 T5 buckets (bidirectional without a
                        mask), 3 both; offsets must stay global across the blocks */
    double dropout;  /* attention dropout: every entry's factor the one process's */
    int64_t additive; /* score ADDITIVE: its A (W1, W2 [H, A, D], w [H, A] random) */
} shape;

/* Packed sequences: query and key offsets (S + 1 entries each, ok NULL =
 * oq). Sequences of length 1, empty ones, a sequence with queries but no
 * keys, and sequences straddling every rank boundary for p = 1..4 (both
 * layouts). */
typedef struct pack {
    int64_t S;
    int64_t oq[32], ok[32];
    int self; /* ok = oq */
} pack;

static const pack packs[] = {
    {0, {0}, {0}, 0},
    /* n = 37: 1, 11, 0, 1, 17, 7 */
    {6, {0, 1, 12, 12, 13, 30, 37}, {0}, 1},
    /* n_q = 29, n_k = 41: (5, 9), (1, 0) no keys, (14, 21), (9, 11) */
    {4, {0, 5, 6, 20, 29}, {0, 9, 9, 30, 41}, 0},
    /* n = 24: ten sequences of length 1, then 3, 1, 10 */
    {13, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 13, 14, 24}, {0}, 1},
    /* n = 130 over tiles: 50, 1, 79 */
    {3, {0, 50, 51, 130}, {0}, 1},
};

/* Rows of one rank's slice of a [B, n, X] tensor, copied out/in. */
static void slice(float *dst, const float *src, int64_t B, int64_t n, int64_t x, const int64_t st[2],
                  const int64_t ln[2], int64_t nloc) {
    for (int64_t b = 0; b < B; b++) {
        int64_t at = 0;
        for (int t = 0; t < 2; t++) {
            memcpy(dst + (b * nloc + at) * x, src + (b * n + st[t]) * x, (size_t)(ln[t] * x) * sizeof(float));
            at += ln[t];
        }
    }
}

/* lse [B, H, n] -> [B, H, nloc] */
static void slice_lse(float *dst, const float *src, int64_t BH, int64_t n, const int64_t st[2],
                      const int64_t ln[2], int64_t nloc) {
    for (int64_t r = 0; r < BH; r++) {
        int64_t at = 0;
        for (int t = 0; t < 2; t++) {
            memcpy(dst + r * nloc + at, src + r * n + st[t], (size_t)ln[t] * sizeof(float));
            at += ln[t];
        }
    }
}

/* max over i of |a - b| / (atol + rtol |b|); inf where one is NaN or the
 * infinities differ. <= 1 passes. */
static double rel_err(const float *a, const float *b, int64_t n, double atol, double rtol) {
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isinf(a[i]) || isinf(b[i]) || isnan(a[i]) || isnan(b[i])) {
            if (!(a[i] == b[i])) return INFINITY;
            continue;
        }
        double e = fabs((double)a[i] - b[i]) / (atol + rtol * fabs((double)b[i]));
        if (e > worst) worst = e;
    }
    return worst;
}

static float *fill(tu_rng *r, int64_t n) {
    float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) x[i] = (float)(2.0 * tu_rng_uniform(r) - 1.0);
    return x;
}

static int sync_ok(int ok) { /* 1 when every rank passed */
    int all = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return all;
}

static void run_case(const shape *sh, qkv_dist_layout layout, uint64_t seed) {
    const int64_t B = sh->B, nq = sh->n_q, nk = sh->n_k, H = sh->H, Hkv = sh->Hkv, D = sh->D, Dv = sh->Dv;
    tu_rng r;
    tu_rng_seed(&r, seed);
    float *q = fill(&r, B * nq * H * D), *k = fill(&r, B * nk * Hkv * D), *v = fill(&r, B * nk * Hkv * Dv);
    float *dout = fill(&r, B * nq * H * Dv);
    int64_t kl[8];
    qkv_attn_desc d;
    qkv_attn_desc_init(&d);
    d.batch = B;
    d.n_q = nq;
    d.n_k = nk;
    d.heads = H;
    d.heads_kv = Hkv;
    d.dim = D;
    d.dim_v = Dv;
    d.mask = sh->mask;
    d.score = sh->score;
    d.softcap = sh->softcap;
    d.threads = 1;
    d.window_left = sh->wl;
    d.window_right = sh->wr;
    d.norm = sh->norm;
    d.relu_divide_by_count = sh->relu_div;
    if (sh->key_lengths) {
        for (int64_t b = 0; b < B; b++) kl[b] = b == B - 1 ? 0 : (nk * 2) / 3 + b;
        if (sh->packed) kl[0] = 6; /* packed: every sequence's keys cut to 6 */
        d.key_lengths = kl;
    }
    if (sh->packed) {
        const pack *pk = &packs[sh->packed];
        d.num_seqs = pk->S;
        d.seq_offsets_q = pk->oq;
        d.seq_offsets_k = pk->self ? NULL : pk->ok;
    }
    /* The whole bias [Hb, nq, nk] for one process; each rank passes the rows
     * of its queries for every key, [Hb, nq_loc, nk]. */
    const int64_t Hb = sh->bias == 2 ? H : 1;
    float *bias = NULL;
    if (sh->bias) {
        bias = fill(&r, Hb * nq * nk);
        if (sh->bias == 2)
            for (int64_t t = 0; t < Hb * nq * nk; t++)
                if ((t * 7) % 11 == 3) bias[t] = -INFINITY;
        d.bias_kind = sh->bias == 2 ? QKV_BIAS_PER_HEAD : QKV_BIAS_SHARED;
        d.bias = bias;
    }
    float slopes[8], rel[8 * 12];
    const int64_t nrel = sh->pos >= 2 ? H * 12 : 0;
    if (sh->pos & 1) {
        qkv_alibi_slopes(H, slopes);
        d.alibi_slopes = slopes;
    }
    if (sh->pos & 2) {
        for (int64_t t = 0; t < nrel; t++) rel[t] = (float)tu_rng_normal(&r);
        d.rel_table = rel;
        d.rel_buckets = 12;
        d.rel_max_distance = 20;
        d.rel_bidirectional = sh->mask == QKV_MASK_NONE;
    }
    if (sh->dropout > 0) {
        d.dropout = sh->dropout;
        d.dropout_seed = seed * 31 + 7;
    }
    /* the additive score's parameters and their gradients (one process: da1; the ring: da2) */
    const int64_t A = sh->additive, n_a1 = H * A * D, n_add = 2 * n_a1 + H * A;
    float *aw = NULL, *da1 = NULL, *da2 = NULL;
    if (A > 0) {
        aw = fill(&r, n_add);
        da1 = malloc((size_t)n_add * sizeof(float));
        da2 = malloc((size_t)n_add * sizeof(float));
        d.additive_dim = A;
        d.additive_w1 = aw;
        d.additive_w2 = aw + n_a1;
        d.additive_w = aw + 2 * n_a1;
    }
    float dr1[8 * 12], dr2[8 * 12];
    /* One process: the reference of this test. */
    float *o1 = malloc((size_t)(B * nq * H * Dv) * sizeof(float)), *l1 = malloc((size_t)(B * H * nq) * sizeof(float));
    float *dq1 = malloc((size_t)(B * nq * H * D) * sizeof(float)), *dk1 = malloc((size_t)(B * nk * Hkv * D) * sizeof(float));
    float *dv1 = malloc((size_t)(B * nk * Hkv * Dv) * sizeof(float));
    CHECK_STATUS(qkv_attention_forward(&d, q, k, v, o1, NULL, l1), QKV_OK);
    qkv_attn_grads g1;
    memset(&g1, 0, sizeof g1);
    g1.dq = dq1;
    g1.dk = dk1;
    g1.dv = dv1;
    float *db1 = bias ? malloc((size_t)(Hb * nq * nk) * sizeof(float)) : NULL;
    g1.dbias = db1;
    g1.d_rel_table = nrel ? dr1 : NULL;
    if (A > 0) {
        g1.d_additive_w1 = da1;
        g1.d_additive_w2 = da1 + n_a1;
        g1.d_additive_w = da1 + 2 * n_a1;
    }
    CHECK_STATUS(qkv_attention_backward(&d, q, k, v, o1, l1, dout, &g1), QKV_OK);

    /* This rank's slices. */
    int64_t qs[2], ql[2], nql, ks[2], kln[2], nkl;
    CHECK_STATUS(qkv_dist_partition(nq, g_size, g_rank, layout, qs, ql, &nql), QKV_OK);
    CHECK_STATUS(qkv_dist_partition(nk, g_size, g_rank, layout, ks, kln, &nkl), QKV_OK);
    size_t nqe = (size_t)(B * nql * H), nke = (size_t)(B * nkl * Hkv);
    float *ql_q = malloc((nqe * D + 1) * sizeof(float)), *ql_k = malloc((nke * D + 1) * sizeof(float));
    float *ql_v = malloc((nke * Dv + 1) * sizeof(float)), *ql_g = malloc((nqe * Dv + 1) * sizeof(float));
    float *o2 = malloc((nqe * Dv + 1) * sizeof(float)), *l2 = malloc((nqe + 1) * sizeof(float));
    float *dq2 = malloc((nqe * D + 1) * sizeof(float)), *dk2 = malloc((nke * D + 1) * sizeof(float));
    float *dv2 = malloc((nke * Dv + 1) * sizeof(float));
    float *want_o = malloc((nqe * Dv + 1) * sizeof(float)), *want_l = malloc((nqe + 1) * sizeof(float));
    float *want_dq = malloc((nqe * D + 1) * sizeof(float)), *want_dk = malloc((nke * D + 1) * sizeof(float));
    float *want_dv = malloc((nke * Dv + 1) * sizeof(float));
    slice(ql_q, q, B, nq, H * D, qs, ql, nql);
    slice(ql_k, k, B, nk, Hkv * D, ks, kln, nkl);
    slice(ql_v, v, B, nk, Hkv * Dv, ks, kln, nkl);
    slice(ql_g, dout, B, nq, H * Dv, qs, ql, nql);
    slice(want_o, o1, B, nq, H * Dv, qs, ql, nql);
    slice_lse(want_l, l1, B * H, nq, qs, ql, nql);
    slice(want_dq, dq1, B, nq, H * D, qs, ql, nql);
    slice(want_dk, dk1, B, nk, Hkv * D, ks, kln, nkl);
    slice(want_dv, dv1, B, nk, Hkv * Dv, ks, kln, nkl);
    float *bias_loc = NULL;
    if (bias) {
        bias_loc = malloc((size_t)(Hb * nql * nk + 1) * sizeof(float));
        slice(bias_loc, bias, Hb, nq, nk, qs, ql, nql); /* rows of each head */
        d.bias = bias_loc;
    }

    qkv_status s = qkv_ring_attention_forward(&d, layout, MPI_COMM_WORLD, ql_q, ql_k, ql_v, o2, l2);
    CHECK_STATUS(s, QKV_OK);
    double eo = rel_err(o2, want_o, (int64_t)(nqe * Dv), 1e-6, 1e-5);
    double el = rel_err(l2, want_l, (int64_t)nqe, 1e-6, 1e-6);
    /* Backward twice: with the forward's outputs, and without (recomputed). */
    s = qkv_ring_attention_backward(&d, layout, MPI_COMM_WORLD, ql_q, ql_k, ql_v, o2, l2, ql_g, dq2, dk2, dv2);
    CHECK_STATUS(s, QKV_OK);
    double eq = rel_err(dq2, want_dq, (int64_t)(nqe * D), 1e-5, 1e-4);
    double ek = rel_err(dk2, want_dk, (int64_t)(nke * D), 1e-5, 1e-4);
    double ev = rel_err(dv2, want_dv, (int64_t)(nke * Dv), 1e-5, 1e-4);
    memset(dk2, 0, (nke * D + 1) * sizeof(float));
    s = qkv_ring_attention_backward(&d, layout, MPI_COMM_WORLD, ql_q, ql_k, ql_v, NULL, NULL, ql_g, dq2, dk2, dv2);
    CHECK_STATUS(s, QKV_OK);
    double ek2 = rel_err(dk2, want_dk, (int64_t)(nke * D), 1e-5, 1e-4);
    double edb = 0, edr = 0, eda = 0;
    if (bias || nrel || A > 0) { /* through the grads form: this rank's rows of the bias gradient, the
                                    whole d_rel_table and d_additive_* on every rank */
        float *db2 = bias ? malloc((size_t)(Hb * nql * nk + 1) * sizeof(float)) : NULL;
        float *want_db = bias ? malloc((size_t)(Hb * nql * nk + 1) * sizeof(float)) : NULL;
        if (bias) slice(want_db, db1, Hb, nq, nk, qs, ql, nql);
        for (int64_t t = 0; bias && t < Hb * nql * nk; t++) db2[t] = NAN; /* all written */
        for (int64_t t = 0; t < nrel; t++) dr2[t] = NAN;
        qkv_attn_grads g2;
        memset(&g2, 0, sizeof g2);
        g2.dq = dq2;
        g2.dk = dk2;
        g2.dv = dv2;
        g2.dbias = db2;
        g2.d_rel_table = nrel ? dr2 : NULL;
        if (A > 0) {
            for (int64_t t = 0; t < n_add; t++) da2[t] = NAN; /* all written */
            g2.d_additive_w1 = da2;
            g2.d_additive_w2 = da2 + n_a1;
            g2.d_additive_w = da2 + 2 * n_a1;
        }
        s = qkv_ring_attention_backward_grads(&d, layout, MPI_COMM_WORLD, ql_q, ql_k, ql_v, o2, l2, ql_g, &g2);
        CHECK_STATUS(s, QKV_OK);
        if (bias) edb = rel_err(db2, want_db, Hb * nql * nk, 1e-5, 1e-4);
        if (nrel) edr = rel_err(dr2, dr1, nrel, 1e-5, 1e-4);
        if (A > 0) eda = rel_err(da2, da1, n_add, 1e-5, 1e-4);
        double ek3 = rel_err(dk2, want_dk, (int64_t)(nke * D), 1e-5, 1e-4);
        if (ek3 > edb) edb = ek3;
        free(db2);
        free(want_db);
    }
    int ok = eo <= 1 && el <= 1 && eq <= 1 && ek <= 1 && ev <= 1 && ek2 <= 1 && edb <= 1 && edr <= 1 && eda <= 1;
    CHECK(ok,
          "rank %d/%d %s B=%lld nq=%lld nk=%lld H=%lld Hkv=%lld D=%lld Dv=%lld mask=%d(%lld,%lld) kl=%d score=%d "
          "norm=%d/%d bias=%d packed=%d pos=%d dropout=%g additive=%lld seed=%llu: "
          "errors (1 = tolerance) out %.3g lse %.3g dq %.3g dk %.3g dv %.3g dk(recomputed) %.3g dbias %.3g "
          "d_rel_table %.3g d_additive %.3g",
          g_rank, g_size, layout == QKV_DIST_ZIGZAG ? "zigzag" : "contiguous", (long long)B, (long long)nq,
          (long long)nk, (long long)H, (long long)Hkv, (long long)D, (long long)Dv, (int)sh->mask,
          (long long)sh->wl, (long long)sh->wr, sh->key_lengths, (int)sh->score, (int)sh->norm, sh->relu_div,
          sh->bias, sh->packed, sh->pos, sh->dropout, (long long)sh->additive, (unsigned long long)seed, eo, el, eq,
          ek, ev, ek2, edb, edr, eda);
    (void)sync_ok(ok);
    free(q); free(k); free(v); free(dout); free(o1); free(l1); free(dq1); free(dk1); free(dv1);
    free(ql_q); free(ql_k); free(ql_v); free(ql_g); free(o2); free(l2); free(dq2); free(dk2); free(dv2);
    free(want_o); free(want_l); free(want_dq); free(want_dk); free(want_dv); free(bias); free(bias_loc); free(db1);
    free(aw); free(da1); free(da2);
}

static void test_partition(void) {
    int64_t st[2], ln[2], nl;
    for (int p = 1; p <= 5; p++)
        for (int layout = 0; layout < 2; layout++)
            for (int64_t n = 1; n <= 23; n++) {
                /* Every position exactly once. */
                int seen[23] = {0}, bad = 0;
                for (int r = 0; r < p; r++) {
                    if (qkv_dist_partition(n, p, r, (qkv_dist_layout)layout, st, ln, &nl) != QKV_OK) bad = 1;
                    for (int t = 0; t < 2; t++)
                        for (int64_t i = 0; i < ln[t]; i++) seen[st[t] + i]++;
                    if (nl != ln[0] + ln[1]) bad = 1;
                }
                for (int64_t i = 0; i < n; i++) bad |= seen[i] != 1;
                CHECK(!bad, "partition n=%lld p=%d layout=%d", (long long)n, p, layout);
            }
    CHECK_STATUS(qkv_dist_partition(0, 2, 0, QKV_DIST_CONTIGUOUS, st, ln, &nl), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_dist_partition(4, 2, 2, QKV_DIST_CONTIGUOUS, st, ln, &nl), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_dist_partition(4, 2, 0, (qkv_dist_layout)7, st, ln, &nl), QKV_ERR_BAD_ENUM);
    CHECK_STATUS(qkv_dist_partition(4, 2, 0, QKV_DIST_ZIGZAG, NULL, ln, &nl), QKV_ERR_NULL_POINTER);
}

/* Failures agreed by every rank, no hang. */
static void test_errors(void) {
    qkv_attn_desc d;
    qkv_attn_desc_init(&d);
    d.batch = 1;
    d.n_q = d.n_k = 8;
    d.heads = 2;
    d.dim = 4;
    d.threads = 1;
    float buf[8 * 2 * 4], out[8 * 2 * 4], dq[8 * 2 * 4], dk[8 * 2 * 4], dv[8 * 2 * 4];
    qkv_status s0;
    for (int i = 0; i < 64; i++) buf[i] = (float)(i % 7) * 0.1f;
    /* Unsupported requests, the same on every rank. */
    qkv_attn_desc u = d;
    u.dtype = QKV_F64;
    CHECK_STATUS(qkv_ring_attention_forward(&u, QKV_DIST_CONTIGUOUS, MPI_COMM_WORLD, buf, buf, buf, out, NULL),
                 QKV_ERR_UNSUPPORTED);
    /* Still unsupported: 2-D relative positions, and the additive score
     * with a position bias (docs/DISTRIBUTED.md). */
    u = d;
    u.rel_table = buf;
    u.rel_buckets = 9;
    u.rel_max_distance = 1;
    u.rel2d_width = 4;
    CHECK_STATUS(qkv_ring_attention_forward(&u, QKV_DIST_ZIGZAG, MPI_COMM_WORLD, buf, buf, buf, out, NULL),
                 QKV_ERR_UNSUPPORTED);
    u = d;
    u.score = QKV_SCORE_ADDITIVE;
    u.additive_dim = 2;
    u.additive_w1 = u.additive_w2 = u.additive_w = buf;
    u.alibi_slopes = buf;
    CHECK_STATUS(qkv_ring_attention_forward(&u, QKV_DIST_CONTIGUOUS, MPI_COMM_WORLD, buf, buf, buf, out, NULL),
                 QKV_ERR_UNSUPPORTED);
    /* Packed sequences: the core's validation, on every rank. */
    int64_t offs[3] = {0, 3, 7};
    u = d;
    u.num_seqs = 2;
    u.seq_offsets_q = offs;
    CHECK_STATUS(qkv_ring_attention_forward(&u, QKV_DIST_CONTIGUOUS, MPI_COMM_WORLD, buf, buf, buf, out, NULL),
                 QKV_ERR_SEQ_OFFSETS);
    u.batch = 2;
    offs[2] = 8;
    CHECK_STATUS(qkv_ring_attention_forward(&u, QKV_DIST_ZIGZAG, MPI_COMM_WORLD, buf, buf, buf, out, NULL),
                 QKV_ERR_SEQ_OFFSETS);
    u.batch = 1;
    u.dropout = 1.5; /* the core's validation of the dropout probability */
    CHECK_STATUS(qkv_ring_attention_forward(&u, QKV_DIST_ZIGZAG, MPI_COMM_WORLD, buf, buf, buf, out, NULL),
                 QKV_ERR_BAD_PARAMETER);
    u = d;
    u.score = QKV_SCORE_ADDITIVE;
    u.additive_dim = 0; /* the core's validation of the additive score */
    u.additive_w1 = u.additive_w2 = u.additive_w = buf;
    CHECK_STATUS(qkv_ring_attention_forward(&u, QKV_DIST_CONTIGUOUS, MPI_COMM_WORLD, buf, buf, buf, out, NULL),
                 QKV_ERR_BAD_SIZE);
    /* A bad window is the core's error, on every rank. */
    u = d;
    u.mask = QKV_MASK_CAUSAL_WINDOW;
    u.window_left = 2;
    u.window_right = 1;
    CHECK_STATUS(qkv_ring_attention_forward(&u, QKV_DIST_ZIGZAG, MPI_COMM_WORLD, buf, buf, buf, out, NULL),
                 QKV_ERR_WINDOW);
    u = d;
    u.bias_kind = (qkv_bias_kind)5;
    CHECK_STATUS(qkv_ring_attention_forward(&u, QKV_DIST_ZIGZAG, MPI_COMM_WORLD, buf, buf, buf, out, NULL),
                 QKV_ERR_BAD_ENUM);
    CHECK_STATUS(qkv_ring_attention_backward_grads(&d, QKV_DIST_ZIGZAG, MPI_COMM_WORLD, buf, buf, buf, NULL, NULL,
                                                   buf, NULL),
                 QKV_ERR_NULL_POINTER);
    /* A bias missing on one rank that holds queries: every rank fails. */
    u = d;
    u.bias_kind = QKV_BIAS_SHARED;
    u.bias = g_rank == 0 ? NULL : buf;
    s0 = qkv_ring_attention_forward(&u, QKV_DIST_CONTIGUOUS, MPI_COMM_WORLD, buf, buf, buf, out, NULL);
    CHECK(s0 == QKV_ERR_NULL_POINTER, "NULL bias on rank 0: rank %d got %d (%s)", g_rank, (int)s0,
          qkv_status_string(s0));
    u = d;
    u.impl = QKV_IMPL_REFERENCE;
    CHECK_STATUS(qkv_ring_attention_backward(&u, QKV_DIST_ZIGZAG, MPI_COMM_WORLD, buf, buf, buf, NULL, NULL, buf,
                                             dq, dk, dv),
                 QKV_ERR_UNSUPPORTED);
    u = d;
    u.heads_kv = 3;
    CHECK_STATUS(qkv_ring_attention_forward(&u, QKV_DIST_CONTIGUOUS, MPI_COMM_WORLD, buf, buf, buf, out, NULL),
                 QKV_ERR_HEADS);
    CHECK_STATUS(qkv_ring_attention_forward(NULL, QKV_DIST_CONTIGUOUS, MPI_COMM_WORLD, buf, buf, buf, out, NULL),
                 QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_ring_attention_forward(&d, (qkv_dist_layout)9, MPI_COMM_WORLD, buf, buf, buf, out, NULL),
                 QKV_ERR_BAD_ENUM);
    CHECK_STATUS(qkv_ring_attention_forward(&d, QKV_DIST_CONTIGUOUS, MPI_COMM_NULL, buf, buf, buf, out, NULL),
                 QKV_ERR_NULL_POINTER);
    /* The last rank passes no queries: everyone fails, nobody waits. */
    const float *qq = g_rank == g_size - 1 ? NULL : buf;
    qkv_status s = qkv_ring_attention_forward(&d, QKV_DIST_CONTIGUOUS, MPI_COMM_WORLD, qq, buf, buf, out, NULL);
    CHECK(s == QKV_ERR_NULL_POINTER, "NULL q on the last rank: rank %d got %d (%s)", g_rank, (int)s,
          qkv_status_string(s));
    s = qkv_ring_attention_backward(&d, QKV_DIST_ZIGZAG, MPI_COMM_WORLD, buf, buf, buf, NULL, NULL, buf, dq,
                                    g_rank == 0 ? NULL : dk, dv);
    CHECK(s == QKV_ERR_NULL_POINTER, "NULL dk on rank 0: rank %d got %d (%s)", g_rank, (int)s,
          qkv_status_string(s));
    /* A NaN in one rank's keys: that rank's check_finite fails inside the
     * ring; every rank returns the error. */
    float bad[64];
    memcpy(bad, buf, sizeof bad);
    if (g_rank == 0) bad[3] = NAN;
    u = d;
    u.check_finite = 1;
    s = qkv_ring_attention_forward(&u, QKV_DIST_CONTIGUOUS, MPI_COMM_WORLD, buf, bad, buf, out, NULL);
    CHECK(s == QKV_ERR_NOT_FINITE, "NaN key on rank 0 with check_finite: rank %d got %d (%s)", g_rank, (int)s,
          qkv_status_string(s));
    /* The library left no memory behind. */
    CHECK(qkv_memory_in_use() == 0, "%zu bytes still held", qkv_memory_in_use());
}

/* Data parallelism: qkv_model_bcast_params makes every rank's parameters
 * rank 0's; qkv_model_allreduce_grads gives every rank sum_r w_r grad_r,
 * also with buckets smaller than a segment (many reductions in flight). */
static void test_data_parallel(void) {
    qkv_model_config cfg;
    qkv_model_config_init(&cfg, 16, 8);
    cfg.dim = 16;
    cfg.heads = 2;
    cfg.layers = 1;
    cfg.threads = 1;
    qkv_model *m = NULL, *m0 = NULL;
    CHECK_STATUS(qkv_model_create(&cfg, 100 + (uint64_t)g_rank, &m), QKV_OK);
    CHECK_STATUS(qkv_model_create(&cfg, 100, &m0), QKV_OK);
    if (!m || !m0) return;
    CHECK_STATUS(qkv_model_bcast_params(m, 0, MPI_COMM_WORLD), QKV_OK);
    int64_t nseg = qkv_model_segment_count(m), diff = 0, total = 0;
    for (int64_t i = 0; i < nseg; i++) {
        const char *name;
        float *p, *g, *p0, *g0;
        int64_t n, n0;
        qkv_model_segment(m, i, &name, &p, &g, &n);
        qkv_model_segment(m0, i, &name, &p0, &g0, &n0);
        for (int64_t j = 0; j < n; j++) diff += p[j] != p0[j];
        for (int64_t j = 0; j < n; j++) g[j] = (float)((g_rank + 1) * ((total + j) % 7 + 1));
        total += n;
    }
    CHECK(diff == 0, "rank %d: %lld parameters differ from rank 0's after the broadcast", g_rank, (long long)diff);
    /* weights w_r = (r + 1) / S, S = p (p + 1) / 2: sum_r w_r (r + 1) c = c sum (r+1)^2 / S */
    double S = g_size * (g_size + 1) / 2.0, want_f = 0;
    for (int r = 0; r < g_size; r++) want_f += (double)(r + 1) * (r + 1) / S;
    size_t buckets[2] = {0, 1000};
    for (int t = 0; t < 2; t++) {
        if (t == 1) { /* again from the same values, with 1000-byte buckets */
            int64_t at = 0;
            for (int64_t i = 0; i < nseg; i++) {
                const char *name;
                float *p, *g;
                int64_t n;
                qkv_model_segment(m, i, &name, &p, &g, &n);
                for (int64_t j = 0; j < n; j++) g[j] = (float)((g_rank + 1) * ((at + j) % 7 + 1));
                at += n;
            }
        }
        CHECK_STATUS(qkv_model_allreduce_grads(m, (g_rank + 1) / S, buckets[t], MPI_COMM_WORLD), QKV_OK);
        double worst = 0;
        int64_t at = 0;
        for (int64_t i = 0; i < nseg; i++) {
            const char *name;
            float *p, *g;
            int64_t n;
            qkv_model_segment(m, i, &name, &p, &g, &n);
            for (int64_t j = 0; j < n; j++) {
                double w = want_f * (double)((at + j) % 7 + 1), e = fabs(g[j] - w) / w;
                if (e > worst) worst = e;
            }
            at += n;
        }
        CHECK(worst < 1e-6, "rank %d: allreduce (bucket %zu bytes): relative error %.3g", g_rank, buckets[t], worst);
    }
    CHECK_STATUS(qkv_model_allreduce_grads(m, -1.0, 0, MPI_COMM_WORLD), QKV_ERR_BAD_PARAMETER);
    CHECK_STATUS(qkv_model_allreduce_grads(NULL, 1.0, 0, MPI_COMM_WORLD), QKV_ERR_NULL_POINTER);
    qkv_model_free(m);
    qkv_model_free(m0);
}

/* The model's gradient hook: every segment reported exactly once per
 * backward, the final norm first, then the blocks from the last to the
 * first, the embedding last; a failing hook stops the backward. */
typedef struct hook_log {
    int64_t order[128], n, fail_at;
} hook_log;

static qkv_status log_hook(void *user, const int64_t *segs, int64_t count) {
    hook_log *h = user;
    for (int64_t i = 0; i < count && h->n < 128; i++) h->order[h->n++] = segs[i];
    return h->fail_at >= 0 && h->n > h->fail_at ? QKV_ERR_IO : QKV_OK;
}

static void make_tokens(int32_t *tok, int32_t *tgt, int64_t B, int64_t n, int64_t V, uint64_t seed) {
    tu_rng r;
    tu_rng_seed(&r, seed);
    for (int64_t i = 0; i < B * n; i++) tok[i] = (int32_t)(tu_rng_uniform(&r) * (double)V) % (int32_t)V;
    for (int64_t i = 0; i < B * n; i++) tgt[i] = (i % n) + 1 < n ? tok[i + 1] : -1;
}

static void test_grad_hook(void) {
    qkv_model_config cfg;
    qkv_model_config_init(&cfg, 16, 8);
    cfg.dim = 16;
    cfg.heads = 2;
    cfg.layers = 3;
    cfg.threads = 1;
    cfg.tie_embeddings = 0;
    cfg.pos = QKV_POSENC_LEARNED;
    qkv_model *m = NULL;
    CHECK_STATUS(qkv_model_create(&cfg, 7, &m), QKV_OK);
    if (!m) return;
    int32_t tok[16], tgt[16];
    make_tokens(tok, tgt, 2, 8, 16, 3);
    hook_log h;
    memset(&h, 0, sizeof h);
    h.fail_at = -1;
    CHECK_STATUS(qkv_model_set_grad_hook(NULL, log_hook, &h), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_model_set_grad_hook(m, log_hook, &h), QKV_OK);
    double loss;
    CHECK_STATUS(qkv_model_forward(m, 2, 8, tok, tgt, 1, NULL, &loss), QKV_OK);
    CHECK_STATUS(qkv_model_backward(m), QKV_OK);
    int64_t nseg = qkv_model_segment_count(m);
    int seen[128] = {0}, bad = 0;
    for (int64_t i = 0; i < h.n; i++) seen[h.order[i]]++;
    for (int64_t i = 0; i < nseg; i++) bad += seen[i] != 1;
    CHECK(h.n == nseg && bad == 0, "hook: %lld reports for %lld segments, %d not reported exactly once",
          (long long)h.n, (long long)nseg, bad);
    const char *first, *last, *mid;
    qkv_model_segment(m, h.order[0], &first, NULL, NULL, NULL);
    qkv_model_segment(m, h.order[h.n - 1], &last, NULL, NULL, NULL);
    qkv_model_segment(m, h.order[3], &mid, NULL, NULL, NULL); /* after ln_f (2) and the head: block 2 */
    CHECK(strcmp(first, "ln_f.weight") == 0 && strncmp(mid, "layers.2.", 9) == 0 && strcmp(last, "pos_emb.weight") == 0,
          "hook order: first %s, fourth %s, last %s", first, mid, last);
    /* A failing hook stops the backward with its status. */
    memset(&h, 0, sizeof h);
    h.fail_at = 5;
    CHECK_STATUS(qkv_model_forward(m, 2, 8, tok, tgt, 1, NULL, &loss), QKV_OK);
    CHECK_STATUS(qkv_model_backward(m), QKV_ERR_IO);
    CHECK_STATUS(qkv_model_set_grad_hook(m, NULL, NULL), QKV_OK);
    qkv_model_free(m);
}

/* The reducer overlapped with the backward gives the gradients of
 * qkv_model_allreduce_grads (each rank its own tokens), with one bucket and
 * with many small ones started during the backward; the same numbers bit for
 * bit when repeated; a failure on one rank is every rank's error, and the
 * reducer works again afterwards. */
static void test_reducer(void) {
    qkv_model_config cfg;
    qkv_model_config_init(&cfg, 16, 8);
    cfg.dim = 16;
    cfg.heads = 2;
    cfg.layers = 2;
    cfg.threads = 1;
    qkv_model *m = NULL;
    CHECK_STATUS(qkv_model_create(&cfg, 11, &m), QKV_OK);
    if (!m) return;
    int32_t tok[24], tgt[24];
    make_tokens(tok, tgt, 3, 8, 16, 50 + (uint64_t)g_rank);
    int64_t total = qkv_model_param_count(m), nseg = qkv_model_segment_count(m);
    float *want = malloc((size_t)total * sizeof(float)), *first = malloc((size_t)total * sizeof(float));
    double w = 1.0 / g_size, loss;
    /* The reference: backward, then qkv_model_allreduce_grads. */
    qkv_model_zero_grad(m);
    CHECK_STATUS(qkv_model_forward(m, 3, 8, tok, tgt, 1, NULL, &loss), QKV_OK);
    CHECK_STATUS(qkv_model_backward(m), QKV_OK);
    CHECK_STATUS(qkv_model_allreduce_grads(m, w, 0, MPI_COMM_WORLD), QKV_OK);
    for (int64_t i = 0, at = 0; i < nseg; i++) {
        float *g;
        int64_t n;
        qkv_model_segment(m, i, NULL, NULL, &g, &n);
        memcpy(want + at, g, (size_t)n * sizeof(float));
        at += n;
    }
    size_t buckets[2] = {0, 1000};
    for (int t = 0; t < 2; t++) {
        qkv_dp_reducer *red = NULL;
        CHECK_STATUS(qkv_dp_reducer_create(m, buckets[t], MPI_COMM_WORLD, &red), QKV_OK);
        if (!red) continue;
        for (int rep = 0; rep < 2; rep++) {
            qkv_model_zero_grad(m);
            CHECK_STATUS(qkv_dp_reducer_begin(red, w), QKV_OK);
            CHECK_STATUS(qkv_dp_reducer_begin(red, w), QKV_ERR_UNSUPPORTED);
            qkv_status s = qkv_model_forward(m, 3, 8, tok, tgt, 1, NULL, &loss);
            if (s == QKV_OK) s = qkv_model_backward(m);
            CHECK_STATUS(qkv_dp_reducer_finish(red, s), QKV_OK);
            double worst = 0;
            int64_t same = 0;
            for (int64_t i = 0, at = 0; i < nseg; i++) {
                float *g;
                int64_t n;
                qkv_model_segment(m, i, NULL, NULL, &g, &n);
                for (int64_t j = 0; j < n; j++) {
                    double e = fabs((double)g[j] - want[at + j]) / (1e-7 + fabs((double)want[at + j]));
                    if (e > worst) worst = e;
                    if (rep == 0) first[at + j] = g[j];
                    else same += memcmp(&first[at + j], &g[j], sizeof(float)) == 0;
                }
                at += n;
            }
            CHECK(worst < 1e-5, "rank %d: reducer (bucket %zu bytes) against allreduce: relative error %.3g", g_rank,
                  buckets[t], worst);
            if (rep == 1)
                CHECK(same == total, "rank %d: reducer repeated: %lld of %lld gradients differ", g_rank,
                      (long long)(total - same), (long long)total);
        }
        /* Rank 0's backward failed: every rank returns an error, nobody waits. */
        CHECK_STATUS(qkv_dp_reducer_begin(red, w), QKV_OK);
        qkv_status mine = g_rank == 0 ? QKV_ERR_OUT_OF_MEMORY : QKV_OK;
        qkv_status s = qkv_dp_reducer_finish(red, mine);
        CHECK(s == QKV_ERR_OUT_OF_MEMORY, "reducer, failure on rank 0: rank %d got %d (%s)", g_rank, (int)s,
              qkv_status_string(s));
        /* finish without begin: an error on every rank, no hang. */
        s = qkv_dp_reducer_finish(red, QKV_OK);
        CHECK(s == QKV_ERR_UNSUPPORTED, "reducer, finish without begin: rank %d got %d", g_rank, (int)s);
        CHECK_STATUS(qkv_dp_reducer_begin(red, -1.0), QKV_ERR_BAD_PARAMETER);
        qkv_dp_reducer_free(red);
    }
    CHECK_STATUS(qkv_dp_reducer_create(NULL, 0, MPI_COMM_WORLD, NULL), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_dp_reducer_begin(NULL, 1.0), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_dp_reducer_finish(NULL, QKV_OK), QKV_ERR_NULL_POINTER);
    qkv_dp_reducer_free(NULL);
    free(want);
    free(first);
    qkv_model_free(m);
    CHECK(qkv_memory_in_use() == 0, "%zu bytes still held after the reducer tests", qkv_memory_in_use());
}

/* --bench N H D CAUSAL LAYOUT REPS (under mpirun): time and memory per rank
 * of the ring forward and backward on a sequence of N positions (B = 1,
 * H heads, head dim D, GQA off), for docs/DISTRIBUTED.md. Each rank makes
 * only its own slices. Memory: the library's peak bytes (through an
 * allocator hook) plus the caller's local tensors, and the process's
 * maximum resident set (which includes MPI's own). */
static _Atomic size_t g_live, g_peak;

static void *bench_alloc(size_t n, void *user) {
    (void)user;
    size_t *p = malloc(n + sizeof(max_align_t));
    if (!p) return NULL;
    *p = n;
    size_t live = atomic_fetch_add(&g_live, n) + n, peak = atomic_load(&g_peak);
    while (live > peak && !atomic_compare_exchange_weak(&g_peak, &peak, live)) {
    }
    return (char *)p + sizeof(max_align_t);
}

static void bench_free(void *ptr, void *user) {
    (void)user;
    if (!ptr) return;
    size_t *p = (size_t *)(void *)((char *)ptr - sizeof(max_align_t));
    atomic_fetch_sub(&g_live, *p);
    free(p);
}

static int bench(char **argv) {
    int64_t n = atoll(argv[0]), H = atoll(argv[1]), D = atoll(argv[2]);
    /* CAUSAL: 0 full, 1 causal, wN a causal window of N keys, pL causal
     * over packed sequences of L tokens (the last one shorter) */
    int causal = argv[3][0] == 'w' || argv[3][0] == 'p' ? 1 : atoi(argv[3]), reps = atoi(argv[5]);
    int64_t window = argv[3][0] == 'w' ? atoll(argv[3] + 1) : -1, packlen = argv[3][0] == 'p' ? atoll(argv[3] + 1) : 0;
    qkv_dist_layout layout = (qkv_dist_layout)atoi(argv[4]);
    qkv_set_allocator(bench_alloc, bench_free, NULL);
    qkv_attn_desc d;
    qkv_attn_desc_init(&d);
    d.batch = 1;
    d.n_q = d.n_k = n;
    d.heads = H;
    d.dim = D;
    d.threads = 1;
    d.mask = causal ? QKV_MASK_CAUSAL : QKV_MASK_NONE;
    if (window >= 0) {
        d.mask = QKV_MASK_CAUSAL_WINDOW;
        d.window_left = window;
    }
    int64_t *offs = NULL;
    if (packlen > 0) {
        d.num_seqs = (n + packlen - 1) / packlen;
        offs = malloc((size_t)(d.num_seqs + 1) * sizeof(int64_t));
        for (int64_t t = 0; t <= d.num_seqs; t++) offs[t] = t * packlen < n ? t * packlen : n;
        d.seq_offsets_q = offs;
    }
    int64_t st[2], ln[2], nl;
    qkv_dist_partition(n, g_size, g_rank, layout, st, ln, &nl);
    size_t e = (size_t)(nl * H * D) + 1;
    tu_rng r;
    tu_rng_seed(&r, 1 + (uint64_t)g_rank);
    float *q = fill(&r, (int64_t)e), *k = fill(&r, (int64_t)e), *v = fill(&r, (int64_t)e), *g = fill(&r, (int64_t)e);
    float *o = malloc(e * sizeof(float)), *l = malloc((size_t)(nl * H + 1) * sizeof(float));
    float *dq = malloc(e * sizeof(float)), *dk = malloc(e * sizeof(float)), *dv = malloc(e * sizeof(float));
    double tf = 1e30, tb = 1e30;
    for (int it = 0; it <= reps; it++) { /* the first is a warm-up */
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        qkv_status s1 = qkv_ring_attention_forward(&d, layout, MPI_COMM_WORLD, q, k, v, o, l);
        double t1 = MPI_Wtime(), f = t1 - t0, fmax = 0;
        MPI_Barrier(MPI_COMM_WORLD);
        t1 = MPI_Wtime();
        qkv_status s2 = qkv_ring_attention_backward(&d, layout, MPI_COMM_WORLD, q, k, v, o, l, g, dq, dk, dv);
        double b = MPI_Wtime() - t1, bmax = 0;
        if (s1 != QKV_OK || s2 != QKV_OK) {
            fprintf(stderr, "bench: %s / %s\n", qkv_status_string(s1), qkv_status_string(s2));
            return 1;
        }
        MPI_Allreduce(&f, &fmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        MPI_Allreduce(&b, &bmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (it > 0 && fmax < tf) tf = fmax;
        if (it > 0 && bmax < tb) tb = bmax;
    }
    /* The same computation without the ring (full attention only): p
     * blocks of this rank's queries against its own keys, one after the
     * other, plus nothing else: what the ring would cost if its transfers
     * and merges were free. */
    double tl = 0;
    if (!causal) {
        qkv_attn_desc bd = d;
        bd.n_q = bd.n_k = nl;
        tl = 1e30;
        for (int it = 0; it <= reps; it++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            for (int b = 0; b < g_size; b++) (void)qkv_attention_forward(&bd, q, k, v, o, NULL, l);
            double t = MPI_Wtime() - t0, tmax = 0;
            MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            if (it > 0 && tmax < tl) tl = tmax;
        }
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double lib = (double)atomic_load(&g_peak) / 1048576.0, lib_max = 0;
    double caller = (double)(8 * e + (size_t)(nl * H)) * sizeof(float) / 1048576.0, caller_max = 0;
    double rss = (double)ru.ru_maxrss / 1024.0, rss_max = 0;
    MPI_Reduce(&lib, &lib_max, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Reduce(&caller, &caller_max, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Reduce(&rss, &rss_max, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    char lbuf[32], mbuf[64];
    snprintf(mbuf, sizeof mbuf, "%s%s", window >= 0 ? "causal window " : (causal ? "causal" : "full"),
             !causal ? "" : (layout == QKV_DIST_ZIGZAG ? " zig-zag" : " contiguous"));
    if (window >= 0) snprintf(mbuf, sizeof mbuf, "causal window %lld %s", (long long)window,
                              layout == QKV_DIST_ZIGZAG ? "zig-zag" : "contiguous");
    if (packlen > 0) snprintf(mbuf, sizeof mbuf, "causal packed %lld %s", (long long)packlen,
                              layout == QKV_DIST_ZIGZAG ? "zig-zag" : "contiguous");
    if (g_rank == 0)
        printf("| %d | %lld | %lld | %s | %.3f | %.3f | %.1f | %.1f | %.0f | %s |\n", g_size, (long long)n,
               (long long)(n / g_size), mbuf,
               tf, tb, lib_max, caller_max, rss_max, tl > 0 ? (snprintf(lbuf, sizeof lbuf, "%.3f", tl), lbuf) : "-");
    free(q); free(k); free(v); free(g); free(o); free(l); free(dq); free(dk); free(dv); free(offs);
    return 0;
}

/* --bench-dp E L B N REPS: one data-parallel training step (forward,
 * backward, gradient sum) of a causal model of width E, L blocks, each rank
 * B sequences of N tokens: with the gradients summed after the backward
 * (qkv_model_allreduce_grads, 1 MiB buckets) and overlapped with it
 * (qkv_dp_reducer, 1 MiB buckets). Best of REPS, slowest rank. */
static int bench_dp(char **argv) {
    int64_t E = atoll(argv[0]), L = atoll(argv[1]), B = atoll(argv[2]), N = atoll(argv[3]);
    int reps = atoi(argv[4]);
    qkv_model_config cfg;
    qkv_model_config_init(&cfg, 64, N);
    cfg.dim = E;
    cfg.heads = E / 64 > 0 ? E / 64 : 1;
    cfg.layers = L;
    cfg.threads = 1;
    qkv_model *m = NULL;
    if (qkv_model_create(&cfg, 1, &m) != QKV_OK) return 1;
    int32_t *tok = malloc((size_t)(B * N) * sizeof(int32_t)), *tgt = malloc((size_t)(B * N) * sizeof(int32_t));
    make_tokens(tok, tgt, B, N, 64, 9 + (uint64_t)g_rank);
    qkv_dp_reducer *red = NULL;
    if (qkv_dp_reducer_create(m, 1 << 20, MPI_COMM_WORLD, &red) != QKV_OK) return 1;
    qkv_model_set_grad_hook(m, NULL, NULL); /* armed only for the overlapped runs */
    double best[2] = {1e30, 1e30}, comp = 1e30;
    for (int it = 0; it <= reps; it++)
        for (int mode = 0; mode < 3; mode++) {
            double loss, w = 1.0 / g_size;
            qkv_model_zero_grad(m);
            if (mode == 1) {
                qkv_model_set_grad_hook(m, NULL, NULL);
                qkv_dp_reducer_free(red);
                if (qkv_dp_reducer_create(m, 1 << 20, MPI_COMM_WORLD, &red) != QKV_OK) return 1;
                qkv_dp_reducer_begin(red, w);
            }
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            qkv_status s = qkv_model_forward(m, B, N, tok, tgt, 1, NULL, &loss);
            if (s == QKV_OK) s = qkv_model_backward(m);
            if (mode == 0 && s == QKV_OK) s = qkv_model_allreduce_grads(m, w, 1 << 20, MPI_COMM_WORLD);
            if (mode == 1) s = qkv_dp_reducer_finish(red, s);
            double t = MPI_Wtime() - t0, tmax = 0;
            if (mode == 1) qkv_model_set_grad_hook(m, NULL, NULL);
            if (s != QKV_OK) return 1;
            MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            if (it > 0 && mode < 2 && tmax < best[mode]) best[mode] = tmax;
            if (it > 0 && mode == 2 && tmax < comp) comp = tmax; /* no gradient sum at all */
        }
    if (g_rank == 0)
        printf("| %d | %lld | %lld | %lld x %lld | %lld | %.3f | %.3f | %.3f |\n", g_size, (long long)E, (long long)L,
               (long long)B, (long long)N, (long long)qkv_model_param_count(m), comp, best[0], best[1]);
    qkv_dp_reducer_free(red);
    qkv_model_free(m);
    free(tok);
    free(tgt);
    return 0;
}

/* Helpers for tests/dist/attend_dist.sh (no MPI): write random q, k, v and
 * dout .npy files, and compare two .npy files. */
static int write_npy(const char *dir) {
    /* q, k, v, dout of B = 2; a shared bias [n, n] and a per-head one
     * [H, n, n] with -inf entries; B = 1 (3-D) copies for packed sequences
     * and their offsets so.npy (lengths 1, 11, 1, 17, 1, 14). */
    static const struct { const char *name; int ndim; int64_t shape[4]; } arr[] = {
        {"q", 4, {2, 45, 4, 16}}, {"k", 4, {2, 45, 2, 16}}, {"v", 4, {2, 45, 2, 8}}, {"dout", 4, {2, 45, 4, 8}},
        {"bias", 2, {45, 45, 1, 1}}, {"biash", 3, {4, 45, 45, 1}}, {"q1", 3, {45, 4, 16}}, {"k1", 3, {45, 2, 16}},
        {"v1", 3, {45, 2, 8}}, {"dout1", 3, {45, 4, 8}}};
    tu_rng r;
    tu_rng_seed(&r, 77);
    for (size_t i = 0; i < sizeof arr / sizeof arr[0]; i++) {
        qkv_array a;
        char path[1024];
        if (qkv_array_alloc(&a, QKV_F32, arr[i].ndim, arr[i].shape) != QKV_OK) return 1;
        float *x = a.data;
        int64_t n = 1;
        for (int t = 0; t < arr[i].ndim; t++) n *= arr[i].shape[t];
        for (int64_t j = 0; j < n; j++) x[j] = (float)(2.0 * tu_rng_uniform(&r) - 1.0);
        if (strcmp(arr[i].name, "biash") == 0)
            for (int64_t j = 0; j < n; j++)
                if ((j * 7) % 11 == 3) x[j] = -INFINITY;
        snprintf(path, sizeof path, "%s/%s.npy", dir, arr[i].name);
        qkv_status s = qkv_npy_save(path, &a);
        qkv_array_free(&a);
        if (s != QKV_OK) return 1;
    }
    static const int64_t offs[7] = {0, 1, 12, 13, 30, 31, 45};
    int64_t sh = 7;
    qkv_array a;
    char path[1024];
    if (qkv_array_alloc(&a, QKV_I64, 1, &sh) != QKV_OK) return 1;
    memcpy(a.data, offs, sizeof offs);
    snprintf(path, sizeof path, "%s/so.npy", dir);
    qkv_status s = qkv_npy_save(path, &a);
    qkv_array_free(&a);
    return s != QKV_OK;
}

static int compare_npy(const char *a_path, const char *b_path, double tol) {
    qkv_array a, b;
    char why[256];
    if (qkv_npy_load(a_path, &a, why, sizeof why) != QKV_OK || qkv_npy_load(b_path, &b, why, sizeof why) != QKV_OK) {
        fprintf(stderr, "compare: cannot load: %s\n", why);
        return 1;
    }
    int same = a.dtype == QKV_F32 && b.dtype == QKV_F32 && a.ndim == b.ndim;
    int64_t n = 1;
    for (int i = 0; same && i < a.ndim; i++) {
        same = a.shape[i] == b.shape[i];
        n *= a.shape[i];
    }
    double e = same ? rel_err(a.data, b.data, n, tol, tol) : INFINITY;
    printf("compare %s %s: %s, error %.3g of the tolerance %g\n", a_path, b_path, same ? "same shape" : "SHAPES DIFFER",
           e, tol);
    qkv_array_free(&a);
    qkv_array_free(&b);
    return same && e <= 1 ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--write-npy") == 0) return write_npy(argv[2]);
    if (argc == 5 && strcmp(argv[1], "--compare") == 0) return compare_npy(argv[2], argv[3], atof(argv[4]));
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "--kill-rank") == 0) g_kill = atoi(argv[i + 1]);
    if (argc == 7 && strcmp(argv[1], "--bench-dp") == 0) {
        int rc = bench_dp(argv + 2);
        MPI_Finalize();
        return rc;
    }
    if (argc == 8 && strcmp(argv[1], "--bench") == 0) {
        int rc = bench(argv + 2);
        MPI_Finalize();
        return rc;
    }

    test_partition();
    static const shape shapes[] = {
        /* B  nq  nk  H Hkv D  Dv  mask  kl score  softcap  wl wr  norm relu_div  bias packed pos dropout additive */
        {1, 8, 8, 1, 1, 4, 4, QKV_MASK_NONE, 0, QKV_SCORE_SCALED_DOT, 0, 0, 0, QKV_NORM_SOFTMAX, 0, 0, 0, 0, 0, 0},
        {1, 8, 8, 1, 1, 4, 4, QKV_MASK_CAUSAL, 0, QKV_SCORE_SCALED_DOT, 0, 0, 0, QKV_NORM_SOFTMAX, 0, 0, 0, 0, 0, 0},
        {2, 37, 37, 4, 2, 16, 8, QKV_MASK_CAUSAL, 0, QKV_SCORE_SCALED_DOT, 0, 0, 0, QKV_NORM_SOFTMAX, 0, 0, 0, 0, 0, 0},    /* GQA, uneven */
        {2, 37, 37, 4, 2, 16, 8, QKV_MASK_NONE, 0, QKV_SCORE_SCALED_DOT, 0, 0, 0, QKV_NORM_SOFTMAX, 0, 0, 0, 0, 0, 0},
        {1, 130, 130, 2, 1, 32, 32, QKV_MASK_CAUSAL, 0, QKV_SCORE_SCALED_DOT, 0, 0, 0, QKV_NORM_SOFTMAX, 0, 0, 0, 0, 0, 0}, /* MQA, > one tile */
        {3, 29, 29, 2, 2, 8, 8, QKV_MASK_CAUSAL, 1, QKV_SCORE_SCALED_DOT, 0, 0, 0, QKV_NORM_SOFTMAX, 0, 0, 0, 0, 0, 0},     /* key lengths, a dead row */
        {2, 19, 31, 3, 1, 8, 5, QKV_MASK_NONE, 1, QKV_SCORE_DOT, 0, 0, 0, QKV_NORM_SOFTMAX, 0, 0, 0, 0, 0, 0},              /* n_q != n_k */
        {1, 3, 3, 2, 2, 8, 8, QKV_MASK_CAUSAL, 0, QKV_SCORE_SCALED_DOT, 0, 0, 0, QKV_NORM_SOFTMAX, 0, 0, 0, 0, 0, 0},       /* n < 2p: empty pieces */
        {1, 24, 24, 2, 2, 8, 8, QKV_MASK_CAUSAL, 0, QKV_SCORE_COSINE, 5.0, 0, 0, QKV_NORM_SOFTMAX, 0, 0, 0, 0, 0, 0},       /* cosine, softcap */
        /* masks, normalisers and biases beyond plain causal: the same as one process */
        {2, 37, 37, 4, 2, 16, 8, QKV_MASK_WINDOW, 0, QKV_SCORE_SCALED_DOT, 0, 3, 2, QKV_NORM_SOFTMAX, 0, 0, 0, 0, 0, 0},
        {1, 130, 130, 2, 1, 32, 32, QKV_MASK_CAUSAL_WINDOW, 0, QKV_SCORE_SCALED_DOT, 0, 20, 0, QKV_NORM_SOFTMAX, 0, 0, 0, 0, 0, 0},
        {3, 29, 29, 2, 2, 8, 8, QKV_MASK_WINDOW, 1, QKV_SCORE_SCALED_DOT, 0, 0, 6, QKV_NORM_SOFTMAX, 0, 0, 0, 0, 0, 0},
        {2, 19, 31, 3, 1, 8, 5, QKV_MASK_CAUSAL, 1, QKV_SCORE_SCALED_DOT, 0, 0, 0, QKV_NORM_SOFTMAX, 0, 0, 0, 0, 0, 0},
        {2, 31, 19, 2, 2, 8, 8, QKV_MASK_CAUSAL, 0, QKV_SCORE_SCALED_DOT, 0, 0, 0, QKV_NORM_SOFTMAX, 0, 0, 0, 0, 0, 0},
        {1, 23, 41, 2, 1, 8, 8, QKV_MASK_CAUSAL_WINDOW, 0, QKV_SCORE_SCALED_DOT, 0, 4, 0, QKV_NORM_SOFTMAX, 0, 0, 0, 0, 0, 0},
        {1, 41, 23, 2, 2, 8, 8, QKV_MASK_WINDOW, 0, QKV_SCORE_SCALED_DOT, 0, 2, 5, QKV_NORM_SOFTMAX, 0, 0, 0, 0, 0, 0},
        {2, 37, 37, 4, 2, 16, 8, QKV_MASK_CAUSAL, 0, QKV_SCORE_SCALED_DOT, 0, 0, 0, QKV_NORM_RELU, 0, 0, 0, 0, 0, 0},
        {2, 37, 37, 2, 2, 8, 8, QKV_MASK_WINDOW, 1, QKV_SCORE_SCALED_DOT, 0, 4, 3, QKV_NORM_RELU, 1, 0, 0, 0, 0, 0},
        {1, 29, 29, 2, 1, 8, 8, QKV_MASK_NONE, 0, QKV_SCORE_COSINE, 0, 0, 0, QKV_NORM_SIGMOID, 0, 0, 0, 0, 0, 0},
        {2, 19, 31, 2, 2, 8, 8, QKV_MASK_CAUSAL, 0, QKV_SCORE_SCALED_DOT, 0, 0, 0, QKV_NORM_SIGMOID, 0, 0, 0, 0, 0, 0},
        {2, 37, 37, 4, 2, 16, 8, QKV_MASK_CAUSAL, 0, QKV_SCORE_SCALED_DOT, 0, 0, 0, QKV_NORM_SOFTMAX, 0, 1, 0, 0, 0, 0},
        {1, 29, 33, 2, 1, 8, 8, QKV_MASK_WINDOW, 1, QKV_SCORE_SCALED_DOT, 2.0, 5, 5, QKV_NORM_SOFTMAX, 0, 2, 0, 0, 0, 0},
        {2, 29, 29, 2, 2, 8, 8, QKV_MASK_CAUSAL, 0, QKV_SCORE_SCALED_DOT, 0, 0, 0, QKV_NORM_RELU, 1, 2, 0, 0, 0, 0},
        /* packed sequences (packs[] above) */
        {1, 37, 37, 4, 2, 16, 8, QKV_MASK_CAUSAL, 0, QKV_SCORE_SCALED_DOT, 0, 0, 0, QKV_NORM_SOFTMAX, 0, 0, 1, 0, 0, 0},
        {1, 37, 37, 4, 2, 16, 8, QKV_MASK_NONE, 0, QKV_SCORE_SCALED_DOT, 0, 0, 0, QKV_NORM_SOFTMAX, 0, 0, 1, 0, 0, 0},
        {1, 37, 37, 2, 1, 8, 8, QKV_MASK_WINDOW, 1, QKV_SCORE_SCALED_DOT, 0, 3, 2, QKV_NORM_SOFTMAX, 0, 0, 1, 0, 0, 0},
        {1, 29, 41, 3, 1, 8, 5, QKV_MASK_CAUSAL, 0, QKV_SCORE_SCALED_DOT, 0, 0, 0, QKV_NORM_SOFTMAX, 0, 0, 2, 0, 0, 0},
        {1, 29, 41, 2, 2, 8, 8, QKV_MASK_CAUSAL_WINDOW, 1, QKV_SCORE_COSINE, 4.0, 4, 0, QKV_NORM_SOFTMAX, 0, 0, 2, 0, 0, 0},
        {1, 29, 41, 2, 2, 8, 8, QKV_MASK_NONE, 0, QKV_SCORE_SCALED_DOT, 0, 0, 0, QKV_NORM_SIGMOID, 0, 1, 2, 0, 0, 0},
        {1, 24, 24, 2, 2, 8, 8, QKV_MASK_CAUSAL, 0, QKV_SCORE_SCALED_DOT, 0, 0, 0, QKV_NORM_SOFTMAX, 0, 0, 3, 0, 0, 0},
        {1, 24, 24, 2, 2, 8, 8, QKV_MASK_WINDOW, 0, QKV_SCORE_SCALED_DOT, 0, 1, 1, QKV_NORM_RELU, 1, 0, 3, 0, 0, 0},
        {1, 130, 130, 2, 1, 32, 32, QKV_MASK_CAUSAL, 0, QKV_SCORE_SCALED_DOT, 0, 0, 0, QKV_NORM_SOFTMAX, 0, 0, 4, 0, 0, 0},
        {1, 37, 37, 2, 2, 8, 8, QKV_MASK_CAUSAL, 0, QKV_SCORE_SCALED_DOT, 0, 0, 0, QKV_NORM_RELU, 1, 2, 1, 0, 0, 0},
        {1, 37, 37, 4, 2, 8, 8, QKV_MASK_WINDOW, 0, QKV_SCORE_SCALED_DOT, 0, 4, 4, QKV_NORM_SOFTMAX, 0, 1, 1, 0, 0, 0},
        /* ALiBi and T5 buckets: offsets global across blocks, layouts and packed sequences */
        {2, 37, 37, 4, 2, 16, 8, QKV_MASK_CAUSAL, 0, QKV_SCORE_SCALED_DOT, 0, 0, 0, QKV_NORM_SOFTMAX, 0, 0, 0, 1, 0, 0},
        {2, 37, 37, 4, 2, 16, 8, QKV_MASK_NONE, 1, QKV_SCORE_SCALED_DOT, 0, 0, 0, QKV_NORM_SOFTMAX, 0, 0, 0, 2, 0, 0},
        {1, 130, 130, 2, 1, 32, 32, QKV_MASK_CAUSAL, 0, QKV_SCORE_SCALED_DOT, 0, 0, 0, QKV_NORM_SOFTMAX, 0, 0, 0, 3, 0, 0},
        {2, 19, 31, 3, 1, 8, 5, QKV_MASK_WINDOW, 1, QKV_SCORE_SCALED_DOT, 0, 6, 3, QKV_NORM_SOFTMAX, 0, 0, 0, 3, 0, 0},
        {2, 31, 19, 2, 2, 8, 8, QKV_MASK_CAUSAL, 0, QKV_SCORE_SCALED_DOT, 0, 0, 0, QKV_NORM_SOFTMAX, 0, 1, 0, 2, 0, 0},
        {1, 37, 37, 4, 2, 16, 8, QKV_MASK_CAUSAL, 0, QKV_SCORE_SCALED_DOT, 0, 0, 0, QKV_NORM_SOFTMAX, 0, 0, 1, 3, 0, 0},
        {1, 29, 41, 3, 1, 8, 5, QKV_MASK_NONE, 0, QKV_SCORE_SCALED_DOT, 0, 0, 0, QKV_NORM_SOFTMAX, 0, 0, 2, 2, 0, 0},
        {1, 29, 41, 2, 2, 8, 8, QKV_MASK_CAUSAL, 0, QKV_SCORE_SCALED_DOT, 0, 0, 0, QKV_NORM_RELU, 1, 0, 2, 1, 0, 0},
        /* attention dropout: the hash of the whole problem's (i, j) in every block */
        {2, 37, 37, 4, 2, 16, 8, QKV_MASK_CAUSAL, 0, QKV_SCORE_SCALED_DOT, 0, 0, 0, QKV_NORM_SOFTMAX, 0, 0, 0, 0, 0.2, 0},
        {2, 19, 31, 3, 1, 8, 5, QKV_MASK_NONE, 1, QKV_SCORE_SCALED_DOT, 0, 0, 0, QKV_NORM_SOFTMAX, 0, 0, 0, 0, 0.3, 0},
        {1, 130, 130, 2, 1, 32, 32, QKV_MASK_CAUSAL, 0, QKV_SCORE_SCALED_DOT, 0, 0, 0, QKV_NORM_SOFTMAX, 0, 0, 0, 3, 0.1, 0},
        {1, 37, 37, 4, 2, 16, 8, QKV_MASK_WINDOW, 0, QKV_SCORE_SCALED_DOT, 0, 3, 2, QKV_NORM_SOFTMAX, 0, 1, 1, 0, 0.2, 0},
        {1, 29, 41, 3, 1, 8, 5, QKV_MASK_CAUSAL, 1, QKV_SCORE_SCALED_DOT, 0, 0, 0, QKV_NORM_SOFTMAX, 0, 0, 2, 1, 0.25, 0},
        {2, 37, 37, 2, 2, 8, 8, QKV_MASK_CAUSAL, 0, QKV_SCORE_SCALED_DOT, 0, 0, 0, QKV_NORM_RELU, 1, 0, 0, 0, 0.2, 0},
        /* the additive score: its parameter gradients summed over every block and rank */
        {2, 37, 37, 4, 2, 16, 8, QKV_MASK_CAUSAL, 0, QKV_SCORE_ADDITIVE, 0, 0, 0, QKV_NORM_SOFTMAX, 0, 0, 0, 0, 0, 5},
        {2, 19, 31, 3, 1, 8, 5, QKV_MASK_NONE, 1, QKV_SCORE_ADDITIVE, 0, 0, 0, QKV_NORM_SOFTMAX, 0, 0, 0, 0, 0, 3},
        {1, 130, 130, 2, 1, 32, 32, QKV_MASK_CAUSAL_WINDOW, 0, QKV_SCORE_ADDITIVE, 0, 20, 0, QKV_NORM_SOFTMAX, 0, 0, 0, 0, 0, 8},
        {1, 37, 37, 2, 2, 8, 8, QKV_MASK_WINDOW, 0, QKV_SCORE_ADDITIVE, 0, 3, 2, QKV_NORM_SOFTMAX, 0, 1, 1, 0, 0, 4},
        {1, 29, 41, 3, 1, 8, 5, QKV_MASK_CAUSAL, 1, QKV_SCORE_ADDITIVE, 0, 0, 0, QKV_NORM_RELU, 1, 0, 2, 0, 0, 6},
        {2, 29, 29, 2, 2, 8, 8, QKV_MASK_NONE, 0, QKV_SCORE_ADDITIVE, 0, 0, 0, QKV_NORM_SIGMOID, 0, 2, 0, 0, 0, 2},
    };
    uint64_t seed = 1000;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int layout = 0; layout < 2; layout++) {
            if (g_kill >= 0 && i == 3 && layout == 1 && g_rank == g_kill) {
                fprintf(stderr, "test_dist_ring: rank %d kills itself now (--kill-rank)\n", g_rank);
                fflush(stderr);
                raise(SIGKILL);
            }
            run_case(&shapes[i], (qkv_dist_layout)layout, seed++);
        }
    test_errors();
    test_data_parallel();
    test_grad_hook();
    test_reducer();

    long failed = tu_failed, all_failed = 0;
    MPI_Allreduce(&failed, &all_failed, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (g_rank == 0) printf("test_dist_ring: %d ranks, %ld checks failed over all ranks\n", g_size, all_failed);
    int rc = tu_finish();
    MPI_Finalize();
    return all_failed ? 1 : rc;
}
