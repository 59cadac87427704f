/* GPT-2's dropouts (config.json's embd_pdrop, attn_pdrop, resid_pdrop;
 * src/nn/llama.c) on a 1-block GPT-2 with random weights: in eval the logits
 * are those of the same weights without dropout; while training, with the
 * default generator seeded, each dropout zeroes about its fraction of what it
 * acts on and scales the rest by 1 / (1 - p) (read through module hooks: the
 * block's input for embd_pdrop, each head's attention output for attn_pdrop,
 * the residual branches for resid_pdrop); the same seed draws the same masks,
 * gradient checkpointing's recompute included; another family refuses them. */
#include <stdlib.h>
#include <string.h>

#include "nn_fixture.h"

enum { C = 32, H = 4, D = C / H, V = 64, T = 8, CAP = 64 * T * 4 * C };

static accel_module *gpt2(double embd, double attn, double resid, uint64_t seed) {
    accel_manual_seed(seed);
    accel_llama_config c = accel_llama_config_default();
    c.vocab_size = V, c.hidden_size = C, c.intermediate_size = 4 * C, c.num_hidden_layers = 1;
    c.num_attention_heads = H, c.num_key_value_heads = H, c.max_position_embeddings = T, c.rms_norm_eps = 1e-5;
    c.tie_word_embeddings = true, c.embd_pdrop = embd, c.attn_pdrop = attn, c.resid_pdrop = resid;
    snprintf(c.model_type, sizeof c.model_type, "gpt2");
    accel_module *m = accel_llama_new(&c, ACCEL_CPU_DEVICE);
    CHECK_MSG(m != NULL, "%s", accel_last_error());
    return m;
}

/* ids [B, n] of varied tokens (persistent: they outlive the steps). */
static accel_tensor *ids_of(int64_t B, int64_t n) {
    accel_tensor *t = accel_tensor_new(ACCEL_I64, 2, (int64_t[]){B, n}, ACCEL_CPU_DEVICE);
    CHECK(t != NULL);
    for (int64_t i = 0; t && i < B * n; i++) ((int64_t *)t->data)[i] = (i * 7 + 3) % V;
    return t;
}

/* A module's input (pre) or output (post), copied by its hook. */
typedef struct capture {
    bool post;
    int64_t n;
    float v[CAP];
} capture;

static accel_status keep(accel_tensor *t, capture *c) {
    c->n = accel_numel(t);
    return c->n <= CAP ? accel_to_floats(t, c->v) : accel_set_error(ACCEL_ERR_SHAPE, "capture too small");
}
static accel_status pre(accel_module *m, accel_tensor **x, void *ctx) {
    (void)m;
    capture *c = ctx;
    return c->post ? ACCEL_OK : keep(*x, c);
}
static accel_status post(accel_module *m, accel_tensor **y, void *ctx) {
    (void)m;
    capture *c = ctx;
    return c->post && *y ? keep(*y, c) : ACCEL_OK;
}

static void watch(accel_module *root, const char *path, capture *c, bool is_post) {
    c->post = is_post;
    c->n = 0;
    accel_module_hook h = {pre, post, NULL, c};
    CHECK(accel_module_set_hook(accel_module_find(root, path), &h) == ACCEL_OK);
}

/* The logits of ids (a copy), after seeding the default generator. */
static float *logits_of(accel_module *m, accel_tensor *ids, uint64_t seed) {
    accel_manual_seed(seed);
    accel_tensor *y = accel_llama_forward(m, ids, NULL);
    CHECK_MSG(y != NULL, "%s", accel_last_error());
    float *out = y ? malloc(sizeof(float) * (size_t)accel_numel(y)) : NULL;
    if (out) accel_to_floats(y, out);
    accel_step_reset();
    return out;
}

/* How many of dropped[i] = kept[i] / (1 - p) or 0 are 0; -1 when one is neither. */
static int64_t zeros_of(const float *dropped, const float *kept, int64_t n, double p) {
    int64_t zeros = 0;
    for (int64_t i = 0; i < n; i++) {
        float want = kept[i] / (float)(1.0 - p);
        if (dropped[i] == 0.0f && kept[i] != 0.0f) zeros++;
        else if (!(fabsf(dropped[i] - want) <= 1e-5f * (1.0f + fabsf(want)))) {
            fprintf(stderr, "[%lld]: %.9g, neither 0 nor %.9g\n", (long long)i, dropped[i], want);
            return -1;
        }
    }
    return zeros;
}

static void check_fraction(int64_t zeros, int64_t n, double p, const char *what) {
    double f = (double)zeros / (double)n;
    CHECK_MSG(zeros >= 0 && fabs(f - p) < 0.08, "%s: %lld of %lld dropped (%.3f, p %.2f)", what, (long long)zeros,
              (long long)n, f, p);
}

static void test_eval_is_unchanged(void) {
    accel_module *m = gpt2(0.3, 0.3, 0.3, 5), *plain = gpt2(0, 0, 0, 5);
    accel_tensor *ids = ids_of(4, T);
    if (!m || !plain || !ids) return;
    accel_module_train(m, false);
    float *a = logits_of(m, ids, 1), *b = logits_of(plain, ids, 1);
    CHECK(a && b && memcmp(a, b, sizeof(float) * 4 * T * V) == 0);
    accel_module_train(m, true);
    float *c = logits_of(m, ids, 1);
    CHECK(c && b && memcmp(c, b, sizeof(float) * 4 * T * V) != 0); /* while training it drops */
    free(a);
    free(b);
    free(c);
    accel_tensor_free(ids);
    accel_module_free(plain);
    accel_module_free(m);
}

/* embd_pdrop: the block's input is dropout(wte + wpe). */
static void test_embd_pdrop(void) {
    accel_module *m = gpt2(0.25, 0, 0, 1);
    accel_tensor *ids = ids_of(16, T);
    static capture eval, train;
    if (!m || !ids) return;
    watch(m, "transformer.h.0", &eval, false);
    accel_module_train(m, false);
    free(logits_of(m, ids, 3));
    watch(m, "transformer.h.0", &train, false);
    accel_module_train(m, true);
    free(logits_of(m, ids, 3));
    CHECK(eval.n == 16 * T * C && train.n == eval.n);
    check_fraction(zeros_of(train.v, eval.v, eval.n, 0.25), eval.n, 0.25, "embd_pdrop");
    accel_tensor_free(ids);
    accel_module_free(m);
}

/* attn_pdrop: one position, so each head's probabilities are [1]: dropped,
 * the head's output is 0, else its value vector times 1 / (1 - p). */
static void test_attn_pdrop(void) {
    accel_module *m = gpt2(0, 0.5, 0, 1);
    accel_tensor *ids = ids_of(64, 1);
    static capture eval, train;
    if (!m || !ids) return;
    watch(m, "transformer.h.0.attn.c_proj", &eval, false);
    accel_module_train(m, false);
    free(logits_of(m, ids, 3));
    watch(m, "transformer.h.0.attn.c_proj", &train, false);
    accel_module_train(m, true);
    free(logits_of(m, ids, 3));
    CHECK(eval.n == 64 * C && train.n == eval.n);
    /* a head is dropped whole: its D values are all 0 or all kept */
    int64_t heads = 64 * H, dropped = 0;
    for (int64_t h = 0; h < heads; h++) {
        int64_t z = zeros_of(train.v + h * D, eval.v + h * D, D, 0.5);
        CHECK_MSG(z == 0 || z == D, "head %lld: %lld of %d values dropped", (long long)h, (long long)z, D);
        dropped += z == D;
    }
    check_fraction(dropped, heads, 0.5, "attn_pdrop");
    accel_tensor_free(ids);
    accel_module_free(m);
}

/* resid_pdrop: ln_2's input is x + dropout(attention's c_proj output), the
 * block's output that + dropout(the MLP's c_proj output). */
static void test_resid_pdrop(void) {
    accel_module *m = gpt2(0, 0, 0.25, 1);
    accel_tensor *ids = ids_of(16, T);
    static capture x, a, h, mlp, out, da, dm;
    if (!m || !ids) return;
    watch(m, "transformer.h.0", &x, false);
    watch(m, "transformer.h.0.attn.c_proj", &a, true);
    watch(m, "transformer.h.0.ln_2", &h, false);
    watch(m, "transformer.h.0.mlp.c_proj", &mlp, true);
    watch(m, "transformer.ln_f", &out, false); /* the block's output */
    accel_module_train(m, true);
    free(logits_of(m, ids, 3));
    int64_t n = 16 * T * C;
    CHECK(x.n == n && a.n == n && h.n == n && mlp.n == n && out.n == n);
    for (int64_t i = 0; i < n; i++) da.v[i] = h.v[i] - x.v[i], dm.v[i] = out.v[i] - h.v[i];
    check_fraction(zeros_of(da.v, a.v, n, 0.25), n, 0.25, "resid_pdrop (attention)");
    check_fraction(zeros_of(dm.v, mlp.v, n, 0.25), n, 0.25, "resid_pdrop (MLP)");
    accel_tensor_free(ids);
    accel_module_free(m);
}

/* The loss's gradients (a copy) after seeding the default generator. */
static float *grads_of(accel_module *m, accel_tensor *ids, int64_t *n_out) {
    accel_manual_seed(11);
    accel_tensor *loss = accel_llama_loss(m, ids);
    CHECK_MSG(loss && accel_backward(loss) == ACCEL_OK, "%s", accel_last_error());
    float *g = take_grads(m, n_out);
    accel_step_reset();
    return g;
}

static void test_seeded_masks(void) {
    accel_module *m = gpt2(0.2, 0.2, 0.2, 2);
    accel_tensor *ids = ids_of(4, T);
    if (!m || !ids) return;
    accel_module_train(m, true);
    float *a = logits_of(m, ids, 7), *b = logits_of(m, ids, 7), *c = logits_of(m, ids, 8);
    size_t sz = sizeof(float) * 4 * T * V;
    CHECK(a && b && c && memcmp(a, b, sz) == 0 && memcmp(a, c, sz) != 0);
    /* the checkpointed block's recompute draws its forward's masks: the same gradients */
    int64_t n1 = 0, n2 = 0;
    float *plain = grads_of(m, ids, &n1);
    CHECK(accel_module_set_gradient_checkpointing(m, true) == ACCEL_OK);
    float *ckpt = grads_of(m, ids, &n2);
    CHECK(plain && ckpt && n1 == n2 && memcmp(plain, ckpt, (size_t)n1 * sizeof *plain) == 0);
    free(a);
    free(b);
    free(c);
    accel_free(plain);
    accel_free(ckpt);
    accel_tensor_free(ids);
    accel_module_free(m);
}

static void test_other_families_refuse_them(void) {
    accel_llama_config c = accel_llama_config_default();
    c.vocab_size = V, c.hidden_size = C, c.intermediate_size = 4 * C, c.num_hidden_layers = 1;
    c.num_attention_heads = H, c.num_key_value_heads = H, c.resid_pdrop = 0.1;
    accel_clear_error();
    CHECK(accel_llama_new(&c, ACCEL_CPU_DEVICE) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "dropouts: llama models have none");
}

int main(void) {
    RUN(test_eval_is_unchanged);
    RUN(test_embd_pdrop);
    RUN(test_attn_pdrop);
    RUN(test_resid_pdrop);
    RUN(test_seeded_masks);
    RUN(test_other_families_refuse_them);
    return check_summary();
}
