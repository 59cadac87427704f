/* Optimizers, clipping and LR schedulers against numbers from PyTorch and
 * transformers (tools/ref numbers computed with torch 2.x, see comments). */
#include "accel/accel.h"
#include "backends/registry.h"
#include "core/backend.h"
#include "optim/optim_internal.h"
#include "check.h"

static const float P0[4] = {0.5f, -1.25f, 2.0f, 0.125f};
static const float GRADS[3][4] = {{0.1f, -0.2f, 0.3f, -0.4f},
                                  {0.05f, 0.5f, -0.25f, 1.0f},
                                  {-0.3f, 0.2f, 0.1f, 0.0f}};

/* n host floats at p as a cpu tensor (the flat-segment form takes tensors). */
static accel_tensor *host_f32(float *p, int64_t n) { return accel_tensor_wrap(p, ACCEL_F32, 1, &n, ACCEL_CPU_DEVICE); }

/* An optimizer of one flat segment over host floats p, g [n]. The headers are
 * freed at once: the optimizer keeps views of the memory, not the tensors. */
static accel_optimizer *flat_opt(accel_optim_kind kind, float *p, float *g, int64_t n, const accel_optim_hparams *h) {
    accel_tensor *tp = host_f32(p, n), *tg = host_f32(g, n);
    accel_optimizer *opt = accel_optimizer_new_flat(kind, tp, tg, h);
    accel_tensor_free(tp);
    accel_tensor_free(tg);
    return opt;
}

static int flat_add(accel_optimizer *opt, float *p, float *g, int64_t n, const accel_optim_hparams *h) {
    accel_tensor *tp = host_f32(p, n), *tg = host_f32(g, n);
    int group = accel_optimizer_add_flat(opt, tp, tg, h);
    accel_tensor_free(tp);
    accel_tensor_free(tg);
    return group;
}

/* Three steps of the optimizer on a 4-element tensor parameter; compares with
 * torch.optim.<kind>(...) after the same three gradients. */
static void run_tensor(accel_optim_kind kind, const accel_optim_hparams *h, const float want[4]) {
    accel_tensor *p = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(4), ACCEL_CPU_DEVICE);
    memcpy(p->data, P0, sizeof P0);
    accel_requires_grad_(p, true);
    accel_optimizer *opt = accel_optimizer_new_params(kind, 1, &p, h);
    CHECK(opt != NULL);
    CHECK(accel_optimizer_step(opt) == ACCEL_OK); /* no grad yet: skipped, as PyTorch */
    CHECK(memcmp(p->data, P0, sizeof P0) == 0);
    p->grad = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(4), ACCEL_CPU_DEVICE);
    for (int s = 0; s < 3; s++) {
        memcpy(p->grad->data, GRADS[s], sizeof GRADS[s]);
        CHECK(accel_optimizer_step(opt) == ACCEL_OK);
    }
    for (int i = 0; i < 4; i++) CHECK_CLOSE(((float *)p->data)[i], want[i], 2e-6, 1e-7);
    accel_optimizer_zero_grad(opt);
    CHECK(((float *)p->grad->data)[1] == 0.0f);
    accel_optimizer_free(opt);
    accel_tensor_free(p);
}

static void test_sgd(void) {
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_SGD, 0.1);
    run_tensor(ACCEL_OPTIM_SGD, &h,
               (float[]){5.150000453e-01f, -1.299999952e+00f, 1.985000014e+00f, 6.500000507e-02f});
    h.momentum = 0.9;
    h.dampening = 0.1;
    h.weight_decay = 0.01;
    run_tensor(ACCEL_OPTIM_SGD, &h,
               (float[]){4.887303412e-01f, -1.292683125e+00f, 1.941900849e+00f, 6.167976558e-02f});
    h.dampening = 0;
    h.nesterov = true;
    run_tensor(ACCEL_OPTIM_SGD, &h,
               (float[]){5.051634312e-01f, -1.344701409e+00f, 1.929728270e+00f, -9.495019913e-03f});
}

static void test_adam_adamw(void) {
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAM, 0.01);
    h.weight_decay = 0.1;
    run_tensor(ACCEL_OPTIM_ADAM, &h,
               (float[]){4.811621606e-01f, -1.243170857e+00f, 1.976898193e+00f, 1.268399656e-01f});
    h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 0.01);
    CHECK(h.weight_decay == 0.01 && h.beta2 == 0.999 && h.eps == 1e-8);
    h.weight_decay = 0.1;
    run_tensor(ACCEL_OPTIM_ADAMW, &h,
               (float[]){4.826812744e-01f, -1.246120930e+00f, 1.981773973e+00f, 1.267693192e-01f});
}

/* The update loop (optim_update.c, compiled per ISA variant: 16 wide on
 * AVX-512, 8 on AVX2, 4 in the baseline) gives, bit for bit, what PyTorch's
 * scalar rules give element by element, on a segment long enough for the
 * threads and with a tail no vector fills; the suite runs this under every
 * ISA cap (tests/gemm.cmake). Adam (L2) and AdamW, three steps. */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF /* the rules unfused, as the kernel computes them (clang would fuse under -mfma) */
#endif
static void test_adam_bits(void) {
    enum { N = 100003 };
    static float p[N], g[N], want[N], m[N], v[N];
    for (int kind = ACCEL_OPTIM_ADAM; kind <= ACCEL_OPTIM_ADAMW; kind++) {
        bool adamw = kind == ACCEL_OPTIM_ADAMW;
        accel_optim_hparams h = accel_optim_defaults((accel_optim_kind)kind, 3e-3);
        h.weight_decay = 0.05;
        for (int i = 0; i < N; i++) {
            p[i] = want[i] = (float)((int)((int64_t)i * 7919 % 2003) - 1001) * 1e-3f;
            m[i] = v[i] = 0.0f;
        }
        accel_optimizer *opt = flat_opt((accel_optim_kind)kind, p, g, N, &h);
        CHECK(opt != NULL);
        for (int s = 1; s <= 3; s++) {
            for (int i = 0; i < N; i++) g[i] = (float)((int)((int64_t)i * 104729 % 4001) - 2000) * 2.5e-4f * (float)s;
            CHECK(accel_optimizer_step(opt) == ACCEL_OK);
            const float step_size = (float)(h.lr / (1.0 - pow(h.beta1, s)));
            const float bc2_sqrt = (float)sqrt(1.0 - pow(h.beta2, s));
            const float w1 = (float)(1.0 - h.beta1), b2 = (float)h.beta2, w2 = (float)(1.0 - h.beta2);
            const float decay = adamw ? (float)(1.0 - h.lr * h.weight_decay) : 1.0f;
            const float l2 = adamw ? 0.0f : (float)h.weight_decay;
            for (int i = 0; i < N; i++) { /* L2 fused; w1 < 0.5: lerp's first form; addcdiv_'s (value * m) / denom */
                float gi = l2 != 0.0f ? (float)((double)l2 * want[i] + g[i]) : g[i], pi = want[i] * decay;
                m[i] += w1 * (gi - m[i]);
                v[i] = v[i] * b2 + w2 * gi * gi;
                want[i] = pi + -step_size * m[i] / (sqrtf(v[i]) / bc2_sqrt + (float)h.eps);
            }
        }
        CHECK(memcmp(p, want, sizeof p) == 0);
        accel_optimizer_free(opt);
    }
}

/* The update's refresh of a weight's autocast copy (kernels.h:
 * accel_k_adam's cast): the bits accel_copy_ gives converting the new
 * weights, for each kind of copy (bf16, f16, and f32 holding either's
 * rounding), on values the rounding treats apart: ties, subnormals of either
 * dtype, overflow to inf, NaNs with payloads (a signalling one too), signed
 * zeros; a length no vector and no thread block fills. First lr 0 and zero
 * gradients leave the values as they are (but infs, which the decay's
 * 0 * inf turns to NaN, and signalling NaNs, quieted), so the new weights
 * are those values; then updates that move every weight. */
static void test_adam_cast(void) {
    enum { N = 70001 };
    static const uint32_t special[] = {
        0x3f808000u, 0x3f818000u, 0xbf808000u, 0x3f80c000u, /* bf16 ties to even, up and down; above a tie */
        0x00000001u, 0x807fffffu, 0x00400000u, 0x33800000u, /* f32 subnormals; f16's smallest subnormal / 2 */
        0x33c00000u, 0x387fc000u, 0x477ff000u, 0x477fe000u, /* f16 rounding near subnormals and near 65504 */
        0x7f7fffffu, 0xff7fffffu, 0x7f800000u, 0xff800000u, /* to inf in bf16 and f16; infs */
        0x7fc00001u, 0x7f800001u, 0xffbfffffu, 0x80000000u, /* NaNs (quiet, signalling, negative); -0 */
    };
    enum { NS = (int)(sizeof special / sizeof special[0]) };
    accel_device cpu = ACCEL_CPU_DEVICE;
    int64_t n = N;
    accel_tensor *p = accel_tensor_new(ACCEL_F32, 1, &n, cpu), *g = accel_tensor_new(ACCEL_F32, 1, &n, cpu);
    accel_tensor *m = accel_tensor_new(ACCEL_F32, 1, &n, cpu), *v = accel_tensor_new(ACCEL_F32, 1, &n, cpu);
    CHECK(p && g && m && v);
    memset(g->data, 0, accel_nbytes(g));
    memset(m->data, 0, accel_nbytes(m));
    memset(v->data, 0, accel_nbytes(v));
    uint32_t *bits = p->data;
    for (int64_t i = 0; i < n; i++)
        bits[i] = i % 3 ? special[i % NS] : 0x3f800000u + (uint32_t)(i * 2654435761u % 0x1000000u);
    const accel_dtype dts[] = {ACCEL_BF16, ACCEL_F16};
    for (int run = 0; run < 8; run++) {
        int d = run % 2, widened = run / 2 % 2;
        if (run == 4) /* then updates that move every weight: the copy is of the new values */
            for (int64_t i = 0; i < n; i++) ((float *)g->data)[i] = (float)((int)(i * 7919 % 2003) - 1001) * 1e-3f;
        accel_dtype dt = dts[d];
        accel_tensor *cast = accel_tensor_new(widened ? ACCEL_F32 : dt, 1, &n, cpu);
        accel_tensor *want = accel_tensor_new(widened ? ACCEL_F32 : dt, 1, &n, cpu);
        accel_tensor *rounded = accel_tensor_new(dt, 1, &n, cpu);
        CHECK(cast && want && rounded);
        accel_k_adam k = {.p = p, .g = g, .m = m, .v = v, .cast = cast, .cast_dt = dt, .lr = run < 4 ? 0.0 : 1e-2,
                          .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .step = 1 + run, .decoupled = true};
        CHECK(ACCEL_KERNEL("test_adam_cast", cpu, adam, &k) == ACCEL_OK);
        CHECK(accel_copy_(rounded, p) == ACCEL_OK);
        CHECK(!widened || accel_copy_(want, rounded) == ACCEL_OK);
        const void *w = widened ? want->data : rounded->data;
        CHECK_MSG(memcmp(cast->data, w, accel_nbytes(cast)) == 0, "run %d: %s%s copy differs from a conversion", run,
                  accel_dtype_name(dt), widened ? " widened" : "");
        accel_tensor_free(cast);
        accel_tensor_free(want);
        accel_tensor_free(rounded);
    }
    /* a copy rounded to a dtype that is not 16-bit: refused, not a stack overrun */
    accel_k_adam bad = {.p = p, .g = g, .m = m, .v = v, .cast = p, .cast_dt = ACCEL_F32, .lr = 1e-3, .beta1 = 0.9,
                        .beta2 = 0.999, .eps = 1e-8, .step = 9, .decoupled = true};
    CHECK(ACCEL_KERNEL("test_adam_cast", cpu, adam, &bad) == ACCEL_ERR_DTYPE);
    CHECK_STR_CONTAINS(accel_last_error(), "rounded to bfloat16 or float16, not float32");
    accel_tensor_free(p);
    accel_tensor_free(g);
    accel_tensor_free(m);
    accel_tensor_free(v);
}

/* The flat (ZeRO shard) form: two shards updated by two optimizers give the
 * same result as one optimizer over the whole buffer. */
static void test_flat_shards(void) {
    float whole[8], sharded[8], g[8];
    for (int i = 0; i < 8; i++) whole[i] = sharded[i] = P0[i % 4] * (1 + i / 4);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 0.01);
    accel_optimizer *all = flat_opt(ACCEL_OPTIM_ADAMW, whole, g, 8, &h);
    accel_optimizer *lo = flat_opt(ACCEL_OPTIM_ADAMW, sharded, g, 4, &h);
    accel_optimizer *hi = flat_opt(ACCEL_OPTIM_ADAMW, sharded + 4, g + 4, 4, &h);
    for (int s = 0; s < 3; s++) {
        for (int i = 0; i < 8; i++) g[i] = GRADS[s][i % 4] * (i < 4 ? 1.0f : -2.0f);
        CHECK(accel_optimizer_step(all) == ACCEL_OK);
        CHECK(accel_optimizer_step(lo) == ACCEL_OK);
        CHECK(accel_optimizer_step(hi) == ACCEL_OK);
    }
    CHECK(memcmp(whole, sharded, sizeof whole) == 0);
    accel_optimizer_zero_grad(lo);
    CHECK(g[3] == 0.0f && g[4] != 0.0f); /* a shard zeroes only its own range */
    accel_optimizer_free(all);
    accel_optimizer_free(lo);
    accel_optimizer_free(hi);
}

static void test_errors(void) {
    accel_clear_error();
    accel_tensor *p = accel_tensor_new(ACCEL_BF16, ACCEL_SHAPE(4), ACCEL_CPU_DEVICE);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 1e-3);
    CHECK(accel_optimizer_new_params(ACCEL_OPTIM_ADAMW, 1, &p, &h) == NULL);
    CHECK(accel_last_status() == ACCEL_ERR_DTYPE);
    CHECK_STR_CONTAINS(accel_last_error(), "bfloat16");
    accel_clear_error();
    accel_tensor_free(p);
    /* A step tensor dies at accel_step_reset: kept as a parameter, later steps
     * would update whatever the arena holds there then. */
    accel_tensor *sp = accel_zeros(ACCEL_F32, ACCEL_SHAPE(4));
    CHECK(accel_optimizer_new_params(ACCEL_OPTIM_ADAMW, 1, &sp, &h) == NULL);
    CHECK(accel_last_status() == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "step tensor");
    accel_clear_error();
    accel_step_reset();
    h.beta1 = 1.5;
    float x[2], g[2];
    CHECK(flat_opt(ACCEL_OPTIM_ADAM, x, g, 2, &h) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "betas");
    accel_clear_error();
    h = accel_optim_defaults(ACCEL_OPTIM_SGD, 0.1);
    h.nesterov = true;
    CHECK(flat_opt(ACCEL_OPTIM_SGD, x, g, 2, &h) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "nesterov");
    accel_clear_error();
    /* Non-finite values were taken: an inf lr (or weight decay, momentum,
     * eps; a NaN dampening) made every parameter NaN at the first steps,
     * silently, and its saved state was refused by load_state. */
    const struct { accel_optim_kind kind; accel_optim_hparams h; const char *why; } nonfinite[] = {
        {ACCEL_OPTIM_SGD, {.lr = INFINITY}, "lr must be a finite number > 0"},
        {ACCEL_OPTIM_ADAMW, {.lr = 0.1, .weight_decay = INFINITY}, "weight_decay must be a finite number"},
        {ACCEL_OPTIM_SGD, {.lr = 0.1, .momentum = INFINITY}, "momentum must be a finite number"},
        {ACCEL_OPTIM_SGD, {.lr = 0.1, .momentum = 0.9, .dampening = NAN}, "dampening must be a finite number"},
        {ACCEL_OPTIM_ADAM, {.lr = 0.1, .eps = INFINITY}, "eps must be a finite number"},
    };
    for (size_t k = 0; k < sizeof nonfinite / sizeof *nonfinite; k++) {
        CHECK(flat_opt(nonfinite[k].kind, x, g, 2, &nonfinite[k].h) == NULL);
        CHECK(accel_last_status() == ACCEL_ERR_INVALID_ARG);
        CHECK_STR_CONTAINS(accel_last_error(), nonfinite[k].why);
        accel_clear_error();
    }
    /* A flat segment is a pair of contiguous f32 tensors of one numel on one device. */
    h = accel_optim_defaults(ACCEL_OPTIM_SGD, 0.1);
    accel_tensor *tx = host_f32(x, 2), *tg1 = host_f32(g, 1), *bf = accel_tensor_new(ACCEL_BF16, ACCEL_SHAPE(2), ACCEL_CPU_DEVICE);
    CHECK(accel_optimizer_new_flat(ACCEL_OPTIM_SGD, tx, tg1, &h) == NULL);
    CHECK(accel_last_status() == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "same number of elements");
    CHECK(accel_optimizer_new_flat(ACCEL_OPTIM_SGD, tx, bf, &h) == NULL);
    CHECK(accel_last_status() == ACCEL_ERR_DTYPE);
    CHECK_STR_CONTAINS(accel_last_error(), "bfloat16");
    CHECK(accel_optimizer_new_flat(ACCEL_OPTIM_SGD, tx, NULL, &h) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "grads");
    CHECK(isnan(accel_grad_norm_partial(bf, 2.0)));
    CHECK_STR_CONTAINS(accel_last_error(), "accel_grad_norm_partial");
    accel_clear_error();
    accel_tensor_free(tx);
    accel_tensor_free(tg1);
    accel_tensor_free(bf);
    CHECK(accel_optim_kind_parse("AdamW") == ACCEL_OPTIM_ADAMW && accel_optim_kind_parse("lion") == -1);
}

/* A loaded state's group fields are in range together, not only each alone:
 * nesterov from one entry with a dampening from another was taken, and the
 * next step refused it as if the live hparams had been written badly. */
static void test_state_hparams_together(void) {
    float x[2] = {1, 2}, g[2] = {0.5f, -0.5f};
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_SGD, 0.1);
    h.momentum = 0.9;
    accel_optimizer *opt = flat_opt(ACCEL_OPTIM_SGD, x, g, 2, &h);
    CHECK(opt != NULL);
    accel_named_state both[] = {{"param_groups.0.nesterov", NULL, 1}, {"param_groups.0.dampening", NULL, 0.5}};
    CHECK(accel_optimizer_load_state(opt, 2, both) == ACCEL_ERR_FORMAT);
    CHECK_STR_CONTAINS(accel_last_error(), "param group 0 as loaded: nesterov momentum requires");
    accel_clear_error();
    CHECK(!accel_optimizer_hparams(opt, 0)->nesterov && accel_optimizer_hparams(opt, 0)->dampening == 0);
    CHECK(accel_optimizer_step(opt) == ACCEL_OK);
    /* each alone is fine: the check reads the group as the entries leave it */
    CHECK(accel_optimizer_load_state(opt, 1, &both[0]) == ACCEL_OK && accel_optimizer_hparams(opt, 0)->nesterov);
    accel_named_state off = {"param_groups.0.nesterov", NULL, 0};
    CHECK(accel_optimizer_load_state(opt, 1, &off) == ACCEL_OK);
    CHECK(accel_optimizer_load_state(opt, 1, &both[1]) == ACCEL_OK && accel_optimizer_step(opt) == ACCEL_OK);
    accel_optimizer_free(opt);
}

/* accel_optimizer_hparams hands out the live hyperparameters: a write that
 * switched SGD's momentum on was ignored by the step (no momentum_buffer)
 * and accel_optimizer_state then crashed on the missing buffer; one that
 * switched it off still applied the dampening; a NaN lr made every parameter
 * NaN. The step now refuses them, naming the group, and changes nothing. */
static void test_live_hparams(void) {
    float p[4] = {1.0f, 2.0f, 3.0f, 4.0f}, g[4] = {1.0f, 1.0f, 1.0f, 1.0f};
    accel_optim_hparams h = {.lr = 0.1};
    accel_optimizer *opt = flat_opt(ACCEL_OPTIM_SGD, p, g, 2, &h);
    h.momentum = 0.9;
    h.dampening = 0.5;
    CHECK(flat_add(opt, p + 2, g + 2, 2, &h) == 1);
    accel_optimizer_hparams(opt, 0)->momentum = 0.9; /* on */
    CHECK(accel_optimizer_step(opt) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "param group 0");
    CHECK_STR_CONTAINS(accel_last_error(), "momentum was switched on or off");
    accel_clear_error();
    CHECK(p[0] == 1.0f && accel_optimizer_step_count(opt) == 0);
    accel_named_state *st;
    int n = accel_optimizer_state(opt, &st); /* no crash, no momentum_buffer for group 0 */
    CHECK(n > 0);
    accel_named_state_free(st, n);
    accel_optimizer_hparams(opt, 0)->momentum = 0;
    accel_optimizer_hparams(opt, 1)->momentum = 0; /* off */
    CHECK(accel_optimizer_step(opt) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "param group 1");
    accel_clear_error();
    accel_optimizer_hparams(opt, 1)->momentum = 0.9;
    accel_optimizer_hparams(opt, 1)->lr = NAN;
    CHECK(accel_optimizer_step(opt) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "lr must be a finite number >= 0");
    accel_clear_error();
    CHECK(p[0] == 1.0f);
    accel_optimizer_hparams(opt, 1)->lr = 0; /* a schedule's end: taken */
    CHECK(accel_optimizer_step(opt) == ACCEL_OK);
    CHECK_CLOSE(p[0], 0.9, 1e-6, 0);
    /* A checkpoint's momentum is checked against the group's state, not the
     * live value: loading it back repairs a switched momentum. */
    n = accel_optimizer_state(opt, &st);
    accel_optimizer_hparams(opt, 1)->momentum = 0;
    CHECK(accel_optimizer_load_state(opt, n, st) == ACCEL_OK);
    CHECK(accel_optimizer_hparams(opt, 1)->momentum == 0.9);
    CHECK(accel_optimizer_step(opt) == ACCEL_OK);
    accel_named_state_free(st, n);
    accel_optimizer_free(opt);
    /* Adam: betas written out of [0, 1) are refused; beta1 0 (a field PyTorch takes) is not */
    opt = flat_opt(ACCEL_OPTIM_ADAM, p, g, 2, NULL);
    accel_optimizer_hparams(opt, 0)->beta2 = 1.0;
    CHECK(accel_optimizer_step(opt) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "betas must be in [0, 1)");
    accel_clear_error();
    accel_optimizer_hparams(opt, 0)->beta2 = 0.999;
    accel_optimizer_hparams(opt, 0)->beta1 = 0;
    CHECK(accel_optimizer_step(opt) == ACCEL_OK);
    accel_optimizer_free(opt);
}

/* A parameter given twice, in one group or in two, was updated twice per
 * step (lr 0.1, grad 1: 1 -> 0.8 instead of 0.9, silently); PyTorch refuses
 * it across groups. The refusal adds nothing. */
static void test_duplicate_params(void) {
    accel_tensor *p = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(2), ACCEL_CPU_DEVICE);
    accel_tensor *q = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(2), ACCEL_CPU_DEVICE);
    p->name = "w";
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_SGD, 0.1);
    accel_clear_error();
    CHECK(accel_optimizer_new_params(ACCEL_OPTIM_SGD, 3, (accel_tensor *[]){p, q, p}, &h) == NULL);
    CHECK(accel_last_status() == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "parameter 2 (\"w\") appears more than once");
    accel_clear_error();
    accel_optimizer *opt = accel_optimizer_new_params(ACCEL_OPTIM_SGD, 1, &p, &h);
    CHECK(opt && accel_optimizer_add_params(opt, 2, (accel_tensor *[]){q, p}, &h) == -1);
    CHECK_STR_CONTAINS(accel_last_error(), "already in param group 0");
    accel_clear_error();
    CHECK(accel_optimizer_num_groups(opt) == 1 && accel_optimizer_num_segments(opt) == 1);
    CHECK(accel_optimizer_add_params(opt, 1, &q, &h) == 1); /* q alone is new */
    accel_fill_(p, 1.0);
    p->grad = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(2), ACCEL_CPU_DEVICE);
    accel_fill_(p->grad, 1.0);
    CHECK(accel_optimizer_step(opt) == ACCEL_OK);
    CHECK_CLOSE(accel_get(p, (int64_t[]){0}), 0.9, 1e-6, 0);
    accel_optimizer_free(opt);
    accel_tensor_free(p);
    accel_tensor_free(q);
    /* Flat runs that share elements (a buffer added twice, two groups'
     * offsets computed wrong) updated those twice per step, silently: 1 ->
     * 0.8 at lr 0.1, grad 1. Refused, naming the segment; adjacent runs and
     * another optimizer over the same memory are fine. */
    float x[6] = {1, 1, 1, 1, 1, 1}, gx[6] = {1, 1, 1, 1, 1, 1};
    accel_optimizer *fo = flat_opt(ACCEL_OPTIM_SGD, x, gx, 4, &h);
    CHECK(flat_add(fo, x, gx, 4, &h) == -1);
    CHECK(accel_last_status() == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "overlap segment 0 (param group 0)");
    accel_clear_error();
    CHECK(flat_add(fo, x + 3, gx + 3, 3, &h) == -1);
    accel_clear_error();
    CHECK(flat_add(fo, x + 4, gx + 4, 2, &h) == 1);
    CHECK(accel_optimizer_num_segments(fo) == 2);
    CHECK(accel_optimizer_step(fo) == ACCEL_OK);
    for (int i = 0; i < 6; i++) CHECK_CLOSE(x[i], 0.9, 1e-6, 0);
    /* a parameter tensor that views a flat run already in the optimizer: the same */
    accel_tensor *view = host_f32(x + 1, 2);
    view->grad = host_f32(gx + 1, 2);
    CHECK(accel_optimizer_add_params(fo, 1, &view, &h) == -1);
    CHECK_STR_CONTAINS(accel_last_error(), "lies in the flat parameters of segment 0 (param group 0)");
    accel_clear_error();
    accel_tensor_free(view); /* and its grad */
    accel_optimizer *other = flat_opt(ACCEL_OPTIM_SGD, x, gx, 6, &h);
    CHECK(other != NULL);
    accel_optimizer_free(other);
    accel_optimizer_free(fo);
}

/* A NaN in a gradient makes the total norm NaN (torch: tensor(nan)), for
 * every norm_type: the inf-norm's max dropped the NaN (fmax) and returned 4
 * here, clipping the other gradients by it; the 2-norm returned NaN with no
 * error. Now NAN + an error naming it, the gradients untouched; an inf
 * gradient still gives an inf norm (clip coefficient 0, as torch). */
static void test_clip_nan(void) {
    const double types[] = {2.0, INFINITY, 1.0, 3.0};
    for (int t = 0; t < 4; t++)
        for (int form = 0; form < 2; form++) {
            float ga[3] = {NAN, 3.0f, -4.0f}, gb[1] = {0.5f}, x[4] = {0};
            accel_tensor *ps[2] = {host_f32(x, 3), host_f32(x + 3, 1)};
            ps[0]->grad = host_f32(ga, 3);
            ps[1]->grad = host_f32(gb, 1);
            accel_optimizer *opt = form ? accel_optimizer_new_params(ACCEL_OPTIM_SGD, 2, ps, NULL) : NULL;
            accel_clear_error();
            double total = form ? accel_optimizer_clip_grad_norm(opt, 1.0, types[t])
                                : accel_clip_grad_norm(2, ps, 1.0, types[t]);
            CHECK(isnan(total));
            CHECK(accel_last_status() == ACCEL_ERR_INVALID_ARG);
            CHECK_STR_CONTAINS(accel_last_error(), "the total gradient norm is nan");
            CHECK_STR_CONTAINS(accel_last_error(), form ? "accel_optimizer_clip_grad_norm" : "accel_clip_grad_norm");
            CHECK(ga[1] == 3.0f && ga[2] == -4.0f && gb[0] == 0.5f);
            accel_clear_error();
            ga[0] = INFINITY;
            total = form ? accel_optimizer_clip_grad_norm(opt, 1.0, types[t]) : accel_clip_grad_norm(2, ps, 1.0, types[t]);
            CHECK(isinf(total) && accel_last_status() == ACCEL_OK);
            CHECK(ga[1] == 0.0f && gb[0] == 0.0f);
            accel_optimizer_free(opt);
            accel_tensor_free(ps[0]); /* and its grad */
            accel_tensor_free(ps[1]);
        }
    /* the distributed pieces: a NaN partial is NaN (max kept it) */
    float g[3] = {1.0f, NAN, 2.0f};
    accel_tensor *tg = host_f32(g, 3);
    CHECK(isnan(accel_grad_norm_partial(tg, INFINITY)));
    accel_tensor_free(tg);
    /* and combined with others: NaN on either side (fmax kept the number) */
    CHECK(isnan(accel_grad_norm_combine(4.0, NAN, INFINITY)) && isnan(accel_grad_norm_combine(NAN, 4.0, INFINITY)));
    CHECK(accel_grad_norm_combine(4.0, 3.0, INFINITY) == 4.0 && accel_grad_norm_combine(4.0, 3.0, 2.0) == 7.0);
}

/* The one-element parameter p0 after `steps` steps of kind with hparams h
 * taken as given (written through accel_optimizer_hparams, where zero betas
 * and eps are values) on gradients g[0..steps); *state0 (may be NULL): its
 * exp_avg or momentum_buffer then. */
static float one_param(accel_optim_kind kind, const accel_optim_hparams *h, float p0, int steps, const float *g,
                       float *state0) {
    accel_tensor *p = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(1), ACCEL_CPU_DEVICE);
    p->grad = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(1), ACCEL_CPU_DEVICE);
    ((float *)p->data)[0] = p0;
    accel_optim_hparams made = *h;
    made.lr = 1.0; /* lr 0 is refused when a group is made, not at a step */
    accel_optimizer *opt = accel_optimizer_new_params(kind, 1, &p, &made);
    CHECK(opt != NULL);
    *accel_optimizer_hparams(opt, 0) = *h;
    for (int s = 0; s < steps; s++) {
        ((float *)p->grad->data)[0] = g[s];
        CHECK(accel_optimizer_step(opt) == ACCEL_OK);
    }
    float out = ((float *)p->data)[0];
    if (state0) *state0 = ((float *)opt->segs[0].state[0]->data)[0];
    accel_optimizer_free(opt);
    accel_tensor_free(p);
    return out;
}

/* Cases tools/sweep_optim.py found, minimized; the numbers are torch 2.15's
 * torch.optim.X([p], foreach=False, ...) after the same steps. */
static void test_torch_edges(void) {
    float m;
    /* Adam(lr=0.1, betas=(0, 0.999)), p 1, grad inf: exp_avg.lerp_(g, 1) is
     * g - (g - m) * 0 = NaN in torch (its form for a weight >= 0.5); m + 1 *
     * (g - m) gave inf */
    accel_optim_hparams h = {.lr = 0.1, .beta1 = 0.0, .beta2 = 0.999, .eps = 1e-8};
    CHECK(isnan(one_param(ACCEL_OPTIM_ADAM, &h, 1.0f, 1, (float[]){INFINITY}, &m)));
    CHECK(isnan(m));
    /* Adam(lr=0.1, weight_decay=0), p inf, grad 1: torch adds no wd * p (0 * inf
     * was NaN): p stays inf, exp_avg 0.1 */
    h = (accel_optim_hparams){.lr = 0.1, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
    CHECK(one_param(ACCEL_OPTIM_ADAM, &h, INFINITY, 1, (float[]){1.0f}, &m) == INFINITY);
    CHECK(m == 0.10000000149011612f);
    /* Adam(lr=1e-6, betas=(0.5, 0), eps=0), p 0, grad -1e-40 (subnormal):
     * addcdiv_ is p + (-step_size * m) / denom, the product underflows to 0
     * and 0 / 0 is NaN; -step_size * (m / 0) gave inf */
    h = (accel_optim_hparams){.lr = 1e-6, .beta1 = 0.5, .beta2 = 0.0, .eps = 0.0};
    CHECK(isnan(one_param(ACCEL_OPTIM_ADAM, &h, 0.0f, 1, (float[]){-1e-40f}, NULL)));
    /* Adam(lr=1e-3, weight_decay=100), p 1.2212764e37, grad -inf: grad.add(param,
     * alpha=100) is fused in torch, -inf; exp_avg -inf (unfused: NaN) */
    h = (accel_optim_hparams){.lr = 1e-3, .weight_decay = 100.0, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
    CHECK(isnan(one_param(ACCEL_OPTIM_ADAM, &h, 1.2212763918502001e37f, 1, (float[]){-INFINITY}, &m)));
    CHECK(m == -INFINITY);
    /* SGD(lr=1, momentum=0.9, dampening=0.9939949099411604), p 0, grads 1 then
     * 1000: -7.90509033203125 (1 - dampening in double, as torch's alpha; in
     * float it was off by 1e-5 relative) */
    h = (accel_optim_hparams){.lr = 1.0, .momentum = 0.9, .dampening = 0.9939949099411604};
    CHECK(one_param(ACCEL_OPTIM_SGD, &h, 0.0f, 2, (float[]){1.0f, 1000.0f}, NULL) == -7.90509033203125f);
    /* SGD(lr=1e-3, weight_decay=100), p 1.2212764e37, grad -inf: torch's fused
     * g + wd * p is -inf (the product, 1.2e39, is not rounded to inf), p inf;
     * unfused inf - inf was NaN */
    h = (accel_optim_hparams){.lr = 1e-3, .weight_decay = 100.0};
    CHECK(one_param(ACCEL_OPTIM_SGD, &h, 1.2212763918502001e37f, 1, (float[]){-INFINITY}, NULL) == INFINITY);
}

/* clip_grad_norm_ where |g|^p leaves float32's range (torch.nn.utils.clip_grad_norm_
 * on tensors with these grads, torch 2.15): torch's total is the f32 norm of
 * the f32 norms; the f64 sum of every |g|^p gave finite totals, and clipped. */
static void test_clip_float32_range(void) {
    const struct {
        int n[2];       /* elements of the (one or two) gradients */
        float g[3];     /* their values, in order */
        double max_norm, type, total;
        float after[3]; /* the gradients after */
    } cases[] = {
        {{2, 0}, {1e20f, 1e20f}, 1.0, 2.0, INFINITY, {0, 0}},            /* each |g|^2 is inf in f32 */
        {{2, 0}, {3e38f, 3e38f}, 1.0, 1.0, INFINITY, {0, 0}},            /* the f32 sum passes FLT_MAX */
        {{2, 0}, {0.5f, 0.5f}, 0.1, 1000.0, 0.0, {0.5f, 0.5f}},          /* 0.5^1000 is 0 in f32: no clip */
        {{2, 0}, {1e-30f, 1e-30f}, 1.0, 2.0, 0.0, {1e-30f, 1e-30f}},     /* so is (1e-30)^2 */
        {{1, 0}, {1.2e28f}, 1.0, 2.0, 1.1999999566661952e28, {0.9999999403953552f}}, /* one element: |g| */
        {{1, 1}, {1e20f, 1e20f}, 1.0, 2.0, INFINITY, {0, 0}},            /* the norms' squares are inf */
        {{1, 1}, {1.5e19f, 1.5e19f}, 1.0, 2.0, INFINITY, {0, 0}},        /* their f32 sum passes FLT_MAX */
        {{1, 1}, {3.0f, 4.0f}, 1.0, 2.0, 5.0, {0.5999999046325684f, 0.7999998331069946f}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        accel_tensor *ps[2] = {NULL, NULL};
        int n = cases[c].n[1] ? 2 : 1, k = 0;
        for (int t = 0; t < n; t++) {
            ps[t] = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(cases[c].n[t]), ACCEL_CPU_DEVICE);
            ps[t]->grad = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(cases[c].n[t]), ACCEL_CPU_DEVICE);
            for (int i = 0; i < cases[c].n[t]; i++) ((float *)ps[t]->grad->data)[i] = cases[c].g[k + i];
            k += cases[c].n[t];
        }
        double total = accel_clip_grad_norm(n, ps, cases[c].max_norm, cases[c].type);
        CHECK_MSG(total == cases[c].total || fabs(total - cases[c].total) <= 1e-6 * cases[c].total,
                  "case %zu: total %.17g, torch %.17g", c, total, cases[c].total);
        k = 0;
        for (int t = 0; t < n; t++)
            for (int i = 0; i < cases[c].n[t]; i++, k++)
                CHECK_MSG(((float *)ps[t]->grad->data)[i] == cases[c].after[k], "case %zu: grad %d is %.9g, torch %.9g",
                          c, k, ((float *)ps[t]->grad->data)[i], cases[c].after[k]);
        for (int t = 0; t < n; t++) accel_tensor_free(ps[t]);
    }
}

/* torch.nn.utils.clip_grad_norm_ on grads [3, -4, 1] and [2, -0.5], max_norm 1.5. */
static void test_clip(void) {
    const struct { double type, total; float a0, b1; } cases[] = {
        {2.0, 5.5, 0.8181817531585693f, -0.13636362552642822f},
        {INFINITY, 4.0, 1.124999761581421f, -0.18749995529651642f},
        {1.0, 10.5, 0.4285714030265808f, -0.0714285671710968f},
    };
    for (int c = 0; c < 3; c++) {
        accel_tensor *ps[2] = {accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(3), ACCEL_CPU_DEVICE),
                               accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(2), ACCEL_CPU_DEVICE)};
        ps[0]->grad = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(3), ACCEL_CPU_DEVICE);
        ps[1]->grad = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(2), ACCEL_CPU_DEVICE);
        memcpy(ps[0]->grad->data, (float[]){3, -4, 1}, 12);
        memcpy(ps[1]->grad->data, (float[]){2, -0.5f}, 8);
        double total;
        if (c == 1) { /* the optimizer form */
            accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_SGD, 0.1);
            accel_optimizer *opt = accel_optimizer_new_params(ACCEL_OPTIM_SGD, 2, ps, &h);
            total = accel_optimizer_clip_grad_norm(opt, 1.5, cases[c].type);
            accel_optimizer_free(opt);
        } else {
            total = accel_clip_grad_norm(2, ps, 1.5, cases[c].type);
        }
        CHECK_CLOSE(total, cases[c].total, 1e-12, 0);
        CHECK_CLOSE(((float *)ps[0]->grad->data)[0], cases[c].a0, 1e-6, 0);
        CHECK_CLOSE(((float *)ps[1]->grad->data)[1], cases[c].b1, 1e-6, 0);
        accel_tensor_free(ps[0]);
        accel_tensor_free(ps[1]);
    }
    /* Under the threshold nothing changes (coefficient clamped to 1). */
    float g[2] = {0.3f, 0.4f};
    accel_tensor *tg = host_f32(g, 2);
    double part = accel_grad_norm_partial(tg, 2.0);
    accel_tensor_free(tg);
    CHECK_CLOSE(accel_grad_norm_finish(part, 2.0), 0.5, 1e-7, 0);
    CHECK(accel_clip_coef(0.5, 1.0) == 1.0);
    CHECK(isnan(accel_clip_grad_norm(0, NULL, 1.0, -1.0)));
    accel_clear_error();
    /* n -1 (accel_module_parameters failed) returned 0 and clipped nothing; n 0 is an empty list */
    CHECK(isnan(accel_clip_grad_norm(-1, NULL, 1.0, 2.0)));
    CHECK_STR_CONTAINS(accel_last_error(), "n < 0 (got -1)");
    accel_clear_error();
    CHECK(accel_clip_grad_norm(0, NULL, 1.0, 2.0) == 0.0 && accel_last_status() == ACCEL_OK);
    /* A negative max_norm would flip every gradient, a NaN one skip clipping. */
    float gn[2] = {3.0f, -4.0f};
    accel_tensor *pn = host_f32(gn, 2);
    pn->grad = host_f32(gn, 2);
    CHECK(isnan(accel_clip_grad_norm(1, &pn, -1.0, 2.0)));
    CHECK(accel_last_status() == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "max_norm must be >= 0 (got -1)");
    accel_clear_error();
    CHECK(isnan(accel_clip_grad_norm(1, &pn, NAN, 2.0)));
    accel_clear_error();
    CHECK(((float *)pn->grad->data)[0] == 3.0f && ((float *)pn->grad->data)[1] == -4.0f); /* untouched */
    accel_optimizer *on = accel_optimizer_new_params(ACCEL_OPTIM_SGD, 1, &pn, NULL);
    CHECK(isnan(accel_optimizer_clip_grad_norm(on, -0.5, 2.0)));
    CHECK_STR_CONTAINS(accel_last_error(), "max_norm");
    accel_clear_error();
    CHECK(accel_clip_grad_norm(1, &pn, 0.0, 2.0) == 5.0); /* 0: every gradient zeroed */
    CHECK(((float *)pn->grad->data)[1] == 0.0f);
    accel_optimizer_free(on);
    accel_tensor_free(pn);
    test_clip_nan();
}

static double halve(int64_t step, void *ctx) { return *(double *)ctx / (double)(step + 1); }

/* Learning rates from transformers' get_*_schedule_with_warmup(opt(lr 0.5), 3, 10)
 * over 13 steps: get_last_lr() after construction, then after each step. */
static void test_schedulers(void) {
    const struct { accel_sched_kind kind; double lrs[13]; } cases[] = {
        {ACCEL_SCHED_LINEAR, {0, 0.166666666667, 0.333333333333, 0.5, 0.428571428571, 0.357142857143,
                              0.285714285714, 0.214285714286, 0.142857142857, 0.0714285714286, 0, 0, 0}},
        {ACCEL_SCHED_COSINE, {0, 0.166666666667, 0.333333333333, 0.5, 0.475242216976, 0.405872450465,
                              0.305630233489, 0.194369766511, 0.0941275495353, 0.0247577830244, 0,
                              0.0247577830244, 0.0941275495353}},
        {ACCEL_SCHED_CONSTANT_WARMUP, {0, 0.166666666667, 0.333333333333, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5,
                                       0.5, 0.5, 0.5, 0.5}},
        {ACCEL_SCHED_CONSTANT, {0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5}},
    };
    float x[2], g[2] = {0};
    for (int c = 0; c < 4; c++) {
        accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_SGD, 0.5);
        accel_optimizer *opt = flat_opt(ACCEL_OPTIM_SGD, x, g, 1, &h);
        accel_lr_scheduler *s = accel_lr_scheduler_new(opt, cases[c].kind, 3, 10);
        for (int i = 0; i < 13; i++) {
            CHECK_CLOSE(accel_lr_scheduler_get_lr(s, 0), cases[c].lrs[i], 1e-11, 1e-12);
            accel_lr_scheduler_step(s);
        }
        accel_lr_scheduler_free(s);
        accel_optimizer_free(opt);
    }
    CHECK(accel_sched_kind_parse("cosine") == ACCEL_SCHED_COSINE);
    CHECK(accel_sched_kind_parse("constant_with_warmup") == ACCEL_SCHED_CONSTANT_WARMUP);
    CHECK(accel_sched_kind_parse("polynomial") == -1);

    /* LambdaLR with a user function, two param groups with their own base lr. */
    accel_optimizer *opt = accel_optimizer_new(ACCEL_OPTIM_ADAMW);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 0.1);
    CHECK(flat_add(opt, x, g, 1, &h) == 0);
    h.lr = 0.2;
    h.weight_decay = 0;
    CHECK(flat_add(opt, x + 1, g + 1, 1, &h) == 1);
    double scale = 1.0;
    accel_lr_scheduler *s = accel_lr_scheduler_lambda(opt, halve, &scale);
    accel_lr_scheduler_step(s);
    accel_lr_scheduler_step(s);
    CHECK_CLOSE(accel_optimizer_get_lr(opt, 0), 0.1 / 3, 1e-15, 0);
    CHECK_CLOSE(accel_optimizer_get_lr(opt, 1), 0.2 / 3, 1e-15, 0);
    /* Scheduler state round trip into a fresh scheduler. */
    accel_named_state *st;
    int n = accel_lr_scheduler_state(s, &st);
    CHECK(n == 3 && strcmp(st[0].name, "last_epoch") == 0 && st[0].value == 2);
    accel_optimizer_set_lr(opt, -1, 0.2); /* a fresh run starts from these base lrs */
    accel_optimizer_hparams(opt, 0)->lr = 0.1;
    accel_lr_scheduler *s2 = accel_lr_scheduler_lambda(opt, halve, &scale);
    CHECK(accel_lr_scheduler_load_state(s2, n, st) == ACCEL_OK);
    CHECK(accel_lr_scheduler_last_epoch(s2) == 2);
    accel_lr_scheduler_step(s2);
    CHECK_CLOSE(accel_optimizer_get_lr(opt, 1), 0.2 / 4, 1e-15, 0);
    /* Values no scheduler saves are refused naming the entry, and nothing is
     * loaded: a last_epoch of 1e300 was cast to int64 (undefined), -3 or 2.5
     * kept, a base lr of -1 or inf scheduled every later lr; an entry before
     * a bad one was loaded. */
    accel_named_state bad[] = {{"last_epoch", NULL, 1e300},     {"last_epoch", NULL, -3},
                               {"last_epoch", NULL, 2.5},       {"base_lrs.0", NULL, -1},
                               {"base_lrs.1", NULL, INFINITY},
                               /* sscanf's %d wrapped 2^32 to group 0 and took " 1" */
                               {"base_lrs.4294967296", NULL, 7}, {"base_lrs. 1", NULL, 7},
                               {"base_lrs.2", NULL, 7},          {"base_lrs.", NULL, 7}};
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        accel_named_state two[2] = {{"last_epoch", NULL, 9}, bad[k]};
        CHECK(accel_lr_scheduler_load_state(s2, 2, two) == ACCEL_ERR_FORMAT);
        CHECK_STR_CONTAINS(accel_last_error(), bad[k].name);
        accel_clear_error();
        CHECK(accel_lr_scheduler_last_epoch(s2) == 3);
        CHECK_CLOSE(accel_optimizer_get_lr(opt, 1), 0.2 / 4, 1e-15, 0);
    }
    accel_named_state_free(st, n);
    /* An lr that is NaN, infinite or negative is refused, the lr unchanged:
     * set, it made every parameter NaN at the next step (or climbed the
     * loss), silently; 0 (a schedule's end) is taken. A lambda whose factor
     * gives one is refused by the step, which then does not count. */
    CHECK(accel_optimizer_set_lr(opt, 0, NAN) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "lr must be a finite number >= 0 (got nan)");
    CHECK(accel_optimizer_set_lr(opt, -1, -0.1) == ACCEL_ERR_INVALID_ARG);
    CHECK(accel_optimizer_set_lr(opt, 1, INFINITY) == ACCEL_ERR_INVALID_ARG);
    /* -1 is every group; another negative group set them all too, silently */
    CHECK(accel_optimizer_set_lr(opt, -2, 0.3) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "no param group -2");
    CHECK(accel_optimizer_set_lr(opt, 2, 0.3) == ACCEL_ERR_INVALID_ARG);
    accel_clear_error();
    CHECK_CLOSE(accel_optimizer_get_lr(opt, 1), 0.2 / 4, 1e-15, 0);
    CHECK(accel_optimizer_set_lr(opt, 1, 0) == ACCEL_OK && accel_optimizer_set_lr(opt, 1, 0.2 / 4) == ACCEL_OK);
    scale = NAN;
    CHECK(accel_lr_scheduler_step(s2) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_lr_scheduler: the factor nan at step 4");
    accel_clear_error();
    CHECK(accel_lr_scheduler_last_epoch(s2) == 3);
    CHECK_CLOSE(accel_optimizer_get_lr(opt, 1), 0.2 / 4, 1e-15, 0);
    scale = -1;
    CHECK(accel_lr_scheduler_lambda(opt, halve, &scale) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "the factor -1 at step 0");
    accel_clear_error();
    accel_lr_scheduler_free(s);
    accel_lr_scheduler_free(s2);
    accel_optimizer_free(opt);
}

/* AdamW state after 3 steps (PyTorch: exp_avg[0] = -0.0174, exp_avg_sq[3] =
 * 0.0011586801847442985, step 3); save, continue, and check that a restored
 * optimizer continues identically. */
static void test_state_roundtrip(void) {
    float p[4], p2[4], g[4];
    memcpy(p, P0, sizeof p);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 0.01);
    accel_optimizer *opt = flat_opt(ACCEL_OPTIM_ADAMW, p, g, 4, &h);
    accel_named_state *st;
    int n = accel_optimizer_state(opt, &st);
    CHECK(n == 7); /* step + 5 group fields + num_params: no per-parameter state before a step */
    accel_named_state_free(st, n);
    for (int s = 0; s < 3; s++) {
        memcpy(g, GRADS[s], sizeof g);
        accel_optimizer_step(opt);
    }
    n = accel_optimizer_state(opt, &st);
    CHECK(n == 10);
    CHECK(strcmp(st[0].name, "step") == 0 && st[0].value == 3);
    CHECK(strcmp(st[1].name, "state.0.step") == 0 && st[1].value == 3);
    CHECK(strcmp(st[2].name, "state.0.exp_avg") == 0 && st[2].t && accel_numel(st[2].t) == 4);
    CHECK_CLOSE(((float *)st[2].t->data)[0], -0.017400000244379044, 1e-6, 0);
    CHECK(strcmp(st[3].name, "state.0.exp_avg_sq") == 0);
    CHECK_CLOSE(((float *)st[3].t->data)[3], 0.0011586801847442985, 1e-6, 0);
    CHECK(strcmp(st[4].name, "param_groups.0.lr") == 0 && st[4].value == 0.01);
    CHECK(strcmp(st[9].name, "param_groups.0.num_params") == 0 && st[9].value == 1);

    /* Copy the tensors as a checkpoint would, and restore into a new optimizer. */
    accel_tensor *copies[2] = {accel_tensor_clone_persistent(st[2].t, ACCEL_CPU_DEVICE),
                               accel_tensor_clone_persistent(st[3].t, ACCEL_CPU_DEVICE)};
    accel_named_state saved[10];
    memcpy(saved, st, sizeof saved);
    saved[2].t = copies[0];
    saved[3].t = copies[1];
    memcpy(p2, p, sizeof p);
    h.lr = 0.5; /* overwritten by the saved param group */
    accel_optimizer *opt2 = flat_opt(ACCEL_OPTIM_ADAMW, p2, g, 4, &h);
    CHECK(accel_optimizer_load_state(opt2, n, saved) == ACCEL_OK);
    CHECK(accel_optimizer_get_lr(opt2, 0) == 0.01 && accel_optimizer_step_count(opt2) == 3);
    memcpy(g, GRADS[1], sizeof g);
    accel_optimizer_step(opt);
    accel_optimizer_step(opt2);
    CHECK(memcmp(p, p2, sizeof p) == 0);

    /* Errors name the entry, and leave the state as it was: every entry is
     * checked before any is written (the moments were zeroed first). */
    accel_named_state *kept;
    int nk = accel_optimizer_state(opt2, &kept);
    float m_before[4], v_before[4];
    CHECK(nk == 10 && accel_to_floats(kept[2].t, m_before) == ACCEL_OK && accel_to_floats(kept[3].t, v_before) == ACCEL_OK);
    accel_named_state_free(kept, nk);
    accel_tensor *wrong = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(3), ACCEL_CPU_DEVICE);
    saved[3].t = wrong; /* after the valid exp_avg */
    CHECK(accel_optimizer_load_state(opt2, n, saved) == ACCEL_ERR_FORMAT);
    CHECK_STR_CONTAINS(accel_last_error(), "state.0.exp_avg_sq");
    accel_clear_error();
    saved[3].t = copies[1];
    accel_named_state last_bad[11];
    memcpy(last_bad, saved, sizeof saved);
    last_bad[10] = (accel_named_state){"param_groups.0.beta1", NULL, 7};
    CHECK(accel_optimizer_load_state(opt2, 11, last_bad) == ACCEL_ERR_FORMAT);
    CHECK_STR_CONTAINS(accel_last_error(), "beta1");
    accel_clear_error();
    nk = accel_optimizer_state(opt2, &kept);
    float m_after[4], v_after[4];
    CHECK(nk == 10 && accel_to_floats(kept[2].t, m_after) == ACCEL_OK && accel_to_floats(kept[3].t, v_after) == ACCEL_OK);
    CHECK(kept[1].value == 4 && accel_optimizer_step_count(opt2) == 4);
    accel_named_state_free(kept, nk);
    CHECK_MSG(memcmp(m_before, m_after, sizeof m_after) == 0 && memcmp(v_before, v_after, sizeof v_after) == 0,
              "a failed load_state changed the moments");
    saved[2].t = wrong;
    CHECK(accel_optimizer_load_state(opt2, n, saved) == ACCEL_ERR_FORMAT);
    CHECK_STR_CONTAINS(accel_last_error(), "state.0.exp_avg");
    accel_clear_error();
    accel_named_state bogus = {"state.7.exp_avg", copies[0], 0};
    CHECK(accel_optimizer_load_state(opt2, 1, &bogus) == ACCEL_ERR_FORMAT);
    accel_clear_error();
    /* Values no optimizer could have saved were kept: Adam then diverged on a
     * beta1 of 7, a NaN step count was cast to int64. */
    accel_named_state out_of_range[] = {
        {"param_groups.0.beta1", NULL, 7},  {"param_groups.0.lr", NULL, -1}, {"param_groups.0.eps", NULL, NAN},
        {"param_groups.0.weight_decay", NULL, INFINITY}, {"state.0.step", NULL, NAN}, {"state.0.step", NULL, 1.5},
        {"step", NULL, -5},
    };
    for (size_t k = 0; k < sizeof out_of_range / sizeof *out_of_range; k++) {
        CHECK(accel_optimizer_load_state(opt2, 1, &out_of_range[k]) == ACCEL_ERR_FORMAT);
        CHECK_STR_CONTAINS(accel_last_error(), out_of_range[k].name);
        accel_clear_error();
    }
    CHECK(accel_optimizer_get_lr(opt2, 0) == 0.01 && accel_optimizer_hparams(opt2, 0)->beta1 == 0.9);
    /* its own state, as accel_optimizer_state hands it out (views of it),
     * loaded back: the moments and steps as they were (zeroed first, they
     * once read their own zeros) */
    nk = accel_optimizer_state(opt2, &kept);
    CHECK(nk == 10 && accel_optimizer_load_state(opt2, nk, kept) == ACCEL_OK);
    accel_named_state_free(kept, nk);
    nk = accel_optimizer_state(opt2, &kept);
    CHECK(nk == 10 && accel_to_floats(kept[2].t, m_after) == ACCEL_OK && accel_to_floats(kept[3].t, v_after) == ACCEL_OK);
    CHECK(kept[1].value == 4 && accel_optimizer_step_count(opt2) == 4);
    accel_named_state_free(kept, nk);
    CHECK_MSG(memcmp(m_before, m_after, sizeof m_after) == 0 && memcmp(v_before, v_after, sizeof v_after) == 0,
              "loading an optimizer's own state into it changed the moments");
    accel_named_state lr0 = {"param_groups.0.lr", NULL, 0}; /* a schedule that ended at 0 */
    CHECK(accel_optimizer_load_state(opt2, 1, &lr0) == ACCEL_OK && accel_optimizer_get_lr(opt2, 0) == 0);
    accel_tensor_free(wrong);
    accel_tensor_free(copies[0]);
    accel_tensor_free(copies[1]);
    accel_named_state_free(st, n);
    accel_optimizer_free(opt);
    accel_optimizer_free(opt2);
}

/* The state records which parameters each group holds (its count, as torch's
 * param_groups[g]["params"]): a state saved from groups [A, B], [C] loaded into
 * [A], [B, C] (same shapes) used to succeed and give B group 0's lr and weight
 * decay; it is refused as torch refuses it, naming the group and both counts,
 * with nothing written. A state saved before the counts were recorded still
 * loads (nothing to check). */
static void test_state_other_grouping(void) {
    accel_tensor *p[3];
    for (int k = 0; k < 3; k++) {
        p[k] = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(4), ACCEL_CPU_DEVICE);
        memcpy(p[k]->data, P0, sizeof P0);
        accel_requires_grad_(p[k], true);
        p[k]->grad = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(4), ACCEL_CPU_DEVICE);
        memcpy(p[k]->grad->data, GRADS[k], sizeof GRADS[k]);
    }
    accel_optim_hparams h1 = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 0.1), h2 = h1, h3 = h1, h4 = h1;
    h2.lr = 0.2;
    h2.weight_decay = 0;
    h3.lr = 0.3;
    h4.lr = 0.4;
    accel_optimizer *saved_opt = accel_optimizer_new(ACCEL_OPTIM_ADAMW);
    accel_optimizer *other = accel_optimizer_new(ACCEL_OPTIM_ADAMW);
    CHECK(accel_optimizer_add_params(saved_opt, 2, p, &h1) == 0);
    CHECK(accel_optimizer_add_params(saved_opt, 1, p + 2, &h2) == 1);
    CHECK(accel_optimizer_add_params(other, 1, p, &h3) == 0 && accel_optimizer_add_params(other, 2, p + 1, &h4) == 1);
    CHECK(accel_optimizer_step(saved_opt) == ACCEL_OK && accel_optimizer_step(other) == ACCEL_OK);
    accel_named_state *st;
    int n = accel_optimizer_state(saved_opt, &st);
    int found = 0;
    for (int e = 0; e < n; e++) {
        if (!strcmp(st[e].name, "param_groups.0.num_params")) found += st[e].value == 2;
        if (!strcmp(st[e].name, "param_groups.1.num_params")) found += st[e].value == 1;
    }
    CHECK_MSG(found == 2, "the state records each group's parameter count");

    accel_named_state *before;
    int nb = accel_optimizer_state(other, &before);
    float m_before[4], m_after[4];
    int m1 = -1;
    for (int e = 0; e < nb; e++)
        if (!strcmp(before[e].name, "state.1.exp_avg")) m1 = e;
    CHECK(m1 >= 0 && accel_to_floats(before[m1].t, m_before) == ACCEL_OK);
    CHECK(accel_optimizer_load_state(other, n, st) == ACCEL_ERR_FORMAT);
    CHECK_STR_CONTAINS(accel_last_error(), "param group 0 holds 2 parameters in the saved state, 1 in this optimizer");
    accel_clear_error();
    CHECK(accel_optimizer_get_lr(other, 0) == 0.3 && accel_optimizer_get_lr(other, 1) == 0.4);
    CHECK(accel_optimizer_hparams(other, 1)->weight_decay == h4.weight_decay);
    CHECK(accel_to_floats(before[m1].t, m_after) == ACCEL_OK && memcmp(m_before, m_after, sizeof m_after) == 0);
    CHECK(accel__optimizer_check_state(other, n, st) == ACCEL_ERR_FORMAT);
    accel_clear_error();
    accel_named_state_free(before, nb);

    /* the same state without the counts (as saved before they were
     * recorded) loads, as it always did: nothing tells the groupings apart */
    accel_named_state *old = accel_calloc((size_t)n, sizeof *old);
    int no = 0;
    for (int e = 0; e < n; e++)
        if (!strstr(st[e].name, ".num_params")) old[no++] = st[e];
    CHECK(no == n - 2);
    CHECK(accel_optimizer_load_state(other, no, old) == ACCEL_OK);
    CHECK(accel_optimizer_get_lr(other, 0) == 0.1 && accel_optimizer_get_lr(other, 1) == 0.2);
    accel_free(old);

    /* the same grouping loads; counts for fewer groups than the optimizer
     * has, or no whole number, are refused naming them */
    accel_optimizer *same = accel_optimizer_new(ACCEL_OPTIM_ADAMW);
    CHECK(accel_optimizer_add_params(same, 2, p, &h3) == 0 && accel_optimizer_add_params(same, 1, p + 2, &h4) == 1);
    CHECK(accel_optimizer_load_state(same, n, st) == ACCEL_OK && accel_optimizer_get_lr(same, 1) == 0.2);
    accel_named_state one = {"param_groups.0.num_params", NULL, 2};
    CHECK(accel_optimizer_load_state(same, 1, &one) == ACCEL_ERR_FORMAT);
    CHECK_STR_CONTAINS(accel_last_error(), "records 1 param group, this optimizer has 2");
    accel_clear_error();
    accel_named_state frac[2] = {{"param_groups.0.num_params", NULL, 1.5}, {"param_groups.1.num_params", NULL, 1}};
    CHECK(accel_optimizer_load_state(same, 2, frac) == ACCEL_ERR_FORMAT);
    CHECK_STR_CONTAINS(accel_last_error(), "param_groups.0.num_params");
    accel_clear_error();
    accel_named_state beyond = {"param_groups.2.num_params", NULL, 0};
    CHECK(accel_optimizer_load_state(same, 1, &beyond) == ACCEL_ERR_FORMAT);
    CHECK_STR_CONTAINS(accel_last_error(), "param_groups.2.num_params");
    accel_clear_error();
    accel_named_state_free(st, n);
    accel_optimizer_free(same);
    accel_optimizer_free(saved_opt);
    accel_optimizer_free(other);
    for (int k = 0; k < 3; k++) accel_tensor_free(p[k]);
}

/* Flat segments on a device the host cannot address (hostless:0) give what
 * the same segments give on the cpu, bit for bit (the same kernels): AdamW
 * and SGD with momentum over two groups, clipping, the norm partial, zero_grad
 * and the state views. Any host access to the device memory would fault. */
static void test_flat_on_device(void) {
    if (accel_device_count(ACCEL_DEV_HOSTLESS) < 1) CHECK(accel__hostless_register(1) == ACCEL_OK);
    accel_device dev = {ACCEL_DEV_HOSTLESS, 0};
    for (int kind = ACCEL_OPTIM_SGD; kind <= ACCEL_OPTIM_ADAMW; kind++) {
        float hp[8], hg[8], got[8];
        for (int i = 0; i < 8; i++) hp[i] = P0[i % 4] * (1 + i / 4);
        accel_tensor *dp = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(8), dev);
        accel_tensor *dg = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(8), dev);
        CHECK(accel_tensor_from_host(dp, hp) == ACCEL_OK);
        accel_optim_hparams h = accel_optim_defaults((accel_optim_kind)kind, 0.05);
        h.momentum = 0.9;
        h.weight_decay = 0.01;
        accel_optimizer *host = flat_opt((accel_optim_kind)kind, hp, hg, 5, &h);
        CHECK(flat_add(host, hp + 5, hg + 5, 3, &h) == 1);
        accel_optimizer *on_dev = accel_optimizer_new((accel_optim_kind)kind);
        int64_t five = 5, three = 3, one = 1;
        accel_tensor *p_lo = accel_view_raw(dp, 1, &five, &one, 0), *g_lo = accel_view_raw(dg, 1, &five, &one, 0);
        accel_tensor *p_hi = accel_view_raw(dp, 1, &three, &one, 5), *g_hi = accel_view_raw(dg, 1, &three, &one, 5);
        CHECK(accel_optimizer_add_flat(on_dev, p_lo, g_lo, &h) == 0);
        CHECK(accel_optimizer_add_flat(on_dev, p_hi, g_hi, &h) == 1);
        accel_step_reset(); /* the views' headers expire; the optimizer kept views of the memory */
        for (int s = 0; s < 3; s++) {
            for (int i = 0; i < 8; i++) hg[i] = GRADS[s][i % 4] * (i < 4 ? 1.0f : -2.0f);
            CHECK(accel_tensor_from_host(dg, hg) == ACCEL_OK);
            double nh = accel_optimizer_clip_grad_norm(host, 0.5, 2.0);
            double nd = accel_optimizer_clip_grad_norm(on_dev, 0.5, 2.0);
            CHECK_MSG(nh == nd, "step %d: norm %.17g on the cpu, %.17g on hostless:0", s, nh, nd);
            accel_tensor *th = host_f32(hg, 8); /* the clipped gradients, on both sides */
            CHECK(accel_grad_norm_partial(dg, INFINITY) == accel_grad_norm_partial(th, INFINITY));
            CHECK(accel_grad_norm_partial(dg, 2.0) == accel_grad_norm_partial(th, 2.0));
            accel_tensor_free(th);
            CHECK(accel_optimizer_step(host) == ACCEL_OK);
            CHECK_MSG(accel_optimizer_step(on_dev) == ACCEL_OK, "%s", accel_last_error());
        }
        CHECK(accel_tensor_to_host(dp, got) == ACCEL_OK);
        CHECK_MSG(memcmp(got, hp, sizeof got) == 0, "%s: the device update differs from the cpu's",
                  accel_optim_kind_name((accel_optim_kind)kind));
        accel_named_state *sh, *sd;
        int nh = accel_optimizer_state(host, &sh), nd = accel_optimizer_state(on_dev, &sd);
        CHECK(nh == nd && nh > 0);
        for (int i = 0; i < nh && nh == nd; i++) {
            CHECK(strcmp(sh[i].name, sd[i].name) == 0);
            if (!sh[i].t) continue;
            CHECK(sd[i].t && accel_device_eq(sd[i].t->device, dev));
            float a[8], b[8];
            CHECK(accel_to_floats(sh[i].t, a) == ACCEL_OK && accel_to_floats(sd[i].t, b) == ACCEL_OK);
            CHECK_MSG(memcmp(a, b, (size_t)accel_numel(sh[i].t) * sizeof(float)) == 0, "%s differs", sh[i].name);
        }
        accel_named_state_free(sh, nh);
        accel_named_state_free(sd, nd);
        CHECK(accel_optimizer_zero_grad(on_dev) == ACCEL_OK);
        CHECK(accel_grad_norm_partial(dg, 1.0) == 0.0);
        accel_optimizer_free(host);
        accel_optimizer_free(on_dev);
        accel_tensor_free(dp);
        accel_tensor_free(dg);
        accel_step_reset();
    }
}

/* A model moved to a device after its optimizer was made over it: the
 * optimizer's state (made with the optimizer, in host memory) follows the
 * parameters at the next step, and the updates equal the cpu's. */
static void test_state_follows_moved_params(void) {
    if (accel_device_count(ACCEL_DEV_HOSTLESS) < 1) CHECK(accel__hostless_register(1) == ACCEL_OK);
    accel_device dev = {ACCEL_DEV_HOSTLESS, 0};
    accel_tensor *pc = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(4), ACCEL_CPU_DEVICE);
    accel_tensor *pd = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(4), ACCEL_CPU_DEVICE);
    CHECK(accel_tensor_from_host(pc, P0) == ACCEL_OK && accel_tensor_from_host(pd, P0) == ACCEL_OK);
    pc->requires_grad = pd->requires_grad = true;
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 0.05);
    accel_optimizer *oc = accel_optimizer_new_params(ACCEL_OPTIM_ADAMW, 1, &pc, &h);
    accel_optimizer *od = accel_optimizer_new_params(ACCEL_OPTIM_ADAMW, 1, &pd, &h);
    CHECK(oc && od && accel_tensor_to_device_(pd, dev) == ACCEL_OK); /* after the optimizer: its state is on the cpu */
    for (int s = 0; s < 3; s++) {
        accel_tensor *g[2] = {pc, pd};
        for (int k = 0; k < 2; k++) {
            accel_tensor *gk = accel_to_device(accel_from_floats(ACCEL_SHAPE(4), GRADS[s]), g[k]->device);
            CHECK(gk && accel_grad_accumulate(g[k], gk) == ACCEL_OK);
        }
        CHECK(accel_optimizer_step(oc) == ACCEL_OK);
        CHECK_MSG(accel_optimizer_step(od) == ACCEL_OK, "step %d on the moved parameter: %s", s, accel_last_error());
        accel_optimizer_zero_grad(oc);
        accel_optimizer_zero_grad(od);
        accel_step_reset();
    }
    float a[4], b[4];
    CHECK(accel_tensor_to_host(pc, a) == ACCEL_OK && accel_tensor_to_host(pd, b) == ACCEL_OK && !memcmp(a, b, sizeof a));
    accel_optimizer_free(oc);
    accel_optimizer_free(od);
    accel_tensor_free(pc);
    accel_tensor_free(pd);
}

int main(void) {
    RUN(test_sgd);
    RUN(test_adam_adamw);
    RUN(test_adam_bits);
    RUN(test_adam_cast);
    RUN(test_flat_shards);
    RUN(test_errors);
    RUN(test_duplicate_params);
    RUN(test_live_hparams);
    RUN(test_clip);
    RUN(test_torch_edges);
    RUN(test_clip_float32_range);
    RUN(test_schedulers);
    RUN(test_state_roundtrip);
    RUN(test_state_hparams_together);
    RUN(test_state_other_grouping);
    RUN(test_flat_on_device);
    RUN(test_state_follows_moved_params);
    accel_thread_cleanup();
    return check_summary();
}
