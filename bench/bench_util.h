/* bench/bench_util.h — pieces shared by the Llama step benchmarks
 * (bench_llama_step, bench_gpu_step, bench_ddp_step; bench_conv uses the first two): medians, process CPU
 * time, the model/step flags they accept, the model and its ids, the FLOPs
 * count and the timed training step. Header-only: each bench is one program. */
#ifndef ACCEL_BENCH_UTIL_H
#define ACCEL_BENCH_UTIL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "accel/accelerator.h"
#include "accel/nn.h"

static inline int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static inline double bench_median(const double *v, int n) {
    double *c = malloc((size_t)n * sizeof *c);
    if (!c) return 0.0;
    memcpy(c, v, (size_t)n * sizeof *c);
    qsort(c, (size_t)n, sizeof *c, bench_cmp_double);
    double m = n % 2 ? c[n / 2] : 0.5 * (c[n / 2 - 1] + c[n / 2]);
    free(c);
    return m;
}

/* Process CPU seconds (all threads) and minor page faults so far. */
static inline double bench_cpu_seconds(long *minflt) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    *minflt = ru.ru_minflt;
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec * 1e-6;
}

/* The Llama step of the engine issue: hidden 512, 8 layers, 8 heads, ffn
 * 1536, vocab 8192, batch 8 x seq 256. */
typedef struct bench_llama_args {
    int steps, warmup, threads;
    int64_t B, T, C, L, H, F, V, bucket_mb;
    bool profile, no_sync, paired;
    const char *mixed_precision; /* --mixed_precision no|bf16|fp16 (given to the Accelerator) */
} bench_llama_args;

/* Parses --steps --warmup --batch --seq --hidden --layers --heads --ffn
 * --vocab, plus the program's own flags named in `extra` (a subset of
 * "threads", "bucket-mb", "profile", "no-sync", "paired", "mixed_precision"). Returns 0, or 2 after
 * printing what is wrong. */
static inline int bench_llama_parse(const char *prog, const char *extra, int argc, char **argv,
                             bench_llama_args *a) {
    *a = (bench_llama_args){.steps = 5, .warmup = 1, .threads = 2, .B = 8, .T = 256, .C = 512,
                            .L = 8, .H = 8, .F = 1536, .V = 8192, .mixed_precision = "no"};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        bool own = strncmp(f, "--", 2) == 0 && strstr(extra, f + 2) != NULL;
        if (own && !strcmp(f, "--profile")) { a->profile = true; continue; }
        if (own && !strcmp(f, "--no-sync")) { a->no_sync = true; continue; }
        if (own && !strcmp(f, "--paired")) { a->paired = true; continue; }
        if (i + 1 >= argc) {
            fprintf(stderr, "%s: %s needs a value (or is unknown)\n", prog, f);
            return 2;
        }
        if (own && !strcmp(f, "--mixed_precision")) {
            a->mixed_precision = argv[++i];
            continue;
        }
        long long x = atoll(argv[++i]);
        if (!strcmp(f, "--steps")) a->steps = (int)x;
        else if (!strcmp(f, "--warmup")) a->warmup = (int)x;
        else if (own && !strcmp(f, "--threads")) a->threads = (int)x;
        else if (own && !strcmp(f, "--bucket-mb")) a->bucket_mb = x;
        else if (!strcmp(f, "--batch")) a->B = x;
        else if (!strcmp(f, "--seq")) a->T = x;
        else if (!strcmp(f, "--hidden")) a->C = x;
        else if (!strcmp(f, "--layers")) a->L = x;
        else if (!strcmp(f, "--heads")) a->H = x;
        else if (!strcmp(f, "--ffn")) a->F = x;
        else if (!strcmp(f, "--vocab")) a->V = x;
        else {
            fprintf(stderr, "%s: unknown flag %s\n", prog, f);
            return 2;
        }
    }
    if (a->steps < 1 || a->warmup < 0 || a->threads < 1 || a->B < 1 || a->T < 2 || a->H < 1 ||
        a->C % a->H || a->V < 2 || a->bucket_mb < 0) {
        fprintf(stderr, "%s: bad sizes\n", prog);
        return 2;
    }
    return 0;
}

/* The f32 Llama config of the parsed sizes (kv heads = heads). */
static inline accel_llama_config bench_llama_config(const bench_llama_args *a) {
    accel_llama_config cfg = accel_llama_config_default();
    cfg.vocab_size = a->V;
    cfg.hidden_size = a->C;
    cfg.intermediate_size = a->F;
    cfg.num_hidden_layers = a->L;
    cfg.num_attention_heads = a->H;
    cfg.num_key_value_heads = a->H;
    cfg.max_position_embeddings = a->T;
    cfg.torch_dtype = ACCEL_F32;
    return cfg;
}

/* The bench's Llama (cfg of the parsed sizes; seed it first) on dev with its
 * AdamW (lr 1e-4), both prepared by acc. Returns NULL, or the name of the
 * call that failed. *n_params: the parameter count. The caller frees both. */
static inline const char *bench_llama_training(accel_accelerator *acc, const bench_llama_args *a, accel_device dev,
                                               accel_module **model, accel_optimizer **opt, int64_t *n_params) {
    accel_llama_config cfg = bench_llama_config(a);
    *opt = NULL;
    if (!(*model = accel_llama_new(&cfg, dev))) return "accel_llama_new";
    accel_tensor **params = NULL;
    int np = accel_module_parameters(*model, &params);
    if (np <= 0) return "accel_module_parameters";
    *n_params = 0;
    for (int i = 0; i < np; i++) *n_params += accel_numel(params[i]);
    accel_optim_hparams hp = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 1e-4);
    *opt = accel_optimizer_new_params(ACCEL_OPTIM_ADAMW, np, params, &hp);
    accel_free(params);
    if (!*opt) return "accel_optimizer_new_params";
    if (accel_accelerator_prepare_model(acc, *model) != ACCEL_OK) return "accel_accelerator_prepare_model";
    if (accel_accelerator_prepare_optimizer(acc, *opt) != ACCEL_OK) return "accel_accelerator_prepare_optimizer";
    return NULL;
}

/* Token ids [B, T] on dev, uniform over the vocabulary from an LCG seeded
 * by `seed` (independent of the library RNG, so every bench and run sees the
 * same ids). NULL on failure (the error set). */
static inline accel_tensor *bench_llama_ids(const bench_llama_args *a, uint64_t seed, accel_device dev) {
    int64_t n = a->B * a->T;
    int64_t *host = malloc((size_t)n * sizeof *host);
    accel_tensor *ids = host ? accel_tensor_new(ACCEL_I64, 2, (int64_t[]){a->B, a->T}, dev) : NULL;
    for (int64_t i = 0; ids && i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        host[i] = (int64_t)((seed >> 33) % (uint64_t)a->V);
    }
    if (ids && accel_tensor_from_host(ids, host) != ACCEL_OK) {
        accel_tensor_free(ids);
        ids = NULL;
    }
    free(host);
    return ids;
}

/* Model FLOPs of one step, as PaLM counts them: 6 * matmul params * tokens
 * (forward 2, backward 4; the embedding lookup is not a matmul, lm_head is)
 * plus attention 12 * L * B * T^2 * C (QK^T and PV, 2 * B * T^2 * C each,
 * forward and backward = 3x; the full T^2 although the causal mask makes
 * half of it unnecessary). *n_mm: the matmul parameters. */
static inline double bench_llama_flops(const bench_llama_args *a, int64_t *n_mm) {
    *n_mm = a->L * (4 * a->C * a->C + 3 * a->C * a->F) + a->C * a->V;
    double tokens = (double)(a->B * a->T);
    return 6.0 * (double)*n_mm * tokens + 12.0 * (double)a->L * (double)a->B * (double)a->T * (double)a->T * (double)a->C;
}

/* Where one step's time went (seconds) and what it saw. */
typedef struct bench_step_time {
    double fwd, bwd, opt, reset, total; /* opt: optimizer step, zero_grad and the device synchronisation */
    double cpu;                         /* process CPU seconds (all threads) */
    long faults;                        /* minor page faults */
    float loss;
} bench_step_time;

/* One training step through acc, as a training script runs it: the loss
 * (targets NULL: accel_llama_loss, ids shifted in each row; else the
 * forward's logits [B, T, V] against targets [B, T], mean cross-entropy, as
 * llm.c's train_gpt2 has it) under the Accelerator's autocast, backward, optimizer step, zero_grad, a
 * synchronisation of the Accelerator's device (so a GPU's work is inside
 * the time), the step reset. Returns NULL, or the name of the call that
 * failed. */
static inline const char *bench_llama_step(accel_accelerator *acc, accel_module *model, accel_optimizer *opt,
                                           accel_tensor *ids, accel_tensor *targets, bench_step_time *t) {
    long f0, f1;
    double c0 = bench_cpu_seconds(&f0), t0 = accel_now_seconds();
    accel_dtype prev = accel_accelerator_autocast_begin(acc);
    accel_tensor *loss = !targets ? accel_llama_loss(model, ids)
                                  : accel_cross_entropy(accel_llama_forward(model, ids, NULL), targets, -100);
    accel_accelerator_autocast_end(acc, prev);
    if (!loss) return targets ? "accel_cross_entropy" : "accel_llama_loss";
    double t1 = accel_now_seconds();
    if (accel_accelerator_backward(acc, loss) != ACCEL_OK) return "accel_accelerator_backward";
    double t2 = accel_now_seconds();
    t->loss = (float)accel_item(loss);
    if (accel_accelerator_optimizer_step(acc, opt) != ACCEL_OK) return "accel_accelerator_optimizer_step";
    if (accel_accelerator_zero_grad(acc, opt) != ACCEL_OK) return "accel_accelerator_zero_grad";
    if (accel_device_synchronize(accel_accelerator_device(acc)) != ACCEL_OK) return "accel_device_synchronize";
    double t3 = accel_now_seconds();
    accel_step_reset();
    double t4 = accel_now_seconds();
    t->cpu = bench_cpu_seconds(&f1) - c0;
    t->faults = f1 - f0;
    t->fwd = t1 - t0, t->bwd = t2 - t1, t->opt = t3 - t2, t->reset = t4 - t3, t->total = t4 - t0;
    return NULL;
}

#endif
