/* `accel launch` end to end: the environment contract, flag spelling and
 * precedence, failure reports (exit 1, SIGKILL, hang, dead peer), debug-mode
 * mismatch, restarts, --tee/--log_dir, and that no worker outlives the job.
 * Finds build/bin/accel and build/bin/test_dist_faults next to itself. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "accel/core.h"
#include "check.h"
#include "cli_run.h"
#include "sibling_exe.h"

static char ACCEL[PATH_MAX + 32], WORKER[PATH_MAX + 32], TMP[PATH_MAX];
static char OUT[1 << 16], ERR[1 << 16];

static const cli_io IO = {TMP, OUT, ERR, sizeof OUT, sizeof ERR};

/* Runs argv with extra "K=V" env entries; stdout/stderr into OUT/ERR. */
static int run(const char *const *argv, const char *const *env) { return cli_run(&IO, NULL, argv, env, NULL); }

static const char *write_config(const char *name, const char *text) {
    static char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/%s", TMP, name);
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
    return path;
}

/* `accel launch --config_file TMP/name /usr/bin/env`, the config `yaml`:
 * its exit status, its output in OUT and ERR. */
static int launch_with_config(const char *name, const char *yaml) {
    const char *a[] = {ACCEL, "launch", "--config_file", write_config(name, yaml), "/usr/bin/env", NULL};
    return run(a, NULL);
}

/* Every pid recorded by the workers is gone. */
static bool no_survivors(void) {
    bool ok = true;
    for (int r = 0; r < 4; r++) {
        char path[PATH_MAX + 32], buf[32];
        snprintf(path, sizeof path, "%s/rank%d.pid", TMP, r);
        cli_slurp(path, buf, sizeof buf);
        if (!buf[0]) continue;
        pid_t pid = atoi(buf);
        if (kill(pid, 0) == 0) {
            fprintf(stderr, "worker pid %d (rank %d) survived\n", (int)pid, r);
            kill(pid, SIGKILL);
            ok = false;
        }
        unlink(path);
    }
    return ok;
}

static char PIDENV[PATH_MAX + 32];

/* Writes an executable script TMP/name from a printf format; returns its path. */
static const char *script(const char *name, const char *fmt, ...) {
    static char path[8][PATH_MAX + 64];
    static int next;
    char *p = path[next++ % 8];
    snprintf(p, PATH_MAX + 64, "%s/%s", TMP, name);
    FILE *f = fopen(p, "w");
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fclose(f);
    chmod(p, 0755);
    return p;
}

/* Starts argv in the background (stdout/stderr to TMP/bg.out|err), env "K=V" entries added. */
static pid_t start(const char *const *argv, const char *const *env) {
    char o[PATH_MAX + 16], e[PATH_MAX + 16];
    snprintf(o, sizeof o, "%s/bg.out", TMP);
    snprintf(e, sizeof e, "%s/bg.err", TMP);
    pid_t pid = fork();
    if (pid == 0) {
        int fo = open(o, O_WRONLY | O_CREAT | O_TRUNC, 0644), fe = open(e, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fo, 1);
        dup2(fe, 2);
        for (int i = 0; env && env[i]; i++) putenv((char *)env[i]);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    return pid;
}

/* Pid written by rank r (0 until the file holds one). */
static pid_t rank_pid(int r) {
    char path[PATH_MAX + 32], buf[32];
    snprintf(path, sizeof path, "%s/rank%d.pid", TMP, r);
    cli_slurp(path, buf, sizeof buf);
    return buf[0] && strchr(buf, '\n') ? atoi(buf) : 0;
}

/* Issue #8: after `kill -9` of the launcher nothing of the job may keep running,
 * also when the worker is a wrapper script that forks the real trainer
 * (PDEATHSIG reaches the wrapper only). This test is the orphans' subreaper
 * while it runs, so it can reap them and tell a live process from a zombie. */
static void test_launcher_sigkill_wrapper(void) {
    char record[PATH_MAX + 32], dir[PATH_MAX] = "";
    snprintf(record, sizeof record, "%s/wrap_error_file", TMP);
    unlink(record);
    const char *wrap = script("wrap.sh", "#!/bin/sh\necho \"$TORCHELASTIC_ERROR_FILE\" > %s\n\"%s\" \"$@\"\nexit $?\n",
                              record, WORKER);
    const char *a[] = {ACCEL, "launch", "--num_processes", "2", wrap, "hang", NULL};
    const char *env[] = {PIDENV, "ACCEL_DIST_TIMEOUT=120", NULL};
    CHECK(prctl(PR_SET_CHILD_SUBREAPER, 1) == 0);
    pid_t launcher = start(a, env);
    double t0 = accel_now_seconds();
    while ((!rank_pid(0) || !rank_pid(1)) && accel_now_seconds() - t0 < 30) usleep(20000);
    pid_t trainer[2] = {rank_pid(0), rank_pid(1)};
    CHECK(trainer[0] > 0 && trainer[1] > 0);
    kill(launcher, SIGKILL);
    waitpid(launcher, NULL, 0);
    bool alive = true;
    for (t0 = accel_now_seconds(); alive && accel_now_seconds() - t0 < 5; usleep(20000)) {
        while (waitpid(-1, NULL, WNOHANG) > 0) {}
        alive = false;
        for (int r = 0; r < 2; r++) alive |= trainer[r] > 0 && kill(trainer[r], 0) == 0;
    }
    CHECK_MSG(!alive, "a wrapped trainer outlived the SIGKILLed launcher by 5 s");
    CHECK(no_survivors());
    /* the watchdog removed the launcher's temporary error-file directory */
    cli_slurp(record, dir, sizeof dir);
    dir[strcspn(dir, "\n")] = 0;
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    CHECK_MSG(strstr(dir, "accel-launch-") != NULL, "error file directory '%s'", dir);
    for (t0 = accel_now_seconds(); access(dir, F_OK) == 0 && accel_now_seconds() - t0 < 5;) usleep(20000);
    CHECK_MSG(access(dir, F_OK) != 0, "'%s' outlived the SIGKILLed launcher by 5 s", dir);
    prctl(PR_SET_CHILD_SUBREAPER, 0);
    while (waitpid(-1, NULL, WNOHANG) > 0) {}
}

/* Issue #14: the SIGKILL escalation comes 3 s after SIGTERM whatever
 * --monitor_interval says (10 delayed it to 10 s, 20 to 20 s); an infinite interval is an
 * error, and so are a port above 65535 and a non-finite gradient clipping norm. */
static void test_monitor_interval(void) {
    /* rank 0 ignores SIGTERM (only SIGKILL ends it); rank 1 fails once rank 0 is ready */
    char ready[PATH_MAX + 16];
    snprintf(ready, sizeof ready, "%s/trapped", TMP);
    const char *stubborn = script("stubborn.sh", "#!/bin/sh\nif [ \"$RANK\" = 1 ]; then\n"
                                  "  while [ ! -e %s ]; do sleep 0.05; done\n  exit 1\nfi\n"
                                  "trap '' TERM\ntouch %s\nexec sleep 30\n", ready, ready);
    /* 20 s against ~3 s: far enough apart that a loaded machine (ASan, parallel
     * tests) cannot blur them */
    const char *intervals[] = {"20", "1e300"};
    for (int i = 0; i < 2; i++) {
        unlink(ready);
        const char *a[] = {ACCEL, "launch", "-q", "--num_processes", "2", "--monitor_interval", intervals[i], stubborn, NULL};
        double t0 = accel_now_seconds();
        CHECK(run(a, NULL) == 1);
        double took = accel_now_seconds() - t0;
        CHECK_MSG(took > 2.5 && took < 15, "--monitor_interval %s: the job ended after %.1f s, not ~3 s", intervals[i], took);
    }
    const char *port[] = {ACCEL, "launch", "--main_process_port", "70000", WORKER, "env", NULL};
    CHECK(run(port, NULL) == 2); /* was truncated to 16 bits (4464) for the bind and passed on whole */
    CHECK_STR_CONTAINS(ERR, "--main_process_port: invalid value '70000' (expected an integer from 0 to 65535)");
    const char *clip[] = {ACCEL, "launch", "--gradient_clipping", "1e999", WORKER, "env", NULL};
    CHECK(run(clip, NULL) == 2);
    CHECK_STR_CONTAINS(ERR, "--gradient_clipping: invalid value '1e999'");
    const char *inf[] = {ACCEL, "launch", "--monitor_interval", "inf", WORKER, "env", NULL};
    CHECK(run(inf, NULL) == 2);
    CHECK_STR_CONTAINS(ERR, "--monitor_interval 'inf' is not a positive number");
    /* -1 is a config file's "pass it on the command line": given as the flag, it
     * was answered with that request */
    const char *minus[] = {ACCEL, "launch", "--num_processes", "-1", WORKER, "env", NULL};
    CHECK(run(minus, NULL) == 2);
    CHECK_STR_CONTAINS(ERR, "--num_processes must be at least 1");
}

/* The float flags as argparse's type=float (Python's float()) reads them:
 * blanks around, '_' between two digits; not strtod's hex, which took
 * --monitor_interval 0x10 as 16 s and --gradient_clipping 0x10 as a norm of 16.
 * The norm reaches the workers as str(float()) writes it (" 1_0 " reached
 * them as typed), and is refused before any worker starts where it is not a
 * finite norm. */
static void test_float_flags(void) {
    static const char *const REFUSED[][3] = {
        {"--monitor_interval", "0x10", "--monitor_interval '0x10' is not a positive number"},
        {"--gradient_clipping", "0x10", "argument --gradient_clipping: invalid value '0x10'"},
        {"--gradient_clipping", "1__0", "argument --gradient_clipping: invalid value '1__0'"},
        {"--gradient_clipping", "inf", "argument --gradient_clipping: invalid value 'inf'"},
        {"--gradient_clipping", "nan", "argument --gradient_clipping: invalid value 'nan'"},
        {"--gradient_clipping", "-1", "argument --gradient_clipping: invalid value '-1'"},
        {"--gradient_clipping", "1e400", "argument --gradient_clipping: invalid value '1e400'"},
        {"--gradient_clipping", "", "argument --gradient_clipping: invalid value ''"},
    };
    for (size_t i = 0; i < sizeof REFUSED / sizeof *REFUSED; i++) {
        const char *a[] = {ACCEL, "launch", REFUSED[i][0], REFUSED[i][1], "/usr/bin/env", NULL};
        CHECK_MSG(run(a, NULL) == 2, "%s '%s'", REFUSED[i][0], REFUSED[i][1]);
        CHECK_STR_CONTAINS(ERR, REFUSED[i][2]);
        CHECK_MSG(!strstr(OUT, "ACCEL_"), "%s '%s': a worker ran", REFUSED[i][0], REFUSED[i][1]);
    }
    const char *ok[] = {ACCEL, "launch", "--monitor_interval", " 0.0_5 ", "--use_deepspeed", "--gradient_clipping",
                        " 1_0 ", "/usr/bin/env", NULL};
    CHECK_MSG(run(ok, NULL) == 0, "%s", ERR);
    CHECK_STR_CONTAINS(OUT, "ACCELERATE_GRADIENT_CLIPPING=10.0\n"); /* str(float(' 1_0 ')) */
    CHECK_STR_CONTAINS(OUT, "ACCEL_GRADIENT_CLIPPING=10.0\n");
}

static void test_env_contract(void) {
    const char *a[] = {ACCEL, "launch", "--num_processes", "2", "--mixed-precision", "bf16",
                       "--num_cpu_threads_per_process", "1", "--use_deepspeed", "--zero_stage", "3",
                       "--gradient_accumulation_steps", "4", WORKER, "env", NULL};
    CHECK(run(a, NULL) == 0);
    const char *want[] = {"RANK=0\n", "RANK=1\n", "LOCAL_RANK=1\n", "WORLD_SIZE=2\n", "LOCAL_WORLD_SIZE=2\n",
                          "GROUP_RANK=0\n", "GROUP_WORLD_SIZE=1\n", "ROLE_NAME=default\n", "ROLE_WORLD_SIZE=2\n",
                          "MASTER_ADDR=127.0.0.1\n", "MASTER_PORT=", "TORCHELASTIC_RESTART_COUNT=0\n",
                          "TORCHELASTIC_MAX_RESTARTS=0\n", "TORCHELASTIC_RUN_ID=", "OMP_NUM_THREADS=1\n",
                          "ACCELERATE_MIXED_PRECISION=bf16\n", "ACCEL_MIXED_PRECISION=bf16\n",
                          "ACCEL_GRADIENT_ACCUMULATION_STEPS=4\n", "ACCEL_ZERO_STAGE=3\n", "ACCEL_JOB_SECRET="};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) CHECK_STR_CONTAINS(OUT, want[i]);
    CHECK(!strstr(OUT, "ACCEL_DEBUG_MODE=1"));
    /* OMP_WAIT_POLICY: PASSIVE unless the user chose (libgomp's spinning beside OpenBLAS) */
    const char *unset[] = {"OMP_WAIT_POLICY", NULL};
    CHECK(run(a, unset) == 0);
    CHECK_STR_CONTAINS(OUT, "OMP_WAIT_POLICY=PASSIVE\n");
    const char *active[] = {"OMP_WAIT_POLICY=ACTIVE", NULL};
    CHECK(run(a, active) == 0);
    CHECK_STR_CONTAINS(OUT, "OMP_WAIT_POLICY=ACTIVE\n");
    CHECK(!strstr(OUT, "OMP_WAIT_POLICY=PASSIVE"));
    /* --debug, --cpu */
    const char *b[] = {ACCEL, "launch", "--cpu", "--debug", "--num-processes=3", WORKER, "env", NULL};
    CHECK(run(b, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "RANK=2\n");
    CHECK_STR_CONTAINS(OUT, "ACCEL_DEBUG_MODE=1\n");
    CHECK_STR_CONTAINS(OUT, "ACCELERATE_DEBUG_MODE=true\n");
    CHECK_STR_CONTAINS(OUT, "ACCEL_USE_CPU=1\n");
}

/* A port the launcher picked stays reserved until the job ends: a second
 * launch asking the kernel for a free port cannot get it (two parallel
 * launches once joined each other's store). */
static void test_free_port_reserved(void) {
    const char *standalone[] = {ACCEL, "launch", "--num_processes", "2", WORKER, "reserved", NULL};
    CHECK(run(standalone, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "port reserved\nport reserved\n");
    const char *zero[] = {ACCEL, "launch", "--num_processes", "1", "--main_process_port", "0", WORKER, "reserved", NULL};
    CHECK(run(zero, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "port reserved\n");
}

static void test_flag_errors(void) {
    const char *abbrev[] = {ACCEL, "launch", "--num_proc", "2", WORKER, "env", NULL};
    CHECK(run(abbrev, NULL) == 2);
    CHECK_STR_CONTAINS(ERR, "unrecognized arguments: --num_proc");
    const char *dyn[] = {ACCEL, "launch", "--dynamo_backend", "inductor", WORKER, "env", NULL};
    CHECK(run(dyn, NULL) == 2);
    CHECK_STR_CONTAINS(ERR, "--dynamo_backend inductor is not supported");
    const char *two[] = {ACCEL, "launch", "--cpu", "--use_fsdp", WORKER, "env", NULL};
    CHECK(run(two, NULL) == 2);
    CHECK_STR_CONTAINS(ERR, "You can only use one of");
    const char *mp[] = {ACCEL, "launch", "--mixed_precision", "fp4", WORKER, "env", NULL};
    CHECK(run(mp, NULL) == 2);
    CHECK_STR_CONTAINS(ERR, "argument --mixed_precision/--mixed-precision: invalid choice: 'fp4'");
    const char *none[] = {ACCEL, NULL};
    CHECK(run(none, NULL) == 1);
    CHECK_STR_CONTAINS(OUT, "usage: accel");
    const char *help[] = {ACCEL, "launch", "--help", NULL};
    CHECK(run(help, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "--num_processes");
    CHECK(!strstr(OUT, "--num-processes"));
    const char *missing[] = {ACCEL, "launch", "--num_processes", "2", "/nonexistent/prog", NULL};
    CHECK(run(missing, NULL) == 1);
    CHECK_STR_CONTAINS(ERR, "cannot run '/nonexistent/prog'");
}

static void test_worker_exit1(void) {
    const char *a[] = {ACCEL, "launch", "--num_processes", "2", WORKER, "exit1", NULL};
    const char *env[] = {PIDENV, NULL};
    double t0 = accel_now_seconds();
    CHECK(run(a, env) == 1);
    CHECK(accel_now_seconds() - t0 < 10);
    CHECK_STR_CONTAINS(ERR, "Root Cause (first observed failure)");
    CHECK_STR_CONTAINS(ERR, "rank      : 1 (local_rank: 1)");
    CHECK_STR_CONTAINS(ERR, "exitcode  : 1\n");
    CHECK_STR_CONTAINS(ERR, "    boom from rank 1\n");
    CHECK(no_survivors());
}

static void test_worker_sigkill(void) {
    const char *a[] = {ACCEL, "launch", "-q", "--num_processes", "2", WORKER, "kill", NULL};
    const char *env[] = {PIDENV, NULL};
    CHECK(run(a, env) == 1);
    CHECK_STR_CONTAINS(ERR, "accel launch: rank 1 failed (exitcode  : -9 (signal: SIGKILL))");
    const char *b[] = {ACCEL, "launch", "--num_processes", "2", WORKER, "kill", NULL};
    CHECK(run(b, env) == 1);
    CHECK_STR_CONTAINS(ERR, "signal: SIGKILL");
    CHECK(no_survivors());
}

/* Inside a SLURM job step, num_machines, machine_rank and main_process_ip
 * come from SLURM's variables unless flags give them. */
static void test_slurm_machines(void) {
    const char *three[] = {ACCEL, "launch", "--num_processes", "3", WORKER, "env", NULL};
    const char *env[] = {"SLURM_STEP_NUM_NODES=2", "SLURM_NODEID=1", "SLURM_JOB_NODELIST=127.0.0.[1-2]", NULL};
    CHECK(run(three, env) == 2);
    CHECK_STR_CONTAINS(ERR, "--num_processes 3 (the total) is not a multiple of --num_machines 2");
    const char *far[] = {"SLURM_STEP_NUM_NODES=2", "SLURM_NODEID=5", "SLURM_JOB_NODELIST=127.0.0.[1-2]", NULL};
    const char *two[] = {ACCEL, "launch", "--num_processes", "2", WORKER, "env", NULL};
    CHECK(run(two, far) == 2);
    CHECK_STR_CONTAINS(ERR, "--machine_rank 5 must be below --num_machines 2");
    const char *bad[] = {"SLURM_STEP_NUM_NODES=2", "SLURM_NODEID=1", "SLURM_JOB_NODELIST=node[01", NULL};
    CHECK(run(two, bad) == 2);
    CHECK_STR_CONTAINS(ERR, "SLURM node list 'node[01'");
    /* flags win */
    const char *flags[] = {ACCEL, "launch", "--num_processes", "2", "--num_machines", "1", "--machine_rank", "0",
                           WORKER, "env", NULL};
    CHECK(run(flags, env) == 0);
    CHECK_STR_CONTAINS(OUT, "GROUP_WORLD_SIZE=1\n");
    /* set but empty: refused by name as every variable (it was read as unset: one machine) */
    const char *no_nodes[] = {"SLURM_STEP_NUM_NODES=", "SLURM_NODEID=1", NULL};
    CHECK(run(two, no_nodes) == 2);
    CHECK_STR_CONTAINS(ERR, "accel launch: error: the environment: SLURM_STEP_NUM_NODES is set but empty");
    CHECK(!strstr(OUT, "RANK="));
    const char *no_id[] = {"SLURM_STEP_NUM_NODES=2", "SLURM_NODEID=", NULL};
    CHECK(run(two, no_id) == 2);
    CHECK_STR_CONTAINS(ERR, "accel launch: error: the environment: SLURM_NODEID is set but empty");
}

/* `srun -N1 -n2 accel launch --num_processes 2`: two launchers in one step
 * ran two separate jobs. One launcher per node is the only right setup: more
 * tasks than nodes are refused, saying what to run instead. */
static void test_slurm_several_tasks_refused(void) {
    const char *two[] = {ACCEL, "launch", "--num_processes", "2", WORKER, "env", NULL};
    const char *env[] = {"SLURM_STEP_ID=0", "SLURM_JOB_ID=4242", "SLURM_STEP_NUM_NODES=1", "SLURM_NODEID=0",
                         "SLURM_STEP_NUM_TASKS=2", "SLURM_JOB_NODELIST=127.0.0.1", NULL};
    CHECK(run(two, env) == 2);
    CHECK_STR_CONTAINS(ERR, "this is one of 2 tasks of an srun step on 1 node");
    CHECK_STR_CONTAINS(ERR, "srun --ntasks-per-node=1 accel launch");
    const char *one_per_node[] = {"SLURM_STEP_ID=0", "SLURM_JOB_ID=4242", "SLURM_STEP_NUM_NODES=1",
                                  "SLURM_NODEID=0", "SLURM_STEP_NUM_TASKS=1", "SLURM_JOB_NODELIST=127.0.0.1", NULL};
    CHECK(run(two, one_per_node) == 0);
    CHECK_STR_CONTAINS(OUT, "WORLD_SIZE=2\n");
}

/* Two jobs of several machines sharing a node both took port 29500: under
 * srun the port comes from the job and step ids when none is given. */
static void test_slurm_job_port(void) {
    const char *two[] = {ACCEL, "launch", "--num_processes", "2", WORKER, "env", NULL};
    const char *env[] = {"SLURM_STEP_ID=1", "SLURM_JOB_ID=4242", "SLURM_STEP_NUM_NODES=2", "SLURM_NODEID=1",
                         "SLURM_STEP_NUM_TASKS=2", "SLURM_JOB_NODELIST=127.0.0.[1-2]", "ACCEL_JOB_SECRET=s", NULL};
    CHECK(run(two, env) == 0);
    char want[64]; /* 15000 + (4 * job + step % 4) % 17000 */
    snprintf(want, sizeof want, "MASTER_PORT=%d\n", 15000 + (4 * 4242 + 1) % 17000);
    CHECK_STR_CONTAINS(OUT, want);
    const char *given[] = {ACCEL, "launch", "--num_processes", "2", "--main_process_port", "29511", WORKER, "env", NULL};
    CHECK(run(given, env) == 0);
    CHECK_STR_CONTAINS(OUT, "MASTER_PORT=29511\n");
}

/* What Accelerate's launchers export besides torchrun's: the dynamo
 * settings (not on the DeepSpeed path) and a TORCHELASTIC_ERROR_FILE per
 * worker, where torch's @record writes the exception for the report. */
static void test_dynamo_and_error_file_env(void) {
    const char *a[] = {ACCEL, "launch", "--num_processes", "2", WORKER, "env", NULL};
    CHECK(run(a, NULL) == 0);
    const char *want[] = {"ACCELERATE_DYNAMO_BACKEND=NO\n", "ACCELERATE_DYNAMO_MODE=default\n",
                          "ACCELERATE_DYNAMO_USE_FULLGRAPH=False\n",
                          "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION=False\n", "TORCHELASTIC_ERROR_FILE=/"};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) CHECK_STR_CONTAINS(OUT, want[i]);
    /* _USE_DYNAMIC only from the config (the sweep's find: its flag's default is None, so
     * Accelerate exports nothing without it; accel exported False) */
    CHECK(!strstr(OUT, "ACCELERATE_DYNAMO_USE_DYNAMIC"));
    CHECK(launch_with_config("dyn.yaml", "distributed_type: MULTI_CPU\nnum_processes: 1\ndynamo_config:\n"
                                         "  dynamo_use_dynamic: false\n") == 0);
    CHECK_STR_CONTAINS(OUT, "ACCELERATE_DYNAMO_USE_DYNAMIC=False\n");
    const char *ds[] = {ACCEL, "launch", "--num_processes", "1", "--use_deepspeed", WORKER, "env", NULL};
    CHECK(run(ds, NULL) == 0);
    CHECK(!strstr(OUT, "ACCELERATE_DYNAMO_BACKEND"));
    CHECK_STR_CONTAINS(OUT, "TORCHELASTIC_ERROR_FILE=/");
}

static void test_error_file_reported(void) {
    char record[PATH_MAX + 32];
    snprintf(record, sizeof record, "%s/error_file_path", TMP);
    const char *prog = script("raise.sh",
                              "#!/bin/sh\n"
                              "[ \"$RANK\" = 1 ] || exit 0\n"
                              "echo \"$TORCHELASTIC_ERROR_FILE\" > %s\n"
                              "printf '{\"message\": {\"message\": \"ValueError: bad thing\\\\nsecond line\", "
                              "\"extraInfo\": {\"py_callstack\": \"Traceback\", \"timestamp\": \"1\"}}}' "
                              "> \"$TORCHELASTIC_ERROR_FILE\"\n"
                              "exit 1\n",
                              record);
    const char *a[] = {ACCEL, "launch", "--num_processes", "2", prog, NULL};
    CHECK(run(a, NULL) == 1);
    CHECK_STR_CONTAINS(ERR, "  error_file: /");
    CHECK_STR_CONTAINS(ERR, "  exception : ValueError: bad thing\n");
    char path[PATH_MAX] = "";
    cli_slurp(record, path, sizeof path);
    path[strcspn(path, "\n")] = 0;
    CHECK_MSG(path[0] && access(path, F_OK) != 0, "'%s' outlived the launcher", path);
    char *slash = strrchr(path, '/');
    if (slash) *slash = 0;
    CHECK_MSG(path[0] && access(path, F_OK) != 0, "its directory '%s' outlived the launcher", path);
}

static void test_worker_hang(void) {
    const char *a[] = {ACCEL, "launch", "--num_processes", "2", WORKER, "hang", NULL};
    const char *env[] = {PIDENV, "ACCEL_DIST_TIMEOUT=1", NULL};
    double t0 = accel_now_seconds();
    CHECK(run(a, env) == 1);
    CHECK(accel_now_seconds() - t0 < 15);
    CHECK_STR_CONTAINS(ERR, "rank      : 0 (local_rank: 0)");
    CHECK_STR_CONTAINS(ERR, "exitcode  : 3");
    CHECK_STR_CONTAINS(ERR, "all_reduce(f32, 4) at test_dist_faults.c:");
    CHECK_STR_CONTAINS(ERR, "timed out after 1 s on rank 0: rank 1 of 2 did not arrive");
    CHECK(no_survivors());
}

static void test_dead_peer(void) {
    const char *a[] = {ACCEL, "launch", "--num_processes", "2", WORKER, "dead", NULL};
    const char *env[] = {PIDENV, NULL};
    CHECK(run(a, env) == 1);
    CHECK_STR_CONTAINS(ERR, "rank 1 (pid ");
    CHECK_STR_CONTAINS(ERR, "died while rank 0 waited in barrier()");
    CHECK(no_survivors());
}

static void test_debug_mismatch(void) {
    const char *a[] = {ACCEL, "launch", "--debug", "--num_processes", "2", WORKER, "mismatch", NULL};
    CHECK(run(a, NULL) == 0);
    CHECK_STR_CONTAINS(ERR, "rank 0: mismatched collectives: rank 0 called all_reduce(f32, 1024), rank 1 "
                            "called all_gather(f32, 3)");
    CHECK_STR_CONTAINS(ERR, "rank 1: mismatched collectives");
}

static void test_restart(void) {
    const char *a[] = {ACCEL, "launch", "--num_processes", "2", "--max_restarts", "1", WORKER, "restart", NULL};
    CHECK(run(a, NULL) == 0);
    CHECK_STR_CONTAINS(ERR, "restarting (restart 1 of 1)");
    CHECK_STR_CONTAINS(OUT, "restart=1 rank=0");
    CHECK_STR_CONTAINS(OUT, "restart=1 rank=1");
    const char *b[] = {ACCEL, "launch", "--num_processes", "2", WORKER, "restart", NULL};
    CHECK(run(b, NULL) == 1);
}

static void test_tee_logs(void) {
    /* parents made as torchrun makes them (only the last level was: a nested
     * --log_dir ran without any logs, a warning per rank) */
    char logdir[PATH_MAX + 32];
    snprintf(logdir, sizeof logdir, "%s/logs/nested dir", TMP);
    const char *a[] = {ACCEL, "launch", "--num_processes", "2", "--tee", "3", "--log_dir", logdir, WORKER, "env", NULL};
    CHECK(run(a, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "[rank0]: RANK=0\n");
    CHECK_STR_CONTAINS(OUT, "[rank1]: RANK=1\n");
    DIR *d = opendir(logdir);
    struct dirent *de;
    char run_dir[PATH_MAX + 300] = "";
    while (d && (de = readdir(d)))
        if (de->d_name[0] != '.') snprintf(run_dir, sizeof run_dir, "%s/%s", logdir, de->d_name);
    if (d) closedir(d);
    char path[PATH_MAX + 400], buf[4096];
    snprintf(path, sizeof path, "%s/rank1.stdout", run_dir);
    cli_slurp(path, buf, sizeof buf);
    CHECK_STR_CONTAINS(buf, "RANK=1\n");
    CHECK_STR_CONTAINS(run_dir, "/logs/nested dir/");
    /* a --log_dir that cannot be made stops the launch before any worker runs */
    const char *file = script("a_file", "not a directory\n");
    const char *bad[] = {ACCEL, "launch", "--num_processes", "2", "--log_dir", file, WORKER, "env", NULL};
    CHECK(run(bad, NULL) == 1);
    CHECK_STR_CONTAINS(ERR, "cannot create the log directory");
    CHECK_STR_CONTAINS(ERR, "a_file/");
    CHECK(strstr(OUT, "RANK=") == NULL);
}

static void test_config_precedence(void) {
    char cfg[PATH_MAX + 16];
    snprintf(cfg, sizeof cfg, "%s/c.yaml", TMP);
    FILE *f = fopen(cfg, "w");
    fprintf(f, "distributed_type: MULTI_CPU\nnum_processes: 3\ndebug: true\nmixed_precision: fp16\n"
               "deepspeed_config:\n  zero_stage: 1\n");
    fclose(f);
    const char *a[] = {ACCEL, "launch", "--config_file", cfg, "--num_processes", "2", WORKER, "env", NULL};
    CHECK(run(a, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "WORLD_SIZE=2\n");            /* flag wins */
    CHECK_STR_CONTAINS(OUT, "ACCEL_DEBUG_MODE=1\n");      /* config fills */
    CHECK_STR_CONTAINS(OUT, "ACCEL_MIXED_PRECISION=fp16\n");
    CHECK_STR_CONTAINS(OUT, "ACCEL_ZERO_STAGE=1\n");
    CHECK(!strstr(OUT, "RANK=2\n"));
}

/* Unquoted numbers in a config file are values too (review: they were dropped,
 * so `gpu_ids: 0` set no CUDA_VISIBLE_DEVICES, `gradient_clipping: 1.0` did not
 * clip and `fsdp_sharding_strategy: 2` became FULL_SHARD), integers in YAML
 * 1.1's notations. */
static void test_config_numbers(void) {
    char cfg[PATH_MAX + 16];
    snprintf(cfg, sizeof cfg, "%s/n.yaml", TMP);
    FILE *f = fopen(cfg, "w");
    fprintf(f, "distributed_type: DEEPSPEED\nnum_processes: 2\ngpu_ids: 0\n"
               "deepspeed_config:\n  zero_stage: 2\n  gradient_clipping: 1.0\n  gradient_accumulation_steps: 3\n");
    fclose(f);
    const char *a[] = {ACCEL, "launch", "--config_file", cfg, WORKER, "env", NULL};
    CHECK(run(a, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "CUDA_VISIBLE_DEVICES=0\n");
    CHECK_STR_CONTAINS(OUT, "ACCEL_GRADIENT_CLIPPING=1.0\n");
    CHECK_STR_CONTAINS(OUT, "ACCEL_GRADIENT_ACCUMULATION_STEPS=3\n");
    CHECK_STR_CONTAINS(OUT, "ACCEL_ZERO_STAGE=2\n");
    f = fopen(cfg, "w");
    fprintf(f, "distributed_type: FSDP\nnum_processes: 2\nfsdp_config:\n  fsdp_sharding_strategy: 2\n");
    fclose(f);
    CHECK(run(a, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "ACCEL_FSDP_SHARDING_STRATEGY=2\n");
    /* the norm as --gradient_clipping's: finite, the key named */
    f = fopen(cfg, "w");
    fprintf(f, "distributed_type: DEEPSPEED\nnum_processes: 1\ndeepspeed_config:\n  gradient_clipping: .inf\n");
    fclose(f);
    CHECK(run(a, NULL) == 2);
    CHECK_STR_CONTAINS(ERR, "config key deepspeed_config.gradient_clipping: invalid value 'inf' (expected a finite");
    /* integers as PyYAML (YAML 1.1) reads them: a 0-led octal, 0b, 0x, '_' (read as decimal, 010 was
     * 10 where Accelerate takes 8; 0b10 and 0x2 were refused) */
    f = fopen(cfg, "w");
    fprintf(f, "distributed_type: DEEPSPEED\nnum_processes: 0b10\n"
               "deepspeed_config:\n  zero_stage: 0x2\n  gradient_accumulation_steps: 0_10\n");
    fclose(f);
    CHECK(run(a, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "WORLD_SIZE=2\n");
    CHECK_STR_CONTAINS(OUT, "ACCEL_ZERO_STAGE=2\n");
    CHECK_STR_CONTAINS(OUT, "ACCEL_GRADIENT_ACCUMULATION_STEPS=8\n");
}

/* Scalars as PyYAML (yaml.safe_load) reads them, plain and tagged !!int /
 * !!float: each row of data/yaml_scalars.tsv (tools/gen_yaml_scalars.py) as
 * a deepspeed_config value, read back by `accel env` as its Python repr; an
 * int beyond 64 bits and what safe_load refuses are refused naming the key.
 * (strtod made 1e3 and 1.0e3 floats where PyYAML has strings, and
 * 99999999999999999999 was a string where PyYAML has an int; `!!int 0o17`,
 * `!!int 1:75` and `!!float 1:30` were refused where PyYAML builds 15, 135,
 * 90.0, and `!!float nan(1)` was a NaN where PyYAML refuses it.) */
static void test_yaml_scalars(void) {
    FILE *t = fopen("data/yaml_scalars.tsv", "r");
    CHECK(t != NULL);
    if (!t) return;
    char line[512], cfg[PATH_MAX + 16], want[600];
    snprintf(cfg, sizeof cfg, "%s/s.yaml", TMP);
    const char *a[] = {ACCEL, "env", "--config_file", cfg, NULL};
    int rows = 0;
    while (fgets(line, sizeof line, t)) {
        char *tab = strchr(line, '\t'), *nl = strchr(line, '\n');
        CHECK(tab && nl);
        if (!tab || !nl) break;
        *tab = 0, *nl = 0;
        FILE *f = fopen(cfg, "w");
        fprintf(f, "distributed_type: 'NO'\nnum_processes: 1\ndeepspeed_config:\n  x: %s\n", line);
        fclose(f);
        const char *text = strncmp(line, "!!", 2) ? line : strchr(line, ' ') + 1; /* a tagged one's text */
        CHECK(run(a, NULL) == 0);
        if (!strcmp(tab + 1, "!range"))
            snprintf(want, sizeof want, "`x`: %s is an integer out of range (beyond 64 bits)", text);
        else if (!strcmp(tab + 1, "!error"))
            snprintf(want, sizeof want, "`x`: '%s' is not %s", text, line[2] == 'i' ? "an integer" : "a number");
        else
            snprintf(want, sizeof want, "- deepspeed_config: {'x': %s}\n", tab + 1);
        CHECK_MSG(strstr(OUT, want) != NULL, "scalar %s: want \"%s\" in accel env's output", line, want);
        rows++;
    }
    fclose(t);
    CHECK(rows > 100);
}

/* Issue #10: the fsdp_config / deepspeed_config settings reach a launched
 * PyTorch script as `accelerate launch` exports them (only the sharding
 * strategy did, as ACCEL_FSDP_SHARDING_STRATEGY; the rest was dropped). */
static void test_accelerate_fsdp_env(void) {
    const char *cfg = write_config("fsdp.yaml", "distributed_type: FSDP\nnum_processes: 1\nfsdp_config:\n"
                                   "  fsdp_sharding_strategy: SHARD_GRAD_OP\n  fsdp_offload_params: true\n"
                                   "  min_num_params: 2000\n  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
                                   "  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer\n  fsdp_version: 2\n"
                                   "  fsdp_use_orig_params: false\n  fsdp_typo: 1\n");
    const char *a[] = {ACCEL, "launch", "--config_file", cfg, "--fsdp_forward_prefetch", "True", "/usr/bin/env", NULL};
    CHECK(run(a, NULL) == 0);
    const char *want[] = {"ACCELERATE_USE_FSDP=true\n", "FSDP_VERSION=2\n", "FSDP_SHARDING_STRATEGY=SHARD_GRAD_OP\n",
                          "FSDP_OFFLOAD_PARAMS=true\n", "FSDP_MIN_NUM_PARAMS=2000\n",
                          "FSDP_AUTO_WRAP_POLICY=TRANSFORMER_BASED_WRAP\n",
                          "FSDP_TRANSFORMER_CLS_TO_WRAP=LlamaDecoderLayer\n", "FSDP_USE_ORIG_PARAMS=false\n",
                          "FSDP_FORWARD_PREFETCH=true\n", "FSDP_RESHARD_AFTER_FORWARD=true\n",
                          "FSDP_CPU_RAM_EFFICIENT_LOADING=true\n", "FSDP_SYNC_MODULE_STATES=true\n",
                          "FSDP_ACTIVATION_CHECKPOINTING=false\n", "FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD=false\n",
                          "ACCEL_FSDP_SHARDING_STRATEGY=SHARD_GRAD_OP\n"};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) CHECK_STR_CONTAINS(OUT, want[i]);
    CHECK(!strstr(OUT, "FSDP_STATE_DICT_TYPE=")); /* no default: only when set */
    CHECK_STR_CONTAINS(ERR, "fsdp_config.fsdp_typo is not an FSDP setting; ignored");
    const char *bad[] = {ACCEL, "launch", "--use_fsdp", "--fsdp_sync_module_states", "false", "/usr/bin/env", NULL};
    CHECK(run(bad, NULL) == 2);
    CHECK_STR_CONTAINS(ERR, "When using `--fsdp_cpu_ram_efficient_loading` set `--fsdp_sync_module_states` to `True`");
    /* Accelerate's launcher checks Python's truth of the config's values: 'no' is true, 0 false (the sweep's find:
     * it refused this, accel ran it) */
    CHECK(launch_with_config("fsdp_truthy.yaml", "distributed_type: FSDP\nnum_processes: 1\nfsdp_config:\n"
                                                 "  cpu_ram_efficient_loading: 'no'\n  sync_module_states: 0\n") == 2);
    CHECK_STR_CONTAINS(ERR, "When using `--fsdp_cpu_ram_efficient_loading` set `--fsdp_sync_module_states` to `True`");
    CHECK(launch_with_config("fsdp_falsy.yaml", "distributed_type: FSDP\nnum_processes: 1\nfsdp_config:\n"
                                                "  cpu_ram_efficient_loading: 0\n  sync_module_states: 0\n") == 0);
    CHECK_STR_CONTAINS(OUT, "FSDP_CPU_RAM_EFFICIENT_LOADING=0\n");
    const char *none[] = {ACCEL, "launch", "--num_processes", "1", "/usr/bin/env", NULL};
    CHECK(run(none, NULL) == 0);
    CHECK(!strstr(OUT, "FSDP_") && !strstr(OUT, "ACCELERATE_USE_DEEPSPEED"));
    /* the section off: --fsdp_sharding_strategy alone turns on accel's ZeRO, but the other settings
     * beside it are not exported (Accelerate's FSDP section); each that asks for something is named
     * (the offload was dropped without a word), its default or -q no word, a bad value refused */
    const char *off[] = {ACCEL, "launch", "--fsdp_sharding_strategy", "FULL_SHARD", "--fsdp_offload_params", "true",
                         "--fsdp_min_num_params", "100000000", "/usr/bin/env", NULL};
    CHECK(run(off, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "ACCEL_FSDP_SHARDING_STRATEGY=FULL_SHARD\n");
    CHECK(!strstr(OUT, "FSDP_OFFLOAD_PARAMS"));
    CHECK_STR_CONTAINS(ERR, "accel launch: warning: argument --fsdp_offload_params (true) is ignored: the fsdp_config "
                            "section is off");
    CHECK(!strstr(ERR, "fsdp_sharding_strategy (") && !strstr(ERR, "fsdp_min_num_params ("));
    const char *from_cfg = write_config("ddp_fsdp.yaml", "distributed_type: MULTI_GPU\nnum_processes: 1\nfsdp_config:\n"
                                        "  fsdp_activation_checkpointing: true\n");
    const char *keyed[] = {ACCEL, "launch", "--config_file", from_cfg, "/usr/bin/env", NULL};
    CHECK(run(keyed, NULL) == 0);
    CHECK_STR_CONTAINS(ERR, "warning: config key fsdp_config.fsdp_activation_checkpointing (true) is ignored");
    /* a key without its fsdp_ (Accelerate adds it back) is named as written */
    CHECK(launch_with_config("ddp_fsdp_short.yaml", "distributed_type: MULTI_GPU\nnum_processes: 1\n"
                                                    "fsdp_config:\n  offload_params: true\n") == 0);
    CHECK_STR_CONTAINS(ERR, "warning: config key fsdp_config.offload_params (true) is ignored");
    const char *quiet[] = {ACCEL, "launch", "-q", "--fsdp_offload_params", "true", "/usr/bin/env", NULL};
    CHECK(run(quiet, NULL) == 0 && !strstr(ERR, "is ignored"));
    const char *bad_off[] = {ACCEL, "launch", "--fsdp_offload_params", "maybe", "/usr/bin/env", NULL};
    CHECK(run(bad_off, NULL) == 2);
    CHECK_STR_CONTAINS(ERR, "fsdp_offload_params");
}

/* A boolean setting that str_to_bool refuses is refused at launch, by name
 * (it was exported as given, for the launched program to misread or fail
 * on); every str_to_bool spelling passes as written. */
static void test_fsdp_bool_settings(void) {
    const char *flag[] = {ACCEL, "launch", "--use_fsdp", "--fsdp_use_orig_params", "maybe", "/usr/bin/env", NULL};
    CHECK(run(flag, NULL) == 2);
    CHECK_STR_CONTAINS(ERR, "argument --fsdp_use_orig_params: invalid str_to_bool value: 'maybe'");
    const char *cfg = write_config("fsdp_bad_bool.yaml", "distributed_type: FSDP\nnum_processes: 1\nfsdp_config:\n"
                                   "  fsdp_forward_prefetch: perhaps\n");
    const char *conf[] = {ACCEL, "launch", "--config_file", cfg, "/usr/bin/env", NULL};
    CHECK(run(conf, NULL) == 2);
    CHECK_STR_CONTAINS(ERR, "config key fsdp_forward_prefetch: 'perhaps' is not a boolean");
    /* the key as the file spells it, without its fsdp_ */
    CHECK(launch_with_config("fsdp_bad_short.yaml", "distributed_type: FSDP\nnum_processes: 1\n"
                                                    "fsdp_config:\n  offload_params: maybe\n") == 2);
    CHECK_STR_CONTAINS(ERR, "config key offload_params: 'maybe' is not a boolean");
    /* and it reaches the library as the long key does (only FSDP_OFFLOAD_PARAMS was exported) */
    CHECK(launch_with_config("fsdp_short.yaml", "distributed_type: FSDP\nnum_processes: 1\nfsdp_config:\n"
                                                "  offload_params: true\n  sharding_strategy: SHARD_GRAD_OP\n") == 0);
    CHECK_STR_CONTAINS(OUT, "ACCEL_FSDP_OFFLOAD_PARAMS=true\n");
    CHECK_STR_CONTAINS(OUT, "ACCEL_FSDP_SHARDING_STRATEGY=SHARD_GRAD_OP\n");
    const char *ds[] = {ACCEL, "launch", "--use_deepspeed", "--zero3_init_flag", "sure", "/usr/bin/env", NULL};
    CHECK(run(ds, NULL) == 2);
    CHECK_STR_CONTAINS(ERR, "argument --zero3_init_flag: invalid str_to_bool value: 'sure'");
    const char *ok[] = {ACCEL, "launch", "--use_fsdp", "--fsdp_use_orig_params", "Off", "--fsdp_sync_module_states",
                        "y", "/usr/bin/env", NULL};
    CHECK(run(ok, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "FSDP_USE_ORIG_PARAMS=off\n");
    CHECK_STR_CONTAINS(OUT, "FSDP_SYNC_MODULE_STATES=y\n");
    const char *off[] = {ACCEL, "launch", "--use_fsdp", "--fsdp_sync_module_states", "OFF", "/usr/bin/env", NULL};
    CHECK(run(off, NULL) == 2); /* cpu_ram_efficient_loading's default true needs it */
    CHECK_STR_CONTAINS(ERR, "When using `--fsdp_cpu_ram_efficient_loading` set `--fsdp_sync_module_states` to `True`");
}

static void test_accelerate_deepspeed_env(void) {
    const char *cfg = write_config("ds.yaml", "distributed_type: DEEPSPEED\nnum_processes: 1\nmixed_precision: fp16\n"
                                   "deepspeed_config:\n  zero_stage: 3\n  offload_optimizer_device: CPU\n"
                                   "  zero3_init_flag: true\n  gradient_accumulation_steps: 2\n");
    const char *a[] = {ACCEL, "launch", "--config_file", cfg, "--gradient_clipping", "1", "/usr/bin/env", NULL};
    const char *env[] = {"PYTHONPATH=/opt/lib::/opt/more:", NULL};
    CHECK(run(a, env) == 0);
    char cwd[PATH_MAX], pythonpath[PATH_MAX + 32];
    CHECK(getcwd(cwd, sizeof cwd) != NULL);
    snprintf(pythonpath, sizeof pythonpath, "PYTHONPATH=/opt/lib:/opt/more:%s\n", cwd);
    const char *want[] = {"ACCELERATE_USE_DEEPSPEED=true\n", "ACCELERATE_DEEPSPEED_ZERO_STAGE=3\n",
                          "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE=cpu\n", "ACCELERATE_DEEPSPEED_ZERO3_INIT=true\n",
                          "ACCELERATE_GRADIENT_ACCUMULATION_STEPS=2\n", "ACCELERATE_GRADIENT_CLIPPING=1.0\n",
                          "ACCELERATE_CONFIG_DS_FIELDS=zero_stage,offload_optimizer_device,zero3_init_flag,"
                          "gradient_accumulation_steps,mixed_precision\n",
                          "ACCELERATE_MIXED_PRECISION=fp16\n", "ACCEL_ZERO_STAGE=3\n", pythonpath};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) CHECK_STR_CONTAINS(OUT, want[i]);
    CHECK(!strstr(OUT, "ACCELERATE_DEEPSPEED_CONFIG_FILE=")); /* no JSON given */
    CHECK(!strstr(OUT, "FSDP_"));
    const char *bad[] = {ACCEL, "launch", "--use_deepspeed", "--zero_stage", "two", "/usr/bin/env", NULL};
    CHECK(run(bad, NULL) == 2);
    CHECK_STR_CONTAINS(ERR, "argument --zero_stage: invalid int value: 'two'");
}

static bool machine_has_gpu(void) {
    DIR *d = opendir("/proc/driver/nvidia/gpus");
    if (d) closedir(d);
    return d || access("/dev/nvidia0", F_OK) == 0 || access("/dev/kfd", F_OK) == 0;
}

/* Issue #9: without --cpu, ACCELERATE_USE_CPU was False on a machine with no
 * GPU (a launched Accelerate program then trained alone on every rank), and a
 * caller's ACCELERATE_USE_CPU=True was overwritten. */
static void test_accelerate_use_cpu(void) {
    const char *a[] = {ACCEL, "launch", "--num_processes", "2", "/usr/bin/env", NULL};
    const char *env[] = {"ACCELERATE_USE_CPU=true", NULL};
    CHECK(run(a, env) == 0);
    CHECK_STR_CONTAINS(OUT, "ACCELERATE_USE_CPU=True\n");
    CHECK_STR_CONTAINS(OUT, "ACCEL_USE_CPU=1\n");
    CHECK(run(a, NULL) == 0);
    if (!machine_has_gpu()) CHECK_STR_CONTAINS(OUT, "ACCELERATE_USE_CPU=True\n");
    /* read as str_to_bool: any of its spellings, and garbage refused by name (it read as False) */
    const char *on[] = {"ACCELERATE_USE_CPU=ON", NULL}, *bad[] = {"ACCEL_USE_CPU=maybe", NULL};
    CHECK(run(a, on) == 0);
    CHECK_STR_CONTAINS(OUT, "ACCELERATE_USE_CPU=True\n");
    CHECK(run(a, bad) == 2);
    CHECK_STR_CONTAINS(ERR, "accel launch: error: the environment: ACCEL_USE_CPU=maybe is not a boolean");
}

/* A caller's OMP_NUM_THREADS set but empty went to every worker as it was:
 * libgomp ignores it (a warning) and ran each worker as wide as the machine,
 * and accel's own cap took it for the user's choice. Refused by name unless
 * --num_cpu_threads_per_process replaces it. */
static void test_empty_omp_num_threads(void) {
    const char *a[] = {ACCEL, "launch", "--num_processes", "2", "/usr/bin/env", NULL};
    const char *empty[] = {"OMP_NUM_THREADS=", NULL};
    CHECK(run(a, empty) == 2);
    CHECK_STR_CONTAINS(ERR, "accel launch: error: the environment: OMP_NUM_THREADS is set but empty");
    CHECK(!strstr(OUT, "RANK="));
    const char *flag[] = {ACCEL, "launch", "--num_processes", "2", "--num_cpu_threads_per_process", "3",
                          "/usr/bin/env", NULL};
    CHECK(run(flag, empty) == 0);
    CHECK_STR_CONTAINS(OUT, "OMP_NUM_THREADS=3\n");
}

/* An empty main process address reached the workers as MASTER_ADDR=, which
 * accel_dist_init refuses: the flag is refused by name at launch, and a
 * config's empty value counts as none (127.0.0.1 on one machine). */
static void test_empty_main_process_ip(void) {
    const char *flag[] = {ACCEL, "launch", "--num_processes", "2", "--main_process_ip", "", "/usr/bin/env", NULL};
    CHECK(run(flag, NULL) == 2);
    CHECK_STR_CONTAINS(ERR, "argument --main_process_ip: expected an address, got ''");
    CHECK(!strstr(OUT, "RANK="));
    const char *cfg = write_config("emptyip.yaml", "distributed_type: MULTI_CPU\nnum_processes: 2\nmain_process_ip: ''\n");
    const char *a[] = {ACCEL, "launch", "--config_file", cfg, "/usr/bin/env", NULL};
    CHECK(run(a, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "MASTER_ADDR=127.0.0.1\n");
}

/* Issue #12: mixed_precision in any case, as Accelerate lowercases it. */
static void test_mixed_precision_case(void) {
    const char *cfg = write_config("bf16.yaml", "distributed_type: MULTI_CPU\nnum_processes: 1\nmixed_precision: BF16\n");
    const char *a[] = {ACCEL, "launch", "--config_file", cfg, "/usr/bin/env", NULL};
    CHECK(run(a, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "ACCELERATE_MIXED_PRECISION=bf16\n");
    /* the flag as argparse's choices take it (the sweep's find: accel took `FP16`, Accelerate refuses it) */
    const char *b[] = {ACCEL, "launch", "--mixed_precision", "Fp16", "/usr/bin/env", NULL};
    CHECK(run(b, NULL) == 2);
    CHECK_STR_CONTAINS(ERR, "argument --mixed_precision/--mixed-precision: invalid choice: 'Fp16' (choose from 'no', "
                            "'fp16', 'bf16', 'fp8')");
    const char *c[] = {ACCEL, "launch", "--config_file", cfg, "--mixed_precision", "fp16", "/usr/bin/env", NULL};
    CHECK(run(c, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "ACCEL_MIXED_PRECISION=fp16\n");
}

/* Issue #14 (fp8): the fp8 flags and fp8_config reach the workers as
 * `accelerate launch` exports them (setup_fp8_env: ACCELERATE_FP8_*, flag >
 * fp8_config > argparse default), only under mixed_precision fp8; they were
 * dropped. The keys `accelerate config` writes (amax_history_length) count too. */
static void test_fp8_env(void) {
    const char *cfg = write_config("fp8.yaml", "distributed_type: MULTI_CPU\nnum_processes: 1\nmixed_precision: fp8\n"
                                   "fp8_config:\n  backend: TE\n  margin: 2\n  amax_history_length: 16\n"
                                   "  fp8_format: E4M3\n  override_linear_precision: [false, false, true]\n");
    const char *a[] = {ACCEL, "launch", "--config_file", cfg, "--fp8_margin", "1", "--fp8_interval", "3",
                       "--fp8_use_autocast_during_eval", WORKER, "env", NULL};
    CHECK(run(a, NULL) == 0);
    const char *want[] = {"ACCELERATE_FP8_BACKEND=TE\n", "ACCELERATE_FP8_MARGIN=1\n", "ACCELERATE_FP8_INTERVAL=3\n",
                          "ACCELERATE_FP8_USE_AUTOCAST_DURING_EVAL=True\n", "ACCELERATE_FP8_FORMAT=E4M3\n",
                          "ACCELERATE_FP8_AMAX_HISTORY_LEN=16\n", "ACCELERATE_FP8_AMAX_COMPUTE_ALGO=most_recent\n",
                          "ACCELERATE_FP8_OVERRIDE_FPROP=False\n", "ACCELERATE_FP8_OVERRIDE_DGRAD=False\n",
                          "ACCELERATE_FP8_OVERRIDE_WGRAD=True\n",
                          "ACCELERATE_FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER=1\n", "ACCELERATE_FP8_PAD_INNER_DIM=1\n",
                          "ACCEL_FP8_MARGIN=1\n", "ACCEL_FP8_OVERRIDE_WGRAD=True\n"};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) CHECK_STR_CONTAINS(OUT, want[i]);
    CHECK(!strstr(OUT, "FP8_OPT_LEVEL")); /* MS-AMP's, gone from Accelerate 1.16 (the sweep's find) */
    const char *b[] = {ACCEL, "launch", "--mixed_precision", "fp8", "--fp8_override_linear_precision", "yes,0,OFF",
                       WORKER, "env", NULL};
    CHECK(run(b, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "ACCELERATE_FP8_OVERRIDE_FPROP=1\nACCELERATE_FP8_OVERRIDE_DGRAD=0\n"
                            "ACCELERATE_FP8_OVERRIDE_WGRAD=0\n");
    CHECK_STR_CONTAINS(OUT, "ACCELERATE_FP8_USE_AUTOCAST_DURING_EVAL=False\nACCELERATE_FP8_MARGIN=0\n");
    CHECK(!strstr(OUT, "ACCELERATE_FP8_BACKEND=")); /* no default: only when set */
    const char *c[] = {ACCEL, "launch", "--mixed_precision", "bf16", "--fp8_margin", "1", WORKER, "env", NULL};
    CHECK(run(c, NULL) == 0);
    CHECK(!strstr(OUT, "FP8_")); /* as Accelerate: only under fp8 */
}

/* Values Accelerate's argparse refuses, with its wording, fp8 or not. */
static void test_fp8_flag_errors(void) {
    static const char *const BAD[][3] = {
        {"--fp8_format", "e4m3", "argument --fp8_format: invalid choice: 'e4m3' (choose from 'HYBRID', 'E4M3', 'E5M2')"},
        {"--fp8_backend", "TE", "argument --fp8_backend: invalid choice: 'TE' (choose from 'ao', 'te')"},
        {"--fp8_backend", "msamp", "argument --fp8_backend: invalid choice: 'msamp' (choose from 'ao', 'te')"},
        {"--fp8_amax_compute_algo", "MAX", "invalid choice: 'MAX' (choose from 'max', 'most_recent')"},
        {"--fp8_margin", "x", "argument --fp8_margin: invalid int value: 'x'"},
        {"--fp8_amax_history_len", "", "argument --fp8_amax_history_len: invalid int value: ''"},
        {"--fp8_pad_inner_dim", "maybe", "argument --fp8_pad_inner_dim: invalid str_to_bool value: 'maybe'"},
        {"--fp8_override_linear_precision", "true,maybe,false",
         "argument --fp8_override_linear_precision: invalid <lambda> value: 'true,maybe,false'"},
        {"--fp8_override_linear_precision", "true,false",
         "argument --fp8_override_linear_precision: expected three comma-separated booleans (fprop,dgrad,wgrad)"},
        {"--fp8_opt_level", "O1", "unrecognized arguments: --fp8_opt_level"},
    };
    for (size_t i = 0; i < sizeof BAD / sizeof *BAD; i++) {
        const char *a[] = {ACCEL, "launch", "--mixed_precision", i % 2 ? "no" : "fp8", BAD[i][0], BAD[i][1],
                           "/usr/bin/env", NULL};
        CHECK(run(a, NULL) == 2);
        CHECK_STR_CONTAINS(ERR, BAD[i][2]);
    }
}

/* The recipe reaches the workers' accel_accelerator_new: values argparse
 * accepts but the library refuses come back named, from the variable the
 * launcher wrote (on a machine without fp8 GEMMs a valid recipe then meets
 * the device refusal, so the bad ones are what this checks). */
static void test_fp8_reaches_accelerator(void) {
    const char *cfg = write_config("fp8_ao.yaml", "distributed_type: MULTI_CPU\nnum_processes: 1\n"
                                   "mixed_precision: fp8\nfp8_config:\n  backend: AO\n");
    const char *a[] = {ACCEL, "launch", "--config_file", cfg, WORKER, "accelerator", NULL};
    CHECK(run(a, NULL) != 0);
    CHECK_STR_CONTAINS(OUT, "accelerator: accel_accelerator_new: ACCEL_FP8_BACKEND=AO is not supported");
    const char *b[] = {ACCEL, "launch", "--mixed_precision", "fp8", "--fp8_margin", "-3", WORKER, "accelerator", NULL};
    CHECK(run(b, NULL) != 0);
    CHECK_STR_CONTAINS(OUT, "accelerator: accel_accelerator_new: ACCEL_FP8_MARGIN=-3 must be an integer in [0, ");
    /* an override is run (that GEMM in bf16): the recipe passes, only a machine without fp8 refuses */
    const char *c[] = {ACCEL, "launch", "--mixed_precision", "fp8", "--fp8_override_linear_precision", "0,0,1",
                       WORKER, "accelerator", NULL};
    if (run(c, NULL) != 0)
        CHECK_STR_CONTAINS(OUT, "accelerator: accel_accelerator_new: fp8 mixed precision is not supported on");
    const char *d[] = {ACCEL, "launch", "--mixed_precision", "fp8", "--fp8_format", "E5M2", WORKER, "accelerator",
                       NULL};
    CHECK(run(d, NULL) != 0);
    CHECK_STR_CONTAINS(OUT, "ACCEL_FP8_FORMAT=E5M2: pure E5M2 training is not supported");
}

/* What tools/sweep_launch.py found `accelerate launch` exporting or doing
 * that accel did not: each pinned here (docs/cli.md). */
static void test_launch_sweep_finds(void) {
    /* torchrun's TORCH_NCCL_ASYNC_ERROR_HANDLING=1 unless the caller set it; Accelerate's simple
     * launcher's KMP_AFFINITY / KMP_BLOCKTIME under CPU training */
    const char *a[] = {ACCEL, "launch", "--cpu", "--num_processes", "1", "/usr/bin/env", NULL};
    CHECK(run(a, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "TORCH_NCCL_ASYNC_ERROR_HANDLING=1\n");
    CHECK_STR_CONTAINS(OUT, "KMP_AFFINITY=granularity=fine,compact,1,0\n");
    CHECK_STR_CONTAINS(OUT, "KMP_BLOCKTIME=1\n");
    const char *mine[] = {"TORCH_NCCL_ASYNC_ERROR_HANDLING=3", NULL};
    CHECK(run(a, mine) == 0);
    CHECK_STR_CONTAINS(OUT, "TORCH_NCCL_ASYNC_ERROR_HANDLING=3\n");
    CHECK(!strstr(OUT, "TORCH_NCCL_ASYNC_ERROR_HANDLING=1"));
    /* Accelerate 1.16's Megatron-LM switches accel has no flag for: False, as its defaults */
    const char *m[] = {ACCEL, "launch", "--num_processes", "1", "--use_megatron_lm", "/usr/bin/env", NULL};
    CHECK(run(m, NULL) == 0);
    const char *off[] = {"MEGATRON_LM_USE_CUSTOM_FSDP=False\n", "MEGATRON_LM_NO_LOAD_OPTIM=False\n",
                         "MEGATRON_LM_EOD_MASK_LOSS=False\n", "MEGATRON_LM_NO_SAVE_OPTIM=False\n",
                         "MEGATRON_LM_OPTIMIZER_CPU_OFFLOAD=False\n",
                         "MEGATRON_LM_USE_PRECISION_AWARE_OPTIMIZER=False\n",
                         "MEGATRON_LM_OVERLAP_CPU_OPTIMIZER_D2H_H2D=False\n"};
    for (size_t i = 0; i < sizeof off / sizeof *off; i++) CHECK_STR_CONTAINS(OUT, off[i]);
    const char *no_m[] = {ACCEL, "launch", "--num_processes", "1", "/usr/bin/env", NULL};
    CHECK(run(no_m, NULL) == 0);
    CHECK(!strstr(OUT, "MEGATRON_LM_"));
    /* --cpu runs Accelerate's simple launcher, which exports no Megatron-LM or parallelism config,
     * whatever the flags or the config say: accel's sections are off too, with a word */
    const char *mcfg = write_config("cpu_megatron.yaml", "distributed_type: MEGATRON_LM\nnum_processes: 1\n"
                                    "megatron_lm_config:\n  megatron_lm_pp_degree: 1\n");
    const char *cpu_m[] = {ACCEL, "launch", "--config_file", mcfg, "--cpu", "/usr/bin/env", NULL};
    CHECK(run(cpu_m, NULL) == 0);
    CHECK(!strstr(OUT, "MEGATRON_LM"));
    CHECK_STR_CONTAINS(ERR, "warning: --cpu: Megatron-LM is off, as under Accelerate's launcher");
    const char *pcfg = write_config("cpu_pc.yaml", "distributed_type: MULTI_CPU\nnum_processes: 2\n"
                                    "parallelism_config:\n  parallelism_config_tp_size: 2\n");
    const char *cpu_pc[] = {ACCEL, "launch", "-q", "--config_file", pcfg, "--cpu", "/usr/bin/env", NULL};
    CHECK(run(cpu_pc, NULL) == 0);
    CHECK(!strstr(OUT, "PARALLELISM_CONFIG") && !strstr(ERR, "warning"));
    /* argparse drops a "--" right after the script: the program gets `x`, not `-- x` */
    const char *dash[] = {ACCEL, "launch", "-q", "--num_processes", "1", "/bin/echo", "--", "--x", "--", NULL};
    CHECK(run(dash, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "--x --\n");
    CHECK(!strstr(OUT, "-- --x"));
    /* Accelerate's dynamo flags, exported as it does: the flag over dynamo_config */
    const char *cfg = write_config("dyn_flags.yaml", "distributed_type: MULTI_CPU\nnum_processes: 1\ndynamo_config:\n"
                                   "  dynamo_mode: reduce-overhead\n  dynamo_use_fullgraph: true\n");
    const char *flags[] = {ACCEL, "launch", "--config_file", cfg, "--dynamo_mode", "max-autotune",
                           "--dynamo-use-dynamic", "/usr/bin/env", NULL};
    CHECK(run(flags, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "ACCELERATE_DYNAMO_MODE=max-autotune\n");
    CHECK_STR_CONTAINS(OUT, "ACCELERATE_DYNAMO_USE_DYNAMIC=True\n");
    CHECK_STR_CONTAINS(OUT, "ACCELERATE_DYNAMO_USE_FULLGRAPH=True\n");
    CHECK_STR_CONTAINS(OUT, "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION=False\n");
    const char *regional[] = {ACCEL, "launch", "--dynamo_use_regional_compilation", "/usr/bin/env", NULL};
    CHECK(run(regional, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION=True\n");
    const char *bad_mode[] = {ACCEL, "launch", "--dynamo_mode", "fast", "/usr/bin/env", NULL};
    CHECK(run(bad_mode, NULL) == 2);
    CHECK_STR_CONTAINS(ERR, "argument --dynamo_mode/--dynamo-mode: invalid choice: 'fast'");
    /* multi-GPU on one machine with one --gpu_ids: Accelerate's refusal (accel ran it) */
    const char *gpus_cfg = write_config("one_gpu.yaml", "distributed_type: MULTI_GPU\nnum_processes: 2\ngpu_ids: '0'\n");
    const char *one_gpu[] = {ACCEL, "launch", "--config_file", gpus_cfg, "/usr/bin/env", NULL};
    CHECK(run(one_gpu, NULL) == 2);
    CHECK_STR_CONTAINS(ERR, "Less than two GPU ids were configured and tried to run on multiple GPUs");
    const char *two_gpus[] = {ACCEL, "launch", "--config_file", gpus_cfg, "--gpu_ids", "0,1", "/usr/bin/env", NULL};
    CHECK(run(two_gpus, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "CUDA_VISIBLE_DEVICES=0,1\n");
    const char *flag_gpu[] = {ACCEL, "launch", "--multi_gpu", "--num_processes", "2", "--gpu_ids", "1", "/usr/bin/env",
                              NULL};
    CHECK(run(flag_gpu, NULL) == 2);
    CHECK_STR_CONTAINS(ERR, "Less than two GPU ids");
    /* --dynamo_backend takes exactly `no`, as Accelerate's lower-case choices */
    const char *dyn[] = {ACCEL, "launch", "--dynamo_backend", "NO", "/usr/bin/env", NULL};
    CHECK(run(dyn, NULL) == 2);
    CHECK_STR_CONTAINS(ERR, "--dynamo_backend NO is not supported");
}

/* Issue #11: a .py PROGRAM runs with --python, else $PYTHON, else the
 * virtualenv's interpreter, else python3 on PATH; a missing module is
 * reported with the interpreter that could not import it. Fake interpreters
 * (shell scripts) stand in for Python. */
static void test_python_interpreter(void) {
    const char *fake = script("fakepy", "#!/bin/sh\necho \"interpreter=$0 args=$*\"\n");
    char venv[PATH_MAX + 16], venv_env[PATH_MAX + 32];
    snprintf(venv, sizeof venv, "%s/venv", TMP);
    mkdir(venv, 0755);
    strcat(venv, "/bin");
    mkdir(venv, 0755);
    script("venv/bin/python", "#!/bin/sh\necho \"venv-python args=$*\"\n");
    snprintf(venv_env, sizeof venv_env, "VIRTUAL_ENV=%s/venv", TMP);
    char python_env[PATH_MAX + 80];
    snprintf(python_env, sizeof python_env, "PYTHON=%s", fake);
    const char *flag[] = {ACCEL, "launch", "--python", fake, "train.py", "--lr", "1", NULL};
    CHECK(run(flag, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "args=train.py --lr 1\n");
    CHECK_STR_CONTAINS(OUT, "interpreter=");
    const char *mod[] = {ACCEL, "launch", "-m", "pkg.train", NULL};
    const char *penv[] = {python_env, venv_env, NULL};
    CHECK(run(mod, penv) == 0); /* $PYTHON before the virtualenv */
    CHECK_STR_CONTAINS(OUT, "args=-m pkg.train\n");
    const char *venv_only[] = {venv_env, NULL};
    CHECK(run(mod, venv_only) == 0);
    CHECK_STR_CONTAINS(OUT, "venv-python args=-m pkg.train\n");
    const char *noimport = script("noimport", "#!/bin/sh\necho \"Traceback (most recent call last):\" >&2\n"
                                  "echo \"ModuleNotFoundError: No module named 'torch'\" >&2\nexit 1\n");
    const char *fail[] = {ACCEL, "launch", "--python", noimport, "train.py", NULL};
    CHECK(run(fail, NULL) == 1);
    char want[PATH_MAX + 128];
    snprintf(want, sizeof want, "  python    : %s (chosen by --python) could not import 'torch'", noimport);
    CHECK_STR_CONTAINS(ERR, want);
    const char *quiet[] = {ACCEL, "launch", "-q", "--python", noimport, "train.py", NULL};
    CHECK(run(quiet, NULL) == 1);
    CHECK_STR_CONTAINS(ERR, "could not import 'torch'");
    const char *missing[] = {ACCEL, "launch", "--python", "/nonexistent/python", "train.py", NULL};
    CHECK(run(missing, NULL) == 1);
    CHECK_STR_CONTAINS(ERR, "cannot run the Python interpreter '/nonexistent/python' (chosen by --python)");
    /* PYTHON set but empty is refused as every variable (it was read as unset); --python makes it moot */
    const char *empty_python[] = {"PYTHON=", venv_env, NULL};
    CHECK(run(mod, empty_python) == 2);
    CHECK_STR_CONTAINS(ERR, "accel launch: error: the environment: PYTHON is set but empty: unset it");
    CHECK(!strstr(OUT, "venv-python"));
    CHECK(run(flag, empty_python) == 0);
    CHECK_STR_CONTAINS(OUT, "args=train.py --lr 1\n");
    /* VIRTUAL_ENV empty is no virtualenv (as Python's tools read it): python3 on PATH, not /bin/python */
    char path_env[PATH_MAX + 32];
    snprintf(path_env, sizeof path_env, "PATH=%s/pathbin", TMP);
    snprintf(venv, sizeof venv, "%s/pathbin", TMP);
    mkdir(venv, 0755);
    script("pathbin/python3", "#!/bin/sh\necho \"path-python3 args=$*\"\n");
    const char *empty_venv[] = {"PYTHON", "VIRTUAL_ENV=", path_env, NULL}; /* glibc's putenv("PYTHON") unsets it */
    CHECK(run(mod, empty_venv) == 0);
    CHECK_STR_CONTAINS(OUT, "path-python3 args=-m pkg.train\n");
}

/* Several machines without ACCEL_JOB_SECRET: refused before any worker starts. */
static void test_several_machines_need_secret(void) {
    const char *a[] = {ACCEL, "launch", "--num_machines", "2", "--machine_rank", "0", "--num_processes", "2",
                       "--main_process_ip", "127.0.0.1", "--main_process_port", "0", WORKER, "env", NULL};
    const char *no_secret[] = {"ACCEL_JOB_SECRET=", NULL};
    CHECK(run(a, no_secret) == 1);
    CHECK_STR_CONTAINS(ERR, "needs ACCEL_JOB_SECRET (it is set but empty: an empty secret is none): export the "
                            "same non-empty secret on every machine");
    CHECK_STR_CONTAINS(ERR, "ACCEL_INSECURE_NO_SECRET=1");
    CHECK(!strstr(OUT, "RANK="));
}

int main(void) {
    if (!sibling_exe("accel", ACCEL, sizeof ACCEL) || !sibling_exe("test_dist_faults", WORKER, sizeof WORKER)) return 1;
    if (!cli_scratch("launch", TMP, sizeof TMP)) return 1;
    snprintf(PIDENV, sizeof PIDENV, "ACCEL_TEST_PIDDIR=%s", TMP);
    RUN(test_env_contract);
    RUN(test_config_numbers);
    RUN(test_yaml_scalars);
    RUN(test_flag_errors);
    RUN(test_free_port_reserved);
    RUN(test_several_machines_need_secret);
    RUN(test_worker_exit1);
    RUN(test_worker_sigkill);
    RUN(test_slurm_machines);
    RUN(test_slurm_several_tasks_refused);
    RUN(test_slurm_job_port);
    RUN(test_dynamo_and_error_file_env);
    RUN(test_error_file_reported);
    RUN(test_worker_hang);
    RUN(test_dead_peer);
    RUN(test_debug_mismatch);
    RUN(test_restart);
    RUN(test_tee_logs);
    RUN(test_config_precedence);
    RUN(test_launcher_sigkill_wrapper);
    RUN(test_monitor_interval);
    RUN(test_float_flags);
    RUN(test_accelerate_fsdp_env);
    RUN(test_fsdp_bool_settings);
    RUN(test_accelerate_deepspeed_env);
    RUN(test_accelerate_use_cpu);
    RUN(test_empty_omp_num_threads);
    RUN(test_empty_main_process_ip);
    RUN(test_mixed_precision_case);
    RUN(test_fp8_env);
    RUN(test_fp8_flag_errors);
    RUN(test_fp8_reaches_accelerator);
    RUN(test_python_interpreter);
    RUN(test_launch_sweep_finds);
    cli_scratch_remove(TMP);
    return check_summary();
}
