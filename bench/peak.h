/* peak.h - the FP32 FMA peak of the CPU running a benchmark, measured.
 *
 * The benchmarks quote every GFLOP/s as a fraction of the peak measured in the
 * same run (the development machines are shared and noisy, so a datasheet
 * number or one measured yesterday would flatter or punish by chance).
 *
 * The measurement is a dependency-free FMA throughput loop: many independent
 * accumulators (16 zmm / 12 ymm, more than latency x ports on any current x86
 * core), each updated by one FMA per iteration, nothing else in the loop but
 * the counter. The widest ISA the CPU and the OS support is chosen at run time
 * (__builtin_cpu_supports checks CPUID and, through libgcc/compiler-rt, that
 * the OS saves the registers); the ISA loops are compiled with target
 * attributes, so the program itself runs on any x86-64. Elsewhere a portable C
 * loop stands in (whatever the compiler makes of it at -O2). */
#ifndef QKV_BENCH_PEAK_H
#define QKV_BENCH_PEAK_H

typedef enum bench_isa {
    BENCH_ISA_GENERIC = 0, /* portable C */
    BENCH_ISA_AVX2 = 1,    /* AVX2 + FMA, 8 floats per FMA */
    BENCH_ISA_AVX512 = 2   /* AVX-512F, 16 floats per FMA */
} bench_isa;

/* The widest ISA this CPU and OS support. */
bench_isa bench_isa_best(void);

/* 1 when this CPU and OS support `isa`. */
int bench_isa_supported(bench_isa isa);

/* "avx512f", "avx2+fma" or "generic". */
const char *bench_isa_name(bench_isa isa);

/* FP32 FLOPs (an FMA counts 2) per second, in GFLOP/s, of `threads` threads
 * each running the FMA loop of `isa` for about `seconds` (at least 0.01) at
 * the same time; the wall time of the slowest thread counts. Returns the best
 * of `trials` trials (noise from other processes only ever lowers it, so the
 * best is the closest to the hardware's ceiling and fractions quoted against
 * it are conservative) and, when median != NULL, the median in *median.
 * Returns 0 when isa is not supported or a thread could not be started. */
double bench_peak_gflops(bench_isa isa, int threads, double seconds, int trials, double *median);

/* The same loop's GFLOP/s per core in CPU time: each of `threads` threads
 * divides its flops by its own CPU time (CLOCK_THREAD_CPUTIME_ID), so time the
 * thread spent descheduled by other processes does not count. Best over the
 * threads and `trials` trials. On a shared machine this is the stable
 * denominator for a program's CPU-time rate (see bench_cpu_now). 0 when isa
 * is not supported. */
double bench_peak_core_cpu_gflops(bench_isa isa, int threads, double seconds, int trials);

/* The dot-product instructions beside the FMA: the work per second of one
 * thread running 16 independent zmm chains of AVX512-BF16 vdpbf16ps (32
 * bf16 pairs: 64 FLOPs per instruction) or AVX512-VNNI vpdpbusd (64 u8 x s8
 * pairs: 128 integer OPs), best of `trials` runs of about `seconds`. How
 * much faster a bf16 or int8 path can be than fp32 on this CPU is this over
 * bench_peak_gflops(BENCH_ISA_AVX512, 1, ...): 2x and 4x on Zen 4, but 0.5x
 * (bf16) on some Intel Xeons. The caller checks that the CPU has the
 * instructions (the loops are compiled with target attributes); 0 where the
 * compiler cannot build them. */
typedef enum bench_dot { BENCH_DOT_BF16 = 0, BENCH_DOT_VNNI = 1 } bench_dot;
double bench_dot_peak(bench_dot kind, double seconds, int trials);

/* The median of v[0..n) (n >= 1), sorting v in place. */
double bench_median(double *v, int n);

/* Monotonic clock in seconds. */
double bench_now(void);

/* CPU time of the whole process (all its threads) in seconds. */
double bench_cpu_now(void);

#endif
