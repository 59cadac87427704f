/* The trackers under faults and hostile input: a failed CSV rewrite (its tmp
 * name taken, the file size limit reached) and logging after it, long
 * non-ASCII text tags, hparams.yml strings that YAML would read as something
 * else. Every file written must stay readable by its peer's parser. */
#include <ftw.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "accel/accel.h"
#include "check.h"

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *f) {
    (void)sb, (void)flag, (void)f;
    return remove(p);
}
static void rm_rf(const char *p) { nftw(p, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

static char *temp_dir(void) {
    static char dirs[8][64];
    static int n;
    char *d = dirs[n++ % 8];
    snprintf(d, 64, "/tmp/accel_track_faults_XXXXXX");
    return mkdtemp(d);
}

static char *slurp(const char *path) {
    void *data;
    size_t len;
    if (accel_load_bytes(path, &data, &len)) return NULL;
    char *s = realloc(data, len + 1);
    s[len] = '\0';
    return s;
}

static bool exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* ---------------------------------------------------------------- csv */

/* A new key rewrites log.csv through log.csv.tmp. When that fails the
 * tracker must keep logging, with the old header and rows of its width: the
 * columns stayed added (rows wider than the header, the new key never named)
 * and, when the failure came at the rename, the stream was closed and set to
 * NULL (the next log crashed). */
static void test_csv_widen_fails_tmp_taken(void) {
    char *dir = temp_dir(), path[512], tmp[520];
    snprintf(path, sizeof path, "%s/p/log.csv", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    accel_tracker *t = accel_tracker_open("csv", "p", dir);
    accel_value a[] = {ACCEL_VALUE_F("a", 1)}, ab[] = {ACCEL_VALUE_F("a", 2), ACCEL_VALUE_F("b", 3)};
    CHECK(accel_tracker_log(t, 1, a, 0) == ACCEL_OK);
    CHECK(mkdir(tmp, 0777) == 0); /* the tmp name is taken */
    CHECK(accel_tracker_log(t, 2, ab, 1) == ACCEL_ERR_IO);
    CHECK_STR_CONTAINS(accel_last_error(), "log.csv.tmp");
    accel_clear_error();
    CHECK(accel_tracker_log(t, 1, a, 2) == ACCEL_OK); /* as wide as the header */
    CHECK(rmdir(tmp) == 0);
    CHECK(accel_tracker_log(t, 2, ab, 3) == ACCEL_OK); /* widens now */
    CHECK(accel_tracker_finish(t) == ACCEL_OK);
    char *s = slurp(path);
    CHECK_MSG(s && !strcmp(s, "step,a,b\n0,1,\n2,1,\n3,2,3\n"), "%s", s);
    free(s);
    rm_rf(dir);
}

static void test_csv_widen_fails_file_too_large(void) {
    char *dir = temp_dir(), path[512], tmp[520];
    snprintf(path, sizeof path, "%s/p/log.csv", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    accel_tracker *t = accel_tracker_open("csv", "p", dir);
    accel_value a[] = {ACCEL_VALUE_F("a", 1)}, ab[] = {ACCEL_VALUE_F("a", 2), ACCEL_VALUE_F("b", 3)};
    CHECK(accel_tracker_log(t, 1, a, 0) == ACCEL_OK);
    CHECK(accel_tracker_log(t, 1, a, 1) == ACCEL_OK);
    /* Files may not grow past log.csv's size now: the wider copy cannot be
     * written (EFBIG, as a full disk's ENOSPC). */
    struct stat sb;
    CHECK(stat(path, &sb) == 0);
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = (rlim_t)sb.st_size;
    void (*was)(int) = signal(SIGXFSZ, SIG_IGN);
    CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0);
    CHECK(accel_tracker_log(t, 2, ab, 2) == ACCEL_ERR_IO);
    CHECK(setrlimit(RLIMIT_FSIZE, &old) == 0);
    signal(SIGXFSZ, was);
    CHECK_STR_CONTAINS(accel_last_error(), "cannot rewrite");
    CHECK(!exists(tmp)); /* no half copy left behind */
    accel_clear_error();
    CHECK(accel_tracker_log(t, 1, a, 3) == ACCEL_OK); /* the tracker still writes */
    CHECK(accel_tracker_log(t, 2, ab, 4) == ACCEL_OK);
    CHECK(accel_tracker_finish(t) == ACCEL_OK);
    char *s = slurp(path);
    CHECK_MSG(s && !strcmp(s, "step,a,b\n0,1,\n1,1,\n3,1,\n4,2,3\n"), "%s", s);
    free(s);
    rm_rf(dir);
}

int main(void) {
    RUN(test_csv_widen_fails_tmp_taken);
    RUN(test_csv_widen_fails_file_too_large);
    accel_thread_cleanup();
    return check_summary();
}
