/* accel_accelerator_save_model of a prepared BERT (tests/data/hf_bert_cls,
 * and the token classifier tests/data/hf_bert_tok, masked LM
 * tests/data/hf_bert_mlm and pre-training model hf_bert_pretrain, whose
 * decoders are tied, after a step of their loss), RoBERTa's sequence
 * classifier (hf_roberta_seq) and multiple choice (hf_roberta_mc, a step of
 * its loss) and XLM-RoBERTa's masked LM (hf_xlm_roberta_mlm): the directory gets the model's config.json (its
 * model_type and class) beside the weights and loads by
 * itself through accel_bert_from_pretrained(_head) to the fixture's logits (within
 * 1e-5). Run plainly (one process) and by tests/bert.cmake under
 * `accel launch` with FSDP FULL_SHARD on 2 processes: there each process
 * holds only its pieces of the parameters, save_model writes the gathered
 * full weights, and accel_bert_save_pretrained (which would write the
 * pieces) is refused naming save_model. argv[1]: the directory to save into,
 * the same on every process (default: a new one under /tmp, one process
 * only). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "accel/accel.h"
#include "accel/accelerator.h"
#include "accel/bert.h"
#include "nn_fixture.h"

/* dir's model with its config's head (head < 0), or head (the masked LM
 * and pre-training heads, which a config never picks: accel_bert_config_load). */
static accel_module *load(const char *dir, int head) {
    return head >= 0 ? accel_bert_from_pretrained_head(dir, (accel_bert_head)head, 0, ACCEL_CPU_DEVICE)
                     : accel_bert_from_pretrained(dir, ACCEL_CPU_DEVICE);
}

/* The head's (first) logits, the fixture's "logits" (pre-training's "prediction_logits"). */
static accel_tensor *logits_of(accel_module *m, accel_tensor *ids, accel_tensor *tt, accel_tensor *mask) {
    accel_tensor *nsp = NULL;
    switch (accel_bert_config_of(m)->head) {
    case ACCEL_BERT_MASKED_LM: return accel_bert_mlm_logits(m, ids, tt, mask);
    case ACCEL_BERT_TOKEN_CLASSIFICATION: return accel_bert_token_classify(m, ids, tt, mask);
    case ACCEL_BERT_PRETRAINING: return accel_bert_pretraining_logits(m, ids, tt, mask, &nsp);
    case ACCEL_BERT_MULTIPLE_CHOICE: return accel_bert_multiple_choice_logits(m, ids, tt, mask);
    default: return accel_bert_classify(m, ids, tt, mask);
    }
}

/* The loss of the heads with a step here (labels; pre-training's nsp the next sentence labels), else NULL. */
static accel_tensor *loss_of(accel_module *m, accel_tensor *ids, accel_tensor *tt, accel_tensor *mask,
                             accel_tensor *labels, accel_tensor *nsp) {
    switch (accel_bert_config_of(m)->head) {
    case ACCEL_BERT_MASKED_LM: return accel_bert_mlm_loss(m, ids, tt, mask, labels, NULL);
    case ACCEL_BERT_TOKEN_CLASSIFICATION: return accel_bert_token_loss(m, ids, tt, mask, labels, NULL);
    case ACCEL_BERT_PRETRAINING: return accel_bert_pretraining_loss(m, ids, tt, mask, labels, nsp, NULL, NULL);
    case ACCEL_BERT_MULTIPLE_CHOICE: return accel_bert_multiple_choice_loss(m, ids, tt, mask, labels, NULL);
    default: return NULL;
    }
}

/* One model of dir (load) prepared, a training step of its head's loss run
 * through the Accelerator (the fixture's inputs; eval mode, dropout off),
 * saved with save_model to out, loaded back to the fixture's logits. */
static void save_and_load(accel_accelerator *acc, int n, const char *dir, const char *out, int head) {
    accel_module *m = load(dir, head);
    CHECK_MSG(m != NULL, "%s", accel_last_error());
    CHECK_MSG(m && accel_accelerator_prepare_model(acc, m) == ACCEL_OK, "%s", accel_last_error());
    if (!m) return;
    accel_bert_config mc = *accel_bert_config_of(m);
    char path[200];
    snprintf(path, sizeof path, "%s/expected.safetensors", dir);
    accel_safetensors *st = accel_safetensors_open(path);
    CHECK_MSG(st != NULL, "%s", accel_last_error());
    accel_tensor *ids = st ? accel_safetensors_tensor(st, "ids", -1) : NULL,
                 *tt = st && accel_safetensors_find(st, "token_type_ids") /* roberta's: none (zeros) */
                           ? accel_safetensors_tensor(st, "token_type_ids", -1) : NULL,
                 *mask = st ? accel_safetensors_tensor(st, "attention_mask", -1) : NULL,
                 *labels = st ? accel_safetensors_tensor(st, "labels", -1) : NULL,
                 *nsp = st && accel_safetensors_find(st, "next_sentence_label")
                            ? accel_safetensors_tensor(st, "next_sentence_label", -1) : NULL;
    accel_clear_error();
    accel_module_train(m, false);
    accel_tensor *loss = labels ? loss_of(m, ids, tt, mask, labels, nsp) : NULL;
    if (loss || accel_last_status() != ACCEL_OK) { /* the head's loss through the prepared (sharded) model */
        CHECK_MSG(loss && accel_accelerator_backward(acc, loss) == ACCEL_OK, "%s", accel_last_error());
        if (loss) check_tensor_close(st, "loss", loss, 1e-5, 0);
        accel_step_reset();
    }
    if (n > 1) { /* FULL_SHARD: the pieces are not a model */
        CHECK(accel_bert_save_pretrained(m, out, 0) != ACCEL_OK);
        CHECK_MSG(strstr(accel_last_error(), "accel_accelerator_save_model"), "%s", accel_last_error());
    }
    if (n == 1) { /* an older config.json there (another model's): the save's own, the newer file, replaces it */
        char stale[4300];
        snprintf(stale, sizeof stale, "%s/config.json", out);
        FILE *f = mkdir(out, 0755) == 0 || errno == EEXIST ? fopen(stale, "w") : NULL;
        CHECK(f && fputs("{\"model_type\": \"stale\"}", f) >= 0 && fclose(f) == 0);
        /* and a killed config write's scratch file (the atomic writer's mark, the sticky bit): not carried
         * into the staged directory, where it made the save's own config.json write fail (linked twice) */
        snprintf(stale, sizeof stale, "%s/config.json.tmp", out);
        f = fopen(stale, "w");
        CHECK(f && fclose(f) == 0 && chmod(stale, 01644) == 0);
    }
    CHECK_MSG(accel_accelerator_save_model(acc, m, out, NULL) == ACCEL_OK, "%s", accel_last_error());

    accel_bert_config c;
    CHECK_MSG(accel_bert_config_load(out, &c) == ACCEL_OK, "%s", accel_last_error());
    CHECK(c.head == (head >= 0 ? ACCEL_BERT_SEQUENCE_CLASSIFICATION : mc.head) && c.model_type == mc.model_type &&
          c.pad_token_id == mc.pad_token_id && c.num_labels == mc.num_labels && c.hidden_size == mc.hidden_size &&
          c.num_hidden_layers == mc.num_hidden_layers && c.torch_dtype == ACCEL_F32);
    accel_module *back = load(out, head);
    CHECK_MSG(back != NULL, "%s", accel_last_error());
    if (back && ids && mask) {
        accel_module_train(back, false);
        accel_tensor *y = logits_of(back, ids, tt, mask);
        CHECK_MSG(y != NULL, "%s", accel_last_error());
        if (y) check_tensor_close(st, mc.head == ACCEL_BERT_PRETRAINING ? "prediction_logits" : "logits", y, 0, 1e-5);
        accel_step_reset();
    }
    accel_tensor_free(ids);
    accel_tensor_free(tt);
    accel_tensor_free(mask);
    accel_tensor_free(labels);
    accel_tensor_free(nsp);
    accel_safetensors_close(st);
    accel_module_free(back);
    accel_module_free(m);
}

int main(int argc, char **argv) {
    accel_accelerator *acc = accel_accelerator_new(NULL); /* what `accel launch` set */
    CHECK_MSG(acc != NULL, "%s", accel_last_error());
    if (!acc) return check_summary();
    int n = accel_accelerator_num_processes(acc);
    char tmp[64] = "/tmp/accel_bert_save_model_XXXXXX", out[4200];
    CHECK_MSG(argc > 1 || n == 1, "%d processes need the shared directory as argv[1]", n);
    if (argc <= 1 && n == 1) CHECK(mkdtemp(tmp) != NULL);
    /* a sequence classifier, a token classifier (no pooler), a masked LM and a pre-training model (tied),
     * multiple choice (RoBERTa's pooler) */
    snprintf(out, sizeof out, "%s/saved", argc > 1 ? argv[1] : tmp);
    save_and_load(acc, n, "data/hf_bert_cls", out, -1);
    snprintf(out, sizeof out, "%s/saved_token", argc > 1 ? argv[1] : tmp);
    save_and_load(acc, n, "data/hf_bert_tok", out, -1);
    snprintf(out, sizeof out, "%s/saved_mlm", argc > 1 ? argv[1] : tmp);
    save_and_load(acc, n, "data/hf_bert_mlm", out, ACCEL_BERT_MASKED_LM);
    snprintf(out, sizeof out, "%s/saved_pretrain", argc > 1 ? argv[1] : tmp);
    save_and_load(acc, n, "data/hf_bert_pretrain", out, ACCEL_BERT_PRETRAINING);
    snprintf(out, sizeof out, "%s/saved_roberta", argc > 1 ? argv[1] : tmp);
    save_and_load(acc, n, "data/hf_roberta_seq", out, -1);
    snprintf(out, sizeof out, "%s/saved_roberta_mc", argc > 1 ? argv[1] : tmp);
    save_and_load(acc, n, "data/hf_roberta_mc", out, -1);
    snprintf(out, sizeof out, "%s/saved_xlm_roberta_mlm", argc > 1 ? argv[1] : tmp);
    save_and_load(acc, n, "data/hf_xlm_roberta_mlm", out, ACCEL_BERT_MASKED_LM);
    accel_accelerator_free(acc);
    if (argc <= 1 && n == 1) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
        CHECK(system(cmd) == 0);
    }
    return check_summary();
}
