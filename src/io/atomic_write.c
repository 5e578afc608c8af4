/* The temporary-file-then-rename write behind every save (atomic_write.h). */
#define _POSIX_C_SOURCE 200809L /* open/O_EXCL, fsync, getpid */

#include "io/atomic_write.h"
#include "io/byte_order.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/internal.h"

static atomic_uint g_tmp_seq; /* makes temporary names unique within the process */

qkv_status atomic_file_open(atomic_file *f, const char *path) {
    memset(f, 0, sizeof *f);
    f->fd = -1;
    if (!path[0]) return QKV_ERR_IO;
    size_t cap = strlen(path) + 48;
    char *tmp = qkv_alloc(cap);
    if (!tmp) return QKV_ERR_OUT_OF_MEMORY;
    int fd = -1;
    for (int attempt = 0; attempt < 100 && fd < 0; attempt++) {
        snprintf(tmp, cap, "%s.tmp%ld.%u", path, (long)getpid(), atomic_fetch_add(&g_tmp_seq, 1u));
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
        qkv_free(tmp);
        return QKV_ERR_IO;
    }
    f->fd = fd;
    f->tmp = tmp;
    f->path = path;
    return QKV_OK;
}

int atomic_file_write(atomic_file *f, const void *data, size_t n) {
    const unsigned char *p = data;
    while (!f->failed && n > 0) {
        size_t chunk = n < ((size_t)1 << 30) ? n : ((size_t)1 << 30);
        ssize_t w = write(f->fd, p, chunk);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            f->failed = 1;
            break;
        }
        p += w;
        n -= (size_t)w;
    }
    return f->failed ? -1 : 0;
}

int atomic_file_write_le(atomic_file *f, const void *data, size_t count, size_t elem) {
    if (qkv_host_is_le() || elem == 1) return atomic_file_write(f, data, count * elem);
    unsigned char buf[4096];
    const unsigned char *p = data;
    size_t per = sizeof buf / elem;
    for (size_t i = 0; i < count && !f->failed; i += per) {
        size_t n = count - i < per ? count - i : per;
        memcpy(buf, p + i * elem, n * elem);
        qkv_swap_bytes(buf, n, elem);
        atomic_file_write(f, buf, n * elem);
    }
    return f->failed ? -1 : 0;
}

qkv_status atomic_file_close(atomic_file *f, int keep) {
    int ok = keep && !f->failed && fsync(f->fd) == 0;
    if (close(f->fd) != 0) ok = 0;
    if (ok && rename(f->tmp, f->path) != 0) ok = 0;
    if (!ok) unlink(f->tmp);
    qkv_free(f->tmp);
    memset(f, 0, sizeof *f);
    f->fd = -1;
    return ok ? QKV_OK : QKV_ERR_IO;
}
