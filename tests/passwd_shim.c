/* LD_PRELOAD shim for test_cli_config: getpwuid() gives a passwd entry whose
 * home is $ACCEL_TEST_PW_DIR (none where it is unset), so that a run without
 * HOME finds a home directory the test controls, never the user's own. */
#include <pwd.h>
#include <stdlib.h>
#include <sys/types.h>

struct passwd *getpwuid(uid_t uid) {
    static struct passwd pw;
    char *home = getenv("ACCEL_TEST_PW_DIR");
    if (!home) return NULL;
    pw = (struct passwd){.pw_name = "accel", .pw_passwd = "x", .pw_uid = uid, .pw_gid = 0, .pw_gecos = "",
                         .pw_dir = home, .pw_shell = "/bin/sh"};
    return &pw;
}
