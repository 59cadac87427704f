/* Save a trained model the two ways Accelerate's save_model does:
 *     accel launch [--num_processes 2] [--mixed_precision bf16] build/bin/save_model OUT [MAX_SHARD_SIZE=10GB]
 * trains a tiny Llama with tied embeddings for a few AdamW steps on a fixed
 * token pattern, then writes
 *     OUT/safetensors/  save_model(model, dir, max_shard_size)   (model.safetensors, the tied alias dropped)
 *     OUT/pytorch/      the same with safe_serialization=False  (pytorch_model.bin, torch.save's format)
 * each with config.json (save_model writes it for a Llama), so transformers'
 * from_pretrained loads either folder (tools/check_torch_loads_accel.py checks both). */
#include <stdio.h>
#include <stdlib.h>

#include "accel/accel.h"
#include "accel/accelerator.h"
#include "accel/io.h"

#define SEQ 16
#define STEPS 4

static accel_status tokens(void *ctx, int64_t index, void *const *fields) {
    (void)ctx;
    int64_t *ids = fields[0];
    for (int i = 0; i < SEQ; i++) ids[i] = (index * 7 + i * 3) % 64;
    return ACCEL_OK;
}

static accel_llama_config tiny_config(void) {
    accel_llama_config cfg = accel_llama_config_default();
    cfg.vocab_size = 64;
    cfg.hidden_size = 32;
    cfg.intermediate_size = 64;
    cfg.num_hidden_layers = 2;
    cfg.num_attention_heads = 4;
    cfg.num_key_value_heads = 2;
    cfg.max_position_embeddings = SEQ;
    cfg.tie_word_embeddings = true;
    cfg.torch_dtype = ACCEL_F32;
    return cfg;
}

/* save_model into OUT/<sub> with these options (config.json comes with it). */
static accel_status save(accel_accelerator *acc, accel_module *model, const char *out, const char *sub,
                         accel_save_model_opts opts) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/%s", out, sub);
    accel_status st = accel_accelerator_save_model_with(acc, model, dir, &opts);
    if (!st) accel_log_info(accel_get_logger("save_model"), "saved %s", dir);
    return st;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: save_model OUT [MAX_SHARD_SIZE]\n");
        return 2;
    }
    const char *shard = argc > 2 ? argv[2] : "10GB";
    accel_logger *log = accel_get_logger("save_model");
    accel_logger_set_level(log, ACCEL_LOG_INFO);
    accel_accelerator *acc = accel_accelerator_new(NULL);
    if (!acc) {
        fprintf(stderr, "save_model: %s\n", accel_last_error());
        return 1;
    }
    accel_field_spec spec = {ACCEL_I64, 1, {SEQ}};
    accel_dataset *ds = accel_map_dataset_new(64, 1, &spec, tokens, NULL);
    accel_dataloader_opts o = accel_dataloader_opts_default();
    o.batch_size = 4;
    accel_dataloader *dl = accel_dataloader_new(ds, &o);
    accel_llama_config cfg = tiny_config();
    accel_set_seed(acc, 0, false);
    accel_module *model = accel_llama_new(&cfg, ACCEL_CPU_DEVICE);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 1e-2);
    accel_optimizer *opt = model ? accel_optimizer_new_module(ACCEL_OPTIM_ADAMW, model, &h) : NULL;
    accel_step_reset();
    int rc = !opt || accel_accelerator_prepare(acc, model, opt, dl, NULL) != ACCEL_OK;
    accel_batch b;
    for (int step = 0; step < STEPS && !rc && accel_dataloader_next(dl, &b); step++) {
        accel_dtype prev = accel_accelerator_autocast_begin(acc);
        accel_tensor *loss = accel_llama_loss(model, b.fields[0]);
        accel_accelerator_autocast_end(acc, prev);
        rc |= accel_accelerator_backward(acc, loss) != ACCEL_OK;
        rc |= accel_accelerator_optimizer_step(acc, opt) != ACCEL_OK;
        accel_accelerator_zero_grad(acc, opt);
        accel_log_info(log, "step %d loss %.4f", step, accel_item(loss));
        accel_step_reset();
    }
    if (!rc) rc = save(acc, model, argv[1], "safetensors", (accel_save_model_opts){.max_shard_size = shard}) != ACCEL_OK;
    if (!rc)
        rc = save(acc, model, argv[1], "pytorch",
                  (accel_save_model_opts){.max_shard_size = shard, .no_safe_serialization = true}) != ACCEL_OK;
    if (rc) fprintf(stderr, "save_model: %s\n", accel_last_error());
    accel_accelerator_free(acc);
    accel_optimizer_free(opt);
    accel_module_free(model);
    accel_dataloader_free(dl);
    accel_dataset_free(ds);
    accel_thread_cleanup();
    return rc;
}
