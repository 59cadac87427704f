/* The temporary folder of a fuzz target (tests/fuzz_*.c) whose parsers read
 * files: made once per process under $TMPDIR (default /tmp), removed at exit.
 * Static: each target its own copy. */
#ifndef ACCEL_TESTS_FUZZ_TMP_H
#define ACCEL_TESTS_FUZZ_TMP_H

#include <stdio.h>
#include <stdlib.h>

#include "test_files.h"

static char g_fuzz_tmp[256];

static void fuzz_tmp_remove(void) {
    if (g_fuzz_tmp[0]) rm_rf(g_fuzz_tmp);
}

/* The process's temporary folder, named after the target. */
static const char *fuzz_tmp_dir(const char *target) {
    if (g_fuzz_tmp[0]) return g_fuzz_tmp;
    const char *t = getenv("TMPDIR");
    snprintf(g_fuzz_tmp, sizeof g_fuzz_tmp, "%s/%s_XXXXXX", t && *t ? t : "/tmp", target);
    if (!mkdtemp(g_fuzz_tmp)) {
        perror(target);
        abort();
    }
    atexit(fuzz_tmp_remove);
    return g_fuzz_tmp;
}

/* size bytes into path, or abort: the target cannot go on without its files. */
static void fuzz_write_file(const char *path, const void *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f)) {
        perror(path);
        abort();
    }
}

#endif
