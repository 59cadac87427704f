/* Divergent collectives are detected without debug mode, over shm and tcp:
 * each backend compares a tag of the collective (kind + rank-independent
 * arguments) with its peers' before moving data. Before, a barrier on one
 * rank completed with the first step of another rank's all_reduce and both
 * went on with garbage; now every rank fails with ACCEL_ERR_DIST
 * "mismatched collectives", within seconds (the timeout is 20 s), and the
 * group stays broken.
 *   - rank 0 in all_reduce, rank 1 in barrier (e.g. after its all_reduce
 *     failed locally);
 *   - both in all_reduce with different counts. */
#include <string.h>

#include "accel/dist.h"
#include "check.h"
#include "dist_group.h"

static bool g_counts_differ;

static int mismatch_body(int rank, int world) {
    if (accel_dist_init() != ACCEL_OK) {
        fprintf(stderr, "rank %d: init: %s\n", rank, accel_last_error());
        return 10;
    }
    accel_pg *pg = accel_dist_default_group();
    float x[2048] = {0};
    double t0 = accel_now_seconds();
    accel_status st = g_counts_differ || rank == 0
                          ? accel_pg_all_reduce(pg, x, g_counts_differ && rank == 1 ? 2048 : 1024, ACCEL_F32,
                                                ACCEL_REDUCE_SUM)
                          : accel_pg_barrier(pg);
    double dt = accel_now_seconds() - t0;
    fprintf(stderr, "rank %d (%s) after %.2f s: %s\n", rank, accel_pg_backend(pg), dt,
            st == ACCEL_OK ? "completed" : accel_last_error());
    int rc = st != ACCEL_ERR_DIST ? 11 : !strstr(accel_last_error(), "mismatched collectives") ? 12 : dt > 10 ? 13 : 0;
    accel_clear_error();
    if (rc == 0 && accel_pg_barrier(pg) == ACCEL_OK) rc = 14; /* broken from now on */
    accel_clear_error();
    accel_dist_finalize();
    accel_clear_error();
    accel_thread_cleanup();
    return rc;
}

static void check_mismatch(bool one_machine, bool counts_differ) {
    g_counts_differ = counts_differ;
    dist_group g = {.world = 2, .one_machine = one_machine, .timeout = "20", .kill_after_s = 40};
    CHECK(dist_group_runs_ok(&g, mismatch_body, "%s, %s", one_machine ? "shm" : "tcp",
                             counts_differ ? "counts differ" : "barrier vs all_reduce"));
}

static void test_shm_barrier_vs_all_reduce(void) { check_mismatch(true, false); }
static void test_shm_counts_differ(void) { check_mismatch(true, true); }
static void test_tcp_barrier_vs_all_reduce(void) { check_mismatch(false, false); }
static void test_tcp_counts_differ(void) { check_mismatch(false, true); }

int main(void) {
    RUN(test_shm_barrier_vs_all_reduce);
    RUN(test_shm_counts_differ);
    RUN(test_tcp_barrier_vs_all_reduce);
    RUN(test_tcp_counts_differ);
    return check_summary();
}
