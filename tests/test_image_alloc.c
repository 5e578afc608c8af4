/* Allocation failure injected into every allocation, in turn, of the image
 * and 2-D layers' calls (PNG decode and encode with libpng's memory routed
 * through the hooks, PGM decode, neighbourhood attention forward/backward,
 * convolution as attention, SAGAN forward/backward, RNN/LSTM/conv1d
 * backward): each failure returns QKV_ERR_OUT_OF_MEMORY (never a crash,
 * never another status) and leaves no allocation behind. Without libpng
 * the PGM decode and the PPM encode stand in for PNG. */
#include <stdlib.h>
#include <string.h>

#include "support/baselines.h"
#include "test_util.h"

static long g_live, g_calls, g_fail_at;

static void *fail_malloc(size_t n, void *user) {
    (void)user;
    if (g_calls++ == g_fail_at) return NULL;
    void *p = malloc(n ? n : 1);
    if (p) g_live++;
    return p;
}

static void fail_free(void *p, void *user) {
    (void)user;
    if (p) g_live--;
    free(p);
}

typedef qkv_status (*op_fn)(void *ctx);

/* Run op with the k-th allocation failing, for k = 0, 1, ... until it
 * succeeds; every failure must be OOM and leak nothing. */
static void sweep(const char *name, op_fn op, void *ctx) {
    int bad_status = 0, leaks = 0, done = 0;
    long k;
    for (k = 0; k < 100000 && !done; k++) {
        g_live = 0;
        g_calls = 0;
        g_fail_at = k;
        qkv_set_allocator(fail_malloc, fail_free, NULL);
        qkv_status s = op(ctx);
        qkv_set_allocator(NULL, NULL, NULL);
        if (s == QKV_OK) done = 1;
        else if (s != QKV_ERR_OUT_OF_MEMORY) bad_status++;
        if (g_live != 0) leaks++;
    }
    CHECK(done, "%s never succeeded", name);
    CHECK(bad_status == 0, "%s: %d failures were not OUT_OF_MEMORY", name, bad_status);
    CHECK(leaks == 0, "%s: %d runs leaked", name, leaks);
    printf("%s: %ld allocation points checked\n", name, k - 1);
}

typedef struct blob {
    unsigned char *bytes;
    size_t len;
    const char *path;
    qkv_image *img;
} blob;

static qkv_status op_parse(void *ctx) {
    blob *b = ctx;
    qkv_image img;
    qkv_status s = qkv_image_parse(b->bytes, b->len, &img, NULL, 0);
    /* The result is freed through the same hooks. */
    qkv_image_free(&img);
    return s;
}

static qkv_status op_save(void *ctx) {
    blob *b = ctx;
#if QKV_WITH_PNG
    return qkv_image_save_png(b->path, b->img);
#else
    return qkv_image_save_pnm(b->path, b->img);
#endif
}

typedef struct arrays {
    float *q, *k, *v, *o, *a, *d1, *d2, *d3, *w, *b;
} arrays;

static qkv_status op_nb_fwd(void *ctx) {
    arrays *x = ctx;
    return qkv_neighborhood2d_forward(5, 6, 2, 3, 3, 3, 0.0, 1, x->q, x->k, x->v, x->o, x->a);
}

static qkv_status op_nb_bwd(void *ctx) {
    arrays *x = ctx;
    return qkv_neighborhood2d_backward(5, 6, 2, 3, 3, 3, 0.0, 1, x->q, x->k, x->v, x->o, x->d1, x->d2, x->d3);
}

static qkv_status op_conv_att(void *ctx) {
    arrays *x = ctx;
    return qkv_conv2d_as_attention(2, 4, 5, x->q, 3, 3, x->w, x->b, 50.0, x->o);
}

static qkv_status op_sagan(void *ctx) {
    arrays *x = ctx;
    qkv_sagan *s;
    qkv_status st = qkv_sagan_create(4, 2, 1, &s);
    if (st != QKV_OK) return st;
    st = qkv_sagan_forward(s, 3, 4, x->q, x->o, NULL);
    if (st == QKV_OK) st = qkv_sagan_backward(s, x->q, x->k, x->d1);
    qkv_sagan_free(s);
    return st;
}

static qkv_status op_seq(void *ctx) {
    arrays *x = ctx;
    qkv_status st = qkv_rnn_backward(6, 3, 3, x->w, x->w, x->q, x->k, x->v, x->d1, x->d2, x->d3, NULL);
    if (st == QKV_OK) st = qkv_lstm_forward(6, 3, 3, x->w, x->w, NULL, x->q, x->o, x->a);
    if (st == QKV_OK) st = qkv_lstm_backward(6, 3, 3, x->w, x->w, x->q, x->o, x->a, x->v, x->d1, x->d2, x->d3, NULL);
    if (st == QKV_OK) st = qkv_conv1d_backward(6, 3, 3, 3, 2, x->w, x->q, x->v, x->d1, x->d2, NULL);
    return st;
}

int main(void) {
    const char *src = getenv("QKV_SOURCE_DIR");
#if QKV_WITH_PNG
    const char *names[] = {"palette.png", "interlaced.png", "rgb16.png", "gray16.pgm"};
#else
    const char *names[] = {"gray16.pgm"};   /* a build without libpng refuses PNG */
#endif
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/tests/data/image/%s", src ? src : ".", names[i]);
        FILE *f = fopen(path, "rb");
        CHECK(f != NULL, "open %s", path);
        if (!f) continue;
        blob b;
        memset(&b, 0, sizeof b);
        b.bytes = malloc(1 << 16);
        b.len = fread(b.bytes, 1, 1 << 16, f);
        fclose(f);
        sweep(names[i], op_parse, &b);
        free(b.bytes);
    }
    qkv_image img;
    CHECK_STATUS(qkv_image_alloc(&img, 7, 9, 3), QKV_OK);
    char out[1024];
    blob b = {NULL, 0, tu_tmp_path(out, sizeof out, QKV_WITH_PNG ? "alloc_save.png" : "alloc_save.ppm"), &img};
    sweep(QKV_WITH_PNG ? "save_png" : "save_pnm", op_save, &b);
    qkv_image_free(&img);

    arrays x;
    float *all = calloc(16 * 1024, sizeof(float));
    tu_rng r;
    tu_rng_seed(&r, 5);
    tu_fill_normal_f32(&r, all, 16 * 1024, 0.3);
    x.q = all, x.k = all + 1024, x.v = all + 2048, x.o = all + 3072, x.a = all + 4096;
    x.d1 = all + 5120, x.d2 = all + 6144, x.d3 = all + 7168, x.w = all + 8192, x.b = all + 9216;
    sweep("neighborhood2d_forward", op_nb_fwd, &x);
    sweep("neighborhood2d_backward", op_nb_bwd, &x);
    sweep("conv2d_as_attention", op_conv_att, &x);
    sweep("sagan", op_sagan, &x);
    sweep("rnn/lstm/conv1d", op_seq, &x);
    free(all);
    return tu_finish();
}
