/* qkv experiment: the articles' common questions, answered by measurement.
 *
 *   qkv experiment scale|projections|diagonal|position|heads [--out DIR]
 *                  [--seed S] [--quick] [--threads N]
 *
 * Each experiment trains small models with qkv_model_* and qkv_adamw_* on
 * the generated tasks (qkv_task_*), prints a table and draws a PNG:
 *   scale        why divide q.k by sqrt(d): entropy of the attention rows, how
 *                many rows are saturated and the gradient that reaches the
 *                scores, against d, with and without the scale, for random
 *                q, k and for the q, k of briefly trained models;
 *   projections  why not q = k = v = x: the same tasks trained with learned
 *                W_q, W_k, W_v and with identity projections (frozen);
 *   diagonal     how often a token's largest attention is not on itself in
 *                a trained model (separate W_q, W_k), and with W_k := W_q;
 *   position     the position-dependent labelling task (the articles'
 *                part-of-speech example) without positions and with each kind;
 *   heads        one head against several at equal parameter count.
 * --quick shrinks every experiment to a few seconds (for the tests); the
 * numbers are then only a smoke test. Results are a function of --seed. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, mkdir */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "cli_util.h"
#include "core/rng.h"
#include "qkv.h"
#include "support/tasks.h"

#define CMD "experiment"

enum { OPT_HELP, OPT_OUT, OPT_SEED, OPT_QUICK, OPT_THREADS, OPT_COUNT };

static const cli_opt options[OPT_COUNT] = {
    {"--help", "-h", 0, OPT_HELP},      {"--out", "-o", 1, OPT_OUT}, {"--seed", NULL, 1, OPT_SEED},
    {"--quick", NULL, 0, OPT_QUICK},    {"--threads", NULL, 1, OPT_THREADS},
};

static void help(void) {
    fputs("Usage: qkv experiment scale|projections|diagonal|position|heads [--out DIR]\n"
          "                      [--seed S] [--quick] [--threads N]\n"
          "\n"
          "Answers one of the articles' common questions by measurement: trains small\n"
          "models on generated tasks (a minute or two), prints a table and draws\n"
          "DIR/experiment_<name>.png.\n"
          "\n"
          "  scale        why divide q.k by sqrt(d)? Attention entropy, saturated rows\n"
          "               and the gradient reaching the scores against d = 8 .. 512,\n"
          "               with and without 1/sqrt(d), on random and on trained q, k\n"
          "  projections  why not q = k = v = x? Tasks trained with learned W_q, W_k,\n"
          "               W_v and with identity projections, accuracy side by side\n"
          "  diagonal     is a token's attention to itself the largest? How often it\n"
          "               is not in a trained model, and with W_k replaced by W_q\n"
          "  position     the position-dependent labelling task without positional\n"
          "               encoding and with each kind, accuracy side by side\n"
          "  heads        one head against 2, 4, 8 at the same parameter count\n"
          "\n"
          "  -o, --out DIR  where the picture goes (default: the current folder)\n"
          "  --seed S       seed of data and initial weights (default 1)\n"
          "  --quick        a few seconds instead of minutes (a smoke test only)\n"
          "  --threads N    threads per computation (default 0: all cores)\n"
          "  -h, --help     show this help and exit\n"
          "\n"
          "Exit status: 0 success, 1 failure (nothing is left behind), 2 usage error.\n",
          stdout);
}

typedef struct ctx {
    const char *dir;
    uint64_t seed;
    int quick, threads;
} ctx;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int status_fail(const char *what, qkv_status s) {
    cli_error(CMD, NULL, NULL, "%s: %s", what, qkv_status_string(s));
    return -1;
}

/* ---- training and evaluation ------------------------------------------------ */

/* One task of the tool's own, beside the library's: PAIR, random symbols
 * x_0 .. x_{n-1} (0 <= x < S) in a decoder whose target at position i >= 2
 * is the ordered pair (x_{i-1}, x_{i-2}) as the token x_{i-1} S + x_{i-2}
 * (vocabulary S^2): two lookups at two other positions, and their order.
 * One head can attend sharply to one of them only (or average both and lose
 * their order); two heads can take one each. */
#define TASK_PAIR ((qkv_task)100)

static qkv_status task_shape(const qkv_task_spec *t, int64_t *V, int64_t *n, int *causal) {
    if (t->task != TASK_PAIR) return qkv_task_shape(t, V, n, causal);
    *V = t->symbols * t->symbols;
    *n = t->length;
    *causal = 1;
    return t->symbols >= 2 && t->length >= 3 ? QKV_OK : QKV_ERR_BAD_SIZE;
}

static qkv_status task_batch(const qkv_task_spec *t, uint64_t seed, int64_t index, int64_t batch, int32_t *tok,
                             int32_t *tgt) {
    if (t->task != TASK_PAIR) return qkv_task_batch(t, seed, index, batch, tok, tgt);
    const int64_t n = t->length, S = t->symbols;
    uint64_t z = seed * 0x100000001B3ull ^ ((uint64_t)index * 0x9E3779B97F4A7C15ull);
    for (int64_t b = 0; b < batch; b++)
        for (int64_t i = 0; i < n; i++) {
            tok[b * n + i] = (int32_t)(splitmix64_next(&z) % (uint64_t)S);
            tgt[b * n + i] = i < 2 ? -1 : (int32_t)(tok[b * n + i - 1] * S + tok[b * n + i - 2]);
        }
    return QKV_OK;
}

static const char *task_name(qkv_task t) { return t == TASK_PAIR ? "pair" : qkv_task_name(t); }

typedef struct run {
    qkv_model_config cfg;
    qkv_task_spec task;
    int64_t steps, batch, warmup;
    double lr;
    uint64_t seed;
    int identity_proj;   /* q = k = v = x: in_proj_weight = [I; I; I] and bias 0, frozen */
    double *losses;      /* [steps] or NULL */
} run;

static float *attn_segment(qkv_model *m, int64_t layer, int want_grad, int64_t *count) {
    char name[64];
    snprintf(name, sizeof name, "layers.%lld.attn.", (long long)layer);
    for (int64_t i = 0; i < qkv_model_segment_count(m); i++) {
        const char *nm;
        float *p, *g;
        if (qkv_model_segment(m, i, &nm, &p, &g, count) == QKV_OK && strcmp(nm, name) == 0) return want_grad ? g : p;
    }
    return NULL;
}

/* torch's layout: in_proj_weight [3E, E] then in_proj_bias [3E] at the start
 * of each layer's parameters. */
static void set_identity_proj(qkv_model *m) {
    const qkv_model_config *c = qkv_model_get_config(m);
    const int64_t E = c->dim;
    for (int64_t l = 0; l < c->layers; l++) {
        int64_t count;
        float *p = attn_segment(m, l, 0, &count);
        if (!p || count < 3 * E * E + 3 * E) continue;
        memset(p, 0, (size_t)(3 * E * E + 3 * E) * sizeof(float));
        for (int64_t b = 0; b < 3; b++)
            for (int64_t i = 0; i < E; i++) p[(b * E + i) * E + i] = 1.0f;
    }
}

static void zero_proj_grads(qkv_model *m) {
    const qkv_model_config *c = qkv_model_get_config(m);
    const int64_t E = c->dim;
    for (int64_t l = 0; l < c->layers; l++) {
        int64_t count;
        float *g = attn_segment(m, l, 1, &count);
        if (g && count >= 3 * E * E + 3 * E) memset(g, 0, (size_t)(3 * E * E + 3 * E) * sizeof(float));
    }
}

/* Train a new model; *out receives it. Returns 0, or -1 after a message. */
static int train(const run *r, qkv_model **out) {
    *out = NULL;
    int64_t V, n;
    int causal;
    qkv_status s = task_shape(&r->task, &V, &n, &causal);
    if (s != QKV_OK) return status_fail("task", s);
    qkv_model_config cfg = r->cfg;
    cfg.vocab = V;
    cfg.max_seq = n;
    cfg.causal = causal;
    qkv_model *m = NULL;
    qkv_adamw *opt = NULL;
    int32_t *tok = malloc((size_t)(r->batch * n) * sizeof *tok), *tgt = malloc((size_t)(r->batch * n) * sizeof *tgt);
    if (!tok || !tgt) {
        free(tok);
        free(tgt);
        cli_error(CMD, NULL, NULL, "out of memory");
        return -1;
    }
    if ((s = qkv_model_create(&cfg, r->seed, &m)) != QKV_OK ||
        (s = qkv_adamw_create(m, 0.9, 0.98, 1e-8, 0.01, &opt)) != QKV_OK) {
        free(tok);
        free(tgt);
        qkv_model_free(m);
        return status_fail("model", s);
    }
    if (r->identity_proj) set_identity_proj(m);
    for (int64_t step = 0; step < r->steps; step++) {
        double loss = 0, gn = 0;
        qkv_model_zero_grad(m);
        qkv_model_set_step(m, r->seed, step);
        if ((s = task_batch(&r->task, r->seed, step, r->batch, tok, tgt)) != QKV_OK ||
            (s = qkv_model_forward(m, r->batch, n, tok, tgt, 1, NULL, &loss)) != QKV_OK ||
            (s = qkv_model_backward(m)) != QKV_OK)
            break;
        if (r->identity_proj) zero_proj_grads(m);
        if ((s = qkv_adamw_step(opt, qkv_lr_schedule(step, r->warmup, r->steps, r->lr, r->lr * 0.1), 1.0, &gn)) !=
            QKV_OK)
            break;
        /* AdamW's decoupled weight decay would shrink the frozen identity: restore it. */
        if (r->identity_proj) set_identity_proj(m);
        if (r->losses) r->losses[step] = loss;
    }
    free(tok);
    free(tgt);
    qkv_adamw_free(opt);
    if (s != QKV_OK) {
        qkv_model_free(m);
        return status_fail("training", s);
    }
    *out = m;
    return 0;
}

typedef struct score {
    double token_acc, seq_acc, special_acc, loss;
    int64_t special; /* LABEL: targets whose label is not the word's own class (position-dependent) */
} score;

/* Accuracy on fresh examples (a seed the training never used). */
static int evaluate(qkv_model *m, const qkv_task_spec *task, uint64_t seed, int64_t batches, int64_t batch,
                    score *sc) {
    memset(sc, 0, sizeof *sc);
    int64_t V, n;
    int causal;
    qkv_status s = task_shape(task, &V, &n, &causal);
    if (s != QKV_OK) return status_fail("task", s);
    int32_t *tok = malloc((size_t)(batch * n) * sizeof *tok), *tgt = malloc((size_t)(batch * n) * sizeof *tgt);
    float *logits = malloc((size_t)(batch * n * V) * sizeof *logits);
    if (!tok || !tgt || !logits) {
        free(tok);
        free(tgt);
        free(logits);
        cli_error(CMD, NULL, NULL, "out of memory");
        return -1;
    }
    int64_t right = 0, total = 0, seq_right = 0, seqs = 0, sp_right = 0, sp = 0;
    double loss_sum = 0;
    for (int64_t bi = 0; bi < batches && s == QKV_OK; bi++) {
        double loss = 0;
        if ((s = task_batch(task, seed ^ 0x5EEDFACEull, bi, batch, tok, tgt)) != QKV_OK ||
            (s = qkv_model_forward(m, batch, n, tok, tgt, 0, logits, &loss)) != QKV_OK)
            break;
        loss_sum += loss;
        for (int64_t b = 0; b < batch; b++) {
            int all = 1;
            for (int64_t i = 0; i < n; i++) {
                int32_t y = tgt[b * n + i];
                if (y < 0) continue;
                const float *lg = logits + (b * n + i) * V;
                int64_t best = 0;
                for (int64_t v = 1; v < V; v++)
                    if (lg[v] > lg[best]) best = v;
                int ok = best == y;
                right += ok;
                total++;
                all &= ok;
                if (task->task == QKV_TASK_LABEL && y != tok[b * n + i] % 3) {
                    sp_right += ok;
                    sp++;
                }
            }
            seq_right += all;
            seqs++;
        }
    }
    free(tok);
    free(tgt);
    free(logits);
    if (s != QKV_OK) return status_fail("evaluation", s);
    sc->token_acc = total ? (double)right / (double)total : 0;
    sc->seq_acc = seqs ? (double)seq_right / (double)seqs : 0;
    sc->special_acc = sp ? (double)sp_right / (double)sp : 0;
    sc->special = sp;
    sc->loss = loss_sum / (double)batches;
    return 0;
}

/* ---- pictures: one per experiment, removed again if the run fails ------------ */

static int path_in(const ctx *c, const char *name, char *buf, size_t cap) {
    if (snprintf(buf, cap, "%s/%s", c->dir, name) >= (int)cap) {
        cli_error(CMD, "--out", c->dir, "path too long");
        return -1;
    }
    return 0;
}

static int report_write(const char *path, qkv_status s) {
    if (s == QKV_OK) {
        printf("wrote %s\n", path);
        return 0;
    }
    cli_error(CMD, "--out", path, "cannot write the picture: %s%s%s", qkv_status_string(s), errno ? ": " : "",
              errno ? strerror(errno) : "");
    return -1;
}

/* Mean of a series' last quarter (a smoothed final loss). */
static double tail_mean(const double *x, int64_t n) {
    int64_t from = n - n / 4 - 1;
    if (from < 0) from = 0;
    double s = 0;
    for (int64_t i = from; i < n; i++) s += x[i];
    return s / (double)(n - from);
}

static void default_model(qkv_model_config *cfg, const ctx *c) {
    qkv_model_config_init(cfg, 2, 2);
    cfg->threads = c->threads;
}

/* A run of the experiments: a model of E = dim, heads and layers trained
 * `steps` steps (batch 32, warm-up a tenth, learning rate lr, seed c->seed)
 * on task with length and symbols. */
static void init_run(run *r, const ctx *c, qkv_task task, int64_t length, int64_t symbols, int64_t dim,
                     int64_t heads, int64_t layers, int64_t steps, double lr) {
    memset(r, 0, sizeof *r);
    default_model(&r->cfg, c);
    r->cfg.dim = dim;
    r->cfg.heads = heads;
    r->cfg.layers = layers;
    r->task.task = task;
    r->task.length = length;
    r->task.symbols = symbols;
    r->steps = steps;
    r->batch = 32;
    r->warmup = steps / 10;
    r->lr = lr;
    r->seed = c->seed;
}

/* r->losses for r->steps, kept also in *keep (the caller frees it). 0, or -1
 * after printing why. */
static int keep_losses(run *r, double **keep) {
    *keep = r->losses = malloc((size_t)r->steps * sizeof(double));
    if (r->losses) return 0;
    cli_error(CMD, NULL, NULL, "out of memory");
    return -1;
}

/* Train r and score it on 16 batches of 64 fresh examples. 0 or -1. */
static int train_and_score(const run *r, const ctx *c, score *sc) {
    qkv_model *m;
    if (train(r, &m) != 0) return -1;
    int e = evaluate(m, &r->task, c->seed, 16, 64, sc);
    qkv_model_free(m);
    return e;
}

/* DIR/name: the training loss curves se[n] (log scale), when this qkv
 * draws. 0, or -1 after printing why. */
static int save_loss_plot(const ctx *c, const char *name, const char *title, const qkv_plot_series *se, int n) {
    char path[4096];
    if (!cli_can_draw(CMD)) return 0;
    if (path_in(c, name, path, sizeof path) != 0) return -1;
    qkv_plot p;
    qkv_plot_init(&p);
    p.title = title;
    p.x_label = "step";
    p.y_label = "loss";
    p.series = se;
    p.n_series = n;
    p.log_y = 1;
    errno = 0;
    return report_write(path, qkv_plot_save_png(path, &p));
}

/* ---- scale ------------------------------------------------------------------ */

/* Row statistics of an attention matrix: mean entropy (bits) over the rows
 * with at least two visible keys, the share of those rows whose largest
 * weight exceeds 0.99 (saturated), and the mean norm of the gradient that
 * reaches the row's logits, dS = P * (g - P.g), for g ~ N(0, 1). */
typedef struct rowstats {
    double entropy, saturated, grad;
    int64_t rows;
} rowstats;

static double normal(uint64_t *s) {
    double u1 = ((double)(splitmix64_next(s) >> 11) + 1.0) * 0x1.0p-53, u2 = (double)(splitmix64_next(s) >> 11) * 0x1.0p-53;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* P [rows, cols] row-stochastic (0 for masked keys); pw != 1 replaces each
 * row by P^pw normalised, which is softmax(pw * logits): the same scores
 * without (pw = sqrt(d)) the 1/sqrt(d) scale. */
static void add_rowstats(const float *P, int64_t rows, int64_t cols, double pw, uint64_t *rng, rowstats *st) {
    double *p = malloc((size_t)cols * sizeof *p);
    if (!p) return;
    for (int64_t i = 0; i < rows; i++) {
        int64_t visible = 0;
        double mx = -INFINITY;
        for (int64_t j = 0; j < cols; j++)
            if (P[i * cols + j] > 0) {
                visible++;
                double lp = pw * log((double)P[i * cols + j]);
                if (lp > mx) mx = lp;
            }
        if (visible < 2) continue;
        double z = 0;
        for (int64_t j = 0; j < cols; j++) {
            p[j] = P[i * cols + j] > 0 ? exp(pw * log((double)P[i * cols + j]) - mx) : 0.0;
            z += p[j];
        }
        double h = 0, top = 0, pg = 0, g2 = 0;
        for (int64_t j = 0; j < cols; j++) {
            p[j] /= z;
            if (p[j] > 0) h -= p[j] * log2(p[j]);
            if (p[j] > top) top = p[j];
        }
        /* dS = p (g - p.g) over the visible keys. */
        double *g = malloc((size_t)cols * sizeof *g);
        if (!g) break;
        for (int64_t j = 0; j < cols; j++) {
            g[j] = normal(rng);
            pg += p[j] * g[j];
        }
        for (int64_t j = 0; j < cols; j++) {
            double d = p[j] * (g[j] - pg);
            g2 += d * d;
        }
        free(g);
        st->entropy += h;
        st->saturated += top > 0.99;
        st->grad += sqrt(g2);
        st->rows++;
    }
    free(p);
}

static void finish_rowstats(rowstats *s) {
    if (s->rows == 0) return;
    s->entropy /= (double)s->rows;
    s->saturated /= (double)s->rows;
    s->grad /= (double)s->rows;
}

/* Softmax row statistics of random q, k with N(0, 1) entries at head
 * dimension d, with the scale (rs[0]) and without it (rs[1]). 0 or -1. */
static int scale_random(const ctx *c, int64_t d, int64_t n, uint64_t *rng, rowstats rs[2]) {
    float *q = malloc((size_t)(n * d) * sizeof *q), *k = malloc((size_t)(n * d) * sizeof *k),
          *v = malloc((size_t)(n * d) * sizeof *v), *o = malloc((size_t)(n * d) * sizeof *o),
          *P = malloc((size_t)(n * n) * sizeof *P);
    if (!q || !k || !v || !o || !P) {
        free(q), free(k), free(v), free(o), free(P);
        cli_error(CMD, NULL, NULL, "out of memory");
        return -1;
    }
    memset(rs, 0, 2 * sizeof *rs);
    for (int trial = 0; trial < 4; trial++) {
        for (int64_t j = 0; j < n * d; j++) {
            q[j] = (float)normal(rng);
            k[j] = (float)normal(rng);
            v[j] = (float)normal(rng);
        }
        for (int plain = 0; plain < 2; plain++) {
            qkv_attn_desc ad;
            cli_attn_desc_single(&ad, n, d);
            ad.score = plain ? QKV_SCORE_DOT : QKV_SCORE_SCALED_DOT;
            ad.threads = c->threads;
            qkv_status s = qkv_attention_forward(&ad, q, k, v, o, P, NULL);
            if (s != QKV_OK) {
                free(q), free(k), free(v), free(o), free(P);
                return status_fail("attention", s);
            }
            add_rowstats(P, n, n, 1.0, rng, &rs[plain]);
        }
    }
    free(q), free(k), free(v), free(o), free(P);
    return 0;
}

/* A one-layer, one-head decoder with E = d trained `steps` steps to copy 8
 * symbols: its softmax row statistics on fresh examples scored with the
 * scale (rs[0]) and without it (rs[1]), and its score. 0 or -1. */
static int scale_trained(const ctx *c, int64_t d, int64_t steps, uint64_t *rng, rowstats rs[2],
                         score *sc) {
    run r;
    init_run(&r, c, QKV_TASK_COPY, 8, 16, d, 1, 1, steps, d >= 128 ? 1e-3 : 3e-3);
    r.cfg.mlp_dim = 2 * d;
    r.seed = c->seed + (uint64_t)d;
    qkv_model *m;
    if (train(&r, &m) != 0) return -1;
    if (evaluate(m, &r.task, c->seed, 4, 64, sc) != 0) {
        qkv_model_free(m);
        return -1;
    }
    /* Attention of the model on a batch of fresh examples. */
    int64_t V, n2;
    int causal;
    task_shape(&r.task, &V, &n2, &causal);
    const int64_t B = 32;
    int32_t tok[32 * 18], tgt[32 * 18];
    qkv_status s = QKV_ERR_BAD_SIZE;
    if (n2 > 18 || (s = task_batch(&r.task, c->seed ^ 0xABCDull, 0, B, tok, tgt)) != QKV_OK ||
        (s = qkv_model_keep_attention(m, 1)) != QKV_OK ||
        (s = qkv_model_forward(m, B, n2, tok, NULL, 0, NULL, NULL)) != QKV_OK) {
        qkv_model_free(m);
        return status_fail("trained attention", n2 > 18 ? QKV_ERR_BAD_SIZE : s);
    }
    const float *A = qkv_model_attention(m, 0);
    memset(rs, 0, 2 * sizeof *rs);
    for (int plain = 0; plain < 2; plain++)
        add_rowstats(A, B * n2, n2, plain ? sqrt((double)d) : 1.0, rng, &rs[plain]);
    qkv_model_free(m);
    return 0;
}

/* The entropy and gradient plots of exp_scale. 0 or -1. */
static int scale_plots(const ctx *c, double *dd, double ent[4][7], double grad[4][7], int nd, int nt) {
    char path[4096], path2[4096];
    if (!cli_can_draw(CMD)) return 0;
    if (path_in(c, "experiment_scale.png", path, sizeof path) != 0 ||
        path_in(c, "experiment_scale_grad.png", path2, sizeof path2) != 0)
        return -1;
    qkv_plot_series se[4] = {{"random, 1/sqrt(d)", dd, ent[0], nd},
                             {"random, no scale", dd, ent[1], nd},
                             {"trained, 1/sqrt(d)", dd, ent[2], nt},
                             {"trained, no scale", dd, ent[3], nt}};
    qkv_plot p;
    qkv_plot_init(&p);
    p.title = "attention entropy against d";
    p.x_label = "d (head dimension)";
    p.y_label = "mean row entropy (bits)";
    p.series = se;
    p.n_series = 4;
    p.log_x = 1;
    p.markers = 1;
    errno = 0;
    if (report_write(path, qkv_plot_save_png(path, &p)) != 0) return -1;
    qkv_plot_series sg[4] = {{"random, 1/sqrt(d)", dd, grad[0], nd},
                             {"random, no scale", dd, grad[1], nd},
                             {"trained, 1/sqrt(d)", dd, grad[2], nt},
                             {"trained, no scale", dd, grad[3], nt}};
    p.series = sg;
    p.title = "gradient through the softmax against d";
    p.y_label = "mean |dL/dS| per row";
    p.log_y = 1;
    errno = 0;
    if (report_write(path2, qkv_plot_save_png(path2, &p)) != 0) {
        unlink(path);
        return -1;
    }
    return 0;
}

static int exp_scale(const ctx *c) {
    static const int64_t dims[] = {8, 16, 32, 64, 128, 256, 512};
    const int nd = c->quick ? 3 : 7, nt = c->quick ? 2 : 6; /* trained models up to d = 256 */
    const int64_t n = 64;
    double ent[4][7], grad[4][7], sat[4][7], dd[7];
    uint64_t rng = c->seed * 0x9E3779B97F4A7C15ull + 11;
    printf("Why divide q.k by sqrt(d)? Softmax rows over n = %lld keys: entropy (bits; uniform\n"
           "= %.0f), rows whose largest weight exceeds 0.99, and |dL/dS|, the gradient that\n"
           "reaches the scores S through the softmax for a random upstream gradient.\n\n",
           (long long)n, log2((double)n));
    printf("Random q, k with N(0, 1) entries (q.k has variance d):\n");
    printf("%6s | %9s %9s | %9s %9s | %9s %9s\n", "d", "H scaled", "H plain", "sat sc.", "sat plain", "|dS| sc.",
           "|dS| plain");
    for (int i = 0; i < nd; i++) {
        const int64_t d = dims[i];
        dd[i] = (double)d;
        rowstats rs[2];
        if (scale_random(c, d, n, &rng, rs) != 0) return -1;
        for (int p = 0; p < 2; p++) {
            finish_rowstats(&rs[p]);
            ent[p][i] = rs[p].entropy;
            sat[p][i] = rs[p].saturated;
            grad[p][i] = rs[p].grad;
        }
        printf("%6lld | %9.2f %9.2f | %8.0f%% %8.0f%% | %9.4f %9.4f\n", (long long)d, ent[0][i], ent[1][i],
               100 * sat[0][i], 100 * sat[1][i], grad[0][i], grad[1][i]);
        fflush(stdout);
    }

    const int64_t steps = c->quick ? 20 : 300;
    printf("\nTrained: one-layer, one-head decoders with E = d trained %lld steps (with the\n"
           "scale) to copy 8 symbols; the q, k of their layer on 32 fresh examples,\n"
           "scored with the scale and without it (softmax(sqrt(d) S)):\n",
           (long long)steps);
    printf("%6s | %9s %9s | %9s %9s | %9s %9s | %s\n", "d", "H scaled", "H plain", "sat sc.", "sat plain",
           "|dS| sc.", "|dS| plain", "copy acc.");
    for (int i = 0; i < nt; i++) {
        const int64_t d = dims[i];
        rowstats rs[2];
        score sc;
        if (scale_trained(c, d, steps, &rng, rs, &sc) != 0) return -1;
        for (int p = 0; p < 2; p++) {
            finish_rowstats(&rs[p]);
            ent[2 + p][i] = rs[p].entropy;
            sat[2 + p][i] = rs[p].saturated;
            grad[2 + p][i] = rs[p].grad;
        }
        printf("%6lld | %9.2f %9.2f | %8.0f%% %8.0f%% | %9.4f %9.4f | %.1f%%\n", (long long)d, ent[2][i], ent[3][i],
               100 * sat[2][i], 100 * sat[3][i], grad[2][i], grad[3][i], 100 * sc.token_acc);
        fflush(stdout);
    }
    printf("\nMeasured at d = %lld (random q, k): entropy %.2f bits with the scale, %.2f without;\n"
           "saturated rows %.0f%% vs %.0f%%; gradient reaching the scores %.4f vs %.4f.\n"
           "q.k has variance d: without 1/sqrt(d) the softmax puts ever more weight on one\n"
           "key as d grows and the gradient through it shrinks (the articles' answer); with\n"
           "it the rows stay equally soft at every d.\n",
           (long long)dims[nd - 1], ent[0][nd - 1], ent[1][nd - 1], 100 * sat[0][nd - 1], 100 * sat[1][nd - 1],
           grad[0][nd - 1], grad[1][nd - 1]);

    return scale_plots(c, dd, ent, grad, nd, nt);
}

/* ---- projections ------------------------------------------------------------- */

static int exp_projections(const ctx *c) {
    /* One layer: attention is the only way tokens meet. Two layers: the
     * first layer's output may build what the second needs. */
    static const struct {
        qkv_task task;
        int64_t layers, steps;
    } cfgs[5] = {{QKV_TASK_COPY, 1, 300},
                 {QKV_TASK_REVERSE, 1, 300},
                 {QKV_TASK_RECALL, 1, 300},
                 {QKV_TASK_COPY, 2, 600},
                 {QKV_TASK_REVERSE, 2, 600}};
    const int n_cfg = 5;
    double *loss[5][2], acc[5][2];
    int64_t steps_of[5];
    memset(loss, 0, sizeof loss);
    int rc = -1;
    printf("Why not q = k = v = x? Each task trained twice with a 4-head decoder (E = 64):\n"
           "once with learned W_q, W_k, W_v, once with identity projections\n"
           "(in_proj_weight = [I; I; I], bias 0, frozen: q = k = v = x in every head's\n"
           "slice); W_o, the MLP and the embeddings are learned in both. Copy and reverse\n"
           "8 symbols, recall 6 key-value pairs. Accuracy on 1024 fresh examples:\n\n");
    printf("%-8s %6s %5s | %-11s | %9s %9s %9s\n", "task", "layers", "steps", "projections", "token acc",
           "seq acc", "loss");
    for (int t = 0; t < n_cfg; t++) {
        const int64_t steps = c->quick ? 15 : cfgs[t].steps;
        steps_of[t] = steps;
        for (int id = 0; id < 2; id++) {
            run r;
            init_run(&r, c, cfgs[t].task, cfgs[t].task == QKV_TASK_RECALL ? 6 : 8, 16, 64, 4, cfgs[t].layers, steps,
                     3e-3);
            r.identity_proj = id;
            score sc;
            if (keep_losses(&r, &loss[t][id]) != 0 || train_and_score(&r, c, &sc) != 0) goto done;
            acc[t][id] = sc.token_acc;
            if (id == 0)
                printf("%-8s %6lld %5lld | %-11s | %8.1f%% %8.1f%% %9.3f\n", task_name(cfgs[t].task),
                       (long long)cfgs[t].layers, (long long)steps, "learned", 100 * sc.token_acc, 100 * sc.seq_acc,
                       sc.loss);
            else
                printf("%-8s %6s %5s | %-11s | %8.1f%% %8.1f%% %9.3f\n", "", "", "", "identity", 100 * sc.token_acc,
                       100 * sc.seq_acc, sc.loss);
            fflush(stdout);
        }
    }
    printf("\nMeasured, token accuracy learned - identity: one layer: copy %+.1f, reverse %+.1f,\n"
           "recall %+.1f points; two layers: copy %+.1f, reverse %+.1f points.\n"
           "With q = k = v = x the score x_i . x_j is symmetric and, for inputs of equal\n"
           "norm, largest at j = i: a single layer can hardly make a token look at another\n"
           "one (the next symbol to copy), and values stay in the space of the inputs.\n"
           "With a second layer the first one's output can reshape the inputs (their norms\n"
           "and directions) until even a symmetric score finds the right token; learned\n"
           "projections give every layer that freedom directly.\n",
           100 * (acc[0][0] - acc[0][1]), 100 * (acc[1][0] - acc[1][1]), 100 * (acc[2][0] - acc[2][1]),
           100 * (acc[3][0] - acc[3][1]), 100 * (acc[4][0] - acc[4][1]));
    {
        /* One-layer runs and the two-layer copy: 8 curves. */
        static const int shown[4] = {0, 1, 2, 3};
        char labels[8][48];
        qkv_plot_series se[8];
        for (int k = 0; k < 4; k++)
            for (int id = 0; id < 2; id++) {
                int t = shown[k], i = 2 * k + id;
                snprintf(labels[i], sizeof labels[i], "%s %lldL, %s", task_name(cfgs[t].task),
                         (long long)cfgs[t].layers, id ? "q=k=v=x" : "learned");
                se[i] = (qkv_plot_series){labels[i], NULL, loss[t][id], steps_of[t]};
            }
        if (save_loss_plot(c, "experiment_projections.png", "training loss: learned vs identity projections", se, 8) !=
            0)
            goto done;
    }
    rc = 0;
done:
    for (int t = 0; t < n_cfg; t++)
        for (int id = 0; id < 2; id++) free(loss[t][id]);
    return rc;
}

/* ---- diagonal ---------------------------------------------------------------- */

/* Share of the rows (with >= 2 visible keys) whose largest weight is not on
 * the query's own position, and the mean weight on it; *chance: that share
 * if the largest weight fell on a random visible key (1 - 1/visible). */
static void diag_stats(const float *A, int64_t B, int64_t n, double *not_self, double *self_w, double *chance) {
    int64_t rows = 0, off = 0;
    double w = 0, ch = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < n; i++) {
            const float *row = A + (b * n + i) * n;
            int64_t vis = 0, best = 0;
            for (int64_t j = 0; j < n; j++) {
                vis += row[j] > 0;
                if (row[j] > row[best]) best = j;
            }
            if (vis < 2) continue;
            rows++;
            off += best != i;
            w += row[i];
            ch += 1.0 - 1.0 / (double)vis;
        }
    *chance = rows ? ch / (double)rows : 0;
    *not_self = rows ? (double)off / (double)rows : 0;
    *self_w = rows ? w / (double)rows : 0;
}

static int exp_diagonal(const ctx *c) {
    const int64_t steps = c->quick ? 15 : 500, L = 2, H = 4, E = 64;
    printf("Is a token's attention to itself the largest? A 2-layer, 4-head encoder\n"
           "(E = 64) trained %lld steps on the labelling task, and a decoder trained on\n"
           "reverse; on 64 fresh examples, per layer and head: the share of rows whose\n"
           "largest weight is NOT on the token itself, and the mean weight on itself;\n"
           "then the same model with W_k replaced by W_q (a symmetric score q_i . q_j).\n\n",
           (long long)steps);
    printf("%-8s %5s %4s | %12s %9s | %12s %9s\n", "model", "layer", "head", "not itself", "A'[i,i]",
           "W_k := W_q", "A'[i,i]");
    static const qkv_task tasks[2] = {QKV_TASK_LABEL, QKV_TASK_REVERSE};
    float *pic = NULL;
    int64_t pic_n = 0;
    double total_off = 0, total_sym = 0, chance_sum = 0;
    int cells = 0;
    for (int t = 0; t < 2; t++) {
        run r;
        init_run(&r, c, tasks[t], tasks[t] == QKV_TASK_LABEL ? 16 : 8, 16, E, H, L, steps, 3e-3);
        qkv_model *m;
        if (train(&r, &m) != 0) {
            free(pic);
            return -1;
        }
        int64_t V, n;
        int causal;
        task_shape(&r.task, &V, &n, &causal);
        const int64_t B = 64;
        int32_t *tok = malloc((size_t)(B * n) * sizeof *tok), *tgt = malloc((size_t)(B * n) * sizeof *tgt);
        float *keep = malloc((size_t)(B * n * n) * sizeof *keep);
        qkv_status s = !tok || !tgt || !keep ? QKV_ERR_OUT_OF_MEMORY : QKV_OK;
        if (s == QKV_OK) s = task_batch(&r.task, c->seed ^ 0xD1A6ull, 0, B, tok, tgt);
        if (s == QKV_OK) s = qkv_model_keep_attention(m, 1);
        double off[2][8][8], w[2][8][8], chance = 0;
        for (int sym = 0; sym < 2 && s == QKV_OK; sym++) {
            if (sym) {
                /* W_k := W_q and b_k := b_q in every layer. */
                for (int64_t l = 0; l < L; l++) {
                    int64_t count;
                    float *p = attn_segment(m, l, 0, &count);
                    if (!p) continue;
                    memcpy(p + E * E, p, (size_t)(E * E) * sizeof(float));
                    memcpy(p + 3 * E * E + E, p + 3 * E * E, (size_t)E * sizeof(float));
                }
            }
            if ((s = qkv_model_forward(m, B, n, tok, NULL, 0, NULL, NULL)) != QKV_OK) break;
            for (int64_t l = 0; l < L; l++) {
                const float *A = qkv_model_attention(m, l); /* [B, H, n, n] */
                for (int64_t h = 0; h < H; h++) {
                    /* Head h over the batch: [B, n, n]. */
                    for (int64_t b = 0; b < B; b++)
                        memcpy(keep + b * n * n, A + (b * H + h) * n * n, (size_t)(n * n) * sizeof(float));
                    diag_stats(keep, B, n, &off[sym][l][h], &w[sym][l][h], &chance);
                    /* The picture: every head of the encoder on the first example. */
                    if (t == 0 && !sym) {
                        if (!pic) {
                            pic_n = n;
                            pic = malloc((size_t)(L * H * n * n) * sizeof *pic);
                        }
                        if (pic) memcpy(pic + (l * H + h) * n * n, A + h * n * n, (size_t)(n * n) * sizeof(float));
                    }
                }
            }
        }
        if (s == QKV_OK) {
            printf("%-8s (a random choice among the visible keys would miss itself in %.1f%% of the rows)\n",
                   task_name(tasks[t]), 100 * chance);
            chance_sum += chance;
        }
        if (s == QKV_OK)
            for (int64_t l = 0; l < L; l++)
                for (int64_t h = 0; h < H; h++) {
                    printf("%-8s %5lld %4lld | %11.1f%% %9.3f | %11.1f%% %9.3f\n",
                           "", (long long)l, (long long)h,
                           100 * off[0][l][h], w[0][l][h], 100 * off[1][l][h], w[1][l][h]);
                    total_off += off[0][l][h];
                    total_sym += off[1][l][h];
                    cells++;
                }
        free(tok);
        free(tgt);
        free(keep);
        qkv_model_free(m);
        if (s != QKV_OK) {
            free(pic);
            return status_fail("diagonal", s);
        }
    }
    printf("\nMeasured: with separate W_q and W_k, %.0f%% of the rows (mean over heads) put\n"
           "their largest weight on another token than themselves (chance: %.0f%%); with\n"
           "W_k := W_q, a symmetric score q_i . q_j, %.0f%%. The articles' point: a separate\n"
           "key projection makes the score asymmetric, so a token need not attend most\n"
           "to itself.\n",
           100 * total_off / cells, 100 * chance_sum / 2, 100 * total_sym / cells);
    char path[4096], titles[16][48];
    const char *tp[16];
    if (pic && !cli_can_draw(CMD)) {
        free(pic);
        return 0;
    }
    if (!pic || path_in(c, "experiment_diagonal.png", path, sizeof path) != 0) {
        free(pic);
        if (!pic) cli_error(CMD, NULL, NULL, "out of memory");
        return -1;
    }
    for (int64_t i = 0; i < L * H; i++) {
        snprintf(titles[i], sizeof titles[i], "layer %lld head %lld", (long long)(i / H), (long long)(i % H));
        tp[i] = titles[i];
    }
    qkv_heatmap hm;
    qkv_heatmap_init(&hm, pic, pic_n, pic_n);
    hm.panels = L * H;
    hm.panel_titles = tp;
    hm.vmin = 0;
    hm.vmax = 1;
    hm.cell = 12;
    hm.title = "label task encoder: A' of every head on one example (row = query)";
    errno = 0;
    qkv_status s = qkv_heatmap_save_png(path, &hm);
    free(pic);
    return report_write(path, s);
}

/* ---- position ---------------------------------------------------------------- */

static int exp_position(const ctx *c) {
    static const qkv_posenc kinds[7] = {QKV_POSENC_NONE,  QKV_POSENC_SINUSOIDAL, QKV_POSENC_LEARNED,
                                        QKV_POSENC_ROPE,  QKV_POSENC_ALIBI,      QKV_POSENC_RELATIVE,
                                        QKV_POSENC_FLOATER};
    static const char *const names[7] = {"none", "sinusoidal", "learned", "rope", "alibi", "relative", "floater"};
    const int64_t steps = c->quick ? 15 : 500;
    double *loss[7] = {0}, dep[7] = {0};
    int rc = -1;
    printf("Does attention need positions? The labelling task (the articles' part-of-\n"
           "speech example: a word's class is its own, except that a verb in the first\n"
           "two positions is a noun, and a noun right after such a verb is an object)\n"
           "trained %lld steps with a 2-layer, 4-head encoder (E = 64, 16 words) without\n"
           "positional encoding and with each kind. Accuracy on 1024 fresh sentences,\n"
           "overall and on the tokens whose label depends on position or order:\n\n",
           (long long)steps);
    printf("%-11s | %9s %12s %9s %9s\n", "positions", "token acc", "position-dep", "seq acc", "loss");
    for (int i = 0; i < 7; i++) {
        run r;
        init_run(&r, c, QKV_TASK_LABEL, 16, 16, 64, 4, 2, steps, 3e-3);
        r.cfg.pos = kinds[i];
        score sc;
        if (keep_losses(&r, &loss[i]) != 0 || train_and_score(&r, c, &sc) != 0) goto done;
        dep[i] = sc.special_acc;
        printf("%-11s | %8.1f%% %11.1f%% %8.1f%% %9.3f\n", names[i], 100 * sc.token_acc, 100 * sc.special_acc,
               100 * sc.seq_acc, sc.loss);
        fflush(stdout);
    }
    {
        int lo = 1, hi = 1;
        for (int i = 1; i < 7; i++) {
            if (dep[i] < dep[lo]) lo = i;
            if (dep[i] > dep[hi]) hi = i;
        }
        printf("\nMeasured, position-dependent labels: %.1f%% without positions, %.1f%% (%s) to\n"
               "%.1f%% (%s) with them. Without positions self-attention sees a set, not a\n"
               "sequence (\"all vectors are equally far apart\"): it cannot tell the first word\n"
               "from the fifth, nor which word came just before.\n",
               100 * dep[0], 100 * dep[lo], names[lo], 100 * dep[hi], names[hi]);
    }
    {
        qkv_plot_series se[7];
        for (int i = 0; i < 7; i++) se[i] = (qkv_plot_series){names[i], NULL, loss[i], steps};
        if (save_loss_plot(c, "experiment_position.png", "labelling task: training loss by positional encoding", se,
                           7) != 0)
            goto done;
    }
    rc = 0;
done:
    for (int i = 0; i < 7; i++) free(loss[i]);
    return rc;
}

/* ---- heads ------------------------------------------------------------------- */

static int exp_heads(const ctx *c) {
    static const int64_t heads[4] = {1, 2, 4, 8};
    const int64_t steps = c->quick ? 15 : 600;
    double *loss[4] = {0}, acc[4] = {0};
    char focus[4][160] = {{0}};
    int rc = -1;
    printf("One head or several? A task with two lookups: 16 random symbols of 8, and at\n"
           "each position the target is the ordered pair (x_{i-1}, x_{i-2}) (one of 64\n"
           "tokens): the previous two tokens and their order. One-layer decoders, E = 64,\n"
           "trained %lld steps"
           " with H = 1, 2, 4, 8 heads of d = E/H: every model has the same\n"
           "parameters"
            " (W_q, W_k, W_v, W_o are E x E whatever H). Accuracy on 1024 fresh\n"
           "examples:\n\n",
           (long long)steps);
    printf("%5s %5s | %10s | %9s %9s %9s | %8s\n", "heads", "d", "parameters", "token acc", "seq acc", "loss",
           "time");
    for (int i = 0; i < 4; i++) {
        run r;
        init_run(&r, c, TASK_PAIR, 16, 8, 64, heads[i], 1, steps, 3e-3);
        if (keep_losses(&r, &loss[i]) != 0) goto done;
        double t0 = now_s();
        qkv_model *m;
        if (train(&r, &m) != 0) goto done;
        double dt = now_s() - t0;
        score sc;
        int64_t params = qkv_model_param_count(m);
        int e = evaluate(m, &r.task, c->seed, 16, 64, &sc);
        /* Where each head looks: its mean weight on the tokens i-1 and i-2. */
        if (e == 0) {
            enum { B = 32, NT = 16 };
            int32_t tok[B * NT], tgt[B * NT];
            qkv_status s2 = task_batch(&r.task, c->seed ^ 0x4EADull, 0, B, tok, tgt);
            if (s2 == QKV_OK) s2 = qkv_model_keep_attention(m, 1);
            if (s2 == QKV_OK) s2 = qkv_model_forward(m, B, NT, tok, NULL, 0, NULL, NULL);
            const float *A = s2 == QKV_OK ? qkv_model_attention(m, 0) : NULL;
            if (!A) {
                e = status_fail("attention", s2 != QKV_OK ? s2 : QKV_ERR_UNSUPPORTED);
            } else {
                int len = 0;
                for (int64_t h = 0; h < heads[i]; h++) {
                    double w1 = 0, w2 = 0;
                    for (int64_t b = 0; b < B; b++)
                        for (int64_t q = 2; q < NT; q++) {
                            const float *row = A + ((b * heads[i] + h) * NT + q) * NT;
                            w1 += row[q - 1];
                            w2 += row[q - 2];
                        }
                    len += snprintf(focus[i] + len, sizeof focus[i] - (size_t)len, " %.2f/%.2f",
                                    w1 / (B * (NT - 2)), w2 / (B * (NT - 2)));
                }
            }
        }
        qkv_model_free(m);
        if (e != 0) goto done;
        acc[i] = sc.token_acc;
        printf("%5lld %5lld | %10lld | %8.1f%% %8.1f%% %9.3f | %7.1fs\n", (long long)heads[i], (long long)(64 / heads[i]),
               (long long)params, 100 * sc.token_acc, 100 * sc.seq_acc, sc.loss, dt);
        fflush(stdout);
    }
    printf("\nMeasured, token accuracy: ");
    for (int i = 0; i < 4; i++) printf("%sH=%lld %.1f%%", i ? ", " : "", (long long)heads[i], 100 * acc[i]);
    printf(";\nfinal training loss (mean of the last quarter): ");
    for (int i = 0; i < 4; i++) printf("%sH=%lld %.3f", i ? ", " : "", (long long)heads[i], tail_mean(loss[i], steps));
    printf(".\nWhere the heads look, mean weight on token i-1 / on token i-2, head by head:\n");
    for (int i = 0; i < 4; i++) printf("  H=%lld:%s\n", (long long)heads[i], focus[i]);
    printf("The same parameters split into several heads give several attention patterns\n"
           "per layer (the articles: each q looks for a different kind of relation, at\n"
           "the price of a smaller d per head); a single head must spread one pattern\n"
           "over everything it needs.\n");
    {
        char labels[4][16];
        qkv_plot_series se[4];
        for (int i = 0; i < 4; i++) {
            snprintf(labels[i], sizeof labels[i], "H = %lld", (long long)heads[i]);
            se[i] = (qkv_plot_series){labels[i], NULL, loss[i], steps};
        }
        if (save_loss_plot(c, "experiment_heads.png", "two lookups: loss by number of heads", se, 4) != 0) goto done;
    }
    rc = 0;
done:
    for (int i = 0; i < 4; i++) free(loss[i]);
    return rc;
}

/* ---- the command ------------------------------------------------------------- */

typedef struct experiment {
    const char *name;
    int (*run)(const ctx *c);
} experiment;

static const experiment experiments[] = {
    {"scale", exp_scale},       {"projections", exp_projections}, {"diagonal", exp_diagonal},
    {"position", exp_position}, {"heads", exp_heads},
};
#define N_EXPERIMENTS (sizeof experiments / sizeof experiments[0])

int cli_cmd_experiment(int argc, char **argv) {
    ctx c = {".", 1, 0, 0};
    const char *which = NULL;
    int64_t v64;
    /* The experiment's name may come anywhere; the rest are options. */
    char **av = malloc((size_t)(argc + 1) * sizeof *av);
    if (!av) {
        cli_error(CMD, NULL, NULL, "out of memory");
        return CLI_EXIT_FAIL;
    }
    int ac = 0;
    av[ac++] = argv[0];
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] != '-' && !which && (i == 1 || argv[i - 1][0] != '-' || strchr(argv[i - 1], '=') ||
                                             strcmp(argv[i - 1], "--quick") == 0)) {
            which = argv[i];
            continue;
        }
        av[ac++] = argv[i];
    }
    av[ac] = NULL;
    cli_args a = {CMD, ac, av, 1, options, OPT_COUNT, OPT_HELP, help, NULL, 0};
    const char *name, *value;
    for (int id; (id = cli_scan(&a, &name, &value)) != CLI_END;) {
        if (id == CLI_STOP) {
            free(av);
            return a.status;
        }
        switch (id) {
        case OPT_OUT: c.dir = value; break;
        case OPT_QUICK: c.quick = 1; break;
        case OPT_SEED:
            if (cli_parse_int64(CMD, "--seed", value, 0, INT64_MAX, &v64) != 0) {
                free(av);
                cli_usage_hint(CMD);
                return CLI_EXIT_USAGE;
            }
            c.seed = (uint64_t)v64;
            break;
        case OPT_THREADS:
            if (cli_parse_int64(CMD, "--threads", value, 0, 1024, &v64) != 0) {
                free(av);
                cli_usage_hint(CMD);
                return CLI_EXIT_USAGE;
            }
            c.threads = (int)v64;
            break;
        default: break;
        }
    }
    free(av);
    const experiment *e = NULL;
    for (size_t i = 0; i < N_EXPERIMENTS && which; i++)
        if (strcmp(which, experiments[i].name) == 0) e = &experiments[i];
    if (!e) {
        if (which)
            cli_error(CMD, NULL, NULL, "unknown experiment '%s' (scale, projections, diagonal, position, heads)",
                      which);
        else
            cli_error(CMD, NULL, NULL, "which experiment? (scale, projections, diagonal, position, heads)");
        cli_usage_hint(CMD);
        return CLI_EXIT_USAGE;
    }
    if (!c.dir[0]) {
        cli_error(CMD, "--out", NULL, "empty folder name");
        cli_usage_hint(CMD);
        return CLI_EXIT_USAGE;
    }
    if (cli_make_out_dir(CMD, c.dir) != 0) return CLI_EXIT_FAIL;
    double t0 = now_s();
    printf("qkv experiment %s (seed %llu%s)\n\n", e->name, (unsigned long long)c.seed, c.quick ? ", quick" : "");
    int r = e->run(&c);
    printf("(%.1f s)\n", now_s() - t0);
    fflush(stdout);
    return r == 0 ? CLI_EXIT_OK : CLI_EXIT_FAIL;
}
