/* A world formed from a cluster launcher's variables, without `accel launch`.
 *
 *   - SLURM's compressed node lists: the first host ("node[01-03,07],gpu5"
 *     -> "node01"), and tasks per node ("2(x3),1"); malformed ones are errors
 *     quoting them;
 *   - srun, simulated on loopback: 2 tasks on one node (shm), and 2 nodes of
 *     1 task each (tcp; SLURM_JOB_NODELIST=127.0.0.[1-2] gives the main
 *     address 127.0.0.1, exported as MASTER_ADDR);
 *   - mpirun's OpenMPI variables and PMI's (MPICH, Intel MPI);
 *   - a program run by an sbatch script itself (or in salloc's shell): the
 *     job's SLURM_NTASKS but no step: one process, with a message;
 *   - at rendezvous, two processes claiming one rank (two launchers given
 *     the same machine_rank: racing for the store, or the second one after
 *     the rendezvous completed) and a world size that differs from rank 0's
 *     are refused with a message naming the machines. */
#include <poll.h>
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
                          "SLURM_STEP_NODELIST", "SLURM_STEP_ID", "SLURM_STEPID", "SLURM_JOB_ID", "ACCEL_DIST_BACKEND", "ACCEL_DEBUG_MODE", "ACCEL_INSECURE_NO_SECRET",
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
    case SRUN_TWO_NODES: /* what srun gives each task of step 0 (Slurm's env_array_for_step, setup_env) */
        setenv("SLURM_JOB_ID", "4242", 1);
        setenv("SLURM_STEP_ID", "0", 1);
        setenv("SLURM_STEP_NUM_TASKS", "2", 1);
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

/* ---------------------------------------------------------------- not a task of a step */

/* A program run by an sbatch script itself (no srun) sees the job's
 * SLURM_NTASKS, SLURM_PROCID=0, ... but no SLURM_STEP_ID; salloc's shell
 * has no SLURM_PROCID either. It must run as one process at once (not wait
 * for SLURM_NTASKS ranks) and say why. */
static int batch_script_body(bool with_procid) {
    clear_launch_env();
    setenv("SLURM_JOB_ID", "4242", 1);
    setenv("SLURM_NTASKS", "2", 1);
    setenv("SLURM_TASKS_PER_NODE", "2", 1);
    setenv("SLURM_JOB_NODELIST", "127.0.0.1", 1);
    if (with_procid) {
        setenv("SLURM_PROCID", "0", 1);
        setenv("SLURM_LOCALID", "0", 1);
        setenv("SLURM_NODEID", "0", 1);
    }
    dist_setenv_int("MASTER_PORT", dist_free_port());
    setenv("ACCEL_DIST_TIMEOUT", "3", 1);
    int err[2];
    if (pipe(err) != 0 || dup2(err[1], 2) < 0) return 20;
    double t0 = accel_now_seconds();
    accel_status st = accel_dist_init();
    double dt = accel_now_seconds() - t0;
    char said[1024] = "";
    fflush(stderr);
    struct pollfd pf = {.fd = err[0], .events = POLLIN};
    if (poll(&pf, 1, 0) == 1 && read(err[0], said, sizeof said - 1) < 0) said[0] = 0;
    int rc = st != ACCEL_OK                                            ? 21
             : accel_dist_world_size() != 1 || accel_dist_rank() != 0 ? 22
             : strcmp(accel_pg_backend(accel_dist_default_group()), "self") ? 23
             : dt > 1.0                                                ? 24
             : !strstr(said, "SLURM_NTASKS=2") || !strstr(said, "not a task of an srun step") ? 25
                                                                       : 0;
    if (st == ACCEL_OK) accel_dist_finalize();
    accel_clear_error();
    accel_thread_cleanup();
    return rc;
}

static void check_batch_script(bool with_procid) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) exit(batch_script_body(with_procid));
    dist_group g = {.world = 1, .kill_after_s = 20, .pid = {pid}};
    int st;
    dist_group_wait(&g, &st);
    CHECK_MSG(dist_exited_ok(st), "%s: status %#x", with_procid ? "sbatch script" : "salloc shell", st);
}

static void test_sbatch_script_runs_alone(void) { check_batch_script(true); }
static void test_salloc_shell_runs_alone(void) { check_batch_script(false); }

/* ---------------------------------------------------------------- refused at rendezvous */

typedef struct proc_spec {
    int rank, world, machine, delay_ms;
    bool late; /* starts once rank 0 has joined: the rendezvous is over */
} proc_spec;

/* Pipes between the processes: rank 0 tells a late one that it joined; a
 * refused one tells the others that it was refused, so the job stays up
 * until then (no sleeps to tune: the order is forced). */
static int g_joined[2], g_refused[2];

static bool wait_byte(int fd, int timeout_ms) {
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    char c;
    return poll(&pf, 1, timeout_ms) == 1 && read(fd, &c, 1) == 1;
}

static int claim_body(const proc_spec *p) {
    if (p->late && !wait_byte(g_joined[0], 30000)) return 5;
    accel_status st = accel_dist_init();
    const char *msg = accel_last_error();
    fprintf(stderr, "rank %d of %d (machine %d%s): %s\n", p->rank, p->world, p->machine, p->late ? ", late" : "",
            st == ACCEL_OK ? "joined" : msg);
    int rc = st == ACCEL_OK ? 0
             : strstr(msg, "claimed by 2 processes") && strstr(msg, "machine_rank 1") &&
                       strstr(msg, "or two jobs given the same MASTER_PORT=") ? 1
             : strstr(msg, "WORLD_SIZE is 3 on") && strstr(msg, "but 2 on the main machine") ? 2
                                                                                              : 3;
    if (st == ACCEL_OK) {
        if (p->rank == 0 && write(g_joined[1], "j", 1) != 1) rc = 6;
        wait_byte(g_refused[0], 30000); /* keep the job up until the duplicate has its answer */
        if (accel_pg_barrier(accel_dist_default_group()) != ACCEL_OK) rc = 4;
        accel_dist_finalize();
    } else if (write(g_refused[1], "rr", 2) != 2) { /* one byte for each process of the job */
        rc = 7;
    }
    accel_clear_error();
    accel_thread_cleanup();
    return rc;
}

/* Runs the processes (one machine each: tcp); their exit codes into rc. */
static void run_procs(const proc_spec *procs, int n, const char *timeout, int *rc) {
    int port = dist_free_port();
    CHECK(pipe(g_joined) == 0 && pipe(g_refused) == 0);
    dist_group g = {.world = n, .kill_after_s = 60};
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
    for (int i = 0; i < 2; i++) {
        close(g_joined[i]);
        close(g_refused[i]);
    }
}

/* Two launchers given machine_rank 1: one rank 1 joins, the other is
 * refused by name, whether it claims while the rendezvous runs (the two race
 * for the store) or after it completed (rank 0's store still serves). */
static void test_duplicate_machine_rank_early(void) {
    const proc_spec procs[] = {{0, 2, 0, 300, false}, {1, 2, 1, 0, false}, {1, 2, 1, 0, false}};
    int rc[3];
    run_procs(procs, 3, "20", rc);
    CHECK_MSG(rc[0] == 0, "rank 0: %d", rc[0]);
    CHECK_MSG((rc[1] == 0 && rc[2] == 1) || (rc[1] == 1 && rc[2] == 0), "the rank 1s: %d, %d", rc[1], rc[2]);
}

static void test_duplicate_machine_rank_late(void) {
    const proc_spec procs[] = {{0, 2, 0, 0, false}, {1, 2, 1, 0, false}, {1, 2, 1, 0, true}};
    int rc[3];
    run_procs(procs, 3, "20", rc);
    CHECK_MSG(rc[0] == 0 && rc[1] == 0, "the job: %d, %d", rc[0], rc[1]);
    CHECK_MSG(rc[2] == 1, "the late rank 1: %d", rc[2]);
}

static void test_world_size_mismatch(void) {
    const proc_spec procs[] = {{0, 2, 0, 0, false}, {1, 3, 1, 0, false}};
    int rc[2];
    run_procs(procs, 2, "3", rc);
    CHECK_MSG(rc[1] == 2, "rank 1: %d", rc[1]);
    CHECK_MSG(rc[0] == 3, "rank 0 (waits for the refused rank, then fails): %d", rc[0]);
}

/* ---------------------------------------------------------------- the port of a job */

/* 15000 + (4 * SLURM_JOB_ID + SLURM_STEP_ID mod 4) mod 17000: distinct for
 * 4 steps of a job and neighbouring jobs, below the ephemeral ports; ids
 * that are no numbers are errors naming the variable. */
static void test_job_port(void) {
    clear_launch_env();
    long port[5];
    const char *steps[] = {"0", "1", "2", "3"};
    setenv("SLURM_JOB_ID", "4242", 1);
    for (int i = 0; i < 4; i++) {
        setenv("SLURM_STEP_ID", steps[i], 1);
        CHECK(accel__slurm_job_port(&port[i]) == ACCEL_OK && port[i] == 15000 + (4 * 4242 + i) % 17000);
    }
    setenv("SLURM_JOB_ID", "4243", 1);
    setenv("SLURM_STEP_ID", "0", 1);
    CHECK(accel__slurm_job_port(&port[4]) == ACCEL_OK);
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < i; j++) CHECK_MSG(port[i] != port[j], "ports %d and %d: %ld", i, j, port[i]);
    for (int i = 0; i < 5; i++) CHECK(port[i] >= 15000 && port[i] < 32000);
    const char *bad[][2] = {{"SLURM_JOB_ID", "abc"}, {"SLURM_JOB_ID", ""}, {"SLURM_JOB_ID", "-1"},
                            {"SLURM_STEP_ID", "x"}, {"SLURM_STEP_ID", ""}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        setenv("SLURM_JOB_ID", "4242", 1);
        setenv("SLURM_STEP_ID", "0", 1);
        setenv(bad[i][0], bad[i][1], 1);
        long p;
        CHECK_MSG(accel__slurm_job_port(&p) == ACCEL_ERR_INVALID_ARG && strstr(accel_last_error(), bad[i][0]),
                  "%s='%s': %s", bad[i][0], bad[i][1], accel_last_error());
        accel_clear_error();
    }
    clear_launch_env();
}

/* Two plain `srun -N1 -n2` jobs on one node, neither given MASTER_PORT:
 * both took 29500, and the second failed "claimed by 2 processes (two
 * launchers given the same machine_rank?)". Each job's port now comes from
 * its SLURM_JOB_ID: both run. */
static int two_jobs_body(int job, int rank) {
    set_launch_env(SRUN_ONE_NODE, rank);
    unsetenv("MASTER_PORT");
    char id[32];
    snprintf(id, sizeof id, "%d", 100000 + (int)(getppid() % 4000) * 2 + job); /* neighbours: distinct ports */
    setenv("SLURM_JOB_ID", id, 1);
    int rc = 0;
    if (accel_dist_init() != ACCEL_OK) {
        fprintf(stderr, "job %d rank %d: %s\n", job, rank, accel_last_error());
        rc = 10;
    } else {
        float x = (float)(rank + 1);
        if (accel_pg_all_reduce(accel_dist_default_group(), &x, 1, ACCEL_F32, ACCEL_REDUCE_SUM) != ACCEL_OK ||
            x != 3.0f)
            rc = 11;
        accel_pg_barrier(accel_dist_default_group());
        accel_dist_finalize();
    }
    accel_clear_error();
    accel_thread_cleanup();
    return rc;
}

static void test_two_srun_jobs_one_node(void) {
    dist_group g = {.world = 4, .kill_after_s = 40};
    for (int i = 0; i < 4; i++) {
        fflush(NULL);
        g.pid[i] = fork();
        if (g.pid[i] == 0) exit(two_jobs_body(i / 2, i % 2));
    }
    int st[4];
    dist_group_wait(&g, st);
    for (int i = 0; i < 4; i++) CHECK_MSG(dist_exited_ok(st[i]), "job %d rank %d: status %#x", i / 2, i % 2, st[i]);
}

int main(void) {
    RUN(test_first_host);
    RUN(test_tasks_per_node);
    RUN(test_srun_one_node);
    RUN(test_srun_two_nodes);
    RUN(test_mpirun);
    RUN(test_pmi);
    RUN(test_job_port);
    RUN(test_two_srun_jobs_one_node);
    RUN(test_sbatch_script_runs_alone);
    RUN(test_salloc_shell_runs_alone);
    RUN(test_duplicate_machine_rank_early);
    RUN(test_duplicate_machine_rank_late);
    RUN(test_world_size_mismatch);
    return check_summary();
}
