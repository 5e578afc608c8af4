/* Settings of a training run, kept with its checkpoint; see train_common.h. */
#include "train_common.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"

unsigned char *train_read_file(const char *cmd, const char *opt, const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        cli_error(cmd, opt, path, "cannot open: %s", strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    unsigned char *buf = malloc(cap);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
        if (n == cap) {
            unsigned char *bigger = cap > ((size_t)1 << 32) ? NULL : realloc(buf, cap * 2);
            if (!bigger) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = bigger;
            cap *= 2;
        }
    }
    int err = ferror(f);
    fclose(f);
    if (!buf || err) {
        free(buf);
        cli_error(cmd, opt, path, err ? "read error" : "out of memory (file larger than 4 GiB?)");
        return NULL;
    }
    *len = n;
    return buf;
}

static qkv_status put_i64(qkv_safetensors *st, const char *key, int64_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%lld", (long long)v);
    return qkv_safetensors_set_meta(st, key, buf);
}

static qkv_status put_f64(qkv_safetensors *st, const char *key, double v) {
    char buf[40];
    snprintf(buf, sizeof buf, "%.17g", v);
    return qkv_safetensors_set_meta(st, key, buf);
}

qkv_status train_run_save(const train_run *r, qkv_safetensors *st) {
    qkv_status s = qkv_safetensors_set_meta(st, "run.task", qkv_task_name(r->task.task));
    if (s == QKV_OK) s = put_i64(st, "run.length", r->task.length);
    if (s == QKV_OK) s = put_i64(st, "run.symbols", r->task.symbols);
    if (s == QKV_OK && r->text_path[0]) s = qkv_safetensors_set_meta(st, "run.text", r->text_path);
    if (s == QKV_OK) s = put_i64(st, "run.batch", r->batch);
    if (s == QKV_OK) s = put_i64(st, "run.steps", r->steps);
    if (s == QKV_OK) s = put_i64(st, "run.warmup", r->warmup);
    if (s == QKV_OK) s = put_i64(st, "run.step", r->step);
    if (s == QKV_OK) s = put_i64(st, "run.seed", (int64_t)r->seed);
    if (s == QKV_OK) s = put_f64(st, "run.lr", r->lr);
    if (s == QKV_OK) s = put_f64(st, "run.min_lr", r->min_lr);
    if (s == QKV_OK) s = put_f64(st, "run.clip", r->clip);
    if (s == QKV_OK) s = put_f64(st, "run.weight_decay", r->weight_decay);
    if (s == QKV_OK && r->cur_length > 0) s = put_i64(st, "run.cur_length", r->cur_length);
    if (s == QKV_OK && r->cur_length > 0) s = put_i64(st, "run.cur_steps", r->cur_steps);
    if (s == QKV_OK && r->cur_length > 0) s = put_f64(st, "run.cur_loss", r->cur_loss);
    return s;
}

static int get_i64(const qkv_safetensors *st, const char *key, int64_t *out) {
    const char *v = qkv_safetensors_get_meta(st, key);
    char *end;
    if (!v) return 0;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (*end || errno) return 0;
    *out = x;
    return 1;
}

static int get_f64(const qkv_safetensors *st, const char *key, double *out) {
    const char *v = qkv_safetensors_get_meta(st, key);
    char *end;
    if (!v) return 0;
    *out = strtod(v, &end);
    return *end == '\0';
}

int train_run_load(const char *cmd, const char *path, const qkv_safetensors *st, train_run *r) {
    memset(r, 0, sizeof *r);
    int task = qkv_task_from_name(qkv_safetensors_get_meta(st, "run.task"));
    int64_t seed = 0;
    if (task < 0 || !get_i64(st, "run.length", &r->task.length) || !get_i64(st, "run.symbols", &r->task.symbols) ||
        !get_i64(st, "run.batch", &r->batch) || !get_i64(st, "run.steps", &r->steps) ||
        !get_i64(st, "run.warmup", &r->warmup) || !get_i64(st, "run.step", &r->step) ||
        !get_i64(st, "run.seed", &seed) || !get_f64(st, "run.lr", &r->lr) || !get_f64(st, "run.min_lr", &r->min_lr) ||
        !get_f64(st, "run.clip", &r->clip) || !get_f64(st, "run.weight_decay", &r->weight_decay)) {
        cli_error(cmd, NULL, path, "not a checkpoint of 'qkv train' (its run settings are missing or damaged)");
        return -1;
    }
    r->task.task = (qkv_task)task;
    r->seed = (uint64_t)seed;
    if (get_i64(st, "run.cur_length", &r->cur_length) &&
        (!get_i64(st, "run.cur_steps", &r->cur_steps) || !get_f64(st, "run.cur_loss", &r->cur_loss) ||
         r->cur_length < 1 || r->cur_length > r->task.length)) {
        cli_error(cmd, NULL, path, "damaged curriculum state (run.cur_*)");
        return -1;
    }
    const char *text = qkv_safetensors_get_meta(st, "run.text");
    if (r->task.task == QKV_TASK_TEXT || r->task.task == QKV_TASK_MLM) {
        if (!text) {
            cli_error(cmd, NULL, path, "text task without its corpus path");
            return -1;
        }
        snprintf(r->text_path, sizeof r->text_path, "%s", text);
        r->text = train_read_file(cmd, "corpus", r->text_path, &r->text_len);
        if (!r->text) return -1;
        r->task.text = r->text;
        r->task.text_len = r->text_len;
    }
    return 0;
}

/* Recall's curriculum: start at 4 pairs; once the loss (an average over the
 * last steps at this length) is below 0.1 nats after at least 50 steps,
 * ask for half as many pairs again, up to task.length. Within the first
 * pairs the model finds the key-matching (induction) circuit, which then
 * carries over to more pairs in a few dozen steps; trained on 16 pairs
 * from the start it stays at chance for thousands of steps. The state is a
 * function of the losses, which are bit-reproducible, and is saved with
 * the checkpoint, so resumed runs follow the same path. */
#define CUR_START 4
#define CUR_MIN_STEPS 50
#define CUR_LOSS 0.1

void train_curriculum_init(train_run *r) {
    r->cur_length = 0;
    r->cur_steps = 0;
    r->cur_loss = 0;
    if (r->task.task == QKV_TASK_RECALL && r->task.length > CUR_START) r->cur_length = CUR_START;
}

void train_curriculum_update(train_run *r, double loss) {
    if (r->cur_length <= 0) return;
    r->cur_loss = r->cur_steps == 0 ? loss : 0.9 * r->cur_loss + 0.1 * loss;
    r->cur_steps++;
    if (r->cur_length < r->task.length && r->cur_steps >= CUR_MIN_STEPS && r->cur_loss < CUR_LOSS) {
        int64_t next = r->cur_length + (r->cur_length + 1) / 2;
        r->cur_length = next < r->task.length ? next : r->task.length;
        r->cur_steps = 0;
        r->cur_loss = 0;
    }
}

void train_run_free(train_run *r) {
    free(r->text);
    r->text = NULL;
}

int train_load_checkpoint(const char *cmd, const char *dir, qkv_safetensors **st, qkv_model **m, train_run *r) {
    char path[2048], why[512];
    snprintf(path, sizeof path, "%s/%s", dir, TRAIN_CKPT_FILE);
    *st = NULL;
    *m = NULL;
    qkv_status s = qkv_safetensors_load(path, st, why, sizeof why);
    if (s != QKV_OK) {
        cli_error(cmd, "--ckpt", path, "%s", why[0] ? why : qkv_status_string(s));
        return -1;
    }
    qkv_model_config cfg;
    if ((s = qkv_model_config_from(*st, &cfg, why, sizeof why)) != QKV_OK ||
        (s = qkv_model_create(&cfg, 0, m)) != QKV_OK || (s = qkv_model_load(*m, *st, why, sizeof why)) != QKV_OK) {
        cli_error(cmd, "--ckpt", path, "%s", why[0] ? why : qkv_status_string(s));
        qkv_model_free(*m);
        qkv_safetensors_free(*st);
        *m = NULL;
        *st = NULL;
        return -1;
    }
    if (train_run_load(cmd, path, *st, r) != 0) {
        qkv_model_free(*m);
        qkv_safetensors_free(*st);
        *m = NULL;
        *st = NULL;
        return -1;
    }
    return 0;
}

int64_t train_parse_tokens(const char *cmd, const char *opt, int bytes, int64_t vocab, const char *text,
                           int32_t *out, int64_t cap) {
    int64_t n = 0;
    if (bytes) {
        for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
            if (n == cap) {
                cli_error(cmd, opt, NULL, "longer than the model's %lld positions", (long long)cap);
                return -1;
            }
            out[n++] = *p;
        }
        return n;
    }
    const char *p = text;
    while (*p) {
        while (*p == ' ') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || errno || v < 0 || v >= vocab || (*end && *end != ' ')) {
            cli_error(cmd, opt, NULL, "'%s': tokens are integers 0..%lld separated by spaces", text,
                      (long long)vocab - 1);
            return -1;
        }
        if (n == cap) {
            cli_error(cmd, opt, NULL, "longer than the model's %lld positions", (long long)cap);
            return -1;
        }
        out[n++] = (int32_t)v;
        p = end;
    }
    return n;
}

int64_t train_parse_prompt(const char *cmd, const train_run *r, int64_t vocab, const char *prompt, int32_t *out,
                           int64_t cap) {
    const int bytes = r->task.task == QKV_TASK_TEXT || r->task.task == QKV_TASK_MLM;
    return train_parse_tokens(cmd, "--prompt", bytes, vocab, prompt, out, cap);
}
