/* The WordPiece vocabulary: vocab.txt's lines (id = line number) in one
 * pool, found by an open-addressing hash table (FNV-1a, linear probing,
 * at most half full). */
#include <stdio.h>
#include <string.h>

#include "core/internal.h"
#include "text/text_internal.h"

static uint64_t fnv1a(const unsigned char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325u;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 0x100000001b3u;
    }
    return h;
}

void qkv_vocab_free(qkv_vocab *v) {
    qkv_free(v->pool);
    qkv_free(v->off);
    qkv_free(v->slots);
    memset(v, 0, sizeof *v);
}

int32_t qkv_vocab_find(const qkv_vocab *v, const void *token, size_t len) {
    if (!v->slots) return -1;
    const unsigned char *t = token;
    size_t i = (size_t)fnv1a(t, len) & v->mask;
    for (;;) {
        int32_t s = v->slots[i];
        if (s == 0) return -1;
        int32_t id = s - 1;
        size_t a = v->off[id], b = v->off[id + 1] - 1; /* minus the NUL */
        if (b - a == len && memcmp(v->pool + a, t, len) == 0) return id;
        i = (i + 1) & v->mask;
    }
}

qkv_status qkv_vocab_build(qkv_vocab *v, const unsigned char *bytes, size_t len, const char *name,
                           char *why, size_t why_len) {
    memset(v, 0, sizeof *v);
    if (len == 0) return qkv_fail(why, why_len, QKV_ERR_FORMAT, "%s is empty", name);
    /* Lines as Python reads them: a last line without '\n' still counts. */
    size_t lines = 0;
    for (size_t i = 0; i < len; i++) lines += bytes[i] == '\n';
    if (bytes[len - 1] != '\n') lines++;
    if (lines > (size_t)INT32_MAX - 1)
        return qkv_fail(why, why_len, QKV_ERR_SIZE_OVERFLOW, "%s has %zu lines (at most %d)", name,
                             lines, INT32_MAX - 1);
    /* Validate every line: UTF-8, no NUL, no carriage return. */
    size_t line = 1, line_start = 0;
    for (size_t i = 0; i < len;) {
        unsigned char c = bytes[i];
        if (c == '\n') {
            line++;
            line_start = ++i;
            continue;
        }
        if (c == 0 || c == '\r')
            return qkv_fail(why, why_len, QKV_ERR_FORMAT, "%s line %zu: %s at byte %zu of the line", name,
                                 line, c ? "a carriage return (CRLF line ends?)" : "a NUL byte", i - line_start);
        uint32_t cp;
        size_t n = qkv_utf8_decode(bytes + i, len - i, &cp);
        if (n == 0)
            return qkv_fail(why, why_len, QKV_ERR_FORMAT, "%s line %zu: invalid UTF-8 at byte %zu of the line",
                                 name, line, i - line_start);
        i += n;
    }
    size_t cap = 16;
    while (cap < 2 * lines) cap *= 2;
    v->count = (int32_t)lines;
    v->pool = qkv_alloc(len + 1);
    v->off = qkv_alloc((lines + 1) * sizeof *v->off);
    v->slots = qkv_alloc_zeroed(cap * sizeof *v->slots);
    if (!v->pool || !v->off || !v->slots) {
        qkv_vocab_free(v);
        return qkv_fail(why, why_len, qkv_alloc_failure_status(), "no memory for %s (%zu tokens)", name,
                             lines);
    }
    v->mask = cap - 1;
    memcpy(v->pool, bytes, len);
    v->pool[len] = '\0';
    size_t id = 0, start = 0;
    for (size_t i = 0; i <= len && id < lines; i++) {
        if (i < len && bytes[i] != '\n') continue;
        v->pool[i] = '\0';
        v->off[id] = start;
        size_t tl = i - start;
        if (tl > v->max_bytes) v->max_bytes = tl;
        size_t h = (size_t)fnv1a(bytes + start, tl) & v->mask;
        while (v->slots[h] != 0) {
            int32_t other = v->slots[h] - 1;
            size_t a = v->off[other];
            if (strlen(v->pool + a) == tl && memcmp(v->pool + a, bytes + start, tl) == 0) {
                qkv_status s = qkv_fail(why, why_len, QKV_ERR_FORMAT,
                                             "%s line %zu duplicates line %d (token \"%.*s\")", name, id + 1,
                                             other + 1, (int)(tl < 64 ? tl : 64), (const char *)bytes + start);
                qkv_vocab_free(v);
                return s;
            }
            h = (h + 1) & v->mask;
        }
        v->slots[h] = (int32_t)id + 1;
        id++;
        start = i + 1;
    }
    /* off[lines] - 1 is where the last token's NUL is: with a final '\n'
     * that is len - 1 (the '\n' made NUL), else len. */
    v->off[lines] = (bytes[len - 1] == '\n' ? len - 1 : len) + 1;
    return QKV_OK;
}
