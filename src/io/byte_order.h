/* The byte order of file data: .npy and safetensors store little-endian
 * elements, so a big-endian host swaps them on the way in and out. Internal. */
#ifndef QKV_IO_BYTE_ORDER_H
#define QKV_IO_BYTE_ORDER_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline int qkv_host_is_le(void) {
    const uint16_t one = 1;
    unsigned char first;
    memcpy(&first, &one, 1);
    return first == 1;
}

/* Reverse the bytes of each of count elements of elem bytes at data. */
static inline void qkv_swap_bytes(void *data, size_t count, size_t elem) {
    unsigned char *p = data;
    for (size_t i = 0; i < count; i++, p += elem)
        for (size_t a = 0, b = elem - 1; a < b; a++, b--) {
            unsigned char t = p[a];
            p[a] = p[b];
            p[b] = t;
        }
}

#endif
