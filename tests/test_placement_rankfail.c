/* Device placement failing on one rank alone (its device full), under
 * `accel launch --num_processes 2` on hostless:0 (accelerator.cmake; plainly
 * the one process fails): prepare fails on every rank, the others naming
 * another rank, before any of the prepare's collectives, so a retry on every
 * rank places the model and a DDP step runs. Before, the other ranks went on
 * into the weights' broadcast alone and the retry met them there: the group
 * was broken ("mismatched collectives") and no retry could succeed. Also
 * the host copy that stages the weights' broadcast (the device's memory is
 * not the group's to read) failing on one rank alone: every rank fails
 * naming it, and a retry trains. The other local steps of prepare:
 * test_prepare_rankfail.c. */
#include <stdio.h>
#include <string.h>

#include "accel/accel.h"
#include "accel/accelerator.h"
#include "backends/hostless/hostless.h"
#include "check.h"
#include "refuse_band.h"

/* The launch's accelerator on hostless:0, its device, rank and world; NULL
 * when the run is not on hostless (nothing to test then). */
static accel_accelerator *accelerator_on_hostless(accel_device *dev, int *rank, int *world) {
    accel_accelerator *acc = accel_accelerator_new(NULL);
    CHECK(acc != NULL);
    if (!acc) return NULL;
    *dev = accel_accelerator_device(acc);
    if (dev->type != ACCEL_DEV_HOSTLESS) {
        accel_accelerator_free(acc);
        return NULL;
    }
    *rank = accel_accelerator_process_index(acc), *world = accel_accelerator_num_processes(acc);
    return acc;
}

static void test_one_rank_placement_fails(void) {
    accel_device dev;
    int rank, world;
    accel_accelerator *acc = accelerator_on_hostless(&dev, &rank, &world);
    if (!acc) return;
    accel_module *m = accel_linear_new(4, 3, true, ACCEL_CPU_DEVICE, ACCEL_F32);
    if (rank == world - 1) accel__hostless_alloc_fail_at(2); /* the bias: half-way through */
    accel_status st = accel_accelerator_prepare(acc, m, NULL);
    accel__hostless_alloc_fail_at(0);
    CHECK_MSG(st == ACCEL_ERR_OOM, "rank %d: prepare -> %d: %s", rank, (int)st, accel_last_error());
    CHECK_MSG(rank == world - 1 ? strstr(accel_last_error(), "injected") != NULL
                                : strstr(accel_last_error(), "another rank") != NULL,
              "rank %d: %s", rank, accel_last_error());
    st = accel_accelerator_prepare(acc, m, NULL);
    CHECK_MSG(st == ACCEL_OK, "rank %d: the retry: %s", rank, accel_last_error());
    accel_tensor *w = accel_module_get_tensor(m, "weight");
    CHECK(w && accel_device_eq(w->device, dev));
    float xs[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    accel_tensor *x = accel_to_device(accel_from_floats(ACCEL_SHAPE(2, 4), xs), dev);
    accel_tensor *loss = accel_mean_all(accel_module_call(m, x));
    CHECK_MSG(loss && accel_accelerator_backward(acc, loss) == ACCEL_OK, "rank %d: %s", rank, accel_last_error());
    accel_step_reset();
    accel_accelerator_free(acc);
    accel_module_free(m);
}

/* The Linear's flat f32 buffer: 96 x 32 + 32 floats (each parameter a
 * whole number of 64-byte lines: no padding), 12416 bytes, staged whole for
 * the broadcast: pinned memory refused, then the pageable fallback of that
 * size (the last rank alone). */
static void test_one_rank_staging_fails(void) {
    accel_device dev;
    int rank, world;
    accel_accelerator *acc = accelerator_on_hostless(&dev, &rank, &world);
    if (!acc) return;
    accel_module *m = accel_linear_new(96, 32, true, ACCEL_CPU_DEVICE, ACCEL_F32);
    refuse_band band = {.min = 12416, .max = 12417};
    if (rank == world - 1) {
        accel__hostless_host_fail_next(1000);
        refuse_band_install(&band);
    }
    accel_status st = accel_accelerator_prepare(acc, m, NULL);
    if (rank == world - 1) {
        refuse_band_install(NULL);
        accel__hostless_host_fail_next(0);
    }
    CHECK_MSG(rank != world - 1 || band.refused, "the staging allocation never came");
    const char *what = "copy the weights to host memory for their broadcast";
    char want[256];
    if (rank == world - 1) snprintf(want, sizeof want, "rank %d could not %s", rank, what);
    else snprintf(want, sizeof want, "another rank (%d) could not %s", world - 1, what);
    CHECK_MSG(st == ACCEL_ERR_OOM && strstr(accel_last_error(), want), "rank %d: prepare -> %d: %s", rank, (int)st,
              accel_last_error());
    accel_accelerator_unprepare_model(acc, m);
    st = accel_accelerator_prepare(acc, m, NULL);
    CHECK_MSG(st == ACCEL_OK, "rank %d: the retry: %s", rank, accel_last_error());
    float xs[192];
    for (int i = 0; i < 192; i++) xs[i] = (float)(i % 7);
    accel_tensor *x = accel_to_device(accel_from_floats(ACCEL_SHAPE(2, 96), xs), dev);
    accel_tensor *loss = accel_mean_all(accel_module_call(m, x));
    CHECK_MSG(loss && accel_accelerator_backward(acc, loss) == ACCEL_OK, "rank %d: %s", rank, accel_last_error());
    accel_step_reset();
    accel_accelerator_free(acc);
    accel_module_free(m);
}

int main(void) {
    RUN(test_one_rank_placement_fails);
    RUN(test_one_rank_staging_fails);
    return check_summary();
}
