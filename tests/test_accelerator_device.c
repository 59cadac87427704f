/* The Accelerator on its device (ctest runs it on hostless:0 under `accel launch
 * --num_processes 2`, and plainly on the cpu): the device ACCEL_DEFAULT_DEVICE
 * names, DDP and ZeRO-1/2 training with clipping equal to one cpu process on
 * the global batch (losses and weights), collectives on device tensors,
 * checkpoint save/resume under DDP and ZeRO-1/2, and ZeRO-3's refusal of
 * device models. On hostless any host dereference of device memory faults, so
 * passing proves the DDP buffers, the ZeRO shards and optimizer state and the
 * collectives go through the backend and its copies. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "accel/accel.h"
#include "accel/accelerator.h"
#include "accel/dist.h"
#include "check.h"
#include "params_host.h"

static int N, R;
static accel_accelerator *A;
static accel_device DEV;

static accel_module *mlp(accel_device dev) {
    accel_module *l[3] = {accel_linear_new(4, 8, true, dev, ACCEL_F32), accel_relu_module_new(),
                          accel_linear_new(8, 1, true, dev, ACCEL_F32)};
    return accel_sequential_new(3, l);
}

/* One group over every parameter: SGD (lr, momentum) or AdamW (lr, its default decay). */
static accel_optimizer *optimizer(accel_module *m, accel_optim_kind kind, double lr, double momentum) {
    accel_tensor **ps;
    int n = accel_module_parameters(m, &ps);
    accel_optim_hparams h = accel_optim_defaults(kind, lr);
    h.momentum = momentum;
    accel_optimizer *o = accel_optimizer_new_params(kind, n, ps, &h);
    accel_free(ps);
    return o;
}

static accel_optimizer *sgd(accel_module *m, double lr, double momentum) {
    return optimizer(m, ACCEL_OPTIM_SGD, lr, momentum);
}

/* The n x 4 features and n targets of a fixed data set, on dev. */
static accel_tensor *data_x(int64_t lo, int64_t n, accel_device dev) {
    float *x = malloc((size_t)n * 4 * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        for (int j = 0; j < 4; j++) x[i * 4 + j] = (float)(((lo + i) * 7 + j * 3) % 11) / 11.0f - 0.5f;
    accel_tensor *t = accel_to_device(accel_from_floats(ACCEL_SHAPE(n, 4), x), dev);
    free(x);
    return t;
}

static accel_tensor *data_y(int64_t lo, int64_t n, accel_device dev) {
    float *y = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) y[i] = (float)((lo + i) % 5) * 0.2f - 0.4f;
    accel_tensor *t = accel_to_device(accel_from_floats(ACCEL_SHAPE(n, 1), y), dev);
    free(y);
    return t;
}

static void copy_params(accel_module *dst, accel_module *src) {
    accel_tensor **pd, **ps;
    int n = accel_module_parameters(dst, &pd);
    accel_module_parameters(src, &ps);
    for (int i = 0; i < n; i++) CHECK(accel_copy_(pd[i], ps[i]) == ACCEL_OK);
    accel_free(pd);
    accel_free(ps);
}

static void test_device_from_environment(void) {
    const char *want = getenv("ACCEL_DEFAULT_DEVICE");
    char got[32];
    accel_device_str(DEV, got, sizeof got);
    const char *expect = want && *want ? want : "cpu";
    CHECK_MSG(strcmp(got, expect) == 0, "accel_accelerator_device: %s, want %s", got, expect);
}

/* An accelerator of this launch with ZeRO stage `stage` (0: DDP). */
static accel_accelerator *accelerator(int stage) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.mixed_precision = "no";
    o.bucket_cap_bytes = 64; /* several buckets even for this small model */
    o.zero_stage = stage;
    accel_accelerator *acc = accel_accelerator_new(&o);
    CHECK_MSG(acc != NULL, "%s", accel_last_error());
    return acc;
}

/* Training through acc on N ranks with b samples each == one cpu process with
 * N*b samples (mse mean), gradient clipping included: the reduced (or
 * reduce-scattered) gradients are the global ones, and under ZeRO every
 * rank's shard update, all-gathered, is the whole update. The mean of the
 * ranks' losses is the global loss. */
static void matches_cpu(accel_accelerator *acc, accel_optim_kind kind, double lr, const char *what) {
    const int64_t b = 4, steps = 3;
    accel_manual_seed(100 + (uint64_t)R); /* different init per rank: prepare broadcasts rank 0's */
    accel_module *model = mlp(DEV);
    accel_optimizer *opt = optimizer(model, kind, lr, 0.0);
    CHECK(accel_accelerator_prepare(acc, model, opt, NULL, NULL) == ACCEL_OK);
    accel_module *ref = mlp(ACCEL_CPU_DEVICE);
    copy_params(ref, model); /* rank 0's weights, after prepare */
    accel_optimizer *ropt = optimizer(ref, kind, lr, 0.0);
    float got[64], want[64];
    for (int64_t s = 0; s < steps; s++) {
        int64_t lo = s * N * b;
        accel_tensor *loss = accel_mse_loss(accel_module_call(model, data_x(lo + R * b, b, DEV)),
                                            data_y(lo + R * b, b, DEV));
        CHECK(loss && loss->device.type == DEV.type);
        accel_tensor *mean_loss = accel_accelerator_reduce(acc, loss, "mean", 1.0);
        CHECK(accel_accelerator_backward(acc, loss) == ACCEL_OK);
        double norm = accel_accelerator_clip_grad_norm(acc, model, 0.05, 2.0);
        CHECK(accel_accelerator_optimizer_step(acc, opt) == ACCEL_OK);
        CHECK(accel_accelerator_zero_grad(acc, opt) == ACCEL_OK);

        accel_tensor *rloss = accel_mse_loss(accel_module_call(ref, data_x(lo, N * b, ACCEL_CPU_DEVICE)),
                                             data_y(lo, N * b, ACCEL_CPU_DEVICE));
        accel_backward(rloss);
        accel_tensor **rps;
        int nr = accel_module_parameters(ref, &rps);
        double rnorm = accel_clip_grad_norm(nr, rps, 0.05, 2.0);
        accel_free(rps);
        accel_optimizer_step(ropt);
        accel_optimizer_zero_grad(ropt);
        CHECK(mean_loss != NULL);
        if (mean_loss) CHECK_CLOSE(accel_item(mean_loss), accel_item(rloss), 1e-6, 1e-8);
        accel_step_reset();
        CHECK_CLOSE(norm, rnorm, 1e-5, 1e-7);
        int64_t n = params_to_host(model, got, 64);
        CHECK(params_to_host(ref, want, 64) == n);
        double d = 0;
        for (int64_t k = 0; k < n; k++) d = fmax(d, fabs((double)got[k] - want[k]));
        CHECK_MSG(d < 1e-5, "%s step %lld: max |on device - cpu| = %g", what, (long long)s, d);
    }
    accel_accelerator_clear(acc);
    accel_optimizer_free(opt);
    accel_optimizer_free(ropt);
    accel_module_free(model);
    accel_module_free(ref);
    accel_step_reset();
}

static void test_ddp_matches_cpu(void) { matches_cpu(A, ACCEL_OPTIM_SGD, 0.1, "ddp"); }

/* ZeRO-1 and ZeRO-2 (AdamW: the shard's state on the device) against the cpu. */
static void test_zero_matches_cpu(void) {
    for (int stage = 1; stage <= 2; stage++) {
        accel_accelerator *z = accelerator(stage);
        if (!z) return;
        CHECK(accel_accelerator_zero_stage(z) == stage);
        matches_cpu(z, ACCEL_OPTIM_ADAMW, 0.01, stage == 1 ? "zero1" : "zero2");
        accel_accelerator_free(z);
    }
}

static void test_collectives_on_device(void) {
    accel_tensor *mine = accel_to_device(accel_full(ACCEL_F32, ACCEL_SHAPE(2), (double)(R + 1)), DEV);
    accel_tensor *g = accel_accelerator_gather(A, mine);
    CHECK(g && g->device.type == DEV.type && g->shape[0] == 2 * N);
    for (int64_t i = 0; g && i < 2 * N; i++) CHECK(accel_get(g, &i) == (double)(i / 2 + 1));
    accel_tensor *s = accel_accelerator_reduce(A, mine, "sum", 1.0);
    CHECK(s && s->device.type == DEV.type && accel_get(s, (int64_t[]){1}) == N * (N + 1) / 2.0);
    accel_tensor *m = accel_accelerator_reduce(A, mine, "mean", 1.0);
    CHECK(m && accel_get(m, (int64_t[]){0}) == (N + 1) / 2.0);
    accel_tensor *bc = accel_accelerator_broadcast(A, mine, 0);
    CHECK(bc && bc->device.type == DEV.type && accel_get(bc, (int64_t[]){1}) == 1.0);
    accel_step_reset();
}

/* Saved after one step, trained two more; loaded into fresh weights, the same
 * two steps give the same parameters (momentum state restored on the device). */
static void train_steps(accel_accelerator *acc, accel_module *model, accel_optimizer *opt, int64_t from, int64_t k) {
    for (int64_t s = from; s < from + k; s++) {
        accel_tensor *loss =
            accel_mse_loss(accel_module_call(model, data_x(s * 8 + R * 4, 4, DEV)), data_y(s * 8 + R * 4, 4, DEV));
        CHECK(accel_accelerator_backward(acc, loss) == ACCEL_OK);
        CHECK(accel_accelerator_optimizer_step(acc, opt) == ACCEL_OK);
        CHECK(accel_accelerator_zero_grad(acc, opt) == ACCEL_OK);
        accel_step_reset();
    }
}

static void checkpoint_resume(accel_accelerator *acc, const char *what) {
    char dir[256];
    snprintf(dir, sizeof dir, "/tmp/accel_device_ckpt_%s_%d", what, (int)(N > 1 ? getppid() : getpid()));
    accel_manual_seed(5);
    accel_module *model = mlp(DEV);
    accel_optimizer *opt = sgd(model, 0.1, 0.9);
    CHECK(accel_accelerator_prepare(acc, model, opt, NULL, NULL) == ACCEL_OK);
    train_steps(acc, model, opt, 0, 1);
    CHECK_MSG(accel_accelerator_save_state(acc, dir, NULL, 0) == ACCEL_OK, "%s: %s", what, accel_last_error());
    train_steps(acc, model, opt, 1, 2);
    float want[64], got[64];
    int64_t n = params_to_host(model, want, 64);
    accel_accelerator_clear(acc);
    accel_optimizer_free(opt);
    accel_module_free(model);

    accel_manual_seed(77); /* other weights: the load replaces them */
    model = mlp(DEV);
    opt = sgd(model, 0.1, 0.9);
    CHECK(accel_accelerator_prepare(acc, model, opt, NULL, NULL) == ACCEL_OK);
    CHECK_MSG(accel_accelerator_load_state(acc, dir, NULL) == ACCEL_OK, "%s: %s", what, accel_last_error());
    train_steps(acc, model, opt, 1, 2);
    CHECK(params_to_host(model, got, 64) == n);
    for (int64_t k = 0; k < n; k++)
        CHECK_MSG(got[k] == want[k], "%s param %lld: %.9g vs %.9g", what, (long long)k, got[k], want[k]);
    accel_accelerator_clear(acc);
    accel_optimizer_free(opt);
    accel_module_free(model);
    accel_accelerator_wait_for_everyone(acc);
    if (R == 0) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        CHECK(system(cmd) == 0);
    }
    accel_step_reset();
}

static void test_checkpoint_resume(void) { checkpoint_resume(A, "ddp"); }

/* Under ZeRO-1/2 the momentum state is sharded on the device; the checkpoint
 * holds it consolidated (host memory) and loads back into the shards. */
static void test_zero_checkpoint_resume(void) {
    for (int stage = 1; stage <= 2; stage++) {
        accel_accelerator *z = accelerator(stage);
        if (!z) return;
        checkpoint_resume(z, stage == 1 ? "zero1" : "zero2");
        accel_accelerator_free(z);
    }
}

/* ZeRO-3 keeps its shards and drops pages in host memory: a device model is refused by name. */
static void test_zero3_refuses_device_model(void) {
    if (DEV.type == ACCEL_DEV_CPU) return;
    accel_accelerator *z = accelerator(3);
    if (!z) return;
    accel_module *model = mlp(DEV);
    accel_optimizer *opt = sgd(model, 0.1, 0.0);
    CHECK(accel_accelerator_prepare(z, model, opt, NULL, NULL) == ACCEL_ERR_DEVICE);
    CHECK_STR_CONTAINS(accel_last_error(), "ZeRO stage 3 needs the model in host memory");
    CHECK_STR_CONTAINS(accel_last_error(), "hostless:0");
    accel_accelerator_free(z);
    accel_optimizer_free(opt);
    accel_module_free(model);
}

int main(void) {
    A = accelerator(0);
    if (!A) return 1;
    N = accel_accelerator_num_processes(A);
    R = accel_accelerator_process_index(A);
    DEV = accel_accelerator_device(A);
    RUN(test_device_from_environment);
    RUN(test_ddp_matches_cpu);
    RUN(test_collectives_on_device);
    RUN(test_checkpoint_resume);
    RUN(test_zero_matches_cpu);
    RUN(test_zero_checkpoint_resume);
    RUN(test_zero3_refuses_device_model);
    accel_accelerator_free(A);
    accel_thread_cleanup();
    return check_summary();
}
