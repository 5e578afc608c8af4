/*
 * qkv.h - the public API of qkv, a C11 library for self-attention.
 *
 * This header includes every part of the API, one header per layer:
 *   qkv/core.h   status, memory, threads, version, the attention descriptor
 *                and its forward/backward/rows, qkv_sgemm (libc, libm and
 *                pthreads only)
 *   qkv/nn.h     positional encodings, multi-head attention, KV caches,
 *                2-D self-attention
 *   qkv/model.h  transformer models, optimiser, loss scaling, checkpoints
 *   qkv/io.h     .npy arrays and safetensors sets
 *   qkv/text.h   the WordPiece tokenizer of BERT-family models
 *   qkv/encoder.h pretrained BERT-family encoders (Hugging Face files)
 *   qkv/image.h  images, heatmaps and plots (PNG only in builds with
 *                QKV_WITH_PNG: see that header)
 *   qkv/dist.h   MPI ring attention and data-parallel training (declared
 *                when QKV_HAVE_MPI is defined)
 *   qkv/config.h how this qkv was built (QKV_WITH_PNG)
 *
 * Every function returns a qkv_status (or is documented as unable
 * to fail); the library never aborts, exits or prints. Buffers are owned by the
 * caller unless a function says it allocates (then a matching *_free exists and
 * accepts NULL). What the library shares between threads, and when calls may
 * run at once, is at the top of qkv/core.h.
 */
#ifndef QKV_H
#define QKV_H

#include "qkv/config.h"
#include "qkv/core.h"
#include "qkv/nn.h"
#include "qkv/io.h"
#include "qkv/text.h"
#include "qkv/encoder.h"
#include "qkv/model.h"
#include "qkv/image.h"
#include "qkv/dist.h"

#endif /* QKV_H */
