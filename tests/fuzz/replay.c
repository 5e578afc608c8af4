/* Replays fuzz inputs without libFuzzer: every file named on the command
 * line, or every regular file in a named folder, is fed once to the target's
 * LLVMFuzzerTestOneInput (linked in beside this file). Normal builds register
 * one replay per target with CTest on its seed corpus (tests/fuzz/corpus/),
 * so every CI run re-checks each seed and every committed regression input,
 * under gcc and clang, with the sanitizers when QKV_SANITIZE is on. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

static int replay_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: cannot open %s\n", path);
        return 1;
    }
    size_t cap = 4096, len = 0;
    uint8_t *buf = malloc(cap);
    for (;;) {
        if (!buf) break;
        if (len == cap) {
            uint8_t *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        if (got == 0) break;
        len += got;
    }
    fclose(f);
    if (!buf) {
        fprintf(stderr, "replay: out of memory reading %s\n", path);
        return 1;
    }
    /* An exact-size copy so that ASan sees reads past the input's end. */
    uint8_t *exact = malloc(len ? len : 1);
    if (!exact) {
        free(buf);
        return 1;
    }
    if (len) memcpy(exact, buf, len);
    free(buf);
    LLVMFuzzerTestOneInput(exact, len);
    free(exact);
    return 0;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv) {
    long files = 0;
    int bad = 0;
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE|DIR...\n", argv[0]);
        return 2;
    }
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "replay: no such file or folder: %s\n", argv[i]);
            bad = 1;
            continue;
        }
        if (!S_ISDIR(st.st_mode)) {
            bad |= replay_file(argv[i]);
            files++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        if (!d) {
            fprintf(stderr, "replay: cannot open folder %s\n", argv[i]);
            bad = 1;
            continue;
        }
        /* Sorted, so a failure always reproduces in the same order. */
        char **names = NULL;
        size_t n = 0, cap = 0;
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.') continue;
            if (n == cap) {
                cap = cap ? 2 * cap : 64;
                char **nn = realloc(names, cap * sizeof *names);
                if (!nn) break;
                names = nn;
            }
            size_t l = strlen(argv[i]) + strlen(e->d_name) + 2;
            names[n] = malloc(l);
            if (!names[n]) break;
            snprintf(names[n], l, "%s/%s", argv[i], e->d_name);
            n++;
        }
        closedir(d);
        if (n) qsort(names, n, sizeof *names, cmp_str);
        for (size_t j = 0; j < n; j++) {
            struct stat fs;
            if (stat(names[j], &fs) == 0 && S_ISREG(fs.st_mode)) {
                bad |= replay_file(names[j]);
                files++;
            }
            free(names[j]);
        }
        free(names);
    }
    printf("replay: %ld inputs, %s\n", files, bad ? "with errors" : "no finding");
    if (files == 0) {
        fprintf(stderr, "replay: no inputs found\n");
        return 1;
    }
    return bad;
}
