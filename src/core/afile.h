/* src/core/afile.h — the one atomic file writer: every file accel replaces
 * whole (weights, configs, checkpoints' files, accelerator.save, the
 * trackers' JSON files and the CSV log widened, `accel config`'s file) goes
 * through it. It lives in core so that every layer may use it (tracking sits
 * below io).
 * Internal: prefix accel__, not installed. */
#ifndef ACCEL_CORE_AFILE_H
#define ACCEL_CORE_AFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "accel/core.h"

/* Fault injection for the crash-safety tests: tests/checkpoint_kill_points.c
 * compiles the files that save (src/accelerator/checkpoint.c, save.c and
 * this writer, core/afile.c) with ACCEL__CKPT_KILL_POINTS and defines
 * accel__ckpt_fault. At each point of a save after which the disk
 * changes it may SIGKILL the process (KILL_POINT, FAIL_POINT) or, at a
 * FAIL_POINT, return true to make that step fail as a full disk would; one
 * point of a load (between its files) lets a test swap the directory under
 * it, as a concurrent save would. In the library the points compile to
 * nothing. */
#ifdef ACCEL__CKPT_KILL_POINTS
bool accel__ckpt_fault(const char *step);
#define KILL_POINT(step) ((void)accel__ckpt_fault(step))
#define FAIL_POINT(step) accel__ckpt_fault(step)
#else
#define KILL_POINT(step) ((void)0)
#define FAIL_POINT(step) false
#endif

/* The suffix of the atomic writer's scratch file (below): "<path>.tmp". */
#define ACCEL__AFILE_TMP_SUFFIX ".tmp"

/* Atomic file writer: bytes go to "<path>.tmp"; commit fsyncs and renames it
 * over path; abort removes it. Errors name the path. One writer of a path at
 * a time, across processes: open waits for another's commit or abort (an
 * flock on the tmp, held through the rename) while that writer makes
 * progress; ACCEL_ERR_TIMEOUT naming its pid once it made none for
 * ACCEL_WRITE_STALL_TIMEOUT seconds (default 60). The tmp is created with
 * O_EXCL and the sticky bit (cleared before the rename): a tmp left by a
 * killed writer carries it and is reused; one without it is not accel's (the
 * user's own "<path>.tmp") and, like a tmp that is not a regular file of one
 * link (a symbolic link, a hard link, a FIFO, a directory), is an error
 * naming it, never truncated, written through, renamed or removed. */
typedef struct accel__afile {
    int fd;
    int lock; /* the tmp opened again, holding the flock */
    char *path;
    char *tmp;
} accel__afile;

accel_status accel__afile_open(accel__afile *f, const char *path);
/* The permission bits path gets (07777 of mode; the file is created 0644
 * less the umask): a file replaced keeps its old ones this way. The scratch
 * mark stays on until the commit. */
accel_status accel__afile_set_mode(accel__afile *f, mode_t mode);
accel_status accel__afile_write(accel__afile *f, const void *p, size_t n);
accel_status accel__afile_commit(accel__afile *f);
void accel__afile_abort(accel__afile *f);
/* n bytes of data written to path atomically (open, write, commit). */
accel_status accel__afile_write_all(const char *path, const void *data, size_t n);

/* An exclusive flock on fd (a file or a directory another accel process
 * locks too: a staged save's parent), waited for as the writers above wait
 * for each other: as long as the holder makes progress (fd's file changes,
 * or the holder runs or waits on the disk), however long; 0 once held. 1 with
 * errno ETIMEDOUT when the holder made none for stall_s seconds, *holder_pid
 * (0: unknown) and *holder_stopped then saying who; -1 with errno when flock
 * fails otherwise. */
int accel__flock_wait(int fd, double stall_s, long *holder_pid, bool *holder_stopped);

#endif
