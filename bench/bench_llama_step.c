/* bench_llama_step: one Llama training step (forward accel_llama_loss,
 * accel_backward, AdamW step, zero_grad, accel_step_reset) timed over N steps
 * after warm-up, with model-FLOPs utilisation against the sgemm peak measured
 * in the same process (cblas_sgemm 2048x1536x512, the qkv/up-proj shape).
 *
 *     bench_llama_step [--steps N] [--warmup W] [--batch B] [--seq T]
 *                      [--hidden C] [--layers L] [--heads H] [--ffn F] [--vocab V]
 *                      [--threads P] [--profile] [--mixed_precision no|bf16|fp16]
 *
 * The step runs through an accel_accelerator (opts.mixed_precision; the
 * loss under its autocast, accel_accelerator_backward / optimizer_step /
 * zero_grad), as a training script would. The first lines name the CPU, its
 * usable ISA and the CPU kernel variant (accel_cpu_describe).
 *
 * Prints one line per timed step and a summary line
 *     impl=accel threads=P tokens_per_s=... step_ms_median=... sgemm_gflops=...
 *     sgemm_best_gflops=... mfu=...
 * that bench/llama_step.sh parses (MFU is against the best of the 15 sgemm
 * calls, the one least disturbed by other processes on a shared machine). --profile adds the median split of a step
 * into forward / backward / optimizer / reset.
 *
 * FLOPs per step: "model FLOPs" as PaLM counts them (bench_llama_flops in
 * bench_util.h). The ids, the model and the timed step are bench_util.h's,
 * shared with bench_gpu_step. */
#include <cblas.h>
#include <sys/resource.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"
#include "bench_util.h"

/* GFLOP/s of cblas_sgemm NN on [M,K] x [K,N] over 15 calls after 2 warm-ups:
 * the median, and the best call in *best (the peak: on a shared machine the
 * median is pulled down by other processes). */
static double sgemm_peak(int M, int N, int K, double *best) {
    *best = 0.0;
    float *a = accel_malloc((size_t)M * K * sizeof(float));
    float *b = accel_malloc((size_t)K * N * sizeof(float));
    float *c = accel_malloc((size_t)M * N * sizeof(float));
    if (!a || !b || !c) {
        accel_free(a);
        accel_free(b);
        accel_free(c);
        return 0.0;
    }
    for (size_t i = 0; i < (size_t)M * K; i++) a[i] = (float)(i % 13) * 0.01f;
    for (size_t i = 0; i < (size_t)K * N; i++) b[i] = (float)(i % 7) * 0.01f;
    memset(c, 0, (size_t)M * N * sizeof(float));
    enum { REPS = 15 };
    double t[REPS];
    for (int r = -2; r < REPS; r++) {
        double t0 = accel_now_seconds();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, a, K, b, N, 0.0f, c, N);
        if (r >= 0) t[r] = accel_now_seconds() - t0;
    }
    accel_free(a);
    accel_free(b);
    accel_free(c);
    double tmin = t[0];
    for (int r = 1; r < REPS; r++) tmin = t[r] < tmin ? t[r] : tmin;
    *best = 2.0 * M * N * K / tmin / 1e9;
    return 2.0 * M * N * K / bench_median(t, REPS) / 1e9;
}

static void fail(const char *what) {
    fprintf(stderr, "bench_llama_step: %s: %s\n", what, accel_last_error());
    exit(1);
}

int main(int argc, char **argv) {
    bench_llama_args a;
    if (bench_llama_parse("bench_llama_step", "threads profile mixed_precision", argc, argv, &a)) return 2;
    int steps = a.steps, warmup = a.warmup, threads = a.threads;
    bool profile = a.profile;
    int64_t B = a.B, T = a.T;
    accel_set_num_threads(threads);
    openblas_set_num_threads(threads);
    char cpu[512];
    printf("%s", accel_cpu_describe(cpu, sizeof cpu));
    accel_accelerator_opts ao = {.mixed_precision = a.mixed_precision};
    accel_accelerator *acc = accel_accelerator_new(&ao);
    if (!acc) fail("accel_accelerator_new");
    double peak_best, peak = sgemm_peak(2048, 1536, 512, &peak_best);

    accel_manual_seed(0);
    accel_module *model;
    accel_optimizer *opt;
    int64_t n_params;
    const char *failed = bench_llama_training(acc, &a, ACCEL_CPU_DEVICE, &model, &opt, &n_params);
    if (failed) fail(failed);

    accel_tensor *ids = bench_llama_ids(&a, 12345, ACCEL_CPU_DEVICE);
    if (!ids) fail("ids");
    int64_t n_mm;
    double flops = bench_llama_flops(&a, &n_mm), tokens = (double)(B * T);

    int total = warmup + steps;
    double *t_step = calloc((size_t)total, sizeof(double));
    double *t_fwd = calloc((size_t)total, sizeof(double)), *t_bwd = calloc((size_t)total, sizeof(double));
    double *t_opt = calloc((size_t)total, sizeof(double)), *t_rst = calloc((size_t)total, sizeof(double));
    double *t_cpu = calloc((size_t)total, sizeof(double));
    if (!t_step || !t_fwd || !t_bwd || !t_opt || !t_rst || !t_cpu) fail("calloc");
    float loss_v = 0.0f;
    for (int it = 0; it < total; it++) {
        bench_step_time st;
        if ((failed = bench_llama_step(acc, model, opt, ids, &st))) fail(failed);
        t_step[it] = st.total, t_fwd[it] = st.fwd, t_bwd[it] = st.bwd, t_opt[it] = st.opt, t_rst[it] = st.reset;
        t_cpu[it] = st.cpu;
        loss_v = st.loss;
        printf("step %d%s: %.1f ms (fwd %.1f bwd %.1f opt %.1f reset %.1f) cpu %.1f ms, %ld page faults, "
               "loss %.4f\n", it, it < warmup ? " (warm-up)" : "", t_step[it] * 1e3, t_fwd[it] * 1e3,
               t_bwd[it] * 1e3, t_opt[it] * 1e3, t_rst[it] * 1e3, t_cpu[it] * 1e3, st.faults, loss_v);
        fflush(stdout);
    }
    double med = bench_median(t_step + warmup, steps), tmin = t_step[warmup];
    for (int i = warmup; i < total; i++) tmin = t_step[i] < tmin ? t_step[i] : tmin;
    double gflops = flops / med / 1e9;
    if (profile)
        printf("split_ms_median fwd=%.1f bwd=%.1f opt=%.1f reset=%.1f\n", bench_median(t_fwd + warmup, steps) * 1e3,
               bench_median(t_bwd + warmup, steps) * 1e3, bench_median(t_opt + warmup, steps) * 1e3,
               bench_median(t_rst + warmup, steps) * 1e3);
    printf("model params=%lld matmul_params=%lld gflop_per_step=%.1f\n", (long long)n_params,
           (long long)n_mm, flops / 1e9);
    printf("impl=accel mixed_precision=%s threads=%d tokens_per_s=%.1f step_ms_median=%.1f step_ms_min=%.1f "
           "cpu_ms_median=%.1f achieved_gflops=%.1f sgemm_gflops=%.1f sgemm_best_gflops=%.1f mfu=%.3f "
           "loss=%.4f\n",
           a.mixed_precision, threads, tokens / med, med * 1e3, tmin * 1e3, bench_median(t_cpu + warmup, steps) * 1e3, gflops, peak,
           peak_best, gflops / peak_best, loss_v);
    free(t_step);
    free(t_fwd);
    free(t_bwd);
    free(t_opt);
    free(t_rst);
    free(t_cpu);
    accel_optimizer_free(opt);
    accel_tensor_free(ids);
    accel_accelerator_free(acc);
    accel_module_free(model);
    return 0;
}
