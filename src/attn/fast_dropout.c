/* Attention dropout in the fast paths (see fast_dropout.h). The hash of
 * entry (b, h, i, j) is four splitmix64 steps (core/internal.h); the first
 * three depend on the query row only, so each tile hashes its rows' keys
 * once and the kernel does the last step per entry, vectorised over a row:
 * z = mix(R[r] + C[c]) with R + C = (the row's key) + j GAMMA + STEP_ADD.
 * The hashed i and j are the plan's rows plus its origins (q_origin,
 * k_origin: 0 but in a ring block, whose entries keep the whole problem's
 * factors). */
#include "attn/fast_dropout.h"

/* Columns per kernel call: any tile's width in one (FWD_LDS = 192). */
#define DROP_COLS 256

/* The hash after the steps of b and h. */
static uint64_t head_key(const fa_ctx *c, int64_t b, int64_t h) {
    return qkv_dropout_step(qkv_dropout_step(c->p->d.dropout_seed ^ QKV_DROPOUT_SEED_XOR, b), h);
}

/* The keys of the queries i0 .. i0+n-1 (after the step of i), plus add. */
static void query_keys(uint64_t hk, int64_t i0, int n, uint64_t add, uint64_t *out) {
    for (int r = 0; r < n; r++) out[r] = qkv_dropout_step(hk, i0 + r) + add;
}

/* The last step's term of the keys j0 .. j0+n-1, plus add. */
static void key_terms(int64_t j0, int n, uint64_t add, uint64_t *out) {
    for (int r = 0; r < n; r++) out[r] = (uint64_t)(j0 + r) * SPLITMIX64_GAMMA + add;
}

static float drop_scale(const fa_ctx *c) { return (float)(1.0 / (1.0 - c->p->d.dropout)); }

void fa_dropout_rows(const fa_ctx *c, int64_t b, int64_t h, int64_t i0, int nr, int64_t kt, int ncols, float *w,
                     size_t ld, const int *a, const int *e) {
    const qkv_kernels *K = c->K;
    const uint64_t thr = qkv_dropout_threshold(c->p->d.dropout);
    const float scale = drop_scale(c);
    uint64_t R[FA_BQ], C[DROP_COLS];
    query_keys(head_key(c, b, h), i0 + c->p->q_origin, nr, QKV_DROPOUT_STEP_ADD, R);
    for (int c0 = 0; c0 < ncols; c0 += DROP_COLS) {
        const int c1 = ncols - c0 < DROP_COLS ? ncols : c0 + DROP_COLS;
        key_terms(kt + c->p->k_origin + c0, c1 - c0, 0, C);
        /* Runs of rows with the same columns in one call. */
        for (int r = 0; r < nr;) {
            int x = a ? a[r] : 0, y = a ? e[r] : ncols, r1 = a ? r + 1 : nr;
            while (r1 < nr && a[r1] == x && e[r1] == y) r1++;
            if (x < c0) x = c0;
            if (y > c1) y = c1;
            if (y > x)
                K->dropout(w + (size_t)r * ld + x, NULL, ld, (size_t)(r1 - r), (size_t)(y - x), R + r, C + (x - c0),
                           thr, scale);
            r = r1;
        }
    }
}

void fa_dropout_cols(const fa_ctx *c, int64_t b, int64_t h, int64_t i0, int nqc, int64_t j0, int nkr, float *dp,
                     float *z, size_t ld) {
    uint64_t R[FA_BK], C[FA_BQ];
    key_terms(j0 + c->p->k_origin, nkr, QKV_DROPOUT_STEP_ADD, R);
    query_keys(head_key(c, b, h), i0 + c->p->q_origin, nqc, 0, C);
    c->K->dropout(dp, z, ld, (size_t)nkr, (size_t)nqc, R, C, qkv_dropout_threshold(c->p->d.dropout), drop_scale(c));
}

void fa_dropout_mul(float *s, const float *z, size_t ld, int nkr, int nqc) {
    for (int r = 0; r < nkr; r++)
        for (int i = 0; i < nqc; i++) s[(size_t)r * ld + i] *= z[(size_t)r * ld + i];
}
