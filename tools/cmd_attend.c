/* qkv attend: the attention core on NumPy .npy files.
 *
 * Forward:  qkv attend --q q.npy --k k.npy --v v.npy -o out.npy [options]
 * Backward: qkv attend ... --grad-out dout.npy --dq dq.npy --dk dk.npy --dv dv.npy
 *
 * The work is done in three steps so that a failure never leaves a partial
 * result behind: (1) parse the options and load and check every input,
 * (2) compute everything into memory, (3) write the outputs one by one,
 * removing the ones this run already wrote if a later write fails (each write
 * itself is atomic: qkv_npy_save renames a finished temporary file). */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_npy.h"
#include "cli_util.h"
#include "cmd_attend.h"
#include "qkv.h"

#define PRINT_MAX 16        /* rows and columns of a printed matrix */
#define PRINT_MAX_BLOCKS 16 /* (batch, head) matrices printed */

/* Indexed by id: options[id].id == id. */
static const cli_opt options[OPT_COUNT] = {
    {"--help", "-h", 0, OPT_HELP},
    {"--q", NULL, 1, OPT_Q},
    {"--k", NULL, 1, OPT_K},
    {"--v", NULL, 1, OPT_V},
    {"-o", "--out", 1, OPT_OUT},
    {"--mask", NULL, 1, OPT_MASK},
    {"--score", NULL, 1, OPT_SCORE},
    {"--scale", NULL, 1, OPT_SCALE},
    {"--temperature", NULL, 1, OPT_TEMPERATURE},
    {"--norm", NULL, 1, OPT_NORM},
    {"--relu-count", NULL, 0, OPT_RELU_COUNT},
    {"--softcap", NULL, 1, OPT_SOFTCAP},
    {"--key-lengths", NULL, 1, OPT_KEY_LENGTHS},
    {"--seq-offsets", NULL, 1, OPT_SEQ_OFFSETS},
    {"--bias", NULL, 1, OPT_BIAS},
    {"--attn", NULL, 1, OPT_ATTN},
    {"--lse", NULL, 1, OPT_LSE},
    {"--dtype", NULL, 1, OPT_DTYPE},
    {"--impl", NULL, 1, OPT_IMPL},
    {"--threads", NULL, 1, OPT_THREADS},
    {"--print", NULL, 0, OPT_PRINT},
    {"--grad-out", NULL, 1, OPT_GRAD_OUT},
    {"--dq", NULL, 1, OPT_DQ},
    {"--dk", NULL, 1, OPT_DK},
    {"--dv", NULL, 1, OPT_DV},
    {"--dbias", NULL, 1, OPT_DBIAS},
    {"--out-float32", NULL, 0, OPT_OUT_FLOAT32},
    {"--distributed", NULL, 0, OPT_DISTRIBUTED},
};

const char *attend_opt_name(int id) { return options[id].name; }

static void help(void) {
    printf(
        "Usage: qkv attend --q Q.npy --k K.npy --v V.npy -o OUT.npy [options]\n"
        "       qkv attend --q Q.npy --k K.npy --v V.npy --grad-out DOUT.npy\n"
        "                  --dq DQ.npy --dk DK.npy --dv DV.npy [-o OUT.npy] [options]\n"
        "\n"
        "Self-attention on NumPy .npy arrays: for every batch b and query head h,\n"
        "  S = score(Q, K), softcapped, plus bias, masked;  A' = normalise(S) row by row;\n"
        "  O = A' V.\n"
        "\n"
        "Arrays (.npy versions 1.0-3.0, little-endian, C order):\n"
        "  q, k, v have the same rank, float32, float64 or float16 ('<f2'), or bf16\n"
        "  stored as uint16 ('<u2') bit patterns (with --dtype bf16 only):\n"
        "    rank 2: q [n_q, D],       k [n_k, D],          v [n_k, D_v]        (B = H = 1)\n"
        "    rank 3: q [n_q, H, D],    k [n_k, H_kv, D],    v [n_k, H_kv, D_v]  (B = 1)\n"
        "    rank 4: q [B, n_q, H, D], k [B, n_k, H_kv, D], v [B, n_k, H_kv, D_v]\n"
        "  H_kv must divide H: query head h reads key/value head h / (H / H_kv)\n"
        "  (grouped-query attention; H_kv = 1 is multi-query attention).\n"
        "\n"
        "Inputs:\n"
        "  --q FILE            queries (required)\n"
        "  --k FILE            keys (required)\n"
        "  --v FILE            values (required)\n"
        "  --key-lengths FILE  int32/int64 [B]: batch b sees only keys j < len[b] (padding)\n"
        "  --seq-offsets FILE  int32/int64 [S+1]: packed sequences (needs B = 1 and\n"
        "                      n_q = n_k): offsets 0 = o_0 <= ... <= o_S = n; queries of\n"
        "                      sequence s attend only to keys of sequence s\n"
        "  --bias FILE         float [n_q, n_k] or [H, n_q, n_k], added to the scores\n"
        "                      (-inf masks a key)\n"
        "\n"
        "Outputs (written only when everything succeeded; float32, float64 with\n"
        "--dtype float64; with --dtype bf16/fp16 O and the gradients in that type\n"
        "(bf16 as '<u2' bit patterns) unless --out-float32, A', lse and dL/dbias\n"
        "float32; shapes follow the rank of q):\n"
        "  -o, --out FILE      O: [n_q, D_v], [n_q, H, D_v] or [B, n_q, H, D_v]\n"
        "                      (required unless --grad-out is given)\n"
        "  --attn FILE         A': [n_q, n_k], [H, n_q, n_k] or [B, H, n_q, n_k]\n"
        "                      (masked entries are 0)\n"
        "  --lse FILE          log-sum-exp of each row's visible scores: [n_q], [H, n_q]\n"
        "                      or [B, H, n_q] (-inf for a row that sees no key)\n"
        "  --print             print A' and O as tables on stdout (at most %d x %d\n"
        "                      per matrix and %d matrices)\n"
        "\n",
        PRINT_MAX, PRINT_MAX, PRINT_MAX_BLOCKS);
    /* Split in two: C guarantees string literals of 4095 characters only. */
    fputs(
        "Backward (gradients of a loss L given dL/dO):\n"
        "  --grad-out FILE     dL/dO, shaped as the output O; needs --dq, --dk, --dv\n"
        "  --dq FILE           dL/dQ, shaped as q\n"
        "  --dk FILE           dL/dK, shaped as k (summed over the heads sharing it)\n"
        "  --dv FILE           dL/dV, shaped as v\n"
        "  --dbias FILE        dL/dbias, shaped as --bias (optional, needs --bias)\n"
        "\n"
        "Attention:\n"
        "  --mask SPEC         which keys each query sees (default none):\n"
        "                        none            every key\n"
        "                        causal          keys j <= p\n"
        "                        window:L,R      keys p-L <= j <= p+R (L, R >= 0)\n"
        "                        causal-window:L keys p-L <= j <= p (L >= 0)\n"
        "                      where query i sits at key position p = i + n_k - n_q\n"
        "  --score KIND        scaled (default): scale * q.k, scale 1/sqrt(D);\n"
        "                      dot: q.k;  cosine: cos(q, k) / temperature\n"
        "  --scale S           scale of --score scaled (finite, non-zero)\n"
        "  --temperature T     temperature of --score cosine (finite, > 0; default 1)\n"
        "  --softcap C         soft-cap the scores: s -> C tanh(s / C) (finite, > 0)\n"
        "  --norm KIND         softmax (default), relu: max(s, 0), sigmoid: 1/(1+e^-s)\n"
        "  --relu-count        with --norm relu: divide by the number of visible keys\n"
        "\n"
        "Computation:\n"
        "  --dtype TYPE        float32 (default), float64, bf16 or fp16: the storage\n"
        "                      type of q, k, v, O, dL/dO and the gradients (half types:\n"
        "                      float32 arithmetic, rounded to nearest even when\n"
        "                      stored); float inputs are converted to it, rounded to\n"
        "                      nearest even; bf16 is read and written as uint16 '<u2'\n"
        "                      holding the bit patterns (NumPy has no bfloat16: widen\n"
        "                      with (a.astype(np.uint32) << 16).view(np.float32))\n"
        "  --out-float32       with --dtype bf16/fp16: write O and the gradients as\n"
        "                      float32 (the exact values of the half results)\n"
        "  --impl KIND         auto (default: the fast path where it applies), reference\n"
        "                      (plain loops in double) or fast (error if it does not apply)\n"
        "                      (plain loops accumulating in double)\n"
        "  --threads N         worker threads, 0 (default) = QKV_NUM_THREADS or all cores\n"
        "  --distributed       under mpirun -np P: ring attention over the P ranks (each\n"
        "                      rank reads its own rows of the inputs, rank 0 writes the\n"
        "                      outputs; docs/DISTRIBUTED.md)\n"
        "  -h, --help          show this help and exit\n"
        "\n"
        "Options take their value as the next argument or after '=' (--mask=causal).\n"
        "Exit status: 0 success; 1 an input file is missing, malformed or does not fit,\n"
        "or the computation or a write failed; 2 usage error. On any failure no output\n"
        "file of this run is left behind.\n"
        "\n"
        "Example (the four-word example that ships with qkv):\n"
        "  qkv attend --q examples/data/hello_q.npy --k examples/data/hello_k.npy \\\n"
        "             --v examples/data/hello_v.npy -o out.npy --print\n",
        stdout);
}

/* ------------------------------------------------------------------------- */
/* Options */

#define PARSE_CONTINUE (-1)

#define usage_error(...) cli_usage_error(CMD, __VA_ARGS__)

static int parse_score(const char *s, qkv_attn_desc *d) {
    if (strcmp(s, "scaled") == 0) d->score = QKV_SCORE_SCALED_DOT;
    else if (strcmp(s, "dot") == 0) d->score = QKV_SCORE_DOT;
    else if (strcmp(s, "cosine") == 0) d->score = QKV_SCORE_COSINE;
    else if (strcmp(s, "additive") == 0) {
        cli_error(CMD, "--score", NULL,
                  "'additive' needs learned parameters that qkv attend cannot take; "
                  "use the library (qkv_attn_desc.additive_*)");
        return -1;
    } else {
        cli_error(CMD, "--score", NULL, "unknown score '%s' (expected scaled, dot or cosine)", s);
        return -1;
    }
    return 0;
}

static int parse_norm(const char *s, qkv_attn_desc *d) {
    if (strcmp(s, "softmax") == 0) d->norm = QKV_NORM_SOFTMAX;
    else if (strcmp(s, "relu") == 0) d->norm = QKV_NORM_RELU;
    else if (strcmp(s, "sigmoid") == 0) d->norm = QKV_NORM_SIGMOID;
    else {
        cli_error(CMD, "--norm", NULL,
                  "unknown normaliser '%s' (expected softmax, relu or sigmoid)", s);
        return -1;
    }
    return 0;
}

/* Interpret the value of one option; 0 or -1 (message printed). */
static int take_value(void *ctx, int id, const char *v) {
    config *c = ctx;
    qkv_attn_desc *d = &c->desc;
    double x;
    switch (id) {
    case OPT_MASK: return cli_parse_mask(CMD, v, d);
    case OPT_SCORE: return parse_score(v, d);
    case OPT_NORM: return parse_norm(v, d);
    case OPT_SCALE:
        if (cli_parse_double(CMD, "--scale", v, &x) != 0) return -1;
        if (x == 0.0) {
            cli_error(CMD, "--scale", NULL, "'%s' must be non-zero (leave --scale out for 1/sqrt(D))", v);
            return -1;
        }
        d->scale = x;
        return 0;
    case OPT_TEMPERATURE: return cli_parse_double_above(CMD, "--temperature", v, 0.0, "", &d->temperature);
    case OPT_SOFTCAP:
        return cli_parse_double_above(CMD, "--softcap", v, 0.0, " (leave --softcap out for none)", &d->softcap);
    case OPT_DTYPE:
        if (strcmp(v, "float32") == 0) d->dtype = QKV_F32;
        else if (strcmp(v, "float64") == 0) d->dtype = QKV_F64;
        else if (strcmp(v, "bf16") == 0 || strcmp(v, "bfloat16") == 0) d->dtype = QKV_BF16;
        else if (strcmp(v, "fp16") == 0 || strcmp(v, "float16") == 0) d->dtype = QKV_F16;
        else {
            cli_error(CMD, "--dtype", NULL,
                      "unknown type '%s' (expected float32, float64, bf16 or fp16)", v);
            return -1;
        }
        return 0;
    case OPT_IMPL: return cli_parse_impl(CMD, v, d);
    case OPT_THREADS: return cli_parse_threads(CMD, v, d);
    default: return 0; /* a file name: used as given */
    }
}

/* Returns PARSE_CONTINUE, or the exit status (0 after --help). */
static int parse_args(int argc, char **argv, config *c) {
    cli_args a = {CMD, argc, argv, 1, options, OPT_COUNT, OPT_HELP, help, c->given, 0};
    memset(c, 0, sizeof *c);
    qkv_attn_desc_init(&c->desc);
    if (argc < 2) { /* bare "qkv attend": the synopsis, as a usage error */
        fprintf(stderr,
                "Usage: qkv attend --q Q.npy --k K.npy --v V.npy -o OUT.npy [options]\n"
                "       qkv attend --q Q.npy --k K.npy --v V.npy --grad-out DOUT.npy\n"
                "                  --dq DQ.npy --dk DK.npy --dv DV.npy [-o OUT.npy] [options]\n");
        cli_usage_hint(CMD);
        return CLI_EXIT_USAGE;
    }

    int rc = cli_scan_values(&a, c->val, take_value, c);
    if (rc != PARSE_CONTINUE) return rc;

    /* Which options go together. */
    static const int required[] = {OPT_Q, OPT_K, OPT_V};
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++)
        if (!c->given[required[i]])
            return usage_error(NULL, "missing %s FILE (--q, --k and --v are required)",
                               attend_opt_name(required[i]));
    c->backward = c->given[OPT_GRAD_OUT];
    static const int grads[] = {OPT_DQ, OPT_DK, OPT_DV, OPT_DBIAS};
    for (size_t i = 0; i < sizeof grads / sizeof grads[0]; i++) {
        if (c->given[grads[i]] && !c->backward)
            return usage_error(attend_opt_name(grads[i]),
                               "needs --grad-out FILE (the gradient of the loss with respect "
                               "to the output)");
        if (c->backward && !c->given[grads[i]] && grads[i] != OPT_DBIAS)
            return usage_error("--grad-out", "needs --dq, --dk and --dv (missing %s FILE)",
                               attend_opt_name(grads[i]));
    }
    if (c->given[OPT_DBIAS] && !c->given[OPT_BIAS])
        return usage_error("--dbias", "needs --bias FILE");
    if (!c->backward && !c->given[OPT_OUT])
        return usage_error(NULL, "missing -o OUT.npy (required unless --grad-out is given)");
    if (c->given[OPT_SCALE] && c->desc.score != QKV_SCORE_SCALED_DOT)
        return usage_error("--scale", "applies only to --score scaled");
    if (c->given[OPT_TEMPERATURE] && c->desc.score != QKV_SCORE_COSINE)
        return usage_error("--temperature", "applies only to --score cosine");
    if (c->given[OPT_RELU_COUNT]) {
        if (c->desc.norm != QKV_NORM_RELU) return usage_error("--relu-count", "needs --norm relu");
        c->desc.relu_divide_by_count = 1;
    }
    c->print = c->given[OPT_PRINT];
    if (c->given[OPT_OUT_FLOAT32] && c->desc.dtype != QKV_BF16 && c->desc.dtype != QKV_F16)
        return usage_error("--out-float32", "applies only with --dtype bf16 or fp16");

    /* Two outputs to one file: the second would silently replace the first. */
    static const int outs[] = {OPT_OUT, OPT_ATTN, OPT_LSE, OPT_DQ, OPT_DK, OPT_DV, OPT_DBIAS};
    size_t n_outs = sizeof outs / sizeof outs[0];
    for (size_t i = 0; i < n_outs; i++)
        for (size_t j = i + 1; j < n_outs; j++)
            if (c->given[outs[i]] && c->given[outs[j]] &&
                strcmp(c->val[outs[i]], c->val[outs[j]]) == 0)
                return usage_error(NULL, "%s and %s name the same file '%s'", attend_opt_name(outs[i]),
                                   attend_opt_name(outs[j]), c->val[outs[i]]);
    return PARSE_CONTINUE;
}

/* ------------------------------------------------------------------------- */
/* Inputs */

static const int input_opt[IN_COUNT] = {OPT_Q, OPT_K, OPT_V, OPT_GRAD_OUT, OPT_BIAS,
                                        OPT_KEY_LENGTHS, OPT_SEQ_OFFSETS};

void attend_job_free(job *j) {
    cli_files_free(j->in, IN_COUNT);
    cli_files_free(j->out, OUT_COUNT);
}

#define in_error(in, ...) cli_file_error(CMD, (in), __VA_ARGS__)

static const char *shape_of(const qkv_array *a, char *buf, size_t len) {
    return cli_shape_str(buf, len, a->ndim, a->shape);
}

/* "--k k.npy: shape [5, 2, 8] does not fit --q q.npy [4, 2, 16]: <detail>" */
static void misfit(const input *x, const input *ref, const char *fmt, ...) CLI_PRINTF(3, 4);
static void misfit(const input *x, const input *ref, const char *fmt, ...) {
    char detail[256], xs[160], rs[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    in_error(x, "shape %s does not fit %s %s %s: %s", shape_of(&x->a, xs, sizeof xs),
             ref->opt, ref->path, shape_of(&ref->a, rs, sizeof rs), detail);
}

static int is_half(qkv_dtype t) { return t == QKV_BF16 || t == QKV_F16; }

/* A floating-point input for compute type `to`: float32, float64 and float16
 * convert by value; '<u2' holds bf16 bit patterns (qkv's convention), which
 * only --dtype bf16 reads - any other reading of raw uint16 would be a guess. */
static int want_float(const input *in, qkv_dtype to) {
    qkv_dtype t = in->a.dtype;
    if (t == QKV_F32 || t == QKV_F64 || t == QKV_F16) return 0;
    if (t == QKV_BF16) {
        if (to == QKV_BF16) return 0;
        in_error(in, "dtype uint16 ('<u2') holds bf16 bit patterns by qkv's convention and is read "
                     "only with --dtype bf16 (this run computes in %s; store float32 or float16 "
                     "values for it)",
                 cli_dtype_name(to));
        return -1;
    }
    in_error(in, "dtype %s is not accepted: expected float32, float64, float16 or bf16 as uint16",
             cli_dtype_name(t));
    return -1;
}

static int want_int(const input *in) {
    if (in->a.dtype == QKV_I32 || in->a.dtype == QKV_I64) return 0;
    in_error(in, "dtype %s is not accepted: expected int32 or int64",
             in->a.dtype == QKV_BF16 ? "uint16 ('<u2', read as bf16)" : cli_dtype_name(in->a.dtype));
    return -1;
}

static dims dims_of(const qkv_array *a) {
    dims r = {1, 1, 1, 1};
    const int64_t *s = a->shape;
    if (a->ndim == 2) {
        r.n = s[0];
        r.d = s[1];
    } else if (a->ndim == 3) {
        r.n = s[0];
        r.h = s[1];
        r.d = s[2];
    } else if (a->ndim == 4) {
        r.b = s[0];
        r.n = s[1];
        r.h = s[2];
        r.d = s[3];
    }
    return r;
}

static long long ll(int64_t x) { return (long long)x; }

/* Load every input, check that they fit together, convert them to the compute
 * dtype, and fill the sizes and tensors of the descriptor. 0 or -1. */
/* --key-lengths: [B] integers in 0..n_k (q, k: for the messages). 0 or -1. */
static int check_key_lengths(input *kl, const input *q, const input *k, int64_t B, int64_t n_k) {
    char sh[160];
    if (want_int(kl)) return -1;
    if (kl->a.ndim != 1 || kl->a.shape[0] != B) {
        in_error(kl, "shape %s does not fit: expected [B] = [%lld] (B from --q %s)",
                 shape_of(&kl->a, sh, sizeof sh), ll(B), q->path);
        return -1;
    }
    if (cli_file_convert(CMD, kl, QKV_I64)) return -1;
    const int64_t *len = kl->a.data;
    for (int64_t b = 0; b < B; b++) {
        if (len[b] < 0 || len[b] > n_k) {
            in_error(kl, "entry %lld is %lld, outside 0..%lld (n_k of --k %s)", ll(b),
                     ll(len[b]), ll(n_k), k->path);
            return -1;
        }
    }
    return 0;
}

/* --seq-offsets, packed sequences: [S+1] offsets 0 = o_0 <= ... <= o_S = n,
 * B = 1, n_q = n_k; into the descriptor's num_seqs and seq_offsets_q. 0 or -1. */
static int check_seq_offsets(input *so, const input *q, const input *k, dims dq, int64_t n_k,
                             qkv_attn_desc *d) {
    char sh[160];
    if (want_int(so)) return -1;
    if (so->a.ndim != 1 || so->a.shape[0] < 2) {
        in_error(so, "shape %s does not fit: expected [S+1] offsets of S >= 1 sequences",
                 shape_of(&so->a, sh, sizeof sh));
        return -1;
    }
    if (dq.b != 1) {
        in_error(so, "packed sequences need B = 1, but --q %s has B = %lld", q->path, ll(dq.b));
        return -1;
    }
    if (dq.n != n_k) {
        in_error(so, "packed sequences need n_q = n_k, but --q %s has n_q = %lld and --k %s "
                     "has n_k = %lld",
                 q->path, ll(dq.n), k->path, ll(n_k));
        return -1;
    }
    if (cli_file_convert(CMD, so, QKV_I64)) return -1;
    const int64_t *o = so->a.data;
    int64_t ns = so->a.shape[0] - 1;
    if (o[0] != 0) {
        in_error(so, "entry 0 is %lld: offsets must start at 0", ll(o[0]));
        return -1;
    }
    for (int64_t s = 0; s < ns; s++) {
        if (o[s + 1] < o[s]) {
            in_error(so, "entry %lld (%lld) is smaller than entry %lld (%lld): offsets must "
                         "be nondecreasing",
                     ll(s + 1), ll(o[s + 1]), ll(s), ll(o[s]));
            return -1;
        }
    }
    if (o[ns] != dq.n) {
        in_error(so, "last entry is %lld: must be the total length n = %lld of --q %s",
                 ll(o[ns]), ll(dq.n), q->path);
        return -1;
    }
    d->num_seqs = ns;
    d->seq_offsets_q = o;
    return 0;
}

int attend_load_inputs(const config *c, job *j, qkv_attn_desc *d, dims *dq_out) {
    input *q = &j->in[IN_Q], *k = &j->in[IN_K], *v = &j->in[IN_V];
    for (int i = 0; i < IN_COUNT; i++) {
        j->in[i].opt = attend_opt_name(input_opt[i]);
        j->in[i].path = c->given[input_opt[i]] ? c->val[input_opt[i]] : NULL;
    }
    for (int i = 0; i < IN_COUNT; i++)
        if (j->in[i].path &&
            cli_file_load(CMD, &j->in[i],
                          j->header_only && i != IN_KEY_LENGTHS && i != IN_SEQ_OFFSETS) != 0)
            return -1;

    /* q, k, v: float tensors of one rank 2..4. */
    char sh[160];
    if (want_float(q, d->dtype) || want_float(k, d->dtype) || want_float(v, d->dtype)) return -1;
    if (q->a.ndim < 2 || q->a.ndim > 4) {
        in_error(q, "rank %d array %s: expected [n, D], [n, H, D] or [B, n, H, D]", q->a.ndim,
                 shape_of(&q->a, sh, sizeof sh));
        return -1;
    }
    if (k->a.ndim != q->a.ndim) {
        misfit(k, q, "rank %d != %d (q, k and v must have the same rank)", k->a.ndim, q->a.ndim);
        return -1;
    }
    if (v->a.ndim != q->a.ndim) {
        misfit(v, q, "rank %d != %d (q, k and v must have the same rank)", v->a.ndim, q->a.ndim);
        return -1;
    }
    if (cli_file_nonempty(CMD, q) || cli_file_nonempty(CMD, k) || cli_file_nonempty(CMD, v)) return -1;
    dims dq = dims_of(&q->a), dk = dims_of(&k->a), dv = dims_of(&v->a);
    if (dk.b != dq.b) {
        misfit(k, q, "batch %lld != %lld", ll(dk.b), ll(dq.b));
        return -1;
    }
    if (dk.d != dq.d) {
        misfit(k, q, "head dim %lld != %lld", ll(dk.d), ll(dq.d));
        return -1;
    }
    if (dq.h % dk.h != 0) {
        misfit(k, q, "%lld query heads are not a multiple of %lld key/value heads", ll(dq.h),
               ll(dk.h));
        return -1;
    }
    if (dv.b != dk.b) {
        misfit(v, k, "batch %lld != %lld", ll(dv.b), ll(dk.b));
        return -1;
    }
    if (dv.n != dk.n) {
        misfit(v, k, "number of keys n %lld != %lld", ll(dv.n), ll(dk.n));
        return -1;
    }
    if (dv.h != dk.h) {
        misfit(v, k, "key/value heads %lld != %lld", ll(dv.h), ll(dk.h));
        return -1;
    }

    /* dL/dO: exactly the output's shape. */
    input *go = &j->in[IN_DOUT];
    if (go->path) {
        int64_t want[4];
        int r = q->a.ndim, m = 0;
        if (r == 4) want[m++] = dq.b;
        want[m++] = dq.n;
        if (r >= 3) want[m++] = dq.h;
        want[m++] = dv.d;
        if (want_float(go, d->dtype)) return -1;
        int ok = go->a.ndim == r;
        for (int i = 0; ok && i < r; i++) ok = go->a.shape[i] == want[i];
        if (!ok) {
            char ws[160];
            in_error(go, "shape %s does not fit: expected the output's shape %s (n_q, H from --q %s, "
                         "D_v from --v %s)",
                     shape_of(&go->a, sh, sizeof sh), cli_shape_str(ws, sizeof ws, r, want), q->path,
                     v->path);
            return -1;
        }
    }

    /* Bias: [n_q, n_k] or [H, n_q, n_k]. */
    input *bias = &j->in[IN_BIAS];
    if (bias->path) {
        if (want_float(bias, is_half(d->dtype) ? QKV_F32 : d->dtype)) return -1;
        const int64_t *s = bias->a.shape;
        if (bias->a.ndim == 2 && s[0] == dq.n && s[1] == dk.n) {
            d->bias_kind = QKV_BIAS_SHARED;
        } else if (bias->a.ndim == 3 && s[0] == dq.h && s[1] == dq.n && s[2] == dk.n) {
            d->bias_kind = QKV_BIAS_PER_HEAD;
        } else {
            in_error(bias, "shape %s does not fit: expected [n_q, n_k] = [%lld, %lld] or "
                           "[H, n_q, n_k] = [%lld, %lld, %lld] (from --q %s and --k %s)",
                     shape_of(&bias->a, sh, sizeof sh), ll(dq.n), ll(dk.n), ll(dq.h), ll(dq.n),
                     ll(dk.n), q->path, k->path);
            return -1;
        }
    }

    input *kl = &j->in[IN_KEY_LENGTHS], *so = &j->in[IN_SEQ_OFFSETS];
    if (kl->path && check_key_lengths(kl, q, k, dq.b, dk.n) != 0) return -1;
    if (so->path && check_seq_offsets(so, q, k, dq, dk.n, d) != 0) return -1;

    /* Everything fits: convert the tensors to the compute type (the bias of a
     * half-precision call is float32, as the API wants). */
    static const int tensors[] = {IN_Q, IN_K, IN_V, IN_DOUT};
    for (size_t i = 0; i < sizeof tensors / sizeof tensors[0] && !j->header_only; i++)
        if (j->in[tensors[i]].path && cli_file_convert(CMD, &j->in[tensors[i]], d->dtype)) return -1;
    if (bias->path && !j->header_only &&
        cli_file_convert(CMD, bias, is_half(d->dtype) ? QKV_F32 : d->dtype))
        return -1;

    d->batch = dq.b;
    d->n_q = dq.n;
    d->n_k = dk.n;
    d->heads = dq.h;
    d->heads_kv = dk.h;
    d->dim = dq.d;
    d->dim_v = dv.d;
    d->key_lengths = kl->path ? kl->a.data : NULL;
    d->bias = bias->path ? bias->a.data : NULL;
    *dq_out = dq;
    return 0;
}

/* A library status, blamed on the input it concerns. */
void attend_status_error(const job *j, const char *what, qkv_status s) {
    int blame = -1;
    switch (s) {
    case QKV_ERR_HEADS: blame = IN_K; break;
    case QKV_ERR_KEY_LENGTHS: blame = IN_KEY_LENGTHS; break;
    case QKV_ERR_SEQ_OFFSETS: blame = IN_SEQ_OFFSETS; break;
    default: break;
    }
    if (blame >= 0 && j->in[blame].path)
        in_error(&j->in[blame], "%s: %s", what, qkv_status_string(s));
    else if (s == QKV_ERR_WINDOW)
        cli_error(CMD, "--mask", NULL, "%s: %s", what, qkv_status_string(s));
    else
        cli_error(CMD, NULL, NULL, "%s: %s", what, qkv_status_string(s));
}

/* ------------------------------------------------------------------------- */
/* Outputs */

int attend_alloc_output(job *j, int which, const char *path, qkv_dtype dt, int ndim,
                        const int64_t *shape, const char *what) {
    output *o = &j->out[which];
    o->path = path;
    return cli_file_alloc(CMD, o, path ? o->opt : "--print", dt, ndim, shape, what);
}


static double elem(const qkv_array *a, int64_t i) {
    return a->dtype == QKV_F64 ? ((const double *)a->data)[i] : (double)((const float *)a->data)[i];
}

/* One matrix of a tensor as an aligned table: rows x cols elements starting at
 * base with the given row stride (columns are contiguous). */
static void print_table(const qkv_array *a, int64_t base, int64_t rows, int64_t cols,
                        int64_t row_stride, char row_tag, char col_tag) {
    int64_t r_show = rows < PRINT_MAX ? rows : PRINT_MAX;
    int64_t c_show = cols < PRINT_MAX ? cols : PRINT_MAX;
    double big = 0.0;
    for (int64_t r = 0; r < r_show; r++)
        for (int64_t col = 0; col < c_show; col++) {
            double x = fabs(elem(a, base + r * row_stride + col));
            if (isfinite(x) && x > big) big = x;
        }
    int sci = big >= 1e5; /* keep the columns aligned for large values */
    int width = sci ? 11 : 9;
    printf("%5s", "");
    for (int64_t col = 0; col < c_show; col++) {
        char label[24];
        snprintf(label, sizeof label, "%c%lld", col_tag, ll(col));
        printf(" %*s", width, label);
    }
    printf("\n");
    for (int64_t r = 0; r < r_show; r++) {
        printf("%c%-4lld", row_tag, ll(r));
        for (int64_t col = 0; col < c_show; col++) {
            double x = elem(a, base + r * row_stride + col);
            if (sci) printf(" %*.3e", width, x);
            else printf(" %*.4f", width, x);
        }
        printf("\n");
    }
    if (r_show < rows || c_show < cols)
        printf("(truncated: showing %lld of %lld rows and %lld of %lld columns)\n", ll(r_show),
               ll(rows), ll(c_show), ll(cols));
}

static void print_heading(int64_t b, int64_t h, int64_t batch, int64_t heads) {
    if (batch > 1) printf("batch %lld, head %lld:\n", ll(b), ll(h));
    else if (heads > 1) printf("head %lld:\n", ll(h));
}

static void print_results(const qkv_attn_desc *d, const qkv_array *attn, const qkv_array *out) {
    static const char *const score_names[] = {"scaled dot-product", "dot-product", "cosine",
                                              "additive"};
    static const char *const norm_names[] = {"softmax", "relu", "sigmoid"};
    int64_t B = d->batch, H = d->heads, nq = d->n_q, nk = d->n_k, dv = d->dim_v;
    int64_t blocks = B * H, shown = blocks < PRINT_MAX_BLOCKS ? blocks : PRINT_MAX_BLOCKS;

    printf("Attention weights A' = %s(%s scores)  [rows: queries q, columns: keys k]\n",
           norm_names[d->norm], score_names[d->score]);
    for (int64_t i = 0; i < shown; i++) {
        int64_t b = i / H, h = i % H;
        print_heading(b, h, B, H);
        print_table(attn, (b * H + h) * nq * nk, nq, nk, nk, 'q', 'k');
    }
    if (shown < blocks) printf("(%lld more matrices not shown)\n", ll(blocks - shown));

    printf("\nOutput O = A' V  [rows: queries q, columns: value dimensions d]\n");
    for (int64_t i = 0; i < shown; i++) {
        int64_t b = i / H, h = i % H;
        print_heading(b, h, B, H);
        print_table(out, (b * nq * H + h) * dv, nq, dv, H * dv, 'q', 'd');
    }
    if (shown < blocks) printf("(%lld more matrices not shown)\n", ll(blocks - shown));
}

/* ------------------------------------------------------------------------- */

static int run(const config *c, job *j) {
    qkv_attn_desc d = c->desc;
    dims dq;
    for (int i = 0; i < OUT_COUNT; i++) j->out[i].opt = attend_opt_name(output_opt[i]);
    if (attend_load_inputs(c, j, &d, &dq) != 0) return CLI_EXIT_FAIL;

    qkv_status s = qkv_attn_desc_check(&d);
    if (s != QKV_OK) {
        attend_status_error(j, "invalid attention request", s);
        return CLI_EXIT_FAIL;
    }

    /* Output shapes follow the rank of q (see help()). */
    const qkv_array *qa = &j->in[IN_Q].a;
    int r = qa->ndim;
    int64_t o_shape[4], a_shape[4], l_shape[3];
    int m = 0, ma = 0;
    if (r == 4) o_shape[m++] = dq.b;
    o_shape[m++] = dq.n;
    if (r >= 3) o_shape[m++] = dq.h;
    o_shape[m++] = d.dim_v;
    if (r == 4) a_shape[ma++] = dq.b;
    if (r >= 3) a_shape[ma++] = dq.h;
    a_shape[ma++] = dq.n;
    memcpy(l_shape, a_shape, sizeof l_shape);
    a_shape[ma++] = d.n_k;

    const char *path_of[OUT_COUNT];
    for (int i = 0; i < OUT_COUNT; i++)
        path_of[i] = c->given[output_opt[i]] ? c->val[output_opt[i]] : NULL;
    int forward = path_of[OUT_O] || path_of[OUT_ATTN] || path_of[OUT_LSE] || c->print;
    /* Half-precision calls keep A', lse and dbias in float32 (the API's rule). */
    const qkv_dtype aux = is_half(d.dtype) ? QKV_F32 : d.dtype;
    if (forward) {
        if (attend_alloc_output(j, OUT_O, path_of[OUT_O], d.dtype, r, o_shape, "the output") ||
            ((path_of[OUT_ATTN] || c->print) &&
             attend_alloc_output(j, OUT_ATTN, path_of[OUT_ATTN], aux, ma, a_shape,
                          "the attention matrix")) ||
            (path_of[OUT_LSE] &&
             attend_alloc_output(j, OUT_LSE, path_of[OUT_LSE], aux, ma - 1, l_shape, "the log-sum-exp")))
            return CLI_EXIT_FAIL;
        s = qkv_attention_forward(&d, j->in[IN_Q].a.data, j->in[IN_K].a.data, j->in[IN_V].a.data,
                                  j->out[OUT_O].a.data, j->out[OUT_ATTN].a.data,
                                  j->out[OUT_LSE].a.data);
        if (s != QKV_OK) {
            attend_status_error(j, "attention forward failed", s);
            return CLI_EXIT_FAIL;
        }
    }
    if (c->backward) {
        const input *bias = &j->in[IN_BIAS];
        if (attend_alloc_output(j, OUT_DQ, path_of[OUT_DQ], d.dtype, qa->ndim, qa->shape, "dL/dQ") ||
            attend_alloc_output(j, OUT_DK, path_of[OUT_DK], d.dtype, j->in[IN_K].a.ndim,
                         j->in[IN_K].a.shape, "dL/dK") ||
            attend_alloc_output(j, OUT_DV, path_of[OUT_DV], d.dtype, j->in[IN_V].a.ndim,
                         j->in[IN_V].a.shape, "dL/dV") ||
            (path_of[OUT_DBIAS] && attend_alloc_output(j, OUT_DBIAS, path_of[OUT_DBIAS], aux,
                                                bias->a.ndim, bias->a.shape, "dL/dbias")))
            return CLI_EXIT_FAIL;
        qkv_attn_grads g;
        memset(&g, 0, sizeof g);
        g.dq = j->out[OUT_DQ].a.data;
        g.dk = j->out[OUT_DK].a.data;
        g.dv = j->out[OUT_DV].a.data;
        g.dbias = j->out[OUT_DBIAS].a.data;
        s = qkv_attention_backward(&d, j->in[IN_Q].a.data, j->in[IN_K].a.data,
                                   j->in[IN_V].a.data, j->out[OUT_O].a.data,
                                   j->out[OUT_LSE].a.data, j->in[IN_DOUT].a.data, &g);
        if (s != QKV_OK) {
            attend_status_error(j, "attention backward failed", s);
            return CLI_EXIT_FAIL;
        }
    }

    /* Half results widened (exactly) for --out-float32. */
    if (is_half(d.dtype) && c->given[OPT_OUT_FLOAT32]) {
        static const int halves[] = {OUT_O, OUT_DQ, OUT_DK, OUT_DV};
        for (size_t i = 0; i < sizeof halves / sizeof halves[0]; i++) {
            output *o = &j->out[halves[i]];
            if (!o->a.data) continue;
            qkv_array w;
            s = qkv_array_convert(&o->a, QKV_F32, &w);
            if (s != QKV_OK) {
                cli_error(CMD, o->path ? o->opt : "--print", o->path,
                          "cannot widen the result to float32: %s", qkv_status_string(s));
                return CLI_EXIT_FAIL;
            }
            qkv_array_free(&o->a);
            o->a = w;
        }
    }
    /* A float32 copy of a half O to print (the file keeps the half values). */
    qkv_array shown;
    memset(&shown, 0, sizeof shown);
    if (c->print && is_half(j->out[OUT_O].a.dtype)) {
        s = qkv_array_convert(&j->out[OUT_O].a, QKV_F32, &shown);
        if (s != QKV_OK) {
            cli_error(CMD, "--print", NULL, "cannot widen the output to float32: %s",
                      qkv_status_string(s));
            return CLI_EXIT_FAIL;
        }
    }
    int rc = cli_files_write(CMD, j->out, OUT_COUNT) != 0 ? CLI_EXIT_FAIL : CLI_EXIT_OK;
    if (rc == CLI_EXIT_OK && c->print)
        print_results(&d, &j->out[OUT_ATTN].a, shown.data ? &shown : &j->out[OUT_O].a);
    qkv_array_free(&shown);
    return rc;
}

int cli_cmd_attend(int argc, char **argv) {
    config c;
    int rc = parse_args(argc, argv, &c);
    if (rc != PARSE_CONTINUE) return rc;
    if (c.given[OPT_DISTRIBUTED]) return attend_distributed(&c);
    job j;
    memset(&j, 0, sizeof j);
    rc = run(&c, &j);
    attend_job_free(&j);
    return cli_flush_stdout(CMD, rc);
}

