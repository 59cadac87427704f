/* The outside review's findings in the `accel` binary, one test each (every
 * one failed before its fix):
 *   `accel config` given an answer that is not UTF-8 said "cannot write
 *     ...: Success" (libyaml refused the string, errno was 0) for a YAML
 *     file, and for a JSON file dropped that key without a word (jansson
 *     refuses the string); the wizard now asks again, and cfg_write names
 *     the key;
 *   `accel estimate-memory`'s table (Accelerate's) counted lm_head, which
 *     Accelerate's AutoModel (LlamaModel) does not have: 325.08 MB for the
 *     seed's config where Accelerate 1.15 prints 262.58 MB; and it printed
 *     sizes from 1 PB up as "1.00 PB" where convert_bytes prints round(x, 2),
 *     "1.0 PB";
 *   `accel launch -h` said offload_param nvme "is refused" (it works);
 *   a YAML config's quoted "\0" cut the string there (mixed_precision:
 *     "bf16\0x" ran bf16; a key "num_processes\0x" set num_processes), and
 *     tags were ignored: `num_processes: !!str 2` launched 2 processes
 *     (PyYAML builds the string '2'), `!foo bf16` and `!!python/object`
 *     were taken as plain text (yaml.safe_load refuses them);
 *   deepspeed_config's values were read as whatever their text gave:
 *     `zero_stage: [3]` ran stage 2, `zero_stage: true` stage 1,
 *     `gradient_clipping: true` clipped at 1.0, `offload_optimizer_device: no`
 *     (a YAML boolean) offloaded nothing, and a key that is no setting
 *     (`zero_stag: 3`) was dropped without a word;
 *   an integer flag of the settings beyond 64 bits (--fp8_margin
 *     99999999999999999999) was exported as 9223372036854775807;
 *   `accel config` cut an answer longer than its buffer (127 characters for
 *     the GPU ids) and took the rest as the next answer: 64 GPU ids were
 *     written as the first 46, without a word;
 *   `accel config update` on a config file that is a symbolic link replaced
 *     the link with a file of its own (the linked file left as it was). */
#include <fcntl.h>
#include <limits.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "accel/core.h"
#include "accel/bigmodel.h"
#include "accel/io.h"
#include "accel/nn.h"
#include "check.h"
#include "sibling_exe.h"

extern char **environ;

static char ACCEL[PATH_MAX + 32], TMP[PATH_MAX];
static char OUT[1 << 16];

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

static void read_file(const char *path, char *buf, size_t n) {
    FILE *f = fopen(path, "r");
    size_t r = f ? fread(buf, 1, n - 1, f) : 0;
    buf[r] = 0;
    if (f) fclose(f);
}

/* accel args... with stdin from `input`; its stdout and stderr together in OUT. Returns its exit code. */
static int accel(const char *input, const char *const *args) {
    char in[PATH_MAX + 8], out[PATH_MAX + 8];
    snprintf(in, sizeof in, "%s/in", TMP);
    snprintf(out, sizeof out, "%s/out", TMP);
    write_file(in, input);
    const char *argv[16] = {ACCEL};
    for (int i = 0; args[i] && i < 14; i++) argv[i + 1] = args[i];
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, in, O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid;
    int st = -1;
    if (posix_spawn(&pid, ACCEL, &fa, NULL, (char *const *)argv, environ) == 0) waitpid(pid, &st, 0);
    posix_spawn_file_actions_destroy(&fa);
    read_file(out, OUT, sizeof OUT);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* No distributed training, not CPU only, no DeepSpeed, GPU ids "\xff\xfe"
 * (then "all" when asked again), no mixed precision. */
static void check_wizard_non_utf8(const char *name) {
    char cfg[PATH_MAX + 16], buf[4096];
    snprintf(cfg, sizeof cfg, "%s/%s", TMP, name);
    const char *a[] = {"config", "--config_file", cfg, NULL};
    CHECK_MSG(accel("0\n0\nno\nno\n\xff\xfe\nall\nno\n", a) == 0, "%s: %s", name, OUT);
    CHECK_STR_CONTAINS(OUT, "Please enter UTF-8 text");
    CHECK(strstr(OUT, "Success") == NULL);
    read_file(cfg, buf, sizeof buf);
    CHECK_STR_CONTAINS(buf, "gpu_ids");
    CHECK_STR_CONTAINS(buf, "all");
    /* the input ends after the bad answer: no file, and no "Success" */
    unlink(cfg);
    CHECK(accel("0\n0\nno\nno\n\xff\xfe\n", a) == 1);
    CHECK(strstr(OUT, "Success") == NULL);
    CHECK(access(cfg, F_OK) != 0);
}

static void test_config_wizard_non_utf8(void) {
    check_wizard_non_utf8("cfg.yaml");
    check_wizard_non_utf8("cfg.json");
}

/* `accel estimate-memory <TMP>/<name> --dtypes float32` on a folder holding
 * only config_json (removed after): its exit code, the output in OUT. */
static int estimate_f32(const char *name, const char *config_json) {
    char dir[PATH_MAX + 8], path[PATH_MAX + 32];
    snprintf(dir, sizeof dir, "%s/%s", TMP, name);
    CHECK(mkdir(dir, 0700) == 0);
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_file(path, config_json);
    const char *a[] = {"estimate-memory", dir, "--dtypes", "float32", NULL};
    int rc = accel("", a);
    unlink(path);
    rmdir(dir);
    return rc;
}

/* A config.json without "model_type": estimate-memory, which picks the
 * family from it as transformers' AutoConfig does (Accelerate's reads it with
 * AutoConfig, which refuses it: "Should have a `model_type` key"), fails
 * naming the file and the key and prints no table (it was estimated as a
 * Llama); with the key, the same config is estimated. The decoders' own
 * loader takes it for a Llama still, as LlamaForCausalLM.from_pretrained
 * does: accel_llama_from_pretrained loads a Llama saved with the key removed. */
static void test_no_model_type(void) {
    const char *body = "\"hidden_size\": 8, \"intermediate_size\": 16, \"num_attention_heads\": 2, "
                       "\"num_hidden_layers\": 1, \"vocab_size\": 32}";
    char cfg[512], dir[PATH_MAX + 16], path[PATH_MAX + 32];
    snprintf(cfg, sizeof cfg, "{%s", body);
    CHECK_MSG(estimate_f32("nomt", cfg) == 1, "%s", OUT);
    snprintf(path, sizeof path, "%s/nomt/config.json", TMP);
    CHECK_STR_CONTAINS(OUT, path);
    CHECK_STR_CONTAINS(OUT, "no \"model_type\" key");
    CHECK_MSG(strstr(OUT, "float32") == NULL, "a table was printed: %s", OUT);
    snprintf(cfg, sizeof cfg, "{\"model_type\": \"llama\", %s", body);
    CHECK_MSG(estimate_f32("withmt", cfg) == 0, "%s", OUT);
    CHECK_STR_CONTAINS(OUT, "float32");

    accel_llama_config c;
    snprintf(dir, sizeof dir, "%s/nomt_model", TMP);
    snprintf(path, sizeof path, "%s/config.json", dir);
    CHECK(mkdir(dir, 0700) == 0);
    snprintf(cfg, sizeof cfg, "{%s", body);
    write_file(path, cfg);
    CHECK_MSG(accel_llama_config_load(dir, &c) == ACCEL_OK, "%s", accel_last_error());
    accel_module *m = accel_llama_new(&c, ACCEL_CPU_DEVICE);
    CHECK_MSG(m && accel_save_pretrained(m, dir, 0) == ACCEL_OK, "%s", accel_last_error());
    write_file(path, cfg); /* the save wrote "model_type": "llama" */
    accel_dispatched *d = NULL;
    accel_module *back = accel_llama_from_pretrained(dir, NULL, NULL, NULL, NULL, &d);
    CHECK_MSG(back != NULL, "%s", accel_last_error());
    CHECK(back && !strcmp(back->ops->type_name, "LlamaForCausalLM"));
    accel_dispatched_free(d);
    accel_module_free(back);
    accel_module_free(m);
}

/* An unknown model_type: the decoders' loader lists the decoder families;
 * estimate-memory reads the encoders too and says so (it listed only the
 * decoders, as if BERT were refused). */
static void test_estimate_memory_unknown_family(void) {
    CHECK_MSG(estimate_f32("t5", "{\"model_type\": \"t5\", \"hidden_size\": 8}") == 1, "%s", OUT);
    CHECK_STR_CONTAINS(OUT, "model_type is \"t5\", accel builds \"llama\"");
    CHECK_STR_CONTAINS(OUT, "\"starcoder2\"; and the encoders \"bert\", \"roberta\", \"xlm-roberta\"\n");
}

/* A config whose weights without lm_head are 4080 x 0.25 TiB (the layers)
 * + 4 TiB (the embedding) + norms = 1024.00 TiB: convert_bytes says "1.0 PB". */
static void test_estimate_memory_petabytes(void) {
    int rc = estimate_f32("pb", "{\"model_type\": \"llama\", \"hidden_size\": 65536, \"intermediate_size\": 262144, "
                          "\"num_attention_heads\": 512, \"num_key_value_heads\": 512, \"head_dim\": 128, "
                          "\"vocab_size\": 16777216, \"num_hidden_layers\": 4080, \"tie_word_embeddings\": false, "
                          "\"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-6}");
    CHECK_MSG(rc == 0, "%s", OUT);
    CHECK_STR_CONTAINS(OUT, "  1.0 PB  ");
    CHECK_STR_CONTAINS(OUT, " 4.0 PB ");
    CHECK(strstr(OUT, ".00 PB") == NULL);
}

/* A Llama whose weights fit in 2^63 bytes by 8 (the loader's bound) while
 * its rotary buffers (2 x head_dim / 2 f32, head_dim 2^20) do not: 4 bytes
 * x (8 head_dim + 6 intermediate + 4 per layer, + 4 outside the layers)
 * without lm_head, intermediate_size (2^61 - 11 - 2^23) / 6. The estimate
 * is refused naming the bound (the total wrapped: "-9223372036850581504
 * bytes"). */
static void test_estimate_memory_buffers_past_2_63(void) {
    int rc = estimate_f32("edge", "{\"model_type\": \"llama\", \"hidden_size\": 2, "
                          "\"intermediate_size\": 384307168200884222, \"num_attention_heads\": 1, "
                          "\"num_key_value_heads\": 1, \"head_dim\": 1048576, \"vocab_size\": 1, "
                          "\"num_hidden_layers\": 1, \"tie_word_embeddings\": true, "
                          "\"max_position_embeddings\": 64, \"torch_dtype\": \"float32\"}");
    CHECK_MSG(rc == 1, "%s", OUT);
    CHECK_STR_CONTAINS(OUT, "the weights and buffers would take more than 2^63 bytes");
    CHECK(strstr(OUT, "-9") == NULL);
}

/* An estimate that fails after its first table could be made prints no table: the error alone, exit 1
 * (the tables were printed as they were made, and a failure in the per-rank or pipeline table came after
 * a "Memory Usage for loading" table that read as the answer). */
static void test_estimate_memory_error_prints_no_table(void) {
    const char *act[] = {"estimate-memory", "data/llama_seed_config", "--batch_size", "3037000500", "--seq_len",
                         "3037000500", NULL};
    CHECK_MSG(accel("", act) == 1, "%s", OUT);
    CHECK_STR_CONTAINS(OUT, "the activations of batch 3037000500 x seq_len 3037000500 would take more than 2^62");
    CHECK_MSG(strstr(OUT, "Memory Usage for loading") == NULL && strstr(OUT, "┌") == NULL, "%s", OUT);
    const char *micro[] = {"estimate-memory", "data/llama_seed_config", "--pp_size", "2", "--batch_size", "3",
                           "--seq_len", "8", "--num_micro_batches", "4", NULL};
    CHECK_MSG(accel("", micro) == 1, "%s", OUT);
    CHECK_STR_CONTAINS(OUT, "a batch of 3 rows does not split into 4 micro-batches");
    CHECK_MSG(strstr(OUT, "Memory Usage for loading") == NULL && strstr(OUT, "Training using Adam") == NULL,
              "%s", OUT);
    const char *fine[] = {"estimate-memory", "data/llama_seed_config", "--pp_size", "2", "--batch_size", "4",
                          "--seq_len", "8", "--num_micro_batches", "4", NULL};
    CHECK_MSG(accel("", fine) == 0, "%s", OUT);
    CHECK_STR_CONTAINS(OUT, "Memory Usage for loading");
    CHECK_STR_CONTAINS(OUT, "Pipeline stages: pp 2");
}

/* A BERT config whose weights pass 2^63 bytes by its position embeddings alone says so: the error names
 * max_position_embeddings (it listed the other sizes only, all of them small). */
static void test_estimate_memory_names_bert_positions(void) {
    int rc = estimate_f32("bert_positions", "{\"model_type\": \"bert\", \"vocab_size\": 64, \"hidden_size\": 32, "
                          "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"intermediate_size\": 48, "
                          "\"max_position_embeddings\": 2305843009213693952, \"type_vocab_size\": 2}");
    CHECK_MSG(rc == 1, "%s", OUT);
    CHECK_STR_CONTAINS(OUT, "the weights would take more than 2^63 bytes");
    CHECK_STR_CONTAINS(OUT, "max_position_embeddings 2305843009213693952");
}

/* A Mixtral config of 65536 experts, hidden size 8 (each expert's sizes within bounds), as a JSON text. */
static void experts_config(char *out, size_t n, const char *model_type, int layers, int sparse_step) {
    snprintf(out, n, "{\"model_type\": \"%s\", \"hidden_size\": 8, \"intermediate_size\": 8, "
             "\"moe_intermediate_size\": 8, \"num_attention_heads\": 1, \"num_key_value_heads\": 1, "
             "\"head_dim\": 8, \"vocab_size\": 8, \"num_hidden_layers\": %d, \"%s\": 65536, "
             "\"num_experts_per_tok\": 2, \"max_position_embeddings\": 64%s}", model_type, layers,
             strcmp(model_type, "mixtral") ? "num_experts" : "num_local_experts",
             sparse_step ? ", \"decoder_sparse_step\": 2" : "");
}

/* The experts of all the sparse layers together are bounded (ACCEL_MOE_MAX_TOTAL_EXPERTS, 2^18): each
 * field within its own bound, 65536 layers of 65536 experts built 2^32 expert modules on the meta device
 * until memory ran out (16 layers: a million of them, 3 GB and half a minute). Counted over the sparse
 * layers only: Qwen3-MoE's decoder_sparse_step 2 makes 8 layers 4 sparse ones. */
static void test_estimate_memory_experts_bounded(void) {
    char cfg[1024], dir[PATH_MAX + 16], path[PATH_MAX + 32];
    experts_config(cfg, sizeof cfg, "mixtral", 5, 0);
    CHECK_MSG(estimate_f32("experts", cfg) == 1, "%s", OUT);
    CHECK_STR_CONTAINS(OUT, "5 sparse layers of 65536 experts make 327680 experts, over accel's limit of 262144");
    CHECK(strstr(OUT, "Memory Usage") == NULL);
    struct { const char *type; int layers, step; bool ok; } CASES[] = {
        {"mixtral", 4, 0, true}, {"mixtral", 5, 0, false}, {"qwen3_moe", 8, 1, true}, {"qwen3_moe", 10, 1, false}};
    snprintf(dir, sizeof dir, "%s/experts_bound", TMP);
    CHECK(mkdir(dir, 0700) == 0);
    snprintf(path, sizeof path, "%s/config.json", dir);
    for (size_t i = 0; i < sizeof CASES / sizeof *CASES; i++) {
        experts_config(cfg, sizeof cfg, CASES[i].type, CASES[i].layers, CASES[i].step);
        write_file(path, cfg);
        accel_llama_config c;
        bool ok = accel_llama_config_load(dir, &c) == ACCEL_OK;
        CHECK_MSG(ok == CASES[i].ok && (ok || strstr(accel_last_error(), "experts, over accel's limit of 262144")),
                  "%s, %d layers: %s", CASES[i].type, CASES[i].layers, ok ? "loaded" : accel_last_error());
    }
    unlink(path);
    rmdir(dir);
}

/* The table's title names the model whole: a path of 760 bytes was cut at 600, its closing backquote
 * with it. */
static void test_estimate_memory_long_path_title(void) {
    char dir[PATH_MAX], path[PATH_MAX + 32], want[300];
    int n = snprintf(dir, sizeof dir, "%s", TMP);
    memset(want, 'd', 250);
    strcpy(want + 250, "` ");
    for (int i = 0; i < 3; i++) {
        n += snprintf(dir + n, sizeof dir - (size_t)n, "/%.250s", want);
        CHECK(mkdir(dir, 0700) == 0);
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_file(path, "{\"model_type\": \"llama\", \"hidden_size\": 8, \"intermediate_size\": 8, "
               "\"num_attention_heads\": 1, \"num_key_value_heads\": 1, \"vocab_size\": 8, "
               "\"num_hidden_layers\": 1}");
    const char *a[] = {"estimate-memory", dir, "--dtypes", "float32", NULL};
    CHECK_MSG(accel("", a) == 0, "%s", OUT);
    CHECK_STR_CONTAINS(OUT, want); /* the last folder's name, then the closing backquote */
    CHECK(strlen(dir) > 760);
}

/* The launcher's help tells what the library does: offload_param nvme works
 * (a shard file per rank under --offload_param_nvme_path). */
static void test_launch_help_offload_param(void) {
    const char *a[] = {"launch", "--use_deepspeed", "-h", NULL};
    CHECK(accel("", a) == 0);
    const char *h = strstr(OUT, "--offload_param_device {none,cpu,nvme}");
    CHECK(h != NULL);
    if (!h) return;
    const char *next = strstr(h + 1, "\n  --"); /* the next option */
    char line[512];
    snprintf(line, sizeof line, "%.*s", next ? (int)(next - h) : 0, h);
    CHECK_MSG(strstr(line, "refused") == NULL, "the help says: %s", line);
    CHECK_STR_CONTAINS(line, "--offload_param_nvme_path");
}

/* `accel launch --config_file <yaml> /usr/bin/env`: its exit code, the output in OUT. */
static int launch_with(const char *yaml) {
    char cfg[PATH_MAX + 16];
    snprintf(cfg, sizeof cfg, "%s/launch.yaml", TMP);
    write_file(cfg, yaml);
    const char *a[] = {"launch", "-q", "--config_file", cfg, "/usr/bin/env", NULL};
    return accel("", a);
}

static void refused_yaml(const char *yaml, const char *needle) {
    CHECK_MSG(launch_with(yaml) == 2, "accepted: %s", yaml);
    CHECK_STR_CONTAINS(OUT, needle);
}

static void test_yaml_nul_and_tags(void) {
    refused_yaml("distributed_type: 'NO'\nmixed_precision: \"bf16\\0x\"\n",
                 "line 2: `mixed_precision`: the value holds a NUL character");
    refused_yaml("distributed_type: 'NO'\n\"num_processes\\0x\": 2\n", "line 2: a key holds a NUL character");
    refused_yaml("distributed_type: 'NO'\nnum_processes: !!str 2\n", "bad value for `num_processes`: '2'");
    refused_yaml("distributed_type: 'NO'\nmixed_precision: !foo bf16\n", "`mixed_precision`: the tag !foo is not supported");
    refused_yaml("distributed_type: 'NO'\nx: !!python/object:os.system ls\n", "the tag !!python/object:os.system");
    refused_yaml("!foo distributed_type: 'NO'\n", "a key has the tag !foo");
    refused_yaml("distributed_type: 'NO'\nnum_processes: !!int two\n", "'two' is not an integer (tagged !!int)");
    refused_yaml("distributed_type: 'NO'\nfsdp_config: !!omap\n  - a: 1\n", "the tag !!omap on a list");
    refused_yaml("distributed_type: 'NO'\nnum_processes: !!float 2\n", "bad value for `num_processes`: 2.0");
    refused_yaml("distributed_type: 'NO'\nnum_processes: !!float 0x10\n", "'0x10' is not a number (tagged !!float)");
    refused_yaml("distributed_type: 'NO'\nuse_cpu: !!bool 1\n", "'1' is not a boolean (tagged !!bool)");
    refused_yaml("distributed_type: 'NO'\n!!int 3: x\n", "a key has the tag !!int");
    /* the standard tags build what PyYAML builds */
    CHECK_MSG(launch_with("distributed_type: !!str NO\nnum_processes: !!int '1'\nuse_cpu: !!bool 'true'\n"
                          "mixed_precision: ! bf16\nfsdp_config: !!map {}\n") == 0, "%s", OUT);
    CHECK_STR_CONTAINS(OUT, "ACCELERATE_MIXED_PRECISION=bf16\n");
    CHECK_STR_CONTAINS(OUT, "ACCELERATE_USE_CPU=True\n");
    /* PyYAML's constructors: an exponent without a dot, any case; `!` resolves as plain, quoted or not */
    CHECK_MSG(launch_with("distributed_type: 'NO'\nnum_processes: ! '1'\nuse_cpu: !!bool ON\n") == 0, "%s", OUT);
    CHECK_STR_CONTAINS(OUT, "ACCELERATE_USE_CPU=True\n");
    CHECK_MSG(launch_with("distributed_type: DEEPSPEED\nnum_processes: 1\ndeepspeed_config:\n"
                          "  gradient_clipping: !!float 1e-3\n") == 0, "%s", OUT);
    CHECK_STR_CONTAINS(OUT, "=0.001\n");
}

static void test_deepspeed_config_types(void) {
    const char *head = "distributed_type: DEEPSPEED\nnum_processes: 1\ndeepspeed_config:\n";
    const char *bad[][2] = {{"  zero_stage: [3]\n", "`deepspeed_config.zero_stage`: [3] (expected an integer)"},
                            {"  zero_stage: true\n", "`deepspeed_config.zero_stage`: True (expected an integer)"},
                            {"  gradient_accumulation_steps: 4.0\n", "`deepspeed_config.gradient_accumulation_steps`"},
                            {"  gradient_clipping: true\n", "`deepspeed_config.gradient_clipping`: True (expected a number)"},
                            {"  offload_optimizer_device: no\n", "`deepspeed_config.offload_optimizer_device`: False"},
                            {"  zero3_init_flag: maybe\n", "`deepspeed_config.zero3_init_flag`: 'maybe'"},
                            /* float() refuses hex (strtod took it, and 0x10 was exported) */
                            {"  gradient_clipping: '0x10'\n", "gradient_clipping"}};
    char yaml[512];
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(yaml, sizeof yaml, "%s%s", head, bad[i][0]);
        refused_yaml(yaml, bad[i][1]);
    }
    const char *hex[] = {"launch", "-q", "--gradient_clipping", "0x10", "/usr/bin/env", NULL};
    CHECK(accel("", hex) == 2);
    CHECK_STR_CONTAINS(OUT, "--gradient_clipping: invalid value '0x10'");
    /* the types Accelerate writes run, and so does what its readers take of
     * str(value): numbers as strings, 1 / 0 for a boolean (no warning: the
     * launch runs without -q, DeepSpeed's launcher keys are known) */
    char cfg[PATH_MAX + 16];
    snprintf(cfg, sizeof cfg, "%s/launch.yaml", TMP);
    const char *a[] = {"launch", "--config_file", cfg, "/usr/bin/env", NULL};
    const char *good[] = {"  zero_stage: 3\n  gradient_clipping: 1\n  zero3_init_flag: 'true'\n"
                          "  offload_optimizer_device: CPU\n  deepspeed_multinode_launcher: standard\n",
                          "  zero_stage: '3'\n  gradient_accumulation_steps: \"4\"\n  gradient_clipping: \"1.0\"\n"
                          "  zero3_init_flag: 1\n  zero3_save_16bit_model: 0\n"};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        snprintf(yaml, sizeof yaml, "%s%s", head, good[i]);
        write_file(cfg, yaml);
        CHECK_MSG(accel("", a) == 0, "%s", OUT);
        CHECK_STR_CONTAINS(OUT, "ACCEL_ZERO_STAGE=3\n");
        CHECK_MSG(strstr(OUT, "accel launch: warning") == NULL, "%s", OUT);
    }
    /* a key that is no setting: named (unless -q), the run goes on */
    snprintf(yaml, sizeof yaml, "%s  zero_stag: 3\n", head);
    write_file(cfg, yaml);
    CHECK_MSG(accel("", a) == 0, "%s", OUT);
    CHECK_STR_CONTAINS(OUT, "warning: deepspeed_config.zero_stag is not a DeepSpeed setting; ignored");
}

static void test_int_flag_beyond_64_bits(void) {
    const char *a[] = {"launch", "-q", "--mixed_precision", "fp8", "--fp8_margin", "99999999999999999999",
                       "/usr/bin/env", NULL};
    CHECK_MSG(accel("", a) == 2, "%s", OUT);
    CHECK_STR_CONTAINS(OUT, "argument --fp8_margin: invalid int value: '99999999999999999999' (beyond 64 bits)");
    CHECK(strstr(OUT, "9223372036854775807") == NULL);
    const char *z[] = {"launch", "-q", "--use_deepspeed", "--zero_stage", "-99999999999999999999", "/usr/bin/env", NULL};
    CHECK(accel("", z) == 2);
    CHECK_STR_CONTAINS(OUT, "argument --zero_stage: invalid int value: '-99999999999999999999'");
    const char *ok[] = {"launch", "-q", "--mixed_precision", "fp8", "--fp8_margin", "9223372036854775807",
                        "/usr/bin/env", NULL}; /* the largest is taken (the library judges it) */
    CHECK_MSG(accel("", ok) == 0, "%s", OUT);
    CHECK_STR_CONTAINS(OUT, "ACCEL_FP8_MARGIN=9223372036854775807\n");
}

/* No distributed training, not CPU only, no DeepSpeed, GPU ids `ids` (then
 * "0,1" if asked again), no mixed precision: the gpu_ids written, in buf. */
static int wizard_gpu_ids(const char *ids, char *buf, size_t n) {
    char cfg[PATH_MAX + 16];
    snprintf(cfg, sizeof cfg, "%s/ids.yaml", TMP);
    size_t cap = strlen(ids) + 64;
    char *input = malloc(cap);
    CHECK(input != NULL);
    if (!input) return -1;
    snprintf(input, cap, "0\n0\nno\nno\n%s\n0,1\nno\n", ids);
    const char *a[] = {"config", "--config_file", cfg, NULL};
    int rc = accel(input, a);
    free(input);
    read_file(cfg, buf, n);
    unlink(cfg);
    return rc;
}

static void test_wizard_long_answer(void) {
    char ids[4096] = "", buf[8192];
    for (int i = 0; i < 64; i++) snprintf(ids + strlen(ids), sizeof ids - strlen(ids), "%s%d", i ? "," : "", i);
    CHECK_MSG(wizard_gpu_ids(ids, buf, sizeof buf) == 0, "%s", OUT); /* 181 characters: all of them written */
    CHECK_STR_CONTAINS(buf, ",45,46,");
    CHECK_STR_CONTAINS(buf, ",62,63\n");
    for (int i = 64; i < 400; i++) snprintf(ids + strlen(ids), sizeof ids - strlen(ids), ",%d", i);
    CHECK_MSG(wizard_gpu_ids(ids, buf, sizeof buf) == 0, "%s", OUT); /* 1489: too long, asked again */
    CHECK_STR_CONTAINS(OUT, "That answer is too long");
    CHECK_STR_CONTAINS(buf, "gpu_ids: 0,1\n");
}

/* `accel config update` (and default) on a config file that is a symbolic
 * link writes through it, as Python's open() does: the link stays a link
 * and its target gets the new text; a dangling link's target is created; a
 * loop of links is an error naming the file. */
static void test_config_through_symlink(void) {
    char real[PATH_MAX + 32], link[PATH_MAX + 32], buf[4096];
    snprintf(real, sizeof real, "%s/real_config.yaml", TMP);
    snprintf(link, sizeof link, "%s/link_config.yaml", TMP);
    write_file(real, "compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\nmixed_precision: bf16\n"
                     "num_processes: 1\nuse_cpu: true\n");
    CHECK(symlink("real_config.yaml", link) == 0); /* relative: the link's directory */
    CHECK(chmod(real, 0600) == 0);                   /* kept private by its owner */
    const char *up[] = {"config", "update", "--config_file", link, NULL};
    CHECK_MSG(accel("", up) == 0, "%s", OUT);
    struct stat st;
    CHECK(lstat(link, &st) == 0 && S_ISLNK(st.st_mode));
    CHECK_MSG(stat(real, &st) == 0 && (st.st_mode & 0777) == 0600, "mode %o", (unsigned)(st.st_mode & 0777));
    read_file(real, buf, sizeof buf);
    CHECK_STR_CONTAINS(buf, "mixed_precision: bf16");
    CHECK_STR_CONTAINS(buf, "debug: false"); /* what update adds: it was written */
    /* a dangling link: its target is made (in a directory made for it) */
    char dangling[PATH_MAX + 32], made[PATH_MAX + 32];
    snprintf(dangling, sizeof dangling, "%s/dangling.yaml", TMP);
    snprintf(made, sizeof made, "%s/sub/made.yaml", TMP);
    CHECK(symlink(made, dangling) == 0);
    const char *def[] = {"config", "default", "--config_file", dangling, NULL};
    CHECK_MSG(accel("", def) == 0, "%s", OUT);
    CHECK(lstat(dangling, &st) == 0 && S_ISLNK(st.st_mode));
    read_file(made, buf, sizeof buf);
    CHECK_STR_CONTAINS(buf, "num_processes: 1");
    /* a loop */
    char a[PATH_MAX + 32], b[PATH_MAX + 32];
    snprintf(a, sizeof a, "%s/loop_a.yaml", TMP);
    snprintf(b, sizeof b, "%s/loop_b.yaml", TMP);
    CHECK(symlink("loop_b.yaml", a) == 0 && symlink("loop_a.yaml", b) == 0);
    const char *loop[] = {"config", "default", "--config_file", a, NULL};
    CHECK(accel("", loop) == 1);
    CHECK_STR_CONTAINS(OUT, "error: cannot write "); /* then the C library's words for ELOOP */
    CHECK_STR_CONTAINS(OUT, "loop_a.yaml: ");
    CHECK(lstat(a, &st) == 0 && S_ISLNK(st.st_mode));
}

int main(void) {
    if (!sibling_exe("accel", ACCEL, sizeof ACCEL)) return 1;
    snprintf(TMP, sizeof TMP, "/tmp/accel_review_cli_XXXXXX");
    CHECK(mkdtemp(TMP) != NULL);
    setenv("HF_HOME", TMP, 1);
    RUN(test_config_wizard_non_utf8);
    RUN(test_estimate_memory_petabytes);
    RUN(test_estimate_memory_buffers_past_2_63);
    RUN(test_estimate_memory_error_prints_no_table);
    RUN(test_estimate_memory_names_bert_positions);
    RUN(test_estimate_memory_experts_bounded);
    RUN(test_estimate_memory_long_path_title);
    RUN(test_no_model_type);
    RUN(test_estimate_memory_unknown_family);
    RUN(test_launch_help_offload_param);
    RUN(test_yaml_nul_and_tags);
    RUN(test_deepspeed_config_types);
    RUN(test_int_flag_beyond_64_bits);
    RUN(test_wizard_long_answer);
    RUN(test_config_through_symlink);
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf %s", TMP);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", TMP);
    return check_summary();
}
