/* A safetensors file opened read-only through mmap (internal; used by the
 * encoder, src/model/encoder_load.c). Not installed. */
#ifndef QKV_IO_SAFETENSORS_MAP_H
#define QKV_IO_SAFETENSORS_MAP_H

#include <stddef.h>

#include "qkv.h"

/* Open path as qkv_safetensors_load does, with the same header checks and
 * errors, but map the file (PROT_READ, MAP_PRIVATE) instead of reading it:
 * on a little-endian host every F32, F64, I32 and I64 tensor whose data is
 * aligned for its type has its qkv_array.data pointing into the mapping
 * (read-only: writing through it faults), so loading copies no weights and
 * the pages are read on first use. F16 and BF16 tensors are widened to F32
 * once into arrays the set owns (as qkv_safetensors_load does), as are
 * misaligned tensors (copied). The set is freed (and the mapping released)
 * with qkv_safetensors_free; qkv_safetensors_put may replace a mapped
 * tensor with an owned copy. The file must not be truncated or rewritten in
 * place while mapped (qkv's own saves replace files atomically, which is
 * safe). A file too short for a header, or larger than the address space,
 * is read the ordinary way. Extra error: QKV_ERR_IO when mmap fails. */
qkv_status qkv_safetensors_map(const char *path, qkv_safetensors **out, char *why, size_t why_len);

/* The pages wholly inside [data, data + bytes) of st's mapping will not be
 * read soon: they leave the resident memory (madvise MADV_DONTNEED; read
 * from the file again if touched). Nothing when data is not inside the
 * mapping (an owned array) or st is not mapped. */
void qkv_safetensors_release(const qkv_safetensors *st, const void *data, size_t bytes);

#endif
