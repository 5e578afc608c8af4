/* Portable attention tile kernels: plain C loops over the contract in
 * kernels/attn.h,
 * written so that a compiler can vectorise them with the baseline ISA. Also
 * the fallback on non-x86 machines. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/attn.h"

static void qk_generic(const float *q, size_t ldq, const float *kp, size_t D, size_t rows,
                       size_t ncols, float *s, size_t lds) {
    const size_t nc = QKV_QK_COLS(ncols);
    for (size_t p = 0; p * QKV_PANEL < nc; p++) {
        const float *panel = kp + p * D * QKV_PANEL;
        const size_t w = nc - p * QKV_PANEL < QKV_PANEL ? nc - p * QKV_PANEL : QKV_PANEL;
        for (size_t r = 0; r < rows; r++) {
            float acc[QKV_PANEL];
            for (size_t c = 0; c < w; c++) acc[c] = 0.0f;
            const float *qr = q + r * ldq;
            for (size_t d = 0; d < D; d++) {
                float x = qr[d];
                const float *kd = panel + d * QKV_PANEL;
                for (size_t c = 0; c < w; c++) acc[c] += x * kd[c];
            }
            float *sr = s + r * lds + p * QKV_PANEL;
            for (size_t c = 0; c < w; c++) sr[c] = acc[c];
        }
    }
}

static void pv_generic(float *o, size_t ldo, const float *alpha, const float *p, size_t ldp,
                       size_t pcs, const float *v, size_t ldv, size_t nk, size_t dv, size_t rows) {
    for (size_t r = 0; r < rows; r++) {
        float *orow = o + r * ldo;
        if (alpha) {
            float a = alpha[r];
            for (size_t c = 0; c < dv; c++) orow[c] *= a;
        }
        const float *prow = p + r * ldp;
        for (size_t j = 0; j < nk; j++) {
            float w = prow[j * pcs];
            const float *vj = v + j * ldv;
            for (size_t c = 0; c < dv; c++) orow[c] += w * vj[c];
        }
    }
}

static float exp2_one(float x) {
    /* Below -126 the result would be subnormal: flush to exactly 0. NaN
     * compares false and goes through exp2f, which keeps it. */
    return x < -126.0f ? 0.0f : exp2f(x);
}

static void exp2_generic(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = exp2_one(x[i]);
}

static void softmax_generic(float *s, size_t lds, size_t rows, size_t cols, float cm, float *m,
                            float *l, float *alpha) {
    for (size_t r = 0; r < rows; r++) {
        float *row = s + r * lds;
        float mt = -INFINITY;
        for (size_t c = 0; c < cols; c++) mt = row[c] > mt ? row[c] : mt;
        float mn = m[r] > mt ? m[r] : mt;
        float a = 1.0f, base = 0.0f;
        if (mn != -INFINITY) {
            base = mn;
            a = exp2_one((m[r] - mn) * cm);
        }
        float sum = 0.0f;
        for (size_t c = 0; c < cols; c++) {
            float e = exp2_one((row[c] - base) * cm);
            row[c] = e;
            sum += e;
        }
        l[r] = l[r] * a + sum;
        m[r] = mn;
        alpha[r] = a;
    }
}

static void bwd_softmax_generic(float *s, float *dp, size_t ld, size_t rows, size_t cols, float cm,
                                const float *M, const float *L, const float *Dd, int percol) {
    for (size_t r = 0; r < rows; r++) {
        float *sr = s + r * ld, *dr = dp + r * ld;
        for (size_t c = 0; c < cols; c++) {
            float x = percol ? L[c] : L[r], y = percol ? Dd[c] : Dd[r];
            float mu = M ? (percol ? M[c] : M[r]) : 0.0f;
            float sv = M ? sr[c] - mu : sr[c];
            float e = (float)((double)cm * sv - x); /* exact product, as an fma */
            if (e > QKV_BWD_EXP_MAX) e = QKV_BWD_EXP_MAX; /* p never overflows; NaN stays */
            float p = exp2_one(e);
            sr[c] = p;
            dr[c] = p == 0.0f ? 0.0f : p * (dr[c] - y);
        }
    }
}

/* By blocks of 8 dimensions, so that the 32 rows' stores stay within 8 lines
 * of the panel (1 KB) while the rows are read. */
static void pack_panel_generic(float *panel, const float *src, size_t ld, size_t nrows, size_t D, int stream) {
    (void)stream; /* no streaming store in portable C */
    for (size_t d0 = 0; d0 < D; d0 += 8) {
        size_t d1 = D - d0 < 8 ? D : d0 + 8;
        for (size_t r = 0; r < QKV_PANEL; r++)
            for (size_t d = d0; d < d1; d++) panel[d * QKV_PANEL + r] = r < nrows ? src[r * ld + d] : 0.0f;
    }
}

/* Portable C has no streaming store: ordinary ones, nothing to fence. */
static void scale_stream_generic(float *o, const float *x, float mul, size_t n) {
    for (size_t i = 0; i < n; i++) o[i] = x[i] * mul;
}

static void stream_fence_generic(void) {}

static int all_finite_generic(const float *x, size_t n) {
    uint32_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, x + i, sizeof u);
        bad |= (u & 0x7f800000u) == 0x7f800000u;
    }
    return !bad;
}

static void scale_bias_generic(float *x, size_t n, double mul, const float *add) {
    for (size_t i = 0; i < n; i++) {
        float t = (float)((double)x[i] * mul);
        x[i] = add ? t + add[i] : t;
    }
}

static void dropout_generic(float *x, float *y, size_t ld, size_t rows, size_t cols, const uint64_t *R,
                            const uint64_t *C, uint64_t thr, float scale) {
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++) {
            float f = qkv_dropout_factor(R[r] + C[c], thr, scale);
            x[r * ld + c] *= f;
            if (y) y[r * ld + c] = f;
        }
}

QKV_ATTN_DEFINE_INIT(generic)
