/* Train a small Llama on a text file, byte-level (vocab 256):
 *     accel launch --num_processes 2 [--mixed_precision bf16] [--log_with tensorboard,csv]
 *                  [--project_dir DIR] build/bin/train_llama FILE [STEPS=60]
 * The text is cut into windows of SEQ+1... bytes; each process trains on its shard of
 * them (AdamW, warmup + cosine schedule, gradient clipping). The main process shows a
 * progress bar (rate, ETA, loss and tokens/s over all processes; ACCEL_DISABLE_PROGRESS=1
 * hides it) and logs loss and lr per step to TensorBoard (unless --log_with says
 * otherwise) in <project_dir>/train_llama/, the run's config as hparams. The model is
 * saved to ./llama_out (safetensors + config.json) at the end. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"
#include "accel/accelerator.h"
#include "accel/io.h"

#define SEQ 64

typedef struct text {
    unsigned char *bytes;
    long len;
} text;

static accel_status window(void *ctx, int64_t index, void *const *fields) {
    const text *t = ctx;
    int64_t *ids = fields[0];
    for (int i = 0; i < SEQ; i++) ids[i] = t->bytes[index * SEQ + i];
    return ACCEL_OK;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: train_llama FILE [STEPS]\n");
        return 2;
    }
    int steps = argc > 2 ? atoi(argv[2]) : 60;
    FILE *f = fopen(argv[1], "rb");
    if (!f) {
        perror(argv[1]);
        return 1;
    }
    text t = {0};
    fseek(f, 0, SEEK_END);
    t.len = ftell(f);
    fseek(f, 0, SEEK_SET);
    t.bytes = malloc((size_t)t.len + 1);
    if (!t.bytes || fread(t.bytes, 1, (size_t)t.len, f) != (size_t)t.len) {
        fprintf(stderr, "train_llama: cannot read %s\n", argv[1]);
        fclose(f);
        free(t.bytes);
        return 1;
    }
    fclose(f);
    if (t.len < 2 * SEQ) {
        fprintf(stderr, "train_llama: %s is too short (need at least %d bytes)\n", argv[1], 2 * SEQ);
        free(t.bytes);
        return 1;
    }
    accel_accelerator_opts ao = accel_accelerator_opts_default();
    if (!getenv("ACCEL_LOG_WITH")) ao.log_with = "tensorboard";
    accel_accelerator *acc = accel_accelerator_new(&ao);
    if (!acc) {
        fprintf(stderr, "train_llama: %s\n", accel_last_error());
        free(t.bytes);
        return 1;
    }
    accel_field_spec spec = {ACCEL_I64, 1, {SEQ}};
    accel_dataset *ds = accel_map_dataset_new(t.len / SEQ, 1, &spec, window, &t);
    accel_dataloader_opts o = accel_dataloader_opts_default();
    o.batch_size = 8;
    o.shuffle = true;
    o.seed = 1234;
    accel_dataloader *dl = accel_dataloader_new(ds, &o);

    accel_llama_config cfg = accel_llama_config_default();
    cfg.vocab_size = 256;
    cfg.hidden_size = 64;
    cfg.intermediate_size = 172;
    cfg.num_hidden_layers = 2;
    cfg.num_attention_heads = 4;
    cfg.num_key_value_heads = 2;
    cfg.max_position_embeddings = SEQ;
    cfg.torch_dtype = ACCEL_F32;
    accel_set_seed(acc, 0, false);
    accel_module *model = accel_llama_new(&cfg, ACCEL_CPU_DEVICE);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 3e-3);
    accel_optimizer *opt = model ? accel_optimizer_new_module(ACCEL_OPTIM_ADAMW, model, &h) : NULL;
    accel_lr_scheduler *sched = opt ? accel_lr_scheduler_new(opt, ACCEL_SCHED_COSINE, steps / 10,
                                                             (int64_t)steps * accel_accelerator_num_processes(acc))
                                    : NULL;
    accel_step_reset();

    int rc = !sched || accel_accelerator_prepare(acc, model, opt, dl, sched) != ACCEL_OK;
    const accel_value config[] = {
        ACCEL_VALUE_F("lr", h.lr),
        ACCEL_VALUE_I("steps", steps),
        ACCEL_VALUE_I("batch_size", o.batch_size),
        ACCEL_VALUE_I("seq_len", SEQ),
        ACCEL_VALUE_I("hidden_size", cfg.hidden_size),
        ACCEL_VALUE_I("num_hidden_layers", cfg.num_hidden_layers),
        ACCEL_VALUE_I("num_processes", accel_accelerator_num_processes(acc)),
        ACCEL_VALUE_S("mixed_precision", accel_mixed_precision_name(accel_accelerator_mixed_precision(acc))),
    };
    if (!rc) rc = accel_accelerator_init_trackers(acc, "train_llama", 8, config) != ACCEL_OK;
    accel_progress_opts po = accel_progress_opts_default();
    po.desc = "train";
    po.stream = stdout;
    accel_progress *bar = accel_progress_new(steps, &po);
    double loss_v = 0;
    accel_batch b;
    for (int step = 1; step <= steps && !rc;) {
        if (!accel_dataloader_next(dl, &b)) {
            rc = accel_last_status() != ACCEL_OK;
            continue; /* next epoch */
        }
        accel_dtype prev = accel_accelerator_autocast_begin(acc); /* accelerator.autocast() */
        accel_tensor *loss = accel_llama_loss(model, b.fields[0]);
        accel_accelerator_autocast_end(acc, prev);
        /* stop at the first failure: its error is the most recent call's, reported below */
        if (accel_accelerator_backward(acc, loss) != ACCEL_OK) {
            rc = 1;
            break;
        }
        accel_accelerator_clip_grad_norm(acc, model, 1.0, 2.0);
        if (accel_accelerator_optimizer_step(acc, opt) != ACCEL_OK) {
            rc = 1;
            break;
        }
        accel_accelerator_scheduler_step(acc, sched);
        accel_accelerator_zero_grad(acc, opt);
        /* the mean loss over all processes, for the progress line */
        accel_tensor *mean = accel_accelerator_reduce(acc, accel_unsqueeze(loss, 0), "mean", 1.0);
        loss_v = mean ? accel_item(mean) : loss_v;
        const accel_value logged[] = {ACCEL_VALUE_F("loss", loss_v), ACCEL_VALUE_F("lr", accel_optimizer_get_lr(opt, 0))};
        rc |= accel_accelerator_log(acc, 2, logged, step) != ACCEL_OK;
        accel_progress_set_loss(bar, loss_v);
        accel_progress_add_tokens(bar, b.size * SEQ * accel_accelerator_num_processes(acc));
        accel_progress_update(bar, 1);
        accel_step_reset();
        step++;
    }
    accel_progress_close(bar);
    if (accel_accelerator_end_training(acc) != ACCEL_OK) rc = 1;
    if (!rc) rc = accel_accelerator_save_model(acc, model, "llama_out", "10GB") != ACCEL_OK; /* + config.json */
    if (rc) fprintf(stderr, "train_llama: %s\n", accel_last_error());
    else accel_accelerator_print(acc, "final_loss=%.4f saved llama_out/\n", loss_v);
    accel_accelerator_free(acc);
    accel_lr_scheduler_free(sched);
    accel_optimizer_free(opt);
    accel_module_free(model);
    accel_dataloader_free(dl);
    accel_dataset_free(ds);
    free(t.bytes);
    accel_thread_cleanup();
    return rc;
}
