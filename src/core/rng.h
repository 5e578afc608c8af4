/* The one pseudo-random generator of qkv: splitmix64 (Steele, Lea and Flood,
 * "Fast splittable pseudorandom number generators", 2014).
 *
 * Header-only and internal: the library, the CLI, the tests and the benchmarks
 * include it so that a seed gives the same numbers everywhere. The state is a
 * plain uint64_t; every sequence qkv draws (initial weights, dropout masks,
 * generated tasks, test tensors) is defined by these functions, so they must
 * not change. */
#ifndef QKV_CORE_RNG_H
#define QKV_CORE_RNG_H

#include <stdint.h>

/* The increment of the state: 2^64 / golden ratio, odd. */
#define SPLITMIX64_GAMMA 0x9E3779B97F4A7C15ull

/* The finaliser: a bijective mix of all 64 bits. On its own it is a
 * counter-based hash (hash the position, no state to carry). */
static inline uint64_t splitmix64_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The next 64 random bits of the stream *state (which advances). */
static inline uint64_t splitmix64_next(uint64_t *state) {
    return splitmix64_mix(*state += SPLITMIX64_GAMMA);
}

/* Uniform on [0, 1): the top 53 bits of the next draw. */
static inline double splitmix64_unit(uint64_t *state) {
    return (double)(splitmix64_next(state) >> 11) * 0x1.0p-53;
}

#endif
