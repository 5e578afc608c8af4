/* Strict UTF-8, decoding and encoding one character. Internal. */
#ifndef QKV_IO_UTF8_H
#define QKV_IO_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Strict UTF-8 (RFC 3629: no overlong forms, no surrogates, nothing past
 * U+10FFFF). Decodes the sequence at s[0 .. n) into *cp and returns its
 * length, or 0 when the bytes there are not a valid sequence. n >= 1. */
size_t qkv_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp);
/* Encodes cp (a valid scalar value) into out; returns 1 to 4. */
size_t qkv_utf8_encode(uint32_t cp, unsigned char out[4]);

#endif
