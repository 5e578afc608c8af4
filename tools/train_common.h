/* What qkv train, eval, generate and show share: the training run's
 * settings (stored in the checkpoint's metadata so a run can be resumed and
 * a model evaluated without repeating them), reading a text corpus, and
 * loading a checkpoint folder. */
#ifndef QKV_TRAIN_COMMON_H
#define QKV_TRAIN_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "qkv.h"
#include "support/tasks.h"

/* The file of a checkpoint inside its folder. */
#define TRAIN_CKPT_FILE "model.safetensors"

typedef struct train_run {
    qkv_task_spec task;       /* task.text points into text below */
    char text_path[1024];     /* TEXT/MLM corpus ("" otherwise) */
    unsigned char *text;      /* owned */
    size_t text_len;
    int64_t batch, steps, warmup, step; /* step: steps done so far */
    double lr, min_lr, clip, weight_decay;
    uint64_t seed;
    /* Curriculum (recall): the task length trained now, grown up to
     * task.length as the loss at the current length falls (0: none), with
     * the loss average at this length and the steps spent at it. */
    int64_t cur_length, cur_steps;
    double cur_loss;
} train_run;

/* The curriculum of a new run (train_common.c says how it grows), and its
 * update after a step with the whole batch's loss. */
void train_curriculum_init(train_run *r);
void train_curriculum_update(train_run *r, double loss);

/* Read a whole file (for corpora). Returns NULL and prints a message naming
 * the option and file on failure. */
unsigned char *train_read_file(const char *cmd, const char *opt, const char *path, size_t *len);

/* Store / read the run's settings as safetensors metadata ("run.*"). */
qkv_status train_run_save(const train_run *r, qkv_safetensors *st);
/* Returns 0, or -1 after printing why (naming cmd and path). Loads the
 * corpus again from its stored path for text tasks. */
int train_run_load(const char *cmd, const char *path, const qkv_safetensors *st, train_run *r);
void train_run_free(train_run *r);

/* Load DIR/model.safetensors: the set, the model and the run. Returns 0 or
 * -1 after printing why. The caller frees all three. */
int train_load_checkpoint(const char *cmd, const char *dir, qkv_safetensors **st, qkv_model **m, train_run *r);

/* Tokens of a text given by option opt: its bytes (bytes != 0), else
 * space-separated integers below vocab; at most cap of them. Returns the
 * count (0 for a text of blanks), or -1 after printing why. */
int64_t train_parse_tokens(const char *cmd, const char *opt, int bytes, int64_t vocab, const char *text,
                           int32_t *out, int64_t cap);

/* Tokens of a prompt (train_parse_tokens for --prompt): bytes for text tasks, else space-separated integers
 * below vocab. Returns the count, or -1 after printing why. */
int64_t train_parse_prompt(const char *cmd, const train_run *r, int64_t vocab, const char *prompt, int32_t *out,
                           int64_t cap);

#endif
