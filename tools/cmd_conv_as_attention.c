/* qkv conv-as-attention: a K x K convolution computed by K^2-head
 * self-attention with the quadratic relative positional encoding of
 * Cordonnier, Loukas & Jaggi (ICLR 2020), on .npy files.
 *
 *   qkv conv-as-attention --kernel w.npy [--bias b.npy] --image x.npy
 *                         [--alpha A] -o y.npy [--check] [--sweep]
 *
 * w [C_out, C_in, K, K] as torch.nn.Conv2d stores it, x [C_in, H, W],
 * y [C_out, H, W]; stride 1, zero padding K // 2 (K odd). Inputs are
 * loaded and checked completely before anything is computed; the output is
 * written atomically, only on success. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_util.h"
#include "qkv.h"

#define CMD "conv-as-attention"
#define DEFAULT_ALPHA 100.0

enum { OPT_HELP, OPT_KERNEL, OPT_BIAS, OPT_IMAGE, OPT_ALPHA, OPT_OUT, OPT_CHECK, OPT_SWEEP, OPT_COUNT };

static const cli_opt options[OPT_COUNT] = {
    {"--help", "-h", 0, OPT_HELP}, {"--kernel", NULL, 1, OPT_KERNEL}, {"--bias", NULL, 1, OPT_BIAS},
    {"--image", NULL, 1, OPT_IMAGE}, {"--alpha", NULL, 1, OPT_ALPHA}, {"-o", "--out", 1, OPT_OUT},
    {"--check", NULL, 0, OPT_CHECK}, {"--sweep", NULL, 0, OPT_SWEEP},
};

static const char synopsis[] =
    "Usage: qkv conv-as-attention --kernel W.npy [--bias B.npy] --image X.npy\n"
    "                             [--alpha A] -o Y.npy [--check]\n"
    "       qkv conv-as-attention --kernel W.npy [--bias B.npy] --image X.npy --sweep\n";

static void help(void) {
    fputs(synopsis, stdout);
    printf("\n"
           "A K x K convolution (stride 1, zero padding K // 2, K odd) computed as\n"
           "multi-head self-attention over the pixels (Cordonnier, Loukas & Jaggi, ICLR\n"
           "2020): K^2 heads, head (a, b) scoring key pixels by -alpha |delta - Delta|^2\n"
           "with Delta = (a - K//2, b - K//2) its kernel offset, values = the inputs,\n"
           "output projection = the kernel taps. The keys include the zero padding, so\n"
           "the result tends to the convolution exactly as alpha grows.\n"
           "\n"
           "  --kernel FILE   w [C_out, C_in, K, K] (torch.nn.Conv2d.weight), float32/64\n"
           "  --bias FILE     b [C_out] (optional)\n"
           "  --image FILE    x [C_in, H, W]\n"
           "  --alpha A       sharpness of the positional attention (> 0, default %g)\n"
           "  -o, --out FILE  y [C_out, H, W] float32\n"
           "  --check         also compute the convolution directly and print the\n"
           "                  largest difference\n"
           "  --sweep         print the difference against the direct convolution for\n"
           "                  alpha = 0.25 .. 1e4 (no output file)\n"
           "  -h, --help      show this help and exit\n"
           "\n"
           "Exit status: 0 success, 1 bad input file or failed write (no output is left\n"
           "behind), 2 usage error.\n",
           DEFAULT_ALPHA);
}

#define usage_error(...) cli_usage_error(CMD, __VA_ARGS__)

/* Load a float .npy of the given rank as float32. */
static int load_f32(const char *opt, const char *path, int ndim, qkv_array *out) {
    char why[256] = "";
    qkv_array raw;
    qkv_status s = qkv_npy_load(path, &raw, why, sizeof why);
    if (s != QKV_OK) {
        cli_error(CMD, opt, path, "%s", why[0] ? why : qkv_status_string(s));
        return -1;
    }
    if (raw.dtype != QKV_F32 && raw.dtype != QKV_F64) {
        cli_error(CMD, opt, path, "dtype %s: need float32 or float64", cli_dtype_name(raw.dtype));
        qkv_array_free(&raw);
        return -1;
    }
    if (raw.ndim != ndim) {
        char sh[128];
        cli_error(CMD, opt, path, "shape %s: need %d dimensions", cli_shape_str(sh, sizeof sh, raw.ndim, raw.shape),
                  ndim);
        qkv_array_free(&raw);
        return -1;
    }
    for (int i = 0; i < ndim; i++)
        if (raw.shape[i] == 0) {
            cli_error(CMD, opt, path, "an empty dimension");
            qkv_array_free(&raw);
            return -1;
        }
    if (raw.dtype == QKV_F32) {
        *out = raw;
        return 0;
    }
    s = qkv_array_convert(&raw, QKV_F32, out);
    qkv_array_free(&raw);
    if (s != QKV_OK) {
        cli_error(CMD, opt, path, "%s", qkv_status_string(s));
        return -1;
    }
    return 0;
}

static double max_diff(const float *a, const float *b, int64_t n, double *ref_max) {
    double e = 0, m = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d != d) d = INFINITY;
        if (d > e) e = d;
        if (fabs(b[i]) > m) m = fabs(b[i]);
    }
    *ref_max = m;
    return e;
}

int cli_cmd_conv_as_attention(int argc, char **argv) {
    if (argc < 2) {
        fputs(synopsis, stderr);
        cli_usage_hint(CMD);
        return CLI_EXIT_USAGE;
    }
    const char *val[OPT_COUNT] = {0};
    int given[OPT_COUNT] = {0};
    double alpha = DEFAULT_ALPHA;
    cli_args a = {CMD, argc, argv, 1, options, OPT_COUNT, OPT_HELP, help, given, 0};
    const char *name, *value;
    for (int id; (id = cli_scan(&a, &name, &value)) != CLI_END;) {
        if (id == CLI_STOP) return a.status;
        val[id] = value;
        if (id == OPT_ALPHA) {
            if (cli_parse_double(CMD, "--alpha", value, &alpha) != 0) {
                cli_usage_hint(CMD);
                return CLI_EXIT_USAGE;
            }
            if (!(alpha > 0.0) || !isfinite(alpha)) return usage_error("--alpha", "must be finite and > 0");
        }
    }
    if (!given[OPT_KERNEL]) return usage_error(NULL, "missing --kernel W.npy");
    if (!given[OPT_IMAGE]) return usage_error(NULL, "missing --image X.npy");
    if (given[OPT_SWEEP] && (given[OPT_OUT] || given[OPT_ALPHA] || given[OPT_CHECK]))
        return usage_error("--sweep", "takes no -o, --alpha or --check");
    if (!given[OPT_SWEEP] && !given[OPT_OUT]) return usage_error(NULL, "missing -o Y.npy");

    qkv_array w = {0}, b = {0}, x = {0}, y = {0};
    float *yd = NULL;
    int rc = CLI_EXIT_FAIL;
    if (load_f32("--kernel", val[OPT_KERNEL], 4, &w) != 0) goto out;
    if (given[OPT_BIAS] && load_f32("--bias", val[OPT_BIAS], 1, &b) != 0) goto out;
    if (load_f32("--image", val[OPT_IMAGE], 3, &x) != 0) goto out;
    const int64_t co = w.shape[0], ci = w.shape[1], K = w.shape[2], H = x.shape[1], W = x.shape[2];
    if (w.shape[3] != K || K % 2 == 0) {
        char sh[128];
        cli_error(CMD, "--kernel", val[OPT_KERNEL], "shape %s: the kernel must be K x K with K odd",
                  cli_shape_str(sh, sizeof sh, 4, w.shape));
        goto out;
    }
    if (x.shape[0] != ci) {
        char sh[128], sw[128];
        cli_error(CMD, "--image", val[OPT_IMAGE], "shape %s has %lld channels but the kernel %s expects %lld",
                  cli_shape_str(sh, sizeof sh, 3, x.shape), (long long)x.shape[0],
                  cli_shape_str(sw, sizeof sw, 4, w.shape), (long long)ci);
        goto out;
    }
    if (given[OPT_BIAS] && b.shape[0] != co) {
        cli_error(CMD, "--bias", val[OPT_BIAS], "has %lld entries, the kernel has %lld outputs",
                  (long long)b.shape[0], (long long)co);
        goto out;
    }
    int64_t shape[3] = {co, H, W};
    qkv_status s = qkv_array_alloc(&y, QKV_F32, 3, shape);
    if (s == QKV_OK && (given[OPT_CHECK] || given[OPT_SWEEP])) {
        yd = malloc((size_t)(co * H * W) * sizeof(float));
        if (!yd) s = QKV_ERR_OUT_OF_MEMORY;
    }
    if (s == QKV_OK && yd) s = qkv_conv2d_forward(ci, H, W, x.data, co, K, w.data, b.data, yd);
    if (s != QKV_OK) {
        cli_error(CMD, NULL, val[OPT_IMAGE], "%s", qkv_status_string(s));
        goto out;
    }
    if (given[OPT_SWEEP]) {
        static const double alphas[] = {0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 1e2, 1e3, 1e4};
        printf("# C_in %lld, C_out %lld, K %lld, image %lld x %lld: max |attention - conv|\n", (long long)ci,
               (long long)co, (long long)K, (long long)H, (long long)W);
        printf("%10s  %12s  %12s\n", "alpha", "max abs", "relative");
        for (size_t i = 0; i < sizeof alphas / sizeof alphas[0]; i++) {
            s = qkv_conv2d_as_attention(ci, H, W, x.data, co, K, w.data, b.data, alphas[i], y.data);
            if (s != QKV_OK) {
                cli_error(CMD, NULL, val[OPT_IMAGE], "%s", qkv_status_string(s));
                goto out;
            }
            double m, e = max_diff(y.data, yd, co * H * W, &m);
            printf("%10g  %12.3e  %12.3e\n", alphas[i], e, e / (m > 0 ? m : 1));
        }
        rc = CLI_EXIT_OK;
        goto out;
    }
    s = qkv_conv2d_as_attention(ci, H, W, x.data, co, K, w.data, b.data, alpha, y.data);
    if (s != QKV_OK) {
        cli_error(CMD, NULL, val[OPT_IMAGE], "%s", qkv_status_string(s));
        goto out;
    }
    s = qkv_npy_save(val[OPT_OUT], &y);
    if (s != QKV_OK) {
        cli_error(CMD, "-o", val[OPT_OUT], "cannot write: %s", qkv_status_string(s));
        goto out;
    }
    if (yd) {
        double m, e = max_diff(y.data, yd, co * H * W, &m);
        printf("alpha %g: max |attention - conv| = %.3e (relative %.3e)\n", alpha, e, e / (m > 0 ? m : 1));
    }
    rc = CLI_EXIT_OK;
out:
    qkv_array_free(&w);
    qkv_array_free(&b);
    qkv_array_free(&x);
    qkv_array_free(&y);
    free(yd);
    return cli_flush_stdout(CMD, rc);
}
