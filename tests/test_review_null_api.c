/* Public entry points given NULL (or a zero process count) return an error
 * status / NULL / a neutral value with the error set; before the review they
 * dereferenced NULL (accelerator getters and process control, the dataloader
 * accessors, accel_batches_*, accel_optimizer_kind, accel_get_max_layer_size)
 * or divided by zero (accel_batch_sampler_shard_len with 0 processes). */
#include "accel/accel.h"
#include "check.h"

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
    accel_batches b;
    accel_batches_init(&b);
    CHECK(accel_batches_push(&b, 2, (int64_t[]){4, 5}) == ACCEL_OK);
    CHECK(accel_batches_size(&b, 0) == 2 && accel_batches_at(&b, 0)[1] == 5);
    CHECK(accel_batches_size(&b, 1) == 0 && accel_batches_at(&b, 1) == NULL); /* past the end */
    accel_batches_free(&b);

    accel_shard_opts zero = {0};
    CHECK(accel_batch_sampler_shard_len(10, &zero) == 0 && invalid("accel_batch_sampler_shard_len"));
    CHECK(accel_batch_sampler_shard_len(10, NULL) == 0 && invalid("accel_batch_sampler_shard_len"));
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

int main(void) {
    RUN(test_accelerator_null);
    RUN(test_data_null);
    RUN(test_optim_bigmodel_null);
    return check_summary();
}
