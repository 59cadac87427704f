/* Pipeline parallelism: a small Llama trained over `pp_size` stages (one per
 * process) with 4 micro-batches per step, 1F1B by default:
 *     accel launch --num_processes 2 build/bin/pipeline_llama [1f1b|gpipe|interleaved]
 * (interleaved: 2 chunks of the 4 layers per stage, Megatron's virtual stages;
 * 2 or 4 processes, as the micro-batches must be a multiple of the stages)
 * Every stage gets the same batch; the loss (the batch's mean) is the same on
 * every stage. Prints, from the main process:
 *     stages=2 schedule=1f1b stage0_layers=[0,2) step=9 loss=...
 * Plainly (one process) it is gradient accumulation over the 4 micro-batches. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "accel/accel.h"
#include "accel/accelerator.h"

int main(int argc, char **argv) {
    const char *schedule = argc > 1 ? argv[1] : "1f1b";
    if (argc > 2 || (strcmp(schedule, "1f1b") && strcmp(schedule, "gpipe") && strcmp(schedule, "interleaved"))) {
        fprintf(stderr, "usage: pipeline_llama [1f1b|gpipe|interleaved]\n");
        return 2;
    }
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.parallelism.pp_size = accel_dist_world_size(); /* every process a stage */
    o.parallelism.num_micro_batches = 4;
    bool interleaved = !strcmp(schedule, "interleaved");
    o.parallelism.pp_schedule = schedule;
    o.parallelism.pp_virtual_stages = interleaved ? 2 : 0;
    accel_accelerator *acc = accel_accelerator_new(&o);
    if (!acc) {
        fprintf(stderr, "pipeline_llama: %s\n", accel_last_error());
        return 1;
    }
    accel_manual_seed(0); /* the same weights on every stage */
    accel_llama_config c = accel_llama_config_default();
    c.vocab_size = 64, c.hidden_size = 32, c.intermediate_size = 64, c.num_hidden_layers = 4;
    c.num_attention_heads = 4, c.num_key_value_heads = 2, c.max_position_embeddings = 32;
    c.torch_dtype = ACCEL_F32;
    accel_module *model = accel_llama_new(&c, ACCEL_CPU_DEVICE);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 3e-3);
    accel_optimizer *opt = accel_optimizer_new_module(ACCEL_OPTIM_ADAMW, model, &h);
    if (accel_accelerator_prepare(acc, model, opt) != ACCEL_OK) {
        fprintf(stderr, "pipeline_llama: %s\n", accel_last_error());
        return 1;
    }
    int64_t ids[8 * 16];
    double loss = 0;
    accel_pipeline_report rep = {0};
    for (int step = 0; step < 10; step++) {
        for (int i = 0; i < 8 * 16; i++) ids[i] = (i * 5 + (i / 16) * 3) % 64; /* a pattern to learn */
        accel_tensor *batch = accel_from_data(ACCEL_I64, ACCEL_SHAPE(8, 16), ids);
        bool ok = accel_accelerator_pipeline_step(acc, model, batch, &loss, &rep) == ACCEL_OK &&
                  !isnan(accel_accelerator_clip_grad_norm(acc, model, 1.0, 2.0)) && /* over all stages */
                  accel_accelerator_optimizer_step(acc, opt) == ACCEL_OK &&
                  accel_accelerator_zero_grad(acc, opt) == ACCEL_OK;
        if (!ok) {
            fprintf(stderr, "pipeline_llama: %s\n", accel_last_error());
            return 1;
        }
        accel_step_reset();
    }
    if (accel_accelerator_is_main_process(acc))
        printf("stages=%d schedule=%s stage0_layers=[%d,%d) step=9 loss=%.4f\n", rep.stages,
               o.parallelism.pp_schedule, rep.first_layer, rep.end_layer, loss);
    accel_optimizer_free(opt);
    accel_accelerator_free(acc);
    accel_module_free(model);
    return 0;
}
