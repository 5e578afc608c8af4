/* qkv train: train a transformer on a generated task (or a text file) and
 * keep its checkpoints, loss log and progress; qkv eval: accuracy of a
 * checkpoint on fresh examples.
 *
 * Reproducibility: batch s is qkv_task_batch(seed, s) and the dropout masks
 * are a function of (seed, s), so a run resumed from a checkpoint continues
 * with exactly the numbers an uninterrupted run would have produced.
 * Checkpoints are written to a temporary file and renamed (by
 * qkv_safetensors_save), so a crash or kill never leaves a broken one. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, isatty, mkdir */
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
#include "qkv.h"
#include "train_common.h"

#define CMD "train"
#define PARSE_CONTINUE (-1)

enum {
    OPT_HELP, OPT_TASK, OPT_TEXT, OPT_LAYERS, OPT_DIM, OPT_HEADS, OPT_SEQ, OPT_SYMBOLS, OPT_BATCH, OPT_STEPS,
    OPT_LR, OPT_WARMUP, OPT_POS, OPT_SEED, OPT_DROPOUT, OPT_OUT, OPT_RESUME, OPT_THREADS, OPT_CKPT_EVERY,
    OPT_QUIET, OPT_PRECISION, OPT_COUNT
};

static const cli_opt options[OPT_COUNT] = {
    {"--help", "-h", 0, OPT_HELP},        {"--task", NULL, 1, OPT_TASK},         {"--text", NULL, 1, OPT_TEXT},
    {"--layers", NULL, 1, OPT_LAYERS},    {"--dim", NULL, 1, OPT_DIM},           {"--heads", NULL, 1, OPT_HEADS},
    {"--seq", NULL, 1, OPT_SEQ},          {"--symbols", NULL, 1, OPT_SYMBOLS},   {"--batch", NULL, 1, OPT_BATCH},
    {"--steps", NULL, 1, OPT_STEPS},      {"--lr", NULL, 1, OPT_LR},             {"--warmup", NULL, 1, OPT_WARMUP},
    {"--pos", NULL, 1, OPT_POS},          {"--seed", NULL, 1, OPT_SEED},         {"--dropout", NULL, 1, OPT_DROPOUT},
    {"--out", "-o", 1, OPT_OUT},          {"--resume", NULL, 1, OPT_RESUME},     {"--threads", NULL, 1, OPT_THREADS},
    {"--ckpt-every", NULL, 1, OPT_CKPT_EVERY}, {"--quiet", "-q", 0, OPT_QUIET},
    {"--precision", NULL, 1, OPT_PRECISION},
};

/* The index of val in names[n], or -1. */
static int name_index(const char *val, const char *const *names, int n) {
    for (int i = 0; i < n; i++)
        if (!strcmp(val, names[i])) return i;
    return -1;
}

static const char *const POS_NAMES[] = {"none", "sinusoidal", "learned", "rope", "alibi", "relative", "floater"};

static void help(void) {
    fputs("Usage: qkv train --task copy|reverse|sort|recall|label [--seq N] --out DIR [options]\n"
          "       qkv train --task text|mlm FILE --out DIR [options]\n"
          "       qkv train --resume DIR [--threads N]\n"
          "\n"
          "Trains a transformer (pre-LayerNorm, decoder for copy/reverse/sort/recall/text,\n"
          "encoder for label/mlm) with AdamW, warm-up + cosine learning rate and gradient\n"
          "clipping. Writes to DIR: model.safetensors (the checkpoint: weights, optimiser\n"
          "state, configuration), loss.csv (step, loss, lr, grad_norm, tokens_per_s),\n"
          "loss.png (the loss curve).\n"
          "\n"
          "Task:\n"
          "  --task NAME [FILE]  copy, reverse, sort: L symbols, a separator, the answer;\n"
          "                      recall: L key-value pairs then every key again, answer\n"
          "                      each one's value (trained from 4 pairs up: a curriculum);\n"
          "                      label: word classes that depend on position (encoder);\n"
          "                      text FILE: next-byte prediction; mlm FILE: masked bytes\n"
          "  --text FILE         the corpus (same as the FILE after --task text|mlm)\n"
          "  --seq L             L of the task (default 16; text: the window, default 64)\n"
          "  --symbols S         alphabet size of the content (default 16)\n"
          "Model:\n"
          "  --layers L (2)  --dim E (128)  --heads H (4)\n"
          "  --pos none|sinusoidal|learned|rope|alibi|relative|floater (sinusoidal)\n"
          "  --dropout P (0)\n"
          "Training:\n"
          "  --batch B (32)  --steps S (2000)  --lr LR (1e-3)  --warmup W (100)\n"
          "  --seed S (1)    --threads N (0: all cores)  --ckpt-every K (250)\n"
          "  --precision fp32|bf16|fp16 (fp32)  mixed precision: the attention core\n"
          "                  on bf16 / fp16 copies of q, k, v (and dout), weights and\n"
          "                  optimiser in fp32; bf16 also multiplies the projections\n"
          "                  and the MLP in bf16 (fp32 sums); fp16 adds loss scaling\n"
          "  --resume DIR    continue a run from its checkpoint, exactly\n"
          "  --quiet         no progress bar\n",
          stdout);
}

/* ---- evaluation (also used by qkv eval) ----------------------------------- */

/* Accuracy on `examples` fresh examples (a seed the training never uses):
 * exact-sequence accuracy (every targeted position right, by argmax under
 * teacher forcing, which for these tasks equals greedy generation), token
 * accuracy and mean loss. */
static qkv_status evaluate(qkv_model *m, const train_run *r, int64_t examples, uint64_t seed, double *seq_acc,
                           double *tok_acc, double *loss) {
    int64_t V, N;
    int causal;
    qkv_status s = qkv_task_shape(&r->task, &V, &N, &causal);
    if (s != QKV_OK) return s;
    const int64_t B = 32;
    int32_t *tok = malloc((size_t)(B * N) * sizeof(int32_t)), *tgt = malloc((size_t)(B * N) * sizeof(int32_t));
    float *logits = malloc((size_t)(B * N * V) * sizeof(float));
    if (!tok || !tgt || !logits) {
        free(tok);
        free(tgt);
        free(logits);
        return QKV_ERR_OUT_OF_MEMORY;
    }
    int64_t seqs = 0, seq_ok = 0, toks = 0, tok_ok = 0, batches = 0;
    double total = 0;
    for (int64_t idx = 0; seqs < examples; idx++) {
        if ((s = qkv_task_batch(&r->task, seed, idx, B, tok, tgt)) != QKV_OK) break;
        double l = 0;
        if ((s = qkv_model_forward(m, B, N, tok, tgt, 0, logits, &l)) != QKV_OK) break;
        total += l;
        batches++;
        for (int64_t b = 0; b < B && seqs < examples; b++, seqs++) {
            int all = 1;
            for (int64_t i = 0; i < N; i++) {
                int32_t want = tgt[b * N + i];
                if (want < 0) continue;
                const float *z = logits + (b * N + i) * V;
                int64_t best = 0;
                for (int64_t v = 1; v < V; v++)
                    if (z[v] > z[best]) best = v;
                toks++;
                if (best == want) tok_ok++;
                else all = 0;
            }
            seq_ok += all;
        }
    }
    free(tok);
    free(tgt);
    free(logits);
    if (s != QKV_OK) return s;
    *seq_acc = (double)seq_ok / (double)seqs;
    *tok_acc = toks ? (double)tok_ok / (double)toks : 0.0;
    *loss = batches ? total / (double)batches : 0.0;
    return QKV_OK;
}

#define EVAL_SEED_SALT 0x5EED0E7A1ull

/* ---- data parallelism under mpirun (docs/DISTRIBUTED.md) -------------------
 * mpirun -np P qkv train ...: every rank builds the same model (same seed,
 * or the same checkpoint), draws the same whole batch and trains on its
 * slice of it (rows r*B/P ..); the gradients are summed across ranks, each
 * weighted by its share of the batch's targeted positions, so every rank
 * takes the step one process would take on the whole batch, and the loss
 * logged is the whole batch's. Rank 0 alone writes the log and the
 * checkpoints (atomically, as always) and prints. Started without mpirun
 * (no launcher in the environment), qkv train is one process as before. */
typedef struct dp_ctx {
    int rank, size, inited;
#ifdef QKV_HAVE_MPI
    MPI_Comm comm;
#endif
} dp_ctx;

static int dp_launched(void) { /* set by mpirun / the PMI(x) launchers */
    const char *s = getenv("OMPI_COMM_WORLD_SIZE");
    if (!s) s = getenv("PMI_SIZE");
    if (!s) s = getenv("PMIX_SIZE");
    return s && atoi(s) > 1;
}

static int dp_begin(dp_ctx *dp) {
    dp->rank = 0;
    dp->size = 1;
    dp->inited = 0;
    if (!dp_launched()) return 0;
#ifdef QKV_HAVE_MPI
    int inited = 0, provided = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
            cli_error(CMD, NULL, NULL, "started by mpirun, but MPI_Init failed");
            return -1;
        }
        dp->inited = 1;
    }
    dp->comm = MPI_COMM_WORLD;
    MPI_Comm_rank(dp->comm, &dp->rank);
    MPI_Comm_size(dp->comm, &dp->size);
    return 0;
#else
    cli_error(CMD, NULL, NULL, "started by mpirun with several ranks, but this qkv was built without MPI "
              "(install Open MPI and rebuild; docs/DISTRIBUTED.md)");
    return -1;
#endif
}

/* 1 when `bad` is set on any rank (so that all ranks stop together). */
static int dp_any(const dp_ctx *dp, int bad) {
#ifdef QKV_HAVE_MPI
    if (dp->size > 1) {
        int any = bad;
        MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, dp->comm);
        return any;
    }
#else
    (void)dp;
#endif
    return bad;
}

/* This rank's rows [*b0, *b0 + *bn) of a batch of B, and its weight: its
 * share of the batch's targeted positions (tgt [B, N], -1 = none). */
static void dp_slice(const dp_ctx *dp, int64_t B, int64_t N, const int32_t *tgt, int64_t *b0, int64_t *bn,
                     double *weight) {
    *b0 = B * dp->rank / dp->size;
    *bn = B * (dp->rank + 1) / dp->size - *b0;
    int64_t all = 0, mine = 0;
    for (int64_t i = 0; i < B * N; i++)
        if (tgt[i] >= 0) {
            all++;
            if (i >= *b0 * N && i < (*b0 + *bn) * N) mine++;
        }
    *weight = all ? (double)mine / (double)all : 1.0 / dp->size;
}

/* The weighted gradients are summed over the ranks by a qkv_dp_reducer,
 * in buckets started during the backward as each block's gradients are
 * final (dp_red_begin before the backward, dp_red_finish after it: every
 * rank learns whether any failed). Without MPI, or with one rank, nothing. */
#ifdef QKV_HAVE_MPI
typedef qkv_dp_reducer dp_red;
#else
typedef struct dp_red dp_red; /* never created */
#endif

#ifdef QKV_HAVE_MPI
static qkv_status dp_red_create(const dp_ctx *dp, qkv_model *m, dp_red **out) {
    *out = NULL;
    return dp->size > 1 ? qkv_dp_reducer_create(m, 0, dp->comm, out) : QKV_OK;
}
static qkv_status dp_red_begin(dp_red *red, double weight) { return red ? qkv_dp_reducer_begin(red, weight) : QKV_OK; }
static qkv_status dp_red_finish(dp_red *red, qkv_status s) { return red ? qkv_dp_reducer_finish(red, s) : s; }
static void dp_red_free(dp_red *red) { qkv_dp_reducer_free(red); }
#else
static qkv_status dp_red_create(const dp_ctx *dp, qkv_model *m, dp_red **out) {
    (void)dp;
    (void)m;
    *out = NULL;
    return QKV_OK;
}
static qkv_status dp_red_begin(dp_red *red, double weight) { return (void)red, (void)weight, QKV_OK; }
static qkv_status dp_red_finish(dp_red *red, qkv_status s) { return (void)red, s; }
static void dp_red_free(dp_red *red) { (void)red; }
#endif

/* Sum the weighted losses over the ranks. */
static qkv_status dp_reduce(const dp_ctx *dp, double weight, double *loss) {
#ifdef QKV_HAVE_MPI
    if (dp->size > 1) {
        double mine = *loss * weight;
        if (MPI_Allreduce(&mine, loss, 1, MPI_DOUBLE, MPI_SUM, dp->comm) != MPI_SUCCESS) return QKV_ERR_IO;
    }
#else
    (void)dp;
    (void)weight;
    (void)loss;
#endif
    return QKV_OK;
}

/* Every rank starts from rank 0's parameters (they are equal already when
 * built from one seed or one checkpoint; this makes it so in any case). */
static qkv_status dp_sync(const dp_ctx *dp, qkv_model *m) {
#ifdef QKV_HAVE_MPI
    if (dp->size > 1) return qkv_model_bcast_params(m, 0, dp->comm);
#else
    (void)dp;
    (void)m;
#endif
    return QKV_OK;
}

static void dp_end(dp_ctx *dp) {
#ifdef QKV_HAVE_MPI
    if (dp->inited) MPI_Finalize();
#endif
    dp->inited = 0;
}

/* ---- training ---------------------------------------------------------------- */

static const char *const PRECISION_NAMES[] = {"fp32", "bf16", "fp16"};
static const qkv_dtype PRECISION_DTYPES[] = {QKV_F32, QKV_BF16, QKV_F16};

/* --precision and its loss scaler, kept in the checkpoint's metadata
 * ("train.precision", "train.loss_scale", "train.loss_scale_clean",
 * "train.loss_scale_skipped") so that a resumed fp16 run goes on exactly. */
static qkv_status save_precision(qkv_safetensors *st, int prec, const qkv_loss_scaler *ls) {
    char v[64];
    qkv_status s = qkv_safetensors_set_meta(st, "train.precision", PRECISION_NAMES[prec]);
    snprintf(v, sizeof v, "%.17g", ls->scale);
    if (s == QKV_OK) s = qkv_safetensors_set_meta(st, "train.loss_scale", v);
    snprintf(v, sizeof v, "%lld", (long long)ls->clean);
    if (s == QKV_OK) s = qkv_safetensors_set_meta(st, "train.loss_scale_clean", v);
    snprintf(v, sizeof v, "%lld", (long long)ls->skipped);
    if (s == QKV_OK) s = qkv_safetensors_set_meta(st, "train.loss_scale_skipped", v);
    return s;
}

/* From a checkpoint: fp32 and a fresh scaler when it has no such entries
 * (written before --precision existed). */
static void load_precision(const qkv_safetensors *st, int *prec, qkv_loss_scaler *ls) {
    const char *p = qkv_safetensors_get_meta(st, "train.precision"), *sc = qkv_safetensors_get_meta(st, "train.loss_scale"),
               *cl = qkv_safetensors_get_meta(st, "train.loss_scale_clean"),
               *sk = qkv_safetensors_get_meta(st, "train.loss_scale_skipped");
    int i = p ? name_index(p, PRECISION_NAMES, 3) : -1;
    if (i >= 0) *prec = i;
    if (sc && cl && sk) {
        ls->scale = strtod(sc, NULL);
        ls->clean = strtoll(cl, NULL, 10);
        ls->skipped = strtoll(sk, NULL, 10);
    }
}

static int save_checkpoint(const char *dir, const qkv_model *m, const qkv_adamw *opt, const train_run *r, int prec,
                           const qkv_loss_scaler *ls) {
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, TRAIN_CKPT_FILE);
    qkv_safetensors *st = NULL;
    qkv_status s = qkv_safetensors_create(&st);
    if (s == QKV_OK) s = qkv_model_save(m, st);
    if (s == QKV_OK) s = qkv_adamw_save(opt, st);
    if (s == QKV_OK) s = train_run_save(r, st);
    if (s == QKV_OK) s = save_precision(st, prec, ls);
    if (s == QKV_OK) s = qkv_safetensors_save(st, path);
    qkv_safetensors_free(st);
    if (s != QKV_OK) {
        cli_error(CMD, "--out", path, "cannot write the checkpoint: %s (the previous one, if any, is intact)",
                  s == QKV_ERR_IO ? strerror(errno) : qkv_status_string(s));
        return -1;
    }
    return 0;
}

/* loss.csv: on resume, keep the rows of the steps before the checkpoint. */
static FILE *open_log(const char *dir, int64_t from_step) {
    char path[2048], tmp[2100];
    snprintf(path, sizeof path, "%s/loss.csv", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *in = from_step > 0 ? fopen(path, "r") : NULL;
    FILE *out = fopen(tmp, "w");
    if (!out) {
        if (in) fclose(in);
        cli_error(CMD, "--out", path, "cannot write: %s", strerror(errno));
        return NULL;
    }
    fputs("step,loss,lr,grad_norm,tokens_per_s\n", out);
    char line[512];
    if (in) {
        while (fgets(line, sizeof line, in)) {
            long long st;
            if (sscanf(line, "%lld,", &st) == 1 && st < from_step) fputs(line, out);
        }
        fclose(in);
    }
    if (fflush(out) != 0 || rename(tmp, path) != 0) {
        fclose(out);
        remove(tmp);
        cli_error(CMD, "--out", path, "cannot write: %s", strerror(errno));
        return NULL;
    }
    return out;
}

/* DIR/loss.png from DIR/loss.csv (the whole run, resumed parts included).
 * Returns 0, or -1 after printing why. */
static int write_loss_png(const char *dir) {
    char path[2048], png[2048], line[512];
    snprintf(path, sizeof path, "%s/loss.csv", dir);
    snprintf(png, sizeof png, "%s/loss.png", dir);
    FILE *f = fopen(path, "r");
    if (!f) {
        cli_error(CMD, "--out", path, "cannot read: %s", strerror(errno));
        return -1;
    }
    size_t cap = 1024, n = 0;
    double *st = malloc(cap * sizeof(double)), *lo = malloc(cap * sizeof(double));
    while (st && lo && fgets(line, sizeof line, f)) {
        double a, b;
        if (sscanf(line, "%lf,%lf", &a, &b) != 2) continue; /* the header */
        if (n == cap) {
            cap *= 2;
            double *s2 = realloc(st, cap * sizeof(double)), *l2 = s2 ? realloc(lo, cap * sizeof(double)) : NULL;
            if (s2) st = s2;
            if (!s2 || !l2) {
                n = 0;
                break;
            }
            lo = l2;
        }
        st[n] = a;
        lo[n++] = b;
    }
    fclose(f);
    qkv_status s = n ? qkv_loss_curve_save_png(png, st, lo, (int64_t)n, "training loss") : QKV_ERR_OUT_OF_MEMORY;
    free(st);
    free(lo);
    if (s != QKV_OK) {
        cli_error(CMD, "--out", png, "cannot draw the loss curve: %s", qkv_status_string(s));
        return -1;
    }
    return 0;
}

static void fmt_time(char *buf, size_t len, double s) {
    if (s < 0 || !isfinite(s)) s = 0;
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, len, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else snprintf(buf, len, "%ldm%02lds", t / 60, t % 60);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int parse_task_option(const char *v, train_run *r) {
    int t = qkv_task_from_name(v);
    if (t < 0) {
        cli_error(CMD, "--task", NULL, "'%s' is not a task (copy, reverse, sort, recall, label, text, mlm)", v);
        return -1;
    }
    r->task.task = (qkv_task)t;
    return 0;
}

static int train_main(int argc, char **argv, const dp_ctx *dp);

int cli_cmd_train(int argc, char **argv) {
    dp_ctx dp;
    if (dp_begin(&dp) != 0) return CLI_EXIT_FAIL;
    int rc = train_main(argc, argv, &dp);
    if (dp.size > 1) rc = dp_any(&dp, rc); /* the worst status of any rank */
    dp_end(&dp);
    return rc;
}

/* What the options of qkv train give besides the run's settings. */
typedef struct train_args {
    int64_t layers, dim, heads, seq, threads, ckpt_every;
    double dropout;
    int pos, quiet, prec;
    const char *out, *resume, *text;
} train_args;

/* The options into r and o, checked together. PARSE_CONTINUE, or the exit
 * status (after --help or a usage error). */
static int parse_train_args(int argc, char **argv, train_run *r, train_args *o) {
    cli_args a = {.cmd = CMD, .argc = argc, .argv = argv, .i = 1};
    int64_t layers = 2, dim = 128, heads = 4, seq = -1, threads = 0, ckpt_every = 250, v;
    double dropout = 0.0;
    int pos = QKV_POSENC_SINUSOIDAL, have_task = 0, quiet = 0, explicit_model = 0, prec = 0, have_prec = 0;
    const char *out = NULL, *resume = NULL, *text = NULL, *name, *val;
    int id;
    while ((id = cli_next(&a, options, OPT_COUNT, &name, &val)) != CLI_END) {
        if (id == CLI_ERROR) return CLI_EXIT_USAGE;
        switch (id) {
        case OPT_HELP: help(); return CLI_EXIT_OK;
        case OPT_TASK:
            if (parse_task_option(val, r) != 0) return CLI_EXIT_USAGE;
            have_task = 1;
            /* "--task text FILE": the corpus follows the task's name. */
            if ((r->task.task == QKV_TASK_TEXT || r->task.task == QKV_TASK_MLM) && a.i < a.argc &&
                strncmp(a.argv[a.i], "-", 1) != 0)
                text = a.argv[a.i++];
            break;
        case OPT_TEXT: text = val; break;
        case OPT_LAYERS: if (cli_parse_int64(CMD, name, val, 1, 64, &layers)) return CLI_EXIT_USAGE; explicit_model = 1; break;
        case OPT_DIM: if (cli_parse_int64(CMD, name, val, 2, 4096, &dim)) return CLI_EXIT_USAGE; explicit_model = 1; break;
        case OPT_HEADS: if (cli_parse_int64(CMD, name, val, 1, 256, &heads)) return CLI_EXIT_USAGE; explicit_model = 1; break;
        case OPT_SEQ: if (cli_parse_int64(CMD, name, val, 1, 1 << 20, &seq)) return CLI_EXIT_USAGE; break;
        case OPT_SYMBOLS: if (cli_parse_int64(CMD, name, val, 2, 4096, &r->task.symbols)) return CLI_EXIT_USAGE; break;
        case OPT_BATCH: if (cli_parse_int64(CMD, name, val, 1, 1 << 16, &r->batch)) return CLI_EXIT_USAGE; break;
        case OPT_STEPS: if (cli_parse_int64(CMD, name, val, 1, INT64_MAX / 2, &r->steps)) return CLI_EXIT_USAGE; break;
        case OPT_WARMUP: if (cli_parse_int64(CMD, name, val, 0, INT64_MAX / 2, &r->warmup)) return CLI_EXIT_USAGE; break;
        case OPT_SEED: if (cli_parse_int64(CMD, name, val, 0, INT64_MAX, &v)) return CLI_EXIT_USAGE; r->seed = (uint64_t)v; break;
        case OPT_THREADS: if (cli_parse_int64(CMD, name, val, 0, 1024, &threads)) return CLI_EXIT_USAGE; break;
        case OPT_CKPT_EVERY: if (cli_parse_int64(CMD, name, val, 1, INT64_MAX, &ckpt_every)) return CLI_EXIT_USAGE; break;
        case OPT_LR:
            if (cli_parse_double(CMD, name, val, &r->lr)) return CLI_EXIT_USAGE;
            if (!(r->lr > 0 && r->lr < 10)) {
                cli_error(CMD, name, NULL, "'%s' must be in (0, 10)", val);
                return CLI_EXIT_USAGE;
            }
            r->min_lr = r->lr / 10;
            break;
        case OPT_DROPOUT:
            if (cli_parse_double(CMD, name, val, &dropout)) return CLI_EXIT_USAGE;
            if (!(dropout >= 0 && dropout < 1)) {
                cli_error(CMD, name, NULL, "'%s' must be in [0, 1)", val);
                return CLI_EXIT_USAGE;
            }
            break;
        case OPT_POS: {
            if ((pos = name_index(val, POS_NAMES, 7)) < 0) {
                cli_error(CMD, name, NULL, "'%s' is not one of none, sinusoidal, learned, rope, alibi, relative, floater", val);
                return CLI_EXIT_USAGE;
            }
            break;
        }
        case OPT_OUT: out = val; break;
        case OPT_RESUME: resume = val; break;
        case OPT_QUIET: quiet = 1; break;
        case OPT_PRECISION:
            if ((prec = name_index(val, PRECISION_NAMES, 3)) < 0) {
                cli_error(CMD, name, NULL, "'%s' is not one of fp32, bf16, fp16", val);
                return CLI_EXIT_USAGE;
            }
            have_prec = 1;
            break;
        }
    }
    if (!resume && (!have_task || !out)) {
        cli_error(CMD, NULL, NULL, "%s is required", !have_task ? "--task" : "--out");
        cli_usage_hint(CMD);
        return CLI_EXIT_USAGE;
    }
    if (resume && (have_task || (out && strcmp(out, resume) != 0) || explicit_model || have_prec)) {
        cli_error(CMD, "--resume", resume, "continues the run as it was: give only --threads (and --quiet) with it");
        return CLI_EXIT_USAGE;
    }
    *o = (train_args){.layers = layers, .dim = dim, .heads = heads, .seq = seq, .threads = threads,
                      .ckpt_every = ckpt_every, .dropout = dropout, .pos = pos, .quiet = quiet, .prec = prec,
                      .out = out, .resume = resume, .text = text};
    return PARSE_CONTINUE;
}

/* The progress line on stderr: step, bar, smoothed loss, speed, ETA. */
static void print_progress(const train_run *r, int64_t first, double t0, double te, double ema,
                           double tps, int tty) {
    double done = (double)(r->step + 1 - first), left = (double)(r->steps - r->step - 1);
    double rate = done / (te - t0);
    char eta[32];
    fmt_time(eta, sizeof eta, left / rate);
    int w = (int)(30.0 * (double)(r->step + 1) / (double)r->steps);
    char bar[31];
    for (int i = 0; i < 30; i++) bar[i] = i < w ? '=' : (i == w ? '>' : ' ');
    bar[30] = '\0';
    fprintf(stderr, "%sstep %lld/%lld [%s] loss %.4f | %.0f tok/s | ETA %s%s", tty ? "\r" : "",
            (long long)r->step + 1, (long long)r->steps, bar, ema, tps, eta, tty ? "  " : "\n");
    fflush(stderr);
}

/* A new run's model: the corpus of a text task read, the task's sizes
 * checked and the model built from the options. PARSE_CONTINUE, or the exit
 * status after printing why. */
static int new_model(train_run *r, const train_args *o, qkv_model **m) {
    qkv_status s;
    if (r->task.task == QKV_TASK_TEXT || r->task.task == QKV_TASK_MLM) {
        if (!o->text) {
            cli_error(CMD, "--task", qkv_task_name(r->task.task), "needs a text file: --task %s FILE",
                      qkv_task_name(r->task.task));
            return CLI_EXIT_USAGE;
        }
        snprintf(r->text_path, sizeof r->text_path, "%s", o->text);
        r->text = train_read_file(CMD, "--text", o->text, &r->text_len);
        if (!r->text) return CLI_EXIT_FAIL;
        r->task.text = r->text;
        r->task.text_len = r->text_len;
    } else if (o->text) {
        cli_error(CMD, "--text", o->text, "only the text and mlm tasks read a file");
        return CLI_EXIT_USAGE;
    }
    r->task.length = o->seq > 0 ? o->seq : (r->task.task == QKV_TASK_TEXT || r->task.task == QKV_TASK_MLM ? 64 : 16);
    train_curriculum_init(r);
    int64_t V, N;
    int causal;
    if ((s = qkv_task_shape(&r->task, &V, &N, &causal)) != QKV_OK) {
        cli_error(CMD, "--seq", NULL, "%s task with --seq %lld --symbols %lld: %s", qkv_task_name(r->task.task),
                  (long long)r->task.length, (long long)(r->task.symbols ? r->task.symbols : 16),
                  s == QKV_ERR_BAD_SIZE ? "sizes out of range (recall needs seq <= symbols <= 4096; label "
                                          "needs symbols >= 4; a corpus needs more bytes than the window)"
                                        : qkv_status_string(s));
        train_run_free(r);
        return CLI_EXIT_USAGE;
    }
    qkv_model_config cfg;
    qkv_model_config_init(&cfg, V, N);
    cfg.dim = o->dim;
    cfg.heads = o->heads;
    cfg.layers = o->layers;
    cfg.causal = causal;
    cfg.pos = (qkv_posenc)o->pos;
    cfg.dropout = o->dropout;
    cfg.threads = (int)o->threads;
    if ((s = qkv_model_create(&cfg, r->seed, m)) != QKV_OK) {
        cli_error(CMD, NULL, NULL, "cannot build the model (--dim %lld --heads %lld --layers %lld --pos %s): %s",
                  (long long)o->dim, (long long)o->heads, (long long)o->layers, POS_NAMES[o->pos], qkv_status_string(s));
        train_run_free(r);
        return s == QKV_ERR_OUT_OF_MEMORY ? CLI_EXIT_FAIL : CLI_EXIT_USAGE;
    }
    return PARSE_CONTINUE;
}

/* One run of qkv train: its settings and what it holds while training. */
typedef struct trainer {
    train_run r;
    const dp_ctx *dp;
    qkv_model *m;
    qkv_adamw *opt;
    qkv_safetensors *ckpt; /* the checkpoint resumed from, or NULL */
    dp_red *red;
    qkv_loss_scaler scaler;
    int prec, quiet;
    int64_t ckpt_every;
    const char *out, *resume;
} trainer;

/* The model: from the checkpoint of --resume (rebuilt for another --threads,
 * which does not change results), or new from the options, with its --out
 * folder. PARSE_CONTINUE, or the exit status after printing why. */
static int prepare_model(trainer *t, const train_args *o) {
    qkv_status s;
    char why[512];
    if (!t->resume) {
        int nrc = new_model(&t->r, o, &t->m);
        if (nrc != PARSE_CONTINUE) return nrc;
        if (mkdir(t->out, 0777) != 0 && errno != EEXIST) {
            cli_error(CMD, "--out", t->out, "cannot create the folder: %s", strerror(errno));
            return CLI_EXIT_FAIL;
        }
        return PARSE_CONTINUE;
    }
    t->out = t->resume;
    if (train_load_checkpoint(CMD, t->resume, &t->ckpt, &t->m, &t->r) != 0) {
        t->ckpt = NULL; /* freed by train_load_checkpoint */
        t->m = NULL;
        return CLI_EXIT_FAIL;
    }
    qkv_model_config cfg = *qkv_model_get_config(t->m);
    if (o->threads == cfg.threads) return PARSE_CONTINUE;
    cfg.threads = (int)o->threads;
    qkv_model *m2 = NULL;
    if ((s = qkv_model_create(&cfg, 0, &m2)) != QKV_OK || (s = qkv_model_load(m2, t->ckpt, why, sizeof why)) != QKV_OK) {
        cli_error(CMD, "--resume", t->resume, "%s", qkv_status_string(s));
        qkv_model_free(m2);
        return CLI_EXIT_FAIL;
    }
    qkv_model_free(t->m);
    t->m = m2;
    return PARSE_CONTINUE;
}

/* Data parallelism, the optimiser (its state from the checkpoint) and the
 * precision. 0, or -1 after printing why. */
static int prepare_training(trainer *t) {
    qkv_status s;
    char why[512];
    if ((s = dp_sync(t->dp, t->m)) != QKV_OK || (s = dp_red_create(t->dp, t->m, &t->red)) != QKV_OK) {
        cli_error(CMD, NULL, NULL, "data parallel: %s", qkv_status_string(s));
        return -1;
    }
    if ((s = qkv_adamw_create(t->m, 0.9, 0.95, 1e-8, t->r.weight_decay, &t->opt)) != QKV_OK) {
        cli_error(CMD, NULL, NULL, "optimiser: %s", qkv_status_string(s));
        return -1;
    }
    if (t->ckpt && qkv_adamw_load(t->opt, t->ckpt, why, sizeof why) != QKV_OK) {
        cli_error(CMD, "--resume", t->resume, "%s", why);
        return -1;
    }
    if (t->ckpt) load_precision(t->ckpt, &t->prec, &t->scaler);
    if ((s = qkv_model_set_precision(t->m, PRECISION_DTYPES[t->prec])) != QKV_OK) {
        cli_error(CMD, "--precision", PRECISION_NAMES[t->prec], "%s", qkv_status_string(s));
        return -1;
    }
    return 0;
}

/* One optimiser step on batch r.step (tok, tgt [batch, N] of the longest
 * length; the curriculum's is used): this rank's slice forward and backward,
 * gradients and loss summed over the ranks, the update (fp16: unscaled, and
 * skipped on inf/NaN, logged grad_norm inf). *tokens: the batch's tokens. */
static qkv_status train_step(trainer *t, int32_t *tok, int32_t *tgt, int64_t N, double lr, double *loss,
                             double *gnorm, int64_t *tokens) {
    qkv_status s;
    train_run *r = &t->r;
    qkv_task_spec cur = r->task; /* the curriculum's length, if any (N is the most) */
    int64_t Nc = N;
    if (r->cur_length > 0) cur.length = r->cur_length;
    if ((s = qkv_task_shape(&cur, NULL, &Nc, NULL)) != QKV_OK ||
        (s = qkv_task_batch(&cur, r->seed, r->step, r->batch, tok, tgt)) != QKV_OK)
        return s;
    *tokens = r->batch * Nc;
    qkv_model_set_step(t->m, r->seed, r->step);
    qkv_model_zero_grad(t->m);
    int fp16 = PRECISION_DTYPES[t->prec] == QKV_F16;
    if (fp16 && (s = qkv_model_set_loss_scale(t->m, t->scaler.scale)) != QKV_OK) return s;
    int64_t b0 = 0, bn = r->batch;
    double share = 1.0;
    if (t->dp->size > 1) dp_slice(t->dp, r->batch, Nc, tgt, &b0, &bn, &share);
    s = dp_red_begin(t->red, share);
    if (s == QKV_OK) s = qkv_model_forward(t->m, bn, Nc, tok + b0 * Nc, tgt + b0 * Nc, 1, NULL, loss);
    if (s == QKV_OK) s = qkv_model_backward(t->m);
    if ((s = dp_red_finish(t->red, s)) != QKV_OK) return s; /* every rank stops together */
    if ((s = dp_reduce(t->dp, share, loss)) != QKV_OK) return s;
    if (fp16) {
        int skipped = 0;
        return qkv_loss_scaler_step(&t->scaler, t->m, t->opt, lr, r->clip, gnorm, &skipped);
    }
    return qkv_adamw_step(t->opt, lr, r->clip, gnorm);
}

/* After step r.step: the checkpoint when one is due (rank 0 writes it; it
 * records the next step). 0, or -1 when any rank failed. */
static int checkpoint_if_due(trainer *t, FILE *log) {
    train_run *r = &t->r;
    if ((r->step + 1) % t->ckpt_every != 0 && r->step + 1 != r->steps) return 0;
    int64_t keep = r->step;
    r->step++;
    fflush(log);
    int bad = t->dp->rank == 0 && save_checkpoint(t->out, t->m, t->opt, r, t->prec, &t->scaler) != 0;
    r->step = keep;
    return dp_any(t->dp, bad) ? -1 : 0;
}

/* The steps from r.step to r.steps, logged to log, with checkpoints and the
 * progress line. 0, or -1 after printing why. */
static int train_loop(trainer *t, FILE *log, int32_t *tok, int32_t *tgt, int64_t N) {
    train_run *r = &t->r;
    qkv_status s = QKV_OK;
    int tty = !t->quiet && isatty(STDERR_FILENO), failed = 0;
    double t0 = now_s(), t_last = t0, ema = NAN;
    int64_t first = r->step;
    for (; r->step < r->steps; r->step++) {
        double loss = 0, gnorm = 0, ts = now_s();
        double lr = qkv_lr_schedule(r->step, r->warmup, r->steps, r->lr, r->min_lr);
        int64_t tokens = 0;
        if ((s = train_step(t, tok, tgt, N, lr, &loss, &gnorm, &tokens)) != QKV_OK) break;
        double te = now_s();
        double tps = (double)tokens / (te - ts);
        int64_t was = r->cur_length;
        train_curriculum_update(r, loss);
        if (!t->quiet && r->cur_length != was)
            fprintf(stderr, "%scurriculum: %lld pairs from step %lld\n", tty ? "\n" : "", (long long)r->cur_length,
                    (long long)r->step + 1);
        fprintf(log, "%lld,%.9g,%.6g,%.6g,%.1f\n", (long long)r->step, loss, lr, gnorm, tps);
        ema = isnan(ema) ? loss : 0.95 * ema + 0.05 * loss;
        if (checkpoint_if_due(t, log) != 0) {
            failed = 1;
            break;
        }
        if (!t->quiet && (te - t_last > (tty ? 0.2 : 10.0) || r->step + 1 == r->steps)) {
            t_last = te;
            print_progress(r, first, t0, te, ema, tps, tty);
        }
    }
    if (tty) fputc('\n', stderr);
    if (failed) return -1;
    if (s != QKV_OK) {
        cli_error(CMD, NULL, NULL, "step %lld: %s", (long long)r->step, qkv_status_string(s));
        return -1;
    }
    return 0;
}

/* The log and the batch buffers around train_loop. 0, or -1 after printing why. */
static int train_all(trainer *t) {
    const dp_ctx *dp = t->dp;
    train_run *r = &t->r;
    int64_t V, N;
    int causal;
    qkv_task_shape(&r->task, &V, &N, &causal);
    FILE *log = dp->rank == 0 ? open_log(t->out, r->step) : fopen("/dev/null", "w");
    if (dp_any(dp, !log)) {
        if (log) fclose(log);
        return -1;
    }
    if (dp->size > 1 && r->batch < dp->size) {
        cli_error(CMD, "--batch", NULL, "%lld rows cannot be shared by %d ranks", (long long)r->batch, dp->size);
        fclose(log);
        return -1;
    }
    int32_t *tok = malloc((size_t)(r->batch * N) * sizeof(int32_t)), *tgt = malloc((size_t)(r->batch * N) * sizeof(int32_t));
    if (!tok || !tgt) {
        free(tok);
        free(tgt);
        fclose(log);
        cli_error(CMD, "--batch", NULL, "out of memory");
        return -1;
    }
    if (!t->quiet)
        fprintf(stderr, "qkv train: %s, n = %lld, vocab %lld, %lld parameters, %lld steps%s%s%s\n",
                qkv_task_name(r->task.task), (long long)N, (long long)V, (long long)qkv_model_param_count(t->m),
                (long long)r->steps, r->step ? " (resumed)" : "", t->prec ? ", attention in " : "",
                t->prec ? PRECISION_NAMES[t->prec] : "");
    int rc = train_loop(t, log, tok, tgt, N);
    dp_red_free(t->red); /* and the model's gradient hook */
    t->red = NULL;
    free(tok);
    free(tgt);
    if (fclose(log) != 0 && rc == 0) rc = -1;
    return rc;
}

/* Rank 0's last words: accuracy on fresh examples, the loss scaler's
 * record, the loss curve (when this qkv draws) and where everything is.
 * 0, or -1 after printing why. */
static int report(trainer *t) {
    qkv_status s;
    double acc, tacc, eloss;
    if ((s = evaluate(t->m, &t->r, 512, t->r.seed ^ EVAL_SEED_SALT, &acc, &tacc, &eloss)) == QKV_OK)
        printf("%s: exact-sequence accuracy %.2f%%, token accuracy %.2f%%, loss %.4f on 512 fresh examples\n",
               qkv_task_name(t->r.task.task), 100 * acc, 100 * tacc, eloss);
    if (PRECISION_DTYPES[t->prec] == QKV_F16)
        printf("fp16 loss scaling: %lld steps skipped (inf/NaN gradients), final scale %g\n",
               (long long)t->scaler.skipped, t->scaler.scale);
    int drawn = cli_can_draw(CMD);
    if (drawn && write_loss_png(t->out) != 0) return -1;
    printf("checkpoint: %s/%s\nloss log:   %s/loss.csv\n", t->out, TRAIN_CKPT_FILE, t->out);
    if (drawn) printf("loss curve: %s/loss.png\n", t->out);
    return 0;
}

static int train_main(int argc, char **argv, const dp_ctx *dp) {
    trainer t;
    memset(&t, 0, sizeof t);
    t.r.batch = 32;
    t.r.steps = 2000;
    t.r.warmup = 100;
    t.r.lr = 1e-3;
    t.r.min_lr = 1e-4;
    t.r.clip = 1.0;
    t.r.weight_decay = 0.01;
    t.r.seed = 1;
    t.dp = dp;
    train_args o;
    int rc = parse_train_args(argc, argv, &t.r, &o);
    if (rc != PARSE_CONTINUE) return rc;
    t.ckpt_every = o.ckpt_every;
    t.quiet = o.quiet || dp->rank != 0; /* data parallel: rank 0 reports */
    t.prec = o.prec;
    t.out = o.out;
    t.resume = o.resume;
    qkv_loss_scaler_init(&t.scaler);
    rc = prepare_model(&t, &o);
    if (rc == PARSE_CONTINUE)
        rc = prepare_training(&t) != 0 || train_all(&t) != 0 || (dp->rank == 0 && report(&t) != 0) ? CLI_EXIT_FAIL
                                                                                                   : CLI_EXIT_OK;
    dp_red_free(t.red);
    qkv_adamw_free(t.opt);
    qkv_model_free(t.m);
    qkv_safetensors_free(t.ckpt);
    train_run_free(&t.r);
    return rc;
}

/* ---- qkv eval ------------------------------------------------------------------ */

int cli_cmd_eval(int argc, char **argv) {
    static const cli_opt eopts[] = {
        {"--help", "-h", 0, 0}, {"--ckpt", NULL, 1, 1}, {"--examples", NULL, 1, 2}, {"--seed", NULL, 1, 3},
    };
    cli_args a = {.cmd = "eval", .argc = argc, .argv = argv, .i = 1};
    const char *ckpt = NULL, *name, *val;
    int64_t examples = 1000, seed = -1;
    int id;
    while ((id = cli_next(&a, eopts, 4, &name, &val)) != CLI_END) {
        if (id == CLI_ERROR) return CLI_EXIT_USAGE;
        if (id == 0) {
            fputs("Usage: qkv eval --ckpt DIR [--examples N] [--seed S]\n\n"
                  "Accuracy of a checkpoint of 'qkv train' on N fresh examples of its task\n"
                  "(exact-sequence and token accuracy, loss). The examples come from a seed\n"
                  "the training never used unless --seed says otherwise.\n",
                  stdout);
            return CLI_EXIT_OK;
        }
        if (id == 1) ckpt = val;
        if (id == 2 && cli_parse_int64("eval", name, val, 1, 1 << 24, &examples)) return CLI_EXIT_USAGE;
        if (id == 3 && cli_parse_int64("eval", name, val, 0, INT64_MAX, &seed)) return CLI_EXIT_USAGE;
    }
    if (!ckpt) {
        cli_error("eval", NULL, NULL, "--ckpt is required");
        cli_usage_hint("eval");
        return CLI_EXIT_USAGE;
    }
    qkv_safetensors *st;
    qkv_model *m;
    train_run r;
    if (train_load_checkpoint("eval", ckpt, &st, &m, &r) != 0) return CLI_EXIT_FAIL;
    double acc, tacc, loss;
    uint64_t s0 = seed >= 0 ? (uint64_t)seed : r.seed ^ EVAL_SEED_SALT;
    qkv_status s = evaluate(m, &r, examples, s0, &acc, &tacc, &loss);
    if (s == QKV_OK)
        printf("%s (seq %lld): exact-sequence accuracy %.2f%%, token accuracy %.2f%%, loss %.4f on %lld examples\n",
               qkv_task_name(r.task.task), (long long)r.task.length, 100 * acc, 100 * tacc, loss, (long long)examples);
    else
        cli_error("eval", "--ckpt", ckpt, "%s", qkv_status_string(s));
    qkv_model_free(m);
    qkv_safetensors_free(st);
    train_run_free(&r);
    return s == QKV_OK ? CLI_EXIT_OK : CLI_EXIT_FAIL;
}
