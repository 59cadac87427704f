/* The decoder models (llama.c) under context parallelism (accel/cp.h): the
 * cp group recorded on a model's root, what the models refuse under it, the
 * attention (sliding windows and soft-capping at the chunks' global
 * positions), and the loss over the sharded sequence. llama.c calls
 * these at three places (forward's checks, attention, the loss). */
#include "decoder_cp.h"
#include "decoder_pipeline.h"
#include "nn_internal.h"
#include "ops/attention_masked.h"
#include "ops/cp_loss.h"

accel_status accel__llama_cp_check(const accel_llama_config *c, int tp, int cp, accel_cp_strategy strategy,
                                   const char *who) {
    const accel__arch *a = accel__arch_find(c->model_type);
    if (a->blocks == ACCEL__BLOCKS_GPT2)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: context parallelism does not run %s models (learned "
                               "position embeddings)", who, a->model_type);
    if (a->dropouts && c->attn_pdrop > 0) /* the sharded attention has no dropout */
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: attention dropout (attention_dropout %g) under context "
                               "parallelism is not implemented", who, c->attn_pdrop);
    /* Ulysses gives each cp rank a group of this rank's heads */
    int64_t heads = c->num_attention_heads / tp;
    if (strategy == ACCEL_CP_ALLTOALL && heads % cp)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: the all-to-all strategy splits a rank's %lld query heads "
                               "(num_attention_heads %lld / tp %d) over cp %d ranks: not a multiple (use the "
                               "all-gather strategy, or a cp size dividing them)", who, (long long)heads,
                               (long long)c->num_attention_heads, tp, cp);
    return ACCEL_OK;
}

accel_status accel__llama_cp_dropout_check(const accel_llama_config *c, const char *who) {
    /* every cp rank's generators are seeded alike: its chunks would draw the other ranks' masks */
    if (!(c->resid_pdrop > 0 || c->embd_pdrop > 0)) return ACCEL_OK;
    return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: the embeddings' and branches' dropout while training "
                           "(resid_pdrop %g, embd_pdrop %g) is not implemented under context parallelism (each "
                           "rank's chunks would draw the same masks)", who, c->resid_pdrop, c->embd_pdrop);
}

accel_status accel_llama_context_parallelize(accel_module *llama, accel_pg *pg, accel_cp_strategy strategy) {
    static const char *FN = "accel_llama_context_parallelize";
    if (!llama) return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: model is NULL", FN);
    const accel_llama_config *c = accel_llama_config_of(llama);
    if (!c) return accel_propagate_error(accel_last_status(), "%s", FN);
    accel__decoder_root *root = llama->impl;
    if (!pg) {
        root->cp = (accel__decoder_cp){NULL, ACCEL_CP_ALLGATHER};
        return ACCEL_OK;
    }
    if (strategy != ACCEL_CP_ALLGATHER && strategy != ACCEL_CP_ALLTOALL)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: strategy %d is not ACCEL_CP_ALLGATHER or "
                               "ACCEL_CP_ALLTOALL", FN, (int)strategy);
    /* refused here rather than at the first forward; under tp the layers
     * already compute this rank's heads / tp */
    int tp = (int)(c->num_attention_heads / accel__decoder_rank_heads(llama));
    if (accel__llama_cp_check(c, tp, accel_pg_size(pg), strategy, FN)) return accel_last_status();
    root->cp = (accel__decoder_cp){pg, strategy};
    return ACCEL_OK;
}

accel_pg *accel_llama_cp_group(accel_module *llama, accel_cp_strategy *strategy) {
    const accel_llama_config *c = llama ? accel_llama_config_of(llama) : NULL;
    if (!c) {
        if (!llama) accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_llama_cp_group: model is NULL");
        return NULL;
    }
    const accel__decoder_cp *cp = accel__decoder_cp_of(c);
    if (strategy) *strategy = cp->strategy;
    return cp->pg;
}

static bool is_root(const accel_module *m) {
    const accel__arch *a = accel__arch_of_module(m);
    return a && m->ops == &a->causal_lm;
}

int accel__cp_own_plan(accel_module *m, accel_pg *pg, accel_cp_strategy strategy) {
    if (!is_root(m)) return 0;
    return accel_llama_context_parallelize(m, pg, strategy) == ACCEL_OK ? 1 : -1;
}

accel_pg *accel__cp_model_group(const accel_module *m) {
    return is_root(m) ? accel__decoder_cp_of(m->impl)->pg : NULL;
}

accel_status accel__decoder_cp_check(const accel_llama_config *c, bool training, const accel_kv_cache *cache,
                                     const accel_tensor *ids) {
    static const char *WHO = "accel_llama_forward on a context-parallel model";
    if (cache) return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: a KV cache (generation) is not sharded; "
                                      "accel_llama_context_parallelize(model, NULL, 0) first", WHO);
    if (training && accel__llama_cp_dropout_check(c, WHO)) return accel_last_status();
    if (ids->shape[1] % 2 != 0)
        return accel_set_error(ACCEL_ERR_SHAPE, "%s: ids hold %lld positions: a rank's two chunks (accel_cp_shard) "
                               "are an even number", WHO, (long long)ids->shape[1]);
    return ACCEL_OK;
}

int64_t accel__decoder_cp_seq_len(const accel__decoder_cp *cp, int64_t local_T) {
    return local_T * accel_pg_size(cp->pg);
}

accel_tensor *accel__decoder_cp_attention(const accel__decoder_cp *cp, accel_tensor *q, accel_tensor *k,
                                          accel_tensor *v, double scale, int64_t W, double cap, bool upcast) {
    return accel__cp_attention(cp->pg, q, k, v, cp->strategy, scale, W, cap, upcast);
}

accel_tensor *accel__decoder_cp_loss(accel_module *llama, const accel__decoder_cp *g, accel_tensor *ids) {
    int cp = accel_pg_size(g->pg);
    int64_t T = ids->shape[1];
    if (T % (2 * cp) != 0) {
        accel_set_error(ACCEL_ERR_SHAPE, "accel_llama_loss on a context-parallel model: ids hold T = %lld positions, "
                        "not a multiple of 2*cp = %d (cp %d ranks each hold 2 of 2*cp equal chunks)", (long long)T,
                        2 * cp, cp);
        return NULL;
    }
    accel_tensor *my_ids = accel_cp_shard(ids, cp, accel_pg_rank(g->pg));
    return my_ids ? accel__causal_lm_loss(llama, accel_llama_forward(llama, my_ids, NULL), ids) : NULL;
}

accel_tensor *accel__decoder_cp_labels_loss(const accel__decoder_cp *g, accel_tensor *logits, accel_tensor *labels,
                                            accel_pg *tp, int64_t vocab_start) {
    accel_tensor *mine = accel_cp_shard(labels, accel_pg_size(g->pg), accel_pg_rank(g->pg));
    return mine ? accel__cp_cross_entropy(g->pg, logits, mine, -100, tp, vocab_start) : NULL;
}
