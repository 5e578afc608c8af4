/* libFuzzer target: loading a checkpoint (the model.safetensors that
 * `qkv train` writes): qkv_safetensors_parse, then the stored configuration
 * (qkv_model_config_from), then a model of that configuration and
 * qkv_model_load of the weights - every step on untrusted bytes. A
 * configuration may ask for any size, so the model is created under
 * qkv_set_memory_limit (64 MiB): a huge one must be refused cleanly.
 * Findings beyond memory errors and UB: undocumented statuses, a failure
 * without a reason, a loaded model whose configuration differs from the
 * stored one, a model that cannot run a forward pass after a load. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "fuzz_check.h"
#include "qkv.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    qkv_safetensors *st = NULL;
    char why[256];
    if (qkv_safetensors_parse(data, size, &st, why, sizeof why) != QKV_OK) return 0;
    qkv_model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    why[0] = '\0';
    qkv_status s = qkv_model_config_from(st, &cfg, why, sizeof why);
    if (s != QKV_OK) {
        FUZZ_CHECK(s != QKV_ERR_NULL_POINTER, "config_from: NULL_POINTER on valid arguments");
        FUZZ_CHECK(why[0] != '\0', "config_from failed (%d) without a reason", (int)s);
        qkv_safetensors_free(st);
        return 0;
    }
    qkv_model *m = NULL;
    qkv_set_memory_limit((size_t)64 << 20);
    s = qkv_model_create(&cfg, 1, &m);
    if (s == QKV_OK) {
        why[0] = '\0';
        qkv_status l = qkv_model_load(m, st, why, sizeof why);
        if (getenv("QKV_FUZZ_VERBOSE"))
            fprintf(stderr, "fuzz_checkpoint: V %lld E %lld H %lld L %lld: load %d %s\n",
                    (long long)cfg.vocab, (long long)cfg.dim, (long long)cfg.heads,
                    (long long)cfg.layers, (int)l, l == QKV_OK ? "" : why);
        FUZZ_CHECK(l == QKV_OK || why[0] != '\0', "load failed (%d) without a reason", (int)l);
        if (l == QKV_OK) {
            const qkv_model_config *got = qkv_model_get_config(m);
            FUZZ_CHECK(got && got->vocab == cfg.vocab && got->dim == cfg.dim &&
                           got->layers == cfg.layers && got->heads == cfg.heads,
                       "loaded model's configuration differs");
            /* One short forward pass on token 0 (bounded by max_seq). */
            int32_t tok[4] = {0, 1 % (int32_t)cfg.vocab, 0, 1 % (int32_t)cfg.vocab};
            int64_t n = cfg.max_seq < 4 ? cfg.max_seq : 4;
            if (n >= 1) {
                double loss = 0.0;
                qkv_status f = qkv_model_forward(m, 1, n, tok, tok, 0, NULL, &loss);
                FUZZ_CHECK(f == QKV_OK || f == QKV_ERR_OUT_OF_MEMORY || f == QKV_ERR_MEMORY_LIMIT,
                           "forward after a successful load: %d", (int)f);
            }
        }
        qkv_model_free(m);
    } else {
        FUZZ_CHECK(m == NULL, "failed create returned a model");
    }
    qkv_set_memory_limit(0);
    qkv_safetensors_free(st);
    FUZZ_CHECK(qkv_memory_in_use() == 0, "%zu bytes still held after freeing everything",
               qkv_memory_in_use());
    return 0;
}
