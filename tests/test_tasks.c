/* The generated tasks: shapes, answers that are right by construction,
 * determinism in (seed, index), and errors. */
#include <stdlib.h>
#include <string.h>

#include "support/tasks.h"
#include "test_util.h"

static void check_task(qkv_task task, int64_t L, int64_t S) {
    static const unsigned char text[] = "Hello, I love you! Hello, I love you too. Attention is all you need.";
    qkv_task_spec s = {task, L, S, text, sizeof text - 1};
    int64_t V, N;
    int causal;
    CHECK_STATUS(qkv_task_shape(&s, &V, &N, &causal), QKV_OK);
    enum { B = 8 };
    int32_t *t = malloc((size_t)(B * N) * sizeof(int32_t)), *y = malloc((size_t)(B * N) * sizeof(int32_t));
    int32_t *t2 = malloc((size_t)(B * N) * sizeof(int32_t)), *y2 = malloc((size_t)(B * N) * sizeof(int32_t));
    CHECK_STATUS(qkv_task_batch(&s, 7, 3, B, t, y), QKV_OK);
    CHECK_STATUS(qkv_task_batch(&s, 7, 3, B, t2, y2), QKV_OK);
    CHECK(!memcmp(t, t2, (size_t)(B * N) * sizeof(int32_t)) && !memcmp(y, y2, (size_t)(B * N) * sizeof(int32_t)),
          "%s: a batch is a function of (seed, index)", qkv_task_name(task));
    CHECK_STATUS(qkv_task_batch(&s, 7, 4, B, t2, y2), QKV_OK);
    CHECK(memcmp(t, t2, (size_t)(B * N) * sizeof(int32_t)) != 0, "%s: another index, another batch", qkv_task_name(task));
    int ok = 1, targeted = 0;
    for (int64_t b = 0; b < B; b++) {
        const int32_t *tk = t + b * N, *tg = y + b * N;
        for (int64_t i = 0; i < N; i++) {
            ok &= tk[i] >= 0 && tk[i] < V && tg[i] >= -1 && tg[i] < V;
            targeted += tg[i] >= 0;
            if (causal && tg[i] >= 0 && task != QKV_TASK_RECALL && i + 1 < N) ok &= tg[i] == tk[i + 1];
        }
        if (task == QKV_TASK_COPY)
            for (int64_t i = 0; i < L; i++) ok &= tk[L + 1 + i] == tk[i];
        if (task == QKV_TASK_REVERSE)
            for (int64_t i = 0; i < L; i++) ok &= tk[L + 1 + i] == tk[L - 1 - i];
        if (task == QKV_TASK_SORT) {
            int64_t sum_in = 0, sum_out = 0;
            for (int64_t i = 0; i < L; i++) sum_in += tk[i], sum_out += tk[L + 1 + i];
            for (int64_t i = 1; i < L; i++) ok &= tk[L + i] <= tk[L + 1 + i];
            ok &= sum_in == sum_out;
        }
        if (task == QKV_TASK_RECALL) { /* pairs, SEP, every key once as a query -> its value */
            ok &= N == 3 * L + 1 && tk[2 * L] == 2 * S;
            for (int64_t q = 2 * L + 1; q < N; q++) {
                int found = 0;
                for (int64_t i = 0; i < L; i++)
                    if (tk[2 * i] == tk[q]) found++, ok &= tk[2 * i + 1] == tg[q];
                for (int64_t r = 2 * L + 1; r < q; r++) ok &= tk[r] != tk[q];
                ok &= found == 1;
            }
            for (int64_t i = 0; i <= 2 * L; i++) ok &= tg[i] == -1;
        }
        if (task == QKV_TASK_MLM)
            for (int64_t i = 0; i < N; i++) ok &= (tg[i] >= 0) == (tk[i] == 256);
    }
    CHECK(ok, "%s: tokens and targets are right by construction", qkv_task_name(task));
    CHECK(targeted > 0, "%s: some positions have targets", qkv_task_name(task));
    CHECK(qkv_task_from_name(qkv_task_name(task)) == (int)task, "%s: name round trip", qkv_task_name(task));
    free(t);
    free(y);
    free(t2);
    free(y2);
}

int main(void) {
    check_task(QKV_TASK_COPY, 32, 16);
    check_task(QKV_TASK_REVERSE, 7, 5);
    check_task(QKV_TASK_SORT, 12, 10);
    check_task(QKV_TASK_RECALL, 16, 32);
    check_task(QKV_TASK_TEXT, 16, 0);
    check_task(QKV_TASK_MLM, 32, 0);
    check_task(QKV_TASK_LABEL, 12, 9);
    qkv_task_spec s = {QKV_TASK_RECALL, 20, 16, NULL, 0};
    CHECK_STATUS(qkv_task_shape(&s, NULL, NULL, NULL), QKV_ERR_BAD_SIZE);
    s.task = QKV_TASK_TEXT;
    CHECK_STATUS(qkv_task_shape(&s, NULL, NULL, NULL), QKV_ERR_NULL_POINTER);
    s.task = (qkv_task)77;
    CHECK_STATUS(qkv_task_shape(&s, NULL, NULL, NULL), QKV_ERR_BAD_ENUM);
    s.task = QKV_TASK_COPY;
    s.length = 0;
    CHECK_STATUS(qkv_task_shape(&s, NULL, NULL, NULL), QKV_ERR_BAD_SIZE);
    CHECK(qkv_task_from_name("nope") == -1, "unknown task name");
    return tu_finish();
}
