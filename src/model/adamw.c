/* AdamW with decoupled weight decay (Loshchilov & Hutter 2019), global-norm
 * clipping, and the warm-up + cosine learning-rate schedule. The update is
 * elementwise in a fixed order, so a run is reproducible bit for bit. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "model/model_internal.h"

struct qkv_adamw {
    qkv_model *m;
    double b1, b2, eps, wd;
    int64_t t;
    float *mom, *vel;     /* one entry per parameter, segments in order */
    int64_t n;
};

qkv_status qkv_adamw_create(qkv_model *m, double beta1, double beta2, double eps, double weight_decay,
                            qkv_adamw **out) {
    if (!m || !out) return QKV_ERR_NULL_POINTER;
    *out = NULL;
    if (!(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1 && eps > 0 && weight_decay >= 0 && isfinite(eps) &&
          isfinite(weight_decay)))
        return QKV_ERR_BAD_PARAMETER;
    qkv_adamw *o = qkv_alloc(sizeof *o);
    if (!o) return QKV_ERR_OUT_OF_MEMORY;
    *o = (qkv_adamw){.m = m, .b1 = beta1, .b2 = beta2, .eps = eps, .wd = weight_decay, .n = qkv_model_param_count(m)};
    o->mom = qkv_alloc_zeroed((size_t)o->n * sizeof(float));
    o->vel = qkv_alloc_zeroed((size_t)o->n * sizeof(float));
    if (!o->mom || !o->vel) {
        qkv_adamw_free(o);
        return QKV_ERR_OUT_OF_MEMORY;
    }
    *out = o;
    return QKV_OK;
}

void qkv_adamw_free(qkv_adamw *o) {
    if (!o) return;
    QKV_FREE_ALL(o->mom, o->vel, o);
}

/* The update of elements [i0, i1) of one segment (its moments start at `at`). */
typedef struct {
    qkv_adamw *o;
    model_segment *sg;
    int64_t at;
    double lr, scale, c1, c2, wd;
} update_job;

static void update_range(void *ctx, int64_t i0, int64_t i1) {
    const update_job *j = ctx;
    qkv_adamw *o = j->o;
    model_segment *sg = j->sg;
    for (int64_t i = i0; i < i1; i++) {
        const int64_t at = j->at + i;
        double g = sg->grad[i] * j->scale;
        double mo = o->b1 * o->mom[at] + (1 - o->b1) * g, ve = o->b2 * o->vel[at] + (1 - o->b2) * g * g;
        o->mom[at] = (float)mo;
        o->vel[at] = (float)ve;
        double p = sg->param[i];
        p -= j->lr * (mo / j->c1 / (sqrt(ve / j->c2) + o->eps) + j->wd * p);
        sg->param[i] = (float)p;
    }
}

qkv_status qkv_adamw_step(qkv_adamw *o, double lr, double clip, double *grad_norm) {
    if (!o) return QKV_ERR_NULL_POINTER;
    if (!isfinite(lr) || lr < 0) return QKV_ERR_BAD_PARAMETER;
    qkv_model *m = o->m;
    double ss = 0.0;
    for (int64_t s = 0; s < m->n_seg; s++)
        for (int64_t i = 0; i < m->seg[s].count; i++) ss += (double)m->seg[s].grad[i] * m->seg[s].grad[i];
    double norm = sqrt(ss), scale = (clip > 0 && norm > clip) ? clip / norm : 1.0;
    if (grad_norm) *grad_norm = norm;
    o->t++;
    double c1 = 1.0 - pow(o->b1, (double)o->t), c2 = 1.0 - pow(o->b2, (double)o->t);
    int64_t at = 0;
    for (int64_t s = 0; s < m->n_seg; s++) {
        model_segment *sg = &m->seg[s];
        /* The attention block holds its biases with its matrices; decaying
         * them too is harmless at these rates (GPT-2 practice differs). */
        update_job j = {o, sg, at, lr, scale, c1, c2, sg->decay ? o->wd : 0.0};
        /* Elementwise, so split over the threads: the same bits for any count. */
        qkv_par_range(m->cfg.threads, sg->count, 16, update_range, &j);
        at += sg->count;
    }
    return QKV_OK;
}

qkv_status qkv_adamw_save(const qkv_adamw *o, qkv_safetensors *st) {
    if (!o || !st) return QKV_ERR_NULL_POINTER;
    qkv_array a;
    memset(&a, 0, sizeof a);
    a.dtype = QKV_F32;
    a.ndim = 1;
    a.shape[0] = o->n;
    a.data = o->mom;
    qkv_status s = qkv_safetensors_put(st, "adamw.m", &a);
    a.data = o->vel;
    if (s == QKV_OK) s = qkv_safetensors_put(st, "adamw.v", &a);
    char t[32];
    snprintf(t, sizeof t, "%lld", (long long)o->t);
    if (s == QKV_OK) s = qkv_safetensors_set_meta(st, "adamw.t", t);
    return s;
}

qkv_status qkv_adamw_load(qkv_adamw *o, const qkv_safetensors *st, char *why, size_t why_len) {
    if (!o || !st) return QKV_ERR_NULL_POINTER;
    const qkv_array *m = qkv_safetensors_get(st, "adamw.m"), *v = qkv_safetensors_get(st, "adamw.v");
    const char *t = qkv_safetensors_get_meta(st, "adamw.t");
    if (!m || !v || !t || m->dtype != QKV_F32 || v->dtype != QKV_F32 || qkv_array_count(m) != o->n ||
        qkv_array_count(v) != o->n) {
        if (why) snprintf(why, why_len, "optimiser state missing or of another model size");
        return QKV_ERR_FORMAT;
    }
    memcpy(o->mom, m->data, (size_t)o->n * sizeof(float));
    memcpy(o->vel, v->data, (size_t)o->n * sizeof(float));
    o->t = strtoll(t, NULL, 10);
    return QKV_OK;
}

double qkv_lr_schedule(int64_t step, int64_t warmup, int64_t total_steps, double lr, double min_lr) {
    if (step < warmup) return lr * (double)(step + 1) / (double)warmup;
    if (total_steps <= warmup || step >= total_steps) return min_lr;
    double progress = (double)(step - warmup) / (double)(total_steps - warmup);
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + cos(3.14159265358979323846 * progress));
}
