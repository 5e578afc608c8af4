/* A pre-LayerNorm transformer (decoder or encoder) in the style of llm.c:
 * one forward that keeps what the backward needs, one backward that
 * accumulates every parameter's gradient. Attention goes through qkv_mha
 * (and so through the fused core); the linear layers through qkv_sgemm, or
 * under QKV_BF16 (qkv_model_set_precision) the MLP through the bf16 GEMM. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/internal.h"
#include "core/rng.h"
#include "kernels/kernels.h"
#include "layers/linear.h"
#include "model/model_internal.h"

#define LN_EPS 1e-5
#define FLOATER_DELTA 1.0 /* positions one time unit apart */


#define QKV_PI 3.14159265358979323846

void qkv_model_config_init(qkv_model_config *cfg, int64_t vocab, int64_t max_seq) {
    static const qkv_model_config defaults = {.dim = 128, .heads = 4, .layers = 2, .causal = 1,
                                              .tie_embeddings = 1, .pos = QKV_POSENC_SINUSOIDAL};
    if (!cfg) return;
    memcpy(cfg, &defaults, sizeof *cfg);
    cfg->vocab = vocab;
    cfg->max_seq = max_seq;
}

const qkv_model_config *qkv_model_get_config(const qkv_model *m) { return m ? &m->cfg : NULL; }

/* ---- building blocks ------------------------------------------------------ */

/* The model's own loops (LayerNorm, GELU, the loss gradient) are a quarter
 * of a training step at E = 128; left serial they cap what a second thread
 * can give. Each loop below is split by qkv_par_range into chunks of whole
 * rows (or, for the LayerNorm parameter gradients, of whole columns summed
 * over the rows in order), so every output element is computed by exactly
 * the code and in exactly the order of the serial loop: bitwise the same for
 * any thread count. */

typedef struct {
    const float *x, *g, *b, *mean, *rstd, *dy;
    float *y, *out_mean, *out_rstd, *dg, *db, *dx;
    int64_t E, rows;
    int accumulate;
} ln_job;

/* LayerNorm rows, their input gradients and their parameter gradients are
 * the ln_* kernels of kernels/nn.h (statistics in double, bitwise the same
 * on every ISA). */
static void ln_forward_rows(void *ctx, int64_t r0, int64_t r1) {
    const ln_job *j = ctx;
    const int64_t E = j->E;
    const qkv_nn_kernels *k = qkv_nn_kernels_active();
    for (int64_t r = r0; r < r1; r++)
        k->ln_forward(j->x + r * E, j->g, j->b, (size_t)E, LN_EPS, j->y + r * E, &j->out_mean[r], &j->out_rstd[r]);
}

static void model_layernorm_forward_t(const float *x, const float *g, const float *b, int64_t rows, int64_t E,
                                      float *y, float *mean, float *rstd, int threads) {
    ln_job j = {.x = x, .g = g, .b = b, .y = y, .out_mean = mean, .out_rstd = rstd, .E = E};
    qkv_par_range(threads, rows, 4 * E, ln_forward_rows, &j);
}

void model_layernorm_forward(const float *x, const float *g, const float *b, int64_t rows, int64_t E, float *y,
                              float *mean, float *rstd) {
    model_layernorm_forward_t(x, g, b, rows, E, y, mean, rstd, 1);
}

/* dx (+)= LN'(x)ᵀ dy, one chunk of rows per unit. */
static void ln_backward_rows(void *ctx, int64_t r0, int64_t r1) {
    const ln_job *j = ctx;
    const int64_t E = j->E;
    const qkv_nn_kernels *k = qkv_nn_kernels_active();
    for (int64_t r = r0; r < r1; r++)
        k->ln_backward_row(j->x + r * E, j->g, j->mean[r], j->rstd[r], j->dy + r * E, (size_t)E, j->dx + r * E,
                           j->accumulate);
}

/* dg, db accumulate over all rows in row order, one chunk of columns per unit. */
static void ln_backward_cols(void *ctx, int64_t c0, int64_t c1) {
    const ln_job *j = ctx;
    qkv_nn_kernels_active()->ln_grad_cols(j->x + c0, j->dy + c0, j->mean, j->rstd, (size_t)j->rows, (size_t)j->E,
                                          (size_t)(c1 - c0), j->dg + c0, j->db + c0);
}

static void layernorm_backward(const float *x, const float *g, const float *mean, const float *rstd,
                               const float *dy, int64_t rows, int64_t E, float *dg, float *db, float *dx,
                               int accumulate, int threads) {
    ln_job j = {.x = x, .g = g, .mean = mean, .rstd = rstd, .dy = dy, .dg = dg, .db = db, .dx = dx, .E = E,
                .rows = rows, .accumulate = accumulate};
    qkv_par_range(threads, rows, 6 * E, ln_backward_rows, &j);
    qkv_par_range(threads, E, 3 * rows, ln_backward_cols, &j);
}

/* act = GELU(pre); with keep_grad pre is replaced by GELU'(pre). */
typedef struct {
    float *pre, *act;
    int keep_grad;
} gelu_job;

static void gelu_range(void *ctx, int64_t i0, int64_t i1) {
    const gelu_job *j = ctx;
    qkv_nn_kernels_active()->gelu_grad(j->act + i0, j->pre + i0, (size_t)(i1 - i0), j->keep_grad);
}

/* x *= y elementwise. */
typedef struct {
    float *x;
    const float *y;
} scale_job;

static void scale_range(void *ctx, int64_t i0, int64_t i1) {
    const scale_job *j = ctx;
    for (int64_t i = i0; i < i1; i++) j->x[i] *= j->y[i];
}

/* dlogits = (softmax - onehot) / count · loss_scale, in place, per row. */
typedef struct {
    float *z;
    const int32_t *targets;
    int64_t V, count;
    double loss_scale;
} dlogits_job;

static void dlogits_rows(void *ctx, int64_t r0, int64_t r1) {
    const dlogits_job *j = ctx;
    const int64_t V = j->V;
    for (int64_t r = r0; r < r1; r++) {
        float *z = j->z + r * V;
        if (j->targets[r] < 0 || j->count == 0) {
            memset(z, 0, (size_t)V * sizeof(float));
            continue;
        }
        double mx = z[0], sum = 0.0;
        for (int64_t v = 1; v < V; v++) mx = z[v] > mx ? z[v] : mx;
        for (int64_t v = 0; v < V; v++) sum += exp(z[v] - mx);
        for (int64_t v = 0; v < V; v++)
            z[v] = (float)((exp(z[v] - mx) / sum - (v == j->targets[r] ? 1.0 : 0.0)) / (double)j->count *
                           j->loss_scale);
    }
}

/* GELU with the exact error function (torch.nn.GELU's default), through
 * qkv_nn_gelu_eval (kernels/nn.h: its accuracy is argued there). */
float model_gelu(float x) {
    float g;
    return qkv_nn_gelu_eval(x, &g);
}

/* Counter-based dropout: the mask of element i at (step, layer, site) is a
 * hash of those numbers, so the backward regenerates it instead of storing
 * it, and the same seed gives the same run whatever the thread count.
 * Element i is dropped iff u = (mix(key + i GAMMA) >> 11) 2^-53 < p: the
 * attention dropout kernel's test (kernels/attn.h), which computes it
 * vectorised, 256 elements a call (scalar, this loop was ~10% of a
 * training step at E = 128). A dropped element becomes x * 0. */
#define DROP_CHUNK 256
static void dropout_apply(const qkv_model *m, int64_t layer, int site, float *x, int64_t count) {
    double p = m->cfg.dropout;
    if (!m->train || p <= 0.0) return;
    uint64_t key = splitmix64_mix(m->drop_seed ^ splitmix64_mix((uint64_t)m->drop_step * 0x9E3779B97F4A7C15ull +
                                          (uint64_t)layer * 0x632BE59BD9B4E019ull + (uint64_t)site));
    float scale = (float)(1.0 / (1.0 - p));
    const qkv_kernels *K = qkv_kernels_active();
    const uint64_t thr = qkv_dropout_threshold(p);
    uint64_t C[DROP_CHUNK];
    for (int c = 0; c < DROP_CHUNK; c++) C[c] = (uint64_t)c * SPLITMIX64_GAMMA;
    for (int64_t i0 = 0; i0 < count; i0 += DROP_CHUNK) {
        const uint64_t R = key + (uint64_t)i0 * SPLITMIX64_GAMMA;
        K->dropout(x + i0, NULL, 0, 1, (size_t)(count - i0 < DROP_CHUNK ? count - i0 : DROP_CHUNK), &R, C, thr,
                   scale);
    }
}

/* x with the dropout mask of (layer, site) applied: x itself when dropout is
 * off (no copy), else a masked copy in tmp. */
static const float *dropped(const qkv_model *m, int64_t layer, int site, const float *x, float *tmp, int64_t count) {
    if (!m->train || m->cfg.dropout <= 0.0) return x;
    memcpy(tmp, x, (size_t)count * sizeof(float));
    dropout_apply(m, layer, site, tmp, count);
    return tmp;
}

/* ---- creation ------------------------------------------------------------- */

static int64_t add_seg(qkv_model *m, const char *name, int64_t *at, int64_t count, int decay, int ndim, int64_t d0,
                       int64_t d1) {
    model_segment *s = &m->seg[m->n_seg++];
    snprintf(s->name, sizeof s->name, "%s", name);
    s->count = count;
    s->decay = decay;
    s->ndim = ndim;
    s->shape[0] = d0;
    s->shape[1] = d1;
    int64_t off = *at;
    *at += count;
    s->layer = off; /* offset until the arrays exist; fixed up in qkv_model_create */
    return off;
}

static qkv_status check_config(const qkv_model_config *c) {
    if (c->vocab < 2 || c->dim < 1 || c->heads < 1 || c->layers < 1 || c->mlp_dim < 0 || c->max_seq < 1 ||
        c->threads < 0 || c->layers > 64 || c->vocab > (1 << 24) || c->dim > (1 << 16) || c->max_seq > (1 << 24))
        return QKV_ERR_BAD_SIZE;
    if (c->dim % c->heads != 0) return QKV_ERR_HEADS;
    if ((unsigned)c->pos > QKV_POSENC_FLOATER) return QKV_ERR_BAD_ENUM;
    if (!(c->dropout >= 0.0 && c->dropout < 1.0)) return QKV_ERR_BAD_PARAMETER;
    if (c->pos == QKV_POSENC_ROPE && (c->dim / c->heads) % 2 != 0) return QKV_ERR_BAD_SIZE;
    return QKV_OK;
}

qkv_status qkv_model_create(const qkv_model_config *cfg, uint64_t seed, qkv_model **out) {
    if (!cfg || !out) return QKV_ERR_NULL_POINTER;
    *out = NULL;
    qkv_status st = check_config(cfg);
    if (st != QKV_OK) return st;
    qkv_model *m = qkv_alloc_zeroed(sizeof *m);
    if (!m) return QKV_ERR_OUT_OF_MEMORY;
    m->cfg = *cfg;
    m->loss_scale = 1.0;
    const int64_t E = cfg->dim, V = cfg->vocab, L = cfg->layers;
    m->F = cfg->mlp_dim ? cfg->mlp_dim : 4 * E;
    const int64_t F = m->F;
    m->attn = qkv_alloc_zeroed((size_t)L * sizeof(qkv_mha *));
    m->blk = qkv_alloc_zeroed((size_t)L * sizeof(block_act));
    m->attn_keep = qkv_alloc_zeroed((size_t)L * sizeof(float *));
    int64_t *offs = qkv_alloc_zeroed((size_t)(8 * L) * sizeof(int64_t));
    if (!m->attn || !m->blk || !m->attn_keep || !offs) {
        qkv_free(offs);
        qkv_model_free(m);
        return QKV_ERR_OUT_OF_MEMORY;
    }
    m->o_ln1_w = offs;
    m->o_ln1_b = offs + L;
    m->o_ln2_w = offs + 2 * L;
    m->o_ln2_b = offs + 3 * L;
    m->o_fc1_w = offs + 4 * L;
    m->o_fc1_b = offs + 5 * L;
    m->o_fc2_w = offs + 6 * L;
    m->o_fc2_b = offs + 7 * L;

    /* Lay out the model's own parameters and name them (torch-like names). */
    int64_t at = 0;
    char name[64];
    m->o_emb = add_seg(m, "tok_emb.weight", &at, V * E, 1, 2, V, E);
    m->o_pos = -1;
    if (cfg->pos == QKV_POSENC_LEARNED) m->o_pos = add_seg(m, "pos_emb.weight", &at, cfg->max_seq * E, 0, 2, cfg->max_seq, E);
    for (int64_t l = 0; l < L; l++) {
        snprintf(name, sizeof name, "layers.%lld.ln1.weight", (long long)l);
        m->o_ln1_w[l] = add_seg(m, name, &at, E, 0, 1, E, 0);
        snprintf(name, sizeof name, "layers.%lld.ln1.bias", (long long)l);
        m->o_ln1_b[l] = add_seg(m, name, &at, E, 0, 1, E, 0);
        snprintf(name, sizeof name, "layers.%lld.ln2.weight", (long long)l);
        m->o_ln2_w[l] = add_seg(m, name, &at, E, 0, 1, E, 0);
        snprintf(name, sizeof name, "layers.%lld.ln2.bias", (long long)l);
        m->o_ln2_b[l] = add_seg(m, name, &at, E, 0, 1, E, 0);
        snprintf(name, sizeof name, "layers.%lld.mlp.fc1.weight", (long long)l);
        m->o_fc1_w[l] = add_seg(m, name, &at, F * E, 1, 2, F, E);
        snprintf(name, sizeof name, "layers.%lld.mlp.fc1.bias", (long long)l);
        m->o_fc1_b[l] = add_seg(m, name, &at, F, 0, 1, F, 0);
        snprintf(name, sizeof name, "layers.%lld.mlp.fc2.weight", (long long)l);
        m->o_fc2_w[l] = add_seg(m, name, &at, E * F, 1, 2, E, F);
        snprintf(name, sizeof name, "layers.%lld.mlp.fc2.bias", (long long)l);
        m->o_fc2_b[l] = add_seg(m, name, &at, E, 0, 1, E, 0);
    }
    m->o_lnf_w = add_seg(m, "ln_f.weight", &at, E, 0, 1, E, 0);
    m->o_lnf_b = add_seg(m, "ln_f.bias", &at, E, 0, 1, E, 0);
    m->o_head = cfg->tie_embeddings ? m->o_emb : add_seg(m, "head.weight", &at, V * E, 1, 2, V, E);
    m->n_own = at;
    m->params = qkv_alloc_zeroed((size_t)at * sizeof(float));
    m->grads = qkv_alloc_zeroed((size_t)at * sizeof(float));
    if (!m->params || !m->grads) {
        qkv_model_free(m);
        return QKV_ERR_OUT_OF_MEMORY;
    }
    for (int64_t i = 0; i < m->n_seg; i++) {
        m->seg[i].param = m->params + m->seg[i].layer;
        m->seg[i].grad = m->grads + m->seg[i].layer;
        m->seg[i].layer = -1;
    }

    /* Initialisation as GPT-2: N(0, 0.02) matrices, LN weights 1, the rest 0;
     * the residual projections scaled by 1/sqrt(2L). */
    uint64_t z = seed;
    for (int64_t i = 0; i < m->n_seg; i++) {
        model_segment *s = &m->seg[i];
        int is_ln_w = strstr(s->name, "ln") && strstr(s->name, ".weight");
        double sd = 0.02;
        if (strstr(s->name, "fc2.weight")) sd /= sqrt(2.0 * (double)L);
        for (int64_t j = 0; j < s->count; j++) {
            if (is_ln_w) s->param[j] = 1.0f;
            else if (s->decay || strstr(s->name, "pos_emb")) {
                uint64_t a = splitmix64_next(&z), b = splitmix64_next(&z);
                double u1 = ((double)(a >> 11) + 1.0) * 0x1.0p-53, u2 = (double)(b >> 11) * 0x1.0p-53;
                s->param[j] = (float)(sd * sqrt(-2.0 * log(u1)) * cos(2.0 * QKV_PI * u2));
            }
        }
    }

    /* The attention layers. */
    for (int64_t l = 0; l < L; l++) {
        qkv_mha_config mc;
        qkv_mha_config_init(&mc, E, cfg->heads);
        mc.attn.mask = cfg->causal ? QKV_MASK_CAUSAL : QKV_MASK_NONE;
        mc.attn.threads = cfg->threads;
        mc.pos = cfg->pos == QKV_POSENC_ROPE    ? QKV_POS_ROPE
                 : cfg->pos == QKV_POSENC_ALIBI ? QKV_POS_ALIBI
                 : cfg->pos == QKV_POSENC_RELATIVE ? QKV_POS_RELATIVE
                                                    : QKV_POS_NONE;
        st = qkv_mha_create(&mc, splitmix64_mix(seed + 1000 + (uint64_t)l), &m->attn[l]);
        if (st != QKV_OK) {
            qkv_model_free(m);
            return st;
        }
        model_segment *s = &m->seg[m->n_seg++];
        snprintf(s->name, sizeof s->name, "layers.%lld.attn.", (long long)l);
        s->param = qkv_mha_params(m->attn[l], &s->count);
        s->grad = qkv_mha_grads(m->attn[l], NULL);
        s->decay = 1;
        s->is_mha = 1;
        s->layer = l;
    }
    if (cfg->pos == QKV_POSENC_FLOATER) {
        st = qkv_floater_create(E, 2 * E > 64 ? 64 : 2 * E, FLOATER_DELTA, 1, splitmix64_mix(seed + 77), &m->floater);
        if (st != QKV_OK) {
            qkv_model_free(m);
            return st;
        }
        model_segment *s = &m->seg[m->n_seg++];
        snprintf(s->name, sizeof s->name, "floater.params");
        s->param = qkv_floater_params(m->floater, &s->count);
        s->grad = qkv_floater_grads(m->floater, NULL);
        s->ndim = 1;
        s->shape[0] = s->count;
        s->layer = -1;
    }
    if (cfg->pos == QKV_POSENC_SINUSOIDAL) {
        m->sinusoid = qkv_alloc((size_t)(cfg->max_seq * E) * sizeof(float));
        if (!m->sinusoid || qkv_posenc_sinusoidal(cfg->max_seq, E, 0, m->sinusoid) != QKV_OK) {
            qkv_model_free(m);
            return QKV_ERR_OUT_OF_MEMORY;
        }
    }
    *out = m;
    return QKV_OK;
}

static void free_acts(qkv_model *m) {
    if (m->blk)
        for (int64_t l = 0; l < m->cfg.layers; l++) {
            block_act *b = &m->blk[l];
            QKV_FREE_ALL(b->x, b->ln1, b->ln1_mean, b->ln1_rstd, b->attn_out, b->mid, b->ln2, b->ln2_mean,
                         b->ln2_rstd, b->pre, b->act, b->mlp_out);
            memset(b, 0, sizeof *b);
        }
    QKV_FREE_ALL(m->h, m->lnf, m->lnf_mean, m->lnf_rstd, m->logits, m->floater_pos, m->floater_dpos, m->dh, m->dtmp,
                 m->dtmp2, m->dF, m->tokens, m->targets);
    m->h = m->lnf = m->lnf_mean = m->lnf_rstd = m->logits = m->floater_pos = m->floater_dpos = NULL;
    m->dh = m->dtmp = m->dtmp2 = m->dF = NULL;
    m->tokens = m->targets = NULL;
    m->rows_cap = 0;
}

/* The decoding state (decode.c): caches, scratch, FLOATER positions. */
void model_decode_free(qkv_model *m) {
    if (m->cache)
        for (int64_t l = 0; l < m->cfg.layers; l++) qkv_kv_cache_free(m->cache[l]);
    qkv_free(m->cache);
    qkv_free(m->dec_buf);
    qkv_free(m->dec_floater);
    m->cache = NULL;
    m->dec_buf = m->dec_floater = NULL;
    m->dec_buf_rows = m->dec_len = m->dec_max = 0;
}

void qkv_model_free(qkv_model *m) {
    if (!m) return;
    model_decode_free(m);
    free_acts(m);
    if (m->attn)
        for (int64_t l = 0; l < m->cfg.layers; l++) qkv_mha_free(m->attn[l]);
    if (m->attn_keep)
        for (int64_t l = 0; l < m->cfg.layers; l++) qkv_free(m->attn_keep[l]);
    qkv_floater_free(m->floater);
    QKV_FREE_ALL(m->attn, m->attn_keep, m->blk, m->o_ln1_w, m->params, m->grads, m->sinusoid, m);
}

/* Grow the activations to `rows` rows (B * n). */
static int reserve_acts(qkv_model *m, int64_t rows, int64_t n) {
    if (rows <= m->rows_cap && n <= m->cfg.max_seq) return 1;
    free_acts(m);
    const int64_t E = m->cfg.dim, F = m->F, V = m->cfg.vocab;
    int ok = 1;
    /* Each buffer given gets cnt floats (none once one allocation failed). */
#define GET(cnt, ...)                                                                  \
    do {                                                                               \
        float **slot_[] = {__VA_ARGS__};                                               \
        for (size_t i_ = 0; i_ < sizeof slot_ / sizeof slot_[0]; i_++)                 \
            ok = ok && (*slot_[i_] = qkv_alloc((size_t)(cnt) * sizeof(float))) != NULL; \
    } while (0)
    for (int64_t l = 0; l < m->cfg.layers; l++) {
        block_act *b = &m->blk[l];
        GET(rows * E, &b->x, &b->ln1, &b->attn_out, &b->mid, &b->ln2, &b->mlp_out);
        GET(rows, &b->ln1_mean, &b->ln1_rstd, &b->ln2_mean, &b->ln2_rstd);
        GET(rows * F, &b->pre, &b->act);
    }
    GET(rows * E, &m->h, &m->lnf, &m->dh, &m->dtmp, &m->dtmp2);
    GET(rows, &m->lnf_mean, &m->lnf_rstd);
    GET(rows * V, &m->logits);
    GET(rows * F, &m->dF);
    if (m->floater) GET(m->cfg.max_seq * E, &m->floater_pos, &m->floater_dpos);
#undef GET
    m->tokens = qkv_alloc((size_t)rows * sizeof(int32_t));
    m->targets = qkv_alloc((size_t)rows * sizeof(int32_t));
    ok = ok && m->tokens && m->targets;
    if (!ok) {
        free_acts(m);
        return 0;
    }
    m->rows_cap = rows;
    return 1;
}

qkv_status qkv_model_keep_attention(qkv_model *m, int keep) {
    if (!m) return QKV_ERR_NULL_POINTER;
    m->keep_attention = keep != 0;
    return QKV_OK;
}

const float *qkv_model_attention(const qkv_model *m, int64_t layer) {
    if (!m || layer < 0 || layer >= m->cfg.layers || !m->keep_attention) return NULL;
    return m->attn_keep[layer];
}

void qkv_model_set_step(qkv_model *m, uint64_t seed, int64_t step) {
    if (!m) return;
    m->drop_seed = seed;
    m->drop_step = step;
}

qkv_status qkv_model_set_precision(qkv_model *m, qkv_dtype compute) {
    if (!m) return QKV_ERR_NULL_POINTER;
    if (compute != QKV_F32 && compute != QKV_BF16 && compute != QKV_F16) return QKV_ERR_BAD_ENUM;
    for (int64_t l = 0; l < m->cfg.layers; l++) {
        qkv_status s = qkv_mha_set_precision(m->attn[l], compute);
        if (s != QKV_OK) return s;
    }
    m->compute = compute == QKV_BF16 ? QKV_BF16 : QKV_F32; /* the MLP's products */
    m->have_targets = 0; /* the layers forgot their forward */
    return QKV_OK;
}

qkv_status qkv_model_set_loss_scale(qkv_model *m, double scale) {
    if (!m) return QKV_ERR_NULL_POINTER;
    if (!(isfinite(scale) && scale > 0)) return QKV_ERR_BAD_PARAMETER;
    m->loss_scale = scale;
    return QKV_OK;
}

/* ---- forward -------------------------------------------------------------- */

/* With sinusoidal or FLOATER positions (entries of order 1) the embeddings
 * are scaled by sqrt(E), as in Vaswani et al. 2017 section 3.4; otherwise
 * small embeddings (std 0.02) are drowned by the positions and the tokens
 * are hard to tell apart (copy then stays at chance). */
float model_emb_scale(const qkv_model *m) {
    qkv_posenc p = m->cfg.pos;
    return p == QKV_POSENC_SINUSOIDAL || p == QKV_POSENC_FLOATER ? (float)sqrt((double)m->cfg.dim) : 1.0f;
}

void model_embed_row(const qkv_model *m, float scale, int32_t token, int64_t pos, float *out) {
    const int64_t E = m->cfg.dim;
    const float *P = m->params, *e = P + m->o_emb + (int64_t)token * E;
    for (int64_t i = 0; i < E; i++) {
        float v = e[i] * scale;
        if (m->sinusoid) v += m->sinusoid[pos * E + i];
        if (m->o_pos >= 0) v += P[m->o_pos + pos * E + i];
        out[i] = v;
    }
}

qkv_status qkv_model_forward(qkv_model *m, int64_t batch, int64_t n, const int32_t *tokens,
                             const int32_t *targets, int train, float *logits, double *loss) {
    if (!m || !tokens || (targets && !loss)) return QKV_ERR_NULL_POINTER;
    if (batch <= 0 || n <= 0) return QKV_ERR_BAD_SIZE;
    if (n > m->cfg.max_seq) return QKV_ERR_POSITION;
    const int64_t E = m->cfg.dim, V = m->cfg.vocab, F = m->F, L = m->cfg.layers, H = m->cfg.heads;
    int64_t rows;
    if (!qkv_mul_ok(batch, n, &rows) || rows > (INT64_MAX / 8) / (E > F ? (E > V ? E : V) : (F > V ? F : V)))
        return QKV_ERR_SIZE_OVERFLOW;
    for (int64_t i = 0; i < rows; i++)
        if (tokens[i] < 0 || tokens[i] >= V || (targets && (targets[i] < -1 || targets[i] >= V)))
            return QKV_ERR_BAD_PARAMETER;
    m->have_targets = 0;
    if (!reserve_acts(m, rows, n)) return QKV_ERR_OUT_OF_MEMORY;
    if (m->keep_attention && m->attn_cap < batch * H * n * n) {
        for (int64_t l = 0; l < L; l++) {
            qkv_free(m->attn_keep[l]);
            m->attn_keep[l] = qkv_alloc((size_t)(batch * H * n * n) * sizeof(float));
            if (!m->attn_keep[l]) {
                m->attn_cap = 0;
                return QKV_ERR_OUT_OF_MEMORY;
            }
        }
        m->attn_cap = batch * H * n * n;
    }
    m->B = batch;
    m->n = n;
    m->train = train;
    memcpy(m->tokens, tokens, (size_t)rows * sizeof(int32_t));
    const float *P = m->params;
    const int thr = m->cfg.threads;
    qkv_status s;

    /* Embedding and absolute positions. */
    float *h = m->h;
    const float emb_scale = model_emb_scale(m);
    for (int64_t r = 0; r < rows; r++) model_embed_row(m, emb_scale, tokens[r], r % n, h + r * E);
    if (m->floater && (s = qkv_floater_forward(m->floater, n, m->floater_pos)) != QKV_OK) return s;

    for (int64_t l = 0; l < L; l++) {
        block_act *b = &m->blk[l];
        for (int64_t r = 0; r < rows; r++)
            for (int64_t i = 0; i < E; i++)
                b->x[r * E + i] = h[r * E + i] + (m->floater ? m->floater_pos[(r % n) * E + i] : 0.0f);
        model_layernorm_forward_t(b->x, P + m->o_ln1_w[l], P + m->o_ln1_b[l], rows, E, b->ln1, b->ln1_mean,
                                  b->ln1_rstd, thr);
        /* Attention dropout happens inside the kernel, its mask keyed by
         * (seed, step, layer); the layer's backward regenerates it. */
        qkv_mha_set_dropout(m->attn[l], train ? m->cfg.dropout : 0.0,
                            splitmix64_mix(m->drop_seed ^ splitmix64_mix((uint64_t)m->drop_step * 0x9E3779B97F4A7C15ull + (uint64_t)l + 7)));
        s = qkv_mha_forward(m->attn[l], batch, n, n, b->ln1, NULL, NULL, NULL, b->attn_out,
                            m->keep_attention ? m->attn_keep[l] : NULL);
        if (s != QKV_OK) return s;
        const float *ao = dropped(m, l, 0, b->attn_out, m->dtmp, rows * E);
        for (int64_t i = 0; i < rows * E; i++) b->mid[i] = b->x[i] + ao[i];
        model_layernorm_forward_t(b->mid, P + m->o_ln2_w[l], P + m->o_ln2_b[l], rows, E, b->ln2, b->ln2_mean,
                                  b->ln2_rstd, thr);
        if ((s = nn_linear_p(m->compute, b->ln2, rows, E, P + m->o_fc1_w[l], P + m->o_fc1_b[l], F, b->pre, thr)) != QKV_OK)
            return s;
        /* With targets (a backward may follow) pre is replaced by GELU'(pre),
         * all the backward needs of it, from the same exponential. */
        gelu_job gj = {b->pre, b->act, targets != NULL};
        qkv_par_range(thr, rows * F, 8, gelu_range, &gj);
        if ((s = nn_linear_p(m->compute, b->act, rows, F, P + m->o_fc2_w[l], P + m->o_fc2_b[l], E, b->mlp_out, thr)) != QKV_OK)
            return s;
        const float *mo = dropped(m, l, 1, b->mlp_out, m->dtmp, rows * E);
        for (int64_t i = 0; i < rows * E; i++) h[i] = b->mid[i] + mo[i];
    }
    model_layernorm_forward_t(h, P + m->o_lnf_w, P + m->o_lnf_b, rows, E, m->lnf, m->lnf_mean, m->lnf_rstd, thr);
    if ((s = nn_linear(m->lnf, rows, E, P + m->o_head, NULL, V, m->logits, thr)) != QKV_OK) return s;
    if (logits) memcpy(logits, m->logits, (size_t)(rows * V) * sizeof(float));

    if (targets) {
        /* Mean cross-entropy over targeted positions, max-subtracted. */
        double total = 0.0;
        int64_t count = 0;
        for (int64_t r = 0; r < rows; r++) {
            if (targets[r] < 0) continue;
            const float *z = m->logits + r * V;
            double mx = z[0], sum = 0.0;
            for (int64_t v = 1; v < V; v++) mx = z[v] > mx ? z[v] : mx;
            for (int64_t v = 0; v < V; v++) sum += exp(z[v] - mx);
            total += log(sum) + mx - z[targets[r]];
            count++;
        }
        *loss = count ? total / (double)count : 0.0;
        memcpy(m->targets, targets, (size_t)rows * sizeof(int32_t));
        m->have_targets = 1;
    }
    return QKV_OK;
}

/* ---- backward ------------------------------------------------------------- */

qkv_status qkv_model_set_grad_hook(qkv_model *m, qkv_grad_hook hook, void *user) {
    if (!m) return QKV_ERR_NULL_POINTER;
    m->grad_hook = hook;
    m->grad_hook_user = hook ? user : NULL;
    return QKV_OK;
}

/* Tell the hook that the gradients at these addresses (segment starts) are
 * final: their segment indices, in the order given (NULL entries skipped). */
static qkv_status grads_ready(qkv_model *m, const float *const *grads, int n) {
    if (!m->grad_hook) return QKV_OK;
    int64_t idx[16];
    int c = 0;
    for (int t = 0; t < n && c < 16; t++)
        for (int64_t i = 0; grads[t] && i < m->n_seg; i++)
            if (m->seg[i].grad == grads[t]) {
                idx[c++] = i;
                break;
            }
    return c ? m->grad_hook(m->grad_hook_user, idx, c) : QKV_OK;
}

qkv_status qkv_model_backward(qkv_model *m) {
    if (!m) return QKV_ERR_NULL_POINTER;
    if (!m->have_targets) return QKV_ERR_UNSUPPORTED;
    const int64_t E = m->cfg.dim, V = m->cfg.vocab, F = m->F, L = m->cfg.layers, n = m->n, rows = m->B * n;
    const float *P = m->params;
    float *G = m->grads;
    const int thr = m->cfg.threads;
    qkv_status s;

    /* dlogits = (softmax - onehot) / count, in place over the logits, times
     * the loss scale (1 unless qkv_model_set_loss_scale says otherwise). */
    int64_t count = 0;
    for (int64_t r = 0; r < rows; r++) count += m->targets[r] >= 0;
    float *dl = m->logits;
    dlogits_job dj = {dl, m->targets, V, count, m->loss_scale};
    qkv_par_range(thr, rows, 3 * V, dlogits_rows, &dj);
    m->have_targets = 0; /* the logits are gone */

    float *dh = m->dh, *dx = m->dtmp, *dd = m->dtmp2;
    if ((s = nn_linear_backward(m->lnf, dl, rows, E, V, P + m->o_head, G + m->o_head, NULL, dd, 0, thr)) != QKV_OK)
        return s;
    layernorm_backward(m->h, P + m->o_lnf_w, m->lnf_mean, m->lnf_rstd, dd, rows, E, G + m->o_lnf_w, G + m->o_lnf_b, dh,
                       0, thr);
    { /* the output head (untied: final now) and the final norm */
        const float *r[3] = {G + m->o_lnf_w, G + m->o_lnf_b, G + m->o_head};
        if ((s = grads_ready(m, r, m->o_head == m->o_emb ? 2 : 3)) != QKV_OK) return s;
    }
    if (m->floater) memset(m->floater_dpos, 0, (size_t)(n * E) * sizeof(float));

    for (int64_t l = L - 1; l >= 0; l--) {
        block_act *b = &m->blk[l];
        /* h = mid + drop(mlp_out) */
        const float *dmo = dropped(m, l, 1, dh, dd, rows * E);
        if ((s = nn_linear_backward_p(m->compute, b->act, dmo, rows, F, E, P + m->o_fc2_w[l], G + m->o_fc2_w[l],
                                       G + m->o_fc2_b[l], m->dF, 0, thr)) != QKV_OK)
            return s;
        scale_job sj = {m->dF, b->pre}; /* dF *= GELU'(pre), from the forward */
        qkv_par_range(thr, rows * F, 1, scale_range, &sj);
        if ((s = nn_linear_backward_p(m->compute, b->ln2, m->dF, rows, E, F, P + m->o_fc1_w[l], G + m->o_fc1_w[l],
                                       G + m->o_fc1_b[l], dd, 0, thr)) != QKV_OK)
            return s;
        /* dmid = dh + LN2'(dd) */
        layernorm_backward(b->mid, P + m->o_ln2_w[l], b->ln2_mean, b->ln2_rstd, dd, rows, E, G + m->o_ln2_w[l],
                           G + m->o_ln2_b[l], dh, 1, thr);
        /* mid = x + drop(attn_out) */
        const float *dao = dropped(m, l, 0, dh, dd, rows * E);
        if ((s = qkv_mha_backward(m->attn[l], b->ln1, NULL, NULL, dao, dx, NULL, NULL)) != QKV_OK) return s;
        layernorm_backward(b->x, P + m->o_ln1_w[l], b->ln1_mean, b->ln1_rstd, dx, rows, E, G + m->o_ln1_w[l],
                           G + m->o_ln1_b[l], dh, 1, thr);
        if (m->floater)
            for (int64_t r = 0; r < rows; r++)
                for (int64_t i = 0; i < E; i++) m->floater_dpos[(r % n) * E + i] += dh[r * E + i];
        { /* block l is done, last block first */
            const float *r[9] = {G + m->o_fc2_w[l], G + m->o_fc2_b[l], G + m->o_fc1_w[l], G + m->o_fc1_b[l],
                                 G + m->o_ln2_w[l], G + m->o_ln2_b[l], qkv_mha_grads(m->attn[l], NULL),
                                 G + m->o_ln1_w[l], G + m->o_ln1_b[l]};
            if ((s = grads_ready(m, r, 9)) != QKV_OK) return s;
        }
    }
    if (m->floater && (s = qkv_floater_backward(m->floater, m->floater_dpos)) != QKV_OK) return s;
    /* Embedding rows and learned positions, in a fixed order. */
    const float emb_scale = model_emb_scale(m);
    for (int64_t r = 0; r < rows; r++) {
        float *ge = G + m->o_emb + (int64_t)m->tokens[r] * E;
        for (int64_t i = 0; i < E; i++) ge[i] += dh[r * E + i] * emb_scale;
        if (m->o_pos >= 0)
            for (int64_t i = 0; i < E; i++) G[m->o_pos + (r % n) * E + i] += dh[r * E + i];
    }
    { /* the rest: FLOATER, the embedding (with the tied head), positions */
        const float *r[3] = {m->floater ? qkv_floater_grads(m->floater, NULL) : NULL, G + m->o_emb,
                             m->o_pos >= 0 ? G + m->o_pos : NULL};
        if ((s = grads_ready(m, r, 3)) != QKV_OK) return s;
    }
    return QKV_OK;
}

/* ---- parameters ----------------------------------------------------------- */

int64_t qkv_model_segment_count(const qkv_model *m) { return m ? m->n_seg : 0; }

qkv_status qkv_model_segment(qkv_model *m, int64_t i, const char **name, float **param, float **grad,
                             int64_t *count) {
    if (!m) return QKV_ERR_NULL_POINTER;
    if (i < 0 || i >= m->n_seg) return QKV_ERR_BAD_SIZE;
    if (name) *name = m->seg[i].name;
    if (param) *param = m->seg[i].param;
    if (grad) *grad = m->seg[i].grad;
    if (count) *count = m->seg[i].count;
    return QKV_OK;
}

int64_t qkv_model_param_count(const qkv_model *m) {
    int64_t c = 0;
    if (m)
        for (int64_t i = 0; i < m->n_seg; i++) c += m->seg[i].count;
    return c;
}

void qkv_model_zero_grad(qkv_model *m) {
    if (!m) return;
    memset(m->grads, 0, (size_t)m->n_own * sizeof(float));
    for (int64_t l = 0; l < m->cfg.layers; l++) qkv_mha_zero_grad(m->attn[l]);
    qkv_floater_zero_grad(m->floater);
}
