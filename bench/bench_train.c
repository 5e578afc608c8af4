/* bench_train: training throughput of a transformer, tokens per second, by
 * default L = 4, E = 128, H = 4, n = 128, batch 16 (vocab 64, causal,
 * sinusoidal positions, AdamW). Median over steps after a warm-up; PyTorch's
 * equivalent model (bench/torch_train.py) is timed alternating with it, as
 * docs/BENCHMARKS.md shows.
 *
 * --precision bf16 trains under qkv_model_set_precision(QKV_BF16);
 * --precision both builds an fp32 and a bf16 model from the same seed and
 * alternates their steps in this one process, so that both see the same
 * machine, and prints the median step of each and their ratio.
 *
 *   bench_train [--steps 20] [--threads 2] [--layers 4] [--dim 128] [--heads 4]
 *               [--seq 128] [--batch 16] [--precision fp32|bf16|both]
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
    int prec = 0; /* 0 fp32, 1 bf16, 2 both */
    for (int i = 1; i + 1 < argc; i += 2) {
        int64_t v = atoll(argv[i + 1]);
        if (!strcmp(argv[i], "--precision")) {
            const char *a = argv[i + 1];
            prec = !strcmp(a, "fp32") ? 0 : !strcmp(a, "bf16") ? 1 : !strcmp(a, "both") ? 2 : -1;
            if (prec < 0) {
                fprintf(stderr, "--precision: fp32, bf16 or both, not %s\n", a);
                return 2;
            }
        } else if (!strcmp(argv[i], "--steps")) steps = v;
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
    const int nm = prec == 2 ? 2 : 1;
    qkv_model *m[2] = {NULL, NULL};
    qkv_adamw *opt[2] = {NULL, NULL};
    for (int k = 0; k < nm; k++) {
        const int bf = prec == 1 || (prec == 2 && k == 1);
        if (qkv_model_create(&c, 1, &m[k]) != QKV_OK || qkv_adamw_create(m[k], 0.9, 0.95, 1e-8, 0.01, &opt[k]) != QKV_OK ||
            (bf && qkv_model_set_precision(m[k], QKV_BF16) != QKV_OK))
            return 1;
    }
    int32_t *tok = malloc((size_t)(B * n) * sizeof(int32_t)), *tgt = malloc((size_t)(B * n) * sizeof(int32_t));
    double *t[2] = {malloc((size_t)steps * sizeof(double)), malloc((size_t)steps * sizeof(double))}, loss[2] = {0, 0};
    for (int64_t i = 0; i < B * n; i++) tok[i] = (int32_t)((i * 2654435761u) % (uint32_t)V), tgt[i] = tok[(i + 1) % (B * n)];
    for (int64_t s = 0; s < steps; s++)
        for (int k = 0; k < nm; k++) {
            double t0 = bench_now();
            qkv_model_zero_grad(m[k]);
            if (qkv_model_forward(m[k], B, n, tok, tgt, 1, NULL, &loss[k]) != QKV_OK || qkv_model_backward(m[k]) != QKV_OK ||
                qkv_adamw_step(opt[k], 1e-3, 1.0, NULL) != QKV_OK)
                return 1;
            t[k][s] = bench_now() - t0;
        }
    double med[2] = {0, 0};
    for (int k = 0; k < nm; k++) {
        qsort(t[k] + 2, (size_t)(steps - 2), sizeof *t[k], cmp); /* the first two steps warm up */
        med[k] = t[k][2 + (steps - 2) / 2];
        const int bf = prec == 1 || (prec == 2 && k == 1);
        printf("qkv%s: L=%lld E=%lld H=%lld n=%lld batch=%lld threads=%lld: %lld parameters, median step %.1f ms, "
               "%.0f tokens/s (loss %.3f)\n",
               bf ? " bf16" : "", (long long)L, (long long)E, (long long)H, (long long)n, (long long)B, (long long)threads,
               (long long)qkv_model_param_count(m[k]), med[k] * 1e3, (double)(B * n) / med[k], loss[k]);
    }
    if (nm == 2) printf("bf16 / fp32 tokens/s: %.3f (steps alternated, medians of %lld)\n", med[0] / med[1], (long long)(steps - 2));
    free(tok);
    free(t[0]);
    free(t[1]);
    for (int k = 0; k < nm; k++) {
        qkv_adamw_free(opt[k]);
        qkv_model_free(m[k]);
    }
    return 0;
}
