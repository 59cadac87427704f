/* Fine-tune a Hugging Face Llama checkpoint on token ids, then save it as a
 * Hugging Face model directory:
 *     accel launch --num_processes 2 [--mixed_precision bf16] [--use_fsdp ...]
 *                  build/bin/finetune MODEL_DIR IDS_FILE OUT_DIR [STEPS=20] [LR=1e-4]
 * MODEL_DIR is a from_pretrained directory (config.json + model.safetensors or
 * shards + index). IDS_FILE holds the corpus as token ids of the model's
 * vocabulary, whitespace-separated (what a tokenizer wrote). The ids are cut
 * into windows of SEQ tokens; each process trains on its shard of them
 * (AdamW, linear warmup and decay, clipping at 1.0). OUT_DIR gets the trained
 * weights and config.json, loadable by transformers' from_pretrained and by
 * build/bin/generate. Prints the loss of the first and the last step. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"
#include "accel/accelerator.h"
#include "accel/bigmodel.h"
#include "accel/io.h"
#include "example_args.h"

#define SEQ 32

typedef struct corpus {
    int64_t *ids;
    int64_t n;
} corpus;

static accel_status window(void *ctx, int64_t index, void *const *fields) {
    const corpus *c = ctx;
    int64_t *out = fields[0];
    for (int i = 0; i < SEQ; i++) out[i] = c->ids[index * SEQ + i];
    return ACCEL_OK;
}

/* Every id of path, each in [0, vocab); a message naming the file and the
 * offending token otherwise. */
static int read_ids(const char *path, int64_t vocab, corpus *c) {
    FILE *f = fopen(path, "r");
    if (!f) return accel_set_error(ACCEL_ERR_IO, "cannot open %s: %s", path, strerror(errno)) != ACCEL_OK;
    int64_t cap = 1 << 12;
    c->ids = malloc((size_t)cap * sizeof *c->ids);
    char tok[32];
    int rc = !c->ids && accel_set_error(ACCEL_ERR_OOM, "%s: out of memory", path);
    while (!rc && fscanf(f, "%31s", tok) == 1) {
        char *end;
        errno = 0;
        long long v = strtoll(tok, &end, 10);
        if (*end || errno || v < 0 || v >= vocab) {
            rc = accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: token %lld is \"%s\", not an id in [0, %lld)", path,
                                 (long long)c->n + 1, tok, (long long)vocab) != ACCEL_OK;
            break;
        }
        if (c->n == cap) {
            int64_t *grown = realloc(c->ids, (size_t)(cap *= 2) * sizeof *c->ids);
            if (!grown) {
                rc = accel_set_error(ACCEL_ERR_OOM, "%s: out of memory for %lld ids", path, (long long)cap) != ACCEL_OK;
                break;
            }
            c->ids = grown;
        }
        c->ids[c->n++] = v;
    }
    fclose(f);
    if (!rc && c->n < 2 * SEQ)
        rc = accel_set_error(ACCEL_ERR_INVALID_ARG, "%s holds %lld ids, need at least %d", path, (long long)c->n,
                             2 * SEQ) != ACCEL_OK;
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 4 || argc > 6) {
        fprintf(stderr, "usage: finetune MODEL_DIR IDS_FILE OUT_DIR [STEPS] [LR]\n");
        return 2;
    }
    long long steps;
    double lr;
    if (!arg_int(argc, argv, 4, 20, &steps) || !arg_real(argc, argv, 5, 1e-4, &lr) || steps < 1 || steps > 1000000000 ||
        !(lr > 0)) {
        fprintf(stderr, "finetune: STEPS must be an integer >= 1 and LR a number > 0\n");
        return 2;
    }
    accel_accelerator *acc = accel_accelerator_new(NULL); /* what `accel launch` set */
    if (!acc) {
        fprintf(stderr, "finetune: %s\n", accel_last_error());
        return 1;
    }
    /* The checkpoint straight into host memory: every weight materialised on
     * the cpu (no device map), so the optimizer can own and update it. */
    accel_dispatched *loaded = NULL;
    accel_module *model = accel_llama_from_pretrained(argv[1], NULL, NULL, NULL, NULL, &loaded);
    if (!model) {
        fprintf(stderr, "finetune: %s\n", accel_last_error());
        accel_accelerator_free(acc);
        return 1;
    }
    /* With every weight in host memory the load's bookkeeping holds nothing the
     * model needs, and a tensor-parallel prepare refuses a model still tied to it. */
    accel_dispatched_free(loaded);
    accel_module_train(model, true); /* from_pretrained returns eval mode (GPT-2: dropout off) */
    const accel_llama_config cfg = *accel_llama_config_of(model);
    corpus c = {0};
    int rc = read_ids(argv[2], cfg.vocab_size, &c);
    accel_field_spec spec = {ACCEL_I64, 1, {SEQ}};
    accel_dataset *ds = rc ? NULL : accel_map_dataset_new(c.n / SEQ, 1, &spec, window, &c);
    accel_dataloader *dl = ds ? accel_dataloader_new(ds, &(accel_dataloader_opts){.batch_size = 4, .shuffle = true, .seed = 42}) : NULL;
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, lr);
    accel_optimizer *opt = dl ? accel_optimizer_new_module(ACCEL_OPTIM_ADAMW, model, &h) : NULL;
    accel_lr_scheduler *sched =
        opt ? accel_lr_scheduler_new(opt, ACCEL_SCHED_LINEAR, steps / 10,
                                     (int64_t)steps * accel_accelerator_num_processes(acc))
            : NULL;
    if (!rc) rc = !sched || accel_accelerator_prepare(acc, model, opt, dl, sched) != ACCEL_OK;
    double first = 0, last = 0;
    accel_batch b;
    for (int step = 1; step <= steps && !rc;) {
        if (!accel_dataloader_next(dl, &b)) {
            rc = accel_last_status() != ACCEL_OK;
            continue; /* next epoch */
        }
        accel_dtype prev = accel_accelerator_autocast_begin(acc);
        accel_tensor *loss = accel_llama_loss(model, b.fields[0]);
        accel_accelerator_autocast_end(acc, prev);
        rc |= accel_accelerator_backward(acc, loss) != ACCEL_OK;
        accel_accelerator_clip_grad_norm(acc, model, 1.0, 2.0);
        rc |= accel_accelerator_optimizer_step(acc, opt) != ACCEL_OK;
        accel_accelerator_scheduler_step(acc, sched);
        accel_accelerator_zero_grad(acc, opt);
        accel_tensor *mean = accel_accelerator_reduce(acc, accel_unsqueeze(loss, 0), "mean", 1.0);
        if (!mean) rc = 1;
        else last = accel_item(mean);
        if (step == 1) first = last;
        accel_step_reset();
        step++;
    }
    if (!rc) rc = accel_accelerator_save_model(acc, model, argv[3], "10GB") != ACCEL_OK; /* + config.json */
    if (rc) fprintf(stderr, "finetune: %s\n", accel_last_error());
    else accel_accelerator_print(acc, "first_loss=%.4f final_loss=%.4f saved %s\n", first, last, argv[3]);
    accel_accelerator_free(acc);
    accel_lr_scheduler_free(sched);
    accel_optimizer_free(opt);
    accel_module_free(model);
    accel_dataloader_free(dl);
    accel_dataset_free(ds);
    free(c.ids);
    accel_thread_cleanup();
    return rc;
}
