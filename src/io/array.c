/* qkv_array: the in-memory form of a .npy array (dtype, shape, owned data).
 * Allocation, dtype conversion and freeing; the file format lives in npy.c. */
#include <math.h>
#include <string.h>

#include "core/half.h"
#include "core/internal.h"

size_t qkv_dtype_size(qkv_dtype dtype) {
    switch (dtype) {
    case QKV_F32: return 4;
    case QKV_F64: return 8;
    case QKV_I32: return 4;
    case QKV_I64: return 8;
    case QKV_BF16: case QKV_F16: return 2; /* uint16_t bit patterns */
    }
    return 0;
}

/* Checks of a shape shared by alloc and convert. */
static qkv_status shape_check(int ndim, const int64_t *shape) {
    if (ndim < 0 || ndim > QKV_NPY_MAX_DIMS) return QKV_ERR_BAD_SIZE;
    if (ndim > 0 && !shape) return QKV_ERR_NULL_POINTER;
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0) return QKV_ERR_BAD_SIZE;
    return QKV_OK;
}

int64_t qkv_array_count(const qkv_array *a) {
    int64_t n;
    /* Documented as unable to fail: an invalid array has no elements. */
    if (!a || shape_check(a->ndim, a->shape) != QKV_OK) return 0;
    if (!qkv_shape_count(a->ndim, a->shape, 0, &n)) return 0;
    return n;
}

qkv_status qkv_array_alloc(qkv_array *out, qkv_dtype dtype, int ndim, const int64_t *shape) {
    if (!out) return QKV_ERR_NULL_POINTER;
    memset(out, 0, sizeof *out);
    qkv_status s = shape_check(ndim, shape);
    if (s != QKV_OK) return s;
    size_t elem = qkv_dtype_size(dtype);
    if (elem == 0) return QKV_ERR_DTYPE;
    int64_t n;
    if (!qkv_shape_count(ndim, shape, elem, &n)) return QKV_ERR_SIZE_OVERFLOW;
    /* Always a real buffer, even for 0 elements, so data != NULL means "owned". */
    void *data = qkv_alloc_zeroed((size_t)n * elem);
    if (!data) return QKV_ERR_OUT_OF_MEMORY;
    *out = (qkv_array){.dtype = dtype, .ndim = ndim, .data = data};
    for (int i = 0; i < ndim; i++) out->shape[i] = shape[i];
    return QKV_OK;
}

void qkv_array_free(qkv_array *a) {
    if (!a) return;
    qkv_free(a->data);
    memset(a, 0, sizeof *a);
}

/* double -> float as IEEE rounding does (Annex F), spelled out because C11
 * leaves an out-of-range conversion undefined: overflow gives +-inf. */
static float to_f32(double v) {
    /* FLT_MAX + half an ulp: from here on, round-to-nearest gives infinity. */
    if (isnan(v) || fabs(v) < 0x1.ffffffp127) return (float)v;
    return v > 0 ? INFINITY : -INFINITY;
}

/* Float -> integer truncating toward zero; 0 when NaN or the truncated value
 * does not fit (the conversion would be undefined). */
static int f_to_i32(double v, int32_t *o) {
    if (!(v > -2147483649.0 && v < 2147483648.0)) return 0;
    *o = (int32_t)v;
    return 1;
}

static int f_to_i64(double v, int64_t *o) {
    if (!(v >= -0x1p63 && v < 0x1p63)) return 0;
    *o = (int64_t)v;
    return 1;
}

/* Rounding to half precision from a wider value, once. A float rounded to
 * odd (truncated toward zero, last bit set when inexact) rounds to any format
 * at least 2 bits narrower exactly as the wider value would have (Boldo and
 * Melquiond, "Emulation of FMA and correctly rounded sums: proved algorithms
 * using rounding to odd", IEEE TC 2008); going through a float rounded to
 * nearest instead would round twice (1 + 2^-8 + 2^-30 would become the tie
 * 1 + 2^-8, then 1, instead of bf16's 1 + 2^-7). Callers keep |v| below
 * FLT_MAX (larger values are infinities in both half formats). */
static float f32_round_odd(double v) {
    float f = (float)v;
    if (isnan(v) || (double)f == v) return f;
    if (fabs((double)f) > fabs(v)) f = nextafterf(f, 0.0f);
    return qkv_f32_from_bits(qkv_f32_bits(f) | 1u);
}

/* An integer as a float rounded to odd: its top 24 significant bits, the
 * last one set when any bit below was. Exact up to 2^24. */
static float i64_round_odd(int64_t v) {
    uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
    int shift = 0;
    while ((u >> shift) >= ((uint64_t)1 << 24)) shift++;
    uint64_t m = u >> shift;
    if ((m << shift) != u) m |= 1u;
    float f = ldexpf((float)m, shift);
    return v < 0 ? -f : f;
}

/* double -> bf16 / fp16, round to nearest even; beyond the largest finite
 * value by half an ulp or more: +-inf; NaN stays NaN. */
static uint16_t f64_to_bf16(double v) {
    if (!isnan(v) && fabs(v) >= 0x1.ffp127) return v > 0 ? 0x7f80u : 0xff80u;
    return qkv_f32_to_bf16(f32_round_odd(v));
}

static uint16_t f64_to_f16(double v) {
    if (!isnan(v) && fabs(v) >= 65520.0) return v > 0 ? 0x7c00u : 0xfc00u;
    return qkv_f32_to_f16(f32_round_odd(v));
}

static int is_float(qkv_dtype d) { return d == QKV_F32 || d == QKV_F64 || d == QKV_BF16 || d == QKV_F16; }

/* Element i of a floating-point array, exactly, as a double. */
static double get_float(const qkv_array *a, int64_t i) {
    switch (a->dtype) {
    case QKV_F32: return (double)((const float *)a->data)[i];
    case QKV_F64: return ((const double *)a->data)[i];
    case QKV_BF16: return (double)qkv_bf16_to_f32(((const uint16_t *)a->data)[i]);
    case QKV_F16: return (double)qkv_f16_to_f32(((const uint16_t *)a->data)[i]);
    case QKV_I32: case QKV_I64: break;
    }
    return 0.0;
}

/* The conversion proper; *result is written only on success. */
static qkv_status convert(const qkv_array *src, qkv_dtype to, qkv_array *result) {
    qkv_status s = shape_check(src->ndim, src->shape);
    if (s != QKV_OK) return s;
    if (qkv_dtype_size(src->dtype) == 0 || qkv_dtype_size(to) == 0) return QKV_ERR_DTYPE;
    int64_t n;
    if (!qkv_shape_count(src->ndim, src->shape, qkv_dtype_size(src->dtype), &n)) return QKV_ERR_SIZE_OVERFLOW;
    if (n > 0 && !src->data) return QKV_ERR_NULL_POINTER;

    qkv_array dst;
    s = qkv_array_alloc(&dst, to, src->ndim, src->shape);
    if (s != QKV_OK) return s;

    const int src_float = is_float(src->dtype);
    for (int64_t i = 0; i < n; i++) {
        int ok = 1;
        if (src_float) {
            double v = get_float(src, i);
            switch (to) {
            case QKV_F32: ((float *)dst.data)[i] = to_f32(v); break;
            case QKV_F64: ((double *)dst.data)[i] = v; break;
            case QKV_I32: ok = f_to_i32(v, &((int32_t *)dst.data)[i]); break;
            case QKV_I64: ok = f_to_i64(v, &((int64_t *)dst.data)[i]); break;
            case QKV_BF16: ((uint16_t *)dst.data)[i] = f64_to_bf16(v); break;
            case QKV_F16: ((uint16_t *)dst.data)[i] = f64_to_f16(v); break;
            }
        } else {
            int64_t v = src->dtype == QKV_I32 ? (int64_t)((const int32_t *)src->data)[i]
                                              : ((const int64_t *)src->data)[i];
            switch (to) {
            case QKV_F32: ((float *)dst.data)[i] = (float)v; break; /* rounds to nearest */
            case QKV_F64: ((double *)dst.data)[i] = (double)v; break;
            case QKV_I32:
                ok = v >= INT32_MIN && v <= INT32_MAX;
                if (ok) ((int32_t *)dst.data)[i] = (int32_t)v;
                break;
            case QKV_I64: ((int64_t *)dst.data)[i] = v; break;
            case QKV_BF16: ((uint16_t *)dst.data)[i] = qkv_f32_to_bf16(i64_round_odd(v)); break;
            case QKV_F16: ((uint16_t *)dst.data)[i] = f64_to_f16((double)i64_round_odd(v)); break;
            }
        }
        if (!ok) {
            qkv_array_free(&dst);
            return QKV_ERR_BAD_PARAMETER;
        }
    }
    *result = dst;
    return QKV_OK;
}

qkv_status qkv_array_convert(const qkv_array *in, qkv_dtype to, qkv_array *out) {
    if (!out) return QKV_ERR_NULL_POINTER;
    qkv_array result;
    qkv_status s = in ? convert(in, to, &result) : QKV_ERR_NULL_POINTER;
    if (s == QKV_OK)
        *out = result;
    else if (out != in) /* in == out: a failure leaves the input as it was */
        memset(out, 0, sizeof *out);
    return s;
}
