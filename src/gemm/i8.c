/* int8 linear layers (gemm/i8.h): the weights' quantisation and packing,
 * and the loop around the kernels of kernels/i8.h.
 *
 * A call is cut into units of (a block of rows, a group of weight panels);
 * a unit quantises its rows into its thread's scratch, then for each tile
 * of mr rows (kept in L1) runs over its panels (the whole quantised W of a
 * layer, at most a few hundred KB, stays in L2). With few rows (a short
 * sentence) the panels are split into groups so that both cores work; the
 * rows are then quantised once per group (cheap: k values per row against
 * k * n products). Sums are exact, so the split changes no bit.
 *
 * A row's outliers (kernels/i8.h) stay float: the tile adds, row by row,
 * the products of its own outliers with the int8 weights of their columns,
 * so a row's value does not depend on the other rows of its call. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/internal.h"
#include "core/threads.h"
#include "gemm/i8.h"
#include "kernels/kernels.h"

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

void qkv_i8_matrix_free(qkv_i8_matrix *m) {
    if (!m) return;
    qkv_free(m->panels);
    qkv_free(m->wsum);
    qkv_free(m->scale);
    memset(m, 0, sizeof *m);
}

int64_t qkv_i8_matrix_bytes(const qkv_i8_matrix *m) {
    int64_t np = ceil_div(m->n, QKV_I8_NR);
    return np * QKV_I8_NR * (m->kp + (int64_t)sizeof(int32_t) + (int64_t)sizeof(float));
}

qkv_status qkv_i8_matrix_make(const float *w, int64_t n, int64_t k, int64_t ldw, qkv_i8_matrix *out) {
    if (!w || !out) return QKV_ERR_NULL_POINTER;
    memset(out, 0, sizeof *out);
    if (n < 1 || k < 1 || ldw < k || k > QKV_I8_MAX_K) return QKV_ERR_BAD_SIZE;
    int64_t kp = ceil_div(k, QKV_I8_KSTEP) * QKV_I8_KSTEP, np = ceil_div(n, QKV_I8_NR), cols = np * QKV_I8_NR, bytes;
    if (!qkv_mul_ok(cols, kp, &bytes)) return QKV_ERR_SIZE_OVERFLOW;
    for (int64_t j = 0; j < n; j++)
        for (int64_t t = 0; t < k; t++)
            if (!isfinite(w[j * ldw + t])) return QKV_ERR_NOT_FINITE;
    out->panels = qkv_alloc((size_t)bytes);
    out->wsum = qkv_alloc((size_t)cols * sizeof *out->wsum);
    out->scale = qkv_alloc((size_t)cols * sizeof *out->scale);
    if (!out->panels || !out->wsum || !out->scale) {
        qkv_i8_matrix_free(out);
        return QKV_ERR_OUT_OF_MEMORY;
    }
    memset(out->panels, 0, (size_t)bytes);
    out->n = n;
    out->k = k;
    out->kp = kp;
    for (int64_t j = 0; j < cols; j++) {
        int32_t sum = 0;
        float s = 0.0f;
        if (j < n) {
            const float *row = w + j * ldw;
            float m = 0.0f;
            for (int64_t t = 0; t < k; t++) m = fabsf(row[t]) > m ? fabsf(row[t]) : m;
            float inv = m > 0.0f ? 127.0f / m : 0.0f;
            int8_t *panel = out->panels + (j / QKV_I8_NR) * kp * QKV_I8_NR;
            for (int64_t t = 0; t < k; t++) {
                float v = rintf(row[t] * inv);
                v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
                int8_t q = (int8_t)v;
                panel[(t / 4) * QKV_I8_NR * 4 + (j % QKV_I8_NR) * 4 + t % 4] = q;
                sum += q;
            }
            s = m / 127.0f;
        }
        out->wsum[j] = sum;
        out->scale[j] = s;
    }
    return QKV_OK;
}

typedef struct i8_job {
    const qkv_i8_kernels *k;
    const float *x, *b;
    const qkv_i8_matrix *w;
    float *y;
    int64_t rows, ldx, ldy, rb, npanels, groups;
    unsigned char *scratch; /* per thread: scratch_len bytes (scratch_bytes) */
    int64_t scratch_len;
} i8_job;

/* One thread's scratch for a block of rb rows of kp inputs: the quantised
 * rows, their scales and their outliers (count, indices, values). */
static int64_t scratch_bytes(int64_t rb, int64_t kp) {
    int64_t no = rb * QKV_I8_MAX_OUT;
    return (rb * kp + 63) / 64 * 64 + (rb * 8 + 63) / 64 * 64 + (no * 8 + 63) / 64 * 64;
}

static void i8_unit(void *ctx, int64_t unit, int thread) {
    const i8_job *j = ctx;
    const qkv_i8_matrix *w = j->w;
    int64_t blk = unit / j->groups, grp = unit % j->groups;
    int64_t r0 = blk * j->rb, r1 = r0 + j->rb < j->rows ? r0 + j->rb : j->rows;
    int64_t per = j->npanels / j->groups, rem = j->npanels % j->groups;
    int64_t p0 = grp * per + (grp < rem ? grp : rem), p1 = p0 + per + (grp < rem ? 1 : 0);
    unsigned char *base = j->scratch + (int64_t)thread * j->scratch_len;
    uint8_t *a = base;
    float *sa = (float *)(base + (j->rb * w->kp + 63) / 64 * 64);
    int *nout = (int *)(sa + j->rb);
    int32_t *oidx = (int32_t *)(base + (j->rb * w->kp + 63) / 64 * 64 + (j->rb * 8 + 63) / 64 * 64);
    float *oval = (float *)(oidx + j->rb * QKV_I8_MAX_OUT);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i = r - r0;
        sa[i] = j->k->quant_row(j->x + r * j->ldx, (size_t)w->k, (size_t)w->kp, a + i * w->kp,
                                oidx + i * QKV_I8_MAX_OUT, oval + i * QKV_I8_MAX_OUT, &nout[i]);
    }
    const int64_t mr = j->k->mr;
    /* the rows a last, short tile may read past the block's: zeros */
    if ((r1 - r0) % mr) memset(a + (r1 - r0) * w->kp, 128, (size_t)((mr - (r1 - r0) % mr) * w->kp));
    if (j->k->begin) j->k->begin();
    for (int64_t i = r0; i < r1; i += mr) {
        int m = (int)(r1 - i < mr ? r1 - i : mr);
        for (int64_t p = p0; p < p1; p++) {
            int64_t c0 = p * QKV_I8_NR;
            int n = (int)(w->n - c0 < QKV_I8_NR ? w->n - c0 : QKV_I8_NR);
            j->k->tile((size_t)w->kp, a + (i - r0) * w->kp, (size_t)w->kp, w->panels + p * w->kp * QKV_I8_NR,
                       w->wsum + c0, sa + (i - r0), w->scale + c0, j->b ? j->b + c0 : NULL, j->y + i * j->ldy + c0,
                       (size_t)j->ldy, m, n, nout + (i - r0), oidx + (i - r0) * QKV_I8_MAX_OUT,
                       oval + (i - r0) * QKV_I8_MAX_OUT);
        }
    }
    if (j->k->end) j->k->end();
}

qkv_status qkv_i8_linear_with(const qkv_i8_kernels *k, const float *x, int64_t rows, int64_t ldx,
                              const qkv_i8_matrix *w, const float *b, float *y, int64_t ldy, int threads) {
    if (!k || !x || !w || !w->panels || !y) return QKV_ERR_NULL_POINTER;
    if (rows < 1 || ldx < w->k || ldy < w->n || threads < 0) return QKV_ERR_BAD_SIZE;
    if (k->few && rows < k->mr) k = k->few;
    int t = qkv_threads_resolve(threads);
    int64_t work; /* ~2M products per extra thread */
    if (!qkv_mul_ok(rows, w->n, &work) || !qkv_mul_ok(work, w->kp, &work)) work = INT64_MAX;
    work /= (int64_t)1 << 21;
    if (work < t) t = work < 1 ? 1 : (int)work;
    i8_job j = {k, x, b, w, y, rows, ldx, ldy, 4 * k->mr, ceil_div(w->n, QKV_I8_NR), 1, NULL, 0};
    int64_t blocks = ceil_div(rows, j.rb);
    /* enough units for every thread to take two, when the panels allow */
    while (blocks * j.groups < 2 * t && j.groups * 2 <= j.npanels) j.groups *= 2;
    j.scratch_len = scratch_bytes(j.rb, w->kp);
    j.scratch = qkv_alloc((size_t)(j.scratch_len * t) + 64);
    if (!j.scratch) return QKV_ERR_OUT_OF_MEMORY;
    unsigned char *raw = j.scratch;
    j.scratch = (unsigned char *)(((uintptr_t)raw + 63) & ~(uintptr_t)63);
    if (t == 1)
        for (int64_t u = 0; u < blocks * j.groups; u++) i8_unit(&j, u, 0);
    else
        qkv_parallel_for(t, blocks * j.groups, i8_unit, &j);
    qkv_free(raw);
    return QKV_OK;
}

qkv_status qkv_i8_linear(const float *x, int64_t rows, int64_t ldx, const qkv_i8_matrix *w, const float *b, float *y,
                         int64_t ldy, int threads) {
    return qkv_i8_linear_with(qkv_i8_kernels_active(), x, rows, ldx, w, b, y, ldy, threads);
}
