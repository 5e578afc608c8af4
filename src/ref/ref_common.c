/* The reference's scores and normalisers, in double, one query row at a time. */
#include "ref/ref_common.h"

#include <math.h>
#include <string.h>

static const double *as_f64(const void *src, int64_t n, qkv_dtype t, double **owned, int *ok) {
    if (!src || t == QKV_F64) return src;
    double *d = qkv_alloc((size_t)n * sizeof(double));
    if (!d) {
        *ok = 0;
        return NULL;
    }
    const float *f = src;
    for (int64_t i = 0; i < n; i++) d[i] = (double)f[i];
    *owned = d;
    return d;
}

qkv_status ref_inputs_make(const qkv_plan *p, const void *q, const void *k, const void *v,
                           ref_inputs *in) {
    const qkv_attn_desc *d = &p->d;
    memset(in, 0, sizeof *in);
    int ok = 1;
    in->q = as_f64(q, p->n_q_elems, d->dtype, &in->owned[0], &ok);
    in->k = as_f64(k, p->n_k_elems, d->dtype, &in->owned[1], &ok);
    in->v = as_f64(v, p->n_v_elems, d->dtype, &in->owned[2], &ok);
    if (d->bias_kind != QKV_BIAS_NONE)
        in->bias = as_f64(d->bias, p->n_bias_elems, d->dtype, &in->owned[3], &ok);
    if (d->alibi_slopes) in->alibi = as_f64(d->alibi_slopes, d->heads, d->dtype, &in->owned[7], &ok);
    if (d->rel_table) in->rel = as_f64(d->rel_table, p->n_rel_elems, d->dtype, &in->owned[8], &ok);
    if (d->score == QKV_SCORE_ADDITIVE) {
        int64_t rows = d->n_q > d->n_k ? d->n_q : d->n_k, f[2] = {rows, d->additive_dim}, c;
        if (!qkv_count_ok(&c, sizeof(double), 2, f)) {
            ref_inputs_free(in);
            return QKV_ERR_SIZE_OVERFLOW;
        }
        in->w1 = as_f64(d->additive_w1, p->n_add_w_elems, d->dtype, &in->owned[4], &ok);
        in->w2 = as_f64(d->additive_w2, p->n_add_w_elems, d->dtype, &in->owned[5], &ok);
        in->w = as_f64(d->additive_w, p->n_add_v_elems, d->dtype, &in->owned[6], &ok);
        in->uq = qkv_alloc((size_t)(d->n_q * d->additive_dim) * sizeof(double));
        in->uk = qkv_alloc((size_t)(d->n_k * d->additive_dim) * sizeof(double));
        ok = ok && in->uq && in->uk;
    }
    if (d->score == QKV_SCORE_COSINE) {
        in->kinv = qkv_alloc((size_t)d->n_k * sizeof(double));
        ok = ok && in->kinv;
    }
    in->raw = qkv_alloc((size_t)d->n_k * sizeof(double));
    in->s = qkv_alloc((size_t)d->n_k * sizeof(double));
    in->p = qkv_alloc((size_t)d->n_k * sizeof(double));
    ok = ok && in->raw && in->s && in->p;
    if (!ok) {
        ref_inputs_free(in);
        return QKV_ERR_OUT_OF_MEMORY;
    }
    return QKV_OK;
}

void ref_inputs_free(ref_inputs *in) {
    for (int i = 0; i < 9; i++) qkv_free(in->owned[i]);
    QKV_FREE_ALL(in->kinv, in->uq, in->uk, in->raw, in->s, in->p);
    memset(in, 0, sizeof *in);
}

static double inv_norm(const double *x, int64_t dim) {
    double ss = 0.0;
    for (int64_t t = 0; t < dim; t++) ss += x[t] * x[t];
    double n = sqrt(ss);
    return 1.0 / (n > REF_COSINE_EPS ? n : REF_COSINE_EPS);
}

/* out[r, a] = sum_t W[a, t] x_r[t] for the rows of one (b, head) of x. */
static void project_rows(const double *w, const double *x, int64_t b, int64_t head, int64_t n,
                         int64_t heads, int64_t dim, int64_t a_dim, double *out) {
    for (int64_t r = 0; r < n; r++) {
        const double *xr = x + ref_idx(b, r, head, n, heads, dim);
        for (int64_t a = 0; a < a_dim; a++) {
            double acc = 0.0;
            for (int64_t t = 0; t < dim; t++) acc += w[a * dim + t] * xr[t];
            out[r * a_dim + a] = acc;
        }
    }
}

void ref_prepare_head(const qkv_plan *p, ref_inputs *in, int64_t b, int64_t h) {
    const qkv_attn_desc *d = &p->d;
    int64_t hk = h / p->group;
    if (d->score == QKV_SCORE_COSINE)
        for (int64_t j = 0; j < d->n_k; j++)
            in->kinv[j] = inv_norm(in->k + ref_idx(b, j, hk, d->n_k, d->heads_kv, d->dim), d->dim);
    if (d->score == QKV_SCORE_ADDITIVE) {
        int64_t A = d->additive_dim;
        project_rows(in->w1 + h * A * d->dim, in->q, b, h, d->n_q, d->heads, d->dim, A, in->uq);
        project_rows(in->w2 + h * A * d->dim, in->k, b, hk, d->n_k, d->heads_kv, d->dim, A, in->uk);
    }
}

int64_t ref_row_logits(const qkv_plan *p, ref_inputs *in, int64_t b, int64_t h, int64_t i,
                       int64_t lo, int64_t hi) {
    const qkv_attn_desc *d = &p->d;
    int64_t hk = h / p->group, D = d->dim, A = d->additive_dim;
    const double *qi = in->q + ref_idx(b, i, h, d->n_q, d->heads, D);
    double qinv = d->score == QKV_SCORE_COSINE ? inv_norm(qi, D) : 1.0;
    const double *brow = NULL;
    if (d->bias_kind == QKV_BIAS_SHARED) brow = in->bias + i * d->n_k;
    if (d->bias_kind == QKV_BIAS_PER_HEAD) brow = in->bias + (h * d->n_q + i) * d->n_k;
    int64_t pos = (in->alibi || in->rel) ? qkv_plan_query_position(p, i) : 0;
    int64_t visible = 0;
    for (int64_t j = lo; j < hi; j++) {
        double r = 0.0;
        if (brow && brow[j] == -INFINITY) {
            /* Masked by the bias: K_j is not read (NaN there cannot leak). */
            in->raw[j] = 0.0;
            in->s[j] = -INFINITY;
            continue;
        }
        if (d->score == QKV_SCORE_ADDITIVE) {
            const double *u = in->uq + i * A, *w = in->uk + j * A, *wv = in->w + h * A;
            for (int64_t a = 0; a < A; a++) r += wv[a] * tanh(u[a] + w[a]);
        } else {
            const double *kj = in->k + ref_idx(b, j, hk, d->n_k, d->heads_kv, D);
            for (int64_t t = 0; t < D; t++) r += qi[t] * kj[t];
            if (d->score == QKV_SCORE_SCALED_DOT) r *= d->scale;
            if (d->score == QKV_SCORE_COSINE) r *= qinv * in->kinv[j] / d->temperature;
        }
        in->raw[j] = r;
        double s = d->softcap > 0.0 ? d->softcap * tanh(r / d->softcap) : r;
        if (brow) s += brow[j];
        if (in->alibi) s -= in->alibi[h] * (double)(j > pos ? j - pos : pos - j);
        if (in->rel)
            s += in->rel[h * d->rel_buckets +
                         qkv_plan_rel_bucket(p, pos, j)];
        in->s[j] = s;
        if (s != -INFINITY) visible++;
    }
    return visible;
}

void ref_row_normalise(const qkv_plan *p, ref_inputs *in, int64_t lo, int64_t hi, int64_t visible,
                       double *lse) {
    const qkv_attn_desc *d = &p->d;
    const double *s = in->s;
    double *pr = in->p;
    /* Two-pass log-sum-exp: subtract the max so that exp never overflows.
     * NaN logits are skipped by the max and propagate through the sum. */
    double m = -INFINITY;
    int has_nan = 0;
    for (int64_t j = lo; j < hi; j++) {
        if (s[j] > m) m = s[j];
        has_nan |= isnan(s[j]);
    }
    double sum = 0.0;
    if (m != -INFINITY)
        for (int64_t j = lo; j < hi; j++) sum += exp(s[j] - m);
    *lse = has_nan ? NAN : (m == -INFINITY ? -INFINITY : m + log(sum));

    for (int64_t j = lo; j < hi; j++) {
        double x = s[j];
        if (x == -INFINITY) {
            pr[j] = 0.0; /* masked by the bias */
            continue;
        }
        switch (d->norm) {
        case QKV_NORM_SOFTMAX: pr[j] = exp(x - m) / sum; break;
        case QKV_NORM_RELU:
            /* x < 0 is false for NaN, so NaN propagates. */
            pr[j] = x < 0.0 ? 0.0 : x;
            if (d->relu_divide_by_count) pr[j] /= (double)visible;
            break;
        case QKV_NORM_SIGMOID: pr[j] = 1.0 / (1.0 + exp(-x)); break;
        }
    }
}
