/* The layers above ops on a device whose memory the host cannot touch (the
 * hostless test backend: a host dereference of its pointers faults):
 * safetensors save/load round trips, load_checkpoint_and_dispatch of a
 * 20-layer Llama with the seed's two-device split (embed + layers 0-9 on
 * hostless:0, 10-19 + norm + lm_head on hostless:1), cpu and disk offload
 * executing on hostless:0, generation, flat parameter buffers and batches.
 * Every result is compared with the same run on the cpu. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "accel/autograd.h"
#include "accel/bigmodel.h"
#include "accel/data.h"
#include "accel/io.h"
#include "backends/registry.h"
#include "check.h"
#include "dispatch_fixture.h"

static const accel_device H0 = {ACCEL_DEV_HOSTLESS, 0}, H1 = {ACCEL_DEV_HOSTLESS, 1};
static char g_dir[64]; /* temporary directory of this run */

static bool on(const accel_tensor *t, accel_device d) { return t && accel_device_eq(t->device, d); }

/* ---- safetensors */

/* A persistent cpu tensor of normal draws, in dtype dt. */
static accel_tensor *randn(accel_dtype dt, int ndim, const int64_t *shape) {
    accel_tensor *f = accel_tensor_new(ACCEL_F32, ndim, shape, ACCEL_CPU_DEVICE);
    accel_rng_normal_(accel_default_rng(), f, 0, 1);
    if (dt == ACCEL_F32) return f;
    accel_tensor *t = accel_tensor_clone_persistent(accel_to_dtype(f, dt), ACCEL_CPU_DEVICE);
    accel_tensor_free(f);
    return t;
}

static void test_safetensors_round_trip(void) {
    char path[128];
    snprintf(path, sizeof path, "%s/dev.safetensors", g_dir);
    accel_manual_seed(1);
    accel_tensor *a = randn(ACCEL_F32, ACCEL_SHAPE(3, 5)), *b = randn(ACCEL_BF16, ACCEL_SHAPE(7));
    /* device copies; one written through a transposed (non-contiguous) view */
    accel_tensor *ha = accel_tensor_clone_persistent(a, H0), *hb = accel_tensor_clone_persistent(b, H0);
    accel_tensor *hat = accel_transpose(ha, 0, 1);
    CHECK(on(ha, H0) && on(hb, H0) && hat && !accel_is_contiguous(hat));
    const char *names[] = {"a", "b", "a_t"};
    accel_tensor *ts[] = {ha, hb, hat};
    CHECK_MSG(accel_safetensors_save(path, 3, names, ts, 0, NULL) == ACCEL_OK, "%s", accel_last_error());
    accel_safetensors *st = accel_safetensors_open(path);
    CHECK_MSG(st != NULL, "%s", accel_last_error());
    if (!st) return;
    /* same dtype: the mapping's bytes go to the device as they are */
    accel_tensor *la = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(3, 5), H0);
    CHECK(accel_safetensors_load_into(st, "a", la) == ACCEL_OK && max_diff(la, a) == 0);
    accel_tensor *lat = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(5, 3), H1);
    CHECK(accel_safetensors_load_into(st, "a_t", lat) == ACCEL_OK && max_diff(lat, accel_transpose(a, 0, 1)) == 0);
    /* another dtype: converted through the staging buffer (bf16 -> f32 exact) */
    accel_tensor *lb = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(7), H0);
    CHECK(accel_safetensors_load_into(st, "b", lb) == ACCEL_OK && max_diff(lb, b) == 0);
    /* shape mismatch and meta destinations are errors naming the tensor */
    accel_tensor *bad = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(2), H0);
    CHECK(accel_safetensors_load_into(st, "b", bad) == ACCEL_ERR_SHAPE);
    CHECK_STR_CONTAINS(accel_last_error(), "'b'");
    accel_clear_error();
    accel_tensor *meta = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(7), ACCEL_META_DEVICE);
    CHECK(accel_safetensors_load_into(st, "b", meta) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "not meta");
    accel_clear_error();
    CHECK(accel_safetensors_save(path, 1, names + 1, &meta, 0, NULL) == ACCEL_ERR_DEVICE);
    CHECK_STR_CONTAINS(accel_last_error(), "on meta");
    accel_clear_error();
    accel_safetensors_close(st);
    accel_tensor *all[] = {a, b, ha, hb, la, lat, lb, bad, meta};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) accel_tensor_free(all[i]);
    accel_step_reset();
}

/* A save larger than one staging chunk (4 MiB) comes back whole. */
static void test_safetensors_chunked(void) {
    char path[128];
    snprintf(path, sizeof path, "%s/big.safetensors", g_dir);
    const int64_t n = (5 << 20) / 4 + 3;
    accel_tensor *h = accel_tensor_clone_persistent(accel_arange(ACCEL_F32, 0, n), H0);
    const char *name = "w";
    CHECK(accel_safetensors_save(path, 1, &name, &h, 0, NULL) == ACCEL_OK);
    accel_safetensors *st = accel_safetensors_open(path);
    accel_tensor *back = st ? accel_safetensors_tensor(st, "w", -1) : NULL; /* cpu, zero-copy */
    CHECK(back && back->device.type == ACCEL_DEV_CPU && (back->flags & ACCEL_TF_MMAP));
    CHECK(back && max_diff(back, h) == 0);
    /* f32 file into a bf16 device tensor: several conversion chunks */
    accel_tensor *hb = accel_tensor_new(ACCEL_BF16, 1, &n, H1);
    CHECK(st && accel_safetensors_load_into(st, "w", hb) == ACCEL_OK);
    accel_tensor *want = back ? accel_to_dtype(back, ACCEL_BF16) : NULL;
    CHECK(want && max_diff(hb, want) == 0);
    accel_tensor_free(back);
    accel_tensor_free(hb);
    accel_tensor_free(h);
    accel_safetensors_close(st);
    accel_step_reset();
}

/* ---- big-model dispatch */

static char g_model[96];

static void save_model(void) {
    accel_llama_config cfg = accel_llama_config_default();
    cfg.vocab_size = 64;
    cfg.hidden_size = 16;
    cfg.intermediate_size = 24;
    cfg.num_hidden_layers = 20;
    cfg.num_attention_heads = 2;
    cfg.num_key_value_heads = 1;
    cfg.max_position_embeddings = 32;
    snprintf(g_model, sizeof g_model, "%s/llama", g_dir);
    save_llama(&cfg, 7, g_model);
}

/* The seed's map: embed + layers 0-9 on a, layers 10-19 + norm + lm_head on b. */
static accel_device_map *seed_map(const char *a, const char *b) {
    accel_device_map *map = accel_device_map_new();
    accel_device_map_set(map, "model.embed_tokens", a);
    for (int i = 0; i < 20; i++) {
        char key[32];
        snprintf(key, sizeof key, "model.layers.%d", i);
        accel_device_map_set(map, key, i < 10 ? a : b);
    }
    accel_device_map_set(map, "model.norm", b);
    accel_device_map_set(map, "lm_head", b);
    return map;
}

static loaded load(accel_device_map *map, const accel_load_opts *extra) { return load_llama(g_model, map, extra); }

static const int64_t IDS[6] = {5, 17, 63, 3, 0, 40};

/* Logits [1, 6, 64] of IDS as a persistent cpu tensor. */
static accel_tensor *logits_of(loaded *l) { return llama_logits(l, IDS, 6); }

static accel_tensor *g_cpu_logits; /* everything on the cpu */

static void test_dispatch_two_devices(void) {
    loaded cpu = load(NULL, NULL);
    g_cpu_logits = logits_of(&cpu);
    unload(&cpu);
    loaded l = load(seed_map("hostless:0", "hostless:1"), NULL);
    if (!l.d) return;
    CHECK(on(accel_module_get_tensor(l.m, "model.embed_tokens.weight"), H0));
    CHECK(on(accel_module_get_tensor(l.m, "model.layers.9.mlp.down_proj.weight"), H0));
    CHECK(on(accel_module_get_tensor(l.m, "model.layers.10.self_attn.q_proj.weight"), H1));
    CHECK(on(accel_module_get_tensor(l.m, "lm_head.weight"), H1));
    accel_tensor *y = logits_of(&l);
    CHECK(y && g_cpu_logits && max_diff(y, g_cpu_logits) == 0);
    accel_tensor_free(y);
    unload(&l);
}

/* Layers 0-9 offloaded to host copies, 10-19 left on disk (the mapped
 * checkpoint), everything executing on hostless:0; then the same with the
 * weights cast to bf16 (conversions on the way in) against bf16 on the cpu. */
static void test_offload_executes_on_device(void) {
    loaded l = load(seed_map("cpu", "disk"), &(accel_load_opts){.main_device = "hostless:0"});
    if (!l.d) return;
    accel_dispatch_stats s;
    accel_dispatched_stats(l.d, &s);
    CHECK(s.n_offloaded_cpu > 0 && s.n_offloaded_disk > 0);
    accel_tensor *y = logits_of(&l);
    CHECK(y && g_cpu_logits && max_diff(y, g_cpu_logits) == 0);
    accel_tensor *w = accel_module_get_tensor(l.m, "model.layers.12.mlp.up_proj.weight");
    CHECK(w && w->device.type == ACCEL_DEV_META); /* dropped again after its forward */
    accel_tensor_free(y);
    unload(&l);

    accel_load_opts bf = {.has_dtype = true, .dtype = ACCEL_BF16};
    loaded c = load(NULL, &bf);
    accel_tensor *want = logits_of(&c);
    unload(&c);
    bf.main_device = "hostless:0";
    l = load(seed_map("hostless:0", "disk"), &bf);
    y = l.d ? logits_of(&l) : NULL;
    CHECK(y && want && max_diff(y, want) == 0);
    accel_tensor_free(y);
    accel_tensor_free(want);
    unload(&l);
}

/* ---- generation */

static void generate(loaded *l, const accel_generate_opts *o, int64_t *out, int64_t *n_out) {
    CHECK_MSG(l->d && accel_generate(l->m, IDS, 3, o, out, n_out) == ACCEL_OK, "%s", accel_last_error());
}

static void test_generation_on_device(void) {
    int64_t want[16], got[16], n_want = 0, n_got = 0;
    accel_generate_opts o = {.max_new_tokens = 8};
    accel_tensor *cpu_first = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(64), ACCEL_CPU_DEVICE);
    accel_tensor *dev_first = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(64), H0);
    loaded c = load(NULL, NULL);
    o.prompt_logits = cpu_first;
    generate(&c, &o, want, &n_want);
    unload(&c);
    /* the whole model on hostless:0; the logits land on the device too */
    accel_device_map *all = accel_device_map_new();
    accel_device_map_set(all, "", "hostless:0");
    loaded l = load(all, NULL);
    o.prompt_logits = dev_first;
    generate(&l, &o, got, &n_got);
    CHECK(n_got == 11 && n_got == n_want && memcmp(got, want, sizeof got[0] * 11) == 0);
    CHECK(max_diff(dev_first, cpu_first) == 0);
    int64_t greedy_first = got[3];
    unload(&l);
    /* split over two devices (each layer's KV cache on its layer's device), sampled */
    accel_generate_opts s = {.max_new_tokens = 8, .do_sample = true, .top_k = 10, .top_p = 0.9, .seed = 5};
    c = load(NULL, NULL);
    generate(&c, &s, want, &n_want);
    unload(&c);
    l = load(seed_map("hostless:0", "hostless:1"), NULL);
    generate(&l, &s, got, &n_got);
    CHECK(n_got == n_want && memcmp(got, want, sizeof got[0] * (size_t)n_got) == 0);
    unload(&l);
    /* greedy straight from the device logits picks the first new token */
    CHECK(accel_sample_logits(dev_first, &(accel_generate_opts){0}, NULL) == greedy_first);
    accel_tensor_free(cpu_first);
    accel_tensor_free(dev_first);
}

/* ---- nn and data */

static void test_flat_params_on_device(void) {
    accel_manual_seed(3);
    accel_module *m = accel_linear_new(4, 3, true, H0, ACCEL_F32);
    accel_tensor *w = accel_module_get_tensor(m, "weight");
    accel_tensor *before = accel_tensor_clone_persistent(w, ACCEL_CPU_DEVICE);
    accel_flat_params *fp = accel_module_flatten(m, 4, 16);
    CHECK_MSG(fp != NULL, "%s", accel_last_error());
    if (fp) {
        CHECK(accel_device_eq(fp->buffers[ACCEL_F32].device, H0) && on(w, H0));
        CHECK(max_diff(w, before) == 0);
        accel_fill_(w->grad, 2.0);
        accel_flat_params_free(fp);
    }
    CHECK(on(w, H0) && max_diff(w, before) == 0);
    CHECK(w->grad && on(w->grad, H0) && accel_item(accel_sum_all(w->grad)) == 24.0);
    /* parameters on two devices cannot share one buffer */
    accel_tensor_to_device_(accel_module_get_tensor(m, "bias"), H1);
    CHECK(accel_module_flatten(m, 1, 1) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "on another device");
    accel_clear_error();
    accel_tensor_free(before);
    accel_module_free(m);
    accel_step_reset();
}

static void test_batches_from_device_tensors(void) {
    accel_device prev = accel_set_default_device(H0); /* creators now allocate on hostless:0 */
    accel_tensor *x = accel_arange(ACCEL_F32, 0, 12), *y = accel_arange(ACCEL_I64, 100, 106);
    x = accel_reshape(x, 2, (const int64_t[]){6, 2});
    CHECK(on(x, H0) && on(y, H0));
    accel_dataset *ds = accel_tensor_dataset_new(2, (accel_tensor *[]){x, y});
    CHECK_MSG(ds != NULL, "%s", accel_last_error());
    accel_dataloader_opts cfg = accel_dataloader_opts_default();
    cfg.batch_size = 4;
    accel_dataloader *dl = ds ? accel_dataloader_new(ds, &cfg) : NULL;
    accel_batch b;
    CHECK(dl && accel_dataloader_next(dl, &b));
    if (dl) {
        CHECK(b.fields[0]->device.type == ACCEL_DEV_CPU && b.fields[1]->device.type == ACCEL_DEV_CPU);
        CHECK(accel_get(b.fields[0], (const int64_t[]){3, 1}) == 7.0);
        CHECK(accel_get(b.fields[1], (const int64_t[]){2}) == 102.0);
    }
    accel_dataloader_free(dl);
    accel_dataset_free(ds);
    accel_set_default_device(prev);
    accel_step_reset();
}

int main(void) {
    if (accel_device_count(ACCEL_DEV_HOSTLESS) < 2) CHECK(accel__hostless_register(2) == ACCEL_OK);
    snprintf(g_dir, sizeof g_dir, "/tmp/accel_devbig_XXXXXX");
    CHECK(mkdtemp(g_dir) != NULL);
    RUN(test_safetensors_round_trip);
    RUN(test_safetensors_chunked);
    save_model();
    RUN(test_dispatch_two_devices);
    RUN(test_offload_executes_on_device);
    RUN(test_generation_on_device);
    RUN(test_flat_params_on_device);
    RUN(test_batches_from_device_tensors);
    accel_tensor_free(g_cpu_logits);
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    CHECK(system(cmd) == 0);
    accel_thread_cleanup();
    return check_summary();
}
