/* libFuzzer target: the WordPiece tokenizer (include/qkv/text.h) on
 * untrusted text, vocab files and tokenizer_config.json. The first byte
 * chooses what the rest is:
 *   0 mod 4 (and 3): text and a pair for qkv_tokenizer_encode with a fixed
 *     vocab (options and max_len from the next bytes). Checked: the status
 *     is QKV_OK, or QKV_ERR_FORMAT exactly when the input is not valid
 *     UTF-8 (decided here by a separate decoder); on success [CLS] first,
 *     [SEP] where the type ids change and last, ids inside the vocab, the
 *     length within max_len, and the counting call (capacity 0) agreeing.
 *   1: a vocab file for qkv_tokenizer_from_vocab: QKV_OK, QKV_ERR_FORMAT or
 *     QKV_ERR_SIZE_OVERFLOW with a reason; on success every token finds its
 *     own id and a fixed text encodes.
 *   2: a tokenizer_config.json beside a fixed vocab, loaded from a
 *     directory: QKV_OK, QKV_ERR_FORMAT or QKV_ERR_UNSUPPORTED with a
 *     reason.
 * Always: nothing left allocated once the tokenizer is freed. */
#define _POSIX_C_SOURCE 200809L /* getpid, mkdir */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz.h"
#include "fuzz_check.h"
#include "qkv.h"
#include "qkv/text.h"

static const char k_vocab[] =
    "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n!\n,\n.\n[\n]\na\nb\nc\ne\nh\nl\no\n##a\n##b\n##c\n##e\n##l\n##o\n"
    "hello\nworld\n##s\ncafe\ncaf\n##\xC3\xA9\n\xC3\xA9\n\xCE\xB1\n\xCF\x83\n\xCF\x82\n\xE4\xB8\x80\n"
    "\xE6\x97\xA5\n##\xCC\x81\n\xF0\x9F\x98\x80\nunaff\n##able\n";

/* Valid UTF-8 (RFC 3629), decided independently of the library. */
static int valid_utf8(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
        if (len == 0 || i + len > n) return 0;
        uint32_t v = len == 1 ? c : len == 2 ? (c & 0x1Fu) : len == 3 ? (c & 0x0Fu) : (c & 0x07u);
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return 0;
            v = (v << 6) | (s[i + k] & 0x3Fu);
        }
        static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (v < min[len] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
        i += len;
    }
    return 1;
}

static void fuzz_encode(fuzz_reader *r) {
    qkv_tokenizer_options opt = {fuzz_u8(r) % 3 - 1, fuzz_u8(r) % 3 - 1};
    int64_t max_len = fuzz_u8(r) % 40;
    int pair = fuzz_u8(r) & 1;
    size_t split = fuzz_u16(r);
    split = r->n ? split % (r->n + 1) : 0;
    const char *text = (const char *)r->p, *second = pair ? text + split : NULL;
    size_t len = pair ? split : r->n, len2 = pair ? r->n - split : 0;
    if (max_len == 1 || (pair && max_len == 2)) max_len = 0;

    qkv_tokenizer *tok = NULL;
    char why[256] = "";
    qkv_status s = qkv_tokenizer_from_vocab(k_vocab, sizeof k_vocab - 1, &opt, &tok, why, sizeof why);
    FUZZ_CHECK(s == QKV_OK, "fixed vocab: %s", why);
    int32_t cls = qkv_tokenizer_special_id(tok, QKV_TOKEN_CLS), sep = qkv_tokenizer_special_id(tok, QKV_TOKEN_SEP);
    qkv_tokenizer_info info;
    qkv_tokenizer_get_info(tok, &info);

    int64_t need = -1;
    s = qkv_tokenizer_encode(tok, len ? text : NULL, len, second, len2, max_len, NULL, NULL, 0, &need, why,
                             sizeof why);
    int valid = valid_utf8((const uint8_t *)text, len) && (!pair || valid_utf8((const uint8_t *)second, len2));
    if (!valid) {
        FUZZ_CHECK(s == QKV_ERR_FORMAT && strstr(why, "UTF-8"), "invalid UTF-8: status %d (%s)", (int)s, why);
        qkv_tokenizer_free(tok);
        return;
    }
    FUZZ_CHECK(s == QKV_ERR_BAD_SIZE && need >= (pair ? 3 : 2), "counting: status %d (%s), %lld", (int)s, why,
               (long long)need);
    FUZZ_CHECK(max_len == 0 || need <= max_len, "%lld ids past max_len %lld", (long long)need, (long long)max_len);
    /* A byte of text yields at most one id (a sanity bound, with room). */
    FUZZ_CHECK(need <= 2 * (int64_t)(len + len2) + 3, "%lld ids from %zu bytes", (long long)need, len + len2);
    int32_t *ids = malloc((size_t)need * sizeof *ids), *types = malloc((size_t)need * sizeof *types);
    if (ids && types) {
        int64_t n = -1;
        s = qkv_tokenizer_encode(tok, len ? text : NULL, len, second, len2, max_len, ids, types, need, &n, why,
                                 sizeof why);
        FUZZ_CHECK(s == QKV_OK && n == need, "encode: status %d (%s), %lld of %lld", (int)s, why, (long long)n,
                   (long long)need);
        FUZZ_CHECK(ids[0] == cls && ids[n - 1] == sep && types[0] == 0 && types[n - 1] == pair, "the ends");
        int64_t seps = 0;
        for (int64_t i = 0; i < n; i++) {
            FUZZ_CHECK(ids[i] >= 0 && ids[i] < info.vocab_size, "id %d out of the vocab", ids[i]);
            FUZZ_CHECK(types[i] == 0 || types[i] == 1, "type id %d", types[i]);
            if (i > 0) FUZZ_CHECK(types[i] >= types[i - 1], "type ids not 0 then 1");
            if (i > 0 && types[i] != types[i - 1]) FUZZ_CHECK(ids[i - 1] == sep, "no [SEP] before the pair");
            seps += ids[i] == sep;
        }
        FUZZ_CHECK(seps >= (pair ? 2 : 1), "%lld [SEP]", (long long)seps);
    }
    free(ids);
    free(types);
    qkv_tokenizer_free(tok);
}

static void fuzz_vocab(const uint8_t *data, size_t size) {
    qkv_tokenizer *tok = (qkv_tokenizer *)&tok;
    char why[256] = "";
    qkv_status s = qkv_tokenizer_from_vocab(size ? data : NULL, size, NULL, &tok, why, sizeof why);
    if (s != QKV_OK) {
        FUZZ_CHECK(s == QKV_ERR_FORMAT || s == QKV_ERR_SIZE_OVERFLOW || s == QKV_ERR_OUT_OF_MEMORY,
                   "vocab: status %d", (int)s);
        FUZZ_CHECK(tok == NULL && why[0] != '\0', "vocab: failure without a reason or with a tokenizer");
        return;
    }
    qkv_tokenizer_info info;
    qkv_tokenizer_get_info(tok, &info);
    for (int32_t id = 0; id < info.vocab_size; id++) {
        size_t len = 0;
        const char *t = qkv_tokenizer_token(tok, id, &len);
        FUZZ_CHECK(t && strlen(t) == len, "token %d", id);
        FUZZ_CHECK(qkv_tokenizer_token_id(tok, t, len) == id, "token %d does not find itself", id);
    }
    int32_t ids[64];
    int64_t n = 0;
    s = qkv_tokenizer_encode(tok, "Hello, [MASK] w\xC3\xB6rld!", 20, "x", 1, 0, ids, NULL, 64, &n, why, sizeof why);
    FUZZ_CHECK(s == QKV_OK && n >= 5, "fixed text: status %d (%s)", (int)s, why);
    qkv_tokenizer_free(tok);
}

static void fuzz_config(const uint8_t *data, size_t size) {
    char dir[96], path[160];
    snprintf(dir, sizeof dir, "/tmp/qkv_fuzz_tokenizer.%ld", (long)getpid());
    if (mkdir(dir, 0700) != 0) { /* may be left from a crash: reuse it */
        struct stat st;
        if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) return;
    }
    snprintf(path, sizeof path, "%s/vocab.txt", dir);
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fwrite(k_vocab, 1, sizeof k_vocab - 1, f);
    fclose(f);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    f = fopen(path, "wb");
    if (f) {
        int ok = fwrite(data, 1, size, f) == size;
        if (fclose(f) == 0 && ok) {
            qkv_tokenizer *tok = (qkv_tokenizer *)&tok;
            char why[256] = "";
            qkv_status s = qkv_tokenizer_load(dir, NULL, &tok, why, sizeof why);
            if (s == QKV_OK) {
                int32_t ids[64];
                int64_t n = 0;
                s = qkv_tokenizer_encode(tok, "Hello world", 11, NULL, 0, 0, ids, NULL, 64, &n, why, sizeof why);
                FUZZ_CHECK(s == QKV_OK && n >= 3, "config: encode status %d (%s)", (int)s, why);
                qkv_tokenizer_free(tok);
            } else {
                FUZZ_CHECK(s == QKV_ERR_FORMAT || s == QKV_ERR_UNSUPPORTED || s == QKV_ERR_OUT_OF_MEMORY,
                           "config: status %d (%s)", (int)s, why);
                FUZZ_CHECK(tok == NULL && why[0] != '\0', "config: failure without a reason");
            }
        }
        remove(path);
    }
    snprintf(path, sizeof path, "%s/vocab.txt", dir);
    remove(path);
    rmdir(dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_reader r = {data, size};
    int mode = fuzz_u8(&r) % 4;
    if (mode == 1)
        fuzz_vocab(r.p, r.n);
    else if (mode == 2)
        fuzz_config(r.p, r.n);
    else
        fuzz_encode(&r);
    FUZZ_CHECK(qkv_memory_in_use() == 0, "%zu bytes still allocated", qkv_memory_in_use());
    return 0;
}
