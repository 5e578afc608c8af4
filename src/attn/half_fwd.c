/* placeholder: the bf16 fast forward (filled in by the AVX512-BF16 path). */
#include "attn/half.h"

qkv_status qkv_half_fast_forward(const qkv_plan *p, const uint16_t *q, const uint16_t *k,
                                 const uint16_t *v, uint16_t *out, float *lse) {
    (void)p; (void)q; (void)k; (void)v; (void)out; (void)lse;
    return QKV_ERR_UNSUPPORTED;
}
