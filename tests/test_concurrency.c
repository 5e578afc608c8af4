/* The library called from several threads at once (docs: the top of
 * include/qkv.h says what is shared). Each worker thread owns its data: its
 * own attention problem (forward and backward, float32 through the default
 * implementation, float64 through the reference) and its own multi-head
 * layer (forward and backward). Every result must be bitwise identical to
 * the same work done first on one thread, in every round: no shared scratch
 * memory, no races in the lazily filled CPU-detection table, no dependence
 * on what the other threads do. Each call also uses a worker of the pool
 * (threads = 2), so the library's internal threading nests inside ours and
 * concurrent calls take workers from one pool. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#define WORKERS 4
#define ROUNDS 3

typedef struct work {
    int id;
    /* attention */
    qkv_attn_desc d;
    float *q, *k, *v, *out, *lse, *dout, *dq, *dk, *dv;
    double *q64, *k64, *v64, *out64, *dout64, *dq64, *dk64, *dv64;
    int64_t nq_el, nk_el, no_el, nl_el;
    /* multi-head layer */
    qkv_mha *m;
    int64_t B, n, E;
    float *x, *y, *dy, *dx;
    float *grads;
    int64_t n_grads;
    qkv_status status;
} work;

static float *fcopy(const float *x, int64_t n) {
    float *c = malloc((size_t)n * sizeof *c);
    if (c) memcpy(c, x, (size_t)n * sizeof *c);
    return c;
}

static int work_init(work *w, int id) {
    memset(w, 0, sizeof *w);
    w->id = id;
    tu_rng r;
    tu_rng_seed(&r, 1000 + (uint64_t)id);
    qkv_attn_desc_init(&w->d);
    w->d.batch = 2;
    w->d.n_q = 37 + id * 11; /* different shapes per worker */
    w->d.n_k = 150 + id * 7;
    w->d.heads = 4;
    w->d.heads_kv = 2;
    w->d.dim = 32;
    w->d.mask = id % 2 ? QKV_MASK_CAUSAL : QKV_MASK_NONE;
    w->d.threads = 2;
    w->nq_el = w->d.batch * w->d.n_q * w->d.heads * w->d.dim;
    w->nk_el = w->d.batch * w->d.n_k * w->d.heads_kv * w->d.dim;
    w->no_el = w->nq_el;
    w->nl_el = w->d.batch * w->d.heads * w->d.n_q;
    size_t f = sizeof(float), g = sizeof(double);
    w->q = malloc((size_t)w->nq_el * f);
    w->k = malloc((size_t)w->nk_el * f);
    w->v = malloc((size_t)w->nk_el * f);
    w->dout = malloc((size_t)w->no_el * f);
    w->out = calloc((size_t)w->no_el, f);
    w->lse = calloc((size_t)w->nl_el, f);
    w->dq = calloc((size_t)w->nq_el, f);
    w->dk = calloc((size_t)w->nk_el, f);
    w->dv = calloc((size_t)w->nk_el, f);
    w->q64 = malloc((size_t)w->nq_el * g);
    w->k64 = malloc((size_t)w->nk_el * g);
    w->v64 = malloc((size_t)w->nk_el * g);
    w->dout64 = malloc((size_t)w->no_el * g);
    w->out64 = calloc((size_t)w->no_el, g);
    w->dq64 = calloc((size_t)w->nq_el, g);
    w->dk64 = calloc((size_t)w->nk_el, g);
    w->dv64 = calloc((size_t)w->nk_el, g);
    if (!w->q || !w->k || !w->v || !w->dout || !w->out || !w->lse || !w->dq || !w->dk || !w->dv ||
        !w->q64 || !w->k64 || !w->v64 || !w->dout64 || !w->out64 || !w->dq64 || !w->dk64 || !w->dv64)
        return -1;
    tu_fill_normal_f32(&r, w->q, (size_t)w->nq_el, 1.0);
    tu_fill_normal_f32(&r, w->k, (size_t)w->nk_el, 1.0);
    tu_fill_normal_f32(&r, w->v, (size_t)w->nk_el, 1.0);
    tu_fill_normal_f32(&r, w->dout, (size_t)w->no_el, 1.0);
    for (int64_t i = 0; i < w->nq_el; i++) w->q64[i] = w->q[i];
    for (int64_t i = 0; i < w->nk_el; i++) w->k64[i] = w->k[i], w->v64[i] = w->v[i];
    for (int64_t i = 0; i < w->no_el; i++) w->dout64[i] = w->dout[i];

    qkv_mha_config cfg;
    w->B = 2;
    w->n = 19 + id * 5;
    w->E = 32;
    qkv_mha_config_init(&cfg, w->E, 4);
    cfg.attn.threads = 2;
    cfg.attn.mask = id % 2 ? QKV_MASK_NONE : QKV_MASK_CAUSAL;
    cfg.pos = id % 3 == 0 ? QKV_POS_ROPE : QKV_POS_NONE;
    if (qkv_mha_create(&cfg, 77 + (uint64_t)id, &w->m) != QKV_OK) return -1;
    int64_t nx = w->B * w->n * w->E;
    w->x = malloc((size_t)nx * f);
    w->dy = malloc((size_t)nx * f);
    w->y = calloc((size_t)nx, f);
    w->dx = calloc((size_t)nx, f);
    if (!w->x || !w->dy || !w->y || !w->dx) return -1;
    tu_fill_normal_f32(&r, w->x, (size_t)nx, 1.0);
    tu_fill_normal_f32(&r, w->dy, (size_t)nx, 1.0);
    return 0;
}

static void work_free(work *w) {
    void *ps[] = {w->q, w->k, w->v, w->out, w->lse, w->dout, w->dq, w->dk, w->dv, w->q64, w->k64,
                  w->v64, w->out64, w->dout64, w->dq64, w->dk64, w->dv64, w->x, w->y, w->dy,
                  w->dx, w->grads};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) free(ps[i]);
    qkv_mha_free(w->m);
}

/* The work of one thread; any failure is kept in w->status. */
static void *run(void *arg) {
    work *w = arg;
    qkv_status s = qkv_attention_forward(&w->d, w->q, w->k, w->v, w->out, NULL, w->lse);
    qkv_attn_grads g = {.dq = w->dq, .dk = w->dk, .dv = w->dv};
    if (s == QKV_OK) s = qkv_attention_backward(&w->d, w->q, w->k, w->v, w->out, w->lse, w->dout, &g);
    qkv_attn_desc d64 = w->d;
    d64.dtype = QKV_F64;
    d64.impl = QKV_IMPL_REFERENCE;
    if (s == QKV_OK) s = qkv_attention_forward(&d64, w->q64, w->k64, w->v64, w->out64, NULL, NULL);
    qkv_attn_grads g64 = {.dq = w->dq64, .dk = w->dk64, .dv = w->dv64};
    if (s == QKV_OK)
        s = qkv_attention_backward(&d64, w->q64, w->k64, w->v64, NULL, NULL, w->dout64, &g64);
    if (s == QKV_OK) {
        qkv_mha_zero_grad(w->m);
        s = qkv_mha_forward(w->m, w->B, w->n, w->n, w->x, NULL, NULL, NULL, w->y, NULL);
    }
    if (s == QKV_OK) s = qkv_mha_backward(w->m, w->x, NULL, NULL, w->dy, w->dx, NULL, NULL);
    w->status = s;
    return NULL;
}

/* A snapshot of every output of a worker, to compare bitwise. */
typedef struct snap {
    float *f[7];
    double *d[4];
} snap;

static void take(const work *w, snap *s) {
    int64_t nx = w->B * w->n * w->E, ng = 0;
    const float *gr = qkv_mha_grads(w->m, &ng);
    s->f[0] = fcopy(w->out, w->no_el);
    s->f[1] = fcopy(w->dq, w->nq_el);
    s->f[2] = fcopy(w->dk, w->nk_el);
    s->f[3] = fcopy(w->y, nx);
    s->f[4] = fcopy(w->dx, nx);
    s->f[5] = fcopy(gr, ng);
    s->f[6] = fcopy(w->dv, w->nk_el);
    double *ds[4] = {w->out64, w->dq64, w->dk64, w->dv64};
    int64_t dn[4] = {w->no_el, w->nq_el, w->nk_el, w->nk_el};
    for (int i = 0; i < 4; i++) {
        s->d[i] = malloc((size_t)dn[i] * sizeof(double));
        if (s->d[i]) memcpy(s->d[i], ds[i], (size_t)dn[i] * sizeof(double));
    }
}

static int same(const work *w, const snap *a, const snap *b) {
    int64_t nx = w->B * w->n * w->E, ng = 0;
    (void)qkv_mha_grads(w->m, &ng);
    int64_t fn[7] = {w->no_el, w->nq_el, w->nk_el, nx, nx, ng, w->nk_el};
    int64_t dn[4] = {w->no_el, w->nq_el, w->nk_el, w->nk_el};
    for (int i = 0; i < 7; i++)
        if (!a->f[i] || !b->f[i] || memcmp(a->f[i], b->f[i], (size_t)fn[i] * sizeof(float)) != 0)
            return 0;
    for (int i = 0; i < 4; i++)
        if (!a->d[i] || !b->d[i] || memcmp(a->d[i], b->d[i], (size_t)dn[i] * sizeof(double)) != 0)
            return 0;
    return 1;
}

static void snap_free(snap *s) {
    for (int i = 0; i < 7; i++) free(s->f[i]);
    for (int i = 0; i < 4; i++) free(s->d[i]);
}

int main(void) {
    work w[WORKERS];
    snap base[WORKERS];
    int ok = 1;
    for (int i = 0; i < WORKERS; i++) {
        int r = work_init(&w[i], i);
        CHECK(r == 0, "setting up worker %d", i);
        if (r != 0) ok = 0;
    }
    if (!ok) return tu_finish();

    /* Single-threaded: one worker after the other. */
    for (int i = 0; i < WORKERS; i++) {
        run(&w[i]);
        CHECK_STATUS(w[i].status, QKV_OK);
        take(&w[i], &base[i]);
    }
    /* All at once, several rounds (buffers are overwritten each round). */
    for (int round = 0; round < ROUNDS; round++) {
        pthread_t th[WORKERS];
        for (int i = 0; i < WORKERS; i++) {
            memset(w[i].out, 0xff, (size_t)w[i].no_el * sizeof(float));
            memset(w[i].y, 0xff, (size_t)(w[i].B * w[i].n * w[i].E) * sizeof(float));
            CHECK(pthread_create(&th[i], NULL, run, &w[i]) == 0, "pthread_create %d", i);
        }
        for (int i = 0; i < WORKERS; i++) pthread_join(th[i], NULL);
        for (int i = 0; i < WORKERS; i++) {
            CHECK_STATUS(w[i].status, QKV_OK);
            snap s;
            take(&w[i], &s);
            CHECK(same(&w[i], &base[i], &s),
                  "round %d worker %d: results differ from the single-threaded run", round, i);
            snap_free(&s);
        }
    }
    for (int i = 0; i < WORKERS; i++) {
        snap_free(&base[i]);
        work_free(&w[i]);
    }
    return tu_finish();
}
