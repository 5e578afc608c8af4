/* qkv image: which pixels one pixel attends to, drawn over the image.
 *
 *   qkv image IN.png --query X,Y [--window K] [--pos none|sinusoidal2d]
 *             [--dim D] [--scale S] [--seed N] -o MAP.png [--attn ROW.npy]
 *
 * The image is H*W vectors of C channels (the second article's picture of an
 * image as a set of vectors). Queries and keys are the same features
 * (self-attention, q = k = f): the pixel values, or their projection by a
 * fixed random matrix to D dimensions (--dim), plus DETR's 2-D sinusoidal
 * position with --pos sinusoidal2d. The attention row of the query pixel,
 * softmax(q k^T * scale), is drawn as a heat overlay on a darkened grey copy
 * of the image; the query pixel is marked in cyan.
 *
 * --window K: 2-D neighbourhood attention (qkv_neighborhood2d_forward): the
 * pixel attends to its K x K window only. A pixel's row depends only on the
 * pixels of its window, so the layer is run on the window's crop, which
 * gives exactly that pixel's row of the whole-image layer at O(K^4 D) cost.
 *
 * Outputs are computed completely before anything is written; each write is
 * atomic and a later failure removes the earlier output. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "cli_util.h"
#include "core/rng.h"
#include "qkv.h"

#define CMD "image"

enum { OPT_HELP, OPT_IN, OPT_QUERY, OPT_WINDOW, OPT_POS, OPT_DIM, OPT_SCALE, OPT_SEED, OPT_OUT, OPT_ATTN, OPT_COUNT };

static const cli_opt options[OPT_COUNT] = {
    {"--help", "-h", 0, OPT_HELP},   {"--in", NULL, 1, OPT_IN},         {"--query", NULL, 1, OPT_QUERY},
    {"--window", NULL, 1, OPT_WINDOW}, {"--pos", NULL, 1, OPT_POS},      {"--dim", NULL, 1, OPT_DIM},
    {"--scale", NULL, 1, OPT_SCALE}, {"--seed", NULL, 1, OPT_SEED},     {"-o", "--out", 1, OPT_OUT},
    {"--attn", NULL, 1, OPT_ATTN},
};

static const char synopsis[] =
    "Usage: qkv image IN.png --query X,Y [--window K] [--pos none|sinusoidal2d]\n"
    "                 [--dim D] [--scale S] [--seed N] -o MAP.png [--attn ROW.npy]\n";

static void help(void) {
    fputs(synopsis, stdout);
    fputs("\n"
          "Self-attention over the pixels of an image: the attention row of one query\n"
          "pixel, softmax(scale * f(query) . f(key)) over the keys, drawn as a heat\n"
          "overlay (dark red .. yellow, normalised to the row's largest weight) on a\n"
          "darkened grey copy of the image. The query pixel is marked in cyan.\n"
          "\n"
          "  IN                 PNG (8/16-bit gray, gray+alpha, RGB, RGBA, palette) or\n"
          "                     binary PGM/PPM (P5/P6); also --in IN\n"
          "  --query X,Y        the query pixel: column X, row Y, 0-based (required)\n"
          "  --window K         2-D neighbourhood attention: only the K x K window\n"
          "                     around the pixel (K odd >= 1); default: every pixel\n"
          "  --pos KIND         none (default) or sinusoidal2d: DETR's 2-D sine position\n"
          "                     (half the dimensions encode y, half x) added to q and k\n"
          "  --dim D            project the C channels to D dimensions with a fixed\n"
          "                     random matrix (N(0, 1/C) entries, from --seed); default:\n"
          "                     the channels themselves, or D = 32 with --pos\n"
          "                     sinusoidal2d (which needs D a multiple of 4)\n"
          "  --scale S          score scale (default 1/sqrt(D)); larger is sharper\n"
          "  --seed N           seed of the projection (default 1)\n"
          "  -o, --out FILE     the overlay, PNG (required)\n"
          "  --attn FILE        the attention row as float32 .npy [H, W] (0 outside the\n"
          "                     window)\n"
          "  -h, --help         show this help and exit\n"
          "\n"
          "Prints one line: the query, the number of keys, the largest weight and its\n"
          "pixel, and the row's entropy in bits.\n"
          "Exit status: 0 success, 1 bad input file or failed write (no output is left\n"
          "behind), 2 usage error.\n"
          "\n"
          "Example:\n"
          "  qkv image photo.png --query 120,80 --window 31 --pos sinusoidal2d -o map.png\n",
          stdout);
}

typedef struct config {
    const char *in, *out, *attn;
    int64_t qx, qy, window, dim;
    int pos; /* 0 none, 1 sinusoidal2d */
    int has_scale;
    double scale;
    uint64_t seed;
} config;

#define usage_error(...) cli_usage_error(CMD, __VA_ARGS__)

#define PARSE_CONTINUE (-1)

static int parse_args(int argc, char **argv, config *c) {
    memset(c, 0, sizeof *c);
    c->qx = c->qy = -1;
    c->seed = 1;
    if (argc < 2) {
        fputs(synopsis, stderr);
        cli_usage_hint(CMD);
        return CLI_EXIT_USAGE;
    }
    /* The input may come first, as a bare argument. */
    char **av = argv;
    int ac = argc;
    char *shifted[2] = {NULL, NULL};
    if (argv[1][0] != '-') {
        c->in = argv[1];
        shifted[0] = argv[0];
        if (argc == 2) {
            av = shifted;
            ac = 1;
        } else {
            argv[1] = argv[0];
            av = argv + 1;
            ac = argc - 1;
        }
    }
    int given[OPT_COUNT] = {0};
    cli_args a = {CMD, ac, av, 1, options, OPT_COUNT, OPT_HELP, help, given, 0};
    const char *name, *value;
    for (int id; (id = cli_scan(&a, &name, &value)) != CLI_END;) {
        if (id == CLI_STOP) return a.status;
        switch (id) {
        case OPT_IN:
            if (c->in) return usage_error("--in", "the input is already given ('%s')", c->in);
            c->in = value;
            break;
        case OPT_OUT: c->out = value; break;
        case OPT_ATTN: c->attn = value; break;
        case OPT_QUERY: {
            const char *comma = strchr(value, ',');
            char xs[64];
            if (!comma || (size_t)(comma - value) >= sizeof xs)
                return usage_error("--query", "'%s' is not X,Y (column, row)", value);
            memcpy(xs, value, (size_t)(comma - value));
            xs[comma - value] = '\0';
            if (cli_parse_int64(CMD, "--query X", xs, 0, INT32_MAX, &c->qx) != 0 ||
                cli_parse_int64(CMD, "--query Y", comma + 1, 0, INT32_MAX, &c->qy) != 0) {
                cli_usage_hint(CMD);
                return CLI_EXIT_USAGE;
            }
            break;
        }
        case OPT_WINDOW:
            if (cli_parse_int64(CMD, "--window", value, 1, 1 << 20, &c->window) != 0) {
                cli_usage_hint(CMD);
                return CLI_EXIT_USAGE;
            }
            if (c->window % 2 == 0) return usage_error("--window", "K must be odd (got %lld)", (long long)c->window);
            break;
        case OPT_POS:
            if (strcmp(value, "none") == 0)
                c->pos = 0;
            else if (strcmp(value, "sinusoidal2d") == 0)
                c->pos = 1;
            else
                return usage_error("--pos", "'%s' is not none or sinusoidal2d", value);
            break;
        case OPT_DIM:
            if (cli_parse_int64(CMD, "--dim", value, 1, 4096, &c->dim) != 0) {
                cli_usage_hint(CMD);
                return CLI_EXIT_USAGE;
            }
            break;
        case OPT_SCALE:
            if (cli_parse_double(CMD, "--scale", value, &c->scale) != 0) {
                cli_usage_hint(CMD);
                return CLI_EXIT_USAGE;
            }
            if (!isfinite(c->scale) || c->scale == 0.0)
                return usage_error("--scale", "must be finite and non-zero");
            c->has_scale = 1;
            break;
        case OPT_SEED: {
            int64_t s;
            if (cli_parse_int64(CMD, "--seed", value, 0, INT64_MAX, &s) != 0) {
                cli_usage_hint(CMD);
                return CLI_EXIT_USAGE;
            }
            c->seed = (uint64_t)s;
            break;
        }
        default: break;
        }
    }
    if (!c->in) return usage_error(NULL, "missing the input image (qkv image IN.png ...)");
    if (!given[OPT_QUERY]) return usage_error(NULL, "missing --query X,Y");
    if (!c->out) return usage_error(NULL, "missing -o MAP.png");
    if (c->attn && strcmp(c->attn, c->out) == 0)
        return usage_error(NULL, "-o and --attn name the same file '%s'", c->out);
    if (c->pos == 1 && c->dim == 0) c->dim = 32;
    if (c->pos == 1 && c->dim % 4 != 0)
        return usage_error("--dim", "--pos sinusoidal2d needs D a multiple of 4 (got %lld)", (long long)c->dim);
    return PARSE_CONTINUE;
}

static double rng_normal(uint64_t *s) {
    double u1 = 1.0 - splitmix64_unit(s), u2 = splitmix64_unit(s);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* Heat colour for t in [0, 1]: black-red-yellow-white ("hot"). */
static void heat(double t, float rgb[3]) {
    rgb[0] = (float)fmin(1.0, 3.0 * t);
    rgb[1] = (float)fmin(1.0, fmax(0.0, 3.0 * t - 1.0));
    rgb[2] = (float)fmin(1.0, fmax(0.0, 3.0 * t - 2.0));
}

/* The features f = x R (+ the 2-D position, written first and accumulated
 * into by the product: one [HW, D] buffer, not two) of every pixel. */
static qkv_status features(const config *c, const qkv_image *img, int64_t D, float *feat) {
    const int64_t HW = img->height * img->width, C = img->channels;
    qkv_status s;
    if (c->pos) {
        s = qkv_posenc_sinusoidal2d(img->height, img->width, D, 1, feat);
        if (s != QKV_OK) return s;
    }
    if (!c->dim) {
        memcpy(feat, img->data, (size_t)(HW * D) * sizeof(float));
        return QKV_OK;
    }
    /* A fixed random projection R [C, D], N(0, 1/C). */
    float *R = malloc((size_t)(C * D) * sizeof(float));
    if (!R) return QKV_ERR_OUT_OF_MEMORY;
    uint64_t st = c->seed;
    for (int64_t i = 0; i < C * D; i++) R[i] = (float)(rng_normal(&st) / sqrt((double)C));
    s = qkv_sgemm(0, 0, HW, D, C, 1.0f, img->data, C, R, D, c->pos ? 1.0f : 0.0f, feat, D, 0);
    free(R);
    return s;
}

/* Full attention: the query pixel qp's row against every pixel (n_q = 1). */
static qkv_status full_row(int64_t HW, int64_t D, const float *feat, int64_t qp, double scale,
                           float *row) {
    qkv_attn_desc d;
    qkv_attn_desc_init(&d);
    d.batch = 1;
    d.n_q = 1;
    d.n_k = HW;
    d.heads = 1;
    d.dim = D;
    d.dim_v = 1;
    d.scale = scale;
    float *v = malloc((size_t)HW * sizeof(float)), o;
    if (!v) return QKV_ERR_OUT_OF_MEMORY;
    for (int64_t i = 0; i < HW; i++) v[i] = 0.0f;
    qkv_status s = qkv_attention_forward(&d, feat + qp * D, feat, v, &o, row, NULL);
    free(v);
    return s;
}

/* Windowed attention: the crop of the query's window, whose row equals the
 * whole image's; the query's weights scattered into row, *n_keys counted. */
static qkv_status window_row(const config *c, int64_t H, int64_t W, int64_t D, const float *feat,
                             double scale, float *row, int64_t *n_keys) {
    const int64_t r = c->window / 2;
    int64_t y0 = c->qy - r < 0 ? 0 : c->qy - r, y1 = c->qy + r + 1 > H ? H : c->qy + r + 1;
    int64_t x0 = c->qx - r < 0 ? 0 : c->qx - r, x1 = c->qx + r + 1 > W ? W : c->qx + r + 1;
    int64_t ch = y1 - y0, cw = x1 - x0, KK = c->window * c->window;
    float *crop = malloc((size_t)(ch * cw * D) * sizeof(float));
    float *cattn = malloc((size_t)(ch * cw * KK) * sizeof(float));
    float *cout = malloc((size_t)(ch * cw) * sizeof(float));
    float *cv = calloc((size_t)(ch * cw), sizeof(float));
    qkv_status s = QKV_ERR_OUT_OF_MEMORY;
    if (crop && cattn && cout && cv) {
        for (int64_t y = 0; y < ch; y++)
            memcpy(crop + y * cw * D, feat + ((y0 + y) * W + x0) * D, (size_t)(cw * D) * sizeof(float));
        s = qkv_neighborhood2d_forward(ch, cw, 1, D, 1, c->window, scale, 0, crop, crop, cv, cout, cattn);
    }
    if (s == QKV_OK) {
        const float *a = cattn + ((c->qy - y0) * cw + (c->qx - x0)) * KK;
        *n_keys = 0;
        for (int64_t dy = -r; dy <= r; dy++)
            for (int64_t dx = -r; dx <= r; dx++) {
                int64_t y = c->qy + dy, x = c->qx + dx;
                if (y < 0 || y >= H || x < 0 || x >= W) continue;
                row[y * W + x] = a[(dy + r) * c->window + (dx + r)];
                (*n_keys)++;
            }
    }
    free(cv);
    free(crop);
    free(cattn);
    free(cout);
    return s;
}

/* The overlay: the grey image under the heat of row (scaled by its largest
 * weight wmax), the query pixel marked by a cyan cross. */
static void paint(const config *c, const qkv_image *img, const float *row, double wmax,
                  qkv_image *map) {
    const int64_t H = img->height, W = img->width, C = img->channels;
    for (int64_t i = 0; i < H * W; i++) {
        const float *p = img->data + i * C;
        double grey = C >= 3 ? 0.299 * p[0] + 0.587 * p[1] + 0.114 * p[2] : p[0];
        double t = wmax > 0 ? row[i] / wmax : 0.0, alpha = sqrt(t);
        float hc[3];
        heat(t, hc);
        for (int k = 0; k < 3; k++) map->data[i * 3 + k] = (float)((1.0 - alpha) * 0.5 * grey + alpha * hc[k]);
    }
    static const int mark[5][2] = {{0, 0}, {-1, 0}, {1, 0}, {0, -1}, {0, 1}};
    for (int m = 0; m < 5; m++) {
        int64_t y = c->qy + mark[m][0], x = c->qx + mark[m][1];
        if (y < 0 || y >= H || x < 0 || x >= W) continue;
        map->data[(y * W + x) * 3 + 0] = 0.0f;
        map->data[(y * W + x) * 3 + 1] = 1.0f;
        map->data[(y * W + x) * 3 + 2] = 1.0f;
    }
}

static int run(const config *c) {
    char why[256] = "";
    qkv_image img = {0, 0, 0, NULL}, map = {0, 0, 0, NULL};
    float *feat = NULL, *row = NULL;
    int rc = CLI_EXIT_FAIL;
    qkv_status s = qkv_image_load(c->in, &img, why, sizeof why);
    if (s != QKV_OK) {
        cli_error(CMD, NULL, c->in, "%s", why[0] ? why : qkv_status_string(s));
        return CLI_EXIT_FAIL;
    }
    const int64_t H = img.height, W = img.width, C = img.channels, HW = H * W;
    if (c->qx >= W || c->qy >= H) {
        cli_error(CMD, "--query", NULL, "(%lld, %lld) is outside the %lld x %lld image '%s'", (long long)c->qx,
                  (long long)c->qy, (long long)W, (long long)H, c->in);
        qkv_image_free(&img);
        return CLI_EXIT_USAGE;
    }
    const int64_t D = c->dim ? c->dim : C;
    if (HW > INT64_MAX / 8 / D || (uint64_t)HW * (uint64_t)D > SIZE_MAX / sizeof(float)) {
        cli_error(CMD, NULL, c->in, "image too large");
        goto out;
    }
    feat = malloc((size_t)(HW * D) * sizeof(float));
    row = calloc((size_t)HW, sizeof(float));
    s = feat && row ? features(c, &img, D, feat) : QKV_ERR_OUT_OF_MEMORY;
    if (s != QKV_OK) goto fail;
    const double scale = c->has_scale ? c->scale : 1.0 / sqrt((double)D);
    int64_t n_keys = HW;
    s = c->window ? window_row(c, H, W, D, feat, scale, row, &n_keys)
                  : full_row(HW, D, feat, c->qy * W + c->qx, scale, row);
    if (s != QKV_OK) goto fail;
    /* Summary and overlay. */
    double wmax = 0.0, ent = 0.0;
    int64_t amax = 0;
    for (int64_t i = 0; i < HW; i++) {
        if (row[i] > wmax) {
            wmax = row[i];
            amax = i;
        }
        if (row[i] > 0) ent -= row[i] * log2(row[i]);
    }
    s = qkv_image_alloc(&map, H, W, 3);
    if (s != QKV_OK) goto fail;
    paint(c, &img, row, wmax, &map);
    /* Write: the .npy first, then the PNG; a failure removes what was written. */
    if (c->attn) {
        qkv_array arr;
        memset(&arr, 0, sizeof arr);
        arr.dtype = QKV_F32;
        arr.ndim = 2;
        arr.shape[0] = H;
        arr.shape[1] = W;
        arr.data = row;
        s = qkv_npy_save(c->attn, &arr);
        if (s != QKV_OK) {
            cli_error(CMD, "--attn", c->attn, "cannot write: %s", qkv_status_string(s));
            goto out;
        }
    }
    s = qkv_image_save_png(c->out, &map);
    if (s != QKV_OK) {
        cli_error(CMD, "-o", c->out, "cannot write: %s", qkv_status_string(s));
        if (c->attn) unlink(c->attn);
        goto out;
    }
    printf("query (%lld, %lld): %lld keys%s, max weight %.6g at (%lld, %lld), entropy %.4g bits\n",
           (long long)c->qx, (long long)c->qy, (long long)n_keys, c->window ? " (window)" : "", wmax,
           (long long)(amax % W), (long long)(amax / W), ent);
    rc = CLI_EXIT_OK;
    goto out;
fail:
    cli_error(CMD, NULL, c->in, "%s", qkv_status_string(s));
out:
    free(feat);
    free(row);
    qkv_image_free(&img);
    qkv_image_free(&map);
    return rc;
}

int cli_cmd_image(int argc, char **argv) {
    config c;
    int rc = parse_args(argc, argv, &c);
    if (rc != PARSE_CONTINUE) return rc;
    rc = run(&c);
    return cli_flush_stdout(CMD, rc);
}
