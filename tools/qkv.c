/* qkv: the command-line tool. This file only dispatches to the subcommands
 * (tools/cmd_*.c); each parses its own options. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cli_util.h"
#include "qkv.h"

typedef struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} command;

static const command commands[] = {
    {"demo", cli_cmd_demo, "the articles' \"Hello, I love you!\" through attention qkv trains, step by step"},
    {"show", cli_cmd_show, "draw a checkpoint's attention for one input, every layer and head"},
    {"experiment", cli_cmd_experiment, "answer the articles' questions by measurement (scale, projections, ...)"},
    {"attend", cli_cmd_attend,
     "attention over NumPy .npy arrays: output, attention matrix, gradients"},
    {"mha", cli_cmd_mha, "a multi-head attention layer (torch weights in safetensors) on .npy"},
    {"train", cli_cmd_train, "train a transformer on a generated task or a text file"},
    {"eval", cli_cmd_eval, "accuracy of a trained checkpoint on fresh examples"},
    {"generate", cli_cmd_generate, "continue a prompt with a trained decoder (KV cache)"},
    {"image", cli_cmd_image, "self-attention over an image's pixels: one pixel's attention as a heat map"},
    {"conv-as-attention", cli_cmd_conv_as_attention, "a K x K convolution computed as K^2-head self-attention (Cordonnier et al.)"},
    {"complexity", cli_cmd_complexity, "measure Vaswani et al. Table 1: time, sequential ops, path length"},
    {"embed", cli_cmd_embed, "sentence vectors (or token states) of a pretrained BERT encoder, to .npy"},
    {"tokenize", cli_cmd_tokenize, "the token ids (or word pieces) a BERT encoder reads"},
    {"similarity", cli_cmd_similarity, "the cosine matrix of sentences under a BERT encoder"},
    {"search", cli_cmd_search, "the lines of a file nearest to a query under a BERT encoder"},
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *f) {
    fprintf(f,
            "Usage: qkv <command> [options]\n"
            "       qkv <command> --help\n"
            "       qkv --help | --version\n"
            "\n"
            "qkv computes self-attention (scaled dot product, dot, cosine; softmax,\n"
            "ReLU, sigmoid; causal, window, padding and packed-sequence masks) on\n"
            "NumPy .npy arrays.\n"
            "\n"
            "Commands:\n");
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(f,
            "\n"
            "Options:\n"
            "  -h, --help     show this help and exit\n"
            "  -V, --version  print the version (qkv %s) and exit\n"
            "\n"
            "Example:\n"
            "  qkv attend --q q.npy --k k.npy --v v.npy -o out.npy --print\n"
            "\n"
            "Exit status: 0 success, 1 failure (bad input file, computation),\n"
            "2 usage error (unknown option, bad value).\n",
            qkv_version());
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return CLI_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        /* "qkv help attend" is "qkv attend --help". */
        if (strcmp(cmd, "help") == 0 && argc > 2) {
            for (size_t i = 0; i < N_COMMANDS; i++) {
                if (strcmp(argv[2], commands[i].name) == 0) {
                    char help_opt[] = "--help";
                    char *sub_argv[] = {argv[2], help_opt, NULL};
                    return commands[i].run(2, sub_argv);
                }
            }
            fprintf(stderr, "qkv: unknown command '%s'\nTry 'qkv --help'.\n", argv[2]);
            return CLI_EXIT_USAGE;
        }
        usage(stdout);
        return CLI_EXIT_OK;
    }
    if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "-V") == 0) {
        printf("qkv %s\n", qkv_version());
        return CLI_EXIT_OK;
    }
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (strcmp(cmd, commands[i].name) == 0) return commands[i].run(argc - 1, argv + 1);

    if (cmd[0] == '-')
        fprintf(stderr, "qkv: unknown option '%s'\n", cmd);
    else {
        fprintf(stderr, "qkv: unknown command '%s' (commands:", cmd);
        for (size_t i = 0; i < N_COMMANDS; i++) fprintf(stderr, " %s", commands[i].name);
        fprintf(stderr, ")\n");
    }
    fprintf(stderr, "Try 'qkv --help'.\n");
    return CLI_EXIT_USAGE;
}
