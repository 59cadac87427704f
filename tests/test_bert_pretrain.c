/* BertForPreTraining, BertForNextSentencePrediction and <Type>ForMultipleChoice
 * (BERT, RoBERTa, XLM-RoBERTa; accel/bert.h) against transformers, on
 * tools/gen_hf_bert_pretrain_fixtures.py's tiny ones (tests/data/hf_bert_pretrain,
 * hf_bert_nsp, hf_*_mc): the class, tree (the pooler, the tied decoder) and
 * state_dict order, the logits within 1e-5, the loss and every gradient
 * within 1e-5 relative; the head each config's architectures picks (the
 * pre-training one only when asked for); gradient checkpointing on
 * pre-training's cls; a pre-training checkpoint into the
 * next sentence head (transformers' logits); save_pretrained and back, also
 * through the dispatched loader with the encoder on disk
 * (ACCEL_BERT_SAVED=PREFIX keeps PREFIX_<fixture> for
 * `tools/gen_hf_bert_pretrain_fixtures.py --check-saved`); pre-training's
 * two outputs under the Accelerator's bf16 autocast; a bare encoder
 * into each head (the pooler loaded or new, the head new, through both
 * loaders); each head's dropout in training mode (multiple choice's
 * classifier_dropout, RoBERTa's hidden_dropout_prob); the refusals: another head's model, RoBERTa's missing classes,
 * bad shapes, a missing label, the activation estimate. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "accel/accelerator.h"
#include "accel/bert.h"
#include "accel/bigmodel.h"
#include "nn_fixture.h"
#include "test_files.h"

static char g_tmp[64];

typedef struct fixture {
    const char *dir;
    accel_bert_model_type type;
    accel_bert_head head;
    const char *cls;
    int n_grads; /* the parameters (a tied one once) */
} fixture;

/* TOK's sizes: embeddings 3 + LayerNorm 2, one layer 16, the pooler 2 and the head's */
static const fixture FIXTURES[] = {
    {"data/hf_bert_pretrain", ACCEL_BERT_MODEL_BERT, ACCEL_BERT_PRETRAINING, "BertForPreTraining", 5 + 16 + 2 + 7},
    {"data/hf_bert_nsp", ACCEL_BERT_MODEL_BERT, ACCEL_BERT_NEXT_SENTENCE_PREDICTION, "BertForNextSentencePrediction",
     5 + 16 + 2 + 2},
    {"data/hf_bert_mc", ACCEL_BERT_MODEL_BERT, ACCEL_BERT_MULTIPLE_CHOICE, "BertForMultipleChoice", 5 + 16 + 2 + 2},
    {"data/hf_roberta_mc", ACCEL_BERT_MODEL_ROBERTA, ACCEL_BERT_MULTIPLE_CHOICE, "RobertaForMultipleChoice",
     5 + 16 + 2 + 2},
    {"data/hf_xlm_roberta_mc", ACCEL_BERT_MODEL_XLM_ROBERTA, ACCEL_BERT_MULTIPLE_CHOICE,
     "XLMRobertaForMultipleChoice", 5 + 16 + 2 + 2},
};
#define N_FIXTURES (int)(sizeof FIXTURES / sizeof *FIXTURES)

/* A fixture's inputs (expected.safetensors); roberta's have no token types. */
typedef struct inputs {
    accel_tensor *ids, *tt, *mask, *labels, *nsp_labels;
} inputs;

static inputs load_inputs(accel_safetensors *st) {
    inputs in = {accel_safetensors_tensor(st, "ids", -1), NULL, accel_safetensors_tensor(st, "attention_mask", -1),
                 accel_safetensors_tensor(st, "labels", -1), NULL};
    if (accel_safetensors_find(st, "token_type_ids")) in.tt = accel_safetensors_tensor(st, "token_type_ids", -1);
    if (accel_safetensors_find(st, "next_sentence_label"))
        in.nsp_labels = accel_safetensors_tensor(st, "next_sentence_label", -1);
    accel_clear_error();
    CHECK(in.ids && in.mask && in.labels);
    return in;
}

static void free_inputs(inputs *in) {
    accel_tensor *all[] = {in->ids, in->tt, in->mask, in->labels, in->nsp_labels};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) accel_tensor_free(all[i]);
}

/* The head's logits from m compared with the fixture's (pre-training: both). */
static void check_logits(accel_module *m, const fixture *f, accel_safetensors *st, const inputs *in,
                         const char *what) {
    accel_tensor *y = NULL, *nsp = NULL;
    switch (f->head) {
    case ACCEL_BERT_PRETRAINING: y = accel_bert_pretraining_logits(m, in->ids, in->tt, in->mask, &nsp); break;
    case ACCEL_BERT_NEXT_SENTENCE_PREDICTION: y = accel_bert_nsp_logits(m, in->ids, in->tt, in->mask); break;
    default: y = accel_bert_multiple_choice_logits(m, in->ids, in->tt, in->mask); break;
    }
    CHECK_MSG(y != NULL, "%s %s: %s", f->dir, what, accel_last_error());
    if (f->head == ACCEL_BERT_PRETRAINING) {
        CHECK(y && nsp && y->ndim == 3 && nsp->ndim == 2 && nsp->shape[1] == 2);
        check_tensor_close(st, "prediction_logits", y, 1e-5, 1e-5);
        check_tensor_close(st, "seq_relationship_logits", nsp, 1e-5, 1e-5);
    } else {
        /* multiple choice: [B, num_choices], the ids' first two dims */
        CHECK(y && y->ndim == 2 && y->shape[0] == in->ids->shape[0] &&
              y->shape[1] == (f->head == ACCEL_BERT_MULTIPLE_CHOICE ? in->ids->shape[1] : 2));
        check_tensor_close(st, "logits", y, 1e-5, 1e-5);
    }
    accel_step_reset();
}

/* The head's loss (the logits it hands back too), then every gradient. */
static void check_loss_and_grads(accel_module *m, const fixture *f, accel_safetensors *st, const inputs *in) {
    accel_tensor *logits = NULL, *nsp = NULL, *loss = NULL;
    switch (f->head) {
    case ACCEL_BERT_PRETRAINING:
        loss = accel_bert_pretraining_loss(m, in->ids, in->tt, in->mask, in->labels, in->nsp_labels, &logits, &nsp);
        CHECK(nsp != NULL);
        if (nsp) check_tensor_close(st, "seq_relationship_logits", nsp, 1e-5, 1e-5);
        if (logits) check_tensor_close(st, "prediction_logits", logits, 1e-5, 1e-5);
        break;
    case ACCEL_BERT_NEXT_SENTENCE_PREDICTION:
        loss = accel_bert_nsp_loss(m, in->ids, in->tt, in->mask, in->labels, &logits);
        if (logits) check_tensor_close(st, "logits", logits, 1e-5, 1e-5);
        break;
    default:
        loss = accel_bert_multiple_choice_loss(m, in->ids, in->tt, in->mask, in->labels, &logits);
        if (logits) check_tensor_close(st, "logits", logits, 1e-5, 1e-5);
        break;
    }
    CHECK_MSG(loss && logits, "%s: %s", f->dir, accel_last_error());
    if (!loss) return;
    check_tensor_close(st, "loss", loss, 1e-5, 0);
    CHECK_MSG(accel_backward(loss) == ACCEL_OK, "%s", accel_last_error());
    accel_state_dict *sd = accel_module_state_dict(m);
    int n = 0;
    for (int i = 0; sd && i < sd->n; i++) {
        if (sd->entries[i].is_tied_alias) continue;
        char g[200];
        snprintf(g, sizeof g, "g.%s", sd->entries[i].name);
        check_tensor_close(st, g, sd->entries[i].t->grad, 1e-5, 1e-6);
        n++;
    }
    CHECK_MSG(n == f->n_grads, "%s: %d tensors, transformers has %d", f->dir, n, f->n_grads);
    accel_state_dict_free(sd);
    accel_step_reset();
}

/* The class, config, pooler, ties and state_dict order. */
static void check_tree(accel_module *m, const fixture *f, accel_safetensors *st) {
    CHECK_MSG(!strcmp(m->ops->type_name, f->cls), "%s: %s", f->dir, m->ops->type_name);
    const accel_bert_config *c = accel_bert_config_of(m);
    CHECK(c && c->model_type == f->type && c->head == f->head);
    const char *base = accel_bert_base_model_prefix(f->type);
    char pooler[32];
    snprintf(pooler, sizeof pooler, "%s.pooler", base);
    CHECK_MSG(accel_module_find(m, pooler) != NULL, "%s: no %s", f->dir, pooler);
    if (accel_safetensors_find(st, "state_dict_names")) check_state_dict_names(m, st, f->dir);
    if (f->head == ACCEL_BERT_PRETRAINING) { /* the decoder is the word embeddings and predictions.bias */
        accel_tensor *dw = accel_module_get_tensor(m, "cls.predictions.decoder.weight"),
                     *db = accel_module_get_tensor(m, "cls.predictions.decoder.bias");
        CHECK(dw && dw == accel_module_get_tensor(m, "bert.embeddings.word_embeddings.weight"));
        CHECK(db && db == accel_module_get_tensor(m, "cls.predictions.bias"));
        CHECK(accel_module_find(m, "cls.seq_relationship") && accel_module_find(m, "cls.predictions.transform"));
    }
    accel_clear_error();
}

static void test_against_transformers(void) {
    for (int k = 0; k < N_FIXTURES; k++) {
        const fixture *f = &FIXTURES[k];
        char path[128];
        snprintf(path, sizeof path, "%s/expected.safetensors", f->dir);
        accel_safetensors *st = accel_safetensors_open(path);
        /* the config's architectures picks every head but pre-training (as the masked LM's) */
        accel_module *m = f->head == ACCEL_BERT_PRETRAINING
                              ? accel_bert_from_pretrained_head(f->dir, f->head, 0, ACCEL_CPU_DEVICE)
                              : accel_bert_from_pretrained(f->dir, ACCEL_CPU_DEVICE);
        CHECK_MSG(m && st, "%s: %s", f->dir, accel_last_error());
        if (m && st) {
            check_tree(m, f, st);
            inputs in = load_inputs(st);
            check_logits(m, f, st, &in, "loaded");
            check_loss_and_grads(m, f, st, &in);
            free_inputs(&in);
        }
        accel_module_free(m);
        accel_safetensors_close(st);
    }
    /* BertForPreTraining's config: the sequence classifier unless asked (a pre-trained encoder's config) */
    accel_module *seq = accel_bert_from_pretrained("data/hf_bert_pretrain", ACCEL_CPU_DEVICE);
    CHECK(seq && !strcmp(seq->ops->type_name, "BertForSequenceClassification"));
    accel_module_free(seq);
}

/* Gradient checkpointing set on BertForPreTraining's cls (its masked LM
 * forward recomputed in backward, as any module's under a module call):
 * the prediction logits come out of a checkpoint node, and the loss and
 * every gradient still match transformers'. */
static void test_pretraining_head_checkpointed(void) {
    const fixture *f = &FIXTURES[0];
    accel_safetensors *st = accel_safetensors_open("data/hf_bert_pretrain/expected.safetensors");
    accel_module *m = accel_bert_from_pretrained_head(f->dir, f->head, 0, ACCEL_CPU_DEVICE);
    CHECK_MSG(m && st, "%s: %s", f->dir, accel_last_error());
    if (!m || !st) goto out;
    CHECK(accel_module_set_gradient_checkpointing(accel_module_find(m, "cls"), true) == ACCEL_OK);
    inputs in = load_inputs(st);
    accel_tensor *logits = NULL, *nsp = NULL;
    accel_tensor *loss = accel_bert_pretraining_loss(m, in.ids, in.tt, in.mask, in.labels, in.nsp_labels, &logits, &nsp);
    CHECK_MSG(loss && logits, "%s", accel_last_error());
    CHECK_MSG(logits && logits->grad_fn && !strcmp(logits->grad_fn->op, "checkpoint"),
              "the prediction logits come from '%s', not a checkpoint",
              logits && logits->grad_fn ? logits->grad_fn->op : "no node");
    accel_step_reset();
    check_loss_and_grads(m, f, st, &in);
    free_inputs(&in);
out:
    accel_module_free(m);
    accel_safetensors_close(st);
}

/* The pre-training checkpoint into the next sentence head: its pooler and
 * seq_relationship used (cls.predictions not), transformers' logits. */
static void test_pretraining_into_nsp(void) {
    accel_safetensors *st = accel_safetensors_open("data/hf_bert_pretrain/expected.safetensors");
    accel_module *m = accel_bert_from_pretrained_head("data/hf_bert_pretrain", ACCEL_BERT_NEXT_SENTENCE_PREDICTION,
                                                      0, ACCEL_CPU_DEVICE);
    CHECK_MSG(m && st, "%s", accel_last_error());
    if (m && st) {
        inputs in = load_inputs(st);
        accel_tensor *y = accel_bert_nsp_logits(m, in.ids, in.tt, in.mask);
        CHECK_MSG(y != NULL, "%s", accel_last_error());
        check_tensor_close(st, "nsp_logits", y, 1e-5, 1e-5);
        free_inputs(&in);
    }
    accel_step_reset();
    accel_module_free(m);
    accel_safetensors_close(st);
}

/* save_pretrained (no tied decoder written) and back to the same logits,
 * through both loaders (the dispatched one with the encoder on disk). */
static void test_save_round_trip(void) {
    const char *keep = getenv("ACCEL_BERT_SAVED");
    for (int k = 0; k < N_FIXTURES; k++) {
        const fixture *f = &FIXTURES[k];
        char path[128], out[200], file[240], map_text[200];
        snprintf(path, sizeof path, "%s/expected.safetensors", f->dir);
        snprintf(out, sizeof out, keep && *keep ? "%s_%s" : "%s/%s", keep && *keep ? keep : g_tmp, f->dir + 5);
        accel_safetensors *st = accel_safetensors_open(path);
        accel_module *m = accel_bert_from_pretrained_head(f->dir, f->head, 0, ACCEL_CPU_DEVICE);
        CHECK_MSG(m && st, "%s: %s", f->dir, accel_last_error());
        if (!m || !st) continue;
        CHECK_MSG(accel_bert_save_pretrained(m, out, 0) == ACCEL_OK, "%s", accel_last_error());
        snprintf(file, sizeof file, "%s/model.safetensors", out);
        accel_safetensors *saved = accel_safetensors_open(file);
        CHECK(saved && !accel_safetensors_find(saved, "cls.predictions.decoder.weight") &&
              !accel_safetensors_find(saved, "cls.predictions.decoder.bias"));
        accel_safetensors_close(saved);
        accel_clear_error();
        inputs in = load_inputs(st);
        accel_module *back = accel_bert_from_pretrained_head(out, f->head, 0, ACCEL_CPU_DEVICE);
        CHECK_MSG(back != NULL, "%s saved: %s", f->dir, accel_last_error());
        if (back) {
            check_tree(back, f, st);
            check_logits(back, f, st, &in, "saved");
        }
        const char *base = accel_bert_base_model_prefix(f->type),
                   *head = f->head == ACCEL_BERT_MULTIPLE_CHOICE ? "classifier" : "cls";
        snprintf(map_text, sizeof map_text, "%s.embeddings:cpu,%s.encoder:disk,%s.pooler:cpu,%s:cpu", base, base,
                 base, head);
        accel_device_map *map = accel_device_map_parse(map_text);
        accel_dispatched *d = NULL;
        accel_module *disp = accel_bert_from_pretrained_head_dispatched(out, f->head, 0, map, NULL, NULL, NULL, &d);
        CHECK_MSG(disp && d, "%s dispatched: %s", f->dir, accel_last_error());
        if (disp) check_logits(disp, f, st, &in, "saved, dispatched with disk");
        accel_module_free(disp);
        accel_dispatched_free(d);
        accel_device_map_free(map);
        free_inputs(&in);
        accel_module_free(back);
        accel_module_free(m);
        accel_safetensors_close(st);
    }
}

/* Accelerate's --mixed_precision bf16 on the prepared pre-training model:
 * the forward under autocast, both outputs f32 (the root's hook converts the
 * first; the second follows it) and near transformers' f32 logits. */
static void test_pretraining_bf16_accelerator(void) {
    const fixture *f = &FIXTURES[0];
    accel_safetensors *st = accel_safetensors_open("data/hf_bert_pretrain/expected.safetensors");
    accel_module *m = accel_bert_from_pretrained_head(f->dir, f->head, 0, ACCEL_CPU_DEVICE);
    accel_accelerator_opts o = {.mixed_precision = "bf16"};
    accel_accelerator *acc = accel_accelerator_new(&o);
    CHECK_MSG(st && m && acc && accel_accelerator_prepare(acc, m) == ACCEL_OK, "%s", accel_last_error());
    if (st && m && acc) {
        inputs in = load_inputs(st);
        accel_tensor *nsp = NULL, *y = accel_bert_pretraining_logits(m, in.ids, in.tt, in.mask, &nsp);
        CHECK_MSG(y && nsp && y->dtype == ACCEL_F32 && nsp->dtype == ACCEL_F32, "%s: %s %s", accel_last_error(),
                  y ? accel_dtype_name(y->dtype) : "-", nsp ? accel_dtype_name(nsp->dtype) : "-");
        check_tensor_close(st, "prediction_logits", y, 0.05, 0.05);
        check_tensor_close(st, "seq_relationship_logits", nsp, 0.05, 0.05);
        free_inputs(&in);
    }
    accel_step_reset();
    accel_accelerator_free(acc);
    accel_module_free(m);
    accel_safetensors_close(st);
}

/* Every float of t equals value (a new head's bias 0, LayerNorm weight 1). */
static bool all_equal(accel_module *m, const char *name, float value) {
    accel_tensor *t = accel_module_get_tensor(m, name);
    int64_t n = t ? accel_numel(t) : 0;
    float *v = n ? accel_malloc((size_t)n * sizeof *v) : NULL;
    bool ok = v && accel_to_floats(t, v) == ACCEL_OK;
    for (int64_t i = 0; ok && i < n; i++) ok = v[i] == value;
    accel_free(v);
    CHECK_MSG(ok, "%s: %s is not all %g", m->ops->type_name, name, (double)value);
    return ok;
}

/* m's tensor name holds the file's tensor of that name (in_file). */
static void check_loaded(accel_module *m, const char *name, const char *file, const char *in_file) {
    accel_safetensors *st = accel_safetensors_open(file);
    accel_tensor *want = st ? accel_safetensors_tensor(st, in_file, ACCEL_F32) : NULL,
                 *got = accel_module_get_tensor(m, name);
    int64_t n = want ? accel_numel(want) : 0;
    float *g = n ? accel_malloc((size_t)n * sizeof *g) : NULL;
    CHECK_MSG(g && got && accel_numel(got) == n && accel_to_floats(got, g) == ACCEL_OK &&
                  !memcmp(g, want->data, (size_t)n * sizeof *g),
              "%s: %s is not %s's %s", m->ops->type_name, name, file, in_file);
    accel_free(g);
    accel_tensor_free(want);
    accel_safetensors_close(st);
}

/* A bare encoder's checkpoint into each head, through both loaders: BERT's
 * hf_bert_base (a BertModel with its pooler: loaded) into the three BERT
 * heads; RoBERTa's hf_roberta_hub (the Hub's layout: a pooler) and
 * hf_roberta_qa (no pooler: new, bias 0) into multiple choice. The head is
 * new, initialised as transformers does. */
static void test_new_heads(void) {
    static const struct {
        const char *dir;
        accel_bert_head head;
        const char *pooler_in_file; /* NULL: the checkpoint has none */
    } CASES[] = {
        {"data/hf_bert_base", ACCEL_BERT_PRETRAINING, "pooler.dense.weight"},
        {"data/hf_bert_base", ACCEL_BERT_NEXT_SENTENCE_PREDICTION, "pooler.dense.weight"},
        {"data/hf_bert_base", ACCEL_BERT_MULTIPLE_CHOICE, "pooler.dense.weight"},
        {"data/hf_roberta_hub", ACCEL_BERT_MULTIPLE_CHOICE, "roberta.pooler.dense.weight"},
        {"data/hf_roberta_qa", ACCEL_BERT_MULTIPLE_CHOICE, NULL},
    };
    for (size_t k = 0; k < sizeof CASES / sizeof *CASES; k++)
        for (int dispatched = 0; dispatched < 2; dispatched++) {
            accel_dispatched *d = NULL;
            accel_module *m = dispatched ? accel_bert_from_pretrained_head_dispatched(CASES[k].dir, CASES[k].head, 0,
                                                                                      NULL, NULL, NULL, NULL, &d)
                                         : accel_bert_from_pretrained_head(CASES[k].dir, CASES[k].head, 0,
                                                                           ACCEL_CPU_DEVICE);
            CHECK_MSG(m != NULL, "%s head %d: %s", CASES[k].dir, CASES[k].head, accel_last_error());
            if (!m) continue;
            const char *base = accel_bert_base_model_prefix(accel_bert_config_of(m)->model_type);
            char name[96], file[96];
            snprintf(name, sizeof name, "%s.pooler.dense.weight", base);
            snprintf(file, sizeof file, "%s/model.safetensors", CASES[k].dir);
            if (CASES[k].pooler_in_file) check_loaded(m, name, file, CASES[k].pooler_in_file);
            else {
                snprintf(name, sizeof name, "%s.pooler.dense.bias", base);
                all_equal(m, name, 0.0f);
            }
            switch (CASES[k].head) {
            case ACCEL_BERT_PRETRAINING:
                all_equal(m, "cls.predictions.transform.LayerNorm.weight", 1.0f);
                all_equal(m, "cls.predictions.bias", 0.0f);
                all_equal(m, "cls.seq_relationship.bias", 0.0f);
                break;
            case ACCEL_BERT_NEXT_SENTENCE_PREDICTION: all_equal(m, "cls.seq_relationship.bias", 0.0f); break;
            default: all_equal(m, "classifier.bias", 0.0f); break;
            }
            accel_module_free(m);
            accel_dispatched_free(d);
        }
    accel_clear_error();
}

static void test_refusals(void) {
    accel_bert_config c = accel_bert_config_default();
    c.vocab_size = 16, c.hidden_size = 8, c.num_attention_heads = 2, c.intermediate_size = 8, c.num_hidden_layers = 1;
    c.head = ACCEL_BERT_MULTIPLE_CHOICE;
    accel_module *mc = accel_bert_new(&c, ACCEL_CPU_DEVICE);
    c.head = ACCEL_BERT_PRETRAINING;
    accel_module *pt = accel_bert_new(&c, ACCEL_CPU_DEVICE);
    CHECK_MSG(mc && pt, "%s", accel_last_error());
    accel_tensor *ids = accel_zeros(ACCEL_I64, ACCEL_SHAPE(2, 4)), *ids3 = accel_zeros(ACCEL_I64, ACCEL_SHAPE(2, 3, 4)),
                 *mask3 = accel_zeros(ACCEL_I64, ACCEL_SHAPE(2, 2, 4)), *lab = accel_zeros(ACCEL_I64, ACCEL_SHAPE(2)),
                 *lab2 = accel_zeros(ACCEL_I64, ACCEL_SHAPE(2, 4)), *seq = NULL;
    /* another head's model, naming both classes */
    CHECK(!accel_bert_nsp_logits(mc, ids, NULL, NULL));
    CHECK_STR_CONTAINS(accel_last_error(), "the model is a BertForMultipleChoice, not a BertForNextSentencePrediction");
    CHECK(!accel_bert_multiple_choice_logits(pt, ids3, NULL, NULL));
    CHECK_STR_CONTAINS(accel_last_error(), "the model is a BertForPreTraining, not a BertForMultipleChoice");
    CHECK(!accel_bert_mlm_logits(pt, ids, NULL, NULL));
    CHECK_STR_CONTAINS(accel_last_error(), "the model is a BertForPreTraining, not a BertForMaskedLM");
    /* shapes: multiple choice's ids [B, N, T], its mask like them */
    CHECK(!accel_bert_multiple_choice_logits(mc, ids, NULL, NULL));
    CHECK_STR_CONTAINS(accel_last_error(), "ids must be [B, num_choices, T] int64/int32, got");
    CHECK(!accel_bert_multiple_choice_logits(mc, ids3, NULL, mask3));
    CHECK_STR_CONTAINS(accel_last_error(), "attention_mask must be [B, num_choices, T] int64/int32 like ids");
    CHECK(!accel_bert_multiple_choice_loss(mc, ids3, NULL, NULL, lab2, NULL));
    CHECK_STR_CONTAINS(accel_last_error(), "accel_bert_multiple_choice_loss: labels must be [B] int64/int32 (of ids' "
                                           "[B, N, T]), got");
    /* pre-training: both labels, the second output (a NULL argument keeps an earlier error: cleared) */
    accel_clear_error();
    CHECK(!accel_bert_pretraining_loss(pt, ids, NULL, NULL, lab2, NULL, NULL, NULL));
    CHECK_STR_CONTAINS(accel_last_error(), "accel_bert_pretraining_loss: next_sentence_label");
    CHECK(!accel_bert_pretraining_loss(pt, ids, NULL, NULL, lab, lab, NULL, NULL));
    CHECK_STR_CONTAINS(accel_last_error(), "accel_bert_pretraining_loss: labels must be [B, T]");
    CHECK(!accel_bert_pretraining_logits(pt, ids, NULL, NULL, NULL));
    CHECK_STR_CONTAINS(accel_last_error(), "seq_relationship_logits is NULL");
    /* the module call: pre-training's prediction logits, multiple choice's [B, N] */
    accel_tensor *y = accel_module_call(pt, ids), *z = accel_module_call(mc, ids3);
    CHECK_MSG(y && y->ndim == 3 && y->shape[2] == 16 && z && z->ndim == 2 && z->shape[0] == 2 && z->shape[1] == 3,
              "%s", accel_last_error());
    CHECK(accel_bert_pretraining_logits(pt, ids, NULL, NULL, &seq) && seq && seq->shape[1] == 2);
    accel_tensor *all[] = {ids, ids3, mask3, lab, lab2};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) accel_tensor_free(all[i]);
    accel_step_reset();
    /* RoBERTa has no pre-training or next sentence class */
    c.model_type = ACCEL_BERT_MODEL_ROBERTA, c.pad_token_id = 1;
    for (int h = ACCEL_BERT_PRETRAINING; h <= ACCEL_BERT_NEXT_SENTENCE_PREDICTION; h++) {
        c.head = (accel_bert_head)h;
        CHECK(accel_bert_class_name(ACCEL_BERT_MODEL_ROBERTA, c.head) == NULL);
        CHECK(accel_bert_new(&c, ACCEL_CPU_DEVICE) == NULL);
        CHECK_STR_CONTAINS(accel_last_error(), "next sentence prediction heads are BERT's (transformers has no "
                                               "RoBERTa class of them) (BertFor");
    }
    CHECK(!strcmp(accel_bert_class_name(ACCEL_BERT_MODEL_XLM_ROBERTA, ACCEL_BERT_MULTIPLE_CHOICE),
                  "XLMRobertaForMultipleChoice"));
    /* the activation estimate of multiple choice needs the choices (batch_size counts examples) */
    c.model_type = ACCEL_BERT_MODEL_BERT, c.pad_token_id = 0, c.head = ACCEL_BERT_MULTIPLE_CHOICE;
    accel_activation_bytes ab;
    accel_activation_opts o = {.batch_size = 2, .seq_len = 8, .autocast = ACCEL_F32};
    CHECK(accel_bert_activation_bytes(&c, &o, &ab) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "num_choices 0: BertForMultipleChoice runs the encoder on batch_size x "
                                           "num_choices rows");
    o.num_choices = 4;
    CHECK_MSG(accel_bert_activation_bytes(&c, &o, &ab) == ACCEL_OK, "%s", accel_last_error());
    accel_module_free(mc);
    accel_module_free(pt);
    accel_step_reset();
    accel_clear_error();
}

/* The dropout before each head in training mode, with hidden and attention
 * dropout 0 and classifier_dropout 0.5: classifier_dropout acts in BERT's
 * sequence classifier and multiple choice and every token classifier (and
 * inside RoBERTa's sequence classification head); RoBERTa's multiple choice
 * drops out by hidden_dropout_prob (as transformers'), so neither it nor QA,
 * the masked LM, pre-training or next sentence prediction changes: training
 * logits equal eval's there, and differ elsewhere. */
static void test_head_dropout(void) {
    for (int t = 0; t < 2; t++)
        for (int h = 0; h < ACCEL_BERT_HEADS; h++) {
            accel_bert_config c = accel_bert_config_default_for(t ? ACCEL_BERT_MODEL_ROBERTA : ACCEL_BERT_MODEL_BERT);
            c.vocab_size = 16, c.hidden_size = 32, c.num_attention_heads = 2, c.intermediate_size = 8;
            c.num_hidden_layers = 1, c.max_position_embeddings = 16, c.head = (accel_bert_head)h;
            c.hidden_dropout_prob = 0, c.attention_probs_dropout_prob = 0, c.classifier_dropout = 0.5;
            if (!accel_bert_class_name(c.model_type, c.head)) continue; /* RoBERTa's pre-training heads */
            accel_module *m = accel_bert_new(&c, ACCEL_CPU_DEVICE);
            CHECK_MSG(m != NULL, "%s", accel_last_error());
            if (!m) continue;
            bool choice = c.head == ACCEL_BERT_MULTIPLE_CHOICE;
            float *y[2] = {NULL, NULL};
            int64_t n = 0;
            for (int train = 0; train < 2; train++) {
                accel_module_train(m, train);
                accel_tensor *ids = choice ? accel_full(ACCEL_I64, ACCEL_SHAPE(2, 3, 4), 5)
                                           : accel_full(ACCEL_I64, ACCEL_SHAPE(2, 4), 5); /* step tensors */
                accel_tensor *z = accel_module_call(m, ids); /* the head's (first) output */
                n = z ? accel_numel(z) : 0;
                y[train] = n ? accel_malloc((size_t)n * sizeof(float)) : NULL;
                CHECK_MSG(y[train] && accel_to_floats(z, y[train]) == ACCEL_OK, "%s", accel_last_error());
                accel_step_reset();
            }
            bool same = y[0] && y[1] && !memcmp(y[0], y[1], (size_t)n * sizeof(float));
            bool drops = c.head == ACCEL_BERT_TOKEN_CLASSIFICATION || c.head == ACCEL_BERT_SEQUENCE_CLASSIFICATION ||
                         (choice && !t);
            CHECK_MSG(same == !drops, "%s: training logits %s eval's with classifier_dropout 0.5 and "
                      "hidden_dropout_prob 0", m->ops->type_name, same ? "equal" : "differ from");
            accel_free(y[0]);
            accel_free(y[1]);
            accel_module_free(m);
        }
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/accel_bert_pretrain_XXXXXX");
    CHECK(mkdtemp(g_tmp) != NULL);
    RUN(test_against_transformers);
    RUN(test_pretraining_head_checkpointed);
    RUN(test_pretraining_into_nsp);
    RUN(test_save_round_trip);
    RUN(test_pretraining_bf16_accelerator);
    RUN(test_new_heads);
    RUN(test_refusals);
    RUN(test_head_dropout);
    rm_rf(g_tmp);
    return check_summary();
}
