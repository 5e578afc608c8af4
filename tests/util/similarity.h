/* How well one set of sentence vectors keeps the geometry of another: the
 * agreement measures of the encoders' accuracy rules (docs/ENCODER.md),
 * shared by test_minilm and bench/bench_agree. Plain C, no qkv calls. */
#ifndef QKV_TEST_SIMILARITY_H
#define QKV_TEST_SIMILARITY_H

#include <stdint.h>

typedef struct sim_agreement {
    double worst_cosine; /* min over sentences i of cos(q_i, r_i) */
    int worst_at;        /* that sentence, 0-based */
    double mean_cosine;
    double rho;          /* Spearman's rho of the pairs' cosines under q against under r */
    int64_t pairs;       /* how many pairs rho is over */
    int kept;            /* sentences whose nearest neighbour under q is the one under r */
    int clear;           /* sentences whose neighbour under r leads the second by more than margin */
    int clear_lost;      /* of those, how many are not kept */
} sim_agreement;

/* Cosine of x and y [dim], summed in double. */
double sim_cosine(const float *x, const float *y, int64_t dim);

/* Agreement of q (under test) with r (the reference), both [n, dim] row
 * major, n >= 2: the cosines, the nearest neighbours by cosine over all
 * other sentences, rho over all n (n - 1) / 2 pairs (sim_rho). Returns 0,
 * or -1 when out of memory or the sizes are wrong (*out zeroed). */
int sim_agree(const float *q, const float *r, int64_t n, int64_t dim, double margin, sim_agreement *out);

/* Spearman's rho (ties of rank averaged) of the pairwise cosines under q
 * against under r: pairs == 0 over all pairs i < j; pairs > 0 over that
 * many pairs i != j drawn with `seed`. Returns 0, or -1 as sim_agree. */
int sim_rho(const float *q, const float *r, int64_t n, int64_t dim, int64_t pairs, uint64_t seed, double *rho);

#endif
