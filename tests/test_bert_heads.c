/* BERT's other heads (accel/bert.h) against transformers, on
 * tools/gen_hf_bert_fixtures.py's tiny BertForTokenClassification
 * (tests/data/hf_bert_tok: labels with -100s) and BertForQuestionAnswering
 * (tests/data/hf_bert_qa: positions negative and past the input): logits
 * within 1e-5, the loss and every parameter's gradient within 1e-5 relative,
 * the module trees (no pooler) and state_dict names transformers'. The head
 * comes from config.json's architectures or the caller; a BertModel
 * checkpoint (hf_bert_base) loads into each head with a new head and its
 * pooler unused, through both loaders; save_pretrained writes the head's
 * class and loads back (ACCEL_BERT_SAVED=PREFIX keeps PREFIX_tok and
 * PREFIX_qa for `tools/gen_hf_bert_fixtures.py --check-saved`); gradient
 * checkpointing, autocast and a device map per head; bad labels, positions,
 * configs and a model of another head refused by name; two models at once,
 * freed in either order. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "accel/bert.h"
#include "accel/bigmodel.h"
#include "nn_fixture.h"

#define TOK "data/hf_bert_tok"
#define QA "data/hf_bert_qa"

static char g_tmp[64];

typedef struct batch {
    accel_tensor *ids, *tt, *mask, *labels, *start, *end;
} batch;

static accel_safetensors *open_expected(const char *dir) {
    char path[128];
    snprintf(path, sizeof path, "%s/expected.safetensors", dir);
    accel_safetensors *st = accel_safetensors_open(path);
    CHECK_MSG(st != NULL, "%s", accel_last_error());
    return st;
}

/* The fixture's inputs; labels for the token classifier, positions for QA. */
static batch load_batch(accel_safetensors *st, bool qa) {
    batch b = {accel_safetensors_tensor(st, "ids", -1), accel_safetensors_tensor(st, "token_type_ids", -1),
               accel_safetensors_tensor(st, "attention_mask", -1),
               qa ? NULL : accel_safetensors_tensor(st, "labels", -1),
               qa ? accel_safetensors_tensor(st, "start_positions", -1) : NULL,
               qa ? accel_safetensors_tensor(st, "end_positions", -1) : NULL};
    CHECK(b.ids && b.tt && b.mask && (qa ? b.start && b.end : b.labels != NULL));
    return b;
}

static void free_batch(batch *b) {
    accel_tensor_free(b->ids);
    accel_tensor_free(b->tt);
    accel_tensor_free(b->mask);
    accel_tensor_free(b->labels);
    accel_tensor_free(b->start);
    accel_tensor_free(b->end);
}

/* m's logits on the fixture's batch against its expected ones (rtol, atol). */
static void check_logits(accel_module *m, accel_safetensors *st, const batch *b, bool qa, double tol,
                         const char *what) {
    accel_tensor *end = NULL;
    accel_tensor *y = qa ? accel_bert_qa_logits(m, b->ids, b->tt, b->mask, &end)
                         : accel_bert_token_classify(m, b->ids, b->tt, b->mask);
    CHECK_MSG(y != NULL, "%s: %s", what, accel_last_error());
    if (y) check_tensor_close(st, qa ? "start_logits" : "logits", y, tol, tol);
    if (y && qa) check_tensor_close(st, "end_logits", end, tol, tol);
    accel_step_reset();
}

static accel_tensor *head_loss(accel_module *m, const batch *b, bool qa) {
    return qa ? accel_bert_qa_loss(m, b->ids, b->tt, b->mask, b->start, b->end, NULL, NULL)
              : accel_bert_token_loss(m, b->ids, b->tt, b->mask, b->labels, NULL);
}

/* The loss and every gradient of m (eval mode) against the fixture's. */
static void check_loss_and_grads(accel_module *m, accel_safetensors *st, const batch *b, bool qa) {
    accel_tensor *loss = head_loss(m, b, qa);
    CHECK_MSG(loss != NULL, "%s", accel_last_error());
    if (!loss) return;
    check_tensor_close(st, "loss", loss, 1e-5, 0);
    CHECK_MSG(accel_backward(loss) == ACCEL_OK, "%s", accel_last_error());
    accel_state_dict *sd = accel_module_state_dict(m);
    CHECK_MSG(sd->n == 5 + 16 + 2, "%d tensors", sd->n); /* embeddings + LayerNorm, one layer, the head */
    for (int i = 0; i < sd->n; i++) {
        char g[200];
        snprintf(g, sizeof g, "g.%s", sd->entries[i].name);
        check_tensor_close(st, g, sd->entries[i].t->grad, 1e-5, 1e-6);
        accel_zero_(sd->entries[i].t->grad);
    }
    accel_state_dict_free(sd);
    accel_step_reset();
}

/* Each fixture from its own config (the head its architectures name): the
 * tree, logits, loss and gradients; QA's positions as [B, 1] too. */
static void test_heads_against_transformers(void) {
    static const char *const DIRS[2] = {TOK, QA};
    static const char *const CLS[2] = {"BertForTokenClassification", "BertForQuestionAnswering"};
    static const char *const HEAD[2] = {"classifier", "qa_outputs"};
    for (int qa = 0; qa < 2; qa++) {
        accel_safetensors *st = open_expected(DIRS[qa]);
        accel_module *m = accel_bert_from_pretrained(DIRS[qa], ACCEL_CPU_DEVICE);
        CHECK_MSG(m && st, "%s: %s", DIRS[qa], accel_last_error());
        if (!m || !st) continue;
        CHECK_MSG(!strcmp(m->ops->type_name, CLS[qa]), "%s", m->ops->type_name);
        CHECK(accel_bert_config_of(m)->head == (qa ? ACCEL_BERT_QUESTION_ANSWERING : ACCEL_BERT_TOKEN_CLASSIFICATION));
        CHECK(accel_bert_config_of(m)->num_labels == (qa ? 2 : 5));
        CHECK(accel_module_find(m, "bert.pooler") == NULL && accel_module_find(m, HEAD[qa]) != NULL);
        const char *cls = accel_module_decoder_layer_class(accel_module_find(m, HEAD[qa]));
        CHECK(cls && !strcmp(cls, "BertLayer"));
        accel_module_train(m, false);
        batch b = load_batch(st, qa);
        check_logits(m, st, &b, qa, 1e-5, CLS[qa]);
        check_loss_and_grads(m, st, &b, qa);
        if (qa) { /* transformers squeezes [B, 1] positions */
            accel_tensor *s1 = accel_reshape(b.start, 2, (int64_t[]){3, 1}), *e1 = accel_reshape(b.end, 2, (int64_t[]){3, 1});
            accel_tensor *start = NULL, *end = NULL;
            accel_tensor *loss = accel_bert_qa_loss(m, b.ids, b.tt, b.mask, s1, e1, &start, &end);
            CHECK_MSG(loss && start && end, "%s", accel_last_error());
            if (loss) check_tensor_close(st, "loss", loss, 1e-5, 0);
            if (start) check_tensor_close(st, "start_logits", start, 1e-5, 1e-5);
            accel_step_reset();
        } else { /* the logits out of the loss */
            accel_tensor *logits = NULL;
            CHECK(accel_bert_token_loss(m, b.ids, b.tt, b.mask, b.labels, &logits) && logits);
            if (logits) check_tensor_close(st, "logits", logits, 1e-5, 1e-5);
            accel_step_reset();
        }
        free_batch(&b);
        accel_module_free(m);
        accel_safetensors_close(st);
    }
}

/* Gradient checkpointing sets the head's BertLayers: bit-identical
 * gradients in training mode (the same dropout masks); under bf16 autocast
 * the logits stay near the fixture's. */
static void test_checkpointing_and_autocast(void) {
    static const char *const DIRS[2] = {TOK, QA};
    for (int qa = 0; qa < 2; qa++) {
        accel_safetensors *st = open_expected(DIRS[qa]);
        accel_module *m = accel_bert_from_pretrained(DIRS[qa], ACCEL_CPU_DEVICE);
        if (!m || !st) continue;
        batch b = load_batch(st, qa);
        float *g[2] = {NULL, NULL};
        int64_t n[2] = {0, 0};
        for (int ck = 0; ck < 2; ck++) {
            CHECK(accel_module_set_gradient_checkpointing(m, ck) == ACCEL_OK);
            CHECK(accel_module_find(m, "bert.encoder.layer.0")->gradient_checkpointing == ck);
            accel_manual_seed(5);
            accel_tensor *loss = head_loss(m, &b, qa); /* training: dropout acts */
            CHECK_MSG(loss && accel_backward(loss) == ACCEL_OK, "%s", accel_last_error());
            g[ck] = take_grads(m, &n[ck]);
            accel_step_reset();
        }
        CHECK_MSG(g[0] && g[1] && n[0] == n[1] && !memcmp(g[0], g[1], (size_t)n[0] * sizeof(float)),
                  "%s: checkpointed gradients differ", DIRS[qa]);
        accel_free(g[0]);
        accel_free(g[1]);
        accel_module_train(m, false);
        accel_dtype prev = accel_autocast_begin(ACCEL_BF16);
        check_logits(m, st, &b, qa, 0.05, "bf16 autocast");
        accel_tensor *loss = head_loss(m, &b, qa);
        CHECK_MSG(loss && accel_backward(loss) == ACCEL_OK, "bf16: %s", accel_last_error());
        accel_autocast_end(prev);
        accel_step_reset();
        free_batch(&b);
        accel_module_free(m);
        accel_safetensors_close(st);
    }
}

/* A head's weight newly initialised: N(0, 0.02) (std within 40% over its
 * values), bias 0, on the cpu. */
static void check_new_head(accel_module *m, const char *head, int64_t labels, const char *what) {
    char wn[64], bn[64];
    snprintf(wn, sizeof wn, "%s.weight", head);
    snprintf(bn, sizeof bn, "%s.bias", head);
    accel_tensor *w = accel_module_get_tensor(m, wn), *bias = accel_module_get_tensor(m, bn);
    CHECK_MSG(w && bias && w->device.type == ACCEL_DEV_CPU && accel_numel(w) == 32 * labels, "%s", what);
    if (!w || !bias || w->device.type != ACCEL_DEV_CPU || accel_numel(w) != 32 * labels) return;
    float wv[32 * 5], bv[5];
    CHECK(accel_to_floats(w, wv) == ACCEL_OK && accel_to_floats(bias, bv) == ACCEL_OK);
    double ss = 0;
    for (int64_t i = 0; i < 32 * labels; i++) ss += (double)wv[i] * wv[i];
    double sd = sqrt(ss / (double)(32 * labels));
    CHECK_MSG(sd > 0.6 * 0.02 && sd < 1.4 * 0.02, "%s: %s std %g, not initializer_range 0.02", what, wn, sd);
    for (int64_t i = 0; i < labels; i++) CHECK_MSG(bv[i] == 0, "%s: %s not zero", what, bn);
}

/* hf_bert_base (BertModel.save_pretrained: names without "bert.", its
 * pooler, no head) into each head chosen by the caller, through both
 * loaders (all on cpu, and the encoder on disk): the encoder is
 * hf_bert_cls's (its fixture's hidden states), the head new, the pooler's
 * two tensors unexpected. A sequence classifier's checkpoint (hf_bert_cls)
 * into a token classifier: its classifier (the same names and shape) loads,
 * its pooler is unused. */
static void test_base_checkpoint_into_each_head(void) {
    accel_safetensors *cls = accel_safetensors_open("data/hf_bert_cls/expected.safetensors");
    CHECK(cls != NULL);
    if (!cls) return;
    accel_tensor *ids = accel_safetensors_tensor(cls, "ids", -1), *tt = accel_safetensors_tensor(cls, "token_type_ids", -1),
                 *mask = accel_safetensors_tensor(cls, "attention_mask", -1);
    /* the encoder and the head on disk: the new head lives on the cpu (no file holds it) */
    accel_device_map *maps[2] = {accel_device_map_parse("bert.embeddings:cpu,bert.encoder:disk,classifier:disk"),
                                 accel_device_map_parse("bert.embeddings:cpu,bert.encoder:disk,qa_outputs:disk")};
    CHECK_MSG(maps[0] && maps[1], "%s", accel_last_error());
    static const accel_bert_head HEADS[2] = {ACCEL_BERT_TOKEN_CLASSIFICATION, ACCEL_BERT_QUESTION_ANSWERING};
    /* QA needs 2 labels: hf_bert_base's config has 3, refused naming them
     * (the caller's 2 below load) */
    CHECK(accel_bert_from_pretrained_head("data/hf_bert_base", ACCEL_BERT_QUESTION_ANSWERING, 0, ACCEL_CPU_DEVICE) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "num_labels must be 2");
    CHECK(accel_bert_from_pretrained_head("data/hf_bert_base", ACCEL_BERT_QUESTION_ANSWERING, 3, ACCEL_CPU_DEVICE) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "num_labels must be 2");
    for (int qa = 0; qa < 2; qa++) {
        const char *head = qa ? "qa_outputs" : "classifier", *dir = "data/hf_bert_base";
        int64_t labels = qa ? 2 : 5;
        for (int way = 0; way < 3; way++) {
            accel_dispatched *d = NULL;
            /* the token head with the caller's 5 labels (transformers' num_labels=5) */
            accel_module *m = way == 0 ? accel_bert_from_pretrained_head(dir, HEADS[qa], labels, ACCEL_CPU_DEVICE)
                                       : accel_bert_from_pretrained_head_dispatched(dir, HEADS[qa], labels,
                                                                                    way == 2 ? maps[qa] : NULL, NULL,
                                                                                    NULL, NULL, &d);
            CHECK_MSG(m != NULL, "%s way %d: %s", head, way, accel_last_error());
            if (!m) continue;
            CHECK(!strcmp(m->ops->type_name, accel_bert_head_name(HEADS[qa])) && !accel_module_find(m, "bert.pooler"));
            if (d) {
                accel_dispatch_stats s;
                accel_dispatched_stats(d, &s);
                CHECK_MSG(s.n_missing == 2 && s.n_unexpected == 2, "%s way %d: %lld missing, %lld unexpected", head,
                          way, (long long)s.n_missing, (long long)s.n_unexpected);
            }
            accel_module_train(m, false);
            accel_tensor *pooled = NULL;
            accel_tensor *h = accel_bert_encode(m, ids, tt, mask, NULL);
            CHECK_MSG(h != NULL, "%s", accel_last_error());
            if (h) check_tensor_close(cls, "hidden", h, 0, 1e-5);
            /* no pooler to run */
            CHECK(accel_bert_encode(m, ids, tt, mask, &pooled) == NULL && pooled == NULL);
            CHECK_STR_CONTAINS(accel_last_error(), "has no pooler");
            accel_step_reset();
            check_new_head(m, head, labels, head);
            accel_dispatched_free(d);
            accel_module_free(m);
        }
    }
    accel_device_map_free(maps[0]);
    accel_device_map_free(maps[1]);
    /* a sequence classifier's checkpoint into a token classifier */
    accel_module *seq = accel_bert_from_pretrained("data/hf_bert_cls", ACCEL_CPU_DEVICE);
    accel_module *tok = accel_bert_from_pretrained_head("data/hf_bert_cls", ACCEL_BERT_TOKEN_CLASSIFICATION, 0,
                                                        ACCEL_CPU_DEVICE);
    CHECK_MSG(seq && tok, "%s", accel_last_error());
    if (seq && tok) {
        float a[96], b[96];
        CHECK(accel_to_floats(accel_module_get_tensor(seq, "classifier.weight"), a) == ACCEL_OK &&
              accel_to_floats(accel_module_get_tensor(tok, "classifier.weight"), b) == ACCEL_OK &&
              !memcmp(a, b, sizeof a));
        accel_module_train(tok, false);
        accel_tensor *y = accel_bert_token_classify(tok, ids, tt, mask);
        CHECK(y && y->ndim == 3 && y->shape[0] == 3 && y->shape[1] == 12 && y->shape[2] == 3);
        accel_step_reset();
    }
    accel_dispatched *d = NULL;
    accel_module *tok2 = accel_bert_from_pretrained_head_dispatched("data/hf_bert_cls", ACCEL_BERT_TOKEN_CLASSIFICATION,
                                                                    0, NULL, NULL, NULL, NULL, &d);
    CHECK_MSG(tok2 && d, "%s", accel_last_error());
    if (d) {
        accel_dispatch_stats s;
        accel_dispatched_stats(d, &s);
        CHECK_MSG(s.n_missing == 0 && s.n_unexpected == 2, "%lld missing, %lld unexpected", (long long)s.n_missing,
                  (long long)s.n_unexpected);
    }
    /* strict: the unused pooler is an error naming it */
    accel_dispatched *d2 = NULL;
    accel_load_opts strict = {.strict = true};
    CHECK(accel_bert_from_pretrained_head_dispatched("data/hf_bert_cls", ACCEL_BERT_TOKEN_CLASSIFICATION, 0, NULL,
                                                     NULL, NULL, &strict, &d2) == NULL && d2 == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "unexpected key(s): ['bert.pooler.dense.bias', 'bert.pooler.dense.weight']");
    /* the caller's 9 labels over a checkpoint's 3-label classifier: its shape named (transformers
     * raises too, without ignore_mismatched_sizes) */
    CHECK(accel_bert_from_pretrained_head("data/hf_bert_cls", ACCEL_BERT_TOKEN_CLASSIFICATION, 9, ACCEL_CPU_DEVICE) ==
          NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "classifier.weight");
    /* heads that are not accel_bert_head's */
    CHECK(accel_bert_from_pretrained_head("data/hf_bert_cls", (accel_bert_head)-1, 0, ACCEL_CPU_DEVICE) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "head -1 is not an accel_bert_head");
    CHECK(accel_bert_from_pretrained_head("data/hf_bert_cls", ACCEL_BERT_HEADS, 0, ACCEL_CPU_DEVICE) == NULL);
    CHECK(accel_bert_from_pretrained_head_dispatched("data/hf_bert_cls", 7, 0, NULL, NULL, NULL, NULL, &d2) == NULL &&
          d2 == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "head 7 is not an accel_bert_head");
    accel_dispatched_free(d);
    accel_module_free(tok2);
    accel_module_free(tok);
    accel_module_free(seq);
    accel_tensor_free(ids);
    accel_tensor_free(tt);
    accel_tensor_free(mask);
    accel_safetensors_close(cls);
}

/* save_pretrained of each head writes its class in architectures; loaded
 * back (the head from the config), the same logits; sharded too; through
 * the dispatched loader with the encoder on disk. */
static void test_save_round_trip(void) {
    static const char *const DIRS[2] = {TOK, QA};
    const char *keep = getenv("ACCEL_BERT_SAVED");
    for (int qa = 0; qa < 2; qa++) {
        accel_safetensors *st = open_expected(DIRS[qa]);
        accel_module *m = accel_bert_from_pretrained(DIRS[qa], ACCEL_CPU_DEVICE);
        if (!m || !st) continue;
        accel_device_map *map = accel_device_map_parse(qa ? "bert.embeddings:cpu,bert.encoder:disk,qa_outputs:cpu"
                                                          : "bert.embeddings:cpu,bert.encoder:disk,classifier:cpu");
        char out[200];
        snprintf(out, sizeof out, "%s_%s", keep && *keep ? keep : g_tmp, qa ? "qa" : "tok");
        CHECK_MSG(accel_bert_save_pretrained(m, out, qa ? 2048 : 0) == ACCEL_OK, "%s", accel_last_error());
        accel_bert_config c;
        CHECK_MSG(accel_bert_config_load(out, &c) == ACCEL_OK, "%s", accel_last_error());
        CHECK(c.head == accel_bert_config_of(m)->head && c.num_labels == (qa ? 2 : 5));
        batch b = load_batch(st, qa);
        accel_module *back = accel_bert_from_pretrained(out, ACCEL_CPU_DEVICE);
        CHECK_MSG(back != NULL, "%s", accel_last_error());
        if (back) {
            CHECK(!strcmp(back->ops->type_name, m->ops->type_name));
            accel_module_train(back, false);
            check_logits(back, st, &b, qa, 1e-5, "saved");
        }
        accel_dispatched *d = NULL;
        accel_module *disp = accel_bert_from_pretrained_dispatched(out, map, NULL, NULL, NULL, &d);
        CHECK_MSG(disp && d, "%s", accel_last_error());
        if (disp) check_logits(disp, st, &b, qa, 1e-5, "saved, dispatched with disk");
        /* freed model first, then its dispatch state */
        accel_module_free(disp);
        accel_dispatched_free(d);
        free_batch(&b);
        accel_module_free(back);
        accel_module_free(m);
        accel_safetensors_close(st);
        accel_device_map_free(map);
    }
}

/* A model of another head given to a head's function: refused naming both
 * classes; bad labels and positions: named. */
static void test_refusals(void) {
    accel_safetensors *st = open_expected(TOK), *sq = open_expected(QA);
    accel_module *tok = accel_bert_from_pretrained(TOK, ACCEL_CPU_DEVICE),
                 *qa = accel_bert_from_pretrained(QA, ACCEL_CPU_DEVICE),
                 *seq = accel_bert_from_pretrained("data/hf_bert_cls", ACCEL_CPU_DEVICE);
    CHECK_MSG(tok && qa && seq && st && sq, "%s", accel_last_error());
    if (!tok || !qa || !seq || !st || !sq) return;
    batch b = load_batch(st, false), q = load_batch(sq, true);
    accel_tensor *end = NULL;
    CHECK(accel_bert_classify(tok, b.ids, b.tt, b.mask) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_bert_classify: the model is a BertForTokenClassification, not a "
                                           "BertForSequenceClassification");
    CHECK(accel_bert_loss(qa, q.ids, NULL, NULL, q.start, NULL) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "a BertForQuestionAnswering, not a BertForSequenceClassification");
    CHECK(accel_bert_token_classify(seq, b.ids, NULL, NULL) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "a BertForSequenceClassification, not a BertForTokenClassification");
    CHECK(accel_bert_token_loss(qa, b.ids, NULL, NULL, b.labels, NULL) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "a BertForQuestionAnswering, not a BertForTokenClassification");
    CHECK(accel_bert_qa_logits(tok, q.ids, NULL, NULL, &end) == NULL && end == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "a BertForTokenClassification, not a BertForQuestionAnswering");
    CHECK(accel_bert_qa_loss(accel_module_find(qa, "bert"), q.ids, NULL, NULL, q.start, q.end, NULL, NULL) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "the model is BertModel, not a BertForQuestionAnswering");
    CHECK(accel_bert_qa_logits(qa, q.ids, NULL, NULL, NULL) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "end_logits is NULL");
    /* token labels: [B] (sequence classification's), another T, floats */
    accel_tensor *lab_b = accel_zeros(ACCEL_I64, ACCEL_SHAPE(3)), *lab_t = accel_zeros(ACCEL_I64, ACCEL_SHAPE(3, 9)),
                 *lab_f = accel_zeros(ACCEL_F32, ACCEL_SHAPE(3, 10));
    accel_tensor *const BAD[3] = {lab_b, lab_t, lab_f};
    for (int i = 0; i < 3; i++) {
        CHECK(accel_bert_token_loss(tok, b.ids, b.tt, b.mask, BAD[i], NULL) == NULL);
        CHECK_STR_CONTAINS(accel_last_error(), "accel_bert_token_loss: labels must be [B, T] int64/int32");
    }
    CHECK(accel_bert_token_loss(tok, b.ids, b.tt, b.mask, NULL, NULL) == NULL);
    /* a label past num_labels (5) or negative but not -100 */
    int64_t lv[30];
    for (int i = 0; i < 30; i++) lv[i] = i == 7 ? 5 : -100;
    accel_tensor *lab_big = accel_from_data(ACCEL_I64, 2, (int64_t[]){3, 10}, lv);
    lv[7] = -3;
    accel_tensor *lab_neg = accel_from_data(ACCEL_I64, 2, (int64_t[]){3, 10}, lv);
    CHECK(accel_bert_token_loss(tok, b.ids, b.tt, b.mask, lab_big, NULL) == NULL);
    CHECK(accel_bert_token_loss(tok, b.ids, b.tt, b.mask, lab_neg, NULL) == NULL);
    /* every label ignored: NaN, as transformers' CrossEntropyLoss */
    for (int i = 0; i < 30; i++) lv[i] = -100;
    accel_tensor *lab_none = accel_from_data(ACCEL_I64, 2, (int64_t[]){3, 10}, lv);
    accel_module_train(tok, false);
    accel_tensor *nan_loss = accel_bert_token_loss(tok, b.ids, b.tt, b.mask, lab_none, NULL);
    float v = 0;
    CHECK(nan_loss && accel_to_floats(nan_loss, &v) == ACCEL_OK && isnan(v));
    accel_step_reset();
    /* positions: [B, 2], floats, another batch, one missing */
    accel_tensor *p2 = accel_zeros(ACCEL_I64, ACCEL_SHAPE(3, 2)), *pf = accel_zeros(ACCEL_F32, ACCEL_SHAPE(3)),
                 *p4 = accel_zeros(ACCEL_I64, ACCEL_SHAPE(4));
    CHECK(accel_bert_qa_loss(qa, q.ids, q.tt, q.mask, p2, q.end, NULL, NULL) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_bert_qa_loss: start_positions must be [B] int64/int32");
    CHECK(accel_bert_qa_loss(qa, q.ids, q.tt, q.mask, q.start, pf, NULL, NULL) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "end_positions must be [B]");
    CHECK(accel_bert_qa_loss(qa, q.ids, q.tt, q.mask, p4, q.end, NULL, NULL) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "start_positions");
    CHECK(accel_bert_qa_loss(qa, q.ids, q.tt, q.mask, q.start, NULL, NULL, NULL) == NULL);
    /* positions all past the input (INT64_MAX, T): every term ignored, NaN */
    accel_module_train(qa, false);
    accel_tensor *far = accel_from_data(ACCEL_I64, 1, (int64_t[]){3}, (int64_t[]){INT64_MAX, 10, 1000000});
    accel_tensor *qloss = accel_bert_qa_loss(qa, q.ids, q.tt, q.mask, far, far, NULL, NULL);
    CHECK(qloss && accel_to_floats(qloss, &v) == ACCEL_OK && isnan(v));
    accel_step_reset();
    /* INT64_MIN counts as position 0, as -2 does */
    accel_tensor *low = accel_from_data(ACCEL_I64, 1, (int64_t[]){3}, (int64_t[]){INT64_MIN, -2, 0}),
                 *zero = accel_zeros(ACCEL_I64, ACCEL_SHAPE(3));
    float a = 0, z = 1;
    accel_tensor *la = accel_bert_qa_loss(qa, q.ids, q.tt, q.mask, low, low, NULL, NULL);
    CHECK(la && accel_to_floats(la, &a) == ACCEL_OK);
    accel_tensor *lz = accel_bert_qa_loss(qa, q.ids, q.tt, q.mask, zero, zero, NULL, NULL);
    CHECK(lz && accel_to_floats(lz, &z) == ACCEL_OK && a == z && isfinite(a));
    accel_step_reset();
    accel_tensor *const FREE[] = {lab_b, lab_t, lab_f, lab_big, lab_neg, lab_none, p2, pf, p4, far, low, zero};
    for (size_t i = 0; i < sizeof FREE / sizeof *FREE; i++) accel_tensor_free(FREE[i]);
    free_batch(&b);
    free_batch(&q);
    /* two models at once, freed in the order they were not made */
    accel_module_free(qa);
    accel_module_free(seq);
    accel_module_free(tok);
    accel_safetensors_close(st);
    accel_safetensors_close(sq);
}

/* Config: num_labels per head (0 refused for token classification, QA's
 * exactly 2), the head from architectures (the first that names one;
 * BertForMaskedLM: sequence classification), problem_type read only for
 * sequence classification. */
static void test_config_per_head(void) {
    accel_bert_config c = accel_bert_config_default();
    c.vocab_size = 16, c.hidden_size = 8, c.num_attention_heads = 2, c.intermediate_size = 8, c.num_hidden_layers = 1;
    c.head = ACCEL_BERT_TOKEN_CLASSIFICATION;
    c.num_labels = 0;
    CHECK(accel_bert_new(&c, ACCEL_CPU_DEVICE) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "num_labels must be at least 1 (token classification)");
    c.num_labels = 1;
    accel_module *m = accel_bert_new(&c, ACCEL_CPU_DEVICE);
    CHECK_MSG(m && !strcmp(m->ops->type_name, "BertForTokenClassification"), "%s", accel_last_error());
    accel_module_free(m);
    c.head = ACCEL_BERT_QUESTION_ANSWERING;
    c.num_labels = 3;
    CHECK(accel_bert_new(&c, ACCEL_CPU_DEVICE) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "num_labels must be 2 (question answering");
    c.head = ACCEL_BERT_HEADS;
    CHECK(accel_bert_config_check(&c, "x") != ACCEL_OK);
    CHECK_STR_CONTAINS(accel_last_error(), "x: head must be one of accel_bert_head's");
    CHECK(accel_bert_head_name(ACCEL_BERT_HEADS) == NULL &&
          !strcmp(accel_bert_head_name(ACCEL_BERT_QUESTION_ANSWERING), "BertForQuestionAnswering"));
    static const struct {
        const char *extra;
        int head;    /* -1: refused */
        const char *named;
    } CASES[] = {
        {"\"architectures\": [\"BertForMaskedLM\"]", ACCEL_BERT_SEQUENCE_CLASSIFICATION, NULL},
        {"\"architectures\": [\"BertModel\", \"BertForTokenClassification\"]", ACCEL_BERT_TOKEN_CLASSIFICATION, NULL},
        {"\"architectures\": [3, \"BertForQuestionAnswering\"]", ACCEL_BERT_QUESTION_ANSWERING, NULL},
        {"\"architectures\": \"BertForQuestionAnswering\"", -1, "'architectures' must be a list"},
        {"\"architectures\": [\"BertForTokenClassification\"], \"num_labels\": 1, "
         "\"problem_type\": \"regression\"", ACCEL_BERT_TOKEN_CLASSIFICATION, NULL},
        {"\"architectures\": [\"BertForTokenClassification\"], \"num_labels\": 0", -1, "'num_labels' must be a positive integer"},
        {"\"architectures\": [\"BertForQuestionAnswering\"], \"id2label\": {\"0\": \"a\"}", -1,
         "num_labels must be 2"},
        {"\"architectures\": [\"BertForSequenceClassification\"], \"problem_type\": \"regression\"", -1,
         "problem_type"},
    };
    char path[200];
    snprintf(path, sizeof path, "%s/config.json", g_tmp);
    for (size_t i = 0; i < sizeof CASES / sizeof *CASES; i++) {
        FILE *f = fopen(path, "w");
        fprintf(f, "{\"model_type\": \"bert\", %s}\n", CASES[i].extra);
        fclose(f);
        accel_bert_config lc;
        accel_status s = accel_bert_config_load(path, &lc);
        if (CASES[i].head < 0) {
            CHECK_MSG(s != ACCEL_OK && strstr(accel_last_error(), CASES[i].named), "%s: %s", CASES[i].extra,
                      accel_last_error());
        } else {
            CHECK_MSG(s == ACCEL_OK && (int)lc.head == CASES[i].head, "%s: %s", CASES[i].extra, accel_last_error());
        }
    }
}

/* The classifier's dropout (classifier_dropout, here alone): the token
 * classifier's training logits differ from its eval ones; the QA head has
 * none (transformers' BertForQuestionAnswering), so its are the same. */
static void test_classifier_dropout(void) {
    accel_bert_config c = accel_bert_config_default();
    c.vocab_size = 16, c.hidden_size = 8, c.num_attention_heads = 2, c.intermediate_size = 8, c.num_hidden_layers = 1;
    c.hidden_dropout_prob = 0, c.attention_probs_dropout_prob = 0, c.classifier_dropout = 0.5;
    for (int qa = 0; qa < 2; qa++) {
        c.head = qa ? ACCEL_BERT_QUESTION_ANSWERING : ACCEL_BERT_TOKEN_CLASSIFICATION;
        c.num_labels = qa ? 2 : 3;
        accel_module *m = accel_bert_new(&c, ACCEL_CPU_DEVICE);
        CHECK_MSG(m != NULL, "%s", accel_last_error());
        if (!m) continue;
        float y[2][24];
        for (int train = 0; train < 2; train++) {
            accel_module_train(m, train);
            accel_tensor *end = NULL, *ids = accel_from_data(ACCEL_I64, 2, (int64_t[]){2, 4},
                                                             (int64_t[]){3, 4, 5, 6, 7, 8, 9, 0}); /* a step tensor */
            accel_tensor *out = qa ? accel_bert_qa_logits(m, ids, NULL, NULL, &end) : accel_bert_token_classify(m, ids, NULL, NULL);
            CHECK_MSG(out && accel_to_floats(out, y[train]) == ACCEL_OK, "%s", accel_last_error());
            accel_step_reset();
        }
        bool same = !memcmp(y[0], y[1], (size_t)(qa ? 8 : 24) * sizeof(float));
        CHECK_MSG(same == (qa == 1), "%s: training and eval logits %s", qa ? "QA" : "token",
                  same ? "the same" : "differ");
        accel_module_free(m);
    }
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/accel_bert_heads_XXXXXX");
    CHECK(mkdtemp(g_tmp) != NULL);
    RUN(test_heads_against_transformers);
    RUN(test_checkpointing_and_autocast);
    RUN(test_base_checkpoint_into_each_head);
    RUN(test_save_round_trip);
    RUN(test_refusals);
    RUN(test_config_per_head);
    RUN(test_classifier_dropout);
    /* the saved heads are g_tmp's siblings (g_tmp_tok, g_tmp_qa): removed with it */
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s %s_tok %s_qa", g_tmp, g_tmp, g_tmp);
    CHECK(system(cmd) == 0);
    return check_summary();
}
