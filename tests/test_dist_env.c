/* Bad values of the dist layer's environment tunables, one test each: init
 * fails with ACCEL_ERR_INVALID_ARG and an error naming the variable (rank 0
 * always; another rank may instead report that rank 0 left the rendezvous),
 * within seconds - never a hang, a wrapped size or a silently used default.
 *   ACCEL_SHM_CHUNK_KB=2^54   wrapped to a 0-byte chunk: every collective hung
 *   ACCEL_SHM_HEAP_MB=2^43    overflowed the segment size
 *   ACCEL_SHM_HEAP_MB=abc     was ignored (default used)
 *   ACCEL_TCP_CHUNK_KB=abc    was ignored (default used)
 *   ACCEL_DIST_TIMEOUT=1e19   overflowed time_t / the poll timeout in ms
 *   ACCEL_DEBUG_MODE=maybe    was read as false (ACCELERATE_DEBUG_MODE too)
 *   MASTER_ADDR=, ACCEL_DIST_HOST_ADDR=  were read as unset
 * and a job on several machines without ACCEL_JOB_SECRET (it accepted anyone):
 * refused, naming ACCEL_JOB_SECRET, unless ACCEL_INSECURE_NO_SECRET=1, which
 * runs it with a warning on stderr. */
#include <fcntl.h>
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
                    .kill_after_s = 30, .secret = one_machine ? "" : NULL};
    CHECK(dist_group_runs_ok(&g, bad_env_body, "%s=%s", var, value));
}

static void test_shm_chunk_2p54(void) { check_bad_env("ACCEL_SHM_CHUNK_KB", "18014398509481984", true); }
static void test_shm_heap_2p43(void) { check_bad_env("ACCEL_SHM_HEAP_MB", "8796093022208", true); }
static void test_shm_heap_abc(void) { check_bad_env("ACCEL_SHM_HEAP_MB", "abc", true); }
static void test_tcp_chunk_abc(void) { check_bad_env("ACCEL_TCP_CHUNK_KB", "abc", false); }
static void test_timeout_1e19(void) { check_bad_env("ACCEL_DIST_TIMEOUT", "1e19", false); }
static void test_debug_mode_maybe(void) { check_bad_env("ACCEL_DEBUG_MODE", "maybe", true); }
static void test_accelerate_debug_mode_2(void) { check_bad_env("ACCELERATE_DEBUG_MODE", "2", true); }
/* Set but empty: read as unset (127.0.0.1, the route's address), which the
 * strict reading of every variable refuses. */
static void test_master_addr_empty(void) { check_bad_env("MASTER_ADDR", "", true); }
static void test_host_addr_empty(void) { check_bad_env("ACCEL_DIST_HOST_ADDR", "", false); }

static void test_no_secret_several_machines(void) {
    g_var = "ACCEL_JOB_SECRET is set but empty"; /* the secret "" below: named as such, with what to do */
    dist_group g = {.world = 2, .timeout = "20", .secret = "", .kill_after_s = 30};
    CHECK(dist_group_runs_ok(&g, bad_env_body, "no secret, 2 machines"));
}

/* Joins, and (local rank 0, i.e. every rank here) warns on stderr, once.
 * g_refused_after_meeting: ACCEL_DEBUG_MODE=maybe refuses the init after it
 * read where the job meets, which it reads again to tell the others why it
 * failed: still one warning, and the refusal names the variable. */
static bool g_refused_after_meeting;

static int insecure_body(int rank, int world) {
    if (g_refused_after_meeting) setenv("ACCEL_DEBUG_MODE", "maybe", 1);
    char path[64];
    snprintf(path, sizeof path, "/tmp/accel_insecure_%d.err", (int)getpid());
    fflush(stderr);
    int saved = dup(2), fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 2);
    close(fd);
    accel_status st = accel_dist_init();
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    char buf[4096] = "";
    FILE *f = fopen(path, "r");
    if (f) {
        buf[fread(buf, 1, sizeof buf - 1, f)] = 0;
        fclose(f);
    }
    remove(path);
    int warnings = 0;
    for (const char *p = buf; (p = strstr(p, "WARNING: ACCEL_INSECURE_NO_SECRET=1")); p++) warnings++;
    fprintf(stdout, "rank %d: %s | %d warnings | %s", rank, st == ACCEL_OK ? "joined" : accel_last_error(), warnings,
            buf);
    bool as_asked = g_refused_after_meeting
                        ? st == ACCEL_ERR_INVALID_ARG && strstr(accel_last_error(), "ACCEL_DEBUG_MODE")
                        : st == ACCEL_OK;
    if (st == ACCEL_OK) accel_dist_finalize();
    accel_clear_error();
    accel_thread_cleanup();
    return !as_asked ? 10 : warnings != 1 ? 11 : 0;
}

static void check_insecure(bool refused_after_meeting) {
    g_refused_after_meeting = refused_after_meeting;
    dist_group g = {.world = 2, .timeout = "20", .secret = "", .env_name = "ACCEL_INSECURE_NO_SECRET",
                    .env_value = "1", .kill_after_s = 30};
    CHECK(dist_group_runs_ok(&g, insecure_body, "ACCEL_INSECURE_NO_SECRET=1%s",
                             refused_after_meeting ? ", ACCEL_DEBUG_MODE=maybe" : ""));
}

static void test_insecure_opt_out(void) { check_insecure(false); }
static void test_insecure_warned_once_when_refused(void) { check_insecure(true); }

int main(void) {
    RUN(test_shm_chunk_2p54);
    RUN(test_shm_heap_2p43);
    RUN(test_shm_heap_abc);
    RUN(test_tcp_chunk_abc);
    RUN(test_timeout_1e19);
    RUN(test_debug_mode_maybe);
    RUN(test_accelerate_debug_mode_2);
    RUN(test_master_addr_empty);
    RUN(test_host_addr_empty);
    RUN(test_no_secret_several_machines);
    RUN(test_insecure_opt_out);
    RUN(test_insecure_warned_once_when_refused);
    return check_summary();
}
