/* src/dist/claim.c — each rank's number and the world size are checked at
 * rendezvous, so that two launchers given the same machine_rank, or
 * launchers that disagree on the number of processes, are refused with a
 * message naming the machines instead of hanging or mixing two jobs. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dist/auth.h"
#include "dist/claim.h"

/* "host (machine_rank 1, pid 1234)": GROUP_RANK is what `accel launch` and
 * torchrun call machine_rank. */
static void whoami(char *out, size_t n) {
    char host[256] = "?";
    gethostname(host, sizeof host - 1);
    const char *machine = getenv("GROUP_RANK");
    snprintf(out, n, "%s (machine_rank %s, pid %d)", host, machine && *machine ? machine : "?", (int)getpid());
}

/* This process's claims carry a random token ahead of whoami's words, drawn
 * once per process (again in a forked child): host and pid alone cannot tell
 * one process claiming twice (its accel_dist_init called again while rank 0
 * still serves the store of its earlier one) from two processes that share
 * them (containers, each with its own pid numbers, on one host name). */
#define TOKEN_HEX (2 * ACCEL__NONCE_LEN)

static accel_status claim_token(char out[TOKEN_HEX + 1]) {
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static pid_t drawn_by;
    static char token[TOKEN_HEX + 1];
    uint8_t raw[ACCEL__NONCE_LEN];
    pthread_mutex_lock(&lock);
    bool drawn = drawn_by == getpid() || accel__auth_nonce(raw);
    if (drawn && drawn_by != getpid()) {
        for (int i = 0; i < ACCEL__NONCE_LEN; i++) snprintf(token + 2 * i, 3, "%02x", raw[i]);
        drawn_by = getpid();
    }
    memcpy(out, token, sizeof token);
    pthread_mutex_unlock(&lock);
    return drawn ? ACCEL_OK
                 : accel_set_error(ACCEL_ERR_DIST, "accel_dist_init: no random token for this rank's claim "
                                   "(getrandom: %s)", strerror(errno));
}

static accel_status refuse_duplicate(accel__store *st, int rank, int64_t nth, const char *claim) {
    char key[64];
    void *got = NULL;
    size_t len = 0;
    snprintf(key, sizeof key, "claim/%d/1", rank);
    if (accel__store_get(st, key, &got, &len) != ACCEL_OK) return accel_last_status();
    const char *first = got, *me = claim + TOKEN_HEX + 1;
    bool tokened = len > TOKEN_HEX && first[TOKEN_HEX] == ' ';
    const char *first_who = tokened ? first + TOKEN_HEX + 1 : first;
    bool same_process = tokened && !memcmp(first, claim, TOKEN_HEX);
    if (same_process) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_dist_init: rank %d was claimed before in this store by this "
                        "same process, %s: an earlier accel_dist_init of this process joined the rendezvous that "
                        "rank 0 still serves (rank 0 still waits in it, has not yet closed it after it failed, or has "
                        "not finalized the group it made); call accel_dist_init again once rank 0 has started a new "
                        "rendezvous", rank, me);
    } else {
        /* Two jobs given one port (two plain srun jobs on a node once took 29500) look the same from here. */
        const char *port = getenv("MASTER_PORT");
        bool look_alike = !strcmp(first_who, me);
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_dist_init: rank %d is claimed by %lld processes: first by %s, "
                        "now by %s (two launchers given the same machine_rank, or two jobs given the same "
                        "MASTER_PORT%s%s? give each job its own port)", rank, (long long)nth, first_who,
                        look_alike ? "another process with the same host name and pid (another container, or a "
                                     "restart that reused the pid)" : me,
                        port ? "=" : "", port ? port : "");
    }
    accel_free(got);
    return ACCEL_ERR_INVALID_ARG;
}

accel_status accel__claim_rank(accel__store *st, int rank, int world) {
    char me[320], claim[TOKEN_HEX + 1 + sizeof me], key[64], val[340];
    whoami(me, sizeof me);
    if (claim_token(claim) != ACCEL_OK) return accel_last_status();
    snprintf(claim + TOKEN_HEX, sizeof claim - TOKEN_HEX, " %s", me);
    int64_t nth = 0;
    snprintf(key, sizeof key, "claims/%d", rank);
    if (accel__store_add(st, key, 1, &nth) != ACCEL_OK) return accel_last_status();
    snprintf(key, sizeof key, "claim/%d/%lld", rank, (long long)nth);
    if (accel__store_set(st, key, claim, strlen(claim) + 1) != ACCEL_OK) return accel_last_status();
    if (nth > 1) return refuse_duplicate(st, rank, nth, claim);
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
