/* ZeRO-3 / FSDP FULL_SHARD in the Accelerator (run plainly: stage 3 on one
 * process; under `accel launch` the stage, accumulation, precision, clipping
 * and prefetch settings come from the launcher's environment). Each run is
 * checked against DDP done by hand on the same process group (a second model
 * whose gradients are all-reduced tensor by tensor): the same losses every
 * step and the same final weights, for an MLP (three Linear units) and a
 * two-layer Llama with tied embeddings (embedding and head share a unit). The
 * full parameters take no memory between steps (pages counted with mincore),
 * and the optimizer state is ~1/N. Prints one line the launcher tests match:
 * "zero3 world=N mp=M accum=A clip=C wrap=W fwd_prefetch=F bwd_prefetch=B reshard=S persist=T". */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "accel/accel.h"
#include "accel/accelerator.h"
#include "accel/bert.h"
#include "accel/dist.h"
#include "accelerator/accelerator_internal.h" /* the wrap units a policy made */
#include "accelerator/zero_state.h" /* the ZeRO state of a prepared model */
#include "check.h"
#include "ref_weights.h"
#include "tiny_llama.h"

static int N, R;
static int S; /* the ranks a unit is sharded over: N, or this machine's under HYBRID_SHARD */
static accel_accelerator *A;

/* The ZeRO state (units, shard) of the first model A prepared. */
static accel__zero_model *zero0(void) { return accel__zero_of(&A->models[0]); }

/* 5 -> 7 -> 7 -> 3: three units of 42, 56 and 24 parameters. */
static accel_module *mlp(uint64_t seed) {
    accel_manual_seed(seed);
    accel_module *l[5] = {accel_linear_new(5, 7, true, ACCEL_CPU_DEVICE, ACCEL_F32), accel_relu_module_new(),
                          accel_linear_new(7, 7, true, ACCEL_CPU_DEVICE, ACCEL_F32), accel_relu_module_new(),
                          accel_linear_new(7, 3, true, ACCEL_CPU_DEVICE, ACCEL_F32)};
    return accel_sequential_new(5, l);
}

/* The reductions sum in different orders (reduce-scatter per unit and micro-
 * batch vs an all-reduce per tensor): SGD with momentum keeps the weights
 * within 2e-7 (relative) of DDP's after four steps, in f32 and bf16, every
 * wrap policy. AdamW (eps 1e-3, and more so the default 1e-8) turns
 * last-bit differences of small gradients into differences of the
 * normalised update: ~4e-6 in f32 (the largest, Gemma2 with its soft-capping
 * on 3 ranks: 9.1e-6 with libm's tanhf, 2.45e-5 with the CPU kernels'
 * vectorised tanh, within 2 ulp of it: other last bits, other gradients that
 * the two orders round apart); under bf16 a weight whose bf16
 * cast then rounds the other way moves it further (1.9e-4 measured on 4 ranks). */
static accel_optim_kind KIND = ACCEL_OPTIM_ADAMW;

/* bf16 with clipping: one bf16 unit in the last place (2^-8). The two
 * totals the clip divides by are computed as torch computes each: the
 * reference's clip_grad_norm_ takes the f32 norm of each gradient's f32 norm,
 * ZeRO-3 sums the f32 squares of its shards, as FSDP does; they differ in
 * their last bits, and that flips the bf16 rounding of a weight in some
 * families (Granite: 1.3e-3, the others 4e-7). */
static double tolerance(void) {
    if (KIND == ACCEL_OPTIM_SGD) return 1e-6;
    if (accel_accelerator_mixed_precision(A) != ACCEL_MP_BF16) return 4e-5;
    return accel_accelerator_gradient_clipping(A) > 0 ? 0x1p-8 : 1e-3;
}

static accel_optimizer *optimizer(accel_module *m) {
    accel_optim_hparams h = accel_optim_defaults(KIND, 0.02);
    h.eps = 1e-3;
    h.momentum = 0.9;
    return accel_optimizer_new_module(KIND, m, &h);
}

/* The loss of (step, micro-batch, rank) on model m: deterministic everywhere. */
static accel_tensor *loss_of(accel_module *m, bool is_llama, int64_t step, int micro, int rank) {
    int64_t k = step * 31 + micro * 7 + rank * 13;
    if (is_llama) {
        int64_t ids[2 * 6];
        for (int i = 0; i < 12; i++) ids[i] = (k * 5 + i * 11) % 40;
        return accel_llama_loss(m, accel_from_data(ACCEL_I64, ACCEL_SHAPE(2, 6), ids));
    }
    float xs[4 * 5], ys[4 * 3];
    for (int i = 0; i < 4; i++) {
        for (int j = 0; j < 5; j++) xs[i * 5 + j] = (float)sin((double)(k + i * 5 + j));
        for (int j = 0; j < 3; j++) ys[i * 3 + j] = 0.5f * xs[i * 5 + j] - 0.25f * xs[i * 5 + 4 - j] + 0.1f * (float)j;
    }
    return accel_mse_loss(accel_module_call(m, accel_from_floats(ACCEL_SHAPE(4, 5), xs)),
                          accel_from_floats(ACCEL_SHAPE(4, 3), ys));
}

static double scalar(accel_tensor *t) { return t ? accel_item(t) : NAN; }

/* One optimizer step through the accelerator; returns the last micro-batch's loss. */
static double acc_step(accel_module *m, accel_optimizer *o, bool is_llama, int64_t step) {
    double l = NAN;
    for (int k = 0; k < accel_accelerator_gradient_accumulation_steps(A); k++) {
        accel_accelerator_accumulate(A);
        accel_tensor *loss = loss_of(m, is_llama, step, k, R);
        l = scalar(loss);
        CHECK_MSG(accel_accelerator_backward(A, loss) == ACCEL_OK, "%s", accel_last_error());
        CHECK(accel_accelerator_optimizer_step(A, o) == ACCEL_OK);
        accel_accelerator_zero_grad(A, o);
        accel_step_reset();
    }
    return l;
}

/* The same step as DDP by hand (autocast as the accelerator does it; under
 * bf16 on weights rounded as stage 3 gathers them). */
static accel_tensor *ref_loss(accel_module *m, int64_t step, int micro, void *is_llama) {
    return loss_of(m, *(bool *)is_llama, step, micro, R);
}

static double ref_step(accel_module *m, accel_optimizer *o, bool is_llama, int64_t step) {
    bool bf16 = accel_accelerator_mixed_precision(A) == ACCEL_MP_BF16;
    double l = ref_backward(m, accel_accelerator_gradient_accumulation_steps(A), bf16, bf16, step, ref_loss, &is_llama);
    accel_tensor **ps;
    int n = accel_module_parameters(m, &ps);
    CHECK_MSG(ref_average_grads(n, ps, N), "DDP by hand, step %lld: %s", (long long)step, accel_last_error());
    if (accel_accelerator_gradient_clipping(A) > 0) accel_clip_grad_norm(n, ps, accel_accelerator_gradient_clipping(A), 2.0);
    CHECK(accel_optimizer_step(o) == ACCEL_OK);
    accel_optimizer_zero_grad(o);
    accel_free(ps);
    return l;
}

/* Resident bytes of [p, p + n floats), whole pages (mincore). */
static int64_t resident(const void *p, int64_t n) {
    long page = sysconf(_SC_PAGESIZE);
    uintptr_t lo = (uintptr_t)p & ~(uintptr_t)(page - 1), hi = (uintptr_t)p + (uintptr_t)n * sizeof(float);
    size_t pages = (hi - lo + (uintptr_t)page - 1) / (uintptr_t)page;
    unsigned char *v = calloc(pages ? pages : 1, 1);
    CHECK(v && mincore((void *)lo, hi - lo, v) == 0);
    int64_t bytes = 0;
    for (size_t i = 0; v && i < pages; i++) bytes += (v[i] & 1) ? page : 0;
    free(v);
    return bytes;
}

/* Resident bytes of the prepared model's full parameter / gradient buffers
 * (the memory its parameter tensors and their .grad views point into). */
static int64_t resident_param_bytes(accel_module *m) {
    accel__model *pm = accel__find_model(A, m);
    return resident(pm->fp->buffers[ACCEL_F32].params, pm->fp->buffers[ACCEL_F32].numel);
}

static int64_t resident_grad_bytes(accel_module *m) {
    accel__model *pm = accel__find_model(A, m);
    return resident(pm->fp->buffers[ACCEL_F32].grads, pm->fp->buffers[ACCEL_F32].numel);
}

/* A probe between units: its backward runs between theirs and records the
 * most parameter and gradient memory resident at those points. It first
 * waits for the gathers in flight (the prefetch of the next unit), so what it
 * counts is what the schedule holds, not how far the asynchronous all-gather
 * has come in writing its pages. */
static accel_module *PROBED;
static int64_t PEAK_PARAMS, PEAK_GRADS;
static int GATHERED[16], N_PROBES; /* at each probe, in backward order: units not released */

static void wait_for_gathers(accel_module *m) {
    accel__zero_model *zm = accel__zero_of(accel__find_model(A, m));
    for (int k = 0; k < zm->n_units; k++)
        if (zm->units[k].gather) CHECK(accel_work_wait(zm->units[k].gather) == ACCEL_OK);
}

static accel_status probe_backward(accel_node *n, accel_tensor *g) {
    wait_for_gathers(PROBED);
    int64_t p = resident_param_bytes(PROBED), q = resident_grad_bytes(PROBED);
    PEAK_PARAMS = p > PEAK_PARAMS ? p : PEAK_PARAMS;
    PEAK_GRADS = q > PEAK_GRADS ? q : PEAK_GRADS;
    accel__zero_model *zm = accel__zero_of(accel__find_model(A, PROBED));
    int gathered = 0;
    for (int k = 0; k < zm->n_units; k++) gathered += zm->units[k].state != ACCEL__UNIT_RELEASED;
    if (N_PROBES < 16) GATHERED[N_PROBES++] = gathered;
    return accel_grad_accumulate(n->inputs[0], g);
}

static accel_tensor *probe_forward(accel_module *m, accel_tensor *x) {
    accel_tensor *y = accel_alias(x);
    accel_tape_record("probe", probe_backward, y, 1, &x);
    return y;
}

static const accel_module_ops PROBE_OPS = {"Probe", probe_forward, NULL};

static int64_t state_floats(accel_optimizer *o) {
    accel_named_state *st;
    int n = accel_optimizer_state(o, &st);
    int64_t f = 0;
    for (int i = 0; i < n; i++)
        if (st[i].t) f += accel_numel(st[i].t);
    accel_named_state_free(st, n);
    return f;
}

/* Bytes of the persistent unit (stage3_param_persistence_threshold): always resident. */
static int64_t persistent_bytes(void) {
    long page = sysconf(_SC_PAGESIZE);
    int64_t b = 0;
    for (int k = 0; k < zero0()->n_units; k++) {
        const accel__unit *u = &zero0()->units[k];
        if (u->persistent) b += (u->shard * S * 4 + page - 1) / page * page;
    }
    return b;
}

/* Under bf16: step 0's last micro-batch loss of plain DDP (autocast, unrounded weights); else NAN. */
static double bf16_plain_loss(accel_module *ref, bool is_llama) {
    if (accel_accelerator_mixed_precision(A) != ACCEL_MP_BF16) return NAN;
    bool grad = accel_set_grad_enabled(false);
    accel_dtype prev = accel_autocast_begin(ACCEL_BF16);
    double l = scalar(loss_of(ref, is_llama, 0, accel_accelerator_gradient_accumulation_steps(A) - 1, R));
    accel_autocast_end(prev);
    accel_set_grad_enabled(grad);
    accel_step_reset();
    return l;
}

/* The family of the decoder check_equivalence trains (is_llama). */
static const char *FAMILY = "llama";
/* When set, check_equivalence's causal LM is this GPT-2 (test_gpt2) instead of tiny_llama. */
static bool g_gpt2;

/* GPT-2 of the architecture table at tiny_llama's sizes: learned positions,
 * LayerNorms, Conv1D projections, wte tied to lm_head. */
static accel_module *tiny_gpt2(uint64_t seed) {
    accel_manual_seed(seed);
    accel_llama_config c = accel_llama_config_default();
    c.vocab_size = 40, c.hidden_size = 16, c.intermediate_size = 64, c.num_hidden_layers = 2;
    c.num_attention_heads = 4, c.num_key_value_heads = 4, c.max_position_embeddings = 16;
    c.rms_norm_eps = 1e-5, c.tie_word_embeddings = true;
    snprintf(c.model_type, sizeof c.model_type, "gpt2");
    return accel_llama_new(&c, ACCEL_CPU_DEVICE);
}

/* When set, FAMILY's model has qk_layernorm (StableLM's: a LayerNorm of its own per head of q and k). */
static bool g_qk_layernorm;

static accel_module *tiny_lm(uint64_t seed) {
    if (g_gpt2) return tiny_gpt2(seed);
    accel_module *m = tiny_family_qk(seed, FAMILY, g_qk_layernorm); /* (Phi's own qk_layernorm kept) */
    CHECK(!g_qk_layernorm || has_per_head_qk_norms(m)); /* the per-head norms are there to train */
    return m;
}

static void check_equivalence(bool is_llama, int want_units) {
    const char *what = is_llama ? (g_gpt2 ? "gpt2" : FAMILY) : "mlp";
    accel_module *z = is_llama ? tiny_lm(100 + (uint64_t)R) : mlp(100 + (uint64_t)R),
                 *ref = is_llama ? tiny_lm(100) : mlp(100);
    accel_optimizer *zo = optimizer(z), *ro = optimizer(ref);
    int64_t total = accel_module_num_params(ref);
    CHECK(accel_accelerator_prepare(A, z, zo, NULL, NULL) == ACCEL_OK);
    CHECK_MSG(zero0()->n_units == want_units, "%s, wrap policy %d: %d units, want %d", what, (int)A->fsdp.wrap,
              zero0()->n_units, want_units);
    /* bf16 runs gather bf16: each rank's piece rounded into the send buffer */
    CHECK((zero0()->zsend16 != NULL) == (accel_accelerator_mixed_precision(A) == ACCEL_MP_BF16));
    int64_t kept = persistent_bytes();
    CHECK_MSG(resident_param_bytes(z) == kept, "%s: full parameters resident after prepare", what);
    double plain = bf16_plain_loss(ref, is_llama);
    for (int64_t s = 0; s < 4; s++) {
        double a = acc_step(z, zo, is_llama, s), b = ref_step(ref, ro, is_llama, s);
        CHECK_MSG(fabs(a - b) <= 1e-5 * fabs(b) + 1e-6, "%s step %lld: loss %.9g, DDP %.9g", what, (long long)s, a, b);
        /* and plain DDP under bf16 autocast (only the GEMM operands rounded): within bf16's precision */
        CHECK_MSG(s || isnan(plain) || fabs(a - plain) <= 0x1p-8 * fabs(plain), "%s: loss %.9g, DDP bf16 %.9g", what,
                  a, plain);
    }
    CHECK_MSG(resident_param_bytes(z) == kept, "%s: full parameters resident between steps", what);
    int64_t mine = state_floats(zo), full = state_floats(ro);
    CHECK_MSG(S == 1 || mine * S <= full + 2 * 16 * S * 8, "%s: optimizer state %lld of %lld floats sharded over %d "
              "ranks", what, (long long)mine, (long long)full, S);
    CHECK(total > 0);
    /* clear(): full weights back in the model, the optimizer's per-tensor state back too */
    CHECK_MSG(accel_accelerator_clear(A) == ACCEL_OK, "%s", accel_last_error());
    double d = rel_diff(z, ref);
    CHECK_MSG(d <= tolerance(), "%s, wrap policy %d, optimizer %d: weights differ from DDP by %.3g (relative)", what,
              (int)A->fsdp.wrap, (int)KIND, d);
    CHECK(state_floats(zo) == full);
    accel_optimizer_free(zo);
    accel_optimizer_free(ro);
    accel_module_free(z);
    accel_module_free(ref);
}

/* Three Linear units (by default; one root unit when no module type matches a transformer layer class). */
static void test_mlp(void) {
    if (A->fsdp.wrap == ACCEL__WRAP_DEFAULT) check_equivalence(false, 3);
}

/* Units of the Llama under the policy in effect: by default embed_tokens +
 * the tied lm_head, two decoder layers, norm; TRANSFORMER_BASED_WRAP: the
 * layers and the root's unit. */
static int llama_units(void) { return A->fsdp.wrap == ACCEL__WRAP_TRANSFORMER ? 3 : 4; }

static void test_llama(void) {
    check_equivalence(true, llama_units());
    KIND = ACCEL_OPTIM_SGD;
    check_equivalence(true, llama_units());
    KIND = ACCEL_OPTIM_ADAMW;
}

/* Gemma (1 + weight norms, gelu), Gemma2 (sandwich norms, soft-capping, a
 * window that bites on 6 positions), Gemma 3 (its q/k norms, layer types and
 * two RoPEs), Granite (multipliers), the mixtures of experts (Qwen2-MoE
 * with its shared expert), Phi (parallel attention and MLP, biases, a
 * head bias beside the tied embedding), GPT-NeoX (its own tree, the
 * per-head query_key_value), StableLM (sequential, q/k/v biases, partial
 * rotary; and with qk_layernorm's per-head norms) and Starcoder2 (biases, c_fc / c_proj, a window) train as the
 * Llama does: their decoder layers (the table's class) are the units, and
 * the steps equal DDP's. */
static void test_other_families_train(void) {
    accel__fsdp_cfg saved = A->fsdp;
    A->fsdp.wrap_cls[0] = 0; /* a configured LlamaDecoderLayer: here the table's class of each family */
    const char *families[] = {"gemma", "gemma2", "gemma3_text", "granite", "mixtral", "qwen3_moe", "qwen2_moe", "phi",
                              "gpt_neox", "stablelm", "starcoder2"};
    for (size_t i = 0; i < sizeof families / sizeof *families; i++) {
        FAMILY = families[i];
        check_equivalence(true, llama_units());
    }
    FAMILY = "stablelm";
    g_qk_layernorm = true;
    check_equivalence(true, llama_units());
    g_qk_layernorm = false;
    FAMILY = "llama";
    A->fsdp = saved;
}

static bool same_weights(accel_module *a, accel_module *b) {
    accel_tensor **pa, **pb;
    int n = accel_module_parameters(a, &pa), m = accel_module_parameters(b, &pb);
    bool same = n > 0 && n == m;
    for (int i = 0; same && i < n; i++) same = !memcmp(pa[i]->data, pb[i]->data, (size_t)accel_numel(pa[i]) * 4);
    accel_free(pa);
    accel_free(pb);
    return same;
}

/* fsdp_activation_checkpointing: the decoder layers (every unit but the
 * root's) recompute their forward in backward, after their unit's gather;
 * training is bit-identical to FULL_SHARD without it (test_llama: and equal to DDP). */
static void test_activation_checkpointing(void) {
    if (!A->fsdp.activation_checkpointing) return;
    accel_module *m[2];
    double loss[2][3];
    for (int run = 0; run < 2; run++) {
        A->fsdp.activation_checkpointing = run == 0;
        m[run] = tiny_llama(100 + (uint64_t)R);
        accel_optimizer *o = optimizer(m[run]);
        CHECK(accel_accelerator_prepare(A, m[run], o, NULL, NULL) == ACCEL_OK);
        CHECK(accel_module_find(m[run], "model.layers.1")->gradient_checkpointing == (run == 0));
        for (int s = 0; s < 3; s++) loss[run][s] = acc_step(m[run], o, true, s);
        CHECK_MSG(accel_accelerator_clear(A) == ACCEL_OK, "%s", accel_last_error());
        accel_optimizer_free(o);
    }
    A->fsdp.activation_checkpointing = true;
    for (int s = 0; s < 3; s++)
        CHECK_MSG(loss[0][s] == loss[1][s], "step %d: loss %.9g checkpointed, %.9g not", s, loss[0][s], loss[1][s]);
    CHECK_MSG(same_weights(m[0], m[1]), "weights differ with activation checkpointing");
    accel_module_free(m[0]);
    accel_module_free(m[1]);
}

/* A's stage-3 settings with the default wrap units (what MLP-sized models
 * get); returns the settings before, for done(). */
static accel__fsdp_cfg default_units(void) {
    accel__fsdp_cfg saved = A->fsdp;
    A->fsdp.wrap = ACCEL__WRAP_DEFAULT;
    return saved;
}

/* Ends a test of the prepared model m: unprepared, freed, A's settings back. */
static void done(accel_module *m, accel__fsdp_cfg saved) {
    CHECK_MSG(accel_accelerator_clear(A) == ACCEL_OK, "%s", accel_last_error());
    accel_module_free(m);
    A->fsdp = saved;
}

/* Each fsdp_auto_wrap_policy on the Llama (tied embeddings). */
static void test_llama_wrap_policies(void) {
    accel__fsdp_cfg saved = A->fsdp;
    A->fsdp.wrap = ACCEL__WRAP_TRANSFORMER; /* the decoder layers; the rest in the root's unit */
    check_equivalence(true, 3);
    /* 500: each attention (768) and MLP (1152) and embed_tokens (640); the
     * root keeps the norms and merges with embed_tokens through the tied head */
    A->fsdp.wrap = ACCEL__WRAP_SIZE;
    A->fsdp.min_num_params = 500;
    check_equivalence(true, 5);
    A->fsdp.wrap = ACCEL__WRAP_NONE;
    check_equivalence(true, 1);
    A->fsdp.wrap = ACCEL__WRAP_TRANSFORMER;
    snprintf(A->fsdp.wrap_cls, sizeof A->fsdp.wrap_cls, "GPT2Block, Block");
    accel_module *m = tiny_llama(1);
    CHECK(accel_accelerator_prepare_model(A, m) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "could not find the transformer layer class");
    CHECK_STR_CONTAINS(accel_last_error(), "GPT2Block, Block");
    accel_clear_error();
    snprintf(A->fsdp.wrap_cls, sizeof A->fsdp.wrap_cls, "Foo,LlamaDecoderLayer");
    CHECK(accel_accelerator_prepare_model(A, m) == ACCEL_OK);
    CHECK(zero0()->n_units == 3);
    done(m, saved);
}

/* A family other than Llama: its decoder layers (Qwen3DecoderLayer, from the
 * architecture table) are the default units and the default transformer
 * layer class when fsdp_transformer_layer_cls_to_wrap is unset. */
static void test_other_family_units(void) {
    accel__fsdp_cfg saved = default_units();
    accel_manual_seed(5);
    accel_llama_config c = accel_llama_config_default();
    c.vocab_size = 40, c.hidden_size = 16, c.intermediate_size = 24, c.num_hidden_layers = 3;
    c.num_attention_heads = 4, c.num_key_value_heads = 2, c.head_dim = 4, c.max_position_embeddings = 16;
    accel_module *llama = accel_llama_new(&c, ACCEL_CPU_DEVICE);
    CHECK_MSG(accel_accelerator_prepare_model(A, llama) == ACCEL_OK, "%s", accel_last_error());
    int llama_units = zero0()->n_units; /* embed_tokens, 3 layers, norm, lm_head (+ root) */
    CHECK_MSG(accel_accelerator_clear(A) == ACCEL_OK, "%s", accel_last_error());
    accel_module_free(llama);
    snprintf(c.model_type, sizeof c.model_type, "qwen3");
    accel_module *m = accel_llama_new(&c, ACCEL_CPU_DEVICE);
    CHECK(m && !strcmp(accel_module_decoder_layer_class(m), "Qwen3DecoderLayer"));
    CHECK_MSG(accel_accelerator_prepare_model(A, m) == ACCEL_OK, "%s", accel_last_error());
    /* a layer not taken for a block would split into its projections and norms */
    CHECK_MSG(zero0()->n_units == llama_units, "%d units, %d for the Llama", zero0()->n_units, llama_units);
    CHECK_MSG(accel_accelerator_clear(A) == ACCEL_OK, "%s", accel_last_error());
    A->fsdp.wrap = ACCEL__WRAP_TRANSFORMER;
    A->fsdp.wrap_cls[0] = 0; /* unset */
    CHECK_MSG(accel_accelerator_prepare_model(A, m) == ACCEL_OK, "%s", accel_last_error());
    CHECK(zero0()->n_units == 4); /* three layers and the root */
    done(m, saved);
}

/* GPT-2 trains as DDP does under ZeRO-3 / FSDP with its table's wrap class
 * (GPT2Block, fsdp_transformer_layer_cls_to_wrap unset): two block units and
 * the root's (wte, wpe, ln_f, the tied head); by default the two blocks, wte
 * with the tied head, wpe, ln_f. With activation checkpointing on the blocks
 * when the launcher sets it. */
static void test_gpt2(void) {
    accel__fsdp_cfg saved = A->fsdp;
    g_gpt2 = true;
    accel_module *m = tiny_gpt2(1);
    CHECK(m && !strcmp(accel_module_decoder_layer_class(m), "GPT2Block"));
    accel_module_free(m);
    A->fsdp.wrap = ACCEL__WRAP_TRANSFORMER;
    A->fsdp.wrap_cls[0] = 0; /* unset: the table's class */
    check_equivalence(true, 3);
    A->fsdp.wrap = ACCEL__WRAP_DEFAULT;
    check_equivalence(true, 5);
    g_gpt2 = false;
    A->fsdp = saved;
}

/* stage3_param_persistence_threshold 20: the five norms (16 each) form one
 * unit that stays gathered (the norm module's unit disappears). */
static void test_persistence_threshold(void) {
    accel__fsdp_cfg saved = default_units();
    A->fsdp.persistence_threshold = 20;
    check_equivalence(true, 4);
    accel_module *m = tiny_llama(2);
    CHECK(accel_accelerator_prepare_model(A, m) == ACCEL_OK);
    int persistent = -1;
    for (int k = 0; k < zero0()->n_units; k++)
        if (zero0()->units[k].persistent) persistent = k;
    CHECK(persistent >= 0 && zero0()->units[persistent].count == 5);
    CHECK(persistent_bytes() > 0);
    done(m, saved);
}

/* A module that runs its child's forward directly, so the child's hooks never run. */
static accel_tensor *bypass_forward(accel_module *m, accel_tensor *x) {
    accel_module *c = m->children[0];
    return c->ops->forward(c, x);
}

static const accel_module_ops BYPASS_OPS = {"Bypass", bypass_forward, NULL};

/* Training through it is an error naming the unit, not a silently wrong step. */
static void test_unhooked_unit_is_an_error(void) {
    accel__fsdp_cfg saved = default_units();
    accel_manual_seed(9);
    accel_module *m = accel_module_new(&BYPASS_OPS, NULL);
    accel_module_add_child(m, "inner", accel_linear_new(5, 3, true, ACCEL_CPU_DEVICE, ACCEL_F32));
    CHECK(accel_accelerator_prepare_model(A, m) == ACCEL_OK);
    float xs[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    accel_tensor *y = accel_module_call(m, accel_from_floats(ACCEL_SHAPE(2, 5), xs));
    CHECK(accel_accelerator_backward(A, accel_sum(y, 0, NULL, false)) == ACCEL_ERR_STATE);
    CHECK_STR_CONTAINS(accel_last_error(), "unit \"inner\" was used without its forward hooks");
    accel_clear_error();
    accel_step_reset();
    done(m, saved);
}

/* Six 256x256 Linear units with probes between them: during backward at most
 * two units' full parameters (the current one's prefetch; all the units not
 * yet differentiated without reshard_after_forward) and two units' full
 * gradients (one reducing) are resident, where DDP holds all six of each; the
 * shards are 1/N. */
static void test_backward_memory(void) {
    accel__fsdp_cfg saved = default_units();
    accel_manual_seed(11);
    accel_module *l[12];
    for (int i = 0; i < 6; i++) {
        l[2 * i] = accel_linear_new(256, 256, true, ACCEL_CPU_DEVICE, ACCEL_F32);
        l[2 * i + 1] = accel_module_new(&PROBE_OPS, NULL);
    }
    accel_module *m = accel_sequential_new(12, l);
    int64_t unit_bytes = (256 * 256 + 256) * 4, total = 6 * unit_bytes;
    CHECK(accel_accelerator_prepare_model(A, m) == ACCEL_OK);
    CHECK(zero0()->n_units == 6);
    CHECK(zero0()->zn * S >= 6 * (256 * 256 + 256) && zero0()->zn * S < 6 * (256 * 256 + 256 + 16 * S));
    PROBED = m;
    float xs[2 * 256];
    for (int i = 0; i < 2 * 256; i++) xs[i] = (float)sin(i * 0.1 + R);
    for (int pass = 0; pass < 2; pass++) { /* the second knows the execution order: it prefetches */
        PEAK_PARAMS = PEAK_GRADS = 0;
        accel_tensor *y = accel_module_call(m, accel_from_floats(ACCEL_SHAPE(2, 256), xs));
        CHECK(accel_accelerator_backward(A, accel_sum(y, 0, NULL, false)) == ACCEL_OK);
        accel_step_reset();
    }
    long page = sysconf(_SC_PAGESIZE);
    int64_t two_units = 2 * (unit_bytes + 2 * page);
    /* without reshard_after_forward the units stay gathered from their forward to their backward */
    int64_t params_bound = saved.reshard_after_forward ? two_units : 6 * (unit_bytes + 2 * page);
    /* at least one unit: the prefetched one (or, without reshard_after_forward,
     * the units still gathered since their forward); a bf16 gather fills the
     * upper half of its unit's range until its unit runs (it then widens in place);
     * BACKWARD_POST has prefetched it too when a probe runs, after the unit's gradients */
    bool fits = saved.prefetch_bucket < 0 || saved.prefetch_bucket >= 256 * 256 + 256;
    bool holds_next = (saved.backward_prefetch && fits) || !saved.reshard_after_forward;
    int64_t landed = accel_accelerator_mixed_precision(A) == ACCEL_MP_BF16 ? unit_bytes / 2 - page : unit_bytes;
    CHECK_MSG((!holds_next || PEAK_PARAMS >= landed) && PEAK_PARAMS <= params_bound,
              "peak full parameters %lld bytes of %lld", (long long)PEAK_PARAMS, (long long)total);
    /* one process reduces at once; more keep one reduce-scatter in flight */
    CHECK_MSG((S == 1 || PEAK_GRADS > 0) && PEAK_GRADS <= two_units, "peak full gradients %lld bytes of %lld",
              (long long)PEAK_GRADS, (long long)total);
    CHECK(resident_param_bytes(m) == 0 && resident_grad_bytes(m) == 0); /* after backward: only the shards */
    done(m, saved);
}

/* The backward prefetch schedule: six units (Sequentials, alternately of
 * 8352 and 1056 elements) each ending in a probe, whose backward runs after
 * the unit's gather and before its Linear layers' backward: it counts the
 * units then gathered or gathering (the unit itself, and any prefetch). BACKWARD_PRE has started the next
 * unit's gather there; BACKWARD_POST starts it only once the unit's
 * gradients exist (so the probe sees none, yet five prefetches happen);
 * stage3_prefetch_bucket_size skips the units with more elements. The
 * schedule expected is ZERO3_WANT_PREFETCH ("pre", "post" or "none", then
 * ":" and the bucket, -1 for none) where a launcher test names it, so a
 * setting the library ignored fails; else it is A's settings. */
static accel_module *probed_unit(bool big) {
    accel_module *l[3] = {accel_linear_new(32, big ? 128 : 32, true, ACCEL_CPU_DEVICE, ACCEL_F32)};
    l[1] = big ? accel_linear_new(128, 32, true, ACCEL_CPU_DEVICE, ACCEL_F32) : accel_module_new(&PROBE_OPS, NULL);
    l[2] = big ? accel_module_new(&PROBE_OPS, NULL) : NULL;
    return accel_sequential_new(big ? 3 : 2, l);
}

/* The schedule to expect: "pre", "post" or "none", and the bucket (-1: none). */
static void wanted_schedule(char mode[8], int64_t *bucket) {
    const char *w = getenv("ZERO3_WANT_PREFETCH");
    long long b = -1;
    if (w) CHECK_MSG(sscanf(w, "%7[a-z]:%lld", mode, &b) == 2, "ZERO3_WANT_PREFETCH=\"%s\"", w);
    else snprintf(mode, 8, "%s", !A->fsdp.backward_prefetch ? "none" : A->fsdp.backward_post ? "post" : "pre");
    *bucket = w ? b : A->fsdp.prefetch_bucket;
}

static void test_prefetch_schedule(void) {
    accel__fsdp_cfg saved = A->fsdp;
    A->fsdp.wrap = ACCEL__WRAP_TRANSFORMER;
    snprintf(A->fsdp.wrap_cls, sizeof A->fsdp.wrap_cls, "Sequential");
    A->fsdp.reshard_after_forward = true;
    A->fsdp.activation_checkpointing = false;
    char mode[8] = "";
    int64_t bucket;
    wanted_schedule(mode, &bucket);
    accel_manual_seed(12);
    accel_module *u[6];
    for (int i = 0; i < 6; i++) u[i] = probed_unit(i % 2 == 0);
    accel_module *m = accel_sequential_new(6, u);
    CHECK(accel_accelerator_prepare_model(A, m) == ACCEL_OK);
    accel__zero_model *zm = accel__zero_of(&A->models[0]);
    CHECK(zm->n_units == 6);
    PROBED = m;
    float xs[2 * 32];
    for (int i = 0; i < 2 * 32; i++) xs[i] = (float)cos(i * 0.3 + R);
    for (int pass = 0; pass < 2; pass++) { /* the second knows the execution order: it prefetches */
        accel_tensor *y = accel_module_call(m, accel_from_floats(ACCEL_SHAPE(2, 32), xs));
        zm->prefetches = 0; /* forward's (ACCEL_FSDP_FORWARD_PREFETCH) not counted */
        N_PROBES = 0;
        CHECK(accel_accelerator_backward(A, accel_sum(y, 0, NULL, false)) == ACCEL_OK);
        accel_step_reset();
    }
    int want_count = 0;
    for (int k = 5; k >= 0; k--) { /* backward order: unit k's probe, then its prefetch of unit k - 1 */
        int64_t numel = k ? zm->units[k - 1].numel : 0;
        bool fetched = k && strcmp(mode, "none") && (bucket < 0 || numel <= bucket);
        want_count += fetched;
        int want_ahead = fetched && !strcmp(mode, "pre");
        CHECK_MSG(GATHERED[5 - k] == 1 + want_ahead, "%s:%lld, unit %d: %d other units gathered in its backward, "
                  "want %d", mode, (long long)bucket, k, GATHERED[5 - k] - 1, want_ahead);
    }
    CHECK(zm->units[0].numel == 8352 && zm->units[1].numel == 1056);
    CHECK_MSG(zm->prefetches == want_count, "%s:%lld: %lld prefetches in backward, want %d", mode, (long long)bucket,
              (long long)zm->prefetches, want_count);
    done(m, saved);
}

/* A forward without backward (evaluation) leaves nothing gathered (the MLP's root holds no parameters). */
static void test_eval_forward_reshards(void) {
    accel__fsdp_cfg saved = default_units();
    accel_module *m = mlp(3);
    CHECK(accel_accelerator_prepare_model(A, m) == ACCEL_OK);
    bool prev = accel_set_grad_enabled(false);
    accel_tensor *l = loss_of(m, false, 0, 0, R);
    accel_set_grad_enabled(prev);
    CHECK(l && isfinite(accel_item(l)));
    const char *reshard = getenv("ACCEL_FSDP_RESHARD_AFTER_FORWARD");
    if (!reshard || strcmp(reshard, "false")) CHECK(resident_param_bytes(m) == 0);
    else CHECK(resident_param_bytes(m) > 0); /* kept gathered until the step */
    accel_step_reset();
    done(m, saved);
}

/* A rank's shard is one piece per unit under stage 3: there is no one range to report. */
static void test_zero_shard_refused(void) {
    accel__fsdp_cfg saved = default_units();
    accel_module *m = mlp(4);
    CHECK(accel_accelerator_prepare_model(A, m) == ACCEL_OK);
    int64_t lo, hi, padded;
    CHECK(accel_accelerator_zero_shard(A, m, &lo, &hi, &padded) == ACCEL_ERR_STATE);
    accel_clear_error();
    done(m, saved);
}

/* save_pretrained (and accel_save_module) of a model whose parameters are
 * sharded (each process holds its pieces): refused naming
 * accel_accelerator_save_model, nothing written; after clear() (the full
 * weights back) it saves. The Llama's and BERT's alike. */
static void test_save_pretrained_refused(void) {
    char dir[] = "/tmp/accel_zero3_save_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    accel__fsdp_cfg saved = default_units();
    accel_bert_config bc = accel_bert_config_default();
    bc.vocab_size = 40, bc.hidden_size = 16, bc.num_hidden_layers = 2, bc.num_attention_heads = 4;
    bc.intermediate_size = 32, bc.max_position_embeddings = 16;
    accel_module *models[2] = {tiny_lm(5), accel_bert_new(&bc, ACCEL_CPU_DEVICE)};
    for (int i = 0; i < 2; i++) {
        accel_module *m = models[i];
        CHECK(m && accel_accelerator_prepare_model(A, m) == ACCEL_OK);
        accel_status st = i == 0 ? accel_save_pretrained(m, dir, 0) : accel_bert_save_pretrained(m, dir, 0);
        CHECK_MSG(st == ACCEL_ERR_STATE, "%s: status %d", i == 0 ? "llama" : "bert", (int)st);
        CHECK_STR_CONTAINS(accel_last_error(), "accel_accelerator_save_model");
        /* (the plain state-dict save too: it wrote zeros, the unmapped rest of each unit), and of a part of it */
        CHECK(accel_save_module(dir, m, 0) == ACCEL_ERR_STATE);
        CHECK_STR_CONTAINS(accel_last_error(), "sharded across processes");
        CHECK(m->n_children > 0 && accel_save_module(dir, m->children[0], 0) == ACCEL_ERR_STATE);
        char f[128];
        snprintf(f, sizeof f, "%s/model.safetensors", dir);
        CHECK(access(f, F_OK) != 0);
        snprintf(f, sizeof f, "%s/config.json", dir);
        CHECK(access(f, F_OK) != 0);
        accel_clear_error();
        CHECK_MSG(accel_accelerator_clear(A) == ACCEL_OK, "%s", accel_last_error());
        st = i == 0 ? accel_save_pretrained(m, dir, 0) : accel_bert_save_pretrained(m, dir, 0);
        CHECK_MSG(st == ACCEL_OK, "%s", accel_last_error());
        CHECK(access(f, F_OK) == 0);
        accel_module_free(m);
        char cmd[160];
        snprintf(cmd, sizeof cmd, "rm -f %s/*", dir);
        CHECK(system(cmd) == 0);
    }
    A->fsdp = saved;
    rmdir(dir);
}

int main(void) {
    bool from_env = getenv("ACCEL_ZERO_STAGE") || getenv("ACCEL_DEEPSPEED_CONFIG_FILE") ||
                    getenv("ACCEL_FSDP_SHARDING_STRATEGY");
    accel_accelerator_opts o = accel_accelerator_opts_default();
    if (!from_env) o.zero_stage = 3; /* run plainly: ZeRO-3 on one process */
    A = accel_accelerator_new(&o);
    if (!A) {
        fprintf(stderr, "error: %s\n", accel_last_error());
        return 1;
    }
    N = accel_accelerator_num_processes(A);
    R = accel_accelerator_process_index(A);
    S = A->shard_world;
    CHECK(accel_accelerator_zero_stage(A) == 3);
    /* The unit counts below assume no persistence threshold; test_persistence_threshold sets its own. */
    int64_t persist = A->fsdp.persistence_threshold;
    A->fsdp.persistence_threshold = 0;
    RUN(test_mlp);
    RUN(test_llama);
    RUN(test_activation_checkpointing);
    RUN(test_llama_wrap_policies);
    RUN(test_other_family_units);
    RUN(test_other_families_train);
    RUN(test_gpt2);
    RUN(test_persistence_threshold);
    RUN(test_unhooked_unit_is_an_error);
    RUN(test_backward_memory);
    RUN(test_prefetch_schedule);
    RUN(test_eval_forward_reshards);
    RUN(test_zero_shard_refused);
    RUN(test_save_pretrained_refused);
    if (R == 0)
        printf("zero3 world=%d mp=%s accum=%d clip=%g wrap=%d fwd_prefetch=%d bwd_prefetch=%d reshard=%d persist=%lld ckpt=%d "
               "shard_world=%d\n",
               N,
               accel_mixed_precision_name(accel_accelerator_mixed_precision(A)),
               accel_accelerator_gradient_accumulation_steps(A), accel_accelerator_gradient_clipping(A),
               (int)A->fsdp.wrap, A->fsdp.forward_prefetch, A->fsdp.backward_prefetch, A->fsdp.reshard_after_forward,
               (long long)persist, A->fsdp.activation_checkpointing, S);
    if (R == 0) /* the launcher tests of the prefetch settings match this too */
        printf("zero3 prefetch post=%d bucket=%lld\n", A->fsdp.backward_post, (long long)A->fsdp.prefetch_bucket);
    fflush(stdout);
    accel_accelerator_free(A);
    return check_summary();
}
