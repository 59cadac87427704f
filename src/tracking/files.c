/* Directories and whole-record appends for the trackers (whole files are
 * replaced through core/afile.h's writer). */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
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
    off_t end = lseek(fd, 0, SEEK_END);
    if (end < 0) return accel_set_error(ACCEL_ERR_IO, "%s: cannot seek %s: %s", who, path, strerror(errno));
    for (size_t done = 0; done < n;) {
        ssize_t w = write(fd, (const char *)buf + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = w < 0 ? errno : ENOSPC;
            if (ftruncate(fd, end))
                return accel_set_error(ACCEL_ERR_IO, "%s: cannot write %s%s: %s, and cannot cut the half-written "
                                       "record off again: %s", who, to, path, strerror(e), strerror(errno));
            return accel_set_error(ACCEL_ERR_IO, "%s: cannot write %s%s: %s", who, to, path, strerror(e));
        }
        done += (size_t)w;
    }
    return ACCEL_OK;
}
