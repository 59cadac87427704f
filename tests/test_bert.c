/* BERT (accel/bert.h) against transformers, on tools/gen_hf_bert_fixtures.py's
 * tiny BertForSequenceClassification (tests/data/hf_bert_cls): a batch with
 * padding (attention_mask) and two segments (token_type_ids). Hidden states,
 * pooler output and logits within 1e-5; the cross-entropy loss and every
 * parameter's gradient within 1e-5 relative; the module tree's names and
 * types are transformers' (BertLayer its block class); save_pretrained loads back to the same logits (set
 * ACCEL_BERT_SAVED=DIR to keep that directory for
 * `tools/gen_hf_bert_fixtures.py --check-saved DIR`, transformers' side); a
 * bare BertModel checkpoint (no "bert." prefix, no head) loads its encoder;
 * gradient checkpointing gives the same gradients; dropout acts only while
 * training; config fields accel does not implement
 * are refused naming the field; loaded with a device map (cpu, disk, cpu
 * offload, a strategy's map, from shards) the same logits; the head-less
 * BertModel and gamma/beta-named checkpoints users find load through both
 * loaders. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "accel/bert.h"
#include "accel/bigmodel.h"
#include "bert_batch.h"
#include "nn_fixture.h"
#include "refuse_huge.h"

#define DIR "data/hf_bert_cls"

static char g_tmp[64];

static accel_safetensors *open_expected(void) {
    accel_safetensors *st = accel_safetensors_open(DIR "/expected.safetensors");
    CHECK_MSG(st != NULL, "%s", accel_last_error());
    return st;
}

static void check_logits(accel_module *m, accel_safetensors *st, const batch *b, const char *what) {
    accel_tensor *y = accel_bert_classify(m, b->ids, b->tt, b->mask);
    CHECK_MSG(y != NULL, "%s: %s", what, accel_last_error());
    if (y) check_tensor_close(st, "logits", y, 0, 1e-5);
    accel_step_reset();
}

static void test_forward_and_gradients(void) {
    accel_safetensors *st = open_expected();
    accel_module *m = accel_bert_from_pretrained(DIR, ACCEL_CPU_DEVICE);
    CHECK_MSG(m != NULL, "%s", accel_last_error());
    if (!m || !st) return;
    CHECK(!strcmp(m->ops->type_name, "BertForSequenceClassification"));
    CHECK(!strcmp(accel_module_find(m, "bert")->ops->type_name, "BertModel"));
    CHECK(!strcmp(accel_module_find(m, "bert.encoder.layer.1")->ops->type_name, "BertLayer"));
    CHECK(!strcmp(accel_module_find(m, "bert.encoder.layer.0.attention.self")->ops->type_name, "BertSelfAttention"));
    CHECK(accel_bert_config_of(accel_module_find(m, "bert")) == accel_bert_config_of(m));
    /* the block class of FSDP's default wrap and ZeRO-3's units, from any module of the model */
    const char *const in_model[] = {"", "bert.pooler.dense", "bert.encoder.layer.0.attention.self.query", "classifier"};
    for (int i = 0; i < 4; i++) {
        const char *cls = accel_module_decoder_layer_class(accel_module_find(m, in_model[i]));
        CHECK_MSG(cls && !strcmp(cls, "BertLayer"), "%s: %s", in_model[i], cls ? cls : "NULL");
    }
    CHECK(accel_bert_config_of(m)->num_labels == 3);
    accel_module_train(m, false); /* transformers' eval(): no dropout */
    batch b = load_batch(st);
    accel_tensor *pooled = NULL;
    accel_tensor *h = accel_bert_encode(m, b.ids, b.tt, b.mask, &pooled);
    CHECK_MSG(h && pooled, "%s", accel_last_error());
    check_tensor_close(st, "hidden", h, 0, 1e-5);
    check_tensor_close(st, "pooled", pooled, 0, 1e-5);
    accel_step_reset();
    check_logits(m, st, &b, "from_pretrained");
    /* the same batch without its mask gives other logits: the padding is masked */
    accel_tensor *unmasked = accel_bert_classify(m, b.ids, b.tt, NULL);
    float got[9], want[9];
    accel_tensor *w = accel_safetensors_tensor(st, "logits", ACCEL_F32);
    CHECK(unmasked && w && accel_to_floats(unmasked, got) == ACCEL_OK && accel_to_floats(w, want) == ACCEL_OK);
    CHECK_MSG(fabsf(got[8] - want[8]) > 1e-4, "padding changed nothing (%g vs %g)", got[8], want[8]);
    accel_tensor_free(w);
    accel_step_reset();

    accel_tensor *logits = NULL;
    accel_tensor *loss = accel_bert_loss(m, b.ids, b.tt, b.mask, b.labels, &logits);
    CHECK_MSG(loss && logits, "%s", accel_last_error());
    if (loss) {
        check_tensor_close(st, "loss", loss, 1e-5, 0);
        CHECK_MSG(accel_backward(loss) == ACCEL_OK, "%s", accel_last_error());
        accel_state_dict *sd = accel_module_state_dict(m);
        CHECK(sd->n == 5 + 16 * 2 + 2 + 2); /* embeddings and LayerNorm, 16 a layer, pooler, classifier */
        for (int i = 0; i < sd->n; i++) {
            char g[200];
            snprintf(g, sizeof g, "g.%s", sd->entries[i].name);
            check_tensor_close(st, g, sd->entries[i].t->grad, 1e-5, 1e-6);
        }
        accel_state_dict_free(sd);
    }
    accel_step_reset();
    free_batch(&b);
    accel_module_free(m);
    accel_safetensors_close(st);
}

/* The loss's gradients of m (training or not) after seeding the default generator. */
static float *grads_of(accel_module *m, const batch *b, bool training, int64_t *n_out) {
    accel_module_train(m, training);
    accel_manual_seed(7);
    accel_tensor *loss = accel_bert_loss(m, b->ids, b->tt, b->mask, b->labels, NULL);
    CHECK_MSG(loss && accel_backward(loss) == ACCEL_OK, "%s", accel_last_error());
    float *g = take_grads(m, n_out);
    accel_step_reset();
    return g;
}

/* Gradient checkpointing on the root sets every BertLayer: the fixture's
 * gradients, and bit-identical gradients in training mode (the recompute
 * draws the same dropout masks). */
static void test_gradient_checkpointing(void) {
    accel_safetensors *st = open_expected();
    accel_module *m = accel_bert_from_pretrained(DIR, ACCEL_CPU_DEVICE);
    if (!m || !st) return;
    batch b = load_batch(st);
    int64_t n = 0, n2 = 0;
    float *plain = grads_of(m, &b, true, &n);
    CHECK(accel_module_set_gradient_checkpointing(m, true) == ACCEL_OK);
    CHECK(accel_module_find(m, "bert.encoder.layer.0")->gradient_checkpointing &&
          accel_module_find(m, "bert.encoder.layer.1")->gradient_checkpointing);
    float *ckpt = grads_of(m, &b, true, &n2);
    CHECK(plain && ckpt && n == n2 && memcmp(plain, ckpt, (size_t)n * sizeof *plain) == 0);
    accel_module_train(m, false);
    accel_tensor *loss = accel_bert_loss(m, b.ids, b.tt, b.mask, b.labels, NULL);
    CHECK_MSG(loss && accel_backward(loss) == ACCEL_OK, "%s", accel_last_error());
    accel_state_dict *sd = accel_module_state_dict(m);
    for (int i = 0; i < sd->n; i++) {
        char g[200];
        snprintf(g, sizeof g, "g.%s", sd->entries[i].name);
        check_tensor_close(st, g, sd->entries[i].t->grad, 1e-5, 1e-6);
    }
    accel_state_dict_free(sd);
    accel_step_reset();
    /* a BertLayer alone has no single-tensor forward to recompute */
    CHECK(accel_module_set_gradient_checkpointing(accel_module_find(m, "bert.encoder.layer.0"), true) != ACCEL_OK);
    accel_free(plain);
    accel_free(ckpt);
    free_batch(&b);
    accel_module_free(m);
    accel_safetensors_close(st);
}

/* save_pretrained, then from_pretrained of what it wrote: the same logits. */
static void test_save_round_trip(void) {
    accel_safetensors *st = open_expected();
    accel_module *m = accel_bert_from_pretrained(DIR, ACCEL_CPU_DEVICE);
    CHECK_MSG(m && st, "%s", accel_last_error());
    if (!m || !st) return;
    const char *keep = getenv("ACCEL_BERT_SAVED");
    char out[160];
    snprintf(out, sizeof out, "%s", keep && *keep ? keep : g_tmp);
    if (!(keep && *keep)) strncat(out, "/saved", sizeof out - strlen(out) - 1);
    CHECK_MSG(accel_bert_save_pretrained(m, out, 0) == ACCEL_OK, "%s", accel_last_error());
    accel_module *back = accel_bert_from_pretrained(out, ACCEL_CPU_DEVICE);
    CHECK_MSG(back != NULL, "%s", accel_last_error());
    batch b = load_batch(st);
    if (back) {
        accel_module_train(back, false);
        check_logits(back, st, &b, "saved");
        accel_bert_config c;
        CHECK(accel_bert_config_load(out, &c) == ACCEL_OK);
        CHECK(c.num_labels == 3 && c.hidden_size == 32 && c.layer_norm_eps == 1e-12 && c.classifier_dropout < 0);
    }
    /* sharded: one shard per tensor past a tiny limit, and back */
    char sharded[200];
    snprintf(sharded, sizeof sharded, "%s/sharded", g_tmp);
    CHECK_MSG(accel_bert_save_pretrained(m, sharded, 4096) == ACCEL_OK, "%s", accel_last_error());
    accel_module *back2 = accel_bert_from_pretrained(sharded, ACCEL_CPU_DEVICE);
    CHECK_MSG(back2 != NULL, "%s", accel_last_error());
    if (back2) {
        accel_module_train(back2, false);
        check_logits(back2, st, &b, "sharded");
    }
    free_batch(&b);
    accel_module_free(back2);
    accel_module_free(back);
    accel_module_free(m);
    accel_safetensors_close(st);
}

/* A bare BertModel checkpoint (names without "bert.", no pooler or
 * classifier): its encoder loads, the head is new. */
static void test_bare_encoder_checkpoint(void) {
    accel_safetensors *st = open_expected();
    accel_module *m = accel_bert_from_pretrained(DIR, ACCEL_CPU_DEVICE);
    if (!m || !st) return;
    char dir[160], path[200];
    snprintf(dir, sizeof dir, "%s/bare", g_tmp);
    CHECK(accel_bert_config_save(dir, accel_bert_config_of(m)) == ACCEL_OK);
    accel_state_dict *sd = accel_module_state_dict(m);
    const char *names[64];
    accel_tensor *ts[64];
    int n = 0;
    for (int i = 0; i < sd->n && n < 64; i++)
        if (strncmp(sd->entries[i].name, "bert.pooler", 11) && strncmp(sd->entries[i].name, "classifier", 10)) {
            names[n] = sd->entries[i].name + 5;
            ts[n++] = sd->entries[i].t;
        }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK_MSG(accel_safetensors_save(path, n, names, ts, 0, NULL) == ACCEL_OK, "%s", accel_last_error());
    accel_module *enc = accel_bert_from_pretrained(dir, ACCEL_CPU_DEVICE);
    CHECK_MSG(enc != NULL, "%s", accel_last_error());
    batch b = load_batch(st);
    if (enc) {
        accel_module_train(enc, false);
        accel_tensor *h = accel_bert_encode(enc, b.ids, b.tt, b.mask, NULL);
        CHECK_MSG(h != NULL, "%s", accel_last_error());
        check_tensor_close(st, "hidden", h, 0, 1e-5);
        accel_step_reset();
    }
    /* a checkpoint missing an encoder weight is refused naming it */
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK(accel_safetensors_save(path, n - 1, names + 1, ts + 1, 0, NULL) == ACCEL_OK);
    accel_module *bad = accel_bert_from_pretrained(dir, ACCEL_CPU_DEVICE);
    CHECK(bad == NULL && strstr(accel_last_error(), "embeddings.word_embeddings.weight"));
    accel_module_free(bad);
    free_batch(&b);
    accel_state_dict_free(sd);
    accel_module_free(enc);
    accel_module_free(m);
    accel_safetensors_close(st);
}

/* The original Google BERT checkpoints name a LayerNorm's weight and bias
 * gamma and beta (transformers renames them on load): they load as
 * weight/bias, to the same logits. */
static void test_legacy_layer_norm_names(void) {
    accel_safetensors *st = open_expected();
    accel_module *m = accel_bert_from_pretrained(DIR, ACCEL_CPU_DEVICE);
    if (!m || !st) return;
    char dir[160], path[200];
    snprintf(dir, sizeof dir, "%s/legacy", g_tmp);
    CHECK(accel_bert_config_save(dir, accel_bert_config_of(m)) == ACCEL_OK);
    accel_state_dict *sd = accel_module_state_dict(m);
    char names[64][128];
    const char *np[64];
    accel_tensor *ts[64];
    int n = 0, renamed = 0;
    for (int i = 0; i < sd->n && n < 64; i++, n++) {
        const char *s = sd->entries[i].name, *ln = strstr(s, "LayerNorm.");
        if (ln) {
            snprintf(names[n], sizeof names[n], "%.*s%s", (int)(ln + 10 - s), s, ln[10] == 'w' ? "gamma" : "beta");
            renamed++;
        } else snprintf(names[n], sizeof names[n], "%s", s);
        np[n] = names[n];
        ts[n] = sd->entries[i].t;
    }
    CHECK(n == sd->n && renamed == 2 * (1 + 2 * 2)); /* embeddings' and two a layer, 2 layers */
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK_MSG(accel_safetensors_save(path, n, np, ts, 0, NULL) == ACCEL_OK, "%s", accel_last_error());
    accel_module *legacy = accel_bert_from_pretrained(dir, ACCEL_CPU_DEVICE);
    CHECK_MSG(legacy != NULL, "%s", accel_last_error());
    batch b = load_batch(st);
    if (legacy) {
        accel_module_train(legacy, false);
        check_logits(legacy, st, &b, "gamma/beta");
    }
    free_batch(&b);
    accel_state_dict_free(sd);
    accel_module_free(legacy);
    accel_module_free(m);
    accel_safetensors_close(st);
}

/* Out of memory building the model: the error names the tensor's module by
 * its path and the bytes, not a later "child is NULL". */
static void test_out_of_memory_named(void) {
    accel_bert_config c = accel_bert_config_default();
    c.vocab_size = 4000000000000000LL;
    c.hidden_size = 32;
    c.num_attention_heads = 4;
    c.intermediate_size = 37;
    c.num_hidden_layers = 1;
    accel_set_allocator(&(accel_allocator){refuse_huge, free_huge, NULL});
    accel_module *m = accel_bert_new(&c, ACCEL_CPU_DEVICE);
    accel_set_allocator(NULL);
    CHECK(m == NULL && accel_last_status() == ACCEL_ERR_OOM);
    CHECK_MSG(!strcmp(accel_last_error(), "building bert.embeddings.word_embeddings: out of memory allocating "
                                          "512000000000000000 bytes"), "%s", accel_last_error());
    /* in a layer: the path down to it */
    c.vocab_size = 64;
    c.intermediate_size = 4000000000000000LL;
    accel_set_allocator(&(accel_allocator){refuse_huge, free_huge, NULL});
    m = accel_bert_new(&c, ACCEL_CPU_DEVICE);
    accel_set_allocator(NULL);
    CHECK(m == NULL && accel_last_status() == ACCEL_ERR_OOM);
    CHECK_MSG(strstr(accel_last_error(), "building bert.encoder.layer.0.intermediate.dense: out of memory"), "%s",
              accel_last_error());
    accel_module_free(m);
}

/* Dropout only while training: from_pretrained gives eval mode (the
 * fixture's logits, as transformers' from_pretrained), two training
 * forwards differ, eval again matches the fixture. */
static void test_dropout_in_training_only(void) {
    accel_safetensors *st = open_expected();
    accel_module *m = accel_bert_from_pretrained(DIR, ACCEL_CPU_DEVICE);
    if (!m || !st) return;
    batch b = load_batch(st);
    CHECK(!m->training);
    check_logits(m, st, &b, "as loaded");
    accel_module_train(m, true);
    float y1[9], y2[9];
    accel_tensor *a = accel_bert_classify(m, b.ids, b.tt, b.mask);
    accel_tensor *c = accel_bert_classify(m, b.ids, b.tt, b.mask);
    CHECK(a && c && accel_to_floats(a, y1) == ACCEL_OK && accel_to_floats(c, y2) == ACCEL_OK);
    CHECK(memcmp(y1, y2, sizeof y1) != 0);
    accel_step_reset();
    accel_module_train(m, false);
    check_logits(m, st, &b, "eval");
    free_batch(&b);
    accel_module_free(m);
    accel_safetensors_close(st);
}

static void test_bad_inputs(void) {
    accel_bert_config c = accel_bert_config_default();
    c.vocab_size = 16;
    c.hidden_size = 8;
    c.num_attention_heads = 2;
    c.intermediate_size = 8;
    c.num_hidden_layers = 1;
    c.max_position_embeddings = 4;
    accel_module *m = accel_bert_new(&c, ACCEL_CPU_DEVICE);
    CHECK_MSG(m != NULL, "%s", accel_last_error());
    if (!m) return;
    accel_tensor *ids = accel_from_data(ACCEL_I64, 2, (int64_t[]){1, 3}, (int64_t[]){2, 5, 3});
    accel_tensor *mask = accel_from_data(ACCEL_I64, 2, (int64_t[]){1, 3}, (int64_t[]){1, 2, 0});
    CHECK(accel_bert_classify(m, ids, NULL, mask) == NULL && strstr(accel_last_error(), "attention_mask[0][1] is 2"));
    accel_tensor *tt = accel_from_data(ACCEL_I64, 2, (int64_t[]){1, 2}, (int64_t[]){0, 1});
    CHECK(accel_bert_classify(m, ids, tt, NULL) == NULL && strstr(accel_last_error(), "token_type_ids"));
    accel_tensor *tt_bad = accel_from_data(ACCEL_I64, 2, (int64_t[]){1, 3}, (int64_t[]){0, 1, 2});
    CHECK(accel_bert_classify(m, ids, tt_bad, NULL) == NULL); /* type 2 of type_vocab_size 2 */
    accel_tensor *longer = accel_zeros(ACCEL_I64, ACCEL_SHAPE(1, 5));
    CHECK(accel_bert_classify(m, longer, NULL, NULL) == NULL && strstr(accel_last_error(), "max_position_embeddings"));
    accel_tensor *labels = accel_from_data(ACCEL_I64, 1, (int64_t[]){2}, (int64_t[]){0, 1});
    CHECK(accel_bert_loss(m, ids, NULL, NULL, labels, NULL) == NULL && strstr(accel_last_error(), "labels"));
    CHECK(accel_bert_classify(accel_module_find(m, "bert"), ids, NULL, NULL) == NULL);
    accel_step_reset();
    accel_module_free(m);
    c.num_labels = 1;
    CHECK(accel_bert_new(&c, ACCEL_CPU_DEVICE) == NULL && strstr(accel_last_error(), "num_labels"));
    accel_module *lin = accel_linear_new(2, 2, false, ACCEL_CPU_DEVICE, ACCEL_F32);
    CHECK(accel_bert_config_of(lin) == NULL);
    CHECK(accel_bert_save_pretrained(lin, g_tmp, 0) != ACCEL_OK);
    accel_module_free(lin);
}

/* config.json fields that change the model and accel does not implement. */
static void test_refused_config_fields(void) {
    static const struct {
        const char *extra, *named;
    } CASES[] = {
        {"\"position_embedding_type\": \"relative_key\"", "position_embedding_type"},
        {"\"is_decoder\": true", "is_decoder"},
        {"\"add_cross_attention\": true", "add_cross_attention"},
        {"\"problem_type\": \"regression\"", "problem_type"},
        {"\"problem_type\": \"multi_label_classification\"", "problem_type"},
        {"\"id2label\": {\"0\": \"score\"}", "num_labels"},
        {"\"hidden_act\": \"relu\"", "hidden_act"},
        {"\"pruned_heads\": {\"0\": [1]}", "pruned_heads"},
        {"\"hidden_size\": 30", "multiple of num_attention_heads"},
        {"\"pad_token_id\": 64", "pad_token_id"},
        /* nn.Dropout raises outside [0, 1]: a negative classifier_dropout is
         * not null (hidden_dropout_prob) */
        {"\"classifier_dropout\": -0.5", "classifier_dropout is -0.5"},
        {"\"classifier_dropout\": 1.5", "classifier_dropout"},
        {"\"hidden_dropout_prob\": -0.1", "hidden_dropout_prob"},
        {"\"hidden_dropout_prob\": 1", "hidden_dropout_prob"},
        {"\"attention_probs_dropout_prob\": 2", "attention_probs_dropout_prob"},
        /* hostile values: sizes at INT64_MAX (overflow-checked), floats and
         * negatives for integers, a key twice, a NUL inside a string */
        {"\"max_position_embeddings\": 9223372036854775807", "the weights would take more than 2^63 bytes"},
        {"\"type_vocab_size\": 9223372036854775807", "the weights would take more than 2^63 bytes"},
        {"\"num_labels\": 9223372036854775807", "the weights would take more than 2^63 bytes"},
        {"\"num_hidden_layers\": 9223372036854775807", "num_hidden_layers is over accel's limit of 65536"},
        {"\"intermediate_size\": 9223372036854775808", "too big integer"},
        {"\"hidden_size\": 768.0", "'hidden_size' must be a positive integer"},
        {"\"num_hidden_layers\": -1", "'num_hidden_layers' must be a non-negative integer"},
        {"\"vocab_size\": 65", "duplicate object key near '\"vocab_size\"'"},
        {"\"hidden_act\": \"gelu\\u0000\"", "\\u0000 is not allowed"},
    };
    char path[200];
    snprintf(path, sizeof path, "%s/config.json", g_tmp);
    for (size_t i = 0; i < sizeof CASES / sizeof *CASES; i++) {
        FILE *f = fopen(path, "w");
        fprintf(f, "{\"model_type\": \"bert\", \"vocab_size\": 64, \"num_attention_heads\": 4, "
                   "%s}\n", CASES[i].extra);
        fclose(f);
        accel_bert_config c;
        CHECK(accel_bert_config_load(path, &c) != ACCEL_OK);
        CHECK_MSG(strstr(accel_last_error(), CASES[i].named) != NULL, "%s: %s", CASES[i].extra, accel_last_error());
    }
    FILE *f = fopen(path, "w");
    fprintf(f, "{\"model_type\": \"llama\"}\n");
    fclose(f);
    accel_bert_config c;
    CHECK(accel_bert_config_load(path, &c) != ACCEL_OK && strstr(accel_last_error(), "\"llama\", not \"bert\""));
    /* the fields a 4.x config carries at their implemented values load */
    f = fopen(path, "w");
    fprintf(f, "{\"model_type\": \"bert\", \"position_embedding_type\": \"absolute\", \"is_decoder\": false, "
               "\"hidden_act\": \"gelu_new\", \"classifier_dropout\": 0.2, \"pad_token_id\": null, "
               "\"torch_dtype\": \"float32\"}\n");
    fclose(f);
    CHECK_MSG(accel_bert_config_load(path, &c) == ACCEL_OK, "%s", accel_last_error());
    CHECK(c.gelu_tanh && c.classifier_dropout == 0.2 && c.pad_token_id == -1 && c.hidden_size == 768 &&
          c.num_labels == 2);
}

/* One dispatched load of dir: the fixture's logits (eval mode, as
 * from_pretrained returns it); the placement of two of its weights. */
static void check_dispatched(const char *dir, const accel_device_map *map, const char *strategy,
                             const accel_max_memory *mm, const accel_load_opts *lo, accel_dispatch_stats *stats,
                             const char *what) {
    accel_safetensors *st = open_expected();
    accel_dispatched *d = NULL;
    accel_module *m = accel_bert_from_pretrained_dispatched(dir, map, strategy, mm, lo, &d);
    CHECK_MSG(m && d && st, "%s: %s", what, accel_last_error());
    if (m && d && st) {
        CHECK(!m->training);
        batch b = load_batch(st);
        check_logits(m, st, &b, what);
        free_batch(&b);
        accel_dispatched_stats(d, stats);
    }
    accel_dispatched_free(d);
    accel_module_free(m);
    accel_safetensors_close(st);
}

/* accel_bert_from_pretrained_dispatched: layers left on disk (read from the
 * mapping when they run) and offloaded to host copies give the fixture's
 * logits, from model.safetensors and from shards; a sequential map from a
 * small cpu budget puts the rest on disk; a checkpoint without an encoder
 * weight is refused naming it. */
static void test_device_map_and_offload(void) {
    accel_device_map *map = accel_device_map_parse("bert.embeddings:cpu,bert.encoder.layer.0:disk,"
                                                   "bert.encoder.layer.1:cpu,bert.pooler:disk,classifier:cpu");
    CHECK_MSG(map != NULL, "%s", accel_last_error());
    for (int offload = 0; offload < 2 && map; offload++) {
        accel_load_opts lo = {.offload_cpu = offload};
        accel_dispatch_stats s = {0};
        check_dispatched(DIR, map, NULL, NULL, &lo, &s, offload ? "cpu offload + disk" : "cpu + disk");
        /* layer 0 (16 tensors) and the pooler (2) on disk; with offload_cpu the rest as host copies */
        CHECK_MSG(s.n_offloaded_disk == 18 && (offload ? s.n_loaded == 0 && s.n_offloaded_cpu > 0
                                                       : s.n_loaded > 0 && s.n_offloaded_cpu == 0),
                  "disk %lld, cpu offload %lld, loaded %lld", (long long)s.n_offloaded_disk,
                  (long long)s.n_offloaded_cpu, (long long)s.n_loaded);
    }
    accel_device_map_free(map);
    /* shards, and the map from a 48 KB cpu budget (less the largest layer, 30 KB, kept free as
     * Accelerate does): the embeddings on the cpu, the rest on disk */
    accel_module *m = accel_bert_from_pretrained(DIR, ACCEL_CPU_DEVICE);
    char dir[160];
    snprintf(dir, sizeof dir, "%s/dispatch_sharded", g_tmp);
    CHECK_MSG(m && accel_bert_save_pretrained(m, dir, 4096) == ACCEL_OK, "%s", accel_last_error());
    accel_max_memory mm = {0};
    CHECK(accel_max_memory_set(&mm, "cpu", "48KB") == ACCEL_OK && accel_max_memory_set(&mm, "disk", "1GB") == ACCEL_OK);
    accel_dispatch_stats s = {0};
    check_dispatched(dir, NULL, "sequential", &mm, NULL, &s, "sharded, sequential");
    CHECK_MSG(s.n_loaded > 0 && s.n_offloaded_disk > 0 && s.bytes_resident <= 48000,
              "loaded %lld (%lld bytes), disk %lld", (long long)s.n_loaded, (long long)s.bytes_resident,
              (long long)s.n_offloaded_disk);
    /* a checkpoint without an encoder weight: its key named */
    snprintf(dir, sizeof dir, "%s/dispatch_no_query", g_tmp);
    accel_state_dict *sd = m ? accel_module_state_dict(m) : NULL;
    const char *names[64];
    accel_tensor *ts[64];
    int n = 0;
    for (int i = 0; sd && i < sd->n && n < 64; i++)
        if (strcmp(sd->entries[i].name, "bert.encoder.layer.1.attention.self.query.weight"))
            names[n] = sd->entries[i].name, ts[n++] = sd->entries[i].t;
    char path[200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK(m && accel_bert_config_save(dir, accel_bert_config_of(m)) == ACCEL_OK &&
          accel_safetensors_save(path, n, names, ts, 0, NULL) == ACCEL_OK);
    accel_dispatched *d = NULL;
    accel_module *partial = accel_bert_from_pretrained_dispatched(dir, NULL, NULL, NULL, NULL, &d);
    CHECK(partial == NULL && d == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "missing key(s) (not in the checkpoint): "
                                           "['bert.encoder.layer.1.attention.self.query.weight']");
    accel_state_dict_free(sd);
    accel_module_free(m);
}

/* m's hidden states and pooler output against the fixture's. */
static void check_encoder(accel_module *m, accel_safetensors *st, const batch *b, const char *what) {
    accel_tensor *pooled = NULL;
    accel_tensor *h = accel_bert_encode(m, b->ids, b->tt, b->mask, &pooled);
    CHECK_MSG(h && pooled, "%s: %s", what, accel_last_error());
    if (h && pooled) {
        check_tensor_close(st, "hidden", h, 0, 1e-5);
        check_tensor_close(st, "pooled", pooled, 0, 1e-5);
    }
    accel_step_reset();
}

/* The classifier a head-less checkpoint leaves new: materialised on the cpu
 * (also where the map said disk: no file holds it), weight N(0, 0.02) as
 * transformers' _init_weights (std within 30% over its 96 values), bias 0. */
static void check_new_classifier(accel_module *m, const char *what) {
    accel_tensor *w = accel_module_get_tensor(m, "classifier.weight"),
                 *bias = accel_module_get_tensor(m, "classifier.bias");
    CHECK_MSG(w && bias && w->device.type == ACCEL_DEV_CPU && bias->device.type == ACCEL_DEV_CPU, "%s", what);
    if (!w || !bias || w->device.type != ACCEL_DEV_CPU || bias->device.type != ACCEL_DEV_CPU) return;
    float wv[96], bv[3];
    CHECK(accel_numel(w) == 96 && accel_to_floats(w, wv) == ACCEL_OK && accel_to_floats(bias, bv) == ACCEL_OK);
    double ss = 0;
    for (int i = 0; i < 96; i++) ss += (double)wv[i] * wv[i];
    double sd = sqrt(ss / 96);
    CHECK_MSG(sd > 0.7 * 0.02 && sd < 1.3 * 0.02, "%s: classifier weight std %g, not initializer_range 0.02", what, sd);
    CHECK_MSG(bv[0] == 0 && bv[1] == 0 && bv[2] == 0, "%s: classifier bias not zero", what);
}

/* The checkpoints users find, as tools/gen_hf_bert_fixtures.py writes them
 * from the fixture's weights: hf_bert_base, a BertModel's (names without
 * "bert.", no classifier), and hf_bert_legacy, LayerNorm weights named
 * gamma/beta. accel_bert_from_pretrained and
 * accel_bert_from_pretrained_dispatched (all on cpu, and with a map putting
 * the encoder and the classifier on disk) take both: the fixture's hidden
 * states and pooler output from the first, its logits from the second; the
 * missing classifier newly initialised and counted as missing. */
static void test_user_checkpoints_both_loaders(void) {
    accel_safetensors *st = open_expected();
    if (!st) return;
    batch b = load_batch(st);
    accel_device_map *map = accel_device_map_parse("bert.embeddings:cpu,bert.encoder:disk,bert.pooler:cpu,"
                                                   "classifier:disk");
    CHECK_MSG(map != NULL, "%s", accel_last_error());
    static const char *const DIRS[] = {"data/hf_bert_base", "data/hf_bert_legacy"};
    for (int legacy = 0; legacy < 2; legacy++) {
        const char *dir = DIRS[legacy];
        accel_module *m = accel_bert_from_pretrained(dir, ACCEL_CPU_DEVICE);
        CHECK_MSG(m != NULL, "%s: %s", dir, accel_last_error());
        if (m) {
            accel_module_train(m, false);
            if (legacy) check_logits(m, st, &b, "legacy, from_pretrained");
            else check_encoder(m, st, &b, "base, from_pretrained");
        }
        accel_module_free(m);
        for (int mapped = 0; mapped < 2; mapped++) {
            accel_dispatched *d = NULL;
            m = accel_bert_from_pretrained_dispatched(dir, mapped ? map : NULL, NULL, NULL, NULL, &d);
            CHECK_MSG(m && d, "%s%s, dispatched: %s", dir, mapped ? " (disk map)" : "", accel_last_error());
            if (!m || !d) continue;
            accel_dispatch_stats s;
            accel_dispatched_stats(d, &s);
            CHECK_MSG(s.n_missing == (legacy ? 0 : 2) && s.n_unexpected == 0, "%s: %d missing, %d unexpected", dir,
                      s.n_missing, s.n_unexpected);
            if (mapped) CHECK(s.n_offloaded_disk > 0);
            if (mapped && !legacy) /* no file holds the new head: it lives on the main device */
                CHECK(accel_dispatched_placement(d, "classifier.weight") &&
                      !strcmp(accel_dispatched_placement(d, "classifier.weight"), "cpu"));
            if (legacy) {
                check_logits(m, st, &b, mapped ? "legacy, dispatched with disk" : "legacy, dispatched");
            } else {
                check_encoder(m, st, &b, mapped ? "base, dispatched with disk" : "base, dispatched");
                check_new_classifier(m, dir);
                /* the new head runs: logits of the right shape */
                accel_tensor *y = accel_bert_classify(m, b.ids, b.tt, b.mask);
                CHECK_MSG(y && y->ndim == 2 && y->shape[1] == 3, "%s", accel_last_error());
                accel_step_reset();
            }
            accel_dispatched_free(d);
            accel_module_free(m);
        }
    }
    accel_device_map_free(map);
    free_batch(&b);
    accel_safetensors_close(st);
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/accel_bert_XXXXXX");
    CHECK(mkdtemp(g_tmp) != NULL);
    RUN(test_forward_and_gradients);
    RUN(test_gradient_checkpointing);
    RUN(test_save_round_trip);
    RUN(test_bare_encoder_checkpoint);
    RUN(test_legacy_layer_norm_names);
    RUN(test_out_of_memory_named);
    RUN(test_dropout_in_training_only);
    RUN(test_bad_inputs);
    RUN(test_refused_config_fields);
    RUN(test_device_map_and_offload);
    RUN(test_user_checkpoints_both_loaders);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_tmp);
    CHECK(system(cmd) == 0);
    return check_summary();
}
