/* The atomic writer (src/core/afile.c, accel__afile_*; through io's JSON
 * writer and accelerator.save's accel_accelerator_save_bytes) on what an unlucky
 * user's directory holds at "<path>.tmp": a tmp left by a killed writer is
 * reused (the save succeeds, the file is the new text); the user's own file
 * of that name (binary, any size) is an error naming it, kept byte for byte, path's old text kept (the
 * writer truncated it and renamed it over path); a writer killed
 * while holding the tmp's lock holds up the next one only until it dies
 * (path keeps its old text meanwhile), one stopped mid-write only for
 * ACCEL_WRITE_STALL_TIMEOUT seconds of no progress (an error naming path
 * and the writer's pid), one writing on as long as it takes; a writer that
 * waited keeps the mode the file has after the one it waited for; a symbolic link to
 * the user's file, a hard link to it, or a FIFO is refused by an error
 * naming the tmp, the file it points at untouched and path's old text kept
 * (the writer followed the link and truncated the user's file; a FIFO took
 * the bytes and was renamed over path); a path that is a directory is an
 * error too, nothing left behind. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
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

static accel_status save_json(const char *path) {
    json_t *j = json_pack("{s:i}", "v", 2);
    accel_status st = accel__json_save_file(path, j);
    json_decref(j);
    return st;
}

/* accelerator.save's bytes (accel_accelerator_save_bytes: through
 * accel__afile_write_all, as checkpoints' RNG and custom files and the
 * trackers' JSON files), {"v": 2}. */
static accel_status save_bytes(const char *path) {
    accel_accelerator *acc = accel_accelerator_new(NULL);
    accel_status st = acc ? accel_accelerator_save_bytes(acc, path, "{\"v\": 2}", 8) : accel_last_status();
    char err[512];
    snprintf(err, sizeof err, "%s", accel_last_error());
    accel_accelerator_free(acc);
    if (st) accel_set_error(st, "%s", err); /* the save's error, whatever freeing did */
    return st;
}

/* A writer killed -9 mid-write (before its commit; of a file of mode `mode`
 * where it is not 0, which the writer gives its tmp at once): its
 * tmp is reused by the next save (save_fn), which succeeds and leaves no tmp
 * behind. */
static void check_stale_tmp_reused(const char *what, mode_t mode, accel_status (*save_fn)(const char *path)) {
    char path[96], tmp[96], buf[256];
    put(at(path, sizeof path, "stale.json"), "{\"v\": 1}");
    CHECK(!mode || chmod(path, mode) == 0);
    at(tmp, sizeof tmp, "stale.json.tmp");
    pid_t kid = fork();
    if (kid == 0) {
        accel__afile f;
        if (accel__afile_open(&f, path) != ACCEL_OK || accel__afile_write(&f, "{\"v\": ", 6) != ACCEL_OK)
            _exit(1);
        raise(SIGKILL);
    }
    int st = 0;
    CHECK(waitpid(kid, &st, 0) == kid && WIFSIGNALED(st));
    CHECK_MSG(!strcmp(text_of(tmp, buf, sizeof buf), "{\"v\": "), "%s: the killed writer's tmp: %s", what, buf);
    accel_status saved = save_fn(path);
    CHECK_MSG(saved == ACCEL_OK, "%s: %s", what, accel_last_error());
    accel_clear_error();
    CHECK_MSG(strstr(text_of(path, buf, sizeof buf), "\"v\": 2") != NULL, "%s: got %s", what, buf);
    CHECK(access(tmp, F_OK) != 0);
    struct stat sb;
    CHECK_MSG(stat(path, &sb) == 0 && !(sb.st_mode & S_ISVTX), "%s: path kept the scratch file's mark: %o", what,
              (unsigned)sb.st_mode);
    CHECK_MSG(!mode || (sb.st_mode & 07777) == mode, "%s: mode %o, not %o", what, (unsigned)sb.st_mode & 07777,
              (unsigned)mode);
    unlink(path);
}

static void test_stale_tmp_reused(void) {
    check_stale_tmp_reused("json", 0, save_json);
    check_stale_tmp_reused("json, mode set", 0600, save_json);
    check_stale_tmp_reused("accelerator save_bytes", 0, save_bytes);
}

/* n bytes of a user's binary file: every byte value, NULs included. */
static void fill(unsigned char *b, size_t n) {
    for (size_t i = 0; i < n; i++) b[i] = (unsigned char)(i * 131 + i / 251);
}

/* Whether path holds exactly b[0..n). */
static bool holds(const char *path, const unsigned char *b, size_t n) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    unsigned char *got = malloc(n + 1);
    bool same = got && fread(got, 1, n + 1, f) == n && !memcmp(got, b, n);
    free(got);
    fclose(f);
    return same;
}

/* The user's own "<path>.tmp" (not made by accel: no mark), of `size`
 * bytes: the save (by save_fn) fails naming it and saying it was not
 * overwritten; it keeps every byte, and path its old text. */
static void check_user_tmp_kept(const char *what, size_t size, accel_status (*save_fn)(const char *path)) {
    char path[96], tmp[96], buf[256];
    at(path, sizeof path, "kept.json");
    at(tmp, sizeof tmp, "kept.json.tmp");
    put(path, "{\"v\": 1}");
    unsigned char *mine = malloc(size);
    CHECK(mine != NULL);
    if (!mine) return;
    fill(mine, size);
    FILE *f = fopen(tmp, "wb");
    CHECK(f && fwrite(mine, 1, size, f) == size && fclose(f) == 0);
    accel_status st = save_fn(path);
    const char *err = st ? accel_last_error() : "";
    CHECK_MSG(st != ACCEL_OK, "%s: the save went through the user's %s", what, tmp);
    CHECK_MSG(strstr(err, tmp) && strstr(err, "is not a scratch file of this user's accel") && strstr(err, "not overwritten"),
              "%s: error: %s", what, err);
    accel_clear_error();
    CHECK_MSG(holds(tmp, mine, size), "%s: the user's %s changed", what, tmp);
    CHECK_MSG(!strcmp(text_of(path, buf, sizeof buf), "{\"v\": 1}"), "%s: path now %s", what, buf);
    free(mine);
    unlink(tmp);
    unlink(path);
}

static void test_user_tmp_kept(void) {
    check_user_tmp_kept("json, 3 bytes", 3, save_json);
    check_user_tmp_kept("json, 1 MiB", 1 << 20, save_json);
    check_user_tmp_kept("empty", 0, save_json);
    check_user_tmp_kept("save_bytes, 3 bytes", 3, save_bytes);
    check_user_tmp_kept("save_bytes, empty", 0, save_bytes);
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
    if (kid == 0) { /* the writer, half written */
        accel__afile f;
        if (accel__afile_open(&f, path) != ACCEL_OK || accel__afile_write(&f, "{\"v\": ", 6) != ACCEL_OK) _exit(1);
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

/* A writer stopped (SIGSTOP) holding the tmp's lock mid-write: the next
 * save waits only ACCEL_WRITE_STALL_TIMEOUT seconds of no progress, then
 * fails naming path and the stopped writer's pid, path keeping its old text;
 * resumed, the writer commits, and a save after it goes through. A writer
 * that keeps writing is waited for past that timeout. */
static void test_stopped_writer(void) {
    char path[96], buf[256], err[512], pid[32];
    put(at(path, sizeof path, "stopped.json"), "{\"v\": 1}");
    CHECK(setenv("ACCEL_WRITE_STALL_TIMEOUT", "0.3", 1) == 0);
    pid_t kid = fork();
    if (kid == 0) {
        accel__afile f;
        if (accel__afile_open(&f, path) != ACCEL_OK || accel__afile_write(&f, "{\"v\": ", 6) != ACCEL_OK) _exit(1);
        raise(SIGSTOP);
        _exit(accel__afile_write(&f, "3}", 2) == ACCEL_OK && accel__afile_commit(&f) == ACCEL_OK ? 0 : 1);
    }
    int st = 0;
    CHECK(waitpid(kid, &st, WUNTRACED) == kid && WIFSTOPPED(st));
    CHECK_MSG(save(path, err, sizeof err) != ACCEL_OK, "the save went on beside the stopped writer");
    /* the holder's pid comes from /proc/locks (Linux); without it, "another writer" */
    snprintf(pid, sizeof pid, access("/proc/locks", R_OK) == 0 ? "pid %d (stopped)" : "another writer", (int)kid);
    CHECK_MSG(strstr(err, path) && strstr(err, pid) && strstr(err, "no progress"), "error: %s", err);
    CHECK_MSG(!strcmp(text_of(path, buf, sizeof buf), "{\"v\": 1}"), "path now %s", buf);
    CHECK(kill(kid, SIGCONT) == 0);
    CHECK(waitpid(kid, &st, 0) == kid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK_MSG(!strcmp(text_of(path, buf, sizeof buf), "{\"v\": 3}"), "path now %s", buf);

    CHECK(setenv("ACCEL_WRITE_STALL_TIMEOUT", "1", 1) == 0);
    int ready[2];
    CHECK(pipe(ready) == 0);
    if ((kid = fork()) == 0) { /* writes a byte every 20 ms for 3 s, then commits */
        accel__afile f;
        if (accel__afile_open(&f, path) != ACCEL_OK || write(ready[1], "x", 1) != 1) _exit(1);
        for (int i = 0; i < 150; i++) {
            if (accel__afile_write(&f, " ", 1) != ACCEL_OK) _exit(1);
            usleep(20 * 1000);
        }
        _exit(accel__afile_write(&f, "{\"v\": 4}", 8) == ACCEL_OK && accel__afile_commit(&f) == ACCEL_OK ? 0 : 1);
    }
    char c;
    CHECK(read(ready[0], &c, 1) == 1);
    CHECK_MSG(save(path, err, sizeof err) == ACCEL_OK, "a save behind a live writer failed: %s", err);
    CHECK(waitpid(kid, &st, 0) == kid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK_MSG(strstr(text_of(path, buf, sizeof buf), "\"v\": 2") != NULL, "got %s", buf);
    close(ready[0]);
    close(ready[1]);

    CHECK(setenv("ACCEL_WRITE_STALL_TIMEOUT", "soon", 1) == 0);
    CHECK(save(path, err, sizeof err) != ACCEL_OK);
    CHECK_MSG(strstr(err, "ACCEL_WRITE_STALL_TIMEOUT") != NULL, "error: %s", err);
    CHECK(unsetenv("ACCEL_WRITE_STALL_TIMEOUT") == 0);
    unlink(path);
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

/* Whether process pid has path open (Linux's /proc/<pid>/fd). */
static bool has_open(pid_t pid, const char *path) {
    char fds[64], link[64 + 256], to[256];
    snprintf(fds, sizeof fds, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(fds);
    bool found = false;
    for (struct dirent *e; d && !found && (e = readdir(d));) {
        snprintf(link, sizeof link, "%s/%s", fds, e->d_name);
        ssize_t n = readlink(link, to, sizeof to - 1);
        found = n > 0 && (to[n] = 0, !strcmp(to, path));
    }
    if (d) closedir(d);
    return found;
}

/* A writer that waited for another keeps the mode of the file it replaces
 * as that one left it: the first writer here (the writer's protocol by
 * hand: the marked tmp, locked, renamed over path) makes path private
 * (0600); the second, which looked at path (0644) before it waited, made it
 * readable by everyone again. */
static void test_waiter_keeps_mode_it_replaces(void) {
    char path[96], tmp[96], buf[256], err[512];
    if (access("/proc/self/fd", R_OK) != 0) {
        printf("skip: no /proc/self/fd to see the second writer wait\n");
        return;
    }
    put(at(path, sizeof path, "private.json"), "{\"v\": 1}");
    at(tmp, sizeof tmp, "private.json.tmp");
    CHECK(chmod(path, 0644) == 0);
    int ready[2], go[2];
    CHECK(pipe(ready) == 0 && pipe(go) == 0);
    fflush(NULL);
    pid_t first = fork();
    if (first == 0) {
        char c;
        int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, S_ISVTX | 0600);
        if (fd < 0 || flock(fd, LOCK_EX) != 0 || write(fd, "{\"v\": 3}", 8) != 8 || write(ready[1], "x", 1) != 1 ||
            read(go[0], &c, 1) != 1 || fchmod(fd, 0600) != 0 || rename(tmp, path) != 0)
            _exit(1);
        _exit(0); /* the lock goes with the process */
    }
    char c;
    CHECK(read(ready[0], &c, 1) == 1);
    pid_t second = fork();
    if (second == 0) _exit(save(path, err, sizeof err) == ACCEL_OK ? 0 : 1);
    /* the second writer has the tmp open once it looked at path and waits for the lock */
    for (int i = 0; i < 10000 && !has_open(second, tmp); i++) usleep(1000);
    CHECK_MSG(has_open(second, tmp), "the second writer never opened %s", tmp);
    CHECK(write(go[1], "x", 1) == 1);
    int st = 0;
    CHECK(waitpid(first, &st, 0) == first && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(waitpid(second, &st, 0) == second && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK_MSG(strstr(text_of(path, buf, sizeof buf), "\"v\": 2") != NULL, "path now %s", buf);
    struct stat sb;
    CHECK_MSG(stat(path, &sb) == 0 && (sb.st_mode & 07777) == 0600, "mode %o, want the first writer's 0600",
              (unsigned)sb.st_mode & 07777);
    for (int i = 0; i < 2; i++) close(ready[i]), close(go[i]);
    unlink(path);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/accel_afile_hostile_%d", (int)getpid());
    CHECK(mkdir(g_dir, 0700) == 0);
    RUN(test_stale_tmp_reused);
    RUN(test_user_tmp_kept);
    RUN(test_killed_writer_mid_write);
    RUN(test_stopped_writer);
    RUN(test_waiter_keeps_mode_it_replaces);
    RUN(test_tmp_symlink_refused);
    RUN(test_tmp_hardlink_refused);
    RUN(test_tmp_fifo_refused);
    RUN(test_path_is_directory);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    CHECK(system(cmd) == 0);
    return check_summary();
}
