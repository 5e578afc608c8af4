/* bench_attention - speed and memory of qkv's attention, against the CPU's
 * FP32 FMA peak measured in the same run, the reference and a plain
 * materialise-the-matrix version, all in the same run.
 *
 * What it prints, as Markdown (paste into docs/BENCHMARKS.md):
 *   1. the machine and the measured FMA peak (1 thread and every thread count
 *      used; AVX2 too on an AVX-512 machine);
 *   2. the error of every implementation against the reference run in double
 *      on a small case, forward and backward (the error first, then the
 *      timings);
 *   3. for every n, mask, pass and thread count: median time over the
 *      repetitions, GFLOP/s, the fraction of the measured peak of the threads
 *      used, the speed-up over the naive version and the resident memory the
 *      call needed beyond its inputs and outputs;
 *   4. optionally (--long) the exact forward at n = 131072, one head, D = 64,
 *      and (--window) sliding-window attention from n = 65536 to 1048576;
 *   5. the peak measured again at the end (how noisy the run was) and the
 *      performance targets beside the measured values.
 *
 * FLOPs are counted as FlashAttention reports them: forward 4*B*H*n_q*n_k*D
 * (two matrix products), halved for causal; backward 2.5x the forward.
 *
 * Only the public API is used (and the header-only generator core/rng.h).
 * Every measurement runs in a forked child, so that each has its own peak
 * resident set (getrusage's ru_maxrss only ever grows) and so that no thread
 * pool or OpenMP runtime is ever inherited across a fork: the parent itself
 * never calls the library. Benchmarks are never asserted in CI; this program
 * only reports. */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "peak.h"
#include "core/rng.h"
#include "qkv.h"

/* ------------------------------------------------------------------------- */
/* Options */

#define MAX_LIST 16

/* fast-alibi, fast-rel: the fast path with ALiBi (the paper's slopes) or
 * T5's relative buckets (32, up to distance 128, bidirectional without a
 * mask; the backward also computes d_rel_table), beside the plain one.
 * dropout: the fast path with attention dropout (--dropout P). */
typedef enum impl_kind {
    IMPL_FAST = 0, IMPL_AUTO, IMPL_REFERENCE, IMPL_NAIVE, IMPL_FAST_ALIBI, IMPL_FAST_REL, IMPL_DROPOUT, IMPL_COUNT
} impl_kind;
static const char *const impl_names[IMPL_COUNT] = {"fast",       "auto",     "reference", "naive",
                                                   "fast-alibi", "fast-rel", "dropout"};
#define BENCH_REL_BUCKETS 32

typedef struct options {
    int64_t batch, heads, dim;
    int64_t n[MAX_LIST];
    int n_count;
    int threads[MAX_LIST];
    int threads_count;
    int impls[MAX_LIST];
    int impl_count;
    int causal[2];
    int causal_count;
    int passes[2]; /* 0 forward, 1 backward */
    int pass_count;
    int reps;
    double max_seconds;   /* per row: fewer repetitions (at least 3) beyond this */
    double max_row_seconds; /* skip a row predicted (from a smaller n) to take longer */
    int pair_reps;        /* rounds of the paired causal/full forward (0: none) */
    int pair_warm;        /* also pair with the inputs and outputs read into cache first */
    int64_t ref_max_n;    /* reference skipped above this n */
    double naive_max_mib; /* naive skipped when its n x n buffers exceed this */
    int check;            /* the error table */
    int64_t check_n;
    int table;            /* the main table */
    int long_run;         /* --long */
    int64_t long_n;
    int window;           /* --window */
    int64_t window_left, window_right, window_min_n, window_max_n;
    bench_isa peak_isa;
    double peak_seconds;
    int peak_trials;
    uint64_t seed;
    double dropout;       /* p of the dropout impl */
} options;

static void usage(FILE *f) {
    fprintf(f,
            "usage: bench_attention [options]\n"
            "  --n LIST            sequence lengths (default 512,1024,4096,16384)\n"
            "  --batch B --heads H --dim D   (default 1, 8, 64)\n"
            "  --threads LIST      thread counts (default: the online cores)\n"
            "  --impl LIST         fast,auto,reference,naive,fast-alibi,fast-rel,dropout\n"
            "                      (default fast,reference,naive; fast-alibi / fast-rel: the fast path\n"
            "                      with ALiBi / T5 relative buckets, not in the error table; dropout:\n"
            "                      the fast path with attention dropout)\n"
            "  --dropout P         its probability (default 0.1)\n"
            "  --causal LIST       0,1 (default 0,1)\n"
            "  --pass LIST         fwd,bwd (default fwd,bwd)\n"
            "  --reps R            timed repetitions after one warm-up (default 5)\n"
            "  --max-seconds S     per row; fewer repetitions (never under 3) beyond (default 30)\n"
            "  --max-row-seconds S skip a row that the same impl's time at a smaller n predicts\n"
            "                      (x n^2) to take longer than S, warm-up and 3 runs (default 300)\n"
            "  --pair-reps R       rounds of causal and full forward calls alternating, for the\n"
            "                      causal-cost ratio (default 21; fewer beyond --max-seconds; 0: none)\n"
            "  --pair-warm         pair once more with Q, K, V read and O written into cache right\n"
            "                      before every call (as after the projections that make them)\n"
            "  --ref-max-n N       skip the reference above n = N (default 1024)\n"
            "  --naive-max-mib M   skip the naive version when its n x n buffers exceed M MiB\n"
            "                      (default 1024)\n"
            "  --no-check          skip the error table;  --check-n N  its n (default 257)\n"
            "  --no-table          skip the main table\n"
            "  --long              exact forward at n = 131072, one head, D = 64 (memory check)\n"
            "  --long-n N          its n (default 131072)\n"
            "  --window            sliding window (left = right = 256), one head, D = 64,\n"
            "                      n = 65536 .. 1048576 doubling\n"
            "  --window-size L     left = right = L;  --window-max-n N  largest n\n"
            "  --window-min-n N    smallest n (default 65536)\n"
            "  --peak-isa ISA      avx512|avx2|generic: denominator of the fractions\n"
            "                      (default: the QKV_ARCH environment variable, else the widest)\n"
            "  --peak-seconds S    per peak trial (default 0.25); --peak-trials T (default 7)\n"
            "  --seed S            random inputs (default 1)\n");
}

static int parse_i64_list(const char *s, int64_t *out, int max) {
    int n = 0;
    while (*s) {
        char *end;
        errno = 0;
        long long v = strtoll(s, &end, 10);
        if (end == s || errno || v < 0 || n == max) return -1;
        out[n++] = (int64_t)v;
        s = end;
        if (*s == ',') s++;
        else if (*s) return -1;
    }
    return n;
}

static int parse_name_list(const char *s, const char *const *names, int count, int *out, int max) {
    int n = 0;
    while (*s) {
        size_t len = strcspn(s, ",");
        int found = -1;
        for (int i = 0; i < count; i++)
            if (strlen(names[i]) == len && strncmp(s, names[i], len) == 0) found = i;
        if (found < 0 || n == max) return -1;
        out[n++] = found;
        s += len;
        if (*s == ',') s++;
    }
    return n;
}

static int64_t parse_i64(const char *s, int *ok) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end || errno || v < 0) *ok = 0;
    return (int64_t)v;
}

static bench_isa isa_from_name(const char *s, int *ok) {
    if (strcmp(s, "avx512") == 0 || strcmp(s, "avx512f") == 0) return BENCH_ISA_AVX512;
    if (strcmp(s, "avx2") == 0) return BENCH_ISA_AVX2;
    if (strcmp(s, "generic") == 0) return BENCH_ISA_GENERIC;
    *ok = 0;
    return BENCH_ISA_GENERIC;
}

static int parse_options(int argc, char **argv, options *o) {
    memset(o, 0, sizeof *o);
    o->batch = 1;
    o->heads = 8;
    o->dim = 64;
    const int64_t default_n[] = {512, 1024, 4096, 16384};
    for (int i = 0; i < 4; i++) o->n[i] = default_n[i];
    o->n_count = 4;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    o->threads[0] = cores > 0 ? (int)cores : 1;
    o->threads_count = 1;
    o->impls[0] = IMPL_FAST;
    o->impls[1] = IMPL_REFERENCE;
    o->impls[2] = IMPL_NAIVE;
    o->impl_count = 3;
    o->causal[0] = 0;
    o->causal[1] = 1;
    o->causal_count = 2;
    o->passes[0] = 0;
    o->passes[1] = 1;
    o->pass_count = 2;
    o->reps = 5;
    o->max_seconds = 30.0;
    o->max_row_seconds = 300.0;
    o->pair_reps = 21;
    o->ref_max_n = 1024;
    o->naive_max_mib = 1024.0;
    o->check = 1;
    o->check_n = 257;
    o->table = 1;
    o->long_n = 131072;
    o->window_left = o->window_right = 256;
    o->window_min_n = 65536;
    o->window_max_n = 1048576;
    o->peak_seconds = 0.25;
    o->peak_trials = 7;
    o->seed = 1;
    o->dropout = 0.1;
    o->peak_isa = bench_isa_best();
    const char *arch = getenv("QKV_ARCH");
    if (arch && *arch) {
        int ok = 1;
        bench_isa isa = isa_from_name(arch, &ok);
        if (ok && bench_isa_supported(isa)) o->peak_isa = isa;
    }

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = 1, used = 1;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            exit(0);
        } else if (strcmp(a, "--no-check") == 0) {
            o->check = 0;
            used = 0;
        } else if (strcmp(a, "--no-table") == 0) {
            o->table = 0;
            used = 0;
        } else if (strcmp(a, "--long") == 0) {
            o->long_run = 1;
            used = 0;
        } else if (strcmp(a, "--window") == 0) {
            o->window = 1;
            used = 0;
        } else if (strcmp(a, "--pair-warm") == 0) {
            o->pair_warm = 1;
            used = 0;
        } else if (!v) {
            ok = 0;
        } else if (strcmp(a, "--n") == 0) {
            o->n_count = parse_i64_list(v, o->n, MAX_LIST);
            ok = o->n_count > 0;
        } else if (strcmp(a, "--threads") == 0) {
            int64_t t[MAX_LIST];
            o->threads_count = parse_i64_list(v, t, MAX_LIST);
            ok = o->threads_count > 0;
            for (int k = 0; ok && k < o->threads_count; k++) {
                ok = t[k] >= 1 && t[k] <= 1024;
                o->threads[k] = (int)t[k];
            }
        } else if (strcmp(a, "--impl") == 0) {
            o->impl_count = parse_name_list(v, impl_names, IMPL_COUNT, o->impls, MAX_LIST);
            ok = o->impl_count > 0;
        } else if (strcmp(a, "--causal") == 0) {
            int64_t c[MAX_LIST];
            int cnt = parse_i64_list(v, c, MAX_LIST);
            ok = cnt > 0 && cnt <= 2;
            for (int k = 0; ok && k < cnt; k++) {
                ok = c[k] <= 1;
                o->causal[k] = (int)c[k];
            }
            o->causal_count = cnt;
        } else if (strcmp(a, "--pass") == 0) {
            static const char *const pass_names[] = {"fwd", "bwd"};
            o->pass_count = parse_name_list(v, pass_names, 2, o->passes, 2);
            ok = o->pass_count > 0;
        } else if (strcmp(a, "--batch") == 0) {
            o->batch = parse_i64(v, &ok);
        } else if (strcmp(a, "--heads") == 0) {
            o->heads = parse_i64(v, &ok);
        } else if (strcmp(a, "--dim") == 0) {
            o->dim = parse_i64(v, &ok);
        } else if (strcmp(a, "--reps") == 0) {
            o->reps = (int)parse_i64(v, &ok);
            ok = ok && o->reps >= 1 && o->reps <= 1000;
        } else if (strcmp(a, "--max-seconds") == 0) {
            o->max_seconds = atof(v);
        } else if (strcmp(a, "--max-row-seconds") == 0) {
            o->max_row_seconds = atof(v);
        } else if (strcmp(a, "--pair-reps") == 0) {
            o->pair_reps = (int)parse_i64(v, &ok);
            ok = ok && o->pair_reps >= 0 && o->pair_reps <= 1000;
        } else if (strcmp(a, "--ref-max-n") == 0) {
            o->ref_max_n = parse_i64(v, &ok);
        } else if (strcmp(a, "--naive-max-mib") == 0) {
            o->naive_max_mib = atof(v);
        } else if (strcmp(a, "--check-n") == 0) {
            o->check_n = parse_i64(v, &ok);
        } else if (strcmp(a, "--long-n") == 0) {
            o->long_n = parse_i64(v, &ok);
        } else if (strcmp(a, "--window-size") == 0) {
            o->window_left = o->window_right = parse_i64(v, &ok);
        } else if (strcmp(a, "--window-min-n") == 0) {
            o->window_min_n = parse_i64(v, &ok);
        } else if (strcmp(a, "--window-max-n") == 0) {
            o->window_max_n = parse_i64(v, &ok);
        } else if (strcmp(a, "--peak-isa") == 0) {
            o->peak_isa = isa_from_name(v, &ok);
            ok = ok && bench_isa_supported(o->peak_isa);
        } else if (strcmp(a, "--dropout") == 0) {
            o->dropout = v ? atof(v) : -1.0;
            ok = o->dropout > 0.0 && o->dropout < 1.0;
        } else if (strcmp(a, "--peak-seconds") == 0) {
            o->peak_seconds = atof(v);
        } else if (strcmp(a, "--peak-trials") == 0) {
            o->peak_trials = (int)parse_i64(v, &ok);
            ok = ok && o->peak_trials >= 1;
        } else if (strcmp(a, "--seed") == 0) {
            o->seed = (uint64_t)parse_i64(v, &ok);
        } else {
            ok = 0;
        }
        if (!ok) {
            fprintf(stderr, "bench_attention: bad option or value: %s%s%s\n", a, v && used ? " " : "",
                    v && used ? v : "");
            usage(stderr);
            return 0;
        }
        i += used;
    }
    if (o->batch < 1 || o->heads < 1 || o->dim < 1 || o->check_n < 1 || o->long_n < 1 ||
        o->window_min_n < 1 || o->window_max_n < o->window_min_n) {
        fprintf(stderr, "bench_attention: sizes must be >= 1\n");
        return 0;
    }
    for (int k = 0; k < o->n_count; k++)
        if (o->n[k] < 1) {
            fprintf(stderr, "bench_attention: n must be >= 1\n");
            return 0;
        }
    return 1;
}

/* ------------------------------------------------------------------------- */
/* Small helpers */

/* Uniform on [-sqrt 3, sqrt 3): unit variance, like randn for attention's
 * purposes, without ties. */
static void fill_random(float *x, int64_t count, uint64_t seed) {
    uint64_t s = seed;
    for (int64_t i = 0; i < count; i++) {
        double u = splitmix64_unit(&s);
        x[i] = (float)((2.0 * u - 1.0) * 1.7320508075688772);
    }
}

static double max_rss_mib(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0.0;
    return (double)ru.ru_maxrss / 1024.0; /* Linux: kilobytes */
}


/* Allocated 64-byte aligned, as a framework's tensors are (PyTorch's CPU
 * allocator aligns to 64): a line-aligned output takes the forward's
 * streaming stores (src/attn/fast_fwd.c, FWD_STREAM_MIN_BYTES); plain
 * malloc's 16 bytes past a line would not. Then touched page by page so
 * the pages count as resident before the baseline is taken. */
static void *alloc_touched(size_t bytes) {
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64 + (bytes ? 0 : 64));
    if (p) memset(p, 0, bytes);
    return p;
}

/* ------------------------------------------------------------------------- */
/* The naive version: for each (b, h), S = scale * Q K^T materialised as an
 * n x n float matrix, a row-wise softmax, then O = P V. Float throughout,
 * plain loops in the cache-friendly i-d-j order (K packed transposed once per
 * head so the inner loop runs over contiguous keys), the project's default
 * flags: a standard float implementation, not a strawman.
 * Threads (pthreads) take whole heads. Causal rows stop at the diagonal
 * (n_q = n_k here, so bottom-right alignment is j <= i). */

typedef struct naive_args {
    int64_t batch, heads, dim, n;
    int causal;
    int backward;
    const float *q, *k, *v, *dout;
    float *out, *dq, *dk, *dv;
    int thread, threads;
    int failed;
} naive_args;

/* Fills S (n x n, rows i, keys < jmax(i)) with softmax probabilities. */
static void naive_probs(const float *q, const float *k, int64_t n, int64_t stride, int64_t D,
                        float scale, int causal, float *kt, float *S) {
    for (int64_t j = 0; j < n; j++)
        for (int64_t d = 0; d < D; d++) kt[d * n + j] = k[j * stride + d];
    for (int64_t i = 0; i < n; i++) {
        float *row = S + i * n;
        int64_t jmax = causal ? i + 1 : n;
        const float *qi = q + i * stride;
        for (int64_t j = 0; j < jmax; j++) row[j] = 0.0f;
        for (int64_t d = 0; d < D; d++) {
            float qd = qi[d] * scale;
            const float *kd = kt + d * n;
            for (int64_t j = 0; j < jmax; j++) row[j] += qd * kd[j];
        }
        float m = -INFINITY;
        for (int64_t j = 0; j < jmax; j++) m = row[j] > m ? row[j] : m;
        float sum = 0.0f;
        for (int64_t j = 0; j < jmax; j++) {
            row[j] = expf(row[j] - m); /* subtract the max: never overflows */
            sum += row[j];
        }
        float inv = 1.0f / sum;
        for (int64_t j = 0; j < jmax; j++) row[j] *= inv;
    }
}

static void *naive_worker(void *arg) {
    naive_args *a = arg;
    const int64_t n = a->n, H = a->heads, D = a->dim, stride = H * D;
    const float scale = (float)(1.0 / sqrt((double)D));
    float *kt = malloc((size_t)(D * n) * sizeof(float));
    float *S = malloc((size_t)n * (size_t)n * sizeof(float));
    float *tmp = malloc((size_t)(n > D ? n : D) * sizeof(float));
    if (!kt || !S || !tmp) {
        a->failed = 1;
        free(kt);
        free(S);
        free(tmp);
        return NULL;
    }
    for (int64_t bh = a->thread; bh < a->batch * H; bh += a->threads) {
        int64_t b = bh / H, h = bh % H;
        int64_t base = b * n * stride + h * D; /* element (b, 0, h, 0) */
        const float *q = a->q + base, *k = a->k + base, *v = a->v + base;
        naive_probs(q, k, n, stride, D, scale, a->causal, kt, S);
        if (!a->backward) {
            float *out = a->out + base;
            for (int64_t i = 0; i < n; i++) {
                const float *row = S + i * n;
                int64_t jmax = a->causal ? i + 1 : n;
                float *oi = tmp;
                for (int64_t d = 0; d < D; d++) oi[d] = 0.0f;
                for (int64_t j = 0; j < jmax; j++) {
                    float p = row[j];
                    const float *vj = v + j * stride;
                    for (int64_t d = 0; d < D; d++) oi[d] += p * vj[d];
                }
                for (int64_t d = 0; d < D; d++) out[i * stride + d] = oi[d];
            }
            continue;
        }
        /* Backward, one row of P at a time (P_i is all it needs):
         *   dV_j += P_ij dO_i;  dP_ij = dO_i . V_j;  D_i = sum_j P_ij dP_ij;
         *   dS_ij = P_ij (dP_ij - D_i);  dQ_i = scale sum_j dS_ij K_j;
         *   dK_j += scale dS_ij Q_i. */
        const float *dout = a->dout + base;
        float *dq = a->dq + base, *dk = a->dk + base, *dv = a->dv + base;
        for (int64_t j = 0; j < n; j++)
            for (int64_t d = 0; d < D; d++) dk[j * stride + d] = dv[j * stride + d] = 0.0f;
        for (int64_t i = 0; i < n; i++) {
            float *row = S + i * n;
            int64_t jmax = a->causal ? i + 1 : n;
            const float *doi = dout + i * stride, *qi = q + i * stride;
            float di = 0.0f;
            for (int64_t j = 0; j < jmax; j++) {
                const float *vj = v + j * stride;
                float *dvj = dv + j * stride;
                float p = row[j], dp = 0.0f;
                for (int64_t d = 0; d < D; d++) {
                    dvj[d] += p * doi[d];
                    dp += doi[d] * vj[d];
                }
                tmp[j] = dp;
                di += p * dp;
            }
            float *dqi = dq + i * stride;
            for (int64_t d = 0; d < D; d++) dqi[d] = 0.0f;
            for (int64_t j = 0; j < jmax; j++) {
                float ds = row[j] * (tmp[j] - di) * scale;
                const float *kj = k + j * stride;
                float *dkj = dk + j * stride;
                for (int64_t d = 0; d < D; d++) {
                    dqi[d] += ds * kj[d];
                    dkj[d] += ds * qi[d];
                }
            }
        }
    }
    free(kt);
    free(S);
    free(tmp);
    return NULL;
}

/* 0 on success, -1 when a thread or a buffer could not be had. */
static int naive_run(int64_t batch, int64_t heads, int64_t dim, int64_t n, int causal, int backward,
                     int threads, const float *q, const float *k, const float *v, const float *dout,
                     float *out, float *dq, float *dk, float *dv) {
    naive_args args[64];
    pthread_t tid[64];
    if (threads > 64) threads = 64;
    if ((int64_t)threads > batch * heads) threads = (int)(batch * heads);
    for (int t = 0; t < threads; t++) {
        naive_args a = {batch, heads, dim, n, causal, backward, q, k, v, dout, out, dq, dk, dv, t, threads, 0};
        args[t] = a;
    }
    int started = 0;
    for (int t = 1; t < threads; t++) {
        if (pthread_create(&tid[t], NULL, naive_worker, &args[t]) != 0) break;
        started++;
    }
    naive_worker(&args[0]);
    for (int t = 1; t <= started; t++) pthread_join(tid[t], NULL);
    int failed = started != threads - 1;
    for (int t = 0; t <= started; t++) failed |= args[t].failed;
    return failed ? -1 : 0;
}

/* MiB of n x n float buffers the naive version holds at once. */
static double naive_mib(int64_t n, int threads, const options *o) {
    int64_t t = threads;
    if (t > o->batch * o->heads) t = o->batch * o->heads;
    return (double)n * (double)n * 4.0 * (double)t / 1048576.0;
}

/* ------------------------------------------------------------------------- */
/* Jobs run in a forked child; the result comes back through a pipe. */

typedef enum job_status { JOB_OK = 0, JOB_SKIPPED, JOB_UNAVAILABLE, JOB_FAILED } job_status;

typedef struct job_result {
    int status;
    char note[200];
    double median_s, min_s;
    double cpu_median_s; /* process CPU time (all threads) of a call, median */
    int reps;
    double base_mib;  /* resident after inputs and outputs were allocated and touched */
    double peak_mib;  /* resident high-water mark at the end */
    double err, err_scale;
    double ratio, ratio_lo, ratio_hi; /* job_pair: median causal/full ratio, quartiles */
} job_result;

typedef struct job {
    const options *o;
    int impl;
    int backward;
    int causal;
    int64_t batch, heads, n, dim;
    int threads;
    int window; /* QKV_MASK_WINDOW with o->window_left/right */
    int warm;   /* job_pair: inputs and outputs read into cache before every call */
} job;

static qkv_impl impl_value(int impl) {
    if (impl == IMPL_FAST || impl == IMPL_FAST_ALIBI || impl == IMPL_FAST_REL || impl == IMPL_DROPOUT)
        return QKV_IMPL_FAST;
    return impl == IMPL_AUTO ? QKV_IMPL_AUTO : QKV_IMPL_REFERENCE;
}

/* The position-bias parameters of fast-alibi / fast-rel (float, one set
 * per child process); 0 when out of memory (job_time notes it). */
static float *g_slopes, *g_rel_table, *g_d_rel_table;
static int bench_pos_params(int64_t heads) {
    if (g_slopes) return 1;
    g_slopes = malloc((size_t)heads * sizeof(float));
    g_rel_table = malloc((size_t)(heads * BENCH_REL_BUCKETS) * sizeof(float));
    g_d_rel_table = malloc((size_t)(heads * BENCH_REL_BUCKETS) * sizeof(float));
    if (!g_slopes || !g_rel_table || !g_d_rel_table || qkv_alibi_slopes(heads, g_slopes) != QKV_OK) {
        free(g_slopes);
        free(g_rel_table);
        free(g_d_rel_table);
        g_slopes = g_rel_table = g_d_rel_table = NULL;
        return 0;
    }
    for (int64_t t = 0; t < heads * BENCH_REL_BUCKETS; t++) g_rel_table[t] = (float)((t * 37 % 101) / 50.0 - 1.0);
    return 1;
}

static void desc_for(const job *j, qkv_dtype dtype, qkv_impl impl, qkv_attn_desc *d) {
    qkv_attn_desc_init(d);
    d->dtype = dtype;
    d->batch = j->batch;
    d->n_q = d->n_k = j->n;
    d->heads = j->heads;
    d->dim = j->dim;
    d->mask = j->window ? QKV_MASK_WINDOW : j->causal ? QKV_MASK_CAUSAL : QKV_MASK_NONE;
    if (j->window) {
        d->window_left = j->o->window_left;
        d->window_right = j->o->window_right;
    }
    d->impl = impl;
    d->threads = j->threads;
    if ((j->impl == IMPL_FAST_ALIBI || j->impl == IMPL_FAST_REL) && dtype == QKV_F32 && bench_pos_params(j->heads)) {
        if (j->impl == IMPL_FAST_ALIBI) d->alibi_slopes = g_slopes;
        if (j->impl == IMPL_FAST_REL) {
            d->rel_table = g_rel_table;
            d->rel_buckets = BENCH_REL_BUCKETS;
            d->rel_max_distance = 128;
            d->rel_bidirectional = d->mask == QKV_MASK_NONE;
        }
    }
    if (j->impl == IMPL_DROPOUT) { /* the error table's reference drops the same entries */
        d->dropout = j->o->dropout;
        d->dropout_seed = j->o->seed;
    }
}

static void set_note(job_result *r, int status, const char *fmt, const char *arg) {
    r->status = status;
    snprintf(r->note, sizeof r->note, fmt, arg);
}

static void note_status(job_result *r, qkv_status s) {
    if (s == QKV_ERR_UNSUPPORTED)
        set_note(r, JOB_UNAVAILABLE, "not in this build (%s)", qkv_status_string(s));
    else
        set_note(r, JOB_FAILED, "failed: %s", qkv_status_string(s));
}

/* A job's arrays, allocated and touched (q, k, v random; the child process
 * exits after the job, so they are not freed). Returns 0 (and notes it in
 * r) when out of memory. */
typedef struct job_io {
    float *q, *k, *v, *out, *lse, *dout, *dq, *dk, *dv; /* the last four with backward */
    int64_t count;                                       /* elements of q */
} job_io;

static int job_io_make(const job *j, int backward, job_io *io, job_result *r) {
    const options *o = j->o;
    memset(io, 0, sizeof *io);
    io->count = j->batch * j->n * j->heads * j->dim;
    const size_t fb = (size_t)io->count * sizeof(float);
    io->q = alloc_touched(fb);
    io->k = alloc_touched(fb);
    io->v = alloc_touched(fb);
    io->out = alloc_touched(fb);
    io->lse = alloc_touched((size_t)(j->batch * j->heads * j->n) * sizeof(float));
    if (backward) {
        io->dout = alloc_touched(fb);
        io->dq = alloc_touched(fb);
        io->dk = alloc_touched(fb);
        io->dv = alloc_touched(fb);
    }
    if (!io->q || !io->k || !io->v || !io->out || !io->lse ||
        (backward && (!io->dout || !io->dq || !io->dk || !io->dv))) {
        set_note(r, JOB_FAILED, "out of memory for the inputs%s", "");
        return 0;
    }
    fill_random(io->q, io->count, o->seed * 4 + 1);
    fill_random(io->k, io->count, o->seed * 4 + 2);
    fill_random(io->v, io->count, o->seed * 4 + 3);
    if (io->dout) fill_random(io->dout, io->count, o->seed * 4 + 4);
    return 1;
}

/* The timing job: inputs, outputs, baseline, one warm-up, timed repetitions. */
static void job_time(const void *arg, job_result *r) {
    const job *j = arg;
    const options *o = j->o;
    job_io io;
    if (!job_io_make(j, j->backward, &io, r)) return;
    float *q = io.q, *k = io.k, *v = io.v, *out = io.out, *lse = io.lse;
    float *dout = io.dout, *dq = io.dq, *dk = io.dk, *dv = io.dv;

    qkv_attn_desc d;
    qkv_attn_grads g;
    memset(&g, 0, sizeof g);
    g.dq = dq;
    g.dk = dk;
    g.dv = dv;
    if (j->impl != IMPL_NAIVE) {
        desc_for(j, QKV_F32, impl_value(j->impl), &d);
        if (d.rel_table) g.d_rel_table = g_d_rel_table;
        if ((j->impl == IMPL_FAST_ALIBI || j->impl == IMPL_FAST_REL) && !d.alibi_slopes && !d.rel_table) {
            set_note(r, JOB_FAILED, "out of memory for the position biases%s", "");
            return;
        }
        if (j->backward) { /* the forward's out and lse, as training has them */
            qkv_status s = qkv_attention_forward(&d, q, k, v, out, NULL, lse);
            if (s != QKV_OK) {
                note_status(r, s);
                return;
            }
        }
    }
    r->base_mib = max_rss_mib();

    double *t = malloc((size_t)(o->reps + 1) * sizeof(double));
    double *c = malloc((size_t)(o->reps + 1) * sizeof(double));
    if (!t || !c) {
        free(t);
        free(c);
        set_note(r, JOB_FAILED, "out of memory%s", "");
        return;
    }
    int reps = o->reps, done = 0;
    for (int rep = -1; rep < reps; rep++) {
        double c0 = bench_cpu_now();
        double t0 = bench_now();
        if (j->impl == IMPL_NAIVE) {
            if (naive_run(j->batch, j->heads, j->dim, j->n, j->causal, j->backward, j->threads, q, k,
                          v, dout, out, dq, dk, dv) != 0) {
                set_note(r, JOB_FAILED, "naive: out of memory or threads%s", "");
                free(t);
                free(c);
                return;
            }
        } else {
            qkv_status s = j->backward ? qkv_attention_backward(&d, q, k, v, out, lse, dout, &g)
                                       : qkv_attention_forward(&d, q, k, v, out, NULL, lse);
            if (s != QKV_OK) {
                note_status(r, s);
                free(t);
                free(c);
                return;
            }
        }
        double dt = bench_now() - t0;
        double dc = bench_cpu_now() - c0;
        if (rep < 0) {
            /* the warm-up decides how many repetitions fit the time budget */
            if (dt * reps > o->max_seconds) {
                int fit = (int)(o->max_seconds / dt);
                reps = fit < 3 ? 3 : fit;
                if (reps > o->reps) reps = o->reps;
            }
            continue;
        }
        c[done] = dc;
        t[done++] = dt;
    }
    r->cpu_median_s = bench_median(c, done);
    free(c);
    r->median_s = bench_median(t, done);
    r->min_s = t[0];
    r->reps = done;
    r->peak_mib = max_rss_mib();
    r->status = JOB_OK;
    free(t);
}

/* Reads q, k, v (a float per 64-byte line; the prefetchers bring the rest)
 * and writes out, so that a call finds them in cache, as it would right
 * after the projections that produce them. */
static volatile float g_warm_sink;
static void warm_io(const job_io *io) {
    const float *in[3] = {io->q, io->k, io->v};
    float acc = 0.0f;
    for (int x = 0; x < 3; x++)
        for (int64_t i = 0; i < io->count; i += 16) acc += in[x][i];
    memset(io->out, 0, (size_t)io->count * sizeof(float));
    g_warm_sink = acc;
}

/* The paired job: causal and full forward calls alternate on the same
 * inputs (order swapped every round), and the ratio causal / full is taken
 * per round. Both calls of a round see the same state of a shared machine
 * (other tenants come and go over seconds), where two rows measured a
 * minute apart do not: this is the causal-cost target's measurement. */
static void job_pair(const void *arg, job_result *r) {
    const job *j = arg;
    const options *o = j->o;
    const int rounds = o->pair_reps;
    job_io io;
    if (!job_io_make(j, 0, &io, r)) return;
    double *ratio = malloc((size_t)rounds * sizeof(double));
    if (!ratio) {
        set_note(r, JOB_FAILED, "out of memory%s", "");
        return;
    }
    qkv_attn_desc d[2];
    job jf = *j, jc = *j;
    jf.causal = 0;
    jc.causal = 1;
    desc_for(&jf, QKV_F32, impl_value(j->impl), &d[0]);
    desc_for(&jc, QKV_F32, impl_value(j->impl), &d[1]);
    for (int round = -1; round < rounds; round++) {
        double t[2];
        for (int x = 0; x < 2; x++) {
            int which = round % 2 ? 1 - x : x; /* full first in even rounds */
            if (j->warm) warm_io(&io);
            double t0 = bench_now();
            qkv_status s = qkv_attention_forward(&d[which], io.q, io.k, io.v, io.out, NULL, io.lse);
            t[which] = bench_now() - t0;
            if (s != QKV_OK) {
                free(ratio);
                note_status(r, s);
                return;
            }
        }
        if (round >= 0) ratio[round] = t[1] / t[0]; /* round -1: warm-up */
    }
    r->ratio = bench_median(ratio, rounds);
    r->ratio_lo = ratio[rounds / 4];
    r->ratio_hi = ratio[(3 * rounds) / 4];
    r->reps = rounds;
    r->status = JOB_OK;
    free(ratio);
}

/* The error job: max |impl - reference in double| on a small case, over out
 * (forward) or over dq, dk, dv (backward); err_scale is max |reference|. */
static void job_error(const void *arg, job_result *r) {
    const job *j = arg;
    const options *o = j->o;
    const int64_t cnt = j->batch * j->n * j->heads * j->dim;
    const size_t fb = (size_t)cnt * sizeof(float), db = (size_t)cnt * sizeof(double);
    float *f[8];
    double *x[8];
    for (int i = 0; i < 8; i++) {
        f[i] = alloc_touched(fb);
        x[i] = alloc_touched(db);
        if (!f[i] || !x[i]) {
            set_note(r, JOB_FAILED, "out of memory%s", "");
            return;
        }
    }
    /* 0 q, 1 k, 2 v, 3 dout, 4 out, 5 dq, 6 dk, 7 dv */
    for (int i = 0; i < 4; i++) {
        fill_random(f[i], cnt, o->seed * 4 + 1 + (uint64_t)i);
        for (int64_t e = 0; e < cnt; e++) x[i][e] = (double)f[i][e];
    }
    float *lse = alloc_touched((size_t)(j->batch * j->heads * j->n) * sizeof(float));
    if (!lse) {
        set_note(r, JOB_FAILED, "out of memory%s", "");
        return;
    }
    qkv_attn_desc d;
    desc_for(j, QKV_F64, QKV_IMPL_REFERENCE, &d);
    qkv_attn_grads g;
    memset(&g, 0, sizeof g);
    g.dq = x[5];
    g.dk = x[6];
    g.dv = x[7];
    qkv_status s = j->backward ? qkv_attention_backward(&d, x[0], x[1], x[2], NULL, NULL, x[3], &g)
                               : qkv_attention_forward(&d, x[0], x[1], x[2], x[4], NULL, NULL);
    if (s != QKV_OK) {
        note_status(r, s);
        snprintf(r->note, sizeof r->note, "reference in double failed: %s", qkv_status_string(s));
        return;
    }
    if (j->impl == IMPL_NAIVE) {
        if (naive_run(j->batch, j->heads, j->dim, j->n, j->causal, j->backward, j->threads, f[0], f[1],
                      f[2], f[3], f[4], f[5], f[6], f[7]) != 0) {
            set_note(r, JOB_FAILED, "naive: out of memory or threads%s", "");
            return;
        }
    } else {
        desc_for(j, QKV_F32, impl_value(j->impl), &d);
        s = qkv_attention_forward(&d, f[0], f[1], f[2], f[4], NULL, lse);
        if (s == QKV_OK && j->backward) {
            qkv_attn_grads gf;
            memset(&gf, 0, sizeof gf);
            gf.dq = f[5];
            gf.dk = f[6];
            gf.dv = f[7];
            s = qkv_attention_backward(&d, f[0], f[1], f[2], f[4], lse, f[3], &gf);
        }
        if (s != QKV_OK) {
            note_status(r, s);
            return;
        }
    }
    double err = 0.0, scale = 0.0;
    int nan = 0;
    for (int i = j->backward ? 5 : 4; i <= (j->backward ? 7 : 4); i++)
        for (int64_t e = 0; e < cnt; e++) {
            double diff = fabs((double)f[i][e] - x[i][e]);
            if (diff != diff) nan = 1;
            if (diff > err) err = diff;
            if (fabs(x[i][e]) > scale) scale = fabs(x[i][e]);
        }
    r->err = nan ? NAN : err;
    r->err_scale = scale;
    r->status = JOB_OK;
}

typedef void (*job_fn)(const void *arg, job_result *r);

static void run_isolated(job_fn fn, const void *arg, job_result *r) {
    memset(r, 0, sizeof *r);
    int fd[2];
    fflush(stdout);
    fflush(stderr);
    if (pipe(fd) != 0) {
        fn(arg, r); /* no isolation, but a result */
        return;
    }
    pid_t pid = fork();
    if (pid < 0) {
        close(fd[0]);
        close(fd[1]);
        fn(arg, r);
        return;
    }
    if (pid == 0) {
        close(fd[0]);
        job_result res;
        memset(&res, 0, sizeof res);
        fn(arg, &res);
        const char *p = (const char *)&res;
        size_t left = sizeof res;
        while (left > 0) {
            ssize_t w = write(fd[1], p, left);
            if (w <= 0) break;
            p += w;
            left -= (size_t)w;
        }
        close(fd[1]);
        _exit(0);
    }
    close(fd[1]);
    char *p = (char *)r;
    size_t got = 0;
    while (got < sizeof *r) {
        ssize_t n = read(fd[0], p + got, sizeof *r - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        got += (size_t)n;
    }
    close(fd[0]);
    int wstatus = 0;
    while (waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
    }
    if (got != sizeof *r) {
        memset(r, 0, sizeof *r);
        r->status = JOB_FAILED;
        if (WIFSIGNALED(wstatus))
            snprintf(r->note, sizeof r->note, "killed by signal %d%s", WTERMSIG(wstatus),
                     WTERMSIG(wstatus) == 9 ? " (out of memory?)" : "");
        else
            snprintf(r->note, sizeof r->note, "no result (exit %d)", WEXITSTATUS(wstatus));
    }
}

/* ------------------------------------------------------------------------- */
/* Peaks and FLOPs
 *
 * The peak is a property of the hardware; other processes on a shared machine
 * only ever lower a measurement of it. So the denominator of "% peak" is the
 * best peak measured at any point of the run (at the start, around every row,
 * at the end): the fractions are conservative. Beside it, "% local" divides by
 * the best of the short peak measurements taken just before and just after
 * the row, which saw about the same competition for the cores as the row. */

static bench_isa g_isa;
static double g_best[MAX_LIST];      /* per entry of o->threads */
static double g_start[MAX_LIST], g_start_med[MAX_LIST], g_end[MAX_LIST], g_end_med[MAX_LIST];
/* Per-core peak in CPU time (bench_peak_core_cpu_gflops), best of the start
 * and the end: the denominator of "% CPU", the rate while on a core. Time-
 * sharing with other processes does not lower it; their cache traffic and any
 * spinning of idle worker threads still count against the program, so the
 * fraction stays conservative. */
static double g_cpu_core_peak;

static void peak_cpu(const options *o) {
    double gf = bench_peak_core_cpu_gflops(g_isa, o->threads[o->threads_count - 1], o->peak_seconds,
                                           o->peak_trials);
    if (gf > g_cpu_core_peak) g_cpu_core_peak = gf;
}

static double cpu_frac(double flops, double cpu_s) {
    return g_cpu_core_peak > 0 && cpu_s > 0 ? flops / cpu_s * 1e-9 / g_cpu_core_peak : 0.0;
}

static double peak_full(const options *o, int ti, double *median) {
    double gf = bench_peak_gflops(g_isa, o->threads[ti], o->peak_seconds, o->peak_trials, median);
    if (gf > g_best[ti]) g_best[ti] = gf;
    return gf;
}

/* A short measurement (3 trials of 0.1 s) around a row. */
static double peak_local(const options *o, int ti) {
    double gf = bench_peak_gflops(g_isa, o->threads[ti], 0.1, 3, NULL);
    if (gf > g_best[ti]) g_best[ti] = gf;
    return gf;
}

static double frac_of(double gf, double peak) { return peak > 0 ? gf / peak : 0.0; }

static double attn_flops(int64_t batch, int64_t heads, int64_t n, int64_t dim, int causal, int backward) {
    double f = 4.0 * (double)batch * (double)heads * (double)n * (double)n * (double)dim;
    if (causal) f *= 0.5;
    return backward ? 2.5 * f : f;
}

/* Visible (query, key) pairs of a window mask with n_q = n_k = n. */
static double window_pairs(int64_t n, int64_t left, int64_t right) {
    double pairs = 0.0;
    for (int64_t i = 0; i < n; i++) {
        int64_t lo = i - left < 0 ? 0 : i - left;
        int64_t hi = i + right > n - 1 ? n - 1 : i + right;
        pairs += (double)(hi - lo + 1);
    }
    return pairs;
}

/* ------------------------------------------------------------------------- */
/* Measurements, kept until the end so that every fraction uses the run's best
 * peak. */

typedef struct entry {
    int impl, backward, causal, ti, window;
    int64_t n, heads;
    double flops, local_peak;
    job_result r;
} entry;

#define MAX_ENTRIES 1024
static entry g_table[MAX_ENTRIES], g_long, g_window[32];
static int g_table_count, g_long_done, g_window_count;

static const entry *find_entry(int impl, int backward, int causal, int ti, int64_t n) {
    for (int i = 0; i < g_table_count; i++) {
        const entry *e = &g_table[i];
        if (e->impl == impl && e->backward == backward && e->causal == causal && e->ti == ti && e->n == n &&
            e->r.status == JOB_OK)
            return e;
    }
    return NULL;
}

static double entry_gflops(const entry *e) { return e->flops / e->r.median_s * 1e-9; }

/* Runs one timed job in a child with a short peak measurement after it;
 * *prev is the one before (updated). */
static void measure(const options *o, const job *jb, entry *e, double *prev) {
    run_isolated(job_time, jb, &e->r);
    double next = peak_local(o, e->ti);
    e->local_peak = next > *prev ? next : *prev;
    *prev = next;
    if (e->r.status == JOB_OK)
        fprintf(stderr, "[bench] %s %s %s n=%lld threads=%d: median %.3f ms, %.1f GFLOP/s (local peak %.1f)\n",
                impl_names[e->impl], e->backward ? "bwd" : "fwd",
                e->window ? "window" : e->causal ? "causal" : "none", (long long)e->n, o->threads[e->ti],
                e->r.median_s * 1e3, entry_gflops(e), e->local_peak);
    else
        fprintf(stderr, "[bench] %s %s n=%lld: %s\n", impl_names[e->impl], e->backward ? "bwd" : "fwd",
                (long long)e->n, e->r.note);
}

static void skip(entry *e, const char *why) {
    e->r.status = JOB_SKIPPED;
    snprintf(e->r.note, sizeof e->r.note, "%s", why);
}

static void run_table(const options *o) {
    for (int ni = 0; ni < o->n_count; ni++)
        for (int pi = 0; pi < o->pass_count; pi++)
            for (int ci = 0; ci < o->causal_count; ci++)
                for (int ti = 0; ti < o->threads_count; ti++) {
                    int64_t n = o->n[ni];
                    int bwd = o->passes[pi], causal = o->causal[ci], threads = o->threads[ti];
                    double prev = peak_local(o, ti);
                    for (int ii = 0; ii < o->impl_count && g_table_count < MAX_ENTRIES; ii++) {
                        int impl = o->impls[ii];
                        entry *e = &g_table[g_table_count++];
                        memset(e, 0, sizeof *e);
                        e->impl = impl;
                        e->backward = bwd;
                        e->causal = causal;
                        e->ti = ti;
                        e->n = n;
                        e->heads = o->heads;
                        e->flops = attn_flops(o->batch, o->heads, n, o->dim, causal, bwd);
                        char why[200];
                        if (impl == IMPL_REFERENCE && n > o->ref_max_n) {
                            snprintf(why, sizeof why, "skipped: n > %lld (--ref-max-n): scalar double, one thread",
                                     (long long)o->ref_max_n);
                            skip(e, why);
                            continue;
                        }
                        if (impl == IMPL_NAIVE && naive_mib(n, threads, o) > o->naive_max_mib) {
                            snprintf(why, sizeof why, "skipped: its n x n matrices need %.0f MiB > %.0f (--naive-max-mib)",
                                     naive_mib(n, threads, o), o->naive_max_mib);
                            skip(e, why);
                            continue;
                        }
                        const entry *smaller = NULL;
                        for (int k = 0; k < g_table_count - 1; k++) {
                            const entry *c = &g_table[k];
                            if (c->impl == impl && c->backward == bwd && c->causal == causal && c->ti == ti &&
                                c->n < n && c->r.status == JOB_OK && (!smaller || c->n > smaller->n))
                                smaller = c;
                        }
                        if (smaller) {
                            double ratio = (double)n / (double)smaller->n;
                            double predicted = smaller->r.median_s * ratio * ratio * (bwd ? 5.0 : 4.0);
                            if (predicted > o->max_row_seconds) {
                                snprintf(why, sizeof why,
                                         "skipped: predicted %.0f s from n = %lld (> --max-row-seconds %.0f)",
                                         predicted, (long long)smaller->n, o->max_row_seconds);
                                skip(e, why);
                                continue;
                            }
                        }
                        job jb = {o, impl, bwd, causal, o->batch, o->heads, n, o->dim, threads, 0, 0};
                        measure(o, &jb, e, &prev);
                    }
                }
}

/* The impl for --long and --window: the first of the list that is not the
 * naive version (which materialises the matrix). */
static int long_impl(const options *o) {
    for (int i = 0; i < o->impl_count; i++)
        if (o->impls[i] != IMPL_NAIVE) return o->impls[i];
    return IMPL_FAST;
}

/* The thread count closest to 2, for the 2-thread targets. */
static int target_threads_index(const options *o) {
    int ti = -1;
    for (int i = 0; i < o->threads_count; i++)
        if (ti < 0 || abs(o->threads[i] - 2) < abs(o->threads[ti] - 2)) ti = i;
    return ti;
}

/* The paired causal/full ratio (job_pair) for every n whose forward rows,
 * causal and not, were both measured, at the target thread count. */
static job_result g_pair[MAX_LIST], g_pair_warm[MAX_LIST];
static int g_pair_done[MAX_LIST], g_pair_warm_done[MAX_LIST];

static void run_pairs(const options *o) {
    const int ti = target_threads_index(o), impl = o->impl_count > 0 ? long_impl(o) : IMPL_FAST;
    for (int ni = 0; ni < o->n_count; ni++) {
        const entry *full = find_entry(impl, 0, 0, ti, o->n[ni]), *causal = find_entry(impl, 0, 1, ti, o->n[ni]);
        if (!full || !causal) continue;
        options po = *o;
        double round_s = full->r.median_s + causal->r.median_s;
        if (round_s * po.pair_reps > o->max_seconds) {
            int fit = (int)(o->max_seconds / round_s);
            po.pair_reps = fit < 5 ? 5 : fit;
        }
        job jb = {&po, impl, 0, 1, o->batch, o->heads, o->n[ni], o->dim, o->threads[ti], 0, 0};
        run_isolated(job_pair, &jb, &g_pair[ni]);
        g_pair_done[ni] = g_pair[ni].status == JOB_OK;
        if (g_pair_done[ni])
            fprintf(stderr, "[bench] paired causal/full n=%lld threads=%d: median ratio %.3f over %d rounds\n",
                    (long long)o->n[ni], o->threads[ti], g_pair[ni].ratio, g_pair[ni].reps);
        if (!o->pair_warm) continue;
        jb.warm = 1;
        run_isolated(job_pair, &jb, &g_pair_warm[ni]);
        g_pair_warm_done[ni] = g_pair_warm[ni].status == JOB_OK;
        if (g_pair_warm_done[ni])
            fprintf(stderr, "[bench] paired causal/full n=%lld threads=%d, inputs warm: median ratio %.3f\n",
                    (long long)o->n[ni], o->threads[ti], g_pair_warm[ni].ratio);
    }
}

static void run_long(const options *o) {
    int ti = o->threads_count - 1;
    options lo = *o;
    lo.reps = 1; /* one call is tens of seconds; the warm-up makes two */
    lo.max_seconds = 0;
    memset(&g_long, 0, sizeof g_long);
    g_long.impl = long_impl(o);
    g_long.ti = ti;
    g_long.n = o->long_n;
    g_long.heads = 1;
    g_long.flops = attn_flops(1, 1, o->long_n, o->dim, 0, 0);
    job jb = {&lo, g_long.impl, 0, 0, 1, 1, o->long_n, o->dim, o->threads[ti], 0, 0};
    double prev = peak_local(o, ti);
    measure(o, &jb, &g_long, &prev);
    g_long_done = 1;
}

static void run_window(const options *o) {
    int ti = o->threads_count - 1;
    double prev = peak_local(o, ti);
    g_window_count = 0;
    for (int64_t n = o->window_min_n; n <= o->window_max_n && g_window_count < 32; n *= 2) {
        entry *e = &g_window[g_window_count++];
        memset(e, 0, sizeof *e);
        e->impl = long_impl(o);
        e->ti = ti;
        e->n = n;
        e->heads = 1;
        e->window = 1;
        e->flops = 4.0 * (double)o->dim * window_pairs(n, o->window_left, o->window_right);
        job jb = {o, e->impl, 0, 0, 1, 1, n, o->dim, o->threads[ti], 1, 0};
        measure(o, &jb, e, &prev);
    }
}

/* ------------------------------------------------------------------------- */
/* Printing */

static void print_header(int argc, char **argv, const options *o) {
    char model[256] = "unknown";
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f))
            if (strncmp(line, "model name", 10) == 0) {
                char *c = strchr(line, ':');
                if (c) {
                    c++;
                    while (*c == ' ' || *c == '\t') c++;
                    c[strcspn(c, "\n")] = 0;
                    snprintf(model, sizeof model, "%s", c);
                }
                break;
            }
        fclose(f);
    }
    time_t now = time(NULL);
    char when[64] = "";
    struct tm tmv;
    if (gmtime_r(&now, &tmv)) strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", &tmv);
    printf("## qkv attention benchmark\n\n");
    printf("- command: `");
    for (int i = 0; i < argc; i++) printf("%s%s", i ? " " : "", argv[i]);
    printf("`\n");
    const char *arch = getenv("QKV_ARCH");
    printf("- started %s; qkv %s; QKV_ARCH=%s\n", when, qkv_version(), arch ? arch : "(unset)");
    printf("- CPU: %s, %ld online cores; widest FMA ISA: %s; fractions of the %s peak\n", model,
           sysconf(_SC_NPROCESSORS_ONLN), bench_isa_name(bench_isa_best()), bench_isa_name(g_isa));
    printf("- B = %lld, H = %lld, D = %lld, n_q = n_k = n, F32; %d timed repetitions after one warm-up "
           "(fewer, never under 3, when a row would exceed %.0f s); times are medians\n\n",
           (long long)o->batch, (long long)o->heads, (long long)o->dim, o->reps, o->max_seconds);
}

static void run_check(const options *o) {
    int64_t n = o->check_n;
    int64_t heads = o->heads < 2 ? o->heads : 2;
    int threads = o->threads[o->threads_count - 1];
    printf("### Error against the reference in double (B = 1, H = %lld, n = %lld, D = %lld, %d threads)\n\n",
           (long long)heads, (long long)n, (long long)o->dim, threads);
    printf("max |impl - ref64| over O (forward) or over dQ, dK, dV (backward), inputs uniform with unit "
           "variance. The bound for a fast path (tests/test_fast_common.h): k x naive's error + 1e-5, k = 2 forward, 3..5 "
           "backward.\n\n");
    printf("| impl | pass | mask | max abs error | max abs value | error / naive's |\n");
    printf("|---|---|---|---:|---:|---:|\n");
    for (int pi = 0; pi < o->pass_count; pi++)
        for (int ci = 0; ci < o->causal_count; ci++) {
            job_result naive;
            job jn = {o, IMPL_NAIVE, o->passes[pi], o->causal[ci], 1, heads, n, o->dim, threads, 0, 0};
            run_isolated(job_error, &jn, &naive);
            for (int ii = 0; ii < o->impl_count; ii++) {
                int impl = o->impls[ii];
                job_result r;
                if (impl == IMPL_FAST_ALIBI || impl == IMPL_FAST_REL) continue; /* tests/test_fast_posbias.c */
                if (impl == IMPL_NAIVE) r = naive;
                else {
                    job jb = jn;
                    jb.impl = impl;
                    run_isolated(job_error, &jb, &r);
                }
                printf("| %s | %s | %s | ", impl_names[impl], o->passes[pi] ? "bwd" : "fwd",
                       o->causal[ci] ? "causal" : "none");
                if (r.status != JOB_OK) {
                    printf("%s | | |\n", r.note);
                    continue;
                }
                printf("%.2e | %.2f | ", r.err, r.err_scale);
                if (naive.status == JOB_OK && naive.err > 0) printf("%.2f |\n", r.err / naive.err);
                else printf("- |\n");
                fflush(stdout);
            }
        }
    printf("\n");
}

static void print_peaks(const options *o) {
    printf("### FP32 FMA peak (%s), GFLOP/s\n\n", bench_isa_name(g_isa));
    printf("Best of %d trials of %.2f s at the start and at the end; \"run best\" also counts the short "
           "measurements around every row and is the denominator of %% peak.\n\n",
           o->peak_trials, o->peak_seconds);
    printf("| threads | start: best | start: median | end: best | end: median | run best | run best per thread |\n");
    printf("|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int t = 0; t < o->threads_count; t++)
        printf("| %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |\n", o->threads[t], g_start[t], g_start_med[t],
               g_end[t], g_end_med[t], g_best[t], g_best[t] / o->threads[t]);
    printf("\nPer core in CPU time (each thread's flops over its own CPU time, best at the start and the end, "
           "%d threads): %.1f GFLOP/s, the denominator of %% CPU.\n\n",
           o->threads[o->threads_count - 1], g_cpu_core_peak);
}

static void print_row_tail(const entry *e, const entry *naive) {
    double gf = entry_gflops(e);
    printf("%d | %.3f | %.3f | %.1f | %.1f%% | %.1f%% | %.1f%% | ", e->r.reps, e->r.median_s * 1e3,
           e->r.min_s * 1e3, gf, 100.0 * frac_of(gf, g_best[e->ti]), 100.0 * frac_of(gf, e->local_peak),
           100.0 * cpu_frac(e->flops, e->r.cpu_median_s));
    if (naive) printf("%.2f | ", naive->r.median_s / e->r.median_s);
    else printf("- | ");
    printf("%.1f | %.1f |\n", e->r.peak_mib - e->r.base_mib, e->r.peak_mib);
}

static void print_table(const options *o) {
    printf("### Speed (B = %lld, H = %lld, D = %lld)\n\n", (long long)o->batch, (long long)o->heads,
           (long long)o->dim);
    printf("GFLOP/s count 4·B·H·n²·D forward (halved for causal), 2.5x that backward. %% peak: of the run's "
           "best %s peak for the threads used; %% local: of the peak measured just before and after the "
           "row; %% CPU: the call's rate in CPU time (flops over the process CPU time, all threads) over the "
           "per-core CPU-time peak, robust to time-sharing. x naive: the naive version's median time over this one's. extra MiB: resident memory the "
           "call needed beyond its inputs and outputs (peak RSS of the measuring process minus its RSS once "
           "they were allocated and touched); RSS MiB: that process's peak.\n\n",
           bench_isa_name(g_isa));
    printf("| impl | pass | mask | n | threads | reps | median ms | min ms | GFLOP/s | %% peak | %% local | "
           "%% CPU | x naive | extra MiB | RSS MiB |\n");
    printf("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < g_table_count; i++) {
        const entry *e = &g_table[i];
        printf("| %s | %s | %s | %lld | %d | ", impl_names[e->impl], e->backward ? "bwd" : "fwd",
               e->causal ? "causal" : "none", (long long)e->n, o->threads[e->ti]);
        if (e->r.status != JOB_OK) {
            printf("| %s | | | | | | | | |\n", e->r.note);
            continue;
        }
        print_row_tail(e, find_entry(IMPL_NAIVE, e->backward, e->causal, e->ti, e->n));
    }
    printf("\n");
}

static void print_long(const options *o) {
    const entry *e = &g_long;
    double io_mib = (4.0 * (double)e->n * (double)o->dim + (double)e->n) * 4.0 / 1048576.0;
    printf("### Exact forward at n = %lld (B = 1, H = 1, D = %lld, no mask, %s, %d threads)\n\n", (long long)e->n,
           (long long)o->dim, impl_names[e->impl], o->threads[e->ti]);
    printf("Materialising the matrix would take n² x 4 bytes = %.1f GiB. Inputs and outputs (Q, K, V, O, lse): "
           "%.1f MiB. Target: extra < 150 MB (143 MiB).\n\n",
           (double)e->n * (double)e->n * 4.0 / 1073741824.0, io_mib);
    printf("| impl | n | reps | median s | GFLOP/s | %% peak | %% local | %% CPU | extra MiB | RSS MiB |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    printf("| %s | %lld | ", impl_names[e->impl], (long long)e->n);
    if (e->r.status != JOB_OK) {
        printf("| %s | | | | | | |\n\n", e->r.note);
        return;
    }
    double gf = entry_gflops(e);
    printf("%d | %.2f | %.1f | %.1f%% | %.1f%% | %.1f%% | %.1f | %.1f |\n\n", e->r.reps, e->r.median_s, gf,
           100.0 * frac_of(gf, g_best[e->ti]), 100.0 * frac_of(gf, e->local_peak),
           100.0 * cpu_frac(e->flops, e->r.cpu_median_s), e->r.peak_mib - e->r.base_mib, e->r.peak_mib);
}

static void print_window(const options *o) {
    int ti = o->threads_count - 1;
    printf("### Sliding window (left = %lld, right = %lld; B = 1, H = 1, D = %lld, %s, %d threads)\n\n",
           (long long)o->window_left, (long long)o->window_right, (long long)o->dim,
           impl_names[g_window_count ? g_window[0].impl : long_impl(o)], o->threads[ti]);
    printf("GFLOP/s counts 4·D per visible (query, key) pair. Linear in n: ns/query flat, x previous = 2. "
           "O(n·D) memory: extra MiB no more than proportional to the inputs and outputs.\n\n");
    printf("| n | reps | median ms | ns / query | x previous n | GFLOP/s | %% peak | %% local | %% CPU | "
           "inputs+outputs MiB | extra MiB | RSS MiB |\n");
    printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < g_window_count; i++) {
        const entry *e = &g_window[i];
        double io = (4.0 * (double)e->n * (double)o->dim + (double)e->n) * 4.0 / 1048576.0;
        printf("| %lld | ", (long long)e->n);
        if (e->r.status != JOB_OK) {
            printf("| %s | | | | | | | %.1f | | |\n", e->r.note, io);
            continue;
        }
        double gf = entry_gflops(e);
        printf("%d | %.2f | %.2f | ", e->r.reps, e->r.median_s * 1e3, e->r.median_s * 1e9 / (double)e->n);
        if (i > 0 && g_window[i - 1].r.status == JOB_OK) printf("%.2f | ", e->r.median_s / g_window[i - 1].r.median_s);
        else printf("- | ");
        printf("%.1f | %.1f%% | %.1f%% | %.1f%% | %.1f | %.1f | %.1f |\n", gf, 100.0 * frac_of(gf, g_best[e->ti]),
               100.0 * frac_of(gf, e->local_peak), 100.0 * cpu_frac(e->flops, e->r.cpu_median_s), io,
               e->r.peak_mib - e->r.base_mib, e->r.peak_mib);
    }
    printf("\n");
}

static const char *verdict(int known, int met) { return !known ? "no data" : met ? "met" : "not met"; }

static void print_targets(const options *o) {
    const int ti = target_threads_index(o);
    const int impl = o->impl_count > 0 ? long_impl(o) : IMPL_FAST;
    printf("### Targets (impl %s, %d threads; %% of the run's best %s peak, then %% local and %% CPU "
           "in brackets; the verdict is on the first)\n\n",
           impl_names[impl], o->threads[ti], bench_isa_name(g_isa));
    printf("| target | measured | verdict |\n|---|---|---|\n");
    static const struct {
        int backward, causal;
        int64_t n;
        double min;
    } fr[] = {{0, 0, 4096, 0.75}, {0, 0, 1024, 0.70}, {1, 0, 1024, 0.55}, {1, 0, 4096, 0.55},
              {1, 0, 16384, 0.55}, {1, 1, 4096, 0.55}};
    for (size_t k = 0; k < sizeof fr / sizeof fr[0]; k++) {
        const entry *e = find_entry(impl, fr[k].backward, fr[k].causal, ti, fr[k].n);
        printf("| %s, n = %lld, %s: >= %.0f%% of peak | ", fr[k].backward ? "backward" : "forward",
               (long long)fr[k].n, fr[k].causal ? "causal" : "not causal", 100.0 * fr[k].min);
        if (!e) {
            printf("(not measured) | no data |\n");
            continue;
        }
        double f = frac_of(entry_gflops(e), g_best[ti]);
        printf("%.1f%% (%.1f%%, %.1f%%) | %s |\n", 100.0 * f, 100.0 * frac_of(entry_gflops(e), e->local_peak),
               100.0 * cpu_frac(e->flops, e->r.cpu_median_s), verdict(1, f >= fr[k].min));
    }
    for (int ni = 0; ni < o->n_count; ni++) {
        const entry *full = find_entry(impl, 0, 0, ti, o->n[ni]);
        const entry *causal = find_entry(impl, 0, 1, ti, o->n[ni]);
        if (!full || !causal) continue;
        double ratio = causal->r.median_s / full->r.median_s;
        double cpu_ratio = full->r.cpu_median_s > 0 ? causal->r.cpu_median_s / full->r.cpu_median_s : 0.0;
        char warm[64] = "";
        if (g_pair_warm_done[ni]) /* a diagnostic beside the verdict, never the verdict */
            snprintf(warm, sizeof warm, "; inputs warm %.3f", g_pair_warm[ni].ratio);
        if (g_pair_done[ni]) /* the verdict on the paired ratio (job_pair) */
            printf("| causal forward, n = %lld: within 10%% of half the non-causal time (ratio <= 0.55) | "
                   "paired %.3f (quartiles %.3f-%.3f, %d rounds); rows %.3f (CPU time %.3f)%s | %s |\n",
                   (long long)o->n[ni], g_pair[ni].ratio, g_pair[ni].ratio_lo, g_pair[ni].ratio_hi,
                   g_pair[ni].reps, ratio, cpu_ratio, warm, verdict(1, g_pair[ni].ratio <= 0.55));
        else
            printf("| causal forward, n = %lld: within 10%% of half the non-causal time (ratio <= 0.55) | rows "
                   "%.3f (CPU time %.3f) | %s |\n",
                   (long long)o->n[ni], ratio, cpu_ratio, verdict(1, ratio <= 0.55));
    }
    if (g_long_done) {
        int ok = g_long.r.status == JOB_OK;
        double extra = g_long.r.peak_mib - g_long.r.base_mib;
        printf("| exact forward, n = %lld, one head: < 150 MB beyond inputs and outputs | ", (long long)g_long.n);
        if (ok) printf("%.1f MiB = %.1f MB | %s |\n", extra, extra * 1.048576, verdict(1, extra * 1.048576 < 150.0));
        else printf("%s | no data |\n", g_long.r.note);
    }
    if (g_window_count >= 2) {
        int first = -1, last = -1;
        for (int i = 0; i < g_window_count; i++)
            if (g_window[i].r.status == JOB_OK) {
                if (first < 0) first = i;
                last = i;
            }
        if (first >= 0 && last > first) {
            double a = g_window[first].r.median_s / (double)g_window[first].n;
            double b = g_window[last].r.median_s / (double)g_window[last].n;
            printf("| window 256, n = %lld .. %lld: time linear in n (time/n within 25%%) | time/n x%.2f | %s |\n",
                   (long long)g_window[first].n, (long long)g_window[last].n, b / a, verdict(1, b / a < 1.25));
        } else {
            printf("| window 256: time linear in n | (no data) | no data |\n");
        }
    }
    printf("\nThe AVX2 target (>= 65%% of the AVX2 peak) is a second run with QKV_ARCH=avx2: it forces the "
           "library's AVX2 kernels and makes the fractions of the AVX2 peak.\n\n");
}

int main(int argc, char **argv) {
    options o;
    if (!parse_options(argc, argv, &o)) return 2;
    g_isa = o.peak_isa;
    print_header(argc, argv, &o);
    for (int t = 0; t < o.threads_count; t++) g_start[t] = peak_full(&o, t, &g_start_med[t]);
    peak_cpu(&o);
    fflush(stdout);

    if (o.check) run_check(&o);
    if (o.table) run_table(&o);
    if (o.table && o.pair_reps > 0) run_pairs(&o);
    if (o.long_run) run_long(&o);
    if (o.window) run_window(&o);
    for (int t = 0; t < o.threads_count; t++) g_end[t] = peak_full(&o, t, &g_end_med[t]);
    peak_cpu(&o);

    print_peaks(&o);
    if (o.table) print_table(&o);
    if (o.long_run) print_long(&o);
    if (o.window) print_window(&o);
    print_targets(&o);
    return 0;
}
