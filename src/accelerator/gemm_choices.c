/* The GEMM choice table to the job's ranks and through checkpoints
 * (gemm_choices.h): the backend's bundle sent, saved and installed. */
#include "gemm_choices.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/gemm.h"
#include "io/io_internal.h"

accel_status accel__gemm_choices_save(const char *path) {
    json_t *j = accel__gemm_choices_bundle(false);
    accel_status st = j ? accel__json_save_file(path, j) : accel_set_error(ACCEL_ERR_OOM, "%s: out of memory", path);
    json_decref(j);
    return st;
}

accel_status accel__gemm_choices_load(const char *path) {
    if (!accel__is_file(path)) return ACCEL_OK; /* a checkpoint from before the choices were saved */
    json_t *j = accel__json_load_file(path);
    if (!j) return accel_last_status();
    /* any key: the run resumes on the choices it was saved with, wherever;
     * all of them and only them, in a job or not (what arrived from rank 0
     * at creation, or a cache, is not what the saved run multiplied on) */
    const char *why = accel__gemm_choices_install(j);
    json_decref(j);
    return why ? accel_set_error(ACCEL_ERR_FORMAT, "%s: not a GEMM choice table (%s)", path, why) : ACCEL_OK;
}

/* A received bundle (text[len], NUL-terminated) as this rank's table; NULL,
 * or why it cannot be. */
static const char *install_received(const char *text, size_t len) {
    json_error_t err;
    json_t *j = len && text[len - 1] == 0 ? json_loads(text, 0, &err) : NULL;
    /* e.g. rank 0's build has oneDNN and this one has not: no table this rank can multiply on */
    const char *why = j ? accel__gemm_choices_install(j) : "not JSON";
    json_decref(j);
    return why;
}

accel_status accel__gemm_choices_share(accel_pg *pg) {
    if (accel_pg_size(pg) < 2) return ACCEL_OK;
    bool root = accel_pg_rank(pg) == 0;
    /* rank 0 out of memory: sent empty (never NULL: the broadcast takes
     * that for its own OOM), refused by all */
    static char none[1] = "";
    char *text = NULL, *sent = none;
    size_t len = 0;
    if (root) {
        json_t *j = accel__gemm_choices_bundle(true); /* what it sends is all it multiplies on, like the others */
        text = j ? json_dumps(j, JSON_COMPACT) : NULL;
        json_decref(j);
        if (text) sent = text, len = strlen(text) + 1;
    }
    accel_status st = accel_pg_broadcast_bytes(pg, root ? (void **)&sent : (void **)&text, &len, 0);
    const char *why = st ? NULL : root ? (text ? NULL : "out of memory on rank 0") : install_received(text, len);
    if (root) free(text); /* json_dumps' */
    else accel_free(text); /* the broadcast's */
    char failed[256] = "";
    if (st) snprintf(failed, sizeof failed, "%s", accel_last_error()); /* the broadcast's, kept across the all_reduce */
    /* every rank learns whether one could not take the table, and every rank
     * asks (a failed broadcast included): all fail together, none waits on the others */
    int32_t bad = st != ACCEL_OK || why != NULL;
    accel_status ast = accel_pg_all_reduce(pg, &bad, 1, ACCEL_I32, ACCEL_REDUCE_MAX);
    if (st) return accel_set_error(st, "GEMM choices from rank 0: %s", failed);
    if (ast) return ast;
    if (why) return accel_set_error(ACCEL_ERR_FORMAT, "GEMM choices from rank 0: %s", why);
    if (bad) return accel_set_error(ACCEL_ERR_FORMAT, "GEMM choices from rank 0: another rank could not take them");
    return ACCEL_OK;
}
