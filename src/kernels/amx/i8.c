/* AMX-INT8 matmul tile (contract: kernels/i8.h): 32 rows x 32 channels in
 * four tile registers of 16 x 16 int32; per step of 64 values of K, two A
 * tiles (16 rows x 64 activation bytes, row stride lda) and two B tiles
 * (16 quads of K x 16 channels: the left and right 64 bytes of the panel's
 * 128-byte rows) and four tdpbusd (u8 x s8, exact int32 sums, as
 * vpdpbusd), 32 x 32 x 64 products. kp is a multiple of 64
 * (QKV_I8_KSTEP), so every step is whole; rows m .. 31 of a are the
 * framework's zeros. The sums go through a buffer into the VNNI kernel's
 * dequantisation (avx512_i8_epi.h): the same bits. quant_row is the VNNI
 * table's, and so are products of fewer than 32 rows (`few`). */
#include <immintrin.h>
#include <stdint.h>

#include "kernels/amx/amx.h"
#include "kernels/avx512_i8_epi.h"
#include "kernels/i8.h"

#define MR 32

static void tile_amx(size_t kp, const uint8_t *a, size_t lda, const int8_t *bp, const int32_t *wsum, const float *sa,
                     const float *sw, const float *bias, float *c, size_t ldc, int m, int n, const int *nout,
                     const int32_t *oidx, const float *oval) {
    const long sa_ = (long)lda, sb = QKV_I8_NR * 4;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (size_t t = 0; t < kp; t += QKV_I8_KSTEP) {
        const int8_t *b = bp + (t / 4) * QKV_I8_NR * 4;
        _tile_loadd(4, a + t, sa_);
        _tile_loadd(5, a + 16 * lda + t, sa_);
        _tile_loadd(6, b, sb);
        _tile_loadd(7, b + 64, sb);
        _tile_dpbusd(0, 4, 6);
        _tile_dpbusd(1, 4, 7);
        _tile_dpbusd(2, 5, 6);
        _tile_dpbusd(3, 5, 7);
    }
    int32_t acc[MR * QKV_I8_NR] __attribute__((aligned(64)));
    _tile_stored(0, acc, QKV_I8_NR * 4);
    _tile_stored(1, acc + 16, QKV_I8_NR * 4);
    _tile_stored(2, acc + 16 * QKV_I8_NR, QKV_I8_NR * 4);
    _tile_stored(3, acc + 16 * QKV_I8_NR + 16, QKV_I8_NR * 4);
    const qkv_i8_epi e = qkv_i8_epi_make(wsum, sw, bias, n);
    for (int r = 0; r < m; r++)
        qkv_i8_epi_row(&e, _mm512_load_si512((const void *)(acc + r * QKV_I8_NR)),
                       _mm512_load_si512((const void *)(acc + r * QKV_I8_NR + 16)), sa[r], nout[r],
                       oidx + r * QKV_I8_MAX_OUT, oval + r * QKV_I8_MAX_OUT, bp, c + (size_t)r * ldc);
}

/* Fewer than 32 rows (a short sentence) run on the VNNI table; filled once,
 * with the table, under the kernel sets' pthread_once. */
static qkv_i8_kernels g_vnni;

void qkv_i8_init_amx(qkv_i8_kernels *k) {
    qkv_i8_init_avx512vnni(&g_vnni);
    qkv_i8_init_avx512vnni(k); /* its quant_row */
    k->few = &g_vnni;
    k->name = "amx-int8";
    k->mr = MR;
    k->tile = tile_amx;
    k->begin = qkv_amx_tiles_begin;
    k->end = qkv_amx_tiles_end;
}
