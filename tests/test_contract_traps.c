/* The traps of issue #10: habits a C programmer (or a PyTorch + Accelerate
 * user) brings that used to corrupt memory or silently train wrong. Runs as
 * one process and under `accel launch --num_processes 2`, plain and under ASan. */
#include <unistd.h>

#include "accel/accel.h"
#include "accel/accelerator.h"
#include "accel/dist.h"
#include "check.h"

static int N, R;

static accel_module *mlp(void) {
    accel_module *l[3] = {accel_linear_new(4, 8, true, ACCEL_CPU_DEVICE, ACCEL_F32), accel_relu_module_new(),
                          accel_linear_new(8, 1, true, ACCEL_CPU_DEVICE, ACCEL_F32)};
    return accel_sequential_new(3, l);
}

static accel_optimizer *sgd(accel_module *m) {
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_SGD, 0.1);
    return accel_optimizer_new_module(ACCEL_OPTIM_SGD, m, &h);
}

/* n samples of 4 features and a target; sample i is recognisable by x[i][0] = i. */
static accel_dataset *dataset(int64_t n) {
    accel_tensor *x = accel_tensor_new(ACCEL_F32, 2, (int64_t[]){n, 4}, ACCEL_CPU_DEVICE);
    accel_tensor *y = accel_tensor_new(ACCEL_F32, 2, (int64_t[]){n, 1}, ACCEL_CPU_DEVICE);
    for (int64_t i = 0; i < n; i++) {
        float *xi = (float *)x->data + i * 4;
        xi[0] = (float)i;
        xi[1] = (float)(i % 3) - 1.0f;
        xi[2] = 0.5f;
        xi[3] = -0.25f * (float)(i % 5);
        ((float *)y->data)[i] = 0.1f * (float)(i % 7);
    }
    accel_dataset *ds = accel_tensor_dataset_new(2, (accel_tensor *[]){x, y});
    accel_tensor_free(x);
    accel_tensor_free(y);
    return ds;
}

static accel_dataloader *loader(accel_dataset *ds, int64_t batch) {
    accel_dataloader_opts o = accel_dataloader_opts_default();
    o.batch_size = batch;
    return accel_dataloader_new(ds, &o);
}

/* One epoch of training; features are scaled so the loss stays small. */
static void train_epoch(accel_accelerator *acc, accel_module *model, accel_optimizer *opt, accel_dataloader *dl) {
    accel_batch b;
    while (accel_dataloader_next(dl, &b)) {
        accel_tensor *x = accel_mul_scalar(b.fields[0], 0.01);
        accel_tensor *loss = accel_mse_loss(accel_module_call(model, x), b.fields[1]);
        CHECK_MSG(loss != NULL, "%s", accel_last_error());
        CHECK(accel_accelerator_backward(acc, loss) == ACCEL_OK);
        CHECK(accel_accelerator_optimizer_step(acc, opt) == ACCEL_OK);
        accel_accelerator_zero_grad(acc, opt);
        accel_step_reset();
    }
}

/* The largest difference between this rank's parameters and rank 0's. */
static double param_spread(accel_accelerator *acc, accel_module *m) {
    accel_tensor **ps;
    int n = accel_module_parameters(m, &ps);
    double d = 0;
    for (int i = 0; i < n; i++) {
        accel_tensor *mine = accel_alias(ps[i]);
        accel_tensor *r0 = accel_accelerator_broadcast(acc, mine, 0);
        for (int64_t k = 0; r0 && k < accel_numel(r0); k++) {
            double e = fabs(((float *)r0->data)[k] - ((float *)ps[i]->data)[k]);
            d = e > d ? e : d;
        }
    }
    accel_free(ps);
    accel_step_reset();
    return d;
}

/* Trap 1: freeing in creation order (optimizer, model, loader, then the
 * accelerator) was a heap use-after-free in accel_flat_params_free. */
static void test_free_in_creation_order(void) {
    accel_accelerator *acc = accel_accelerator_new(NULL);
    accel_module *model = mlp();
    accel_optimizer *opt = sgd(model);
    accel_dataset *ds = dataset(16);
    accel_dataloader *dl = loader(ds, 4);
    CHECK(accel_accelerator_prepare(acc, model, opt, dl, NULL) == ACCEL_OK);
    train_epoch(acc, model, opt, dl);
    accel_optimizer_free(opt);
    accel_module_free(model);
    accel_dataloader_free(dl);
    accel_dataset_free(ds);
    /* The accelerator forgot what was freed: it still works and frees cleanly. */
    CHECK(accel_accelerator_wait_for_everyone(acc) == ACCEL_OK);
    accel_accelerator_free(acc);
}

/* Trap 2: two accelerators in one process; freeing the first tore down the
 * process group the second was using. */
static void test_two_accelerators(void) {
    accel_accelerator *a = accel_accelerator_new(NULL), *b = accel_accelerator_new(NULL);
    CHECK(a && b);
    accel_module *ma = mlp(), *mb = mlp();
    accel_optimizer *oa = sgd(ma), *ob = sgd(mb);
    accel_dataset *ds = dataset(16);
    accel_dataloader *da = loader(ds, 4), *db = loader(ds, 4);
    CHECK(accel_accelerator_prepare(a, ma, oa, da, NULL) == ACCEL_OK);
    CHECK(accel_accelerator_prepare(b, mb, ob, db, NULL) == ACCEL_OK);
    accel_accelerator_free(a);
    CHECK(accel_accelerator_num_processes(b) == N);
    train_epoch(b, mb, ob, db);
    CHECK(param_spread(b, mb) == 0.0);
    accel_accelerator_free(b);
    accel_optimizer_free(oa);
    accel_optimizer_free(ob);
    accel_module_free(ma);
    accel_module_free(mb);
    accel_dataloader_free(da);
    accel_dataloader_free(db);
    accel_dataset_free(ds);
}

/* Trap 3: designated initialisers. {.mixed_precision = "fp16"} gave loss
 * scale 0 (every step skipped, status OK) and turned three true-by-default
 * options false. A zeroed struct now means every default. */
static void test_zero_options_are_defaults(void) {
    accel_accelerator_opts o = {.mixed_precision = "fp16"};
    accel_accelerator *acc = accel_accelerator_new(&o);
    CHECK(acc != NULL);
    CHECK(accel_accelerator_loss_scale(acc) == 65536.0);
    accel_module *model = mlp();
    accel_optimizer *opt = sgd(model);
    accel_dataset *ds = dataset(16);
    accel_dataloader *dl = loader(ds, 4);
    CHECK(accel_accelerator_prepare(acc, model, opt, dl, NULL) == ACCEL_OK);
    train_epoch(acc, model, opt, dl);
    CHECK(!accel_accelerator_optimizer_step_was_skipped(acc));
    CHECK(accel_optimizer_step_count(opt) == 4 / N + (4 % N != 0));
    accel_accelerator_free(acc);
    accel_optimizer_free(opt);
    accel_module_free(model);
    accel_dataloader_free(dl);

    /* even_batches (true by default): 5 samples in batches of 2 on N ranks
     * give every rank the same number of batches. */
    accel_accelerator_opts z = {0};
    acc = accel_accelerator_new(&z);
    accel_dataset *five = dataset(5);
    dl = loader(five, 2);
    CHECK(accel_accelerator_prepare(acc, NULL, NULL, dl, NULL) == ACCEL_OK);
    int64_t len = accel_dataloader_len(dl);
    int64_t lens[8] = {0};
    accel_tensor *mine = accel_full(ACCEL_I64, ACCEL_SHAPE(1), (double)len);
    accel_tensor *all = accel_accelerator_gather(acc, mine);
    CHECK(all != NULL);
    for (int r = 0; all && r < N; r++) lens[r] = ((int64_t *)all->data)[r];
    for (int r = 1; r < N; r++) CHECK(lens[r] == lens[0]);
    accel_step_reset();

    /* sync_with_dataloader (true by default): the loader's last batch syncs
     * even when the accumulation count is not reached. */
    accel_accelerator_set_gradient_accumulation_steps(acc, 100);
    accel_batch b;
    bool synced_at_end = false;
    while (accel_dataloader_next(dl, &b)) {
        accel_accelerator_accumulate(acc);
        synced_at_end = accel_accelerator_sync_gradients(acc);
        accel_step_reset();
    }
    CHECK(synced_at_end);
    accel_accelerator_free(acc);
    accel_dataloader_free(dl);
    accel_dataset_free(five);

    /* step_scheduler_with_optimizer (true by default): no scheduler step on a
     * micro-batch that does not step the optimizer. */
    acc = accel_accelerator_new(&z);
    model = mlp();
    opt = sgd(model);
    accel_lr_scheduler *s = accel_lr_scheduler_new(opt, ACCEL_SCHED_LINEAR, 0, 1000);
    CHECK(accel_accelerator_prepare(acc, model, opt, NULL, s) == ACCEL_OK);
    accel_accelerator_set_gradient_accumulation_steps(acc, 4);
    double lr0 = accel_optimizer_get_lr(opt, 0);
    accel_accelerator_accumulate(acc); /* micro-batch 1 of 4: no sync */
    accel_accelerator_scheduler_step(acc, s);
    CHECK(accel_optimizer_get_lr(opt, 0) == lr0);
    accel_accelerator_free(acc);
    accel_lr_scheduler_free(s);
    accel_optimizer_free(opt);
    accel_module_free(model);
    accel_dataset_free(ds);
}

/* Trap 4: a failure the caller handled (no checkpoint yet on a fresh run)
 * made the next data-loader loop yield nothing and later errors report the
 * stale message. */
static void test_handled_failure_leaves_nothing(void) {
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/accel_contract_fresh_%d", (int)getpid());
    accel_accelerator *acc = accel_accelerator_new(NULL);
    accel_dataset *ds = dataset(8);
    accel_dataloader *dl = loader(ds, 2);
    CHECK(accel_accelerator_prepare(acc, NULL, NULL, dl, NULL) == ACCEL_OK);
    CHECK(accel_accelerator_load_state(acc, dir, NULL) != ACCEL_OK); /* handled: start from scratch */
    accel_batch b;
    int batches = 0;
    while (accel_dataloader_next(dl, &b)) {
        batches++;
        accel_step_reset();
    }
    CHECK(batches == 4 / N);
    CHECK(accel_last_status() == ACCEL_OK); /* the loop ended, it did not fail */
    /* A later, unrelated failure reports its own message. */
    accel_tensor *a = accel_zeros(ACCEL_F32, ACCEL_SHAPE(2, 3)), *c = accel_zeros(ACCEL_F32, ACCEL_SHAPE(2, 3));
    CHECK(accel_matmul(a, c) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "matmul");
    CHECK(strstr(accel_last_error(), dir) == NULL);
    accel_step_reset();
    accel_accelerator_free(acc);
    accel_dataloader_free(dl);
    accel_dataset_free(ds);
}

/* Trap 5: unwrap_model is Accelerate's plain accessor (called at every
 * checkpoint); it used to un-prepare the model, after which the ranks'
 * weights diverged without an error. */
static void test_unwrap_model_is_an_accessor(void) {
    accel_accelerator *acc = accel_accelerator_new(NULL);
    accel_module *model = mlp();
    accel_optimizer *opt = sgd(model);
    accel_dataset *ds = dataset(16);
    accel_dataloader *dl = loader(ds, 2);
    CHECK(accel_accelerator_prepare(acc, model, opt, dl, NULL) == ACCEL_OK);
    train_epoch(acc, model, opt, dl);
    CHECK(accel_accelerator_unwrap_model(acc, model) == model);
    train_epoch(acc, model, opt, dl);
    CHECK(param_spread(acc, model) == 0.0);
    accel_accelerator_free(acc);
    accel_optimizer_free(opt);
    accel_module_free(model);
    accel_dataloader_free(dl);
    accel_dataset_free(ds);
}

/* Trap 6: prepare takes every object of a script, eval loader included; an
 * eval loader left out used to give every rank the whole eval set (202
 * gathered samples for 101). */
static void test_prepare_many_objects(void) {
    accel_accelerator *acc = accel_accelerator_new(NULL);
    accel_module *model = mlp();
    accel_optimizer *opt = sgd(model);
    accel_dataset *train = dataset(16), *eval = dataset(101);
    accel_dataloader *tdl = loader(train, 4), *edl = loader(eval, 8);
    accel_lr_scheduler *s = accel_lr_scheduler_new(opt, ACCEL_SCHED_CONSTANT, 0, 0);
    CHECK(accel_accelerator_prepare(acc, model, opt, tdl, edl, s) == ACCEL_OK);
    accel_batch b;
    int64_t seen = 0;
    while (accel_dataloader_next(edl, &b)) {
        accel_tensor *g = accel_accelerator_gather_for_metrics(acc, b.fields[0]);
        CHECK(g != NULL);
        if (g) seen += g->shape[0];
        accel_step_reset();
    }
    CHECK(seen == 101);
    accel_accelerator_free(acc);
    accel_lr_scheduler_free(s);
    accel_optimizer_free(opt);
    accel_module_free(model);
    accel_dataloader_free(tdl);
    accel_dataloader_free(edl);
    accel_dataset_free(train);
    accel_dataset_free(eval);
}

/* No silent void on misuse: what used to return nothing (and do nothing)
 * reports the misuse. zero_grad of an optimizer that was never prepared left
 * the gradients accumulating forever. */
static void test_misuse_is_reported(void) {
    accel_accelerator *acc = accel_accelerator_new(NULL);
    accel_module *model = mlp();
    accel_optimizer *opt = sgd(model);
    accel_lr_scheduler *s = accel_lr_scheduler_new(opt, ACCEL_SCHED_CONSTANT, 0, 0);
    accel_dataset *ds = dataset(4);
    accel_dataloader *dl = loader(ds, 2);
    CHECK(accel_accelerator_zero_grad(acc, opt) == ACCEL_ERR_STATE);
    CHECK_STR_CONTAINS(accel_last_error(), "not prepared");
    CHECK(accel_accelerator_scheduler_step(acc, s) == ACCEL_ERR_STATE);
    CHECK(accel_accelerator_no_sync_begin(acc, model) == ACCEL_ERR_STATE);
    CHECK(accel_accelerator_set_gradient_accumulation_steps(acc, 0) == ACCEL_ERR_INVALID_ARG);
    CHECK(accel_accelerator_gradient_accumulation_steps(acc) == 1);
    CHECK(accel_dataloader_skip_first_batches(dl, -1) == ACCEL_ERR_INVALID_ARG);
    CHECK(accel_dataloader_set_epoch(dl, -2) == ACCEL_ERR_INVALID_ARG);
    CHECK(accel_optimizer_set_lr(opt, 5, 0.1) == ACCEL_ERR_INVALID_ARG);
    CHECK(accel_accelerator_prepare(acc, model, opt, s) == ACCEL_OK);
    CHECK(accel_accelerator_zero_grad(acc, opt) == ACCEL_OK);
    CHECK(accel_accelerator_scheduler_step(acc, s) == ACCEL_OK);
    CHECK(accel_accelerator_no_sync_begin(acc, model) == ACCEL_OK);
    CHECK(accel_accelerator_no_sync_end(acc, model) == ACCEL_OK);
    /* no_sync is a context: an end without its begin is refused (it returned
     * OK); contexts nest, so two begins take two ends */
    CHECK(accel_accelerator_no_sync_end(acc, model) == ACCEL_ERR_STATE);
    CHECK_STR_CONTAINS(accel_last_error(), "not inside no_sync");
    CHECK(accel_accelerator_no_sync_begin(acc, model) == ACCEL_OK);
    CHECK(accel_accelerator_no_sync_begin(acc, model) == ACCEL_OK);
    CHECK(accel_accelerator_no_sync_end(acc, model) == ACCEL_OK);
    CHECK(accel_accelerator_no_sync_end(acc, model) == ACCEL_OK);
    CHECK(accel_accelerator_no_sync_end(acc, model) == ACCEL_ERR_STATE);
    accel_clear_error();
    /* an object has one accelerator */
    accel_accelerator *other = accel_accelerator_new(NULL);
    CHECK(accel_accelerator_prepare(other, model) == ACCEL_ERR_STATE);
    CHECK_STR_CONTAINS(accel_last_error(), "another accelerator");
    accel_accelerator_free(other);
    accel_accelerator_free(acc);
    accel_lr_scheduler_free(s);
    accel_optimizer_free(opt);
    accel_module_free(model);
    accel_dataloader_free(dl);
    accel_dataset_free(ds);
    accel_clear_error();
}

/* Per-thread state is reset at well-defined points: a forward of a bf16
 * model that fails (wrong input width) used to leave the thread in bf16
 * autocast, so every later op on it silently ran in bf16. */
static void test_failed_forward_leaves_no_autocast(void) {
    accel_accelerator *acc = accel_accelerator_new(&(accel_accelerator_opts){.mixed_precision = "bf16"});
    accel_module *model = mlp();
    CHECK(accel_accelerator_prepare(acc, model) == ACCEL_OK);
    CHECK(accel_module_call(model, accel_zeros(ACCEL_F32, ACCEL_SHAPE(2, 5))) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "5");
    CHECK(accel_autocast_dtype() == ACCEL_F32);
    accel_tensor *y = accel_module_call(model, accel_zeros(ACCEL_F32, ACCEL_SHAPE(2, 4)));
    CHECK(y && y->dtype == ACCEL_F32);
    CHECK(accel_autocast_dtype() == ACCEL_F32);
    accel_step_reset();
    accel_module_free(model);
    accel_accelerator_free(acc);
}

/* argv[1], when given, runs only the test of that name. */
#define RUN_SELECTED(fn) \
    do { if (argc < 2 || !strcmp(argv[1], #fn)) RUN(fn); } while (0)

int main(int argc, char **argv) {
    N = accel_dist_world_size();
    R = accel_dist_rank();
    RUN_SELECTED(test_free_in_creation_order);
    RUN_SELECTED(test_two_accelerators);
    RUN_SELECTED(test_zero_options_are_defaults);
    RUN_SELECTED(test_handled_failure_leaves_nothing);
    RUN_SELECTED(test_unwrap_model_is_an_accessor);
    RUN_SELECTED(test_prepare_many_objects);
    RUN_SELECTED(test_misuse_is_reported);
    RUN_SELECTED(test_failed_forward_leaves_no_autocast);
    accel_thread_cleanup();
    return check_summary();
}
