/* Hang diagnosis by call site, without debug mode, over shm and tcp.
 *
 * A collective skipped on some ranks whose next collective has the same
 * kind and arguments used to complete with the wrong partner (rank 0's
 * extra all_reduce met the others' next one) and hang or fail much later.
 * The ranks compare call sites: every rank must fail within 2 s (the
 * timeout is 30 s) with a mismatch naming the file:line of each side, in
 * the three ways Accelerate users get there:
 *
 *   - a metric reduced inside `if is_main_process`, before the loss that
 *     every rank reduces (all_reduce(f32, 4) both);
 *   - a save on rank 0 only (save_model ends with an all_reduce(i32, 1, MAX)
 *     that every rank must join), before an early-stopping vote that is the
 *     same all_reduce;
 *   - loops of different lengths (rank 0 takes one more step), before a
 *     final all_reduce like the step's.
 *
 * And what differs on purpose still runs: main_process_first (its barrier
 * is in begin on some ranks, in end on the main one), teardown from
 * different lines, one broadcast from two lines after
 * accel_dist_allow_other_call_sites(), or with ACCEL_DIST_CHECK_CALL_SITES=0
 * (without either it is refused as a mismatch). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "accel/accelerator.h"
#include "accel/dist.h"
#include "accel/nn.h"
#include "check.h"
#include "dist_group.h"

/* Each collective of the bodies in a function of its own, its line known to
 * every rank (the ranks are separate processes). */
static const int line_metric = __LINE__ + 2;
static accel_status reduce_metric(accel_pg *pg, float *m) {
    return accel_pg_all_reduce(pg, m, 4, ACCEL_F32, ACCEL_REDUCE_SUM);
}
static const int line_loss = __LINE__ + 2;
static accel_status reduce_loss(accel_pg *pg, float *l) {
    return accel_pg_all_reduce(pg, l, 4, ACCEL_F32, ACCEL_REDUCE_SUM);
}
static const int line_save = __LINE__ + 2;
static accel_status save(accel_accelerator *acc, accel_module *m, const char *dir) {
    return accel_accelerator_save_model(acc, m, dir, NULL);
}
static const int line_vote = __LINE__ + 2;
static accel_status vote_stop(accel_pg *pg, int32_t *stop) {
    return accel_pg_all_reduce(pg, stop, 1, ACCEL_I32, ACCEL_REDUCE_MAX);
}
static const int line_step = __LINE__ + 2;
static accel_status step(accel_pg *pg, float *g) {
    return accel_pg_all_reduce(pg, g, 4, ACCEL_F32, ACCEL_REDUCE_AVG);
}
static const int line_final = __LINE__ + 2;
static accel_status final_metric(accel_pg *pg, float *m) {
    return accel_pg_all_reduce(pg, m, 4, ACCEL_F32, ACCEL_REDUCE_AVG);
}

static char g_dir[64];

static bool has_site(const char *msg, int line) {
    char site[64];
    snprintf(site, sizeof site, "test_dist_hang_sites.c:%d", line);
    return strstr(msg, site) != NULL;
}

static int finish(int rc) {
    accel_clear_error();
    accel_dist_finalize();
    accel_clear_error();
    accel_thread_cleanup();
    return rc;
}

/* The verdict on a rank that must fail as a call-site mismatch naming lines a and b, within 2 s. */
static int verdict(int rank, accel_status st, double dt, int a, int b) {
    const char *msg = accel_last_error();
    fprintf(stderr, "rank %d after %.2f s: %s\n", rank, dt, st == ACCEL_OK ? "completed" : msg);
    return st != ACCEL_ERR_DIST                            ? 11
           : !strstr(msg, "mismatched collectives")         ? 12
           : !strstr(msg, "different call sites")           ? 13
           : dt >= 2.0                                      ? 14
           : !has_site(msg, a) || !has_site(msg, b)         ? 15
                                                            : 0;
}

static int metric_body(int rank, int world) {
    (void)world;
    if (accel_dist_init() != ACCEL_OK) return 10;
    accel_pg *pg = accel_dist_default_group();
    float metric[4] = {1, 2, 3, 4}, loss[4] = {1, 1, 1, 1};
    double t0 = accel_now_seconds();
    accel_status st = rank == 0 ? reduce_metric(pg, metric) : ACCEL_OK;
    if (st == ACCEL_OK) st = reduce_loss(pg, loss);
    return finish(verdict(rank, st, accel_now_seconds() - t0, line_metric, line_loss));
}

static int save_body(int rank, int world) {
    (void)world;
    accel_accelerator_opts o = accel_accelerator_opts_default();
    accel_accelerator *acc = accel_accelerator_new(&o);
    if (!acc) return 10;
    accel_module *model = accel_linear_new(3, 1, true, ACCEL_CPU_DEVICE, ACCEL_F32);
    int32_t stop = 0;
    double t0 = accel_now_seconds();
    accel_status st = accel_accelerator_is_main_process(acc) ? save(acc, model, g_dir) : ACCEL_OK;
    if (st == ACCEL_OK) st = vote_stop(accel_dist_default_group(), &stop);
    int rc = verdict(rank, st, accel_now_seconds() - t0, line_save, line_vote);
    accel_clear_error();
    accel_module_free(model);
    accel_accelerator_free(acc);
    return finish(rc);
}

static int uneven_body(int rank, int world) {
    (void)world;
    if (accel_dist_init() != ACCEL_OK) return 10;
    accel_pg *pg = accel_dist_default_group();
    float g[4] = {1, 2, 3, 4};
    double t0 = accel_now_seconds();
    accel_status st = ACCEL_OK;
    for (int s = 0; s < (rank == 0 ? 3 : 2) && st == ACCEL_OK; s++) st = step(pg, g);
    if (st == ACCEL_OK) st = final_metric(pg, g);
    return finish(verdict(rank, st, accel_now_seconds() - t0, line_step, line_final));
}

/* One broadcast, from one line on the root and another elsewhere. */
static accel_status broadcast_from_two_lines(accel_pg *pg, int rank, float *x) {
    if (rank == 0) return accel_pg_broadcast(pg, x, 4, ACCEL_F32, 0);
    return accel_pg_broadcast(pg, x, 4, ACCEL_F32, 0);
}

/* What differs on purpose: main_process_first, an allowed broadcast from two
 * lines, and teardown from two lines. */
static int on_purpose_body(int rank, int world) {
    (void)world;
    accel_accelerator_opts o = accel_accelerator_opts_default();
    accel_accelerator *acc = accel_accelerator_new(&o);
    if (!acc) return 10;
    accel_pg *pg = accel_dist_default_group();
    float x[4] = {(float)rank, 0, 0, 0};
    int rc = 0;
    if (accel_accelerator_main_process_first_begin(acc) != ACCEL_OK ||
        accel_accelerator_main_process_first_end(acc) != ACCEL_OK)
        rc = 20;
    accel_dist_allow_other_call_sites();
    if (!rc && (broadcast_from_two_lines(pg, rank, x) != ACCEL_OK || x[0] != 0.0f)) rc = 21;
    if (!rc && accel_accelerator_wait_for_everyone(acc) != ACCEL_OK) rc = 22;
    if (rc) fprintf(stderr, "rank %d: rc %d: %s\n", rank, rc, accel_last_error());
    accel_clear_error();
    if (rank == 0) { /* the group's last reference goes here on rank 0 ... */
        accel_accelerator_free(acc);
    } else { /* ... and here elsewhere */
        accel_accelerator_free(acc);
    }
    if (!rc && accel_last_status() != ACCEL_OK) {
        fprintf(stderr, "rank %d: teardown: %s\n", rank, accel_last_error());
        rc = 23;
    }
    accel_clear_error();
    accel_thread_cleanup();
    return rc;
}

/* The broadcast from two lines without accel_dist_allow_other_call_sites():
 * refused, unless ACCEL_DIST_CHECK_CALL_SITES=0. Over tcp the root only
 * sends: it learns of the refusal from the others' notice in its next wait. */
static int two_lines_body(int rank, int world) {
    (void)world;
    if (accel_dist_init() != ACCEL_OK) return 10;
    accel_pg *pg = accel_dist_default_group();
    float x[4] = {(float)rank, 0, 0, 0};
    accel_status st = broadcast_from_two_lines(pg, rank, x);
    if (st == ACCEL_OK) st = accel_pg_barrier(pg);
    const char *off = getenv("ACCEL_DIST_CHECK_CALL_SITES");
    int rc = off && !strcmp(off, "0") ? (st == ACCEL_OK && x[0] == 0.0f ? 0 : 30)
                                      : (st == ACCEL_ERR_DIST && strstr(accel_last_error(), "different call sites") ? 0 : 31);
    if (rc) fprintf(stderr, "rank %d: rc %d: %s\n", rank, rc, st == ACCEL_OK ? "completed" : accel_last_error());
    return finish(rc);
}

static void check_group(const char *what, int world, bool one_machine, const char *env_name, const char *env_value,
                        dist_body_fn body) {
    dist_group g = {.world = world, .one_machine = one_machine, .timeout = "30", .kill_after_s = 45,
                    .env_name = env_name, .env_value = env_value};
    CHECK(dist_group_runs_ok(&g, body, "%s, %d ranks, %s", what, world, one_machine ? "shm" : "tcp"));
}

static void test_metric_inside_main_process(void) {
    for (int world = 2; world <= 3; world++) {
        check_group("metric inside is_main_process", world, true, NULL, NULL, metric_body);
        check_group("metric inside is_main_process", world, false, NULL, NULL, metric_body);
    }
}

static void test_save_on_rank_0_only(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/accel_hang_sites_XXXXXX");
    CHECK(mkdtemp(g_dir) != NULL);
    check_group("save on rank 0 only", 2, true, NULL, NULL, save_body);
    check_group("save on rank 0 only", 2, false, NULL, NULL, save_body);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    CHECK(system(cmd) == 0);
}

static void test_uneven_loops(void) {
    check_group("uneven loops", 3, true, NULL, NULL, uneven_body);
    check_group("uneven loops", 3, false, NULL, NULL, uneven_body);
}

static void test_differences_on_purpose(void) {
    check_group("on purpose", 2, true, NULL, NULL, on_purpose_body);
    check_group("on purpose", 2, false, NULL, NULL, on_purpose_body);
    check_group("two lines", 2, true, NULL, NULL, two_lines_body);
    check_group("two lines", 2, false, NULL, NULL, two_lines_body);
    check_group("two lines, check off", 2, true, "ACCEL_DIST_CHECK_CALL_SITES", "0", two_lines_body);
    check_group("two lines, check off", 2, false, "ACCEL_DIST_CHECK_CALL_SITES", "0", two_lines_body);
}

int main(void) {
    RUN(test_metric_inside_main_process);
    RUN(test_save_on_rank_0_only);
    RUN(test_uneven_loops);
    RUN(test_differences_on_purpose);
    return check_summary();
}
