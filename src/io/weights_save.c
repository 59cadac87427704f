/* src/io/weights_save.c — where a save of weights writes (io_internal.h
 * accel__weights_save): a staged sibling swapped in whole
 * (core/staged_dir.h), or, on a mount point that no rename replaces, the
 * directory itself, one whole file at a time. */
#include <stdio.h>

#include "core/staged_dir.h"
#include "io/io_internal.h"

accel_status accel__weights_begin(accel__weights_save *ws, const char *dir, bool stage, bool in_place_on_mount,
                                  const char *op) {
    accel__staged_resolve(dir, ws->dir, sizeof ws->dir); /* a link to the directory: the link kept */
    ws->sg = (accel__staging){.carry = accel__not_weights, .lock = -1}; /* all but the weights of either format */
    ws->in_place = in_place_on_mount && accel__is_mount_point(ws->dir);
    if (ws->in_place) snprintf(ws->to, sizeof ws->to, "%s", ws->dir);
    else accel__staged_path(ws->dir, ws->to, sizeof ws->to);
    if (!stage) return ACCEL_OK;
    return ws->in_place ? accel__staged_begin_in_place(ws->dir, &ws->sg, op)
                        : accel__staged_begin(ws->dir, ws->to, &ws->sg, op);
}

accel_status accel__weights_commit(accel__weights_save *ws, const char *op) {
    if (!ws->in_place) return accel__staged_commit(ws->to, ws->dir, &ws->sg, op);
    accel__fsync_dir(ws->dir); /* the files renamed into it */
    accel__staged_release(&ws->sg);
    return ACCEL_OK;
}

/* In place, ws->to is the user's directory: only the lock is released. */
void accel__weights_abort(accel__weights_save *ws) {
    if (ws->in_place) accel__staged_release(&ws->sg);
    else accel__staged_abort(ws->to, &ws->sg);
}

accel_status accel__save_staged(const char *dir, const char *op, accel__dir_writer write, void *ctx) {
    accel__weights_save ws;
    accel_status st = accel__weights_begin(&ws, dir, true, true, op);
    if (!st) st = write(ctx, ws.to);
    if (!st) st = accel__weights_commit(&ws, op);
    if (st) accel__weights_abort(&ws);
    return st;
}
