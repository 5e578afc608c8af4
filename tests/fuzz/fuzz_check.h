/* A finding: print what broke and abort, which both libFuzzer and the
 * replay driver report as a failure (with the input that caused it). */
#ifndef QKV_FUZZ_CHECK_H
#define QKV_FUZZ_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#define FUZZ_CHECK(cond, ...)                                                   \
    do {                                                                        \
        if (!(cond)) {                                                          \
            fprintf(stderr, "FUZZ FINDING %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                       \
            fprintf(stderr, "\n");                                              \
            abort();                                                            \
        }                                                                       \
    } while (0)

#endif
