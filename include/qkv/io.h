/*
 * qkv/io.h - arrays and files: NumPy .npy arrays (whole, header only or some
 * rows) and safetensors sets of named tensors. Saving is atomic: a
 * temporary file in the same folder, renamed over the path when complete.
 */
#ifndef QKV_IO_H
#define QKV_IO_H

#include "qkv/core.h"

#ifdef __cplusplus
extern "C" {
#endif

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
QKV_API int64_t qkv_array_count(const qkv_array *a);

/* Parse an in-memory .npy file. On success *out owns a new buffer. On failure
 * *out is zeroed and, when why != NULL, a one-line reason (no file name) is
 * written into why[why_len]. Errors: QKV_ERR_NULL_POINTER, QKV_ERR_FORMAT
 * (bad magic, version, header, truncated, Fortran order, big-endian),
 * QKV_ERR_DTYPE (any other dtype), QKV_ERR_SIZE_OVERFLOW,
 * QKV_ERR_OUT_OF_MEMORY. More than QKV_NPY_MAX_DIMS dims is QKV_ERR_FORMAT.
 * Bytes after the data are ignored, as numpy.load does. */
QKV_API qkv_status qkv_npy_parse(const void *bytes, size_t len, qkv_array *out,
                                 char *why, size_t why_len);

/* Load a .npy file: as qkv_npy_parse, plus QKV_ERR_IO when it cannot be read. */
QKV_API qkv_status qkv_npy_load(const char *path, qkv_array *out, char *why, size_t why_len);

/* Read only the header of a .npy file: *out gets its dtype, ndim and shape,
 * with data NULL (nothing to free). Also checks that the file holds all the
 * data the header declares (a truncated file is QKV_ERR_FORMAT here, not at
 * a later read). path must be a regular file. Errors: as qkv_npy_load. */
QKV_API qkv_status qkv_npy_load_header(const char *path, qkv_array *out, char *why, size_t why_len);

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
QKV_API qkv_status qkv_npy_load_rows(const char *path, int axis, int nranges, const int64_t *starts,
                                     const int64_t *counts, qkv_array *out, int64_t *axis_len, char *why,
                                     size_t why_len);

/* Save an array as a version 1.0 .npy file (2.0 when the header needs it).
 * Writes to a temporary file in the same folder and renames it over path, so
 * a failure never leaves a partial file. Errors: QKV_ERR_NULL_POINTER,
 * QKV_ERR_BAD_SIZE (ndim out of range, negative dim), QKV_ERR_DTYPE,
 * QKV_ERR_SIZE_OVERFLOW, QKV_ERR_OUT_OF_MEMORY, QKV_ERR_IO. */
QKV_API qkv_status qkv_npy_save(const char *path, const qkv_array *a);

/* Allocate a zero-filled array of the given dtype and shape (ndim 0..8,
 * dims >= 0). Errors: QKV_ERR_NULL_POINTER, QKV_ERR_BAD_SIZE, QKV_ERR_DTYPE,
 * QKV_ERR_SIZE_OVERFLOW, QKV_ERR_OUT_OF_MEMORY. */
QKV_API qkv_status qkv_array_alloc(qkv_array *out, qkv_dtype dtype, int ndim, const int64_t *shape);

/* A new array with the values of `in` converted to dtype `to` (any of the six
 * dtypes; float to integer truncates toward zero, NaN and out-of-range values
 * give QKV_ERR_BAD_PARAMETER, as does an int64 to int32 overflow; float64 to
 * float32 rounds, overflows to inf and keeps NaN; to bf16 / fp16 from any
 * type rounds once to nearest-even (never through a rounded float32),
 * overflows to inf and keeps NaN; from them is exact). Errors as
 * qkv_array_alloc, plus QKV_ERR_BAD_PARAMETER. */
QKV_API qkv_status qkv_array_convert(const qkv_array *in, qkv_dtype to, qkv_array *out);

/* Free the data of an array that a load or parse returned, and zero it.
 * NULL and already-freed (zeroed) arrays are fine. */
QKV_API void qkv_array_free(qkv_array *a);


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
QKV_API qkv_status qkv_safetensors_create(qkv_safetensors **out);

/* Parse an in-memory file / load one. On failure *out is NULL and, when why
 * is given, a one-line reason is written there. Errors: QKV_ERR_NULL_POINTER,
 * QKV_ERR_IO (load only), QKV_ERR_FORMAT (bad header length, JSON, offsets
 * out of range or overlapping, shape/size disagreement, duplicate names),
 * QKV_ERR_DTYPE (unknown dtype), QKV_ERR_SIZE_OVERFLOW, QKV_ERR_OUT_OF_MEMORY.
 * Data bytes no tensor covers (holes) are accepted; over 8 dims is FORMAT. */
QKV_API qkv_status qkv_safetensors_parse(const void *bytes, size_t len, qkv_safetensors **out,
                                         char *why, size_t why_len);
QKV_API qkv_status qkv_safetensors_load(const char *path, qkv_safetensors **out, char *why, size_t why_len);

/* Write all tensors (in insertion order) and metadata; atomic like
 * qkv_npy_save. Errors: QKV_ERR_NULL_POINTER, QKV_ERR_IO, QKV_ERR_OUT_OF_MEMORY. */
QKV_API qkv_status qkv_safetensors_save(const qkv_safetensors *st, const char *path);

/* Number of tensors, and the name of the i-th (NULL when out of range). */
QKV_API int64_t qkv_safetensors_count(const qkv_safetensors *st);
QKV_API const char *qkv_safetensors_name(const qkv_safetensors *st, int64_t i);

/* The tensor called name, or NULL. The array stays owned by the set. */
QKV_API const qkv_array *qkv_safetensors_get(const qkv_safetensors *st, const char *name);

/* Add a copy of an array under a name (replacing a tensor of that name).
 * Names are 1..255 bytes of printable ASCII except '"' and '\\'. Errors:
 * QKV_ERR_NULL_POINTER, QKV_ERR_BAD_PARAMETER (bad name), QKV_ERR_DTYPE,
 * QKV_ERR_SIZE_OVERFLOW, QKV_ERR_OUT_OF_MEMORY. */
QKV_API qkv_status qkv_safetensors_put(qkv_safetensors *st, const char *name, const qkv_array *a);

/* String metadata ("__metadata__"): set (copying; replacing) and get (NULL
 * when absent; owned by the set). Keys and values follow the name rule above
 * but may be up to 65535 bytes. */
QKV_API qkv_status qkv_safetensors_set_meta(qkv_safetensors *st, const char *key, const char *value);
QKV_API const char *qkv_safetensors_get_meta(const qkv_safetensors *st, const char *key);

/* Free a set and everything in it; NULL is fine. */
QKV_API void qkv_safetensors_free(qkv_safetensors *st);

#ifdef __cplusplus
}
#endif

#endif /* QKV_IO_H */
