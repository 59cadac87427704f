/* Shared between src/tracking and the layers that attach to or use it. */
#ifndef ACCEL_TRACKING_INTERNAL_H
#define ACCEL_TRACKING_INTERNAL_H

#include "accel/tracking.h"

struct accel_pg;

/* The Accelerator tells the logger and progress bars who this process is;
 * in_order logging uses pg's barrier. Detach only forgets a matching pg. */
void accel__log_attach(int rank, int world, struct accel_pg *pg);
void accel__log_detach(struct accel_pg *pg);

/* The library's own warnings: the "accel" logger at WARNING, every process
 * (a problem one rank hit must not be hidden by the main-process filter). */
void accel__warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void accel__warnv(const char *fmt, va_list ap);

/* Checks a config/values list (ACCEL_ERR_INVALID_ARG naming fn): n >= 0,
 * values given when n > 0, keys non-empty UTF-8, strings non-NULL UTF-8,
 * kinds known. */
accel_status accel__values_check(const char *fn, int n, const accel_value *v);

/* An accelerator takes t (accel_accelerator_add_tracker): false when one
 * already did, which then finishes and frees it (a second owner would again). */
bool accel__tracker_take(accel_tracker *t);
/* accel_tracker_finish for its owner (the accelerator that took it), which
 * the public call refuses once a tracker is added. */
accel_status accel__tracker_finish(accel_tracker *t);

/* mkdir -p; ACCEL_ERR_IO naming the path. */
accel_status accel__mkdirs(const char *path);
/* fd locked for this tracker: an exclusive flock of path (a file or a
 * directory other runs' trackers lock too), waited for as the atomic writer
 * waits for another (core/afile.h: accel__flock_wait) as long as its holder
 * makes progress; a blocking flock hung every other run's log, with no word,
 * behind a run stopped holding it (SIGSTOP, a debugger, a frozen container).
 * ACCEL_OK once held, or where the file system keeps no locks (unlocked, as
 * the atomic writer); past ACCEL_WRITE_STALL_TIMEOUT seconds without
 * progress ACCEL_ERR_TIMEOUT "<who>: <path> is locked by pid N (stopped)...".
 * Released by flock(fd, LOCK_UN) or by closing fd. */
accel_status accel__tracker_lock(int fd, const char *who, const char *path);
/* Appends buf[0..n) to fd (path's, named in errors after who and `to`, e.g.
 * "an event to ", or "") whole or not
 * at all: a write cut short (a full disk) is cut off again, so the file
 * stays a sequence of whole records (half a record stayed behind, and a
 * reader lost everything after it, or the next record was glued to it).
 * shared: other runs append to the file too (log.jsonl, which every run
 * logging to the directory opens for appending): the appenders take turns
 * (accel__tracker_lock on fd), so the cut never reaches another's record. A
 * file only this tracker writes takes no lock, so that a stopped run holds
 * up no other: the csv log (a new file each run, moved aside when another
 * starts, replaced only by its own run's widening) and tensorboard's events
 * file (created O_EXCL, named by time, host, pid and a counter). */
accel_status accel__append_whole(int fd, bool shared, const char *who, const char *to, const char *path,
                                 const void *buf, size_t n);

#endif
