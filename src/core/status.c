/* Status texts, the version string, and the one writer of failure reasons. */
#include <stdarg.h>
#include <stdio.h>

#include "core/internal.h"

const char *qkv_status_string(qkv_status status) {
    switch (status) {
    case QKV_OK: return "success";
    case QKV_ERR_NULL_POINTER: return "a required pointer is NULL";
    case QKV_ERR_BAD_SIZE: return "a size is zero or negative";
    case QKV_ERR_SIZE_OVERFLOW: return "sizes are too large: their product overflows";
    case QKV_ERR_HEADS: return "the number of heads is not a multiple of the key/value heads";
    case QKV_ERR_WINDOW: return "window extents out of range for the mask";
    case QKV_ERR_KEY_LENGTHS: return "a key length is negative or larger than n_k";
    case QKV_ERR_SEQ_OFFSETS: return "packed sequence offsets are inconsistent";
    case QKV_ERR_BAD_ENUM: return "unknown enumeration value";
    case QKV_ERR_BAD_PARAMETER: return "a parameter is not finite or out of range";
    case QKV_ERR_OUT_OF_MEMORY: return "out of memory";
    case QKV_ERR_UNSUPPORTED: return "not supported by this build or implementation";
    case QKV_ERR_IO: return "input/output error";
    case QKV_ERR_FORMAT: return "malformed file";
    case QKV_ERR_DTYPE: return "unsupported element type";
    case QKV_ERR_SHAPE: return "array shapes do not fit together";
    case QKV_ERR_POSITION: return "a position is past the end of a learned table or cache";
    case QKV_ERR_NOT_FINITE: return "an input holds NaN or infinity (rejected: check_finite is on)";
    case QKV_ERR_MEMORY_LIMIT:
        return "the request would exceed the memory limit set by qkv_set_memory_limit "
               "(qkv_memory_refused() gives its size)";
    }
    return "unknown status";
}

const char *qkv_version(void) { return QKV_VERSION_STRING; }

void qkv_vset_why(char *why, size_t why_len, const char *fmt, va_list ap) {
    if (why && why_len) vsnprintf(why, why_len, fmt, ap);
}

void qkv_set_why(char *why, size_t why_len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    qkv_vset_why(why, why_len, fmt, ap);
    va_end(ap);
}

qkv_status qkv_fail(char *why, size_t why_len, qkv_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    qkv_vset_why(why, why_len, fmt, ap);
    va_end(ap);
    return status;
}
