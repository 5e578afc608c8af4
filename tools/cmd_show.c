/* qkv show: one input's attention in every layer and head of a checkpoint.
 *
 *   qkv show --ckpt DIR --text "..." [--out DIR2] [--tokens auto|bytes|ints]
 *            [--color auto|always|never]
 *
 * Loads DIR/model.safetensors (written by qkv train, or by any program with
 * qkv_model_save), runs the input through the model with its attention kept
 * (qkv_model_keep_attention) and draws each layer's and head's A' as
 * DIR2/show_l<l>_h<h>.png (DIR2 defaults to DIR) and, on a colour terminal,
 * as coloured blocks with the tokens on both axes.
 *
 * Tokens: the bytes of the text for models of text tasks (qkv train --task
 * text|mlm: token = byte value), space-separated integers for the generated
 * tasks (copy, reverse, sort, recall, label). A checkpoint without qkv
 * train's run metadata is read as bytes when its vocabulary has 256 or more
 * tokens, else as integers; --tokens overrides.
 *
 * The attention of every layer is computed before any picture is written;
 * each write is atomic and a failure removes those already written. */
#define _POSIX_C_SOURCE 200809L /* isatty, mkdir */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "cli_util.h"
#include "qkv.h"
#include "train_common.h"

#define CMD "show"

enum { OPT_HELP, OPT_CKPT, OPT_TEXT, OPT_OUT, OPT_TOKENS, OPT_COLOR, OPT_COUNT };

static const cli_opt options[OPT_COUNT] = {
    {"--help", "-h", 0, OPT_HELP},  {"--ckpt", NULL, 1, OPT_CKPT},     {"--text", NULL, 1, OPT_TEXT},
    {"--out", "-o", 1, OPT_OUT},    {"--tokens", NULL, 1, OPT_TOKENS}, {"--color", NULL, 1, OPT_COLOR},
};

static void help(void) {
    fputs("Usage: qkv show --ckpt DIR --text TEXT [--out DIR2] [--tokens auto|bytes|ints]\n"
          "                [--color auto|always|never]\n"
          "\n"
          "Runs one input through a trained model and draws the attention A' of every\n"
          "layer and head: DIR2/show_l<l>_h<h>.png (rows: queries, columns: keys,\n"
          "tokens on both axes) and, on a colour terminal, coloured blocks.\n"
          "\n"
          "  --ckpt DIR      a checkpoint folder (DIR/model.safetensors, as qkv train\n"
          "                  writes it)\n"
          "  --text TEXT     the input: its bytes for models of text and mlm tasks,\n"
          "                  space-separated token numbers for the other tasks\n"
          "                  (\"3 1 4 1 5\"); at most the model's sequence length\n"
          "  -o, --out DIR2  where the pictures go (default: DIR)\n"
          "  --tokens KIND   auto (default: from the checkpoint's task; without one,\n"
          "                  bytes when the vocabulary has >= 256 tokens), bytes, ints\n"
          "  --color WHEN    terminal heatmaps: auto (when stdout is a terminal),\n"
          "                  always, never\n"
          "  -h, --help      show this help and exit\n"
          "\n"
          "Exit status: 0 success, 1 failure (bad checkpoint or input, failed write;\n"
          "no picture is left behind), 2 usage error.\n"
          "\n"
          "Example:\n"
          "  qkv train --task text notes.txt --steps 500 --out run\n"
          "  qkv show --ckpt run --text \"self-attention\"\n",
          stdout);
}

static int usage(const char *opt, const char *msg, const char *value) {
    cli_error(CMD, opt, NULL, msg, value);
    cli_usage_hint(CMD);
    return CLI_EXIT_USAGE;
}

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
                        char (*labels)[24]) {
    int64_t n = 0;
    if (kind == 1) {
        if (vocab < 256) {
            cli_error(CMD, "--text", NULL, "the model has %lld tokens, too few for bytes (use --tokens ints)",
                      (long long)vocab);
            return -1;
        }
        for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
            if (n == cap) {
                cli_error(CMD, "--text", NULL, "longer than the model's %lld positions", (long long)cap);
                return -1;
            }
            byte_label(*p, labels[n], sizeof labels[n]);
            tok[n++] = *p;
        }
    } else {
        for (const char *p = text; *p;) {
            while (*p == ' ') p++;
            if (!*p) break;
            char *end;
            errno = 0;
            long long v = strtoll(p, &end, 10);
            if (end == p || errno || v < 0 || v >= vocab || (*end && *end != ' ')) {
                cli_error(CMD, "--text", NULL, "'%s': tokens are integers 0..%lld separated by spaces", text,
                          (long long)vocab - 1);
                return -1;
            }
            if (n == cap) {
                cli_error(CMD, "--text", NULL, "longer than the model's %lld positions", (long long)cap);
                return -1;
            }
            snprintf(labels[n], sizeof labels[n], "%lld", v);
            tok[n++] = (int32_t)v;
            p = end;
        }
        if (n == 0) {
            cli_error(CMD, "--text", NULL, "no tokens in '%s'", text);
            return -1;
        }
    }
    return n;
}

/* The --out folder, made if it does not exist. 0, or -1 after printing why. */
static int make_folder(const char *out) {
    struct stat sb;
    if (stat(out, &sb) != 0) {
        if (mkdir(out, 0777) != 0) {
            cli_error(CMD, "--out", out, "cannot create the folder: %s", strerror(errno));
            return -1;
        }
    } else if (!S_ISDIR(sb.st_mode)) {
        cli_error(CMD, "--out", out, "not a folder");
        return -1;
    }
    return 0;
}

/* The heatmap in 24-bit colour on the terminal. 0, or -1 after printing why. */
static int print_ansi(const qkv_heatmap *hm) {
    size_t len = 0;
    char *buf = NULL;
    qkv_status s = qkv_heatmap_format_ansi(hm, QKV_ANSI_24BIT, NULL, 0, &len);
    if (s == QKV_OK && (buf = malloc(len + 1)) != NULL)
        s = qkv_heatmap_format_ansi(hm, QKV_ANSI_24BIT, buf, len + 1, &len);
    if (s != QKV_OK || !buf) {
        free(buf);
        cli_error(CMD, NULL, NULL, "terminal heatmap: %s", buf ? qkv_status_string(s) : "out of memory");
        return -1;
    }
    printf("\n");
    fputs(buf, stdout);
    free(buf);
    return 0;
}

int cli_cmd_show(int argc, char **argv) {
    const char *ckpt = NULL, *text = NULL, *out = NULL;
    int color = -1, tokens_kind = 0; /* 0 auto, 1 bytes, 2 ints */
    cli_args a = {CMD, argc, argv, 1, options, OPT_COUNT, OPT_HELP, help, NULL, 0};
    const char *name, *value;
    for (int id; (id = cli_scan(&a, &name, &value)) != CLI_END;) {
        if (id == CLI_STOP) return a.status;
        switch (id) {
        case OPT_CKPT: ckpt = value; break;
        case OPT_TEXT: text = value; break;
        case OPT_OUT: out = value; break;
        case OPT_TOKENS:
            if (strcmp(value, "auto") == 0) tokens_kind = 0;
            else if (strcmp(value, "bytes") == 0) tokens_kind = 1;
            else if (strcmp(value, "ints") == 0) tokens_kind = 2;
            else return usage("--tokens", "'%s' is not auto, bytes or ints", value);
            break;
        case OPT_COLOR:
            if (strcmp(value, "auto") == 0) color = -1;
            else if (strcmp(value, "always") == 0) color = 1;
            else if (strcmp(value, "never") == 0) color = 0;
            else return usage("--color", "'%s' is not auto, always or never", value);
            break;
        default: break;
        }
    }
    if (!ckpt) return usage("--ckpt", "%s", "the checkpoint folder is required");
    if (!text) return usage("--text", "%s", "the input is required");
    if (!text[0]) return usage("--text", "%s", "the input is empty");
    if (!out) out = ckpt;
    if (!out[0]) return usage("--out", "%s", "empty folder name");
    if (color < 0) color = isatty(STDOUT_FILENO);

    int rc = CLI_EXIT_FAIL;
    qkv_safetensors *st = NULL;
    qkv_model *m = NULL;
    int32_t *tok = NULL;
    char (*labels)[24] = NULL;
    const char **label_ptrs = NULL;
    char (*paths)[4096] = NULL;
    int64_t n_written = 0, n = 0;
    char path[4096], why[512] = "";
    qkv_status s;

    if (snprintf(path, sizeof path, "%s/%s", ckpt, TRAIN_CKPT_FILE) >= (int)sizeof path) {
        cli_error(CMD, "--ckpt", ckpt, "path too long");
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
    paths = malloc((size_t)(cfg.layers * cfg.heads) * sizeof *paths);
    if (!tok || !labels || !label_ptrs || !paths) {
        cli_error(CMD, NULL, NULL, "out of memory");
        goto done;
    }
    n = tokenize(text, tokens_kind, cfg.vocab, cap, tok, labels);
    if (n < 0) goto done;
    for (int64_t i = 0; i < n; i++) label_ptrs[i] = labels[i];
    if ((s = qkv_model_keep_attention(m, 1)) != QKV_OK || (s = qkv_model_forward(m, 1, n, tok, NULL, 0, NULL, NULL)) != QKV_OK) {
        cli_error(CMD, NULL, NULL, "forward: %s", qkv_status_string(s));
        goto done;
    }
    if (make_folder(out) != 0) goto done;
    printf("%s: %lld layers x %lld heads, %s, %lld tokens%s%s\n", path, (long long)cfg.layers,
           (long long)cfg.heads, cfg.causal ? "decoder (causal)" : "encoder", (long long)n,
           task ? ", task " : "", task ? task : "");
    for (int64_t l = 0; l < cfg.layers; l++) {
        const float *attn = qkv_model_attention(m, l); /* [1, H, n, n] */
        if (!attn) {
            cli_error(CMD, NULL, NULL, "the model kept no attention for layer %lld", (long long)l);
            goto done;
        }
        for (int64_t h = 0; h < cfg.heads; h++) {
            char title[96];
            snprintf(title, sizeof title, "layer %lld, head %lld", (long long)l, (long long)h);
            qkv_heatmap hm;
            qkv_heatmap_init(&hm, attn + h * n * n, n, n);
            hm.row_labels = label_ptrs;
            hm.col_labels = label_ptrs;
            hm.title = title;
            hm.vmin = 0.0;
            hm.vmax = 1.0;
            hm.show_values = n <= 12;
            if (color && print_ansi(&hm) != 0) goto done;
            char *pp = paths[n_written];
            if (snprintf(pp, sizeof paths[0], "%s/show_l%lld_h%lld.png", out, (long long)l, (long long)h) >=
                (int)sizeof paths[0]) {
                cli_error(CMD, "--out", out, "path too long");
                goto done;
            }
            errno = 0;
            s = qkv_heatmap_save_png(pp, &hm);
            if (s != QKV_OK) {
                cli_error(CMD, "--out", pp, "cannot write the picture: %s%s%s", qkv_status_string(s),
                          errno ? ": " : "", errno ? strerror(errno) : "");
                goto done;
            }
            n_written++;
            printf("wrote %s\n", pp);
        }
    }
    rc = CLI_EXIT_OK;
done:
    if (rc != CLI_EXIT_OK)
        for (int64_t i = 0; i < n_written; i++) unlink(paths[i]);
    free(tok);
    free(labels);
    free(label_ptrs);
    free(paths);
    qkv_model_free(m);
    qkv_safetensors_free(st);
    fflush(stdout);
    return rc;
}
