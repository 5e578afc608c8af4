/* Every error path of the attention API: qkv_attn_desc_check, forward and
 * backward return the documented status for each kind of bad argument (the
 * same code from all three), valid edge values are accepted, allocation
 * failure is reported and leaks nothing, and the status texts and dtype sizes
 * are right. Tensor buffers are sized for the small valid problem only: a
 * call that does not stop at validation reads past them (ASan catches it). */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "qkv.h"
#include "test_util.h"

#define BUF 4096 /* doubles per tensor: enough for the valid base problem */

static double *T_Q, *T_K, *T_V, *T_O, *T_A, *T_L, *T_DO, *T_DQ, *T_DK, *T_DV, *T_BIAS, *T_W1, *T_W2,
    *T_W, *T_DB;

static void buffers_make(void) {
    double **all[] = {&T_Q, &T_K, &T_V, &T_O, &T_A, &T_L, &T_DO, &T_DQ, &T_DK, &T_DV, &T_BIAS, &T_W1, &T_W2,
                      &T_W, &T_DB};
    tu_rng r;
    tu_rng_seed(&r, 5);
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        *all[i] = tu_guarded_alloc(BUF * sizeof(double));
        if (!*all[i]) abort();
        tu_fill_normal_f64(&r, *all[i], BUF, 0.5);
    }
}

static void buffers_free(void) {
    double *all[] = {T_Q, T_K, T_V, T_O, T_A, T_L, T_DO, T_DQ, T_DK, T_DV, T_BIAS, T_W1, T_W2, T_W, T_DB};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        CHECK(tu_guarded_ok(all[i]), "buffer %zu: guard bytes overwritten", i);
        tu_guarded_free(all[i]);
    }
}

/* A small valid problem: B=2, n_q=3, n_k=4, H=4, H_kv=2, D=3, D_v=2, F64. */
static void base(qkv_attn_desc *d) {
    qkv_attn_desc_init(d);
    d->dtype = QKV_F64;
    d->batch = 2;
    d->n_q = 3;
    d->n_k = 4;
    d->heads = 4;
    d->heads_kv = 2;
    d->dim = 3;
    d->dim_v = 2;
    d->impl = QKV_IMPL_REFERENCE;
    d->threads = 1;
}

static qkv_attn_grads grads_all(void) {
    qkv_attn_grads g;
    memset(&g, 0, sizeof g);
    g.dq = T_DQ;
    g.dk = T_DK;
    g.dv = T_DV;
    return g;
}

/* desc_check, forward and backward must all say `want`. Forward/backward
 * are only run on invalid descriptors or on the small valid ones (never on
 * a valid descriptor with huge sizes). */
static void expect_line(const qkv_attn_desc *d, qkv_status want, const char *what, int line) {
    qkv_status c = qkv_attn_desc_check(d);
    CHECK(c == want, "line %d: %s: desc_check gave %d (%s), want %d (%s)", line, what, (int)c,
          qkv_status_string(c), (int)want, qkv_status_string(want));
    qkv_status f = qkv_attention_forward(d, T_Q, T_K, T_V, T_O, T_A, T_L);
    CHECK(f == want, "line %d: %s: forward gave %d (%s), want %d (%s)", line, what, (int)f,
          qkv_status_string(f), (int)want, qkv_status_string(want));
    qkv_attn_grads g = grads_all();
    qkv_status b = qkv_attention_backward(d, T_Q, T_K, T_V, NULL, NULL, T_DO, &g);
    CHECK(b == want, "line %d: %s: backward gave %d (%s), want %d (%s)", line, what, (int)b,
          qkv_status_string(b), (int)want, qkv_status_string(want));
}
#define EXPECT(d, want, what) expect_line(d, want, what, __LINE__)

/* desc_check only (for valid descriptors whose sizes are too big to run). */
#define EXPECT_CHECK(d, want, what)                                                               \
    do {                                                                                          \
        qkv_status c_ = qkv_attn_desc_check(d);                                                   \
        CHECK(c_ == (want), "%s: desc_check gave %d (%s), want %d", what, (int)c_,                \
              qkv_status_string(c_), (int)(want));                                                \
    } while (0)

static void test_valid_base(void) {
    qkv_attn_desc d;
    base(&d);
    EXPECT(&d, QKV_OK, "the base problem");
    d.heads_kv = 0; /* means H */
    EXPECT(&d, QKV_OK, "heads_kv 0 = H");
    d.dim_v = 0; /* means D */
    EXPECT(&d, QKV_OK, "dim_v 0 = D");
    d.threads = 0; /* default */
    EXPECT(&d, QKV_OK, "threads 0 = default");
    d.dtype = QKV_F32;
    EXPECT(&d, QKV_OK, "F32");
    base(&d);
    d.scale = -0.5; /* finite and != 0 */
    EXPECT(&d, QKV_OK, "negative scale");
    d.score = QKV_SCORE_DOT;
    d.scale = NAN; /* ignored by DOT */
    EXPECT(&d, QKV_OK, "scale NaN ignored by DOT");
    base(&d);
    d.temperature = 0.0; /* ignored unless COSINE */
    EXPECT(&d, QKV_OK, "temperature 0 ignored by SCALED_DOT");
    d.additive_dim = -3; /* ignored unless ADDITIVE */
    EXPECT(&d, QKV_OK, "additive_dim ignored by SCALED_DOT");
    base(&d);
    d.mask = QKV_MASK_WINDOW;
    d.window_left = 0;
    d.window_right = 0;
    EXPECT(&d, QKV_OK, "window (0, 0)");
    d.window_left = INT64_MAX;
    d.window_right = INT64_MAX;
    EXPECT(&d, QKV_OK, "window (INT64_MAX, INT64_MAX)");
    d.mask = QKV_MASK_CAUSAL_WINDOW;
    d.window_right = 0;
    EXPECT(&d, QKV_OK, "causal window INT64_MAX");
    base(&d);
    int64_t lens[2] = {0, 4};
    d.key_lengths = lens;
    EXPECT(&d, QKV_OK, "key lengths 0 and n_k");
    base(&d);
    d.softcap = 0.0;
    EXPECT(&d, QKV_OK, "softcap 0 = off");
    d.softcap = 1e-300;
    EXPECT(&d, QKV_OK, "tiny softcap");
    /* Optional outputs may be NULL. */
    base(&d);
    CHECK_STATUS(qkv_attention_forward(&d, T_Q, T_K, T_V, T_O, NULL, NULL), QKV_OK);
    qkv_attn_grads g = grads_all();
    CHECK_STATUS(qkv_attention_backward(&d, T_Q, T_K, T_V, T_O, T_L, T_DO, &g), QKV_OK);
}

static void test_null_pointers(void) {
    qkv_attn_desc d;
    base(&d);
    CHECK_STATUS(qkv_attn_desc_check(NULL), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_attention_forward(NULL, T_Q, T_K, T_V, T_O, NULL, NULL), QKV_ERR_NULL_POINTER);
    qkv_attn_grads g = grads_all();
    CHECK_STATUS(qkv_attention_backward(NULL, T_Q, T_K, T_V, NULL, NULL, T_DO, &g), QKV_ERR_NULL_POINTER);
    qkv_attn_desc_init(NULL); /* must not crash */

    CHECK_STATUS(qkv_attention_forward(&d, NULL, T_K, T_V, T_O, NULL, NULL), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_attention_forward(&d, T_Q, NULL, T_V, T_O, NULL, NULL), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_attention_forward(&d, T_Q, T_K, NULL, T_O, NULL, NULL), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_attention_forward(&d, T_Q, T_K, T_V, NULL, T_A, T_L), QKV_ERR_NULL_POINTER);

    CHECK_STATUS(qkv_attention_backward(&d, NULL, T_K, T_V, NULL, NULL, T_DO, &g), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_attention_backward(&d, T_Q, NULL, T_V, NULL, NULL, T_DO, &g), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_attention_backward(&d, T_Q, T_K, NULL, NULL, NULL, T_DO, &g), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_attention_backward(&d, T_Q, T_K, T_V, NULL, NULL, NULL, &g), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_attention_backward(&d, T_Q, T_K, T_V, NULL, NULL, T_DO, NULL), QKV_ERR_NULL_POINTER);
    g.dq = NULL;
    CHECK_STATUS(qkv_attention_backward(&d, T_Q, T_K, T_V, NULL, NULL, T_DO, &g), QKV_ERR_NULL_POINTER);
    g = grads_all();
    g.dk = NULL;
    CHECK_STATUS(qkv_attention_backward(&d, T_Q, T_K, T_V, NULL, NULL, T_DO, &g), QKV_ERR_NULL_POINTER);
    g = grads_all();
    g.dv = NULL;
    CHECK_STATUS(qkv_attention_backward(&d, T_Q, T_K, T_V, NULL, NULL, T_DO, &g), QKV_ERR_NULL_POINTER);

    /* A bias kind without a bias, an additive score without its weights. */
    d.bias_kind = QKV_BIAS_SHARED;
    EXPECT(&d, QKV_ERR_NULL_POINTER, "shared bias NULL");
    d.bias_kind = QKV_BIAS_PER_HEAD;
    EXPECT(&d, QKV_ERR_NULL_POINTER, "per-head bias NULL");
    d.bias = T_BIAS;
    EXPECT(&d, QKV_OK, "per-head bias given");
    base(&d);
    d.score = QKV_SCORE_ADDITIVE;
    d.additive_dim = 2;
    d.additive_w1 = T_W1;
    d.additive_w2 = T_W2;
    d.additive_w = T_W;
    EXPECT(&d, QKV_OK, "additive with weights");
    d.additive_w1 = NULL;
    EXPECT(&d, QKV_ERR_NULL_POINTER, "additive W1 NULL");
    d.additive_w1 = T_W1;
    d.additive_w2 = NULL;
    EXPECT(&d, QKV_ERR_NULL_POINTER, "additive W2 NULL");
    d.additive_w2 = T_W2;
    d.additive_w = NULL;
    EXPECT(&d, QKV_ERR_NULL_POINTER, "additive w NULL");
    /* Packed offsets: num_seqs set but no q offsets; k offsets without q. */
    base(&d);
    d.batch = 1;
    int64_t ok[3] = {0, 2, 4};
    d.num_seqs = 2;
    EXPECT(&d, QKV_ERR_NULL_POINTER, "num_seqs 2, seq_offsets_q NULL");
    d.seq_offsets_k = ok;
    EXPECT(&d, QKV_ERR_NULL_POINTER, "seq_offsets_k given, seq_offsets_q NULL");
}

static void test_bad_sizes(void) {
    static const int64_t bad[] = {0, -1, -7, INT64_MIN};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int64_t x = bad[i];
        char what[64];
        qkv_attn_desc d;
#define BAD_FIELD(field, allow_zero)                                                               \
    do {                                                                                          \
        base(&d);                                                                                 \
        d.field = x;                                                                              \
        snprintf(what, sizeof what, #field " = %lld", (long long)x);                              \
        if (!(allow_zero && x == 0)) EXPECT(&d, QKV_ERR_BAD_SIZE, what);                          \
    } while (0)
        BAD_FIELD(batch, 0);
        BAD_FIELD(n_q, 0);
        BAD_FIELD(n_k, 0);
        BAD_FIELD(heads, 0);
        BAD_FIELD(heads_kv, 1);
        BAD_FIELD(dim, 0);
        BAD_FIELD(dim_v, 1);
#undef BAD_FIELD
        base(&d);
        d.score = QKV_SCORE_ADDITIVE;
        d.additive_w1 = T_W1;
        d.additive_w2 = T_W2;
        d.additive_w = T_W;
        d.additive_dim = x;
        snprintf(what, sizeof what, "additive_dim = %lld", (long long)x);
        EXPECT(&d, QKV_ERR_BAD_SIZE, what);
    }
    qkv_attn_desc d;
    base(&d);
    d.threads = -1;
    EXPECT(&d, QKV_ERR_BAD_SIZE, "threads = -1");
    d.threads = -1000;
    EXPECT(&d, QKV_ERR_BAD_SIZE, "threads = -1000");
}

static void test_overflow(void) {
    qkv_attn_desc d;
    base(&d);
    d.n_q = (int64_t)1 << 40;
    d.dim = (int64_t)1 << 40;
    EXPECT(&d, QKV_ERR_SIZE_OVERFLOW, "n_q * dim = 2^80");
    base(&d);
    d.batch = INT64_MAX;
    EXPECT(&d, QKV_ERR_SIZE_OVERFLOW, "batch INT64_MAX");
    base(&d);
    d.n_k = (int64_t)1 << 62;
    EXPECT(&d, QKV_ERR_SIZE_OVERFLOW, "n_k 2^62 (K elements 2^66)");
    base(&d);
    d.dim_v = (int64_t)1 << 61;
    EXPECT(&d, QKV_ERR_SIZE_OVERFLOW, "dim_v 2^61 (V elements)");
    base(&d);
    d.heads = (int64_t)1 << 40;
    d.heads_kv = 1;
    d.dim = (int64_t)1 << 30;
    EXPECT(&d, QKV_ERR_SIZE_OVERFLOW, "heads 2^40 * dim 2^30");
    /* Elements fit in int64 but bytes do not fit in size_t. */
    base(&d);
    d.batch = 1;
    d.heads = d.heads_kv = 1;
    d.dim = d.dim_v = 1;
    d.n_q = (int64_t)1 << 61;
    EXPECT(&d, QKV_ERR_SIZE_OVERFLOW, "2^61 doubles (2^64 bytes)");
    /* The additive weights [H, A, D]. */
    base(&d);
    d.score = QKV_SCORE_ADDITIVE;
    d.additive_w1 = T_W1;
    d.additive_w2 = T_W2;
    d.additive_w = T_W;
    d.additive_dim = (int64_t)1 << 62;
    EXPECT(&d, QKV_ERR_SIZE_OVERFLOW, "additive_dim 2^62");
    /* A bias [H, n_q, n_k] that overflows while Q, K, V fit. */
    base(&d);
    d.batch = 1;
    d.heads = d.heads_kv = 1;
    d.dim = d.dim_v = 1;
    d.n_q = d.n_k = (int64_t)1 << 32;
    EXPECT_CHECK(&d, QKV_OK, "n = 2^32 without bias is valid");
    d.bias_kind = QKV_BIAS_SHARED;
    d.bias = T_BIAS;
    EXPECT(&d, QKV_ERR_SIZE_OVERFLOW, "shared bias 2^64 entries");
    d.bias_kind = QKV_BIAS_PER_HEAD;
    EXPECT(&d, QKV_ERR_SIZE_OVERFLOW, "per-head bias 2^64 entries");
    /* The attention matrix only matters when it is asked for. */
    d.bias_kind = QKV_BIAS_NONE;
    d.bias = NULL;
    CHECK_STATUS(qkv_attention_forward(&d, T_Q, T_K, T_V, T_O, T_A, NULL), QKV_ERR_SIZE_OVERFLOW);
}

static void test_heads(void) {
    qkv_attn_desc d;
    base(&d);
    d.heads_kv = 3;
    EXPECT(&d, QKV_ERR_HEADS, "H 4, H_kv 3");
    d.heads_kv = 8;
    EXPECT(&d, QKV_ERR_HEADS, "H 4, H_kv 8");
    d.heads = 3;
    d.heads_kv = 2;
    EXPECT(&d, QKV_ERR_HEADS, "H 3, H_kv 2");
    d.heads = 4;
    d.heads_kv = 1;
    EXPECT(&d, QKV_OK, "H 4, H_kv 1");
    d.heads_kv = 4;
    EXPECT(&d, QKV_OK, "H 4, H_kv 4");
}

static void test_window(void) {
    qkv_attn_desc d;
    base(&d);
    d.mask = QKV_MASK_WINDOW;
    d.window_left = -1;
    EXPECT(&d, QKV_ERR_WINDOW, "window left -1");
    d.window_left = 1;
    d.window_right = -1;
    EXPECT(&d, QKV_ERR_WINDOW, "window right -1");
    d.window_right = INT64_MIN;
    EXPECT(&d, QKV_ERR_WINDOW, "window right INT64_MIN");
    base(&d);
    d.mask = QKV_MASK_CAUSAL_WINDOW;
    d.window_left = -1;
    EXPECT(&d, QKV_ERR_WINDOW, "causal window left -1");
    d.window_left = 2;
    d.window_right = 1;
    EXPECT(&d, QKV_ERR_WINDOW, "causal window right 1");
    d.window_right = -1;
    EXPECT(&d, QKV_ERR_WINDOW, "causal window right -1");
    d.window_right = 0;
    EXPECT(&d, QKV_OK, "causal window (2, 0)");
}

static void test_key_lengths(void) {
    qkv_attn_desc d;
    base(&d);
    int64_t lens[2] = {2, -1};
    d.key_lengths = lens;
    EXPECT(&d, QKV_ERR_KEY_LENGTHS, "key length -1");
    lens[1] = 5; /* n_k + 1 */
    EXPECT(&d, QKV_ERR_KEY_LENGTHS, "key length n_k + 1");
    lens[0] = INT64_MIN;
    lens[1] = 1;
    EXPECT(&d, QKV_ERR_KEY_LENGTHS, "key length INT64_MIN");
    lens[0] = INT64_MAX;
    EXPECT(&d, QKV_ERR_KEY_LENGTHS, "key length INT64_MAX");
}

static void test_seq_offsets(void) {
    qkv_attn_desc d;
    int64_t oq[4], ok[4];
#define PACKED()                                                                                  \
    do {                                                                                          \
        base(&d);                                                                                 \
        d.batch = 1;                                                                              \
        d.n_q = 5;                                                                                \
        d.n_k = 4;                                                                                \
        d.num_seqs = 2;                                                                           \
        oq[0] = 0, oq[1] = 2, oq[2] = 5, oq[3] = 5;                                               \
        ok[0] = 0, ok[1] = 3, ok[2] = 4, ok[3] = 4;                                               \
        d.seq_offsets_q = oq;                                                                     \
        d.seq_offsets_k = ok;                                                                     \
    } while (0)
    PACKED();
    EXPECT(&d, QKV_OK, "packed base");
    PACKED();
    oq[0] = 1;
    EXPECT(&d, QKV_ERR_SEQ_OFFSETS, "q offsets start at 1");
    PACKED();
    oq[0] = -1;
    EXPECT(&d, QKV_ERR_SEQ_OFFSETS, "q offsets start at -1");
    PACKED();
    oq[2] = 4;
    EXPECT(&d, QKV_ERR_SEQ_OFFSETS, "q offsets end at n_q - 1");
    PACKED();
    oq[2] = 6;
    EXPECT(&d, QKV_ERR_SEQ_OFFSETS, "q offsets end at n_q + 1");
    PACKED();
    ok[2] = 3;
    EXPECT(&d, QKV_ERR_SEQ_OFFSETS, "k offsets end at n_k - 1");
    PACKED();
    ok[0] = 2;
    EXPECT(&d, QKV_ERR_SEQ_OFFSETS, "k offsets start at 2");
    PACKED();
    d.num_seqs = 3;
    oq[1] = 3, oq[2] = 2, oq[3] = 5;
    ok[1] = 1, ok[2] = 2, ok[3] = 4;
    EXPECT(&d, QKV_ERR_SEQ_OFFSETS, "q offsets decreasing");
    PACKED();
    d.num_seqs = 3;
    oq[1] = 1, oq[2] = 2, oq[3] = 5;
    ok[1] = 3, ok[2] = 1, ok[3] = 4;
    EXPECT(&d, QKV_ERR_SEQ_OFFSETS, "k offsets decreasing");
    PACKED();
    d.batch = 2;
    EXPECT(&d, QKV_ERR_SEQ_OFFSETS, "packed with batch 2");
    PACKED();
    d.num_seqs = 0;
    EXPECT(&d, QKV_ERR_SEQ_OFFSETS, "offsets given, num_seqs 0");
    PACKED();
    d.num_seqs = -1;
    EXPECT(&d, QKV_ERR_SEQ_OFFSETS, "num_seqs -1");
    PACKED();
    d.seq_offsets_k = NULL; /* n_q != n_k */
    EXPECT(&d, QKV_ERR_SEQ_OFFSETS, "k offsets NULL with n_q != n_k");
    PACKED();
    d.n_k = 5;
    d.seq_offsets_k = NULL;
    EXPECT(&d, QKV_OK, "k offsets NULL with n_q == n_k");
    /* The header allows empty sequences: nondecreasing offsets from 0 to n.
     * Three sequences over n_q = n_k = 1 ({0, 0, 1, 1}) are valid. */
    base(&d);
    d.batch = 1;
    d.n_q = d.n_k = 1;
    d.num_seqs = 3;
    oq[0] = 0, oq[1] = 0, oq[2] = 1, oq[3] = 1;
    d.seq_offsets_q = oq;
    EXPECT(&d, QKV_OK, "CONTRACT: 3 sequences (2 empty) over n = 1 are valid per qkv.h");
#undef PACKED
}

static void test_enums(void) {
    qkv_attn_desc d;
    static const int bad[] = {99, -1, 4, 1000000};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char what[64];
        base(&d);
        d.score = (qkv_score)bad[i];
        snprintf(what, sizeof what, "score %d", bad[i]);
        EXPECT(&d, QKV_ERR_BAD_ENUM, what);
        base(&d);
        d.norm = (qkv_norm)(bad[i] == 4 ? 3 : bad[i]);
        snprintf(what, sizeof what, "norm %d", (int)d.norm);
        EXPECT(&d, QKV_ERR_BAD_ENUM, what);
        base(&d);
        d.mask = (qkv_mask)bad[i];
        snprintf(what, sizeof what, "mask %d", bad[i]);
        EXPECT(&d, QKV_ERR_BAD_ENUM, what);
        base(&d);
        d.dtype = (qkv_dtype)(bad[i] == 4 ? 6 : bad[i]); /* 4, 5: QKV_BF16, QKV_F16 */
        snprintf(what, sizeof what, "dtype %d", (int)d.dtype);
        EXPECT(&d, QKV_ERR_BAD_ENUM, what);
        base(&d);
        d.bias_kind = (qkv_bias_kind)(bad[i] == 4 ? 3 : bad[i]);
        d.bias = T_BIAS;
        snprintf(what, sizeof what, "bias kind %d", (int)d.bias_kind);
        EXPECT(&d, QKV_ERR_BAD_ENUM, what);
        base(&d);
        d.impl = (qkv_impl)(bad[i] == 4 ? 3 : bad[i]);
        snprintf(what, sizeof what, "impl %d", (int)d.impl);
        EXPECT(&d, QKV_ERR_BAD_ENUM, what);
    }
    /* I32 / I64 are dtypes, only not ones attention accepts: qkv.h's
     * QKV_ERR_DTYPE is "an array has a dtype the call does not accept". */
    base(&d);
    d.dtype = QKV_I32;
    EXPECT(&d, QKV_ERR_DTYPE, "CONTRACT: attention with dtype I32");
    d.dtype = QKV_I64;
    EXPECT(&d, QKV_ERR_DTYPE, "CONTRACT: attention with dtype I64");
}

static void test_parameters(void) {
    qkv_attn_desc d;
    static const double bad_scale[] = {NAN, INFINITY, -INFINITY};
    for (int i = 0; i < 3; i++) {
        base(&d);
        d.scale = bad_scale[i];
        EXPECT(&d, QKV_ERR_BAD_PARAMETER, "scale not finite");
    }
    static const double bad_temp[] = {0.0, -0.0, -1.0, NAN, INFINITY, -INFINITY};
    for (int i = 0; i < 6; i++) {
        base(&d);
        d.score = QKV_SCORE_COSINE;
        d.temperature = bad_temp[i];
        EXPECT(&d, QKV_ERR_BAD_PARAMETER, "cosine temperature <= 0 or not finite");
    }
    static const double bad_cap[] = {-1.0, -1e-300, NAN, INFINITY, -INFINITY};
    for (int i = 0; i < 5; i++)
        for (int score = 0; score < 3; score++) {
            base(&d);
            d.score = (qkv_score)score;
            d.softcap = bad_cap[i];
            EXPECT(&d, QKV_ERR_BAD_PARAMETER, "softcap < 0 or not finite");
        }
    /* T5 relative-position table parameters. */
    base(&d);
    d.rel_table = T_W;
    d.rel_buckets = 8;
    d.rel_max_distance = 16;
    EXPECT(&d, QKV_OK, "relative table, 8 buckets");
    d.rel_buckets = 1;
    EXPECT(&d, QKV_ERR_BAD_PARAMETER, "relative table, 1 bucket");
    d.rel_buckets = 3;
    d.rel_bidirectional = 1;
    EXPECT(&d, QKV_ERR_BAD_PARAMETER, "bidirectional relative table, 3 buckets");
    d.rel_buckets = 8;
    d.rel_max_distance = 0;
    EXPECT(&d, QKV_ERR_BAD_PARAMETER, "relative table, max distance 0");
}

/* ---- allocation failure ------------------------------------------------- */

static atomic_long g_calls, g_live, g_fail_at, g_fail_from, g_bad_user;
static int g_token;

static void *counting_malloc(size_t size, void *user) {
    if (user != &g_token) atomic_fetch_add(&g_bad_user, 1);
    long c = atomic_fetch_add(&g_calls, 1) + 1;
    long at = atomic_load(&g_fail_at), from = atomic_load(&g_fail_from);
    if (c == at || (from > 0 && c >= from)) return NULL;
    void *p = malloc(size);
    if (p) atomic_fetch_add(&g_live, 1);
    return p;
}

static void counting_free(void *ptr, void *user) {
    if (user != &g_token) atomic_fetch_add(&g_bad_user, 1);
    if (ptr) atomic_fetch_sub(&g_live, 1);
    free(ptr);
}

typedef qkv_status (*call_fn)(const qkv_attn_desc *d);

static qkv_status call_forward(const qkv_attn_desc *d) {
    return qkv_attention_forward(d, T_Q, T_K, T_V, T_O, T_A, T_L);
}

static qkv_status call_backward(const qkv_attn_desc *d) {
    qkv_attn_grads g = grads_all();
    if (d->bias_kind != QKV_BIAS_NONE) g.dbias = T_DB;
    if (d->score == QKV_SCORE_ADDITIVE) {
        g.d_additive_w1 = T_DB + 1024;
        g.d_additive_w2 = T_DB + 2048;
        g.d_additive_w = T_DB + 3072;
    }
    return qkv_attention_backward(d, T_Q, T_K, T_V, NULL, NULL, T_DO, &g);
}

static qkv_status call_backward_fwd(const qkv_attn_desc *d) {
    qkv_attn_grads g = grads_all();
    return qkv_attention_backward(d, T_Q, T_K, T_V, T_O, T_L, T_DO, &g);
}

/* Fail the k-th allocation (mode 0) or every allocation from the k-th on
 * (mode 1), for k = 1, 2, ... until the call no longer needs that many. */
static void oom_sweep(const qkv_attn_desc *d, call_fn fn, const char *what) {
    for (int mode = 0; mode < 2; mode++) {
        long k;
        for (k = 1; k < 100000; k++) {
            atomic_store(&g_calls, 0);
            atomic_store(&g_live, 0);
            atomic_store(&g_fail_at, mode == 0 ? k : 0);
            atomic_store(&g_fail_from, mode == 1 ? k : 0);
            qkv_status s = fn(d);
            long calls = atomic_load(&g_calls), live = atomic_load(&g_live);
            CHECK(live == 0, "%s: %ld allocations leaked when allocation %ld fails (mode %d, status %d)", what,
                  live, k, mode, (int)s);
            if (s == QKV_OK) {
                CHECK(calls < k, "%s: success although allocation %ld of %ld failed (mode %d)", what, k, calls,
                      mode);
                break;
            }
            CHECK(s == QKV_ERR_OUT_OF_MEMORY, "%s: allocation %ld failing gives status %d (%s) (mode %d)", what,
                  k, (int)s, qkv_status_string(s), mode);
            if (s != QKV_ERR_OUT_OF_MEMORY) break;
        }
        CHECK(k < 100000, "%s: never succeeded", what);
    }
    atomic_store(&g_fail_at, 0);
    atomic_store(&g_fail_from, 0);
}

static void test_allocator(void) {
    CHECK_STATUS(qkv_set_allocator(counting_malloc, NULL, &g_token), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_set_allocator(NULL, counting_free, &g_token), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_set_allocator(counting_malloc, counting_free, &g_token), QKV_OK);

    for (int threads = 1; threads <= 3; threads += 2)
        for (int dt = 0; dt < 2; dt++) {
            qkv_attn_desc d;
            char what[96];
            base(&d);
            d.dtype = dt ? QKV_F32 : QKV_F64;
            d.threads = threads;
            snprintf(what, sizeof what, "forward %s threads %d", dt ? "f32" : "f64", threads);
            oom_sweep(&d, call_forward, what);
            snprintf(what, sizeof what, "backward %s threads %d", dt ? "f32" : "f64", threads);
            oom_sweep(&d, call_backward, what);
            snprintf(what, sizeof what, "backward (out, lse given) %s threads %d", dt ? "f32" : "f64", threads);
            oom_sweep(&d, call_backward_fwd, what);
            /* Additive score, per-head bias, packed sequences, causal. */
            int64_t oq[3] = {0, 1, 3}, ok[3] = {0, 2, 4};
            d.batch = 1;
            d.num_seqs = 2;
            d.seq_offsets_q = oq;
            d.seq_offsets_k = ok;
            d.mask = QKV_MASK_CAUSAL;
            d.score = QKV_SCORE_ADDITIVE;
            d.additive_dim = 2;
            d.additive_w1 = T_W1;
            d.additive_w2 = T_W2;
            d.additive_w = T_W;
            d.bias_kind = QKV_BIAS_PER_HEAD;
            d.bias = T_BIAS;
            d.softcap = 3.0;
            snprintf(what, sizeof what, "forward additive/bias/packed %s threads %d", dt ? "f32" : "f64", threads);
            oom_sweep(&d, call_forward, what);
            snprintf(what, sizeof what, "backward additive/bias/packed %s threads %d", dt ? "f32" : "f64", threads);
            oom_sweep(&d, call_backward, what);
            d.score = QKV_SCORE_COSINE;
            d.norm = QKV_NORM_RELU;
            d.relu_divide_by_count = 1;
            snprintf(what, sizeof what, "backward cosine/relu %s threads %d", dt ? "f32" : "f64", threads);
            oom_sweep(&d, call_backward, what);
        }
    CHECK(atomic_load(&g_bad_user) == 0, "the allocator's user pointer was not passed through");
    CHECK_STATUS(qkv_set_allocator(NULL, NULL, NULL), QKV_OK); /* default again */
    qkv_attn_desc d;
    base(&d);
    CHECK_STATUS(call_backward(&d), QKV_OK);
}

/* ---- status texts, dtype sizes, version, defaults ----------------------- */

static void test_status_strings(void) {
    /* Codes 0 .. n-1 have texts (n grows as the library does: at least the
     * sixteen of the first version). */
    enum { MAXC = 64 };
    const char *txt[MAXC];
    int n = 0;
    while (n < MAXC) {
        txt[n] = qkv_status_string((qkv_status)n);
        CHECK(txt[n] != NULL, "status %d: NULL text", n);
        if (!txt[n] || strcmp(txt[n], "unknown status") == 0) break;
        CHECK(txt[n][0] != '\0', "status %d has an empty text", n);
        n++;
    }
    CHECK(n >= 16, "only %d status codes have a text", n);
    for (int a = 0; a < n; a++)
        for (int b = a + 1; b < n; b++)
            CHECK(strcmp(txt[a], txt[b]) != 0, "statuses %d and %d share a text", a, b);
    static const int unknown[] = {99, 1000, -1, 1000000, -1000000};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        const char *t = qkv_status_string((qkv_status)unknown[i]);
        CHECK(t && strcmp(t, "unknown status") == 0, "status %d: \"%s\"", unknown[i], t ? t : "(null)");
    }
    CHECK(strcmp(qkv_status_string((qkv_status)n), "unknown status") == 0, "status %d: known", n);
    /* The pinned values. */
    CHECK(QKV_OK == 0 && QKV_ERR_NULL_POINTER == 1 && QKV_ERR_BAD_SIZE == 2 && QKV_ERR_SIZE_OVERFLOW == 3 &&
              QKV_ERR_HEADS == 4 && QKV_ERR_WINDOW == 5 && QKV_ERR_KEY_LENGTHS == 6 &&
              QKV_ERR_SEQ_OFFSETS == 7 && QKV_ERR_BAD_ENUM == 8 && QKV_ERR_BAD_PARAMETER == 9 &&
              QKV_ERR_OUT_OF_MEMORY == 10 && QKV_ERR_UNSUPPORTED == 11 && QKV_ERR_IO == 12 &&
              QKV_ERR_FORMAT == 13 && QKV_ERR_DTYPE == 14 && QKV_ERR_SHAPE == 15,
          "status values changed");
}

static void test_misc(void) {
    CHECK(qkv_dtype_size(QKV_F32) == 4, "F32 size");
    CHECK(qkv_dtype_size(QKV_F64) == 8, "F64 size");
    CHECK(qkv_dtype_size(QKV_I32) == 4, "I32 size");
    CHECK(qkv_dtype_size(QKV_I64) == 8, "I64 size");
    CHECK(qkv_dtype_size((qkv_dtype)99) == 0, "unknown dtype size");
    CHECK(qkv_dtype_size((qkv_dtype)-1) == 0, "dtype -1 size");
    CHECK(qkv_version() && strcmp(qkv_version(), QKV_VERSION_STRING) == 0, "version");

    qkv_attn_desc d;
    memset(&d, 0x5A, sizeof d);
    qkv_attn_desc_init(&d);
    CHECK(d.dtype == QKV_F32 && d.score == QKV_SCORE_SCALED_DOT && d.scale == 0.0 && d.temperature == 1.0 &&
              d.softcap == 0.0 && d.norm == QKV_NORM_SOFTMAX && d.mask == QKV_MASK_NONE &&
              d.bias_kind == QKV_BIAS_NONE && d.impl == QKV_IMPL_AUTO && d.threads == 0 && d.batch == 0 &&
              d.n_q == 0 && d.n_k == 0 && d.heads == 0 && d.dim == 0 && d.key_lengths == NULL &&
              d.seq_offsets_q == NULL && d.bias == NULL && d.additive_w1 == NULL && d.num_seqs == 0 &&
              d.relu_divide_by_count == 0,
          "qkv_attn_desc_init defaults");
    /* The defaults with sizes 0 are not a valid problem until sizes are set. */
    CHECK_STATUS(qkv_attn_desc_check(&d), QKV_ERR_BAD_SIZE);
}

int main(void) {
    buffers_make();
    test_valid_base();
    test_null_pointers();
    test_bad_sizes();
    test_overflow();
    test_heads();
    test_window();
    test_key_lengths();
    test_seq_offsets();
    test_enums();
    test_parameters();
    test_allocator();
    test_status_strings();
    test_misc();
    buffers_free();
    return tu_finish();
}
