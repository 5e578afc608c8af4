/* The WordPiece tokenizer (include/qkv/text.h) against Hugging Face's
 * BertTokenizer: every line of tests/data/tokenizer/corpus.txt, in every
 * configuration of cases.txt, must give the ids and type ids that
 * make_expected.py recorded. Then the documented errors and limits: invalid
 * UTF-8, a 1 MB line, empty input, bad vocab and config files, small
 * buffers, and allocation failures (nothing leaked). */
#define _POSIX_C_SOURCE 200809L /* mkdir */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "qkv.h"
#include "qkv/text.h"
#include "test_util.h"

static char g_data[512];

/* The whole file (malloc'd, NUL-terminated), or NULL. */
static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    for (;;) {
        if (!buf) break;
        if (n == cap) {
            char *nb = realloc(buf, 2 * cap + 1);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        if (got == 0) break;
        n += got;
    }
    fclose(f);
    if (buf) buf[n] = '\0';
    if (len) *len = n;
    return buf;
}

/* Lines split on '\n' only (the last '\n' ends the last line). */
typedef struct lines {
    char *buf;
    char **line;
    size_t *len;
    size_t n;
} lines;

static int read_lines(const char *path, lines *l) {
    size_t n;
    memset(l, 0, sizeof *l);
    l->buf = slurp(path, &n);
    if (!l->buf) return 0;
    size_t count = 0;
    for (size_t i = 0; i < n; i++) count += l->buf[i] == '\n';
    if (n > 0 && l->buf[n - 1] != '\n') count++;
    l->line = malloc((count + 1) * sizeof *l->line);
    l->len = malloc((count + 1) * sizeof *l->len);
    if (!l->line || !l->len) return 0;
    size_t start = 0;
    for (size_t i = 0; i <= n && l->n < count; i++) {
        if (i < n && l->buf[i] != '\n') continue;
        l->line[l->n] = l->buf + start;
        l->len[l->n] = i - start;
        l->n++;
        if (i < n) l->buf[i] = '\0';
        start = i + 1;
    }
    return 1;
}

static void free_lines(lines *l) {
    free(l->buf);
    free(l->line);
    free(l->len);
}

static const char *data_path(char *buf, size_t cap, const char *rel) {
    snprintf(buf, cap, "%s/%s", g_data, rel);
    return buf;
}

/* "1 2 3|0 0 0" into ids / types; returns the count or -1. */
static int64_t parse_expected(const char *s, int32_t *ids, int32_t *types, int64_t cap) {
    int64_t n = 0, m = 0;
    const char *p = s;
    while (*p && *p != '|') {
        char *e;
        long v = strtol(p, &e, 10);
        if (e == p || n >= cap) return -1;
        ids[n++] = (int32_t)v;
        p = e;
        while (*p == ' ') p++;
    }
    if (*p != '|') return -1;
    p++;
    while (*p) {
        char *e;
        long v = strtol(p, &e, 10);
        if (e == p || m >= cap) return -1;
        types[m++] = (int32_t)v;
        p = e;
        while (*p == ' ') p++;
    }
    return n == m ? n : -1;
}

#define CAP 4096

/* One configuration of cases.txt against its expected file. */
static void check_config(const char *name, const char *dir, int lower, int strip, int64_t max_len, int pair,
                         const lines *corpus, const qkv_tokenizer_options *opt_override) {
    char path[1400], why[256] = "";
    qkv_tokenizer_options opt = {lower, strip};
    qkv_tokenizer *tok = NULL;
    CHECK_STATUS(qkv_tokenizer_load(data_path(path, sizeof path, dir), opt_override ? opt_override : &opt, &tok,
                                     why, sizeof why),
                 QKV_OK);
    if (!tok) {
        fprintf(stderr, "  %s: %s\n", name, why);
        return;
    }
    char rel[128];
    snprintf(rel, sizeof rel, "expected/%s.txt", name);
    lines exp;
    int ok = read_lines(data_path(path, sizeof path, rel), &exp);
    CHECK(ok && exp.n == corpus->n, "%s: %zu expected lines for %zu corpus lines", rel, exp.n, corpus->n);
    static int32_t want[CAP], want_t[CAP], got[CAP], got_t[CAP];
    size_t equal = 0;
    for (size_t i = 0; ok && i < corpus->n && i < exp.n; i++) {
        int64_t nw = parse_expected(exp.line[i], want, want_t, CAP), ng = -1;
        size_t j = (i + 1) % corpus->n;
        qkv_status s = qkv_tokenizer_encode(tok, corpus->line[i], corpus->len[i], pair ? corpus->line[j] : NULL,
                                            pair ? corpus->len[j] : 0, max_len, got, got_t, CAP, &ng, why,
                                            sizeof why);
        int same = s == QKV_OK && nw >= 0 && ng == nw && memcmp(got, want, (size_t)nw * sizeof *got) == 0 &&
                   memcmp(got_t, want_t, (size_t)nw * sizeof *got) == 0;
        if (same) {
            equal++;
        } else {
            fprintf(stderr, "  %s line %zu: status %d, %lld ids (want %lld)\n    got ", name, i + 1, (int)s,
                    (long long)ng, (long long)nw);
            for (int64_t k = 0; k < ng && k < 40; k++) fprintf(stderr, " %d", got[k]);
            fprintf(stderr, "\n    want");
            for (int64_t k = 0; k < nw && k < 40; k++) fprintf(stderr, " %d", want[k]);
            fprintf(stderr, "\n");
        }
    }
    CHECK(equal == corpus->n, "%s: %zu of %zu lines equal", name, equal, corpus->n);
    printf("%-24s %zu / %zu lines equal to BertTokenizer\n", name, equal, corpus->n);
    if (ok) free_lines(&exp);
    qkv_tokenizer_free(tok);
}

static void test_corpus(void) {
    char path[1400];
    lines corpus, random, cases;
    CHECK(read_lines(data_path(path, sizeof path, "corpus.txt"), &corpus), "read %s", path);
    CHECK(read_lines(data_path(path, sizeof path, "random.txt"), &random), "read %s", path);
    CHECK(read_lines(data_path(path, sizeof path, "cases.txt"), &cases), "read %s", path);
    CHECK(cases.n >= 14, "%zu configurations", cases.n);
    for (size_t c = 0; c < cases.n; c++) {
        char name[64], dir[64], text[64];
        int lower, strip, pair;
        long long max_len;
        if (sscanf(cases.line[c], "%63s %63s %d %d %lld %d %63s", name, dir, &lower, &strip, &max_len, &pair,
                   text) != 7 ||
            (strcmp(text, "corpus.txt") != 0 && strcmp(text, "random.txt") != 0)) {
            CHECK(0, "cases.txt line %zu: %s", c + 1, cases.line[c]);
            continue;
        }
        check_config(name, dir, lower, strip, max_len, pair, strcmp(text, "corpus.txt") == 0 ? &corpus : &random,
                     NULL);
    }
    free_lines(&random);
    /* The uncased model's own tokenizer_config.json gives the same settings
     * (do_lower_case true, strip_accents null), and so do the defaults. */
    qkv_tokenizer_options from_config = {QKV_TOKENIZER_FROM_CONFIG, QKV_TOKENIZER_FROM_CONFIG};
    check_config("uncased", "uncased", 0, 0, 0, 0, &corpus, &from_config);
    check_config("uncased", "uncased/vocab.txt", 0, 0, 0, 0, &corpus, &from_config);
    check_config("cased", "cased", 0, 0, 0, 0, &corpus, &from_config);
    free_lines(&corpus);
    free_lines(&cases);
}

static qkv_tokenizer *load_uncased(void) {
    char path[1400], why[256] = "";
    qkv_tokenizer *tok = NULL;
    qkv_status s = qkv_tokenizer_load(data_path(path, sizeof path, "uncased"), NULL, &tok, why, sizeof why);
    CHECK(s == QKV_OK, "load uncased: %s", why);
    return tok;
}

static void test_queries(void) {
    qkv_tokenizer *tok = load_uncased();
    if (!tok) return;
    qkv_tokenizer_info info;
    qkv_tokenizer_get_info(tok, &info);
    CHECK(info.vocab_size == 30522 && info.lowercase == 1 && info.strip_accents == 1 && info.chinese_chars == 1 &&
              info.model_max_length == 512,
          "info %lld %d %d %d %lld", (long long)info.vocab_size, info.lowercase, info.strip_accents,
          info.chinese_chars, (long long)info.model_max_length);
    size_t len = 0;
    const char *t = qkv_tokenizer_token(tok, 101, &len);
    CHECK(t && strcmp(t, "[CLS]") == 0 && len == 5, "token 101");
    t = qkv_tokenizer_token(tok, 30521, &len);
    CHECK(t && strcmp(t, "##～") == 0 && len == strlen("##～"), "the last token");
    CHECK(qkv_tokenizer_token(tok, 30522, NULL) == NULL && qkv_tokenizer_token(tok, -1, NULL) == NULL &&
              qkv_tokenizer_token(NULL, 0, NULL) == NULL,
          "token out of range");
    CHECK(qkv_tokenizer_token_id(tok, "[SEP]", 5) == 102 && qkv_tokenizer_token_id(tok, "hello", 5) == 7592 &&
              qkv_tokenizer_token_id(tok, "##ing", 5) == 2075 && qkv_tokenizer_token_id(tok, "hellox", 6) == -1 &&
              qkv_tokenizer_token_id(tok, "[PAD]", 0) == -1 && qkv_tokenizer_token_id(NULL, "a", 1) == -1,
          "token ids");
    CHECK(qkv_tokenizer_special_id(tok, QKV_TOKEN_UNK) == 100 && qkv_tokenizer_special_id(tok, QKV_TOKEN_SEP) == 102 &&
              qkv_tokenizer_special_id(tok, QKV_TOKEN_PAD) == 0 && qkv_tokenizer_special_id(tok, QKV_TOKEN_CLS) == 101 &&
              qkv_tokenizer_special_id(tok, QKV_TOKEN_MASK) == 103 &&
              qkv_tokenizer_special_id(tok, (qkv_special_token)5) == -1,
          "special ids");
    CHECK(strcmp(qkv_tokenizer_unicode_version(), "14.0.0") == 0 || strlen(qkv_tokenizer_unicode_version()) > 0,
          "unicode version");
    qkv_tokenizer_free(tok);
    qkv_tokenizer_free(NULL);
    qkv_tokenizer_get_info(NULL, &info);
    CHECK(info.vocab_size == 0, "info of NULL");
}

static void test_encode_errors(void) {
    qkv_tokenizer *tok = load_uncased();
    if (!tok) return;
    int32_t ids[64], types[64];
    int64_t n = -1;
    char why[256];
    /* Empty input: [CLS] [SEP]; an empty pair adds a [SEP]. */
    CHECK_STATUS(qkv_tokenizer_encode(tok, NULL, 0, NULL, 0, 0, ids, types, 64, &n, why, sizeof why), QKV_OK);
    CHECK(n == 2 && ids[0] == 101 && ids[1] == 102 && types[0] == 0 && types[1] == 0, "empty text");
    CHECK_STATUS(qkv_tokenizer_encode(tok, "", 0, "", 0, 0, ids, types, 64, &n, why, sizeof why), QKV_OK);
    CHECK(n == 3 && ids[2] == 102 && types[2] == 1, "empty pair");
    /* Counting, then a buffer too small. */
    CHECK_STATUS(qkv_tokenizer_encode(tok, "hello world", 11, NULL, 0, 0, NULL, NULL, 0, &n, why, sizeof why),
                 QKV_ERR_BAD_SIZE);
    CHECK(n == 4, "count %lld", (long long)n);
    ids[0] = -7;
    CHECK_STATUS(qkv_tokenizer_encode(tok, "hello world", 11, NULL, 0, 0, ids, NULL, 3, &n, why, sizeof why),
                 QKV_ERR_BAD_SIZE);
    CHECK(n == 4 && ids[0] == -7, "nothing written when it does not fit");
    CHECK_STATUS(qkv_tokenizer_encode(tok, "hello world", 11, NULL, 0, 0, ids, NULL, 4, &n, why, sizeof why), QKV_OK);
    CHECK(n == 4 && ids[1] == 7592 && ids[2] == 2088, "hello world");
    /* Arguments. */
    CHECK_STATUS(qkv_tokenizer_encode(NULL, "a", 1, NULL, 0, 0, ids, NULL, 64, &n, why, sizeof why),
                 QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_tokenizer_encode(tok, "a", 1, NULL, 0, 0, ids, NULL, 64, NULL, why, sizeof why),
                 QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_tokenizer_encode(tok, NULL, 1, NULL, 0, 0, ids, NULL, 64, &n, why, sizeof why),
                 QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_tokenizer_encode(tok, "a", 1, NULL, 3, 0, ids, NULL, 64, &n, why, sizeof why),
                 QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_tokenizer_encode(tok, "a", 1, NULL, 0, 0, NULL, NULL, 64, &n, why, sizeof why),
                 QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_tokenizer_encode(tok, "a", 1, NULL, 0, 0, ids, NULL, -1, &n, why, sizeof why), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_tokenizer_encode(tok, "a", 1, NULL, 0, -1, ids, NULL, 64, &n, why, sizeof why), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_tokenizer_encode(tok, "a", 1, NULL, 0, 1, ids, NULL, 64, &n, why, sizeof why), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_tokenizer_encode(tok, "a", 1, "b", 1, 2, ids, NULL, 64, &n, why, sizeof why), QKV_ERR_BAD_SIZE);
    CHECK_STATUS(qkv_tokenizer_encode(tok, "a b c", 5, NULL, 0, 2, ids, NULL, 64, &n, why, sizeof why), QKV_OK);
    CHECK(n == 2, "max_len 2 keeps the special tokens only");
    CHECK_STATUS(qkv_tokenizer_encode(tok, "a b c", 5, "d e", 3, 3, ids, types, 64, &n, why, sizeof why), QKV_OK);
    CHECK(n == 3 && ids[1] == 102 && ids[2] == 102 && types[2] == 1, "max_len 3 for a pair");
    /* Invalid UTF-8: refused, naming the byte. */
    static const struct {
        const char *bytes;
        size_t len, at;
    } bad[] = {
        {"ab\x80", 3, 2},             /* a stray continuation byte */
        {"\xC0\x80", 2, 0},           /* overlong NUL */
        {"x\xE0\x80\xAF", 4, 1},      /* overlong '/' */
        {"ok \xED\xA0\x80", 6, 3},    /* a surrogate */
        {"\xF4\x90\x80\x80", 4, 0},   /* past U+10FFFF */
        {"\xF5\x80\x80\x80", 4, 0},   /* F5 */
        {"caf\xC3", 4, 3},            /* truncated at the end */
        {"\xE2\x82 x", 4, 0},         /* truncated in the middle */
        {"\xFF", 1, 0},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char want[64];
        snprintf(want, sizeof want, "at byte %zu ", bad[i].at);
        why[0] = '\0';
        n = -1;
        CHECK_STATUS(qkv_tokenizer_encode(tok, bad[i].bytes, bad[i].len, NULL, 0, 0, ids, NULL, 64, &n, why,
                                          sizeof why),
                     QKV_ERR_FORMAT);
        CHECK(strstr(why, want) != NULL && strstr(why, "UTF-8") != NULL && n == -1, "case %zu: %s", i, why);
        why[0] = '\0';
        CHECK_STATUS(qkv_tokenizer_encode(tok, "fine", 4, bad[i].bytes, bad[i].len, 0, ids, NULL, 64, &n, why,
                                          sizeof why),
                     QKV_ERR_FORMAT);
        CHECK(strstr(why, "second text") != NULL && strstr(why, want) != NULL, "pair case %zu: %s", i, why);
    }
    /* NUL bytes inside the length are text (removed by cleaning). */
    CHECK_STATUS(qkv_tokenizer_encode(tok, "hel\0lo", 6, NULL, 0, 0, ids, NULL, 64, &n, why, sizeof why), QKV_OK);
    CHECK(n == 3 && ids[1] == 7592, "NUL removed");
    qkv_tokenizer_free(tok);
}

static void test_long_input(void) {
    qkv_tokenizer *tok = load_uncased();
    if (!tok) return;
    const size_t mb = 1 << 20;
    char *text = malloc(mb);
    int32_t *ids = malloc(sizeof(int32_t) * (mb / 2));
    char why[256] = "";
    int64_t n = -1;
    if (!text || !ids) {
        CHECK(0, "no memory");
        free(text);
        free(ids);
        qkv_tokenizer_free(tok);
        return;
    }
    /* 1 MB of words: "hello world " repeated. */
    size_t wl = mb - mb % 12;
    for (size_t i = 0; i < wl; i++) text[i] = "hello world "[i % 12];
    CHECK_STATUS(qkv_tokenizer_encode(tok, text, wl, NULL, 0, 0, ids, NULL, (int64_t)(mb / 2), &n, why, sizeof why),
                 QKV_OK);
    size_t words = wl / 12 * 2;
    CHECK(n == (int64_t)(words + 2), "1 MB of words: %lld ids, want %zu", (long long)n, words + 2);
    int pattern = n > 2;
    for (int64_t i = 1; pattern && i + 1 < n; i++) pattern = ids[i] == ((i % 2) ? 7592 : 2088);
    CHECK(pattern, "1 MB of words: the pattern");
    /* Truncated to the model's length. */
    CHECK_STATUS(qkv_tokenizer_encode(tok, text, mb, NULL, 0, 512, ids, NULL, 512, &n, why, sizeof why), QKV_OK);
    CHECK(n == 512 && ids[511] == 102 && ids[510] == 2088, "truncated to 512");
    /* 1 MB without a space: one word of more than 100 characters. */
    memset(text, 'a', mb);
    CHECK_STATUS(qkv_tokenizer_encode(tok, text, mb, NULL, 0, 0, ids, NULL, 16, &n, why, sizeof why), QKV_OK);
    CHECK(n == 3 && ids[1] == 100, "1 MB word is [UNK]");
    /* 1 MB of CJK ideographs (3 bytes each): one token each. */
    size_t nc = mb / 3;
    for (size_t i = 0; i < nc; i++) memcpy(text + 3 * i, "\xE4\xB8\x80", 3); /* U+4E00 */
    CHECK_STATUS(qkv_tokenizer_encode(tok, text, nc * 3, NULL, 0, 0, ids, NULL, (int64_t)(mb / 2), &n, why,
                                      sizeof why),
                 QKV_OK);
    CHECK(n == (int64_t)nc + 2 && ids[1] == qkv_tokenizer_token_id(tok, "\xE4\xB8\x80", 3), "1 MB of CJK: %lld",
          (long long)n);
    /* 1 MB of combining marks after one letter (NFC and NFD in one piece). */
    text[0] = 'a';
    size_t nm = (mb - 1) / 2;
    for (size_t i = 0; i < nm; i++) memcpy(text + 1 + 2 * i, "\xCC\x81", 2); /* U+0301 */
    CHECK_STATUS(qkv_tokenizer_encode(tok, text, 1 + 2 * nm, NULL, 0, 0, ids, NULL, 16, &n, why, sizeof why),
                 QKV_OK);
    CHECK(n == 3 && ids[1] == qkv_tokenizer_token_id(tok, "a", 1), "accents stripped: %lld", (long long)n);
    free(text);
    free(ids);
    qkv_tokenizer_free(tok);
}

/* Write bytes to a temporary file; returns its path in buf. */
static const char *temp_file(char *buf, size_t cap, const char *name, const char *bytes, size_t len) {
    tu_tmp_path(buf, cap, name);
    FILE *f = fopen(buf, "wb");
    if (f) {
        fwrite(bytes, 1, len, f);
        fclose(f);
    }
    return buf;
}

static const char k_small_vocab[] = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\n##s\nworld\n";

static void expect_load_error(const char *label, const char *bytes, size_t len, qkv_status want, const char *text) {
    char path[512], why[256] = "";
    qkv_tokenizer *tok = (qkv_tokenizer *)&tok;
    temp_file(path, sizeof path, "tokenizer_bad_vocab.txt", bytes, len);
    qkv_status s = qkv_tokenizer_load(path, NULL, &tok, why, sizeof why);
    CHECK(s == want && tok == NULL && strstr(why, text) != NULL, "%s: status %d, why \"%s\" (want \"%s\")", label,
          (int)s, why, text);
    /* The same from memory. */
    why[0] = '\0';
    tok = (qkv_tokenizer *)&tok;
    s = qkv_tokenizer_from_vocab(bytes, len, NULL, &tok, why, sizeof why);
    CHECK(s == want && tok == NULL && strstr(why, text) != NULL, "%s (memory): status %d, why \"%s\"", label,
          (int)s, why);
    remove(path);
}

static void test_bad_vocab(void) {
    char path[512], why[256] = "";
    qkv_tokenizer *tok = (qkv_tokenizer *)&tok;
    CHECK_STATUS(qkv_tokenizer_load(tu_tmp_path(path, sizeof path, "tokenizer_missing/vocab.txt"), NULL, &tok, why,
                                    sizeof why),
                 QKV_ERR_IO);
    CHECK(tok == NULL && strstr(why, "tokenizer_missing") != NULL, "missing file: %s", why);
    /* A directory without vocab.txt. */
    CHECK_STATUS(qkv_tokenizer_load(tu_tmp_path(path, sizeof path, ""), NULL, &tok, why, sizeof why), QKV_ERR_IO);
    CHECK(strstr(why, "vocab.txt") != NULL, "directory without vocab: %s", why);
    CHECK_STATUS(qkv_tokenizer_load(NULL, NULL, &tok, why, sizeof why), QKV_ERR_NULL_POINTER);
    CHECK_STATUS(qkv_tokenizer_load("x", NULL, NULL, why, sizeof why), QKV_ERR_NULL_POINTER);
    qkv_tokenizer_options bad_opt = {2, 0};
    CHECK_STATUS(qkv_tokenizer_load("x", &bad_opt, &tok, why, sizeof why), QKV_ERR_BAD_ENUM);
    bad_opt.lowercase = 0;
    bad_opt.strip_accents = -2;
    CHECK_STATUS(qkv_tokenizer_from_vocab(k_small_vocab, strlen(k_small_vocab), &bad_opt, &tok, NULL, 0),
                 QKV_ERR_BAD_ENUM);

    expect_load_error("empty", "", 0, QKV_ERR_FORMAT, "empty");
    expect_load_error("duplicate", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\nhello\n", 48, QKV_ERR_FORMAT,
                      "line 8 duplicates line 6");
    expect_load_error("no [CLS]", "[PAD]\n[UNK]\n[SEP]\n[MASK]\nhello\n", 31, QKV_ERR_FORMAT, "[CLS]");
    expect_load_error("CRLF", "[PAD]\r\n[UNK]\r\n", 14, QKV_ERR_FORMAT, "line 1: a carriage return");
    expect_load_error("NUL", "[PAD]\n[UN\0K]\n", 13, QKV_ERR_FORMAT, "line 2: a NUL byte");
    expect_load_error("bad UTF-8", "[PAD]\n[UNK]\nab\xC3(\n", 16, QKV_ERR_FORMAT, "line 3: invalid UTF-8");

    /* A good one from memory; the last line without its newline. */
    tok = NULL;
    CHECK_STATUS(qkv_tokenizer_from_vocab(k_small_vocab, strlen(k_small_vocab) - 1, NULL, &tok, why, sizeof why),
                 QKV_OK);
    int32_t ids[16];
    int64_t n = 0;
    CHECK_STATUS(qkv_tokenizer_encode(tok, "Hello worlds, HELLOS", 20, NULL, 0, 0, ids, NULL, 16, &n, why,
                                      sizeof why),
                 QKV_OK);
    static const int32_t want[] = {2, 5, 7, 6, 1, 5, 6, 3};
    CHECK(n == 8 && memcmp(ids, want, sizeof want) == 0, "small vocab: %lld ids", (long long)n);
    qkv_tokenizer_free(tok);
}

static void expect_config(const char *label, const char *json, qkv_status want, const char *text, int want_lower) {
    char dir[512], path[600], why[256] = "";
    tu_tmp_path(dir, sizeof dir, "tokenizer_cfgtest");
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/vocab.txt", dir);
    FILE *f = fopen(path, "wb");
    if (f) {
        fputs(k_small_vocab, f);
        fclose(f);
    }
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    f = fopen(path, "wb");
    if (f) {
        fputs(json, f);
        fclose(f);
    }
    qkv_tokenizer *tok = NULL;
    qkv_status s = qkv_tokenizer_load(dir, NULL, &tok, why, sizeof why);
    CHECK(s == want && strstr(why, text) != NULL, "%s: status %d, why \"%s\" (want \"%s\")", label, (int)s, why,
          text);
    if (s == QKV_OK) {
        qkv_tokenizer_info info;
        qkv_tokenizer_get_info(tok, &info);
        int32_t ids[16];
        int64_t n = 0;
        CHECK_STATUS(qkv_tokenizer_encode(tok, "Hello", 5, NULL, 0, 0, ids, NULL, 16, &n, NULL, 0), QKV_OK);
        CHECK(info.lowercase == want_lower && ids[1] == (want_lower ? 5 : 1), "%s: lowercase %d, id %d", label,
              info.lowercase, ids[1]);
    }
    qkv_tokenizer_free(tok);
    remove(path);
    snprintf(path, sizeof path, "%s/vocab.txt", dir);
    remove(path);
    remove(dir);
}

static void test_config(void) {
    expect_config("lower", "{\"do_lower_case\": true, \"added_tokens_decoder\": {\"0\": {\"content\": \"[PAD]\","
                           " \"lstrip\": false, \"x\": [1, 2.5, -3e4, null, {\"a\": [[]]}]}}}",
                  QKV_OK, "", 1);
    expect_config("cased", "{\"do_lower_case\": false, \"model_max_length\": 1000000000000000019884624838656,"
                           " \"never_split\": null, \"strip_accents\": null}",
                  QKV_OK, "", 0);
    expect_config("token objects", "{\"unk_token\": {\"content\": \"[UNK]\", \"single_word\": false},"
                                   " \"do_lower_case\": true}",
                  QKV_OK, "", 1);
    expect_config("empty object", " {} ", QKV_OK, "", 1);
    expect_config("class", "{\"tokenizer_class\": \"XLMRobertaTokenizer\"}", QKV_ERR_UNSUPPORTED,
                  "tokenizer_class \"XLMRobertaTokenizer\"", 0);
    expect_config("basic", "{\"do_basic_tokenize\": false}", QKV_ERR_UNSUPPORTED, "do_basic_tokenize", 0);
    expect_config("never_split", "{\"never_split\": [\"[X]\"]}", QKV_ERR_UNSUPPORTED, "never_split", 0);
    expect_config("bad bool", "{\"do_lower_case\": 1}", QKV_ERR_FORMAT, "do_lower_case must be true or false", 0);
    expect_config("truncated", "{\"do_lower_case\": true", QKV_ERR_FORMAT, "tokenizer_config.json", 0);
    expect_config("trailing", "{} x", QKV_ERR_FORMAT, "text after the object", 0);
    expect_config("deep", "{\"a\": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[",
                  QKV_ERR_FORMAT, "nesting", 0);
    expect_config("unknown special", "{\"mask_token\": \"<mask>\"}", QKV_ERR_FORMAT, "<mask>", 0);
    expect_config("bad utf-8", "{\"cls_token\": \"\xC3(\"}", QKV_ERR_FORMAT, "tokenizer_config.json", 0);
}

/* Allocation failures at every step: the call fails cleanly or succeeds,
 * and nothing stays allocated. */
static void test_memory_limit(void) {
    char path[1400];
    data_path(path, sizeof path, "cased");
    const char *text = "Café naïve [MASK] 日本語 ΣΑΣ \xEF\xBC\xA1 a\xCC\x81\xCC\x81 supercalifragilistic";
    int fails = 0, oks = 0;
    for (size_t limit = 1024; limit < (1u << 20); limit += limit / 8) {
        CHECK_STATUS(qkv_set_memory_limit(limit), QKV_OK);
        qkv_tokenizer *tok = NULL;
        qkv_status s = qkv_tokenizer_load(path, NULL, &tok, NULL, 0);
        if (s == QKV_OK) {
            int32_t ids[128];
            int64_t n = 0;
            s = qkv_tokenizer_encode(tok, text, strlen(text), text, strlen(text), 0, ids, NULL, 128, &n, NULL, 0);
        }
        CHECK(s == QKV_OK || s == QKV_ERR_MEMORY_LIMIT, "limit %zu: status %d", limit, (int)s);
        if (s == QKV_OK)
            oks++;
        else
            fails++;
        qkv_tokenizer_free(tok);
        CHECK_STATUS(qkv_set_memory_limit(0), QKV_OK);
        CHECK(qkv_memory_in_use() == 0, "limit %zu: %zu bytes left", limit, qkv_memory_in_use());
    }
    CHECK(fails > 0 && oks > 0, "limits: %d failed, %d passed", fails, oks);
}

int main(void) {
    const char *src = getenv("QKV_SOURCE_DIR");
    snprintf(g_data, sizeof g_data, "%s/tests/data/tokenizer", src && *src ? src : ".");
    test_corpus();
    test_queries();
    test_encode_errors();
    test_long_input();
    test_bad_vocab();
    test_config();
    test_memory_limit();
    CHECK(qkv_memory_in_use() == 0, "%zu bytes still allocated", qkv_memory_in_use());
    return tu_finish();
}
