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

static int attend_distributed_run(const config *c, MPI_Comm comm, int rank, int size) {
    job j;
    memset(&j, 0, sizeof j);
    dist_head hd;
    memset(&hd, 0, sizeof hd);
    int64_t kl[4096];
    dims dq = {1, 1, 1, 1};
    int rc = CLI_EXIT_FAIL;
    if (rank == 0) {
        hd.desc = c->desc;
        for (int i = 0; i < OUT_COUNT; i++) j.out[i].opt = attend_opt_name(output_opt[i]);
        j.header_only = 1; /* each rank reads its own rows below */
        hd.ok = attend_load_inputs(c, &j, &hd.desc, &dq) == 0;
        hd.q_ndim = j.in[IN_Q].a.ndim;
        if (hd.ok && (c->given[OPT_ATTN] || c->print))
            hd.ok = dist_fail("%s: the n x n attention matrix is not computed by the ring", "--attn/--print") == 0;
        if (hd.ok && hd.desc.dtype != QKV_F32)
            hd.ok = dist_fail("%s: the ring attention computes in float32 only", "--dtype") == 0;
        if (hd.ok && hd.desc.batch > (int64_t)(sizeof kl / sizeof kl[0]))
            hd.ok = dist_fail("%s: at most 4096 batches", "--q") == 0;
        if (hd.ok) {
            /* The bias is not read yet (each rank reads its rows): check the
             * request with a stand-in pointer. */
            static const float no_bias_yet = 0.0f;
            qkv_attn_desc chk = hd.desc;
            if (chk.bias_kind != QKV_BIAS_NONE && !chk.bias) chk.bias = &no_bias_yet;
            qkv_status s = qkv_attn_desc_check(&chk);
            if (s != QKV_OK) {
                attend_status_error(&j, "invalid attention request", s);
                hd.ok = 0;
            }
        }
        hd.backward = c->backward;
        hd.want_lse = c->given[OPT_LSE];
        hd.want_dbias = c->backward && c->given[OPT_DBIAS];
        hd.has_kl = hd.ok && hd.desc.key_lengths != NULL;
        if (hd.has_kl) memcpy(kl, hd.desc.key_lengths, (size_t)hd.desc.batch * sizeof(int64_t));
        hd.desc.key_lengths = NULL;
        hd.desc.bias = NULL;
        hd.desc.seq_offsets_q = hd.desc.seq_offsets_k = NULL;
    }
    if (MPI_Bcast(&hd, (int)sizeof hd, MPI_BYTE, 0, comm) != MPI_SUCCESS || !hd.ok) {
        attend_job_free(&j);
        return CLI_EXIT_FAIL;
    }
    qkv_attn_desc d = hd.desc;
    if (hd.has_kl) {
        MPI_Bcast(kl, (int)d.batch, MPI_INT64_T, 0, comm);
        d.key_lengths = kl;
    }
    /* --seq-offsets: every rank gets the offsets (S + 1 entries, checked by
     * rank 0; the ring derives each block's sequences from them). */
    int64_t *so = NULL;
    if (d.num_seqs > 0) {
        so = malloc((size_t)(d.num_seqs + 1) * sizeof(int64_t));
        int so_ok = so != NULL, so_all = 0;
        MPI_Allreduce(&so_ok, &so_all, 1, MPI_INT, MPI_MIN, comm);
        if (!so_all) {
            if (!so) cli_error(CMD, "--distributed", NULL, "rank %d: out of memory", rank);
            free(so);
            attend_job_free(&j);
            return CLI_EXIT_FAIL;
        }
        if (rank == 0) memcpy(so, j.in[IN_SEQ_OFFSETS].a.data, (size_t)(d.num_seqs + 1) * sizeof(int64_t));
        MPI_Bcast(so, (int)(d.num_seqs + 1), MPI_INT64_T, 0, comm);
        d.seq_offsets_q = so;
    }
    const int64_t B = d.batch, H = d.heads, Hkv = d.heads_kv ? d.heads_kv : H, D = d.dim,
                  Dv = d.dim_v ? d.dim_v : D;
    qkv_dist_layout layout = d.mask == QKV_MASK_CAUSAL ? QKV_DIST_ZIGZAG : QKV_DIST_CONTIGUOUS;
    int64_t qs[2], ql[2], nql, ks[2], kln[2], nkl, maxq = 0, maxk = 0;
    for (int r = 0; r < size; r++) {
        qkv_dist_partition(d.n_q, size, r, layout, qs, ql, &nql);
        qkv_dist_partition(d.n_k, size, r, layout, ks, kln, &nkl);
        if (nql > maxq) maxq = nql;
        if (nkl > maxk) maxk = nkl;
    }
    qkv_dist_partition(d.n_q, size, rank, layout, qs, ql, &nql);
    qkv_dist_partition(d.n_k, size, rank, layout, ks, kln, &nkl);
    size_t rq = (size_t)(B * nql * H), rk = (size_t)(B * nkl * Hkv);
    size_t tmp_n = (size_t)(B * (maxq > maxk ? maxq : maxk) * H * (D > Dv ? D : Dv)) + 1;
    /* --bias: each rank holds only the rows of its queries, [Hb, nql, n_k]
     * (read from the file by each rank, as q, k, v). */
    const int64_t Hb = d.bias_kind == QKV_BIAS_PER_HEAD ? H : d.bias_kind == QKV_BIAS_SHARED ? 1 : 0;
    size_t rb = (size_t)(Hb * nql * d.n_k);
    if ((size_t)(Hb * maxq * d.n_k) + 1 > tmp_n) tmp_n = (size_t)(Hb * maxq * d.n_k) + 1;
    float *lb = Hb > 0 ? malloc((rb + 1) * sizeof(float)) : NULL, *ldb = NULL;
    float *lq = malloc((rq * (size_t)D + 1) * sizeof(float)), *lk = malloc((rk * (size_t)D + 1) * sizeof(float));
    float *lv = malloc((rk * (size_t)Dv + 1) * sizeof(float)), *lo = malloc((rq * (size_t)Dv + 1) * sizeof(float));
    float *ll_ = malloc((rq + 1) * sizeof(float)), *lg = NULL, *ldq = NULL, *ldk = NULL, *ldv = NULL;
    float *tmp = rank == 0 ? malloc(tmp_n * sizeof(float)) : NULL; /* for the gather */
    int ok = lq && lk && lv && lo && ll_ && (rank != 0 || tmp) && (Hb == 0 || lb);
    if (ok && hd.backward) {
        lg = malloc((rq * (size_t)Dv + 1) * sizeof(float));
        ldq = malloc((rq * (size_t)D + 1) * sizeof(float));
        ldk = malloc((rk * (size_t)D + 1) * sizeof(float));
        ldv = malloc((rk * (size_t)Dv + 1) * sizeof(float));
        if (hd.want_dbias) ldb = malloc((rb + 1) * sizeof(float));
        ok = lg && ldq && ldk && ldv && (!hd.want_dbias || ldb);
    }
    int all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm);
    if (!all_ok) {
        if (!ok) cli_error(CMD, "--distributed", NULL, "rank %d: out of memory", rank);
        goto out;
    }
    /* Each rank reads its own rows; all agree that every read succeeded
     * before any communication, so a bad or truncated file fails every rank
     * with a message, never a hang. The sequence axis: 1 of [B, n, H, D],
     * 0 of [n, D] and [n, H, D]; the bias's query axis: 0 of [n_q, n_k], 1 of
     * [H, n_q, n_k]. */
    {
        const int ax = hd.q_ndim == 4 ? 1 : 0;
        ok = dist_read(rank, OPT_Q, c->val[OPT_Q], ax, d.n_q, qs, ql, (int64_t)rq * D, lq) == 0 &&
             dist_read(rank, OPT_K, c->val[OPT_K], ax, d.n_k, ks, kln, (int64_t)rk * D, lk) == 0 &&
             dist_read(rank, OPT_V, c->val[OPT_V], ax, d.n_k, ks, kln, (int64_t)rk * Dv, lv) == 0 &&
             (!hd.backward ||
              dist_read(rank, OPT_GRAD_OUT, c->val[OPT_GRAD_OUT], ax, d.n_q, qs, ql, (int64_t)rq * Dv, lg) == 0) &&
             (Hb == 0 ||
              dist_read(rank, OPT_BIAS, c->val[OPT_BIAS], d.bias_kind == QKV_BIAS_SHARED ? 0 : 1, d.n_q, qs, ql, (int64_t)rb, lb) == 0);
        MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm);
        if (!all_ok) goto out;
    }
    d.bias = lb;
    qkv_status s = qkv_ring_attention_forward(&d, layout, comm, lq, lk, lv, lo, ll_);
    if (s == QKV_OK && hd.backward) {
        qkv_attn_grads gr;
        memset(&gr, 0, sizeof gr);
        gr.dq = ldq;
        gr.dk = ldk;
        gr.dv = ldv;
        gr.dbias = ldb;
        s = qkv_ring_attention_backward_grads(&d, layout, comm, lq, lk, lv, lo, ll_, lg, &gr);
    }
    if (s != QKV_OK) {
        if (rank == 0) attend_status_error(&j, "ring attention failed", s);
        goto out;
    }
    /* Gather the outputs into rank 0's arrays, shaped as one process's. */
    int want_o = 0;
    if (rank == 0) {
        const qkv_array *qa = &j.in[IN_Q].a;
        int r = qa->ndim, m = 0, ma = 0;
        int64_t o_shape[4], l_shape[3];
        if (r == 4) o_shape[m++] = dq.b;
        o_shape[m++] = dq.n;
        if (r >= 3) o_shape[m++] = dq.h;
        o_shape[m++] = Dv;
        if (r == 4) l_shape[ma++] = dq.b;
        if (r >= 3) l_shape[ma++] = dq.h;
        l_shape[ma++] = dq.n;
        want_o = c->given[OPT_OUT];
        if (attend_alloc_output(&j, OUT_O, want_o ? c->val[OPT_OUT] : NULL, QKV_F32, r, o_shape, "the output") ||
            (hd.want_lse && attend_alloc_output(&j, OUT_LSE, c->val[OPT_LSE], QKV_F32, ma, l_shape, "the log-sum-exp")) ||
            (hd.backward &&
             (attend_alloc_output(&j, OUT_DQ, c->val[OPT_DQ], QKV_F32, qa->ndim, qa->shape, "dL/dQ") ||
              attend_alloc_output(&j, OUT_DK, c->val[OPT_DK], QKV_F32, j.in[IN_K].a.ndim, j.in[IN_K].a.shape, "dL/dK") ||
              attend_alloc_output(&j, OUT_DV, c->val[OPT_DV], QKV_F32, j.in[IN_V].a.ndim, j.in[IN_V].a.shape, "dL/dV") ||
              (hd.want_dbias && attend_alloc_output(&j, OUT_DBIAS, c->val[OPT_DBIAS], QKV_F32, j.in[IN_BIAS].a.ndim,
                                             j.in[IN_BIAS].a.shape, "dL/dbias")))))
            ok = 0;
    }
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm);
    if (!all_ok) goto out;
    if (dist_move(comm, rank, size, rank == 0 ? j.out[OUT_O].a.data : NULL, lo, B, d.n_q, H * Dv, layout, 0, tmp) ||
        (hd.want_lse &&
         dist_move(comm, rank, size, rank == 0 ? j.out[OUT_LSE].a.data : NULL, ll_, B * H, d.n_q, 1, layout, 0, tmp)) ||
        (hd.backward &&
         (dist_move(comm, rank, size, rank == 0 ? j.out[OUT_DQ].a.data : NULL, ldq, B, d.n_q, H * D, layout, 0, tmp) ||
          dist_move(comm, rank, size, rank == 0 ? j.out[OUT_DK].a.data : NULL, ldk, B, d.n_k, Hkv * D, layout, 0, tmp) ||
          dist_move(comm, rank, size, rank == 0 ? j.out[OUT_DV].a.data : NULL, ldv, B, d.n_k, Hkv * Dv, layout, 0, tmp))) ||
        (hd.want_dbias &&
         dist_move(comm, rank, size, rank == 0 ? j.out[OUT_DBIAS].a.data : NULL, ldb, Hb, d.n_q, d.n_k, layout, 0, tmp))) {
        cli_error(CMD, "--distributed", NULL, "rank %d: gathering the outputs failed", rank);
        goto out;
    }
    rc = CLI_EXIT_OK;
    if (rank == 0 && cli_files_write(CMD, j.out, OUT_COUNT) != 0) rc = CLI_EXIT_FAIL;
out:
    free(lq); free(lk); free(lv); free(lo); free(ll_); free(lg); free(ldq); free(ldk); free(ldv); free(tmp);
    free(lb); free(ldb); free(so);
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
