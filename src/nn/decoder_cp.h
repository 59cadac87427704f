/* The decoder models' hooks for context parallelism (decoder_cp.c), called
 * by llama.c while accel_cp_group() is set (accel/cp.h). */
#ifndef ACCEL_NN_DECODER_CP_H
#define ACCEL_NN_DECODER_CP_H

#include "accel/cp.h"
#include "accel/nn.h"
#include "arch.h"

/* ACCEL_OK when the model of config c and row a can run sharded on ids
 * [B, 2c]; else the refusal naming what cannot (a cache, sliding windows,
 * soft-capping, GPT-2). */
accel_status accel__decoder_cp_check(const accel_llama_config *c, const accel__arch *a, const accel_kv_cache *cache,
                                     const accel_tensor *ids);
/* The whole sequence's length when this rank holds local_T positions. */
int64_t accel__decoder_cp_seq_len(int64_t local_T);
/* accel_cp_attention over the thread's group with its strategy. */
accel_tensor *accel__decoder_cp_attention(accel_tensor *q, accel_tensor *k, accel_tensor *v, double scale);
/* accel_llama_loss of the whole batch ids [B, T]: this rank's chunks of ids
 * and labels, the unsharded mean loss. */
accel_tensor *accel__decoder_cp_loss(accel_module *llama, accel_tensor *ids);

#endif
