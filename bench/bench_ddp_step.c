/* bench_ddp_step: the Llama training step of bench_llama_step, data-parallel
 * through the Accelerator (run it alone for 1 process, under
 * `accel launch --num_processes N` for N). Per step: accel_llama_loss on this
 * rank's random ids (seeded by rank), accel_accelerator_backward (bucketed
 * all-reduce overlapping backward), accel_accelerator_optimizer_step (AdamW),
 * accel_accelerator_zero_grad, accel_step_reset.
 *
 *     bench_ddp_step [--steps N] [--warmup W] [--batch B] [--seq T] [--hidden C]
 *                    [--layers L] [--heads H] [--ffn F] [--vocab V]
 *                    [--bucket-mb M] [--no-sync]
 *
 * --no-sync wraps every step in accel_accelerator_no_sync_begin/end: no
 * gradient all-reduce at all, so (sync step - no-sync step) is the
 * communication time that backward does NOT hide behind compute.
 *
 * Every rank prints one line per step; rank 0 then prints the summary line
 *     impl=accel mode=sync|no_sync world=N threads=P tokens_per_s=... step_ms_median=...
 * where step_ms_median is the largest of the ranks' median step times and
 * tokens_per_s = world * B * T / step_ms_median (tokens of all ranks).
 * bench/ddp.sh parses it. Every rank also prints "rank R peak_rss_mb=M zero_stage=S"
 * (its getrusage peak; the ZeRO stage comes from the launcher, bench/zero.sh). */
#include <cblas.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "accel/accel.h"
#include "bench_util.h"
#include "accel/accelerator.h"

static void fail(const char *what) {
    fprintf(stderr, "bench_ddp_step: %s: %s\n", what, accel_last_error());
    exit(1);
}

int main(int argc, char **argv) {
    bench_llama_args a;
    if (bench_llama_parse("bench_ddp_step", "bucket-mb no-sync", argc, argv, &a)) return 2;
    int steps = a.steps, warmup = a.warmup;
    int64_t bucket_mb = a.bucket_mb;
    bool no_sync = a.no_sync;
    int64_t B = a.B, T = a.T, V = a.V;

    accel_accelerator_opts ao = accel_accelerator_opts_default();
    if (bucket_mb) ao.bucket_cap_bytes = bucket_mb << 20;
    accel_accelerator *acc = accel_accelerator_new(&ao);
    if (!acc) fail("accel_accelerator_new");
    int world = accel_accelerator_num_processes(acc), rank = accel_accelerator_process_index(acc);
    if (accel_accelerator_is_main_process(acc)) {
        char desc[4096];
        printf("%s", accel_accelerator_describe(acc, desc, sizeof desc));
        printf("\n");
    }
    /* Thread setup actually in effect in every rank (the launcher sets
     * OMP_NUM_THREADS = cores / local processes; accel's GEMMs run OpenBLAS
     * single-threaded inside its OpenMP pool). */
    printf("rank %d: OMP_NUM_THREADS=%s omp_max_threads=%d openblas_threads=%d openblas_parallel=%d\n", rank,
           getenv("OMP_NUM_THREADS") ? getenv("OMP_NUM_THREADS") : "(unset)", accel_num_threads(),
           openblas_get_num_threads(), openblas_get_parallel());
    fflush(stdout);

    /* The same initial weights on every rank (prepare broadcasts rank 0's anyway). */
    accel_set_seed(acc, 0, false);
    accel_llama_config cfg = bench_llama_config(&a);
    accel_module *model = accel_llama_new(&cfg, ACCEL_CPU_DEVICE);
    if (!model) fail("accel_llama_new");
    accel_tensor **params = NULL;
    int np = accel_module_parameters(model, &params);
    if (np <= 0) fail("accel_module_parameters");
    int64_t n_params = 0;
    for (int i = 0; i < np; i++) n_params += accel_numel(params[i]);
    accel_optim_hparams hp = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 1e-4);
    accel_optimizer *opt = accel_optimizer_new_params(ACCEL_OPTIM_ADAMW, np, params, &hp);
    accel_free(params);
    if (!opt) fail("accel_optimizer_new_params");
    if (accel_accelerator_prepare(acc, model, opt, NULL, NULL) != ACCEL_OK) fail("accel_accelerator_prepare");

    /* This rank's ids: an LCG seeded by rank (independent of the library RNG). */
    int64_t ishape[2] = {B, T};
    accel_tensor *ids = accel_tensor_new(ACCEL_I64, 2, ishape, ACCEL_CPU_DEVICE);
    if (!ids) fail("ids");
    uint64_t s = 12345u + 7919u * (uint64_t)rank;
    for (int64_t i = 0; i < B * T; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        ((int64_t *)ids->data)[i] = (int64_t)((s >> 33) % (uint64_t)V);
    }

    int total = warmup + steps;
    double *t_step = calloc((size_t)total, sizeof(double)), *t_fwd = calloc((size_t)total, sizeof(double));
    double *t_bwd = calloc((size_t)total, sizeof(double)), *t_opt = calloc((size_t)total, sizeof(double));
    double *t_cpu = calloc((size_t)total, sizeof(double));
    if (!t_step || !t_fwd || !t_bwd || !t_opt || !t_cpu) fail("calloc");
    /* Start the timed loop together. */
    if (accel_accelerator_wait_for_everyone(acc) != ACCEL_OK) fail("wait_for_everyone");
    float loss_v = 0.0f;
    long flt0, flt1;
    for (int it = 0; it < total; it++) {
        double c0 = bench_cpu_seconds(&flt0), t0 = accel_now_seconds();
        if (no_sync) accel_accelerator_no_sync_begin(acc, model);
        accel_tensor *loss = accel_llama_loss(model, ids);
        if (!loss) fail("accel_llama_loss");
        double t1 = accel_now_seconds();
        if (accel_accelerator_backward(acc, loss) != ACCEL_OK) fail("accel_accelerator_backward");
        double t2 = accel_now_seconds();
        loss_v = *(float *)loss->data;
        if (accel_accelerator_optimizer_step(acc, opt) != ACCEL_OK) fail("accel_accelerator_optimizer_step");
        accel_accelerator_zero_grad(acc, opt);
        if (no_sync) accel_accelerator_no_sync_end(acc, model);
        accel_step_reset();
        double t3 = accel_now_seconds();
        t_cpu[it] = bench_cpu_seconds(&flt1) - c0;
        t_step[it] = t3 - t0;
        t_fwd[it] = t1 - t0;
        t_bwd[it] = t2 - t1;
        t_opt[it] = t3 - t2;
        printf("rank %d step %d%s: %.1f ms (fwd %.1f bwd %.1f opt+reset %.1f) cpu %.1f ms, %ld page faults, "
               "loss %.4f\n", rank, it, it < warmup ? " (warm-up)" : "", t_step[it] * 1e3, t_fwd[it] * 1e3,
               t_bwd[it] * 1e3, t_opt[it] * 1e3, t_cpu[it] * 1e3, flt1 - flt0, loss_v);
        fflush(stdout);
    }
    /* Peak resident memory of this rank (the ZeRO bench compares strategies by it). */
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("rank %d peak_rss_mb=%.1f zero_stage=%d\n", rank, ru.ru_maxrss / 1024.0, accel_accelerator_zero_stage(acc));
    fflush(stdout);
    /* Per-rank medians, gathered: the job is as fast as its slowest rank. */
    int64_t one = 4;
    accel_tensor *mine = accel_tensor_new(ACCEL_F32, 1, &one, ACCEL_CPU_DEVICE);
    if (!mine) fail("medians");
    float *m = mine->data;
    m[0] = (float)bench_median(t_step + warmup, steps);
    m[1] = (float)bench_median(t_fwd + warmup, steps);
    m[2] = (float)bench_median(t_bwd + warmup, steps);
    m[3] = (float)bench_median(t_opt + warmup, steps);
    float cpu_med = (float)bench_median(t_cpu + warmup, steps);
    accel_tensor *all = accel_accelerator_gather(acc, mine);
    if (!all) fail("gather");
    if (accel_accelerator_is_main_process(acc)) {
        const float *g = all->data;
        float worst[4] = {0, 0, 0, 0};
        for (int r = 0; r < world; r++)
            for (int k = 0; k < 4; k++) worst[k] = g[4 * r + k] > worst[k] ? g[4 * r + k] : worst[k];
        double med = worst[0];
        printf("model params=%lld\n", (long long)n_params);
        printf("impl=accel mode=%s world=%d threads=%d tokens_per_s=%.1f step_ms_median=%.1f fwd_ms=%.1f "
               "bwd_ms=%.1f opt_ms=%.1f cpu_ms_rank0=%.1f loss=%.4f\n",
               no_sync ? "no_sync" : "sync", world, accel_num_threads(), (double)(world * B * T) / med,
               med * 1e3, worst[1] * 1e3, worst[2] * 1e3, worst[3] * 1e3, cpu_med * 1e3, loss_v);
        fflush(stdout);
    }
    accel_step_reset();
    accel_tensor_free(mine);
    free(t_step);
    free(t_fwd);
    free(t_bwd);
    free(t_opt);
    free(t_cpu);
    accel_tensor_free(ids);
    accel_accelerator_free(acc);
    accel_optimizer_free(opt);
    accel_module_free(model);
    return 0;
}
