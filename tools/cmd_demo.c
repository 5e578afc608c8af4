/* qkv demo: the articles' walkthrough, run for real.
 *
 *   qkv demo [--out DIR] [--seed S] [--steps N] [--color auto|always|never]
 *            [--model DIR]
 *
 * A tiny word-level decoder is trained here and now (qkv_model_* and
 * qkv_adamw_*, a second or two) on short sentences such as "Hello , I love
 * you !", in which the greeting decides the subject and the subject decides
 * the object, so that attending to the right earlier word is the only way to
 * predict well. Then the sentence "Hello , I love you !" goes through the
 * trained model's first layer step by step, as the articles draw it:
 * embedding -> I -> q, k, v (from the layer's in_proj_weight) -> A = q kᵀ/√d
 * -> A' = softmax(A) -> O = A' v. Every matrix printed is computed from the
 * trained parameters, and A' is checked against the attention the model
 * itself kept (qkv_model_attention). Then all heads side by side, the layer
 * output through qkv_mha_forward, and a truncated (windowed) attention with
 * qkv_attention_forward. Last, when a pretrained encoder is at hand (--model,
 * $QKV_MODEL_DIR or models/all-MiniLM-L6-v2; scripts/fetch-model.sh fetches
 * it), the sentence through it (qkv/encoder.h, qkv/text.h): word pieces, its
 * most focused head, sentence similarities. Pictures go to DIR (default: the
 * current folder).
 *
 * Outputs are atomic PNG files; if any write fails, those already written by
 * this run are removed. Without PNG (QKV_WITH_PNG 0) nothing is drawn and
 * that is said once. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, isatty, mkdir */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
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

#define CMD "demo"

enum { OPT_HELP, OPT_OUT, OPT_SEED, OPT_STEPS, OPT_COLOR, OPT_MODEL, OPT_COUNT };

static const cli_opt options[OPT_COUNT] = {
    {"--help", "-h", 0, OPT_HELP},
    {"--out", "-o", 1, OPT_OUT},
    {"--seed", NULL, 1, OPT_SEED},
    {"--steps", NULL, 1, OPT_STEPS},
    {"--color", NULL, 1, OPT_COLOR},
    {"--model", NULL, 1, OPT_MODEL},
};

static void help(void) {
    fputs("Usage: qkv demo [--out DIR] [--seed S] [--steps N] [--color auto|always|never]\n"
          "                [--model DIR]\n"
          "\n"
          "The articles' example, \"Hello, I love you!\", through a transformer layer\n"
          "that qkv trains first (about a second): a one-layer word-level decoder with\n"
          "two heads learns sentences like \"Hello , I love you !\" and \"Hi , you miss\n"
          "me .\" (the greeting decides the subject, the subject the object). Then the\n"
          "sentence goes through the trained layer step by step: the embeddings I,\n"
          "q, k, v of head 0, the scores A = q k^T / sqrt(d), the normalised A'\n"
          "(softmax of each row) and the output O = A' v, each printed; A' is drawn as\n"
          "a heatmap. Then both heads side by side, and a truncated (windowed)\n"
          "attention where each word sees only itself and the two words before it.\n"
          "Last, the same sentence through a pretrained encoder (all-MiniLM-L6-v2):\n"
          "its word pieces, the attention of the head that looks hardest at other\n"
          "words, and how alike three sentences' vectors are (cosine similarity).\n"
          "Without the model, one line says how to fetch it (scripts/fetch-model.sh).\n"
          "\n"
          "  -o, --out DIR   where the pictures go (default: the current folder;\n"
          "                  created if missing): attention.png (A' of head 0),\n"
          "                  attention_head<h>.png, attention_heads.png (side by\n"
          "                  side), attention_window.png, loss.png,\n"
          "                  positional_encoding.png, attention_model.png (the\n"
          "                  pretrained model's head); none in a build without PNG\n"
          "  --seed S        seed of the corpus order and the initial weights (default 1)\n"
          "  --steps N       training steps (default 400)\n"
          "  --color WHEN    coloured heatmaps on the terminal: auto (default: when\n"
          "                  stdout is a terminal), always, never\n"
          "  --model DIR     the pretrained model's folder (it must exist); default:\n"
          "                  $QKV_MODEL_DIR, else models/all-MiniLM-L6-v2, skipped\n"
          "                  when missing\n"
          "  -h, --help      show this help and exit\n"
          "\n"
          "Exit status: 0 success, 1 failure (nothing is left behind), 2 usage error.\n",
          stdout);
}

/* ---- the corpus ------------------------------------------------------------ */

static const char *const VOCAB[] = {"Hello", "Hi", "Hey",  ",",    "I",    "you", "we", "love",
                                    "like",  "miss", "see", "me",  "them", "!",   "."};
enum { V = sizeof VOCAB / sizeof VOCAB[0], N = 6 };
enum { W_HELLO, W_HI, W_HEY, W_COMMA, W_I, W_YOU, W_WE, W_LOVE, W_LIKE, W_MISS, W_SEE, W_ME, W_THEM, W_BANG,
       W_DOT };

/* greeting -> subject -> object: "Hello , I <verb> you", "Hi , you <verb> me",
 * "Hey , we <verb> them"; the verb and the final mark are random. */
static const int GREET[3] = {W_HELLO, W_HI, W_HEY}, SUBJ[3] = {W_I, W_YOU, W_WE}, OBJ[3] = {W_YOU, W_ME, W_THEM};
static const int VERB[4] = {W_LOVE, W_LIKE, W_MISS, W_SEE};

static void sentence(uint64_t *rng, int32_t *t) {
    int g = (int)(splitmix64_next(rng) % 3);
    t[0] = GREET[g];
    t[1] = W_COMMA;
    t[2] = SUBJ[g];
    t[3] = VERB[splitmix64_next(rng) % 4];
    t[4] = OBJ[g];
    t[5] = splitmix64_next(rng) % 2 ? W_BANG : W_DOT;
}

/* ---- printing ---------------------------------------------------------------- */

static const char *const *g_labels; /* the sentence's words */

/* A small matrix, rows labelled by the words (row_words) or numbered, columns
 * by the words (col_words); -inf (masked) shown as "-inf". */
static void print_matrix_rows(const char *name, const float *m, int64_t rows, int64_t cols, int col_words,
                              int row_words) {
    printf("    %s  [%lld x %lld]\n", name, (long long)rows, (long long)cols);
    if (col_words) {
        printf("    %6s ", "");
        for (int64_t j = 0; j < cols; j++) printf(" %6.6s", g_labels[j]);
        printf("\n");
    }
    for (int64_t i = 0; i < rows; i++) {
        if (row_words)
            printf("    %6.6s ", g_labels[i]);
        else
            printf("    %6lld ", (long long)i);
        for (int64_t j = 0; j < cols; j++) {
            float v = m[i * cols + j];
            if (isinf(v) && v < 0)
                printf("   -inf");
            else
                printf(" %6.2f", fabs(v) < 0.005 ? 0.0 : v);
        }
        printf("\n");
    }
}

static void print_matrix(const char *name, const float *m, int64_t rows, int64_t cols, int col_words) {
    print_matrix_rows(name, m, rows, cols, col_words, 1);
}

/* For each word (from the second on), the earlier or same word it attends
 * to most. */
static void print_strongest(const char *head, const float *ap, int n) {
    printf("    %s, strongest attention of each word:", head);
    for (int i = 1; i < n; i++) {
        int best = 0;
        for (int j = 1; j < n; j++)
            if (ap[i * n + j] > ap[i * n + best]) best = j;
        printf("%s%s -> %s (%.2f)", i == 1 ? "\n      " : i == 4 ? ",\n      " : ", ", g_labels[i], g_labels[best],
               ap[i * n + best]);
    }
    printf("\n");
}

static int g_color;                     /* draw heatmaps on the terminal */
static qkv_ansi_colors g_colors = QKV_ANSI_24BIT;

static int print_heatmap(const qkv_heatmap *h) { return g_color ? cli_print_heatmap(CMD, h, g_colors) : 0; }

/* A heatmap of an n x n attention matrix over labelled tokens, values shown,
 * on the scale 0 .. 1. */
static qkv_heatmap word_heatmap(const float *a, int64_t n, const char *const *labels, const char *title) {
    qkv_heatmap h;
    qkv_heatmap_init(&h, a, n, n);
    h.row_labels = labels;
    h.col_labels = labels;
    h.show_values = 1;
    h.vmin = 0.0;
    h.vmax = 1.0;
    h.title = title;
    return h;
}

/* ---- pictures: every path written, removed again if a later step fails -- */

enum { MAX_OUTPUTS = 16 };
static char g_written[MAX_OUTPUTS][4096];
static int g_n_written;

static void remove_outputs(void) {
    for (int i = 0; i < g_n_written; i++) unlink(g_written[i]);
    g_n_written = 0;
}

/* The path DIR/name of the next picture, or NULL after printing why. */
static char *next_path(const char *dir, const char *name) {
    if (g_n_written >= MAX_OUTPUTS) return NULL;
    char *path = g_written[g_n_written];
    int n = snprintf(path, sizeof g_written[0], "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= sizeof g_written[0]) {
        cli_error(CMD, "--out", dir, "path too long");
        return NULL;
    }
    errno = 0;
    return path;
}

/* After the picture at path was drawn with status s: recorded and reported
 * ("wrote path" and the note), or -1 after printing why. */
static int picture_done(const char *path, qkv_status s, const char *note) {
    if (s != QKV_OK) {
        cli_error(CMD, "--out", path, "cannot write the picture: %s%s%s", qkv_status_string(s), errno ? ": " : "",
                  errno ? strerror(errno) : "");
        return -1;
    }
    g_n_written++;
    printf("  wrote %s%s\n", path, note);
    return 0;
}

static int save_heatmap(const char *dir, const char *name, const qkv_heatmap *h) {
    if (!cli_can_draw(CMD)) return 0;
    char *path = next_path(dir, name);
    return path ? picture_done(path, qkv_heatmap_save_png(path, h), "") : -1;
}

/* ---- the model's parameters, by name --------------------------------------- */

static float *segment(qkv_model *m, const char *name, int64_t want) {
    for (int64_t i = 0; i < qkv_model_segment_count(m); i++) {
        const char *nm;
        float *p, *g;
        int64_t count;
        if (qkv_model_segment(m, i, &nm, &p, &g, &count) == QKV_OK && strcmp(nm, name) == 0 &&
            (want < 0 || count >= want))
            return p;
    }
    return NULL;
}

/* y = LayerNorm(x) row by row (eps 1e-5, as the model). */
static void layernorm(const float *x, const float *g, const float *b, int64_t rows, int64_t E, float *y) {
    for (int64_t r = 0; r < rows; r++) {
        double mu = 0, var = 0;
        for (int64_t i = 0; i < E; i++) mu += x[r * E + i];
        mu /= (double)E;
        for (int64_t i = 0; i < E; i++) var += (x[r * E + i] - mu) * (x[r * E + i] - mu);
        double rs = 1.0 / sqrt(var / (double)E + 1e-5);
        for (int64_t i = 0; i < E; i++) y[r * E + i] = (float)((x[r * E + i] - mu) * rs * g[i] + b[i]);
    }
}

/* out [n, Dh] = in [n, E] · W[rows r0 .. r0+Dh-1 of a [*, E] matrix]ᵀ + bias[r0 ..]. */
static void project(const float *in, int64_t n, int64_t E, const float *W, const float *bias, int64_t r0,
                    int64_t Dh, float *out) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t o = 0; o < Dh; o++) {
            double acc = bias ? bias[r0 + o] : 0.0;
            for (int64_t e = 0; e < E; e++) acc += (double)in[i * E + e] * W[(r0 + o) * E + e];
            out[i * Dh + o] = (float)acc;
        }
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- the demo ---------------------------------------------------------------- */

enum { E = 8, H = 2, DH = E / H, BATCH = 32 };

static int fail_status(const char *what, qkv_status s) {
    cli_error(CMD, NULL, NULL, "%s: %s", what, qkv_status_string(s));
    return CLI_EXIT_FAIL;
}

/* The training of step 1, its losses into losses[steps]. 0 or -1. */
static int train_steps(qkv_model *m, qkv_adamw *opt, uint64_t seed, int64_t steps, double *losses) {
    qkv_status s;
    int32_t tok[BATCH * N], tgt[BATCH * N];
    uint64_t rng = seed * 0x2545F4914F6CDD1Dull + 7;
    double t0 = now_s();
    for (int64_t step = 0; step < steps; step++) {
        for (int b = 0; b < BATCH; b++) {
            sentence(&rng, tok + b * N);
            for (int i = 0; i < N; i++) tgt[b * N + i] = i + 1 < N ? tok[b * N + i + 1] : -1;
        }
        double loss = 0, gn = 0;
        qkv_model_zero_grad(m);
        qkv_model_set_step(m, seed, step);
        if ((s = qkv_model_forward(m, BATCH, N, tok, tgt, 1, NULL, &loss)) != QKV_OK ||
            (s = qkv_model_backward(m)) != QKV_OK ||
            (s = qkv_adamw_step(opt, qkv_lr_schedule(step, steps / 10, steps, 1e-2, 1e-3), 1.0, &gn)) !=
                QKV_OK) {
            fail_status("training", s);
            return -1;
        }
        losses[step] = loss;
        if (step % (steps / 4 > 0 ? steps / 4 : 1) == 0 || step == steps - 1)
            printf("     step %4lld   loss %.3f\n", (long long)step, loss);
    }
    /* The floor: the verb (1 of 4) and the mark (1 of 2) cannot be
     * predicted: (ln 4 + ln 2) / 5 targets per sentence. */
    printf("   %.1f s. The best possible loss is %.3f: only the verb and the final mark\n"
           "   are left to chance.\n",
           now_s() - t0, (log(4.0) + log(2.0)) / 5.0);
    return 0;
}

/* positional_encoding.png. 0 or -1. */
static int draw_positions(const char *dir) {
    /* The articles' figure of the sinusoidal e^i: one column per
     * position, at a size where its pattern shows (E = 64, 100
     * positions); the demo's model uses its first 8 rows, 6 columns. */
    enum { PE_N = 100, PE_E = 64 };
    if (!cli_can_draw(CMD)) return 0;
    float *pe_big = malloc(sizeof(float) * PE_N * PE_E), *pe_t = malloc(sizeof(float) * PE_N * PE_E);
    if (!pe_big || !pe_t || qkv_posenc_sinusoidal(PE_N, PE_E, 0, pe_big) != QKV_OK) {
        free(pe_big);
        free(pe_t);
        cli_error(CMD, NULL, NULL, "positional encoding: out of memory");
        return -1;
    }
    for (int i = 0; i < PE_N; i++)
        for (int e = 0; e < PE_E; e++) pe_t[e * PE_N + i] = pe_big[i * PE_E + e];
    char *path = next_path(dir, "positional_encoding.png");
    int rc = path ? picture_done(path,
                                 qkv_matrix_save_png(path, pe_t, PE_E, PE_N,
                                                     "sinusoidal positional encoding: column i is e^i",
                                                     "position i", "dimension"),
                                 " (the articles' figure of e^i, 64 dimensions x 100 positions)")
                  : -1;
    free(pe_big);
    free(pe_t);
    return rc;
}

/* loss.png. 0 or -1. */
static int draw_loss(const char *dir, const double *losses, int64_t steps) {
    if (!cli_can_draw(CMD)) return 0;
    char *path = next_path(dir, "loss.png");
    return path ? picture_done(path, qkv_loss_curve_save_png(path, NULL, losses, steps, "qkv demo: training loss"), "")
                : -1;
}

/* The layer as a library object with the trained weights (qkv_mha_forward)
 * against concat(O_0, O_1) W_o^T + b_o computed here. 0 or -1. */
static int check_layer(qkv_model *m, const float *attn_p, const float *I, float Ap[H][N * N],
                       float v[H][N * DH], qkv_mha **layer) {
    qkv_status s;
    /* The layer as a library object with the trained weights: its output
     * is concat(O_0, O_1) W_o^T + b_o. */
    qkv_mha_config mc;
    qkv_mha_config_init(&mc, E, H);
    mc.attn.mask = QKV_MASK_CAUSAL;
    mc.attn.threads = 1;
    int64_t count = 0, mcount = 0;
    if ((s = qkv_mha_create(&mc, 1, layer)) != QKV_OK) {
        fail_status("layer", s);
        return -1;
    }
    float *lp = qkv_mha_params(*layer, &count);
    for (int64_t i = 0; i < qkv_model_segment_count(m); i++) {
        const char *nm;
        float *p, *g;
        if (qkv_model_segment(m, i, &nm, &p, &g, &mcount) == QKV_OK && strcmp(nm, "layers.0.attn.") == 0)
            break;
        mcount = 0;
    }
    if (mcount != count) {
        cli_error(CMD, NULL, NULL, "the model's attention layer has %lld parameters, a fresh one %lld",
                  (long long)mcount, (long long)count);
        return -1;
    }
    memcpy(lp, attn_p, (size_t)count * sizeof(float));
    float y[N * E], attn2[H * N * N], cat[N * E];
    if ((s = qkv_mha_forward(*layer, 1, N, N, I, NULL, NULL, NULL, y, attn2)) != QKV_OK) {
        fail_status("qkv_mha_forward", s);
        return -1;
    }
    /* concat of every head's O, then W_o (after in_proj_weight and in_proj_bias). */
    for (int h = 0; h < H; h++)
        for (int i = 0; i < N; i++)
            for (int d = 0; d < DH; d++) {
                double acc = 0;
                for (int j = 0; j < N; j++) acc += (double)Ap[h][i * N + j] * v[h][j * DH + d];
                cat[i * E + h * DH + d] = (float)acc;
            }
    const float *W_o = attn_p + 3 * E * E + 3 * E, *b_o = W_o + E * E;
    double ydiff = 0;
    for (int i = 0; i < N; i++)
        for (int o = 0; o < E; o++) {
            double acc = b_o[o];
            for (int e = 0; e < E; e++) acc += (double)cat[i * E + e] * W_o[o * E + e];
            if (fabs(acc - y[i * E + o]) > ydiff) ydiff = fabs(acc - y[i * E + o]);
        }
    printf("\n   The layer joins the heads: y = concat(O_0, O_1) W_o^T + b_o  [%d x %d].\n"
           "   qkv_mha_forward with the trained weights gives the same y (largest\n"
           "   difference %.1e):\n",
           N, E, ydiff);
    print_matrix("y", y, N, E, 0);
    return 0;
}

/* "Hello , I love you !" on its way through layer 0 of the trained model. */
typedef struct walk {
    const char *words[N];
    const float *attn_p;     /* layer 0's attention parameters (in_proj, out_proj) */
    const float *model_attn; /* [H, N, N]: the attention the model itself kept */
    float I[N * E];          /* the layer's input (after LayerNorm) */
    float q[H][N * DH], k[H][N * DH], v[H][N * DH];
    float A[H][N * N], Ap[H][N * N];
} walk;

static const int32_t HELLO[N] = {W_HELLO, W_COMMA, W_I, W_LOVE, W_YOU, W_BANG};

/* The demo's model and its optimiser. 0, or the exit status after printing why. */
static int create_model(uint64_t seed, qkv_model **m, qkv_adamw **opt) {
    qkv_status s;
    qkv_model_config cfg;
    qkv_model_config_init(&cfg, V, N);
    cfg.dim = E;
    cfg.heads = H;
    cfg.layers = 1;
    cfg.mlp_dim = 4 * E;
    cfg.causal = 1;
    cfg.tie_embeddings = 1;
    cfg.pos = QKV_POSENC_SINUSOIDAL;
    cfg.threads = 1;
    if ((s = qkv_model_create(&cfg, seed, m)) != QKV_OK) return fail_status("model", s);
    if ((s = qkv_adamw_create(*m, 0.9, 0.98, 1e-8, 0.01, opt)) != QKV_OK) return fail_status("optimiser", s);
    return 0;
}

/* Step 1: what is trained, then the training. 0 or -1. */
static int step_train(qkv_model *m, qkv_adamw *opt, uint64_t seed, int64_t steps, double *losses) {
    printf("qkv demo: the articles' example \"Hello, I love you!\" through self-attention\n"
           "that qkv trains now.\n\n");
    printf("1. Training a one-layer decoder (E = %d, %d heads of d = %d, sinusoidal positions,\n"
           "   %lld parameters) to predict the next word of sentences such as\n"
           "   \"Hello , I love you !\", \"Hi , you miss me .\", \"Hey , we see them !\"\n"
           "   (the greeting decides the subject, the subject the object; the verb and\n"
           "   the final mark are random): %lld steps of %d sentences, AdamW.\n",
           E, H, DH, (long long)qkv_model_param_count(m), (long long)steps, BATCH);
    fflush(stdout);
    return train_steps(m, opt, seed, steps, losses);
}

/* The sentence through the trained model, its attention kept (w->model_attn),
 * and what the model predicts after each word. 0 or -1. */
static int step_predict(qkv_model *m, walk *w) {
    qkv_status s;
    for (int i = 0; i < N; i++) w->words[i] = VOCAB[HELLO[i]];
    g_labels = w->words;
    float logits[N * V];
    qkv_model_keep_attention(m, 1);
    if ((s = qkv_model_forward(m, 1, N, HELLO, NULL, 0, logits, NULL)) != QKV_OK) {
        fail_status("forward", s);
        return -1;
    }
    w->model_attn = qkv_model_attention(m, 0); /* [1, H, N, N] */
    printf("\n   What it predicts after each word of \"Hello , I love you !\":\n  ");
    for (int i = 0; i < N - 1; i++) {
        int best = 0;
        double mx = -INFINITY, z = 0;
        for (int t = 0; t < V; t++)
            if (logits[i * V + t] > mx) {
                mx = logits[i * V + t];
                best = t;
            }
        for (int t = 0; t < V; t++) z += exp(logits[i * V + t] - mx);
        printf("  %s -> %s (%.2f)", w->words[i], VOCAB[best], 1.0 / z);
        if (i == 2) printf("\n  ");
    }
    printf("\n");
    return 0;
}

/* Step 2: the input I of the layer, from the trained parameters; the
 * positional encoding's picture. 0 or -1. */
static int step_embed(qkv_model *m, walk *w, const char *dir) {
    const float *emb = segment(m, "tok_emb.weight", V * E), *ln_w = segment(m, "layers.0.ln1.weight", E),
                *ln_b = segment(m, "layers.0.ln1.bias", E);
    w->attn_p = segment(m, "layers.0.attn.", 4 * E * E);
    if (!emb || !ln_w || !ln_b || !w->attn_p || !w->model_attn) {
        cli_error(CMD, NULL, NULL, "the model does not expose the parameters the demo reads");
        return -1;
    }
    float x[N * E], pe[N * E];
    qkv_posenc_sinusoidal(N, E, 0, pe);
    for (int i = 0; i < N; i++)
        for (int e = 0; e < E; e++) x[i * E + e] = emb[HELLO[i] * E + e] * sqrtf((float)E) + pe[i * E + e];
    layernorm(x, ln_w, ln_b, N, E, w->I);
    printf("\n2. Embedding. Each word becomes a vector: its learned embedding times sqrt(E)\n"
           "   plus its position's sinusoidal e^i; the layer normalises it (LayerNorm)\n"
           "   into the input I. (The articles draw vectors as columns; here each row is\n"
           "   one word.)\n");
    print_matrix("I", w->I, N, E, 0);
    return draw_positions(dir);
}

/* Step 3: q, k, v of every head from the layer's in_proj_weight. */
static void step_qkv(walk *w) {
    /* torch's layout: in_proj_weight [3E, E] (W_q, W_k, W_v stacked), then in_proj_bias [3E]. */
    const float *W_in = w->attn_p, *b_in = w->attn_p + 3 * E * E;
    for (int h = 0; h < H; h++) {
        project(w->I, N, E, W_in, b_in, h * DH, DH, w->q[h]);
        project(w->I, N, E, W_in, b_in, E + h * DH, DH, w->k[h]);
        project(w->I, N, E, W_in, b_in, 2 * E + h * DH, DH, w->v[h]);
    }
    printf("\n3. Query, key, value of head 0: q = I W_q^T + b_q, k = I W_k^T + b_k,\n"
           "   v = I W_v^T + b_v, where W_q, W_k, W_v are rows 0-%d, %d-%d and %d-%d of\n"
           "   the layer's learned in_proj_weight [3E, E] (torch's layout). Head h uses\n"
           "   the rows h*d .. h*d+d-1 of each.\n",
           DH - 1, E, E + DH - 1, 2 * E, 2 * E + DH - 1);
    print_matrix_rows("W_q of head 0 (learned)", W_in, DH, E, 0, 0);
    printf("\n");
    print_matrix("q", w->q[0], N, DH, 0);
    print_matrix("k", w->k[0], N, DH, 0);
    print_matrix("v", w->v[0], N, DH, 0);
}

/* A = q k^T / sqrt(d) (causal: -inf above the diagonal) and A' = softmax of
 * each row, for every head. */
static void scores_by_hand(walk *w) {
    const double scale = 1.0 / sqrt((double)DH);
    for (int h = 0; h < H; h++)
        for (int i = 0; i < N; i++) {
            double mx = -INFINITY, z = 0;
            for (int j = 0; j < N; j++) {
                double a = 0;
                for (int d = 0; d < DH; d++) a += (double)w->q[h][i * DH + d] * w->k[h][j * DH + d];
                w->A[h][i * N + j] = j <= i ? (float)(a * scale) : -INFINITY;
                if (j <= i && a * scale > mx) mx = a * scale;
            }
            for (int j = 0; j <= i; j++) z += exp(w->A[h][i * N + j] - mx);
            for (int j = 0; j < N; j++)
                w->Ap[h][i * N + j] = j <= i ? (float)(exp(w->A[h][i * N + j] - mx) / z) : 0.0f;
        }
}

/* Steps 4 to 6: the scores, the attention matrix (checked against the
 * model's), the output of head 0; A' printed and drawn. 0 or -1. */
static int step_attention(walk *w, const char *dir) {
    float O[N * DH];
    scores_by_hand(w);
    for (int i = 0; i < N; i++)
        for (int d = 0; d < DH; d++) {
            double acc = 0;
            for (int j = 0; j < N; j++) acc += (double)w->Ap[0][i * N + j] * w->v[0][j * DH + d];
            O[i * DH + d] = (float)acc;
        }
    printf("\n4. Scores A = q k^T / sqrt(d), d = %d: row i holds q^i . k^j for every word j.\n"
           "   The model is a decoder (causal): word i may only look at words j <= i,\n"
           "   so the rest is -inf.\n",
           DH);
    print_matrix("A", w->A[0], N, N, 1);
    printf("\n5. A' = softmax of each row: the attention matrix; each row sums to 1.\n");
    print_matrix("A'", w->Ap[0], N, N, 1);
    double diff = 0;
    for (int h = 0; h < H; h++)
        for (int i = 0; i < N * N; i++) {
            double d = fabs((double)w->Ap[h][i] - w->model_attn[h * N * N + i]);
            if (d > diff) diff = d;
        }
    printf("    (the attention the model itself computed, qkv_model_attention, agrees:\n"
           "     largest difference %.1e over both heads)\n",
           diff);
    print_strongest("head 0", w->Ap[0], N);
    printf("\n6. O = A' v: each word's output is the attention-weighted mix of the values.\n");
    print_matrix("O", O, N, DH, 0);

    qkv_heatmap hm = word_heatmap(w->Ap[0], N, w->words, "A' (head 0): row = query word, column = key word");
    if (print_heatmap(&hm) != 0) return -1;
    hm.title = "A' = softmax(q k^T / sqrt(d)), layer 0, head 0";
    return save_heatmap(dir, "attention.png", &hm);
}

/* Step 7: every head side by side, the layer's output checked against
 * qkv_mha_forward, and the heads' pictures. 0 or -1. */
static int step_heads(qkv_model *m, walk *w, const char *dir, qkv_mha **layer) {
    printf("\n7. Multi-head attention: each head has its own W_q, W_k, W_v (its slice of\n"
           "   in_proj_weight), so each can look for a different relation. Both heads of\n"
           "   layer 0:\n");
    const char *titles[H] = {"head 0", "head 1"};
    qkv_heatmap hh = word_heatmap(&w->Ap[0][0], N, w->words, NULL);
    hh.panels = H;
    hh.panel_titles = titles;
    if (!g_color) {
        print_matrix("A' head 1", w->Ap[1], N, N, 1);
    } else if (print_heatmap(&hh) != 0) {
        return -1;
    }
    for (int h = 0; h < H; h++) print_strongest(titles[h], w->Ap[h], N);
    if (check_layer(m, w->attn_p, w->I, w->Ap, w->v, layer) != 0) return -1;
    for (int h = 0; h < H; h++) {
        char name[64], title[96];
        snprintf(name, sizeof name, "attention_head%d.png", h);
        snprintf(title, sizeof title, "A', layer 0, head %d", h);
        qkv_heatmap one = word_heatmap(w->Ap[h], N, w->words, title);
        if (save_heatmap(dir, name, &one) != 0) return -1;
    }
    hh.title = "layer 0, every head";
    return save_heatmap(dir, "attention_heads.png", &hh);
}

/* Step 8: causal-window attention of head 0, printed and drawn. 0 or -1. */
static int step_window(const walk *w, const char *dir) {
    qkv_status s;
    qkv_attn_desc d;
    cli_attn_desc_single(&d, N, DH);
    d.mask = QKV_MASK_CAUSAL_WINDOW;
    d.window_left = 2;
    float out[N * DH], aw[N * N];
    if ((s = qkv_attention_forward(&d, w->q[0], w->k[0], w->v[0], out, aw, NULL)) != QKV_OK) {
        fail_status("qkv_attention_forward", s);
        return -1;
    }
    printf("\n8. Truncated self-attention (the second article's speech example): the same\n"
           "   q, k, v of head 0, but each word sees only itself and the 2 words before\n"
           "   it (qkv_attention_forward, mask causal-window, window_left = 2): cost\n"
           "   O(n r d) instead of O(n^2 d).\n");
    print_matrix("A' (window 2)", aw, N, N, 1);
    qkv_heatmap hw = word_heatmap(aw, N, w->words, "A' with a window of 2 (truncated)");
    if (print_heatmap(&hw) != 0) return -1;
    return save_heatmap(dir, "attention_window.png", &hw);
}

/* ---- the real model: a pretrained sentence encoder, when there is one ----- */

static const char DEFAULT_MODEL_DIR[] = "models/all-MiniLM-L6-v2";
static const char *const MODEL_SENTENCES[] = {"Hello, I love you!", "Hi, I miss you.", "The stock market fell today."};
enum { N_SENTENCES = sizeof MODEL_SENTENCES / sizeof MODEL_SENTENCES[0], MAX_PIECES = 64 };

static int encoder_failed(const char *model_dir, const char *what, const char *why) {
    cli_error(CMD, "--model", model_dir, "%s: %s", what, why);
    return -1;
}

/* The word pieces of the first sentence into pieces[*n]. 0 or -1. */
static int model_tokens(const qkv_encoder *enc, const char *model_dir, const char **pieces, int64_t *n) {
    const qkv_tokenizer *tok = qkv_encoder_tokenizer(enc);
    int32_t ids[MAX_PIECES];
    char why[512] = "";
    const char *text = MODEL_SENTENCES[0];
    if (qkv_tokenizer_encode(tok, text, strlen(text), NULL, 0, MAX_PIECES, ids, NULL, MAX_PIECES, n, why,
                             sizeof why) != QKV_OK)
        return encoder_failed(model_dir, "tokenizer", why);
    printf("   \"%s\" in the model's word pieces (qkv/text.h, WordPiece):\n     ", text);
    for (int64_t i = 0; i < *n; i++) {
        pieces[i] = qkv_tokenizer_token(tok, ids[i], NULL);
        printf(" %s", pieces[i] ? pieces[i] : "?");
    }
    printf("\n");
    return 0;
}

/* How much head h of an [heads, n, n] map looks at one other word: the mean,
 * over the words (the special tokens at both ends left out), of the largest
 * weight on another word. */
static double head_focus(const float *att, int64_t n, int64_t h) {
    double sum = 0;
    for (int64_t i = 1; i < n - 1; i++) {
        double best = 0;
        for (int64_t j = 1; j < n - 1; j++)
            if (j != i && att[(h * n + i) * n + j] > best) best = att[(h * n + i) * n + j];
        sum += best;
    }
    return n > 3 ? sum / (double)(n - 2) : 0.0;
}

/* The head of all layers that looks hardest at other words (head_focus)
 * into best [n, n], its layer and head into *layer and *head. 0 or -1. */
static int model_pick_head(qkv_encoder *enc, const char *model_dir, int64_t n, float *best, int64_t *layer,
                           int64_t *head) {
    qkv_encoder_info info;
    qkv_encoder_get_info(enc, &info);
    float *att = malloc((size_t)(info.heads * n * n) * sizeof *att);
    if (!att) return encoder_failed(model_dir, "attention", "out of memory");
    const char *text = MODEL_SENTENCES[0];
    double top = -1;
    char why[512] = "";
    for (int64_t l = 0; l < info.layers; l++) {
        int64_t got = 0;
        if (qkv_encoder_attention(enc, text, strlen(text), l, att, info.heads * n * n, &got, why, sizeof why) !=
                QKV_OK ||
            got != n) {
            free(att);
            return encoder_failed(model_dir, "attention", why[0] ? why : "token count differs");
        }
        for (int64_t h = 0; h < info.heads; h++) {
            double f = head_focus(att, n, h);
            if (f > top) {
                top = f;
                *layer = l;
                *head = h;
                memcpy(best, att + h * n * n, (size_t)(n * n) * sizeof *best);
            }
        }
    }
    free(att);
    return 0;
}

/* One head's attention over the word pieces: printed, drawn. 0 or -1. */
static int model_attention(qkv_encoder *enc, const char *model_dir, const char *dir, const char **pieces,
                           int64_t n) {
    float *a = malloc((size_t)(n * n) * sizeof *a);
    int64_t layer = 0, head = 0;
    if (!a) return encoder_failed(model_dir, "attention", "out of memory");
    if (model_pick_head(enc, model_dir, n, a, &layer, &head) != 0) {
        free(a);
        return -1;
    }
    printf("\n   Of every layer's heads (qkv_encoder_attention), the one whose words look\n"
           "   hardest at another word is layer %lld, head %lld:\n",
           (long long)layer, (long long)head);
    char title[96];
    snprintf(title, sizeof title, "pretrained model: layer %lld, head %lld", (long long)layer, (long long)head);
    qkv_heatmap hm = word_heatmap(a, n, pieces, title);
    g_labels = pieces;
    int rc = 0;
    if (g_color)
        rc = print_heatmap(&hm);
    else
        print_matrix("A'", a, n, n, 1);
    if (rc == 0) rc = save_heatmap(dir, "attention_model.png", &hm);
    free(a);
    return rc;
}

/* The cosine similarity of the sentences' vectors. 0 or -1. */
static int model_similarity(qkv_encoder *enc, const char *model_dir, int64_t hidden) {
    float *vec = malloc((size_t)(N_SENTENCES * hidden) * sizeof *vec);
    char why[512] = "";
    if (!vec) return encoder_failed(model_dir, "sentence vectors", "out of memory");
    if (qkv_encoder_embed(enc, MODEL_SENTENCES, NULL, N_SENTENCES, QKV_POOLING_FROM_MODEL, -1, vec, why,
                          sizeof why) != QKV_OK) {
        free(vec);
        return encoder_failed(model_dir, "sentence vectors", why);
    }
    printf("\n   Sentence vectors (qkv_encoder_embed), compared by cosine similarity:\n");
    for (int a = 0; a < N_SENTENCES; a++)
        for (int b = a + 1; b < N_SENTENCES; b++) {
            double ab = 0, aa = 0, bb = 0;
            for (int64_t e = 0; e < hidden; e++) {
                ab += (double)vec[a * hidden + e] * vec[b * hidden + e];
                aa += (double)vec[a * hidden + e] * vec[a * hidden + e];
                bb += (double)vec[b * hidden + e] * vec[b * hidden + e];
            }
            double cos = aa > 0 && bb > 0 ? ab / sqrt(aa * bb) : 0.0;
            printf("     %5.2f  \"%s\" ~ \"%s\"\n", fabs(cos) < 0.005 ? 0.0 : cos,
                   MODEL_SENTENCES[a], MODEL_SENTENCES[b]);
        }
    free(vec);
    return 0;
}

/* Step 9: the same ideas on the pretrained encoder in model_dir, or, when
 * it was not found there, how to fetch it. 0 or -1. */
static int step_real_model(const char *model_dir, int found, const char *dir) {
    if (!found) {
        printf("\n9. No pretrained model in %s: run scripts/fetch-model.sh, then the demo again.\n", model_dir);
        return 0;
    }
    qkv_encoder *enc = NULL;
    char why[512] = "";
    if (qkv_encoder_load(model_dir, NULL, &enc, why, sizeof why) != QKV_OK)
        return encoder_failed(model_dir, "cannot load the model", why);
    qkv_encoder_info info;
    qkv_encoder_get_info(enc, &info);
    printf("\n9. The same on a pretrained sentence encoder, run by qkv's attention\n"
           "   (qkv/encoder.h): %s, %lld layers of %lld heads, E = %lld.\n",
           model_dir, (long long)info.layers, (long long)info.heads, (long long)info.hidden);
    const char *pieces[MAX_PIECES];
    int64_t n = 0;
    int rc = model_tokens(enc, model_dir, pieces, &n);
    if (rc == 0) rc = model_attention(enc, model_dir, dir, pieces, n);
    if (rc == 0) rc = model_similarity(enc, model_dir, info.hidden);
    qkv_encoder_free(enc);
    return rc;
}

/* ---- the command --------------------------------------------------------------- */

typedef struct demo_opts {
    const char *dir;       /* --out */
    uint64_t seed;
    int64_t steps;
    const char *model_dir; /* the pretrained model's folder */
    int model_found;       /* whether it is there */
} demo_opts;

static int run(const demo_opts *o) {
    int rc = CLI_EXIT_FAIL;
    qkv_model *m = NULL;
    qkv_adamw *opt = NULL;
    qkv_mha *layer = NULL;
    double *losses = NULL;
    walk w;
    if ((rc = create_model(o->seed, &m, &opt)) != 0) goto done;
    rc = CLI_EXIT_FAIL;
    losses = malloc((size_t)o->steps * sizeof *losses);
    if (!losses) {
        cli_error(CMD, NULL, NULL, "out of memory");
        goto done;
    }
    if (step_train(m, opt, o->seed, o->steps, losses) != 0 || step_predict(m, &w) != 0 ||
        step_embed(m, &w, o->dir) != 0)
        goto done;
    step_qkv(&w);
    if (step_attention(&w, o->dir) != 0 || step_heads(m, &w, o->dir, &layer) != 0 || step_window(&w, o->dir) != 0 ||
        draw_loss(o->dir, losses, o->steps) != 0 || step_real_model(o->model_dir, o->model_found, o->dir) != 0)
        goto done;
    rc = CLI_EXIT_OK;
done:
    if (rc != CLI_EXIT_OK) remove_outputs();
    free(losses);
    qkv_mha_free(layer);
    qkv_adamw_free(opt);
    qkv_model_free(m);
    return rc;
}

/* --color WHEN into *color (-1 auto, 1 always, 0 never). 0, or -1 after printing why. */
static int parse_color(const char *value, int *color) {
    if (strcmp(value, "auto") == 0)
        *color = -1;
    else if (strcmp(value, "always") == 0)
        *color = 1;
    else if (strcmp(value, "never") == 0)
        *color = 0;
    else {
        cli_error(CMD, "--color", NULL, "'%s' is not auto, always or never", value);
        return -1;
    }
    return 0;
}

/* The terminal's colours: 24-bit when COLORTERM says so, else 256 when TERM
 * says so, else 24-bit. */
static qkv_ansi_colors terminal_colors(void) {
    const char *ct = getenv("COLORTERM"), *term = getenv("TERM");
    if (ct && (strstr(ct, "truecolor") || strstr(ct, "24bit"))) return QKV_ANSI_24BIT;
    return term && strstr(term, "256color") ? QKV_ANSI_256 : QKV_ANSI_24BIT;
}

static int is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* The pretrained model's folder into o: --model (which must be a folder),
 * else $QKV_MODEL_DIR, else DEFAULT_MODEL_DIR; those two may be missing.
 * 0, or -1 after printing why. */
static int resolve_model(const char *given, demo_opts *o) {
    if (given) {
        if (!given[0] || !is_dir(given)) {
            cli_error(CMD, "--model", given, "no such folder (scripts/fetch-model.sh downloads all-MiniLM-L6-v2)");
            return -1;
        }
        o->model_dir = given;
        o->model_found = 1;
        return 0;
    }
    const char *env = getenv("QKV_MODEL_DIR");
    o->model_dir = env && env[0] ? env : DEFAULT_MODEL_DIR;
    o->model_found = is_dir(o->model_dir);
    return 0;
}

/* The options into o and *color, *model. -1 to go on, or the exit status. */
static int parse_args(int argc, char **argv, demo_opts *o, int *color, const char **model) {
    int64_t v64;
    cli_args a = {CMD, argc, argv, 1, options, OPT_COUNT, OPT_HELP, help, NULL, 0};
    const char *name, *value;
    for (int id; (id = cli_scan(&a, &name, &value)) != CLI_END;) {
        if (id == CLI_STOP) return a.status;
        switch (id) {
        case OPT_OUT: o->dir = value; break;
        case OPT_MODEL: *model = value; break;
        case OPT_SEED:
            if (cli_parse_int64(CMD, "--seed", value, 0, INT64_MAX, &v64) != 0) goto usage;
            o->seed = (uint64_t)v64;
            break;
        case OPT_STEPS:
            if (cli_parse_int64(CMD, "--steps", value, 1, 1000000, &o->steps) != 0) goto usage;
            break;
        case OPT_COLOR:
            if (parse_color(value, color) != 0) goto usage;
            break;
        default: break;
        }
    }
    if (!o->dir[0]) {
        cli_error(CMD, "--out", NULL, "empty folder name");
        goto usage;
    }
    return -1;
usage:
    cli_usage_hint(CMD);
    return CLI_EXIT_USAGE;
}

int cli_cmd_demo(int argc, char **argv) {
    demo_opts o = {".", 1, 400, NULL, 0};
    int color = -1; /* auto */
    const char *model = NULL;
    int rc = parse_args(argc, argv, &o, &color, &model);
    if (rc >= 0) return rc;
    g_color = color < 0 ? isatty(STDOUT_FILENO) : color;
    g_colors = terminal_colors();
    if (resolve_model(model, &o) != 0 || cli_make_out_dir(CMD, o.dir) != 0) return CLI_EXIT_FAIL;
    rc = run(&o);
    fflush(stdout);
    return rc;
}
