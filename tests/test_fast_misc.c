/* The fast path's edges: allocation failures (error, nothing leaked),
 * QKV_NUM_THREADS, forcing each ISA, requests it does not take
 * (QKV_ERR_UNSUPPORTED with QKV_IMPL_FAST, the reference with AUTO), windows
 * that equal causal / full attention bitwise, the online softmax on rows of
 * steadily increasing logits (a rescale at every tile), logits of 1e30 and
 * rows all near -1e5, a whole key tile masked by the bias; each ISA's panel
 * packing against its definition and its qk product against dot products
 * in double, column for column. */
#define _POSIX_C_SOURCE 200112L /* setenv */
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>

#include "test_fast_common.h"

/* ---- allocation failure injection -------------------------------------- */

static long g_allocs, g_frees, g_fail_at = -1;

static void *count_malloc(size_t n, void *user) {
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

static void test_alloc_failures(void) {
    for (int norm = 0; norm <= 1; norm++) {
        fprob p;
        memset(&p, 0, sizeof p);
        qkv_attn_desc_init(&p.d);
        p.d.batch = 2; p.d.n_q = 70; p.d.n_k = 90; p.d.heads = 2; p.d.heads_kv = 1; p.d.dim = 8;
        p.d.score = norm ? QKV_SCORE_COSINE : QKV_SCORE_SCALED_DOT;
        p.d.norm = norm ? QKV_NORM_RELU : QKV_NORM_SOFTMAX;
        p.d.relu_divide_by_count = 1;
        p.d.bias_kind = QKV_BIAS_SHARED;
        p.d.impl = QKV_IMPL_FAST;
        p.d.threads = 2;
        if (!fp_make(&p, 900 + (uint64_t)norm, 1.0)) continue;
        float *o = malloc((size_t)p.no_el * sizeof(float)), *l = malloc((size_t)p.nl_el * sizeof(float));
        float *dq = malloc((size_t)p.nq_el * sizeof(float)), *dk = malloc((size_t)p.nk_el * sizeof(float)),
              *dv = malloc((size_t)p.nv_el * sizeof(float)), *db = malloc((size_t)p.nb_el * sizeof(float));
        qkv_attn_grads g;
        memset(&g, 0, sizeof g);
        g.dq = dq;
        g.dk = dk;
        g.dv = dv;
        g.dbias = db;
        CHECK_STATUS(qkv_set_allocator(count_malloc, count_free, NULL), QKV_OK);
        for (int pass = 0; pass < 2; pass++) {
            /* Count the allocations of a successful call, then fail each in turn. */
            g_allocs = g_frees = 0;
            g_fail_at = -1;
            qkv_status st = pass ? qkv_attention_backward(&p.d, p.q, p.k, p.v, NULL, NULL, p.dout, &g)
                                 : qkv_attention_forward(&p.d, p.q, p.k, p.v, o, NULL, l);
            CHECK(st == QKV_OK && g_allocs == g_frees, "pass %d: status %d, %ld allocs %ld frees", pass, st,
                  g_allocs, g_frees);
            long total = g_allocs;
            for (long k = 0; k < total; k++) {
                g_allocs = g_frees = 0;
                g_fail_at = k;
                st = pass ? qkv_attention_backward(&p.d, p.q, p.k, p.v, NULL, NULL, p.dout, &g)
                          : qkv_attention_forward(&p.d, p.q, p.k, p.v, o, NULL, l);
                CHECK(st == QKV_ERR_OUT_OF_MEMORY, "pass %d: failing allocation %ld gave %d", pass, k, st);
                CHECK(g_allocs == g_frees, "pass %d: failing allocation %ld leaked (%ld allocs, %ld frees)", pass,
                      k, g_allocs, g_frees);
            }
        }
        g_fail_at = -1;
        CHECK_STATUS(qkv_set_allocator(NULL, NULL, NULL), QKV_OK);
        free(o); free(l); free(dq); free(dk); free(dv); free(db);
        fp_free(&p);
    }
}

/* The fast forward takes one block per call (packed K, V copies and the
 * per-thread tiles together, fa_kv_alloc): with two, glibc trimmed or unmapped
 * them at every free and small calls paid 5-78 page faults each (2.9x the
 * time of 8 heads at n = 64). Cosine's normalised copies are in it too. */
static void test_one_block(void) {
    static const int64_t shapes[][4] = {{1, 64, 1, 1}, {1, 512, 1, 1}, {2, 100, 8, 2}, {1, 65, 8, 8}};
    CHECK_STATUS(qkv_set_allocator(count_malloc, count_free, NULL), QKV_OK);
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int threads = 1; threads <= 3; threads += 2)
            for (int variant = 0; variant < 3; variant++) {
                fprob p;
                memset(&p, 0, sizeof p);
                qkv_attn_desc_init(&p.d);
                p.d.batch = shapes[si][0]; p.d.n_q = p.d.n_k = shapes[si][1];
                p.d.heads = shapes[si][2]; p.d.heads_kv = shapes[si][3]; p.d.dim = 16;
                p.d.mask = variant == 1 ? QKV_MASK_CAUSAL : QKV_MASK_NONE;
                p.d.score = variant == 2 ? QKV_SCORE_COSINE : QKV_SCORE_SCALED_DOT;
                p.d.impl = QKV_IMPL_FAST;
                p.d.threads = threads;
                CHECK_STATUS(qkv_set_allocator(NULL, NULL, NULL), QKV_OK);
                int made = fp_make(&p, 950 + si, 1.0);
                CHECK_STATUS(qkv_set_allocator(count_malloc, count_free, NULL), QKV_OK);
                if (!made) continue;
                float *o = malloc((size_t)p.no_el * sizeof(float)), *l = malloc((size_t)p.nl_el * sizeof(float));
                g_allocs = g_frees = 0;
                qkv_status st = qkv_attention_forward(&p.d, p.q, p.k, p.v, o, NULL, l);
                CHECK(st == QKV_OK && g_allocs == 1 && g_frees == 1,
                      "shape %zu threads %d variant %d: status %d, %ld allocations (want 1), %ld frees", si,
                      threads, variant, st, g_allocs, g_frees);
                free(o); free(l);
                fp_free(&p);
            }
    CHECK_STATUS(qkv_set_allocator(NULL, NULL, NULL), QKV_OK);
}

/* ---- dispatch ------------------------------------------------------------ */

static void test_dispatch(void) {
    qkv_attn_desc d;
    qkv_attn_desc_init(&d);
    d.batch = 1; d.n_q = 3; d.n_k = 3; d.heads = 1; d.dim = 2;
    double qd[6] = {1, 2, 3, 4, 5, 6}, od[6];
    d.dtype = QKV_F64;
    d.impl = QKV_IMPL_FAST;
    CHECK_STATUS(qkv_attention_forward(&d, qd, qd, qd, od, NULL, NULL), QKV_ERR_UNSUPPORTED);
    d.impl = QKV_IMPL_AUTO;
    CHECK_STATUS(qkv_attention_forward(&d, qd, qd, qd, od, NULL, NULL), QKV_OK);
    float q[6] = {1, 2, 3, 4, 5, 6}, o[6], w1[2] = {1, 0}, w2[2] = {0, 1}, wv[1] = {1};
    d.dtype = QKV_F32;
    d.score = QKV_SCORE_ADDITIVE;
    d.additive_dim = 1;
    d.additive_w1 = w1;
    d.additive_w2 = w2;
    d.additive_w = wv;
    d.impl = QKV_IMPL_FAST; /* the additive score's own fast path (test_fast_additive.c) */
    CHECK_STATUS(qkv_attention_forward(&d, q, q, q, o, NULL, NULL), QKV_OK);
    d.impl = QKV_IMPL_AUTO;
    CHECK_STATUS(qkv_attention_forward(&d, q, q, q, o, NULL, NULL), QKV_OK);
    d.impl = (qkv_impl)3;
    CHECK_STATUS(qkv_attention_forward(&d, q, q, q, o, NULL, NULL), QKV_ERR_BAD_ENUM);
    CHECK(qkv_cpu_has(QKV_ARCH_GENERIC), "generic always available");
    CHECK(qkv_cpu_force_arch(99) == 0 && qkv_cpu_force_arch(-1) == 1, "force arch bounds");
    CHECK(qkv_kernels_active() != NULL, "active table");
}

/* ---- bitwise properties -------------------------------------------------- */

static float *fwd(const fprob *p, const qkv_attn_desc *d, int threads) {
    qkv_attn_desc e = *d;
    e.impl = QKV_IMPL_FAST;
    e.threads = threads;
    float *o = malloc((size_t)p->no_el * sizeof(float));
    CHECK_STATUS(qkv_attention_forward(&e, p->q, p->k, p->v, o, NULL, NULL), QKV_OK);
    return o;
}

static void test_windows_equal(void) {
    fprob p;
    memset(&p, 0, sizeof p);
    qkv_attn_desc_init(&p.d);
    p.d.batch = 1; p.d.n_q = 300; p.d.n_k = 260; p.d.heads = 2; p.d.dim = 16;
    if (!fp_make(&p, 950, 1.0)) return;
    qkv_attn_desc d = p.d;
    float *full = fwd(&p, &d, 1);
    d.mask = QKV_MASK_WINDOW;
    d.window_left = d.window_right = 1000;
    float *wide = fwd(&p, &d, 1);
    CHECK(memcmp(full, wide, (size_t)p.no_el * sizeof(float)) == 0, "window >= n differs from no mask");
    d.mask = QKV_MASK_CAUSAL;
    d.window_left = d.window_right = 0;
    float *causal = fwd(&p, &d, 1);
    d.mask = QKV_MASK_CAUSAL_WINDOW;
    d.window_left = 1000;
    float *cw = fwd(&p, &d, 1);
    CHECK(memcmp(causal, cw, (size_t)p.no_el * sizeof(float)) == 0, "causal window >= n differs from causal");
    /* QKV_NUM_THREADS (desc.threads = 0) gives the same bits. */
    setenv("QKV_NUM_THREADS", "3", 1);
    float *env = fwd(&p, &d, 0);
    unsetenv("QKV_NUM_THREADS");
    CHECK(memcmp(causal, env, (size_t)p.no_el * sizeof(float)) == 0, "QKV_NUM_THREADS=3 differs");
    free(full); free(wide); free(causal); free(cw); free(env);
    fp_free(&p);
}

/* A multithreaded caller: concurrent calls with the default thread count
 * (which then shares the cores) give the same bits as a lone call. */
typedef struct conc_arg { const fprob *p; float *o; } conc_arg;

static void *conc_main(void *arg) {
    conc_arg *a = arg;
    qkv_attn_desc d = a->p->d;
    d.impl = QKV_IMPL_FAST;
    d.threads = 0;
    for (int rep = 0; rep < 3; rep++)
        if (qkv_attention_forward(&d, a->p->q, a->p->k, a->p->v, a->o, NULL, NULL) != QKV_OK) a->o[0] = NAN;
    return NULL;
}

static void test_concurrent_callers(void) {
    fprob p;
    memset(&p, 0, sizeof p);
    qkv_attn_desc_init(&p.d);
    p.d.batch = 2; p.d.n_q = 200; p.d.n_k = 200; p.d.heads = 3; p.d.dim = 16;
    p.d.mask = QKV_MASK_CAUSAL;
    if (!fp_make(&p, 970, 1.0)) return;
    float *lone = fwd(&p, &p.d, 1);
    pthread_t tid[3];
    conc_arg args[3];
    int started[3];
    for (int t = 0; t < 3; t++) {
        args[t].p = &p;
        args[t].o = malloc((size_t)p.no_el * sizeof(float));
        started[t] = pthread_create(&tid[t], NULL, conc_main, &args[t]) == 0;
    }
    for (int t = 0; t < 3; t++) {
        if (started[t]) pthread_join(tid[t], NULL);
        else conc_main(&args[t]);
        CHECK(memcmp(args[t].o, lone, (size_t)p.no_el * sizeof(float)) == 0, "concurrent caller %d differs", t);
        free(args[t].o);
    }
    free(lone);
    fp_free(&p);
}

/* ---- numerics ------------------------------------------------------------ */

/* max |fast - ref64| <= 2 max |naive32 - ref64| + 1e-5 + extra. */
static void check_rule(fprob *p, double extra, const char *what) {
    fp_sync(p);
    qkv_attn_desc d64 = fp_desc64(p);
    double *ro = malloc((size_t)p->no_el * sizeof(double));
    CHECK_STATUS(qkv_attention_forward(&d64, p->qd, p->kd, p->vd, ro, NULL, NULL), QKV_OK);
    float *no = malloc((size_t)p->no_el * sizeof(float));
    n32_forward(p, no, NULL, NULL);
    float *fo = fwd(p, &p->d, 2);
    double e = fp_err(fo, ro, p->no_el), b = fp_err(no, ro, p->no_el);
    CHECK(e <= 2 * b + 1e-5 + extra, "%s [%s]: err %.3g, naive %.3g", what, qkv_kernels_active()->name, e, b);
    CHECK(!fp_any_nan(fo, p->no_el), "%s: NaN", what);
    free(ro); free(no); free(fo);
}

static void test_numerics(void) {
    /* Increasing logits along the keys: the running max grows at every tile. */
    fprob p;
    memset(&p, 0, sizeof p);
    qkv_attn_desc_init(&p.d);
    p.d.batch = 1; p.d.n_q = 70; p.d.n_k = 1000; p.d.heads = 1; p.d.dim = 4;
    if (fp_make(&p, 960, 1.0)) {
        for (int64_t i = 0; i < 70; i++) { p.q[i * 4] = 1.0f; p.q[i * 4 + 1] = p.q[i * 4 + 2] = p.q[i * 4 + 3] = 0.0f; }
        for (int64_t j = 0; j < 1000; j++) p.k[j * 4] = 0.02f * (float)j;
        check_rule(&p, 0.0, "increasing logits");
        fp_free(&p);
    }
    /* Rows whose logits are all near -1e5 (a large negative bias). */
    memset(&p, 0, sizeof p);
    qkv_attn_desc_init(&p.d);
    p.d.batch = 1; p.d.n_q = 40; p.d.n_k = 200; p.d.heads = 1; p.d.dim = 8;
    p.d.bias_kind = QKV_BIAS_SHARED;
    if (fp_make(&p, 961, 1.0)) {
        for (int64_t x = 0; x < p.nb_el; x++) p.bias[x] = -1e5f + (float)(x % 7);
        /* logits ~1e5 round at ~0.004: the extra term is that rounding's effect */
        check_rule(&p, 4.0 * 1e5 * 0x1p-24 * 5.0, "logits near -1e5");
        fp_free(&p);
    }
    /* A whole key tile (128 keys) masked by the bias while the row is not. */
    memset(&p, 0, sizeof p);
    qkv_attn_desc_init(&p.d);
    p.d.batch = 1; p.d.n_q = 64; p.d.n_k = 400; p.d.heads = 2; p.d.dim = 8;
    p.d.bias_kind = QKV_BIAS_PER_HEAD;
    if (fp_make(&p, 962, 1.0)) {
        for (int64_t h = 0; h < 2; h++)
            for (int64_t i = 0; i < 64; i++)
                for (int64_t j = 0; j < 400; j++) {
                    float *b = &p.bias[(h * 64 + i) * 400 + j];
                    *b = (j < 128 || (j >= 256 && j < 384)) ? -INFINITY : (*b == -INFINITY ? 0.5f : *b);
                }
        check_rule(&p, 0.0, "whole key tiles masked by the bias");
        fp_free(&p);
    }
    /* Logits of 1e30: no overflow, the row is not lost. */
    memset(&p, 0, sizeof p);
    qkv_attn_desc_init(&p.d);
    p.d.batch = 1; p.d.n_q = 20; p.d.n_k = 150; p.d.heads = 1; p.d.dim = 4;
    p.d.score = QKV_SCORE_DOT;
    if (fp_make(&p, 963, 1.0)) {
        for (int64_t x = 0; x < p.nq_el; x++) p.q[x] *= 1e15f;
        for (int64_t x = 0; x < p.nk_el; x++) p.k[x] *= 1e15f;
        check_rule(&p, 4.0 * 1e31 * 0x1p-24 * 5.0, "logits of 1e30");
        fp_free(&p);
    }
}

/* ---- the packing kernel ------------------------------------------------- */

/* K->pack_panel against its definition, exactly (it only moves floats): row
 * counts 1..32 and awkward widths, a source sized to the last element read
 * (ASan sees any read beyond it) and guards around the panel; with ordinary
 * and with streaming stores (the panel 64-byte aligned, then the fence). */
static void test_pack_panel(void) {
    for (int stream = 0; stream <= 1; stream++) {
        const qkv_kernels *K = qkv_kernels_active();
        static const size_t dims[] = {1, 3, 8, 15, 16, 17, 31, 64, 80, 128, 256};
        static const size_t counts[] = {1, 2, 7, 8, 9, 15, 16, 17, 31, 32};
        tu_rng rng;
        tu_rng_seed(&rng, 4242);
        for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
            for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
                size_t D = dims[di], nr = counts[ci], ld = D + 5 * (ci % 2); /* rows packed or apart */
                size_t nsrc = (nr - 1) * ld + D, guard = 16;
                size_t nbuf = (D * QKV_PANEL + 2 * guard + 15) / 16 * 16; /* guard = 16 floats: the panel stays aligned */
                float *src = malloc(nsrc * sizeof(float)), *buf = aligned_alloc(64, nbuf * sizeof(float));
                if (!src || !buf) {
                    CHECK(0, "out of memory");
                    free(src);
                    free(buf);
                    return;
                }
                tu_fill_normal_f32(&rng, src, nsrc, 1.0);
                for (size_t x = 0; x < D * QKV_PANEL + 2 * guard; x++) buf[x] = 7.0f;
                K->pack_panel(buf + guard, src, ld, nr, D, stream);
                K->stream_fence();
                int bad = 0;
                for (size_t x = 0; x < guard; x++) bad |= buf[x] != 7.0f || buf[guard + D * QKV_PANEL + x] != 7.0f;
                for (size_t d = 0; d < D; d++)
                    for (size_t r = 0; r < QKV_PANEL; r++) {
                        float want = r < nr ? src[r * ld + d] : 0.0f;
                        bad |= memcmp(&buf[guard + d * QKV_PANEL + r], &want, sizeof want) != 0;
                    }
                CHECK(!bad, "pack_panel [%s] D = %zu, rows = %zu, ld = %zu, stream %d", K->name, D, nr, ld, stream);
                free(src);
                free(buf);
            }
    }
}

/* K->qk against dot products in double on panels packed by K->pack_panel:
 * every row count the fast paths pass (multiples of 8), awkward D, column
 * counts on both sides of 16 and 32, row strides apart; the columns up to
 * QKV_QK_COLS(ncols) and nothing beyond (guards in every row). Tolerance:
 * a float sum of D products in any order is within gamma_D * sum |q_d k_d|
 * of the exact value (gamma_D = D u / (1 - D u), u = 2^-24); checked with
 * (D + 2) u to allow the fused multiply-adds' single roundings. */
static void test_qk_columns(void) {
    const qkv_kernels *K = qkv_kernels_active();
    static const size_t dims[] = {1, 3, 16, 31, 64, 80};
    static const size_t cols[] = {1, 7, 8, 15, 16, 17, 31, 32, 33, 48, 49, 64, 65, 100, 128};
    static const size_t rowcounts[] = {8, 16, 64};
    tu_rng rng;
    tu_rng_seed(&rng, 777);
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
        for (size_t ci = 0; ci < sizeof cols / sizeof cols[0]; ci++)
            for (size_t ri = 0; ri < sizeof rowcounts / sizeof rowcounts[0]; ri++) {
                const size_t D = dims[di], nc = cols[ci], rows = rowcounts[ri], ldq = D + 3 * (ri % 2);
                const size_t np = (nc + QKV_PANEL - 1) / QKV_PANEL, lds = np * QKV_PANEL + 16;
                float *q = malloc(rows * ldq * sizeof(float)), *k = malloc(np * QKV_PANEL * D * sizeof(float));
                float *kp = malloc(np * QKV_PANEL * D * sizeof(float)), *s = malloc(rows * lds * sizeof(float));
                if (!q || !k || !kp || !s) {
                    CHECK(0, "out of memory");
                    free(q); free(k); free(kp); free(s);
                    return;
                }
                tu_fill_normal_f32(&rng, q, rows * ldq, 1.0);
                tu_fill_normal_f32(&rng, k, nc * D, 1.0);
                for (size_t p = 0; p < np; p++)
                    K->pack_panel(kp + p * D * QKV_PANEL, k + p * QKV_PANEL * D, D,
                                  nc - p * QKV_PANEL < QKV_PANEL ? nc - p * QKV_PANEL : QKV_PANEL, D, 0);
                for (size_t x = 0; x < rows * lds; x++) s[x] = 7.0f;
                K->qk(q, ldq, kp, D, rows, nc, s, lds);
                const size_t written = QKV_QK_COLS(nc);
                int bad = 0;
                for (size_t r = 0; r < rows && !bad; r++)
                    for (size_t c = 0; c < lds; c++) {
                        float got = s[r * lds + c];
                        if (c >= written) {
                            bad |= got != 7.0f;
                            continue;
                        }
                        double exact = 0.0, mag = 0.0;
                        for (size_t d = 0; d < D; d++) {
                            double t = c < nc ? (double)q[r * ldq + d] * k[c * D + d] : 0.0;
                            exact += t;
                            mag += fabs(t);
                        }
                        bad |= !(fabs(got - exact) <= (double)(D + 2) * 0x1p-24 * mag);
                    }
                CHECK(!bad, "qk [%s] D = %zu, rows = %zu, ncols = %zu", K->name, D, rows, nc);
                free(q);
                free(k);
                free(kp);
                free(s);
            }
}

/* K->scale_stream: o = x * mul for every start offset within a line and
 * lengths around whole lines, exactly (one rounding, as the plain product),
 * nothing written before or after (canaries), after stream_fence. */
static void test_scale_stream(void) {
    const qkv_kernels *K = qkv_kernels_active();
    static const size_t lens[] = {0, 1, 2, 7, 15, 16, 17, 31, 32, 33, 47, 48, 63, 64, 65, 100, 129};
    float *x = aligned_alloc(64, 256 * sizeof(float)), *buf = aligned_alloc(64, 256 * sizeof(float));
    if (!x || !buf) {
        CHECK(0, "out of memory");
        free(x);
        free(buf);
        return;
    }
    tu_rng rng;
    tu_rng_seed(&rng, 4242);
    tu_fill_normal_f32(&rng, x, 256, 1.0);
    const float mul = 0.7310585786f;
    for (size_t off = 0; off < 16; off++)
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            const size_t n = lens[li];
            for (size_t i = 0; i < 256; i++) buf[i] = -3.0f;
            K->scale_stream(buf + 16 + off, x, mul, n);
            K->stream_fence();
            int bad = 0;
            for (size_t i = 0; i < 256; i++) {
                size_t j = i - 16 - off;
                float want = i >= 16 + off && j < n ? x[j] * mul : -3.0f;
                bad |= buf[i] != want;
            }
            CHECK(!bad, "scale_stream [%s] offset %zu floats, n = %zu", K->name, off, n);
        }
    free(x);
    free(buf);
}

/* K->all_finite: 1 for finite values of every kind (zeros, subnormals, the
 * largest floats), 0 when any one element is +-inf or NaN, at every position
 * of lengths around whole vectors; NaN just before and after the n elements
 * (guards) must not be seen. */
static void test_all_finite(void) {
    const qkv_kernels *K = qkv_kernels_active();
    static const size_t lens[] = {0, 1, 2, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 129};
    static const float finite[] = {0.0f, -0.0f, 1.0f, -2.5f, 1e-45f, -1e-40f, FLT_MAX, -FLT_MAX, FLT_MIN};
    const float bad[] = {INFINITY, -INFINITY, NAN, -NAN};
    float buf[16 + 129 + 16];
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        const size_t n = lens[li];
        float *x = buf + 16;
        for (size_t i = 0; i < sizeof buf / sizeof buf[0]; i++) buf[i] = NAN;
        for (size_t i = 0; i < n; i++) x[i] = finite[i % (sizeof finite / sizeof finite[0])];
        CHECK(K->all_finite(x, n) == 1, "all_finite [%s] n = %zu: finite values (or a guard) seen as not", K->name, n);
        for (size_t i = 0; i < n; i++)
            for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
                float keep = x[i];
                x[i] = bad[b];
                CHECK(K->all_finite(x, n) == 0, "all_finite [%s] n = %zu: %g at %zu missed", K->name, n,
                      (double)bad[b], i);
                x[i] = keep;
            }
    }
}

int main(void) {
    test_alloc_failures();
    test_one_block();
    test_dispatch();
    for (int arch = 0; arch < QKV_ARCH_COUNT; arch++) {
        if (!qkv_cpu_force_arch(arch)) continue;
        test_pack_panel();
        test_qk_columns();
        test_scale_stream();
        test_all_finite();
        test_windows_equal();
        test_concurrent_callers();
        test_numerics();
    }
    qkv_cpu_force_arch(-1);
    return tu_finish();
}
