/* Device placement failing on one rank alone (its device full), under
 * `accel launch --num_processes 2` on hostless:0 (accelerator.cmake; plainly
 * the one process fails): prepare fails on every rank, the others naming
 * another rank, before any of the prepare's collectives, so a retry on every
 * rank places the model and a DDP step runs. Before, the other ranks went on
 * into the weights' broadcast alone and the retry met them there: the group
 * was broken ("mismatched collectives") and no retry could succeed. The
 * flat parameter buffers failing on one rank (on the cpu, launched without
 * hostless: accelerator.cmake) likewise. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"
#include "accel/accelerator.h"
#include "backends/hostless/hostless.h"
#include "check.h"

static void test_one_rank_placement_fails(void) {
    accel_accelerator *acc = accel_accelerator_new(NULL);
    CHECK(acc != NULL);
    if (!acc) return;
    accel_device dev = accel_accelerator_device(acc);
    if (dev.type != ACCEL_DEV_HOSTLESS) {
        accel_accelerator_free(acc);
        return;
    }
    int rank = accel_accelerator_process_index(acc), world = accel_accelerator_num_processes(acc);
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

/* Refuses every allocation of 1 MiB or more: the flat buffers of the test's 512 x 512 Linear. */
static void *refuse_mib(void *ctx, size_t bytes, size_t align) {
    (void)ctx;
    void *p = NULL;
    if (bytes >= ((size_t)1 << 20) || posix_memalign(&p, align < sizeof(void *) ? sizeof(void *) : align, bytes))
        return NULL;
    return p;
}

static void free_mib(void *ctx, void *p) {
    (void)ctx;
    free(p);
}

/* The model's flat parameter buffers out of memory on one rank alone (on any
 * device; on the cpu the allocator refuses them): prepare fails on every
 * rank, the others naming another rank, before the layout's and the
 * broadcast's collectives (before, they went on into the broadcast and
 * waited there for the distributed timeout), and a retry on every rank
 * prepares the model. */
static void test_one_rank_flatten_fails(void) {
    accel_accelerator *acc = accel_accelerator_new(NULL);
    CHECK(acc != NULL);
    if (!acc) return;
    accel_device dev = accel_accelerator_device(acc);
    int rank = accel_accelerator_process_index(acc), world = accel_accelerator_num_processes(acc);
    accel_module *m = accel_linear_new(512, 512, true, ACCEL_CPU_DEVICE, ACCEL_F32);
    bool refused = rank == world - 1 && dev.type == ACCEL_DEV_CPU;
    if (refused) accel_set_allocator(&(accel_allocator){refuse_mib, free_mib, NULL});
    accel_status st = accel_accelerator_prepare(acc, m, NULL);
    if (refused) accel_set_allocator(NULL);
    if (dev.type == ACCEL_DEV_CPU) {
        CHECK_MSG(st == ACCEL_ERR_OOM, "rank %d: prepare -> %d: %s", rank, (int)st, accel_last_error());
        CHECK_MSG(refused ||
                      strstr(accel_last_error(), "another rank could not make the model's flat parameter") != NULL,
                  "rank %d: %s", rank, accel_last_error());
        st = accel_accelerator_prepare(acc, m, NULL);
    }
    CHECK_MSG(st == ACCEL_OK, "rank %d: the retry: %s", rank, accel_last_error());
    float xs[1024];
    for (int i = 0; i < 1024; i++) xs[i] = (float)(i % 7) * 0.1f;
    accel_tensor *x = accel_to_device(accel_from_floats(ACCEL_SHAPE(2, 512), xs), dev);
    accel_tensor *loss = accel_mean_all(accel_module_call(m, x));
    CHECK_MSG(loss && accel_accelerator_backward(acc, loss) == ACCEL_OK, "rank %d: %s", rank, accel_last_error());
    accel_step_reset();
    accel_accelerator_free(acc);
    accel_module_free(m);
}

int main(void) {
    RUN(test_one_rank_placement_fails);
    RUN(test_one_rank_flatten_fails);
    return check_summary();
}
