/* The AMX kernels' shared tile configuration (internal): palette 1, tiles
 * 0-7 all 16 rows x 64 bytes (C: 16 x 16 floats or int32; A: 16 rows x 32
 * bf16 or 64 bytes; B: 16 rows of pairs or quads x 16 columns). Loaded by
 * each thread before its first tile of a product, released after its last. */
#ifndef QKV_KERNELS_AMX_H
#define QKV_KERNELS_AMX_H

void qkv_amx_tiles_begin(void);
void qkv_amx_tiles_end(void);

#endif
