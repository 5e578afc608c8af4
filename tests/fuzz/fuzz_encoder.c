/* libFuzzer target: the encoder's model directory (include/qkv/encoder.h).
 * The first byte chooses which JSON file the rest of the input is -
 * config.json, modules.json, 1_Pooling/config.json or
 * sentence_bert_config.json - beside fixed valid others, a vocab and a
 * generated model.safetensors (hidden 4, 1 layer, 2 heads, intermediate
 * 8). Checked: loading returns QKV_OK or a documented error with a reason;
 * on success a text embeds. Always: nothing left allocated. */
#define _POSIX_C_SOURCE 200809L /* getpid, mkdir */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz.h"
#include "fuzz_check.h"
#include "qkv.h"

static const char k_vocab[] = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\n,\n!\n##s\n";
static const char k_config[] =
    "{\"model_type\": \"bert\", \"hidden_size\": 4, \"num_hidden_layers\": 1, \"num_attention_heads\": 2,"
    " \"intermediate_size\": 8, \"hidden_act\": \"gelu\", \"layer_norm_eps\": 1e-12,"
    " \"max_position_embeddings\": 8, \"type_vocab_size\": 2, \"vocab_size\": 10,"
    " \"position_embedding_type\": \"absolute\"}";
static const char k_modules[] = "[{\"type\": \"sentence_transformers.models.Normalize\"}]";
static const char k_pooling[] = "{\"pooling_mode_mean_tokens\": true}";
static const char k_sbert[] = "{\"max_seq_length\": 6}";

static void put(const char *dir, const char *name, const void *data, size_t len) {
    char path[200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fwrite(data, 1, len, f);
    fclose(f);
}

static void put_weights(const char *dir) {
    static const struct {
        const char *name;
        int64_t d0, d1;
    } t[] = {{"embeddings.word_embeddings.weight", 10, 4}, {"embeddings.position_embeddings.weight", 8, 4},
             {"embeddings.token_type_embeddings.weight", 2, 4}, {"embeddings.LayerNorm.weight", 4, 0},
             {"embeddings.LayerNorm.bias", 4, 0}, {"encoder.layer.0.attention.self.query.weight", 4, 4},
             {"encoder.layer.0.attention.self.query.bias", 4, 0}, {"encoder.layer.0.attention.self.key.weight", 4, 4},
             {"encoder.layer.0.attention.self.key.bias", 4, 0}, {"encoder.layer.0.attention.self.value.weight", 4, 4},
             {"encoder.layer.0.attention.self.value.bias", 4, 0}, {"encoder.layer.0.attention.output.dense.weight", 4, 4},
             {"encoder.layer.0.attention.output.dense.bias", 4, 0},
             {"encoder.layer.0.attention.output.LayerNorm.weight", 4, 0},
             {"encoder.layer.0.attention.output.LayerNorm.bias", 4, 0},
             {"encoder.layer.0.intermediate.dense.weight", 8, 4}, {"encoder.layer.0.intermediate.dense.bias", 8, 0},
             {"encoder.layer.0.output.dense.weight", 4, 8}, {"encoder.layer.0.output.dense.bias", 4, 0},
             {"encoder.layer.0.output.LayerNorm.weight", 4, 0}, {"encoder.layer.0.output.LayerNorm.bias", 4, 0}};
    qkv_safetensors *st = NULL;
    if (qkv_safetensors_create(&st) != QKV_OK) return;
    float buf[64];
    for (int i = 0; i < 64; i++) buf[i] = (float)((i * 37) % 17) / 17.0f - 0.4f;
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        qkv_array a;
        memset(&a, 0, sizeof a);
        a.dtype = QKV_F32;
        a.ndim = t[i].d1 ? 2 : 1;
        a.shape[0] = t[i].d0;
        a.shape[1] = t[i].d1;
        a.data = buf;
        qkv_safetensors_put(st, t[i].name, &a);
    }
    char path[200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    qkv_safetensors_save(st, path);
    qkv_safetensors_free(st);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_reader r = {data, size};
    int which = fuzz_u8(&r) % 4;
    char dir[96], sub[128];
    snprintf(dir, sizeof dir, "/tmp/qkv_fuzz_encoder.%ld", (long)getpid());
    snprintf(sub, sizeof sub, "%s/1_Pooling", dir);
    mkdir(dir, 0700); /* may be left from a crash: reused */
    mkdir(sub, 0700);
    put(dir, "vocab.txt", k_vocab, sizeof k_vocab - 1);
    put_weights(dir);
    put(dir, "config.json", which == 0 ? (const void *)r.p : k_config, which == 0 ? r.n : sizeof k_config - 1);
    put(dir, "modules.json", which == 1 ? (const void *)r.p : k_modules, which == 1 ? r.n : sizeof k_modules - 1);
    put(dir, "1_Pooling/config.json", which == 2 ? (const void *)r.p : k_pooling,
        which == 2 ? r.n : sizeof k_pooling - 1);
    put(dir, "sentence_bert_config.json", which == 3 ? (const void *)r.p : k_sbert,
        which == 3 ? r.n : sizeof k_sbert - 1);

    qkv_encoder *enc = (qkv_encoder *)&enc;
    char why[300] = "";
    qkv_status s = qkv_encoder_load(dir, NULL, &enc, why, sizeof why);
    if (s == QKV_OK) {
        const char *text[1] = {"hello, worlds!"};
        float out[4096];
        qkv_encoder_info info;
        qkv_encoder_get_info(enc, &info);
        if (info.hidden <= 4096) {
            s = qkv_encoder_embed(enc, text, NULL, 1, QKV_POOLING_FROM_MODEL, -1, out, why, sizeof why);
            FUZZ_CHECK(s == QKV_OK, "embed: status %d (%s)", (int)s, why);
        }
        qkv_encoder_free(enc);
    } else {
        FUZZ_CHECK(s == QKV_ERR_FORMAT || s == QKV_ERR_UNSUPPORTED || s == QKV_ERR_SHAPE ||
                       s == QKV_ERR_OUT_OF_MEMORY,
                   "load: status %d (%s)", (int)s, why);
        FUZZ_CHECK(enc == NULL && why[0] != '\0', "load: failure without a reason");
    }
    static const char *const files[] = {"vocab.txt", "model.safetensors", "config.json", "modules.json",
                                        "1_Pooling/config.json", "sentence_bert_config.json"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char path[200];
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        remove(path);
    }
    rmdir(sub);
    rmdir(dir);
    FUZZ_CHECK(qkv_memory_in_use() == 0, "%zu bytes still allocated", qkv_memory_in_use());
    return 0;
}
