/* Reference backward, in double. Per query row it recomputes the logits and
 * weights exactly as the forward does, then:
 *   dP_j = dO_i . V_j                    dV_j += P_j dO_i
 *   dS_j = normaliser'(S)ᵀ dP            (softmax: P_j (dP_j - sum_l P_l dP_l))
 *   dbias_ij = dS_j                      d raw = dS (1 - tanh²(raw/c)) when soft-capped
 * and the score's own chain rule into dQ_i, dK_j (and the additive weights).
 * Masked keys (outside the range, or -inf bias) get and give nothing. */
#include <math.h>
#include <string.h>

#include "ref/ref.h"
#include "ref/ref_common.h"

typedef struct grad_acc {
    double *dq, *dk, *dv, *dbias, *dw1, *dw2, *dw, *drel; /* double accumulators */
    double *owned[8];
    double *duq, *duk;  /* ADDITIVE: dL/d(W1 q_i), dL/d(W2 k_j) of one (b, h) */
    double *dqhat;      /* COSINE: dL/d(q_i/|q_i|) of one row */
    double *dp;         /* dL/dP of one row, [n_k] */
} grad_acc;

static double *acc_buf(void *user, int64_t n, qkv_dtype t, double **owned, int *ok) {
    if (!user) return NULL;
    double *d = t == QKV_F64 ? user : qkv_alloc((size_t)n * sizeof(double));
    if (!d) {
        *ok = 0;
        return NULL;
    }
    if (t != QKV_F64) *owned = d;
    memset(d, 0, (size_t)n * sizeof(double));
    return d;
}

static void acc_free(grad_acc *g) {
    for (int i = 0; i < 8; i++) qkv_free(g->owned[i]);
    qkv_free(g->duq);
    qkv_free(g->duk);
    qkv_free(g->dqhat);
    qkv_free(g->dp);
}

/* Copy the double accumulators into the caller's F32 buffers. */
static void acc_flush(double *src, void *dst, int64_t n, qkv_dtype t) {
    if (!src || t == QKV_F64) return;
    float *f = dst;
    for (int64_t i = 0; i < n; i++) f[i] = (float)src[i];
}

/* d(x/max(|x|,eps)) chain rule, in place: g <- J(x)ᵀ g. */
static void normalise_backward(const double *x, double *g, int64_t dim) {
    double ss = 0.0, dot = 0.0;
    for (int64_t t = 0; t < dim; t++) ss += x[t] * x[t];
    double n = sqrt(ss);
    if (n <= REF_COSINE_EPS) { /* the floor is a constant: plain scaling */
        for (int64_t t = 0; t < dim; t++) g[t] /= REF_COSINE_EPS;
        return;
    }
    for (int64_t t = 0; t < dim; t++) dot += x[t] * g[t];
    for (int64_t t = 0; t < dim; t++) g[t] = (g[t] - x[t] * dot / ss) / n;
}

static void backward_row(const qkv_plan *p, ref_inputs *in, grad_acc *g, const double *dorow,
                         int64_t b, int64_t h, int64_t i) {
    const qkv_attn_desc *d = &p->d;
    const int64_t D = d->dim, Dv = d->dim_v, A = d->additive_dim, hk = h / p->group;
    int64_t lo, hi;
    qkv_plan_key_range(p, b, i, &lo, &hi);
    int64_t visible = ref_row_logits(p, in, b, h, i, lo, hi);
    double lse;
    ref_row_normalise(p, in, lo, hi, visible, &lse);
    if (visible == 0) return; /* fully masked row: no gradient anywhere */
    const int64_t pos = g->drel ? qkv_plan_query_position(p, i) : 0;

    const double *P = in->p, *S = in->s, *R = in->raw;
    double *dP = g->dp, pdp = 0.0;
    for (int64_t j = lo; j < hi; j++) {
        if (S[j] == -INFINITY) continue; /* masked by the bias: V_j never read */
        /* With dropout O = sum_j P_j Z_j V_j (Z_j the regenerated factor):
         * dV_j += P_j Z_j dO and dL/dP_j = Z_j (dO . V_j). */
        double z = d->dropout > 0.0 ? qkv_attn_dropout_keep(p, b, h, i, j) : 1.0;
        if (z == 0.0) {
            dP[j] = 0.0;
            continue;
        }
        const double *vj = in->v + ref_idx(b, j, hk, d->n_k, d->heads_kv, Dv);
        double *dvj = g->dv + ref_idx(b, j, hk, d->n_k, d->heads_kv, Dv);
        double dp = 0.0;
        for (int64_t t = 0; t < Dv; t++) {
            dp += dorow[t] * vj[t];
            dvj[t] += P[j] * z * dorow[t];
        }
        dP[j] = dp * z;
        pdp += P[j] * dP[j];
    }
    const double *qi = in->q + ref_idx(b, i, h, d->n_q, d->heads, D);
    double *dqi = g->dq + ref_idx(b, i, h, d->n_q, d->heads, D);
    double qinv = 1.0;
    if (d->score == QKV_SCORE_COSINE) {
        double ss = 0.0;
        for (int64_t t = 0; t < D; t++) ss += qi[t] * qi[t];
        qinv = 1.0 / (sqrt(ss) > REF_COSINE_EPS ? sqrt(ss) : REF_COSINE_EPS);
        memset(g->dqhat, 0, (size_t)D * sizeof(double));
    }
    for (int64_t j = lo; j < hi; j++) {
        if (S[j] == -INFINITY) continue;
        double dp = dP[j], ds;
        switch (d->norm) {
        case QKV_NORM_SOFTMAX: ds = P[j] * (dp - pdp); break;
        case QKV_NORM_RELU: {
            /* P > 0 exactly where the logit was > 0 (kink at 0: derivative 0). */
            ds = P[j] > 0.0 ? dp : 0.0;
            if (d->relu_divide_by_count) ds /= (double)visible;
            break;
        }
        default: ds = dp * P[j] * (1.0 - P[j]); break; /* sigmoid */
        }
        if (g->dbias) {
            int64_t bi = d->bias_kind == QKV_BIAS_PER_HEAD ? (h * d->n_q + i) * d->n_k + j
                                                           : i * d->n_k + j;
            g->dbias[bi] += ds;
        }
        if (g->drel) {
            g->drel[h * d->rel_buckets +
                    qkv_plan_rel_bucket(p, pos, j)] += ds;
        }
        if (d->softcap > 0.0) {
            double t = tanh(R[j] / d->softcap);
            ds *= 1.0 - t * t;
        }
        const double *kj = in->k + ref_idx(b, j, hk, d->n_k, d->heads_kv, D);
        double *dkj = g->dk + ref_idx(b, j, hk, d->n_k, d->heads_kv, D);
        switch (d->score) {
        case QKV_SCORE_SCALED_DOT:
        case QKV_SCORE_DOT:
            for (int64_t t = 0; t < D; t++) {
                dqi[t] += d->scale * ds * kj[t];
                dkj[t] += d->scale * ds * qi[t];
            }
            break;
        case QKV_SCORE_COSINE: {
            /* dk holds dL/d(k̂) until the end of the call (see below). */
            double c = ds / d->temperature;
            for (int64_t t = 0; t < D; t++) {
                g->dqhat[t] += c * kj[t] * in->kinv[j];
                dkj[t] += c * qi[t] * qinv;
            }
            break;
        }
        case QKV_SCORE_ADDITIVE: {
            const double *u = in->uq + i * A, *w = in->uk + j * A, *wv = in->w + h * A;
            for (int64_t a = 0; a < A; a++) {
                double t = tanh(u[a] + w[a]);
                if (g->dw) g->dw[h * A + a] += ds * t;
                double ga = ds * wv[a] * (1.0 - t * t);
                g->duq[i * A + a] += ga;
                g->duk[j * A + a] += ga;
            }
            break;
        }
        }
    }
    if (d->score == QKV_SCORE_COSINE) {
        normalise_backward(qi, g->dqhat, D);
        for (int64_t t = 0; t < D; t++) dqi[t] += g->dqhat[t];
    }
}

/* One side of the ADDITIVE score's projection u = W x (rows of x: the
 * queries or the keys of one (b, h)): given du = dL/du (n x A), push
 * dx += Wᵀ du and, when dw is given, dW += du xᵀ. */
static void additive_side_backward(const double *x, double *dx, int64_t n, int64_t hx, int64_t hn,
                                   const double *du, const double *w, double *dw, int64_t b, int64_t A,
                                   int64_t D) {
    for (int64_t i = 0; i < n; i++) {
        const double *xi = x + ref_idx(b, i, hx, n, hn, D);
        double *dxi = dx + ref_idx(b, i, hx, n, hn, D);
        for (int64_t a = 0; a < A; a++) {
            double dui = du[i * A + a];
            for (int64_t t = 0; t < D; t++) {
                dxi[t] += w[a * D + t] * dui;
                if (dw) dw[a * D + t] += dui * xi[t];
            }
        }
    }
}

/* ADDITIVE: push dL/d(W1 q), dL/d(W2 k) of one (b, h) into dq, dk, dW1, dW2. */
static void additive_head_backward(const qkv_plan *p, ref_inputs *in, grad_acc *g, int64_t b, int64_t h) {
    const qkv_attn_desc *d = &p->d;
    const int64_t D = d->dim, A = d->additive_dim, hk = h / p->group, w0 = h * A * D;
    additive_side_backward(in->q, g->dq, d->n_q, h, d->heads, g->duq, in->w1 + w0, g->dw1 ? g->dw1 + w0 : NULL, b,
                           A, D);
    additive_side_backward(in->k, g->dk, d->n_k, hk, d->heads_kv, g->duk, in->w2 + w0, g->dw2 ? g->dw2 + w0 : NULL,
                           b, A, D);
}

qkv_status qkv_ref_backward(const qkv_plan *p, const void *q, const void *k, const void *v,
                            const void *dout, const qkv_attn_grads *grads) {
    const qkv_attn_desc *d = &p->d;
    const qkv_dtype t = d->dtype;
    const int additive = d->score == QKV_SCORE_ADDITIVE;
    ref_inputs in;
    qkv_status st = ref_inputs_make(p, q, k, v, &in);
    if (st != QKV_OK) return st;

    grad_acc g;
    memset(&g, 0, sizeof g);
    int ok = 1;
    double *dorow_owned = NULL;
    g.dq = acc_buf(grads->dq, p->n_q_elems, t, &g.owned[0], &ok);
    g.dk = acc_buf(grads->dk, p->n_k_elems, t, &g.owned[1], &ok);
    g.dv = acc_buf(grads->dv, p->n_v_elems, t, &g.owned[2], &ok);
    if (d->bias_kind != QKV_BIAS_NONE)
        g.dbias = acc_buf(grads->dbias, p->n_bias_elems, t, &g.owned[3], &ok);
    if (d->rel_table) g.drel = acc_buf(grads->d_rel_table, p->n_rel_elems, t, &g.owned[7], &ok);
    if (additive) {
        g.dw1 = acc_buf(grads->d_additive_w1, p->n_add_w_elems, t, &g.owned[4], &ok);
        g.dw2 = acc_buf(grads->d_additive_w2, p->n_add_w_elems, t, &g.owned[5], &ok);
        g.dw = acc_buf(grads->d_additive_w, p->n_add_v_elems, t, &g.owned[6], &ok);
        g.duq = qkv_alloc((size_t)(d->n_q * d->additive_dim) * sizeof(double));
        g.duk = qkv_alloc((size_t)(d->n_k * d->additive_dim) * sizeof(double));
        ok = ok && g.duq && g.duk;
    }
    if (d->score == QKV_SCORE_COSINE) {
        g.dqhat = qkv_alloc((size_t)d->dim * sizeof(double));
        ok = ok && g.dqhat;
    }
    dorow_owned = qkv_alloc((size_t)d->dim_v * sizeof(double));
    g.dp = qkv_alloc((size_t)d->n_k * sizeof(double));
    ok = ok && dorow_owned && g.dp;
    if (!ok) {
        qkv_free(dorow_owned);
        acc_free(&g);
        ref_inputs_free(&in);
        return QKV_ERR_OUT_OF_MEMORY;
    }

    for (int64_t b = 0; b < d->batch; b++) {
        for (int64_t h = 0; h < d->heads; h++) {
            ref_prepare_head(p, &in, b, h);
            if (additive) {
                memset(g.duq, 0, (size_t)(d->n_q * d->additive_dim) * sizeof(double));
                memset(g.duk, 0, (size_t)(d->n_k * d->additive_dim) * sizeof(double));
            }
            for (int64_t i = 0; i < d->n_q; i++) {
                int64_t at = ref_idx(b, i, h, d->n_q, d->heads, d->dim_v);
                for (int64_t c = 0; c < d->dim_v; c++)
                    dorow_owned[c] = t == QKV_F64 ? ((const double *)dout)[at + c]
                                                  : (double)((const float *)dout)[at + c];
                backward_row(p, &in, &g, dorow_owned, b, h, i);
            }
            if (additive) additive_head_backward(p, &in, &g, b, h);
        }
    }
    /* COSINE: dk holds dL/d(k̂); turn it into dL/dk key by key. */
    if (d->score == QKV_SCORE_COSINE)
        for (int64_t r = 0; r < d->batch * d->n_k * d->heads_kv; r++)
            normalise_backward(in.k + r * d->dim, g.dk + r * d->dim, d->dim);

    acc_flush(g.dq, grads->dq, p->n_q_elems, t);
    acc_flush(g.dk, grads->dk, p->n_k_elems, t);
    acc_flush(g.dv, grads->dv, p->n_v_elems, t);
    acc_flush(g.dbias, grads->dbias, p->n_bias_elems, t);
    acc_flush(g.dw1, grads->d_additive_w1, p->n_add_w_elems, t);
    acc_flush(g.dw2, grads->d_additive_w2, p->n_add_w_elems, t);
    acc_flush(g.dw, grads->d_additive_w, p->n_add_v_elems, t);
    acc_flush(g.drel, grads->d_rel_table, p->n_rel_elems, t);
    qkv_free(dorow_owned);
    acc_free(&g);
    ref_inputs_free(&in);
    return QKV_OK;
}
