/* A worker that misbehaves on purpose, for tests/test_cli_launch.c.
 *
 * `test_dist_faults MODE` under `accel launch` (2 processes):
 *   env       print the launcher's environment contract (KEY=VALUE lines)
 *   init      initialise the group and exit (also the launch benchmark payload)
 *   exit1     rank 1 writes to stderr and exits 1; rank 0 waits in a barrier
 *   kill      rank 1 SIGKILLs itself; rank 0 waits in a barrier
 *   hang      rank 1 sleeps; rank 0's all_reduce must time out (ACCEL_DIST_TIMEOUT)
 *   dead      rank 1 exits 0 without finalize; rank 0's barrier must report it dead
 *   mismatch  (debug mode) rank 0 all_reduce, rank 1 all_gather: both must fail
 *             with the mismatch report; exit 0 when they do
 *   diverge   (no debug mode) rank 0 all_reduce, rank 1 barrier: both must fail
 *             with "mismatched collectives" at once, not hang until the timeout
 *   sites     the same all_reduce from two lines (one per rank): both must fail
 *             naming the different call sites
 *   split_sites  the same, on a subgroup from accel_pg_split (it checks call
 *             sites as its parent does)
 *   restart   rank 1 fails in the first attempt only
 *   reserved  before init, each rank tries a plain bind() of MASTER_PORT and
 *             prints "port reserved" when it is taken (the launcher holds it)
 *   accelerator  accel_accelerator_new(NULL) from the launch env: prints
 *             "accelerator: ok" or its error (fp8: the recipe's refusal)
 * Every rank writes its pid to $ACCEL_TEST_PIDDIR/rank<r>.pid when set.
 * Run without a mode (plain ctest) it checks the group of one. */
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "accel/accelerator.h"
#include "accel/dist.h"
#include "check.h"

static void record_pid(void) {
    const char *dir = getenv("ACCEL_TEST_PIDDIR");
    if (!dir) return;
    char path[4096];
    snprintf(path, sizeof path, "%s/rank%s.pid", dir, getenv("RANK") ? getenv("RANK") : "0");
    FILE *f = fopen(path, "w");
    if (f) {
        fprintf(f, "%d\n", (int)getpid());
        fclose(f);
    }
}

/* A stranger asking for MASTER_PORT (no SO_REUSEADDR) must be refused. */
static void print_port_reserved(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(getenv("MASTER_PORT"))),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int r = bind(fd, (struct sockaddr *)&sa, sizeof sa);
    printf("port %s\n", r != 0 && errno == EADDRINUSE ? "reserved" : "free");
    fflush(stdout);
    close(fd);
}

static int fail(const char *what) {
    fprintf(stderr, "rank %d: %s: %s\n", accel_dist_rank(), what, accel_last_error());
    return 3;
}

static void single_process(void) {
    CHECK(accel_dist_init() == ACCEL_OK);
    accel_pg *pg = accel_dist_default_group();
    CHECK(accel_pg_size(pg) == 1 && accel_pg_rank(pg) == 0);
    float x[3] = {1, 2, 3};
    CHECK(accel_pg_all_reduce(pg, x, 3, ACCEL_F32, ACCEL_REDUCE_AVG) == ACCEL_OK && x[2] == 3);
    CHECK(accel_pg_barrier(pg) == ACCEL_OK);
    float *s = accel_pg_alloc_shared(pg, 100);
    CHECK(s && s[0] == 0);
    accel_pg_free_shared(pg, s);
    accel_dist_finalize();
}

int main(int argc, char **argv) {
    if (argc < 2) {
        RUN(single_process);
        accel_thread_cleanup();
        return check_summary();
    }
    const char *mode = argv[1];
    record_pid();
    if (!strcmp(mode, "env")) {
        static const char *const KEYS[] = {
            "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
            "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
            "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "OMP_NUM_THREADS", "ACCELERATE_MIXED_PRECISION",
            "ACCEL_MIXED_PRECISION", "ACCEL_GRADIENT_ACCUMULATION_STEPS", "ACCEL_USE_CPU", "ACCEL_DEBUG_MODE",
            "ACCELERATE_DEBUG_MODE", "ACCEL_JOB_SECRET", "ACCEL_ZERO_STAGE", "ACCEL_FSDP_SHARDING_STRATEGY",
            "CUDA_VISIBLE_DEVICES", "ACCEL_GRADIENT_CLIPPING", "OMP_WAIT_POLICY", "ACCELERATE_FP8_BACKEND",
            "ACCELERATE_FP8_USE_AUTOCAST_DURING_EVAL", "ACCELERATE_FP8_MARGIN", "ACCELERATE_FP8_INTERVAL",
            "ACCELERATE_FP8_FORMAT", "ACCELERATE_FP8_AMAX_HISTORY_LEN", "ACCELERATE_FP8_AMAX_COMPUTE_ALGO",
            "ACCELERATE_FP8_OVERRIDE_FPROP", "ACCELERATE_FP8_OVERRIDE_DGRAD", "ACCELERATE_FP8_OVERRIDE_WGRAD",
            "ACCELERATE_FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER", "ACCELERATE_FP8_PAD_INNER_DIM",
            "ACCEL_FP8_MARGIN", "ACCEL_FP8_OVERRIDE_WGRAD", "ACCELERATE_DYNAMO_BACKEND", "ACCELERATE_DYNAMO_MODE",
            "ACCELERATE_DYNAMO_USE_FULLGRAPH", "ACCELERATE_DYNAMO_USE_DYNAMIC",
            "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION", "TORCHELASTIC_ERROR_FILE", NULL};
        char buf[4096];
        size_t o = 0;
        for (int i = 0; KEYS[i]; i++) {
            const char *v = getenv(KEYS[i]);
            if (v) o += (size_t)snprintf(buf + o, sizeof buf - o, "%s=%s\n", KEYS[i], v);
        }
        fputs(buf, stdout); /* one write: lines of the two ranks do not interleave */
        return 0;
    }
    if (!strcmp(mode, "accelerator")) { /* the launch env through accel_accelerator_new: its verdict */
        accel_accelerator *acc = accel_accelerator_new(NULL);
        printf("accelerator: %s\n", acc ? "ok" : accel_last_error());
        accel_accelerator_free(acc);
        return acc ? 0 : 1;
    }
    if (!strcmp(mode, "reserved")) print_port_reserved();
    if (accel_dist_init() != ACCEL_OK) return fail("init");
    accel_pg *pg = accel_dist_default_group();
    int rank = accel_pg_rank(pg);
    const char *rc = getenv("TORCHELASTIC_RESTART_COUNT");
    if (!strcmp(mode, "init") || !strcmp(mode, "reserved")) {
        accel_dist_finalize();
        return 0;
    }
    if (!strcmp(mode, "exit1") || !strcmp(mode, "kill") || !strcmp(mode, "dead") ||
        (!strcmp(mode, "restart") && rc && atoi(rc) == 0)) {
        if (rank == 1) {
            fprintf(stderr, "boom from rank 1\n");
            if (!strcmp(mode, "kill")) raise(SIGKILL);
            return !strcmp(mode, "dead") ? 0 : 1;
        }
        if (accel_pg_barrier(pg) != ACCEL_OK) return fail("barrier");
        accel_dist_finalize();
        return 0;
    }
    if (!strcmp(mode, "restart")) {
        printf("restart=%s rank=%d\n", rc ? rc : "?", rank);
        accel_dist_finalize();
        return 0;
    }
    if (!strcmp(mode, "hang")) {
        if (rank == 1) {
            for (;;) pause();
        }
        float x[4] = {0};
        if (accel_pg_all_reduce(pg, x, 4, ACCEL_F32, ACCEL_REDUCE_SUM) != ACCEL_OK) return fail("all_reduce");
        return 0;
    }
    if (!strcmp(mode, "mismatch")) {
        float x[1024] = {0}, y[6];
        accel_status st = rank == 0 ? accel_pg_all_reduce(pg, x, 1024, ACCEL_F32, ACCEL_REDUCE_SUM)
                                    : accel_pg_all_gather(pg, x, y, 3, ACCEL_F32);
        fprintf(stderr, "rank %d: %s\n", rank, accel_last_error());
        bool ok = st == ACCEL_ERR_DIST &&
                  strstr(accel_last_error(), "mismatched collectives: rank 0 called all_reduce(f32, 1024), "
                                             "rank 1 called all_gather(f32, 3)");
        accel_clear_error();
        /* the group is now broken: later calls fail at once, naming the first error */
        ok = ok && accel_pg_barrier(pg) == ACCEL_ERR_DIST && strstr(accel_last_error(), "mismatched");
        accel_clear_error();
        accel_dist_finalize();
        return ok ? 0 : 1;
    }
    if (!strcmp(mode, "diverge") || !strcmp(mode, "sites") || !strcmp(mode, "split_sites")) {
        float x[1024] = {0};
        bool sites = strcmp(mode, "diverge") != 0;
        accel_pg *parent = pg;
        if (!strcmp(mode, "split_sites") && !(pg = accel_pg_split(parent, 0, rank))) {
            fprintf(stderr, "accel_pg_split: %s\n", accel_last_error());
            return 1;
        }
        accel_status st;
        if (rank == 0) st = accel_pg_all_reduce(pg, x, 1024, ACCEL_F32, ACCEL_REDUCE_SUM);
        else if (sites) st = accel_pg_all_reduce(pg, x, 1024, ACCEL_F32, ACCEL_REDUCE_SUM);
        else st = accel_pg_barrier(pg);
        fprintf(stderr, "rank %d: %s\n", rank, accel_last_error());
        bool ok = st == ACCEL_ERR_DIST && strstr(accel_last_error(), "mismatched collectives") &&
                  (!sites || strstr(accel_last_error(), "different call sites"));
        accel_clear_error();
        ok = ok && accel_pg_barrier(pg) == ACCEL_ERR_DIST && strstr(accel_last_error(), "mismatched");
        accel_clear_error();
        if (pg != parent) accel_pg_free(pg);
        accel_dist_finalize();
        return ok ? 0 : 1;
    }
    fprintf(stderr, "unknown mode %s\n", mode);
    return 2;
}
