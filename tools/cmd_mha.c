/* qkv mha: one multi-head attention layer (torch.nn.MultiheadAttention
 * weights in a safetensors file) applied to .npy inputs.
 *
 *   qkv mha --weights w.safetensors --heads H --x x.npy -o y.npy [options]
 *
 * The layer's shape is read from the weights: E, kdim, vdim, the head dim
 * and H_kv from the projection matrices, biases from whether in_proj_bias is
 * there, fused ([3E, E] in_proj_weight) or separate (q/k/v_proj_weight)
 * projections from which of them the file has.
 *
 * As in qkv attend, the work is done in three steps so that a failure never
 * leaves a partial result behind: (1) parse the options, load the weights and
 * every input and check that they fit, (2) compute into memory, (3) write the
 * outputs, removing the ones this run already wrote if a later write fails
 * (each write itself is atomic: qkv_npy_save renames a finished temporary
 * file). */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_npy.h"
#include "cli_util.h"
#include "qkv.h"

#define CMD "mha"
#define MAX_HEADS 65536
#define NAME_MAX_LEN 512 /* prefix + tensor name */

enum {
    OPT_HELP, OPT_WEIGHTS, OPT_HEADS, OPT_HEADS_KV, OPT_PREFIX, OPT_X, OPT_KV, OPT_K, OPT_V,
    OPT_CAUSAL, OPT_MASK, OPT_KEY_LENGTHS, OPT_POS, OPT_JOIN, OPT_ROPE_BASE, OPT_OUT, OPT_ATTN,
    OPT_IMPL, OPT_THREADS, OPT_COUNT
};

/* Indexed by id: options[id].id == id. */
static const cli_opt options[OPT_COUNT] = {
    {"--help", "-h", 0, OPT_HELP},
    {"--weights", NULL, 1, OPT_WEIGHTS},
    {"--heads", NULL, 1, OPT_HEADS},
    {"--heads-kv", NULL, 1, OPT_HEADS_KV},
    {"--prefix", NULL, 1, OPT_PREFIX},
    {"--x", NULL, 1, OPT_X},
    {"--kv", NULL, 1, OPT_KV},
    {"--k", NULL, 1, OPT_K},
    {"--v", NULL, 1, OPT_V},
    {"--causal", NULL, 0, OPT_CAUSAL},
    {"--mask", NULL, 1, OPT_MASK},
    {"--key-lengths", NULL, 1, OPT_KEY_LENGTHS},
    {"--pos", NULL, 1, OPT_POS},
    {"--join", NULL, 1, OPT_JOIN},
    {"--rope-base", NULL, 1, OPT_ROPE_BASE},
    {"-o", "--out", 1, OPT_OUT},
    {"--attn", NULL, 1, OPT_ATTN},
    {"--impl", NULL, 1, OPT_IMPL},
    {"--threads", NULL, 1, OPT_THREADS},
};

static const char *opt_name(int id) { return options[id].name; }

static const char synopsis[] =
    "Usage: qkv mha --weights W.safetensors --heads H --x X.npy -o Y.npy [options]\n"
    "       qkv mha ... --kv KV.npy          (cross-attention, keys = values)\n"
    "       qkv mha ... --k XK.npy --v XV.npy (cross-attention)\n";

static void help(void) {
    fputs(synopsis, stdout);
    fputs(
        "\n"
        "One multi-head attention layer, as torch.nn.MultiheadAttention (batch_first):\n"
        "  q = x W_q^T + b_q,  k = x_k W_k^T + b_k,  v = x_v W_v^T + b_v  (split in heads)\n"
        "  o_h = softmax(q_h k_h^T / sqrt(Dh)) v_h   (masked as asked)\n"
        "  y = concat_h(o_h) W_o^T + b_o             (--join mean: mean_h(o_h) W_o^T + b_o)\n"
        "\n"
        "Weights (safetensors, torch's state_dict names, each after --prefix):\n"
        "  in_proj_weight [3E, E]                    fused q, k, v projections, or\n"
        "  q_proj_weight [H Dh, E], k_proj_weight [H_kv Dh, kdim],\n"
        "  v_proj_weight [H_kv Dh, vdim]             separate ones (cross-attention, GQA)\n"
        "  in_proj_bias [(H + 2 H_kv) Dh]            optional: then out_proj.bias [E] too\n"
        "  out_proj.weight [E, H Dh]                 ([E, Dh] with --join mean)\n"
        "  bias_k, bias_v [1, 1, H_kv Dh]            optional (torch's add_bias_kv=True)\n"
        "  additive.w1, additive.w2 [H, A, Dh],\n"
        "  additive.w [H, A]                         optional (qkv's names): the additive score\n"
        "E, kdim, vdim, the head dim Dh (E / H for in_proj_weight), H_kv and A are\n"
        "read from these shapes; F32, F64, F16 and BF16 tensors are accepted.\n"
        "With bias_k, bias_v one learned extra key and value join the keys and values\n"
        "of every sequence; every query sees it, whatever --mask and --key-lengths say\n"
        "(as torch pads its masks); --attn then has n_k + 1 columns, the extra key last.\n"
        "Not with a window mask; with --causal, n <= n_k + 1.\n"
        "With additive.*, the score is s = w_h . tanh(W1_h q + W2_h k) per head h\n"
        "instead of q.k / sqrt(Dh) (computed on the reference path, not --impl fast).\n"
        "\n"
        "Inputs (.npy, float32 or float64; computed in float32):\n"
        "  --weights FILE      the layer's weights (required)\n"
        "  --prefix P          the names' prefix, e.g. 'layers.0.self_attn.' (default none)\n"
        "  --heads H           number of query heads (required)\n"
        "  --heads-kv HKV      key/value heads (grouped-query attention); default: read\n"
        "                      from k_proj_weight (H for in_proj_weight)\n"
        "  --x FILE            the queries' input: [n, E] or [B, n, E] (required)\n"
        "  --kv FILE           keys' and values' input (cross-attention): [n_k, kdim] or\n"
        "                      [B, n_k, kdim] (needs kdim = vdim)\n"
        "  --k FILE, --v FILE  keys' input [.., n_k, kdim] and values' input\n"
        "                      [.., n_k, vdim], separately\n"
        "                      Without --kv, --k, --v: self-attention on x.\n"
        "  --key-lengths FILE  int32/int64 [B] (B = 1 for a rank-2 x): batch b sees only\n"
        "                      keys j < len[b] (padding, torch's key_padding_mask)\n"
        "\n"
        "Outputs (float32; written only when everything succeeded):\n"
        "  -o, --out FILE      y: [n, E] or [B, n, E], the rank of x (required)\n"
        "  --attn FILE         the per-head attention weights: [H, n, n_k] or\n"
        "                      [B, H, n, n_k] (masked entries are 0; n_k + 1 with bias_k)\n"
        "\n",
        stdout);
    /* Split in two: C guarantees string literals of 4095 characters only. */
    fputs(
        "Attention:\n"
        "  --causal            the same as --mask causal\n"
        "  --mask SPEC         which keys each query sees (default none):\n"
        "                        none            every key\n"
        "                        causal          keys j <= p\n"
        "                        window:L,R      keys p-L <= j <= p+R (L, R >= 0)\n"
        "                        causal-window:L keys p-L <= j <= p (L >= 0)\n"
        "                      where query i sits at key position p = i + n_k - n\n"
        "  --pos KIND          positional encoding (default none):\n"
        "                        sinusoidal  add the sinusoidal encoding of positions\n"
        "                                    0.. to x (and to a key/value input of dim E)\n"
        "                        rope        rotate q and k inside the layer (needs Dh even)\n"
        "                        alibi       per-head linear bias in the attention kernel\n"
        "  --rope-base B       RoPE's base (finite, > 1; default 10000; needs --pos rope)\n"
        "  --join KIND         concat (default): concatenate the heads, then W_o;\n"
        "                      mean: average the heads, then W_o [E, Dh]\n"
        "\n"
        "Computation:\n"
        "  --impl KIND         auto (default: the fast path where it applies), reference\n"
        "                      (plain loops accumulating in double) or fast (error if it\n"
        "                      does not apply)\n"
        "  --threads N         worker threads, 0 (default) = QKV_NUM_THREADS or all cores\n"
        "  -h, --help          show this help and exit\n"
        "\n"
        "Options take their value as the next argument or after '=' (--mask=causal).\n"
        "Exit status: 0 success; 1 a file is missing, malformed or does not fit, or\n"
        "the computation or a write failed; 2 usage error. On any failure no output\n"
        "file of this run is left behind.\n"
        "\n"
        "Example (weights saved from PyTorch with\n"
        "safetensors.torch.save_file(mha.state_dict(), \"mha.safetensors\")):\n"
        "  qkv mha --weights mha.safetensors --heads 8 --x x.npy --causal -o y.npy\n",
        stdout);
}

/* ------------------------------------------------------------------------- */
/* Options */

typedef enum pos_opt { POS_NONE, POS_SINUSOIDAL, POS_ROPE, POS_ALIBI } pos_opt;

typedef struct config {
    const char *val[OPT_COUNT]; /* the value of each option given (paths, specs) */
    int given[OPT_COUNT];
    int64_t heads, heads_kv;    /* heads_kv 0: read from the weights */
    const char *prefix;
    pos_opt pos;
    qkv_head_join join;
    double rope_base;           /* 0: the layer's default */
    qkv_attn_desc attn;         /* mask, window, impl, threads */
} config;

#define PARSE_CONTINUE (-1)

#define usage_error(...) cli_usage_error(CMD, __VA_ARGS__)

/* Interpret the value of one option; 0 or -1 (message printed). */
static int take_value(void *ctx, int id, const char *v) {
    config *c = ctx;
    int64_t n;
    switch (id) {
    case OPT_MASK: return cli_parse_mask(CMD, v, &c->attn);
    case OPT_HEADS:
        if (cli_parse_int64(CMD, "--heads", v, 1, MAX_HEADS, &n) != 0) return -1;
        c->heads = n;
        return 0;
    case OPT_HEADS_KV:
        if (cli_parse_int64(CMD, "--heads-kv", v, 1, MAX_HEADS, &n) != 0) return -1;
        c->heads_kv = n;
        return 0;
    case OPT_POS:
        if (strcmp(v, "none") == 0) c->pos = POS_NONE;
        else if (strcmp(v, "sinusoidal") == 0) c->pos = POS_SINUSOIDAL;
        else if (strcmp(v, "rope") == 0) c->pos = POS_ROPE;
        else if (strcmp(v, "alibi") == 0) c->pos = POS_ALIBI;
        else {
            cli_error(CMD, "--pos", NULL,
                      "unknown positional encoding '%s' (expected none, sinusoidal, rope or alibi)",
                      v);
            return -1;
        }
        return 0;
    case OPT_JOIN:
        if (strcmp(v, "concat") == 0) c->join = QKV_JOIN_CONCAT;
        else if (strcmp(v, "mean") == 0) c->join = QKV_JOIN_MEAN;
        else {
            cli_error(CMD, "--join", NULL, "unknown head join '%s' (expected concat or mean)", v);
            return -1;
        }
        return 0;
    case OPT_ROPE_BASE: return cli_parse_double_above(CMD, "--rope-base", v, 1.0, "", &c->rope_base);
    case OPT_IMPL: return cli_parse_impl(CMD, v, &c->attn);
    case OPT_THREADS: return cli_parse_threads(CMD, v, &c->attn);
    default: return 0; /* a file name or the prefix: used as given */
    }
}

/* Returns PARSE_CONTINUE, or the exit status (0 after --help). */
static int parse_args(int argc, char **argv, config *c) {
    cli_args a = {CMD, argc, argv, 1, options, OPT_COUNT, OPT_HELP, help, c->given, 0};
    memset(c, 0, sizeof *c);
    qkv_attn_desc_init(&c->attn);
    c->join = QKV_JOIN_CONCAT;
    c->prefix = "";
    if (argc < 2) { /* bare "qkv mha": the synopsis, as a usage error */
        fputs(synopsis, stderr);
        cli_usage_hint(CMD);
        return CLI_EXIT_USAGE;
    }

    int rc = cli_scan_values(&a, c->val, take_value, c);
    if (rc != PARSE_CONTINUE) return rc;

    /* Which options go together. */
    static const struct {
        int opt;
        const char *what;
    } required[] = {{OPT_WEIGHTS, "--weights W.safetensors"},
                    {OPT_HEADS, "--heads H"},
                    {OPT_X, "--x X.npy"},
                    {OPT_OUT, "-o Y.npy"}};
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++)
        if (!c->given[required[i].opt])
            return usage_error(NULL, "missing %s (--weights, --heads, --x and -o are required)",
                               required[i].what);
    if (c->given[OPT_PREFIX]) c->prefix = c->val[OPT_PREFIX];
    if (c->given[OPT_KV] && (c->given[OPT_K] || c->given[OPT_V]))
        return usage_error("--kv", "gives keys and values from one file: use either --kv or "
                                   "--k and --v");
    if (c->given[OPT_K] != c->given[OPT_V])
        return usage_error(c->given[OPT_K] ? "--k" : "--v",
                           "needs %s too (or --kv FILE when keys = values)",
                           c->given[OPT_K] ? "--v" : "--k");
    if (c->given[OPT_CAUSAL] && c->given[OPT_MASK])
        return usage_error("--causal", "and --mask both set the mask: give one of them");
    if (c->given[OPT_CAUSAL]) c->attn.mask = QKV_MASK_CAUSAL;
    if (c->given[OPT_ROPE_BASE] && c->pos != POS_ROPE)
        return usage_error("--rope-base", "needs --pos rope");
    if (c->given[OPT_HEADS_KV] && c->heads % c->heads_kv != 0)
        return usage_error("--heads-kv", "%lld does not divide --heads %lld",
                           (long long)c->heads_kv, (long long)c->heads);
    if (c->given[OPT_ATTN] && strcmp(c->val[OPT_OUT], c->val[OPT_ATTN]) == 0)
        return usage_error(NULL, "-o and --attn name the same file '%s'", c->val[OPT_OUT]);
    return PARSE_CONTINUE;
}

/* ------------------------------------------------------------------------- */
/* Inputs */

enum { IN_X, IN_KV, IN_K, IN_V, IN_KEY_LENGTHS, IN_COUNT };
static const int input_opt[IN_COUNT] = {OPT_X, OPT_KV, OPT_K, OPT_V, OPT_KEY_LENGTHS};

typedef cli_file input;

enum { OUT_Y, OUT_ATTN, OUT_COUNT };
static const int output_opt[OUT_COUNT] = {OPT_OUT, OPT_ATTN};

typedef cli_file output; /* path NULL: computed but not written; data NULL: not computed */

typedef struct job {
    const char *wpath;  /* --weights */
    qkv_safetensors *st;
    qkv_mha *m;
    input in[IN_COUNT];
    output out[OUT_COUNT];
} job;

static void job_free(job *j) {
    qkv_mha_free(j->m);
    qkv_safetensors_free(j->st);
    cli_files_free(j->in, IN_COUNT);
    cli_files_free(j->out, OUT_COUNT);
}

static long long ll(int64_t x) { return (long long)x; }

#define in_error(in, ...) cli_file_error(CMD, (in), __VA_ARGS__)

/* An error about the weights file. */
static void w_error(const job *j, const char *fmt, ...) CLI_PRINTF(2, 3);
static void w_error(const job *j, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cli_error(CMD, "--weights", j->wpath, "%s", msg);
}

static const char *shape_of(const qkv_array *a, char *buf, size_t len) {
    return cli_shape_str(buf, len, a->ndim, a->shape);
}

static int want_float(const input *in) {
    if (in->a.dtype == QKV_F32 || in->a.dtype == QKV_F64) return 0;
    in_error(in, "dtype %s is not accepted: expected float32 or float64",
             cli_dtype_name(in->a.dtype));
    return -1;
}

/* ------------------------------------------------------------------------- */
/* Weights: the layer's shape from the tensors' shapes. */

/* The tensor prefix + name, or NULL; its full name in full[NAME_MAX_LEN]. */
static const qkv_array *get(const job *j, const config *c, const char *name, char *full) {
    int w = snprintf(full, NAME_MAX_LEN, "%s%s", c->prefix, name);
    if (w < 0 || w >= NAME_MAX_LEN) return NULL; /* no tensor name is that long */
    return qkv_safetensors_get(j->st, full);
}

/* "name [a, b]" of a tensor for messages. */
static const char *tensor_str(char *buf, size_t len, const char *full, const qkv_array *a) {
    char sh[160];
    snprintf(buf, len, "'%s' %s", full, shape_of(a, sh, sizeof sh));
    return buf;
}

/* When no projection is found under the prefix, say which prefixes have one. */
static void hint_prefixes(const job *j, char *buf, size_t len) {
    static const char *const ends[] = {"in_proj_weight", "q_proj_weight"};
    size_t used = 0;
    int found = 0;
    buf[0] = '\0';
    int64_t n = qkv_safetensors_count(j->st);
    for (int64_t i = 0; i < n && found < 4; i++) {
        const char *name = qkv_safetensors_name(j->st, i);
        size_t nl = strlen(name);
        for (size_t e = 0; e < 2; e++) {
            size_t el = strlen(ends[e]);
            if (nl < el || strcmp(name + nl - el, ends[e]) != 0) continue;
            int w = snprintf(buf + used, len - used, "%s'%.*s'", found ? ", " : "", (int)(nl - el),
                             name);
            if (w < 0 || (size_t)w >= len - used) return;
            used += (size_t)w;
            found++;
        }
    }
    if (!found) snprintf(buf, len, "none in this file");
}

static int is_matrix(const qkv_array *a) { return a->ndim == 2 && a->shape[0] >= 1 && a->shape[1] >= 1; }

/* Fill cfg from the weights and the options. The separate q/k/v matrices of
 * a layer that the library stores fused (kdim = vdim = E, H_kv = H, H Dh = E)
 * are concatenated into <prefix>in_proj_weight in the loaded set, so that
 * qkv_mha_load finds them. 0 or -1 (message printed). */
/* The projections' sizes, from fused in_proj_weight [3E, E] or separate
 * q/k/v_proj_weight (keys and values of H_kv heads). */
typedef struct layer_shape {
    int64_t E, Dh, Hkv, kdim, vdim;
} layer_shape;

/* The sizes of the projections in_w (fused) or q_w (separate) name, checked
 * against --heads and --heads-kv. 0, or -1 after printing why. */
static int proj_shape(const config *c, job *j, const qkv_array *in_w, const qkv_array *q_w,
                      const char *fin, const char *fq, char *fk, char *fv, layer_shape *out) {
    char t1[NAME_MAX_LEN + 64], t2[NAME_MAX_LEN + 64];
    const int64_t H = c->heads;
    int64_t E, Dh, Hkv, kdim, vdim;
    if (in_w && q_w) {
        w_error(j, "has both '%s' and '%s': a layer has fused or separate projections, not both",
                fin, fq);
        return -1;
    }
    if (in_w) {
        if (!is_matrix(in_w) || in_w->shape[0] != 3 * in_w->shape[1]) {
            w_error(j, "tensor %s should be [3E, E] (torch's fused q, k, v projection)",
                    tensor_str(t1, sizeof t1, fin, in_w));
            return -1;
        }
        E = in_w->shape[1];
        if (E % H != 0) {
            w_error(j, "--heads %lld does not divide E = %lld (from %s)", ll(H), ll(E),
                    tensor_str(t1, sizeof t1, fin, in_w));
            return -1;
        }
        if (c->heads_kv && c->heads_kv != H) {
            w_error(j, "--heads-kv %lld: tensor '%s' is a fused projection, which has "
                       "H_kv = H = %lld (grouped-query weights are q/k/v_proj_weight)",
                    ll(c->heads_kv), fin, ll(H));
            return -1;
        }
        Dh = E / H;
        Hkv = H;
        kdim = vdim = E;
    } else if (q_w) {
        const qkv_array *k_w = get(j, c, "k_proj_weight", fk);
        const qkv_array *v_w = get(j, c, "v_proj_weight", fv);
        if (!k_w || !v_w) {
            w_error(j, "tensor '%s' is missing ('%s' means separate projections: "
                       "q_proj_weight, k_proj_weight and v_proj_weight)",
                    k_w ? fv : fk, fq);
            return -1;
        }
        const qkv_array *bad = !is_matrix(q_w) ? q_w : !is_matrix(k_w) ? k_w : !is_matrix(v_w) ? v_w : NULL;
        if (bad) {
            const char *bn = bad == q_w ? fq : bad == k_w ? fk : fv;
            w_error(j, "tensor %s should be a matrix [out, in]", tensor_str(t1, sizeof t1, bn, bad));
            return -1;
        }
        E = q_w->shape[1];
        if (q_w->shape[0] % H != 0) {
            w_error(j, "--heads %lld does not divide the %lld rows of %s (H Dh)", ll(H),
                    ll(q_w->shape[0]), tensor_str(t1, sizeof t1, fq, q_w));
            return -1;
        }
        Dh = q_w->shape[0] / H;
        if (k_w->shape[0] % Dh != 0 || k_w->shape[0] / Dh < 1 || H % (k_w->shape[0] / Dh) != 0) {
            w_error(j, "tensor %s should have H_kv Dh rows, H_kv dividing H = %lld, Dh = %lld "
                       "(from %s and --heads)",
                    tensor_str(t1, sizeof t1, fk, k_w), ll(H), ll(Dh),
                    tensor_str(t2, sizeof t2, fq, q_w));
            return -1;
        }
        Hkv = k_w->shape[0] / Dh;
        if (c->heads_kv && c->heads_kv != Hkv) {
            w_error(j, "--heads-kv %lld does not fit tensor %s: %lld rows are H_kv = %lld heads of "
                       "Dh = %lld",
                    ll(c->heads_kv), tensor_str(t1, sizeof t1, fk, k_w), ll(k_w->shape[0]),
                    ll(Hkv), ll(Dh));
            return -1;
        }
        if (v_w->shape[0] != k_w->shape[0]) {
            w_error(j, "tensor %s should have %lld rows, as %s", tensor_str(t1, sizeof t1, fv, v_w),
                    ll(k_w->shape[0]), tensor_str(t2, sizeof t2, fk, k_w));
            return -1;
        }
        kdim = k_w->shape[1];
        vdim = v_w->shape[1];
    } else {
        char hint[256];
        hint_prefixes(j, hint, sizeof hint);
        w_error(j, "tensor '%sin_proj_weight' (or '%sq_proj_weight') is missing; prefixes that "
                   "have one: %s (--prefix)",
                c->prefix, c->prefix, hint);
        return -1;
    }
    out->E = E;
    out->Dh = Dh;
    out->Hkv = Hkv;
    out->kdim = kdim;
    out->vdim = vdim;
    return 0;
}

/* Separate q/k/v_proj_weight [E, E] of a layer the library stores fused:
 * concatenated into in_proj_weight (named fin). 0, or -1 after printing why. */
static int join_qkv(job *j, const config *c, const qkv_array *q_w, const char *fin, const char *fq,
                    char *fk, char *fv, int64_t E) {
    const qkv_array *parts[3] = {q_w, get(j, c, "k_proj_weight", fk),
                                 get(j, c, "v_proj_weight", fv)};
    qkv_array cat;
    int64_t shape[2] = {3 * E, E};
    qkv_status s = qkv_array_alloc(&cat, QKV_F32, 2, shape);
    for (int p = 0; s == QKV_OK && p < 3; p++) {
        if (parts[p]->dtype != QKV_F32 && parts[p]->dtype != QKV_F64) {
            w_error(j, "tensor '%s' is %s: expected a float type",
                    p == 0 ? fq : p == 1 ? fk : fv, cli_dtype_name(parts[p]->dtype));
            qkv_array_free(&cat);
            return -1;
        }
        qkv_array f;
        s = qkv_array_convert(parts[p], QKV_F32, &f);
        if (s == QKV_OK) {
            memcpy((float *)cat.data + p * E * E, f.data, (size_t)(E * E) * sizeof(float));
            qkv_array_free(&f);
        }
    }
    if (s == QKV_OK) s = qkv_safetensors_put(j->st, fin, &cat);
    qkv_array_free(&cat);
    if (s != QKV_OK) {
        w_error(j, "cannot join q/k/v_proj_weight into one projection: %s",
                qkv_status_string(s));
        return -1;
    }
    return 0;
}

static int layer_config(const config *c, job *j, qkv_mha_config *cfg) {
    char fin[NAME_MAX_LEN], fq[NAME_MAX_LEN], fk[NAME_MAX_LEN], fv[NAME_MAX_LEN],
        fb[NAME_MAX_LEN], fo[NAME_MAX_LEN], t1[NAME_MAX_LEN + 64], t2[NAME_MAX_LEN + 64];
    const int64_t H = c->heads;
    const qkv_array *in_w = get(j, c, "in_proj_weight", fin);
    const qkv_array *q_w = get(j, c, "q_proj_weight", fq);

    layer_shape ls;
    if (proj_shape(c, j, in_w, q_w, fin, fq, fk, fv, &ls) != 0) return -1;
    const int64_t E = ls.E, Dh = ls.Dh, Hkv = ls.Hkv, kdim = ls.kdim, vdim = ls.vdim;

    /* Biases: torch's bias=True gives both, bias=False neither. */
    const qkv_array *in_b = get(j, c, "in_proj_bias", fb);
    const qkv_array *out_b = get(j, c, "out_proj.bias", fo);
    if (!in_b && out_b) {
        w_error(j, "has '%s' but no '%s': the layer has both projection biases or neither", fo, fb);
        return -1;
    }
    /* torch's add_bias_kv=True: bias_k and bias_v [1, 1, H_kv Dh], both or neither. */
    const qkv_array *bk = get(j, c, "bias_k", t1), *bv = get(j, c, "bias_v", t2);
    if (!bk != !bv) {
        w_error(j, "has '%s' but no '%s' (torch's add_bias_kv=True gives both)", bk ? t1 : t2, bk ? t2 : t1);
        return -1;
    }
    if (bk && (c->attn.mask == QKV_MASK_WINDOW || c->attn.mask == QKV_MASK_CAUSAL_WINDOW)) {
        cli_error(CMD, "--mask", NULL, "a window cannot be used with the layer's '%s'/'%s' (torch's "
                  "add_bias_kv): the extra key is seen by every query, which a window does not allow",
                  t1, t2);
        return -1;
    }

    /* The additive (MLP) score: qkv's additive.w1 [H, A, Dh] (and additive.w2,
     * additive.w, which the layer's load checks) - A is read from it. */
    char fa[NAME_MAX_LEN];
    const qkv_array *aw1 = get(j, c, "additive.w1", fa);
    int64_t A = 0;
    if (aw1) {
        if (aw1->ndim != 3 || aw1->shape[0] != H || aw1->shape[1] < 1 || aw1->shape[2] != Dh) {
            w_error(j, "tensor %s should be [H, A, Dh] = [%lld, A, %lld] (the additive score's W1)",
                    tensor_str(t1, sizeof t1, fa, aw1), ll(H), ll(Dh));
            return -1;
        }
        A = aw1->shape[1];
        if (c->attn.impl == QKV_IMPL_FAST) {
            cli_error(CMD, "--impl", NULL, "fast does not compute the additive score of '%s' (use auto "
                      "or reference)", fa);
            return -1;
        }
    }

    /* out_proj.weight [E, H Dh], or [E, Dh] for --join mean: a hint for the
     * other join (the layer's load reports any other misfit). */
    const qkv_array *o_w = get(j, c, "out_proj.weight", fo);
    if (o_w && is_matrix(o_w) && o_w->shape[0] == E && H > 1) {
        if (c->join == QKV_JOIN_CONCAT && o_w->shape[1] == Dh) {
            w_error(j, "tensor %s is [E, Dh], the shape for --join mean (--join concat, the "
                       "default, needs [E, H Dh] = [%lld, %lld])",
                    tensor_str(t1, sizeof t1, fo, o_w), ll(E), ll(H * Dh));
            return -1;
        }
        if (c->join == QKV_JOIN_MEAN && o_w->shape[1] == H * Dh) {
            w_error(j, "tensor %s is [E, H Dh], the shape for --join concat (--join mean needs "
                       "[E, Dh] = [%lld, %lld])",
                    tensor_str(t1, sizeof t1, fo, o_w), ll(E), ll(Dh));
            return -1;
        }
    }

    if (c->pos == POS_ROPE && Dh % 2 != 0) {
        w_error(j, "--pos rope needs an even head dim, but Dh = %lld (from --heads %lld)", ll(Dh),
                ll(H));
        return -1;
    }

    qkv_mha_config_init(cfg, E, H);
    cfg->heads_kv = Hkv;
    cfg->head_dim = Dh;
    cfg->kdim = kdim;
    cfg->vdim = vdim;
    cfg->bias = in_b != NULL;
    cfg->join = c->join;
    cfg->pos = c->pos == POS_ROPE ? QKV_POS_ROPE : c->pos == POS_ALIBI ? QKV_POS_ALIBI : QKV_POS_NONE;
    cfg->rope_base = c->rope_base;
    cfg->attn.mask = c->attn.mask;
    cfg->attn.window_left = c->attn.window_left;
    cfg->attn.window_right = c->attn.window_right;
    cfg->attn.impl = c->attn.impl;
    cfg->attn.threads = c->attn.threads;
    cfg->add_bias_kv = bk != NULL;
    if (A > 0) {
        cfg->attn.score = QKV_SCORE_ADDITIVE;
        cfg->attn.additive_dim = A;
    }

    /* Separate matrices of a layer the library stores fused: concatenate. */
    if (!in_w && kdim == E && vdim == E && Hkv == H && H * Dh == E &&
        join_qkv(j, c, q_w, fin, fq, fk, fv, E) != 0)
        return -1;
    return 0;
}

/* A status of qkv_mha_create, said in the options' terms. */
static void create_error(const job *j, qkv_status s, const qkv_mha_config *cfg) {
    switch (s) {
    case QKV_ERR_WINDOW:
        cli_error(CMD, "--mask", NULL, "not accepted: %s", qkv_status_string(s));
        break;
    case QKV_ERR_HEADS:
        w_error(j, "the layer's heads do not fit: --heads %lld, H_kv %lld, E %lld: %s",
                ll(cfg->heads), ll(cfg->heads_kv), ll(cfg->embed_dim), qkv_status_string(s));
        break;
    default:
        w_error(j, "cannot make the layer (E %lld, --heads %lld, H_kv %lld, Dh %lld, kdim %lld, "
                   "vdim %lld): %s",
                ll(cfg->embed_dim), ll(cfg->heads), ll(cfg->heads_kv), ll(cfg->head_dim),
                ll(cfg->kdim), ll(cfg->vdim), qkv_status_string(s));
        break;
    }
}

/* The weights: load, derive the layer, create it and load its parameters. */
static int load_layer(const config *c, job *j, qkv_mha_config *cfg) {
    char why[512] = "";
    j->wpath = c->val[OPT_WEIGHTS];
    qkv_status s = qkv_safetensors_load(j->wpath, &j->st, why, sizeof why);
    if (s != QKV_OK) {
        w_error(j, "%s", why[0] ? why : qkv_status_string(s));
        return -1;
    }
    if (layer_config(c, j, cfg) != 0) return -1;
    s = qkv_mha_create(cfg, 0, &j->m);
    if (s != QKV_OK) {
        create_error(j, s, cfg);
        return -1;
    }
    why[0] = '\0';
    s = qkv_mha_load(j->m, j->st, c->prefix, why, sizeof why);
    if (s != QKV_OK) {
        w_error(j, "%s", why[0] ? why : qkv_status_string(s));
        return -1;
    }
    return 0;
}

/* Sizes of the call. */
typedef struct sizes {
    int rank;             /* of x: 2 or 3 */
    int64_t b, n, n_k;
} sizes;

/* A key/value input: same rank and batch as x, last dim `dim`; its n into *n. */
static int check_kv(const input *in, const input *x, const char *dim_name, int64_t dim,
                    const job *j, int64_t *n) {
    char sh[160], xs[160];
    if (want_float(in) || cli_file_nonempty(CMD, in)) return -1;
    if (in->a.ndim != x->a.ndim) {
        in_error(in, "shape %s has rank %d, but --x %s %s has rank %d (they must match)",
                 shape_of(&in->a, sh, sizeof sh), in->a.ndim, x->path,
                 shape_of(&x->a, xs, sizeof xs), x->a.ndim);
        return -1;
    }
    if (in->a.ndim == 3 && in->a.shape[0] != x->a.shape[0]) {
        in_error(in, "shape %s does not fit --x %s %s: batch %lld != %lld",
                 shape_of(&in->a, sh, sizeof sh), x->path, shape_of(&x->a, xs, sizeof xs),
                 ll(in->a.shape[0]), ll(x->a.shape[0]));
        return -1;
    }
    int64_t last = in->a.shape[in->a.ndim - 1];
    if (last != dim) {
        in_error(in, "shape %s does not fit the weights: last dim %lld != %s = %lld (from "
                     "--weights %s)",
                 shape_of(&in->a, sh, sizeof sh), ll(last), dim_name, ll(dim), j->wpath);
        return -1;
    }
    *n = in->a.shape[in->a.ndim - 2];
    return 0;
}

/* Load every input and check that it fits the layer and the others. */
static int load_inputs(const config *c, job *j, const qkv_mha_config *cfg, sizes *sz) {
    char sh[160];
    for (int i = 0; i < IN_COUNT; i++) {
        j->in[i].opt = opt_name(input_opt[i]);
        j->in[i].path = c->given[input_opt[i]] ? c->val[input_opt[i]] : NULL;
    }
    for (int i = 0; i < IN_COUNT; i++)
        if (j->in[i].path && cli_file_load(CMD, &j->in[i], 0) != 0) return -1;

    input *x = &j->in[IN_X];
    if (want_float(x)) return -1;
    if (x->a.ndim != 2 && x->a.ndim != 3) {
        in_error(x, "rank %d array %s: expected [n, E] or [B, n, E]", x->a.ndim,
                 shape_of(&x->a, sh, sizeof sh));
        return -1;
    }
    if (cli_file_nonempty(CMD, x)) return -1;
    int64_t E = cfg->embed_dim;
    if (x->a.shape[x->a.ndim - 1] != E) {
        in_error(x, "shape %s does not fit the weights: last dim %lld != E = %lld (from "
                    "--weights %s)",
                 shape_of(&x->a, sh, sizeof sh), ll(x->a.shape[x->a.ndim - 1]), ll(E), j->wpath);
        return -1;
    }
    sz->rank = x->a.ndim;
    sz->b = sz->rank == 3 ? x->a.shape[0] : 1;
    sz->n = x->a.shape[sz->rank - 2];
    sz->n_k = sz->n;

    input *kv = &j->in[IN_KV], *k = &j->in[IN_K], *v = &j->in[IN_V];
    if (kv->path) {
        if (cfg->kdim != cfg->vdim) {
            in_error(kv, "gives keys = values, but the weights' keys and values have different "
                         "input dims (kdim %lld, vdim %lld): use --k and --v",
                     ll(cfg->kdim), ll(cfg->vdim));
            return -1;
        }
        if (check_kv(kv, x, "kdim", cfg->kdim, j, &sz->n_k) != 0) return -1;
    } else if (k->path) {
        int64_t nv;
        if (check_kv(k, x, "kdim", cfg->kdim, j, &sz->n_k) != 0 ||
            check_kv(v, x, "vdim", cfg->vdim, j, &nv) != 0)
            return -1;
        if (nv != sz->n_k) {
            char ks[160];
            in_error(v, "shape %s does not fit --k %s %s: number of keys n_k %lld != %lld",
                     shape_of(&v->a, sh, sizeof sh), k->path, shape_of(&k->a, ks, sizeof ks),
                     ll(nv), ll(sz->n_k));
            return -1;
        }
    } else if (cfg->kdim != E || cfg->vdim != E) {
        w_error(j, "the layer's key and value inputs have dims kdim %lld, vdim %lld != E = %lld "
                   "(cross-attention): give --kv FILE or --k FILE --v FILE",
                ll(cfg->kdim), ll(cfg->vdim), ll(E));
        return -1;
    }

    input *kl = &j->in[IN_KEY_LENGTHS];
    if (kl->path) {
        if (kl->a.dtype != QKV_I32 && kl->a.dtype != QKV_I64) {
            in_error(kl, "dtype %s is not accepted: expected int32 or int64",
                     cli_dtype_name(kl->a.dtype));
            return -1;
        }
        if (kl->a.ndim != 1 || kl->a.shape[0] != sz->b) {
            in_error(kl, "shape %s does not fit: expected [B] = [%lld] (B from --x %s)",
                     shape_of(&kl->a, sh, sizeof sh), ll(sz->b), x->path);
            return -1;
        }
        if (cli_file_convert(CMD, kl, QKV_I64)) return -1;
        const int64_t *len = kl->a.data;
        for (int64_t b = 0; b < sz->b; b++) {
            if (len[b] < 0 || len[b] > sz->n_k) {
                in_error(kl, "entry %lld is %lld, outside 0..%lld (the number of keys n_k)", ll(b),
                         ll(len[b]), ll(sz->n_k));
                return -1;
            }
        }
    }

    static const int tensors[] = {IN_X, IN_KV, IN_K, IN_V};
    for (size_t i = 0; i < sizeof tensors / sizeof tensors[0]; i++)
        if (j->in[tensors[i]].path && cli_file_convert(CMD, &j->in[tensors[i]], QKV_F32)) return -1;
    return 0;
}

/* x[b, i, :] += PE(i) for every batch, when the last dim of `in` is E. */
static int add_sinusoidal(input *in, int64_t E, const char *why_opt) {
    if (!in->path || in->a.shape[in->a.ndim - 1] != E) return 0;
    int64_t n = in->a.shape[in->a.ndim - 2];
    int64_t batches = in->a.ndim == 3 ? in->a.shape[0] : 1;
    int64_t shape[2] = {n, E};
    qkv_array pe;
    qkv_status s = qkv_array_alloc(&pe, QKV_F32, 2, shape);
    if (s == QKV_OK) s = qkv_posenc_sinusoidal(n, E, 0, pe.data);
    if (s != QKV_OK) {
        in_error(in, "%s sinusoidal: %s", why_opt, qkv_status_string(s));
        qkv_array_free(&pe);
        return -1;
    }
    float *x = in->a.data;
    const float *p = pe.data;
    for (int64_t b = 0; b < batches; b++)
        for (int64_t i = 0; i < n * E; i++) x[b * n * E + i] += p[i];
    qkv_array_free(&pe);
    return 0;
}

/* ------------------------------------------------------------------------- */
/* Outputs */

static int alloc_output(job *j, int which, int ndim, const int64_t *shape, const char *what) {
    return cli_file_alloc(CMD, &j->out[which], j->out[which].opt, QKV_F32, ndim, shape, what);
}


/* ------------------------------------------------------------------------- */

static int run(const config *c, job *j) {
    qkv_mha_config cfg;
    sizes sz;
    for (int i = 0; i < OUT_COUNT; i++) {
        j->out[i].opt = opt_name(output_opt[i]);
        j->out[i].path = c->given[output_opt[i]] ? c->val[output_opt[i]] : NULL;
    }
    if (load_layer(c, j, &cfg) != 0 || load_inputs(c, j, &cfg, &sz) != 0) return CLI_EXIT_FAIL;

    input *x = &j->in[IN_X], *kv = &j->in[IN_KV], *k = &j->in[IN_K], *v = &j->in[IN_V];
    if (c->pos == POS_SINUSOIDAL &&
        (add_sinusoidal(x, cfg.embed_dim, "--pos") || add_sinusoidal(kv, cfg.embed_dim, "--pos") ||
         add_sinusoidal(k, cfg.embed_dim, "--pos") || add_sinusoidal(v, cfg.embed_dim, "--pos")))
        return CLI_EXIT_FAIL;

    /* y has the rank of x; attn is [H, n, n_k] or [B, H, n, n_k]. */
    int64_t y_shape[3], a_shape[4];
    int my = 0, ma = 0;
    if (sz.rank == 3) y_shape[my++] = a_shape[ma++] = sz.b;
    y_shape[my++] = sz.n;
    y_shape[my++] = cfg.embed_dim;
    a_shape[ma++] = cfg.heads;
    a_shape[ma++] = sz.n;
    a_shape[ma++] = sz.n_k + (cfg.add_bias_kv ? 1 : 0); /* the extra key last, as torch */
    if (alloc_output(j, OUT_Y, my, y_shape, "the output") ||
        (j->out[OUT_ATTN].path && alloc_output(j, OUT_ATTN, ma, a_shape, "the attention weights")))
        return CLI_EXIT_FAIL;

    const float *xk = kv->path ? kv->a.data : k->path ? k->a.data : NULL;
    const float *xv = k->path ? v->a.data : NULL;
    const int64_t *kl = j->in[IN_KEY_LENGTHS].path ? j->in[IN_KEY_LENGTHS].a.data : NULL;
    qkv_status s = qkv_mha_forward(j->m, sz.b, sz.n, sz.n_k, x->a.data, xk, xv, kl,
                                   j->out[OUT_Y].a.data, j->out[OUT_ATTN].a.data);
    if (s != QKV_OK) {
        if (s == QKV_ERR_WINDOW)
            cli_error(CMD, "--mask", NULL, "multi-head attention failed: %s", qkv_status_string(s));
        else if (s == QKV_ERR_UNSUPPORTED && cfg.add_bias_kv && cfg.attn.mask == QKV_MASK_CAUSAL &&
                 sz.n > sz.n_k + 1)
            cli_error(CMD, "--mask", NULL, "causal with the layer's bias_k/bias_v needs n <= n_k + 1 "
                      "(here n = %lld, n_k = %lld): every query must see the extra key",
                      ll(sz.n), ll(sz.n_k));
        else
            cli_error(CMD, NULL, NULL, "multi-head attention failed: %s", qkv_status_string(s));
        return CLI_EXIT_FAIL;
    }
    return cli_files_write(CMD, j->out, OUT_COUNT) != 0 ? CLI_EXIT_FAIL : CLI_EXIT_OK;
}

int cli_cmd_mha(int argc, char **argv) {
    config c;
    int rc = parse_args(argc, argv, &c);
    if (rc != PARSE_CONTINUE) return rc;
    job j;
    memset(&j, 0, sizeof j);
    rc = run(&c, &j);
    job_free(&j);
    return cli_flush_stdout(CMD, rc);
}
