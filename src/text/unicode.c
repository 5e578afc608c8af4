/* Lookups in the generated Unicode tables (bisection over sorted runs),
 * and Hangul syllables by their algorithm (strict UTF-8 is io/utf8.c). */
#include "text/unicode.h"

/* The index of the last run whose start is <= cp (starts[0] is 0). */
static size_t run_of(const uint32_t *starts, size_t n, uint32_t cp) {
    size_t lo = 0, hi = n; /* starts[lo] <= cp < starts[hi] (hi = n: none) */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (starts[mid] <= cp)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

unsigned qkv_uc_flags(uint32_t cp) {
    return qkv_uc_flag_value[run_of(qkv_uc_flag_start, qkv_uc_flag_runs, cp)];
}

unsigned qkv_uc_ccc(uint32_t cp) {
    return qkv_uc_ccc_value[run_of(qkv_uc_ccc_start, qkv_uc_ccc_runs, cp)];
}

int qkv_uc_is_cjk(uint32_t cp) {
    return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) ||
           (cp >= 0x20000 && cp <= 0x2A6DF) || (cp >= 0x2A700 && cp <= 0x2B73F) ||
           (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B820 && cp <= 0x2CEAF) ||
           (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

int qkv_uc_lower(uint32_t cp, uint32_t out[2]) {
    if (cp == 0x130) { /* LATIN CAPITAL LETTER I WITH DOT ABOVE: i + U+0307 */
        out[0] = 0x69;
        out[1] = 0x307;
        return 2;
    }
    out[0] = cp;
    if (qkv_uc_lower_runs == 0 || cp < qkv_uc_lower_start[0]) return 1;
    size_t r = run_of(qkv_uc_lower_start, qkv_uc_lower_runs, cp);
    if (cp <= qkv_uc_lower_end[r] && (cp - qkv_uc_lower_start[r]) % qkv_uc_lower_stride[r] == 0)
        out[0] = (uint32_t)((int64_t)cp + qkv_uc_lower_delta[r]);
    return 1;
}

/* Hangul syllables (Unicode 3.12). */
#define H_SBASE 0xAC00u
#define H_LBASE 0x1100u
#define H_VBASE 0x1161u
#define H_TBASE 0x11A7u
#define H_LCOUNT 19u
#define H_VCOUNT 21u
#define H_TCOUNT 28u
#define H_NCOUNT (H_VCOUNT * H_TCOUNT)
#define H_SCOUNT (H_LCOUNT * H_NCOUNT)

int qkv_uc_decompose(uint32_t cp, uint32_t out[QKV_UC_MAX_DECOMP]) {
    if (cp >= H_SBASE && cp < H_SBASE + H_SCOUNT) {
        uint32_t s = cp - H_SBASE;
        out[0] = H_LBASE + s / H_NCOUNT;
        out[1] = H_VBASE + (s % H_NCOUNT) / H_TCOUNT;
        if (s % H_TCOUNT == 0) return 2;
        out[2] = H_TBASE + s % H_TCOUNT;
        return 3;
    }
    size_t lo = 0, hi = qkv_uc_decomp_count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (qkv_uc_decomp_cp[mid] < cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < qkv_uc_decomp_count && qkv_uc_decomp_cp[lo] == cp) {
        uint32_t a = qkv_uc_decomp_off[lo], b = qkv_uc_decomp_off[lo + 1];
        for (uint32_t i = a; i < b; i++) out[i - a] = qkv_uc_decomp_pool[i];
        return (int)(b - a);
    }
    out[0] = cp;
    return 1;
}

uint32_t qkv_uc_compose(uint32_t a, uint32_t b) {
    if (a >= H_LBASE && a < H_LBASE + H_LCOUNT && b >= H_VBASE && b < H_VBASE + H_VCOUNT)
        return H_SBASE + ((a - H_LBASE) * H_VCOUNT + (b - H_VBASE)) * H_TCOUNT;
    if (a >= H_SBASE && a < H_SBASE + H_SCOUNT && (a - H_SBASE) % H_TCOUNT == 0 && b > H_TBASE &&
        b < H_TBASE + H_TCOUNT)
        return a + (b - H_TBASE);
    size_t lo = 0, hi = qkv_uc_compose_count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        uint32_t f = qkv_uc_compose_first[mid], s = qkv_uc_compose_second[mid];
        if (f < a || (f == a && s < b))
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < qkv_uc_compose_count && qkv_uc_compose_first[lo] == a && qkv_uc_compose_second[lo] == b)
        return qkv_uc_compose_to[lo];
    return 0;
}
