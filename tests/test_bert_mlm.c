/* BertForMaskedLM (accel/bert.h) against transformers, on
 * tools/gen_hf_bert_fixtures.py's tiny one (tests/data/hf_bert_mlm, saved by
 * transformers without the tied decoder): the tree and its ties (decoder
 * weight = the word embeddings, decoder bias = cls.predictions.bias), the
 * logits within 1e-5, the loss (labels -100 but at five masked positions)
 * and every gradient within 1e-5 relative (the word embeddings' pad row:
 * the decoder's share only, padding_idx); chosen by the caller only (its
 * config's architectures keeps the sequence classifier); save_pretrained
 * without the tied names and back, also through the dispatched loader with
 * the encoder on disk; a BertModel checkpoint gets a new head (LayerNorm
 * weight 1, the decoder still tied); the refusals: an untied config, another
 * head's model; the activation estimate counts the logits.
 * ACCEL_BERT_SAVED=DIR keeps the saved model for
 * `tools/gen_hf_bert_fixtures.py --check-saved DIR`. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "accel/bert.h"
#include "accel/bigmodel.h"
#include "bert_batch.h"
#include "nn_fixture.h"
#include "test_files.h"

#define MLM "data/hf_bert_mlm"

static char g_tmp[64];

static void check_logits(accel_module *m, accel_safetensors *st, const batch *b, const char *what) {
    accel_tensor *y = accel_bert_mlm_logits(m, b->ids, b->tt, b->mask);
    CHECK_MSG(y != NULL, "%s: %s", what, accel_last_error());
    if (y) check_tensor_close(st, "logits", y, 1e-5, 1e-5);
    accel_step_reset();
}

/* The decoder's weight and bias are the word embeddings' and predictions.bias. */
static void check_ties(accel_module *m) {
    accel_tensor *dw = accel_module_get_tensor(m, "cls.predictions.decoder.weight"),
                 *db = accel_module_get_tensor(m, "cls.predictions.decoder.bias");
    CHECK(dw && dw == accel_module_get_tensor(m, "bert.embeddings.word_embeddings.weight"));
    CHECK(db && db == accel_module_get_tensor(m, "cls.predictions.bias"));
}

static void test_against_transformers(void) {
    accel_safetensors *st = accel_safetensors_open(MLM "/expected.safetensors");
    accel_module *m = accel_bert_from_pretrained_head(MLM, ACCEL_BERT_MASKED_LM, 0, ACCEL_CPU_DEVICE);
    CHECK_MSG(m && st, "%s", accel_last_error());
    if (!m || !st) return;
    CHECK_MSG(!strcmp(m->ops->type_name, "BertForMaskedLM"), "%s", m->ops->type_name);
    CHECK(accel_module_find(m, "bert.pooler") == NULL && accel_module_find(m, "cls.predictions.transform") != NULL);
    check_ties(m);
    accel_module_train(m, false);
    batch b = load_batch(st);
    check_logits(m, st, &b, "loaded");
    accel_tensor *logits = NULL, *loss = accel_bert_mlm_loss(m, b.ids, b.tt, b.mask, b.labels, &logits);
    CHECK_MSG(loss && logits, "%s", accel_last_error());
    if (loss) {
        check_tensor_close(st, "loss", loss, 1e-5, 0);
        check_tensor_close(st, "logits", logits, 1e-5, 1e-5);
        CHECK_MSG(accel_backward(loss) == ACCEL_OK, "%s", accel_last_error());
        accel_state_dict *sd = accel_module_state_dict(m);
        int n = 0;
        for (int i = 0; i < sd->n; i++) {
            if (sd->entries[i].is_tied_alias) continue;
            char g[200];
            snprintf(g, sizeof g, "g.%s", sd->entries[i].name);
            check_tensor_close(st, g, sd->entries[i].t->grad, 1e-5, 1e-6);
            n++;
        }
        CHECK_MSG(n == 5 + 16 + 5, "%d tensors", n); /* embeddings + LayerNorm, one layer, the head's five */
        accel_state_dict_free(sd);
    }
    accel_step_reset();
    /* the config says BertForMaskedLM: the sequence classifier, as for every pre-trained encoder */
    accel_module *seq = accel_bert_from_pretrained(MLM, ACCEL_CPU_DEVICE);
    CHECK(seq && !strcmp(seq->ops->type_name, "BertForSequenceClassification"));
    accel_module_free(seq);
    free_batch(&b);
    accel_module_free(m);
    accel_safetensors_close(st);
}

/* save_pretrained writes no decoder (transformers ties it on load) and loads
 * back to the same logits, through both loaders. */
static void test_save_round_trip(void) {
    accel_safetensors *st = accel_safetensors_open(MLM "/expected.safetensors");
    accel_module *m = accel_bert_from_pretrained_head(MLM, ACCEL_BERT_MASKED_LM, 0, ACCEL_CPU_DEVICE);
    CHECK_MSG(m && st, "%s", accel_last_error());
    if (!m || !st) return;
    const char *keep = getenv("ACCEL_BERT_SAVED");
    char out[200], file[240];
    snprintf(out, sizeof out, "%s", keep && *keep ? keep : g_tmp);
    CHECK_MSG(accel_bert_save_pretrained(m, out, 0) == ACCEL_OK, "%s", accel_last_error());
    snprintf(file, sizeof file, "%s/model.safetensors", out);
    accel_safetensors *saved = accel_safetensors_open(file);
    CHECK(saved && accel_safetensors_find(saved, "cls.predictions.bias") &&
          !accel_safetensors_find(saved, "cls.predictions.decoder.weight") &&
          !accel_safetensors_find(saved, "cls.predictions.decoder.bias"));
    accel_safetensors_close(saved);
    accel_clear_error();
    batch b = load_batch(st);
    accel_module *back = accel_bert_from_pretrained_head(out, ACCEL_BERT_MASKED_LM, 0, ACCEL_CPU_DEVICE);
    CHECK_MSG(back != NULL, "%s", accel_last_error());
    if (back) {
        accel_module_train(back, false);
        check_ties(back);
        check_logits(back, st, &b, "saved");
    }
    accel_device_map *map = accel_device_map_parse("bert.embeddings:cpu,bert.encoder:disk,cls:cpu");
    accel_dispatched *d = NULL;
    accel_module *disp = accel_bert_from_pretrained_head_dispatched(out, ACCEL_BERT_MASKED_LM, 0, map, NULL, NULL,
                                                                    NULL, &d);
    CHECK_MSG(disp && d, "%s", accel_last_error());
    if (disp) check_logits(disp, st, &b, "saved, dispatched with disk");
    accel_module_free(disp);
    accel_dispatched_free(d);
    accel_device_map_free(map);
    free_batch(&b);
    accel_module_free(back);
    accel_module_free(m);
    accel_safetensors_close(st);
}

/* A BertModel checkpoint into the masked LM: a new head, initialised as
 * transformers does (the dispatched loader's too: LayerNorm weight 1). */
static void test_base_checkpoint(void) {
    for (int dispatched = 0; dispatched < 2; dispatched++) {
        accel_dispatched *d = NULL;
        accel_module *m = dispatched ? accel_bert_from_pretrained_head_dispatched("data/hf_bert_base",
                                                                                  ACCEL_BERT_MASKED_LM, 0, NULL, NULL,
                                                                                  NULL, NULL, &d)
                                     : accel_bert_from_pretrained_head("data/hf_bert_base", ACCEL_BERT_MASKED_LM, 0,
                                                                       ACCEL_CPU_DEVICE);
        CHECK_MSG(m != NULL, "%s", accel_last_error());
        if (!m) continue;
        check_ties(m);
        accel_tensor *ln = accel_module_get_tensor(m, "cls.predictions.transform.LayerNorm.weight"),
                     *bias = accel_module_get_tensor(m, "cls.predictions.bias");
        float one[32], zero[64];
        CHECK(ln && accel_numel(ln) == 32 && accel_to_floats(ln, one) == ACCEL_OK);
        CHECK(bias && accel_numel(bias) == 64 && accel_to_floats(bias, zero) == ACCEL_OK);
        bool ok = true;
        for (int i = 0; i < 32; i++) ok &= one[i] == 1.0f;
        for (int i = 0; i < 64; i++) ok &= zero[i] == 0.0f;
        CHECK_MSG(ok, "dispatched %d: the new head's LayerNorm weight is not 1 or its bias not 0", dispatched);
        accel_module_free(m);
        accel_dispatched_free(d);
    }
}

static void test_refusals(void) {
    accel_bert_config c = accel_bert_config_default();
    c.vocab_size = 16, c.hidden_size = 8, c.num_attention_heads = 2, c.intermediate_size = 8, c.num_hidden_layers = 1;
    c.head = ACCEL_BERT_MASKED_LM;
    c.untied_word_embeddings = true;
    CHECK(accel_bert_new(&c, ACCEL_CPU_DEVICE) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "tie_word_embeddings is false: a masked-LM decoder of its own");
    c.untied_word_embeddings = false;
    /* the activation estimate counts the vocabulary's logits (f32: the logits and their gradient, 2 x 4 B T V
     * bytes) beyond a token classifier's few labels (tests/test_training_memory.c measures the step) */
    accel_activation_bytes ab, tok_ab;
    accel_activation_opts o = {.batch_size = 2, .seq_len = 8, .autocast = ACCEL_F32};
    accel_bert_config tc = c;
    tc.head = ACCEL_BERT_TOKEN_CLASSIFICATION;
    CHECK_MSG(accel_bert_activation_bytes(&c, &o, &ab) == ACCEL_OK &&
                  accel_bert_activation_bytes(&tc, &o, &tok_ab) == ACCEL_OK,
              "%s", accel_last_error());
    CHECK_MSG(ab.peak - tok_ab.peak >= 2 * 4 * 2 * 8 * c.vocab_size, "masked LM %lld, token classifier %lld bytes",
              (long long)ab.peak, (long long)tok_ab.peak);
    accel_module *m = accel_bert_new(&c, ACCEL_CPU_DEVICE);
    CHECK_MSG(m != NULL, "%s", accel_last_error());
    accel_tensor *ids = accel_zeros(ACCEL_I64, ACCEL_SHAPE(1, 4));
    CHECK(!accel_bert_token_classify(m, ids, NULL, NULL));
    CHECK_STR_CONTAINS(accel_last_error(), "the model is a BertForMaskedLM, not a BertForTokenClassification");
    CHECK(!accel_bert_mlm_loss(m, ids, NULL, NULL, accel_zeros(ACCEL_I64, ACCEL_SHAPE(4)), NULL));
    CHECK_STR_CONTAINS(accel_last_error(), "accel_bert_mlm_loss: labels must be [B, T]");
    accel_module *tok = (c.head = ACCEL_BERT_TOKEN_CLASSIFICATION, accel_bert_new(&c, ACCEL_CPU_DEVICE));
    CHECK(tok && !accel_bert_mlm_logits(tok, ids, NULL, NULL));
    CHECK_STR_CONTAINS(accel_last_error(), "the model is a BertForTokenClassification, not a BertForMaskedLM");
    accel_tensor_free(ids);
    accel_module_free(tok);
    accel_module_free(m);
    accel_step_reset();
    accel_clear_error();
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/accel_bert_mlm_XXXXXX");
    CHECK(mkdtemp(g_tmp) != NULL);
    RUN(test_against_transformers);
    RUN(test_save_round_trip);
    RUN(test_base_checkpoint);
    RUN(test_refusals);
    rm_rf(g_tmp);
    return check_summary();
}
