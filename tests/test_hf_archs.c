/* Each architecture and RoPE variant of the table (src/nn/arch.c) against
 * transformers, on tools/gen_hf_arch_fixtures.py's checkpoints
 * (tests/data/hf_arch_*): Llama with linear, dynamic, yarn, longrope and
 * llama3 RoPE scaling, Mistral (sliding window), Qwen2 (q/k/v biases; and
 * with its sliding window on the upper layer), Qwen3 (q/k norms), Gemma
 * (scaled embeddings, 1 + weight norms, gelu_pytorch_tanh, tied), Gemma2
 * (also sandwich norms, soft-capped scores and logits, query_pre_attn_scalar,
 * the window on layer 0), Gemma 3 (also per-head q/k norms of Gemma's kind,
 * the window and a plain RoPE of rope_local_base_freq on the sliding layers,
 * rope_theta on the full ones: by sliding_window_pattern, and by an
 * explicit layer_types list with linear scaling on the full layers and
 * soft-capped logits), Granite (its four multipliers), Phi-3 (fused
 * qkv_proj and gate_up_proj, longrope on half of each head, a window;
 * generation re-runs the sequence when it passes the longrope threshold, as
 * transformers' Phi3 does), OLMo 2 (norms on the attention and MLP outputs,
 * q/k norms over the whole projection), GPT-2 (learned positions, LayerNorm,
 * Conv1D; tied, and untied with unscaled attention and inputs up to
 * n_positions exactly, and one with room for 32 new tokens; and layer i's
 * scores also divided by i + 1 (scale_attn_by_inverse_layer_idx), on scaled
 * and on unscaled attention), Mixtral,
 * Qwen3-MoE and Qwen2-MoE (its shared expert, a dense layer by
 * mlp_only_layers, the load-balancing loss in the loss), Phi (attention and
 * MLP in parallel from one LayerNorm, biases on every projection and on
 * lm_head, half of each head rotated, grouped kv heads; and tied with its
 * own head bias, linear RoPE on 6 of 8 dims; and with qk_layernorm's per-head
 * LayerNorms of q and k), StableLM (sequential LayerNorm layers, q/k/v
 * biases, a quarter of each head rotated, grouped kv heads; and parallel
 * from one norm, tied, linear RoPE on half of each head; and both layouts
 * with qk_layernorm's LayerNorm of its own per head of q and k), Starcoder2
 * (biases everywhere, c_fc -> gelu_pytorch_tanh -> c_proj, a window, a tied
 * head; and without biases, untied). Inputs run past
 * every window and every scaling threshold. Logits within 1e-5, the loss
 * and every parameter's gradient of one step within 1e-5 relative (also
 * with gradient checkpointing on every decoder layer), greedy decoding of 32
 * tokens (KV cache; GPT-2's gpt2 and gpt2_untied 29 and 21, where their
 * learned positions end, gpt2_long 32) identical; loaded by
 * accel_llama_from_pretrained (its no-split class from the table) and by
 * name; the module type names and the decoder layer class are transformers';
 * save_pretrained writes a config.json (family, rope_scaling, windows) that
 * loads back to the same logits. GPT-2 also goes text to text through
 * examples/generate with tests/data/tokenizers/gpt2's tokenizer.json, refuses
 * positions past n_positions and config fields it does not implement.
 * StableLM's per-head q/k norms also run with two of them on disk by a
 * device map that names them. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "accel/bigmodel.h"
#include "gpt2_generate.h"
#include "nn/arch.h"
#include "nn_fixture.h"
#include "sibling_exe.h"

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
    {"gemma3", "Gemma3ForCausalLM", "Gemma3DecoderLayer"},
    {"gemma3_linear", "Gemma3ForCausalLM", "Gemma3DecoderLayer"},
    {"granite", "GraniteForCausalLM", "GraniteDecoderLayer"},
    {"phi3", "Phi3ForCausalLM", "Phi3DecoderLayer"},
    {"olmo2", "Olmo2ForCausalLM", "Olmo2DecoderLayer"},
    {"gpt2", "GPT2LMHeadModel", "GPT2Block"},
    {"gpt2_untied", "GPT2LMHeadModel", "GPT2Block"},
    {"gpt2_long", "GPT2LMHeadModel", "GPT2Block"},
    {"gpt2_layer_scale", "GPT2LMHeadModel", "GPT2Block"},
    {"gpt2_unscaled_layer_scale", "GPT2LMHeadModel", "GPT2Block"},
    {"mixtral", "MixtralForCausalLM", "MixtralDecoderLayer"},
    {"qwen3_moe", "Qwen3MoeForCausalLM", "Qwen3MoeDecoderLayer"},
    {"qwen3_moe_balance", "Qwen3MoeForCausalLM", "Qwen3MoeDecoderLayer"},
    {"qwen2_moe", "Qwen2MoeForCausalLM", "Qwen2MoeDecoderLayer"},
    {"qwen2_moe_nobias", "Qwen2MoeForCausalLM", "Qwen2MoeDecoderLayer"},
    {"phi", "PhiForCausalLM", "PhiDecoderLayer"},
    {"phi_linear", "PhiForCausalLM", "PhiDecoderLayer"},
    {"phi_qk", "PhiForCausalLM", "PhiDecoderLayer"},
    {"neox", "GPTNeoXForCausalLM", "GPTNeoXLayer"},
    {"neox_seq", "GPTNeoXForCausalLM", "GPTNeoXLayer"},
    {"stablelm", "StableLmForCausalLM", "StableLmDecoderLayer"},
    {"stablelm_par", "StableLmForCausalLM", "StableLmDecoderLayer"},
    {"stablelm_qk", "StableLmForCausalLM", "StableLmDecoderLayer"},
    {"stablelm_qk_par", "StableLmForCausalLM", "StableLmDecoderLayer"},
    {"starcoder2", "Starcoder2ForCausalLM", "Starcoder2DecoderLayer"},
    {"starcoder2_nobias", "Starcoder2ForCausalLM", "Starcoder2DecoderLayer"},
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
    for (int i = 0; i < sd->n; i++) /* a tied head is its embedding: loaded and checked under that name */
        CHECK_MSG(sd->entries[i].is_tied_alias ||
                      accel_safetensors_load_into(w, sd->entries[i].name, sd->entries[i].t) == ACCEL_OK,
                  "%s: %s", sd->entries[i].name, accel_last_error());
    CHECK(accel_module_set_gradient_checkpointing(m, checkpointing) == ACCEL_OK);
    accel_module_train(m, false); /* the fixture's step ran in transformers' eval(): GPT-2's dropout off */
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

static char g_tmp[512];

/* save_pretrained, then from_pretrained of what it wrote: the same logits. */
static void check_save_round_trip(accel_module *m, accel_safetensors *st, const char *name) {
    char out[600];
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
        bool gpt2 = !strcmp(FIXTURES[k].root_type, "GPT2LMHeadModel"); /* transformers' names of its tree */
        bool phi = !strcmp(FIXTURES[k].root_type, "PhiForCausalLM");
        bool neox = !strcmp(FIXTURES[k].root_type, "GPTNeoXForCausalLM");
        const char *norm = gpt2 ? "transformer.ln_f" : phi ? "model.final_layernorm"
                           : neox ? "gpt_neox.final_layer_norm" : "model.norm";
        const char *layer1 = gpt2 ? "transformer.h.1" : neox ? "gpt_neox.layers.1" : "model.layers.1";
        const char *cls = accel_module_decoder_layer_class(accel_module_find(m, norm));
        CHECK_MSG(cls && !strcmp(cls, FIXTURES[k].layer_type), "%s: layer class %s", name, cls ? cls : "NULL");
        accel_module *l1 = accel_module_find(m, layer1);
        CHECK_MSG(l1 && !strcmp(l1->ops->type_name, FIXTURES[k].layer_type), "%s: %s", name, layer1);
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

/* ACCEL_TEST_SAVE_DIR (an existing directory): save_pretrained's output is
 * kept there, one folder per fixture, for transformers to load
 * (tools/gen_hf_arch_fixtures.py --check-saved; ctest
 * hf_archs_saved_read_by_transformers_nosan). */
static void test_fixtures(void) {
    const char *keep = getenv("ACCEL_TEST_SAVE_DIR");
    snprintf(g_tmp, sizeof g_tmp, "%s", keep && *keep ? keep : "/tmp/accel_hf_archs_XXXXXX");
    CHECK(keep && *keep ? access(g_tmp, W_OK) == 0 : mkdtemp(g_tmp) != NULL);
    for (size_t k = 0; k < sizeof FIXTURES / sizeof *FIXTURES; k++) run_fixture((int)k);
    if (keep && *keep) return;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_tmp);
    CHECK(system(cmd) == 0);
}

/* examples/generate DIR --prompt on a Hub-style copy of the gpt2 fixture
 * (config.json, model.safetensors, tokenizer.json): the ids of transformers'
 * generate from the tokenizers' encoding of the same text. */
static void test_gpt2_text_to_text(void) {
    char want[512], out[8192];
    int rc = gpt2_generate("", "--prompt 'Hello world' --new-tokens 8", "generated_ids=[", want, sizeof want, out,
                           sizeof out);
    CHECK_MSG(rc == 0, "%s", out);
    CHECK_STR_CONTAINS(out, want);
    CHECK_STR_CONTAINS(out, "text=\"Hello world");
}

/* A checkpoint of GPT2Model (names without "transformer.", plus the old
 * attn.bias mask buffer, as the Hub's gpt2 has) loads into GPT2LMHeadModel
 * through the base model prefix: the fixture's logits. */
static void test_gpt2_body_checkpoint(void) {
    char dir[] = "/tmp/accel_gpt2_body_XXXXXX", path[160], cmd[256];
    CHECK(mkdtemp(dir) != NULL);
    accel_safetensors *w = accel_safetensors_open("data/hf_arch_gpt2/model.safetensors");
    accel_safetensors *st = open_expected("data/hf_arch_gpt2");
    CHECK(w && st);
    if (!w || !st) {
        accel_safetensors_close(w);
        accel_safetensors_close(st);
        return;
    }
    int n = accel_safetensors_count(w);
    const char *names[64];
    accel_tensor *ts[64];
    CHECK(n < 63);
    for (int i = 0; i < n && i < 63; i++) {
        const char *full = accel_safetensors_at(w, i)->name;
        CHECK(!strncmp(full, "transformer.", 12));
        names[i] = full + 12;
        ts[i] = accel_safetensors_tensor(w, full, -1);
    }
    names[n] = "h.0.attn.bias";
    ts[n] = accel_tensor_new(ACCEL_F32, 4, (int64_t[]){1, 1, 32, 32}, ACCEL_CPU_DEVICE);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK_MSG(accel_safetensors_save(path, n + 1, names, ts, 0, NULL) == ACCEL_OK, "%s", accel_last_error());
    for (int i = 0; i <= n; i++) accel_tensor_free(ts[i]);
    snprintf(cmd, sizeof cmd, "cp data/hf_arch_gpt2/config.json %s/", dir);
    CHECK(system(cmd) == 0);
    accel_dispatched *d = NULL;
    accel_module *m = accel_llama_from_pretrained(dir, NULL, NULL, NULL, NULL, &d);
    CHECK_MSG(m && d, "%s", accel_last_error());
    if (m) {
        accel_dispatch_stats ds;
        accel_dispatched_stats(d, &ds);
        CHECK(ds.n_unexpected == 0 && ds.n_missing == 0); /* the mask buffer, skipped as transformers skips it */
        check_logits(m, st, "gpt2 body checkpoint");
    }
    accel_dispatched_free(d);
    accel_module_free(m);
    accel_safetensors_close(w);
    accel_safetensors_close(st);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

/* Positions past n_positions, and the GPT-2 config fields accel does not
 * implement, are refused naming them; GPT-2's attention flags set on another
 * family, by the build and by config save alike. */
static void test_gpt2_refusals(void) {
    accel_llama_config c;
    CHECK(accel_llama_config_load("data/hf_arch_gpt2_untied", &c) == ACCEL_OK);
    CHECK(c.max_position_embeddings == 24 && c.intermediate_size == 48 && c.unscaled_attention);
    CHECK(c.rms_norm_eps == 1e-3 && c.attn_pdrop == 0.1 && !c.tie_word_embeddings);
    accel_module *m = accel_llama_new(&c, ACCEL_CPU_DEVICE);
    accel_kv_cache *kc = accel_kv_cache_new(&c, 1, 32, ACCEL_CPU_DEVICE);
    CHECK(m && kc);
    accel_tensor *ids = accel_zeros(ACCEL_I64, ACCEL_SHAPE(1, 20));
    CHECK(accel_llama_forward(m, ids, kc) != NULL); /* positions 0..19 */
    ids = accel_zeros(ACCEL_I64, ACCEL_SHAPE(1, 5));
    CHECK(accel_llama_forward(m, ids, kc) == NULL); /* 20..24: 24 is past */
    CHECK_STR_CONTAINS(accel_last_error(), "positions 20..24 run past n_positions (24)");
    /* 4 + 21 tokens fit (the last is never fed back); one more needs position 24 */
    int64_t prompt[4] = {1, 2, 3, 4}, out[32], n_out = 0;
    accel_generate_opts o = {.max_new_tokens = 21};
    CHECK(accel_generate(m, prompt, 4, &o, out, &n_out) == ACCEL_OK && n_out == 25);
    o.max_new_tokens = 22;
    CHECK(accel_generate(m, prompt, 4, &o, out, &n_out) != ACCEL_OK);
    CHECK_STR_CONTAINS(accel_last_error(), "past n_positions");
    accel_kv_cache_free(kc);
    accel_module_free(m);
    accel_step_reset();
    static const struct { const char *json, *needle; } BAD[] = {
        {"\"scale_attn_by_inverse_layer_idx\": 1", "'scale_attn_by_inverse_layer_idx' must be"},
        {"\"add_cross_attention\": true", "add_cross_attention true is not implemented"},
        {"\"activation_function\": \"relu\"", "activation_function must be \"gelu_new\""},
        {"\"attn_pdrop\": 1.5", "'attn_pdrop' must be a number in [0, 1]"},
        {"\"layer_norm_epsilon\": 0", "'layer_norm_epsilon' must be a number > 0"},
        {"\"n_positions\": 4611686018427387904", "n_positions x n_embd (32) position embeddings addressable"},
    };
    char path[] = "/tmp/accel_gpt2_cfg_XXXXXX.json";
    int fd = mkstemps(path, 5);
    CHECK(fd >= 0);
    if (fd >= 0) close(fd);
    /* GPT-2's attention flags on another family: refused by the build, and by config save with the same
     * words (the family's config.json has no key for them: it wrote them away), nothing written */
    static const char *const FLAG_SET[] = {
        "unscaled_attention (GPT-2's scale_attn_weights false) is set, but llama models always scale",
        "scale_attn_by_inverse_layer_idx (GPT-2's) is set, but llama models have no such setting",
        "reorder_and_upcast_attn (GPT-2's) is set, but llama models have no such setting",
    };
    for (int i = 0; i < 3; i++) {
        accel_llama_config l = accel_llama_config_default();
        l.unscaled_attention = i == 0, l.scale_attn_by_inverse_layer_idx = i == 1, l.reorder_and_upcast_attn = i == 2;
        char needle[200];
        CHECK(accel_llama_config_check(&l, "accel_llama_new") == ACCEL_ERR_UNSUPPORTED);
        snprintf(needle, sizeof needle, "accel_llama_new: %s", FLAG_SET[i]);
        CHECK_STR_CONTAINS(accel_last_error(), needle);
        CHECK(accel_llama_config_save(path, &l) == ACCEL_ERR_UNSUPPORTED);
        snprintf(needle, sizeof needle, "accel_llama_config_save: %s", FLAG_SET[i]);
        CHECK_STR_CONTAINS(accel_last_error(), needle);
        struct stat sb;
        CHECK(stat(path, &sb) == 0 && sb.st_size == 0);
    }
    for (size_t i = 0; i < sizeof BAD / sizeof *BAD; i++) {
        FILE *f = fopen(path, "w");
        CHECK(f != NULL);
        if (!f) break;
        fprintf(f, "{\"model_type\": \"gpt2\", \"n_embd\": 32, \"n_head\": 4, \"n_layer\": 1, %s}", BAD[i].json);
        fclose(f);
        CHECK(accel_llama_config_load(path, &c) != ACCEL_OK);
        CHECK_STR_CONTAINS(accel_last_error(), BAD[i].needle);
    }
    /* the layer scaling and the upcast attention written back as read */
    CHECK(accel_llama_config_load("data/hf_arch_gpt2_layer_scale", &c) == ACCEL_OK);
    CHECK(c.scale_attn_by_inverse_layer_idx && c.reorder_and_upcast_attn);
    CHECK(accel_llama_config_save(path, &c) == ACCEL_OK);
    accel_llama_config back = accel_llama_config_default();
    CHECK(accel_llama_config_load(path, &back) == ACCEL_OK);
    CHECK(back.scale_attn_by_inverse_layer_idx && back.reorder_and_upcast_attn);
    unlink(path);
    accel_clear_error();
}

/* A small Gemma config of the C API (one layer, hidden 24: sqrt(24) rounds
 * to 4.90625 in bf16, 4.898979 in f32). */
static accel_llama_config tiny_gemma(accel_dtype dt) {
    accel_llama_config c = accel_llama_config_default();
    snprintf(c.model_type, sizeof c.model_type, "gemma");
    c.vocab_size = 16, c.hidden_size = 24, c.intermediate_size = 32, c.num_hidden_layers = 1;
    c.num_attention_heads = 2, c.num_key_value_heads = 2, c.head_dim = 12, c.max_position_embeddings = 32;
    c.tie_word_embeddings = true, c.torch_dtype = dt;
    return c;
}

/* GemmaRMSNorm in bf16 is x.float() / rms * (1 + w.float()) rounded once:
 * with a weight of 0.0035 (1 + w is 1 in bf16) the output carries the 0.35%,
 * within half a bf16 ulp of the f32 value, unbiased. */
static void test_gemma_bf16_norm(void) {
    accel_llama_config c = tiny_gemma(ACCEL_BF16);
    accel_module *m = accel_llama_new(&c, ACCEL_CPU_DEVICE);
    accel_module *norm = m ? accel_module_find(m, "model.norm") : NULL;
    CHECK_MSG(norm != NULL, "%s", accel_last_error());
    if (!norm) {
        accel_module_free(m);
        return;
    }
    accel_tensor *w = accel_module_get_tensor(m, "model.norm.weight");
    CHECK(w && w->dtype == ACCEL_BF16 && accel_fill_(w, 0.0035) == ACCEL_OK);
    float wv[24], xv[4 * 24], yv[4 * 24];
    CHECK(accel_to_floats(w, wv) == ACCEL_OK);
    for (int i = 0; i < 4 * 24; i++) xv[i] = accel_bf16_to_f32(accel_f32_to_bf16((float)sin(0.37 * i + 0.1) * 3));
    accel_tensor *x = accel_to_dtype(accel_from_floats(2, (int64_t[]){4, 24}, xv), ACCEL_BF16);
    accel_tensor *y = accel_module_call(norm, x);
    CHECK_MSG(y && y->dtype == ACCEL_BF16 && accel_to_floats(y, yv) == ACCEL_OK, "%s", accel_last_error());
    double bias = 0, worst = 0;
    for (int r = 0; r < 4 && y; r++) {
        double ss = 0;
        for (int j = 0; j < 24; j++) ss += (double)xv[r * 24 + j] * xv[r * 24 + j];
        double rstd = 1 / sqrt(ss / 24 + c.rms_norm_eps);
        for (int j = 0; j < 24; j++) {
            double want = xv[r * 24 + j] * rstd * (1 + (double)wv[j]), rel = (yv[r * 24 + j] - want) / want;
            bias += rel / (4 * 24);
            worst = fmax(worst, fabs(rel));
        }
    }
    CHECK_MSG(fabs(bias) < 1e-3 && worst <= 1.0 / 256, "bias %g worst %g", bias, worst);
    accel_module_free(m);
    accel_step_reset();
}

/* Gemma scales the embeddings by sqrt(hidden) in the embedding weight's
 * dtype, not the config's: a bf16 config loaded as f32 gives the logits of
 * the f32 model. */
static void test_gemma_embed_scale_dtype(void) {
    accel_llama_config c = tiny_gemma(ACCEL_F32);
    accel_module *m = accel_llama_new(&c, ACCEL_CPU_DEVICE);
    char dir[] = "/tmp/accel_gemma_dt_XXXXXX", cmd[96];
    CHECK(m && mkdtemp(dir) != NULL);
    CHECK_MSG(accel_save_pretrained(m, dir, 0) == ACCEL_OK, "%s", accel_last_error());
    accel_llama_config b = c;
    b.torch_dtype = ACCEL_BF16; /* the config says bf16, the file holds f32 */
    CHECK(accel_llama_config_save(dir, &b) == ACCEL_OK);
    accel_load_opts o = {.has_dtype = true, .dtype = ACCEL_F32};
    accel_dispatched *d = NULL;
    accel_module *l = accel_llama_from_pretrained(dir, NULL, NULL, NULL, &o, &d);
    CHECK_MSG(l != NULL, "%s", accel_last_error());
    int64_t idv[6] = {1, 5, 2, 9, 15, 3};
    accel_tensor *ids = accel_from_data(ACCEL_I64, 2, (int64_t[]){1, 6}, idv);
    accel_tensor *want = accel_llama_forward(m, ids, NULL), *got = l ? accel_llama_forward(l, ids, NULL) : NULL;
    float wv[6 * 16], gv[6 * 16];
    CHECK(want && got && accel_to_floats(want, wv) == ACCEL_OK && accel_to_floats(got, gv) == ACCEL_OK);
    CHECK(got && !memcmp(wv, gv, sizeof wv));
    accel_dispatched_free(d);
    accel_module_free(l);
    accel_module_free(m);
    accel_step_reset();
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

static void test_layer_class_of_other_modules(void) {
    CHECK(accel_module_decoder_layer_class(NULL) == NULL);
    accel_module *lin = accel_linear_new(2, 2, false, ACCEL_CPU_DEVICE, ACCEL_F32);
    CHECK(accel_module_decoder_layer_class(lin) == NULL); /* not a model of the table */
    accel_module_free(lin);
}

/* Every row of the table has only flag combinations llama.c runs; each
 * combination it would get wrong is flagged on a copy of a real row. */
static void test_arch_rows_supported(void) {
    size_t n = 0;
    for (const accel__arch *a; (a = accel__arch_at(n)); n++)
        CHECK_MSG(!accel__arch_unsupported(a), "%s: %s", a->model_type, accel__arch_unsupported(a));
    CHECK(n == 18);
    accel__arch bad[8];
    for (int i = 0; i < 8; i++)
        bad[i] = *accel__arch_find(i < 2 ? "olmo2" : i < 3 ? "gemma" : i < 5 ? "phi3" : i < 6 ? "qwen3_moe" : "mixtral");
    bad[0].multipliers = true;
    bad[1].sandwich_norms = true;
    bad[2].fused_gate_up = true;
    bad[3].qk_norm = true;
    bad[4].qk_norm_full = true;
    bad[5].fused_gate_up = true;
    bad[6].gemma_blocks = true;
    bad[7].shared_expert = true;
    for (int i = 0; i < 8; i++) CHECK_MSG(accel__arch_unsupported(&bad[i]) != NULL, "combination %d", i);
    accel__arch q = *accel__arch_find("qwen3");
    q.qk_norm_full = true;
    CHECK(accel__arch_unsupported(&q) && strstr(accel__arch_unsupported(&q), "qk_norm_full"));
    accel__arch o = *accel__arch_find("olmo2");
    o.gemma_blocks = true;
    CHECK(accel__arch_unsupported(&o) && strstr(accel__arch_unsupported(&o), "qk_norm_full with gemma_blocks"));
    accel__arch l = *accel__arch_find("llama");
    l.experts_alias = true;
    CHECK(accel__arch_unsupported(&l) && strstr(accel__arch_unsupported(&l), "experts_alias"));
    /* qkv_only_bias places the config's attention_bias: a row must honour it, and have no always-biased q/k/v */
    accel__arch qb = *accel__arch_find("qwen2_moe");
    qb.attention_bias = false;
    CHECK(accel__arch_unsupported(&qb) && strstr(accel__arch_unsupported(&qb), "qkv_only_bias"));
    qb = *accel__arch_find("qwen2");
    qb.qkv_only_bias = qb.attention_bias = true;
    CHECK(accel__arch_unsupported(&qb) && strstr(accel__arch_unsupported(&qb), "qkv_only_bias"));
    /* parallel_residual's one norm; Phi's own projections, norms and MLP */
    accel__arch p = *accel__arch_find("phi");
    p.sandwich_norms = true;
    CHECK(accel__arch_unsupported(&p) && strstr(accel__arch_unsupported(&p), "parallel_residual"));
    p = *accel__arch_find("phi");
    p.fused_qkv = true;
    CHECK(accel__arch_unsupported(&p) && strstr(accel__arch_unsupported(&p), "phi_blocks"));
    /* GPT-NeoX's own tree: no other family's projections, and its parallel residual is the config's */
    for (int i = 0; i < 2; i++) {
        accel__arch x = *accel__arch_find("gpt_neox");
        if (i) x.parallel_residual = true;
        else x.fused_qkv = true;
        CHECK_MSG(accel__arch_unsupported(&x) && strstr(accel__arch_unsupported(&x), "neox_blocks"), "neox %d", i);
    }
    /* which MoE rows read the expert count under both names: transformers' attribute maps */
    CHECK(accel__arch_find("mixtral")->experts_alias && accel__arch_find("qwen3_moe")->experts_alias &&
          !accel__arch_find("qwen2_moe")->experts_alias);
}

/* The fixture `dir` loaded under the device map `map` (parsed from its
 * text): the tensor `on_disk` is on meta (on disk until a hook brings it
 * in), and transformers' logits and greedy tokens come out as fully loaded. */
static void check_offloaded(const char *dir, const char *map_text, const char *on_disk, const char *label) {
    char path[128];
    snprintf(path, sizeof path, "data/%s", dir);
    accel_safetensors *st = open_expected(path);
    accel_device_map *map = accel_device_map_parse(map_text);
    accel_dispatched *d = NULL;
    accel_module *m = map && st ? accel_llama_from_pretrained(path, map, NULL, NULL, NULL, &d) : NULL;
    CHECK_MSG(m != NULL, "%s: %s", label, accel_last_error());
    if (m) {
        accel_tensor *w = accel_module_get_tensor(m, on_disk);
        CHECK_MSG(w && w->device.type == ACCEL_DEV_META, "%s: %s is not on meta", label, on_disk);
        check_logits(m, st, label);
        check_greedy(m, st, label);
    }
    accel_dispatched_free(d);
    accel_module_free(m);
    accel_device_map_free(map);
    accel_safetensors_close(st);
}

/* Mixtral's experts offloaded: one expert of layer 0 and all of layer 1 on
 * disk (brought in by hooks only when a token chose them), the rest on the
 * cpu: transformers' logits and greedy tokens, as fully loaded. */
static void test_moe_offload(void) {
    check_offloaded("hf_arch_mixtral", "model.embed_tokens:cpu,model.layers.0.self_attn:cpu,"
                    "model.layers.0.block_sparse_moe.gate:cpu,"
                    "model.layers.0.block_sparse_moe.experts.1:disk,"
                    "model.layers.0.block_sparse_moe.experts:cpu,"
                    "model.layers.0.input_layernorm:cpu,"
                    "model.layers.0.post_attention_layernorm:cpu,"
                    "model.layers.1:disk,model.norm:cpu,lm_head:cpu",
                    "model.layers.0.block_sparse_moe.experts.1.w1.weight", "mixtral offloaded");
}

/* Loaded as bf16, the Mixtral fixture routes each of its 48 tokens as in
 * f32: its logits within 0.1 of transformers' f32 ones (measured 0.040),
 * where transformers' own bf16 forward routes one token to another expert
 * and moves that token's logits by 0.6 (docs/nn.md, "Mixtures of experts"). */
static void test_moe_bf16_routes_as_f32(void) {
    accel_safetensors *st = open_expected("data/hf_arch_mixtral");
    accel_load_opts b = {.has_dtype = true, .dtype = ACCEL_BF16};
    accel_dispatched *d = NULL;
    accel_module *m = st ? accel_llama_from_pretrained("data/hf_arch_mixtral", NULL, NULL, NULL, &b, &d) : NULL;
    accel_tensor *ids = m ? accel_safetensors_tensor(st, "ids", -1) : NULL;
    accel_tensor *y = ids ? accel_llama_forward(m, ids, NULL) : NULL;
    CHECK_MSG(y && y->dtype == ACCEL_BF16 && accel_numel(ids) == 48, "%s", accel_last_error());
    if (y) check_tensor_close(st, "logits", accel_to_dtype(y, ACCEL_F32), 0, 0.1);
    accel_tensor_free(ids);
    accel_dispatched_free(d);
    accel_module_free(m);
    accel_safetensors_close(st);
    accel_step_reset();
}

/* StableLM's per-head q/k norms with two of them on disk by a device map
 * that names them (norms.1 of q, norms.0 of k in layer 0): each norm's hook
 * brings its weight in around its own call, head by head; transformers'
 * logits and greedy tokens. */
static void test_stablelm_qk_norm_offload(void) {
    check_offloaded("hf_arch_stablelm_qk", "model.embed_tokens:cpu,model.layers.0:cpu,"
                    "model.layers.0.self_attn.q_layernorm.norms.1:disk,"
                    "model.layers.0.self_attn.k_layernorm.norms.0:disk,"
                    "model.layers.1:cpu,model.norm:cpu,lm_head:cpu",
                    "model.layers.0.self_attn.q_layernorm.norms.1.weight", "stablelm_qk offloaded norms");
}

/* Gemma 3 dispatched: layer 1 (its full_attention layer) on disk, layer 2
 * offloaded to host copies, the rest on the cpu: transformers' logits and
 * greedy tokens; loaded as bf16 (its norms' 1 + weight and the embedding
 * scale in bf16): logits within bf16's rounding of the f32 ones and the
 * cache's keys and values bf16; on meta (init_empty_weights): shapes only. */
static void test_gemma3_dispatch_bf16_meta(void) {
    accel_safetensors *st = open_expected("data/hf_arch_gemma3_linear");
    accel_device_map *map = accel_device_map_parse("model.embed_tokens:cpu,model.layers.0:cpu,model.layers.1:disk,"
                                                   "model.layers.2:cpu,model.norm:cpu,lm_head:cpu");
    accel_load_opts o = {.offload_cpu = true};
    accel_dispatched *d = NULL;
    accel_module *m = map && st ? accel_llama_from_pretrained("data/hf_arch_gemma3_linear", map, NULL, NULL, &o, &d)
                                : NULL;
    CHECK_MSG(m != NULL, "%s", accel_last_error());
    if (m) {
        accel_dispatch_stats ds;
        accel_dispatched_stats(d, &ds);
        CHECK_MSG(ds.n_offloaded_disk > 0 && ds.n_offloaded_cpu > 0, "disk %lld, cpu %lld",
                  (long long)ds.n_offloaded_disk, (long long)ds.n_offloaded_cpu);
        check_logits(m, st, "gemma3 dispatched");
        check_greedy(m, st, "gemma3 dispatched");
    }
    accel_dispatched_free(d);
    accel_module_free(m);
    accel_device_map_free(map);
    d = NULL;
    accel_load_opts b = {.has_dtype = true, .dtype = ACCEL_BF16};
    m = accel_llama_from_pretrained("data/hf_arch_gemma3_linear", NULL, NULL, NULL, &b, &d);
    accel_tensor *ids = m ? accel_safetensors_tensor(st, "ids", -1) : NULL;
    accel_tensor *y = ids ? accel_llama_forward(m, ids, NULL) : NULL;
    CHECK_MSG(y && y->dtype == ACCEL_BF16, "%s", accel_last_error());
    /* measured: at most 0.060 off (logits of up to 3, bf16 weights and activations through 3 layers) */
    if (y) check_tensor_close(st, "logits", accel_to_dtype(y, ACCEL_F32), 0, 0.1);
    accel_kv_cache *kc = m ? accel_llama_kv_cache_new(m, 1, 8, ACCEL_CPU_DEVICE) : NULL;
    CHECK(kc && accel_kv_cache_bytes(kc) == 2 * 3 * 2 * 8 * 8 * 2); /* K and V, 3 layers, 2 heads of 8, 8 positions */
    accel_kv_cache_free(kc);
    accel_tensor_free(ids);
    accel_dispatched_free(d);
    accel_module_free(m);
    accel_step_reset();
    accel_llama_config c;
    CHECK(accel_llama_config_load("data/hf_arch_gemma3_linear", &c) == ACCEL_OK);
    m = accel_llama_new(&c, ACCEL_META_DEVICE);
    ids = m ? accel_empty_on(ACCEL_I64, 2, (int64_t[]){2, 12}, ACCEL_META_DEVICE) : NULL;
    y = ids ? accel_llama_forward(m, ids, NULL) : NULL;
    CHECK_MSG(y && y->shape[1] == 12 && y->shape[2] == c.vocab_size && y->device.type == ACCEL_DEV_META, "%s",
              accel_last_error());
    accel_step_reset();
    accel_module_free(m);
    accel_safetensors_close(st);
    accel_clear_error();
}

/* A model of fixture `name`'s weights and config c, the parameters named
 * `zero` (a substring; NULL: none) zeroed, in train mode. */
static accel_module *dropout_model(const char *name, const accel_llama_config *c, const char *zero) {
    char path[160];
    snprintf(path, sizeof path, "data/hf_arch_%s/model.safetensors", name);
    accel_safetensors *w = accel_safetensors_open(path);
    accel_module *m = w ? accel_llama_new(c, ACCEL_CPU_DEVICE) : NULL;
    CHECK_MSG(m != NULL, "%s: %s", name, accel_last_error());
    accel_state_dict *sd = m ? accel_module_state_dict(m) : NULL;
    for (int i = 0; sd && i < sd->n; i++) {
        if (sd->entries[i].is_tied_alias) continue; /* a tied head: the embedding's */
        CHECK(accel_safetensors_load_into(w, sd->entries[i].name, sd->entries[i].t) == ACCEL_OK);
        if (zero && strstr(sd->entries[i].name, zero)) CHECK(accel_fill_(sd->entries[i].t, 0.0) == ACCEL_OK);
    }
    accel_state_dict_free(sd);
    accel_safetensors_close(w);
    if (m) accel_module_train(m, true);
    return m;
}

/* m's training loss on ids with seed 5, checked to be drawn again the same
 * by the same seed. */
static double dropout_loss(accel_module *m, accel_tensor *ids, const char *what) {
    double loss[2] = {NAN, NAN};
    for (int run = 0; run < 2 && m; run++) {
        accel_manual_seed(5);
        accel_tensor *l = accel_llama_loss(m, ids);
        CHECK_MSG(l != NULL, "%s", accel_last_error());
        loss[run] = l ? accel_item(l) : NAN;
        accel_step_reset();
    }
    CHECK_MSG(loss[0] == loss[1], "%s: the same seed gave losses %.9g and %.9g", what, loss[0], loss[1]);
    return loss[0];
}

/* Fixture name's dropouts act while training only: in train mode each of
 * resid_pdrop (both branches), embd_pdrop and attention_dropout changes the
 * loss from eval's (the fixture's), the same seed draws the same loss, and
 * with all three 0 the training loss is eval's bit for bit (Phi's
 * resid_pdrop, embd_pdrop, attention_dropout; Starcoder2's
 * residual_dropout, embedding_dropout, attention_dropout). */
static void check_dropouts(const char *name) {
    char dir[96];
    snprintf(dir, sizeof dir, "data/hf_arch_%s", name);
    accel_llama_config c;
    CHECK(accel_llama_config_load(dir, &c) == ACCEL_OK && c.resid_pdrop == 0.1);
    accel_safetensors *st = open_expected(dir);
    accel_tensor *ids = st ? accel_safetensors_tensor(st, "ids", -1) : NULL, *want = st ? accel_safetensors_tensor(st, "loss", -1) : NULL;
    double eval_loss = want ? accel_item(want) : NAN;
    for (int k = 0; k < 4 && ids; k++) { /* k: none, resid, embd, attention */
        accel_llama_config ck = c;
        ck.resid_pdrop = k == 1 ? 0.1 : 0, ck.embd_pdrop = k == 2 ? 0.1 : 0, ck.attn_pdrop = k == 3 ? 0.1 : 0;
        accel_module *m = dropout_model(name, &ck, NULL);
        char what[64];
        snprintf(what, sizeof what, "%s dropout %d", name, k);
        double loss = dropout_loss(m, ids, what);
        CHECK_MSG(k ? fabs(loss - eval_loss) > 1e-4 : fabs(loss - eval_loss) <= 1e-5 * fabs(eval_loss),
                  "%s: training loss %.9g, eval's %.9g", what, loss, eval_loss);
        accel_module_free(m);
    }
    accel_tensor_free(ids), accel_tensor_free(want);
    accel_safetensors_close(st);
}

static void test_phi_dropouts(void) { check_dropouts("phi"); }

static void test_starcoder2_dropouts(void) { check_dropouts("starcoder2"); }

/* StableLM's hidden_dropout (resid_pdrop) acts on the MLP's output only:
 * with every MLP's down_proj zeroed, a training loss under resid_pdrop 0.5
 * is the eval loss of those weights (a dropped attention output would
 * change it); with the fixture's weights it changes the loss, as
 * attention_dropout does; embd_pdrop (StableLM has no embedding dropout)
 * is refused. */
static void test_stablelm_dropouts(void) {
    accel_llama_config c;
    CHECK(accel_llama_config_load("data/hf_arch_stablelm", &c) == ACCEL_OK && c.resid_pdrop == 0.1 &&
          c.attn_pdrop == 0.1 && c.embd_pdrop == 0);
    accel_safetensors *st = open_expected("data/hf_arch_stablelm");
    accel_tensor *ids = st ? accel_safetensors_tensor(st, "ids", -1) : NULL;
    accel_tensor *want = st ? accel_safetensors_tensor(st, "loss", -1) : NULL;
    double eval_loss = want ? accel_item(want) : NAN;
    for (int k = 0; k < 3 && ids; k++) { /* k: MLP zeroed under resid 0.5, resid, attention */
        accel_llama_config ck = c;
        ck.resid_pdrop = k == 0 ? 0.5 : k == 1 ? 0.1 : 0, ck.attn_pdrop = k == 2 ? 0.1 : 0;
        accel_module *m = dropout_model("stablelm", &ck, k == 0 ? "mlp.down_proj" : NULL);
        char what[64];
        snprintf(what, sizeof what, "stablelm dropout %d", k);
        double loss = dropout_loss(m, ids, what);
        double base = eval_loss;
        if (k == 0 && m) { /* the same weights in eval mode */
            accel_module_train(m, false);
            accel_tensor *l = accel_llama_loss(m, ids);
            base = l ? accel_item(l) : NAN;
            accel_step_reset();
            CHECK_MSG(loss == base, "%s: training loss %.9g, eval's %.9g", what, loss, base);
        } else {
            CHECK_MSG(fabs(loss - base) > 1e-4, "%s: training loss %.9g, eval's %.9g", what, loss, base);
        }
        accel_module_free(m);
    }
    accel_llama_config e = c;
    e.embd_pdrop = 0.1;
    CHECK(accel_llama_config_check(&e, "t") == ACCEL_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(accel_last_error(), "t: stablelm models have no embedding dropout: embd_pdrop (0.1) must be 0");
    accel_tensor_free(ids), accel_tensor_free(want);
    accel_safetensors_close(st);
}

/* Mixtral's router_jitter_noise: none in eval (the fixture's logits), the
 * MoE input scaled by U(1 - j, 1 + j) while training (another loss, the
 * same for the same seed), redrawn as it was when a checkpointed layer
 * recomputes (the same gradients as without checkpointing). */
static void test_moe_jitter(void) {
    accel_llama_config c;
    CHECK(accel_llama_config_load("data/hf_arch_mixtral", &c) == ACCEL_OK);
    c.router_jitter_noise = 0.2;
    c.output_router_logits = false;
    accel_safetensors *st = open_expected("data/hf_arch_mixtral");
    accel_safetensors *w = accel_safetensors_open("data/hf_arch_mixtral/model.safetensors");
    accel_module *m = accel_llama_new(&c, ACCEL_CPU_DEVICE);
    CHECK_MSG(m && st && w, "%s", accel_last_error());
    if (!m || !st || !w) goto out;
    accel_state_dict *sd = accel_module_state_dict(m);
    for (int i = 0; i < sd->n; i++) CHECK(accel_safetensors_load_into(w, sd->entries[i].name, sd->entries[i].t) == ACCEL_OK);
    accel_module_train(m, false);
    check_logits(m, st, "mixtral jitter, eval");
    accel_module_train(m, true);
    accel_tensor *ids = accel_safetensors_tensor(st, "ids", -1);
    double loss[3];
    float *grads[2] = {NULL, NULL};
    accel_tensor *g0 = accel_module_get_tensor(m, "model.layers.0.block_sparse_moe.gate.weight");
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_SGD, 0.1);
    accel_optimizer *o = accel_optimizer_new_module(ACCEL_OPTIM_SGD, m, &h); /* for its zero_grad */
    for (int run = 0; run < 3; run++) {
        CHECK(accel_module_set_gradient_checkpointing(m, run == 2) == ACCEL_OK);
        accel_manual_seed(run == 1 ? 8 : 7);
        accel_tensor *l = accel_llama_loss(m, ids);
        CHECK_MSG(l && accel_backward(l) == ACCEL_OK, "%s", accel_last_error());
        loss[run] = l ? accel_item(l) : NAN;
        if (run != 1 && g0->grad) {
            grads[run / 2] = malloc((size_t)accel_numel(g0) * sizeof(float));
            accel_tensor_to_host(g0->grad, grads[run / 2]);
        }
        accel_optimizer_zero_grad(o);
        accel_step_reset();
    }
    accel_optimizer_free(o);
    accel_tensor *want = accel_safetensors_tensor(st, "loss", -1);
    double eval_loss = want ? accel_item(want) : NAN;
    /* the fixture's loss has the balancing term: the jittered losses differ from it and from each other by far more */
    CHECK_MSG(fabs(loss[0] - loss[1]) > 1e-4 && fabs(loss[0] - eval_loss) > 1e-4, "jitter: losses %g %g, eval %g",
              loss[0], loss[1], eval_loss);
    CHECK_MSG(loss[0] == loss[2], "jitter: checkpointed loss %.9g, plain %.9g", loss[2], loss[0]);
    bool same = grads[0] && grads[1];
    for (int64_t i = 0; same && i < accel_numel(g0); i++) same = grads[0][i] == grads[1][i];
    CHECK_MSG(same, "jitter: the router's gradient differs under checkpointing");
    free(grads[0]);
    free(grads[1]);
    accel_tensor_free(want);
    accel_tensor_free(ids);
    accel_state_dict_free(sd);
out:
    accel_module_free(m);
    accel_safetensors_close(w);
    accel_safetensors_close(st);
    accel_clear_error();
}

/* On the meta device (init_empty_weights) a sparse block runs for shapes:
 * [B, T, C] through a balanced routing, no probabilities read. */
static void test_moe_meta(void) {
    accel_llama_config c;
    CHECK(accel_llama_config_load("data/hf_arch_qwen3_moe", &c) == ACCEL_OK);
    accel_module *m = accel_llama_new(&c, ACCEL_META_DEVICE);
    accel_tensor *ids = m ? accel_empty_on(ACCEL_I64, 2, (int64_t[]){2, 5}, ACCEL_META_DEVICE) : NULL;
    accel_tensor *y = ids ? accel_llama_forward(m, ids, NULL) : NULL;
    CHECK_MSG(y && y->ndim == 3 && y->shape[0] == 2 && y->shape[1] == 5 && y->shape[2] == c.vocab_size &&
                  y->device.type == ACCEL_DEV_META, "%s", accel_last_error());
    accel_step_reset();
    accel_module_free(m);
}

/* Mixtral's fixture model with router_jitter_noise j, training (the jitter
 * drawn), the module at `ckpt` checkpointed ("": none; "layers": every
 * decoder layer): the balancing loss's value and every gradient after its
 * backward, seeded alike, copied to *grads (n_grads floats, malloc'd). */
static float balance_step(double jitter, const char *ckpt, float **grads, int64_t *n_grads) {
    accel_llama_config c;
    CHECK_MSG(accel_llama_config_load("data/hf_arch_mixtral", &c) == ACCEL_OK, "%s", accel_last_error());
    c.router_jitter_noise = jitter;
    accel_module *m = accel_llama_new(&c, ACCEL_CPU_DEVICE);
    accel_safetensors *w = accel_safetensors_open("data/hf_arch_mixtral/model.safetensors");
    accel_safetensors *st = open_expected("data/hf_arch_mixtral");
    accel_tensor *ids = st ? accel_safetensors_tensor(st, "ids", -1) : NULL;
    accel_state_dict *sd = m ? accel_module_state_dict(m) : NULL;
    float value = NAN;
    *grads = NULL, *n_grads = 0;
    CHECK_MSG(sd && w && ids, "%s", accel_last_error());
    for (int i = 0; sd && w && i < sd->n; i++)
        CHECK(sd->entries[i].is_tied_alias || accel_safetensors_load_into(w, sd->entries[i].name, sd->entries[i].t) ==
                                                  ACCEL_OK);
    if (sd && ids) {
        if (!strcmp(ckpt, "layers")) CHECK(accel_module_set_gradient_checkpointing(m, true) == ACCEL_OK);
        else if (*ckpt) CHECK(accel_module_set_gradient_checkpointing(accel_module_find(m, ckpt), true) == ACCEL_OK);
        accel_module_train(m, true);
        accel_manual_seed(7);
        accel_tensor *loss = accel_llama_loss(m, ids);
        CHECK_MSG(loss && accel_backward(loss) == ACCEL_OK, "%s: %s", ckpt, accel_last_error());
        if (loss) CHECK(accel_tensor_to_host(loss, &value) == ACCEL_OK);
        for (int i = 0; i < sd->n; i++) *n_grads += accel_numel(sd->entries[i].t);
        *grads = calloc((size_t)*n_grads, sizeof **grads);
        for (int64_t i = 0, at = 0; *grads && i < sd->n; at += accel_numel(sd->entries[i].t), i++) {
            accel_tensor *g = sd->entries[i].t->grad;
            CHECK_MSG(g != NULL, "%s: no gradient for %s", ckpt, sd->entries[i].name);
            if (g) CHECK(accel_tensor_to_host(g, *grads + at) == ACCEL_OK);
        }
    }
    accel_step_reset();
    accel_state_dict_free(sd);
    accel_tensor_free(ids);
    accel_safetensors_close(st);
    accel_safetensors_close(w);
    accel_module_free(m);
    return value;
}

/* The balancing loss with a checkpointed module that holds a sparse block
 * (the block itself, a decoder layer, an expert; FSDP's activation
 * checkpointing of a unit is the same): the recompute hands the routers
 * their share of the balancing loss's gradient, so loss and gradients are
 * bit for bit the run's without checkpointing, router jitter included (the
 * fixture's values without jitter are checked by check_training_step). */
static void test_moe_balance_checkpointed_block(void) {
    static const char *const CKPT[] = {"model.layers.1.block_sparse_moe", "layers",
                                       "model.layers.0.block_sparse_moe.experts.1"};
    for (int j = 0; j < 2; j++) {
        float *ref = NULL;
        int64_t n = 0;
        float lref = balance_step(j ? 0.3 : 0, "", &ref, &n);
        for (size_t k = 0; ref && k < sizeof CKPT / sizeof *CKPT; k++) {
            float *g = NULL;
            int64_t ng = 0;
            float l = balance_step(j ? 0.3 : 0, CKPT[k], &g, &ng);
            CHECK_MSG(l == lref, "%s, jitter %d: loss %.9g, without checkpointing %.9g", CKPT[k], j, l, lref);
            CHECK_MSG(g && ng == n && !memcmp(g, ref, (size_t)n * sizeof *g), "%s, jitter %d: gradients differ", CKPT[k],
                      j);
            free(g);
        }
        free(ref);
    }
}

/* Qwen2-MoE's sparse block in bf16 (config and weights rounded, as the
 * fixture's copy): router, experts, the shared expert, its sigmoid gate, the
 * product and the sum, bit for bit transformers' on 48 tokens. */
static void test_qwen2_moe_bf16_block(void) {
    accel_llama_config c;
    CHECK(accel_llama_config_load("data/hf_arch_qwen2_moe", &c) == ACCEL_OK);
    c.torch_dtype = ACCEL_BF16;
    accel_module *m = accel_llama_new(&c, ACCEL_CPU_DEVICE);
    accel_safetensors *w = accel_safetensors_open("data/hf_arch_qwen2_moe/model.safetensors");
    accel_safetensors *st = open_expected("data/hf_arch_qwen2_moe");
    accel_module *block = m ? accel_module_find(m, "model.layers.0.mlp") : NULL;
    accel_tensor *x = st ? accel_safetensors_tensor(st, "block.x", -1) : NULL;
    CHECK_MSG(block && w && x && x->dtype == ACCEL_BF16, "%s", accel_last_error());
    if (block && w && x) {
        accel_state_dict *sd = accel_module_state_dict(block);
        for (int i = 0; i < sd->n; i++) {
            char name[160];
            snprintf(name, sizeof name, "model.layers.0.mlp.%s", sd->entries[i].name);
            CHECK_MSG(accel_safetensors_load_into(w, name, sd->entries[i].t) == ACCEL_OK, "%s", accel_last_error());
        }
        accel_state_dict_free(sd);
        bool prev = accel_set_grad_enabled(false);
        accel_tensor *y = accel_module_call(block, x); /* [48, C] */
        CHECK_MSG(y && y->dtype == ACCEL_BF16, "%s", accel_last_error());
        check_tensor_close(st, "block.y", y, 0, 0);
        accel_set_grad_enabled(prev);
        accel_step_reset();
    }
    accel_tensor_free(x);
    accel_safetensors_close(st);
    accel_safetensors_close(w);
    accel_module_free(m);
}

int main(void) {
    RUN(test_fixtures);
    RUN(test_gpt2_text_to_text);
    RUN(test_gpt2_refusals);
    RUN(test_gpt2_body_checkpoint);
    RUN(test_layer_class_of_other_modules);
    RUN(test_gemma_bf16_norm);
    RUN(test_gemma_embed_scale_dtype);
    RUN(test_arch_rows_supported);
    RUN(test_gemma3_dispatch_bf16_meta);
    RUN(test_moe_offload);
    RUN(test_moe_bf16_routes_as_f32);
    RUN(test_moe_jitter);
    RUN(test_moe_meta);
    RUN(test_moe_balance_checkpointed_block);
    RUN(test_qwen2_moe_bf16_block);
    RUN(test_phi_dropouts);
    RUN(test_stablelm_dropouts);
    RUN(test_stablelm_qk_norm_offload);
    RUN(test_starcoder2_dropouts);
    return check_summary();
}
