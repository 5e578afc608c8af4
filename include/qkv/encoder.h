/*
 * qkv/encoder.h - pretrained BERT-family encoders (BertModel) read from a
 * Hugging Face / sentence-transformers model directory, run through qkv's
 * own attention: token states and pooled sentence vectors, and one layer's
 * attention maps. docs/ENCODER.md describes the design.
 *
 * A model directory holds
 *   config.json            model_type "bert", the sizes, hidden_act,
 *                          layer_norm_eps, position_embedding_type "absolute"
 *   model.safetensors      the weights by their Hugging Face names (an
 *                          optional "bert." prefix; pooler.* and
 *                          embeddings.position_ids are ignored), float32
 *                          (F16 / BF16 are widened to float32 once, into
 *                          buffers the encoder owns)
 *   vocab.txt, tokenizer_config.json   the tokenizer (qkv/text.h)
 * and optionally the sentence-transformers files
 *   modules.json           a Normalize module turns on L2 normalisation
 *   1_Pooling/config.json  pooling_mode_mean_tokens / _cls_token / _max_tokens
 *   sentence_bert_config.json  max_seq_length (truncation)
 * Without modules.json: mean pooling, no normalisation (what
 * sentence-transformers builds around a plain BertModel); without the
 * pooling file: mean.
 *
 * The weights are memory-mapped read-only, not copied: loading costs the
 * parse of the small JSON files and the safetensors header, and the pages of
 * the weights become resident as the first forward reads them.
 *
 * Shapes are row-major float32. A batch of texts is run packed end to end
 * (no padding is computed): sentence s occupies rows offsets[s] ..
 * offsets[s + 1] - 1 of the token states.
 *
 * Threads: an encoder holds a workspace that it grows and reuses, so one
 * encoder serves one thread at a time (the functions taking a const
 * qkv_encoder * - get_info, tokenizer - may be called from any thread).
 * Results do not depend on the thread count (bitwise).
 */
#ifndef QKV_ENCODER_H
#define QKV_ENCODER_H

#include <stddef.h>
#include <stdint.h>

#include "qkv/core.h" /* qkv_status, QKV_API */
#include "qkv/text.h" /* qkv_tokenizer */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct qkv_encoder qkv_encoder; /* opaque; see qkv_encoder_load */

/* How token states become one vector per sentence. */
typedef enum qkv_pooling {
    QKV_POOLING_FROM_MODEL = -1, /* an override meaning: what the model directory says */
    QKV_POOLING_MEAN = 0,        /* the mean over all tokens, [CLS] and [SEP] included */
    QKV_POOLING_CLS = 1,         /* the state of the first token ([CLS]) */
    QKV_POOLING_MAX = 2          /* the element-wise maximum over the tokens */
} qkv_pooling;

/* The arithmetic of the six projections of every layer (Q, K, V, the
 * attention's output, the MLP's two). The embeddings, the attention core,
 * LayerNorm, the activation and pooling are float32 in every mode. */
typedef enum qkv_encoder_precision {
    QKV_ENCODER_FP32 = 0, /* the weights as mapped, float32 products (the default) */
    QKV_ENCODER_BF16 = 1, /* weights rounded to bf16 at load (a copy of half their size;
                             the mapped float32 ones are no longer read), activations
                             rounded to bf16 as the products read them, products
                             summed in float32 (AMX tiles or AVX512-BF16 where
                             present, portable code elsewhere, within float32's sum
                             bound of each other; docs/HALF.md) */
    QKV_ENCODER_INT8 = 2  /* weights quantised to int8 per output channel at load (a
                             copy of about a quarter of their size; the mapped float32
                             ones are no longer read), activations to int8 per row at
                             run time, products summed exactly in int32 (AMX-INT8 or
                             AVX512-VNNI where present, portable code elsewhere, the
                             same bits);
                             docs/ENCODER.md gives the accuracy measured */
} qkv_encoder_precision;

typedef struct qkv_encoder_options {
    int threads;        /* worker threads of every call; 0: QKV_NUM_THREADS or the cores */
    int64_t max_length; /* truncation in tokens, [CLS] and [SEP] included; 0: from the
                           model (see qkv_encoder_info.max_length); else 2 ..
                           max_position_embeddings */
    int precision;      /* a qkv_encoder_precision (0: FP32) */
} qkv_encoder_options;

/* What a loaded encoder is. */
typedef struct qkv_encoder_info {
    int64_t hidden;          /* hidden_size */
    int64_t layers;          /* num_hidden_layers */
    int64_t heads;           /* num_attention_heads (head dim = hidden / heads) */
    int64_t intermediate;    /* intermediate_size */
    int64_t vocab_size;      /* vocab_size of config.json */
    int64_t max_positions;   /* max_position_embeddings */
    int64_t type_vocab_size; /* token types */
    int64_t max_length;      /* texts are truncated to this many tokens: the option, or
                                min(max_seq_length of sentence_bert_config.json,
                                max_position_embeddings) */
    qkv_pooling pooling;     /* the model's pooling */
    int normalize;           /* 1: the model L2-normalises its sentence vectors */
    double layer_norm_eps;
    int hidden_act;          /* 0 gelu (erf form), 1 gelu_new (tanh form), 2 relu */
    int precision;           /* the qkv_encoder_precision of the options */
} qkv_encoder_info;

/* Load the model directory dir (options may be NULL: defaults). On success
 * *out owns the encoder (free with qkv_encoder_free).
 * Errors (*out = NULL; why, when why && why_len, gets one sentence naming
 * the file and the field, tensor or value at fault):
 *   QKV_ERR_NULL_POINTER  dir or out NULL
 *   QKV_ERR_IO            a file is missing or unreadable (the directory,
 *                         config.json, model.safetensors, vocab.txt)
 *   QKV_ERR_FORMAT        malformed JSON, a required config field missing
 *                         or of the wrong type, a missing tensor, and the
 *                         safetensors and tokenizer format errors
 *   QKV_ERR_UNSUPPORTED   model_type not "bert", hidden_act not gelu /
 *                         gelu_new / relu, position_embedding_type not
 *                         "absolute", a pooling mode other than one of mean,
 *                         cls, max (the message names the field and value)
 *   QKV_ERR_SHAPE         a tensor of the wrong shape, sizes that disagree
 *                         (hidden not a multiple of heads, vocab.txt longer
 *                         than vocab_size)
 *   QKV_ERR_DTYPE         a tensor that is not floating point F32/F16/BF16
 *   QKV_ERR_BAD_SIZE      an option out of range
 *   QKV_ERR_BAD_ENUM      precision not a qkv_encoder_precision
 *   QKV_ERR_NOT_FINITE    INT8: a projection weight is NaN or infinite
 *   QKV_ERR_OUT_OF_MEMORY */
QKV_API qkv_status qkv_encoder_load(const char *dir, const qkv_encoder_options *options, qkv_encoder **out,
                                    char *why, size_t why_len);

/* Free an encoder (its tokenizer, workspace and mapping); NULL is a no-op. */
QKV_API void qkv_encoder_free(qkv_encoder *enc);

/* The encoder's sizes and settings (info may not be NULL; enc NULL gives
 * all zeros). */
QKV_API void qkv_encoder_get_info(const qkv_encoder *enc, qkv_encoder_info *info);

/* The tokenizer the encoder loaded, owned by it (valid until it is freed);
 * texts are encoded with max_len = qkv_encoder_info.max_length. NULL when
 * enc is NULL. */
QKV_API const qkv_tokenizer *qkv_encoder_tokenizer(const qkv_encoder *enc);

/* Sentence vectors. texts[i] is lens[i] bytes of UTF-8 (lens NULL: each text
 * is NUL-terminated); count >= 1. pooling: QKV_POOLING_FROM_MODEL or a
 * qkv_pooling; normalize: -1 from the model, 0 off, 1 on (x / max(|x|,
 * 1e-12), as torch's normalize). out [count, hidden], written.
 * Errors (why as in qkv_encoder_load, naming the text's index):
 *   QKV_ERR_NULL_POINTER  enc, texts, a text (with a length > 0) or out NULL
 *   QKV_ERR_BAD_SIZE      count < 1
 *   QKV_ERR_BAD_ENUM      pooling or normalize out of range
 *   QKV_ERR_FORMAT        invalid UTF-8
 *   QKV_ERR_OUT_OF_MEMORY, QKV_ERR_SIZE_OVERFLOW
 * On error out is unspecified. */
QKV_API qkv_status qkv_encoder_embed(qkv_encoder *enc, const char *const *texts, const size_t *lens,
                                     int64_t count, qkv_pooling pooling, int normalize, float *out,
                                     char *why, size_t why_len);

/* The last layer's token states of every text, packed end to end:
 * out [tokens, hidden] with tokens = offsets[count], and offsets [count + 1]
 * (offsets[0] = 0; may be NULL when not wanted). *tokens is set to the
 * total (whenever the texts are valid); call with capacity 0 (out may then
 * be NULL) to learn it; capacity is in rows. Errors as qkv_encoder_embed,
 * plus QKV_ERR_BAD_SIZE when capacity < *tokens (nothing computed) and
 * QKV_ERR_NULL_POINTER for tokens NULL or out NULL with capacity > 0. */
QKV_API qkv_status qkv_encoder_token_states(qkv_encoder *enc, const char *const *texts, const size_t *lens,
                                            int64_t count, float *out, int64_t capacity, int64_t *offsets,
                                            int64_t *tokens, char *why, size_t why_len);

/* The attention maps of layer `layer` (0-based) for one text of len bytes:
 * out [heads, n, n] with n its token count (row i: how token i weighs the
 * tokens j, each row summing to 1). The forward runs as usual (no n x n
 * buffer); the rows are recomputed from that layer's queries and keys
 * (qkv_attention_rows). *n is set to the count whenever the text is valid;
 * capacity is in floats: call with capacity 0 (out may be NULL) to learn n.
 * Errors as qkv_encoder_embed, plus QKV_ERR_BAD_SIZE for a layer out of
 * range or capacity < heads * n * n. */
QKV_API qkv_status qkv_encoder_attention(qkv_encoder *enc, const char *text, size_t len, int64_t layer,
                                         float *out, int64_t capacity, int64_t *n, char *why, size_t why_len);

#ifdef __cplusplus
}
#endif

#endif /* QKV_ENCODER_H */
