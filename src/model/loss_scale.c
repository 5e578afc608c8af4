/* Dynamic loss scaling for mixed-precision training (fp16 attention core):
 * the loss gradient is multiplied by a power of two so that small gradients
 * survive fp16's range (its smallest subnormal is 2^-24), the gradients are
 * unscaled before clipping and AdamW, and a step whose gradients hold inf or
 * NaN is skipped with the scale halved; after growth_interval clean steps in
 * a row the scale doubles (the rule of torch.cuda.amp.GradScaler). Every
 * decision is a function of the gradients alone, so a run is reproducible. */
#include <math.h>

#include "model/model_internal.h"

#define LS_MIN 0x1.0p-24
#define LS_MAX 0x1.0p48

void qkv_loss_scaler_init(qkv_loss_scaler *ls) {
    if (!ls) return;
    ls->scale = 0x1.0p15;
    ls->growth_interval = 1000;
    ls->clean = 0;
    ls->skipped = 0;
}

/* A positive power of two in [LS_MIN, LS_MAX]: then x * (1 / scale) is exact
 * for every float x whose result is a normal float. */
static int power_of_two(double s) {
    if (!(s >= LS_MIN && s <= LS_MAX)) return 0;
    int e;
    return frexp(s, &e) == 0.5;
}

qkv_status qkv_loss_scaler_step(qkv_loss_scaler *ls, qkv_model *m, qkv_adamw *opt, double lr, double clip,
                                double *grad_norm, int *skipped) {
    if (!ls || !m || !opt) return QKV_ERR_NULL_POINTER;
    if (!power_of_two(ls->scale) || ls->growth_interval < 1 || ls->clean < 0) return QKV_ERR_BAD_PARAMETER;
    int finite = 1;
    for (int64_t s = 0; s < m->n_seg && finite; s++) {
        const float *g = m->seg[s].grad;
        for (int64_t i = 0; i < m->seg[s].count; i++)
            if (!isfinite(g[i])) {
                finite = 0;
                break;
            }
    }
    if (!finite) {
        ls->scale = ls->scale * 0.5 < LS_MIN ? LS_MIN : ls->scale * 0.5;
        ls->clean = 0;
        ls->skipped++;
        if (grad_norm) *grad_norm = INFINITY;
        if (skipped) *skipped = 1;
        return QKV_OK;
    }
    const float inv = (float)(1.0 / ls->scale);
    for (int64_t s = 0; s < m->n_seg; s++) {
        float *g = m->seg[s].grad;
        for (int64_t i = 0; i < m->seg[s].count; i++) g[i] *= inv;
    }
    if (skipped) *skipped = 0;
    qkv_status st = qkv_adamw_step(opt, lr, clip, grad_norm);
    if (st != QKV_OK) return st;
    if (++ls->clean >= ls->growth_interval) {
        ls->clean = 0;
        if (ls->scale * 2 <= LS_MAX) ls->scale *= 2;
    }
    return QKV_OK;
}
