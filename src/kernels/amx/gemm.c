/* AMX-BF16 matmul micro-kernel (contract: the bf16 part of kernels/gemm.h).
 * A 32 x 32 tile of C lives in four tile registers of 16 x 16 floats; per
 * step of 32 values of K, two A tiles (16 rows x 16 pairs) and two B tiles
 * (16 pairs x 16 columns) are loaded and four tdpbf16ps do 32 x 32 x 32
 * multiply-adds, sixteen times the work of one vdpbf16ps step.
 *
 * Layouts: the B panels are the AVX512-BF16 table's (bp[t*32 + j]: a B
 * tile is 16 consecutive pair rows, the left or right 16 words of each,
 * row stride 128 bytes); the A panels hold each step's two tiles as
 * contiguous 1 KB blocks (a_rows: step s at ap + 512 s, rows of 16 pairs),
 * and kc2 is a multiple of 16 (kstep) with zero pairs past K, so every step
 * is a whole tile.
 *
 * The tiles start at zero and tdpbf16ps adds each pair's two exact products
 * in turn, rounding each addition, subnormals flushed (the contract's sum
 * within the float bound); the 32 x 32 result then goes straight to C when
 * the tile is whole and C = AB (alpha 1, beta 0, the usual first KC
 * block), else through a buffer into the contract's merge. Each thread
 * loads the tile configuration before its first tile (begin) and releases
 * the tiles after its last (end). */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels/amx/amx.h"
#include "kernels/avx512_common.h"
#include "kernels/gemm.h"

#define MR 32
#define NR 32
#define KSTEP 16 /* pairs per tile step: 32 values of K */

/* The palette-1 configuration: tiles 0-3 C (16 rows x 64 bytes), 4-5 A,
 * 6-7 B, all 16 x 64 bytes. A constant in memory: gcc's _tile_loadconfig is
 * an asm whose operand covers only a pointer's bytes, so stores to a local
 * configuration before it may be dropped. */
typedef struct {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

static const tile_config g_cfg __attribute__((aligned(64))) = {
    1, 0, {0}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};

/* Shared with the int8 kernel (amx/i8.c), whose tiles have the same shapes. */
void qkv_amx_tiles_begin(void) { _tile_loadconfig(&g_cfg); }

void qkv_amx_tiles_end(void) { _tile_release(); }

static void ukr_amx(int64_t kc2, const uint32_t *ap, const uint32_t *bp, float *c, int64_t ldc, float alpha,
                    float beta, int m, int n) {
    const long sa = KSTEP * 4, sb = NR * 4;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t t = 0; t < kc2; t += KSTEP) {
        _tile_loadd(4, ap + t * MR, sa);
        _tile_loadd(5, ap + t * MR + 16 * KSTEP, sa);
        _tile_loadd(6, bp + t * NR, sb);
        _tile_loadd(7, bp + t * NR + 16, sb);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    if (m == MR && n == NR && alpha == 1.0f && beta == 0.0f) { /* 1 * ab exactly, c not read */
        const long sc = (long)(ldc * 4);
        _tile_stored(0, c, sc);
        _tile_stored(1, c + 16, sc);
        _tile_stored(2, c + 16 * ldc, sc);
        _tile_stored(3, c + 16 * ldc + 16, sc);
        return;
    }
    float ab[MR * NR] __attribute__((aligned(64)));
    _tile_stored(0, ab, NR * 4);
    _tile_stored(1, ab + 16, NR * 4);
    _tile_stored(2, ab + 16 * NR, NR * 4);
    _tile_stored(3, ab + 16 * NR + 16, NR * 4);
    const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    const __mmask16 k0 = qkv_avx512_mask_lo(n), k1 = qkv_avx512_mask_hi(n);
    const int read_c = beta != 0.0f;
    for (int i = 0; i < m; i++)
        qkv_avx512_merge_row(c + i * ldc, _mm512_load_ps(ab + i * NR), _mm512_load_ps(ab + i * NR + 16), va, vb,
                             read_c, k0, k1);
}

static inline __mmask16 mask16(int64_t n) {
    return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u);
}

/* Row i's pairs t .. t + 15 at dst[t * MR + i * 16]: each row's floats
 * rounded to pairs in order (vcvtne2ps2bf16, nearest even as
 * qkv_f32_to_bf16), zero past kc and on rows w .. MR - 1. */
static void pack_a_rows_amx(const float *src, int64_t ld, int64_t kc, int w, int64_t kc2p, uint32_t *dst) {
    for (int i = 0; i < MR; i++) {
        const float *s = i < w ? src + i * ld : src;
        uint32_t *d = dst + i * KSTEP;
        for (int64_t t = 0; t < kc2p; t += 16) {
            if (i >= w) {
                _mm512_storeu_si512((void *)(d + t * MR), _mm512_setzero_si512());
                continue;
            }
            const int64_t nf = kc - 2 * t; /* floats left in the row */
            __m512i x;
            if (nf >= 32) {
                x = (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(s + 2 * t + 16), _mm512_loadu_ps(s + 2 * t));
            } else if (nf > 0) {
                __m512 lo = _mm512_maskz_loadu_ps(mask16(nf), s + 2 * t);
                __m512 hi = nf > 16 ? _mm512_maskz_loadu_ps(mask16(nf - 16), s + 2 * t + 16) : _mm512_setzero_ps();
                x = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
            } else {
                x = _mm512_setzero_si512();
            }
            _mm512_storeu_si512((void *)(d + t * MR), x);
        }
    }
}

/* KC = 512 (256 pairs): an A panel (32 rows) and a B panel (32 columns) are
 * 32 KB each, the B panel staying in L1 while the A panels stream from L2;
 * MC = 256 rows of A are 256 KB. */
void qkv_gemm_bf16_init_amx(qkv_gemm_bf16_kernel *k) {
    qkv_gemm_bf16_init_avx512bf16(k); /* its B packings */
    k->name = "amx-bf16 32x32";
    k->mr = MR;
    k->nr = NR;
    k->mc = 256;
    k->kc = 512;
    k->nc = 4096;
    k->ukr = ukr_amx;
    k->kstep = KSTEP;
    k->a_rows = 1;
    k->pack_a_rows = pack_a_rows_amx;
    k->begin = qkv_amx_tiles_begin;
    k->end = qkv_amx_tiles_end;
}
