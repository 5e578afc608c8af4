/* Numerics under bad data (docs: qkv_attn_desc.check_finite in qkv.h):
 *   - NaN / inf in the inputs: propagated as documented with check_finite
 *     off (only into the rows that read them; a masked key is never read),
 *     rejected with QKV_ERR_NOT_FINITE and nothing written with it on;
 *   - extreme logits (+-1e30, from the inputs, the bias, or soft-capped):
 *     exact saturated weights, no NaN, finite gradients;
 *   - all-equal scores: uniform weights, zero dQ;
 *   - zero vectors under the cosine score: finite, equal to the reference.
 * Every case runs in float64 (reference) and float32 (default and reference
 * implementations). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

/* A problem of one batch, one head: Q [n, D], K and V [n, D]. */
enum { N = 6, D = 4 };

typedef struct mode {
    qkv_dtype dt;
    qkv_impl impl;
    const char *name;
} mode;

static const mode modes[] = {
    {QKV_F64, QKV_IMPL_REFERENCE, "f64/reference"},
    {QKV_F32, QKV_IMPL_AUTO, "f32/auto"},
    {QKV_F32, QKV_IMPL_REFERENCE, "f32/reference"},
};
#define N_MODES (int)(sizeof modes / sizeof modes[0])

static void desc(qkv_attn_desc *d, const mode *m) {
    qkv_attn_desc_init(d);
    d->dtype = m->dt;
    d->impl = m->impl;
    d->batch = 1;
    d->n_q = d->n_k = N;
    d->heads = 1;
    d->dim = D;
    d->threads = 1;
}

/* Tensors held in double, converted for the call. */
typedef struct buf {
    double x[N * N * 2];
    float f[N * N * 2];
} buf;

static void *in(buf *b, const mode *m, int n) {
    if (m->dt == QKV_F64) return b->x;
    for (int i = 0; i < n; i++) b->f[i] = (float)b->x[i];
    return b->f;
}

static double get(const buf *b, const mode *m, int i) {
    return m->dt == QKV_F64 ? b->x[i] : (double)b->f[i];
}

static void fill(buf *b, double val) {
    for (int i = 0; i < N * N * 2; i++) b->x[i] = val, b->f[i] = (float)val;
}

static void fill_pattern(buf *b, int seed) {
    for (int i = 0; i < N * N * 2; i++) {
        b->x[i] = (double)((i * 7 + seed * 3) % 11 - 5) / 4.0;
        b->f[i] = (float)b->x[i];
    }
}

static void test_propagation_and_rejection(void) {
    for (int mi = 0; mi < N_MODES; mi++) {
        const mode *m = &modes[mi];
        qkv_attn_desc d;
        buf q, k, v, out, bias, dout, dq, dk, dv;
        const double bad[3] = {NAN, INFINITY, -INFINITY};
        for (int bi = 0; bi < 3; bi++) {
            /* check_finite off: NaN/inf in q row 2 reaches row 2 only. */
            desc(&d, m);
            fill_pattern(&q, 1), fill_pattern(&k, 2), fill_pattern(&v, 3);
            q.x[2 * D + 1] = bad[bi];
            void *qp = in(&q, m, N * D), *kp = in(&k, m, N * D), *vp = in(&v, m, N * D);
            fill(&out, 0.0);
            CHECK_STATUS(qkv_attention_forward(&d, qp, kp, vp, m->dt == QKV_F64 ? (void *)out.x
                                                                           : (void *)out.f,
                                               NULL, NULL),
                         QKV_OK);
            int row2_bad = 0, others_ok = 1;
            for (int i = 0; i < N; i++)
                for (int t = 0; t < D; t++) {
                    double o = get(&out, m, i * D + t);
                    if (i == 2) row2_bad |= !isfinite(o);
                    else others_ok &= isfinite(o);
                }
            CHECK(row2_bad && others_ok, "%s: %g in q row 2 must reach row 2 only", m->name,
                  bad[bi]);

            /* A NaN in a key that the causal mask hides from query 0 (and
             * only visible to the last query) leaves the other rows finite. */
            fill_pattern(&q, 1);
            k.x[(N - 1) * D] = bad[bi];
            d.mask = QKV_MASK_CAUSAL;
            qp = in(&q, m, N * D), kp = in(&k, m, N * D);
            CHECK_STATUS(qkv_attention_forward(&d, qp, kp, vp, m->dt == QKV_F64 ? (void *)out.x
                                                                           : (void *)out.f,
                                               NULL, NULL),
                         QKV_OK);
            others_ok = 1;
            for (int i = 0; i < N - 1; i++)
                for (int t = 0; t < D; t++) others_ok &= isfinite(get(&out, m, i * D + t));
            CHECK(others_ok, "%s: %g in a masked key leaked into a row that cannot see it",
                  m->name, bad[bi]);

            /* check_finite on: rejected, nothing written. */
            d.check_finite = 1;
            fill(&out, 7.0);
            void *op = m->dt == QKV_F64 ? (void *)out.x : (void *)out.f;
            CHECK_STATUS(qkv_attention_forward(&d, qp, kp, vp, op, NULL, NULL), QKV_ERR_NOT_FINITE);
            int untouched = 1;
            for (int i = 0; i < N * D; i++) untouched &= get(&out, m, i) == 7.0;
            CHECK(untouched, "%s: output written although the call was refused", m->name);
            fill_pattern(&k, 2);
            kp = in(&k, m, N * D);
            v.x[5] = bad[bi];
            vp = in(&v, m, N * D);
            CHECK_STATUS(qkv_attention_forward(&d, qp, kp, vp, op, NULL, NULL), QKV_ERR_NOT_FINITE);
            fill_pattern(&v, 3);
            vp = in(&v, m, N * D);
            CHECK_STATUS(qkv_attention_forward(&d, qp, kp, vp, op, NULL, NULL), QKV_OK);

            /* The bias: -inf is a mask (accepted), NaN and +inf are not. */
            fill(&bias, 0.0);
            bias.x[3] = bad[bi];
            d.bias_kind = QKV_BIAS_SHARED;
            d.bias = in(&bias, m, N * N);
            CHECK_STATUS(qkv_attention_forward(&d, qp, kp, vp, op, NULL, NULL),
                         bad[bi] == -INFINITY ? QKV_OK : QKV_ERR_NOT_FINITE);
            d.bias_kind = QKV_BIAS_NONE;
            d.bias = NULL;

            /* Backward: a bad dout is refused, the gradients untouched. */
            fill_pattern(&dout, 4);
            dout.x[7] = bad[bi];
            fill(&dq, 3.0), fill(&dk, 3.0), fill(&dv, 3.0);
            int f64 = m->dt == QKV_F64;
            qkv_attn_grads g = {f64 ? (void *)dq.x : (void *)dq.f, f64 ? (void *)dk.x : (void *)dk.f,
                                f64 ? (void *)dv.x : (void *)dv.f, NULL, NULL, NULL, NULL, NULL};
            CHECK_STATUS(qkv_attention_backward(&d, qp, kp, vp, NULL, NULL, in(&dout, m, N * D), &g),
                         QKV_ERR_NOT_FINITE);
            untouched = 1;
            for (int i = 0; i < N * D; i++)
                untouched &= get(&dq, m, i) == 3.0 && get(&dk, m, i) == 3.0 && get(&dv, m, i) == 3.0;
            CHECK(untouched, "%s: gradients written although the backward was refused", m->name);
            fill_pattern(&dout, 4);
            CHECK_STATUS(qkv_attention_backward(&d, qp, kp, vp, NULL, NULL, in(&dout, m, N * D), &g),
                         QKV_OK);
            /* With check_finite off the same dout propagates (no error). */
            d.check_finite = 0;
            dout.x[7] = bad[bi];
            CHECK_STATUS(qkv_attention_backward(&d, qp, kp, vp, NULL, NULL, in(&dout, m, N * D), &g),
                         QKV_OK);
        }
    }
    CHECK(strcmp(qkv_status_string(QKV_ERR_NOT_FINITE), "unknown status") != 0, "status text");
    CHECK(strcmp(qkv_status_string(QKV_ERR_MEMORY_LIMIT), "unknown status") != 0, "status text");
}

/* Logits of +-1e30: saturated weights, exactly, and finite gradients. */
static void test_extreme_logits(void) {
    for (int mi = 0; mi < N_MODES; mi++) {
        const mode *m = &modes[mi];
        for (int how = 0; how < 3; how++) { /* from q.k, from the bias, soft-capped */
            qkv_attn_desc d;
            buf q, k, v, out, attn, bias, dout, dq, dk, dv;
            desc(&d, m);
            d.score = QKV_SCORE_DOT;
            fill(&q, 0.0), fill(&k, 0.0), fill_pattern(&v, 5), fill_pattern(&dout, 6);
            fill(&bias, 0.0);
            /* q.k: query and key of equal parity score +1e30, else -1e30
             * (q_i = (+-1e15, 0, ...), k_j likewise). Bias: query i scores
             * +1e30 on key (i + 1) % N, -1e30 on key i, 0 elsewhere. */
            for (int i = 0; i < N; i++) {
                if (how == 0) {
                    q.x[i * D] = i % 2 ? 1e15 : -1e15;
                    k.x[i * D] = i % 2 ? 1e15 : -1e15;
                } else {
                    bias.x[i * N + (i + 1) % N] = 1e30;
                    bias.x[i * N + i] = -1e30;
                }
            }
            if (how > 0) {
                d.bias_kind = QKV_BIAS_SHARED;
                d.bias = in(&bias, m, N * N);
            }
            if (how == 2) d.softcap = 30.0; /* 1e30 -> 30, -1e30 -> -30 */
            int f64 = m->dt == QKV_F64;
            void *op = f64 ? (void *)out.x : (void *)out.f, *ap = f64 ? (void *)attn.x : (void *)attn.f;
            void *qp = in(&q, m, N * D), *kp = in(&k, m, N * D), *vp = in(&v, m, N * D);
            CHECK_STATUS(qkv_attention_forward(&d, qp, kp, vp, op, ap, NULL), QKV_OK);
            double worst = 0.0;
            int nan = 0;
            for (int i = 0; i < N; i++) {
                for (int j = 0; j < N; j++) {
                    double a = get(&attn, m, i * N + j), want;
                    if (how == 0) /* the keys of the query's sign share the weight */
                        want = ((i % 2) == (j % 2)) ? 1.0 / 3.0 : 0.0;
                    else if (how == 1)
                        want = j == (i + 1) % N ? 1.0 : 0.0;
                    else { /* soft-capped: e^30, e^-30 and e^0 x (N - 2) */
                        double z = exp(30.0) + exp(-30.0) + (N - 2);
                        want = (j == (i + 1) % N ? exp(30.0) : j == i ? exp(-30.0) : 1.0) / z;
                    }
                    nan |= isnan(a);
                    if (fabs(a - want) > worst) worst = fabs(a - want);
                }
                for (int t = 0; t < D; t++) nan |= !isfinite(get(&out, m, i * D + t));
            }
            CHECK(!nan && worst <= 1e-6, "%s, extreme logits (case %d): max weight error %g%s",
                  m->name, how, worst, nan ? ", NaN" : "");
            qkv_attn_grads g = {f64 ? (void *)dq.x : (void *)dq.f, f64 ? (void *)dk.x : (void *)dk.f,
                                f64 ? (void *)dv.x : (void *)dv.f, NULL, NULL, NULL, NULL, NULL};
            CHECK_STATUS(qkv_attention_backward(&d, qp, kp, vp, NULL, NULL, in(&dout, m, N * D), &g),
                         QKV_OK);
            int finite = 1;
            for (int i = 0; i < N * D; i++)
                finite &= isfinite(get(&dq, m, i)) && isfinite(get(&dk, m, i)) &&
                          isfinite(get(&dv, m, i));
            CHECK(finite, "%s, extreme logits (case %d): non-finite gradient", m->name, how);
            /* Sigmoid: weights exactly 1 and 0 at +-1e30. */
            if (how == 1) {
                d.norm = QKV_NORM_SIGMOID;
                CHECK_STATUS(qkv_attention_forward(&d, qp, kp, vp, op, ap, NULL), QKV_OK);
                int exact = 1;
                for (int i = 0; i < N; i++) {
                    exact &= get(&attn, m, i * N + (i + 1) % N) == 1.0;
                    exact &= get(&attn, m, i * N + i) == 0.0;
                }
                CHECK(exact, "%s: sigmoid of +-1e30 is not exactly 1 and 0", m->name);
            }
        }
    }
}

/* Equal scores: uniform weights over the visible keys, zero dQ. */
static void test_all_equal(void) {
    for (int mi = 0; mi < N_MODES; mi++) {
        const mode *m = &modes[mi];
        for (int causal = 0; causal < 2; causal++) {
            qkv_attn_desc d;
            buf q, k, v, out, attn, dout, dq, dk, dv;
            desc(&d, m);
            d.mask = causal ? QKV_MASK_CAUSAL : QKV_MASK_NONE;
            fill_pattern(&q, 1), fill_pattern(&v, 3), fill_pattern(&dout, 4);
            for (int j = 0; j < N; j++)
                for (int t = 0; t < D; t++) k.x[j * D + t] = (double)(t + 1) / 4.0; /* one key, N times */
            int f64 = m->dt == QKV_F64;
            void *op = f64 ? (void *)out.x : (void *)out.f, *ap = f64 ? (void *)attn.x : (void *)attn.f;
            void *qp = in(&q, m, N * D), *kp = in(&k, m, N * D), *vp = in(&v, m, N * D);
            CHECK_STATUS(qkv_attention_forward(&d, qp, kp, vp, op, ap, NULL), QKV_OK);
            double worst = 0.0, worst_o = 0.0;
            for (int i = 0; i < N; i++) {
                int vis = causal ? i + 1 : N;
                for (int j = 0; j < N; j++) {
                    double want = j < vis ? 1.0 / vis : 0.0;
                    worst = fmax(worst, fabs(get(&attn, m, i * N + j) - want));
                }
                for (int t = 0; t < D; t++) {
                    double mean = 0.0;
                    for (int j = 0; j < vis; j++) mean += v.x[j * D + t] / vis;
                    worst_o = fmax(worst_o, fabs(get(&out, m, i * D + t) - mean));
                }
            }
            double tol = f64 ? 1e-14 : 1e-6;
            CHECK(worst <= tol && worst_o <= tol, "%s%s: equal scores: weight error %g, output %g",
                  m->name, causal ? " causal" : "", worst, worst_o);
            qkv_attn_grads g = {f64 ? (void *)dq.x : (void *)dq.f, f64 ? (void *)dk.x : (void *)dk.f,
                                f64 ? (void *)dv.x : (void *)dv.f, NULL, NULL, NULL, NULL, NULL};
            CHECK_STATUS(qkv_attention_backward(&d, qp, kp, vp, NULL, NULL, in(&dout, m, N * D), &g),
                         QKV_OK);
            double dqmax = 0.0;
            for (int i = 0; i < N * D; i++) dqmax = fmax(dqmax, fabs(get(&dq, m, i)));
            CHECK(dqmax <= (f64 ? 1e-14 : 1e-6), "%s: equal keys must give dQ = 0, got %g", m->name,
                  dqmax);
        }
    }
}

/* Cosine scores with zero vectors: |x| is floored at 1e-12, so a zero query
 * scores 0 against every key (uniform weights) and a zero key scores 0. */
static void test_cosine_zero_vectors(void) {
    buf ref_out;
    for (int mi = 0; mi < N_MODES; mi++) {
        const mode *m = &modes[mi];
        qkv_attn_desc d;
        buf q, k, v, out, attn, dout, dq, dk, dv;
        desc(&d, m);
        d.score = QKV_SCORE_COSINE;
        d.temperature = 0.1;
        fill_pattern(&q, 1), fill_pattern(&k, 2), fill_pattern(&v, 3), fill_pattern(&dout, 4);
        for (int t = 0; t < D; t++) q.x[1 * D + t] = 0.0, k.x[3 * D + t] = 0.0;
        int f64 = m->dt == QKV_F64;
        void *op = f64 ? (void *)out.x : (void *)out.f, *ap = f64 ? (void *)attn.x : (void *)attn.f;
        void *qp = in(&q, m, N * D), *kp = in(&k, m, N * D), *vp = in(&v, m, N * D);
        CHECK_STATUS(qkv_attention_forward(&d, qp, kp, vp, op, ap, NULL), QKV_OK);
        double uni = 0.0;
        for (int j = 0; j < N; j++) uni = fmax(uni, fabs(get(&attn, m, 1 * N + j) - 1.0 / N));
        CHECK(uni <= 1e-6, "%s: a zero query under cosine must weigh keys uniformly (error %g)",
              m->name, uni);
        int finite = 1;
        for (int i = 0; i < N * D; i++) finite &= isfinite(get(&out, m, i));
        CHECK(finite, "%s: zero vectors under cosine gave a non-finite output", m->name);
        if (mi == 0) {
            ref_out = out;
        } else {
            double e = 0.0;
            for (int i = 0; i < N * D; i++) e = fmax(e, fabs(get(&out, m, i) - ref_out.x[i]));
            CHECK(e <= 1e-5, "%s: zero vectors under cosine: %g from the float64 reference",
                  m->name, e);
        }
        qkv_attn_grads g = {f64 ? (void *)dq.x : (void *)dq.f, f64 ? (void *)dk.x : (void *)dk.f,
                            f64 ? (void *)dv.x : (void *)dv.f, NULL, NULL, NULL, NULL, NULL};
        CHECK_STATUS(qkv_attention_backward(&d, qp, kp, vp, NULL, NULL, in(&dout, m, N * D), &g),
                     QKV_OK);
        finite = 1;
        for (int i = 0; i < N * D; i++)
            finite &= !isnan(get(&dq, m, i)) && !isnan(get(&dk, m, i)) && isfinite(get(&dv, m, i));
        CHECK(finite, "%s: zero vectors under cosine gave a NaN gradient", m->name);
    }
}

int main(void) {
    test_propagation_and_rejection();
    test_extreme_logits();
    test_all_equal();
    test_cosine_zero_vectors();
    return tu_finish();
}
