/* qkv_sgemm against a double-precision naive product: random shapes drawn
 * from awkward sizes (0, 1, 2, around the register tiles and around powers of
 * two), all four transpose combinations, strides larger than needed, several
 * alpha / beta (beta = 0 on a NaN-filled C must not leak NaN), every kernel
 * the CPU has (forced through qkv_cpu_force_arch, plus small cache blocks so
 * that every blocking loop runs several times), bitwise-identical results on
 * 1, 2 and 3 threads, canaries around C and untouched stride padding,
 * argument errors, and a failing allocator.
 *
 * Tolerance: |C - C64|_ij <= 2 (K + 4) u (|alpha| |op(A)| |op(B)| + |beta| |C0|)_ij,
 * u = 2^-24 (float unit roundoff). Why: each element is a float dot product
 * accumulated in order over its KC blocks (one rounding per step, FMA or
 * multiply-add: at most K roundings, the classic gamma_K bound, Higham,
 * "Accuracy and Stability of Numerical Algorithms", 3.1), then merged per KC
 * block as (alpha * ab) + (beta' * c): three more roundings per block, each
 * relative to a partial sum bounded by the same magnitude. That is
 * K + 3 ceil(K / KC) roundings' worth, <= 2 (K + 4) whenever
 * 3 ceil(K / KC) <= K + 8: true for the blockings used here (KC >= 8 when
 * K >= 8; KC >= 2 when K < 8). The oracle's own error (double) is
 * negligible. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu.h"
#include "core/half.h"
#include "gemm/gemm.h"
#include "kernels/kernels.h"
#include "kernels/nn.h"
#include "layers/linear.h"
#include "test_util.h"

static const int64_t SIZES[] = {0, 1, 2, 7, 15, 16, 17, 31, 33, 63, 65, 129, 257};
#define NSIZES ((int)(sizeof SIZES / sizeof SIZES[0]))
static const float ALPHAS[] = {1.0f, -0.5f, 2.25f, 0.0f};
static const float BETAS[] = {0.0f, 1.0f, -1.5f, 0.5f};

typedef struct problem {
    int ta, tb;
    int64_t M, N, K, lda, ldb, ldc;
    float alpha, beta;
    float *A, *B, *C0; /* C0: C before the call (NaN when beta == 0) */
    const float *bias; /* bf16 products: N floats added after the merge, or NULL */
    size_t a_len, b_len, c_len;
} problem;

static void problem_free(problem *p) {
    free(p->A);
    free(p->B);
    free(p->C0);
    memset(p, 0, sizeof *p);
}

/* Random operands with strides padded by 0..pad elements. */
static int problem_make(problem *p, tu_rng *r, int ta, int tb, int64_t M, int64_t N,
                        int64_t K, float alpha, float beta, int pad) {
    memset(p, 0, sizeof *p);
    p->ta = ta;
    p->tb = tb;
    p->M = M;
    p->N = N;
    p->K = K;
    p->alpha = alpha;
    p->beta = beta;
    int64_t a_rows = ta ? K : M, a_cols = ta ? M : K;
    int64_t b_rows = tb ? N : K, b_cols = tb ? K : N;
    p->lda = a_cols + (pad ? (int64_t)(tu_rng_u64(r) % (uint64_t)(pad + 1)) : 0);
    p->ldb = b_cols + (pad ? (int64_t)(tu_rng_u64(r) % (uint64_t)(pad + 1)) : 0);
    p->ldc = N + (pad ? (int64_t)(tu_rng_u64(r) % (uint64_t)(pad + 1)) : 0);
    p->a_len = (size_t)(a_rows * p->lda);
    p->b_len = (size_t)(b_rows * p->ldb);
    p->c_len = (size_t)(M * p->ldc);
    p->A = malloc((p->a_len + 1) * sizeof(float));
    p->B = malloc((p->b_len + 1) * sizeof(float));
    p->C0 = malloc((p->c_len + 1) * sizeof(float));
    if (!p->A || !p->B || !p->C0) return 0;
    tu_fill_normal_f32(r, p->A, p->a_len, 1.0);
    tu_fill_normal_f32(r, p->B, p->b_len, 1.0);
    if (beta == 0.0f)
        for (size_t i = 0; i < p->c_len; i++) p->C0[i] = NAN;
    else
        tu_fill_normal_f32(r, p->C0, p->c_len, 1.0);
    return 1;
}

static double opa(const problem *p, int64_t i, int64_t k) {
    return p->ta ? p->A[k * p->lda + i] : p->A[i * p->lda + k];
}
static double opb(const problem *p, int64_t k, int64_t j) {
    return p->tb ? p->B[j * p->ldb + k] : p->B[k * p->ldb + j];
}

/* Compare C (M x N inside ldc, padding must keep C0's values) with the
 * double oracle. Returns 1 when within tolerance; reports the worst entry. */
static int check_result(const problem *p, const float *C, const char *what) {
    const double u = 0x1.0p-24;
    double worst = 0.0;
    int64_t wi = -1, wj = -1;
    int ok = 1;
    for (int64_t i = 0; i < p->M; i++) {
        for (int64_t j = 0; j < p->ldc; j++) {
            float got = C[i * p->ldc + j];
            if (j >= p->N) { /* stride padding: untouched */
                float was = p->C0[i * p->ldc + j];
                if (memcmp(&got, &was, sizeof got) != 0) {
                    CHECK(0, "%s: padding C[%lld][%lld] written", what, (long long)i, (long long)j);
                    return 0;
                }
                continue;
            }
            double sum = 0.0, mag = 0.0;
            if (p->alpha != 0.0f)
                for (int64_t k = 0; k < p->K; k++) {
                    double t = opa(p, i, k) * opb(p, k, j);
                    sum += t;
                    mag += fabs(t);
                }
            double want = p->alpha * sum, m = fabs((double)p->alpha) * mag;
            if (p->beta != 0.0f) {
                want += (double)p->beta * p->C0[i * p->ldc + j];
                m += fabs((double)p->beta * p->C0[i * p->ldc + j]);
            }
            double tol = 2.0 * (double)(p->K + 4) * u * m;
            if (p->bias) { /* one more rounding, of a sum bounded by m + |bias| */
                want += p->bias[j];
                tol += 2.0 * u * (m + fabs((double)p->bias[j]));
            }
            double err = isnan(got) ? INFINITY : fabs((double)got - want);
            if (err > tol) ok = 0;
            double rel = err / (tol > 0 ? tol : 1e-300);
            if (err > 0 && rel > worst) {
                worst = rel;
                wi = i;
                wj = j;
            }
        }
    }
    CHECK(ok, "%s: worst C[%lld][%lld] at %.3g x tolerance", what, (long long)wi, (long long)wj,
          worst);
    return ok;
}

/* Run qkv_sgemm (kernel == NULL) or qkv_gemm_run on a guarded copy of C0;
 * check canaries, that A and B are unchanged, and the values. The result is
 * left in out (c_len floats) when out != NULL. */
static void run_and_check(const problem *p, const qkv_gemm_kernel *kernel, int threads,
                          const char *what, float *out) {
    float *C = tu_guarded_alloc(p->c_len * sizeof(float));
    float *A0 = malloc((p->a_len + 1) * sizeof(float)), *B0 = malloc((p->b_len + 1) * sizeof(float));
    if (!C || !A0 || !B0) {
        CHECK(0, "test out of memory");
        tu_guarded_free(C);
        free(A0);
        free(B0);
        return;
    }
    memcpy(C, p->C0, p->c_len * sizeof(float));
    memcpy(A0, p->A, p->a_len * sizeof(float));
    memcpy(B0, p->B, p->b_len * sizeof(float));
    qkv_status st;
    if (kernel)
        st = qkv_gemm_run(kernel, p->ta, p->tb, p->M, p->N, p->K, p->alpha, p->A, p->lda, p->B,
                          p->ldb, p->beta, C, p->ldc, threads);
    else
        st = qkv_sgemm(p->ta, p->tb, p->M, p->N, p->K, p->alpha, p->A, p->lda, p->B, p->ldb,
                       p->beta, C, p->ldc, threads);
    CHECK(st == QKV_OK, "%s: status %d", what, (int)st);
    CHECK(tu_guarded_ok(C), "%s: canaries around C overwritten", what);
    CHECK(memcmp(A0, p->A, p->a_len * sizeof(float)) == 0 &&
              memcmp(B0, p->B, p->b_len * sizeof(float)) == 0,
          "%s: A or B modified", what);
    if (st == QKV_OK) check_result(p, C, what);
    if (out) memcpy(out, C, p->c_len * sizeof(float));
    tu_guarded_free(C);
    free(A0);
    free(B0);
}

/* The kernel table of an arch (NULL when this build/CPU has none). */
static const qkv_gemm_kernel *kernel_of(int arch) {
    if (!qkv_cpu_force_arch(arch)) return NULL;
    const qkv_gemm_kernel *k = qkv_gemm_kernel_active();
    qkv_cpu_force_arch(-1);
    return k;
}

static void describe(char *buf, size_t len, const char *tag, const problem *p, int threads) {
    snprintf(buf, len, "%s %c%c M=%lld N=%lld K=%lld ld=%lld,%lld,%lld alpha=%g beta=%g thr=%d",
             tag, p->ta ? 'T' : 'N', p->tb ? 'T' : 'N', (long long)p->M, (long long)p->N,
             (long long)p->K, (long long)p->lda, (long long)p->ldb, (long long)p->ldc,
             (double)p->alpha, (double)p->beta, threads);
}

/* Case c's shape: the first NSIZES cases walk the list (every size in every
 * position), the rest are random triples. */
static void pick_shape(tu_rng *r, int c, int64_t *M, int64_t *N, int64_t *K) {
    if (c < NSIZES) {
        *M = SIZES[c];
        *N = SIZES[(c + 5) % NSIZES];
        *K = SIZES[(c + 9) % NSIZES];
        return;
    }
    *M = SIZES[tu_rng_u64(r) % NSIZES];
    *N = SIZES[tu_rng_u64(r) % NSIZES];
    *K = SIZES[tu_rng_u64(r) % NSIZES];
}

/* Random shapes from SIZES through the public API, per arch. Every size
 * appears in every position (the first cases walk the list), the rest are
 * random triples, each with random transposes, strides, alpha and beta. */
static void test_random_shapes(int arch, int cases, uint64_t seed) {
    tu_rng r;
    tu_rng_seed(&r, seed);
    char what[256], tag[64];
    snprintf(tag, sizeof tag, "%s", qkv_arch_name(arch));
    for (int c = 0; c < cases; c++) {
        int64_t M, N, K;
        pick_shape(&r, c, &M, &N, &K);
        int ta = (int)(tu_rng_u64(&r) & 1), tb = (int)(tu_rng_u64(&r) & 1);
        float alpha = ALPHAS[tu_rng_u64(&r) % 4], beta = BETAS[tu_rng_u64(&r) % 4];
        int threads = 1 + (int)(tu_rng_u64(&r) % 3);
        problem p;
        if (!problem_make(&p, &r, ta, tb, M, N, K, alpha, beta, 5)) {
            CHECK(0, "test out of memory");
            problem_free(&p);
            return;
        }
        describe(what, sizeof what, tag, &p, threads);
        CHECK(qkv_cpu_force_arch(arch) == 1, "cannot force %s", tag);
        run_and_check(&p, NULL, threads, what, NULL);
        qkv_cpu_force_arch(-1);
        problem_free(&p);
    }
}

/* A copy of a kernel table with tiny cache blocks, so that the NC, KC and MC
 * loops (and the beta' = 1 merges of later K blocks) run many times, and
 * op(A) shared by several NC blocks is packed in bands of two MC blocks. */
static qkv_gemm_kernel small_blocks(const qkv_gemm_kernel *k, int kc) {
    qkv_gemm_kernel s = *k;
    s.mc = 2 * k->mr;
    s.kc = kc;
    s.nc = 2 * k->nr;
    s.mb = 2 * s.mc;
    return s;
}

/* Bitwise identical on 1, 2 and 3 threads (through qkv_gemm_run, which uses
 * exactly the count given, with real and small blockings), each also checked
 * against the oracle; and through the public API on a problem big enough to
 * use every thread. */
static void test_threads(const qkv_gemm_kernel *k, uint64_t seed) {
    static const int64_t SHAPES[][3] = {{129, 257, 65}, {257, 63, 129}, {65, 129, 257},
                                        {33, 31, 17},   {7, 257, 33},   {257, 7, 16}};
    tu_rng r;
    tu_rng_seed(&r, seed);
    char what[256];
    for (size_t s = 0; s < sizeof SHAPES / sizeof SHAPES[0]; s++) {
        for (int blocking = 0; blocking < 2; blocking++) {
            qkv_gemm_kernel small = small_blocks(k, 8 + 8 * (int)(s % 3));
            const qkv_gemm_kernel *use = blocking ? &small : k;
            problem p;
            int ta = (int)(s & 1), tb = (int)((s >> 1) & 1);
            if (!problem_make(&p, &r, ta, tb, SHAPES[s][0], SHAPES[s][1], SHAPES[s][2], -0.5f,
                              blocking ? 0.0f : 1.0f, 3)) {
                CHECK(0, "test out of memory");
                problem_free(&p);
                return;
            }
            float *out[3];
            for (int t = 0; t < 3; t++) out[t] = malloc((p.c_len + 1) * sizeof(float));
            if (out[0] && out[1] && out[2]) {
                for (int t = 0; t < 3; t++) {
                    char tag[96];
                    snprintf(tag, sizeof tag, "%s%s", k->name, blocking ? " small blocks" : "");
                    describe(what, sizeof what, tag, &p, t + 1);
                    run_and_check(&p, use, t + 1, what, out[t]);
                }
                CHECK(memcmp(out[0], out[1], p.c_len * sizeof(float)) == 0 &&
                          memcmp(out[0], out[2], p.c_len * sizeof(float)) == 0,
                      "%s: results differ between 1, 2 and 3 threads", what);
            } else {
                CHECK(0, "test out of memory");
            }
            for (int t = 0; t < 3; t++) free(out[t]);
            problem_free(&p);
        }
    }
}

static void test_threads_public(int arch) {
    tu_rng r;
    tu_rng_seed(&r, 99);
    problem p;
    if (!problem_make(&p, &r, 0, 1, 300, 200, 100, 1.0f, 0.0f, 2)) {
        CHECK(0, "test out of memory");
        problem_free(&p);
        return;
    }
    CHECK(qkv_cpu_force_arch(arch) == 1, "cannot force %s", qkv_arch_name(arch));
    float *out[3];
    char what[256];
    for (int t = 0; t < 3; t++) {
        out[t] = malloc((p.c_len + 1) * sizeof(float));
        describe(what, sizeof what, qkv_arch_name(arch), &p, t + 1);
        if (out[t]) run_and_check(&p, NULL, t + 1, what, out[t]);
    }
    CHECK(out[0] && out[1] && out[2] && memcmp(out[0], out[1], p.c_len * sizeof(float)) == 0 &&
              memcmp(out[0], out[2], p.c_len * sizeof(float)) == 0,
          "%s: public API results differ between 1, 2 and 3 threads", qkv_arch_name(arch));
    /* threads = 0: QKV_NUM_THREADS or the cores; the same bits again. */
    float *C = malloc((p.c_len + 1) * sizeof(float));
    if (C && out[0]) {
        memcpy(C, p.C0, p.c_len * sizeof(float));
        CHECK_STATUS(qkv_sgemm(p.ta, p.tb, p.M, p.N, p.K, p.alpha, p.A, p.lda, p.B, p.ldb, p.beta,
                               C, p.ldc, 0),
                     QKV_OK);
        CHECK(memcmp(C, out[0], p.c_len * sizeof(float)) == 0,
              "%s: threads = 0 differs from threads = 1", qkv_arch_name(arch));
    }
    free(C);
    qkv_cpu_force_arch(-1);
    for (int t = 0; t < 3; t++) free(out[t]);
    problem_free(&p);
}

/* Every kernel with small blocks over the random shapes (all the blocking
 * loops and edge tiles at once). */
static void test_small_blocks(const qkv_gemm_kernel *k, int cases, uint64_t seed) {
    tu_rng r;
    tu_rng_seed(&r, seed);
    char what[256], tag[96];
    snprintf(tag, sizeof tag, "%s small blocks", k->name);
    for (int c = 0; c < cases; c++) {
        int64_t M = SIZES[tu_rng_u64(&r) % NSIZES], N = SIZES[tu_rng_u64(&r) % NSIZES];
        int64_t K = SIZES[tu_rng_u64(&r) % NSIZES];
        qkv_gemm_kernel small = small_blocks(k, K >= 8 ? 8 : 2 + (int)(tu_rng_u64(&r) % 7));
        problem p;
        if (!problem_make(&p, &r, (int)(tu_rng_u64(&r) & 1), (int)(tu_rng_u64(&r) & 1), M, N, K,
                          ALPHAS[tu_rng_u64(&r) % 4], BETAS[tu_rng_u64(&r) % 4], 4)) {
            CHECK(0, "test out of memory");
            problem_free(&p);
            return;
        }
        int threads = 1 + (int)(tu_rng_u64(&r) % 3);
        describe(what, sizeof what, tag, &p, threads);
        run_and_check(&p, &small, threads, what, NULL);
        problem_free(&p);
    }
}

/* K = 0 and alpha = 0: C = beta * C without reading A or B (NaN there must
 * not leak); M = 0 or N = 0: nothing happens, NULL pointers allowed. */
static void test_degenerate(void) {
    float C[6] = {1, 2, 3, NAN, 5, 6}, A[6] = {NAN, NAN, NAN, NAN, NAN, NAN};
    CHECK_STATUS(qkv_sgemm(0, 0, 2, 3, 0, 1.0f, NULL, 0, NULL, 3, 0.0f, C, 3, 1), QKV_OK);
    int zeros = 1;
    for (int i = 0; i < 6; i++) zeros &= C[i] == 0.0f && !signbit(C[i]);
    CHECK(zeros, "K = 0, beta = 0 must give zeros");
    for (int i = 0; i < 6; i++) C[i] = (float)i;
    CHECK_STATUS(qkv_sgemm(0, 0, 2, 3, 0, 1.0f, NULL, 0, NULL, 3, 2.0f, C, 3, 1), QKV_OK);
    CHECK(C[0] == 0 && C[1] == 2 && C[5] == 10, "K = 0, beta = 2 must double C");
    CHECK_STATUS(qkv_sgemm(0, 0, 2, 3, 0, 1.0f, NULL, 0, NULL, 3, 1.0f, C, 3, 1), QKV_OK);
    CHECK(C[1] == 2 && C[5] == 10, "K = 0, beta = 1 leaves C");
    CHECK_STATUS(qkv_sgemm(0, 1, 2, 3, 1, 0.0f, A, 1, A, 1, 0.5f, C, 3, 1), QKV_OK);
    CHECK(C[1] == 1 && C[5] == 5, "alpha = 0 must give beta * C without reading A, B");
    CHECK_STATUS(qkv_sgemm(0, 0, 0, 3, 4, 1.0f, NULL, 4, A, 3, 0.0f, NULL, 3, 1), QKV_OK);
    CHECK_STATUS(qkv_sgemm(0, 0, 2, 0, 3, 1.0f, A, 3, NULL, 0, 0.0f, NULL, 0, 0), QKV_OK);
    CHECK_STATUS(qkv_sgemm(1, 1, 0, 0, 0, 1.0f, NULL, 0, NULL, 0, 0.0f, NULL, 0, 2), QKV_OK);
}

static void test_errors(void) {
    float A[64] = {0}, B[64] = {0}, C[64] = {0};
    /* negative sizes and threads */
    CHECK_STATUS(qkv_sgemm(0, 0, -1, 2, 2, 1, A, 2, B, 2, 0, C, 2, 1), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_sgemm(0, 0, 2, -1, 2, 1, A, 2, B, 2, 0, C, 2, 1), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_sgemm(0, 0, 2, 2, -1, 1, A, 2, B, 2, 0, C, 2, 1), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_sgemm(0, 0, 2, 2, 2, 1, A, 2, B, 2, 0, C, 2, -1), QKV_ERR_BAD_SIZE);
    /* NULL pointers of non-empty matrices */
    CHECK_STATUS(qkv_sgemm(0, 0, 2, 2, 2, 1, NULL, 2, B, 2, 0, C, 2, 1), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_sgemm(0, 0, 2, 2, 2, 1, A, 2, NULL, 2, 0, C, 2, 1), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_sgemm(0, 0, 2, 2, 2, 1, A, 2, B, 2, 0, NULL, 2, 1), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_sgemm(0, 0, 2, 2, 0, 1, A, 0, B, 2, 0, NULL, 2, 1), QKV_ERR_NULL_POINTER);
    /* strides: A [M, K] needs lda >= K, transposed [K, M] lda >= M; likewise B */
    CHECK_STATUS(qkv_sgemm(0, 0, 3, 2, 4, 1, A, 3, B, 2, 0, C, 2, 1), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_sgemm(0, 0, 3, 2, 4, 1, A, 4, B, 2, 0, C, 2, 1), QKV_OK);
    CHECK_STATUS(qkv_sgemm(1, 0, 3, 2, 4, 1, A, 2, B, 2, 0, C, 2, 1), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_sgemm(1, 0, 3, 2, 4, 1, A, 3, B, 2, 0, C, 2, 1), QKV_OK);
    CHECK_STATUS(qkv_sgemm(0, 0, 3, 5, 4, 1, A, 4, B, 4, 0, C, 5, 1), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_sgemm(0, 1, 3, 5, 4, 1, A, 4, B, 3, 0, C, 5, 1), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_sgemm(0, 1, 3, 5, 4, 1, A, 4, B, 4, 0, C, 5, 1), QKV_OK);
    CHECK_STATUS(qkv_sgemm(0, 0, 3, 5, 4, 1, A, 4, B, 5, 0, C, 4, 1), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_sgemm(0, 0, 3, 5, 4, 1, A, 4, B, -5, 0, C, 5, 1), QKV_ERR_BAD_SIZE);
    /* extents that do not fit in int64 / size_t (nothing is read: checked first) */
    int64_t big = (int64_t)1 << 40;
    CHECK_STATUS(qkv_sgemm(0, 0, big, 2, big, 1, A, big, B, 2, 0, C, 2, 1), QKV_ERR_SIZE_OVERFLOW);
    CHECK_STATUS(qkv_sgemm(0, 0, 2, big, 2, 1, A, 2, B, big, 0, C, INT64_MAX, 1),
                 QKV_ERR_SIZE_OVERFLOW);
    CHECK_STATUS(qkv_sgemm(0, 1, 2, big, big, 1, A, big, B, big, 0, C, big, 1),
                 QKV_ERR_SIZE_OVERFLOW);
}

/* A counting allocator that fails from the n-th call on (n < 0: never). */
static long g_allocs, g_frees, g_fail_at = -1;
static void *count_alloc(size_t n, void *user) {
    (void)user;
    if (g_fail_at >= 0 && g_allocs >= g_fail_at) return NULL;
    g_allocs++;
    return malloc(n);
}
static void count_free(void *p, void *user) {
    (void)user;
    if (p) g_frees++;
    free(p);
}

static void test_allocator(void) {
    if (qkv_gemm_uses_cblas()) {
        printf("allocator test skipped: qkv_sgemm forwards to the system CBLAS in this build\n");
        return;
    }
    tu_rng r;
    tu_rng_seed(&r, 7);
    problem p;
    if (!problem_make(&p, &r, 0, 1, 65, 33, 17, 1.0f, 0.5f, 0)) {
        CHECK(0, "test out of memory");
        problem_free(&p);
        return;
    }
    float *C = malloc(p.c_len * sizeof(float));
    if (!C) {
        problem_free(&p);
        CHECK(0, "test out of memory");
        return;
    }
    for (int threads = 1; threads <= 2; threads++) {
        memcpy(C, p.C0, p.c_len * sizeof(float));
        g_allocs = g_frees = 0;
        g_fail_at = 0;
        CHECK_STATUS(qkv_set_allocator(count_alloc, count_free, NULL), QKV_OK);
        CHECK_STATUS(qkv_sgemm(p.ta, p.tb, p.M, p.N, p.K, p.alpha, p.A, p.lda, p.B, p.ldb, p.beta,
                               C, p.ldc, threads),
                     QKV_ERR_OUT_OF_MEMORY);
        CHECK(g_allocs == g_frees, "leak after a failed allocation: %ld allocs, %ld frees",
              g_allocs, g_frees);
        CHECK(memcmp(C, p.C0, p.c_len * sizeof(float)) == 0, "C written although out of memory");
        g_fail_at = -1;
        CHECK_STATUS(qkv_sgemm(p.ta, p.tb, p.M, p.N, p.K, p.alpha, p.A, p.lda, p.B, p.ldb, p.beta,
                               C, p.ldc, threads),
                     QKV_OK);
        CHECK(g_allocs >= 1 && g_allocs == g_frees,
              "allocations through the hooks, all freed: %ld allocs, %ld frees", g_allocs, g_frees);
        CHECK_STATUS(qkv_set_allocator(NULL, NULL, NULL), QKV_OK);
        check_result(&p, C, "after the allocator test");
    }
    free(C);
    problem_free(&p);
}

/* ---- bf16 products ---------------------------------------------------------
 * qkv_gemm_bf16 and the pre-packed path against the double oracle of the
 * bf16-rounded operands (op(A), op(B) rounded to nearest even; the bias and
 * C0 stay float) with the tolerance above: the products of two bf16 are
 * exact in float and summed one rounding per step, as the float kernels do,
 * so the same bound holds (a product that forgot to round its inputs is off
 * by about 2^-9 relative, far outside it). One-shot on 1, 2, 3 threads and
 * pre-packed on 1 and 3 threads give the same bits; so do the public entry
 * points with the default thread count. */

static void round_bf16(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = qkv_bf16_to_f32(qkv_f32_to_bf16(x[i]));
}

/* p's operands rounded (the oracle's problem); shares C0 and bias with p. */
static int problem_rounded(const problem *p, problem *q) {
    *q = *p;
    q->A = malloc((p->a_len + 1) * sizeof(float));
    q->B = malloc((p->b_len + 1) * sizeof(float));
    if (!q->A || !q->B) return 0;
    memcpy(q->A, p->A, p->a_len * sizeof(float));
    memcpy(q->B, p->B, p->b_len * sizeof(float));
    round_bf16(q->A, p->a_len);
    round_bf16(q->B, p->b_len);
    return 1;
}

/* mode 0: one-shot qkv_gemm_bf16_run (k, exactly `threads`); 1: packed with
 * k then qkv_gemm_bf16_packed_run; 2: the public qkv_gemm_bf16; 3: the public
 * qkv_gemm_bf16_pack_b + qkv_gemm_bf16_packed (active table, `threads` as
 * given). Checks canaries, operands unchanged and the values (against q). */
static void run_bf16(const problem *p, const problem *q, const qkv_gemm_bf16_kernel *k, int mode, int threads,
                     const char *what, float *out) {
    float *C = tu_guarded_alloc(p->c_len * sizeof(float));
    float *A0 = malloc((p->a_len + 1) * sizeof(float)), *B0 = malloc((p->b_len + 1) * sizeof(float));
    qkv_status st = QKV_OK;
    if (!C || !A0 || !B0) {
        CHECK(0, "test out of memory");
        goto done;
    }
    memcpy(C, p->C0, p->c_len * sizeof(float));
    memcpy(A0, p->A, p->a_len * sizeof(float));
    memcpy(B0, p->B, p->b_len * sizeof(float));
    if (mode == 0) {
        st = qkv_gemm_bf16_run(k, p->ta, p->tb, p->M, p->N, p->K, p->alpha, p->A, p->lda, p->B, p->ldb, p->beta, C,
                               p->ldc, p->bias, threads);
    } else if (mode == 2) {
        st = qkv_gemm_bf16(p->ta, p->tb, p->M, p->N, p->K, p->alpha, p->A, p->lda, p->B, p->ldb, p->beta, C, p->ldc,
                           p->bias, threads);
    } else {
        qkv_gemm_bf16_b bp;
        st = mode == 1 ? qkv_gemm_bf16_pack_b_with(k, p->tb, p->K, p->N, p->B, p->ldb, threads, &bp)
                       : qkv_gemm_bf16_pack_b(p->tb, p->K, p->N, p->B, p->ldb, threads, &bp);
        /* every KC block but the last: KC / 2 pairs a column; the last
         * ceil(kc / 2) rounded up to the kernel's kstep */
        size_t words = 0;
        if (st == QKV_OK && p->K > 0) {
            const int64_t KC = bp.k->kc, nblk = (p->K + KC - 1) / KC, last = (p->K - (nblk - 1) * KC + 1) / 2;
            const int64_t step = bp.k->kstep > 1 ? bp.k->kstep : 1;
            words = (size_t)((nblk - 1) * (KC / 2) + (last + step - 1) / step * step);
        }
        CHECK(st != QKV_OK || bp.bytes == (size_t)((p->N + bp.k->nr - 1) / bp.k->nr * bp.k->nr) * words * 4 ||
                  p->K == 0 || p->N == 0,
              "%s: packed size %zu", what, bp.bytes);
        if (st == QKV_OK)
            st = mode == 1 ? qkv_gemm_bf16_packed_run(p->ta, p->M, p->alpha, p->A, p->lda, &bp, p->beta, C, p->ldc,
                                                      p->bias, threads)
                           : qkv_gemm_bf16_packed(p->ta, p->M, p->alpha, p->A, p->lda, &bp, p->beta, C, p->ldc,
                                                  p->bias, threads);
        qkv_gemm_bf16_b_free(&bp);
    }
    CHECK(st == QKV_OK, "%s: status %d", what, (int)st);
    CHECK(tu_guarded_ok(C), "%s: canaries around C overwritten", what);
    CHECK(memcmp(A0, p->A, p->a_len * sizeof(float)) == 0 && memcmp(B0, p->B, p->b_len * sizeof(float)) == 0,
          "%s: A or B modified", what);
    if (st == QKV_OK) check_result(q, C, what);
    if (out) memcpy(out, C, p->c_len * sizeof(float));
done:
    tu_guarded_free(C);
    free(A0);
    free(B0);
}

/* The bf16 table of an arch's kernel set (the CPU has the arch: checked by
 * kernel_of first). */
static const qkv_gemm_bf16_kernel *bf16_kernel_of(int arch) { return &qkv_kernel_set_of(arch)->gemm_bf16; }

/* kalt: a table other than the arch's (the AVX512-BF16 one where AMX
 * replaces it), tested the same way but not through the public entry
 * points, which take the arch's. */
static void test_bf16(int arch, const qkv_gemm_bf16_kernel *kalt, int cases, uint64_t seed) {
    const qkv_gemm_bf16_kernel *k = kalt ? kalt : bf16_kernel_of(arch);
    tu_rng r;
    tu_rng_seed(&r, seed);
    char what[256], tag[96];
    float bias[257];
    tu_fill_normal_f32(&r, bias, 257, 1.0);
    for (int c = 0; c < cases; c++) {
        int64_t M, N, K;
        pick_shape(&r, c, &M, &N, &K);
        /* every other case with small blocks: the NC, KC, MC loops and the
         * beta' = 1 merges many times, odd K inside and at the end */
        qkv_gemm_bf16_kernel small = *k;
        const int use_small = c % 2 == 1;
        if (use_small) {
            small.mc = 2 * k->mr;
            /* a tile kernel's KC / 2 stays a multiple of its step */
            small.kc = k->kstep > 1 ? 2 * k->kstep * (1 + (int)(tu_rng_u64(&r) % 2))
                                    : 2 + 2 * (int)(tu_rng_u64(&r) % 4);
            small.nc = 2 * k->nr;
        }
        const qkv_gemm_bf16_kernel *use = use_small ? &small : k;
        problem p, q;
        int ok = problem_make(&p, &r, (int)(tu_rng_u64(&r) & 1), (int)(tu_rng_u64(&r) & 1), M, N, K,
                              ALPHAS[tu_rng_u64(&r) % 4], BETAS[tu_rng_u64(&r) % 4], 4);
        p.bias = tu_rng_u64(&r) & 1 ? bias : NULL;
        ok = ok && problem_rounded(&p, &q);
        float *out[5] = {0};
        for (int t = 0; t < 5 && ok; t++) ok = (out[t] = malloc((p.c_len + 1) * sizeof(float))) != NULL;
        if (!ok) {
            CHECK(0, "test out of memory");
        } else {
            for (int t = 0; t < 5; t++) {
                const int mode = t < 3 ? 0 : 1, threads = t < 3 ? t + 1 : t == 3 ? 1 : 3;
                snprintf(tag, sizeof tag, "bf16 %s%s%s%s", k->name, use_small ? " small blocks" : "",
                         mode ? " pre-packed" : " one-shot", p.bias ? " bias" : "");
                describe(what, sizeof what, tag, &p, threads);
                run_bf16(&p, &q, use, mode, threads, what, out[t]);
            }
            int same = 1;
            for (int t = 1; t < 5; t++) same &= memcmp(out[0], out[t], p.c_len * sizeof(float)) == 0;
            CHECK(same, "%s: one-shot on 1, 2, 3 threads and pre-packed on 1, 3 threads differ", what);
        }
        for (int t = 0; t < 5; t++) free(out[t]);
        free(q.A);
        free(q.B);
        problem_free(&p);
    }
    if (kalt) return;
    /* the public entry points on this arch: the active table, the default and
     * explicit thread counts, the same bits as the table run on one thread */
    problem p, q;
    if (!problem_make(&p, &r, 0, 1, 300, 200, 129, 1.0f, 0.5f, 2) || !problem_rounded(&p, &q)) {
        CHECK(0, "test out of memory");
        problem_free(&p);
        return;
    }
    p.bias = q.bias = bias;
    float *out[5] = {0};
    int ok = 1;
    for (int t = 0; t < 5 && ok; t++) ok = (out[t] = malloc((p.c_len + 1) * sizeof(float))) != NULL;
    CHECK(qkv_cpu_force_arch(arch) == 1, "cannot force %s", qkv_arch_name(arch));
    if (ok) {
        snprintf(tag, sizeof tag, "bf16 public %s", qkv_arch_name(arch));
        describe(what, sizeof what, tag, &p, 1);
        run_bf16(&p, &q, k, 0, 1, what, out[0]);
        run_bf16(&p, &q, NULL, 2, 0, what, out[1]);
        run_bf16(&p, &q, NULL, 2, 2, what, out[2]);
        run_bf16(&p, &q, NULL, 3, 0, what, out[3]);
        run_bf16(&p, &q, NULL, 3, 3, what, out[4]);
        int same = 1;
        for (int t = 1; t < 5; t++) same &= memcmp(out[0], out[t], p.c_len * sizeof(float)) == 0;
        CHECK(same, "%s: the public entry points differ from the table run", what);
    } else {
        CHECK(0, "test out of memory");
    }
    qkv_cpu_force_arch(-1);
    for (int t = 0; t < 5; t++) free(out[t]);
    free(q.A);
    free(q.B);
    problem_free(&p);
}

static void test_bf16_errors(void) {
    float A[64] = {0}, B[64] = {0}, C[64] = {0}, bias[8] = {0};
    qkv_gemm_bf16_b bp;
    CHECK_STATUS(qkv_gemm_bf16(0, 0, -1, 2, 2, 1, A, 2, B, 2, 0, C, 2, NULL, 1), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_gemm_bf16(0, 0, 2, -1, 2, 1, A, 2, B, 2, 0, C, 2, NULL, 1), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_gemm_bf16(0, 0, 2, 2, -1, 1, A, 2, B, 2, 0, C, 2, NULL, 1), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_gemm_bf16(0, 0, 2, 2, 2, 1, A, 2, B, 2, 0, C, 2, NULL, -1), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_gemm_bf16(0, 0, 2, 2, 2, 1, NULL, 2, B, 2, 0, C, 2, NULL, 1), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_gemm_bf16(0, 0, 2, 2, 2, 1, A, 2, NULL, 2, 0, C, 2, NULL, 1), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_gemm_bf16(0, 0, 2, 2, 2, 1, A, 2, B, 2, 0, NULL, 2, bias, 1), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_gemm_bf16(0, 0, 3, 2, 4, 1, A, 3, B, 2, 0, C, 2, NULL, 1), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_gemm_bf16(1, 0, 3, 2, 4, 1, A, 2, B, 2, 0, C, 2, NULL, 1), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_gemm_bf16(0, 1, 3, 5, 4, 1, A, 4, B, 3, 0, C, 5, NULL, 1), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_gemm_bf16(0, 0, 3, 5, 4, 1, A, 4, B, 5, 0, C, 4, NULL, 1), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_gemm_bf16(0, 0, 3, 5, 4, 1, A, 4, B, 5, 0, C, 5, bias, 1), QKV_OK);
    int64_t big = (int64_t)1 << 40;
    CHECK_STATUS(qkv_gemm_bf16(0, 0, big, 2, big, 1, A, big, B, 2, 0, C, 2, NULL, 1), QKV_ERR_SIZE_OVERFLOW);
    CHECK_STATUS(qkv_gemm_bf16(0, 1, 2, big, big, 1, A, big, B, big, 0, C, big, NULL, 1), QKV_ERR_SIZE_OVERFLOW);
    /* packing */
    CHECK_STATUS(qkv_gemm_bf16_pack_b(0, 2, 2, B, 2, 1, NULL), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_gemm_bf16_pack_b(0, -1, 2, B, 2, 1, &bp), QKV_ERR_BAD_SIZE);
    CHECK(bp.panels == NULL && bp.raw == NULL, "a failed packing leaves a zeroed struct");
    qkv_gemm_bf16_b_free(&bp); /* harmless */
    qkv_gemm_bf16_b_free(NULL);
    CHECK_STATUS(qkv_gemm_bf16_pack_b(0, 2, -1, B, 2, 1, &bp), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_gemm_bf16_pack_b(0, 2, 2, NULL, 2, 1, &bp), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_gemm_bf16_pack_b(0, 2, 3, B, 2, 1, &bp), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_gemm_bf16_pack_b(1, 3, 2, B, 2, 1, &bp), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_gemm_bf16_pack_b(0, 2, 2, B, 2, -1, &bp), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_gemm_bf16_pack_b(0, big, big, B, big, 1, &bp), QKV_ERR_SIZE_OVERFLOW);
    CHECK_STATUS(qkv_gemm_bf16_pack_b(0, 0, 5, NULL, 5, 1, &bp), QKV_OK);
    CHECK(bp.panels == NULL && bp.K == 0 && bp.N == 5, "an empty packing");
    qkv_gemm_bf16_b_free(&bp);
    /* the pre-packed product: op(B) [4, 5] */
    CHECK_STATUS(qkv_gemm_bf16_pack_b(0, 4, 5, B, 5, 1, &bp), QKV_OK);
    CHECK_STATUS(qkv_gemm_bf16_packed(0, 3, 1, A, 4, NULL, 0, C, 5, NULL, 1), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_gemm_bf16_packed(0, -1, 1, A, 4, &bp, 0, C, 5, NULL, 1), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_gemm_bf16_packed(0, 3, 1, A, 3, &bp, 0, C, 5, NULL, 1), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_gemm_bf16_packed(1, 3, 1, A, 2, &bp, 0, C, 5, NULL, 1), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_gemm_bf16_packed(0, 3, 1, A, 4, &bp, 0, C, 4, NULL, 1), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_gemm_bf16_packed(0, 3, 1, NULL, 4, &bp, 0, C, 5, NULL, 1), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_gemm_bf16_packed(0, 3, 1, A, 4, &bp, 0, NULL, 5, NULL, 1), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_gemm_bf16_packed(0, 3, 1, A, 4, &bp, 0, C, 5, NULL, -2), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_gemm_bf16_packed(0, 3, 1, A, 4, &bp, 0, C, 5, bias, 1), QKV_OK);
    qkv_gemm_bf16_b broken = bp;
    broken.panels = NULL;
    CHECK_STATUS(qkv_gemm_bf16_packed(0, 3, 1, A, 4, &broken, 0, C, 5, NULL, 1), QKV_ERR_NULL_POINTER);
    broken = bp;
    broken.k = NULL;
    CHECK_STATUS(qkv_gemm_bf16_packed(0, 3, 1, A, 4, &broken, 0, C, 5, NULL, 1), QKV_ERR_BAD_PARAMETER);
    qkv_gemm_bf16_b_free(&bp);
    CHECK(bp.panels == NULL && bp.raw == NULL, "freed and zeroed");
    /* K = 0 and alpha = 0: C = beta C + bias, A and B not read */
    float Cz[6] = {1, 2, 3, NAN, 5, 6}, An[6] = {NAN, NAN, NAN, NAN, NAN, NAN}, b3[3] = {1, 2, 3};
    CHECK_STATUS(qkv_gemm_bf16(0, 0, 2, 3, 0, 1.0f, NULL, 0, NULL, 3, 0.0f, Cz, 3, b3, 1), QKV_OK);
    CHECK(Cz[0] == 1 && Cz[3] == 1 && Cz[5] == 3, "K = 0, beta = 0: the bias alone");
    CHECK_STATUS(qkv_gemm_bf16(0, 1, 2, 3, 1, 0.0f, An, 1, An, 1, 2.0f, Cz, 3, NULL, 1), QKV_OK);
    CHECK(Cz[0] == 2 && Cz[5] == 6, "alpha = 0: beta C without reading A, B");
    CHECK_STATUS(qkv_gemm_bf16(0, 0, 0, 3, 4, 1.0f, NULL, 4, B, 3, 0.0f, NULL, 3, NULL, 1), QKV_OK);
}

/* A failing allocator: the status, C untouched, nothing leaked. */
static void test_bf16_allocator(void) {
    tu_rng r;
    tu_rng_seed(&r, 8);
    problem p;
    float *C = NULL;
    if (!problem_make(&p, &r, 0, 1, 65, 33, 17, 1.0f, 0.5f, 0) || !(C = malloc(p.c_len * sizeof(float)))) {
        CHECK(0, "test out of memory");
        problem_free(&p);
        return;
    }
    for (int fail_at = 0; fail_at <= 1; fail_at++) {
        memcpy(C, p.C0, p.c_len * sizeof(float));
        g_allocs = g_frees = 0;
        g_fail_at = fail_at; /* 0: the packing of B, 1: the buffers of A */
        CHECK_STATUS(qkv_set_allocator(count_alloc, count_free, NULL), QKV_OK);
        CHECK_STATUS(qkv_gemm_bf16(p.ta, p.tb, p.M, p.N, p.K, p.alpha, p.A, p.lda, p.B, p.ldb, p.beta, C, p.ldc, NULL,
                                   2),
                     QKV_ERR_OUT_OF_MEMORY);
        CHECK(g_allocs == g_frees, "bf16: leak after a failed allocation: %ld allocs, %ld frees", g_allocs, g_frees);
        CHECK(memcmp(C, p.C0, p.c_len * sizeof(float)) == 0, "bf16: C written although out of memory");
        g_fail_at = -1;
        CHECK_STATUS(qkv_set_allocator(NULL, NULL, NULL), QKV_OK);
    }
    free(C);
    problem_free(&p);
}

/* qkv_gemm_few_rows with a kernel table: y = x W^T + b for M up to
 * QKV_GEMM_FEW_ROWS (the few_rows kernel, K in blocks past QKV_GEMM_FEW_KC)
 * and beyond (the packed path),
 * against a double product within the float sum bound (2 (K + 2) u sum
 * |terms|), the same bits on 1, 2 and 3 threads, bad arguments. */
static void test_few_rows(const qkv_gemm_kernel *k, uint64_t seed) {
    static const int64_t MS[] = {1, 2, 5, 6, 7, 10, 16, 17}, NS[] = {1, 3, 4, 5, 63, 65, 130}, KS[] = {1, 7, 16, 17, 384, 385, 1000};
    tu_rng r;
    tu_rng_seed(&r, seed);
    for (size_t a = 0; a < 8; a++)
        for (size_t b = 0; b < 7; b++)
            for (size_t c = 0; c < 7; c++) {
                int64_t M = MS[a], N = NS[b], K = KS[c], ldx = K + 1, ldw = K + 3, ldy = N + 2;
                float *x = malloc((size_t)(M * ldx) * sizeof *x), *w = malloc((size_t)(N * ldw) * sizeof *w);
                float *bias = malloc((size_t)N * sizeof *bias), *y = malloc((size_t)(M * ldy) * sizeof *y);
                float *y2 = malloc((size_t)(M * ldy) * sizeof *y2);
                tu_fill_normal_f32(&r, x, (size_t)(M * ldx), 1.0);
                tu_fill_normal_f32(&r, w, (size_t)(N * ldw), 1.0);
                tu_fill_normal_f32(&r, bias, (size_t)N, 1.0);
                const float *bb = (a + b) % 2 ? bias : NULL;
                CHECK_STATUS(qkv_gemm_few_rows_with(k, M, N, K, x, ldx, w, ldw, bb, y, ldy, 1), QKV_OK);
                int ok = 1;
                for (int64_t i = 0; i < M && ok; i++)
                    for (int64_t j = 0; j < N && ok; j++) {
                        double s = bb ? bb[j] : 0, mag = bb ? fabs(bb[j]) : 0;
                        for (int64_t p = 0; p < K; p++) {
                            s += (double)x[i * ldx + p] * w[j * ldw + p];
                            mag += fabs((double)x[i * ldx + p] * w[j * ldw + p]);
                        }
                        ok = fabs(y[i * ldy + j] - s) <= 2.0 * (double)(K + 2) * 0x1p-24 * mag;
                    }
                CHECK(ok, "%s few_rows M %lld N %lld K %lld: within the float bound", k->name, (long long)M, (long long)N,
                      (long long)K);
                for (int t = 2; t <= 3; t++) {
                    CHECK_STATUS(qkv_gemm_few_rows_with(k, M, N, K, x, ldx, w, ldw, bb, y2, ldy, t), QKV_OK);
                    int same = 1;
                    for (int64_t i = 0; i < M; i++) same &= memcmp(y + i * ldy, y2 + i * ldy, (size_t)N * sizeof *y) == 0;
                    CHECK(same, "%s few_rows M %lld N %lld K %lld: %d threads, the same bits", k->name, (long long)M,
                          (long long)N, (long long)K, t);
                }
                free(x);
                free(w);
                free(bias);
                free(y);
                free(y2);
            }
    float v[4] = {1, 2, 3, 4}, out[4];
    CHECK_STATUS(qkv_gemm_few_rows_with(k, -1, 1, 1, v, 1, v, 1, NULL, out, 1, 1), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_gemm_few_rows_with(k, 1, 1, 2, v, 1, v, 2, NULL, out, 1, 1), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_gemm_few_rows_with(k, 1, 1, 1, NULL, 1, v, 1, NULL, out, 1, 1), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_gemm_few_rows_with(k, 0, 1, 1, NULL, 1, NULL, 1, NULL, NULL, 1, 1), QKV_OK);
}

/* Epilogues (gemm/gemm.h): every element of C passes through exactly one
 * block, after its sum (and, for bf16, its bias) is complete, with c at
 * C[i0][j0]: an epilogue c = 2c + 1 gives 2 (the plain product) + 1 bitwise,
 * for awkward shapes, K = 0, small blockings and 1-3 threads; the rows
 * step after it (c = 3c) sees every row exactly once, whole (every element
 * already through fn), with c at C[i0][0]; and nn_linear_act /
 * nn_linear_bf16_act are bitwise the product followed by bias_act over the
 * rows, their _then forms that followed by the rows step. */
typedef struct {
    float *C;
    int64_t ldc, N;
    unsigned char *seen;
    int bad;
    unsigned char *rows_seen; /* per row: calls of probe_rows */
} epi_probe;

static void probe_epi(void *ctx, float *c, int64_t ldc, int64_t i0, int64_t j0, int64_t m, int64_t n) {
    epi_probe *p = ctx;
    if (c != p->C + i0 * p->ldc + j0 || ldc != p->ldc) p->bad = 1;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            p->seen[(i0 + i) * p->N + j0 + j]++;
            c[i * ldc + j] = 2.0f * c[i * ldc + j] + 1.0f;
        }
}

static void probe_rows(void *ctx, float *c, int64_t ldc, int64_t i0, int64_t m) {
    epi_probe *p = ctx;
    if (c != p->C + i0 * p->ldc || ldc != p->ldc || m < 1) p->bad = 1;
    for (int64_t i = 0; i < m; i++) {
        p->rows_seen[i0 + i]++;
        for (int64_t j = 0; j < p->N; j++) {
            if (p->seen[(i0 + i) * p->N + j] != 1) p->bad = 1; /* not yet through fn */
            c[i * ldc + j] = 3.0f * c[i * ldc + j];
        }
    }
}

/* A step on whole rows for the _then linear layers: y = y / 2 + row. */
typedef struct {
    float *y;
    int64_t out;
    unsigned char *rows_seen;
    int bad;
} row_step_probe;

static void row_step(void *ctx, float *y, int64_t ldy, int64_t i0, int64_t m) {
    row_step_probe *p = ctx;
    if (y != p->y + i0 * p->out || ldy != p->out) p->bad = 1;
    for (int64_t i = 0; i < m; i++) {
        p->rows_seen[i0 + i]++;
        for (int64_t j = 0; j < p->out; j++) y[i * ldy + j] = y[i * ldy + j] * 0.5f + (float)(i0 + i);
    }
}

static void test_epilogue(int arch, uint64_t seed) {
    static const int64_t MS[] = {1, 13, 15, 129}, NS[] = {1, 31, 33, 100}, KS[] = {0, 1, 70, 600};
    const qkv_gemm_kernel *k0 = kernel_of(arch);
    qkv_gemm_kernel small = *k0;
    small.mc = small.mr * 2;
    small.kc = 32;
    small.nc = small.nr * 2;
    small.mb = small.mc * 2; /* M = 129: three bands of op(A) */
    tu_rng r;
    tu_rng_seed(&r, seed);
    for (size_t a = 0; a < 4; a++)
        for (size_t b = 0; b < 4; b++)
            for (size_t c = 0; c < 4; c++)
                for (int variant = 0; variant < 6; variant++) {
                    const int64_t M = MS[a], N = NS[b], K = KS[c], ldc = N + 3;
                    const int threads = 1 + variant % 3, bf = variant >= 3;
                    const qkv_gemm_kernel *k = (variant % 2) ? &small : k0;
                    float *A = malloc((size_t)(M * K + 1) * sizeof *A), *B = malloc((size_t)(N * K + 1) * sizeof *B);
                    float *bias = malloc((size_t)N * sizeof *bias), *C1 = malloc((size_t)(M * ldc) * sizeof *C1);
                    float *C2 = malloc((size_t)(M * ldc) * sizeof *C2);
                    unsigned char *seen = calloc((size_t)(M * N), 1), *rows_seen = calloc((size_t)M, 1);
                    tu_fill_normal_f32(&r, A, (size_t)(M * K + 1), 1.0);
                    tu_fill_normal_f32(&r, B, (size_t)(N * K + 1), 1.0);
                    tu_fill_normal_f32(&r, bias, (size_t)N, 1.0);
                    tu_fill_normal_f32(&r, C1, (size_t)(M * ldc), 1.0);
                    memcpy(C2, C1, (size_t)(M * ldc) * sizeof *C1);
                    epi_probe pr = {C2, ldc, N, seen, 0, rows_seen};
                    const qkv_gemm_epi e = {probe_epi, &pr, probe_rows};
                    qkv_status s1, s2;
                    if (!bf) {
                        s1 = qkv_gemm_run(k, 0, 1, M, N, K, 1.0f, A, K ? K : 1, B, K ? K : 1, 0.5f, C1, ldc, threads);
                        s2 = qkv_gemm_run_epi(k, 0, 1, M, N, K, 1.0f, A, K ? K : 1, B, K ? K : 1, 0.5f, C2, ldc, threads,
                                              &e);
                    } else {
                        qkv_gemm_bf16_b bp;
                        s1 = qkv_gemm_bf16_pack_b_with(bf16_kernel_of(arch), 1, K, N, B, K ? K : 1, 1, &bp);
                        if (s1 == QKV_OK)
                            s1 = qkv_gemm_bf16_packed_run(0, M, 1.0f, A, K ? K : 1, &bp, 0.5f, C1, ldc, bias, threads);
                        s2 = s1 == QKV_OK ? qkv_gemm_bf16_packed_epi(0, M, 1.0f, A, K ? K : 1, &bp, 0.5f, C2, ldc, bias,
                                                                     threads, &e)
                                          : s1;
                        qkv_gemm_bf16_b_free(&bp);
                    }
                    int bad = s1 != QKV_OK || s2 != QKV_OK || pr.bad;
                    for (int64_t i = 0; i < M; i++)
                        for (int64_t j = 0; j < ldc; j++) {
                            const float want = j < N ? 3.0f * (2.0f * C1[i * ldc + j] + 1.0f) : C1[i * ldc + j];
                            if (memcmp(&want, &C2[i * ldc + j], sizeof want) != 0) bad = 1;
                            if (j < N && seen[i * N + j] != 1) bad = 1;
                            if (j == 0 && rows_seen[i] != 1) bad = 1;
                        }
                    CHECK(!bad, "epilogue %s M=%lld N=%lld K=%lld threads=%d %s%s", qkv_arch_name(arch), (long long)M,
                          (long long)N, (long long)K, threads, bf ? "bf16" : "fp32", (variant % 2) ? " small blocks" : "");
                    free(A); free(B); free(bias); free(C1); free(C2); free(seen); free(rows_seen);
                }
    /* the fused linear layers against the product and one bias_act pass (the active tables);
     * their _then forms against that followed by the step on whole rows, on 1-3 threads */
    const qkv_nn_kernels *nk = qkv_nn_kernels_active();
    static const int64_t RS[] = {1, 17, 200}, OS[] = {5, 64, 130};
    for (size_t a = 0; a < 3; a++)
        for (size_t b = 0; b < 3; b++)
            for (int act = 0; act <= QKV_NN_ACT_RELU; act++) {
                const int64_t rows = RS[a], out = OS[b], in = 37;
                float *x = malloc((size_t)(rows * in) * sizeof *x), *w = malloc((size_t)(out * in) * sizeof *w);
                float *bias = malloc((size_t)out * sizeof *bias), *y1 = malloc((size_t)(rows * out) * sizeof *y1);
                float *y2 = malloc((size_t)(rows * out) * sizeof *y2), *y3 = malloc((size_t)(rows * out) * sizeof *y3);
                unsigned char *rows_seen = calloc((size_t)rows, 1);
                const int threads = 1 + (int)(a + b + (size_t)act) % 3;
                tu_fill_normal_f32(&r, x, (size_t)(rows * in), 1.0);
                tu_fill_normal_f32(&r, w, (size_t)(out * in), 1.0);
                tu_fill_normal_f32(&r, bias, (size_t)out, 1.0);
                int bad = 0, bad_then = 0;
                for (int bfp = 0; bfp < 2; bfp++) {
                    qkv_gemm_bf16_b bp;
                    memset(&bp, 0, sizeof bp);
                    memset(rows_seen, 0, (size_t)rows);
                    row_step_probe pr = {y3, out, rows_seen, 0};
                    const nn_rows_step then = {row_step, &pr};
                    if (bfp) {
                        bad |= qkv_gemm_bf16_pack_b(1, in, out, w, in, 2, &bp) != QKV_OK;
                        bad |= qkv_gemm_bf16_packed(0, rows, 1.0f, x, in, &bp, 0.0f, y1, out, bias, 2) != QKV_OK;
                        nk->bias_act(y1, (size_t)out, (size_t)rows, NULL, (size_t)out, act);
                        bad |= nn_linear_bf16_act(x, rows, &bp, bias, y2, act, 2) != QKV_OK;
                        bad_then |= nn_linear_bf16_act_then(x, rows, &bp, bias, y3, act, &then, threads) != QKV_OK;
                    } else {
                        bad |= nn_linear(x, rows, in, w, NULL, out, y1, 2) != QKV_OK;
                        nk->bias_act(y1, (size_t)out, (size_t)rows, bias, (size_t)out, act);
                        bad |= nn_linear_act(x, rows, in, w, bias, out, y2, act, 2) != QKV_OK;
                        bad_then |= nn_linear_act_then(x, rows, in, w, bias, out, y3, act, &then, threads) != QKV_OK;
                    }
                    bad |= memcmp(y1, y2, (size_t)(rows * out) * sizeof *y1) != 0;
                    for (int64_t i = 0; i < rows; i++) {
                        bad_then |= rows_seen[i] != 1;
                        for (int64_t j = 0; j < out; j++) {
                            const float want = y1[i * out + j] * 0.5f + (float)i;
                            bad_then |= memcmp(&want, &y3[i * out + j], sizeof want) != 0;
                        }
                    }
                    bad_then |= pr.bad;
                    qkv_gemm_bf16_b_free(&bp);
                }
                CHECK(!bad, "nn_linear_act rows=%lld out=%lld act=%d", (long long)rows, (long long)out, act);
                CHECK(!bad_then, "nn_linear_act_then rows=%lld out=%lld act=%d threads=%d", (long long)rows,
                      (long long)out, act, threads);
                free(x); free(w); free(bias); free(y1); free(y2); free(y3); free(rows_seen);
            }
    CHECK_STATUS(nn_linear_act(NULL, 2, 3, NULL, NULL, 4, NULL, 0, 1), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(nn_linear_act_then(NULL, -1, 3, NULL, NULL, 4, NULL, 0, NULL, 1), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(nn_linear_bf16_act_then(NULL, 2, NULL, NULL, NULL, 0, NULL, 1), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(nn_linear_act(NULL, -1, 3, NULL, NULL, 4, NULL, 0, 1), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(nn_linear_bf16_act(NULL, 2, NULL, NULL, NULL, 0, 1), QKV_ERR_NULL_POINTER);
}

/* Products sharing A (qkv_gemm_run_segs) bitwise as one qkv_gemm_run_epi
 * per segment: two or three segments whose widths are multiples of NR (one
 * joined product) or not (one after the other), each with its own strides
 * and epilogue, awkward M and K, K = 0, alpha = 0, real and small blockings,
 * 1-3 threads; and nn_linear_multi bitwise as nn_linear on each. */
static void test_segments(int arch, uint64_t seed) {
    const qkv_gemm_kernel *k0 = kernel_of(arch);
    qkv_gemm_kernel small = *k0;
    small.mc = small.mr * 2;
    small.kc = 32;
    small.nc = small.nr * 2;
    const int64_t nr = k0->nr;
    const int64_t WIDTHS[][3] = {{nr, nr, nr}, {2 * nr, nr, 5}, {nr, 3 * nr, 0}, {7, nr, nr}, {nr + 1, 3, 0},
                                 {0, nr, 2 * nr + 3}};
    static const int64_t MS[] = {1, 15, 129}, KS[] = {0, 1, 70, 600};
    tu_rng r;
    tu_rng_seed(&r, seed);
    for (size_t wi = 0; wi < sizeof WIDTHS / sizeof WIDTHS[0]; wi++)
        for (size_t a = 0; a < 3; a++)
            for (size_t c = 0; c < 4; c++)
                for (int variant = 0; variant < 6; variant++) {
                    const int nseg = WIDTHS[wi][2] ? 3 : 2, threads = 1 + variant % 3;
                    const int64_t M = MS[a], K = KS[c];
                    const qkv_gemm_kernel *k = (variant % 2) ? &small : k0;
                    const float alpha = variant == 5 ? 0.0f : 1.0f;
                    float *A = malloc((size_t)(M * (K + 1) + 1) * sizeof *A);
                    tu_fill_normal_f32(&r, A, (size_t)(M * (K + 1) + 1), 1.0);
                    float *B[3], *C1[3], *C2[3];
                    unsigned char *seen[3], *rows_seen[3];
                    epi_probe pr[3];
                    qkv_gemm_epi e[3];
                    qkv_gemm_seg seg[3];
                    int bad = 0;
                    for (int t = 0; t < nseg; t++) {
                        const int64_t n = WIDTHS[wi][t], ldb = K + 2 + t, ldc = n + 1 + t;
                        B[t] = malloc((size_t)(n * ldb + 1) * sizeof *B[t]);
                        C1[t] = malloc((size_t)(M * ldc + 1) * sizeof *C1[t]);
                        C2[t] = malloc((size_t)(M * ldc + 1) * sizeof *C2[t]);
                        seen[t] = calloc((size_t)(M * n + 1), 1);
                        rows_seen[t] = calloc((size_t)M, 1);
                        tu_fill_normal_f32(&r, B[t], (size_t)(n * ldb + 1), 1.0);
                        tu_fill_normal_f32(&r, C1[t], (size_t)(M * ldc + 1), 1.0);
                        memcpy(C2[t], C1[t], (size_t)(M * ldc + 1) * sizeof *C1[t]);
                        pr[t] = (epi_probe){C2[t], ldc, n, seen[t], 0, rows_seen[t]};
                        e[t] = (qkv_gemm_epi){probe_epi, &pr[t], probe_rows};
                        seg[t] = (qkv_gemm_seg){B[t], ldb, C2[t], ldc, n, &e[t]};
                        bad |= qkv_gemm_run(k, 0, 1, M, n, K, alpha, A, K + 1, B[t], ldb, 0.5f, C1[t], ldc, threads) !=
                               QKV_OK;
                    }
                    bad |= qkv_gemm_run_segs(k, 0, 1, M, K, alpha, A, K + 1, 0.5f, seg, nseg, threads) != QKV_OK;
                    for (int t = 0; t < nseg; t++) {
                        const int64_t n = WIDTHS[wi][t], ldc = n + 1 + t;
                        bad |= pr[t].bad;
                        for (int64_t i = 0; i < M; i++)
                            for (int64_t j = 0; j < ldc; j++) {
                                const float want =
                                    j < n ? 3.0f * (2.0f * C1[t][i * ldc + j] + 1.0f) : C1[t][i * ldc + j];
                                if (memcmp(&want, &C2[t][i * ldc + j], sizeof want) != 0) bad = 1;
                                if (j < n && seen[t][i * n + j] != 1) bad = 1;
                                if (j == 0 && rows_seen[t][i] != (n > 0)) bad = 1;
                            }
                        free(B[t]); free(C1[t]); free(C2[t]); free(seen[t]); free(rows_seen[t]);
                    }
                    CHECK(!bad, "segments %s widths %lld %lld %lld M=%lld K=%lld threads=%d alpha=%g%s",
                          qkv_arch_name(arch), (long long)WIDTHS[wi][0], (long long)WIDTHS[wi][1],
                          (long long)WIDTHS[wi][2], (long long)M, (long long)K, threads, alpha,
                          (variant % 2) ? " small blocks" : "");
                    free(A);
                }
    /* three linear layers of one input, as the encoder's Q, K and V */
    static const int64_t RS[] = {1, 17, 200};
    for (size_t a = 0; a < 3; a++)
        for (int shape = 0; shape < 2; shape++) {
            const int64_t rows = RS[a], in = 37;
            const int64_t out[3] = {shape ? 64 : 5, 64, shape ? 128 : 130};
            float *x = malloc((size_t)(rows * in) * sizeof *x), *w[3], *bias[3], *y1[3], *y2[3];
            tu_fill_normal_f32(&r, x, (size_t)(rows * in), 1.0);
            for (int t = 0; t < 3; t++) {
                w[t] = malloc((size_t)(out[t] * in) * sizeof *w[t]);
                bias[t] = malloc((size_t)out[t] * sizeof *bias[t]);
                y1[t] = malloc((size_t)(rows * out[t]) * sizeof *y1[t]);
                y2[t] = malloc((size_t)(rows * out[t]) * sizeof *y2[t]);
                tu_fill_normal_f32(&r, w[t], (size_t)(out[t] * in), 1.0);
                tu_fill_normal_f32(&r, bias[t], (size_t)out[t], 1.0);
            }
            int bad = 0;
            for (int t = 0; t < 3; t++) /* the middle one without a bias */
                bad |= nn_linear(x, rows, in, w[t], t == 1 ? NULL : bias[t], out[t], y1[t], 2) != QKV_OK;
            const float *const wc[3] = {w[0], w[1], w[2]}, *const bc[3] = {bias[0], NULL, bias[2]};
            bad |= nn_linear_multi(x, rows, in, 3, wc, bc, out, y2, 2) != QKV_OK;
            for (int t = 0; t < 3; t++) {
                bad |= memcmp(y1[t], y2[t], (size_t)(rows * out[t]) * sizeof *y1[t]) != 0;
                free(w[t]); free(bias[t]); free(y1[t]); free(y2[t]);
            }
            CHECK(!bad, "nn_linear_multi %s rows=%lld outs %lld %lld %lld", qkv_arch_name(arch), (long long)rows,
                  (long long)out[0], (long long)out[1], (long long)out[2]);
            free(x);
        }
    const int64_t o2[2] = {4, 4}, oneg[2] = {4, -1};
    float buf[64] = {0};
    const float *const wv[2] = {buf, buf}, *const bv[2] = {NULL, NULL}, *const wnull[2] = {buf, NULL};
    float *const yv[2] = {buf, buf + 16};
    CHECK_STATUS(nn_linear_multi(buf, 2, 3, 2, wnull, bv, o2, yv, 1), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(nn_linear_multi(buf, 2, 3, 2, wv, bv, oneg, yv, 1), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(nn_linear_multi(buf, 2, 3, QKV_GEMM_MAX_SEGS + 1, wv, bv, o2, yv, 1), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(nn_linear_multi(buf, 2, 3, 2, NULL, bv, o2, yv, 1), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(nn_linear_multi(buf, -1, 3, 2, wv, bv, o2, yv, 1), QKV_ERR_BAD_SIZE);
}

int main(void) {
    int archs = 0;
    if (qkv_gemm_uses_cblas())
        printf("this build forwards qkv_sgemm to the system CBLAS; the kernels are tested "
               "through qkv_gemm_run\n");
    for (int arch = 0; arch < QKV_ARCH_COUNT; arch++) {
        const qkv_gemm_kernel *k = kernel_of(arch);
        if (!k) {
            printf("arch %s: not available here, skipped\n", qkv_arch_name(arch));
            continue;
        }
        archs++;
        long before = tu_failed;
        test_random_shapes(arch, 120, 1000 + (uint64_t)arch);
        test_small_blocks(k, 60, 2000 + (uint64_t)arch);
        test_threads(k, 3000 + (uint64_t)arch);
        test_threads_public(arch);
        test_bf16(arch, NULL, 60, 4000 + (uint64_t)arch);
        const qkv_gemm_bf16_kernel *under = qkv_gemm_bf16_kernel_replaced(arch);
        if (under) { /* the table AMX took the place of */
            test_bf16(arch, under, 60, 4100);
            printf("arch %s: bf16 kernel %s also tested\n", qkv_arch_name(arch), under->name);
        }
        test_few_rows(k, 5000 + (uint64_t)arch);
        test_epilogue(arch, 6000 + (uint64_t)arch);
        test_segments(arch, 7000 + (uint64_t)arch);
        printf("arch %s (kernel %s, MC %d KC %d NC %d; bf16 kernel %s): %s\n", qkv_arch_name(arch), k->name,
               k->mc, k->kc, k->nc, bf16_kernel_of(arch)->name, tu_failed == before ? "ok" : "FAILED");
    }
    CHECK(archs >= 1, "no arch ran");
    test_degenerate();
    test_errors();
    test_allocator();
    test_bf16_errors();
    test_bf16_allocator();
    return tu_finish();
}
