/* The training tasks of the command-line tool (qkv train, qkv experiment,
 * qkv generate, the demo): not part of the library; built into the CLI's
 * support library (tools/support), which the CLI and its tests link. */
#ifndef QKV_TOOLS_TASKS_H
#define QKV_TOOLS_TASKS_H

#include <stddef.h>
#include <stdint.h>

#include "qkv.h"

/* Training tasks that need attention, generated on the fly from (seed,
 * index): the same arguments give the same batch on every machine.
 *
 * Decoder tasks (causal): the input, a separator, then the answer; targets
 * are the next tokens of the answer (-1 elsewhere):
 *   COPY     x_1..x_L SEP x_1..x_L            REVERSE  ... SEP x_L..x_1
 *   SORT     ... SEP sorted(x)                RECALL   k_1 v_1 .. k_P v_P SEP q_1 .. q_P
 *   TEXT     bytes of a text window, next-byte prediction (vocab 256)
 * RECALL's keys are distinct (keys 0..S-1, values S..2S-1, SEP 2S, n = 3P+1);
 * the queries q_j are its keys again in a random order, and the target at
 * q_j is the value paired with it (every query is the single-query task).
 * Encoder tasks (bidirectional): a target at every position:
 *   LABEL    word classes where a word's label depends on its position (the
 *            articles' part-of-speech example: at the start of a sentence a
 *            word that is otherwise a verb is a noun)
 *   MLM      BERT-style masked bytes of a text (15% replaced by MASK = 256;
 *            targets only there; vocab 257) */
typedef enum qkv_task {
    QKV_TASK_COPY = 0,
    QKV_TASK_REVERSE = 1,
    QKV_TASK_SORT = 2,
    QKV_TASK_RECALL = 3,
    QKV_TASK_TEXT = 4,
    QKV_TASK_LABEL = 5,
    QKV_TASK_MLM = 6
} qkv_task;

typedef struct qkv_task_spec {
    qkv_task task;
    int64_t length;          /* L: sequence to copy/sort, pairs P for RECALL, window for TEXT/MLM/LABEL */
    int64_t symbols;         /* alphabet size of the content (0: 16; RECALL keys and values each) */
    const unsigned char *text;   /* TEXT, MLM: the corpus (borrowed) */
    size_t text_len;
} qkv_task_spec;

/* Vocabulary size, total sequence length n, and whether the task is causal.
 * Errors: QKV_ERR_NULL_POINTER, QKV_ERR_BAD_SIZE (length or symbols out of
 * range, text shorter than a window + 1), QKV_ERR_BAD_ENUM. */
qkv_status qkv_task_shape(const qkv_task_spec *spec, int64_t *vocab, int64_t *n, int *causal);

/* Fill tokens and targets [batch, n] for batch number `index`. */
qkv_status qkv_task_batch(const qkv_task_spec *spec, uint64_t seed, int64_t index, int64_t batch, int32_t *tokens,
                          int32_t *targets);

/* A readable name ("copy", ...) and the task of a name (-1 if none). */
const char *qkv_task_name(qkv_task task);
int qkv_task_from_name(const char *name);

#endif /* QKV_TOOLS_TASKS_H */
