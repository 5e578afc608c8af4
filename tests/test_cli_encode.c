/* `qkv embed` and `qkv tokenize` against transformers: runs the qkv program
 * ($QKV_CLI, set by tests/CMakeLists.txt) on the tiny BERT model of
 * tests/data/encoder/tiny and the sentences of tests/data/encoder/sentences.txt
 * (one of them the empty line), and compares what it writes with the float64
 * outputs of transformers that tests/data/encoder/make_tiny.py stored there:
 * pooled vectors (every pooling, normalised or not) and token states within
 * the bound of tests/test_encoder.c (max |qkv - ref| <= 1e-5 max |ref| per
 * sentence), the offsets and the token ids exactly. It also checks that
 * neither --batch nor --threads changes a bit of the output. */
#define _POSIX_C_SOURCE 200809L /* popen */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qkv.h"
#include "test_util.h"

#define TOL 1e-5
#define SENTENCES 6 /* lines of sentences.txt */

static const char *cli;
static char model[1024], sentences[1024], ref_dir[1024], out_dir[1024];

/* Run `qkv <args>` through the shell; args are formatted. 1 when it exits 0. */
static int qkv_ok(const char *fmt, ...) {
    char line[6144];
    int at = snprintf(line, sizeof line, "'%s' ", cli);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + at, sizeof line - (size_t)at, fmt, ap);
    va_end(ap);
    int rc = system(line);
    CHECK(rc == 0, "%s: exit status %d", line, rc);
    return rc == 0;
}

/* out_dir/name or ref_dir/name in one of a few static buffers. */
static const char *path_in(const char *dir, const char *name) {
    static char bufs[6][1400];
    static unsigned next;
    char *b = bufs[next++ % 6];
    snprintf(b, sizeof bufs[0], "%s/%s", dir, name);
    return b;
}

/* Load a .npy as dtype `as`; 1 on success (a failure is a counted check). */
static int load_as(const char *path, qkv_dtype as, qkv_array *a) {
    char why[256] = "";
    qkv_array raw;
    memset(a, 0, sizeof *a);
    qkv_status s = qkv_npy_load(path, &raw, why, sizeof why);
    CHECK(s == QKV_OK, "%s: %s", path, why);
    if (s != QKV_OK) return 0;
    if (raw.dtype == as) {
        *a = raw;
        return 1;
    }
    s = qkv_array_convert(&raw, as, a);
    qkv_array_free(&raw);
    CHECK(s == QKV_OK, "%s: convert: %s", path, qkv_status_string(s));
    return s == QKV_OK;
}

/* The float32 file `got` (under out_dir) against the float64 reference
 * `want` (under ref_dir): same shape, and per sentence (its rows: offsets,
 * or one row each when off is NULL) within TOL of the reference's largest
 * magnitude. */
static void compare_rows(const char *got, const char *want, const int64_t *off) {
    qkv_array g, w;
    if (!load_as(path_in(out_dir, got), QKV_F32, &g)) return;
    if (load_as(path_in(ref_dir, want), QKV_F64, &w)) {
        int same_shape = g.ndim == 2 && w.ndim == 2 && g.shape[0] == w.shape[0] && g.shape[1] == w.shape[1];
        CHECK(same_shape, "%s: shape [%lld, %lld], want that of %s [%lld, %lld]", got, (long long)g.shape[0],
              (long long)(g.ndim > 1 ? g.shape[1] : 0), want, (long long)w.shape[0],
              (long long)(w.ndim > 1 ? w.shape[1] : 0));
        if (same_shape) {
            const float *x = g.data;
            const double *r = w.data;
            int64_t h = g.shape[1];
            for (int s = 0; s < SENTENCES; s++) {
                int64_t r0 = off ? off[s] : s, r1 = off ? off[s + 1] : s + 1;
                double err = 0.0, big = 0.0;
                for (int64_t i = r0 * h; i < r1 * h; i++) {
                    double d = fabs((double)x[i] - r[i]);
                    if (!(d <= err)) err = d; /* NaN sticks */
                    if (fabs(r[i]) > big) big = fabs(r[i]);
                }
                CHECK(err <= TOL * big, "%s against %s, sentence %d: error %.3g, allowed %.3g", got, want, s, err,
                      TOL * big);
            }
        }
        qkv_array_free(&w);
    }
    qkv_array_free(&g);
}

/* Two outputs under out_dir of the same shape: the same bytes (rel = 0),
 * or within rel * max |a| of each other. */
static void same_values(const char *a, const char *b, double rel) {
    qkv_array x, y;
    if (!load_as(path_in(out_dir, a), QKV_F32, &x)) return;
    if (load_as(path_in(out_dir, b), QKV_F32, &y)) {
        int64_t n = qkv_array_count(&x);
        const float *p = x.data, *q = y.data;
        double d = 0, m = 0;
        for (int64_t i = 0; n == qkv_array_count(&y) && i < n; i++) {
            double e = fabs((double)p[i] - q[i]);
            if (!(e <= d)) d = e;
            if (fabs(p[i]) > m) m = fabs(p[i]);
        }
        if (rel == 0)
            CHECK(n == qkv_array_count(&y) && memcmp(x.data, y.data, (size_t)n * sizeof(float)) == 0,
                  "%s and %s differ", a, b);
        else
            CHECK(n == qkv_array_count(&y) && d <= rel * m, "%s and %s differ by %.3g (max %.3g)", a, b, d, m);
        qkv_array_free(&y);
    }
    qkv_array_free(&x);
}

/* `qkv tokenize` prints, line by line, the ids transformers gave. */
static void check_tokenize(const int64_t *ids, const int64_t *off) {
    char line[6144];
    snprintf(line, sizeof line, "'%s' tokenize --model '%s' --input '%s'", cli, model, sentences);
    FILE *p = popen(line, "r");
    CHECK(p != NULL, "cannot run %s", line);
    if (!p) return;
    int s = 0;
    while (fgets(line, sizeof line, p)) {
        CHECK(s < SENTENCES, "tokenize: more than %d lines", SENTENCES);
        if (s >= SENTENCES) break;
        int64_t k = off[s], id;
        int used = 0;
        for (const char *c = line; sscanf(c, "%lld%n", (long long *)&id, &used) == 1; c += used, k++)
            CHECK(k < off[s + 1] && id == ids[k], "tokenize, line %d, token %lld: %lld, want %lld", s + 1,
                  (long long)(k - off[s]), (long long)id, k < off[s + 1] ? (long long)ids[k] : -1LL);
        CHECK(k == off[s + 1], "tokenize, line %d: %lld ids, want %lld", s + 1, (long long)(k - off[s]),
              (long long)(off[s + 1] - off[s]));
        s++;
    }
    CHECK(pclose(p) == 0, "tokenize failed");
    CHECK(s == SENTENCES, "tokenize printed %d lines, want %d", s, SENTENCES);
}

int main(void) {
    cli = getenv("QKV_CLI");
    const char *src = getenv("QKV_SOURCE_DIR");
    if (!cli || !src) {
        fprintf(stderr, "test_cli_encode: run it through ctest, which sets QKV_CLI and QKV_SOURCE_DIR\n");
        return 1;
    }
    snprintf(model, sizeof model, "%s/tests/data/encoder/tiny", src);
    snprintf(ref_dir, sizeof ref_dir, "%s", model);
    snprintf(sentences, sizeof sentences, "%s/tests/data/encoder/sentences.txt", src);
    tu_tmp_path(out_dir, sizeof out_dir, "cli_encode");
    char mk[1200];
    snprintf(mk, sizeof mk, "mkdir -p '%s'", out_dir);
    CHECK(system(mk) == 0, "%s", mk);

    qkv_array ids, off;
    if (!load_as(path_in(ref_dir, "expected_ids.npy"), QKV_I64, &ids)) return tu_finish();
    if (!load_as(path_in(ref_dir, "expected_offsets.npy"), QKV_I64, &off)) return tu_finish();
    CHECK(qkv_array_count(&off) == SENTENCES + 1, "expected_offsets.npy: %lld entries, want %d",
          (long long)qkv_array_count(&off), SENTENCES + 1);
    if (qkv_array_count(&off) != SENTENCES + 1) return tu_finish();
    const int64_t *o = off.data;

    check_tokenize(ids.data, o);

    /* Pooled vectors: the model's setting (mean, normalised) and each override. */
    static const struct {
        const char *opts, *out, *want;
    } runs[] = {
        {"", "embed.npy", "expected_gelu_embed.npy"},
        {"--pooling mean", "mean_norm.npy", "expected_gelu_embed.npy"},
        {"--no-normalize", "mean.npy", "expected_gelu_mean.npy"},
        {"--pooling cls --no-normalize", "cls.npy", "expected_gelu_cls.npy"},
        {"--pooling max --no-normalize", "max.npy", "expected_gelu_max.npy"},
    };
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++)
        if (qkv_ok("embed --model '%s' --input '%s' %s -o '%s'", model, sentences, runs[i].opts,
                   path_in(out_dir, runs[i].out)))
            compare_rows(runs[i].out, runs[i].want, NULL);

    /* Token states, packed, and their offsets. */
    if (qkv_ok("embed --model '%s' --input '%s' --pooling none -o '%s' --offsets '%s'", model, sentences,
               path_in(out_dir, "states.npy"), path_in(out_dir, "offsets.npy"))) {
        compare_rows("states.npy", "expected_gelu_states.npy", o);
        qkv_array got;
        if (load_as(path_in(out_dir, "offsets.npy"), QKV_I64, &got)) {
            CHECK(qkv_array_count(&got) == SENTENCES + 1 &&
                      memcmp(got.data, o, (SENTENCES + 1) * sizeof(int64_t)) == 0,
                  "offsets.npy differs from expected_offsets.npy");
            qkv_array_free(&got);
        }
    }

    /* The thread count changes no bit; the batch size changes only float
     * rounding (short calls sum their projections in another order). */
    if (qkv_ok("embed --model '%s' --input '%s' --threads 1 -o '%s'", model, sentences,
               path_in(out_dir, "embed_t1.npy")))
        same_values("embed.npy", "embed_t1.npy", 0);
    if (qkv_ok("embed --model '%s' --input '%s' --batch 1 --threads 1 -o '%s'", model, sentences,
               path_in(out_dir, "embed_b1.npy")))
        same_values("embed.npy", "embed_b1.npy", 1e-6);
    if (qkv_ok("embed --model '%s' --input '%s' --batch 4 --threads 2 -o '%s'", model, sentences,
               path_in(out_dir, "embed_b4.npy")))
        same_values("embed.npy", "embed_b4.npy", 1e-6);
    if (qkv_ok("embed --model '%s' --input '%s' --pooling none --batch 5 --threads 2 -o '%s'", model, sentences,
               path_in(out_dir, "states_b5.npy")))
        same_values("states.npy", "states_b5.npy", 1e-6);

    qkv_array_free(&ids);
    qkv_array_free(&off);
    return tu_finish();
}
