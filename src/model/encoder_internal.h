/* The encoder's parts shared by encoder_load.c (files, config, weights) and
 * encoder.c (the forward). Internal. */
#ifndef QKV_MODEL_ENCODER_INTERNAL_H
#define QKV_MODEL_ENCODER_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "gemm/gemm.h"
#include "gemm/i8.h"
#include "qkv.h"

enum { ENC_ACT_GELU = 0, ENC_ACT_GELU_NEW = 1, ENC_ACT_RELU = 2 };

/* The phases of a forward, for the per-phase breakdown of bench_encoder. */
enum {
    ENC_PH_TOKENIZE,
    ENC_PH_EMBED,     /* the embeddings' sum and LayerNorm */
    ENC_PH_QKV,       /* Q, K, V projections with their biases */
    ENC_PH_ATTN,      /* the attention core */
    ENC_PH_OUT,       /* the attention's output projection with its bias */
    ENC_PH_MLP,       /* intermediate projection, bias + activation, output projection */
    ENC_PH_LN,        /* the two residual + LayerNorm steps */
    ENC_PH_POOL,      /* pooling and normalisation */
    ENC_PH_COUNT
};

/* Accumulate each phase's wall time into seconds[ENC_PH_COUNT] (NULL: stop
 * timing; the default). The caller owns the array; the encoder adds to it.
 * The phase names: enc_phase_name. */
void enc_set_profile(qkv_encoder *e, double *seconds);
const char *enc_phase_name(int phase);

/* The projections of a layer, in the order of enc_layer's weights. */
enum { ENC_W_Q, ENC_W_K, ENC_W_V, ENC_W_O, ENC_W_I, ENC_W_O2, ENC_W_COUNT };

/* One post-LN block; every pointer borrows a tensor of the set. */
typedef struct enc_layer {
    const float *wq, *bq, *wk, *bk, *wv, *bv; /* [hidden, hidden], [hidden] */
    const float *wo, *bo;                     /* attention.output.dense */
    const float *ln1_g, *ln1_b;               /* attention.output.LayerNorm */
    const float *wi, *bi;                     /* intermediate.dense [inter, hidden] */
    const float *wo2, *bo2;                   /* output.dense [hidden, inter] */
    const float *ln2_g, *ln2_b;               /* output.LayerNorm */
    qkv_i8_matrix i8[ENC_W_COUNT];            /* QKV_ENCODER_INT8: the quantised projections */
    qkv_gemm_bf16_b bf[ENC_W_COUNT];          /* QKV_ENCODER_BF16: the projections in bf16 panels */
} enc_layer;

struct qkv_encoder {
    qkv_encoder_info info;
    int threads;
    qkv_safetensors *weights; /* mapped; owns (or maps) every tensor below */
    qkv_tokenizer *tok;
    const float *word, *pos, *type, *emb_g, *emb_b;
    enc_layer *layer;         /* [layers] */
    /* The workspace, grown on demand: ws_rows rows of each buffer. */
    float *ws;
    int64_t ws_rows;
    float *x, *q, *k, *v, *ctx, *tmp, *inter;
    int64_t *offsets;         /* [count + 1] */
    int64_t off_cap;
    int32_t *ids, *types;
    int64_t id_cap;
    double *prof;             /* NULL, or [ENC_PH_COUNT] seconds (enc_set_profile) */
};


#endif
