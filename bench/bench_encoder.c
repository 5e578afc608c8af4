/* bench_encoder - a pretrained BERT encoder's sentence embeddings through
 * qkv_encoder_embed, the model loaded once, as bench/encoder_vs_peers.sh
 * runs it beside sentence-transformers and ONNX Runtime (docs/BENCHMARKS.md).
 *
 * Throughput (default): the whole file in one qkv_encoder_embed call, as a
 * peer's encode(list) is one call; the median wall time of --reps calls
 * after one warm-up call. --latency: one call per line (each text alone),
 * --reps rounds over the file; the median of the calls. --phases: the
 * share of each phase of the forward (tokenizer, embeddings, QKV, attention,
 * output projection, MLP, LayerNorm, pooling) over the timed calls, with
 * the GFLOP/s of the matrix phases against the FP32 FMA peak measured in
 * the same run (FLOPs as 2 per multiply-add: per token and layer 2 (4 H^2
 * + 2 H I) in the projections, per sentence of n tokens and layer 4 n^2 H
 * in the attention).
 *
 * One line of results per run, `key=value` pairs (the peers' script prints
 * the same keys), then the breakdown when asked.
 *
 *   bench_encoder --model DIR --input FILE [--threads T] [--reps R]
 *                 [--latency] [--phases] [--precision fp32|bf16|int8] [--label NAME] */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/encoder_internal.h" /* the phase timers */
#include "peak.h"
#include "qkv.h"

static void die(const char *what) {
    fprintf(stderr, "bench_encoder: %s\n", what);
    exit(1);
}

/* The lines of a file (final newline and CRs dropped); *count set. */
static char **read_lines(const char *path, int64_t *count) {
    FILE *f = fopen(path, "rb");
    if (!f) die("cannot open the input file");
    size_t cap = 1 << 20, len = 0;
    char *buf = malloc(cap);
    for (size_t r; buf && (r = fread(buf + len, 1, cap - len - 1, f)) > 0;) {
        len += r;
        if (len + 1 == cap) buf = realloc(buf, cap *= 2);
    }
    fclose(f);
    if (!buf || len == 0) die("empty or unreadable input file");
    buf[len] = '\0';
    if (buf[len - 1] == '\n') buf[--len] = '\0';
    int64_t n = 1;
    for (size_t i = 0; i < len; i++) n += buf[i] == '\n';
    char **lines = malloc((size_t)n * sizeof *lines);
    if (!lines) die("out of memory");
    int64_t k = 0;
    for (char *p = buf;; k++) {
        lines[k] = p;
        char *nl = strchr(p, '\n');
        if (nl) *nl = '\0';
        size_t l = strlen(p);
        if (l && p[l - 1] == '\r') p[l - 1] = '\0';
        if (!nl) break;
        p = nl + 1;
    }
    *count = k + 1;
    return lines;
}


int main(int argc, char **argv) {
    const char *model = "models/all-MiniLM-L6-v2", *input = NULL, *label = "qkv";
    int threads = 2, reps = 3, latency = 0, phases = 0, precision = QKV_ENCODER_FP32;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--model") && v) model = argv[++i];
        else if (!strcmp(a, "--input") && v) input = argv[++i];
        else if (!strcmp(a, "--label") && v) label = argv[++i];
        else if (!strcmp(a, "--threads") && v) threads = atoi(argv[++i]);
        else if (!strcmp(a, "--reps") && v) reps = atoi(argv[++i]);
        else if (!strcmp(a, "--latency")) latency = 1;
        else if (!strcmp(a, "--phases")) phases = 1;
        else if (!strcmp(a, "--precision") && v && !strcmp(v, "fp32")) precision = QKV_ENCODER_FP32, i++;
        else if (!strcmp(a, "--precision") && v && !strcmp(v, "bf16")) precision = QKV_ENCODER_BF16, i++;
        else if (!strcmp(a, "--precision") && v && !strcmp(v, "int8")) precision = QKV_ENCODER_INT8, i++;
        else {
            fprintf(stderr, "usage: bench_encoder --model DIR --input FILE [--threads T] [--reps R] [--latency] "
                            "[--phases] [--precision fp32|bf16|int8] [--label NAME]\n");
            return 2;
        }
    }
    if (!input || threads < 1 || reps < 1) die("--input FILE is required; --threads and --reps >= 1");
    int64_t count;
    char **texts = read_lines(input, &count);

    qkv_encoder_options opt = {.threads = threads, .precision = precision};
    qkv_encoder *e;
    char why[256];
    if (qkv_encoder_load(model, &opt, &e, why, sizeof why) != QKV_OK) {
        fprintf(stderr, "bench_encoder: %s (scripts/fetch-model.sh fetches all-MiniLM-L6-v2)\n", why);
        return 1;
    }
    qkv_encoder_info info;
    qkv_encoder_get_info(e, &info);

    /* Tokens and FLOPs of one pass over the file. */
    const qkv_tokenizer *tok = qkv_encoder_tokenizer(e);
    double tokens = 0, flops_proj = 0, flops_attn = 0;
    const double H = (double)info.hidden, I = (double)info.intermediate, L = (double)info.layers;
    for (int64_t s = 0; s < count; s++) {
        int64_t n = 0; /* capacity 0: the count only (QKV_ERR_BAD_SIZE with the count set) */
        qkv_status st = qkv_tokenizer_encode(tok, texts[s], strlen(texts[s]), NULL, 0, info.max_length, NULL, NULL, 0,
                                             &n, why, sizeof why);
        if ((st != QKV_OK && st != QKV_ERR_BAD_SIZE) || n < 2) die(why);
        tokens += (double)n;
        flops_attn += L * 4.0 * (double)n * (double)n * H;
    }
    flops_proj = tokens * L * 2.0 * (4.0 * H * H + 2.0 * H * I);

    float *out = malloc((size_t)count * (size_t)info.hidden * sizeof *out);
    int64_t ncalls = latency ? (int64_t)reps * count : reps;
    double *t = malloc((size_t)ncalls * sizeof *t), prof[ENC_PH_COUNT] = {0};
    if (!out || !t) die("out of memory");
    /* warm-up: one call over everything (pages of the weights, the workspace, the pool) */
    if (qkv_encoder_embed(e, (const char *const *)texts, NULL, count, QKV_POOLING_FROM_MODEL, -1, out, why,
                          sizeof why) != QKV_OK)
        die(why);
    if (phases) enc_set_profile(e, prof);
    double t_all = bench_now();
    for (int64_t c = 0; c < ncalls; c++) {
        int64_t first = latency ? c % count : 0, n = latency ? 1 : count;
        double t0 = bench_now();
        if (qkv_encoder_embed(e, (const char *const *)texts + first, NULL, n, QKV_POOLING_FROM_MODEL, -1,
                              out + first * info.hidden, why, sizeof why) != QKV_OK)
            die(why);
        t[c] = bench_now() - t0;
    }
    t_all = bench_now() - t_all;
    enc_set_profile(e, NULL);
    double peak = bench_peak_gflops(bench_isa_best(), threads, 0.2, 3, NULL);
    double med = bench_median(t, (int)ncalls);
    if (latency) {
        printf("peer=%s mode=latency threads=%d calls=%lld median_ms=%.3f min_ms=%.3f max_ms=%.3f tokens_per_call=%.1f "
               "peak_gflops=%.1f\n",
               label, threads, (long long)ncalls, 1e3 * med, 1e3 * t[0], 1e3 * t[ncalls - 1], tokens / (double)count,
               peak);
    } else {
        double gf = (flops_proj + flops_attn) / med * 1e-9;
        printf("peer=%s mode=throughput threads=%d sentences=%lld tokens=%.0f median_s=%.3f min_s=%.3f max_s=%.3f "
               "sentences_per_s=%.1f gflops=%.1f peak_gflops=%.1f peak_pct=%.1f\n",
               label, threads, (long long)count, tokens, med, t[0], t[ncalls - 1], (double)count / med, gf, peak,
               100.0 * gf / peak);
    }
    if (phases) {
        double total = 0;
        for (int p = 0; p < ENC_PH_COUNT; p++) total += prof[p];
        double rounds = latency ? (double)reps : (double)ncalls;
        double f[ENC_PH_COUNT] = {0};
        f[ENC_PH_QKV] = tokens * L * 2.0 * 3.0 * H * H * rounds;
        f[ENC_PH_OUT] = tokens * L * 2.0 * H * H * rounds;
        f[ENC_PH_MLP] = tokens * L * 2.0 * 2.0 * H * I * rounds;
        f[ENC_PH_ATTN] = flops_attn * rounds;
        printf("phases over %.3f s timed (%.3f s wall, the rest outside the forward):\n", total, t_all);
        printf("  %-18s %6s %9s %7s\n", "phase", "time", "GFLOP/s", "of peak");
        for (int p = 0; p < ENC_PH_COUNT; p++) {
            if (f[p] > 0)
                printf("  %-18s %5.1f%% %9.1f %6.1f%%\n", enc_phase_name(p), 100.0 * prof[p] / total,
                       f[p] / prof[p] * 1e-9, 100.0 * f[p] / prof[p] * 1e-9 / peak);
            else
                printf("  %-18s %5.1f%%\n", enc_phase_name(p), 100.0 * prof[p] / total);
        }
    }
    qkv_encoder_free(e);
    free(out);
    free(t);
    free(texts[0]);
    free(texts);
    return 0;
}
