/* bench_train: training throughput of a transformer, tokens per second, by
 * default L = 4, E = 128, H = 4, n = 128, batch 16 (vocab 64, causal,
 * sinusoidal positions, AdamW). Median over steps after a warm-up; PyTorch's
 * equivalent model (bench/torch_train.py) is timed alternating with it, as
 * docs/BENCHMARKS.md shows.
 *
 *   bench_train [--steps 20] [--threads 2] [--layers 4] [--dim 128] [--heads 4]
 *               [--seq 128] [--batch 16]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "peak.h"
#include "qkv.h"

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int64_t steps = 20, threads = 2, L = 4, E = 128, H = 4, n = 128, B = 16, V = 64;
    for (int i = 1; i + 1 < argc; i += 2) {
        int64_t v = atoll(argv[i + 1]);
        if (!strcmp(argv[i], "--steps")) steps = v;
        else if (!strcmp(argv[i], "--threads")) threads = v;
        else if (!strcmp(argv[i], "--layers")) L = v;
        else if (!strcmp(argv[i], "--dim")) E = v;
        else if (!strcmp(argv[i], "--heads")) H = v;
        else if (!strcmp(argv[i], "--seq")) n = v;
        else if (!strcmp(argv[i], "--batch")) B = v;
        else {
            fprintf(stderr, "unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (steps < 3 || steps > 10000) return 2;
    qkv_model_config c;
    qkv_model_config_init(&c, V, n);
    c.dim = E;
    c.heads = H;
    c.layers = L;
    c.threads = (int)threads;
    qkv_model *m = NULL;
    qkv_adamw *opt = NULL;
    if (qkv_model_create(&c, 1, &m) != QKV_OK || qkv_adamw_create(m, 0.9, 0.95, 1e-8, 0.01, &opt) != QKV_OK) return 1;
    int32_t *tok = malloc((size_t)(B * n) * sizeof(int32_t)), *tgt = malloc((size_t)(B * n) * sizeof(int32_t));
    double *t = malloc((size_t)steps * sizeof(double)), loss = 0;
    for (int64_t i = 0; i < B * n; i++) tok[i] = (int32_t)((i * 2654435761u) % (uint32_t)V), tgt[i] = tok[(i + 1) % (B * n)];
    for (int64_t s = 0; s < steps; s++) {
        double t0 = bench_now();
        qkv_model_zero_grad(m);
        if (qkv_model_forward(m, B, n, tok, tgt, 1, NULL, &loss) != QKV_OK || qkv_model_backward(m) != QKV_OK ||
            qkv_adamw_step(opt, 1e-3, 1.0, NULL) != QKV_OK)
            return 1;
        t[s] = bench_now() - t0;
    }
    qsort(t + 2, (size_t)(steps - 2), sizeof *t, cmp); /* the first two steps warm up */
    double med = t[2 + (steps - 2) / 2];
    printf("qkv: L=%lld E=%lld H=%lld n=%lld batch=%lld threads=%lld: %lld parameters, median step %.1f ms, "
           "%.0f tokens/s (loss %.3f)\n",
           (long long)L, (long long)E, (long long)H, (long long)n, (long long)B, (long long)threads,
           (long long)qkv_model_param_count(m), med * 1e3, (double)(B * n) / med, loss);
    free(tok);
    free(tgt);
    free(t);
    qkv_adamw_free(opt);
    qkv_model_free(m);
    return 0;
}
