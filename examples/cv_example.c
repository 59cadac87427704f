/* Accelerate's cv_example.py in C: train a ResNet image classifier under the
 * Accelerator (DDP across processes), evaluating on every process and
 * gathering the predictions with gather_for_metrics for the accuracy after
 * each epoch.
 *
 *     accel launch --num_processes 2 [--mixed_precision bf16]
 *                  build/bin/cv_example [--sync_bn] [EPOCHS=3] [LR=3e-3] [BATCH=32] [SEED=42]
 *
 * The model is a small ResNet with torchvision's names and blocks
 * (cv_resnet.h): a 3x3 stem (conv1, bn1, relu), layer1 (a BasicBlock of 16
 * channels), layer2 (a BasicBlock of 32 channels at stride 2 with its
 * downsample, a 1x1 strided conv + BatchNorm on the shortcut), adaptive
 * average pooling, fc. The
 * BatchNorms' running stats are the ones of rank 0 before each training
 * forward, as torch's DDP broadcasts them (docs/guide/cv.md). --sync_bn
 * converts them to SyncBatchNorm before prepare, as a PyTorch script calls
 * torch.nn.SyncBatchNorm.convert_sync_batchnorm: every process then
 * normalises with the statistics of the whole global batch.
 *
 * The data set is generated, deterministically: 16x16 RGB images of one of
 * four patterns (horizontal, vertical or diagonal stripes, a checkerboard;
 * the label) at a random phase, colour and contrast, under Gaussian noise
 * (make_image). As cv_example.py: Adam, the learning rate warming up over
 * the first 10% of the steps and then decaying linearly (its OneCycleLR's
 * shape), the scheduler sized by the unsharded loader's length. Prints on
 * the main process, per epoch:
 *     epoch 0: 94.92 (this process's train loss 0.7903)
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"
#include "cv_resnet.h"
#include "example_args.h"

#define IMG 16
#define CLASSES 4
#define N_TRAIN 1024
#define N_EVAL 256

/* splitmix64: the same data on every process and every run. */
static uint64_t next_rand(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static double uniform(uint64_t *s) { return (double)(next_rand(s) >> 11) * 0x1.0p-53; }

static double gauss(uint64_t *s) {
    double u = uniform(s) + 1e-12, v = uniform(s);
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

/* One image [3, IMG, IMG] of pattern `label` into px. */
static void make_image(uint64_t *s, int label, float *px) {
    double phase = uniform(s) * 6.283185307179586, contrast = 0.5 + uniform(s), color[3];
    for (int c = 0; c < 3; c++) color[c] = 0.3 + uniform(s);
    for (int h = 0; h < IMG; h++)
        for (int w = 0; w < IMG; w++) {
            double t = label == 0 ? h : label == 1 ? w : label == 2 ? h + w : 0;
            double v = label == 3 ? ((h / 2 + w / 2) % 2 ? 1.0 : -1.0) : sin(6.283185307179586 * t / 4.0 + phase);
            for (int c = 0; c < 3; c++) px[(c * IMG + h) * IMG + w] = (float)(contrast * color[c] * v + 0.6 * gauss(s));
        }
}

/* A split of n images and labels as a data set of two fields. */
static accel_dataset *make_split(uint64_t seed, int64_t n) {
    float *px = malloc(sizeof *px * (size_t)(n * 3 * IMG * IMG));
    int64_t *labels = malloc(sizeof *labels * (size_t)n);
    accel_dataset *ds = NULL;
    if (px && labels) {
        uint64_t s = seed;
        for (int64_t i = 0; i < n; i++) {
            labels[i] = (int64_t)(next_rand(&s) % CLASSES);
            make_image(&s, (int)labels[i], px + i * 3 * IMG * IMG);
        }
        accel_tensor *t[2] = {accel_from_data(ACCEL_F32, 4, (int64_t[]){n, 3, IMG, IMG}, px),
                              accel_from_data(ACCEL_I64, 1, (int64_t[]){n}, labels)};
        ds = t[0] && t[1] ? accel_tensor_dataset_new(2, t) : NULL;
        accel_step_reset();
    } else {
        accel_set_error(ACCEL_ERR_OOM, "cv_example: no memory for %lld images", (long long)n);
    }
    free(px);
    free(labels);
    return ds;
}

/* The accuracy over every sample of the eval split, predictions and labels
 * gathered from all processes; -1 on error. */
static double evaluate(accel_accelerator *acc, accel_module *model, accel_dataloader *dl) {
    int64_t right = 0, total = 0;
    accel_module_train(model, false);
    bool prev = accel_set_grad_enabled(false); /* torch.no_grad() */
    accel_batch b;
    while (accel_dataloader_next(dl, &b)) {
        accel_tensor *logits = accel_module_call(model, b.fields[0]);
        accel_tensor *in[2] = {logits ? accel_argmax(logits, 1, false) : NULL, b.fields[1]}, *out[2];
        if (!in[0] || accel_accelerator_gather_for_metrics_n(acc, 2, in, out) != ACCEL_OK) break;
        right += (int64_t)accel_item(accel_sum_all(accel_eq(out[0], out[1])));
        total += out[0]->shape[0];
        accel_step_reset();
    }
    accel_set_grad_enabled(prev);
    accel_module_train(model, true);
    return accel_last_status() != ACCEL_OK ? -1 : total ? (double)right / (double)total : 0;
}

/* argv[i] (else dflt when i >= argc) read whole: false for "1e3" as an integer, "3e-3x", "" or a value out of
 * range (atoi / atof took 1, 3e-3 and 0 silently). */
int main(int argc, char **argv) {
    bool sync_bn = argc > 1 && !strcmp(argv[1], "--sync_bn");
    if (sync_bn) { /* the positional arguments follow it */
        argc--;
        argv++;
    }
    long long epochs = 0, batch = 0, seed = -1;
    double lr = 0;
    bool ok = arg_int(argc, argv, 1, 3, &epochs) && arg_real(argc, argv, 2, 3e-3, &lr) &&
              arg_int(argc, argv, 3, 32, &batch) && arg_int(argc, argv, 4, 42, &seed) && argc <= 5;
    if (!ok || epochs < 1 || epochs > INT32_MAX || !(lr > 0) || batch < 1 || batch > INT32_MAX || seed < 0) {
        fprintf(stderr, "usage: cv_example [--sync_bn] [EPOCHS=3] [LR=3e-3] [BATCH=32] [SEED=42]: EPOCHS and BATCH >= 1, "
                        "LR > 0, SEED >= 0\n");
        return 2;
    }
    accel_accelerator *acc = accel_accelerator_new(NULL); /* what `accel launch` set */
    if (!acc) {
        fprintf(stderr, "cv_example: %s\n", accel_last_error());
        return 1;
    }
    accel_set_seed(acc, (uint64_t)seed, false); /* the same initial weights on every process */
    accel_module *model = cv_resnet(CLASSES);
    /* the default group at each forward: DDP's, every process */
    if (model && sync_bn && accel_convert_sync_batchnorm(model, NULL) != ACCEL_OK) {
        accel_module_free(model);
        model = NULL;
    }
    accel_dataset *train_ds = model ? make_split(1, N_TRAIN) : NULL, *eval_ds = train_ds ? make_split(2, N_EVAL) : NULL;
    accel_dataloader *train_dl =
        eval_ds ? accel_dataloader_new(train_ds, &(accel_dataloader_opts){.batch_size = batch, .shuffle = true,
                                                                          .seed = (uint64_t)seed})
                : NULL;
    accel_dataloader *eval_dl = train_dl ? accel_dataloader_new(eval_ds, &(accel_dataloader_opts){.batch_size = 64}) : NULL;
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAM, lr);
    accel_optimizer *opt = eval_dl ? accel_optimizer_new_module(ACCEL_OPTIM_ADAM, model, &h) : NULL;
    /* sized before prepare: the unsharded length (the scheduler steps once per process per step) */
    int64_t total = opt ? accel_dataloader_len(train_dl) * epochs : 0;
    accel_lr_scheduler *sched = opt ? accel_lr_scheduler_new(opt, ACCEL_SCHED_LINEAR, total / 10, total) : NULL;
    int rc = !sched || accel_accelerator_prepare(acc, model, opt, train_dl, eval_dl, sched) != ACCEL_OK;
    accel_module_train(model, true);
    for (int epoch = 0; epoch < epochs && !rc; epoch++) {
        accel_batch b;
        double loss_sum = 0;
        int64_t steps = 0;
        accel_dataloader_set_epoch(train_dl, epoch);
        while (!rc && accel_dataloader_next(train_dl, &b)) {
            accel_tensor *loss = accel_cross_entropy(accel_module_call(model, b.fields[0]), b.fields[1], -100);
            rc |= accel_accelerator_backward(acc, loss) != ACCEL_OK;
            rc |= accel_accelerator_optimizer_step(acc, opt) != ACCEL_OK;
            accel_accelerator_scheduler_step(acc, sched);
            accel_accelerator_zero_grad(acc, opt);
            if (!rc) loss_sum += accel_item(loss);
            steps++;
            accel_step_reset();
        }
        double accuracy = rc || accel_last_status() != ACCEL_OK ? -1 : evaluate(acc, model, eval_dl);
        rc = rc || accuracy < 0;
        if (!rc)
            accel_accelerator_print(acc, "epoch %d: %.2f (this process's train loss %.4f)\n", epoch, 100 * accuracy,
                                    steps ? loss_sum / (double)steps : 0.0);
    }
    if (rc) fprintf(stderr, "cv_example: %s\n", accel_last_error());
    accel_accelerator_free(acc);
    accel_lr_scheduler_free(sched);
    accel_optimizer_free(opt);
    accel_module_free(model);
    accel_dataloader_free(train_dl);
    accel_dataloader_free(eval_dl);
    accel_dataset_free(train_ds);
    accel_dataset_free(eval_ds);
    accel_thread_cleanup();
    return rc;
}
