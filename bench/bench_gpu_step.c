/* bench_gpu_step: the Llama training step (forward accel_llama_loss under the
 * Accelerator's autocast, backward, AdamW, zero_grad, step reset) on the
 * Accelerator's device (cuda:0 on a GPU machine), timed over N steps after
 * warm-up, with MFU against the peak of the device's own GEMM kernel (the
 * backend table's gemm: cuBLASLt on cuda; bf16 operands, f32 accumulation)
 * measured in the same process.
 *
 *     bench_gpu_step [--steps N] [--warmup W] [--batch B] [--seq T] [--hidden C]
 *                    [--layers L] [--heads H] [--ffn F] [--vocab V]
 *                    [--mixed_precision no|bf16|fp16] [--peak-size S]
 *
 * The device is the Accelerator's: cuda:LOCAL_RANK when a GPU is present,
 * else the cpu (tools/gpu_check.sh dry runs it there with a tiny config so
 * the script's logic is tested without a GPU). Every timing ends with a
 * device synchronisation. Prints one line per step and the summary line
 *     impl=accel device=... mixed_precision=... tokens_per_s=... step_ms_median=...
 *     gemm_peak_tflops=... achieved_tflops=... mfu=... loss=...
 * that tools/gpu_check.sh parses. The ids, the FLOPs count and the timed
 * step are bench_util.h's, shared with bench_llama_step. */
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"
#include "core/backend.h"
#include "bench_util.h"

static void fail(const char *what) {
    fprintf(stderr, "bench_gpu_step: %s: %s\n", what, accel_last_error());
    exit(1);
}

static accel_tensor *device_tensor(accel_dtype dt, int64_t r, int64_t c, accel_device dev, double v) {
    accel_tensor *t = accel_tensor_new(dt, 2, (int64_t[]){r, c}, dev);
    if (!t || accel_fill_(t, v) != ACCEL_OK) fail("peak operands");
    return t;
}

/* TFLOP/s of the device's GEMM kernel on S x S x S, bf16 A and B, f32 C: the
 * best of 10 calls after 2 warm-ups (each call synchronised). */
static double gemm_peak(accel_device dev, int64_t S) {
    accel_tensor *a = device_tensor(ACCEL_BF16, S, S, dev, 0.01), *b = device_tensor(ACCEL_BF16, S, S, dev, 0.02);
    accel_tensor *c = device_tensor(ACCEL_F32, S, S, dev, 0.0);
    accel_k_gemm g = {.c = c, .a = a, .b = b, .M = S, .N = S, .K = S, .lda = S, .ldb = S, .ldc = S,
                      .alpha = 1.0f, .beta = 0.0f};
    double best = 1e30;
    for (int r = -2; r < 10; r++) {
        double t0 = accel_now_seconds();
        if (ACCEL_KERNEL("gemm_peak", dev, gemm, &g) != ACCEL_OK || accel_device_synchronize(dev) != ACCEL_OK)
            fail("gemm_peak");
        double t = accel_now_seconds() - t0;
        if (r >= 0 && t < best) best = t;
    }
    accel_tensor_free(a);
    accel_tensor_free(b);
    accel_tensor_free(c);
    return 2.0 * (double)S * S * S / best / 1e12;
}

int main(int argc, char **argv) {
    int64_t peak_size = 8192;
    /* --peak-size is this program's own; the rest are bench_llama_parse's */
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    int n = 0;
    if (!rest) return 1;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--peak-size") && i + 1 < argc) peak_size = atoll(argv[++i]);
        else rest[n++] = argv[i];
    }
    bench_llama_args a;
    int bad = bench_llama_parse("bench_gpu_step", "mixed_precision", n, rest, &a);
    free(rest);
    if (bad || peak_size < 16) return 2;
    accel_accelerator_opts ao = accel_accelerator_opts_default();
    ao.mixed_precision = a.mixed_precision;
    accel_accelerator *acc = accel_accelerator_new(&ao);
    if (!acc) fail("accel_accelerator_new");
    accel_device dev = accel_accelerator_device(acc);
    char dname[32];
    accel_device_str(dev, dname, sizeof dname);
    double peak = gemm_peak(dev, peak_size);
    printf("device=%s gemm_peak_tflops=%.2f (bf16 %lld^3 through the %s backend's gemm)\n", dname, peak,
           (long long)peak_size, dname);

    accel_manual_seed(0);
    accel_module *model;
    accel_optimizer *opt;
    int64_t n_params;
    const char *failed = bench_llama_training(acc, &a, dev, &model, &opt, &n_params);
    if (failed) fail(failed);

    accel_tensor *ids = bench_llama_ids(&a, 12345, dev);
    if (!ids) fail("ids");
    int64_t n_mm;
    double flops = bench_llama_flops(&a, &n_mm), tokens = (double)(a.B * a.T);
    int total = a.warmup + a.steps;
    double *t_step = calloc((size_t)total, sizeof(double)), *t_cpu = calloc((size_t)total, sizeof(double));
    if (!t_step || !t_cpu) fail("calloc");
    double loss_v = 0.0;
    for (int it = 0; it < total; it++) {
        bench_step_time st;
        if ((failed = bench_llama_step(acc, model, opt, ids, NULL, &st))) fail(failed);
        t_step[it] = st.total;
        t_cpu[it] = st.cpu; /* host time: launch and framework overhead */
        loss_v = st.loss;
        printf("step %d%s: %.1f ms (host cpu %.1f ms, %ld page faults) loss %.4f\n", it, it < a.warmup ? " (warm-up)" : "",
               t_step[it] * 1e3, t_cpu[it] * 1e3, st.faults, loss_v);
        fflush(stdout);
    }
    double med = bench_median(t_step + a.warmup, a.steps), achieved = flops / med / 1e12;
    printf("model matmul_params=%lld tflop_per_step=%.3f\n", (long long)n_mm, flops / 1e12);
    printf("impl=accel device=%s mixed_precision=%s tokens_per_s=%.1f step_ms_median=%.2f cpu_ms_median=%.2f "
           "gemm_peak_tflops=%.2f achieved_tflops=%.2f mfu=%.3f loss=%.4f\n",
           dname, a.mixed_precision, tokens / med, med * 1e3, bench_median(t_cpu + a.warmup, a.steps) * 1e3, peak,
           achieved, achieved / peak, loss_v);
    free(t_step);
    free(t_cpu);
    accel_optimizer_free(opt);
    accel_tensor_free(ids);
    accel_accelerator_free(acc);
    accel_module_free(model);
    return 0;
}
