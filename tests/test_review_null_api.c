/* Public entry points given NULL (or a zero process count) return an error
 * status / NULL / a neutral value with the error set; before the review they
 * dereferenced NULL (accelerator getters and process control, the dataloader
 * accessors, accel_batches_*, accel_optimizer_kind, accel_get_max_layer_size)
 * or divided by zero (accel_batch_sampler_shard_len with 0 processes). */
#include "accel/accel.h"
#include "accel/bert.h"
#include "check.h"
#include "tiny_llama.h"

/* The call set an INVALID_ARG error naming fn; clears it for the next check. */
static bool invalid(const char *fn) {
    bool ok = accel_last_status() == ACCEL_ERR_INVALID_ARG && strstr(accel_last_error(), fn) != NULL;
    if (!ok) fprintf(stderr, "expected an INVALID_ARG error naming %s, got: %s\n", fn, accel_last_error());
    accel_clear_error();
    return ok;
}

static void test_accelerator_null(void) {
    accel_clear_error();
    CHECK(accel_accelerator_num_processes(NULL) == 1 && invalid("accel_accelerator_num_processes"));
    CHECK(accel_accelerator_process_index(NULL) == 0 && invalid("accel_accelerator_process_index"));
    CHECK(accel_accelerator_local_process_index(NULL) == 0 && invalid("accel_accelerator_local_process_index"));
    CHECK(!accel_accelerator_is_main_process(NULL) && invalid("accel_accelerator_is_main_process"));
    CHECK(!accel_accelerator_is_local_main_process(NULL) && invalid("accel_accelerator_is_local_main_process"));
    CHECK(!accel_accelerator_is_last_process(NULL) && invalid("accel_accelerator_is_last_process"));
    CHECK(accel_accelerator_device(NULL).type == ACCEL_DEV_CPU && invalid("accel_accelerator_device"));
    CHECK(accel_accelerator_mixed_precision(NULL) == ACCEL_MP_NO && invalid("accel_accelerator_mixed_precision"));
    CHECK(accel_accelerator_gradient_accumulation_steps(NULL) == 1 &&
          invalid("accel_accelerator_gradient_accumulation_steps"));
    accel_accelerator_set_gradient_accumulation_steps(NULL, 2);
    CHECK(invalid("accel_accelerator_set_gradient_accumulation_steps"));
    CHECK(!accel_accelerator_sync_gradients(NULL) && invalid("accel_accelerator_sync_gradients"));
    CHECK(accel_accelerator_step(NULL) == 0 && invalid("accel_accelerator_step"));
    CHECK(!accel_accelerator_optimizer_step_was_skipped(NULL) && invalid("accel_accelerator_optimizer_step_was_skipped"));
    CHECK(accel_accelerator_loss_scale(NULL) == 1.0 && invalid("accel_accelerator_loss_scale"));
    CHECK(accel_accelerator_zero_stage(NULL) == 0 && invalid("accel_accelerator_zero_stage"));
    CHECK(accel_accelerator_gradient_clipping(NULL) == 0.0 && invalid("accel_accelerator_gradient_clipping"));
    CHECK(!accel_accelerator_dp_group(NULL) && invalid("accel_accelerator_dp_group"));
    char buf[64];
    CHECK(accel_accelerator_describe(NULL, buf, sizeof buf) == NULL && invalid("accel_accelerator_describe"));
    CHECK(accel_accelerator_wait_for_everyone(NULL) == ACCEL_ERR_INVALID_ARG && invalid("accel_accelerator_wait_for_everyone"));
    CHECK(accel_accelerator_main_process_first_begin(NULL) == ACCEL_ERR_INVALID_ARG &&
          invalid("accel_accelerator_main_process_first_begin"));
    CHECK(accel_accelerator_main_process_first_end(NULL) == ACCEL_ERR_INVALID_ARG &&
          invalid("accel_accelerator_main_process_first_end"));
    accel_process_split sp = accel_accelerator_split_between_processes(NULL, 10);
    CHECK(sp.start == 0 && sp.end == 0 && invalid("accel_accelerator_split_between_processes"));
    accel_dtype prev = accel_accelerator_autocast_begin(NULL);
    CHECK(prev == accel_autocast_dtype() && invalid("accel_accelerator_autocast_begin"));
    accel_accelerator_autocast_end(NULL, prev);
    CHECK(invalid("accel_accelerator_autocast_end"));
    accel_accelerator_accumulate(NULL);
    CHECK(invalid("accel_accelerator_accumulate"));
    accel_accelerator_unscale_gradients(NULL);
    CHECK(invalid("accel_accelerator_unscale_gradients"));
    accel_accelerator_no_sync_begin(NULL, NULL); /* no model prepared: a no-op, as documented for unknown models */
    accel_accelerator_no_sync_end(NULL, NULL);
    void *data = NULL;
    size_t len = 0, lens[1];
    CHECK(accel_accelerator_gather_object(NULL, "x", 1, &data, lens) == ACCEL_ERR_INVALID_ARG &&
          invalid("accel_accelerator_gather_object"));
    CHECK(accel_accelerator_broadcast_object(NULL, &data, &len, 0) == ACCEL_ERR_INVALID_ARG &&
          invalid("accel_accelerator_broadcast_object"));
    /* the tensor collectives read the accelerator's world size: NULL segfaulted */
    accel_tensor *t = accel_zeros(ACCEL_F32, ACCEL_SHAPE(2, 3));
    CHECK(accel_accelerator_gather(NULL, t) == NULL && invalid("accel_accelerator_gather"));
    CHECK(accel_accelerator_gather_for_metrics(NULL, t) == NULL && invalid("accel_accelerator_gather_for_metrics"));
    CHECK(accel_accelerator_reduce(NULL, t, "sum", 1.0) == NULL && invalid("accel_accelerator_reduce"));
    CHECK(accel_accelerator_pad_across_processes(NULL, t, 0, 0.0, false) == NULL &&
          invalid("accel_accelerator_pad_across_processes"));
    CHECK(accel_accelerator_broadcast(NULL, t, 0) == NULL && invalid("accel_accelerator_broadcast"));
    accel_step_reset();
    /* a real accelerator still answers, and describe rejects a NULL buffer */
    accel_accelerator *acc = accel_accelerator_new(NULL);
    CHECK(acc != NULL);
    CHECK(accel_accelerator_num_processes(acc) == 1 && accel_last_status() == ACCEL_OK);
    CHECK(accel_accelerator_describe(acc, NULL, 0) == NULL && invalid("accel_accelerator_describe"));
    CHECK(accel_accelerator_describe(acc, buf, sizeof buf) == buf);
    accel_accelerator_free(acc);
}

static void test_data_null(void) {
    accel_clear_error();
    accel_batches_init(NULL);
    CHECK(accel_batches_size(NULL, 0) == 0);
    CHECK(accel_batches_at(NULL, 0) == NULL);
    CHECK(accel_batches_push(NULL, 1, (int64_t[]){0}) == ACCEL_ERR_INVALID_ARG && invalid("accel_batches_push"));
    /* from_order wrote through a NULL list, and called a negative n a bad batch_size */
    CHECK(accel_batches_from_order(NULL, 10, NULL, 3, false) == ACCEL_ERR_INVALID_ARG &&
          invalid("accel_batches_from_order"));
    accel_batches neg;
    accel_batches_init(&neg);
    CHECK(accel_batches_from_order(&neg, -10, NULL, 3, false) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "n must be >= 0 (got -10)");
    accel_clear_error();
    /* more indices than memory holds: an error at once (grown batch by batch,
     * the list ran until the system killed the process; past 2^62 entries its
     * capacity doubled into a negative number, forever) */
    CHECK(accel_batches_from_order(&neg, INT64_MAX, NULL, 1, false) == ACCEL_ERR_OOM);
    CHECK_STR_CONTAINS(accel_last_error(), "do not fit in memory");
    CHECK(accel_batches_from_order(&neg, (int64_t)1 << 62, NULL, 1 << 20, true) == ACCEL_ERR_OOM);
    CHECK(neg.n == 0);
    accel_clear_error();
    accel_batches_free(&neg);
    accel_batches b;
    accel_batches_init(&b);
    CHECK(accel_batches_push(&b, 2, (int64_t[]){4, 5}) == ACCEL_OK);
    CHECK(accel_batches_size(&b, 0) == 2 && accel_batches_at(&b, 0)[1] == 5);
    CHECK(accel_batches_size(&b, 1) == 0 && accel_batches_at(&b, 1) == NULL); /* past the end */
    accel_batches_free(&b);

    /* zero processes, NULL options: the defaults (one process), as every options struct */
    accel_shard_opts zero = {0};
    CHECK(accel_batch_sampler_shard_len(10, &zero) == 10 && accel_last_status() == ACCEL_OK);
    CHECK(accel_batch_sampler_shard_len(10, NULL) == 10 && accel_last_status() == ACCEL_OK);
    accel_shard_opts negative = {.num_processes = -1};
    CHECK(accel_batch_sampler_shard_len(10, &negative) == 0 && invalid("accel_batch_sampler_shard_len"));
    accel_shard_opts two = {.num_processes = 2, .process_index = 1, .batch_size = 4};
    CHECK(accel_batch_sampler_shard_len(5, &two) == 3 && accel_last_status() == ACCEL_OK);

    CHECK(accel_dataloader_get_opts(NULL) == NULL && invalid("accel_dataloader_get_opts"));
    CHECK(accel_dataloader_dataset(NULL) == NULL && invalid("accel_dataloader_dataset"));
    CHECK(accel_dataloader_shard(NULL, 1, 0, false, true) == ACCEL_ERR_INVALID_ARG && invalid("accel_dataloader_shard"));
    accel_dataloader_set_seed(NULL, 1);
    CHECK(invalid("accel_dataloader_set_seed"));
    CHECK(accel_dataloader_epoch(NULL) == 0 && invalid("accel_dataloader_epoch"));
    accel_dataloader_set_epoch(NULL, 3);
    CHECK(invalid("accel_dataloader_set_epoch"));
    CHECK(accel_dataloader_remainder(NULL) == -1 && invalid("accel_dataloader_remainder"));
    CHECK(accel_dataloader_position(NULL) == 0);
    accel_dataloader_skip_first_batches(NULL, 2);
    CHECK(invalid("accel_dataloader_skip_first_batches"));
    accel_dataloader_state st = accel_dataloader_get_state(NULL);
    CHECK(st.epoch == 0 && st.position == 0 && invalid("accel_dataloader_get_state"));
    accel_dataloader_set_state(NULL, &st);
    CHECK(invalid("accel_dataloader_set_state"));
}

static void test_optim_bigmodel_null(void) {
    accel_clear_error();
    (void)accel_optimizer_kind(NULL);
    CHECK(invalid("accel_optimizer_kind"));
    CHECK(accel_optimizer_num_groups(NULL) == 0 && invalid("accel_optimizer_num_groups"));
    CHECK(accel_optimizer_num_segments(NULL) == 0 && invalid("accel_optimizer_num_segments"));
    CHECK(accel_optimizer_step_count(NULL) == 0 && invalid("accel_optimizer_step_count"));
    CHECK(accel_lr_scheduler_last_epoch(NULL) == 0 && invalid("accel_lr_scheduler_last_epoch"));
    CHECK(accel_get_max_layer_size(NULL, NULL, NULL, 0, NULL, NULL) == -1 && invalid("accel_get_max_layer_size"));
    accel_module *m = accel_linear_new(2, 3, true, ACCEL_CPU_DEVICE, ACCEL_F32);
    CHECK(m != NULL);
    int64_t total = 0;
    CHECK(accel_calculate_maximum_sizes(m, NULL, 0, &total, NULL) == ACCEL_ERR_INVALID_ARG &&
          invalid("accel_calculate_maximum_sizes"));
    int64_t largest = 0;
    CHECK(accel_calculate_maximum_sizes(m, NULL, 0, &total, &largest) == ACCEL_OK);
    CHECK_MSG(total == (2 * 3 + 3) * 4 && largest == 2 * 3 * 4, /* the root's direct tensors are layers of their own */ "total %lld largest %lld", (long long)total, (long long)largest);
    CHECK(accel_get_max_layer_size(m, NULL, NULL, 0, NULL, NULL) == -1 && invalid("accel_get_max_layer_size"));
    accel_module_free(m);
}

/* One rule for every options pointer of the API (docs/contract.md "Options"):
 * NULL means the defaults, as the zeroed struct; only accel_llama_activation_bytes,
 * whose options are the question itself (batch and sequence sizes), refuses it.
 * accel_dataloader_new, accel_batch_sampler_shard, the optimizer's hparams and
 * accel_generate refused NULL before. */
static void test_null_options(void) {
    accel_clear_error();
    accel_tensor *x = accel_arange(ACCEL_F32, 0, 5);
    accel_dataset *ds = accel_tensor_dataset_new(1, &x);
    accel_dataloader *dl = accel_dataloader_new(ds, NULL);
    CHECK_MSG(dl != NULL, "%s", accel_last_error());
    if (dl) {
        CHECK(accel_dataloader_get_opts(dl)->batch_size == 1 && accel_dataloader_get_opts(dl)->num_processes == 1);
        accel_batch b;
        int n = 0;
        while (accel_dataloader_next(dl, &b)) CHECK(b.size == 1 && b.indices[0] == n++); /* in order */
        CHECK(n == 5 && accel_last_status() == ACCEL_OK);
    }
    accel_dataloader_free(dl);
    CHECK(accel_dataloader_new(NULL, NULL) == NULL && invalid("accel_dataloader_new: dataset is NULL"));
    accel_dataset_free(ds);

    accel_batches g, out;
    accel_batches_init(&g);
    accel_batches_init(&out);
    CHECK(accel_batches_push(&g, 2, (int64_t[]){0, 1}) == ACCEL_OK && accel_batches_push(&g, 1, (int64_t[]){2}) == ACCEL_OK);
    CHECK(accel_batch_sampler_shard(&g, NULL, &out) == ACCEL_OK);
    CHECK(out.n == 2 && accel_batches_size(&out, 0) == 2 && accel_batches_at(&out, 1)[0] == 2);
    accel_batches_free(&g);
    accel_batches_free(&out);

    /* hparams NULL: torch.optim's defaults (lr 1e-3; AdamW's weight decay 0.01), in every constructor */
    accel_tensor *p = accel_tensor_new(ACCEL_F32, 1, (int64_t[]){4}, ACCEL_CPU_DEVICE);
    accel_tensor *gr = accel_tensor_new(ACCEL_F32, 1, (int64_t[]){4}, ACCEL_CPU_DEVICE);
    accel_optimizer *o = accel_optimizer_new_params(ACCEL_OPTIM_ADAMW, 1, &p, NULL);
    CHECK_MSG(o != NULL, "%s", accel_last_error());
    if (o) {
        CHECK(accel_optimizer_get_lr(o, 0) == 1e-3 && accel_optimizer_hparams(o, 0)->weight_decay == 0.01);
        CHECK(accel_optimizer_add_params(o, 0, NULL, NULL) == 1);
    }
    accel_optimizer_free(o);
    o = accel_optimizer_new_flat(ACCEL_OPTIM_SGD, p, gr, NULL);
    CHECK_MSG(o != NULL && accel_optimizer_get_lr(o, 0) == 1e-3, "%s", accel_last_error());
    accel_optimizer_free(o);
    accel_tensor_free(p);
    accel_tensor_free(gr);

    /* generation options NULL: the zeroed struct (greedy, no new token) */
    CHECK(accel_generate_opts_check(NULL, 3) == ACCEL_OK);
    accel_module *llama = tiny_llama(1);
    int64_t prompt[3] = {1, 2, 3}, ids[3], n_ids = 0;
    CHECK_MSG(accel_generate(llama, prompt, 3, NULL, ids, &n_ids) == ACCEL_OK, "%s", accel_last_error());
    CHECK(n_ids == 3 && ids[2] == 3);
    accel_module_free(llama);

    /* the exception: a step's shape has no default */
    accel_llama_config cfg = accel_llama_config_default();
    accel_activation_bytes ab;
    CHECK(accel_llama_activation_bytes(&cfg, NULL, &ab) == ACCEL_ERR_INVALID_ARG &&
          invalid("accel_llama_activation_bytes: options are NULL: batch_size and seq_len have no default"));
    accel_bert_config bcfg = accel_bert_config_default();
    CHECK(accel_bert_activation_bytes(&bcfg, NULL, &ab) == ACCEL_ERR_INVALID_ARG &&
          invalid("accel_bert_activation_bytes: options are NULL: batch_size and seq_len have no default"));
    accel_step_reset();
}

int main(void) {
    RUN(test_accelerator_null);
    RUN(test_data_null);
    RUN(test_optim_bigmodel_null);
    RUN(test_null_options);
    return check_summary();
}
