/* The libFuzzer entry point every target in tests/fuzz/ defines, and a tiny
 * reader that turns the fuzz input into bounded choices (running out of
 * input reads zeros, so every input decodes to something). */
#ifndef QKV_FUZZ_H
#define QKV_FUZZ_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct fuzz_reader {
    const uint8_t *p;
    size_t n;
} fuzz_reader;

static inline uint8_t fuzz_u8(fuzz_reader *r) {
    if (r->n == 0) return 0;
    r->n--;
    return *r->p++;
}

static inline uint16_t fuzz_u16(fuzz_reader *r) {
    uint16_t lo = fuzz_u8(r);
    return (uint16_t)(lo | (uint16_t)(fuzz_u8(r) << 8));
}

static inline uint64_t fuzz_u64(fuzz_reader *r) {
    uint64_t x = 0;
    for (int i = 0; i < 8; i++) x |= (uint64_t)fuzz_u8(r) << (8 * i);
    return x;
}

/* An integer in [0, n) (n >= 1). */
static inline int64_t fuzz_below(fuzz_reader *r, int64_t n) {
    return n <= 256 ? (int64_t)(fuzz_u8(r) % n) : (int64_t)(fuzz_u16(r) % n);
}

#endif
