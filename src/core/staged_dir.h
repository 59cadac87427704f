/* src/core/staged_dir.h — a directory written aside, then swapped in with one
 * rename, so that dir holds the previous save or the new one, never a mix:
 * save_state, save_model (rank 0 runs these) and io's weight writers
 * (accel_save_sharded and the save_pretrained built on it). It lives in core
 * so that io and the accelerator share it (io sits below the accelerator).
 * Its steps after which the disk changes are fault-injection points
 * (core/afile.h; tests/checkpoint_kill_points.c compiles this file).
 * Internal: prefix accel__, not installed. */
#ifndef ACCEL_CORE_STAGED_DIR_H
#define ACCEL_CORE_STAGED_DIR_H

#include <stdbool.h>
#include <time.h>

#include "accel/core.h"

/* path and everything under it removed (links not followed, never into a
 * mount); nothing when it does not exist. */
void accel__rm_rf(const char *path);
/* fsync of the directory path, so that the entries made in it are on disk. */
void accel__fsync_dir(const char *path);

/* dir, or where it points when it is a symbolic link or ends in "." or ".."
 * (realpath), into out (n bytes): the swap then replaces the directory (by
 * its own name) and keeps the link. Every rank calls it, so that all stage
 * into the same tmp. */
void accel__staged_resolve(const char *dir, char *out, size_t n);
/* "<parent of dir>/.<name of dir>.accel-staging" into tmp (n bytes): a name
 * only a save makes (a leftover is removed unseen). */
void accel__staged_path(const char *dir, char *tmp, size_t n);
/* One staged save (in a job, rank 0's), from begin to commit or abort. The caller sets
 * carry and ctx (what of an existing dir the save keeps: carry(name, ctx) true
 * for each such top-level entry; NULL: nothing) and zeroes the rest. */
typedef struct accel__staging {
    bool (*carry)(const char *name, void *ctx);
    void *ctx;
    int lock;               /* the flock on dir's parent, held from begin to commit or abort; -1 */
    bool held;              /* tmp is this save's (abort removes it) */
    struct timespec began;  /* the filesystem's clock when tmp was made: the save's files are no older */
} accel__staging;

/* Refuses (before writing anything) an empty dir, one named "." or ".."
 * (unresolved: it does not exist), a name too long for tmp's (NAME_MAX), a
 * dir that exists and is no directory (a file, a link leading nowhere), that
 * is or holds the working directory, or that is a mount point (statx's mount
 * root, or st_dev differing from its parent's: the swap cannot move it);
 * makes dir's parent and takes the lock on it (another process's save into
 * the same parent waited for while it makes progress:
 * ACCEL_WRITE_STALL_TIMEOUT, ACCEL_ERR_TIMEOUT naming its pid past it);
 * removes a tmp left by a crashed save, makes tmp (removed again when this
 * fails); with sg->carry, every entry of an existing dir that it accepts is
 * hard-linked (copied with its times where links are refused; directories as
 * trees; a mount point inside refused by name) into tmp, so what the save does
 * not rewrite survives the swap. */
accel_status accel__staged_begin(const char *dir, const char *tmp, accel__staging *sg, const char *op);
/* Whether dir is a directory that is the root of a mount (statx's mount
 * root, or st_dev differing from its parent's: a Docker volume, a bind
 * mount), which no rename can replace. */
bool accel__is_mount_point(const char *dir);
/* A save written into dir itself instead (io's weight writers on a mount
 * point, io_internal.h accel__weights_begin): a lock as accel__staged_begin
 * takes, on dir itself (a mount point's parent is another filesystem, and
 * each container sharing the volume sees its own), so that two such saves
 * take turns; nothing is staged or refused. accel__staged_release releases
 * it (never accel__staged_abort, which is given a directory to remove). */
accel_status accel__staged_begin_in_place(const char *dir, accel__staging *sg, const char *op);
/* The lock of a save in place released; nothing removed. */
void accel__staged_release(accel__staging *sg);
/* The commit point: every directory of tmp fsynced (the entries made in
 * them), then tmp takes dir's name (renameat2 EXCHANGE when dir exists, whose
 * previous content is then removed, but for what a writer made in dir while
 * the save ran: entries sg->carry accepts that dir does not hold, or holds
 * only as carried before the save began, are moved into dir); fsyncs the
 * parent, releases the lock. On failure the lock stays: abort. */
accel_status accel__staged_commit(const char *tmp, const char *dir, accel__staging *sg, const char *op);
/* A failed save's tmp removed (when begin made it and no commit published
 * it), the lock released; harmless after a commit. (An in-place save ends
 * with accel__staged_release.) */
void accel__staged_abort(const char *tmp, accel__staging *sg);

#endif
