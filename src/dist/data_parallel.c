/* Data-parallel training over MPI: every rank holds the whole model and
 * computes the gradients of its slice of the batch; the gradients are then
 * summed across ranks (each rank's scaled by its share of the batch's loss
 * terms) with non-blocking MPI_Iallreduce calls on buckets of about
 * bucket_bytes, several in flight at once, so that equal parameters and
 * equal summed gradients make every rank's optimiser step the same.
 *
 * The buckets are reduced after the backward pass, not overlapped with it:
 * qkv_model_backward has no per-layer hook yet (src/model), so the overlap
 * that frameworks get by launching a bucket as soon as its layers' gradients
 * are ready is left for when it has one. */
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
