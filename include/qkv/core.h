/*
 * qkv/core.h - the attention core of qkv: status codes, memory (allocator
 * hooks, memory limit), version, element types, the attention descriptor
 * with its forward, backward and row functions, and the matrix
 * multiplication every projection goes through. Needs only libc, libm and
 * pthreads. Include <qkv.h> (all parts) or this header alone.
 *
 * The attention core computes, for every batch b and query head h:
 *
 *     S  = score(Q, K)            n_q x n_k   (scaled dot, dot, cosine, additive)
 *     S  = softcap(S) + bias      optional
 *     S  = mask(S)                masked logits are -inf (never read)
 *     A' = normalise(S)           row by row  (softmax, relu, sigmoid)
 *     O  = A' . V
 *
 * Tensor layout (row-major, contiguous, "batch, sequence, head, dim"):
 *     Q  [B, n_q, H,    D  ]      K  [B, n_k, H_kv, D  ]
 *     V  [B, n_k, H_kv, D_v]      O  [B, n_q, H,    D_v]
 * This is what a linear projection of [B, n, H*D] produces, so no transposes
 * are needed. Query head h reads key/value head h / (H / H_kv) (grouped-query
 * attention; H_kv = 1 is multi-query attention).
 *
 * Threads. Every function may be called from several threads at once as long
 * as the calls share no object they write: separate descriptors and tensors
 * for the attention functions (read-only inputs may be shared), a separate
 * qkv_mha / qkv_kv_cache / qkv_floater / qkv_safetensors per thread (one layer
 * object holds the activations of its last forward, so it serves one thread
 * at a time; const getters of a set that nobody modifies may be shared).
 * Results do not depend on what other threads do (tests/test_concurrency.c
 * checks bitwise equality). What the library shares between threads:
 *   - the allocator hooks and the memory limit (qkv_set_allocator,
 *     qkv_set_memory_limit): process-wide; set them before other calls, never
 *     concurrently with one. The hooks themselves must be thread-safe (malloc
 *     is). The count of live bytes behind the limit is atomic.
 *   - the CPU-detection and kernel table: filled once, on first use, under
 *     pthread_once, read-only afterwards.
 *   - the environment variables QKV_NUM_THREADS and QKV_ARCH, read with
 *     getenv (do not setenv while qkv runs).
 *   - an atomic count of the worker threads of all calls in flight: with
 *     threads = 0 a call takes only the cores the others leave (at least
 *     one). Results never depend on the thread count, so this changes speed
 *     only.
 *   - a pool of worker threads, started on first need and kept between
 *     calls: a call with threads = T runs on its own thread plus T - 1 idle
 *     workers (the pool grows when calls run at once, so no call waits for
 *     another's work). Idle workers poll for about 100 microseconds, then
 *     sleep; they end at exit. A forked child starts with no workers. Do not
 *     unload the shared library (dlclose) while the process still calls
 *     qkv. No scratch buffer outlives a call.
 */
#ifndef QKV_CORE_H
#define QKV_CORE_H

#include <stddef.h>
#include <stdint.h>

#include "qkv/config.h"

/* Marks the functions the shared library exports: it is built with
 * -fvisibility=hidden, so everything else stays inside it. */
#if defined(__GNUC__) || defined(__clang__)
#define QKV_API __attribute__((visibility("default")))
#else
#define QKV_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define QKV_VERSION_MAJOR 0
#define QKV_VERSION_MINOR 1
#define QKV_VERSION_PATCH 0
#define QKV_VERSION_STRING "0.1.0"

/* ------------------------------------------------------------------------- */
/* Status codes. Values are pinned: they never change meaning between versions. */

typedef enum qkv_status {
    QKV_OK = 0,
    QKV_ERR_NULL_POINTER = 1,     /* a required pointer argument is NULL */
    QKV_ERR_BAD_SIZE = 2,         /* a size is zero or negative */
    QKV_ERR_SIZE_OVERFLOW = 3,    /* a product of sizes does not fit in size_t / int64 */
    QKV_ERR_HEADS = 4,            /* H is not a multiple of H_kv */
    QKV_ERR_WINDOW = 5,           /* window extents negative or mask kind needs none */
    QKV_ERR_KEY_LENGTHS = 6,      /* a key length is < 0 or > n_k */
    QKV_ERR_SEQ_OFFSETS = 7,      /* packed offsets not 0 = o_0 <= ... <= o_S = n, or B != 1 */
    QKV_ERR_BAD_ENUM = 8,         /* unknown score, normaliser, mask, dtype, bias kind, impl value */
    QKV_ERR_BAD_PARAMETER = 9,    /* scale, temperature or softcap not finite / out of range */
    QKV_ERR_OUT_OF_MEMORY = 10,   /* an allocation failed; nothing leaked, outputs unspecified */
    QKV_ERR_UNSUPPORTED = 11,     /* valid request this build/implementation cannot do */
    QKV_ERR_IO = 12,              /* a file could not be opened, read or written */
    QKV_ERR_FORMAT = 13,          /* a file is malformed (bad magic, header, truncated) */
    QKV_ERR_DTYPE = 14,           /* a dtype the call does not accept (e.g. I32 for attention) */
    QKV_ERR_SHAPE = 15,           /* array shapes do not fit together */
    QKV_ERR_POSITION = 16,        /* a position is past the end of a learned table or cache */
    QKV_ERR_NOT_FINITE = 17,      /* an input holds NaN or +-inf and the call was asked to
                                     reject such inputs (qkv_attn_desc.check_finite) */
    QKV_ERR_MEMORY_LIMIT = 18     /* a request would exceed the limit set by
                                     qkv_set_memory_limit; refused before allocating */
} qkv_status;

/* A short, static English text for a status; "unknown status" for values that
 * are not codes. Never NULL. */
QKV_API const char *qkv_status_string(qkv_status status);

/* The library's version, e.g. "0.1.0" (same as QKV_VERSION_STRING of the
 * header the library was built with). */
QKV_API const char *qkv_version(void);

/* ------------------------------------------------------------------------- */
/* Memory. All library allocations go through these hooks (default: malloc and
 * free). Set them before any other call, never concurrently with one; passing
 * NULL for both restores the default. A hook returning NULL makes the call that
 * needed memory fail with QKV_ERR_OUT_OF_MEMORY, freeing what it had taken. */

typedef void *(*qkv_malloc_fn)(size_t size, void *user);
typedef void (*qkv_free_fn)(void *ptr, void *user);
QKV_API qkv_status qkv_set_allocator(qkv_malloc_fn alloc, qkv_free_fn release, void *user);

/* A process-wide cap on the bytes the library holds at once (0, the default:
 * no cap). Every allocation is checked against it before memory is taken:
 * one that would raise the live total above the cap is refused and the call
 * fails, freeing what it had taken - with QKV_ERR_MEMORY_LIMIT from the
 * attention functions (qkv_attention_forward/backward), with
 * QKV_ERR_OUT_OF_MEMORY from the others (as when the allocator hook fails).
 * qkv_memory_refused() then names the refused size. Lowering the cap below
 * what is live frees nothing; later requests are refused until enough is
 * freed. Caller-owned buffers (tensors, outputs) do not count. Each block
 * passed to the allocator hooks is a small header (max_align_t) larger than
 * the library's request. Never fails (returns QKV_OK). */
QKV_API qkv_status qkv_set_memory_limit(size_t bytes);

/* The current cap (0: none); the bytes the library holds now (all threads);
 * the size in bytes of the most recent request the cap refused on the
 * calling thread (0: none yet). */
QKV_API size_t qkv_memory_limit(void);
QKV_API size_t qkv_memory_in_use(void);
QKV_API size_t qkv_memory_refused(void);

/* ------------------------------------------------------------------------- */
/* Element types. The attention core accepts F32 and F64 for all floating point
 * tensors of one call (they share the descriptor's dtype). Integer arrays
 * (key lengths, offsets) are always int64_t in the API. */

typedef enum qkv_dtype {
    QKV_F32 = 0,
    QKV_F64 = 1,
    QKV_I32 = 2,   /* .npy I/O only */
    QKV_I64 = 3,   /* .npy I/O only */
    /* Half-precision storage for the attention core (docs/HALF.md): 2 bytes
     * per element, as uint16_t bit patterns. QKV_BF16: bfloat16 (the top 16
     * bits of a float32); QKV_F16: IEEE binary16. qkv_attention_forward and
     * qkv_attention_backward accept them for q, k, v, out, dout and the
     * gradients dq, dk, dv; every other tensor of such a call (attn, lse,
     * bias, dbias, the additive, ALiBi and relative-position parameters and
     * their gradients) is float32. Arithmetic is float32 (accumulation and
     * softmax statistics), rounded to nearest-even when stored; NaN stays NaN.
     * Array dtypes too (qkv_dtype_size 2): .npy reads and writes fp16 as
     * '<f2' and bf16 as '<u2' holding the bit patterns (NumPy has no bf16),
     * safetensors saves them as F16 / BF16, qkv_array_convert converts to
     * and from them (rounding once, to nearest-even). */
    QKV_BF16 = 4,
    QKV_F16 = 5
} qkv_dtype;

/* Size in bytes of one element of a dtype; 0 for an unknown value. */
QKV_API size_t qkv_dtype_size(qkv_dtype dtype);

/* How a query row scores the keys. */
typedef enum qkv_score {
    QKV_SCORE_SCALED_DOT = 0,  /* s = scale * q.k, scale defaults to 1/sqrt(D) */
    QKV_SCORE_DOT = 1,         /* s = q.k (scale ignored) */
    QKV_SCORE_COSINE = 2,      /* s = (q/|q|).(k/|k|) / temperature; |x| floored at 1e-12
                                  as torch.nn.functional.normalize does */
    QKV_SCORE_ADDITIVE = 3     /* s = w_h . tanh(W1_h q + W2_h k)  (Bahdanau / MLP score);
                                  parameters in qkv_attn_desc.additive_* */
} qkv_score;

/* How a row of logits becomes weights A'. Masked keys always get weight 0. */
typedef enum qkv_norm {
    QKV_NORM_SOFTMAX = 0,      /* exp(s - max) / sum: rows sum to 1, never overflows */
    QKV_NORM_RELU = 1,         /* max(s, 0), divided by the number of visible keys
                                  when relu_divide_by_count != 0 */
    QKV_NORM_SIGMOID = 2       /* 1 / (1 + exp(-s)) */
} qkv_norm;

/* Which keys a query sees. Positions are aligned bottom-right: query i is at
 * key position p = i + n_k - n_q (so a decoder's last query sees every key).
 * Every mask leaves a contiguous range of keys, intersected with the key
 * lengths and packed-sequence bounds below. */
typedef enum qkv_mask {
    QKV_MASK_NONE = 0,          /* every key */
    QKV_MASK_CAUSAL = 1,        /* keys j <= p */
    QKV_MASK_WINDOW = 2,        /* keys p - window_left <= j <= p + window_right
                                   (truncated self-attention) */
    QKV_MASK_CAUSAL_WINDOW = 3  /* keys p - window_left <= j <= p (window_right must be 0) */
} qkv_mask;

/* Shape of the optional additive bias (added to the logits after soft-capping;
 * -inf entries mask a key). Indexed by packed position when seq_offsets is used. */
typedef enum qkv_bias_kind {
    QKV_BIAS_NONE = 0,
    QKV_BIAS_SHARED = 1,        /* [n_q, n_k], the same for every batch and head */
    QKV_BIAS_PER_HEAD = 2       /* [H, n_q, n_k], the same for every batch */
} qkv_bias_kind;

/* Which implementation computes the call. */
typedef enum qkv_impl {
    QKV_IMPL_AUTO = 0,          /* the fastest available for the request */
    QKV_IMPL_REFERENCE = 1,     /* plain loops accumulating in double: the oracle */
    QKV_IMPL_FAST = 2           /* tiled, fused FlashAttention-2 style CPU path (F32), O(n)
                                   memory, ALiBi and T5's 1-D relative buckets included; the
                                   additive score has its own (projections by GEMM, O(n A)
                                   memory). QKV_ERR_UNSUPPORTED: 2-D relative positions,
                                   non-finite ALiBi / relative parameters, and ALiBi, T5
                                   biases or dropout with the additive score */
} qkv_impl;

/* The description of one attention problem. Initialise with
 * qkv_attn_desc_init(), then set the fields you need. Pointers in it are
 * borrowed for the duration of a call only. */
typedef struct qkv_attn_desc {
    qkv_dtype dtype;            /* QKV_F32 or QKV_F64: type of every float tensor */

    int64_t batch;              /* B   >= 1 */
    int64_t n_q;                /* queries per batch >= 1 (total packed length with seq_offsets) */
    int64_t n_k;                /* keys per batch    >= 1 */
    int64_t heads;              /* H   >= 1 */
    int64_t heads_kv;           /* H_kv >= 1, divides H; 0 means H */
    int64_t dim;                /* D   >= 1: query/key head dimension */
    int64_t dim_v;              /* D_v >= 1: value head dimension; 0 means D */

    qkv_score score;
    double scale;               /* SCALED_DOT only; 0 means 1/sqrt(D); else finite, != 0 */
    double temperature;         /* COSINE only; > 0 and finite (default 1) */
    double softcap;             /* 0 = off; else c > 0: s -> c * tanh(s / c) */

    /* ADDITIVE only, all of dtype `dtype`, per query head h:
     * W1 [H, A, D] applied to q, W2 [H, A, D] applied to k, w [H, A]. */
    int64_t additive_dim;       /* A >= 1 */
    const void *additive_w1;
    const void *additive_w2;
    const void *additive_w;

    qkv_norm norm;
    int relu_divide_by_count;   /* RELU only: divide by the number of visible keys */

    qkv_mask mask;
    int64_t window_left;        /* WINDOW, CAUSAL_WINDOW: >= 0 */
    int64_t window_right;       /* WINDOW: >= 0; CAUSAL_WINDOW: must be 0 */

    /* Padding: key j of batch b is visible only if j < key_lengths[b].
     * [B] entries in 0..n_k, or NULL. Alignment still uses n_k (see qkv_mask). */
    const int64_t *key_lengths;

    /* Packed variable-length sequences (FlashAttention's "varlen"): batch must
     * be 1; queries [seq_offsets_q[s], seq_offsets_q[s+1]) attend only to keys
     * [seq_offsets_k[s], seq_offsets_k[s+1]), with the mask aligned per sequence
     * (n_q, n_k replaced by that sequence's lengths). Each array has num_seqs+1
     * nondecreasing entries from 0 to n_q (resp. n_k). seq_offsets_k = NULL
     * means the same as seq_offsets_q (requires n_q == n_k). num_seqs = 0 and
     * seq_offsets_q = NULL: not packed. */
    int64_t num_seqs;
    const int64_t *seq_offsets_q;
    const int64_t *seq_offsets_k;

    qkv_bias_kind bias_kind;
    const void *bias;           /* see qkv_bias_kind; dtype `dtype` */

    qkv_impl impl;
    int threads;                /* 0 = QKV_NUM_THREADS or the machine's cores */

    /* Position biases computed inside the kernel from the offset r = j - p
     * between key j and the query's aligned position p (see qkv_mask; per
     * sequence when packed) - no n x n matrix is ever built:
     * ALiBi (Press et al., ICLR 2022): s -= slope_h * |r|; slopes [H] of
     * dtype `dtype` (qkv_alibi_slopes gives the paper's), or NULL. */
    const void *alibi_slopes;
    /* Learned relative-position bias (T5, Raffel et al. 2020): s +=
     * rel_table[h, bucket(r)] with rel_buckets buckets, logarithmic beyond
     * rel_buckets/2 (bidirectional: /4 each side) up to rel_max_distance
     * (see qkv_relpos_bucket). rel_table [H, rel_buckets] or NULL. */
    const void *rel_table;
    int64_t rel_buckets;        /* >= 2 (>= 4 when bidirectional) */
    int64_t rel_max_distance;   /* >= 1 */
    int rel_bidirectional;      /* 0: only r <= 0 is told apart (decoders) */

    /* Dropout on the attention weights (training): A'_ij is kept with
     * probability 1 - p and scaled by 1 / (1 - p). The mask is a hash of
     * (dropout_seed, b, h, i, j) - a counter-based generator - so the
     * backward regenerates it instead of storing it, and it is the same for
     * any thread count. The attn output is A' before dropout. 0 <= p < 1. */
    double dropout;
    uint64_t dropout_seed;

    /* Non-finite inputs. 0 (default): NaN and +-inf in a visible input
     * propagate as IEEE arithmetic makes them (a NaN in q, or in a visible
     * key or value, makes that row's output NaN; masked keys are never read,
     * so NaN there changes nothing; -inf in the bias masks a key). 1: the
     * call first scans q, k, v, bias, the additive/ALiBi/relative parameters
     * (and, in the backward, dout, out and lse when given; lse may be -inf
     * for rows without keys) and returns QKV_ERR_NOT_FINITE, writing nothing,
     * if any holds NaN or +-inf (bias: NaN or +inf; -inf stays a mask). The
     * scan reads every element once: O(size of the inputs). Tensors stored
     * as float32 or float64 are scanned (half-precision storage is not). */
    int check_finite;

    /* 2-D relative positions (images: Swin / NAT-style learned relative
     * bias): when > 0, positions are pixels of a row-major image of this
     * width (query p and key j at (p / W, p % W) and (j / W, j % W)) and
     * rel_table [H, (2m+1)^2] with m = rel_max_distance holds one bias per
     * clipped offset (dy, dx) in [-m, m]^2, at (dy + m) * (2m + 1) + dx + m;
     * rel_buckets must be (2m+1)^2 and rel_bidirectional is ignored. Not
     * with packed sequences. 0: the 1-D T5 buckets above. */
    int64_t rel2d_width;
} qkv_attn_desc;

/* T5's bucket of a relative offset r = key - query. Returns -1 for invalid
 * parameters (see qkv_attn_desc). */
QKV_API int64_t qkv_relpos_bucket(int64_t r, int64_t buckets, int64_t max_distance, int bidirectional);

/* ALiBi's head slopes: for H a power of two, 2^(-8(h+1)/H); otherwise the
 * paper's interpolation (the slopes of the next lower power of two, then
 * every other slope of the next higher). slopes [H] (float). Errors:
 * QKV_ERR_NULL_POINTER, QKV_ERR_BAD_SIZE. */
QKV_API qkv_status qkv_alibi_slopes(int64_t heads, float *slopes);

/* Defaults: F32, scaled dot product with scale 1/sqrt(D), softmax, no mask,
 * temperature 1, everything optional off, sizes 0 (must be set). Never fails
 * (does nothing when desc is NULL). */
QKV_API void qkv_attn_desc_init(qkv_attn_desc *desc);

/* Validate a descriptor without computing anything: QKV_OK or the status the
 * compute functions would return for it (pointers to tensors aside). */
QKV_API qkv_status qkv_attn_desc_check(const qkv_attn_desc *desc);

/* Forward pass.
 *   q    [B, n_q, H, D]       required
 *   k    [B, n_k, H_kv, D]    required
 *   v    [B, n_k, H_kv, D_v]  required
 *   out  [B, n_q, H, D_v]     required, written
 *   attn [B, H, n_q, n_k]     optional (NULL): the normalised matrix A'; masked
 *                             entries are 0. The only n x n buffer qkv ever
 *                             touches is this one, and only when you pass it.
 *   lse  [B, H, n_q]          optional (NULL): log sum_j exp(s_ij) over the
 *                             visible keys (whatever the normaliser); -inf for a
 *                             row with no visible key.
 * All float tensors are of desc->dtype. A row whose keys are all masked gets an
 * output of 0. Inputs may not alias outputs.
 * Errors: any descriptor error (see qkv_attn_desc_check), QKV_ERR_NULL_POINTER
 * for a missing tensor, QKV_ERR_OUT_OF_MEMORY. On error the outputs are
 * unspecified. */
QKV_API qkv_status qkv_attention_forward(const qkv_attn_desc *desc,
                                         const void *q, const void *k, const void *v,
                                         void *out, void *attn, void *lse);

/* Gradients written by qkv_attention_backward. dq, dk, dv are required;
 * the others are optional (NULL = not wanted) and, when given, are
 * overwritten (not accumulated into):
 *   dbias         shaped as desc->bias (summed over batch, and over heads for SHARED)
 *   d_additive_*  shaped as the additive parameters
 *   d_rel_table   shaped as rel_table (summed over batch and positions) */
typedef struct qkv_attn_grads {
    void *dq;                   /* [B, n_q, H, D] */
    void *dk;                   /* [B, n_k, H_kv, D]   (summed over the heads sharing it) */
    void *dv;                   /* [B, n_k, H_kv, D_v] */
    void *dbias;
    void *d_additive_w1;
    void *d_additive_w2;
    void *d_additive_w;
    void *d_rel_table;          /* [H, rel_buckets] when rel_table is used */
} qkv_attn_grads;

/* Backward pass: given dout = dL/dO [B, n_q, H, D_v], writes dL/dQ, dL/dK,
 * dL/dV (and the optional gradients in grads).
 *   out, lse: the forward's outputs, optional (NULL: recomputed). The
 *   reference implementation always recomputes them in double.
 * Rows whose keys are all masked contribute nothing (zero gradients).
 * Errors: as qkv_attention_forward. */
QKV_API qkv_status qkv_attention_backward(const qkv_attn_desc *desc,
                                          const void *q, const void *k, const void *v,
                                          const void *out, const void *lse,
                                          const void *dout, const qkv_attn_grads *grads);

/* Rows row0 .. row0+rows-1 of the attention matrix A' (for every batch and
 * head), for inspecting long inputs a block at a time: only
 * [B, H, rows, n_k] is written, recomputed from Q and K in double (O(n_k)
 * workspace), so the n x n matrix never has to exist. Same values as the
 * forward's attn output (before dropout). V is not needed. Errors: as
 * qkv_attention_forward, plus QKV_ERR_BAD_SIZE when the rows are not inside
 * 0 .. n_q. */
QKV_API qkv_status qkv_attention_rows(const qkv_attn_desc *desc, const void *q, const void *k, int64_t row0,
                                      int64_t rows, void *attn_rows);


/* ------------------------------------------------------------------------- */
/* Matrix multiplication, float32, row-major: the one module every projection
 * of qkv goes through (blocked for caches, SIMD kernels chosen at run time,
 * multithreaded over blocks of C only, so the result does not depend on the
 * thread count).
 *
 *     C[M, N] = alpha * op(A)[M, K] . op(B)[K, N] + beta * C
 *
 * op(A) is A [M, K] with row stride lda (>= K), or when trans_a != 0 the
 * transpose of A stored [K, M] with row stride lda (>= M); likewise B.
 * C has row stride ldc >= N. beta == 0 overwrites C without reading it (NaN
 * in C does not leak). threads = 0: QKV_NUM_THREADS or the machine's cores.
 * M, N or K may be 0 (K = 0 gives C = beta * C). Errors: QKV_ERR_NULL_POINTER,
 * QKV_ERR_BAD_SIZE (negative size, stride too small, threads < 0),
 * QKV_ERR_SIZE_OVERFLOW, QKV_ERR_OUT_OF_MEMORY. */
QKV_API qkv_status qkv_sgemm(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                             const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                             float *C, int64_t ldc, int threads);

#ifdef __cplusplus
}
#endif

#endif /* QKV_CORE_H */
