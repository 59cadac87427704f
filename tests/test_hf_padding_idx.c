/* nn.Embedding's padding_idx against transformers, on
 * tools/gen_hf_padidx_fixtures.py's outputs (tests/data/hf_padidx/<name>):
 * the tiny checkpoints of tests/data/hf_arch_<name> with pad_token_id 3, a
 * left-padded batch with the pad id also inside the prompts, the loss with
 * the attention_mask (labels -100 at the pads). The loss and embed_tokens'
 * gradient within 1e-5: Llama's pad row exactly zero (padding_idx), Gemma's
 * lm_head's gradient only (tied), GPT-2's trained (its wte has none). Then
 * the op's own rule (the row skipped, any other row summed as before, a
 * padding_idx out of range refused) and a decoder config's pad_token_id out
 * of range refused by name. */
#include <string.h>

#include "accel/bigmodel.h"
#include "nn/nn_internal.h"
#include "nn_fixture.h"
#include "ops/embedding.h"

enum { PAD = 3 };

/* data/hf_arch_<name> built with pad_token_id PAD, its weights loaded; eval. */
static accel_module *load(const char *name) {
    char dir[128];
    snprintf(dir, sizeof dir, "data/hf_arch_%s", name);
    accel_llama_config c;
    if (accel_llama_config_load(dir, &c) != ACCEL_OK) return NULL;
    c.pad_token_id = PAD;
    accel_module *m = accel_llama_new(&c, ACCEL_CPU_DEVICE);
    accel_dispatched *d = m ? accel_load_checkpoint_in_model(m, dir, NULL, NULL) : NULL;
    if (!d) {
        accel_module_free(m);
        return NULL;
    }
    accel_dispatched_free(d);
    accel_module_train(m, false);
    return m;
}

static void run(const char *name, const char *embed, bool pad_row_zero) {
    char path[160];
    snprintf(path, sizeof path, "data/hf_padidx/%s.safetensors", name);
    accel_safetensors *st = accel_safetensors_open(path);
    accel_module *m = st ? load(name) : NULL;
    CHECK_MSG(st && m, "%s: %s", name, accel_last_error());
    accel_tensor *ids = st ? accel_safetensors_tensor(st, "ids", -1) : NULL;
    accel_tensor *mask = st ? accel_safetensors_tensor(st, "mask", -1) : NULL;
    accel_tensor *w = m ? accel_module_get_tensor(m, embed) : NULL;
    if (ids && mask && w) {
        accel_llama_inputs in = {.ids = ids, .attention_mask = mask};
        accel_tensor *loss = accel_llama_loss_ex(m, &in);
        CHECK_MSG(loss && accel_backward(loss) == ACCEL_OK, "%s: %s", name, accel_last_error());
        check_tensor_close(st, "loss", loss, 1e-5, 0);
        check_tensor_close(st, "g.embed", w->grad, 1e-5, 1e-6);
        int64_t D = w->shape[1];
        float *g = accel_malloc(sizeof(float) * (size_t)accel_numel(w));
        CHECK(w->grad && accel_to_floats(w->grad, g) == ACCEL_OK);
        bool zero = true;
        for (int64_t j = 0; j < D; j++) zero &= g[PAD * D + j] == 0.0f;
        CHECK_MSG(zero == pad_row_zero, "%s: the pad row's gradient is %szero", name, zero ? "" : "not ");
        accel_free(g);
    }
    accel_tensor_free(ids);
    accel_tensor_free(mask);
    accel_module_free(m);
    accel_safetensors_close(st);
    accel_step_reset();
    accel_clear_error();
}

/* The module and its op: row PAD starts at zero and gets no gradient
 * whichever ids look it up (the forward reads it as any other row), the
 * others their sums; a padding_idx out of range is refused. */
static void test_op(void) {
    accel_manual_seed(5);
    accel_module *e = accel__padded_embedding_create(5, 2, ACCEL_CPU_DEVICE, ACCEL_F32, 1.0, PAD);
    accel_tensor *w = e ? accel__module_tensor(e, "weight") : NULL;
    CHECK(w != NULL);
    if (!w) return;
    CHECK(accel__embedding_padding_idx(e) == PAD);
    float wv[10];
    accel_to_floats(w, wv);
    CHECK(wv[2 * PAD] == 0.0f && wv[2 * PAD + 1] == 0.0f && wv[0] != 0.0f);
    CHECK(accel_fill_(w, 2.0) == ACCEL_OK && accel_requires_grad_(w, true) == ACCEL_OK);
    accel_tensor *ids = accel_from_data(ACCEL_I64, 2, (int64_t[]){2, 3}, (int64_t[]){1, PAD, 0, PAD, 1, 4});
    accel_tensor *y = accel_module_call(e, ids); /* [2, 3, 2] */
    float yv[12], gv[10];
    CHECK(y && accel_to_floats(y, yv) == ACCEL_OK && yv[2] == 2.0f && yv[3] == 2.0f); /* the pad row read */
    CHECK(y && accel_backward(accel_sum_all(y)) == ACCEL_OK && accel_to_floats(w->grad, gv) == ACCEL_OK);
    const float want[10] = {1, 1, 2, 2, 0, 0, 0, 0, 1, 1}; /* rows 0..4 looked up 1, 2, 0, 2 (the pad), 1 times */
    CHECK(!memcmp(gv, want, sizeof want));
    CHECK(!accel__embedding_padded(ids, w, 5));
    CHECK_STR_CONTAINS(accel_last_error(), "padding_idx 5 is not below the 5 embeddings");
    CHECK(!accel__padded_embedding_create(5, 2, ACCEL_CPU_DEVICE, ACCEL_F32, 1.0, -2));
    CHECK_STR_CONTAINS(accel_last_error(), "padding_idx -2 is not below num_embeddings 5");
    accel_module *plain = accel_embedding_new(5, 2, ACCEL_CPU_DEVICE, ACCEL_F32);
    CHECK(plain && accel__embedding_padding_idx(plain) == -1);
    accel_module_free(plain);
    accel_tensor_free(ids);
    accel_module_free(e);
    accel_step_reset();
    accel_clear_error();
}

/* A decoder config's pad_token_id must be a row of the embedding (GPT-2's wte has no padding_idx). */
static void test_config_refused(void) {
    accel_llama_config c;
    CHECK(accel_llama_config_load("data/hf_arch_llama_linear", &c) == ACCEL_OK);
    c.pad_token_id = c.vocab_size;
    CHECK(!accel_llama_new(&c, ACCEL_CPU_DEVICE));
    CHECK_STR_CONTAINS(accel_last_error(), "pad_token_id 64 (the embedding's padding_idx) must be -1 (none) or below "
                                           "vocab_size 64");
    CHECK(accel_llama_config_load("data/hf_arch_gpt2_long", &c) == ACCEL_OK);
    c.pad_token_id = c.vocab_size;
    accel_module *m = accel_llama_new(&c, ACCEL_CPU_DEVICE);
    CHECK_MSG(m != NULL, "%s", accel_last_error());
    accel_module_free(m);
    accel_clear_error();
}

static void test_families(void) {
    run("llama_linear", "model.embed_tokens.weight", true);
    run("gemma", "model.embed_tokens.weight", false);
    run("gpt2_long", "transformer.wte.weight", false);
}

int main(void) {
    RUN(test_families);
    RUN(test_op);
    RUN(test_config_refused);
    return check_summary();
}
