/* qkv attend --distributed: the job of cmd_attend.c over MPI ranks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_npy.h"
#include "cli_util.h"
#include "cmd_attend.h"
#include "qkv.h"

/* --distributed: mpirun -np P qkv attend --distributed ... reads and writes
 * the same files as one process. Rank 0 reads the inputs' headers (and the
 * small --key-lengths and --seq-offsets whole) and checks that they fit;
 * then every rank reads only its own positions (zig-zag pieces for a causal
 * mask, contiguous ones otherwise: qkv_dist_partition) of q, k, v, dL/dO and
 * its queries' rows of the bias straight from the files
 * (qkv_npy_load_rows), the ranks agree that every read succeeded
 * (MPI_Allreduce) before the ring runs (qkv_ring_attention_forward/
 * backward), and rank 0 gathers the output slices and writes the outputs
 * atomically. So no rank ever holds the whole inputs: O(n/P) per rank for
 * q, k, v; only rank 0 holds the whole outputs, for the write. Every rank
 * exits with the worst rank's status. */
#ifdef QKV_HAVE_MPI

/* What rank 0 tells the others before the data. */
typedef struct dist_head {
    int ok;                 /* 0: rank 0 failed (message printed); stop */
    int backward, want_lse, has_kl, want_dbias;
    int q_ndim;             /* 2, 3 or 4: the sequence axis is 1 for 4, else 0 */
    qkv_attn_desc desc;     /* pointers cleared (bias_kind and num_seqs kept) */
} dist_head;

static int dist_fail(const char *fmt, const char *detail) {
    cli_error(CMD, "--distributed", NULL, fmt, detail);
    return -1;
}

/* This rank's rows of one input, read from its file (nothing else of it):
 * the positions st/ln (qkv_dist_partition) of axis `axis`, whose length
 * must be n, expected to hold `count` elements in all; converted to float32
 * into dst. 0, or -1 with a message naming the rank. */
static int dist_read(int rank, int opt, const char *path, int axis, int64_t n, const int64_t st[2],
                     const int64_t ln[2], int64_t count, float *dst) {
    char why[256] = "";
    qkv_array a, f;
    int64_t len = 0;
    qkv_status s = qkv_npy_load_rows(path, axis, 2, st, ln, &a, &len, why, sizeof why);
    if (s != QKV_OK) {
        cli_error(CMD, attend_opt_name(opt), path, "rank %d: %s", rank, why[0] ? why : qkv_status_string(s));
        return -1;
    }
    if (len != n || qkv_array_count(&a) != count ||
        (a.dtype != QKV_F32 && a.dtype != QKV_F64 && a.dtype != QKV_F16)) {
        cli_error(CMD, attend_opt_name(opt), path, "rank %d: the file changed while it was read", rank);
        qkv_array_free(&a);
        return -1;
    }
    if (a.dtype != QKV_F32) {
        s = qkv_array_convert(&a, QKV_F32, &f);
        qkv_array_free(&a);
        if (s != QKV_OK) {
            cli_error(CMD, attend_opt_name(opt), path, "rank %d: cannot convert to float32: %s", rank,
                      qkv_status_string(s));
            return -1;
        }
        a = f;
    }
    if (count > 0) memcpy(dst, a.data, (size_t)count * sizeof(float));
    qkv_array_free(&a);
    return 0;
}

/* Rows of one rank's pieces of a [B, n, x] float tensor <-> [B, nloc, x]. */
static void dist_rows(float *local, float *full, int64_t B, int64_t n, int64_t x, const int64_t st[2],
                      const int64_t ln[2], int64_t nloc, int to_local) {
    for (int64_t b = 0; b < B; b++) {
        int64_t at = 0;
        for (int t = 0; t < 2; t++) {
            float *l = local + (b * nloc + at) * x, *f = full + (b * n + st[t]) * x;
            size_t bytes = (size_t)(ln[t] * x) * sizeof(float);
            if (to_local) memcpy(l, f, bytes);
            else memcpy(f, l, bytes);
            at += ln[t];
        }
    }
}

/* One tensor's slices: scattered from rank 0 (to_local) or gathered to it.
 * full: rank 0's whole tensor; local: this rank's [B, nloc, x]; lse_rows:
 * a [B*H, n] lse instead (rows of x = 1 with B*H "batches"). */
static int dist_move(MPI_Comm comm, int rank, int size, float *full, float *local, int64_t B, int64_t n,
                     int64_t x, qkv_dist_layout layout, int to_local, float *tmp) {
    for (int r = 0; r < size; r++) {
        int64_t st[2], ln[2], nl;
        qkv_dist_partition(n, size, r, layout, st, ln, &nl);
        int64_t count = B * nl * x;
        if (count > INT32_MAX) return -1;
        if (rank == 0) {
            float *buf = r == 0 ? local : tmp;
            if (to_local) {
                dist_rows(buf, full, B, n, x, st, ln, nl, 1);
                if (r != 0 && MPI_Send(buf, (int)count, MPI_FLOAT, r, 11, comm) != MPI_SUCCESS) return -1;
            } else {
                if (r != 0 && MPI_Recv(buf, (int)count, MPI_FLOAT, r, 12, comm, MPI_STATUS_IGNORE) != MPI_SUCCESS)
                    return -1;
                dist_rows(buf, full, B, n, x, st, ln, nl, 0);
            }
        } else if (r == rank) {
            int rc = to_local ? MPI_Recv(local, (int)count, MPI_FLOAT, 0, 11, comm, MPI_STATUS_IGNORE)
                              : MPI_Send(local, (int)count, MPI_FLOAT, 0, 12, comm);
            if (rc != MPI_SUCCESS) return -1;
        }
    }
    return 0;
}

/* One distributed run: what every rank knows and holds. */
typedef struct dist_run {
    MPI_Comm comm;
    int rank, size;
    dist_head hd;
    qkv_attn_desc d;          /* the request as every rank runs it */
    int64_t kl[4096];         /* --key-lengths, when given */
    int64_t *so;              /* --seq-offsets [num_seqs + 1], when given */
    qkv_dist_layout layout;
    int64_t qs[2], ql[2], nql; /* this rank's query positions (qkv_dist_partition) */
    int64_t ks[2], kln[2], nkl; /* and key positions */
    int64_t Hb;               /* heads of the bias: H, 1 or 0 (none) */
    size_t rq, rk, rb;        /* this rank's rows of q, of k and v, of the bias */
    float *lq, *lk, *lv, *lo, *ll, *lg, *ldq, *ldk, *ldv, *lb, *ldb;
    float *tmp;               /* rank 0: the gather's buffer */
} dist_run;

static void dist_run_free(dist_run *t) {
    float *bufs[] = {t->lq, t->lk, t->lv, t->lo, t->ll, t->lg, t->ldq, t->ldk, t->ldv, t->lb, t->ldb, t->tmp};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(t->so);
}

/* Rank 0: the inputs' headers read and checked, into t->hd (hd.ok = 0 after
 * printing why) and the sizes into *dq. */
static void dist_check_request(const config *c, job *j, dist_run *t, dims *dq) {
    dist_head *hd = &t->hd;
    hd->desc = c->desc;
    for (int i = 0; i < OUT_COUNT; i++) j->out[i].opt = attend_opt_name(output_opt[i]);
    j->header_only = 1; /* each rank reads its own rows below */
    hd->ok = attend_load_inputs(c, j, &hd->desc, dq) == 0;
    hd->q_ndim = j->in[IN_Q].a.ndim;
    if (hd->ok && (c->given[OPT_ATTN] || c->print))
        hd->ok = dist_fail("%s: the n x n attention matrix is not computed by the ring", "--attn/--print") == 0;
    if (hd->ok && hd->desc.dtype != QKV_F32)
        hd->ok = dist_fail("%s: the ring attention computes in float32 only", "--dtype") == 0;
    if (hd->ok && hd->desc.batch > (int64_t)(sizeof t->kl / sizeof t->kl[0]))
        hd->ok = dist_fail("%s: at most 4096 batches", "--q") == 0;
    if (hd->ok) {
        /* The bias is not read yet (each rank reads its rows): check the
         * request with a stand-in pointer. */
        static const float no_bias_yet = 0.0f;
        qkv_attn_desc chk = hd->desc;
        if (chk.bias_kind != QKV_BIAS_NONE && !chk.bias) chk.bias = &no_bias_yet;
        qkv_status s = qkv_attn_desc_check(&chk);
        if (s != QKV_OK) {
            attend_status_error(j, "invalid attention request", s);
            hd->ok = 0;
        }
    }
    hd->backward = c->backward;
    hd->want_lse = c->given[OPT_LSE];
    hd->want_dbias = c->backward && c->given[OPT_DBIAS];
    hd->has_kl = hd->ok && hd->desc.key_lengths != NULL;
    if (hd->has_kl) memcpy(t->kl, hd->desc.key_lengths, (size_t)hd->desc.batch * sizeof(int64_t));
    hd->desc.key_lengths = NULL;
    hd->desc.bias = NULL;
    hd->desc.seq_offsets_q = hd->desc.seq_offsets_k = NULL;
}

/* Rank 0's request to every rank: t->d, with the key lengths and the
 * sequence offsets (S + 1 entries, checked by rank 0; the ring derives each
 * block's sequences from them). 0, or -1 on every rank. */
static int dist_share_request(const job *j, dist_run *t) {
    if (MPI_Bcast(&t->hd, (int)sizeof t->hd, MPI_BYTE, 0, t->comm) != MPI_SUCCESS || !t->hd.ok) return -1;
    t->d = t->hd.desc;
    if (t->hd.has_kl) {
        MPI_Bcast(t->kl, (int)t->d.batch, MPI_INT64_T, 0, t->comm);
        t->d.key_lengths = t->kl;
    }
    if (t->d.num_seqs <= 0) return 0;
    t->so = malloc((size_t)(t->d.num_seqs + 1) * sizeof(int64_t));
    int so_ok = t->so != NULL, so_all = 0;
    MPI_Allreduce(&so_ok, &so_all, 1, MPI_INT, MPI_MIN, t->comm);
    if (!so_all) {
        if (!t->so) cli_error(CMD, "--distributed", NULL, "rank %d: out of memory", t->rank);
        return -1;
    }
    if (t->rank == 0) memcpy(t->so, j->in[IN_SEQ_OFFSETS].a.data, (size_t)(t->d.num_seqs + 1) * sizeof(int64_t));
    MPI_Bcast(t->so, (int)(t->d.num_seqs + 1), MPI_INT64_T, 0, t->comm);
    t->d.seq_offsets_q = t->so;
    return 0;
}

/* This rank's positions and buffers. 0, or -1 on every rank (a rank out of
 * memory says so). */
static int dist_alloc(dist_run *t) {
    const qkv_attn_desc *d = &t->d;
    const int64_t B = d->batch, H = d->heads, Hkv = d->heads_kv ? d->heads_kv : H, D = d->dim,
                  Dv = d->dim_v ? d->dim_v : D;
    t->layout = d->mask == QKV_MASK_CAUSAL ? QKV_DIST_ZIGZAG : QKV_DIST_CONTIGUOUS;
    int64_t maxq = 0, maxk = 0;
    for (int r = 0; r < t->size; r++) {
        qkv_dist_partition(d->n_q, t->size, r, t->layout, t->qs, t->ql, &t->nql);
        qkv_dist_partition(d->n_k, t->size, r, t->layout, t->ks, t->kln, &t->nkl);
        if (t->nql > maxq) maxq = t->nql;
        if (t->nkl > maxk) maxk = t->nkl;
    }
    qkv_dist_partition(d->n_q, t->size, t->rank, t->layout, t->qs, t->ql, &t->nql);
    qkv_dist_partition(d->n_k, t->size, t->rank, t->layout, t->ks, t->kln, &t->nkl);
    t->rq = (size_t)(B * t->nql * H);
    t->rk = (size_t)(B * t->nkl * Hkv);
    size_t tmp_n = (size_t)(B * (maxq > maxk ? maxq : maxk) * H * (D > Dv ? D : Dv)) + 1;
    /* --bias: each rank holds only the rows of its queries, [Hb, nql, n_k]
     * (read from the file by each rank, as q, k, v). */
    t->Hb = d->bias_kind == QKV_BIAS_PER_HEAD ? H : d->bias_kind == QKV_BIAS_SHARED ? 1 : 0;
    t->rb = (size_t)(t->Hb * t->nql * d->n_k);
    if ((size_t)(t->Hb * maxq * d->n_k) + 1 > tmp_n) tmp_n = (size_t)(t->Hb * maxq * d->n_k) + 1;
    if (t->Hb > 0) t->lb = malloc((t->rb + 1) * sizeof(float));
    t->lq = malloc((t->rq * (size_t)D + 1) * sizeof(float));
    t->lk = malloc((t->rk * (size_t)D + 1) * sizeof(float));
    t->lv = malloc((t->rk * (size_t)Dv + 1) * sizeof(float));
    t->lo = malloc((t->rq * (size_t)Dv + 1) * sizeof(float));
    t->ll = malloc((t->rq + 1) * sizeof(float));
    if (t->rank == 0) t->tmp = malloc(tmp_n * sizeof(float));
    int ok = t->lq && t->lk && t->lv && t->lo && t->ll && (t->rank != 0 || t->tmp) && (t->Hb == 0 || t->lb);
    if (ok && t->hd.backward) {
        t->lg = malloc((t->rq * (size_t)Dv + 1) * sizeof(float));
        t->ldq = malloc((t->rq * (size_t)D + 1) * sizeof(float));
        t->ldk = malloc((t->rk * (size_t)D + 1) * sizeof(float));
        t->ldv = malloc((t->rk * (size_t)Dv + 1) * sizeof(float));
        if (t->hd.want_dbias) t->ldb = malloc((t->rb + 1) * sizeof(float));
        ok = t->lg && t->ldq && t->ldk && t->ldv && (!t->hd.want_dbias || t->ldb);
    }
    int all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, t->comm);
    if (!ok) cli_error(CMD, "--distributed", NULL, "rank %d: out of memory", t->rank);
    return all_ok ? 0 : -1;
}

/* Each rank reads its own rows; all agree that every read succeeded before
 * any communication, so a bad or truncated file fails every rank with a
 * message, never a hang. The sequence axis: 1 of [B, n, H, D], 0 of [n, D]
 * and [n, H, D]; the bias's query axis: 0 of [n_q, n_k], 1 of [H, n_q, n_k].
 * 0, or -1 on every rank. */
static int dist_read_inputs(const config *c, dist_run *t) {
    const qkv_attn_desc *d = &t->d;
    const int64_t D = d->dim, Dv = d->dim_v ? d->dim_v : D;
    const int ax = t->hd.q_ndim == 4 ? 1 : 0, rank = t->rank;
    int ok = dist_read(rank, OPT_Q, c->val[OPT_Q], ax, d->n_q, t->qs, t->ql, (int64_t)t->rq * D, t->lq) == 0 &&
             dist_read(rank, OPT_K, c->val[OPT_K], ax, d->n_k, t->ks, t->kln, (int64_t)t->rk * D, t->lk) == 0 &&
             dist_read(rank, OPT_V, c->val[OPT_V], ax, d->n_k, t->ks, t->kln, (int64_t)t->rk * Dv, t->lv) == 0 &&
             (!t->hd.backward || dist_read(rank, OPT_GRAD_OUT, c->val[OPT_GRAD_OUT], ax, d->n_q, t->qs, t->ql,
                                           (int64_t)t->rq * Dv, t->lg) == 0) &&
             (t->Hb == 0 || dist_read(rank, OPT_BIAS, c->val[OPT_BIAS], d->bias_kind == QKV_BIAS_SHARED ? 0 : 1,
                                      d->n_q, t->qs, t->ql, (int64_t)t->rb, t->lb) == 0);
    int all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, t->comm);
    return all_ok ? 0 : -1;
}

/* The ring attention, forward and (--grad-out) backward. */
static qkv_status dist_compute(dist_run *t) {
    t->d.bias = t->lb;
    qkv_status s = qkv_ring_attention_forward(&t->d, t->layout, t->comm, t->lq, t->lk, t->lv, t->lo, t->ll);
    if (s != QKV_OK || !t->hd.backward) return s;
    qkv_attn_grads gr;
    memset(&gr, 0, sizeof gr);
    gr.dq = t->ldq;
    gr.dk = t->ldk;
    gr.dv = t->ldv;
    gr.dbias = t->ldb;
    return qkv_ring_attention_backward_grads(&t->d, t->layout, t->comm, t->lq, t->lk, t->lv, t->lo, t->ll, t->lg,
                                             &gr);
}

/* Rank 0: the whole outputs, shaped as one process's. 0, or -1 after
 * printing why. */
static int dist_alloc_outputs(const config *c, job *j, const dist_run *t, const dims *dq) {
    const qkv_array *qa = &j->in[IN_Q].a;
    const int64_t Dv = t->d.dim_v ? t->d.dim_v : t->d.dim;
    int r = qa->ndim, m = 0, ma = 0;
    int64_t o_shape[4], l_shape[3];
    if (r == 4) o_shape[m++] = dq->b;
    o_shape[m++] = dq->n;
    if (r >= 3) o_shape[m++] = dq->h;
    o_shape[m++] = Dv;
    if (r == 4) l_shape[ma++] = dq->b;
    if (r >= 3) l_shape[ma++] = dq->h;
    l_shape[ma++] = dq->n;
    const int want_o = c->given[OPT_OUT];
    const dist_head *hd = &t->hd;
    if (attend_alloc_output(j, OUT_O, want_o ? c->val[OPT_OUT] : NULL, QKV_F32, r, o_shape, "the output") ||
        (hd->want_lse && attend_alloc_output(j, OUT_LSE, c->val[OPT_LSE], QKV_F32, ma, l_shape, "the log-sum-exp")))
        return -1;
    if (!hd->backward) return 0;
    if (attend_alloc_output(j, OUT_DQ, c->val[OPT_DQ], QKV_F32, qa->ndim, qa->shape, "dL/dQ") ||
        attend_alloc_output(j, OUT_DK, c->val[OPT_DK], QKV_F32, j->in[IN_K].a.ndim, j->in[IN_K].a.shape, "dL/dK") ||
        attend_alloc_output(j, OUT_DV, c->val[OPT_DV], QKV_F32, j->in[IN_V].a.ndim, j->in[IN_V].a.shape, "dL/dV") ||
        (hd->want_dbias && attend_alloc_output(j, OUT_DBIAS, c->val[OPT_DBIAS], QKV_F32, j->in[IN_BIAS].a.ndim,
                                               j->in[IN_BIAS].a.shape, "dL/dbias")))
        return -1;
    return 0;
}

/* One output's slices gathered into rank 0's array of j->out[which]. */
static int dist_gather(const dist_run *t, job *j, int which, float *local, int64_t B, int64_t n, int64_t x) {
    return dist_move(t->comm, t->rank, t->size, t->rank == 0 ? j->out[which].a.data : NULL, local, B, n, x,
                     t->layout, 0, t->tmp);
}

/* Every output's slices gathered to rank 0. 0, or -1 after printing why. */
static int dist_gather_outputs(const dist_run *t, job *j) {
    const qkv_attn_desc *d = &t->d;
    const int64_t B = d->batch, H = d->heads, Hkv = d->heads_kv ? d->heads_kv : H, D = d->dim,
                  Dv = d->dim_v ? d->dim_v : D;
    const dist_head *hd = &t->hd;
    if (dist_gather(t, j, OUT_O, t->lo, B, d->n_q, H * Dv) ||
        (hd->want_lse && dist_gather(t, j, OUT_LSE, t->ll, B * H, d->n_q, 1)) ||
        (hd->backward &&
         (dist_gather(t, j, OUT_DQ, t->ldq, B, d->n_q, H * D) || dist_gather(t, j, OUT_DK, t->ldk, B, d->n_k, Hkv * D) ||
          dist_gather(t, j, OUT_DV, t->ldv, B, d->n_k, Hkv * Dv))) ||
        (hd->want_dbias && dist_gather(t, j, OUT_DBIAS, t->ldb, t->Hb, d->n_q, d->n_k))) {
        cli_error(CMD, "--distributed", NULL, "rank %d: gathering the outputs failed", t->rank);
        return -1;
    }
    return 0;
}

static int attend_distributed_run(const config *c, MPI_Comm comm, int rank, int size) {
    job j;
    memset(&j, 0, sizeof j);
    dist_run *t = calloc(1, sizeof *t);
    if (!t) {
        cli_error(CMD, "--distributed", NULL, "rank %d: out of memory", rank);
        return CLI_EXIT_FAIL;
    }
    t->comm = comm;
    t->rank = rank;
    t->size = size;
    dims dq = {1, 1, 1, 1};
    int rc = CLI_EXIT_FAIL;
    if (rank == 0) dist_check_request(c, &j, t, &dq);
    if (dist_share_request(&j, t) != 0 || dist_alloc(t) != 0 || dist_read_inputs(c, t) != 0) goto out;
    qkv_status s = dist_compute(t);
    if (s != QKV_OK) {
        if (rank == 0) attend_status_error(&j, "ring attention failed", s);
        goto out;
    }
    int ok = rank != 0 || dist_alloc_outputs(c, &j, t, &dq) == 0, all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm);
    if (!all_ok || dist_gather_outputs(t, &j) != 0) goto out;
    rc = CLI_EXIT_OK;
    if (rank == 0 && cli_files_write(CMD, j.out, OUT_COUNT) != 0) rc = CLI_EXIT_FAIL;
out:
    dist_run_free(t);
    free(t);
    attend_job_free(&j);
    return rc;
}

int attend_distributed(const config *c) {
    int inited = 0, provided = 0, rank = 0, size = 1;
    MPI_Initialized(&inited);
    if (!inited && MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
        cli_error(CMD, "--distributed", NULL, "MPI_Init failed");
        return CLI_EXIT_FAIL;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int rc = attend_distributed_run(c, MPI_COMM_WORLD, rank, size);
    /* Every rank exits with rank 0's status (the one that wrote or not). */
    int worst = rc;
    MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (!inited) MPI_Finalize();
    return worst;
}

#else /* built without MPI */

int attend_distributed(const config *c) {
    (void)c;
    cli_error(CMD, "--distributed", NULL,
              "this qkv was built without MPI (install Open MPI, e.g. apt-get install openmpi-bin "
              "libopenmpi-dev, and rebuild: CMake finds it; docs/DISTRIBUTED.md)");
    return CLI_EXIT_USAGE;
}

#endif /* QKV_HAVE_MPI */
