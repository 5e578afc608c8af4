/* bench_gemm - qkv_sgemm against OpenBLAS's cblas_sgemm, in the same run, at
 * the shapes of the multi-head attention layer's projections:
 *     C[M, N] = X[M, K] . W^T    X: activations (M = B * n tokens, K = E),
 *                                W: [N, K] torch-style weight (trans_b = 1)
 * with E = 512, M in {512, 2048, 4096, 8192}, N = 512 (one projection) and
 * N = 1536 (the fused QKV projection), on 1 and 2 threads.
 *
 * OpenBLAS is loaded with dlopen at run time, so this builds and runs without
 * it (its columns then read "-"). Debian's OpenBLAS 0.3.21 does not recognise
 * every AVX-512 CPU and then falls back to slower kernels, which would flatter
 * us: unless OPENBLAS_CORETYPE is already set, this program sets it to
 * SkylakeX (when the CPU has AVX-512F) before loading the library, and prints
 * the core OpenBLAS reports. Threads: openblas_set_num_threads per run.
 *
 * Each configuration first checks both results (max relative difference
 * against a double-precision product on sampled entries), then times ours
 * and OpenBLAS `reps` times each, taking turns at going first, each call
 * after the same short pause, and reports medians (a shared, noisy machine:
 * alternating spreads the noise over both columns).
 *
 * Usage: bench_gemm [--reps R] [--quick] [--shape M N K] [--nn]
 *                   [--threads T] [--no-peak] [--settle MS] [--sweep] [--cpu]
 *                   [--bf16]
 * --settle: pause before each timed call (default 150 ms, see settle()).
 * --sweep: instead, the cache-block sweep behind the kernels' MC / KC (the
 *   active kernel at M = 4096, N = K = 512 or the --shape given, NT, one
 *   thread, best of 7, timed
 *   in process CPU time so that other processes on a shared machine do not
 *   distort it).
 * --cpu: time in process CPU time instead of wall time (use with
 *   --threads 1: the kernels' speed, whatever else the machine runs).
 * --bf16: instead, the bf16 product (gemm/gemm.h) against qkv_sgemm in the
 *   same run, C = X W^T (NT): one-shot qkv_gemm_bf16 (W packed per call, as
 *   in training) and qkv_gemm_bf16_packed (W packed once, as in inference),
 *   at M = N = K = 512, 1024, 2048 and the encoder's shapes (M = 128 .. 4096,
 *   N, K = 384 / 1536), on --threads T (default 2) threads, medians of R
 *   rounds taking turns; the error column is the bf16 result's sampled
 *   error against the float64 product of the unrounded operands. */
#define _POSIX_C_SOURCE 200809L

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/cpu.h"   /* internal: qkv_cpu_has_avx512bf16 / _avx512vnni */
#include "gemm/gemm.h" /* internal: the kernel table, for --sweep */
#include "peak.h"
#include "qkv.h"

/* cblas enums as in every cblas.h (values fixed by the standard). */
enum { CBLAS_ROW_MAJOR = 101, CBLAS_NO_TRANS = 111, CBLAS_TRANS = 112 };
typedef void (*cblas_sgemm_fn)(int order, int ta, int tb, int M, int N, int K, float alpha,
                               const float *A, int lda, const float *B, int ldb, float beta,
                               float *C, int ldc);
typedef void (*set_threads_fn)(int);
typedef char *(*get_str_fn)(void);

static cblas_sgemm_fn ob_sgemm;
static set_threads_fn ob_set_threads;

static void load_openblas(void) {
    if (!getenv("OPENBLAS_CORETYPE") && bench_isa_supported(BENCH_ISA_AVX512))
        setenv("OPENBLAS_CORETYPE", "SkylakeX", 1);
    static const char *names[] = {"libopenblas.so.0", "libopenblas.so",
                                  "libopenblasp.so.0", "libopenblas64_.so.0"};
    void *h = NULL;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !h; i++) h = dlopen(names[i], RTLD_NOW);
    if (!h) {
        printf("OpenBLAS: not found (dlopen libopenblas.so.0); its columns are skipped\n");
        return;
    }
    /* dlsym returns void *; the memcpy avoids the object-to-function pointer
     * cast that ISO C leaves undefined (and -Wpedantic flags). */
    void *p = dlsym(h, "cblas_sgemm");
    if (p) memcpy(&ob_sgemm, &p, sizeof p);
    p = dlsym(h, "openblas_set_num_threads");
    if (p) memcpy(&ob_set_threads, &p, sizeof p);
    get_str_fn corename = NULL, config = NULL;
    p = dlsym(h, "openblas_get_corename");
    if (p) memcpy(&corename, &p, sizeof p);
    p = dlsym(h, "openblas_get_config");
    if (p) memcpy(&config, &p, sizeof p);
    printf("OpenBLAS: %s, core %s (OPENBLAS_CORETYPE=%s)\n", config ? config() : "?",
           corename ? corename() : "?", getenv("OPENBLAS_CORETYPE") ? getenv("OPENBLAS_CORETYPE") : "");
    if (!ob_sgemm) printf("OpenBLAS: no cblas_sgemm symbol; its columns are skipped\n");
}


static unsigned long long g_rng = 0x2545F4914F6CDD1Dull;
static float frand(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((double)(g_rng >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

/* Max over sampled entries of |C - C64| / (|A||B|)_ij. */
static double sampled_error(int tb, long M, long N, long K, const float *A, const float *B,
                            const float *C) {
    double worst = 0.0;
    for (int s = 0; s < 256; s++) {
        long i = (long)((unsigned long)(s * 2654435761u) % (unsigned long)M);
        long j = (long)((unsigned long)(s * 40503u + 7u) % (unsigned long)N);
        double sum = 0.0, mag = 0.0;
        for (long p = 0; p < K; p++) {
            double a = A[i * K + p], b = tb ? B[j * K + p] : B[p * N + j];
            sum += a * b;
            mag += fabs(a * b);
        }
        double e = fabs((double)C[i * N + j] - sum) / (mag > 0 ? mag : 1.0);
        if (e > worst) worst = e;
    }
    return worst;
}

/* OpenBLAS's idle worker threads keep spinning for a while after a call
 * (about 2^28 cycles, 0.1 s, by default); measured right after, our threads
 * would share their cores with them. Sleep them off before every timing. */
static double g_settle_s = 0.15;
static void settle(void) {
    if (g_settle_s <= 0) return;
    struct timespec ts;
    ts.tv_sec = (time_t)g_settle_s;
    ts.tv_nsec = (long)((g_settle_s - (double)ts.tv_sec) * 1e9);
    nanosleep(&ts, NULL);
}

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The clock of the timings: wall time, or with --cpu the process's CPU time
 * (immune to other processes on a loaded machine; meaningful for one thread
 * only, as it adds up all threads, OpenBLAS's spinning ones included). */
static double (*g_clock)(void) = bench_now;

typedef struct result {
    double ours, blas; /* median GFLOP/s; blas < 0 when absent */
} result;

static result bench_one(int tb, long M, long N, long K, int threads, int reps) {
    float *A = malloc(sizeof(float) * (size_t)(M * K));
    float *B = malloc(sizeof(float) * (size_t)(K * N));
    float *C = malloc(sizeof(float) * (size_t)(M * N));
    result r = {0.0, -1.0};
    if (!A || !B || !C) {
        free(A);
        free(B);
        free(C);
        printf("out of memory\n");
        return r;
    }
    for (long i = 0; i < M * K; i++) A[i] = frand();
    for (long i = 0; i < K * N; i++) B[i] = frand();
    long ldb = tb ? K : N;
    double flops = 2.0 * (double)M * (double)N * (double)K;
    /* Correctness first, then timing. */
    qkv_status st = qkv_sgemm(0, tb, M, N, K, 1.0f, A, K, B, ldb, 0.0f, C, N, threads);
    if (st != QKV_OK) {
        printf("qkv_sgemm failed: %s\n", qkv_status_string(st));
        free(A);
        free(B);
        free(C);
        return r;
    }
    double e_ours = sampled_error(tb, M, N, K, A, B, C), e_blas = -1.0;
    if (ob_sgemm) {
        if (ob_set_threads) ob_set_threads(threads);
        ob_sgemm(CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, tb ? CBLAS_TRANS : CBLAS_NO_TRANS, (int)M,
                 (int)N, (int)K, 1.0f, A, (int)K, B, (int)ldb, 0.0f, C, (int)N);
        e_blas = sampled_error(tb, M, N, K, A, B, C);
        settle();
    }
    double *t_ours = malloc(sizeof(double) * (size_t)reps), *t_blas = malloc(sizeof(double) * (size_t)reps);
    /* Every timed call starts after the same pause (so each starts with the
     * same scheduler standing on a loaded machine, and OpenBLAS's workers have
     * stopped spinning), and the two libraries take turns going first. */
    for (int rep = 0; rep < reps; rep++) {
        for (int turn = 0; turn < 2; turn++) {
            int blas = (turn + rep) % 2;
            if (blas && !ob_sgemm) continue;
            settle();
            double t0 = g_clock();
            if (blas)
                ob_sgemm(CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, tb ? CBLAS_TRANS : CBLAS_NO_TRANS, (int)M,
                         (int)N, (int)K, 1.0f, A, (int)K, B, (int)ldb, 0.0f, C, (int)N);
            else
                qkv_sgemm(0, tb, M, N, K, 1.0f, A, K, B, ldb, 0.0f, C, N, threads);
            double t = g_clock() - t0;
            if (blas)
                t_blas[rep] = t;
            else
                t_ours[rep] = t;
        }
    }
    r.ours = flops / bench_median(t_ours, reps) * 1e-9;
    if (ob_sgemm) r.blas = flops / bench_median(t_blas, reps) * 1e-9;
    printf("%6ld %5ld %4ld %s %3d  %8.1f  ", M, N, K, tb ? "NT" : "NN", threads, r.ours);
    if (r.blas >= 0)
        printf("%8.1f  %5.1f%%", r.blas, 100.0 * r.ours / r.blas);
    else
        printf("%8s  %6s", "-", "-");
    if (e_blas >= 0)
        printf("   %.1e / %.1e\n", e_ours, e_blas);
    else
        printf("   %.1e / -\n", e_ours);
    fflush(stdout);
    free(t_ours);
    free(t_blas);
    free(A);
    free(B);
    free(C);
    return r;
}

static int sweep(long M, long N, long K) {
    static const int KCS[] = {128, 256, 384, 512, 768};
    static const int MCS[] = {4, 8, 16, 32}; /* MC in MR-row panels */
    float *A = malloc(sizeof(float) * (size_t)(M * K)), *B = malloc(sizeof(float) * (size_t)(K * N));
    float *C = malloc(sizeof(float) * (size_t)(M * N));
    if (!A || !B || !C) {
        free(A);
        free(B);
        free(C);
        return 1;
    }
    for (long i = 0; i < M * K; i++) A[i] = frand();
    for (long i = 0; i < K * N; i++) B[i] = frand();
    qkv_gemm_kernel k = *qkv_gemm_kernel_active();
    double best[5][4];
    for (int a = 0; a < 5; a++)
        for (int b = 0; b < 4; b++) best[a][b] = 1e30;
    for (int rep = 0; rep < 7; rep++)
        for (int a = 0; a < 5; a++)
            for (int b = 0; b < 4; b++) {
                k.kc = KCS[a];
                k.mc = MCS[b] * k.mr;
                double t0 = cpu_now();
                qkv_gemm_run(&k, 0, 1, M, N, K, 1.0f, A, K, B, K, 0.0f, C, N, 1);
                double t = cpu_now() - t0;
                if (t < best[a][b]) best[a][b] = t;
            }
    printf("cache-block sweep, kernel %s, M=%ld N=%ld K=%ld NT, 1 thread, GFLOP/s (CPU time, best of 7)\n",
           k.name, M, N, K);
    printf("%8s", "KC \\ MC");
    for (int b = 0; b < 4; b++) printf(" %7d", MCS[b] * k.mr);
    printf("\n");
    for (int a = 0; a < 5; a++) {
        printf("%8d", KCS[a]);
        for (int b = 0; b < 4; b++) printf(" %7.1f", 2.0 * (double)(M * N * K) / best[a][b] * 1e-9);
        printf("\n");
    }
    free(A);
    free(B);
    free(C);
    return 0;
}

/* The bf16 and int8 dot-product instructions against the FMA, 1 thread:
 * the most a bf16 or int8 product can gain over fp32 on this CPU. */
static void dot_peaks(void) {
    double fma = bench_isa_supported(BENCH_ISA_AVX512) ? bench_peak_gflops(BENCH_ISA_AVX512, 1, 0.2, 5, NULL) : 0;
    if (fma <= 0) return;
    if (qkv_cpu_has_avx512bf16()) {
        double g = bench_dot_peak(BENCH_DOT_BF16, 0.2, 5);
        printf("bf16 dot products (vdpbf16ps, 1 thread): %.1f GFLOP/s, %.2fx the fp32 FMA\n", g, g / fma);
    }
    if (qkv_cpu_has_avx512vnni()) {
        double g = bench_dot_peak(BENCH_DOT_VNNI, 0.2, 5);
        printf("int8 dot products (vpdpbusd, 1 thread): %.1f GOP/s, %.2fx the fp32 FMA\n", g, g / fma);
    }
}

static void bench_bf16_one(long M, long N, long K, int threads, int reps) {
    float *A = malloc(sizeof(float) * (size_t)(M * K)), *B = malloc(sizeof(float) * (size_t)(K * N));
    float *C = malloc(sizeof(float) * (size_t)(M * N));
    double *t[3] = {malloc(sizeof(double) * (size_t)reps), malloc(sizeof(double) * (size_t)reps),
                    malloc(sizeof(double) * (size_t)reps)};
    qkv_gemm_bf16_b wp;
    memset(&wp, 0, sizeof wp);
    if (!A || !B || !C || !t[0] || !t[1] || !t[2]) {
        printf("out of memory\n");
        goto done;
    }
    for (long i = 0; i < M * K; i++) A[i] = frand();
    for (long i = 0; i < K * N; i++) B[i] = frand();
    qkv_status st = qkv_gemm_bf16_pack_b(1, K, N, B, K, threads, &wp);
    if (st == QKV_OK) st = qkv_gemm_bf16(0, 1, M, N, K, 1.0f, A, K, B, K, 0.0f, C, N, NULL, threads);
    if (st != QKV_OK) {
        printf("bf16 product failed: %s\n", qkv_status_string(st));
        goto done;
    }
    double err = sampled_error(1, M, N, K, A, B, C);
    for (int rep = 0; rep < reps; rep++)
        for (int turn = 0; turn < 3; turn++) {
            int which = (turn + rep) % 3; /* 0 sgemm, 1 bf16 one-shot, 2 bf16 pre-packed */
            settle();
            double t0 = g_clock();
            if (which == 0)
                qkv_sgemm(0, 1, M, N, K, 1.0f, A, K, B, K, 0.0f, C, N, threads);
            else if (which == 1)
                qkv_gemm_bf16(0, 1, M, N, K, 1.0f, A, K, B, K, 0.0f, C, N, NULL, threads);
            else
                qkv_gemm_bf16_packed(0, M, 1.0f, A, K, &wp, 0.0f, C, N, NULL, threads);
            t[which][rep] = g_clock() - t0;
        }
    double flops = 2.0 * (double)M * (double)N * (double)K, g[3];
    for (int w = 0; w < 3; w++) g[w] = flops / bench_median(t[w], reps) * 1e-9;
    printf("%6ld %5ld %5ld %3d  %8.1f  %8.1f %5.2fx  %8.1f %5.2fx   %.1e\n", M, N, K, threads, g[0], g[1],
           g[1] / g[0], g[2], g[2] / g[0], err);
    fflush(stdout);
done:
    qkv_gemm_bf16_b_free(&wp);
    for (int w = 0; w < 3; w++) free(t[w]);
    free(A);
    free(B);
    free(C);
}

static int bench_bf16(int threads, int reps) {
    if (threads <= 0) threads = 2;
    printf("qkv %s, bf16 kernel %s, reps %d (medians of %s)\n", qkv_version(), qkv_gemm_bf16_kernel_active()->name,
           reps, g_clock == cpu_now ? "process CPU time" : "wall time");
    dot_peaks();
    printf("%6s %5s %5s %3s  %8s  %8s %6s  %8s %6s   %s\n", "M", "N", "K", "thr", "sgemm", "bf16", "ratio",
           "packed", "ratio", "bf16 max rel. err");
    static const long SQ[] = {512, 1024, 2048};
    for (int i = 0; i < 3; i++) bench_bf16_one(SQ[i], SQ[i], SQ[i], threads, reps);
    static const long Ms[] = {128, 512, 1024, 4096};
    static const long NK[][2] = {{384, 384}, {1536, 384}, {384, 1536}};
    for (int s = 0; s < 3; s++)
        for (int i = 0; i < 4; i++) bench_bf16_one(Ms[i], NK[s][0], NK[s][1], threads, reps);
    return 0;
}

int main(int argc, char **argv) {
    int reps = 11, quick = 0, nn = 0, peak = 1, only_threads = 0, bf16 = 0, settle_set = 0, sweep_ = 0;
    long sm = 0, sn = 0, sk = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--nn")) nn = 1;
        else if (!strcmp(argv[i], "--no-peak")) peak = 0;
        else if (!strcmp(argv[i], "--sweep")) sweep_ = 1;
        else if (!strcmp(argv[i], "--cpu")) g_clock = cpu_now;
        else if (!strcmp(argv[i], "--settle") && i + 1 < argc) {
            g_settle_s = atof(argv[++i]) * 1e-3;
            settle_set = 1;
        } else if (!strcmp(argv[i], "--bf16")) bf16 = 1;
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) only_threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--shape") && i + 3 < argc) {
            sm = atol(argv[++i]);
            sn = atol(argv[++i]);
            sk = atol(argv[++i]);
        } else {
            fprintf(stderr, "usage: %s [--reps R] [--quick] [--shape M N K] [--nn] [--threads T] [--no-peak] [--settle MS] [--sweep] [--cpu] [--bf16]\n", argv[0]);
            return 2;
        }
    }
    if (reps < 1) reps = 1;
    if (sweep_) return sm > 0 ? sweep(sm, sn, sk) : sweep(4096, 512, 512);
    if (bf16) { /* no OpenBLAS workers to wait for: a short pause */
        if (!settle_set) g_settle_s = 0.02;
        return bench_bf16(only_threads, reps);
    }
    load_openblas();
    printf("qkv %s, reps %d (medians of %s)\n", qkv_version(), reps,
           g_clock == cpu_now ? "process CPU time" : "wall time");
    if (peak) {
        bench_isa isa = bench_isa_best();
        for (int t = 1; t <= 2; t++) {
            double med = 0.0, best = bench_peak_gflops(isa, t, 0.2, 5, &med);
            printf("FP32 FMA peak (%s, %d thread%s): best %.1f, median %.1f GFLOP/s\n",
                   bench_isa_name(isa), t, t > 1 ? "s" : "", best, med);
        }
        dot_peaks();
    }
    printf("%6s %5s %4s %s %3s  %8s  %8s  %6s   %s\n", "M", "N", "K", "op", "thr",
           "qkv", "OpenBLAS", "ratio", "max rel. err qkv / OpenBLAS");
    static const long Ms[] = {512, 2048, 4096, 8192};
    static const long Ns[] = {512, 1536};
    for (int t = 1; t <= 2; t++) {
        if (only_threads && t != only_threads) continue;
        if (sm) {
            bench_one(!nn, sm, sn, sk, t, reps);
            continue;
        }
        for (int in = 0; in < 2; in++)
            for (int im = 0; im < 4; im++) {
                if (quick && (Ms[im] != 4096 || Ns[in] != 512)) continue;
                bench_one(!nn, Ms[im], Ns[in], 512, t, reps);
            }
        if (!quick) bench_one(0, 4096, 512, 512, t, reps); /* NN at the target shape */
    }
    return 0;
}
