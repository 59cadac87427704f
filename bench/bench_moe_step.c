/* bench_moe_step: one training step of a mixture-of-experts decoder
 * (Mixtral, Qwen3-MoE or Qwen2-MoE, src/nn/moe.c) through an accel_accelerator, as a
 * training script runs it (bench_util.h's bench_llama_step: the loss under
 * the Accelerator's autocast, backward, AdamW step, zero_grad, the step
 * reset), timed over N steps after warm-up.
 *
 *     bench_moe_step [--family mixtral|qwen3_moe|qwen2_moe] [--experts E] [--topk K]
 *                    [--steps N] [--warmup W] [--batch B] [--seq T] [--hidden C]
 *                    [--layers L] [--heads H] [--ffn F] [--vocab V] [--threads P]
 *                    [--mixed_precision no|bf16]
 *
 * Defaults: Mixtral, 8 experts, 2 per token, each an MLP of ffn (Qwen3-MoE's
 * moe_intermediate_size, renormalised; Qwen2-MoE's, not renormalised, beside
 * a shared expert of ffn), the other sizes bench_llama_parse's
 * (bench/moe_step.sh passes its own); kv heads half the heads.
 * bench/moe_step_peer.py builds the same model in transformers and trains it
 * on the same ids (bench_llama_ids' LCG); bench/moe_step.sh runs both. Prints the CPU line
 * (accel_cpu_describe), one line per timed step and
 *     impl=accel family=... mixed_precision=... threads=P tokens_per_s=... step_ms_median=... loss=...
 * (the loss of the last step: the same ids every step, so the sides' losses
 * fall alike; the first step's loss is the model's at init). */
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"
#include "bench_util.h"

/* --family, --experts, --topk taken out of argv (the others go to bench_llama_parse). */
typedef struct moe_args {
    const char *family;
    int64_t experts, topk;
} moe_args;

static int take_moe_flags(int *argc, char **argv, moe_args *m) {
    *m = (moe_args){"mixtral", 8, 2};
    int out = 1;
    for (int i = 1; i < *argc; i++) {
        bool ours = !strcmp(argv[i], "--family") || !strcmp(argv[i], "--experts") || !strcmp(argv[i], "--topk");
        if (!ours) {
            argv[out++] = argv[i];
            continue;
        }
        if (i + 1 >= *argc) {
            fprintf(stderr, "bench_moe_step: %s needs a value\n", argv[i]);
            return 2;
        }
        const char *v = argv[++i];
        if (!strcmp(argv[i - 1], "--family")) m->family = v;
        else if (!strcmp(argv[i - 1], "--experts")) m->experts = atoll(v);
        else m->topk = atoll(v);
    }
    *argc = out;
    if (strcmp(m->family, "mixtral") && strcmp(m->family, "qwen3_moe") && strcmp(m->family, "qwen2_moe")) {
        fprintf(stderr, "bench_moe_step: --family must be mixtral, qwen3_moe or qwen2_moe\n");
        return 2;
    }
    return 0;
}

/* The family's config of the parsed sizes (kv heads half the heads). */
static accel_llama_config moe_config(const bench_llama_args *a, const moe_args *m) {
    accel_llama_config c = bench_llama_config(a);
    snprintf(c.model_type, sizeof c.model_type, "%s", m->family);
    c.num_key_value_heads = a->H / 2 ? a->H / 2 : 1;
    c.rms_norm_eps = 1e-6, c.rope_theta = 10000.0;
    c.num_local_experts = m->experts, c.num_experts_per_tok = m->topk;
    c.router_aux_loss_coef = 0.001;
    if (!strcmp(m->family, "qwen3_moe")) c.moe_intermediate_size = a->F, c.decoder_sparse_step = 1, c.norm_topk_prob = true;
    if (!strcmp(m->family, "qwen2_moe")) /* attention_bias: Qwen2MoeConfig's default qkv_bias, as the peer's */
        c.moe_intermediate_size = a->F, c.decoder_sparse_step = 1, c.shared_expert_intermediate_size = a->F,
        c.attention_bias = true;
    return c;
}

int main(int argc, char **argv) {
    moe_args m;
    bench_llama_args a;
    if (take_moe_flags(&argc, argv, &m)) return 2;
    if (bench_llama_parse("bench_moe_step", "threads mixed_precision", argc, argv, &a)) return 2;
    accel_set_num_threads(a.threads);
    char cpu[512];
    printf("%s", accel_cpu_describe(cpu, sizeof cpu));
    accel_accelerator_opts o = {.mixed_precision = a.mixed_precision};
    accel_accelerator *acc = accel_accelerator_new(&o);
    accel_llama_config c = moe_config(&a, &m);
    accel_manual_seed(0);
    accel_module *model = acc ? accel_llama_new(&c, ACCEL_CPU_DEVICE) : NULL;
    accel_optim_hparams hp = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 1e-4);
    accel_optimizer *opt = model ? accel_optimizer_new_module(ACCEL_OPTIM_ADAMW, model, &hp) : NULL;
    accel_tensor *ids = bench_llama_ids(&a, 1, ACCEL_CPU_DEVICE);
    if (!opt || !ids || accel_accelerator_prepare_model(acc, model) || accel_accelerator_prepare_optimizer(acc, opt)) {
        fprintf(stderr, "bench_moe_step: %s\n", accel_last_error());
        return 1;
    }
    accel_module_train(model, true);
    double *ms = malloc((size_t)a.steps * sizeof *ms);
    bench_step_time t = {0};
    for (int s = 0; ms && s < a.warmup + a.steps; s++) {
        const char *failed = bench_llama_step(acc, model, opt, ids, NULL, &t);
        if (failed) {
            fprintf(stderr, "bench_moe_step: %s: %s\n", failed, accel_last_error());
            return 1;
        }
        if (s < a.warmup) continue;
        ms[s - a.warmup] = t.total * 1e3;
        printf("step %d ms=%.1f loss=%.4f\n", s - a.warmup, t.total * 1e3, t.loss);
    }
    double med = ms ? bench_median(ms, a.steps) : 0;
    printf("impl=accel family=%s mixed_precision=%s threads=%d tokens_per_s=%.1f step_ms_median=%.1f loss=%.4f\n",
           m.family, a.mixed_precision, a.threads, (double)(a.B * a.T) / (med * 1e-3), med, t.loss);
    free(ms);
    accel_tensor_free(ids);
    accel_optimizer_free(opt);
    accel_module_free(model);
    accel_accelerator_free(acc);
    return 0;
}
