/* `accel launch` end to end: the environment contract, flag spelling and
 * precedence, failure reports (exit 1, SIGKILL, hang, dead peer), debug-mode
 * mismatch, restarts, --tee/--log_dir, and that no worker outlives the job.
 * Finds build/bin/accel and build/bin/test_dist_faults next to itself. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "accel/core.h"
#include "check.h"

static char ACCEL[PATH_MAX + 32], WORKER[PATH_MAX + 32], TMP[PATH_MAX];
static char OUT[1 << 16], ERR[1 << 16];

static void slurp(const char *path, char *buf, size_t n) {
    buf[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f) return;
    size_t r = fread(buf, 1, n - 1, f);
    buf[r] = 0;
    fclose(f);
}

/* Runs argv with extra "K=V" env entries; stdout/stderr into OUT/ERR. */
static int run(const char *const *argv, const char *const *env) {
    char o[PATH_MAX + 16], e[PATH_MAX + 16];
    snprintf(o, sizeof o, "%s/out", TMP);
    snprintf(e, sizeof e, "%s/err", TMP);
    pid_t pid = fork();
    if (pid == 0) {
        int fo = open(o, O_WRONLY | O_CREAT | O_TRUNC, 0644), fe = open(e, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fo, 1);
        dup2(fe, 2);
        int devnull = open("/dev/null", O_RDONLY);
        dup2(devnull, 0);
        for (int i = 0; env && env[i]; i++) putenv((char *)env[i]);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    int st;
    waitpid(pid, &st, 0);
    slurp(o, OUT, sizeof OUT);
    slurp(e, ERR, sizeof ERR);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Every pid recorded by the workers is gone. */
static bool no_survivors(void) {
    bool ok = true;
    for (int r = 0; r < 4; r++) {
        char path[PATH_MAX + 32], buf[32];
        snprintf(path, sizeof path, "%s/rank%d.pid", TMP, r);
        slurp(path, buf, sizeof buf);
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
    /* --debug, --cpu */
    const char *b[] = {ACCEL, "launch", "--cpu", "--debug", "--num-processes=3", WORKER, "env", NULL};
    CHECK(run(b, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "RANK=2\n");
    CHECK_STR_CONTAINS(OUT, "ACCEL_DEBUG_MODE=1\n");
    CHECK_STR_CONTAINS(OUT, "ACCELERATE_DEBUG_MODE=true\n");
    CHECK_STR_CONTAINS(OUT, "ACCEL_USE_CPU=1\n");
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
    CHECK_STR_CONTAINS(ERR, "Unknown mixed_precision mode: fp4");
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

static void test_worker_hang(void) {
    const char *a[] = {ACCEL, "launch", "--num_processes", "2", WORKER, "hang", NULL};
    const char *env[] = {PIDENV, "ACCEL_DIST_TIMEOUT=1", NULL};
    double t0 = accel_now_seconds();
    CHECK(run(a, env) == 1);
    CHECK(accel_now_seconds() - t0 < 15);
    CHECK_STR_CONTAINS(ERR, "rank      : 0 (local_rank: 0)");
    CHECK_STR_CONTAINS(ERR, "exitcode  : 3");
    CHECK_STR_CONTAINS(ERR, "all_reduce(f32, 4) timed out after 1 s on rank 0: rank 1 of 2 did not arrive");
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
    char logdir[PATH_MAX + 8];
    snprintf(logdir, sizeof logdir, "%s/logs", TMP);
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
    slurp(path, buf, sizeof buf);
    CHECK_STR_CONTAINS(buf, "RANK=1\n");
    CHECK_STR_CONTAINS(run_dir, "/logs/");
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
 * clip and `fsdp_sharding_strategy: 2` became FULL_SHARD). */
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
    CHECK_STR_CONTAINS(OUT, "ACCEL_GRADIENT_CLIPPING=1\n");
    CHECK_STR_CONTAINS(OUT, "ACCEL_GRADIENT_ACCUMULATION_STEPS=3\n");
    CHECK_STR_CONTAINS(OUT, "ACCEL_ZERO_STAGE=2\n");
    f = fopen(cfg, "w");
    fprintf(f, "distributed_type: FSDP\nnum_processes: 2\nfsdp_config:\n  fsdp_sharding_strategy: 2\n");
    fclose(f);
    CHECK(run(a, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "ACCEL_FSDP_SHARDING_STRATEGY=2\n");
}

/* Several machines without ACCEL_JOB_SECRET: refused before any worker starts. */
static void test_several_machines_need_secret(void) {
    const char *a[] = {ACCEL, "launch", "--num_machines", "2", "--machine_rank", "0", "--num_processes", "2",
                       "--main_process_ip", "127.0.0.1", "--main_process_port", "0", WORKER, "env", NULL};
    const char *no_secret[] = {"ACCEL_JOB_SECRET=", NULL};
    CHECK(run(a, no_secret) == 1);
    CHECK_STR_CONTAINS(ERR, "needs ACCEL_JOB_SECRET");
    CHECK_STR_CONTAINS(ERR, "ACCEL_INSECURE_NO_SECRET=1");
    CHECK(!strstr(OUT, "RANK="));
}

int main(void) {
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    CHECK(n > 0);
    self[n > 0 ? n : 0] = 0;
    *strrchr(self, '/') = 0;
    snprintf(ACCEL, sizeof ACCEL, "%s/accel", self);
    snprintf(WORKER, sizeof WORKER, "%s/test_dist_faults", self);
    if (access(ACCEL, X_OK) != 0 || access(WORKER, X_OK) != 0) {
        fprintf(stderr, "missing %s or %s\n", ACCEL, WORKER);
        return 1;
    }
    snprintf(TMP, sizeof TMP, "/tmp/accel_test_launch_XXXXXX");
    CHECK(mkdtemp(TMP) != NULL);
    snprintf(PIDENV, sizeof PIDENV, "ACCEL_TEST_PIDDIR=%s", TMP);
    /* an isolated HF_HOME: no default config of the machine leaks in */
    setenv("HF_HOME", TMP, 1);
    RUN(test_env_contract);
    RUN(test_config_numbers);
    RUN(test_flag_errors);
    RUN(test_several_machines_need_secret);
    RUN(test_worker_exit1);
    RUN(test_worker_sigkill);
    RUN(test_worker_hang);
    RUN(test_dead_peer);
    RUN(test_debug_mismatch);
    RUN(test_restart);
    RUN(test_tee_logs);
    RUN(test_config_precedence);
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf %s", TMP);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", TMP);
    return check_summary();
}
