/* The strict JSON tokenizer of json.h. Each function looks at most at
 * j->end - 1; an error stops at the first bad byte and records where. */
#include <string.h>

#include "io/json.h"
#include "io/utf8.h"

void qkv_json_init(qkv_json *j, const void *text, size_t len) {
    j->begin = j->p = (const unsigned char *)text;
    j->end = j->begin + len;
    j->err = NULL;
    j->err_pos = 0;
}

static int fail_at(qkv_json *j, const unsigned char *at, const char *msg) {
    if (!j->err) {
        j->err = msg;
        j->err_pos = (size_t)(at - j->begin);
    }
    return 0;
}

int qkv_json_fail(qkv_json *j, const char *msg) { return fail_at(j, j->p, msg); }

static void skip_ws(qkv_json *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
        j->p++;
}

int qkv_json_peek(qkv_json *j) {
    skip_ws(j);
    return j->p < j->end ? *j->p : -1;
}

int qkv_json_expect(qkv_json *j, char c, const char *msg) {
    if (qkv_json_peek(j) != (unsigned char)c) return qkv_json_fail(j, msg);
    j->p++;
    return 1;
}

int qkv_json_at_end(qkv_json *j) {
    skip_ws(j);
    return j->p == j->end;
}

static int hex4(const unsigned char *p, unsigned *v) {
    unsigned r = 0;
    for (int i = 0; i < 4; i++) {
        unsigned c = p[i], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return 0;
        r = r * 16 + d;
    }
    *v = r;
    return 1;
}

/* Bytes written so far (*len) grow by n; the first cap - 1 are kept. */
static void emit(char *buf, size_t cap, size_t *len, const unsigned char *src, size_t n) {
    for (size_t i = 0; i < n; i++, (*len)++)
        if (buf && *len + 1 < cap) buf[*len] = (char)src[i];
}

/* Validate (and decode into buf when given) the string at the cursor.
 * *after is set past the closing quote. */
static int scan_string(qkv_json *j, char *buf, size_t cap, size_t *len, int *has_nul,
                       const unsigned char **after) {
    if (qkv_json_peek(j) != '"') return qkv_json_fail(j, "expected a string");
    const unsigned char *p = j->p + 1, *end = j->end;
    size_t n = 0;
    int nul = 0;
    for (;;) {
        if (p >= end) return fail_at(j, j->p, "unterminated string");
        unsigned c = *p;
        if (c == '"') break;
        if (c < 0x20) return fail_at(j, p, "control character in a string");
        if (c == '\\') {
            if (end - p < 2) return fail_at(j, j->p, "unterminated string");
            unsigned char e = p[1], out[4];
            switch (e) {
            case '"': case '\\': case '/': out[0] = e; break;
            case 'b': out[0] = '\b'; break;
            case 'f': out[0] = '\f'; break;
            case 'n': out[0] = '\n'; break;
            case 'r': out[0] = '\r'; break;
            case 't': out[0] = '\t'; break;
            case 'u': {
                unsigned cp, lo;
                if (end - p < 6 || !hex4(p + 2, &cp)) return fail_at(j, p, "bad \\u escape");
                size_t used = 6;
                if (cp >= 0xDC00 && cp <= 0xDFFF) return fail_at(j, p, "lone low surrogate in \\u escape");
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    if (end - p < 12 || p[6] != '\\' || p[7] != 'u' || !hex4(p + 8, &lo) ||
                        lo < 0xDC00 || lo > 0xDFFF)
                        return fail_at(j, p, "high surrogate not followed by a low one");
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    used = 12;
                }
                if (cp == 0) nul = 1;
                emit(buf, cap, &n, out, qkv_utf8_encode(cp, out));
                p += used;
                continue;
            }
            default:
                return fail_at(j, p, "bad escape in a string");
            }
            emit(buf, cap, &n, out, 1);
            p += 2;
            continue;
        }
        if (c < 0x80) {
            emit(buf, cap, &n, p, 1);
            p++;
            continue;
        }
        uint32_t dec;
        size_t k = qkv_utf8_decode(p, (size_t)(end - p), &dec);
        if (!k) return fail_at(j, p, "invalid UTF-8 in a string");
        emit(buf, cap, &n, p, k);
        p += k;
    }
    if (buf && cap) buf[n < cap ? n : cap - 1] = '\0';
    *len = n;
    if (has_nul) *has_nul = nul;
    *after = p + 1;
    return 1;
}

int qkv_json_string_measure(qkv_json *j, size_t *len) {
    const unsigned char *after;
    return scan_string(j, NULL, 0, len, NULL, &after);
}

int qkv_json_string_read(qkv_json *j, char *buf, size_t cap, size_t *len, int *has_nul) {
    const unsigned char *after = NULL; /* set by a successful scan; gcc -O3 cannot see it */
    if (!scan_string(j, buf, cap, len, has_nul, &after)) return 0;
    j->p = after;
    return 1;
}

static int is_digit(const unsigned char *p, const unsigned char *end) {
    return p < end && *p >= '0' && *p <= '9';
}

qkv_json_uint_kind qkv_json_uint(qkv_json *j, uint64_t *value) {
    int c = qkv_json_peek(j);
    if (c != '-' && !(c >= '0' && c <= '9')) {
        qkv_json_fail(j, "expected a number");
        return QKV_JSON_UINT_SYNTAX;
    }
    const unsigned char *p = j->p, *end = j->end;
    int neg = 0, frac = 0, big = 0;
    uint64_t v = 0;
    if (*p == '-') { neg = 1; p++; }
    if (!is_digit(p, end)) {
        fail_at(j, p, "bad number");
        return QKV_JSON_UINT_SYNTAX;
    }
    if (*p == '0') {
        p++;
        if (is_digit(p, end)) {
            fail_at(j, p, "leading zero in a number");
            return QKV_JSON_UINT_SYNTAX;
        }
    } else {
        while (is_digit(p, end)) {
            unsigned d = (unsigned)(*p++ - '0');
            if (v > (UINT64_MAX - d) / 10) big = 1;
            else v = v * 10 + d;
        }
    }
    if (p < end && *p == '.') {
        p++;
        if (!is_digit(p, end)) {
            fail_at(j, p, "bad fraction in a number");
            return QKV_JSON_UINT_SYNTAX;
        }
        while (is_digit(p, end)) p++;
        frac = 1;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        if (!is_digit(p, end)) {
            fail_at(j, p, "bad exponent in a number");
            return QKV_JSON_UINT_SYNTAX;
        }
        while (is_digit(p, end)) p++;
        frac = 1;
    }
    j->p = p;
    *value = v;
    if (neg) return QKV_JSON_UINT_NEGATIVE;
    if (frac) return QKV_JSON_UINT_FRACTION;
    if (big) return QKV_JSON_UINT_TOO_LARGE;
    return QKV_JSON_UINT_OK;
}

/* A string, number or literal at the cursor (c, its first byte), consumed. */
static int skip_scalar(qkv_json *j, int c) {
    static const char *const words[3] = {"true", "false", "null"};
    size_t n;
    uint64_t v;
    if (c == '"') return qkv_json_string_read(j, NULL, 0, &n, NULL);
    if (c == '-' || (c >= '0' && c <= '9')) return qkv_json_uint(j, &v) != QKV_JSON_UINT_SYNTAX;
    for (int k = 0; k < 3; k++) {
        n = strlen(words[k]);
        if ((size_t)(j->end - j->p) >= n && memcmp(j->p, words[k], n) == 0) {
            j->p += n;
            return 1;
        }
    }
    return qkv_json_fail(j, "expected a value");
}

/* An object's key and its ':'. */
static int skip_key(qkv_json *j) {
    size_t n;
    if (qkv_json_peek(j) != '"') return qkv_json_fail(j, "expected a key");
    return qkv_json_string_read(j, NULL, 0, &n, NULL) && qkv_json_expect(j, ':', "expected ':'");
}

int qkv_json_skip(qkv_json *j) {
    char stack[64]; /* the open containers, '[' or '{' */
    int depth = 0;
    for (;;) {
        int c = qkv_json_peek(j);
        if (c == '[' || c == '{') {
            if (depth == (int)sizeof stack) return qkv_json_fail(j, "nesting deeper than 64 levels");
            j->p++;
            stack[depth++] = (char)c;
            if (qkv_json_peek(j) == (c == '[' ? ']' : '}')) {
                j->p++;
                depth--;
            } else {
                if (c == '{' && !skip_key(j)) return 0;
                continue;
            }
        } else if (!skip_scalar(j, c)) {
            return 0;
        }
        /* After a value: close containers, or a comma (and a key in an object). */
        for (;;) {
            if (depth == 0) return 1;
            char open = stack[depth - 1];
            if (qkv_json_peek(j) == (open == '[' ? ']' : '}')) {
                j->p++;
                depth--;
                continue;
            }
            if (!qkv_json_expect(j, ',', "expected ',' or the end of a container")) return 0;
            if (open == '{' && !skip_key(j)) return 0;
            break;
        }
    }
}
