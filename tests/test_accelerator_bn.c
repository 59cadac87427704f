/* BatchNorm's running stats under DDP (run plainly and under `accel launch
 * --num_processes 2`, on the cpu and on hostless:0, whose buffers are staged
 * through host memory for their broadcast): as torch's DDP with broadcast_buffers=True, a forward
 * that follows one with gradients and their sync starts from rank 0's
 * buffers; a forward under no_grad or no_sync leaves the next one unsynced. */
#include "accel/accel.h"
#include "accel/accelerator.h"
#include "check.h"

static accel_accelerator *A;
static int N, R;

/* t of rank 0 gathered beside every rank's: all equal? */
static bool agree(accel_tensor *t) {
    accel_tensor *all = accel_accelerator_gather(A, accel_unsqueeze(t, 0)); /* [N, ...] */
    bool same = all != NULL;
    for (int64_t r = 1; all && r < N; r++)
        for (int64_t c = 0; c < accel_numel(t); c++)
            same &= accel_get(all, (int64_t[]){r, c}) == accel_get(all, (int64_t[]){0, c});
    return same;
}

/* Every buffer of the BatchNorm (two f32 ones and an int64 count, one message) alike on all ranks? */
static bool stats_agree(accel_module *m) {
    static const char *names[] = {"1.running_mean", "1.running_var", "1.num_batches_tracked"};
    bool same = true;
    for (int i = 0; i < 3; i++) {
        accel_tensor *t = accel_module_get_tensor(m, names[i]);
        same &= t && agree(accel_reshape(t, ACCEL_SHAPE(accel_numel(t))));
    }
    return same;
}

/* A forward of the model on rank-dependent data (its mean moves the stats). */
static accel_tensor *forward(accel_module *m, int step) {
    accel_tensor *x = accel_full(ACCEL_F32, ACCEL_SHAPE(4, 3, 2, 2), 1.0 + R + step);
    accel_tensor *noise = accel_empty(ACCEL_F32, ACCEL_SHAPE(4, 3, 2, 2));
    accel_rng g;
    accel_rng_init(&g, 10 + (uint64_t)R * 7 + (uint64_t)step);
    accel_rng_normal_(&g, noise, 0.0, 1.0);
    return accel_module_call(m, accel_to_device(accel_add(x, noise), accel_accelerator_device(A)));
}

static void test_buffers_follow_rank0(void) {
    accel_module *m = accel_sequential_new(
        2, (accel_module *[]){accel_conv2d_new(3, 3, (int64_t[]){1, 1}, NULL, NULL, NULL, 1, true, ACCEL_CPU_DEVICE, ACCEL_F32),
                              accel_batch_norm2d_new(3, 1e-5, 0.5, true, true, ACCEL_CPU_DEVICE, ACCEL_F32)});
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_SGD, 0.01);
    accel_optimizer *opt = accel_optimizer_new_module(ACCEL_OPTIM_SGD, m, &h);
    CHECK(m && opt && accel_accelerator_prepare_model(A, m) == ACCEL_OK && accel_accelerator_prepare_optimizer(A, opt) == ACCEL_OK);
    accel_module_train(m, true);
    accel_tensor *rm = accel_module_get_tensor(m, "1.running_mean");
    CHECK(stats_agree(m)); /* prepare broadcast them */
    /* a training step: it starts from rank 0's buffers (a count set apart
     * on every rank becomes rank 0's, in the same message as the f32
     * stats), then each rank's own batch moves its stats */
    accel_tensor *count = accel_module_get_tensor(m, "1.num_batches_tracked");
    CHECK(count && accel_tensor_from_host(count, (int64_t[]){7 + 3 * R}) == ACCEL_OK);
    accel_tensor *y = forward(m, 0);
    CHECK(y && accel_accelerator_backward(A, accel_mean_all(y)) == ACCEL_OK && accel_optimizer_step(opt) == ACCEL_OK);
    accel_optimizer_zero_grad(opt);
    CHECK(stats_agree(m) == (N == 1));
    CHECK(count && accel_item(count) == 8);
    accel_step_reset();
    /* eval under no_grad: the first forward syncs (the last one had
     * gradients), and eval leaves them as they are: all ranks alike */
    accel_module_train(m, false);
    bool prev = accel_set_grad_enabled(false);
    CHECK(forward(m, 1) != NULL);
    CHECK(stats_agree(m));
    accel_step_reset();
    /* the next forward after one under no_grad is not synced: a change on
     * rank 1 stays */
    float v = 100.0f + (float)R;
    CHECK(accel_tensor_from_host(rm, (float[]){v, v, v}) == ACCEL_OK);
    CHECK(forward(m, 2) != NULL);
    CHECK(accel_item(accel_slice(rm, 0, 0, 1, 1)) == v);
    accel_set_grad_enabled(prev);
    accel_step_reset();
    /* training under no_sync: no sync before it (the last forward had none
     * to ask for), none before the next either */
    accel_module_train(m, true);
    CHECK(accel_accelerator_no_sync_begin(A, m) == ACCEL_OK);
    y = forward(m, 3);
    CHECK(y && accel_accelerator_backward(A, accel_mean_all(y)) == ACCEL_OK);
    CHECK(stats_agree(m) == (N == 1));
    accel_step_reset();
    /* (in eval mode, so that the forward's own update keeps off the
     * marker: only a sync could change it) */
    CHECK(accel_tensor_from_host(rm, (float[]){v, v, v}) == ACCEL_OK);
    accel_module_train(m, false);
    y = forward(m, 4);
    CHECK(y && accel_accelerator_backward(A, accel_mean_all(y)) == ACCEL_OK);
    CHECK(accel_item(accel_slice(rm, 0, 0, 1, 1)) == v);
    accel_module_train(m, true);
    CHECK(accel_accelerator_no_sync_end(A, m) == ACCEL_OK);
    accel_step_reset();
    /* out of no_sync a forward with gradients asks for the sync: the one
     * after it starts from rank 0's (then moves by its own batch: eval
     * under no_grad shows the synced values) */
    y = forward(m, 5);
    CHECK(y && accel_accelerator_backward(A, accel_mean_all(y)) == ACCEL_OK);
    accel_optimizer_zero_grad(opt);
    accel_step_reset();
    accel_module_train(m, false);
    prev = accel_set_grad_enabled(false);
    CHECK(forward(m, 6) != NULL && stats_agree(m));
    accel_set_grad_enabled(prev);
    CHECK_MSG(accel_accelerator_clear(A) == ACCEL_OK, "%s", accel_last_error());
    accel_optimizer_free(opt);
    accel_module_free(m);
    accel_step_reset();
}

int main(void) {
    A = accel_accelerator_new(NULL);
    if (!A) {
        fprintf(stderr, "%s\n", accel_last_error());
        return 1;
    }
    N = accel_accelerator_num_processes(A);
    R = accel_accelerator_process_index(A);
    RUN(test_buffers_follow_rank0);
    accel_accelerator_free(A);
    accel_thread_cleanup();
    return check_summary();
}
