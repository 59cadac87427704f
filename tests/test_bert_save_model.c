/* accel_accelerator_save_model of a prepared BERT (tests/data/hf_bert_cls,
 * and the token classifier tests/data/hf_bert_tok and masked LM
 * tests/data/hf_bert_mlm, whose decoder is tied, after a step of their loss),
 * RoBERTa's sequence classifier (hf_roberta_seq) and XLM-RoBERTa's masked LM
 * (hf_xlm_roberta_mlm): the directory gets the model's config.json (its
 * model_type and class) beside the weights and loads by
 * itself through accel_bert_from_pretrained(_head) to the fixture's logits (within
 * 1e-5). Run plainly (one process) and by tests/bert.cmake under
 * `accel launch` with FSDP FULL_SHARD on 2 processes: there each process
 * holds only its pieces of the parameters, save_model writes the gathered
 * full weights, and accel_bert_save_pretrained (which would write the
 * pieces) is refused naming save_model. argv[1]: the directory to save into,
 * the same on every process (default: a new one under /tmp, one process
 * only). */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "accel/accel.h"
#include "accel/accelerator.h"
#include "accel/bert.h"
#include "nn_fixture.h"

/* dir's model with its config's head, or the masked LM (which a config
 * never picks: accel_bert_config_load). */
static accel_module *load(const char *dir, bool mlm) {
    return mlm ? accel_bert_from_pretrained_head(dir, ACCEL_BERT_MASKED_LM, 0, ACCEL_CPU_DEVICE)
               : accel_bert_from_pretrained(dir, ACCEL_CPU_DEVICE);
}

/* One model of dir (load) prepared, a training step of its head's loss run
 * through the Accelerator (the fixture's inputs; eval mode, dropout off),
 * saved with save_model to out, loaded back to the fixture's logits. */
static void save_and_load(accel_accelerator *acc, int n, const char *dir, const char *out, bool mlm) {
    accel_module *m = load(dir, mlm);
    CHECK_MSG(m != NULL, "%s", accel_last_error());
    CHECK_MSG(m && accel_accelerator_prepare_model(acc, m) == ACCEL_OK, "%s", accel_last_error());
    if (!m) return;
    accel_bert_config mc = *accel_bert_config_of(m);
    bool tok = mc.head == ACCEL_BERT_TOKEN_CLASSIFICATION;
    char path[200];
    snprintf(path, sizeof path, "%s/expected.safetensors", dir);
    accel_safetensors *st = accel_safetensors_open(path);
    CHECK_MSG(st != NULL, "%s", accel_last_error());
    accel_tensor *ids = st ? accel_safetensors_tensor(st, "ids", -1) : NULL,
                 *tt = st && accel_safetensors_find(st, "token_type_ids") /* roberta's: none (zeros) */
                           ? accel_safetensors_tensor(st, "token_type_ids", -1) : NULL,
                 *mask = st ? accel_safetensors_tensor(st, "attention_mask", -1) : NULL,
                 *labels = st ? accel_safetensors_tensor(st, "labels", -1) : NULL;
    if ((tok || mlm) && labels) { /* the head's loss through the prepared (sharded) model: the fixture's */
        accel_module_train(m, false);
        accel_tensor *loss = mlm ? accel_bert_mlm_loss(m, ids, tt, mask, labels, NULL)
                                 : accel_bert_token_loss(m, ids, tt, mask, labels, NULL);
        CHECK_MSG(loss && accel_accelerator_backward(acc, loss) == ACCEL_OK, "%s", accel_last_error());
        if (loss) check_tensor_close(st, "loss", loss, 1e-5, 0);
        accel_step_reset();
    }
    if (n > 1) { /* FULL_SHARD: the pieces are not a model */
        CHECK(accel_bert_save_pretrained(m, out, 0) != ACCEL_OK);
        CHECK_MSG(strstr(accel_last_error(), "accel_accelerator_save_model"), "%s", accel_last_error());
    }
    CHECK_MSG(accel_accelerator_save_model(acc, m, out, NULL) == ACCEL_OK, "%s", accel_last_error());

    accel_bert_config c;
    CHECK_MSG(accel_bert_config_load(out, &c) == ACCEL_OK, "%s", accel_last_error());
    CHECK(c.head == (mlm ? ACCEL_BERT_SEQUENCE_CLASSIFICATION : mc.head) && c.model_type == mc.model_type &&
          c.pad_token_id == mc.pad_token_id && c.num_labels == mc.num_labels && c.hidden_size == mc.hidden_size &&
          c.num_hidden_layers == mc.num_hidden_layers && c.torch_dtype == ACCEL_F32);
    accel_module *back = load(out, mlm);
    CHECK_MSG(back != NULL, "%s", accel_last_error());
    if (back && ids && mask) {
        accel_module_train(back, false);
        accel_tensor *y = mlm   ? accel_bert_mlm_logits(back, ids, tt, mask)
                          : tok ? accel_bert_token_classify(back, ids, tt, mask)
                                : accel_bert_classify(back, ids, tt, mask);
        CHECK_MSG(y != NULL, "%s", accel_last_error());
        if (y) check_tensor_close(st, "logits", y, 0, 1e-5);
        accel_step_reset();
    }
    accel_tensor_free(ids);
    accel_tensor_free(tt);
    accel_tensor_free(mask);
    accel_tensor_free(labels);
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
    /* a sequence classifier, a token classifier (no pooler) and a masked LM (tied) */
    snprintf(out, sizeof out, "%s/saved", argc > 1 ? argv[1] : tmp);
    save_and_load(acc, n, "data/hf_bert_cls", out, false);
    snprintf(out, sizeof out, "%s/saved_token", argc > 1 ? argv[1] : tmp);
    save_and_load(acc, n, "data/hf_bert_tok", out, false);
    snprintf(out, sizeof out, "%s/saved_mlm", argc > 1 ? argv[1] : tmp);
    save_and_load(acc, n, "data/hf_bert_mlm", out, true);
    snprintf(out, sizeof out, "%s/saved_roberta", argc > 1 ? argv[1] : tmp);
    save_and_load(acc, n, "data/hf_roberta_seq", out, false);
    snprintf(out, sizeof out, "%s/saved_xlm_roberta_mlm", argc > 1 ? argv[1] : tmp);
    save_and_load(acc, n, "data/hf_xlm_roberta_mlm", out, true);
    accel_accelerator_free(acc);
    if (argc <= 1 && n == 1) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
        CHECK(system(cmd) == 0);
    }
    return check_summary();
}
