/* The decoder families' tensor-parallel plan (Megatron-LM's, torchtitan's):
 * q/k/v and gate/up column-parallel, o and down row-parallel, the heads
 * split over the ranks, the vocabulary split in embed_tokens and lm_head
 * (whose logits accel_llama_loss takes through the vocab-parallel
 * cross-entropy). With fewer key/value heads than ranks each key/value head
 * is replicated on tp / kv_heads ranks, as Megatron does: k_proj and v_proj
 * stay whole and each rank uses its head's rows (tp_internal.h). Under
 * sequence parallelism every entry takes the sequence-split activations:
 * the layers' norms and residual adds see T / tp positions. */
#include <stdio.h>

#include "arch.h"
#include "nn_internal.h"
#include "tp_internal.h"

/* Why the model cannot run over tp ranks (an error), or ACCEL_OK. */
static accel_status plan_check(const accel__arch *a, const accel_llama_config *c, int tp) {
    static const char *FN = "accel_llama_parallelize";
    if (a->blocks == ACCEL__BLOCKS_GPT2 || a->fused_qkv || a->fused_gate_up || a->qk_norm_full ||
        (a->qk_norm && a->gemma_blocks))
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: %s models (%s) have no tensor-parallel plan yet", FN,
                               a->model_type, a->blocks == ACCEL__BLOCKS_GPT2 ? "Conv1D projections"
                               : a->fused_qkv || a->fused_gate_up ? "fused projections"
                                                                  : "q/k norms over all the heads");
    int64_t H = c->num_attention_heads, Hkv = c->num_key_value_heads;
    const char *bad = H % tp ? "num_attention_heads"
                      : Hkv % tp && tp % Hkv ? "num_key_value_heads (nor a divisor of tp)"
                      : c->intermediate_size % tp ? "intermediate_size"
                      : c->vocab_size % tp ? "vocab_size"
                                           : NULL;
    if (bad)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: %s is not a multiple of tp %d (heads %lld, kv heads %lld, "
                               "intermediate_size %lld, vocab_size %lld)", FN, bad, tp, (long long)H,
                               (long long)Hkv, (long long)c->intermediate_size, (long long)c->vocab_size);
    return ACCEL_OK;
}

accel_status accel_llama_parallelize(accel_module *llama, accel_pg *pg, bool sequence_parallel) {
    const accel_llama_config *c = llama ? accel_llama_config_of(llama) : NULL;
    if (!llama || !pg)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_llama_parallelize: %s is NULL",
                               llama ? "process group" : "model");
    if (!c) return accel_last_status();
    const accel__arch *a = accel__arch_find(c->model_type);
    int tp = accel_pg_size(pg), rank = accel_pg_rank(pg);
    if (plan_check(a, c, tp)) return accel_last_status();
    int64_t Hkv = c->num_key_value_heads;
    bool replicate_kv = Hkv < tp;
    static const accel_tp_plan_entry SPLIT_KV[] = {
        {"model.embed_tokens", ACCEL_TP_VOCAB_EMBEDDING, false},
        {"model.layers.*.self_attn.q_proj", ACCEL_TP_COLWISE, false},
        {"model.layers.*.self_attn.k_proj", ACCEL_TP_COLWISE, false},
        {"model.layers.*.self_attn.v_proj", ACCEL_TP_COLWISE, false},
        {"model.layers.*.self_attn.o_proj", ACCEL_TP_ROWWISE, false},
        {"model.layers.*.mlp.gate_proj", ACCEL_TP_COLWISE, false},
        {"model.layers.*.mlp.up_proj", ACCEL_TP_COLWISE, false},
        {"model.layers.*.mlp.down_proj", ACCEL_TP_ROWWISE, false},
        {"lm_head", ACCEL_TP_COLWISE, false},
    };
    /* A model without layers has no pattern of theirs to match. */
    accel_tp_plan_entry plan[9];
    int n = 0;
    for (int e = 0; e < 9; e++) {
        bool layer = e >= 1 && e <= 7, kv = e == 2 || e == 3;
        if ((layer && c->num_hidden_layers == 0) || (kv && replicate_kv)) continue;
        plan[n] = SPLIT_KV[e];
        plan[n++].sequence_parallel = sequence_parallel;
    }
    if (accel_module_parallelize(llama, plan, n, pg)) return accel_last_status();
    accel_module *layers = accel_module_find(llama, "model.layers");
    for (int i = 0; layers && i < layers->n_children; i++) {
        accel_module *layer = layers->children[i];
        for (int kv = 0; replicate_kv && kv < 2; kv++) {
            char path[64];
            snprintf(path, sizeof path, "model.layers.%d.self_attn.%s", i, kv ? "v_proj" : "k_proj");
            accel_module *m = accel_module_find(layer, kv ? "self_attn.v_proj" : "self_attn.k_proj");
            /* rank r's query heads all read kv head r / (tp / Hkv) */
            if (!m || accel__tp_parallelize_one(m, ACCEL__TP_REPLICA_ROWS, pg, (int)(rank / (tp / Hkv)), (int)Hkv,
                                                sequence_parallel, path))
                return accel_last_status();
        }
        /* Qwen3's per-head q/k norms: whole on every rank, each normalizing its heads */
        for (int kq = 0; a->qk_norm && kq < 2; kq++)
            if (accel__tp_replica_norm(accel_module_find(layer, kq ? "self_attn.k_norm" : "self_attn.q_norm"), pg,
                                       c->rms_norm_eps))
                return accel_last_status();
        accel__decoder_layer_set_heads(layer, c->num_attention_heads / tp, replicate_kv ? 1 : Hkv / tp);
    }
    return ACCEL_OK;
}

int accel__tp_own_plan(accel_module *m, accel_pg *pg, bool sequence_parallel) {
    const accel__arch *a = accel__arch_of_module(m);
    if (!a || m->ops != &a->causal_lm) return 0;
    return accel_llama_parallelize(m, pg, sequence_parallel) == ACCEL_OK ? 1 : -1;
}
