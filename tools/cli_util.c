/* Option scanning, strict numbers and error messages for the qkv tool. */
#include "cli_util.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void cli_error(const char *cmd, const char *opt, const char *path, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "qkv %s: ", cmd);
    if (opt && path) fprintf(stderr, "%s %s: ", opt, path);
    else if (opt) fprintf(stderr, "%s: ", opt);
    else if (path) fprintf(stderr, "%s: ", path);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

void cli_usage_hint(const char *cmd) { fprintf(stderr, "Try 'qkv %s --help'.\n", cmd); }

static const cli_opt *find_opt(const cli_opt *opts, size_t n, const char *name, size_t len) {
    for (size_t i = 0; i < n; i++) {
        if (strlen(opts[i].name) == len && strncmp(opts[i].name, name, len) == 0) return &opts[i];
        if (opts[i].alias && strlen(opts[i].alias) == len && strncmp(opts[i].alias, name, len) == 0)
            return &opts[i];
    }
    return NULL;
}

int cli_next(cli_args *a, const cli_opt *opts, size_t n_opts, const char **name,
             const char **value) {
    *value = NULL;
    *name = NULL;
    if (a->i >= a->argc) return CLI_END;
    const char *arg = a->argv[a->i++];
    *name = arg;
    if (arg[0] != '-' || arg[1] == '\0') {
        cli_error(a->cmd, NULL, NULL, "unexpected argument '%s' (every input is given by an option)",
                  arg);
        return CLI_ERROR;
    }
    /* "--name=value" for long options only: "-o=x" would be ambiguous. */
    const char *eq = (arg[1] == '-') ? strchr(arg, '=') : NULL;
    size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
    const cli_opt *o = find_opt(opts, n_opts, arg, len);
    if (!o) {
        cli_error(a->cmd, NULL, NULL, "unknown option '%.*s'", (int)len, arg);
        return CLI_ERROR;
    }
    *name = o->name;
    if (!o->has_value) {
        if (eq) {
            cli_error(a->cmd, o->name, NULL, "takes no value (got '%s')", eq + 1);
            return CLI_ERROR;
        }
        return o->id;
    }
    if (eq) {
        *value = eq + 1;
    } else if (a->i < a->argc && strncmp(a->argv[a->i], "--", 2) != 0) {
        *value = a->argv[a->i++];
    } else {
        if (a->i < a->argc)
            cli_error(a->cmd, o->name, NULL, "missing value (next is the option '%s')", a->argv[a->i]);
        else
            cli_error(a->cmd, o->name, NULL, "missing value");
        return CLI_ERROR;
    }
    if ((*value)[0] == '\0') {
        cli_error(a->cmd, o->name, NULL, "empty value");
        return CLI_ERROR;
    }
    return o->id;
}

int cli_scan(cli_args *a, const char **name, const char **value) {
    int id = cli_next(a, a->opts, a->n_opts, name, value);
    if (id == CLI_END) return CLI_END;
    if (id == CLI_ERROR) {
        cli_usage_hint(a->cmd);
        a->status = CLI_EXIT_USAGE;
        return CLI_STOP;
    }
    if (a->help && id == a->help_id) {
        a->help();
        a->status = CLI_EXIT_OK;
        return CLI_STOP;
    }
    if (a->given) {
        if (a->given[id]) {
            a->status = cli_usage_error(a->cmd, *name, "given twice");
            return CLI_STOP;
        }
        a->given[id] = 1;
    }
    return id;
}

int cli_parse_double(const char *cmd, const char *label, const char *text, double *out) {
    char *end = NULL;
    if (!text[0] || isspace((unsigned char)text[0])) {
        cli_error(cmd, label, NULL, "'%s' is not a number", text);
        return -1;
    }
    errno = 0;
    double x = strtod(text, &end);
    if (end == text || *end != '\0') {
        cli_error(cmd, label, NULL, "'%s' is not a number", text);
        return -1;
    }
    if (!isfinite(x) || (errno == ERANGE && fabs(x) > 1.0)) {
        cli_error(cmd, label, NULL, "'%s' is not a finite number", text);
        return -1;
    }
    *out = x; /* underflow to 0 or a subnormal is kept: the range check is the caller's */
    return 0;
}

int cli_parse_int64(const char *cmd, const char *label, const char *text, int64_t lo,
                    int64_t hi, int64_t *out) {
    char *end = NULL;
    if (!text[0] || isspace((unsigned char)text[0])) {
        cli_error(cmd, label, NULL, "'%s' is not an integer", text);
        return -1;
    }
    errno = 0;
    long long x = strtoll(text, &end, 10);
    if (end == text || *end != '\0') {
        cli_error(cmd, label, NULL, "'%s' is not an integer", text);
        return -1;
    }
    if (errno == ERANGE || x < lo || x > hi) {
        if (hi == INT64_MAX)
            cli_error(cmd, label, NULL, "'%s' is out of range: must be >= %lld", text, (long long)lo);
        else
            cli_error(cmd, label, NULL, "'%s' is out of range: must be in %lld..%lld", text,
                      (long long)lo, (long long)hi);
        return -1;
    }
    *out = (int64_t)x;
    return 0;
}

const char *cli_shape_str(char *buf, size_t len, int ndim, const int64_t *shape) {
    size_t used = 0;
    if (!len) return buf;
    buf[0] = '\0';
    for (int i = -1; i <= ndim; i++) {
        int w;
        if (i < 0)
            w = snprintf(buf + used, len - used, "[");
        else if (i == ndim)
            w = snprintf(buf + used, len - used, "]");
        else
            w = snprintf(buf + used, len - used, "%s%lld", i ? ", " : "", (long long)shape[i]);
        if (w < 0 || (size_t)w >= len - used) break; /* truncated: still terminated */
        used += (size_t)w;
    }
    return buf;
}

const char *cli_dtype_name(qkv_dtype dtype) {
    switch (dtype) {
    case QKV_F32: return "float32";
    case QKV_F64: return "float64";
    case QKV_I32: return "int32";
    case QKV_I64: return "int64";
    case QKV_BF16: return "bfloat16";
    case QKV_F16: return "float16";
    }
    return "unknown";
}

/* ---- shared by the subcommands that take attention options ---------------- */

int cli_usage_error(const char *cmd, const char *opt, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cli_error(cmd, opt, NULL, "%s", msg);
    cli_usage_hint(cmd);
    return CLI_EXIT_USAGE;
}

/* "L" of a window spec: a non-negative integer. */
static int parse_extent(const char *cmd, const char *spec, const char *side, const char *text, int64_t *out) {
    char label[160];
    snprintf(label, sizeof label, "--mask %s: %s extent", spec, side);
    return cli_parse_int64(cmd, label, text, 0, INT64_MAX, out);
}

int cli_parse_mask(const char *cmd, const char *spec, qkv_attn_desc *d) {
    if (strcmp(spec, "none") == 0) {
        d->mask = QKV_MASK_NONE;
        return 0;
    }
    if (strcmp(spec, "causal") == 0) {
        d->mask = QKV_MASK_CAUSAL;
        return 0;
    }
    if (strncmp(spec, "window:", 7) == 0) {
        const char *l = spec + 7;
        const char *comma = strchr(l, ',');
        if (!comma) {
            cli_error(cmd, "--mask", NULL,
                      "'%s': a window needs both extents, window:L,R (keys p-L..p+R)", spec);
            return -1;
        }
        char left[64];
        size_t len = (size_t)(comma - l);
        if (len >= sizeof left) len = sizeof left - 1; /* too long to be a number anyway */
        memcpy(left, l, len);
        left[len] = '\0';
        if (parse_extent(cmd, spec, "left", left, &d->window_left) != 0 ||
            parse_extent(cmd, spec, "right", comma + 1, &d->window_right) != 0)
            return -1;
        d->mask = QKV_MASK_WINDOW;
        return 0;
    }
    if (strncmp(spec, "causal-window:", 14) == 0) {
        if (strchr(spec + 14, ',')) {
            cli_error(cmd, "--mask", NULL,
                      "'%s': a causal window has only a left extent, causal-window:L", spec);
            return -1;
        }
        if (parse_extent(cmd, spec, "left", spec + 14, &d->window_left) != 0) return -1;
        d->window_right = 0;
        d->mask = QKV_MASK_CAUSAL_WINDOW;
        return 0;
    }
    if (strcmp(spec, "window") == 0 || strcmp(spec, "causal-window") == 0) {
        cli_error(cmd, "--mask", NULL, "'%s' needs its extents: window:L,R or causal-window:L",
                  spec);
        return -1;
    }
    cli_error(cmd, "--mask", NULL,
              "unknown mask '%s' (expected none, causal, window:L,R or causal-window:L)", spec);
    return -1;
}

int cli_can_draw(const char *cmd) {
#if QKV_WITH_PNG
    (void)cmd;
    return 1;
#else
    static int said;
    if (!said) fprintf(stderr, "qkv %s: pictures not drawn: this qkv was built without PNG\n", cmd);
    said = 1;
    return 0;
#endif
}

int cli_print_heatmap(const char *cmd, const qkv_heatmap *h, qkv_ansi_colors colors) {
    size_t len = 0;
    char *buf = NULL;
    qkv_status s = qkv_heatmap_format_ansi(h, colors, NULL, 0, &len);
    if (s == QKV_OK && (buf = malloc(len + 1)) != NULL) s = qkv_heatmap_format_ansi(h, colors, buf, len + 1, &len);
    if (s != QKV_OK || !buf) {
        free(buf);
        cli_error(cmd, NULL, NULL, "terminal heatmap: %s", buf ? qkv_status_string(s) : "out of memory");
        return -1;
    }
    printf("\n");
    fputs(buf, stdout);
    free(buf);
    return 0;
}

int cli_scan_values(cli_args *a, const char **val, int (*take)(void *ctx, int id, const char *value), void *ctx) {
    const char *name, *value;
    for (int id; (id = cli_scan(a, &name, &value)) != CLI_END;) {
        if (id == CLI_STOP) return a->status;
        val[id] = value;
        if (value && take(ctx, id, value) != 0) {
            cli_usage_hint(a->cmd);
            return CLI_EXIT_USAGE;
        }
    }
    return -1;
}

int cli_parse_impl(const char *cmd, const char *value, qkv_attn_desc *d) {
    if (strcmp(value, "auto") == 0) d->impl = QKV_IMPL_AUTO;
    else if (strcmp(value, "reference") == 0) d->impl = QKV_IMPL_REFERENCE;
    else if (strcmp(value, "fast") == 0) d->impl = QKV_IMPL_FAST;
    else {
        cli_error(cmd, "--impl", NULL, "unknown implementation '%s' (expected auto, reference or fast)", value);
        return -1;
    }
    return 0;
}

int cli_parse_threads(const char *cmd, const char *value, qkv_attn_desc *d) {
    int64_t n;
    if (cli_parse_int64(cmd, "--threads", value, 0, 65536, &n) != 0) return -1;
    d->threads = (int)n;
    return 0;
}

int cli_flush_stdout(const char *cmd, int rc) {
    if ((fflush(stdout) != 0 || ferror(stdout)) && rc == CLI_EXIT_OK) {
        cli_error(cmd, NULL, "stdout", "write error: %s", strerror(errno));
        return CLI_EXIT_FAIL;
    }
    return rc;
}

int cli_parse_double_above(const char *cmd, const char *label, const char *text, double lo, const char *note,
                           double *out) {
    double x;
    if (cli_parse_double(cmd, label, text, &x) != 0) return -1;
    if (!(x > lo)) {
        cli_error(cmd, label, NULL, "'%s' must be > %g%s", text, lo, note);
        return -1;
    }
    *out = x;
    return 0;
}

void cli_attn_desc_single(qkv_attn_desc *d, int64_t n, int64_t dim) {
    qkv_attn_desc_init(d);
    d->batch = 1;
    d->n_q = d->n_k = n;
    d->heads = 1;
    d->dim = dim;
}

int cli_make_out_dir(const char *cmd, const char *dir) {
    struct stat st;
    if (stat(dir, &st) != 0) {
        if (mkdir(dir, 0777) != 0) {
            cli_error(cmd, "--out", dir, "cannot create the folder: %s", strerror(errno));
            return -1;
        }
    } else if (!S_ISDIR(st.st_mode)) {
        cli_error(cmd, "--out", dir, "not a folder");
        return -1;
    }
    return 0;
}
