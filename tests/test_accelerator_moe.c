/* Mixtures of experts under the Accelerator's data parallel strategies (run
 * plainly: one process, no strategy; under `accel launch` DDP, ZeRO-1/2 or
 * ZeRO-3 / FSDP, accumulation, precision and clipping from the launcher's
 * environment). The tiny Mixtral, Qwen3-MoE and Qwen2-MoE of tiny_llama.h (and a
 * Mixtral whose loss adds the load-balancing loss, output_router_logits)
 * see many tokens on one rank and three on the next: an expert one rank's
 * tokens chose gets a gradient there and none on another, whose backward
 * never runs it. Each run is checked against DDP done by hand on the same
 * process group (a second model: plain backward, then every gradient
 * all-reduced AVG tensor by tensor, an expert this rank did not run
 * contributing zeros): the same losses every step and the same final
 * weights. The test asserts the case it is about happened (an expert ran on
 * one rank and not on another, a layer ran all its experts on one rank and
 * not on another). Then save_state mid-run and load_state into a
 * differently initialised model resume as the uninterrupted run, bit for
 * bit; under ZeRO-3, units inside an expert are refused by name. Prints one
 * line the launcher tests match: "moe world=N stage=S mp=M accum=A ckpt=C clip=G". */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "accel/accel.h"
#include "accel/accelerator.h"
#include "accel/dist.h"
#include "accelerator/accelerator_internal.h" /* ZeRO-3's wrap policy (A->fsdp) */
#include "check.h"
#include "ref_weights.h"
#include "tiny_llama.h"

static int N, R;
static accel_accelerator *A;

#define STEPS 4
#define MAX_LAYERS 8

/* A micro-batch: 3 x 14 tokens on one rank, 1 x 3 on the next (they
 * alternate each step). 42 tokens choose 84 times from Mixtral's 8 and
 * Qwen's 16 experts (usually all of them), 3 choose 6: a layer runs all its
 * experts on one rank and leaves some out on another, which would then
 * reduce that layer's gradients in another place of its backward. */
static bool big_batch(int64_t step, int rank) { return (step + rank) % 2 == 0; }

/* The models: tiny_family's (Qwen2-MoE: its shared expert runs on every
 * rank's tokens, its layer 0 dense), Mixtral with its balancing loss, and
 * Qwen2-MoE with a shared expert wider than its routed ones. */
typedef enum { MIXTRAL, QWEN3_MOE, MIXTRAL_AUX, QWEN2_MOE, QWEN2_MOE_WIDE } variant;
static const char *NAMES[] = {"mixtral", "qwen3_moe", "mixtral+aux", "qwen2_moe", "qwen2_moe+wide_shared"};

static accel_module *moe(uint64_t seed, variant v) {
    if (v < MIXTRAL_AUX || v == QWEN2_MOE) return tiny_family(seed, NAMES[v]);
    accel_manual_seed(seed);
    accel_llama_config c = tiny_llama_config();
    if (v == QWEN2_MOE_WIDE) { /* a shared expert's Linears (1024 parameters) larger than a routed expert (576) */
        c = tiny_family_config("qwen2_moe");
        c.shared_expert_intermediate_size = 64;
        return accel_llama_new(&c, ACCEL_CPU_DEVICE);
    }
    snprintf(c.model_type, sizeof c.model_type, "mixtral");
    c.num_local_experts = 8, c.num_experts_per_tok = 2;
    /* large enough that a wrong balancing term shows in the losses */
    c.output_router_logits = true, c.router_aux_loss_coef = 0.5;
    return accel_llama_new(&c, ACCEL_CPU_DEVICE);
}

/* AdamW (eps 1e-3): as tests/test_accelerator_zero3.c, the reductions sum in
 * other orders than the reference's per-tensor all-reduce; AdamW turns their
 * last-bit differences into ~1e-6 of the update in f32; under bf16 a weight
 * whose rounding goes the other way moves further. */
static double tolerance(void) { return accel_accelerator_mixed_precision(A) == ACCEL_MP_BF16 ? 1e-3 : 4e-5; }

static accel_optimizer *optimizer(accel_module *m) {
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 0.02);
    h.eps = 1e-3;
    return accel_optimizer_new_module(ACCEL_OPTIM_ADAMW, m, &h);
}

/* The loss of (step, micro-batch, rank): deterministic, other tokens on each rank. */
static accel_tensor *loss_of(accel_module *m, int64_t step, int micro, int rank) {
    int64_t k = step * 31 + micro * 7 + rank * 13, ids[3 * 14];
    bool big = big_batch(step, rank);
    int rows = big ? 3 : 1, cols = big ? 14 : 3;
    for (int i = 0; i < rows * cols; i++) ids[i] = (k * 5 + i * 11) % 40;
    return accel_llama_loss(m, accel_from_data(ACCEL_I64, ACCEL_SHAPE(rows, cols), ids));
}

static double scalar(accel_tensor *t) { return t ? accel_item(t) : NAN; }

/* One optimizer step through the accelerator; returns the last micro-batch's loss. */
static double acc_step(accel_module *m, accel_optimizer *o, int64_t step) {
    double l = NAN;
    for (int k = 0; k < accel_accelerator_gradient_accumulation_steps(A); k++) {
        CHECK(accel_accelerator_accumulate(A) == ACCEL_OK);
        accel_tensor *loss = loss_of(m, step, k, R);
        l = scalar(loss);
        CHECK_MSG(accel_accelerator_backward(A, loss) == ACCEL_OK, "%s", accel_last_error());
        CHECK_MSG(accel_accelerator_optimizer_step(A, o) == ACCEL_OK, "%s", accel_last_error());
        CHECK(accel_accelerator_zero_grad(A, o) == ACCEL_OK);
        accel_step_reset();
    }
    return l;
}

/* The decoder layer of each of m's expert parameters
 * ("model.layers.<l>. ... .experts.<e>. ..."), -1 for the others
 * (accel_module_parameters order). */
static int *expert_layers(accel_module *m, int *n_out) {
    accel_tensor **ps;
    int n = accel_module_parameters(m, &ps);
    int *is = malloc((size_t)n * sizeof *is);
    accel_state_dict *sd = accel_module_state_dict(m);
    CHECK(is && sd);
    for (int i = 0; is && i < n; i++) is[i] = -1;
    for (int j = 0; is && sd && j < sd->n; j++) {
        const char *name = sd->entries[j].name, *at = strstr(name, "layers.");
        int l;
        if (!strstr(name, ".experts.") || !at || sscanf(at, "layers.%d.", &l) != 1) continue;
        CHECK(l >= 0 && l < MAX_LAYERS);
        for (int i = 0; i < n; i++)
            if (ps[i] == sd->entries[j].t) is[i] = l;
    }
    accel_state_dict_free(sd);
    accel_free(ps);
    *n_out = n;
    return is;
}

/* What ref_step saw of the experts over the steps: expert tensors that got
 * a gradient on some ranks and none on others (split), none on some rank
 * (idle); layers that ran every expert on one rank and left one out on
 * another (layers_split). */
typedef struct moe_seen {
    int split, idle, layers_split;
} moe_seen;

/* DDP by hand: plain backward of each micro-batch, then every gradient
 * all-reduced AVG tensor by tensor; an expert no token of this rank chose
 * has no gradient here and contributes zeros. */
static accel_tensor *ref_loss(accel_module *m, int64_t step, int micro, void *ctx) {
    (void)ctx;
    return loss_of(m, step, micro, R);
}

static double ref_step(accel_module *m, accel_optimizer *o, const int *layer, int64_t step, moe_seen *seen) {
    bool bf16 = accel_accelerator_mixed_precision(A) == ACCEL_MP_BF16;
    double l = ref_backward(m, accel_accelerator_gradient_accumulation_steps(A), bf16,
                            bf16 && accel_accelerator_zero_stage(A) == 3, step, ref_loss, NULL);
    accel_tensor **ps;
    int n = accel_module_parameters(m, &ps);
    /* per tensor: 1 where this rank ran it; per layer: all its experts ran, some did not; summed over the ranks */
    float *ran = calloc((size_t)n + 2 * MAX_LAYERS, sizeof *ran), *all = ran + n, *some_idle = all + MAX_LAYERS;
    bool ok = ran != NULL; /* after a failed collective the group is unusable: one report, not one per tensor */
    for (int l = 0; ok && l < MAX_LAYERS; l++) all[l] = 1;
    for (int i = 0; ok && i < n; i++) {
        ran[i] = ps[i]->grad != NULL;
        if (layer[i] >= 0 && !ps[i]->grad) all[layer[i]] = 0, some_idle[layer[i]] = 1;
    }
    if (ok && N > 1)
        ok = accel_pg_all_reduce(accel_dist_default_group(), ran, (size_t)n + 2 * MAX_LAYERS, ACCEL_F32,
                                 ACCEL_REDUCE_SUM) == ACCEL_OK;
    for (int i = 0; ok && i < n; i++) {
        CHECK(layer[i] >= 0 || ran[i] == N); /* everything but the experts runs on every rank */
        seen->split += layer[i] >= 0 && ran[i] > 0 && ran[i] < N;
        seen->idle += layer[i] >= 0 && ran[i] < N;
    }
    for (int l = 0; ok && l < MAX_LAYERS; l++) seen->layers_split += all[l] > 0 && some_idle[l] > 0;
    free(ran);
    ok = ok && ref_average_grads(n, ps, N);
    CHECK_MSG(ok, "DDP by hand, step %lld: %s", (long long)step, accel_last_error());
    if (accel_accelerator_gradient_clipping(A) > 0) accel_clip_grad_norm(n, ps, accel_accelerator_gradient_clipping(A), 2.0);
    CHECK(accel_optimizer_step(o) == ACCEL_OK);
    /* zero_grad(set_to_none=True): the next step's idle experts have none */
    for (int i = 0; i < n; i++) CHECK(accel_tensor_drop_grad(ps[i]) == ACCEL_OK);
    accel_free(ps);
    return l;
}

/* Trains variant v STEPS steps through the accelerator and by hand: the
 * same losses and final weights, and the case happened. */
static void check_equivalence(variant v) {
    const char *what = NAMES[v];
    /* other weights on each rank: prepare makes them rank 0's */
    accel_module *z = moe(100 + (uint64_t)R, v), *ref = moe(100, v);
    accel_optimizer *zo = optimizer(z), *ro = optimizer(ref);
    int n;
    int *layer = expert_layers(ref, &n), experts = 0;
    moe_seen seen = {0};
    for (int i = 0; i < n; i++) experts += layer[i] >= 0;
    CHECK_MSG(experts > 0, "%s: no expert parameters", what);
    CHECK_MSG(accel_accelerator_prepare(A, z, zo, NULL, NULL) == ACCEL_OK, "%s", accel_last_error());
    for (int64_t s = 0; s < STEPS; s++) {
        double a = acc_step(z, zo, s), b = ref_step(ref, ro, layer, s, &seen);
        CHECK_MSG(fabs(a - b) <= 1e-5 * fabs(b) + 1e-6, "%s step %lld: loss %.9g, DDP by hand %.9g", what,
                  (long long)s, a, b);
    }
    /* the case: on several processes an expert ran on one rank and not on
     * another, and a layer ran all its experts on one rank, not on another;
     * on one, an expert did not run */
    CHECK_MSG(N > 1 ? seen.split > 0 && seen.layers_split > 0 : seen.idle > 0,
              "%s: no expert was left out by some rank only (%d tensors split, %d idle, %d layers split)", what,
              seen.split, seen.idle, seen.layers_split);
    CHECK_MSG(accel_accelerator_clear(A) == ACCEL_OK, "%s", accel_last_error());
    double d = rel_diff(z, ref);
    CHECK_MSG(d <= tolerance(), "%s: weights differ from DDP by hand by %.3g (relative)", what, d);
    if (R == 0)
        printf("moe %s: %d expert tensors; over %d steps %d split over the ranks, %d idle, %d layers split; "
               "max rel diff %.3g\n", what, experts, STEPS, seen.split, seen.idle, seen.layers_split, d);
    free(layer);
    accel_optimizer_free(zo);
    accel_optimizer_free(ro);
    accel_module_free(z);
    accel_module_free(ref);
}

static void test_mixtral(void) { check_equivalence(MIXTRAL); }
static void test_qwen3_moe(void) { check_equivalence(QWEN3_MOE); }
static void test_qwen2_moe(void) { check_equivalence(QWEN2_MOE); }
/* The balancing loss, also under fsdp_activation_checkpointing (the
 * recompute hands the routers their share of its gradient). */
static void test_mixtral_aux_loss(void) { check_equivalence(MIXTRAL_AUX); }

/* ZeRO-3 / FSDP units inside an expert (SIZE_BASED_WRAP of a small
 * min_num_params, TRANSFORMER_BASED_WRAP of the expert class) are refused
 * at prepare, naming the unit: such a unit would be gathered and reduced
 * only on the ranks whose tokens chose its expert, pairing its collectives
 * with other units' elsewhere (wrong weights, then mismatched collectives).
 * The sparse block as a unit trains as DDP by hand. */
static void refused(variant v, accel__wrap_policy wrap, const char *cls, int64_t min, const char *unit) {
    A->fsdp.wrap = wrap;
    snprintf(A->fsdp.wrap_cls, sizeof A->fsdp.wrap_cls, "%s", cls);
    A->fsdp.min_num_params = min;
    accel_module *m = moe(1, v);
    CHECK(accel_accelerator_prepare_model(A, m) == ACCEL_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(accel_last_error(), unit);
    CHECK_STR_CONTAINS(accel_last_error(), "is inside an expert of a mixture of experts");
    accel_clear_error();
    CHECK_MSG(accel_accelerator_clear(A) == ACCEL_OK, "%s", accel_last_error());
    accel_module_free(m);
}

static void test_zero3_expert_units(void) {
    if (accel_accelerator_zero_stage(A) != 3) return;
    accel__fsdp_cfg saved = A->fsdp;
    /* each Mixtral expert holds 1152 parameters */
    refused(MIXTRAL, ACCEL__WRAP_SIZE, "", 1000, "\"model.layers.0.block_sparse_moe.experts.0\" (MixtralBlockSparseTop2MLP");
    refused(QWEN3_MOE, ACCEL__WRAP_TRANSFORMER, "Qwen3MoeMLP", 0, "\"model.layers.0.mlp.experts.0\" (Qwen3MoeMLP");
    /* Qwen2MoeMLP is also layer 0's dense MLP and the shared expert: units that run on every rank */
    refused(QWEN2_MOE, ACCEL__WRAP_TRANSFORMER, "Qwen2MoeMLP", 0, "\"model.layers.1.mlp.experts.0\" (Qwen2MoeMLP");
    refused(MIXTRAL, ACCEL__WRAP_TRANSFORMER, "MixtralDecoderLayer, MixtralBlockSparseTop2MLP", 0,
            "\"model.layers.0.block_sparse_moe.experts.0\"");
    /* the sparse blocks as units (inside the layers' units; by size: 8 x 1152 + 128, 16 x 576 + 256) */
    A->fsdp.wrap = ACCEL__WRAP_TRANSFORMER;
    snprintf(A->fsdp.wrap_cls, sizeof A->fsdp.wrap_cls, "MixtralDecoderLayer, MixtralSparseMoeBlock");
    check_equivalence(MIXTRAL);
    A->fsdp.wrap = ACCEL__WRAP_SIZE;
    A->fsdp.min_num_params = 5000;
    check_equivalence(QWEN3_MOE);
    /* units inside Qwen2-MoE's shared expert (its Linears by size; no routed
     * expert is that large): every rank runs them, so they train as DDP */
    A->fsdp.min_num_params = 600;
    check_equivalence(QWEN2_MOE_WIDE);
    A->fsdp = saved;
}

/* ---------------------------------------------------------------- resume */

static char ROOT[256]; /* this run's checkpoint directory root, the same on every rank */

/* The model's weights (full: after clear) into a new array. */
static float *weights_of(accel_module *m, int64_t *total) {
    accel_tensor **ps;
    int n = accel_module_parameters(m, &ps);
    *total = 0;
    for (int i = 0; i < n; i++) *total += accel_numel(ps[i]);
    float *w = malloc((size_t)*total * sizeof *w);
    CHECK(w != NULL);
    for (int i = 0, at = 0; w && i < n; at += (int)accel_numel(ps[i]), i++)
        memcpy(w + at, ps[i]->data, (size_t)accel_numel(ps[i]) * sizeof *w);
    accel_free(ps);
    return w;
}

/* STEPS steps uninterrupted; then STEPS / 2, save_state, and a model of
 * other weights loads the checkpoint and trains the rest: the same losses
 * and the same final weights, bit for bit (the same world size). */
static void resume(variant v) {
    const char *what = NAMES[v];
    char ckpt[300];
    snprintf(ckpt, sizeof ckpt, "%s/%s", ROOT, what);
    double want[STEPS];
    accel_module *m = moe(100, v);
    accel_optimizer *o = optimizer(m);
    CHECK_MSG(accel_accelerator_prepare(A, m, o, NULL, NULL) == ACCEL_OK, "%s", accel_last_error());
    for (int s = 0; s < STEPS; s++) want[s] = acc_step(m, o, s);
    CHECK_MSG(accel_accelerator_clear(A) == ACCEL_OK, "%s", accel_last_error());
    int64_t n_want, n_got;
    float *w_want = weights_of(m, &n_want);
    accel_optimizer_free(o);
    accel_module_free(m);

    m = moe(100, v), o = optimizer(m);
    CHECK_MSG(accel_accelerator_prepare(A, m, o, NULL, NULL) == ACCEL_OK, "%s", accel_last_error());
    for (int s = 0; s < STEPS / 2; s++) {
        double l = acc_step(m, o, s);
        CHECK_MSG(l == want[s], "%s step %d: loss %.9g, first run %.9g", what, s, l, want[s]);
    }
    CHECK_MSG(accel_accelerator_save_state(A, ckpt, NULL, 0) == ACCEL_OK, "%s", accel_last_error());
    CHECK_MSG(accel_accelerator_clear(A) == ACCEL_OK, "%s", accel_last_error());
    accel_optimizer_free(o);
    accel_module_free(m);

    m = moe(777, v), o = optimizer(m); /* other weights: all of them must come from the checkpoint */
    CHECK_MSG(accel_accelerator_prepare(A, m, o, NULL, NULL) == ACCEL_OK, "%s", accel_last_error());
    accel_resume_point at;
    CHECK_MSG(accel_accelerator_load_state(A, ckpt, &at) == ACCEL_OK, "%s", accel_last_error());
    CHECK_MSG(at.optimizer_steps == STEPS / 2, "%s: resumed at optimizer step %lld", what,
              (long long)at.optimizer_steps);
    for (int s = STEPS / 2; s < STEPS; s++) {
        double l = acc_step(m, o, s);
        CHECK_MSG(l == want[s], "%s step %d: loss %.9g after the resume, %.9g uninterrupted", what, s, l, want[s]);
    }
    CHECK_MSG(accel_accelerator_clear(A) == ACCEL_OK, "%s", accel_last_error());
    float *w_got = weights_of(m, &n_got);
    CHECK(n_got == n_want);
    CHECK_MSG(w_got && w_want && n_got == n_want && !memcmp(w_got, w_want, (size_t)n_want * sizeof *w_got),
              "%s: final weights after the resume differ from the uninterrupted run's", what);
    free(w_want);
    free(w_got);
    accel_optimizer_free(o);
    accel_module_free(m);
}

static void test_resume_mixtral(void) { resume(MIXTRAL); }
static void test_resume_qwen3_moe(void) { resume(QWEN3_MOE); }
static void test_resume_qwen2_moe(void) { resume(QWEN2_MOE); }

int main(void) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    /* DDP's buckets of a few tensors each: buckets holding experts some
     * rank did not run launch at the end of backward, after others */
    o.bucket_cap_bytes = 4096;
    A = accel_accelerator_new(&o);
    if (!A) {
        fprintf(stderr, "error: %s\n", accel_last_error());
        return 1;
    }
    N = accel_accelerator_num_processes(A);
    R = accel_accelerator_process_index(A);
    RUN(test_mixtral);
    RUN(test_qwen3_moe);
    RUN(test_qwen2_moe);
    RUN(test_mixtral_aux_loss);
    RUN(test_zero3_expert_units);
    int64_t id = (int64_t)getpid();
    if (N > 1) CHECK(accel_pg_broadcast(accel_dist_default_group(), &id, 1, ACCEL_I64, 0) == ACCEL_OK);
    snprintf(ROOT, sizeof ROOT, "/tmp/accel_moe_%d_%lld", N, (long long)id);
    RUN(test_resume_mixtral);
    RUN(test_resume_qwen3_moe);
    RUN(test_resume_qwen2_moe);
    if (N > 1) CHECK(accel_pg_barrier(accel_dist_default_group()) == ACCEL_OK);
    if (R == 0 && check_failures_ == 0) { /* kept for a look when something failed */
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", ROOT);
        CHECK(system(cmd) == 0);
    }
    if (R == 0)
        printf("moe world=%d stage=%d mp=%s accum=%d ckpt=%d clip=%g\n", N, accel_accelerator_zero_stage(A),
               accel_mixed_precision_name(accel_accelerator_mixed_precision(A)),
               accel_accelerator_gradient_accumulation_steps(A), A->fsdp.activation_checkpointing,
               accel_accelerator_gradient_clipping(A));
    fflush(stdout);
    accel_accelerator_free(A);
    return check_summary();
}
