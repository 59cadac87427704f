/* Hang diagnosis without debug mode, over shm and tcp.
 *
 * A skipped collective: rank 0 reduces a metric only it computes (the
 * Accelerate classic: a collective inside `if is_main_process`), then every
 * rank meets at a barrier. The others skipped the all_reduce and arrived at
 * the barrier: every rank must fail within 2 s (the timeout is 30 s), each with
 * a message naming what each rank called - kind, dtype, count - and the
 * file:line of each call.
 *
 * A rank that went on to no collective at all (rank 1 of 3 computes for
 * longer than the timeout): the ranks that wait time out with a report that
 * names rank 1 as not arrived, with the call site of its last collective,
 * and says where the waiting ranks wait. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "accel/dist.h"
#include "check.h"
#include "dist_group.h"

/* Each collective of the bodies in a function of its own, its line known to
 * every rank (the ranks are separate processes). */
static const int line_metric = __LINE__ + 2;
static accel_status reduce_metric(accel_pg *pg, float *metric) {
    return accel_pg_all_reduce(pg, metric, 1024, ACCEL_F32, ACCEL_REDUCE_SUM);
}
static const int line_barrier = __LINE__ + 1;
static accel_status meet(accel_pg *pg) { return accel_pg_barrier(pg); }
static const int line_first = __LINE__ + 2;
static accel_status reduce_first(accel_pg *pg, float *x) {
    return accel_pg_all_reduce(pg, x, 4, ACCEL_F32, ACCEL_REDUCE_SUM);
}
static const int line_wait = __LINE__ + 1;
static accel_status wait_all(accel_pg *pg) { return accel_pg_barrier(pg); }

static bool has_site(const char *msg, int line) {
    char site[64];
    snprintf(site, sizeof site, "test_dist_hang.c:%d", line);
    return strstr(msg, site) != NULL;
}

static int init_or_fail(int rank) {
    if (accel_dist_init() == ACCEL_OK) return 0;
    fprintf(stderr, "rank %d: init: %s\n", rank, accel_last_error());
    return 10;
}

static int finish(int rc) {
    accel_clear_error();
    accel_dist_finalize();
    accel_clear_error();
    accel_thread_cleanup();
    return rc;
}

static int skipped_body(int rank, int world) {
    (void)world;
    if (init_or_fail(rank)) return 10;
    accel_pg *pg = accel_dist_default_group();
    float metric[1024] = {0};
    double t0 = accel_now_seconds();
    accel_status st = ACCEL_OK;
    if (rank == 0) st = reduce_metric(pg, metric);
    if (st == ACCEL_OK) st = meet(pg);
    double dt = accel_now_seconds() - t0;
    const char *msg = accel_last_error();
    fprintf(stderr, "rank %d (%s) after %.2f s: %s\n", rank, accel_pg_backend(pg), dt,
            st == ACCEL_OK ? "completed" : msg);
    int rc = st != ACCEL_ERR_DIST                          ? 11
             : !strstr(msg, "mismatched collectives")       ? 12
             : dt >= 2.0                                    ? 13
             : !strstr(msg, "all_reduce(f32, 1024)")        ? 14
             : !strstr(msg, "barrier()")                    ? 15
             : !has_site(msg, line_metric)                ? 16
             : !has_site(msg, line_barrier)               ? 17
                                                            : 0;
    return finish(rc);
}

static int absent_body(int rank, int world) {
    (void)world;
    if (init_or_fail(rank)) return 10;
    accel_pg *pg = accel_dist_default_group();
    float x[4] = {1, 2, 3, 4};
    accel_status st = reduce_first(pg, x);
    if (st != ACCEL_OK) {
        fprintf(stderr, "rank %d: first all_reduce: %s\n", rank, accel_last_error());
        return finish(20);
    }
    if (rank == 1) { /* computes past the others' timeout, then leaves */
        nanosleep(&(struct timespec){5, 0}, NULL);
        return finish(0);
    }
    st = wait_all(pg);
    const char *msg = accel_last_error();
    fprintf(stderr, "rank %d (%s): %s\n", rank, accel_pg_backend(pg), st == ACCEL_OK ? "completed" : msg);
    char other[32];
    snprintf(other, sizeof other, "rank %d is in #2 barrier()", rank == 0 ? 2 : 0);
    int rc = st != ACCEL_ERR_TIMEOUT                ? 21
             : !strstr(msg, "rank 1 of 3 did not arrive") || !strstr(msg, "rank 1 has not arrived") ? 22
             : !has_site(msg, line_first)          ? 23 /* where rank 1 was last */
             : !has_site(msg, line_wait)           ? 24 /* where the others wait */
             : !strstr(msg, other)                   ? 25
                                                     : 0;
    return finish(rc);
}

static void check_group(const char *what, int world, bool one_machine, const char *timeout, dist_body_fn body) {
    dist_group g = {.world = world, .one_machine = one_machine, .timeout = timeout, .kill_after_s = 40};
    CHECK(dist_group_runs_ok(&g, body, "%s, %s", what, one_machine ? "shm" : "tcp"));
}

static void test_shm_skipped_collective(void) { check_group("skipped", 2, true, "30", skipped_body); }
static void test_tcp_skipped_collective(void) { check_group("skipped", 2, false, "30", skipped_body); }
/* 3 ranks: on tcp, a rank whose peers never send it the other collective's data learns from a notice */
static void test_shm_skipped_collective_3(void) { check_group("skipped, 3 ranks", 3, true, "30", skipped_body); }
static void test_tcp_skipped_collective_3(void) { check_group("skipped, 3 ranks", 3, false, "30", skipped_body); }
static void test_shm_absent_rank(void) { check_group("absent", 3, true, "2", absent_body); }
static void test_tcp_absent_rank(void) { check_group("absent", 3, false, "2", absent_body); }

int main(void) {
    RUN(test_shm_skipped_collective);
    RUN(test_tcp_skipped_collective);
    RUN(test_shm_skipped_collective_3);
    RUN(test_tcp_skipped_collective_3);
    RUN(test_shm_absent_rank);
    RUN(test_tcp_absent_rank);
    return check_summary();
}
