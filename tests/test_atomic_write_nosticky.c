/* The atomic writer (src/core/afile.c) on a file system that keeps no sticky
 * bit, the writer's mark on its scratch files (FAT, SMB without unix
 * extensions): simulated by tests/nosticky_shim.c under LD_PRELOAD (this
 * program runs itself again with it). Saves work there as anywhere, over and
 * over, and leave no "<path>.tmp" behind: every save failed and left an empty
 * tmp that blocked every later one, the writer taking the file it had just
 * created for a user's. A user's "<path>.tmp" is still refused and kept. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "accel/accel.h"
#include "check.h"
#include "core/afile.h"

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *b = calloc(1, 256);
    if (b) fread(b, 1, 255, f);
    fclose(f);
    return b;
}

/* The shim is in: a file created with the sticky bit asked for has none. */
static void test_shim_active(const char *dir) {
    char p[256];
    snprintf(p, sizeof p, "%s/probe", dir);
    int fd = open(p, O_WRONLY | O_CREAT | O_EXCL, 01644);
    struct stat sb;
    CHECK(fd >= 0 && fstat(fd, &sb) == 0 && !(sb.st_mode & S_ISVTX));
    if (fd >= 0) close(fd);
    unlink(p);
}

static void test_saves_repeat(const char *dir) {
    char path[256], tmp[260];
    snprintf(path, sizeof path, "%s/model.json", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    for (int i = 0; i < 3; i++) {
        char text[32];
        snprintf(text, sizeof text, "{\"save\": %d}\n", i);
        CHECK_MSG(accel__afile_write_all(path, text, strlen(text)) == ACCEL_OK, "save %d: %s", i, accel_last_error());
        char *got = slurp(path);
        CHECK_MSG(got && !strcmp(got, text), "save %d: %s", i, got ? got : "(none)");
        free(got);
        CHECK_MSG(access(tmp, F_OK) != 0, "save %d left %s", i, tmp);
    }
    /* a user's <path>.tmp (no mark: here as everywhere) is still refused and kept */
    FILE *u = fopen(tmp, "w");
    CHECK(u && fputs("mine", u) >= 0 && fclose(u) == 0);
    CHECK(accel__afile_write_all(path, "x", 1) == ACCEL_ERR_IO);
    CHECK_STR_CONTAINS(accel_last_error(), "is not a scratch file of this user's accel");
    char *mine = slurp(tmp), *kept = slurp(path);
    CHECK(mine && !strcmp(mine, "mine") && kept && !strcmp(kept, "{\"save\": 2}\n"));
    free(mine);
    free(kept);
    unlink(tmp);
    unlink(path);
}

int main(int argc, char **argv) {
    const char *shim = getenv("ACCEL_TEST_NOSTICKY_SHIM");
    if (!getenv("LD_PRELOAD") || !strstr(getenv("LD_PRELOAD"), "nosticky")) {
        if (!shim) {
            fprintf(stderr, "ACCEL_TEST_NOSTICKY_SHIM (the shim's path) is not set\n");
            return 1;
        }
        /* ASan wants to be first in the library list: the shim is put before it on purpose */
        char asan[512];
        const char *a = getenv("ASAN_OPTIONS");
        snprintf(asan, sizeof asan, "%s%sverify_asan_link_order=0", a ? a : "", a && *a ? ":" : "");
        setenv("ASAN_OPTIONS", asan, 1);
        setenv("LD_PRELOAD", shim, 1);
        execv("/proc/self/exe", argv);
        perror("execv");
        return 1;
    }
    (void)argc;
    char dir[] = "/tmp/accel_nosticky_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    test_shim_active(dir);
    test_saves_repeat(dir);
    rmdir(dir);
    return check_summary();
}
