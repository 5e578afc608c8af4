/*
 * qkv.h - the public API of qkv, a C11 library for self-attention.
 *
 * One header. Every function returns a qkv_status (or is documented as unable
 * to fail); the library never aborts, exits or prints. Buffers are owned by the
 * caller unless a function says it allocates (then a matching *_free exists and
 * accepts NULL).
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
#ifndef QKV_H
#define QKV_H

#include <stddef.h>
#include <stdint.h>

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
const char *qkv_status_string(qkv_status status);

/* The library's version, e.g. "0.1.0" (same as QKV_VERSION_STRING of the
 * header the library was built with). */
const char *qkv_version(void);

/* ------------------------------------------------------------------------- */
/* Memory. All library allocations go through these hooks (default: malloc and
 * free). Set them before any other call, never concurrently with one; passing
 * NULL for both restores the default. A hook returning NULL makes the call that
 * needed memory fail with QKV_ERR_OUT_OF_MEMORY, freeing what it had taken. */

typedef void *(*qkv_malloc_fn)(size_t size, void *user);
typedef void (*qkv_free_fn)(void *ptr, void *user);
qkv_status qkv_set_allocator(qkv_malloc_fn alloc, qkv_free_fn release, void *user);

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
qkv_status qkv_set_memory_limit(size_t bytes);

/* The current cap (0: none); the bytes the library holds now (all threads);
 * the size in bytes of the most recent request the cap refused on the
 * calling thread (0: none yet). */
size_t qkv_memory_limit(void);
size_t qkv_memory_in_use(void);
size_t qkv_memory_refused(void);

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
size_t qkv_dtype_size(qkv_dtype dtype);

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
    QKV_IMPL_FAST = 2           /* tiled, fused FlashAttention-2 style CPU path (F32; not
                                   the additive score: QKV_ERR_UNSUPPORTED), O(n) memory */
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
int64_t qkv_relpos_bucket(int64_t r, int64_t buckets, int64_t max_distance, int bidirectional);

/* ALiBi's head slopes: for H a power of two, 2^(-8(h+1)/H); otherwise the
 * paper's interpolation (the slopes of the next lower power of two, then
 * every other slope of the next higher). slopes [H] (float). Errors:
 * QKV_ERR_NULL_POINTER, QKV_ERR_BAD_SIZE. */
qkv_status qkv_alibi_slopes(int64_t heads, float *slopes);

/* Defaults: F32, scaled dot product with scale 1/sqrt(D), softmax, no mask,
 * temperature 1, everything optional off, sizes 0 (must be set). Never fails
 * (does nothing when desc is NULL). */
void qkv_attn_desc_init(qkv_attn_desc *desc);

/* Validate a descriptor without computing anything: QKV_OK or the status the
 * compute functions would return for it (pointers to tensors aside). */
qkv_status qkv_attn_desc_check(const qkv_attn_desc *desc);

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
qkv_status qkv_attention_forward(const qkv_attn_desc *desc,
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
qkv_status qkv_attention_backward(const qkv_attn_desc *desc,
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
qkv_status qkv_attention_rows(const qkv_attn_desc *desc, const void *q, const void *k, int64_t row0,
                              int64_t rows, void *attn_rows);

/* ------------------------------------------------------------------------- */
/* Positional encodings. Absolute ones are added to the token embeddings by
 * the caller (or the model); RoPE rotates q and k inside the multi-head
 * layer; ALiBi and relative biases live in the attention core (above). */

/* Sinusoidal encoding of "Attention Is All You Need" for positions
 * offset .. offset+n-1: out[i, 2t] = sin(pos / 10000^(2t/E)),
 * out[i, 2t+1] = cos(pos / 10000^(2t/E)); computed in double, so any
 * position works (no table, no length limit). out [n, E] float.
 * Errors: QKV_ERR_NULL_POINTER, QKV_ERR_BAD_SIZE (n, E <= 0, offset < 0),
 * QKV_ERR_SIZE_OVERFLOW. */
qkv_status qkv_posenc_sinusoidal(int64_t n, int64_t embed_dim, int64_t offset, float *out);

/* Rotary position embedding (RoPE, Su et al. 2021), "rotate half" layout of
 * GPT-NeoX / Llama: for head dim D (even) and t < D/2, the pair
 * (x[t], x[t + D/2]) of the row at position pos is rotated by the angle
 * pos * base^(-2t/D). x [B, n, H, D] float, in place; row i has position
 * offset + i. inverse != 0 rotates by the opposite angle: that is the
 * backward pass (the rotation is orthogonal). Errors: QKV_ERR_NULL_POINTER,
 * QKV_ERR_BAD_SIZE (a size <= 0, D odd, offset < 0), QKV_ERR_BAD_PARAMETER
 * (base not finite or <= 1), QKV_ERR_SIZE_OVERFLOW. */
qkv_status qkv_rope_apply(float *x, int64_t batch, int64_t n, int64_t heads, int64_t dim,
                          int64_t offset, double base, int inverse);

/* Learned absolute positions: a trainable table [max_len, E].
 * Forward: x[b, i, :] += table[offset + i, :] for x [B, n, E].
 * Backward: dtable[offset + i, :] += sum_b dx[b, i, :].
 * A position offset + n - 1 >= max_len is QKV_ERR_POSITION (the table has no
 * row for it). Errors also QKV_ERR_NULL_POINTER, QKV_ERR_BAD_SIZE. */
qkv_status qkv_posenc_learned_forward(const float *table, int64_t max_len, int64_t embed_dim,
                                      int64_t batch, int64_t n, int64_t offset, float *x);
qkv_status qkv_posenc_learned_backward(float *dtable, int64_t max_len, int64_t embed_dim,
                                       int64_t batch, int64_t n, int64_t offset, const float *dx);

/* FLOATER (Liu et al., ICML 2020, "Learning to Encode Position for
 * Transformer with Continuous Dynamical Model"): positions generated by a
 * neural ODE dp/dt = f(t, p) = W2 tanh(W1 p + w_t t + b1) + b2 from a learned
 * p(0), integrated with fixed-step RK4 (substeps steps per position, positions
 * t_i = i * delta), trained by backpropagation through the solver. Being an
 * ODE, it yields an encoding for any position, also ones never trained on.
 * Computed in double; parameters and outputs float. The model adds p(t_i)
 * to the input of every layer (one object per layer, or one shared). */
typedef struct qkv_floater qkv_floater;

/* dim >= 1, hidden >= 1, delta > 0 finite, substeps >= 1. Parameters
 * initialised from seed so that the trajectory starts non-trivial. Errors:
 * QKV_ERR_NULL_POINTER, QKV_ERR_BAD_SIZE, QKV_ERR_BAD_PARAMETER,
 * QKV_ERR_OUT_OF_MEMORY. */
qkv_status qkv_floater_create(int64_t dim, int64_t hidden, double delta, int substeps, uint64_t seed,
                              qkv_floater **out);
void qkv_floater_free(qkv_floater *f);

/* pos [n, dim]: p(t_0) .. p(t_{n-1}). Keeps the trajectory for the backward
 * (O(n * substeps * dim) doubles). Errors: QKV_ERR_NULL_POINTER,
 * QKV_ERR_BAD_SIZE, QKV_ERR_SIZE_OVERFLOW, QKV_ERR_OUT_OF_MEMORY. */
qkv_status qkv_floater_forward(qkv_floater *f, int64_t n, float *pos);

/* dpos [n, dim] = dL/dpos of the most recent forward: accumulates dL/dθ
 * into the gradients (adjoint of each RK4 step, discretise-then-optimise,
 * so the gradient is exact for the discrete solver). Errors:
 * QKV_ERR_NULL_POINTER, QKV_ERR_UNSUPPORTED (no forward before),
 * QKV_ERR_OUT_OF_MEMORY. */
qkv_status qkv_floater_backward(qkv_floater *f, const float *dpos);

/* Parameters [p0 (dim), W1 (hidden x dim), w_t (hidden), b1 (hidden),
 * W2 (dim x hidden), b2 (dim)] as one flat float array, gradients alike. */
float *qkv_floater_params(qkv_floater *f, int64_t *count);
float *qkv_floater_grads(qkv_floater *f, int64_t *count);
void qkv_floater_zero_grad(qkv_floater *f);

/* ------------------------------------------------------------------------- */
/* Multi-head attention layer (the articles' multi-head self-attention):
 *
 *   q = x_q W_qᵀ + b_q,  k = x_k W_kᵀ + b_k,  v = x_v W_vᵀ + b_v   (per head slices)
 *   o_h = attention(q_h, k_h, v_h)                                 (the core above)
 *   y = concat_h(o_h) W_oᵀ + b_o      or, join MEAN: y = mean_h(o_h) W_oᵀ + b_o
 *
 * Parameters follow torch.nn.MultiheadAttention's state_dict:
 *   in_proj_weight [3E, E], in_proj_bias [3E]   when kdim = vdim = E and H_kv = H
 *   q_proj_weight [H Dh, E], k_proj_weight [H_kv Dh, kdim], v_proj_weight
 *   [H_kv Dh, vdim] otherwise (biases stay in in_proj_bias [(H + 2 H_kv) Dh]),
 *   out_proj.weight [E, H Dh] ([E, Dh] for MEAN), out_proj.bias [E],
 *   bias_k, bias_v [1, 1, H_kv Dh] with add_bias_kv (torch's names),
 *   rel_table [H, rel_buckets] with QKV_POS_RELATIVE, and with the additive
 *   score additive.w1, additive.w2 [H, A, Dh], additive.w [H, A] (qkv's).
 * The flat parameter array (qkv_mha_params) holds them in the order W_q,
 * W_k, W_v, in-projection biases, W_o, b_o, rel_table, bias_k, bias_v,
 * additive W1, W2, w (absent ones take no space). docs/MHA.md has more.
 * Inputs are [B, n, E] float (x_k [B, n_k, kdim], x_v [B, n_k, vdim]). */

typedef enum qkv_head_join {
    QKV_JOIN_CONCAT = 0,        /* concatenate the heads, then W_o (the standard) */
    QKV_JOIN_MEAN = 1           /* average the heads, then W_o [E, Dh] */
} qkv_head_join;

typedef enum qkv_pos_kind {
    QKV_POS_NONE = 0,
    QKV_POS_ROPE = 1,           /* rotate q and k (qkv_rope_apply, base rope_base) */
    QKV_POS_ALIBI = 2,          /* per-head linear bias (qkv_alibi_slopes) in the kernel */
    QKV_POS_RELATIVE = 3        /* learned T5 relative bias table, in the kernel */
} qkv_pos_kind;

typedef struct qkv_mha_config {
    int64_t embed_dim;          /* E >= 1 */
    int64_t heads;              /* H >= 1 */
    int64_t heads_kv;           /* 0 means H; must divide H */
    int64_t head_dim;           /* Dh; 0 means E / H (then H must divide E) */
    int64_t kdim, vdim;         /* key/value input dims; 0 means E */
    int bias;                   /* in/out projection biases (torch default: 1) */
    qkv_head_join join;
    qkv_pos_kind pos;
    double rope_base;           /* 0 means 10000 */
    int64_t rel_buckets;        /* QKV_POS_RELATIVE: 0 means 32 */
    int64_t rel_max_distance;   /* QKV_POS_RELATIVE: 0 means 128 */
    /* The attention itself: score, scale, temperature, softcap, norm,
     * relu_divide_by_count, mask, window_left/right, impl, threads are used;
     * the sizes, dtype, tensors and bias fields are set by the layer.
     * score = QKV_SCORE_ADDITIVE gives the layer per-head additive
     * parameters W1, W2 [H, A, Dh] and w [H, A] (A = attn.additive_dim, 0
     * means Dh), trained like the others and saved as additive.w1,
     * additive.w2, additive.w (qkv's names: torch has no such layer);
     * the additive score runs on the reference path (impl FAST:
     * QKV_ERR_UNSUPPORTED). */
    qkv_attn_desc attn;
    /* torch's add_bias_kv: one learned extra key and value, bias_k and
     * bias_v [1, 1, H_kv Dh], joined to the projected keys and values of
     * every sequence and visible to every query whatever the mask or key
     * lengths (as torch pads its masks with a visible column). The attention
     * then has n_k + 1 keys; the attn output's last column is the extra key,
     * as torch's. Masks: NONE and CAUSAL (then n_q <= n_k + 1, else the
     * forward returns QKV_ERR_UNSUPPORTED); WINDOW and CAUSAL_WINDOW:
     * QKV_ERR_UNSUPPORTED. ALiBi and relative biases see the extra key at
     * position -1 (before the first key); RoPE leaves it unrotated. */
    int add_bias_kv;
} qkv_mha_config;

typedef struct qkv_mha qkv_mha;     /* opaque: parameters, gradients, activations */
typedef struct qkv_safetensors qkv_safetensors;   /* see the safetensors section */

/* Defaults: bias on, CONCAT, no positional encoding, scaled dot softmax. */
void qkv_mha_config_init(qkv_mha_config *cfg, int64_t embed_dim, int64_t heads);

/* Create a layer, parameters initialised like torch (xavier-uniform
 * projections from a seeded generator, zero biases). Errors: those of the
 * config (QKV_ERR_BAD_SIZE, QKV_ERR_HEADS, QKV_ERR_BAD_ENUM, ...),
 * QKV_ERR_OUT_OF_MEMORY. */
qkv_status qkv_mha_create(const qkv_mha_config *cfg, uint64_t seed, qkv_mha **out);
void qkv_mha_free(qkv_mha *m);

/* All parameters as one flat float array, and their gradients (same
 * layout), for optimisers: *count floats each. Owned by the layer. */
float *qkv_mha_params(qkv_mha *m, int64_t *count);
float *qkv_mha_grads(qkv_mha *m, int64_t *count);
void qkv_mha_zero_grad(qkv_mha *m);

/* Attention dropout of the layer's following forward and backward calls
 * (see qkv_attn_desc.dropout): probability p in [0, 1), mask seed. A
 * backward uses the setting its forward had. Errors: QKV_ERR_NULL_POINTER,
 * QKV_ERR_BAD_PARAMETER. */
qkv_status qkv_mha_set_dropout(qkv_mha *m, double p, uint64_t seed);

/* Compute precision of the layer's attention core (mixed precision,
 * docs/HALF.md "Mixed-precision training"): QKV_F32 (the default), QKV_BF16
 * or QKV_F16. With a half type the forward rounds the projected q, k, v
 * (after RoPE and bias_k/bias_v) to half copies, runs
 * qkv_attention_forward in that storage and widens the output back to
 * float32; the backward does the same with dout and widens dq, dk, dv. The
 * parameters, their gradients, the projections and everything else stay
 * float32 (master weights); accumulation and softmax statistics are float32
 * as always. The extra memory is the half copies, O(B n H Dh). Decoding
 * (qkv_mha_decode) stays float32. Errors: QKV_ERR_NULL_POINTER,
 * QKV_ERR_BAD_ENUM (another dtype). */
qkv_status qkv_mha_set_precision(qkv_mha *m, qkv_dtype compute);
qkv_dtype qkv_mha_get_precision(const qkv_mha *m);

/* Load / save the parameters with torch's names, each prefixed by `prefix`
 * (e.g. "layers.0.attn." or ""). Load checks every shape and reports a
 * missing or misshapen tensor (QKV_ERR_SHAPE, QKV_ERR_FORMAT) with its name in
 * why. Errors also QKV_ERR_NULL_POINTER, QKV_ERR_OUT_OF_MEMORY. */
qkv_status qkv_mha_load(qkv_mha *m, const qkv_safetensors *st, const char *prefix,
                        char *why, size_t why_len);
qkv_status qkv_mha_save(const qkv_mha *m, qkv_safetensors *st, const char *prefix);

/* Forward. x_k == NULL means x_k = x_q (self-attention); x_v == NULL means
 * x_v = x_k. key_lengths [B] (padding) or NULL. y [B, n_q, E] written; attn
 * [B, H, n_q, n_k] optional (the per-head attention matrices; with
 * add_bias_kv [B, H, n_q, n_k + 1], the extra key's weight last as in torch;
 * QKV_ERR_UNSUPPORTED for a causal mask with n_q > n_k + 1). The layer
 * keeps the activations the backward needs (O(B n H Dh), never n x n), so
 * one layer object serves one forward/backward at a time. */
qkv_status qkv_mha_forward(qkv_mha *m, int64_t batch, int64_t n_q, int64_t n_k,
                           const float *x_q, const float *x_k, const float *x_v,
                           const int64_t *key_lengths, float *y, float *attn);

/* Backward of the most recent forward, called with the same inputs.
 * Accumulates parameter gradients (qkv_mha_grads) and writes input
 * gradients: dx_q [B, n_q, E]; dx_k, dx_v likewise. With self-attention
 * (x_k NULL in the forward) dx_q receives the whole input gradient and dx_k,
 * dx_v must be NULL; with x_v NULL, dx_k receives both key and value parts.
 * Any dx may be NULL when not wanted. Errors: QKV_ERR_NULL_POINTER,
 * QKV_ERR_UNSUPPORTED (no forward before), QKV_ERR_OUT_OF_MEMORY. */
qkv_status qkv_mha_backward(qkv_mha *m, const float *x_q, const float *x_k, const float *x_v,
                            const float *dy, float *dx_q, float *dx_k, float *dx_v);

/* A key/value cache for incremental decoding with a self-attention layer:
 * memory 2 * batch * max_len * H_kv * Dh floats (plus the layer's own;
 * max_len + 1 with add_bias_kv: each row keeps bias_k / bias_v in front).
 * Each qkv_mha_decode call appends the keys and values of t new tokens and
 * attends them causally to everything cached (aligned bottom-right, RoPE
 * positions continuing), without recomputing the past. Decoding n tokens one
 * at a time gives the outputs of one causal forward over all n. */
typedef struct qkv_kv_cache qkv_kv_cache;
qkv_status qkv_kv_cache_create(const qkv_mha *m, int64_t batch, int64_t max_len, qkv_kv_cache **out);
void qkv_kv_cache_free(qkv_kv_cache *c);
void qkv_kv_cache_reset(qkv_kv_cache *c);
int64_t qkv_kv_cache_length(const qkv_kv_cache *c);

/* How a cache stores its keys and values. Memory per cached token, per
 * layer and per batch row, keys and values together (H_kv heads of Dh):
 *   QKV_KV_F32   8 H_kv Dh bytes                       (exact)
 *   QKV_KV_BF16  4 H_kv Dh bytes                       (each value rounded to
 *                bf16, nearest even: relative error <= 2^-9)
 *   QKV_KV_INT8  2 H_kv (Dh + 4 ceil(Dh / 32)) bytes   (each head's key and
 *                value row cut in blocks of 32 values, each block stored as
 *                int8 q = round(x / s), |q| <= 127, with one float32 scale
 *                s = max|x| / 127 of the block - symmetric, no zero point;
 *                error per value <= s / 2 = max|x| / 254 of its block; a
 *                block holding NaN or +-inf is stored as all NaN)
 * e.g. H_kv = 8, Dh = 64: 4096, 2048 and 1152 bytes per token. Attention
 * over a bf16 or int8 cache widens each key and value in registers as it
 * reads them (the cache is never expanded to float32), accumulating in
 * float32 with a two-pass softmax; docs/HALF.md states the measured error
 * against a float32 cache. */
typedef enum qkv_kv_storage {
    QKV_KV_F32 = 0,
    QKV_KV_BF16 = 1,
    QKV_KV_INT8 = 2
} qkv_kv_storage;

/* A cache of the given storage. Its attention streams the cache once per
 * query row and head (decode kernels per ISA, chosen at run time like the
 * attention kernels), serving layers with the scaled-dot or dot score, the
 * softmax normaliser, no relative-position bias, no add_bias_kv and no
 * attention dropout at decode time (soft-cap, ALiBi, RoPE, GQA, causal
 * windows are fine). Other layers: QKV_KV_F32 gives the general cache of
 * qkv_kv_cache_create (which attends through qkv_attention_forward, every
 * layer feature, but computes a 64-row query tile per decoded token, so it
 * is several times slower per token: docs/HALF.md), bf16 and int8 give
 * QKV_ERR_UNSUPPORTED. A decode over a bf16 / int8 cache with dropout set
 * is QKV_ERR_UNSUPPORTED. Errors otherwise as qkv_kv_cache_create, plus
 * QKV_ERR_BAD_ENUM for an unknown storage. */
qkv_status qkv_kv_cache_create_typed(const qkv_mha *m, int64_t batch, int64_t max_len,
                                     qkv_kv_storage storage, qkv_kv_cache **out);

/* Bytes a cache of this storage holds per token and batch row for layer m
 * (the table above); 0 for NULL or an unknown storage. */
size_t qkv_kv_cache_bytes_per_token(const qkv_mha *m, qkv_kv_storage storage);

/* x [B, t, E] -> y [B, t, E], B the cache's batch. Errors: QKV_ERR_NULL_POINTER,
 * QKV_ERR_BAD_SIZE (t <= 0), QKV_ERR_POSITION (the cache would exceed
 * max_len: nothing is appended), QKV_ERR_SHAPE (the cache belongs to another
 * layer), QKV_ERR_OUT_OF_MEMORY. qkv_kv_cache_create needs a self-attention
 * layer (kdim = vdim = E; else QKV_ERR_UNSUPPORTED). */
qkv_status qkv_mha_decode(qkv_mha *m, qkv_kv_cache *c, int64_t t, const float *x, float *y);

/* ------------------------------------------------------------------------- */
/* Transformer models and their training (decoder or encoder, pre-LayerNorm):
 *
 *   h = embed(tokens) [+ absolute positions]
 *   per block:  h = h + MHA(LN1(h));  h = h + W2 GELU(W1 LN2(h) + b1) + b2
 *   logits = LN_f(h) W_headᵀ        (W_head tied to the embedding or not)
 *
 * Every part has a backward pass; parameters are float, kept in the model,
 * exposed as named segments for optimisers and checkpoints. */

typedef enum qkv_posenc {
    QKV_POSENC_NONE = 0,
    QKV_POSENC_SINUSOIDAL = 1,   /* added to the embeddings */
    QKV_POSENC_LEARNED = 2,      /* a trainable [max_seq, E] table */
    QKV_POSENC_ROPE = 3,         /* inside every attention layer */
    QKV_POSENC_ALIBI = 4,        /* inside every attention kernel */
    QKV_POSENC_RELATIVE = 5,     /* T5 buckets, a table per layer */
    QKV_POSENC_FLOATER = 6       /* a neural ODE, added before every block */
} qkv_posenc;

typedef struct qkv_model_config {
    int64_t vocab;               /* V >= 2 */
    int64_t dim;                 /* E */
    int64_t heads;               /* H, divides E */
    int64_t layers;              /* L >= 1 */
    int64_t mlp_dim;             /* 0 means 4E */
    int64_t max_seq;             /* the longest sequence (learned table size) */
    int causal;                  /* 1: decoder, 0: encoder */
    int tie_embeddings;          /* output head = embedding matrix */
    qkv_posenc pos;
    double dropout;              /* on the attention weights (in the kernel), the residual
                                    branches and the MLP, in [0, 1) */
    int threads;                 /* 0 = default */
} qkv_model_config;

typedef struct qkv_model qkv_model;

/* Defaults: E 128, H 4, L 2, 4E MLP, causal, tied, sinusoidal, no dropout. */
void qkv_model_config_init(qkv_model_config *cfg, int64_t vocab, int64_t max_seq);

/* Errors: QKV_ERR_NULL_POINTER, QKV_ERR_BAD_SIZE, QKV_ERR_HEADS,
 * QKV_ERR_BAD_ENUM, QKV_ERR_BAD_PARAMETER, QKV_ERR_OUT_OF_MEMORY. */
qkv_status qkv_model_create(const qkv_model_config *cfg, uint64_t seed, qkv_model **out);
void qkv_model_free(qkv_model *m);
const qkv_model_config *qkv_model_get_config(const qkv_model *m);

/* Forward over tokens [B, n] (0 <= token < V, n <= max_seq). logits
 * [B, n, V] optional (NULL: kept inside). With targets [B, n] (-1 = no loss
 * at that position), *loss receives the mean cross-entropy over the targeted
 * positions. train != 0 applies dropout (from the seed given to
 * qkv_model_set_step). Keeps activations for qkv_model_backward. Errors:
 * QKV_ERR_NULL_POINTER, QKV_ERR_BAD_SIZE, QKV_ERR_POSITION (n > max_seq),
 * QKV_ERR_BAD_PARAMETER (a token or target out of range),
 * QKV_ERR_OUT_OF_MEMORY. */
qkv_status qkv_model_forward(qkv_model *m, int64_t batch, int64_t n, const int32_t *tokens,
                             const int32_t *targets, int train, float *logits, double *loss);

/* Backward of the most recent forward (which had targets): accumulates
 * gradients of every parameter. Errors: QKV_ERR_UNSUPPORTED (no forward with
 * targets before), QKV_ERR_OUT_OF_MEMORY. */
qkv_status qkv_model_backward(qkv_model *m);

/* Gradient-ready hook, for overlapping communication with the backward
 * (data-parallel all-reduce: qkv_dp_reducer). When set, qkv_model_backward
 * calls hook(user, segments, count) each time the gradients of some
 * parameter segments are final, with their indices (as qkv_model_segment's):
 * first the final norm and an untied output head, then each block from the
 * last to the first (its MLP, norms and attention layer), then the FLOATER
 * parameters, the embedding (with a tied head) and learned positions. Each
 * segment is reported once per backward, always in the same order. The hook
 * may read (not write) the reported gradients; a status other than QKV_OK
 * stops the backward, which returns it. hook NULL removes it. Errors:
 * QKV_ERR_NULL_POINTER (m). */
typedef qkv_status (*qkv_grad_hook)(void *user, const int64_t *segments, int64_t count);
qkv_status qkv_model_set_grad_hook(qkv_model *m, qkv_grad_hook hook, void *user);

/* Attention weights of layer l from the most recent forward, for
 * inspection: attn [B, H, n, n] (written only when the forward ran with
 * qkv_model_keep_attention(m, 1)). Errors: QKV_ERR_UNSUPPORTED, bad l. */
qkv_status qkv_model_keep_attention(qkv_model *m, int keep);
const float *qkv_model_attention(const qkv_model *m, int64_t layer);

/* Incremental decoding for a causal model, one sequence (batch 1): begin
 * allocates a KV cache per layer for up to max_len tokens; each step feeds t
 * new tokens and writes their logits [t, V], attending to everything fed
 * before without recomputing it. The logits equal those of one forward over
 * the whole sequence. Errors: QKV_ERR_NULL_POINTER, QKV_ERR_UNSUPPORTED
 * (encoder model, or step before begin), QKV_ERR_POSITION (past max_len or
 * the model's max_seq), QKV_ERR_BAD_PARAMETER (token out of range),
 * QKV_ERR_OUT_OF_MEMORY. */
qkv_status qkv_model_decode_begin(qkv_model *m, int64_t max_len);
/* As qkv_model_decode_begin (which is storage QKV_KV_F32), with the caches in
 * the given storage (qkv_kv_storage: bf16 or int8 halve or quarter their
 * memory; the logits then differ from the float32 forward's by the rounding
 * stated there). Errors also QKV_ERR_BAD_ENUM and, for bf16 / int8, the
 * QKV_ERR_UNSUPPORTED of qkv_kv_cache_create_typed. */
qkv_status qkv_model_decode_begin_typed(qkv_model *m, int64_t max_len, qkv_kv_storage storage);
qkv_status qkv_model_decode_step(qkv_model *m, int64_t t, const int32_t *tokens, float *logits);

/* Parameter segments (each a named float array with its gradient), for
 * optimisers and checkpoints. i in 0 .. count-1. */
int64_t qkv_model_segment_count(const qkv_model *m);
qkv_status qkv_model_segment(qkv_model *m, int64_t i, const char **name, float **param, float **grad,
                             int64_t *count);
int64_t qkv_model_param_count(const qkv_model *m);
void qkv_model_zero_grad(qkv_model *m);
/* Dropout masks are a pure function of (seed, step, position): set the step
 * before each training forward so runs are reproducible bit for bit. */
void qkv_model_set_step(qkv_model *m, uint64_t seed, int64_t step);
/* Mixed precision: the attention core of every layer in QKV_BF16 or
 * QKV_F16 (qkv_mha_set_precision), or QKV_F32 (the default). Not saved with
 * the model (a training choice). Errors: QKV_ERR_NULL_POINTER,
 * QKV_ERR_BAD_ENUM. */
qkv_status qkv_model_set_precision(qkv_model *m, qkv_dtype compute);
/* Loss scaling: qkv_model_backward multiplies the loss gradient (and so
 * every gradient) by `scale` (default 1; finite and > 0, else
 * QKV_ERR_BAD_PARAMETER). Used through qkv_loss_scaler below. */
qkv_status qkv_model_set_loss_scale(qkv_model *m, double scale);

/* Save / load parameters and configuration (as "__metadata__") in a
 * safetensors set; load needs a model of the same configuration. */
qkv_status qkv_model_save(const qkv_model *m, qkv_safetensors *st);
qkv_status qkv_model_load(qkv_model *m, const qkv_safetensors *st, char *why, size_t why_len);
/* The configuration stored in a set by qkv_model_save. */
qkv_status qkv_model_config_from(const qkv_safetensors *st, qkv_model_config *cfg, char *why, size_t why_len);

/* AdamW (Loshchilov & Hutter) over all segments, with global-norm gradient
 * clipping (clip <= 0: off); weight decay is not applied to biases, norms
 * and position tables. State (moments) inside the optimiser. */
typedef struct qkv_adamw qkv_adamw;
qkv_status qkv_adamw_create(qkv_model *m, double beta1, double beta2, double eps, double weight_decay,
                            qkv_adamw **out);
void qkv_adamw_free(qkv_adamw *o);
/* One step at learning rate lr; returns the gradient norm before clipping. */
qkv_status qkv_adamw_step(qkv_adamw *o, double lr, double clip, double *grad_norm);
/* Moments and step count, for checkpoints (resume exactly). */
qkv_status qkv_adamw_save(const qkv_adamw *o, qkv_safetensors *st);
qkv_status qkv_adamw_load(qkv_adamw *o, const qkv_safetensors *st, char *why, size_t why_len);

/* Warm-up (linear from 0) then cosine decay to min_lr at total_steps. */
double qkv_lr_schedule(int64_t step, int64_t warmup, int64_t total_steps, double lr, double min_lr);

/* Dynamic loss scaling for fp16 training (torch's GradScaler rule), so that
 * small gradients of the attention core's fp16 dout do not flush to zero:
 *
 *     qkv_loss_scaler ls;  qkv_loss_scaler_init(&ls);
 *     per step: qkv_model_zero_grad(m); qkv_model_set_loss_scale(m, ls.scale);
 *               forward, backward;
 *               qkv_loss_scaler_step(&ls, m, opt, lr, clip, &norm, &skipped);
 *
 * qkv_loss_scaler_step checks every gradient: if any is inf or NaN, the step
 * is skipped (parameters and optimiser state untouched, *skipped = 1), the
 * scale halves (not below 2^-24) and the clean count restarts; otherwise
 * the gradients are unscaled (multiplied by 1/scale: exact, the scale being a
 * power of two), qkv_adamw_step runs (its clipping sees the true gradients),
 * and after growth_interval clean steps in a row the scale doubles (not
 * above 2^48). Deterministic: a function of the gradients alone. The state
 * is these four numbers (checkpoints may store them). */
typedef struct qkv_loss_scaler {
    double scale;             /* 2^15 at init */
    int64_t growth_interval;  /* 1000 at init */
    int64_t clean;            /* clean steps since the scale last changed */
    int64_t skipped;          /* steps skipped so far */
} qkv_loss_scaler;
void qkv_loss_scaler_init(qkv_loss_scaler *ls);
/* Errors: QKV_ERR_NULL_POINTER (ls, m, opt), QKV_ERR_BAD_PARAMETER (a scale
 * that is not a positive power of two, growth_interval < 1), those of
 * qkv_adamw_step. grad_norm (optional): the unscaled norm, +inf when skipped. */
qkv_status qkv_loss_scaler_step(qkv_loss_scaler *ls, qkv_model *m, qkv_adamw *opt, double lr, double clip,
                                double *grad_norm, int *skipped);

/* ------------------------------------------------------------------------- */
/* Training tasks that need attention, generated on the fly from (seed,
 * index): the same arguments give the same batch on every machine.
 *
 * Decoder tasks (causal): the input, a separator, then the answer; targets
 * are the next tokens of the answer (-1 elsewhere):
 *   COPY     x_1..x_L SEP x_1..x_L            REVERSE  ... SEP x_L..x_1
 *   SORT     ... SEP sorted(x)                RECALL   k_1 v_1 .. k_P v_P SEP q_1 .. q_P
 *   TEXT     bytes of a text window, next-byte prediction (vocab 256)
 * RECALL's keys are distinct (keys 0..S-1, values S..2S-1, SEP 2S, n = 3P+1);
 * the queries q_j are its keys again in a random order, and the target at
 * q_j is the value paired with it (every query is the single-query task).
 * Encoder tasks (bidirectional): a target at every position:
 *   LABEL    word classes where a word's label depends on its position (the
 *            articles' part-of-speech example: at the start of a sentence a
 *            word that is otherwise a verb is a noun)
 *   MLM      BERT-style masked bytes of a text (15% replaced by MASK = 256;
 *            targets only there; vocab 257) */
typedef enum qkv_task {
    QKV_TASK_COPY = 0,
    QKV_TASK_REVERSE = 1,
    QKV_TASK_SORT = 2,
    QKV_TASK_RECALL = 3,
    QKV_TASK_TEXT = 4,
    QKV_TASK_LABEL = 5,
    QKV_TASK_MLM = 6
} qkv_task;

typedef struct qkv_task_spec {
    qkv_task task;
    int64_t length;          /* L: sequence to copy/sort, pairs P for RECALL, window for TEXT/MLM/LABEL */
    int64_t symbols;         /* alphabet size of the content (0: 16; RECALL keys and values each) */
    const unsigned char *text;   /* TEXT, MLM: the corpus (borrowed) */
    size_t text_len;
} qkv_task_spec;

/* Vocabulary size, total sequence length n, and whether the task is causal.
 * Errors: QKV_ERR_NULL_POINTER, QKV_ERR_BAD_SIZE (length or symbols out of
 * range, text shorter than a window + 1), QKV_ERR_BAD_ENUM. */
qkv_status qkv_task_shape(const qkv_task_spec *spec, int64_t *vocab, int64_t *n, int *causal);

/* Fill tokens and targets [batch, n] for batch number `index`. */
qkv_status qkv_task_batch(const qkv_task_spec *spec, uint64_t seed, int64_t index, int64_t batch, int32_t *tokens,
                          int32_t *targets);

/* A readable name ("copy", ...) and the task of a name (-1 if none). */
const char *qkv_task_name(qkv_task task);
int qkv_task_from_name(const char *name);

/* ------------------------------------------------------------------------- */
/* Pictures: attention heatmaps (per layer and head) as PNG files and as
 * coloured text for a terminal, line plots such as loss curves, and matrix
 * images such as the sinusoidal positional encoding (the articles' figure,
 * one column per position's e^i).
 *
 * PNGs are 8-bit RGB written with libpng, atomically like qkv_npy_save: a
 * temporary file in the same folder, renamed over the path when complete, so
 * no failure leaves a partial or broken file (and an existing file at path
 * stays as it was). Labels, titles and ticks are drawn with a built-in 5x7
 * bitmap font: printable ASCII; any other byte is drawn as '?'. The
 * functions here never print: the terminal heatmap is returned as text. */

/* One attention matrix, or several drawn side by side (the heads of a
 * layer). Initialise with qkv_heatmap_init, then set what you want. */
typedef struct qkv_heatmap {
    int64_t panels;                   /* P maps side by side, 1 .. 64 (default 1) */
    int64_t rows, cols;               /* each map rows x cols (queries x keys), 1 .. 4096 */
    const float *values;              /* [P, rows, cols] (borrowed); NaN is drawn grey */
    const char *const *row_labels;    /* [rows] query tokens, or NULL for 0, 1, ...; cut to 12 chars */
    const char *const *col_labels;    /* [cols] key tokens, or NULL */
    const char *const *panel_titles;  /* [P] ("head 0", ...), or NULL */
    const char *title;                /* above everything, or NULL */
    double vmin, vmax;                /* colour range; vmin >= vmax (default): [min(0, min), max] of
                                         the finite values */
    int show_values;                  /* write each value in its cell (".42") where it fits */
    int64_t cell;                     /* PNG cell side in pixels, 0 .. 256; 0 (default): from the size */
} qkv_heatmap;

/* Defaults (above) for one rows x cols map of values. NULL h is ignored. */
void qkv_heatmap_init(qkv_heatmap *h, const float *values, int64_t rows, int64_t cols);

/* A PNG: the maps coloured dark blue (low) .. yellow (high), row labels on
 * the left (queries), column labels written upwards above each map (keys),
 * the panel titles, the title and a colour bar. Errors:
 * QKV_ERR_NULL_POINTER (path, h or values), QKV_ERR_BAD_SIZE (a size < 1 or
 * cell < 0), QKV_ERR_SIZE_OVERFLOW (sizes above the limits, or a picture
 * over 16384 pixels on a side), QKV_ERR_BAD_PARAMETER (vmin or vmax not
 * finite), QKV_ERR_OUT_OF_MEMORY, QKV_ERR_IO (cannot create or write the file,
 * e.g. a missing folder; nothing is left behind). */
qkv_status qkv_heatmap_save_png(const char *path, const qkv_heatmap *h);

typedef enum qkv_ansi_colors {
    QKV_ANSI_24BIT = 0,         /* "\x1b[48;2;R;G;Bm": most terminals today */
    QKV_ANSI_256 = 1            /* the xterm 256-colour cube */
} qkv_ansi_colors;

/* The heatmap as text for a terminal: a header line of key labels (each cut
 * to the cell width, at most 6 characters), then one line per query: its
 * label and one coloured block per key (with the value when show_values),
 * panels side by side, and a colour scale line; lines end in '\n', every
 * colour is reset at the end of its cell. The caller decides whether its
 * output is a terminal. *len receives the text's length (without the
 * terminating NUL) in every successful case. buf == NULL asks for the length
 * only; otherwise cap must exceed it (else QKV_ERR_BAD_SIZE and buf holds ""),
 * and buf receives the NUL-terminated text. Errors: those of
 * qkv_heatmap_save_png that concern h, QKV_ERR_NULL_POINTER (len),
 * QKV_ERR_BAD_ENUM (colors). */
qkv_status qkv_heatmap_format_ansi(const qkv_heatmap *h, qkv_ansi_colors colors, char *buf, size_t cap,
                                   size_t *len);

/* Line plots: up to 8 series, each a polyline in its own colour. */
typedef struct qkv_plot_series {
    const char *label;          /* legend entry, or NULL (no entry) */
    const double *x;            /* [count] (borrowed), or NULL for 0, 1, 2, ... */
    const double *y;            /* [count] (borrowed); a non-finite point is a gap in the line */
    int64_t count;              /* >= 0 */
} qkv_plot_series;

typedef struct qkv_plot {
    const char *title, *x_label, *y_label;    /* each optional (NULL) */
    const qkv_plot_series *series;
    int64_t n_series;                         /* 1 .. 8 */
    int log_x, log_y;           /* logarithmic axis (points <= 0 on it are left out) */
    int markers;                /* a dot on every point */
    int64_t width, height;      /* pixels; 0 means 720 x 440; at least 200 x 150 */
} qkv_plot;

/* All zero: no titles, no series, linear axes, default size. */
void qkv_plot_init(qkv_plot *p);

/* A PNG with axes, grid, tick labels (1-2-5 steps; on a log axis decades,
 * plus 2x and 5x when at most three decades show), axis labels, title and
 * a legend of the labelled series. The axes span the usable points (all of
 * the series together); with none, [0, 1]. Errors: QKV_ERR_NULL_POINTER
 * (path, p, series, or y of a non-empty series), QKV_ERR_BAD_SIZE (n_series
 * outside 1..8, a negative count, a size too small), QKV_ERR_SIZE_OVERFLOW,
 * QKV_ERR_OUT_OF_MEMORY, QKV_ERR_IO (nothing left behind). */
qkv_status qkv_plot_save_png(const char *path, const qkv_plot *p);

/* A loss curve: loss[i] against steps[i] (steps NULL: 0, 1, ...), titled
 * `title` (NULL: "training loss"), axes "step" and "loss". Errors as
 * qkv_plot_save_png; QKV_ERR_BAD_SIZE for count < 1. */
qkv_status qkv_loss_curve_save_png(const char *path, const double *steps, const double *loss, int64_t count,
                                   const char *title);

/* A matrix m [rows, cols] (row-major) as coloured cells: blue (negative),
 * white (0), red (positive), symmetric about 0 at the largest |value|, with
 * row and column indices, optional title and axis labels, and a colour bar.
 * For the positional-encoding figure pass the transpose of
 * qkv_posenc_sinusoidal's [n, E] output, so that column i is e^i. Errors:
 * QKV_ERR_NULL_POINTER, QKV_ERR_BAD_SIZE (rows or cols < 1),
 * QKV_ERR_SIZE_OVERFLOW (above 4096), QKV_ERR_OUT_OF_MEMORY, QKV_ERR_IO. */
qkv_status qkv_matrix_save_png(const char *path, const float *m, int64_t rows, int64_t cols, const char *title,
                               const char *x_label, const char *y_label);
/* ------------------------------------------------------------------------- */
/* Distributed attention and data-parallel training over MPI (docs/
 * DISTRIBUTED.md). Declared only when qkv was built with MPI: CMake then
 * defines QKV_HAVE_MPI for the library and every target that links it.
 * The library never calls MPI_Init or MPI_Finalize: the caller initialises
 * MPI (at least MPI_THREAD_FUNNELED: only the calling thread uses MPI, the
 * attention's worker threads never do) and hands a communicator to each
 * call. Every function here is collective over that communicator: all of
 * its ranks call it with the same arguments apart from the local tensors.
 * Communication runs on a private duplicate of the communicator with
 * MPI_ERRORS_RETURN, so the caller's traffic and error handler are left
 * alone. Errors are agreed between ranks: when any rank fails (a NULL
 * tensor, no memory, non-finite input), every rank returns an error (its
 * own, else the largest code of the others), and none is left waiting; a
 * failed MPI call is QKV_ERR_IO. A rank that dies mid-call is MPI's
 * business: mpirun ends the job (run jobs under a timeout). */
#ifdef QKV_HAVE_MPI
#ifdef __cplusplus
}   /* mpi.h may bring C++ bindings: include it outside extern "C" */
#endif
#include <mpi.h>
#ifdef __cplusplus
extern "C" {
#endif

/* How a sequence of n positions is split over p ranks. */
typedef enum qkv_dist_layout {
    QKV_DIST_CONTIGUOUS = 0,    /* rank r holds piece r of p nearly equal pieces
                                   (the first n mod p one longer) */
    QKV_DIST_ZIGZAG = 1         /* the sequence cut into 2p pieces; rank r holds
                                   pieces r and 2p-1-r, stored in that order:
                                   every rank gets the same causal work */
} qkv_dist_layout;

/* The positions rank `rank` of `ranks` holds: the runs start[t] ..
 * start[t] + len[t] - 1 for t = 0, 1 (len[1] = 0 for CONTIGUOUS), stored
 * locally one after the other; *local_n = len[0] + len[1] (0 when n is
 * smaller than the number of pieces). Errors: QKV_ERR_NULL_POINTER,
 * QKV_ERR_BAD_SIZE (n < 1, ranks < 1, rank outside 0..ranks-1),
 * QKV_ERR_BAD_ENUM. */
qkv_status qkv_dist_partition(int64_t n, int ranks, int rank, qkv_dist_layout layout,
                              int64_t start[2], int64_t len[2], int64_t *local_n);

/* Ring attention (Liu, Zaharia & Abbeel 2023): desc describes the WHOLE
 * problem (n_q, n_k global); each rank passes its positions, laid out by
 * qkv_dist_partition over the communicator's size:
 *   q   [B, nq_loc, H, D]      k [B, nk_loc, H_kv, D]   v [B, nk_loc, H_kv, D_v]
 *   out [B, nq_loc, H, D_v]    written
 *   lse [B, H, nq_loc]         optional (NULL), as qkv_attention_forward's
 * Keys and values travel round the ring (non-blocking sends overlapped with
 * the block in hand); each block is computed by qkv_attention_forward and
 * the partial outputs are merged by their log-sum-exp, so the result equals
 * one process's to float rounding. Memory per rank O((n_q + n_k)/p); no rank
 * ever holds all keys and values. Tensors of a rank holding no position may
 * be NULL. Supported: F32; softmax, ReLU (also divided by the count) and
 * sigmoid; scaled-dot/dot/cosine scores, softcap; GQA; key_lengths (global
 * indices); every mask (NONE, CAUSAL, WINDOW, CAUSAL_WINDOW, bottom-right
 * aligned for any n_q, n_k; blocks outside every window are skipped); the
 * additive bias, of which each rank passes its queries' rows for every key:
 * desc->bias [n_q_loc, n_k] (SHARED) or [H, n_q_loc, n_k] (PER_HEAD), rows
 * in the local order - O(n_q n_k / p) per rank, the bias being n x n;
 * packed sequences (B = 1; every rank passes the whole seq_offsets_q/_k,
 * q and k are its positions of the packed streams, as qkv_dist_partition
 * cuts them: a sequence may straddle ranks).
 * QKV_ERR_UNSUPPORTED: the additive score, ALiBi, relative tables,
 * dropout, F64 and half precision. Errors: those of
 * qkv_attention_forward, QKV_ERR_UNSUPPORTED (also MPI not initialised),
 * QKV_ERR_IO (communication failed). */
qkv_status qkv_ring_attention_forward(const qkv_attn_desc *desc, qkv_dist_layout layout,
                                      MPI_Comm comm, const void *q, const void *k, const void *v,
                                      void *out, void *lse);

/* Backward of the ring forward: dout [B, nq_loc, H, D_v] given; dq, dk, dv
 * shaped as the local q, k, v, written. out and lse are the ring forward's
 * (NULL on any rank: every rank runs the forward ring first). dQ is
 * computed at home; the partial dK/dV of each key block travel round the
 * ring with it and return to its owner. Each block uses the fast path with
 * the global O and lse (impl REFERENCE is QKV_ERR_UNSUPPORTED here); ReLU
 * and sigmoid need neither (out, lse may then be NULL without a forward
 * ring). Supported and errors: as the forward. */
qkv_status qkv_ring_attention_backward(const qkv_attn_desc *desc, qkv_dist_layout layout,
                                       MPI_Comm comm, const void *q, const void *k, const void *v,
                                       const void *out, const void *lse, const void *dout,
                                       void *dq, void *dk, void *dv);

/* The same with the gradients in a qkv_attn_grads: dq, dk, dv (local, as
 * above) and, optionally, dbias: this rank's rows of the bias gradient,
 * shaped as its desc->bias ([n_q_loc, n_k] or [H, n_q_loc, n_k], summed over
 * the batch, and over the heads for SHARED), overwritten; computed at home
 * (every (query, key) block of this rank's queries passes through it), no
 * extra communication. The other fields are ignored (their features are
 * QKV_ERR_UNSUPPORTED on the ring). grads NULL: QKV_ERR_NULL_POINTER. */
qkv_status qkv_ring_attention_backward_grads(const qkv_attn_desc *desc, qkv_dist_layout layout, MPI_Comm comm,
                                             const void *q, const void *k, const void *v, const void *out,
                                             const void *lse, const void *dout, const qkv_attn_grads *grads);

/* Data-parallel training. Copy rank root's parameters to every rank. */
qkv_status qkv_model_bcast_params(qkv_model *m, int root, MPI_Comm comm);

/* Replace every rank's gradients by sum over ranks of weight_r * grad_r
 * (weight_r: this rank's share of the batch's loss terms, so the result is
 * the gradient of the whole batch's mean loss), reduced in buckets of about
 * bucket_bytes (0: 4 MiB) by non-blocking MPI_Iallreduce calls in flight
 * together. Every rank ends with the same gradients. Errors:
 * QKV_ERR_NULL_POINTER, QKV_ERR_BAD_PARAMETER (weight < 0 or not finite),
 * QKV_ERR_OUT_OF_MEMORY, QKV_ERR_UNSUPPORTED (MPI not initialised),
 * QKV_ERR_IO. */
qkv_status qkv_model_allreduce_grads(qkv_model *m, double weight, size_t bucket_bytes, MPI_Comm comm);

/* The same reduction overlapped with the backward pass: the reducer sets
 * m's gradient hook (qkv_model_set_grad_hook) and packs each segment,
 * scaled by weight, into a flat buffer as soon as the backward has finished
 * it, starting a non-blocking MPI_Iallreduce on each bucket of
 * bucket_bytes (0: 1 MiB) as soon as it is full - the last block's buckets
 * travel while the earlier blocks are computed. Per step, on every rank:
 *     qkv_dp_reducer_begin(r, weight);    before qkv_model_backward
 *     s = qkv_model_backward(m);
 *     s = qkv_dp_reducer_finish(r, s);    waits for every bucket; writes grads
 * finish is collective and takes this rank's backward status: a rank whose
 * backward failed (or did not run) still completes the reductions, and
 * every rank returns an error (its own, else the largest code of the
 * others), leaving the gradients unspecified. The buckets are the same on
 * every run (the backward reports segments in a fixed order), so results
 * are reproducible bit for bit for a given number of ranks. create is
 * collective; the reducer holds 4 bytes per parameter. free removes the
 * hook. Errors: QKV_ERR_NULL_POINTER, QKV_ERR_BAD_PARAMETER (weight < 0 or
 * not finite), QKV_ERR_OUT_OF_MEMORY, QKV_ERR_UNSUPPORTED (MPI not
 * initialised; begin twice without finish), QKV_ERR_IO. */
typedef struct qkv_dp_reducer qkv_dp_reducer;
qkv_status qkv_dp_reducer_create(qkv_model *m, size_t bucket_bytes, MPI_Comm comm, qkv_dp_reducer **out);
qkv_status qkv_dp_reducer_begin(qkv_dp_reducer *r, double weight);
qkv_status qkv_dp_reducer_finish(qkv_dp_reducer *r, qkv_status backward_status);
void qkv_dp_reducer_free(qkv_dp_reducer *r);
#endif /* QKV_HAVE_MPI */

/* ------------------------------------------------------------------------- */
/* NumPy .npy arrays (format versions 1.0, 2.0 and 3.0; little-endian; C order;
 * dtypes <f4, <f8, <i4, <i8, <f2 (QKV_F16) and <u2, which qkv reads and
 * writes as QKV_BF16: NumPy has no bfloat16, so a bf16 array is stored as
 * uint16 holding its bit patterns - in NumPy, (a.astype(np.uint32) << 16)
 * .view(np.float32) widens it). Untrusted input: every header field is
 * checked and sizes are checked for overflow before anything is allocated. */

#define QKV_NPY_MAX_DIMS 8

typedef struct qkv_array {
    qkv_dtype dtype;
    int ndim;                           /* 0 .. QKV_NPY_MAX_DIMS */
    int64_t shape[QKV_NPY_MAX_DIMS];
    void *data;                         /* owned when loaded: free with qkv_array_free */
} qkv_array;

/* Number of elements (product of the shape; 1 for ndim 0); 0 for NULL or an
 * invalid array (ndim out of range, negative dim, overflowing product). */
int64_t qkv_array_count(const qkv_array *a);

/* Parse an in-memory .npy file. On success *out owns a new buffer. On failure
 * *out is zeroed and, when why != NULL, a one-line reason (no file name) is
 * written into why[why_len]. Errors: QKV_ERR_NULL_POINTER, QKV_ERR_FORMAT
 * (bad magic, version, header, truncated, Fortran order, big-endian),
 * QKV_ERR_DTYPE (any other dtype), QKV_ERR_SIZE_OVERFLOW,
 * QKV_ERR_OUT_OF_MEMORY. More than QKV_NPY_MAX_DIMS dims is QKV_ERR_FORMAT.
 * Bytes after the data are ignored, as numpy.load does. */
qkv_status qkv_npy_parse(const void *bytes, size_t len, qkv_array *out,
                         char *why, size_t why_len);

/* Load a .npy file: as qkv_npy_parse, plus QKV_ERR_IO when it cannot be read. */
qkv_status qkv_npy_load(const char *path, qkv_array *out, char *why, size_t why_len);

/* Read only the header of a .npy file: *out gets its dtype, ndim and shape,
 * with data NULL (nothing to free). Also checks that the file holds all the
 * data the header declares (a truncated file is QKV_ERR_FORMAT here, not at
 * a later read). path must be a regular file. Errors: as qkv_npy_load. */
qkv_status qkv_npy_load_header(const char *path, qkv_array *out, char *why, size_t why_len);

/* Read only some rows of a .npy file along one axis: for each of the
 * nranges ranges [starts[r], starts[r] + counts[r]) of axis `axis` (in the
 * order given; ranges may be empty, and may repeat or overlap), the rows of
 * every index of the axes before it. *out has the file's dtype and shape
 * except shape[axis] = the sum of counts, in C order: for an [A, n, X]
 * array and ranges (s0, c0), (s1, c1), out is [A, c0 + c1, X] holding
 * a[:, s0:s0+c0, :] then a[:, s1:s1+c1, :] for each index of A. Only those
 * bytes are read (pread, one strided chunk per (outer index, range)), so the
 * memory is the result's size, never the file's: this is how each MPI rank
 * of `qkv attend --distributed` reads its own positions (one contiguous
 * range, or two for the zig-zag causal layout) of q, k, v and the bias.
 * Validation as qkv_npy_load (header, dtype, the file holding all the data
 * the header declares, checked before any data is read); every offset is
 * checked to lie inside the data. *axis_len (may be NULL) gets the file's
 * full length of the axis. path must be a regular file (it is read with
 * pread). Errors: those of qkv_npy_load; QKV_ERR_NULL_POINTER (out or path
 * NULL, or starts/counts NULL with nranges > 0); QKV_ERR_BAD_SIZE (nranges
 * < 0, axis outside 0..ndim-1, a range with a negative start or count or
 * past the axis's end); QKV_ERR_SIZE_OVERFLOW; a file that shrinks while it
 * is read gives QKV_ERR_FORMAT ("truncated"). */
qkv_status qkv_npy_load_rows(const char *path, int axis, int nranges, const int64_t *starts,
                             const int64_t *counts, qkv_array *out, int64_t *axis_len, char *why,
                             size_t why_len);

/* Save an array as a version 1.0 .npy file (2.0 when the header needs it).
 * Writes to a temporary file in the same folder and renames it over path, so
 * a failure never leaves a partial file. Errors: QKV_ERR_NULL_POINTER,
 * QKV_ERR_BAD_SIZE (ndim out of range, negative dim), QKV_ERR_DTYPE,
 * QKV_ERR_SIZE_OVERFLOW, QKV_ERR_OUT_OF_MEMORY, QKV_ERR_IO. */
qkv_status qkv_npy_save(const char *path, const qkv_array *a);

/* Allocate a zero-filled array of the given dtype and shape (ndim 0..8,
 * dims >= 0). Errors: QKV_ERR_NULL_POINTER, QKV_ERR_BAD_SIZE, QKV_ERR_DTYPE,
 * QKV_ERR_SIZE_OVERFLOW, QKV_ERR_OUT_OF_MEMORY. */
qkv_status qkv_array_alloc(qkv_array *out, qkv_dtype dtype, int ndim, const int64_t *shape);

/* A new array with the values of `in` converted to dtype `to` (any of the six
 * dtypes; float to integer truncates toward zero, NaN and out-of-range values
 * give QKV_ERR_BAD_PARAMETER, as does an int64 to int32 overflow; float64 to
 * float32 rounds, overflows to inf and keeps NaN; to bf16 / fp16 from any
 * type rounds once to nearest-even (never through a rounded float32),
 * overflows to inf and keeps NaN; from them is exact). Errors as
 * qkv_array_alloc, plus QKV_ERR_BAD_PARAMETER. */
qkv_status qkv_array_convert(const qkv_array *in, qkv_dtype to, qkv_array *out);

/* Free the data of an array that a load or parse returned, and zero it.
 * NULL and already-freed (zeroed) arrays are fine. */
void qkv_array_free(qkv_array *a);

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
qkv_status qkv_sgemm(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                     const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                     float *C, int64_t ldc, int threads);

/* ------------------------------------------------------------------------- */
/* safetensors files (the PyTorch / Hugging Face weight format): an 8-byte
 * little-endian header length, a JSON header mapping names to
 * {"dtype", "shape", "data_offsets": [begin, end]} (plus an optional
 * "__metadata__" map of strings), then the raw little-endian data. Untrusted
 * input: offsets, sizes, dtypes, names and the JSON are all checked; an
 * error never reads out of bounds. Tensors of dtype F32, F64, I32, I64 load
 * as such; F16 and BF16 load converted to F32 (exactly). Arrays of
 * QKV_F16 / QKV_BF16 are saved as F16 / BF16. */

typedef struct qkv_safetensors qkv_safetensors;   /* opaque set of named tensors */

/* An empty set (to fill and save). Errors: QKV_ERR_NULL_POINTER, QKV_ERR_OUT_OF_MEMORY. */
qkv_status qkv_safetensors_create(qkv_safetensors **out);

/* Parse an in-memory file / load one. On failure *out is NULL and, when why
 * is given, a one-line reason is written there. Errors: QKV_ERR_NULL_POINTER,
 * QKV_ERR_IO (load only), QKV_ERR_FORMAT (bad header length, JSON, offsets
 * out of range or overlapping, shape/size disagreement, duplicate names),
 * QKV_ERR_DTYPE (unknown dtype), QKV_ERR_SIZE_OVERFLOW, QKV_ERR_OUT_OF_MEMORY.
 * Data bytes no tensor covers (holes) are accepted; over 8 dims is FORMAT. */
qkv_status qkv_safetensors_parse(const void *bytes, size_t len, qkv_safetensors **out,
                                 char *why, size_t why_len);
qkv_status qkv_safetensors_load(const char *path, qkv_safetensors **out, char *why, size_t why_len);

/* Write all tensors (in insertion order) and metadata; atomic like
 * qkv_npy_save. Errors: QKV_ERR_NULL_POINTER, QKV_ERR_IO, QKV_ERR_OUT_OF_MEMORY. */
qkv_status qkv_safetensors_save(const qkv_safetensors *st, const char *path);

/* Number of tensors, and the name of the i-th (NULL when out of range). */
int64_t qkv_safetensors_count(const qkv_safetensors *st);
const char *qkv_safetensors_name(const qkv_safetensors *st, int64_t i);

/* The tensor called name, or NULL. The array stays owned by the set. */
const qkv_array *qkv_safetensors_get(const qkv_safetensors *st, const char *name);

/* Add a copy of an array under a name (replacing a tensor of that name).
 * Names are 1..255 bytes of printable ASCII except '"' and '\\'. Errors:
 * QKV_ERR_NULL_POINTER, QKV_ERR_BAD_PARAMETER (bad name), QKV_ERR_DTYPE,
 * QKV_ERR_SIZE_OVERFLOW, QKV_ERR_OUT_OF_MEMORY. */
qkv_status qkv_safetensors_put(qkv_safetensors *st, const char *name, const qkv_array *a);

/* String metadata ("__metadata__"): set (copying; replacing) and get (NULL
 * when absent; owned by the set). Keys and values follow the name rule above
 * but may be up to 65535 bytes. */
qkv_status qkv_safetensors_set_meta(qkv_safetensors *st, const char *key, const char *value);
const char *qkv_safetensors_get_meta(const qkv_safetensors *st, const char *key);

/* Free a set and everything in it; NULL is fine. */
void qkv_safetensors_free(qkv_safetensors *st);

/* ------------------------------------------------------------------------- */
/* Images and 2-D self-attention.
 *
 * An image (or a feature map) of H x W pixels with C channels is stored
 * [H, W, C] row-major: it *is* H*W vectors of dimension C, the sequence the
 * attention core takes (pixel p = y*W + x). Loaded images hold floats in
 * [0, 1]. */

typedef struct qkv_image {
    int64_t height, width, channels;    /* H, W, C */
    float *data;                        /* [H, W, C]; owned: free with qkv_image_free */
} qkv_image;

/* H*W*C, or 0 for NULL, a negative size or an overflowing product. */
int64_t qkv_image_count(const qkv_image *img);

/* A zero-filled image (H, W, C >= 1). Errors: QKV_ERR_NULL_POINTER,
 * QKV_ERR_BAD_SIZE, QKV_ERR_SIZE_OVERFLOW, QKV_ERR_OUT_OF_MEMORY (then *out
 * is zeroed). */
qkv_status qkv_image_alloc(qkv_image *out, int64_t height, int64_t width, int64_t channels);

/* Free an image's data and zero it; NULL and zeroed images are fine. */
void qkv_image_free(qkv_image *img);

/* Decode an in-memory image, the format told by its first bytes:
 *   PNG (libpng): 8-bit gray (C 1), gray+alpha (2), RGB (3), RGBA (4);
 *     palettes become RGB (RGBA with transparency), 1/2/4-bit gray becomes
 *     8-bit, 16-bit samples are scaled to 8 bits; interlaced files work.
 *   binary PGM (P5, C 1) and PPM (P6, C 3), maxval 1..65535 (2-byte
 *     big-endian samples above 255); samples above maxval are clamped.
 * Values are sample / maxval (255 for PNG). Untrusted input: dimensions are
 * checked for overflow and against the bytes present before allocating (a
 * PNG cannot claim more pixels than deflate's 1032:1 ratio allows), and
 * a truncated or corrupt stream is an error. On failure *out is zeroed and a
 * one-line reason (no file name) goes to why[why_len] when why != NULL.
 * Errors: QKV_ERR_NULL_POINTER, QKV_ERR_FORMAT (unknown magic, bad header,
 * truncated or corrupt data, ASCII netpbm), QKV_ERR_SIZE_OVERFLOW,
 * QKV_ERR_OUT_OF_MEMORY. */
qkv_status qkv_image_parse(const void *bytes, size_t len, qkv_image *out, char *why, size_t why_len);

/* As qkv_image_parse on the contents of a file; also QKV_ERR_IO. */
qkv_status qkv_image_load(const char *path, qkv_image *out, char *why, size_t why_len);

/* Write an 8-bit PNG (C 1..4: gray, gray+alpha, RGB, RGBA) or a binary
 * PGM/PPM (C 1 or 3, maxval 255). Values are clamped to [0, 1] and rounded
 * to v*255 (NaN writes 0). Atomic like qkv_npy_save: a temporary file in the
 * same folder, renamed over path when complete. Errors:
 * QKV_ERR_NULL_POINTER, QKV_ERR_BAD_SIZE, QKV_ERR_SHAPE (a channel count the
 * format cannot hold), QKV_ERR_SIZE_OVERFLOW (a side over 2^31 - 1),
 * QKV_ERR_OUT_OF_MEMORY, QKV_ERR_IO. */
qkv_status qkv_image_save_png(const char *path, const qkv_image *img);
qkv_status qkv_image_save_pnm(const char *path, const qkv_image *img);

/* 2-D sinusoidal positional encoding as DETR adds it to queries and keys
 * (Carion et al. 2020, PositionEmbeddingSine): the first dim/2 channels
 * encode the row y, the last dim/2 the column x, each half interleaved as
 * sin(pos / T^(2i/(dim/2))), cos(...) with T = 10000 and pos = y + 1 (resp.
 * x + 1); normalize != 0 rescales pos to pos / (H or W) * 2 pi as DETR does.
 * out [H*W, dim] float (pixel-major). Errors: QKV_ERR_NULL_POINTER,
 * QKV_ERR_BAD_SIZE (a size <= 0, dim not a multiple of 4),
 * QKV_ERR_SIZE_OVERFLOW. */
qkv_status qkv_posenc_sinusoidal2d(int64_t height, int64_t width, int64_t dim, int normalize,
                                   float *out);

/* 2-D neighbourhood (truncated) self-attention: pixel (y, x) attends only to
 * the pixels of the K x K window centred on it (K odd; keys outside the
 * image do not exist, so border windows are smaller), with scaled-dot
 * softmax scores (scale 0 means 1/sqrt(D)). Cost O(H W K^2 heads (D + D_v))
 * and memory linear in the pixels: the keys of each window are gathered and
 * the attention core (fast path) runs on blocks of pixels with n_q = 1; no
 * (HW) x (HW) buffer exists.
 *   q [H*W, heads, D], k [H*W, heads, D], v [H*W, heads, D_v]  (pixel-major)
 *   out  [H*W, heads, D_v]   written
 *   attn [H*W, heads, K*K]   optional: the weight of window slot
 *                            (dy + K/2) * K + (dx + K/2) for the key at
 *                            (y + dy, x + dx); 0 for slots outside the image.
 * threads as in qkv_attn_desc. Errors: QKV_ERR_NULL_POINTER,
 * QKV_ERR_BAD_SIZE (a size <= 0, K even, threads < 0),
 * QKV_ERR_BAD_PARAMETER (scale not finite), QKV_ERR_SIZE_OVERFLOW,
 * QKV_ERR_OUT_OF_MEMORY. */
qkv_status qkv_neighborhood2d_forward(int64_t height, int64_t width, int64_t heads, int64_t dim,
                                      int64_t dim_v, int64_t kernel, double scale, int threads,
                                      const float *q, const float *k, const float *v, float *out,
                                      float *attn);

/* Backward of qkv_neighborhood2d_forward: dout [H*W, heads, D_v] given,
 * dq, dk, dv (shaped as q, k, v) written (overwritten, not accumulated).
 * Computed directly per pixel (the weights recomputed, double
 * accumulators) on one thread, deterministic; threads is checked but
 * unused. Errors as the forward. */
qkv_status qkv_neighborhood2d_backward(int64_t height, int64_t width, int64_t heads, int64_t dim,
                                       int64_t dim_v, int64_t kernel, double scale, int threads,
                                       const float *q, const float *k, const float *v,
                                       const float *dout, float *dq, float *dk, float *dv);

/* Direct 2-D convolution as torch.nn.Conv2d (cross-correlation), stride 1,
 * zero padding K/2, K odd, accumulated in double:
 *   y[o, i, j] = bias[o] + sum_{c, a, b} w[o, c, a, b] x[c, i + a - K/2, j + b - K/2]
 * x [C_in, H, W], weight [C_out, C_in, K, K], bias [C_out] or NULL,
 * y [C_out, H, W] written. Errors: QKV_ERR_NULL_POINTER, QKV_ERR_BAD_SIZE
 * (a size <= 0 or K even), QKV_ERR_SIZE_OVERFLOW. */
qkv_status qkv_conv2d_forward(int64_t c_in, int64_t height, int64_t width, const float *x,
                              int64_t c_out, int64_t kernel, const float *weight, const float *bias,
                              float *y);

/* The same convolution computed as multi-head self-attention, after the
 * constructive proof of Cordonnier, Loukas & Jaggi (ICLR 2020, "On the
 * Relationship between Self-Attention and Convolutional Layers", Thm 1):
 * K^2 heads, head h = (a, b) having the shift Delta_h = (a - K/2, b - K/2)
 * and the quadratic relative positional score
 *     s_h(q, k) = -alpha * |delta - Delta_h|^2,   delta = pos(k) - pos(q),
 * so that as alpha grows head h attends only to the pixel at offset
 * Delta_h. Values are the inputs (W_v = I), the output projection holds the
 * kernel: W_o[:, h block] = w[:, :, a, b]; plus the bias. The keys are the
 * pixels of the zero-padded image ((H + 2p) x (W + 2p), p = K/2): padded
 * keys have value 0, so a head whose offset leaves the image attends to a
 * zero exactly as the convolution reads one. The error against
 * qkv_conv2d_forward falls as about 4 exp(-alpha) |w| |x| and is float32
 * rounding for alpha >~ 20 (docs/IMAGES.md). Cost O(K^2 (HW)^2 C_in) through
 * the attention core (scores as a 3-dimensional dot product, one shared
 * key/value head). Shapes as qkv_conv2d_forward. Errors: as
 * qkv_conv2d_forward, QKV_ERR_BAD_PARAMETER (alpha not finite or <= 0),
 * QKV_ERR_OUT_OF_MEMORY. */
qkv_status qkv_conv2d_as_attention(int64_t c_in, int64_t height, int64_t width, const float *x,
                                   int64_t c_out, int64_t kernel, const float *weight,
                                   const float *bias, double alpha, float *y);

/* A SAGAN self-attention block (Zhang, Goodfellow, Metaxas & Odena, ICML
 * 2019) over a feature map x [H*W, C] (pixel-major):
 *     f = x W_fᵀ + b_f,  g = x W_gᵀ + b_g   [H*W, C_k]   (1x1 convolutions)
 *     h = x W_hᵀ + b_h                      [H*W, C]
 *     beta[j, i] = softmax_i(f_i . g_j)     position j attends over all i
 *     o = beta h;   y = gamma o + x          (the core: query g, key f, DOT)
 * Parameters, flat: W_f [C_k, C], b_f [C_k], W_g [C_k, C], b_g [C_k],
 * W_h [C, C], b_h [C], gamma [1] (initialised 0, as in the paper, so the
 * block starts as the identity; the projections are xavier-uniform from the
 * seed). The block keeps the activations of its last forward (O(HW C),
 * never HW x HW). */
typedef struct qkv_sagan qkv_sagan;

/* channels C >= 1; key_channels C_k >= 1 (the paper uses C / 8). Errors:
 * QKV_ERR_NULL_POINTER, QKV_ERR_BAD_SIZE, QKV_ERR_OUT_OF_MEMORY. */
qkv_status qkv_sagan_create(int64_t channels, int64_t key_channels, uint64_t seed, qkv_sagan **out);
void qkv_sagan_free(qkv_sagan *s);
float *qkv_sagan_params(qkv_sagan *s, int64_t *count);
float *qkv_sagan_grads(qkv_sagan *s, int64_t *count);
void qkv_sagan_zero_grad(qkv_sagan *s);

/* x, y [H*W, C]; attn [H*W, H*W] optional (beta, row j = position j). Errors:
 * QKV_ERR_NULL_POINTER, QKV_ERR_BAD_SIZE, QKV_ERR_SIZE_OVERFLOW,
 * QKV_ERR_OUT_OF_MEMORY. */
qkv_status qkv_sagan_forward(qkv_sagan *s, int64_t height, int64_t width, const float *x, float *y,
                             float *attn);

/* Backward of the last forward (same x): accumulates the parameter
 * gradients, writes dx [H*W, C] (may be NULL). Errors:
 * QKV_ERR_NULL_POINTER, QKV_ERR_UNSUPPORTED (no forward before),
 * QKV_ERR_OUT_OF_MEMORY. */
qkv_status qkv_sagan_backward(qkv_sagan *s, const float *x, const float *dy, float *dx);

/* ------------------------------------------------------------------------- */
/* The layers of the complexity comparison (Vaswani et al. 2017, Table 1):
 * plain forward/backward pairs over caller-owned buffers, one sequence of n
 * vectors of dimension d, accumulating in float. Backward functions
 * *accumulate* into the parameter gradients and *overwrite* dx. */

/* Elman RNN: h_t = tanh(W_x x_t + W_h h_{t-1} + b), h_{-1} = 0.
 * x [n, d_in], W_x [d, d_in], W_h [d, d], b [d] (or NULL), h [n, d] written.
 * n sequential steps: the dependency chain has length n. Errors:
 * QKV_ERR_NULL_POINTER, QKV_ERR_BAD_SIZE, QKV_ERR_SIZE_OVERFLOW. */
qkv_status qkv_rnn_forward(int64_t n, int64_t d_in, int64_t d, const float *w_x, const float *w_h,
                           const float *b, const float *x, float *h);

/* Backpropagation through time: dh [n, d] = dL/dh given (h from the
 * forward); dx [n, d_in] written (may be NULL); dW_x, dW_h, db accumulated
 * (db may be NULL). Errors as the forward, QKV_ERR_OUT_OF_MEMORY. */
qkv_status qkv_rnn_backward(int64_t n, int64_t d_in, int64_t d, const float *w_x, const float *w_h,
                            const float *x, const float *h, const float *dh, float *dx, float *dw_x,
                            float *dw_h, float *db);

/* LSTM (Hochreiter & Schmidhuber 1997, gates in torch's order i, f, g, o):
 *   [i f g o] = W_x x_t + W_h h_{t-1} + b;  c_t = s(f) c_{t-1} + s(i) tanh(g);
 *   h_t = s(o) tanh(c_t),  h_{-1} = c_{-1} = 0.
 * W_x [4d, d_in], W_h [4d, d], b [4d] (or NULL), h [n, d] written,
 * cache [n, 6d] written (gate activations and cell state, for the backward).
 * Errors as qkv_rnn_forward. */
qkv_status qkv_lstm_forward(int64_t n, int64_t d_in, int64_t d, const float *w_x, const float *w_h,
                            const float *b, const float *x, float *h, float *cache);
qkv_status qkv_lstm_backward(int64_t n, int64_t d_in, int64_t d, const float *w_x, const float *w_h,
                             const float *x, const float *h, const float *cache, const float *dh,
                             float *dx, float *dw_x, float *dw_h, float *db);

/* 1-D convolution over a sequence, "same" length: kernel k (odd), dilation
 * r >= 1, zero padding r (k - 1) / 2 on each side:
 *   y[t, o] = b[o] + sum_{c, j} w[o, c, j] x[t + r (j - (k-1)/2), c]
 * x [n, c_in], w [c_out, c_in, k] (torch's Conv1d layout), b [c_out] or NULL,
 * y [n, c_out]. Errors: QKV_ERR_NULL_POINTER, QKV_ERR_BAD_SIZE (k even, a
 * size <= 0), QKV_ERR_SIZE_OVERFLOW. */
qkv_status qkv_conv1d_forward(int64_t n, int64_t c_in, int64_t c_out, int64_t kernel,
                              int64_t dilation, const float *w, const float *b, const float *x,
                              float *y);
/* dy [n, c_out] given; dx [n, c_in] written (may be NULL); dw, db
 * accumulated (db may be NULL). Errors as the forward. */
qkv_status qkv_conv1d_backward(int64_t n, int64_t c_in, int64_t c_out, int64_t kernel,
                               int64_t dilation, const float *w, const float *x, const float *dy,
                               float *dx, float *dw, float *db);

#ifdef __cplusplus
}
#endif

#endif /* QKV_H */
