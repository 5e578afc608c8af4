/* The double-precision core of FLOATER, exposed to the tests so that its
 * gradients can be checked by finite differences in double. */
#ifndef QKV_LAYERS_FLOATER_INTERNAL_H
#define QKV_LAYERS_FLOATER_INTERNAL_H

#include "qkv.h"

typedef struct floater_core {
    int64_t dim, hidden, substeps;
    double delta;
    int64_t n;            /* positions of the last forward (0: none) */
    double *traj;         /* y at every solver step, [(n-1)*substeps + 1, dim] */
    int64_t traj_cap;
    double *work;         /* 9*dim + 3*hidden doubles */
} floater_core;

/* Offsets of the parameter blocks in θ: p0, W1, w_t, b1, W2, b2. */
#define FL_P0(c) ((int64_t)0)
#define FL_W1(c) ((c)->dim)
#define FL_WT(c) (FL_W1(c) + (c)->hidden * (c)->dim)
#define FL_B1(c) (FL_WT(c) + (c)->hidden)
#define FL_W2(c) (FL_B1(c) + (c)->hidden)
#define FL_B2(c) (FL_W2(c) + (c)->dim * (c)->hidden)

int64_t floater_n_params(int64_t dim, int64_t hidden);

/* pos [n, dim] from θ; keeps the trajectory in c. */
qkv_status floater_core_forward(floater_core *c, const double *th, int64_t n, double *pos);

/* Adds dL/dθ into gth for dpos [n, dim] of the last forward. */
qkv_status floater_core_backward(floater_core *c, const double *th, const double *dpos, double *gth);

#endif
