/* Packed sequences against transformers, on tools/gen_hf_packed_fixtures.py's
 * outputs (tests/data/hf_packed/<name>.safetensors) for the checkpoints of
 * tests/data/hf_arch_<name>: rows of several sequences each
 * (DataCollatorWithFlattening's format: position ids that restart, no
 * attention_mask), for Llama, the windowed Mistral and Qwen2 (windows of 8
 * inside the sequences of 9 and 11 tokens), Gemma2 (soft-capping, eager),
 * GPT-2 (learned positions), Mixtral (experts, and the routers' balance in
 * the loss) and GPT-NeoX. With accel_llama_inputs' no_cache (transformers'
 * use_cache=False): the logits within 1e-5 of transformers' (each sequence
 * attends within itself), the loss with the collator's labels (-100 at each
 * sequence's first token) and every gradient within 1e-5 relative, also with
 * gradient checkpointing; without it, transformers' forward with its cache
 * (the whole row). Then the rules: no_cache with a cache refused; with an
 * attention_mask (of ones, or with a pad) the forward without no_cache bit
 * for bit (transformers detects no packing then); position ids with no
 * restart, or none, the forward and loss without it bit for bit; each packed
 * sequence what it gives alone; the layers on hostless test devices (a
 * mask of their own where they compute, away from the ids) the same;
 * the explicit scores' gradients with a key start per query by finite
 * differences. */
#include <math.h>
#include <string.h>

#include "accel/accel.h"
#include "accel/bigmodel.h"
#include "backends/registry.h"
#include "check.h"
#include "gradcheck.h"
#include "hf_load.h"
#include "nn_fixture.h"
#include "ops/attention_masked.h"

static const char *const NAMES[] = {"llama_linear", "mistral", "qwen2_window", "gemma2", "gpt2_long", "mixtral",
                                    "neox"};
enum { B = 2, T = 20, V = 64 };

static void run(const char *name) {
    char dir[128], path[160];
    snprintf(dir, sizeof dir, "data/hf_arch_%s", name);
    snprintf(path, sizeof path, "data/hf_packed/%s.safetensors", name);
    accel_safetensors *st = accel_safetensors_open(path);
    accel_module *m = st ? hf_load_eval(dir) : NULL;
    CHECK_MSG(st && m, "%s: %s", name, accel_last_error());
    accel_tensor *ids = st ? accel_safetensors_tensor(st, "ids", -1) : NULL;
    accel_tensor *pos = st ? accel_safetensors_tensor(st, "pos", -1) : NULL;
    if (m && ids && pos) {
        accel_llama_inputs in = {.ids = ids, .position_ids = pos, .no_cache = true};
        accel_tensor *y = accel_llama_forward_ex(m, &in);
        CHECK_MSG(y != NULL, "%s: %s", name, accel_last_error());
        check_tensor_close(st, "logits", y, 0, 1e-5);
        in.no_cache = false;
        y = accel_llama_forward_ex(m, &in);
        CHECK_MSG(y != NULL, "%s: %s", name, accel_last_error());
        check_tensor_close(st, "cache_logits", y, 0, 1e-5);
        accel_step_reset();
        in.no_cache = true;
        check_llama_loss(m, st, &in, name, false, "");
        check_llama_loss(m, st, &in, name, true, "");
    }
    accel_tensor_free(ids);
    accel_tensor_free(pos);
    accel_module_free(m);
    accel_safetensors_close(st);
    accel_step_reset();
    accel_clear_error();
}

static void test_families(void) {
    for (size_t k = 0; k < sizeof NAMES / sizeof *NAMES; k++) run(NAMES[k]);
}

/* no_cache beside a cache, an attention_mask, position ids that never restart, none. */
static void test_rules(void) {
    accel_module *m = hf_load_eval("data/hf_arch_mistral");
    CHECK(m != NULL);
    if (!m) return;
    int64_t id[B * 4] = {5, 6, 7, 8, 9, 10, 11, 12}, ones[B * 4] = {1, 1, 1, 1, 1, 1, 1, 1},
            packed[B * 4] = {0, 1, 0, 1, 0, 1, 2, 3}, shifted[B * 4] = {3, 4, 5, 6, 0, 1, 2, 3};
    accel_tensor *ids = i64_matrix(B, 4, id);
    /* a cache: transformers detects no packing with one; here both at once are a contradiction */
    accel_kv_cache *kc = accel_llama_kv_cache_new(m, B, 8, ACCEL_CPU_DEVICE);
    CHECK(!accel_llama_forward_ex(m, &(accel_llama_inputs){.ids = ids, .position_ids = i64_matrix(B, 4, packed),
                                                           .cache = kc, .no_cache = true}));
    CHECK(accel_last_status() == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "no_cache is set (transformers' use_cache=False) and a KV cache is given");
    CHECK(accel_kv_cache_len(kc) == 0);
    accel_clear_error();
    accel_kv_cache_free(kc);
    /* an attention_mask, of ones or with a pad: no packing detected, the forward without no_cache */
    const int64_t pad[B * 4] = {0, 1, 1, 1, 1, 1, 1, 1};
    for (int i = 0; i < 2; i++) {
        accel_llama_inputs in = {.ids = ids, .attention_mask = i64_matrix(B, 4, i ? pad : ones),
                                 .position_ids = i64_matrix(B, 4, packed)};
        accel_tensor *want = accel_llama_forward_ex(m, &in);
        in.no_cache = true;
        CHECK_MSG(same_bits(want, accel_llama_forward_ex(m, &in)), "mask %d", i);
    }
    /* no restart in any row (whatever the first position), or no position ids: no packing */
    accel_tensor *shift = i64_matrix(B, 4, shifted);
    CHECK(same_bits(accel_llama_forward_ex(m, &(accel_llama_inputs){.ids = ids, .position_ids = shift}),
                    accel_llama_forward_ex(m, &(accel_llama_inputs){.ids = ids, .position_ids = shift,
                                                                    .no_cache = true})));
    CHECK(same_bits(accel_llama_forward(m, ids, NULL),
                    accel_llama_forward_ex(m, &(accel_llama_inputs){.ids = ids, .no_cache = true})));
    CHECK(same_bits(accel_llama_loss_ex(m, &(accel_llama_inputs){.ids = ids, .position_ids = shift}),
                    accel_llama_loss_ex(m, &(accel_llama_inputs){.ids = ids, .position_ids = shift,
                                                                 .no_cache = true})));
    /* the loss reads the position ids itself: their checks name them */
    CHECK(!accel_llama_loss_ex(m, &(accel_llama_inputs){.ids = ids, .position_ids = i64_matrix(B, 3, packed),
                                                        .no_cache = true}));
    CHECK_STR_CONTAINS(accel_last_error(), "position_ids must be [B, T] as ids: [2, 4]");
    accel_clear_error();
    const int64_t negative[B * 4] = {0, 1, 0, -1, 0, 1, 2, 3};
    CHECK(!accel_llama_loss_ex(m, &(accel_llama_inputs){.ids = ids, .position_ids = i64_matrix(B, 4, negative),
                                                        .no_cache = true}));
    CHECK_STR_CONTAINS(accel_last_error(), "position_ids[0][3] is -1");
    accel_clear_error();
    accel_step_reset();
    accel_module_free(m);
}

/* Each sequence of a packed row (past the window of 8: 11 tokens, then 6 at positions 2..7, then 3) gives
 * the logits it gives alone in a row of its own at its positions, and the loss is the mean over the labels
 * the sequences alone count. */
static void test_alone(void) {
    accel_module *m = hf_load_eval("data/hf_arch_mistral");
    CHECK(m != NULL);
    if (!m) return;
    enum { N = 20, SEQS = 3 };
    const int64_t len[SEQS] = {11, 6, 3}, first[SEQS] = {0, 2, 0};
    int64_t id[N], p[N];
    for (int t = 0; t < N; t++) id[t] = (t * 37 + 11) % V;
    for (int s = 0, at = 0; s < SEQS; at += (int)len[s], s++)
        for (int t = 0; t < len[s]; t++) p[at + t] = first[s] + t;
    accel_tensor *y = accel_llama_forward_ex(m, &(accel_llama_inputs){.ids = i64_matrix(1, N, id),
                                                                      .position_ids = i64_matrix(1, N, p), .no_cache = true});
    float got[N * V], alone[N * V];
    CHECK(y && accel_to_floats(y, got) == ACCEL_OK);
    double worst = 0, nll = 0;
    int64_t counted = 0;
    for (int s = 0, at = 0; s < SEQS; at += (int)len[s], s++) {
        accel_tensor *ys = accel_llama_forward_ex(m, &(accel_llama_inputs){.ids = i64_matrix(1, len[s], id + at),
                                                                           .position_ids = i64_matrix(1, len[s], p + at)});
        CHECK(ys && accel_to_floats(ys, alone) == ACCEL_OK);
        for (int64_t i = 0; i < len[s] * V; i++) worst = fmax(worst, fabs(got[at * V + i] - alone[i]));
        for (int64_t t = 0; t + 1 < len[s]; t++, counted++) { /* -log softmax at the next token */
            const float *row = alone + t * V;
            double mx = row[0], sum = 0;
            for (int v = 1; v < V; v++) mx = fmax(mx, row[v]);
            for (int v = 0; v < V; v++) sum += exp(row[v] - mx);
            nll += mx + log(sum) - row[id[at + t + 1]];
        }
    }
    CHECK_MSG(worst < 1e-5, "a packed sequence's logits differ from its own by %g", worst);
    accel_tensor *loss = accel_llama_loss_ex(m, &(accel_llama_inputs){.ids = i64_matrix(1, N, id),
                                                                      .position_ids = i64_matrix(1, N, p), .no_cache = true});
    float l = NAN;
    CHECK(loss && accel_to_floats(loss, &l) == ACCEL_OK);
    double own = nll / (double)counted;
    CHECK_MSG(fabs(l - own) < 1e-5, "packed loss %g, the sequences' own %g", l, own);
    accel_step_reset();
    accel_module_free(m);
}

/* Mistral on two hostless test devices (a host dereference of their memory faults), the ids on the cpu:
 * each layer makes its own mask where it computes (the forward's is on the ids' device), the logits
 * transformers'. */
static void test_layer_elsewhere(void) {
    if (accel_device_count(ACCEL_DEV_HOSTLESS) < 2) CHECK(accel__hostless_register(2) == ACCEL_OK);
    accel_safetensors *st = accel_safetensors_open("data/hf_packed/mistral.safetensors");
    accel_tensor *ids = st ? accel_safetensors_tensor(st, "ids", -1) : NULL;
    accel_tensor *pos = st ? accel_safetensors_tensor(st, "pos", -1) : NULL;
    accel_device_map *map = accel_device_map_parse("model.embed_tokens:hostless:0,model.layers.0:hostless:0,"
                                                   "model.layers.1:hostless:1,model.norm:hostless:1,"
                                                   "lm_head:hostless:1");
    accel_dispatched *d = NULL;
    accel_module *m = ids && pos && map ? accel_llama_from_pretrained("data/hf_arch_mistral", map, NULL, NULL, NULL, &d)
                                        : NULL;
    CHECK_MSG(m != NULL, "%s", accel_last_error());
    accel_tensor *y = m ? accel_llama_forward_ex(m, &(accel_llama_inputs){.ids = ids, .position_ids = pos,
                                                                           .no_cache = true})
                        : NULL;
    CHECK_MSG(y != NULL, "%s", accel_last_error());
    check_tensor_close(st, "logits", y ? accel_to_device(y, ACCEL_CPU_DEVICE) : NULL, 0, 1e-5);
    accel_step_reset();
    accel_dispatched_free(d);
    accel_module_free(m);
    accel_device_map_free(map);
    accel_tensor_free(ids);
    accel_tensor_free(pos);
    accel_safetensors_close(st);
}

/* The packed mask's attention (a key start per query, a window of 2, two query heads a key/value head)
 * of q, k, v: its gradients by central differences. */
static accel_tensor *packed_attention_loss(accel_tensor *const *in, int n, void *ctx) {
    (void)n;
    const int64_t *start = ctx;
    accel__pad_mask pm;
    if (accel__pad_mask_make(&pm, NULL, start, 1, 6, 6, 0, 2, ACCEL_F32, in[0]->device) != ACCEL_OK) return NULL;
    return gc_weighted_sum(accel__masked_attention_pad(in[0], in[1], in[2], 0, 2, &pm, true, 0.0, 0.0, 0.0, NULL,
                                                       true));
}

static void test_gradcheck(void) {
    int64_t start[6] = {0, 0, 0, 3, 3, 5}; /* sequences of 3, 2 and 1 tokens */
    accel_tensor *q = gc_randn(1, ACCEL_SHAPE(1, 2, 6, 4)), *k = gc_randn(2, ACCEL_SHAPE(1, 1, 6, 4)),
                 *v = gc_randn(3, ACCEL_SHAPE(1, 1, 6, 4));
    CHECK(gradcheck("packed attention", packed_attention_loss, start, 3, (accel_tensor *[]){q, k, v}, NULL) == 0);
    /* the last query, alone in its sequence, sees only its own key: no gradient reaches the others' */
    float gq[2 * 6 * 4];
    CHECK(accel_to_floats(q->grad, gq) == ACCEL_OK);
    bool zero = true;
    for (int h = 0; h < 2; h++)
        for (int d = 0; d < 4; d++) zero &= gq[(h * 6 + 5) * 4 + d] == 0.0f;
    CHECK(zero);
    accel_tensor_free(q);
    accel_tensor_free(k);
    accel_tensor_free(v);
    accel_step_reset();
}

int main(void) {
    RUN(test_families);
    RUN(test_rules);
    RUN(test_alone);
    RUN(test_layer_elsewhere);
    RUN(test_gradcheck);
    return check_summary();
}
