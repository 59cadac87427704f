/* RoBERTa and XLM-RoBERTa (accel/bert.h, model_type "roberta" and
 * "xlm-roberta") against transformers, on tools/gen_hf_roberta_fixtures.py's
 * tiny models of every head (tests/data/hf_roberta_*, hf_xlm_roberta_*):
 * the class, tree (no pooler) and state_dict order, the logits within 1e-5,
 * the loss and every gradient within 1e-5 relative on a batch with a pad
 * token in the middle, right and left padding (position ids counted from
 * the ids; the pads' rows of the word and position embeddings get no
 * gradient); the masked LM's decoder tied; save_pretrained and back, also
 * through the dispatched loader with the encoder on disk
 * (ACCEL_ROBERTA_SAVED=PREFIX keeps PREFIX_<fixture> for
 * `tools/gen_hf_roberta_fixtures.py --check-saved`); the Hub's checkpoint
 * layout (pooler and lm_head together, the tied decoder written out, the
 * position_ids buffer) into the masked LM and a new classifier; gradient
 * checkpointing and the classification head's dropout in training mode;
 * position ids past max_position_embeddings and bad configs refused by
 * name. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
} fixture;

static const fixture FIXTURES[] = {
    {"data/hf_roberta_seq", ACCEL_BERT_MODEL_ROBERTA, ACCEL_BERT_SEQUENCE_CLASSIFICATION,
     "RobertaForSequenceClassification"},
    {"data/hf_roberta_tok", ACCEL_BERT_MODEL_ROBERTA, ACCEL_BERT_TOKEN_CLASSIFICATION, "RobertaForTokenClassification"},
    {"data/hf_roberta_qa", ACCEL_BERT_MODEL_ROBERTA, ACCEL_BERT_QUESTION_ANSWERING, "RobertaForQuestionAnswering"},
    {"data/hf_roberta_mlm", ACCEL_BERT_MODEL_ROBERTA, ACCEL_BERT_MASKED_LM, "RobertaForMaskedLM"},
    {"data/hf_xlm_roberta_seq", ACCEL_BERT_MODEL_XLM_ROBERTA, ACCEL_BERT_SEQUENCE_CLASSIFICATION,
     "XLMRobertaForSequenceClassification"},
    {"data/hf_xlm_roberta_tok", ACCEL_BERT_MODEL_XLM_ROBERTA, ACCEL_BERT_TOKEN_CLASSIFICATION,
     "XLMRobertaForTokenClassification"},
    {"data/hf_xlm_roberta_qa", ACCEL_BERT_MODEL_XLM_ROBERTA, ACCEL_BERT_QUESTION_ANSWERING,
     "XLMRobertaForQuestionAnswering"},
    {"data/hf_xlm_roberta_mlm", ACCEL_BERT_MODEL_XLM_ROBERTA, ACCEL_BERT_MASKED_LM, "XLMRobertaForMaskedLM"},
};
#define N_FIXTURES (int)(sizeof FIXTURES / sizeof *FIXTURES)

/* The fixture's inputs and targets: tt only where the file has them
 * (roberta's type_vocab_size 1: none given, zeros); labels or positions by head. */
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

static accel_tensor *opt_tensor(accel_safetensors *st, const char *name) {
    return accel_safetensors_find(st, name) ? accel_safetensors_tensor(st, name, -1) : NULL;
}

static batch load_batch(accel_safetensors *st) {
    batch b = {opt_tensor(st, "ids"), opt_tensor(st, "token_type_ids"), opt_tensor(st, "attention_mask"),
               opt_tensor(st, "labels"), opt_tensor(st, "start_positions"), opt_tensor(st, "end_positions")};
    CHECK(b.ids && b.mask && (b.labels || (b.start && b.end)));
    return b;
}

static void free_batch(batch *b) {
    accel_tensor *all[] = {b->ids, b->tt, b->mask, b->labels, b->start, b->end};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) accel_tensor_free(all[i]);
}

/* The head's logits (QA: start, and *end) on b. */
static accel_tensor *logits_of(accel_module *m, accel_bert_head head, const batch *b, accel_tensor **end) {
    switch (head) {
    case ACCEL_BERT_SEQUENCE_CLASSIFICATION: return accel_bert_classify(m, b->ids, b->tt, b->mask);
    case ACCEL_BERT_TOKEN_CLASSIFICATION: return accel_bert_token_classify(m, b->ids, b->tt, b->mask);
    case ACCEL_BERT_QUESTION_ANSWERING: return accel_bert_qa_logits(m, b->ids, b->tt, b->mask, end);
    default: return accel_bert_mlm_logits(m, b->ids, b->tt, b->mask);
    }
}

static accel_tensor *loss_of(accel_module *m, accel_bert_head head, const batch *b) {
    switch (head) {
    case ACCEL_BERT_SEQUENCE_CLASSIFICATION: return accel_bert_loss(m, b->ids, b->tt, b->mask, b->labels, NULL);
    case ACCEL_BERT_TOKEN_CLASSIFICATION: return accel_bert_token_loss(m, b->ids, b->tt, b->mask, b->labels, NULL);
    case ACCEL_BERT_QUESTION_ANSWERING:
        return accel_bert_qa_loss(m, b->ids, b->tt, b->mask, b->start, b->end, NULL, NULL);
    default: return accel_bert_mlm_loss(m, b->ids, b->tt, b->mask, b->labels, NULL);
    }
}

static void check_logits(accel_module *m, const fixture *f, accel_safetensors *st, const batch *b, const char *what) {
    accel_tensor *end = NULL, *y = logits_of(m, f->head, b, &end);
    CHECK_MSG(y != NULL, "%s %s: %s", f->dir, what, accel_last_error());
    bool qa = f->head == ACCEL_BERT_QUESTION_ANSWERING;
    if (y) check_tensor_close(st, qa ? "start_logits" : "logits", y, 1e-5, 1e-5);
    if (y && qa) check_tensor_close(st, "end_logits", end, 1e-5, 1e-5);
    accel_step_reset();
}

/* The loss and every gradient against the fixture's; as many gradients as
 * the fixture has (the tied decoder has none of its own). */
static void check_loss_and_grads(accel_module *m, const fixture *f, accel_safetensors *st, const batch *b) {
    accel_tensor *loss = loss_of(m, f->head, b);
    CHECK_MSG(loss != NULL, "%s: %s", f->dir, accel_last_error());
    if (!loss) return;
    check_tensor_close(st, "loss", loss, 1e-5, 0);
    CHECK_MSG(accel_backward(loss) == ACCEL_OK, "%s", accel_last_error());
    accel_state_dict *sd = accel_module_state_dict(m);
    int n = 0, want = 0;
    for (int i = 0; i < sd->n; i++) {
        if (sd->entries[i].is_tied_alias) continue;
        char g[200];
        snprintf(g, sizeof g, "g.%s", sd->entries[i].name);
        check_tensor_close(st, g, sd->entries[i].t->grad, 1e-5, 1e-6);
        n++;
    }
    for (int i = 0; i < accel_safetensors_count(st); i++) want += !strncmp(accel_safetensors_at(st, i)->name, "g.", 2);
    CHECK_MSG(n == want, "%s: %d gradients, the fixture has %d", f->dir, n, want);
    accel_state_dict_free(sd);
    accel_step_reset();
}

/* The class, config, layer class and ties; the state_dict's names in
 * transformers' order (the fixture's state_dict_names: RobertaEmbeddings
 * registers token types and LayerNorm before the positions, XLMRoberta<Head>
 * its head before roberta). */
static void check_tree(accel_module *m, const fixture *f, accel_safetensors *st) {
    CHECK_MSG(!strcmp(m->ops->type_name, f->cls), "%s: %s", f->dir, m->ops->type_name);
    const accel_bert_config *c = accel_bert_config_of(m);
    CHECK(c && c->model_type == f->type && c->head == f->head);
    CHECK(accel_module_find(m, "roberta.pooler") == NULL && accel_module_find(m, "bert") == NULL);
    const char *layer = accel_module_decoder_layer_class(m);
    CHECK_MSG(layer && !strcmp(layer, f->type == ACCEL_BERT_MODEL_ROBERTA ? "RobertaLayer" : "XLMRobertaLayer"),
              "%s", layer ? layer : accel_last_error());
    check_state_dict_names(m, st, f->dir);
    if (f->head == ACCEL_BERT_MASKED_LM) { /* the decoder is the word embeddings and lm_head.bias */
        accel_tensor *dw = accel_module_get_tensor(m, "lm_head.decoder.weight"),
                     *db = accel_module_get_tensor(m, "lm_head.decoder.bias");
        CHECK(dw && dw == accel_module_get_tensor(m, "roberta.embeddings.word_embeddings.weight"));
        CHECK(db && db == accel_module_get_tensor(m, "lm_head.bias"));
    }
}

static void test_against_transformers(void) {
    for (int i = 0; i < N_FIXTURES; i++) {
        const fixture *f = &FIXTURES[i];
        accel_safetensors *st = open_expected(f->dir);
        accel_module *m = accel_bert_from_pretrained_head(f->dir, f->head, 0, ACCEL_CPU_DEVICE);
        CHECK_MSG(m && st, "%s: %s", f->dir, accel_last_error());
        if (!m || !st) {
            accel_module_free(m);
            accel_safetensors_close(st);
            continue;
        }
        check_tree(m, f, st);
        accel_module_train(m, false);
        batch b = load_batch(st);
        check_logits(m, f, st, &b, "loaded");
        check_loss_and_grads(m, f, st, &b);
        /* the head from config.json's architectures (the masked LM's: the sequence classifier) */
        accel_module *own = accel_bert_from_pretrained(f->dir, ACCEL_CPU_DEVICE);
        const char *want = f->head == ACCEL_BERT_MASKED_LM
                               ? accel_bert_class_name(f->type, ACCEL_BERT_SEQUENCE_CLASSIFICATION) : f->cls;
        CHECK_MSG(own && !strcmp(own->ops->type_name, want), "%s: %s", f->dir, own ? own->ops->type_name
                                                                               : accel_last_error());
        accel_module_free(own);
        free_batch(&b);
        accel_module_free(m);
        accel_safetensors_close(st);
    }
}

/* save_pretrained writes the class and model_type transformers reads (the
 * masked LM without its tied decoder) and loads back, through both loaders. */
static void test_save_round_trip(void) {
    const char *keep = getenv("ACCEL_ROBERTA_SAVED");
    for (int i = 0; i < N_FIXTURES; i++) {
        const fixture *f = &FIXTURES[i];
        accel_safetensors *st = open_expected(f->dir);
        accel_module *m = accel_bert_from_pretrained_head(f->dir, f->head, 0, ACCEL_CPU_DEVICE);
        if (!m || !st) {
            accel_module_free(m);
            accel_safetensors_close(st);
            continue;
        }
        char out[256], file[300];
        snprintf(out, sizeof out, "%s%c%s", keep && *keep ? keep : g_tmp, keep && *keep ? '_' : '/',
                 strrchr(f->dir, '/') + 1);
        CHECK_MSG(accel_bert_save_pretrained(m, out, 0) == ACCEL_OK, "%s", accel_last_error());
        snprintf(file, sizeof file, "%s/model.safetensors", out);
        accel_safetensors *saved = accel_safetensors_open(file);
        CHECK(saved && !accel_safetensors_find(saved, "lm_head.decoder.weight") &&
              !accel_safetensors_find(saved, "lm_head.decoder.bias") &&
              accel_safetensors_find(saved, "roberta.embeddings.position_embeddings.weight"));
        accel_safetensors_close(saved);
        accel_bert_config c;
        CHECK_MSG(accel_bert_config_load(out, &c) == ACCEL_OK, "%s", accel_last_error());
        CHECK(c.model_type == f->type && c.pad_token_id == accel_bert_config_of(m)->pad_token_id &&
              c.type_vocab_size == accel_bert_config_of(m)->type_vocab_size);
        batch b = load_batch(st);
        accel_module *back = accel_bert_from_pretrained_head(out, f->head, 0, ACCEL_CPU_DEVICE);
        CHECK_MSG(back != NULL, "%s", accel_last_error());
        if (back) {
            CHECK(!strcmp(back->ops->type_name, f->cls));
            accel_module_train(back, false);
            check_logits(back, f, st, &b, "saved");
        }
        const char *head = f->head == ACCEL_BERT_MASKED_LM ? "lm_head" : f->head == ACCEL_BERT_QUESTION_ANSWERING
                                                                           ? "qa_outputs" : "classifier";
        char spec[160];
        snprintf(spec, sizeof spec, "roberta.embeddings:cpu,roberta.encoder:disk,%s:cpu", head);
        accel_device_map *map = accel_device_map_parse(spec);
        accel_dispatched *d = NULL;
        accel_module *disp = accel_bert_from_pretrained_head_dispatched(out, f->head, 0, map, NULL, NULL, NULL, &d);
        CHECK_MSG(disp && d, "%s: %s", spec, accel_last_error());
        if (disp) check_logits(disp, f, st, &b, "saved, dispatched with disk");
        accel_module_free(disp);
        accel_dispatched_free(d);
        accel_device_map_free(map);
        free_batch(&b);
        accel_module_free(back);
        accel_module_free(m);
        accel_safetensors_close(st);
    }
}

/* hf_roberta_hub, laid out as roberta-base's file (a pooler, lm_head with
 * its decoder written out, the position_ids buffer): the masked LM takes
 * lm_head and leaves the pooler; the sequence classifier (what its config's
 * RobertaForMaskedLM gives without a head asked for) gets a new classifier
 * on the same encoder, through both loaders. */
static void test_hub_checkpoint(void) {
    const fixture *mlm = &FIXTURES[3];
    accel_safetensors *st = open_expected(mlm->dir);
    accel_module *m = accel_bert_from_pretrained_head("data/hf_roberta_hub", ACCEL_BERT_MASKED_LM, 0,
                                                      ACCEL_CPU_DEVICE);
    CHECK_MSG(m && st, "%s", accel_last_error());
    if (!m || !st) {
        accel_module_free(m);
        accel_safetensors_close(st);
        return;
    }
    batch b = load_batch(st);
    check_tree(m, mlm, st);
    accel_module_train(m, false);
    check_logits(m, mlm, st, &b, "hub checkpoint");
    accel_dispatched *dm = NULL;
    accel_module *disp = accel_bert_from_pretrained_head_dispatched("data/hf_roberta_hub", ACCEL_BERT_MASKED_LM, 0,
                                                                    NULL, NULL, NULL, NULL, &dm);
    CHECK_MSG(disp != NULL, "%s", accel_last_error());
    if (disp) check_logits(disp, mlm, st, &b, "hub checkpoint, dispatched");
    accel_module_free(disp);
    accel_dispatched_free(dm);
    accel_safetensors *hub = accel_safetensors_open("data/hf_roberta_hub/model.safetensors");
    for (int dispatched = 0; dispatched < 2; dispatched++) {
        accel_dispatched *d = NULL;
        accel_module *seq = dispatched ? accel_bert_from_pretrained_dispatched("data/hf_roberta_hub", NULL, NULL, NULL,
                                                                              NULL, &d)
                                       : accel_bert_from_pretrained("data/hf_roberta_hub", ACCEL_CPU_DEVICE);
        CHECK_MSG(seq != NULL, "%s", accel_last_error());
        if (!seq) continue;
        CHECK(!strcmp(seq->ops->type_name, "RobertaForSequenceClassification"));
        /* the encoder is the checkpoint's, the classifier new (dense N(0, 0.02), biases 0) */
        accel_tensor *q = accel_module_get_tensor(seq, "roberta.encoder.layer.0.attention.self.query.weight"),
                     *want = accel_safetensors_tensor(hub, "roberta.encoder.layer.0.attention.self.query.weight", -1),
                     *ob = accel_module_get_tensor(seq, "classifier.out_proj.bias");
        float a[256], w[256], z[2];
        CHECK(q && want && accel_numel(q) == 256 && accel_to_floats(q, a) == ACCEL_OK &&
              accel_to_floats(want, w) == ACCEL_OK && !memcmp(a, w, sizeof a));
        CHECK(ob && accel_numel(ob) == 2 && accel_to_floats(ob, z) == ACCEL_OK && z[0] == 0 && z[1] == 0);
        accel_tensor_free(want);
        accel_module_free(seq);
        accel_dispatched_free(d);
    }
    accel_safetensors_close(hub);
    free_batch(&b);
    accel_module_free(m);
    accel_safetensors_close(st);
}

/* The sequence loss's gradients of m (training or not) after seeding the default generator. */
static float *grads_of(accel_module *m, const batch *b, bool training, int64_t *n_out) {
    accel_module_train(m, training);
    accel_manual_seed(7);
    accel_tensor *loss = accel_bert_loss(m, b->ids, b->tt, b->mask, b->labels, NULL);
    CHECK_MSG(loss && accel_backward(loss) == ACCEL_OK, "%s", accel_last_error());
    float *g = loss ? take_grads(m, n_out) : NULL;
    accel_step_reset();
    return g;
}

/* Training mode: gradient checkpointing on the root sets every
 * RobertaLayer and gives bit-identical gradients (the recompute draws the
 * same dropout masks); the classification head's own dropout acts while
 * training (classifier_dropout alone: the logits differ from eval's). */
static void test_training_mode(void) {
    accel_safetensors *st = open_expected(FIXTURES[0].dir);
    accel_module *m = accel_bert_from_pretrained(FIXTURES[0].dir, ACCEL_CPU_DEVICE);
    CHECK_MSG(m && st, "%s", accel_last_error());
    if (m && st) {
        batch b = load_batch(st);
        int64_t n = 0, n2 = 0;
        float *plain = grads_of(m, &b, true, &n);
        CHECK(accel_module_set_gradient_checkpointing(m, true) == ACCEL_OK &&
              accel_module_find(m, "roberta.encoder.layer.0")->gradient_checkpointing);
        float *ckpt = grads_of(m, &b, true, &n2);
        CHECK(plain && ckpt && n == n2 && memcmp(plain, ckpt, (size_t)n * sizeof *plain) == 0);
        accel_free(plain);
        accel_free(ckpt);
        free_batch(&b);
    }
    accel_module_free(m);
    accel_safetensors_close(st);
    accel_bert_config c = accel_bert_config_default_for(ACCEL_BERT_MODEL_XLM_ROBERTA);
    c.vocab_size = 16, c.hidden_size = 8, c.num_attention_heads = 2, c.intermediate_size = 8, c.num_hidden_layers = 1;
    c.hidden_dropout_prob = 0, c.attention_probs_dropout_prob = 0, c.classifier_dropout = 0.5, c.num_labels = 3;
    m = accel_bert_new(&c, ACCEL_CPU_DEVICE);
    CHECK_MSG(m != NULL, "%s", accel_last_error());
    if (!m) return;
    float y[3][6];
    for (int train = 0; train < 2; train++) {
        accel_module_train(m, train);
        accel_manual_seed(11);
        accel_tensor *ids = accel_from_data(ACCEL_I64, 2, (int64_t[]){2, 4}, (int64_t[]){3, 4, 5, 6, 7, 8, 9, 1});
        accel_tensor *out = accel_bert_classify(m, ids, NULL, NULL);
        CHECK_MSG(out && accel_to_floats(out, y[train]) == ACCEL_OK, "%s", accel_last_error());
        if (train) { /* the head by hand from the same draws: dropout, dense, tanh, dropout, out_proj */
            accel_manual_seed(11);
            accel_tensor *h = accel_bert_encode(m, ids, NULL, NULL, NULL); /* no dropout of p 0: no draws */
            accel_tensor *x = accel_dropout(accel_squeeze(accel_slice(h, 1, 0, 1, 1), 1), 0.5, true, NULL);
            x = accel_dropout(accel_tanh(accel_module_call(accel_module_find(m, "classifier.dense"), x)), 0.5, true,
                              NULL);
            x = accel_module_call(accel_module_find(m, "classifier.out_proj"), x);
            CHECK_MSG(x && accel_to_floats(x, y[2]) == ACCEL_OK, "%s", accel_last_error());
        }
        accel_step_reset();
    }
    CHECK_MSG(memcmp(y[0], y[1], sizeof y[0]) != 0, "the classification head's dropout did not act in training");
    CHECK_MSG(memcmp(y[1], y[2], sizeof y[0]) == 0, "the classification head is not dropout, dense, tanh, dropout, "
              "out_proj");
    accel_module_free(m);
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

/* A bare RobertaModel's checkpoint (names without "roberta.", as
 * RobertaModel.save_pretrained writes them): fixture's encoder (tokdir:
 * hf_roberta_tok's, hf_xlm_roberta_tok's: its root lists the head first),
 * into every head of its config, through both loaders: the encoder's
 * weights loaded, the head new (the masked LM's initialised as transformers
 * does). */
static void check_bare_encoder(const char *tokdir, int k) {
    char dir[128], cfg[160], file[160], path[160];
    snprintf(dir, sizeof dir, "%s/bare%d", g_tmp, k);
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    snprintf(file, sizeof file, "%s/model.safetensors", dir);
    snprintf(path, sizeof path, "%s/config.json", tokdir);
    char *text = slurp(path);
    CHECK(mkdir(dir, 0755) == 0 && text);
    write_file(cfg, text ? text : "");
    free(text);
    snprintf(path, sizeof path, "%s/model.safetensors", tokdir);
    accel_safetensors *src = accel_safetensors_open(path);
    CHECK_MSG(src != NULL, "%s", accel_last_error());
    if (!src) return;
    const char *names[64];
    accel_tensor *ts[64];
    int n = 0;
    for (int i = 0; i < accel_safetensors_count(src) && n < 64; i++) {
        const char *name = accel_safetensors_at(src, i)->name;
        if (strncmp(name, "roberta.", 8)) continue; /* the classifier */
        names[n] = name + 8;
        ts[n++] = accel_safetensors_tensor(src, name, -1);
    }
    CHECK_MSG(accel_safetensors_save(file, n, names, ts, 0, NULL) == ACCEL_OK, "%s", accel_last_error());
    for (int h = 0; h < ACCEL_BERT_HEADS * 2; h++) {
        accel_dispatched *d = NULL;
        int64_t labels = h / 2 == ACCEL_BERT_QUESTION_ANSWERING ? 2 : 0; /* the config's 5 elsewhere */
        accel_module *m = h % 2 ? accel_bert_from_pretrained_head_dispatched(dir, h / 2, labels, NULL, NULL, NULL,
                                                                            NULL, &d)
                                : accel_bert_from_pretrained_head(dir, h / 2, labels, ACCEL_CPU_DEVICE);
        if (!accel_bert_class_name(ACCEL_BERT_MODEL_ROBERTA, (accel_bert_head)(h / 2))) { /* BERT's heads only */
            CHECK_MSG(!m && !d, "%s head %d: built a head RoBERTa has no class of", tokdir, h / 2);
            CHECK_STR_CONTAINS(accel_last_error(), "next sentence prediction heads are BERT's");
            accel_module_free(m);
            continue;
        }
        CHECK_MSG(m != NULL, "%s head %d: %s", tokdir, h / 2, accel_last_error());
        if (!m) continue;
        int64_t C = accel_bert_config_of(m)->hidden_size, V = accel_bert_config_of(m)->vocab_size;
        accel_tensor *v = accel_module_get_tensor(m, "roberta.encoder.layer.0.attention.self.value.bias"),
                     *want = accel_safetensors_tensor(src, "roberta.encoder.layer.0.attention.self.value.bias", -1);
        float a[64], w[64];
        CHECK(C <= 64 && V <= 64 && v && want && accel_numel(v) == C && accel_to_floats(v, a) == ACCEL_OK &&
              accel_to_floats(want, w) == ACCEL_OK && !memcmp(a, w, (size_t)C * sizeof *a));
        accel_tensor_free(want);
        if (h / 2 == ACCEL_BERT_MASKED_LM) { /* a new lm_head as transformers': layer_norm weight 1, bias 0 */
            accel_tensor *ln = accel_module_get_tensor(m, "lm_head.layer_norm.weight"),
                         *bias = accel_module_get_tensor(m, "lm_head.bias");
            float one[64], zero[64];
            CHECK(ln && accel_numel(ln) == C && accel_to_floats(ln, one) == ACCEL_OK);
            CHECK(bias && accel_numel(bias) == V && accel_to_floats(bias, zero) == ACCEL_OK);
            bool ok = true;
            for (int i = 0; i < C; i++) ok &= one[i] == 1.0f;
            for (int i = 0; i < V; i++) ok &= zero[i] == 0.0f;
            CHECK_MSG(ok, "%s dispatched %d: the new lm_head's layer_norm weight is not 1 or its bias not 0", tokdir,
                      h % 2);
        }
        accel_module_free(m);
        accel_dispatched_free(d);
    }
    for (int i = 0; i < n; i++) accel_tensor_free(ts[i]);
    accel_safetensors_close(src);
}

static void test_bare_encoder_checkpoint(void) {
    check_bare_encoder("data/hf_roberta_tok", 0);
    check_bare_encoder("data/hf_xlm_roberta_tok", 1);
}

/* Position ids past the table: refused naming the row; a row of pads
 * counts only its tokens (left padding fits where the tokens do). */
static void test_positions_past_the_table(void) {
    accel_bert_config c = accel_bert_config_default_for(ACCEL_BERT_MODEL_ROBERTA);
    c.vocab_size = 16, c.hidden_size = 8, c.num_attention_heads = 2, c.intermediate_size = 8;
    c.num_hidden_layers = 1, c.max_position_embeddings = 6; /* pad 1: positions 2 .. 5, four tokens */
    accel_module *m = accel_bert_new(&c, ACCEL_CPU_DEVICE);
    CHECK_MSG(m != NULL, "%s", accel_last_error());
    if (!m) return;
    accel_tensor *four = accel_from_data(ACCEL_I64, 2, (int64_t[]){1, 6}, (int64_t[]){1, 1, 5, 6, 7, 8});
    accel_tensor *five = accel_from_data(ACCEL_I64, 2, (int64_t[]){1, 5}, (int64_t[]){4, 5, 6, 7, 8});
    CHECK_MSG(accel_bert_classify(m, four, NULL, NULL) != NULL, "%s", accel_last_error());
    CHECK(accel_bert_classify(m, five, NULL, NULL) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_bert_classify: row 0 of ids has 5 tokens that are not pad_token_id "
                                           "(1): its position ids reach 6, past max_position_embeddings (6)");
    accel_tensor *pooled = NULL;
    CHECK(accel_bert_encode(m, four, NULL, NULL, &pooled) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "no pooler (a RobertaForSequenceClassification is built without one)");
    accel_step_reset();
    accel_tensor_free(four);
    accel_tensor_free(five);
    accel_module_free(m);
}

/* Sequences of no token: the classifiers (RoBERTa's head, BERT's pooler)
 * read the first position and refuse them, as transformers' index error;
 * token-level heads give their empty outputs. */
static void test_empty_sequences(void) {
    const char *dirs[2] = {"data/hf_roberta_seq", "data/hf_bert_cls"};
    for (int i = 0; i < 2; i++) {
        accel_module *m = accel_bert_from_pretrained(dirs[i], ACCEL_CPU_DEVICE);
        CHECK_MSG(m != NULL, "%s: %s", dirs[i], accel_last_error());
        if (!m) continue;
        accel_tensor *none = accel_tensor_new(ACCEL_I64, 2, (int64_t[]){2, 0}, ACCEL_CPU_DEVICE);
        /* a failed load chained into the call keeps its cause; a NULL of the caller's own is named */
        CHECK(accel_bert_classify(accel_bert_from_pretrained("data/no_such_model", ACCEL_CPU_DEVICE), none, NULL,
                                  NULL) == NULL);
        CHECK_STR_CONTAINS(accel_last_error(), "data/no_such_model");
        accel_clear_error();
        CHECK(accel_bert_classify(NULL, none, NULL, NULL) == NULL);
        CHECK_STR_CONTAINS(accel_last_error(), "accel_bert_classify: the model is NULL");
        CHECK(accel_bert_classify(m, none, NULL, NULL) == NULL);
        CHECK_STR_CONTAINS(accel_last_error(), "ids [2, 0]: the classification reads the first position");
        accel_tensor *y = accel_bert_mlm_logits(m, none, NULL, NULL);
        CHECK_MSG(!y || (y->ndim == 3 && y->shape[1] == 0), "%s", accel_last_error());
        accel_step_reset();
        accel_tensor_free(none);
        accel_module_free(m);
    }
}

/* The defaults of each config class; a pad_token_id RoBERTa cannot count
 * positions from, refused naming it (config.json and the struct). */
static void test_configs(void) {
    accel_bert_config r = accel_bert_config_default_for(ACCEL_BERT_MODEL_ROBERTA),
                      x = accel_bert_config_default_for(ACCEL_BERT_MODEL_XLM_ROBERTA);
    CHECK(r.vocab_size == 50265 && r.pad_token_id == 1 && r.max_position_embeddings == 512 &&
          r.model_type == ACCEL_BERT_MODEL_ROBERTA);
    CHECK(x.vocab_size == 30522 && x.pad_token_id == 1 && x.model_type == ACCEL_BERT_MODEL_XLM_ROBERTA);
    CHECK(!strcmp(accel_bert_model_type_name(ACCEL_BERT_MODEL_XLM_ROBERTA), "xlm-roberta") &&
          !accel_bert_model_type_name(ACCEL_BERT_MODEL_TYPES));
    CHECK(!strcmp(accel_bert_class_name(ACCEL_BERT_MODEL_XLM_ROBERTA, ACCEL_BERT_QUESTION_ANSWERING),
                  "XLMRobertaForQuestionAnswering") &&
          !accel_bert_class_name(ACCEL_BERT_MODEL_TYPES, ACCEL_BERT_MASKED_LM));
    r.pad_token_id = -1;
    CHECK(accel_bert_config_check(&r, "t") == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "t: pad_token_id must be in [0, max_position_embeddings - 1)");
    r = accel_bert_config_default_for(ACCEL_BERT_MODEL_TYPES);
    CHECK(accel_bert_config_check(&r, "t") == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "model_type must be one of accel_bert_model_type's");
    static const struct {
        const char *json, *named;
    } CASES[] = {
        {"{\"model_type\": \"roberta\", \"pad_token_id\": null}", "pad_token_id must be in [0, max_position"},
        {"{\"model_type\": \"xlm-roberta\", \"pad_token_id\": 7, \"max_position_embeddings\": 8}",
         "pad_token_id must be in [0, max_position_embeddings - 1)"},
        {"{\"model_type\": \"roberta\", \"position_embedding_type\": \"relative_key\"}", "position_embedding_type"},
        {"{\"model_type\": \"roberta\", \"is_decoder\": true}", "is_decoder"},
        {"{\"model_type\": \"xlm-roberta\", \"problem_type\": \"regression\"}", "problem_type"},
        {"{\"model_type\": \"roberta-prelayernorm\"}", "model_type is \"roberta-prelayernorm\", not \"bert\", "
                                                       "\"roberta\" or \"xlm-roberta\""},
    };
    char path[200];
    snprintf(path, sizeof path, "%s/config.json", g_tmp);
    for (size_t i = 0; i < sizeof CASES / sizeof *CASES; i++) {
        write_file(path, CASES[i].json);
        accel_bert_config c;
        CHECK(accel_bert_config_load(path, &c) != ACCEL_OK);
        CHECK_MSG(strstr(accel_last_error(), CASES[i].named) != NULL, "%s: %s", CASES[i].json, accel_last_error());
    }
    /* roberta-base's own config.json: its head from architectures is the sequence classifier */
    write_file(path, "{\"architectures\": [\"RobertaForMaskedLM\"], \"model_type\": \"roberta\", \"vocab_size\": "
                     "50265, \"max_position_embeddings\": 514, \"type_vocab_size\": 1, \"layer_norm_eps\": 1e-05, "
                     "\"pad_token_id\": 1, \"bos_token_id\": 0, \"eos_token_id\": 2}");
    accel_bert_config c;
    CHECK_MSG(accel_bert_config_load(path, &c) == ACCEL_OK, "%s", accel_last_error());
    CHECK(c.model_type == ACCEL_BERT_MODEL_ROBERTA && c.head == ACCEL_BERT_SEQUENCE_CLASSIFICATION &&
          c.max_position_embeddings == 514 && c.type_vocab_size == 1 && c.layer_norm_eps == 1e-5);
    /* absent keys: RobertaConfig's and XLMRobertaConfig's defaults */
    write_file(path, "{\"model_type\": \"roberta\"}");
    CHECK(accel_bert_config_load(path, &c) == ACCEL_OK && c.vocab_size == 50265 && c.pad_token_id == 1);
    write_file(path, "{\"model_type\": \"xlm-roberta\"}");
    CHECK(accel_bert_config_load(path, &c) == ACCEL_OK && c.vocab_size == 30522 && c.pad_token_id == 1 &&
          c.model_type == ACCEL_BERT_MODEL_XLM_ROBERTA);
    /* a RoBERTa architecture in a bert config is not BERT's head */
    write_file(path, "{\"model_type\": \"bert\", \"architectures\": [\"RobertaForTokenClassification\"]}");
    CHECK(accel_bert_config_load(path, &c) == ACCEL_OK && c.head == ACCEL_BERT_SEQUENCE_CLASSIFICATION);
    /* the activation estimate of a RoBERTa: its positions start at pad_token_id + 1 (the step is measured in
     * tests/test_training_memory.c) */
    accel_activation_bytes ab;
    accel_activation_opts o = {.batch_size = 2, .seq_len = 8, .autocast = ACCEL_F32};
    x.vocab_size = 16, x.hidden_size = 8, x.num_attention_heads = 2, x.intermediate_size = 8;
    x.max_position_embeddings = 10, x.pad_token_id = 1;
    CHECK_MSG(accel_bert_activation_bytes(&x, &o, &ab) == ACCEL_OK, "%s", accel_last_error());
    o.seq_len = 9;
    CHECK(accel_bert_activation_bytes(&x, &o, &ab) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "seq_len 9 is more than max_position_embeddings - pad_token_id - 1");
    accel_clear_error();
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/accel_roberta_XXXXXX");
    CHECK(mkdtemp(g_tmp) != NULL);
    RUN(test_against_transformers);
    RUN(test_save_round_trip);
    RUN(test_hub_checkpoint);
    RUN(test_bare_encoder_checkpoint);
    RUN(test_training_mode);
    RUN(test_positions_past_the_table);
    RUN(test_empty_sequences);
    RUN(test_configs);
    rm_rf(g_tmp);
    return check_summary();
}
