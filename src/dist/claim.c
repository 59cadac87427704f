/* src/dist/claim.c — each rank's number and the world size are checked at
 * rendezvous, so that two launchers given the same machine_rank, or
 * launchers that disagree on the number of processes, are refused with a
 * message naming the machines instead of hanging or mixing two jobs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dist/claim.h"

/* "host (machine_rank 1, pid 1234)": GROUP_RANK is what `accel launch` and
 * torchrun call machine_rank. */
static void whoami(char *out, size_t n) {
    char host[256] = "?";
    gethostname(host, sizeof host - 1);
    const char *machine = getenv("GROUP_RANK");
    snprintf(out, n, "%s (machine_rank %s, pid %d)", host, machine && *machine ? machine : "?", (int)getpid());
}

static accel_status refuse_duplicate(accel__store *st, int rank, int64_t nth, const char *me) {
    char key[64];
    void *first = NULL;
    snprintf(key, sizeof key, "claim/%d/1", rank);
    if (accel__store_get(st, key, &first, NULL) != ACCEL_OK) return accel_last_status();
    /* Two jobs given one port (two plain srun jobs on a node once took 29500) look the same from here. */
    const char *port = getenv("MASTER_PORT");
    accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_dist_init: rank %d is claimed by %lld processes: first by %s, "
                    "now by %s (two launchers given the same machine_rank, or two jobs given the same "
                    "MASTER_PORT%s%s? give each job its own port)", rank, (long long)nth, (char *)first, me,
                    port ? "=" : "", port ? port : "");
    accel_free(first);
    return ACCEL_ERR_INVALID_ARG;
}

accel_status accel__claim_rank(accel__store *st, int rank, int world) {
    char me[320], key[64], val[340];
    whoami(me, sizeof me);
    int64_t nth = 0;
    snprintf(key, sizeof key, "claims/%d", rank);
    if (accel__store_add(st, key, 1, &nth) != ACCEL_OK) return accel_last_status();
    snprintf(key, sizeof key, "claim/%d/%lld", rank, (long long)nth);
    if (accel__store_set(st, key, me, strlen(me) + 1) != ACCEL_OK) return accel_last_status();
    if (nth > 1) return refuse_duplicate(st, rank, nth, me);
    if (rank == 0) {
        snprintf(val, sizeof val, "%d %s", world, me);
        return accel__store_set(st, "world", val, strlen(val) + 1);
    }
    void *v = NULL;
    if (accel__store_get(st, "world", &v, NULL) != ACCEL_OK) return accel_last_status();
    char *space;
    long main_world = strtol(v, &space, 10);
    accel_status rc = ACCEL_OK;
    if (main_world != world)
        rc = accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_dist_init: WORLD_SIZE is %d on %s but %ld on the main "
                             "machine %s (rank 0): the launchers disagree on num_processes or num_machines", world,
                             me, main_world, *space ? space + 1 : "?");
    accel_free(v);
    return rc;
}
