/* The multi-head layer's private state, shared by mha.c (forward/backward),
 * mha_io.c (safetensors names) and kv_cache.c (decoding). */
#ifndef QKV_LAYERS_MHA_INTERNAL_H
#define QKV_LAYERS_MHA_INTERNAL_H

#include "qkv.h"

/* Parameter blocks, in this order in one float array. With the fused layout
 * (kdim = vdim = E, H_kv = H, H*Dh = E) WQ, WK, WV are consecutive and form
 * torch's in_proj_weight [3E, E]. BIN is q, k, v biases (in_proj_bias).
 * BK, BV: torch's bias_k, bias_v [H_kv Dh] (add_bias_kv). AW1, AW2, AW: the
 * additive score's W1 [H, A, Dh], W2 [H, A, Dh], w [H, A]. Empty blocks
 * (size 0) for the features a layer does not use. */
enum { MHA_WQ, MHA_WK, MHA_WV, MHA_BIN, MHA_WO, MHA_BO, MHA_REL, MHA_BK, MHA_BV, MHA_AW1, MHA_AW2, MHA_AW,
       MHA_PARAM_COUNT };

/* Activations kept from the forward for the backward, and backward scratch. */
enum { MHA_Q, MHA_K, MHA_V, MHA_O, MHA_LSE, MHA_OMEAN, MHA_DO, MHA_DQ, MHA_DK, MHA_DV, MHA_DOMEAN,
       MHA_ACT_COUNT };

struct qkv_mha {
    qkv_mha_config cfg;   /* resolved: heads_kv, head_dim, kdim, vdim, rope/rel defaults set */
    int64_t off[MHA_PARAM_COUNT]; /* offsets of the parameter blocks */
    int64_t n_params;
    int fused;            /* torch stores in_proj_weight (else q/k/v_proj_weight) */
    float *params, *grads, *slopes;
    float *act[MHA_ACT_COUNT];
    int64_t act_cap[MHA_ACT_COUNT];
    /* the most recent forward */
    int have_forward, self, kv_same, has_key_lengths;
    int64_t batch, n_q, n_k;
    int64_t *key_lengths, key_lengths_cap; /* as the core saw them: + 1 with add_bias_kv */
    /* Mixed precision (qkv_mha_set_precision): the attention core's dtype and
     * its half copies of q, k, v, o (kept from the forward), do, dq, dk, dv. */
    qkv_dtype compute;
    uint16_t *half[8];
    int64_t half_cap[8];
};
enum { MHA_HQ, MHA_HK, MHA_HV, MHA_HO, MHA_HDO, MHA_HDQ, MHA_HDK, MHA_HDV };

/* add_bias_kv: the extra key and value sit FIRST in the core's key sequence
 * (index 0 of every batch row, so n_k + 1 keys), where the masks the layer
 * accepts keep them visible to every query, as torch's padded masks do (it
 * appends them last and pads attn_mask / key_padding_mask with a visible
 * column); see mha.c. */

void mha_desc(const qkv_mha *m, int64_t batch, int64_t n_q, int64_t n_k, const int64_t *key_lengths,
              qkv_attn_desc *d);
/* The descriptor of a decoding call (kv_cache.c): n_q new tokens over n_k
 * cached keys, causal - the layer's causal window kept, any other mask
 * causal, as a cache holds only the past. */
void mha_decode_desc(const qkv_mha *m, int64_t batch, int64_t n_q, int64_t n_k, qkv_attn_desc *d);

#endif
