/* A world formed from a cluster launcher's variables, without `accel launch`.
 *
 *   - SLURM's compressed node lists: the first host ("node[01-03,07],gpu5"
 *     -> "node01"), and tasks per node ("2(x3),1"); malformed ones are errors
 *     quoting them;
 *   - srun, simulated on loopback: 2 tasks on one node (shm), and 2 nodes of
 *     1 task each (tcp; SLURM_JOB_NODELIST=127.0.0.[1-2] gives the main
 *     address 127.0.0.1, exported as MASTER_ADDR);
 *   - mpirun's OpenMPI variables and PMI's (MPICH, Intel MPI);
 *   - at rendezvous, two processes claiming one rank (two launchers given
 *     the same machine_rank) and a world size that differs from rank 0's
 *     are refused with a message naming the machines. */
#include <string.h>

#include "accel/dist.h"
#include "check.h"
#include "dist/slurm.h"
#include "dist_group.h"

static void check_first_host(const char *list, const char *want) {
    char host[64] = "";
    accel_status st = accel__slurm_first_host(list, host, sizeof host);
    CHECK_MSG(st == ACCEL_OK && !strcmp(host, want), "'%s' -> '%s' (%s), want '%s'", list, host,
              st == ACCEL_OK ? "ok" : accel_last_error(), want);
    accel_clear_error();
}

static void check_bad_list(const char *list) {
    char host[64];
    accel_status st = accel__slurm_first_host(list, host, sizeof host);
    CHECK_MSG(st == ACCEL_ERR_INVALID_ARG && strstr(accel_last_error(), list), "'%s': %d %s", list, (int)st,
              accel_last_error());
    accel_clear_error();
}

static void test_first_host(void) {
    check_first_host("node[01-03,07],gpu5", "node01");
    check_first_host("gpu5,node[1-2]", "gpu5");
    check_first_host("node[07,01-03]", "node07");
    check_first_host("rack1-[2-4]-ib", "rack1-2-ib");
    check_first_host("a[1-2]b[3-4]", "a1b3");
    check_first_host("localhost", "localhost");
    check_bad_list("");
    check_bad_list(",node1");
    check_bad_list("[1-2]");
    check_bad_list("node[01-03");
    check_bad_list("node]");
    check_bad_list("node[a-b]");
    char tiny[4];
    CHECK(accel__slurm_first_host("node[01-03]", tiny, sizeof tiny) == ACCEL_ERR_INVALID_ARG);
    accel_clear_error();
}

static void test_tasks_per_node(void) {
    const int want[] = {2, 2, 2, 1};
    for (int node = 0; node < 4; node++) {
        int n = 0;
        CHECK(accel__slurm_tasks_on_node("2(x3),1", node, &n) == ACCEL_OK && n == want[node]);
    }
    int n = 0;
    CHECK(accel__slurm_tasks_on_node("4", 0, &n) == ACCEL_OK && n == 4);
    const char *bad[] = {"", "x", "2(x", "2(x0)", "2(3)", "0", "2;1", "2,", "-1", "2(x-1)"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CHECK_MSG(accel__slurm_tasks_on_node(bad[i], 0, &n) == ACCEL_ERR_INVALID_ARG, "'%s'", bad[i]);
        accel_clear_error();
    }
    CHECK(accel__slurm_tasks_on_node("2(x3),1", 4, &n) == ACCEL_ERR_INVALID_ARG);
    CHECK(strstr(accel_last_error(), "SLURM_NODEID=4") != NULL);
    accel_clear_error();
}

/* ---------------------------------------------------------------- simulated launchers */

typedef enum launcher { SRUN_ONE_NODE, SRUN_TWO_NODES, MPIRUN, PMI } launcher;

static launcher g_launcher;
static int g_port;

static void clear_launch_env(void) {
    const char *vars[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "PMI_RANK",
                          "PMI_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                          "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "SLURM_PROCID",
                          "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "SLURM_NODEID",
                          "SLURM_TASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE", "SLURM_JOB_NODELIST",
                          "SLURM_STEP_NODELIST", "ACCEL_DIST_BACKEND", "ACCEL_DEBUG_MODE", "ACCEL_INSECURE_NO_SECRET",
                          "ACCEL_DIST_HOST_ADDR"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) unsetenv(vars[i]);
}

/* The variables each launcher gives task r of 2. */
static void set_launch_env(launcher l, int r) {
    clear_launch_env();
    dist_setenv_int("MASTER_PORT", g_port);
    setenv("ACCEL_DIST_TIMEOUT", "20", 1);
    setenv("ACCEL_JOB_SECRET", "s3cret", 1);
    switch (l) {
    case SRUN_ONE_NODE:
    case SRUN_TWO_NODES:
        dist_setenv_int("SLURM_PROCID", r);
        setenv("SLURM_NTASKS", "2", 1);
        dist_setenv_int("SLURM_LOCALID", l == SRUN_ONE_NODE ? r : 0);
        dist_setenv_int("SLURM_NODEID", l == SRUN_ONE_NODE ? 0 : r);
        setenv("SLURM_TASKS_PER_NODE", l == SRUN_ONE_NODE ? "2" : "1(x2)", 1);
        setenv("SLURM_JOB_NODELIST", l == SRUN_ONE_NODE ? "127.0.0.1" : "127.0.0.[1-2]", 1);
        break;
    case MPIRUN: /* our own rendezvous: no MPI in this test, whatever the build */
        dist_setenv_int("OMPI_COMM_WORLD_RANK", r);
        setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
        dist_setenv_int("OMPI_COMM_WORLD_LOCAL_RANK", r);
        setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
        setenv("ACCEL_DIST_BACKEND", "shm", 1);
        break;
    case PMI:
        dist_setenv_int("PMI_RANK", r);
        setenv("PMI_SIZE", "2", 1);
        setenv("ACCEL_DIST_BACKEND", "shm", 1);
        break;
    }
}

static int launched_body(int rank) {
    if (accel_dist_init() != ACCEL_OK) {
        fprintf(stderr, "rank %d: init: %s\n", rank, accel_last_error());
        return 10;
    }
    accel_pg *pg = accel_dist_default_group();
    bool two_nodes = g_launcher == SRUN_TWO_NODES;
    int rc = 0;
    if (accel_dist_rank() != rank || accel_dist_world_size() != 2) rc = 11;
    else if (accel_dist_local_world_size() != (two_nodes ? 1 : 2)) rc = 12;
    else if (strcmp(accel_pg_backend(pg), two_nodes ? "tcp" : "shm")) rc = 13;
    else if (two_nodes && (!getenv("MASTER_ADDR") || strcmp(getenv("MASTER_ADDR"), "127.0.0.1"))) rc = 14;
    float x = (float)(rank + 1);
    if (!rc && (accel_pg_all_reduce(pg, &x, 1, ACCEL_F32, ACCEL_REDUCE_SUM) != ACCEL_OK || x != 3.0f)) rc = 15;
    if (rc) fprintf(stderr, "rank %d: rc %d (%s, local %d): %s\n", rank, rc, accel_pg_backend(pg),
                    accel_dist_local_world_size(), accel_last_error());
    accel_dist_finalize();
    accel_clear_error();
    accel_thread_cleanup();
    return rc;
}

static void check_launcher(launcher l, const char *what) {
    g_launcher = l;
    g_port = dist_free_port();
    dist_group g = {.world = 2, .kill_after_s = 40};
    for (int r = 0; r < 2; r++) {
        fflush(NULL);
        g.pid[r] = fork();
        if (g.pid[r] == 0) {
            set_launch_env(l, r);
            exit(launched_body(r));
        }
    }
    int st[2];
    dist_group_wait(&g, st);
    for (int r = 0; r < 2; r++) CHECK_MSG(dist_exited_ok(st[r]), "%s: rank %d: status %#x", what, r, st[r]);
}

static void test_srun_one_node(void) { check_launcher(SRUN_ONE_NODE, "srun, 1 node"); }
static void test_srun_two_nodes(void) { check_launcher(SRUN_TWO_NODES, "srun, 2 nodes"); }
static void test_mpirun(void) { check_launcher(MPIRUN, "mpirun (OpenMPI variables)"); }
static void test_pmi(void) { check_launcher(PMI, "PMI_RANK/PMI_SIZE"); }

/* ---------------------------------------------------------------- refused at rendezvous */

typedef struct proc_spec {
    int rank, world, machine, delay_ms, hold_ms; /* hold: after joining, before the barrier */
} proc_spec;

static int claim_body(const proc_spec *p) {
    accel_status st = accel_dist_init();
    const char *msg = accel_last_error();
    fprintf(stderr, "rank %d of %d (machine %d): %s\n", p->rank, p->world, p->machine,
            st == ACCEL_OK ? "joined" : msg);
    int rc = st == ACCEL_OK ? 0
             : strstr(msg, "claimed by 2 processes") && strstr(msg, "machine_rank 1") ? 1
             : strstr(msg, "WORLD_SIZE is 3 on") && strstr(msg, "but 2 on the main machine") ? 2
                                                                                              : 3;
    if (st == ACCEL_OK) {
        /* Keep rank 0's store up a while: a duplicate that connected in time
         * must get its refusal, not lose the connection to a job that ended. */
        nanosleep(&(struct timespec){p->hold_ms / 1000, (p->hold_ms % 1000) * 1000000L}, NULL);
        if (accel_pg_barrier(accel_dist_default_group()) != ACCEL_OK) rc = 4;
        accel_dist_finalize();
    }
    accel_clear_error();
    accel_thread_cleanup();
    return rc;
}

/* Runs the processes (one machine each: tcp); their exit codes into rc. */
static void run_procs(const proc_spec *procs, int n, const char *timeout, int *rc) {
    int port = dist_free_port();
    dist_group g = {.world = n, .kill_after_s = 40};
    for (int i = 0; i < n; i++) {
        fflush(NULL);
        g.pid[i] = fork();
        if (g.pid[i] != 0) continue;
        clear_launch_env();
        nanosleep(&(struct timespec){0, procs[i].delay_ms * 1000000L}, NULL);
        dist_setenv_int("RANK", procs[i].rank);
        dist_setenv_int("WORLD_SIZE", procs[i].world);
        setenv("LOCAL_RANK", "0", 1);
        setenv("LOCAL_WORLD_SIZE", "1", 1);
        dist_setenv_int("GROUP_RANK", procs[i].machine);
        setenv("MASTER_ADDR", "127.0.0.1", 1);
        dist_setenv_int("MASTER_PORT", port);
        setenv("ACCEL_DIST_TIMEOUT", timeout, 1);
        setenv("ACCEL_JOB_SECRET", "s3cret", 1);
        exit(claim_body(&procs[i]));
    }
    int st[DIST_GROUP_MAX];
    dist_group_wait(&g, st);
    for (int i = 0; i < n; i++) rc[i] = WIFEXITED(st[i]) ? WEXITSTATUS(st[i]) : 100;
}

static void test_duplicate_machine_rank(void) {
    /* the two rank 1s wait for rank 0's store, so both claim while it serves */
    const proc_spec procs[] = {{0, 2, 0, 300, 1500}, {1, 2, 1, 0, 1500}, {1, 2, 1, 0, 1500}};
    int rc[3];
    run_procs(procs, 3, "20", rc);
    CHECK_MSG(rc[0] == 0, "rank 0: %d", rc[0]);
    /* One rank 1 joins and the other never does. The duplicate gets the named
     * refusal (1) when it claims while rank 0's store still serves; one that
     * arrives after the rendezvous completed only times out (3): a known gap
     * (the store stops serving once the world is complete), see docs/dist.md. */
    CHECK_MSG((rc[1] == 0) != (rc[2] == 0) && (rc[1] == 1 || rc[2] == 1 || rc[1] == 3 || rc[2] == 3),
              "the rank 1s: %d, %d", rc[1], rc[2]);
}

static void test_world_size_mismatch(void) {
    const proc_spec procs[] = {{0, 2, 0, 0, 0}, {1, 3, 1, 0, 0}};
    int rc[2];
    run_procs(procs, 2, "3", rc);
    CHECK_MSG(rc[1] == 2, "rank 1: %d", rc[1]);
    CHECK_MSG(rc[0] == 3, "rank 0 (waits for the refused rank, then fails): %d", rc[0]);
}

int main(void) {
    RUN(test_first_host);
    RUN(test_tasks_per_node);
    RUN(test_srun_one_node);
    RUN(test_srun_two_nodes);
    RUN(test_mpirun);
    RUN(test_pmi);
    RUN(test_duplicate_machine_rank);
    RUN(test_world_size_mismatch);
    return check_summary();
}
