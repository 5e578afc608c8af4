/* Helpers shared by the qkv subcommands: option scanning, strict number
 * parsing and error messages that name the option and the file at fault.
 * Every message goes to stderr as "qkv <cmd>: <option> <file>: <what>". */
#ifndef QKV_CLI_UTIL_H
#define QKV_CLI_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "qkv.h"

#if defined(__GNUC__) || defined(__clang__)
#define CLI_PRINTF(fmt, first) __attribute__((format(printf, fmt, first)))
#else
#define CLI_PRINTF(fmt, first)
#endif

/* Exit statuses of every subcommand. */
enum { CLI_EXIT_OK = 0, CLI_EXIT_FAIL = 1, CLI_EXIT_USAGE = 2 };

/* Print "qkv <cmd>: <opt> <path>: <message>\n" to stderr; opt and path may be
 * NULL (then they and their separator are left out). */
void cli_error(const char *cmd, const char *opt, const char *path, const char *fmt, ...)
    CLI_PRINTF(4, 5);

/* Print "Try 'qkv <cmd> --help'." to stderr (after a usage error). */
void cli_usage_hint(const char *cmd);

/* One option a subcommand accepts: its long name ("--q"), an optional short
 * alias ("-o") and whether it takes a value. id is returned by cli_next. */
typedef struct cli_opt {
    const char *name;
    const char *alias;
    int has_value;
    int id;
} cli_opt;

/* A cursor over argv (argv[0] is the subcommand's name), and what cli_scan
 * needs besides: the options, the help option's id and its printer, and the
 * flags of the options seen (NULL: an option may be given again). */
typedef struct cli_args {
    const char *cmd;
    int argc;
    char **argv;
    int i;
    const cli_opt *opts;
    size_t n_opts;
    int help_id;
    void (*help)(void);
    int *given; /* [n_opts], zeroed by the caller */
    int status; /* the exit status once cli_scan answered CLI_STOP */
} cli_args;

#define CLI_END (-1)
#define CLI_ERROR (-2)
#define CLI_STOP (-3)

/* Scan the next option. Returns its id (and, for an option with a value,
 * *value: from "--name=value" or from the next argument), CLI_END after the
 * last argument, or CLI_ERROR after printing why: unknown option, stray
 * argument, missing value (a following argument that starts with "--" is not
 * taken as a value: write --name=--odd to pass one), or a value given to a
 * flag. *name is set to the option's canonical name in every case but CLI_END. */
int cli_next(cli_args *a, const cli_opt *opts, size_t n_opts, const char **name,
             const char **value);

/* The step of every subcommand's option loop: cli_next over a->opts, then
 * CLI_STOP with a->status set when the command is over: after a scanning
 * error (the --help hint printed: CLI_EXIT_USAGE), after --help (a->help()
 * printed: CLI_EXIT_OK) and, with a->given, for an option given twice
 * ("given twice", a usage error). Otherwise the option's id (recorded in
 * a->given) or CLI_END, as cli_next. */
int cli_scan(cli_args *a, const char **name, const char **value);

/* The whole option loop of a command whose options are kept by id: every
 * value into val[id] (val[OPT_COUNT], given in a->given) and handed to
 * take(ctx, id, value), which returns 0 or -1 after printing why (then the
 * --help hint, a usage error). Returns -1 once the arguments are done, else
 * the exit status (after --help or a usage error). */
int cli_scan_values(cli_args *a, const char **val, int (*take)(void *ctx, int id, const char *value), void *ctx);

/* Strict numbers: the whole text must be the number, no blanks, no overflow.
 * On failure they print "qkv <cmd>: <label>: '<text>' is not ..." and return
 * -1; 0 on success. */
int cli_parse_double(const char *cmd, const char *label, const char *text, double *out);
int cli_parse_int64(const char *cmd, const char *label, const char *text, int64_t lo,
                    int64_t hi, int64_t *out);
/* A number that must be > lo: else "qkv <cmd>: <label>: '<text>' must be >
 * <lo><note>" (note may be ""). 0 or -1. */
int cli_parse_double_above(const char *cmd, const char *label, const char *text, double lo, const char *note,
                           double *out);

/* "[5, 2, 8]" into buf (always terminated); returns buf. */
const char *cli_shape_str(char *buf, size_t len, int ndim, const int64_t *shape);

/* "float32", "float64", "int32", "int64" or "unknown". */
const char *cli_dtype_name(qkv_dtype dtype);

/* Print "qkv <cmd>: <opt>: <message>" and the --help hint; returns
 * CLI_EXIT_USAGE (for `return cli_usage_error(...)`). */
int cli_usage_error(const char *cmd, const char *opt, const char *fmt, ...) CLI_PRINTF(3, 4);

/* --mask none|causal|window:L,R|causal-window:L into d->mask and the window
 * extents. Returns 0, or -1 after printing why. */
int cli_parse_mask(const char *cmd, const char *spec, qkv_attn_desc *d);

/* *d initialised (qkv_attn_desc_init) for one sequence of n queries and n
 * keys, one head of dimension dim. */
void cli_attn_desc_single(qkv_attn_desc *d, int64_t n, int64_t dim);

/* The --out folder dir, created when it does not exist. 0, or -1 after
 * printing why ("cannot create the folder", "not a folder"). */
int cli_make_out_dir(const char *cmd, const char *dir);

/* --impl auto|reference|fast into d->impl, and --threads N (0 .. 65536) into
 * d->threads. 0, or -1 after printing why. */
int cli_parse_impl(const char *cmd, const char *value, qkv_attn_desc *d);
int cli_parse_threads(const char *cmd, const char *value, qkv_attn_desc *d);

/* The end of a command that printed to stdout: rc, or CLI_EXIT_FAIL after
 * saying so when stdout cannot be flushed (a full disk, a closed pipe). */
int cli_flush_stdout(const char *cmd, int rc);

/* Whether this qkv draws PNG pictures (QKV_WITH_PNG of qkv/config.h). In a
 * build without PNG, the first call of the process prints
 * "qkv <cmd>: pictures not drawn: this qkv was built without PNG" to stderr,
 * so that a command that draws along the way says it once and carries on. */
int cli_can_draw(const char *cmd);

/* The heatmap on the terminal (stdout, after a blank line) in these colours.
 * 0, or -1 after printing why. */
int cli_print_heatmap(const char *cmd, const qkv_heatmap *h, qkv_ansi_colors colors);

#endif
