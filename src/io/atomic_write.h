/* Writing a file atomically: the bytes go to a fresh temporary file beside
 * the path, which is synced and renamed over the path only when complete,
 * so no failure leaves a partial or broken file (and a file already at the
 * path stays as it was until the rename). Every file the library saves
 * (.npy, safetensors, images, pictures) is written this way. Internal. */
#ifndef QKV_IO_ATOMIC_WRITE_H
#define QKV_IO_ATOMIC_WRITE_H

#include <stddef.h>

#include "qkv.h"

typedef struct atomic_file {
    int fd;          /* the temporary file, open for writing */
    int failed;      /* a write failed: the file will not be kept */
    char *tmp;       /* its path: "<path>.tmp<pid>.<n>" */
    const char *path;
} atomic_file;

/* Create the temporary file for path: O_EXCL (never an existing file or a
 * link), mode 0666 less the umask like any new file. Errors:
 * QKV_ERR_OUT_OF_MEMORY, QKV_ERR_IO (it cannot be created, or path is
 * empty); then nothing is left to close. */
qkv_status atomic_file_open(atomic_file *f, const char *path);

/* Append n bytes (short writes and EINTR retried). 0, or -1 once any write
 * has failed. */
int atomic_file_write(atomic_file *f, const void *data, size_t n);

/* Append count elements of elem bytes each (1, 2, 4 or 8) in little-endian
 * byte order whatever the host's. 0 or -1, as atomic_file_write. */
int atomic_file_write_le(atomic_file *f, const void *data, size_t count, size_t elem);

/* Finish: keep != 0 and no failed write: sync, close and rename over the
 * path, QKV_OK (QKV_ERR_IO, the temporary file removed, when one of those
 * fails); keep == 0: close and remove the temporary file, QKV_ERR_IO. Frees
 * what atomic_file_open took in every case. */
qkv_status atomic_file_close(atomic_file *f, int keep);

#endif
