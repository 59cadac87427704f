/* bench_pipeline: the pipeline's idle fraction per schedule beside the
 * theoretical bubble (p - 1) / (m + p - 1) (interleaved 1F1B with v chunks
 * per stage: (p - 1) / (v m + p - 1)), and the inputs each stage holds
 * (1F1B: at most p - s micro-batches; GPipe: m; interleaved: Megatron's
 * warm-up + 1 (chunk, micro-batch) pairs). Run under
 * `accel launch --num_processes P` (P stages, pp_size = P):
 *
 *     bench_pipeline [--schedule 1f1b|gpipe|interleaved] [--virtual-stages V] [--micro-batches M] [--steps N]
 *                    [--batch B] [--seq T] [--hidden C] [--layers L] [--vocab V] [--save-pretrained DIR]
 *
 * A Llama (f32, untied, L layers split over the stages by parameter count;
 * interleaved: into P x V equal chunks) trained with SGD through
 * accel_accelerator_pipeline_step. Per step each
 * stage reports (accel_pipeline_report) its wall time and its busy time (its
 * forwards, recomputes and backwards); idle = 1 - busy / wall. The bench also
 * takes each stage's process CPU time over the step (getrusage: the same
 * figure bench/pipeline_peer.py takes for torch.distributed.pipelining, whose
 * stages report no busy time); idle_cpu = 1 - cpu / wall. Rank 0 prints,
 * after the first (warm-up) step, the medians over steps:
 *     schedule=1f1b p=2 m=4 bubble_theory=0.200 idle_mean=... step_ms=... cpu_ms=...
 *     stage=s layers=[a,b) chunks=v idle=... busy_ms=... cpu_ms=... idle_cpu=... peak_in_flight=k held_kib=...
 *     losses=l0,l1,...   (every step's, the warm-up's first)
 * (cpu_ms on the schedule line: the stages' CPU summed, median over steps)
 * --save-pretrained DIR: rank 0 first writes the initial weights there as a
 * transformers checkpoint (accel_save_pretrained), which the PyTorch peer
 * loads so both train the same model and their losses can be compared.
 * (interleaved: [a,b) is the stage's first chunk, the others p (b - a) layers apart)
 * The stages' own work differs (stage 0 embeds, the last runs lm_head and
 * the loss, every backward recomputes its forward), which the theory, with
 * equal stages, does not count. */
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "accel/accel.h"
#include "accel/accelerator.h"
#include "../tests/pipeline_model.h" /* the model the pipeline's tests train, at the bench's sizes */

static void fail(const char *what) {
    fprintf(stderr, "bench_pipeline: %s: %s\n", what, accel_last_error());
    exit(1);
}

/* This process's CPU seconds (all threads) so far. */
static double cpu_seconds(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec * 1e-6;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(int argc, char **argv) {
    const char *sched = "1f1b", *save_dir = NULL;
    int m = 8, steps = 6, layers = 8, virt = 0;
    int64_t B = 16, T = 64, C = 256, V = 4096;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--schedule")) sched = v;
        else if (!strcmp(k, "--micro-batches")) m = atoi(v);
        else if (!strcmp(k, "--virtual-stages")) virt = atoi(v);
        else if (!strcmp(k, "--steps")) steps = atoi(v);
        else if (!strcmp(k, "--batch")) B = atoll(v);
        else if (!strcmp(k, "--seq")) T = atoll(v);
        else if (!strcmp(k, "--hidden")) C = atoll(v);
        else if (!strcmp(k, "--layers")) layers = atoi(v);
        else if (!strcmp(k, "--vocab")) V = atoll(v);
        else if (!strcmp(k, "--save-pretrained")) save_dir = v;
        else {
            fprintf(stderr, "bench_pipeline: unknown option %s\n", k);
            return 2;
        }
    }
    if (steps < 2) steps = 2;
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.parallelism.pp_size = accel_dist_world_size();
    o.parallelism.num_micro_batches = m;
    o.parallelism.pp_schedule = sched;
    o.parallelism.pp_virtual_stages = virt;
    accel_accelerator *acc = accel_accelerator_new(&o);
    if (!acc) fail("accelerator");
    int p = accel_accelerator_num_processes(acc), rank = accel_accelerator_process_index(acc);
    accel_module *model = pipeline_llama((pipeline_model){.seed = 1, .vocab = V, .hidden = C, .ffn = 3 * C,
                                                          .positions = T, .layers = layers, .heads = 8,
                                                          .kv_heads = 8, .tied = false});
    /* before prepare, which keeps only this stage's part of the model */
    if (model && save_dir && rank == 0 && accel_save_pretrained(model, save_dir, 0) != ACCEL_OK)
        fail("--save-pretrained");
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_SGD, 0.01);
    accel_optimizer *opt = model ? accel_optimizer_new_module(ACCEL_OPTIM_SGD, model, &h) : NULL;
    if (!opt || accel_accelerator_prepare(acc, model, opt) != ACCEL_OK) fail("model");
    int64_t *ids = malloc((size_t)(B * T) * sizeof *ids);
    /* per step and stage: wall, busy, cpu; per step: the loss */
    size_t sp = (size_t)steps * (size_t)p;
    double *wall = calloc(sp, sizeof *wall), *busy = calloc(sp, sizeof *busy), *cpu = calloc(sp, sizeof *cpu),
           *losses = calloc((size_t)steps, sizeof *losses);
    if (!ids || !wall || !busy || !cpu || !losses) {
        fprintf(stderr, "bench_pipeline: out of memory\n");
        return 1;
    }
    accel_pipeline_report rep = {0};
    accel_pg *world = accel_dist_default_group();
    for (int s = 0; s < steps; s++) {
        for (int64_t i = 0; i < B * T; i++) ids[i] = (i * 2654435761u + (uint64_t)s * 97) % (uint64_t)V;
        double loss, c0 = cpu_seconds();
        if (accel_accelerator_pipeline_step(acc, model, accel_from_data(ACCEL_I64, ACCEL_SHAPE(B, T), ids), &loss,
                                            &rep) != ACCEL_OK)
            fail("step");
        double mine[3] = {rep.wall_s, rep.busy_s, cpu_seconds() - c0}, all[3 * 64];
        losses[s] = loss;
        if (accel_accelerator_optimizer_step(acc, opt) != ACCEL_OK || accel_accelerator_zero_grad(acc, opt) != ACCEL_OK)
            fail("step");
        accel_step_reset();
        if (p > 64 || accel_pg_all_gather(world, mine, all, 3, ACCEL_F64) != ACCEL_OK) fail("gather");
        for (int k = 0; k < p; k++) {
            wall[s * p + k] = all[3 * k];
            busy[s * p + k] = all[3 * k + 1];
            cpu[s * p + k] = all[3 * k + 2];
        }
    }
    /* every stage's layers, in-flight peak and held bytes, to rank 0 */
    double info[4] = {rep.first_layer, rep.end_layer, rep.peak_in_flight, (double)rep.peak_held_bytes}, infos[4 * 64];
    if (accel_pg_all_gather(world, info, infos, 4, ACCEL_F64) != ACCEL_OK) fail("gather");
    if (rank == 0) {
        int n = steps - 1; /* the first step warms up */
        double *v = malloc((size_t)n * sizeof *v), idle_mean = 0, step_ms, cpu_ms;
        for (int s = 1; s < steps; s++) {
            double w = 0;
            for (int k = 0; k < p; k++) w = wall[s * p + k] > w ? wall[s * p + k] : w;
            v[s - 1] = w;
        }
        step_ms = median(v, n) * 1e3;
        for (int s = 1; s < steps; s++) {
            v[s - 1] = 0;
            for (int k = 0; k < p; k++) v[s - 1] += cpu[s * p + k];
        }
        cpu_ms = median(v, n) * 1e3;
        printf("stage lines: idle = 1 - busy / wall per step, medians over %d steps after a warm-up\n", n);
        for (int k = 0; k < p; k++) {
            for (int s = 1; s < steps; s++) v[s - 1] = 1 - busy[s * p + k] / wall[s * p + k];
            double idle = median(v, n);
            for (int s = 1; s < steps; s++) v[s - 1] = busy[s * p + k];
            double busy_ms = median(v, n) * 1e3;
            for (int s = 1; s < steps; s++) v[s - 1] = cpu[s * p + k];
            double stage_cpu_ms = median(v, n) * 1e3;
            for (int s = 1; s < steps; s++) v[s - 1] = 1 - cpu[s * p + k] / wall[s * p + k];
            idle_mean += idle / p;
            printf("stage=%d layers=[%d,%d) chunks=%d idle=%.3f busy_ms=%.1f cpu_ms=%.1f idle_cpu=%.3f "
                   "peak_in_flight=%d held_kib=%.0f\n",
                   k, (int)infos[4 * k], (int)infos[4 * k + 1], rep.virtual_stages, idle, busy_ms, stage_cpu_ms,
                   median(v, n), (int)infos[4 * k + 2], infos[4 * k + 3] / 1024);
        }
        int vs = rep.virtual_stages;
        printf("schedule=%s p=%d v=%d m=%d bubble_theory=%.3f idle_mean=%.3f step_ms=%.1f cpu_ms=%.1f batch=%lld "
               "seq=%lld hidden=%lld layers=%d\n",
               sched, p, vs, m, (double)(p - 1) / (vs * m + p - 1), idle_mean, step_ms, cpu_ms, (long long)B,
               (long long)T, (long long)C, layers);
        printf("losses=");
        for (int s = 0; s < steps; s++) printf("%s%.6f", s ? "," : "", losses[s]);
        printf("\n");
        free(v);
    }
    free(wall);
    free(busy);
    free(cpu);
    free(losses);
    free(ids);
    accel_optimizer_free(opt);
    accel_accelerator_free(acc);
    accel_module_free(model);
    return 0;
}
