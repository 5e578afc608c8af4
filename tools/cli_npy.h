/* The .npy files of a subcommand's job (qkv attend, qkv mha): each named by an
 * option, loaded, checked and converted with messages that name the option
 * and the file, and the outputs written all or nothing. */
#ifndef QKV_CLI_NPY_H
#define QKV_CLI_NPY_H

#include "cli_util.h"

/* One input or output: the option that names it ("--q"), its path (NULL: not
 * given, or computed but not written) and its array (data NULL: not loaded or
 * not computed). */
typedef struct cli_file {
    const char *opt;
    const char *path;
    qkv_array a;
} cli_file;

/* "qkv <cmd>: <opt> <path>: <message>" to stderr. */
void cli_file_error(const char *cmd, const cli_file *f, const char *fmt, ...) CLI_PRINTF(3, 4);

/* Load f->path (only its header with header_only). 0, or -1 after printing why. */
int cli_file_load(const char *cmd, cli_file *f, int header_only);

/* Every dimension >= 1? 0, or -1 after printing the shape. */
int cli_file_nonempty(const char *cmd, const cli_file *f);

/* Bring the array to dtype `to` (a new buffer; the old one is freed). 0 or -1. */
int cli_file_convert(const char *cmd, cli_file *f, qkv_dtype to);

/* Allocate the array of an output; a failure is blamed on `opt` and f->path. */
int cli_file_alloc(const char *cmd, cli_file *f, const char *opt, qkv_dtype dt, int ndim,
                   const int64_t *shape, const char *what);

/* Write every file of f[0..n) that has a path and data, in order; if one
 * fails, remove the ones written before it, so that the run leaves nothing
 * behind. 0 or -1. */
int cli_files_write(const char *cmd, cli_file *f, int n);

/* Free the arrays of f[0..n). */
void cli_files_free(cli_file *f, int n);

#endif
