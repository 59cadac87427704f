/* Defining your own module: a 2-layer MLP, trained with SGD to fit y = sin(x).
 *
 *   build/bin/custom_module      prints the state dict's names and shapes, then trains
 *                                under a progress bar (loss field) and logs the loss
 *                                every 50 steps (INFO, stderr); it goes down.
 *
 * A module is a type (accel_module_ops: a name and a forward function) plus
 * named children and parameters. Registering children gives the parameters
 * their PyTorch-style names ("fc1.weight", ...), which state dicts,
 * checkpoints and optimizers use. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "accel/accel.h"

/* x [N, 1] -> fc1 -> tanh -> fc2 -> [N, 1] */
static accel_tensor *mlp_forward(accel_module *m, accel_tensor *x) {
    accel_tensor *h = accel_tanh(accel_module_call(m->children[0], x));
    return accel_module_call(m->children[1], h);
}

static const accel_module_ops MLP_OPS = {"MLP", mlp_forward, NULL};

static accel_module *mlp_new(int64_t in, int64_t hidden, int64_t out) {
    accel_module *m = accel_module_new(&MLP_OPS, NULL);
    accel_module_add_child(m, "fc1", accel_linear_new(in, hidden, true, ACCEL_CPU_DEVICE, ACCEL_F32));
    accel_module_add_child(m, "fc2", accel_linear_new(hidden, out, true, ACCEL_CPU_DEVICE, ACCEL_F32));
    return m; /* a failure above leaves an error pending; the caller checks it */
}

int main(void) {
    accel_manual_seed(0);
    accel_module *model = mlp_new(1, 32, 1);
    if (accel_last_status() != ACCEL_OK) {
        fprintf(stderr, "%s\n", accel_last_error());
        return 1;
    }
    accel_state_dict *sd = accel_module_state_dict(model);
    for (int i = 0; i < sd->n; i++) {
        char shape[32];
        printf("%-12s %s\n", sd->entries[i].name, accel_shape_str(sd->entries[i].t, shape, sizeof shape));
    }
    accel_state_dict_free(sd);

    /* The toy data: 64 points of sin on [-3, 3]. */
    enum { N = 64 };
    float xs[N], ys[N];
    for (int i = 0; i < N; i++) {
        xs[i] = -3.0f + 6.0f * (float)i / (N - 1);
        ys[i] = sinf(xs[i]);
    }

    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_SGD, 0.1);
    h.momentum = 0.9;
    accel_optimizer *opt = accel_optimizer_new_module(ACCEL_OPTIM_SGD, model, &h);

    /* logging.basicConfig(level=INFO), as Accelerate's examples (ACCEL_LOG_LEVEL overrides) */
    accel_logger *log = accel_get_logger("custom_module");
    if (!getenv("ACCEL_LOG_LEVEL") && !getenv("ACCELERATE_LOG_LEVEL")) accel_logger_set_level(log, ACCEL_LOG_INFO);
    enum { STEPS = 300 };
    accel_progress_opts po = accel_progress_opts_default();
    po.desc = "train";
    accel_progress *bar = accel_progress_new(STEPS + 1, &po);
    for (int step = 0; step <= STEPS; step++) {
        accel_tensor *x = accel_from_floats(ACCEL_SHAPE(N, 1), xs);
        accel_tensor *y = accel_from_floats(ACCEL_SHAPE(N, 1), ys);
        accel_tensor *loss = accel_mse_loss(accel_module_call(model, x), y);
        if (!loss || accel_backward(loss) != ACCEL_OK) {
            fprintf(stderr, "step %d: %s\n", step, accel_last_error());
            return 1;
        }
        double l = accel_item(loss);
        if (step % 50 == 0) accel_log_info(log, "step %3d  loss %.5f", step, l);
        accel_progress_set_loss(bar, l);
        accel_progress_update(bar, 1);
        accel_optimizer_step(opt);
        accel_optimizer_zero_grad(opt);
        accel_step_reset(); /* every step tensor (x, y, loss, ...) ends here */
    }

    accel_progress_close(bar);
    accel_optimizer_free(opt);
    accel_module_free(model);
    return 0;
}
