/* Ownership misuse the library detects instead of reading freed memory
 * (docs/contract.md "Ownership and lifetimes"): a child module or a
 * parameter's .grad freed on its own, a dataset freed before its data
 * loader, a tracker added twice, a scheduler stepped after its optimizer was
 * freed, and every handle freed twice or used after its free. Meant for ASan:
 * before these checks each one was a use-after-free or a double free. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "accel/accel.h"
#include "accel/accelerator.h"
#include "check.h"
#include "test_files.h"

static accel_module *mlp(void) {
    accel_module *l[2] = {accel_linear_new(4, 8, true, ACCEL_CPU_DEVICE, ACCEL_F32),
                          accel_linear_new(8, 1, true, ACCEL_CPU_DEVICE, ACCEL_F32)};
    return accel_sequential_new(2, l);
}

static accel_dataset *dataset(void) {
    accel_tensor *x = accel_tensor_new(ACCEL_F32, 2, (int64_t[]){8, 4}, ACCEL_CPU_DEVICE);
    accel_tensor *y = accel_tensor_new(ACCEL_F32, 2, (int64_t[]){8, 1}, ACCEL_CPU_DEVICE);
    accel_fill_(x, 1.0);
    accel_fill_(y, 2.0);
    accel_dataset *ds = accel_tensor_dataset_new(2, (accel_tensor *[]){x, y});
    accel_tensor_free(x);
    accel_tensor_free(y);
    return ds;
}

static accel_status train_step(accel_module *m) {
    accel_tensor *loss = accel_mse_loss(accel_module_call(m, accel_ones(ACCEL_F32, ACCEL_SHAPE(2, 4))),
                                        accel_zeros(ACCEL_F32, ACCEL_SHAPE(2, 1)));
    accel_status st = accel_backward(loss);
    accel_step_reset();
    return st;
}

/* The C habit "free what you created" on a child that its parent owns. */
static void test_child_module_free_refused(void) {
    accel_module *l1 = accel_linear_new(4, 8, true, ACCEL_CPU_DEVICE, ACCEL_F32);
    accel_module *l2 = accel_linear_new(8, 1, true, ACCEL_CPU_DEVICE, ACCEL_F32);
    accel_module *model = accel_sequential_new(2, (accel_module *[]){l1, l2});
    accel_accelerator *acc = accel_accelerator_new(NULL);
    CHECK(accel_accelerator_prepare(acc, model) == ACCEL_OK);
    accel_module_free(l1);
    CHECK(accel_last_status() == ACCEL_ERR_STATE);
    CHECK_STR_CONTAINS(accel_last_error(), "is a child of Sequential");
    CHECK_STR_CONTAINS(accel_last_error(), "free the root");
    CHECK(train_step(model) == ACCEL_OK); /* the parent is whole */
    accel_accelerator_free(acc);
    accel_module_free(model);
}

/* accel_tensor_free(p->grad), the C spelling of p.grad = None, plain and
 * with the gradient a view into a prepared model's flat buffer. */
static void test_grad_free_refused(void) {
    for (int prepared = 0; prepared < 2; prepared++) {
        accel_accelerator *acc = prepared ? accel_accelerator_new(NULL) : NULL;
        accel_module *m = accel_linear_new(4, 1, true, ACCEL_CPU_DEVICE, ACCEL_F32);
        if (prepared) CHECK(accel_accelerator_prepare(acc, m) == ACCEL_OK);
        accel_tensor *w = accel_module_get_tensor(m, "weight");
        CHECK(train_step(m) == ACCEL_OK);
        accel_tensor *g = w->grad;
        accel_tensor_free(g);
        CHECK(accel_last_status() == ACCEL_ERR_STATE);
        CHECK_STR_CONTAINS(accel_last_error(), "accel_tensor_drop_grad");
        CHECK(w->grad == g && accel_tensor_check(g, "test", "grad"));
        CHECK(train_step(m) == ACCEL_OK);
        if (prepared) { /* a view into the flat gradient buffer, which DDP reduces: dropped, it left the sync */
            CHECK(accel_tensor_drop_grad(w) == ACCEL_ERR_STATE && w->grad == g);
            CHECK_STR_CONTAINS(accel_last_error(), "is a view into a prepared model's gradient buffer");
            accel_clear_error();
        } else {
            CHECK(accel_tensor_drop_grad(w) == ACCEL_OK && w->grad == NULL);
            CHECK(train_step(m) == ACCEL_OK && w->grad != NULL); /* a new one */
        }
        accel_accelerator_free(acc);
        accel_module_free(m);
    }
}

/* A dataset freed before its data loader (prepared or not): the loader
 * refuses what reads it and frees cleanly; the other order unlinks. */
static void test_dataset_freed_before_loader(void) {
    for (int prepared = 0; prepared < 2; prepared++) {
        accel_accelerator *acc = prepared ? accel_accelerator_new(NULL) : NULL;
        accel_dataset *ds = dataset();
        accel_dataloader *dl = accel_dataloader_new(ds, &(accel_dataloader_opts){.batch_size = 2});
        if (prepared) CHECK(accel_accelerator_prepare(acc, dl) == ACCEL_OK);
        accel_batch b;
        CHECK(accel_dataloader_next(dl, &b));
        accel_step_reset();
        accel_dataset_free(ds);
        CHECK(!accel_dataloader_next(dl, &b));
        CHECK(accel_last_status() == ACCEL_ERR_STATE);
        CHECK_STR_CONTAINS(accel_last_error(), "dataset was freed before it");
        CHECK(accel_dataloader_len(dl) == -1 && accel_last_status() == ACCEL_ERR_STATE);
        CHECK(accel_dataloader_remainder(dl) == -1 && accel_last_status() == ACCEL_ERR_STATE);
        CHECK(accel_dataloader_dataset(dl) == NULL && accel_last_status() == ACCEL_ERR_STATE);
        accel_accelerator_free(acc);
        accel_dataloader_free(dl);
    }
    accel_dataset *ds = dataset();
    accel_dataloader_free(accel_dataloader_new(ds, NULL));
    accel_dataset_free(ds); /* the freed loader's link is gone with it */
}

static int g_finishes;
static accel_status count_finish(void *ctx) {
    (void)ctx;
    g_finishes++;
    return ACCEL_OK;
}
static const accel_tracker_ops COUNTING = {.name = "counting", .finish = count_finish};

/* A tracker added twice, to one accelerator or to two, is finished once;
 * a failed add takes the tracker (a NULL accelerator finishes it). */
static void test_tracker_added_twice(void) {
    for (int two = 0; two < 2; two++) {
        g_finishes = 0;
        accel_accelerator *a = accel_accelerator_new(NULL), *b = two ? accel_accelerator_new(NULL) : a;
        accel_tracker *t = accel_tracker_new(&COUNTING, NULL);
        CHECK(accel_accelerator_add_tracker(a, t) == ACCEL_OK);
        CHECK(accel_accelerator_add_tracker(b, t) == ACCEL_ERR_STATE);
        CHECK_STR_CONTAINS(accel_last_error(), "tracker \"counting\" was already added");
        CHECK(accel_tracker_finish(t) == ACCEL_ERR_STATE && g_finishes == 0); /* the accelerator's to finish */
        CHECK_STR_CONTAINS(accel_last_error(), "was added to an accelerator");
        CHECK(accel_accelerator_end_training(a) == ACCEL_OK);
        if (two) accel_accelerator_free(b);
        accel_accelerator_free(a);
        CHECK(g_finishes == 1);
    }
    g_finishes = 0;
    CHECK(accel_accelerator_add_tracker(NULL, accel_tracker_new(&COUNTING, NULL)) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "accelerator is NULL");
    CHECK(g_finishes == 1);
    /* a log_with tracker init_trackers opened is its accelerator's too (it was finished twice) */
    char dir[] = "/tmp/accel_handles_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    accel_accelerator *a = accel_accelerator_new(&(accel_accelerator_opts){.log_with = "jsonl", .project_dir = dir});
    accel_accelerator *b = accel_accelerator_new(NULL);
    CHECK(a && b && accel_accelerator_init_trackers(a, "run", 0, NULL) == ACCEL_OK);
    accel_tracker *jsonl = accel_accelerator_get_tracker(a, "jsonl");
    CHECK(jsonl != NULL);
    CHECK(accel_accelerator_add_tracker(a, jsonl) == ACCEL_ERR_STATE);
    CHECK(accel_accelerator_add_tracker(b, jsonl) == ACCEL_ERR_STATE);
    CHECK_STR_CONTAINS(accel_last_error(), "tracker \"jsonl\" was already added");
    accel_clear_error();
    accel_accelerator_free(b);
    accel_accelerator_free(a);
    rm_rf(dir);
}

/* A scheduler whose optimizer was freed first: stepped directly or through
 * the accelerator that prepared both (accumulating: the step is not due). */
static void test_scheduler_of_freed_optimizer(void) {
    accel_accelerator *acc = accel_accelerator_new(&(accel_accelerator_opts){.gradient_accumulation_steps = 4});
    accel_module *m = mlp();
    accel_optimizer *opt = accel_optimizer_new_module(ACCEL_OPTIM_SGD, m, &(accel_optim_hparams){.lr = 0.1});
    accel_lr_scheduler *s = accel_lr_scheduler_new(opt, ACCEL_SCHED_LINEAR, 0, 10);
    CHECK(accel_accelerator_prepare(acc, m, opt, s) == ACCEL_OK);
    CHECK(accel_accelerator_accumulate(acc) == ACCEL_OK);
    accel_optimizer_free(opt);
    CHECK(accel_accelerator_scheduler_step(acc, s) == ACCEL_ERR_STATE);
    CHECK_STR_CONTAINS(accel_last_error(), "the scheduler's optimizer was freed before it");
    CHECK(accel_lr_scheduler_step(s) == ACCEL_ERR_STATE);
    CHECK(isnan(accel_lr_scheduler_get_lr(s, 0)) && accel_last_status() == ACCEL_ERR_STATE);
    accel_named_state *st = NULL;
    int n = accel_lr_scheduler_state(s, &st); /* its own numbers only: still readable */
    CHECK(n == 2);
    CHECK(accel_lr_scheduler_load_state(s, n, st) == ACCEL_ERR_STATE);
    accel_named_state_free(st, n);
    accel_lr_scheduler_free(s);
    accel_accelerator_free(acc);
    accel_module_free(m);
}

/* An allocator that keeps what is freed until released, so a handle freed
 * twice reads memory that is still the process's (no reuse, and ASan sees
 * no use after free): what the liveness stamps then catch. */
enum { HELD_MAX = 1 << 16 };
static void *g_held[HELD_MAX];
static int g_n_held;
static void *hold_alloc(void *ctx, size_t bytes, size_t align) {
    (void)ctx;
    void *p = NULL;
    return posix_memalign(&p, align < sizeof(void *) ? sizeof(void *) : align, bytes ? bytes : 1) ? NULL : p;
}
static void hold_free(void *ctx, void *p) {
    (void)ctx;
    if (g_n_held < HELD_MAX) g_held[g_n_held++] = p;
    else free(p);
}
static void release_held(void) {
    accel_set_allocator(NULL);
    while (g_n_held) free(g_held[--g_n_held]);
}

#define CHECK_DEAD(call, name)                                        \
    do {                                                              \
        call;                                                         \
        CHECK(accel_last_status() == ACCEL_ERR_STATE);                \
        CHECK_STR_CONTAINS(accel_last_error(), "the " name " is not a live one"); \
        accel_clear_error();                                          \
    } while (0)

static void test_handles_freed_twice(void) {
    accel_set_allocator(&(accel_allocator){hold_alloc, hold_free, NULL});
    accel_module *m = mlp();
    accel_optimizer *o = accel_optimizer_new(ACCEL_OPTIM_SGD);
    accel_optimizer *om = accel_optimizer_new_module(ACCEL_OPTIM_SGD, m, NULL);
    accel_lr_scheduler *s = accel_lr_scheduler_new(om, ACCEL_SCHED_CONSTANT, 0, 0);
    accel_accelerator *a = accel_accelerator_new(NULL);
    accel_dataset *ds = dataset();
    accel_dataloader *dl = accel_dataloader_new(ds, NULL);
    accel_lr_scheduler_free(s);
    CHECK_DEAD(accel_lr_scheduler_free(s), "scheduler");
    CHECK_DEAD(accel_lr_scheduler_step(s), "scheduler");
    accel_optimizer_free(om);
    CHECK_DEAD(accel_optimizer_free(om), "optimizer");
    CHECK_DEAD(accel_optimizer_step(om), "optimizer");
    CHECK_DEAD(CHECK(accel_optimizer_set_lr(om, 0, 0.5) == ACCEL_ERR_STATE), "optimizer");
    CHECK_DEAD(CHECK(accel_optimizer_num_groups(om) == 0), "optimizer");
    accel_optimizer_free(o);
    CHECK_DEAD(accel_optimizer_free(o), "optimizer");
    accel_module_free(m);
    CHECK_DEAD(accel_module_free(m), "module");
    CHECK_DEAD(CHECK(accel_module_call(m, accel_ones(ACCEL_F32, ACCEL_SHAPE(2, 4))) == NULL), "module");
    accel_accelerator_free(a);
    CHECK_DEAD(accel_accelerator_free(a), "accelerator");
    CHECK_DEAD(CHECK(accel_accelerator_num_processes(a) == 1), "accelerator");
    accel_dataloader_free(dl);
    CHECK_DEAD(accel_dataloader_free(dl), "data loader");
    CHECK_DEAD(CHECK(accel_dataloader_len(dl) == -1), "data loader");
    accel_dataset_free(ds);
    CHECK_DEAD(accel_dataset_free(ds), "dataset");
    CHECK_DEAD(CHECK(accel_dataset_num_fields(ds) == 0), "dataset");
    CHECK_DEAD(CHECK(accel_dataloader_new(ds, NULL) == NULL), "dataset");
    accel_step_reset();
    release_held();
}

/* A query given a NULL handle returns its neutral value and sets the error
 * naming itself (docs/contract.md's queries row): these returned the value
 * alone, or named another function ("accel_module_state_dict: ...") or a
 * param group. A tensor query (accel_numel(NULL)) stays silent: a chain's
 * NULL keeps its cause. */
#define NULL_QUERY(expr, neutral, fn)                                                                        \
    do {                                                                                                    \
        accel_clear_error();                                                                                \
        CHECK_MSG((expr) == (neutral) && accel_last_status() == ACCEL_ERR_INVALID_ARG, "%s: %s", #expr,     \
                  accel_last_error());                                                                      \
        CHECK_STR_CONTAINS(accel_last_error(), fn);                                                         \
        CHECK_STR_CONTAINS(accel_last_error(), "NULL");                                                     \
    } while (0)

static void test_null_handle_queries(void) {
    NULL_QUERY(accel_dataset_len(NULL), 0, "accel_dataset_len");
    NULL_QUERY(accel_dataset_num_fields(NULL), 0, "accel_dataset_num_fields");
    NULL_QUERY(accel_dataset_field(NULL, 0), NULL, "accel_dataset_field");
    NULL_QUERY(accel_dataloader_position(NULL), 0, "accel_dataloader_position");
    NULL_QUERY(accel_dataloader_active(NULL), false, "accel_dataloader_active");
    NULL_QUERY(accel_dataloader_end_of_dataloader(NULL), false, "accel_dataloader_end_of_dataloader");
    NULL_QUERY(accel_optimizer_hparams(NULL, 0), NULL, "accel_optimizer_hparams: optimizer");
    NULL_QUERY(isnan(accel_optimizer_get_lr(NULL, 0)), true, "accel_optimizer_get_lr: optimizer");
    NULL_QUERY(accel_accelerator_get_tracker(NULL, "jsonl"), NULL, "accel_accelerator_get_tracker");
    NULL_QUERY(accel_tracker_name(NULL), NULL, "accel_tracker_name");
    NULL_QUERY(accel_progress_count(NULL), 0, "accel_progress_count");
    NULL_QUERY(accel_module_num_params(NULL), -1, "accel_module_num_params: module");
    accel_tensor **ps = (accel_tensor **)&ps;
    NULL_QUERY(accel_module_parameters(NULL, &ps), -1, "accel_module_parameters: module");
    CHECK(ps == NULL);
    accel_dataset *ds = dataset();
    accel_clear_error();
    CHECK(accel_dataset_field(ds, 7) == NULL && accel_last_status() == ACCEL_ERR_INVALID_ARG); /* it said nothing */
    CHECK_STR_CONTAINS(accel_last_error(), "accel_dataset_field: no field 7 (the dataset has 2)");
    accel_dataset_free(ds);
    accel_clear_error();
}

int main(void) {
    RUN(test_child_module_free_refused);
    RUN(test_grad_free_refused);
    RUN(test_dataset_freed_before_loader);
    RUN(test_tracker_added_twice);
    RUN(test_scheduler_of_freed_optimizer);
    RUN(test_handles_freed_twice);
    RUN(test_null_handle_queries);
    accel_thread_cleanup();
    return check_summary();
}
