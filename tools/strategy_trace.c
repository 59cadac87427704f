/* tools/strategy_trace.c: a fixed 20-step training run whose every loss and
 * written checkpoint can be compared bit for bit between two builds of the
 * library (tools/strategy_compare.sh runs it under each strategy and world
 * size). The strategy, mixed precision and state-dict type come from the
 * environment `accel launch` sets (ACCEL_ZERO_STAGE, ACCEL_MIXED_PRECISION,
 * ACCEL_FSDP_STATE_DICT_TYPE, ...), so the program is the same for all.
 *
 * A 3-layer MLP (8 -> 32 -> 32 -> 1) fits a fixed function; each rank takes
 * its own 16 rows of a 64-row batch (so the gradient averaging matters),
 * the gradient norm is clipped to 1.0, AdamW steps. Each rank prints
 *     loss <rank> <step> <loss as a C99 hex float>
 * and, after the last step, save_state writes OUTDIR/state and save_model
 * OUTDIR/model. Usage: accel launch -n N strategy_trace OUTDIR */
#include <math.h>
#include <stdio.h>

#include "accel/accel.h"
#include "accel/accelerator.h"

#define ROWS 64
#define IN 8

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: strategy_trace OUTDIR\n");
        return 2;
    }
    accel_accelerator_opts ao = accel_accelerator_opts_default();
    ao.project_dir = argv[1];
    accel_accelerator *acc = accel_accelerator_new(&ao);
    if (!acc) {
        fprintf(stderr, "strategy_trace: %s\n", accel_last_error());
        return 1;
    }
    int rank = accel_accelerator_process_index(acc), world = accel_accelerator_num_processes(acc);
    accel_manual_seed(1234);
    accel_module *layers[5] = {accel_linear_new(IN, 32, true, ACCEL_CPU_DEVICE, ACCEL_F32), accel_relu_module_new(),
                               accel_linear_new(32, 32, true, ACCEL_CPU_DEVICE, ACCEL_F32), accel_relu_module_new(),
                               accel_linear_new(32, 1, true, ACCEL_CPU_DEVICE, ACCEL_F32)};
    accel_module *model = accel_sequential_new(5, layers);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 0.01);
    accel_optimizer *optim = accel_optimizer_new_module(ACCEL_OPTIM_ADAMW, model, &h);
    if (!model || !optim || accel_accelerator_prepare(acc, model, optim, NULL) != ACCEL_OK) goto fail;
    /* this rank's rows of the batch: ROWS / world each (all 64 on 1, 2 and 4; 63 on 3) */
    int per = ROWS / world;
    float xs[ROWS * IN], ys[ROWS];
    for (int r = 0; r < per; r++) {
        int row = rank * per + r;
        float s = 0;
        for (int c = 0; c < IN; c++) {
            xs[r * IN + c] = sinf(0.37f * (float)(row * IN + c));
            s += xs[r * IN + c] * (float)(c + 1) / IN;
        }
        ys[r] = tanhf(s);
    }
    for (int step = 0; step < 20; step++) {
        accel_tensor *x = accel_from_floats(ACCEL_SHAPE(per, IN), xs), *y = accel_from_floats(ACCEL_SHAPE(per, 1), ys);
        accel_tensor *loss = accel_mse_loss(accel_module_call(model, x), y);
        if (!loss || accel_accelerator_backward(acc, loss) != ACCEL_OK) goto fail;
        if (isnan(accel_accelerator_clip_grad_norm(acc, model, 1.0, 2.0))) goto fail;
        if (accel_accelerator_optimizer_step(acc, optim) != ACCEL_OK) goto fail;
        if (accel_accelerator_zero_grad(acc, optim) != ACCEL_OK) goto fail;
        printf("loss %d %d %a\n", rank, step, accel_item(loss));
        accel_step_reset();
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/state", argv[1]);
    if (accel_accelerator_save_state(acc, dir, NULL, 0) != ACCEL_OK) goto fail;
    snprintf(dir, sizeof dir, "%s/model", argv[1]);
    if (accel_accelerator_save_model(acc, model, dir, NULL) != ACCEL_OK) goto fail;
    accel_module_free(model);
    accel_optimizer_free(optim);
    accel_accelerator_free(acc);
    return 0;
fail:
    fprintf(stderr, "strategy_trace (rank %d): %s\n", rank, accel_last_error());
    return 1;
}
