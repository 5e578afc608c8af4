/* Shared pieces of the reference forward and backward: inputs viewed in
 * double, and the logits of one query row. Both passes call the same
 * ref_row_logits so that they see identical numbers. */
#ifndef QKV_REF_COMMON_H
#define QKV_REF_COMMON_H

#include "core/internal.h"

/* Every float input of a call, in double (borrowed when the call is F64,
 * converted copies when F32), plus per-call workspaces. */
typedef struct ref_inputs {
    const double *q, *k, *v, *bias, *w1, *w2, *w, *alibi, *rel;
    double *owned[9];       /* copies to free */
    double *kinv;           /* COSINE: 1/max(|k_j|, eps) for one (b, kv head), [n_k] */
    double *uq;             /* ADDITIVE: W1_h q_i for one (b, h), [n_q, A] */
    double *uk;             /* ADDITIVE: W2_h k_j for one (b, h), [n_k, A] */
    double *raw;            /* one row of logits before soft-capping, [n_k] */
    double *s;              /* one row of final logits (-inf = masked), [n_k] */
    double *p;              /* one row of weights A', [n_k] */
} ref_inputs;

/* Floor of |x| in cosine scores, as torch.nn.functional.normalize. */
#define REF_COSINE_EPS 1e-12

qkv_status ref_inputs_make(const qkv_plan *p, const void *q, const void *k, const void *v,
                           ref_inputs *in);
void ref_inputs_free(ref_inputs *in);

/* Prepare the per-(b, h) tables (cosine key norms, additive projections). */
void ref_prepare_head(const qkv_plan *p, ref_inputs *in, int64_t b, int64_t h);

/* Logits of query i of (b, h) over keys [lo, hi): fills in->raw (score
 * before soft-capping) and in->s (after soft-capping and bias; -inf where a
 * bias masks the key). Returns the number of keys with a finite-or-NaN logit
 * (the visible keys). */
/* The T5 bucket of every relative offset is computed on the fly; the row's
 * position (for ALiBi and relative biases) comes from the plan. */
int64_t ref_row_logits(const qkv_plan *p, ref_inputs *in, int64_t b, int64_t h, int64_t i,
                       int64_t lo, int64_t hi);

/* Normalise in->s[lo, hi) into in->p[lo, hi) by the plan's normaliser;
 * *lse receives log sum exp over the visible keys (-inf when none). */
void ref_row_normalise(const qkv_plan *p, ref_inputs *in, int64_t lo, int64_t hi, int64_t visible,
                       double *lse);

/* Index helpers for the [B, n, H, D] layout. */
static inline int64_t ref_idx(int64_t b, int64_t i, int64_t h, int64_t n, int64_t heads, int64_t dim) {
    return ((b * n + i) * heads + h) * dim;
}

/* Store a double into a dtype buffer. */
static inline void ref_store(void *dst, qkv_dtype t, int64_t idx, double x) {
    if (t == QKV_F64) ((double *)dst)[idx] = x;
    else ((float *)dst)[idx] = (float)x;
}

#endif
