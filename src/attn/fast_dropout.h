/* Attention dropout in the fast paths (qkv_attn_desc.dropout): each tile's
 * weights times the reference's factors (qkv_attn_dropout_keep, core/
 * internal.h), entry for entry, by the dropout kernel (kernels/attn.h). The
 * forward applies them to P after the online-softmax step (the running max
 * and sum are those of the weights before dropout, as the lse) and before
 * the PV product; the backward scales dP = dO V^T by them before dS = P
 * (dP - D) and P after, for dV. Query i and key j of the call hash as the
 * plan's i + q_origin and j + k_origin (a ring block's global rows). */
#ifndef QKV_ATTN_FAST_DROPOUT_H
#define QKV_ATTN_FAST_DROPOUT_H

#include "attn/fast_common.h"

/* Whether the call drops attention weights. */
static inline int fa_dropout_on(const fa_ctx *c) { return c->p->d.dropout > 0.0; }

/* Forward: rows r < nr of a tile of weights w (row stride ld; rows = the
 * queries i0 + r of (b, h), columns = the keys kt + col) times their factors
 * (0 or 1 / (1 - p)) on each row's columns [a[r], e[r]), or on all ncols
 * when a is NULL. */
void fa_dropout_rows(const fa_ctx *c, int64_t b, int64_t h, int64_t i0, int nr, int64_t kt, int ncols, float *w,
                     size_t ld, const int *a, const int *e);

/* Backward, a key-major tile (rows = the keys j0 + r, r < nkr; columns = the
 * queries i0 + col, col < nqc; row stride ld): dp times the factors, which
 * go to z. fa_dropout_mul: s times z over the same tile. */
void fa_dropout_cols(const fa_ctx *c, int64_t b, int64_t h, int64_t i0, int nqc, int64_t j0, int nkr, float *dp,
                     float *z, size_t ld);
void fa_dropout_mul(float *s, const float *z, size_t ld, int nkr, int nqc);

#endif
