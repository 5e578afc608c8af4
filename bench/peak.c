/* The FP32 FMA peak of the CPU running the benchmark, measured (see peak.h for why). */
#define _POSIX_C_SOURCE 200809L

#include "peak.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define BENCH_X86 1
#include <immintrin.h>
#endif

double bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double bench_cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double thread_cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Written at the end of every loop so the compiler must compute the
 * accumulators; never read. */
static volatile float bench_sink;

/* acc = acc * a + b with a < 1: the values converge to b / (1 - a) and never
 * overflow or become subnormal, whatever the iteration count. The constants
 * and the starting values are read from volatiles: a compiler that could see
 * them might prove a chain constant (1.0 is a fixed point of these a, b in
 * float) and drop its FMAs, inflating the "peak" - clang 14 did exactly that. */
static volatile float peak_a = 0.999999f, peak_b = 1e-6f, peak_seed = 0.1f;

#ifdef BENCH_X86
/* The 16 chains of the zmm loops: distinct starts d, 2d, ..., 16d (equal
 * starts would let a compiler merge chains into one), and their sum at the
 * end, written to bench_sink so the compiler must compute them. */
#define CHAINS16(T, ADD, d)                                                                         \
    T c0 = d, c1 = ADD(c0, d), c2 = ADD(c1, d), c3 = ADD(c2, d), c4 = ADD(c3, d), c5 = ADD(c4, d),   \
      c6 = ADD(c5, d), c7 = ADD(c6, d), c8 = ADD(c7, d), c9 = ADD(c8, d), c10 = ADD(c9, d),         \
      c11 = ADD(c10, d), c12 = ADD(c11, d), c13 = ADD(c12, d), c14 = ADD(c13, d), c15 = ADD(c14, d)
#define SUM16(ADD)                                                                                  \
    ADD(ADD(ADD(ADD(c0, c1), ADD(c2, c3)), ADD(ADD(c4, c5), ADD(c6, c7))),                          \
        ADD(ADD(ADD(c8, c9), ADD(c10, c11)), ADD(ADD(c12, c13), ADD(c14, c15))))
#define EACH16(OP) OP(c0); OP(c1); OP(c2); OP(c3); OP(c4); OP(c5); OP(c6); OP(c7); \
    OP(c8); OP(c9); OP(c10); OP(c11); OP(c12); OP(c13); OP(c14); OP(c15)

/* 16 independent zmm chains: Zen 4 and Intel cores have an FMA latency of 4
 * and at most 2 FMA ports, so 8 chains already fill them; 16 leave margin and
 * still fit the 32 registers with the two constants. Flops per iteration:
 * 16 chains x 16 lanes x 2. */
__attribute__((target("avx512f"))) static void fma_loop_avx512(uint64_t iters) {
    const __m512 a = _mm512_set1_ps(peak_a), b = _mm512_set1_ps(peak_b);
    const __m512 d = _mm512_set1_ps(peak_seed);
    CHAINS16(__m512, _mm512_add_ps, d);
#define FMA(c) c = _mm512_fmadd_ps(c, a, b)
    for (uint64_t i = 0; i < iters; i++) {
        EACH16(FMA);
    }
#undef FMA
    float out[16];
    _mm512_storeu_ps(out, SUM16(_mm512_add_ps));
    bench_sink = out[0];
}

/* 12 ymm chains (16 registers: 12 + 2 constants). 12 x 8 lanes x 2 flops. */
__attribute__((target("avx2,fma"))) static void fma_loop_avx2(uint64_t iters) {
    const __m256 a = _mm256_set1_ps(peak_a), b = _mm256_set1_ps(peak_b);
    const __m256 d = _mm256_set1_ps(peak_seed);
    __m256 c0 = d, c1 = _mm256_add_ps(c0, d), c2 = _mm256_add_ps(c1, d), c3 = _mm256_add_ps(c2, d),
           c4 = _mm256_add_ps(c3, d), c5 = _mm256_add_ps(c4, d), c6 = _mm256_add_ps(c5, d),
           c7 = _mm256_add_ps(c6, d), c8 = _mm256_add_ps(c7, d), c9 = _mm256_add_ps(c8, d),
           c10 = _mm256_add_ps(c9, d), c11 = _mm256_add_ps(c10, d);
    for (uint64_t i = 0; i < iters; i++) {
        c0 = _mm256_fmadd_ps(c0, a, b);
        c1 = _mm256_fmadd_ps(c1, a, b);
        c2 = _mm256_fmadd_ps(c2, a, b);
        c3 = _mm256_fmadd_ps(c3, a, b);
        c4 = _mm256_fmadd_ps(c4, a, b);
        c5 = _mm256_fmadd_ps(c5, a, b);
        c6 = _mm256_fmadd_ps(c6, a, b);
        c7 = _mm256_fmadd_ps(c7, a, b);
        c8 = _mm256_fmadd_ps(c8, a, b);
        c9 = _mm256_fmadd_ps(c9, a, b);
        c10 = _mm256_fmadd_ps(c10, a, b);
        c11 = _mm256_fmadd_ps(c11, a, b);
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(c0, c1), _mm256_add_ps(c2, c3)),
                             _mm256_add_ps(_mm256_add_ps(c4, c5), _mm256_add_ps(c6, c7)));
    s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(c8, c9), _mm256_add_ps(c10, c11)));
    float out[8];
    _mm256_storeu_ps(out, s);
    bench_sink = out[0];
}
#endif

/* 16 chains of vdpbf16ps / vpdpbusd: c += pairs of a x b. The bf16 pairs
 * are tiny (1e-6 and 1), so no chain overflows in any run length; integer
 * chains wrap, which the hardware defines. */
#if defined(__GNUC__) && (__GNUC__ >= 11 || (defined(__clang__) && __clang_major__ >= 11))
#define BENCH_DOT 1
__attribute__((target("avx512f,avx512bf16"))) static void dot_loop_bf16(uint64_t iters) {
    const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3586 /* ~1e-6 */), b = (__m512bh)_mm512_set1_epi16(0x3F80);
    const __m512 d = _mm512_set1_ps(peak_seed);
    CHAINS16(__m512, _mm512_add_ps, d);
#define BF16(c) c = _mm512_dpbf16_ps(c, a, b)
    for (uint64_t i = 0; i < iters; i++) {
        EACH16(BF16);
    }
#undef BF16
    float out[16];
    _mm512_storeu_ps(out, SUM16(_mm512_add_ps));
    bench_sink = out[0];
}
__attribute__((target("avx512f,avx512vnni"))) static void dot_loop_vnni(uint64_t iters) {
    const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-5);
    const __m512i d = _mm512_set1_epi32((int)(peak_seed * 10) + 1);
    CHAINS16(__m512i, _mm512_add_epi32, d);
    /* asm: gcc 12 copies each accumulator around the intrinsic (two moves
     * per vpdpbusd), which would time the moves */
#define VNNI(c) __asm__("vpdpbusd %1, %2, %0" : "+v"(c) : "v"(b), "v"(a))
    for (uint64_t i = 0; i < iters; i++) {
        EACH16(VNNI);
    }
#undef VNNI
    int out[16];
    _mm512_storeu_si512(out, SUM16(_mm512_add_epi32));
    bench_sink = (float)out[0];
}
#endif

/* Portable: 32 independent scalar chains the compiler may vectorise. Without
 * FMA contraction (-std=c11 turns it off) this is a multiply and an add, still
 * counted as 2 flops. */
#define GENERIC_CHAINS 32
static void fma_loop_generic(uint64_t iters) {
    const float a = peak_a, b = peak_b, d = peak_seed;
    float c[GENERIC_CHAINS];
    for (int k = 0; k < GENERIC_CHAINS; k++) c[k] = d * (float)(k + 1);
    for (uint64_t i = 0; i < iters; i++)
        for (int k = 0; k < GENERIC_CHAINS; k++) c[k] = c[k] * a + b;
    float s = 0.0f;
    for (int k = 0; k < GENERIC_CHAINS; k++) s += c[k];
    bench_sink = s;
}

static double flops_per_iter(bench_isa isa) {
    switch (isa) {
    case BENCH_ISA_AVX512: return 16.0 * 16.0 * 2.0;
    case BENCH_ISA_AVX2: return 12.0 * 8.0 * 2.0;
    default: return (double)GENERIC_CHAINS * 2.0;
    }
}

typedef void (*loop_fn)(uint64_t iters);

static loop_fn fma_loop(bench_isa isa) {
#ifdef BENCH_X86
    if (isa == BENCH_ISA_AVX512) return fma_loop_avx512;
    if (isa == BENCH_ISA_AVX2) return fma_loop_avx2;
#endif
    (void)isa;
    return fma_loop_generic;
}

int bench_isa_supported(bench_isa isa) {
    switch (isa) {
    case BENCH_ISA_GENERIC: return 1;
#ifdef BENCH_X86
    case BENCH_ISA_AVX2:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case BENCH_ISA_AVX512:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512f");
#endif
    default: return 0;
    }
}

bench_isa bench_isa_best(void) {
    if (bench_isa_supported(BENCH_ISA_AVX512)) return BENCH_ISA_AVX512;
    if (bench_isa_supported(BENCH_ISA_AVX2)) return BENCH_ISA_AVX2;
    return BENCH_ISA_GENERIC;
}

const char *bench_isa_name(bench_isa isa) {
    switch (isa) {
    case BENCH_ISA_AVX512: return "avx512f";
    case BENCH_ISA_AVX2: return "avx2+fma";
    default: return "generic";
    }
}

typedef struct peak_worker {
    pthread_t tid;
    atomic_int *go; /* 0: wait, 1: run, -1: give up */
    bench_isa isa;
    uint64_t iters;
    double t0, t1;
    double c0, c1; /* thread CPU time */
} peak_worker;

static void *peak_worker_main(void *arg) {
    peak_worker *w = arg;
    int go;
    while ((go = atomic_load(w->go)) == 0) {
    }
    if (go < 0) return NULL;
    w->c0 = thread_cpu_now();
    w->t0 = bench_now();
    fma_loop(w->isa)(w->iters);
    w->t1 = bench_now();
    w->c1 = thread_cpu_now();
    return NULL;
}

/* One trial: `threads` threads released together; GFLOP/s over the span from
 * the first start to the last finish. 0 on failure. */
static double peak_trial(bench_isa isa, int threads, uint64_t iters, double *cpu_best) {
    peak_worker *w = calloc((size_t)threads, sizeof *w);
    if (!w) return 0.0;
    atomic_int go;
    atomic_init(&go, 0);
    for (int t = 0; t < threads; t++) {
        w[t].go = &go;
        w[t].isa = isa;
        w[t].iters = iters;
    }
    int started = 0;
    for (int t = 1; t < threads; t++) {
        if (pthread_create(&w[t].tid, NULL, peak_worker_main, &w[t]) != 0) break;
        started++;
    }
    int ok = started == threads - 1;
    atomic_store(&go, ok ? 1 : -1);
    if (ok) peak_worker_main(&w[0]);
    for (int t = 1; t <= started; t++) pthread_join(w[t].tid, NULL);
    double gf = 0.0;
    if (ok) {
        double t0 = w[0].t0, t1 = w[0].t1;
        for (int t = 1; t < threads; t++) {
            if (w[t].t0 < t0) t0 = w[t].t0;
            if (w[t].t1 > t1) t1 = w[t].t1;
        }
        gf = (double)threads * (double)iters * flops_per_iter(isa) / (t1 - t0) * 1e-9;
        if (cpu_best)
            for (int t = 0; t < threads; t++) {
                double c = (double)iters * flops_per_iter(isa) / (w[t].c1 - w[t].c0) * 1e-9;
                if (w[t].c1 > w[t].c0 && c > *cpu_best) *cpu_best = c;
            }
    }
    free(w);
    return gf;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Iterations of the loop for about `seconds` on one thread. */
static uint64_t calibrate(loop_fn loop, double seconds) {
    if (seconds < 0.01) seconds = 0.01;
    uint64_t iters = 1u << 16;
    for (;;) {
        double t0 = bench_now();
        loop(iters);
        double dt = bench_now() - t0;
        if (dt > 0.02 || iters > (UINT64_C(1) << 40)) return (uint64_t)((double)iters * seconds / dt) + 1;
        iters *= 4;
    }
}

double bench_peak_gflops(bench_isa isa, int threads, double seconds, int trials, double *median) {
    if (median) *median = 0.0;
    if (!bench_isa_supported(isa) || threads < 1 || trials < 1) return 0.0;
    uint64_t iters = calibrate(fma_loop(isa), seconds); /* also the warm-up */
    double *g = calloc((size_t)trials, sizeof *g);
    if (!g) return 0.0;
    double best = 0.0;
    for (int r = 0; r < trials; r++) {
        g[r] = peak_trial(isa, threads, iters, NULL);
        if (g[r] > best) best = g[r];
    }
    qsort(g, (size_t)trials, sizeof *g, cmp_double);
    if (median) *median = g[trials / 2];
    free(g);
    return best;
}

double bench_peak_core_cpu_gflops(bench_isa isa, int threads, double seconds, int trials) {
    if (!bench_isa_supported(isa) || threads < 1 || trials < 1) return 0.0;
    uint64_t iters = calibrate(fma_loop(isa), seconds);
    double best = 0.0;
    for (int r = 0; r < trials; r++) peak_trial(isa, threads, iters, &best);
    return best;
}

double bench_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double bench_dot_peak(bench_dot kind, double seconds, int trials) {
#if defined(BENCH_X86) && defined(BENCH_DOT)
    const loop_fn loop = kind == BENCH_DOT_BF16 ? dot_loop_bf16 : dot_loop_vnni;
    const double ops = 16.0 * (kind == BENCH_DOT_BF16 ? 64.0 : 128.0);
    const uint64_t iters = calibrate(loop, seconds); /* also the warm-up */
    double best = 0.0;
    for (int t = 0; t < trials; t++) {
        double t0 = bench_now();
        loop(iters);
        double r = ops * (double)iters / (bench_now() - t0) * 1e-9;
        if (r > best) best = r;
    }
    return best;
#else
    (void)kind;
    (void)seconds;
    (void)trials;
    return 0.0;
#endif
}
