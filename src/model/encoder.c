/* The encoder's forward (qkv/encoder.h): texts tokenized and packed end to
 * end, embeddings, post-LN BERT blocks (projections by the linear layer,
 * attention by qkv_attention_forward over the packed sequences), pooling.
 * Every buffer is the encoder's workspace, grown on demand; a batch is run
 * in chunks of whole sentences of at most ENC_CHUNK_TOKENS tokens, so the
 * workspace stays bounded however many texts come (2048 tokens: 31 MB for
 * all-MiniLM-L6-v2, rows enough for the matrix products to run at speed). */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <math.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "attn/half.h"
#include "core/cpu.h"
#include "core/half.h"
#include "core/internal.h"
#include "core/threads.h"
#include "kernels/kernels.h"
#include "layers/linear.h"
#include "model/encoder_internal.h"
#include "model/model_internal.h"

#define ENC_CHUNK_TOKENS 2048
#define ENC_BF16_ATTN_MIN_LEN 96 /* the longest sentence of a chunk from which its attention runs in bf16 */

/* ---- phase timing (bench_encoder's breakdown) --------------------------- */

void enc_set_profile(qkv_encoder *e, double *seconds) { e->prof = seconds; }

const char *enc_phase_name(int phase) {
    static const char *const NAMES[ENC_PH_COUNT] = {"tokenize", "embeddings", "QKV projection", "attention",
                                                     "output projection", "MLP", "LayerNorm", "pooling"};
    return phase >= 0 && phase < ENC_PH_COUNT ? NAMES[phase] : "?";
}

static double now_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* When timing: the start of a phase (else 0). */
static double phase_start(const qkv_encoder *e) { return e->prof ? now_seconds() : 0.0; }

/* The time since *t0 goes to phase ph (when timing); *t0 moves to now. */
static void phase_end(const qkv_encoder *e, int ph, double *t0) {
    if (!e->prof) return;
    double t = now_seconds();
    e->prof[ph] += t - *t0;
    *t0 = t;
}

/* ---- workspace ---------------------------------------------------------- */

static qkv_status ws_reserve(qkv_encoder *e, int64_t rows) {
    if (rows <= e->ws_rows) return QKV_OK;
    int64_t H = e->info.hidden, I = e->info.intermediate, per;
    if (!qkv_mul_ok(6 * H + I, rows, &per) || (uint64_t)per > SIZE_MAX / sizeof(float))
        return QKV_ERR_SIZE_OVERFLOW;
    float *ws = qkv_alloc((size_t)per * sizeof(float));
    if (!ws) return QKV_ERR_OUT_OF_MEMORY;
    qkv_free(e->ws);
    e->ws = ws;
    e->ws_rows = rows;
    e->x = ws;
    e->q = e->x + rows * H;
    e->k = e->q + rows * H;
    e->v = e->k + rows * H;
    e->ctx = e->v + rows * H;
    e->tmp = e->ctx + rows * H;
    e->inter = e->tmp + rows * H;
    return QKV_OK;
}

static int grow_i64(int64_t **p, int64_t *cap, int64_t need) {
    if (need <= *cap) return 1;
    if ((uint64_t)need > SIZE_MAX / 16) return 0;
    int64_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    int64_t *q = qkv_alloc((size_t)c * sizeof *q);
    if (!q) return 0;
    if (*p) memcpy(q, *p, (size_t)*cap * sizeof *q);
    qkv_free(*p);
    *p = q;
    *cap = c;
    return 1;
}

/* ids and types with room for `need` tokens (contents kept). */
static int grow_ids(qkv_encoder *e, int64_t need) {
    if (need <= e->id_cap) return 1;
    if ((uint64_t)need > SIZE_MAX / 16) return 0;
    int64_t c = e->id_cap ? e->id_cap : 256;
    while (c < need) c *= 2;
    int32_t *a = qkv_alloc((size_t)c * sizeof *a), *b = qkv_alloc((size_t)c * sizeof *b);
    if (!a || !b) {
        qkv_free(a);
        qkv_free(b);
        return 0;
    }
    if (e->ids) {
        memcpy(a, e->ids, (size_t)e->id_cap * sizeof *a);
        memcpy(b, e->types, (size_t)e->id_cap * sizeof *b);
    }
    qkv_free(e->ids);
    qkv_free(e->types);
    e->ids = a;
    e->types = b;
    e->id_cap = c;
    return 1;
}

/* Texts tokenized together on the threads, each into a staging row of
 * max_length ids, then appended in order (the tokenizer is read-only:
 * 1.2-2.5% of a call on one thread). */
#define ENC_TOK_GROUP 128

typedef struct tok_job {
    const qkv_tokenizer *tok;
    const char *const *texts;
    const size_t *lens;
    int64_t s0, max;
    int32_t *ids, *types; /* staging: text s0 + i at i * max */
    int64_t *n;
    qkv_status *st;
} tok_job;

static size_t text_len(const char *const *texts, const size_t *lens, int64_t s) {
    return lens ? lens[s] : (texts[s] ? strlen(texts[s]) : 0);
}

static void tok_rows(void *ctx, int64_t i0, int64_t i1) {
    const tok_job *j = ctx;
    for (int64_t i = i0; i < i1; i++) {
        const int64_t s = j->s0 + i;
        const size_t len = text_len(j->texts, j->lens, s);
        j->st[i] = !j->texts[s] && len > 0
                       ? QKV_ERR_NULL_POINTER
                       : qkv_tokenizer_encode(j->tok, j->texts[s], len, NULL, 0, j->max, j->ids + i * j->max,
                                              j->types + i * j->max, j->max, &j->n[i], NULL, 0);
    }
}

/* Tokenize every text into e->ids / e->types, e->offsets [count + 1]; an
 * error names the first text that has one. */
static qkv_status tokenize_all(qkv_encoder *e, const char *const *texts, const size_t *lens, int64_t count,
                               char *why, size_t why_len) {
    if (!grow_i64(&e->offsets, &e->off_cap, count + 1)) return QKV_ERR_OUT_OF_MEMORY;
    const int64_t max = e->info.max_length, group = count < ENC_TOK_GROUP ? count : ENC_TOK_GROUP;
    int64_t total = 0;
    e->offsets[0] = 0;
    unsigned char *stage = NULL;
    tok_job j = {e->tok, texts, lens, 0, max, NULL, NULL, NULL, NULL};
    if (count > 1 && e->threads != 1) {
        const size_t ids = (size_t)(group * max) * sizeof(int32_t);
        stage = qkv_alloc(2 * ids + (size_t)group * (sizeof(int64_t) + sizeof(qkv_status)));
        if (!stage) return QKV_ERR_OUT_OF_MEMORY;
        j.ids = (int32_t *)(void *)stage;
        j.types = (int32_t *)(void *)(stage + ids);
        j.n = (int64_t *)(void *)(stage + 2 * ids);
        j.st = (qkv_status *)(void *)(stage + 2 * ids + (size_t)group * sizeof(int64_t));
    }
    qkv_status st = QKV_OK;
    for (int64_t s0 = 0; s0 < count && st == QKV_OK; s0 += group) {
        const int64_t g = count - s0 < group ? count - s0 : group;
        if (stage) {
            j.s0 = s0;
            qkv_par_range(e->threads, g, 4096, tok_rows, &j);
        }
        for (int64_t i = 0; i < g; i++) {
            const int64_t s = s0 + i;
            if (!grow_ids(e, total + max)) {
                st = QKV_ERR_OUT_OF_MEMORY;
                break;
            }
            if (stage && j.st[i] == QKV_OK) {
                memcpy(e->ids + total, j.ids + i * max, (size_t)j.n[i] * sizeof(int32_t));
                memcpy(e->types + total, j.types + i * max, (size_t)j.n[i] * sizeof(int32_t));
                total += j.n[i];
                e->offsets[s + 1] = total;
                continue;
            }
            /* serially (one text, one thread), or again for the message */
            const char *t = texts[s];
            size_t len = text_len(texts, lens, s);
            if (!t && len > 0) {
                st = qkv_fail(why, why_len, QKV_ERR_NULL_POINTER, "text %lld is NULL", (long long)s);
                break;
            }
            int64_t n;
            char sub[160];
            st = qkv_tokenizer_encode(e->tok, t, len, NULL, 0, max, e->ids + total, e->types + total, max, &n, sub,
                                      sizeof sub);
            if (st != QKV_OK) {
                st = qkv_fail(why, why_len, st, "text %lld: %s", (long long)s, sub);
                break;
            }
            total += n;
            e->offsets[s + 1] = total;
        }
    }
    qkv_free(stage);
    return st;
}

/* ---- row operations (in parallel over rows; each row as the serial loop) */

typedef struct row_job {
    const qkv_nn_kernels *k;
    float *x;
    const float *res, *g, *b;
    int64_t width;
    float eps;
    int act;
} row_job;

/* x = LayerNorm(x + res) row by row. */
static void ln_rows(void *ctx, int64_t r0, int64_t r1) {
    const row_job *j = ctx;
    for (int64_t r = r0; r < r1; r++)
        j->k->add_layernorm(j->x + r * j->width, j->res ? j->res + r * j->width : NULL, j->g, j->b,
                            (size_t)j->width, j->eps);
}

static void act_rows(void *ctx, int64_t r0, int64_t r1) {
    const row_job *j = ctx;
    j->k->bias_act(j->x + r0 * j->width, (size_t)j->width, (size_t)(r1 - r0), j->b, (size_t)j->width, j->act);
}

static void layer_norm(qkv_encoder *e, float *x, const float *res, const float *g, const float *b, int64_t rows) {
    row_job j = {qkv_nn_kernels_active(), x, res, g, b, e->info.hidden, (float)e->info.layer_norm_eps, 0};
    qkv_par_range(e->threads, rows, 8 * e->info.hidden, ln_rows, &j);
}

/* ---- the forward -------------------------------------------------------- */

static void attn_desc(const qkv_encoder *e, int64_t rows, const int64_t *offsets, int64_t count, qkv_attn_desc *d) {
    qkv_attn_desc_init(d);
    d->batch = 1;
    d->n_q = d->n_k = rows;
    d->heads = e->info.heads;
    d->dim = e->info.hidden / e->info.heads;
    d->threads = e->threads;
    if (offsets) {
        d->seq_offsets_q = d->seq_offsets_k = offsets;
        d->num_seqs = count;
    }
}

/* Embeddings of tokens [t0, t0 + rows) (sentences s0 .. s0 + count - 1
 * starting at t0) into e->x. */
static void embed(qkv_encoder *e, int64_t s0, int64_t count) {
    int64_t H = e->info.hidden, t0 = e->offsets[s0];
    for (int64_t s = s0; s < s0 + count; s++)
        for (int64_t t = e->offsets[s]; t < e->offsets[s + 1]; t++) {
            const float *w = e->word + (int64_t)e->ids[t] * H, *ty = e->type + (int64_t)e->types[t] * H;
            const float *p = e->pos + (t - e->offsets[s]) * H;
            float *x = e->x + (t - t0) * H;
            for (int64_t i = 0; i < H; i++) x[i] = (w[i] + ty[i]) + p[i];
        }
    layer_norm(e, e->x, NULL, e->emb_g, e->emb_b, e->offsets[s0 + count] - t0);
}

/* Projection `which` (ENC_W_*) of layer L: y [rows, out] = x [rows, in] W^T + b. */
static qkv_status project(const qkv_encoder *e, const enc_layer *L, int which, const float *x, int64_t rows,
                          float *y) {
    const int64_t H = e->info.hidden, I = e->info.intermediate;
    const int64_t out = which == ENC_W_I ? I : H, in = which == ENC_W_O2 ? I : H;
    const float *const w[ENC_W_COUNT] = {L->wq, L->wk, L->wv, L->wo, L->wi, L->wo2};
    const float *const b[ENC_W_COUNT] = {L->bq, L->bk, L->bv, L->bo, L->bi, L->bo2};
    if (e->info.precision == QKV_ENCODER_INT8)
        return qkv_i8_linear(x, rows, in, &L->i8[which], b[which], y, out, e->threads);
    if (e->info.precision == QKV_ENCODER_BF16)
        return qkv_gemm_bf16_packed(0, rows, 1.0f, x, in, &L->bf[which], 0.0f, y, out, b[which], e->threads);
    if (rows <= QKV_GEMM_FEW_ROWS) /* a short sentence: every weight read once, no packing */
        return qkv_gemm_few_rows(rows, out, in, x, in, w[which], in, b[which], y, out, e->threads);
    return nn_linear(x, rows, in, w[which], b[which], out, y, e->threads);
}

/* x = LayerNorm(x + y) on the rows of a projection's output y as the
 * product finishes them (nn_linear_act_then): y's rows still in cache.
 * When timing, each call's duration is summed (ns, any thread). */
typedef struct ln_step {
    row_job j;
    int timing;
    atomic_llong ns;
} ln_step;

static void ln_step_rows(void *ctx, float *y, int64_t ldy, int64_t i0, int64_t m) {
    ln_step *s = ctx;
    const row_job *j = &s->j;
    struct timespec t0, t1;
    if (s->timing) clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int64_t r = 0; r < m; r++)
        j->k->add_layernorm(j->x + (i0 + r) * j->width, y + r * ldy, j->g, j->b, (size_t)j->width, j->eps);
    if (s->timing) {
        clock_gettime(CLOCK_MONOTONIC, &t1);
        atomic_fetch_add(&s->ns, (long long)(t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec));
    }
}

/* y [rows, out] = x W^T + b for projection `which` (ENC_W_O or ENC_W_O2) of
 * layer L, then e->x = LayerNorm(e->x + y) with (g, b): inside the product
 * for the packed float32 and bf16 products, a pass after it otherwise.
 * The phase timer `ph` gets the product; ENC_PH_LN the LayerNorm (inside
 * the product: its thread time over the call's threads). */
static qkv_status project_ln(qkv_encoder *e, const enc_layer *L, int which, const float *x, int64_t rows, float *y,
                             const float *g, const float *b, int ph, double *t0) {
    const int64_t H = e->info.hidden, in = which == ENC_W_O2 ? e->info.intermediate : H;
    ln_step s = {{qkv_nn_kernels_active(), e->x, NULL, g, b, H, (float)e->info.layer_norm_eps, 0}, e->prof != NULL, 0};
    const nn_rows_step then = {ln_step_rows, &s};
    const float *bias = which == ENC_W_O2 ? L->bo2 : L->bo;
    qkv_status st;
    if (e->info.precision == QKV_ENCODER_FP32 && rows > QKV_GEMM_FEW_ROWS)
        st = nn_linear_act_then(x, rows, in, which == ENC_W_O2 ? L->wo2 : L->wo, bias, H, y, QKV_NN_ACT_NONE, &then,
                                e->threads);
    else if (e->info.precision == QKV_ENCODER_BF16)
        st = nn_linear_bf16_act_then(x, rows, &L->bf[which], bias, y, QKV_NN_ACT_NONE, &then, e->threads);
    else {
        if ((st = project(e, L, which, x, rows, y)) != QKV_OK) return st;
        phase_end(e, ph, t0);
        layer_norm(e, e->x, y, g, b, rows);
        phase_end(e, ENC_PH_LN, t0);
        return QKV_OK;
    }
    if (st != QKV_OK) return st;
    if (e->prof) {
        const double t = now_seconds(), ln = 1e-9 * (double)atomic_load(&s.ns) / qkv_threads_resolve(e->threads);
        e->prof[ph] += t - *t0 - ln;
        e->prof[ENC_PH_LN] += ln;
        *t0 = t;
    }
    return QKV_OK;
}

/* bf16 attention of the bf16 encoder: q, k, v rounded to bf16 into the
 * halves of buffers idle during attention (tmp: q, k; inter: v, the
 * output), the AVX512-BF16 forward on them, the output widened into ctx.
 * The roundings run over rows on the threads (elementwise: any split gives
 * the same bits). */
typedef struct {
    const float *src[3];
    uint16_t *dst[3];
    const uint16_t *wsrc;
    float *wdst;
    int64_t width;
} bf16_job;

static void bf16_round_rows(void *ctx, int64_t r0, int64_t r1) {
    const bf16_job *j = ctx;
    for (int t = 0; t < 3; t++)
        qkv_f32_to_bf16_array(j->dst[t] + r0 * j->width, j->src[t] + r0 * j->width, (size_t)((r1 - r0) * j->width));
}

static void bf16_widen_rows(void *ctx, int64_t r0, int64_t r1) {
    const bf16_job *j = ctx;
    qkv_bf16_to_f32_array(j->wdst + r0 * j->width, j->wsrc + r0 * j->width, (size_t)((r1 - r0) * j->width));
}

static qkv_status attend_bf16(qkv_encoder *e, const qkv_attn_desc *d32, int64_t rows) {
    const int64_t H = e->info.hidden;
    uint16_t *qh = (uint16_t *)(void *)e->tmp, *kh = qh + rows * H;
    uint16_t *vh = (uint16_t *)(void *)e->inter, *oh = vh + rows * H;
    bf16_job j = {{e->q, e->k, e->v}, {qh, kh, vh}, oh, e->ctx, H};
    qkv_par_range(e->threads, rows, 6 * H, bf16_round_rows, &j);
    qkv_attn_desc d = *d32;
    d.dtype = QKV_BF16;
    qkv_status s = qkv_attention_forward(&d, qh, kh, vh, oh, NULL, NULL);
    if (s == QKV_OK) qkv_par_range(e->threads, rows, 2 * H, bf16_widen_rows, &j);
    return s;
}

/* Run layers 0 .. stop - 1 on the embedded rows of e->x (packed sequences
 * at offsets, relative to the first row); with stop < layers, also leave
 * layer stop's queries and keys in e->q, e->k. */
static qkv_status forward(qkv_encoder *e, int64_t rows, const int64_t *offsets, int64_t count, int64_t stop) {
    const int64_t I = e->info.intermediate;
    const int th = e->threads;
    qkv_status s;
    qkv_attn_desc d;
    attn_desc(e, rows, offsets, count, &d);
    /* The bf16 attention core pays for rounding q, k and v and for its
     * panels per block; below ENC_BF16_ATTN_MIN_LEN tokens the float one is
     * faster (sentences of 6-37 tokens: 15% of a bf16 call against 6% of a
     * float32 one). On CPUs with AMX tiles (Intel's) vdpbf16ps runs at half
     * the float FMA's rate (bench_gemm's peak lines), so the float core is
     * faster at every length there (256 tokens: 44% of a bf16 call at 128
     * GFLOP/s); their products run on the tiles. */
    int64_t longest = offsets ? 0 : rows;
    for (int64_t i = 0; offsets && i < count; i++)
        if (offsets[i + 1] - offsets[i] > longest) longest = offsets[i + 1] - offsets[i];
    const int attn_bf16 = e->info.precision == QKV_ENCODER_BF16 && longest >= ENC_BF16_ATTN_MIN_LEN &&
                          qkv_half_fast_available() && !qkv_cpu_has_amx_bf16();
    for (int64_t l = 0; l <= stop && l < e->info.layers; l++) {
        const enc_layer *L = &e->layer[l];
        double t0 = phase_start(e);
        if (l == stop) { /* the attention drawn: its queries and keys */
            if ((s = project(e, L, ENC_W_Q, e->x, rows, e->q)) != QKV_OK) return s;
            return project(e, L, ENC_W_K, e->x, rows, e->k);
        }
        if (e->info.precision == QKV_ENCODER_FP32 && rows > QKV_GEMM_FEW_ROWS) {
            /* Q, K and V as one product: x packed once */
            const float *const w[3] = {L->wq, L->wk, L->wv}, *const b[3] = {L->bq, L->bk, L->bv};
            const int64_t out[3] = {e->info.hidden, e->info.hidden, e->info.hidden};
            float *const y[3] = {e->q, e->k, e->v};
            s = nn_linear_multi(e->x, rows, e->info.hidden, 3, w, b, out, y, th);
        } else if ((s = project(e, L, ENC_W_Q, e->x, rows, e->q)) == QKV_OK &&
                   (s = project(e, L, ENC_W_K, e->x, rows, e->k)) == QKV_OK) {
            s = project(e, L, ENC_W_V, e->x, rows, e->v);
        }
        if (s != QKV_OK) return s;
        phase_end(e, ENC_PH_QKV, &t0);
        s = attn_bf16 ? attend_bf16(e, &d, rows)
                : qkv_attention_forward(&d, e->q, e->k, e->v, e->ctx, NULL, NULL);
        if (s != QKV_OK) return s;
        phase_end(e, ENC_PH_ATTN, &t0);
        /* x = LN(x + attn) */
        if ((s = project_ln(e, L, ENC_W_O, e->ctx, rows, e->tmp, L->ln1_g, L->ln1_b, ENC_PH_OUT, &t0)) != QKV_OK)
            return s;
        /* The packed float32 and bf16 products apply bias + activation in
         * their epilogue, block by block while it is in cache; the few-rows
         * and int8 products add the bias, then one pass applies the
         * activation. */
        static const int ACT[] = {[ENC_ACT_GELU] = QKV_NN_ACT_GELU, [ENC_ACT_GELU_NEW] = QKV_NN_ACT_GELU_TANH,
                                  [ENC_ACT_RELU] = QKV_NN_ACT_RELU};
        const int act = ACT[e->info.hidden_act];
        if (e->info.precision == QKV_ENCODER_FP32 && rows > QKV_GEMM_FEW_ROWS) {
            s = nn_linear_act(e->x, rows, e->info.hidden, L->wi, L->bi, I, e->inter, act, th);
        } else if (e->info.precision == QKV_ENCODER_BF16) {
            s = nn_linear_bf16_act(e->x, rows, &L->bf[ENC_W_I], L->bi, e->inter, act, th);
        } else if ((s = project(e, L, ENC_W_I, e->x, rows, e->inter)) == QKV_OK) {
            row_job j = {qkv_nn_kernels_active(), e->inter, NULL, NULL, NULL, I, 0, act};
            qkv_par_range(th, rows, 4 * I, act_rows, &j);
        }
        if (s != QKV_OK) return s;
        /* x = LN(x + mlp) */
        if ((s = project_ln(e, L, ENC_W_O2, e->inter, rows, e->tmp, L->ln2_g, L->ln2_b, ENC_PH_MLP, &t0)) != QKV_OK)
            return s;
    }
    return QKV_OK;
}

/* Sentences [s0, s0 + count) through every layer; states in e->x. */
static qkv_status run_chunk(qkv_encoder *e, int64_t s0, int64_t count, int64_t *rel) {
    int64_t t0 = e->offsets[s0], rows = e->offsets[s0 + count] - t0;
    qkv_status s = ws_reserve(e, rows);
    if (s != QKV_OK) return s;
    for (int64_t i = 0; i <= count; i++) rel[i] = e->offsets[s0 + i] - t0;
    double t = phase_start(e);
    embed(e, s0, count);
    phase_end(e, ENC_PH_EMBED, &t);
    return forward(e, rows, rel, count, e->info.layers);
}

/* The end (exclusive) of the chunk of sentences starting at s0. */
static int64_t chunk_end(const qkv_encoder *e, int64_t s0, int64_t count) {
    int64_t s1 = s0 + 1;
    while (s1 < count && e->offsets[s1 + 1] - e->offsets[s0] <= ENC_CHUNK_TOKENS) s1++;
    return s1;
}

static qkv_status check_texts(const qkv_encoder *e, const char *const *texts, int64_t count, char *why,
                              size_t why_len) {
    if (why && why_len) why[0] = '\0';
    if (!e || !texts) return qkv_fail(why, why_len, QKV_ERR_NULL_POINTER, "NULL argument");
    if (count < 1) return qkv_fail(why, why_len, QKV_ERR_BAD_SIZE, "no texts (count %lld)", (long long)count);
    return QKV_OK;
}

qkv_status qkv_encoder_embed(qkv_encoder *e, const char *const *texts, const size_t *lens, int64_t count,
                             qkv_pooling pooling, int normalize, float *out, char *why, size_t why_len) {
    qkv_status s = check_texts(e, texts, count, why, why_len);
    if (s != QKV_OK) return s;
    if (!out) return qkv_fail(why, why_len, QKV_ERR_NULL_POINTER, "NULL output");
    if (pooling < QKV_POOLING_FROM_MODEL || pooling > QKV_POOLING_MAX || normalize < -1 || normalize > 1)
        return qkv_fail(why, why_len, QKV_ERR_BAD_ENUM, "pooling %d or normalize %d out of range", (int)pooling,
                        normalize);
    if (pooling == QKV_POOLING_FROM_MODEL) pooling = e->info.pooling;
    if (normalize < 0) normalize = e->info.normalize;
    double tp = phase_start(e);
    if ((s = tokenize_all(e, texts, lens, count, why, why_len)) != QKV_OK) return s;
    phase_end(e, ENC_PH_TOKENIZE, &tp);
    int64_t H = e->info.hidden, rel[ENC_CHUNK_TOKENS + 2];
    for (int64_t s0 = 0; s0 < count;) {
        int64_t s1 = chunk_end(e, s0, count);
        /* A chunk has at most ENC_CHUNK_TOKENS tokens, each sentence at least 2. */
        if ((s = run_chunk(e, s0, s1 - s0, rel)) != QKV_OK)
            return qkv_fail(why, why_len, s, "%s", qkv_status_string(s));
        tp = phase_start(e);
        for (int64_t i = s0; i < s1; i++) {
            const float *x = e->x + rel[i - s0] * H;
            int64_t n = rel[i - s0 + 1] - rel[i - s0];
            float *o = out + i * H;
            double norm = 0;
            for (int64_t c = 0; c < H; c++) {
                double a;
                if (pooling == QKV_POOLING_CLS) {
                    a = x[c];
                } else if (pooling == QKV_POOLING_MAX) {
                    a = x[c];
                    for (int64_t t = 1; t < n; t++) a = x[t * H + c] > a ? x[t * H + c] : a;
                } else {
                    a = 0;
                    for (int64_t t = 0; t < n; t++) a += x[t * H + c];
                    a /= (double)n;
                }
                o[c] = (float)a;
                norm += a * a;
            }
            if (normalize) {
                norm = sqrt(norm);
                if (norm < 1e-12) norm = 1e-12;
                for (int64_t c = 0; c < H; c++) o[c] = (float)(o[c] / norm);
            }
        }
        phase_end(e, ENC_PH_POOL, &tp);
        s0 = s1;
    }
    return QKV_OK;
}

qkv_status qkv_encoder_token_states(qkv_encoder *e, const char *const *texts, const size_t *lens, int64_t count,
                                    float *out, int64_t capacity, int64_t *offsets, int64_t *tokens, char *why,
                                    size_t why_len) {
    qkv_status s = check_texts(e, texts, count, why, why_len);
    if (s != QKV_OK) return s;
    if (!tokens || (!out && capacity > 0)) return qkv_fail(why, why_len, QKV_ERR_NULL_POINTER, "NULL argument");
    if (capacity < 0) return qkv_fail(why, why_len, QKV_ERR_BAD_SIZE, "capacity %lld < 0", (long long)capacity);
    if ((s = tokenize_all(e, texts, lens, count, why, why_len)) != QKV_OK) return s;
    *tokens = e->offsets[count];
    if (offsets) memcpy(offsets, e->offsets, (size_t)(count + 1) * sizeof *offsets);
    if (capacity < *tokens)
        return qkv_fail(why, why_len, QKV_ERR_BAD_SIZE, "capacity %lld rows, %lld tokens needed", (long long)capacity,
                        (long long)*tokens);
    int64_t H = e->info.hidden, rel[ENC_CHUNK_TOKENS + 2];
    for (int64_t s0 = 0; s0 < count;) {
        int64_t s1 = chunk_end(e, s0, count);
        if ((s = run_chunk(e, s0, s1 - s0, rel)) != QKV_OK)
            return qkv_fail(why, why_len, s, "%s", qkv_status_string(s));
        memcpy(out + e->offsets[s0] * H, e->x, (size_t)(rel[s1 - s0] * H) * sizeof(float));
        s0 = s1;
    }
    return QKV_OK;
}

qkv_status qkv_encoder_attention(qkv_encoder *e, const char *text, size_t len, int64_t layer, float *out,
                                 int64_t capacity, int64_t *n, char *why, size_t why_len) {
    const char *texts[1] = {text};
    qkv_status s = check_texts(e, texts, 1, why, why_len);
    if (s != QKV_OK) return s;
    if (!n || (!out && capacity > 0) || (!text && len > 0))
        return qkv_fail(why, why_len, QKV_ERR_NULL_POINTER, "NULL argument");
    if (layer < 0 || layer >= e->info.layers)
        return qkv_fail(why, why_len, QKV_ERR_BAD_SIZE, "layer %lld is not in 0 .. %lld", (long long)layer,
                        (long long)e->info.layers - 1);
    if (capacity < 0) return qkv_fail(why, why_len, QKV_ERR_BAD_SIZE, "capacity %lld < 0", (long long)capacity);
    size_t lens[1] = {len};
    if ((s = tokenize_all(e, texts, lens, 1, why, why_len)) != QKV_OK) return s;
    int64_t rows = e->offsets[1];
    *n = rows;
    if (capacity / rows / rows < e->info.heads)
        return qkv_fail(why, why_len, QKV_ERR_BAD_SIZE, "capacity %lld floats, %lld needed", (long long)capacity,
                        (long long)(e->info.heads * rows * rows));
    if ((s = ws_reserve(e, rows)) != QKV_OK) return qkv_fail(why, why_len, s, "%s", qkv_status_string(s));
    embed(e, 0, 1);
    if ((s = forward(e, rows, NULL, 1, layer)) != QKV_OK) return qkv_fail(why, why_len, s, "%s", qkv_status_string(s));
    qkv_attn_desc d;
    attn_desc(e, rows, NULL, 1, &d);
    s = qkv_attention_rows(&d, e->q, e->k, 0, rows, out);
    return s == QKV_OK ? s : qkv_fail(why, why_len, s, "%s", qkv_status_string(s));
}
