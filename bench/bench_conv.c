/* bench/bench_conv.c - accel_conv2d on ResNet shapes (forward; forward +
 * backward) and one training step of examples/cv_resnet.h's ResNet
 * (forward, cross-entropy, backward, Adam, zero_grad). bench/conv.sh runs it
 * beside bench/conv_peer.py (PyTorch, the same shapes and model).
 *
 *     bench_conv [--threads 2] [--reps 5] [--batch 64] [--image 32]
 *
 * Prints one line per shape, "conv name=... fwd_ms=... fwdbwd_ms=...", and
 * "step batch=... image=... step_ms=... cpu_ms=...": medians of --reps timed
 * calls after one warm-up. */
#include <omp.h>

#include "../examples/cv_resnet.h"
#include "bench_util.h"

/* The ResNet-18 / -50 convolutions (batch 8, 224x224 input): stem, the 3x3 of
 * each stage, a strided 3x3 and a 1x1 downsample, a bottleneck's 1x1. */
typedef struct conv_shape {
    const char *name;
    int64_t N, C, H, O, k, s, p;
} conv_shape;

static const conv_shape SHAPES[] = {
    {"stem7x7s2", 8, 3, 224, 64, 7, 2, 3},       {"l1_3x3", 8, 64, 56, 64, 3, 1, 1},
    {"l2_3x3", 8, 128, 28, 128, 3, 1, 1},        {"l3_3x3", 8, 256, 14, 256, 3, 1, 1},
    {"l2_3x3s2", 8, 64, 56, 128, 3, 2, 1},       {"l2_down1x1s2", 8, 64, 56, 128, 1, 2, 0},
    {"bottleneck1x1", 8, 256, 56, 64, 1, 1, 0},
};

static void bench_shape(const conv_shape *c, int reps) {
    accel_rng r;
    accel_rng_init(&r, 1);
    accel_tensor *x = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(c->N, c->C, c->H, c->H), ACCEL_CPU_DEVICE);
    accel_tensor *w = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(c->O, c->C, c->k, c->k), ACCEL_CPU_DEVICE);
    accel_rng_normal_(&r, x, 0.0, 1.0);
    accel_rng_normal_(&r, w, 0.0, 0.05);
    const int64_t s[2] = {c->s, c->s}, p[2] = {c->p, c->p}, d[2] = {1, 1};
    double fwd[64], both[64];
    for (int pass = 0; pass < 2; pass++) {
        accel_requires_grad_(x, pass == 1);
        accel_requires_grad_(w, pass == 1);
        for (int i = -1; i < reps; i++) {
            double t0 = accel_now_seconds();
            accel_tensor *y = accel_conv2d(x, w, NULL, s, p, d, 1);
            if (!y || (pass == 1 && accel_backward(accel_sum_all(y)) != ACCEL_OK)) {
                fprintf(stderr, "bench_conv: %s\n", accel_last_error());
                exit(1);
            }
            double dt = (accel_now_seconds() - t0) * 1e3;
            if (i >= 0) (pass ? both : fwd)[i] = dt;
            accel_step_reset();
        }
    }
    printf("conv name=%s shape=%lldx%lldx%lldx%lld out=%lld k=%lld s=%lld fwd_ms=%.2f fwdbwd_ms=%.2f\n", c->name,
           (long long)c->N, (long long)c->C, (long long)c->H, (long long)c->H, (long long)c->O, (long long)c->k,
           (long long)c->s, bench_median(fwd, reps), bench_median(both, reps));
    fflush(stdout);
    accel_tensor_free(x);
    accel_tensor_free(w);
}

static void bench_step(int64_t batch, int64_t image, int reps) {
    accel_module *m = cv_resnet(10);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAM, 1e-3);
    accel_optimizer *opt = m ? accel_optimizer_new_module(ACCEL_OPTIM_ADAM, m, &h) : NULL;
    accel_tensor *x = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(batch, 3, image, image), ACCEL_CPU_DEVICE);
    accel_tensor *labels = accel_tensor_new(ACCEL_I64, ACCEL_SHAPE(batch), ACCEL_CPU_DEVICE);
    if (!opt || !x || !labels) {
        fprintf(stderr, "bench_conv: %s\n", accel_last_error());
        exit(1);
    }
    accel_rng r;
    accel_rng_init(&r, 2);
    accel_rng_normal_(&r, x, 0.0, 1.0);
    int64_t *lab = malloc(sizeof *lab * (size_t)batch);
    for (int64_t i = 0; i < batch; i++) lab[i] = i % 10;
    accel_tensor_from_host(labels, lab);
    free(lab);
    accel_module_train(m, true);
    double ms[64], cpu[64];
    for (int i = -1; i < reps; i++) {
        long flt;
        double t0 = accel_now_seconds(), c0 = bench_cpu_seconds(&flt);
        accel_tensor *loss = accel_cross_entropy(accel_module_call(m, x), labels, -100);
        if (!loss || accel_backward(loss) != ACCEL_OK || accel_optimizer_step(opt) != ACCEL_OK ||
            accel_optimizer_zero_grad(opt) != ACCEL_OK) {
            fprintf(stderr, "bench_conv: %s\n", accel_last_error());
            exit(1);
        }
        accel_step_reset();
        if (i >= 0) {
            ms[i] = (accel_now_seconds() - t0) * 1e3;
            cpu[i] = (bench_cpu_seconds(&flt) - c0) * 1e3;
        }
    }
    printf("step batch=%lld image=%lld step_ms=%.2f cpu_ms=%.2f\n", (long long)batch, (long long)image,
           bench_median(ms, reps), bench_median(cpu, reps));
    accel_tensor_free(x);
    accel_tensor_free(labels);
    accel_optimizer_free(opt);
    accel_module_free(m);
}

int main(int argc, char **argv) {
    int threads = 2, reps = 5;
    int64_t batch = 64, image = 32;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--batch")) batch = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--image")) image = atoll(argv[i + 1]);
        else {
            fprintf(stderr, "bench_conv: unknown flag %s\n", argv[i]);
            return 2;
        }
    }
    if (reps < 1 || reps > 64 || threads < 1 || batch < 1 || image < 4) {
        fprintf(stderr, "bench_conv: --reps in 1..64, --threads, --batch >= 1, --image >= 4\n");
        return 2;
    }
    omp_set_num_threads(threads);
    for (size_t i = 0; i < sizeof SHAPES / sizeof SHAPES[0]; i++) bench_shape(&SHAPES[i], reps);
    bench_step(batch, image, reps);
    accel_thread_cleanup();
    return 0;
}
