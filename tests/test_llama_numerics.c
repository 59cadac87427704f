/* A 2-layer GQA Llama against transformers (tools/gen_llama_fixtures.py):
 * logits, loss and every parameter gradient (1e-5 relative, 1e-6 absolute),
 * 10 AdamW steps (losses within 1e-4), KV-cache decoding == full forward. */
#include <stdlib.h>

#include "nn_fixture.h"

static accel_llama_config tiny_config(accel_safetensors *st) {
    accel_llama_config c = accel_llama_config_default();
    c.vocab_size = 64;
    c.hidden_size = 32;
    c.intermediate_size = 64;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.max_position_embeddings = 64;
    c.initializer_range = 0.1;
    c.rope_theta = atof(accel_safetensors_metadata(st, "rope_theta"));
    c.tie_word_embeddings = atoi(accel_safetensors_metadata(st, "tie_word_embeddings")) != 0;
    return c;
}

/* The model with the fixture's weights, loaded by transformers' names, on the
 * default device (the forward/backward fixtures run on the hostless test
 * device too: ctest's llama_numerics_hostless). */
static accel_module *load_model(accel_safetensors *st) {
    accel_llama_config c = tiny_config(st);
    accel_module *m = accel_llama_new(&c, ACCEL_CPU_DEVICE);
    if (!m) return NULL;
    accel_state_dict *sd = accel_module_state_dict(m);
    int loaded = 0;
    for (int i = 0; i < sd->n; i++) {
        if (sd->entries[i].is_tied_alias) continue;
        char name[160];
        snprintf(name, sizeof name, "w.%s", sd->entries[i].name);
        CHECK_MSG(accel_safetensors_load_into(st, name, sd->entries[i].t) == ACCEL_OK, "%s: %s", name,
                  accel_last_error());
        loaded++;
    }
    CHECK(loaded == (c.tie_word_embeddings ? 20 : 21));
    accel_state_dict_free(sd);
    CHECK_MSG(accel_module_to(m, accel_default_device()) == ACCEL_OK, "%s", accel_last_error());
    return m;
}

static void check_grads(accel_safetensors *st, accel_module *m) {
    accel_state_dict *sd = accel_module_state_dict(m);
    for (int i = 0; i < sd->n; i++) {
        if (sd->entries[i].is_tied_alias) continue;
        char name[160];
        snprintf(name, sizeof name, "g.%s", sd->entries[i].name);
        check_tensor_close(st, name, sd->entries[i].t->grad, 1e-5, 1e-6);
    }
    accel_state_dict_free(sd);
}

static void run_fixture(const char *path) {
    accel_safetensors *st = accel_safetensors_open(path);
    CHECK_MSG(st != NULL, "%s", accel_last_error());
    if (!st) return;
    accel_module *m = load_model(st);
    accel_tensor *ids = accel_safetensors_tensor(st, "ids", -1);
    CHECK(m && ids && ids->dtype == ACCEL_I64 && accel_tensor_to_device_(ids, accel_default_device()) == ACCEL_OK);

    accel_tensor *logits = accel_llama_forward(m, ids, NULL);
    CHECK_MSG(logits && logits->ndim == 3 && logits->shape[2] == 64, "%s", accel_last_error());
    check_tensor_close(st, "logits", logits, 1e-5, 1e-6);
    accel_step_reset();

    accel_tensor *loss = accel_llama_loss(m, ids);
    check_tensor_close(st, "loss", loss, 1e-6, 0);
    CHECK_MSG(accel_backward(loss) == ACCEL_OK, "%s", accel_last_error());
    check_grads(st, m);
    accel_step_reset();

    accel_tensor_free(ids);
    accel_module_free(m);
    accel_safetensors_close(st);
}

static void test_untied_theta_1e4(void) { run_fixture("data/llama_tiny_untied.safetensors"); }
static void test_tied_theta_5e5(void) { run_fixture("data/llama_tiny_tied.safetensors"); }

/* 10 AdamW steps (lr 1e-3, weight_decay 0.01) on the same batch, as PyTorch. */
static void test_adamw_10_steps(void) {
    accel_safetensors *st = accel_safetensors_open("data/llama_tiny_untied.safetensors");
    if (!st) {
        CHECK(st != NULL);
        return;
    }
    accel_module *m = load_model(st);
    accel_tensor *ids = accel_safetensors_tensor(st, "ids", -1);
    accel_tensor *want = accel_safetensors_tensor(st, "adamw_losses", ACCEL_F32);
    CHECK(ids && accel_tensor_to_device_(ids, accel_default_device()) == ACCEL_OK);
    accel_tensor **ps;
    int n = accel_module_parameters(m, &ps);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 1e-3);
    h.weight_decay = 0.01;
    accel_optimizer *opt = accel_optimizer_new_params(ACCEL_OPTIM_ADAMW, n, ps, &h);
    for (int s = 0; s < 10; s++) {
        accel_tensor *loss = accel_llama_loss(m, ids);
        CHECK_CLOSE(accel_item(loss), ((float *)want->data)[s], 0, 1e-4);
        CHECK(accel_backward(loss) == ACCEL_OK);
        CHECK(accel_optimizer_step(opt) == ACCEL_OK);
        accel_optimizer_zero_grad(opt);
        accel_step_reset();
    }
    accel_optimizer_free(opt);
    accel_free(ps);
    accel_tensor_free(want);
    accel_tensor_free(ids);
    accel_module_free(m);
    accel_safetensors_close(st);
}

/* Decoding with the KV cache (5 tokens, then 1, 1, 1) gives the logits of the
 * full forward. */
static void test_kv_cache_matches_full(void) {
    accel_safetensors *st = accel_safetensors_open("data/llama_tiny_untied.safetensors");
    if (!st) {
        CHECK(st != NULL);
        return;
    }
    accel_module *m = load_model(st);
    accel_tensor *ids = accel_safetensors_tensor(st, "ids", -1);
    CHECK(ids && accel_tensor_to_device_(ids, accel_default_device()) == ACCEL_OK);
    accel_kv_cache *kc = accel_kv_cache_new(accel_llama_config_of(m), 2, 16, accel_default_device());
    bool prev = accel_set_grad_enabled(false);
    const int64_t cuts[5] = {0, 5, 6, 7, 8};
    for (int c = 0; c < 4; c++) {
        accel_tensor *part = accel_slice(ids, 1, cuts[c], cuts[c + 1], 1);
        accel_tensor *full = accel_llama_forward(m, accel_contiguous(part), kc);
        CHECK_MSG(full != NULL, "%s", accel_last_error());
        CHECK(accel_kv_cache_len(kc) == cuts[c + 1]);
        accel_tensor *want = accel_safetensors_tensor(st, "logits", ACCEL_F32);
        accel_tensor *ref = accel_slice(want, 1, cuts[c], cuts[c + 1], 1);
        float got[2 * 5 * 64], exp_[2 * 5 * 64];
        accel_to_floats(full, got);
        accel_to_floats(ref, exp_);
        int64_t k = accel_numel(ref);
        double worst = 0;
        for (int64_t i = 0; i < k; i++) worst = fmax(worst, fabs(got[i] - exp_[i]) - 1e-5 * fabs(exp_[i]));
        CHECK_MSG(worst <= 1e-6, "chunk %d: excess %g", c, worst);
        accel_tensor_free(want);
        accel_step_reset();
    }
    /* A cache that is full refuses more tokens. */
    accel_kv_cache_reset(kc);
    CHECK(accel_kv_cache_len(kc) == 0);
    accel_tensor *big = accel_zeros(ACCEL_I64, ACCEL_SHAPE(2, 17));
    CHECK(accel_llama_forward(m, big, kc) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "KV cache");
    accel_clear_error();
    /* A cache of another head size is refused naming both (the first layer's
     * copy into it refused it, naming neither); nothing is written to it. */
    accel_llama_config other = *accel_llama_config_of(m);
    other.head_dim *= 2;
    accel_kv_cache *wide = accel_kv_cache_new(&other, 2, 16, accel_default_device());
    accel_tensor *few = accel_zeros(ACCEL_I64, ACCEL_SHAPE(2, 3));
    CHECK(wide && accel_llama_forward(m, few, wide) == NULL);
    CHECK(accel_last_status() == ACCEL_ERR_SHAPE);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_llama_forward: KV cache");
    CHECK(accel_kv_cache_len(wide) == 0);
    accel_clear_error();
    accel_kv_cache_free(wide);
    accel_set_grad_enabled(prev);
    accel_step_reset();
    accel_kv_cache_free(kc);
    accel_tensor_free(ids);
    accel_module_free(m);
    accel_safetensors_close(st);
}

/* On meta the forward computes shapes only. */
static void test_meta_forward(void) {
    accel_llama_config c = accel_llama_config_default();
    c.num_hidden_layers = 2; /* a full-width 7B-shaped model costs nothing on meta */
    accel_init_empty_weights_begin();
    accel_module *m = accel_llama_new(&c, ACCEL_CPU_DEVICE);
    accel_init_empty_weights_end();
    accel_tensor *ids = accel_empty_on(ACCEL_I64, ACCEL_SHAPE(1, 16), ACCEL_META_DEVICE);
    accel_tensor *logits = accel_llama_forward(m, ids, NULL);
    CHECK_MSG(logits && logits->device.type == ACCEL_DEV_META && logits->shape[2] == 32000, "%s",
              accel_last_error());
    accel_clear_error();
    accel_step_reset();
    accel_module_free(m);
}

int main(void) {
    RUN(test_untied_theta_1e4);
    RUN(test_tied_theta_5e5);
    RUN(test_adamw_10_steps);
    RUN(test_kv_cache_matches_full);
    RUN(test_meta_forward);
    accel_thread_cleanup();
    return check_summary();
}
