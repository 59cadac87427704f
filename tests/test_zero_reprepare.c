/* A model unprepared (accel_accelerator_unprepare_model) and prepared again
 * under ZeRO 1/2/3 while its optimizer stays prepared (`accel launch
 * --num_processes 2` on hostless:0, accelerator.cmake; plainly one process):
 * the optimizer is sharded again, so training goes on as if the model had
 * never been let go (the same weights as without the cycle). Before, the
 * optimizer, its shard given back at the unprepare, stepped whole: under
 * ZeRO-3 it read the full parameters no longer mapped (a fault on the
 * device), under ZeRO-2 gradients reduced only in each rank's shard. */
#include <math.h>
#include <string.h>

#include "accel/accel.h"
#include "accel/accelerator.h"
#include "check.h"

static accel_module *mlp(void) {
    accel_manual_seed(7);
    accel_module *l[3] = {accel_linear_new(4, 8, true, ACCEL_CPU_DEVICE, ACCEL_F32), accel_relu_module_new(),
                          accel_linear_new(8, 1, true, ACCEL_CPU_DEVICE, ACCEL_F32)};
    return accel_sequential_new(3, l);
}

/* 3 steps of AdamW on rank-dependent data; cycle: unprepare + prepare the model between steps. */
static void train(int stage, bool cycle, float out[49]) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.zero_stage = stage;
    accel_accelerator *acc = accel_accelerator_new(&o);
    accel_module *m = mlp();
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 0.05);
    accel_optimizer *opt = accel_optimizer_new_module(ACCEL_OPTIM_ADAMW, m, &h);
    CHECK(acc && m && opt && accel_accelerator_prepare(acc, m, opt) == ACCEL_OK);
    if (!acc) return;
    accel_device dev = accel_accelerator_device(acc);
    int rank = accel_accelerator_process_index(acc);
    for (int s = 0; s < 3; s++) {
        float xs[8];
        for (int i = 0; i < 8; i++) xs[i] = (float)((i * 5 + s * 3 + rank * 7) % 11) / 11.0f - 0.5f;
        accel_tensor *x = accel_to_device(accel_from_floats(ACCEL_SHAPE(2, 4), xs), dev);
        accel_tensor *loss = accel_mean_all(accel_module_call(m, x));
        CHECK_MSG(loss && accel_accelerator_backward(acc, loss) == ACCEL_OK &&
                      accel_accelerator_optimizer_step(acc, opt) == ACCEL_OK,
                  "stage %d, step %d: %s", stage, s, accel_last_error());
        accel_accelerator_zero_grad(acc, opt);
        accel_step_reset();
        if (cycle) {
            CHECK(accel_accelerator_unprepare_model(acc, m) == ACCEL_OK);
            CHECK_MSG(accel_accelerator_prepare(acc, m) == ACCEL_OK, "%s", accel_last_error());
        }
    }
    CHECK(accel_accelerator_unprepare_model(acc, m) == ACCEL_OK); /* the full weights back */
    accel_tensor **ps;
    int n = accel_module_parameters(m, &ps), k = 0;
    for (int i = 0; i < n; i++) {
        CHECK(k + accel_numel(ps[i]) <= 49 && accel_tensor_to_host(ps[i], out + k) == ACCEL_OK);
        k += (int)accel_numel(ps[i]);
    }
    CHECK(k == 49);
    accel_free(ps);
    accel_step_reset();
    accel_accelerator_free(acc);
    accel_optimizer_free(opt);
    accel_module_free(m);
}

static void test_reprepare_under_zero(void) {
    for (int stage = 1; stage <= 3; stage++) {
        float a[49] = {0}, b[49] = {0};
        train(stage, false, a);
        train(stage, true, b);
        double worst = 0;
        for (int i = 0; i < 49; i++) worst = fmax(worst, fabs((double)a[i] - b[i]));
        CHECK_MSG(worst <= 1e-6, "stage %d: the weights differ by %g after the unprepare/prepare cycles", stage, worst);
    }
}

int main(void) {
    RUN(test_reprepare_under_zero);
    return check_summary();
}
