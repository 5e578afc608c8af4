/*
 * qkv/model.h - transformer models (decoder or encoder), their training
 * (AdamW, learning-rate schedule, dynamic loss scaling) and checkpoints
 * (parameters and optimiser state in safetensors sets, qkv/io.h).
 */
#ifndef QKV_MODEL_H
#define QKV_MODEL_H

#include "qkv/core.h"
#include "qkv/io.h"
#include "qkv/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------- */
/* Transformer models and their training (decoder or encoder, pre-LayerNorm):
 *
 *   h = embed(tokens) [+ absolute positions]
 *   per block:  h = h + MHA(LN1(h));  h = h + W2 GELU(W1 LN2(h) + b1) + b2
 *   logits = LN_f(h) W_headᵀ        (W_head tied to the embedding or not)
 *
 * Every part has a backward pass; parameters are float, kept in the model,
 * exposed as named segments for optimisers and checkpoints. */

typedef enum qkv_posenc {
    QKV_POSENC_NONE = 0,
    QKV_POSENC_SINUSOIDAL = 1,   /* added to the embeddings */
    QKV_POSENC_LEARNED = 2,      /* a trainable [max_seq, E] table */
    QKV_POSENC_ROPE = 3,         /* inside every attention layer */
    QKV_POSENC_ALIBI = 4,        /* inside every attention kernel */
    QKV_POSENC_RELATIVE = 5,     /* T5 buckets, a table per layer */
    QKV_POSENC_FLOATER = 6       /* a neural ODE, added before every block */
} qkv_posenc;

typedef struct qkv_model_config {
    int64_t vocab;               /* V >= 2 */
    int64_t dim;                 /* E */
    int64_t heads;               /* H, divides E */
    int64_t layers;              /* L >= 1 */
    int64_t mlp_dim;             /* 0 means 4E */
    int64_t max_seq;             /* the longest sequence (learned table size) */
    int causal;                  /* 1: decoder, 0: encoder */
    int tie_embeddings;          /* output head = embedding matrix */
    qkv_posenc pos;
    double dropout;              /* on the attention weights (in the kernel), the residual
                                    branches and the MLP, in [0, 1) */
    int threads;                 /* 0 = default */
} qkv_model_config;

typedef struct qkv_model qkv_model;

/* Defaults: E 128, H 4, L 2, 4E MLP, causal, tied, sinusoidal, no dropout. */
QKV_API void qkv_model_config_init(qkv_model_config *cfg, int64_t vocab, int64_t max_seq);

/* Errors: QKV_ERR_NULL_POINTER, QKV_ERR_BAD_SIZE, QKV_ERR_HEADS,
 * QKV_ERR_BAD_ENUM, QKV_ERR_BAD_PARAMETER, QKV_ERR_OUT_OF_MEMORY. */
QKV_API qkv_status qkv_model_create(const qkv_model_config *cfg, uint64_t seed, qkv_model **out);
QKV_API void qkv_model_free(qkv_model *m);
QKV_API const qkv_model_config *qkv_model_get_config(const qkv_model *m);

/* Forward over tokens [B, n] (0 <= token < V, n <= max_seq). logits
 * [B, n, V] optional (NULL: kept inside). With targets [B, n] (-1 = no loss
 * at that position), *loss receives the mean cross-entropy over the targeted
 * positions. train != 0 applies dropout (from the seed given to
 * qkv_model_set_step). Keeps activations for qkv_model_backward. Errors:
 * QKV_ERR_NULL_POINTER, QKV_ERR_BAD_SIZE, QKV_ERR_POSITION (n > max_seq),
 * QKV_ERR_BAD_PARAMETER (a token or target out of range),
 * QKV_ERR_OUT_OF_MEMORY. */
QKV_API qkv_status qkv_model_forward(qkv_model *m, int64_t batch, int64_t n, const int32_t *tokens,
                                     const int32_t *targets, int train, float *logits, double *loss);

/* Backward of the most recent forward (which had targets): accumulates
 * gradients of every parameter. Errors: QKV_ERR_UNSUPPORTED (no forward with
 * targets before), QKV_ERR_OUT_OF_MEMORY. */
QKV_API qkv_status qkv_model_backward(qkv_model *m);

/* Gradient-ready hook, for overlapping communication with the backward
 * (data-parallel all-reduce: qkv_dp_reducer). When set, qkv_model_backward
 * calls hook(user, segments, count) each time the gradients of some
 * parameter segments are final, with their indices (as qkv_model_segment's):
 * first the final norm and an untied output head, then each block from the
 * last to the first (its MLP, norms and attention layer), then the FLOATER
 * parameters, the embedding (with a tied head) and learned positions. Each
 * segment is reported once per backward, always in the same order. The hook
 * may read (not write) the reported gradients; a status other than QKV_OK
 * stops the backward, which returns it. hook NULL removes it. Errors:
 * QKV_ERR_NULL_POINTER (m). */
typedef qkv_status (*qkv_grad_hook)(void *user, const int64_t *segments, int64_t count);
QKV_API qkv_status qkv_model_set_grad_hook(qkv_model *m, qkv_grad_hook hook, void *user);

/* Attention weights of layer l from the most recent forward, for
 * inspection: attn [B, H, n, n] (written only when the forward ran with
 * qkv_model_keep_attention(m, 1)). Errors: QKV_ERR_UNSUPPORTED, bad l. */
QKV_API qkv_status qkv_model_keep_attention(qkv_model *m, int keep);
QKV_API const float *qkv_model_attention(const qkv_model *m, int64_t layer);

/* Incremental decoding for a causal model, one sequence (batch 1): begin
 * allocates a KV cache per layer for up to max_len tokens; each step feeds t
 * new tokens and writes their logits [t, V], attending to everything fed
 * before without recomputing it. The logits equal those of one forward over
 * the whole sequence. Errors: QKV_ERR_NULL_POINTER, QKV_ERR_UNSUPPORTED
 * (encoder model, or step before begin), QKV_ERR_POSITION (past max_len or
 * the model's max_seq), QKV_ERR_BAD_PARAMETER (token out of range),
 * QKV_ERR_OUT_OF_MEMORY. */
QKV_API qkv_status qkv_model_decode_begin(qkv_model *m, int64_t max_len);
/* As qkv_model_decode_begin (which is storage QKV_KV_F32), with the caches in
 * the given storage (qkv_kv_storage: bf16 or int8 halve or quarter their
 * memory; the logits then differ from the float32 forward's by the rounding
 * stated there). Errors also QKV_ERR_BAD_ENUM and, for bf16 / int8, the
 * QKV_ERR_UNSUPPORTED of qkv_kv_cache_create_typed. */
QKV_API qkv_status qkv_model_decode_begin_typed(qkv_model *m, int64_t max_len, qkv_kv_storage storage);
QKV_API qkv_status qkv_model_decode_step(qkv_model *m, int64_t t, const int32_t *tokens, float *logits);

/* Parameter segments (each a named float array with its gradient), for
 * optimisers and checkpoints. i in 0 .. count-1. */
QKV_API int64_t qkv_model_segment_count(const qkv_model *m);
QKV_API qkv_status qkv_model_segment(qkv_model *m, int64_t i, const char **name, float **param, float **grad,
                                     int64_t *count);
QKV_API int64_t qkv_model_param_count(const qkv_model *m);
QKV_API void qkv_model_zero_grad(qkv_model *m);
/* Dropout masks are a pure function of (seed, step, position): set the step
 * before each training forward so runs are reproducible bit for bit. */
QKV_API void qkv_model_set_step(qkv_model *m, uint64_t seed, int64_t step);
/* Mixed precision: the attention core of every layer in QKV_BF16 or
 * QKV_F16 (qkv_mha_set_precision), or QKV_F32 (the default); QKV_BF16 also
 * multiplies the projections and the MLP in bf16 with float32 sums (forward
 * and backward; weights, gradients and the output head float32). Not saved with
 * the model (a training choice). Errors: QKV_ERR_NULL_POINTER,
 * QKV_ERR_BAD_ENUM. */
QKV_API qkv_status qkv_model_set_precision(qkv_model *m, qkv_dtype compute);
/* Loss scaling: qkv_model_backward multiplies the loss gradient (and so
 * every gradient) by `scale` (default 1; finite and > 0, else
 * QKV_ERR_BAD_PARAMETER). Used through qkv_loss_scaler below. */
QKV_API qkv_status qkv_model_set_loss_scale(qkv_model *m, double scale);

/* Save / load parameters and configuration (as "__metadata__") in a
 * safetensors set; load needs a model of the same configuration. */
QKV_API qkv_status qkv_model_save(const qkv_model *m, qkv_safetensors *st);
QKV_API qkv_status qkv_model_load(qkv_model *m, const qkv_safetensors *st, char *why, size_t why_len);
/* The configuration stored in a set by qkv_model_save. */
QKV_API qkv_status qkv_model_config_from(const qkv_safetensors *st, qkv_model_config *cfg, char *why, size_t why_len);

/* AdamW (Loshchilov & Hutter) over all segments, with global-norm gradient
 * clipping (clip <= 0: off); weight decay is not applied to biases, norms
 * and position tables. State (moments) inside the optimiser. */
typedef struct qkv_adamw qkv_adamw;
QKV_API qkv_status qkv_adamw_create(qkv_model *m, double beta1, double beta2, double eps, double weight_decay,
                                    qkv_adamw **out);
QKV_API void qkv_adamw_free(qkv_adamw *o);
/* One step at learning rate lr; returns the gradient norm before clipping. */
QKV_API qkv_status qkv_adamw_step(qkv_adamw *o, double lr, double clip, double *grad_norm);
/* Moments and step count, for checkpoints (resume exactly). */
QKV_API qkv_status qkv_adamw_save(const qkv_adamw *o, qkv_safetensors *st);
QKV_API qkv_status qkv_adamw_load(qkv_adamw *o, const qkv_safetensors *st, char *why, size_t why_len);

/* Warm-up (linear from 0) then cosine decay to min_lr at total_steps. */
QKV_API double qkv_lr_schedule(int64_t step, int64_t warmup, int64_t total_steps, double lr, double min_lr);

/* Dynamic loss scaling for fp16 training (torch's GradScaler rule), so that
 * small gradients of the attention core's fp16 dout do not flush to zero:
 *
 *     qkv_loss_scaler ls;  qkv_loss_scaler_init(&ls);
 *     per step: qkv_model_zero_grad(m); qkv_model_set_loss_scale(m, ls.scale);
 *               forward, backward;
 *               qkv_loss_scaler_step(&ls, m, opt, lr, clip, &norm, &skipped);
 *
 * qkv_loss_scaler_step checks every gradient: if any is inf or NaN, the step
 * is skipped (parameters and optimiser state untouched, *skipped = 1), the
 * scale halves (not below 2^-24) and the clean count restarts; otherwise
 * the gradients are unscaled (multiplied by 1/scale: exact, the scale being a
 * power of two), qkv_adamw_step runs (its clipping sees the true gradients),
 * and after growth_interval clean steps in a row the scale doubles (not
 * above 2^48). Deterministic: a function of the gradients alone. The state
 * is these four numbers (checkpoints may store them). */
typedef struct qkv_loss_scaler {
    double scale;             /* 2^15 at init */
    int64_t growth_interval;  /* 1000 at init */
    int64_t clean;            /* clean steps since the scale last changed */
    int64_t skipped;          /* steps skipped so far */
} qkv_loss_scaler;
QKV_API void qkv_loss_scaler_init(qkv_loss_scaler *ls);
/* Errors: QKV_ERR_NULL_POINTER (ls, m, opt), QKV_ERR_BAD_PARAMETER (a scale
 * that is not a positive power of two, growth_interval < 1), those of
 * qkv_adamw_step. grad_norm (optional): the unscaled norm, +inf when skipped. */
QKV_API qkv_status qkv_loss_scaler_step(qkv_loss_scaler *ls, qkv_model *m, qkv_adamw *opt, double lr, double clip,
                                        double *grad_norm, int *skipped);

#ifdef __cplusplus
}
#endif

#endif /* QKV_MODEL_H */
