/* libFuzzer target: the argument parsing of `qkv attend`.
 *
 * The subcommand's parser (parse_args in tools/cmd_attend.c) is static and
 * has no side effects but messages (it only fills a config: no file is
 * opened before it returns), while cli_cmd_attend would go on to read and
 * write the files the arguments name. So this file includes cmd_attend.c
 * itself and calls parse_args directly: the fuzzer reaches the real parser,
 * the option scanner (tools/cli_util.c) and the number parsers, and nothing
 * ever touches the file system.
 *
 * Input: argument strings separated by NUL bytes (at most 64 of them), after
 * the subcommand's name. Findings beyond memory errors: a status other than
 * 0, 2 or "continue"; a continuing parse without --q/--k/--v, with two
 * outputs on one file, or with a descriptor the library calls malformed
 * (bad enum, window) once sizes are set. */
#include "../../tools/cmd_attend.c"

#include "fuzz.h"
#include "fuzz_check.h"

#define MAX_ARGS 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *buf = malloc(size + 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    buf[size] = '\0';
    char name[] = "attend";
    char *argv[MAX_ARGS + 2];
    int argc = 0;
    argv[argc++] = name;
    size_t start = 0;
    for (size_t i = 0; i <= size && argc <= MAX_ARGS; i++) {
        if (buf[i] == '\0') {
            if (i > start || i < size) argv[argc++] = buf + start;
            start = i + 1;
        }
    }
    argv[argc] = NULL;

    config c;
    int rc = parse_args(argc, argv, &c);
    FUZZ_CHECK(rc == PARSE_CONTINUE || rc == CLI_EXIT_OK || rc == CLI_EXIT_USAGE, "status %d", rc);
    if (rc == PARSE_CONTINUE) {
        FUZZ_CHECK(c.given[OPT_Q] && c.given[OPT_K] && c.given[OPT_V], "inputs missing");
        FUZZ_CHECK(c.given[OPT_OUT] || c.backward, "no output");
        for (int i = 0; i < OPT_COUNT; i++)
            FUZZ_CHECK(!c.given[i] || !options[i].has_value || c.val[i] != NULL,
                       "option %s without value", options[i].name);
        static const int outs[] = {OPT_OUT, OPT_ATTN, OPT_LSE, OPT_DQ, OPT_DK, OPT_DV, OPT_DBIAS};
        for (size_t i = 0; i < 7; i++)
            for (size_t j = i + 1; j < 7; j++)
                FUZZ_CHECK(!(c.given[outs[i]] && c.given[outs[j]] &&
                             strcmp(c.val[outs[i]], c.val[outs[j]]) == 0),
                           "two outputs on one file");
        qkv_attn_desc d = c.desc;
        d.batch = 1;
        d.n_q = d.n_k = 4;
        d.heads = 1;
        d.dim = 2;
        qkv_status s = qkv_attn_desc_check(&d);
        FUZZ_CHECK(s == QKV_OK || s == QKV_ERR_BAD_PARAMETER, "descriptor status %d (%s)", (int)s,
                   qkv_status_string(s));
    }
    free(buf);
    return 0;
}
