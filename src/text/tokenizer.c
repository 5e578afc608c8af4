/* BertTokenizer in C (see include/qkv/text.h for the steps). The text is
 * decoded to code points once; each step reads one growable code point
 * buffer and writes the next, so every step is one linear pass. */
#define _POSIX_C_SOURCE 200809L /* stat */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "core/internal.h"
#include "io/json.h"
#include "qkv/text.h"
#include "text/text_internal.h"

#define MAX_WORD_CHARS 100 /* BertTokenizer's max_input_chars_per_word */
#define N_SPECIAL 5

static const char *const k_default_special[N_SPECIAL] = {"[UNK]", "[SEP]", "[PAD]", "[CLS]", "[MASK]"};
static const char *const k_special_key[N_SPECIAL] = {"unk_token", "sep_token", "pad_token", "cls_token",
                                                     "mask_token"};

struct qkv_tokenizer {
    qkv_vocab vocab;
    int lowercase, strip_accents, chinese;
    int64_t model_max_length;
    int32_t special[N_SPECIAL];
    uint32_t *special_cp[N_SPECIAL]; /* the names as code points */
    size_t special_n[N_SPECIAL];
};

const char *qkv_tokenizer_unicode_version(void) { return qkv_unicode_version; }

/* ---- growable buffers ---------------------------------------------------- */

typedef struct cpvec {
    uint32_t *p;
    size_t n, cap;
} cpvec;

typedef struct idvec {
    int32_t *p;
    size_t n, cap;
} idvec;

/* Grow *p (elements of size elem, capacity *cap) to hold at least need. */
static int grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 1;
    size_t nc = *cap ? *cap : 64;
    while (nc < need) {
        if (nc > SIZE_MAX / 2 / elem) return 0;
        nc *= 2;
    }
    void *np = qkv_alloc(nc * elem);
    if (!np) return 0;
    if (*p && *cap) memcpy(np, *p, *cap * elem);
    qkv_free(*p);
    *p = np;
    *cap = nc;
    return 1;
}

static int cp_push(cpvec *v, uint32_t c) {
    if (v->n == v->cap && !grow((void **)&v->p, &v->cap, v->n + 1, sizeof *v->p)) return 0;
    v->p[v->n++] = c;
    return 1;
}

static int id_push(idvec *v, int32_t id) {
    if (v->n == v->cap && !grow((void **)&v->p, &v->cap, v->n + 1, sizeof *v->p)) return 0;
    v->p[v->n++] = id;
    return 1;
}

/* ---- normalisation ------------------------------------------------------- */

/* Append the canonical decomposition of c to out, in canonical order. */
static int decompose_push(cpvec *out, uint32_t c) {
    uint32_t d[QKV_UC_MAX_DECOMP];
    int nd = qkv_uc_decompose(c, d);
    for (int k = 0; k < nd; k++) {
        if (!cp_push(out, d[k])) return 0;
        unsigned cc = qkv_uc_ccc(d[k]);
        if (cc == 0) continue;
        /* Canonical ordering: a mark moves before the marks of higher class
         * that precede it (stable among equal classes). */
        size_t i = out->n - 1;
        while (i > 0) {
            unsigned pc = qkv_uc_ccc(out->p[i - 1]);
            if (pc <= cc) break;
            out->p[i] = out->p[i - 1];
            out->p[i - 1] = d[k];
            i--;
        }
    }
    return 1;
}

/* NFD of in[0 .. n), appended to out. */
static int nfd(const uint32_t *in, size_t n, cpvec *out) {
    for (size_t i = 0; i < n; i++)
        if (!decompose_push(out, in[i])) return 0;
    return 1;
}

/* NFC of in[0 .. n) into out (cleared first): NFD, then canonical
 * composition of each character with the last starter it is not blocked
 * from. */
static int nfc(const uint32_t *in, size_t n, cpvec *out) {
    out->n = 0;
    if (!nfd(in, n, out)) return 0;
    uint32_t *p = out->p;
    size_t w = 0, starter = SIZE_MAX;
    int last_cc = -1; /* class of the last character kept after the starter; -1: none */
    for (size_t r = 0; r < out->n; r++) {
        uint32_t c = p[r];
        int cc = (int)qkv_uc_ccc(c);
        if (starter != SIZE_MAX && !(last_cc != -1 && last_cc >= cc)) {
            uint32_t comp = qkv_uc_compose(p[starter], c);
            if (comp) {
                p[starter] = comp;
                continue;
            }
        }
        if (cc == 0) {
            starter = w;
            last_cc = -1;
        } else {
            last_cc = cc;
        }
        p[w++] = c;
    }
    out->n = w;
    return 1;
}

/* ---- the steps ----------------------------------------------------------- */

/* The length of the longest special token name at s[i ..], or 0. */
static size_t special_at(const qkv_tokenizer *t, const uint32_t *s, size_t n, size_t i, int *which) {
    size_t best = 0;
    for (int k = 0; k < N_SPECIAL; k++) {
        size_t m = t->special_n[k];
        if (m <= best || m > n - i) continue;
        if (memcmp(s + i, t->special_cp[k], m * sizeof *s) == 0) {
            best = m;
            *which = k;
        }
    }
    return best;
}

typedef struct work {
    cpvec a, b, c, d; /* scratch */
    idvec ids;
} work;

static void work_free(work *w) {
    qkv_free(w->a.p);
    qkv_free(w->b.p);
    qkv_free(w->c.p);
    qkv_free(w->d.p);
    qkv_free(w->ids.p);
}

/* WordPiece of one word; appends its ids. */
static int wordpiece(const qkv_tokenizer *t, const uint32_t *s, size_t n, idvec *out) {
    int32_t unk = t->special[QKV_TOKEN_UNK];
    if (n == 0) return 1;
    if (n > MAX_WORD_CHARS) return id_push(out, unk);
    unsigned char buf[4 * MAX_WORD_CHARS], sub[2 + 4 * MAX_WORD_CHARS];
    size_t off[MAX_WORD_CHARS + 1];
    size_t bn = 0;
    for (size_t i = 0; i < n; i++) {
        off[i] = bn;
        bn += qkv_utf8_encode(s[i], buf + bn);
    }
    off[n] = bn;
    sub[0] = '#';
    sub[1] = '#';
    size_t mark = out->n, start = 0;
    size_t maxb = t->vocab.max_bytes;
    while (start < n) {
        /* Candidates: buf[off[start] .. off[end]), after "##" past the start. */
        const unsigned char *cand = buf;
        size_t pre = 0;
        if (start > 0) {
            memcpy(sub + 2, buf + off[start], bn - off[start]);
            cand = sub;
            pre = 2;
        }
        int32_t found = -1;
        size_t end = n;
        for (; end > start; end--) {
            size_t len = pre + off[end] - off[start];
            if (len > maxb) continue;
            found = qkv_vocab_find(&t->vocab, cand, len);
            if (found >= 0) break;
        }
        if (found < 0) {
            out->n = mark;
            return id_push(out, unk);
        }
        if (!id_push(out, found)) return 0;
        start = end;
    }
    return 1;
}

static int is_special_name(const qkv_tokenizer *t, const uint32_t *s, size_t n) {
    for (int k = 0; k < N_SPECIAL; k++)
        if (t->special_n[k] == n && memcmp(s, t->special_cp[k], n * sizeof *s) == 0) return 1;
    return 0;
}

/* One piece between white space: lower case, accents, punctuation split,
 * WordPiece. */
static int piece(const qkv_tokenizer *t, const uint32_t *s, size_t n, work *w) {
    if (is_special_name(t, s, n)) return wordpiece(t, s, n, &w->ids); /* never split */
    const uint32_t *x = s;
    size_t xn = n;
    if (t->lowercase) {
        w->c.n = 0;
        for (size_t i = 0; i < n; i++) {
            uint32_t lo[2];
            int k = qkv_uc_lower(s[i], lo);
            for (int j = 0; j < k; j++)
                if (!cp_push(&w->c, lo[j])) return 0;
        }
        x = w->c.p;
        xn = w->c.n;
    }
    if (t->strip_accents) {
        w->d.n = 0;
        if (!nfd(x, xn, &w->d)) return 0;
        size_t k = 0;
        for (size_t i = 0; i < w->d.n; i++)
            if (!(qkv_uc_flags(w->d.p[i]) & QKV_UC_MN)) w->d.p[k++] = w->d.p[i];
        w->d.n = k;
        x = w->d.p;
        xn = w->d.n;
    }
    size_t word = 0;
    for (size_t i = 0; i < xn; i++) {
        if (qkv_uc_flags(x[i]) & QKV_UC_PUNCT) {
            if (!wordpiece(t, x + word, i - word, &w->ids)) return 0;
            if (!wordpiece(t, x + i, 1, &w->ids)) return 0;
            word = i + 1;
        }
    }
    return wordpiece(t, x + word, xn - word, &w->ids);
}

/* Text between special tokens: cleaning, CJK spacing, NFC, white space. */
static int chunk(const qkv_tokenizer *t, const uint32_t *s, size_t n, work *w) {
    if (n == 0) return 1;
    w->a.n = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t c = s[i];
        unsigned f = qkv_uc_flags(c);
        if (c == 0 || c == 0xFFFD || (f & QKV_UC_CONTROL)) continue;
        if (f & QKV_UC_CLEAN_WS) {
            if (!cp_push(&w->a, ' ')) return 0;
        } else if (t->chinese && qkv_uc_is_cjk(c)) {
            if (!cp_push(&w->a, ' ') || !cp_push(&w->a, c) || !cp_push(&w->a, ' ')) return 0;
        } else if (!cp_push(&w->a, c)) {
            return 0;
        }
    }
    if (!nfc(w->a.p, w->a.n, &w->b)) return 0;
    const uint32_t *p = w->b.p;
    size_t m = w->b.n, i = 0;
    while (i < m) {
        while (i < m && (qkv_uc_flags(p[i]) & QKV_UC_SPLIT_WS)) i++;
        size_t j = i;
        while (j < m && !(qkv_uc_flags(p[j]) & QKV_UC_SPLIT_WS)) j++;
        if (j > i && !piece(t, p + i, j - i, w)) return 0;
        i = j;
    }
    return 1;
}

/* Tokenize one sentence (no [CLS] / [SEP]) into w->ids (appended). */
static qkv_status sentence(const qkv_tokenizer *t, const char *text, size_t len, const char *which, work *w,
                           cpvec *cps, char *why, size_t why_len) {
    const unsigned char *u = (const unsigned char *)text;
    cps->n = 0;
    for (size_t i = 0; i < len;) {
        uint32_t c;
        size_t k = qkv_utf8_decode(u + i, len - i, &c);
        if (k == 0)
            return qkv_fail(why, why_len, QKV_ERR_FORMAT, "%s: invalid UTF-8 at byte %zu (0x%02X)", which, i,
                                 u[i]);
        if (!cp_push(cps, c)) return qkv_alloc_failure_status();
        i += k;
    }
    const uint32_t *s = cps->p;
    size_t n = cps->n;
    if (n == 0) return QKV_OK;
    cpvec lowered = {0};
    if (t->lowercase) {
        /* Everything but the special tokens, one character at a time. */
        for (size_t i = 0; i < n;) {
            int k;
            size_t m = special_at(t, s, n, i, &k);
            if (m > 0) {
                for (size_t j = 0; j < m; j++)
                    if (!cp_push(&lowered, s[i + j])) goto oom;
                i += m;
                continue;
            }
            uint32_t lo[2];
            int nl = qkv_uc_lower(s[i], lo);
            for (int j = 0; j < nl; j++)
                if (!cp_push(&lowered, lo[j])) goto oom;
            i++;
        }
        s = lowered.p;
        n = lowered.n;
    }
    size_t from = 0;
    for (size_t i = 0; i < n;) {
        int k = 0;
        size_t m = special_at(t, s, n, i, &k);
        if (m == 0) {
            i++;
            continue;
        }
        if (!chunk(t, s + from, i - from, w) || !id_push(&w->ids, t->special[k])) goto oom;
        i += m;
        from = i;
    }
    if (!chunk(t, s + from, n - from, w)) goto oom;
    qkv_free(lowered.p);
    return QKV_OK;
oom:
    qkv_free(lowered.p);
    return qkv_alloc_failure_status();
}

qkv_status qkv_tokenizer_encode(const qkv_tokenizer *tok, const char *text, size_t len, const char *pair,
                                size_t pair_len, int64_t max_len, int32_t *ids, int32_t *type_ids,
                                int64_t capacity, int64_t *count, char *why, size_t why_len) {
    if (!tok || !count) return qkv_fail(why, why_len, QKV_ERR_NULL_POINTER, "tokenizer or count is NULL");
    if ((!text && len > 0) || (!pair && pair_len > 0))
        return qkv_fail(why, why_len, QKV_ERR_NULL_POINTER, "text is NULL with a non-zero length");
    if (!ids && capacity > 0)
        return qkv_fail(why, why_len, QKV_ERR_NULL_POINTER, "ids is NULL with capacity > 0");
    if (capacity < 0) return qkv_fail(why, why_len, QKV_ERR_BAD_SIZE, "capacity %lld < 0", (long long)capacity);
    int64_t min_len = pair ? 3 : 2;
    if (max_len < 0 || (max_len > 0 && max_len < min_len))
        return qkv_fail(why, why_len, QKV_ERR_BAD_SIZE,
                             "max_len %lld: must be 0 (no truncation) or at least %lld", (long long)max_len,
                             (long long)min_len);
    work w = {0};
    cpvec cps = {0};
    qkv_status s = sentence(tok, text, len, pair ? "first text" : "text", &w, &cps, why, why_len);
    size_t la = w.ids.n, lb = 0;
    if (s == QKV_OK && pair) {
        s = sentence(tok, pair, pair_len, "second text", &w, &cps, why, why_len);
        lb = w.ids.n - la;
    }
    qkv_free(cps.p);
    if (s != QKV_OK) {
        work_free(&w);
        if (s == QKV_ERR_OUT_OF_MEMORY || s == QKV_ERR_MEMORY_LIMIT)
            qkv_fail(why, why_len, s, "no memory to tokenize %zu + %zu bytes", len, pair_len);
        return s;
    }
    /* Truncation as BertTokenizer's longest_first. */
    size_t ka = la, kb = lb, extra = pair ? 3 : 2;
    if (max_len > 0 && la + lb + extra > (uint64_t)max_len) {
        size_t remove = la + lb + extra - (size_t)max_len;
        if (!pair) {
            ka = la - remove; /* remove <= la since max_len >= 2 */
        } else {
            size_t diff = la > lb ? la - lb : lb - la;
            size_t first = diff < remove ? diff : remove, second = remove - first;
            size_t ra, rb;
            if (la > lb) {
                ra = first + second / 2;
                rb = second - second / 2;
            } else {
                ra = second / 2;
                rb = first + second - second / 2;
            }
            ka = la - ra;
            kb = lb - rb;
        }
    }
    size_t total = ka + kb + extra;
    if (total > (size_t)INT32_MAX) {
        work_free(&w);
        return qkv_fail(why, why_len, QKV_ERR_SIZE_OVERFLOW, "%zu tokens (at most %d)", total, INT32_MAX);
    }
    *count = (int64_t)total;
    if ((uint64_t)capacity < total) {
        work_free(&w);
        return qkv_fail(why, why_len, QKV_ERR_BAD_SIZE, "%zu tokens do not fit in capacity %lld", total,
                             (long long)capacity);
    }
    size_t o = 0;
    ids[o++] = tok->special[QKV_TOKEN_CLS];
    for (size_t i = 0; i < ka; i++) ids[o++] = w.ids.p[i];
    ids[o++] = tok->special[QKV_TOKEN_SEP];
    size_t first_end = o;
    if (pair) {
        for (size_t i = 0; i < kb; i++) ids[o++] = w.ids.p[la + i];
        ids[o++] = tok->special[QKV_TOKEN_SEP];
    }
    if (type_ids)
        for (size_t i = 0; i < o; i++) type_ids[i] = i < first_end ? 0 : 1;
    work_free(&w);
    return QKV_OK;
}

/* ---- loading ------------------------------------------------------------- */

void qkv_tokenizer_free(qkv_tokenizer *tok) {
    if (!tok) return;
    qkv_vocab_free(&tok->vocab);
    for (int k = 0; k < N_SPECIAL; k++) qkv_free(tok->special_cp[k]);
    qkv_free(tok);
}

/* The whole file into memory. *missing (may be NULL) is set when it does
 * not exist. */
static qkv_status read_file(const char *path, unsigned char **out, size_t *len, int *missing, char *why,
                            size_t why_len) {
    *out = NULL;
    *len = 0;
    if (missing) *missing = 0;
    struct stat st;
    if (stat(path, &st) != 0) {
        if (missing && errno == ENOENT) {
            *missing = 1;
            return QKV_ERR_IO;
        }
        return qkv_fail(why, why_len, QKV_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    }
    if (!S_ISREG(st.st_mode)) return qkv_fail(why, why_len, QKV_ERR_IO, "%s is not a regular file", path);
    FILE *f = fopen(path, "rb");
    if (!f) return qkv_fail(why, why_len, QKV_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    size_t cap = 0, n = 0;
    unsigned char *buf = NULL;
    for (;;) {
        if (n == cap && !grow((void **)&buf, &cap, n + 65536, 1)) {
            fclose(f);
            qkv_free(buf);
            return qkv_fail(why, why_len, qkv_alloc_failure_status(), "no memory to read %s", path);
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    int err = ferror(f);
    fclose(f);
    if (err) {
        qkv_free(buf);
        return qkv_fail(why, why_len, QKV_ERR_IO, "cannot read %s", path);
    }
    *out = buf;
    *len = n;
    return QKV_OK;
}

/* tokenizer_config.json: what was found in it. */
typedef struct tok_config {
    int lowercase, strip_accents, chinese; /* -1: absent (strip_accents: -1 also for null) */
    int64_t model_max_length;
    char *special[N_SPECIAL]; /* NULL: absent */
} tok_config;

static int json_literal(qkv_json *j, int *kind) {
    static const char *const words[3] = {"false", "true", "null"};
    qkv_json_peek(j);
    for (int k = 0; k < 3; k++) {
        size_t n = strlen(words[k]);
        if ((size_t)(j->end - j->p) >= n && memcmp(j->p, words[k], n) == 0) {
            j->p += n;
            *kind = k; /* 0 false, 1 true, 2 null */
            return 1;
        }
    }
    return 0;
}

/* A string value into a new allocation (NULL: error recorded or no memory, *oom set). */
static char *json_string_dup(qkv_json *j, size_t *len, int *oom) {
    size_t n;
    if (!qkv_json_string_measure(j, &n)) return NULL;
    char *s = qkv_alloc(n + 1);
    if (!s) {
        *oom = 1;
        return NULL;
    }
    int nul = 0;
    if (!qkv_json_string_read(j, s, n + 1, len, &nul)) {
        qkv_free(s);
        return NULL;
    }
    if (nul) {
        qkv_free(s);
        qkv_json_fail(j, "a NUL character in a token name");
        return NULL;
    }
    return s;
}

/* A special token's value: a string, an object with "content" (an
 * AddedToken), or null (left as it is). */
static int json_token_name(qkv_json *j, char **dst, int *oom) {
    int c = qkv_json_peek(j);
    size_t len;
    if (c == '"') {
        char *s = json_string_dup(j, &len, oom);
        if (!s) return 0;
        qkv_free(*dst);
        *dst = s;
        return 1;
    }
    int kind;
    if (c == 'n' && json_literal(j, &kind) && kind == 2) return 1;
    if (c != '{') return qkv_json_fail(j, "a special token must be a string or an object with \"content\"");
    j->p++;
    if (qkv_json_peek(j) == '}') return qkv_json_fail(j, "a special token object without \"content\"");
    int found = 0;
    for (;;) {
        char key[16];
        size_t kl;
        if (!qkv_json_string_read(j, key, sizeof key, &kl, NULL) || !qkv_json_expect(j, ':', "expected ':'"))
            return 0;
        if (kl == 7 && memcmp(key, "content", 7) == 0) {
            if (qkv_json_peek(j) != '"') return qkv_json_fail(j, "\"content\" must be a string");
            char *s = json_string_dup(j, &len, oom);
            if (!s) return 0;
            qkv_free(*dst);
            *dst = s;
            found = 1;
        } else if (!qkv_json_skip(j)) {
            return 0;
        }
        if (qkv_json_peek(j) == '}') {
            j->p++;
            break;
        }
        if (!qkv_json_expect(j, ',', "expected ',' or '}'")) return 0;
    }
    return found ? 1 : qkv_json_fail(j, "a special token object without \"content\"");
}

static int json_bool(qkv_json *j, int *out, int null_ok, const char *msg) {
    int kind;
    if (!json_literal(j, &kind) || (kind == 2 && !null_ok)) return qkv_json_fail(j, msg);
    *out = kind == 2 ? -1 : kind;
    return 1;
}

static int class_supported(const char *name) {
    static const char *const ok[] = {"BertTokenizer", "BertTokenizerFast", "DistilBertTokenizer",
                                     "DistilBertTokenizerFast"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        if (strcmp(name, ok[i]) == 0) return 1;
    return 0;
}

static qkv_status parse_config(const unsigned char *text, size_t len, const char *path, tok_config *cfg, char *why,
                               size_t why_len) {
    qkv_json j;
    qkv_json_init(&j, text, len);
    int oom = 0;
    qkv_status unsupported = QKV_OK;
    if (!qkv_json_expect(&j, '{', "expected an object")) goto bad;
    if (qkv_json_peek(&j) == '}') {
        j.p++;
    } else {
        for (;;) {
            char key[32];
            size_t kl;
            size_t mlen;
            if (!qkv_json_string_measure(&j, &mlen)) goto bad;
            if (!qkv_json_string_read(&j, key, sizeof key, &kl, NULL)) goto bad;
            if (mlen >= sizeof key) key[0] = '\0'; /* too long to be one we read */
            if (!qkv_json_expect(&j, ':', "expected ':'")) goto bad;
            int b = 0, handled = 0;
            if (strcmp(key, "do_lower_case") == 0) {
                if (!json_bool(&j, &cfg->lowercase, 0, "do_lower_case must be true or false")) goto bad;
                handled = 1;
            } else if (strcmp(key, "strip_accents") == 0) {
                if (!json_bool(&j, &cfg->strip_accents, 1, "strip_accents must be true, false or null")) goto bad;
                handled = 1;
            } else if (strcmp(key, "tokenize_chinese_chars") == 0) {
                if (!json_bool(&j, &cfg->chinese, 0, "tokenize_chinese_chars must be true or false")) goto bad;
                handled = 1;
            } else if (strcmp(key, "do_basic_tokenize") == 0) {
                if (!json_bool(&j, &b, 0, "do_basic_tokenize must be true or false")) goto bad;
                if (b == 0 && unsupported == QKV_OK)
                    unsupported = qkv_fail(why, why_len, QKV_ERR_UNSUPPORTED,
                                                "%s: do_basic_tokenize false is not supported", path);
                handled = 1;
            } else if (strcmp(key, "never_split") == 0) {
                int c = qkv_json_peek(&j);
                const unsigned char *list = j.p;
                if (c == '[') {
                    j.p++;
                    if (qkv_json_peek(&j) == ']') {
                        j.p++;
                    } else {
                        j.p = list;
                        if (!qkv_json_skip(&j)) goto bad;
                        if (unsupported == QKV_OK)
                            unsupported = qkv_fail(why, why_len, QKV_ERR_UNSUPPORTED,
                                                        "%s: a never_split list is not supported", path);
                    }
                } else if (!json_bool(&j, &b, 1, "never_split must be null or a list") || b != -1) {
                    goto bad;
                }
                handled = 1;
            } else if (strcmp(key, "model_max_length") == 0) {
                uint64_t v = 0;
                int c = qkv_json_peek(&j);
                if (c == '-' || (c >= '0' && c <= '9')) {
                    qkv_json_uint_kind k = qkv_json_uint(&j, &v);
                    if (k == QKV_JSON_UINT_SYNTAX) goto bad;
                    cfg->model_max_length = k == QKV_JSON_UINT_OK && v <= (uint64_t)INT32_MAX ? (int64_t)v : 0;
                    handled = 1;
                }
            } else if (strcmp(key, "tokenizer_class") == 0 && qkv_json_peek(&j) == '"') {
                size_t n;
                char *name = json_string_dup(&j, &n, &oom);
                if (!name) goto bad;
                if (!class_supported(name) && unsupported == QKV_OK)
                    unsupported = qkv_fail(why, why_len, QKV_ERR_UNSUPPORTED,
                                                "%s: tokenizer_class \"%.64s\" is not a WordPiece (BERT) tokenizer",
                                                path, name);
                qkv_free(name);
                handled = 1;
            } else {
                for (int k = 0; k < N_SPECIAL; k++)
                    if (strcmp(key, k_special_key[k]) == 0) {
                        if (!json_token_name(&j, &cfg->special[k], &oom)) goto bad;
                        handled = 1;
                    }
            }
            if (!handled && !qkv_json_skip(&j)) goto bad;
            if (qkv_json_peek(&j) == '}') {
                j.p++;
                break;
            }
            if (!qkv_json_expect(&j, ',', "expected ',' or '}'")) goto bad;
        }
    }
    if (!qkv_json_at_end(&j)) {
        qkv_json_fail(&j, "text after the object");
        goto bad;
    }
    return unsupported;
bad:
    if (oom) return qkv_fail(why, why_len, qkv_alloc_failure_status(), "no memory to read %s", path);
    return qkv_fail(why, why_len, QKV_ERR_FORMAT, "%s: %s at byte %zu", path,
                         j.err ? j.err : "malformed JSON", j.err ? j.err_pos : (size_t)(j.p - j.begin));
}

static void config_free(tok_config *cfg) {
    for (int k = 0; k < N_SPECIAL; k++) qkv_free(cfg->special[k]);
}

static qkv_status check_option(int v, const char *name, char *why, size_t why_len) {
    if (v == QKV_TOKENIZER_FROM_CONFIG || v == 0 || v == 1) return QKV_OK;
    return qkv_fail(why, why_len, QKV_ERR_BAD_ENUM, "option %s = %d: must be -1, 0 or 1", name, v);
}

/* The tokenizer from a vocab's bytes and a config (all fields may be absent). */
static qkv_status build(const unsigned char *vocab, size_t len, const char *vocab_name, const tok_config *cfg,
                        const qkv_tokenizer_options *opt, qkv_tokenizer **out, char *why, size_t why_len) {
    qkv_tokenizer *t = qkv_alloc_zeroed(sizeof *t);
    if (!t) return qkv_fail(why, why_len, qkv_alloc_failure_status(), "no memory for a tokenizer");
    qkv_status s = qkv_vocab_build(&t->vocab, vocab, len, vocab_name, why, why_len);
    if (s != QKV_OK) {
        qkv_free(t);
        return s;
    }
    int lc = opt ? opt->lowercase : QKV_TOKENIZER_FROM_CONFIG;
    int sa = opt ? opt->strip_accents : QKV_TOKENIZER_FROM_CONFIG;
    if (lc == QKV_TOKENIZER_FROM_CONFIG) lc = cfg->lowercase >= 0 ? cfg->lowercase : 1;
    if (sa == QKV_TOKENIZER_FROM_CONFIG) sa = cfg->strip_accents >= 0 ? cfg->strip_accents : lc;
    t->lowercase = lc;
    t->strip_accents = sa;
    t->chinese = cfg->chinese >= 0 ? cfg->chinese : 1;
    t->model_max_length = cfg->model_max_length;
    for (int k = 0; k < N_SPECIAL; k++) {
        const char *name = cfg->special[k] ? cfg->special[k] : k_default_special[k];
        size_t nl = strlen(name);
        t->special[k] = qkv_vocab_find(&t->vocab, name, nl);
        if (nl == 0 || t->special[k] < 0) {
            qkv_tokenizer_free(t);
            return qkv_fail(why, why_len, QKV_ERR_FORMAT,
                                 "%s has no %s token \"%.64s\" (the special tokens [UNK] [SEP] [PAD] [CLS] [MASK] "
                                 "must all be in it)",
                                 vocab_name, k_special_key[k], name);
        }
        t->special_cp[k] = qkv_alloc((nl + 1) * sizeof(uint32_t));
        if (!t->special_cp[k]) {
            qkv_tokenizer_free(t);
            return qkv_fail(why, why_len, qkv_alloc_failure_status(), "no memory for a tokenizer");
        }
        size_t n = 0;
        for (size_t i = 0; i < nl;) { /* valid UTF-8: it is a vocab line */
            uint32_t c = 0;
            size_t k2 = qkv_utf8_decode((const unsigned char *)name + i, nl - i, &c);
            if (k2 == 0) break;
            t->special_cp[k][n++] = c;
            i += k2;
        }
        t->special_n[k] = n;
    }
    *out = t;
    return QKV_OK;
}

static void config_init(tok_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->lowercase = cfg->strip_accents = cfg->chinese = -1;
}

qkv_status qkv_tokenizer_from_vocab(const void *vocab, size_t len, const qkv_tokenizer_options *opt,
                                    qkv_tokenizer **out, char *why, size_t why_len) {
    if (!out) return qkv_fail(why, why_len, QKV_ERR_NULL_POINTER, "out is NULL");
    *out = NULL;
    if (!vocab && len > 0) return qkv_fail(why, why_len, QKV_ERR_NULL_POINTER, "vocab is NULL");
    if (opt) {
        qkv_status s = check_option(opt->lowercase, "lowercase", why, why_len);
        if (s == QKV_OK) s = check_option(opt->strip_accents, "strip_accents", why, why_len);
        if (s != QKV_OK) return s;
    }
    tok_config cfg;
    config_init(&cfg);
    return build(vocab, len, "the vocab", &cfg, opt, out, why, why_len);
}

qkv_status qkv_tokenizer_load(const char *path, const qkv_tokenizer_options *opt, qkv_tokenizer **out, char *why,
                              size_t why_len) {
    if (!out) return qkv_fail(why, why_len, QKV_ERR_NULL_POINTER, "out is NULL");
    *out = NULL;
    if (!path) return qkv_fail(why, why_len, QKV_ERR_NULL_POINTER, "path is NULL");
    if (opt) {
        qkv_status s = check_option(opt->lowercase, "lowercase", why, why_len);
        if (s == QKV_OK) s = check_option(opt->strip_accents, "strip_accents", why, why_len);
        if (s != QKV_OK) return s;
    }
    struct stat st;
    int is_dir = stat(path, &st) == 0 && S_ISDIR(st.st_mode);
    size_t pl = strlen(path);
    char *vocab_path = NULL, *config_path = NULL;
    tok_config cfg;
    config_init(&cfg);
    unsigned char *vocab = NULL, *config = NULL;
    size_t vlen = 0, clen = 0;
    qkv_status s = QKV_OK;
    if (is_dir) {
        size_t cap = pl + sizeof "/tokenizer_config.json";
        vocab_path = qkv_alloc(cap);
        config_path = qkv_alloc(cap);
        if (!vocab_path || !config_path) {
            s = qkv_fail(why, why_len, qkv_alloc_failure_status(), "no memory");
            goto done;
        }
        snprintf(vocab_path, cap, "%s/vocab.txt", path);
        snprintf(config_path, cap, "%s/tokenizer_config.json", path);
        int missing = 0;
        s = read_file(config_path, &config, &clen, &missing, why, why_len);
        if (s != QKV_OK && !missing) goto done;
        if (s == QKV_OK) {
            s = parse_config(config, clen, config_path, &cfg, why, why_len);
            if (s != QKV_OK) goto done;
        }
    }
    s = read_file(vocab_path ? vocab_path : path, &vocab, &vlen, NULL, why, why_len);
    if (s != QKV_OK) goto done;
    s = build(vocab, vlen, vocab_path ? vocab_path : path, &cfg, opt, out, why, why_len);
done:
    config_free(&cfg);
    qkv_free(vocab);
    qkv_free(config);
    qkv_free(vocab_path);
    qkv_free(config_path);
    return s;
}

/* ---- queries ------------------------------------------------------------- */

void qkv_tokenizer_get_info(const qkv_tokenizer *tok, qkv_tokenizer_info *info) {
    if (!info) return;
    memset(info, 0, sizeof *info);
    if (!tok) return;
    info->vocab_size = tok->vocab.count;
    info->lowercase = tok->lowercase;
    info->strip_accents = tok->strip_accents;
    info->chinese_chars = tok->chinese;
    info->model_max_length = tok->model_max_length;
}

const char *qkv_tokenizer_token(const qkv_tokenizer *tok, int32_t id, size_t *len) {
    if (!tok || id < 0 || id >= tok->vocab.count) return NULL;
    size_t a = tok->vocab.off[id];
    if (len) *len = tok->vocab.off[id + 1] - a - 1;
    return tok->vocab.pool + a;
}

int32_t qkv_tokenizer_token_id(const qkv_tokenizer *tok, const char *token, size_t len) {
    if (!tok || !token) return -1;
    return qkv_vocab_find(&tok->vocab, token, len);
}

int32_t qkv_tokenizer_special_id(const qkv_tokenizer *tok, qkv_special_token which) {
    if (!tok || (int)which < 0 || (int)which >= N_SPECIAL) return -1;
    return tok->special[which];
}
