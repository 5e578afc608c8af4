/* qkv complexity: Table 1 of Vaswani et al. (2017), "Attention Is All You
 * Need", measured on qkv's own layers instead of assumed.
 *
 *   qkv complexity [--d D] [--max-n N] [--window R] [--kernel K] [--png FILE]
 *
 * For self-attention (the core), restricted self-attention (the core's
 * window mask, R + 1 keys per query), an Elman RNN, an LSTM and a 1-D
 * convolution (kernel K), each forward + backward:
 *   1. time against n at fixed d and against d at fixed n, with the
 *      exponents of least-squares fits on log-log axes;
 *   2. sequential operations: the number of synchronisation rounds a
 *      2-thread schedule of the layer's forward needs (counted by the
 *      schedule itself), and the speed-up it gets from 1 to 2 threads;
 *   3. maximum path length: the least number of stacked layers at which
 *      output position n-1 depends on input position 0, found by
 *      propagating a gradient down the stack through each layer's backward
 *      until it is non-zero at position 0 (contiguous and dilated
 *      convolutions both); for the RNN, the number of recurrent steps the
 *      gradient passes through from h_{n-1} to x_0.
 * Timings use one thread (QKV_NUM_THREADS=1) unless said otherwise. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "cli_util.h"
#include "core/rng.h"
#include "qkv.h"
#include "support/baselines.h"

#define CMD "complexity"

enum { OPT_HELP, OPT_D, OPT_MAX_N, OPT_WINDOW, OPT_KERNEL, OPT_PNG, OPT_QUICK, OPT_COUNT };
static const cli_opt options[OPT_COUNT] = {
    {"--help", "-h", 0, OPT_HELP},     {"--d", NULL, 1, OPT_D},         {"--max-n", NULL, 1, OPT_MAX_N},
    {"--window", NULL, 1, OPT_WINDOW}, {"--kernel", NULL, 1, OPT_KERNEL}, {"--png", NULL, 1, OPT_PNG},
    {"--quick", NULL, 0, OPT_QUICK},
};

static void help(void) {
    fputs("Usage: qkv complexity [--d D] [--max-n N] [--window R] [--kernel K] [--png FILE]\n"
          "                      [--quick]\n"
          "\n"
          "Measures Table 1 of Vaswani et al. (2017) on qkv's layers (forward + backward):\n"
          "self-attention, restricted self-attention (window of R + 1 keys), an Elman\n"
          "RNN, an LSTM and a 1-D convolution (kernel K): time against n (fixed d) and\n"
          "against d (fixed n) with fitted log-log exponents, sequential operations (the\n"
          "synchronisation rounds of a 2-thread schedule, and its speed-up from 1 to 2\n"
          "threads) and maximum path lengths (stacked layers until output n-1 depends on\n"
          "input 0, by gradient reachability; contiguous and dilated convolutions).\n"
          "\n"
          "  --d D          model dimension of the n sweep (default 64)\n"
          "  --max-n N      largest n (default 2048; n doubles from 64)\n"
          "  --window R     restricted attention: keys p-R/2 .. p+R/2 (default 32, even)\n"
          "  --kernel K     convolution kernel (odd, default 3)\n"
          "  --png FILE     also draw the log-log plots (time vs n, time vs d, path\n"
          "                 length vs n) into a PNG (a usage error in a build\n"
          "                 without PNG)\n"
          "  --quick        fewer and smaller sizes (a few seconds; for tests)\n"
          "  -h, --help     show this help and exit\n"
          "\n"
          "The default run takes under a minute. Timings are the best of repeated runs,\n"
          "in process CPU time for the one-thread sweeps (other processes on the\n"
          "machine barely disturb it) and in wall-clock time for the speed-ups.\n",
          stdout);
}

#define usage_error(...) cli_usage_error(CMD, __VA_ARGS__)

/* Wall-clock time, or the process's CPU time: single-thread timings use
 * CPU time, which other processes on a shared machine barely disturb
 * (they only take the CPU away, which wall-clock time would count). */
static clockid_t g_clock = CLOCK_MONOTONIC;
static double now_s(void) {
    struct timespec ts;
    clock_gettime(g_clock, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t g_rng = 12345;
static float frand(void) { /* uniform in [-1, 1) */
    return (float)((double)(splitmix64_next(&g_rng) >> 11) * 0x1.0p-52 - 1.0);
}

/* ------------------------------------------------------------------------- */
/* The layers, forward + backward on random data. */

enum { L_ATT, L_RATT, L_RNN, L_LSTM, L_CONV, L_COUNT };
static const char *layer_name[L_COUNT] = {"self-attention", "restricted self-attn", "recurrent (Elman RNN)",
                                          "recurrent (LSTM)", "convolutional"};

typedef struct bench {
    int layer, threads;
    int64_t n, d, window, kernel;
    float *a[12];
} bench;

static void bench_free(bench *b) {
    for (int i = 0; i < 12; i++) free(b->a[i]);
    memset(b->a, 0, sizeof b->a);
}

static int bench_alloc(bench *b) {
    const int64_t n = b->n, d = b->d, k = b->kernel;
    int64_t sz[12] = {0};
    switch (b->layer) {
    case L_ATT:
    case L_RATT: /* q k v o dout dq dk dv lse */
        for (int i = 0; i < 8; i++) sz[i] = n * d;
        sz[8] = n;
        break;
    case L_RNN: /* wx wh b x h dh dx dwx dwh db */
        sz[0] = sz[1] = d * d, sz[2] = d, sz[3] = sz[4] = sz[5] = sz[6] = n * d, sz[7] = sz[8] = d * d, sz[9] = d;
        break;
    case L_LSTM: /* wx wh b x h dh dx dwx dwh db cache */
        sz[0] = sz[1] = 4 * d * d, sz[2] = 4 * d, sz[3] = sz[4] = sz[5] = sz[6] = n * d;
        sz[7] = sz[8] = 4 * d * d, sz[9] = 4 * d, sz[10] = 6 * n * d;
        break;
    default: /* w b x y dy dx dw db */
        sz[0] = d * d * k, sz[1] = d, sz[2] = sz[3] = sz[4] = sz[5] = n * d, sz[6] = d * d * k, sz[7] = d;
        break;
    }
    for (int i = 0; i < 12; i++) {
        if (!sz[i]) continue;
        b->a[i] = malloc((size_t)sz[i] * sizeof(float));
        if (!b->a[i]) {
            bench_free(b);
            return -1;
        }
        /* Weights scaled by 1/sqrt(fan-in) keep tanh and softmax unsaturated. */
        double scale = 1.0 / sqrt((double)d);
        for (int64_t j = 0; j < sz[i]; j++) b->a[i][j] = (float)(frand() * scale);
    }
    return 0;
}

static void attn_desc(const bench *b, qkv_attn_desc *d) {
    qkv_attn_desc_init(d);
    d->batch = 1;
    d->n_q = d->n_k = b->n;
    d->heads = 1;
    d->dim = b->d;
    d->threads = b->threads;
    if (b->layer == L_RATT) {
        d->mask = QKV_MASK_WINDOW;
        d->window_left = d->window_right = b->window / 2;
    }
}

/* One forward (+ backward when bwd). */
static qkv_status bench_run(bench *b, int bwd) {
    float **a = b->a;
    const int64_t n = b->n, d = b->d;
    qkv_status s;
    switch (b->layer) {
    case L_ATT:
    case L_RATT: {
        qkv_attn_desc desc;
        attn_desc(b, &desc);
        s = qkv_attention_forward(&desc, a[0], a[1], a[2], a[3], NULL, a[8]);
        if (s != QKV_OK || !bwd) return s;
        qkv_attn_grads g;
        memset(&g, 0, sizeof g);
        g.dq = a[5], g.dk = a[6], g.dv = a[7];
        return qkv_attention_backward(&desc, a[0], a[1], a[2], a[3], a[8], a[4], &g);
    }
    case L_RNN:
        s = qkv_rnn_forward(n, d, d, a[0], a[1], a[2], a[3], a[4]);
        if (s != QKV_OK || !bwd) return s;
        return qkv_rnn_backward(n, d, d, a[0], a[1], a[3], a[4], a[5], a[6], a[7], a[8], a[9]);
    case L_LSTM:
        s = qkv_lstm_forward(n, d, d, a[0], a[1], a[2], a[3], a[4], a[10]);
        if (s != QKV_OK || !bwd) return s;
        return qkv_lstm_backward(n, d, d, a[0], a[1], a[3], a[4], a[10], a[5], a[6], a[7], a[8], a[9]);
    default:
        s = qkv_conv1d_forward(n, d, d, b->kernel, 1, a[0], a[1], a[2], a[3]);
        if (s != QKV_OK || !bwd) return s;
        return qkv_conv1d_backward(n, d, d, b->kernel, 1, a[0], a[2], a[4], a[5], a[6], a[7]);
    }
}

/* Best of repeated runs: at least 3 and at least min_total seconds. */
static double best_time(int (*fn)(void *), void *ctx, double min_total) {
    if (fn(ctx) != 0) return -1.0;
    double best = INFINITY, total = 0.0;
    for (int reps = 0; reps < 200 && (reps < 3 || total < min_total); reps++) {
        double t0 = now_s();
        if (fn(ctx) != 0) return -1.0;
        double dt = now_s() - t0;
        total += dt;
        if (dt < best) best = dt;
    }
    return best;
}

static int run_fwd_bwd(void *ctx) { return bench_run(ctx, 1) == QKV_OK ? 0 : -1; }
static int run_fwd(void *ctx) { return bench_run(ctx, 0) == QKV_OK ? 0 : -1; }

static double time_layer(int layer, int64_t n, int64_t d, int64_t window, int64_t kernel, double min_total) {
    bench b;
    memset(&b, 0, sizeof b);
    b.layer = layer, b.n = n, b.d = d, b.window = window, b.kernel = kernel, b.threads = 1;
    if (bench_alloc(&b) != 0) return -1.0;
    g_clock = CLOCK_PROCESS_CPUTIME_ID;
    double t = best_time(run_fwd_bwd, &b, min_total);
    g_clock = CLOCK_MONOTONIC;
    bench_free(&b);
    return t;
}

/* Least-squares slope of log y against log x over the FIT_POINTS largest
 * x (the asymptotic regime the table speaks of; small sizes are dominated
 * by fixed costs). */
#define FIT_POINTS 4
static double loglog_slope(const double *x, const double *y, int m) {
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    int k = 0;
    for (int i = m > FIT_POINTS ? m - FIT_POINTS : 0; i < m; i++) {
        if (!(y[i] > 0)) continue;
        double lx = log(x[i]), ly = log(y[i]);
        sx += lx, sy += ly, sxx += lx * lx, sxy += lx * ly, k++;
    }
    if (k < 2) return NAN;
    return (k * sxy - sx * sy) / (k * sxx - sx * sx);
}

/* ------------------------------------------------------------------------- */
/* Sequential operations: 2-thread schedules of the forward passes. */

typedef struct par_rnn {
    int64_t n, d;
    const float *wx, *wh, *b, *x;
    float *h;
    pthread_barrier_t bar;
    long rounds;
} par_rnn;

typedef struct par_arg {
    par_rnn *p;
    int64_t lo, hi;
    int tid;
} par_arg;

/* Thread tid owns hidden units [lo, hi): every step needs all of h_{t-1},
 * so every step ends at a barrier: n rounds, however many threads. */
static void *rnn_worker(void *arg) {
    par_arg *a = arg;
    par_rnn *p = a->p;
    const int64_t n = p->n, d = p->d, m = a->hi - a->lo;
    /* The input projection for all steps has no sequential dependency. */
    qkv_sgemm(0, 1, n, m, d, 1.0f, p->x, d, p->wx + a->lo * d, d, 0.0f, p->h + a->lo, d, 1);
    pthread_barrier_wait(&p->bar);
    for (int64_t t = 0; t < n; t++) {
        float *ht = p->h + t * d;
        for (int64_t i = a->lo; i < a->hi; i++) {
            float acc = ht[i] + p->b[i];
            if (t > 0) {
                const float *w = p->wh + i * d, *hp = p->h + (t - 1) * d;
                for (int64_t j = 0; j < d; j++) acc += w[j] * hp[j];
            }
            ht[i] = tanhf(acc);
        }
        pthread_barrier_wait(&p->bar);
        if (a->tid == 0) p->rounds++;
    }
    return NULL;
}

typedef struct par_ctx {
    int kind; /* 0 rnn, 1 conv */
    int threads;
    bench *b;
    par_rnn rnn;
    long rounds;
} par_ctx;

typedef struct conv_arg {
    const bench *b;
    int64_t o_lo, o_hi;
    float *y;
} conv_arg;

/* Output channels are independent: one round (fork, compute, join). */
static void *conv_worker(void *arg) {
    conv_arg *c = arg;
    const bench *b = c->b;
    qkv_conv1d_forward(b->n, b->d, c->o_hi - c->o_lo, b->kernel, 1, b->a[0] + c->o_lo * b->d * b->kernel,
                       b->a[1] + c->o_lo, b->a[2], c->y);
    return NULL;
}

static int run_par(void *arg) {
    par_ctx *c = arg;
    bench *b = c->b;
    pthread_t th[2];
    if (c->kind == 0) {
        par_rnn *p = &c->rnn;
        p->n = b->n, p->d = b->d, p->wx = b->a[0], p->wh = b->a[1], p->b = b->a[2], p->x = b->a[3], p->h = b->a[4];
        p->rounds = 0;
        if (pthread_barrier_init(&p->bar, NULL, (unsigned)c->threads) != 0) return -1;
        par_arg args[2];
        for (int t = 0; t < c->threads; t++) {
            args[t].p = p, args[t].tid = t;
            args[t].lo = b->d * t / c->threads, args[t].hi = b->d * (t + 1) / c->threads;
        }
        for (int t = 1; t < c->threads; t++) pthread_create(&th[t], NULL, rnn_worker, &args[t]);
        rnn_worker(&args[0]);
        for (int t = 1; t < c->threads; t++) pthread_join(th[t], NULL);
        pthread_barrier_destroy(&p->bar);
        c->rounds = p->rounds;
        return 0;
    }
    conv_arg args[2];
    for (int t = 0; t < c->threads; t++) {
        args[t].b = b;
        args[t].o_lo = b->d * t / c->threads, args[t].o_hi = b->d * (t + 1) / c->threads;
        args[t].y = b->a[3] + args[t].o_lo * b->n; /* each thread its own [n, part] block */
    }
    for (int t = 1; t < c->threads; t++) pthread_create(&th[t], NULL, conv_worker, &args[t]);
    conv_worker(&args[0]);
    for (int t = 1; t < c->threads; t++) pthread_join(th[t], NULL);
    c->rounds = 1;
    return 0;
}

typedef struct seq_result {
    long rounds;
    double speedup;
} seq_result;

static seq_result sequential_ops(int layer, int64_t n, int64_t d, int64_t window, int64_t kernel, double min_total) {
    seq_result r = {0, NAN};
    bench b;
    memset(&b, 0, sizeof b);
    b.layer = layer == L_LSTM ? L_RNN : layer, b.n = n, b.d = d, b.window = window, b.kernel = kernel;
    if (bench_alloc(&b) != 0) return r;
    double t[2];
    if (layer == L_ATT || layer == L_RATT) {
        /* The core splits the query rows over its threads: one fork-join. */
        for (int k = 0; k < 2; k++) {
            b.threads = k + 1;
            t[k] = best_time(run_fwd, &b, min_total);
        }
        r.rounds = 1;
    } else {
        par_ctx c;
        memset(&c, 0, sizeof c);
        c.kind = layer == L_CONV ? 1 : 0;
        c.b = &b;
        for (int k = 0; k < 2; k++) {
            c.threads = k + 1;
            t[k] = best_time(run_par, &c, min_total);
        }
        r.rounds = c.rounds;
    }
    if (t[0] > 0 && t[1] > 0) r.speedup = t[0] / t[1];
    bench_free(&b);
    return r;
}

/* ------------------------------------------------------------------------- */
/* Maximum path length by gradient reachability. Each step propagates a
 * gradient (one-hot at output position n-1) down one layer through that
 * layer's backward; the answer is the first depth at which input position 0
 * receives a non-zero gradient. After every layer the gradient is replaced
 * by its pattern of non-zeros (1 where non-zero): reachability is about zero
 * against non-zero only, and without this the far tail of a deep stack's
 * gradient (e.g. 3^-255 after 255 averaging layers) would underflow to zero
 * and fake an unreachable input. Weights are positive, so no sum cancels by
 * accident. */

#define PATH_D 4

static int nonzero_at0(const float *g, int64_t d) {
    for (int64_t j = 0; j < d; j++)
        if (g[j] != 0.0f) return 1;
    return 0;
}

static void binarize(float *g, int64_t m) {
    for (int64_t i = 0; i < m; i++) g[i] = g[i] != 0.0f ? 1.0f : 0.0f;
}

/* Convolution stack of `depth` layers: layer l (from the bottom) has
 * dilation K^(l mod m) when dilated, 1 otherwise, the cycle 1, K, .., K^(m-1)
 * running up to the largest power of K below n and then repeating, as
 * WaveNet's does. (Without the cycle, growing dilations land outside the
 * sequence, and since every partial sum of the offsets must stay inside
 * [0, n), some positions become unreachable at any depth.) Returns the least depth
 * at which output n-1 reaches input 0, or -1. */
static int64_t path_conv(int64_t n, int64_t k, int dilated) {
    float *w = malloc((size_t)k * sizeof(float)), *x = calloc((size_t)n, sizeof(float));
    float *g = malloc((size_t)n * sizeof(float)), *gx = malloc((size_t)n * sizeof(float));
    float *dw = malloc((size_t)k * sizeof(float));
    int64_t found = -1;
    if (!w || !x || !g || !gx || !dw) goto out;
    for (int64_t j = 0; j < k; j++) w[j] = 1.0f / (float)k;
    for (int64_t depth = 1; depth <= 2 * n && found < 0; depth++) {
        memset(g, 0, (size_t)n * sizeof(float));
        g[n - 1] = 1.0f;
        for (int64_t l = depth - 1; l >= 0; l--) { /* the top layer is met first */
            int64_t dil = 1;
            int64_t cyc = 1; /* the dilation cycle's length: 1, K, .., K^m <= n - 1 */
            for (int64_t p = k; p <= n - 1; p *= k) cyc++;
            for (int64_t e = 0; dilated && e < l % cyc; e++) dil *= k;
            if (qkv_conv1d_backward(n, 1, 1, k, dil, w, x, g, gx, dw, NULL) != QKV_OK) goto out;
            binarize(gx, n);
            memcpy(g, gx, (size_t)n * sizeof(float));
        }
        if (g[0] != 0.0f) found = depth;
        if (!dilated && found < 0) {
            /* Contiguous layers are all alike: one more layer is one more
             * backward from here, no need to restart the stack. */
            for (int64_t more = depth + 1; more <= 2 * n; more++) {
                if (qkv_conv1d_backward(n, 1, 1, k, 1, w, x, g, gx, dw, NULL) != QKV_OK) goto out;
                binarize(gx, n);
                memcpy(g, gx, (size_t)n * sizeof(float));
                if (g[0] != 0.0f) {
                    found = more;
                    break;
                }
            }
            break;
        }
    }
out:
    free(w), free(x), free(g), free(gx), free(dw);
    return found;
}

/* Attention stack x_{l+1} = attention(x_l, x_l, x_l) (window R or full):
 * the real forward of max_depth layers, then one backward pass from the top,
 * recording the first depth whose input gradient reaches position 0. */
static int64_t path_attention(int64_t n, int64_t window, int64_t max_depth) {
    const int64_t d = PATH_D;
    float *xs = malloc((size_t)((max_depth + 1) * n * d) * sizeof(float));
    float *g = calloc((size_t)(n * d), sizeof(float));
    float *dq = malloc((size_t)(n * d) * sizeof(float)), *dk = malloc((size_t)(n * d) * sizeof(float));
    float *dv = malloc((size_t)(n * d) * sizeof(float));
    int64_t found = -1;
    if (!xs || !g || !dq || !dk || !dv) goto out;
    for (int64_t i = 0; i < n * d; i++) xs[i] = 0.5f * frand();
    qkv_attn_desc desc;
    qkv_attn_desc_init(&desc);
    desc.batch = 1, desc.n_q = desc.n_k = n, desc.heads = 1, desc.dim = d, desc.threads = 1;
    if (window > 0) {
        desc.mask = QKV_MASK_WINDOW;
        desc.window_left = desc.window_right = window / 2;
    }
    for (int64_t l = 0; l < max_depth; l++)
        if (qkv_attention_forward(&desc, xs + l * n * d, xs + l * n * d, xs + l * n * d, xs + (l + 1) * n * d, NULL,
                                  NULL) != QKV_OK)
            goto out;
    for (int64_t j = 0; j < d; j++) g[(n - 1) * d + j] = 1.0f;
    for (int64_t depth = 1; depth <= max_depth; depth++) {
        const float *xin = xs + (max_depth - depth) * n * d;
        qkv_attn_grads gr;
        memset(&gr, 0, sizeof gr);
        gr.dq = dq, gr.dk = dk, gr.dv = dv;
        if (qkv_attention_backward(&desc, xin, xin, xin, NULL, NULL, g, &gr) != QKV_OK) goto out;
        for (int64_t i = 0; i < n * d; i++) g[i] = fabsf(dq[i]) + fabsf(dk[i]) + fabsf(dv[i]);
        binarize(g, n * d);
        if (nonzero_at0(g, d)) {
            found = depth;
            break;
        }
    }
out:
    free(xs), free(g), free(dq), free(dk), free(dv);
    return found;
}

/* The RNN: how many recurrent steps the gradient of h_{n-1} travels before
 * it reaches x_0: BPTT with dh one-hot at n-1; the steps are n-1 - (the
 * earliest position with a non-zero input gradient). */
static int64_t path_rnn(int64_t n) {
    const int64_t d = PATH_D;
    size_t m = (size_t)(n * d);
    float *w = malloc(2 * d * d * sizeof(float)), *x = malloc(m * sizeof(float)), *h = malloc(m * sizeof(float));
    float *dh = calloc(m, sizeof(float)), *dx = malloc(m * sizeof(float));
    float *dw = calloc(2 * d * d, sizeof(float));
    int64_t steps = -1;
    if (!w || !x || !h || !dh || !dx || !dw) goto out;
    /* W_h = I and tiny inputs keep tanh' ~ 1, so the gradient neither
     * vanishes nor explodes over the n steps: with generic weights it decays
     * geometrically and underflows float after a few hundred steps (the
     * vanishing gradient that long paths mean in practice), which would
     * hide the dependency that exists. */
    for (int64_t i = 0; i < d * d; i++) w[i] = 0.01f * (1.5f + frand());
    for (int64_t i = 0; i < d * d; i++) w[d * d + i] = (i / d == i % d) ? 1.0f : 0.0f;
    for (size_t i = 0; i < m; i++) x[i] = 0.001f * frand();
    if (qkv_rnn_forward(n, d, d, w, w + d * d, NULL, x, h) != QKV_OK) goto out;
    for (int64_t j = 0; j < d; j++) dh[(n - 1) * d + j] = 1.0f;
    if (qkv_rnn_backward(n, d, d, w, w + d * d, x, h, dh, dx, dw, dw + d * d, NULL) != QKV_OK) goto out;
    for (int64_t t = 0; t < n; t++)
        if (nonzero_at0(dx + t * d, d)) {
            steps = (n - 1) - t;
            break;
        }
out:
    free(w), free(x), free(h), free(dh), free(dx), free(dw);
    return steps;
}

/* ------------------------------------------------------------------------- */
/* The plot: three log-log panels drawn pixel by pixel. */

typedef struct canvas {
    int w, h;
    qkv_image img;
} canvas;

static void put(canvas *c, int x, int y, const unsigned char rgb[3]) {
    if (x < 0 || y < 0 || x >= c->w || y >= c->h) return;
    float *p = c->img.data + ((size_t)y * (size_t)c->w + (size_t)x) * 3;
    for (int k = 0; k < 3; k++) p[k] = rgb[k] / 255.0f;
}

static void line(canvas *c, int x0, int y0, int x1, int y1, const unsigned char rgb[3], int thick) {
    int dx = abs(x1 - x0), dy = -abs(y1 - y0), sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1, err = dx + dy;
    for (;;) {
        for (int a = -(thick / 2); a <= thick / 2; a++)
            for (int b = -(thick / 2); b <= thick / 2; b++) put(c, x0 + a, y0 + b, rgb);
        if (x0 == x1 && y0 == y1) break;
        int e2 = 2 * err;
        if (e2 >= dy) err += dy, x0 += sx;
        if (e2 <= dx) err += dx, y0 += sy;
    }
}

/* A 5x7 bitmap font for the plot's labels (the characters used only;
 * anything else is drawn blank). Each row is 5 bits, most significant left. */
static const struct glyph {
    char c;
    unsigned char rows[7];
} font[] = {
    {'0', {0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E}}, {'1', {0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E}},
    {'2', {0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F}}, {'3', {0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E}},
    {'4', {0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02}}, {'5', {0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E}},
    {'6', {0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E}}, {'7', {0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08}},
    {'8', {0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E}}, {'9', {0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C}},
    {'A', {0x0E, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11}}, {'B', {0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E}},
    {'C', {0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E}}, {'D', {0x1C, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1C}},
    {'E', {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x1F}}, {'F', {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x10}},
    {'G', {0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F}}, {'H', {0x11, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11}},
    {'I', {0x0E, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E}}, {'K', {0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11}},
    {'L', {0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1F}}, {'M', {0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11}},
    {'N', {0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11}}, {'O', {0x0E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E}},
    {'P', {0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10}}, {'R', {0x1E, 0x11, 0x11, 0x1E, 0x14, 0x12, 0x11}},
    {'S', {0x0F, 0x10, 0x10, 0x0E, 0x01, 0x01, 0x1E}}, {'T', {0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04}},
    {'U', {0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E}}, {'V', {0x11, 0x11, 0x11, 0x11, 0x11, 0x0A, 0x04}},
    {'W', {0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0A}}, {'-', {0x00, 0x00, 0x00, 0x1F, 0x00, 0x00, 0x00}},
    {'.', {0x00, 0x00, 0x00, 0x00, 0x00, 0x0C, 0x0C}}, {'=', {0x00, 0x00, 0x1F, 0x00, 0x1F, 0x00, 0x00}},
    {'(', {0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02}}, {')', {0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08}},
    {',', {0x00, 0x00, 0x00, 0x00, 0x0C, 0x04, 0x08}}, {'Y', {0x11, 0x11, 0x0A, 0x04, 0x04, 0x04, 0x04}},
};

/* Text with its top-left corner at (x, y); returns the width drawn. */
static int text(canvas *c, int x, int y, const char *str, const unsigned char rgb[3]) {
    int x0 = x;
    for (const char *p = str; *p; p++, x += 6) {
        for (size_t g = 0; g < sizeof font / sizeof font[0]; g++) {
            if (font[g].c != *p) continue;
            for (int r = 0; r < 7; r++)
                for (int b = 0; b < 5; b++)
                    if (font[g].rows[r] & (0x10 >> b)) put(c, x + b, y + r, rgb);
            break;
        }
    }
    return x - x0;
}

static int text_width(const char *str) { return 6 * (int)strlen(str); }

typedef struct panel {
    int x0, y0, w, h;           /* pixel frame */
    double lx0, lx1, ly0, ly1;  /* log10 ranges */
} panel;

static void to_px(const panel *p, double x, double y, int *px, int *py) {
    *px = p->x0 + (int)lround((log10(x) - p->lx0) / (p->lx1 - p->lx0) * p->w);
    *py = p->y0 + p->h - (int)lround((log10(y) - p->ly0) / (p->ly1 - p->ly0) * p->h);
}

static void panel_frame(canvas *c, const panel *p) {
    static const unsigned char grid[3] = {225, 225, 225}, ink[3] = {60, 60, 60};
    for (double e = floor(p->lx0); e <= p->lx1; e += 1.0)
        for (int m = 1; m < 10; m++) {
            double v = e + log10((double)m);
            if (v < p->lx0 || v > p->lx1) continue;
            int x = p->x0 + (int)lround((v - p->lx0) / (p->lx1 - p->lx0) * p->w);
            line(c, x, p->y0, x, p->y0 + p->h, m == 1 ? ink : grid, 1);
        }
    for (double e = floor(p->ly0); e <= p->ly1; e += 1.0)
        for (int m = 1; m < 10; m++) {
            double v = e + log10((double)m);
            if (v < p->ly0 || v > p->ly1) continue;
            int y = p->y0 + p->h - (int)lround((v - p->ly0) / (p->ly1 - p->ly0) * p->h);
            line(c, p->x0, y, p->x0 + p->w, y, m == 1 ? ink : grid, 1);
        }
    /* Decade labels: x below the frame, y left of it. */
    char lab[32];
    for (double e = ceil(p->lx0); e <= p->lx1; e += 1.0) {
        int x = p->x0 + (int)lround((e - p->lx0) / (p->lx1 - p->lx0) * p->w);
        snprintf(lab, sizeof lab, "%g", pow(10.0, e));
        text(c, x - text_width(lab) / 2, p->y0 + p->h + 5, lab, ink);
    }
    for (double e = ceil(p->ly0); e <= p->ly1; e += 1.0) {
        int y = p->y0 + p->h - (int)lround((e - p->ly0) / (p->ly1 - p->ly0) * p->h);
        snprintf(lab, sizeof lab, "%g", pow(10.0, e));
        text(c, p->x0 - 4 - text_width(lab), y - 3, lab, ink);
    }
    line(c, p->x0, p->y0, p->x0 + p->w, p->y0, ink, 1);
    line(c, p->x0, p->y0 + p->h, p->x0 + p->w, p->y0 + p->h, ink, 1);
    line(c, p->x0, p->y0, p->x0, p->y0 + p->h, ink, 1);
    line(c, p->x0 + p->w, p->y0, p->x0 + p->w, p->y0 + p->h, ink, 1);
}

static void panel_series(canvas *c, const panel *p, const double *x, const double *y, int m,
                         const unsigned char rgb[3]) {
    int px = 0, py = 0, have = 0;
    for (int i = 0; i < m; i++) {
        if (!(y[i] > 0)) continue;
        int qx, qy;
        to_px(p, x[i], y[i], &qx, &qy);
        if (have) line(c, px, py, qx, qy, rgb, 2);
        for (int a = -3; a <= 3; a++)
            for (int b = -3; b <= 3; b++) put(c, qx + a, qy + b, rgb);
        px = qx, py = qy, have = 1;
    }
}

static void log_range(const double *v, int m, double *lo, double *hi) {
    double a = INFINITY, b = -INFINITY;
    for (int i = 0; i < m; i++)
        if (v[i] > 0) a = fmin(a, log10(v[i])), b = fmax(b, log10(v[i]));
    if (!(a <= b)) a = 0, b = 1;
    double pad = 0.05 * (b - a) + 0.05;
    *lo = a - pad, *hi = b + pad;
}

/* Colours of the series (also printed with the table). */
static const unsigned char colour[L_COUNT + 1][3] = {
    {220, 40, 40}, {240, 150, 0}, {40, 80, 220}, {140, 60, 180}, {30, 150, 60}, {0, 170, 170}};
static const char *colour_name[L_COUNT + 1] = {"red", "orange", "blue", "purple", "green", "teal"};

#define MAX_PTS 16

typedef struct results {
    int nn, nd, np;
    double n[MAX_PTS], d[MAX_PTS], t_n[L_COUNT][MAX_PTS], t_d[L_COUNT][MAX_PTS];
    double pn[MAX_PTS], path[L_COUNT + 1][MAX_PTS]; /* path: ATT, RATT, RNN, (LSTM unused), CONV, CONV dilated */
    int64_t d_fixed, n_fixed;
} results;

static qkv_status draw_png(const char *path, const results *r) {
    canvas c;
    c.w = 1300, c.h = 500;
    qkv_status s = qkv_image_alloc(&c.img, c.h, c.w, 3);
    if (s != QKV_OK) return s;
    for (int64_t i = 0; i < qkv_image_count(&c.img); i++) c.img.data[i] = 1.0f;
    panel ps[3];
    for (int k = 0; k < 3; k++) ps[k] = (panel){60 + k * 425, 30, 360, 390, 0, 1, 0, 1};
    double all[L_COUNT * MAX_PTS];
    int m = 0;
    /* Panel 1: time vs n. */
    for (int l = 0; l < L_COUNT; l++)
        for (int i = 0; i < r->nn; i++) all[m++] = r->t_n[l][i];
    log_range(r->n, r->nn, &ps[0].lx0, &ps[0].lx1);
    log_range(all, m, &ps[0].ly0, &ps[0].ly1);
    m = 0;
    for (int l = 0; l < L_COUNT; l++)
        for (int i = 0; i < r->nd; i++) all[m++] = r->t_d[l][i];
    log_range(r->d, r->nd, &ps[1].lx0, &ps[1].lx1);
    log_range(all, m, &ps[1].ly0, &ps[1].ly1);
    m = 0;
    for (int l = 0; l <= L_COUNT; l++)
        for (int i = 0; i < r->np; i++) all[m++] = r->path[l][i];
    log_range(r->pn, r->np, &ps[2].lx0, &ps[2].lx1);
    log_range(all, m, &ps[2].ly0, &ps[2].ly1);
    for (int k = 0; k < 3; k++) panel_frame(&c, &ps[k]);
    static const unsigned char ink[3] = {20, 20, 20};
    char title[3][64];
    snprintf(title[0], sizeof title[0], "TIME (S) VS N, D=%lld", (long long)r->d_fixed);
    snprintf(title[1], sizeof title[1], "TIME (S) VS D, N=%lld", (long long)r->n_fixed);
    snprintf(title[2], sizeof title[2], "PATH LENGTH (LAYERS) VS N");
    for (int k = 0; k < 3; k++) text(&c, ps[k].x0 + (ps[k].w - text_width(title[k])) / 2, 12, title[k], ink);
    static const char *legend[L_COUNT + 1] = {"SELF-ATTENTION", "RESTRICTED (WINDOW)", "RNN", "LSTM",
                                              "CONVOLUTION", "DILATED CONV"};
    int lx = 60;
    for (int l = 0; l <= L_COUNT; l++) {
        for (int a = 0; a < 10; a++)
            for (int b = 0; b < 10; b++) put(&c, lx + a, 462 + b, colour[l]);
        lx += 16 + text(&c, lx + 15, 464, legend[l], ink) + 14;
    }
    for (int l = 0; l < L_COUNT; l++) {
        panel_series(&c, &ps[0], r->n, r->t_n[l], r->nn, colour[l]);
        panel_series(&c, &ps[1], r->d, r->t_d[l], r->nd, colour[l]);
    }
    for (int l = 0; l <= L_COUNT; l++)
        if (l != L_LSTM) panel_series(&c, &ps[2], r->pn, r->path[l], r->np, colour[l]);
    s = qkv_image_save_png(path, &c.img);
    qkv_image_free(&c.img);
    return s;
}

/* ------------------------------------------------------------------------- */

/* One sweep: every layer timed at each x of xs[nx], which is n (vary_n, d =
 * fixed) or d (n = fixed), into t[layer][i]; printed as the times come,
 * with the log-log slope of each layer into expo[layer]. */
static void sweep(const char *axis, const double *xs, int nx, int vary_n, int64_t fixed, int64_t window,
                  int64_t kernel, double min_total, double t[L_COUNT][MAX_PTS], double *expo) {
    printf("time [ms] against %s (%s = %lld):\n%-22s", axis, vary_n ? "d" : "n", (long long)fixed, axis);
    for (int i = 0; i < nx; i++) printf(" %9.0f", xs[i]);
    printf("   exponent\n");
    for (int l = 0; l < L_COUNT; l++) {
        printf("%-22s", layer_name[l]);
        for (int i = 0; i < nx; i++) {
            int64_t x = (int64_t)xs[i];
            t[l][i] = time_layer(l, vary_n ? x : fixed, vary_n ? fixed : x, window, kernel, min_total);
            printf(" %9.3f", t[l][i] * 1e3);
            fflush(stdout);
        }
        expo[l] = loglog_slope(xs, t[l], nx);
        printf("   %s^%.2f\n", axis, expo[l]);
    }
}

/* The times of every layer against n (d fixed) and against d (n_fix), printed
 * as they come, and their log-log slopes. */
static void time_sweeps(results *r, int64_t d, int64_t n_fix, int64_t window, int64_t kernel,
                        double min_total, double *exp_n, double *exp_d) {
    sweep("n", r->n, r->nn, 1, d, window, kernel, min_total, r->t_n, exp_n);
    printf("\n");
    sweep("d", r->d, r->nd, 0, n_fix, window, kernel, min_total, r->t_d, exp_d);
}

/* Maximum path lengths, measured and printed. */
static void path_lengths(results *r, int64_t window, int64_t kernel, int quick) {
    /* n = (K^j + 1) / 2: then j dilated layers (dilations 1 .. K^(j-1))
     * reach exactly n - 1 positions back, and log_K shows cleanly. */
    int64_t kj = kernel * kernel;
    for (int64_t n = (kj + 1) / 2; n <= (quick ? 400 : 1200) && r->np < MAX_PTS; kj *= kernel, n = (kj + 1) / 2) {
        int i = r->np++;
        r->pn[i] = (double)n;
        r->path[L_ATT][i] = (double)path_attention(n, 0, 2);
        r->path[L_RATT][i] = (double)path_attention(n, window, 2 * (n / (window / 2 > 0 ? window / 2 : 1)) + 4);
        r->path[L_RNN][i] = (double)path_rnn(n);
        r->path[L_LSTM][i] = NAN;
        r->path[L_CONV][i] = (double)path_conv(n, kernel, 0);
        r->path[L_COUNT][i] = (double)path_conv(n, kernel, 1);
    }
    printf("\nmaximum path length (least stacked layers for output n-1 to depend on input 0;\n"
           "recurrent: steps the gradient passes through):\n%-22s", "n");
    for (int i = 0; i < r->np; i++) printf(" %7.0f", r->pn[i]);
    printf("\n");
    static const char *path_name[L_COUNT + 1] = {"self-attention", "restricted self-attn", "recurrent (Elman RNN)",
                                                  NULL, "conv, contiguous", "conv, dilated K^l"};
    for (int l = 0; l <= L_COUNT; l++) {
        if (!path_name[l]) continue;
        printf("%-22s", path_name[l]);
        for (int i = 0; i < r->np; i++) printf(" %7.0f", r->path[l][i]);
        printf("\n");
    }
}

/* The table beside the paper's, and what its columns mean. */
static void print_table(const results *r, const seq_result *seq, const double *exp_n,
                        const double *exp_d, int64_t max_n, int64_t d, int64_t n_seq) {
    static const char *paper[L_COUNT][3] = {
        {"O(n^2 d)", "O(1)", "O(1)"},
        {"O(r n d)", "O(1)", "O(n/r)"},
        {"O(n d^2)", "O(n)", "O(n)"},
        {"O(n d^2)", "O(n)", "O(n)"},
        {"O(k n d^2)", "O(1)", "O(log_k n)"},
    };
    int last = r->np - 1;
    printf("\nVaswani et al. 2017, Table 1 (paper) and measured here (n up to %lld, d = %lld):\n",
           (long long)max_n, (long long)d);
    printf("%-22s | %-11s %-6s %-11s | %-6s %-6s %-17s %-18s\n", "layer", "complexity", "seq.", "path",
           "t~n^", "t~d^", "seq. rounds (x2)", "path at n=" );
    for (int l = 0; l < L_COUNT; l++) {
        char rounds[64], path[64];
        snprintf(rounds, sizeof rounds, "%ld (%.2fx)", seq[l].rounds, seq[l].speedup);
        if (l == L_CONV)
            snprintf(path, sizeof path, "%.0f: %.0f / %.0f dil.", r->pn[last], r->path[L_CONV][last],
                     r->path[L_COUNT][last]);
        else if (l == L_LSTM)
            snprintf(path, sizeof path, "as RNN");
        else
            snprintf(path, sizeof path, "%.0f: %.0f", r->pn[last], r->path[l][last]);
        printf("%-22s | %-11s %-6s %-11s | %-6.2f %-6.2f %-17s %-18s\n", layer_name[l], paper[l][0], paper[l][1],
               paper[l][2], exp_n[l], exp_d[l], rounds, path);
    }
    printf("\nsequential operations: synchronisation rounds of a 2-thread forward at n = %lld\n"
           "(attention: the core's one fork-join over query rows; convolution: output\n"
           "channels split, one round; RNN: hidden units split, a barrier after each step;\n"
           "LSTM: as the RNN). Speed-ups depend on what else runs on the machine.\n"
           "The paper's O(log_k n) is for dilated convolutions (measured: 'dil.'); contiguous\n"
           "kernels need O(n/k) layers.\n",
           (long long)n_seq);
}

int cli_cmd_complexity(int argc, char **argv) {
    int64_t d = 64, max_n = 2048, window = 32, kernel = 3;
    const char *png = NULL;
    int quick = 0, given[OPT_COUNT] = {0};
    cli_args a = {CMD, argc, argv, 1, options, OPT_COUNT, OPT_HELP, help, given, 0};
    const char *name, *value;
    for (int id; (id = cli_scan(&a, &name, &value)) != CLI_END;) {
        if (id == CLI_STOP) return a.status;
        int bad = 0;
        switch (id) {
        case OPT_D: bad = cli_parse_int64(CMD, "--d", value, 1, 4096, &d); break;
        case OPT_MAX_N: bad = cli_parse_int64(CMD, "--max-n", value, 128, 1 << 16, &max_n); break;
        case OPT_WINDOW: bad = cli_parse_int64(CMD, "--window", value, 2, 1 << 16, &window); break;
        case OPT_KERNEL: bad = cli_parse_int64(CMD, "--kernel", value, 3, 63, &kernel); break;
        case OPT_PNG: png = value; break;
        case OPT_QUICK: quick = 1; break;
        default: break;
        }
        if (bad) {
            cli_usage_hint(CMD);
            return CLI_EXIT_USAGE;
        }
    }
    if (window % 2 != 0) return usage_error("--window", "R must be even (keys p-R/2 .. p+R/2)");
    if (kernel % 2 == 0) return usage_error("--kernel", "K must be odd");
    if (png && !QKV_WITH_PNG)
        return usage_error("--png", "this qkv was built without PNG (leave --png out, or rebuild with "
                                    "-DQKV_WITH_PNG=ON)");
    /* Timings on one thread; the thread study below sets its own counts. */
    setenv("QKV_NUM_THREADS", "1", 1);
    if (quick && !given[OPT_MAX_N]) max_n = 256;
    if (quick && !given[OPT_D]) d = 32;
    const double min_total = quick ? 0.002 : 0.15;

    results *r = calloc(1, sizeof *r);
    if (!r) {
        cli_error(CMD, NULL, NULL, "out of memory");
        return CLI_EXIT_FAIL;
    }
    int rc = CLI_EXIT_OK;
    for (int64_t n = 64; n <= max_n && r->nn < MAX_PTS; n *= 2) r->n[r->nn++] = (double)n;
    const int64_t n_fix = max_n < 512 ? max_n : 512;
    r->d_fixed = d;
    r->n_fixed = n_fix;
    for (int64_t dd = quick ? 8 : 16; dd <= (quick ? 64 : 256) && r->nd < MAX_PTS; dd *= 2) r->d[r->nd++] = (double)dd;

    printf("qkv complexity: d = %lld, n = 64 .. %lld, fixed n = %lld for the d sweep, window R = %lld, "
           "kernel K = %lld\n(forward + backward, one thread, process CPU time, best of repeated runs)\n\n",
           (long long)d, (long long)max_n, (long long)n_fix, (long long)window, (long long)kernel);
    double exp_n[L_COUNT], exp_d[L_COUNT];
    time_sweeps(r, d, n_fix, window, kernel, min_total, exp_n, exp_d);

    /* Sequential operations. */
    const int64_t n_seq = max_n < 1024 ? max_n : 1024;
    seq_result seq[L_COUNT];
    for (int l = 0; l < L_COUNT; l++)
        seq[l] = l == L_LSTM ? seq[L_RNN] : sequential_ops(l, n_seq, d, window, kernel, min_total);

    path_lengths(r, window, kernel, quick);

    print_table(r, seq, exp_n, exp_d, max_n, d, n_seq);
    if (png) {
        qkv_status s = draw_png(png, r);
        if (s != QKV_OK) {
            cli_error(CMD, "--png", png, "cannot write: %s", qkv_status_string(s));
            rc = CLI_EXIT_FAIL;
        } else {
            printf("\nplot %s: time vs n | time vs d | path length vs n (log-log, grid lines at\n"
                   "1..9 x 10^k, labelled decades); colours:", png);
            for (int l = 0; l < L_COUNT; l++) printf(" %s %s,", layer_name[l], colour_name[l]);
            printf(" dilated conv %s.\n", colour_name[L_COUNT]);
        }
    }
    free(r);
    return cli_flush_stdout(CMD, rc);
}
