/* The fast paths' in-kernel position biases (see fast_posbias.h). */
#include <math.h>
#include <string.h>

#include "attn/fast_posbias.h"

static int all_finite(const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

int fa_posbias_supported(const qkv_plan *p) {
    const qkv_attn_desc *d = &p->d;
    if (d->rel_table && d->rel2d_width > 0) return 0;
    if (d->alibi_slopes && !all_finite(d->alibi_slopes, d->heads)) return 0;
    if (d->rel_table && !all_finite(d->rel_table, p->n_rel_elems)) return 0;
    return 1;
}

qkv_status fa_posbias_init(fa_ctx *c) {
    const qkv_attn_desc *d = &c->p->d;
    c->pb = NULL;
    if (!d->alibi_slopes && !d->rel_table) return QKV_OK;
    /* Visible keys lie in [0, n_k): offsets in [-max pos, n_k - 1 - min pos]
     * ([1 - n_k, n_q - 1] for the API's alignment, packed or not). */
    int64_t pmin = INT64_MAX, pmax = INT64_MIN;
    for (int64_t i = 0; i < c->nq; i++) {
        int64_t x = qkv_plan_query_position(c->p, i);
        if (x < pmin) pmin = x;
        if (x > pmax) pmax = x;
    }
    const int64_t n_off = c->nk + pmax - pmin, H = c->H;
    size_t at_pos = qkv_round64(sizeof(fa_posbias));
    size_t at_tab = at_pos + qkv_round64((size_t)c->nq * sizeof(int64_t));
    size_t at_bkt = at_tab + qkv_round64((size_t)(H * n_off) * sizeof(float));
    size_t bytes = at_bkt + (d->rel_table ? (size_t)n_off * sizeof(int32_t) : 0);
    unsigned char *blk = fa_alloc(bytes);
    if (!blk) return QKV_ERR_OUT_OF_MEMORY;
    fa_posbias *pb = (fa_posbias *)(void *)blk;
    pb->pos = (int64_t *)(void *)(blk + at_pos);
    pb->tab = (float *)(void *)(blk + at_tab);
    pb->bucket = d->rel_table ? (int32_t *)(void *)(blk + at_bkt) : NULL;
    pb->n_off = n_off;
    pb->omin = -pmax;
    pb->linear = 1;
    for (int64_t i = 0; i < c->nq; i++) {
        pb->pos[i] = qkv_plan_query_position(c->p, i);
        pb->linear &= pb->pos[i] - i == pb->pos[0];
    }
    pb->shift = pb->pos[0];
    if (pb->bucket)
        for (int64_t x = 0; x < n_off; x++)
            pb->bucket[x] = (int32_t)qkv_relpos_bucket(pb->omin + x, d->rel_buckets, d->rel_max_distance,
                                                       d->rel_bidirectional);
    /* Natural bias in double (as the reference adds it), divided by the
     * tile's scale, rounded once. */
    const float *slopes = d->alibi_slopes, *rel = d->rel_table;
    const double inv = 1.0 / c->s2nat;
    for (int64_t h = 0; h < H; h++) {
        float *t = pb->tab + h * n_off;
        const double slope = slopes ? (double)slopes[h] : 0.0;
        const float *rh = rel ? rel + h * d->rel_buckets : NULL;
        for (int64_t x = 0; x < n_off; x++) {
            int64_t o = pb->omin + x;
            double b = -slope * (double)(o < 0 ? -o : o);
            if (rh) b += (double)rh[pb->bucket[x]];
            t[x] = (float)(b * inv);
        }
    }
    c->pb = pb;
    return QKV_OK;
}

void fa_posbias_free(fa_ctx *c) {
    fa_free((void *)(uintptr_t)c->pb);
    c->pb = NULL;
}

/* row[x..y) += t[x..y) */
static inline void add_run(float *restrict row, const float *restrict t, int x, int y) {
    for (int i = x; i < y; i++) row[i] += t[i];
}

void fa_posbias_rows(const fa_ctx *c, float *s, size_t lds, int64_t h, int64_t i0, int nr, int64_t kt,
                     int ncols, const int *a, const int *e) {
    const fa_posbias *pb = c->pb;
    const float *tab = pb->tab + h * pb->n_off;
    for (int r = 0; r < nr; r++) {
        const int x = a ? a[r] : 0, y = a ? e[r] : ncols;
        if (y <= x) continue;
        /* Column col is the offset kt + col - pos: the slice starts at
         * column 0's offset (only [x, y) of it is read, all in range). */
        const int64_t k0 = kt - pb->pos[i0 + r] - pb->omin;
        add_run(s + (size_t)r * lds + x, tab + k0 + x, 0, y - x);
    }
}

void fa_posbias_col(const fa_ctx *c, float *row, int64_t h, int64_t j, int64_t i0, int x, int y) {
    const fa_posbias *pb = c->pb;
    const float *restrict tab = pb->tab + h * pb->n_off;
    float *restrict rw = row;
    if (pb->linear) {
        const int64_t k0 = j - pb->shift - i0 - pb->omin;
        for (int i = x; i < y; i++) rw[i] += tab[k0 - i];
    } else {
        const int64_t *pos = pb->pos + i0, k0 = j - pb->omin;
        for (int i = x; i < y; i++) rw[i] += tab[k0 - pos[i]];
    }
}

/* Layout of the partial sums' block: the sums, then H rel_buckets doubles
 * for the reduction. */
static size_t part_floats(const fa_ctx *c, int64_t chunks) { return (size_t)(chunks * c->B * c->H * c->pb->n_off); }

float *fa_posbias_grad_alloc(const fa_ctx *c, int64_t chunks) {
    size_t nf = qkv_round64(part_floats(c, chunks) * sizeof(float));
    size_t bytes = nf + (size_t)(c->H * c->p->d.rel_buckets) * sizeof(double);
    float *part = fa_alloc(bytes);
    if (part) memset(part, 0, nf);
    return part;
}

void fa_posbias_grad_tile(const fa_ctx *c, float *part, int64_t ch, int64_t b, int64_t h, const float *ds,
                          size_t ld, int64_t i0, int64_t j0, int nkr, const int *a, const int *e) {
    const fa_posbias *pb = c->pb;
    float *restrict slot = part + ((ch * c->B + b) * c->H + h) * pb->n_off;
    for (int r = 0; r < nkr; r++) {
        const float *restrict dr = ds + (size_t)r * ld;
        const int x = a[r], y = e[r];
        if (pb->linear) {
            const int64_t k0 = j0 + r - pb->shift - i0 - pb->omin;
            for (int i = x; i < y; i++) slot[k0 - i] += dr[i];
        } else {
            const int64_t *pos = pb->pos + i0, k0 = j0 + r - pb->omin;
            for (int i = x; i < y; i++) slot[k0 - pos[i]] += dr[i];
        }
    }
}

void fa_posbias_grad_reduce(const fa_ctx *c, const float *part, int64_t chunks, float *drel) {
    const fa_posbias *pb = c->pb;
    const int64_t nb = c->p->d.rel_buckets, n_off = pb->n_off;
    double *acc = (double *)(void *)((unsigned char *)(uintptr_t)part +
                                     qkv_round64(part_floats(c, chunks) * sizeof(float)));
    memset(acc, 0, (size_t)(c->H * nb) * sizeof(double));
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t ch = 0; ch < chunks; ch++)
            for (int64_t h = 0; h < c->H; h++) {
                const float *slot = part + ((ch * c->B + b) * c->H + h) * n_off;
                double *ah = acc + h * nb;
                for (int64_t x = 0; x < n_off; x++) ah[pb->bucket[x]] += slot[x];
            }
    for (int64_t t = 0; t < c->H * nb; t++) drel[t] = (float)acc[t];
}
