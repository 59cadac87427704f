/* Padded batches against transformers, on tools/gen_hf_padded_fixtures.py's
 * outputs (tests/data/hf_padded/<name>.safetensors) for the checkpoints of
 * tests/data/hf_arch_<name>: every family (windows shorter than the prompts:
 * Mistral, Qwen2, Gemma2/3, Phi-3, Mixtral, Qwen2-MoE, Starcoder2;
 * soft-capping: Gemma2; learned positions: GPT-2; experts: Mixtral,
 * Qwen3-MoE, Qwen2-MoE; Phi; GPT-NeoX; StableLM, also with qk_layernorm's
 * per-head norms; GPT-2 with scale_attn_by_inverse_layer_idx; Llama with
 * dynamic and with longrope RoPE past their 16 positions, where transformers
 * takes the batch's largest position for every row: rows 1 and 2, 13 and 9
 * tokens, differ from the same prompts alone; and the batch's last 8 columns
 * alone at their positions 12..19: by the largest position, not their
 * count). A
 * left-padded batch of three prompts (20, 13, 9 tokens): accel_llama_forward_ex's
 * logits at the mask's ones within 1e-5 of transformers' forward with the
 * attention_mask (and with generate's position ids), finite everywhere; the
 * loss with the mask (labels -100 at the pads) and every gradient within 1e-5
 * relative, also with gradient checkpointing (Mixtral's and Qwen2-MoE's with
 * the routers' balance over the kept tokens); accel_generate_batch's greedy tokens identical
 * with an eos that ends one row early (pads after it). GPT-2 with the layer
 * scaling also trains (accel_module_train) with an attention dropout that
 * drops nothing (attn_pdrop 1e-30, the other dropouts off): the attention
 * then takes the explicit scores (attention_masked.h) where the eval above
 * takes the fused kernel's key ranges, the loss and gradients within 1e-5 of
 * transformers' in model.train(). Then the refusals
 * (mask shape, dtype, values, cache length, batch), a NULL mask and a mask of
 * ones bit for bit accel_llama_forward, and the batch generation's rules
 * (right padding, empty rows, sampling by seed, eos as the pad). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "accel/bigmodel.h"
#include "nn/arch.h"
#include "gpt2_generate.h"
#include "hf_load.h"
#include "nn_fixture.h"
#include "sibling_exe.h"

static const char *const NAMES[] = {"llama_linear", "mistral", "qwen2_window", "qwen3", "gemma", "gemma2",
                                    "gemma3", "granite", "phi3", "olmo2", "gpt2_long", "mixtral",
                                    "qwen3_moe", "qwen2_moe", "phi", "neox", "stablelm", "starcoder2",
                                    "stablelm_qk", "gpt2_layer_scale", "llama_dynamic", "llama_longrope"};
/* the fixtures with transformers' loss in model.train() (train_loss, train_g.*) and its attention dropout at
 * TRAIN_ATTN_P, the others off (tools/gen_hf_padded_fixtures.py's TRAIN, ATTN_P) */
static const char *const TRAIN[] = {"gpt2_layer_scale"};
#define TRAIN_ATTN_P 1e-30
/* the fixtures with tail_logits: the last TAIL columns alone at their positions (TAIL_NAMES, TAIL) */
static const char *const TAIL_NAMES[] = {"llama_dynamic", "llama_longrope"};
enum { B = 3, T = 20, NEW = 12, PAD = 3, TAIL = 8 };

/* The rows (flat b T + t) of logits [B, T, V] the fixture lists, [n, V] (step tensor); all finite. */
static accel_tensor *gather_rows(accel_tensor *logits, const int64_t *rows, int64_t n, const char *name) {
    int64_t V = logits->shape[2];
    float *all = accel_malloc(sizeof(float) * (size_t)(B * T * V));
    float *sel = accel_arena_alloc(accel_step_arena(), sizeof(float) * (size_t)(n * V), 64);
    accel_to_floats(logits, all);
    bool finite = true;
    for (int64_t i = 0; i < B * T * V; i++) finite &= isfinite(all[i]);
    CHECK_MSG(finite, "%s: logits at the pads are not finite", name);
    for (int64_t i = 0; i < n; i++) memcpy(sel + i * V, all + rows[i] * V, sizeof(float) * (size_t)V);
    accel_free(all);
    return accel_from_data(ACCEL_F32, 2, (int64_t[]){n, V}, sel);
}

/* generate's position ids of mask [B, T]: cumsum - 1, 0 at the pads. */
static accel_tensor *positions_of(const int64_t *mask) {
    int64_t p[B * T];
    for (int b = 0; b < B; b++)
        for (int t = 0, seen = 0; t < T; t++) {
            seen += (int)mask[b * T + t];
            p[b * T + t] = mask[b * T + t] ? seen - 1 : 0;
        }
    return accel_from_data(ACCEL_I64, 2, (int64_t[]){B, T}, p);
}

/* Whether name is one of the n names of list. */
static bool listed(const char *const *list, size_t n, const char *name) {
    for (size_t k = 0; k < n; k++)
        if (!strcmp(list[k], name)) return true;
    return false;
}

/* The batch's last TAIL columns alone, at their positions in the batch (up to T - 1): dynamic and longrope
 * RoPE take their frequencies from the largest position, not from the TAIL columns' count (the fixture's
 * tail_logits). */
static void check_tail(accel_module *m, accel_safetensors *st, const int64_t *ids, const int64_t *mask,
                       const char *name) {
    int64_t tid[B * TAIL], tmask[B * TAIL], tpos[B * TAIL];
    for (int b = 0; b < B; b++)
        for (int t = 0, seen = 0; t < T; t++) { /* generate's positions (positions_of) of the last columns */
            seen += (int)mask[b * T + t];
            if (t < T - TAIL) continue;
            int i = b * TAIL + t - (T - TAIL);
            tid[i] = ids[b * T + t], tmask[i] = mask[b * T + t], tpos[i] = mask[b * T + t] ? seen - 1 : 0;
        }
    const int64_t shape[2] = {B, TAIL};
    accel_llama_inputs in = {.ids = accel_from_data(ACCEL_I64, 2, shape, tid),
                             .attention_mask = accel_from_data(ACCEL_I64, 2, shape, tmask),
                             .position_ids = accel_from_data(ACCEL_I64, 2, shape, tpos)};
    accel_tensor *y = accel_llama_forward_ex(m, &in);
    CHECK_MSG(y != NULL, "%s: %s", name, accel_last_error());
    if (y) check_tensor_close(st, "tail_logits", y, 0, 1e-5);
    accel_step_reset();
}

/* dir's model training with attention dropout at TRAIN_ATTN_P (which drops nothing, 1 - p being 1.0, but
 * routes the attention through the explicit scores) and no other: the fixture's train_ loss and gradients,
 * plain and with gradient checkpointing. */
static void check_training(const char *dir, accel_safetensors *st, accel_llama_inputs *in, const char *name) {
    accel_llama_config c;
    CHECK(accel_llama_config_load(dir, &c) == ACCEL_OK);
    c.attn_pdrop = TRAIN_ATTN_P, c.resid_pdrop = 0, c.embd_pdrop = 0;
    accel_module *m = hf_load_as(dir, &c, false);
    CHECK_MSG(m != NULL, "%s: %s", name, accel_last_error());
    if (!m) return;
    accel_module_train(m, true);
    check_llama_loss(m, st, in, name, false, "train_");
    check_llama_loss(m, st, in, name, true, "train_");
    accel_module_free(m);
}

static void check_greedy(accel_module *m, accel_safetensors *st, const int64_t *ids, const int64_t *mask,
                         const char *name) {
    accel_tensor *g = accel_safetensors_tensor(st, "greedy", -1), *e = accel_safetensors_tensor(st, "eos", -1);
    int64_t want[B * (T + NEW)], got[B * (T + NEW)], eos, cols = 0;
    CHECK(g && e && g->shape[1] <= T + NEW);
    if (g && e && g->shape[1] <= T + NEW) {
        accel_to_int64s(g, want);
        accel_to_int64s(e, &eos);
        accel_generate_opts o = {.max_new_tokens = NEW, .has_eos = true, .eos_token_id = eos, .has_pad = true,
                                 .pad_token_id = PAD};
        CHECK_MSG(accel_generate_batch(m, ids, mask, B, T, &o, got, &cols) == ACCEL_OK, "%s: %s", name,
                  accel_last_error());
        bool same = cols == g->shape[1];
        for (int64_t i = 0; same && i < B * cols; i++) same = got[i] == want[i];
        CHECK_MSG(same, "%s: batched greedy tokens differ from transformers (%lld columns, want %lld)", name,
                  (long long)cols, (long long)g->shape[1]);
    }
    accel_tensor_free(g);
    accel_tensor_free(e);
}

static void run(const char *name) {
    char dir[128], path[160];
    snprintf(dir, sizeof dir, "data/hf_arch_%s", name);
    snprintf(path, sizeof path, "data/hf_padded/%s.safetensors", name);
    accel_safetensors *st = accel_safetensors_open(path);
    accel_module *m = st ? hf_load_eval(dir) : NULL;
    CHECK_MSG(st && m, "%s: %s", name, accel_last_error());
    accel_tensor *ids = st ? accel_safetensors_tensor(st, "ids", -1) : NULL;
    accel_tensor *mask = st ? accel_safetensors_tensor(st, "mask", -1) : NULL;
    accel_tensor *rows = st ? accel_safetensors_tensor(st, "rows", -1) : NULL;
    if (m && ids && mask && rows) {
        int64_t hid[B * T], hmask[B * T], hrows[B * T], n = rows->shape[0];
        accel_to_int64s(ids, hid);
        accel_to_int64s(mask, hmask);
        accel_to_int64s(rows, hrows);
        accel_llama_inputs in = {.ids = ids, .attention_mask = mask};
        accel_tensor *y = accel_llama_forward_ex(m, &in);
        CHECK_MSG(y != NULL, "%s: %s", name, accel_last_error());
        if (y) check_tensor_close(st, "logits", gather_rows(y, hrows, n, name), 0, 1e-5);
        in.position_ids = positions_of(hmask);
        y = accel_llama_forward_ex(m, &in);
        CHECK_MSG(y != NULL, "%s: %s", name, accel_last_error());
        if (y) check_tensor_close(st, "logits_pos", gather_rows(y, hrows, n, name), 0, 1e-5);
        accel_step_reset();
        in.position_ids = NULL;
        check_llama_loss(m, st, &in, name, false, "");
        check_llama_loss(m, st, &in, name, true, "");
        if (listed(TRAIN, sizeof TRAIN / sizeof *TRAIN, name)) check_training(dir, st, &in, name);
        if (listed(TAIL_NAMES, sizeof TAIL_NAMES / sizeof *TAIL_NAMES, name)) check_tail(m, st, hid, hmask, name);
        check_greedy(m, st, hid, hmask, name);
    }
    accel_tensor_free(ids);
    accel_tensor_free(mask);
    accel_tensor_free(rows);
    accel_module_free(m);
    accel_safetensors_close(st);
    accel_step_reset();
    accel_clear_error();
}

static void test_families(void) {
    for (size_t k = 0; k < sizeof NAMES / sizeof *NAMES; k++) run(NAMES[k]);
}

/* A failed accel_llama_new chained into the forward, the loss or generation: the cause is the message (it
 * was "accel_llama_config_of: not a causal LM"; the chain rule, docs/contract.md); nothing pending: named. */
static void test_null_model_chain(void) {
    accel_llama_config c;
    CHECK(accel_llama_config_load("data/hf_arch_llama_linear", &c) == ACCEL_OK);
    c.vocab_size = -3;
    accel_tensor *ids = accel_zeros(ACCEL_I64, ACCEL_SHAPE(1, 4));
    int64_t out[8], n, mask[2] = {1, 1};
    for (int i = 0; i < 4; i++) {
        accel_clear_error();
        accel_module *m = accel_llama_new(&c, ACCEL_CPU_DEVICE);
        bool failed = i == 0   ? !accel_llama_forward(m, ids, NULL)
                      : i == 1 ? !accel_llama_loss_ex(m, &(accel_llama_inputs){.ids = ids})
                      : i == 2 ? accel_generate(m, (int64_t[]){1, 2}, 2, NULL, out, &n) != ACCEL_OK
                               : accel_generate_batch(m, (int64_t[]){1, 2}, mask, 1, 2, NULL, out, &n) != ACCEL_OK;
        CHECK_MSG(!m && failed && strstr(accel_last_error(), "accel_llama_new: sizes must be positive"), "case %d: %s", i,
                  accel_last_error());
    }
    accel_clear_error();
    CHECK(!accel_llama_forward(NULL, ids, NULL));
    CHECK_STR_CONTAINS(accel_last_error(), "not a causal LM");
    accel_clear_error();
    CHECK(accel_generate_batch(NULL, (int64_t[]){1, 2}, mask, 1, 2, NULL, out, &n) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_generate_batch: the model is NULL");
    accel_clear_error();
    accel_step_reset();
}

/* accel_generate's prompt_logits: any shape of vocab elements takes the logits (a [8, 8] failed in accel_copy_
 * after the forward, "destination shape [8, 8] != source shape [64]"); an integer tensor is refused before (it
 * took them truncated, silently). */
static void test_prompt_logits(void) {
    accel_module *m = hf_load_eval("data/hf_arch_llama_linear");
    CHECK(m != NULL);
    if (!m) return;
    accel_tensor *flat = accel_tensor_new(ACCEL_F32, 1, (int64_t[]){64}, ACCEL_CPU_DEVICE);
    accel_tensor *square = accel_tensor_new(ACCEL_F32, 2, (int64_t[]){8, 8}, ACCEL_CPU_DEVICE);
    accel_tensor *ints64 = accel_tensor_new(ACCEL_I64, 1, (int64_t[]){64}, ACCEL_CPU_DEVICE);
    int64_t out[8], n;
    accel_generate_opts o = {.max_new_tokens = 2, .prompt_logits = flat};
    CHECK(accel_generate(m, (int64_t[]){5, 6, 7}, 3, &o, out, &n) == ACCEL_OK);
    o.prompt_logits = square;
    CHECK_MSG(accel_generate(m, (int64_t[]){5, 6, 7}, 3, &o, out, &n) == ACCEL_OK, "%s", accel_last_error());
    CHECK(same_bits(flat, square));
    o.prompt_logits = ints64;
    CHECK(accel_generate(m, (int64_t[]){5, 6, 7}, 3, &o, out, &n) == ACCEL_ERR_SHAPE);
    CHECK_STR_CONTAINS(accel_last_error(), "prompt_logits int64 [64]: expected a contiguous float tensor of 64");
    accel_clear_error();
    accel_tensor_free(flat), accel_tensor_free(square), accel_tensor_free(ints64);
    accel_module_free(m);
    accel_step_reset();
}

/* Bad masks refused by name; NULL and all-ones masks are accel_llama_forward bit for bit. */
static void test_refusals(void) {
    accel_module *m = hf_load_eval("data/hf_arch_mistral");
    CHECK(m != NULL);
    if (!m) return;
    int64_t id[2 * 4] = {5, 6, 7, 8, 9, 10, 11, 12}, ones[2 * 4] = {1, 1, 1, 1, 1, 1, 1, 1};
    accel_tensor *ids = i64_matrix(2, 4, id);
    accel_tensor *plain = accel_llama_forward(m, ids, NULL);
    CHECK(same_bits(plain, accel_llama_forward_ex(m, &(accel_llama_inputs){.ids = ids})));
    CHECK(same_bits(plain, accel_llama_forward_ex(m, &(accel_llama_inputs){.ids = ids,
                                                                         .attention_mask = i64_matrix(2, 4, ones)})));
    struct {
        accel_tensor *mask;
        const char *why;
    } bad[] = {
        {i64_matrix(2, 3, ones), "attention_mask must be"},                                 /* shorter than ids */
        {i64_matrix(1, 8, ones), "attention_mask must be"},                                 /* batch mismatch */
        {accel_ones(ACCEL_F32, ACCEL_SHAPE(2, 4)), "attention_mask must be"},          /* dtype */
        {i64_matrix(2, 4, (int64_t[]){1, 1, 2, 1, 1, 1, 1, 1}), "attention_mask[0][2] is 2"}, /* values */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CHECK(!accel_llama_forward_ex(m, &(accel_llama_inputs){.ids = ids, .attention_mask = bad[i].mask}));
        CHECK_STR_CONTAINS(accel_last_error(), bad[i].why);
        accel_clear_error();
    }
    /* a row of zeros: finite don't-care logits, the other row as alone */
    accel_tensor *y = accel_llama_forward_ex(m, &(accel_llama_inputs){
        .ids = ids, .attention_mask = i64_matrix(2, 4, (int64_t[]){0, 0, 0, 0, 1, 1, 1, 1})});
    CHECK(y != NULL);
    float hy[2 * 4 * 64], hp[2 * 4 * 64];
    bool finite = y && accel_to_floats(y, hy) == ACCEL_OK && accel_to_floats(plain, hp) == ACCEL_OK;
    for (int i = 0; finite && i < 2 * 4 * 64; i++) finite = isfinite(hy[i]);
    CHECK(finite);
    double d = 0;
    for (int i = 4 * 64; i < 2 * 4 * 64; i++) d = fmax(d, fabs(hy[i] - hp[i]));
    CHECK_MSG(d < 1e-5, "the unmasked row moved by %g", d);
    /* with a cache the mask covers the cache and the new ids */
    accel_kv_cache *kc = accel_llama_kv_cache_new(m, 2, 8, ACCEL_CPU_DEVICE);
    CHECK(accel_llama_forward_ex(m, &(accel_llama_inputs){.ids = ids, .attention_mask = i64_matrix(2, 4, ones),
                                                          .cache = kc}) != NULL);
    CHECK(!accel_llama_forward_ex(m, &(accel_llama_inputs){.ids = i64_matrix(2, 1, id), .attention_mask = i64_matrix(2, 4, ones),
                                                           .cache = kc}));
    CHECK_STR_CONTAINS(accel_last_error(), "cache length + T");
    accel_clear_error();
    /* position ids out of range */
    CHECK(!accel_llama_forward_ex(m, &(accel_llama_inputs){.ids = ids, .position_ids = i64_matrix(2, 4, (int64_t[]){
                                                                            0, 1, -2, 3, 0, 1, 2, 3})}));
    CHECK_STR_CONTAINS(accel_last_error(), "position_ids[0][2] is -2");
    accel_clear_error();
    /* position ids are int64 or int32 (torch's embedding and rope take no other): uint8 and bool, which a
     * mask may be, are refused with position_ids' own dtypes */
    accel_dtype not_positions[] = {ACCEL_U8, ACCEL_BOOL, ACCEL_F32};
    for (size_t i = 0; i < sizeof not_positions / sizeof *not_positions; i++) {
        CHECK(!accel_llama_forward_ex(m, &(accel_llama_inputs){
                                             .ids = ids, .position_ids = accel_to_dtype(i64_matrix(2, 4, ones), not_positions[i])}));
        CHECK(accel_last_status() == ACCEL_ERR_SHAPE);
        CHECK_STR_CONTAINS(accel_last_error(), "position_ids must be [B, T] as ids: [2, 4] (int64 or int32, with data)");
        accel_clear_error();
    }
    CHECK(accel_llama_forward_ex(m, &(accel_llama_inputs){.ids = ids,
                                                          .position_ids = accel_to_dtype(i64_matrix(2, 4, id), ACCEL_I32)}));
    accel_kv_cache_free(kc);
    accel_step_reset();
    accel_module_free(m);
}

/* The forward generation runs (accel__llama_forward_last with the mask and
 * position ids on the host) is the one with them as tensors, bit for bit;
 * its mask checked as theirs; both at once refused. */
static void test_host_pad(void) {
    accel_module *m = hf_load_eval("data/hf_arch_mistral");
    CHECK(m != NULL);
    if (!m) return;
    int64_t id[2 * 4] = {5, 6, 7, 8, 9, 10, 11, 12}, mask[2 * 4] = {0, 0, 1, 1, 1, 1, 1, 1},
            pos[2 * 4] = {0, 0, 0, 1, 0, 1, 2, 3}, bad[2 * 4] = {0, 0, 1, 3, 1, 1, 1, 1};
    accel_llama_inputs in = {.ids = i64_matrix(2, 4, id), .attention_mask = i64_matrix(2, 4, mask),
                             .position_ids = i64_matrix(2, 4, pos)};
    accel_tensor *want = accel__llama_forward_last(m, &in, NULL);
    accel_llama_inputs ids_only = {.ids = in.ids};
    CHECK(same_bits(want, accel__llama_forward_last(m, &ids_only, &(accel__pad_host){.mask = mask, .positions = pos})));
    CHECK(!accel__llama_forward_last(m, &ids_only, &(accel__pad_host){.mask = bad, .positions = pos}));
    CHECK_STR_CONTAINS(accel_last_error(), "attention_mask[0][3] is 3");
    accel_clear_error();
    CHECK(!accel__llama_forward_last(m, &in, &(accel__pad_host){.mask = mask, .positions = pos}));
    CHECK_STR_CONTAINS(accel_last_error(), "given twice");
    accel_clear_error();
    accel_step_reset();
    accel_module_free(m);
}

/* accel_generate_batch's rules: left padding only, no empty row, the pad
 * defaulting to eos, sampling by seed (a batch of one: accel_generate's
 * draws); GPT-2's padded rows' positions, not indices, bound by n_positions. */
static void test_generate_rules(void) {
    accel_module *m = hf_load_eval("data/hf_arch_llama_linear");
    CHECK(m != NULL);
    if (!m) return;
    int64_t id[2 * 4] = {5, 6, 7, 8, 9, 10, 11, 12}, out[2 * 12], cols = 0;
    accel_generate_opts o = {.max_new_tokens = 8};
    CHECK(accel_generate_batch(m, id, (int64_t[]){1, 1, 1, 0, 1, 1, 1, 1}, 2, 4, &o, out, &cols) != ACCEL_OK);
    CHECK_STR_CONTAINS(accel_last_error(), "row 0 ends in a pad");
    CHECK(accel_generate_batch(m, id, (int64_t[]){1, 1, 1, 1, 0, 0, 0, 0}, 2, 4, &o, out, &cols) != ACCEL_OK);
    CHECK_STR_CONTAINS(accel_last_error(), "row 1 of attention_mask has no 1");
    CHECK(accel_generate_batch(m, id, (int64_t[]){1, 1, 1, 1, 0, 7, 1, 1}, 2, 4, &o, out, &cols) != ACCEL_OK);
    CHECK_STR_CONTAINS(accel_last_error(), "attention_mask[1][1] is 7");
    accel_clear_error();
    /* the options' errors name the option and the function (they were "out would not fit in memory") */
    int64_t all1[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    CHECK(accel_generate_batch(m, id, all1, 2, 4, &(accel_generate_opts){.max_new_tokens = 2, .do_sample = true,
                                                                        .temperature = NAN}, out, &cols) ==
          ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_generate_batch: `temperature` (=nan)");
    CHECK(accel_generate_batch(m, id, all1, 2, 4, &(accel_generate_opts){.max_new_tokens = -1}, out, &cols) ==
          ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_generate_batch: `max_new_tokens` (=-1) has to be a non-negative");
    /* a pad's id is embedded too: named here (it was the embedding's "id -1 at position 4") */
    CHECK(accel_generate_batch(m, (int64_t[]){5, 6, 7, 8, -1, 10, 11, 12}, (int64_t[]){1, 1, 1, 1, 0, 1, 1, 1}, 2, 4,
                               &o, out, &cols) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "ids[1][0] is -1, outside [0, 64) (a pad's id is embedded too");
    CHECK(accel_generate_batch(m, id, all1, INT64_MAX, 4, &o, out, &cols) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "out would not fit in memory");
    accel_clear_error();
    accel_generate_opts bad_pad = {.max_new_tokens = 2, .has_eos = true, .eos_token_id = 1, .has_pad = true,
                                   .pad_token_id = 64};
    CHECK(accel_generate_batch(m, id, (int64_t[]){1, 1, 1, 1, 1, 1, 1, 1}, 2, 4, &bad_pad, out, &cols) != ACCEL_OK);
    CHECK_STR_CONTAINS(accel_last_error(), "pad_token_id 64 is outside the vocabulary");
    accel_clear_error();
    /* one prompt's logits: refused for a batch (it would be left unwritten) */
    accel_tensor *pl = accel_tensor_new(ACCEL_F32, 1, (int64_t[]){64}, ACCEL_CPU_DEVICE);
    accel_generate_opts with_logits = {.max_new_tokens = 2, .prompt_logits = pl};
    CHECK(accel_generate_batch(m, id, (int64_t[]){1, 1, 1, 1, 1, 1, 1, 1}, 2, 4, &with_logits, out, &cols) ==
          ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "prompt_logits takes one prompt's logits");
    accel_tensor_free(pl);
    accel_clear_error();
    /* eos = row 0's first greedy token: it ends at once, then eos (the pad) */
    int64_t ones[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    CHECK(accel_generate_batch(m, id, ones, 2, 4, &o, out, &cols) == ACCEL_OK && cols == 12);
    o.has_eos = true, o.eos_token_id = out[4];
    int64_t again[2 * 12];
    CHECK(accel_generate_batch(m, id, ones, 2, 4, &o, again, &cols) == ACCEL_OK);
    bool row1_ends = false;
    for (int64_t t = 4; t < 12; t++) row1_ends |= out[12 + t] == o.eos_token_id;
    CHECK(!row1_ends ? cols == 12 : cols <= 12);
    for (int64_t t = 5; t < cols; t++) CHECK(again[t] == o.eos_token_id);
    /* sampling: same seed, same tokens; a batch of one draws as accel_generate */
    accel_generate_opts s = {.max_new_tokens = 8, .do_sample = true, .seed = 42};
    int64_t a[12], b1[12], n1 = 0;
    CHECK(accel_generate_batch(m, id, ones, 1, 4, &s, a, &cols) == ACCEL_OK && cols == 12);
    CHECK(accel_generate(m, id, 4, &s, b1, &n1) == ACCEL_OK && n1 == 12);
    CHECK(!memcmp(a, b1, sizeof a));
    int64_t x[24], y[24];
    CHECK(accel_generate_batch(m, id, ones, 2, 4, &s, x, &cols) == ACCEL_OK);
    CHECK(accel_generate_batch(m, id, ones, 2, 4, &s, y, &cols) == ACCEL_OK && !memcmp(x, y, sizeof x));
    accel_module_free(m);
    /* Phi-3 across longrope's switch at 16 (the batch re-run whole): a batch of one gives transformers'
     * greedy tokens of hf_arch_phi3 (a 4-token prompt, 32 new) */
    m = hf_load_eval("data/hf_arch_phi3");
    accel_safetensors *ph = accel_safetensors_open("data/hf_arch_phi3/expected.safetensors");
    accel_tensor *pp = ph ? accel_safetensors_tensor(ph, "prompt", -1) : NULL, *pg = ph ? accel_safetensors_tensor(ph, "greedy", -1) : NULL;
    CHECK(m && pp && pg && pp->shape[1] == 4 && pg->shape[1] == 36);
    if (m && pp && pg && pp->shape[1] == 4 && pg->shape[1] == 36) {
        int64_t prompt[4], want[36], got[36], one[4] = {1, 1, 1, 1};
        accel_to_int64s(pp, prompt), accel_to_int64s(pg, want);
        accel_generate_opts o32 = {.max_new_tokens = 32};
        CHECK(accel_generate_batch(m, prompt, one, 1, 4, &o32, got, &cols) == ACCEL_OK && cols == 36 &&
              !memcmp(got, want, sizeof want));
    }
    accel_tensor_free(pp), accel_tensor_free(pg);
    accel_safetensors_close(ph);
    accel_module_free(m);
    /* GPT-2 (n_positions 40): rows of 2 pads and 18 tokens, 23 new (the last one not fed back): indices up to
     * 41, positions up to 39; 24: position 40, no row */
    m = hf_load_eval("data/hf_arch_gpt2_long");
    int64_t g_ids[2 * 20] = {0}, g_mask[2 * 20] = {0}, g_out[2 * 44];
    for (int b = 0; b < 2; b++)
        for (int t = 2; t < 20; t++) g_ids[b * 20 + t] = (b * 20 + t) % 64, g_mask[b * 20 + t] = 1;
    accel_generate_opts g22 = {.max_new_tokens = 23};
    CHECK_MSG(m && accel_generate_batch(m, g_ids, g_mask, 2, 20, &g22, g_out, &cols) == ACCEL_OK && cols == 43, "%s",
              accel_last_error());
    g22.max_new_tokens = 24;
    CHECK(m && accel_generate_batch(m, g_ids, g_mask, 2, 20, &g22, g_out, &cols) != ACCEL_OK);
    CHECK_STR_CONTAINS(accel_last_error(), "below n_positions");
    accel_clear_error();
    accel_module_free(m);
}

/* examples/generate with three --ids (the mistral fixture's prompts), --eos
 * and layer 0 on disk: each row as transformers' batched greedy tokens, up
 * to its eos (the pads after it left out). */
static void test_example_batch(void) {
    char gen[8192], cmd[16384], out[8192] = {0};
    if (!sibling_exe("generate", gen, sizeof gen)) {
        CHECK(!"generate is built next to the tests");
        return;
    }
    accel_safetensors *st = accel_safetensors_open("data/hf_padded/mistral.safetensors");
    accel_tensor *ids = st ? accel_safetensors_tensor(st, "ids", -1) : NULL, *mask = accel_safetensors_tensor(st, "mask", -1),
                 *g = accel_safetensors_tensor(st, "greedy", -1), *e = accel_safetensors_tensor(st, "eos", -1);
    CHECK(ids && mask && g && e);
    if (!ids || !mask || !g || !e) return;
    int64_t hid[B * T], hm[B * T], hg[B * (T + NEW)], eos, W = g->shape[1];
    accel_to_int64s(ids, hid), accel_to_int64s(mask, hm), accel_to_int64s(g, hg), accel_to_int64s(e, &eos);
    /* layer 0 offloaded to disk: the batch through the dispatch hooks */
    int n = snprintf(cmd, sizeof cmd, "%s data/hf_arch_mistral --new-tokens %d --eos %lld --device-map "
                     "model.embed_tokens:cpu,model.layers.0:disk,model.layers.1:cpu,model.norm:cpu,lm_head:cpu",
                     gen, NEW, (long long)eos);
    for (int b = 0; b < B; b++)
        for (int t = 0, first = 1; t < T; t++)
            if (hm[b * T + t]) {
                n += snprintf(cmd + n, sizeof cmd - (size_t)n, "%s%lld", first ? " --ids " : ",", (long long)hid[b * T + t]);
                first = 0;
            }
    snprintf(cmd + n, sizeof cmd - (size_t)n, " 2>&1");
    FILE *p = popen(cmd, "r");
    size_t got = p ? fread(out, 1, sizeof out - 1, p) : 0;
    out[got] = 0;
    CHECK_MSG(p && pclose(p) == 0, "%s", out);
    for (int b = 0; b < B; b++) {
        char want[1024];
        int k = snprintf(want, sizeof want, "generated_ids[%d]=[", b), first = 1;
        for (int64_t t = 0; t < W; t++) {
            if (t < T && !hm[b * T + t]) continue;
            k += snprintf(want + k, sizeof want - (size_t)k, "%s%lld", first ? "" : ", ", (long long)hg[b * W + t]);
            first = 0;
            if (t >= T && hg[b * W + t] == eos) break;
        }
        snprintf(want + k, sizeof want - (size_t)k, "]\n");
        CHECK_STR_CONTAINS(out, want);
    }
    CHECK_STR_CONTAINS(out, "batch=3");
    /* the batch loads through the map it is given: one naming no module is refused */
    snprintf(cmd, sizeof cmd, "%s data/hf_arch_mistral --ids 1,2 --ids 3 --device-map nosuch:disk 2>&1", gen);
    p = popen(cmd, "r");
    got = p ? fread(out, 1, sizeof out - 1, p) : 0;
    out[got] = 0;
    CHECK(p && pclose(p) != 0);
    CHECK_STR_CONTAINS(out, "'nosuch'");
    /* --eos is the pad where the config has none: an id outside the vocabulary is named as the user's (it read
     * "pad_token_id -1 is outside the vocabulary") */
    snprintf(cmd, sizeof cmd, "%s data/hf_arch_mistral --ids 1,2 --ids 3 --eos -1 --new-tokens 2 2>&1", gen);
    p = popen(cmd, "r");
    got = p ? fread(out, 1, sizeof out - 1, p) : 0;
    out[got] = 0;
    CHECK(p && pclose(p) != 0);
    CHECK_STR_CONTAINS(out, "the pad id -1 (--eos: the config has no pad_token_id) is outside the vocabulary");
    /* one empty --ids: named as a batch's (it read "accel_generate: needs a model, a non-empty prompt, ...") */
    snprintf(cmd, sizeof cmd, "%s data/hf_arch_mistral --ids '' --new-tokens 2 2>&1", gen);
    p = popen(cmd, "r");
    got = p ? fread(out, 1, sizeof out - 1, p) : 0;
    out[got] = 0;
    CHECK(p && pclose(p) != 0);
    CHECK_STR_CONTAINS(out, "--ids '': not a list of 1 to 256 ids");
    accel_tensor_free(ids), accel_tensor_free(mask), accel_tensor_free(g), accel_tensor_free(e);
    accel_safetensors_close(st);
}

/* The mistral fixture's padded batch through a disk-offloaded model (the
 * same logits as in memory), a bf16 load and bf16 autocast (finite, close
 * to the f32 ones within bf16's rounding), with the batch's greedy tokens. */
static void test_offload_bf16(void) {
    accel_safetensors *st = accel_safetensors_open("data/hf_padded/mistral.safetensors");
    accel_tensor *ids = st ? accel_safetensors_tensor(st, "ids", -1) : NULL, *mask = accel_safetensors_tensor(st, "mask", -1),
                 *rows = accel_safetensors_tensor(st, "rows", -1);
    CHECK(ids && mask && rows);
    if (!ids || !mask || !rows) return;
    int64_t hid[B * T], hm[B * T], hr[B * T], out[B * (T + NEW)], cols;
    accel_to_int64s(ids, hid), accel_to_int64s(mask, hm), accel_to_int64s(rows, hr);
    accel_device_map *map = accel_device_map_parse("model.embed_tokens:cpu,model.layers.0:disk,model.layers.1:cpu,"
                                                   "model.norm:disk,lm_head:disk");
    accel_load_opts bf16 = {.has_dtype = true, .dtype = ACCEL_BF16};
    for (int k = 0; k < 2; k++) {
        accel_dispatched *d = NULL;
        accel_module *m = accel_llama_from_pretrained("data/hf_arch_mistral", k ? NULL : map, NULL, NULL,
                                                      k ? &bf16 : NULL, &d);
        CHECK_MSG(m != NULL, "%s", accel_last_error());
        accel_tensor *y = m ? accel_llama_forward_ex(m, &(accel_llama_inputs){.ids = ids, .attention_mask = mask})
                            : NULL;
        CHECK_MSG(y != NULL, "%s", accel_last_error());
        /* bf16: 8 bits of mantissa through two layers, logits of a few units */
        if (y) check_tensor_close(st, "logits", gather_rows(y, hr, rows->shape[0], k ? "bf16" : "offload"), k ? 5e-2 : 0,
                                  k ? 0.1 : 1e-5);
        accel_step_reset();
        accel_generate_opts o = {.max_new_tokens = 4};
        CHECK_MSG(m && accel_generate_batch(m, hid, hm, B, T, &o, out, &cols) == ACCEL_OK && cols == T + 4, "%s",
                  accel_last_error());
        accel_dispatched_free(d);
        accel_module_free(m);
    }
    accel_device_map_free(map);
    /* f32 weights under bf16 autocast: the mask and the unseen rows' zeros in bf16 */
    accel_module *m = hf_load_eval("data/hf_arch_mistral");
    accel_dtype prev = accel_autocast_begin(ACCEL_BF16);
    accel_tensor *y = m ? accel_llama_forward_ex(m, &(accel_llama_inputs){.ids = ids, .attention_mask = mask}) : NULL;
    accel_autocast_end(prev);
    CHECK_MSG(y != NULL, "%s", accel_last_error());
    if (y) check_tensor_close(st, "logits", gather_rows(y, hr, rows->shape[0], "autocast"), 5e-2, 0.1);
    accel_step_reset();
    accel_module_free(m);
    accel_tensor_free(ids), accel_tensor_free(mask), accel_tensor_free(rows);
    accel_safetensors_close(st);
}

/* examples/generate with two --prompt texts through the gpt2 fixture's
 * tokenizer.json: the longer one (no pads) gives transformers' greedy ids
 * of it alone, both rows decoded; the same with two --chat messages. */
static void test_example_texts(void) {
    char want[512], out[8192];
    int rc = gpt2_generate("", "--prompt 'Hello world' --prompt 'Hi' --new-tokens 8", "generated_ids[0]=[", want,
                           sizeof want, out, sizeof out);
    CHECK_MSG(rc == 0, "%s", out);
    CHECK_STR_CONTAINS(out, want);
    CHECK_STR_CONTAINS(out, "text[0]=\"Hello world");
    CHECK_STR_CONTAINS(out, "text[1]=\"Hi");
    /* the same as --chat through a template that writes the user's message alone (gpt2 adds no special tokens) */
    rc = gpt2_generate("printf \"{%% for m in messages %%}{{ m['content'] }}{%% endfor %%}\" > chat_template.jinja",
                       "--chat 'Hello world' --chat 'Hi' --new-tokens 8", "generated_ids[0]=[", want, sizeof want, out,
                       sizeof out);
    CHECK_MSG(rc == 0, "%s", out);
    CHECK_STR_CONTAINS(out, want);
    CHECK_STR_CONTAINS(out, "text[1]=\"Hi");
}

int main(void) {
    RUN(test_families);
    RUN(test_example_texts);
    RUN(test_offload_bf16);
    RUN(test_example_batch);
    RUN(test_refusals);
    RUN(test_null_model_chain);
    RUN(test_prompt_logits);
    RUN(test_host_pad);
    RUN(test_generate_rules);
    return check_summary();
}
