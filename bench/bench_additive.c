/* bench_additive - the additive (Bahdanau / MLP) score: the fast float32
 * path (QKV_IMPL_FAST) beside the double reference (QKV_IMPL_REFERENCE,
 * which AUTO used for this score before the fast path existed), in the
 * same run, forward and forward + backward (the backward given the
 * forward's out and lse, with every gradient: dq, dk, dv, dW1, dW2, dw).
 * Prints the median time of each over the repetitions and the speed-up,
 * and the largest difference of the fast output from the reference's.
 * Only the public API; never asserted in CI.
 *
 *   bench_additive [--n N] [--heads H] [--dim D] [--additive-dim A] [--batch B]
 *                  [--threads T] [--reps R] [--ref-reps R] [--causal] */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "qkv.h"

/* Seconds on the monotonic clock. */
static double now_s(void) {
    struct timespec t;
    return clock_gettime(CLOCK_MONOTONIC, &t) == 0 ? (double)t.tv_sec + 1e-9 * (double)t.tv_nsec : 0.0;
}

/* The median of x[0..n), sorting it in place (insertion: n is small). */
static double median(double *x, int n) {
    for (int i = 1; i < n; i++) {
        double v = x[i];
        int j = i;
        for (; j > 0 && x[j - 1] > v; j--) x[j] = x[j - 1];
        x[j] = v;
    }
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

static uint64_t g_state = 12345;
static float urand(void) { /* splitmix64 to [-1, 1) */
    uint64_t z = (g_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)((double)(z >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static float *rnd(size_t n, float sd) {
    float *x = malloc(n * sizeof(float));
    if (!x) {
        fprintf(stderr, "bench_additive: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++) x[i] = sd * urand();
    return x;
}

typedef struct bufs {
    float *q, *k, *v, *dout, *out, *lse, *dq, *dk, *dv, *dw1, *dw2, *dw;
} bufs;

/* Median seconds of the forward (bwd = 0) or forward + backward (bwd = 1). */
static double timed(const qkv_attn_desc *d, bufs *b, int bwd, int reps) {
    double *t = malloc((size_t)reps * sizeof(double));
    qkv_attn_grads g = {b->dq, b->dk, b->dv, NULL, b->dw1, b->dw2, b->dw, NULL};
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        qkv_status s = qkv_attention_forward(d, b->q, b->k, b->v, b->out, NULL, b->lse);
        if (s == QKV_OK && bwd) s = qkv_attention_backward(d, b->q, b->k, b->v, b->out, b->lse, b->dout, &g);
        t[r] = now_s() - t0;
        if (s != QKV_OK) {
            fprintf(stderr, "bench_additive: %s\n", qkv_status_string(s));
            exit(1);
        }
    }
    double m = median(t, reps);
    free(t);
    return m;
}

static long opt(int argc, char **argv, const char *name, long def) {
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], name)) return strtol(argv[i + 1], NULL, 10);
    return def;
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help")) {
            printf("Usage: bench_additive [--n N] [--heads H] [--dim D] [--additive-dim A] [--batch B]\n"
                   "                      [--threads T] [--reps R] [--ref-reps R] [--causal]\n");
            return 0;
        }
    const long n = opt(argc, argv, "--n", 512), H = opt(argc, argv, "--heads", 4), D = opt(argc, argv, "--dim", 64);
    const long A = opt(argc, argv, "--additive-dim", 64), B = opt(argc, argv, "--batch", 1);
    const int T = (int)opt(argc, argv, "--threads", 2), reps = (int)opt(argc, argv, "--reps", 7);
    const int rreps = (int)opt(argc, argv, "--ref-reps", 3);
    int causal = 0;
    for (int i = 1; i < argc; i++) causal |= !strcmp(argv[i], "--causal");
    if (n < 1 || H < 1 || D < 1 || A < 1 || B < 1 || T < 1 || reps < 1 || rreps < 1) {
        fprintf(stderr, "bench_additive: every size and count must be >= 1\n");
        return 2;
    }
    size_t nx = (size_t)(B * n * H * D), nw = (size_t)(H * A * D);
    bufs b;
    b.q = rnd(nx, 1.0f);
    b.k = rnd(nx, 1.0f);
    b.v = rnd(nx, 1.0f);
    b.dout = rnd(nx, 1.0f);
    b.out = rnd(nx, 0.0f);
    b.lse = rnd((size_t)(B * H * n), 0.0f);
    b.dq = rnd(nx, 0.0f);
    b.dk = rnd(nx, 0.0f);
    b.dv = rnd(nx, 0.0f);
    b.dw1 = rnd(nw, 0.0f);
    b.dw2 = rnd(nw, 0.0f);
    b.dw = rnd((size_t)(H * A), 0.0f);
    float *w1 = rnd(nw, 1.7f / sqrtf((float)D)), *w2 = rnd(nw, 1.7f / sqrtf((float)D));
    float *w = rnd((size_t)(H * A), 1.7f / sqrtf((float)A));
    qkv_attn_desc d;
    qkv_attn_desc_init(&d);
    d.batch = B;
    d.n_q = d.n_k = n;
    d.heads = H;
    d.dim = D;
    d.score = QKV_SCORE_ADDITIVE;
    d.additive_dim = A;
    d.additive_w1 = w1;
    d.additive_w2 = w2;
    d.additive_w = w;
    d.mask = causal ? QKV_MASK_CAUSAL : QKV_MASK_NONE;
    d.threads = T;

    d.impl = QKV_IMPL_REFERENCE;
    double rf = timed(&d, &b, 0, rreps);
    float *ref_out = malloc(nx * sizeof(float));
    memcpy(ref_out, b.out, nx * sizeof(float));
    double rb = timed(&d, &b, 1, rreps);
    d.impl = QKV_IMPL_FAST;
    double ff = timed(&d, &b, 0, reps);
    double diff = 0.0;
    for (size_t i = 0; i < nx; i++) {
        double e = fabs((double)b.out[i] - (double)ref_out[i]);
        if (e > diff) diff = e;
    }
    double fb = timed(&d, &b, 1, reps);
    printf("additive B=%ld n=%ld H=%ld D=%ld A=%ld threads=%d %s (median of %d fast, %d reference)\n", B, n, H,
           D, A, T, causal ? "causal" : "full", reps, rreps);
    printf("  forward        reference %9.4f s   fast %9.5f s   speed-up %6.1fx\n", rf, ff, rf / ff);
    printf("  fwd + bwd      reference %9.4f s   fast %9.5f s   speed-up %6.1fx\n", rb, fb, rb / fb);
    printf("  max |out_fast - out_ref| = %.3g\n", diff);
    free(b.q); free(b.k); free(b.v); free(b.dout); free(b.out); free(b.lse);
    free(b.dq); free(b.dk); free(b.dv); free(b.dw1); free(b.dw2); free(b.dw);
    free(w1); free(w2); free(w); free(ref_out);
    return 0;
}
