/* A strict, non-allocating JSON tokenizer (RFC 8259) for the headers of file
 * formats: the caller walks the grammar it expects with these calls, so no
 * document tree is built and nothing recurses (a nesting bomb cannot
 * overflow the stack). Untrusted input: every read is bounds-checked, strings
 * are checked to be valid UTF-8 (raw and after \u escapes, surrogate pairs
 * included) and numbers follow the JSON grammar exactly. Not installed. */
#ifndef QKV_IO_JSON_H
#define QKV_IO_JSON_H

#include <stddef.h>
#include <stdint.h>

typedef struct qkv_json {
    const unsigned char *begin, *p, *end;  /* text, cursor, one past the end */
    const char *err;                       /* first error (static text) or NULL */
    size_t err_pos;                        /* its byte offset in the text */
} qkv_json;

void qkv_json_init(qkv_json *j, const void *text, size_t len);

/* Record an error at the cursor (the first one wins); returns 0. */
int qkv_json_fail(qkv_json *j, const char *msg);

/* Skip whitespace and return the next byte without consuming it, or -1 at
 * the end of the text. */
int qkv_json_peek(qkv_json *j);

/* Skip whitespace and consume the byte c; on mismatch record `msg` and
 * return 0. */
int qkv_json_expect(qkv_json *j, char c, const char *msg);

/* Skip whitespace; true when nothing else is left. */
int qkv_json_at_end(qkv_json *j);

/* The string at the cursor (after whitespace). measure: validate it and set
 * *len to its decoded length in bytes, without consuming it. read: validate,
 * decode into buf (cap >= *len + 1 after a measure; a shorter buffer gets
 * the first cap - 1 bytes), NUL-terminate, set *len and consume it. The
 * decoded text may contain NUL bytes (from \u0000); *has_nul tells (may be
 * NULL). Both return 0 and record the error on malformed input. */
int qkv_json_string_measure(qkv_json *j, size_t *len);
int qkv_json_string_read(qkv_json *j, char *buf, size_t cap, size_t *len, int *has_nul);

/* A JSON number meant to be a non-negative integer. The whole number is
 * consumed whenever it is grammatical, so the caller can report which rule
 * it broke. */
typedef enum qkv_json_uint_kind {
    QKV_JSON_UINT_OK = 0,
    QKV_JSON_UINT_NEGATIVE,    /* "-3" */
    QKV_JSON_UINT_FRACTION,    /* "1.5", "1e3": a fraction or exponent part */
    QKV_JSON_UINT_TOO_LARGE,   /* more than UINT64_MAX */
    QKV_JSON_UINT_SYNTAX       /* not a JSON number (error recorded) */
} qkv_json_uint_kind;

qkv_json_uint_kind qkv_json_uint(qkv_json *j, uint64_t *value);

/* Skip one value of any kind at the cursor (after whitespace), checking
 * its grammar as the calls above do; containers are walked with a bounded
 * stack (deeper than 64 levels is an error). 0 with the error recorded. */
int qkv_json_skip(qkv_json *j);

#endif
