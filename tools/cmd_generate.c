/* qkv generate: continue a prompt with a trained decoder, token by token,
 * through the model's KV caches (each new token costs one step, the past is
 * never recomputed). Sampling: temperature and top-k from a seeded
 * generator; temperature 0 is greedy. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_util.h"
#include "core/rng.h"
#include "qkv.h"
#include "train_common.h"

#define CMD "generate"

/* Pick a token from logits z [V]: greedy at temperature 0, else softmax(z/T)
 * restricted to the top k (k = 0: all). */
static int32_t sample(const float *z, int64_t V, double temp, int64_t k, uint64_t *rng, double *w) {
    int64_t best = 0;
    for (int64_t v = 1; v < V; v++)
        if (z[v] > z[best]) best = v;
    if (temp <= 0) return (int32_t)best;
    double kth = -INFINITY;
    if (k > 0 && k < V) { /* the k-th largest logit, by repeated max (V is small) */
        double prev = INFINITY;
        for (int64_t r = 0; r < k; r++) {
            double mx = -INFINITY;
            for (int64_t v = 0; v < V; v++)
                if (z[v] < prev && z[v] > mx) mx = z[v];
            prev = mx;
        }
        kth = prev;
    }
    double sum = 0;
    for (int64_t v = 0; v < V; v++) {
        w[v] = z[v] >= kth ? exp((z[v] - z[best]) / temp) : 0.0;
        sum += w[v];
    }
    double u = splitmix64_unit(rng) * sum;
    for (int64_t v = 0; v < V; v++) {
        u -= w[v];
        if (u < 0) return (int32_t)v;
    }
    return (int32_t)best;
}

int cli_cmd_generate(int argc, char **argv) {
    static const cli_opt opts[] = {
        {"--help", "-h", 0, 0},       {"--ckpt", NULL, 1, 1},   {"--prompt", NULL, 1, 2}, {"--tokens", NULL, 1, 3},
        {"--temperature", NULL, 1, 4}, {"--top-k", NULL, 1, 5}, {"--seed", NULL, 1, 6},
        {"--kv-cache", NULL, 1, 7},
    };
    cli_args a = {.cmd = CMD, .argc = argc, .argv = argv, .i = 1};
    const char *ckpt = NULL, *prompt = NULL, *name, *val;
    int64_t ntok = 64, topk = 0, seed = 1;
    double temp = 1.0;
    qkv_kv_storage kv = QKV_KV_F32;
    const char *kv_name = "f32";
    int id;
    while ((id = cli_next(&a, opts, sizeof opts / sizeof opts[0], &name, &val)) != CLI_END) {
        if (id == CLI_ERROR) return CLI_EXIT_USAGE;
        switch (id) {
        case 0:
            fputs("Usage: qkv generate --ckpt DIR --prompt TEXT [--tokens N] [--temperature T]\n"
                  "                    [--top-k K] [--seed S] [--kv-cache f32|bf16|int8]\n\n"
                  "Continues the prompt with a decoder trained by 'qkv train', one token at a\n"
                  "time through the KV cache. Text models read and write bytes; models of the\n"
                  "generated tasks read and write tokens as integers separated by spaces.\n"
                  "  --tokens N       new tokens (64; at most the model's length minus the prompt)\n"
                  "  --temperature T  1 = the model's distribution, 0 = always the likeliest\n"
                  "  --top-k K        sample among the K likeliest only (0: all)\n"
                  "  --seed S         the sampler's seed (1)\n"
                  "  --kv-cache TYPE  f32 (default), bf16 (half the memory) or int8 (about a\n"
                  "                   quarter: blocks of 32 values with one float32 scale);\n"
                  "                   bf16/int8 change the logits slightly (docs/HALF.md)\n",
                  stdout);
            return CLI_EXIT_OK;
        case 1: ckpt = val; break;
        case 2: prompt = val; break;
        case 3: if (cli_parse_int64(CMD, name, val, 0, 1 << 24, &ntok)) return CLI_EXIT_USAGE; break;
        case 4:
            if (cli_parse_double(CMD, name, val, &temp)) return CLI_EXIT_USAGE;
            if (!(temp >= 0 && temp <= 100)) {
                cli_error(CMD, name, NULL, "'%s' must be in [0, 100]", val);
                return CLI_EXIT_USAGE;
            }
            break;
        case 5: if (cli_parse_int64(CMD, name, val, 0, 1 << 24, &topk)) return CLI_EXIT_USAGE; break;
        case 6: if (cli_parse_int64(CMD, name, val, 0, INT64_MAX, &seed)) return CLI_EXIT_USAGE; break;
        case 7:
            if (strcmp(val, "f32") == 0 || strcmp(val, "float32") == 0) kv = QKV_KV_F32;
            else if (strcmp(val, "bf16") == 0 || strcmp(val, "bfloat16") == 0) kv = QKV_KV_BF16;
            else if (strcmp(val, "int8") == 0) kv = QKV_KV_INT8;
            else {
                cli_error(CMD, name, NULL, "unknown cache type '%s' (expected f32, bf16 or int8)", val);
                return CLI_EXIT_USAGE;
            }
            kv_name = val;
            break;
        }
    }
    if (!ckpt || !prompt) {
        cli_error(CMD, NULL, NULL, "%s is required", !ckpt ? "--ckpt" : "--prompt");
        cli_usage_hint(CMD);
        return CLI_EXIT_USAGE;
    }
    qkv_safetensors *st;
    qkv_model *m;
    train_run r;
    if (train_load_checkpoint(CMD, ckpt, &st, &m, &r) != 0) return CLI_EXIT_FAIL;
    const qkv_model_config *c = qkv_model_get_config(m);
    int rc = CLI_EXIT_FAIL;
    int text = r.task.task == QKV_TASK_TEXT;
    int32_t *tokens = malloc((size_t)c->max_seq * sizeof(int32_t));
    float *logits = malloc((size_t)(c->max_seq * c->vocab) * sizeof(float));
    double *w = malloc((size_t)c->vocab * sizeof(double));
    int64_t n = -1;
    if (!c->causal) {
        cli_error(CMD, "--ckpt", ckpt, "a %s model is an encoder: it fills in, it does not continue text",
                  qkv_task_name(r.task.task));
        goto done;
    }
    if (!tokens || !logits || !w) {
        cli_error(CMD, NULL, NULL, "out of memory");
        goto done;
    }
    n = train_parse_prompt(CMD, &r, c->vocab, prompt, tokens, c->max_seq);
    if (n < 0) goto done;
    if (n == 0) {
        cli_error(CMD, "--prompt", NULL, "is empty");
        goto done;
    }
    if (ntok > c->max_seq - n) {
        cli_error(CMD, "--tokens", NULL, "%lld new tokens after %lld of prompt exceed the model's %lld positions",
                  (long long)ntok, (long long)n, (long long)c->max_seq);
        goto done;
    }
    qkv_status s = qkv_model_decode_begin_typed(m, n + ntok > 0 ? n + ntok : 1, kv);
    if (s == QKV_ERR_UNSUPPORTED) {
        cli_error(CMD, "--kv-cache", NULL,
                  "%s caches do not serve this model's attention (they need the scaled-dot score "
                  "and softmax, without T5 relative biases): use --kv-cache f32",
                  kv_name);
        goto done;
    }
    /* The prompt in one step, then one token per step. */
    if (s == QKV_OK) s = qkv_model_decode_step(m, n, tokens, logits);
    uint64_t rng = (uint64_t)seed;
    fputs(prompt, stdout);
    for (int64_t i = 0; i < ntok && s == QKV_OK; i++) {
        int32_t next = sample(logits + (i == 0 ? n - 1 : 0) * c->vocab, c->vocab, temp, topk, &rng, w);
        if (text) putchar(next);
        else printf(" %d", next);
        tokens[n + i] = next;
        if (i + 1 < ntok) s = qkv_model_decode_step(m, 1, &tokens[n + i], logits);
    }
    putchar('\n');
    if (s != QKV_OK) {
        cli_error(CMD, NULL, NULL, "decoding: %s", qkv_status_string(s));
        goto done;
    }
    rc = CLI_EXIT_OK;
done:
    free(tokens);
    free(logits);
    free(w);
    qkv_model_free(m);
    qkv_safetensors_free(st);
    train_run_free(&r);
    return rc;
}
