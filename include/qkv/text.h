/*
 * qkv/text.h - the WordPiece tokenizer of BERT-family models.
 *
 * qkv_tokenizer turns UTF-8 text into the token ids a BERT encoder reads,
 * exactly as Hugging Face's BertTokenizer does (transformers' Python
 * tokenizer, which BertTokenizerFast agrees with except where noted):
 *
 *   1. Special tokens written in the text ([CLS], [SEP], [MASK], [PAD],
 *      [UNK], or the names tokenizer_config.json gives them) are kept whole,
 *      case-sensitively; the rest of the text is cut around them.
 *   2. Uncased models lower-case the other characters one at a time (as
 *      Python's str.lower() maps a single character).
 *   3. Cleaning: NUL, U+FFFD and every character of category C* (control,
 *      format, private use, unassigned) but tab, newline and carriage
 *      return are removed; those three and every Zs space become ' '.
 *   4. CJK ideographs get a space on each side (one token each).
 *   5. NFC, then the text is split on white space (Python's str.split()).
 *   6. Each piece that is not a special token's name: lower-cased again
 *      (uncased), accents stripped (NFD, then Mn marks dropped) when
 *      strip_accents says so, then split around each punctuation character
 *      (ASCII 33-47, 58-64, 91-96, 123-126 and every Unicode P* category).
 *   7. WordPiece: greedy longest match first, continuations prefixed by
 *      "##"; a word of more than 100 characters, or one that cannot be
 *      covered, is [UNK].
 *   8. [CLS] A [SEP] (B [SEP]), truncated to a maximum length.
 *
 * Character properties come from the Unicode version of the Python that
 * generated src/text/unicode_tables.c (qkv_tokenizer_unicode_version()).
 *
 * Invalid UTF-8 (overlong forms, surrogates, code points past U+10FFFF, a
 * truncated sequence, a stray continuation byte) is refused, never
 * replaced: the call returns QKV_ERR_FORMAT and its `why` text names the
 * byte offset. (Replacing it with U+FFFD would silently delete it, since
 * cleaning removes U+FFFD.)
 *
 * A tokenizer is read-only once loaded: any number of threads may encode
 * with one tokenizer at once.
 */
#ifndef QKV_TEXT_H
#define QKV_TEXT_H

#include <stddef.h>
#include <stdint.h>

#include "qkv/core.h" /* qkv_status, QKV_API */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct qkv_tokenizer qkv_tokenizer; /* opaque; see qkv_tokenizer_load */

/* A setting taken from tokenizer_config.json (or its default when the file
 * or the field is absent), or given explicitly. */
#define QKV_TOKENIZER_FROM_CONFIG (-1)

typedef struct qkv_tokenizer_options {
    /* 1: lower-case (uncased model); 0: keep case; QKV_TOKENIZER_FROM_CONFIG:
     * do_lower_case of tokenizer_config.json, true when absent. */
    int lowercase;
    /* 1: strip accents; 0: keep them; QKV_TOKENIZER_FROM_CONFIG:
     * strip_accents of tokenizer_config.json; when that is null or absent,
     * accents are stripped exactly when lower-casing (BertTokenizer's
     * strip_accents=None). */
    int strip_accents;
} qkv_tokenizer_options;

/* The settings a tokenizer resolved at load. */
typedef struct qkv_tokenizer_info {
    int64_t vocab_size;       /* tokens in vocab.txt (ids 0 .. vocab_size - 1) */
    int lowercase;            /* 0 or 1 */
    int strip_accents;        /* 0 or 1 */
    int chinese_chars;        /* CJK ideographs split (tokenize_chinese_chars) */
    int64_t model_max_length; /* tokenizer_config.json's model_max_length; 0 if absent
                                 or not an integer below 2^31 */
} qkv_tokenizer_info;

/* The special tokens. */
typedef enum qkv_special_token {
    QKV_TOKEN_UNK = 0,
    QKV_TOKEN_SEP = 1,
    QKV_TOKEN_PAD = 2,
    QKV_TOKEN_CLS = 3,
    QKV_TOKEN_MASK = 4
} qkv_special_token;

/* Load a tokenizer. path is a model directory holding vocab.txt (and,
 * optionally, tokenizer_config.json: do_lower_case, strip_accents,
 * tokenize_chinese_chars, model_max_length, the special tokens' names,
 * tokenizer_class), or the path of a vocab file itself (then no config is
 * read). opt may be NULL (every setting from the config).
 *
 * vocab.txt: UTF-8, one token per line, id = line number (from 0); the last
 * line may lack its newline. A line may be empty (a token no text matches).
 * The five special tokens [UNK] [SEP] [PAD] [CLS] [MASK] (or the names
 * tokenizer_config.json gives them) must all be in it.
 *
 * On success *out owns the tokenizer (free it with qkv_tokenizer_free).
 * Errors (*out = NULL, why = a sentence naming the file and the line or
 * field, when why is not NULL and why_len > 0):
 *   QKV_ERR_NULL_POINTER  path or out is NULL
 *   QKV_ERR_IO            a file cannot be opened or read
 *   QKV_ERR_FORMAT        empty vocab, a duplicate token, a line with a NUL
 *                         or carriage return or invalid UTF-8, a missing
 *                         special token, malformed tokenizer_config.json
 *   QKV_ERR_UNSUPPORTED   a tokenizer_config.json field asks for something
 *                         this tokenizer does not do (another tokenizer_class,
 *                         do_basic_tokenize false, a never_split list)
 *   QKV_ERR_BAD_ENUM      an option not in {-1, 0, 1}
 *   QKV_ERR_SIZE_OVERFLOW a vocab of 2^31 tokens or more
 *   QKV_ERR_OUT_OF_MEMORY, QKV_ERR_MEMORY_LIMIT */
QKV_API qkv_status qkv_tokenizer_load(const char *path, const qkv_tokenizer_options *opt, qkv_tokenizer **out,
                              char *why, size_t why_len);

/* The same from a vocab held in memory (the bytes of a vocab.txt; no
 * config: the options' QKV_TOKENIZER_FROM_CONFIG values take the defaults).
 * The bytes are copied: the caller keeps ownership. vocab may be NULL when
 * len is 0 (then QKV_ERR_FORMAT: an empty vocab). Errors as
 * qkv_tokenizer_load, without QKV_ERR_IO. */
QKV_API qkv_status qkv_tokenizer_from_vocab(const void *vocab, size_t len, const qkv_tokenizer_options *opt,
                                    qkv_tokenizer **out, char *why, size_t why_len);

/* Free a tokenizer; NULL is a no-op. */
QKV_API void qkv_tokenizer_free(qkv_tokenizer *tok);

/* Tokenize text (len bytes of UTF-8; may hold NUL bytes, which cleaning
 * removes; text may be NULL when len is 0) and, when pair is not NULL, the
 * second sentence pair (pair_len bytes), into
 *     [CLS] A [SEP]            type ids 0 ... 0
 *     [CLS] A [SEP] B [SEP]    type ids 0 ... 0 1 ... 1
 * max_len > 0 truncates to at most max_len ids as BertTokenizer's
 * truncation=True, max_length=max_len does: a single sentence loses its last
 * tokens; a pair loses tokens from the end of the longer sentence until both
 * are as long, then from both (longest_first; when an odd count is left the
 * first sentence keeps the extra token, as BertTokenizer does;
 * BertTokenizerFast gives it to the longer one). max_len = 0: no truncation.
 *
 * *count is set to the number of ids (whenever the text is valid); ids and
 * type_ids (may be NULL: not wanted) receive them when capacity >= *count.
 * Call with capacity 0 (ids may then be NULL) to learn the count.
 *
 * Errors (nothing written to ids / type_ids; why as in qkv_tokenizer_load):
 *   QKV_ERR_NULL_POINTER  tok or count NULL, text NULL with len > 0 (pair:
 *                         the same), ids NULL with capacity > 0
 *   QKV_ERR_FORMAT        invalid UTF-8 (why names the sentence and byte offset)
 *   QKV_ERR_BAD_SIZE      max_len < 0, or 0 < max_len < 2 (3 for a pair: the
 *                         special tokens alone do not fit), capacity < 0, or
 *                         capacity < *count (then *count is the size needed)
 *   QKV_ERR_SIZE_OVERFLOW more than 2^31 - 1 ids
 *   QKV_ERR_OUT_OF_MEMORY, QKV_ERR_MEMORY_LIMIT */
QKV_API qkv_status qkv_tokenizer_encode(const qkv_tokenizer *tok, const char *text, size_t len, const char *pair,
                                size_t pair_len, int64_t max_len, int32_t *ids, int32_t *type_ids,
                                int64_t capacity, int64_t *count, char *why, size_t why_len);

/* The resolved settings (info may not be NULL; tok NULL gives all zeros). */
QKV_API void qkv_tokenizer_get_info(const qkv_tokenizer *tok, qkv_tokenizer_info *info);

/* The token (word piece) of an id, NUL-terminated, owned by the tokenizer
 * and valid until it is freed; *len (may be NULL) gets its length in bytes.
 * NULL when tok is NULL or id is not in [0, vocab_size). */
QKV_API const char *qkv_tokenizer_token(const qkv_tokenizer *tok, int32_t id, size_t *len);

/* The id of a token (len bytes, exact match, continuations with their
 * "##"), or -1 when it is not in the vocab (or tok / token is NULL). */
QKV_API int32_t qkv_tokenizer_token_id(const qkv_tokenizer *tok, const char *token, size_t len);

/* The id of a special token, or -1 when tok is NULL or which is out of
 * range. */
QKV_API int32_t qkv_tokenizer_special_id(const qkv_tokenizer *tok, qkv_special_token which);

/* The Unicode version of the character tables, e.g. "14.0.0". Never fails. */
QKV_API const char *qkv_tokenizer_unicode_version(void);

#ifdef __cplusplus
}
#endif

#endif
