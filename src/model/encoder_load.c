/* Loading an encoder (qkv/encoder.h): the JSON files of a model directory
 * (read with the strict tokenizer of io/json.h, walked key by key with no
 * recursion), the weights mapped from model.safetensors and checked tensor
 * by tensor, and the tokenizer. */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/internal.h"
#include "io/json.h"
#include "io/safetensors_map.h"
#include "model/encoder_internal.h"

/* ---- files --------------------------------------------------------------- */

#define ENC_JSON_MAX (16u << 20) /* a config file larger than this is refused */

/* Read dir/name into a new buffer; QKV_ERR_IO with *missing = 1 when the
 * file does not exist. */
static qkv_status read_file(const char *path, unsigned char **out, size_t *len, int *missing, char *why,
                            size_t why_len) {
    *out = NULL;
    *missing = 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        *missing = errno == ENOENT;
        return qkv_fail(why, why_len, QKV_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    }
    unsigned char *buf = NULL;
    size_t n = 0, cap = 0;
    qkv_status s = QKV_OK;
    for (;;) {
        if (n == cap) {
            size_t c = cap ? cap * 2 : 4096;
            if (c > ENC_JSON_MAX + 1) c = ENC_JSON_MAX + 1;
            if (c == cap) {
                s = qkv_fail(why, why_len, QKV_ERR_FORMAT, "%s: larger than %u bytes", path, ENC_JSON_MAX);
                break;
            }
            unsigned char *p = qkv_alloc(c);
            if (!p) {
                s = qkv_fail(why, why_len, QKV_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
                break;
            }
            if (buf) memcpy(p, buf, n);
            qkv_free(buf);
            buf = p;
            cap = c;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0) {
            if (ferror(f)) s = qkv_fail(why, why_len, QKV_ERR_IO, "%s: read error", path);
            break;
        }
    }
    fclose(f);
    if (s != QKV_OK) {
        qkv_free(buf);
        return s;
    }
    *out = buf;
    *len = n;
    return QKV_OK;
}

/* ---- JSON values ------------------------------------------------------------ */

typedef enum { JV_STRING, JV_NUMBER, JV_TRUE, JV_FALSE, JV_NULL, JV_OTHER } jv_kind;

typedef struct jv {
    jv_kind kind;
    char str[128];   /* JV_STRING: the text ("" past 127 bytes or with a NUL) */
    double num;      /* JV_NUMBER */
    int is_int;      /* JV_NUMBER without fraction or exponent */
} jv;

static int literal(qkv_json *j, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(j->end - j->p) < n || memcmp(j->p, word, n) != 0) return qkv_json_fail(j, "expected a value");
    j->p += n;
    return 1;
}

/* A JSON number by the grammar, converted with strtod. */
static int number(qkv_json *j, jv *v) {
    const unsigned char *p = j->p, *e = j->end;
    int frac = 0;
    if (p < e && *p == '-') p++;
    if (p < e && *p == '0') p++;
    else if (p < e && *p >= '1' && *p <= '9') while (p < e && *p >= '0' && *p <= '9') p++;
    else return qkv_json_fail(j, "malformed number");
    if (p < e && *p == '.') {
        frac = 1;
        p++;
        if (!(p < e && *p >= '0' && *p <= '9')) return qkv_json_fail(j, "malformed number");
        while (p < e && *p >= '0' && *p <= '9') p++;
    }
    if (p < e && (*p == 'e' || *p == 'E')) {
        frac = 1;
        p++;
        if (p < e && (*p == '+' || *p == '-')) p++;
        if (!(p < e && *p >= '0' && *p <= '9')) return qkv_json_fail(j, "malformed number");
        while (p < e && *p >= '0' && *p <= '9') p++;
    }
    char buf[64];
    size_t n = (size_t)(p - j->p);
    if (n >= sizeof buf) n = sizeof buf - 1; /* only digits beyond double's precision are lost */
    memcpy(buf, j->p, n);
    buf[n] = '\0';
    /* strtod reads the decimal point of the C locale the program set. */
    const struct lconv *lc = localeconv();
    char *dot = strchr(buf, '.');
    if (dot && lc && lc->decimal_point && lc->decimal_point[0] && !lc->decimal_point[1]) *dot = lc->decimal_point[0];
    v->num = strtod(buf, NULL);
    v->is_int = !frac;
    j->p = p;
    return 1;
}

/* One value at the cursor: scalars read, containers skipped (JV_OTHER). */
static int value(qkv_json *j, jv *v) {
    int c = qkv_json_peek(j);
    v->kind = JV_OTHER;
    v->str[0] = '\0';
    if (c == '"') {
        size_t len;
        int nul;
        if (!qkv_json_string_read(j, v->str, sizeof v->str, &len, &nul)) return 0;
        if (len >= sizeof v->str || nul) v->str[0] = '\0';
        v->kind = JV_STRING;
        return 1;
    }
    if (c == '[' || c == '{') return qkv_json_skip(j);
    if (c == '-' || (c >= '0' && c <= '9')) {
        v->kind = JV_NUMBER;
        return number(j, v);
    }
    if (c == 't') return v->kind = JV_TRUE, literal(j, "true");
    if (c == 'f') return v->kind = JV_FALSE, literal(j, "false");
    if (c == 'n') return v->kind = JV_NULL, literal(j, "null");
    return qkv_json_fail(j, "expected a value");
}

/* Walk one object at the cursor, calling fn(ctx, key, value) per member;
 * fn returns QKV_OK to go on. */
typedef qkv_status (*member_fn)(void *ctx, const char *key, const jv *v);

static qkv_status object(qkv_json *j, member_fn fn, void *ctx, const char *file, char *why, size_t why_len) {
    if (!qkv_json_expect(j, '{', "expected an object")) goto bad;
    if (qkv_json_peek(j) == '}') {
        j->p++;
        return QKV_OK;
    }
    for (;;) {
        char key[64];
        size_t len;
        int nul;
        jv v;
        if (qkv_json_peek(j) != '"') {
            qkv_json_fail(j, "expected a key");
            goto bad;
        }
        if (!qkv_json_string_read(j, key, sizeof key, &len, &nul)) goto bad;
        if (len >= sizeof key || nul) key[0] = '\0';
        if (!qkv_json_expect(j, ':', "expected ':'") || !value(j, &v)) goto bad;
        qkv_status s = fn(ctx, key, &v);
        if (s != QKV_OK) return s;
        if (qkv_json_peek(j) == '}') {
            j->p++;
            return QKV_OK;
        }
        if (!qkv_json_expect(j, ',', "expected ',' or '}'")) goto bad;
    }
bad:
    return qkv_fail(why, why_len, QKV_ERR_FORMAT, "%s: byte %zu: %s", file, j->err_pos,
                    j->err ? j->err : "malformed JSON");
}

/* ---- config.json -------------------------------------------------------- */

enum { F_MODEL_TYPE, F_HIDDEN, F_LAYERS, F_HEADS, F_INTER, F_ACT, F_EPS, F_MAXPOS, F_TYPES, F_VOCAB, F_POSTYPE, F_N };
static const char *const cfg_names[F_N] = {"model_type", "hidden_size", "num_hidden_layers",
                                           "num_attention_heads", "intermediate_size", "hidden_act",
                                           "layer_norm_eps", "max_position_embeddings", "type_vocab_size",
                                           "vocab_size", "position_embedding_type"};

typedef struct cfg_ctx {
    qkv_encoder_info *info;
    int seen[F_N];
    const char *file;
    char *why;
    size_t why_len;
} cfg_ctx;

static qkv_status cfg_member(void *p, const char *key, const jv *v) {
    cfg_ctx *c = p;
    int f = 0;
    while (f < F_N && strcmp(key, cfg_names[f]) != 0) f++;
    if (f == F_N) return QKV_OK;
    c->seen[f] = 1;
    qkv_encoder_info *in = c->info;
    if (f == F_MODEL_TYPE || f == F_ACT || f == F_POSTYPE) {
        if (v->kind != JV_STRING)
            return qkv_fail(c->why, c->why_len, QKV_ERR_FORMAT, "%s: \"%s\" is not a string", c->file, key);
        if (f == F_MODEL_TYPE && strcmp(v->str, "bert") != 0)
            return qkv_fail(c->why, c->why_len, QKV_ERR_UNSUPPORTED,
                            "%s: model_type \"%s\" is not supported (only \"bert\")", c->file, v->str);
        if (f == F_POSTYPE && strcmp(v->str, "absolute") != 0)
            return qkv_fail(c->why, c->why_len, QKV_ERR_UNSUPPORTED,
                            "%s: position_embedding_type \"%s\" is not supported (only \"absolute\")", c->file,
                            v->str);
        if (f == F_ACT) {
            if (strcmp(v->str, "gelu") == 0) in->hidden_act = ENC_ACT_GELU;
            else if (strcmp(v->str, "gelu_new") == 0) in->hidden_act = ENC_ACT_GELU_NEW;
            else if (strcmp(v->str, "relu") == 0) in->hidden_act = ENC_ACT_RELU;
            else
                return qkv_fail(c->why, c->why_len, QKV_ERR_UNSUPPORTED,
                                "%s: hidden_act \"%s\" is not supported (gelu, gelu_new, relu)", c->file, v->str);
        }
        return QKV_OK;
    }
    if (f == F_EPS) {
        if (v->kind != JV_NUMBER || !(v->num > 0) || !(v->num < 1))
            return qkv_fail(c->why, c->why_len, QKV_ERR_FORMAT, "%s: layer_norm_eps is not a number in (0, 1)",
                            c->file);
        in->layer_norm_eps = v->num;
        return QKV_OK;
    }
    if (v->kind != JV_NUMBER || !v->is_int || v->num < 1 || v->num > 1e9)
        return qkv_fail(c->why, c->why_len, QKV_ERR_FORMAT, "%s: \"%s\" is not an integer in 1 .. 10^9", c->file,
                        key);
    int64_t n = (int64_t)v->num;
    switch (f) {
    case F_HIDDEN: in->hidden = n; break;
    case F_LAYERS: in->layers = n; break;
    case F_HEADS: in->heads = n; break;
    case F_INTER: in->intermediate = n; break;
    case F_MAXPOS: in->max_positions = n; break;
    case F_TYPES: in->type_vocab_size = n; break;
    default: in->vocab_size = n; break;
    }
    return QKV_OK;
}

/* A JSON file of the directory parsed by fn; *missing when it is absent
 * (then QKV_OK when optional). */
static qkv_status parse_json_file(const char *dir, const char *name, int optional, member_fn fn, void *ctx,
                                  int array_of_objects, int *missing, char *why, size_t why_len) {
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, name) >= sizeof path)
        return qkv_fail(why, why_len, QKV_ERR_IO, "%s/%s: path too long", dir, name);
    unsigned char *text;
    size_t len = 0;
    qkv_status s = read_file(path, &text, &len, missing, why, why_len);
    if (s != QKV_OK) {
        if (*missing && optional) {
            if (why && why_len) why[0] = '\0';
            return QKV_OK;
        }
        return s;
    }
    qkv_json j;
    qkv_json_init(&j, text, len);
    if (!array_of_objects) {
        s = object(&j, fn, ctx, path, why, why_len);
    } else if (!qkv_json_expect(&j, '[', "expected an array")) {
        s = qkv_fail(why, why_len, QKV_ERR_FORMAT, "%s: not an array of objects", path);
    } else if (qkv_json_peek(&j) == ']') {
        j.p++;
    } else {
        for (;;) {
            if ((s = object(&j, fn, ctx, path, why, why_len)) != QKV_OK) break;
            if (qkv_json_peek(&j) == ']') {
                j.p++;
                break;
            }
            if (!qkv_json_expect(&j, ',', "expected ',' or ']'")) {
                s = qkv_fail(why, why_len, QKV_ERR_FORMAT, "%s: byte %zu: %s", path, j.err_pos,
                             j.err ? j.err : "malformed JSON");
                break;
            }
        }
    }
    if (s == QKV_OK && !qkv_json_at_end(&j))
        s = qkv_fail(why, why_len, QKV_ERR_FORMAT, "%s: text after the JSON value", path);
    qkv_free(text);
    return s;
}

/* ---- sentence-transformers files ---------------------------------------- */

typedef struct st_cfg {
    int normalize;
    int modes[6]; /* mean, cls, max, mean_sqrt_len, weightedmean, lasttoken: -1 absent, 0/1 */
    int64_t max_seq;
    char *why;
    size_t why_len;
} st_cfg;

static qkv_status modules_member(void *p, const char *key, const jv *v) {
    st_cfg *c = p;
    if (strcmp(key, "type") == 0 && v->kind == JV_STRING) {
        const char *t = strrchr(v->str, '.');
        if (strcmp(t ? t + 1 : v->str, "Normalize") == 0) c->normalize = 1;
    }
    return QKV_OK;
}

static const char *const pool_keys[6] = {"pooling_mode_mean_tokens", "pooling_mode_cls_token",
                                         "pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                                         "pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken"};

static qkv_status pooling_member(void *p, const char *key, const jv *v) {
    st_cfg *c = p;
    for (int i = 0; i < 6; i++)
        if (strcmp(key, pool_keys[i]) == 0) {
            if (v->kind != JV_TRUE && v->kind != JV_FALSE)
                return qkv_fail(c->why, c->why_len, QKV_ERR_FORMAT, "1_Pooling/config.json: \"%s\" is not a boolean",
                                key);
            c->modes[i] = v->kind == JV_TRUE;
        }
    return QKV_OK;
}

static qkv_status sbert_member(void *p, const char *key, const jv *v) {
    st_cfg *c = p;
    if (strcmp(key, "max_seq_length") == 0) {
        if (v->kind != JV_NUMBER || !v->is_int || v->num < 2 || v->num > 1e9)
            return qkv_fail(c->why, c->why_len, QKV_ERR_FORMAT,
                            "sentence_bert_config.json: max_seq_length is not an integer >= 2");
        c->max_seq = (int64_t)v->num;
    }
    return QKV_OK;
}

static qkv_status read_config(qkv_encoder *e, const char *dir, char *why, size_t why_len) {
    int missing;
    cfg_ctx c = {&e->info, {0}, "config.json", why, why_len};
    e->info.layer_norm_eps = 1e-12;
    qkv_status s = parse_json_file(dir, "config.json", 0, cfg_member, &c, 0, &missing, why, why_len);
    if (s != QKV_OK) return s;
    for (int f = 0; f < F_N; f++)
        if (!c.seen[f] && f != F_POSTYPE && f != F_EPS)
            return qkv_fail(why, why_len, QKV_ERR_FORMAT, "%s/config.json: the field \"%s\" is missing", dir,
                            cfg_names[f]);
    qkv_encoder_info *in = &e->info;
    if (in->hidden % in->heads != 0)
        return qkv_fail(why, why_len, QKV_ERR_SHAPE, "%s/config.json: hidden_size %lld is not a multiple of "
                        "num_attention_heads %lld", dir, (long long)in->hidden, (long long)in->heads);

    st_cfg st = {0, {-1, -1, -1, -1, -1, -1}, 0, why, why_len};
    if ((s = parse_json_file(dir, "modules.json", 1, modules_member, &st, 1, &missing, why, why_len)) != QKV_OK)
        return s;
    if ((s = parse_json_file(dir, "1_Pooling/config.json", 1, pooling_member, &st, 0, &missing, why, why_len)) !=
        QKV_OK)
        return s;
    int on = 0, which = 0;
    for (int i = 0; i < 6; i++)
        if (st.modes[i] == 1) on++, which = i;
    if (on > 1 || (on == 1 && which > 2))
        return qkv_fail(why, why_len, QKV_ERR_UNSUPPORTED, "%s/1_Pooling/config.json: %s%s is not supported "
                        "(exactly one of mean, cls, max)", dir, on > 1 ? "more than one pooling mode; " : "",
                        on > 1 ? "" : pool_keys[which]);
    in->pooling = on ? (qkv_pooling)which : QKV_POOLING_MEAN;
    in->normalize = st.normalize;
    if ((s = parse_json_file(dir, "sentence_bert_config.json", 1, sbert_member, &st, 0, &missing, why, why_len)) !=
        QKV_OK)
        return s;
    in->max_length = in->max_positions;
    if (st.max_seq > 0 && st.max_seq < in->max_length) in->max_length = st.max_seq;
    return QKV_OK;
}

/* ---- weights ---------------------------------------------------------------- */

/* The tensor `name` (with or without the "bert." prefix), checked to be
 * float32 of shape [d0] (d1 = 0) or [d0, d1]. */
static qkv_status tensor(const qkv_encoder *e, const char *name, int64_t d0, int64_t d1, const float **out,
                         char *why, size_t why_len) {
    char full[160];
    snprintf(full, sizeof full, "bert.%s", name);
    const qkv_array *a = qkv_safetensors_get(e->weights, name);
    if (!a) a = qkv_safetensors_get(e->weights, full);
    if (!a)
        return qkv_fail(why, why_len, QKV_ERR_FORMAT, "model.safetensors: the tensor %s is missing", name);
    if (a->dtype != QKV_F32)
        return qkv_fail(why, why_len, QKV_ERR_DTYPE,
                        "model.safetensors: the tensor %s is of dtype %s, not floating point (F32, F16 or BF16)",
                        name, a->dtype == QKV_F64 ? "F64" : a->dtype == QKV_I32 ? "I32" : "I64");
    int nd = d1 ? 2 : 1;
    if (a->ndim != nd || a->shape[0] != d0 || (d1 && a->shape[1] != d1)) {
        char got[96] = "[";
        size_t o = 1;
        for (int i = 0; i < a->ndim && o < sizeof got; i++)
            o += (size_t)snprintf(got + o, sizeof got - o, "%s%lld", i ? ", " : "", (long long)a->shape[i]);
        if (o < sizeof got) snprintf(got + o, sizeof got - o, "]");
        if (d1)
            return qkv_fail(why, why_len, QKV_ERR_SHAPE, "model.safetensors: the tensor %s has shape %s, not [%lld, %lld]",
                            name, got, (long long)d0, (long long)d1);
        return qkv_fail(why, why_len, QKV_ERR_SHAPE, "model.safetensors: the tensor %s has shape %s, not [%lld]", name,
                        got, (long long)d0);
    }
    *out = a->data;
    return QKV_OK;
}

static qkv_status bind_weights(qkv_encoder *e, char *why, size_t why_len) {
    const qkv_encoder_info *in = &e->info;
    int64_t H = in->hidden, I = in->intermediate;
    qkv_status s;
#define T(name, d0, d1, dst) \
    if ((s = tensor(e, name, d0, d1, dst, why, why_len)) != QKV_OK) return s
    T("embeddings.word_embeddings.weight", in->vocab_size, H, &e->word);
    T("embeddings.position_embeddings.weight", in->max_positions, H, &e->pos);
    T("embeddings.token_type_embeddings.weight", in->type_vocab_size, H, &e->type);
    T("embeddings.LayerNorm.weight", H, 0, &e->emb_g);
    T("embeddings.LayerNorm.bias", H, 0, &e->emb_b);
    for (int64_t l = 0; l < in->layers; l++) {
        enc_layer *L = &e->layer[l];
        struct {
            const char *suffix;
            int64_t d0, d1;
            const float **dst;
        } w[] = {
            {"attention.self.query.weight", H, H, &L->wq},       {"attention.self.query.bias", H, 0, &L->bq},
            {"attention.self.key.weight", H, H, &L->wk},         {"attention.self.key.bias", H, 0, &L->bk},
            {"attention.self.value.weight", H, H, &L->wv},       {"attention.self.value.bias", H, 0, &L->bv},
            {"attention.output.dense.weight", H, H, &L->wo},     {"attention.output.dense.bias", H, 0, &L->bo},
            {"attention.output.LayerNorm.weight", H, 0, &L->ln1_g},
            {"attention.output.LayerNorm.bias", H, 0, &L->ln1_b},
            {"intermediate.dense.weight", I, H, &L->wi},         {"intermediate.dense.bias", I, 0, &L->bi},
            {"output.dense.weight", H, I, &L->wo2},              {"output.dense.bias", H, 0, &L->bo2},
            {"output.LayerNorm.weight", H, 0, &L->ln2_g},        {"output.LayerNorm.bias", H, 0, &L->ln2_b},
        };
        for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) {
            char name[128];
            snprintf(name, sizeof name, "encoder.layer.%lld.%s", (long long)l, w[i].suffix);
            T(name, w[i].d0, w[i].d1, w[i].dst);
        }
    }
#undef T
    return QKV_OK;
}

/* QKV_ENCODER_INT8: every projection quantised per output channel;
 * QKV_ENCODER_BF16: every projection rounded into bf16 panels. */
static qkv_status convert_weights(qkv_encoder *e, int precision, char *why, size_t why_len) {
    const int64_t H = e->info.hidden, I = e->info.intermediate;
    static const char *const NAMES[ENC_W_COUNT] = {"attention.self.query", "attention.self.key",
                                                   "attention.self.value", "attention.output.dense",
                                                   "intermediate.dense", "output.dense"};
    for (int64_t l = 0; l < e->info.layers; l++) {
        enc_layer *L = &e->layer[l];
        const float *w[ENC_W_COUNT] = {L->wq, L->wk, L->wv, L->wo, L->wi, L->wo2};
        for (int i = 0; i < ENC_W_COUNT; i++) {
            int64_t out = i == ENC_W_I ? I : H, in = i == ENC_W_O2 ? I : H;
            qkv_status s = precision == QKV_ENCODER_INT8
                               ? qkv_i8_matrix_make(w[i], out, in, in, &L->i8[i])
                               : qkv_gemm_bf16_pack_b(1, in, out, w[i], in, e->threads, &L->bf[i]);
            if (s != QKV_OK)
                return qkv_fail(why, why_len, s, "encoder.layer.%lld.%s.weight: %s", (long long)l, NAMES[i],
                                s == QKV_ERR_NOT_FINITE ? "a weight is NaN or infinite" : qkv_status_string(s));
            /* the float32 weight is not read again: its pages leave the resident memory */
            qkv_safetensors_release(e->weights, w[i], (size_t)(out * in) * sizeof(float));
        }
    }
    e->info.precision = precision;
    return QKV_OK;
}

/* ---- load / free / getters ---------------------------------------------- */

qkv_status qkv_encoder_load(const char *dir, const qkv_encoder_options *opt, qkv_encoder **out, char *why,
                            size_t why_len) {
    if (why && why_len) why[0] = '\0';
    if (out) *out = NULL;
    if (!dir || !out) return qkv_fail(why, why_len, QKV_ERR_NULL_POINTER, "NULL argument");
    if (opt && (opt->threads < 0 || opt->max_length < 0 || opt->max_length == 1))
        return qkv_fail(why, why_len, QKV_ERR_BAD_SIZE, "options: threads and max_length must be >= 0 (max_length "
                        "0 or >= 2)");
    if (opt && opt->precision != QKV_ENCODER_FP32 && opt->precision != QKV_ENCODER_BF16 &&
        opt->precision != QKV_ENCODER_INT8)
        return qkv_fail(why, why_len, QKV_ERR_BAD_ENUM, "options: precision %d is not a qkv_encoder_precision",
                        opt->precision);
    struct stat sb;
    if (stat(dir, &sb) != 0)
        return qkv_fail(why, why_len, QKV_ERR_IO, "%s: not a model directory (%s)", dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return qkv_fail(why, why_len, QKV_ERR_IO, "%s: not a model directory (not a directory)", dir);
    qkv_encoder *e = qkv_alloc_zeroed(sizeof *e);
    if (!e) return qkv_fail(why, why_len, QKV_ERR_OUT_OF_MEMORY, "out of memory");
    e->threads = opt ? opt->threads : 0;
    qkv_status s = read_config(e, dir, why, why_len);
    if (s == QKV_OK && opt && opt->max_length) {
        if (opt->max_length > e->info.max_positions)
            s = qkv_fail(why, why_len, QKV_ERR_BAD_SIZE, "options: max_length %lld exceeds max_position_embeddings %lld",
                         (long long)opt->max_length, (long long)e->info.max_positions);
        else
            e->info.max_length = opt->max_length;
    }
    char path[4096];
    if (s == QKV_OK) {
        if ((size_t)snprintf(path, sizeof path, "%s/model.safetensors", dir) >= sizeof path) {
            s = qkv_fail(why, why_len, QKV_ERR_IO, "%s: path too long", dir);
        } else {
            char sub[200];
            s = qkv_safetensors_map(path, &e->weights, sub, sizeof sub);
            if (s != QKV_OK) qkv_fail(why, why_len, s, "%s: %s", path, sub);
        }
    }
    if (s == QKV_OK && e->info.layers > qkv_safetensors_count(e->weights) / 16)
        s = qkv_fail(why, why_len, QKV_ERR_FORMAT, "%s: %lld tensors cannot hold the %lld layers of num_hidden_layers",
                     path, (long long)qkv_safetensors_count(e->weights), (long long)e->info.layers);
    if (s == QKV_OK && !(e->layer = qkv_alloc_zeroed((size_t)e->info.layers * sizeof *e->layer)))
        s = qkv_fail(why, why_len, QKV_ERR_OUT_OF_MEMORY, "out of memory");
    if (s == QKV_OK) s = bind_weights(e, why, why_len);
    if (s == QKV_OK && opt && opt->precision != QKV_ENCODER_FP32) s = convert_weights(e, opt->precision, why, why_len);
    if (s == QKV_OK) {
        s = qkv_tokenizer_load(dir, NULL, &e->tok, why, why_len);
        if (s == QKV_OK) {
            qkv_tokenizer_info ti;
            qkv_tokenizer_get_info(e->tok, &ti);
            if (ti.vocab_size > e->info.vocab_size)
                s = qkv_fail(why, why_len, QKV_ERR_SHAPE, "%s/vocab.txt: %lld tokens, more than vocab_size %lld", dir,
                             (long long)ti.vocab_size, (long long)e->info.vocab_size);
        }
    }
    if (s != QKV_OK) {
        qkv_encoder_free(e);
        return s;
    }
    *out = e;
    return QKV_OK;
}

void qkv_encoder_free(qkv_encoder *e) {
    if (!e) return;
    qkv_tokenizer_free(e->tok);
    qkv_safetensors_free(e->weights);
    for (int64_t l = 0; e->layer && l < e->info.layers; l++)
        for (int i = 0; i < ENC_W_COUNT; i++) {
            qkv_i8_matrix_free(&e->layer[l].i8[i]);
            qkv_gemm_bf16_b_free(&e->layer[l].bf[i]);
        }
    QKV_FREE_ALL(e->layer, e->ws, e->offsets, e->ids, e->types, e);
}

void qkv_encoder_get_info(const qkv_encoder *e, qkv_encoder_info *info) {
    if (!info) return;
    if (!e) {
        memset(info, 0, sizeof *info);
        return;
    }
    *info = e->info;
}

const qkv_tokenizer *qkv_encoder_tokenizer(const qkv_encoder *e) { return e ? e->tok : NULL; }
