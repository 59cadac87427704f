/* A rank that dies during the rendezvous is named at once (src/dist/store.c,
 * listed gone in "lost"), with no launcher watching the processes:
 *   - 3 forked ranks; rank 1 connects to the store, claims its number, waits
 *     until ranks 0 and 2 have published theirs (both are then waiting for
 *     it) and SIGKILLs itself: ranks 0 and 2 must fail accel_dist_init with
 *     "rank 1 of 3 closed its store connection during rendezvous". The
 *     timeout is 600 s: a regression shows as this test's ctest TIMEOUT;
 *   - 3 forked ranks that init, reduce and finalize at different times (the
 *     others close their store connections after the rendezvous): all pass;
 *   - in one process, on a store: a rank that closed after accel__store_done
 *     is not taken for dead (the wait times out naming it as missing), nor is
 *     a rank another connection still claims (a duplicate that left), nor one
 *     that connected again after closing.
 * Loopback only. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "accel/dist.h"
#include "check.h"
#include "dist/claim.h"
#include "dist/store.h"
#include "dist_group.h"

#define SECRET "s3cret" /* dist_group's */

/* Rank 1 does what accel_dist_init does up to its wait, then dies. */
static int rank1_dies(int world) {
    accel__store *s = accel__store_open("127.0.0.1", atoi(getenv("MASTER_PORT")), false, SECRET, 1, 600);
    if (!s || accel__claim_rank(s, 1, world) != ACCEL_OK) return 3;
    void *v = NULL;
    for (int k = 0; k < world; k += 2) { /* ranks 0 and 2 are waiting for rank 1 once these exist */
        char key[32];
        snprintf(key, sizeof key, "host/%d", k);
        if (accel__store_get(s, key, &v, NULL) != ACCEL_OK) return 4;
        free(v);
    }
    kill(getpid(), SIGKILL);
    return 5;
}

static int body_rank1_killed(int rank, int world) {
    if (rank == 1) return rank1_dies(world);
    accel_status st = accel_dist_init();
    const char *want = "rank 1 of 3 closed its store connection during rendezvous (exited or was killed)";
    if (st == ACCEL_ERR_DIST && strstr(accel_last_error(), want)) return 0;
    fprintf(stderr, "rank %d: accel_dist_init returned %d: %s\n", rank, (int)st, accel_last_error());
    if (st == ACCEL_OK) accel_dist_finalize();
    return 1;
}

static void test_killed_rank_is_named(void) {
    dist_group g = {.world = 3, .timeout = "600", .kill_after_s = 600};
    int status[3];
    dist_group_run(&g, body_rank1_killed, status);
    CHECK_MSG(WIFSIGNALED(status[1]) && WTERMSIG(status[1]) == SIGKILL, "rank 1: status %#x", status[1]);
    CHECK_MSG(dist_exited_ok(status[0]), "rank 0: status %#x", status[0]);
    CHECK_MSG(dist_exited_ok(status[2]), "rank 2: status %#x", status[2]);
}

/* Rank 1 leaves first, rank 2 next, rank 0 (the store's) last. */
static int body_normal(int rank, int world) {
    if (accel_dist_init() != ACCEL_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, accel_last_error());
        return 1;
    }
    float x = 1;
    accel_status st = accel_pg_all_reduce(accel_dist_default_group(), &x, 1, ACCEL_F32, ACCEL_REDUCE_SUM);
    if (st != ACCEL_OK || x != (float)world) fprintf(stderr, "rank %d: all_reduce: %s, %g\n", rank, accel_last_error(), x);
    if (st == ACCEL_OK && x != (float)world) st = ACCEL_ERR_DIST;
    if (rank != 1) /* the order of leaving, not a measured time */
        nanosleep(&(struct timespec){0, rank == 0 ? 200000000 : 100000000}, NULL);
    accel_dist_finalize();
    return st == ACCEL_OK ? 0 : 2;
}

static void test_normal_close_passes(void) {
    dist_group g = {.world = 3, .timeout = "600", .kill_after_s = 600};
    CHECK(dist_group_runs_ok(&g, body_normal, "normal close"));
}

/* A wait on "x" for 3 ranks that misses rank 1 only must time out (rank 1
 * merely late), not fail naming it as dead. */
static void check_not_dead(accel__store *s, const char *why) {
    CHECK(accel__store_set(s, "x/0", "", 0) == ACCEL_OK);
    CHECK(accel__store_set(s, "x/2", "", 0) == ACCEL_OK);
    CHECK_MSG(accel__store_wait_ranks(s, "x", 3, "wait") == ACCEL_ERR_TIMEOUT &&
                  strstr(accel_last_error(), "rank 1 of 3 did not arrive"),
              "%s: %s", why, accel_last_error());
}

static void test_store_close_kinds(void) {
    /* done, then closed */
    accel__store *server = accel__store_open("127.0.0.1", 0, true, SECRET, 0, 1);
    CHECK(server != NULL);
    int port = accel__store_port(server);
    accel__store *one = accel__store_open("127.0.0.1", port, false, SECRET, 1, 1);
    CHECK(one && accel__store_done(one) == ACCEL_OK);
    accel__store_close(one);
    check_not_dead(server, "closed after done");
    accel__store_close(server);

    /* a duplicate claiming rank 1 left, the first is still connected (and
     * rank 3 died first: listed before rank 1 below) */
    server = accel__store_open("127.0.0.1", 0, true, SECRET, 0, 1);
    port = accel__store_port(server);
    accel__store_close(accel__store_open("127.0.0.1", port, false, SECRET, 3, 1));
    one = accel__store_open("127.0.0.1", port, false, SECRET, 1, 1);
    accel__store *dup = accel__store_open("127.0.0.1", port, false, SECRET, 1, 1);
    CHECK(one && dup);
    accel__store_close(dup);
    check_not_dead(server, "a duplicate left");
    /* the last connection of rank 1 closes before done: dead, named at once
     * (by a waiter that would otherwise wait 600 s) */
    accel__store_close(one);
    accel__store *two = accel__store_open("127.0.0.1", port, false, SECRET, 2, 600);
    CHECK(two != NULL);
    CHECK_MSG(accel__store_wait_ranks(two, "x", 3, "wait") == ACCEL_ERR_DIST &&
                  strstr(accel_last_error(), "wait failed: rank 1 of 3 closed its store connection during rendezvous"),
              "%s", accel_last_error());
    accel__store_close(two);
    /* and connected again: no longer dead; rank 3 still is */
    one = accel__store_open("127.0.0.1", port, false, SECRET, 1, 1);
    CHECK(one != NULL);
    check_not_dead(server, "connected again");
    two = accel__store_open("127.0.0.1", port, false, SECRET, 2, 600);
    CHECK(two && accel__store_set(two, "x/1", "", 0) == ACCEL_OK);
    CHECK_MSG(accel__store_wait_ranks(two, "x", 4, "wait") == ACCEL_ERR_DIST &&
                  strstr(accel_last_error(), "wait failed: rank 3 of 4 closed its store connection"),
              "%s", accel_last_error());
    accel__store_close(two);
    accel__store_close(one);
    accel__store_close(server);
}

int main(void) {
    RUN(test_store_close_kinds);
    RUN(test_killed_rank_is_named);
    RUN(test_normal_close_passes);
    return check_summary();
}
