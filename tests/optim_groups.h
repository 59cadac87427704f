/* A model and optimizers whose param groups can be split two ways with
 * every state entry of the same size: the tests of load_state's group check
 * (test_accelerator_checkpoint, test_accelerator_zero,
 * test_pipeline_checkpoint). Static: each test program its own copy. */
#ifndef ACCEL_TESTS_OPTIM_GROUPS_H
#define ACCEL_TESTS_OPTIM_GROUPS_H

#include "accel/accel.h"
#include "accel/accelerator.h"
#include "check.h"

/* Three square bias-free layers: parameters A, B, C of one shape, so a state
 * of one grouping fits another's sizes entry by entry. */
static inline accel_module *squares(uint64_t seed) {
    accel_manual_seed(seed);
    accel_module *l[3];
    for (int k = 0; k < 3; k++) l[k] = accel_linear_new(4, 4, false, ACCEL_CPU_DEVICE, ACCEL_F32);
    return accel_sequential_new(3, l);
}

/* AdamW over m's parameters in two groups: the first `first` of them (lr
 * lr0, weight decay 0.01), the rest (lr lr1, none). */
static inline accel_optimizer *grouped(accel_module *m, int first, double lr0, double lr1) {
    accel_tensor **ps;
    int n = accel_module_parameters(m, &ps);
    accel_optim_hparams h = {.lr = lr0, .weight_decay = 0.01};
    accel_optimizer *o = accel_optimizer_new_params(ACCEL_OPTIM_ADAMW, first, ps, &h);
    h.lr = lr1;
    h.weight_decay = 0;
    CHECK(n > first && accel_optimizer_add_params(o, n - first, ps + first, &h) == 1);
    accel_free(ps);
    return o;
}

/* m and opt prepared by acc, then one step on a fixed batch of 2 x 4. */
static inline void prepare_and_step(accel_accelerator *acc, accel_module *m, accel_optimizer *opt) {
    CHECK(accel_accelerator_prepare(acc, m, opt) == ACCEL_OK);
    float xs[8] = {0.5f, -1, 2, 1, 0, -0.5f, 0.25f, 1.5f};
    accel_tensor *loss = accel_mean_all(accel_module_call(m, accel_from_floats(ACCEL_SHAPE(2, 4), xs)));
    CHECK(loss && accel_accelerator_backward(acc, loss) == ACCEL_OK && accel_accelerator_optimizer_step(acc, opt) == ACCEL_OK);
    accel_step_reset();
}

#endif
