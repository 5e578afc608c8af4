/* bench_half - bf16 and fp16 attention forward beside the float32 fast path,
 * in the same run (docs/HALF.md).
 *
 * Prints first the error of each path against the reference in double on a
 * small problem (the half inputs widened exactly), beside the error of the
 * float32 path on the same inputs; then, for the big problem (default
 * n = 4096, H = 8, D = 64, B = 1, 2 threads, no mask), the median time over
 * the repetitions and GFLOP/s counted as FlashAttention does, 4*B*H*n^2*D
 * (halved with --causal), and the speed-up of each half path over float32.
 * Only the public API; never asserted in CI.
 *
 * --backward times the backward instead: float32 fast backward, bf16
 * (the AVX512-BF16 backward when present) and fp16 (portable), each given
 * the forward's out and lse, counted as FlashAttention does, 2.5 times the
 * forward's flops (10*B*H*n^2*D; the recomputation of S is not counted).
 *
 *   bench_half [--n N] [--heads H] [--dim D] [--threads T] [--reps R] [--causal] [--backward] */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "qkv.h"

static uint16_t to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}
/* fp16 for finite values in range (the inputs here are N(0, 1)). */
static uint16_t to_f16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a < 0x38800000u) { /* subnormal or 0 */
        float y = fabsf(x) * 16777216.0f; /* units of 2^-24; rint is nearest-even */
        return (uint16_t)(sign | (uint16_t)rintf(y));
    }
    uint32_t r = a - 0x38000000u;
    r += 0xfffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
}
static float from_f16(uint16_t h) {
    uint32_t e = (h >> 10) & 31, m = h & 1023;
    float x = e == 0 ? ldexpf((float)m, -24) : ldexpf((float)(1024 + m), (int)e - 25);
    return (h & 0x8000) ? -x : x;
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static double normal(void) {
    double u[2];
    for (int i = 0; i < 2; i++) {
        g_rng ^= g_rng << 13; g_rng ^= g_rng >> 7; g_rng ^= g_rng << 17;
        u[i] = ((double)(g_rng >> 11) + 0.5) / 9007199254740992.0;
    }
    return sqrt(-2.0 * log(u[0])) * cos(6.283185307179586 * u[1]);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct inputs {
    int64_t n_el;
    float *f32[3];
    uint16_t *b16[3], *h16[3];
} inputs;

static void make_inputs(inputs *in, int64_t n_el) {
    in->n_el = n_el;
    for (int t = 0; t < 3; t++) {
        in->f32[t] = malloc((size_t)n_el * 4);
        in->b16[t] = malloc((size_t)n_el * 2);
        in->h16[t] = malloc((size_t)n_el * 2);
        for (int64_t i = 0; i < n_el; i++) {
            float x = (float)normal();
            in->b16[t][i] = to_bf16(x);
            in->h16[t][i] = to_f16(x);
            in->f32[t][i] = x;
        }
    }
}

static void free_inputs(inputs *in) {
    for (int t = 0; t < 3; t++) {
        free(in->f32[t]); free(in->b16[t]); free(in->h16[t]);
    }
}

/* The error table: each path against the double reference on its own inputs. */
static void errors(int causal) {
    qkv_attn_desc d;
    qkv_attn_desc_init(&d);
    d.batch = 1; d.n_q = d.n_k = 512; d.heads = 2; d.dim = 64;
    d.mask = causal ? QKV_MASK_CAUSAL : QKV_MASK_NONE;
    int64_t n_el = d.n_q * d.heads * d.dim;
    inputs in;
    make_inputs(&in, n_el);
    double *x64[3], *o64 = malloc((size_t)n_el * 8);
    for (int t = 0; t < 3; t++) x64[t] = malloc((size_t)n_el * 8);
    float *of = malloc((size_t)n_el * 4);
    uint16_t *oh = malloc((size_t)n_el * 2);
    printf("## error against the reference in double (n = 512, H = 2, D = 64%s)\n\n", causal ? ", causal" : "");
    printf("| storage | inputs | max |out - ref64| |\n|---|---|---|\n");
    for (int kind = 0; kind < 3; kind++) {
        for (int t = 0; t < 3; t++)
            for (int64_t i = 0; i < n_el; i++)
                x64[t][i] = kind == 0 ? in.f32[t][i] : kind == 1 ? from_bf16(in.b16[t][i]) : from_f16(in.h16[t][i]);
        qkv_attn_desc r = d;
        r.dtype = QKV_F64;
        r.impl = QKV_IMPL_REFERENCE;
        qkv_status s = qkv_attention_forward(&r, x64[0], x64[1], x64[2], o64, NULL, NULL);
        qkv_attn_desc h = d;
        h.dtype = kind == 0 ? QKV_F32 : kind == 1 ? QKV_BF16 : QKV_F16;
        if (s == QKV_OK)
            s = kind == 0 ? qkv_attention_forward(&h, in.f32[0], in.f32[1], in.f32[2], of, NULL, NULL)
                : qkv_attention_forward(&h, kind == 1 ? in.b16[0] : in.h16[0], kind == 1 ? in.b16[1] : in.h16[1],
                                        kind == 1 ? in.b16[2] : in.h16[2], oh, NULL, NULL);
        double e = 0.0;
        for (int64_t i = 0; s == QKV_OK && i < n_el; i++) {
            double y = kind == 0 ? of[i] : kind == 1 ? from_bf16(oh[i]) : from_f16(oh[i]);
            e = fabs(y - o64[i]) > e ? fabs(y - o64[i]) : e;
        }
        printf("| %s | N(0,1) rounded to it | %s%.3g |\n", kind == 0 ? "float32" : kind == 1 ? "bf16" : "fp16",
               s == QKV_OK ? "" : qkv_status_string(s), e);
    }
    printf("\n(bf16 keeps 8 significant bits: its unit roundoff 2^-9 = %.2g bounds the output's rounding.)\n\n",
           ldexp(1.0, -9));
    free_inputs(&in);
    for (int t = 0; t < 3; t++) free(x64[t]);
    free(o64); free(of); free(oh);
}

/* The backward of the three storage types, each given its own forward's
 * out and lse (computed once, untimed). */
static int bench_backward(int64_t n, int64_t H, int64_t D, int threads, int reps, int causal) {
    qkv_attn_desc d;
    qkv_attn_desc_init(&d);
    d.batch = 1; d.n_q = d.n_k = n; d.heads = H; d.dim = D; d.threads = threads;
    d.mask = causal ? QKV_MASK_CAUSAL : QKV_MASK_NONE;
    int64_t n_el = n * H * D;
    inputs in, g;
    make_inputs(&in, n_el);
    make_inputs(&g, n_el); /* g.*[0]: dout; [1], [2]: unused */
    float *of = malloc((size_t)n_el * 4), *lse = malloc((size_t)(n * H) * 4);
    float *gf[3];
    uint16_t *oh = malloc((size_t)n_el * 2), *gh[3];
    for (int t = 0; t < 3; t++) {
        gf[t] = malloc((size_t)n_el * 4);
        gh[t] = malloc((size_t)n_el * 2);
    }
    double flops = 10.0 * (double)H * (double)n * (double)n * (double)D * (causal ? 0.5 : 1.0);
    double *t = malloc((size_t)reps * sizeof(double)), *tc = malloc((size_t)reps * sizeof(double));
    double med[3] = {0, 0, 0}, medc[3] = {0, 0, 0};
    printf("## backward, B = 1, n = %lld, H = %lld, D = %lld, %d threads%s, median of %d\n\n", (long long)n,
           (long long)H, (long long)D, threads, causal ? ", causal" : "", reps);
    printf("(CPU: the process's CPU time of the call, all threads; on a shared machine its ratio is the steadier one)\n\n");
    printf("| storage | path | ms | GFLOP/s | vs float32 | CPU ms | vs float32 (CPU) |\n|---|---|---|---|---|---|---|\n");
    for (int kind = 0; kind < 3; kind++) {
        qkv_attn_desc h = d;
        h.dtype = kind == 0 ? QKV_F32 : kind == 1 ? QKV_BF16 : QKV_F16;
        const void *q = kind == 0 ? (void *)in.f32[0] : kind == 1 ? (void *)in.b16[0] : (void *)in.h16[0];
        const void *k = kind == 0 ? (void *)in.f32[1] : kind == 1 ? (void *)in.b16[1] : (void *)in.h16[1];
        const void *v = kind == 0 ? (void *)in.f32[2] : kind == 1 ? (void *)in.b16[2] : (void *)in.h16[2];
        const void *go = kind == 0 ? (void *)g.f32[0] : kind == 1 ? (void *)g.b16[0] : (void *)g.h16[0];
        void *o = kind == 0 ? (void *)of : (void *)oh;
        qkv_attn_grads gr = {0};
        gr.dq = kind == 0 ? (void *)gf[0] : (void *)gh[0];
        gr.dk = kind == 0 ? (void *)gf[1] : (void *)gh[1];
        gr.dv = kind == 0 ? (void *)gf[2] : (void *)gh[2];
        qkv_status s = qkv_attention_forward(&h, q, k, v, o, NULL, lse);
        for (int r = -1; r < reps && s == QKV_OK; r++) { /* r = -1: warm-up */
            double t0 = now(), c0 = cpu_now();
            s = qkv_attention_backward(&h, q, k, v, o, lse, go, &gr);
            if (r >= 0) {
                t[r] = now() - t0;
                tc[r] = cpu_now() - c0;
            }
        }
        if (s != QKV_OK) {
            printf("| %d | %s |\n", kind, qkv_status_string(s));
            continue;
        }
        qsort(t, (size_t)reps, sizeof *t, cmp_double);
        qsort(tc, (size_t)reps, sizeof *tc, cmp_double);
        med[kind] = t[reps / 2];
        medc[kind] = tc[reps / 2];
        printf("| %s | %s | %.1f | %.1f | %.2fx | %.1f | %.2fx |\n", kind == 0 ? "float32" : kind == 1 ? "bf16" : "fp16",
               kind == 0 ? "fast (fp32 FMA)" : kind == 1 ? "auto (AVX512-BF16 when present)" : "auto (portable: widen + fp32)",
               1e3 * med[kind], flops / med[kind] * 1e-9, med[0] / med[kind], 1e3 * medc[kind], medc[0] / medc[kind]);
    }
    printf("\ntarget: bf16 backward >= 2x float32\n");
    free(tc);
    free_inputs(&in);
    free_inputs(&g);
    for (int k = 0; k < 3; k++) {
        free(gf[k]);
        free(gh[k]);
    }
    free(of); free(oh); free(lse); free(t);
    return 0;
}

int main(int argc, char **argv) {
    int64_t n = 4096, H = 8, D = 64;
    int threads = 2, reps = 5, causal = 0, backward = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--n") && i + 1 < argc) n = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--heads") && i + 1 < argc) H = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--dim") && i + 1 < argc) D = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--causal")) causal = 1;
        else if (!strcmp(argv[i], "--backward")) backward = 1;
        else {
            fprintf(stderr, "usage: bench_half [--n N] [--heads H] [--dim D] [--threads T] [--reps R] [--causal] "
                            "[--backward]\n");
            return 2;
        }
    }
    if (n < 1 || H < 1 || D < 1 || threads < 1 || reps < 1) {
        fprintf(stderr, "bench_half: sizes must be positive\n");
        return 2;
    }
    errors(causal);
    if (backward) return bench_backward(n, H, D, threads, reps, causal);

    qkv_attn_desc d;
    qkv_attn_desc_init(&d);
    d.batch = 1; d.n_q = d.n_k = n; d.heads = H; d.dim = D; d.threads = threads;
    d.mask = causal ? QKV_MASK_CAUSAL : QKV_MASK_NONE;
    int64_t n_el = n * H * D;
    inputs in;
    make_inputs(&in, n_el);
    float *of = malloc((size_t)n_el * 4);
    uint16_t *oh = malloc((size_t)n_el * 2);
    double flops = 4.0 * (double)H * (double)n * (double)n * (double)D * (causal ? 0.5 : 1.0);
    double *t = malloc((size_t)reps * sizeof(double)), med[3] = {0, 0, 0};
    printf("## forward, B = 1, n = %lld, H = %lld, D = %lld, %d threads%s, median of %d\n\n", (long long)n,
           (long long)H, (long long)D, threads, causal ? ", causal" : "", reps);
    printf("| storage | path | ms | GFLOP/s | vs float32 |\n|---|---|---|---|---|\n");
    for (int kind = 0; kind < 3; kind++) {
        qkv_attn_desc h = d;
        h.dtype = kind == 0 ? QKV_F32 : kind == 1 ? QKV_BF16 : QKV_F16;
        qkv_status s = QKV_OK;
        for (int r = -1; r < reps && s == QKV_OK; r++) { /* r = -1: warm-up */
            double t0 = now();
            if (kind == 0) s = qkv_attention_forward(&h, in.f32[0], in.f32[1], in.f32[2], of, NULL, NULL);
            else if (kind == 1) s = qkv_attention_forward(&h, in.b16[0], in.b16[1], in.b16[2], oh, NULL, NULL);
            else s = qkv_attention_forward(&h, in.h16[0], in.h16[1], in.h16[2], oh, NULL, NULL);
            if (r >= 0) t[r] = now() - t0;
        }
        if (s != QKV_OK) {
            printf("| %d | %s |\n", kind, qkv_status_string(s));
            continue;
        }
        qsort(t, (size_t)reps, sizeof *t, cmp_double);
        med[kind] = t[reps / 2];
        printf("| %s | %s | %.1f | %.1f | %.2fx |\n", kind == 0 ? "float32" : kind == 1 ? "bf16" : "fp16",
               kind == 0 ? "fast (fp32 FMA)" : kind == 1 ? "auto (AVX512-BF16 when present)" : "auto (portable: widen + fp32)",
               1e3 * med[kind], flops / med[kind] * 1e-9, med[0] / med[kind]);
    }
    printf("\ntargets (written for an AMX machine): bf16 >= 1000 GFLOP/s and >= 2.5x float32\n");
    free_inputs(&in);
    free(of); free(oh); free(t);
    return 0;
}
