/* qkv's encoder (qkv/encoder.h) against sentence-transformers on the real
 * all-MiniLM-L6-v2, which scripts/fetch-model.sh puts in
 * models/all-MiniLM-L6-v2 (or $QKV_MODEL_DIR). The model is not in the
 * repository: without it this test fails, saying how to get it.
 *
 * tests/data/minilm/make_reference.py wrote, for each line of
 * sentences.txt, the ids sentence-transformers' tokenizer gives it
 * (token_ids.txt, truncated at max_seq_length 256) and its sentence vector
 * from SentenceTransformer.encode() (embeddings.npy, float32 [n, 384]).
 *
 * Checks: the model's sizes and settings; the ids of every sentence equal
 * token_ids.txt exactly; for every sentence, cosine(qkv, reference) >=
 * 0.99999 and max |qkv - reference| <= 1e-4 (the worst of each is
 * printed); the vectors have unit length; and the weights are mapped, not
 * read: the resident memory grows by far less than model.safetensors'
 * size while loading (Linux: /proc/self/statm).
 *
 * The bf16 and int8 encoders (QKV_ENCODER_BF16, QKV_ENCODER_INT8) against
 * the same reference: cosine >= 0.9999 (bf16), >= 0.99 (int8) for every
 * sentence; the ranking of all pairwise similarities
 * kept (Spearman >= 0.99 over the n (n - 1) / 2 pairs); the nearest
 * neighbour kept for every sentence whose reference nearest neighbour
 * leads its second by more than 0.01 in cosine (the few with closer
 * ties may swap; the count kept of all is printed); the same bits on 1
 * and 2 threads.
 *
 * The same checks on retrieval.txt (100 pairs of paraphrases, 200 plain
 * sentences; reference retrieval_embeddings.npy from the same script),
 * where the bf16 and int8 encoders must also keep the nearest neighbour
 * of at least 99% of the sentences (docs/ENCODER.md, "Precision"). */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "qkv.h"
#include "similarity.h"
#include "test_util.h"

#define HIDDEN 384
#define MIN_COSINE 0.99999
#define MAX_ABS 1e-4

/* A file's bytes split at '\n' into lines (the last newline ends the last
 * line); 0 with a failed CHECK when it cannot be read. */
typedef struct lines {
    char *buf;
    char **line;
    size_t *len;
    int count;
} lines;

static int read_lines(const char *path, lines *out) {
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL, "cannot open %s", path);
    if (!f) return 0;
    long size = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    char *buf = size >= 0 && fseek(f, 0, SEEK_SET) == 0 ? malloc((size_t)size + 1) : NULL;
    size_t n = buf ? fread(buf, 1, (size_t)size, f) : 0;
    fclose(f);
    if (buf && n != (size_t)size) {
        free(buf);
        buf = NULL;
    }
    CHECK(buf != NULL, "cannot read %s", path);
    if (!buf) return 0;
    buf[n] = '\0';
    int count = 0;
    for (size_t i = 0; i < n; i++) count += buf[i] == '\n';
    CHECK(n > 0 && buf[n - 1] == '\n', "%s does not end with a newline", path);
    out->buf = buf;
    out->line = malloc(((size_t)count + 1) * sizeof *out->line);
    out->len = malloc(((size_t)count + 1) * sizeof *out->len);
    CHECK(out->line && out->len, "out of memory reading %s", path);
    if (!out->line || !out->len) return 0;
    char *p = buf;
    for (int i = 0; i < count; i++) {
        char *nl = memchr(p, '\n', (size_t)(buf + n - p));
        *nl = '\0';
        out->line[i] = p;
        out->len[i] = (size_t)(nl - p);
        p = nl + 1;
    }
    out->count = count;
    return 1;
}

static void free_lines(lines *l) {
    free(l->buf);
    free(l->line);
    free(l->len);
}

/* Resident memory in bytes (the second field of /proc/self/statm), -1 when
 * it cannot be read. */
static double resident_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return -1;
    long size = 0, res = -1;
    int ok = fscanf(f, "%ld %ld", &size, &res) == 2;
    fclose(f);
    return ok ? (double)res * (double)sysconf(_SC_PAGESIZE) : -1;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The ids of every sentence against token_ids.txt. */
static void check_ids(const qkv_tokenizer *tok, int64_t max_len, const lines *text, const lines *ref) {
    CHECK(ref->count == text->count, "token_ids.txt has %d lines, sentences.txt %d", ref->count, text->count);
    int bad = 0;
    for (int s = 0; s < text->count && s < ref->count; s++) {
        int32_t ids[512];
        int64_t n = 0;
        char why[256] = "";
        qkv_status st = qkv_tokenizer_encode(tok, text->line[s], text->len[s], NULL, 0, max_len, ids, NULL, 512, &n,
                                             why, sizeof why);
        CHECK(st == QKV_OK, "sentence %d: qkv_tokenizer_encode: %s", s + 1, why);
        if (st != QKV_OK) continue;
        /* Compare with the reference line's ids, one by one. */
        const char *p = ref->line[s];
        int64_t i = 0;
        int same = 1;
        while (*p) {
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p) {
                same = 0;
                break;
            }
            if (i >= n || ids[i] != v) same = 0;
            i++;
            p = end;
            while (*p == ' ') p++;
        }
        if (i != n) same = 0;
        CHECK(same, "sentence %d (\"%.40s...\"): %lld ids, which differ from token_ids.txt's line (%lld ids)", s + 1,
              text->line[s], (long long)n, (long long)i);
        bad += !same;
    }
    printf("token ids: %d of %d sentences equal sentence-transformers'\n", text->count - bad, text->count);
}

/* Sentence vectors against embeddings.npy. */
/* A precision other than FP32 (named `name`) against the reference r [n,
 * HIDDEN]: every sentence's cosine >= min_cos, the similarities' ranking,
 * the nearest neighbours, 1 against 2 threads. */
static void check_precision(const char *dir, const lines *text, const float *r, int precision, const char *name,
                            double min_cos, int min_kept) {
    int n = text->count;
    qkv_encoder *e1 = NULL, *e2 = NULL;
    char why[512] = "";
    qkv_encoder_options o1 = {.threads = 1, .precision = precision}, o2 = {.threads = 2, .precision = precision};
    CHECK(qkv_encoder_load(dir, &o1, &e1, why, sizeof why) == QKV_OK, "%s load: %s", name, why);
    CHECK(qkv_encoder_load(dir, &o2, &e2, why, sizeof why) == QKV_OK, "%s load: %s", name, why);
    float *q = malloc((size_t)n * HIDDEN * sizeof *q), *q1 = malloc((size_t)n * HIDDEN * sizeof *q1);
    const char **texts = malloc((size_t)n * sizeof *texts);
    if (!e1 || !e2 || !q || !q1 || !texts) goto done;
    qkv_encoder_info info;
    qkv_encoder_get_info(e2, &info);
    CHECK(info.precision == precision, "%s: info.precision %d", name, info.precision);
    for (int s = 0; s < n; s++) texts[s] = text->line[s];
    CHECK(qkv_encoder_embed(e2, texts, text->len, n, QKV_POOLING_FROM_MODEL, -1, q, why, sizeof why) == QKV_OK,
          "%s embed: %s", name, why);
    CHECK(qkv_encoder_embed(e1, texts, text->len, n, QKV_POOLING_FROM_MODEL, -1, q1, why, sizeof why) == QKV_OK,
          "%s embed: %s", name, why);
    CHECK(memcmp(q, q1, (size_t)n * HIDDEN * sizeof *q) == 0, "%s: the same bits on 1 and 2 threads", name);
    for (int s = 0; s < n; s++) {
        double c = sim_cosine(q + (size_t)s * HIDDEN, r + (size_t)s * HIDDEN, HIDDEN);
        CHECK(c >= min_cos, "%s sentence %d: cosine %.7f < %g", name, s + 1, c, min_cos);
    }
    sim_agreement g;
    CHECK(sim_agree(q, r, n, HIDDEN, 0.01, &g) == 0, "%s: out of memory comparing the vectors", name);
    CHECK(g.rho >= 0.99, "%s: Spearman %.5f of the %lld pairwise similarities < 0.99", name, g.rho,
          (long long)g.pairs);
    CHECK(g.clear_lost == 0, "%s: %d sentences lose a nearest neighbour that leads by more than 0.01", name,
          g.clear_lost);
    CHECK(g.kept >= min_kept, "%s: the nearest neighbour kept for %d of %d sentences, fewer than %d", name, g.kept, n,
          min_kept);
    printf("%s: worst cosine %.7f (sentence %d), Spearman %.5f over %lld pairs, nearest neighbour kept for %d of %d\n",
           name, g.worst_cosine, g.worst_at + 1, g.rho, (long long)g.pairs, g.kept, n);
done:
    qkv_encoder_free(e1);
    qkv_encoder_free(e2);
    free(q);
    free(q1);
    free(texts);
}

/* The float32 vectors of `text` against the reference in npy, then the
 * bf16 and int8 ones (check_precision), which must keep the nearest
 * neighbour of at least min_kept sentences. */
static void check_embeddings(const char *dir, qkv_encoder *enc, const lines *text, const char *npy, int min_kept) {
    qkv_array ref;
    char why[256] = "";
    qkv_status st = qkv_npy_load(npy, &ref, why, sizeof why);
    CHECK(st == QKV_OK, "%s: %s", npy, why);
    if (st != QKV_OK) return;
    int n = text->count;
    CHECK(ref.dtype == QKV_F32 && ref.ndim == 2 && ref.shape[0] == n && ref.shape[1] == HIDDEN,
          "%s: want float32 [%d, %d]", npy, n, HIDDEN);
    if (!(ref.dtype == QKV_F32 && ref.ndim == 2 && ref.shape[0] == n && ref.shape[1] == HIDDEN)) {
        qkv_array_free(&ref);
        return;
    }
    const float *r = ref.data;
    float *out = malloc((size_t)n * HIDDEN * sizeof *out);
    const char **texts = malloc((size_t)n * sizeof *texts);
    CHECK(out && texts, "out of memory");
    if (!out || !texts) {
        free(out);
        free(texts);
        qkv_array_free(&ref);
        return;
    }
    for (int s = 0; s < n; s++) texts[s] = text->line[s];
    double t0 = now_s();
    st = qkv_encoder_embed(enc, texts, text->len, n, QKV_POOLING_FROM_MODEL, -1, out, why, sizeof why);
    double t1 = now_s();
    CHECK(st == QKV_OK, "qkv_encoder_embed: %s", why);
    if (st == QKV_OK) {
        double worst_cos = 2, worst_abs = 0;
        int at_cos = -1, at_abs = -1;
        for (int s = 0; s < n; s++) {
            const float *x = out + (size_t)s * HIDDEN, *y = r + (size_t)s * HIDDEN;
            double dot = 0, xx = 0, yy = 0, mx = 0;
            for (int c = 0; c < HIDDEN; c++) {
                dot += (double)x[c] * y[c];
                xx += (double)x[c] * x[c];
                yy += (double)y[c] * y[c];
                double d = fabs((double)x[c] - (double)y[c]);
                if (!(d <= mx)) mx = d; /* a NaN sticks */
            }
            double cosine = dot / sqrt(xx * yy);
            CHECK(cosine >= MIN_COSINE, "sentence %d: cosine %.9f < %.5f", s + 1, cosine, MIN_COSINE);
            CHECK(mx <= MAX_ABS, "sentence %d: max abs difference %.3g > %.0e", s + 1, mx, MAX_ABS);
            CHECK(fabs(sqrt(xx) - 1) < 1e-5, "sentence %d: |qkv vector| = %.7f, not 1", s + 1, sqrt(xx));
            if (!(cosine >= worst_cos)) {
                worst_cos = cosine;
                at_cos = s + 1;
            }
            if (!(mx <= worst_abs)) {
                worst_abs = mx;
                at_abs = s + 1;
            }
        }
        printf("%s: %d sentences in %.3f s: worst cosine %.9f = 1 - %.2g (sentence %d), worst max abs "
               "difference %.3g (sentence %d)\n",
               npy, n, t1 - t0, worst_cos, 1 - worst_cos, at_cos, worst_abs, at_abs);
    }
    check_precision(dir, text, r, QKV_ENCODER_BF16, "bf16", 0.9999, min_kept);
    check_precision(dir, text, r, QKV_ENCODER_INT8, "int8", 0.99, min_kept);
    free(out);
    free(texts);
    qkv_array_free(&ref);
}

int main(void) {
    const char *src = getenv("QKV_SOURCE_DIR");
    if (!src) src = ".";
    char dir[1200], path[1400], data[1200];
    const char *env_dir = getenv("QKV_MODEL_DIR");
    if (env_dir && *env_dir)
        snprintf(dir, sizeof dir, "%s", env_dir);
    else
        snprintf(dir, sizeof dir, "%s/models/all-MiniLM-L6-v2", src);
    snprintf(data, sizeof data, "%s/tests/data/minilm", src);

    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    struct stat st_model;
    if (stat(path, &st_model) != 0) {
        CHECK(0, "all-MiniLM-L6-v2 is not in %s: run scripts/fetch-model.sh (or set QKV_MODEL_DIR to the model's "
                 "directory)",
              dir);
        return tu_finish();
    }

    lines text, ref_ids;
    snprintf(path, sizeof path, "%s/sentences.txt", data);
    int ok = read_lines(path, &text);
    snprintf(path, sizeof path, "%s/token_ids.txt", data);
    ok = read_lines(path, &ref_ids) && ok;

    /* Load, measuring the resident memory it adds and its wall time. */
    char why[512] = "";
    qkv_encoder *enc = NULL;
    double rss0 = resident_bytes(), t0 = now_s();
    qkv_status s = qkv_encoder_load(dir, NULL, &enc, why, sizeof why);
    double t1 = now_s(), rss1 = resident_bytes();
    CHECK(s == QKV_OK, "qkv_encoder_load(%s): %s", dir, why);
    if (s != QKV_OK || !ok) {
        qkv_encoder_free(enc);
        free_lines(&text);
        free_lines(&ref_ids);
        return tu_finish();
    }
    double file_mb = (double)st_model.st_size / 1e6;
    CHECK(rss0 > 0 && rss1 > 0, "cannot read the resident memory (/proc/self/statm)");
    if (rss0 > 0 && rss1 > 0) {
        double added = (rss1 - rss0) / 1e6;
        printf("load: %.1f ms, resident memory %.1f MB after (+%.1f MB; model.safetensors is %.1f MB)\n",
               1e3 * (t1 - t0), rss1 / 1e6, added, file_mb);
        /* Read into memory, the weights alone would add the file's size. */
        CHECK(added < file_mb / 4, "loading added %.1f MB of resident memory: the weights (%.1f MB) are not mapped",
              added, file_mb);
    }

    qkv_encoder_info info;
    qkv_encoder_get_info(enc, &info);
    CHECK(info.hidden == HIDDEN && info.layers == 6 && info.heads == 12 && info.intermediate == 1536 &&
              info.vocab_size == 30522 && info.max_positions == 512 && info.type_vocab_size == 2,
          "sizes: hidden %lld, layers %lld, heads %lld, intermediate %lld", (long long)info.hidden,
          (long long)info.layers, (long long)info.heads, (long long)info.intermediate);
    CHECK(info.max_length == 256 && info.pooling == QKV_POOLING_MEAN && info.normalize == 1 && info.hidden_act == 0 &&
              info.layer_norm_eps == 1e-12,
          "settings: max_length %lld, pooling %d, normalize %d, hidden_act %d, eps %g", (long long)info.max_length,
          (int)info.pooling, info.normalize, info.hidden_act, info.layer_norm_eps);

    check_ids(qkv_encoder_tokenizer(enc), info.max_length, &text, &ref_ids);
    snprintf(path, sizeof path, "%s/embeddings.npy", data);
    check_embeddings(dir, enc, &text, path, 0);
    lines retrieval;
    snprintf(path, sizeof path, "%s/retrieval.txt", data);
    if (read_lines(path, &retrieval)) {
        CHECK(retrieval.count == 200, "retrieval.txt has %d lines, not 200", retrieval.count);
        snprintf(path, sizeof path, "%s/retrieval_embeddings.npy", data);
        check_embeddings(dir, enc, &retrieval, path, (99 * retrieval.count + 99) / 100);
        free_lines(&retrieval);
    }
    double rss2 = resident_bytes();
    if (rss2 > 0) printf("resident memory after embedding: %.1f MB\n", rss2 / 1e6);

    qkv_encoder_free(enc);
    free_lines(&text);
    free_lines(&ref_ids);
    CHECK(qkv_memory_in_use() == 0, "%zu bytes still allocated after qkv_encoder_free", qkv_memory_in_use());
    return tu_finish();
}
