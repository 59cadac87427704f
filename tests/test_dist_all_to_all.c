/* accel_pg_all_to_all on 2, 3 and 4 forked ranks, over shm (its own
 * exchange) and over tcp (the generic fallback: rooted all_gatherv rounds),
 * against the serially computed answer; on a split subgroup; with the
 * argument refusals; and the failures every collective has: another call on
 * one rank is a mismatch on every rank, a rank that dies is named, neither
 * hangs. */
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "accel/dist.h"
#include "check.h"
#include "dist_group.h"

/* Element i of the block rank `from` sends to rank `to`: distinct for every (from, to, i). */
static int64_t val(int from, int to, size_t i) { return (int64_t)from * 1000003 + (int64_t)to * 7919 + (int64_t)i; }

static void fill(void *p, accel_dtype dt, int from, int world, size_t count) {
    for (int to = 0; to < world; to++)
        for (size_t i = 0; i < count; i++) {
            int64_t v = val(from, to, i);
            size_t j = (size_t)to * count + i;
            if (dt == ACCEL_I64) ((int64_t *)p)[j] = v;
            else if (dt == ACCEL_F32) ((float *)p)[j] = (float)(v % 4096);
            else ((uint8_t *)p)[j] = (uint8_t)(v * 31 >> 3);
        }
}

/* Whether recv holds, as its block k, rank k's block for `me`. */
static size_t wrong(const void *recv, accel_dtype dt, int me, int world, size_t count) {
    size_t bad = 0;
    for (int from = 0; from < world; from++)
        for (size_t i = 0; i < count; i++) {
            int64_t v = val(from, me, i);
            size_t j = (size_t)from * count + i;
            if (dt == ACCEL_I64) bad += ((const int64_t *)recv)[j] != v;
            else if (dt == ACCEL_F32) bad += ((const float *)recv)[j] != (float)(v % 4096);
            else bad += ((const uint8_t *)recv)[j] != (uint8_t)(v * 31 >> 3);
        }
    return bad;
}

/* One all_to_all of count elements of dt on pg, checked; 0 when right. */
static int exchange(accel_pg *pg, accel_dtype dt, size_t count) {
    int me = accel_pg_rank(pg), world = accel_pg_size(pg);
    size_t n = (size_t)world * count * accel_dtype_size(dt);
    void *send = malloc(n + 1), *recv = malloc(n + 1);
    fill(send, dt, me, world, count);
    memset(recv, 0xee, n + 1);
    int rc = 0;
    if (accel_pg_all_to_all(pg, send, recv, count, dt) != ACCEL_OK) {
        fprintf(stderr, "rank %d: all_to_all(%s, %zu): %s\n", me, accel_dtype_name(dt), count, accel_last_error());
        rc = 1;
    } else if (wrong(recv, dt, me, world, count) || ((unsigned char *)recv)[n] != 0xee) {
        fprintf(stderr, "rank %d: all_to_all(%s, %zu) gave wrong data\n", me, accel_dtype_name(dt), count);
        rc = 1;
    }
    free(send);
    free(recv);
    return rc;
}

static const char *g_backend; /* the backend the group must have chosen */

static int collectives_body(int rank, int world) {
    (void)world;
    if (accel_dist_init() != ACCEL_OK) return 10;
    accel_pg *pg = accel_dist_default_group();
    if (strcmp(accel_pg_backend(pg), g_backend) != 0) return 11;
    /* 0, a few, and past the shm staging chunk (256 KiB) so several chunks run */
    static const size_t counts[] = {0, 1, 37, 100003};
    static const accel_dtype dts[] = {ACCEL_I64, ACCEL_F32, ACCEL_U8};
    for (size_t c = 0; c < sizeof counts / sizeof *counts; c++)
        for (size_t d = 0; d < sizeof dts / sizeof *dts; d++)
            if (exchange(pg, dts[d], counts[c])) return 12;
    /* refusals: no call is issued, so the ranks stay in step */
    float b[8] = {0};
    if (accel_pg_all_to_all(pg, b, b, 1, ACCEL_F32) != ACCEL_ERR_INVALID_ARG ||
        !strstr(accel_last_error(), "overlap")) return 13;
    if (accel_pg_all_to_all(pg, NULL, b, 1, ACCEL_F32) != ACCEL_ERR_INVALID_ARG) return 14;
    if (accel_pg_all_to_all(NULL, b, b + 4, 1, ACCEL_F32) != ACCEL_ERR_INVALID_ARG) return 15;
    accel_clear_error();
    /* a subgroup: even and odd ranks */
    accel_pg *sub = accel_pg_split(pg, rank % 2, rank);
    if (!sub) return 16;
    if (exchange(sub, ACCEL_I64, 1001)) return 17;
    accel_pg_free(sub);
    accel_dist_finalize();
    accel_thread_cleanup();
    return 0;
}

static void run_collectives(int world, bool shm) {
    g_backend = shm ? "shm" : "tcp";
    dist_group g = {.world = world, .one_machine = shm, .timeout = "30"};
    CHECK(dist_group_runs_ok(&g, collectives_body, "%s, %d ranks", g_backend, world));
}

static void test_shm_2_3_4(void) {
    for (int w = 2; w <= 4; w++) run_collectives(w, true);
}
static void test_tcp_fallback_2_3_4(void) {
    for (int w = 2; w <= 4; w++) run_collectives(w, false);
}

/* Rank 1 asks for other counts: every rank fails (no hang, no wrong answer). */
static int mismatch_body(int rank, int world) {
    (void)world;
    if (accel_dist_init() != ACCEL_OK) return 10;
    accel_pg *pg = accel_dist_default_group();
    float s[3 * 16] = {0}, r[3 * 16]; /* world 3 */
    size_t count = rank == 1 ? 16 : 8;
    accel_status st = accel_pg_all_to_all(pg, s, r, count, ACCEL_F32);
    fprintf(stderr, "rank %d: %s\n", rank, accel_last_error());
    if (st == ACCEL_OK) return 11;
    if (!strstr(accel_last_error(), "mismatch")) return 12;
    accel_clear_error();
    accel_dist_finalize();
    accel_clear_error();
    accel_thread_cleanup();
    return 0;
}

/* Rank 1 dies instead of calling: the others fail naming it, well before the timeout. */
static int dies_body(int rank, int world) {
    if (accel_dist_init() != ACCEL_OK) return 10;
    accel_pg *pg = accel_dist_default_group();
    if (accel_pg_barrier(pg) != ACCEL_OK) return 11;
    if (rank == 1) raise(SIGKILL);
    size_t count = 1000;
    float *s = calloc((size_t)world * count, sizeof *s), *r = calloc((size_t)world * count, sizeof *r);
    double t0 = accel_now_seconds();
    accel_status st = accel_pg_all_to_all(pg, s, r, count, ACCEL_F32);
    double dt = accel_now_seconds() - t0;
    fprintf(stderr, "rank %d after %.2f s: %s\n", rank, dt, accel_last_error());
    free(s);
    free(r);
    if (st != ACCEL_ERR_DIST) return 12;
    if (!strstr(accel_last_error(), "rank 1")) return 13;
    if (dt > 20) return 14; /* the timeout is 60 s: the death is noticed, not waited out */
    accel_clear_error();
    accel_dist_finalize();
    accel_clear_error();
    accel_thread_cleanup();
    return 0;
}

static void run_failure(dist_body_fn body, bool shm, int dead) {
    dist_group g = {.world = 3, .one_machine = shm, .timeout = "60", .kill_after_s = 90};
    int st[DIST_GROUP_MAX];
    dist_group_run(&g, body, st);
    for (int r = 0; r < 3; r++)
        if (r != dead)
            CHECK_MSG(dist_exited_ok(st[r]), "%s: rank %d status %#x", shm ? "shm" : "tcp", r, st[r]);
}

static void test_mismatch_fails_every_rank(void) {
    run_failure(mismatch_body, true, -1);
    run_failure(mismatch_body, false, -1);
}
static void test_dead_peer_named(void) {
    run_failure(dies_body, true, 1);
    run_failure(dies_body, false, 1);
}

int main(void) {
    RUN(test_shm_2_3_4);
    RUN(test_tcp_fallback_2_3_4);
    RUN(test_mismatch_fails_every_rank);
    RUN(test_dead_peer_named);
    return check_summary();
}
