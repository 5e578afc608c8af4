/* The multi-head layer's private state, shared by mha.c (forward/backward),
 * mha_io.c (safetensors names) and kv_cache.c (decoding). */
#ifndef QKV_LAYERS_MHA_INTERNAL_H
#define QKV_LAYERS_MHA_INTERNAL_H

#include "qkv.h"

/* Parameter blocks, in this order in one float array. With the fused layout
 * (kdim = vdim = E, H_kv = H, H*Dh = E) WQ, WK, WV are consecutive and form
 * torch's in_proj_weight [3E, E]. BIN is q, k, v biases (in_proj_bias). */
enum { MHA_WQ, MHA_WK, MHA_WV, MHA_BIN, MHA_WO, MHA_BO, MHA_REL };

/* Activations kept from the forward for the backward, and backward scratch. */
enum { MHA_Q, MHA_K, MHA_V, MHA_O, MHA_LSE, MHA_OMEAN, MHA_DO, MHA_DQ, MHA_DK, MHA_DV, MHA_DOMEAN,
       MHA_ACT_COUNT };

struct qkv_mha {
    qkv_mha_config cfg;   /* resolved: heads_kv, head_dim, kdim, vdim, rope/rel defaults set */
    int64_t off[7];       /* offsets of the parameter blocks */
    int64_t n_params;
    int fused;            /* torch stores in_proj_weight (else q/k/v_proj_weight) */
    float *params, *grads, *slopes;
    float *act[MHA_ACT_COUNT];
    int64_t act_cap[MHA_ACT_COUNT];
    /* the most recent forward */
    int have_forward, self, kv_same, has_key_lengths;
    int64_t batch, n_q, n_k;
    int64_t *key_lengths, key_lengths_cap;
};

qkv_status mha_linear(const float *x, int64_t rows, int64_t in, const float *w, const float *b,
                      int64_t outd, float *y, int threads);
void mha_desc(const qkv_mha *m, int64_t batch, int64_t n_q, int64_t n_k, const int64_t *key_lengths,
              qkv_attn_desc *d);

#endif
