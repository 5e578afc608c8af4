/* Shared pieces of the fast attention paths (see fast_common.h). */
#include <math.h>
#include <string.h>

#include "attn/fast_common.h"
#include "attn/fast_posbias.h"
#include "core/threads.h"

void *fa_alloc(size_t bytes) {
    if (bytes > SIZE_MAX - 64 - sizeof(void *)) return NULL;
    unsigned char *raw = qkv_alloc(bytes + 64 + sizeof(void *));
    if (!raw) return NULL;
    uintptr_t at = ((uintptr_t)(raw + sizeof(void *)) + 63) & ~(uintptr_t)63;
    unsigned char *user = (unsigned char *)at;
    memcpy(user - sizeof(void *), &raw, sizeof(void *));
    return user;
}

void fa_free(void *p) {
    if (!p) return;
    void *raw;
    memcpy(&raw, (unsigned char *)p - sizeof(void *), sizeof(void *));
    qkv_free(raw);
}

void fa_ctx_init(fa_ctx *c, const qkv_plan *p, const float *q, const float *k, const float *v) {
    const qkv_attn_desc *d = &p->d;
    memset(c, 0, sizeof *c);
    c->p = p;
    c->K = qkv_kernels_active();
    c->threads = qkv_threads_resolve(d->threads);
    if (c->threads > QKV_MAX_THREADS) c->threads = QKV_MAX_THREADS;
    c->B = d->batch;
    c->nq = d->n_q;
    c->nk = d->n_k;
    c->H = d->heads;
    c->Hkv = d->heads_kv;
    c->G = p->group;
    c->D = d->dim;
    c->Dv = d->dim_v;
    c->norm = d->norm;
    c->relu_div = d->relu_divide_by_count;
    c->cap = d->softcap;
    c->scale_nat = d->score == QKV_SCORE_SCALED_DOT ? d->scale
                   : d->score == QKV_SCORE_COSINE  ? 1.0 / d->temperature
                                                   : 1.0;
    if (d->bias_kind != QKV_BIAS_NONE) {
        c->bias = d->bias;
        c->bias_head_stride = d->bias_kind == QKV_BIAS_PER_HEAD ? d->n_q * d->n_k : 0;
    }
    c->natural = c->cap > 0.0 || c->bias || !(c->scale_nat > 0.0);
    c->sc = (float)((c->natural ? 1.0 : c->scale_nat) * FA_LOG2E);
    c->s2nat = c->natural ? 1.0 : c->scale_nat;
    c->q = c->q_in = q;
    c->k = c->k_in = k;
    c->v = v;
    c->ldq = c->H * c->D;
    c->ldk = c->Hkv * c->D;
    c->ldv = c->Hkv * c->Dv;
    c->ldo = c->H * c->Dv;
}

static void normalise_rows(float *dst, const float *src, int64_t rows, int64_t D) {
    for (int64_t r = 0; r < rows; r++) {
        const float *x = src + r * D;
        double ss = 0.0;
        for (int64_t t = 0; t < D; t++) ss += (double)x[t] * x[t];
        double n = sqrt(ss);
        double inv = 1.0 / (n > FA_COSINE_EPS ? n : FA_COSINE_EPS);
        for (int64_t t = 0; t < D; t++) dst[r * D + t] = (float)(x[t] * inv);
    }
}

size_t fa_normalised_bytes(const fa_ctx *c) {
    return qkv_round64((size_t)(c->B * c->nq * c->H * c->D) * sizeof(float)) +
           qkv_round64((size_t)(c->B * c->nk * c->Hkv * c->D) * sizeof(float));
}

void fa_normalise_into(fa_ctx *c, void *mem) {
    int64_t nqr = c->B * c->nq * c->H, nkr = c->B * c->nk * c->Hkv;
    float *qn = mem, *kn = (float *)(void *)((unsigned char *)mem + qkv_round64((size_t)(nqr * c->D) * sizeof(float)));
    normalise_rows(qn, c->q_in, nqr, c->D);
    normalise_rows(kn, c->k_in, nkr, c->D);
    c->q = qn;
    c->k = kn;
}

qkv_status fa_normalise_inputs(fa_ctx *c, void **mem) {
    *mem = fa_alloc(fa_normalised_bytes(c));
    if (!*mem) return QKV_ERR_OUT_OF_MEMORY;
    fa_normalise_into(c, *mem);
    return QKV_OK;
}

void fa_pack_block(const qkv_kernels *K, float *panels, int64_t pstride, float *rows, const float *src,
                   int64_t ld, int64_t b, int64_t n, int64_t nh, int64_t D, int64_t r0, int64_t r1, int stream) {
    /* Panels outer, heads inner: a panel's 32 rows of every head are 64 KB
     * of the source for 8 heads of 64, read whole before the next. */
    for (int64_t p0 = r0; panels && p0 < r1; p0 += QKV_PANEL)
        for (int64_t hh = 0; hh < nh; hh++)
            K->pack_panel(panels + (b * nh + hh) * pstride + p0 * D, src + (b * n + p0) * ld + hh * D,
                          (size_t)ld, (size_t)(n - p0 < QKV_PANEL ? n - p0 : QKV_PANEL), (size_t)D, stream);
    /* Rows of whole lines streamed (x * 1 is x); other widths would share
     * a line between rows, which stays with ordinary stores. */
    const int stream_rows = stream && D % 16 == 0;
    for (int64_t r = r0; rows && r < r1; r++)
        for (int64_t hh = 0; hh < nh; hh++) {
            float *dst = rows + ((b * nh + hh) * n + r) * D;
            const float *from = src + (b * n + r) * ld + hh * D;
            if (stream_rows) K->scale_stream(dst, from, 1.0f, (size_t)D);
            else memcpy(dst, from, (size_t)D * sizeof(float));
        }
    if (stream) K->stream_fence();
}

/* Unit: FA_PACK_ROWS keys of one batch, every kv head. */
static void pack_kv_unit(void *ctx, int64_t u, int t) {
    (void)t;
    fa_ctx *c = ctx;
    const int64_t nkb = (c->nk + FA_PACK_ROWS - 1) / FA_PACK_ROWS, b = u / nkb, r0 = u % nkb * FA_PACK_ROWS;
    const int64_t r1 = c->nk - r0 < FA_PACK_ROWS ? c->nk : r0 + FA_PACK_ROWS;
    fa_pack_block(c->K, c->kt, c->kt_stride, NULL, c->k, c->ldk, b, c->nk, c->Hkv, c->D, r0, r1, c->stream_pack);
    if (c->vr_own)
        fa_pack_block(c->K, NULL, 0, c->vr_own, c->v, c->ldv, b, c->nk, c->Hkv, c->Dv, r0, r1, c->stream_pack);
}

qkv_status fa_kv_alloc(fa_ctx *c, size_t extra_bytes, void **extra) {
    int64_t np = (c->nk + QKV_PANEL - 1) / QKV_PANEL;
    c->kt_stride = np * QKV_PANEL * c->D;
    /* One block for both and the caller's extra (freed with fa_free(c->kt)):
     * one large block that comes back at every call lets malloc keep it
     * mapped between calls (glibc raises its mmap and trim thresholds to the
     * largest block freed), where two blocks were unmapped or trimmed off the
     * heap and faulted in afresh each time (1000 page faults, ~5% of a
     * forward at n = 1024, 8 heads; with the per-thread tiles apart, 5-78
     * faults per call below ~1 MB, e.g. 8 heads at n = 64). */
    size_t kt_bytes = qkv_round64((size_t)(c->kt_stride * c->B * c->Hkv) * sizeof(float));
    const int copy_v = c->Hkv > 1 && !c->v_direct;
    size_t vr_bytes = copy_v ? qkv_round64((size_t)(c->nk * c->Dv * c->B * c->Hkv) * sizeof(float)) : 0;
    if (extra_bytes > SIZE_MAX - kt_bytes - vr_bytes) return QKV_ERR_OUT_OF_MEMORY;
    c->kt = fa_alloc(kt_bytes + vr_bytes + extra_bytes);
    if (!c->kt) return QKV_ERR_OUT_OF_MEMORY;
    *extra = (unsigned char *)c->kt + kt_bytes + vr_bytes;
    c->stream_pack = kt_bytes + vr_bytes >= FA_PACK_STREAM_MIN_BYTES;
    if (copy_v) c->vr_own = (float *)(void *)((unsigned char *)c->kt + kt_bytes);
    c->vr = copy_v ? c->vr_own : c->v;
    return QKV_OK;
}

void fa_pack_kv(fa_ctx *c) {
    qkv_parallel_for(c->threads, c->B * ((c->nk + FA_PACK_ROWS - 1) / FA_PACK_ROWS), pack_kv_unit, c);
}

int fa_range_bounds(const int64_t *lo, const int64_t *hi, int n, int64_t *blo, int64_t *bhi) {
    int any = 0;
    int64_t l0 = INT64_MAX, h0 = 0;
    for (int r = 0; r < n; r++)
        if (lo[r] < hi[r]) {
            any = 1;
            if (lo[r] < l0) l0 = lo[r];
            if (hi[r] > h0) h0 = hi[r];
        }
    *blo = any ? l0 : 0;
    *bhi = any ? h0 : 0;
    return any;
}

int fa_query_ranges(const fa_ctx *c, int64_t b, int64_t i0, int n, int64_t *lo, int64_t *hi,
                    int64_t *blo, int64_t *bhi) {
    for (int r = 0; r < n; r++) qkv_plan_key_range(c->p, b, i0 + r, &lo[r], &hi[r]);
    return fa_range_bounds(lo, hi, n, blo, bhi);
}

/* Tile entries [x, y) of one row (or column) to natural logits: times the
 * scale, then the soft-cap (its derivative into dr when given), then the
 * bias, read every bstride floats. */
static inline void natural_logits(const fa_ctx *c, float *row, int x, int y, float *dr, const float *bias,
                                  int64_t bstride) {
    double sn = c->scale_nat;
    if (c->cap > 0.0) {
        for (int i = x; i < y; i++) {
            double t = tanh((double)row[i] * sn / c->cap);
            row[i] = (float)(c->cap * t);
            if (dr) dr[i] = (float)(1.0 - t * t);
        }
    } else if (bstride == 1 || !bias) {
        if (y > x) c->K->scale_bias(row + x, (size_t)(y - x), sn, bias ? bias + x : NULL);
        return;
    } else {
        for (int i = x; i < y; i++) row[i] = (float)((double)row[i] * sn);
    }
    if (bias)
        for (int i = x; i < y; i++) row[i] += bias[(int64_t)i * bstride];
}

void fa_scores_rows(const fa_ctx *c, float *s, size_t lds, int64_t h, int64_t i0, int nr,
                    int64_t kt, int ncols, const int64_t *lo, const int64_t *hi, int *a, int *e,
                    float *dcap, size_t ldd) {
    const float ninf = -INFINITY;
    for (int r = 0; r < nr; r++) {
        float *row = s + (size_t)r * lds;
        fa_tile_range(lo[r], hi[r], kt, ncols, &a[r], &e[r]);
        const int x = a[r], y = e[r];
        if (c->natural)
            natural_logits(c, row, x, y, dcap ? dcap + (size_t)r * ldd : NULL,
                           c->bias ? c->bias + h * c->bias_head_stride + (i0 + r) * c->nk + kt : NULL, 1);
        if (c->pb) fa_posbias_rows(c, row, lds, h, i0 + r, 1, kt, ncols, &a[r], &e[r]);
        for (int64_t j = 0; j < x; j++) row[j] = ninf;
        for (int64_t j = y; j < ncols; j++) row[j] = ninf;
    }
}

void fa_scores_cols(const fa_ctx *c, float *s, size_t lds, int64_t h, int64_t i0, int nqc,
                    int64_t j0, int nkr, const int64_t *lo, const int64_t *hi, int interior,
                    int *a, int *e, float *dcap, size_t ldd) {
    const float ninf = -INFINITY;
    /* With lo and hi nondecreasing over the tile's queries (every mask but
     * packed sequences' empty rows), key j's queries are [s, p): s the first
     * with hi > j, p the first with lo > j; both only grow with j, so two
     * pointers find them in O(nkr + nqc) instead of a scan per key. */
    int mono = !interior;
    for (int i = 1; mono && i < nqc; i++) mono = lo[i - 1] <= lo[i] && hi[i - 1] <= hi[i];
    int sp = 0, pp = 0;
    for (int r = 0; r < nkr; r++) {
        float *row = s + (size_t)r * lds;
        int64_t j = j0 + r;
        int x = 0, y = nqc;
        if (mono) {
            while (sp < nqc && hi[sp] <= j) sp++;
            while (pp < nqc && lo[pp] <= j) pp++;
            x = sp < pp ? sp : nqc;
            y = sp < pp ? pp : nqc;
        } else if (!interior) {
            while (x < nqc && !(lo[x] <= j && j < hi[x])) x++;
            y = x;
            while (y < nqc && lo[y] <= j && j < hi[y]) y++;
        }
        if (!interior) {
            for (int i = 0; i < x; i++) row[i] = ninf;
            for (int i = y; i < nqc; i++) row[i] = ninf;
        }
        a[r] = x;
        e[r] = y;
        if (c->natural)
            natural_logits(c, row, x, y, dcap ? dcap + (size_t)r * ldd : NULL,
                           c->bias ? c->bias + h * c->bias_head_stride + i0 * c->nk + j : NULL, c->nk);
        if (c->pb) fa_posbias_col(c, row, h, j, i0, x, y);
    }
}

void fa_pv_ranges(const fa_ctx *c, float *o, size_t ldo, const float *alpha, const float *p,
                  size_t ldp, size_t pcs, const float *v, size_t ldv, size_t dv, const int *a, const int *e,
                  int nvalid) {
    const qkv_kernels *K = c->K;
    int c0 = 0, c1 = INT32_MAX;
    for (int r = 0; r < nvalid; r++) {
        if (a[r] > c0) c0 = a[r];
        if (e[r] < c1) c1 = e[r];
    }
    if (c0 < c1) {
        K->pv(o, ldo, alpha, p + c0 * pcs, ldp, pcs, v + (size_t)c0 * ldv, ldv, (size_t)(c1 - c0), dv, 8);
        for (int r = 0; r < nvalid; r++) {
            if (a[r] < c0)
                K->pv(o + r * ldo, ldo, NULL, p + r * ldp + a[r] * pcs, ldp, pcs, v + (size_t)a[r] * ldv, ldv,
                      (size_t)(c0 - a[r]), dv, 1);
            if (e[r] > c1)
                K->pv(o + r * ldo, ldo, NULL, p + r * ldp + c1 * pcs, ldp, pcs, v + (size_t)c1 * ldv, ldv,
                      (size_t)(e[r] - c1), dv, 1);
        }
    } else {
        if (alpha) K->pv(o, ldo, alpha, p, ldp, pcs, v, ldv, 0, dv, 8);
        for (int r = 0; r < nvalid; r++)
            if (e[r] > a[r])
                K->pv(o + r * ldo, ldo, NULL, p + r * ldp + a[r] * pcs, ldp, pcs, v + (size_t)a[r] * ldv, ldv,
                      (size_t)(e[r] - a[r]), dv, 1);
    }
}

/* Rows [j0, j1) of v (dv floats each, stride ldv) all finite. */
static int rows_finite(const qkv_kernels *K, const float *v, size_t ldv, size_t dv, int j0, int j1) {
    if (j1 <= j0) return 1;
    if (ldv == dv) return K->all_finite(v + (size_t)j0 * ldv, (size_t)(j1 - j0) * dv);
    for (int j = j0; j < j1; j++)
        if (!K->all_finite(v + (size_t)j * ldv, dv)) return 0;
    return 1;
}

void fa_pv_zeros(const fa_ctx *c, float *o, size_t ldo, const float *alpha, const float *p, size_t ldp,
                 size_t pcs, const float *v, size_t ldv, size_t dv, const int *a, const int *e, int nvalid) {
    const qkv_kernels *K = c->K;
    int lo = INT32_MAX, hi = 0, c0 = 0, c1 = INT32_MAX;
    for (int r = 0; r < nvalid; r++) {
        if (a[r] > c0) c0 = a[r];
        if (e[r] < c1) c1 = e[r];
        if (e[r] <= a[r]) continue;
        if (a[r] < lo) lo = a[r];
        if (e[r] > hi) hi = e[r];
    }
    if (hi == 0 || (c0 == lo && c1 == hi) ||
        (c0 < c1 ? rows_finite(K, v, ldv, dv, lo, c0) && rows_finite(K, v, ldv, dv, c1, hi)
                 : rows_finite(K, v, ldv, dv, lo, hi))) {
        if (hi == 0) lo = 0;
        K->pv(o, ldo, alpha, p + (size_t)lo * pcs, ldp, pcs, v + (size_t)lo * ldv, ldv, (size_t)(hi - lo), dv, 8);
        return;
    }
    fa_pv_ranges(c, o, ldo, alpha, p, ldp, pcs, v, ldv, dv, a, e, nvalid);
}

void fa_normalise_backward(const float *x, float *g, int64_t D) {
    double ss = 0.0, dot = 0.0;
    for (int64_t t = 0; t < D; t++) ss += (double)x[t] * x[t];
    double n = sqrt(ss);
    if (n <= FA_COSINE_EPS) {
        for (int64_t t = 0; t < D; t++) g[t] = (float)(g[t] / FA_COSINE_EPS);
        return;
    }
    for (int64_t t = 0; t < D; t++) dot += (double)x[t] * g[t];
    for (int64_t t = 0; t < D; t++) g[t] = (float)((g[t] - x[t] * dot / ss) / n);
}
