/* Bad values of the dist layer's environment tunables, one test each: init
 * fails with ACCEL_ERR_INVALID_ARG and an error naming the variable (rank 0
 * always; another rank may instead report that rank 0 left the rendezvous),
 * within seconds - never a hang, a wrapped size or a silently used default.
 *   ACCEL_SHM_CHUNK_KB=2^54   wrapped to a 0-byte chunk: every collective hung
 *   ACCEL_SHM_HEAP_MB=2^43    overflowed the segment size
 *   ACCEL_SHM_HEAP_MB=abc     was ignored (default used)
 *   ACCEL_TCP_CHUNK_KB=abc    was ignored (default used)
 *   ACCEL_DIST_TIMEOUT=1e19   overflowed time_t / the poll timeout in ms */
#include <string.h>

#include "accel/dist.h"
#include "check.h"
#include "dist_group.h"

static const char *g_var;

static int bad_env_body(int rank, int world) {
    double t0 = accel_now_seconds();
    accel_status st = accel_dist_init();
    double dt = accel_now_seconds() - t0;
    fprintf(stderr, "rank %d (%s) after %.2f s: %s\n", rank, g_var, dt, st == ACCEL_OK ? "joined" : accel_last_error());
    if (st == ACCEL_OK) {
        accel_dist_finalize();
        return 10;
    }
    bool named = strstr(accel_last_error(), g_var) != NULL;
    accel_clear_error();
    accel_thread_cleanup();
    if (dt > 10) return 11;
    if (rank == 0 && (st != ACCEL_ERR_INVALID_ARG || !named)) return 12;
    return 0;
}

static void check_bad_env(const char *var, const char *value, bool one_machine) {
    g_var = var;
    dist_group g = {.world = 2, .one_machine = one_machine, .timeout = "20", .env_name = var, .env_value = value,
                    .kill_after_s = 30};
    int st[2];
    dist_group_run(&g, bad_env_body, st);
    for (int r = 0; r < 2; r++)
        CHECK_MSG(dist_exited_ok(st[r]), "%s=%s: rank %d: status %#x", var, value, r, st[r]);
}

static void test_shm_chunk_2p54(void) { check_bad_env("ACCEL_SHM_CHUNK_KB", "18014398509481984", true); }
static void test_shm_heap_2p43(void) { check_bad_env("ACCEL_SHM_HEAP_MB", "8796093022208", true); }
static void test_shm_heap_abc(void) { check_bad_env("ACCEL_SHM_HEAP_MB", "abc", true); }
static void test_tcp_chunk_abc(void) { check_bad_env("ACCEL_TCP_CHUNK_KB", "abc", false); }
static void test_timeout_1e19(void) { check_bad_env("ACCEL_DIST_TIMEOUT", "1e19", false); }

int main(void) {
    RUN(test_shm_chunk_2p54);
    RUN(test_shm_heap_2p43);
    RUN(test_shm_heap_abc);
    RUN(test_tcp_chunk_abc);
    RUN(test_timeout_1e19);
    return check_summary();
}
