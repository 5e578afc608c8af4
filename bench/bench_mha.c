/* bench_mha: the multi-head attention layer, forward and backward, at
 * E = 512, H = 8 (Dh = 64), B = 1, n in {512, 2048, 8192}.
 *
 * FLOPs counted: forward 4 projections of 2 n E^2 each plus the attention's
 * 4 n^2 E (halved when causal); backward twice the projections plus 2.5x the
 * attention (FlashAttention's convention). Medians of --reps runs; the FP32
 * FMA peak is measured in the same run (bench/peak.h).
 *
 *   bench_mha [--n 512,2048,8192] [--threads 2] [--reps 3] [--causal 0|1] [--no-backward]
 *             [--bias-kv] [--additive A]
 *
 * --bias-kv: torch's add_bias_kv (one extra key and value); --additive A: the
 * additive (MLP) score with A hidden units per head (the core's additive path). The
 * GFLOP/s column still counts the dot-product score's FLOPs: compare the ms.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "peak.h"
#include "qkv.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv) {
    int64_t ns[8] = {512, 2048, 8192};
    int nn = 3, threads = 2, reps = 3, causal = 0, backward = 1, bias_kv = 0;
    int64_t additive = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--n") && i + 1 < argc) {
            nn = 0;
            for (char *t = strtok(argv[++i], ","); t && nn < 8; t = strtok(NULL, ",")) ns[nn++] = atoll(t);
        } else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            threads = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--causal") && i + 1 < argc) {
            causal = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--no-backward")) {
            backward = 0;
        } else if (!strcmp(argv[i], "--bias-kv")) {
            bias_kv = 1;
        } else if (!strcmp(argv[i], "--additive") && i + 1 < argc) {
            additive = atoll(argv[++i]);
        } else {
            fprintf(stderr, "usage: bench_mha [--n N,N..] [--threads T] [--reps R] [--causal 0|1] [--no-backward]"
                            " [--bias-kv] [--additive A]\n");
            return 2;
        }
    }
    if (reps < 1 || reps > 64 || threads < 1 || additive < 0) return 2;
    const int64_t E = 512, H = 8;
    bench_isa isa = bench_isa_best();
    double peak = bench_peak_gflops(isa, threads, 0.3, 5, NULL);
    printf("FP32 FMA peak (%s, %d threads): %.1f GFLOP/s\n\n", bench_isa_name(isa), threads, peak);
    printf("| n | pass | median ms | GFLOP/s | %% of peak |\n|---|---|---|---|---|\n");
    for (int c = 0; c < nn; c++) {
        int64_t n = ns[c];
        qkv_mha_config cfg;
        qkv_mha_config_init(&cfg, E, H);
        cfg.attn.threads = threads;
        cfg.attn.mask = causal ? QKV_MASK_CAUSAL : QKV_MASK_NONE;
        cfg.add_bias_kv = bias_kv;
        if (additive) {
            cfg.attn.score = QKV_SCORE_ADDITIVE;
            cfg.attn.additive_dim = additive;
        }
        qkv_mha *m = NULL;
        if (qkv_mha_create(&cfg, 1, &m) != QKV_OK) return 1;
        float *x = malloc((size_t)(n * E) * sizeof(float)), *y = malloc((size_t)(n * E) * sizeof(float));
        float *dx = malloc((size_t)(n * E) * sizeof(float));
        for (int64_t i = 0; i < n * E; i++) x[i] = (float)((i * 2654435761u % 1000) / 1000.0 - 0.5);
        double attn_flops = 4.0 * (double)n * (double)n * (double)E * (causal ? 0.5 : 1.0);
        double proj_flops = 4.0 * 2.0 * (double)n * (double)E * (double)E;
        double tf[64], tb[64];
        for (int r = 0; r < reps; r++) {
            double t0 = bench_now();
            qkv_status s = qkv_mha_forward(m, 1, n, n, x, NULL, NULL, NULL, y, NULL);
            double t1 = bench_now();
            if (s != QKV_OK) {
                fprintf(stderr, "forward: %s\n", qkv_status_string(s));
                return 1;
            }
            tf[r] = t1 - t0;
            if (backward) {
                t0 = bench_now();
                s = qkv_mha_backward(m, x, NULL, NULL, y, dx, NULL, NULL);
                tb[r] = bench_now() - t0;
                if (s != QKV_OK) {
                    fprintf(stderr, "backward: %s\n", qkv_status_string(s));
                    return 1;
                }
            }
        }
        double mf = median(tf, reps), gf = (attn_flops + proj_flops) / mf * 1e-9;
        printf("| %lld | forward | %.2f | %.1f | %.0f%% |\n", (long long)n, mf * 1e3, gf, 100 * gf / peak);
        if (backward) {
            double mb = median(tb, reps), gb = (2.5 * attn_flops + 2 * proj_flops) / mb * 1e-9;
            printf("| %lld | backward | %.2f | %.1f | %.0f%% |\n", (long long)n, mb * 1e3, gb, 100 * gb / peak);
        }
        fflush(stdout);
        free(x);
        free(y);
        free(dx);
        qkv_mha_free(m);
    }
    return 0;
}
