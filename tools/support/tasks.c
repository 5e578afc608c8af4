/* Synthetic tasks for training and evaluating transformers: each batch is a
 * pure function of (spec, seed, index), so training, resuming and
 * evaluating see exactly the data they should. */
#include <string.h>

#include "core/internal.h"
#include "core/rng.h"
#include "support/tasks.h"

static const char *const NAMES[] = {"copy", "reverse", "sort", "recall", "text", "label", "mlm"};

const char *qkv_task_name(qkv_task task) {
    return (unsigned)task < sizeof NAMES / sizeof NAMES[0] ? NAMES[task] : "unknown";
}

int qkv_task_from_name(const char *name) {
    if (!name) return -1;
    for (int i = 0; i < (int)(sizeof NAMES / sizeof NAMES[0]); i++)
        if (!strcmp(name, NAMES[i])) return i;
    return -1;
}

static int64_t symbols_of(const qkv_task_spec *s) { return s->symbols ? s->symbols : 16; }

qkv_status qkv_task_shape(const qkv_task_spec *s, int64_t *vocab, int64_t *n, int *causal) {
    if (!s) return QKV_ERR_NULL_POINTER;
    int64_t L = s->length, S = symbols_of(s), V, N;
    if (L < 1 || L > (1 << 20) || S < 2 || S > (1 << 16)) return QKV_ERR_BAD_SIZE;
    int c = 1;
    switch (s->task) {
    case QKV_TASK_COPY:
    case QKV_TASK_REVERSE:
    case QKV_TASK_SORT: V = S + 1; N = 2 * L + 1; break;
    case QKV_TASK_RECALL:
        if (L > S || S > 4096) return QKV_ERR_BAD_SIZE; /* keys are distinct */
        V = 2 * S + 1;
        N = 3 * L + 1;
        break;
    case QKV_TASK_TEXT:
    case QKV_TASK_MLM:
        if (!s->text) return QKV_ERR_NULL_POINTER;
        if (s->text_len < (size_t)L + 2) return QKV_ERR_BAD_SIZE;
        V = s->task == QKV_TASK_TEXT ? 256 : 257;
        N = L;
        c = s->task == QKV_TASK_TEXT;
        break;
    case QKV_TASK_LABEL:
        if (S < 4) return QKV_ERR_BAD_SIZE; /* four labels live in the vocabulary */
        V = S;
        N = L;
        c = 0;
        break;
    default: return QKV_ERR_BAD_ENUM;
    }
    if (vocab) *vocab = V;
    if (n) *n = N;
    if (causal) *causal = c;
    return QKV_OK;
}

static int64_t below(uint64_t *z, int64_t n) { return (int64_t)(splitmix64_next(z) % (uint64_t)n); }

/* The LABEL task's classes: word w has class w % 3 (0 noun, 1 verb, 2 other),
 * but a verb in the first two positions of the sentence is read as a noun,
 * and a noun right after a verb as "object" (3). Needs position and context. */
static int32_t label_of(const int32_t *w, int64_t i) {
    int32_t c = w[i] % 3;
    if (c == 1 && i < 2) return 0;
    if (c == 0 && i > 0 && w[i - 1] % 3 == 1 && i - 1 >= 2) return 3;
    return c;
}

qkv_status qkv_task_batch(const qkv_task_spec *s, uint64_t seed, int64_t index, int64_t batch, int32_t *tokens,
                          int32_t *targets) {
    if (!tokens || !targets) return QKV_ERR_NULL_POINTER;
    int64_t V, N;
    int causal;
    qkv_status st = qkv_task_shape(s, &V, &N, &causal);
    if (st != QKV_OK) return st;
    if (batch <= 0 || index < 0) return QKV_ERR_BAD_SIZE;
    const int64_t L = s->length, S = symbols_of(s);
    for (int64_t b = 0; b < batch; b++) {
        uint64_t z = seed * 0x100000001B3ull ^ ((uint64_t)index * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)b << 32);
        splitmix64_next(&z);
        int32_t *t = tokens + b * N, *y = targets + b * N;
        for (int64_t i = 0; i < N; i++) y[i] = -1;
        switch (s->task) {
        case QKV_TASK_COPY:
        case QKV_TASK_REVERSE:
        case QKV_TASK_SORT: {
            for (int64_t i = 0; i < L; i++) t[i] = (int32_t)below(&z, S);
            t[L] = (int32_t)S; /* separator */
            for (int64_t i = 0; i < L; i++) t[L + 1 + i] = s->task == QKV_TASK_REVERSE ? t[L - 1 - i] : t[i];
            if (s->task == QKV_TASK_SORT) { /* counting sort of the answer */
                int64_t at = L + 1;
                for (int32_t v = 0; v < S; v++)
                    for (int64_t i = 0; i < L; i++)
                        if (t[i] == v) t[at++] = v;
            }
            for (int64_t i = L; i < N - 1; i++) y[i] = t[i + 1];
            break;
        }
        case QKV_TASK_RECALL: {
            /* L distinct keys (partial Fisher-Yates over S), random values;
             * then every key once more, in a fresh random order, each
             * position's target the value paired with it. Each query is the
             * single-query task (pairs, SEP, a key -> its value) with the
             * earlier queries in between; asking all L keys gives L targets
             * per sequence instead of one, which is what lets the model find
             * the key-matching circuit in minutes (one target per sequence
             * stayed at chance for thousands of steps, docs/TRAINING.md). */
            int32_t keys[4096];
            for (int64_t i = 0; i < S; i++) keys[i] = (int32_t)i;
            for (int64_t i = 0; i < L; i++) {
                int64_t j = i + below(&z, S - i);
                int32_t k = keys[i];
                keys[i] = keys[j];
                keys[j] = k;
                t[2 * i] = keys[i];
                t[2 * i + 1] = (int32_t)(S + below(&z, S));
            }
            t[2 * L] = (int32_t)(2 * S);
            int32_t order[4096];
            for (int64_t i = 0; i < L; i++) order[i] = (int32_t)i;
            for (int64_t i = 0; i < L; i++) {
                int64_t j = i + below(&z, L - i);
                int32_t k = order[i];
                order[i] = order[j];
                order[j] = k;
                t[2 * L + 1 + i] = t[2 * order[i]];
                y[2 * L + 1 + i] = t[2 * order[i] + 1];
            }
            break;
        }
        case QKV_TASK_TEXT:
        case QKV_TASK_MLM: {
            size_t at = (size_t)below(&z, (int64_t)(s->text_len - (size_t)L - 1));
            for (int64_t i = 0; i < L; i++) t[i] = s->text[at + (size_t)i];
            if (s->task == QKV_TASK_TEXT) {
                for (int64_t i = 0; i < L; i++) y[i] = s->text[at + (size_t)i + 1];
            } else {
                for (int64_t i = 0; i < L; i++)
                    if (below(&z, 100) < 15) {
                        y[i] = t[i];
                        t[i] = 256;
                    }
            }
            break;
        }
        case QKV_TASK_LABEL:
            for (int64_t i = 0; i < L; i++) t[i] = (int32_t)below(&z, S);
            for (int64_t i = 0; i < L; i++) y[i] = label_of(t, i);
            break;
        }
    }
    return QKV_OK;
}
