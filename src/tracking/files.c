/* Directories and whole-record appends for the trackers (whole files are
 * replaced through core/afile.h's writer). */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

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

accel_status accel__append_whole(int fd, const char *who, const char *to, const char *path, const void *buf, size_t n) {
    /* one appender at a time (another run's tracker appending to the same file): the end found here stays the
     * end until this record is written or cut off again, so the cut never takes another's record with it */
    bool locked = flock(fd, LOCK_EX) == 0;
    accel_status st = ACCEL_OK;
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
    if (locked) flock(fd, LOCK_UN);
    return st;
}
