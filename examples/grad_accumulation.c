/* Gradient accumulation (seed 001: Accelerator(gradient_accumulation_steps=4)):
 *     grad_accumulation [steps]   (default 4; 0 takes --gradient_accumulation_steps of accel launch)
 * Call accumulate once per micro-batch; backward divides the loss by the step count,
 * the gradient all-reduce and the optimizer/scheduler steps happen only on sync steps
 * (every `steps` micro-batches and at the end of the loader). The effective batch is
 * batch_size * num_processes * steps. */
#include <stdio.h>
#include <stdlib.h>

#include "accel/accel.h"
#include "accel/accelerator.h"
#include "example_args.h"

int main(int argc, char **argv) {
    accel_accelerator_opts ao = accel_accelerator_opts_default();
    long long steps; /* 0: from accel launch */
    if (argc > 2 || !arg_int(argc, argv, 1, 4, &steps) || steps < 0 || steps > 1000000) {
        fprintf(stderr, "usage: grad_accumulation [STEPS] (an integer >= 0; 0: accel launch's)\n");
        return 2;
    }
    ao.gradient_accumulation_steps = (int)steps;
    accel_accelerator *acc = accel_accelerator_new(&ao);
    if (!acc) {
        fprintf(stderr, "grad_accumulation: %s\n", accel_last_error());
        return 1;
    }
    float x[200 * 2], y[200];
    for (int i = 0; i < 200; i++) {
        x[2 * i] = (float)(i % 20) / 10.0f - 1.0f;
        x[2 * i + 1] = (float)(i / 20) / 5.0f - 1.0f;
        y[i] = 1.5f * x[2 * i] - 0.5f * x[2 * i + 1] + 0.25f;
    }
    accel_tensor *f[2] = {accel_from_floats(ACCEL_SHAPE(200, 2), x), accel_from_floats(ACCEL_SHAPE(200, 1), y)};
    accel_dataset *ds = accel_tensor_dataset_new(2, f);
    accel_dataloader_opts o = accel_dataloader_opts_default();
    o.batch_size = 5;
    o.shuffle = true;
    accel_dataloader *dl = accel_dataloader_new(ds, &o);
    accel_manual_seed(2);
    accel_module *model = accel_linear_new(2, 1, true, ACCEL_CPU_DEVICE, ACCEL_F32);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_SGD, 0.3);
    accel_optimizer *opt = accel_optimizer_new_module(ACCEL_OPTIM_SGD, model, &h);
    accel_lr_scheduler *sched = accel_lr_scheduler_new(opt, ACCEL_SCHED_LINEAR, 2, 200);
    accel_step_reset();

    int rc = accel_accelerator_prepare(acc, model, opt, dl, sched) != ACCEL_OK;
    int micro = 0, updates = 0;
    double last = 0;
    for (int epoch = 0; epoch < 3 && !rc; epoch++) {
        accel_batch b;
        while (!rc && accel_dataloader_next(dl, &b)) {
            accel_accelerator_accumulate(acc); /* with accelerator.accumulate(model): */
            accel_tensor *loss = accel_mse_loss(accel_module_call(model, b.fields[0]), b.fields[1]);
            rc |= accel_accelerator_backward(acc, loss) != ACCEL_OK;
            rc |= accel_accelerator_optimizer_step(acc, opt) != ACCEL_OK;
            accel_accelerator_scheduler_step(acc, sched);
            accel_accelerator_zero_grad(acc, opt);
            updates += accel_accelerator_sync_gradients(acc);
            micro++;
            last = accel_item(loss);
            accel_step_reset();
        }
    }
    rc |= accel_last_status() != ACCEL_OK;
    if (rc) fprintf(stderr, "grad_accumulation: %s\n", accel_last_error());
    else
        accel_accelerator_print(acc, "accumulation_steps=%d micro_batches=%d optimizer_steps=%d lr=%.5f final_loss=%.4f\n",
                                accel_accelerator_gradient_accumulation_steps(acc), micro, updates,
                                accel_optimizer_get_lr(opt, 0), last);
    accel_accelerator_free(acc);
    accel_lr_scheduler_free(sched);
    accel_optimizer_free(opt);
    accel_module_free(model);
    accel_dataloader_free(dl);
    accel_dataset_free(ds);
    accel_thread_cleanup();
    return rc;
}
