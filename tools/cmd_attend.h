/* qkv attend, shared by its two files: cmd_attend.c (options, inputs, the
 * one-process run, outputs) and cmd_attend_dist.c (--distributed: the same
 * job over MPI ranks). */
#ifndef QKV_CMD_ATTEND_H
#define QKV_CMD_ATTEND_H

#include "cli_npy.h"
#include "cli_util.h"

#define CMD "attend"

enum {
    OPT_HELP, OPT_Q, OPT_K, OPT_V, OPT_OUT, OPT_MASK, OPT_SCORE, OPT_SCALE, OPT_TEMPERATURE,
    OPT_NORM, OPT_RELU_COUNT, OPT_SOFTCAP, OPT_KEY_LENGTHS, OPT_SEQ_OFFSETS, OPT_BIAS,
    OPT_ATTN, OPT_LSE, OPT_DTYPE, OPT_IMPL, OPT_THREADS, OPT_PRINT, OPT_GRAD_OUT, OPT_DQ,
    OPT_DK, OPT_DV, OPT_DBIAS, OPT_OUT_FLOAT32,
    OPT_DISTRIBUTED, /* mpirun -np P qkv attend --distributed ... (cmd_attend_dist.c) */
    OPT_COUNT
};

/* The options given: what parse_args fills. */
typedef struct config {
    const char *val[OPT_COUNT]; /* the value of each option given (paths, specs) */
    int given[OPT_COUNT];
    qkv_attn_desc desc;         /* the options' part of the descriptor */
    int backward;
    int print;
} config;

/* Inputs and outputs */

enum { IN_Q, IN_K, IN_V, IN_DOUT, IN_BIAS, IN_KEY_LENGTHS, IN_SEQ_OFFSETS, IN_COUNT };

typedef cli_file input;

enum { OUT_O, OUT_ATTN, OUT_LSE, OUT_DQ, OUT_DK, OUT_DV, OUT_DBIAS, OUT_COUNT };
static const int output_opt[OUT_COUNT] = {OPT_OUT, OPT_ATTN, OPT_LSE, OPT_DQ,
                                          OPT_DK, OPT_DV, OPT_DBIAS};

typedef cli_file output; /* path NULL: computed but not written; data NULL: not computed */

typedef struct job {
    input in[IN_COUNT];
    output out[OUT_COUNT];
    int header_only; /* --distributed: q, k, v, dL/dO and the bias are read as headers only */
} job;

/* The attention dimensions of a q, k or v array of rank 2, 3 or 4. */
typedef struct dims {
    int64_t b, n, h, d;
} dims;

/* The name of option `id` ("--q"). */
const char *attend_opt_name(int id);

/* Load every input, check that they fit together, convert them to the compute
 * dtype, and fill the sizes and tensors of the descriptor. 0 or -1. */
int attend_load_inputs(const config *c, job *j, qkv_attn_desc *d, dims *dq_out);

/* A library status, blamed on the input it concerns. */
void attend_status_error(const job *j, const char *what, qkv_status s);

/* Allocate output `which` (path NULL: computed for --print only). 0 or -1. */
int attend_alloc_output(job *j, int which, const char *path, qkv_dtype dt, int ndim,
                        const int64_t *shape, const char *what);

void attend_job_free(job *j);

/* --distributed (cmd_attend_dist.c): the run under mpirun; the exit status. */
int attend_distributed(const config *c);

#endif
