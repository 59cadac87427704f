/* The decoder models (llama.c) under context parallelism (accel/cp.h): the
 * thread's cp group, what the models refuse under it, RoPE at the chunks'
 * global positions, and the loss over the sharded sequence. llama.c calls
 * these at three places (forward's checks, attention, the loss). */
#include "decoder_cp.h"
#include "nn_internal.h"

static _Thread_local accel_pg *tl_pg;
static _Thread_local accel_cp_strategy tl_strategy;

void accel_cp_set_group(accel_pg *pg, accel_cp_strategy strategy) {
    tl_pg = pg;
    tl_strategy = strategy;
}

accel_pg *accel_cp_group(accel_cp_strategy *strategy) {
    if (strategy) *strategy = tl_strategy;
    return tl_pg;
}

accel_status accel__decoder_cp_check(const accel_llama_config *c, const accel__arch *a, const accel_kv_cache *cache,
                                     const accel_tensor *ids) {
    static const char *WHO = "accel_llama_forward under context parallelism";
    if (cache) return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: a KV cache (generation) is not sharded; "
                                      "accel_cp_set_group(NULL, 0) first", WHO);
    if (a->blocks == ACCEL__BLOCKS_GPT2)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: GPT-2's learned position embeddings are not supported", WHO);
    if (c->sliding_window > 0)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: sliding_window %lld: the sharded attention is causal "
                               "over the whole sequence only", WHO, (long long)c->sliding_window);
    if (a->softcap && c->attn_logit_softcapping > 0)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: attention logit soft-capping (%g) is not supported", WHO,
                               c->attn_logit_softcapping);
    if (ids->shape[1] % 2 != 0)
        return accel_set_error(ACCEL_ERR_SHAPE, "%s: ids hold %lld positions: a rank's two chunks (accel_cp_shard) "
                               "are an even number", WHO, (long long)ids->shape[1]);
    return ACCEL_OK;
}

int64_t accel__decoder_cp_seq_len(int64_t local_T) { return local_T * accel_pg_size(tl_pg); }

accel_tensor *accel__decoder_cp_attention(accel_tensor *q, accel_tensor *k, accel_tensor *v, double scale) {
    return accel_cp_attention(tl_pg, q, k, v, tl_strategy, scale);
}

accel_tensor *accel__decoder_cp_loss(accel_module *llama, accel_tensor *ids) {
    int cp = accel_pg_size(tl_pg), rank = accel_pg_rank(tl_pg);
    int64_t B = ids->shape[0], T = ids->shape[1];
    /* the labels of the whole sequence (ids shifted left, -100 at the end), then my chunks of both */
    accel_tensor *pad = accel_empty_on(ACCEL_I64, ACCEL_SHAPE(B, 1), ids->device);
    if (!pad || accel_fill_(pad, -100) != ACCEL_OK) return NULL;
    accel_tensor *ids64 = ids->dtype == ACCEL_I64 ? ids : accel_to_dtype(ids, ACCEL_I64);
    accel_tensor *labels = ids64 ? accel_concat(2, (accel_tensor *[]){accel_slice(ids64, 1, 1, T, 1), pad}, 1) : NULL;
    accel_tensor *my_ids = labels ? accel_cp_shard(ids, cp, rank) : NULL;
    accel_tensor *my_labels = my_ids ? accel_cp_shard(labels, cp, rank) : NULL;
    accel_tensor *logits = my_labels ? accel_llama_forward(llama, my_ids, NULL) : NULL;
    return logits ? accel_cp_cross_entropy(tl_pg, logits, my_labels, -100) : NULL;
}
