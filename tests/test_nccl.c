/* The NCCL process-group backend through the Accelerator (ctest label gpu).
 *
 *   test_nccl          one rank: ACCEL_DIST_BACKEND=nccl with WORLD_SIZE=1
 *                      (a real one-rank NCCL communicator, not the local
 *                      "self" group): reduce, broadcast and gather of tensors
 *                      on cuda:0; the process group's own calls on device and
 *                      host buffers, asynchronous ones stream-ordered.
 *   test_nccl multi    N ranks, N = the number of GPUs (NCCL refuses two
 *                      ranks on one GPU), one per GPU, forked on loopback:
 *                      the same collectives, checked against every rank's
 *                      known contribution. Skipped with fewer than 2 GPUs.
 *
 * A rank is a fresh process (fork, then exec of this program): CUDA cannot be
 * used in a child forked after the parent touched it. Without a GPU or
 * without NCCL in the build it prints the reason and exits 77 (skipped). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "accel/accelerator.h"
#include "accel/core.h"
#include "accel/dist.h"
#include "core/backend.h" /* the device's streams */
#include "check.h"
#include "dist_group.h"
#include "backends/plugin.h"

enum { SKIP = 77, N = 1031 };

/* x[i] = rank + i / N on the accelerator's device. */
static accel_tensor *rank_tensor(accel_device dev, int rank) {
    float host[N];
    for (int i = 0; i < N; i++) host[i] = (float)rank + (float)i / N;
    accel_tensor *t = accel_empty_on(ACCEL_F32, 1, (int64_t[]){N}, dev);
    CHECK(t && accel_tensor_from_host(t, host) == ACCEL_OK);
    return t;
}

/* The process group itself with a device send and a host recv (both staged:
 * the copies go each way in one collective) and with asynchronous work
 * (run on the group's communication thread, whose current CUDA device is
 * not the rank's unless the backend sets it). x: rank_tensor on the rank's GPU. */
static void check_pg_buffers(accel_pg *pg, const accel_tensor *x, int rank, int world) {
    enum { COUNT = N / DIST_GROUP_MAX };
    float got[N * DIST_GROUP_MAX];
    /* reduce_scatter: rank r gets block r of every rank's x, summed */
    CHECK_MSG(accel_pg_reduce_scatter(pg, x->data, got, COUNT, ACCEL_F32, ACCEL_REDUCE_SUM) == ACCEL_OK, "%s",
              accel_last_error());
    for (int i = 0; i < COUNT; i += 7)
        CHECK_CLOSE(got[i], world * ((float)(rank * COUNT + i) / N) + world * (world - 1) / 2.0f, 1e-5, 1e-5);
    /* all_gather: every rank's first COUNT elements, in rank order */
    CHECK_MSG(accel_pg_all_gather(pg, x->data, got, COUNT, ACCEL_F32) == ACCEL_OK, "%s", accel_last_error());
    for (int r = 0; r < world; r++)
        for (int i = 0; i < COUNT; i += 7) CHECK_CLOSE(got[r * COUNT + i], (float)r + (float)i / N, 0, 0);
    /* asynchronous all_reduce of a host buffer: staged on the communication thread */
    for (int i = 0; i < N; i++) got[i] = (float)(rank + 1);
    accel_work *w = accel_pg_all_reduce_async(pg, got, N, ACCEL_F32, ACCEL_REDUCE_SUM);
    CHECK_MSG(w && accel_work_wait(w) == ACCEL_OK, "%s", accel_last_error());
    accel_work_free(w);
    for (int i = 0; i < N; i += 97) CHECK_CLOSE(got[i], world * (world + 1) / 2.0f, 0, 0);
}

/* Stream-ordered asynchronous work on device buffers (dist.c's stream path):
 * the collective is ordered after the caller's current stream (a fill
 * enqueued just before it on a stream set with set_stream, not waited for),
 * accel_work_done polls it to the end, and two in flight finish in stream
 * order (waited in reverse, the other freed without a wait). */
static void check_pg_stream_async(accel_pg *pg, accel_device dev, int rank, int world) {
    const accel_backend *be = accel__backend_of(dev);
    accel_stream *s = be->async.stream_new(dev.index);
    CHECK_MSG(s != NULL, "%s", accel_last_error());
    be->async.set_stream(dev.index, s);
    accel_tensor *y = accel_empty_on(ACCEL_F32, 1, (int64_t[]){N}, dev);
    accel_tensor *g = accel_empty_on(ACCEL_F32, 1, (int64_t[]){(int64_t)N * world}, dev);
    accel_tensor *z = accel_empty_on(ACCEL_F32, 1, (int64_t[]){N}, dev);
    CHECK(y && g && z && accel_fill_(y, rank + 1) == ACCEL_OK);
    accel_work *w = accel_pg_all_reduce_async(pg, y->data, N, ACCEL_F32, ACCEL_REDUCE_SUM);
    CHECK_MSG(w != NULL, "%s", accel_last_error());
    double t0 = accel_now_seconds();
    while (w && !accel_work_done(w) && accel_now_seconds() - t0 < 60) {}
    CHECK_MSG(w && accel_work_wait(w) == ACCEL_OK, "%s", accel_last_error());
    accel_work_free(w);
    float sum = world * (world + 1) / 2.0f, got[N * DIST_GROUP_MAX];
    if (accel_to_floats(y, got) == ACCEL_OK)
        for (int i = 0; i < N; i += 97) CHECK_CLOSE(got[i], sum, 0, 0);
    accel_work *ag = accel_pg_all_gather_async(pg, y->data, g->data, N, ACCEL_F32);
    accel_work *rs = accel_pg_reduce_scatter_async(pg, g->data, z->data, N, ACCEL_F32, ACCEL_REDUCE_SUM);
    CHECK_MSG(ag && rs && accel_work_wait(rs) == ACCEL_OK, "%s", accel_last_error());
    accel_work_free(ag);
    accel_work_free(rs);
    if (accel_to_floats(g, got) == ACCEL_OK)
        for (int i = 0; i < N * world; i += 97) CHECK_CLOSE(got[i], sum, 0, 0);
    if (accel_to_floats(z, got) == ACCEL_OK)
        for (int i = 0; i < N; i += 97) CHECK_CLOSE(got[i], world * sum, 0, 0);
    be->async.set_stream(dev.index, NULL);
    CHECK(be->async.synchronize(dev.index) == ACCEL_OK);
    be->async.stream_free(dev.index, s);
}

/* The collectives of one rank of a group of `world`. */
static void check_collectives(int world) {
    accel_accelerator *acc = accel_accelerator_new(NULL);
    CHECK_MSG(acc != NULL, "%s", accel_last_error());
    if (!acc) return;
    int rank = accel_accelerator_process_index(acc);
    accel_device dev = accel_accelerator_device(acc);
    CHECK(accel_accelerator_num_processes(acc) == world);
    CHECK_MSG(dev.type == ACCEL_DEV_CUDA && dev.index == rank, "rank %d runs on %s", rank,
              accel_device_str(dev, (char[16]){0}, 16));
    CHECK_STR_CONTAINS(accel_pg_backend(accel_dist_default_group()), "nccl");
    accel_tensor *x = rank_tensor(dev, rank);
    float got[N * DIST_GROUP_MAX];

    /* sum over ranks: world * i / N + world (world - 1) / 2 */
    accel_tensor *s = accel_accelerator_reduce(acc, x, "sum", 1.0);
    CHECK_MSG(s != NULL, "%s", accel_last_error());
    if (s && accel_to_floats(s, got) == ACCEL_OK)
        for (int i = 0; i < N; i += 97)
            CHECK_CLOSE(got[i], world * ((float)i / N) + world * (world - 1) / 2.0f, 1e-5, 1e-5);

    /* broadcast from the last rank */
    accel_tensor *b = accel_accelerator_broadcast(acc, x, world - 1);
    CHECK_MSG(b != NULL, "%s", accel_last_error());
    if (b && accel_to_floats(b, got) == ACCEL_OK)
        for (int i = 0; i < N; i += 97) CHECK_CLOSE(got[i], (float)(world - 1) + (float)i / N, 0, 0);

    /* gather: every rank's tensor in rank order */
    accel_tensor *g = accel_accelerator_gather(acc, x);
    CHECK_MSG(g != NULL, "%s", accel_last_error());
    if (g) {
        CHECK(accel_numel(g) == (int64_t)world * N);
        if (accel_to_floats(g, got) == ACCEL_OK)
            for (int r = 0; r < world; r++)
                for (int i = 0; i < N; i += 97) CHECK_CLOSE(got[r * N + i], (float)r + (float)i / N, 0, 0);
    }
    check_pg_buffers(accel_dist_default_group(), x, rank, world);
    check_pg_stream_async(accel_dist_default_group(), dev, rank, world);
    accel_step_reset();
    accel_accelerator_free(acc);
}

/* ---- one process per rank */

static int rank_main(void) {
    check_collectives(accel_dist_world_size());
    return check_summary();
}

static char g_self[4096];

/* The child of dist_group_fork: becomes a fresh rank process. */
static int exec_rank(int rank, int world) {
    (void)rank, (void)world;
    execl(g_self, g_self, "rank", (char *)NULL);
    perror("test_nccl: exec");
    return 1;
}

static int run_group(int world) {
    dist_group g = {.world = world, .one_machine = true, .timeout = "60", .env_name = "ACCEL_DIST_BACKEND",
                    .env_value = "nccl", .kill_after_s = 120};
    return dist_group_runs_ok(&g, exec_rank, "nccl, %d ranks", world) ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "rank")) return rank_main();
#if !defined(ACCEL_HAVE_NCCL)
    (void)run_group;
    printf("SKIP: this build has no NCCL process-group backend (no CUDA toolkit or no NCCL found)\n");
    return SKIP;
#else
    ssize_t len = readlink("/proc/self/exe", g_self, sizeof g_self - 1);
    if (len <= 0) return perror("readlink /proc/self/exe"), 1;
    g_self[len] = 0;
    /* The parent only counts the GPUs: every rank is a new process. */
    int gpus = accel_device_count(ACCEL_DEV_CUDA);
    if (gpus == 0) {
        printf("SKIP: no CUDA device: %s\n", accel__plugin_unavailable_reason(ACCEL_DEV_CUDA));
        return SKIP;
    }
    bool multi = argc > 1 && !strcmp(argv[1], "multi");
    if (multi && gpus < 2) {
        printf("SKIP: %d GPU: the multi-rank NCCL test needs 2 or more (NCCL allows one rank per GPU)\n", gpus);
        return SKIP;
    }
    int world = multi ? (gpus < DIST_GROUP_MAX ? gpus : DIST_GROUP_MAX) : 1;
    printf("test_nccl: %d rank%s over %d GPU%s\n", world, world > 1 ? "s" : "", gpus, gpus > 1 ? "s" : "");
    return run_group(world);
#endif
}
