/* ZeRO-3 (FSDP FULL_SHARD) on a device saves device memory, and its steps
 * allocate nothing (ctest runs it on hostless:0 under `accel launch
 * --num_processes 2` and 3). A model of L equal Linear units trains a few
 * steps (run plainly: one process, on hostless:0 too); the hostless backend counts its device bytes (persistent
 * allocations and mapped virtual memory). Between steps a rank holds its
 * shards (parameters, averaged gradients, AdamW's two moments: 4 x params/N)
 * and no unit's full parameters or gradients; within a step, at most a few
 * units gathered with their gradients. Full buffers that stayed allocated
 * (2 x params on every rank) exceed both bounds. After the first step no
 * step calls the allocator (the gather landing and host staging buffers
 * are made at prepare). */
#include <stdio.h>
#include <stdlib.h>

#include "accel/accel.h"
#include "accel/accelerator.h"
#include "backends/backend.h"
#include "check.h"
#include "count_alloc.h"

enum { L = 8, H = 256, MB = 4, STEPS = 4 };

static accel_module *stack(accel_device dev) {
    accel_module *l[L];
    for (int i = 0; i < L; i++) l[i] = accel_linear_new(H, H, true, dev, ACCEL_F32);
    return accel_sequential_new(L, l);
}

/* Fixed features or targets [MB, H] for rank r, on dev: persistent, every step reads them. */
static accel_tensor *data(int r, int salt, accel_device dev) {
    float x[MB * H];
    for (int i = 0; i < MB * H; i++) x[i] = (float)((i * 7 + r * 5 + salt * 3) % 13) / 13.0f - 0.5f;
    accel_tensor *t = accel_tensor_new(ACCEL_F32, 2, (int64_t[]){MB, H}, dev);
    CHECK(t && accel_copy_(t, accel_from_floats(ACCEL_SHAPE(MB, H), x)) == ACCEL_OK);
    return t;
}

static size_t in_use(void) { return accel__hostless_memory_stats(0).in_use; }

static void test_memory_and_allocations(void) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.zero_stage = 3;
    accel_accelerator *acc = accel_accelerator_new(&o);
    CHECK_MSG(acc != NULL, "%s", accel_last_error());
    if (!acc) return;
    accel_device dev = accel_accelerator_device(acc);
    CHECK_MSG(dev.type == ACCEL_DEV_HOSTLESS, "run on hostless:0 (ACCEL_DEFAULT_DEVICE)");
    int n = accel_accelerator_num_processes(acc), r = accel_accelerator_process_index(acc);
    accel_tensor *x = data(r, 0, dev), *y = data(r, 1, dev);
    size_t base = in_use();
    accel_manual_seed(7);
    accel_module *model = stack(dev);
    accel_tensor **ps;
    int np = accel_module_parameters(model, &ps);
    double params = 0; /* bytes */
    for (int i = 0; i < np; i++) params += (double)accel_nbytes(ps[i]);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 1e-3);
    accel_optimizer *opt = accel_optimizer_new_params(ACCEL_OPTIM_ADAMW, np, ps, &h);
    accel_free(ps);
    CHECK_MSG(accel_accelerator_prepare(acc, model, opt, NULL, NULL) == ACCEL_OK, "%s", accel_last_error());
    /* A unit's full range: its parameters, padded to the device's mapping granule. */
    double unit = params / L + 64 * 1024;
    double shards = 4 * params / n + 2 * L * 1024.0; /* params, grads, two moments; each unit's piece padded */
    double after_prepare = (double)(in_use() - base);
    double between = 0, peak = 0, first = 0, last = 0;
    long steady_allocs = 0;
    for (int s = 0; s < STEPS; s++) {
        long before = n_allocs;
        accel__hostless_reset_peak(0);
        accel_tensor *loss = accel_mse_loss(accel_module_call(model, x), y);
        CHECK_MSG(loss != NULL, "step %d: %s", s + 1, accel_last_error());
        if (!loss) break;
        *(s ? &last : &first) = accel_item(loss);
        CHECK_MSG(accel_accelerator_backward(acc, loss) == ACCEL_OK, "%s", accel_last_error());
        CHECK_MSG(accel_accelerator_optimizer_step(acc, opt) == ACCEL_OK, "%s", accel_last_error());
        CHECK(accel_accelerator_zero_grad(acc, opt) == ACCEL_OK);
        accel_step_reset();
        if (s == 0) continue;
        steady_allocs += n_allocs - before;
        double now = (double)(in_use() - base), top = (double)(accel__hostless_memory_stats(0).peak - base);
        between = now > between ? now : between;
        peak = top > peak ? top : peak;
    }
    CHECK_MSG(last < first, "it trains: loss %g -> %g", first, last);
    if (r == 0)
        printf("zero3 device memory world=%d params=%.0f B: after prepare %.0f B, between steps %.0f B, step peak %.0f B "
               "(shards %.0f B, one unit %.0f B)\n",
               n, params, after_prepare, between, peak, shards, unit);
    CHECK_MSG(after_prepare <= shards, "after prepare: %.0f device bytes, want <= %.0f (the shards)", after_prepare,
              shards);
    CHECK_MSG(between <= shards, "between steps: %.0f device bytes, want <= %.0f (the shards, no unit gathered)",
              between, shards);
    CHECK_MSG(peak <= shards + 6 * unit, "step peak: %.0f device bytes, want <= %.0f (the shards + 3 units' "
              "parameters and gradients)", peak, shards + 6 * unit);
    CHECK_MSG(steady_allocs == 0, "steps 2..%d made %ld allocations", STEPS, steady_allocs);
    accel_accelerator_clear(acc);
    accel_optimizer_free(opt);
    accel_module_free(model);
    accel_accelerator_free(acc);
    CHECK_MSG(in_use() == base, "device bytes after free: %zu, before: %zu", in_use(), base);
    accel_tensor_free(x);
    accel_tensor_free(y);
}

int main(void) {
    if (!getenv("ACCEL_DEFAULT_DEVICE")) { /* run plainly: one process on hostless:0 */
        CHECK(accel__hostless_register(1) == ACCEL_OK);
        setenv("ACCEL_DEFAULT_DEVICE", "hostless:0", 1);
    }
    count_alloc_install();
    RUN(test_memory_and_allocations);
    accel_thread_cleanup();
    accel_set_allocator(NULL);
    return check_summary();
}
