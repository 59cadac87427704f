/* A transformer's parameters on one rank of a tp x pp mesh
 * (src/bigmodel/mesh_memory.h, `accel estimate-memory --tp_size --pp_size`):
 * the tiny Llama's bytes counted by hand, weight by weight, for tensor
 * parallelism (heads split, the key/value projections whole when there are
 * fewer key/value heads than tp), pipeline stages (the tied lm_head a copy on the last one;
 * the runtime's balanced split of the layers), both, and the refusals; GPT-2's
 * Conv1D weights under tensor parallelism. */
#include <string.h>

#include "accel/accel.h"
#include "bigmodel/mesh_memory.h"
#include "check.h"
#include "nn/decoder_pipeline.h"
#include "tiny_llama.h"

/* The tiny Llama (tiny_llama.h): hidden 16, 4 heads of 4, 2 kv heads,
 * ffn 24, 2 layers, vocab 40, tied; f32 (4 bytes). */
enum {
    LAYER = (16 * 16 + 2 * 8 * 16 + 16 * 16 + 3 * 24 * 16 + 2 * 16) * 4, /* q, k, v, o, gate/up/down, 2 norms */
    EMBED = 40 * 16 * 4,
    NORM = 16 * 4,
};

static accel__mesh_bytes mesh(accel_module *m, int tp, int pp) {
    accel_llama_config c = accel_llama_config_default();
    c.vocab_size = 40, c.hidden_size = 16, c.intermediate_size = 24, c.num_hidden_layers = 2;
    c.num_attention_heads = 4, c.num_key_value_heads = 2, c.tie_word_embeddings = true;
    accel__mesh_bytes b = {0};
    accel_status st = accel__mesh_param_bytes(m, &c, tp, pp, &b);
    CHECK_MSG(st == ACCEL_OK, "tp %d pp %d: %s", tp, pp, accel_last_error());
    return b;
}

static void test_tensor_parallel(void) {
    accel_module *m = tiny_llama(1);
    accel__mesh_bytes b = mesh(m, 1, 1);
    CHECK_MSG(b.param_bytes == 2 * LAYER + EMBED + NORM, "%lld", (long long)b.param_bytes); /* the tie counted once */
    CHECK(b.largest_unit == LAYER && b.stage == 0 && b.first_layer == 0 && b.n_layers == 2);
    /* tp 2: q 2 heads (8 rows), k and v 1 head (4 rows), o 8 of 16 inputs, gate/up 12 rows, down 12 inputs,
     * norms whole; the vocabulary 20 rows */
    int layer2 = (8 * 16 + 2 * 4 * 16 + 16 * 8 + 2 * 12 * 16 + 16 * 12 + 2 * 16) * 4;
    b = mesh(m, 2, 1);
    CHECK_MSG(b.param_bytes == 2 * layer2 + 20 * 16 * 4 + NORM, "%lld", (long long)b.param_bytes);
    CHECK(b.largest_unit == layer2);
    /* tp 4: 2 kv heads over 4 ranks: k_proj and v_proj whole on every rank (the plan's replicated rows) */
    int layer4 = (4 * 16 + 2 * 8 * 16 + 16 * 4 + 2 * 6 * 16 + 16 * 6 + 2 * 16) * 4;
    b = mesh(m, 4, 1);
    CHECK_MSG(b.param_bytes == 2 * layer4 + 10 * 16 * 4 + NORM, "%lld", (long long)b.param_bytes);
    /* tp 3: every split rounds up (heads 2, ffn 8, inputs of o 6, vocab 14); kv whole (2 < 3) */
    int layer3 = (8 * 16 + 2 * 8 * 16 + 16 * 6 + 2 * 8 * 16 + 16 * 8 + 2 * 16) * 4;
    b = mesh(m, 3, 1);
    CHECK_MSG(b.param_bytes == 2 * layer3 + 14 * 16 * 4 + NORM, "%lld", (long long)b.param_bytes);
    accel_module_free(m);
}

static void test_pipeline(void) {
    accel_module *m = tiny_llama(1);
    /* stage 0: layer 0 and the embedding; stage 1: layer 1, the norm and the tied lm_head's copy */
    accel__mesh_bytes b = mesh(m, 1, 2);
    CHECK_MSG(b.param_bytes == LAYER + NORM + EMBED, "%lld", (long long)b.param_bytes);
    CHECK(b.stage == 1 && b.first_layer == 1 && b.n_layers == 1 && b.largest_unit == LAYER);
    int layer2 = (8 * 16 + 2 * 4 * 16 + 16 * 8 + 2 * 12 * 16 + 16 * 12 + 2 * 16) * 4;
    b = mesh(m, 2, 2);
    CHECK_MSG(b.param_bytes == layer2 + NORM + 20 * 16 * 4, "%lld", (long long)b.param_bytes);
    accel_llama_config c = accel_llama_config_default();
    c.num_hidden_layers = 2;
    accel__mesh_bytes none;
    CHECK(accel__mesh_param_bytes(m, &c, 1, 3, &none) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "pp_size at most the 2 decoder layers");
    CHECK(accel__mesh_param_bytes(m, &c, 0, 1, &none) == ACCEL_ERR_INVALID_ARG);
    accel_module_free(m);
}

/* GPT-2 (tiny_family: hidden 16, 4 heads, ffn 24, 2 layers, vocab 40, 16 positions, tied), its Conv1D
 * weights [in, out] cut as the plan cuts them: c_attn and c_fc along their columns (c_attn per q | k | v
 * part), their biases too; attn.c_proj and mlp.c_proj along their rows, their biases whole; wte along the
 * vocabulary, wpe and the LayerNorms whole. Not cut into pipeline stages: refused as the runtime refuses it. */
static void test_gpt2(void) {
    accel_module *m = tiny_family(1, "gpt2");
    accel_llama_config c = *accel_llama_config_of(m);
    accel__mesh_bytes b;
    /* tp 2: c_attn [16, 24] + 24, attn.c_proj [8, 16] + 16, c_fc [16, 12] + 12, mlp.c_proj [12, 16] + 16,
     * two LayerNorms 2 x 32; wte 20 x 16, wpe 16 x 16, ln_f 32 */
    int layer2 = (16 * 24 + 24 + 8 * 16 + 16 + 16 * 12 + 12 + 12 * 16 + 16 + 2 * 32) * 4;
    CHECK_MSG(accel__mesh_param_bytes(m, &c, 2, 1, &b) == ACCEL_OK, "%s", accel_last_error());
    CHECK_MSG(b.param_bytes == 2 * layer2 + (20 * 16 + 16 * 16 + 32) * 4, "%lld", (long long)b.param_bytes);
    CHECK(b.largest_unit == layer2);
    CHECK(accel__mesh_param_bytes(m, &c, 1, 2, &b) == ACCEL_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(accel_last_error(), "GPT-2's tree is not cut yet");
    accel_module_free(m);
}

/* The stages' layers are the runtime's balanced split (accel__decoder_stage_split, which pipeline.c runs), not
 * an even one: with a vocabulary of 512 x 32 the tied embedding (16 K parameters) outweighs a layer (~10 K), so
 * of 4 layers stage 0 gets 1 and the last stage 3 (an even split: 2 and 2). */
static void test_runtime_split(void) {
    accel_llama_config c = accel_llama_config_default();
    c.vocab_size = 512, c.hidden_size = 32, c.intermediate_size = 64, c.num_hidden_layers = 4;
    c.num_attention_heads = 4, c.num_key_value_heads = 2, c.max_position_embeddings = 32, c.tie_word_embeddings = true;
    c.torch_dtype = ACCEL_F32;
    accel_module *m = accel_llama_new(&c, ACCEL_CPU_DEVICE);
    int first[3];
    CHECK(accel__decoder_stage_split(m, 2, NULL, first, "t") == ACCEL_OK && first[1] == 1);
    accel__mesh_bytes b;
    CHECK_MSG(accel__mesh_param_bytes(m, &c, 1, 2, &b) == ACCEL_OK, "%s", accel_last_error());
    CHECK_MSG(b.stage == 1 && b.first_layer == first[1] && b.n_layers == 4 - first[1],
              "stage %d holds layers [%d, %d)", b.stage, b.first_layer, b.first_layer + b.n_layers);
    int64_t layer = accel_module_num_params(accel_module_find(m, "model.layers.0"));
    CHECK_MSG(b.param_bytes == (3 * layer + 32 + 512 * 32) * 4, "%lld", (long long)b.param_bytes); /* + norm, copy */
    accel_module_free(m);
}

/* GPT-NeoX (tiny_family: hidden 16, 4 heads of 4 = kv heads, ffn 24, 2 layers, vocab 40, attention biases,
 * tied): query_key_value [48, 16] cut by its rows (per head: each rank its heads' q, k, v rows), its bias
 * too; dense and dense_4h_to_h along their inputs (biases whole), dense_h_to_4h along its rows, its bias
 * too; embed_in along the vocabulary, the LayerNorms whole; cut into pipeline stages as the runtime cuts it. */
static void test_gpt_neox(void) {
    accel_module *m = tiny_family(1, "gpt_neox");
    accel_llama_config c = *accel_llama_config_of(m);
    accel__mesh_bytes b;
    int layer2 = (24 * 16 + 24 + 16 * 8 + 16 + 12 * 16 + 12 + 16 * 12 + 16 + 2 * 32) * 4;
    CHECK_MSG(accel__mesh_param_bytes(m, &c, 2, 1, &b) == ACCEL_OK, "%s", accel_last_error());
    CHECK_MSG(b.param_bytes == 2 * layer2 + (20 * 16 + 32) * 4, "%lld", (long long)b.param_bytes);
    CHECK(b.largest_unit == layer2);
    /* pp 2: the split by parameters (its tied embedding on the first stage): a layer a stage, the last
     * with the final norm and the tied head's copy */
    CHECK_MSG(accel__mesh_param_bytes(m, &c, 1, 2, &b) == ACCEL_OK, "%s", accel_last_error());
    CHECK(b.n_layers == 1);
    accel_module_free(m);
}

int main(void) {
    RUN(test_tensor_parallel);
    RUN(test_pipeline);
    RUN(test_gpt2);
    RUN(test_gpt_neox);
    RUN(test_runtime_split);
    return check_summary();
}
