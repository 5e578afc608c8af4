/* Internal helpers shared by every layer of the library: allocation through
 * the user's hooks, overflow-checked size arithmetic, and the validated form
 * of an attention descriptor. Not installed. */
#ifndef QKV_CORE_INTERNAL_H
#define QKV_CORE_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "core/rng.h"
#include "qkv.h"

/* Allocation through the hooks set by qkv_set_allocator. qkv_free(NULL) is a no-op. */
void *qkv_alloc(size_t bytes);
void *qkv_alloc_zeroed(size_t bytes);
void qkv_free(void *p);
/* Grows a buffer to at least n elements of elem bytes: pbuf is the address
 * of the buffer's pointer (of any object type), *cap its capacity in
 * elements. The old contents are dropped. 1 on success (nothing done when
 * *cap >= n), 0 when out of memory (buffer and *cap unchanged). */
int qkv_reserve(void *pbuf, int64_t *cap, int64_t n, size_t elem);
/* qkv_free on each of the n pointers of p. */
void qkv_free_each(void *const *p, size_t n);
/* qkv_free on each pointer given: QKV_FREE_ALL(a->x, a->y, a->z). */
#define QKV_FREE_ALL(...)                                                  \
    do {                                                                   \
        void *const qkv_free_all_[] = {__VA_ARGS__};                       \
        qkv_free_each(qkv_free_all_, sizeof qkv_free_all_ / sizeof(void *)); \
    } while (0)
/* A layer's parameter or gradient view: *count = n (when count is given),
 * returns buf. */
static inline float *qkv_param_view(float *buf, int64_t n, int64_t *count) {
    if (count) *count = n;
    return buf;
}
/* The size of the last allocation the memory limit refused on this thread
 * since the previous call (0: none), and clears it; and the status a failed
 * allocation should report: QKV_ERR_MEMORY_LIMIT when the limit refused it,
 * else QKV_ERR_OUT_OF_MEMORY (consumes the refusal). */
size_t qkv_alloc_take_refusal(void);
qkv_status qkv_alloc_failure_status(void);

/* *out = a * b; returns 0 on overflow (a, b >= 0). */
static inline int qkv_mul_ok(int64_t a, int64_t b, int64_t *out) {
    if (a < 0 || b < 0) return 0;
    if (a != 0 && b > INT64_MAX / a) return 0;
    *out = a * b;
    return 1;
}

/* bytes rounded up to a multiple of 64 (cache lines, and AVX-512 loads). */
static inline size_t qkv_round64(size_t bytes) { return (bytes + 63) & ~(size_t)63; }

/* One allocation carved into 64-byte aligned pieces. For a layout function
 * with locals `w` (a struct of pointers, or NULL to only count), `base`
 * (unsigned char *) and `at` (size_t): points w->field at base + at and
 * advances at by count elements of type, rounded up to 64 bytes. The
 * function returns `at`, the size, so the same code sizes and carves. */
#define QKV_CARVE(field, type, count)                               \
    do {                                                            \
        if (w) w->field = (type *)(void *)(base + at);              \
        at += qkv_round64((size_t)(count) * sizeof(type));          \
    } while (0)

/* fn(ctx, begin, end) over [0, total) split into whole chunks on up to
 * `threads` threads (serial below a size where threads cannot pay off;
 * work_per_item sizes that cut-off); each item must be computed
 * independently of the chunking, so the result is bitwise the same for any
 * thread count (core/par_range.c). */
typedef void (*qkv_range_fn)(void *ctx, int64_t begin, int64_t end);
void qkv_par_range(int threads, int64_t total, int64_t work_per_item, qkv_range_fn fn, void *ctx);

/* Product of n non-negative factors, with overflow check against both int64
 * and size_t of `elem` bytes each. Returns 0 on overflow. */
int qkv_count_ok(int64_t *out, size_t elem, int n, const int64_t *factors);
/* Elements of an array shape of ndim dims >= 0 (already checked), into
 * *count. Fails (0) when the product of the non-zero dims overflows int64,
 * or times elem bytes overflows size_t. Zero dims are left out of the
 * product so that the answer does not depend on their position: (0, 2^62,
 * 2^62) and (2^62, 2^62, 0) are both rejected, since their strides would
 * overflow all the same. The rule of qkv_array_alloc and of .npy headers. */
int qkv_shape_count(int ndim, const int64_t *shape, size_t elem, int64_t *count);

/* The reason of a failure, for the functions that take (why, why_len): the
 * message formatted into why when why is given and why_len > 0 (cut to
 * why_len - 1 bytes). qkv_fail also returns status, so that a check reads
 * `return qkv_fail(why, why_len, QKV_ERR_FORMAT, "...", ...)`. */
#if defined(__GNUC__)
#define QKV_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define QKV_PRINTF(f, a)
#endif
QKV_PRINTF(4, 5) qkv_status qkv_fail(char *why, size_t why_len, qkv_status status, const char *fmt, ...);
QKV_PRINTF(3, 4) void qkv_set_why(char *why, size_t why_len, const char *fmt, ...);
void qkv_vset_why(char *why, size_t why_len, const char *fmt, va_list ap);

/* A descriptor after validation: defaults resolved, every element count
 * computed once (overflow-checked), and the mask reduced to a window
 * [p - left, p + right] where "unbounded" is QKV_UNBOUNDED. The public entry
 * points make one plan per call and hand it on; nothing after them looks at
 * the descriptor's mask fields again (the window lives in left and right;
 * d's key lengths and sequence offsets are read through the plan's key
 * ranges), and nothing validates again. */
#define QKV_UNBOUNDED INT64_MAX
/* A window side at least this wide is wider than any sequence: unbounded
 * (a shifted side, see qkv_plan_block, stays unbounded). */
#define QKV_SIDE_WIDE ((int64_t)1 << 62)

typedef struct qkv_plan {
    qkv_attn_desc d;      /* copy with heads_kv, dim_v, scale resolved */
    int64_t group;        /* H / H_kv: query heads per key/value head */
    int64_t left, right;  /* visible window around the aligned position */
    int packed;           /* seq_offsets in use */
    int64_t pos_shift;    /* added to every aligned query position (a block's shift, see
                             qkv_plan_block): ALiBi and relative offsets stay global */
    int64_t q_origin, k_origin; /* the whole problem's rows of this plan's first query and
                             key (0 but in a block, see qkv_plan_block): the dropout
                             hash's i and j stay global */
    int64_t n_q_elems, n_k_elems, n_v_elems, n_o_elems; /* element counts */
    int64_t n_attn_elems, n_lse_elems, n_bias_elems, n_add_w_elems, n_add_v_elems, n_rel_elems;
} qkv_plan;

/* Validate a descriptor and build its plan. */
qkv_status qkv_plan_make(const qkv_attn_desc *desc, qkv_plan *plan);

/* One block of a validated problem, as ring attention (src/dist) computes
 * it: n_q queries against n_k keys whose aligned positions are the whole
 * problem's shifted by `shift` (pos_global - first key = pos_block + shift),
 * so the block sees the window [pos - (left - shift), pos + right + shift]
 * of the whole problem's plan, sides that may be negative (the window lies
 * wholly to one side of the block's diagonal), which no descriptor can say.
 * key_lengths [batch] as seen from the block (or NULL); num_seqs > 0: the
 * block's packed sequences (both offset arrays given, validated by the
 * caller); bias_kind and bias: the block's own bias. The block's plan
 * adds shift to pos_shift, so its query positions (and the ALiBi and
 * relative offsets from them) are the whole problem's. q_origin, k_origin:
 * the whole problem's rows of the block's first query and key (packed
 * rows when packed), added to the plan's, so the dropout factors of the
 * block's entries are the whole problem's (qkv_attn_dropout_keep). Nothing
 * else of the whole plan changes. */
typedef struct qkv_plan_block_desc {
    int64_t n_q, n_k, shift;
    int64_t q_origin, k_origin;
    const int64_t *key_lengths;
    int64_t num_seqs;
    const int64_t *seq_offsets_q, *seq_offsets_k;
    qkv_bias_kind bias_kind;
    const void *bias;
} qkv_plan_block_desc;

/* The plan of such a block (no validation: the whole plan was validated and
 * a block is no larger). QKV_ERR_SIZE_OVERFLOW only for a block bias whose
 * size overflows. */
qkv_status qkv_plan_block(const qkv_plan *whole, const qkv_plan_block_desc *blk, qkv_plan *out);

/* check_finite (qkv_attn_desc) for a plan: QKV_ERR_NOT_FINITE when an input
 * of the call holds NaN or +-inf (see qkv.h), else QKV_OK; whether the
 * descriptor asked for the scan is the caller's test. q, k, v: not NULL;
 * dout, out, lse: backward only, or NULL. Tensors of the plan's dtype are
 * scanned only when it is F32 or F64 (half tensors are scanned as float
 * copies, with a plan of dtype F32). */
qkv_status qkv_plan_check_finite(const qkv_plan *p, const void *q, const void *k, const void *v,
                                 const void *dout, const void *out, const void *lse);

/* The contiguous range [*lo, *hi) of keys visible to query i (0-based within
 * the batch's n_q, or the packed position) of batch b. Empty when *lo >= *hi.
 * Shared by every implementation so that masks mean the same everywhere. */
void qkv_plan_key_range(const qkv_plan *p, int64_t b, int64_t i, int64_t *lo, int64_t *hi);

/* Query blocks for a kernel's units: block u holds the rows [starts[u],
 * starts[u + 1]) of every batch row, at most bq (>= 1) of them; returns the
 * count (starts NULL: only the count; else starts has count + 1 entries).
 * Unpacked, blocks of bq rows from row 0. Packed, a block never holds rows
 * of two sequences - it costs its rows times every key any of them sees -
 * except sequences shorter than QKV_PLAN_JOIN_ROWS, joined while the block
 * stays within that many rows; empty sequences take no block. */
#define QKV_PLAN_JOIN_ROWS 16
int64_t qkv_plan_query_blocks(const qkv_plan *p, int64_t bq, int64_t *starts);

/* The absolute key index of query i's aligned position: keys j of its
 * sequence are at offset r = j - position (r <= 0 is the past). */
int64_t qkv_plan_query_position(const qkv_plan *p, int64_t i);

/* The relative-position bucket of key j for a query at aligned position
 * pos: T5's 1-D buckets, or the clipped 2-D offset when rel2d_width > 0. */
int64_t qkv_plan_rel_bucket(const qkv_plan *p, int64_t pos, int64_t j);

/* Attention dropout: the factor of entry (b, h, i, j) - 0 (dropped) or
 * 1 / (1 - p) - from the counter-based hash; 1 when dropout is off. The
 * hash: z = dropout_seed ^ QKV_DROPOUT_SEED_XOR, then z <- qkv_dropout_step(z, c)
 * for c = b, h, i + q_origin, j + k_origin in turn (h the query head, i
 * and j the rows of q and k, packed sequences included, moved to the whole
 * problem's rows in a block's plan); the entry is kept iff (z >> 11) >=
 * qkv_dropout_threshold(p), i.e. iff the uniform (z >> 11) 2^-53 >= p. The
 * fast path (attn/fast_dropout.c) hashes (b, h, i) once per row and only
 * the last step per entry. */
#define QKV_DROPOUT_SEED_XOR 0xD1B54A32D192ED03ull
#define QKV_DROPOUT_STEP_ADD 0x632BE59BD9B4E019ull
static inline uint64_t qkv_dropout_step(uint64_t z, int64_t c) {
    return splitmix64_mix(z + (uint64_t)c * SPLITMIX64_GAMMA + QKV_DROPOUT_STEP_ADD);
}
uint64_t qkv_dropout_threshold(double p);
double qkv_attn_dropout_keep(const qkv_plan *p, int64_t b, int64_t h, int64_t i, int64_t j);

#endif
