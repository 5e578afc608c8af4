/* The encoder's parts shared by encoder_load.c (files, config, weights) and
 * encoder.c (the forward). Internal. */
#ifndef QKV_MODEL_ENCODER_INTERNAL_H
#define QKV_MODEL_ENCODER_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "qkv.h"

enum { ENC_ACT_GELU = 0, ENC_ACT_GELU_NEW = 1, ENC_ACT_RELU = 2 };

/* One post-LN block; every pointer borrows a tensor of the set. */
typedef struct enc_layer {
    const float *wq, *bq, *wk, *bk, *wv, *bv; /* [hidden, hidden], [hidden] */
    const float *wo, *bo;                     /* attention.output.dense */
    const float *ln1_g, *ln1_b;               /* attention.output.LayerNorm */
    const float *wi, *bi;                     /* intermediate.dense [inter, hidden] */
    const float *wo2, *bo2;                   /* output.dense [hidden, inter] */
    const float *ln2_g, *ln2_b;               /* output.LayerNorm */
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
};


#endif
