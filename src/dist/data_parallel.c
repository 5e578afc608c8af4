/* Data-parallel training over MPI: every rank holds the whole model and
 * computes the gradients of its slice of the batch; the gradients are then
 * summed across ranks (each rank's scaled by its share of the batch's loss
 * terms) with non-blocking MPI_Iallreduce calls on buckets of about
 * bucket_bytes, several in flight at once, so that equal parameters and
 * equal summed gradients make every rank's optimiser step the same.
 *
 * qkv_model_allreduce_grads reduces after the backward pass; the reducer
 * (qkv_dp_reducer, below) overlaps the reductions with it, through the
 * model's gradient hook: each segment is packed as soon as the backward has
 * finished it, and each bucket is started as soon as it is full. */
#include <limits.h>
#include <string.h>

#include "core/internal.h"
#include "dist/dist_internal.h"

#define DP_DEFAULT_BUCKET ((size_t)4 << 20)

static qkv_status dup_comm(MPI_Comm comm, MPI_Comm *out) {
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (!inited || finalized) return QKV_ERR_UNSUPPORTED;
    if (comm == MPI_COMM_NULL) return QKV_ERR_NULL_POINTER;
    if (MPI_Comm_dup(comm, out) != MPI_SUCCESS) return QKV_ERR_IO;
    MPI_Comm_set_errhandler(*out, MPI_ERRORS_RETURN);
    return QKV_OK;
}

qkv_status qkv_model_bcast_params(qkv_model *m, int root, MPI_Comm comm) {
    if (!m) return QKV_ERR_NULL_POINTER;
    MPI_Comm c;
    qkv_status s = dup_comm(comm, &c);
    if (s != QKV_OK) return s;
    int64_t nseg = qkv_model_segment_count(m);
    for (int64_t i = 0; i < nseg && s == QKV_OK; i++) {
        const char *name;
        float *param, *grad;
        int64_t count;
        s = qkv_model_segment(m, i, &name, &param, &grad, &count);
        for (int64_t off = 0; s == QKV_OK && off < count; off += INT_MAX / 2) {
            int64_t len = count - off < INT_MAX / 2 ? count - off : INT_MAX / 2;
            if (MPI_Bcast(param + off, (int)len, MPI_FLOAT, root, c) != MPI_SUCCESS) s = QKV_ERR_IO;
        }
    }
    MPI_Comm_free(&c);
    return s;
}

qkv_status qkv_model_allreduce_grads(qkv_model *m, double weight, size_t bucket_bytes, MPI_Comm comm) {
    if (!m) return QKV_ERR_NULL_POINTER;
    if (!(weight >= 0.0) || weight > 1e30) return QKV_ERR_BAD_PARAMETER;
    MPI_Comm c;
    qkv_status s = dup_comm(comm, &c);
    if (s != QKV_OK) return s;
    int64_t total = qkv_model_param_count(m), nseg = qkv_model_segment_count(m);
    size_t per = (bucket_bytes ? bucket_bytes : DP_DEFAULT_BUCKET) / sizeof(float);
    if (per < 1) per = 1;
    if (per > (size_t)INT_MAX / 2) per = (size_t)INT_MAX / 2;
    int64_t nb = (total + (int64_t)per - 1) / (int64_t)per;
    float *flat = qkv_alloc((size_t)total * sizeof(float) + 1);
    MPI_Request *req = qkv_alloc((size_t)(nb > 0 ? nb : 1) * sizeof(MPI_Request));
    if (!flat || !req) s = QKV_ERR_OUT_OF_MEMORY;
    /* Every rank must reach the reductions, or none: agree first. */
    int bad = s != QKV_OK, any = 0;
    if (MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, c) != MPI_SUCCESS) any = 1;
    if (any && s == QKV_OK) s = QKV_ERR_IO;
    if (s == QKV_OK) {
        /* Pack (scaled) in segment order; launch each bucket as soon as
         * it is full, so packing overlaps the reductions in flight. */
        int64_t at = 0, launched = 0;
        float w = (float)weight;
        for (int64_t i = 0; i < nseg && s == QKV_OK; i++) {
            const char *name;
            float *param, *grad;
            int64_t count;
            s = qkv_model_segment(m, i, &name, &param, &grad, &count);
            for (int64_t j = 0; s == QKV_OK && j < count; j++) flat[at + j] = grad[j] * w;
            at += count;
            while (s == QKV_OK && launched < nb && (launched + 1) * (int64_t)per <= at) {
                if (MPI_Iallreduce(MPI_IN_PLACE, flat + launched * (int64_t)per, (int)per, MPI_FLOAT, MPI_SUM, c,
                                   &req[launched]) != MPI_SUCCESS)
                    s = QKV_ERR_IO;
                launched++;
            }
        }
        if (s == QKV_OK && launched < nb) {
            int64_t off = launched * (int64_t)per;
            if (MPI_Iallreduce(MPI_IN_PLACE, flat + off, (int)(total - off), MPI_FLOAT, MPI_SUM, c,
                               &req[launched]) != MPI_SUCCESS)
                s = QKV_ERR_IO;
            launched++;
        }
        if (launched > 0 && MPI_Waitall((int)launched, req, MPI_STATUSES_IGNORE) != MPI_SUCCESS) s = QKV_ERR_IO;
        at = 0;
        for (int64_t i = 0; i < nseg && s == QKV_OK; i++) {
            const char *name;
            float *param, *grad;
            int64_t count;
            s = qkv_model_segment(m, i, &name, &param, &grad, &count);
            if (s == QKV_OK) memcpy(grad, flat + at, (size_t)count * sizeof(float));
            at += count;
        }
    }
    qkv_free(flat);
    qkv_free(req);
    MPI_Comm_free(&c);
    return s;
}

/* ---- the reducer overlapped with the backward ----------------------------- */

#define DP_REDUCER_BUCKET ((size_t)1 << 20)

struct qkv_dp_reducer {
    qkv_model *m;
    MPI_Comm comm;
    int64_t nseg, total, per, nb;
    float *flat;            /* [total]: segments in the order the backward finished them */
    int64_t *off;           /* [nseg]: offset of each packed segment in flat, -1 not yet */
    MPI_Request *req;       /* [nb] */
    int64_t at, launched;   /* floats packed, buckets started */
    float w;
    int armed;
    qkv_status hook_status; /* the first failure inside the hook */
};

/* Start every bucket that is full (all the rest when final). */
static qkv_status launch_ready(qkv_dp_reducer *r, int final) {
    while (r->launched < r->nb && ((r->launched + 1) * r->per <= r->at || (final && r->at >= r->total))) {
        int64_t o = r->launched * r->per, cnt = r->total - o < r->per ? r->total - o : r->per;
        if (MPI_Iallreduce(MPI_IN_PLACE, r->flat + o, (int)cnt, MPI_FLOAT, MPI_SUM, r->comm, &r->req[r->launched]) !=
            MPI_SUCCESS)
            return QKV_ERR_IO;
        r->launched++;
    }
    return QKV_OK;
}

static void pack_segment(qkv_dp_reducer *r, int64_t i) {
    const char *name;
    float *param, *grad;
    int64_t count;
    if (i < 0 || i >= r->nseg || r->off[i] >= 0) return;
    if (qkv_model_segment(r->m, i, &name, &param, &grad, &count) != QKV_OK) return;
    float *dst = r->flat + r->at;
    for (int64_t j = 0; j < count; j++) dst[j] = grad[j] * r->w;
    r->off[i] = r->at;
    r->at += count;
}

static qkv_status reducer_hook(void *user, const int64_t *segs, int64_t n) {
    qkv_dp_reducer *r = user;
    if (!r->armed || r->hook_status != QKV_OK) return QKV_OK;
    for (int64_t t = 0; t < n; t++) pack_segment(r, segs[t]);
    qkv_status s = launch_ready(r, 0);
    /* Drive MPI's progress on the buckets in flight (without an
     * asynchronous progress thread they move only inside MPI calls). */
    int flag = 0;
    if (s == QKV_OK && r->launched > 0 &&
        MPI_Testall((int)r->launched, r->req, &flag, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
        s = QKV_ERR_IO;
    r->hook_status = s;
    return s;
}

void qkv_dp_reducer_free(qkv_dp_reducer *r) {
    if (!r) return;
    if (r->m) (void)qkv_model_set_grad_hook(r->m, NULL, NULL);
    if (r->comm != MPI_COMM_NULL) MPI_Comm_free(&r->comm);
    qkv_free(r->flat);
    qkv_free(r->off);
    qkv_free(r->req);
    qkv_free(r);
}

qkv_status qkv_dp_reducer_create(qkv_model *m, size_t bucket_bytes, MPI_Comm comm, qkv_dp_reducer **out) {
    if (!out) return QKV_ERR_NULL_POINTER;
    *out = NULL;
    if (!m) return QKV_ERR_NULL_POINTER;
    MPI_Comm c;
    qkv_status s = dup_comm(comm, &c);
    if (s != QKV_OK) return s;
    qkv_dp_reducer *r = qkv_alloc_zeroed(sizeof *r);
    if (!r) {
        s = QKV_ERR_OUT_OF_MEMORY;
    } else {
        r->comm = c;
        r->m = NULL;
        r->nseg = qkv_model_segment_count(m);
        r->total = qkv_model_param_count(m);
        size_t per = (bucket_bytes ? bucket_bytes : DP_REDUCER_BUCKET) / sizeof(float);
        if (per < 1) per = 1;
        if (per > (size_t)INT_MAX / 2) per = (size_t)INT_MAX / 2;
        r->per = (int64_t)per;
        r->nb = (r->total + r->per - 1) / r->per;
        r->flat = qkv_alloc((size_t)r->total * sizeof(float) + 1);
        r->off = qkv_alloc((size_t)(r->nseg > 0 ? r->nseg : 1) * sizeof(int64_t));
        r->req = qkv_alloc((size_t)(r->nb > 0 ? r->nb : 1) * sizeof(MPI_Request));
        if (!r->flat || !r->off || !r->req) s = QKV_ERR_OUT_OF_MEMORY;
    }
    /* Collective: every rank has a reducer, or none has. */
    int bad = s != QKV_OK, any = 0;
    if (MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, c) != MPI_SUCCESS) any = 1;
    if (any && s == QKV_OK) s = QKV_ERR_IO;
    if (s != QKV_OK) {
        if (r) qkv_dp_reducer_free(r);
        else MPI_Comm_free(&c);
        return s;
    }
    r->m = m;
    for (int64_t i = 0; i < r->nb; i++) r->req[i] = MPI_REQUEST_NULL;
    (void)qkv_model_set_grad_hook(m, reducer_hook, r);
    *out = r;
    return QKV_OK;
}

qkv_status qkv_dp_reducer_begin(qkv_dp_reducer *r, double weight) {
    if (!r) return QKV_ERR_NULL_POINTER;
    if (!(weight >= 0.0) || weight > 1e30) return QKV_ERR_BAD_PARAMETER;
    if (r->armed) return QKV_ERR_UNSUPPORTED;
    r->w = (float)weight;
    r->at = 0;
    r->launched = 0;
    r->hook_status = QKV_OK;
    for (int64_t i = 0; i < r->nseg; i++) r->off[i] = -1;
    r->armed = 1;
    return QKV_OK;
}

qkv_status qkv_dp_reducer_finish(qkv_dp_reducer *r, qkv_status backward_status) {
    if (!r) return QKV_ERR_NULL_POINTER;
    qkv_status local = backward_status;
    if (!r->armed) { /* no begin: still take part, so nobody waits */
        if (local == QKV_OK) local = QKV_ERR_UNSUPPORTED;
        r->at = 0;
        r->launched = 0;
        for (int64_t i = 0; i < r->nseg; i++) r->off[i] = -1;
    }
    if (local == QKV_OK) local = r->hook_status;
    if (local == QKV_OK) {
        /* Anything the backward did not report, in segment order. */
        for (int64_t i = 0; i < r->nseg; i++) pack_segment(r, i);
    }
    if (local != QKV_OK || r->at != r->total) { /* the same buckets as everyone, contents unused */
        if (local == QKV_OK) local = QKV_ERR_IO;
        memset(r->flat + r->at, 0, (size_t)(r->total - r->at) * sizeof(float));
        r->at = r->total;
    }
    qkv_status s = launch_ready(r, 1);
    if (r->launched > 0 && MPI_Waitall((int)r->launched, r->req, MPI_STATUSES_IGNORE) != MPI_SUCCESS) s = QKV_ERR_IO;
    if (local == QKV_OK) local = s;
    int in = (int)local, worst = 0;
    if (MPI_Allreduce(&in, &worst, 1, MPI_INT, MPI_MAX, r->comm) != MPI_SUCCESS && local == QKV_OK) local = QKV_ERR_IO;
    if (local == QKV_OK) local = (qkv_status)worst;
    if (local == QKV_OK)
        for (int64_t i = 0; i < r->nseg; i++) {
            const char *name;
            float *param, *grad;
            int64_t count;
            if (qkv_model_segment(r->m, i, &name, &param, &grad, &count) == QKV_OK)
                memcpy(grad, r->flat + r->off[i], (size_t)count * sizeof(float));
        }
    r->armed = 0;
    return local;
}
