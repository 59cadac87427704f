/* The Accelerator on its device (ctest runs it on hostless:0 under `accel launch
 * --num_processes 2` and 3, and plainly on the cpu): the device
 * ACCEL_DEFAULT_DEVICE names, DDP and ZeRO-1/2/3 training with clipping (and
 * accumulation, and stage 3's optimizer offload) equal to one cpu process on
 * the global batch (losses, grad norms, weights), stage 3 under bf16 equal to
 * the same run on the cpu, collectives on device tensors, checkpoint
 * save/resume under DDP and ZeRO-1/2/3 (sharded and full state dicts,
 * save_model), and stage 3's parameter offload (shards on the host). On
 * hostless any host dereference of device memory faults, and a host pointer
 * given to its kernels or copies is an error, so passing proves the DDP
 * buffers, the ZeRO shards, full buffers and optimizer state and the
 * collectives go through the backend and its copies; the optimizer state is
 * checked to lie on the device (on the host under offload). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "accel/accel.h"
#include "accel/accelerator.h"
#include "accel/dist.h"
#include "accelerator/accelerator_internal.h" /* stage 3's prefetch count */
#include "accelerator/zero_state.h" /* the ZeRO state of a prepared model */
#include "backends/hostless/hostless.h" /* a device allocation made to fail */
#include "check.h"
#include "params_host.h"

static int N, R;
static accel_accelerator *A;
static accel_device DEV;

static accel_module *mlp(accel_device dev) {
    accel_module *l[3] = {accel_linear_new(4, 8, true, dev, ACCEL_F32), accel_relu_module_new(),
                          accel_linear_new(8, 1, true, dev, ACCEL_F32)};
    return accel_sequential_new(3, l);
}

/* One group over every parameter: SGD (lr, momentum) or AdamW (lr, its default decay). */
static accel_optimizer *optimizer(accel_module *m, accel_optim_kind kind, double lr, double momentum) {
    accel_tensor **ps;
    int n = accel_module_parameters(m, &ps);
    accel_optim_hparams h = accel_optim_defaults(kind, lr);
    h.momentum = momentum;
    accel_optimizer *o = accel_optimizer_new_params(kind, n, ps, &h);
    accel_free(ps);
    return o;
}

static accel_optimizer *sgd(accel_module *m, double lr, double momentum) {
    return optimizer(m, ACCEL_OPTIM_SGD, lr, momentum);
}

/* The n x 4 features and n targets of a fixed data set, on dev. */
static accel_tensor *data_x(int64_t lo, int64_t n, accel_device dev) {
    float *x = malloc((size_t)n * 4 * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        for (int j = 0; j < 4; j++) x[i * 4 + j] = (float)(((lo + i) * 7 + j * 3) % 11) / 11.0f - 0.5f;
    accel_tensor *t = accel_to_device(accel_from_floats(ACCEL_SHAPE(n, 4), x), dev);
    free(x);
    return t;
}

static accel_tensor *data_y(int64_t lo, int64_t n, accel_device dev) {
    float *y = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) y[i] = (float)((lo + i) % 5) * 0.2f - 0.4f;
    accel_tensor *t = accel_to_device(accel_from_floats(ACCEL_SHAPE(n, 1), y), dev);
    free(y);
    return t;
}

static void copy_params(accel_module *dst, accel_module *src) {
    accel_tensor **pd, **ps;
    int n = accel_module_parameters(dst, &pd);
    accel_module_parameters(src, &ps);
    for (int i = 0; i < n; i++) CHECK(accel_copy_(pd[i], ps[i]) == ACCEL_OK);
    accel_free(pd);
    accel_free(ps);
}

static void test_device_from_environment(void) {
    const char *want = getenv("ACCEL_DEFAULT_DEVICE");
    char got[32];
    accel_device_str(DEV, got, sizeof got);
    const char *expect = want && *want ? want : "cpu";
    CHECK_MSG(strcmp(got, expect) == 0, "accel_accelerator_device: %s, want %s", got, expect);
}

/* Device placement, as Accelerate's prepare: a model made in host memory
 * moves to the accelerator's device (the optimizer made over it before
 * follows, its state too) and a prepared loader's batches come there, so a
 * program written for the cpu trains on the device unchanged; with
 * no_device_placement both stay on the cpu; a loader detached from the
 * accelerator (freed) gives host batches again. */
static void test_prepare_places_model_and_batches(void) {
    float xs[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    accel_tensor *fields[1] = {accel_from_floats(ACCEL_SHAPE(8, 1), xs)};
    accel_dataset *ds = accel_tensor_dataset_new(1, fields);
    for (int placed = 0; placed < 2; placed++) {
        accel_accelerator_opts o = accel_accelerator_opts_default();
        o.no_device_placement = !placed;
        accel_accelerator *acc = accel_accelerator_new(&o);
        accel_dataloader_opts lo = accel_dataloader_opts_default();
        lo.batch_size = 2;
        accel_dataloader *dl = accel_dataloader_new(ds, &lo);
        accel_module *model = accel_linear_new(1, 1, true, ACCEL_CPU_DEVICE, ACCEL_F32);
        accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 0.1);
        accel_optimizer *opt = accel_optimizer_new_module(ACCEL_OPTIM_ADAMW, model, &h);
        CHECK(acc && dl && accel_accelerator_prepare(acc, model, opt, dl, NULL) == ACCEL_OK);
        accel_device want = placed ? accel_accelerator_device(acc) : ACCEL_CPU_DEVICE;
        accel_tensor *w = accel_module_get_tensor(model, "weight");
        CHECK(w && accel_device_eq(w->device, want));
        accel_batch b;
        CHECK(accel_dataloader_next(dl, &b) && accel_device_eq(b.fields[0]->device, want));
        float got[2];
        CHECK(accel_tensor_to_host(b.fields[0], got) == ACCEL_OK && got[0] == xs[2 * R] && got[1] == xs[2 * R + 1]);
        accel_tensor *loss = accel_mean_all(accel_module_call(model, b.fields[0]));
        CHECK_MSG(accel_accelerator_backward(acc, loss) == ACCEL_OK &&
                      accel_accelerator_optimizer_step(acc, opt) == ACCEL_OK,
                  "a step on the placed model: %s", accel_last_error());
        accel_step_reset();
        accel_accelerator_free(acc);
        accel_optimizer_free(opt);
        accel_module_free(model);
        accel_step_reset();
        CHECK(accel_dataloader_set_epoch(dl, 0) == ACCEL_OK && accel_dataloader_next(dl, &b) &&
              b.fields[0]->device.type == ACCEL_DEV_CPU);
        accel_dataloader_free(dl);
        accel_step_reset();
    }
    accel_dataset_free(ds);
}

/* The optimizer listed before its model in one prepare call (Accelerate
 * takes the objects in any order), and prepared by its own call before the
 * model's: the model's placement moves the state of the optimizers the
 * accelerator already prepared, so the step runs on the device. */
/* A placement that fails half-way (the device full after the weight moved,
 * at the bias) is undone: prepare fails naming the out-of-memory, the model
 * is whole in host memory again, and a retry places it. On hostless only
 * (the cpu places nothing). */
static void test_failed_placement_is_undone(void) {
    if (DEV.type != ACCEL_DEV_HOSTLESS) return;
    accel_accelerator *acc = accel_accelerator_new(NULL);
    accel_module *m = accel_linear_new(4, 3, true, ACCEL_CPU_DEVICE, ACCEL_F32);
    accel_tensor *w = accel_module_get_tensor(m, "weight"), *b = accel_module_get_tensor(m, "bias");
    CHECK(acc && w && b);
    accel__hostless_alloc_fail_at(2);
    CHECK(accel_accelerator_prepare(acc, m, NULL) != ACCEL_OK && accel_last_status() == ACCEL_ERR_OOM);
    accel__hostless_alloc_fail_at(0);
    CHECK(w->device.type == ACCEL_DEV_CPU && b->device.type == ACCEL_DEV_CPU);
    CHECK_MSG(accel_accelerator_prepare(acc, m, NULL) == ACCEL_OK, "%s", accel_last_error());
    CHECK(accel_device_eq(w->device, DEV) && accel_device_eq(b->device, DEV));
    accel_accelerator_free(acc);
    accel_module_free(m);
    accel_step_reset();
}

static void test_prepare_optimizer_before_model(void) {
    for (int separate = 0; separate < 2; separate++) {
        accel_accelerator_opts o = accel_accelerator_opts_default();
        accel_accelerator *acc = accel_accelerator_new(&o);
        accel_module *model = accel_linear_new(1, 1, true, ACCEL_CPU_DEVICE, ACCEL_F32);
        accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 0.1);
        accel_optimizer *opt = accel_optimizer_new_module(ACCEL_OPTIM_ADAMW, model, &h);
        CHECK(acc && model && opt);
        if (separate)
            CHECK(accel_accelerator_prepare_optimizer(acc, opt) == ACCEL_OK &&
                  accel_accelerator_prepare_model(acc, model) == ACCEL_OK);
        else
            CHECK(accel_accelerator_prepare(acc, opt, model) == ACCEL_OK);
        accel_tensor *w = accel_module_get_tensor(model, "weight");
        CHECK(w && accel_device_eq(w->device, accel_accelerator_device(acc)));
        float xs[2] = {1, 2};
        accel_tensor *x = accel_to_device(accel_from_floats(ACCEL_SHAPE(2, 1), xs), accel_accelerator_device(acc));
        accel_tensor *loss = accel_mean_all(accel_module_call(model, x));
        CHECK_MSG(accel_accelerator_backward(acc, loss) == ACCEL_OK &&
                      accel_accelerator_optimizer_step(acc, opt) == ACCEL_OK,
                  "a step with the optimizer prepared first (%s): %s", separate ? "two calls" : "one call",
                  accel_last_error());
        accel_step_reset();
        accel_accelerator_free(acc);
        accel_optimizer_free(opt);
        accel_module_free(model);
        accel_step_reset();
    }
}

/* An accelerator of this launch: ZeRO stage `stage` (0: DDP), its gradient
 * accumulation, mixed precision, optimizer and parameter offload devices and
 * fsdp state-dict type (0 / NULL: the defaults), on the cpu when `cpu`. */
typedef struct acc_cfg {
    int stage, accum;
    const char *mp, *offload_optimizer, *offload_param, *state_dict_type;
    bool cpu;
} acc_cfg;

static accel_accelerator *accelerator_with(acc_cfg c) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.mixed_precision = c.mp ? c.mp : "no";
    o.bucket_cap_bytes = 64; /* several buckets even for this small model */
    o.zero_stage = c.stage;
    o.gradient_accumulation_steps = c.accum;
    o.offload_optimizer_device = c.offload_optimizer;
    o.offload_param_device = c.offload_param;
    o.fsdp_state_dict_type = c.state_dict_type;
    o.cpu = c.cpu;
    accel_accelerator *acc = accel_accelerator_new(&o);
    CHECK_MSG(acc != NULL, "%s", accel_last_error());
    return acc;
}

static accel_accelerator *accelerator(int stage) { return accelerator_with((acc_cfg){.stage = stage}); }

/* mlp on dev with the weights seed gives on the cpu (the same on every device). */
static accel_module *mlp_seeded(accel_device dev, uint64_t seed) {
    accel_manual_seed(seed);
    accel_module *init = mlp(ACCEL_CPU_DEVICE);
    if (dev.type == ACCEL_DEV_CPU) return init;
    accel_module *m = mlp(dev);
    copy_params(m, init);
    accel_module_free(init);
    return m;
}

enum { STEPS = 3, MB = 4 /* samples per rank and micro-batch */, MAXW = 64 };

/* A training run: each step's loss (the mean over ranks and micro-batches)
 * and clipped gradient norm, the weights after each step (w[s], read where
 * the model holds them: not under ZeRO-3) and at the end (w[STEPS], after
 * accel_accelerator_clear gave a ZeRO-3 model its full weights back). */
typedef struct run_out {
    double loss[STEPS], norm[STEPS];
    float w[STEPS + 1][MAXW];
    int64_t n;
} run_out;

/* Every tensor of opt's state lies on `home` (the shard's device, or the host under offload_optimizer cpu). */
static void check_state_home(accel_optimizer *opt, accel_device home, const char *what) {
    accel_named_state *st = NULL;
    int n = accel_optimizer_state(opt, &st), tensors = 0;
    CHECK(n >= 0);
    for (int e = 0; e < n; e++) {
        if (!st[e].t) continue;
        tensors++;
        char got[32], want[32];
        accel_device_str(st[e].t->device, got, sizeof got);
        accel_device_str(home, want, sizeof want);
        CHECK_MSG(!strcmp(got, want), "%s: optimizer state %s on %s, want %s", what, st[e].name, got, want);
    }
    CHECK_MSG(tensors > 0, "%s: no optimizer state", what);
    if (n >= 0) accel_named_state_free(st, n);
}

/* Training through acc on N ranks with MB samples each per micro-batch: rank
 * R's micro-batch k of step s is the (k * N + R)-th slice of the step's
 * global batch. Rank R starts from its own weights (prepare broadcasts rank
 * 0's). */
static void train_through(accel_accelerator *acc, accel_device dev, accel_optim_kind kind, double lr,
                          accel_device state_home, run_out *out, const char *what) {
    int accum = accel_accelerator_gradient_accumulation_steps(acc);
    bool sharded_params = accel_accelerator_zero_stage(acc) == 3;
    accel_module *model = mlp_seeded(dev, 100 + (uint64_t)R);
    accel_optimizer *opt = optimizer(model, kind, lr, 0.0);
    CHECK_MSG(accel_accelerator_prepare(acc, model, opt, NULL, NULL) == ACCEL_OK, "%s: %s", what, accel_last_error());
    for (int64_t s = 0; s < STEPS; s++) {
        out->loss[s] = 0;
        for (int k = 0; k < accum; k++) {
            CHECK(accel_accelerator_accumulate(acc) == ACCEL_OK);
            int64_t at = ((s * accum + k) * N + R) * MB;
            accel_tensor *loss = accel_mse_loss(accel_module_call(model, data_x(at, MB, dev)), data_y(at, MB, dev));
            CHECK(loss && loss->device.type == dev.type);
            accel_tensor *mean_loss = accel_accelerator_reduce(acc, loss, "mean", 1.0);
            CHECK(mean_loss != NULL);
            if (mean_loss) out->loss[s] += accel_item(mean_loss) / accum;
            CHECK_MSG(accel_accelerator_backward(acc, loss) == ACCEL_OK, "%s: %s", what, accel_last_error());
            if (accel_accelerator_sync_gradients(acc)) out->norm[s] = accel_accelerator_clip_grad_norm(acc, model, 0.05, 2.0);
            CHECK_MSG(accel_accelerator_optimizer_step(acc, opt) == ACCEL_OK, "%s: %s", what, accel_last_error());
            CHECK(accel_accelerator_zero_grad(acc, opt) == ACCEL_OK);
            accel_step_reset();
        }
        if (!sharded_params) out->n = params_to_host(model, out->w[s], MAXW);
    }
    if (kind == ACCEL_OPTIM_ADAMW) check_state_home(opt, state_home, what); /* (SGD without momentum keeps none) */
    if (sharded_params) { /* the prefetch settings (ACCEL_FSDP_*_PREFETCH in the environment) reach the device path */
        bool prefetching = acc->fsdp.forward_prefetch || acc->fsdp.backward_prefetch;
        int64_t started = accel__zero_of(accel__find_model(acc, model))->prefetches;
        CHECK_MSG(prefetching == (started > 0), "%s: %lld prefetch gathers, forward_prefetch %d backward_prefetch %d",
                  what, (long long)started, (int)acc->fsdp.forward_prefetch, (int)acc->fsdp.backward_prefetch);
    }
    CHECK_MSG(accel_accelerator_clear(acc) == ACCEL_OK, "%s", accel_last_error());
    out->n = params_to_host(model, out->w[STEPS], MAXW);
    accel_optimizer_free(opt);
    accel_module_free(model);
    accel_step_reset();
}

/* The same steps on one cpu process over each step's whole global batch (mse mean). */
static void train_reference(accel_optim_kind kind, double lr, int accum, run_out *out) {
    accel_module *ref = mlp_seeded(ACCEL_CPU_DEVICE, 100); /* rank 0's weights */
    accel_optimizer *opt = optimizer(ref, kind, lr, 0.0);
    for (int64_t s = 0; s < STEPS; s++) {
        int64_t lo = s * accum * N * MB, n = accum * N * MB;
        accel_tensor *loss = accel_mse_loss(accel_module_call(ref, data_x(lo, n, ACCEL_CPU_DEVICE)),
                                            data_y(lo, n, ACCEL_CPU_DEVICE));
        out->loss[s] = accel_item(loss);
        accel_backward(loss);
        accel_tensor **ps;
        int np = accel_module_parameters(ref, &ps);
        out->norm[s] = accel_clip_grad_norm(np, ps, 0.05, 2.0);
        accel_free(ps);
        accel_optimizer_step(opt);
        accel_optimizer_zero_grad(opt);
        out->n = params_to_host(ref, out->w[s], MAXW);
        accel_step_reset();
    }
    memcpy(out->w[STEPS], out->w[STEPS - 1], sizeof out->w[STEPS]);
    accel_optimizer_free(opt);
    accel_module_free(ref);
}

/* got == want within `tol` (0: exactly): losses (relative), norms, weights
 * after every step where got has them, and at the end. */
static void runs_match(const run_out *got, const run_out *want, bool every_step, double tol, const char *what) {
    CHECK(got->n == want->n && got->n > 0);
    for (int s = 0; s < STEPS; s++) {
        CHECK_MSG(fabs(got->loss[s] - want->loss[s]) <= tol * fabs(want->loss[s]), "%s step %d: loss %.9g, want %.9g",
                  what, s, got->loss[s], want->loss[s]);
        CHECK_MSG(fabs(got->norm[s] - want->norm[s]) <= 10 * tol * fabs(want->norm[s]),
                  "%s step %d: grad norm %.9g, want %.9g", what, s, got->norm[s], want->norm[s]);
    }
    for (int s = every_step ? 0 : STEPS; s <= STEPS; s++) {
        double d = 0;
        for (int64_t k = 0; k < got->n; k++) d = fmax(d, fabs((double)got->w[s][k] - want->w[s][k]));
        CHECK_MSG(d <= 10 * tol, "%s %s %d: max |on device - cpu| = %g", what, s < STEPS ? "step" : "end (step)",
                  s < STEPS ? s : STEPS - 1, d);
    }
}

/* Training through acc on N ranks == one cpu process on the global batch,
 * gradient clipping and accumulation included: the reduced (or
 * reduce-scattered) gradients are the global ones, and under ZeRO every
 * rank's shard update, all-gathered, is the whole update. The mean of the
 * ranks' losses is the global loss. */
static void matches_cpu(accel_accelerator *acc, accel_optim_kind kind, double lr, accel_device state_home,
                        const char *what) {
    run_out got, want;
    train_through(acc, DEV, kind, lr, state_home, &got, what);
    train_reference(kind, lr, accel_accelerator_gradient_accumulation_steps(acc), &want);
    runs_match(&got, &want, accel_accelerator_zero_stage(acc) < 3, 1e-6, what);
}

static void test_ddp_matches_cpu(void) { matches_cpu(A, ACCEL_OPTIM_SGD, 0.1, DEV, "ddp"); }

/* ZeRO-1 and ZeRO-2 (AdamW: the shard's state on the device) against the cpu. */
static void test_zero_matches_cpu(void) {
    for (int stage = 1; stage <= 2; stage++) {
        accel_accelerator *z = accelerator(stage);
        if (!z) return;
        CHECK(accel_accelerator_zero_stage(z) == stage);
        matches_cpu(z, ACCEL_OPTIM_ADAMW, 0.01, DEV, stage == 1 ? "zero1" : "zero2");
        accel_accelerator_free(z);
    }
}

/* ZeRO-3 on the device: every unit (the two Linears) gathered into the
 * device's full buffer around its forward and backward, its gradients
 * reduce-scattered into the device's gradient shard, AdamW's state on the
 * device beside the parameter shard; with 2 micro-batches per step too. */
static void test_zero3_matches_cpu(void) {
    for (int accum = 1; accum <= 2; accum++) {
        accel_accelerator *z = accelerator_with((acc_cfg){.stage = 3, .accum = accum});
        if (!z) return;
        CHECK(accel_accelerator_zero_stage(z) == 3);
        matches_cpu(z, ACCEL_OPTIM_ADAMW, 0.01, DEV, accum == 1 ? "zero3" : "zero3 accum 2");
        accel_accelerator_free(z);
    }
}

/* offload_optimizer cpu under ZeRO-3: the state in host memory, stepping there. */
static void test_zero3_offload_optimizer_matches_cpu(void) {
    accel_accelerator *z = accelerator_with((acc_cfg){.stage = 3, .offload_optimizer = "cpu"});
    if (!z) return;
    matches_cpu(z, ACCEL_OPTIM_ADAMW, 0.01, ACCEL_CPU_DEVICE, "zero3 offload_optimizer cpu");
    accel_accelerator_free(z);
}

/* Under bf16 stage 3 gathers the masters rounded to bf16 and autocasts: the
 * device run equals the same run on the cpu exactly (the hostless kernels
 * are the cpu's; only where the memory lies differs). */
static void test_zero3_bf16_matches_cpu_zero3(void) {
    run_out got, want;
    accel_accelerator *z = accelerator_with((acc_cfg){.stage = 3, .accum = 2, .mp = "bf16"});
    if (!z) return;
    train_through(z, DEV, ACCEL_OPTIM_ADAMW, 0.01, DEV, &got, "zero3 bf16");
    accel_accelerator_free(z);
    z = accelerator_with((acc_cfg){.stage = 3, .accum = 2, .mp = "bf16", .cpu = true});
    if (!z) return;
    train_through(z, ACCEL_CPU_DEVICE, ACCEL_OPTIM_ADAMW, 0.01, ACCEL_CPU_DEVICE, &want, "zero3 bf16 cpu");
    accel_accelerator_free(z);
    runs_match(&got, &want, false, 0, "zero3 bf16 vs cpu");
}

static void test_collectives_on_device(void) {
    accel_tensor *mine = accel_to_device(accel_full(ACCEL_F32, ACCEL_SHAPE(2), (double)(R + 1)), DEV);
    accel_tensor *g = accel_accelerator_gather(A, mine);
    CHECK(g && g->device.type == DEV.type && g->shape[0] == 2 * N);
    for (int64_t i = 0; g && i < 2 * N; i++) CHECK(accel_get(g, &i) == (double)(i / 2 + 1));
    accel_tensor *s = accel_accelerator_reduce(A, mine, "sum", 1.0);
    CHECK(s && s->device.type == DEV.type && accel_get(s, (int64_t[]){1}) == N * (N + 1) / 2.0);
    accel_tensor *m = accel_accelerator_reduce(A, mine, "mean", 1.0);
    CHECK(m && accel_get(m, (int64_t[]){0}) == (N + 1) / 2.0);
    accel_tensor *bc = accel_accelerator_broadcast(A, mine, 0);
    CHECK(bc && bc->device.type == DEV.type && accel_get(bc, (int64_t[]){1}) == 1.0);
    accel_step_reset();
}

/* Saved after one step, trained two more; loaded into fresh weights, the same
 * two steps give the same parameters (momentum state restored on the device). */
static void train_steps(accel_accelerator *acc, accel_module *model, accel_optimizer *opt, int64_t from, int64_t k) {
    for (int64_t s = from; s < from + k; s++) {
        accel_tensor *loss =
            accel_mse_loss(accel_module_call(model, data_x(s * 8 + R * 4, 4, DEV)), data_y(s * 8 + R * 4, 4, DEV));
        CHECK(accel_accelerator_backward(acc, loss) == ACCEL_OK);
        CHECK(accel_accelerator_optimizer_step(acc, opt) == ACCEL_OK);
        CHECK(accel_accelerator_zero_grad(acc, opt) == ACCEL_OK);
        accel_step_reset();
    }
}

/* save_model of a ZeRO-3 model (its units gathered one at a time): the
 * weights in the file (rank 0 reads them back into out; other ranks return 0). */
static int64_t saved_model_weights(accel_accelerator *acc, accel_module *model, const char *dir, float *out) {
    char sub[300], file[320];
    snprintf(sub, sizeof sub, "%s_model", dir);
    CHECK_MSG(accel_accelerator_save_model(acc, model, sub, NULL) == ACCEL_OK, "save_model: %s", accel_last_error());
    int64_t n = 0;
    if (R == 0) {
        accel_module *loaded = mlp(ACCEL_CPU_DEVICE);
        snprintf(file, sizeof file, "%s/model.safetensors", sub);
        accel_safetensors *f = accel_safetensors_open(file);
        accel_state_dict *sd = accel_module_state_dict(loaded);
        CHECK(f != NULL && sd != NULL);
        for (int e = 0; f && sd && e < sd->n; e++)
            CHECK(accel_safetensors_load_into(f, sd->entries[e].name, sd->entries[e].t) == ACCEL_OK);
        accel_state_dict_free(sd);
        accel_safetensors_close(f);
        n = params_to_host(loaded, out, 64);
        accel_module_free(loaded);
        char cmd[340];
        snprintf(cmd, sizeof cmd, "rm -rf %s", sub);
        CHECK(system(cmd) == 0);
    }
    return n;
}

static void checkpoint_resume(accel_accelerator *acc, const char *what) {
    char dir[256];
    snprintf(dir, sizeof dir, "/tmp/accel_device_ckpt_%s_%d", what, (int)(N > 1 ? getppid() : getpid()));
    accel_manual_seed(5);
    accel_module *model = mlp(DEV);
    accel_optimizer *opt = sgd(model, 0.1, 0.9);
    CHECK(accel_accelerator_prepare(acc, model, opt, NULL, NULL) == ACCEL_OK);
    train_steps(acc, model, opt, 0, 1);
    CHECK_MSG(accel_accelerator_save_state(acc, dir, NULL, 0) == ACCEL_OK, "%s: %s", what, accel_last_error());
    train_steps(acc, model, opt, 1, 2);
    float want[64], got[64], saved[64];
    int64_t n_saved = accel_accelerator_zero_stage(acc) == 3 ? saved_model_weights(acc, model, dir, saved) : 0;
    /* a ZeRO-3 model gets its full weights back */
    CHECK_MSG(accel_accelerator_clear(acc) == ACCEL_OK, "%s", accel_last_error());
    int64_t n = params_to_host(model, want, 64);
    CHECK(R != 0 || accel_accelerator_zero_stage(acc) < 3 || n_saved == n);
    for (int64_t k = 0; k < n_saved; k++)
        CHECK_MSG(saved[k] == want[k], "%s: save_model param %lld: %.9g, the model %.9g", what, (long long)k, saved[k],
                  want[k]);
    accel_optimizer_free(opt);
    accel_module_free(model);

    accel_manual_seed(77); /* other weights: the load replaces them */
    model = mlp(DEV);
    opt = sgd(model, 0.1, 0.9);
    CHECK(accel_accelerator_prepare(acc, model, opt, NULL, NULL) == ACCEL_OK);
    CHECK_MSG(accel_accelerator_load_state(acc, dir, NULL) == ACCEL_OK, "%s: %s", what, accel_last_error());
    train_steps(acc, model, opt, 1, 2);
    CHECK_MSG(accel_accelerator_clear(acc) == ACCEL_OK, "%s", accel_last_error());
    CHECK(params_to_host(model, got, 64) == n);
    for (int64_t k = 0; k < n; k++)
        CHECK_MSG(got[k] == want[k], "%s param %lld: %.9g vs %.9g", what, (long long)k, got[k], want[k]);
    accel_optimizer_free(opt);
    accel_module_free(model);
    accel_accelerator_wait_for_everyone(acc);
    if (R == 0) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        CHECK(system(cmd) == 0);
    }
    accel_step_reset();
}

static void test_checkpoint_resume(void) { checkpoint_resume(A, "ddp"); }

/* Under ZeRO-1/2 the momentum state is sharded on the device; the checkpoint
 * holds it consolidated (host memory) and loads back into the shards. */
static void test_zero_checkpoint_resume(void) {
    for (int stage = 1; stage <= 2; stage++) {
        accel_accelerator *z = accelerator(stage);
        if (!z) return;
        checkpoint_resume(z, stage == 1 ? "zero1" : "zero2");
        accel_accelerator_free(z);
    }
}

/* ZeRO-3 on the device saves and resumes exactly, sharded (each rank's
 * device shard through host memory into its file) and full (units
 * gathered), and sharded with the shards in host memory (offload_param). */
static void test_zero3_checkpoint_resume(void) {
    const char *types[3] = {"SHARDED_STATE_DICT", "FULL_STATE_DICT", "SHARDED_STATE_DICT"};
    const char *names[3] = {"zero3_sharded", "zero3_full", "zero3_sharded_offload"};
    for (int i = 0; i < 3; i++) {
        accel_accelerator *z =
            accelerator_with((acc_cfg){.stage = 3, .state_dict_type = types[i], .offload_param = i == 2 ? "cpu" : NULL});
        if (!z) return;
        checkpoint_resume(z, names[i]);
        accel_accelerator_free(z);
    }
}

/* offload_param cpu under ZeRO-3 (FSDP's CPU offload): the parameter and
 * gradient shards and the optimizer state in host memory, stepping there. */
static void test_zero3_offload_param_matches_cpu(void) {
    accel_accelerator *z = accelerator_with((acc_cfg){.stage = 3, .offload_param = "cpu"});
    if (!z) return;
    matches_cpu(z, ACCEL_OPTIM_ADAMW, 0.01, ACCEL_CPU_DEVICE, "zero3 offload_param cpu");
    accel_accelerator_free(z);
}

int main(void) {
    A = accelerator(0);
    if (!A) return 1;
    N = accel_accelerator_num_processes(A);
    R = accel_accelerator_process_index(A);
    DEV = accel_accelerator_device(A);
    RUN(test_device_from_environment);
    RUN(test_prepare_places_model_and_batches);
    RUN(test_failed_placement_is_undone);
    RUN(test_prepare_optimizer_before_model);
    RUN(test_ddp_matches_cpu);
    RUN(test_collectives_on_device);
    RUN(test_checkpoint_resume);
    RUN(test_zero_matches_cpu);
    RUN(test_zero_checkpoint_resume);
    RUN(test_zero3_matches_cpu);
    RUN(test_zero3_offload_optimizer_matches_cpu);
    RUN(test_zero3_bf16_matches_cpu_zero3);
    RUN(test_zero3_checkpoint_resume);
    RUN(test_zero3_offload_param_matches_cpu);
    accel_accelerator_free(A);
    accel_thread_cleanup();
    return check_summary();
}
