/* Ranks that share a machine share its cores (src/dist/node_threads.c).
 * Started without `accel launch` (plain srun, mpirun, torchrun: nothing sets
 * OMP_NUM_THREADS), every rank ran an OpenMP pool as wide as the machine:
 * 8x slower steps with 2 ranks on 2 cores. Now accel_dist_init sizes the
 * kernels' threads to the rank's share (the online cores / the ranks on the
 * machine, at most the cores it may run on), and rank 0 says so once; a
 * count the user chose (OMP_NUM_THREADS, accel_set_num_threads) is kept.
 * Expectations come from this machine (sysconf, the affinity mask), never
 * from constants. Must run without OMP_NUM_THREADS: it re-executes itself
 * without it (ctest gives the other tests OMP_NUM_THREADS=2). */
#include <fcntl.h>
#include <sched.h>
#include <string.h>

#include "accel/dist.h"
#include "check.h"
#include "dist_group.h"

typedef enum mode { UNSET, OMP_ENV, API_CHOICE, OMP_EMPTY } mode;
static mode g_mode;
static int g_default; /* OpenMP's pool before init (the affinity mask's size when nothing is set) */

/* This machine's share for one of `local` ranks, derived here on its own. */
static int expected_share(int local) {
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    cpu_set_t set;
    CPU_ZERO(&set);
    long mine = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : online;
    long share = online / local;
    if (share > mine) share = mine;
    return share < 1 ? 1 : (int)share;
}

static int body(int rank, int world) {
    (void)world;
    if (g_mode == API_CHOICE) accel_set_num_threads(3);
    int before = accel_num_threads();
    char path[64];
    snprintf(path, sizeof path, "/tmp/accel_node_threads_%d.err", (int)getpid());
    fflush(stderr);
    int saved = dup(2), fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 2);
    accel_status st = accel_dist_init();
    accel_status st2 = st == ACCEL_OK ? accel_dist_init() : st; /* a second reference says nothing more */
    fflush(stderr);
    dup2(saved, 2);
    char said[2048] = "";
    ssize_t n = pread(fd, said, sizeof said - 1, 0);
    said[n > 0 ? n : 0] = 0;
    close(fd);
    unlink(path);
    if (st != ACCEL_OK || st2 != ACCEL_OK) {
        fprintf(stderr, "rank %d: init: %s\n", rank, accel_last_error());
        return 10;
    }
    int share = expected_share(2), after = accel_num_threads();
    int want = (g_mode == UNSET || g_mode == OMP_EMPTY) && share < before ? share : before;
    bool capped = want < before;
    const char *line = strstr(said, "processes share this machine");
    int rc = 0;
    if (after != want) rc = 11;
    else if (rank == 0 && capped != (line != NULL)) rc = 12;
    else if (rank != 0 && line) rc = 13;
    else if (line && strstr(line + 1, "processes share this machine")) rc = 14;
    else if (g_mode == API_CHOICE && after != 3) rc = 15;
    if (rc)
        fprintf(stderr, "rank %d (mode %d): rc %d: threads %d -> %d, want %d (share %d, default %d); stderr '%s'\n",
                rank, (int)g_mode, rc, before, after, want, share, g_default, said);
    accel_dist_finalize();
    accel_dist_finalize();
    accel_thread_cleanup();
    return rc;
}

static void run(mode m, const char *what) {
    g_mode = m;
    if (m == OMP_ENV) setenv("OMP_NUM_THREADS", "2", 1); /* read by the library's check, not by OpenMP here */
    else if (m == OMP_EMPTY) setenv("OMP_NUM_THREADS", "", 1);
    else unsetenv("OMP_NUM_THREADS");
    dist_group g = {.world = 2, .one_machine = true, .timeout = "30", .kill_after_s = 60};
    CHECK(dist_group_runs_ok(&g, body, "%s", what));
    unsetenv("OMP_NUM_THREADS");
}

static void test_unset_sized_to_share(void) { run(UNSET, "OMP_NUM_THREADS unset"); }
static void test_omp_env_kept(void) { run(OMP_ENV, "OMP_NUM_THREADS set"); }
static void test_api_choice_kept(void) { run(API_CHOICE, "accel_set_num_threads(3)"); }
/* Set but empty: OpenMP ignores it (a warning, the machine-wide pool), so it
 * is no choice; it was taken for one and the pools stayed machine-wide. */
static void test_omp_empty_sized_to_share(void) { run(OMP_EMPTY, "OMP_NUM_THREADS empty"); }

/* One process alone: nothing to share, nothing changed or said. */
static void test_single_process_untouched(void) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        static const char *const VARS[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"};
        for (int i = 0; i < 4; i++) unsetenv(VARS[i]);
        int before = accel_num_threads();
        int rc = accel_dist_init() != ACCEL_OK ? 20 : accel_num_threads() != before ? 21 : 0;
        accel_dist_finalize();
        exit(rc);
    }
    dist_group g = {.world = 1, .kill_after_s = 20, .pid = {pid}};
    int st;
    dist_group_wait(&g, &st);
    CHECK_MSG(dist_exited_ok(st), "one process: status %#x", st);
}

int main(int argc, char **argv) {
    (void)argc;
    if (getenv("OMP_NUM_THREADS")) { /* OpenMP read it at load: start again without it */
        unsetenv("OMP_NUM_THREADS");
        execv("/proc/self/exe", argv);
        perror("execv");
        return 1;
    }
    g_default = accel_num_threads();
    RUN(test_unset_sized_to_share);
    RUN(test_omp_env_kept);
    RUN(test_api_choice_kept);
    RUN(test_omp_empty_sized_to_share);
    RUN(test_single_process_untouched);
    return check_summary();
}
