/* Mixed precision: the same loop in f32, bf16 or fp16.
 *     mixed_precision [no|bf16|fp16]          (default: --mixed_precision of accel launch)
 * The model keeps f32 master weights; its forward runs under autocast (matmuls in
 * bf16/fp16, outputs returned as f32). fp16 adds dynamic loss scaling: steps whose
 * gradients overflow are skipped and the scale halves (torch's GradScaler). */
#include <stdio.h>

#include "accel/accel.h"
#include "accel/accelerator.h"

int main(int argc, char **argv) {
    accel_accelerator_opts ao = accel_accelerator_opts_default();
    if (argc > 1) ao.mixed_precision = argv[1];
    accel_accelerator *acc = accel_accelerator_new(&ao);
    if (!acc) {
        fprintf(stderr, "mixed_precision: %s\n", accel_last_error());
        return 1;
    }
    float x[256 * 4], y[256];
    for (int i = 0; i < 256; i++) {
        for (int j = 0; j < 4; j++) x[i * 4 + j] = (float)((i * 13 + j * 5) % 17) / 17.0f - 0.5f;
        y[i] = x[i * 4] * x[i * 4 + 1] + 0.5f * x[i * 4 + 2] - x[i * 4 + 3];
    }
    accel_tensor *f[2] = {accel_from_floats(ACCEL_SHAPE(256, 4), x), accel_from_floats(ACCEL_SHAPE(256, 1), y)};
    accel_dataset *ds = accel_tensor_dataset_new(2, f);
    accel_dataloader_opts o = accel_dataloader_opts_default();
    o.batch_size = 16;
    o.shuffle = true;
    accel_dataloader *dl = accel_dataloader_new(ds, &o);
    accel_manual_seed(1);
    accel_module *layers[3] = {accel_linear_new(4, 32, true, ACCEL_CPU_DEVICE, ACCEL_F32), accel_gelu_module_new(false),
                               accel_linear_new(32, 1, true, ACCEL_CPU_DEVICE, ACCEL_F32)};
    accel_module *model = accel_sequential_new(3, layers);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 1e-2);
    accel_optimizer *opt = accel_optimizer_new_module(ACCEL_OPTIM_ADAMW, model, &h);
    accel_step_reset();

    int rc = accel_accelerator_prepare(acc, model, opt, dl, NULL) != ACCEL_OK;
    int skipped = 0, steps = 0;
    double last = 0;
    for (int epoch = 0; epoch < 5 && !rc; epoch++) {
        accel_batch b;
        while (!rc && accel_dataloader_next(dl, &b)) {
            accel_tensor *loss = accel_mse_loss(accel_module_call(model, b.fields[0]), b.fields[1]);
            rc |= accel_accelerator_backward(acc, loss) != ACCEL_OK;
            accel_accelerator_clip_grad_norm(acc, model, 1.0, 2.0);
            rc |= accel_accelerator_optimizer_step(acc, opt) != ACCEL_OK;
            skipped += accel_accelerator_optimizer_step_was_skipped(acc);
            accel_accelerator_zero_grad(acc, opt);
            last = accel_item(loss);
            steps++;
            accel_step_reset();
        }
    }
    rc |= accel_last_status() != ACCEL_OK;
    if (rc) fprintf(stderr, "mixed_precision: %s\n", accel_last_error());
    else
        accel_accelerator_print(acc, "mixed_precision=%s steps=%d skipped=%d loss_scale=%g final_loss=%.4f\n",
                                accel_mixed_precision_name(accel_accelerator_mixed_precision(acc)), steps, skipped,
                                accel_accelerator_loss_scale(acc), last);
    accel_accelerator_free(acc);
    accel_optimizer_free(opt);
    accel_module_free(model);
    accel_dataloader_free(dl);
    accel_dataset_free(ds);
    accel_thread_cleanup();
    return rc;
}
