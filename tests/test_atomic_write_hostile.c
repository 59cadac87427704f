/* The atomic writer (src/io/io_util.c, accel__afile_*) on what an unlucky
 * user's directory holds at "<path>.tmp": a tmp left by a killed writer is
 * reused (the save succeeds, the file is the new text), and a writer killed
 * while holding the tmp's lock holds up the next one only until it dies
 * (path keeps its old text meanwhile); a symbolic link to
 * the user's file, a hard link to it, or a FIFO is refused by an error
 * naming the tmp, the file it points at untouched and path's old text kept
 * (the writer followed the link and truncated the user's file; a FIFO took
 * the bytes and was renamed over path); a path that is a directory is an
 * error too, nothing left behind. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "accel/accel.h"
#include "check.h"
#include "io/io_internal.h"

static char g_dir[64];

/* dir/name into buf. */
static const char *at(char *buf, size_t n, const char *name) {
    snprintf(buf, n, "%s/%s", g_dir, name);
    return buf;
}

static void put(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    CHECK(f && fputs(text, f) >= 0 && fclose(f) == 0);
}

/* path's text (up to 255 bytes), "" when it cannot be read. */
static const char *text_of(const char *path, char *buf, size_t n) {
    buf[0] = 0;
    int fd = open(path, O_RDONLY | O_NONBLOCK);
    if (fd < 0) return buf;
    ssize_t r = read(fd, buf, n - 1);
    buf[r > 0 ? r : 0] = 0;
    close(fd);
    return buf;
}

/* Saves {"v": 2} to path; the status, the error's text in err. */
static accel_status save(const char *path, char *err, size_t n) {
    json_t *j = json_pack("{s:i}", "v", 2);
    accel_status st = accel__json_save_file(path, j);
    json_decref(j);
    snprintf(err, n, "%s", st ? accel_last_error() : "");
    accel_clear_error();
    return st;
}

static void test_stale_tmp_reused(void) {
    char path[96], tmp[96], buf[256], err[512];
    put(at(path, sizeof path, "stale.json"), "{\"v\": 1}");
    put(at(tmp, sizeof tmp, "stale.json.tmp"), "half a text from a writer killed -9");
    CHECK_MSG(save(path, err, sizeof err) == ACCEL_OK, "%s", err);
    CHECK_MSG(strstr(text_of(path, buf, sizeof buf), "\"v\": 2") != NULL, "got %s", buf);
    CHECK(access(tmp, F_OK) != 0);
}

/* A writer killed -9 mid-write, its lock on the tmp held: the next writer,
 * already waiting, goes on once the kernel drops the dead writer's lock, and
 * path kept its old text until then. */
static void test_killed_writer_mid_write(void) {
    char path[96], tmp[96], buf[256], err[512];
    put(at(path, sizeof path, "killed.json"), "{\"v\": 1}");
    at(tmp, sizeof tmp, "killed.json.tmp");
    int ready[2];
    CHECK(pipe(ready) == 0);
    pid_t kid = fork();
    if (kid == 0) { /* the writer: the tmp locked as accel__afile_open locks it, half written */
        int fd = open(tmp, O_RDWR | O_CREAT, 0644);
        if (fd < 0 || flock(fd, LOCK_EX) != 0 || write(fd, "{\"v\": ", 7) != 7) _exit(1);
        if (write(ready[1], "x", 1) != 1) _exit(1);
        pause();
        _exit(0);
    }
    char c;
    CHECK(read(ready[0], &c, 1) == 1);
    pid_t saver = fork();
    if (saver == 0) _exit(save(path, err, sizeof err) == ACCEL_OK ? 0 : 1);
    usleep(200 * 1000); /* the saver waits on the lock meanwhile (or has not got there yet) */
    CHECK_MSG(!strcmp(text_of(path, buf, sizeof buf), "{\"v\": 1}"), "path now %s", buf);
    CHECK(kill(kid, SIGKILL) == 0);
    int st = 0;
    CHECK(waitpid(kid, &st, 0) == kid);
    CHECK(waitpid(saver, &st, 0) == saver);
    CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the save after the killed writer failed");
    CHECK_MSG(strstr(text_of(path, buf, sizeof buf), "\"v\": 2") != NULL, "got %s", buf);
    close(ready[0]);
    close(ready[1]);
}

/* path.tmp made by make (a link to the user's file, or a FIFO): refused,
 * the user's file and path as they were. */
static void check_refused(const char *what, int (*make)(const char *user, const char *tmp)) {
    char path[96], tmp[96], user[96], buf[256], err[512];
    at(path, sizeof path, "f.json");
    at(tmp, sizeof tmp, "f.json.tmp");
    at(user, sizeof user, "precious.txt");
    put(path, "{\"v\": 1}");
    put(user, "the user's own text");
    CHECK(make(user, tmp) == 0);
    CHECK_MSG(save(path, err, sizeof err) != ACCEL_OK, "%s: the save went through the tmp", what);
    CHECK_MSG(strstr(err, tmp) && strstr(err, "not overwritten"), "%s: error does not name the tmp: %s", what, err);
    CHECK_MSG(!strcmp(text_of(user, buf, sizeof buf), "the user's own text"), "%s: user's file now %s", what, buf);
    CHECK_MSG(!strcmp(text_of(path, buf, sizeof buf), "{\"v\": 1}"), "%s: path now %s", what, buf);
    struct stat st;
    CHECK_MSG(lstat(path, &st) == 0 && S_ISREG(st.st_mode), "%s: path is no longer a regular file", what);
    unlink(tmp);
    unlink(user);
    unlink(path);
}

static int make_symlink(const char *user, const char *tmp) { return symlink(user, tmp); }
static int make_hardlink(const char *user, const char *tmp) { return link(user, tmp); }
static int make_fifo(const char *user, const char *tmp) {
    (void)user;
    return mkfifo(tmp, 0644);
}

static void test_tmp_symlink_refused(void) { check_refused("symlink", make_symlink); }
static void test_tmp_hardlink_refused(void) { check_refused("hard link", make_hardlink); }
static void test_tmp_fifo_refused(void) { check_refused("fifo", make_fifo); }

static void test_path_is_directory(void) {
    char path[96], tmp[96], err[512];
    CHECK(mkdir(at(path, sizeof path, "adir"), 0700) == 0);
    CHECK(save(path, err, sizeof err) != ACCEL_OK);
    CHECK_MSG(strstr(err, path) != NULL, "error does not name the path: %s", err);
    CHECK(access(at(tmp, sizeof tmp, "adir.tmp"), F_OK) != 0);
    struct stat st;
    CHECK(stat(path, &st) == 0 && S_ISDIR(st.st_mode));
    rmdir(path);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/accel_afile_hostile_%d", (int)getpid());
    CHECK(mkdir(g_dir, 0700) == 0);
    RUN(test_stale_tmp_reused);
    RUN(test_killed_writer_mid_write);
    RUN(test_tmp_symlink_refused);
    RUN(test_tmp_hardlink_refused);
    RUN(test_tmp_fifo_refused);
    RUN(test_path_is_directory);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    CHECK(system(cmd) == 0);
    return check_summary();
}
