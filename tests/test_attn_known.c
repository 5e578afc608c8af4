/* Known answers worked by hand: tiny problems (the articles' four words
 * "Hello I love you" as four vectors) whose weights have a closed form.
 * Each case runs in F64 and F32 through both implementations and also
 * through the tests' own oracle (so the oracle is checked too).
 *
 * Tolerances: F64 1e-14 absolute + 1e-14 relative (the closed forms use
 * ln 2, exp and tanh, exact to an ulp or two; outputs are O(1..10));
 * F32 1e-6 absolute + 1e-6 relative (inputs of these cases are exact in
 * float except ln 2 and 0.6/0.8 style values, then one rounding of the
 * result). Degenerate cases (n = 1, one visible key) are checked bitwise. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn_oracle.h"
#include "test_util.h"

#define LN2 0.69314718055994530942

typedef struct known {
    const char *name;
    qkv_attn_desc d;             /* sizes, score, norm, mask, params */
    const double *q, *k, *v, *bias, *w1, *w2, *w;
    const double *want_out;      /* required */
    const double *want_lse;      /* optional */
    const double *want_attn;     /* optional */
} known;

static void base_desc(qkv_attn_desc *d, int64_t nq, int64_t nk, int64_t H, int64_t Hkv, int64_t D,
                      int64_t Dv) {
    qkv_attn_desc_init(d);
    d->dtype = QKV_F64;
    d->batch = 1;
    d->n_q = nq;
    d->n_k = nk;
    d->heads = H;
    d->heads_kv = Hkv;
    d->dim = D;
    d->dim_v = Dv;
}

static void cmp_report(const char *name, const char *what, const char *who, const double *got,
                       const double *want, size_t n, double atol, double rtol) {
    size_t w = 0;
    double e = ao_cmp(got, want, n, atol, rtol, &w);
    CHECK(e <= 1.0, "%s: %s (%s) at %zu: got %.17g want %.17g", name, what, who, w, got[w], want[w]);
}

static void run_known(const known *c) {
    tu_rng r;
    tu_rng_seed(&r, 1);
    ao_prob p;
    ao_prob_init(&p, &c->d, &r, 1.0);
    const double *src[7] = {c->q, c->k, c->v, c->bias, c->w1, c->w2, c->w};
    for (int t = AO_Q; t <= AO_W; t++)
        if (p.n[t]) {
            if (!src[t]) {
                CHECK(0, "%s: tensor %d missing in the test case", c->name, t);
                ao_prob_free(&p);
                return;
            }
            memcpy(p.x[t], src[t], p.n[t] * sizeof(double));
        }
    /* The oracle first: it must agree with the hand computation. */
    ao_forward(&p.d, p.x);
    cmp_report(c->name, "out", "oracle", p.x[AO_O], c->want_out, p.n[AO_O], 1e-14, 1e-14);
    if (c->want_lse) cmp_report(c->name, "lse", "oracle", p.x[AO_LSE], c->want_lse, p.n[AO_LSE], 1e-14, 1e-14);
    if (c->want_attn)
        cmp_report(c->name, "attn", "oracle", p.x[AO_ATTN], c->want_attn, p.n[AO_ATTN], 1e-14, 1e-14);

    double *out = calloc(p.n[AO_O] + 1, sizeof(double));
    double *attn = calloc(p.n[AO_ATTN] + 1, sizeof(double));
    double *lse = calloc(p.n[AO_LSE] + 1, sizeof(double));
    for (int dt = 0; dt < 2; dt++)
        for (int impl = 0; impl < 2; impl++) {
            char who[64];
            snprintf(who, sizeof who, "%s %s", dt ? "f32" : "f64", impl ? "AUTO" : "REFERENCE");
            int guards = 0;
            qkv_status s = ao_lib_forward(&p, dt ? QKV_F32 : QKV_F64,
                                          impl ? QKV_IMPL_AUTO : QKV_IMPL_REFERENCE, 1, out, attn, lse,
                                          &guards);
            CHECK(s == QKV_OK, "%s (%s): status %d (%s)", c->name, who, (int)s, qkv_status_string(s));
            CHECK(guards, "%s (%s): write outside an output buffer", c->name, who);
            if (s != QKV_OK) continue;
            /* AUTO may pick a float fast path: the fast-path rule's 1e-5 term. */
            double tol = dt ? (impl ? 1e-5 : 1e-6) : (impl ? 1e-12 : 1e-14);
            cmp_report(c->name, "out", who, out, c->want_out, p.n[AO_O], tol, tol);
            if (c->want_lse) cmp_report(c->name, "lse", who, lse, c->want_lse, p.n[AO_LSE], tol, tol);
            if (c->want_attn) cmp_report(c->name, "attn", who, attn, c->want_attn, p.n[AO_ATTN], tol, tol);
        }
    free(out);
    free(attn);
    free(lse);
    ao_prob_free(&p);
}

/* Four words, D = 1, dot score: q = ln2 * {1, 0, -1, 2}, k = {0, 1, 2, 3},
 * so exp(s_ij) = 2^(a_i * j): the weights are small rationals.
 * V row j = [j, 1]: O_i = [E_i[j], 1]. */
static const double FW_Q[4] = {LN2, 0.0, -LN2, 2 * LN2};
static const double FW_K[4] = {0, 1, 2, 3};
static const double FW_V[8] = {0, 1, 1, 1, 2, 1, 3, 1};

static void test_four_words(void) {
    known c;
    memset(&c, 0, sizeof c);
    c.q = FW_Q;
    c.k = FW_K;
    c.v = FW_V;

    /* No mask: weights (1,2,4,8)/15, (1,1,1,1)/4, (8,4,2,1)/15, (1,4,16,64)/85. */
    {
        static const double out[8] = {34.0 / 15, 1, 1.5, 1, 11.0 / 15, 1, 228.0 / 85, 1};
        static const double attn[16] = {1.0 / 15, 2.0 / 15, 4.0 / 15, 8.0 / 15, 0.25, 0.25, 0.25, 0.25,
                                        8.0 / 15, 4.0 / 15, 2.0 / 15, 1.0 / 15, 1.0 / 85, 4.0 / 85,
                                        16.0 / 85, 64.0 / 85};
        double lse[4];
        lse[0] = log(15.0);
        lse[1] = log(4.0);
        lse[2] = log(15.0 / 8.0);
        lse[3] = log(85.0);
        c.name = "four words, dot, no mask";
        base_desc(&c.d, 4, 4, 1, 1, 1, 2);
        c.d.score = QKV_SCORE_DOT;
        c.want_out = out;
        c.want_attn = attn;
        c.want_lse = lse;
        run_known(&c);
        /* D = 1: the default scale 1/sqrt(1) = 1, so scaled dot is the same. */
        c.name = "four words, scaled (D=1), no mask";
        c.d.score = QKV_SCORE_SCALED_DOT;
        run_known(&c);
        /* An explicit scale 0.5 halves the exponents: weights 2^(a_i j / 2). */
        c.name = "four words, scale 0.5";
        c.d.scale = 0.5;
        {
            double out2[8], lse2[4], at2[16];
            for (int i = 0; i < 4; i++) {
                double a = FW_Q[i] / LN2 * 0.5, sum = 0, m = 0;
                for (int j = 0; j < 4; j++) sum += pow(2.0, a * j);
                for (int j = 0; j < 4; j++) {
                    at2[i * 4 + j] = pow(2.0, a * j) / sum;
                    m += j * at2[i * 4 + j];
                }
                out2[2 * i] = m;
                out2[2 * i + 1] = 1;
                lse2[i] = log(sum);
            }
            c.want_out = out2;
            c.want_attn = at2;
            c.want_lse = lse2;
            run_known(&c);
        }
    }
    /* Causal: row i sees keys 0..i. */
    {
        static const double out[8] = {0, 1, 0.5, 1, 4.0 / 7, 1, 228.0 / 85, 1};
        static const double attn[16] = {1, 0, 0, 0, 0.5, 0.5, 0, 0, 4.0 / 7, 2.0 / 7, 1.0 / 7, 0,
                                        1.0 / 85, 4.0 / 85, 16.0 / 85, 64.0 / 85};
        double lse[4] = {0.0, log(2.0), log(7.0 / 4.0), log(85.0)};
        c.name = "four words, causal";
        base_desc(&c.d, 4, 4, 1, 1, 1, 2);
        c.d.score = QKV_SCORE_DOT;
        c.d.mask = QKV_MASK_CAUSAL;
        c.want_out = out;
        c.want_attn = attn;
        c.want_lse = lse;
        run_known(&c);
    }
    /* Causal window of 1: row i sees keys i-1, i. */
    {
        static const double out[8] = {0, 1, 0.5, 1, 4.0 / 3, 1, 2.8, 1};
        static const double attn[16] = {1, 0, 0, 0, 0.5, 0.5, 0, 0, 0, 2.0 / 3, 1.0 / 3, 0,
                                        0, 0, 0.2, 0.8};
        c.name = "four words, causal window 1";
        base_desc(&c.d, 4, 4, 1, 1, 1, 2);
        c.d.score = QKV_SCORE_DOT;
        c.d.mask = QKV_MASK_CAUSAL_WINDOW;
        c.d.window_left = 1;
        c.want_out = out;
        c.want_attn = attn;
        c.want_lse = NULL;
        run_known(&c);
        /* The same through a two-sided window (1, 0). */
        c.name = "four words, window (1,0)";
        c.d.mask = QKV_MASK_WINDOW;
        run_known(&c);
    }
    /* Window (0, 1): row i sees keys i, i+1. */
    {
        static const double out[8] = {2.0 / 3, 1, 1.5, 1, 7.0 / 3, 1, 3, 1};
        c.name = "four words, window (0,1)";
        base_desc(&c.d, 4, 4, 1, 1, 1, 2);
        c.d.score = QKV_SCORE_DOT;
        c.d.mask = QKV_MASK_WINDOW;
        c.d.window_right = 1;
        c.want_out = out;
        c.want_attn = NULL;
        run_known(&c);
    }
    /* Key length 2: every row sees keys 0, 1. */
    {
        static const int64_t len[1] = {2};
        static const double out[8] = {2.0 / 3, 1, 0.5, 1, 1.0 / 3, 1, 0.8, 1};
        double lse[4] = {log(3.0), log(2.0), log(1.5), log(5.0)};
        c.name = "four words, key length 2";
        base_desc(&c.d, 4, 4, 1, 1, 1, 2);
        c.d.score = QKV_SCORE_DOT;
        c.d.key_lengths = len;
        c.want_out = out;
        c.want_lse = lse;
        run_known(&c);
    }
}

/* The relu and sigmoid normalisers on q = {1, 0, -1, 2}, k = {0, 1, 2, 3}
 * (dot, D = 1): s_ij = a_i * j; V row j = [j, 1]. */
static void test_relu_sigmoid(void) {
    static const double q[4] = {1, 0, -1, 2};
    known c;
    memset(&c, 0, sizeof c);
    c.q = q;
    c.k = FW_K;
    c.v = FW_V;
    double lse[4];
    for (int i = 0; i < 4; i++) {
        double s = 0;
        for (int j = 0; j < 4; j++) s += exp(q[i] * j);
        lse[i] = log(s); /* log-sum-exp whatever the normaliser */
    }
    {
        /* relu: weights = s: row 0 (0,1,2,3) -> [14, 6]; rows 1, 2 -> 0;
         * row 3 (0,2,4,6) -> [28, 12]. */
        static const double out[8] = {14, 6, 0, 0, 0, 0, 28, 12};
        static const double attn[16] = {0, 1, 2, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 4, 6};
        c.name = "relu";
        base_desc(&c.d, 4, 4, 1, 1, 1, 2);
        c.d.score = QKV_SCORE_DOT;
        c.d.norm = QKV_NORM_RELU;
        c.want_out = out;
        c.want_attn = attn;
        c.want_lse = lse;
        run_known(&c);
    }
    {
        static const double out[8] = {3.5, 1.5, 0, 0, 0, 0, 7, 3};
        c.name = "relu / count";
        base_desc(&c.d, 4, 4, 1, 1, 1, 2);
        c.d.score = QKV_SCORE_DOT;
        c.d.norm = QKV_NORM_RELU;
        c.d.relu_divide_by_count = 1;
        c.want_out = out;
        c.want_attn = NULL;
        run_known(&c);
        /* Divided by the number of visible keys: causal row i has i + 1. */
        static const double outc[8] = {0, 0, 0, 0, 0, 0, 7, 3};
        c.name = "relu / count, causal";
        c.d.mask = QKV_MASK_CAUSAL;
        c.want_out = outc;
        c.want_lse = NULL;
        run_known(&c);
        /* Row 0 under key length 3 and q = 1: (0,1,2)/3 -> [5/3, 1]. */
        static const int64_t len[1] = {3};
        static const double outl[8] = {5.0 / 3, 1, 0, 0, 0, 0, 10.0 / 3, 2};
        c.name = "relu / count, key length 3";
        c.d.mask = QKV_MASK_NONE;
        c.d.key_lengths = len;
        c.want_out = outl;
        run_known(&c);
    }
    {
        double out[8], attn[16];
        for (int i = 0; i < 4; i++) {
            out[2 * i] = out[2 * i + 1] = 0;
            for (int j = 0; j < 4; j++) {
                double a = 1.0 / (1.0 + exp(-q[i] * j));
                attn[i * 4 + j] = a;
                out[2 * i] += a * j;
                out[2 * i + 1] += a;
            }
        }
        /* Row 1: every weight is sigmoid(0) = 1/2 -> [3, 2] exactly. */
        CHECK(out[2] == 3.0 && out[3] == 2.0, "sigmoid hand value");
        c.name = "sigmoid";
        base_desc(&c.d, 4, 4, 1, 1, 1, 2);
        c.d.score = QKV_SCORE_DOT;
        c.d.norm = QKV_NORM_SIGMOID;
        c.want_out = out;
        c.want_attn = attn;
        c.want_lse = lse;
        run_known(&c);
    }
}

/* n = 1: the weight is exactly 1 (softmax), so O = V bitwise and lse = s;
 * every score, F64 and F32, GQA heads. */
static void test_single_key(void) {
    for (int score = 0; score < 4; score++)
        for (int dt = 0; dt < 2; dt++) {
            qkv_attn_desc d;
            base_desc(&d, 1, 1, 4, 2, 3, 5);
            d.batch = 2;
            d.score = (qkv_score)score;
            d.additive_dim = 2;
            tu_rng r;
            tu_rng_seed(&r, 42u + (uint64_t)score);
            ao_prob p;
            ao_prob_init(&p, &d, &r, 1.0);
            if (dt) ao_prob_round_f32(&p);
            ao_forward(&p.d, p.x);
            double out[2 * 4 * 5], attn[8], lse[8];
            for (int impl = 0; impl < 2; impl++) {
                CHECK_STATUS(ao_lib_forward(&p, dt ? QKV_F32 : QKV_F64, impl ? QKV_IMPL_AUTO : QKV_IMPL_REFERENCE,
                                            1, out, attn, lse, NULL),
                             QKV_OK);
                long bad = 0;
                for (int b = 0; b < 2; b++)
                    for (int h = 0; h < 4; h++)
                        for (int e = 0; e < 5; e++)
                            if (out[(b * 4 + h) * 5 + e] != p.x[AO_V][(b * 2 + h / 2) * 5 + e]) bad++;
                CHECK(bad == 0, "n=1 score %d %s impl %d: O != V in %ld entries", score, dt ? "f32" : "f64",
                      impl, bad);
                for (int i = 0; i < 8; i++) CHECK(attn[i] == 1.0, "n=1: weight %g != 1", attn[i]);
                size_t w;
                double tol = dt ? 1e-6 : 1e-14;
                CHECK(ao_cmp(lse, p.x[AO_LSE], 8, tol, tol, &w) <= 1.0, "n=1 score %d: lse[%zu] %.17g want s = %.17g",
                      score, w, lse[w], p.x[AO_LSE][w]);
            }
            ao_prob_free(&p);
        }
}

/* Cosine similarity with a temperature: q = (3,4) -> (0.6, 0.8);
 * keys (4,3), (0,5), (-3,-4), (0,0): cosines 0.96, 0.8, -1, 0 (a zero key
 * stays 0: its norm is floored at 1e-12). Temperature 0.5. */
static void test_cosine(void) {
    static const double q[2] = {3, 4};
    static const double k[8] = {4, 3, 0, 5, -3, -4, 0, 0};
    static const double v[4] = {1, 10, 100, 1000};
    double s[4] = {0.96 / 0.5, 0.8 / 0.5, -1 / 0.5, 0}, sum = 0, out[1] = {0}, attn[4], lse[1];
    for (int j = 0; j < 4; j++) sum += exp(s[j]);
    for (int j = 0; j < 4; j++) {
        attn[j] = exp(s[j]) / sum;
        out[0] += attn[j] * v[j];
    }
    lse[0] = log(sum);
    known c;
    memset(&c, 0, sizeof c);
    c.name = "cosine, temperature 0.5";
    base_desc(&c.d, 1, 4, 1, 1, 2, 1);
    c.d.score = QKV_SCORE_COSINE;
    c.d.temperature = 0.5;
    c.q = q;
    c.k = k;
    c.v = v;
    c.want_out = out;
    c.want_attn = attn;
    c.want_lse = lse;
    run_known(&c);
    /* Cosine ignores the lengths: scaling q by 1000 changes nothing. */
    static const double q2[2] = {3000, 4000};
    c.name = "cosine, scaled query";
    c.q = q2;
    run_known(&c);
    /* And the scale field is ignored. */
    c.d.scale = 3.0;
    c.name = "cosine ignores scale";
    run_known(&c);
}

/* Scaled vs plain dot: D = 4 -> default scale 1/2. Scores of q = (1,1,1,1)
 * with keys e_j * 2j*ln2: dot gives 2j ln2 (weights 4^j), scaled j ln2
 * (weights 2^j). */
static void test_dot_vs_scaled(void) {
    static const double q[4] = {1, 1, 1, 1};
    double k[16];
    memset(k, 0, sizeof k);
    for (int j = 0; j < 4; j++) k[j * 4 + j] = 2 * j * LN2;
    static const double v[4] = {0, 1, 2, 3};
    static const double out_dot[1] = {(0 + 4 + 32 + 192) / 85.0};
    static const double out_scaled[1] = {(0 + 2 + 8 + 24) / 15.0};
    known c;
    memset(&c, 0, sizeof c);
    base_desc(&c.d, 1, 4, 1, 1, 4, 1);
    c.q = q;
    c.k = k;
    c.v = v;
    c.name = "dot, D=4";
    c.d.score = QKV_SCORE_DOT;
    c.d.scale = 7.0; /* ignored by DOT */
    c.want_out = out_dot;
    run_known(&c);
    c.name = "scaled dot, D=4 (default 1/2)";
    c.d.score = QKV_SCORE_SCALED_DOT;
    c.d.scale = 0.0;
    c.want_out = out_scaled;
    run_known(&c);
    c.name = "scaled dot, explicit scale 1";
    c.d.scale = 1.0;
    c.want_out = out_dot;
    run_known(&c);
}

/* Soft-capping s -> c tanh(s / c) before the bias. */
static void test_softcap(void) {
    static const double q[1] = {1};
    static const double k[4] = {0, 1, 2, 1000};
    static const double v[4] = {0, 1, 2, 3};
    const double cap = 2.0;
    double s[4], sum = 0, out[1] = {0}, lse[1];
    for (int j = 0; j < 4; j++) {
        s[j] = cap * tanh(k[j] / cap); /* 1000 -> 2 (tanh saturates) */
        sum += exp(s[j]);
    }
    for (int j = 0; j < 4; j++) out[0] += exp(s[j]) / sum * v[j];
    lse[0] = log(sum);
    known c;
    memset(&c, 0, sizeof c);
    c.name = "softcap 2";
    base_desc(&c.d, 1, 4, 1, 1, 1, 1);
    c.d.score = QKV_SCORE_DOT;
    c.d.softcap = cap;
    c.q = q;
    c.k = k;
    c.v = v;
    c.want_out = out;
    c.want_lse = lse;
    run_known(&c);
    /* The bias is added after the cap: bias ln(2) on key 3 doubles its weight. */
    static const double bias[4] = {0, 0, 0, LN2};
    double sum2 = sum + exp(s[3]), out2[1] = {0}, lse2[1] = {log(sum2)};
    for (int j = 0; j < 4; j++) out2[0] += exp(s[j]) * (j == 3 ? 2 : 1) / sum2 * v[j];
    c.name = "softcap 2 then bias";
    c.d.bias_kind = QKV_BIAS_SHARED;
    c.bias = bias;
    c.want_out = out2;
    c.want_lse = lse2;
    run_known(&c);
}

/* Additive score w . tanh(W1 q + W2 k) with A = 2, D = 2, two heads with
 * different parameters (checks per-head indexing). */
static void test_additive(void) {
    /* Q [1, 1, H=2, D=2], K [1, 3, 1, 2], V [1, 3, 1, 1]. */
    static const double q[4] = {0.5, -0.25, 1.0, 0.0};
    static const double k[6] = {0.0, 0.5, -0.5, 1.0, 0.25, 0.0};
    static const double v[3] = {1, 2, 4};
    /* W1 [2, 2, 2]: head 0 identity, head 1 swap; W2 head 0 swap, head 1 identity. */
    static const double w1[8] = {1, 0, 0, 1, 0, 1, 1, 0};
    static const double w2[8] = {0, 1, 1, 0, 1, 0, 0, 1};
    static const double w[4] = {1, -1, 2, 0.5};
    double out[2], lse[2], attn[6];
    for (int h = 0; h < 2; h++) {
        double s[3], sum = 0, o = 0;
        for (int j = 0; j < 3; j++) {
            double u0 = w1[h * 4 + 0] * q[h * 2] + w1[h * 4 + 1] * q[h * 2 + 1] + w2[h * 4 + 0] * k[j * 2] +
                        w2[h * 4 + 1] * k[j * 2 + 1];
            double u1 = w1[h * 4 + 2] * q[h * 2] + w1[h * 4 + 3] * q[h * 2 + 1] + w2[h * 4 + 2] * k[j * 2] +
                        w2[h * 4 + 3] * k[j * 2 + 1];
            s[j] = w[h * 2] * tanh(u0) + w[h * 2 + 1] * tanh(u1);
            sum += exp(s[j]);
        }
        for (int j = 0; j < 3; j++) {
            attn[h * 3 + j] = exp(s[j]) / sum;
            o += attn[h * 3 + j] * v[j];
        }
        out[h] = o;
        lse[h] = log(sum);
    }
    /* Head 0, key 0 by hand: u = (0.5 + 0.5, -0.25 + 0) -> s = tanh(1) - tanh(-0.25). */
    CHECK(fabs(exp(tanh(1.0) + tanh(0.25) - lse[0]) - attn[0]) < 1e-15, "additive hand value");
    known c;
    memset(&c, 0, sizeof c);
    c.name = "additive A=2, two heads";
    base_desc(&c.d, 1, 3, 2, 1, 2, 1);
    c.d.score = QKV_SCORE_ADDITIVE;
    c.d.additive_dim = 2;
    c.q = q;
    c.k = k;
    c.v = v;
    c.w1 = w1;
    c.w2 = w2;
    c.w = w;
    c.want_out = out;
    c.want_lse = lse;
    c.want_attn = attn;
    run_known(&c);
}

/* Bias: with q = 0 the logits are the bias itself. Shared ln(1,2,3,4) gives
 * weights (1,2,3,4)/10; per head, head 1 masks keys 0 and 3 with -inf. */
static void test_bias(void) {
    static const double q[2] = {0, 0}; /* [1, 1, H=2, D=1] */
    static const double k[4] = {1, 2, 3, 4};
    static const double v[4] = {10, 20, 30, 40};
    double bias[4] = {0, log(2.0), log(3.0), log(4.0)};
    static const double out_s[2] = {30, 30};
    double lse_s[2] = {log(10.0), log(10.0)};
    known c;
    memset(&c, 0, sizeof c);
    c.name = "shared bias";
    base_desc(&c.d, 1, 4, 2, 1, 1, 1);
    c.d.bias_kind = QKV_BIAS_SHARED;
    c.q = q;
    c.k = k;
    c.v = v;
    c.bias = bias;
    c.want_out = out_s;
    c.want_lse = lse_s;
    run_known(&c);
    double bph[8] = {0, 0, 0, 0, -INFINITY, 0, 0, -INFINITY};
    static const double out_p[2] = {25, 25};
    static const double attn_p[8] = {0.25, 0.25, 0.25, 0.25, 0, 0.5, 0.5, 0};
    double lse_p[2] = {log(4.0), log(2.0)};
    c.name = "per-head bias with -inf";
    c.d.bias_kind = QKV_BIAS_PER_HEAD;
    c.bias = bph;
    c.want_out = out_p;
    c.want_lse = lse_p;
    c.want_attn = attn_p;
    run_known(&c);
    /* relu / count: the -inf keys are masked, so they do not count. With
     * q = 0 every logit is the bias 0 -> weights 0; use bias 1 instead. */
    double bph1[8] = {1, 1, 1, 1, -INFINITY, 1, 1, -INFINITY};
    static const double out_r[2] = {25, 25};
    static const double attn_r[8] = {0.25, 0.25, 0.25, 0.25, 0, 0.5, 0.5, 0};
    c.name = "per-head bias with -inf, relu / count";
    c.d.norm = QKV_NORM_RELU;
    c.d.relu_divide_by_count = 1;
    c.bias = bph1;
    c.want_out = out_r;
    c.want_attn = attn_r;
    c.want_lse = NULL;
    run_known(&c);
}

/* Grouped-query heads: H = 4 reading kv heads h / 2 (and h / 4 with one kv
 * head); a single key so O is exactly that head's value. */
static void test_gqa_mapping(void) {
    for (int hkv = 1; hkv <= 4; hkv *= 2) {
        double q[4] = {1, 2, 3, 4}, k[4] = {1, 1, 1, 1}, v[4] = {10, 20, 30, 40}, out[4];
        for (int h = 0; h < 4; h++) out[h] = v[h / (4 / hkv)];
        known c;
        memset(&c, 0, sizeof c);
        c.name = hkv == 1 ? "MQA mapping" : hkv == 2 ? "GQA mapping" : "MHA mapping";
        base_desc(&c.d, 1, 1, 4, hkv, 1, 1);
        c.q = q;
        c.k = k;
        c.v = v;
        c.want_out = out;
        run_known(&c);
    }
    /* Two keys, kv head chosen by the key: H=2, H_kv=2 vs H_kv=1. */
    static const double q[2] = {LN2, LN2};                /* [1,1,2,1] */
    static const double k2[4] = {0, 1, 1, 0};             /* [1,2,2,1]: head0 (0,1), head1 (1,0) */
    static const double v2[4] = {0, 0, 3, 3};             /* head0 (0,3), head1 (0,3) */
    static const double out2[2] = {2, 1};                 /* head0 weights (1,2)/3; head1 (2,1)/3 */
    known c;
    memset(&c, 0, sizeof c);
    c.name = "two kv heads";
    base_desc(&c.d, 1, 2, 2, 2, 1, 1);
    c.d.score = QKV_SCORE_DOT;
    c.q = q;
    c.k = k2;
    c.v = v2;
    c.want_out = out2;
    run_known(&c);
}

/* n_q != n_k, causal, bottom-right: q = 0 (uniform weights), v_j = j. */
static void test_causal_alignment(void) {
    static const double k[4] = {1, 2, 3, 4};
    static const double v[4] = {0, 1, 2, 3};
    double q[4] = {0, 0, 0, 0};
    known c;
    memset(&c, 0, sizeof c);
    c.q = q;
    c.k = k;
    c.v = v;
    /* n_q = 2, n_k = 4: row 0 sees keys 0..2, row 1 all. */
    static const double out24[2] = {1, 1.5};
    c.name = "causal n_q=2 n_k=4";
    base_desc(&c.d, 2, 4, 1, 1, 1, 1);
    c.d.mask = QKV_MASK_CAUSAL;
    c.want_out = out24;
    run_known(&c);
    /* n_q = 4, n_k = 2: rows 0, 1 see nothing (0, lse -inf); row 2 key 0; row 3 keys 0, 1. */
    static const double out42[4] = {0, 0, 0, 0.5};
    double lse42[4] = {-INFINITY, -INFINITY, 0.0, log(2.0)};
    static const double attn42[8] = {0, 0, 0, 0, 1, 0, 0.5, 0.5};
    c.name = "causal n_q=4 n_k=2";
    base_desc(&c.d, 4, 2, 1, 1, 1, 1);
    c.d.mask = QKV_MASK_CAUSAL;
    c.want_out = out42;
    c.want_lse = lse42;
    c.want_attn = attn42;
    run_known(&c);
    /* Decoding: one query sees every key. */
    static const double out14[1] = {1.5};
    c.name = "causal n_q=1 n_k=4";
    base_desc(&c.d, 1, 4, 1, 1, 1, 1);
    c.d.mask = QKV_MASK_CAUSAL;
    c.want_out = out14;
    c.want_lse = NULL;
    c.want_attn = NULL;
    run_known(&c);
    /* Window (0,0) with n_q = 2, n_k = 4: row i sees exactly key i + 2. */
    static const double outw[2] = {2, 3};
    c.name = "window(0,0) n_q=2 n_k=4";
    base_desc(&c.d, 2, 4, 1, 1, 1, 1);
    c.d.mask = QKV_MASK_WINDOW;
    c.want_out = outw;
    run_known(&c);
}

/* Packed sequences: q offsets {0, 2, 5}, k offsets {0, 3, 4}; q = 0 so the
 * weights are uniform over what each query sees; v_j = j. */
static void test_packed(void) {
    static const double q[5] = {0, 0, 0, 0, 0};
    static const double k[4] = {1, 2, 3, 4};
    static const double v[4] = {0, 1, 2, 3};
    static const int64_t oq[3] = {0, 2, 5}, ok[3] = {0, 3, 4};
    known c;
    memset(&c, 0, sizeof c);
    c.q = q;
    c.k = k;
    c.v = v;
    static const double out[5] = {1, 1, 3, 3, 3};
    c.name = "packed, no mask";
    base_desc(&c.d, 5, 4, 1, 1, 1, 1);
    c.d.num_seqs = 2;
    c.d.seq_offsets_q = oq;
    c.d.seq_offsets_k = ok;
    c.want_out = out;
    run_known(&c);
    /* Causal per sequence: seq 0 (2 q, 3 k): rows see keys 0..1, 0..2;
     * seq 1 (3 q, 1 k): rows 2, 3 see nothing, row 4 sees key 3. */
    static const double outc[5] = {0.5, 1, 0, 0, 3};
    double lsec[5] = {log(2.0), log(3.0), -INFINITY, -INFINITY, 0.0};
    c.name = "packed, causal";
    c.d.mask = QKV_MASK_CAUSAL;
    c.want_out = outc;
    c.want_lse = lsec;
    run_known(&c);
    /* Same offsets for q and k (seq_offsets_k NULL): {0, 1, 4} over 4. */
    static const int64_t o2[3] = {0, 1, 4};
    static const double q4[4] = {0, 0, 0, 0};
    static const double out2[4] = {0, 1, 1.5, 2};
    c.name = "packed, shared offsets, causal";
    base_desc(&c.d, 4, 4, 1, 1, 1, 1);
    c.q = q4;
    c.d.mask = QKV_MASK_CAUSAL;
    c.d.num_seqs = 2;
    c.d.seq_offsets_q = o2;
    c.want_out = out2;
    c.want_lse = NULL;
    run_known(&c);
    /* The bias is indexed by packed position: a -inf at (3, 3) hides key 3
     * from query 3 (sequence 1, its local key 2). */
    double bias[16];
    for (int i = 0; i < 16; i++) bias[i] = 0;
    bias[3 * 4 + 3] = -INFINITY;
    static const double out3[4] = {0, 2, 2, 1.5};
    c.name = "packed, bias by packed position";
    c.d.mask = QKV_MASK_NONE;
    c.d.bias_kind = QKV_BIAS_SHARED;
    c.bias = bias;
    c.want_out = out3;
    run_known(&c);
}

/* Several batches with per-batch key lengths, including 0. */
static void test_key_lengths_batches(void) {
    static const double q[3] = {0, 0, 0};     /* [3, 1, 1, 1] */
    static const double k[9] = {1, 2, 3, 1, 2, 3, 1, 2, 3};
    static const double v[9] = {1, 2, 3, 10, 20, 30, 100, 200, 300};
    static const int64_t len[3] = {3, 1, 0};
    static const double out[3] = {2, 10, 0};
    double lse[3] = {log(3.0), 0.0, -INFINITY};
    known c;
    memset(&c, 0, sizeof c);
    c.name = "key lengths 3, 1, 0";
    base_desc(&c.d, 1, 3, 1, 1, 1, 1);
    c.d.batch = 3;
    c.d.key_lengths = len;
    c.q = q;
    c.k = k;
    c.v = v;
    c.want_out = out;
    c.want_lse = lse;
    run_known(&c);
}

int main(void) {
    test_four_words();
    test_relu_sigmoid();
    test_single_key();
    test_cosine();
    test_dot_vs_scaled();
    test_softcap();
    test_additive();
    test_bias();
    test_gqa_mapping();
    test_causal_alignment();
    test_packed();
    test_key_lengths_batches();
    return tu_finish();
}
