/* The int8 matmul's contract (internal): a linear layer y = x W^T + b with
 * the weights quantised once per output channel (int8, symmetric) and the
 * activations quantised per row at run time (symmetric int8 carried as
 * unsigned, q + 128, the operand order of the u8 x s8 dot-product
 * instructions: AVX512-VNNI vpdpbusd), products summed exactly in int32.
 * The framework (src/gemm/i8.c) packs the weights, quantises the rows and
 * splits the tiles among threads; a kernel quantises one row or computes
 * one tile. Every sum is exact, so every ISA gives the same bits (the
 * dequantisation is the same float operations in the same order).
 *
 * Layouts, for K padded to kp (a multiple of QKV_I8_KSTEP) with zeros:
 *   a row      a[t] = q_t + 128, t < kp (128 past K: a zero)
 *   W panels   bp[(t / 4) * QKV_I8_NR * 4 + j * 4 + t % 4] = Wq[j0 + j][t]
 *              for j < QKV_I8_NR (0 past the last output channel)
 *   wsum[j]    sum over t of Wq[j][t], so that sum (q + 128) w = acc and
 *              sum q w = acc - 128 wsum */
#ifndef QKV_KERNELS_I8_H
#define QKV_KERNELS_I8_H

#include <stddef.h>
#include <stdint.h>

#define QKV_I8_NR 32 /* output channels per packed panel, the same for every ISA */
#define QKV_I8_KSTEP 64 /* kp's multiple: one AMX tile step (zeros cost no bits) */
#define QKV_I8_MAX_K 65536 /* 255 * 127 * K stays inside int32 */

/* A row's outliers: the values above QKV_I8_OUTLIER times the mean |x| of
 * the row (the first QKV_I8_MAX_OUT of them, in index order) stay float
 * and are added by the tile as exact products with the int8 weights; the
 * row's scale comes from the rest. BERT's hidden states carry a few such
 * channels (10 to 40 times the typical value), which would otherwise leave
 * the other values a handful of levels. */
#define QKV_I8_OUTLIER 6.0f
#define QKV_I8_MAX_OUT 8

typedef struct qkv_i8_kernels {
    const char *name;
    int native; /* 1: dot-product instructions (VNNI) */
    int mr;     /* rows per tile */
    /* With T = QKV_I8_OUTLIER * (sum |x[t]|) / k (the sum in float as 16
     * lane sums over t mod 16, each in order of t, then added in lane
     * order: a vector's order, the same on every ISA), the outliers are the
     * first QKV_I8_MAX_OUT t (increasing) with |x[t]| > T: their indices
     * and values go to oidx, oval, their count to *nout. With m = the
     * largest |x[t]| of the other t (NaN counts as 0): s = m / 127 (0 when
     * m = 0) and a[t] = clamp(rint(x[t] * (127 / m)), -127, 127) + 128 (an
     * outlier, and t >= k: 128, a zero; NaN: -127). Returns s. */
    float (*quant_row)(const float *x, size_t k, size_t kp, uint8_t *a, int32_t *oidx, float *oval, int *nout);
    /* For i < m (1..mr), j < n (1..QKV_I8_NR): acc = sum_{t < kp} a[i*lda
     * + t] bp[...] (exact), then v = (float)(acc - 128 wsum[j]) * sa[i];
     * for o < nout[i] (the row's outliers, increasing column): v = v +
     * oval[i*QKV_I8_MAX_OUT + o] * (float)Wq[j][oidx[i*QKV_I8_MAX_OUT + o]]
     * (the int8 weight read from the panel); c[i*ldc + j] = v * sw[j] +
     * bias[j] (bias NULL: no addition); each operation rounded once, in this
     * order. Nothing outside the m x n tile is written; rows m .. mr - 1 of
     * a may be read (the framework fills them with zeros, 128), their
     * results are not stored. */
    void (*tile)(size_t kp, const uint8_t *a, size_t lda, const int8_t *bp, const int32_t *wsum, const float *sa,
                 const float *sw, const float *bias, float *c, size_t ldc, int m, int n, const int *nout,
                 const int32_t *oidx, const float *oval);
    /* Tile kernels (NULL elsewhere): each thread calls begin before its
     * first tile of a product and end after its last. */
    void (*begin)(void);
    void (*end)(void);
    /* The table for products of fewer than mr rows (NULL: this one): a
     * tile kernel's fixed rows cost more than they give there. Sums are
     * exact, so either gives the same bits. */
    const struct qkv_i8_kernels *few;
} qkv_i8_kernels;

void qkv_i8_init_generic(qkv_i8_kernels *k);
void qkv_i8_init_avx512vnni(qkv_i8_kernels *k);
/* AMX-INT8 (kernels/amx/i8.c): the VNNI table's quant_row, a 32 x 32 tile
 * of tdpbusd; only where qkv_cpu_has_amx_int8. */
void qkv_i8_init_amx(qkv_i8_kernels *k);

#endif
