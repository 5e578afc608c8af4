/* The packings of bf16 rows the fast forward and backward share
 * (attn/half.h), on the data-movement kernels of kernels/half.h. */
#include <string.h>

#include "attn/half.h"
#include "kernels/half.h"

static uint32_t pair(uint16_t lo, uint16_t hi) { return (uint32_t)lo | ((uint32_t)hi << 16); }

/* (The fast paths run on CPUs with bf16 dot products, all little-endian:
 * there a row's pairs are its bf16 in memory order.) */
void qkv_half_pairs_of_row(uint32_t *d, int64_t w, const uint16_t *row, int64_t D) {
    const int64_t full = D / 2;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(d, row, (size_t)full * sizeof *d);
#else
    for (int64_t t = 0; t < full; t++) d[t] = pair(row[2 * t], row[2 * t + 1]);
#endif
    int64_t t = full;
    if (D % 2) d[t++] = pair(row[D - 1], 0);
    if (t < w) memset(d + t, 0, (size_t)(w - t) * sizeof *d);
}

/* With D even (little-endian) a row's pairs are its words, and a panel is
 * the transpose of its 32 rows' words. */
void qkv_half_pack_panels(const qkv_half_kernels *HK, uint32_t *dst, int64_t w, const uint16_t *x, int64_t ld,
                          int64_t n, int64_t npad, int64_t D) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (D % 2 == 0 && ld % 2 == 0) {
        for (int64_t p0 = 0; p0 < npad; p0 += 32) {
            uint32_t *d = dst + (p0 / 32) * w * 32;
            const int64_t nr = n - p0 >= 32 ? 32 : n - p0 > 0 ? n - p0 : 0;
            if (nr < 32) memset(d, 0, (size_t)(w * 32) * sizeof *d);
            if (nr > 0) HK->words_t(d, 32, x + p0 * ld, (size_t)(ld / 2), (size_t)nr, (size_t)w);
        }
        return;
    }
#endif
    uint32_t tmp[32];
    for (int64_t r = 0; r < npad; r++) {
        uint32_t *d = dst + (r / 32) * w * 32 + r % 32;
        if (r >= n) {
            for (int64_t t = 0; t < w; t++) d[t * 32] = 0;
            continue;
        }
        const uint16_t *row = x + r * ld;
        for (int64_t t0 = 0; t0 < w; t0 += 32) { /* a row's pairs, 32 at a time, then spread */
            const int64_t cnt = w - t0 < 32 ? w - t0 : 32, d0 = 2 * t0, dn = D - d0 < 2 * cnt ? D - d0 : 2 * cnt;
            qkv_half_pairs_of_row(tmp, cnt, row + d0, dn > 0 ? dn : 0);
            for (int64_t t = 0; t < cnt; t++) d[(t0 + t) * 32] = tmp[t];
        }
    }
}

void qkv_half_pack_row_pairs(const qkv_half_kernels *HK, uint32_t *dst, int64_t ldw, const uint16_t *x,
                             int64_t ld, int64_t n, int64_t npad, int64_t D) {
    for (int64_t u = 0; u < npad / 2; u++) {
        uint32_t *d = dst + u * ldw;
        if (2 * u < n)
            HK->interleave(d, x + 2 * u * ld, 2 * u + 1 < n ? x + (2 * u + 1) * ld : NULL, (size_t)D);
        else
            memset(d, 0, (size_t)D * sizeof *d);
        if (ldw > D) memset(d + D, 0, (size_t)(ldw - D) * sizeof *d);
    }
}
