/* The tiny Llama the ZeRO-3 tests train: two layers, grouped-query attention
 * (4 heads, 2 key/value heads), vocab 40, hidden 16, ffn 24, 16 positions,
 * tied embeddings (an alias in its state dict: embedding and head share a
 * wrap unit). Seeded, on the CPU, f32. The caller owns the module. */
#ifndef ACCEL_TESTS_TINY_LLAMA_H
#define ACCEL_TESTS_TINY_LLAMA_H

#include "accel/accel.h"

static inline accel_module *tiny_llama(uint64_t seed) {
    accel_manual_seed(seed);
    accel_llama_config c = accel_llama_config_default();
    c.vocab_size = 40;
    c.hidden_size = 16;
    c.intermediate_size = 24;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.max_position_embeddings = 16;
    c.tie_word_embeddings = true;
    c.torch_dtype = ACCEL_F32;
    return accel_llama_new(&c, ACCEL_CPU_DEVICE);
}

#endif
