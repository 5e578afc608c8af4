/* The .npy files of a subcommand's job: load, check, convert, write. */
#include "cli_npy.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void cli_file_error(const char *cmd, const cli_file *f, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cli_error(cmd, f->opt, f->path, "%s", msg);
}

int cli_file_load(const char *cmd, cli_file *f, int header_only) {
    char why[256] = "";
    qkv_status s = header_only ? qkv_npy_load_header(f->path, &f->a, why, sizeof why)
                               : qkv_npy_load(f->path, &f->a, why, sizeof why);
    if (s != QKV_OK) {
        cli_file_error(cmd, f, "%s", why[0] ? why : qkv_status_string(s));
        return -1;
    }
    return 0;
}

int cli_file_nonempty(const char *cmd, const cli_file *f) {
    char sh[160];
    for (int i = 0; i < f->a.ndim; i++) {
        if (f->a.shape[i] < 1) {
            cli_file_error(cmd, f, "shape %s has an empty dimension (every size must be >= 1)",
                           cli_shape_str(sh, sizeof sh, f->a.ndim, f->a.shape));
            return -1;
        }
    }
    return 0;
}

int cli_file_convert(const char *cmd, cli_file *f, qkv_dtype to) {
    if (f->a.dtype == to) return 0;
    qkv_array c;
    qkv_status s = qkv_array_convert(&f->a, to, &c);
    if (s != QKV_OK) {
        cli_file_error(cmd, f, "cannot convert %s to %s: %s", cli_dtype_name(f->a.dtype),
                       cli_dtype_name(to), qkv_status_string(s));
        return -1;
    }
    qkv_array_free(&f->a);
    f->a = c;
    return 0;
}

int cli_file_alloc(const char *cmd, cli_file *f, const char *opt, qkv_dtype dt, int ndim,
                   const int64_t *shape, const char *what) {
    qkv_status s = qkv_array_alloc(&f->a, dt, ndim, shape);
    if (s != QKV_OK) {
        char sh[160];
        cli_error(cmd, opt, f->path, "cannot allocate %s %s: %s", what,
                  cli_shape_str(sh, sizeof sh, ndim, shape), qkv_status_string(s));
        return -1;
    }
    return 0;
}

int cli_files_write(const char *cmd, cli_file *f, int n) {
    for (int i = 0; i < n; i++) {
        cli_file *o = &f[i];
        if (!o->path || !o->a.data) continue;
        errno = 0;
        qkv_status s = qkv_npy_save(o->path, &o->a);
        if (s == QKV_OK) continue;
        int e = errno;
        cli_error(cmd, o->opt, o->path, "cannot write: %s%s%s%s", qkv_status_string(s),
                  e ? " (" : "", e ? strerror(e) : "", e ? ")" : "");
        for (int w = 0; w < i; w++) { /* the ones before i with a path and data were written */
            if (!f[w].path || !f[w].a.data) continue;
            if (remove(f[w].path) == 0)
                fprintf(stderr, "qkv %s: removed %s (written by this run before the failure)\n", cmd,
                        f[w].path);
            else
                cli_error(cmd, f[w].opt, f[w].path, "could not remove this partial result: %s",
                          strerror(errno));
        }
        return -1;
    }
    return 0;
}

void cli_files_free(cli_file *f, int n) {
    for (int i = 0; i < n; i++) qkv_array_free(&f[i].a);
}
