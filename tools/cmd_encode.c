/* qkv embed, tokenize, similarity, search: a pretrained BERT-family encoder
 * (qkv/encoder.h, docs/ENCODER.md) on texts given on the command line or
 * read from a file, one sentence per line.
 *
 *   qkv embed      --model DIR (--text T ... | --input FILE) -o OUT.npy
 *   qkv tokenize   --model DIR (--text T ... | --input FILE) [--tokens]
 *   qkv similarity --model DIR (--text A --text B ... | --input FILE)
 *   qkv search     --model DIR --corpus FILE --query Q ... [--top K]
 *
 * Every command works in the same order, so that bad input never leaves a
 * partial result: parse the options, read the texts, load the model, then
 * tokenize every text once (which is where invalid UTF-8 is found and
 * reported with its file, line and byte), then compute into memory, then
 * write (the .npy outputs atomically: qkv_npy_save renames a finished
 * temporary file; stdout only once everything is computed). */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, fileno, isatty, stat */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "cli_npy.h"
#include "cli_util.h"
#include "qkv.h"
#include "train_common.h" /* train_read_file */

#define MAX_THREADS 65536
#define MAX_BATCH 1000000
#define LABEL_BYTES 60 /* texts printed as labels are cut after this many bytes */
#define POOLING_NONE (-2) /* --pooling none: the token states themselves */

enum {
    OPT_HELP, OPT_MODEL, OPT_TEXT, OPT_INPUT, OPT_OUT, OPT_OFFSETS, OPT_POOLING, OPT_NO_NORMALIZE,
    OPT_BATCH, OPT_THREADS, OPT_MAX_LENGTH, OPT_TOKENS, OPT_CORPUS, OPT_QUERY, OPT_TOP, OPT_PRECISION, OPT_COUNT
};

/* Every option of the four commands, indexed by id; each command accepts the
 * subset its spec lists. */
static const cli_opt all_options[OPT_COUNT] = {
    {"--help", "-h", 0, OPT_HELP},
    {"--model", NULL, 1, OPT_MODEL},
    {"--text", NULL, 1, OPT_TEXT},
    {"--input", NULL, 1, OPT_INPUT},
    {"-o", "--out", 1, OPT_OUT},
    {"--offsets", NULL, 1, OPT_OFFSETS},
    {"--pooling", NULL, 1, OPT_POOLING},
    {"--no-normalize", NULL, 0, OPT_NO_NORMALIZE},
    {"--batch", NULL, 1, OPT_BATCH},
    {"--threads", NULL, 1, OPT_THREADS},
    {"--max-length", NULL, 1, OPT_MAX_LENGTH},
    {"--tokens", NULL, 0, OPT_TOKENS},
    {"--corpus", NULL, 1, OPT_CORPUS},
    {"--query", NULL, 1, OPT_QUERY},
    {"--top", NULL, 1, OPT_TOP},
    {"--precision", NULL, 1, OPT_PRECISION},
};

#define PRECISION_HELP                                                                  \
    "  --precision P       the projections' arithmetic: fp32 (default), bf16 (bf16\n"  \
    "                      weights and activations, float sums) or int8 (weights\n"   \
    "                      int8 per output channel, activations per row); see\n"      \
    "                      docs/ENCODER.md for their accuracy\n"

/* ------------------------------------------------------------------------- */
/* Help */

static const char common_help[] =
    "Model:\n"
    "  --model DIR         a Hugging Face / sentence-transformers BERT model folder:\n"
    "                      config.json, model.safetensors, vocab.txt (docs/ENCODER.md)\n"
    "  --max-length N      truncate every text to N tokens, [CLS] and [SEP] included\n"
    "                      (default: the model's max_seq_length; 2 .. its positions)\n"
    "  --threads N         worker threads, 0 (default) = QKV_NUM_THREADS or all cores\n";

static const char texts_help[] =
    "Texts (one of):\n"
    "  --text TEXT         a sentence (UTF-8, not empty); may be repeated\n"
    "  --input FILE        UTF-8, one sentence per line: an empty line is the empty\n"
    "                      sentence ([CLS] [SEP]); a line's trailing CR and the file's\n"
    "                      final newline are dropped; an empty file is an error\n";

/* The help of a command: its synopsis, what it does, the model's options,
 * the texts' options (when texts is not NULL) and the rest. */
static void print_help(const char *synopsis, const char *intro, const char *texts, const char *rest) {
    fputs(synopsis, stdout);
    printf("\n%s\n", intro);
    fputs(common_help, stdout);
    if (texts) printf("\n%s", texts);
    printf("\n%s", rest);
}

static const char embed_synopsis[] =
    "Usage: qkv embed --model DIR (--text TEXT ... | --input FILE) -o OUT.npy [options]\n"
    "       qkv embed ... --pooling none -o STATES.npy [--offsets OFF.npy]\n";

static void embed_help(void) {
    print_help(embed_synopsis,
               "Sentence vectors of a pretrained BERT-family encoder, as sentence-transformers\n"
               "computes them (pooling and normalisation as the model folder says), or the\n"
               "last layer's token states.\n",
               texts_help,
               "Output (written only when every text succeeded; nothing on any error):\n"
               "  -o, --out FILE      float32 [sentences, hidden], or with --pooling none the\n"
               "                      token states [tokens, hidden] of all sentences end to end\n"
               "  --offsets FILE      with --pooling none: int64 [sentences + 1], sentence s is\n"
               "                      rows offsets[s] .. offsets[s+1]-1 (offsets[0] = 0)\n"
               "  --pooling KIND      mean, cls, max (default: the model's), or none\n"
               "  --no-normalize      leave the pooled vectors' length as it is (default: the\n"
               "                      model's Normalize module decides)\n"
               "  --batch N           sentences per forward call (default 32); the result\n"
               "                      depends on it only through float rounding\n"
               PRECISION_HELP
               "\n"
               "A progress line goes to stderr when it is a terminal and there is more than\n"
               "one batch.\n"
               "\n"
               "Example:\n"
               "  qkv embed --model all-MiniLM-L6-v2 --input sentences.txt -o vectors.npy\n");
}

static const char tokenize_synopsis[] =
    "Usage: qkv tokenize --model DIR (--text TEXT ... | --input FILE) [--tokens]\n";

static void tokenize_help(void) {
    print_help(tokenize_synopsis,
               "The token ids the encoder reads: one line per sentence, space-separated,\n"
               "[CLS] and [SEP] included, truncated at the model's maximum length (or\n"
               "--max-length) exactly as qkv embed truncates.\n",
               texts_help,
               "Output:\n"
               "  --tokens            print the word pieces (e.g. [CLS] hello , i love you ! [SEP])\n"
               "                      instead of their ids\n"
               "\n"
               "Example:\n"
               "  qkv tokenize --model all-MiniLM-L6-v2 --text 'Hello, I love you!'\n");
}

static const char similarity_synopsis[] =
    "Usage: qkv similarity --model DIR (--text A --text B ... | --input FILE) [options]\n";

static void similarity_help(void) {
    print_help(similarity_synopsis,
               "The cosine similarity of every pair of at least two sentences: a matrix with\n"
               "a row and a column per text, numbered [1] .. [n], each row followed by its\n"
               "text (cut after 60 bytes, then '...'). The diagonal is 1; a sentence\n"
               "vector of length zero has cosine 0 with everything.\n",
               texts_help,
               "Vectors:\n"
               "  --pooling KIND      mean, cls or max (default: the model's)\n"
               "  --batch N           sentences per forward call (default 32)\n"
               PRECISION_HELP
               "\n"
               "Example:\n"
               "  qkv similarity --model all-MiniLM-L6-v2 --text 'A cat sits.' --text 'A dog runs.'\n");
}

static const char search_synopsis[] =
    "Usage: qkv search --model DIR --corpus FILE --query TEXT ... [--top K] [options]\n";

static void search_help(void) {
    print_help(search_synopsis,
               "Semantic search: for each query, the K lines of the corpus whose sentence\n"
               "vectors have the largest cosine with the query's, best first (ties: the\n"
               "earlier line first), each with its cosine, its line number (from 1) and\n"
               "its text (cut after 60 bytes, then '...').\n",
               NULL,
               "Texts:\n"
               "  --corpus FILE       UTF-8, one sentence per line (as --input of qkv embed)\n"
               "  --query TEXT        a sentence to look up; may be repeated\n"
               "  --top K             how many lines per query (default 5; fewer when the\n"
               "                      corpus is shorter)\n"
               "  --pooling KIND      mean, cls or max (default: the model's)\n"
               "  --batch N           sentences per forward call (default 32)\n"
               PRECISION_HELP
               "\n"
               "Example:\n"
               "  qkv search --model all-MiniLM-L6-v2 --corpus faq.txt --query 'how do I reset it'\n");
}

/* ------------------------------------------------------------------------- */
/* Texts */

/* A list of texts and where they came from: the option ("--text", "--input",
 * ...) and, for a file, its path (then text i is line i + 1). The bytes
 * point into argv or into the file's buffer. */
typedef struct text_list {
    const char *opt;
    const char *path;
    const char **p;
    size_t *len;
    int64_t n, cap;
    unsigned char *file; /* owned: the file's bytes */
} text_list;

static int push_text(const char *cmd, text_list *l, const char *p, size_t len) {
    if (l->n == l->cap) {
        int64_t cap = l->cap ? 2 * l->cap : 64;
        const char **np = realloc(l->p, (size_t)cap * sizeof *np);
        if (np) l->p = np;
        size_t *nl = np ? realloc(l->len, (size_t)cap * sizeof *nl) : NULL;
        if (!nl) {
            cli_error(cmd, l->opt, l->path, "out of memory for %lld texts", (long long)cap);
            return -1;
        }
        l->len = nl;
        l->cap = cap;
    }
    l->p[l->n] = p;
    l->len[l->n] = len;
    l->n++;
    return 0;
}

/* The lines of file `path` (given by option `opt`) into l. 0, or -1 after
 * printing why. */
static int read_lines(const char *cmd, const char *opt, const char *path, text_list *l) {
    size_t n;
    l->opt = opt;
    l->path = path;
    l->file = train_read_file(cmd, opt, path, &n);
    if (!l->file) return -1;
    if (n == 0) {
        cli_error(cmd, opt, path, "%s holds no sentences (an empty file; one empty line is the "
                                  "empty sentence)", path);
        return -1;
    }
    const char *b = (const char *)l->file;
    for (size_t start = 0; start < n;) {
        const char *nl = memchr(b + start, '\n', n - start);
        size_t end = nl ? (size_t)(nl - b) : n, len = end - start;
        if (len > 0 && b[end - 1] == '\r') len--;
        if (push_text(cmd, l, b + start, len) != 0) return -1;
        start = end + 1;
    }
    return 0;
}

static void free_texts(text_list *l) {
    free(l->p);
    free(l->len);
    free(l->file);
    memset(l, 0, sizeof *l);
}

/* Print what is wrong with text i of l, naming it: "line 3 (from byte 40 of the
 * file)" or "--text: number 3". */
static void report_text(const char *cmd, const text_list *l, int64_t i, const char *what) {
    if (l->path)
        cli_error(cmd, l->opt, l->path, "line %lld (from byte %lld of the file): %s", (long long)i + 1,
                  (long long)(l->p[i] - (const char *)l->file), what);
    else
        cli_error(cmd, l->opt, NULL, "number %lld: %s", (long long)i + 1, what);
}

/* ------------------------------------------------------------------------- */
/* The job every command shares */

typedef struct job {
    const char *cmd;
    const char *val[OPT_COUNT];
    int given[OPT_COUNT];
    text_list texts;   /* --text / --input, or --corpus (search) */
    text_list queries; /* --query (search) */
    int64_t batch, threads, max_length, top;
    int pooling;       /* QKV_POOLING_FROM_MODEL, a qkv_pooling or POOLING_NONE */
    int precision;     /* a qkv_encoder_precision */
    qkv_encoder *enc;
    qkv_encoder_info info;
    int32_t *ids;      /* [info.max_length]: one text's ids */
} job;

#define PARSE_CONTINUE (-1)

static void free_job(job *j) {
    free_texts(&j->texts);
    free_texts(&j->queries);
    qkv_encoder_free(j->enc);
    free(j->ids);
}

/* Interpret one option's value; 0, or -1 after printing why. */
static int take_value(job *j, int id, const char *v) {
    int64_t n;
    switch (id) {
    case OPT_TEXT: return push_text(j->cmd, &j->texts, v, strlen(v));
    case OPT_QUERY: return push_text(j->cmd, &j->queries, v, strlen(v));
    case OPT_BATCH:
    case OPT_THREADS:
    case OPT_MAX_LENGTH:
    case OPT_TOP: {
        /* The integers: their range, and where each goes. */
        int64_t lo = id == OPT_THREADS ? 0 : id == OPT_MAX_LENGTH ? 2 : 1;
        int64_t hi = id == OPT_BATCH ? MAX_BATCH : id == OPT_THREADS ? MAX_THREADS : INT32_MAX;
        int64_t *to = id == OPT_BATCH ? &j->batch : id == OPT_THREADS ? &j->threads
                                                  : id == OPT_MAX_LENGTH ? &j->max_length : &j->top;
        if (cli_parse_int64(j->cmd, all_options[id].name, v, lo, hi, &n) != 0) return -1;
        *to = n;
        return 0;
    }
    case OPT_POOLING:
        if (strcmp(v, "mean") == 0) j->pooling = QKV_POOLING_MEAN;
        else if (strcmp(v, "cls") == 0) j->pooling = QKV_POOLING_CLS;
        else if (strcmp(v, "max") == 0) j->pooling = QKV_POOLING_MAX;
        else if (strcmp(v, "none") == 0 && strcmp(j->cmd, "embed") == 0) j->pooling = POOLING_NONE;
        else {
            cli_error(j->cmd, "--pooling", NULL, "unknown pooling '%s' (expected mean, cls, max%s)", v,
                      strcmp(j->cmd, "embed") == 0 ? " or none" : "");
            return -1;
        }
        return 0;
    case OPT_PRECISION:
        if (strcmp(v, "fp32") == 0) j->precision = QKV_ENCODER_FP32;
        else if (strcmp(v, "bf16") == 0) j->precision = QKV_ENCODER_BF16;
        else if (strcmp(v, "int8") == 0) j->precision = QKV_ENCODER_INT8;
        else {
            cli_error(j->cmd, "--precision", NULL, "unknown precision '%s' (expected fp32, bf16 or int8)", v);
            return -1;
        }
        return 0;
    default: return 0; /* a path: used as given */
    }
}

/* Scan argv with the options `ids` of one command; the texts' options fill
 * j->texts / j->queries. Returns PARSE_CONTINUE or the exit status. */
static int parse_args(job *j, const char *cmd, int argc, char **argv, const int *ids, size_t n_ids,
                      void (*help)(void), const char *synopsis) {
    cli_opt opts[OPT_COUNT];
    for (size_t i = 0; i < n_ids; i++) opts[i] = all_options[ids[i]];
    memset(j, 0, sizeof *j);
    j->cmd = cmd;
    j->batch = 32;
    j->top = 5;
    j->pooling = QKV_POOLING_FROM_MODEL;
    j->texts.opt = "--text";
    j->queries.opt = "--query";
    if (argc < 2) { /* the bare command: its synopsis, as a usage error */
        fputs(synopsis, stderr);
        cli_usage_hint(cmd);
        return CLI_EXIT_USAGE;
    }
    cli_args a = {cmd, argc, argv, 1, opts, n_ids, OPT_HELP, help, j->given, 0};
    const char *name, *value;
    for (int id; (id = cli_scan(&a, &name, &value)) != CLI_END;) {
        if (id == CLI_STOP) return a.status;
        if (id == OPT_TEXT || id == OPT_QUERY) j->given[id] = 0; /* these may be repeated */
        j->val[id] = value;
        if (value && take_value(j, id, value) != 0) {
            cli_usage_hint(cmd);
            return CLI_EXIT_USAGE;
        }
    }
    j->given[OPT_TEXT] = j->texts.n > 0;
    j->given[OPT_QUERY] = j->queries.n > 0;
    if (!j->given[OPT_MODEL]) return cli_usage_error(cmd, NULL, "missing --model DIR");
    return PARSE_CONTINUE;
}

/* --text or --input (exactly one), into j->texts. PARSE_CONTINUE or the exit status. */
static int take_texts(job *j) {
    if (j->given[OPT_TEXT] && j->given[OPT_INPUT])
        return cli_usage_error(j->cmd, "--input", "and --text both give the texts: use one of them");
    if (!j->given[OPT_TEXT] && !j->given[OPT_INPUT])
        return cli_usage_error(j->cmd, NULL, "no texts: give --text TEXT (repeatable) or --input FILE");
    if (j->given[OPT_INPUT] && read_lines(j->cmd, "--input", j->val[OPT_INPUT], &j->texts) != 0)
        return CLI_EXIT_FAIL;
    return PARSE_CONTINUE;
}

/* The folder of output `path` (option `opt`) exists: checked before any
 * work, so that a typo costs no forward pass. 0, or -1 after printing why. */
static int check_out_dir(const char *cmd, const char *opt, const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return 0;
    size_t n = slash == path ? 1 : (size_t)(slash - path);
    char *dir = malloc(n + 1);
    if (!dir) {
        cli_error(cmd, opt, path, "out of memory");
        return -1;
    }
    memcpy(dir, path, n);
    dir[n] = '\0';
    struct stat st;
    int ok = stat(dir, &st) == 0 && S_ISDIR(st.st_mode);
    if (!ok) cli_error(cmd, opt, path, "cannot write there: the folder '%s' does not exist", dir);
    free(dir);
    return ok ? 0 : -1;
}

/* Load --model with --threads and --max-length. 0, or -1 after printing why. */
static int load_model(job *j) {
    qkv_encoder_options o = {(int)j->threads, j->max_length, j->precision};
    char why[512] = "";
    qkv_status s = qkv_encoder_load(j->val[OPT_MODEL], &o, &j->enc, why, sizeof why);
    if (s != QKV_OK) {
        int opt = s == QKV_ERR_BAD_SIZE && j->given[OPT_MAX_LENGTH] ? OPT_MAX_LENGTH : OPT_MODEL;
        cli_error(j->cmd, all_options[opt].name, j->val[opt], "%s", why[0] ? why : qkv_status_string(s));
        return -1;
    }
    qkv_encoder_get_info(j->enc, &j->info);
    j->ids = malloc((size_t)j->info.max_length * sizeof *j->ids);
    if (!j->ids) {
        cli_error(j->cmd, "--model", j->val[OPT_MODEL], "out of memory");
        return -1;
    }
    return 0;
}

/* Tokenize text i of l into j->ids; *count gets the number of ids. 0, or -1
 * after printing why (invalid UTF-8: the line and the byte in it). */
static int tokenize_text(job *j, const text_list *l, int64_t i, int64_t *count) {
    char why[256] = "";
    qkv_status s = qkv_tokenizer_encode(qkv_encoder_tokenizer(j->enc), l->p[i], l->len[i], NULL, 0,
                                        j->info.max_length, j->ids, NULL, j->info.max_length, count, why,
                                        sizeof why);
    if (s == QKV_OK) return 0;
    const char *w = why[0] ? why : qkv_status_string(s);
    if (strncmp(w, "text: ", 6) == 0) w += 6; /* the tokenizer's name for the text: said better here */
    report_text(j->cmd, l, i, w);
    return -1;
}

/* Every text of l tokenizes; offsets (may be NULL) [l->n + 1] gets where each
 * one's tokens start when packed. 0, or -1 after printing why. */
static int check_texts(job *j, const text_list *l, int64_t *offsets) {
    int64_t total = 0;
    if (offsets) offsets[0] = 0;
    for (int64_t i = 0; i < l->n; i++) {
        int64_t n;
        if (tokenize_text(j, l, i, &n) != 0) return -1;
        total += n;
        if (offsets) offsets[i + 1] = total;
    }
    return 0;
}

/* ------------------------------------------------------------------------- */
/* Running the encoder in batches, with a progress line */

typedef struct progress {
    int on;
    int64_t total;
    double t0;
    const char *cmd;
} progress;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void progress_start(progress *p, const job *j, int64_t total) {
    p->on = total > j->batch && isatty(fileno(stderr));
    p->total = total;
    p->t0 = now_s();
    p->cmd = j->cmd;
}

static void progress_show(const progress *p, int64_t done) {
    if (!p->on) return;
    enum { W = 30 };
    char bar[W + 1];
    int fill = (int)((double)W * (double)done / (double)p->total);
    for (int i = 0; i < W; i++) bar[i] = i < fill ? '=' : (i == fill ? '>' : ' ');
    bar[W] = '\0';
    double t = now_s() - p->t0;
    fprintf(stderr, "\rqkv %s: %lld/%lld sentences [%s] %.0f/s ", p->cmd, (long long)done,
            (long long)p->total, bar, t > 0 ? (double)done / t : 0.0);
    if (done == p->total) fputc('\n', stderr);
    fflush(stderr);
}

/* Print the library's why for batch [first, first + n) of l: the text index
 * it names is relative to the batch, so say which line it is. */
static void report_batch(const job *j, const text_list *l, int64_t first, qkv_status s, const char *why) {
    long long k;
    const char *w = why[0] ? why : qkv_status_string(s);
    if (sscanf(w, "text %lld: ", &k) == 1) {
        const char *rest = strchr(w, ':');
        report_text(j->cmd, l, first + (int64_t)k, rest ? rest + 2 : w);
    } else {
        cli_error(j->cmd, l->opt, l->path, "%s", w);
    }
}

/* Every text of l through the encoder, --batch at a time, into out: with
 * offsets NULL the sentence vectors [l->n, hidden] (pooling j->pooling,
 * normalize as qkv_encoder_embed takes it), else the token states
 * [offsets[l->n], hidden] (offsets from check_texts). 0 or -1. */
static int run_batches(job *j, const text_list *l, const int64_t *offsets, int normalize, float *out) {
    progress pr;
    progress_start(&pr, j, l->n);
    for (int64_t i = 0; i < l->n; i += j->batch) {
        int64_t n = l->n - i < j->batch ? l->n - i : j->batch;
        char why[512] = "";
        qkv_status s;
        if (!offsets) {
            s = qkv_encoder_embed(j->enc, l->p + i, l->len + i, n, (qkv_pooling)j->pooling, normalize,
                                  out + i * j->info.hidden, why, sizeof why);
        } else {
            int64_t rows = offsets[i + n] - offsets[i], got = 0;
            s = qkv_encoder_token_states(j->enc, l->p + i, l->len + i, n, out + offsets[i] * j->info.hidden, rows,
                                         NULL, &got, why, sizeof why);
            if (s == QKV_OK && got != rows) {
                snprintf(why, sizeof why, "the encoder made %lld token rows where its tokenizer gave %lld",
                         (long long)got, (long long)rows);
                s = QKV_ERR_SHAPE;
            }
        }
        if (s != QKV_OK) {
            if (pr.on) fputc('\n', stderr);
            report_batch(j, l, i, s, why);
            return -1;
        }
        progress_show(&pr, i + n);
    }
    return 0;
}

/* Load the model and check every text of j->texts (and j->queries); 0 or -1. */
static int prepare(job *j, int64_t *offsets) {
    if (load_model(j) != 0) return -1;
    if (check_texts(j, &j->texts, offsets) != 0) return -1;
    return check_texts(j, &j->queries, NULL);
}

/* Sentence vectors [l->n, hidden], unit length (cosines are dot products),
 * allocated here (free with free()). NULL after printing why. */
static float *unit_vectors(job *j, const text_list *l) {
    size_t n = (size_t)l->n * (size_t)j->info.hidden;
    float *v = malloc(n * sizeof *v);
    if (!v) {
        cli_error(j->cmd, l->opt, l->path, "out of memory for %lld sentence vectors", (long long)l->n);
        return NULL;
    }
    if (run_batches(j, l, NULL, 1, v) != 0) {
        free(v);
        return NULL;
    }
    return v;
}

static double dot(const float *a, const float *b, int64_t n) {
    double s = 0.0;
    for (int64_t k = 0; k < n; k++) s += (double)a[k] * (double)b[k];
    return s;
}

/* Text i of l, cut after LABEL_BYTES bytes (at a character boundary) with
 * "..."; control characters (tabs, NULs) are printed as spaces. */
static void print_label(const text_list *l, int64_t i) {
    const unsigned char *s = (const unsigned char *)l->p[i];
    size_t n = l->len[i], cut = n;
    if (n > LABEL_BYTES) {
        cut = LABEL_BYTES;
        while (cut > 0 && (s[cut] & 0xC0) == 0x80) cut--; /* not inside a character */
    }
    for (size_t k = 0; k < cut; k++) putchar(s[k] < 0x20 || s[k] == 0x7F ? ' ' : s[k]);
    if (cut < n) fputs("...", stdout);
}

/* ------------------------------------------------------------------------- */
/* The commands */

int cli_cmd_embed(int argc, char **argv) {
    static const int ids[] = {OPT_HELP,         OPT_MODEL,   OPT_TEXT,    OPT_INPUT,     OPT_OUT,
                              OPT_OFFSETS,      OPT_POOLING, OPT_BATCH,   OPT_THREADS,   OPT_MAX_LENGTH,
                              OPT_NO_NORMALIZE, OPT_PRECISION};
    job j;
    int rc = parse_args(&j, "embed", argc, argv, ids, sizeof ids / sizeof ids[0], embed_help, embed_synopsis);
    if (rc == PARSE_CONTINUE) rc = take_texts(&j);
    if (rc != PARSE_CONTINUE) {
        free_job(&j);
        return rc;
    }
    int none = j.pooling == POOLING_NONE;
    if (!j.given[OPT_OUT]) rc = cli_usage_error(j.cmd, NULL, "missing -o OUT.npy");
    else if (j.given[OPT_OFFSETS] && !none) rc = cli_usage_error(j.cmd, "--offsets", "needs --pooling none");
    else if (j.given[OPT_NO_NORMALIZE] && none)
        rc = cli_usage_error(j.cmd, "--no-normalize", "applies to pooled vectors, not to --pooling none");
    else if (j.given[OPT_OFFSETS] && strcmp(j.val[OPT_OUT], j.val[OPT_OFFSETS]) == 0)
        rc = cli_usage_error(j.cmd, NULL, "-o and --offsets name the same file '%s'", j.val[OPT_OUT]);
    if (rc != PARSE_CONTINUE) {
        free_job(&j);
        return rc;
    }

    cli_file out[2] = {{"-o", j.val[OPT_OUT], {0}}, {"--offsets", j.val[OPT_OFFSETS], {0}}};
    int64_t *offsets = malloc(((size_t)j.texts.n + 1) * sizeof *offsets);
    rc = CLI_EXIT_FAIL;
    if (!offsets) cli_error(j.cmd, j.texts.opt, j.texts.path, "out of memory");
    else if (check_out_dir(j.cmd, "-o", out[0].path) == 0 &&
             (!out[1].path || check_out_dir(j.cmd, "--offsets", out[1].path) == 0) && prepare(&j, offsets) == 0) {
        int64_t shape[2] = {none ? offsets[j.texts.n] : j.texts.n, j.info.hidden}, oshape[1] = {j.texts.n + 1};
        if (cli_file_alloc(j.cmd, &out[0], "-o", QKV_F32, 2, shape, none ? "token states" : "sentence vectors") == 0 &&
            (!out[1].path || cli_file_alloc(j.cmd, &out[1], "--offsets", QKV_I64, 1, oshape, "offsets") == 0)) {
            int ok = run_batches(&j, &j.texts, none ? offsets : NULL, j.given[OPT_NO_NORMALIZE] ? 0 : -1,
                                 out[0].a.data);
            if (ok == 0 && out[1].path) memcpy(out[1].a.data, offsets, ((size_t)j.texts.n + 1) * sizeof *offsets);
            if (ok == 0 && cli_files_write(j.cmd, out, 2) == 0) rc = CLI_EXIT_OK;
        }
    }
    cli_files_free(out, 2);
    free(offsets);
    free_job(&j);
    return rc;
}

int cli_cmd_tokenize(int argc, char **argv) {
    static const int ids[] = {OPT_HELP,    OPT_MODEL,      OPT_TEXT,  OPT_INPUT,
                              OPT_THREADS, OPT_MAX_LENGTH, OPT_TOKENS};
    job j;
    int rc = parse_args(&j, "tokenize", argc, argv, ids, sizeof ids / sizeof ids[0], tokenize_help,
                        tokenize_synopsis);
    if (rc == PARSE_CONTINUE) rc = take_texts(&j);
    if (rc == PARSE_CONTINUE) {
        rc = CLI_EXIT_FAIL;
        if (prepare(&j, NULL) == 0) { /* every text is valid: nothing fails from here on */
            const qkv_tokenizer *tok = qkv_encoder_tokenizer(j.enc);
            for (int64_t i = 0; i < j.texts.n; i++) {
                int64_t n = 0;
                if (tokenize_text(&j, &j.texts, i, &n) != 0) break;
                for (int64_t k = 0; k < n; k++) {
                    if (k) putchar(' ');
                    if (j.given[OPT_TOKENS]) fputs(qkv_tokenizer_token(tok, j.ids[k], NULL), stdout);
                    else printf("%ld", (long)j.ids[k]);
                }
                putchar('\n');
                if (i == j.texts.n - 1) rc = cli_flush_stdout(j.cmd, CLI_EXIT_OK);
            }
        }
    }
    free_job(&j);
    return rc;
}

int cli_cmd_similarity(int argc, char **argv) {
    static const int ids[] = {OPT_HELP,    OPT_MODEL,      OPT_TEXT,    OPT_INPUT,
                              OPT_THREADS, OPT_MAX_LENGTH, OPT_POOLING, OPT_BATCH, OPT_PRECISION};
    job j;
    int rc = parse_args(&j, "similarity", argc, argv, ids, sizeof ids / sizeof ids[0], similarity_help,
                        similarity_synopsis);
    if (rc == PARSE_CONTINUE) rc = take_texts(&j);
    if (rc == PARSE_CONTINUE && j.texts.n < 2) {
        if (j.texts.path)
            cli_error(j.cmd, j.texts.opt, j.texts.path, "holds 1 sentence: a similarity needs at least 2");
        else
            cli_usage_error(j.cmd, "--text", "given once: a similarity needs at least 2 texts");
        rc = j.texts.path ? CLI_EXIT_FAIL : CLI_EXIT_USAGE;
    }
    float *v = NULL;
    if (rc == PARSE_CONTINUE) {
        rc = CLI_EXIT_FAIL;
        if (prepare(&j, NULL) == 0 && (v = unit_vectors(&j, &j.texts)) != NULL) {
            int64_t n = j.texts.n, h = j.info.hidden;
            char lab[32];
            printf("%6s", "");
            for (int64_t c = 0; c < n; c++) {
                snprintf(lab, sizeof lab, "[%lld]", (long long)c + 1);
                printf(" %8s", lab);
            }
            putchar('\n');
            for (int64_t r = 0; r < n; r++) {
                snprintf(lab, sizeof lab, "[%lld]", (long long)r + 1);
                printf("%-6s", lab);
                for (int64_t c = 0; c < n; c++) printf(" %8.4f", dot(v + r * h, v + c * h, h));
                fputs("  ", stdout);
                print_label(&j.texts, r);
                putchar('\n');
            }
            rc = cli_flush_stdout(j.cmd, CLI_EXIT_OK);
        }
    }
    free(v);
    free_job(&j);
    return rc;
}

/* One hit of a search: a corpus line and its cosine. */
typedef struct hit {
    double cos;
    int64_t line;
} hit;

/* Insert (cos, line) into best[0..*n) (sorted best first, at most k): a
 * larger cosine first; the earlier line first on a tie. */
static void keep_best(hit *best, int64_t *n, int64_t k, double cos, int64_t line) {
    int64_t at = *n;
    while (at > 0 && best[at - 1].cos < cos) at--; /* lines come in order: ties stay behind */
    if (at >= k) return;
    int64_t last = *n < k ? *n : k - 1;
    memmove(best + at + 1, best + at, (size_t)(last - at) * sizeof *best);
    best[at].cos = cos;
    best[at].line = line;
    if (*n < k) (*n)++;
}

int cli_cmd_search(int argc, char **argv) {
    static const int ids[] = {OPT_HELP,    OPT_MODEL,      OPT_CORPUS,  OPT_QUERY, OPT_TOP,
                              OPT_THREADS, OPT_MAX_LENGTH, OPT_POOLING, OPT_BATCH, OPT_PRECISION};
    job j;
    int rc = parse_args(&j, "search", argc, argv, ids, sizeof ids / sizeof ids[0], search_help, search_synopsis);
    if (rc == PARSE_CONTINUE) {
        if (!j.given[OPT_CORPUS]) rc = cli_usage_error(j.cmd, NULL, "missing --corpus FILE");
        else if (!j.given[OPT_QUERY]) rc = cli_usage_error(j.cmd, NULL, "missing --query TEXT (repeatable)");
        else if (read_lines(j.cmd, "--corpus", j.val[OPT_CORPUS], &j.texts) != 0) rc = CLI_EXIT_FAIL;
    }
    float *corpus = NULL, *query = NULL;
    hit *best = NULL;
    if (rc == PARSE_CONTINUE) {
        rc = CLI_EXIT_FAIL;
        int64_t k = j.top < j.texts.n ? j.top : j.texts.n;
        if (!(best = malloc((size_t)k * sizeof *best))) cli_error(j.cmd, "--top", NULL, "out of memory");
        else if (prepare(&j, NULL) == 0 && (corpus = unit_vectors(&j, &j.texts)) != NULL &&
                 (query = unit_vectors(&j, &j.queries)) != NULL) {
            int64_t h = j.info.hidden;
            for (int64_t q = 0; q < j.queries.n; q++) {
                int64_t n = 0;
                for (int64_t i = 0; i < j.texts.n; i++)
                    keep_best(best, &n, k, dot(query + q * h, corpus + i * h, h), i);
                printf("%squery %lld: ", q ? "\n" : "", (long long)q + 1);
                print_label(&j.queries, q);
                putchar('\n');
                for (int64_t r = 0; r < n; r++) {
                    printf("%4lld. %7.4f  line %lld: ", (long long)r + 1, best[r].cos, (long long)best[r].line + 1);
                    print_label(&j.texts, best[r].line);
                    putchar('\n');
                }
            }
            rc = cli_flush_stdout(j.cmd, CLI_EXIT_OK);
        }
    }
    free(best);
    free(corpus);
    free(query);
    free_job(&j);
    return rc;
}
