/* Every kernel of every ISA the CPU has against the generic kernel
 * (kernels/kernels.h), in the spirit of ggml's test-backend-ops: the same
 * inputs through both, on awkward sizes (1, 2, 7, 15, 16, 17, 31, 33, 63,
 * 65, 129), pointers one element off alignment, row strides apart from the
 * widths, guards around every output (nothing written outside the contract's
 * ranges), with stated tolerances:
 *   - moves and roundings (pack_panel, scale_stream, all_finite, scale_bias, the bf16
 *     packings, m of the softmax, the int8 quantisation and tiles, whose
 *     sums are exact) and the dropout factors: exact;
 *   - sums of n products (qk, pv, the gemm, KV decode, bf16 products): both
 *     within 2 (n + 2) u sum |terms| of each other (u = 2^-24: any order of
 *     a float sum, fused or not, is within (n + 1) u sum |terms| of exact);
 *   - the layers' rows (kernels/nn.h): the tolerances stated there;
 *   - exp2 and what uses it (softmax, backward softmax): 4e-6 relative (the
 *     polynomials are within 2e-7 of 2^x), the sums of weights as above on
 *     top; exp2's special values exactly (0 -> 1, -inf and x < -126 -> +0,
 *     overflow and +inf -> +inf, NaN -> NaN, never a subnormal).
 * The generic set is compared with itself too (a check of the harness). */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu.h"
#include "core/half.h"
#include "kernels/kernels.h"
#include "test_util.h"

static const size_t SIZES[] = {1, 2, 7, 15, 16, 17, 31, 33, 63, 65, 129};
#define NSIZES (sizeof SIZES / sizeof SIZES[0])
#define U 0x1p-24
#define EXP_REL 4e-6

static const char *g_isa; /* the set under test, for messages */
static int g_bf16_gemm_exact = 1; /* the bf16 gemm kernels agreed bitwise */

/* ---- guarded buffers: 64 bytes of 0xA5 on both sides, `off` bytes off a
 * 64-byte boundary ---------------------------------------------------------- */

#define GUARD 64
typedef struct gbuf {
    unsigned char *base;
    size_t bytes, off, total;
} gbuf;

static void *gb_new(gbuf *g, size_t bytes, size_t off) {
    g->bytes = bytes;
    g->off = off;
    g->total = (2 * GUARD + off + bytes + 63) / 64 * 64;
    g->base = aligned_alloc(64, g->total);
    if (!g->base) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    memset(g->base, 0xA5, g->total);
    return g->base + GUARD + off;
}

static int gb_ok(const gbuf *g) {
    for (size_t i = 0; i < g->total; i++)
        if ((i < GUARD + g->off || i >= GUARD + g->off + g->bytes) && g->base[i] != 0xA5) return 0;
    return 1;
}

static void gb_free(gbuf *g) { free(g->base); }

static float *fnew(gbuf *g, size_t n, int mis) { return gb_new(g, n * sizeof(float), mis ? 4 : 0); }

static int same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

/* got within tol of want; NaN matches NaN, infinities match exactly. */
static int near(double got, double want, double tol) {
    if (isnan(want) || isnan(got)) return isnan(want) && isnan(got);
    if (isinf(want) || isinf(got)) return got == want;
    return fabs(got - want) <= tol;
}

static tu_rng g_rng;
static float rnd(double sd) { return (float)(tu_rng_normal(&g_rng) * sd); }
static uint32_t rnd_pair(double sd);
static double pair_mag(uint32_t a, uint32_t b);

/* ---- attention tiles ----------------------------------------------------- */

static void test_pack_panel(const qkv_kernels *K, const qkv_kernels *G) {
    for (size_t di = 0; di < NSIZES; di++)
        for (size_t nr = 1; nr <= QKV_PANEL; nr += nr < 3 ? 1 : 7)
            for (int stream = 0; stream <= 1; stream++) {
                const size_t D = SIZES[di], ld = D + (nr % 2) * 3, n = (nr - 1) * ld + D;
                gbuf gs, g1, g2;
                float *src = fnew(&gs, n, 1), *a = fnew(&g1, D * QKV_PANEL, !stream), *b = fnew(&g2, D * QKV_PANEL, 0);
                for (size_t i = 0; i < n; i++) src[i] = rnd(1.0);
                K->pack_panel(a, src, ld, nr, D, stream);
                K->stream_fence();
                G->pack_panel(b, src, ld, nr, D, 0);
                CHECK(memcmp(a, b, D * QKV_PANEL * sizeof(float)) == 0 && gb_ok(&g1),
                      "pack_panel [%s] D %zu rows %zu stream %d", g_isa, D, nr, stream);
                gb_free(&gs); gb_free(&g1); gb_free(&g2);
            }
}

static void test_qk(const qkv_kernels *K, const qkv_kernels *G) {
    static const size_t rowc[] = {8, 16, 64};
    for (size_t di = 0; di < NSIZES; di++)
        for (size_t ci = 0; ci < NSIZES; ci++)
            for (size_t ri = 0; ri < 3; ri++) {
                const size_t D = SIZES[di], nc = SIZES[ci], rows = rowc[ri], ldq = D + ri;
                const size_t np = (nc + QKV_PANEL - 1) / QKV_PANEL, lds = np * QKV_PANEL + 5;
                gbuf gq, gk, g1, g2;
                float *q = fnew(&gq, rows * ldq, 1), *kp = fnew(&gk, np * QKV_PANEL * D, 0);
                float *s1 = fnew(&g1, rows * lds, 1), *s2 = fnew(&g2, rows * lds, 1);
                for (size_t i = 0; i < rows * ldq; i++) q[i] = rnd(1.0);
                for (size_t i = 0; i < np * QKV_PANEL * D; i++) kp[i] = rnd(1.0);
                memset(s1, 0, rows * lds * sizeof(float));
                memset(s2, 0, rows * lds * sizeof(float));
                K->qk(q, ldq, kp, D, rows, nc, s1, lds);
                G->qk(q, ldq, kp, D, rows, nc, s2, lds);
                int bad = !gb_ok(&g1);
                for (size_t r = 0; r < rows; r++)
                    for (size_t c = 0; c < lds; c++) {
                        double mag = 0.0;
                        for (size_t d = 0; d < D && c < np * QKV_PANEL; d++)
                            mag += fabs((double)q[r * ldq + d] * kp[((c / 32) * D + d) * 32 + c % 32]);
                        if (c >= QKV_QK_COLS(nc)) bad |= s1[r * lds + c] != 0.0f; /* not written */
                        else bad |= !near(s1[r * lds + c], s2[r * lds + c], 2.0 * (D + 2) * U * mag);
                    }
                CHECK(!bad, "qk [%s] D %zu rows %zu ncols %zu", g_isa, D, rows, nc);
                gb_free(&gq); gb_free(&gk); gb_free(&g1); gb_free(&g2);
            }
}

static void test_pv(const qkv_kernels *K, const qkv_kernels *G) {
    static const size_t rowc[] = {1, 2, 3, 5, 7, 8, 17, 64};
    for (size_t ni = 0; ni < NSIZES; ni++)
        for (size_t vi = 0; vi <= NSIZES; vi++) /* and dv = 64, which has its own tiles */
            for (size_t ri = 0; ri < 8; ri++)
                for (int mode = 0; mode < 3; mode++) { /* 0: alpha, 1: no alpha, 2: transposed p */
                    const size_t nk = SIZES[ni], dv = vi < NSIZES ? SIZES[vi] : 64, rows = rowc[ri];
                    const size_t ldo = dv + 3, ldv = dv + 1, ldp = mode == 2 ? 1 : nk + 2, pcs = mode == 2 ? rows + 1 : 1;
                    const size_t np = mode == 2 ? nk * pcs : rows * ldp;
                    gbuf gp, gv, ga, g1, g2;
                    float *p = fnew(&gp, np, 1), *v = fnew(&gv, nk * ldv, 1), *al = fnew(&ga, rows, 0);
                    float *o1 = fnew(&g1, rows * ldo, 1), *o2 = fnew(&g2, rows * ldo, 1);
                    for (size_t i = 0; i < np; i++) p[i] = (float)tu_rng_uniform(&g_rng);
                    for (size_t i = 0; i < nk * ldv; i++) v[i] = rnd(1.0);
                    for (size_t r = 0; r < rows; r++) al[r] = (float)tu_rng_uniform(&g_rng);
                    for (size_t i = 0; i < rows * ldo; i++) o1[i] = o2[i] = rnd(1.0);
                    const float *alpha = mode == 0 ? al : NULL;
                    K->pv(o1, ldo, alpha, p, ldp, pcs, v, ldv, nk, dv, rows);
                    G->pv(o2, ldo, alpha, p, ldp, pcs, v, ldv, nk, dv, rows);
                    int bad = !gb_ok(&g1);
                    for (size_t r = 0; r < rows; r++)
                        for (size_t c = 0; c < ldo; c++) {
                            if (c >= dv) {
                                bad |= !same_bits(o1[r * ldo + c], o2[r * ldo + c]); /* untouched */
                                continue;
                            }
                            double mag = fabs((double)o2[r * ldo + c]);
                            for (size_t j = 0; j < nk; j++) mag += fabs((double)p[r * ldp + j * pcs] * v[j * ldv + c]);
                            bad |= !near(o1[r * ldo + c], o2[r * ldo + c], 2.0 * (nk + 3) * U * mag + 1e-30);
                        }
                    CHECK(!bad, "pv [%s] nk %zu dv %zu rows %zu mode %d", g_isa, nk, dv, rows, mode);
                    gb_free(&gp); gb_free(&gv); gb_free(&ga); gb_free(&g1); gb_free(&g2);
                }
}

static void test_softmax(const qkv_kernels *K, const qkv_kernels *G) {
    static const size_t rowc[] = {1, 2, 7, 8, 15, 16, 17};
    for (size_t ci = 0; ci < NSIZES; ci++)
        for (size_t ri = 0; ri < 7; ri++)
            for (int online = 0; online <= 1; online++) {
                const size_t cols = SIZES[ci], rows = rowc[ri], lds = cols + 1;
                const float cm = 1.4426950f * 0.125f;
                gbuf g1, g2;
                float *s1 = fnew(&g1, rows * lds, 1), *s2 = fnew(&g2, rows * lds, 1);
                float m1[17], m2[17], l1[17], l2[17], a1[17], a2[17];
                for (size_t r = 0; r < rows; r++) {
                    for (size_t c = 0; c < lds; c++) {
                        float x = rnd(30.0);
                        if (r % 5 == 3 || tu_rng_uniform(&g_rng) < 0.2) x = -INFINITY; /* masked; some rows all */
                        s1[r * lds + c] = s2[r * lds + c] = x;
                    }
                    m1[r] = m2[r] = online && r % 3 ? rnd(30.0) : -INFINITY;
                    l1[r] = l2[r] = m1[r] == -INFINITY ? 0.0f : 1.0f + (float)tu_rng_uniform(&g_rng);
                }
                K->softmax(s1, lds, rows, cols, cm, m1, l1, a1);
                G->softmax(s2, lds, rows, cols, cm, m2, l2, a2);
                int bad = !gb_ok(&g1);
                for (size_t r = 0; r < rows; r++) {
                    bad |= !same_bits(m1[r], m2[r]) || !near(a1[r], a2[r], EXP_REL * fabsf(a2[r]));
                    bad |= !near(l1[r], l2[r], (EXP_REL + 2.0 * (cols + 3) * U) * fabsf(l2[r]));
                    for (size_t c = 0; c < lds; c++)
                        bad |= c < cols ? !near(s1[r * lds + c], s2[r * lds + c], EXP_REL * fabsf(s2[r * lds + c]))
                                        : !same_bits(s1[r * lds + c], s2[r * lds + c]);
                }
                CHECK(!bad, "softmax [%s] rows %zu cols %zu online %d", g_isa, rows, cols, online);
                gb_free(&g1); gb_free(&g2);
            }
}

static void test_bwd_softmax(const qkv_kernels *K, const qkv_kernels *G) {
    static const size_t rowc[] = {1, 2, 7, 8, 16, 17, 33};
    for (size_t ci = 0; ci < NSIZES; ci++)
        for (size_t ri = 0; ri < 7; ri++)
            for (int mode = 0; mode < 4; mode++) { /* percol = mode & 1, M given = mode & 2 */
                const size_t cols = SIZES[ci], rows = rowc[ri], ld = cols + 2, nv = mode & 1 ? cols : rows;
                const float cm = 1.4426950f * 0.125f;
                gbuf g1, g2, h1, h2;
                float *s1 = fnew(&g1, rows * ld, 1), *s2 = fnew(&g2, rows * ld, 1);
                float *d1 = fnew(&h1, rows * ld, 1), *d2 = fnew(&h2, rows * ld, 1);
                float M[129], L[129], Dd[129];
                for (size_t i = 0; i < nv; i++) {
                    M[i] = rnd(10.0);
                    L[i] = i % 11 == 5 ? INFINITY : (float)(5.0 * tu_rng_uniform(&g_rng));
                    Dd[i] = rnd(1.0);
                }
                for (size_t r = 0; r < rows; r++)
                    for (size_t c = 0; c < ld; c++) {
                        float mu = mode & 2 ? M[mode & 1 ? c % nv : r] : 0.0f;
                        float x = mu - (float)(1000.0 * tu_rng_uniform(&g_rng)); /* exponents 0 .. -180: some underflow */
                        if ((r + c) % 13 == 4) x = -INFINITY;
                        s1[r * ld + c] = s2[r * ld + c] = x;
                        d1[r * ld + c] = d2[r * ld + c] = rnd(1.0);
                    }
                const float *Mp = mode & 2 ? M : NULL;
                K->bwd_softmax(s1, d1, ld, rows, cols, cm, Mp, L, Dd, mode & 1);
                G->bwd_softmax(s2, d2, ld, rows, cols, cm, Mp, L, Dd, mode & 1);
                int bad = !gb_ok(&g1) || !gb_ok(&h1);
                for (size_t r = 0; r < rows; r++)
                    for (size_t c = 0; c < ld; c++) {
                        size_t at = r * ld + c;
                        if (c >= cols) {
                            bad |= !same_bits(s1[at], s2[at]) || !same_bits(d1[at], d2[at]);
                            continue;
                        }
                        bad |= !near(s1[at], s2[at], EXP_REL * fabsf(s2[at])) || (s1[at] == 0.0f) != (s2[at] == 0.0f);
                        bad |= !near(d1[at], d2[at], (EXP_REL + 4 * U) * fabsf(d2[at]) + 1e-37);
                    }
                CHECK(!bad, "bwd_softmax [%s] rows %zu cols %zu percol %d M %d", g_isa, rows, cols, mode & 1,
                      !!(mode & 2));
                gb_free(&g1); gb_free(&g2); gb_free(&h1); gb_free(&h2);
            }
}

static void test_exp2(const qkv_kernels *K, const qkv_kernels *G) {
    static const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -126.0f, -126.5f, -127.0f,
                                    -149.0f, -1000.0f, 127.0f, 128.0f, 200.0f, 1e30f, -1e30f, 0.5f};
    static const float want[] = {1.0f, 1.0f, INFINITY, 0.0f, NAN, 0x1p-126f, 0.0f, 0.0f,
                                 0.0f, 0.0f, 0x1p127f, INFINITY, INFINITY, INFINITY, 0.0f, 1.41421356f};
    for (size_t ni = 0; ni < NSIZES; ni++)
        for (int mis = 0; mis <= 1; mis++) {
            const size_t n = SIZES[ni];
            gbuf g1;
            float *x = fnew(&g1, n, mis), *y = malloc(n * sizeof(float));
            if (!y) exit(2);
            for (size_t i = 0; i < n; i++) x[i] = y[i] = (float)(-150.0 + 277.0 * tu_rng_uniform(&g_rng));
            for (size_t i = 0; i < n && i < sizeof special / sizeof special[0]; i++) x[(i * 7) % n] = y[(i * 7) % n] = special[i];
            K->exp2(x, n);
            G->exp2(y, n);
            int bad = !gb_ok(&g1);
            for (size_t i = 0; i < n; i++) {
                bad |= !near(x[i], y[i], EXP_REL * fabsf(y[i]));
                bad |= x[i] != 0.0f && fabsf(x[i]) < FLT_MIN; /* never a subnormal */
                bad |= x[i] == 0.0f && signbit(x[i]);         /* underflow gives +0 */
            }
            CHECK(!bad, "exp2 [%s] n %zu misaligned %d", g_isa, n, mis);
            gb_free(&g1);
            free(y);
        }
    float x[sizeof special / sizeof special[0]];
    memcpy(x, special, sizeof x);
    K->exp2(x, sizeof x / sizeof x[0]);
    for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) {
        int ok = isnan(want[i]) ? isnan(x[i]) : (want[i] == 0.0f || isinf(want[i]) || want[i] == 1.0f || want[i] == 0x1p-126f || want[i] == 0x1p127f)
                                                    ? same_bits(x[i], want[i])
                                                    : near(x[i], want[i], EXP_REL * want[i]);
        CHECK(ok, "exp2 [%s] of %g: %g, want %g", g_isa, (double)special[i], (double)x[i], (double)want[i]);
    }
}

static void test_scale_stream(const qkv_kernels *K, const qkv_kernels *G) {
    for (size_t off = 0; off < 16; off += 3)
        for (size_t ni = 0; ni < NSIZES; ni++) {
            const size_t n = SIZES[ni];
            gbuf gx, g1, g2;
            float *x = fnew(&gx, n, 1);
            float *o1 = gb_new(&g1, n * sizeof(float), off * 4), *o2 = gb_new(&g2, n * sizeof(float), off * 4);
            for (size_t i = 0; i < n; i++) x[i] = rnd(3.0);
            K->scale_stream(o1, x, 0.7310586f, n);
            K->stream_fence();
            G->scale_stream(o2, x, 0.7310586f, n);
            CHECK(memcmp(o1, o2, n * sizeof(float)) == 0 && gb_ok(&g1), "scale_stream [%s] offset %zu n %zu", g_isa,
                  off, n);
            gb_free(&gx); gb_free(&g1); gb_free(&g2);
        }
}

static void test_all_finite(const qkv_kernels *K, const qkv_kernels *G) {
    const float bad[] = {INFINITY, -INFINITY, NAN};
    for (size_t ni = 0; ni < NSIZES; ni++)
        for (int mis = 0; mis <= 1; mis++) {
            const size_t n = SIZES[ni];
            float buf[129 + 34];
            for (size_t i = 0; i < sizeof buf / sizeof buf[0]; i++) buf[i] = NAN; /* guards */
            float *x = buf + 16 + mis;
            for (size_t i = 0; i < n; i++) x[i] = i % 3 ? rnd(1.0) : i % 2 ? FLT_MAX : 1e-40f;
            CHECK(K->all_finite(x, n) == 1 && G->all_finite(x, n) == 1, "all_finite [%s] n %zu: finite", g_isa, n);
            for (size_t i = 0; i < n; i += 1 + n / 9) {
                float keep = x[i];
                x[i] = bad[i % 3];
                CHECK(K->all_finite(x, n) == G->all_finite(x, n), "all_finite [%s] n %zu: %g at %zu", g_isa, n,
                      (double)x[i], i);
                x[i] = keep;
            }
        }
}

/* scale_bias: bit for bit the generic's (one product in double rounded to
 * float, one float sum), with and without the bias, -inf / NaN in the bias
 * and the logits, large logits whose product rounds, unaligned pointers and
 * guards around x. Also against the formula itself. */
static void test_scale_bias(const qkv_kernels *K, const qkv_kernels *G) {
    static const double muls[] = {0.125, 0.18033688011112042, -1.7};
    for (size_t ni = 0; ni < NSIZES; ni++)
        for (int mode = 0; mode < 12; mode++) { /* mul muls[mode % 3], bias (mode / 3) % 2, misaligned mode / 6 */
            const size_t n = SIZES[ni];
            const double mul = muls[mode % 3];
            const int with_bias = mode / 3 % 2, mis = mode / 6;
            gbuf gx1, gx2, gb;
            float *x1 = fnew(&gx1, n, mis), *x2 = fnew(&gx2, n, mis), *b = fnew(&gb, n, !mis);
            for (size_t i = 0; i < n; i++) {
                x1[i] = x2[i] = i % 11 == 3 ? 3e38f : i % 13 == 5 ? NAN : rnd(20.0);
                b[i] = i % 7 == 2 ? -INFINITY : rnd(3.0);
            }
            K->scale_bias(x1, n, mul, with_bias ? b : NULL);
            G->scale_bias(x2, n, mul, with_bias ? b : NULL);
            int same = gb_ok(&gx1), formula = 1;
            for (size_t i = 0; i < n; i++) {
                uint32_t u1, u2;
                memcpy(&u1, x1 + i, 4);
                memcpy(&u2, x2 + i, 4);
                same &= u1 == u2 || (isnan(x1[i]) && isnan(x2[i]));
            }
            for (size_t i = 0; i < n; i++) {
                float x = i % 11 == 3 ? 3e38f : i % 13 == 5 ? NAN : 0.0f, want;
                if (i % 11 != 3 && i % 13 != 5) continue; /* random values: checked by the generic */
                want = (float)((double)x * mul);
                if (with_bias) want += b[i];
                formula &= isnan(want) ? isnan(x2[i]) : x2[i] == want;
            }
            CHECK(same, "scale_bias [%s] n %zu mul %g bias %d mis %d: not the generic's bits", g_isa, n, mul,
                  with_bias, mis);
            CHECK(formula, "scale_bias [generic] n %zu mul %g bias %d: not the formula", n, mul, with_bias);
            for (size_t i = 0; with_bias && i < n; i++)
                if (b[i] == -INFINITY && !isnan(x1[i])) CHECK(x1[i] == -INFINITY, "scale_bias [%s]: -inf lost", g_isa);
            gb_free(&gx1); gb_free(&gx2); gb_free(&gb);
        }
}

/* dropout: the factors and products bit for bit (integer hashing, one float
 * product), non-finite and signed-zero weights included; the gap between
 * cols and ld untouched; about 1 - p of the entries kept. */
static void test_dropout(const qkv_kernels *K, const qkv_kernels *G) {
    static const size_t rowc[] = {1, 2, 7, 8, 64};
    static const double ps[] = {0.1, 0.5, 0.9};
    for (size_t ci = 0; ci < NSIZES; ci++)
        for (size_t ri = 0; ri < 5; ri++)
            for (int mode = 0; mode < 6; mode++) { /* p = ps[mode / 2], y given = mode & 1 */
                const size_t cols = SIZES[ci], rows = rowc[ri], ld = cols + 3;
                const double p = ps[mode / 2];
                const uint64_t thr = (uint64_t)ceil(p * 0x1p53);
                const float scale = (float)(1.0 / (1.0 - p));
                gbuf g1, g2, h1, h2;
                float *x1 = fnew(&g1, rows * ld, 1), *x2 = fnew(&g2, rows * ld, 1);
                float *y1 = fnew(&h1, rows * ld, 0), *y2 = fnew(&h2, rows * ld, 0);
                uint64_t R[64], C[129];
                for (size_t r = 0; r < rows; r++) R[r] = tu_rng_u64(&g_rng);
                for (size_t c = 0; c < cols; c++) C[c] = tu_rng_u64(&g_rng);
                const float special[] = {NAN, INFINITY, -INFINITY, -0.0f, 0.0f};
                for (size_t i = 0; i < rows * ld; i++) {
                    x1[i] = x2[i] = i % 17 == 3 ? special[i / 17 % 5] : rnd(1.0);
                    y1[i] = y2[i] = -7.0f;
                }
                K->dropout(x1, mode & 1 ? y1 : NULL, ld, rows, cols, R, C, thr, scale);
                G->dropout(x2, mode & 1 ? y2 : NULL, ld, rows, cols, R, C, thr, scale);
                int bad = !gb_ok(&g1) || !gb_ok(&h1) || memcmp(x1, x2, rows * ld * sizeof(float)) != 0 ||
                          memcmp(y1, y2, rows * ld * sizeof(float)) != 0;
                size_t kept = 0;
                for (size_t r = 0; r < rows; r++)
                    for (size_t c = 0; c < ld; c++) {
                        float y = y2[r * ld + c];
                        if (c >= cols || !(mode & 1)) bad |= y != -7.0f;
                        else bad |= y != 0.0f && y != scale;
                        kept += c < cols && y == scale;
                    }
                CHECK(!bad, "dropout [%s] rows %zu cols %zu p %g y %d", g_isa, rows, cols, p, mode & 1);
                if ((mode & 1) && rows * cols >= 4000) {
                    double frac = (double)kept / (double)(rows * cols), sd = sqrt(p * (1 - p) / (double)(rows * cols));
                    CHECK(fabs(frac - (1 - p)) < 5 * sd, "dropout keeps %g of %zu entries, want %g", frac,
                          rows * cols, 1 - p);
                }
                gb_free(&g1); gb_free(&g2); gb_free(&h1); gb_free(&h2);
            }
}

/* ---- gemm micro-kernels: the ISA's MR x NR tile against the generic kernel
 * run over it, tile by tile, on the same (repacked) panels, for the float
 * kernel and the bf16 one (kernels/gemm.h). Panels are 32-bit words, floats
 * or bf16 pairs; kc counts words along K. For bf16, kc from SIZES is the
 * number of pairs, and half the cases end on an odd K (the last pair's
 * high halves zero, as the packing leaves them). -------------------------- */

typedef struct ukr_pair {
    int bf16;
    const qkv_gemm_kernel *K, *G;           /* float */
    const qkv_gemm_bf16_kernel *KB, *GB;    /* bf16 */
} ukr_pair;

static int ukr_mr(const ukr_pair *u, int gen) { return u->bf16 ? (gen ? u->GB : u->KB)->mr : (gen ? u->G : u->K)->mr; }
static int ukr_nr(const ukr_pair *u, int gen) { return u->bf16 ? (gen ? u->GB : u->KB)->nr : (gen ? u->G : u->K)->nr; }

/* A tile kernel (kstep > 1, a_rows, begin / end: kernels/gemm.h) gets the
 * same panels as its layout holds them: A row by row, kc2 padded with zero
 * pairs to its step, inside its begin and end. */
static void bf16_tile_call(const qkv_gemm_bf16_kernel *k, int64_t kc2, const uint32_t *ap, const uint32_t *bp,
                           float *c, int64_t ldc, float alpha, float beta, int m, int n) {
    const int64_t step = k->kstep > 1 ? k->kstep : 1, kp = (kc2 + step - 1) / step * step;
    uint32_t *a = calloc((size_t)(kp * k->mr), 4), *b = calloc((size_t)(kp * k->nr), 4);
    if (!a || !b) exit(2);
    for (int64_t t = 0; t < kc2; t++)
        for (int i = 0; i < k->mr; i++) a[k->a_rows ? (t - t % step) * k->mr + i * step + t % step : t * k->mr + i] = ap[t * k->mr + i];
    memcpy(b, bp, (size_t)(kc2 * k->nr) * 4);
    if (k->begin) k->begin();
    k->ukr(kp, a, b, c, ldc, alpha, beta, m, n);
    if (k->end) k->end();
    free(a);
    free(b);
}

static void ukr_call(const ukr_pair *u, int gen, int64_t kc, const void *ap, const void *bp, float *c, int64_t ldc,
                     float alpha, float beta, int m, int n) {
    const qkv_gemm_bf16_kernel *kb = u->bf16 ? (gen ? u->GB : u->KB) : NULL;
    if (kb && (kb->kstep > 1 || kb->a_rows || kb->begin))
        bf16_tile_call(kb, kc, ap, bp, c, ldc, alpha, beta, m, n);
    else if (kb)
        kb->ukr(kc, ap, bp, c, ldc, alpha, beta, m, n);
    else
        (gen ? u->G : u->K)->ukr(kc, ap, bp, c, ldc, alpha, beta, m, n);
}

/* Word w of a panel of width `from` (0 past it) into one of width `to`. */
static void repack(const void *src, int from, int off, void *dst, int to, int64_t kc) {
    const unsigned char *s = src;
    unsigned char *d = dst;
    for (int64_t p = 0; p < kc; p++)
        for (int i = 0; i < to; i++) {
            if (off + i < from) memcpy(d + 4 * (p * to + i), s + 4 * (p * from + off + i), 4);
            else memset(d + 4 * (p * to + i), 0, 4);
        }
}

static void generic_tile(const ukr_pair *u, int64_t kc, const void *ap, const void *bp, float *c, int64_t ldc,
                         float alpha, float beta, int m, int n) {
    const int mr = ukr_mr(u, 0), nr = ukr_nr(u, 0), gmr = ukr_mr(u, 1), gnr = ukr_nr(u, 1);
    void *a = calloc((size_t)(kc * gmr), 4), *b = calloc((size_t)(kc * gnr), 4);
    if (!a || !b) exit(2);
    for (int i0 = 0; i0 < m; i0 += gmr)
        for (int j0 = 0; j0 < n; j0 += gnr) {
            repack(ap, mr, i0, a, gmr, kc);
            repack(bp, nr, j0, b, gnr, kc);
            int mm = m - i0 < gmr ? m - i0 : gmr, nn = n - j0 < gnr ? n - j0 : gnr;
            ukr_call(u, 1, kc, a, b, c + i0 * ldc + j0, ldc, alpha, beta, mm, nn);
        }
    free(a);
    free(b);
}

static void test_ukr(const ukr_pair *u) {
    static const float alphas[] = {1.0f, -0.75f}, betas[] = {0.0f, 1.0f, 0.5f};
    const int MR = ukr_mr(u, 0), NR = ukr_nr(u, 0);
    const char *name = u->bf16 ? u->KB->name : u->K->name;
    const int ms[] = {1, 2, 3, MR - 1, MR}, ns[] = {1, 2, 3, 7, NR - 1, NR};
    for (size_t ki = 0; ki < NSIZES; ki++)
        for (int mi = 0; mi < 5; mi++)
            for (int ni = 0; ni < 6; ni++)
                for (int ab = 0; ab < 6; ab++) {
                    const int m = ms[mi], n = ns[ni];
                    const int64_t kc = (int64_t)SIZES[ki], ldc = NR + 3;
                    const float alpha = alphas[ab % 2], beta = betas[ab / 2];
                    gbuf ga, gb, g1, g2;
                    void *ap = gb_new(&ga, (size_t)(kc * MR) * 4, 0), *bp = gb_new(&gb, (size_t)(kc * NR) * 4, 0);
                    float *c1 = fnew(&g1, (size_t)(MR * ldc), 1), *c2 = fnew(&g2, (size_t)(MR * ldc), 1);
                    uint32_t *aw = ap, *bw = bp;
                    float *af = ap, *bf = bp;
                    for (int64_t i = 0; i < kc * MR; i++) {
                        if (u->bf16) aw[i] = rnd_pair(1.0);
                        else af[i] = rnd(1.0);
                    }
                    for (int64_t i = 0; i < kc * NR; i++) {
                        if (u->bf16) bw[i] = rnd_pair(1.0);
                        else bf[i] = rnd(1.0);
                    }
                    if (u->bf16 && ab % 2) /* an odd K: the last pair's high halves are zero */
                        for (int i = 0; i < MR; i++) aw[(kc - 1) * MR + i] &= 0xffffu;
                    for (int64_t i = 0; i < MR * ldc; i++) c1[i] = c2[i] = beta == 0.0f && i % 5 == 0 ? NAN : rnd(1.0);
                    ukr_call(u, 0, kc, ap, bp, c1, ldc, alpha, beta, m, n);
                    generic_tile(u, kc, ap, bp, c2, ldc, alpha, beta, m, n);
                    /* the sum's roundings: one per product (two per pair) */
                    const double steps = u->bf16 ? 2.0 * (double)kc : (double)kc;
                    int bad = !gb_ok(&g1), exact = 1;
                    for (int i = 0; i < MR; i++)
                        for (int j = 0; j < ldc; j++) {
                            float x = c1[i * ldc + j], y = c2[i * ldc + j];
                            if (i >= m || j >= n) {
                                bad |= !same_bits(x, y);
                                continue;
                            }
                            exact &= same_bits(x, y);
                            double mag = 0.0;
                            for (int64_t p = 0; p < kc; p++)
                                mag += u->bf16 ? pair_mag(aw[p * MR + i], bw[p * NR + j])
                                               : fabs((double)af[p * MR + i] * bf[p * NR + j]);
                            bad |= isnan(x) || !near(x, y, 2.0 * (steps + 3) * U * (mag + fabs(y)) + 1e-37);
                        }
                    if (u->bf16) g_bf16_gemm_exact &= exact;
                    CHECK(!bad, "gemm%s ukr [%s] kc %lld m %d n %d alpha %g beta %g", u->bf16 ? " bf16" : "", name,
                          (long long)kc, m, n, (double)alpha, (double)beta);
                    gb_free(&ga); gb_free(&gb); gb_free(&g1); gb_free(&g2);
                }
}

/* few_rows (when the table has it) against the generic one: every m and n
 * of one call, awkward K, guards around the output. */
static void test_few_rows_kernel(const qkv_gemm_kernel *K, const qkv_gemm_kernel *G) {
    if (!K->few_rows) return;
    for (size_t ki = 0; ki < NSIZES; ki++) {
        size_t k = SIZES[ki], lda = k + 3, ldb = k + 1, ldc = QKV_GEMM_FEW_N + 2;
        float *a = malloc(QKV_GEMM_FEW_M * lda * sizeof *a), *b = malloc(QKV_GEMM_FEW_N * ldb * sizeof *b);
        float bias[QKV_GEMM_FEW_N];
        for (size_t i = 0; i < QKV_GEMM_FEW_M * lda; i++) a[i] = rnd(1.0);
        for (size_t i = 0; i < QKV_GEMM_FEW_N * ldb; i++) b[i] = rnd(1.0);
        for (int j = 0; j < QKV_GEMM_FEW_N; j++) bias[j] = rnd(1.0);
        for (int add = 0; add < 2; add++)
            for (int m = 1; m <= QKV_GEMM_FEW_M; m++)
                for (int n = 1; n <= QKV_GEMM_FEW_N; n++) {
                    gbuf gc;
                    float *c = fnew(&gc, (size_t)m * ldc, 1), d[QKV_GEMM_FEW_M * (QKV_GEMM_FEW_N + 2)];
                    const float *bb = (m + n) % 2 ? bias : NULL;
                    if (add) /* c += the sums: the same start in c and d */
                        for (int i = 0; i < m; i++)
                            for (int j = 0; j < n; j++) c[i * ldc + j] = d[i * ldc + j] = rnd(1.0);
                    K->few_rows((int64_t)k, a, (int64_t)lda, b, (int64_t)ldb, c, (int64_t)ldc, bb, add, m, n);
                    G->few_rows((int64_t)k, a, (int64_t)lda, b, (int64_t)ldb, d, (int64_t)ldc, bb, add, m, n);
                    int ok = 1;
                    for (int i = 0; i < m; i++)
                        for (int j = 0; j < n; j++) {
                            double mag = (bb ? fabs(bb[j]) : 0) + (add ? fabs(d[i * ldc + j]) : 0);
                            for (size_t p = 0; p < k; p++) mag += fabs((double)a[i * lda + p] * b[j * ldb + p]);
                            ok &= fabs(c[i * ldc + j] - d[i * ldc + j]) <= 2.0 * (double)(k + 3) * U * mag;
                        }
                    CHECK(ok && gb_ok(&gc), "%s few_rows k=%zu m=%d n=%d add=%d: within the sum bound, guards", g_isa,
                          k, m, n, add);
                    gb_free(&gc);
                }
        free(a);
        free(b);
    }
}

static void test_gemm(const qkv_gemm_kernel *K, const qkv_gemm_kernel *G) {
    const ukr_pair u = {0, K, G, NULL, NULL};
    test_ukr(&u);
    test_few_rows_kernel(K, G);
    if (!K->pack_t) return;
    for (size_t ki = 0; ki < NSIZES; ki++)
        for (int wi = 0; wi < 2; wi++) {
            const int w = wi ? K->nr : K->mr;
            const int64_t kc = (int64_t)SIZES[ki], ld = kc + 3;
            gbuf gs, gd;
            float *src = fnew(&gs, (size_t)(w * ld), 1), *dst = fnew(&gd, (size_t)(kc * w), 0);
            for (int64_t i = 0; i < w * ld; i++) src[i] = rnd(1.0);
            K->pack_t(src, ld, kc, w, dst);
            int bad = !gb_ok(&gd);
            for (int64_t p = 0; p < kc; p++)
                for (int i = 0; i < w; i++) bad |= !same_bits(dst[p * w + i], src[i * ld + p]);
            CHECK(!bad, "gemm pack_t [%s] kc %lld w %d", K->name, (long long)kc, w);
            gb_free(&gs); gb_free(&gd);
        }
}

/* ---- bf16 matmul: the tile as above, then the SIMD packings exactly
 * against the portable rounding ------------------------------------------- */

static void test_gemm_bf16(const qkv_gemm_bf16_kernel *K, const qkv_gemm_bf16_kernel *G) {
    const ukr_pair u = {1, NULL, NULL, K, G};
    test_ukr(&u);
    /* the packings (whole panels of width MR and NR), exactly */
    for (int hook = 0; hook < 2; hook++) {
        void (*f)(const float *, int64_t, int64_t, int, uint32_t *) = hook ? K->pack_pairs_rows : K->pack_pairs_t;
        if (!f) continue;
        for (size_t ki = 0; ki < NSIZES; ki++)
            for (int wi = 0; wi < 2; wi++) {
                const int w = wi ? K->nr : K->mr;
                const int64_t kc = (int64_t)SIZES[ki], kc2 = (kc + 1) / 2;
                const int64_t ld = hook ? w + 3 : kc + 3, rows = hook ? kc : w;
                gbuf gs, gd;
                float *src = fnew(&gs, (size_t)(rows * ld), 1);
                uint32_t *dst = gb_new(&gd, (size_t)(kc2 * w) * 4, 0);
                for (int64_t i = 0; i < rows * ld; i++) src[i] = i % 23 == 7 ? -INFINITY : rnd(2.0);
                f(src, ld, kc, w, dst);
                int bad = !gb_ok(&gd) || !gb_ok(&gs);
                for (int64_t t = 0; t < kc2; t++)
                    for (int i = 0; i < w; i++) {
                        float lo = hook ? src[2 * t * ld + i] : src[i * ld + 2 * t];
                        float hi = 2 * t + 1 < kc ? (hook ? src[(2 * t + 1) * ld + i] : src[i * ld + 2 * t + 1]) : 0.0f;
                        uint32_t want = (uint32_t)qkv_f32_to_bf16(lo) | ((uint32_t)qkv_f32_to_bf16(hi) << 16);
                        bad |= dst[t * w + i] != want;
                    }
                CHECK(!bad, "gemm bf16 %s [%s] kc %lld w %d", hook ? "pack_pairs_rows" : "pack_pairs_t", K->name,
                      (long long)kc, w);
                gb_free(&gs); gb_free(&gd);
            }
    }
    /* a tile kernel's A panels row by row, kc2 padded to its step, exactly */
    if (K->pack_a_rows) {
        const int64_t step = K->kstep > 1 ? K->kstep : 1;
        for (size_t ki = 0; ki < NSIZES; ki++)
            for (int w = 1; w <= K->mr; w += w < 3 ? 1 : 13) {
                const int64_t kc = (int64_t)SIZES[ki], kc2 = (kc + 1) / 2, kp = (kc2 + step - 1) / step * step;
                const int64_t ld = kc + 5;
                gbuf gs, gd;
                float *src = fnew(&gs, (size_t)(w * ld), 1);
                uint32_t *dst = gb_new(&gd, (size_t)(kp * K->mr) * 4, 0);
                for (int64_t i = 0; i < w * ld; i++) src[i] = i % 19 == 4 ? NAN : rnd(2.0);
                K->pack_a_rows(src, ld, kc, w, kp, dst);
                int bad = !gb_ok(&gd) || !gb_ok(&gs);
                for (int i = 0; i < K->mr; i++)
                    for (int64_t t = 0; t < kp; t++) {
                        float lo = i < w && t < kc2 ? src[i * ld + 2 * t] : 0.0f;
                        float hi = i < w && 2 * t + 1 < kc ? src[i * ld + 2 * t + 1] : 0.0f;
                        uint32_t want = (uint32_t)qkv_f32_to_bf16(lo) | ((uint32_t)qkv_f32_to_bf16(hi) << 16);
                        bad |= dst[(t - t % step) * K->mr + i * step + t % step] != want;
                    }
                CHECK(!bad, "gemm bf16 pack_a_rows [%s] kc %lld w %d", K->name, (long long)kc, w);
                gb_free(&gs); gb_free(&gd);
            }
    }
}

/* ---- KV decode ----------------------------------------------------------- */

static void test_kv(const kv_kernels *K, const kv_kernels *G) {
    for (size_t di = 0; di < NSIZES; di++)
        for (size_t ni = 0; ni < NSIZES; ni++)
            for (int st = 0; st < 3; st++) { /* f32, bf16, int8 */
                const size_t D = SIZES[di], n = SIZES[ni], ld = D + 3, nb = (D + KV_BLOCK - 1) / KV_BLOCK, lds = nb + 1;
                gbuf gq, gk, gs, g1, g2, go1, go2, gp;
                float *q = fnew(&gq, D, 1), *sc = fnew(&gs, n * lds, 1), *p = fnew(&gp, n, 1);
                void *k = gb_new(&gk, n * ld * 4, st == 0 ? 4 : st == 1 ? 2 : 1); /* off alignment */
                float *s1 = fnew(&g1, n, 1), *s2 = fnew(&g2, n, 1), *o1 = fnew(&go1, D, 1), *o2 = fnew(&go2, D, 1);
                float *kf = k;
                uint16_t *kb = k;
                int8_t *k8 = k;
                /* the values each element stands for, for the magnitudes */
                double *val = malloc(n * D * sizeof(double));
                if (!val) exit(2);
                for (size_t i = 0; i < n * lds; i++) sc[i] = (float)(0.01 + 0.02 * tu_rng_uniform(&g_rng));
                for (size_t j = 0; j < n; j++)
                    for (size_t d = 0; d < D; d++) {
                        float x = rnd(1.0);
                        if (st == 0) val[j * D + d] = kf[j * ld + d] = x;
                        else if (st == 1) val[j * D + d] = qkv_bf16_to_f32(kb[j * ld + d] = qkv_f32_to_bf16(x));
                        else val[j * D + d] = (k8[j * ld + d] = (int8_t)((int)(tu_rng_u64(&g_rng) % 255) - 127)) * (double)sc[j * lds + d / KV_BLOCK];
                    }
                for (size_t d = 0; d < D; d++) q[d] = rnd(1.0);
                for (size_t j = 0; j < n; j++) p[j] = (float)tu_rng_uniform(&g_rng);
                for (size_t d = 0; d < D; d++) o1[d] = o2[d] = rnd(1.0);
                if (st == 0) {
                    K->qk_f32(q, kf, ld, D, n, s1); G->qk_f32(q, kf, ld, D, n, s2);
                    K->pv_f32(o1, p, kf, ld, D, n); G->pv_f32(o2, p, kf, ld, D, n);
                } else if (st == 1) {
                    K->qk_bf16(q, kb, ld, D, n, s1); G->qk_bf16(q, kb, ld, D, n, s2);
                    K->pv_bf16(o1, p, kb, ld, D, n); G->pv_bf16(o2, p, kb, ld, D, n);
                } else {
                    K->qk_i8(q, k8, ld, sc, lds, D, n, s1); G->qk_i8(q, k8, ld, sc, lds, D, n, s2);
                    K->pv_i8(o1, p, k8, ld, sc, lds, D, n); G->pv_i8(o2, p, k8, ld, sc, lds, D, n);
                }
                int bad = !gb_ok(&g1) || !gb_ok(&go1);
                for (size_t j = 0; j < n; j++) {
                    double mag = 0.0;
                    for (size_t d = 0; d < D; d++) mag += fabs(q[d] * val[j * D + d]);
                    bad |= !near(s1[j], s2[j], 2.0 * (D + 3) * U * mag);
                }
                for (size_t d = 0; d < D; d++) {
                    double mag = fabs((double)o2[d]);
                    for (size_t j = 0; j < n; j++) mag += fabs(p[j] * val[j * D + d]);
                    bad |= !near(o1[d], o2[d], 2.0 * (n + KV_BLOCK + 3) * U * mag);
                }
                CHECK(!bad, "kv %s [%s] D %zu n %zu", st == 0 ? "f32" : st == 1 ? "bf16" : "int8", K->name, D, n);
                free(val);
                gb_free(&gq); gb_free(&gk); gb_free(&gs); gb_free(&g1); gb_free(&g2);
                gb_free(&go1); gb_free(&go2); gb_free(&gp);
            }
}

/* ---- bf16 kernels -------------------------------------------------------- */

static uint32_t rnd_pair(double sd) {
    return (uint32_t)qkv_f32_to_bf16(rnd(sd)) | ((uint32_t)qkv_f32_to_bf16(rnd(sd)) << 16);
}

static double pair_mag(uint32_t a, uint32_t b) {
    return fabs((double)qkv_bf16_to_f32((uint16_t)a) * qkv_bf16_to_f32((uint16_t)b)) +
           fabs((double)qkv_bf16_to_f32((uint16_t)(a >> 16)) * qkv_bf16_to_f32((uint16_t)(b >> 16)));
}

static void test_half_qk(const qkv_half_kernels *K, const qkv_half_kernels *G) {
    for (size_t di = 0; di < NSIZES; di++)
        for (size_t npan = 1; npan <= 5; npan += 2)
            for (int acc = 0; acc <= 1; acc++) {
                const size_t dp2 = (SIZES[di] + 1) / 2, rows = 8 * (1 + di % 3), ldq = dp2 + 1, lds = 32 * npan + 3;
                gbuf gq, gk, g1, g2;
                uint32_t *qp = gb_new(&gq, rows * ldq * 4, 4), *kp = gb_new(&gk, npan * dp2 * 32 * 4, 0);
                float *s1 = fnew(&g1, rows * lds, 1), *s2 = fnew(&g2, rows * lds, 1);
                for (size_t i = 0; i < rows * ldq; i++) qp[i] = rnd_pair(1.0);
                for (size_t i = 0; i < npan * dp2 * 32; i++) kp[i] = rnd_pair(1.0);
                for (size_t i = 0; i < rows * lds; i++) s1[i] = s2[i] = rnd(1.0);
                (acc ? K->qk_acc : K->qk)(qp, ldq, kp, dp2, rows, npan, s1, lds);
                (acc ? G->qk_acc : G->qk)(qp, ldq, kp, dp2, rows, npan, s2, lds);
                int bad = !gb_ok(&g1);
                for (size_t r = 0; r < rows; r++)
                    for (size_t c = 0; c < lds; c++) {
                        if (c >= 32 * npan) {
                            bad |= !same_bits(s1[r * lds + c], s2[r * lds + c]);
                            continue;
                        }
                        double mag = acc ? fabs((double)s2[r * lds + c]) : 0.0;
                        for (size_t t = 0; t < dp2; t++) mag += pair_mag(qp[r * ldq + t], kp[((c / 32) * dp2 + t) * 32 + c % 32]);
                        bad |= !near(s1[r * lds + c], s2[r * lds + c], 2.0 * (2 * dp2 + 3) * U * mag + 1e-37);
                    }
                CHECK(!bad, "bf16 qk%s [%s] dp2 %zu rows %zu panels %zu", acc ? "_acc" : "", g_isa, dp2, rows, npan);
                gb_free(&gq); gb_free(&gk); gb_free(&g1); gb_free(&g2);
            }
}

static void test_half_pv(const qkv_half_kernels *K, const qkv_half_kernels *G) {
    /* every column remainder (16 .. 48 past the blocks of 64) and row
     * counts on both sides of the kernels' row groups (8, 4, 2, 1) */
    static const size_t ROWS[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 13, 16, 19};
    for (size_t ni = 0; ni < NSIZES; ni++)
        for (size_t dvp = 16; dvp <= 144; dvp += 16)
            for (size_t ri = 0; ri < sizeof ROWS / sizeof ROWS[0]; ri++)
                for (int acc = 0; acc <= 1; acc++) {
                    const size_t rows = ROWS[ri];
                    if (!acc && rows > 4) continue; /* pv: 1..4 rows */
                    const size_t nu = SIZES[ni], u0 = acc ? 0 : nu / 3, ldp = nu + 1, ldv = dvp + 16, ldo = dvp + 5;
                    gbuf gp, gv, g1, g2;
                    uint32_t *pp = gb_new(&gp, rows * ldp * 4, 4), *vp = gb_new(&gv, nu * ldv * 4, 0);
                    float *o1 = fnew(&g1, rows * ldo, 1), *o2 = fnew(&g2, rows * ldo, 1);
                    for (size_t i = 0; i < rows * ldp; i++) pp[i] = rnd_pair(1.0);
                    for (size_t i = 0; i < nu * ldv; i++) vp[i] = rnd_pair(1.0);
                    for (size_t i = 0; i < rows * ldo; i++) o1[i] = o2[i] = rnd(1.0);
                    if (acc) {
                        K->pv_acc(o1, ldo, pp, ldp, vp, ldv, nu, dvp, rows);
                        G->pv_acc(o2, ldo, pp, ldp, vp, ldv, nu, dvp, rows);
                    } else {
                        K->pv(o1, ldo, pp, ldp, vp, ldv, u0, nu, dvp, rows);
                        G->pv(o2, ldo, pp, ldp, vp, ldv, u0, nu, dvp, rows);
                    }
                    int bad = !gb_ok(&g1);
                    for (size_t r = 0; r < rows; r++)
                        for (size_t c = 0; c < ldo; c++) {
                            if (c >= dvp) {
                                bad |= !same_bits(o1[r * ldo + c], o2[r * ldo + c]);
                                continue;
                            }
                            double mag = fabs((double)o2[r * ldo + c]);
                            for (size_t u = u0; u < nu; u++) mag += pair_mag(pp[r * ldp + u], vp[u * ldv + c]);
                            bad |= !near(o1[r * ldo + c], o2[r * ldo + c], 2.0 * (2 * nu + 3) * U * mag);
                        }
                    CHECK(!bad, "bf16 pv%s [%s] pairs %zu dvp %zu rows %zu", acc ? "_acc" : "", g_isa, nu, dvp, rows);
                    gb_free(&gp); gb_free(&gv); gb_free(&g1); gb_free(&g2);
                }
}

static void test_half_packs(const qkv_half_kernels *K, const qkv_half_kernels *G) {
    for (size_t ni = 0; ni < NSIZES; ni++)
        for (size_t rows = 1; rows <= 9; rows += 4) {
            const size_t npairs = SIZES[ni], lds = 2 * npairs + 3, ldp = npairs + 2;
            gbuf gs, g1, g2;
            float *p = fnew(&gs, rows * lds, 1);
            uint32_t *a = gb_new(&g1, rows * ldp * 4, 4), *b = gb_new(&g2, rows * ldp * 4, 4);
            for (size_t i = 0; i < rows * lds; i++) p[i] = i % 17 == 3 ? -INFINITY : rnd(2.0);
            K->pack_p(a, ldp, p, lds, rows, npairs);
            G->pack_p(b, ldp, p, lds, rows, npairs);
            CHECK(memcmp(a, b, rows * ldp * 4) == 0 && gb_ok(&g1), "bf16 pack_p [%s] pairs %zu rows %zu", g_isa, npairs,
                  rows);
            gb_free(&gs); gb_free(&g1); gb_free(&g2);
        }
    for (size_t ni = 0; ni < NSIZES; ni++)
        for (size_t npan = 1; npan <= 3; npan++) {
            const size_t npairs = SIZES[ni], ldx = 32 * npan + 5;
            gbuf gs, g1, g2;
            float *x = fnew(&gs, 2 * npairs * ldx, 1);
            uint32_t *a = gb_new(&g1, npan * npairs * 32 * 4, 0), *b = gb_new(&g2, npan * npairs * 32 * 4, 0);
            for (size_t i = 0; i < 2 * npairs * ldx; i++) x[i] = rnd(2.0);
            K->pack_rowpairs(a, x, ldx, npairs, npan);
            G->pack_rowpairs(b, x, ldx, npairs, npan);
            CHECK(memcmp(a, b, npan * npairs * 32 * 4) == 0 && gb_ok(&g1), "bf16 pack_rowpairs [%s] pairs %zu panels %zu",
                  g_isa, npairs, npan);
            gb_free(&gs); gb_free(&g1); gb_free(&g2);
        }
}

/* The backward's data movement: words_t and interleave on random bit
 * patterns (NaN and subnormal patterns included), dq_out on floats with
 * NaN, infinities, subnormals and rounding ties; all bitwise the generic's,
 * nothing written outside the stated elements. */
static void test_half_moves(const qkv_half_kernels *K, const qkv_half_kernels *G) {
    static const size_t DIMS[] = {1, 2, 7, 16, 17, 31, 33, 64, 65};
    const size_t nd = sizeof DIMS / sizeof DIMS[0];
    for (size_t ri = 0; ri < nd; ri++)
        for (size_t ci = 0; ci < nd; ci++) {
            const size_t rows = DIMS[ri], cols = DIMS[ci], lds = cols + 3, ldd = rows + 5;
            uint32_t *src = malloc(rows * lds * 4);
            gbuf g1, g2;
            uint32_t *a = gb_new(&g1, cols * ldd * 4, 4), *b = gb_new(&g2, cols * ldd * 4, 4);
            for (size_t i = 0; i < rows * lds; i++) src[i] = (uint32_t)tu_rng_u64(&g_rng);
            memset(a, 0x5a, cols * ldd * 4);
            memset(b, 0x5a, cols * ldd * 4);
            K->words_t(a, ldd, src, lds, rows, cols);
            G->words_t(b, ldd, src, lds, rows, cols);
            CHECK(memcmp(a, b, cols * ldd * 4) == 0 && gb_ok(&g1), "bf16 words_t [%s] %zu x %zu", g_isa, rows, cols);
            gb_free(&g1); gb_free(&g2);
            free(src);
        }
    for (size_t ni = 0; ni < nd; ni++)
        for (int with_b = 0; with_b < 2; with_b++) {
            const size_t n = DIMS[ni] + (ni > 4 ? 32 : 0);
            uint16_t *x = malloc(2 * n * 2);
            for (size_t i = 0; i < 2 * n; i++) x[i] = (uint16_t)tu_rng_u64(&g_rng);
            gbuf g1, g2;
            uint32_t *a = gb_new(&g1, n * 4, 4), *b = gb_new(&g2, n * 4, 0);
            K->interleave(a, x, with_b ? x + n : NULL, n);
            G->interleave(b, x, with_b ? x + n : NULL, n);
            CHECK(memcmp(a, b, n * 4) == 0 && gb_ok(&g1), "bf16 interleave [%s] n %zu b %d", g_isa, n, with_b);
            gb_free(&g1); gb_free(&g2);
            free(x);
        }
    static const float special[] = {NAN, INFINITY, -INFINITY, 1e-40f, -3e-39f, 0.0f, -0.0f, 1.00390625f, 3e38f};
    for (size_t ri = 0; ri < nd; ri++)
        for (size_t ci = 0; ci < nd; ci++)
            for (size_t chunks = 1; chunks <= 4; chunks += 3) {
                const size_t rows = DIMS[ri], cols = DIMS[ci], lds = cols + 2, cst = rows * lds + 7, ldd = rows + 3;
                float *src = malloc(chunks * cst * 4);
                for (size_t i = 0; i < chunks * cst; i++)
                    src[i] = i % 23 == 5 ? special[(i / 23) % 9] : (float)(rnd(1.0) * (i % 3 ? 1.0 : 1e-37));
                gbuf g1, g2;
                uint16_t *a = gb_new(&g1, cols * ldd * 2, 2), *b = gb_new(&g2, cols * ldd * 2, 0);
                memset(a, 0x33, cols * ldd * 2);
                memset(b, 0x33, cols * ldd * 2);
                const double scale = ci & 1 ? 0.125 : 0.3535533905932738;
                K->dq_out(a, ldd, src, lds, cst, chunks, rows, cols, scale);
                G->dq_out(b, ldd, src, lds, cst, chunks, rows, cols, scale);
                CHECK(memcmp(a, b, cols * ldd * 2) == 0 && gb_ok(&g1), "bf16 dq_out [%s] %zu x %zu chunks %zu", g_isa,
                      rows, cols, chunks);
                gb_free(&g1); gb_free(&g2);
                free(src);
            }
}

/* bf16 values of two packings of P: both 0, or within one bf16 step (the
 * unrounded values agree to EXP_REL, so their roundings are at most one
 * step apart). */
static int pair_near(uint32_t a, uint32_t b) {
    for (int h = 0; h < 2; h++) {
        float x = qkv_bf16_to_f32((uint16_t)(h ? a >> 16 : a & 0xffffu));
        float y = qkv_bf16_to_f32((uint16_t)(h ? b >> 16 : b & 0xffffu));
        if ((x == 0.0f) != (y == 0.0f) || !(fabsf(x - y) <= 0x1p-7f * fabsf(y))) return 0;
    }
    return 1;
}

static void test_half_softmax_pack(const qkv_half_kernels *K, const qkv_half_kernels *G) {
    static const size_t rowc[] = {1, 2, 7, 8, 15, 16, 17};
    for (size_t ci = 0; ci < NSIZES; ci++)
        for (size_t ri = 0; ri < 7; ri++)
            for (int online = 0; online <= 1; online++) {
                const size_t cols = SIZES[ci], rows = rowc[ri], lds = cols + 1, np = (cols + 1) / 2, ldp = np + 2;
                const size_t dvp = 16 * (1 + ri % 3), ldo = dvp + 3;
                const float cm = 1.4426950f * 0.125f;
                gbuf gs, gc, g1, g2, h1, h2;
                float *sv = fnew(&gs, rows * lds, 1), *sc = fnew(&gc, rows * lds, 1);
                float *o1 = fnew(&h1, rows * ldo, 1), *o2 = fnew(&h2, rows * ldo, 1);
                uint32_t *p1 = gb_new(&g1, rows * ldp * 4, 4), *p2 = gb_new(&g2, rows * ldp * 4, 4);
                memset(p1, 0x5A, rows * ldp * 4);
                memset(p2, 0x5A, rows * ldp * 4);
                float m1[17], m2[17], l1[17], l2[17];
                for (size_t r = 0; r < rows; r++) {
                    for (size_t c = 0; c < lds; c++) {
                        float x = rnd(30.0);
                        if (r % 5 == 3 || tu_rng_uniform(&g_rng) < 0.2) x = -INFINITY; /* masked; some rows all */
                        if (c == 1 && r % 7 == 2) x = -2000.0f;                          /* below 2^-126 */
                        sv[r * lds + c] = sc[r * lds + c] = x;
                    }
                    m1[r] = m2[r] = online && r % 3 ? rnd(30.0) : -INFINITY;
                    l1[r] = l2[r] = m1[r] == -INFINITY ? 0.0f : 1.0f + (float)tu_rng_uniform(&g_rng);
                    for (size_t c = 0; c < ldo; c++) o1[r * ldo + c] = o2[r * ldo + c] = rnd(1.0);
                }
                K->softmax_pack(sv, lds, rows, cols, cm, m1, l1, o1, ldo, dvp, p1, ldp);
                G->softmax_pack(sv, lds, rows, cols, cm, m2, l2, o2, ldo, dvp, p2, ldp);
                int bad = !gb_ok(&gs) || !gb_ok(&g1) || !gb_ok(&h1) || memcmp(sv, sc, rows * lds * 4) != 0;
                for (size_t r = 0; r < rows; r++) {
                    bad |= !same_bits(m1[r], m2[r]);
                    bad |= !near(l1[r], l2[r], (EXP_REL + 2.0 * (cols + 3) * U) * fabsf(l2[r]));
                    for (size_t c = 0; c < ldo; c++)
                        bad |= c < dvp ? !near(o1[r * ldo + c], o2[r * ldo + c], (EXP_REL + U) * fabsf(o2[r * ldo + c]))
                                       : !same_bits(o1[r * ldo + c], o2[r * ldo + c]);
                    for (size_t u = 0; u < ldp; u++)
                        bad |= u < np ? !pair_near(p1[r * ldp + u], p2[r * ldp + u])
                                      : p1[r * ldp + u] != 0x5A5A5A5Au;
                    if (cols % 2) bad |= (p1[r * ldp + np - 1] >> 16) != 0; /* the column past an odd cols */
                }
                CHECK(!bad, "bf16 softmax_pack [%s] rows %zu cols %zu online %d", g_isa, rows, cols, online);
                gb_free(&gs); gb_free(&gc); gb_free(&g1); gb_free(&g2); gb_free(&h1); gb_free(&h2);
            }
}

static void test_half_bwd_softmax(const qkv_half_kernels *K, const qkv_half_kernels *G) {
    for (size_t ci = 0; ci < NSIZES; ci++)
        for (size_t rows = 1; rows <= 17; rows += 8) {
            const size_t cols = SIZES[ci], ld = cols + 2;
            const float cm = 1.4426950f * 0.125f;
            gbuf g1, g2, h1, h2;
            float *s1 = fnew(&g1, rows * ld, 1), *s2 = fnew(&g2, rows * ld, 1);
            float *d1 = fnew(&h1, rows * ld, 1), *d2 = fnew(&h2, rows * ld, 1);
            float L2[129], Dd[129];
            for (size_t c = 0; c < cols; c++) {
                L2[c] = c % 11 == 5 ? INFINITY : (float)(5.0 * tu_rng_uniform(&g_rng));
                Dd[c] = rnd(1.0);
            }
            for (size_t i = 0; i < rows * ld; i++) {
                s1[i] = s2[i] = i % 13 == 4 ? -INFINITY : (float)(-1400.0 * tu_rng_uniform(&g_rng) + 40.0);
                d1[i] = d2[i] = rnd(1.0);
            }
            K->bwd_softmax(s1, d1, ld, rows, cols, cm, L2, Dd);
            G->bwd_softmax(s2, d2, ld, rows, cols, cm, L2, Dd);
            int bad = !gb_ok(&g1) || !gb_ok(&h1);
            for (size_t r = 0; r < rows; r++)
                for (size_t c = 0; c < ld; c++) {
                    size_t at = r * ld + c;
                    if (c >= cols) {
                        bad |= !same_bits(s1[at], s2[at]) || !same_bits(d1[at], d2[at]);
                        continue;
                    }
                    bad |= !near(s1[at], s2[at], EXP_REL * fabsf(s2[at])) || (s1[at] == 0.0f) != (s2[at] == 0.0f);
                    bad |= !near(d1[at], d2[at], (EXP_REL + 4 * U) * fabsf(d2[at]) + 1e-37);
                }
            CHECK(!bad, "bf16 bwd_softmax [%s] rows %zu cols %zu", g_isa, rows, cols);
            gb_free(&g1); gb_free(&g2); gb_free(&h1); gb_free(&h2);
        }
}

/* ---- layer rows (kernels/nn.h) ------------------------------------------- */

/* bias_act: values over the activations' whole range (|x| up to 12, where
 * GELU's lower tail is below 1e-30), tails and special values; within
 * 6e-7 |y| + 1e-12 of the generic (libm in double; kernels/nn.h), and NaN,
 * +-inf, +-0 as the generic gives them. */
static void test_nn_bias_act(const qkv_nn_kernels *K, const qkv_nn_kernels *G) {
    static const float special[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 1.0f, -1.0f, 1.4142135f, -1.4142135f};
    for (int act = QKV_NN_ACT_NONE; act <= QKV_NN_ACT_RELU; act++)
        for (size_t si = 0; si < NSIZES; si++)
            for (int mis = 0; mis < 2; mis++) {
                size_t n = SIZES[si] + 8;
                gbuf gy, gb;
                float *y = fnew(&gy, n, mis), *b = fnew(&gb, n, mis), *w = malloc(n * sizeof *w);
                for (size_t i = 0; i < n; i++) {
                    y[i] = (float)((tu_rng_uniform(&g_rng) * 2 - 1) * (si & 1 ? 12.0 : 3.0));
                    b[i] = rnd(0.1);
                }
                for (size_t i = 0; i < 8 && i < n; i++) y[n - 1 - i] = special[i];
                int use_b = (int)(si % 3 != 0);
                if (!use_b)
                    for (size_t i = 0; i < n; i++) b[i] = 0.0f;
                memcpy(w, y, n * sizeof *w);
                G->bias_act(w, n, 1, b, n, act);
                K->bias_act(y, n, 1, use_b ? b : NULL, n, act);
                if (use_b && act == QKV_NN_ACT_NONE) { /* a sum: one rounding, exact */
                    for (size_t i = 0; i < n; i++)
                        if (!same_bits(y[i], w[i])) CHECK(0, "%s bias_act none n=%zu [%zu]", g_isa, n, i);
                }
                for (size_t i = 0; i < n; i++) {
                    double tol = 6e-7 * fabs(w[i]) + 1e-12;
                    int ok = isnan(w[i]) ? isnan(y[i]) : (isinf(w[i]) ? y[i] == w[i] : fabs(y[i] - w[i]) <= tol);
                    if (!ok) {
                        CHECK(0, "%s bias_act act=%d n=%zu [%zu]: %.9g, generic %.9g", g_isa, act, n, i, y[i], w[i]);
                        break;
                    }
                }
                CHECK(gb_ok(&gy) && gb_ok(&gb), "%s bias_act act=%d n=%zu: nothing outside the row", g_isa, act, n);
                gb_free(&gy);
                gb_free(&gb);
                free(w);
            }
    /* several rows in one call, apart by ldy > n: each row as a call of
     * its own gives it, bitwise; the gaps between the rows untouched */
    for (int act = QKV_NN_ACT_NONE; act <= QKV_NN_ACT_RELU; act++)
        for (size_t si = 0; si < NSIZES; si++) {
            const size_t n = SIZES[si], rows = 5, ldy = n + 3 + si % 5;
            const float gap = -1234.5f;
            gbuf gy;
            float *y = fnew(&gy, rows * ldy, 0), *w = malloc(rows * ldy * sizeof *w), *b = malloc(n * sizeof *b);
            for (size_t i = 0; i < rows * ldy; i++)
                y[i] = i % ldy < n ? (float)((tu_rng_uniform(&g_rng) * 2 - 1) * 6.0) : gap;
            for (size_t i = 0; i < n; i++) b[i] = rnd(0.1);
            memcpy(w, y, rows * ldy * sizeof *w);
            const float *bias = si & 1 ? b : NULL;
            K->bias_act(y, ldy, rows, bias, n, act);
            for (size_t r = 0; r < rows; r++) K->bias_act(w + r * ldy, n, 1, bias, n, act);
            int bad = 0;
            for (size_t i = 0; i < rows * ldy && !bad; i++)
                bad = !same_bits(y[i], w[i]) || (i % ldy >= n && y[i] != gap);
            CHECK(!bad, "%s bias_act act=%d n=%zu: %zu rows apart by %zu in one call differ from row calls", g_isa, act,
                  n, rows, ldy);
            CHECK(gb_ok(&gy), "%s bias_act act=%d n=%zu: nothing outside the rows", g_isa, act, n);
            gb_free(&gy);
            free(w);
            free(b);
        }
    /* the special values of the activations */
    const float nan = NAN, inf = INFINITY;
    float v[4] = {nan, inf, -inf, 0.0f};
    for (int act = QKV_NN_ACT_GELU; act <= QKV_NN_ACT_RELU; act++) {
        float x[4], r[4];
        memcpy(x, v, sizeof x);
        memcpy(r, v, sizeof r);
        K->bias_act(x, 4, 1, NULL, 4, act);
        G->bias_act(r, 4, 1, NULL, 4, act);
        CHECK(isnan(x[0]), "%s act=%d: NaN stays NaN", g_isa, act);
        CHECK(x[1] == inf && r[1] == inf, "%s act=%d: +inf -> +inf", g_isa, act);
        CHECK(x[3] == 0.0f, "%s act=%d: 0 -> 0", g_isa, act);
    }
}

/* gelu_grad: bitwise the generic (qkv_nn_gelu_eval in plain C) on values
 * over |x| <= 12, tails and special values, with and without the gradient;
 * and the generic itself within kernels/nn.h's stated accuracy of GELU and
 * GELU' in double: 2.5e-7 and 4e-7 times max(1, |x|). */
static void test_nn_gelu_grad(const qkv_nn_kernels *K, const qkv_nn_kernels *G) {
    static const float special[] = {0.0f, -0.0f, 1e-30f, -1e-30f, NAN, INFINITY, -INFINITY, 100.0f, -100.0f};
    const size_t ns = sizeof special / sizeof special[0];
    for (size_t si = 0; si < NSIZES; si++)
        for (int keep = 0; keep < 2; keep++) {
            size_t n = SIZES[si] + ns;
            gbuf ga, gp;
            float *act = fnew(&ga, n, (int)si & 1), *pre = fnew(&gp, n, keep);
            float *x = malloc(n * sizeof *x), *wa = malloc(n * sizeof *wa), *wp = malloc(n * sizeof *wp);
            for (size_t i = 0; i < n; i++) x[i] = (float)((tu_rng_uniform(&g_rng) * 2 - 1) * (si & 1 ? 12.0 : 3.0));
            for (size_t i = 0; i < ns; i++) x[n - 1 - i] = special[i];
            memcpy(pre, x, n * sizeof *x);
            memcpy(wp, x, n * sizeof *x);
            G->gelu_grad(wa, wp, n, keep);
            K->gelu_grad(act, pre, n, keep);
            for (size_t i = 0; i < n; i++)
                if (!same_bits(act[i], wa[i]) || !same_bits(pre[i], wp[i])) {
                    CHECK(0, "%s gelu_grad keep=%d n=%zu [%zu] x=%.9g: %.9g %.9g, generic %.9g %.9g", g_isa, keep, n, i,
                          x[i], act[i], pre[i], wa[i], wp[i]);
                    break;
                }
            if (keep)
                for (size_t i = 0; i + ns < n; i++) {
                    double d = x[i], cdf = 0.5 * erfc(-d * 0.70710678118654752440);
                    double dg = cdf + d * exp(-0.5 * d * d) * 0.39894228040143267794, sc = fabs(d) > 1 ? fabs(d) : 1;
                    if (fabs(wa[i] - d * cdf) > 2.5e-7 * sc || fabs(wp[i] - dg) > 4e-7 * sc) {
                        CHECK(0, "generic gelu_grad x=%.9g: %.9g %.9g, double %.9g %.9g", x[i], wa[i], wp[i], d * cdf, dg);
                        break;
                    }
                }
            CHECK(gb_ok(&ga) && gb_ok(&gp), "%s gelu_grad n=%zu: nothing outside the row", g_isa, n);
            gb_free(&ga);
            gb_free(&gp);
            free(x);
            free(wa);
            free(wp);
        }
}

/* add_layernorm on rows of random scale and offset (the mean far from 0
 * tests the centring), with and without a residual. */
static void test_nn_layernorm(const qkv_nn_kernels *K, const qkv_nn_kernels *G) {
    for (size_t si = 0; si < NSIZES; si++)
        for (int withres = 0; withres < 2; withres++) {
            size_t n = SIZES[si] + (si > 5 ? 300 : 1);
            gbuf gx, gr, gg, gbb;
            float *x = fnew(&gx, n, (int)si & 1), *r = fnew(&gr, n, 0), *g = fnew(&gg, n, 1), *b = fnew(&gbb, n, 0);
            float *w = malloc(n * sizeof *w);
            double off = rnd(10.0), sc = exp(rnd(2.0));
            for (size_t i = 0; i < n; i++) {
                x[i] = (float)(off + sc * rnd(1.0));
                r[i] = rnd(1.0);
                g[i] = 1.0f + rnd(0.3);
                b[i] = rnd(0.3);
            }
            memcpy(w, x, n * sizeof *w);
            G->add_layernorm(w, withres ? r : NULL, g, b, n, 1e-12f);
            K->add_layernorm(x, withres ? r : NULL, g, b, n, 1e-12f);
            double worst = 0;
            for (size_t i = 0; i < n; i++) {
                double e = fabs(x[i] - w[i]) / (8.0 * fabs(g[i]) + fabs(b[i]));
                if (!(e <= worst)) worst = e;
            }
            CHECK(worst <= 2e-6, "%s add_layernorm n=%zu res=%d: error %.3g", g_isa, n, withres, worst);
            CHECK(gb_ok(&gx) && gb_ok(&gr) && gb_ok(&gg) && gb_ok(&gbb), "%s add_layernorm n=%zu: guards", g_isa, n);
            gb_free(&gx);
            gb_free(&gr);
            gb_free(&gg);
            gb_free(&gbb);
            free(w);
        }
}

/* The training LayerNorm kernels: bitwise the generic's on every size
 * (tails of the 8-lane sums included), with and without accumulation; and
 * the generic within 1e-6 relative of a two-pass double reference (the
 * forward's y, mean, rstd; the backward's dx against the formula in double
 * with the forward's float statistics; dg, db summed in double). */
static void test_nn_ln_train(const qkv_nn_kernels *K, const qkv_nn_kernels *G) {
    for (size_t si = 0; si < NSIZES; si++)
        for (int acc = 0; acc < 2; acc++) {
            const size_t n = SIZES[si] + (si > 5 ? 300 : 0), rows = 5, ld = n + 3;
            gbuf gy, gdx, gdg, gdb;
            float *x = malloc(rows * ld * sizeof *x), *dy = malloc(rows * ld * sizeof *dy);
            float *g = malloc(n * sizeof *g), *b = malloc(n * sizeof *b);
            float *y = fnew(&gy, n, (int)si & 1), *dx = fnew(&gdx, n, 0), *dg = fnew(&gdg, n, 1), *db = fnew(&gdb, n, 0);
            float *wy = malloc(n * sizeof *wy), *wdx = malloc(n * sizeof *wdx), *wdg = malloc(n * sizeof *wdg),
                  *wdb = malloc(n * sizeof *wdb), mean[5], rstd[5], m2, r2;
            const double off = rnd(10.0), sc = exp(rnd(2.0));
            for (size_t i = 0; i < rows * ld; i++) {
                x[i] = (float)(off + sc * rnd(1.0));
                dy[i] = rnd(1.0);
            }
            for (size_t i = 0; i < n; i++) {
                g[i] = 1.0f + rnd(0.3);
                b[i] = rnd(0.3);
                dx[i] = wdx[i] = rnd(1.0);
                dg[i] = wdg[i] = rnd(1.0);
                db[i] = wdb[i] = rnd(1.0);
            }
            int bad = 0;
            for (size_t r = 0; r < rows; r++) {
                G->ln_forward(x + r * ld, g, b, n, 1e-5, wy, &mean[r], &rstd[r]);
                K->ln_forward(x + r * ld, g, b, n, 1e-5, y, &m2, &r2);
                bad |= !same_bits(m2, mean[r]) || !same_bits(r2, rstd[r]);
                for (size_t i = 0; i < n; i++) bad |= !same_bits(y[i], wy[i]);
                /* the generic against two passes in double */
                double mu = 0, var = 0;
                for (size_t i = 0; i < n; i++) mu += x[r * ld + i];
                mu /= (double)n;
                for (size_t i = 0; i < n; i++) var += (x[r * ld + i] - mu) * (x[r * ld + i] - mu);
                const double rs = 1.0 / sqrt(var / (double)n + 1e-5);
                CHECK(fabs(mean[r] - mu) <= 1e-6 * (fabs(mu) + sc) && fabs(rstd[r] - rs) <= 1e-6 * rs,
                      "generic ln_forward n=%zu: mean %.9g / %.9g, rstd %.9g / %.9g", n, mean[r], mu, rstd[r], rs);
                for (size_t i = 0; i < n; i++) {
                    const double want = (x[r * ld + i] - mu) * rs * g[i] + b[i];
                    if (fabs(wy[i] - want) > 1e-6 * (fabs(want) + 1.0)) {
                        CHECK(0, "generic ln_forward n=%zu [%zu]: %.9g, double %.9g", n, i, wy[i], want);
                        break;
                    }
                }
            }
            CHECK(!bad, "%s ln_forward n=%zu: not bitwise the generic's", g_isa, n);
            /* input gradient of row 2 */
            const float *x2 = x + 2 * ld, *d2 = dy + 2 * ld;
            float *keep = malloc(n * sizeof *keep);
            memcpy(keep, wdx, n * sizeof *keep);
            G->ln_backward_row(x2, g, mean[2], rstd[2], d2, n, wdx, acc);
            K->ln_backward_row(x2, g, mean[2], rstd[2], d2, n, dx, acc);
            bad = 0;
            for (size_t i = 0; i < n; i++) bad |= !same_bits(dx[i], wdx[i]);
            CHECK(!bad, "%s ln_backward_row n=%zu acc=%d: not bitwise the generic's", g_isa, n, acc);
            double A = 0, B = 0;
            for (size_t i = 0; i < n; i++) {
                const double xh = ((double)x2[i] - mean[2]) * rstd[2];
                A += (double)d2[i] * g[i];
                B += (double)d2[i] * g[i] * xh;
            }
            A /= (double)n;
            B /= (double)n;
            for (size_t i = 0; i < n; i++) {
                const double xh = ((double)x2[i] - mean[2]) * rstd[2];
                const double v = rstd[2] * ((double)d2[i] * g[i] - A - xh * B), want = (acc ? keep[i] : 0.0) + v;
                if (fabs(wdx[i] - want) > 1e-6 * (fabs(v) + fabs(want) + rstd[2] * 1e-3)) {
                    CHECK(0, "generic ln_backward_row n=%zu [%zu]: %.9g, double %.9g", n, i, wdx[i], want);
                    break;
                }
            }
            /* parameter gradients over the rows */
            memcpy(keep, wdg, n * sizeof *keep);
            float *keepb = malloc(n * sizeof *keepb);
            memcpy(keepb, wdb, n * sizeof *keepb);
            G->ln_grad_cols(x, dy, mean, rstd, rows, ld, n, wdg, wdb);
            K->ln_grad_cols(x, dy, mean, rstd, rows, ld, n, dg, db);
            bad = 0;
            for (size_t i = 0; i < n; i++) bad |= !same_bits(dg[i], wdg[i]) || !same_bits(db[i], wdb[i]);
            CHECK(!bad, "%s ln_grad_cols n=%zu: not bitwise the generic's", g_isa, n);
            for (size_t i = 0; i < n; i++) {
                double sg = keep[i], sb = keepb[i], mag = fabs(keep[i]) + fabs(keepb[i]);
                for (size_t r = 0; r < rows; r++) {
                    const double t = (double)dy[r * ld + i] * (((double)x[r * ld + i] - mean[r]) * rstd[r]);
                    sg += t;
                    sb += dy[r * ld + i];
                    mag += fabs(t) + fabs(dy[r * ld + i]);
                }
                if (fabs(wdg[i] - sg) > 1e-6 * mag || fabs(wdb[i] - sb) > 1e-6 * mag) {
                    CHECK(0, "generic ln_grad_cols n=%zu [%zu]: %.9g %.9g, double %.9g %.9g", n, i, wdg[i], wdb[i], sg, sb);
                    break;
                }
            }
            CHECK(gb_ok(&gy) && gb_ok(&gdx) && gb_ok(&gdg) && gb_ok(&gdb), "%s ln kernels n=%zu: nothing outside the row",
                  g_isa, n);
            gb_free(&gy); gb_free(&gdx); gb_free(&gdg); gb_free(&gdb);
            free(x); free(dy); free(g); free(b); free(wy); free(wdx); free(wdg); free(wdb); free(keep); free(keepb);
        }
}

/* col_sums (a bias gradient): the serial loop's float sums in row order,
 * bitwise, for column counts around the 64-wide blocks. */
static void test_nn_col_sums(const qkv_nn_kernels *K, const qkv_nn_kernels *G) {
    static const size_t NS[] = {1, 7, 16, 17, 63, 64, 65, 130, 200};
    for (size_t ni = 0; ni < sizeof NS / sizeof NS[0]; ni++) {
        const size_t n = NS[ni], rows = 1 + ni * 5, ld = n + 5;
        gbuf gd;
        float *x = malloc(rows * ld * sizeof *x), *d = fnew(&gd, n, (int)ni & 1), *w = malloc(n * sizeof *w),
              *ref = malloc(n * sizeof *ref);
        for (size_t i = 0; i < rows * ld; i++) x[i] = rnd(1.0);
        for (size_t i = 0; i < n; i++) d[i] = w[i] = ref[i] = rnd(1.0);
        for (size_t r = 0; r < rows; r++)
            for (size_t i = 0; i < n; i++) ref[i] += x[r * ld + i];
        G->col_sums(w, x, rows, ld, n);
        K->col_sums(d, x, rows, ld, n);
        int bad = 0;
        for (size_t i = 0; i < n; i++) bad |= !same_bits(d[i], ref[i]) || !same_bits(w[i], ref[i]);
        CHECK(!bad && gb_ok(&gd), "%s col_sums n=%zu rows=%zu", g_isa, n, rows);
        gb_free(&gd);
        free(x);
        free(w);
        free(ref);
    }
}

/* ---- int8 matmul (kernels/i8.h): exact sums, the same bits everywhere ---- */

static void test_i8(const qkv_i8_kernels *K, const qkv_i8_kernels *G) {
    static const size_t KS[] = {1, 3, 4, 7, 63, 65, 129, 384};
    for (size_t ki = 0; ki < sizeof KS / sizeof KS[0]; ki++) {
        size_t k = KS[ki], kp = (k + QKV_I8_KSTEP - 1) / QKV_I8_KSTEP * QKV_I8_KSTEP;
        /* quant_row: bitwise, with zeros, ties, NaN, outliers (none, some,
         * more than QKV_I8_MAX_OUT) and a zero row */
        gbuf gx, ga, gb;
        float *x = fnew(&gx, k, (int)ki & 1);
        uint8_t *a = gb_new(&ga, kp, 1), *b = gb_new(&gb, kp, 3);
        for (int round = 0; round < 5; round++) {
            for (size_t t = 0; t < k; t++) x[t] = round == 2 ? 0.0f : rnd(1.0);
            if (round == 1 && k > 2) {
                x[1] = NAN;
                x[k - 1] = -x[0] * 0.5f;
            }
            for (size_t t = 0; round >= 3 && t < k; t += (round == 3 ? 37 : 8)) x[t] = (t & 1 ? -60.0f : 50.0f);
            int32_t i1[QKV_I8_MAX_OUT], i2[QKV_I8_MAX_OUT];
            float v1[QKV_I8_MAX_OUT], v2[QKV_I8_MAX_OUT];
            int n1 = -1, n2 = -2;
            float s1 = K->quant_row(x, k, kp, a, i1, v1, &n1), s2 = G->quant_row(x, k, kp, b, i2, v2, &n2);
            CHECK(same_bits(s1, s2) && memcmp(a, b, kp) == 0 && n1 == n2 && n1 >= 0 && n1 <= QKV_I8_MAX_OUT &&
                      memcmp(i1, i2, (size_t)n1 * sizeof *i1) == 0 && memcmp(v1, v2, (size_t)n1 * sizeof *v1) == 0,
                  "%s quant_row k=%zu round %d", g_isa, k, round);
            CHECK(round < 4 || k < 64 || n1 == QKV_I8_MAX_OUT, "%s quant_row k=%zu: outliers found (%d)", g_isa, k, n1);
            for (int o = 0; o < n1; o++) CHECK(a[i1[o]] == 128, "%s quant_row: an outlier's byte is a zero", g_isa);
            CHECK(gb_ok(&ga), "%s quant_row k=%zu: nothing past kp", g_isa, k);
        }
        gb_free(&gx);
        gb_free(&ga);
        gb_free(&gb);
        /* tile: every m up to the table's mr (the generic one run on blocks
         * of its own mr rows), n 1..32, bitwise */
        int mmax = K->mr > G->mr ? K->mr : G->mr;
        size_t lda = kp + 4 * (ki & 1);
        uint8_t *A = malloc((size_t)mmax * lda);
        int8_t *B = malloc(kp * QKV_I8_NR);
        int32_t ws[QKV_I8_NR];
        float sa[32], sw[QKV_I8_NR], bias[QKV_I8_NR];
        for (size_t i = 0; i < (size_t)mmax * lda; i++) A[i] = (uint8_t)(tu_rng_uniform(&g_rng) * 256);
        for (size_t i = 0; i < kp * QKV_I8_NR; i++) B[i] = (int8_t)(tu_rng_uniform(&g_rng) * 255 - 127);
        for (int j = 0; j < QKV_I8_NR; j++) {
            ws[j] = (int32_t)(tu_rng_uniform(&g_rng) * 2000) - 1000;
            sw[j] = (float)(tu_rng_uniform(&g_rng) * 0.01);
            bias[j] = rnd(1.0);
        }
        for (int i = 0; i < 32; i++) sa[i] = (float)(tu_rng_uniform(&g_rng) * 0.02);
        int nout[32];
        int32_t oidx[32 * QKV_I8_MAX_OUT];
        float oval[32 * QKV_I8_MAX_OUT];
        for (int i = 0; i < 32; i++) { /* 0 .. QKV_I8_MAX_OUT outliers per row, increasing columns < k */
            nout[i] = (int)(tu_rng_uniform(&g_rng) * (QKV_I8_MAX_OUT + 1));
            if ((size_t)nout[i] > k) nout[i] = (int)k;
            int32_t c = -1;
            for (int o = 0; o < nout[i]; o++) {
                int32_t room = (int32_t)k - 1 - c - (nout[i] - 1 - o);
                c += 1 + (int32_t)(tu_rng_uniform(&g_rng) * room);
                oidx[i * QKV_I8_MAX_OUT + o] = c;
                oval[i * QKV_I8_MAX_OUT + o] = rnd(20.0);
            }
        }
        for (int m = 1; m <= mmax; m++)
            for (int n = 1; n <= QKV_I8_NR; n += (n < 3 || n > 29) ? 1 : 7) {
                if (m > K->mr) continue;
                gbuf gc, gd;
                size_t ldc = (size_t)n + 3;
                float *c = fnew(&gc, (size_t)m * ldc, 1), *d = fnew(&gd, (size_t)m * ldc, 1);
                for (size_t i = 0; i < (size_t)m * ldc; i++) c[i] = d[i] = 7.0f;
                const float *bb = (m + n) % 2 ? bias : NULL;
                if (K->begin) K->begin();
                K->tile(kp, A, lda, B, ws, sa, sw, bb, c, ldc, m, n, nout, oidx, oval);
                if (K->end) K->end();
                for (int r = 0; r < m; r += G->mr)
                    G->tile(kp, A + (size_t)r * lda, lda, B, ws, sa + r, sw, bb, d + (size_t)r * ldc, ldc,
                            m - r < G->mr ? m - r : G->mr, n, nout + r, oidx + r * QKV_I8_MAX_OUT,
                            oval + r * QKV_I8_MAX_OUT);
                CHECK(memcmp(c, d, (size_t)m * ldc * sizeof *c) == 0, "%s i8 tile k=%zu m=%d n=%d: same bits", g_isa,
                      k, m, n);
                CHECK(gb_ok(&gc), "%s i8 tile k=%zu m=%d n=%d: guards", g_isa, k, m, n);
                gb_free(&gc);
                gb_free(&gd);
            }
        free(A);
        free(B);
    }
}

int main(void) {
    const qkv_kernel_set *gen = qkv_kernel_set_of(QKV_ARCH_GENERIC);
    CHECK(gen != NULL && qkv_kernel_set_active() != NULL, "the generic set exists");
    if (!gen) return tu_finish();
    tu_rng_seed(&g_rng, 2024);
    for (int arch = 0; arch < QKV_ARCH_COUNT; arch++) {
        const qkv_kernel_set *s = qkv_kernel_set_of(arch);
        if (!s) {
            printf("%s: not available here, skipped\n", qkv_arch_name(arch));
            continue;
        }
        const int before = tu_failed;
        g_isa = s->attn.name;
        CHECK(strcmp(s->attn.name, qkv_arch_name(arch)) == 0, "set %s holds the %s table", qkv_arch_name(arch),
              s->attn.name);
        test_pack_panel(&s->attn, &gen->attn);
        test_qk(&s->attn, &gen->attn);
        test_pv(&s->attn, &gen->attn);
        test_softmax(&s->attn, &gen->attn);
        test_bwd_softmax(&s->attn, &gen->attn);
        test_exp2(&s->attn, &gen->attn);
        test_scale_stream(&s->attn, &gen->attn);
        test_all_finite(&s->attn, &gen->attn);
        test_scale_bias(&s->attn, &gen->attn);
        test_dropout(&s->attn, &gen->attn);
        test_gemm(&s->gemm, &gen->gemm);
        test_kv(&s->kv, &gen->kv);
        test_nn_bias_act(&s->nn, &gen->nn);
        test_nn_layernorm(&s->nn, &gen->nn);
        test_nn_gelu_grad(&s->nn, &gen->nn);
        test_nn_ln_train(&s->nn, &gen->nn);
        test_nn_col_sums(&s->nn, &gen->nn);
        test_gemm_bf16(&s->gemm_bf16, &gen->gemm_bf16);
        if (qkv_gemm_bf16_kernel_replaced(arch)) /* the AVX512-BF16 table where AMX took its place */
            test_gemm_bf16(qkv_gemm_bf16_kernel_replaced(arch), &gen->gemm_bf16);
        CHECK(s->gemm_bf16.native == (arch == QKV_ARCH_AVX512 && qkv_cpu_has_avx512bf16()), "bf16 gemm table %s",
              s->gemm_bf16.name);
        printf("%s (gemm %s, bf16 gemm %s, kv %s, nn %s): %s\n", qkv_arch_name(arch), s->gemm.name, s->gemm_bf16.name,
               s->kv.name, s->nn.name,
               tu_failed == before ? "ok" : "FAILED");
        /* the bf16 kernels: native ones where the CPU has them, else the generic ones against themselves */
        if (arch == QKV_ARCH_GENERIC || s->half.native) {
            const int b2 = tu_failed;
            g_isa = s->half.name;
            CHECK(s->half.native == (arch == QKV_ARCH_AVX512 && qkv_cpu_has_avx512bf16()), "bf16 table %s", g_isa);
            test_half_qk(&s->half, &gen->half);
            test_half_pv(&s->half, &gen->half);
            test_half_packs(&s->half, &gen->half);
            test_half_moves(&s->half, &gen->half);
            test_half_softmax_pack(&s->half, &gen->half);
            test_half_bwd_softmax(&s->half, &gen->half);
            printf("%s bf16 kernels: %s\n", s->half.name, tu_failed == b2 ? "ok" : "FAILED");
        }
    }
    if (!qkv_cpu_has_avx512bf16()) printf("avx512bf16: not available here, skipped\n");
    else printf("bf16 gemm kernels %s the generic one bitwise on these inputs\n", g_bf16_gemm_exact ? "matched" : "did not match");
    /* the int8 kernels: VNNI where the CPU has it, and the generic ones against themselves */
    for (int arch = 0; arch < QKV_ARCH_COUNT; arch++) {
        const qkv_kernel_set *s = qkv_kernel_set_of(arch);
        if (!s || (arch != QKV_ARCH_GENERIC && !s->i8.native)) continue;
        const int b3 = tu_failed;
        g_isa = s->i8.name;
        CHECK(s->i8.native == (arch == QKV_ARCH_AVX512 && qkv_cpu_has_avx512vnni()), "int8 table %s", g_isa);
        test_i8(&s->i8, &gen->i8);
        if (qkv_i8_kernels_replaced(arch)) { /* the AVX512-VNNI table where AMX-INT8 took its place */
            g_isa = qkv_i8_kernels_replaced(arch)->name;
            test_i8(qkv_i8_kernels_replaced(arch), &gen->i8);
            g_isa = s->i8.name;
        }
        printf("%s int8 kernels: %s\n", s->i8.name, tu_failed == b3 ? "ok" : "FAILED");
    }
    if (!qkv_cpu_has_avx512vnni()) printf("avx512vnni: not available here, skipped\n");
    return tu_finish();
}
