/* config.json for Llama: defaults, transformers 4.x and 5.x layouts, errors, save. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "accel/bigmodel.h"
#include "accel/io.h"
#include "check.h"
#include "nn/arch.h"

static char g_dir[64];

static const char *write_cfg(const char *name, const char *text) {
    static char path[256];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
    return path;
}

static void test_defaults(void) {
    accel_llama_config c;
    CHECK(accel_llama_config_load(write_cfg("empty.json", "{}"), &c) == ACCEL_OK);
    CHECK(c.vocab_size == 32000 && c.hidden_size == 4096 && c.intermediate_size == 11008);
    CHECK(c.num_hidden_layers == 32 && c.num_attention_heads == 32 && c.num_key_value_heads == 32);
    CHECK(c.max_position_embeddings == 2048 && c.rms_norm_eps == 1e-6 && c.rope_theta == 10000.0);
    CHECK(!c.tie_word_embeddings && c.initializer_range == 0.02 && c.torch_dtype == ACCEL_F32 && c.head_dim == 0);
}

static void test_layouts(void) {
    accel_llama_config c;
    /* transformers 4.x */
    CHECK(accel_llama_config_load(write_cfg("v4.json",
                                            "{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_attention_heads\": 4,"
                                            " \"num_key_value_heads\": 2, \"rope_theta\": 500000, \"torch_dtype\": \"bfloat16\","
                                            " \"rope_scaling\": null, \"tie_word_embeddings\": true, \"rms_norm_eps\": 1e-5}"),
                                  &c) == ACCEL_OK);
    CHECK(c.hidden_size == 64 && c.num_key_value_heads == 2 && c.rope_theta == 500000.0);
    CHECK(c.torch_dtype == ACCEL_BF16 && c.tie_word_embeddings && c.rms_norm_eps == 1e-5);
    /* transformers 5.x (dtype, rope_parameters), as written by tools in tests/data */
    CHECK(accel_llama_config_load(write_cfg("v5.json",
                                            "{\"dtype\": \"float16\", \"rope_parameters\": {\"rope_theta\": 1000.0,"
                                            " \"rope_type\": \"default\"}, \"head_dim\": 16, \"bos_token_id\": null}"),
                                  &c) == ACCEL_OK);
    CHECK(c.torch_dtype == ACCEL_F16 && c.rope_theta == 1000.0 && c.head_dim == 16);
    if (access("data/hf_llama_basic/config.json", R_OK) == 0) {
        CHECK_MSG(accel_llama_config_load("data/hf_llama_basic", &c) == ACCEL_OK, "%s", accel_last_error());
        CHECK(c.hidden_size > 0 && c.num_hidden_layers > 0);
    }
}

/* The tiny model of config.json keys (family keys; the sizes added) built
 * on the meta device: whether layer 0's q/k/v_proj and o_proj have biases. */
static void check_attention_biases(const char *name, const char *keys, bool qkv, bool o) {
    char text[512];
    snprintf(text, sizeof text, "{%s, \"vocab_size\": 16, \"hidden_size\": 16, \"intermediate_size\": 16, "
             "\"num_hidden_layers\": 1, \"num_attention_heads\": 2, \"num_key_value_heads\": 2, \"num_experts\": 2, "
             "\"num_experts_per_tok\": 1, \"moe_intermediate_size\": 8, \"shared_expert_intermediate_size\": 8}",
             keys);
    accel_llama_config c;
    CHECK_MSG(accel_llama_config_load(write_cfg(name, text), &c) == ACCEL_OK, "%s: %s", name, accel_last_error());
    accel_module *m = accel_llama_new(&c, ACCEL_META_DEVICE);
    CHECK_MSG(m != NULL, "%s: %s", name, accel_last_error());
    if (!m) return;
    static const char *const QKV[] = {"q_proj", "k_proj", "v_proj"};
    char path[80];
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "model.layers.0.self_attn.%s.bias", QKV[i]);
        CHECK_MSG((accel_module_get_tensor(m, path) != NULL) == qkv, "%s: %s", name, path);
    }
    CHECK_MSG((accel_module_get_tensor(m, "model.layers.0.self_attn.o_proj.bias") != NULL) == o, "%s: o_proj", name);
    accel_module_free(m);
}

static void expect_error(const char *name, const char *text, accel_status code, const char *needle) {
    accel_llama_config c;
    accel_clear_error();
    CHECK_MSG(accel_llama_config_load(write_cfg(name, text), &c) == code, "%s: %s", name, accel_last_error());
    CHECK_STR_CONTAINS(accel_last_error(), needle);
    CHECK_STR_CONTAINS(accel_last_error(), name);
    accel_clear_error();
}

static void test_errors(void) {
    expect_error("t1.json", "{\"hidden_size\": \"64\"}", ACCEL_ERR_FORMAT, "'hidden_size' must be a positive integer");
    expect_error("t2.json", "{\"rms_norm_eps\": \"x\"}", ACCEL_ERR_FORMAT, "'rms_norm_eps' must be a number");
    expect_error("t3.json", "{\"tie_word_embeddings\": 1}", ACCEL_ERR_FORMAT, "'tie_word_embeddings' must be true or false");
    expect_error("t4.json", "{\"rope_scaling\": {\"type\": \"proportional\", \"factor\": 2.0}}", ACCEL_ERR_UNSUPPORTED,
                 "rope_scaling of type \"proportional\" is not supported");
    expect_error("t5.json", "{\"rope_parameters\": {\"rope_type\": \"llama3\"}}", ACCEL_ERR_FORMAT,
                 "rope_parameters of type \"llama3\" needs factor");
    expect_error("t6.json", "{\"model_type\": \"falcon\"}", ACCEL_ERR_UNSUPPORTED,
                 "model_type is \"falcon\", accel builds \"llama\", \"mistral\", \"qwen2\", \"qwen3\"");
    /* a field accel does not implement is refused by name, never ignored */
    expect_error("t6a.json", "{\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 2, \"beta_fast\": 3}}",
                 ACCEL_ERR_UNSUPPORTED, "rope_scaling.beta_fast is not implemented for rope type \"linear\"");
    expect_error("t6b.json", "{\"partial_rotary_factor\": 0.5}", ACCEL_ERR_UNSUPPORTED, "partial_rotary_factor");
    expect_error("t6j.json", "{\"attention_dropout\": 0.1}", ACCEL_ERR_UNSUPPORTED, "attention_dropout other than 0.0");
    expect_error("t6c.json", "{\"hidden_act\": \"gelu\"}", ACCEL_ERR_UNSUPPORTED, "hidden_act must be \"silu\"");
    expect_error("t6d.json", "{\"sliding_window\": 4096}", ACCEL_ERR_UNSUPPORTED,
                 "sliding_window is set, but llama models have none");
    expect_error("t6e.json", "{\"model_type\": \"qwen2\", \"mlp_bias\": true}", ACCEL_ERR_UNSUPPORTED,
                 "mlp_bias is true, but qwen2 models have no such bias");
    expect_error("t6f.json", "{\"model_type\": \"qwen2\", \"use_sliding_window\": true, \"num_hidden_layers\": 2, "
                 "\"sliding_window\": 8, \"layer_types\": [\"sliding_attention\", \"full_attention\"]}",
                 ACCEL_ERR_UNSUPPORTED, "a full_attention layer after a sliding_attention one is not implemented");
    expect_error("t6g.json", "{\"rope_scaling\": {\"rope_type\": \"longrope\", \"short_factor\": [1, 2], "
                 "\"long_factor\": [1, 2]}}", ACCEL_ERR_FORMAT,
                 "longrope rope_scaling needs short_factor and long_factor of head_dim / 2 numbers each");
    expect_error("t6h.json", "{\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": -1}}", ACCEL_ERR_FORMAT,
                 "rope_scaling.factor must be a finite number > 0");
    expect_error("t6i.json", "{\"rope_scaling\": {\"rope_type\": \"longrope\", \"short_factor\": [1, 2], "
                 "\"long_factor\": [1]}}", ACCEL_ERR_FORMAT, "short_factor and long_factor differ in length");
    expect_error("t7.json", "{\"num_attention_heads\": 6, \"num_key_value_heads\": 4}", ACCEL_ERR_FORMAT,
                 "not a multiple of num_key_value_heads");
    expect_error("t8.json", "{\"vocab_size\": 10,}", ACCEL_ERR_FORMAT, "invalid JSON at line 1");
    expect_error("t9.json", "{\"torch_dtype\": \"int8\"}", ACCEL_ERR_FORMAT, "not a floating dtype");
    /* sizes from a file: capped and overflow-checked, never a hang or a wrapped product */
    expect_error("t10.json", "{\"num_hidden_layers\": 1000000}", ACCEL_ERR_FORMAT,
                 "num_hidden_layers 1000000 is over accel's limit of 65536");
    expect_error("t11.json", "{\"num_hidden_layers\": 2147483648}", ACCEL_ERR_FORMAT,
                 "num_hidden_layers 2147483648 is over accel's limit");
    expect_error("t12.json", "{\"vocab_size\": 68719476736, \"hidden_size\": 1073741824, \"num_attention_heads\": 1}",
                 ACCEL_ERR_FORMAT, "the weights would take more than 2^63 bytes (vocab_size 68719476736");
    expect_error("t13.json", "{\"intermediate_size\": 4611686018427387904}", ACCEL_ERR_FORMAT,
                 "more than 2^63 bytes");
    expect_error("t14.json", "{\"hidden_size\": 64.0}", ACCEL_ERR_FORMAT, "'hidden_size' must be a positive integer");
    expect_error("t15.json", "{\"num_key_value_heads\": -2}", ACCEL_ERR_FORMAT,
                 "'num_key_value_heads' must be a positive integer");
    expect_error("t16.json", "{\"num_attention_heads\": 4, \"num_key_value_heads\": 8, \"hidden_size\": 64}",
                 ACCEL_ERR_FORMAT, "not a multiple of num_key_value_heads");
    expect_error("t17.json", "{\"hidden_size\": 60, \"num_attention_heads\": 8}", ACCEL_ERR_FORMAT,
                 "hidden_size (60) is not a multiple of num_attention_heads (8)");
    expect_error("t18.json", "{\"head_dim\": 7}", ACCEL_ERR_FORMAT, "head_dim");
    expect_error("t19.json", "{\"vocab_size\": 0}", ACCEL_ERR_FORMAT, "'vocab_size' must be a positive integer");
    /* null for a size transformers has no default for is refused (it read as
     * accel's default, 4096 hidden); null head counts/dims derive as there */
    expect_error("t21.json", "{\"hidden_size\": null}", ACCEL_ERR_FORMAT, "'hidden_size' is null");
    expect_error("t22.json", "{\"num_hidden_layers\": null}", ACCEL_ERR_FORMAT,
                 "'num_hidden_layers' is null; it must be a non-negative integer");
    accel_llama_config c;
    CHECK(accel_llama_config_load(write_cfg("t23.json", "{\"num_attention_heads\": 4, \"num_key_value_heads\": null, "
                                                        "\"head_dim\": null, \"hidden_size\": 64}"), &c) == ACCEL_OK);
    CHECK(c.num_key_value_heads == 4 && c.head_dim == 0); /* 0: hidden_size / heads */
    CHECK(accel_llama_config_load(write_cfg("t20.json", "{\"num_hidden_layers\": 65536}"), &c) == ACCEL_OK);
    CHECK(accel_llama_config_load("/nonexistent/config.json", &c) == ACCEL_ERR_IO);
    CHECK_STR_CONTAINS(accel_last_error(), "/nonexistent/config.json: no such file");
    accel_clear_error();
    /* a path that exists but is no JSON file says what it is, never "no such file" */
    char dir[128], path[160];
    snprintf(dir, sizeof dir, "%s/as_dir", g_dir);
    snprintf(path, sizeof path, "%s/config.json", dir);
    CHECK(mkdir(dir, 0755) == 0 && mkdir(path, 0755) == 0);
    CHECK(accel_llama_config_load(dir, &c) == ACCEL_ERR_IO);
    CHECK_STR_CONTAINS(accel_last_error(), "as_dir/config.json: is a directory, not a JSON file");
    accel_clear_error();
    snprintf(dir, sizeof dir, "%s/as_fifo", g_dir);
    snprintf(path, sizeof path, "%s/config.json", dir);
    CHECK(mkdir(dir, 0755) == 0 && mkfifo(path, 0644) == 0);
    CHECK(accel_llama_config_load(dir, &c) == ACCEL_ERR_IO); /* at once: no wait for a writer */
    CHECK_STR_CONTAINS(accel_last_error(), "as_fifo/config.json: is a FIFO, not a JSON file");
    accel_clear_error();
    snprintf(path, sizeof path, "%s/config.json", write_cfg("plain.json", "{}"));
    CHECK(accel_llama_config_load(path, &c) == ACCEL_ERR_IO);
    CHECK_STR_CONTAINS(accel_last_error(), "plain.json/config.json: cannot be read: Not a directory");
    accel_clear_error();
}

/* Hostile values the fuzzer reaches slowly: sizes at INT64_MAX (refused by
 * the overflow-checked sizes, never wrapped), an integer past 64 bits, a key
 * twice, NUL inside a string (escaped and raw), JSON nested 3000 deep
 * (jansson stops at 2048 levels: no stack overflow). An accepted
 * max_position_embeddings of INT64_MAX loads (transformers takes it), and the
 * training memory estimate of that many tokens is refused, not overflowed. */
static void test_hostile_values(void) {
    expect_error("h1.json", "{\"hidden_size\": 9223372036854775807, \"num_attention_heads\": 1}", ACCEL_ERR_FORMAT,
                 "head_dim (hidden_size / num_attention_heads) must be positive and even");
    expect_error("h2.json", "{\"vocab_size\": 9223372036854775807}", ACCEL_ERR_FORMAT, "more than 2^63 bytes");
    expect_error("h3.json", "{\"num_hidden_layers\": 9223372036854775807}", ACCEL_ERR_FORMAT,
                 "over accel's limit of 65536");
    expect_error("h4.json", "{\"vocab_size\": 9223372036854775808}", ACCEL_ERR_FORMAT, "too big integer");
    expect_error("h5.json", "{\"hidden_size\": 64, \"hidden_size\": 128}", ACCEL_ERR_FORMAT,
                 "duplicate object key near '\"hidden_size\"'");
    expect_error("h6.json", "{\"model_type\": \"llama\\u0000x\"}", ACCEL_ERR_FORMAT, "\\u0000 is not allowed");
    expect_error("h7.json", "{\"num_attention_heads\": -9223372036854775808}", ACCEL_ERR_FORMAT,
                 "'num_attention_heads' must be a positive integer");
    char *deep = malloc(6001);
    memset(deep, '[', 3000);
    memset(deep + 3000, ']', 3000);
    deep[6000] = 0;
    expect_error("h8.json", deep, ACCEL_ERR_FORMAT, "maximum parsing depth reached");
    free(deep);
    char path[256];
    snprintf(path, sizeof path, "%s/h9.json", g_dir);
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite("{\"model_type\": \"lla\0ma\"}", 1, 24, f) == 24 && fclose(f) == 0);
    accel_llama_config c;
    CHECK(accel_llama_config_load(path, &c) == ACCEL_ERR_FORMAT);
    CHECK_STR_CONTAINS(accel_last_error(), "control character 0x0");
    accel_clear_error();
    CHECK_MSG(accel_llama_config_load(write_cfg("h10.json", "{\"max_position_embeddings\": 9223372036854775807}"),
                                      &c) == ACCEL_OK, "%s", accel_last_error());
    accel_activation_opts o = {.batch_size = 1, .seq_len = c.max_position_embeddings, .autocast = ACCEL_F32};
    accel_activation_bytes out;
    CHECK(accel_llama_activation_bytes(&c, &o, &out) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "seq_len 9223372036854775807 would take more than 2^62 bytes");
    accel_clear_error();
}

static void test_save(void) {
    accel_llama_config c = {.vocab_size = 256, .hidden_size = 64, .intermediate_size = 128,
                            .num_hidden_layers = 2, .num_attention_heads = 4, .num_key_value_heads = 2,
                            .max_position_embeddings = 128, .rms_norm_eps = 1e-6, .rope_theta = 10000.0,
                            .initializer_range = 0.02, .tie_word_embeddings = true, .torch_dtype = ACCEL_BF16};
    char dir[128];
    snprintf(dir, sizeof dir, "%s/out", g_dir);
    CHECK(accel_llama_config_save(dir, &c) == ACCEL_OK);
    char path[160];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "r");
    char text[4096] = {0};
    CHECK(f && fread(text, 1, sizeof text - 1, f) > 0);
    if (f) fclose(f);
    const char *head = "{\n  \"architectures\": [\n    \"LlamaForCausalLM\"\n  ],\n  \"attention_bias\": false,\n";
    CHECK(strncmp(text, head, strlen(head)) == 0);
    CHECK_STR_CONTAINS(text, "  \"head_dim\": 16,\n");
    CHECK_STR_CONTAINS(text, "  \"rms_norm_eps\": 1e-06,\n");
    CHECK_STR_CONTAINS(text, "  \"rope_theta\": 10000.0,\n");
    CHECK_STR_CONTAINS(text, "  \"initializer_range\": 0.02,\n");
    CHECK_STR_CONTAINS(text, "  \"rope_scaling\": null,\n");
    CHECK_STR_CONTAINS(text, "  \"torch_dtype\": \"bfloat16\",\n");
    CHECK_STR_CONTAINS(text, "  \"vocab_size\": 256\n}\n");
    accel_llama_config back;
    CHECK(accel_llama_config_load(dir, &back) == ACCEL_OK);
    CHECK(back.vocab_size == 256 && back.num_key_value_heads == 2 && back.head_dim == 16);
    CHECK(back.tie_word_embeddings && back.torch_dtype == ACCEL_BF16 && back.rms_norm_eps == 1e-6);
    /* an explicit .json path */
    snprintf(path, sizeof path, "%s/other.json", g_dir);
    c.rope_theta = 500000.0;
    c.rms_norm_eps = 1e-5;
    CHECK(accel_llama_config_save(path, &c) == ACCEL_OK);
    CHECK(accel_llama_config_load(path, &back) == ACCEL_OK && back.rope_theta == 500000.0 && back.rms_norm_eps == 1e-5);
}

/* read() system calls this process has made so far (/proc/self/io's syscr); -1 when unknown. */
static long long read_syscalls(void) {
    FILE *f = fopen("/proc/self/io", "r");
    if (!f) return -1;
    char line[128];
    long long n = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "syscr: %lld", &n) == 1) break;
    fclose(f);
    return n;
}

/* A JSON file is read in a few read() calls, not one per byte (json_loadfd
 * did that: 1 MB cost a million system calls). */
static void test_big_file_few_reads(void) {
    const size_t pad = 1 << 20;
    char *text = malloc(pad + 64);
    CHECK(text != NULL);
    if (!text) return;
    int n = snprintf(text, 64, "{\"hidden_size\": 64, \"padding\": \"");
    memset(text + n, 'x', pad);
    strcpy(text + n + pad, "\"}");
    const char *path = write_cfg("big.json", text);
    free(text);
    accel_llama_config c;
    long long before = read_syscalls();
    CHECK_MSG(accel_llama_config_load(path, &c) == ACCEL_OK, "%s", accel_last_error());
    long long after = read_syscalls();
    CHECK(c.hidden_size == 64);
    if (before < 0 || after < 0) {
        printf("  (no /proc/self/io: read count not checked)\n");
        return;
    }
    CHECK_MSG(after - before < 64, "%lld read() calls for a 1 MB config.json", after - before);
}

static bool same_rope(const accel_rope_scaling *a, const accel_rope_scaling *b) {
    bool same = a->type == b->type && a->factor == b->factor &&
                a->original_max_position_embeddings == b->original_max_position_embeddings &&
                a->attention_factor == b->attention_factor && a->beta_fast == b->beta_fast &&
                a->beta_slow == b->beta_slow && a->mscale == b->mscale && a->mscale_all_dim == b->mscale_all_dim &&
                a->truncate_set == b->truncate_set && a->truncate == b->truncate &&
                a->low_freq_factor == b->low_freq_factor && a->high_freq_factor == b->high_freq_factor &&
                a->n_factors == b->n_factors;
    for (int i = 0; same && i < a->n_factors; i++)
        same = a->short_factor[i] == b->short_factor[i] && a->long_factor[i] == b->long_factor[i];
    return same;
}

/* Every family and rope type written and read back to the same config. */
static void test_save_families(void) {
    accel_llama_config c = {.vocab_size = 256, .hidden_size = 64, .intermediate_size = 128,
                            .num_hidden_layers = 3, .num_attention_heads = 4, .num_key_value_heads = 2, .head_dim = 16,
                            .max_position_embeddings = 128, .rms_norm_eps = 1e-6, .rope_theta = 10000.0,
                            .initializer_range = 0.02, .torch_dtype = ACCEL_F32};
    const char *types[] = {"llama", "mistral", "qwen2", "qwen3",  "gemma", "gemma2",
                           "granite", "phi3", "olmo2", "gpt2", "gemma3_text", "phi"};
    for (int k = 0; k < 12; k++)
        for (int rt = 0; rt <= ACCEL_ROPE_LLAMA3; rt++) {
            accel_llama_config w = c;
            snprintf(w.model_type, sizeof w.model_type, "%s", types[k]);
            if (k == 9 && rt) continue; /* GPT-2: learned positions, no rope_scaling */
            if (k == 9) w.num_key_value_heads = 4;
            w.sliding_window = k == 1 || k == 2 || k == 5 || k == 7 ? 32 : 0;
            w.max_window_layers = k == 2 ? 1 : 0;
            if (k == 5) /* Gemma2: a soft-capping off (null) */
                w.attn_logit_softcapping = 0, w.final_logit_softcapping = 7.5, w.query_pre_attn_scalar = 24;
            if (k == 10) /* Gemma 3: its layer types by pattern (layer 1 full), another local base */
                w.sliding_window = 32, w.sliding_window_pattern = 2, w.rope_local_base_freq = 500,
                w.query_pre_attn_scalar = 256;
            if (k == 11) /* Phi: its own rotary share, dropouts and LayerNorm eps (every rope type) */
                w.partial_rotary_factor = 0.4, w.attn_pdrop = 0.2, w.resid_pdrop = 0.1, w.embd_pdrop = 0.05,
                w.rms_norm_eps = 1e-3;
            if (k == 6)
                w.embedding_multiplier = 12, w.attention_multiplier = 0.015625, w.residual_multiplier = 0.22,
                w.logits_scaling = 8;
            w.rope_scaling = (accel_rope_scaling){.type = (accel_rope_type)rt, .factor = 4.0, .low_freq_factor = 1,
                                                  .high_freq_factor = 4, .original_max_position_embeddings = 32};
            if (rt == ACCEL_ROPE_YARN) w.rope_scaling.beta_fast = 16, w.rope_scaling.mscale = 0.5,
                                       w.rope_scaling.truncate_set = true;
            if (rt == ACCEL_ROPE_LONGROPE) {
                w.rope_scaling.n_factors = 8;
                for (int i = 0; i < 8; i++) w.rope_scaling.short_factor[i] = 1.0f + 0.1f * (float)i,
                                            w.rope_scaling.long_factor[i] = 2.0f + 0.3f * (float)i;
            }
            if (rt == ACCEL_ROPE_LONGROPE && k == 11) w.rope_scaling.n_factors = 3; /* Phi: int(16 * 0.4) / 2 */
            if (rt == ACCEL_ROPE_DEFAULT) w.rope_scaling = (accel_rope_scaling){0};
            if (rt != ACCEL_ROPE_LLAMA3) w.rope_scaling.low_freq_factor = w.rope_scaling.high_freq_factor = 0;
            if (rt == ACCEL_ROPE_LINEAR || rt == ACCEL_ROPE_DYNAMIC) w.rope_scaling.original_max_position_embeddings = 0;
            char path[160];
            snprintf(path, sizeof path, "%s/fam_%s_%d.json", g_dir, types[k], rt);
            if (k == 7 && rt != ACCEL_ROPE_DEFAULT && rt != ACCEL_ROPE_LONGROPE) {
                /* Phi3Config refuses them: a config.json neither would read back */
                static const char *const NAMES[] = {"default", "linear", "dynamic", "yarn", "longrope", "llama3"};
                CHECK(accel_llama_config_save(path, &w) == ACCEL_ERR_UNSUPPORTED);
                CHECK_STR_CONTAINS(accel_last_error(), NAMES[rt]);
                CHECK_STR_CONTAINS(accel_last_error(), "is not one phi3 models take (default, longrope)");
                continue;
            }
            if (k == 7) /* Phi-3: its top-level original_max_position_embeddings written always */
                w.partial_rotary_factor = 0.5, w.rope_scaling.n_factors = rt ? 4 : 0,
                w.rope_scaling.original_max_position_embeddings = 32;
            CHECK_MSG(accel_llama_config_save(path, &w) == ACCEL_OK, "%s %d: %s", types[k], rt, accel_last_error());
            accel_llama_config back;
            CHECK_MSG(accel_llama_config_load(path, &back) == ACCEL_OK, "%s %d: %s", types[k], rt, accel_last_error());
            CHECK_MSG(same_rope(&back.rope_scaling, &w.rope_scaling), "%s rope %d", types[k], rt);
            CHECK_MSG(!strcmp(back.model_type, types[k]) && back.sliding_window == w.sliding_window &&
                          back.max_window_layers == w.max_window_layers &&
                          back.head_dim == (k == 9 || k == 11 ? 0 : 16) && back.rms_norm_eps == w.rms_norm_eps &&
                          back.partial_rotary_factor == (k == 7 ? 0.5 : k == 11 ? 0.4 : back.partial_rotary_factor) &&
                          back.attn_pdrop == w.attn_pdrop && back.resid_pdrop == w.resid_pdrop &&
                          back.embd_pdrop == w.embd_pdrop,
                      "%s: fields differ", types[k]);
            CHECK_MSG(back.attn_logit_softcapping == w.attn_logit_softcapping &&
                          back.final_logit_softcapping == w.final_logit_softcapping &&
                          back.query_pre_attn_scalar == w.query_pre_attn_scalar &&
                          back.embedding_multiplier == w.embedding_multiplier &&
                          back.attention_multiplier == w.attention_multiplier &&
                          back.residual_multiplier == w.residual_multiplier && back.logits_scaling == w.logits_scaling,
                      "%s: scalings differ", types[k]);
            /* written as the list: the pattern's types */
            CHECK_MSG(k != 10 || (back.n_layer_types == 3 && !back.layer_full[0] && back.layer_full[1] &&
                                  !back.layer_full[2] && back.rope_local_base_freq == 500 && back.rope_theta == 10000),
                      "gemma3_text: layer types or bases differ");
        }
    snprintf(c.model_type, sizeof c.model_type, "falcon");
    char path[160];
    snprintf(path, sizeof path, "%s/falcon.json", g_dir);
    CHECK(accel_llama_config_save(path, &c) == ACCEL_ERR_UNSUPPORTED); /* as accel_llama_config_check */
    CHECK_STR_CONTAINS(accel_last_error(), "accel_llama_config_save: model_type \"falcon\" is not one accel builds");
    /* a model_type without its terminating NUL: refused by name, never read past */
    memset(c.model_type, 'x', sizeof c.model_type);
    CHECK(accel_llama_config_save(path, &c) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_llama_config_save: model_type is not a terminated string");
    accel_clear_error();
}

/* Fields a family's config.json has no key for (GPT-2's layer scaling on a
 * Llama, a bias Qwen2-MoE or GPT-2 does not have): save refuses them as the
 * model build does, naming the field, and writes nothing; they were dropped
 * without a word (the file read back as another model than the struct). */
static void test_save_other_family_fields(void) {
    static const struct {
        const char *model_type, *needle;
        bool scale, reorder, attention_bias, mlp_bias;
    } CASES[] = {
        {"llama", "scale_attn_by_inverse_layer_idx (GPT-2's) is set, but llama models", true, false, false, false},
        {"phi", "reorder_and_upcast_attn (GPT-2's) is set, but phi models", false, true, false, false},
        {"qwen2_moe", "mlp_bias is set, but qwen2_moe models have no such bias", false, false, true, true},
        {"gpt2", "attention_bias is set, but gpt2 models have no such bias", false, false, true, false},
        {"qwen2", "attention_bias is set, but qwen2 models have no such bias", false, false, true, false},
    };
    for (size_t i = 0; i < sizeof CASES / sizeof *CASES; i++) {
        accel_llama_config c;
        CHECK(accel_llama_config_for(CASES[i].model_type, &c) == ACCEL_OK);
        c.num_hidden_layers = 2;
        c.scale_attn_by_inverse_layer_idx = CASES[i].scale;
        c.reorder_and_upcast_attn = CASES[i].reorder;
        c.attention_bias = CASES[i].attention_bias;
        c.mlp_bias = CASES[i].mlp_bias;
        char path[160];
        snprintf(path, sizeof path, "%s/other_%s.json", g_dir, CASES[i].model_type);
        CHECK_MSG(accel_llama_config_save(path, &c) == ACCEL_ERR_UNSUPPORTED, "%s", CASES[i].model_type);
        CHECK_STR_CONTAINS(accel_last_error(), "accel_llama_config_save: ");
        CHECK_STR_CONTAINS(accel_last_error(), CASES[i].needle);
        CHECK_MSG(access(path, F_OK) != 0, "%s written", path);
        accel_clear_error();
    }
    /* GPT-2's own: written and read back */
    accel_llama_config g, back;
    CHECK(accel_llama_config_for("gpt2", &g) == ACCEL_OK);
    g.scale_attn_by_inverse_layer_idx = g.reorder_and_upcast_attn = true;
    char path[160];
    snprintf(path, sizeof path, "%s/gpt2_scaled.json", g_dir);
    CHECK(accel_llama_config_save(path, &g) == ACCEL_OK && accel_llama_config_load(path, &back) == ACCEL_OK);
    CHECK(back.scale_attn_by_inverse_layer_idx && back.reorder_and_upcast_attn);
}

/* Layers [0, n) of c: 'f' full_attention, 's' sliding_attention. */
static void layer_kinds(const accel_llama_config *c, int n, char *out) {
    const accel__arch *a = accel__arch_find(c->model_type);
    for (int i = 0; i < n; i++) out[i] = accel__arch_layer_local(a, c, i) ? 's' : 'f';
    out[n] = 0;
}

/* Gemma 3: transformers' defaults, layer types by pattern and by list, its
 * RoPEs in the 4.x layout (rope_scaling on the full layers,
 * rope_local_base_freq) and the 5.x one (rope_parameters by layer type), and
 * what it does not implement refused by name. */
static void test_gemma3_fields(void) {
    accel_llama_config c;
    char kinds[16];
    CHECK(accel_llama_config_load(write_cfg("g3.json", "{\"model_type\": \"gemma3_text\"}"), &c) == ACCEL_OK);
    CHECK(c.vocab_size == 262208 && c.hidden_size == 2304 && c.intermediate_size == 9216 &&
          c.num_hidden_layers == 26 && c.num_attention_heads == 8 && c.num_key_value_heads == 4 && c.head_dim == 256);
    CHECK(c.max_position_embeddings == 131072 && c.rope_theta == 1e6 && c.rope_local_base_freq == 1e4 &&
          c.rope_scaling.type == ACCEL_ROPE_DEFAULT && c.sliding_window == 4096 && c.query_pre_attn_scalar == 256);
    CHECK(c.attn_logit_softcapping == 0 && c.final_logit_softcapping == 0 && c.tie_word_embeddings &&
          c.bos_token_id == 2 && c.eos_token_ids[0] == 1 && c.n_layer_types == 0 && c.sliding_window_pattern == 6);
    layer_kinds(&c, 13, kinds);
    CHECK_MSG(!strcmp(kinds, "sssssfsssssfs"), "default pattern: %s", kinds);
    /* Gemma 3 1B's config.json (written by transformers 4.50), key for key */
    CHECK_MSG(accel_llama_config_load(write_cfg("g31b.json", "{\"architectures\": [\"Gemma3ForCausalLM\"], "
                                                "\"attention_bias\": false, \"attention_dropout\": 0.0, "
                                                "\"attn_logit_softcapping\": null, \"bos_token_id\": 2, "
                                                "\"cache_implementation\": \"hybrid\", \"eos_token_id\": [1, 106], "
                                                "\"final_logit_softcapping\": null, \"head_dim\": 256, "
                                                "\"hidden_activation\": \"gelu_pytorch_tanh\", \"hidden_size\": 1152, "
                                                "\"initializer_range\": 0.02, \"intermediate_size\": 6912, "
                                                "\"max_position_embeddings\": 32768, \"model_type\": \"gemma3_text\", "
                                                "\"num_attention_heads\": 4, \"num_hidden_layers\": 26, "
                                                "\"num_key_value_heads\": 1, \"pad_token_id\": 0, "
                                                "\"query_pre_attn_scalar\": 256, \"rms_norm_eps\": 1e-06, "
                                                "\"rope_local_base_freq\": 10000, \"rope_scaling\": null, "
                                                "\"rope_theta\": 1000000, \"sliding_window\": 512, "
                                                "\"sliding_window_pattern\": 6, \"torch_dtype\": \"bfloat16\", "
                                                "\"transformers_version\": \"4.50.0.dev0\", \"use_cache\": true, "
                                                "\"vocab_size\": 262144}"),
                                      &c) == ACCEL_OK, "%s", accel_last_error());
    layer_kinds(&c, 12, kinds);
    CHECK_MSG(!strcmp(kinds, "sssssfsssssf"), "1B: %s", kinds);
    CHECK(c.hidden_size == 1152 && c.num_key_value_heads == 1 && c.sliding_window == 512 &&
          c.torch_dtype == ACCEL_BF16 && c.n_eos_token_ids == 2 && c.eos_token_ids[1] == 106 && c.rope_theta == 1e6);
    /* 4.x: Gemma 3 4B's keys (linear 8 on the full layers) */
    CHECK(accel_llama_config_load(write_cfg("g3v4.json", "{\"model_type\": \"gemma3_text\", \"num_hidden_layers\": "
                                            "8, \"rope_theta\": 1000000.0, \"rope_local_base_freq\": 10000.0, "
                                            "\"rope_scaling\": {\"factor\": 8.0, \"rope_type\": \"linear\"}, "
                                            "\"sliding_window\": 1024, \"sliding_window_pattern\": 3, "
                                            "\"final_logit_softcapping\": null, \"attn_logit_softcapping\": null}"),
                                  &c) == ACCEL_OK);
    layer_kinds(&c, 8, kinds);
    CHECK_MSG(!strcmp(kinds, "ssfssfss"), "pattern 3: %s", kinds);
    CHECK(c.rope_scaling.type == ACCEL_ROPE_LINEAR && c.rope_scaling.factor == 8 && c.rope_theta == 1e6 &&
          c.rope_local_base_freq == 1e4 && c.sliding_window == 1024);
    /* 5.x: rope_parameters by layer type, an explicit list (which wins over the pattern) */
    CHECK_MSG(accel_llama_config_load(write_cfg("g3v5.json", "{\"model_type\": \"gemma3_text\", \"num_hidden_layers\": "
                                            "3, \"sliding_window_pattern\": 2, \"layer_types\": [\"full_attention\", "
                                            "\"sliding_attention\", \"full_attention\"], \"rope_parameters\": "
                                            "{\"full_attention\": {\"rope_type\": \"linear\", \"factor\": 4.0, "
                                            "\"rope_theta\": 1000.0}, \"sliding_attention\": {\"rope_type\": "
                                            "\"default\", \"rope_theta\": 100.0}}}"),
                                  &c) == ACCEL_OK, "%s", accel_last_error());
    layer_kinds(&c, 3, kinds);
    CHECK_MSG(!strcmp(kinds, "fsf") && c.n_layer_types == 3, "layer_types: %s", kinds);
    CHECK(c.rope_scaling.type == ACCEL_ROPE_LINEAR && c.rope_scaling.factor == 4 && c.rope_theta == 1000 &&
          c.rope_local_base_freq == 100);
    /* a layer type's null parameters: its default (the local base: rope_local_base_freq's) */
    CHECK(accel_llama_config_load(write_cfg("g3v5n.json", "{\"model_type\": \"gemma3_text\", \"rope_local_base_freq\": "
                                            "20.0, \"rope_parameters\": {\"full_attention\": null, "
                                            "\"sliding_attention\": null}}"),
                                  &c) == ACCEL_OK);
    CHECK(c.rope_local_base_freq == 20 && c.rope_theta == 1e6 && c.rope_scaling.type == ACCEL_ROPE_DEFAULT);
    expect_error("g3e1.json", "{\"model_type\": \"gemma3\", \"text_config\": {}}", ACCEL_ERR_UNSUPPORTED,
                 "model_type \"gemma3\" (Gemma3ForConditionalGeneration");
    expect_error("g3e2.json", "{\"model_type\": \"gemma3_text\", \"use_bidirectional_attention\": true}",
                 ACCEL_ERR_UNSUPPORTED, "use_bidirectional_attention is not implemented");
    expect_error("g3e3.json", "{\"model_type\": \"gemma3_text\", \"attn_logit_softcapping\": 50.0}",
                 ACCEL_ERR_UNSUPPORTED, "attn_logit_softcapping is set, but gemma3_text models have none");
    expect_error("g3e4.json", "{\"model_type\": \"gemma3_text\", \"rope_parameters\": {\"sliding_attention\": "
                 "{\"rope_type\": \"linear\", \"factor\": 2.0}}}", ACCEL_ERR_UNSUPPORTED,
                 "rope_parameters.sliding_attention of type \"linear\"");
    expect_error("g3e5.json", "{\"model_type\": \"gemma3_text\", \"rope_parameters\": {\"rope_type\": "
                 "\"default\", \"rope_theta\": 10.0}}", ACCEL_ERR_UNSUPPORTED,
                 "rope_parameters.rope_type: gemma3_text's rope_parameters are keyed by layer type");
    expect_error("g3e6.json", "{\"model_type\": \"gemma3_text\", \"num_hidden_layers\": 2, \"layer_types\": "
                 "[\"full_attention\"]}", ACCEL_ERR_FORMAT, "'layer_types' must be a list of num_hidden_layers strings");
    expect_error("g3e7.json", "{\"model_type\": \"gemma3_text\", \"num_hidden_layers\": 2, \"layer_types\": "
                 "[\"full_attention\", \"chunked_attention\"]}", ACCEL_ERR_FORMAT,
                 "layer_types[1] must be \"full_attention\" or \"sliding_attention\"");
    expect_error("g3e8.json", "{\"model_type\": \"gemma3_text\", \"sliding_window_pattern\": 0}", ACCEL_ERR_FORMAT,
                 "'sliding_window_pattern' must be a positive integer");
    expect_error("g3e9.json", "{\"model_type\": \"gemma3_text\", \"sliding_window_pattern\": null}",
                 ACCEL_ERR_FORMAT, "'sliding_window_pattern' is null");
    expect_error("g3e10.json", "{\"model_type\": \"gemma3_text\", \"rope_local_base_freq\": 0}", ACCEL_ERR_FORMAT,
                 "'rope_local_base_freq' must be a number > 0");
    expect_error("g3e11.json", "{\"model_type\": \"gemma3_text\", \"sliding_window\": null}", ACCEL_ERR_FORMAT,
                 "'sliding_window' is null");
    /* 4.x's old "type" key: transformers 5 merges it into full_attention's default RoPE unread */
    expect_error("g3e12.json", "{\"model_type\": \"gemma3_text\", \"rope_scaling\": {\"type\": \"linear\", "
                 "\"factor\": 8.0}}", ACCEL_ERR_UNSUPPORTED,
                 "rope_scaling.type: gemma3_text's rope_scaling needs its type under rope_type");
    /* a list past ACCEL_MAX_LAYER_TYPES: the pattern form is the way */
    char big[8192] = "{\"model_type\": \"gemma3_text\", \"num_hidden_layers\": 257, \"layer_types\": [";
    for (int i = 0; i < 257; i++) strcat(big, i ? ", \"full_attention\"" : "\"full_attention\"");
    strcat(big, "]}");
    expect_error("g3e12.json", big, ACCEL_ERR_UNSUPPORTED, "layer_types of more than 256 layers is not implemented");
    /* the C API: the fields on another family, and out of range */
    accel_llama_config k = accel_llama_config_default();
    k.rope_local_base_freq = 10000;
    CHECK(accel_llama_config_check(&k, "cfg") == ACCEL_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(accel_last_error(), "cfg: rope_local_base_freq is set, but llama models have no per-layer "
                                           "attention types");
    k = accel__arch_find("gemma3_text")->defaults;
    k.n_layer_types = 3;
    CHECK(accel_llama_config_check(&k, "cfg") == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "n_layer_types 3 must be 0 (sliding_window_pattern) or num_hidden_layers (26)");
    k.n_layer_types = 0, k.sliding_window_pattern = -1;
    CHECK(accel_llama_config_check(&k, "cfg") == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "sliding_window_pattern is -1: it must be >= 1");
    k.sliding_window_pattern = 0, k.rope_local_base_freq = -1;
    CHECK(accel_llama_config_check(&k, "cfg") == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "rope_local_base_freq is -1: it must be a finite number > 0");
    /* 0: transformers' defaults, as the model built from it has them */
    k.rope_local_base_freq = 0, k.num_hidden_layers = 6, k.hidden_size = 32, k.intermediate_size = 32;
    k.vocab_size = 16, k.head_dim = 8;
    accel_module *m = accel_llama_new(&k, ACCEL_META_DEVICE);
    const accel_llama_config *r = m ? accel_llama_config_of(m) : NULL;
    CHECK_MSG(r && r->rope_local_base_freq == 10000 && r->sliding_window_pattern == 6, "%s", accel_last_error());
    accel_module_free(m);
    /* saved as it is (unresolved): the same model, not every layer sliding with a local base of 0 */
    char path[300];
    snprintf(path, sizeof path, "%s/g3zero.json", g_dir);
    CHECK(accel_llama_config_save(path, &k) == ACCEL_OK);
    accel_llama_config back;
    CHECK_MSG(accel_llama_config_load(path, &back) == ACCEL_OK, "%s", accel_last_error());
    const accel__arch *g3 = accel__arch_find("gemma3_text");
    for (int64_t i = 0; i < 6; i++)
        CHECK_MSG(accel__arch_layer_local(g3, &back, i) == (i != 5), "layer %lld", (long long)i);
    CHECK(back.rope_local_base_freq == 10000 && back.sliding_window_pattern == 6);
    /* past ACCEL_MAX_LAYER_TYPES layers the pattern alone, which loads back (a list of 300 is refused) */
    k.num_hidden_layers = 300;
    CHECK(accel_llama_config_save(path, &k) == ACCEL_OK);
    CHECK_MSG(accel_llama_config_load(path, &back) == ACCEL_OK, "%s", accel_last_error());
    CHECK(back.n_layer_types == 0 && accel__arch_layer_local(g3, &back, 298) && !accel__arch_layer_local(g3, &back, 299));
    k.num_hidden_layers = 6;
    /* no window: transformers has no windowless Gemma 3 (its saved null would not load) */
    k.sliding_window = 0;
    CHECK(accel_llama_config_check(&k, "cfg") == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "cfg: sliding_window is 0: gemma3_text models need a window > 0");
    expect_error("g3e13.json", "{\"model_type\": \"gemma3_text\", \"rope_local_base_freq\": null}", ACCEL_ERR_FORMAT,
                 "'rope_local_base_freq' must be a number > 0");
    accel_clear_error();
}

/* Gemma, Gemma2, Granite: transformers' defaults, and every field they (or
 * the other families) do not implement refused by name. */
static void test_gemma_granite_fields(void) {
    accel_llama_config c;
    CHECK(accel_llama_config_load(write_cfg("g2.json", "{\"model_type\": \"gemma2\"}"), &c) == ACCEL_OK);
    CHECK(c.attn_logit_softcapping == 50 && c.final_logit_softcapping == 30 && c.query_pre_attn_scalar == 256 &&
          c.sliding_window == 4096 && c.tie_word_embeddings && c.head_dim == 256 && c.hidden_size == 2304);
    CHECK(accel_llama_config_load(write_cfg("g2n.json", "{\"model_type\": \"gemma2\", \"final_logit_softcapping\": "
                                            "null, \"sliding_window\": null, \"layer_types\": null}"),
                                  &c) == ACCEL_OK);
    CHECK(c.final_logit_softcapping == 0 && c.attn_logit_softcapping == 50 && c.sliding_window == 0);
    CHECK(accel_llama_config_load(write_cfg("g1.json", "{\"model_type\": \"gemma\", \"hidden_act\": \"gelu\", "
                                            "\"hidden_activation\": null}"),
                                  &c) == ACCEL_OK);
    CHECK(c.tie_word_embeddings && c.head_dim == 256 && c.attn_logit_softcapping == 0);
    CHECK(accel_llama_config_load(write_cfg("gr.json", "{\"model_type\": \"granite\"}"), &c) == ACCEL_OK);
    CHECK(!c.tie_word_embeddings && c.logits_scaling == 0); /* 0: transformers' 1.0 */
    expect_error("gf1.json", "{\"attn_logit_softcapping\": 50.0}", ACCEL_ERR_UNSUPPORTED,
                 "attn_logit_softcapping is set, but llama models have none");
    expect_error("gf2.json", "{\"model_type\": \"gemma\", \"final_logit_softcapping\": 30.0}", ACCEL_ERR_UNSUPPORTED,
                 "final_logit_softcapping is set, but gemma models have none");
    expect_error("gf3.json", "{\"model_type\": \"gemma2\", \"logits_scaling\": 8}", ACCEL_ERR_UNSUPPORTED,
                 "logits_scaling is set, but gemma2 models have none");
    expect_error("gf4.json", "{\"model_type\": \"granite\", \"logits_scaling\": 0}", ACCEL_ERR_FORMAT,
                 "'logits_scaling' must be a positive number");
    expect_error("gf5.json", "{\"model_type\": \"gemma2\", \"query_pre_attn_scalar\": null, \"attn_logit_softcapping\": "
                 "-1}", ACCEL_ERR_FORMAT, "'attn_logit_softcapping' must be null or a positive number");
    expect_error("gf6.json", "{\"model_type\": \"gemma\", \"hidden_act\": \"silu\"}", ACCEL_ERR_UNSUPPORTED,
                 "hidden_act must be \"gelu_pytorch_tanh\" or \"gelu\"");
    expect_error("gf7.json", "{\"model_type\": \"gemma2\", \"hidden_activation\": \"gelu\"}", ACCEL_ERR_UNSUPPORTED,
                 "hidden_activation must be \"gelu_pytorch_tanh\"");
    expect_error("gf8.json", "{\"model_type\": \"gemma\", \"use_bidirectional_attention\": true}",
                 ACCEL_ERR_UNSUPPORTED, "use_bidirectional_attention is not implemented");
    expect_error("gf9.json", "{\"model_type\": \"gemma2\", \"num_hidden_layers\": 2, \"layer_types\": "
                 "[\"sliding_attention\", \"sliding_attention\"]}", ACCEL_ERR_UNSUPPORTED,
                 "layer_types[1] is not \"full_attention\"");
    expect_error("gf10.json", "{\"model_type\": \"gemma\", \"sliding_window\": 8}", ACCEL_ERR_UNSUPPORTED,
                 "sliding_window is set, but gemma models have none");
    expect_error("gf11.json", "{\"model_type\": \"gemma\", \"mlp_bias\": true}", ACCEL_ERR_UNSUPPORTED,
                 "mlp_bias is true, but gemma models have no such bias");
    /* the C API: another family's scaling, and a multiplier no number can be */
    accel_llama_config k = accel_llama_config_default();
    k.residual_multiplier = 2;
    CHECK(accel_llama_config_check(&k, "cfg") == ACCEL_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(accel_last_error(), "cfg: residual_multiplier is set, but llama models have none");
    snprintf(k.model_type, sizeof k.model_type, "granite");
    k.residual_multiplier = -0.5;
    CHECK(accel_llama_config_check(&k, "cfg") == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "residual_multiplier is -0.5: it must be a finite number >= 0");
    k.residual_multiplier = 0.5;
    CHECK(accel_llama_config_check(&k, "cfg") == ACCEL_OK);
    accel_clear_error();
}

/* Phi-3 and OLMo 2: their defaults, Phi-3's partial rotary (top level and
 * rope_parameters), its earlier rope type "su", the top-level
 * original_max_position_embeddings save writes; what each family lacks refused. */
/* Phi: PhiConfig's defaults and keys (layer_norm_eps, not rms_norm_eps;
 * its dropouts; every rope type with partial_rotary_factor inside
 * rope_parameters as transformers 5 writes it; qk_layernorm), what it
 * refuses by name, and what it writes (PhiConfig's keys: no head_dim,
 * rms_norm_eps). */
static void test_phi_fields(void) {
    accel_llama_config c;
    CHECK(accel_llama_config_load(write_cfg("phid.json", "{\"model_type\": \"phi\"}"), &c) == ACCEL_OK);
    CHECK(c.vocab_size == 51200 && c.hidden_size == 2048 && c.intermediate_size == 8192 && c.num_hidden_layers == 24);
    CHECK(c.num_attention_heads == 32 && c.num_key_value_heads == 32 && c.rms_norm_eps == 1e-5);
    CHECK(c.partial_rotary_factor == 0.5 && !c.tie_word_embeddings && c.attn_pdrop == 0 && c.resid_pdrop == 0);
    CHECK(c.bos_token_id == 1 && c.n_eos_token_ids == 1 && c.eos_token_ids[0] == 2 && c.pad_token_id == -1);
    const char *phi = "{\"model_type\": \"phi\", \"hidden_size\": 64, \"num_attention_heads\": 4, "
                      "\"layer_norm_eps\": 0.001, \"rms_norm_eps\": 0.5, \"resid_pdrop\": 0.1, \"embd_pdrop\": 0.2, "
                      "\"attention_dropout\": 0.3, \"hidden_act\": \"gelu_new\", \"qk_layernorm\": false, "
                      "\"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 2.0, \"rope_theta\": 500.0, "
                      "\"partial_rotary_factor\": 0.75}}";
    CHECK_MSG(accel_llama_config_load(write_cfg("phi.json", phi), &c) == ACCEL_OK, "%s", accel_last_error());
    /* rms_norm_eps is not PhiConfig's: unread; yarn is yarn (not Phi-3's longrope) */
    CHECK(c.rms_norm_eps == 0.001 && c.resid_pdrop == 0.1 && c.embd_pdrop == 0.2 && c.attn_pdrop == 0.3);
    CHECK(c.rope_scaling.type == ACCEL_ROPE_YARN && c.rope_theta == 500 && c.partial_rotary_factor == 0.75);
    char path[160];
    snprintf(path, sizeof path, "%s/phi_saved", g_dir);
    CHECK(accel_llama_config_save(path, &c) == ACCEL_OK);
    char file[200], text[4096] = {0};
    snprintf(file, sizeof file, "%s/config.json", path);
    FILE *f = fopen(file, "r");
    CHECK(f && fread(text, 1, sizeof text - 1, f) > 0);
    if (f) fclose(f);
    CHECK_STR_CONTAINS(text, "\n  \"attention_dropout\": 0.3,\n  \"bos_token_id\": 1,\n  \"embd_pdrop\": 0.2,\n");
    CHECK_STR_CONTAINS(text, "\n  \"hidden_act\": \"gelu_new\",\n");
    CHECK_STR_CONTAINS(text, "\n  \"layer_norm_eps\": 0.001,\n");
    CHECK_STR_CONTAINS(text, "\n  \"partial_rotary_factor\": 0.75,\n  \"qk_layernorm\": false,\n  \"resid_pdrop\": 0.1,\n"
                             "  \"rope_scaling\": {");
    CHECK(!strstr(text, "head_dim") && !strstr(text, "rms_norm_eps") && !strstr(text, "attention_bias"));
    /* a head_dim other than hidden_size / heads: written (PhiAttention reads it) */
    c.head_dim = 8;
    CHECK(accel_llama_config_save(path, &c) == ACCEL_OK);
    accel_llama_config back;
    CHECK(accel_llama_config_load(path, &back) == ACCEL_OK && back.head_dim == 8);
    /* qk_layernorm read and written back; its LayerNorms are hidden_size / heads wide (transformers'):
     * another head_dim refused, as the key on another family through the C API */
    CHECK(accel_llama_config_load(write_cfg("phiq.json", "{\"model_type\": \"phi\", \"qk_layernorm\": true}"),
                                  &c) == ACCEL_OK && c.qk_layernorm);
    CHECK(accel_llama_config_save(path, &c) == ACCEL_OK && accel_llama_config_load(path, &back) == ACCEL_OK &&
          back.qk_layernorm);
    expect_error("phiqh.json", "{\"model_type\": \"phi\", \"qk_layernorm\": true, \"head_dim\": 32}",
                 ACCEL_ERR_FORMAT, "qk_layernorm is only implemented with head_dim = hidden_size / num_attention_heads");
    expect_error("phiqn.json", "{\"model_type\": \"phi\", \"qk_layernorm\": null}", ACCEL_ERR_FORMAT,
                 "'qk_layernorm' must be true or false");
    accel_llama_config l = accel_llama_config_default();
    l.qk_layernorm = true;
    CHECK(accel_llama_config_check(&l, "t") == ACCEL_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(accel_last_error(), "t: qk_layernorm is Phi's and StableLM's: the model has no q/k LayerNorms");
    expect_error("phia.json", "{\"model_type\": \"phi\", \"hidden_act\": \"gelu\"}", ACCEL_ERR_UNSUPPORTED,
                 "hidden_act must be \"gelu_new\" (the only activation of phi models");
    expect_error("phir.json", "{\"model_type\": \"phi\", \"resid_pdrop\": 1.5}", ACCEL_ERR_FORMAT,
                 "'resid_pdrop' must be a number in [0, 1]");
    expect_error("phie.json", "{\"model_type\": \"phi\", \"layer_norm_eps\": 0}", ACCEL_ERR_FORMAT,
                 "'layer_norm_eps' must be a number > 0");
    expect_error("phiw.json", "{\"model_type\": \"phi\", \"sliding_window\": 8}", ACCEL_ERR_UNSUPPORTED,
                 "sliding_window is set, but phi models have none");
    expect_error("phib.json", "{\"model_type\": \"phi\", \"attention_bias\": true}", ACCEL_ERR_UNSUPPORTED,
                 "attention_bias is true, but phi models have no such bias");
}

static const char *read_saved(const char *path);

/* StableLmConfig: its defaults (use_parallel_residual false: sequential);
 * layer_norm_eps, use_qkv_bias (q/k/v's biases, an attention_bias key
 * unread), use_parallel_residual, hidden_dropout (the MLP's output),
 * attention_dropout, top-level partial_rotary_factor and rope_theta with
 * rope_parameters' own winning; keys written as the Hub's configs have them;
 * qk_layernorm (a LayerNorm of its own per head) read and written; what it
 * does not take refused by name. */
static void test_stablelm_fields(void) {
    accel_llama_config c;
    CHECK(accel_llama_config_load(write_cfg("sld.json", "{\"model_type\": \"stablelm\"}"), &c) == ACCEL_OK);
    CHECK(c.vocab_size == 50304 && c.hidden_size == 2560 && c.intermediate_size == 6912 && c.num_hidden_layers == 32);
    CHECK(c.num_attention_heads == 32 && c.num_key_value_heads == 32 && c.rms_norm_eps == 1e-5);
    CHECK(c.partial_rotary_factor == 0.25 && c.rope_theta == 10000 && !c.tie_word_embeddings && !c.attention_bias);
    CHECK(c.sequential_residual && c.attn_pdrop == 0 && c.resid_pdrop == 0 && c.embd_pdrop == 0 && !c.qk_layernorm);
    CHECK(c.bos_token_id == 0 && c.n_eos_token_ids == 1 && c.eos_token_ids[0] == 0 && c.pad_token_id == -1);
    const char *sl = "{\"model_type\": \"stablelm\", \"hidden_size\": 64, \"num_attention_heads\": 4, "
                     "\"num_key_value_heads\": 2, \"layer_norm_eps\": 0.001, \"rms_norm_eps\": 0.5, "
                     "\"use_qkv_bias\": true, \"attention_bias\": false, \"use_parallel_residual\": true, "
                     "\"hidden_dropout\": 0.1, \"attention_dropout\": 0.3, \"hidden_act\": \"silu\", "
                     "\"partial_rotary_factor\": 0.5, \"rope_theta\": 500, \"qk_layernorm\": false, "
                     "\"tie_word_embeddings\": true}";
    CHECK_MSG(accel_llama_config_load(write_cfg("sl.json", sl), &c) == ACCEL_OK, "%s", accel_last_error());
    CHECK(c.rms_norm_eps == 0.001 && c.attention_bias && !c.sequential_residual && c.resid_pdrop == 0.1);
    CHECK(c.attn_pdrop == 0.3 && c.embd_pdrop == 0 && c.partial_rotary_factor == 0.5 && c.rope_theta == 500);
    CHECK(c.num_key_value_heads == 2 && c.tie_word_embeddings);
    char path[160];
    const char *text;
    snprintf(path, sizeof path, "%s/stablelm_saved", g_dir);
    CHECK(accel_llama_config_save(path, &c) == ACCEL_OK);
    text = read_saved(path);
    CHECK_STR_CONTAINS(text, "{\n  \"architectures\": [\n    \"StableLmForCausalLM\"\n  ],\n  \"attention_dropout\": "
                             "0.3,\n  \"bos_token_id\": 0,\n  \"eos_token_id\": 0,\n  \"hidden_act\": \"silu\",\n  "
                             "\"hidden_dropout\": 0.1,\n  \"hidden_size\": 64,\n");
    CHECK_STR_CONTAINS(text, "\n  \"layer_norm_eps\": 0.001,\n");
    CHECK_STR_CONTAINS(text, "\n  \"num_key_value_heads\": 2,\n  \"pad_token_id\": null,\n  \"partial_rotary_factor\": "
                             "0.5,\n  \"qk_layernorm\": false,\n  \"rope_scaling\": null,\n  \"rope_theta\": 500.0,\n");
    CHECK_STR_CONTAINS(text, "\n  \"use_parallel_residual\": true,\n  \"use_qkv_bias\": true,\n  \"vocab_size\": "
                             "50304\n}");
    CHECK(!strstr(text, "head_dim") && !strstr(text, "rms_norm_eps") && !strstr(text, "attention_bias") &&
          !strstr(text, "pdrop") && !strstr(text, "sliding_window"));
    accel_llama_config back;
    CHECK(accel_llama_config_load(path, &back) == ACCEL_OK && !back.sequential_residual && back.attention_bias &&
          back.rms_norm_eps == 0.001 && back.resid_pdrop == 0.1 && back.attn_pdrop == 0.3 &&
          back.partial_rotary_factor == 0.5 && back.rope_theta == 500 && back.tie_word_embeddings);
    /* the sequential default written as use_parallel_residual false */
    c.sequential_residual = true;
    c.attention_bias = false;
    CHECK(accel_llama_config_save(path, &c) == ACCEL_OK);
    text = read_saved(path);
    CHECK_STR_CONTAINS(text, "\n  \"use_parallel_residual\": false,\n  \"use_qkv_bias\": false,\n");
    /* rope_parameters' own theta and factor win over the top-level keys (StableLmConfig's standardisation) */
    CHECK(accel_llama_config_load(write_cfg("slr.json", "{\"model_type\": \"stablelm\", \"partial_rotary_factor\": "
                                            "0.5, \"rope_theta\": 500, \"rope_parameters\": {\"rope_type\": \"linear\", "
                                            "\"factor\": 2.0, \"rope_theta\": 300.0, \"partial_rotary_factor\": "
                                            "0.75}}"), &c) == ACCEL_OK);
    CHECK(c.rope_theta == 300 && c.partial_rotary_factor == 0.75 && c.rope_scaling.type == ACCEL_ROPE_LINEAR);
    /* qk_layernorm (StableLmLayerNormPerHead: a LayerNorm of its own per head) read, written and read back */
    CHECK(accel_llama_config_load(write_cfg("slq.json", "{\"model_type\": \"stablelm\", \"qk_layernorm\": true}"),
                                  &c) == ACCEL_OK && c.qk_layernorm);
    CHECK_MSG(accel_llama_config_save(path, &c) == ACCEL_OK, "%s", accel_last_error());
    text = read_saved(path);
    CHECK_STR_CONTAINS(text, "\n  \"qk_layernorm\": true,\n  \"rope_scaling\": null,\n");
    CHECK(accel_llama_config_load(path, &back) == ACCEL_OK && back.qk_layernorm);
    accel_llama_config q = back;
    CHECK(accel_llama_config_check(&q, "t") == ACCEL_OK);
    /* the norms are head_dim wide: transformers' hidden_size / heads */
    q.head_dim = 2 * q.hidden_size / q.num_attention_heads;
    CHECK(accel_llama_config_check(&q, "t") == ACCEL_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(accel_last_error(), "t: qk_layernorm is only implemented with head_dim = hidden_size / "
                                           "num_attention_heads");
    q = back;
    q.qk_layernorm = false;
    q.embd_pdrop = 0.1;
    CHECK(accel_llama_config_save(path, &q) == ACCEL_ERR_UNSUPPORTED); /* accel_llama_config_check's status */
    CHECK_STR_CONTAINS(accel_last_error(), "accel_llama_config_save: stablelm models have no embedding dropout: "
                                           "embd_pdrop (0.1) must be 0");
    expect_error("sln.json", "{\"model_type\": \"stablelm\", \"use_parallel_residual\": null}", ACCEL_ERR_FORMAT,
                 "'use_parallel_residual' must be true or false");
    expect_error("sla.json", "{\"model_type\": \"stablelm\", \"hidden_act\": \"gelu\"}", ACCEL_ERR_UNSUPPORTED,
                 "hidden_act must be \"silu\" (the only activation of stablelm models");
    expect_error("slh.json", "{\"model_type\": \"stablelm\", \"hidden_dropout\": 2}", ACCEL_ERR_FORMAT,
                 "'hidden_dropout' must be a number in [0, 1]");
    expect_error("sle.json", "{\"model_type\": \"stablelm\", \"layer_norm_eps\": 0}", ACCEL_ERR_FORMAT,
                 "'layer_norm_eps' must be a number > 0");
    expect_error("slw.json", "{\"model_type\": \"stablelm\", \"sliding_window\": 8}", ACCEL_ERR_UNSUPPORTED,
                 "sliding_window is set, but stablelm models have none");
    /* attention_bias / mlp_bias are not StableLmConfig's keys: unread */
    CHECK(accel_llama_config_load(write_cfg("slm.json", "{\"model_type\": \"stablelm\", \"mlp_bias\": true, "
                                            "\"attention_bias\": true}"), &c) == ACCEL_OK &&
          !c.mlp_bias && !c.attention_bias);
    expect_error("slk.json", "{\"model_type\": \"stablelm\", \"hidden_size\": 64, \"num_attention_heads\": 4, "
                 "\"num_key_value_heads\": 4, \"head_dim\": 8}", ACCEL_ERR_FORMAT,
                 "stablelm models have head_dim = hidden_size / num_attention_heads (got head_dim 8, 4 heads, "
                 "hidden_size 64)");
}

/* Starcoder2Config: its defaults (a tied head, biases); norm_epsilon,
 * use_bias (the attention's and the MLP's biases; attention_bias / mlp_bias
 * keys unread), the three dropouts, sliding_window; the Hub's extra keys
 * mlp_type / norm_type unread, as there; keys written as the Hub's configs
 * have them; what it does not take refused by name. */
static void test_starcoder2_fields(void) {
    accel_llama_config c;
    CHECK(accel_llama_config_load(write_cfg("scd.json", "{\"model_type\": \"starcoder2\"}"), &c) == ACCEL_OK);
    CHECK(c.vocab_size == 49152 && c.hidden_size == 3072 && c.intermediate_size == 12288 && c.num_hidden_layers == 30);
    CHECK(c.num_attention_heads == 24 && c.num_key_value_heads == 2 && c.rms_norm_eps == 1e-5);
    CHECK(c.initializer_range == 0.018042 && c.rope_theta == 10000 && c.tie_word_embeddings && c.attention_bias &&
          c.mlp_bias && c.sliding_window == 0);
    CHECK(c.attn_pdrop == 0 && c.resid_pdrop == 0 && c.embd_pdrop == 0 && c.partial_rotary_factor == 0);
    CHECK(c.bos_token_id == 50256 && c.n_eos_token_ids == 1 && c.eos_token_ids[0] == 50256 && c.pad_token_id == -1);
    const char *sc = "{\"model_type\": \"starcoder2\", \"hidden_size\": 64, \"num_attention_heads\": 4, "
                     "\"num_key_value_heads\": 2, \"norm_epsilon\": 0.001, \"rms_norm_eps\": 0.5, \"use_bias\": false, "
                     "\"attention_bias\": true, \"mlp_bias\": true, \"residual_dropout\": 0.1, "
                     "\"embedding_dropout\": 0.2, \"attention_dropout\": 0.3, \"sliding_window\": 16, "
                     "\"rope_theta\": 999999.4420358813, \"tie_word_embeddings\": false, "
                     "\"hidden_act\": \"gelu_pytorch_tanh\", \"mlp_type\": \"default\", \"norm_type\": \"layer_norm\"}";
    CHECK_MSG(accel_llama_config_load(write_cfg("sc.json", sc), &c) == ACCEL_OK, "%s", accel_last_error());
    CHECK(c.rms_norm_eps == 0.001 && !c.attention_bias && !c.mlp_bias && c.resid_pdrop == 0.1 && c.embd_pdrop == 0.2);
    CHECK(c.attn_pdrop == 0.3 && c.sliding_window == 16 && c.rope_theta == 999999.4420358813 && !c.tie_word_embeddings);
    char path[160];
    const char *text;
    snprintf(path, sizeof path, "%s/starcoder2_saved", g_dir);
    CHECK(accel_llama_config_save(path, &c) == ACCEL_OK);
    text = read_saved(path);
    CHECK_STR_CONTAINS(text, "{\n  \"architectures\": [\n    \"Starcoder2ForCausalLM\"\n  ],\n  \"attention_dropout\": "
                             "0.3,\n  \"bos_token_id\": 50256,\n  \"embedding_dropout\": 0.2,\n  \"eos_token_id\": "
                             "50256,\n  \"hidden_act\": \"gelu_pytorch_tanh\",\n  \"hidden_size\": 64,\n");
    CHECK_STR_CONTAINS(text, "\n  \"model_type\": \"starcoder2\",\n  \"norm_epsilon\": 0.001,\n");
    CHECK_STR_CONTAINS(text, "\n  \"pad_token_id\": null,\n  \"residual_dropout\": 0.1,\n  \"rope_scaling\": null,\n  "
                             "\"rope_theta\": 999999.4420358813,\n  \"sliding_window\": 16,\n  \"tie_word_embeddings\": "
                             "false,\n");
    CHECK_STR_CONTAINS(text, "\n  \"use_bias\": false,\n  \"use_cache\": true,\n  \"vocab_size\": 49152\n}");
    CHECK(!strstr(text, "head_dim") && !strstr(text, "rms_norm_eps") && !strstr(text, "attention_bias") &&
          !strstr(text, "mlp_bias") && !strstr(text, "pdrop") && !strstr(text, "partial_rotary_factor"));
    accel_llama_config back;
    CHECK(accel_llama_config_load(path, &back) == ACCEL_OK && !back.attention_bias && !back.mlp_bias &&
          back.rms_norm_eps == 0.001 && back.resid_pdrop == 0.1 && back.embd_pdrop == 0.2 && back.attn_pdrop == 0.3 &&
          back.sliding_window == 16 && back.rope_theta == 999999.4420358813 && !back.tie_word_embeddings);
    /* no window: null; a head_dim other than hidden_size / heads written (its attention reads it) */
    c.sliding_window = 0;
    c.head_dim = 8;
    CHECK(accel_llama_config_save(path, &c) == ACCEL_OK);
    text = read_saved(path);
    CHECK_STR_CONTAINS(text, "\n  \"sliding_window\": null,\n");
    CHECK_STR_CONTAINS(text, "\n  \"eos_token_id\": 50256,\n  \"head_dim\": 8,\n  \"hidden_act\": ");
    CHECK(accel_llama_config_load(path, &back) == ACCEL_OK && back.head_dim == 8 && back.sliding_window == 0);
    /* one use_bias: attention_bias and mlp_bias apart refused, in the check and the save */
    c.mlp_bias = true;
    CHECK(accel_llama_config_check(&c, "t") == ACCEL_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(accel_last_error(), "t: starcoder2 models have one use_bias for the attention and the MLP: "
                                           "attention_bias (0) must equal mlp_bias (1)");
    CHECK(accel_llama_config_save(path, &c) == ACCEL_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_llama_config_save: starcoder2 models have one use_bias for the "
                                           "attention and the MLP: attention_bias (0) must equal mlp_bias (1)");
    expect_error("sca.json", "{\"model_type\": \"starcoder2\", \"hidden_act\": \"gelu\"}", ACCEL_ERR_UNSUPPORTED,
                 "hidden_act must be \"gelu_pytorch_tanh\" (the only activation of starcoder2 models");
    expect_error("scp.json", "{\"model_type\": \"starcoder2\", \"partial_rotary_factor\": 0.5}", ACCEL_ERR_UNSUPPORTED,
                 "partial_rotary_factor other than 1.0 is not implemented for starcoder2 models");
    expect_error("sce.json", "{\"model_type\": \"starcoder2\", \"norm_epsilon\": 0}", ACCEL_ERR_FORMAT,
                 "'norm_epsilon' must be a number > 0");
    expect_error("scr.json", "{\"model_type\": \"starcoder2\", \"residual_dropout\": 2}", ACCEL_ERR_FORMAT,
                 "'residual_dropout' must be a number in [0, 1]");
    expect_error("scb.json", "{\"model_type\": \"starcoder2\", \"use_bias\": null}", ACCEL_ERR_FORMAT,
                 "'use_bias' must be true or false");
}

/* GPTNeoXConfig: its defaults; rotary_emb_base / rotary_pct as the RoPE's base
 * and factor, rope_parameters' own winning, top-level rope_theta and
 * partial_rotary_factor unread (not GPTNeoXConfig's keys); hidden_dropout as
 * the embeddings' and branches' dropout; use_parallel_residual; keys written
 * as the Hub's configs have them; what it does not take refused by name. */
static void test_neox_fields(void) {
    accel_llama_config c;
    CHECK(accel_llama_config_load(write_cfg("neoxd.json", "{\"model_type\": \"gpt_neox\"}"), &c) == ACCEL_OK);
    CHECK(c.vocab_size == 50432 && c.hidden_size == 6144 && c.intermediate_size == 24576 && c.num_hidden_layers == 44);
    CHECK(c.num_attention_heads == 64 && c.num_key_value_heads == 64 && c.rms_norm_eps == 1e-5);
    CHECK(c.partial_rotary_factor == 0.25 && c.rope_theta == 10000 && !c.tie_word_embeddings && c.attention_bias);
    CHECK(!c.sequential_residual && c.attn_pdrop == 0 && c.resid_pdrop == 0 && c.embd_pdrop == 0);
    CHECK(c.bos_token_id == 0 && c.n_eos_token_ids == 1 && c.eos_token_ids[0] == 2 && c.pad_token_id == -1);
    const char *neox = "{\"model_type\": \"gpt_neox\", \"hidden_size\": 64, \"num_attention_heads\": 4, "
                       "\"layer_norm_eps\": 0.001, \"rms_norm_eps\": 0.5, \"hidden_dropout\": 0.1, "
                       "\"attention_dropout\": 0.3, \"hidden_act\": \"gelu\", \"use_parallel_residual\": false, "
                       "\"rotary_emb_base\": 500, \"rotary_pct\": 0.5, \"rope_theta\": 7, "
                       "\"partial_rotary_factor\": 1.0, \"attention_bias\": false, \"tie_word_embeddings\": true}";
    CHECK_MSG(accel_llama_config_load(write_cfg("neox.json", neox), &c) == ACCEL_OK, "%s", accel_last_error());
    CHECK(c.rms_norm_eps == 0.001 && c.resid_pdrop == 0.1 && c.embd_pdrop == 0.1 && c.attn_pdrop == 0.3);
    CHECK(c.sequential_residual && c.rope_theta == 500 && c.partial_rotary_factor == 0.5 && !c.attention_bias);
    char path[160];
    snprintf(path, sizeof path, "%s/neox_saved", g_dir);
    CHECK(accel_llama_config_save(path, &c) == ACCEL_OK);
    char file[200], text[4096] = {0};
    snprintf(file, sizeof file, "%s/config.json", path);
    FILE *f = fopen(file, "r");
    CHECK(f && fread(text, 1, sizeof text - 1, f) > 0);
    if (f) fclose(f);
    CHECK_STR_CONTAINS(text, "\n  \"attention_bias\": false,\n  \"attention_dropout\": 0.3,\n  \"bos_token_id\": 0,\n");
    CHECK_STR_CONTAINS(text, "\n  \"hidden_act\": \"gelu\",\n  \"hidden_dropout\": 0.1,\n");
    CHECK_STR_CONTAINS(text, "\n  \"layer_norm_eps\": 0.001,\n");
    CHECK_STR_CONTAINS(text, "\n  \"rope_scaling\": null,\n  \"rotary_emb_base\": 500.0,\n  \"rotary_pct\": 0.5,\n");
    CHECK_STR_CONTAINS(text, "\n  \"use_parallel_residual\": false,\n");
    CHECK(!strstr(text, "head_dim") && !strstr(text, "rms_norm_eps") && !strstr(text, "rope_theta") &&
          !strstr(text, "partial_rotary_factor") && !strstr(text, "num_key_value_heads") && !strstr(text, "pdrop"));
    accel_llama_config back;
    CHECK(accel_llama_config_load(path, &back) == ACCEL_OK && back.sequential_residual && back.rope_theta == 500 &&
          back.partial_rotary_factor == 0.5 && back.resid_pdrop == 0.1 && back.embd_pdrop == 0.1 &&
          back.attn_pdrop == 0.3 && back.tie_word_embeddings && !back.attention_bias);
    /* rope_parameters' own theta and factor win over rotary_emb_base / rotary_pct (GPTNeoXConfig's setdefault) */
    CHECK(accel_llama_config_load(write_cfg("neoxr.json", "{\"model_type\": \"gpt_neox\", \"rotary_pct\": 0.5, "
                                            "\"rotary_emb_base\": 500, \"rope_parameters\": {\"rope_type\": "
                                            "\"linear\", \"factor\": 2.0, \"rope_theta\": 300.0, "
                                            "\"partial_rotary_factor\": 0.75}}"), &c) == ACCEL_OK);
    CHECK(c.rope_theta == 300 && c.partial_rotary_factor == 0.75 && c.rope_scaling.type == ACCEL_ROPE_LINEAR);
    /* one hidden_dropout: embd_pdrop and resid_pdrop apart refused, in the check and the save */
    c.embd_pdrop = 0.2;
    CHECK(accel_llama_config_check(&c, "t") == ACCEL_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(accel_last_error(), "t: gpt_neox models have one hidden_dropout");
    CHECK(accel_llama_config_save(path, &c) == ACCEL_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_llama_config_save: gpt_neox models have one hidden_dropout for the "
                                           "embeddings and the branches: embd_pdrop (0.2) must equal resid_pdrop (0)");
    accel_llama_config l = accel_llama_config_default();
    l.sequential_residual = true;
    CHECK(accel_llama_config_check(&l, "t") == ACCEL_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(accel_last_error(), "t: sequential_residual (GPT-NeoX's and StableLM's use_parallel_residual "
                                           "false) is set");
    expect_error("neoxn.json", "{\"model_type\": \"gpt_neox\", \"use_parallel_residual\": null}", ACCEL_ERR_FORMAT,
                 "'use_parallel_residual' must be true or false");
    expect_error("neoxa.json", "{\"model_type\": \"gpt_neox\", \"hidden_act\": \"relu\"}", ACCEL_ERR_UNSUPPORTED,
                 "hidden_act must be \"gelu\" or the tanh GELU \"gelu_fast\", \"gelu_new\" or \"gelu_pytorch_tanh\"");
    /* GPT-NeoX-20B's gelu_fast (the tanh GELU) read and written back under its name; on another family refused */
    accel_llama_config fast;
    CHECK_MSG(accel_llama_config_load(write_cfg("neoxf.json", "{\"model_type\": \"gpt_neox\", \"hidden_act\": "
                                                "\"gelu_fast\"}"), &fast) == ACCEL_OK && fast.neox_hidden_act == 1,
              "%s", accel_last_error());
    snprintf(path, sizeof path, "%s/neox_fast", g_dir);
    CHECK(accel_llama_config_save(path, &fast) == ACCEL_OK);
    snprintf(file, sizeof file, "%s/config.json", path);
    memset(text, 0, sizeof text);
    f = fopen(file, "r");
    CHECK(f && fread(text, 1, sizeof text - 1, f) > 0);
    if (f) fclose(f);
    CHECK_STR_CONTAINS(text, "\n  \"hidden_act\": \"gelu_fast\",\n");
    accel_llama_config other = accel_llama_config_default();
    other.neox_hidden_act = 2;
    CHECK(accel_llama_config_save(path, &other) == ACCEL_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_llama_config_save: neox_hidden_act 2: 0 to 3 (gelu, gelu_fast, "
                                           "gelu_new, gelu_pytorch_tanh), and gpt_neox models only (llama here)");
    CHECK(accel_llama_new(&other, ACCEL_META_DEVICE) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "neox_hidden_act 2: 0 to 3 (gelu, gelu_fast, gelu_new, gelu_pytorch_tanh), "
                                           "and gpt_neox models only (llama here)");
    expect_error("neoxp.json", "{\"model_type\": \"gpt_neox\", \"rotary_pct\": 0}", ACCEL_ERR_FORMAT,
                 "'rotary_pct' must be a number in (0, 1]");
    expect_error("neoxh.json", "{\"model_type\": \"gpt_neox\", \"hidden_dropout\": 2}", ACCEL_ERR_FORMAT,
                 "'hidden_dropout' must be a number in [0, 1]");
    expect_error("neoxk.json", "{\"model_type\": \"gpt_neox\", \"num_key_value_heads\": 8}", ACCEL_ERR_FORMAT,
                 "gpt_neox models have num_key_value_heads = num_attention_heads");
}

static void test_phi3_olmo2(void) {
    accel_llama_config c;
    CHECK(accel_llama_config_load(write_cfg("phi3d.json", "{\"model_type\": \"phi3\"}"), &c) == ACCEL_OK);
    CHECK(c.vocab_size == 32064 && c.hidden_size == 3072 && c.intermediate_size == 8192 && c.rms_norm_eps == 1e-5);
    CHECK(c.max_position_embeddings == 4096 && c.rope_scaling.original_max_position_embeddings == 4096);
    CHECK(accel_llama_config_load(write_cfg("olmo2d.json", "{\"model_type\": \"olmo2\"}"), &c) == ACCEL_OK);
    CHECK(c.vocab_size == 50304 && c.hidden_size == 4096 && c.rms_norm_eps == 1e-5 && c.max_position_embeddings == 2048);
    const char *phi = "{\"model_type\": \"phi3\", \"hidden_size\": 64, \"num_attention_heads\": 4, "
                      "\"partial_rotary_factor\": 0.5, \"original_max_position_embeddings\": 32, "
                      "\"max_position_embeddings\": 128, \"sliding_window\": 16, "
                      "\"rope_scaling\": {\"type\": \"su\", \"short_factor\": [1, 1.5, 2, 3], "
                      "\"long_factor\": [2, 3, 4, 5]}}";
    CHECK_MSG(accel_llama_config_load(write_cfg("phi3.json", phi), &c) == ACCEL_OK, "%s", accel_last_error());
    CHECK(c.partial_rotary_factor == 0.5 && c.rope_scaling.type == ACCEL_ROPE_LONGROPE && c.rope_scaling.n_factors == 4);
    CHECK(c.rope_scaling.original_max_position_embeddings == 32 && c.sliding_window == 16);
    char path[160];
    snprintf(path, sizeof path, "%s/phi3_saved", g_dir);
    CHECK(accel_llama_config_save(path, &c) == ACCEL_OK);
    accel_llama_config back;
    CHECK_MSG(accel_llama_config_load(path, &back) == ACCEL_OK, "%s", accel_last_error());
    CHECK(back.partial_rotary_factor == 0.5 && same_rope(&back.rope_scaling, &c.rope_scaling) &&
          back.sliding_window == 16 && !strcmp(back.model_type, "phi3"));
    char file[200], text[4096] = {0};
    snprintf(file, sizeof file, "%s/config.json", path);
    FILE *f = fopen(file, "r");
    CHECK(f && fread(text, 1, sizeof text - 1, f) > 0);
    if (f) fclose(f);
    /* transformers' Phi3Config takes the top-level value over rope_scaling's */
    CHECK_STR_CONTAINS(text, "\n  \"original_max_position_embeddings\": 32,");
    CHECK_STR_CONTAINS(text, "\n  \"partial_rotary_factor\": 0.5,");
    /* the factors count the rotary dims: 16 * 0.5 / 2 = 4, not head_dim / 2 */
    expect_error("phi3f.json", "{\"model_type\": \"phi3\", \"hidden_size\": 64, \"num_attention_heads\": 4, "
                 "\"partial_rotary_factor\": 0.5, \"rope_scaling\": {\"type\": \"longrope\", "
                 "\"short_factor\": [1, 1, 1, 1, 1, 1, 1, 1], \"long_factor\": [1, 1, 1, 1, 1, 1, 1, 1]}}",
                 ACCEL_ERR_FORMAT, "(head_dim 16, rotary dims 8)");
    expect_error("phi3r.json", "{\"model_type\": \"phi3\", \"resid_pdrop\": 0.1}", ACCEL_ERR_UNSUPPORTED,
                 "resid_pdrop other than 0.0 is not implemented");
    expect_error("phi3e.json", "{\"model_type\": \"phi3\", \"embd_pdrop\": 0.1}", ACCEL_ERR_UNSUPPORTED,
                 "embd_pdrop other than 0.0");
    expect_error("phi3b.json", "{\"model_type\": \"phi3\", \"attention_bias\": true}", ACCEL_ERR_UNSUPPORTED,
                 "attention_bias is true, but phi3 models have no such bias");
    expect_error("phi3p.json", "{\"model_type\": \"phi3\", \"partial_rotary_factor\": 1.5}", ACCEL_ERR_FORMAT,
                 "partial_rotary_factor 1.5 must be in (0, 1]");
    /* an explicit 0 rotates no dims in transformers: refused, not read as the struct's "unset" (all) */
    expect_error("phi3z.json", "{\"model_type\": \"phi3\", \"partial_rotary_factor\": 0}", ACCEL_ERR_FORMAT,
                 "partial_rotary_factor 0 must be in (0, 1]");
    expect_error("phi3z2.json", "{\"model_type\": \"phi3\", \"partial_rotary_factor\": 0.5, \"rope_parameters\": "
                 "{\"rope_type\": \"default\", \"partial_rotary_factor\": 0.0}}", ACCEL_ERR_FORMAT,
                 "partial_rotary_factor 0 must be in (0, 1]");
    expect_error("llamaz.json", "{\"partial_rotary_factor\": 0}", ACCEL_ERR_FORMAT,
                 "partial_rotary_factor 0 must be in (0, 1]");
    /* Phi3Config refuses every RoPE type but default and longrope ("su" and "yarn" are longrope) */
    expect_error("phi3l.json", "{\"model_type\": \"phi3\", \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2}}",
                 ACCEL_ERR_UNSUPPORTED, "rope_scaling of type \"linear\" is not one phi3 models take (default, longrope)");
    expect_error("phi3d3.json", "{\"model_type\": \"phi3\", \"rope_parameters\": {\"rope_type\": \"llama3\", "
                 "\"factor\": 2, \"low_freq_factor\": 1, \"high_freq_factor\": 4}}",
                 ACCEL_ERR_UNSUPPORTED, "rope_parameters of type \"llama3\" is not one phi3 models take");
    expect_error("olmo2p.json", "{\"model_type\": \"olmo2\", \"partial_rotary_factor\": 0.5}",
                 ACCEL_ERR_UNSUPPORTED, "partial_rotary_factor other than 1.0 is not implemented for olmo2 models");
    expect_error("olmo2r.json", "{\"model_type\": \"olmo2\", \"rope_parameters\": {\"rope_type\": \"default\", "
                 "\"partial_rotary_factor\": 0.25}}", ACCEL_ERR_UNSUPPORTED, "partial_rotary_factor");
    expect_error("olmo2w.json", "{\"model_type\": \"olmo2\", \"sliding_window\": 8}", ACCEL_ERR_UNSUPPORTED,
                 "sliding_window is set, but olmo2 models have none");
    expect_error("olmo2s.json", "{\"model_type\": \"olmo2\", \"rope_scaling\": {\"type\": \"su\"}}",
                 ACCEL_ERR_UNSUPPORTED, "rope_scaling of type \"su\" is not supported");
    /* the C API: Phi-3 with a RoPE type transformers refuses */
    accel_llama_config p = c;
    p.rope_scaling = (accel_rope_scaling){.type = ACCEL_ROPE_YARN, .factor = 2, .original_max_position_embeddings = 32};
    CHECK(accel_llama_config_check(&p, "t") == ACCEL_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(accel_last_error(), "t: rope_scaling of type \"yarn\" is not one phi3 models take");
    /* the C API: a family without partial rotary refuses the field */
    accel_llama_config l = accel_llama_config_default();
    l.partial_rotary_factor = 0.5;
    CHECK(accel_llama_config_check(&l, "t") == ACCEL_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(accel_last_error(), "partial_rotary_factor 0.5 is not implemented for llama models");
    accel_clear_error();
}

/* The text of path/config.json (a NUL-terminated static buffer). */
static const char *read_saved(const char *path) {
    static char text[8192];
    char file[200];
    snprintf(file, sizeof file, "%s/config.json", path);
    FILE *f = fopen(file, "r");
    size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
    text[n] = 0;
    CHECK(f && n > 0);
    if (f) fclose(f);
    return text;
}

/* bos_token_id / eos_token_id / pad_token_id: a saved config.json has the
 * ones the loaded one had, else the family's transformers defaults (not
 * Llama's 1 / 2; pad null). */
static void test_token_ids(void) {
    static const struct { const char *json, *bos, *eos, *pad; } CASES[] = {
        {"{\"model_type\": \"gemma\"}", "\"bos_token_id\": 2,", "\"eos_token_id\": 1,", "\"pad_token_id\": null,"},
        {"{\"model_type\": \"phi3\"}", "\"bos_token_id\": 1,", "\"eos_token_id\": 32000,", "\"pad_token_id\": null,"},
        {"{\"model_type\": \"qwen2\", \"pad_token_id\": null}", "\"bos_token_id\": null,", "\"eos_token_id\": null,",
         "\"pad_token_id\": null,"},
        {"{\"model_type\": \"olmo2\", \"pad_token_id\": 1}", "\"bos_token_id\": null,", "\"eos_token_id\": 50279,",
         "\"pad_token_id\": 1,"},
        {"{\"model_type\": \"gpt2\", \"n_embd\": 32, \"n_head\": 4, \"pad_token_id\": 50256}", "\"bos_token_id\": 50256,",
         "\"eos_token_id\": 50256,", "\"n_positions\": 1024,\n  \"pad_token_id\": 50256,\n  \"reorder"},
        {"{\"model_type\": \"llama\", \"pad_token_id\": 0}", "\"bos_token_id\": 1,", "\"eos_token_id\": 2,",
         "\"pad_token_id\": 0,"},
        {"{\"bos_token_id\": 128000, \"eos_token_id\": [128001, 128008, 128009]}", "\"bos_token_id\": 128000,",
         "\"eos_token_id\": [\n    128001,\n    128008,\n    128009\n  ],", "\"pad_token_id\": null,"},
        {"{\"model_type\": \"gemma2\", \"bos_token_id\": null, \"eos_token_id\": [107]}", "\"bos_token_id\": null,",
         "\"eos_token_id\": [\n    107\n  ],", "\"pad_token_id\": null,"},
    };
    for (size_t i = 0; i < sizeof CASES / sizeof *CASES; i++) {
        char name[32], path[160];
        snprintf(name, sizeof name, "tok%zu.json", i);
        snprintf(path, sizeof path, "%s/tok%zu_saved", g_dir, i);
        accel_llama_config c, back;
        CHECK_MSG(accel_llama_config_load(write_cfg(name, CASES[i].json), &c) == ACCEL_OK, "%s", accel_last_error());
        CHECK_MSG(accel_llama_config_save(path, &c) == ACCEL_OK, "%s", accel_last_error());
        const char *text = read_saved(path);
        CHECK_STR_CONTAINS(text, CASES[i].bos);
        CHECK_STR_CONTAINS(text, CASES[i].eos);
        CHECK_STR_CONTAINS(text, CASES[i].pad);
        CHECK(accel_llama_config_load(path, &back) == ACCEL_OK && back.bos_token_id == c.bos_token_id &&
              back.pad_token_id == c.pad_token_id &&
              back.n_eos_token_ids == c.n_eos_token_ids && back.eos_is_list == c.eos_is_list &&
              !memcmp(back.eos_token_ids, c.eos_token_ids, sizeof c.eos_token_ids));
    }
    /* a C-API config that sets none: the family's defaults */
    accel_llama_config z = {.vocab_size = 64, .hidden_size = 32, .intermediate_size = 64, .num_hidden_layers = 1,
                            .num_attention_heads = 2, .max_position_embeddings = 64, .rms_norm_eps = 1e-6,
                            .rope_theta = 10000.0, .torch_dtype = ACCEL_F32, .model_type = "gemma"};
    char path[160];
    snprintf(path, sizeof path, "%s/tok_c_api", g_dir);
    CHECK(accel_llama_config_save(path, &z) == ACCEL_OK);
    const char *text = read_saved(path);
    CHECK_STR_CONTAINS(text, "\"bos_token_id\": 2,");
    CHECK_STR_CONTAINS(text, "\"eos_token_id\": 1,");
    expect_error("tokb.json", "{\"bos_token_id\": \"<s>\"}", ACCEL_ERR_FORMAT, "bos_token_id");
    expect_error("toke.json", "{\"eos_token_id\": []}", ACCEL_ERR_FORMAT, "eos_token_id");
    expect_error("tokp.json", "{\"pad_token_id\": -1}", ACCEL_ERR_FORMAT, "pad_token_id");
    /* generation_config.json's ids over config.json's; none: unchanged */
    accel_llama_config g;
    CHECK(accel_llama_config_load(write_cfg("g.json", "{\"pad_token_id\": 4, \"eos_token_id\": 2}"), &g) == ACCEL_OK);
    CHECK(accel_generation_config_load(g_dir, &g) == ACCEL_OK && g.pad_token_id == 4 && g.eos_token_ids[0] == 2);
    write_cfg("generation_config.json", "{\"pad_token_id\": 0, \"eos_token_id\": [7, 9], \"do_sample\": true}");
    CHECK(accel_generation_config_load(g_dir, &g) == ACCEL_OK && g.pad_token_id == 0 && g.n_eos_token_ids == 2 &&
          g.eos_token_ids[1] == 9 && g.bos_token_id == 1);
    write_cfg("generation_config.json", "{\"pad_token_id\": \"<pad>\"}");
    CHECK(accel_generation_config_load(g_dir, &g) == ACCEL_ERR_FORMAT);
    CHECK_STR_CONTAINS(accel_last_error(), "generation_config.json: 'pad_token_id'");
    accel_clear_error();
    char gc[320];
    snprintf(gc, sizeof gc, "%s/generation_config.json", g_dir);
    CHECK(remove(gc) == 0);
    expect_error("toke9.json", "{\"eos_token_id\": [1, 2, 3, 4, 5, 6, 7, 8, 9]}", ACCEL_ERR_FORMAT,
                 "a list of 1 to 8 of them");
}

/* RoPE and sliding-window corner cases of transformers' configs, and the C API's
 * config check on what a file could not say. */
static void test_rope_window_edges(void) {
    accel_llama_config c;
    /* Qwen2/3 with use_sliding_window and no sliding_window: transformers' 4096 */
    const char *qwen[] = {"qwen2", "qwen3"};
    for (int i = 0; i < 2; i++) {
        char text[256];
        snprintf(text, sizeof text, "{\"model_type\": \"%s\", \"use_sliding_window\": true, \"hidden_size\": 64, "
                 "\"num_attention_heads\": 4, \"head_dim\": 16}", qwen[i]);
        CHECK_MSG(accel_llama_config_load(write_cfg("qw.json", text), &c) == ACCEL_OK, "%s", accel_last_error());
        CHECK_MSG(c.sliding_window == 4096, "%s: sliding_window %lld", qwen[i], (long long)c.sliding_window);
    }
    /* a top-level original_max_position_embeddings beats both rope_scaling's and rope_parameters' */
    CHECK_MSG(accel_llama_config_load(write_cfg("orig.json",
                                                "{\"original_max_position_embeddings\": 64, \"rope_scaling\": {\"rope_type\": "
                                                "\"yarn\", \"factor\": 2, \"original_max_position_embeddings\": 32}, "
                                                "\"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 2, "
                                                "\"original_max_position_embeddings\": 16}}"),
                                      &c) == ACCEL_OK,
              "%s", accel_last_error());
    CHECK_MSG(c.rope_scaling.original_max_position_embeddings == 64, "got %lld",
              (long long)c.rope_scaling.original_max_position_embeddings);
    /* llama3 needs the pretraining length (transformers requires the key) */
    expect_error("l3.json", "{\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 1, "
                 "\"high_freq_factor\": 4}}", ACCEL_ERR_FORMAT, "llama3 rope_scaling needs original_max_position_embeddings");
    /* yarn mscale < 0 */
    expect_error("ym.json", "{\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 2, \"mscale\": -1}}", ACCEL_ERR_FORMAT,
                 "mscale_all_dim must be finite and >= 0");
    expect_error("yma.json", "{\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 2, \"mscale_all_dim\": -0.5}}",
                 ACCEL_ERR_FORMAT, "mscale_all_dim must be finite and >= 0");
    /* the C API: longrope with more factors than the arrays hold */
    accel_llama_config w = {.vocab_size = 16, .hidden_size = 1024, .intermediate_size = 16, .num_hidden_layers = 1,
                            .num_attention_heads = 1, .num_key_value_heads = 1, .head_dim = 1024,
                            .max_position_embeddings = 64, .rms_norm_eps = 1e-6, .rope_theta = 10000.0,
                            .initializer_range = 0.02, .torch_dtype = ACCEL_F32};
    w.rope_scaling = (accel_rope_scaling){.type = ACCEL_ROPE_LONGROPE, .n_factors = 512};
    CHECK(accel_llama_config_check(&w, "cfg") == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "n_factors must be in [1, ACCEL_ROPE_MAX_FACTORS]");
    w.rope_scaling.n_factors = -3;
    CHECK(accel_llama_config_check(&w, "cfg") == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "n_factors must be in [1, ACCEL_ROPE_MAX_FACTORS]");
    accel_clear_error();
}

/* Mixtral, Qwen3-MoE and Qwen2-MoE: transformers' defaults, the expert keys read under
 * either name, each bad value refused by name, what no family reads refused
 * from the C struct, and a save that loads back to the same fields. */
static void test_moe_fields(void) {
    accel_llama_config c;
    CHECK(accel_llama_config_load(write_cfg("mx.json", "{\"model_type\": \"mixtral\"}"), &c) == ACCEL_OK);
    CHECK(c.num_local_experts == 8 && c.num_experts_per_tok == 2 && c.rms_norm_eps == 1e-5 && c.rope_theta == 1e6 &&
          c.num_key_value_heads == 8 && c.sliding_window == 0 && c.router_aux_loss_coef == 0.001 &&
          !c.output_router_logits && c.moe_intermediate_size == 0);
    CHECK(accel_llama_config_load(write_cfg("qm.json", "{\"model_type\": \"qwen3_moe\"}"), &c) == ACCEL_OK);
    CHECK(c.num_local_experts == 128 && c.num_experts_per_tok == 8 && c.moe_intermediate_size == 768 &&
          c.decoder_sparse_step == 1 && !c.norm_topk_prob && c.sliding_window == 0);
    /* the Hub's num_experts, transformers 5's num_local_experts (which wins) */
    CHECK(accel_llama_config_load(write_cfg("qm2.json", "{\"model_type\": \"qwen3_moe\", \"num_experts\": 6, "
                                            "\"num_experts_per_tok\": 2}"), &c) == ACCEL_OK && c.num_local_experts == 6);
    CHECK(accel_llama_config_load(write_cfg("qm3.json", "{\"model_type\": \"qwen3_moe\", \"num_experts\": 6, "
                                            "\"num_local_experts\": 4, \"num_experts_per_tok\": 2}"), &c) == ACCEL_OK &&
          c.num_local_experts == 4);
    /* MixtralConfig.from_dict takes num_experts over num_local_experts, in either order */
    CHECK(accel_llama_config_load(write_cfg("mx3.json", "{\"model_type\": \"mixtral\", \"num_local_experts\": 8, "
                                            "\"num_experts\": 4}"), &c) == ACCEL_OK && c.num_local_experts == 4);
    /* Qwen3-MoE's window: every layer with use_sliding_window; max_window_layers unread */
    CHECK(accel_llama_config_load(write_cfg("qm4.json", "{\"model_type\": \"qwen3_moe\", \"use_sliding_window\": true, "
                                            "\"sliding_window\": 8, \"max_window_layers\": 3}"), &c) == ACCEL_OK);
    const accel__arch *qa = accel__arch_find("qwen3_moe");
    CHECK(c.sliding_window == 8 && accel__arch_layer_windowed(qa, &c, 0) && accel__arch_layer_windowed(qa, &c, 5));
    /* decoder_sparse_step 2: layers 1, 3, ... sparse */
    c.decoder_sparse_step = 2;
    CHECK(!accel__arch_layer_sparse(qa, &c, 0) && accel__arch_layer_sparse(qa, &c, 1) &&
          !accel__arch_layer_sparse(qa, &c, 2));
    c.num_local_experts = 0; /* Qwen's num_experts 0: every layer dense */
    CHECK(!accel__arch_layer_sparse(qa, &c, 1));
    /* mlp_only_layers: those layers dense whatever decoder_sparse_step says */
    CHECK(accel_llama_config_load(write_cfg("qm5.json", "{\"model_type\": \"qwen3_moe\", \"num_hidden_layers\": 4, "
                                            "\"mlp_only_layers\": [2, 0, 2]}"), &c) == ACCEL_OK);
    CHECK(c.n_mlp_only_layers == 3 && c.mlp_only_layers[1] == 0);
    CHECK(!accel__arch_layer_sparse(qa, &c, 0) && accel__arch_layer_sparse(qa, &c, 1) &&
          !accel__arch_layer_sparse(qa, &c, 2) && accel__arch_layer_sparse(qa, &c, 3));
    CHECK(accel_llama_config_load(write_cfg("qm6.json", "{\"model_type\": \"qwen3_moe\", \"mlp_only_layers\": null}"),
                                  &c) == ACCEL_OK && c.n_mlp_only_layers == 0);

    /* Qwen2-MoE: Qwen2MoeConfig's defaults (Qwen1.5-MoE-A2.7B's sizes) */
    const accel__arch *q2 = accel__arch_find("qwen2_moe");
    CHECK(accel_llama_config_load(write_cfg("q2.json", "{\"model_type\": \"qwen2_moe\"}"), &c) == ACCEL_OK);
    CHECK(c.num_local_experts == 60 && c.num_experts_per_tok == 4 && c.moe_intermediate_size == 1408 &&
          c.shared_expert_intermediate_size == 5632 && c.intermediate_size == 5632 && c.hidden_size == 2048 &&
          c.num_hidden_layers == 24 && c.num_attention_heads == 16 && c.num_key_value_heads == 16 &&
          c.decoder_sparse_step == 1 && !c.norm_topk_prob && c.sliding_window == 0 && c.max_window_layers == 28 &&
          c.router_aux_loss_coef == 0.001 && c.n_mlp_only_layers == 0 && c.attention_bias);
    CHECK(accel_llama_config_load(write_cfg("q2b.json", "{\"model_type\": \"qwen2_moe\", \"num_experts\": 6, "
                                            "\"num_experts_per_tok\": 2, \"shared_expert_intermediate_size\": 40, "
                                            "\"qkv_bias\": true}"), &c) == ACCEL_OK);
    CHECK(c.num_local_experts == 6 && c.shared_expert_intermediate_size == 40 && c.attention_bias);
    /* transformers 5 writes sliding_window 0 with use_sliding_window off */
    CHECK(accel_llama_config_load(write_cfg("q2i.json", "{\"model_type\": \"qwen2_moe\", \"sliding_window\": 0}"),
                                  &c) == ACCEL_OK && c.sliding_window == 0);
    /* Qwen2MoeConfig reads num_experts only (no attribute map to num_local_experts) */
    CHECK(accel_llama_config_load(write_cfg("q2h.json", "{\"model_type\": \"qwen2_moe\", \"num_experts\": 6, "
                                            "\"num_local_experts\": 4, \"num_experts_per_tok\": 2}"), &c) == ACCEL_OK &&
          c.num_local_experts == 6);
    /* its window: the even layers below max_window_layers, with use_sliding_window */
    CHECK(accel_llama_config_load(write_cfg("q2c.json", "{\"model_type\": \"qwen2_moe\", \"num_hidden_layers\": 5, "
                                            "\"use_sliding_window\": true, \"sliding_window\": 8, "
                                            "\"max_window_layers\": 3, \"layer_types\": [\"sliding_attention\", "
                                            "\"full_attention\", \"sliding_attention\", \"full_attention\", "
                                            "\"full_attention\"]}"), &c) == ACCEL_OK);
    CHECK(c.sliding_window == 8 && accel__arch_layer_windowed(q2, &c, 0) && !accel__arch_layer_windowed(q2, &c, 1) &&
          accel__arch_layer_windowed(q2, &c, 2) && !accel__arch_layer_windowed(q2, &c, 3) &&
          !accel__arch_layer_windowed(q2, &c, 4));
    expect_error("q2d.json", "{\"model_type\": \"qwen2_moe\", \"num_hidden_layers\": 2, \"layer_types\": "
                 "[\"sliding_attention\", \"full_attention\"]}", ACCEL_ERR_UNSUPPORTED,
                 "layer_types[0] is not \"full_attention\": only transformers' default (sliding_attention on the even "
                 "layers below max_window_layers with use_sliding_window) is implemented");
    /* Qwen2MoeConfig's even layers slide then, and its forward fails on the missing window */
    expect_error("q2n.json", "{\"model_type\": \"qwen2_moe\", \"use_sliding_window\": true, \"sliding_window\": null}",
                 ACCEL_ERR_FORMAT, "'sliding_window' must be a positive integer with use_sliding_window");
    /* qkv_bias: q/k/v's biases (held in attention_bias), o_proj's never; null fails Qwen2MoeConfig's validation */
    CHECK(accel_llama_config_load(write_cfg("q2e.json", "{\"model_type\": \"qwen2_moe\", \"qkv_bias\": false}"),
                                  &c) == ACCEL_OK && !c.attention_bias);
    check_attention_biases("q2j.json", "\"model_type\": \"qwen2_moe\", \"qkv_bias\": false", false, false);
    check_attention_biases("q2k.json", "\"model_type\": \"qwen2_moe\", \"qkv_bias\": true", true, false);
    expect_error("q2l.json", "{\"model_type\": \"qwen2_moe\", \"qkv_bias\": null}", ACCEL_ERR_FORMAT,
                 "'qkv_bias' must be true or false");
    /* Qwen2Config has no qkv_bias: the key is unread, q/k/v biased as ever */
    check_attention_biases("q2m.json", "\"model_type\": \"qwen2\", \"qkv_bias\": false", true, false);
    expect_error("q2f.json", "{\"model_type\": \"qwen2_moe\", \"shared_expert_intermediate_size\": 0}",
                 ACCEL_ERR_FORMAT, "'shared_expert_intermediate_size' must be a positive integer");
    expect_error("q2g.json", "{\"model_type\": \"qwen2_moe\", \"attention_bias\": true}", ACCEL_ERR_UNSUPPORTED,
                 "attention_bias is true, but qwen2_moe models take their q/k/v biases from qkv_bias (o_proj has none)");
    expect_error("q2h.json", "{\"model_type\": \"qwen2_moe\", \"mlp_bias\": true}", ACCEL_ERR_UNSUPPORTED,
                 "mlp_bias is true, but qwen2_moe models have no such bias");

    expect_error("me1.json", "{\"model_type\": \"mixtral\", \"num_local_experts\": 0}", ACCEL_ERR_FORMAT,
                 "'num_local_experts' must be a positive integer");
    expect_error("me2.json", "{\"model_type\": \"mixtral\", \"num_local_experts\": 4, \"num_experts_per_tok\": 5}",
                 ACCEL_ERR_FORMAT, "num_experts_per_tok must be in [1, the number of experts]");
    /* mlp_only_layers: integers, each a layer index (transformers ignores one
     * past the layers or negative: a typo accel refuses by name) */
    expect_error("me3.json", "{\"model_type\": \"qwen3_moe\", \"mlp_only_layers\": [1, 24]}", ACCEL_ERR_FORMAT,
                 "mlp_only_layers[1] is 24, not a layer index in [0, num_hidden_layers 24)");
    expect_error("me3b.json", "{\"model_type\": \"qwen2_moe\", \"mlp_only_layers\": [-1]}", ACCEL_ERR_FORMAT,
                 "mlp_only_layers[0] is -1, not a layer index");
    expect_error("me3c.json", "{\"model_type\": \"qwen3_moe\", \"mlp_only_layers\": [0, 1.0]}", ACCEL_ERR_FORMAT,
                 "mlp_only_layers[1] must be an integer (a layer index)");
    expect_error("me3d.json", "{\"model_type\": \"qwen2_moe\", \"mlp_only_layers\": [true]}", ACCEL_ERR_FORMAT,
                 "mlp_only_layers[0] must be an integer (a layer index)");
    expect_error("me4.json", "{\"model_type\": \"qwen3_moe\", \"mlp_only_layers\": 1}", ACCEL_ERR_FORMAT,
                 "'mlp_only_layers' must be a list of layer indices");
    expect_error("me5.json", "{\"model_type\": \"mixtral\", \"router_jitter_noise\": 1.5}", ACCEL_ERR_FORMAT,
                 "router_jitter_noise must be in [0, 1)");
    expect_error("me6.json", "{\"model_type\": \"qwen3_moe\", \"moe_intermediate_size\": 0}", ACCEL_ERR_FORMAT,
                 "'moe_intermediate_size' must be a positive integer");
    expect_error("me7.json", "{\"model_type\": \"mixtral\", \"router_aux_loss_coef\": -1}", ACCEL_ERR_FORMAT,
                 "router_aux_loss_coef must be finite and >= 0");
    expect_error("me8.json", "{\"model_type\": \"qwen3_moe\", \"norm_topk_prob\": 1}", ACCEL_ERR_FORMAT,
                 "'norm_topk_prob' must be true or false");
    expect_error("me9.json", "{\"model_type\": \"qwen3_moe\", \"num_experts\": 65537}", ACCEL_ERR_FORMAT,
                 "num_experts must be in [0, 65536]");
    /* null where transformers' strict configs refuse it (no None for these fields) */
    expect_error("me10.json", "{\"model_type\": \"mixtral\", \"router_aux_loss_coef\": null}", ACCEL_ERR_FORMAT,
                 "'router_aux_loss_coef' must be a number");
    expect_error("me11.json", "{\"model_type\": \"qwen3_moe\", \"norm_topk_prob\": null}", ACCEL_ERR_FORMAT,
                 "'norm_topk_prob' must be true or false");
    expect_error("me12.json", "{\"model_type\": \"mixtral\", \"output_router_logits\": null}", ACCEL_ERR_FORMAT,
                 "'output_router_logits' must be true or false");
    expect_error("me13.json", "{\"model_type\": \"mixtral\", \"router_jitter_noise\": null}", ACCEL_ERR_FORMAT,
                 "'router_jitter_noise' must be a number");
    /* from the C struct: a field no family of its kind reads */
    accel_llama_config l = accel_llama_config_default();
    l.num_local_experts = 4;
    CHECK(accel_llama_config_check(&l, "t") == ACCEL_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(accel_last_error(), "t: num_local_experts is set, but llama models have no experts");
    accel_llama_config mx = accel__arch_find("mixtral")->defaults;
    mx.moe_intermediate_size = 64;
    CHECK(accel_llama_config_check(&mx, "t") == ACCEL_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(accel_last_error(), "moe_intermediate_size is set, but mixtral models do not read it");
    mx = accel__arch_find("mixtral")->defaults;
    mx.num_local_experts = 0;
    CHECK(accel_llama_config_check(&mx, "t") == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "num_local_experts must be in [1, 65536]");
    accel_llama_config q = accel__arch_find("qwen3_moe")->defaults;
    q.shared_expert_intermediate_size = 64;
    CHECK(accel_llama_config_check(&q, "t") == ACCEL_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(accel_last_error(), "shared_expert_intermediate_size is set, but qwen3_moe models do not read it");
    mx = accel__arch_find("mixtral")->defaults;
    mx.n_mlp_only_layers = 1;
    CHECK(accel_llama_config_check(&mx, "t") == ACCEL_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(accel_last_error(), "mlp_only_layers is set, but mixtral models do not read it");
    q = accel__arch_find("qwen2_moe")->defaults;
    q.n_mlp_only_layers = ACCEL_MAX_MLP_ONLY_LAYERS + 1;
    CHECK(accel_llama_config_check(&q, "t") == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "mlp_only_layers has 257 entries: at most 256");
    q = accel__arch_find("qwen2_moe")->defaults;
    q.shared_expert_intermediate_size = 0;
    CHECK(accel_llama_config_check(&q, "t") == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "shared_expert_intermediate_size must be positive");

    /* saved and loaded back: every expert field */
    accel_llama_config w[3] = {accel__arch_find("mixtral")->defaults, accel__arch_find("qwen3_moe")->defaults,
                                accel__arch_find("qwen2_moe")->defaults};
    w[0].num_local_experts = 6, w[0].num_experts_per_tok = 3, w[0].output_router_logits = true;
    w[0].router_aux_loss_coef = 0.0, w[0].router_jitter_noise = 0.01;
    w[1].num_local_experts = 0, w[1].num_experts_per_tok = 0, w[1].moe_intermediate_size = 0;
    w[1].decoder_sparse_step = 2; /* no experts: K and their size unused, written as the defaults */
    w[1].norm_topk_prob = true, w[1].router_aux_loss_coef = 0.02, w[1].sliding_window = 64;
    w[2].num_hidden_layers = 4, w[2].shared_expert_intermediate_size = 48, w[2].sliding_window = 16;
    w[2].max_window_layers = 3, w[2].n_mlp_only_layers = 2, w[2].mlp_only_layers[0] = 3, w[2].mlp_only_layers[1] = 0;
    for (int i = 0; i < 3; i++) {
        char path[160];
        snprintf(path, sizeof path, "%s/moe_%d.json", g_dir, i);
        CHECK_MSG(accel_llama_config_save(path, &w[i]) == ACCEL_OK, "%s", accel_last_error());
        accel_llama_config b;
        CHECK_MSG(accel_llama_config_load(path, &b) == ACCEL_OK, "%s", accel_last_error());
        CHECK_MSG(b.num_local_experts == w[i].num_local_experts &&
                      (b.num_experts_per_tok == w[i].num_experts_per_tok || (i == 1 && b.num_experts_per_tok == 8)) &&
                      (b.moe_intermediate_size == w[i].moe_intermediate_size || (i == 1 && b.moe_intermediate_size == 768)) &&
                      b.decoder_sparse_step == w[i].decoder_sparse_step && b.norm_topk_prob == w[i].norm_topk_prob &&
                      b.output_router_logits == w[i].output_router_logits &&
                      b.router_aux_loss_coef == w[i].router_aux_loss_coef &&
                      b.router_jitter_noise == w[i].router_jitter_noise && b.sliding_window == w[i].sliding_window &&
                      b.shared_expert_intermediate_size == w[i].shared_expert_intermediate_size &&
                      b.max_window_layers == w[i].max_window_layers && b.n_mlp_only_layers == w[i].n_mlp_only_layers &&
                      !memcmp(b.mlp_only_layers, w[i].mlp_only_layers, sizeof b.mlp_only_layers),
                  "%s: expert fields differ after a save", w[i].model_type);
    }
    accel_clear_error();
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/accel_cfg_XXXXXX");
    if (!mkdtemp(g_dir)) return 2;
    RUN(test_defaults);
    RUN(test_layouts);
    RUN(test_errors);
    RUN(test_hostile_values);
    RUN(test_save);
    RUN(test_big_file_few_reads);
    RUN(test_save_families);
    RUN(test_save_other_family_fields);
    RUN(test_gemma_granite_fields);
    RUN(test_gemma3_fields);
    RUN(test_rope_window_edges);
    RUN(test_phi3_olmo2);
    RUN(test_phi_fields);
    RUN(test_neox_fields);
    RUN(test_stablelm_fields);
    RUN(test_starcoder2_fields);
    RUN(test_token_ids);
    RUN(test_moe_fields);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd) != 0) return 2;
    accel_thread_cleanup();
    return check_summary();
}
