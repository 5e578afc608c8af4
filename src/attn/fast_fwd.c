/* Fast forward (FlashAttention-2, Dao 2023, on CPU). Work unit: one block of
 * FA_BQ query rows of one (b, h). For each tile of FA_BK keys (the last up to
 * FA_BK + FA_BQ) that some row of the block can see: S = Q K^T (kernel),
 * soft-cap / bias / mask, one online-softmax step (running max from -inf,
 * rescale alpha), O = alpha O + P V (kernel). Tiles outside every row's key
 * range are never touched, so a causal mask costs about half and a window of
 * width r costs O(n r D). Two schedules: when one kv head's packed K and V
 * are small (FWD_HEAD_SLOT_MAX_BYTES) a thread owns a head at a time, packs
 * it into a slot of its own and runs its units (head_sched.h); otherwise K
 * is packed once per call and, with several heads, V copied per head
 * (O(n D) each, fa_pack_kv) before any unit starts. Packed sequences: a
 * block never straddles two (qkv_plan_query_blocks); when every sequence
 * fits one block V is read in place, and when each block's keys also fit
 * one tile the block packs them itself (a third schedule: nothing packed
 * before the units, every tile inside the mask; a unit is then one block of
 * one batch row with all its heads in turn, its rows of Q, K, V and O
 * prefetched into L2 first, and its key ranges found once for all heads).
 * Memory: that, per-thread tiles; the attention matrix only when the caller
 * passes one, filled block by block from the saved log-sum-exp in a second
 * sweep over the block's tiles. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attn/fast.h"
#include "attn/fast_common.h"
#include "attn/fast_posbias.h"
#include "attn/fast_dropout.h"
#include "attn/head_sched.h"
#include "core/threads.h"

/* Row stride of the score tiles: the last tile of a block may take up to
 * FA_BQ keys beyond FA_BK, so that a causal block's 64-key diagonal joins the
 * tile before it instead of being a tile of its own (each tile costs the
 * softmax's per-row work and the rescale of O whatever its width): paired
 * causal/full at n = 1024 0.544-0.554 against 0.554-0.557, 4 alternating
 * rounds, lower in each. */
#define FWD_LDS (FA_BK + FA_BQ)

/* Keys in the tile at kt of a block that sees keys below bhi: FA_BK, or all
 * the rest when it fits in FWD_LDS. */
static int tile_cols(int64_t kt, int64_t bhi) {
    int64_t rest = bhi - kt;
    return (int)(rest <= FWD_LDS ? rest : FA_BK);
}

/* Outputs from this size on whose rows all start on a 64-byte boundary
 * (out aligned, Dv a multiple of 16) are stored with streaming stores
 * (K->scale_stream): the rows of a [B, n, H, Dv] output are written once,
 * one head at a time, H * Dv floats apart, and each line was first read for
 * ownership, from memory at these sizes (the call's own traffic evicts it).
 * Against ordinary stores, alternating in one process, 2 threads, 8 heads of
 * 64, n = 512 and 1024: causal 2-4% and full 1.5-3% faster. Rows that do
 * not start on a line (out from plain malloc: 16 bytes past one) share
 * their end lines with the neighbouring head's row, written by another
 * unit: streaming the lines between was 0.5-1% slower there, so such
 * outputs keep ordinary stores. Below this size O stays in cache for the
 * caller's next step, which streaming would send to memory. */
#define FWD_STREAM_MIN_BYTES (256.0 * 1024.0)

/* Heads owned by threads (head_sched.h) when one kv head's packed K and V
 * take at most this: n <= 1024 at D = 64, half of a Zen 4 core's 1 MB
 * L2. Against packing every head first, in one process alternating
 * calls, 2 threads, 8 heads of 64 (medians of 25-200 rounds): n = 64 and
 * 128 full 37-46% faster (one parallel loop instead of two); n = 512 full
 * 1-4%, causal 1-5%; n = 1024 full 0.4-5%, causal 3.5-4.3% (paired ratio
 * 0.542 -> 0.529); n = 1536 within 1.5%, n = 2048 and 4096 mixed. */
#define FWD_HEAD_SLOT_MAX_BYTES ((size_t)512 * 1024)

int qkv_fast_supported(const qkv_plan *p) {
    return p->d.dtype == QKV_F32 && p->d.score != QKV_SCORE_ADDITIVE && fa_posbias_supported(p);
}

typedef struct fwd_ctx {
    fa_ctx c;
    float *out, *attn, *lse;
    float *m2, *lg2;      /* base-2 statistics for the backward, or NULL */
    int64_t nqb;          /* query blocks per (b, h) */
    int64_t *qstart;      /* packed: block u's rows start at qstart[u] (qkv_plan_query_blocks); else NULL */
    int klocal;           /* each block packs the keys it sees into its own panels (fwd_local_ok) */
    int64_t ldob;         /* row stride of the O accumulator */
    int stream;           /* O stored with streaming stores (FWD_STREAM_MIN_BYTES) */
    unsigned char *ws;    /* per-thread workspace */
    size_t ws_stride;
    size_t slot_kt;       /* head mode: bytes of K panels before the V rows in a slot */
} fwd_ctx;

typedef struct fwd_ws {
    float *qb, *s, *pw, *o, *m, *l, *alpha, *cnt;
    int64_t *lo, *hi;
    int *a, *e, *holes;
    unsigned char *vis;
    int *ga, *ge; /* per group of 8 rows (tile_groups) */
    float *kloc;  /* klocal: the block's keys in panels */
} fwd_ws;

static size_t fwd_ws_layout(const fwd_ctx *f, unsigned char *base, fwd_ws *w) {
    size_t at = 0;
    QKV_CARVE(qb, float, FA_BQ * f->c.D);
    QKV_CARVE(s, float, FA_BQ * FWD_LDS);
    QKV_CARVE(pw, float, FA_BQ * FWD_LDS);
    QKV_CARVE(o, float, FA_BQ * f->ldob);
    QKV_CARVE(m, float, FA_BQ);
    QKV_CARVE(l, float, FA_BQ);
    QKV_CARVE(alpha, float, FA_BQ);
    QKV_CARVE(cnt, float, FA_BQ);
    QKV_CARVE(lo, int64_t, FA_BQ);
    QKV_CARVE(hi, int64_t, FA_BQ);
    QKV_CARVE(a, int, FA_BQ);
    QKV_CARVE(e, int, FA_BQ);
    QKV_CARVE(holes, int, FA_BQ);
    QKV_CARVE(vis, unsigned char, FA_BQ * FWD_LDS);
    QKV_CARVE(ga, int, FA_BQ / 8);
    QKV_CARVE(ge, int, FA_BQ / 8);
    QKV_CARVE(kloc, float, f->klocal ? FWD_LDS * f->c.D : 0);
    return at;
}

/* Elementwise weights of the ReLU and sigmoid normalisers from log2-unit
 * logits (masked = -inf gives exactly 0; NaN propagates as in the reference). */
static void elementwise_weights(const fa_ctx *c, const float *s, float *w, int a, int e) {
    for (int j = a; j < e; j++) {
        float x = s[j];
        if (x == -INFINITY) {
            w[j] = 0.0f;
            continue;
        }
        double xn = (double)x * c->s2nat;
        if (c->norm == QKV_NORM_RELU) w[j] = xn < 0.0 ? 0.0f : (float)xn;
        else w[j] = (float)(1.0 / (1.0 + exp(-xn)));
    }
}

/* With a bias, keys inside a row's range may still be masked (-inf bias):
 * record which, so that their values are never multiplied (not even by 0, so
 * a NaN there cannot leak in). A row whose range is all finite (the vector
 * all_finite: most rows of most biases) has none; the others are scanned.
 * holes[r]: whether row r has one (then vis marks its visible entries of
 * [a, e); otherwise vis is not written). Returns whether any row has. */
static int find_holes(const qkv_kernels *K, const float *s, int nr, const int *a, const int *e,
                      unsigned char *vis, int *holes) {
    int any = 0;
    for (int r = 0; r < nr; r++) {
        const float *sr = s + (size_t)r * FWD_LDS;
        unsigned char *vr = vis + (size_t)r * FWD_LDS;
        int h = 0;
        if (e[r] > a[r] && !K->all_finite(sr + a[r], (size_t)(e[r] - a[r])))
            for (int j = a[r]; j < e[r]; j++) {
                vr[j] = sr[j] != -INFINITY;
                h |= !vr[j];
            }
        holes[r] = h;
        any |= h;
    }
    return any;
}

/* o (8 rows) = alpha o + p v over the visible runs of each row. */
static void pv_holes(const fa_ctx *c, float *o, size_t ldo, const float *alpha, const float *p,
                     const float *v, size_t ldv, size_t dv, const int *a, const int *e,
                     const unsigned char *vis, const int *holes, int nvalid) {
    const qkv_kernels *K = c->K;
    if (alpha) K->pv(o, ldo, alpha, p, FWD_LDS, 1, v, ldv, 0, dv, 8);
    for (int r = 0; r < nvalid; r++) {
        const unsigned char *vr = vis + (size_t)r * FWD_LDS;
        if (!holes[r]) {
            if (e[r] > a[r])
                K->pv(o + r * ldo, ldo, NULL, p + (size_t)r * FWD_LDS + a[r], FWD_LDS, 1, v + (size_t)a[r] * ldv,
                      ldv, (size_t)(e[r] - a[r]), dv, 1);
            continue;
        }
        for (int j = a[r]; j < e[r];) {
            if (!vr[j]) {
                j++;
                continue;
            }
            int j1 = j;
            while (j1 < e[r] && vr[j1]) j1++;
            K->pv(o + r * ldo, ldo, NULL, p + (size_t)r * FWD_LDS + j, FWD_LDS, 1, v + (size_t)j * ldv, ldv,
                  (size_t)(j1 - j), dv, 1);
            j = j1;
        }
    }
}

/* Per group of 8 rows g: the union [ga, ge) of its valid rows' visible
 * columns of the tile (from lo, hi; ga = ge = 0 if none). Returns whether
 * any group needs fewer than all np panels (then the tile is computed group
 * by group). */
static int tile_groups(fwd_ws *w, int nr, int rows, int64_t kt, int ncols, int np) {
    int partial = 0;
    for (int g = 0; g < rows; g += 8) {
        int ga = INT32_MAX, ge = 0;
        for (int r = g; r < g + 8 && r < nr; r++) {
            int64_t x = w->lo[r] - kt, y = w->hi[r] - kt;
            if (x < 0) x = 0;
            if (y > ncols) y = ncols;
            if (y <= x) continue;
            if (x < ga) ga = (int)x;
            if (y > ge) ge = (int)y;
        }
        if (ge == 0) ga = 0;
        w->ga[g / 8] = ga;
        w->ge[g / 8] = ge;
        partial |= ga >= QKV_PANEL || (ge + QKV_PANEL - 1) / QKV_PANEL < np;
    }
    return partial;
}

/* A tile on a mask's edge in raw mode (nothing to transform per element):
 * each row's visible columns [a, e), and -inf only where the kernels will
 * read a column the row cannot see: from 0 (the softmax starts there) up to
 * the last column the softmax takes for the row's block of 16 (ge of its
 * two groups); the rest of the tile is never read. (fa_scores_rows filled
 * every row to the tile's end: on the causal diagonal that was most of its
 * time, and 1.4% of a causal forward at n = 512.) */
static void edge_rows(fwd_ws *w, float *s, int nr, int rows, int64_t kt, int ncols) {
    for (int r = 0; r < nr; r++) {
        fa_tile_range(w->lo[r], w->hi[r], kt, ncols, &w->a[r], &w->e[r]);
        const int x = w->a[r], y = w->e[r];
        int g = r / 16 * 2, to = w->ge[g];
        if (g + 1 < rows / 8 && w->ge[g + 1] > to) to = w->ge[g + 1];
        float *row = s + (size_t)r * FWD_LDS;
        for (int64_t j = 0; j < x; j++) row[j] = -INFINITY;
        for (int64_t j = y; j < to; j++) row[j] = -INFINITY;
    }
}

/* One head's rows of Q, K or V lie H * D floats apart (2 KB at 8 heads of
 * 64): a new page every few rows, where the hardware prefetchers stop.
 * Rows r0 .. r1 - 1 of d floats, into L1 or (PF_L2, PF_L2_WRITE) into L2. */
enum { PF_L1, PF_L2, PF_L2_WRITE };
static void prefetch_rows(const float *src, int64_t ld, int64_t r0, int64_t r1, int64_t d, int how) {
#if defined(__GNUC__)
    for (int64_t r = r0; r < r1; r++)
        for (int64_t x = 0; x < d; x += 16) {
            const float *a = src + r * ld + x;
            if (how == PF_L1) __builtin_prefetch(a, 0, 3);
            else if (how == PF_L2) __builtin_prefetch(a, 0, 2);
            else __builtin_prefetch(a, 1, 2);
        }
#else
    (void)src, (void)ld, (void)r0, (void)r1, (void)d, (void)how;
#endif
}

/* One unit's constants, for the parts of fwd_block below. */
typedef struct fwd_blk {
    const float *ktb, *vb; /* the packed K of its kv head, its V rows (Dv floats each) */
    size_t ldvb;           /* row stride of vb: Dv, or ldv when V is read in place */
    int64_t kbase;         /* the key in the first column of ktb's first panel */
    int64_t b, h, i0;      /* batch, head, first query row */
    int nr, rows;          /* query rows, and rounded up to 8 */
    int softmax, stats, want_o;
    size_t ldob;
} fwd_blk;

/* The block's Q rows into w->qb (padding rows zero) and the running state. */
QKV_INLINE void block_load(const fa_ctx *c, const fwd_blk *u, fwd_ws *w) {
    const int64_t D = c->D;
    /* All the block's Q rows in flight before the copy: its cycles fell
     * 23-30% (n = 512, 8 heads, 2 threads, seven rounds alternating in one
     * process; the causal call faster in six, by up to 3%, the full one
     * within 2% either way). */
    const float *qrows = c->q + ((u->b * c->nq + u->i0) * c->H + u->h) * D; /* row stride ldq */
    prefetch_rows(qrows, c->ldq, 0, u->nr, D, PF_L1);
    for (int r = 0; r < u->rows; r++) {
        float *dst = w->qb + (size_t)r * D;
        if (r < u->nr) memcpy(dst, qrows + r * c->ldq, (size_t)D * sizeof(float));
        else memset(dst, 0, (size_t)D * sizeof(float));
        w->m[r] = -INFINITY;
        w->l[r] = 0.0f;
        w->cnt[r] = 0.0f;
        memset(w->o + (size_t)r * u->ldob, 0, u->ldob * sizeof(float));
    }
    for (int r = u->nr; r < u->rows; r++) {
        w->a[r] = 0;
        w->e[r] = 0;
    }
}

/* A tile every row sees whole, in raw mode with softmax (every tile of a
 * full mask): no per-row work at all. */
QKV_INLINE void tile_inside(const fa_ctx *c, const fwd_blk *u, fwd_ws *w, int64_t kt, int ncols) {
    const qkv_kernels *K = c->K;
    const int64_t D = c->D, Dv = c->Dv;
    K->qk(w->qb, (size_t)D, u->ktb + (kt - u->kbase) / QKV_PANEL * D * QKV_PANEL, (size_t)D, (size_t)u->rows, (size_t)ncols,
          w->s, FWD_LDS);
    if (c->pb) fa_posbias_rows(c, w->s, FWD_LDS, u->h, u->i0, u->nr, kt, ncols, NULL, NULL);
    K->softmax(w->s, FWD_LDS, (size_t)u->rows, (size_t)ncols, c->sc, w->m, w->l, w->alpha);
    if (u->want_o && fa_dropout_on(c))
        fa_dropout_rows(c, u->b, u->h, u->i0, u->nr, kt, ncols, w->s, FWD_LDS, NULL, NULL);
    if (u->want_o)
        K->pv(w->o, u->ldob, w->alpha, w->s, FWD_LDS, 1, u->vb + kt * u->ldvb, u->ldvb, (size_t)ncols, (size_t)Dv,
              (size_t)u->rows);
}

/* Any other tile: a mask's edge (the causal diagonal, a window's ends), a
 * bias, soft-cap or another normaliser. Per group of 8 rows only the 32-key
 * panels that some row of the group can see, and the softmax of 16 rows
 * only up to their last visible column. */
QKV_INLINE void tile_edge(const fa_ctx *c, const fwd_blk *u, fwd_ws *w, int64_t kt, int ncols) {
    const qkv_kernels *K = c->K;
    const int64_t D = c->D, Dv = c->Dv;
    const int nr = u->nr, rows = u->rows, softmax = u->softmax;
    const size_t ldob = u->ldob;
    const float *ktb = u->ktb, *vt = u->vb + kt * u->ldvb;
    size_t np = (size_t)(ncols + QKV_PANEL - 1) / QKV_PANEL;
    int partial = tile_groups(w, nr, rows, kt, ncols, (int)np);
    if (!partial) {
        K->qk(w->qb, (size_t)D, ktb + (kt - u->kbase) / QKV_PANEL * D * QKV_PANEL, (size_t)D, (size_t)rows, (size_t)ncols, w->s,
              FWD_LDS);
    } else {
        for (int g = 0; g < rows; g += 8) {
            int p0 = w->ga[g / 8] / QKV_PANEL, ge = w->ge[g / 8];
            if (ge > w->ga[g / 8])
                K->qk(w->qb + (size_t)g * D, (size_t)D, ktb + ((kt - u->kbase) / QKV_PANEL + p0) * D * QKV_PANEL, (size_t)D, 8,
                      (size_t)(ge - p0 * QKV_PANEL), w->s + (size_t)g * FWD_LDS + p0 * QKV_PANEL, FWD_LDS);
        }
    }
    if (partial && !c->natural) edge_rows(w, w->s, nr, rows, kt, ncols);
    else fa_scores_rows(c, w->s, FWD_LDS, u->h, u->i0, nr, kt, ncols, w->lo, w->hi, w->a, w->e, NULL, 0);
    if (c->pb && partial && !c->natural) fa_posbias_rows(c, w->s, FWD_LDS, u->h, u->i0, nr, kt, ncols, w->a, w->e);
    if (partial) /* padding rows: not computed, never visible */
        for (int r = nr; r < rows; r++)
            for (int j = 0; j < ncols; j++) w->s[(size_t)r * FWD_LDS + j] = -INFINITY;
    int holes = c->bias && find_holes(K, w->s, nr, w->a, w->e, w->vis, w->holes);
    const float *pw = w->s;
    if (!softmax) {
        for (int r = 0; r < rows; r++) {
            float *wr = w->pw + (size_t)r * FWD_LDS;
            if (r >= nr) {
                memset(wr, 0, FWD_LDS * sizeof(float));
                continue;
            }
            const float *sr = w->s + (size_t)r * FWD_LDS;
            elementwise_weights(c, sr, wr, w->a[r], w->e[r]);
            for (int j = w->a[r]; j < w->e[r]; j++) w->cnt[r] += sr[j] != -INFINITY;
        }
        pw = w->pw;
    }
    if (u->stats && !partial)
        K->softmax(w->s, FWD_LDS, (size_t)rows, (size_t)ncols, c->sc, w->m, w->l, w->alpha);
    else if (u->stats)
        for (int r0 = 0; r0 < rows; r0 += 16) {
            int nb = rows - r0 < 16 ? rows - r0 : 16, cols = 0;
            for (int g = r0; g < r0 + nb; g += 8)
                if (w->ge[g / 8] > cols) cols = w->ge[g / 8];
            K->softmax(w->s + (size_t)r0 * FWD_LDS, FWD_LDS, (size_t)nb, (size_t)cols, c->sc, w->m + r0, w->l + r0,
                       w->alpha + r0);
        }
    if (u->want_o && fa_dropout_on(c))
        fa_dropout_rows(c, u->b, u->h, u->i0, nr, kt, ncols, softmax ? w->s : w->pw, FWD_LDS, w->a, w->e);
    /* Every row sees the whole tile (the common case away from a mask's
     * edges): one product over all rows, tiled by the kernel (6 rows on
     * AVX2); padding rows have zero weights and are never stored. */
    int whole = u->want_o && softmax && !holes;
    for (int r = 0; whole && r < nr; r++) whole = w->a[r] == 0 && w->e[r] == ncols;
    if (whole) {
        K->pv(w->o, ldob, w->alpha, w->s, FWD_LDS, 1, vt, u->ldvb, (size_t)ncols, (size_t)Dv, (size_t)rows);
        return;
    }
    for (int g = 0; u->want_o && g < rows; g += 8) {
        int nv = nr - g < 8 ? nr - g : 8, gh = 0;
        for (int r = 0; holes && r < nv; r++) gh |= w->holes[g + r];
        if (softmax && !gh)
            fa_pv_zeros(c, w->o + (size_t)g * ldob, ldob, w->alpha + g, w->s + (size_t)g * FWD_LDS, FWD_LDS, 1, vt,
                        u->ldvb, (size_t)Dv, w->a + g, w->e + g, nv);
        else if (gh)
            pv_holes(c, w->o + (size_t)g * ldob, ldob, softmax ? w->alpha + g : NULL, pw + (size_t)g * FWD_LDS, vt,
                     u->ldvb, (size_t)Dv, w->a + g, w->e + g, w->vis + (size_t)g * FWD_LDS, w->holes + g, nv);
        else
            fa_pv_ranges(c, w->o + (size_t)g * ldob, ldob, softmax ? w->alpha + g : NULL, pw + (size_t)g * FWD_LDS,
                         FWD_LDS, 1, vt, u->ldvb, (size_t)Dv, w->a + g, w->e + g, nv);
    }
}

/* Normalise and store O, lse and the backward's statistics. The attention
 * matrix sweep needs 1/l: kept in cnt. */
QKV_INLINE void block_store(const fwd_ctx *f, const fwd_blk *u, fwd_ws *w) {
    const fa_ctx *c = &f->c;
    const int64_t Dv = c->Dv, b = u->b, h = u->h, i0 = u->i0;
    const int softmax = u->softmax, want_o = u->want_o;
    for (int r = 0; r < u->nr; r++) {
        float *orow = w->o + (size_t)r * u->ldob;
        float *dst = want_o ? f->out + ((b * c->nq + i0 + r) * c->H + h) * Dv : NULL;
        /* No visible key: l == 0 exactly. A NaN logit leaves m = -inf (max
         * skips NaN) but makes l NaN: not empty, the NaN propagates. */
        int empty = w->l[r] == 0.0f;
        float mul = 1.0f;
        if (softmax) mul = empty ? 0.0f : 1.0f / w->l[r];
        else if (c->norm == QKV_NORM_RELU && c->relu_div) mul = w->cnt[r] > 0 ? 1.0f / w->cnt[r] : 0.0f;
        if (want_o && softmax && empty) memset(dst, 0, (size_t)Dv * sizeof(float));
        else if (want_o && f->stream) c->K->scale_stream(dst, orow, mul, (size_t)Dv);
        else if (want_o) for (int64_t d = 0; d < Dv; d++) dst[d] = orow[d] * mul;
        if (f->lse) {
            double l2 = empty ? -INFINITY : (double)c->sc * w->m[r] + log2((double)w->l[r]);
            f->lse[(b * c->H + h) * c->nq + i0 + r] = (float)(l2 * FA_LN2);
        }
        if (f->m2) {
            int64_t at = (b * c->H + h) * c->nq + i0 + r;
            f->m2[at] = empty || w->m[r] == -INFINITY ? 0.0f : w->m[r];
            f->lg2[at] = empty ? INFINITY : (float)log2((double)w->l[r]);
        }
        if (softmax) w->cnt[r] = mul;
    }
    if (want_o && f->stream) c->K->stream_fence();
}

/* The block's rows of the attention matrix (only when the caller asks for
 * it): each tile's weights recomputed from the saved statistics, zeros
 * wherever none is (outside a row's key range [lo, hi), and inside it where
 * a tile gives none). Every element is written once, the softmax weights
 * with streaming stores: the matrix is n_q x n_k floats nobody here reads
 * again (a memset of whole rows first, then the weights over it, wrote the
 * visible part twice and read every line in before writing it). */
static void block_attn(const fwd_ctx *f, const fwd_blk *u, fwd_ws *w, int any, int64_t kstart, int64_t bhi) {
    const fa_ctx *c = &f->c;
    const qkv_kernels *K = c->K;
    const int64_t D = c->D, b = u->b, h = u->h, i0 = u->i0, nk = c->nk;
    const int nr = u->nr;
    float *rows = f->attn + ((b * c->H + h) * c->nq + i0) * nk;
    for (int r = 0; r < nr; r++) {
        float *row = rows + r * nk;
        int64_t lo = any ? w->lo[r] : 0, hi = any ? w->hi[r] : 0;
        if (hi <= lo) lo = hi = nk;
        memset(row, 0, (size_t)lo * sizeof(float));
        memset(row + hi, 0, (size_t)(nk - hi) * sizeof(float));
    }
    if (!any) return;
    int ncols = 0;
    for (int64_t kt = kstart; kt < bhi; kt += ncols) {
        ncols = tile_cols(kt, bhi);
        K->qk(w->qb, (size_t)D, u->ktb + (kt - u->kbase) / QKV_PANEL * D * QKV_PANEL, (size_t)D, (size_t)u->rows, (size_t)ncols,
              w->s, FWD_LDS);
        fa_scores_rows(c, w->s, FWD_LDS, h, i0, nr, kt, ncols, w->lo, w->hi, w->a, w->e, NULL, 0);
        for (int r = 0; r < nr; r++) {
            /* This tile's part of the row's range, [x0, x1); the weights go
             * to [a, e) within it, zeros to the rest. */
            int64_t x0 = w->lo[r] > kt ? w->lo[r] - kt : 0, x1 = w->hi[r] - kt < ncols ? w->hi[r] - kt : ncols;
            int a = w->a[r], e = w->e[r];
            float *sr = w->s + (size_t)r * FWD_LDS;
            float *dst = rows + r * nk + kt;
            if (x1 <= x0) continue;
            if (e <= a || (u->softmax && w->l[r] == 0.0f)) a = e = (int)x1;
            if (a > x0) memset(dst + x0, 0, (size_t)(a - x0) * sizeof(float));
            if (x1 > e) memset(dst + e, 0, (size_t)(x1 - e) * sizeof(float));
            if (e <= a) continue;
            if (u->softmax) {
                float mr = w->m[r], sc = c->sc;
                for (int j = a; j < e; j++) sr[j] = (sr[j] - mr) * sc;
                K->exp2(sr + a, (size_t)(e - a));
                K->scale_stream(dst + a, sr + a, w->cnt[r], (size_t)(e - a));
            } else {
                elementwise_weights(c, sr, dst, a, e);
                if (c->norm == QKV_NORM_RELU && c->relu_div) {
                    float mul = w->cnt[r] > 0 ? 1.0f / w->cnt[r] : 0.0f;
                    for (int j = a; j < e; j++) dst[j] *= mul;
                }
            }
        }
    }
    K->stream_fence();
}

/* One unit (a query block of one (b, h)) with the packed K of its kv head
 * at ktb and its V rows (Dv floats each) at vb. same_rows: the thread's
 * previous call was the same query block of another head (fwd_local_unit),
 * whose key ranges are still in w.lo, w.hi. */
static void fwd_block(fwd_ctx *f, int64_t unit, int t, const float *ktb, const float *vb, size_t ldvb,
                      int same_rows) {
    const fa_ctx *c = &f->c;
    fwd_ws w;
    fwd_ws_layout(f, f->ws + (size_t)t * f->ws_stride, &w);

    /* The last query blocks of a head first: under a causal mask they cost
     * the most, and units start in increasing order (core/threads.h), so the
     * cheap ones fill in at the end of the call. */
    const int64_t qb = f->nqb - 1 - unit % f->nqb, bh = unit / f->nqb;
    fwd_blk u;
    u.ktb = ktb;
    u.kbase = 0;
    u.vb = vb;
    u.ldvb = ldvb;
    u.h = bh % c->H;
    u.b = bh / c->H;
    if (f->qstart) {
        u.i0 = f->qstart[qb];
        u.nr = (int)(f->qstart[qb + 1] - u.i0);
    } else {
        u.i0 = qb * FA_BQ;
        u.nr = (int)(c->nq - u.i0 < FA_BQ ? c->nq - u.i0 : FA_BQ);
    }
    u.rows = (int)fa_round_up(u.nr, 8);
    u.softmax = c->norm == QKV_NORM_SOFTMAX;
    u.stats = u.softmax || f->lse || f->m2;
    u.want_o = f->out != NULL;
    u.ldob = (size_t)f->ldob;
    int64_t blo, bhi;
    int any = same_rows ? fa_range_bounds(w.lo, w.hi, u.nr, &blo, &bhi)
                        : fa_query_ranges(c, u.b, u.i0, u.nr, w.lo, w.hi, &blo, &bhi);
    /* Keys every row of the block sees: [clo, chi). A tile inside it, in raw
     * mode with softmax, needs no per-row work at all (tile_inside). */
    int64_t clo = 0, chi = INT64_MAX;
    for (int r = 0; r < u.nr; r++) {
        if (w.lo[r] > clo) clo = w.lo[r];
        if (w.hi[r] < chi) chi = w.hi[r];
    }
    const int raw_softmax = u.softmax && !c->natural;

    block_load(c, &u, &w);
    int64_t kstart = blo / QKV_PANEL * QKV_PANEL;
    if (f->klocal && any) { /* the keys [blo, bhi) into panels from blo: one tile, no columns outside */
        const int64_t kv = u.h / c->G;
        const float *ks = c->k + (u.b * c->nk + blo) * c->ldk + kv * c->D;
        for (int64_t p0 = 0; p0 < bhi - blo; p0 += QKV_PANEL)
            c->K->pack_panel(w.kloc + p0 * c->D, ks + p0 * c->ldk, (size_t)c->ldk,
                             (size_t)(bhi - blo - p0 < QKV_PANEL ? bhi - blo - p0 : QKV_PANEL), (size_t)c->D, 0);
        u.ktb = w.kloc;
        u.kbase = kstart = blo;
    }
    if (any) {
        int ncols = 0;
        for (int64_t kt = kstart; kt < bhi; kt += ncols) {
            ncols = tile_cols(kt, bhi);
            if (raw_softmax && clo <= kt && kt + ncols <= chi) tile_inside(c, &u, &w, kt, ncols);
            else tile_edge(c, &u, &w, kt, ncols);
        }
    }
    block_store(f, &u, &w);
    if (f->attn) block_attn(f, &u, &w, any, kstart, bhi);
}

/* Every sequence within one block, its keys within a tile (klocal): a
 * unit is one block of one batch row with all its heads, in turn, its rows
 * of Q, K, V and O (all heads) fetched into L2 first. */
static void fwd_local_unit(void *vf, int64_t u, int t) {
    fwd_ctx *f = vf;
    const fa_ctx *c = &f->c;
    const int64_t b = u / f->nqb, j = u % f->nqb, qb = f->nqb - 1 - j; /* fwd_block's order */
    const int64_t r0 = f->qstart[qb], r1 = f->qstart[qb + 1];
    prefetch_rows(c->q + b * c->nq * c->ldq, c->ldq, r0, r1, c->H * c->D, PF_L2);
    prefetch_rows(c->k + b * c->nk * c->ldk, c->ldk, r0, r1, c->Hkv * c->D, PF_L2);
    prefetch_rows(c->v + b * c->nk * c->ldv, c->ldv, r0, r1, c->Hkv * c->Dv, PF_L2);
    if (f->out) prefetch_rows(f->out + b * c->nq * c->ldo, c->ldo, r0, r1, c->H * c->Dv, PF_L2_WRITE);
    for (int64_t h = 0; h < c->H; h++)
        fwd_block(f, (b * c->H + h) * f->nqb + j, t, NULL, c->v + b * c->nk * c->ldv + h / c->G * c->Dv,
                  (size_t)c->ldv, h > 0);
}

/* The usual schedule: K and V of every head packed first (fa_pack_kv). */
static void fwd_unit(void *vf, int64_t u, int t) {
    fwd_ctx *f = vf;
    const fa_ctx *c = &f->c;
    const int64_t bh = u / f->nqb, b = bh / c->H, kv = bh % c->H / c->G;
    if (c->v_direct)
        fwd_block(f, u, t, c->kt + (b * c->Hkv + kv) * c->kt_stride, c->v + b * c->nk * c->ldv + kv * c->Dv,
                  (size_t)c->ldv, 0);
    else
        fwd_block(f, u, t, c->kt + (b * c->Hkv + kv) * c->kt_stride, c->vr + (b * c->Hkv + kv) * c->nk * c->Dv,
                  (size_t)c->Dv, 0);
}

/* Heads owned by threads (head_sched.h): a slot holds one kv head's K
 * panels, then with several kv heads its V rows at slot_kt bytes. */
static float *slot_vrows(const fwd_ctx *f, const void *slot) { /* writable for the owner */
    return (float *)(void *)((unsigned char *)(uintptr_t)slot + f->slot_kt);
}

/* A head packed into its slot a panel of rows at a time while the next
 * panel's rows are prefetched: the packing's cycles fell 13-17% (n = 512,
 * 8 heads, 2 threads; calls 0.5-1.6% faster, four rounds alternating in
 * one process). */
static void fwd_head_pack(void *vf, int64_t head, void *slot) {
    fwd_ctx *f = vf;
    const fa_ctx *c = &f->c;
    const int64_t b = head / c->Hkv, kv = head % c->Hkv, nk = c->nk;
    const float *ks = c->k + b * nk * c->ldk + kv * c->D, *vs = c->v + b * nk * c->ldv + kv * c->Dv;
    float *vd = slot_vrows(f, slot);
    for (int64_t r0 = 0; r0 < nk; r0 += QKV_PANEL) {
        int64_t r1 = nk - r0 < QKV_PANEL ? nk : r0 + QKV_PANEL, r2 = nk - r1 < QKV_PANEL ? nk : r1 + QKV_PANEL;
        prefetch_rows(ks, c->ldk, r1, r2, c->D, PF_L1);
        if (c->Hkv > 1 && !c->v_direct) prefetch_rows(vs, c->ldv, r1, r2, c->Dv, PF_L1);
        fa_pack_block(c->K, slot, 0, NULL, ks, c->ldk, 0, nk, 1, c->D, r0, r1, 0);
        if (c->Hkv > 1 && !c->v_direct) fa_pack_block(c->K, NULL, 0, vd, vs, c->ldv, 0, nk, 1, c->Dv, r0, r1, 0);
    }
}

static void fwd_head_unit(void *vf, int64_t head, int64_t j, const void *slot, int t) {
    fwd_ctx *f = vf;
    const fa_ctx *c = &f->c;
    const int64_t b = head / c->Hkv, kv = head % c->Hkv, h = kv * c->G + j / f->nqb;
    const float *vb = c->v_direct ? c->v + b * c->nk * c->ldv + kv * c->Dv
                      : c->Hkv > 1  ? slot_vrows(f, slot)
                                    : c->v + b * c->nk * c->Dv;
    fwd_block(f, (b * c->H + h) * f->nqb + j % f->nqb, t, slot, vb, c->v_direct ? (size_t)c->ldv : (size_t)c->Dv, 0);
}

/* Whether every query block (starts from qkv_plan_query_blocks, packed,
 * every sequence within one block) sees at most FWD_LDS keys: those of the
 * sequences it holds, one tile. */
static int fwd_local_ok(const qkv_plan *p, const int64_t *qstart, int64_t nqb) {
    const int64_t *oq = p->d.seq_offsets_q, *ok = p->d.seq_offsets_k, ns = p->d.num_seqs;
    int64_t s = 0;
    for (int64_t u = 0; u < nqb; u++) {
        while (s < ns && oq[s + 1] <= qstart[u]) s++; /* the first sequence with a row in the block */
        int64_t z = s;
        while (z + 1 < ns && oq[z + 1] < qstart[u + 1]) z++; /* the last */
        if (s >= ns || ok[z + 1] - ok[s] > FWD_LDS) return 0;
    }
    return 1;
}

static qkv_status fast_forward(const qkv_plan *p, const float *q, const float *k, const float *v,
                               float *out, float *attn, float *lse, float *m2, float *lg2) {
    fwd_ctx f;
    memset(&f, 0, sizeof f);
    fa_ctx_init(&f.c, p, q, k, v);
    qkv_status st = fa_posbias_init(&f.c);
    if (st != QKV_OK) return st;
    f.out = out;
    f.attn = attn;
    f.lse = lse;
    f.m2 = m2;
    f.lg2 = lg2;
    /* Packed sequences: blocks that do not straddle two (qkv_plan_query_blocks;
     * a block of 64 rows over sentences of 6-37 tokens computed 4-5 times
     * the scores its rows need), V read in place, and K packed per block
     * when each block's keys fit one tile (fwd_local_ok): 91 sentences of
     * 6-37 tokens, 12 heads of 32, 2 threads, medians of four alternating
     * rounds 1.80 -> 1.34 ms. */
    f.nqb = qkv_plan_query_blocks(p, FA_BQ, NULL);
    if (p->packed) {
        f.qstart = fa_alloc((size_t)(f.nqb + 1) * sizeof(int64_t));
        if (!f.qstart) {
            fa_posbias_free(&f.c);
            return QKV_ERR_OUT_OF_MEMORY;
        }
        qkv_plan_query_blocks(p, FA_BQ, f.qstart);
        /* Every sequence within one block: each key is read by one block of
         * each head, and copying V would only read it twice */
        const int64_t *oq = p->d.seq_offsets_q;
        f.c.v_direct = 1;
        for (int64_t s = 0; s < p->d.num_seqs && f.c.v_direct; s++) f.c.v_direct = oq[s + 1] - oq[s] <= FA_BQ;
        f.klocal = f.c.v_direct && fwd_local_ok(p, f.qstart, f.nqb);
    }
    f.ldob = fa_round_up(f.c.Dv, 16);
    f.stream = out && (uintptr_t)out % 64 == 0 && f.c.Dv % 16 == 0 &&
               (double)f.c.B * (double)f.c.nq * (double)f.c.H * (double)f.c.Dv * sizeof(float) >= FWD_STREAM_MIN_BYTES;
    int64_t units = f.c.B * f.c.H * f.nqb;
    int threads = f.c.threads < units ? f.c.threads : (int)units;
    f.ws_stride = fwd_ws_layout(&f, NULL, NULL);
    const int64_t heads = f.c.B * f.c.Hkv;
    f.slot_kt = qkv_round64((size_t)(fa_round_up(f.c.nk, QKV_PANEL) * f.c.D) * sizeof(float));
    const size_t slot_stride = f.slot_kt + (f.c.Hkv > 1 && !f.c.v_direct ? qkv_round64((size_t)(f.c.nk * f.c.Dv) * sizeof(float)) : 0);
    const int head_mode = !f.klocal && heads >= threads && slot_stride <= FWD_HEAD_SLOT_MAX_BYTES;
    /* One block per call: the tiles, the scheduler's state and slots (head
     * mode) or packed K and V (fa_kv_alloc), and for cosine the normalised
     * q and k. */
    const int cosine = p->d.score == QKV_SCORE_COSINE;
    size_t ws_bytes = f.ws_stride * (size_t)threads, norm_bytes = cosine ? fa_normalised_bytes(&f.c) : 0;
    size_t state_bytes = head_mode ? fa_heads_state_bytes(heads) : 0;
    if (head_mode) ws_bytes += state_bytes + slot_stride * (size_t)threads;
    void *block = NULL;
    st = QKV_ERR_OUT_OF_MEMORY;
    if (norm_bytes <= SIZE_MAX - ws_bytes) {
        if (f.klocal) { /* nothing packed before the units */
            if ((block = fa_alloc(ws_bytes + norm_bytes)) != NULL) {
                st = QKV_OK;
                f.ws = block;
            }
        } else if (!head_mode) {
            void *extra = NULL;
            st = fa_kv_alloc(&f.c, ws_bytes + norm_bytes, &extra);
            f.ws = extra;
            block = f.c.kt; /* and vr_own */
        } else if ((block = fa_alloc(ws_bytes + norm_bytes)) != NULL) {
            st = QKV_OK;
            f.ws = block;
        }
    }
    if (st == QKV_OK) {
        if (cosine) fa_normalise_into(&f.c, f.ws + ws_bytes);
        if (head_mode) {
            unsigned char *state = f.ws + f.ws_stride * (size_t)threads;
            fa_heads_run(threads, heads, f.c.G * f.nqb, state, state + state_bytes, slot_stride, fwd_head_pack,
                         fwd_head_unit, &f);
        } else if (f.klocal) {
            qkv_parallel_for(threads, f.c.B * f.nqb, fwd_local_unit, &f);
        } else {
            fa_pack_kv(&f.c);
            qkv_parallel_for(threads, units, fwd_unit, &f);
        }
    }
    fa_free(block);
    fa_free(f.qstart);
    fa_posbias_free(&f.c);
    return st;
}

qkv_status qkv_fast_forward(const qkv_plan *p, const float *q, const float *k, const float *v,
                            float *out, float *attn, float *lse) {
    return fast_forward(p, q, k, v, out, attn, lse, NULL, NULL);
}

qkv_status qkv_fast_forward_stats(const qkv_plan *p, const float *q, const float *k, const float *v,
                                  float *out, float *lse, float *m2, float *lg2) {
    return fast_forward(p, q, k, v, out, NULL, lse, m2, lg2);
}
