/* The ZeRO-3 / FSDP FULL_SHARD strategy (strategy.h): zero3.c's per-unit
 * layout, gathers and reductions, zero.c's sharded optimizer, and
 * zero3_checkpoint.c's sharded and gathered checkpoints. */
#include "accelerator_internal.h"
#include "zero3.h"
#include "strategy.h"

static accel_status zero3_layout(accel_accelerator *acc, accel__model *pm) {
    accel_status st = accel__zero_model_new(pm);
    return st ? st : accel__zero3_layout(acc, pm);
}

static accel_status zero3_release(accel_accelerator *acc, accel__model *pm) {
    accel_status st = accel__zero_of(pm) ? accel__zero3_release(acc, pm) : ACCEL_OK;
    accel__zero_model_free(pm);
    return st;
}

/* Every backward, accumulating or not: stage 3 keeps no full gradients
 * between micro-batches, so each unit's are reduced as they finish. */
static bool zero3_begin_backward(accel_accelerator *acc, accel__model *pm) {
    accel__zero3_begin_backward(acc, pm);
    return true;
}

/* The full gradient buffers are unmapped after each reduction (touching them
 * would fault on a device, or bring the pages back on the cpu): the shard only. */
static accel_status zero3_zero_grad(accel_accelerator *acc, accel__model *pm) {
    accel__zero_model *zm = accel__zero_of(pm);
    (void)acc;
    accel_tensor h;
    int64_t n = zm->zn;
    if (!zm->zgrad) return ACCEL_OK;
    accel__tensor_header(&h, zm->zgrad, ACCEL_F32, 1, &n, zm->zdev);
    return accel_zero_(&h);
}

static accel_status zero3_shard_range(accel_accelerator *acc, accel__model *pm, int64_t *lo, int64_t *hi) {
    (void)acc, (void)pm, (void)lo, (void)hi;
    return accel_set_error(ACCEL_ERR_STATE, "accel_accelerator_zero_shard: under ZeRO stage 3 a rank's shard is "
                           "one piece per wrap unit, not one range");
}

/* SHARDED_STATE_DICT: every rank its shard under dir/optimizer_<i>/; under
 * FULL_STATE_DICT, and under tensor parallelism (whose checkpoints hold
 * whole tensors), the consolidated file, as under stage 2. */
static accel_status zero3_save_optimizer(accel_accelerator *acc, int i, const char *dir, bool failed, bool *own) {
    *own = !acc->fsdp.full_state_dict && acc->mesh.size[ACCEL__MESH_TP] == 1;
    return *own ? accel__zero3_save_optimizer_state(acc, i, dir, failed) : ACCEL_OK;
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
    .pass_begin = accel__zero3_pass_begin,
    .prepare_optimizer = accel__zero_prepare_optimizer,
    .optimizer_model = accel__zero_optimizer_model,
    .user_param = accel__zero_user_param,
    .release_optimizer = accel__zero_release_optimizer,
    .after_step = accel__zero3_after_step,
    .zero_grad = zero3_zero_grad,
    .shard_range = zero3_shard_range,
    .grad_shard = accel__zero_grad_shard,
    .sp_reduce = accel__zero3_sp_reduce,
    .clip = accel__zero_clip,
    .save_state = accel__zero3_save_model_state,
    .load_state = accel__zero3_load_model_state,
    .save_model = accel__zero3_save_model,
    .saved_dtype = accel__zero3_saved_dtype,
    .refuse_foreign = accel__zero3_refuse_sharded,
    .optimizer_state = accel__zero_state,
    .load_optimizer_state = accel__zero_load_state,
    .check_optimizer_state = accel__zero_check_state,
    .save_optimizer = zero3_save_optimizer,
    .load_optimizer = accel__zero3_load_optimizer_state,
    .has_own_optimizer = accel__zero3_has_optimizer_shards,
    .check_own_optimizer = accel__zero3_check_optimizer_shards,
};
