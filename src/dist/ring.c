/* Ring attention over MPI (Liu, Zaharia & Abbeel 2023, "Ring Attention with
 * Blockwise Transformers for Near-Infinite Context"): the sequence is split
 * over the p ranks of a communicator; each rank keeps its queries, and the
 * key/value blocks travel round the ring (rank r sends to r + 1 and receives
 * from r - 1) with non-blocking sends and receives that overlap the
 * computation of the block in hand. Each (query block, key block) pair is
 * one call of the attention core (qkv_attention_forward with its lse
 * output); the partial outputs are merged exactly by their log-sum-exp:
 *
 *     lse = logsumexp_b(lse_b),   o = sum_b exp(lse_b - lse) o_b
 *
 * Backward: dQ stays at home; the partial dK/dV of each key block travel
 * round the ring with the block and come back to their owner after p hops.
 * Each block's backward is the core's fast path given the GLOBAL merged O
 * and lse, so that P = exp(s - lse) is the global softmax and
 * D_i = rowsum(dO_i * O_i) the global one (the reference path recomputes
 * its own local normaliser, so the backward forces the fast path).
 *
 * Attention dropout: the factor of entry (b, h, i, j) is a hash of the
 * whole problem's (i, j), which each block's plan carries as its query and
 * key origins (qkv_plan_block), so every block drops what one process
 * drops. The merge stays exact: a block's o_b is its weights (normalised
 * by its own sum, before dropout, as lse_b) times the factors times V, and
 * the factors are linear in the weights; the backward's D_i from the
 * global dropped O is the one process's.
 *
 * Memory per rank: O(n/p) rows (its queries, two key/value buffers, the
 * accumulators); a rank never holds the whole sequence's keys and values.
 *
 * Causal attention (n_q = n_k) with the layouts of qkv_dist_partition: a
 * pair of chunks is either fully in the past (no mask), the diagonal
 * (causal mask inside) or fully in the future (skipped). With the
 * contiguous layout rank p - 1 does p times the work of rank 0; the zig-zag
 * layout (rank r holds chunks r and 2p - 1 - r of 2p) gives every rank the
 * same number of visible tiles.
 *
 * Errors are made collective: every rank learns whether any rank failed
 * (MPI_Allreduce of the status) before the ring starts and after it ends, so
 * a failure on one rank (a NULL tensor, out of memory, non-finite input)
 * never leaves the others waiting. MPI calls run on a duplicate of the
 * caller's communicator with MPI_ERRORS_RETURN. */
#include <limits.h>
#include <math.h>
#include <string.h>

#include "attn/fast.h"
#include "attn/fast_additive.h"
#include "core/internal.h"
#include "dist/dist_internal.h"
#include "ref/ref.h"

#define TAG_KV 7101
#define TAG_DKV 7102

/* ---- partitions ---------------------------------------------------------- */

/* Piece c of m nearly equal pieces of n (the first n mod m one longer). */
static void piece(int64_t n, int64_t m, int64_t c, int64_t *start, int64_t *len) {
    int64_t base = n / m, rem = n % m;
    *start = c * base + (c < rem ? c : rem);
    *len = base + (c < rem ? 1 : 0);
}

qkv_status qkv_dist_partition(int64_t n, int ranks, int rank, qkv_dist_layout layout,
                              int64_t start[2], int64_t len[2], int64_t *local_n) {
    if (!start || !len || !local_n) return QKV_ERR_NULL_POINTER;
    if (n < 1 || ranks < 1 || rank < 0 || rank >= ranks) return QKV_ERR_BAD_SIZE;
    if (layout == QKV_DIST_CONTIGUOUS) {
        piece(n, ranks, rank, &start[0], &len[0]);
        start[1] = start[0] + len[0];
        len[1] = 0;
    } else if (layout == QKV_DIST_ZIGZAG) {
        piece(n, 2 * (int64_t)ranks, rank, &start[0], &len[0]);
        piece(n, 2 * (int64_t)ranks, 2 * (int64_t)ranks - 1 - rank, &start[1], &len[1]);
    } else {
        return QKV_ERR_BAD_ENUM;
    }
    *local_n = len[0] + len[1];
    return QKV_OK;
}

/* The chunks of one rank: global start, length and row offset in the local
 * tensors (the chunks are stored one after the other). */
typedef struct chunk {
    int64_t start, len, off;
} chunk;

typedef struct owned {
    int n;          /* chunks in use (1 or 2) */
    chunk c[2];
    int64_t local_n;
} owned;

static void owned_of(int64_t n, int p, int r, qkv_dist_layout layout, owned *o) {
    int64_t st[2] = {0, 0}, ln[2] = {0, 0}, ln_all = 0; /* set by the partition; gcc cannot see it */
    (void)qkv_dist_partition(n, p, r, layout, st, ln, &ln_all);
    o->n = layout == QKV_DIST_ZIGZAG ? 2 : 1;
    o->local_n = ln_all;
    int64_t off = 0;
    for (int t = 0; t < 2; t++) {
        o->c[t].start = st[t];
        o->c[t].len = ln[t];
        o->c[t].off = off;
        off += ln[t];
    }
}

/* ---- row copies between the local [B, n_loc, X] tensors and chunk-major
 * buffers [B, len, X] ------------------------------------------------------- */

static void pack_rows(float *dst, const float *src, int64_t B, int64_t n_loc, const chunk *c,
                      int64_t x) {
    for (int64_t b = 0; b < B; b++)
        memcpy(dst + b * c->len * x, src + (b * n_loc + c->off) * x, (size_t)(c->len * x) * sizeof(float));
}

static void unpack_rows(float *dst, const float *src, int64_t B, int64_t n_loc, const chunk *c,
                        int64_t x) {
    for (int64_t b = 0; b < B; b++)
        memcpy(dst + (b * n_loc + c->off) * x, src + b * c->len * x, (size_t)(c->len * x) * sizeof(float));
}

/* lse [B, H, n_loc] <-> [B, H, len] */
static void pack_lse(float *dst, const float *src, int64_t B, int64_t H, int64_t n_loc, const chunk *c) {
    for (int64_t bh = 0; bh < B * H; bh++)
        memcpy(dst + bh * c->len, src + bh * n_loc + c->off, (size_t)c->len * sizeof(float));
}

static void unpack_lse(float *dst, const float *src, int64_t B, int64_t H, int64_t n_loc, const chunk *c) {
    for (int64_t bh = 0; bh < B * H; bh++)
        memcpy(dst + bh * n_loc + c->off, src + bh * c->len, (size_t)c->len * sizeof(float));
}

/* ---- the problem ---------------------------------------------------------- */

typedef struct ring {
    qkv_attn_desc d;        /* the caller's descriptor (global sizes) */
    MPI_Comm comm;          /* private duplicate, MPI_ERRORS_RETURN */
    int p, r;
    qkv_dist_layout layout;
    int64_t B, H, Hkv, D, Dv;
    owned mq;               /* my query chunks */
    owned *kown;            /* every rank's key chunks [p] */
    int64_t max_kn;         /* the largest local key count */
    int64_t kv_elems;       /* floats of a key/value message buffer */
    int64_t *blk_len;       /* [B] per-block key lengths */
    qkv_plan gplan;         /* the whole problem's plan: the visible key range of every query */
    int softmax;            /* merge by log-sum-exp (else the block outputs add) */
    int posbias;            /* ALiBi / relative: every block needs its true shift */
    int relu_div;           /* RELU divided by the global count of visible keys */
    int64_t bias_h;         /* heads of the bias (1 SHARED, H PER_HEAD, 0 none) */
    float *bb;              /* one block's bias [bias_h, len_q, len_k] */
    /* Packed sequences (B = 1): the global offsets (the caller's; ok = oq
     * when seq_offsets_k is NULL), one sub-block's offsets [S + 1] each, and
     * one sub-block's lse [H, max chunk of queries]. */
    int packed;
    int64_t S;
    const int64_t *oq, *ok;
    int64_t *goq, *gok;
    float *lg;
} ring;

/* Offsets inside a message buffer of owner o: K chunk t, then V chunk t. */
static float *kv_k(const ring *g, float *buf, const owned *o, int t) {
    return buf + (t == 0 ? 0 : g->B * o->c[0].len * g->Hkv * g->D);
}

static float *kv_v(const ring *g, float *buf, const owned *o, int t) {
    int64_t koff = g->B * o->local_n * g->Hkv * g->D;
    return buf + koff + (t == 0 ? 0 : g->B * o->c[0].len * g->Hkv * g->Dv);
}

static int64_t kv_count(const ring *g, const owned *o) {
    return g->B * o->local_n * g->Hkv * (g->D + g->Dv);
}

/* ---- one (query chunk, key chunk) pair ------------------------------------
 *
 * Every mask of the core is a window [pos_i - left, pos_i + right] around
 * query i's bottom-right aligned position pos_i = i + n_k - n_q (NONE and
 * CAUSAL are windows with unbounded sides), intersected with the key
 * lengths. For the block of queries qs .. qs + lq - 1 against keys
 * ks .. ks + lk - 1 the block's own aligned position is
 * pos'_i' = i' + lk - lq, and
 *     pos_i - ks = pos'_i' + c,   c = qs - ks + (n_k - n_q) - (lk - lq),
 * so the global window is the block window [pos' - (left - c), pos' +
 * (right + c)]: the same plan with shifted sides. These may be negative
 * (the window lies wholly to one side of the block's diagonal), which the
 * public descriptor cannot say but the plan's key ranges compute exactly
 * (qkv_plan_key_range clamps a +- b for any b of sequence size), so each
 * block's plan is derived from the whole problem's (qkv_plan_block, never
 * validated again) and passed to the fast path (or the reference)
 * directly: the same kernels qkv_attention_forward runs. */

/* Whether some query of global rows [q0, q1) sees some key of [k0, k1) in
 * some batch (the global key ranges are contiguous; O(B * (q1 - q0))). */
static int rows_visible(const ring *g, int64_t q0, int64_t q1, int64_t k0, int64_t k1) {
    if (q1 <= q0 || k1 <= k0) return 0;
    for (int64_t b = 0; b < g->B; b++)
        for (int64_t i = q0; i < q1; i++) {
            int64_t lo, hi;
            qkv_plan_key_range(&g->gplan, b, i, &lo, &hi);
            if (lo < k0) lo = k0;
            if (hi > k1) hi = k1;
            if (lo < hi) return 1;
        }
    return 0;
}

/* One call of the core inside a (query chunk, key chunk) pair: the chunks'
 * rows qa .. qa + lq - 1 and ka .. ka + lk - 1 (offsets inside the chunks),
 * the shift c of the window (see above) and, when packed, ns sequences
 * whose offsets are in g->goq / g->gok, all with the same shift c and the
 * same key cap kcap (the key lengths seen from the block; -1 none). Not
 * packed: one sub-block, the whole pair. */
typedef struct sub {
    int64_t qa, lq, ka, lk, c, kcap, ns;
} sub;

typedef struct sub_iter {
    int64_t s, s_hi; /* packed: the next sequence, the last one in the pair */
    int done;
} sub_iter;

static int64_t clamp64(int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : (x > hi ? hi : x); }

/* The last sequence s with off[s] <= x (0 <= x < off[S]). */
static int64_t seq_at(const int64_t *off, int64_t S, int64_t x) {
    int64_t a = 0, z = S - 1;
    while (a < z) {
        int64_t m = a + (z - a + 1) / 2;
        if (off[m] <= x) a = m; else z = m - 1;
    }
    return a;
}

static void sub_begin(const ring *g, const chunk *qc, const chunk *kc, sub_iter *it) {
    it->done = qc->len == 0 || kc->len == 0;
    it->s = it->s_hi = 0;
    if (it->done || !g->packed) return;
    int64_t a = seq_at(g->oq, g->S, qc->start), b = seq_at(g->ok, g->S, kc->start);
    int64_t y = seq_at(g->oq, g->S, qc->start + qc->len - 1), z = seq_at(g->ok, g->S, kc->start + kc->len - 1);
    it->s = a < b ? a : b;
    it->s_hi = y > z ? y : z;
}

/* The next sub-block of the pair with a visible key, or 0 when none is
 * left. Packed: a run of consecutive sequences cut to the two chunks;
 * sequences with rows on one side only (no key of the block, or no query)
 * join any run, the others break it where their shift or key cap changes:
 * only the sequences cut by a chunk boundary have their own (at most two
 * per side), so a pair makes a handful of calls, whatever the number of
 * sequences. */
static int sub_next(ring *g, const chunk *qc, const chunk *kc, sub_iter *it, sub *sb) {
    const int64_t qs = qc->start, qe = qs + qc->len, ks = kc->start, ke = ks + kc->len;
    if (!g->packed) {
        if (it->done) return 0;
        it->done = 1;
        sb->qa = sb->ka = 0;
        sb->lq = qc->len;
        sb->lk = kc->len;
        sb->c = qs - ks + (g->d.n_k - g->d.n_q) - (kc->len - qc->len);
        sb->kcap = -1;
        sb->ns = 0;
        return rows_visible(g, qs, qe, ks, ke);
    }
    const int64_t *oq = g->oq, *ok = g->ok;
    /* Without a window the shift matters only to the position biases. */
    const int unbounded = g->gplan.left >= QKV_SIDE_WIDE && g->gplan.right >= QKV_SIDE_WIDE && !g->posbias;
    while (!it->done && it->s <= it->s_hi) {
        int64_t first = it->s, t = first, c = 0, kcap = -1;
        int keyed = 0;
        for (; t <= it->s_hi; t++) {
            int64_t qa = clamp64(oq[t], qs, qe), nq1 = clamp64(oq[t + 1], qs, qe) - qa;
            int64_t ka = clamp64(ok[t], ks, ke), nk1 = clamp64(ok[t + 1], ks, ke) - ka;
            if (nq1 == 0 || nk1 == 0) continue; /* joins any run */
            int64_t nq = oq[t + 1] - oq[t], nk = ok[t + 1] - ok[t];
            int64_t ct = unbounded ? 0 : (qa - oq[t]) + (nk - nq) - (ka - ok[t]) - (nk1 - nq1), capt = -1;
            if (g->d.key_lengths) {
                int64_t v0 = g->d.key_lengths[0] - (ka - ok[t]);
                if (v0 < nk1) capt = v0 < 0 ? 0 : v0;
            }
            if (keyed && (ct != c || capt != kcap)) break;
            keyed = 1;
            c = ct;
            kcap = capt;
        }
        int64_t last = t - 1;
        it->s = t;
        if (!keyed) continue;
        int64_t q0 = clamp64(oq[first], qs, qe), q1 = clamp64(oq[last + 1], qs, qe);
        int64_t k0 = clamp64(ok[first], ks, ke), k1 = clamp64(ok[last + 1], ks, ke);
        if (!rows_visible(g, q0, q1, k0, k1)) continue;
        sb->ns = last - first + 1;
        for (int64_t u = 0; u <= sb->ns; u++) {
            g->goq[u] = clamp64(oq[first + u], qs, qe) - q0;
            g->gok[u] = clamp64(ok[first + u], ks, ke) - k0;
        }
        sb->qa = q0 - qs;
        sb->lq = q1 - q0;
        sb->ka = k0 - ks;
        sb->lk = k1 - k0;
        sb->c = c;
        sb->kcap = kcap;
        return 1;
    }
    it->done = 1;
    return 0;
}

/* The plan of one sub-block, from the whole problem's: its sizes, the
 * window shifted by sb->c, its global query and key origins (so that its
 * dropout factors are the whole problem's), its key lengths or packed
 * sequences, its bias.
 * bias_loc: this rank's bias rows [bias_h, nq_loc, n_k] (copied into g->bb
 * for the block). RELU is divided once, by the global count (relu_scale). */
static qkv_status sub_plan(ring *g, const chunk *qc, const chunk *kc, const sub *sb, const float *bias_loc,
                           qkv_plan *bp) {
    qkv_plan_block_desc bd;
    memset(&bd, 0, sizeof bd);
    bd.n_q = sb->lq;
    bd.n_k = sb->lk;
    bd.shift = sb->c;
    bd.q_origin = qc->start + sb->qa; /* the global rows of the sub-block: dropout's (i, j) */
    bd.k_origin = kc->start + sb->ka;
    if (g->packed) {
        bd.num_seqs = sb->ns;
        bd.seq_offsets_q = g->goq;
        bd.seq_offsets_k = g->gok;
        if (g->d.key_lengths) {
            g->blk_len[0] = sb->kcap < 0 ? sb->lk : sb->kcap;
            bd.key_lengths = g->blk_len;
        }
    } else if (g->d.key_lengths) {
        for (int64_t b = 0; b < g->B; b++) {
            int64_t l = g->d.key_lengths[b] - kc->start;
            g->blk_len[b] = l < 0 ? 0 : (l > kc->len ? kc->len : l);
        }
        bd.key_lengths = g->blk_len;
    }
    if (g->bias_h > 0) {
        const int64_t nq_loc = g->mq.local_n, nk = g->d.n_k;
        for (int64_t h = 0; h < g->bias_h; h++)
            for (int64_t i = 0; i < sb->lq; i++)
                memcpy(g->bb + (h * sb->lq + i) * sb->lk,
                       bias_loc + (h * nq_loc + qc->off + sb->qa + i) * nk + kc->start + sb->ka,
                       (size_t)sb->lk * sizeof(float));
        bd.bias_kind = g->d.bias_kind;
        bd.bias = g->bb;
    }
    qkv_status s = qkv_plan_block(&g->gplan, &bd, bp);
    bp->d.relu_divide_by_count = 0;
    return s;
}

/* One block forward / backward under its plan: the finite check, dispatch
 * and status of qkv_attention_forward / backward. */
static qkv_status block_forward(const qkv_plan *p, const float *q, const float *k, const float *v, float *out,
                                float *lse) {
    (void)qkv_alloc_take_refusal();
    qkv_status s = p->d.check_finite ? qkv_plan_check_finite(p, q, k, v, NULL, NULL, NULL) : QKV_OK;
    if (s == QKV_OK) {
        if (p->d.impl == QKV_IMPL_REFERENCE) s = qkv_ref_forward(p, q, k, v, out, NULL, lse);
        else if (p->d.score == QKV_SCORE_ADDITIVE)
            s = qkv_fast_additive_supported(p) ? qkv_fast_additive_forward(p, q, k, v, out, NULL, lse)
                                               : QKV_ERR_UNSUPPORTED;
        else if (qkv_fast_supported(p)) s = qkv_fast_forward(p, q, k, v, out, NULL, lse);
        else s = QKV_ERR_UNSUPPORTED;
    }
    return s == QKV_ERR_OUT_OF_MEMORY ? qkv_alloc_failure_status() : s;
}

static qkv_status block_backward(const qkv_plan *p, const float *q, const float *k, const float *v,
                                 const float *out, const float *lse, const float *dout, const qkv_attn_grads *gr) {
    (void)qkv_alloc_take_refusal();
    qkv_status s = p->d.check_finite ? qkv_plan_check_finite(p, q, k, v, dout, out, lse) : QKV_OK;
    if (s == QKV_OK && p->d.score == QKV_SCORE_ADDITIVE)
        s = qkv_fast_additive_supported(p) ? qkv_fast_additive_backward(p, q, k, v, out, lse, dout, gr)
                                           : QKV_ERR_UNSUPPORTED;
    else if (s == QKV_OK)
        s = qkv_fast_supported(p) ? qkv_fast_backward(p, q, k, v, out, lse, dout, gr) : QKV_ERR_UNSUPPORTED;
    return s == QKV_ERR_OUT_OF_MEMORY ? qkv_alloc_failure_status() : s;
}

static int mpi_ok(int rc) { return rc == MPI_SUCCESS; }

/* Drive the transfers in flight between two blocks: without an asynchronous
 * progress thread, MPI moves the fragments of a large message only inside
 * MPI calls, so a test between blocks lets the next block's keys travel
 * while this rank computes (completed requests become MPI_REQUEST_NULL). */
static int progress(int n, MPI_Request *req) {
    int flag = 0;
    return mpi_ok(MPI_Testall(n, req, &flag, MPI_STATUSES_IGNORE));
}

/* What the library supports on the ring (see qkv.h), and the whole
 * problem's plan: the visible key range of every query, the only validation
 * of the call. The bias is a local tensor (this rank's rows), checked with
 * the others, not here: a rank holding no query may pass NULL; the plan has
 * none (each block's plan gets its own). */
static qkv_status ring_check(const qkv_attn_desc *desc, int backward, qkv_plan *plan) {
    qkv_attn_desc d = *desc;
    if (d.bias_kind != QKV_BIAS_NONE && d.bias_kind != QKV_BIAS_SHARED && d.bias_kind != QKV_BIAS_PER_HEAD)
        return QKV_ERR_BAD_ENUM;
    d.bias_kind = QKV_BIAS_NONE;
    d.bias = NULL;
    qkv_status s = qkv_plan_make(&d, plan);
    if (s != QKV_OK) return s;
    if (d.dtype != QKV_F32 || (d.rel_table && d.rel2d_width > 0)) return QKV_ERR_UNSUPPORTED;
    if (backward && d.impl == QKV_IMPL_REFERENCE) return QKV_ERR_UNSUPPORTED;
    return QKV_OK;
}

/* Set up everything but the buffers. The communicator is duplicated only
 * when the descriptor is valid (MPI_Comm_dup is collective: every rank
 * validates the same descriptor, so they all get here or none does). */
static qkv_status ring_begin(ring *g, const qkv_attn_desc *desc, qkv_dist_layout layout,
                             MPI_Comm comm, int backward) {
    memset(g, 0, sizeof *g);
    g->comm = MPI_COMM_NULL;
    if (!desc) return QKV_ERR_NULL_POINTER;
    if (layout != QKV_DIST_CONTIGUOUS && layout != QKV_DIST_ZIGZAG) return QKV_ERR_BAD_ENUM;
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (!inited || finalized) return QKV_ERR_UNSUPPORTED;
    if (comm == MPI_COMM_NULL) return QKV_ERR_NULL_POINTER;
    qkv_status s = ring_check(desc, backward, &g->gplan);
    if (s != QKV_OK) return s;
    g->d = *desc;
    g->layout = layout;
    g->B = desc->batch;
    g->H = desc->heads;
    g->Hkv = desc->heads_kv ? desc->heads_kv : desc->heads;
    g->D = desc->dim;
    g->Dv = desc->dim_v ? desc->dim_v : desc->dim;
    g->softmax = desc->norm == QKV_NORM_SOFTMAX;
    g->posbias = desc->alibi_slopes || desc->rel_table;
    g->relu_div = desc->norm == QKV_NORM_RELU && desc->relu_divide_by_count;
    g->bias_h = desc->bias_kind == QKV_BIAS_SHARED ? 1 : desc->bias_kind == QKV_BIAS_PER_HEAD ? g->H : 0;
    if (!mpi_ok(MPI_Comm_dup(comm, &g->comm))) {
        g->comm = MPI_COMM_NULL;
        return QKV_ERR_IO;
    }
    MPI_Comm_set_errhandler(g->comm, MPI_ERRORS_RETURN);
    MPI_Comm_size(g->comm, &g->p);
    MPI_Comm_rank(g->comm, &g->r);
    owned_of(desc->n_q, g->p, g->r, layout, &g->mq);
    g->kown = qkv_alloc((size_t)g->p * sizeof(owned));
    g->blk_len = qkv_alloc((size_t)(g->B > 0 ? g->B : 1) * sizeof(int64_t));
    if (!g->kown || !g->blk_len) return QKV_ERR_OUT_OF_MEMORY;
    for (int o = 0; o < g->p; o++) {
        owned_of(desc->n_k, g->p, o, layout, &g->kown[o]);
        if (g->kown[o].local_n > g->max_kn) g->max_kn = g->kown[o].local_n;
    }
    int64_t f[4] = {g->B, g->max_kn, g->Hkv, g->D + g->Dv};
    if (!qkv_count_ok(&g->kv_elems, sizeof(float) * 2, 4, f)) return QKV_ERR_SIZE_OVERFLOW;
    if (g->kv_elems > INT_MAX) return QKV_ERR_SIZE_OVERFLOW; /* one MPI message */
    if (g->bias_h > 0) { /* one block's bias: my longest query chunk x the longest key chunk */
        int64_t mq = g->mq.c[0].len > g->mq.c[1].len ? g->mq.c[0].len : g->mq.c[1].len, mk = 0, bbn;
        for (int o = 0; o < g->p; o++)
            for (int t = 0; t < 2; t++)
                if (g->kown[o].c[t].len > mk) mk = g->kown[o].c[t].len;
        int64_t fb[3] = {g->bias_h, mq, mk};
        if (!qkv_count_ok(&bbn, sizeof(float), 3, fb)) return QKV_ERR_SIZE_OVERFLOW;
        g->bb = qkv_alloc((size_t)bbn * sizeof(float) + 1);
        if (!g->bb) return QKV_ERR_OUT_OF_MEMORY;
    }
    if (g->gplan.packed) { /* B = 1 (validated): sub-block offsets and lse */
        g->packed = 1;
        g->S = g->gplan.d.num_seqs;
        g->oq = g->gplan.d.seq_offsets_q;
        g->ok = g->gplan.d.seq_offsets_k; /* the plan made it oq when NULL */
        int64_t mq = g->mq.c[0].len > g->mq.c[1].len ? g->mq.c[0].len : g->mq.c[1].len, lgn;
        int64_t fl[2] = {g->H, mq};
        if (!qkv_count_ok(&lgn, sizeof(float), 2, fl)) return QKV_ERR_SIZE_OVERFLOW;
        g->goq = qkv_alloc((size_t)(g->S + 1) * sizeof(int64_t));
        g->gok = qkv_alloc((size_t)(g->S + 1) * sizeof(int64_t));
        g->lg = qkv_alloc((size_t)lgn * sizeof(float) + 1);
        if (!g->goq || !g->gok || !g->lg) return QKV_ERR_OUT_OF_MEMORY;
    }
    return QKV_OK;
}

static void ring_end(ring *g) {
    if (g->comm != MPI_COMM_NULL) MPI_Comm_free(&g->comm);
    qkv_free(g->kown);
    qkv_free(g->blk_len);
    qkv_free(g->bb);
    qkv_free(g->goq);
    qkv_free(g->gok);
    qkv_free(g->lg);
}

/* Every rank's status agreed: QKV_OK only when all are; otherwise this
 * rank's own failure, or the largest code of the others. A failing
 * reduction (a dead peer) is QKV_ERR_IO. */
static qkv_status agree(MPI_Comm comm, qkv_status mine) {
    int in = (int)mine, out = 0;
    if (comm == MPI_COMM_NULL) return mine;
    if (!mpi_ok(MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_MAX, comm))) return mine != QKV_OK ? mine : QKV_ERR_IO;
    if (mine != QKV_OK) return mine;
    return (qkv_status)out;
}

/* Merge one block's (o_b, lse_b) into the running (o, lse), rows of one
 * chunk: o [B, len, H, Dv], lse [B, H, len]. Exact up to rounding; a row
 * whose block saw no key (lse_b = -inf) is left alone, so a row that never
 * sees a key stays 0 with lse -inf (no exp(-inf - -inf)). */
static void merge(float *o, float *lse, const float *ob, const float *lb, int64_t B, int64_t len,
                  int64_t H, int64_t Dv) {
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < len; i++) {
                int64_t row = (b * H + h) * len + i;
                float l2 = lb[row], l1 = lse[row];
                if (l2 == -INFINITY) continue;
                float *dst = o + ((b * len + i) * H + h) * Dv;
                const float *src = ob + ((b * len + i) * H + h) * Dv;
                if (l1 == -INFINITY) {
                    memcpy(dst, src, (size_t)Dv * sizeof(float));
                    lse[row] = l2;
                    continue;
                }
                /* NaN in either propagates through m, and so to the row. */
                double m = l1 > l2 ? (double)l1 : (double)l2;
                if (isnan(l1) || isnan(l2)) m = NAN;
                double w1 = exp((double)l1 - m), w2 = exp((double)l2 - m), s = w1 + w2;
                double a = w1 / s, c = w2 / s;
                for (int64_t t = 0; t < Dv; t++) dst[t] = (float)(a * dst[t] + c * src[t]);
                lse[row] = (float)(m + log(s));
            }
}

/* ReLU and sigmoid weights are not normalised by the row: the output is
 * the plain sum of the blocks' outputs, and the lse output (the log-sum-exp
 * of the visible logits, whatever the normaliser) still merges by
 * log-sum-exp. */
static void merge_sum(float *o, float *lse, const float *ob, const float *lb, int64_t B, int64_t len,
                      int64_t H, int64_t Dv) {
    for (int64_t i = 0; i < B * len * H * Dv; i++) o[i] += ob[i];
    for (int64_t r = 0; r < B * H * len; r++) {
        float l2 = lb[r], l1 = lse[r];
        if (l2 == -INFINITY) continue;
        if (l1 == -INFINITY) {
            lse[r] = l2;
            continue;
        }
        double m = l1 > l2 ? (double)l1 : (double)l2;
        if (isnan(l1) || isnan(l2)) m = NAN;
        lse[r] = (float)(m + log(exp((double)l1 - m) + exp((double)l2 - m)));
    }
}

/* RELU divided by the count of visible keys: the count is global (all the
 * blocks of the row), known at home: the key range of the whole problem's
 * plan, less the keys the bias masks (-inf; this rank holds its queries'
 * bias rows for every key). Multiplies rows of x (chunk-major, [B, len, H,
 * X] per chunk) by 1 / count, 0 for a row that sees nothing, as the core
 * does. */
static void relu_scale(const ring *g, const float *bias_loc, float *x, int64_t X) {
    const int64_t B = g->B, H = g->H, nq_loc = g->mq.local_n, nk = g->d.n_k;
    for (int t = 0; t < g->mq.n; t++) {
        const chunk *c = &g->mq.c[t];
        float *xc = x + B * c->off * H * X;
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < c->len; i++) {
                int64_t lo, hi;
                qkv_plan_key_range(&g->gplan, b, c->start + i, &lo, &hi);
                for (int64_t h = 0; h < H; h++) {
                    float cnt = 0.0f;
                    if (g->bias_h > 0) {
                        const float *br = bias_loc + ((g->bias_h > 1 ? h : 0) * nq_loc + c->off + i) * nk;
                        for (int64_t j = lo; j < hi; j++) cnt += br[j] != -INFINITY;
                    } else if (hi > lo) {
                        cnt = (float)(hi - lo);
                    }
                    float mul = cnt > 0 ? 1.0f / cnt : 0.0f;
                    float *row = xc + ((b * c->len + i) * H + h) * X;
                    for (int64_t d = 0; d < X; d++) row[d] *= mul;
                }
            }
    }
}

/* ---- forward --------------------------------------------------------------- */

qkv_status qkv_ring_attention_forward(const qkv_attn_desc *desc, qkv_dist_layout layout,
                                      MPI_Comm comm, const void *q, const void *k, const void *v,
                                      void *out, void *lse) {
    ring g;
    qkv_status s = ring_begin(&g, desc, layout, comm, 0);
    if (g.comm == MPI_COMM_NULL || s != QKV_OK) { /* invalid request: the same on every rank */
        s = agree(g.comm, s);
        ring_end(&g);
        return s;
    }
    const int64_t B = g.B, H = g.H, Hkv = g.Hkv, D = g.D, Dv = g.Dv, nq_loc = g.mq.local_n;
    const owned *mine = &g.kown[g.r];
    float *qp = NULL, *acc = NULL, *acc_l = NULL, *ob = NULL, *lb = NULL, *buf[2] = {NULL, NULL};
    const float *bias_loc = g.d.bias;
    if (((!q || !out || (g.bias_h > 0 && !bias_loc)) && nq_loc > 0) || ((!k || !v) && mine->local_n > 0))
        s = QKV_ERR_NULL_POINTER;
    if (s == QKV_OK) {
        int64_t maxq = g.mq.c[0].len > g.mq.c[1].len ? g.mq.c[0].len : g.mq.c[1].len;
        size_t nq_rows = (size_t)(B * nq_loc * H);
        qp = qkv_alloc(nq_rows * (size_t)D * sizeof(float) + 1);
        acc = qkv_alloc(nq_rows * (size_t)Dv * sizeof(float) + 1);
        acc_l = qkv_alloc(nq_rows * sizeof(float) + 1);
        ob = qkv_alloc((size_t)(B * maxq * H * Dv) * sizeof(float) + 1);
        lb = qkv_alloc((size_t)(B * maxq * H) * sizeof(float) + 1);
        buf[0] = qkv_alloc((size_t)g.kv_elems * sizeof(float) + 1);
        buf[1] = qkv_alloc((size_t)g.kv_elems * sizeof(float) + 1);
        if (!qp || !acc || !acc_l || !ob || !lb || !buf[0] || !buf[1]) s = QKV_ERR_OUT_OF_MEMORY;
    }
    s = agree(g.comm, s);
    if (s == QKV_OK) {
        /* Chunk-major copies: my queries, my keys and values (the first
         * message), and the accumulators (0, lse -inf). */
        for (int t = 0; t < g.mq.n; t++) {
            const chunk *c = &g.mq.c[t];
            pack_rows(qp + B * c->off * H * D, q, B, nq_loc, c, H * D);
        }
        for (int t = 0; t < mine->n; t++) {
            pack_rows(kv_k(&g, buf[0], mine, t), k, B, mine->local_n, &mine->c[t], Hkv * D);
            pack_rows(kv_v(&g, buf[0], mine, t), v, B, mine->local_n, &mine->c[t], Hkv * Dv);
        }
        memset(acc, 0, (size_t)(B * nq_loc * H * Dv) * sizeof(float));
        for (int64_t i = 0; i < B * nq_loc * H; i++) acc_l[i] = -INFINITY;

        int next = (g.r + 1) % g.p, prev = (g.r + g.p - 1) % g.p;
        qkv_status cs = QKV_OK; /* compute status: a failure keeps the ring turning */
        int comm_ok = 1;
        for (int st = 0; st < g.p && comm_ok; st++) {
            int cur = st & 1, src = (g.r - st + g.p) % g.p;
            const owned *ko = &g.kown[src];
            MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
            if (st < g.p - 1) {
                int from = (g.r - st - 1 + 2 * g.p) % g.p;
                comm_ok = mpi_ok(MPI_Irecv(buf[cur ^ 1], (int)kv_count(&g, &g.kown[from]), MPI_FLOAT,
                                           prev, TAG_KV, g.comm, &req[0])) &&
                          mpi_ok(MPI_Isend(buf[cur], (int)kv_count(&g, ko), MPI_FLOAT, next, TAG_KV,
                                           g.comm, &req[1]));
            }
            for (int tq = 0; tq < g.mq.n && cs == QKV_OK && comm_ok; tq++) {
                const chunk *qc = &g.mq.c[tq];
                float *qc_p = qp + B * qc->off * H * D;
                for (int tk = 0; tk < ko->n && cs == QKV_OK; tk++) {
                    const chunk *kc = &ko->c[tk];
                    const float *kp = kv_k(&g, buf[cur], ko, tk), *vp = kv_v(&g, buf[cur], ko, tk);
                    sub_iter it;
                    sub sb;
                    int any = 0;
                    sub_begin(&g, qc, kc, &it);
                    while (cs == QKV_OK && sub_next(&g, qc, kc, &it, &sb)) {
                        qkv_plan bp;
                        cs = sub_plan(&g, qc, kc, &sb, bias_loc, &bp);
                        if (cs != QKV_OK) break;
                        if (!g.packed) { /* the whole pair */
                            cs = block_forward(&bp, qc_p, kp, vp, ob, lb);
                        } else { /* B = 1: rows qa.. of the pair, lse [H, lq] through g.lg */
                            if (!any) {
                                memset(ob, 0, (size_t)(qc->len * H * Dv) * sizeof(float));
                                for (int64_t t = 0; t < H * qc->len; t++) lb[t] = -INFINITY;
                            }
                            cs = block_forward(&bp, qc_p + sb.qa * H * D, kp + sb.ka * Hkv * D,
                                               vp + sb.ka * Hkv * Dv, ob + sb.qa * H * Dv, g.lg);
                            for (int64_t h = 0; h < H && cs == QKV_OK; h++)
                                memcpy(lb + h * qc->len + sb.qa, g.lg + h * sb.lq, (size_t)sb.lq * sizeof(float));
                        }
                        any = 1;
                    }
                    if (cs == QKV_OK && any)
                        (g.softmax ? merge : merge_sum)(acc + B * qc->off * H * Dv, acc_l + B * H * qc->off, ob, lb,
                                                        B, qc->len, H, Dv);
                    if (!progress(2, req)) comm_ok = 0;
                }
            }
            if (!mpi_ok(MPI_Waitall(2, req, MPI_STATUSES_IGNORE))) comm_ok = 0;
        }
        s = agree(g.comm, comm_ok ? cs : QKV_ERR_IO);
        if (s == QKV_OK && g.relu_div) relu_scale(&g, bias_loc, acc, Dv);
        if (s == QKV_OK) {
            for (int t = 0; t < g.mq.n; t++) {
                const chunk *c = &g.mq.c[t];
                unpack_rows(out, acc + B * c->off * H * Dv, B, nq_loc, c, H * Dv);
                if (lse) unpack_lse(lse, acc_l + B * H * c->off, B, H, nq_loc, c);
            }
        }
    }
    qkv_free(qp);
    qkv_free(acc);
    qkv_free(acc_l);
    qkv_free(ob);
    qkv_free(lb);
    qkv_free(buf[0]);
    qkv_free(buf[1]);
    ring_end(&g);
    return s;
}

/* ---- backward -------------------------------------------------------------- */

static void add_to(float *dst, const float *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] += src[i];
}

qkv_status qkv_ring_attention_backward(const qkv_attn_desc *desc, qkv_dist_layout layout,
                                       MPI_Comm comm, const void *q, const void *k, const void *v,
                                       const void *out, const void *lse, const void *dout,
                                       void *dq, void *dk, void *dv) {
    qkv_attn_grads gr;
    memset(&gr, 0, sizeof gr);
    gr.dq = dq;
    gr.dk = dk;
    gr.dv = dv;
    return qkv_ring_attention_backward_grads(desc, layout, comm, q, k, v, out, lse, dout, &gr);
}

/* The bias gradient of a block [bias_h, lq, lk] (written by the core,
 * summed over the batch, and over the heads when shared) into this rank's
 * rows [bias_h, nq_loc, n_k]: each (query chunk, key chunk) pair is
 * computed exactly once, at home, so its entries are copied, not added. */
static void scatter_dbias(const ring *g, float *dbias, const float *blk, const chunk *qc, const chunk *kc,
                          const sub *sb) {
    const int64_t nq_loc = g->mq.local_n, nk = g->d.n_k;
    for (int64_t h = 0; h < g->bias_h; h++)
        for (int64_t i = 0; i < sb->lq; i++)
            memcpy(dbias + (h * nq_loc + qc->off + sb->qa + i) * nk + kc->start + sb->ka, blk + (h * sb->lq + i) * sb->lk,
                   (size_t)sb->lk * sizeof(float));
}

qkv_status qkv_ring_attention_backward_grads(const qkv_attn_desc *desc, qkv_dist_layout layout, MPI_Comm comm,
                                             const void *q, const void *k, const void *v, const void *out,
                                             const void *lse, const void *dout, const qkv_attn_grads *grads) {
    ring g;
    qkv_status s = ring_begin(&g, desc, layout, comm, 1);
    void *dq = grads ? grads->dq : NULL, *dk = grads ? grads->dk : NULL, *dv = grads ? grads->dv : NULL;
    float *dbias = grads && g.bias_h > 0 ? grads->dbias : NULL, *dbb = NULL;
    /* d_rel_table and the additive score's d_additive_w1, _w2, _w: each
     * block's (drb, dab) summed in this rank's block order into dra, daa, in
     * double, then over the ranks (every rank takes part when any asks). */
    double *dra = NULL, *daa = NULL;
    float *drb = NULL, *dab = NULL;
    if (g.comm == MPI_COMM_NULL || s != QKV_OK) {
        s = agree(g.comm, s);
        ring_end(&g);
        return s;
    }
    const int64_t B = g.B, H = g.H, Hkv = g.Hkv, D = g.D, Dv = g.Dv, nq_loc = g.mq.local_n;
    const owned *mine = &g.kown[g.r];
    float *qp = NULL, *op = NULL, *lp = NULL, *gp = NULL, *dqa = NULL, *dqb = NULL, *scratch = NULL;
    float *kv[2] = {NULL, NULL}, *dkv[2] = {NULL, NULL}, *dkvb = NULL, *o_own = NULL, *l_own = NULL;
    const float *bias_loc = g.d.bias;
    if (!grads || ((!q || !dout || !dq || (g.bias_h > 0 && !bias_loc)) && nq_loc > 0) ||
        ((!k || !v || !dk || !dv) && mine->local_n > 0))
        s = QKV_ERR_NULL_POINTER;
    /* Without the forward's outputs on some rank: every rank runs the
     * forward ring first (decided together: it is collective). Only the
     * softmax needs them (its global normaliser); ReLU and sigmoid weights
     * depend on their own logit alone. */
    int need = g.softmax && (!out || !lse), need_any = need;
    if (!mpi_ok(MPI_Allreduce(&need, &need_any, 1, MPI_INT, MPI_MAX, g.comm))) s = QKV_ERR_IO;
    int want_rel = desc->rel_table && grads && grads->d_rel_table, want_rel_any = want_rel;
    if (!mpi_ok(MPI_Allreduce(&want_rel, &want_rel_any, 1, MPI_INT, MPI_MAX, g.comm))) s = QKV_ERR_IO;
    const int64_t n_rel = desc->rel_table ? g.gplan.n_rel_elems : 0;
    const int additive = desc->score == QKV_SCORE_ADDITIVE;
    int want_add = additive && grads && (grads->d_additive_w1 || grads->d_additive_w2 || grads->d_additive_w),
        want_add_any = want_add;
    if (!mpi_ok(MPI_Allreduce(&want_add, &want_add_any, 1, MPI_INT, MPI_MAX, g.comm))) s = QKV_ERR_IO;
    /* W1 and W2 [H, A, D], w [H, A] */
    const int64_t n_aw1 = additive ? H * desc->additive_dim * D : 0, n_add = additive ? 2 * n_aw1 + H * desc->additive_dim : 0;
    size_t nq_rows = (size_t)(B * nq_loc * H);
    if (s == QKV_OK) {
        int64_t maxq = g.mq.c[0].len > g.mq.c[1].len ? g.mq.c[0].len : g.mq.c[1].len;
        qp = qkv_alloc(nq_rows * (size_t)D * sizeof(float) + 1);
        op = qkv_alloc(nq_rows * (size_t)Dv * sizeof(float) + 1);
        lp = qkv_alloc(nq_rows * sizeof(float) + 1);
        gp = qkv_alloc(nq_rows * (size_t)Dv * sizeof(float) + 1);
        dqa = qkv_alloc(nq_rows * (size_t)D * sizeof(float) + 1);
        dqb = qkv_alloc((size_t)(B * maxq * H * D) * sizeof(float) + 1);
        dkvb = qkv_alloc((size_t)g.kv_elems * sizeof(float) + 1);
        for (int t = 0; t < 2; t++) {
            kv[t] = qkv_alloc((size_t)g.kv_elems * sizeof(float) + 1);
            dkv[t] = qkv_alloc((size_t)g.kv_elems * sizeof(float) + 1);
        }
        if (!qp || !op || !lp || !gp || !dqa || !dqb || !dkvb || !kv[0] || !kv[1] || !dkv[0] || !dkv[1])
            s = QKV_ERR_OUT_OF_MEMORY;
        if (s == QKV_OK && dbias) { /* one block's bias gradient */
            int64_t mq = maxq, mk = 0;
            for (int o = 0; o < g.p; o++)
                for (int t = 0; t < 2; t++)
                    if (g.kown[o].c[t].len > mk) mk = g.kown[o].c[t].len;
            dbb = qkv_alloc((size_t)(g.bias_h * mq * mk) * sizeof(float) + 1);
            if (!dbb) s = QKV_ERR_OUT_OF_MEMORY;
        }
        if (s == QKV_OK && want_rel_any && n_rel > 0) {
            drb = qkv_alloc((size_t)n_rel * sizeof(float));
            dra = qkv_alloc((size_t)n_rel * sizeof(double));
            if (!drb || !dra) s = QKV_ERR_OUT_OF_MEMORY;
            else memset(dra, 0, (size_t)n_rel * sizeof(double));
        }
        if (s == QKV_OK && want_add_any && n_add > 0) {
            dab = qkv_alloc((size_t)n_add * sizeof(float));
            daa = qkv_alloc((size_t)n_add * sizeof(double));
            if (!dab || !daa) s = QKV_ERR_OUT_OF_MEMORY;
            else memset(daa, 0, (size_t)n_add * sizeof(double));
        }
        if (s == QKV_OK && g.mq.n > 1) { /* two query chunks add into the same keys */
            scratch = qkv_alloc((size_t)g.kv_elems * sizeof(float) + 1);
            if (!scratch) s = QKV_ERR_OUT_OF_MEMORY;
        }
        if (s == QKV_OK && need_any) {
            o_own = qkv_alloc(nq_rows * (size_t)Dv * sizeof(float) + 1);
            l_own = qkv_alloc(nq_rows * sizeof(float) + 1);
            if (!o_own || !l_own) s = QKV_ERR_OUT_OF_MEMORY;
        }
    }
    s = agree(g.comm, s);
    if (s == QKV_OK && need_any) {
        s = qkv_ring_attention_forward(desc, layout, comm, q, k, v, o_own, l_own);
        out = o_own;
        lse = l_own;
    }
    if (s == QKV_OK) {
        for (int t = 0; t < g.mq.n; t++) {
            const chunk *c = &g.mq.c[t];
            pack_rows(qp + B * c->off * H * D, q, B, nq_loc, c, H * D);
            pack_rows(gp + B * c->off * H * Dv, dout, B, nq_loc, c, H * Dv);
            if (g.softmax) {
                pack_rows(op + B * c->off * H * Dv, out, B, nq_loc, c, H * Dv);
                pack_lse(lp + B * H * c->off, lse, B, H, nq_loc, c);
            }
        }
        /* ReLU / count: the blocks run undivided on dO / count. */
        if (g.relu_div) relu_scale(&g, bias_loc, gp, Dv);
        for (int t = 0; t < mine->n; t++) {
            pack_rows(kv_k(&g, kv[0], mine, t), k, B, mine->local_n, &mine->c[t], Hkv * D);
            pack_rows(kv_v(&g, kv[0], mine, t), v, B, mine->local_n, &mine->c[t], Hkv * Dv);
        }
        memset(dqa, 0, nq_rows * (size_t)D * sizeof(float));
        if (dbias) /* pairs nobody sees keep 0 */
            memset(dbias, 0, (size_t)(g.bias_h * nq_loc * desc->n_k) * sizeof(float));

        int next = (g.r + 1) % g.p, prev = (g.r + g.p - 1) % g.p;
        qkv_status cs = QKV_OK;
        int comm_ok = 1;
        /* dsend[t]: the send of the dK/dV partial in dkv[t]. Every wait is on
         * a message of an earlier step than the waiter's, and receives are
         * posted before waits, so the ring cannot deadlock even when large
         * messages need the receiver (rendezvous). */
        MPI_Request dsend[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
        for (int st = 0; st < g.p && comm_ok; st++) {
            int cur = st & 1, src = (g.r - st + g.p) % g.p;
            const owned *ko = &g.kown[src];
            int64_t cnt = kv_count(&g, ko);
            MPI_Request req[3] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL, MPI_REQUEST_NULL};
            if (st < g.p - 1) {
                int from = (g.r - st - 1 + 2 * g.p) % g.p;
                comm_ok = mpi_ok(MPI_Irecv(kv[cur ^ 1], (int)kv_count(&g, &g.kown[from]), MPI_FLOAT, prev,
                                           TAG_KV, g.comm, &req[0])) &&
                          mpi_ok(MPI_Isend(kv[cur], (int)cnt, MPI_FLOAT, next, TAG_KV, g.comm, &req[1]));
            }
            /* The partial dK/dV of src from the ranks before (none at step
             * 0) arrives in dkv[cur], last sent two steps ago. */
            if (comm_ok && !mpi_ok(MPI_Wait(&dsend[cur], MPI_STATUS_IGNORE))) comm_ok = 0;
            if (comm_ok && st > 0)
                comm_ok = mpi_ok(MPI_Irecv(dkv[cur], (int)cnt, MPI_FLOAT, prev, TAG_DKV, g.comm, &req[2]));
            /* This rank's contribution to src's key gradients, into dkvb
             * (the message layout), while the partial is on its way. */
            memset(dkvb, 0, (size_t)cnt * sizeof(float));
            for (int tq = 0; tq < g.mq.n && cs == QKV_OK && comm_ok; tq++) {
                const chunk *qc = &g.mq.c[tq];
                for (int tk = 0; tk < ko->n && cs == QKV_OK; tk++) {
                    const chunk *kc = &ko->c[tk];
                    int64_t nk_el = B * kc->len * Hkv * D, nv_el = B * kc->len * Hkv * Dv;
                    float *dkc = kv_k(&g, dkvb, ko, tk), *dvc = kv_v(&g, dkvb, ko, tk);
                    const float *kp = kv_k(&g, kv[cur], ko, tk), *vp = kv_v(&g, kv[cur], ko, tk);
                    /* The core overwrites its dQ, dK, dV: scratch for dK/dV
                     * when two query chunks add into the same keys. A packed
                     * pair's sub-blocks write disjoint rows: the rest stay 0
                     * (dkvb is cleared at each step). */
                    float *dkt = scratch ? scratch : dkc, *dvt = scratch ? scratch + nk_el : dvc;
                    const float *qcp = qp + B * qc->off * H * D, *ocp = op + B * qc->off * H * Dv;
                    const float *lcp = lp + B * H * qc->off, *gcp = gp + B * qc->off * H * Dv;
                    sub_iter it;
                    sub sb;
                    int any = 0;
                    sub_begin(&g, qc, kc, &it);
                    while (cs == QKV_OK && sub_next(&g, qc, kc, &it, &sb)) {
                        qkv_plan bp; /* the fast path, given the global O and lse */
                        cs = sub_plan(&g, qc, kc, &sb, bias_loc, &bp);
                        if (cs != QKV_OK) break;
                        if (g.packed && !any) {
                            memset(dqb, 0, (size_t)(qc->len * H * D) * sizeof(float));
                            if (scratch) memset(scratch, 0, (size_t)(nk_el + nv_el) * sizeof(float));
                        }
                        any = 1;
                        qkv_attn_grads gr;
                        memset(&gr, 0, sizeof gr);
                        gr.dq = dqb + sb.qa * H * D;
                        gr.dk = dkt + sb.ka * Hkv * D;
                        gr.dv = dvt + sb.ka * Hkv * Dv;
                        gr.dbias = dbb;
                        gr.d_rel_table = drb;
                        if (dab) {
                            gr.d_additive_w1 = dab;
                            gr.d_additive_w2 = dab + n_aw1;
                            gr.d_additive_w = dab + 2 * n_aw1;
                        }
                        const float *lsub = lcp;
                        if (g.packed && g.softmax) { /* B = 1: lse [H, len] -> [H, lq] */
                            for (int64_t h = 0; h < H; h++)
                                memcpy(g.lg + h * sb.lq, lcp + h * qc->len + sb.qa, (size_t)sb.lq * sizeof(float));
                            lsub = g.lg;
                        }
                        cs = block_backward(&bp, qcp + sb.qa * H * D, kp + sb.ka * Hkv * D, vp + sb.ka * Hkv * Dv,
                                            g.softmax ? ocp + sb.qa * H * Dv : NULL, g.softmax ? lsub : NULL,
                                            gcp + sb.qa * H * Dv, &gr);
                        if (cs == QKV_OK && dbias) scatter_dbias(&g, dbias, dbb, qc, kc, &sb);
                        for (int64_t t = 0; cs == QKV_OK && drb && t < n_rel; t++) dra[t] += drb[t];
                        for (int64_t t = 0; cs == QKV_OK && dab && t < n_add; t++) daa[t] += dab[t];
                    }
                    if (cs == QKV_OK && any) {
                        add_to(dqa + B * qc->off * H * D, dqb, B * qc->len * H * D);
                        if (scratch) {
                            add_to(dkc, scratch, nk_el);
                            add_to(dvc, scratch + nk_el, nv_el);
                        }
                    }
                    if (!progress(3, req)) comm_ok = 0;
                }
            }
            if (comm_ok && !mpi_ok(MPI_Wait(&req[2], MPI_STATUS_IGNORE))) comm_ok = 0;
            if (comm_ok) {
                if (st == 0) memcpy(dkv[cur], dkvb, (size_t)cnt * sizeof(float));
                else add_to(dkv[cur], dkvb, cnt);
                /* On to the next holder of src's keys, or (after the last
                 * step) to src itself; overlaps the next step. */
                comm_ok = mpi_ok(MPI_Isend(dkv[cur], (int)cnt, MPI_FLOAT, next, TAG_DKV, g.comm, &dsend[cur]));
            }
            if (!mpi_ok(MPI_Waitall(2, req, MPI_STATUSES_IGNORE))) comm_ok = 0;
        }
        /* My own keys' gradients, summed over every rank, come back from
         * prev (the src of its last step was this rank). */
        if (comm_ok) {
            int fin = ((g.p - 1) & 1) ^ 1; /* the buffer not in flight */
            MPI_Request rq[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
            comm_ok = mpi_ok(MPI_Wait(&dsend[fin], MPI_STATUS_IGNORE)) &&
                      mpi_ok(MPI_Irecv(dkv[fin], (int)kv_count(&g, mine), MPI_FLOAT, prev, TAG_DKV, g.comm,
                                       &rq[0]));
            rq[1] = dsend[fin ^ 1];
            dsend[fin ^ 1] = MPI_REQUEST_NULL;
            if (!mpi_ok(MPI_Waitall(2, rq, MPI_STATUSES_IGNORE))) comm_ok = 0;
            if (comm_ok)
                for (int t = 0; t < mine->n; t++) {
                    unpack_rows(dk, kv_k(&g, dkv[fin], mine, t), B, mine->local_n, &mine->c[t], Hkv * D);
                    unpack_rows(dv, kv_v(&g, dkv[fin], mine, t), B, mine->local_n, &mine->c[t], Hkv * Dv);
                }
        }
        s = agree(g.comm, comm_ok ? cs : QKV_ERR_IO);
        if (s == QKV_OK && dra) {
            if (!mpi_ok(MPI_Allreduce(MPI_IN_PLACE, dra, (int)n_rel, MPI_DOUBLE, MPI_SUM, g.comm))) s = QKV_ERR_IO;
            float *drel = want_rel ? grads->d_rel_table : NULL;
            for (int64_t t = 0; s == QKV_OK && drel && t < n_rel; t++) drel[t] = (float)dra[t];
        }
        if (s == QKV_OK && daa) {
            if (!mpi_ok(MPI_Allreduce(MPI_IN_PLACE, daa, (int)n_add, MPI_DOUBLE, MPI_SUM, g.comm))) s = QKV_ERR_IO;
            float *dst[3] = {want_add ? grads->d_additive_w1 : NULL, want_add ? grads->d_additive_w2 : NULL,
                             want_add ? grads->d_additive_w : NULL};
            const int64_t at[4] = {0, n_aw1, 2 * n_aw1, n_add};
            for (int part = 0; s == QKV_OK && part < 3; part++)
                for (int64_t t = at[part]; dst[part] && t < at[part + 1]; t++) dst[part][t - at[part]] = (float)daa[t];
        }
        if (s == QKV_OK)
            for (int t = 0; t < g.mq.n; t++) {
                const chunk *c = &g.mq.c[t];
                unpack_rows(dq, dqa + B * c->off * H * D, B, nq_loc, c, H * D);
            }
    }
    qkv_free(qp);
    qkv_free(op);
    qkv_free(lp);
    qkv_free(gp);
    qkv_free(dqa);
    qkv_free(dqb);
    qkv_free(dkvb);
    qkv_free(scratch);
    qkv_free(dbb);
    qkv_free(drb);
    qkv_free(dra);
    qkv_free(dab);
    qkv_free(daa);
    qkv_free(o_own);
    qkv_free(l_own);
    for (int t = 0; t < 2; t++) {
        qkv_free(kv[t]);
        qkv_free(dkv[t]);
    }
    ring_end(&g);
    return s;
}
