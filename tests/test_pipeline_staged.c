/* A pipeline whose stages hold different tensors, with the weights'
 * broadcast staged through host memory (a device the group cannot read:
 * hostless:0 here, CUDA alike). `accel launch --num_processes 4` with pp 2 x
 * dp 2 (accelerator.cmake); a tensor-parallel-free tiny Llama whose layer 0
 * (stage 0) carries a buffer of its own, different on every rank. The
 * staged broadcast agrees on each of its local steps; over every rank those
 * agreements of stage 0's buffer met stage 1's next collectives (stage 1
 * holds no such buffer), so the prepare's collectives paired wrongly. Now
 * they are agreed over the data-parallel group: prepare succeeds on every
 * rank, stage 0's replicas hold their dp rank 0's buffer, and a pipeline
 * step runs on all four. Run plainly (or not on hostless) it checks nothing
 * and says so. */
#include <stdio.h>

#include "accel/accel.h"
#include "check.h"
#include "pipeline_model.h"

#define T 8

static void test_stages_with_different_buffers(void) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.parallelism.pp_size = 2;
    o.parallelism.dp_replicate_size = 2;
    o.parallelism.num_micro_batches = 2;
    accel_accelerator *acc = accel_accelerator_new(&o);
    if (!acc) { /* not under a 4-process launch */
        printf("  not 4 processes (%s): nothing checked\n", accel_last_error());
        accel_clear_error();
        return;
    }
    accel_device dev = accel_accelerator_device(acc);
    int rank = accel_accelerator_process_index(acc), stage = rank / 2, replica = rank % 2;
    if (dev.type != ACCEL_DEV_HOSTLESS) {
        printf("  not on hostless: nothing checked\n");
        accel_accelerator_free(acc);
        return;
    }
    accel_module *model = pipeline_llama((pipeline_model){.seed = 3, .vocab = 40, .hidden = 32, .ffn = 64,
                                                          .positions = 16, .layers = 4, .heads = 4, .kv_heads = 2});
    /* layer 3 (stage 1) gets a bf16 parameter: stage 1 flattens an f32 and a bf16 buffer, stage 0 an f32 one */
    accel_module *layer3 = accel_module_find(model, "model.layers.3");
    CHECK(layer3 != NULL);
    accel_tensor *scale = accel_tensor_new(ACCEL_BF16, 1, (int64_t[]){4}, ACCEL_CPU_DEVICE);
    CHECK(scale != NULL);
    uint16_t *bits = scale->data;
    for (int i = 0; i < 4; i++) bits[i] = (uint16_t)(0x3f80 + 16 * rank + i); /* 1.0 + rank / 8 + i / 128 */
    CHECK_MSG(accel_module_add_param(layer3, "scale", scale) != NULL, "%s", accel_last_error());
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_SGD, 0.1);
    accel_optimizer *opt = accel_optimizer_new_module(ACCEL_OPTIM_SGD, model, &h);
    accel_status st = accel_accelerator_prepare(acc, model, opt);
    CHECK_MSG(st == ACCEL_OK, "rank %d (stage %d): prepare: %s", rank, stage, accel_last_error());
    if (st == ACCEL_OK && stage == 1) { /* dp rank 0 of stage 1 is rank 2 */
        accel_tensor *placed = accel_module_get_tensor(model, "model.layers.3.scale");
        accel_tensor *host = placed ? accel_to_device(placed, ACCEL_CPU_DEVICE) : NULL;
        CHECK(host != NULL);
        const uint16_t *v = host ? host->data : NULL;
        for (int i = 0; v && i < 4; i++)
            CHECK_MSG(v[i] == 0x3f80 + 16 * 2 + i, "rank %d: scale[%d] is 0x%04x, not rank 2's", rank, i, v[i]);
    }
    if (st == ACCEL_OK) {
        double loss = 0;
        accel_tensor *ids = accel_to_device(pipeline_batch(0, replica * 4, 4, T, 40), dev);
        st = accel_accelerator_pipeline_step(acc, model, ids, &loss, NULL);
        CHECK_MSG(st == ACCEL_OK, "rank %d: pipeline step: %s", rank, accel_last_error());
    }
    accel_step_reset();
    accel_accelerator_free(acc);
    accel_optimizer_free(opt);
    accel_module_free(model);
}

int main(void) {
    RUN(test_stages_with_different_buffers);
    accel_thread_cleanup();
    return check_summary();
}
