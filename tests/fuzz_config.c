/* Fuzz target: the configuration files a user hands accel.
 *
 * Input: a byte string whose first byte says which parser reads the rest:
 *   'C'  a Hugging Face config.json (accel_llama_config_load for the decoder
 *        families, accel_bert_config_load for BERT / RoBERTa / XLM-RoBERTa;
 *        also as generation_config.json). A config one of them accepts must
 *        answer what a user asks next without building the model: its check,
 *        the training step's activation bytes (batch 1 of 2 tokens, and the
 *        longest sequence the config allows: absurd sizes are refused or
 *        answered, never overflowed), and it must save and load back.
 *   'Y'  an `accel config` / Accelerate config file (src/cli/cli_cfgfile.c:
 *        read as YAML, and the same bytes as JSON): one that normalises
 *        gives `accel launch`'s variables (FSDP, DeepSpeed, fp8, parallelism,
 *        no flags given) and `accel env`'s mesh, and writes a file that reads
 *        and normalises again.
 *   'G'  a GEMM choice table (ACCEL_GEMM_CACHE's file, or a checkpoint's
 *        bundle of them: accel__gemm_choices_install). After a table it
 *        accepts, GEMMs still multiply exactly: a small f32 and a small bf16
 *        one, and one of the first class the table names for this thread
 *        count (at most 2^27 multiply-adds). The table is reset after each
 *        input.
 *   'D'  a device map saved as JSON (accel_device_map_load, as
 *        `json.dump(model.hf_device_map)` writes it): one that loads is
 *        written out (into a short buffer too), looked up, each value taken
 *        as a device, and cleaned (clean_device_map).
 *   'K'  accel_checkpoint.json, the completion marker of a save_state folder
 *        (accel__marker_check over a folder holding a few small files). A
 *        "marker_crc32c" of "recompute" is replaced by the marker's right
 *        checksum, so that mutations reach the file checks behind it.
 *   'Z'  sharded_index.json of a ZeRO-3 SHARDED_STATE_DICT checkpoint
 *        (src/accelerator/zero3_checkpoint.c's index reader), over a folder
 *        of two ranks' shard files and replicated.safetensors
 *        (tests/zero3_index_fixture.h), merged as merge-weights merges it
 *        (accel__zero3_merge) into safetensors and torch files: a merge that
 *        succeeds wrote a file that opens with every entry of the index.
 * Anything else is ignored.
 *
 * Built as fuzz_safetensors.c is (tests/config.cmake): a libFuzzer target
 * with clang, else a replay driver over a seed folder (tests/fuzz_replay.h).
 * The files go to a temporary folder made once per process (tests/fuzz_tmp.h). */
#include <jansson.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "accel/accel.h"
#include "accel/bert.h"
#include "accel/bigmodel.h"
#include "backends/cpu/gemm.h"
#include "cli/cli.h"
#include "core/checksum.h"
#include "io/checkpoint_marker.h"
#include "io/io_internal.h"
#include "accelerator/accelerator_internal.h"
#include "fuzz_tmp.h"
#include "zero3_index_fixture.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* ---------------------------------------------------------------- files */

/* The path of sub in the temporary folder into out. */
static void tmp_path(const char *sub, char *out, size_t n) {
    snprintf(out, n, "%s/%s", fuzz_tmp_dir("fuzz_config"), sub);
}

static void fail(const char *what, const char *why) {
    fprintf(stderr, "fuzz_config: %s: %s\n", what, why ? why : "");
    abort();
}

/* ---------------------------------------------------------------- C: config.json */

/* The activation bytes of a training step of batch 1 and seq_len tokens: an
 * answer or a refusal, never UB (the sanitizers watch). */
static void decoder_estimates(const accel_llama_config *c) {
    accel_activation_bytes out;
    accel_activation_opts o = {.batch_size = 1, .seq_len = 2, .autocast = ACCEL_F32};
    accel_llama_activation_bytes(c, &o, &out);
    o = (accel_activation_opts){.batch_size = 1, .seq_len = c->max_position_embeddings, .autocast = ACCEL_BF16,
                                .checkpointing = true};
    accel_llama_activation_bytes(c, &o, &out);
    o.tp_size = 2, o.sequence_parallel = true, o.checkpointing = false, o.batch_size = INT64_MAX / 4;
    accel_llama_activation_bytes(c, &o, &out);
    accel_clear_error();
}

static void bert_estimates(const accel_bert_config *c) {
    accel_activation_bytes out;
    int64_t choices = c->head == ACCEL_BERT_MULTIPLE_CHOICE ? 2 : 0;
    accel_activation_opts o = {.batch_size = 1, .seq_len = 2, .autocast = ACCEL_F32, .num_choices = choices};
    accel_bert_activation_bytes(c, &o, &out);
    o.seq_len = c->max_position_embeddings, o.batch_size = INT64_MAX / 8, o.autocast = ACCEL_BF16;
    accel_bert_activation_bytes(c, &o, &out);
    accel_clear_error();
}

static void fuzz_decoder_config(const char *dir) {
    accel_llama_config c;
    if (accel_llama_config_load(dir, &c) != ACCEL_OK) return;
    if (accel_llama_config_check(&c, "fuzz") != ACCEL_OK) fail("a loaded config fails its check", accel_last_error());
    decoder_estimates(&c);
    char saved[320];
    tmp_path("saved_config.json", saved, sizeof saved);
    if (accel_llama_config_save(saved, &c) != ACCEL_OK) fail("a loaded config does not save", accel_last_error());
    accel_llama_config back;
    if (accel_llama_config_load(saved, &back) != ACCEL_OK) fail("a saved config does not load", accel_last_error());
    if (back.vocab_size != c.vocab_size || back.hidden_size != c.hidden_size ||
        back.num_hidden_layers != c.num_hidden_layers || back.num_attention_heads != c.num_attention_heads ||
        back.num_key_value_heads != c.num_key_value_heads || back.intermediate_size != c.intermediate_size)
        fail("a saved config loads back with other sizes", saved);
}

static void fuzz_bert_config(const char *dir) {
    accel_bert_config c;
    if (accel_bert_config_load(dir, &c) != ACCEL_OK) return;
    if (accel_bert_config_check(&c, "fuzz") != ACCEL_OK) fail("a loaded BERT config fails its check", accel_last_error());
    bert_estimates(&c);
    char saved[320];
    tmp_path("saved_bert_config.json", saved, sizeof saved);
    if (accel_bert_config_save(saved, &c) != ACCEL_OK) fail("a loaded BERT config does not save", accel_last_error());
    accel_bert_config back;
    if (accel_bert_config_load(saved, &back) != ACCEL_OK) fail("a saved BERT config does not load", accel_last_error());
    if (back.vocab_size != c.vocab_size || back.hidden_size != c.hidden_size ||
        back.num_hidden_layers != c.num_hidden_layers || back.head != c.head)
        fail("a saved BERT config loads back otherwise", saved);
}

static void fuzz_hf_config(const uint8_t *data, size_t size) {
    char dir[320], file[400];
    tmp_path("model", dir, sizeof dir);
    mkdir(dir, 0755);
    snprintf(file, sizeof file, "%s/config.json", dir);
    fuzz_write_file(file, data, size);
    fuzz_decoder_config(dir);
    accel_clear_error();
    fuzz_bert_config(dir);
    accel_clear_error();
    /* the same bytes as generation_config.json over a default config */
    snprintf(file, sizeof file, "%s/generation_config.json", dir);
    fuzz_write_file(file, data, size);
    accel_llama_config c = accel_llama_config_default();
    accel_generation_config_load(dir, &c);
    unlink(file);
    accel_clear_error();
}

/* ---------------------------------------------------------------- Y: accel config */

/* What `accel launch` derives from a normalised config with no flags given. */
static void launch_exports(const cv *cfg) {
    static cli_opt opts[LAUNCH_MAX_SETTINGS];
    static const char *vals[LAUNCH_MAX_SETTINGS];
    launch_settings ls = {opts, launch_setting_opts(opts), vals};
    char err[1024], mesh[512];
    env_list e = {0};
    const cv *mp = cv_get(cfg, "mixed_precision"), *np = cv_get(cfg, "num_processes");
    bool fp8 = mp && mp->t == CV_STR && !strcmp(mp->s, "fp8");
    int procs = np && np->t == CV_INT && np->i > 0 && np->i < 1 << 20 ? (int)np->i : 1;
    launch_export_fsdp(&e, &ls, cv_get(cfg, "fsdp_config"), true, err, sizeof err);
    launch_export_deepspeed(&e, &ls, cv_get(cfg, "deepspeed_config"), mp != NULL, NULL, true, err, sizeof err);
    launch_export_fp8(&e, &ls, cv_get(cfg, "fp8_config"), fp8, err, sizeof err);
    launch_export_parallelism(&e, &ls, cv_get(cfg, "parallelism_config"), cv_get(cfg, "megatron_lm_config"), true,
                              true, procs, true, err, sizeof err);
    cfg_describe_mesh(cfg, mesh, sizeof mesh);
    char repr[4096];
    cv_repr(cfg, true, repr, sizeof repr);
    env_free(&e);
}

/* The config at path, read and normalised; written, it reads and normalises again. */
static void accel_config_file(const char *path, const char *rewritten) {
    char err[2048];
    cv *c = cfg_read(path, err, sizeof err);
    if (!c) return;
    if (cfg_normalize(c, path, err, sizeof err)) {
        launch_exports(c);
        if (!cfg_write(rewritten, c, err, sizeof err)) fail("a normalised config does not write", err);
        cv *back = cfg_read(rewritten, err, sizeof err);
        if (!back) fail("a written config does not read", err);
        if (!cfg_normalize(back, rewritten, err, sizeof err)) fail("a written config does not normalise", err);
        cv_free(back);
    }
    cv_free(c);
}

static void fuzz_accel_config(const uint8_t *data, size_t size) {
    char yaml[320], json[320], out[320];
    tmp_path("default_config.yaml", yaml, sizeof yaml);
    tmp_path("config.json", json, sizeof json);
    fuzz_write_file(yaml, data, size);
    fuzz_write_file(json, data, size);
    tmp_path("rewritten_config.yaml", out, sizeof out);
    accel_config_file(yaml, out);
    tmp_path("rewritten_config.json", out, sizeof out);
    accel_config_file(json, out);
}

/* ---------------------------------------------------------------- G: GEMM choices */

/* Small integers: every sum of their products is exact in f32 (and they
 * are exact in bf16 and f16), so each provider must give the same C. */
static float small_int(int64_t i) { return (float)((int)(i * 7 % 5) - 2); }

/* C = op(A) op(B) of M x N x K on accel__gemm (dtype dt operands, f32 C),
 * checked against dot products on sampled entries. */
static void gemm_checked(accel_dtype dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K) {
    size_t es = dt == ACCEL_F32 ? 4 : 2;
    float *af = malloc((size_t)(M * K) * 4), *bf = malloc((size_t)(K * N) * 4), *c = malloc((size_t)(M * N) * 4);
    void *a = malloc((size_t)(M * K) * es), *b = malloc((size_t)(K * N) * es);
    if (!af || !bf || !c || !a || !b) fail("GEMM operands", "out of memory");
    for (int64_t i = 0; i < M * K; i++) af[i] = small_int(i);
    for (int64_t i = 0; i < K * N; i++) bf[i] = small_int(i + 3);
    accel_convert(a, dt, af, ACCEL_F32, M * K);
    accel_convert(b, dt, bf, ACCEL_F32, K * N);
    /* A is M x K (K x M stored when ta), B is K x N (N x K when tb) */
    if (accel__gemm(ta, tb, M, N, K, 1.0f, a, dt, ta ? M : K, b, dt, tb ? K : N, 0.0f, c, N) != ACCEL_OK)
        fail("a GEMM after a table was installed", accel_last_error());
    for (int64_t s = 0; s < 64; s++) {
        int64_t i = s * 7919 % M, j = s * 104729 % N;
        float want = 0;
        for (int64_t k = 0; k < K; k++)
            want += (ta ? af[k * M + i] : af[i * K + k]) * (tb ? bf[j * K + k] : bf[k * N + j]);
        if (c[i * N + j] != want) {
            fprintf(stderr, "fuzz_config: %s GEMM %c%c %lldx%lldx%lld: C[%lld,%lld] = %g, want %g\n",
                    accel_dtype_name(dt), ta ? 'T' : 'N', tb ? 'T' : 'N', (long long)M, (long long)N, (long long)K,
                    (long long)i, (long long)j, c[i * N + j], want);
            abort();
        }
    }
    free(af), free(bf), free(c), free(a), free(b);
}

/* A GEMM of the first class of this thread count the table holds, where it
 * is a plain GEMM of at most 2^27 multiply-adds. */
static void gemm_of_installed_class(void) {
    accel__gemm_class cls[256];
    int n = accel__gemm_choice_classes(omp_get_max_threads(), cls, 256);
    for (int i = 0; i < n; i++) {
        const accel__gemm_class *c = &cls[i];
        if (c->op != ACCEL__GEMM_OP_GEMM || c->m + c->n + c->k > 27) continue;
        accel_dtype dt = c->dt == 1 ? ACCEL_BF16 : c->dt == 2 ? ACCEL_F16 : ACCEL_F32;
        int64_t M = c->rows ? c->rows : (int64_t)1 << c->m;
        gemm_checked(dt, c->ta, c->tb, M, (int64_t)1 << c->n, (int64_t)1 << c->k);
        return;
    }
}

static void fuzz_gemm_choices(const uint8_t *data, size_t size) {
    static bool env_set;
    if (!env_set) { /* no timing (a class not in the table takes the rule), no cache file */
        setenv("ACCEL_GEMM_MEASURE", "0", 1);
        setenv("ACCEL_GEMM_CACHE", "off", 1);
        env_set = true;
    }
    json_t *j = accel__json_parse("fuzz.json", (const char *)data, size); /* as the cache file is read */
    if (j && !accel__gemm_choices_install(j)) {
        gemm_checked(ACCEL_F32, false, true, 3, 5, 7);
        gemm_checked(ACCEL_BF16, true, false, 4, 3, 9);
        gemm_of_installed_class();
        char buf[4096];
        accel__gemm_choices_describe(buf, sizeof buf);
    }
    json_decref(j);
    accel__gemm_choice_reset();
    accel_clear_error();
}

/* ---------------------------------------------------------------- D: device map */

static void fuzz_device_map(const uint8_t *data, size_t size) {
    char path[320];
    tmp_path("device_map.json", path, sizeof path);
    fuzz_write_file(path, data, size);
    accel_device_map *m = accel_device_map_load(path);
    if (!m) return;
    char small[16], big[4096];
    accel_device_map_str(m, small, sizeof small);
    accel_device_map_str(m, big, sizeof big);
    for (int i = 0; i < m->n; i++) {
        accel_device d;
        accel_device_map_device(m->e[i].device, &d);
        accel_device_map_lookup(m, m->e[i].prefix);
    }
    accel_device_map_lookup(m, "model.layers.0.self_attn.q_proj.weight");
    accel_clean_device_map(m);
    accel_device_map_free(m);
    accel_clear_error();
}

/* ---------------------------------------------------------------- K: checkpoint marker */

/* The checkpoint folder the markers describe: a file, one a level down, an empty one. */
static const char *checkpoint_dir(void) {
    static char dir[320];
    if (dir[0]) return dir;
    char sub[400], file[480];
    tmp_path("checkpoint", dir, sizeof dir);
    snprintf(sub, sizeof sub, "%s/pytorch_model_fsdp_0", dir);
    if ((mkdir(dir, 0755) && !accel__is_dir(dir)) || (mkdir(sub, 0755) && !accel__is_dir(sub)))
        fail("checkpoint folder", dir);
    snprintf(file, sizeof file, "%s/model.safetensors", dir);
    fuzz_write_file(file, "0123456789", 10);
    snprintf(file, sizeof file, "%s/shard_0.safetensors", sub);
    fuzz_write_file(file, "abc", 3);
    snprintf(file, sizeof file, "%s/random_states_0.pkl", dir);
    fuzz_write_file(file, "", 0);
    return dir;
}

/* A "marker_crc32c" of "recompute" replaced by the checksum of the rest, as
 * accel__marker_write computes it: the marker's JSON text into *out
 * (malloc'd), else NULL (the input is used as it is). */
static char *with_marker_sum(const uint8_t *data, size_t size) {
    json_error_t je;
    json_t *root = json_loadb((const char *)data, size, 0, &je);
    json_t *self = json_object_get(root, "marker_crc32c");
    char *text = NULL;
    if (json_is_string(self) && !strcmp(json_string_value(self), "recompute")) {
        json_object_del(root, "marker_crc32c");
        char *body = json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS);
        char hex[9];
        if (body) {
            snprintf(hex, sizeof hex, "%08x", accel__crc32c(body, strlen(body)));
            json_object_set_new(root, "marker_crc32c", json_string(hex));
            text = json_dumps(root, JSON_COMPACT);
        }
        free(body);
    }
    json_decref(root);
    return text;
}

static void fuzz_checkpoint_marker(const uint8_t *data, size_t size) {
    const char *dir = checkpoint_dir();
    char marker[400];
    snprintf(marker, sizeof marker, "%s/%s", dir, ACCEL__MARKER);
    char *signed_text = with_marker_sum(data, size);
    if (signed_text) fuzz_write_file(marker, signed_text, strlen(signed_text));
    else fuzz_write_file(marker, data, size);
    free(signed_text);
    accel__marker_check(dir, true, NULL, "fuzz");
    accel__marker_check(dir, true, "pytorch_model_fsdp_0", "fuzz");
    accel__marker_check(dir, false, NULL, "fuzz");
    accel_clear_error();
}

/* ---------------------------------------------------------------- Z: ZeRO-3 sharded index */

/* The sharded folder the index describes (made once; the index replaced per input). */
static const char *sharded_dir(void) {
    static char dir[320];
    if (dir[0]) return dir;
    tmp_path("sharded", dir, sizeof dir);
    if ((mkdir(dir, 0755) && !accel__is_dir(dir)) || !zero3_index_folder(dir)) fail("sharded folder", dir);
    return dir;
}

/* A merge that succeeded: out/file opens (a torch.save file through the
 * same reader) and holds n tensors, one per state-dict entry. */
static void check_merged(const char *out, bool torch_format, int n) {
    char path[400];
    snprintf(path, sizeof path, "%s/%s", out, torch_format ? "pytorch_model.bin" : "model.safetensors");
    accel_safetensors *f = accel_safetensors_open(path);
    if (!f) fail("a merged file does not open", accel_last_error());
    if (accel_safetensors_count(f) != n) fail("a merged file has another tensor count than the index", path);
    accel_safetensors_close(f);
}

static void fuzz_sharded_index(const uint8_t *data, size_t size) {
    const char *dir = sharded_dir();
    char out[320];
    tmp_path("merged", out, sizeof out);
    if (mkdir(out, 0755) && !accel__is_dir(out)) fail("merge folder", out);
    if (!zero3_index_write(dir, data, size)) fail("sharded_index.json", dir);
    for (int torch_format = 0; torch_format < 2; torch_format++) {
        int n = -1;
        if (accel__zero3_merge(dir, out, torch_format, &n) == ACCEL_OK) check_merged(out, torch_format, n);
        accel_clear_error();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    switch (data[0]) {
    case 'C': fuzz_hf_config(data + 1, size - 1); break;
    case 'Y': fuzz_accel_config(data + 1, size - 1); break;
    case 'G': fuzz_gemm_choices(data + 1, size - 1); break;
    case 'D': fuzz_device_map(data + 1, size - 1); break;
    case 'K': fuzz_checkpoint_marker(data + 1, size - 1); break;
    case 'Z': fuzz_sharded_index(data + 1, size - 1); break;
    default: break;
    }
    accel_clear_error();
    return 0;
}

#define FUZZ_NAME "fuzz_config"
#define FUZZ_DEFAULT_SEEDS "data/fuzz_seeds_config"
#include "fuzz_replay.h"
