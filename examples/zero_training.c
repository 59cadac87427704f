/* The seed's workflow 3 (DeepSpeed ZeRO-2) in C: bf16 autocast, ZeRO stage 2
 * (optimizer state and gradients sharded across the processes), gradient
 * accumulation 4 — set in code here, exactly what `accel launch --use_deepspeed
 * --zero_stage 2 --mixed_precision bf16 --gradient_accumulation_steps 4` or a
 * DeepSpeed JSON (zero_optimization.stage 2, bf16.enabled) would set.
 * A 2-layer MLP fits y = sin(3x) with AdamW; the training loop is the plain
 * four-line one. Prints once (main process):
 *     zero_stage=2 mixed_precision=bf16 accumulation=4 shard=<n>/<padded> final_loss=0.1234
 * Run: accel launch --num_processes 2 zero_training */
#include <math.h>
#include <stdio.h>

#include "accel/accel.h"
#include "accel/accelerator.h"

int main(void) {
    accel_accelerator_opts ao = accel_accelerator_opts_default();
    ao.mixed_precision = "bf16";
    ao.zero_stage = 2;
    ao.gradient_accumulation_steps = 4;
    accel_accelerator *acc = accel_accelerator_new(&ao);
    if (!acc) {
        fprintf(stderr, "zero_training: %s\n", accel_last_error());
        return 1;
    }
    accel_manual_seed(0);
    float xs[256], ys[256];
    for (int i = 0; i < 256; i++) {
        xs[i] = -1.0f + 2.0f * (float)i / 255.0f;
        ys[i] = sinf(3.0f * xs[i]);
    }
    accel_tensor *fields[2] = {accel_from_floats(ACCEL_SHAPE(256, 1), xs), accel_from_floats(ACCEL_SHAPE(256, 1), ys)};
    accel_dataset *ds = accel_tensor_dataset_new(2, fields);
    accel_dataloader_opts o = accel_dataloader_opts_default();
    o.batch_size = 8;
    o.shuffle = true;
    accel_dataloader *loader = accel_dataloader_new(ds, &o);
    accel_module *layers[3] = {accel_linear_new(1, 33, true, ACCEL_CPU_DEVICE, ACCEL_F32), accel_relu_module_new(),
                               accel_linear_new(33, 1, true, ACCEL_CPU_DEVICE, ACCEL_F32)};
    accel_module *model = accel_sequential_new(3, layers);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 0.01);
    accel_optimizer *optim = accel_optimizer_new_module(ACCEL_OPTIM_ADAMW, model, &h);
    accel_step_reset();

    if (accel_accelerator_prepare(acc, model, optim, loader, NULL) != ACCEL_OK) goto fail;
    double last = 0;
    for (int epoch = 0; epoch < 3; epoch++) {
        accel_batch b;
        while (accel_dataloader_next(loader, &b)) {
            accel_accelerator_accumulate(acc);
            accel_tensor *loss = accel_mse_loss(accel_module_call(model, b.fields[0]), b.fields[1]);
            if (accel_accelerator_backward(acc, loss) != ACCEL_OK) goto fail;
            if (accel_accelerator_optimizer_step(acc, optim) != ACCEL_OK) goto fail; /* every 4th: the shard */
            accel_accelerator_zero_grad(acc, optim);
            last = accel_item(loss);
            accel_step_reset();
        }
    }
    if (accel_last_status() != ACCEL_OK) goto fail;
    int64_t lo, hi, padded;
    if (accel_accelerator_zero_shard(acc, model, &lo, &hi, &padded) != ACCEL_OK) goto fail;
    accel_accelerator_print(acc, "zero_stage=%d mixed_precision=%s accumulation=%d shard=%lld/%lld final_loss=%.4f\n",
                            accel_accelerator_zero_stage(acc),
                            accel_mixed_precision_name(accel_accelerator_mixed_precision(acc)),
                            accel_accelerator_gradient_accumulation_steps(acc), (long long)(hi - lo),
                            (long long)padded, last);
    accel_accelerator_free(acc);
    accel_optimizer_free(optim);
    accel_module_free(model);
    accel_dataloader_free(loader);
    accel_dataset_free(ds);
    accel_thread_cleanup();
    return 0;
fail:
    fprintf(stderr, "zero_training: %s\n", accel_last_error());
    accel_accelerator_free(acc);
    return 1;
}
