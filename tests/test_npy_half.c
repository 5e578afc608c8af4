/* Half precision as array dtypes (QKV_BF16, QKV_F16): .npy round trips of
 * every bit pattern ('<u2' holds bf16 bit patterns by qkv's convention,
 * '<f2' is IEEE binary16), the bytes NumPy writes, safetensors saving them
 * as BF16 / F16, and qkv_array_convert to and from them: exact widening,
 * one rounding to nearest-even from float32, float64 and integers (checked
 * against an independent rounding in exact double arithmetic, including the
 * double-rounding traps of going through a rounded float32), overflow to
 * inf, NaN kept, and half to integer truncation. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_util.h"

/* bf16 / fp16 bit patterns -> double, from their definitions. */
static double bf16_val(uint16_t h) {
    int s = h >> 15, e = (h >> 7) & 0xff, m = h & 0x7f;
    if (e == 0xff) return m ? NAN : (s ? -INFINITY : INFINITY);
    double v = e ? ldexp(128 + m, e - 134) : ldexp(m, -133);
    return s ? -v : v;
}

static double f16_val(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0x1f) return m ? NAN : (s ? -INFINITY : INFINITY);
    double v = e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
    return s ? -v : v;
}

/* The nearest half to x (ties to even mantissa), by search over the finite
 * non-negative patterns in order: an oracle independent of the library. */
static uint16_t nearest(double x, int bf) {
    const uint16_t sign = signbit(x) ? 0x8000 : 0, maxfin = bf ? 0x7f7f : 0x7bff;
    double a = fabs(x);
    double (*val)(uint16_t) = bf ? bf16_val : f16_val;
    /* beyond max + half an ulp: inf (the tie at exactly that goes to inf: max is odd) */
    double top = val(maxfin), ulp = top - val((uint16_t)(maxfin - 1));
    if (a >= top + ulp / 2) return sign | (bf ? 0x7f80 : 0x7c00);
    uint16_t lo = 0, hi = maxfin; /* largest pattern with val <= a */
    while (lo < hi) {
        uint16_t mid = (uint16_t)((lo + hi + 1) / 2);
        if (val(mid) <= a) lo = mid;
        else hi = (uint16_t)(mid - 1);
    }
    if (lo == maxfin) return sign | lo;
    double d0 = a - val(lo), d1 = val((uint16_t)(lo + 1)) - a;
    uint16_t r = d0 < d1 ? lo : d1 < d0 ? (uint16_t)(lo + 1) : (lo & 1) ? (uint16_t)(lo + 1) : lo;
    return sign | r;
}

static void test_sizes_and_round_trips(void) {
    CHECK(qkv_dtype_size(QKV_BF16) == 2 && qkv_dtype_size(QKV_F16) == 2, "half sizes");
    char path[512];
    tu_tmp_path(path, sizeof path, "npy_half.npy");
    for (int bf = 0; bf < 2; bf++) {
        qkv_array a, b;
        int64_t shape[2] = {256, 256};
        CHECK_STATUS(qkv_array_alloc(&a, bf ? QKV_BF16 : QKV_F16, 2, shape), QKV_OK);
        if (!a.data) continue;
        for (int i = 0; i < 65536; i++) ((uint16_t *)a.data)[i] = (uint16_t)i;
        CHECK_STATUS(qkv_npy_save(path, &a), QKV_OK);
        char why[200];
        CHECK_STATUS(qkv_npy_load(path, &b, why, sizeof why), QKV_OK);
        CHECK(b.dtype == a.dtype && b.ndim == 2 && b.shape[0] == 256 && b.shape[1] == 256, "%s header",
              bf ? "bf16" : "f16");
        CHECK(b.data && memcmp(a.data, b.data, 65536 * 2) == 0, "%s: every bit pattern survives save + load",
              bf ? "bf16" : "f16");
        /* the header NumPy would write: descr '<u2' / '<f2' */
        FILE *f = fopen(path, "rb");
        char head[128] = {0};
        if (f) {
            size_t got = fread(head, 1, sizeof head - 1, f);
            (void)got;
            fclose(f);
        }
        CHECK(strstr(head + 10, bf ? "'descr': '<u2'" : "'descr': '<f2'") != NULL, "descr in %s", head + 10);
        /* widening to float32 and float64 is exact, for every pattern */
        qkv_array w32, w64;
        CHECK_STATUS(qkv_array_convert(&a, QKV_F32, &w32), QKV_OK);
        CHECK_STATUS(qkv_array_convert(&a, QKV_F64, &w64), QKV_OK);
        int bad = 0;
        for (int i = 0; i < 65536 && w32.data && w64.data; i++) {
            double want = bf ? bf16_val((uint16_t)i) : f16_val((uint16_t)i);
            double g32 = ((float *)w32.data)[i], g64 = ((double *)w64.data)[i];
            if (isnan(want) ? !(isnan(g32) && isnan(g64)) : (g32 != want || g64 != want || signbit(g32) != signbit(want)))
                bad++;
        }
        CHECK(bad == 0, "%s: %d patterns widen wrongly", bf ? "bf16" : "f16", bad);
        /* and narrowing back gives the same patterns (NaN: still NaN) */
        qkv_array back;
        CHECK_STATUS(qkv_array_convert(&w64, a.dtype, &back), QKV_OK);
        bad = 0;
        for (int i = 0; i < 65536 && back.data; i++) {
            uint16_t g = ((uint16_t *)back.data)[i];
            double want = bf ? bf16_val((uint16_t)i) : f16_val((uint16_t)i);
            if (isnan(want) ? !isnan(bf ? bf16_val(g) : f16_val(g)) : g != (uint16_t)i) bad++;
        }
        CHECK(bad == 0, "%s: %d patterns do not round-trip through float64", bf ? "bf16" : "f16", bad);
        qkv_array_free(&back);
        qkv_array_free(&w32);
        qkv_array_free(&w64);
        qkv_array_free(&a);
        qkv_array_free(&b);
    }
    unlink(path);
}

/* The bytes np.save writes for np.array([1, -2, 0.5], '<f2') and for the bf16
 * patterns of [1, -2, 0.5] as '<u2' (numpy 2.x, version 1.0). */
static void test_numpy_bytes(void) {
    static const char hdr_f2[] = "{'descr': '<f2', 'fortran_order': False, 'shape': (3,), }";
    static const char hdr_u2[] = "{'descr': '<u2', 'fortran_order': False, 'shape': (3,), }";
    for (int bf = 0; bf < 2; bf++) {
        const char *h = bf ? hdr_u2 : hdr_f2;
        unsigned char buf[128 + 6];
        memset(buf, ' ', sizeof buf);
        memcpy(buf, "\x93NUMPY\x01\x00\x76\x00", 10);
        memcpy(buf + 10, h, strlen(h));
        buf[127] = '\n';
        const uint16_t vals[3] = {bf ? 0x3f80 : 0x3c00, bf ? 0xc000 : 0xc000, bf ? 0x3f00 : 0x3800};
        for (int i = 0; i < 3; i++) {
            buf[128 + 2 * i] = (unsigned char)(vals[i] & 0xff);
            buf[129 + 2 * i] = (unsigned char)(vals[i] >> 8);
        }
        qkv_array a, w;
        char why[128];
        CHECK_STATUS(qkv_npy_parse(buf, sizeof buf, &a, why, sizeof why), QKV_OK);
        CHECK(a.dtype == (bf ? QKV_BF16 : QKV_F16) && a.ndim == 1 && a.shape[0] == 3, "parsed %s", h);
        CHECK_STATUS(qkv_array_convert(&a, QKV_F32, &w), QKV_OK);
        if (w.data) {
            const float *f = w.data;
            CHECK(f[0] == 1.0f && f[1] == -2.0f && f[2] == 0.5f, "%s values %g %g %g", h, f[0], f[1], f[2]);
        }
        qkv_array_free(&w);
        qkv_array_free(&a);
    }
}

static void check_narrow(double x, const char *what) {
    qkv_array a, b;
    int64_t one = 1;
    for (int bf = 0; bf < 2; bf++) {
        uint16_t want = nearest(x, bf);
        CHECK_STATUS(qkv_array_alloc(&a, QKV_F64, 1, &one), QKV_OK);
        if (!a.data) return;
        ((double *)a.data)[0] = x;
        CHECK_STATUS(qkv_array_convert(&a, bf ? QKV_BF16 : QKV_F16, &b), QKV_OK);
        if (b.data)
            CHECK(((uint16_t *)b.data)[0] == want, "%s: float64 %.17g -> %s 0x%04x, want 0x%04x", what, x,
                  bf ? "bf16" : "f16", ((uint16_t *)b.data)[0], want);
        qkv_array_free(&b);
        /* from float32 too, when x is one */
        if (fabs(x) <= FLT_MAX && (double)(float)x == x) { /* (float) of a larger x is undefined */
            qkv_array_free(&a);
            CHECK_STATUS(qkv_array_alloc(&a, QKV_F32, 1, &one), QKV_OK);
            ((float *)a.data)[0] = (float)x;
            CHECK_STATUS(qkv_array_convert(&a, bf ? QKV_BF16 : QKV_F16, &b), QKV_OK);
            if (b.data)
                CHECK(((uint16_t *)b.data)[0] == want, "%s: float32 %.9g -> %s 0x%04x, want 0x%04x", what, x,
                      bf ? "bf16" : "f16", ((uint16_t *)b.data)[0], want);
            qkv_array_free(&b);
        }
        qkv_array_free(&a);
    }
}

static void test_narrowing(void) {
    /* the double-rounding traps: just above a tie of the half format, but a
     * tie after rounding to float32 first */
    check_narrow(1.0 + 0x1p-8 + 0x1p-30, "bf16 tie + 2^-30");
    check_narrow(1.0 + 0x1p-11 + 0x1p-40, "f16 tie + 2^-40");
    check_narrow(-(1.0 + 0x1p-8 + 0x1p-30), "negative");
    check_narrow(1.0 + 0x1p-8, "exact bf16 tie (to even: 1)");
    check_narrow(1.0 + 3 * 0x1p-8, "exact bf16 tie (to even: up)");
    check_narrow(65504.0, "f16 max");
    check_narrow(65519.99, "below f16 overflow");
    check_narrow(65520.0, "f16 overflow tie -> inf");
    check_narrow(0x1.fep127, "bf16 max");
    check_narrow(0x1.ff0000001p127, "above bf16 overflow tie");
    check_narrow(1e300, "huge");
    check_narrow(-1e300, "huge negative");
    check_narrow(0x1p-25, "f16 subnormal tie to 0");
    check_narrow(0x1p-25 + 0x1p-60, "f16 just above the tie");
    check_narrow(0x1p-134, "bf16 subnormal tie to 0");
    check_narrow(0x1p-134 * 1.0000001, "bf16 just above the tie");
    check_narrow(1e-300, "tiny");
    check_narrow(-0.0, "-0");
    /* random doubles over the whole range of both formats */
    tu_rng r;
    tu_rng_seed(&r, 42);
    for (int i = 0; i < 20000; i++) {
        double x = ldexp(tu_rng_uniform(&r) * 2 - 1, (int)(tu_rng_u64(&r) % 300) - 150);
        if (i % 3 == 0) x = ldexp(1.0 + ldexp((double)(tu_rng_u64(&r) % 512), -8) + ldexp(tu_rng_uniform(&r), -40),
                                  (int)(tu_rng_u64(&r) % 40) - 20); /* near ties */
        check_narrow(x, "random");
    }
    /* NaN stays NaN, inf stays inf */
    qkv_array a, b;
    int64_t n3 = 3;
    CHECK_STATUS(qkv_array_alloc(&a, QKV_F32, 1, &n3), QKV_OK);
    if (a.data) {
        ((float *)a.data)[0] = NAN;
        ((float *)a.data)[1] = INFINITY;
        ((float *)a.data)[2] = -INFINITY;
        for (int bf = 0; bf < 2; bf++) {
            CHECK_STATUS(qkv_array_convert(&a, bf ? QKV_BF16 : QKV_F16, &b), QKV_OK);
            if (!b.data) continue;
            const uint16_t *h = b.data;
            double (*val)(uint16_t) = bf ? bf16_val : f16_val;
            CHECK(isnan(val(h[0])) && val(h[1]) == INFINITY && val(h[2]) == -INFINITY, "%s NaN/inf",
                  bf ? "bf16" : "f16");
            qkv_array_free(&b);
        }
    }
    qkv_array_free(&a);
}

static void test_integers(void) {
    /* integers to half: one rounding (int64 beyond 2^53 as well); half to
     * integers: truncation, NaN / inf / out of range refused */
    static const int64_t iv[] = {0, 1, -1, 255, 257, 2049, -2051, 65504, 65519, 65520, 70000, INT64_C(9007199254740993),
                                 INT64_MAX, INT64_MIN, INT64_C(0x0101000000000001)};
    int64_t n = (int64_t)(sizeof iv / sizeof iv[0]);
    qkv_array a, b;
    CHECK_STATUS(qkv_array_alloc(&a, QKV_I64, 1, &n), QKV_OK);
    if (!a.data) return;
    memcpy(a.data, iv, sizeof iv);
    for (int bf = 0; bf < 2; bf++) {
        CHECK_STATUS(qkv_array_convert(&a, bf ? QKV_BF16 : QKV_F16, &b), QKV_OK);
        for (int64_t i = 0; i < n && b.data; i++) {
            /* (double)v rounds beyond 2^53, which never moves these values
             * across a half rounding boundary - except 2^56 + 2^48 + 1, just
             * above a bf16 tie, which (double) would round onto the tie
             * (then to even, down): its correct bf16 is the one above. */
            uint16_t want = nearest((double)iv[i], bf), got = ((uint16_t *)b.data)[i];
            if (iv[i] == INT64_C(0x0101000000000001)) want = bf ? nearest(ldexp(1.0 + 0x1p-7, 56), 1) : 0x7c00;
            CHECK(got == want, "int64 %lld -> %s 0x%04x, want 0x%04x", (long long)iv[i], bf ? "bf16" : "f16", got, want);
        }
        qkv_array_free(&b);
    }
    qkv_array_free(&a);
    /* half -> int32: truncation toward zero; NaN refused */
    int64_t n4 = 4;
    CHECK_STATUS(qkv_array_alloc(&a, QKV_F16, 1, &n4), QKV_OK);
    if (a.data) {
        uint16_t *h = a.data;
        h[0] = 0x4170; /* 2.71875 */
        h[1] = 0xc170; /* -2.71875 */
        h[2] = 0x7bff; /* 65504 */
        h[3] = 0x3800; /* 0.5 */
        CHECK_STATUS(qkv_array_convert(&a, QKV_I32, &b), QKV_OK);
        if (b.data) {
            const int32_t *o = b.data;
            CHECK(o[0] == 2 && o[1] == -2 && o[2] == 65504 && o[3] == 0, "f16 -> i32 truncates: %d %d %d %d", o[0],
                  o[1], o[2], o[3]);
        }
        qkv_array_free(&b);
        h[1] = 0x7e00; /* NaN */
        CHECK_STATUS(qkv_array_convert(&a, QKV_I64, &b), QKV_ERR_BAD_PARAMETER);
        CHECK(b.data == NULL, "failed convert leaves nothing");
        /* bf16 <-> fp16: by value, one rounding */
        h[1] = 0x3c01; /* 1 + 2^-10: not a bf16 value; nearest bf16 is 1 */
        CHECK_STATUS(qkv_array_convert(&a, QKV_BF16, &b), QKV_OK);
        if (b.data) {
            const uint16_t *o = b.data;
            CHECK(o[0] == nearest(2.71875, 1) && o[1] == 0x3f80 && o[2] == nearest(65504.0, 1), "f16 -> bf16");
        }
        qkv_array_free(&b);
    }
    qkv_array_free(&a);
}

/* safetensors: half arrays are saved as BF16 / F16 and load widened to F32. */
static void test_safetensors(void) {
    char path[512];
    tu_tmp_path(path, sizeof path, "half.safetensors");
    qkv_safetensors *st = NULL;
    CHECK_STATUS(qkv_safetensors_create(&st), QKV_OK);
    if (!st) return;
    qkv_array a[2];
    int64_t shape[2] = {3, 5};
    for (int bf = 0; bf < 2; bf++) {
        CHECK_STATUS(qkv_array_alloc(&a[bf], bf ? QKV_BF16 : QKV_F16, 2, shape), QKV_OK);
        for (int i = 0; i < 15 && a[bf].data; i++)
            ((uint16_t *)a[bf].data)[i] = (uint16_t)(bf ? 0x3f80 + 37 * i : 0x3c00 + 41 * i);
        CHECK_STATUS(qkv_safetensors_put(st, bf ? "b" : "f", &a[bf]), QKV_OK);
    }
    CHECK_STATUS(qkv_safetensors_save(st, path), QKV_OK);
    qkv_safetensors_free(st);
    qkv_safetensors *ld = NULL;
    char why[200];
    CHECK_STATUS(qkv_safetensors_load(path, &ld, why, sizeof why), QKV_OK);
    for (int bf = 0; bf < 2 && ld; bf++) {
        const qkv_array *g = qkv_safetensors_get(ld, bf ? "b" : "f");
        CHECK(g && g->dtype == QKV_F32 && g->ndim == 2 && g->shape[1] == 5, "loaded %s", bf ? "BF16" : "F16");
        for (int i = 0; g && i < 15; i++) {
            uint16_t h = ((uint16_t *)a[bf].data)[i];
            double want = bf ? bf16_val(h) : f16_val(h);
            CHECK(((const float *)g->data)[i] == want, "%s element %d", bf ? "BF16" : "F16", i);
        }
    }
    qkv_safetensors_free(ld);
    qkv_array_free(&a[0]);
    qkv_array_free(&a[1]);
    unlink(path);
}

int main(void) {
    test_sizes_and_round_trips();
    test_numpy_bytes();
    test_narrowing();
    test_integers();
    test_safetensors();
    return tu_finish();
}
