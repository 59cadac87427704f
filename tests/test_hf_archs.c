/* Each architecture and RoPE variant of the table (src/nn/arch.c) against
 * transformers, on tools/gen_hf_arch_fixtures.py's checkpoints
 * (tests/data/hf_arch_*): Llama with linear, dynamic, yarn, longrope and
 * llama3 RoPE scaling, Mistral (sliding window), Qwen2 (q/k/v biases; and
 * with its sliding window on the upper layer), Qwen3 (q/k norms), Gemma
 * (scaled embeddings, 1 + weight norms, gelu_pytorch_tanh, tied), Gemma2
 * (also sandwich norms, soft-capped scores and logits, query_pre_attn_scalar,
 * the window on layer 0), Granite (its four multipliers), Phi-3 (fused
 * qkv_proj and gate_up_proj, longrope on half of each head, a window;
 * generation re-runs the sequence when it passes the longrope threshold, as
 * transformers' Phi3 does), OLMo 2 (norms on the attention and MLP outputs,
 * q/k norms over the whole projection). Inputs run past
 * every window and every scaling threshold. Logits within 1e-5, the loss
 * and every parameter's gradient of one step within 1e-5 relative (also
 * with gradient checkpointing on every decoder layer), greedy decoding of 16
 * tokens (32 for Gemma, Gemma2, Granite; KV cache) identical; loaded by
 * accel_llama_from_pretrained (its no-split class from the table) and by
 * name; the module type names and the decoder layer class are transformers';
 * save_pretrained writes a config.json (family, rope_scaling, windows) that
 * loads back to the same logits. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "accel/bigmodel.h"
#include "nn_fixture.h"

static const struct {
    const char *name, *root_type, *layer_type;
} FIXTURES[] = {
    {"llama_linear", "LlamaForCausalLM", "LlamaDecoderLayer"},
    {"llama_dynamic", "LlamaForCausalLM", "LlamaDecoderLayer"},
    {"llama_yarn", "LlamaForCausalLM", "LlamaDecoderLayer"},
    {"llama_longrope", "LlamaForCausalLM", "LlamaDecoderLayer"},
    {"llama_llama3", "LlamaForCausalLM", "LlamaDecoderLayer"},
    {"mistral", "MistralForCausalLM", "MistralDecoderLayer"},
    {"qwen2", "Qwen2ForCausalLM", "Qwen2DecoderLayer"},
    {"qwen2_window", "Qwen2ForCausalLM", "Qwen2DecoderLayer"},
    {"qwen3", "Qwen3ForCausalLM", "Qwen3DecoderLayer"},
    {"gemma", "GemmaForCausalLM", "GemmaDecoderLayer"},
    {"gemma2", "Gemma2ForCausalLM", "Gemma2DecoderLayer"},
    {"granite", "GraniteForCausalLM", "GraniteDecoderLayer"},
    {"phi3", "Phi3ForCausalLM", "Phi3DecoderLayer"},
    {"olmo2", "Olmo2ForCausalLM", "Olmo2DecoderLayer"},
};

static accel_safetensors *open_expected(const char *dir) {
    char path[320];
    snprintf(path, sizeof path, "%s/expected.safetensors", dir);
    accel_safetensors *st = accel_safetensors_open(path);
    CHECK_MSG(st != NULL, "%s: %s", path, accel_last_error());
    return st;
}

static void check_greedy(accel_module *m, accel_safetensors *st, const char *name) {
    accel_tensor *p = accel_safetensors_tensor(st, "prompt", -1), *g = accel_safetensors_tensor(st, "greedy", -1);
    CHECK(p && g);
    if (!p || !g) return;
    int64_t np = p->shape[1], ng = g->shape[1], prompt[8], want[48], got[48], n_out = 0;
    bool fits = np <= 8 && ng <= 48;
    CHECK_MSG(fits, "%s: a prompt of %lld and %lld greedy tokens: over the test's buffers", name, (long long)np,
              (long long)ng);
    if (fits) {
        accel_to_int64s(p, prompt);
        accel_to_int64s(g, want);
        accel_generate_opts o = {.max_new_tokens = ng - np};
        CHECK_MSG(accel_generate(m, prompt, np, &o, got, &n_out) == ACCEL_OK, "%s: %s", name, accel_last_error());
        bool same = n_out == ng;
        for (int64_t i = 0; same && i < ng; i++) same = got[i] == want[i];
        CHECK_MSG(same, "%s: greedy tokens differ from transformers", name);
    }
    accel_tensor_free(p);
    accel_tensor_free(g);
}

static void check_logits(accel_module *m, accel_safetensors *st, const char *name) {
    accel_tensor *ids = accel_safetensors_tensor(st, "ids", -1);
    accel_tensor *y = ids ? accel_llama_forward(m, ids, NULL) : NULL;
    CHECK_MSG(y != NULL, "%s: %s", name, accel_last_error());
    if (y) check_tensor_close(st, "logits", y, 0, 1e-5);
    accel_tensor_free(ids);
    accel_step_reset();
}

/* Built from config.json, weights loaded by name: the loss and its gradients,
 * plain and with gradient checkpointing on every decoder layer. */
static void check_training_step(const char *dir, accel_safetensors *st, const char *name, bool checkpointing) {
    accel_llama_config c;
    CHECK_MSG(accel_llama_config_load(dir, &c) == ACCEL_OK, "%s", accel_last_error());
    accel_module *m = accel_llama_new(&c, ACCEL_CPU_DEVICE);
    char path[320];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    accel_safetensors *w = accel_safetensors_open(path);
    CHECK_MSG(m && w, "%s: %s", name, accel_last_error());
    if (!m || !w) {
        accel_module_free(m);
        accel_safetensors_close(w);
        return;
    }
    accel_state_dict *sd = accel_module_state_dict(m);
    for (int i = 0; i < sd->n; i++) /* a tied head is embed_tokens (not in the files) */
        CHECK_MSG(sd->entries[i].is_tied_alias ||
                      accel_safetensors_load_into(w, sd->entries[i].name, sd->entries[i].t) == ACCEL_OK, "%s: %s",
                  sd->entries[i].name, accel_last_error());
    CHECK(accel_module_set_gradient_checkpointing(m, checkpointing) == ACCEL_OK);
    accel_tensor *ids = accel_safetensors_tensor(st, "ids", -1);
    accel_tensor *loss = accel_llama_loss(m, ids);
    CHECK_MSG(loss != NULL, "%s: %s", name, accel_last_error());
    if (loss) {
        check_tensor_close(st, "loss", loss, 1e-5, 0);
        CHECK_MSG(accel_backward(loss) == ACCEL_OK, "%s", accel_last_error());
        for (int i = 0; i < sd->n; i++) {
            if (sd->entries[i].is_tied_alias) continue;
            char g[200];
            snprintf(g, sizeof g, "g.%s", sd->entries[i].name);
            check_tensor_close(st, g, sd->entries[i].t->grad, 1e-5, 1e-6);
        }
    }
    accel_state_dict_free(sd);
    accel_tensor_free(ids);
    accel_step_reset();
    accel_safetensors_close(w);
    accel_module_free(m);
}

static char g_tmp[64];

/* save_pretrained, then from_pretrained of what it wrote: the same logits. */
static void check_save_round_trip(accel_module *m, accel_safetensors *st, const char *name) {
    char out[160];
    snprintf(out, sizeof out, "%s/%s", g_tmp, name);
    CHECK_MSG(accel_save_pretrained(m, out, 0) == ACCEL_OK, "%s: %s", name, accel_last_error());
    accel_dispatched *d = NULL;
    accel_module *back = accel_llama_from_pretrained(out, NULL, NULL, NULL, NULL, &d);
    CHECK_MSG(back != NULL, "%s: %s", name, accel_last_error());
    if (back) {
        CHECK(!strcmp(back->ops->type_name, m->ops->type_name));
        check_logits(back, st, name);
    }
    accel_dispatched_free(d);
    accel_module_free(back);
}

static void run_fixture(int k) {
    const char *name = FIXTURES[k].name;
    char dir[256];
    snprintf(dir, sizeof dir, "data/hf_arch_%s", name);
    accel_safetensors *st = open_expected(dir);
    if (!st) return;
    accel_dispatched *d = NULL;
    accel_module *m = accel_llama_from_pretrained(dir, NULL, NULL, NULL, NULL, &d);
    CHECK_MSG(m && d, "%s: %s", dir, accel_last_error());
    if (m) {
        CHECK_MSG(!strcmp(m->ops->type_name, FIXTURES[k].root_type), "%s: root is %s", name, m->ops->type_name);
        const char *cls = accel_module_decoder_layer_class(accel_module_find(m, "model.norm"));
        CHECK_MSG(cls && !strcmp(cls, FIXTURES[k].layer_type), "%s: layer class %s", name, cls ? cls : "NULL");
        CHECK(!strcmp(accel_module_find(m, "model.layers.1")->ops->type_name, FIXTURES[k].layer_type));
        check_logits(m, st, name);
        check_greedy(m, st, name);
        check_save_round_trip(m, st, name);
    }
    accel_dispatched_free(d);
    accel_module_free(m);
    check_training_step(dir, st, name, false);
    check_training_step(dir, st, name, true);
    accel_safetensors_close(st);
    accel_clear_error();
}

static void test_fixtures(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/accel_hf_archs_XXXXXX");
    CHECK(mkdtemp(g_tmp) != NULL);
    for (size_t k = 0; k < sizeof FIXTURES / sizeof *FIXTURES; k++) run_fixture((int)k);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_tmp);
    CHECK(system(cmd) == 0);
}

static void test_layer_class_of_other_modules(void) {
    CHECK(accel_module_decoder_layer_class(NULL) == NULL);
    accel_module *lin = accel_linear_new(2, 2, false, ACCEL_CPU_DEVICE, ACCEL_F32);
    CHECK(accel_module_decoder_layer_class(lin) == NULL); /* not a model of the table */
    accel_module_free(lin);
}

int main(void) {
    RUN(test_fixtures);
    RUN(test_layer_class_of_other_modules);
    return check_summary();
}
