#define _POSIX_C_SOURCE 200809L /* popen */
/* The version lives in one place, CMakeLists.txt's project(VERSION): the
 * header's QKV_VERSION_* and QKV_VERSION_STRING, qkv_version(), the CLI's
 * `qkv --version` and the newest CHANGELOG.md entry must all agree with it
 * (tests/CMakeLists.txt passes the CMake version in). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#ifndef QKV_PROJECT_VERSION_MAJOR
#error "tests/CMakeLists.txt passes QKV_PROJECT_VERSION_MAJOR/MINOR/PATCH"
#endif

int main(void) {
    char want[64];
    snprintf(want, sizeof want, "%d.%d.%d", QKV_PROJECT_VERSION_MAJOR, QKV_PROJECT_VERSION_MINOR,
             QKV_PROJECT_VERSION_PATCH);
    CHECK(QKV_VERSION_MAJOR == QKV_PROJECT_VERSION_MAJOR &&
              QKV_VERSION_MINOR == QKV_PROJECT_VERSION_MINOR &&
              QKV_VERSION_PATCH == QKV_PROJECT_VERSION_PATCH,
          "qkv.h's QKV_VERSION_* %d.%d.%d differ from CMake's project version %s",
          QKV_VERSION_MAJOR, QKV_VERSION_MINOR, QKV_VERSION_PATCH, want);
    CHECK(strcmp(QKV_VERSION_STRING, want) == 0, "QKV_VERSION_STRING '%s', CMake '%s'",
          QKV_VERSION_STRING, want);
    CHECK(strcmp(qkv_version(), want) == 0, "qkv_version() '%s', CMake '%s'", qkv_version(), want);

    /* qkv --version prints "qkv X.Y.Z". */
    const char *cli = getenv("QKV_CLI");
    if (cli) {
        char cmd[4096], line[256] = "";
        snprintf(cmd, sizeof cmd, "'%s' --version", cli);
        FILE *p = popen(cmd, "r");
        CHECK(p != NULL, "cannot run %s", cmd);
        if (p) {
            if (!fgets(line, sizeof line, p)) line[0] = '\0';
            int rc = pclose(p);
            char expect[80];
            snprintf(expect, sizeof expect, "qkv %s\n", want);
            CHECK(rc == 0 && strcmp(line, expect) == 0, "qkv --version printed '%s' (status %d)",
                  line, rc);
        }
    }

    /* The newest CHANGELOG.md entry is this version: "## [X.Y.Z]". */
    const char *src = getenv("QKV_SOURCE_DIR");
    if (src) {
        char path[4096], line[512];
        snprintf(path, sizeof path, "%s/CHANGELOG.md", src);
        FILE *f = fopen(path, "r");
        CHECK(f != NULL, "no %s", path);
        if (f) {
            int found = 0;
            while (fgets(line, sizeof line, f))
                if (strncmp(line, "## [", 4) == 0) {
                    found = 1;
                    size_t n = strlen(want);
                    CHECK(strncmp(line + 4, want, n) == 0 && line[4 + n] == ']',
                          "the newest CHANGELOG.md entry is '%.*s', not [%s]",
                          (int)strcspn(line, "\n"), line, want);
                    break;
                }
            CHECK(found, "CHANGELOG.md has no '## [X.Y.Z]' entry");
            fclose(f);
        }
    }
    return tu_finish();
}
