/* Accelerate's "four lines", in C. A plain training loop on the left, the same loop
 * with the Accelerator on the right; the changed lines are marked (+) / (~).
 *
 *   plain accel                                  | with the Accelerator
 *   ---------------------------------------------+---------------------------------------------------
 *                                                | (+) acc = accel_accelerator_new(NULL);
 *   model = accel_linear_new(...);               |     model = accel_linear_new(...);
 *   opt = accel_optimizer_new_params(...);       |     opt = accel_optimizer_new_params(...);
 *   dl = accel_dataloader_new(ds, &o);           |     dl = accel_dataloader_new(ds, &o);
 *                                                | (+) accel_accelerator_prepare(acc, model, opt, dl, NULL);
 *   while (accel_dataloader_next(dl, &b)) {      |     while (accel_dataloader_next(dl, &b)) {
 *     loss = accel_mse_loss(                     |       loss = accel_mse_loss(
 *         accel_module_call(model, b.fields[0]), |           accel_module_call(model, b.fields[0]),
 *         b.fields[1]);                          |           b.fields[1]);
 *     accel_backward(loss);                      | (~)   accel_accelerator_backward(acc, loss);
 *     accel_optimizer_step(opt);                 | (~)   accel_accelerator_optimizer_step(acc, opt);
 *     accel_optimizer_zero_grad(opt);            |       accel_accelerator_zero_grad(acc, opt);
 *     accel_step_reset();                        |       accel_step_reset();
 *   }                                            |     }
 *
 * The right-hand side runs unchanged on one process or under
 * `accel launch --num_processes N [--mixed_precision bf16]`: prepare shards the loader,
 * syncs gradients across processes and runs the forward under autocast.
 * This program trains y = 3x - 1 for one epoch and prints the epoch's mean loss
 * (gathered from every process) on the main process. */
#include <stdio.h>

#include "accel/accel.h"
#include "accel/accelerator.h"

int main(void) {
    accel_accelerator *acc = accel_accelerator_new(NULL);
    if (!acc) {
        fprintf(stderr, "four_lines: %s\n", accel_last_error());
        return 1;
    }
    float x[96], y[96];
    for (int i = 0; i < 96; i++) {
        x[i] = (float)i / 48.0f - 1.0f;
        y[i] = 3.0f * x[i] - 1.0f;
    }
    accel_tensor *f[2] = {accel_from_floats(ACCEL_SHAPE(96, 1), x), accel_from_floats(ACCEL_SHAPE(96, 1), y)};
    accel_dataset *ds = accel_tensor_dataset_new(2, f);
    accel_dataloader_opts o = accel_dataloader_opts_default();
    o.batch_size = 8;
    o.shuffle = true;
    accel_dataloader *dl = accel_dataloader_new(ds, &o);
    accel_manual_seed(0);
    accel_module *model = accel_linear_new(1, 1, true, ACCEL_CPU_DEVICE, ACCEL_F32);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_SGD, 0.2);
    accel_optimizer *opt = accel_optimizer_new_module(ACCEL_OPTIM_SGD, model, &h);
    accel_step_reset();

    int rc = accel_accelerator_prepare(acc, model, opt, dl, NULL) != ACCEL_OK;
    double sum = 0;
    int64_t count = 0;
    accel_batch b;
    while (!rc && accel_dataloader_next(dl, &b)) {
        accel_tensor *loss = accel_mse_loss(accel_module_call(model, b.fields[0]), b.fields[1]);
        rc |= accel_accelerator_backward(acc, loss) != ACCEL_OK;
        rc |= accel_accelerator_optimizer_step(acc, opt) != ACCEL_OK;
        accel_accelerator_zero_grad(acc, opt);
        accel_tensor *all = accel_accelerator_gather(acc, accel_unsqueeze(loss, 0)); /* every process' loss */
        for (int64_t i = 0; all && i < all->shape[0]; i++) sum += accel_get(all, &i);
        count += all ? all->shape[0] : 0;
        accel_step_reset();
    }
    rc |= accel_last_status() != ACCEL_OK;
    if (rc) fprintf(stderr, "four_lines: %s\n", accel_last_error());
    else accel_accelerator_print(acc, "processes=%d mean_loss=%.4f\n", accel_accelerator_num_processes(acc), sum / (double)count);
    accel_accelerator_free(acc);
    accel_optimizer_free(opt);
    accel_module_free(model);
    accel_dataloader_free(dl);
    accel_dataset_free(ds);
    accel_thread_cleanup();
    return rc;
}
