#include "test_util.h"

#include "core/half.h"
#include "core/rng.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

long tu_passed, tu_failed;

int tu_finish(void) {
    printf("%ld passed, %ld failed\n", tu_passed, tu_failed);
    return tu_failed == 0 ? 0 : 1;
}

void tu_rng_seed(tu_rng *r, uint64_t seed) { r->s = seed; }

uint64_t tu_rng_u64(tu_rng *r) { return splitmix64_next(&r->s); }

double tu_rng_uniform(tu_rng *r) { return splitmix64_unit(&r->s); }

double tu_rng_normal(tu_rng *r) {
    /* Box-Muller; u1 in (0, 1] so log is finite. */
    double u1 = 1.0 - tu_rng_uniform(r), u2 = tu_rng_uniform(r);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

void tu_fill_normal_f64(tu_rng *r, double *x, size_t n, double sd) {
    for (size_t i = 0; i < n; i++) x[i] = sd * tu_rng_normal(r);
}

void tu_fill_normal_f32(tu_rng *r, float *x, size_t n, double sd) {
    for (size_t i = 0; i < n; i++) x[i] = (float)(sd * tu_rng_normal(r));
}

#define TU_GUARD 64
#define TU_CANARY 0xA5

void *tu_guarded_alloc(size_t bytes) {
    unsigned char *base = malloc(bytes + 2 * TU_GUARD + sizeof(size_t));
    if (!base) return NULL;
    memcpy(base, &bytes, sizeof(size_t));
    memset(base + sizeof(size_t), TU_CANARY, TU_GUARD);
    memset(base + sizeof(size_t) + TU_GUARD, 0, bytes);
    memset(base + sizeof(size_t) + TU_GUARD + bytes, TU_CANARY, TU_GUARD);
    return base + sizeof(size_t) + TU_GUARD;
}

int tu_guarded_ok(const void *p) {
    const unsigned char *user = p, *base = user - TU_GUARD - sizeof(size_t);
    size_t bytes;
    memcpy(&bytes, base, sizeof(size_t));
    for (int i = 0; i < TU_GUARD; i++)
        if (user[-1 - i] != TU_CANARY || user[bytes + (size_t)i] != TU_CANARY) return 0;
    return 1;
}

void tu_guarded_free(void *p) {
    if (p) free((unsigned char *)p - TU_GUARD - sizeof(size_t));
}

static double tu_diff(double a, double b) {
    if (isnan(a) && isnan(b)) return 0.0;
    if (isnan(a) || isnan(b)) return INFINITY;
    if (a == b) return 0.0; /* equal infinities */
    return fabs(a - b);
}

double tu_max_abs_diff_f64(const double *a, const double *b, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = tu_diff(a[i], b[i]);
        if (d > m) m = d;
    }
    return m;
}

double tu_max_abs_diff_f32_f64(const float *a, const double *b, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = tu_diff((double)a[i], b[i]);
        if (d > m) m = d;
    }
    return m;
}

int tu_has_nan_f32(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (isnan(x[i])) return 1;
    return 0;
}

int tu_has_nan_f64(const double *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (isnan(x[i])) return 1;
    return 0;
}

const char *tu_tmp_path(char *buf, size_t len, const char *name) {
    const char *dir = getenv("QKV_TEST_TMP");
    if (!dir || !*dir) dir = "/tmp";
    snprintf(buf, len, "%s/%s", dir, name);
    return buf;
}

float tu_half_to_f32(qkv_dtype dt, uint16_t h) { return dt == QKV_BF16 ? qkv_bf16_to_f32(h) : qkv_f16_to_f32(h); }
uint16_t tu_f32_to_half(qkv_dtype dt, float x) { return dt == QKV_BF16 ? qkv_f32_to_bf16(x) : qkv_f32_to_f16(x); }
float tu_half_round(qkv_dtype dt, float x) { return tu_half_to_f32(dt, tu_f32_to_half(dt, x)); }

uint16_t *tu_half_random(tu_rng *r, qkv_dtype dt, int64_t n, double sd, double **dbl) {
    uint16_t *x = malloc((size_t)(n ? n : 1) * 2);
    *dbl = malloc((size_t)(n ? n : 1) * sizeof(double));
    for (int64_t i = 0; i < n; i++) {
        x[i] = tu_f32_to_half(dt, (float)(sd * tu_rng_normal(r)));
        (*dbl)[i] = tu_half_to_f32(dt, x[i]);
    }
    return x;
}

void tu_perturb_f32(float *x, int64_t n, uint64_t seed, double sd) {
    tu_rng r;
    tu_rng_seed(&r, seed);
    for (int64_t i = 0; i < n; i++) x[i] += (float)(sd * tu_rng_normal(&r));
}
