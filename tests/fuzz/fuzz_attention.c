/* libFuzzer target: the attention API itself. The input decodes into a
 * descriptor (every field, also invalid values: bad enums, negative or
 * overflowing sizes, heads that do not divide, windows, key lengths and
 * packed offsets out of range, non-finite parameters) and small tensors.
 * The same problem is run twice: in float64 through the reference, and in
 * float32 through the implementation the fuzz input picks (AUTO, FAST or
 * REFERENCE). Findings (abort):
 *   - a crash, leak, out-of-bounds access or UB (ASan + UBSan);
 *   - the two calls, or qkv_attn_desc_check, disagree on the status
 *     (validation is dtype-independent; only FAST may add UNSUPPORTED);
 *   - both succeed but the float32 result is farther from the float64 one
 *     than float32 rounding explains, or is NaN where the reference is not.
 * Tensor values are small (|x| <= 2.02, exact in float), so the tolerance
 * stays meaningful: what is compared is the normaliser, the masks and the
 * bookkeeping, not rounding. ReLU's derivative jumps at a zero logit, where
 * float32 and float64 may fall on different sides: such inputs (a visible
 * logit within 1e-4 of 0, found from a float64 sigmoid forward, which is
 * invertible) have their ReLU gradients left uncompared. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "fuzz_check.h"
#include "core/rng.h"
#include "qkv.h"

#define MAX_ELEMS (1 << 16) /* per tensor: above this the call is only validated */

/* A pair of tensors with the same values, one float64 and one float32. */
typedef struct pair {
    double *d;
    float *f;
    int64_t n;
} pair;

static int pair_alloc(pair *p, int64_t n) {
    p->n = n;
    p->d = calloc((size_t)(n ? n : 1), sizeof(double));
    p->f = calloc((size_t)(n ? n : 1), sizeof(float));
    return p->d && p->f;
}

/* Tensor values come from a splitmix64 stream seeded by the input, so a
 * short input still fills every tensor. */
static void pair_fill(pair *p, uint64_t *seed, int neg_inf_one_in) {
    for (int64_t i = 0; i < p->n; i++) {
        uint64_t r = splitmix64_next(seed);
        /* Quarter steps plus a jitter of multiples of 2^-16: exact in float,
         * and logits exactly at the ReLU kink (0) become rare. */
        double x = (double)((int64_t)(r % 17) - 8) / 4.0 + (double)((r >> 40) % 1000) / 65536.0;
        if (neg_inf_one_in && (r >> 32) % (uint64_t)neg_inf_one_in == 0) x = -INFINITY;
        p->d[i] = x;
        p->f[i] = (float)x;
    }
}

static void pair_free(pair *p) {
    free(p->d);
    free(p->f);
    p->d = NULL;
    p->f = NULL;
}

/* max |f - d| over n, infinite where exactly one side is NaN or where the
 * two disagree on an infinity. */
static double max_diff(const float *f, const double *d, int64_t n) {
    double m = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double a = (double)f[i], b = d[i];
        if (isnan(b) && isnan(a)) continue;
        if (isnan(a) || isnan(b)) return INFINITY;
        if (isinf(a) || isinf(b)) {
            if (a != b) return INFINITY;
            continue;
        }
        double e = fabs(a - b);
        if (e > m) m = e;
    }
    return m;
}

/* With QKV_FUZZ_VERBOSE set, where two tensors differ most. */
static void show_worst(const char *what, const float *f, const double *d, int64_t n) {
    if (!getenv("QKV_FUZZ_VERBOSE")) return;
    int64_t w = 0;
    double m = -1.0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)f[i] - d[i]);
        if (isnan(e)) e = INFINITY;
        if (e > m) {
            m = e;
            w = i;
        }
    }
    if (n > 0)
        fprintf(stderr, "fuzz_attention: %s[%lld] float32 %.9g, float64 reference %.9g\n", what,
                (long long)w, (double)f[w], d[w]);
}

/* Does a [rows, D] tensor have a row of zeros? Under the cosine score the
 * gradient at such a row is divided by the 1e-12 norm floor, which turns
 * the rounding noise of either precision into huge values: not comparable. */
static int has_zero_row(const double *x, int64_t rows, int64_t D) {
    for (int64_t r = 0; r < rows; r++) {
        int64_t j = 0;
        while (j < D && x[r * D + j] == 0.0) j++;
        if (j == D) return 1;
    }
    return 0;
}

static double max_abs(const double *d, int64_t n) {
    double m = 0.0;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(d[i]) && fabs(d[i]) > m) m = fabs(d[i]);
    return m;
}

/* Element count of a shape, or -1 when it is not a small positive size. */
static int64_t small_count(int n, const int64_t *f) {
    int64_t c = 1;
    for (int i = 0; i < n; i++) {
        if (f[i] <= 0 || f[i] > MAX_ELEMS) return -1;
        c *= f[i];
        if (c > MAX_ELEMS) return -1;
    }
    return c;
}

static const int64_t weird_sizes[] = {0, -1, -7, INT64_MAX, INT64_MIN, (int64_t)1 << 32,
                                      (int64_t)1 << 62, 3037000500LL, 1000000};

static int64_t fuzz_size(fuzz_reader *r, int raw, int64_t base, int64_t range) {
    uint8_t c = fuzz_u8(r);
    if (raw && c >= 240)
        return weird_sizes[(c - 240) % (sizeof weird_sizes / sizeof weird_sizes[0])];
    return base + (int64_t)(c % range);
}

static double pick(fuzz_reader *r, const double *t, int n) { return t[fuzz_u8(r) % n]; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_reader rd = {data, size};
    fuzz_reader *r = &rd;
    qkv_attn_desc d;
    qkv_attn_desc_init(&d);

    uint8_t flags = fuzz_u8(r);
    uint8_t flags2 = fuzz_u8(r);
    int raw = flags & 1;          /* sizes and parameters may be invalid */
    int use_lengths = flags & 2;
    int packed = flags & 4;
    int backward = flags & 8;
    int use_bias = flags & 16;
    int use_alibi = flags & 32;
    int use_rel = flags & 64;
    int want_attn = flags & 128;
    int long_rows = flags2 & 1;   /* several key tiles (the fast path's tile is 128 keys) */
    int pass_fwd = flags2 & 2;    /* backward gets the forward's out and lse */

    uint8_t e = fuzz_u8(r);
    d.score = (qkv_score)(e % 5 == 4 ? (raw ? 4 + e / 5 : 0) : e % 5);
    e = fuzz_u8(r);
    d.norm = (qkv_norm)(e % 4 == 3 ? (raw ? 3 + e / 4 : 0) : e % 4);
    e = fuzz_u8(r);
    d.mask = (qkv_mask)(e % 5 == 4 ? (raw ? 4 + e / 5 : 0) : e % 5);
    e = fuzz_u8(r);
    qkv_impl impl32 = (qkv_impl)(e % 4 == 3 ? (raw ? 3 + e / 4 : 0) : e % 4);
    d.relu_divide_by_count = fuzz_u8(r) & 1;
    d.threads = (int)(fuzz_u8(r) % 2) + 1;
    if (raw && (flags2 & 4)) d.threads = -1;

    if (long_rows) {
        d.batch = 1;
        d.heads = 1;
        d.n_q = fuzz_size(r, raw, 1, 40);
        d.n_k = 1 + (int64_t)(fuzz_u16(r) % 300);
    } else {
        d.batch = fuzz_size(r, raw, 1, 3);
        d.heads = fuzz_size(r, raw, 1, 4);
        d.n_q = fuzz_size(r, raw, 1, 24);
        d.n_k = fuzz_size(r, raw, 1, 24);
    }
    e = fuzz_u8(r);
    d.heads_kv = e % 2 ? 0 : fuzz_size(r, raw, 1, 4);
    if (!raw && d.heads_kv > 0 && d.heads % d.heads_kv != 0) d.heads_kv = 1;
    d.dim = fuzz_size(r, raw, 1, 16);
    d.dim_v = fuzz_size(r, raw, 0, 9);

    static const double scales[] = {0.0, 0.0, 0.5, 2.0, -1.0, 0.125};
    static const double temps[] = {1.0, 0.5, 0.25, 2.0};
    static const double caps[] = {0.0, 0.0, 5.0, 30.0, 1.0};
    static const double bad[] = {NAN, INFINITY, -INFINITY, -1.0, 0.0};
    d.scale = pick(r, scales, 6);
    d.temperature = pick(r, temps, 4);
    d.softcap = pick(r, caps, 5);
    if (raw && (flags2 & 8)) {
        e = fuzz_u8(r);
        double x = bad[e % 5];
        if (e & 8) d.scale = x;
        if (e & 16) d.temperature = x;
        if (e & 32) d.softcap = x;
    }
    int64_t nwin = (d.n_k > 0 && d.n_k < 1000 ? d.n_k : 8) + 2;
    d.window_left = (int64_t)(fuzz_u16(r) % (uint64_t)nwin) - (raw ? 1 : 0);
    d.window_right = (int64_t)(fuzz_u16(r) % (uint64_t)nwin) - (raw ? 1 : 0);
    if (d.mask == QKV_MASK_CAUSAL_WINDOW && !(raw && (flags2 & 16))) d.window_right = 0;
    if (d.window_left < 0 && !raw) d.window_left = 0;
    d.additive_dim = fuzz_size(r, raw, 1, 4);
    if (use_bias) d.bias_kind = (qkv_bias_kind)(1 + fuzz_u8(r) % 2);
    if (raw && (flags2 & 32)) d.bias_kind = (qkv_bias_kind)(3 + fuzz_u8(r) % 3);
    int64_t rel_buckets = 2 + (int64_t)(fuzz_u8(r) % 10) - (raw ? 2 : 0);
    int64_t rel_max = 1 + (int64_t)(fuzz_u8(r) % 40) - (raw ? 1 : 0);
    int rel_bidir = fuzz_u8(r) & 1;
    if (!raw && rel_bidir && rel_buckets < 4) rel_buckets = 4;
    uint64_t seed = fuzz_u64(r);

    /* Sizes as the plan resolves them, for our buffers. */
    int64_t B = d.batch, H = d.heads, Hkv = d.heads_kv ? d.heads_kv : d.heads;
    int64_t D = d.dim, Dv = d.dim_v ? d.dim_v : d.dim;
    int64_t A = d.additive_dim;
    int64_t n_q = d.n_q, n_k = d.n_k;
    int64_t c_q = small_count(4, (int64_t[]){B, n_q, H, D});
    int64_t c_k = small_count(4, (int64_t[]){B, n_k, Hkv, D});
    int64_t c_v = small_count(4, (int64_t[]){B, n_k, Hkv, Dv});
    int64_t c_o = small_count(4, (int64_t[]){B, n_q, H, Dv});
    int64_t c_a = small_count(4, (int64_t[]){B, H, n_q, n_k});
    int64_t c_l = small_count(3, (int64_t[]){B, H, n_q});
    int64_t c_b = small_count(3, (int64_t[]){d.bias_kind == QKV_BIAS_PER_HEAD ? H : 1, n_q, n_k});
    int64_t c_w1 = small_count(3, (int64_t[]){H, A, D});
    int64_t c_w = small_count(2, (int64_t[]){H, A});
    int64_t c_rel = small_count(2, (int64_t[]){H, rel_buckets > 0 ? rel_buckets : 1});

    qkv_attn_desc d64 = d, d32 = d;
    d64.dtype = QKV_F64;
    d64.impl = QKV_IMPL_REFERENCE;
    d32.dtype = QKV_F32;
    d32.impl = impl32;

    if (c_q < 0 || c_k < 0 || c_v < 0 || c_o < 0 || c_a < 0 || c_b < 0 || c_w1 < 0 || c_w < 0 ||
        c_rel < 0) {
        /* Too large (or invalid) to compute: validation must cope, and a call
         * without tensors must fail without touching memory. */
        qkv_status c = qkv_attn_desc_check(&d32);
        qkv_status f = qkv_attention_forward(&d32, NULL, NULL, NULL, NULL, NULL, NULL);
        FUZZ_CHECK(f != QKV_OK, "forward without tensors succeeded");
        FUZZ_CHECK(c == QKV_OK || c == f, "check %d but forward %d", (int)c, (int)f);
        qkv_attn_grads g0;
        memset(&g0, 0, sizeof g0);
        qkv_status b = qkv_attention_backward(&d64, NULL, NULL, NULL, NULL, NULL, NULL, &g0);
        FUZZ_CHECK(b != QKV_OK, "backward without tensors succeeded");
        return 0;
    }

    /* Masks and optional tensors. */
    int64_t *lengths = NULL, *off_q = NULL, *off_k = NULL;
    if (use_lengths) {
        lengths = malloc((size_t)B * sizeof *lengths);
        if (!lengths) return 0;
        for (int64_t b = 0; b < B; b++)
            lengths[b] = (int64_t)(fuzz_u8(r) % (uint64_t)(n_k + (raw ? 3 : 1))) - (raw ? 1 : 0);
        d64.key_lengths = d32.key_lengths = lengths;
    }
    if (packed) {
        int64_t S = 1 + fuzz_u8(r) % 4;
        off_q = malloc((size_t)(S + 1) * sizeof *off_q);
        off_k = malloc((size_t)(S + 1) * sizeof *off_k);
        if (!off_q || !off_k) {
            free(lengths);
            free(off_q);
            free(off_k);
            return 0;
        }
        /* Nondecreasing cut points from 0 to n (sorted random cuts), then an
         * optional corruption in raw mode. */
        for (int which = 0; which < 2; which++) {
            int64_t *o = which ? off_k : off_q, n = which ? n_k : n_q;
            o[0] = 0;
            o[S] = n;
            for (int64_t s = 1; s < S; s++) {
                int64_t x = (int64_t)(fuzz_u16(r) % (uint64_t)(n + 1));
                int64_t t = s;
                while (t > 1 && o[t - 1] > x) {
                    o[t] = o[t - 1];
                    t--;
                }
                o[t] = x;
            }
            if (raw && (fuzz_u8(r) & 3) == 0) o[fuzz_u8(r) % (S + 1)] += (fuzz_u8(r) & 1) ? 1 : -1;
        }
        if (!raw) {
            d64.batch = d32.batch = B = 1;
            c_q = n_q * H * D;
            c_k = n_k * Hkv * D;
            c_v = n_k * Hkv * Dv;
            c_o = n_q * H * Dv;
            c_a = H * n_q * n_k;
            c_l = H * n_q;
        }
        d64.num_seqs = d32.num_seqs = S;
        d64.seq_offsets_q = d32.seq_offsets_q = off_q;
        int same = (flags2 & 64) && n_q == n_k;
        d64.seq_offsets_k = d32.seq_offsets_k = same ? NULL : off_k;
        if (same) memcpy(off_k, off_q, (size_t)(S + 1) * sizeof *off_k);
    }

    pair q = {0}, k = {0}, v = {0}, bias = {0}, w1 = {0}, w2 = {0}, w = {0}, rel = {0};
    pair slopes = {0}, dout = {0};
    pair out = {0}, attn = {0}, lse = {0};
    pair dq = {0}, dk = {0}, dv = {0}, dbias = {0}, dw1 = {0}, dw2 = {0}, dw = {0}, drel = {0};
    int ok = pair_alloc(&q, c_q) && pair_alloc(&k, c_k) && pair_alloc(&v, c_v) &&
             pair_alloc(&out, c_o) && pair_alloc(&dout, c_o) && pair_alloc(&dq, c_q) &&
             pair_alloc(&dk, c_k) && pair_alloc(&dv, c_v);
    if (ok && want_attn) ok = pair_alloc(&attn, c_a) && pair_alloc(&lse, c_l);
    if (ok && d.bias_kind != QKV_BIAS_NONE) ok = pair_alloc(&bias, c_b) && pair_alloc(&dbias, c_b);
    if (ok && d.score == QKV_SCORE_ADDITIVE)
        ok = pair_alloc(&w1, c_w1) && pair_alloc(&w2, c_w1) && pair_alloc(&w, c_w) &&
             pair_alloc(&dw1, c_w1) && pair_alloc(&dw2, c_w1) && pair_alloc(&dw, c_w);
    if (ok && use_alibi) ok = pair_alloc(&slopes, H);
    if (ok && use_rel) ok = pair_alloc(&rel, c_rel) && pair_alloc(&drel, c_rel);
    if (!ok) goto done;

    pair_fill(&q, &seed, 0);
    pair_fill(&k, &seed, 0);
    pair_fill(&v, &seed, 0);
    pair_fill(&dout, &seed, 0);
    if (bias.d) {
        pair_fill(&bias, &seed, (flags2 & 128) ? 3 : 0);
        d64.bias = bias.d;
        d32.bias = bias.f;
    }
    if (w1.d) {
        pair_fill(&w1, &seed, 0);
        pair_fill(&w2, &seed, 0);
        pair_fill(&w, &seed, 0);
        d64.additive_w1 = w1.d;
        d64.additive_w2 = w2.d;
        d64.additive_w = w.d;
        d32.additive_w1 = w1.f;
        d32.additive_w2 = w2.f;
        d32.additive_w = w.f;
    }
    if (slopes.d) {
        if (qkv_alibi_slopes(H, slopes.f) != QKV_OK) goto done;
        for (int64_t h = 0; h < H; h++) slopes.d[h] = slopes.f[h];
        d64.alibi_slopes = slopes.d;
        d32.alibi_slopes = slopes.f;
    }
    if (rel.d) {
        pair_fill(&rel, &seed, 0);
        d64.rel_table = rel.d;
        d32.rel_table = rel.f;
        d64.rel_buckets = d32.rel_buckets = rel_buckets;
        d64.rel_max_distance = d32.rel_max_distance = rel_max;
        d64.rel_bidirectional = d32.rel_bidirectional = rel_bidir;
    }

    /* Forward. */
    qkv_status chk = qkv_attn_desc_check(&d64);
    qkv_status s64 = qkv_attention_forward(&d64, q.d, k.d, v.d, out.d, attn.d, lse.d);
    qkv_status s32 = qkv_attention_forward(&d32, q.f, k.f, v.f, out.f, attn.f, lse.f);
    FUZZ_CHECK(s64 == chk || s64 == QKV_ERR_OUT_OF_MEMORY, "check %d, forward %d", (int)chk, (int)s64);
    int fast_refused = s32 == QKV_ERR_UNSUPPORTED && impl32 == QKV_IMPL_FAST;
    if ((int)impl32 > QKV_IMPL_FAST) /* enums are checked before everything but the dtype */
        FUZZ_CHECK(s32 == QKV_ERR_BAD_ENUM, "impl %d accepted: %d", (int)impl32, (int)s32);
    else
        FUZZ_CHECK(s32 == s64 || fast_refused || s32 == QKV_ERR_OUT_OF_MEMORY,
                   "float64 reference %d, float32 impl %d: %d", (int)s64, (int)impl32, (int)s32);
    if (getenv("QKV_FUZZ_VERBOSE"))
        fprintf(stderr, "fuzz_attention: B %lld n_q %lld n_k %lld H %lld/%lld D %lld/%lld score %d "
                "norm %d mask %d impl %d: forward %d / %d%s\n", (long long)B, (long long)n_q,
                (long long)n_k, (long long)H, (long long)Hkv, (long long)D, (long long)Dv,
                (int)d.score, (int)d.norm, (int)d.mask, (int)impl32, (int)s64, (int)s32,
                backward ? " +backward" : "");
    if (s64 != QKV_OK || s32 != QKV_OK) goto done;

    /* Tolerance: float32 rounding of logits of at most ~|s| 2^-20, through
     * a row of weights of total mass m onto values of size <= 2. */
    double vmax = max_abs(v.d, c_v);
    double mass = 1.0;
    if (d.norm != QKV_NORM_SOFTMAX) mass = (double)n_k; /* relu/sigmoid rows need not sum to 1 */
    double smax = 64.0 * (d.score == QKV_SCORE_DOT ? 4.0 : 1.0) + 64.0 * (double)A;
    double tol = 1e-4 * (1.0 + mass * vmax) * (1.0 + smax / 64.0);
    double err = max_diff(out.f, out.d, c_o);
    show_worst("out", out.f, out.d, c_o);
    FUZZ_CHECK(err <= tol, "forward out differs by %g (tolerance %g)", err, tol);
    if (attn.d) {
        err = max_diff(attn.f, attn.d, c_a);
        if (err > tol) show_worst("attn", attn.f, attn.d, c_a);
        FUZZ_CHECK(err <= tol, "forward attn differs by %g (tolerance %g)", err, tol);
        double lmax = max_abs(lse.d, c_l);
        err = max_diff(lse.f, lse.d, c_l);
        FUZZ_CHECK(err <= 1e-4 * (1.0 + lmax), "forward lse differs by %g", err);
    }

    /* ReLU near its kink: see the top. */
    if (backward && d.norm == QKV_NORM_RELU) {
        pair sig = {0}, o2 = {0};
        qkv_attn_desc ds = d64;
        ds.norm = QKV_NORM_SIGMOID;
        int near_kink = 1;
        if (pair_alloc(&sig, c_a) && pair_alloc(&o2, c_o) &&
            qkv_attention_forward(&ds, q.d, k.d, v.d, o2.d, sig.d, NULL) == QKV_OK) {
            near_kink = 0;
            for (int64_t i = 0; i < c_a && !near_kink; i++)
                if (fabs(sig.d[i] - 0.5) < 2.5e-5) near_kink = 1;
        }
        pair_free(&sig);
        pair_free(&o2);
        if (near_kink) backward = 0;
    }

    /* Backward. */
    if (backward) {
        qkv_attn_grads g64 = {dq.d, dk.d, dv.d, dbias.d, dw1.d, dw2.d, dw.d, drel.d};
        qkv_attn_grads g32 = {dq.f, dk.f, dv.f, dbias.f, dw1.f, dw2.f, dw.f, drel.f};
        /* lse was only computed when attn was asked for. */
        const void *o32 = pass_fwd ? out.f : NULL, *l32 = pass_fwd && lse.f ? lse.f : NULL;
        s64 = qkv_attention_backward(&d64, q.d, k.d, v.d, pass_fwd ? out.d : NULL,
                                     pass_fwd && lse.d ? lse.d : NULL, dout.d, &g64);
        s32 = qkv_attention_backward(&d32, q.f, k.f, v.f, o32, l32, dout.f, &g32);
        FUZZ_CHECK(s64 == QKV_OK || s64 == QKV_ERR_OUT_OF_MEMORY, "backward reference %d", (int)s64);
        FUZZ_CHECK(s32 == QKV_OK || s32 == QKV_ERR_OUT_OF_MEMORY,
                   "backward float32 %d after a successful forward", (int)s32);
        if (s64 != QKV_OK || s32 != QKV_OK) goto done;
        const pair *gs[] = {&dq, &dk, &dv, &dbias, &dw1, &dw2, &dw, &drel};
        static const char *names[] = {"dq", "dk", "dv", "dbias", "dw1", "dw2", "dw", "drel"};
        for (int i = 0; i < 8; i++) {
            if (!gs[i]->d) continue;
            if (d.score == QKV_SCORE_COSINE && i == 0 && has_zero_row(q.d, c_q / D, D)) continue;
            if (d.score == QKV_SCORE_COSINE && i == 1 && has_zero_row(k.d, c_k / D, D)) continue;
            double m = max_abs(gs[i]->d, gs[i]->n);
            double tg = 1e-3 * (1.0 + m) * (1.0 + smax / 64.0);
            err = max_diff(gs[i]->f, gs[i]->d, gs[i]->n);
            if (err > tg) show_worst(names[i], gs[i]->f, gs[i]->d, gs[i]->n);
            FUZZ_CHECK(err <= tg, "backward %s differs by %g (tolerance %g)", names[i], err, tg);
        }
    }

done:
    pair_free(&q), pair_free(&k), pair_free(&v), pair_free(&bias), pair_free(&w1);
    pair_free(&w2), pair_free(&w), pair_free(&rel), pair_free(&slopes), pair_free(&dout);
    pair_free(&out), pair_free(&attn), pair_free(&lse), pair_free(&dq), pair_free(&dk);
    pair_free(&dv), pair_free(&dbias), pair_free(&dw1), pair_free(&dw2), pair_free(&dw);
    pair_free(&drel);
    free(lengths);
    free(off_q);
    free(off_k);
    return 0;
}
