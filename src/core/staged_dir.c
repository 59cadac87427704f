/* src/core/staged_dir.c — a directory written aside, then swapped in with one
 * rename, so that it holds the previous save or the new one, never a mix
 * (core/staged_dir.h): save_state, save_model and io's weight writers. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/afile.h"
#include "core/core_internal.h"
#include "core/staged_dir.h"

#define PATHN 4096

/* ---------------------------------------------------------------- files */

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *f) {
    (void)sb, (void)flag, (void)f;
    int r = remove(p);
    KILL_POINT("rm_rf: one entry removed");
    return r;
}

void accel__rm_rf(const char *path) {
    struct stat sb;
    if (lstat(path, &sb) == 0) nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT); /* never into a mount */
}

static bool is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static accel_status mkdir_p(const char *path, const char *op) {
    char buf[PATHN];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *s = buf + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            if (mkdir(buf, 0755) && errno != EEXIST) break;
            *s = '/';
        }
    if (mkdir(buf, 0755) == 0 || (errno == EEXIST && is_dir(buf))) return ACCEL_OK;
    return accel_set_error(ACCEL_ERR_IO, "%s: cannot create directory %s: %s", op, path, strerror(errno));
}

void accel__fsync_dir(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

/* parent and basename of path (no trailing slash). */
static void split_path(const char *path, char *parent, char *base) {
    char buf[PATHN + 64];
    snprintf(buf, sizeof buf, "%s", path);
    size_t n = strlen(buf);
    while (n > 1 && buf[n - 1] == '/') buf[--n] = 0;
    char *slash = strrchr(buf, '/');
    if (!slash) {
        strcpy(parent, ".");
        snprintf(base, PATHN + 64, "%s", buf);
    } else {
        snprintf(base, PATHN + 64, "%s", slash + 1);
        *slash = 0;
        snprintf(parent, PATHN + 64, "%s", slash == buf ? "/" : buf);
    }
}

/* The staged sibling's name around dir's: a name only a save makes, since a
 * leftover of a killed save is removed unseen (a user's ".tmp_<name>" is no
 * leftover of ours). */
#define STAGED_PREFIX "."
#define STAGED_SUFFIX ".accel-staging"

void accel__staged_path(const char *dir, char *tmp, size_t n) {
    char parent[PATHN + 64], base[PATHN + 64];
    split_path(dir, parent, base);
    snprintf(tmp, n, "%s/" STAGED_PREFIX "%s" STAGED_SUFFIX, parent, base);
}

/* A file that cannot be hard-linked (a filesystem without links), copied,
 * with its times (a carried file is one older than the save: settle_previous). */
static accel_status copy_file(const char *from, const char *to, const struct stat *sb, const char *op) {
    int fd = open(from, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return accel_set_error(ACCEL_ERR_IO, "%s: cannot carry %s over to the new save: %s", op, from,
                                       strerror(errno));
    accel__afile f;
    accel_status s = accel__afile_open(&f, to);
    char buf[1 << 16];
    ssize_t got = 0;
    while (!s && (got = read(fd, buf, sizeof buf)) > 0) s = accel__afile_write(&f, buf, (size_t)got);
    int err = errno;
    close(fd);
    if (!s && got < 0) s = accel_set_error(ACCEL_ERR_IO, "cannot read %s: %s", from, strerror(err));
    if (!s) s = accel__afile_commit(&f);
    else accel__afile_abort(&f); /* nothing when the open failed */
    if (!s) utimensat(AT_FDCWD, to, (struct timespec[]){sb->st_atim, sb->st_mtim}, 0);
    return s ? accel_set_error(s, "%s: cannot carry %s over to the new save: %s", op, from, accel_last_error()) : s;
}

#ifndef STATX_ATTR_MOUNT_ROOT
#define STATX_ATTR_MOUNT_ROOT 0x2000 /* Linux 5.8's; older headers lack the name */
#endif

/* Whether path (lstat sb, an entry of the directory parent) is the root of a
 * mount: statx says so where the kernel knows (a bind mount of the same
 * filesystem too), else it is on another device than its parent. */
static bool mount_root(const char *path, const struct stat *sb, const char *parent) {
    struct statx sx;
    if (statx(AT_FDCWD, path, AT_SYMLINK_NOFOLLOW, STATX_TYPE, &sx) == 0 &&
        (sx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT))
        return (sx.stx_attributes & STATX_ATTR_MOUNT_ROOT) != 0;
    struct stat p;
    return !S_ISLNK(sb->st_mode) && stat(parent, &p) == 0 && p.st_dev != sb->st_dev;
}

/* Every entry of from (with carry: those it accepts) into to: files
 * hard-linked (copied where refused), symbolic links and FIFOs re-made
 * (sockets and device nodes are not carried: a path of them means nothing
 * once their directory is replaced), directories
 * made and filled the same way. */
static accel_status carry_tree(const char *from, const char *to, bool (*carry)(const char *, void *), void *ctx,
                               const char *op) {
    DIR *d = opendir(from);
    if (!d) return accel_set_error(ACCEL_ERR_IO, "%s: cannot list %s: %s", op, from, strerror(errno));
    accel_status s = ACCEL_OK;
    for (struct dirent *e; !s && (e = readdir(d));) {
        char src[2 * PATHN], dst[2 * PATHN], target[PATHN];
        struct stat sb;
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || (carry && !carry(e->d_name, ctx))) continue;
        snprintf(src, sizeof src, "%s/%s", from, e->d_name);
        snprintf(dst, sizeof dst, "%s/%s", to, e->d_name);
        /* gone meanwhile; or an atomic write's scratch file (a killed one's: the save's own write of
         * that name would find it linked twice, and refuse) */
        if (lstat(src, &sb) || accel__afile_is_scratch(&sb)) continue;
        if (mount_root(src, &sb, from)) {
            s = accel_set_error(ACCEL_ERR_IO, "%s: %s is a mount point (another filesystem, or a bind mount): the save "
                                "replaces the directory that holds it as a whole, which cannot carry a mount over "
                                "(the mounted files would be copied, and removed from it with the replaced "
                                "directory); unmount it or save elsewhere; nothing was changed", op, src);
        } else if (FAIL_POINT("stage: entry carried over")) {
            s = accel_set_error(ACCEL_ERR_IO, "%s: cannot carry %s over: %s (injected)", op, src, strerror(ENOSPC));
        } else if (S_ISDIR(sb.st_mode)) { /* writable while it is filled (a read-only one refused the links) */
            s = mkdir(dst, 0700) ? accel_set_error(ACCEL_ERR_IO, "%s: cannot create %s: %s", op, dst, strerror(errno))
                                 : carry_tree(src, dst, NULL, NULL, op);
            if (!s) chmod(dst, sb.st_mode & 07777);
        } else if (S_ISFIFO(sb.st_mode)) {
            if (mkfifo(dst, sb.st_mode & 07777))
                s = accel_set_error(ACCEL_ERR_IO, "%s: cannot carry the FIFO %s over: %s", op, src, strerror(errno));
        } else if (S_ISLNK(sb.st_mode)) {
            ssize_t n = readlink(src, target, sizeof target - 1);
            if (n >= 0) target[n] = 0;
            if (n < 0 || symlink(target, dst))
                s = accel_set_error(ACCEL_ERR_IO, "%s: cannot carry the link %s over: %s", op, src, strerror(errno));
        } else if (S_ISREG(sb.st_mode) && link(src, dst)) {
            s = copy_file(src, dst, &sb, op);
        }
    }
    closedir(d);
    return s;
}

/* A last path component of "." or "..": a directory named by another's name. */
static bool dots_name(const char *base) { return !strcmp(base, ".") || !strcmp(base, ".."); }

void accel__staged_resolve(const char *dir, char *out, size_t n) {
    char real[PATH_MAX], parent[PATHN + 64], base[PATHN + 64];
    struct stat lsb;
    split_path(dir, parent, base);
    /* "x/y/..": the directory x, by its own name */
    if ((dots_name(base) || (lstat(dir, &lsb) == 0 && S_ISLNK(lsb.st_mode))) && realpath(dir, real)) dir = real;
    snprintf(out, n, "%s", dir);
}

/* The swap replaces dir as a whole: the process's working directory inside it
 * would be left in the removed one. */
static accel_status refuse_cwd(const char *dir, const char *op) {
    char cwd[PATH_MAX], real[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd) || !realpath(dir, real)) return ACCEL_OK; /* dir does not exist yet */
    size_t n = strlen(real);
    if (strncmp(cwd, real, n) || (cwd[n] && cwd[n] != '/' && strcmp(real, "/"))) return ACCEL_OK;
    return accel_set_error(ACCEL_ERR_INVALID_ARG,
                           "%s: %s is the process's working directory or holds it (%s): the save replaces the "
                           "directory as a whole (crash safety), which would leave the process in the removed one; "
                           "save into a subdirectory, or change directory first", op, dir, cwd);
}

bool accel__is_mount_point(const char *dir) {
    char parent[PATHN + 64], base[PATHN + 64];
    struct stat d;
    split_path(dir, parent, base);
    return lstat(dir, &d) == 0 && S_ISDIR(d.st_mode) && mount_root(dir, &d, parent);
}

/* A mount point cannot be swapped with a sibling (the rename crosses
 * filesystems, or the mount is busy): said before anything is written,
 * rather than after the whole save was staged on the parent's filesystem. */
static accel_status refuse_mount_point(const char *dir, const char *parent, const char *op) {
    if (!accel__is_mount_point(dir)) return ACCEL_OK;
    return accel_set_error(ACCEL_ERR_IO, "%s: %s is a mount point (another filesystem than its parent %s, or a bind "
                           "mount): the save is written beside it and swapped in with one rename, which cannot move "
                           "a mount point; save into a subdirectory of it", op, dir, parent);
}

/* Something other than a directory at dir (a file, a link leading nowhere:
 * links to directories were resolved) would only fail the swap, once the
 * whole save is written: said first, and nothing of it is touched. */
static accel_status refuse_non_directory(const char *dir, const char *op) {
    struct stat sb;
    if (lstat(dir, &sb) != 0 || S_ISDIR(sb.st_mode)) return ACCEL_OK;
    return accel_set_error(ACCEL_ERR_IO, "%s: Provided path (%s) should be a directory, not a %s", op, dir,
                           S_ISREG(sb.st_mode) ? "file" : S_ISLNK(sb.st_mode) ? "link that leads to no directory"
                                                                               : "device, FIFO or socket");
}

/* Rank 0's lock on dir's parent for the save, so that two processes saving
 * into one directory at once take turns (each would remove the other's
 * staged sibling as a leftover, and one's swap would publish a directory the
 * other was still writing): waited for as long as the other save makes
 * progress (ACCEL_WRITE_STALL_TIMEOUT without, as the atomic writer waits). A
 * staged sibling found once the lock is held is a dead save's. */
static accel_status lock_parent(const char *dir, const char *parent, accel__staging *sg, const char *op) {
    double stall_s;
    if (accel__write_stall_timeout(&stall_s)) return accel_last_status();
    int fd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 && errno == EACCES) return ACCEL_OK; /* a parent we may write but not read (mode -wx): unguarded */
    if (fd < 0) return accel_set_error(ACCEL_ERR_IO, "%s: cannot open %s: %s", op, parent, strerror(errno));
    long pid = 0;
    bool stopped = false;
    int r = accel__flock_wait(fd, stall_s, &pid, &stopped);
    if (r == 0) {
        sg->lock = fd;
        return ACCEL_OK;
    }
    int err = errno;
    close(fd);
    if (r < 0 && (err == ENOLCK || err == EOPNOTSUPP)) return ACCEL_OK; /* a filesystem without locks: unguarded */
    char holder[64] = "another save";
    if (pid) snprintf(holder, sizeof holder, "the save of pid %ld%s", pid, stopped ? " (stopped)" : "");
    return r > 0 ? accel_set_error(ACCEL_ERR_TIMEOUT, "%s: cannot save into %s: %s into %s has made no progress for "
                                   "%g s (ACCEL_WRITE_STALL_TIMEOUT): resume or end it; nothing was changed", op, dir,
                                   holder, parent, stall_s)
                 : accel_set_error(ACCEL_ERR_IO, "%s: cannot lock %s: %s", op, parent, strerror(err));
}

static void unlock_parent(accel__staging *sg) {
    if (sg->lock >= 0) close(sg->lock); /* the flock goes with it */
    sg->lock = -1;
}

accel_status accel__staged_begin(const char *dir, const char *tmp, accel__staging *sg, const char *op) {
    char parent[PATHN + 64], base[PATHN + 64];
    split_path(dir, parent, base);
    sg->lock = -1;
    sg->held = false;
    if (!*dir) return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: the directory to save into is \"\"", op);
    if (dots_name(base)) /* accel__staged_resolve found no directory by that name */
        return accel_set_error(ACCEL_ERR_IO, "%s: cannot save into %s: no such directory", op, dir);
    if (strlen(base) + strlen(STAGED_PREFIX STAGED_SUFFIX) > NAME_MAX)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: the name of %s is %zu bytes: the save is written beside it "
                               "into " STAGED_PREFIX "<name>" STAGED_SUFFIX ", which must fit in %d bytes (a name of "
                               "at most %zu)", op, dir, strlen(base), NAME_MAX,
                               NAME_MAX - strlen(STAGED_PREFIX STAGED_SUFFIX));
    accel_status s = refuse_non_directory(dir, op);
    if (!s) s = refuse_cwd(dir, op);
    if (!s) s = refuse_mount_point(dir, parent, op);
    if (!s) s = mkdir_p(parent, op);
    if (!s) s = lock_parent(dir, parent, sg, op);
    if (s) return s;
    accel__rm_rf(tmp); /* left over by a crashed save */
    s = mkdir_p(tmp, op);
    sg->held = !s;
    KILL_POINT("save: temporary directory made");
    struct stat sb, made;
    /* the filesystem's clock at the start: what the save writes is no older */
    if (!s && stat(tmp, &made) == 0) sg->began = made.st_mtim;
    if (!s && stat(dir, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        chmod(tmp, sb.st_mode & 07777); /* the directory that replaces dir keeps its permissions */
        if (sg->carry) s = carry_tree(dir, tmp, sg->carry, sg->ctx, op);
    }
    if (s) accel__staged_abort(tmp, sg); /* ours (any leftover went above): a failed begin leaves nothing */
    return s;
}

/* The lock is the mount point's own, not its parent's: the parent lies on
 * another filesystem, and each container sharing a volume sees its own. */
accel_status accel__staged_begin_in_place(const char *dir, accel__staging *sg, const char *op) {
    sg->lock = -1;
    sg->held = false; /* nothing staged */
    return lock_parent(dir, dir, sg, op);
}

void accel__staged_release(accel__staging *sg) {
    sg->held = false;
    unlock_parent(sg);
}

/* fsync of every directory of tree, so that the entries made in them (files
 * renamed in, links carried over) are on disk before the swap publishes them. */
static int fsync_one(const char *p, const struct stat *sb, int flag, struct FTW *f) {
    (void)sb, (void)f;
    if (flag == FTW_DP) accel__fsync_dir(p);
    return 0;
}

/* Whether t is before u. */
static bool before(struct timespec t, struct timespec u) {
    return t.tv_sec != u.tv_sec ? t.tv_sec < u.tv_sec : t.tv_nsec < u.tv_nsec;
}

/* Whether the symbolic links a and b lead to different places. */
static bool links_differ(const char *a, const char *b) {
    char ta[PATHN], tb[PATHN];
    ssize_t na = readlink(a, ta, sizeof ta), nb = readlink(b, tb, sizeof tb);
    return na != nb || (na > 0 && memcmp(ta, tb, (size_t)na));
}

/* After the swap, old (at the staged name) holds dir's previous content and
 * new (dir) the save with what was carried over when it began (sg). What a
 * writer made in dir while the save ran is in old alone, or differs from
 * what new holds by that name, which is then a carried file (one older than
 * the save: written and renamed over it meanwhile) or a link re-made to where
 * it led then: it is moved into new rather than removed with the rest.
 * Removed: the checkpoint's own entries (at the top, those carry refuses),
 * what new has from old (the same file, linked; folders, whose entries are
 * settled in turn) and what the save wrote itself (a save_model's
 * config.json: no older than the save). Whether old is gone then: not when a
 * writer holding it open added an entry meanwhile. */
static bool settle_previous(const char *old, const char *new, const accel__staging *sg, bool top) {
    DIR *d = opendir(old);
    if (!d) return false;
    for (struct dirent *e; (e = readdir(d));) {
        char from[2 * PATHN], to[2 * PATHN + 32];
        struct stat a, b;
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(from, sizeof from, "%s/%s", old, e->d_name);
        snprintf(to, sizeof to, "%s/%s", new, e->d_name);
        if (lstat(from, &a) || (top && sg->carry && !sg->carry(e->d_name, sg->ctx))) {
            accel__rm_rf(from);
        } else if (lstat(to, &b)) {
            rename(from, to);
        } else if (S_ISDIR(a.st_mode) && S_ISDIR(b.st_mode)) {
            settle_previous(from, to, sg, false);
        } else if (a.st_ino != b.st_ino &&
                   (S_ISLNK(a.st_mode) && S_ISLNK(b.st_mode) ? links_differ(from, to)
                                                             : S_ISREG(b.st_mode) && before(b.st_mtim, sg->began)) &&
                   rename(from, to)) {
            /* a folder where new has a file, or the reverse: kept beside it */
            snprintf(to, sizeof to, "%s/%s.accel-%ld", new, e->d_name, (long)a.st_ino);
            rename(from, to);
        }
        accel__rm_rf(from); /* what is left of it: new has it already, or the save's own */
    }
    closedir(d);
    return rmdir(old) == 0;
}

accel_status accel__staged_commit(const char *tmp, const char *dir, accel__staging *sg, const char *op) {
    char parent[PATHN + 64], base[PATHN + 64];
    split_path(dir, parent, base);
    nftw(tmp, fsync_one, 16, FTW_DEPTH | FTW_PHYS);
    if (FAIL_POINT("commit: before the swap"))
        return accel_set_error(ACCEL_ERR_IO, "%s: cannot replace %s: %s (injected)", op, dir, strerror(EIO));
    if (is_dir(dir)) {
        if (renameat2(AT_FDCWD, tmp, AT_FDCWD, dir, RENAME_EXCHANGE))
            return accel_set_error(ACCEL_ERR_IO, "%s: cannot replace %s: %s", op, dir, strerror(errno));
        accel__fsync_dir(parent);
        KILL_POINT("commit: directories exchanged");
        /* the previous content; a few passes for a writer holding it open */
        for (int pass = 0; pass < 3 && !settle_previous(tmp, dir, sg, true); pass++) continue;
        accel__rm_rf(tmp);
    } else if (rename(tmp, dir)) {
        return accel_set_error(ACCEL_ERR_IO, "%s: cannot rename %s to %s: %s", op, tmp, dir, strerror(errno));
    }
    accel__fsync_dir(parent);
    KILL_POINT("commit: renamed into place");
    sg->held = false; /* tmp's name is free: the next save's, once the lock is released */
    unlock_parent(sg);
    return ACCEL_OK;
}

void accel__staged_abort(const char *tmp, accel__staging *sg) {
    if (sg->held) accel__rm_rf(tmp);
    sg->held = false;
    unlock_parent(sg);
}
