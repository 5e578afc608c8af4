/* Validation of an attention descriptor, done once at the API boundary, and
 * the mask reduced to one contiguous key range per query: every mask kind
 * (causal, window, key lengths, packed sequences) intersects to an interval,
 * so every implementation can skip masked keys without reading them. */
#include <math.h>
#include <string.h>

#include "core/internal.h"
#include "core/rng.h"

void qkv_attn_desc_init(qkv_attn_desc *desc) {
    /* Static: every other field, and the padding, zero. */
    static const qkv_attn_desc defaults = {.dtype = QKV_F32, .score = QKV_SCORE_SCALED_DOT, .temperature = 1.0,
                                           .norm = QKV_NORM_SOFTMAX, .mask = QKV_MASK_NONE,
                                           .bias_kind = QKV_BIAS_NONE, .impl = QKV_IMPL_AUTO};
    if (desc) memcpy(desc, &defaults, sizeof *desc);
}

static qkv_status check_offsets(const int64_t *off, int64_t num_seqs, int64_t total) {
    if (off[0] != 0 || off[num_seqs] != total) return QKV_ERR_SEQ_OFFSETS;
    for (int64_t s = 0; s < num_seqs; s++)
        if (off[s + 1] < off[s]) return QKV_ERR_SEQ_OFFSETS;
    return QKV_OK;
}

/* The element counts of a descriptor's tensors, overflow-checked against
 * int64 and size_t bytes (f64 is the widest element); d has heads_kv and
 * dim_v resolved. */
static qkv_status plan_counts(const qkv_attn_desc *dp, qkv_plan *plan) {
    const qkv_attn_desc d = *dp;
    const size_t elem = sizeof(double);
    int64_t f_q[4] = {d.batch, d.n_q, d.heads, d.dim};
    int64_t f_k[4] = {d.batch, d.n_k, d.heads_kv, d.dim};
    int64_t f_v[4] = {d.batch, d.n_k, d.heads_kv, d.dim_v};
    int64_t f_o[4] = {d.batch, d.n_q, d.heads, d.dim_v};
    int64_t f_a[4] = {d.batch, d.heads, d.n_q, d.n_k};
    int64_t f_l[3] = {d.batch, d.heads, d.n_q};
    int64_t f_b[3] = {d.bias_kind == QKV_BIAS_PER_HEAD ? d.heads : 1, d.n_q, d.n_k};
    int64_t f_w[3] = {d.heads, d.score == QKV_SCORE_ADDITIVE ? d.additive_dim : 0, d.dim};
    int64_t f_wv[2] = {d.heads, d.score == QKV_SCORE_ADDITIVE ? d.additive_dim : 0};
    if (!qkv_count_ok(&plan->n_q_elems, elem, 4, f_q) || !qkv_count_ok(&plan->n_k_elems, elem, 4, f_k) ||
        !qkv_count_ok(&plan->n_v_elems, elem, 4, f_v) || !qkv_count_ok(&plan->n_o_elems, elem, 4, f_o) ||
        !qkv_count_ok(&plan->n_lse_elems, elem, 3, f_l) || !qkv_count_ok(&plan->n_add_w_elems, elem, 3, f_w) ||
        !qkv_count_ok(&plan->n_add_v_elems, elem, 2, f_wv))
        return QKV_ERR_SIZE_OVERFLOW;
    /* The n x n sizes only matter when the caller passes such a buffer; an
     * overflow there is reported by the call that needs it. */
    if (!qkv_count_ok(&plan->n_attn_elems, elem, 4, f_a)) plan->n_attn_elems = -1;
    if (!qkv_count_ok(&plan->n_bias_elems, elem, 3, f_b)) plan->n_bias_elems = -1;
    if (d.bias_kind != QKV_BIAS_NONE && plan->n_bias_elems < 0) return QKV_ERR_SIZE_OVERFLOW;
    return QKV_OK;
}

qkv_status qkv_plan_make(const qkv_attn_desc *desc, qkv_plan *plan) {
    if (!desc || !plan) return QKV_ERR_NULL_POINTER;
    qkv_attn_desc d = *desc;
    memset(plan, 0, sizeof *plan);

    if (d.dtype == QKV_I32 || d.dtype == QKV_I64) return QKV_ERR_DTYPE; /* a dtype, not for attention */
    if (d.dtype != QKV_F32 && d.dtype != QKV_F64 && d.dtype != QKV_BF16 && d.dtype != QKV_F16)
        return QKV_ERR_BAD_ENUM; /* BF16/F16: attention/half_attn.c converts, then F32 */
    if ((unsigned)d.score > QKV_SCORE_ADDITIVE || (unsigned)d.norm > QKV_NORM_SIGMOID ||
        (unsigned)d.mask > QKV_MASK_CAUSAL_WINDOW || (unsigned)d.bias_kind > QKV_BIAS_PER_HEAD ||
        (unsigned)d.impl > QKV_IMPL_FAST)
        return QKV_ERR_BAD_ENUM;

    if (d.heads_kv == 0) d.heads_kv = d.heads;
    if (d.dim_v == 0) d.dim_v = d.dim;
    if (d.batch <= 0 || d.n_q <= 0 || d.n_k <= 0 || d.heads <= 0 || d.heads_kv <= 0 ||
        d.dim <= 0 || d.dim_v <= 0 || d.threads < 0)
        return QKV_ERR_BAD_SIZE;
    if (d.score == QKV_SCORE_ADDITIVE && d.additive_dim <= 0) return QKV_ERR_BAD_SIZE;

    qkv_status s = plan_counts(&d, plan);
    if (s != QKV_OK) return s;

    if (d.heads % d.heads_kv != 0) return QKV_ERR_HEADS;

    if (d.score == QKV_SCORE_SCALED_DOT) {
        if (!isfinite(d.scale)) return QKV_ERR_BAD_PARAMETER;
        if (d.scale == 0.0) d.scale = 1.0 / sqrt((double)d.dim);
    } else {
        d.scale = 1.0;
    }
    if (d.score == QKV_SCORE_COSINE && !(isfinite(d.temperature) && d.temperature > 0.0))
        return QKV_ERR_BAD_PARAMETER;
    if (!(isfinite(d.softcap) && d.softcap >= 0.0)) return QKV_ERR_BAD_PARAMETER;
    if (!(d.dropout >= 0.0 && d.dropout < 1.0)) return QKV_ERR_BAD_PARAMETER;

    switch (d.mask) {
    case QKV_MASK_NONE:
        plan->left = plan->right = QKV_UNBOUNDED;
        break;
    case QKV_MASK_CAUSAL:
        plan->left = QKV_UNBOUNDED;
        plan->right = 0;
        break;
    case QKV_MASK_WINDOW:
        if (d.window_left < 0 || d.window_right < 0) return QKV_ERR_WINDOW;
        plan->left = d.window_left;
        plan->right = d.window_right;
        break;
    case QKV_MASK_CAUSAL_WINDOW:
        if (d.window_left < 0 || d.window_right != 0) return QKV_ERR_WINDOW;
        plan->left = d.window_left;
        plan->right = 0;
        break;
    }

    if (d.key_lengths)
        for (int64_t b = 0; b < d.batch; b++)
            if (d.key_lengths[b] < 0 || d.key_lengths[b] > d.n_k) return QKV_ERR_KEY_LENGTHS;

    if (d.seq_offsets_q || d.num_seqs != 0 || d.seq_offsets_k) {
        if (!d.seq_offsets_q) return QKV_ERR_NULL_POINTER;
        if (d.num_seqs <= 0 || d.batch != 1) return QKV_ERR_SEQ_OFFSETS;
        if (!d.seq_offsets_k && d.n_q != d.n_k) return QKV_ERR_SEQ_OFFSETS;
        s = check_offsets(d.seq_offsets_q, d.num_seqs, d.n_q);
        if (s == QKV_OK && d.seq_offsets_k) s = check_offsets(d.seq_offsets_k, d.num_seqs, d.n_k);
        if (s != QKV_OK) return s;
        if (!d.seq_offsets_k) d.seq_offsets_k = d.seq_offsets_q;
        plan->packed = 1;
    }

    if (d.rel2d_width < 0) return QKV_ERR_BAD_PARAMETER;
    if (d.rel_table && d.rel2d_width > 0) {
        int64_t side = 2 * d.rel_max_distance + 1;
        if (d.rel_max_distance < 1 || d.rel_max_distance > (1 << 20) || d.rel_buckets != side * side)
            return QKV_ERR_BAD_PARAMETER;
        if (d.seq_offsets_q || d.num_seqs) return QKV_ERR_UNSUPPORTED;
    }
    if (d.rel_table) {
        int64_t f_r[2] = {d.heads, d.rel_buckets};
        if (d.rel2d_width == 0 && (d.rel_buckets < (d.rel_bidirectional ? 4 : 2) || d.rel_max_distance < 1))
            return QKV_ERR_BAD_PARAMETER;
        if (!qkv_count_ok(&plan->n_rel_elems, sizeof(double), 2, f_r)) return QKV_ERR_SIZE_OVERFLOW;
    }

    if (d.bias_kind != QKV_BIAS_NONE && !d.bias) return QKV_ERR_NULL_POINTER;
    if (d.score == QKV_SCORE_ADDITIVE && (!d.additive_w1 || !d.additive_w2 || !d.additive_w))
        return QKV_ERR_NULL_POINTER;

    plan->d = d;
    plan->group = d.heads / d.heads_kv;
    return QKV_OK;
}

/* A side shifted by `by`: an unbounded one stays unbounded. */
static int64_t shift_side(int64_t side, int64_t by) { return side >= QKV_SIDE_WIDE ? QKV_UNBOUNDED : side + by; }

qkv_status qkv_plan_block(const qkv_plan *whole, const qkv_plan_block_desc *blk, qkv_plan *out) {
    *out = *whole;
    qkv_attn_desc *d = &out->d;
    d->n_q = blk->n_q;
    d->n_k = blk->n_k;
    d->key_lengths = blk->key_lengths;
    d->num_seqs = blk->num_seqs > 0 ? blk->num_seqs : 0;
    d->seq_offsets_q = d->num_seqs ? blk->seq_offsets_q : NULL;
    d->seq_offsets_k = d->num_seqs ? blk->seq_offsets_k : NULL;
    d->bias_kind = blk->bias_kind;
    d->bias = blk->bias;
    out->packed = d->num_seqs > 0;
    out->left = shift_side(whole->left, -blk->shift);
    out->right = shift_side(whole->right, blk->shift);
    out->pos_shift = whole->pos_shift + blk->shift;
    out->q_origin = whole->q_origin + blk->q_origin;
    out->k_origin = whole->k_origin + blk->k_origin;
    return plan_counts(d, out);
}

qkv_status qkv_attn_desc_check(const qkv_attn_desc *desc) {
    qkv_plan p;
    return qkv_plan_make(desc, &p);
}

/* Clamp a + sign * b into [lo, hi] without overflow: b >= 0 may be as large
 * as INT64_MAX (a window wider than any sequence); |a|, |lo|, |hi| are
 * sequence positions, far from the int64 limits. */
static int64_t clamp_add(int64_t a, int64_t b, int sign, int64_t lo, int64_t hi) {
    if (sign > 0) return b >= hi - a ? hi : (a + b < lo ? lo : a + b);
    return b >= a - lo ? lo : (a - b > hi ? hi : a - b);
}

/* The sequence of query i: its first query q0, length nq, first key k0 and
 * number of keys nk (the whole batch row when not packed). */
static void query_sequence(const qkv_plan *p, int64_t i, int64_t *q0_, int64_t *nq_, int64_t *k0_,
                           int64_t *nk_) {
    int64_t q0 = 0, nq = p->d.n_q, k0 = 0, nk = p->d.n_k;
    if (p->packed) {
        /* Binary search the sequence holding query i: the last s with
         * off_q[s] <= i and off_q[s+1] > i (skipping empty sequences). */
        const int64_t *oq = p->d.seq_offsets_q;
        int64_t a = 0, z = p->d.num_seqs - 1;
        while (a < z) {
            int64_t m = a + (z - a + 1) / 2;
            if (oq[m] <= i) a = m; else z = m - 1;
        }
        q0 = oq[a];
        nq = oq[a + 1] - q0;
        k0 = p->d.seq_offsets_k[a];
        nk = p->d.seq_offsets_k[a + 1] - k0;
    }
    *q0_ = q0;
    *nq_ = nq;
    *k0_ = k0;
    *nk_ = nk;
}

int64_t qkv_plan_query_blocks(const qkv_plan *p, int64_t bq, int64_t *starts) {
    const int64_t nq = p->d.n_q;
    int64_t count = 0;
    if (!p->packed) {
        count = (nq + bq - 1) / bq;
        if (starts)
            for (int64_t u = 0; u <= count; u++) starts[u] = u < count ? u * bq : nq;
        return count;
    }
    const int64_t *oq = p->d.seq_offsets_q;
    int64_t open = -1; /* first row of a block of joined short sequences, or -1 */
    for (int64_t s = 0; s < p->d.num_seqs; s++) {
        const int64_t a = oq[s], z = oq[s + 1];
        if (z == a) continue;
        if (open >= 0 && (z - open > QKV_PLAN_JOIN_ROWS || z - open > bq)) open = -1; /* it stays as it is */
        if (open >= 0) continue; /* joined to the open block */
        if (z - a < QKV_PLAN_JOIN_ROWS && z - a <= bq) { /* short: opens a block others may join */
            if (starts) starts[count] = a;
            count++;
            open = a;
            continue;
        }
        for (int64_t r = a; r < z; r += bq) {
            if (starts) starts[count] = r;
            count++;
        }
    }
    if (starts) starts[count] = nq;
    return count;
}

int64_t qkv_plan_query_position(const qkv_plan *p, int64_t i) {
    int64_t q0, nq, k0, nk;
    query_sequence(p, i, &q0, &nq, &k0, &nk);
    return k0 + (i - q0) + nk - nq + p->pos_shift;
}

void qkv_plan_key_range(const qkv_plan *p, int64_t b, int64_t i, int64_t *lo, int64_t *hi) {
    int64_t q0, nq, k0, nk;
    query_sequence(p, i, &q0, &nq, &k0, &nk);
    int64_t kend = nk;
    if (p->d.key_lengths && p->d.key_lengths[b] < kend) kend = p->d.key_lengths[b];
    int64_t pos = (i - q0) + nk - nq; /* bottom-right aligned position among this sequence's keys */
    int64_t l = clamp_add(pos, p->left, -1, 0, kend);
    int64_t h = clamp_add(pos, p->right, +1, -1, kend - 1) + 1;
    if (h > kend) h = kend;
    if (l > h) l = h;
    *lo = k0 + l;
    *hi = k0 + h;
}

int64_t qkv_relpos_bucket(int64_t r, int64_t buckets, int64_t max_distance, int bidirectional) {
    if (buckets < (bidirectional ? 4 : 2) || max_distance < 1) return -1;
    int64_t ret = 0, n;
    if (bidirectional) {
        buckets /= 2;
        if (r > 0) ret += buckets;
        n = r < 0 ? -r : r;
    } else {
        n = r < 0 ? -r : 0;
    }
    int64_t max_exact = buckets / 2;
    if (n < max_exact) return ret + n;
    /* Logarithmic buckets, computed in float as T5's reference code does so
     * that learned tables carry over bucket for bucket. */
    int64_t large = buckets - 1;
    if (max_distance > max_exact) {
        float f = logf((float)n / (float)max_exact) / (float)log((double)max_distance / (double)max_exact) *
                  (float)(buckets - max_exact);
        int64_t v = max_exact + (int64_t)f;
        if (v < large) large = v;
    }
    return ret + large;
}

qkv_status qkv_alibi_slopes(int64_t heads, float *slopes) {
    if (!slopes) return QKV_ERR_NULL_POINTER;
    if (heads <= 0 || heads > (1 << 20)) return QKV_ERR_BAD_SIZE;
    int64_t p2 = 1;
    while (p2 * 2 <= heads) p2 *= 2;
    /* Slopes of a power of two n: 2^(-8/n), 2^(-16/n), ... */
    for (int64_t h = 0; h < p2; h++) slopes[h] = (float)exp2(-8.0 * (double)(h + 1) / (double)p2);
    /* The rest: the odd-indexed slopes of 2 * p2 heads. */
    for (int64_t h = p2; h < heads; h++)
        slopes[h] = (float)exp2(-8.0 * (double)(2 * (h - p2) + 1) / (double)(2 * p2));
    return QKV_OK;
}

uint64_t qkv_dropout_threshold(double p) {
    /* u = n 2^-53 (n = z >> 11 < 2^53, exact) is < p iff n < p 2^53 iff
     * n < ceil(p 2^53): the reference's comparison of doubles, in integers. */
    return (uint64_t)ceil(p * 0x1.0p53);
}

double qkv_attn_dropout_keep(const qkv_plan *p, int64_t b, int64_t h, int64_t i, int64_t j) {
    /* splitmix64 finalisers over the position: independent bits per entry. */
    uint64_t z = p->d.dropout_seed ^ QKV_DROPOUT_SEED_XOR;
    const int64_t c[4] = {b, h, i + p->q_origin, j + p->k_origin};
    for (int t = 0; t < 4; t++) z = qkv_dropout_step(z, c[t]);
    return (z >> 11) < qkv_dropout_threshold(p->d.dropout) ? 0.0 : 1.0 / (1.0 - p->d.dropout);
}

/* Floor division (positions may be negative when n_q > n_k). */
static int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

static int64_t clip(int64_t x, int64_t m) { return x < -m ? -m : (x > m ? m : x); }

int64_t qkv_plan_rel_bucket(const qkv_plan *p, int64_t pos, int64_t j) {
    const qkv_attn_desc *d = &p->d;
    if (d->rel2d_width <= 0) return qkv_relpos_bucket(j - pos, d->rel_buckets, d->rel_max_distance, d->rel_bidirectional);
    const int64_t W = d->rel2d_width, m = d->rel_max_distance;
    int64_t qy = floor_div(pos, W), qx = pos - qy * W, ky = j / W, kx = j - ky * W;
    return (clip(ky - qy, m) + m) * (2 * m + 1) + clip(kx - qx, m) + m;
}
