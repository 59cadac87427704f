/* src/core/afile.h — the one atomic file writer: every file accel replaces
 * whole (weights, configs, checkpoints' files, accelerator.save, the
 * trackers' JSON files, hparams.yml and the CSV log widened, `accel config`'s file) goes
 * through it. It lives in core so that every layer may use it (tracking sits
 * below io).
 * Internal: prefix accel__, not installed. */
#ifndef ACCEL_CORE_AFILE_H
#define ACCEL_CORE_AFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/stat.h>
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

/* The suffix of the atomic writer's scratch file (below): "<target>.tmp". */
#define ACCEL__AFILE_TMP_SUFFIX ".tmp"

/* Atomic file writer: bytes go to a scratch file beside path's target,
 * "<target>.tmp"; commit fsyncs and renames it over the target; abort
 * removes it. Errors name the path.
 * The target is path, or where its symbolic links lead (a dangling link's
 * target included, which the write creates, as Python's open() would): a
 * link (linked.safetensors -> /big/disk/...) stays a link and its target is
 * replaced, on its own disk. A link loop (or more than 40 links), a target
 * whose directory does not exist or is not writable (the scratch file is
 * made there), a target that is a directory, a FIFO or a device: an error
 * naming it, nothing written. A file replaced keeps its permission bits
 * (those it has when this writer's turn comes, after any writer it waited
 * for; set on the scratch file at open: a 0600 file's bytes are never
 * readable by others, even mid-write) and its owner and group where this
 * process may give them (root; a group of ours), as writing it in place would; a new
 * file is created 0644 less the umask. Hard links are not kept: the target
 * is a new file, its other names keep the old bytes (atomic replacement
 * cannot write through them).
 * A target's name (the part after the last '/') so long that "<name>.tmp"
 * exceeds NAME_MAX gets a shorter scratch name, "<its first bytes>~<16 hex
 * digits of a hash of the whole name>.tmp", NAME_MAX bytes: every name the
 * file system takes can be written.
 * One writer of a target at a time, across processes: open waits for
 * another's commit or abort (an flock on the tmp, held through the rename)
 * while that writer makes progress; ACCEL_ERR_TIMEOUT naming its pid once it
 * made none for ACCEL_WRITE_STALL_TIMEOUT seconds (default 60). The tmp is
 * created with O_EXCL and the sticky bit (cleared before the rename): a tmp
 * left by a killed writer carries it and is reused; one without it is not
 * accel's (the user's own "<target>.tmp", or of the short form above) and,
 * like a tmp that is not a regular file of one link (a symbolic link, a hard
 * link, a FIFO, a directory), is an error naming it, never truncated, written
 * through, renamed or removed. The writer's errors name the target (where the
 * links the caller's path passes through lead), not the path given. */
typedef struct accel__afile {
    int fd; /* the tmp, open for reading too (the csv tracker keeps a dup of it, and reads it back) */
    int lock; /* the tmp opened again, holding the flock */
    char *path; /* the target: the file renamed over */
    char *tmp;
    bool replaces; /* the target existed: its mode, owner and group below */
    mode_t mode;
    uid_t uid;
    gid_t gid;
} accel__afile;

accel_status accel__afile_open(accel__afile *f, const char *path);
accel_status accel__afile_write(accel__afile *f, const void *p, size_t n);
accel_status accel__afile_commit(accel__afile *f);
void accel__afile_abort(accel__afile *f);
/* n bytes of data written to path atomically (open, write, commit). */
accel_status accel__afile_write_all(const char *path, const void *data, size_t n);
/* The file a write of path replaces (above) into out[n]: path, or where its
 * links lead. An error naming path on a loop of links or a name too long. */
accel_status accel__afile_target(const char *path, char *out, size_t n);
/* The scratch file of target (a name accel__afile_target gave) into out[n]. */
accel_status accel__afile_scratch(const char *target, char *out, size_t n);
/* "a directory", "a FIFO", ...: what a path that is not a regular file is, for messages. */
const char *accel__file_kind(mode_t mode);

/* Whether sb (an lstat) is a scratch file of this user's atomic writer: one
 * being written, or a killed write's (the mark below, on a regular file
 * of ours). Never a finished file: the mark goes just before the rename. */
bool accel__afile_is_scratch(const struct stat *sb);

/* ACCEL_WRITE_STALL_TIMEOUT, the seconds every wait below allows a lock's
 * holder that makes no progress (default 60, in (0, 1e6]): the atomic
 * writer's, the staged saves', the trackers'. Its value refused by name. */
accel_status accel__write_stall_timeout(double *seconds);

/* An exclusive flock on fd (a file or a directory another accel process
 * locks too: a staged save's parent), waited for as the writers above wait
 * for each other: as long as the holder makes progress (fd's file changes,
 * or the holder runs or waits on the disk), however long; 0 once held. 1 with
 * errno ETIMEDOUT when the holder made none for stall_s seconds, *holder_pid
 * (0: unknown) and *holder_stopped then saying who; -1 with errno when flock
 * fails otherwise. */
int accel__flock_wait(int fd, double stall_s, long *holder_pid, bool *holder_stopped);

#endif
