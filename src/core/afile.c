/* src/core/afile.c — the atomic file writer (core/afile.h): "<path>.tmp",
 * created by us alone (O_EXCL, marked), locked, fsynced, renamed. */
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "core/afile.h"
#include "core/core_internal.h"
#include "core/env.h"

/* Who holds another writer's lock on the tmp, as far as Linux says: the pid
 * in /proc/locks's FLOCK line for the file (0 where unknown) and its state
 * letter in /proc/<pid>/stat ('R' running, 'D' in disk I/O, 'T' stopped...;
 * '?' where unknown). */
typedef struct lock_holder {
    long pid;
    char state;
} lock_holder;

static lock_holder find_holder(const struct stat *held) {
    lock_holder h = {0, '?'};
    FILE *f = fopen("/proc/locks", "r");
    char line[256];
    while (f && fgets(line, sizeof line, f)) {
        unsigned maj, mnr;
        unsigned long long ino;
        long pid;
        if (!strstr(line, "->") && sscanf(line, "%*d: FLOCK %*s %*s %ld %x:%x:%llu", &pid, &maj, &mnr, &ino) == 4 &&
            maj == major(held->st_dev) && mnr == minor(held->st_dev) && ino == (unsigned long long)held->st_ino) {
            h.pid = pid;
            break;
        }
    }
    if (f) fclose(f);
    if (!h.pid) return h;
    snprintf(line, sizeof line, "/proc/%ld/stat", h.pid);
    if ((f = fopen(line, "r"))) {
        size_t n = fread(line, 1, sizeof line - 1, f);
        line[n] = 0;
        char *e = strrchr(line, ')'); /* "pid (comm) S ...": comm may hold anything */
        if (e && e[1] == ' ' && e[2]) h.state = e[2];
        fclose(f);
    }
    return h;
}

/* Waits for the flock on fd (the tmp, held: its stat). Another writer of the
 * path holds it while it writes, fsyncs and renames: as long as it makes
 * progress (the tmp grows or is touched, or the holder runs or waits on the
 * disk) the wait goes on, however long the save. One that made none for
 * stall_s seconds (stopped by SIGSTOP or a debugger, hung) would hold this
 * writer forever: 1 with errno ETIMEDOUT and *who then. 0 when locked, -1
 * with errno when flock fails otherwise. */
static int wait_lock(int fd, const struct stat *held, double stall_s, lock_holder *who) {
    struct timespec nap = {0, 1000 * 1000};
    struct stat seen = *held, now;
    double since = accel_now_seconds();
    for (;;) {
        if (flock(fd, LOCK_EX | LOCK_NB) == 0) return 0;
        if (errno != EWOULDBLOCK && errno != EINTR) return -1;
        *who = find_holder(held);
        bool moved = fstat(fd, &now) == 0 && (now.st_size != seen.st_size || now.st_mtim.tv_sec != seen.st_mtim.tv_sec ||
                                               now.st_mtim.tv_nsec != seen.st_mtim.tv_nsec);
        if (moved) seen = now;
        if (moved || who->state == 'R' || who->state == 'D') since = accel_now_seconds();
        else if (accel_now_seconds() - since > stall_s) {
            errno = ETIMEDOUT;
            return 1;
        }
        nanosleep(&nap, NULL);
        if (nap.tv_nsec < 64 * 1000 * 1000) nap.tv_nsec *= 2;
    }
}

/* The mark of a scratch file accel created: the sticky bit, given by the
 * open() that creates it (O_EXCL: never an existing file) and cleared just
 * before the rename. It is set with the file itself, so no other writer ever
 * sees one of ours unmarked (an extended attribute would take a second call,
 * and some file systems keep none), and Linux gives it no meaning on a regular
 * file, so no one's own file carries it by chance. A "<path>.tmp" without it
 * is not ours (the user's, or one from before the mark): never truncated,
 * renamed or removed. */
#define SCRATCH_MARK S_ISVTX

/* fd, opened on "<path>.tmp", locked for this writer alone: another
 * process writing path at once (two runs sharing a GEMM choice cache) would
 * truncate and write the same file under us and rename it before we do. The
 * tmp is created here (O_EXCL, marked) or is another accel writer's: one
 * writing now (waited for) or one killed mid-write (its lock died with it:
 * reused). The lock is held through the rename (or the unlink), so a file
 * renamed or removed while we waited is no longer the tmp: opened again. -1
 * with errno when it cannot be opened (ETIMEDOUT: its holder stalled,
 * wait_lock); unlocked where the file system has no locks.
 * Only a regular file of one link is ours to truncate: a symbolic link (not
 * followed: ELOOP) or a hard link would have us overwrite whatever it names,
 * and a FIFO would take the bytes (and, renamed over path, block its
 * readers): EEXIST for those. A file this call created (*created) is ours
 * whether or not the file system kept its mark (FAT, SMB without unix
 * extensions keep no sticky bit); one found there is ours only with the mark
 * and our user's: else, still there once we hold its lock, *foreign. */
static int lock_tmp(const char *tmp, double stall_s, lock_holder *who, bool *foreign, bool *created) {
    for (;;) {
        int fd = open(tmp, O_RDONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, SCRATCH_MARK | 0644);
        *created = fd >= 0;
        if (fd < 0 && errno == EEXIST) {
            fd = open(tmp, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
            if (fd < 0 && errno == ENOENT) continue; /* renamed into place between the two opens */
        }
        if (fd < 0) return -1;
        struct stat held, now;
        if (fstat(fd, &held) != 0 || !S_ISREG(held.st_mode) || held.st_nlink > 1) {
            close(fd);
            errno = EEXIST;
            return -1;
        }
        int r = wait_lock(fd, &held, stall_s, who);
        if (r > 0) {
            close(fd);
            return -1;
        }
        if (r != 0 || (stat(tmp, &now) == 0 && held.st_dev == now.st_dev && held.st_ino == now.st_ino)) {
            if (*created || (fstat(fd, &now) == 0 && accel__afile_is_scratch(&now)))
                return fd;
            close(fd);
            *foreign = true;
            return -1;
        }
        close(fd);
    }
}

const char *accel__file_kind(mode_t m) {
    return S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a FIFO" : S_ISSOCK(m) ? "a socket"
           : S_ISCHR(m) || S_ISBLK(m) ? "a device" : "not a regular file";
}

accel_status accel__afile_target(const char *path, char *out, size_t n) {
    enum { MAX_HOPS = 40 }; /* the kernel's own limit (ELOOP) */
    if ((size_t)snprintf(out, n, "%s", path) >= n)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "cannot write %s: the name is too long", path);
    for (int hops = 0;; hops++) {
        struct stat st;
        if (lstat(out, &st) != 0 || !S_ISLNK(st.st_mode)) return ACCEL_OK;
        if (hops == MAX_HOPS)
            return accel_set_error(ACCEL_ERR_IO, "cannot write %s: its symbolic links loop (or lead through more "
                                   "than %d links)", path, MAX_HOPS);
        char link[4096];
        ssize_t k = readlink(out, link, sizeof link - 1);
        if (k < 0) return accel_set_error(ACCEL_ERR_IO, "cannot write %s: readlink %s: %s", path, out, strerror(errno));
        if ((size_t)k >= sizeof link - 1)
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "cannot write %s: the link %s names too long a path", path, out);
        link[k] = 0;
        char *slash = strrchr(out, '/'); /* a relative target is relative to the link's directory */
        size_t dir = link[0] == '/' || !slash ? 0 : (size_t)(slash - out) + 1;
        if (dir + (size_t)k >= n)
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "cannot write %s: the name its links lead to is too long", path);
        memcpy(out + dir, link, (size_t)k + 1);
    }
}

/* FNV-1a, 64 bits: the short scratch name's tag of a long file name. */
static uint64_t name_hash(const char *s) {
    uint64_t h = 14695981039346656037ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

accel_status accel__afile_scratch(const char *target, char *out, size_t n) {
    const char *slash = strrchr(target, '/'), *base = slash ? slash + 1 : target;
    size_t len = strlen(base), suffix = strlen(ACCEL__AFILE_TMP_SUFFIX);
    int w;
    if (len + suffix <= NAME_MAX) w = snprintf(out, n, "%s%s", target, ACCEL__AFILE_TMP_SUFFIX);
    else /* "<the name's first bytes>~<16 hex digits of the whole name>.tmp": NAME_MAX bytes */
        w = snprintf(out, n, "%.*s~%016llx%s", (int)((size_t)(base - target) + NAME_MAX - 17 - suffix), target,
                     (unsigned long long)name_hash(base), ACCEL__AFILE_TMP_SUFFIX);
    if (w < 0 || (size_t)w >= n)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "cannot write %s: the name is too long", target);
    return ACCEL_OK;
}

/* Why f's tmp could not be created or opened (errno err) for path. */
static accel_status open_failed(const accel__afile *f, const char *path, int err, bool foreign, lock_holder who,
                                double stall_s) {
    char holder[64] = "another writer";
    if (who.pid) snprintf(holder, sizeof holder, "pid %ld%s", who.pid, who.state == 'T' || who.state == 't' ? " (stopped)" : "");
    if (foreign)
        return accel_set_error(ACCEL_ERR_IO, "cannot write %s: %s exists and is not a scratch file of this "
                               "user's accel (those carry the sticky bit until renamed into place; "
                               "a killed writer's on a file system that keeps no sticky bit does "
                               "not): not overwritten; move it away; %s is left as it was",
                               path, f->tmp, f->path);
    if (err == ELOOP || err == EEXIST)
        return accel_set_error(ACCEL_ERR_IO, "cannot create %s: it exists and is not a plain file of ours "
                               "(a symbolic link, a hard link, a FIFO...): not overwritten; remove it", f->tmp);
    if (err == ETIMEDOUT)
        return accel_set_error(ACCEL_ERR_TIMEOUT, "cannot write %s: %s, writing it through %s, has made no progress "
                               "for %g s (ACCEL_WRITE_STALL_TIMEOUT): resume or end it; %s is left as it was",
                               path, holder, f->tmp, stall_s, f->path);
    if (err == ENOENT || err == ENOTDIR)
        return accel_set_error(ACCEL_ERR_IO, "cannot write %s: the directory of %s does not exist", path, f->path);
    if (err == EACCES || err == EPERM || err == EROFS)
        return accel_set_error(ACCEL_ERR_IO, "cannot write %s: cannot create the scratch file %s (%s): the file is "
                               "replaced by renaming that into place, so its directory must be writable",
                               path, f->tmp, strerror(err));
    return accel_set_error(ACCEL_ERR_IO, "cannot create %s: %s", f->tmp, strerror(err));
}

/* What a write of path (whose target is target) replaces: f->replaces, and
 * the mode, owner and group it keeps, of the file there now; a target that
 * is no regular file refused, naming it. */
static accel_status take_target(accel__afile *f, const char *path, const char *target) {
    struct stat old;
    f->replaces = stat(target, &old) == 0;
    if (!f->replaces) return ACCEL_OK;
    if (!S_ISREG(old.st_mode))
        return accel_set_error(ACCEL_ERR_IO, "cannot write %s: %s is %s, not a file: not replaced", path, target,
                               accel__file_kind(old.st_mode));
    f->mode = old.st_mode & 07777 & ~(mode_t)SCRATCH_MARK;
    f->uid = old.st_uid;
    f->gid = old.st_gid;
    return ACCEL_OK;
}

static void afile_release(accel__afile *f) {
    if (f->fd >= 0) close(f->fd);
    if (f->lock >= 0) close(f->lock); /* the next writer's turn */
    f->fd = f->lock = -1;
    accel_free(f->path);
    accel_free(f->tmp);
    f->path = f->tmp = NULL;
}

accel_status accel__afile_open(accel__afile *f, const char *path) {
    *f = (accel__afile){.fd = -1, .lock = -1};
    char target[4096], tmp[4096 + 8];
    double stall_s;
    if (accel__afile_target(path, target, sizeof target) || accel__afile_scratch(target, tmp, sizeof tmp) ||
        accel__write_stall_timeout(&stall_s) != ACCEL_OK)
        return accel_last_status();
    if (take_target(f, path, target)) return accel_last_status(); /* refused before a scratch file is made */
    f->path = accel_strdup(target);
    f->tmp = accel_strdup(tmp);
    if (!f->path || !f->tmp) {
        afile_release(f);
        return accel_set_error(ACCEL_ERR_OOM, "write %s: out of memory", path);
    }
    lock_holder who = {0, '?'};
    bool foreign = false, created = false;
    f->lock = lock_tmp(f->tmp, stall_s, &who, &foreign, &created);
    /* the target again, now that no other writer can replace it: the one this writer waited for may have, and its
     * file's mode and owner are the ones to keep (the first look's would undo a chmod it made) */
    accel_status refused = f->lock >= 0 ? take_target(f, path, target) : ACCEL_OK;
    if (f->lock >= 0 && !refused) f->fd = open(f->tmp, O_RDWR | O_TRUNC | O_NOFOLLOW | O_CLOEXEC);
    /* the replaced file's mode from the start: a private file's bytes never sit in a readable scratch file */
    if (f->fd >= 0 && f->replaces && fchmod(f->fd, f->mode | SCRATCH_MARK) != 0) {
        int err = errno;
        close(f->fd);
        f->fd = -1;
        errno = err;
    }
    if (f->fd < 0) {
        int err = errno;
        if (f->lock >= 0 && created) unlink(f->tmp); /* ours, made just now: nothing of it left behind */
        accel_status st = refused ? refused : open_failed(f, path, err, foreign, who, stall_s);
        afile_release(f);
        return st;
    }
    return ACCEL_OK;
}

accel_status accel__afile_write(accel__afile *f, const void *p, size_t n) {
    const char *c = p;
    if (n && FAIL_POINT("afile: bytes written"))
        return accel_set_error(ACCEL_ERR_IO, "write %s: %s (injected)", f->tmp, strerror(ENOSPC));
    while (n > 0) {
        ssize_t w = write(f->fd, c, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return accel_set_error(ACCEL_ERR_IO, "write %s: %s", f->tmp, strerror(errno));
        }
        c += w;
        n -= (size_t)w;
    }
    return ACCEL_OK;
}

accel_status accel__afile_commit(accel__afile *f) {
    accel_status st = ACCEL_OK;
    struct stat sb;
    if (fsync(f->fd) != 0)
        st = accel_set_error(ACCEL_ERR_IO, "fsync %s: %s", f->tmp, strerror(errno));
    else {
        /* the replaced file's owner where we may give it (root; a group of ours), then its mode: chown clears
         * the set-id bits, so the mode comes after */
        if (f->replaces && fchown(f->fd, f->uid, f->gid) != 0) (void)!fchown(f->fd, (uid_t)-1, f->gid);
        /* SCRATCH_MARK off before the rename: path, which its user may rename to some "<x>.tmp" later, must
         * not pass for a scratch file of ours there */
        if (fstat(f->fd, &sb) != 0 || fchmod(f->fd, f->replaces ? f->mode : sb.st_mode & 07777 & ~SCRATCH_MARK) != 0)
            st = accel_set_error(ACCEL_ERR_IO, "chmod %s: %s", f->tmp, strerror(errno));
    }
    if (close(f->fd) != 0 && st == ACCEL_OK)
        st = accel_set_error(ACCEL_ERR_IO, "close %s: %s", f->tmp, strerror(errno));
    f->fd = -1;
    if (st == ACCEL_OK && rename(f->tmp, f->path) != 0)
        st = accel_set_error(ACCEL_ERR_IO, "rename %s -> %s: %s", f->tmp, f->path, strerror(errno));
    if (st != ACCEL_OK) unlink(f->tmp);
    else KILL_POINT("afile: renamed into place");
    afile_release(f);
    return st;
}

void accel__afile_abort(accel__afile *f) {
    if (!f->tmp) return;
    if (f->fd >= 0) close(f->fd);
    f->fd = -1;
    unlink(f->tmp);
    afile_release(f);
}

accel_status accel__afile_write_all(const char *path, const void *data, size_t n) {
    accel__afile f;
    accel_status st = accel__afile_open(&f, path);
    if (st != ACCEL_OK) return st;
    st = accel__afile_write(&f, data, n);
    if (st == ACCEL_OK) return accel__afile_commit(&f);
    accel__afile_abort(&f);
    return st;
}

bool accel__afile_is_scratch(const struct stat *sb) {
    return S_ISREG(sb->st_mode) && (sb->st_mode & SCRATCH_MARK) && sb->st_uid == geteuid();
}

accel_status accel__write_stall_timeout(double *seconds) {
    return accel__env_double("ACCEL_WRITE_STALL_TIMEOUT", 60, 0, 1e6, seconds);
}

int accel__flock_wait(int fd, double stall_s, long *holder_pid, bool *holder_stopped) {
    struct stat held;
    lock_holder who = {0, '?'};
    int r = fstat(fd, &held) == 0 ? wait_lock(fd, &held, stall_s, &who) : -1;
    *holder_pid = who.pid;
    *holder_stopped = who.state == 'T' || who.state == 't';
    return r;
}
