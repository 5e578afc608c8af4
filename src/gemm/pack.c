/* Packing for the matmul framework (layouts in gemm.h). Two shapes of copy
 * cover the four cases: a panel whose packed rows are contiguous in memory
 * (A transposed, B as is) is a row-by-row copy of the whole block; otherwise the panel is a
 * transpose of `w` contiguous source rows. Packing is O(M K + K N) against the
 * O(M N K) of the product; it is written so that the compiler vectorises the
 * copies (fixed panel widths are dispatched to constant-width loops); a
 * kernel table may bring its own SIMD transpose for whole panels. */
#include <string.h>

#include "gemm/gemm.h"

/* The copy case for a whole block of `width` columns at once: panel r gets
 * dst[r*W*kc + p*W + j] = src[p*ld + r*W + j] (0 past `width`). Row by row,
 * so each source row is read once, contiguously, across all the panels
 * (panel by panel, a panel's 14- or 32-float slices of rows far apart in
 * memory made this 2x slower). */
static void copy_block(const float *src, int64_t ld, int64_t kc, int64_t width, int W,
                       float *restrict dst) {
    int64_t full = width / W, rest = width % W;
    for (int64_t p = 0; p < kc; p++) {
        const float *s = src + p * ld;
        float *d = dst + p * W;
        for (int64_t r = 0; r < full; r++)
            memcpy(d + r * W * kc, s + r * W, (size_t)W * sizeof(float));
        if (rest) {
            float *dr = d + full * W * kc;
            const float *sr = s + full * W;
            int64_t j = 0;
            for (; j < rest; j++) dr[j] = sr[j];
            for (; j < W; j++) dr[j] = 0.0f;
        }
    }
}

/* dst[p*W + j] = src[j*ld + p] for j < w, 0 for w <= j < W; p < kc. Source
 * rows are read in blocks of 8 columns so each read stays in a few cache
 * lines while the W-wide packed rows are written whole. */
#define TRANSPOSE_FIXED(W)                                                        \
    static void transpose_##W(const float *src, int64_t ld, int64_t kc,           \
                              float *restrict dst) {                              \
        int64_t p = 0;                                                            \
        for (; p + 8 <= kc; p += 8)                                               \
            for (int j = 0; j < (W); j++) {                                       \
                const float *s = src + j * ld + p;                                \
                for (int q = 0; q < 8; q++) dst[(p + q) * (W) + j] = s[q];       \
            }                                                                     \
        for (; p < kc; p++)                                                       \
            for (int j = 0; j < (W); j++) dst[p * (W) + j] = src[j * ld + p];    \
    }
TRANSPOSE_FIXED(4)
TRANSPOSE_FIXED(6)
TRANSPOSE_FIXED(8)
TRANSPOSE_FIXED(12)
TRANSPOSE_FIXED(14)
TRANSPOSE_FIXED(16)
TRANSPOSE_FIXED(32)
#undef TRANSPOSE_FIXED

static void transpose_panel(const qkv_gemm_kernel *k, const float *src, int64_t ld, int64_t kc,
                            int w, int W, float *restrict dst) {
    if (w == W && k->pack_t) {
        k->pack_t(src, ld, kc, W, dst);
        return;
    }
    if (w == W) {
        switch (W) {
        case 4: transpose_4(src, ld, kc, dst); return;
        case 6: transpose_6(src, ld, kc, dst); return;
        case 8: transpose_8(src, ld, kc, dst); return;
        case 12: transpose_12(src, ld, kc, dst); return;
        case 14: transpose_14(src, ld, kc, dst); return;
        case 16: transpose_16(src, ld, kc, dst); return;
        case 32: transpose_32(src, ld, kc, dst); return;
        default: break;
        }
    }
    for (int64_t p = 0; p < kc; p++) {
        float *d = dst + p * W;
        int j = 0;
        for (; j < w; j++) d[j] = src[j * ld + p];
        for (; j < W; j++) d[j] = 0.0f;
    }
}

void qkv_gemm_pack_a(const qkv_gemm_kernel *k, int trans, const float *a, int64_t lda,
                     int64_t i0, int64_t p0, int64_t mc, int64_t kc, float *ap) {
    const int mr = k->mr;
    if (trans) {
        copy_block(a + p0 * lda + i0, lda, kc, mc, mr, ap);
        return;
    }
    for (int64_t i = 0; i < mc; i += mr) {
        int w = (int)(mc - i < mr ? mc - i : mr);
        transpose_panel(k, a + (i0 + i) * lda + p0, lda, kc, w, mr, ap + i * kc);
    }
}

void qkv_gemm_pack_b(const qkv_gemm_kernel *k, int trans, const float *b, int64_t ldb,
                     int64_t p0, int64_t j0, int64_t kc, int64_t nc, float *bp) {
    const int nr = k->nr;
    if (!trans) {
        copy_block(b + p0 * ldb + j0, ldb, kc, nc, nr, bp);
        return;
    }
    for (int64_t j = 0; j < nc; j += nr) {
        int w = (int)(nc - j < nr ? nc - j : nr);
        transpose_panel(k, b + (j0 + j) * ldb + p0, ldb, kc, w, nr, bp + j * kc);
    }
}
