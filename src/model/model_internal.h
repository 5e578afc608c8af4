/* The transformer's private state, shared by its forward/backward
 * (transformer.c), checkpoints (checkpoint.c) and the optimiser (adamw.c). */
#ifndef QKV_MODEL_INTERNAL_H
#define QKV_MODEL_INTERNAL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/nn.h"
#include "qkv.h"

#define QKV_MODEL_MAX_SEGMENTS 512

typedef struct model_segment {
    char name[64];
    float *param, *grad;
    int64_t count;
    int decay;            /* AdamW weight decay applies (matrices only) */
    int ndim;
    int64_t shape[2];
    int is_mha;           /* the whole parameter block of layer `layer`'s attention */
    int64_t layer;
} model_segment;

/* Per-block activations, [rows, E] unless noted. */
typedef struct block_act {
    float *x;             /* block input (after FLOATER injection) */
    float *ln1, *ln1_mean, *ln1_rstd;
    float *attn_out;      /* MHA output before dropout */
    float *mid;           /* x + dropout(attn_out) */
    float *ln2, *ln2_mean, *ln2_rstd;
    float *pre, *act;     /* [rows, F]: W1 ln2 + b1 (after a forward with targets: GELU' of it), GELU */
    float *mlp_out;       /* before dropout */
} block_act;

struct qkv_model {
    qkv_model_config cfg;
    int64_t F;            /* MLP width */
    qkv_mha **attn;       /* one layer object per block */
    qkv_floater *floater;
    float *params, *grads; /* everything except the attention layers and FLOATER */
    int64_t n_own;
    model_segment seg[QKV_MODEL_MAX_SEGMENTS];
    int64_t n_seg;
    /* views into params (grads at the same offsets) */
    int64_t o_emb, o_pos, o_head, o_lnf_w, o_lnf_b;
    int64_t *o_ln1_w, *o_ln1_b, *o_ln2_w, *o_ln2_b, *o_fc1_w, *o_fc1_b, *o_fc2_w, *o_fc2_b;
    float *sinusoid;      /* [max_seq, E] when sinusoidal */
    /* activations of the last forward */
    int64_t B, n, rows_cap, have_targets;
    qkv_dtype compute;    /* the MLP's products: QKV_BF16 (bf16 GEMM) or QKV_F32 */
    block_act *blk;
    float *h, *lnf, *lnf_mean, *lnf_rstd, *logits, *floater_pos, *floater_dpos;
    float *dh, *dtmp, *dtmp2, *dF;
    int32_t *tokens, *targets;
    int keep_attention;
    float **attn_keep;    /* per layer [B, H, n, n] when kept */
    int64_t attn_cap;
    /* incremental decoding */
    qkv_kv_cache **cache;
    int64_t dec_len, dec_max;
    float *dec_buf;       /* per-step scratch: t rows of x, ln, a, mid, h (E), pre, act (F), LN stats (2) */
    int64_t dec_buf_rows;
    float *dec_floater;   /* FLOATER positions 0 .. dec_max-1 */
    uint64_t drop_seed;
    int64_t drop_step;
    int train;
    qkv_grad_hook grad_hook; /* qkv_model_set_grad_hook: told as gradients become final */
    void *grad_hook_user;
    double loss_scale;    /* qkv_model_set_loss_scale: the loss gradient's factor (1 by default) */
};

/* The linear layers go through nn_linear (layers/linear.h), the loops
 * over rows through qkv_par_range (core/internal.h). */

/* LayerNorm over rows of E (eps 1e-5), keeping mean and 1/std per row for
 * the backward; GELU with the exact error function. Shared by the training
 * forward and incremental decoding so both compute the same numbers. */
void model_layernorm_forward(const float *x, const float *g, const float *b, int64_t rows, int64_t E, float *y,
                             float *mean, float *rstd);
float model_gelu(float x);
/* The input of the first block for one token at position pos: its
 * embedding times scale (model_emb_scale: sqrt(E) with sinusoidal or
 * FLOATER positions, else 1) plus the absolute position encodings, into
 * out[E]. The training forward and incremental decoding both use it. */
float model_emb_scale(const qkv_model *m);
void model_embed_row(const qkv_model *m, float scale, int32_t token, int64_t pos, float *out);

/* Free the decoding caches (transformer.c; qkv_model_free and decode.c call it). */
void model_decode_free(qkv_model *m);

#endif
