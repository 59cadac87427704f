/* The ZeRO-3 / FSDP FULL_SHARD strategy (strategy.h): zero3.c's per-unit
 * layout, gathers and reductions, zero.c's sharded optimizer, and
 * zero3_checkpoint.c's sharded and gathered checkpoints. */
#include "accelerator_internal.h"
#include "zero3.h"
#include "strategy.h"

static accel_status zero3_layout(accel_accelerator *acc, accel__model *pm) {
    pm->zdev = pm->fp->buffers[ACCEL_F32].device;
    return accel__zero3_layout(acc, pm);
}

static void zero3_release(accel_accelerator *acc, accel__model *pm) {
    accel__zero3_release(acc, pm);
    accel__zero_units_free(pm);
}

/* Every backward, accumulating or not: stage 3 keeps no full gradients
 * between micro-batches, so each unit's are reduced as they finish. */
static bool zero3_begin_backward(accel_accelerator *acc, accel__model *pm) {
    accel__zero3_begin_backward(acc, pm);
    return true;
}

/* The full gradient buffers are dropped after each reduction (touching them
 * would bring the pages back): the shard only. */
static void zero3_zero_grad(accel_accelerator *acc, accel__model *pm) {
    (void)acc;
    accel_tensor h;
    int64_t n = pm->zn;
    if (!pm->zgrad) return;
    accel__tensor_header(&h, pm->zgrad, ACCEL_F32, 1, &n, pm->zdev);
    accel_zero_(&h);
}

static accel_status zero3_shard_range(accel_accelerator *acc, accel__model *pm, int64_t *lo, int64_t *hi) {
    (void)acc, (void)pm, (void)lo, (void)hi;
    return accel_set_error(ACCEL_ERR_STATE, "accel_accelerator_zero_shard: under ZeRO stage 3 a rank's shard is "
                           "one piece per wrap unit, not one range");
}

const accel__strategy accel__strategy_zero3 = {
    .name = "zero3",
    .stage = 3,
    .shards = true,
    .layout = zero3_layout,
    .start = accel__zero3_start,
    .release = zero3_release,
    .begin_backward = zero3_begin_backward,
    .grad_ready = accel__zero3_grad_ready,
    .end_backward = accel__zero3_end_backward,
    .prepare_optimizer = accel__zero_prepare_optimizer,
    .release_optimizer = accel__zero_release_optimizer,
    .after_step = accel__zero3_after_step,
    .zero_grad = zero3_zero_grad,
    .shard_range = zero3_shard_range,
    .save_state = accel__zero3_save_model_state,
    .load_state = accel__zero3_load_model_state,
    .save_model = accel__zero3_save_model,
    .saved_dtype = accel__zero3_saved_dtype,
};
