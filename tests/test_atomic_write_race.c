/* Two processes writing one file at once through the atomic writer
 * (src/core/afile.c, accel__afile_*: "<path>.tmp", fsync, rename), as two
 * runs sharing a GEMM choice cache do (ctest -j runs share the build tree's;
 * two trainings share ~/.cache/accel): every write succeeds, and the file
 * is always one writer's whole text, never the two spliced. Each writer
 * saves its own JSON (of its own length) many times over while the parent
 * reads the file. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "accel/accel.h"
#include "check.h"
#include "io/io_internal.h"

enum { WRITERS = 2, SAVES = 300 };

/* Writer k's document: "pad" of (k + 1) x 40000 copies of 'a' + k. */
static json_t *doc(int k) {
    size_t n = (size_t)(k + 1) * 40000;
    char *pad = malloc(n + 1);
    if (!pad) return NULL;
    memset(pad, 'a' + k, n);
    pad[n] = 0;
    json_t *j = json_pack("{s:s, s:i}", "pad", pad, "writer", k);
    free(pad);
    return j;
}

/* Whether path holds one writer's whole document. */
static bool whole(const char *path) {
    json_t *j = json_load_file(path, 0, NULL);
    json_t *w = json_object_get(j, "writer");
    bool ok = json_is_integer(w);
    if (ok) {
        json_t *want = doc((int)json_integer_value(w));
        ok = json_equal(j, want);
        json_decref(want);
    }
    json_decref(j);
    return ok;
}

static void test_two_writers(void) {
    char dir[64], path[96];
    snprintf(dir, sizeof dir, "/tmp/accel_afile_race_%d", (int)getpid());
    CHECK(mkdir(dir, 0700) == 0);
    snprintf(path, sizeof path, "%s/f.json", dir);
    pid_t kids[WRITERS];
    for (int k = 0; k < WRITERS; k++) {
        if ((kids[k] = fork()) != 0) continue;
        json_t *j = doc(k);
        int failed = 0;
        for (int i = 0; j && i < SAVES; i++)
            if (accel__json_save_file(path, j) != ACCEL_OK) {
                if (!failed++) fprintf(stderr, "writer %d: %s\n", k, accel_last_error());
                accel_clear_error();
            }
        _exit(!j || failed ? 1 : 0);
    }
    int torn = 0;
    for (int i = 0; i < SAVES; i++) torn += access(path, F_OK) == 0 && !whole(path);
    for (int k = 0; k < WRITERS; k++) {
        int st = 0;
        CHECK(waitpid(kids[k], &st, 0) == kids[k]);
        CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "writer %d: a save failed", k);
    }
    CHECK_MSG(torn == 0, "%d reads found the writers' texts spliced", torn);
    CHECK(whole(path));
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

int main(void) {
    RUN(test_two_writers);
    return check_summary();
}
