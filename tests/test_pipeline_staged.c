/* A pipeline whose stages hold different tensors, with the weights'
 * broadcast staged through host memory (a device the group cannot read:
 * hostless:0 here, CUDA alike). `accel launch --num_processes 4` with pp 2 x
 * dp 2 (accelerator.cmake); a tiny Llama whose layer 3 (stage 1) carries a
 * bf16 parameter of its own, different on every rank, so stage 1 flattens
 * an f32 and a bf16 buffer and stage 0 an f32 one. The staged broadcast
 * agrees on each of its local steps; over every rank those agreements of
 * stage 1's bf16 buffer met stage 0's next collectives, so the prepare's
 * collectives paired wrongly and the first step timed out. Now they are
 * agreed over the data-parallel group: prepare succeeds on every rank,
 * stage 1's replicas hold their dp rank 0's (rank 2's) parameter, and a
 * pipeline step runs on all four. And one rank of stage 1 failing to stage
 * it: every rank fails naming that rank, and a retry trains. Run plainly (or
 * not on hostless) it checks nothing and says so. */
#include <stdio.h>

#include "accel/accel.h"
#include "backends/hostless/hostless.h"
#include "check.h"
#include "pipeline_model.h"
#include "refuse_band.h"

#define T 8

/* The launch's pp 2 x dp 2 accelerator on hostless, or NULL (nothing to check: said why). */
static accel_accelerator *mesh_on_hostless(void) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.parallelism.pp_size = 2;
    o.parallelism.dp_replicate_size = 2;
    o.parallelism.num_micro_batches = 2;
    accel_accelerator *acc = accel_accelerator_new(&o);
    if (!acc) { /* not under a 4-process launch */
        printf("  not 4 processes (%s): nothing checked\n", accel_last_error());
        accel_clear_error();
        return NULL;
    }
    if (accel_accelerator_device(acc).type != ACCEL_DEV_HOSTLESS) {
        printf("  not on hostless: nothing checked\n");
        accel_accelerator_free(acc);
        return NULL;
    }
    return acc;
}

/* The tiny Llama with layer 3's bf16 parameter "scale" of `n` elements, rank-dependent. */
static accel_module *model_with_scale(int rank, int64_t n) {
    accel_module *model = pipeline_llama((pipeline_model){.seed = 3, .vocab = 40, .hidden = 32, .ffn = 64,
                                                          .positions = 16, .layers = 4, .heads = 4, .kv_heads = 2});
    accel_module *layer3 = accel_module_find(model, "model.layers.3");
    accel_tensor *scale = accel_tensor_new(ACCEL_BF16, 1, &n, ACCEL_CPU_DEVICE);
    CHECK(layer3 && scale);
    uint16_t *bits = scale->data;
    for (int64_t i = 0; i < n; i++) bits[i] = (uint16_t)(0x3f80 + 16 * rank + i % 16); /* 1 + rank / 8 + (i % 16) / 128 */
    CHECK_MSG(accel_module_add_param(layer3, "scale", scale) != NULL, "%s", accel_last_error());
    return model;
}

/* Stage 1's replicas hold rank 2's scale; a pipeline step runs. */
static void check_prepared(accel_accelerator *acc, accel_module *model, int rank) {
    int stage = rank / 2, replica = rank % 2;
    if (stage == 1) { /* dp rank 0 of stage 1 is rank 2 */
        accel_tensor *placed = accel_module_get_tensor(model, "model.layers.3.scale");
        accel_tensor *host = placed ? accel_to_device(placed, ACCEL_CPU_DEVICE) : NULL;
        CHECK(host != NULL);
        const uint16_t *v = host ? host->data : NULL;
        for (int64_t i = 0; v && i < accel_numel(host); i++)
            CHECK_MSG(v[i] == 0x3f80 + 16 * 2 + i % 16, "rank %d: scale[%lld] is 0x%04x, not rank 2's", rank,
                      (long long)i, v[i]);
    }
    double loss = 0;
    accel_tensor *ids = accel_to_device(pipeline_batch(0, replica * 4, 4, T, 40), accel_accelerator_device(acc));
    accel_status st = accel_accelerator_pipeline_step(acc, model, ids, &loss, NULL);
    CHECK_MSG(st == ACCEL_OK, "rank %d: pipeline step: %s", rank, accel_last_error());
    accel_step_reset();
}

static void test_stages_with_different_buffers(void) {
    accel_accelerator *acc = mesh_on_hostless();
    if (!acc) return;
    int rank = accel_accelerator_process_index(acc);
    accel_module *model = model_with_scale(rank, 4);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_SGD, 0.1);
    accel_optimizer *opt = accel_optimizer_new_module(ACCEL_OPTIM_SGD, model, &h);
    accel_status st = accel_accelerator_prepare(acc, model, opt);
    CHECK_MSG(st == ACCEL_OK, "rank %d (stage %d): prepare: %s", rank, rank / 2, accel_last_error());
    if (st == ACCEL_OK) check_prepared(acc, model, rank);
    accel_accelerator_free(acc);
    accel_optimizer_free(opt);
    accel_module_free(model);
}

/* Rank 2 (stage 1's dp rank 0) cannot stage the bf16 buffer (pinned memory
 * refused, then its pageable fallback: the 777-element buffer's size picks
 * it): every rank's prepare fails, rank 3 learning it in its group's
 * agreement, ranks 0 and 1 in the agreement over every rank, all naming
 * rank 2 (not the highest rank of its group, which passes it on); a retry
 * prepares and steps. */
static void test_one_rank_of_a_stage_fails(void) {
    accel_accelerator *acc = mesh_on_hostless();
    if (!acc) return;
    int rank = accel_accelerator_process_index(acc);
    accel_module *model = model_with_scale(rank, 777);
    refuse_band band = {.min = 777 * 2, .max = 800 * 2};
    if (rank == 2) {
        accel__hostless_host_fail_next(1000);
        refuse_band_install(&band);
    }
    accel_status st = accel_accelerator_prepare(acc, model);
    if (rank == 2) {
        refuse_band_install(NULL);
        accel__hostless_host_fail_next(0);
        CHECK_MSG(band.refused, "the staging allocation never came");
    }
    const char *want = rank == 2   ? "rank 2 could not copy the weights to host memory for their broadcast"
                       : rank == 3 ? "another rank (2) could not copy the weights to host memory for their broadcast"
                                   : "another rank (2) could not broadcast the weights";
    CHECK_MSG(st == ACCEL_ERR_OOM && strstr(accel_last_error(), want), "rank %d: prepare -> %d: %s", rank, (int)st,
              accel_last_error());
    accel_accelerator_unprepare_model(acc, model);
    st = accel_accelerator_prepare(acc, model);
    CHECK_MSG(st == ACCEL_OK, "rank %d: the retry: %s", rank, accel_last_error());
    if (st == ACCEL_OK) check_prepared(acc, model, rank);
    accel_accelerator_free(acc);
    accel_module_free(model);
}

int main(void) {
    RUN(test_stages_with_different_buffers);
    RUN(test_one_rank_of_a_stage_fails);
    accel_thread_cleanup();
    return check_summary();
}
