/* The seed's train_npu.py in C: y = 2x + 1 + 0.05*noise, x = linspace(-1, 1, 64),
 * batch 8 shuffled, Linear(1, 1), SGD lr 0.1, 3 steps. Prints once (main process):
 *     device=cpu final_loss=0.1234
 * Runs plainly, or under `accel launch --num_processes 2 --mixed_precision no|bf16`. */
#include <stdio.h>
#include <stdlib.h>

#include "accel/accel.h"
#include "accel/accelerator.h"

int main(void) {
    accel_accelerator *acc = accel_accelerator_new(NULL);
    if (!acc) {
        fprintf(stderr, "train_linear: %s\n", accel_last_error());
        return 1;
    }
    /* build(): the toy data set, model and optimizer */
    accel_manual_seed(0);
    float xs[64], ys[64], noise[64];
    accel_tensor *t = accel_empty(ACCEL_F32, ACCEL_SHAPE(64, 1)); /* on the default device: maybe a GPU's memory */
    if (accel_rng_normal_(accel_default_rng(), t, 0.0, 1.0) != ACCEL_OK || accel_tensor_to_host(t, noise) != ACCEL_OK) {
        fprintf(stderr, "train_linear: %s\n", accel_last_error());
        accel_accelerator_free(acc);
        return 1;
    }
    for (int i = 0; i < 64; i++) {
        xs[i] = -1.0f + 2.0f * (float)i / 63.0f;
        ys[i] = 2.0f * xs[i] + 1.0f + 0.05f * noise[i];
    }
    accel_tensor *fields[2] = {accel_from_floats(ACCEL_SHAPE(64, 1), xs), accel_from_floats(ACCEL_SHAPE(64, 1), ys)};
    accel_dataset *ds = accel_tensor_dataset_new(2, fields);
    accel_dataloader_opts o = accel_dataloader_opts_default();
    o.batch_size = 8;
    o.shuffle = true;
    accel_dataloader *loader = accel_dataloader_new(ds, &o);
    accel_module *model = accel_linear_new(1, 1, true, accel_accelerator_device(acc), ACCEL_F32);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_SGD, 0.1);
    accel_optimizer *optim = accel_optimizer_new_module(ACCEL_OPTIM_SGD, model, &h);
    accel_step_reset();

    int rc = 1;
    if (accel_accelerator_prepare(acc, model, optim, loader, NULL) != ACCEL_OK) goto done;
    double last = 0;
    accel_batch b;
    for (int step = 0; accel_dataloader_next(loader, &b); step++) {
        accel_tensor *preds = accel_module_call(model, b.fields[0]);
        accel_tensor *loss = accel_mse_loss(preds, b.fields[1]);
        if (accel_accelerator_backward(acc, loss) != ACCEL_OK) goto done;
        if (accel_accelerator_optimizer_step(acc, optim) != ACCEL_OK) goto done;
        accel_accelerator_zero_grad(acc, optim);
        last = accel_item(loss);
        accel_step_reset();
        if (step == 2) break;
    }
    if (accel_last_status() != ACCEL_OK) goto done;
    accel_accelerator_print(acc, "device=%s final_loss=%.4f\n",
                            accel_device_type_name(accel_accelerator_device(acc).type), last);
    rc = 0;
done:
    if (rc) fprintf(stderr, "train_linear: %s\n", accel_last_error());
    /* the same frees on success and failure (any order is safe: docs/contract.md) */
    accel_accelerator_free(acc);
    accel_optimizer_free(optim);
    accel_module_free(model);
    accel_dataloader_free(loader);
    accel_dataset_free(ds);
    accel_thread_cleanup();
    return rc;
}
