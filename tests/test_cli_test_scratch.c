/* `accel test`'s main_process_first check writes into a directory of its
 * own (mkdtemp under $TMPDIR), removed after: it used the fixed name
 * /tmp/accel_test_<run id>_<port> (accel_test_single_0 without a launcher),
 * which two runs at once shared (each removing the other's file), which an
 * append through a link another user put there followed, and which a
 * directory of that name made fail ("main did not go first"). Runs
 * `accel test --payload` (one process) with such a directory at the old
 * name: it passes, and $TMPDIR is left empty. Runs build/bin/accel next to
 * itself. */
#include <dirent.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "cli_run.h"
#include "sibling_exe.h"

static char ACCEL[PATH_MAX + 32], TMP[PATH_MAX];
static char OUT[1 << 16], ERR[1 << 16];

/* Whether dir holds no entry but "." and "..". */
static bool empty_dir(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    if (d) closedir(d);
    return d && n == 0;
}

static void test_private_scratch(void) {
    char tmpdir[PATH_MAX + 16], old[128], env_tmp[PATH_MAX + 32], env_run[64];
    snprintf(tmpdir, sizeof tmpdir, "%s/tmpdir", TMP);
    CHECK(mkdir(tmpdir, 0700) == 0);
    snprintf(env_run, sizeof env_run, "TORCHELASTIC_RUN_ID=scratch%d", (int)getpid());
    snprintf(old, sizeof old, "/tmp/accel_test_scratch%d_0", (int)getpid()); /* the old fixed name, taken */
    CHECK(mkdir(old, 0700) == 0);
    snprintf(env_tmp, sizeof env_tmp, "TMPDIR=%s", tmpdir);
    unsetenv("MASTER_PORT"); /* no launcher: the old name ended in _0 */
    const char *env[] = {env_tmp, env_run, NULL};
    const char *args[] = {"test", "--payload", NULL};
    const cli_io io = {TMP, OUT, ERR, sizeof OUT, sizeof ERR};
    int rc = cli_run(&io, ACCEL, args, env, NULL);
    CHECK_MSG(rc == 0, "accel test --payload: %d\n%s%s", rc, OUT, ERR);
    CHECK_STR_CONTAINS(OUT, "All checks passed on 1 process(es).");
    CHECK_MSG(empty_dir(tmpdir), "%s is not left empty", tmpdir);
    rmdir(old);
}

int main(void) {
    if (!sibling_exe("accel", ACCEL, sizeof ACCEL) || !cli_scratch("selftest", TMP, sizeof TMP)) return 1;
    RUN(test_private_scratch);
    cli_scratch_remove(TMP);
    return check_summary();
}
