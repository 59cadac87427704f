/* Mixed precision: fp16 GradScaler behaviour (init 65536, skip + backoff on inf/nan,
 * growth after growth_interval clean steps), per optimizer with several (a GAN) and
 * through a failed step's retry, bf16 autocast forward with f32 outputs, fp8 and
 * unknown modes refused. Runs plainly and under `accel launch`. */
#include "accel/accel.h"
#include "accel/accelerator.h"
#include "check.h"

static int N, R;
static accel_accelerator *A;

static void params_copy(accel_module *m, float *out) {
    accel_tensor **ps;
    int n = accel_module_parameters(m, &ps);
    int64_t k = 0;
    for (int i = 0; i < n; i++)
        for (int64_t j = 0; j < accel_numel(ps[i]); j++) out[k++] = ((float *)ps[i]->data)[j];
    accel_free(ps);
}

static double lr_const(int64_t step, void *ctx) { return 1.0; }

static void test_fp16_scaler(void) {
    CHECK(accel_accelerator_mixed_precision(A) == ACCEL_MP_FP16);
    CHECK(accel_accelerator_loss_scale(A) == 65536.0);
    accel_manual_seed(11);
    accel_module *m = accel_linear_new(2, 1, true, ACCEL_CPU_DEVICE, ACCEL_F32);
    accel_tensor **ps;
    int np = accel_module_parameters(m, &ps);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_SGD, 0.1);
    accel_optimizer *opt = accel_optimizer_new_params(ACCEL_OPTIM_SGD, np, ps, &h);
    accel_free(ps);
    accel_lr_scheduler *s = accel_lr_scheduler_lambda(opt, lr_const, NULL);
    CHECK(accel_accelerator_prepare(A, m, opt, NULL, s) == ACCEL_OK);
    float before[3], after[3];
    for (int step = 0; step < 6; step++) {
        bool inject = step == 2;
        accel_tensor *x = accel_from_floats(ACCEL_SHAPE(2, 2), (float[]){0.5f, -0.25f, 0.125f, 1.0f});
        accel_tensor *y = accel_module_call(m, x);
        CHECK(y && y->dtype == ACCEL_F32);           /* outputs converted to f32 */
        CHECK(accel_autocast_dtype() == ACCEL_F32);  /* autocast only inside the forward */
        accel_tensor *loss = accel_mean_all(accel_mul(y, y));
        /* an overflow on one rank: the all-reduce spreads it, every rank skips */
        if (inject && R == 0) loss = accel_mul_scalar(loss, INFINITY);
        params_copy(m, before);
        CHECK(accel_accelerator_backward(A, loss) == ACCEL_OK);
        CHECK(accel_accelerator_optimizer_step(A, opt) == ACCEL_OK);
        accel_accelerator_scheduler_step(A, s);
        accel_accelerator_zero_grad(A, opt);
        params_copy(m, after);
        bool changed = memcmp(before, after, sizeof before) != 0;
        if (inject) {
            CHECK(accel_accelerator_optimizer_step_was_skipped(A));
            CHECK(!changed);
            CHECK(accel_accelerator_loss_scale(A) == 32768.0);
            CHECK(accel_lr_scheduler_last_epoch(s) == (int64_t)N * 2); /* no scheduler step either */
        } else {
            CHECK(!accel_accelerator_optimizer_step_was_skipped(A));
            CHECK(changed);
            for (int i = 0; i < 3; i++) CHECK(isfinite(after[i]));
        }
        /* growth_interval 3: three clean steps after the overflow double the scale */
        if (step == 1) CHECK(accel_accelerator_loss_scale(A) == 65536.0);
        if (step == 4) CHECK(accel_accelerator_loss_scale(A) == 32768.0);
        if (step == 5) CHECK(accel_accelerator_loss_scale(A) == 65536.0);
        accel_step_reset();
    }
    CHECK_MSG(accel_accelerator_clear(A) == ACCEL_OK, "%s", accel_last_error());
    accel_lr_scheduler_free(s);
    accel_optimizer_free(opt);
    accel_module_free(m);
}

/* Unscaled gradients equal the f32 gradients (within fp16 forward rounding). */
static void test_fp16_unscale_matches_f32(void) {
    accel_manual_seed(12);
    accel_module *m = accel_linear_new(3, 1, true, ACCEL_CPU_DEVICE, ACCEL_F32);
    accel_tensor **ps;
    int np = accel_module_parameters(m, &ps);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_SGD, 0.1);
    accel_optimizer *opt = accel_optimizer_new_params(ACCEL_OPTIM_SGD, np, ps, &h);
    CHECK(accel_accelerator_prepare(A, m, opt, NULL, NULL) == ACCEL_OK);
    /* The scaled gradients must stay below the fp16 maximum (65504) in the fp16
     * backward of the autocast linear, or the step overflows (as with torch's GradScaler). */
    accel_tensor *x = accel_from_floats(ACCEL_SHAPE(1, 3), (float[]){0.5f, 0.25f, -0.125f});
    accel_tensor *loss = accel_mul_scalar(accel_sum_all(accel_module_call(m, x)), 0.5);
    CHECK(accel_accelerator_backward(A, loss) == ACCEL_OK);
    /* d(0.5 * (w.x + b))/dw = x / 2, scaled by 65536 until unscaled */
    CHECK_CLOSE(((float *)ps[0]->grad->data)[2], -0.0625 * 65536, 1e-3, 0);
    double norm = accel_accelerator_clip_grad_norm(A, m, 100.0, 2.0);
    CHECK_CLOSE(norm, 0.5 * sqrt(0.25 + 0.0625 + 0.015625 + 1), 1e-3, 0);
    CHECK_CLOSE(((float *)ps[0]->grad->data)[2], -0.0625, 1e-3, 0);
    CHECK(accel_accelerator_optimizer_step(A, opt) == ACCEL_OK);
    CHECK(!accel_accelerator_optimizer_step_was_skipped(A));
    accel_accelerator_zero_grad(A, opt);
    accel_free(ps);
    accel_step_reset();
    CHECK_MSG(accel_accelerator_clear(A) == ACCEL_OK, "%s", accel_last_error());
    accel_optimizer_free(opt);
    accel_module_free(m);
}

static void test_precision_options(void) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.mixed_precision = "fp8";
    CHECK(accel_accelerator_new(&o) == NULL);
    CHECK(accel_last_status() == ACCEL_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(accel_last_error(), "fp8 mixed precision is not supported");
    accel_clear_error();
    o.mixed_precision = "fp32";
    CHECK(accel_accelerator_new(&o) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "Unknown mixed_precision mode: fp32. Choose between ['no', 'fp8', 'fp16', 'bf16']");
    accel_clear_error();
    o.mixed_precision = "no";
    o.gradient_accumulation_steps = -1;
    CHECK(accel_accelerator_new(&o) == NULL);
    accel_clear_error();
}

/* An fp16 accelerator with GradScaler options init, growth (interval 1);
 * NULL + error when refused. */
static accel_accelerator *fp16_with(double init, double growth, double backoff) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.mixed_precision = "fp16";
    o.init_scale = init;
    o.growth_factor = growth;
    o.backoff_factor = backoff;
    o.growth_interval = 1;
    return accel_accelerator_new(&o);
}

/* The loss scale after each of `steps` steps of SGD on one weight into out,
 * b freed then; loss = w * c[s] (1e-30: a clean step even at a scale near
 * FLT_MAX; INFINITY: one skipped). */
static void scaled_steps(accel_accelerator *b, int steps, const float *c, double *out) {
    accel_module *m = accel_linear_new(1, 1, false, ACCEL_CPU_DEVICE, ACCEL_F32);
    accel_tensor **ps;
    CHECK(accel_module_parameters(m, &ps) == 1);
    accel_tensor *w = ps[0];
    accel_free(ps);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_SGD, 0.1);
    accel_optimizer *opt = accel_optimizer_new_params(ACCEL_OPTIM_SGD, 1, &w, &h);
    CHECK(accel_accelerator_prepare(b, m, opt) == ACCEL_OK);
    for (int s = 0; s < steps; s++) {
        accel_tensor *x = accel_from_floats(ACCEL_SHAPE(1, 1), &c[s]);
        CHECK(accel_accelerator_backward(b, accel_sum_all(accel_mul(w, x))) == ACCEL_OK);
        CHECK(accel_accelerator_optimizer_step(b, opt) == ACCEL_OK);
        CHECK(accel_accelerator_optimizer_step_was_skipped(b) == isinf(c[s]));
        accel_accelerator_zero_grad(b, opt);
        out[s] = accel_accelerator_loss_scale(b);
        accel_step_reset();
    }
    accel_accelerator_free(b);
    accel_optimizer_free(opt);
    accel_module_free(m);
}

/* torch.amp.GradScaler("cpu", init_scale, growth_factor, growth_interval=1)
 * keeps its scale in float32 (torch 2.15's get_scale() after each clean
 * step, in the comments), which tools/sweep_optim.py found accel's double
 * scale drifting from; and it refuses factors of 1. */
static void test_fp16_scale_float32(void) {
    double s[2];
    const float clean[2] = {1e-30f, 1e-30f}, inf_then_clean[2] = {INFINITY, 1e-30f};
    /* init 0.1, growth 1.5: 0.15000000596046448, 0.22500000894069672 (a double
     * scale gave 0.15, 0.225) */
    accel_accelerator *b = fp16_with(0.1, 1.5, 0.5);
    CHECK_MSG(b != NULL, "%s", accel_last_error());
    CHECK(accel_accelerator_loss_scale(b) == (double)0.1f);
    scaled_steps(b, 2, clean, s);
    CHECK(s[0] == 0.15000000596046448 && s[1] == 0.22500000894069672);
    /* init 0.1, backoff 0.3, an inf step then a clean one: 0.030000001192092896,
     * 0.06000000238418579 */
    b = fp16_with(0.1, 2.0, 0.3);
    CHECK_MSG(b != NULL, "%s", accel_last_error());
    scaled_steps(b, 2, inf_then_clean, s);
    CHECK(s[0] == 0.030000001192092896 && s[1] == 0.06000000238418579);
    /* init 2^127, growth 2: a growth to inf is not taken: 1.7014118346046923e38
     * after each (the double scale grew past FLT_MAX) */
    b = fp16_with(0x1p127, 2.0, 0.5);
    CHECK_MSG(b != NULL, "%s", accel_last_error());
    scaled_steps(b, 2, clean, s);
    CHECK(s[0] == 0x1p127 && s[1] == 0x1p127);
    /* "The growth factor must be > 1.0.", "The backoff factor must be < 1.0.";
     * torch.full((), 1e39, dtype=float32) is inf */
    const struct { double init, growth, backoff; const char *why; } bad[] = {
        {65536, 1.0, 0.5, "growth_factor must be > 1"},
        {65536, 2.0, 1.0, "backoff_factor must be in (0, 1)"},
        {1e39, 2.0, 0.5, "init_scale must be > 0 and at most float32's largest"},
    };
    for (int i = 0; i < 3; i++) {
        CHECK(fp16_with(bad[i].init, bad[i].growth, bad[i].backoff) == NULL);
        CHECK(accel_last_status() == ACCEL_ERR_INVALID_ARG);
        CHECK_STR_CONTAINS(accel_last_error(), bad[i].why);
        accel_clear_error();
    }
    /* growth_interval 0 is the default (2000); a negative one is refused */
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.mixed_precision = "fp16";
    o.growth_interval = -1;
    CHECK(accel_accelerator_new(&o) == NULL);
    CHECK(accel_last_status() == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "growth_interval must be >= 1 (0: the default, 2000)");
    accel_clear_error();
}

/* A GAN's two models, each with its own SGD (lr 0.1): Linear(4, 1) of
 * weight 0.5 without bias, under an fp16 accelerator whose scale moves at
 * every step (fp16_with: growth_interval 1). */
typedef struct gan {
    accel_accelerator *acc;
    accel_module *m[2];
    accel_optimizer *o[2];
} gan;

static gan gan_new(void) {
    gan g = {.acc = fp16_with(65536, 2.0, 0.5)};
    CHECK_MSG(g.acc != NULL, "%s", accel_last_error());
    for (int k = 0; k < 2; k++) {
        g.m[k] = accel_linear_new(4, 1, false, ACCEL_CPU_DEVICE, ACCEL_F32);
        accel_fill_(accel_module_get_tensor(g.m[k], "weight"), 0.5);
        g.o[k] = accel_optimizer_new_module(ACCEL_OPTIM_SGD, g.m[k], &(accel_optim_hparams){.lr = 0.1});
    }
    CHECK_MSG(accel_accelerator_prepare(g.acc, g.m[0], g.o[0], g.m[1], g.o[1]) == ACCEL_OK, "%s", accel_last_error());
    return g;
}

/* One backward of both models' losses, mse(m(x), 0) with x = 0.01 [2, 4]:
 * d/dw = 2 * 0.02 * 0.01 = 4e-4 for each weight (the loss of m[0] times
 * inf when inf_first: its gradients inf/nan, m[1]'s clean). */
static void gan_backward(gan *g, bool inf_first) {
    accel_tensor *x = accel_full(ACCEL_F32, ACCEL_SHAPE(2, 4), 0.01), *y = accel_zeros(ACCEL_F32, ACCEL_SHAPE(2, 1));
    accel_tensor *l0 = accel_mse_loss(accel_module_call(g->m[0], x), y);
    if (inf_first) l0 = accel_mul_scalar(l0, INFINITY);
    accel_tensor *l1 = accel_mse_loss(accel_module_call(g->m[1], x), y);
    CHECK_MSG(accel_accelerator_backward(g->acc, accel_add(l0, l1)) == ACCEL_OK, "%s", accel_last_error());
}

static double gan_weight(const gan *g, int k) {
    return accel_get(accel_module_get_tensor(g->m[k], "weight"), (int64_t[]){0, 0});
}
static double gan_grad(const gan *g, int k) {
    return accel_get(accel_module_get_tensor(g->m[k], "weight")->grad, (int64_t[]){0, 0});
}

/* Both steps made: each weight 0.5 - 0.1 * 4e-4 (within fp16's forward
 * rounding: torch's is 0.49995999, accel's 0.49995998); a gradient divided
 * by the scale twice left a weight at 0.5, one divided by another step's
 * scale at 0.49998 or 0.49992. */
static void gan_check_stepped(const gan *g, int k) {
    CHECK_CLOSE(gan_grad(g, k), 4e-4, 1e-3, 0);
    CHECK_CLOSE(gan_weight(g, k), 0.49996, 0, 1e-7);
}

static void gan_free(gan *g) {
    accel_step_reset();
    accel_accelerator_free(g->acc);
    for (int k = 0; k < 2; k++) {
        accel_optimizer_free(g->o[k]);
        accel_module_free(g->m[k]);
    }
}

/* Two prepared optimizers under fp16 (Accelerate's GAN pattern: one backward,
 * then each optimizer's step): each step unscales its own optimizer's
 * gradients once, by the scale their backward used, and skips or steps on
 * its own inf check, where every step unscaled every model (the second
 * step's gradients divided twice: 6e-9). The scale is updated after each
 * step as Accelerate's AcceleratedOptimizer.step calls update() (torch
 * 2.15 + that loop: 131072 then 262144; 32768 then 65536 after the first's
 * overflow). Accelerate divides the second optimizer's gradients by the
 * scale the first's update left (w 0.49998 and 0.49992 there): not copied. */
static void test_fp16_two_optimizers(void) {
    gan g = gan_new();
    gan_backward(&g, false);
    CHECK(accel_accelerator_optimizer_step(g.acc, g.o[0]) == ACCEL_OK);
    CHECK(accel_accelerator_loss_scale(g.acc) == 131072.0);
    CHECK(accel_accelerator_optimizer_step(g.acc, g.o[1]) == ACCEL_OK);
    CHECK(accel_accelerator_loss_scale(g.acc) == 262144.0);
    CHECK(!accel_accelerator_optimizer_step_was_skipped(g.acc));
    for (int k = 0; k < 2; k++) gan_check_stepped(&g, k);
    gan_free(&g);

    /* m[0]'s gradients overflow: its step alone is skipped (torch's GradScaler.step checks that optimizer's) */
    g = gan_new();
    gan_backward(&g, true);
    CHECK(accel_accelerator_optimizer_step(g.acc, g.o[0]) == ACCEL_OK);
    CHECK(accel_accelerator_loss_scale(g.acc) == 32768.0);
    CHECK(accel_accelerator_optimizer_step(g.acc, g.o[1]) == ACCEL_OK);
    CHECK(accel_accelerator_loss_scale(g.acc) == 65536.0);
    CHECK(accel_accelerator_optimizer_step_was_skipped(g.acc));
    CHECK(gan_weight(&g, 0) == 0.5);
    gan_check_stepped(&g, 1);
    gan_free(&g);

    /* clip_grad_norm unscales every optimizer's gradients (Accelerate's
     * unscale_gradients()); the steps after it do not unscale them again,
     * where torch + Accelerate's update() unscale the second again (6e-9) */
    g = gan_new();
    gan_backward(&g, false);
    CHECK_CLOSE(accel_accelerator_clip_grad_norm(g.acc, g.m[0], 100.0, 2.0), 8e-4, 1e-3, 0);
    CHECK(accel_accelerator_optimizer_step(g.acc, g.o[0]) == ACCEL_OK);
    CHECK(accel_accelerator_optimizer_step(g.acc, g.o[1]) == ACCEL_OK);
    for (int k = 0; k < 2; k++) gan_check_stepped(&g, k);
    gan_free(&g);

    /* gradients unscaled, then cleared without a step: the next backward's are unscaled again */
    g = gan_new();
    gan_backward(&g, false);
    CHECK(accel_accelerator_unscale_gradients(g.acc) == ACCEL_OK);
    for (int k = 0; k < 2; k++) CHECK(accel_accelerator_zero_grad(g.acc, g.o[k]) == ACCEL_OK);
    gan_backward(&g, false);
    for (int k = 0; k < 2; k++) CHECK(accel_accelerator_optimizer_step(g.acc, g.o[k]) == ACCEL_OK);
    for (int k = 0; k < 2; k++) gan_check_stepped(&g, k);
    gan_free(&g);
}

/* Under ZeRO, two optimizers over the halves of one prepared model (a GAN in
 * one module): the model's gradients are one flat buffer, unscaled once for
 * both (each optimizer's unscale divided the whole buffer: the second
 * half's gradients by the scale squared, its weight stayed 0.5). */
static void test_fp16_two_optimizers_one_zero_model(void) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.mixed_precision = "fp16", o.init_scale = 65536, o.growth_interval = 1, o.zero_stage = 1;
    gan g = {.acc = accel_accelerator_new(&o)};
    CHECK_MSG(g.acc != NULL, "%s", accel_last_error());
    for (int k = 0; k < 2; k++) {
        g.m[k] = accel_linear_new(4, 1, false, ACCEL_CPU_DEVICE, ACCEL_F32);
        accel_fill_(accel_module_get_tensor(g.m[k], "weight"), 0.5);
        g.o[k] = accel_optimizer_new_module(ACCEL_OPTIM_SGD, g.m[k], &(accel_optim_hparams){.lr = 0.1});
    }
    accel_module *both = accel_sequential_new(2, (accel_module *[]){g.m[0], g.m[1]});
    CHECK_MSG(accel_accelerator_prepare(g.acc, both, g.o[0], g.o[1]) == ACCEL_OK, "%s", accel_last_error());
    gan_backward(&g, false);
    for (int k = 0; k < 2; k++) CHECK(accel_accelerator_optimizer_step(g.acc, g.o[k]) == ACCEL_OK);
    for (int k = 0; k < 2; k++) CHECK_CLOSE(gan_weight(&g, k), 0.49996, 0, 1e-7);
    accel_step_reset();
    accel_accelerator_free(g.acc);
    for (int k = 0; k < 2; k++) accel_optimizer_free(g.o[k]);
    accel_module_free(both);
}

/* An inf in one of an optimizer's gradients, the others clean, skips its
 * step: the check of each gradient adds to the one flag of the optimizer
 * (a check that set it to its own verdict let a later clean gradient, the
 * bias after the weight, hide the weight's inf: an inf step). */
static void test_fp16_inf_in_one_gradient(void) {
    accel_accelerator *b = fp16_with(65536, 2.0, 0.5);
    CHECK_MSG(b != NULL, "%s", accel_last_error());
    accel_module *m = accel_linear_new(2, 1, true, ACCEL_CPU_DEVICE, ACCEL_F32);
    accel_optimizer *opt = accel_optimizer_new_module(ACCEL_OPTIM_SGD, m, &(accel_optim_hparams){.lr = 0.1});
    CHECK(accel_accelerator_prepare(b, m, opt) == ACCEL_OK);
    accel_tensor *w = accel_module_get_tensor(m, "weight");
    accel_fill_(w, 0.5);
    accel_tensor *x = accel_full(ACCEL_F32, ACCEL_SHAPE(1, 2), 0.25);
    accel_tensor *loss = accel_mul_scalar(accel_sum_all(accel_module_call(m, x)), 0.01);
    CHECK(accel_accelerator_backward(b, loss) == ACCEL_OK);
    accel_tensor *bias_grad = accel_module_get_tensor(m, "bias")->grad;
    CHECK_CLOSE(accel_get(bias_grad, (int64_t[]){0}), 0.01 * 65536, 1e-3, 0); /* clean: below fp16's largest, 65504 */
    CHECK(accel_set(w->grad, (int64_t[]){0, 0}, INFINITY) == ACCEL_OK);
    CHECK(accel_accelerator_optimizer_step(b, opt) == ACCEL_OK);
    CHECK(accel_accelerator_optimizer_step_was_skipped(b));
    CHECK(accel_get(w, (int64_t[]){0, 0}) == 0.5 && accel_get(w, (int64_t[]){0, 1}) == 0.5);
    CHECK(accel_accelerator_loss_scale(b) == 32768.0);
    accel_step_reset();
    accel_accelerator_free(b);
    accel_optimizer_free(opt);
    accel_module_free(m);
}

/* fp16 unscales the prepared optimizers' gradients: with none prepared,
 * unscale_gradients and clip_grad_norm are refused (they returned OK with
 * the gradients still scaled, or clipped the scaled ones), changing nothing. */
static void test_fp16_unscale_needs_optimizer(void) {
    accel_accelerator *b = fp16_with(65536, 2.0, 0.5);
    CHECK_MSG(b != NULL, "%s", accel_last_error());
    accel_module *m = accel_linear_new(1, 1, false, ACCEL_CPU_DEVICE, ACCEL_F32);
    CHECK(accel_accelerator_prepare(b, m) == ACCEL_OK);
    accel_tensor *w = accel_module_get_tensor(m, "weight");
    accel_tensor *x = accel_full(ACCEL_F32, ACCEL_SHAPE(1, 1), 0.25);
    accel_tensor *loss = accel_mul_scalar(accel_sum_all(accel_module_call(m, x)), 0.01);
    CHECK(accel_accelerator_backward(b, loss) == ACCEL_OK);
    CHECK(accel_accelerator_unscale_gradients(b) == ACCEL_ERR_STATE);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_accelerator_unscale_gradients: fp16 unscales the gradients of "
                                           "the prepared optimizers (GradScaler.unscale_(optimizer)), and none was "
                                           "prepared");
    CHECK(isnan(accel_accelerator_clip_grad_norm(b, m, 1.0, 2.0)));
    CHECK_STR_CONTAINS(accel_last_error(), "accel_accelerator_clip_grad_norm: fp16 unscales");
    CHECK_CLOSE(accel_get(w->grad, (int64_t[]){0, 0}), 0.25 * 0.01 * 65536, 1e-3, 0); /* still scaled */
    accel_step_reset();
    accel_accelerator_free(b);
    accel_module_free(m);
}

/* An fp16 step that fails (a live hyperparameter the step refuses) leaves
 * its gradients unscaled once and the scale where it was, as torch's
 * exception inside GradScaler.step leaves the optimizer UNSCALED with no
 * update(): the retry, the cause fixed, steps with those gradients (it
 * divided them again: 6e-9, the weight left at 0.5), and the scale moves
 * once (it moved for the failed step too: 262144). */
static void test_fp16_step_retried(void) {
    gan g = gan_new();
    gan_backward(&g, false);
    accel_optimizer_hparams(g.o[0], 0)->momentum = 0.9;
    CHECK(accel_accelerator_optimizer_step(g.acc, g.o[0]) == ACCEL_ERR_INVALID_ARG);
    CHECK(accel_accelerator_loss_scale(g.acc) == 65536.0);
    CHECK_CLOSE(gan_grad(&g, 0), 4e-4, 1e-3, 0);
    CHECK(gan_weight(&g, 0) == 0.5);
    accel_optimizer_hparams(g.o[0], 0)->momentum = 0;
    CHECK_MSG(accel_accelerator_optimizer_step(g.acc, g.o[0]) == ACCEL_OK, "%s", accel_last_error());
    CHECK(accel_accelerator_loss_scale(g.acc) == 131072.0);
    gan_check_stepped(&g, 0);
    CHECK(accel_accelerator_optimizer_step(g.acc, g.o[1]) == ACCEL_OK);
    gan_check_stepped(&g, 1);
    gan_free(&g);
}

/* bf16 on one process: a second accelerator after the first is freed. */
static void test_bf16_forward(void) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.mixed_precision = "bf16";
    accel_accelerator *b = accel_accelerator_new(&o);
    CHECK(b != NULL);
    accel_manual_seed(13);
    accel_module *m = accel_linear_new(4, 2, true, ACCEL_CPU_DEVICE, ACCEL_F32);
    CHECK(accel_accelerator_prepare_model(b, m) == ACCEL_OK);
    accel_tensor *x = accel_from_floats(ACCEL_SHAPE(1, 4), (float[]){0.3f, 0.1f, -0.7f, 0.9f});
    accel_tensor *y = accel_module_call(m, x);
    CHECK(y && y->dtype == ACCEL_F32);
    accel_dtype prev = accel_accelerator_autocast_begin(b);
    CHECK(accel_autocast_dtype() == ACCEL_BF16);
    CHECK(accel_accelerator_autocast_end(b, (accel_dtype)99) == ACCEL_ERR_DTYPE); /* not a dtype: refused */
    CHECK(accel_autocast_dtype() == ACCEL_BF16);
    accel_clear_error();
    CHECK(accel_accelerator_autocast_end(b, prev) == ACCEL_OK);
    CHECK(accel_autocast_dtype() == ACCEL_F32);
    CHECK(accel_accelerator_backward(b, accel_sum_all(y)) == ACCEL_OK);
    accel_tensor **ps;
    accel_module_parameters(m, &ps);
    CHECK(ps[0]->dtype == ACCEL_F32 && ps[0]->grad->dtype == ACCEL_F32); /* f32 master weights */
    CHECK_CLOSE(((float *)ps[0]->grad->data)[2], -0.7, 1e-2, 0);
    accel_free(ps);
    accel_step_reset();
    accel_accelerator_free(b);
    accel_module_free(m);
}

int main(void) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.mixed_precision = "fp16";
    o.growth_interval = 3;
    A = accel_accelerator_new(&o);
    if (!A) {
        fprintf(stderr, "%s\n", accel_last_error());
        return 1;
    }
    N = accel_accelerator_num_processes(A);
    R = accel_accelerator_process_index(A);
    RUN(test_fp16_scaler);
    RUN(test_fp16_unscale_matches_f32);
    RUN(test_precision_options);
    accel_accelerator_free(A);
    if (N == 1) RUN(test_bf16_forward);
    if (N == 1) RUN(test_fp16_scale_float32);
    RUN(test_fp16_two_optimizers);
    RUN(test_fp16_two_optimizers_one_zero_model);
    RUN(test_fp16_step_retried);
    RUN(test_fp16_inf_in_one_gradient);
    RUN(test_fp16_unscale_needs_optimizer);
    accel_thread_cleanup();
    return check_summary();
}
