/* The linear layer (linear.h): the products by qkv_sgemm (or qkv_gemm_bf16), the bias and its
 * gradient by rows or columns over the threads (qkv_par_range), each element
 * computed as the serial loop computes it. */
#include "core/internal.h"
#include "gemm/gemm.h"
#include "kernels/kernels.h"
#include "layers/linear.h"

/* y[r] = act(y[r] + b), one chunk of rows per unit; db += Σ_r dy[r], one
 * chunk of columns per unit with the rows in order (the serial sum's order). */
typedef struct {
    float *y, *b;
    int64_t rows, out;
    int act; /* act_rows: a QKV_NN_ACT_* */
} bias_job;

static void bias_grad_cols(void *ctx, int64_t c0, int64_t c1) {
    const bias_job *j = ctx;
    qkv_nn_kernels_active()->col_sums(j->b + c0, j->y + c0, (size_t)j->rows, (size_t)j->out, (size_t)(c1 - c0));
}

qkv_status nn_linear_p(qkv_dtype prec, const float *x, int64_t rows, int64_t in, const float *w, const float *b,
                       int64_t out, float *y, int threads) {
    /* bf16: the bias is added in the product's merge, tile by tile:
     * y = (x Wᵀ) + b as below. */
    if (prec == QKV_BF16) return qkv_gemm_bf16(0, 1, rows, out, in, 1.0f, x, in, w, in, 0.0f, y, out, b, threads);
    /* float32: the bias in the product's epilogue, panel by panel while it
     * is in cache (a pass after the system BLAS) */
    if (!b) return qkv_sgemm(0, 1, rows, out, in, 1.0f, x, in, w, in, 0.0f, y, out, threads);
    return nn_linear_act(x, rows, in, w, b, out, y, QKV_NN_ACT_NONE, threads);
}

qkv_status nn_linear(const float *x, int64_t rows, int64_t in, const float *w, const float *b, int64_t out,
                     float *y, int threads) {
    return nn_linear_p(QKV_F32, x, rows, in, w, b, out, y, threads);
}

/* The bias and the activation of a finished block of y (an epilogue of the
 * product, gemm/gemm.h) through the nn kernel; then, on whole rows, the
 * caller's step. */
typedef struct {
    const float *b;
    int act;
    const nn_rows_step *then; /* NULL: none */
} act_epi_ctx;

static void act_epi(void *ctx, float *c, int64_t ldc, int64_t i0, int64_t j0, int64_t m, int64_t n) {
    (void)i0;
    const act_epi_ctx *a = ctx;
    qkv_nn_kernels_active()->bias_act(c, (size_t)ldc, (size_t)m, a->b ? a->b + j0 : NULL, (size_t)n, a->act);
}

static void then_epi(void *ctx, float *c, int64_t ldc, int64_t i0, int64_t m) {
    const act_epi_ctx *a = ctx;
    a->then->fn(a->then->ctx, c, ldc, i0, m);
}

static qkv_gemm_epi act_epi_of(const act_epi_ctx *a) {
    return (qkv_gemm_epi){act_epi, (void *)(uintptr_t)a, a->then && a->then->fn ? then_epi : NULL};
}

static void act_rows(void *ctx, int64_t r0, int64_t r1) {
    const bias_job *j = ctx;
    const qkv_nn_kernels *k = qkv_nn_kernels_active();
    k->bias_act(j->y + r0 * j->out, (size_t)j->out, (size_t)(r1 - r0), j->b, (size_t)j->out, j->act);
}

/* The arguments of one linear layer y [rows, out] = x [rows, in] Wᵀ. */
static qkv_status linear_check(const float *x, int64_t rows, int64_t in, const float *w, int64_t out, const float *y,
                               int threads) {
    if (rows < 0 || in < 0 || out < 0 || threads < 0) return QKV_ERR_BAD_SIZE;
    if ((rows > 0 && out > 0 && !y) || (rows > 0 && in > 0 && !x) || (in > 0 && out > 0 && !w))
        return QKV_ERR_NULL_POINTER;
    if (!qkv_gemm_extent_ok(rows, in, in) || !qkv_gemm_extent_ok(out, in, in) || !qkv_gemm_extent_ok(rows, out, out))
        return QKV_ERR_SIZE_OVERFLOW;
    return QKV_OK;
}

qkv_status nn_linear_act(const float *x, int64_t rows, int64_t in, const float *w, const float *b, int64_t out,
                         float *y, int act, int threads) {
    return nn_linear_act_then(x, rows, in, w, b, out, y, act, NULL, threads);
}

qkv_status nn_linear_act_then(const float *x, int64_t rows, int64_t in, const float *w, const float *b, int64_t out,
                              float *y, int act, const nn_rows_step *then, int threads) {
    qkv_status st = linear_check(x, rows, in, w, out, y, threads);
    if (st != QKV_OK) return st;
    const act_epi_ctx a = {b, act, then};
    const qkv_gemm_epi e = act_epi_of(&a);
    if (qkv_gemm_uses_cblas()) { /* the system BLAS has no epilogue: passes after it */
        qkv_status s = qkv_sgemm(0, 1, rows, out, in, 1.0f, x, in, w, in, 0.0f, y, out, threads);
        if (s != QKV_OK) return s;
        bias_job j = {y, (float *)b, rows, out, act};
        qkv_par_range(threads, rows, 4 * out, act_rows, &j);
        qkv_gemm_rows_after(&e, y, out, rows, threads);
        return QKV_OK;
    }
    return qkv_gemm_run_epi(qkv_gemm_kernel_active(), 0, 1, rows, out, in, 1.0f, x, in, w, in, 0.0f, y, out,
                            qkv_gemm_threads_for(rows, out, in, threads), &e);
}

qkv_status nn_linear_multi(const float *x, int64_t rows, int64_t in, int count, const float *const *w,
                           const float *const *b, const int64_t *out, float *const *y, int threads) {
    if (count < 0 || count > QKV_GEMM_MAX_SEGS || (count > 0 && (!w || !b || !out || !y)))
        return count < 0 || count > QKV_GEMM_MAX_SEGS ? QKV_ERR_BAD_SIZE : QKV_ERR_NULL_POINTER;
    if (rows < 0 || in < 0 || threads < 0) return QKV_ERR_BAD_SIZE;
    int64_t total = 0;
    for (int s = 0; s < count; s++) {
        qkv_status st = linear_check(x, rows, in, w[s], out[s], y[s], threads);
        if (st != QKV_OK) return st;
        if (out[s] > INT64_MAX - total) return QKV_ERR_SIZE_OVERFLOW;
        total += out[s];
    }
    if (qkv_gemm_uses_cblas()) {
        for (int s = 0; s < count; s++) {
            qkv_status st = nn_linear_act(x, rows, in, w[s], b[s], out[s], y[s], QKV_NN_ACT_NONE, threads);
            if (st != QKV_OK) return st;
        }
        return QKV_OK;
    }
    act_epi_ctx a[QKV_GEMM_MAX_SEGS];
    qkv_gemm_epi e[QKV_GEMM_MAX_SEGS];
    qkv_gemm_seg seg[QKV_GEMM_MAX_SEGS];
    for (int s = 0; s < count; s++) {
        a[s] = (act_epi_ctx){b[s], QKV_NN_ACT_NONE, NULL};
        e[s] = act_epi_of(&a[s]);
        seg[s] = (qkv_gemm_seg){w[s], in, y[s], out[s], out[s], b[s] ? &e[s] : NULL};
    }
    return qkv_gemm_run_segs(qkv_gemm_kernel_active(), 0, 1, rows, in, 1.0f, x, in, 0.0f, seg, count,
                             qkv_gemm_threads_for(rows, total, in, threads));
}

qkv_status nn_linear_bf16_act(const float *x, int64_t rows, const qkv_gemm_bf16_b *w, const float *b, float *y,
                              int act, int threads) {
    return nn_linear_bf16_act_then(x, rows, w, b, y, act, NULL, threads);
}

qkv_status nn_linear_bf16_act_then(const float *x, int64_t rows, const qkv_gemm_bf16_b *w, const float *b, float *y,
                                   int act, const nn_rows_step *then, int threads) {
    if (!w) return QKV_ERR_NULL_POINTER;
    if (rows < 0 || threads < 0) return QKV_ERR_BAD_SIZE;
    if ((rows > 0 && w->N > 0 && !y) || (rows > 0 && w->K > 0 && !x)) return QKV_ERR_NULL_POINTER;
    const act_epi_ctx a = {NULL, act, then}; /* the product adds b in its tiles */
    const qkv_gemm_epi e = act_epi_of(&a);
    return qkv_gemm_bf16_packed_epi(0, rows, 1.0f, x, w->K, w, 0.0f, y, w->N, b,
                                    qkv_gemm_threads_for(rows, w->N, w->K, threads), &e);
}

qkv_status nn_linear_backward_p(qkv_dtype prec, const float *x, const float *dy, int64_t rows, int64_t in,
                                int64_t out, const float *w, float *dw, float *db, float *dx, int accumulate_dx,
                                int threads) {
    qkv_status s;
    const int bf = prec == QKV_BF16;
    if (dw) {
        s = bf ? qkv_gemm_bf16(1, 0, out, in, rows, 1.0f, dy, out, x, in, 1.0f, dw, in, NULL, threads)
               : qkv_sgemm(1, 0, out, in, rows, 1.0f, dy, out, x, in, 1.0f, dw, in, threads);
        if (s != QKV_OK) return s;
    }
    if (db) {
        bias_job j = {(float *)dy, db, rows, out, 0};
        qkv_par_range(threads, out, rows, bias_grad_cols, &j);
    }
    if (!dx) return QKV_OK;
    const float beta = accumulate_dx ? 1.0f : 0.0f;
    return bf ? qkv_gemm_bf16(0, 0, rows, in, out, 1.0f, dy, out, w, in, beta, dx, in, NULL, threads)
              : qkv_sgemm(0, 0, rows, in, out, 1.0f, dy, out, w, in, beta, dx, in, threads);
}

qkv_status nn_linear_backward(const float *x, const float *dy, int64_t rows, int64_t in, int64_t out,
                              const float *w, float *dw, float *db, float *dx, int accumulate_dx, int threads) {
    return nn_linear_backward_p(QKV_F32, x, dy, rows, in, out, w, dw, db, dx, accumulate_dx, threads);
}
