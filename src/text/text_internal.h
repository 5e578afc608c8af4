/* Internal pieces of the tokenizer (src/text): the vocabulary's hash table
 * and the error helper. Not installed. */
#ifndef QKV_TEXT_INTERNAL_H
#define QKV_TEXT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "qkv.h"
#include "text/unicode.h"

/* vocab.txt in memory: token i is the NUL-terminated pool + off[i], of
 * off[i + 1] - off[i] - 1 bytes. */
typedef struct qkv_vocab {
    char *pool;
    size_t *off;       /* count + 1 offsets */
    int32_t *slots;    /* hash table: id + 1, 0 = empty; mask + 1 slots */
    size_t mask;
    int32_t count;
    size_t max_bytes;  /* the longest token, in bytes */
} qkv_vocab;

/* Build from the bytes of a vocab file (name: for messages). Refuses an
 * empty file, invalid UTF-8, NUL or CR in a line, and duplicate tokens. */
qkv_status qkv_vocab_build(qkv_vocab *v, const unsigned char *bytes, size_t len, const char *name,
                           char *why, size_t why_len);
/* The id of the token s[0 .. len), or -1. */
int32_t qkv_vocab_find(const qkv_vocab *v, const void *s, size_t len);
void qkv_vocab_free(qkv_vocab *v);

#endif
