/* 2-D sinusoidal positional encoding, as DETR's PositionEmbeddingSine
 * (Carion et al., ECCV 2020): half the channels encode the row, half the
 * column, each with the 1-D encoding of "Attention Is All You Need".
 * Computed in double. */
#include <math.h>

#include "core/internal.h"

qkv_status qkv_posenc_sinusoidal2d(int64_t height, int64_t width, int64_t dim, int normalize,
                                   float *out) {
    if (!out) return QKV_ERR_NULL_POINTER;
    if (height <= 0 || width <= 0 || dim <= 0 || dim % 4 != 0) return QKV_ERR_BAD_SIZE;
    int64_t f[3] = {height, width, dim}, total;
    if (!qkv_count_ok(&total, sizeof(float), 3, f)) return QKV_ERR_SIZE_OVERFLOW;
    const int64_t half = dim / 2;
    const double two_pi = 6.283185307179586;
    for (int64_t y = 0; y < height; y++) {
        /* DETR: cumulative sum of the unmasked pixels, so positions are 1-based;
         * normalised: divided by the last one (+1e-6) and scaled by 2 pi. */
        double py = (double)(y + 1), px;
        if (normalize) py = py / ((double)height + 1e-6) * two_pi;
        for (int64_t x = 0; x < width; x++) {
            px = (double)(x + 1);
            if (normalize) px = px / ((double)width + 1e-6) * two_pi;
            float *o = out + (y * width + x) * dim;
            for (int64_t t = 0; t < half; t += 2) {
                double freq = pow(10000.0, -(double)t / (double)half);
                o[t] = (float)sin(py * freq);
                o[t + 1] = (float)cos(py * freq);
                o[half + t] = (float)sin(px * freq);
                o[half + t + 1] = (float)cos(px * freq);
            }
        }
    }
    return QKV_OK;
}
