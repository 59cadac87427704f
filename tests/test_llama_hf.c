/* Llama logits and greedy decoding against transformers, on the fixtures of
 * tools/gen_hf_llama_fixtures.py (tests/data/hf_llama_*: GQA, tied
 * embeddings, another rope_theta, a sharded checkpoint), loaded all in
 * memory, fully disk-offloaded and cpu-offloaded; save_pretrained round trip. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "accel/autograd.h"
#include "accel/bigmodel.h"
#include "accel/io.h"
#include "check.h"
#include "nn/arch.h" /* accel__llama_forward_last */

static const char *FIXTURES[] = {"basic", "gqa", "tied", "rope", "sharded"};

typedef struct expected {
    accel_safetensors *st;
    accel_tensor *ids, *logits, *prompt, *greedy;
} expected;

static bool expected_open(const char *dir, expected *e) {
    char path[512];
    snprintf(path, sizeof path, "%s/expected.safetensors", dir);
    memset(e, 0, sizeof *e);
    e->st = accel_safetensors_open(path);
    if (!e->st) return false;
    e->ids = accel_safetensors_tensor(e->st, "ids", -1);
    e->logits = accel_safetensors_tensor(e->st, "logits", -1);
    e->prompt = accel_safetensors_tensor(e->st, "prompt", -1);
    e->greedy = accel_safetensors_tensor(e->st, "greedy", -1);
    return e->ids && e->logits && e->prompt && e->greedy;
}

static void expected_close(expected *e) {
    accel_tensor_free(e->ids);
    accel_tensor_free(e->logits);
    accel_tensor_free(e->prompt);
    accel_tensor_free(e->greedy);
    accel_safetensors_close(e->st);
}

/* max |forward(ids) - expected logits| */
static double logits_err(accel_module *m, const expected *e) {
    accel_tensor *ids = accel_alias(e->ids);
    accel_tensor *y = accel_llama_forward(m, ids, NULL);
    double err = 1e30;
    if (y && accel_same_shape(y, e->logits)) {
        int64_t n = accel_numel(y);
        float *a = malloc(sizeof(float) * (size_t)n), *b = malloc(sizeof(float) * (size_t)n);
        accel_to_floats(y, a);
        accel_to_floats(e->logits, b);
        err = 0;
        for (int64_t i = 0; i < n; i++) err = fmax(err, fabs((double)a[i] - b[i]));
        free(a);
        free(b);
    } else {
        fprintf(stderr, "forward failed: %s\n", accel_last_error());
    }
    accel_step_reset();
    return err;
}

/* max |the head on the last position only - expected logits there|: the
 * generation's forward (accel__llama_forward_last), logits [B, 1, V]; 1e30
 * when it fails or gives another shape. */
static double last_logits_err(accel_module *m, const expected *e) {
    accel_tensor *y = accel__llama_forward_last(m, &(accel_llama_inputs){.ids = accel_alias(e->ids)}, NULL);
    int64_t B = e->logits->shape[0], T = e->logits->shape[1], V = e->logits->shape[2];
    double err = 1e30;
    if (y && y->ndim == 3 && y->shape[0] == B && y->shape[1] == 1 && y->shape[2] == V) {
        float *a = malloc(sizeof(float) * (size_t)(B * V)), *b = malloc(sizeof(float) * (size_t)(B * T * V));
        accel_to_floats(y, a);
        accel_to_floats(e->logits, b);
        err = 0;
        for (int64_t i = 0; i < B; i++)
            for (int64_t j = 0; j < V; j++) err = fmax(err, fabs((double)a[i * V + j] - b[(i * T + T - 1) * V + j]));
        free(a);
        free(b);
    } else {
        fprintf(stderr, "last-position forward failed: %s\n", y ? "not [B, 1, V]" : accel_last_error());
    }
    accel_step_reset();
    return err;
}

static void check_greedy(accel_module *m, const expected *e, const char *name) {
    int64_t np = e->prompt->shape[1], ng = e->greedy->shape[1];
    int64_t prompt[16], want[32], got[32], n_out = 0;
    accel_to_int64s(e->prompt, prompt);
    accel_to_int64s(e->greedy, want);
    accel_generate_opts o = {.max_new_tokens = ng - np};
    CHECK_MSG(accel_generate(m, prompt, np, &o, got, &n_out) == ACCEL_OK, "%s", accel_last_error());
    CHECK(n_out == ng);
    bool same = n_out == ng;
    for (int64_t i = 0; same && i < ng; i++) same = got[i] == want[i];
    CHECK_MSG(same, "greedy tokens differ from transformers on %s", name);
}

static void run_fixture(const char *name, const char *map_spec, bool offload_cpu) {
    char dir[256];
    snprintf(dir, sizeof dir, "data/hf_llama_%s", name);
    expected e;
    CHECK_MSG(expected_open(dir, &e), "%s: %s", dir, accel_last_error());
    accel_device_map *map = map_spec ? accel_device_map_parse(map_spec) : NULL;
    accel_load_opts lo = {.offload_cpu = offload_cpu};
    accel_dispatched *d = NULL;
    accel_module *m = accel_llama_from_pretrained(dir, map, NULL, NULL, &lo, &d);
    CHECK_MSG(m && d, "%s: %s", dir, accel_last_error());
    if (m) {
        double err = logits_err(m, &e);
        CHECK_MSG(err <= 1e-4, "%s map=%s: max logits error %g", name, map_spec ? map_spec : "none", err);
        err = last_logits_err(m, &e);
        CHECK_MSG(err <= 1e-4, "%s map=%s: max last-position logits error %g", name, map_spec ? map_spec : "none", err);
        check_greedy(m, &e, name);
        accel_dispatch_stats s;
        accel_dispatched_stats(d, &s);
        if (map_spec && strstr(map_spec, "disk")) {
            CHECK(s.n_offloaded_disk > 0);
            CHECK(s.peak_onload_bytes > 0 && s.peak_onload_bytes < s.bytes_disk + s.bytes_host_copies);
        }
        if (offload_cpu) CHECK(s.n_offloaded_cpu > 0 && s.bytes_host_copies > 0);
        CHECK(s.n_unexpected == 0 && s.n_missing == 0);
    }
    accel_dispatched_free(d);
    accel_module_free(m);
    accel_device_map_free(map);
    expected_close(&e);
    accel_clear_error();
}

static void test_fixtures_in_memory(void) {
    for (size_t i = 0; i < sizeof FIXTURES / sizeof *FIXTURES; i++) run_fixture(FIXTURES[i], NULL, false);
}

static void test_fixtures_disk_offload(void) {
    for (size_t i = 0; i < sizeof FIXTURES / sizeof *FIXTURES; i++) run_fixture(FIXTURES[i], ":disk", false);
    /* half on cpu, half on disk, lm_head on disk (tied: stays with embed on cpu) */
    run_fixture("tied", "model.embed_tokens:cpu,model.layers.0:cpu,model.layers.1:disk,model.norm:disk,lm_head:disk",
                false);
    run_fixture("sharded", "model.embed_tokens:disk,model.layers:cpu,model.norm:disk,lm_head:disk", false);
}

static void test_fixtures_cpu_offload(void) {
    run_fixture("gqa", "model.embed_tokens:cpu,model.layers:cpu,model.norm:cpu,lm_head:disk", true);
    run_fixture("sharded", ":cpu", true);
}

/* maps from memory budgets: what does not fit in 50 kB of cpu goes to disk */
static void test_strategy_maps(void) {
    const char *strategies[] = {"sequential", "auto", "balanced_low_0"};
    for (int k = 0; k < 3; k++) {
        expected e;
        CHECK(expected_open("data/hf_llama_gqa", &e));
        accel_max_memory mm = {0};
        accel_max_memory_set(&mm, "cpu", "50000");
        accel_dispatched *d = NULL;
        accel_module *m = accel_llama_from_pretrained("data/hf_llama_gqa", NULL, strategies[k], &mm, NULL, &d);
        CHECK_MSG(m != NULL, "%s: %s", strategies[k], accel_last_error());
        if (m) {
            char buf[1024];
            const char *s = accel_device_map_str(accel_dispatched_map(d), buf, sizeof buf);
            CHECK_STR_CONTAINS(s, "\"cpu\"");
            CHECK_STR_CONTAINS(s, "\"disk\"");
            accel_dispatch_stats st;
            accel_dispatched_stats(d, &st);
            CHECK(st.bytes_resident <= 50000 && st.n_offloaded_disk > 0);
            CHECK(logits_err(m, &e) <= 1e-4);
        }
        accel_dispatched_free(d);
        accel_module_free(m);
        expected_close(&e);
    }
}

/* An f32 checkpoint loaded in bf16 keeps its config's torch_dtype (float32),
 * but the KV cache holds what the bf16 layers compute: bf16 keys and values,
 * so a forward through the cache gives the forward's own bf16 logits. A cache
 * of the config's f32 made attention's output f32 there, and with it the
 * residual stream, the MLPs and the head (each bf16 weight widened to f32 per
 * call: 5x the bf16 first token's time, other tokens than transformers'). */
static void check_bf16_cache(accel_module *m, const expected *e) {
    const accel_llama_config *c = accel_llama_config_of(m);
    CHECK(c->torch_dtype == ACCEL_F32);
    int64_t B = e->ids->shape[0], T = e->ids->shape[1];
    accel_kv_cache *kc = accel_llama_kv_cache_new(m, B, T, ACCEL_CPU_DEVICE);
    CHECK(kc && accel_kv_cache_bytes(kc) ==
                    c->num_hidden_layers * 2 * B * c->num_key_value_heads * T * c->head_dim * (int64_t)sizeof(uint16_t));
    accel_tensor *ids = accel_alias(e->ids);
    accel_tensor *plain = accel_llama_forward(m, ids, NULL), *cached = accel_llama_forward(m, ids, kc);
    CHECK_MSG(plain && cached, "%s", accel_last_error());
    if (plain && cached) {
        CHECK(plain->dtype == ACCEL_BF16);
        CHECK_MSG(cached->dtype == ACCEL_BF16, "logits through the cache are %s", accel_dtype_name(cached->dtype));
        int64_t n = accel_numel(plain);
        float *a = malloc(sizeof(float) * (size_t)n), *b = malloc(sizeof(float) * (size_t)n);
        CHECK(a && b && accel_same_shape(plain, cached) && accel_to_floats(plain, a) == ACCEL_OK &&
              accel_to_floats(cached, b) == ACCEL_OK && memcmp(a, b, sizeof(float) * (size_t)n) == 0);
        free(a);
        free(b);
    }
    accel_step_reset();
    accel_kv_cache_free(kc);
}

/* f32 on disk, loaded in bf16: bf16 weights, logits close to the f32 ones,
 * and a KV cache of bf16 (above) */
static void test_dtype_cast_load(void) {
    expected e;
    CHECK(expected_open("data/hf_llama_basic", &e));
    accel_load_opts lo = {.has_dtype = true, .dtype = ACCEL_BF16};
    accel_dispatched *d = NULL;
    accel_module *m = accel_llama_from_pretrained("data/hf_llama_basic", NULL, NULL, NULL, &lo, &d);
    CHECK_MSG(m, "%s", accel_last_error());
    if (m) {
        accel_tensor *w = accel_module_get_tensor(m, "model.layers.0.mlp.up_proj.weight");
        CHECK(w && w->dtype == ACCEL_BF16 && w->device.type == ACCEL_DEV_CPU);
        double err = logits_err(m, &e);
        CHECK_MSG(err < 0.1 && err > 1e-6, "bf16 logits error %g", err); /* close, not identical */
        check_bf16_cache(m, &e);
    }
    accel_dispatched_free(d);
    accel_module_free(m);
    expected_close(&e);
    accel_clear_error();
}

static void test_save_pretrained_roundtrip(void) {
    char tmpl[] = "/tmp/accel_llama_hf_XXXXXX";
    CHECK(mkdtemp(tmpl) != NULL);
    for (int k = 0; k < 2; k++) {
        const char *name = k ? "tied" : "gqa";
        char dir[256];
        snprintf(dir, sizeof dir, "data/hf_llama_%s", name);
        expected e;
        CHECK(expected_open(dir, &e));
        accel_dispatched *d = NULL;
        accel_module *m = accel_llama_from_pretrained(dir, NULL, NULL, NULL, NULL, &d);
        CHECK(m != NULL);
        char out[512];
        snprintf(out, sizeof out, "%s/%s", tmpl, name);
        /* gqa: sharded with a tiny max_shard_size */
        CHECK_MSG(accel_save_pretrained(m, out, k ? 0 : 30000) == ACCEL_OK, "%s", accel_last_error());
        accel_dispatched_free(d);
        accel_module_free(m);
        char path[600];
        snprintf(path, sizeof path, "%s/%s", out, k ? "model.safetensors" : "model.safetensors.index.json");
        struct stat sb;
        CHECK(stat(path, &sb) == 0);
        if (k) { /* tied: lm_head.weight dropped like transformers */
            accel_safetensors *st = accel_safetensors_open(path);
            CHECK(st && !accel_safetensors_find(st, "lm_head.weight") &&
                  accel_safetensors_find(st, "model.embed_tokens.weight"));
            accel_safetensors_close(st);
        }
        m = accel_llama_from_pretrained(out, NULL, NULL, NULL, NULL, &d);
        CHECK_MSG(m != NULL, "%s", accel_last_error());
        if (m) CHECK(logits_err(m, &e) <= 1e-4);
        accel_dispatched_free(d);
        accel_module_free(m);
        expected_close(&e);
    }
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpl);
    CHECK(system(cmd) == 0);
}

int main(void) {
    accel_set_grad_enabled(false); /* inference only */
    RUN(test_fixtures_in_memory);
    RUN(test_fixtures_disk_offload);
    RUN(test_fixtures_cpu_offload);
    RUN(test_strategy_maps);
    RUN(test_dtype_cast_load);
    RUN(test_save_pretrained_roundtrip);
    accel_thread_cleanup();
    return check_summary();
}
