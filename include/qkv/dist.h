/*
 * qkv/dist.h - distributed attention and data-parallel training over MPI
 * (docs/DISTRIBUTED.md). Declared only when QKV_HAVE_MPI is defined: CMake
 * defines it for the library and every target of its build that links it
 * when qkv is built with MPI; a user of an installed qkv built with MPI
 * defines QKV_HAVE_MPI and links MPI to use this part.
 * The library never calls MPI_Init or MPI_Finalize: the caller initialises
 * MPI (at least MPI_THREAD_FUNNELED: only the calling thread uses MPI, the
 * attention's worker threads never do) and hands a communicator to each
 * call. Every function here is collective over that communicator: all of
 * its ranks call it with the same arguments apart from the local tensors.
 * Communication runs on a private duplicate of the communicator with
 * MPI_ERRORS_RETURN, so the caller's traffic and error handler are left
 * alone. Errors are agreed between ranks: when any rank fails (a NULL
 * tensor, no memory, non-finite input), every rank returns an error (its
 * own, else the largest code of the others), and none is left waiting; a
 * failed MPI call is QKV_ERR_IO. A rank that dies mid-call is MPI's
 * business: mpirun ends the job (run jobs under a timeout). */
#ifndef QKV_DIST_H
#define QKV_DIST_H

#include "qkv/core.h"
#include "qkv/model.h"

#ifdef QKV_HAVE_MPI
#include <mpi.h>   /* outside extern "C": it may bring C++ bindings */

#ifdef __cplusplus
extern "C" {
#endif

/* How a sequence of n positions is split over p ranks. */
typedef enum qkv_dist_layout {
    QKV_DIST_CONTIGUOUS = 0,    /* rank r holds piece r of p nearly equal pieces
                                   (the first n mod p one longer) */
    QKV_DIST_ZIGZAG = 1         /* the sequence cut into 2p pieces; rank r holds
                                   pieces r and 2p-1-r, stored in that order:
                                   every rank gets the same causal work */
} qkv_dist_layout;

/* The positions rank `rank` of `ranks` holds: the runs start[t] ..
 * start[t] + len[t] - 1 for t = 0, 1 (len[1] = 0 for CONTIGUOUS), stored
 * locally one after the other; *local_n = len[0] + len[1] (0 when n is
 * smaller than the number of pieces). Errors: QKV_ERR_NULL_POINTER,
 * QKV_ERR_BAD_SIZE (n < 1, ranks < 1, rank outside 0..ranks-1),
 * QKV_ERR_BAD_ENUM. */
QKV_API qkv_status qkv_dist_partition(int64_t n, int ranks, int rank, qkv_dist_layout layout,
                                      int64_t start[2], int64_t len[2], int64_t *local_n);

/* Ring attention (Liu, Zaharia & Abbeel 2023): desc describes the WHOLE
 * problem (n_q, n_k global); each rank passes its positions, laid out by
 * qkv_dist_partition over the communicator's size:
 *   q   [B, nq_loc, H, D]      k [B, nk_loc, H_kv, D]   v [B, nk_loc, H_kv, D_v]
 *   out [B, nq_loc, H, D_v]    written
 *   lse [B, H, nq_loc]         optional (NULL), as qkv_attention_forward's
 * Keys and values travel round the ring (non-blocking sends overlapped with
 * the block in hand); each block is computed by qkv_attention_forward and
 * the partial outputs are merged by their log-sum-exp, so the result equals
 * one process's to float rounding. Memory per rank O((n_q + n_k)/p); no rank
 * ever holds all keys and values. Tensors of a rank holding no position may
 * be NULL. Supported: F32; softmax, ReLU (also divided by the count) and
 * sigmoid; scaled-dot/dot/cosine scores, softcap; GQA; key_lengths (global
 * indices); every mask (NONE, CAUSAL, WINDOW, CAUSAL_WINDOW, bottom-right
 * aligned for any n_q, n_k; blocks outside every window are skipped); the
 * additive bias, of which each rank passes its queries' rows for every key:
 * desc->bias [n_q_loc, n_k] (SHARED) or [H, n_q_loc, n_k] (PER_HEAD), rows
 * in the local order - O(n_q n_k / p) per rank, the bias being n x n;
 * packed sequences (B = 1; every rank passes the whole seq_offsets_q/_k,
 * q and k are its positions of the packed streams, as qkv_dist_partition
 * cuts them: a sequence may straddle ranks); ALiBi and T5's 1-D relative
 * tables (the same slopes / table on every rank), offsets global as in one
 * process; attention dropout (the same seed on every rank), dropping the
 * entries one process drops; the additive score (the same W1, W2, w on
 * every rank).
 * QKV_ERR_UNSUPPORTED: 2-D relative positions, F64 and half precision, the
 * additive score together with ALiBi, T5 buckets or dropout.
 * Errors: those of
 * qkv_attention_forward, QKV_ERR_UNSUPPORTED (also MPI not initialised),
 * QKV_ERR_IO (communication failed). */
QKV_API qkv_status qkv_ring_attention_forward(const qkv_attn_desc *desc, qkv_dist_layout layout,
                                              MPI_Comm comm, const void *q, const void *k, const void *v,
                                              void *out, void *lse);

/* Backward of the ring forward: dout [B, nq_loc, H, D_v] given; dq, dk, dv
 * shaped as the local q, k, v, written. out and lse are the ring forward's
 * (NULL on any rank: every rank runs the forward ring first). dQ is
 * computed at home; the partial dK/dV of each key block travel round the
 * ring with it and return to its owner. Each block uses the fast path with
 * the global O and lse (impl REFERENCE is QKV_ERR_UNSUPPORTED here); ReLU
 * and sigmoid need neither (out, lse may then be NULL without a forward
 * ring). Supported and errors: as the forward. */
QKV_API qkv_status qkv_ring_attention_backward(const qkv_attn_desc *desc, qkv_dist_layout layout,
                                               MPI_Comm comm, const void *q, const void *k, const void *v,
                                               const void *out, const void *lse, const void *dout,
                                               void *dq, void *dk, void *dv);

/* The same with the gradients in a qkv_attn_grads: dq, dk, dv (local, as
 * above) and, optionally, dbias: this rank's rows of the bias gradient,
 * shaped as its desc->bias ([n_q_loc, n_k] or [H, n_q_loc, n_k], summed over
 * the batch, and over the heads for SHARED), overwritten; computed at home
 * (every (query, key) block of this rank's queries passes through it), no
 * extra communication. d_rel_table (optional, [H, rel_buckets]): the
 * whole table's gradient on every rank that passes one, summed over every
 * rank's queries (each rank's blocks in double, then one MPI_Allreduce that
 * every rank joins when any asks); d_additive_w1, _w2, _w (optional, each
 * alone) likewise. grads NULL: QKV_ERR_NULL_POINTER. */
QKV_API qkv_status qkv_ring_attention_backward_grads(const qkv_attn_desc *desc, qkv_dist_layout layout, MPI_Comm comm,
                                                     const void *q, const void *k, const void *v, const void *out,
                                                     const void *lse, const void *dout, const qkv_attn_grads *grads);

/* Data-parallel training. Copy rank root's parameters to every rank. */
QKV_API qkv_status qkv_model_bcast_params(qkv_model *m, int root, MPI_Comm comm);

/* Replace every rank's gradients by sum over ranks of weight_r * grad_r
 * (weight_r: this rank's share of the batch's loss terms, so the result is
 * the gradient of the whole batch's mean loss), reduced in buckets of about
 * bucket_bytes (0: 4 MiB) by non-blocking MPI_Iallreduce calls in flight
 * together. Every rank ends with the same gradients. Errors:
 * QKV_ERR_NULL_POINTER, QKV_ERR_BAD_PARAMETER (weight < 0 or not finite),
 * QKV_ERR_OUT_OF_MEMORY, QKV_ERR_UNSUPPORTED (MPI not initialised),
 * QKV_ERR_IO. */
QKV_API qkv_status qkv_model_allreduce_grads(qkv_model *m, double weight, size_t bucket_bytes, MPI_Comm comm);

/* The same reduction overlapped with the backward pass: the reducer sets
 * m's gradient hook (qkv_model_set_grad_hook) and packs each segment,
 * scaled by weight, into a flat buffer as soon as the backward has finished
 * it, starting a non-blocking MPI_Iallreduce on each bucket of
 * bucket_bytes (0: 1 MiB) as soon as it is full - the last block's buckets
 * travel while the earlier blocks are computed. Per step, on every rank:
 *     qkv_dp_reducer_begin(r, weight);    before qkv_model_backward
 *     s = qkv_model_backward(m);
 *     s = qkv_dp_reducer_finish(r, s);    waits for every bucket; writes grads
 * finish is collective and takes this rank's backward status: a rank whose
 * backward failed (or did not run) still completes the reductions, and
 * every rank returns an error (its own, else the largest code of the
 * others), leaving the gradients unspecified. The buckets are the same on
 * every run (the backward reports segments in a fixed order), so results
 * are reproducible bit for bit for a given number of ranks. create is
 * collective; the reducer holds 4 bytes per parameter. free removes the
 * hook. Errors: QKV_ERR_NULL_POINTER, QKV_ERR_BAD_PARAMETER (weight < 0 or
 * not finite), QKV_ERR_OUT_OF_MEMORY, QKV_ERR_UNSUPPORTED (MPI not
 * initialised; begin twice without finish), QKV_ERR_IO. */
typedef struct qkv_dp_reducer qkv_dp_reducer;
QKV_API qkv_status qkv_dp_reducer_create(qkv_model *m, size_t bucket_bytes, MPI_Comm comm, qkv_dp_reducer **out);
QKV_API qkv_status qkv_dp_reducer_begin(qkv_dp_reducer *r, double weight);
QKV_API qkv_status qkv_dp_reducer_finish(qkv_dp_reducer *r, qkv_status backward_status);
QKV_API void qkv_dp_reducer_free(qkv_dp_reducer *r);

#ifdef __cplusplus
}
#endif
#endif /* QKV_HAVE_MPI */

#endif /* QKV_DIST_H */
