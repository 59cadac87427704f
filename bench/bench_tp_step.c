/* bench_tp_step: the Llama training step of bench_ddp_step under tensor
 * parallelism through the Accelerator (under `accel launch --num_processes N`):
 *
 *     bench_tp_step --tp P [--sp] [--steps N] [--warmup W] [--batch B] [--seq T]
 *                   [--hidden C] [--layers L] [--heads H] [--ffn F] [--vocab V] [--save-pretrained DIR]
 *
 * The mesh is dp_shard N / P x tp P (DDP over the data-parallel ranks). Per
 * step: accel_llama_loss on this rank's data-parallel batch (ids seeded by
 * the data-parallel rank), accel_accelerator_backward, AdamW step, zero_grad.
 * Every rank prints what it holds, counted exactly from the tensors after
 * the last step:
 *     rank R param_bytes=... grad_bytes=... optim_bytes=... act_peak_bytes=...
 * (its parameters, their gradients and AdamW's state, each tensor counted
 * once; act_peak_bytes: the step arena's high-water mark over the last
 * step's loss and backward, the activations and their gradients). Rank 0
 * then prints
 *     impl=accel tp=P sp=0|1 world=N step_ms_median=... cpu_ms_median=... tp_bytes_per_step=...
 *         peak_rss_mb=... loss0=...
 * step_ms_median: the slowest rank's median; cpu_ms_median: rank 0's process
 * CPU time per step, median (bench/tp_peer.py prints the same for PyTorch);
 * loss0: rank 0's loss of the first step (the initial weights: every mesh's
 * equals one process's); tp_bytes_per_step: what this
 * rank (process) handed to the tensor-parallel collectives in one step (src/ops/tp_stats.h:
 * all-reduce buffers, all-gather / reduce-scatter inputs; DDP's gradient
 * all-reduce not counted); peak_rss_mb: rank 0's. --save-pretrained DIR:
 * rank 0 first writes the initial weights there as a transformers checkpoint
 * (accel_save_pretrained), which bench/tp_peer.py --load trains too. */
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "accel/accel.h"
#include "bench_util.h"
#include "ops/tp_stats.h"

static void fail(const char *what) {
    fprintf(stderr, "bench_tp_step: %s: %s\n", what, accel_last_error());
    exit(1);
}

/* The bytes of the n tensors (grads: their gradients), a tensor held twice
 * (tied) counted once. */
static int64_t tensor_bytes(accel_tensor **t, int n, bool grads) {
    int64_t b = 0;
    for (int i = 0; i < n; i++) {
        bool seen = false;
        for (int j = 0; j < i && !seen; j++) seen = t[j] == t[i];
        accel_tensor *x = grads ? t[i]->grad : t[i];
        if (!seen && x) b += (int64_t)accel_nbytes(x);
    }
    return b;
}

static int64_t optimizer_bytes(accel_optimizer *opt) {
    accel_named_state *st;
    int n = accel_optimizer_state(opt, &st);
    if (n < 0) fail("accel_optimizer_state");
    int64_t b = 0;
    for (int i = 0; i < n; i++)
        if (st[i].t) b += (int64_t)accel_nbytes(st[i].t);
    accel_named_state_free(st, n);
    return b;
}

int main(int argc, char **argv) {
    int tp = 1;
    bool sp = false;
    const char *save_dir = NULL;
    char *rest[64];
    int n = 0;
    for (int i = 0; i < argc && n < 64; i++) {
        if (!strcmp(argv[i], "--tp") && i + 1 < argc) tp = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--sp")) sp = true;
        else if (!strcmp(argv[i], "--save-pretrained") && i + 1 < argc) save_dir = argv[++i];
        else rest[n++] = argv[i];
    }
    bench_llama_args a;
    if (bench_llama_parse("bench_tp_step", "", n, rest, &a)) return 2;
    int world = accel_dist_world_size();
    if (tp < 1 || world % tp) {
        fprintf(stderr, "bench_tp_step: --tp %d does not divide the %d processes\n", tp, world);
        return 2;
    }
    accel_accelerator_opts ao = accel_accelerator_opts_default();
    ao.parallelism = (accel_parallelism_opts){.tp_size = tp, .dp_shard_size = world / tp,
                                              .sequence_parallelism = sp ? ACCEL_TRUE : 0};
    accel_accelerator *acc = accel_accelerator_new(&ao);
    if (!acc) fail("accel_accelerator_new");
    int rank = accel_accelerator_process_index(acc);
    accel_set_seed(acc, 0, false);
    accel_llama_config cfg = bench_llama_config(&a);
    accel_module *model = accel_llama_new(&cfg, ACCEL_CPU_DEVICE);
    /* before prepare, which keeps only this rank's shards */
    if (model && save_dir && rank == 0 && accel_save_pretrained(model, save_dir, 0)) fail("--save-pretrained");
    if (!model || accel_accelerator_prepare_model(acc, model)) fail("the model");
    accel_optim_hparams hp = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 1e-4);
    accel_optimizer *opt = accel_optimizer_new_module(ACCEL_OPTIM_ADAMW, model, &hp);
    if (!opt || accel_accelerator_prepare_optimizer(acc, opt)) fail("the optimizer");
    accel_tensor *ids = bench_llama_ids(&a, 12345u + 7919u * (uint64_t)(rank / tp), ACCEL_CPU_DEVICE);
    if (!ids) fail("ids");
    int total = a.warmup + a.steps;
    double *t = calloc((size_t)total, sizeof *t), *cpu = calloc((size_t)total, sizeof *cpu), loss0 = 0;
    uint64_t bytes = 0;
    size_t act = 0;
    int64_t grad_bytes = 0;
    accel_tensor **params = NULL;
    int np = accel_module_parameters(model, &params);
    if (np <= 0) fail("accel_module_parameters");
    if (!t || !cpu || accel_accelerator_wait_for_everyone(acc)) fail("start");
    for (int it = 0; it < total; it++) {
        uint64_t b0 = accel__tp_bytes();
        long faults;
        double t0 = accel_now_seconds(), c0 = bench_cpu_seconds(&faults);
        accel_tensor *loss = accel_llama_loss(model, ids);
        if (!loss || accel_accelerator_backward(acc, loss)) fail("the step");
        if (it == 0) loss0 = accel_item(loss);
        act = accel_arena_peak(accel_step_arena());
        grad_bytes = tensor_bytes(params, np, true);
        if (accel_accelerator_optimizer_step(acc, opt) || accel_accelerator_zero_grad(acc, opt)) fail("the step");
        accel_step_reset();
        t[it] = accel_now_seconds() - t0;
        cpu[it] = bench_cpu_seconds(&faults) - c0;
        bytes = accel__tp_bytes() - b0;
    }
    printf("rank %d param_bytes=%lld grad_bytes=%lld optim_bytes=%lld act_peak_bytes=%zu\n", rank,
           (long long)tensor_bytes(params, np, false), (long long)grad_bytes, (long long)optimizer_bytes(opt), act);
    fflush(stdout);
    accel_free(params);
    double mine = bench_median(t + a.warmup, a.steps), slowest = mine;
    if (accel_pg_all_reduce(accel_dist_default_group(), &slowest, 1, ACCEL_F64, ACCEL_REDUCE_MAX)) fail("reduce");
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    if (rank == 0)
        printf("impl=accel tp=%d sp=%d world=%d step_ms_median=%.1f cpu_ms_median=%.1f tp_bytes_per_step=%llu "
               "peak_rss_mb=%.1f loss0=%.6f\n",
               tp, sp, world, slowest * 1e3, bench_median(cpu + a.warmup, a.steps) * 1e3, (unsigned long long)bytes,
               ru.ru_maxrss / 1024.0, loss0);
    free(t);
    free(cpu);
    accel_tensor_free(ids);
    accel_accelerator_free(acc);
    accel_optimizer_free(opt);
    accel_module_free(model);
    return 0;
}
