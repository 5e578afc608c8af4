/* bf16 and fp16 storage (docs/HALF.md): conversions (round to nearest even,
 * NaN kept, fp16 subnormals), and the attention forward and backward in both
 * half types checked against the double reference on the same (half-rounded)
 * inputs with FlashAttention's rule, the baseline being a plain half
 * implementation written here: matmul - softmax - matmul with half inputs,
 * float accumulation, P rounded to half before P V (and dS before dS K,
 * dS^T Q), results stored in half:
 *
 *     max|qkv - ref64| <= k * max|plain_half - ref64| + 1e-5,  k = 2 forward, 5 backward.
 *
 * Masks (causal, windows, key lengths, packed), GQA, n_q != n_k, fully
 * masked rows (output 0, lse -inf, zero gradients), NaN in masked keys,
 * every ISA forced in turn, check_finite, errors, allocation failures. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn/half.h"
#include "core/cpu.h"
#include "core/half.h"
#include "core/internal.h"
#include "qkv.h"
#include "test_util.h"

/* ---- conversions --------------------------------------------------------- */

static float f32_of(uint32_t u) { return qkv_f32_from_bits(u); }

static void test_bf16_conversions(void) {
    /* exact values, ties to even, carries into the exponent, overflow */
    CHECK(qkv_f32_to_bf16(1.0f) == 0x3f80, "1");
    CHECK(qkv_f32_to_bf16(-2.0f) == 0xc000, "-2");
    CHECK(qkv_f32_to_bf16(f32_of(0x3f808000u)) == 0x3f80, "tie to even (down)");
    CHECK(qkv_f32_to_bf16(f32_of(0x3f818000u)) == 0x3f82, "tie to even (up)");
    CHECK(qkv_f32_to_bf16(f32_of(0x3f808001u)) == 0x3f81, "above the tie");
    CHECK(qkv_f32_to_bf16(f32_of(0x3f807fffu)) == 0x3f80, "below the tie");
    CHECK(qkv_f32_to_bf16(f32_of(0x3fffffffu)) == 0x4000, "carry into the exponent");
    CHECK(qkv_f32_to_bf16(f32_of(0x7f7fffffu)) == 0x7f80, "FLT_MAX rounds to inf");
    CHECK(qkv_f32_to_bf16(INFINITY) == 0x7f80 && qkv_f32_to_bf16(-INFINITY) == 0xff80, "inf");
    CHECK(qkv_f32_to_bf16(-0.0f) == 0x8000, "-0");
    CHECK(qkv_f32_to_bf16(f32_of(0x00000001u)) == 0x0000, "smallest subnormal to 0");
    CHECK(qkv_f32_to_bf16(f32_of(0x00018000u)) == 0x0002, "subnormal tie to even");
    /* NaN: stays NaN (never inf), sign kept, even with only low payload bits */
    uint32_t nans[] = {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fbfffffu, 0xffffffffu};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        uint16_t h = qkv_f32_to_bf16(f32_of(nans[i]));
        CHECK(isnan(qkv_bf16_to_f32(h)) && (h >> 15) == (nans[i] >> 31), "NaN %08x -> %04x",
              (unsigned)nans[i], (unsigned)h);
    }
    /* every bf16 widens and narrows back to itself (NaNs to a NaN) */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float x = qkv_bf16_to_f32((uint16_t)h);
        uint16_t back = qkv_f32_to_bf16(x);
        if (isnan(x) ? !isnan(qkv_bf16_to_f32(back)) : back != h) bad++;
    }
    CHECK(bad == 0, "%d bf16 values do not round-trip", bad);
    /* random floats: the result is the nearer neighbour (ties: even) */
    tu_rng r;
    tu_rng_seed(&r, 7);
    bad = 0;
    for (int i = 0; i < 200000; i++) {
        uint32_t u = (uint32_t)tu_rng_u64(&r);
        float x = f32_of(u);
        if (!isfinite(x)) continue;
        uint16_t h = qkv_f32_to_bf16(x);
        uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
        double dl = fabs((double)x - qkv_bf16_to_f32(lo));
        double dh = fabs((double)x - (double)qkv_bf16_to_f32(hi));
        if (isnan(dh)) dh = INFINITY;
        uint16_t want = dl < dh ? lo : dh < dl ? hi : ((lo & 1) ? hi : lo);
        if ((hi & 0x7f80) == 0x7f80 && dl >= dh) want = hi; /* rounds to inf */
        if (h != want) bad++;
    }
    CHECK(bad == 0, "%d random floats rounded wrongly to bf16", bad);
}

static void test_f16_conversions(void) {
    CHECK(qkv_f32_to_f16(1.0f) == 0x3c00, "1");
    CHECK(qkv_f32_to_f16(65504.0f) == 0x7bff, "max");
    CHECK(qkv_f32_to_f16(65519.99f) == 0x7bff, "below the overflow tie");
    CHECK(qkv_f32_to_f16(65520.0f) == 0x7c00, "overflow tie to inf");
    CHECK(qkv_f32_to_f16(-1e10f) == 0xfc00, "-inf");
    CHECK(qkv_f32_to_f16(0x1p-24f) == 0x0001, "smallest subnormal");
    CHECK(qkv_f32_to_f16(0x1p-25f) == 0x0000, "half the smallest: tie to 0");
    CHECK(qkv_f32_to_f16(0x1.000002p-25f) == 0x0001, "just above the tie");
    CHECK(qkv_f32_to_f16(0x3p-25f) == 0x0002, "subnormal tie to even");
    CHECK(qkv_f32_to_f16(0x1p-14f) == 0x0400, "smallest normal");
    CHECK(qkv_f32_to_f16(0x1.ffcp-15f) == 0x0400, "rounds up into the normals");
    CHECK(qkv_f32_to_f16(-0.0f) == 0x8000, "-0");
    CHECK(qkv_f32_to_f16(1.0f + 0x1p-11f) == 0x3c00 && qkv_f32_to_f16(1.0f + 0x3p-11f) == 0x3c02,
          "ties to even");
    uint32_t nans[] = {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7f802000u};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        uint16_t h = qkv_f32_to_f16(f32_of(nans[i]));
        CHECK(isnan(qkv_f16_to_f32(h)) && (h >> 15) == (nans[i] >> 31), "NaN %08x -> %04x",
              (unsigned)nans[i], (unsigned)h);
    }
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float x = qkv_f16_to_f32((uint16_t)h);
        uint16_t back = qkv_f32_to_f16(x);
        if (isnan(x) ? !isnan(qkv_f16_to_f32(back)) : back != h) bad++;
        /* widening is exact: against the definition */
        uint32_t e = (h >> 10) & 31, m = h & 1023;
        double want = e == 0 ? ldexp((double)m, -24) : e == 31 ? (m ? NAN : INFINITY)
                                                               : ldexp(1024.0 + m, (int)e - 25);
        if (h & 0x8000) want = -want;
        if (!(isnan(want) ? isnan(x) : (double)x == want)) bad++;
    }
    CHECK(bad == 0, "%d fp16 values wrong or not round-tripping", bad);
    /* every float in range rounds to the nearer of its two fp16 neighbours */
    tu_rng r;
    tu_rng_seed(&r, 8);
    bad = 0;
    for (int i = 0; i < 200000; i++) {
        float x = (float)(ldexp(tu_rng_uniform(&r) + 0.5, (int)(tu_rng_u64(&r) % 44) - 28));
        uint16_t h = qkv_f32_to_f16(x);
        double y = qkv_f16_to_f32(h);
        if (h >= 0x7c00) {
            if (x < 65520.0f) bad++;
            continue;
        }
        double up = qkv_f16_to_f32((uint16_t)(h + 1));
        double dn = h ? qkv_f16_to_f32((uint16_t)(h - 1)) : -y;
        double d = fabs((double)x - y);
        if (d > fabs((double)x - up) || d > fabs((double)x - dn)) bad++;
        if ((d == fabs((double)x - up) || d == fabs((double)x - dn)) && (h & 1)) bad++;
    }
    CHECK(bad == 0, "%d random floats rounded wrongly to fp16", bad);
}

/* ---- attention ------------------------------------------------------------ */

typedef struct hprob {
    qkv_attn_desc d; /* sizes and options; dtype set per call */
    qkv_plan pl;     /* of the float descriptor */
    qkv_dtype dt;
    int64_t kl[4], off[4];
    int64_t nq, nk, nv, no, nl;
    uint16_t *q, *k, *v, *dout;
    double *qd, *kd, *vd, *doutd;
} hprob;


static int hp_make(hprob *p, qkv_dtype dt, uint64_t seed, double sd) {
    tu_rng r;
    tu_rng_seed(&r, seed);
    p->dt = dt;
    if (p->d.key_lengths) p->d.key_lengths = p->kl;
    if (p->d.seq_offsets_q) p->d.seq_offsets_q = p->d.seq_offsets_k = p->off;
    p->d.dtype = QKV_F32;
    if (qkv_plan_make(&p->d, &p->pl) != QKV_OK) return 0;
    p->nq = p->pl.n_q_elems;
    p->nk = p->pl.n_k_elems;
    p->nv = p->pl.n_v_elems;
    p->no = p->pl.n_o_elems;
    p->nl = p->pl.n_lse_elems;
    p->q = tu_half_random(&r, dt, p->nq, sd, &p->qd);
    p->k = tu_half_random(&r, dt, p->nk, sd, &p->kd);
    p->v = tu_half_random(&r, dt, p->nv, 1.0, &p->vd);
    p->dout = tu_half_random(&r, dt, p->no, 1.0, &p->doutd);
    p->d.dtype = dt;
    return 1;
}

static void hp_free(hprob *p) {
    free(p->q); free(p->k); free(p->v); free(p->dout);
    free(p->qd); free(p->kd); free(p->vd); free(p->doutd);
}

static int64_t idx4(int64_t b, int64_t i, int64_t h, int64_t n, int64_t H, int64_t D) {
    return ((b * n + i) * H + h) * D;
}

/* The plain half implementation (see the top): out (half values, as float),
 * lse; and, when dq is given, the gradients (half values, as float). */
static void plain_half(const hprob *p, float *out, float *lse, float *dq, float *dk, float *dv) {
    const qkv_plan *pl = &p->pl;
    const qkv_attn_desc *d = &pl->d;
    qkv_dtype dt = p->dt;
    int64_t nk = d->n_k, D = d->dim, Dv = d->dim_v, G = pl->group;
    float scale = (float)d->scale;
    float *s = malloc((size_t)nk * sizeof(float)), *w = malloc((size_t)nk * sizeof(float));
    float *o = malloc((size_t)Dv * sizeof(float));
    float *dqa = malloc((size_t)D * sizeof(float));
    float *dka = dq ? calloc((size_t)p->nk, sizeof(float)) : NULL;
    float *dva = dq ? calloc((size_t)p->nv, sizeof(float)) : NULL;
    for (int64_t b = 0; b < d->batch; b++)
        for (int64_t h = 0; h < d->heads; h++)
            for (int64_t i = 0; i < d->n_q; i++) {
                int64_t lo, hi, hk = h / G;
                qkv_plan_key_range(pl, b, i, &lo, &hi);
                const uint16_t *qi = p->q + idx4(b, i, h, d->n_q, d->heads, D);
                float m = -INFINITY, sum = 0.0f;
                for (int64_t j = lo; j < hi; j++) {
                    const uint16_t *kj = p->k + idx4(b, j, hk, nk, d->heads_kv, D);
                    float acc = 0.0f;
                    for (int64_t t = 0; t < D; t++) acc += tu_half_to_f32(dt, qi[t]) * tu_half_to_f32(dt, kj[t]);
                    s[j] = acc * scale;
                    m = s[j] > m ? s[j] : m;
                }
                for (int64_t j = lo; j < hi; j++) sum += expf(s[j] - m);
                int64_t row = (b * d->heads + h) * d->n_q + i;
                lse[row] = hi > lo ? m + logf(sum) : -INFINITY;
                for (int64_t t = 0; t < Dv; t++) o[t] = 0.0f;
                for (int64_t j = lo; j < hi; j++) {
                    w[j] = expf(s[j] - m) / sum;
                    float pr = tu_half_round(dt, w[j]);
                    const uint16_t *vj = p->v + idx4(b, j, hk, nk, d->heads_kv, Dv);
                    for (int64_t t = 0; t < Dv; t++) o[t] += pr * tu_half_to_f32(dt, vj[t]);
                }
                float *orow = out + idx4(b, i, h, d->n_q, d->heads, Dv);
                for (int64_t t = 0; t < Dv; t++) orow[t] = tu_half_round(dt, o[t]);
                if (!dq) continue;
                /* backward of the row: dV += P^T dO (P in half), dP = dO V^T,
                 * dS = P (dP - sum P dP) rounded to half, dQ = dS K, dK += dS^T Q */
                const uint16_t *gi = p->dout + idx4(b, i, h, d->n_q, d->heads, Dv);
                float di = 0.0f;
                for (int64_t j = lo; j < hi; j++) {
                    const uint16_t *vj = p->v + idx4(b, j, hk, nk, d->heads_kv, Dv);
                    float *dvj = dva + idx4(b, j, hk, nk, d->heads_kv, Dv);
                    float acc = 0.0f, pr = tu_half_round(dt, w[j]);
                    for (int64_t t = 0; t < Dv; t++) {
                        acc += tu_half_to_f32(dt, gi[t]) * tu_half_to_f32(dt, vj[t]);
                        dvj[t] += pr * tu_half_to_f32(dt, gi[t]);
                    }
                    s[j] = acc; /* dP */
                    di += w[j] * acc;
                }
                for (int64_t t = 0; t < D; t++) dqa[t] = 0.0f;
                for (int64_t j = lo; j < hi; j++) {
                    float ds = tu_half_round(dt, w[j] * (s[j] - di)) * scale;
                    const uint16_t *kj = p->k + idx4(b, j, hk, nk, d->heads_kv, D);
                    float *dkj = dka + idx4(b, j, hk, nk, d->heads_kv, D);
                    for (int64_t t = 0; t < D; t++) {
                        dqa[t] += ds * tu_half_to_f32(dt, kj[t]);
                        dkj[t] += ds * tu_half_to_f32(dt, qi[t]);
                    }
                }
                float *dqi = dq + idx4(b, i, h, d->n_q, d->heads, D);
                for (int64_t t = 0; t < D; t++) dqi[t] = tu_half_round(dt, dqa[t]);
            }
    if (dq) {
        for (int64_t x = 0; x < p->nk; x++) dk[x] = tu_half_round(dt, dka[x]);
        for (int64_t x = 0; x < p->nv; x++) dv[x] = tu_half_round(dt, dva[x]);
    }
    free(s); free(w); free(o); free(dqa); free(dka); free(dva);
}

static double err_half(qkv_dtype dt, const uint16_t *a, const double *ref, int64_t n) {
    double m = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double x = tu_half_to_f32(dt, a[i]), e = fabs(x - ref[i]);
        if (isnan(x) != isnan(ref[i])) return INFINITY;
        if (!isnan(e) && e > m) m = e;
    }
    return m;
}

static double err_f32(const float *a, const double *ref, int64_t n) {
    double m = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (isinf(ref[i]) || isinf(a[i])) {
            if (a[i] != ref[i]) return INFINITY;
            continue;
        }
        double e = fabs((double)a[i] - ref[i]);
        if (isnan(e)) return INFINITY;
        if (e > m) m = e;
    }
    return m;
}

/* Forward (and backward) of one problem in the library (desc dtype, impl)
 * against the reference and the plain half baseline. */
static void check_problem(hprob *p, const char *what, int backward) {
    const qkv_attn_desc *d = &p->pl.d;
    qkv_dtype dt = p->dt;
    /* reference in double on the half inputs */
    qkv_attn_desc d64 = p->d;
    d64.dtype = QKV_F64;
    d64.impl = QKV_IMPL_REFERENCE;
    double *o64 = malloc((size_t)p->no * sizeof(double)), *l64 = malloc((size_t)p->nl * sizeof(double));
    CHECK_STATUS(qkv_attention_forward(&d64, p->qd, p->kd, p->vd, o64, NULL, l64), QKV_OK);
    /* baseline */
    float *ob = malloc((size_t)p->no * sizeof(float)), *lb = malloc((size_t)p->nl * sizeof(float));
    float *dqb = NULL, *dkb = NULL, *dvb = NULL;
    if (backward) {
        dqb = malloc((size_t)p->nq * sizeof(float));
        dkb = malloc((size_t)p->nk * sizeof(float));
        dvb = malloc((size_t)p->nv * sizeof(float));
    }
    plain_half(p, ob, lb, dqb, dkb, dvb);
    double eb_o = err_f32(ob, o64, p->no), eb_l = err_f32(lb, l64, p->nl);
    /* the library */
    uint16_t *o = tu_guarded_alloc((size_t)p->no * 2);
    float *l = tu_guarded_alloc((size_t)p->nl * sizeof(float));
    qkv_status st = qkv_attention_forward(&p->d, p->q, p->k, p->v, o, NULL, l);
    CHECK(st == QKV_OK, "%s: forward status %d", what, (int)st);
    double e_o = err_half(dt, o, o64, p->no), e_l = err_f32(l, l64, p->nl);
    CHECK(e_o <= 2.0 * eb_o + 1e-5, "%s: out error %.3g > 2 x plain half %.3g", what, e_o, eb_o);
    CHECK(e_l <= 2.0 * eb_l + 1e-5, "%s: lse error %.3g > 2 x plain half %.3g", what, e_l, eb_l);
    CHECK(tu_guarded_ok(o) && tu_guarded_ok(l), "%s: guard bytes", what);
    /* fully masked rows: exactly 0 and -inf */
    int zero_ok = 1;
    for (int64_t b = 0; b < d->batch; b++)
        for (int64_t h = 0; h < d->heads; h++)
            for (int64_t i = 0; i < d->n_q; i++) {
                int64_t row = (b * d->heads + h) * d->n_q + i;
                if (l64[row] != -INFINITY) continue;
                if (l[row] != -INFINITY) zero_ok = 0;
                const uint16_t *orow = o + idx4(b, i, h, d->n_q, d->heads, d->dim_v);
                for (int64_t t = 0; t < d->dim_v; t++) zero_ok &= orow[t] == 0;
            }
    CHECK(zero_ok, "%s: a fully masked row is not 0 / -inf", what);

    if (backward) {
        double *dq64 = malloc((size_t)p->nq * sizeof(double)), *dk64 = malloc((size_t)p->nk * sizeof(double)),
               *dv64 = malloc((size_t)p->nv * sizeof(double));
        qkv_attn_grads g64 = {0};
        g64.dq = dq64; g64.dk = dk64; g64.dv = dv64;
        CHECK_STATUS(qkv_attention_backward(&d64, p->qd, p->kd, p->vd, NULL, NULL, p->doutd, &g64), QKV_OK);
        uint16_t *dq = tu_guarded_alloc((size_t)p->nq * 2), *dk = tu_guarded_alloc((size_t)p->nk * 2),
                 *dv = tu_guarded_alloc((size_t)p->nv * 2);
        qkv_attn_grads g = {0};
        g.dq = dq; g.dk = dk; g.dv = dv;
        st = qkv_attention_backward(&p->d, p->q, p->k, p->v, o, l, p->dout, &g);
        CHECK(st == QKV_OK, "%s: backward status %d", what, (int)st);
        double e[3] = {err_half(dt, dq, dq64, p->nq), err_half(dt, dk, dk64, p->nk), err_half(dt, dv, dv64, p->nv)};
        double eb[3] = {err_f32(dqb, dq64, p->nq), err_f32(dkb, dk64, p->nk), err_f32(dvb, dv64, p->nv)};
        const char *nm[3] = {"dq", "dk", "dv"};
        for (int t = 0; t < 3; t++)
            CHECK(e[t] <= 5.0 * eb[t] + 1e-5, "%s: %s error %.3g > 5 x plain half %.3g", what, nm[t], e[t], eb[t]);
        CHECK(tu_guarded_ok(dq) && tu_guarded_ok(dk) && tu_guarded_ok(dv), "%s: guard bytes (grads)", what);
        /* the same without out and lse (recomputed) */
        st = qkv_attention_backward(&p->d, p->q, p->k, p->v, NULL, NULL, p->dout, &g);
        e[0] = err_half(dt, dq, dq64, p->nq);
        CHECK(st == QKV_OK && e[0] <= 5.0 * eb[0] + 1e-5, "%s: backward without out/lse: %d, %.3g", what,
              (int)st, e[0]);
        tu_guarded_free(dq); tu_guarded_free(dk); tu_guarded_free(dv);
        free(dq64); free(dk64); free(dv64);
    }
    tu_guarded_free(o);
    tu_guarded_free(l);
    free(o64); free(l64); free(ob); free(lb); free(dqb); free(dkb); free(dvb);
}

typedef struct cfg {
    int64_t B, nq, nk, H, Hkv, D, Dv;
    qkv_mask mask;
    int64_t wl, wr;
    int lengths; /* key lengths: batch 0 full, batch 1 n_k/2 (or 0 when 2) */
    int packed;
} cfg;

static void test_attention(qkv_dtype dt, int backward) {
    static const cfg cfgs[] = {
        {1, 1, 1, 1, 0, 1, 0, QKV_MASK_NONE, 0, 0, 0, 0},
        {2, 17, 17, 2, 0, 8, 0, QKV_MASK_NONE, 0, 0, 0, 0},
        {1, 130, 130, 2, 1, 64, 0, QKV_MASK_CAUSAL, 0, 0, 0, 0},
        {1, 200, 203, 4, 2, 63, 65, QKV_MASK_NONE, 0, 0, 0, 0},
        {2, 70, 150, 2, 2, 32, 0, QKV_MASK_WINDOW, 5, 3, 1, 0},
        {1, 150, 40, 2, 1, 16, 0, QKV_MASK_CAUSAL, 0, 0, 0, 0},      /* n_q > n_k: empty rows */
        {1, 129, 129, 1, 0, 64, 0, QKV_MASK_CAUSAL_WINDOW, 31, 0, 0, 0},
        {2, 33, 65, 3, 1, 24, 0, QKV_MASK_NONE, 0, 0, 2, 0},         /* a batch with no keys */
        {1, 60, 60, 2, 0, 16, 0, QKV_MASK_CAUSAL, 0, 0, 0, 1},       /* packed sequences */
    };
    for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
        const cfg *f = &cfgs[c];
        /* arch -2: the default table with the bf16 fast path turned off */
        for (int arch = -2; arch < QKV_ARCH_COUNT; arch++) {
            if (arch >= 0 && !qkv_cpu_force_arch(arch)) continue;
            qkv_half_force_portable(arch == -2);
            for (int impl = 0; impl < 2; impl++) {
                hprob p;
                memset(&p, 0, sizeof p);
                qkv_attn_desc_init(&p.d);
                p.d.batch = f->B; p.d.n_q = f->nq; p.d.n_k = f->nk; p.d.heads = f->H;
                p.d.heads_kv = f->Hkv; p.d.dim = f->D; p.d.dim_v = f->Dv;
                p.d.mask = f->mask; p.d.window_left = f->wl; p.d.window_right = f->wr;
                p.d.impl = impl ? QKV_IMPL_FAST : QKV_IMPL_AUTO;
                if (f->lengths) {
                    p.kl[0] = f->nk;
                    p.kl[1] = f->lengths == 2 ? 0 : f->nk / 2;
                    p.d.key_lengths = p.kl;
                }
                if (f->packed) {
                    p.off[0] = 0; p.off[1] = 13; p.off[2] = 13; p.off[3] = f->nq;
                    p.d.num_seqs = 3;
                    p.d.seq_offsets_q = p.off;
                }
                if (!hp_make(&p, dt, 100 + c, 1.5)) {
                    CHECK(0, "config %zu invalid", c);
                    continue;
                }
                char what[160];
                snprintf(what, sizeof what, "%s cfg %zu arch %s impl %s", dt == QKV_BF16 ? "bf16" : "fp16", c,
                         arch == -2 ? "portable" : arch < 0 ? "default" : qkv_arch_name(arch),
                         impl ? "fast" : "auto");
                check_problem(&p, what, backward && arch < 0);
                hp_free(&p);
            }
        }
        qkv_cpu_force_arch(-1);
        qkv_half_force_portable(0);
    }
}

/* The bf16 fast forward: bitwise the same for any thread count and across
 * calls; larger problems (several tiles and query blocks) against the
 * reference; each row's visible keys beyond the pairs every row of its group
 * sees (odd window edges, causal diagonals). */
static void test_fast_path(void) {
    printf("bf16 fast forward (AVX512-BF16) %s\n", qkv_half_fast_available() ? "available" : "not available here");
    static const cfg cfgs[] = {
        {1, 300, 300, 2, 1, 64, 0, QKV_MASK_CAUSAL, 0, 0, 0, 0},
        {2, 257, 333, 2, 2, 80, 48, QKV_MASK_WINDOW, 37, 0, 1, 0},
        {1, 200, 200, 1, 0, 128, 0, QKV_MASK_CAUSAL_WINDOW, 1, 0, 0, 0},
        {1, 131, 131, 1, 0, 3, 5, QKV_MASK_WINDOW, 2, 3, 0, 0},
        {1, 64, 513, 8, 2, 64, 0, QKV_MASK_NONE, 0, 0, 0, 0},
    };
    for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
        const cfg *f = &cfgs[c];
        hprob p;
        memset(&p, 0, sizeof p);
        qkv_attn_desc_init(&p.d);
        p.d.batch = f->B; p.d.n_q = f->nq; p.d.n_k = f->nk; p.d.heads = f->H;
        p.d.heads_kv = f->Hkv; p.d.dim = f->D; p.d.dim_v = f->Dv;
        p.d.mask = f->mask; p.d.window_left = f->wl; p.d.window_right = f->wr;
        if (f->lengths) {
            p.kl[0] = f->nk - 3;
            p.kl[1] = f->nk / 3;
            p.d.key_lengths = p.kl;
        }
        if (!hp_make(&p, QKV_BF16, 300 + c, 2.0)) continue;
        char what[64];
        snprintf(what, sizeof what, "bf16 fast cfg %zu", c);
        check_problem(&p, what, 0);
        uint16_t *o1 = malloc((size_t)p.no * 2), *o2 = malloc((size_t)p.no * 2);
        float *l1 = malloc((size_t)p.nl * 4), *l2 = malloc((size_t)p.nl * 4);
        p.d.threads = 1;
        CHECK_STATUS(qkv_attention_forward(&p.d, p.q, p.k, p.v, o1, NULL, l1), QKV_OK);
        for (int th = 2; th <= 3; th++) {
            p.d.threads = th;
            CHECK_STATUS(qkv_attention_forward(&p.d, p.q, p.k, p.v, o2, NULL, l2), QKV_OK);
            CHECK(memcmp(o1, o2, (size_t)p.no * 2) == 0 && memcmp(l1, l2, (size_t)p.nl * 4) == 0,
                  "%s: %d threads differ from 1", what, th);
        }
        free(o1); free(o2); free(l1); free(l2);
        hp_free(&p);
    }
}

/* NaN in keys and values that no query sees changes nothing. */
static void test_masked_nan(qkv_dtype dt) {
    hprob p;
    memset(&p, 0, sizeof p);
    qkv_attn_desc_init(&p.d);
    p.d.batch = 2; p.d.n_q = 70; p.d.n_k = 140; p.d.heads = 2; p.d.dim = 32;
    p.d.mask = QKV_MASK_WINDOW; p.d.window_left = 10; p.d.window_right = 0;
    p.kl[0] = 140; p.kl[1] = 100;
    p.d.key_lengths = p.kl;
    if (!hp_make(&p, dt, 5, 1.0)) return;
    uint16_t *o1 = malloc((size_t)p.no * 2), *o2 = malloc((size_t)p.no * 2);
    float *l1 = malloc((size_t)p.nl * 4), *l2 = malloc((size_t)p.nl * 4);
    CHECK_STATUS(qkv_attention_forward(&p.d, p.q, p.k, p.v, o1, NULL, l1), QKV_OK);
    uint16_t nan = dt == QKV_BF16 ? 0x7fc0 : 0x7e00;
    /* batch 0: keys before the first query's window (j < 70 - 10); batch 1: past its length */
    for (int64_t h = 0; h < 2; h++)
        for (int64_t t = 0; t < 32; t++) {
            for (int64_t j = 0; j < 59; j++) {
                p.k[idx4(0, j, h, 140, 2, 32) + t] = nan;
                p.v[idx4(0, j, h, 140, 2, 32) + t] = nan;
            }
            for (int64_t j = 100; j < 140; j++) {
                p.k[idx4(1, j, h, 140, 2, 32) + t] = nan;
                p.v[idx4(1, j, h, 140, 2, 32) + t] = nan;
            }
        }
    CHECK_STATUS(qkv_attention_forward(&p.d, p.q, p.k, p.v, o2, NULL, l2), QKV_OK);
    CHECK(memcmp(o1, o2, (size_t)p.no * 2) == 0 && memcmp(l1, l2, (size_t)p.nl * 4) == 0,
          "NaN in masked keys changed the output (%s)", dt == QKV_BF16 ? "bf16" : "fp16");
    /* a NaN in a visible value reaches exactly the rows that see it */
    p.v[idx4(0, 69, 0, 140, 2, 32) + 3] = nan;
    CHECK_STATUS(qkv_attention_forward(&p.d, p.q, p.k, p.v, o2, NULL, l2), QKV_OK);
    int ok = 1;
    for (int64_t i = 0; i < 70; i++) {
        int sees = i >= 69 - 0 && i - 10 <= 69; /* query i at key position i + 70 */
        (void)sees;
        int64_t pos = i + 70;
        int vis = 69 >= pos - 10 && 69 <= pos;
        ok &= isnan(tu_half_to_f32(dt, o2[idx4(0, i, 0, 70, 2, 32) + 3])) == vis;
    }
    CHECK(ok, "NaN in a visible value: wrong rows");
    /* check_finite rejects it */
    p.d.check_finite = 1;
    CHECK_STATUS(qkv_attention_forward(&p.d, p.q, p.k, p.v, o2, NULL, l2), QKV_ERR_NOT_FINITE);
    free(o1); free(o2); free(l1); free(l2);
    hp_free(&p);
}

static long g_allocs, g_frees, g_fail_at = -1;
static void *count_malloc(size_t n, void *u) {
    (void)u;
    if (g_fail_at >= 0 && g_allocs >= g_fail_at) return NULL;
    g_allocs++;
    return malloc(n);
}
static void count_free(void *x, void *u) {
    (void)u;
    if (x) g_frees++;
    free(x);
}

static void test_errors_and_alloc(void) {
    hprob p;
    memset(&p, 0, sizeof p);
    qkv_attn_desc_init(&p.d);
    p.d.batch = 1; p.d.n_q = 40; p.d.n_k = 40; p.d.heads = 2; p.d.dim = 16;
    p.d.mask = QKV_MASK_CAUSAL;
    if (!hp_make(&p, QKV_BF16, 9, 1.0)) return;
    uint16_t *o = malloc((size_t)p.no * 2), *dq = malloc((size_t)p.nq * 2), *dk = malloc((size_t)p.nk * 2),
             *dv = malloc((size_t)p.nv * 2);
    float *l = malloc((size_t)p.nl * 4);
    qkv_attn_grads g = {0};
    g.dq = dq; g.dk = dk; g.dv = dv;
    CHECK_STATUS(qkv_attn_desc_check(&p.d), QKV_OK);
    CHECK_STATUS(qkv_attention_forward(&p.d, p.q, NULL, p.v, o, NULL, l), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_attention_forward(&p.d, p.q, p.k, p.v, NULL, NULL, l), QKV_ERR_NULL_POINTER);
    g.dk = NULL;
    CHECK_STATUS(qkv_attention_backward(&p.d, p.q, p.k, p.v, NULL, NULL, p.dout, &g), QKV_ERR_NULL_POINTER);
    g.dk = dk;
    qkv_attn_desc bad = p.d;
    bad.dtype = (qkv_dtype)6;
    CHECK_STATUS(qkv_attention_forward(&bad, p.q, p.k, p.v, o, NULL, l), QKV_ERR_BAD_ENUM);
    bad = p.d;
    bad.heads_kv = 3;
    CHECK_STATUS(qkv_attention_forward(&bad, p.q, p.k, p.v, o, NULL, l), QKV_ERR_HEADS);
    /* the attention matrix (float32) with half tensors */
    float *attn = malloc((size_t)p.pl.n_attn_elems * 4);
    CHECK_STATUS(qkv_attention_forward(&p.d, p.q, p.k, p.v, o, attn, l), QKV_OK);
    double rs = 0.0;
    for (int64_t j = 0; j < 40; j++) rs += attn[39 * 40 + j];
    CHECK(fabs(rs - 1.0) < 1e-5 && attn[1] == 0.0f, "attn rows: sum %.7f", rs);
    free(attn);
    /* allocation failures: every one reported, nothing leaked */
    for (int pass = 0; pass < 4; pass++) {
        p.d.dtype = pass & 1 ? QKV_F16 : QKV_BF16;
        int bwd = pass >= 2;
        CHECK_STATUS(qkv_set_allocator(count_malloc, count_free, NULL), QKV_OK);
        g_allocs = g_frees = 0;
        g_fail_at = -1;
        qkv_status st = bwd ? qkv_attention_backward(&p.d, p.q, p.k, p.v, NULL, NULL, p.dout, &g)
                            : qkv_attention_forward(&p.d, p.q, p.k, p.v, o, NULL, l);
        CHECK(st == QKV_OK && g_allocs == g_frees, "pass %d: %d, %ld/%ld", pass, (int)st, g_allocs, g_frees);
        long total = g_allocs;
        for (long k = 0; k < total; k++) {
            g_allocs = g_frees = 0;
            g_fail_at = k;
            st = bwd ? qkv_attention_backward(&p.d, p.q, p.k, p.v, NULL, NULL, p.dout, &g)
                     : qkv_attention_forward(&p.d, p.q, p.k, p.v, o, NULL, l);
            CHECK(st == QKV_ERR_OUT_OF_MEMORY && g_allocs == g_frees,
                  "pass %d: failing allocation %ld gave %d (%ld allocs, %ld frees)", pass, k, (int)st, g_allocs,
                  g_frees);
        }
        g_fail_at = -1;
        CHECK_STATUS(qkv_set_allocator(NULL, NULL, NULL), QKV_OK);
    }
    /* array dtypes too: 2 bytes (tests/test_npy_half.c) */
    CHECK(qkv_dtype_size(QKV_BF16) == 2 && qkv_dtype_size(QKV_F16) == 2, "dtype sizes");
    free(o); free(dq); free(dk); free(dv); free(l);
    hp_free(&p);
}

int main(void) {
    test_bf16_conversions();
    test_f16_conversions();
    test_attention(QKV_BF16, 1);
    test_attention(QKV_F16, 1);
    test_fast_path();
    test_masked_nan(QKV_BF16);
    test_masked_nan(QKV_F16);
    test_errors_and_alloc();
    return tu_finish();
}
