/* src/dist/self.c — the backend of a group of one process: every collective
 * is the identity (or a copy into the output). */
#include <string.h>

#include "dist/backend.h"

static accel_status self_init(accel_pg *pg, accel__store *store) { return ACCEL_OK; }
static void self_finalize(accel_pg *pg) {}
static accel_status self_barrier(accel_pg *pg) { return ACCEL_OK; }

/* SUM/MAX/MIN of one value is the value; AVG divides by 1. */
static accel_status self_all_reduce(accel_pg *pg, void *buf, size_t count, accel_dtype dt,
                                    accel_reduce_op op) {
    return ACCEL_OK;
}

static accel_status self_broadcast(accel_pg *pg, void *buf, size_t bytes, int root) { return ACCEL_OK; }

static accel_status self_all_gatherv(accel_pg *pg, const void *send, void *recv, const size_t *bytes,
                                     int root) {
    if (bytes[0] && recv != send) memmove(recv, send, bytes[0]);
    return ACCEL_OK;
}

const accel__backend accel__backend_self = {
    .name = "self",
    .init = self_init,
    .finalize = self_finalize,
    .barrier = self_barrier,
    .all_reduce = self_all_reduce,
    .broadcast = self_broadcast,
    .all_gatherv = self_all_gatherv,
};
