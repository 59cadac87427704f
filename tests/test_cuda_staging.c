/* The host staging pool on a GPU (ctest label gpu; without one it prints the
 * reason and exits 77, reported as skipped): leases for cuda are pinned
 * (cudaHostAlloc through the backend's host_alloc), a safetensors tensor of
 * many chunks loads onto cuda:0 through the double-buffered asynchronous
 * copies (f32 as is, and converted to bf16) equal to the cpu, a save from
 * cuda:0 reads back equal, and staged collectives on cuda:0 tensors through
 * a one-process group give the input back. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "accel/accel.h"
#include "accel/dist.h"
#include "accelerator/accelerator_internal.h" /* the staged collectives */
#include "core/host_stage.h"
#include "check.h"
#include "cuda_skip.h"
#include "dispatch_fixture.h"

enum { CHUNK = 64 << 10 };
static const accel_device G0 = {ACCEL_DEV_CUDA, 0};
static char g_dir[64];

static void test_leases_are_pinned(void) {
    void *p = accel__stage_acquire(G0, CHUNK, "test");
    CHECK(p != NULL);
    CHECK(p && cuda_hooks()->host_pinned(p));
    accel__stage_release(G0, p);
}

static void test_load_and_save_through_chunks(void) {
    char path[128];
    snprintf(path, sizeof path, "%s/w.safetensors", g_dir);
    const int64_t n = 9 * CHUNK / 4 + 13; /* f32: 9 chunks and a bit; bf16 on the device: 4.5 */
    accel_tensor *w = accel_tensor_clone_persistent(accel_mul_scalar(accel_arange(ACCEL_F32, 0, n), 0.37),
                                                    ACCEL_CPU_DEVICE);
    const char *name = "w";
    CHECK(accel_safetensors_save(path, 1, &name, &w, 0, NULL) == ACCEL_OK);
    accel_safetensors *st = accel_safetensors_open(path);
    accel_tensor *f = accel_tensor_new(ACCEL_F32, 1, &n, G0), *b = accel_tensor_new(ACCEL_BF16, 1, &n, G0);
    accel_tensor *want_b = accel_tensor_clone_persistent(accel_to_dtype(w, ACCEL_BF16), ACCEL_CPU_DEVICE);
    for (int r = 0; r < 3 && st; r++) { /* the same leases every time */
        CHECK_MSG(accel_safetensors_load_into(st, "w", f) == ACCEL_OK, "%s", accel_last_error());
        CHECK_MSG(accel_safetensors_load_into(st, "w", b) == ACCEL_OK, "%s", accel_last_error());
        CHECK(max_diff(f, w) == 0 && max_diff(b, want_b) == 0);
    }
    accel_safetensors_close(st);
    CHECK(accel_safetensors_save(path, 1, &name, &b, 0, NULL) == ACCEL_OK);
    st = accel_safetensors_open(path);
    accel_tensor *back = st ? accel_safetensors_tensor(st, "w", -1) : NULL;
    CHECK(back && back->dtype == ACCEL_BF16 && max_diff(back, want_b) == 0);
    accel_tensor_free(back);
    accel_safetensors_close(st);
    accel_tensor_free(f);
    accel_tensor_free(b);
    accel_tensor_free(want_b);
    accel_tensor_free(w);
    accel_step_reset();
}

static void test_staged_collectives(void) {
    CHECK_MSG(accel_dist_init() == ACCEL_OK, "%s", accel_last_error());
    accel_pg *pg = accel_dist_default_group();
    const int64_t n = 3 * CHUNK;
    accel_tensor *want = accel_tensor_clone_persistent(accel_arange(ACCEL_F32, 0, n), ACCEL_CPU_DEVICE);
    accel_tensor *t = accel_tensor_clone_persistent(want, G0), *all = accel_tensor_new(ACCEL_F32, 1, &n, G0);
    for (int step = 0; step < 3 && pg; step++) {
        CHECK(accel__staged_broadcast(pg, t, 0) == ACCEL_OK);
        CHECK(accel__staged_all_reduce(pg, t, ACCEL_REDUCE_SUM) == ACCEL_OK);
        CHECK(accel__staged_all_gather(pg, t, all) == ACCEL_OK);
    }
    CHECK(max_diff(t, want) == 0 && max_diff(all, want) == 0);
    accel_tensor_free(t);
    accel_tensor_free(all);
    accel_tensor_free(want);
    accel_dist_finalize();
}

int main(void) {
    if (!cuda_present_or_say_why()) return CUDA_SKIP;
    accel__stage_set_chunk_bytes(CHUNK);
    snprintf(g_dir, sizeof g_dir, "/tmp/accel_cudastage_XXXXXX");
    CHECK(mkdtemp(g_dir) != NULL);
    RUN(test_leases_are_pinned);
    RUN(test_load_and_save_through_chunks);
    RUN(test_staged_collectives);
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    CHECK(system(cmd) == 0);
    accel_thread_cleanup();
    return check_summary();
}
