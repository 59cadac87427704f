/* Directories, locks and whole-record appends for the trackers (whole files are
 * replaced through core/afile.h's writer). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/afile.h"
#include "tracking/tracking_internal.h"

accel_status accel__mkdirs(const char *path) {
    char p[4096];
    if (!path || !*path) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel: empty directory path");
    if (snprintf(p, sizeof p, "%s", path) >= (int)sizeof p)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel: path too long: %.64s...", path);
    for (char *s = p + 1;; s++) {
        bool end = *s == '\0';
        if (*s == '/' || end) {
            *s = '\0';
            if (mkdir(p, 0777) && errno != EEXIST)
                return accel_set_error(ACCEL_ERR_IO, "accel: cannot create directory %s: %s", p, strerror(errno));
            if (end) break;
            *s = '/';
        }
    }
    struct stat sb;
    if (stat(path, &sb) || !S_ISDIR(sb.st_mode))
        return accel_set_error(ACCEL_ERR_IO, "accel: %s is not a directory", path);
    return ACCEL_OK;
}

accel_status accel__tracker_lock(int fd, const char *who, const char *path) {
    double stall_s;
    if (accel__write_stall_timeout(&stall_s)) return accel_last_status();
    long pid = 0;
    bool stopped = false;
    int r = accel__flock_wait(fd, stall_s, &pid, &stopped);
    if (r == 0) return ACCEL_OK;
    if (r < 0) { /* flock itself failed: a file system without locks (unlocked, as the atomic writer), else named */
        int err = errno;
        if (err == ENOLCK || err == EOPNOTSUPP) return ACCEL_OK;
        return accel_set_error(ACCEL_ERR_IO, "%s: cannot lock %s: %s", who, path, strerror(err));
    }
    char holder[64] = "another process";
    if (pid) snprintf(holder, sizeof holder, "pid %ld%s", pid, stopped ? " (stopped)" : "");
    return accel_set_error(ACCEL_ERR_TIMEOUT, "%s: %s is locked by %s, which has made no progress for %g s "
                           "(ACCEL_WRITE_STALL_TIMEOUT): resume or end it", who, path, holder, stall_s);
}

accel_status accel__append_whole(int fd, bool shared, const char *who, const char *to, const char *path,
                                 const void *buf, size_t n) {
    /* shared: one appender at a time (another run's tracker appending to the same file): the end found here stays
     * the end until this record is written or cut off again, so the cut never takes another's record with it */
    accel_status st = shared ? accel__tracker_lock(fd, who, path) : ACCEL_OK;
    if (st) return st;
    off_t end = lseek(fd, 0, SEEK_END);
    if (end < 0) st = accel_set_error(ACCEL_ERR_IO, "%s: cannot seek %s: %s", who, path, strerror(errno));
    for (size_t done = 0; !st && done < n;) {
        ssize_t w = write(fd, (const char *)buf + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = w < 0 ? errno : ENOSPC;
            if (ftruncate(fd, end))
                st = accel_set_error(ACCEL_ERR_IO, "%s: cannot write %s%s: %s, and cannot cut the half-written "
                                     "record off again: %s", who, to, path, strerror(e), strerror(errno));
            else st = accel_set_error(ACCEL_ERR_IO, "%s: cannot write %s%s: %s", who, to, path, strerror(e));
        } else done += (size_t)w;
    }
    if (shared) flock(fd, LOCK_UN);
    return st;
}
