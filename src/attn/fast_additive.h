/* The fast float32 path of the additive (Bahdanau / MLP) score
 * s_ij = w_h . tanh(W1_h q_i + W2_h k_j), forward and backward (internal;
 * called by the dispatcher in attention.c with a validated plan).
 *
 * The projections U = W1 q and V' = W2 k are computed once per (batch,
 * head) with the GEMM; the scores of a query row against 16 keys at a time
 * come from kernels/additive.h (one lane per key, any A); the forward keeps
 * an online softmax (running max and sum) and accumulates P V, saving the
 * lse. Workspace O(n A) per head, never n x n. Every output element has one
 * owner (or partials summed in a fixed order): bitwise identical results
 * for any thread count. */
#ifndef QKV_ATTN_FAST_ADDITIVE_H
#define QKV_ATTN_FAST_ADDITIVE_H

#include "core/internal.h"

qkv_status qkv_fast_additive_forward(const qkv_plan *p, const float *q, const float *k, const float *v,
                                     float *out, float *attn, float *lse);

/* out and lse (the forward's) may be NULL: then the forward is recomputed
 * (softmax only; the other normalisers need neither). */
qkv_status qkv_fast_additive_backward(const qkv_plan *p, const float *q, const float *k, const float *v,
                                      const float *out, const float *lse, const float *dout,
                                      const qkv_attn_grads *g);

/* Whether this path computes the plan (both directions): F32, the additive
 * score, with any normaliser, soft-cap, bias, mask, key lengths, packed
 * sequences and GQA; not the in-kernel position biases (ALiBi, T5
 * relative) nor dropout, which stay with the reference. */
int qkv_fast_additive_supported(const qkv_plan *p);

#endif
