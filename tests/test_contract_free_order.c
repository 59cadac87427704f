/* Lifetimes (docs/contract.md): every order of freeing an accelerator and the
 * model, optimizer, data loader and scheduler it prepared, and a dispatched
 * model (its accel_dispatched and its module, both orders), after a training
 * step and an offloaded forward. Plain DDP, bf16 (a forward hook on the model)
 * and ZeRO-2 (the optimizer re-targeted to a shard) take turns. Meant for
 * ASan, on 1 process and under `accel launch --num_processes 2`. */
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "accel/accel.h"
#include "accel/accelerator.h"
#include "accel/autograd.h"
#include "accel/bigmodel.h"
#include "accel/dist.h"
#include "accel/io.h"
#include "check.h"

enum { ACC, MODEL, OPT, LOADER, SCHED, DISPATCHED, N_OBJECTS };

static char g_dir[64];
static accel_dataset *g_ds;

static accel_module *mlp(void) {
    accel_module *l[3] = {accel_linear_new(4, 8, true, ACCEL_CPU_DEVICE, ACCEL_F32), accel_relu_module_new(),
                          accel_linear_new(8, 1, true, ACCEL_CPU_DEVICE, ACCEL_F32)};
    return accel_sequential_new(3, l);
}

typedef struct objects {
    accel_accelerator *acc;
    accel_module *model, *dmodel;
    accel_optimizer *opt;
    accel_dataloader *dl;
    accel_lr_scheduler *sched;
    accel_dispatched *d;
} objects;

static accel_accelerator *accelerator(int variant) {
    accel_accelerator_opts o = {0};
    if (variant == 1) o.mixed_precision = "bf16";
    if (variant == 2) o.zero_stage = 2;
    else o.zero_stage = -1;
    return accel_accelerator_new(&o);
}

/* Everything made, prepared and used once: a training step and a forward of
 * the dispatched model with its last layer on disk. */
static void make(objects *ob, int variant) {
    ob->acc = accelerator(variant);
    ob->model = mlp();
    accel_optim_hparams h = {.lr = 0.1};
    ob->opt = accel_optimizer_new_module(ACCEL_OPTIM_SGD, ob->model, &h);
    ob->dl = accel_dataloader_new(g_ds, &(accel_dataloader_opts){.batch_size = 2});
    ob->sched = accel_lr_scheduler_new(ob->opt, ACCEL_SCHED_LINEAR, 1, 10);
    CHECK(accel_accelerator_prepare(ob->acc, ob->model, ob->opt, ob->dl, ob->sched) == ACCEL_OK);
    accel_batch b;
    CHECK(accel_dataloader_next(ob->dl, &b));
    accel_tensor *loss = accel_mse_loss(accel_module_call(ob->model, b.fields[0]), b.fields[1]);
    CHECK(accel_accelerator_backward(ob->acc, loss) == ACCEL_OK);
    CHECK(accel_accelerator_optimizer_step(ob->acc, ob->opt) == ACCEL_OK);
    accel_accelerator_scheduler_step(ob->acc, ob->sched);
    accel_step_reset();

    accel_init_empty_weights_begin();
    ob->dmodel = mlp();
    accel_init_empty_weights_end();
    accel_device_map *map = accel_device_map_parse("0:cpu,2:disk");
    ob->d = accel_load_checkpoint_and_dispatch(ob->dmodel, g_dir, map, NULL, NULL, NULL);
    accel_device_map_free(map);
    CHECK_MSG(ob->d != NULL, "%s", accel_last_error());
    bool was = accel_set_grad_enabled(false);
    CHECK(accel_module_call(ob->dmodel, accel_zeros(ACCEL_F32, ACCEL_SHAPE(2, 4))) != NULL);
    accel_set_grad_enabled(was);
    accel_step_reset();
}

/* dispatched_first: which half of the dispatched model goes first. */
static void free_one(objects *ob, int which, bool dispatched_first) {
    switch (which) {
    case ACC: accel_accelerator_free(ob->acc); break;
    case MODEL: accel_module_free(ob->model); break;
    case OPT: accel_optimizer_free(ob->opt); break;
    case LOADER: accel_dataloader_free(ob->dl); break;
    case SCHED: accel_lr_scheduler_free(ob->sched); break;
    case DISPATCHED:
        if (dispatched_first) accel_dispatched_free(ob->d);
        accel_module_free(ob->dmodel);
        if (!dispatched_first) accel_dispatched_free(ob->d);
        break;
    }
}

/* Heap's algorithm: every permutation of order[0..n). */
static int permute(int *order, int n, int k, int *count, int variant_base) {
    if (k == 1) {
        for (int half = 0; half < 2; half++) {
            int variant = (*count + variant_base) % 3;
            objects ob;
            make(&ob, variant);
            for (int i = 0; i < n; i++) free_one(&ob, order[i], half == 0);
            CHECK_MSG(accel_last_status() == ACCEL_OK, "order %d%d%d%d%d%d: %s", order[0], order[1], order[2],
                      order[3], order[4], order[5], accel_last_error());
            accel_clear_error();
            (*count)++;
        }
        return *count;
    }
    for (int i = 0; i < k; i++) {
        permute(order, n, k - 1, count, variant_base);
        int j = k % 2 ? 0 : i;
        int t = order[j];
        order[j] = order[k - 1];
        order[k - 1] = t;
    }
    return *count;
}

static void test_every_free_order(void) {
    int order[N_OBJECTS];
    for (int i = 0; i < N_OBJECTS; i++) order[i] = i;
    int count = 0;
    permute(order, N_OBJECTS, N_OBJECTS, &count, 0);
    CHECK(count == 720 * 2);
}

/* An optimizer made over a model (accel_optimizer_new_module) outlives it:
 * every call that would read the freed parameters refuses, naming why (a
 * step wrote freed memory), on its own and through the accelerator that
 * prepared both, under each variant (ZeRO-2's shards given back first); the
 * rest is then freed as usual. */
static void test_optimizer_outliving_its_model(void) {
    for (int variant = 0; variant < 3; variant++) {
        objects ob;
        make(&ob, variant);
        accel_module_free(ob.model);
        CHECK(accel_optimizer_step(ob.opt) == ACCEL_ERR_STATE);
        CHECK_MSG(strstr(accel_last_error(), "accel_optimizer_step: the optimizer's model was freed before it"),
                  "%s", accel_last_error());
        CHECK(accel_accelerator_optimizer_step(ob.acc, ob.opt) == ACCEL_ERR_STATE);
        CHECK(accel_accelerator_zero_grad(ob.acc, ob.opt) == ACCEL_ERR_STATE);
        CHECK(accel_optimizer_zero_grad(ob.opt) == ACCEL_ERR_STATE);
        CHECK(isnan(accel_optimizer_clip_grad_norm(ob.opt, 1.0, 2.0)));
        accel_named_state *st = NULL;
        CHECK(accel_optimizer_state(ob.opt, &st) == -1 && st == NULL);
        CHECK(accel_optimizer_load_state(ob.opt, 0, NULL) == ACCEL_ERR_STATE);
        CHECK(accel_optimizer_segment_param(ob.opt, 0, NULL) == NULL);
        accel_tensor *p = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(2), ACCEL_CPU_DEVICE);
        CHECK(accel_optimizer_add_params(ob.opt, 1, &p, NULL) == -1);
        CHECK_MSG(strstr(accel_last_error(), "accel_optimizer_add_params: the optimizer's model was freed"), "%s",
                  accel_last_error());
        accel_tensor_free(p);
        /* what reads no parameter still works: the scheduler sets the lr */
        CHECK(accel_accelerator_scheduler_step(ob.acc, ob.sched) == ACCEL_OK);
        CHECK(accel_optimizer_get_lr(ob.opt, 0) > 0.0);
        accel_clear_error();
        accel_lr_scheduler_free(ob.sched);
        accel_optimizer_free(ob.opt);
        accel_dataloader_free(ob.dl);
        accel_accelerator_free(ob.acc);
        accel_dispatched_free(ob.d);
        accel_module_free(ob.dmodel);
        CHECK_MSG(accel_last_status() == ACCEL_OK, "%s", accel_last_error());
    }
}

/* The optimizer made after its model was prepared (docs/parallelism.md's
 * order under ZeRO), the model freed first: the accelerator un-prepares the
 * model while the optimizer is still usable, so a ZeRO optimizer's state is
 * consolidated without a word (the optimizer's link was newer, told first:
 * "could not be consolidated" was printed on every rank), and the
 * accelerator takes another model (its loop over the prepared optimizers
 * refused, naming accel_accelerator_prepare_optimizer). */
static void test_optimizer_made_after_prepare(void) {
    for (int variant = 0; variant < 3; variant++) {
        accel_accelerator *acc = accelerator(variant);
        accel_module *model = mlp();
        CHECK(accel_accelerator_prepare_model(acc, model) == ACCEL_OK);
        accel_optim_hparams h = {.lr = 0.1};
        accel_optimizer *opt = accel_optimizer_new_module(ACCEL_OPTIM_ADAMW, model, &h);
        CHECK(accel_accelerator_prepare_optimizer(acc, opt) == ACCEL_OK);
        accel_tensor *x = accel_ones(ACCEL_F32, ACCEL_SHAPE(2, 4));
        CHECK(accel_accelerator_backward(acc, accel_mean(accel_module_call(model, x), 0, NULL, false)) == ACCEL_OK);
        CHECK(accel_accelerator_optimizer_step(acc, opt) == ACCEL_OK);
        accel_step_reset();
        char path[96];
        snprintf(path, sizeof path, "%s/stderr_%d", g_dir, variant);
        fflush(stderr);
        int saved = dup(2), fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        CHECK(saved >= 0 && fd >= 0 && dup2(fd, 2) == 2);
        accel_module_free(model);
        fflush(stderr);
        dup2(saved, 2);
        close(saved), close(fd);
        char said[512] = "";
        FILE *f = fopen(path, "r");
        size_t n = f ? fread(said, 1, sizeof said - 1, f) : 0;
        said[n] = 0;
        if (f) fclose(f);
        CHECK_MSG(n == 0, "variant %d: freeing the model said: %s", variant, said);
        CHECK(accel_optimizer_step(opt) == ACCEL_ERR_STATE);
        accel_module *other = mlp();
        CHECK_MSG(accel_accelerator_prepare_model(acc, other) == ACCEL_OK, "variant %d: %s", variant,
                  accel_last_error());
        CHECK(accel_accelerator_prepare_optimizer(acc, opt) == ACCEL_ERR_STATE); /* gone: refused by name */
        CHECK_STR_CONTAINS(accel_last_error(), "accel_accelerator_prepare_optimizer: the optimizer's model was freed");
        accel_clear_error();
        accel_accelerator_free(acc);
        accel_optimizer_free(opt);
        accel_module_free(other);
    }
}

/* accel_module_flatten's buffers and their module, both orders. */
static void test_flat_params_either_order(void) {
    for (int module_first = 0; module_first < 2; module_first++) {
        accel_module *m = mlp();
        accel_flat_params *fp = accel_module_flatten(m, 16, 1);
        CHECK(fp != NULL);
        if (module_first) accel_module_free(m);
        accel_flat_params_free(fp);
        if (!module_first) {
            CHECK(accel_module_call(m, accel_zeros(ACCEL_F32, ACCEL_SHAPE(1, 4))) != NULL); /* whole again */
            accel_step_reset();
            accel_module_free(m);
        }
    }
}

static void save_checkpoint(void) {
    accel_manual_seed(7);
    accel_module *m = mlp();
    CHECK(accel_save_module(g_dir, m, 1 << 30) == ACCEL_OK);
    accel_module_free(m);
}

static accel_dataset *dataset(void) {
    float x[8 * 4], y[8];
    for (int i = 0; i < 8; i++) {
        for (int j = 0; j < 4; j++) x[i * 4 + j] = (float)((i + j) % 5) / 5.0f;
        y[i] = (float)(i % 3);
    }
    accel_tensor *fields[2] = {accel_from_floats(ACCEL_SHAPE(8, 4), x), accel_from_floats(ACCEL_SHAPE(8, 1), y)};
    accel_dataset *ds = accel_tensor_dataset_new(2, fields);
    accel_step_reset();
    return ds;
}

int main(void) {
    /* The test's own reference to the process group: the 1440 accelerators
     * below share it, so none has to rendezvous again. */
    if (accel_dist_init() != ACCEL_OK) {
        fprintf(stderr, "%s\n", accel_last_error());
        return 1;
    }
    snprintf(g_dir, sizeof g_dir, "/tmp/accel_free_order_%d_XXXXXX", accel_dist_rank());
    if (!mkdtemp(g_dir)) return 1;
    save_checkpoint();
    g_ds = dataset();
    RUN(test_every_free_order);
    RUN(test_flat_params_either_order);
    RUN(test_optimizer_outliving_its_model);
    RUN(test_optimizer_made_after_prepare);
    accel_dataset_free(g_ds);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    CHECK(system(cmd) == 0);
    accel_dist_finalize();
    accel_thread_cleanup();
    return check_summary();
}
