/* A module or tensor freed between a forward and the backward through it
 * (docs/contract.md): the backward that reaches it fails naming the op and
 * the tensor, instead of reading freed memory; a tensor the graph does not
 * read, or one freed after the backward, changes nothing; after the error
 * the thread trains on. Meant for ASan too (a read of freed memory is its
 * report); run plainly and under `accel launch --num_processes 2` (the
 * ZeRO-3 case's collectives). */
#include <math.h>
#include <string.h>

#include "accel/accel.h"
#include "accel/accelerator.h"
#include "accel/autograd.h"
#include "check.h"

static accel_tensor *input(void) {
    accel_tensor *x = accel_empty(ACCEL_F32, ACCEL_SHAPE(3, 4));
    accel_rng g;
    accel_rng_init(&g, 7);
    accel_rng_normal_(&g, x, 0.0, 1.0);
    return x;
}

static accel_module *mlp(bool checkpointed) {
    accel_module *l[3] = {accel_linear_new(4, 8, true, ACCEL_CPU_DEVICE, ACCEL_F32), accel_relu_module_new(),
                          accel_linear_new(8, 1, true, ACCEL_CPU_DEVICE, ACCEL_F32)};
    accel_module *m = accel_sequential_new(3, l);
    if (m && checkpointed) CHECK(accel_module_set_gradient_checkpointing(m, true) == ACCEL_OK);
    return m;
}

/* A fresh model trains: the thread is usable after the refused backward. */
static void trains_after(void) {
    accel_step_reset();
    accel_module *m = mlp(false);
    accel_tensor *loss = accel_mean_all(accel_module_call(m, input()));
    CHECK_MSG(loss && accel_backward(loss) == ACCEL_OK, "%s", accel_last_error());
    accel_tensor *w = accel_module_get_tensor(m, "0.weight");
    CHECK(w && w->grad && isfinite(accel_item(accel_sum_all(w->grad))));
    accel_module_free(m);
    accel_step_reset();
}

static void test_module_freed_before_backward(void) {
    for (int ck = 0; ck < 2; ck++) { /* plain, and checkpointed (its node replays the module's forward) */
        accel_module *m = mlp(ck);
        accel_tensor *loss = accel_mean_all(accel_module_call(m, input()));
        CHECK(loss != NULL);
        accel_module_free(m);
        CHECK(accel_backward(loss) == ACCEL_ERR_STATE);
        CHECK_STR_CONTAINS(accel_last_error(), "which was freed after its forward");
        CHECK_STR_CONTAINS(accel_last_error(), "weight"); /* the tensor, by name */
        CHECK(accel_backward(loss) == ACCEL_ERR_STATE); /* the graph is gone: refused again, no crash */
        trains_after();
    }
}

/* A frozen checkpointed block behind a trainable layer: its node has no
 * parameter to train, yet it replays the block, so freeing the block makes
 * the backward fail (it would replay a freed module). */
static void test_frozen_checkpointed_block_freed(void) {
    accel_module *first = accel_linear_new(4, 4, true, ACCEL_CPU_DEVICE, ACCEL_F32), *block = mlp(true);
    accel_tensor **ps;
    int np = accel_module_parameters(block, &ps);
    for (int i = 0; i < np; i++) CHECK(accel_requires_grad_(ps[i], false) == ACCEL_OK);
    accel_free(ps);
    accel_tensor *loss = accel_mean_all(accel_module_call(block, accel_module_call(first, input())));
    CHECK(loss != NULL);
    accel_module_free(block);
    CHECK(accel_backward(loss) == ACCEL_ERR_STATE);
    CHECK_STR_CONTAINS(accel_last_error(), "'checkpoint' of this graph reads");
    accel_module_free(first);
    trains_after();
}

/* A model prepared under ZeRO-3 (its units' backward hooks) freed before the
 * backward: refused, as the model's release says. */
static void test_zero3_model_freed(void) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.zero_stage = 3;
    accel_accelerator *acc = accel_accelerator_new(&o);
    accel_module *m = mlp(false);
    CHECK_MSG(acc && accel_accelerator_prepare_model(acc, m) == ACCEL_OK, "%s", accel_last_error());
    accel_tensor *loss = accel_mean_all(accel_module_call(m, input()));
    CHECK(loss != NULL);
    accel_module_free(m);
    CHECK(accel_backward(loss) == ACCEL_ERR_STATE);
    accel_accelerator_free(acc);
    trains_after();
}

/* One of two modules freed: the backward through the other alone runs. */
static void test_other_module_freed(void) {
    accel_module *a = mlp(false), *b = mlp(false);
    accel_tensor *x = input();
    accel_tensor *la = accel_mean_all(accel_module_call(a, x));
    accel_tensor *lb = accel_mean_all(accel_module_call(b, x));
    CHECK(la && lb);
    accel_module_free(b);
    CHECK_MSG(accel_backward(la) == ACCEL_OK, "%s", accel_last_error());
    accel_tensor *w = accel_module_get_tensor(a, "2.weight");
    CHECK(w && w->grad);
    accel_module_free(a);
    trains_after();
}

/* A persistent input the linear saved for its weight's gradient, freed. */
static void test_saved_input_freed(void) {
    accel_module *m = mlp(false);
    accel_tensor *x = accel_tensor_new(ACCEL_F32, 2, (int64_t[]){3, 4}, ACCEL_CPU_DEVICE);
    CHECK(x && accel_copy_(x, input()) == ACCEL_OK);
    accel_tensor *loss = accel_mean_all(accel_module_call(m, x));
    CHECK(loss != NULL);
    accel_tensor_free(x);
    CHECK(accel_backward(loss) == ACCEL_ERR_STATE);
    CHECK_STR_CONTAINS(accel_last_error(), "reads a tensor, which was freed after its forward");
    accel_module_free(m);
    trains_after();
}

/* Freed after the backward, or never on the tape: nothing to say. */
static void test_unrelated_frees(void) {
    accel_module *m = mlp(false);
    accel_tensor *other = accel_tensor_new(ACCEL_F32, 1, (int64_t[]){5}, ACCEL_CPU_DEVICE);
    accel_tensor *loss = accel_mean_all(accel_module_call(m, input()));
    accel_tensor_free(other);
    CHECK_MSG(loss && accel_backward(loss) == ACCEL_OK, "%s", accel_last_error());
    accel_module_free(m);
    accel_step_reset();
}

int main(void) {
    RUN(test_module_freed_before_backward);
    RUN(test_frozen_checkpointed_block_freed);
    RUN(test_zero3_model_freed);
    RUN(test_other_module_freed);
    RUN(test_saved_input_freed);
    RUN(test_unrelated_frees);
    accel_thread_cleanup();
    return check_summary();
}
