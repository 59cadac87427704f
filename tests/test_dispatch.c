/* load_checkpoint_and_dispatch: device-map errors, offloaded runs equal to
 * in-memory runs with lower memory, strict/non-strict key reports, corrupt
 * checkpoints, hooks removed on free. */
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "accel/autograd.h"
#include "accel/bigmodel.h"
#include "accel/io.h"
#include "check.h"

static const char *const NO_SPLIT[] = {"LlamaDecoderLayer"};

static accel_module *skeleton(const char *cfg_dir, bool meta) {
    accel_llama_config cfg;
    if (accel_llama_config_load(cfg_dir, &cfg) != ACCEL_OK) return NULL;
    if (meta) accel_init_empty_weights_begin();
    accel_module *m = accel_llama_new(&cfg, ACCEL_CPU_DEVICE);
    if (meta) accel_init_empty_weights_end();
    return m;
}

/* Loads dir into a fresh meta skeleton with map; returns d (and *out the model). */
static accel_dispatched *load(const char *dir, const char *map_spec, accel_module **out) {
    accel_module *m = skeleton(dir, true);
    accel_device_map *map = map_spec ? accel_device_map_parse(map_spec) : NULL;
    accel_device_map_opts mo = {.no_split = NO_SPLIT, .n_no_split = 1};
    accel_load_opts lo = {.map_opts = &mo};
    accel_dispatched *d = m ? accel_load_checkpoint_and_dispatch(m, dir, map, NULL, NULL, &lo) : NULL;
    accel_device_map_free(map);
    if (!d) {
        accel_module_free(m);
        m = NULL;
    }
    *out = m;
    return d;
}

static void expect_load_error_map(const char *dir, const char *map_spec, const char *key, const char *value,
                                  const char *needle) {
    accel_clear_error();
    accel_module *m = skeleton(dir, true);
    accel_device_map *map = accel_device_map_parse(map_spec);
    if (key) accel_device_map_set(map, key, value);
    accel_dispatched *d = m ? accel_load_checkpoint_and_dispatch(m, dir, map, NULL, NULL, NULL) : NULL;
    accel_device_map_free(map);
    CHECK_MSG(d == NULL, "map %s should fail", map_spec);
    CHECK_STR_CONTAINS(accel_last_error(), needle);
    accel_dispatched_free(d);
    accel_module_free(m);
    accel_clear_error();
}

static void expect_load_error(const char *dir, const char *map_spec, const char *needle) {
    expect_load_error_map(dir, map_spec, NULL, NULL, needle);
}

static void test_map_errors(void) {
    const char *dir = "data/hf_llama_basic";
    expect_load_error(dir, "model.embed_tokens:cpu,model.layers:cpu,model.norm:cpu,lm_head:cpu,model.bogus:cpu",
                      "'model.bogus'");
    expect_load_error(dir, "model.embed_tokens:cpu,model.layers.0:cpu,model.norm:cpu,lm_head:cpu",
                      "model.layers.1.self_attn.q_proj.weight");
    expect_load_error_map(dir, "model.layers:cpu,model.norm:cpu,lm_head:cpu", "model.embed_tokens", "npu:0",
                          "'model.embed_tokens' -> 'npu:0'");
    expect_load_error(dir, "model.embed_tokens:cpu,model.layers:cpu,model.norm:cpu,lm_head:cuda:1",
                      "'lm_head' -> 'cuda:1'");
    expect_load_error(dir, ":meta", "cannot be loaded onto meta");
    accel_module *m = skeleton("data/hf_llama_basic", true);
    CHECK(accel_load_checkpoint_in_model(m, "data/no_such_checkpoint_dir", NULL, NULL) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "no_such_checkpoint_dir");
    accel_clear_error();
    accel_module_free(m);
}

/* Whether the load of map_spec (which must load: d) left the tensor name on
 * meta: offloaded to the disk. Frees d and m. */
static bool loaded_on_disk(accel_dispatched *d, accel_module *m, const char *map_spec, const char *name) {
    CHECK_MSG(d != NULL, "map %s: %s", map_spec, accel_last_error());
    accel_tensor *w = m ? accel_module_get_tensor(m, name) : NULL;
    bool on_disk = w && w->device.type == ACCEL_DEV_META;
    accel_dispatched_free(d);
    accel_module_free(m);
    return on_disk;
}

static bool loads_with_on_disk(const char *dir, const char *map_spec, const char *name) {
    accel_module *m = NULL;
    accel_dispatched *d = load(dir, map_spec, &m);
    return loaded_on_disk(d, m, map_spec, name);
}

/* The same through accel_bert_from_pretrained_dispatched. */
static bool bert_loads_with_on_disk(const char *dir, const char *map_spec, const char *name) {
    accel_device_map *map = accel_device_map_parse(map_spec);
    accel_dispatched *d = NULL;
    accel_module *m = accel_bert_from_pretrained_dispatched(dir, map, NULL, NULL, NULL, &d);
    accel_device_map_free(map);
    return loaded_on_disk(d, m, map_spec, name);
}

/* A map transformers made (json.dump(model.hf_device_map)) names modules
 * accel's model lacks on purpose, none holding a weight: the rotary
 * embedding wherever the model is split, dropouts, activations (also the
 * root's own: BertForSequenceClassification's dropout); and transformers 5
 * calls GPT-NeoX's head lm_head (embed_out in its checkpoints and in accel).
 * They load, the head placed as the map says; a typo above such a name is
 * still refused, and so are lm_head and embed_out on two devices. */
static void test_transformers_map_keys(void) {
    CHECK(loads_with_on_disk("data/hf_llama_basic",
                             "model.embed_tokens:cpu,model.layers:cpu,model.norm:disk,model.rotary_emb:disk,"
                             "model.layers.0.mlp.act_fn:cpu,lm_head:disk",
                             "lm_head.weight"));
    CHECK(loads_with_on_disk("data/hf_arch_neox",
                             "gpt_neox.embed_in:cpu,gpt_neox.emb_dropout:cpu,gpt_neox.layers:cpu,"
                             "gpt_neox.final_layer_norm:cpu,gpt_neox.rotary_emb:cpu,lm_head:disk",
                             "embed_out.weight"));
    CHECK(!loads_with_on_disk("data/hf_arch_neox", "gpt_neox:cpu,lm_head:cpu", "embed_out.weight"));
    /* a weightless module of the root: BertForSequenceClassification's dropout, a bare model's rotary_emb */
    CHECK(bert_loads_with_on_disk("data/hf_bert_cls",
                                  "bert.embeddings:cpu,bert.encoder:cpu,bert.pooler.dense:cpu,"
                                  "bert.pooler.activation:disk,dropout:disk,classifier:disk",
                                  "classifier.weight"));
    CHECK(loads_with_on_disk("data/hf_llama_basic", "rotary_emb:cpu,model:cpu,lm_head:disk", "lm_head.weight"));
    expect_load_error("data/hf_llama_basic", "model:cpu,lm_head:cpu,modle.rotary_emb:cpu", "'modle.rotary_emb'");
    expect_load_error("data/hf_llama_basic", "model:cpu,lm_head:cpu,model.rotary:cpu", "'model.rotary'");
    /* lm_head and embed_out on GPT-NeoX: one module, so one device (in either order, as module or weight) */
    CHECK(loads_with_on_disk("data/hf_arch_neox", "gpt_neox:cpu,embed_out:disk,lm_head:disk", "embed_out.weight"));
    expect_load_error("data/hf_arch_neox", "gpt_neox:cpu,embed_out:cpu,lm_head:disk",
                      "keys 'lm_head' -> 'disk' and 'embed_out' -> 'cpu' name the same module");
    expect_load_error("data/hf_arch_neox", "gpt_neox:cpu,lm_head.weight:disk,embed_out.weight:cpu",
                      "keys 'lm_head.weight' -> 'disk' and 'embed_out.weight' -> 'cpu' name the same module");
    /* lm_head is no alias where the model has one */
    expect_load_error("data/hf_llama_basic", "model:cpu,lm_head:cpu,embed_out:cpu", "'embed_out'");
}

/* from_pretrained keeps BERT's embeddings on one device, as transformers'
 * _no_split_modules (BertEmbeddings, BertLayer) has Accelerate place them:
 * a cpu budget that holds the word embeddings but not all of BertEmbeddings
 * (with room kept for the largest unsplit module) puts them all on the disk,
 * as transformers 5.25's from_pretrained does with these budgets
 * ({"": "disk"}). */
static void test_bert_embeddings_unsplit(void) {
    accel_max_memory mm = {0};
    CHECK(accel_max_memory_set(&mm, "cpu", "40000") == ACCEL_OK);
    CHECK(accel_max_memory_set(&mm, "disk", "10000000") == ACCEL_OK);
    accel_dispatched *d = NULL;
    accel_module *m = accel_bert_from_pretrained_dispatched("data/hf_bert_cls", NULL, "sequential", &mm, NULL, &d);
    CHECK_MSG(m != NULL, "%s", accel_last_error());
    const char *where = d ? accel_dispatched_placement(d, "bert.embeddings.word_embeddings.weight") : NULL;
    CHECK_STR_CONTAINS(where ? where : "(none)", "disk");
    accel_dispatched_free(d);
    accel_module_free(m);
}

/* A larger random model (~29 MB f32) saved once for the memory comparison. */
static void save_random_model(const char *dir) {
    accel_llama_config cfg = accel_llama_config_default();
    cfg.vocab_size = 4096;
    cfg.hidden_size = 256;
    cfg.intermediate_size = 512;
    cfg.num_hidden_layers = 8;
    cfg.num_attention_heads = 4;
    cfg.num_key_value_heads = 2;
    cfg.max_position_embeddings = 64;
    accel_manual_seed(7);
    accel_module *m = accel_llama_new(&cfg, ACCEL_CPU_DEVICE);
    CHECK(m != NULL);
    CHECK_MSG(accel_save_pretrained(m, dir, 0) == ACCEL_OK, "%s", accel_last_error());
    accel_module_free(m);
}

static long status_kb(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    size_t n = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, key, n) == 0) kb = strtol(line + n, NULL, 10);
    if (f) fclose(f);
    return kb;
}

typedef struct run_result {
    long peak_growth_kb;      /* VmHWM growth over load + forward, measured in a fresh child */
    accel_dispatch_stats s;
} run_result;

/* Child mode (a fresh process, so each run's peak RSS is its own): loads dir
 * with map_spec, runs ids [1, 5], writes the result and the logits to outfile. */
static int child_main(const char *dir, const char *map_spec, const char *outfile) {
    run_result res = {0};
    long before = status_kb("VmHWM:");
    accel_module *m = NULL;
    accel_dispatched *d = load(dir, map_spec, &m);
    accel_tensor *ids = accel_from_data(ACCEL_I64, ACCEL_SHAPE(1, 5), (const int64_t[]){5, 17, 4000, 3, 99});
    accel_tensor *y = d ? accel_llama_forward(m, ids, NULL) : NULL;
    int64_t n = y ? accel_numel(y) : 0;
    float *out = malloc(sizeof(float) * (size_t)(n ? n : 1));
    if (y) accel_to_floats(y, out);
    res.peak_growth_kb = status_kb("VmHWM:") - before;
    accel_dispatched_stats(d, &res.s);
    accel_tensor *w = m ? accel_module_get_tensor(m, "model.layers.7.mlp.down_proj.weight") : NULL;
    bool ok = y && y->device.type == ACCEL_DEV_CPU && w &&
              (!strstr(map_spec, "disk") || (w->device.type == ACCEL_DEV_META && !w->data));
    if (!ok) fprintf(stderr, "run %s failed: %s\n", map_spec, accel_last_error());
    FILE *f = fopen(outfile, "wb");
    ok = ok && f && fwrite(&res, sizeof res, 1, f) == 1 && fwrite(out, sizeof(float), (size_t)n, f) == (size_t)n;
    if (f) fclose(f);
    free(out);
    accel_step_reset();
    accel_dispatched_free(d);
    accel_module_free(m);
    accel_thread_cleanup();
    return ok ? 0 : 1;
}

static const char *g_self; /* argv[0] */

static void run_map(const char *dir, const char *map_spec, float *out, int64_t n, run_result *r) {
    char outfile[300];
    snprintf(outfile, sizeof outfile, "%s/run.bin", dir);
    pid_t pid = fork();
    if (pid == 0) {
        execl(g_self, g_self, "--child", dir, map_spec, outfile, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child run for %s failed", map_spec);
    memset(r, 0, sizeof *r);
    FILE *f = fopen(outfile, "rb");
    CHECK(f && fread(r, sizeof *r, 1, f) == 1 && fread(out, sizeof(float), (size_t)n, f) == (size_t)n);
    if (f) fclose(f);
}

static void test_offload_same_logits_less_memory(void) {
    char tmpl[] = "/tmp/accel_dispatch_XXXXXX";
    CHECK(mkdtemp(tmpl) != NULL);
    save_random_model(tmpl);
    int64_t n = 5 * 4096;
    float *a = malloc(sizeof(float) * (size_t)n), *b = malloc(sizeof(float) * (size_t)n),
          *c = malloc(sizeof(float) * (size_t)n);
    run_result ra, rb, rc;
    run_map(tmpl, ":cpu", b, n, &rb);
    run_map(tmpl, "model.embed_tokens:cpu,model.layers.0:cpu,model.layers.1:cpu,model.layers.2:disk,"
                  "model.layers.3:disk,model.layers.4:disk,model.layers.5:disk,model.layers.6:disk,"
                  "model.layers.7:disk,model.norm:disk,lm_head:disk",
            a, n, &ra);
    run_map(tmpl, ":disk", c, n, &rc);
    double err = 0, err2 = 0;
    for (int64_t i = 0; i < n; i++) {
        err = fmax(err, fabs((double)a[i] - b[i]));
        err2 = fmax(err2, fabs((double)c[i] - b[i]));
    }
    CHECK_MSG(err <= 1e-6 && err2 <= 1e-6, "offloaded logits differ: %g %g", err, err2);
    /* deterministic proxy: bytes materialised at load, and at most at once during the forward */
    CHECK(rb.s.bytes_resident > 25 << 20 && rb.s.n_offloaded_disk == 0 && rb.s.peak_onload_bytes == 0);
    CHECK(ra.s.bytes_resident + ra.s.peak_onload_bytes < rb.s.bytes_resident / 2);
    CHECK(rc.s.bytes_resident == 0 && rc.s.peak_onload_bytes <= 4096 * 256 * 4);
    /* measured: peak RSS growth of each run in its own process (pages of the
     * mapping are released after each module, so offloaded weights never all
     * stay resident) */
    fprintf(stderr, "peak rss growth: in memory %ld kB, 3/4 on disk %ld kB, all on disk %ld kB\n",
            rb.peak_growth_kb, ra.peak_growth_kb, rc.peak_growth_kb);
    CHECK(ra.peak_growth_kb + 10 * 1024 < rb.peak_growth_kb);
    CHECK(rc.peak_growth_kb + 15 * 1024 < rb.peak_growth_kb);
    free(a);
    free(b);
    free(c);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpl);
    CHECK(system(cmd) == 0);
}

static void test_strict_and_key_reports(void) {
    char *msg = NULL;
    size_t len = 0;
    FILE *log = open_memstream(&msg, &len);
    /* 3-layer checkpoint into a 2-layer model: unexpected keys */
    accel_module *m = skeleton("data/hf_llama_basic", true);
    accel_load_opts lo = {.log = log};
    accel_dispatched *d = accel_load_checkpoint_in_model(m, "data/hf_llama_sharded", NULL, &lo);
    fflush(log);
    CHECK(d != NULL);
    CHECK_STR_CONTAINS(msg, "were not used when initializing");
    CHECK_STR_CONTAINS(msg, "model.layers.2.mlp.down_proj.weight");
    accel_dispatch_stats s;
    accel_dispatched_stats(d, &s);
    CHECK(s.n_unexpected == 9 && s.n_missing == 0);
    accel_dispatched_free(d);
    lo.strict = true;
    d = accel_load_checkpoint_in_model(m, "data/hf_llama_sharded", NULL, &lo);
    CHECK(d == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "unexpected key(s)");
    CHECK_STR_CONTAINS(accel_last_error(), "model.layers.2.self_attn.q_proj.weight");
    accel_clear_error();
    accel_module_free(m);
    /* 2-layer checkpoint into a 3-layer model: missing keys. On meta they
     * cannot run: an error even when not strict. Materialised: a warning. */
    m = skeleton("data/hf_llama_sharded", true);
    lo.strict = false;
    d = accel_load_checkpoint_in_model(m, "data/hf_llama_basic", NULL, &lo);
    CHECK(d == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "missing key(s)");
    CHECK_STR_CONTAINS(accel_last_error(), "model.layers.2.input_layernorm.weight");
    accel_clear_error();
    accel_module_free(m);
    m = skeleton("data/hf_llama_sharded", false);
    d = accel_load_checkpoint_in_model(m, "data/hf_llama_basic", NULL, &lo);
    fflush(log);
    CHECK(d != NULL);
    CHECK_STR_CONTAINS(msg, "were not initialized from the checkpoint");
    accel_dispatched_free(d);
    accel_module_free(m);
    fclose(log);
    free(msg);
}

static void copy_file(const char *from, const char *to, long drop_tail) {
    FILE *f = fopen(from, "rb");
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n);
    CHECK(fread(buf, 1, (size_t)n, f) == (size_t)n);
    fclose(f);
    FILE *g = fopen(to, "wb");
    fwrite(buf, 1, (size_t)(n - drop_tail), g);
    fclose(g);
    free(buf);
}

static void test_corrupt_checkpoints(void) {
    char tmpl[] = "/tmp/accel_corrupt_XXXXXX";
    CHECK(mkdtemp(tmpl) != NULL);
    char path[300], cfg[300];
    snprintf(path, sizeof path, "%s/model.safetensors", tmpl);
    snprintf(cfg, sizeof cfg, "%s/config.json", tmpl);
    copy_file("data/hf_llama_basic/config.json", cfg, 0);
    copy_file("data/hf_llama_basic/model.safetensors", path, 100); /* truncated */
    expect_load_error(tmpl, ":cpu", "model.safetensors");
    /* shape mismatch: GQA weights (2 kv heads) into a 4-kv-head model */
    accel_module *m = skeleton("data/hf_llama_basic", true);
    accel_dispatched *d = accel_load_checkpoint_in_model(m, "data/hf_llama_gqa", NULL, NULL);
    CHECK(d == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "Trying to set a tensor of shape [16, 32] in \"model.layers.0.self_attn.k_proj.weight\"");
    CHECK_STR_CONTAINS(accel_last_error(), "checkpoint data/hf_llama_gqa, file model.safetensors");
    accel_clear_error();
    accel_module_free(m);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpl);
    CHECK(system(cmd) == 0);
}

static void test_hooks_removed_on_free(void) {
    accel_module *m = NULL;
    accel_dispatched *d = load("data/hf_llama_basic", "model.embed_tokens:cpu,model.layers:disk,model.norm:cpu,lm_head:cpu", &m);
    CHECK(d != NULL);
    accel_module *layer = accel_module_find(m, "model.layers.0");
    CHECK(layer && layer->hook);
    CHECK(strcmp(accel_dispatched_placement(d, "model.layers.1.mlp.up_proj.weight"), "disk") == 0);
    CHECK(strcmp(accel_dispatched_placement(d, "lm_head.weight"), "cpu") == 0);
    accel_dispatched_free(d);
    CHECK(layer && !layer->hook);
    CHECK(accel_module_get_tensor(m, "model.layers.0.mlp.up_proj.weight")->device.type == ACCEL_DEV_META);
    accel_module_free(m);
}

int main(int argc, char **argv) {
    accel_set_grad_enabled(false); /* inference only */
    if (argc == 5 && strcmp(argv[1], "--child") == 0) return child_main(argv[2], argv[3], argv[4]);
    g_self = argv[0];
    RUN(test_map_errors);
    RUN(test_transformers_map_keys);
    RUN(test_bert_embeddings_unsplit);
    RUN(test_offload_same_logits_less_memory);
    RUN(test_strict_and_key_reports);
    RUN(test_corrupt_checkpoints);
    RUN(test_hooks_removed_on_free);
    accel_thread_cleanup();
    return check_summary();
}
