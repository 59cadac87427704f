/* bench_sdpa: accel_sdpa alone, forward + backward, on the Llama step's
 * attention (batch 8, 8 heads, seq 256, head dim 64 by default), with q, k, v
 * in the dtype autocast gives them (the projections' outputs, [B, T, h, D]
 * seen as [B, h, T, D] as split_heads makes them; RoPE would make q and k
 * dense). Prints the median wall and process CPU time
 * per call (the machine may be shared: compare CPU time).
 *
 *   bench_sdpa [--dtype f32|bf16|f16] [--batch B] [--heads H] [--kv-heads Hkv]
 *              [--seq T] [--head-dim D] [--iters N] [--threads N] */
#include <time.h>

#include "accel/accel.h"
#include "bench_util.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* A persistent [B, T, h, D] projection output of dt seen as [B, h, T, D]. */
static accel_tensor *projection(uint64_t seed, accel_dtype dt, int64_t B, int64_t T, int64_t h, int64_t D) {
    accel_tensor *t = accel_tensor_new(dt, ACCEL_SHAPE(B, T, h, D), ACCEL_CPU_DEVICE);
    accel_rng r;
    if (!t || accel_rng_init(&r, seed) != ACCEL_OK || accel_rng_normal_(&r, t, 0.0, 1.0) != ACCEL_OK) return NULL;
    t->requires_grad = true;
    return t;
}

int main(int argc, char **argv) {
    const char *dts = "bf16";
    int64_t B = 8, H = 8, Hkv = 8, T = 256, D = 64;
    int iters = 10, threads = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *f = argv[i], *v = argv[i + 1];
        if (!strcmp(f, "--dtype")) dts = v;
        else if (!strcmp(f, "--batch")) B = atoll(v);
        else if (!strcmp(f, "--heads")) H = atoll(v);
        else if (!strcmp(f, "--kv-heads")) Hkv = atoll(v);
        else if (!strcmp(f, "--seq")) T = atoll(v);
        else if (!strcmp(f, "--head-dim")) D = atoll(v);
        else if (!strcmp(f, "--iters")) iters = atoi(v);
        else if (!strcmp(f, "--threads")) threads = atoi(v);
        else {
            fprintf(stderr, "bench_sdpa: unknown flag %s\n", f);
            return 2;
        }
    }
    accel_dtype dt = !strcmp(dts, "f32") ? ACCEL_F32 : !strcmp(dts, "f16") ? ACCEL_F16 : ACCEL_BF16;
    if (iters < 1 || iters > 1000 || B < 1 || H < 1 || Hkv < 1 || H % Hkv || T < 1 || D < 1) {
        fprintf(stderr, "bench_sdpa: bad sizes or iteration count\n");
        return 2;
    }
    accel_set_num_threads(threads);
    accel_tensor *q = projection(1, dt, B, T, H, D), *k = projection(2, dt, B, T, Hkv, D),
                 *v = projection(3, dt, B, T, Hkv, D);
    if (!q || !k || !v) {
        fprintf(stderr, "bench_sdpa: %s\n", accel_last_error());
        return 1;
    }
    double *wall = malloc(sizeof(double) * (size_t)iters), *cpu = malloc(sizeof(double) * (size_t)iters);
    for (int it = -1; it < iters; it++) { /* one warm-up call */
        long mf;
        double w0 = now(), c0 = bench_cpu_seconds(&mf);
        accel_tensor *o = accel_sdpa(accel_transpose(q, 1, 2), accel_transpose(k, 1, 2), accel_transpose(v, 1, 2),
                                     true, 0.0);
        if (!o || accel_backward(accel_sum_all(o)) != ACCEL_OK) {
            fprintf(stderr, "bench_sdpa: %s\n", accel_last_error());
            return 1;
        }
        accel_step_reset();
        if (it >= 0) {
            wall[it] = now() - w0;
            cpu[it] = bench_cpu_seconds(&mf) - c0;
        }
    }
    printf("sdpa %s B=%lld H=%lld Hkv=%lld T=%lld D=%lld threads=%d: forward+backward median wall %.2f ms, cpu %.2f ms\n",
           dts, (long long)B, (long long)H, (long long)Hkv, (long long)T, (long long)D, threads,
           1e3 * bench_median(wall, iters), 1e3 * bench_median(cpu, iters));
    free(wall);
    free(cpu);
    accel_tensor_free(q);
    accel_tensor_free(k);
    accel_tensor_free(v);
    accel_thread_cleanup();
    return 0;
}
