/* `qkv mha` against PyTorch: runs the qkv program (its path in $QKV_CLI, set
 * by tests/CMakeLists.txt) on the fixtures of tests/data/cli/mha/ and compares
 * the .npy files it writes with torch.nn.MultiheadAttention's outputs (and,
 * for what torch lacks, --join mean, grouped-query heads, RoPE, ALiBi and the
 * additive score, with a float64 numpy transcription of the formulas in
 * qkv.h), all made by tests/data/cli/mha/make_fixtures.py and
 * make_extra_fixtures.py (bias_k/bias_v, additive). Both sides are float32 outputs of
 * float32 weights with different summation orders: they agree to a few ulps,
 * so the bound is 1e-5 (values are O(1)). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qkv.h"
#include "test_util.h"

#define TOL 1e-5

static const char *qkv_bin;
static char dat[1024];  /* tests/data/cli/mha */
static char tmp[1024];  /* where outputs go */

/* "<dir>/<name>" into a static ring of buffers (several per command line). */
static const char *in_path(const char *name) {
    static char ring[16][1200];
    static int at;
    char *p = ring[at++ % 16];
    snprintf(p, sizeof ring[0], "%s/%s", dat, name);
    return p;
}

static const char *out_path(const char *name) {
    static char ring[8][1200];
    static int at;
    char *p = ring[at++ % 8];
    snprintf(p, sizeof ring[0], "%s/%s", tmp, name);
    return p;
}

/* Run "qkv mha <args>" (args formatted; paths already absolute); returns the
 * exit status, or -1 when it could not run. */
static int run_mha(const char *fmt, ...) {
    char args[6000], cmd[8000];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "'%s' mha %s", qkv_bin, args);
    int rc = system(cmd);
    if (rc == -1) return -1;
    return rc == 0 ? 0 : (rc > 255 ? rc >> 8 : rc);
}

static int load(const char *path, qkv_array *a) {
    char why[256] = "";
    qkv_status s = qkv_npy_load(path, a, why, sizeof why);
    CHECK(s == QKV_OK, "load %s: %s", path, why);
    return s == QKV_OK;
}

/* The array at got equals block `block` of the array at want (want's shape
 * with the leading dim dropped when block >= 0; the whole array for -1),
 * float32, within TOL, and is finite. */
static void compare(const char *what, const char *got_path, const char *want_path, int block) {
    qkv_array got, want;
    memset(&got, 0, sizeof got);
    memset(&want, 0, sizeof want);
    if (load(got_path, &got) && load(want_path, &want)) {
        int skip = block >= 0 ? 1 : 0;
        int shape_ok = got.dtype == QKV_F32 && want.dtype == QKV_F32 && got.ndim == want.ndim - skip;
        for (int i = 0; shape_ok && i < got.ndim; i++) shape_ok = got.shape[i] == want.shape[i + skip];
        CHECK(shape_ok, "%s: %s has dtype %d, rank %d; want float32 rank %d, shape of %s", what,
              got_path, (int)got.dtype, got.ndim, want.ndim - skip, want_path);
        if (shape_ok) {
            int64_t n = qkv_array_count(&got);
            const float *g = got.data, *w = (const float *)want.data + (block > 0 ? block : 0) * n;
            double worst = 0.0;
            int finite = 1;
            for (int64_t i = 0; i < n; i++) {
                if (!isfinite(g[i])) finite = 0;
                double e = fabs((double)g[i] - (double)w[i]);
                if (!(e <= worst)) worst = e; /* NaN sticks */
            }
            CHECK(finite && worst < TOL, "%s: max |qkv - reference| = %g (bound %g)%s", what, worst,
                  TOL, finite ? "" : ", non-finite output");
        }
    }
    qkv_array_free(&got);
    qkv_array_free(&want);
}

/* Run, expect success, compare y (and attn when attn_want != NULL). */
static void check_run(const char *what, const char *y_want, const char *attn_want, int block,
                      const char *fmt, ...) {
    char args[6000];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    const char *y = out_path("y.npy"), *a = out_path("attn.npy");
    remove(y);
    remove(a);
    int rc = attn_want ? run_mha("%s -o '%s' --attn '%s'", args, y, a) : run_mha("%s -o '%s'", args, y);
    CHECK(rc == 0, "%s: qkv mha %s exited with %d", what, args, rc);
    if (rc != 0) return;
    compare(what, y, in_path(y_want), block);
    if (attn_want) {
        char w[256];
        snprintf(w, sizeof w, "%s (attention weights)", what);
        compare(w, a, in_path(attn_want), block);
    }
}

int main(void) {
    qkv_bin = getenv("QKV_CLI");
    const char *src = getenv("QKV_SOURCE_DIR");
    if (!qkv_bin || !src) {
        fprintf(stderr, "test_cli_mha: run through ctest (needs QKV_CLI and QKV_SOURCE_DIR)\n");
        return 1;
    }
    snprintf(dat, sizeof dat, "%s/tests/data/cli/mha", src);
    tu_tmp_path(tmp, sizeof tmp, "cli_mha");
    char mk[1200];
    snprintf(mk, sizeof mk, "mkdir -p '%s'", tmp);
    CHECK(system(mk) == 0, "mkdir %s", tmp);

    const char *W = in_path("weights.safetensors");
    char self_[1400], cross[1400];
    snprintf(self_, sizeof self_, "--weights '%s' --prefix self. --heads 2", W);
    snprintf(cross, sizeof cross, "--weights '%s' --prefix cross. --heads 2", W);

    /* Self-attention against torch: rank 3, every mask of the fixture. */
    check_run("self plain", "y_plain.npy", "attn_plain.npy", -1, "%s --x '%s'", self_, in_path("x.npy"));
    check_run("self --causal", "y_causal.npy", "attn_causal.npy", -1, "%s --x '%s' --causal", self_,
              in_path("x.npy"));
    check_run("self --mask causal", "y_causal.npy", NULL, -1, "%s --x '%s' --mask causal", self_,
              in_path("x.npy"));
    check_run("self padded", "y_padded.npy", "attn_padded.npy", -1, "%s --x '%s' --key-lengths '%s'",
              self_, in_path("x.npy"), in_path("lens.npy"));
    /* Rank 2: batch 1 of the fixture alone. */
    check_run("self rank 2", "y_plain.npy", "attn_plain.npy", 1, "%s --x '%s'", self_, in_path("x1.npy"));
    check_run("self rank 2 padded", "y_padded.npy", "attn_padded.npy", 1, "%s --x '%s' --key-lengths '%s'",
              self_, in_path("x1.npy"), in_path("lens1.npy"));
    check_run("self rank 2 causal", "y_causal.npy", "attn_causal.npy", 1, "%s --x '%s' --causal", self_,
              in_path("x1.npy"));
    /* The same through other paths of the library. */
    check_run("self --impl reference --threads 1", "y_plain.npy", NULL, -1,
              "%s --x '%s' --impl reference --threads 1", self_, in_path("x.npy"));
    check_run("self --threads 3", "y_causal.npy", NULL, -1, "%s --x '%s' --threads=3 --causal", self_,
              in_path("x.npy"));
    check_run("separate q/k/v_proj_weight of a fused layer", "y_plain.npy", NULL, -1,
              "--weights '%s' --heads 2 --x '%s'", in_path("split.safetensors"), in_path("x.npy"));
    check_run("self --kv x (keys = values = x)", "y_plain.npy", NULL, -1, "%s --x '%s' --kv '%s'", self_,
              in_path("x.npy"), in_path("x.npy"));
    check_run("self --k x --v x", "y_plain.npy", NULL, -1, "%s --x '%s' --k '%s' --v '%s'", self_,
              in_path("x.npy"), in_path("x.npy"), in_path("x.npy"));

    /* float64 input: converted to float32. */
    {
        qkv_array x, x64;
        memset(&x, 0, sizeof x);
        memset(&x64, 0, sizeof x64);
        if (load(in_path("x.npy"), &x)) {
            CHECK_STATUS(qkv_array_convert(&x, QKV_F64, &x64), QKV_OK);
            CHECK_STATUS(qkv_npy_save(out_path("x64.npy"), &x64), QKV_OK);
            check_run("self float64 x", "y_plain.npy", NULL, -1, "%s --x '%s'", self_, out_path("x64.npy"));
        }
        qkv_array_free(&x);
        qkv_array_free(&x64);
    }

    /* Cross-attention against torch: kdim 6, vdim 5. */
    check_run("cross plain", "cy_plain.npy", "cattn_plain.npy", -1, "%s --x '%s' --k '%s' --v '%s'", cross,
              in_path("cx.npy"), in_path("cxk.npy"), in_path("cxv.npy"));
    check_run("cross padded", "cy_padded.npy", "cattn_padded.npy", -1,
              "%s --x '%s' --k '%s' --v '%s' --key-lengths '%s'", cross, in_path("cx.npy"),
              in_path("cxk.npy"), in_path("cxv.npy"), in_path("lens.npy"));
    check_run("cross rank 2", "cy_plain.npy", "cattn_plain.npy", 1, "%s --x '%s' --k '%s' --v '%s'", cross,
              in_path("cx1.npy"), in_path("cxk1.npy"), in_path("cxv1.npy"));
    check_run("cross rank 2 padded", "cy_padded.npy", "cattn_padded.npy", 1,
              "%s --x '%s' --k '%s' --v '%s' --key-lengths '%s'", cross, in_path("cx1.npy"),
              in_path("cxk1.npy"), in_path("cxv1.npy"), in_path("lens1.npy"));
    /* Keys = values from one input (kdim = vdim = 6). */
    check_run("--kv", "y_kv.npy", "attn_kv.npy", -1, "--weights '%s' --heads 2 --x '%s' --kv '%s'",
              in_path("kv.safetensors"), in_path("x.npy"), in_path("kv.npy"));
    /* torch bias=False. */
    check_run("no biases", "y_nobias.npy", NULL, -1, "--weights '%s' --heads 2 --x '%s'",
              in_path("nobias.safetensors"), in_path("x.npy"));

    /* Positional encodings. */
    check_run("--pos sinusoidal (torch on x + PE)", "y_sinusoidal.npy", NULL, -1,
              "%s --x '%s' --pos sinusoidal", self_, in_path("x.npy"));
    check_run("--pos rope", "y_rope.npy", NULL, -1, "%s --x '%s' --pos rope", self_, in_path("x.npy"));
    check_run("--pos rope --rope-base 10000", "y_rope.npy", NULL, -1,
              "%s --x '%s' --pos rope --rope-base 10000", self_, in_path("x.npy"));
    check_run("--pos alibi", "y_alibi.npy", NULL, -1, "%s --x '%s' --pos alibi", self_, in_path("x.npy"));
    check_run("--pos alibi --causal", "y_alibi_causal.npy", NULL, -1, "%s --x '%s' --pos alibi --causal",
              self_, in_path("x.npy"));
    check_run("--pos none", "y_plain.npy", NULL, -1, "%s --x '%s' --pos none", self_, in_path("x.npy"));

    /* Heads averaged; grouped-query heads (H_kv read from k_proj_weight, or given). */
    check_run("--join mean", "y_mean.npy", NULL, -1, "--weights '%s' --heads 2 --x '%s' --join mean",
              in_path("mean.safetensors"), in_path("x.npy"));
    check_run("grouped-query", "y_gqa.npy", NULL, -1, "--weights '%s' --heads 4 --x '%s'",
              in_path("gqa.safetensors"), in_path("x.npy"));
    check_run("grouped-query --heads-kv 2 --causal", "y_gqa_causal.npy", NULL, -1,
              "--weights '%s' --heads 4 --heads-kv 2 --x '%s' --causal", in_path("gqa.safetensors"),
              in_path("x.npy"));

    /* torch's add_bias_kv=True (bias_k, bias_v): the extra key seen by every
     * query, also under --causal and --key-lengths; --attn [B, H, n, n_k + 1]
     * with the extra key last, as torch's (make_extra_fixtures.py). */
    check_run("bias_k/bias_v", "y_bias_kv.npy", NULL, -1, "--weights '%s' --heads 2 --x '%s'",
              in_path("bias_kv.safetensors"), in_path("x.npy"));
    check_run("bias_k/bias_v --causal --key-lengths", "y_bias_kv_causal_padded.npy",
              "attn_bias_kv_causal_padded.npy", -1, "--weights '%s' --heads 2 --x '%s' --causal --key-lengths '%s'",
              in_path("bias_kv.safetensors"), in_path("x.npy"), in_path("lens.npy"));
    /* The additive score from additive.w1/.w2/.w (a float64 numpy transcription). */
    check_run("additive score", "y_additive.npy", NULL, -1, "--weights '%s' --heads 2 --x '%s'",
              in_path("additive.safetensors"), in_path("x.npy"));
    check_run("additive score --causal --key-lengths --impl reference", "y_additive_causal_padded.npy", NULL, -1,
              "--weights '%s' --heads 2 --x '%s' --causal --key-lengths '%s' --impl reference",
              in_path("additive.safetensors"), in_path("x.npy"), in_path("lens.npy"));

    return tu_finish();
}
