/* Every integer, boolean and enum variable the library reads is parsed one
 * strict way (src/core/env.h): a table of bad values per variable, each run
 * in a child process of its own (a fresh environment and fresh read-once
 * state). Refused values fail the call that reads them with
 * ACCEL_ERR_INVALID_ARG and an error naming the variable (and the value);
 * the tuning switches read where nothing can fail warn on stderr, naming it.
 * Before, among others:
 *   ACCEL_GRADIENT_ACCUMULATION_STEPS=abc  "must be >= 1 (got 0)", no name
 *   ACCEL_GRADIENT_ACCUMULATION_STEPS=4x   ran with 4
 *   RANK=                                   ran as rank 0, timed out in rendezvous
 *   MASTER_PORT= / ACCEL_DIST_TIMEOUT=      defaults used
 *   ACCEL_DISABLE_PROGRESS=maybe           read as "disable"
 *   SLURM_JOB_ID=abc (srun, no MASTER_PORT) ignored: port 29500 for every job
 *   ACCEL_DIST_BACKEND=gloo                one process: ignored; two: a rendezvous timeout
 * And the parser itself: accel__parse_long / accel__env_* on edge values. */
#include <fcntl.h>
#include <limits.h>
#include <string.h>

#include "accel/accel.h"
#include "check.h"
#include "core/env.h"
#include "dist_group.h"

typedef enum surface {
    ACCELERATOR, /* accel_accelerator_new(NULL): one process */
    DIST,        /* accel_dist_init() as rank 0 of 2 on loopback (ACCEL_DIST_TIMEOUT=3: never a hang) */
    DIST_ONE,    /* accel_dist_init() as the one process of a world of 1 */
    SRUN,        /* accel_dist_init() as task 0 of 2 of a simulated srun step, no MASTER_PORT */
    PROGRESS,    /* accel_progress_new */
    WARN_DEVICES, /* registry init: warns */
    WARN_LOGGER,  /* accel_get_logger: warns */
} surface;

typedef struct bad_case {
    surface where;
    const char *var, *value;
    const char *extra; /* "K=V" more for this case, or NULL */
} bad_case;

static const bad_case CASES[] = {
    {ACCELERATOR, "ACCEL_GRADIENT_ACCUMULATION_STEPS", "abc", NULL},
    {ACCELERATOR, "ACCEL_GRADIENT_ACCUMULATION_STEPS", "4x", NULL},
    {ACCELERATOR, "ACCEL_GRADIENT_ACCUMULATION_STEPS", "", NULL},
    {ACCELERATOR, "ACCEL_GRADIENT_ACCUMULATION_STEPS", " 4", NULL},
    {ACCELERATOR, "ACCEL_GRADIENT_ACCUMULATION_STEPS", "+4", NULL},
    {ACCELERATOR, "ACCEL_GRADIENT_ACCUMULATION_STEPS", "0", NULL},
    {ACCELERATOR, "ACCEL_GRADIENT_ACCUMULATION_STEPS", "-2", NULL},
    {ACCELERATOR, "ACCEL_GRADIENT_ACCUMULATION_STEPS", "4294967297", NULL},
    {ACCELERATOR, "ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "2.5", NULL},
    {ACCELERATOR, "ACCEL_MIXED_PRECISION", "", NULL},
    {ACCELERATOR, "ACCEL_MIXED_PRECISION", "fp32", NULL},
    {ACCELERATOR, "ACCELERATE_MIXED_PRECISION", "half", NULL},
    {ACCELERATOR, "ACCEL_USE_CPU", "", NULL},
    {ACCELERATOR, "ACCELERATE_USE_CPU", "maybe", NULL},
    {ACCELERATOR, "ACCEL_ZERO_STAGE", "", NULL},
    {ACCELERATOR, "ACCELERATE_FP8_MARGIN", "", "ACCEL_MIXED_PRECISION=fp8"},
    {ACCELERATOR, "ACCELERATE_FP8_MARGIN", " 1", "ACCEL_MIXED_PRECISION=fp8"},
    {DIST, "RANK", "", NULL},
    {DIST, "RANK", "0x", NULL},
    {DIST, "RANK", "-1", NULL},
    {DIST, "RANK", " 0", NULL},
    {DIST, "WORLD_SIZE", "", NULL},
    {DIST, "WORLD_SIZE", "2 ", NULL},
    {DIST, "WORLD_SIZE", "0", NULL},
    {DIST, "LOCAL_RANK", "", NULL},
    {DIST, "LOCAL_WORLD_SIZE", "two", NULL},
    {DIST, "MASTER_PORT", "", NULL},
    {DIST, "MASTER_PORT", "0", NULL},
    {DIST, "MASTER_PORT", "65536", NULL},
    {DIST, "MASTER_PORT", "80x", NULL},
    {DIST, "ACCEL_DIST_TIMEOUT", "", NULL},
    {DIST, "ACCEL_DIST_TIMEOUT", "abc", NULL},
    {DIST, "ACCEL_DIST_TIMEOUT", "nan", NULL},
    {DIST, "ACCEL_DIST_TIMEOUT", "-1", NULL},
    {DIST, "ACCEL_DEBUG_MODE", "", NULL},
    {DIST, "ACCELERATE_DEBUG_MODE", "maybe", NULL},
    {DIST, "ACCEL_INSECURE_NO_SECRET", "maybe", NULL},
    {DIST, "ACCEL_DIST_BACKEND", "", NULL},
    {DIST, "ACCEL_DIST_BACKEND", "shmm", NULL},    /* was refused only after the rendezvous: a timeout alone */
    {DIST_ONE, "ACCEL_DIST_BACKEND", "gloo", NULL}, /* was ignored: one process ran "self" */
    {SRUN, "SLURM_NODEID", "", NULL},
    {SRUN, "SLURM_NODEID", "0x", NULL},
    {SRUN, "SLURM_JOB_ID", "abc", NULL},
    {SRUN, "SLURM_JOB_ID", "", NULL},
    {SRUN, "SLURM_STEP_ID", "x", NULL},
    {SRUN, "SLURM_PROCID", "", NULL},
    {PROGRESS, "ACCEL_DISABLE_PROGRESS", "maybe", NULL},
    {PROGRESS, "ACCEL_DISABLE_PROGRESS", "", NULL},
    {WARN_DEVICES, "ACCEL_TEST_DEVICES", "", NULL},
    {WARN_DEVICES, "ACCEL_TEST_DEVICES", "2x", NULL},
    {WARN_LOGGER, "ACCEL_LOG_LEVEL", "loud", NULL},
    {WARN_LOGGER, "ACCEL_LOG_LEVEL", "", NULL},
};

static void clear_env(void) {
    static const char *const VARS[] = {
        "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PMI_RANK",
        "PMI_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID",
        "SLURM_NODEID", "SLURM_TASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE", "SLURM_JOB_NODELIST",
        "SLURM_STEP_NODELIST", "SLURM_STEP_ID", "SLURM_STEPID", "SLURM_JOB_ID", "SLURM_JOBID",
        "ACCEL_DIST_BACKEND", "ACCEL_DEBUG_MODE", "ACCELERATE_DEBUG_MODE", "ACCEL_INSECURE_NO_SECRET",
        "ACCEL_MIXED_PRECISION", "ACCELERATE_MIXED_PRECISION", "ACCEL_GRADIENT_ACCUMULATION_STEPS",
        "ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "ACCEL_USE_CPU", "ACCELERATE_USE_CPU", "ACCEL_DEFAULT_DEVICE",
        "ACCEL_TEST_DEVICES", "ACCEL_LOG_LEVEL", "ACCELERATE_LOG_LEVEL", "ACCEL_DISABLE_PROGRESS"};
    for (size_t i = 0; i < sizeof VARS / sizeof *VARS; i++) unsetenv(VARS[i]);
}

static void base_env(surface where) {
    clear_env();
    setenv("ACCEL_DIST_TIMEOUT", "3", 1);
    if (where == DIST || where == DIST_ONE) {
        const char *world = where == DIST ? "2" : "1";
        setenv("RANK", "0", 1);
        setenv("WORLD_SIZE", world, 1);
        setenv("LOCAL_RANK", "0", 1);
        setenv("LOCAL_WORLD_SIZE", world, 1);
        setenv("MASTER_ADDR", "127.0.0.1", 1);
        dist_setenv_int("MASTER_PORT", dist_free_port());
        setenv("ACCEL_JOB_SECRET", "s3cret", 1);
    } else if (where == SRUN) { /* task 0 of `srun -N1 -n2`, step 0 */
        setenv("SLURM_JOB_ID", "4242", 1);
        setenv("SLURM_STEP_ID", "0", 1);
        setenv("SLURM_PROCID", "0", 1);
        setenv("SLURM_NTASKS", "2", 1);
        setenv("SLURM_STEP_NUM_TASKS", "2", 1);
        setenv("SLURM_LOCALID", "0", 1);
        setenv("SLURM_NODEID", "0", 1);
        setenv("SLURM_TASKS_PER_NODE", "2", 1);
        setenv("SLURM_JOB_NODELIST", "127.0.0.1", 1);
        setenv("ACCEL_JOB_SECRET", "s3cret", 1);
    }
}

/* The child: 0 when the case was refused (or warned about) by name. */
static int run_case(const bad_case *c) {
    base_env(c->where);
    if (c->extra) {
        char kv[128];
        snprintf(kv, sizeof kv, "%s", c->extra);
        char *eq = strchr(kv, '=');
        *eq = 0;
        setenv(kv, eq + 1, 1);
    }
    setenv(c->var, c->value, 1);
    char said[4096] = "";
    accel_status st = ACCEL_OK;
    if (c->where == WARN_DEVICES || c->where == WARN_LOGGER) {
        char path[64];
        snprintf(path, sizeof path, "/tmp/accel_env_strict_%d.err", (int)getpid());
        fflush(stderr);
        int saved = dup(2), fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
        dup2(fd, 2);
        if (c->where == WARN_DEVICES) (void)accel_device_available((accel_device){ACCEL_DEV_CUDA, 0}); /* not the cpu: it skips the registry */
        else (void)accel_get_logger("env_strict");
        fflush(stderr);
        dup2(saved, 2);
        ssize_t n = pread(fd, said, sizeof said - 1, 0);
        said[n > 0 ? n : 0] = 0;
        close(fd);
        unlink(path);
        if (!strstr(said, c->var)) {
            fprintf(stderr, "%s='%s': no warning naming it (stderr: '%s')\n", c->var, c->value, said);
            return 1;
        }
        return 0;
    }
    double t0 = accel_now_seconds();
    if (c->where == ACCELERATOR) {
        accel_accelerator *acc = accel_accelerator_new(NULL);
        st = acc ? ACCEL_OK : accel_last_status();
        accel_accelerator_free(acc);
    } else if (c->where == PROGRESS) {
        accel_progress *p = accel_progress_new(10, NULL);
        st = p ? ACCEL_OK : accel_last_status();
        accel_progress_close(p);
    } else {
        st = accel_dist_init();
        if (st == ACCEL_OK) accel_dist_finalize();
    }
    double dt = accel_now_seconds() - t0;
    const char *msg = st == ACCEL_OK ? "accepted" : accel_last_error();
    bool named = st == ACCEL_ERR_INVALID_ARG && strstr(msg, c->var) && (!*c->value || strstr(msg, c->value));
    if (!named || dt > 2.0) {
        fprintf(stderr, "%s='%s': %s after %.2f s (want ACCEL_ERR_INVALID_ARG naming it, at once)\n", c->var,
                c->value, msg, dt);
        return 1;
    }
    return 0;
}

static void test_bad_values(void) {
    for (size_t i = 0; i < sizeof CASES / sizeof *CASES; i++) {
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) exit(run_case(&CASES[i]));
        dist_group g = {.world = 1, .kill_after_s = 20, .pid = {pid}};
        int st;
        dist_group_wait(&g, &st);
        CHECK_MSG(dist_exited_ok(st), "%s='%s': status %#x", CASES[i].var, CASES[i].value, st);
    }
}

/* The parser: whole decimal text in range; set-but-empty is an error; the
 * error names the variable and quotes the value. */
static void test_parser(void) {
    long v = 0;
    CHECK(accel__parse_long("X", "42", 0, 100, &v) == ACCEL_OK && v == 42);
    CHECK(accel__parse_long("X", "-5", -10, 0, &v) == ACCEL_OK && v == -5);
    CHECK(accel__parse_long("X", "9223372036854775807", 0, LONG_MAX, &v) == ACCEL_OK && v == LONG_MAX);
    static const char *const BAD[] = {"", " 1", "1 ", "+1", "1x", "0x10", "-", "--1", "1e3", "101", "-11",
                                      "9223372036854775808"};
    for (size_t i = 0; i < sizeof BAD / sizeof *BAD; i++) {
        v = 7;
        accel_status st = accel__parse_long("MY_VAR", BAD[i], -10, 100, &v);
        CHECK_MSG(st == ACCEL_ERR_INVALID_ARG && v == 7 && strstr(accel_last_error(), "MY_VAR='") &&
                      strstr(accel_last_error(), BAD[i]),
                  "'%s': %d %s", BAD[i], (int)st, accel_last_error());
        accel_clear_error();
    }
    unsetenv("ACCEL_TEST_STRICT");
    bool b = true;
    double d = 0;
    CHECK(accel__env_long("ACCEL_TEST_STRICT", 3, 0, 9, &v) == ACCEL_OK && v == 3);
    CHECK(accel__env_bool("ACCEL_TEST_STRICT", false, &b) == ACCEL_OK && !b);
    CHECK(accel__env_double("ACCEL_TEST_STRICT", 1.5, 0, 10, &d) == ACCEL_OK && d == 1.5);
    setenv("ACCEL_TEST_STRICT", "", 1);
    CHECK(accel__env_long("ACCEL_TEST_STRICT", 3, 0, 9, &v) == ACCEL_ERR_INVALID_ARG);
    CHECK(accel__env_bool("ACCEL_TEST_STRICT", false, &b) == ACCEL_ERR_INVALID_ARG);
    CHECK(accel__env_double("ACCEL_TEST_STRICT", 1.5, 0, 10, &d) == ACCEL_ERR_INVALID_ARG);
    setenv("ACCEL_TEST_STRICT", "On", 1);
    CHECK(accel__env_bool("ACCEL_TEST_STRICT", false, &b) == ACCEL_OK && b);
    /* a number as Python's float() reads it (tests/test_python_float.c: the parser) */
    static const struct {
        const char *text;
        double value;
    } GOOD_D[] = {{"2.5", 2.5}, {" 1\n", 1}, {"1_0", 10}, {"2_5e-1", 2.5}, {"+.5", 0.5}};
    for (size_t i = 0; i < sizeof GOOD_D / sizeof *GOOD_D; i++) {
        setenv("ACCEL_TEST_STRICT", GOOD_D[i].text, 1);
        CHECK_MSG(accel__env_double("ACCEL_TEST_STRICT", 1.5, 0, 10, &d) == ACCEL_OK && d == GOOD_D[i].value,
                  "'%s': %g %s", GOOD_D[i].text, d, accel_last_error());
        CHECK_MSG(accel__env_nonneg("ACCEL_TEST_STRICT", 1.5, &d) == ACCEL_OK && d == GOOD_D[i].value, "'%s': %g",
                  GOOD_D[i].text, d);
    }
    static const char *const BAD_D[] = {"0", "10.5", "inf", "nan", "1s", "-1", "0x10", "0x1p1", "1__0", "1_"};
    for (size_t i = 0; i < sizeof BAD_D / sizeof *BAD_D; i++) {
        setenv("ACCEL_TEST_STRICT", BAD_D[i], 1);
        CHECK_MSG(accel__env_double("ACCEL_TEST_STRICT", 1.5, 0, 10, &d) == ACCEL_ERR_INVALID_ARG &&
                      strstr(accel_last_error(), "ACCEL_TEST_STRICT='") && strstr(accel_last_error(), BAD_D[i]),
                  "'%s'", BAD_D[i]);
    }
    /* accel__env_nonneg: >= 0, 0 and infinity included (a norm that clips nothing) */
    static const char *const NONNEG[] = {"0", "1e400", "inf", " Infinity "};
    for (size_t i = 0; i < sizeof NONNEG / sizeof *NONNEG; i++) {
        setenv("ACCEL_TEST_STRICT", NONNEG[i], 1);
        CHECK_MSG(accel__env_nonneg("ACCEL_TEST_STRICT", 1.5, &d) == ACCEL_OK && d == (i ? INFINITY : 0), "'%s'",
                  NONNEG[i]);
    }
    static const char *const BAD_NONNEG[] = {"", " ", "-1", "-0.5", "nan", "0x10", "nan(1)", "1 1", "1_"};
    for (size_t i = 0; i < sizeof BAD_NONNEG / sizeof *BAD_NONNEG; i++) {
        setenv("ACCEL_TEST_STRICT", BAD_NONNEG[i], 1);
        d = 7;
        CHECK_MSG(accel__env_nonneg("ACCEL_TEST_STRICT", 1.5, &d) == ACCEL_ERR_INVALID_ARG && d == 7 &&
                      strstr(accel_last_error(), "ACCEL_TEST_STRICT='") &&
                      strstr(accel_last_error(), "is not a number >= 0"),
                  "'%s': %s", BAD_NONNEG[i], accel_last_error());
    }
    unsetenv("ACCEL_TEST_STRICT");
    CHECK(accel__env_nonneg("ACCEL_TEST_STRICT", 1.5, &d) == ACCEL_OK && d == 1.5);
    accel_clear_error();
    unsetenv("ACCEL_TEST_STRICT");
}

/* A good value still works: ACCEL_GRADIENT_ACCUMULATION_STEPS=3 gives 3. */
static void test_good_accumulation(void) {
    clear_env();
    setenv("ACCEL_GRADIENT_ACCUMULATION_STEPS", "3", 1);
    accel_accelerator *acc = accel_accelerator_new(NULL);
    CHECK_MSG(acc != NULL, "%s", accel_last_error());
    if (acc) CHECK(accel_accelerator_gradient_accumulation_steps(acc) == 3);
    accel_accelerator_free(acc);
    unsetenv("ACCEL_GRADIENT_ACCUMULATION_STEPS");
}

int main(void) {
    RUN(test_parser);
    RUN(test_bad_values);
    RUN(test_good_accumulation);
    return check_summary();
}
