/* Unicode data and algorithms of the WordPiece tokenizer: strict UTF-8
 * decoding, the character classes BertTokenizer tests, canonical
 * decomposition and composition (NFD, NFC) and the per-character lower
 * case of Python's str.lower(). The tables (unicode_tables.c) are generated
 * by gen_unicode.py from Python's unicodedata. Not installed. */
#ifndef QKV_TEXT_UNICODE_H
#define QKV_TEXT_UNICODE_H

#include <stddef.h>
#include <stdint.h>

#include "io/utf8.h" /* qkv_utf8_decode, qkv_utf8_encode */

/* Character flags (keep in step with gen_unicode.py). */
#define QKV_UC_CONTROL 1u   /* removed by cleaning: category C*, except \t \n \r */
#define QKV_UC_CLEAN_WS 2u  /* becomes ' ' in cleaning: \t \n \r ' ' or Zs */
#define QKV_UC_PUNCT 4u     /* punctuation: ASCII 33-47 58-64 91-96 123-126, or P* */
#define QKV_UC_MN 8u        /* nonspacing mark (Mn): dropped by accent stripping */
#define QKV_UC_SPLIT_WS 16u /* separator of str.split() (str.isspace()) */

/* The longest full canonical decomposition of one character. */
#define QKV_UC_MAX_DECOMP 4

extern const char qkv_unicode_version[];
extern const size_t qkv_uc_flag_runs;
extern const uint32_t qkv_uc_flag_start[];
extern const uint8_t qkv_uc_flag_value[];
extern const size_t qkv_uc_ccc_runs;
extern const uint32_t qkv_uc_ccc_start[];
extern const uint8_t qkv_uc_ccc_value[];
extern const size_t qkv_uc_decomp_count;
extern const uint32_t qkv_uc_decomp_cp[];
extern const uint32_t qkv_uc_decomp_off[];
extern const uint32_t qkv_uc_decomp_pool[];
extern const size_t qkv_uc_compose_count;
extern const uint32_t qkv_uc_compose_first[];
extern const uint32_t qkv_uc_compose_second[];
extern const uint32_t qkv_uc_compose_to[];
extern const size_t qkv_uc_lower_runs;
extern const uint32_t qkv_uc_lower_start[];
extern const uint32_t qkv_uc_lower_end[];
extern const int32_t qkv_uc_lower_delta[];
extern const uint8_t qkv_uc_lower_stride[];

/* The QKV_UC_* flags of a code point (cp < 0x110000). */
unsigned qkv_uc_flags(uint32_t cp);
/* The canonical combining class of a code point. */
unsigned qkv_uc_ccc(uint32_t cp);
/* CJK ideograph in the sense of BertTokenizer (the CJK Unified Ideographs
 * blocks and extensions A-E, and the compatibility ideographs). */
int qkv_uc_is_cjk(uint32_t cp);
/* str.lower() of one character: writes 1 or 2 code points to out and
 * returns how many. */
int qkv_uc_lower(uint32_t cp, uint32_t out[2]);
/* The full canonical decomposition of one character (itself when it has
 * none), unordered marks as the data gives them: returns the count. */
int qkv_uc_decompose(uint32_t cp, uint32_t out[QKV_UC_MAX_DECOMP]);
/* The primary composite of a + b, or 0 when there is none. */
uint32_t qkv_uc_compose(uint32_t a, uint32_t b);


#endif
