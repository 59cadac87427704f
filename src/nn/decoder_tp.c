/* The decoder families' tensor-parallel plan (Megatron-LM's, torchtitan's):
 * q/k/v and gate/up column-parallel, o and down row-parallel, the heads
 * split over the ranks, the vocabulary split in embed_tokens and lm_head
 * (whose logits accel_llama_loss takes through the vocab-parallel
 * cross-entropy). Fused projections (Phi-3's qkv_proj and gate_up_proj,
 * GPT-2's c_attn) are cut per part, each part as its own projection would
 * be; GPT-2's Conv1D weights [in, out] are cut along their columns. Phi's
 * dense is its o_proj, fc1 and fc2 its MLP's up and down; its lm_head's
 * bias is cut with the head's columns. With
 * fewer key/value heads than ranks each key/value head is replicated on
 * tp / kv_heads ranks, as Megatron does: k_proj and v_proj (Phi-3: the
 * whole qkv_proj) stay whole and each rank uses its head's rows
 * (tp_internal.h). q/k norms stay whole on every rank: Qwen3's, Gemma 3's and Phi's per head,
 * OLMo 2's over every head with the mean square summed over the group.
 * Mixtral's, Qwen3-MoE's and Qwen2-MoE's sparse blocks: the router whole,
 * each expert's MLP cut as a dense one (Qwen2-MoE's shared expert too, its
 * gate whole), in one region per block (parallelize_sparse).
 * Under sequence parallelism every entry takes the sequence-split
 * activations: the layers' norms and residual adds see T / tp positions. */
#include <stdio.h>

#include "arch.h"
#include "core/core_internal.h"
#include "decoder_cp.h"
#include "decoder_pipeline.h"
#include "nn_internal.h"
#include "tp_internal.h"

/* Whether some decoder layer of c has a dense MLP, and whether some has experts. */
static void layer_kinds(const accel__arch *a, const accel_llama_config *c, bool *dense, bool *sparse) {
    *dense = *sparse = false;
    for (int64_t i = 0; i < c->num_hidden_layers; i++) {
        bool s = accel__arch_layer_sparse(a, c, i);
        *sparse |= s, *dense |= !s;
    }
}

accel_status accel__llama_tp_check(const accel_llama_config *c, int tp, const char *who) {
    const accel__arch *a = accel__arch_find(c->model_type);
    bool dense, sparse;
    layer_kinds(a, c, &dense, &sparse);
    /* intermediate_size: the dense MLPs' and Mixtral's experts'; Qwen's experts have moe_intermediate_size */
    bool qwen_experts = sparse && a->moe == ACCEL__MOE_QWEN;
    int64_t H = c->num_attention_heads, Hkv = c->num_key_value_heads, I = c->intermediate_size;
    const char *bad = H % tp ? "num_attention_heads"
                      : Hkv % tp && tp % Hkv ? "num_key_value_heads (nor a divisor of tp)"
                      : (dense || !qwen_experts) && I % tp ? "intermediate_size"
                      : qwen_experts && c->moe_intermediate_size % tp ? "moe_intermediate_size"
                      : sparse && a->shared_expert && c->shared_expert_intermediate_size % tp
                          ? "shared_expert_intermediate_size"
                      : c->vocab_size % tp ? "vocab_size"
                                           : NULL;
    char moe[112] = "";
    int at = qwen_experts ? snprintf(moe, sizeof moe, ", moe_intermediate_size %lld", (long long)c->moe_intermediate_size)
                          : 0;
    if (qwen_experts && a->shared_expert)
        snprintf(moe + at, sizeof moe - (size_t)at, ", shared_expert_intermediate_size %lld",
                 (long long)c->shared_expert_intermediate_size);
    if (bad)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: %s is not a multiple of tp %d (heads %lld, kv heads %lld, "
                               "intermediate_size %lld%s, vocab_size %lld)", who, bad, tp, (long long)H,
                               (long long)Hkv, (long long)I, moe, (long long)c->vocab_size);
    return ACCEL_OK;
}

/* The plan's entries for the modules parallelized by pattern: the
 * embedding, the separate projections, lm_head. */
static int plan_entries(const accel__arch *a, const accel_llama_config *c, bool replicate_kv, bool sp,
                        accel_tp_plan_entry *plan) {
    bool layers = c->num_hidden_layers > 0; /* without layers their patterns match nothing */
    bool dense, sparse; /* nor do the MLP's without a dense layer (a sparse block is cut per layer) */
    layer_kinds(a, c, &dense, &sparse);
    int n = 0;
    if (a->neox_blocks) { /* query_key_value's rows are per head [H, 3, D]: cut colwise, each rank gets its
                           * heads' q, k and v rows */
        plan[n++] = (accel_tp_plan_entry){"gpt_neox.embed_in", ACCEL_TP_VOCAB_EMBEDDING, sp};
        if (layers) {
            plan[n++] = (accel_tp_plan_entry){"gpt_neox.layers.*.attention.query_key_value", ACCEL_TP_COLWISE, sp};
            plan[n++] = (accel_tp_plan_entry){"gpt_neox.layers.*.attention.dense", ACCEL_TP_ROWWISE, sp};
            plan[n++] = (accel_tp_plan_entry){"gpt_neox.layers.*.mlp.dense_h_to_4h", ACCEL_TP_COLWISE, sp};
            plan[n++] = (accel_tp_plan_entry){"gpt_neox.layers.*.mlp.dense_4h_to_h", ACCEL_TP_ROWWISE, sp};
        }
    } else if (a->blocks == ACCEL__BLOCKS_GPT2) { /* c_attn, fused, is cut per layer */
        plan[n++] = (accel_tp_plan_entry){"transformer.wte", ACCEL_TP_VOCAB_EMBEDDING, sp};
        if (layers) {
            plan[n++] = (accel_tp_plan_entry){"transformer.h.*.attn.c_proj", ACCEL_TP_ROWWISE, sp};
            plan[n++] = (accel_tp_plan_entry){"transformer.h.*.mlp.c_fc", ACCEL_TP_COLWISE, sp};
            plan[n++] = (accel_tp_plan_entry){"transformer.h.*.mlp.c_proj", ACCEL_TP_ROWWISE, sp};
        }
    } else {
        plan[n++] = (accel_tp_plan_entry){"model.embed_tokens", ACCEL_TP_VOCAB_EMBEDDING, sp};
        if (layers && !a->fused_qkv) {
            plan[n++] = (accel_tp_plan_entry){"model.layers.*.self_attn.q_proj", ACCEL_TP_COLWISE, sp};
            if (!replicate_kv) {
                plan[n++] = (accel_tp_plan_entry){"model.layers.*.self_attn.k_proj", ACCEL_TP_COLWISE, sp};
                plan[n++] = (accel_tp_plan_entry){"model.layers.*.self_attn.v_proj", ACCEL_TP_COLWISE, sp};
            }
        }
        if (layers)
            plan[n++] = (accel_tp_plan_entry){a->phi_blocks ? "model.layers.*.self_attn.dense"
                                                            : "model.layers.*.self_attn.o_proj", ACCEL_TP_ROWWISE, sp};
        bool two_proj_mlp = a->phi_blocks || a->starcoder2_blocks;
        if (layers && two_proj_mlp) { /* PhiMLP's fc1, Starcoder2MLP's c_fc as an up projection, fc2 / c_proj as a down one */
            plan[n++] = (accel_tp_plan_entry){a->phi_blocks ? "model.layers.*.mlp.fc1" : "model.layers.*.mlp.c_fc",
                                              ACCEL_TP_COLWISE, sp};
            plan[n++] = (accel_tp_plan_entry){a->phi_blocks ? "model.layers.*.mlp.fc2" : "model.layers.*.mlp.c_proj",
                                              ACCEL_TP_ROWWISE, sp};
        } else if (dense && !a->fused_gate_up) {
            plan[n++] = (accel_tp_plan_entry){"model.layers.*.mlp.gate_proj", ACCEL_TP_COLWISE, sp};
            plan[n++] = (accel_tp_plan_entry){"model.layers.*.mlp.up_proj", ACCEL_TP_COLWISE, sp};
        }
        if (dense && !two_proj_mlp)
            plan[n++] = (accel_tp_plan_entry){"model.layers.*.mlp.down_proj", ACCEL_TP_ROWWISE, sp};
    }
    plan[n++] = (accel_tp_plan_entry){accel__arch_head(a), ACCEL_TP_COLWISE, sp};
    return n;
}

/* A module of a layer cut by name, with its parts. */
typedef struct layer_cut {
    const char *name;
    accel_tp_style style;
    accel__tp_parts parts;
} layer_cut;

/* A sparse block (moe.c) at `at` ("model.layers.<i>.mlp", Mixtral's
 * "model.layers.<i>.block_sparse_moe"): the router whole on every rank, each expert's gate/up
 * (w1/w3) column-parallel and its down (w2) row-parallel, as Megatron cuts
 * experts it does not spread over the ranks. All of them run inside one
 * region that the block enters and leaves (accel__moe_forward), so every
 * rank routes the same whole input alike and runs the same experts on the
 * same rows, each with its features; the weighted per-token sums of the
 * experts' partial outputs are summed over the ranks once for the block,
 * which equals summing each expert's output, with one collective. */
static accel_status parallelize_sparse(accel_module *block, const char *at, const accel__arch *a,
                                       const accel_llama_config *c, accel_pg *pg, bool sp) {
    int tp = accel_pg_size(pg), rank = accel_pg_rank(pg);
    accel_module *gate = accel_module_find(block, "gate"), *experts = accel_module_find(block, "experts");
    if (!gate || !experts)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_llama_parallelize: %s has no gate and experts", at);
    char path[160];
    snprintf(path, sizeof path, "%s.gate", at);
    /* the router's rows all on every rank: its weight through the region's copy, its gradient summed */
    accel__tp_parts all = {1, {c->num_local_experts}, {0}, {1}};
    if (accel__tp_parallelize_one(gate, ACCEL__TP_REPLICA_ROWS, pg, &all, sp, true, path)) return accel_last_status();
    bool mixtral = a->moe == ACCEL__MOE_MIXTRAL;
    int64_t I = mixtral ? c->intermediate_size : c->moe_intermediate_size;
    accel__tp_parts mine = {1, {I}, {rank}, {tp}};
    static const char *const MIXTRAL[3] = {"w1", "w3", "w2"}, *const QWEN[3] = {"gate_proj", "up_proj", "down_proj"};
    /* Qwen2-MoE's shared expert after the routed ones, cut as they are (of
     * its own intermediate size); its gate (one row) whole, as the router */
    accel_module *shared = a->shared_expert ? accel_module_find(block, "shared_expert") : NULL;
    accel_module *shared_gate = a->shared_expert ? accel_module_find(block, "shared_expert_gate") : NULL;
    if (a->shared_expert && (!shared || !shared_gate))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_llama_parallelize: %s has no shared_expert and "
                               "shared_expert_gate", at);
    for (int e = 0; e < experts->n_children + (shared != NULL); e++) {
        bool sh = e == experts->n_children;
        accel_module *expert = sh ? shared : experts->children[e];
        accel__tp_parts part = sh ? (accel__tp_parts){1, {c->shared_expert_intermediate_size}, {rank}, {tp}} : mine;
        for (int k = 0; k < 3; k++) {
            const char *proj = (mixtral ? MIXTRAL : QWEN)[k];
            snprintf(path, sizeof path, sh ? "%s.shared_expert%s.%s" : "%s.experts.%s.%s", at,
                     sh ? "" : expert->name, proj);
            accel_module *m = accel_module_find(expert, proj);
            if (!m) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_llama_parallelize: the model has no %s", path);
            if (accel__tp_parallelize_one(m, k < 2 ? ACCEL_TP_COLWISE : ACCEL_TP_ROWWISE, pg, &part, sp, true, path))
                return accel_last_status();
        }
    }
    if (!shared_gate) return ACCEL_OK;
    snprintf(path, sizeof path, "%s.shared_expert_gate", at);
    accel__tp_parts one = {1, {1}, {0}, {1}};
    return accel__tp_parallelize_one(shared_gate, ACCEL__TP_REPLICA_ROWS, pg, &one, sp, true, path);
}

/* What layer i's modules outside the pattern plan become: the fused
 * projections cut per part, replicated key/value rows, the q/k norms. */
static accel_status parallelize_layer(accel_module *layer, int i, const accel__arch *a, const accel_llama_config *c,
                                      accel_pg *pg, bool sp) {
    int tp = accel_pg_size(pg), rank = accel_pg_rank(pg);
    int64_t H = c->num_attention_heads, Hkv = c->num_key_value_heads, D = c->head_dim, C = c->hidden_size;
    int64_t qd = H * D, kvd = Hkv * D, I = c->intermediate_size;
    bool replicate_kv = Hkv < tp;
    /* this rank's key/value heads: its slice of tp, or (replicated) the one
     * head of Hkv that its query heads all read, rank / (tp / Hkv) */
    int kv_index = replicate_kv ? rank / (tp / (int)Hkv) : rank, kv_count = replicate_kv ? (int)Hkv : tp;
    const char *prefix = a->blocks == ACCEL__BLOCKS_GPT2 ? "transformer.h" : a->neox_blocks ? "gpt_neox.layers"
                                                                                           : "model.layers";
    char path[96];
    layer_cut cut[3];
    int n = 0;
    if (a->blocks == ACCEL__BLOCKS_GPT2) /* c_attn [C, 3C] = q | k | v (as many kv heads as heads) */
        cut[n++] = (layer_cut){"attn.c_attn", ACCEL_TP_COLWISE,
                                         {3, {C, C, C}, {rank, rank, rank}, {tp, tp, tp}}};
    else if (a->fused_qkv) /* qkv_proj: q | k | v, each cut as its own projection would be */
        cut[n++] = (layer_cut){"self_attn.qkv_proj", replicate_kv ? ACCEL__TP_REPLICA_ROWS : ACCEL_TP_COLWISE,
                                         {3, {qd, kvd, kvd}, {rank, kv_index, kv_index}, {tp, kv_count, kv_count}}};
    else
        for (int kv = 0; replicate_kv && kv < 2; kv++)
            cut[n++] = (layer_cut){kv ? "self_attn.v_proj" : "self_attn.k_proj", ACCEL__TP_REPLICA_ROWS,
                                             {1, {kvd}, {kv_index}, {kv_count}}};
    if (a->fused_gate_up) /* gate_up_proj: gate | up */
        cut[n++] = (layer_cut){"mlp.gate_up_proj", ACCEL_TP_COLWISE, {2, {I, I}, {rank, rank}, {tp, tp}}};
    for (int k = 0; k < n; k++) {
        snprintf(path, sizeof path, "%s.%d.%s", prefix, i, cut[k].name);
        accel_module *m = accel_module_find(layer, cut[k].name);
        if (!m) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_llama_parallelize: the model has no %s", path);
        if (accel__tp_parallelize_one(m, cut[k].style, pg, &cut[k].parts, sp, false, path)) return accel_last_status();
    }
    if (accel__arch_layer_sparse(a, c, i)) {
        const char *bn = a->moe == ACCEL__MOE_MIXTRAL ? "block_sparse_moe" : "mlp";
        accel_module *block = accel_module_find(layer, bn);
        snprintf(path, sizeof path, "%s.%d.%s", prefix, i, bn);
        if (!block) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_llama_parallelize: the model has no %s", path);
        if (parallelize_sparse(block, path, a, c, pg, sp)) return accel_last_status();
    }
    for (int kq = 0; (accel__arch_qk_norm_heads(a, c) || a->qk_norm_full) && kq < 2; kq++) {
        static const char *const NAMES[2][2] = {{"self_attn.q_norm", "self_attn.k_norm"},
                                                {"self_attn.q_layernorm", "self_attn.k_layernorm"}};
        accel_module *norm = accel_module_find(layer, NAMES[a->phi_blocks || a->stablelm_blocks][kq]);
        snprintf(path, sizeof path, "%s.%d.%s", prefix, i, NAMES[a->phi_blocks || a->stablelm_blocks][kq]);
        if (!norm) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_llama_parallelize: the model has no %s", path);
        /* Qwen3's per-head norms: whole on every rank, each normalizing its
         * heads; OLMo 2's over every head: this rank's rows of the weight,
         * the mean square over the group (each key/value head counted once) */
        accel__tp_parts rows = kq ? (accel__tp_parts){1, {kvd}, {kv_index}, {kv_count}}
                                  : (accel__tp_parts){1, {qd}, {rank}, {tp}};
        int rep = kq && replicate_kv ? tp / (int)Hkv : 1;
        /* StableLM's, a norm of its own per head: this rank's heads' (the first as the projections' rows) */
        int64_t first = kq ? kv_index * (Hkv / kv_count) : rank * (H / tp);
        accel_status st = a->stablelm_blocks
                              ? accel__tp_norm_per_head(norm, pg, c->rms_norm_eps, first)
                              : accel__tp_replica_norm(norm, pg, c->rms_norm_eps, a->qk_norm_full ? &rows : NULL, rep,
                                                       a->gemma_blocks);
        if (st) return st;
    }
    accel__decoder_layer_set_heads(layer, H / tp, replicate_kv ? 1 : Hkv / tp);
    return ACCEL_OK;
}

/* Megatron's model-parallel RNG tracker (model_parallel_cuda_manual_seed):
 * the stream of tp rank r starts at the process's seed + 2718 + r, so the
 * ranks' sharded activations (their heads, their positions) draw
 * independent masks while every data-parallel replica of rank r draws the
 * same ones, as the default generator's seed is the same there. */
static void seed_dropout_stream(accel__decoder_root *root, int tp_rank, bool sequence_parallel) {
    root->tp_rng.on = true;
    root->tp_rng.seq_split = sequence_parallel;
    accel_rng_init(&root->tp_rng.rng, accel__tp_dropout_seed(accel__rng_get(accel_default_rng()).seed, tp_rank));
}

accel_status accel_llama_parallelize(accel_module *llama, accel_pg *pg, bool sequence_parallel) {
    const accel_llama_config *c = llama ? accel_llama_config_of(llama) : NULL;
    if (!llama || !pg)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_llama_parallelize: %s is NULL",
                               llama ? "process group" : "model");
    if (!c) return accel_last_status();
    const accel__arch *a = accel__arch_find(c->model_type);
    int tp = accel_pg_size(pg);
    if (accel__llama_tp_check(c, tp, "accel_llama_parallelize")) return accel_last_status();
    accel_tp_plan_entry plan[10];
    int n = plan_entries(a, c, c->num_key_value_heads < tp, sequence_parallel, plan);
    accel__decoder_root *root = llama->impl; /* a causal LM root: accel_llama_config_of said so */
    root->tp_cut_open = true; /* until the last layer is cut: a failure between leaves the model cut in part */
    if (accel_module_parallelize(llama, plan, n, pg)) return accel_last_status();
    accel_module *layers = accel__decoder_layers(llama);
    for (int i = 0; layers && i < layers->n_children; i++)
        if (parallelize_layer(layers->children[i], i, a, c, pg, sequence_parallel)) return accel_last_status();
    root->tp_cut_open = false;
    seed_dropout_stream(root, accel_pg_rank(pg), sequence_parallel);
    return ACCEL_OK;
}

accel_rng *accel__tp_dropout_rng(accel_module *m) {
    const accel__arch *a = m ? accel__arch_of_module(m) : NULL;
    if (!a || m->ops != &a->causal_lm) return NULL;
    accel__decoder_tp_rng *r = &((accel__decoder_root *)m->impl)->tp_rng;
    return r->on ? &r->rng : NULL;
}

bool accel__tp_own_plan_partial(accel_module *m) {
    const accel__arch *a = accel__arch_of_module(m);
    return a && m->ops == &a->causal_lm && ((const accel__decoder_root *)m->impl)->tp_cut_open;
}

int accel__tp_own_plan(accel_module *m, accel_pg *pg, bool sequence_parallel) {
    const accel__arch *a = accel__arch_of_module(m);
    if (!a || m->ops != &a->causal_lm) return 0;
    return accel_llama_parallelize(m, pg, sequence_parallel) == ACCEL_OK ? 1 : -1;
}
