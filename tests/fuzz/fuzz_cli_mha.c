/* libFuzzer target: the argument parsing of `qkv mha`, reached as in
 * fuzz_cli_args.c: this file includes tools/cmd_mha.c and calls its static
 * parse_args, which only fills a configuration (no file is opened), so the
 * real parser and number parsers run and the file system is never touched.
 *
 * Input: argument strings separated by NUL bytes (at most 64). Findings
 * beyond memory errors: a status other than 0, 2 or "continue"; a continuing
 * parse without --weights/--heads/--x/-o, with heads < 1, with --heads-kv not
 * dividing --heads, with -o and --attn on one file, or with an attention
 * descriptor the library calls malformed once sizes are set. */
#include "../../tools/cmd_mha.c"

#include "fuzz.h"
#include "fuzz_check.h"

#define MAX_ARGS 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *buf = malloc(size + 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    buf[size] = '\0';
    char name[] = "mha";
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
        FUZZ_CHECK(c.given[OPT_WEIGHTS] && c.given[OPT_HEADS] && c.given[OPT_X] && c.given[OPT_OUT],
                   "a required option is missing");
        FUZZ_CHECK(c.heads >= 1, "heads %lld", (long long)c.heads);
        FUZZ_CHECK(!c.given[OPT_HEADS_KV] || (c.heads_kv >= 1 && c.heads % c.heads_kv == 0),
                   "heads_kv %lld with heads %lld", (long long)c.heads_kv, (long long)c.heads);
        FUZZ_CHECK(!c.given[OPT_ATTN] || strcmp(c.val[OPT_OUT], c.val[OPT_ATTN]) != 0,
                   "-o and --attn on one file");
        FUZZ_CHECK(c.prefix != NULL, "no prefix");
        qkv_attn_desc d = c.attn;
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
