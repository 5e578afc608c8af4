#include "similarity.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

double sim_cosine(const float *x, const float *y, int64_t dim) {
    double dot = 0, xx = 0, yy = 0;
    for (int64_t c = 0; c < dim; c++) {
        dot += (double)x[c] * y[c];
        xx += (double)x[c] * x[c];
        yy += (double)y[c] * y[c];
    }
    return dot / sqrt(xx * yy);
}

typedef struct {
    double v;
    int64_t i;
} keyed;

static int by_value(const void *a, const void *b) {
    double x = ((const keyed *)a)->v, y = ((const keyed *)b)->v;
    return (x > y) - (x < y);
}

/* The ranks (1..n, ties averaged) of v[0..n) into r; k is scratch [n]. */
static void ranks(const double *v, int64_t n, keyed *k, double *r) {
    for (int64_t i = 0; i < n; i++) k[i].v = v[i], k[i].i = i;
    qsort(k, (size_t)n, sizeof *k, by_value);
    for (int64_t a = 0; a < n;) {
        int64_t b = a + 1;
        while (b < n && k[b].v == k[a].v) b++;
        double mid = (double)(a + 1 + b) / 2.0; /* the mean of ranks a + 1 .. b */
        for (int64_t t = a; t < b; t++) r[k[t].i] = mid;
        a = b;
    }
}

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Rows of x [n, dim] scaled to unit length, in double. */
static double *unit_rows(const float *x, int64_t n, int64_t dim) {
    double *u = malloc((size_t)(n * dim) * sizeof *u);
    if (!u) return NULL;
    for (int64_t i = 0; i < n; i++) {
        double ss = 0;
        for (int64_t c = 0; c < dim; c++) ss += (double)x[i * dim + c] * x[i * dim + c];
        double s = ss > 0 ? 1.0 / sqrt(ss) : 0.0;
        for (int64_t c = 0; c < dim; c++) u[i * dim + c] = x[i * dim + c] * s;
    }
    return u;
}

static double dot_of(const double *a, const double *b, int64_t dim) {
    double d = 0;
    for (int64_t c = 0; c < dim; c++) d += a[c] * b[c];
    return d;
}

int sim_rho(const float *q, const float *r, int64_t n, int64_t dim, int64_t pairs, uint64_t seed, double *rho) {
    *rho = 0;
    if (!q || !r || n < 2 || dim < 1 || pairs < 0) return -1;
    int64_t np = pairs ? pairs : n * (n - 1) / 2;
    double *uq = unit_rows(q, n, dim), *ur = unit_rows(r, n, dim);
    /* calloc: every element is written below, but the compiler cannot see that np > 0 */
    double *a = calloc((size_t)np, sizeof *a), *b = calloc((size_t)np, sizeof *b);
    double *ra = malloc((size_t)np * sizeof *ra), *rb = malloc((size_t)np * sizeof *rb);
    keyed *k = malloc((size_t)np * sizeof *k);
    int rc = -1;
    if (!uq || !ur || !a || !b || !ra || !rb || !k) goto done;
    if (pairs) { /* sampled pairs, any i != j */
        uint64_t s = seed;
        for (int64_t p = 0; p < np; p++) {
            int64_t i = (int64_t)(splitmix(&s) % (uint64_t)n);
            int64_t j = (int64_t)(splitmix(&s) % (uint64_t)(n - 1));
            j += j >= i;
            a[p] = dot_of(uq + i * dim, uq + j * dim, dim);
            b[p] = dot_of(ur + i * dim, ur + j * dim, dim);
        }
    } else { /* every pair i < j in order */
        int64_t p = 0;
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = i + 1; j < n; j++, p++) {
                a[p] = dot_of(uq + i * dim, uq + j * dim, dim);
                b[p] = dot_of(ur + i * dim, ur + j * dim, dim);
            }
    }
    ranks(a, np, k, ra);
    ranks(b, np, k, rb);
    double d2 = 0;
    for (int64_t p = 0; p < np; p++) d2 += (ra[p] - rb[p]) * (ra[p] - rb[p]);
    *rho = 1 - 6 * d2 / ((double)np * ((double)np * (double)np - 1));
    rc = 0;
done:
    free(uq);
    free(ur);
    free(a);
    free(b);
    free(ra);
    free(rb);
    free(k);
    return rc;
}

int sim_agree(const float *q, const float *r, int64_t n, int64_t dim, double margin, sim_agreement *out) {
    memset(out, 0, sizeof *out);
    if (!q || !r || n < 2 || dim < 1) return -1;
    double *uq = unit_rows(q, n, dim), *ur = unit_rows(r, n, dim);
    int rc = -1;
    if (!uq || !ur) goto done;
    out->worst_cosine = 2;
    for (int64_t i = 0; i < n; i++) {
        double c = dot_of(uq + i * dim, ur + i * dim, dim);
        out->mean_cosine += c / (double)n;
        if (c < out->worst_cosine) out->worst_cosine = c, out->worst_at = (int)i;
        int64_t nq = -1, nr = -1;
        double bq = -3, br = -3, br2 = -3;
        for (int64_t j = 0; j < n; j++) {
            if (j == i) continue;
            double cq = dot_of(uq + i * dim, uq + j * dim, dim), cr = dot_of(ur + i * dim, ur + j * dim, dim);
            if (cq > bq) bq = cq, nq = j;
            if (cr > br) br2 = br, br = cr, nr = j;
            else if (cr > br2) br2 = cr;
        }
        out->kept += nq == nr;
        if (br - br2 > margin) {
            out->clear++;
            out->clear_lost += nq != nr;
        }
    }
    out->pairs = n * (n - 1) / 2;
    rc = sim_rho(q, r, n, dim, 0, 0, &out->rho);
done:
    free(uq);
    free(ur);
    if (rc) memset(out, 0, sizeof *out);
    return rc;
}
