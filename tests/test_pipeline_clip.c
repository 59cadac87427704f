/* clip_grad_norm and the fp16 scaler under pipeline parallelism (pp = 2, 2
 * processes), where the stages hold different gradients:
 * - fp16, a NaN in a stage-1 gradient only: both stages find it (the ranks
 *   agree on inf/nan, as under ZeRO), so both skip the step and back off
 *   the scale, and neither reports the NaN norm as an error (an overflow
 *   step). Only stage 1 found it before: stage 0 stepped and errored, stage
 *   1 skipped, and their loss scales drifted apart.
 * - no mixed precision, a tied embedding with an inf gradient: the norm is
 *   inf on both stages, no error, as torch's clip_grad_norm_ (the tied
 *   copy's part subtracted, inf - inf, made it NaN and an error). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accelerator.h"
#include "check.h"
#include "dist_group.h"
#include "pipeline_model.h"

static bool g_fp16;

/* The first parameter of m this stage holds whose gradient has `numel`
 * elements (any, for numel 0), or NULL. */
static accel_tensor *held_param(accel_module *m, int64_t numel, bool last) {
    accel_tensor **ps, *got = NULL;
    int n = accel_module_parameters(m, &ps);
    for (int i = 0; i < n; i++) {
        accel_tensor *p = ps[last ? n - 1 - i : i];
        if (p->device.type != ACCEL_DEV_META && p->grad && (!numel || accel_numel(p) == numel)) {
            got = p;
            break;
        }
    }
    accel_free(ps);
    return got;
}

static int body(int rank, int world) {
    (void)world;
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.mixed_precision = g_fp16 ? "fp16" : "no";
    o.parallelism = (accel_parallelism_opts){.pp_size = 2, .num_micro_batches = 2, .pp_schedule = "1f1b"};
    accel_accelerator *acc = accel_accelerator_new(&o);
    CHECK_MSG(acc != NULL, "%s", accel_last_error());
    if (!acc) return 1;
    accel_module *m = pipeline_llama((pipeline_model){.seed = 7, .vocab = 40, .hidden = 32, .ffn = 64, .positions = 32,
                                                      .layers = 4, .heads = 4, .kv_heads = 2, .tied = !g_fp16});
    accel_optim_hparams h = {.lr = 0.01};
    accel_optimizer *opt = accel_optimizer_new_module(ACCEL_OPTIM_ADAMW, m, &h);
    CHECK_MSG(accel_accelerator_prepare(acc, m, opt) == ACCEL_OK, "%s", accel_last_error());
    double loss, scale = accel_accelerator_loss_scale(acc);
    CHECK_MSG(accel_accelerator_pipeline_step(acc, m, pipeline_batch(0, 0, 4, 12, 40), &loss, NULL) == ACCEL_OK, "%s",
              accel_last_error());
    accel_tensor *p = g_fp16 ? (rank == 1 ? held_param(m, 0, true) : NULL) : held_param(m, 40 * 32, false);
    CHECK(g_fp16 ? (rank != 1 || p) : p != NULL);
    if (p) ((float *)p->grad->data)[0] = g_fp16 ? NAN : INFINITY;
    accel_clear_error();
    double norm = accel_accelerator_clip_grad_norm(acc, m, 1.0, 2.0);
    CHECK_MSG(g_fp16 ? isnan(norm) : isinf(norm) && norm > 0, "rank %d: norm %g", rank, norm);
    CHECK_MSG(accel_last_status() == ACCEL_OK, "rank %d: %s", rank, accel_last_error());
    CHECK(accel_accelerator_optimizer_step(acc, opt) == ACCEL_OK);
    CHECK_MSG(accel_accelerator_optimizer_step_was_skipped(acc) == g_fp16, "rank %d", rank);
    if (g_fp16) CHECK_MSG(accel_accelerator_loss_scale(acc) == scale * 0.5, "rank %d: scale %g", rank,
                          accel_accelerator_loss_scale(acc));
    accel_accelerator_free(acc);
    accel_optimizer_free(opt);
    accel_module_free(m);
    accel_thread_cleanup();
    return check_summary();
}

static void run(bool fp16) {
    g_fp16 = fp16;
    dist_group g = {.world = 2, .one_machine = true, .timeout = "30", .kill_after_s = 120};
    CHECK(dist_group_runs_ok(&g, body, "%s", fp16 ? "fp16" : "tied inf"));
}

static void test_fp16_nan_on_one_stage(void) { run(true); }
static void test_tied_inf(void) { run(false); }

int main(void) {
    RUN(test_fp16_nan_on_one_stage);
    RUN(test_tied_inf);
    return check_summary();
}
