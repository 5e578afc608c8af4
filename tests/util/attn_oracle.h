/* A second, independent attention oracle for the tests: a deliberately naive
 * dense implementation in double, written from the math of include/qkv.h only
 * (it shares no code with src/). It builds the full n_q x n_k mask and logits
 * of every (batch, head) and normalises them with a two-pass softmax, so it is
 * slow but obviously right; fine for the small sizes the tests use.
 *
 * Also: a small "problem" holder (every tensor of one attention call as double
 * master copies) and wrappers that run the library on it in F32 or F64 with
 * guarded output buffers, so the test programs stay short. */
#ifndef QKV_ATTN_ORACLE_H
#define QKV_ATTN_ORACLE_H

#include <stddef.h>
#include <stdint.h>

#include "qkv.h"
#include "test_util.h"

/* The tensors of one call. Inputs first, then outputs. */
enum {
    AO_Q, AO_K, AO_V, AO_BIAS, AO_W1, AO_W2, AO_W, /* inputs */
    AO_O, AO_ATTN, AO_LSE,                         /* forward outputs */
    AO_NT
};

/* Element counts of every tensor of a descriptor (0 for those it has none of:
 * no bias, not additive). heads_kv == 0 and dim_v == 0 are resolved. */
void ao_counts(const qkv_attn_desc *d, size_t n[AO_NT]);

/* Is key j visible to query i of batch b, head h? Applies mask, key lengths,
 * packed sequences, and a -inf bias entry (bias read as double*). */
int ao_visible(const qkv_attn_desc *d, const double *bias, int64_t b, int64_t h, int64_t i,
               int64_t j);

/* Dense logits of (b, h): S[i * n_k + j] for every visible (i, j) after
 * score, soft-cap and bias; vis[i * n_k + j] says which are visible. Masked
 * keys are never read. Pointers in d are ignored: x holds the tensors. */
void ao_logits(const qkv_attn_desc *d, double *const x[AO_NT], int64_t b, int64_t h, double *S,
               unsigned char *vis);

/* The oracle forward pass: fills x[AO_O], and x[AO_ATTN], x[AO_LSE] when
 * they are not NULL. */
void ao_forward(const qkv_attn_desc *d, double *const x[AO_NT]);

/* The same plain algorithm computed in float (the "naive32" baseline of the
 * fast-path rule, tests/test_fast_common.h): logits, max, exp, sums and the
 * output accumulated in float, in a plain order. Fills x[AO_O] and, when not
 * NULL, x[AO_ATTN], x[AO_LSE] (as double). Used to size the tolerance of
 * float fast paths: |fast - ref64| <= 2 |naive32 - ref64| + 1e-5. */
void ao_forward_naive32(const qkv_attn_desc *d, double *const x[AO_NT]);

/* A problem: the descriptor (pointer fields of d are NOT used; the tensors
 * live in x) and double master copies of every tensor. */
typedef struct ao_prob {
    qkv_attn_desc d;
    size_t n[AO_NT];
    double *x[AO_NT];
} ao_prob;

/* Allocate the tensors of d (zero-filled) and fill the inputs with N(0, sd)
 * (additive weights with N(0, 1/sqrt(D))). Bias entries are N(0, 1). */
void ao_prob_init(ao_prob *p, const qkv_attn_desc *d, tu_rng *r, double sd);
void ao_prob_free(ao_prob *p);
/* Round every input to float (so F32 and F64 runs see the same values). */
void ao_prob_round_f32(ao_prob *p);
/* Minimum |logit| over visible entries (to avoid the kink of relu). */
double ao_min_abs_logit(const ao_prob *p);

/* Run the library forward on p with the given dtype / impl / threads; the
 * outputs come back converted to double in out (required), attn and lse
 * (optional: NULL = not requested). *guards_ok is set to 0 if any write went
 * outside an output buffer or into an input. */
qkv_status ao_lib_forward(const ao_prob *p, qkv_dtype dt, qkv_impl impl, int threads,
                          double *out, double *attn, double *lse, int *guards_ok);

/* Gradients in double; NULL members are not requested. */
typedef struct ao_grads {
    double *dq, *dk, *dv, *dbias, *dw1, *dw2, *dw;
} ao_grads;

/* Run the library backward on p with dout; when pass_fwd != 0, the forward's
 * out and lse (computed by the library first) are passed, else NULL.
 * *guards_ok as for ao_lib_forward (dout, out, lse included). */
qkv_status ao_lib_backward(const ao_prob *p, qkv_dtype dt, qkv_impl impl, int threads,
                           const double *dout, int pass_fwd, const ao_grads *g, int *guards_ok);

/* Element-wise comparison: the largest |a - b| / (atol + rtol * |b|) over n;
 * <= 1 passes. NaN on either side (not both) counts as infinite. *worst gets
 * the index of the worst element. */
double ao_cmp(const double *a, const double *b, size_t n, double atol, double rtol,
              size_t *worst);

/* The mask configurations the sweeps run through (index 0 .. AO_NUM_MASKS-1):
 * none, causal, window, causal-window, key lengths (with a 0), key lengths +
 * causal, packed (q/k offsets differing, with empty sequences) + causal,
 * packed (same offsets) + none, packed + window, shared bias (some -inf),
 * per-head bias (some -inf, one whole row -inf) + causal, window(0,0),
 * packed (q/k differing) + shared bias, key lengths + per-head bias +
 * window(2,1).
 * ao_mask_config sets the mask fields of d (and batch = 1, and n_k = n_q
 * where packing needs it), pointing into *st, which must outlive d.
 * Returns a short name. ao_bias_plant_inf then plants the -inf entries of
 * the bias configurations into p (call after ao_prob_init). */
#define AO_NUM_MASKS 14
typedef struct ao_mask_store {
    int64_t key_lengths[16];
    int64_t off_q[4], off_k[4];
} ao_mask_store;
const char *ao_mask_config(qkv_attn_desc *d, int m, ao_mask_store *st);
void ao_bias_plant_inf(ao_prob *p, tu_rng *r);

/* Short text describing a descriptor for failure messages. */
const char *ao_describe(const qkv_attn_desc *d, char *buf, size_t len);

#endif
