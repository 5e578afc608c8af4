/* Half-precision storage (QKV_BF16, QKV_F16) for the attention entry points
 * (docs/HALF.md). Internal; attention.c makes the plan and calls these. */
#ifndef QKV_ATTN_HALF_H
#define QKV_ATTN_HALF_H

#include "core/internal.h"

static inline int qkv_half_dtype(qkv_dtype t) { return t == QKV_BF16 || t == QKV_F16; }

/* The portable path (half_attn.c): float copies of a call's half tensors,
 * for the float32 attention under the same plan (dtype F32). Forward
 * (backward = 0): q, k, v widened and a scratch out; backward: q, k, v, out
 * (NULL stays NULL) and dout widened, scratch dq, dk, dv. Returns
 * QKV_ERR_OUT_OF_MEMORY (nothing held) when an allocation fails. */
typedef struct qkv_half_copy {
    float *q, *k, *v, *out, *dout, *dq, *dk, *dv;
} qkv_half_copy;
qkv_status qkv_half_widen(const qkv_plan *p, const void *q, const void *k, const void *v, const void *out,
                          const void *dout, int backward, qkv_half_copy *c);
/* n floats rounded to the plan's half dtype (nearest even). */
void qkv_half_narrow(const qkv_plan *p, void *dst, const float *src, int64_t n);
void qkv_half_copy_free(qkv_half_copy *c);

/* The bf16 fast forward (half_fwd.c): tiles multiplied from bf16 by the
 * AVX512-BF16 kernels, softmax in float. Returns QKV_ERR_UNSUPPORTED, having
 * written nothing, when it does not apply (no such CPU, forced off by
 * QKV_ARCH, or a feature it lacks); then the portable path runs. */
qkv_status qkv_half_fast_forward(const qkv_plan *p, const uint16_t *q, const uint16_t *k,
                                 const uint16_t *v, uint16_t *out, float *lse);

/* The bf16 fast backward (half_bwd.c): the five tile products on the same
 * kernels, softmax gradient in float; out and lse may be NULL (recomputed
 * by the fast forward). Returns QKV_ERR_UNSUPPORTED, having written no
 * gradient, when it does not apply (as the forward, plus: an inf or NaN in
 * q, k, v or dout, or a NaN in lse); then the portable path runs. */
qkv_status qkv_half_fast_backward(const qkv_plan *p, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                                  const uint16_t *out, const float *lse, const uint16_t *dout, uint16_t *dq,
                                  uint16_t *dk, uint16_t *dv);

/* Whether the bf16 fast forward (and backward) runs here (CPU, OS and QKV_ARCH); and, for
 * tests, force the portable path (on != 0) or restore the default. */
/* Packings shared by the fast forward and backward (half_pack.c), little-
 * endian fast paths on the kernels' words_t and interleave:
 * qkv_half_pairs_of_row: d[t] = (row[2t], row[2t+1]) for t < w, zero past D;
 * qkv_half_pack_panels: rows [0, n) of x (row stride ld) into npad / 32
 *   panels, dst[(p * w + t) * 32 + c] = the pairs of row 32p + c (zero past
 *   D and n);
 * qkv_half_pack_row_pairs: dst[u * ldw + col] = (x[2u][col], x[2u+1][col])
 *   for u < npad / 2, col < ldw (zero past D and n). */
struct qkv_half_kernels;
void qkv_half_pairs_of_row(uint32_t *d, int64_t w, const uint16_t *row, int64_t D);
void qkv_half_pack_panels(const struct qkv_half_kernels *HK, uint32_t *dst, int64_t w, const uint16_t *x, int64_t ld,
                          int64_t n, int64_t npad, int64_t D);
void qkv_half_pack_row_pairs(const struct qkv_half_kernels *HK, uint32_t *dst, int64_t ldw, const uint16_t *x,
                             int64_t ld, int64_t n, int64_t npad, int64_t D);

int qkv_half_fast_available(void);
void qkv_half_force_portable(int on);

#endif
