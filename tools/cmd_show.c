/* qkv show: one input's attention in every layer and head, of a checkpoint
 * that qkv train wrote or of a pretrained BERT-family encoder.
 *
 *   qkv show --ckpt DIR --text "..." [--out DIR2] [--tokens auto|bytes|ints]
 *            [--color auto|always|never]
 *   qkv show --model DIR --text "..." [--out DIR2] [--layer L [--head H]]
 *            [--npy FILE] [--color auto|always|never]
 *
 * --ckpt loads DIR/model.safetensors (written by qkv train, or by any
 * program with qkv_model_save), runs the input through the model with its
 * attention kept (qkv_model_keep_attention) and draws each layer's and
 * head's A' as DIR2/show_l<l>_h<h>.png (DIR2 defaults to DIR) and, on a
 * colour terminal, as coloured blocks with the tokens on both axes.
 *
 * Tokens: the bytes of the text for models of text tasks (qkv train --task
 * text|mlm: token = byte value), space-separated integers for the generated
 * tasks (copy, reverse, sort, recall, label). A checkpoint without qkv
 * train's run metadata is read as bytes when its vocabulary has 256 or more
 * tokens, else as integers; --tokens overrides.
 *
 * --model loads a model directory (qkv/encoder.h: all-MiniLM-L6-v2,
 * bert-base-uncased, ...), cuts the text into its word pieces and takes
 * every layer's maps from qkv_encoder_attention (one call per layer). It
 * draws them as one grid (DIR2/show_layers.png: a row of maps per layer, a
 * column per head, the layers stacked inside each head's column with a
 * grey row between them), one picture per layer with its heads side by
 * side (show_l<l>.png), or, with --layer and --head, one large map
 * (show_l<l>_h<h>.png); DIR2 defaults to the current folder. --npy writes
 * all maps, float32 [layers, heads, n, n], in every build (also without
 * PNG, where the pictures are refused).
 *
 * Every map is computed before anything is written; each write is atomic
 * and a failure removes those already written. */
#define _POSIX_C_SOURCE 200809L /* isatty, mkdir, rmdir */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "cli_npy.h"
#include "cli_util.h"
#include "qkv.h"
#include "train_common.h"

#define CMD "show"
#define LABEL_LEN 32   /* a token's label, with its NUL (the pictures show 12 characters) */
#define MIN_LABEL_CELL 7 /* cells smaller than the font leave their labels out */

enum {
    OPT_HELP,
    OPT_CKPT,
    OPT_MODEL,
    OPT_TEXT,
    OPT_OUT,
    OPT_TOKENS,
    OPT_COLOR,
    OPT_LAYER,
    OPT_HEAD,
    OPT_NPY,
    OPT_COUNT
};

static const cli_opt options[OPT_COUNT] = {
    {"--help", "-h", 0, OPT_HELP},     {"--ckpt", NULL, 1, OPT_CKPT},   {"--model", NULL, 1, OPT_MODEL},
    {"--text", NULL, 1, OPT_TEXT},     {"--out", "-o", 1, OPT_OUT},     {"--tokens", NULL, 1, OPT_TOKENS},
    {"--color", NULL, 1, OPT_COLOR},   {"--layer", NULL, 1, OPT_LAYER}, {"--head", NULL, 1, OPT_HEAD},
    {"--npy", NULL, 1, OPT_NPY},
};

static void help(void) {
    fputs("Usage: qkv show --ckpt DIR --text TEXT [--out DIR2] [--tokens auto|bytes|ints]\n"
          "                [--color auto|always|never]\n"
          "       qkv show --model DIR --text TEXT [--out DIR2] [--layer L [--head H]]\n"
          "                [--npy FILE] [--color auto|always|never]\n"
          "\n"
          "Runs one input through a model and draws the attention A' of every layer\n"
          "and head (rows: queries, columns: keys, tokens on both axes).\n"
          "\n"
          "A checkpoint of qkv train (--ckpt): DIR2/show_l<l>_h<h>.png for every layer\n"
          "and head and, on a colour terminal, coloured blocks.\n"
          "\n"
          "A pretrained BERT-family encoder (--model, e.g. all-MiniLM-L6-v2), the text\n"
          "cut into its word pieces ([CLS] ... [SEP]):\n"
          "  DIR2/show_layers.png     every map in one grid: a row per layer, a column\n"
          "                           per head\n"
          "  DIR2/show_l<l>.png       each layer's heads side by side\n"
          "  with --layer L: only DIR2/show_l<L>.png; with --layer L --head H: only\n"
          "  one large map with its values, DIR2/show_l<L>_h<H>.png (and on a colour\n"
          "  terminal, coloured blocks)\n"
          "\n"
          "  --ckpt DIR      a checkpoint folder (DIR/model.safetensors, as qkv train\n"
          "                  writes it)\n"
          "  --model DIR     a model directory (config.json, model.safetensors,\n"
          "                  vocab.txt)\n"
          "  --text TEXT     the input: for --model, UTF-8 text (cut at the model's\n"
          "                  max length); for --ckpt, its bytes for models of text and\n"
          "                  mlm tasks, space-separated token numbers for the other\n"
          "                  tasks (\"3 1 4 1 5\"), at most the model's sequence length\n"
          "  -o, --out DIR2  where the pictures go (default: DIR for --ckpt, the\n"
          "                  current folder for --model); made if missing\n"
          "  --layer L       (--model) only layer L (0-based)\n"
          "  --head H        (--model, with --layer) only head H of layer L (0-based)\n"
          "  --npy FILE      (--model) also write all maps, float32\n"
          "                  [layers, heads, tokens, tokens]; works in builds without\n"
          "                  PNG, which write only this file\n"
          "  --tokens KIND   (--ckpt) auto (default: from the checkpoint's task; without\n"
          "                  one, bytes when the vocabulary has >= 256 tokens), bytes, ints\n"
          "  --color WHEN    terminal heatmaps: auto (when stdout is a terminal),\n"
          "                  always, never\n"
          "  -h, --help      show this help and exit\n"
          "\n"
          "Every file written is printed (\"wrote PATH\").\n"
          "Exit status: 0 success, 1 failure (bad model or input, a layer or head out\n"
          "of range, failed write; nothing is left behind), 2 usage error.\n"
          "\n"
          "Examples:\n"
          "  qkv train --task text notes.txt --steps 500 --out run\n"
          "  qkv show --ckpt run --text \"self-attention\"\n"
          "  qkv show --model models/all-MiniLM-L6-v2 --text \"Hello, I love you!\" -o pics\n"
          "  qkv show --model models/all-MiniLM-L6-v2 --text \"Hello, I love you!\" \\\n"
          "           --layer 2 --head 5 --out pics\n",
          stdout);
}

static int usage(const char *opt, const char *msg, const char *value) {
    cli_error(CMD, opt, NULL, msg, value);
    cli_usage_hint(CMD);
    return CLI_EXIT_USAGE;
}

typedef struct show_args {
    const char *ckpt, *model, *text, *out, *npy;
    int color, tokens_kind; /* tokens_kind: 0 auto, 1 bytes, 2 ints */
    int has_layer, has_head;
    int64_t layer, head;
} show_args;

/* ---- the files written so far, removed again if a later step fails -------- */

typedef struct outputs {
    char (*paths)[4096];
    int64_t n, cap;
    const char *folder; /* the --out folder when this run made it, else NULL */
} outputs;

static int outputs_init(outputs *o, int64_t cap) {
    memset(o, 0, sizeof *o);
    o->paths = malloc((size_t)cap * sizeof *o->paths);
    o->cap = cap;
    if (!o->paths) cli_error(CMD, NULL, NULL, "out of memory");
    return o->paths ? 0 : -1;
}

static void outputs_undo(outputs *o) {
    for (int64_t i = 0; i < o->n; i++)
        if (unlink(o->paths[i]) == 0)
            fprintf(stderr, "qkv %s: removed %s (written by this run before the failure)\n", CMD, o->paths[i]);
    o->n = 0;
    if (o->folder) rmdir(o->folder);
}

/* The --out folder, made if it does not exist (then recorded in o, so that
 * a failed run removes it). 0, or -1 after printing why. */
static int make_folder(outputs *o, const char *out) {
    struct stat sb;
    int existed = stat(out, &sb) == 0;
    if (cli_make_out_dir(CMD, out) != 0) return -1;
    if (!existed) o->folder = out;
    return 0;
}

/* Draw hm as DIR/name (recorded in o) and say so. 0, or -1 after printing why. */
static int save_picture(outputs *o, const char *dir, const char *name, const qkv_heatmap *hm) {
    if (o->n == o->cap) {
        cli_error(CMD, NULL, NULL, "too many pictures");
        return -1;
    }
    char *path = o->paths[o->n];
    if (snprintf(path, sizeof o->paths[0], "%s/%s", dir, name) >= (int)sizeof o->paths[0]) {
        cli_error(CMD, "--out", dir, "path too long");
        return -1;
    }
    errno = 0;
    qkv_status s = qkv_heatmap_save_png(path, hm);
    if (s != QKV_OK) {
        cli_error(CMD, "--out", path, "cannot write the picture: %s%s%s%s", qkv_status_string(s),
                  errno ? ": " : "", errno ? strerror(errno) : "",
                  s == QKV_ERR_SIZE_OVERFLOW ? " (too many tokens to draw; --npy writes the maps)" : "");
        return -1;
    }
    o->n++;
    printf("wrote %s\n", path);
    return 0;
}

/* ---- --ckpt: a checkpoint of qkv train ------------------------------------ */

/* A byte as a short label: itself when printable, "_" for a space, \n, \t,
 * or xNN. */
static void byte_label(int b, char *out, size_t cap) {
    if (b == ' ')
        snprintf(out, cap, "_");
    else if (b == '\n')
        snprintf(out, cap, "\\n");
    else if (b == '\t')
        snprintf(out, cap, "\\t");
    else if (b > 32 && b < 127)
        snprintf(out, cap, "%c", b);
    else
        snprintf(out, cap, "x%02X", b & 0xFF);
}

/* The tokens of --text (bytes for kind 1, else integers separated by
 * spaces) into tok and their labels; their count, or -1 after printing why. */
static int64_t tokenize(const char *text, int kind, int64_t vocab, int64_t cap, int32_t *tok,
                        char (*labels)[LABEL_LEN]) {
    if (kind == 1 && vocab < 256) {
        cli_error(CMD, "--text", NULL, "the model has %lld tokens, too few for bytes (use --tokens ints)",
                  (long long)vocab);
        return -1;
    }
    int64_t n = train_parse_tokens(CMD, "--text", kind == 1, vocab, text, tok, cap);
    if (n == 0) {
        cli_error(CMD, "--text", NULL, "no tokens in '%s'", text);
        return -1;
    }
    for (int64_t i = 0; i < n; i++) {
        if (kind == 1)
            byte_label(tok[i], labels[i], sizeof labels[i]);
        else
            snprintf(labels[i], sizeof labels[i], "%d", (int)tok[i]);
    }
    return n;
}

/* Every head of every layer of the model after its forward, as pictures
 * (and terminal heatmaps when color). 0, or -1 after printing why. */
static int draw_ckpt(qkv_model *m, const qkv_model_config *cfg, int64_t n, const char *const *labels,
                     const char *out, int color, outputs *o) {
    for (int64_t l = 0; l < cfg->layers; l++) {
        const float *attn = qkv_model_attention(m, l); /* [1, H, n, n] */
        if (!attn) {
            cli_error(CMD, NULL, NULL, "the model kept no attention for layer %lld", (long long)l);
            return -1;
        }
        for (int64_t h = 0; h < cfg->heads; h++) {
            char title[96], name[64];
            snprintf(title, sizeof title, "layer %lld, head %lld", (long long)l, (long long)h);
            snprintf(name, sizeof name, "show_l%lld_h%lld.png", (long long)l, (long long)h);
            qkv_heatmap hm;
            qkv_heatmap_init(&hm, attn + h * n * n, n, n);
            hm.row_labels = labels;
            hm.col_labels = labels;
            hm.title = title;
            hm.vmin = 0.0;
            hm.vmax = 1.0;
            hm.show_values = n <= 12;
            if (color && cli_print_heatmap(CMD, &hm, QKV_ANSI_24BIT) != 0) return -1;
            if (save_picture(o, out, name, &hm) != 0) return -1;
        }
    }
    return 0;
}

static int show_ckpt(const show_args *a) {
    const char *out = a->out ? a->out : a->ckpt;
    int rc = CLI_EXIT_FAIL, tokens_kind = a->tokens_kind;
    qkv_safetensors *st = NULL;
    qkv_model *m = NULL;
    int32_t *tok = NULL;
    char (*labels)[LABEL_LEN] = NULL;
    const char **label_ptrs = NULL;
    outputs o = {0};
    char path[4096], why[512] = "";
    qkv_status s;

    if (snprintf(path, sizeof path, "%s/%s", a->ckpt, TRAIN_CKPT_FILE) >= (int)sizeof path) {
        cli_error(CMD, "--ckpt", a->ckpt, "path too long");
        return CLI_EXIT_FAIL;
    }
    qkv_model_config cfg;
    if ((s = qkv_safetensors_load(path, &st, why, sizeof why)) != QKV_OK ||
        (s = qkv_model_config_from(st, &cfg, why, sizeof why)) != QKV_OK ||
        (s = qkv_model_create(&cfg, 0, &m)) != QKV_OK || (s = qkv_model_load(m, st, why, sizeof why)) != QKV_OK) {
        cli_error(CMD, "--ckpt", path, "%s", why[0] ? why : qkv_status_string(s));
        goto done;
    }
    const char *task = qkv_safetensors_get_meta(st, "run.task");
    if (tokens_kind == 0)
        tokens_kind = task ? (strcmp(task, "text") == 0 || strcmp(task, "mlm") == 0 ? 1 : 2)
                           : (cfg.vocab >= 256 ? 1 : 2);
    const int64_t cap = cfg.max_seq;
    tok = malloc((size_t)cap * sizeof *tok);
    labels = malloc((size_t)cap * sizeof *labels);
    label_ptrs = malloc((size_t)cap * sizeof *label_ptrs);
    if (!tok || !labels || !label_ptrs) {
        cli_error(CMD, NULL, NULL, "out of memory");
        goto done;
    }
    if (outputs_init(&o, cfg.layers * cfg.heads) != 0) goto done;
    int64_t n = tokenize(a->text, tokens_kind, cfg.vocab, cap, tok, labels);
    if (n < 0) goto done;
    for (int64_t i = 0; i < n; i++) label_ptrs[i] = labels[i];
    if ((s = qkv_model_keep_attention(m, 1)) != QKV_OK ||
        (s = qkv_model_forward(m, 1, n, tok, NULL, 0, NULL, NULL)) != QKV_OK) {
        cli_error(CMD, NULL, NULL, "forward: %s", qkv_status_string(s));
        goto done;
    }
    if (make_folder(&o, out) != 0) goto done;
    printf("%s: %lld layers x %lld heads, %s, %lld tokens%s%s\n", path, (long long)cfg.layers,
           (long long)cfg.heads, cfg.causal ? "decoder (causal)" : "encoder", (long long)n,
           task ? ", task " : "", task ? task : "");
    if (draw_ckpt(m, &cfg, n, label_ptrs, out, a->color, &o) != 0) goto done;
    rc = CLI_EXIT_OK;
done:
    if (rc != CLI_EXIT_OK) outputs_undo(&o);
    free(o.paths);
    free(tok);
    free(labels);
    free(label_ptrs);
    qkv_model_free(m);
    qkv_safetensors_free(st);
    fflush(stdout);
    return rc;
}

/* ---- --model: a pretrained encoder ---------------------------------------- */

/* Every layer's maps of one text, and what the pictures label them with. */
typedef struct model_maps {
    int64_t layers, heads, n;
    cli_file npy;                     /* a.data: float32 [layers, heads, n, n] */
    char (*labels)[LABEL_LEN];        /* [n] the word pieces */
    const char **tokens, **blanks;    /* [n] pointers to them, and to "" */
    char (*head_names)[32];           /* [heads] "head h" */
    const char **head_ptrs;           /* [heads] */
} model_maps;

static void maps_free(model_maps *mm) {
    cli_files_free(&mm->npy, 1);
    free(mm->labels);
    free(mm->tokens);
    free(mm->blanks);
    free(mm->head_names);
    free(mm->head_ptrs);
}

/* The text's word pieces (at most the model's max length) as labels, in
 * newly allocated arrays of mm; mm->n is their count. 0, or -1 after
 * printing why (invalid UTF-8 among others). */
static int word_pieces(const qkv_encoder *enc, const qkv_encoder_info *info, const char *text, model_maps *mm) {
    const qkv_tokenizer *tk = qkv_encoder_tokenizer(enc);
    const size_t len = strlen(text);
    char why[512] = "";
    int64_t full = 0, n = 0;
    qkv_status s = qkv_tokenizer_encode(tk, text, len, NULL, 0, 0, NULL, NULL, 0, &full, why, sizeof why);
    if (s != QKV_OK && s != QKV_ERR_BAD_SIZE) { /* BAD_SIZE: capacity 0 asks for the count */
        cli_error(CMD, "--text", NULL, "%s", why[0] ? why : qkv_status_string(s));
        return -1;
    }
    const int64_t cap = full < info->max_length ? full : info->max_length;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    mm->labels = malloc((size_t)cap * sizeof *mm->labels);
    mm->tokens = malloc((size_t)cap * sizeof *mm->tokens);
    mm->blanks = malloc((size_t)cap * sizeof *mm->blanks);
    if (!ids || !mm->labels || !mm->tokens || !mm->blanks) {
        free(ids);
        cli_error(CMD, NULL, NULL, "out of memory");
        return -1;
    }
    s = qkv_tokenizer_encode(tk, text, len, NULL, 0, info->max_length, ids, NULL, cap, &n, why, sizeof why);
    if (s != QKV_OK) {
        free(ids);
        cli_error(CMD, "--text", NULL, "%s", why[0] ? why : qkv_status_string(s));
        return -1;
    }
    if (full > n)
        fprintf(stderr, "qkv %s: --text: %lld word pieces, cut to the model's %lld\n", CMD, (long long)full,
                (long long)n);
    for (int64_t i = 0; i < n; i++) {
        const char *piece = qkv_tokenizer_token(tk, ids[i], NULL);
        snprintf(mm->labels[i], sizeof mm->labels[i], "%s", piece ? piece : "?");
        mm->tokens[i] = mm->labels[i];
        mm->blanks[i] = "";
    }
    free(ids);
    mm->n = n;
    return 0;
}

/* Every layer's maps into mm (qkv_encoder_attention once per layer) and the
 * heads' names. 0, or -1 after printing why. */
static int compute_maps(qkv_encoder *enc, const char *text, const char *npy_path, model_maps *mm) {
    qkv_encoder_info info;
    qkv_encoder_get_info(enc, &info);
    mm->layers = info.layers;
    mm->heads = info.heads;
    if (word_pieces(enc, &info, text, mm) != 0) return -1;
    const int64_t n = mm->n, per_layer = info.heads * n * n;
    const int64_t shape[4] = {info.layers, info.heads, n, n};
    mm->npy.opt = "--npy";
    mm->npy.path = npy_path; /* NULL: computed for the pictures, not written */
    if (cli_file_alloc(CMD, &mm->npy, "--npy", QKV_F32, 4, shape, "the attention maps") != 0) return -1;
    float *maps = mm->npy.a.data;
    for (int64_t l = 0; l < info.layers; l++) {
        char why[512] = "";
        int64_t got = 0;
        qkv_status s = qkv_encoder_attention(enc, text, strlen(text), l, maps + l * per_layer, per_layer, &got, why,
                                             sizeof why);
        if (s == QKV_OK && got != n) {
            s = QKV_ERR_SHAPE;
            snprintf(why, sizeof why, "%lld tokens, the tokenizer gave %lld", (long long)got, (long long)n);
        }
        if (s != QKV_OK) {
            cli_error(CMD, NULL, NULL, "attention of layer %lld: %s", (long long)l, why[0] ? why : qkv_status_string(s));
            return -1;
        }
    }
    mm->head_names = malloc((size_t)info.heads * sizeof *mm->head_names);
    mm->head_ptrs = malloc((size_t)info.heads * sizeof *mm->head_ptrs);
    if (!mm->head_names || !mm->head_ptrs) {
        cli_error(CMD, NULL, NULL, "out of memory");
        return -1;
    }
    for (int64_t h = 0; h < info.heads; h++) {
        snprintf(mm->head_names[h], sizeof mm->head_names[h], "head %lld", (long long)h);
        mm->head_ptrs[h] = mm->head_names[h];
    }
    return 0;
}

/* A cell side in pixels: about `target` pixels per map, clamped to
 * [2, most], and small enough that `count` cells fit on a 16000-pixel side. */
static int64_t cell_size(int64_t n, int64_t target, int64_t most, int64_t count) {
    int64_t cell = target / n;
    if (cell > most) cell = most;
    if (count > 0 && cell > 15000 / count) cell = 15000 / count;
    return cell < 2 ? 2 : cell;
}

/* Text for a title: "TEXT" cut to 40 bytes. */
static void quoted(char *buf, size_t cap, const char *text) {
    snprintf(buf, cap, strlen(text) > 40 ? "\"%.37s...\"" : "\"%s\"", text);
}

/* All maps in one picture: a panel per head, its layers stacked top to
 * bottom, each under a grey (NaN) row labelled "layer l". 0 or -1. */
static int draw_grid(const model_maps *mm, const char *text, const char *out, outputs *o) {
    const int64_t L = mm->layers, H = mm->heads, n = mm->n, R = L * (n + 1);
    if (R > 4096) {
        cli_error(CMD, "--text", NULL, "%lld layers of %lld tokens are too many rows for one grid (at most 4096); "
                  "use --layer", (long long)L, (long long)n);
        return -1;
    }
    float *v = malloc((size_t)(H * R * n) * sizeof *v);
    const char **rows = malloc((size_t)R * sizeof *rows);
    char (*names)[32] = malloc((size_t)L * sizeof *names);
    if (!v || !rows || !names) {
        free(v), free(rows), free(names);
        cli_error(CMD, NULL, NULL, "out of memory");
        return -1;
    }
    const int64_t cell = cell_size(n, 128, 16, R > H * n ? R : H * n);
    const char *const *tokens = cell >= MIN_LABEL_CELL ? mm->tokens : mm->blanks;
    const float *maps = mm->npy.a.data;
    for (int64_t l = 0; l < L; l++) {
        snprintf(names[l], sizeof names[l], "layer %lld", (long long)l);
        rows[l * (n + 1)] = names[l];
        for (int64_t i = 0; i < n; i++) rows[l * (n + 1) + 1 + i] = tokens[i];
        for (int64_t h = 0; h < H; h++) {
            float *dst = v + (h * R + l * (n + 1)) * n;
            for (int64_t j = 0; j < n; j++) dst[j] = (float)NAN;
            memcpy(dst + n, maps + ((l * H + h) * n) * n, (size_t)(n * n) * sizeof *dst);
        }
    }
    char title[160], q[64];
    quoted(q, sizeof q, text);
    snprintf(title, sizeof title, "%s: %lld layers (down) x %lld heads (across)", q, (long long)L, (long long)H);
    qkv_heatmap hm;
    qkv_heatmap_init(&hm, v, R, n);
    hm.panels = H;
    hm.row_labels = rows;
    hm.col_labels = tokens;
    hm.panel_titles = mm->head_ptrs;
    hm.title = title;
    hm.vmin = 0.0;
    hm.vmax = 1.0;
    hm.cell = cell;
    int rc = save_picture(o, out, "show_layers.png", &hm);
    free(v), free(rows), free(names);
    return rc;
}

/* Layer l's heads side by side, or with head >= 0 that one map alone (large,
 * with its values, on the terminal too when color). 0 or -1. */
static int draw_layer(const model_maps *mm, const char *text, int64_t l, int64_t head, int color, const char *out,
                      outputs *o) {
    const int64_t n = mm->n, H = mm->heads;
    const float *maps = (const float *)mm->npy.a.data + l * H * n * n;
    char title[160], q[64], name[64];
    quoted(q, sizeof q, text);
    qkv_heatmap hm;
    if (head < 0) {
        qkv_heatmap_init(&hm, maps, n, n);
        hm.panels = H;
        hm.panel_titles = mm->head_ptrs;
        hm.cell = cell_size(n, 240, 32, H * n);
        snprintf(title, sizeof title, "layer %lld: %s", (long long)l, q);
        snprintf(name, sizeof name, "show_l%lld.png", (long long)l);
    } else {
        qkv_heatmap_init(&hm, maps + head * n * n, n, n);
        hm.cell = cell_size(n, 480, 48, n);
        hm.show_values = 1; /* where the values fit in their cells */
        snprintf(title, sizeof title, "layer %lld, head %lld: %s", (long long)l, (long long)head, q);
        snprintf(name, sizeof name, "show_l%lld_h%lld.png", (long long)l, (long long)head);
    }
    hm.row_labels = hm.cell >= MIN_LABEL_CELL ? mm->tokens : mm->blanks;
    hm.col_labels = hm.row_labels;
    hm.title = title;
    hm.vmin = 0.0;
    hm.vmax = 1.0;
    if (head >= 0 && color) {
        hm.row_labels = hm.col_labels = mm->tokens;
        if (cli_print_heatmap(CMD, &hm, QKV_ANSI_24BIT) != 0) return -1;
        hm.row_labels = hm.col_labels = hm.cell >= MIN_LABEL_CELL ? mm->tokens : mm->blanks;
    }
    return save_picture(o, out, name, &hm);
}

/* The pictures --layer and --head ask for. 0 or -1. */
static int draw_model(const model_maps *mm, const show_args *a, const char *out, outputs *o) {
    if (a->has_layer) return draw_layer(mm, a->text, a->layer, a->has_head ? a->head : -1, a->color, out, o);
    if (draw_grid(mm, a->text, out, o) != 0) return -1;
    for (int64_t l = 0; l < mm->layers; l++)
        if (draw_layer(mm, a->text, l, -1, 0, out, o) != 0) return -1;
    return 0;
}

/* --layer and --head within the model's sizes? 0, or -1 after printing why. */
static int check_selection(const show_args *a, const qkv_encoder_info *info) {
    if (a->has_layer && (a->layer < 0 || a->layer >= info->layers)) {
        cli_error(CMD, "--layer", NULL, "%lld is out of range: the model's layers are 0..%lld", (long long)a->layer,
                  (long long)info->layers - 1);
        return -1;
    }
    if (a->has_head && (a->head < 0 || a->head >= info->heads)) {
        cli_error(CMD, "--head", NULL, "%lld is out of range: the model's heads are 0..%lld", (long long)a->head,
                  (long long)info->heads - 1);
        return -1;
    }
    return 0;
}

static int show_model(const show_args *a) {
    const int draw = QKV_WITH_PNG;
    if (!draw && !a->npy) {
        cli_error(CMD, NULL, NULL, "drawing pictures is not supported by this build (built without PNG); "
                  "--npy FILE writes the maps");
        return CLI_EXIT_FAIL;
    }
    const char *out = a->out ? a->out : ".";
    int rc = CLI_EXIT_FAIL;
    qkv_encoder *enc = NULL;
    model_maps mm;
    memset(&mm, 0, sizeof mm);
    outputs o = {0};
    char why[512] = "";
    qkv_status s = qkv_encoder_load(a->model, NULL, &enc, why, sizeof why);
    if (s != QKV_OK) {
        cli_error(CMD, "--model", a->model, "%s", why[0] ? why : qkv_status_string(s));
        return CLI_EXIT_FAIL;
    }
    qkv_encoder_info info;
    qkv_encoder_get_info(enc, &info);
    if (check_selection(a, &info) != 0 || compute_maps(enc, a->text, a->npy, &mm) != 0) goto done;
    if (outputs_init(&o, info.layers + 1) != 0) goto done;
    printf("%s: %lld layers x %lld heads, %lld word pieces:", a->model, (long long)info.layers,
           (long long)info.heads, (long long)mm.n);
    for (int64_t i = 0; i < mm.n; i++) printf(" %s", mm.labels[i]);
    printf("\n");
    if (draw) {
        if (make_folder(&o, out) != 0 || draw_model(&mm, a, out, &o) != 0) goto done;
    } else {
        fprintf(stderr, "qkv %s: pictures are not supported by this build (built without PNG): only --npy\n", CMD);
    }
    if (mm.npy.path) {
        if (cli_files_write(CMD, &mm.npy, 1) != 0) goto done;
        printf("wrote %s\n", mm.npy.path);
    }
    rc = CLI_EXIT_OK;
done:
    if (rc != CLI_EXIT_OK) outputs_undo(&o);
    free(o.paths);
    maps_free(&mm);
    qkv_encoder_free(enc);
    fflush(stdout);
    return rc;
}

/* ---- options ---------------------------------------------------------------- */

/* The options into *a. CLI_EXIT_OK to go on, else the exit status (after
 * --help or a usage error). */
static int parse_args(int argc, char **argv, show_args *a) {
    memset(a, 0, sizeof *a);
    a->color = -1;
    int given[OPT_COUNT] = {0};
    cli_args c = {CMD, argc, argv, 1, options, OPT_COUNT, OPT_HELP, help, given, 0};
    const char *name, *value;
    const char **text_of[OPT_COUNT] = {[OPT_CKPT] = &a->ckpt, [OPT_MODEL] = &a->model, [OPT_TEXT] = &a->text,
                                       [OPT_OUT] = &a->out, [OPT_NPY] = &a->npy};
    for (int id; (id = cli_scan(&c, &name, &value)) != CLI_END;) {
        if (id == CLI_STOP) return c.status == CLI_EXIT_OK ? -1 : c.status;
        if (id >= 0 && id < OPT_COUNT && text_of[id]) {
            *text_of[id] = value;
            continue;
        }
        switch (id) {
        case OPT_LAYER:
        case OPT_HEAD:
            if (cli_parse_int64(CMD, name, value, INT32_MIN, INT32_MAX, id == OPT_LAYER ? &a->layer : &a->head) != 0) {
                cli_usage_hint(CMD);
                return CLI_EXIT_USAGE;
            }
            break;
        case OPT_TOKENS:
            if (strcmp(value, "auto") == 0) a->tokens_kind = 0;
            else if (strcmp(value, "bytes") == 0) a->tokens_kind = 1;
            else if (strcmp(value, "ints") == 0) a->tokens_kind = 2;
            else return usage("--tokens", "'%s' is not auto, bytes or ints", value);
            break;
        case OPT_COLOR:
            if (strcmp(value, "auto") == 0) a->color = -1;
            else if (strcmp(value, "always") == 0) a->color = 1;
            else if (strcmp(value, "never") == 0) a->color = 0;
            else return usage("--color", "'%s' is not auto, always or never", value);
            break;
        default: break;
        }
    }
    if (a->ckpt && a->model) return usage("--model", "%s", "give --ckpt or --model, not both");
    if (!a->ckpt && !a->model) return usage("--ckpt", "%s", "a checkpoint (--ckpt) or a model (--model) is required");
    if (!a->text) return usage("--text", "%s", "the input is required");
    if (!a->text[0]) return usage("--text", "%s", "the input is empty");
    if (a->out && !a->out[0]) return usage("--out", "%s", "empty folder name");
    if (a->npy && !a->npy[0]) return usage("--npy", "%s", "empty file name");
    if (a->ckpt && (given[OPT_LAYER] || given[OPT_HEAD] || a->npy))
        return usage(given[OPT_LAYER] ? "--layer" : given[OPT_HEAD] ? "--head" : "--npy", "%s",
                     "applies to --model only");
    if (a->model && given[OPT_TOKENS]) return usage("--tokens", "%s", "applies to --ckpt only");
    if (given[OPT_HEAD] && !given[OPT_LAYER]) return usage("--head", "%s", "needs --layer (the head of which layer?)");
    if (a->color < 0) a->color = isatty(STDOUT_FILENO);
    a->has_layer = given[OPT_LAYER];
    a->has_head = given[OPT_HEAD];
    return CLI_EXIT_OK;
}

int cli_cmd_show(int argc, char **argv) {
    show_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc != CLI_EXIT_OK) return rc < 0 ? CLI_EXIT_OK : rc;
    return a.model ? show_model(&a) : show_ckpt(&a);
}
