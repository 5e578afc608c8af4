/* The BERT encoder (qkv/encoder.h) on tests/data/encoder/tiny, a tiny
 * randomly initialised BertModel written by make_tiny.py with the float64
 * outputs of transformers beside it.
 *
 * Accuracy rule: for every sentence, max_i |qkv_i - ref_i| <= 1e-5 *
 * max_i |ref_i| over that sentence's values (its token states, or its
 * pooled vector), ref the float64 reference.
 *
 * Also: the batch packed end to end equals the sentences one by one, 1 and
 * 2 threads agree bitwise, pooling and normalisation overrides, the
 * attention maps, the defaults without the sentence-transformers files, and
 * bad input (missing directory, file, field or tensor; unsupported
 * model_type, hidden_act, position_embedding_type; a mis-shaped or int32
 * tensor; no texts). */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "qkv.h"
#include "test_util.h"

#define MAX_SENT 16
#define TOL 1e-5

static char g_src[1024];
static const char *g_text[MAX_SENT];
static int g_count;
static char g_buf[4096];

static void load_sentences(void) {
    char path[1100];
    snprintf(path, sizeof path, "%s/../sentences.txt", g_src);
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL, "%s", path);
    if (!f) return;
    size_t n = fread(g_buf, 1, sizeof g_buf - 1, f);
    fclose(f);
    g_buf[n] = '\0';
    char *p = g_buf;
    while (*p && g_count < MAX_SENT) {
        char *nl = strchr(p, '\n');
        if (!nl) break;
        *nl = '\0';
        g_text[g_count++] = p;
        p = nl + 1;
    }
}

static void *load_typed(const char *name, qkv_dtype want, int64_t *rows, int64_t *cols) {
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", g_src, name);
    qkv_array a;
    char why[200];
    qkv_status s = qkv_npy_load(path, &a, why, sizeof why);
    CHECK(s == QKV_OK && a.dtype == want, "%s: %s", path, why);
    if (s != QKV_OK) return NULL;
    *rows = a.shape[0];
    *cols = a.ndim > 1 ? a.shape[1] : 1;
    return a.data; /* owned: qkv_array_free frees with the library's allocator */
}

static double *load_ref(const char *name, int64_t *rows, int64_t *cols) {
    return load_typed(name, QKV_F64, rows, cols);
}

static void free_ref(void *p) {
    qkv_array a;
    memset(&a, 0, sizeof a);
    a.data = p;
    qkv_array_free(&a);
}

static int64_t *load_i64(const char *name, int64_t *n) {
    int64_t c;
    return load_typed(name, QKV_I64, n, &c);
}

/* The rule above for rows [r0, r1) of width w; returns the relative error. */
static double rel_err(const float *x, const double *ref, int64_t r0, int64_t r1, int64_t w) {
    double d = 0, m = 0;
    for (int64_t i = r0 * w; i < r1 * w; i++) {
        double e = fabs((double)x[i] - ref[i]);
        if (e > d) d = e;
        if (fabs(ref[i]) > m) m = fabs(ref[i]);
    }
    return m > 0 ? d / m : d;
}

static double g_worst;

static void check_rows(const char *what, const float *x, const double *ref, const int64_t *off, int count, int64_t w) {
    for (int s = 0; s < count; s++) {
        int64_t r0 = off ? off[s] : s, r1 = off ? off[s + 1] : s + 1;
        double e = rel_err(x, ref, r0, r1, w);
        if (e > g_worst) g_worst = e;
        CHECK(e <= TOL, "%s, sentence %d: relative error %.3g", what, s, e);
    }
}

/* ---- accuracy on one activation --------------------------------------- */

static void check_model(const char *dir, const char *act) {
    char why[256], name[128];
    qkv_encoder *enc = NULL;
    CHECK_STATUS(qkv_encoder_load(dir, NULL, &enc, why, sizeof why), QKV_OK);
    if (!enc) {
        fprintf(stderr, "%s\n", why);
        return;
    }
    qkv_encoder_info info;
    qkv_encoder_get_info(enc, &info);
    CHECK(info.hidden == 16 && info.layers == 2 && info.heads == 4 && info.intermediate == 64, "sizes");
    CHECK(info.max_length == 24 && info.pooling == QKV_POOLING_MEAN && info.normalize == 1, "settings");

    int64_t nid, noff, rows, cols, total = 0;
    int64_t *ids = load_i64("expected_ids.npy", &nid), *roff = load_i64("expected_offsets.npy", &noff);
    snprintf(name, sizeof name, "expected_%s_states.npy", act);
    double *states = load_ref(name, &rows, &cols);
    if (!ids || !roff || !states) return;
    CHECK(noff == g_count + 1 && cols == 16 && rows == nid, "reference sizes");

    /* The tokenizer agrees with BertTokenizer's ids. */
    const qkv_tokenizer *tok = qkv_encoder_tokenizer(enc);
    for (int s = 0; s < g_count; s++) {
        int32_t buf[64];
        int64_t n = 0;
        qkv_tokenizer_encode(tok, g_text[s], strlen(g_text[s]), NULL, 0, info.max_length, buf, NULL, 64, &n, NULL, 0);
        int same = n == roff[s + 1] - roff[s];
        for (int64_t i = 0; same && i < n; i++) same = buf[i] == ids[roff[s] + i];
        CHECK(same, "ids of sentence %d", s);
    }

    /* Token states, packed and one by one; threads 1 and 2 bitwise. */
    float *x = malloc((size_t)rows * 16 * sizeof *x), *y = malloc((size_t)rows * 16 * sizeof *y);
    int64_t off[MAX_SENT + 1];
    CHECK_STATUS(qkv_encoder_token_states(enc, g_text, NULL, g_count, NULL, 0, NULL, &total, why, sizeof why),
                 QKV_ERR_BAD_SIZE);
    CHECK(total == rows, "token count %lld", (long long)total);
    CHECK_STATUS(qkv_encoder_token_states(enc, g_text, NULL, g_count, x, rows, off, &total, why, sizeof why), QKV_OK);
    for (int s = 0; s <= g_count; s++) CHECK(off[s] == roff[s], "offset %d", s);
    check_rows("token states, packed", x, states, roff, g_count, 16);
    for (int s = 0; s < g_count; s++) {
        int64_t o[2], n;
        CHECK_STATUS(qkv_encoder_token_states(enc, &g_text[s], NULL, 1, y + roff[s] * 16, rows - roff[s], o, &n, why,
                                              sizeof why), QKV_OK);
    }
    check_rows("token states, one by one", y, states, roff, g_count, 16);
    /* A short input's projections sum in another order than a long one's
     * (qkv_gemm_few_rows), so packed and one by one agree to float rounding. */
    double dmax = 0, xmax = 0;
    for (int64_t i = 0; i < rows * 16; i++) {
        double d = fabs((double)x[i] - y[i]);
        if (!(d <= dmax)) dmax = d;
        if (fabs(x[i]) > xmax) xmax = fabs(x[i]);
    }
    CHECK(dmax <= 1e-6 * xmax, "packed and one by one differ by %.3g (max |x| %.3g)", dmax, xmax);

    /* Pooling and normalisation. */
    static const char *const pools[3] = {"mean", "cls", "max"};
    float p1[MAX_SENT * 16], p2[MAX_SENT * 16];
    for (int p = 0; p < 3; p++) {
        snprintf(name, sizeof name, "expected_%s_%s.npy", act, pools[p]);
        double *ref = load_ref(name, &rows, &cols);
        if (!ref) continue;
        CHECK_STATUS(qkv_encoder_embed(enc, g_text, NULL, g_count, (qkv_pooling)p, 0, p1, why, sizeof why), QKV_OK);
        check_rows(name, p1, ref, NULL, g_count, 16);
        free_ref(ref);
    }
    snprintf(name, sizeof name, "expected_%s_embed.npy", act);
    double *ref = load_ref(name, &rows, &cols);
    CHECK_STATUS(qkv_encoder_embed(enc, g_text, NULL, g_count, QKV_POOLING_FROM_MODEL, -1, p1, why, sizeof why),
                 QKV_OK);
    if (ref) check_rows(name, p1, ref, NULL, g_count, 16);
    CHECK_STATUS(qkv_encoder_embed(enc, g_text, NULL, g_count, QKV_POOLING_MEAN, 1, p2, why, sizeof why), QKV_OK);
    CHECK(memcmp(p1, p2, sizeof(float) * 16 * (size_t)g_count) == 0, "model defaults = mean + normalize");
    for (int s = 0; s < g_count; s++) {
        double n2 = 0;
        for (int c = 0; c < 16; c++) n2 += (double)p1[s * 16 + c] * p1[s * 16 + c];
        CHECK(fabs(sqrt(n2) - 1) < 1e-6, "unit norm %d", s);
    }
    free_ref(ref);

    qkv_encoder_free(enc);
    qkv_encoder_options opt = {.threads = 2};
    CHECK_STATUS(qkv_encoder_load(dir, &opt, &enc, why, sizeof why), QKV_OK);
    CHECK_STATUS(qkv_encoder_token_states(enc, g_text, NULL, g_count, y, total, off, &total, why, sizeof why), QKV_OK);
    CHECK(memcmp(x, y, (size_t)total * 16 * sizeof *x) == 0, "2 threads differ from 1");
    CHECK_STATUS(qkv_encoder_embed(enc, g_text, NULL, g_count, QKV_POOLING_FROM_MODEL, -1, p2, why, sizeof why),
                 QKV_OK);
    CHECK(memcmp(p1, p2, sizeof(float) * 16 * (size_t)g_count) == 0, "embed: 2 threads differ from 1");
    qkv_encoder_free(enc);
    free(x);
    free(y);
    free_ref(states);
    free_ref(ids);
    free_ref(roff);
}

/* ---- attention maps ------------------------------------------------------- */

static void check_attention(const char *dir) {
    char why[256];
    qkv_encoder *enc = NULL;
    CHECK_STATUS(qkv_encoder_load(dir, NULL, &enc, why, sizeof why), QKV_OK);
    if (!enc) return;
    int64_t n = 0;
    const char *t = g_text[0];
    CHECK_STATUS(qkv_encoder_attention(enc, t, strlen(t), 1, NULL, 0, &n, why, sizeof why), QKV_ERR_BAD_SIZE);
    CHECK(n == 8, "n = %lld", (long long)n);
    CHECK_STATUS(qkv_encoder_attention(enc, t, strlen(t), 2, NULL, 0, &n, why, sizeof why), QKV_ERR_BAD_SIZE);
    CHECK(strstr(why, "layer 2") != NULL, "%s", why);
    float *a = malloc((size_t)(4 * n * n) * sizeof *a);
    for (int l = 0; l < 2; l++) {
        CHECK_STATUS(qkv_encoder_attention(enc, t, strlen(t), l, a, 4 * n * n, &n, why, sizeof why), QKV_OK);
        int rows_ok = 1, peaked = 0;
        for (int64_t r = 0; r < 4 * n; r++) {
            double sum = 0, mx = 0;
            for (int64_t j = 0; j < n; j++) {
                sum += a[r * n + j];
                if (a[r * n + j] > mx) mx = a[r * n + j];
            }
            rows_ok &= fabs(sum - 1) < 1e-5;
            peaked += mx > 2.0 / (double)n;
        }
        CHECK(rows_ok, "rows of layer %d sum to 1", l);
        CHECK(peaked > 0, "layer %d is not uniform", l);
    }
    free(a);
    qkv_encoder_free(enc);
}

/* ---- bad input ------------------------------------------------------------ */

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    *len = fread(b, 1, (size_t)n, f);
    b[*len] = '\0';
    fclose(f);
    return b;
}

static void spit(const char *path, const char *b, size_t len) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL, "%s", path);
    if (!f) return;
    fwrite(b, 1, len, f);
    fclose(f);
}

/* A copy of the tiny model (only its required files when minimal) in a
 * fresh directory of the test tmp folder; config.json with `from`
 * replaced by `to` (when from is not NULL). */
static const char *make_dir(char *dir, size_t cap, const char *name, int minimal, const char *from, const char *to) {
    static const char *const files[] = {"config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json",
                                        "modules.json", "sentence_bert_config.json", "1_Pooling/config.json"};
    char p[1400];
    tu_tmp_path(dir, cap, name);
    mkdir(dir, 0755);
    snprintf(p, sizeof p, "%s/1_Pooling", dir);
    if (!minimal) mkdir(p, 0755);
    for (size_t i = 0; i < (minimal ? 4 : sizeof files / sizeof files[0]); i++) {
        size_t len;
        snprintf(p, sizeof p, "%s/%s", g_src, files[i]);
        char *b = slurp(p, &len);
        CHECK(b != NULL, "%s", p);
        if (!b) continue;
        if (i == 0 && from) {
            char *at = strstr(b, from);
            CHECK(at != NULL, "'%s' in config.json", from);
            if (at) {
                size_t fl = strlen(from), tl = strlen(to);
                char *nb = malloc(len - fl + tl + 1);
                memcpy(nb, b, (size_t)(at - b));
                memcpy(nb + (at - b), to, tl);
                memcpy(nb + (at - b) + tl, at + fl, len - (size_t)(at - b) - fl + 1);
                free(b);
                b = nb;
                len = len - fl + tl;
            }
        }
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        spit(p, b, len);
        free(b);
    }
    return dir;
}

static void expect_refused(const char *dir, qkv_status want, const char *needle1, const char *needle2) {
    char why[300] = "";
    qkv_encoder *enc = (qkv_encoder *)1;
    CHECK_STATUS(qkv_encoder_load(dir, NULL, &enc, why, sizeof why), want);
    CHECK(enc == NULL, "out not cleared");
    CHECK(strstr(why, needle1) != NULL, "'%s' not in: %s", needle1, why);
    if (needle2) CHECK(strstr(why, needle2) != NULL, "'%s' not in: %s", needle2, why);
}

/* model.safetensors of dir rewritten with tensor `name` dropped (arr
 * NULL) or replaced by arr. */
static void edit_weights(const char *dir, const char *name, const qkv_array *arr) {
    char p[1400], why[200];
    snprintf(p, sizeof p, "%s/model.safetensors", g_src);
    qkv_safetensors *in = NULL, *out = NULL;
    CHECK_STATUS(qkv_safetensors_load(p, &in, why, sizeof why), QKV_OK);
    CHECK_STATUS(qkv_safetensors_create(&out), QKV_OK);
    if (!in || !out) return;
    for (int64_t i = 0; i < qkv_safetensors_count(in); i++) {
        const char *nm = qkv_safetensors_name(in, i);
        if (strcmp(nm, name) != 0) qkv_safetensors_put(out, nm, qkv_safetensors_get(in, nm));
        else if (arr) qkv_safetensors_put(out, nm, arr);
    }
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    CHECK_STATUS(qkv_safetensors_save(out, p), QKV_OK);
    qkv_safetensors_free(in);
    qkv_safetensors_free(out);
}

/* model.safetensors rewritten with every tensor renamed "bert." + name
 * (prefix) or converted to F16 (half). */
static void rewrite_weights(const char *dir, int prefix, int half) {
    char p[1400], why[200], nm[300];
    snprintf(p, sizeof p, "%s/model.safetensors", g_src);
    qkv_safetensors *in = NULL, *out = NULL;
    CHECK_STATUS(qkv_safetensors_load(p, &in, why, sizeof why), QKV_OK);
    CHECK_STATUS(qkv_safetensors_create(&out), QKV_OK);
    if (!in || !out) return;
    for (int64_t i = 0; i < qkv_safetensors_count(in); i++) {
        const char *name = qkv_safetensors_name(in, i);
        snprintf(nm, sizeof nm, "%s%s", prefix ? "bert." : "", name);
        qkv_array h;
        if (half && qkv_array_convert(qkv_safetensors_get(in, name), QKV_F16, &h) == QKV_OK) {
            CHECK_STATUS(qkv_safetensors_put(out, nm, &h), QKV_OK);
            qkv_array_free(&h);
        } else {
            CHECK_STATUS(qkv_safetensors_put(out, nm, qkv_safetensors_get(in, name)), QKV_OK);
        }
    }
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    CHECK_STATUS(qkv_safetensors_save(out, p), QKV_OK);
    qkv_safetensors_free(in);
    qkv_safetensors_free(out);
}

/* The weights are mapped, not copied; a "bert." prefix gives the same
 * bits; an F16 checkpoint is widened once and stays close. */
static void check_weights(void) {
    char dir[1024], why[256];
    float a[MAX_SENT * 16], b[MAX_SENT * 16];
    qkv_encoder *enc = NULL;
    size_t before = qkv_memory_in_use();
    make_dir(dir, sizeof dir, "enc_mapped", 1, NULL, NULL); /* the file transformers wrote */
    CHECK_STATUS(qkv_encoder_load(dir, NULL, &enc, why, sizeof why), QKV_OK);
    size_t held = qkv_memory_in_use() - before;
    CHECK(held < 40000, "the encoder holds %zu bytes after load: weights copied?", held); /* 46 KB of weights */
    CHECK_STATUS(qkv_encoder_embed(enc, g_text, NULL, g_count, QKV_POOLING_MEAN, 0, a, why, sizeof why), QKV_OK);
    qkv_encoder_free(enc);

    make_dir(dir, sizeof dir, "enc_prefix", 1, NULL, NULL);
    rewrite_weights(dir, 1, 0);
    CHECK_STATUS(qkv_encoder_load(dir, NULL, &enc, why, sizeof why), QKV_OK);
    CHECK_STATUS(qkv_encoder_embed(enc, g_text, NULL, g_count, QKV_POOLING_MEAN, 0, b, why, sizeof why), QKV_OK);
    CHECK(memcmp(a, b, sizeof(float) * 16 * (size_t)g_count) == 0, "bert. prefix changes the result");
    qkv_encoder_free(enc);

    make_dir(dir, sizeof dir, "enc_f16", 1, NULL, NULL);
    rewrite_weights(dir, 0, 1);
    CHECK_STATUS(qkv_encoder_load(dir, NULL, &enc, why, sizeof why), QKV_OK);
    CHECK_STATUS(qkv_encoder_embed(enc, g_text, NULL, g_count, QKV_POOLING_MEAN, 0, b, why, sizeof why), QKV_OK);
    double d = 0, m = 0;
    for (int i = 0; i < 16 * g_count; i++) {
        if (fabs((double)a[i] - b[i]) > d) d = fabs((double)a[i] - b[i]);
        if (fabs(a[i]) > m) m = fabs(a[i]);
    }
    CHECK(d <= 2e-2 * m, "F16 weights: relative difference %.3g", d / m);
    qkv_encoder_free(enc);
}

static void check_bad_input(void) {
    char dir[1024], why[300];
    qkv_encoder *enc = NULL;
    CHECK_STATUS(qkv_encoder_load(NULL, NULL, &enc, why, sizeof why), QKV_ERR_NULL_POINTER);
    expect_refused("/nonexistent/qkv-model", QKV_ERR_IO, "/nonexistent/qkv-model", NULL);
    for (int p = -1; p <= 7; p += 4) { /* -1, 3, 7: not precisions */
        qkv_encoder_options o = {.precision = p};
        CHECK_STATUS(qkv_encoder_load(g_src, &o, &enc, why, sizeof why), QKV_ERR_BAD_ENUM);
        CHECK(enc == NULL && strstr(why, "precision") != NULL, "precision %d refused, naming it: %s", p, why);
    }

    make_dir(dir, sizeof dir, "enc_roberta", 1, "\"model_type\": \"bert\"", "\"model_type\": \"roberta\"");
    expect_refused(dir, QKV_ERR_UNSUPPORTED, "model_type", "roberta");
    make_dir(dir, sizeof dir, "enc_swish", 1, "\"hidden_act\": \"gelu\"", "\"hidden_act\": \"swish\"");
    expect_refused(dir, QKV_ERR_UNSUPPORTED, "hidden_act", "swish");
    make_dir(dir, sizeof dir, "enc_relpos", 1, "\"absolute\"", "\"relative_key\"");
    expect_refused(dir, QKV_ERR_UNSUPPORTED, "position_embedding_type", "relative_key");
    make_dir(dir, sizeof dir, "enc_nolayers", 1, "\"num_hidden_layers\": 2,", "");
    expect_refused(dir, QKV_ERR_FORMAT, "num_hidden_layers", "missing");
    make_dir(dir, sizeof dir, "enc_badjson", 1, "\"hidden_size\": 16,", "\"hidden_size\": 16,,");
    expect_refused(dir, QKV_ERR_FORMAT, "config.json", NULL);
    make_dir(dir, sizeof dir, "enc_strsize", 1, "\"hidden_size\": 16", "\"hidden_size\": \"16\"");
    expect_refused(dir, QKV_ERR_FORMAT, "hidden_size", NULL);

    make_dir(dir, sizeof dir, "enc_novocab", 1, NULL, NULL);
    char p[1100];
    snprintf(p, sizeof p, "%s/vocab.txt", dir);
    remove(p);
    expect_refused(dir, QKV_ERR_IO, "vocab.txt", NULL);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    remove(p);
    expect_refused(dir, QKV_ERR_IO, "model.safetensors", NULL);

    make_dir(dir, sizeof dir, "enc_missing", 1, NULL, NULL);
    edit_weights(dir, "encoder.layer.1.output.dense.bias", NULL);
    expect_refused(dir, QKV_ERR_FORMAT, "encoder.layer.1.output.dense.bias", "missing");

    qkv_array a;
    memset(&a, 0, sizeof a);
    float w[16 * 17];
    memset(w, 0, sizeof w);
    a.dtype = QKV_F32;
    a.ndim = 2;
    a.shape[0] = 16;
    a.shape[1] = 17;
    a.data = w;
    make_dir(dir, sizeof dir, "enc_shape", 1, NULL, NULL);
    edit_weights(dir, "encoder.layer.0.attention.self.key.weight", &a);
    expect_refused(dir, QKV_ERR_SHAPE, "encoder.layer.0.attention.self.key.weight", "[16, 17]");
    a.dtype = QKV_I32;
    a.ndim = 1;
    a.shape[0] = 16;
    make_dir(dir, sizeof dir, "enc_int", 1, NULL, NULL);
    edit_weights(dir, "embeddings.LayerNorm.bias", &a);
    expect_refused(dir, QKV_ERR_DTYPE, "embeddings.LayerNorm.bias", "I32");

    /* Defaults without the sentence-transformers files. */
    make_dir(dir, sizeof dir, "enc_plain", 1, NULL, NULL);
    CHECK_STATUS(qkv_encoder_load(dir, NULL, &enc, why, sizeof why), QKV_OK);
    qkv_encoder_info info;
    qkv_encoder_get_info(enc, &info);
    CHECK(info.pooling == QKV_POOLING_MEAN && info.normalize == 0 && info.max_length == 40, "defaults");
    float out[16];
    int64_t n;
    CHECK_STATUS(qkv_encoder_embed(enc, g_text, NULL, 0, QKV_POOLING_MEAN, 0, out, why, sizeof why), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_encoder_embed(enc, NULL, NULL, 1, QKV_POOLING_MEAN, 0, out, why, sizeof why),
                 QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_encoder_embed(enc, g_text, NULL, 1, (qkv_pooling)7, 0, out, why, sizeof why), QKV_ERR_BAD_ENUM);
    CHECK_STATUS(qkv_encoder_token_states(enc, g_text, NULL, 0, NULL, 0, NULL, &n, why, sizeof why), QKV_ERR_BAD_SIZE);
    const char *bad[1] = {"caf\xc3"};
    CHECK_STATUS(qkv_encoder_embed(enc, bad, NULL, 1, QKV_POOLING_MEAN, 0, out, why, sizeof why), QKV_ERR_FORMAT);
    CHECK(strstr(why, "text 0") != NULL, "%s", why);
    /* In a batch (tokenized in groups of texts on the threads) the error
     * names the first text that has one, past the first group too. */
    enum { NB = 300 };
    const char *many[NB];
    size_t lens[NB];
    float *outs = malloc((size_t)NB * 16 * sizeof *outs);
    for (int i = 0; i < NB; i++) {
        many[i] = g_text[i % g_count];
        lens[i] = strlen(many[i]);
    }
    many[150] = "caf\xc3";
    lens[150] = 4;
    many[200] = NULL;
    lens[200] = 3;
    CHECK_STATUS(qkv_encoder_embed(enc, many, lens, NB, QKV_POOLING_MEAN, 0, outs, why, sizeof why), QKV_ERR_FORMAT);
    CHECK(strstr(why, "text 150") != NULL, "%s", why);
    many[150] = g_text[0];
    lens[150] = strlen(g_text[0]);
    CHECK_STATUS(qkv_encoder_embed(enc, many, lens, NB, QKV_POOLING_MEAN, 0, outs, why, sizeof why),
                 QKV_ERR_NULL_POINTER);
    CHECK(strstr(why, "text 200 is NULL") != NULL, "%s", why);
    free(outs);
    qkv_encoder_free(enc);
    qkv_encoder_free(NULL);
}

/* ---- chunks and the pooling file ------------------------------------------ */

static void check_chunks_and_pooling(void) {
    char why[256], dir[1024], p[1200];
    qkv_encoder *enc = NULL;
    enum { N = 600 }; /* 600 sentences of up to 24 tokens: more than one chunk of 4096 */
    const char **texts = malloc(N * sizeof *texts);
    float *all = malloc((size_t)N * 16 * sizeof *all), one[16];
    for (int i = 0; i < N; i++) texts[i] = g_text[i % g_count];
    CHECK_STATUS(qkv_encoder_load(g_src, NULL, &enc, why, sizeof why), QKV_OK);
    int64_t tokens = 0;
    CHECK_STATUS(qkv_encoder_token_states(enc, texts, NULL, N, NULL, 0, NULL, &tokens, why, sizeof why),
                 QKV_ERR_BAD_SIZE);
    CHECK(tokens > 4096, "%lld tokens: one chunk only", (long long)tokens);
    CHECK_STATUS(qkv_encoder_embed(enc, texts, NULL, N, QKV_POOLING_MAX, 1, all, why, sizeof why), QKV_OK);
    double worst = 0;
    for (int i = 0; i < g_count; i++) {
        qkv_encoder_embed(enc, &g_text[i], NULL, 1, QKV_POOLING_MAX, 1, one, why, sizeof why);
        for (int r = i; r < N; r += g_count)
            for (int c = 0; c < 16; c++) {
                double d = fabs((double)one[c] - all[r * 16 + c]);
                if (!(d <= worst)) worst = d;
            }
    }
    CHECK(worst <= 1e-6, "a batch of several chunks differs from one by one by %.3g (unit vectors)", worst);
    qkv_encoder_free(enc);
    free(texts);
    free(all);

    static const char *const cfgs[3] = {
        "{\"pooling_mode_max_tokens\": true, \"pooling_mode_mean_tokens\": false}",
        "{\"pooling_mode_cls_token\": true, \"pooling_mode_mean_tokens\": true}",
        "{\"pooling_mode_mean_sqrt_len_tokens\": true}"};
    for (int c = 0; c < 3; c++) {
        make_dir(dir, sizeof dir, c == 0 ? "enc_pool_max" : c == 1 ? "enc_pool_two" : "enc_pool_sqrt", 0, NULL, NULL);
        snprintf(p, sizeof p, "%s/1_Pooling/config.json", dir);
        spit(p, cfgs[c], strlen(cfgs[c]));
        if (c == 0) {
            CHECK_STATUS(qkv_encoder_load(dir, NULL, &enc, why, sizeof why), QKV_OK);
            qkv_encoder_info info;
            qkv_encoder_get_info(enc, &info);
            CHECK(info.pooling == QKV_POOLING_MAX && info.normalize == 1, "max pooling from the file");
            qkv_encoder_free(enc);
        } else {
            expect_refused(dir, QKV_ERR_UNSUPPORTED, "1_Pooling/config.json", c == 1 ? "more than one" : "sqrt_len");
        }
    }
}

/* ---- allocation failures: every one reported, nothing leaked ------------ */

static long g_live, g_calls, g_fail_at;

static void *fail_malloc(size_t n, void *user) {
    (void)user;
    if (++g_calls == g_fail_at) return NULL;
    void *p = malloc(n);
    if (p) g_live++;
    return p;
}

static void fail_free(void *p, void *user) {
    (void)user;
    g_live--;
    free(p);
}

static void check_alloc_failures(void) {
    qkv_encoder_options opt = {.threads = 1};
    int done = 0;
    for (long k = 1; k < 100000 && !done; k++) {
        char why[256];
        qkv_encoder *enc = NULL;
        float out[MAX_SENT * 16];
        g_calls = 0;
        g_fail_at = k;
        g_live = 0;
        qkv_set_allocator(fail_malloc, fail_free, NULL);
        qkv_status s = qkv_encoder_load(g_src, &opt, &enc, why, sizeof why);
        if (s == QKV_OK) s = qkv_encoder_embed(enc, g_text, NULL, g_count, QKV_POOLING_FROM_MODEL, -1, out, why,
                                               sizeof why);
        qkv_encoder_free(enc);
        done = g_calls < k; /* no allocation failed: all of them were tried */
        CHECK(done ? s == QKV_OK : s == QKV_ERR_OUT_OF_MEMORY, "allocation %ld fails: %s (%s)", k,
              qkv_status_string(s), why);
        CHECK(g_live == 0, "allocation %ld fails: %ld blocks leaked", k, g_live);
        qkv_set_allocator(NULL, NULL, NULL);
    }
    CHECK(done, "allocation failures did not end");
}

int main(void) {
    const char *src = getenv("QKV_SOURCE_DIR");
    snprintf(g_src, sizeof g_src, "%s/tests/data/encoder/tiny", src && *src ? src : ".");
    load_sentences();
    CHECK(g_count >= 4, "sentences");
    check_model(g_src, "gelu");
    char dir[1024];
    check_model(make_dir(dir, sizeof dir, "enc_gelu_new", 0, "\"hidden_act\": \"gelu\"", "\"hidden_act\": \"gelu_new\""),
                "gelu_new");
    check_model(make_dir(dir, sizeof dir, "enc_relu", 0, "\"hidden_act\": \"gelu\"", "\"hidden_act\": \"relu\""),
                "relu");
    check_attention(g_src);
    check_weights();
    check_chunks_and_pooling();
    check_alloc_failures();
    check_bad_input();
    printf("largest relative error against float64: %.3g (allowed %.0e)\n", g_worst, TOL);
    return tu_finish();
}
