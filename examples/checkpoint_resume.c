/* Checkpoints and resuming (seed 001: save_state / load_state):
 *     checkpoint_resume PROJECT_DIR [TOTAL_STEPS=20] [CRASH_AFTER]
 * Trains TOTAL_STEPS steps, saving the full state every 5 steps into
 * PROJECT_DIR/checkpoints/checkpoint_N (automatic naming, newest 3 kept). When
 * checkpoints exist it first loads the newest and continues from there; CRASH_AFTER
 * stops the run abruptly after that many steps, to try it:
 *     checkpoint_resume /tmp/run 20 12    # dies at step 12 (last checkpoint: step 10)
 *     checkpoint_resume /tmp/run 20       # resumes at step 10, prints the same final
 *                                         # loss as an uninterrupted run
 * Each save is logged at INFO on stderr (accel_get_logger, main process only),
 * the resume point and the final loss are printed on stdout (accelerator.print). */
#include <stdio.h>
#include <stdlib.h>

#include "accel/accel.h"
#include "accel/accelerator.h"
#include "example_args.h"

int main(int argc, char **argv) {
    long long total, crash; /* crash: -1, none */
    if (argc < 2 || argc > 4 || !arg_int(argc, argv, 2, 20, &total) || !arg_int(argc, argv, 3, -1, &crash) ||
        total < 1 || total > 1000000000 || (argc > 3 && (crash < 1 || crash > 1000000000))) {
        fprintf(stderr, "usage: checkpoint_resume PROJECT_DIR [TOTAL_STEPS] [CRASH_AFTER] (steps: integers >= 1)\n");
        return 2;
    }
    accel_accelerator_opts ao = accel_accelerator_opts_default();
    ao.project_dir = argv[1];
    ao.automatic_checkpoint_naming = true;
    ao.total_limit = 3;
    accel_accelerator *acc = accel_accelerator_new(&ao);
    if (!acc) {
        fprintf(stderr, "checkpoint_resume: %s\n", accel_last_error());
        return 1;
    }
    /* logging.basicConfig(level=INFO) of Accelerate's examples (ACCEL_LOG_LEVEL overrides) */
    accel_logger *log = accel_get_logger("checkpoint_resume");
    if (!getenv("ACCEL_LOG_LEVEL") && !getenv("ACCELERATE_LOG_LEVEL")) accel_logger_set_level(log, ACCEL_LOG_INFO);
    float x[64 * 2], y[64];
    for (int i = 0; i < 64; i++) {
        x[2 * i] = (float)(i % 8) / 4.0f - 1.0f;
        x[2 * i + 1] = (float)(i / 8) / 4.0f - 1.0f;
        y[i] = x[2 * i] * x[2 * i + 1];
    }
    accel_tensor *f[2] = {accel_from_floats(ACCEL_SHAPE(64, 2), x), accel_from_floats(ACCEL_SHAPE(64, 1), y)};
    accel_dataset *ds = accel_tensor_dataset_new(2, f);
    accel_dataloader_opts o = accel_dataloader_opts_default();
    o.batch_size = 4;
    o.shuffle = true;
    accel_dataloader *dl = accel_dataloader_new(ds, &o);
    accel_manual_seed(4);
    accel_module *layers[3] = {accel_linear_new(2, 16, true, ACCEL_CPU_DEVICE, ACCEL_F32), accel_silu_module_new(),
                               accel_linear_new(16, 1, true, ACCEL_CPU_DEVICE, ACCEL_F32)};
    accel_module *model = accel_sequential_new(3, layers);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 2e-2);
    accel_optimizer *opt = accel_optimizer_new_module(ACCEL_OPTIM_ADAMW, model, &h);
    accel_lr_scheduler *sched = accel_lr_scheduler_new(opt, ACCEL_SCHED_COSINE, 2, total);
    accel_step_reset();

    int rc = accel_accelerator_prepare(acc, model, opt, dl, sched) != ACCEL_OK;
    /* Resume when a checkpoint exists (every rank sees the same directory);
     * none yet is a fresh start, and that handled failure leaves nothing behind. */
    accel_resume_point at = {0};
    if (!rc && accel_accelerator_load_state(acc, NULL, &at) == ACCEL_OK)
        accel_accelerator_print(acc, "resumed at step %lld\n",
                                (long long)(at.epoch * accel_dataloader_len(dl) + at.batch));
    int step = (int)(at.epoch * accel_dataloader_len(dl) + at.batch);
    double last = 0;
    accel_batch b;
    while (!rc && step < total) {
        if (!accel_dataloader_next(dl, &b)) {
            rc = accel_last_status() != ACCEL_OK;
            continue; /* next epoch */
        }
        accel_tensor *loss = accel_mse_loss(accel_module_call(model, b.fields[0]), b.fields[1]);
        rc |= accel_accelerator_backward(acc, loss) != ACCEL_OK;
        rc |= accel_accelerator_optimizer_step(acc, opt) != ACCEL_OK;
        accel_accelerator_scheduler_step(acc, sched);
        accel_accelerator_zero_grad(acc, opt);
        last = accel_item(loss);
        accel_step_reset();
        step++;
        if (step == crash) {
            accel_accelerator_print(acc, "crashing at step %d\n", step);
            _Exit(3);
        }
        if (step % 5 == 0 && !rc) {
            char dir[512];
            rc |= accel_accelerator_save_state(acc, NULL, dir, sizeof dir) != ACCEL_OK;
            if (!rc) accel_log_info(log, "step %d: saved %s", step, dir);
        }
    }
    if (rc) fprintf(stderr, "checkpoint_resume: %s\n", accel_last_error());
    else accel_accelerator_print(acc, "step=%d final_loss=%.6f\n", step, last);
    accel_accelerator_free(acc);
    accel_lr_scheduler_free(sched);
    accel_optimizer_free(opt);
    accel_module_free(model);
    accel_dataloader_free(dl);
    accel_dataset_free(ds);
    accel_thread_cleanup();
    return rc;
}
