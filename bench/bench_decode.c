/* bench_decode - decoding one token per step over a long KV cache, with the
 * float32, bf16 and int8 caches of one multi-head layer in the same run
 * (docs/HALF.md, docs/BENCHMARKS.md).
 *
 * One self-attention layer (E = H * D, scaled dot, causal), a cache per
 * storage (plus f32-core: qkv_kv_cache_create's general float32 cache, which
 * attends through qkv_attention_forward) filled to --ctx tokens by decoding chunks of --chunk tokens, then
 * --steps steps of one token each; prints the median and mean time per
 * token, the cache's bytes per token, the bytes of K and V the step reads
 * and the bandwidth that implies, the speed-up over the float32 cache, and
 * the largest difference of each step's output from the float32 cache's
 * (relative to the largest output). The storages are timed in turns, step
 * by step (float32, bf16, int8, float32, ...), so load on the machine falls
 * on all of them alike. Only the public API; never asserted in CI.
 *
 *   bench_decode [--ctx N] [--heads H] [--dim D] [--steps S] [--threads T] [--chunk C] */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "qkv.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static float randn(void) {
    double u1, u2;
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    u1 = ((double)(g_rng >> 11) + 1.0) / 9007199254740993.0;
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    u2 = (double)(g_rng >> 11) / 9007199254740992.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int64_t ctx = 32768, H = 8, D = 64, steps = 16, chunk = 512;
    int threads = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--ctx")) ctx = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--heads")) H = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--dim")) D = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--steps")) steps = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--chunk")) chunk = atoll(argv[i + 1]);
        else {
            fprintf(stderr, "unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (ctx < 1 || H < 1 || D < 1 || steps < 1 || chunk < 1 || threads < 1) {
        fprintf(stderr, "sizes must be >= 1\n");
        return 2;
    }
    const int64_t E = H * D;
    qkv_mha_config cfg;
    qkv_mha_config_init(&cfg, E, H);
    cfg.attn.mask = QKV_MASK_CAUSAL;
    cfg.attn.threads = threads;
    qkv_mha *m;
    if (qkv_mha_create(&cfg, 1, &m) != QKV_OK) return 1;
    /* f32-core: qkv_kv_cache_create, the general cache (every layer feature,
     * through qkv_attention_forward); the others: qkv_kv_cache_create_typed,
     * the streaming decode kernels. Speed-ups are over float32 (streaming). */
    enum { NS = 4 };
    static const char *const names[NS] = {"float32", "bf16", "int8", "f32-core"};
    static const qkv_kv_storage kinds[NS] = {QKV_KV_F32, QKV_KV_BF16, QKV_KV_INT8, QKV_KV_F32};
    qkv_kv_cache *c[NS];
    const int64_t maxc = chunk > steps ? chunk : steps;
    float *x = malloc((size_t)(maxc * E) * sizeof(float)), *y[NS];
    double *t[NS];
    for (int s = 0; s < NS; s++) {
        y[s] = malloc((size_t)(maxc * E) * sizeof(float));
        t[s] = malloc((size_t)steps * sizeof(double));
        qkv_status st = s == 3 ? qkv_kv_cache_create(m, 1, ctx + steps, &c[s])
                               : qkv_kv_cache_create_typed(m, 1, ctx + steps, kinds[s], &c[s]);
        if (st != QKV_OK || !y[s] || !t[s] || !x) {
            fprintf(stderr, "cache %s: %s\n", names[s], qkv_status_string(st));
            return 1;
        }
    }
    printf("decode: one layer E=%lld H=%lld D=%lld, causal, context %lld, %lld steps, %d threads\n",
           (long long)E, (long long)H, (long long)D, (long long)ctx, (long long)steps, threads);
    /* Fill: the same tokens into every cache. */
    double fill[NS] = {0, 0, 0, 0};
    for (int64_t at = 0; at < ctx; at += chunk) {
        int64_t n = ctx - at < chunk ? ctx - at : chunk;
        for (int64_t i = 0; i < n * E; i++) x[i] = randn();
        for (int s = 0; s < NS; s++) {
            double t0 = now();
            if (qkv_mha_decode(m, c[s], n, x, y[s]) != QKV_OK) return 1;
            fill[s] += now() - t0;
        }
    }
    printf("fill (%lld-token chunks): float32 %.2f s, bf16 %.2f s, int8 %.2f s, f32-core %.2f s\n",
           (long long)chunk, fill[0], fill[1], fill[2], fill[3]);
    double err[NS] = {0, 0, 0, 0}, big = 0;
    for (int64_t k = 0; k < steps; k++) {
        for (int64_t i = 0; i < E; i++) x[i] = randn();
        for (int s = 0; s < NS; s++) {
            double t0 = now();
            if (qkv_mha_decode(m, c[s], 1, x, y[s]) != QKV_OK) return 1;
            t[s][k] = now() - t0;
        }
        for (int64_t i = 0; i < E; i++) {
            if (fabs(y[0][i]) > big) big = fabs(y[0][i]);
            for (int s = 1; s < NS; s++)
                if (fabs(y[s][i] - y[0][i]) > err[s]) err[s] = fabs(y[s][i] - y[0][i]);
        }
    }
    double med[NS];
    printf("\n%-8s %12s %12s %10s %14s %10s %12s\n", "cache", "median ms", "mean ms", "B/token", "K+V read GB/s",
           "speed-up", "max|dy|/max|y|");
    for (int s = 0; s < NS; s++) {
        double mean = 0;
        for (int64_t k = 0; k < steps; k++) mean += t[s][k];
        mean /= (double)steps;
        qsort(t[s], (size_t)steps, sizeof(double), cmp);
        med[s] = steps % 2 ? t[s][steps / 2] : 0.5 * (t[s][steps / 2 - 1] + t[s][steps / 2]);
        size_t bpt = qkv_kv_cache_bytes_per_token(m, kinds[s]);
        double gbs = (double)bpt * (double)(ctx + steps / 2) / med[s] / 1e9;
        printf("%-8s %12.3f %12.3f %10zu %14.1f %9.2fx %12.2e\n", names[s], 1e3 * med[s], 1e3 * mean, bpt, gbs,
               med[0] / med[s], err[s] / (big > 0 ? big : 1));
    }
    for (int s = 0; s < NS; s++) {
        qkv_kv_cache_free(c[s]);
        free(y[s]);
        free(t[s]);
    }
    free(x);
    qkv_mha_free(m);
    return 0;
}
