/* What the atomic writer (src/core/afile.c) replaces: a file the user made
 * private (0600) stays 0600 through a safetensors save (it became 0644); a
 * symbolic link to a file on another directory stays a link and its target
 * gets the bytes, the scratch file beside the target (the link was replaced
 * by a file of its own); a relative link, a chain of links and a dangling
 * link (its target created, as Python's open() does) likewise; a link loop,
 * a link into a directory that does not exist, a target in a directory that
 * is not writable and a target that is a directory are errors naming the
 * path, nothing written (the read-only directory's case only where the
 * test does not run as root, who writes anywhere); the owner of a file
 * replaced is kept where the test runs as root (it became root's); a
 * 255-byte name ("<name>.tmp" over NAME_MAX) is
 * written (it could not be). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "accel/accel.h"
#include "accel/io.h"
#include "check.h"
#include "core/afile.h"

static char g_dir[64];

static const char *at(char *buf, size_t n, const char *name) {
    snprintf(buf, n, "%s/%s", g_dir, name);
    return buf;
}

/* path's text (up to 255 bytes), "" when it cannot be read. */
static const char *text_of(const char *path, char *buf, size_t n) {
    buf[0] = 0;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return buf;
    ssize_t r = read(fd, buf, n - 1);
    buf[r > 0 ? r : 0] = 0;
    close(fd);
    return buf;
}

static bool is_link(const char *path) {
    struct stat sb;
    return lstat(path, &sb) == 0 && S_ISLNK(sb.st_mode);
}

/* The reviewer's scenario: safetensors saves over a 0600 file and over a link. */
static void test_safetensors_mode_and_link(void) {
    char priv[160], big[160], linked[160];
    const char *names[1] = {"w"};
    accel_tensor *t = accel_full(ACCEL_F32, 1, (int64_t[]){4}, 1.0);
    CHECK(t != NULL);
    at(priv, sizeof priv, "priv.safetensors");
    CHECK(accel_safetensors_save(priv, 1, names, &t, 0, NULL) == ACCEL_OK);
    CHECK(chmod(priv, 0600) == 0);
    CHECK(accel_safetensors_save(priv, 1, names, &t, 0, NULL) == ACCEL_OK);
    struct stat sb;
    accel__afile w0; /* mid-write, the scratch file is as private as the file */
    CHECK(accel__afile_open(&w0, priv) == ACCEL_OK);
    CHECK_MSG(fstat(w0.fd, &sb) == 0 && (sb.st_mode & 0777) == 0600, "the scratch file of a 0600 file: mode %o",
              (unsigned)sb.st_mode & 0777);
    accel__afile_abort(&w0);
    CHECK_MSG(stat(priv, &sb) == 0 && (sb.st_mode & 07777) == 0600, "a 0600 file re-saved: mode %o",
              (unsigned)sb.st_mode & 07777);
    CHECK(mkdir(at(big, sizeof big, "bigdisk"), 0700) == 0);
    at(big, sizeof big, "bigdisk/big.safetensors");
    CHECK(accel_safetensors_save(big, 1, names, &t, 0, NULL) == ACCEL_OK);
    CHECK(chmod(big, 0640) == 0);
    CHECK(symlink(big, at(linked, sizeof linked, "linked.safetensors")) == 0);
    accel_tensor_free(t);
    t = accel_full(ACCEL_F32, 1, (int64_t[]){8}, 2.0);
    CHECK(accel_safetensors_save(linked, 1, names, &t, 0, NULL) == ACCEL_OK);
    CHECK_MSG(is_link(linked), "%s is no longer a link", linked);
    accel_safetensors *f = accel_safetensors_open(big);
    const accel_st_info *w = f ? accel_safetensors_find(f, "w") : NULL;
    CHECK_MSG(w && w->shape[0] == 8, "the link's target did not get the save");
    accel_safetensors_close(f);
    CHECK(stat(big, &sb) == 0 && (sb.st_mode & 07777) == 0640);
    if (geteuid() == 0) { /* only root may give a file to another user: the owner kept */
        CHECK(chown(big, 12345, 23456) == 0);
        CHECK(accel_safetensors_save(linked, 1, names, &t, 0, NULL) == ACCEL_OK);
        CHECK_MSG(stat(big, &sb) == 0 && sb.st_uid == 12345 && sb.st_gid == 23456 && (sb.st_mode & 07777) == 0640,
                  "owner %d:%d mode %o", (int)sb.st_uid, (int)sb.st_gid, (unsigned)sb.st_mode & 07777);
    }
    accel_tensor_free(t);
}

/* A relative link through another (a chain), and a dangling one. */
static void test_relative_chain_and_dangling(void) {
    char a[160], b[160], target[160], buf[160];
    CHECK(mkdir(at(target, sizeof target, "sub"), 0700) == 0);
    CHECK(symlink("sub/real.txt", at(b, sizeof b, "b.txt")) == 0); /* dangling until the write */
    CHECK(symlink("b.txt", at(a, sizeof a, "a.txt")) == 0);
    CHECK_MSG(accel__afile_write_all(a, "one", 3) == ACCEL_OK, "%s", accel_last_error());
    CHECK(is_link(a) && is_link(b));
    CHECK(!strcmp(text_of(at(target, sizeof target, "sub/real.txt"), buf, sizeof buf), "one"));
    CHECK(accel__afile_write_all(a, "two", 3) == ACCEL_OK);
    CHECK(!strcmp(text_of(target, buf, sizeof buf), "two") && is_link(a) && is_link(b));
    CHECK(access(at(buf, sizeof buf, "a.txt.tmp"), F_OK) != 0 && access(at(buf, sizeof buf, "sub/real.txt.tmp"), F_OK) != 0);
}

/* path fails with an error naming it; nothing named *.tmp left in g_dir. */
static void check_refused(const char *what, const char *path, const char *words) {
    CHECK_MSG(accel__afile_write_all(path, "x", 1) != ACCEL_OK, "%s: written", what);
    const char *err = accel_last_error();
    CHECK_MSG(strstr(err, path) && strstr(err, words), "%s: %s", what, err);
    accel_clear_error();
}

static void test_bad_targets(void) {
    char loop1[160], loop2[160], nodir[160], ro[160], rofile[160], rolink[160], dir[160];
    CHECK(symlink("loop2", at(loop1, sizeof loop1, "loop1")) == 0);
    CHECK(symlink("loop1", at(loop2, sizeof loop2, "loop2")) == 0);
    check_refused("a link loop", loop1, "loop");
    CHECK(symlink("nowhere/file", at(nodir, sizeof nodir, "nodir")) == 0);
    check_refused("a link into a missing directory", nodir, "does not exist");
    CHECK(access(at(dir, sizeof dir, "nowhere"), F_OK) != 0);
    CHECK(mkdir(at(dir, sizeof dir, "adir"), 0700) == 0);
    check_refused("a directory", dir, "is a directory, not a file");
    CHECK(access(at(dir, sizeof dir, "adir.tmp"), F_OK) != 0);
    if (geteuid() != 0) { /* root writes anywhere */
        CHECK(mkdir(at(ro, sizeof ro, "ro"), 0700) == 0);
        int fd = open(at(rofile, sizeof rofile, "ro/f.txt"), O_WRONLY | O_CREAT, 0644);
        CHECK(fd >= 0 && write(fd, "old", 3) == 3 && close(fd) == 0);
        CHECK(chmod(ro, 0500) == 0);
        CHECK(symlink(rofile, at(rolink, sizeof rolink, "rolink")) == 0);
        check_refused("a target in a read-only directory", rolink, "must be writable");
        char buf[16];
        CHECK(!strcmp(text_of(rofile, buf, sizeof buf), "old"));
        CHECK(chmod(ro, 0700) == 0);
    }
}

/* A 255-byte name: "<name>.tmp" is over NAME_MAX, the scratch file is shorter. */
static void test_longest_name(void) {
    char name[NAME_MAX + 1], path[512], scratch[600], buf[16];
    memset(name, 'n', NAME_MAX);
    name[NAME_MAX] = 0;
    at(path, sizeof path, name);
    CHECK_MSG(accel__afile_write_all(path, "long", 4) == ACCEL_OK, "%s", accel_last_error());
    CHECK(!strcmp(text_of(path, buf, sizeof buf), "long"));
    CHECK(accel__afile_scratch(path, scratch, sizeof scratch) == ACCEL_OK);
    CHECK(strlen(strrchr(scratch, '/') + 1) == NAME_MAX && access(scratch, F_OK) != 0);
    name[NAME_MAX - 1] = 'm'; /* another long name: another scratch file */
    char other[512], scratch2[600];
    CHECK(accel__afile_scratch(at(other, sizeof other, name), scratch2, sizeof scratch2) == ACCEL_OK);
    CHECK(strcmp(scratch, scratch2) != 0);
    unlink(path);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/accel_afile_target_%d", (int)getpid());
    CHECK(mkdir(g_dir, 0700) == 0);
    RUN(test_safetensors_mode_and_link);
    RUN(test_relative_chain_and_dangling);
    RUN(test_bad_targets);
    RUN(test_longest_name);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "chmod -R u+w %s; rm -rf %s", g_dir, g_dir);
    CHECK(system(cmd) == 0);
    return check_summary();
}
