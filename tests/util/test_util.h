/* Shared helpers for the test programs: a tiny check harness, a seeded RNG,
 * guarded buffers (catch out-of-bounds writes in tails) and error measures. */
#ifndef QKV_TEST_UTIL_H
#define QKV_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "qkv.h"

/* Counters of the current program; tu_finish() prints "N passed, N failed"
 * and returns the process exit code. */
extern long tu_passed, tu_failed;

#define CHECK(cond, ...)                                                     \
    do {                                                                     \
        if (cond) {                                                          \
            tu_passed++;                                                     \
        } else {                                                             \
            tu_failed++;                                                     \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);  \
            fprintf(stderr, __VA_ARGS__);                                    \
            fprintf(stderr, "\n");                                           \
        }                                                                    \
    } while (0)

#define CHECK_STATUS(expr, want)                                             \
    do {                                                                     \
        qkv_status tu_s_ = (expr);                                           \
        CHECK(tu_s_ == (want), "%s returned %d (%s), want %d (%s)", #expr,   \
              (int)tu_s_, qkv_status_string(tu_s_), (int)(want),            \
              qkv_status_string(want));                                      \
    } while (0)

int tu_finish(void);

/* Deterministic RNG (splitmix64). */
typedef struct tu_rng { uint64_t s; } tu_rng;
void tu_rng_seed(tu_rng *r, uint64_t seed);
uint64_t tu_rng_u64(tu_rng *r);
double tu_rng_uniform(tu_rng *r);              /* [0, 1) */
double tu_rng_normal(tu_rng *r);               /* N(0, 1) */
void tu_fill_normal_f64(tu_rng *r, double *x, size_t n, double sd);
void tu_fill_normal_f32(tu_rng *r, float *x, size_t n, double sd);

/* Guarded buffers: `bytes` usable bytes between two canary regions. */
void *tu_guarded_alloc(size_t bytes);
int tu_guarded_ok(const void *p);              /* canaries intact? */
void tu_guarded_free(void *p);

/* max |a - b| over n; NaN where exactly one side is NaN counts as infinite. */
double tu_max_abs_diff_f64(const double *a, const double *b, size_t n);
double tu_max_abs_diff_f32_f64(const float *a, const double *b, size_t n);
int tu_has_nan_f32(const float *x, size_t n);
int tu_has_nan_f64(const double *x, size_t n);

/* Half precision (dt = QKV_BF16 or QKV_F16): one value to and from float
 * (round to nearest even), and a float rounded through the half type. */
float tu_half_to_f32(qkv_dtype dt, uint16_t h);
uint16_t tu_f32_to_half(qkv_dtype dt, float x);
float tu_half_round(qkv_dtype dt, float x);
/* n normal values (sd) stored in dt, malloc'd; *dbl gets a malloc'd double
 * copy of the stored values. The caller frees both. */
uint16_t *tu_half_random(tu_rng *r, qkv_dtype dt, int64_t n, double sd, double **dbl);

/* Adds N(0, sd²) noise from its own seed to n floats: non-zero biases and
 * tables in tests, so that their gradients matter. */
void tu_perturb_f32(float *x, int64_t n, uint64_t seed, double sd);

/* A temp path under $QKV_TEST_TMP (or /tmp): dir/name, returned in buf. */
const char *tu_tmp_path(char *buf, size_t len, const char *name);

#endif
