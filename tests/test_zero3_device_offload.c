/* ZeRO-3 (FSDP FULL_SHARD) on a device, beyond the shards in device memory
 * (ctest runs it on hostless:0 plainly and under `accel launch
 * --num_processes 2`). A model of L equal Linear units trains a few steps
 * with AdamW; the hostless backend counts its device bytes (persistent
 * allocations and mapped virtual memory).
 *
 * - offload_param cpu and nvme, and fsdp_offload_params: the parameter and
 *   gradient shards and the optimizer state live in host memory and the
 *   step runs there; each unit's parameters come to the device for its
 *   forward and backward only. Training equals the run without offload bit
 *   for bit (losses, final weights; f32 and bf16), and between steps the
 *   device holds no shard; with gradient accumulation 2 and clipping too.
 *   A SHARDED_STATE_DICT checkpoint under nvme resumes bit for bit.
 * - bf16 autocast: the weights' bf16 copies (prepared forms) go with their
 *   unit, so between steps the device holds the shards only.
 * - a mapping that fails on one rank (the hostless vm_map failure hook), in
 *   forward and in backward, fails every rank at once (well inside the
 *   group's timeout), each error naming that rank, and the next step trains.
 * - tied weights across units train as the model in one unit.
 * - accel_accelerator_clear holds one unit gathered at a time, and says so
 *   when a unit could not be gathered (a failed mapping).
 * - the start of ZeRO-3 at prepare failing on one rank (a unit's full
 *   parameters that cannot be unmapped once its shard piece is filled):
 *   every rank fails, the model comes back with its weights to the bit,
 *   and a retry trains.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "accel/accel.h"
#include "accel/accelerator.h"
#include "backends/registry.h"
#include "backends/hostless/hostless.h"
#include "check.h"
#include "params_host.h"

enum { L = 6, H = 128, MB = 4, STEPS = 3, NP = L * (H * H + H) };

static int N, R;

static accel_module *stack(accel_device dev) {
    accel_module *l[L];
    for (int i = 0; i < L; i++) l[i] = accel_linear_new(H, H, true, dev, ACCEL_F32);
    return accel_sequential_new(L, l);
}

/* Fixed features or targets [MB, H] for rank r and step s, on dev: step
 * memory (the device's step pool, which the counters leave out). */
static accel_tensor *data(int r, int s, int salt, accel_device dev) {
    float x[MB * H];
    for (int i = 0; i < MB * H; i++) x[i] = (float)((i * 7 + r * 5 + s * 11 + salt * 3) % 13) / 13.0f - 0.5f;
    accel_tensor *t = accel_to_device(accel_from_floats(ACCEL_SHAPE(MB, H), x), dev);
    CHECK(t != NULL);
    return t;
}

static size_t in_use(void) { return accel__hostless_memory_stats(0).in_use; }

typedef struct cfg {
    const char *mp, *offload_param, *nvme_path;
    bool fsdp_offload_params;
    int accum; /* gradient accumulation steps, with clip_grad_norm (0: neither) */
    const char *state_dict_type;
} cfg;

static accel_accelerator *accelerator(cfg c) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.zero_stage = 3;
    o.mixed_precision = c.mp ? c.mp : "no";
    o.offload_param_device = c.offload_param;
    o.offload_param_nvme_path = c.nvme_path;
    o.fsdp_offload_params = c.fsdp_offload_params;
    o.gradient_accumulation_steps = c.accum ? c.accum : 1;
    o.fsdp_state_dict_type = c.state_dict_type;
    accel_accelerator *acc = accel_accelerator_new(&o);
    CHECK_MSG(acc != NULL, "%s", accel_last_error());
    return acc;
}

static accel_optimizer *adamw(accel_module *m) {
    accel_tensor **ps;
    int np = accel_module_parameters(m, &ps);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 1e-2);
    accel_optimizer *opt = accel_optimizer_new_params(ACCEL_OPTIM_ADAMW, np, ps, &h);
    accel_free(ps);
    return opt;
}

/* Every tensor of opt's state lies on a device of type `want`. */
static void check_state_on(accel_optimizer *opt, accel_device_type want, const char *what) {
    accel_named_state *st = NULL;
    int n = accel_optimizer_state(opt, &st), tensors = 0;
    CHECK(n >= 0);
    for (int e = 0; e < n; e++)
        if (st[e].t) {
            tensors++;
            CHECK_MSG(st[e].t->device.type == want, "%s: optimizer state %s on device type %d, want %d", what,
                      st[e].name, (int)st[e].t->device.type, (int)want);
        }
    CHECK_MSG(tensors > 0, "%s: no optimizer state", what);
    if (n >= 0) accel_named_state_free(st, n);
}

/* One micro-batch of step s (the s-th when not accumulating): its loss into
 * *loss_sum, backward, under accumulation the clipped gradients on the sync
 * step, and the optimizer step (a no-op until then). False on failure. */
static bool micro_step(accel_accelerator *acc, accel_module *model, accel_optimizer *opt, accel_device dev, int s,
                       bool clip, float *loss_sum, const char *what) {
    CHECK(accel_accelerator_accumulate(acc) == ACCEL_OK);
    accel_tensor *x = data(R, s, 0, dev), *y = data(R, s, 1, dev);
    accel_tensor *loss = accel_mse_loss(accel_module_call(model, x), y);
    CHECK_MSG(loss != NULL, "%s micro-batch %d: %s", what, s + 1, accel_last_error());
    if (!loss) return false;
    *loss_sum += (float)accel_item(loss);
    CHECK_MSG(accel_accelerator_backward(acc, loss) == ACCEL_OK, "%s: %s", what, accel_last_error());
    if (clip && accel_accelerator_sync_gradients(acc))
        CHECK_MSG(accel_accelerator_clip_grad_norm(acc, model, 0.05, 2.0) >= 0, "%s: %s", what, accel_last_error());
    CHECK_MSG(accel_accelerator_optimizer_step(acc, opt) == ACCEL_OK, "%s: %s", what, accel_last_error());
    CHECK(accel_accelerator_zero_grad(acc, opt) == ACCEL_OK);
    accel_step_reset();
    return true;
}

/* One training run: each step's loss, the final weights (after clear), and
 * the device bytes (over what was in use before the model) between steps
 * (the most after steps 2..STEPS) and at a step's peak. */
typedef struct run_out {
    float loss[STEPS];
    float *w;
    double between, peak;
} run_out;

static void train(cfg c, run_out *out, const char *what) {
    memset(out, 0, sizeof *out);
    accel_accelerator *acc = accelerator(c);
    if (!acc) return;
    accel_device dev = accel_accelerator_device(acc);
    CHECK_MSG(dev.type == ACCEL_DEV_HOSTLESS, "run on hostless:0 (ACCEL_DEFAULT_DEVICE)");
    size_t base = in_use();
    accel_manual_seed(7);
    accel_module *model = stack(dev);
    accel_optimizer *opt = adamw(model);
    CHECK_MSG(accel_accelerator_prepare(acc, model, opt, NULL, NULL) == ACCEL_OK, "%s: %s", what, accel_last_error());
    int accum = c.accum ? c.accum : 1;
    bool ok = true;
    for (int s = 0; s < STEPS && ok; s++) {
        accel__hostless_reset_peak(0);
        for (int k = 0; k < accum && ok; k++)
            ok = micro_step(acc, model, opt, dev, s * accum + k, c.accum > 0, &out->loss[s], what);
        if (s == 0) continue;
        double now = (double)in_use() - (double)base, top = (double)accel__hostless_memory_stats(0).peak - (double)base;
        out->between = fmax(out->between, now);
        out->peak = fmax(out->peak, top);
    }
    check_state_on(opt, c.offload_param || c.fsdp_offload_params ? ACCEL_DEV_CPU : ACCEL_DEV_HOSTLESS, what);
    CHECK_MSG(accel_accelerator_clear(acc) == ACCEL_OK, "%s", accel_last_error());
    out->w = malloc(NP * sizeof(float));
    CHECK(params_to_host(model, out->w, NP) == NP);
    accel_optimizer_free(opt);
    accel_module_free(model);
    accel_accelerator_free(acc);
    CHECK_MSG(in_use() == base, "%s: device bytes after free: %zu, before: %zu", what, in_use(), base);
}

static void same_run(const run_out *got, const run_out *want, const char *what) {
    for (int s = 0; s < STEPS; s++)
        CHECK_MSG(got->loss[s] == want->loss[s], "%s step %d: loss %.9g, without offload %.9g", what, s + 1,
                  got->loss[s], want->loss[s]);
    int64_t diff = 0;
    for (int64_t k = 0; k < NP && got->w && want->w; k++) diff += got->w[k] != want->w[k];
    CHECK_MSG(diff == 0, "%s: %lld of %d final weights differ from the run without offload", what, (long long)diff,
              NP);
}

static const double PARAM_BYTES = NP * 4.0, UNIT_BYTES = NP * 4.0 / L;

/* The shards of the run without offload: parameters, gradients and Adam's
 * two moments (4 x params/N), each unit's piece padded to 16 x N floats;
 * under bf16 the shard rounded to bf16 that gathers send (params/2N) and the
 * landing buffer of the largest unit (half its f32 bytes). */
static double shard_bytes(bool bf16) {
    double pad = L * 16.0 * N * 4;
    return 4 * (PARAM_BYTES / N + pad) + (bf16 ? (PARAM_BYTES / N + pad) / 2 + UNIT_BYTES / 2 + 64 : 0);
}

/* offload_param: the same training as without, the device holding no shard
 * between steps (under bf16 only the gather's landing buffer: half a unit). */
static void offload_matches(const char *mp, cfg c, const run_out *want, const char *what) {
    run_out got;
    c.mp = mp;
    train(c, &got, what);
    same_run(&got, want, what);
    bool bf16 = !strcmp(mp, "bf16");
    double allowed = bf16 ? UNIT_BYTES / 2 + 64 : 0;
    if (R == 0)
        printf("%s world=%d: between steps %.0f device bytes (allowed %.0f; without offload %.0f), step peak %.0f\n",
               what, N, got.between, allowed, shard_bytes(bf16), got.peak);
    CHECK_MSG(got.between <= allowed, "%s: %.0f device bytes between steps, want <= %.0f (no shard on the device)",
              what, got.between, allowed);
    CHECK_MSG(got.peak <= allowed + 6 * UNIT_BYTES + 6 * 64 * 1024.0,
              "%s: step peak %.0f device bytes, want a few units' parameters and gradients", what, got.peak);
    free(got.w);
}

static void offload_modes(const char *mp) {
    run_out want;
    char what[96];
    snprintf(what, sizeof what, "zero3 %s", mp);
    train((cfg){.mp = mp}, &want, what);
    bool bf16 = !strcmp(mp, "bf16");
    /* item: the bf16 forms go with their unit, so only the shards stay */
    if (R == 0)
        printf("%s world=%d: between steps %.0f device bytes (the shards: %.0f)\n", what, N, want.between,
               shard_bytes(bf16));
    CHECK_MSG(want.between <= shard_bytes(bf16), "%s: %.0f device bytes between steps, want <= %.0f (the shards)",
              what, want.between, shard_bytes(bf16));
    snprintf(what, sizeof what, "offload_param cpu %s", mp);
    offload_matches(mp, (cfg){.offload_param = "cpu"}, &want, what);
    snprintf(what, sizeof what, "offload_param nvme %s", mp);
    offload_matches(mp, (cfg){.offload_param = "nvme", .nvme_path = "/tmp"}, &want, what);
    snprintf(what, sizeof what, "fsdp_offload_params %s", mp);
    offload_matches(mp, (cfg){.fsdp_offload_params = true}, &want, what);
    free(want.w);
}

static void test_offload_param_f32(void) { offload_modes("no"); }
static void test_offload_param_bf16(void) { offload_modes("bf16"); }

/* Gradient accumulation 2 with clip_grad_norm: offload_param (cpu, nvme;
 * f32 and bf16) trains as the run without offload, bit for bit on hostless
 * (the host's kernels are hostless's). */
static void test_offload_param_accumulation(void) {
    const char *mps[] = {"no", "bf16"};
    for (int i = 0; i < 2; i++) {
        run_out want;
        char what[96];
        snprintf(what, sizeof what, "zero3 %s accumulation 2", mps[i]);
        train((cfg){.mp = mps[i], .accum = 2}, &want, what);
        snprintf(what, sizeof what, "offload_param cpu %s accumulation 2", mps[i]);
        offload_matches(mps[i], (cfg){.offload_param = "cpu", .accum = 2}, &want, what);
        snprintf(what, sizeof what, "offload_param nvme %s accumulation 2", mps[i]);
        offload_matches(mps[i], (cfg){.offload_param = "nvme", .nvme_path = "/tmp", .accum = 2}, &want, what);
        free(want.w);
    }
}

/* Steps [from, to) through acc, each one's loss into loss[s - from]; then
 * clear and the final weights into w. */
static void steps_then_weights(accel_accelerator *acc, accel_module *model, accel_optimizer *opt, int from, int to,
                               float *loss, float *w, const char *what) {
    accel_device dev = accel_accelerator_device(acc);
    for (int s = from; s < to; s++) micro_step(acc, model, opt, dev, s, false, &loss[s - from], what);
    CHECK_MSG(accel_accelerator_clear(acc) == ACCEL_OK, "%s", accel_last_error());
    CHECK(params_to_host(model, w, NP) == NP);
}

/* SHARDED_STATE_DICT under offload_param nvme (the parameter shard in a
 * file): saved after a step and loaded into a model with other weights, the
 * next steps train as the run that went on (losses and final weights bit for
 * bit). */
static void test_sharded_checkpoint_nvme(void) {
    const char *what = "offload_param nvme SHARDED_STATE_DICT resume";
    char dir[256];
    snprintf(dir, sizeof dir, "/tmp/accel_z3_nvme_ckpt_%d", (int)(N > 1 ? getppid() : getpid()));
    accel_accelerator *acc =
        accelerator((cfg){.offload_param = "nvme", .nvme_path = "/tmp", .state_dict_type = "SHARDED_STATE_DICT"});
    if (!acc) return;
    float want_loss[2] = {0}, got_loss[2] = {0}, none = 0;
    float *want = calloc(NP, sizeof(float)), *got = calloc(NP, sizeof(float));
    for (int resumed = 0; resumed < 2; resumed++) {
        accel_manual_seed(resumed ? 99 : 7); /* other weights: the load replaces them */
        accel_module *model = stack(accel_accelerator_device(acc));
        accel_optimizer *opt = adamw(model);
        CHECK_MSG(accel_accelerator_prepare(acc, model, opt, NULL, NULL) == ACCEL_OK, "%s", accel_last_error());
        if (resumed) {
            CHECK_MSG(accel_accelerator_load_state(acc, dir, NULL) == ACCEL_OK, "%s: %s", what, accel_last_error());
        } else {
            micro_step(acc, model, opt, accel_accelerator_device(acc), 0, false, &none, what);
            CHECK_MSG(accel_accelerator_save_state(acc, dir, NULL, 0) == ACCEL_OK, "%s: %s", what, accel_last_error());
        }
        steps_then_weights(acc, model, opt, 1, 3, resumed ? got_loss : want_loss, resumed ? got : want, what);
        accel_optimizer_free(opt);
        accel_module_free(model);
    }
    for (int s = 0; s < 2; s++)
        CHECK_MSG(got_loss[s] == want_loss[s], "%s step %d: loss %.9g, without the resume %.9g", what, s + 2,
                  got_loss[s], want_loss[s]);
    int64_t diff = 0;
    for (int64_t k = 0; k < NP; k++) diff += got[k] != want[k];
    CHECK_MSG(diff == 0, "%s: %lld of %d final weights differ from the run without the resume", what,
              (long long)diff, NP);
    free(want);
    free(got);
    accel_accelerator_wait_for_everyone(acc);
    if (R == 0) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        CHECK(system(cmd) == 0);
    }
    accel_accelerator_free(acc);
}

/* The call `failed` (true: it returned an error) on every rank, naming rank
 * `who`. At once, not at the group's timeout: tests/zero3.cmake sets that
 * timeout past ctest's, so a rank that waited it out fails the test. */
static void failed_together(bool failed, int who, const char *what, const char *cause) {
    char want[32];
    snprintf(want, sizeof want, "rank %d", who);
    CHECK_MSG(failed, "%s: rank %d went on", what, R);
    if (failed) CHECK_STR_CONTAINS(accel_last_error(), want);
    if (failed) CHECK_STR_CONTAINS(accel_last_error(), cause);
    accel_clear_error();
    accel_step_reset();
}

/* One good step: every rank trains. */
static void good_step(accel_accelerator *acc, accel_module *model, accel_optimizer *opt, accel_device dev, int s) {
    float loss = 0;
    micro_step(acc, model, opt, dev, s, false, &loss, "good step");
}

/* The model of L units (seed 7) with AdamW, prepared by acc, one good step trained. */
static accel_module *trained_stack(accel_accelerator *acc, accel_optimizer **opt) {
    accel_manual_seed(7);
    accel_module *model = stack(accel_accelerator_device(acc));
    *opt = adamw(model);
    CHECK_MSG(accel_accelerator_prepare(acc, model, *opt, NULL, NULL) == ACCEL_OK, "%s", accel_last_error());
    good_step(acc, model, *opt, accel_accelerator_device(acc), 0);
    return model;
}

/* Failures on the last rank alone. Device OOM: a unit's parameters in
 * forward, its gradients in backward (before, the others went on without
 * it: the group failed on mismatched collectives and stayed unusable, or
 * waited until its timeout). The copy to the host of what a unit's gather
 * sends (the group takes host memory only), in forward (before, it came
 * after the ranks agreed on the mapping: that rank skipped the all-gather
 * and the group broke on mismatched collectives). Every rank fails at once,
 * naming it; the ranks stay in step: the next step trains. */
static void test_failure_on_one_rank(void) {
    if (N < 2) return;
    int who = N - 1;
    accel_accelerator *acc = accelerator((cfg){0});
    if (!acc) return;
    accel_device dev = accel_accelerator_device(acc);
    accel_optimizer *opt;
    accel_module *model = trained_stack(acc, &opt);

    if (R == who) accel__hostless_vm_fail_next(1);
    accel_tensor *y = accel_module_call(model, data(R, 1, 0, dev));
    failed_together(y == NULL, who, "forward", "map");
    accel__hostless_vm_fail_next(0);
    good_step(acc, model, opt, dev, 2);

    accel_tensor *loss = accel_mse_loss(accel_module_call(model, data(R, 3, 0, dev)), data(R, 3, 1, dev));
    CHECK_MSG(loss != NULL, "%s", accel_last_error());
    if (R == who) accel__hostless_vm_fail_next(1);
    accel_status st = loss ? accel_accelerator_backward(acc, loss) : ACCEL_ERR_STATE;
    failed_together(st != ACCEL_OK, who, "backward", "map");
    accel__hostless_vm_fail_next(0);
    CHECK(accel_accelerator_zero_grad(acc, opt) == ACCEL_OK);
    good_step(acc, model, opt, dev, 4);

    accel_tensor *x = data(R, 6, 0, dev);
    if (R == who) accel__hostless_copy_fail_next(1);
    y = accel_module_call(model, x);
    failed_together(y == NULL, who, "forward", R == who ? "a copy to the host failed" : "what its gather sends");
    accel__hostless_copy_fail_next(0);
    good_step(acc, model, opt, dev, 7);

    CHECK_MSG(accel_accelerator_clear(acc) == ACCEL_OK, "%s", accel_last_error());
    accel_optimizer_free(opt);
    accel_module_free(model);
    accel_accelerator_free(acc);
}

/* The last rank cannot unmap a unit's full parameters (the hostless unmap
 * hook) while prepare starts ZeRO-3: prepare fails on every rank, and the
 * weights every rank gets back are the ones it prepared, to the bit (the
 * undo gathers each unit from the shards: before, the failing rank had
 * filled its pieces only up to that unit, and the others' weights came
 * back with its unfilled pieces); a retry prepares and trains. */
static void test_start_fails_on_one_rank(void) {
    if (N < 2) return;
    int who = N - 1;
    accel_accelerator *acc = accelerator((cfg){0});
    if (!acc) return;
    accel_device dev = accel_accelerator_device(acc);
    accel_manual_seed(7);
    accel_module *model = stack(dev);
    accel_optimizer *opt = adamw(model);
    float *before = malloc(NP * sizeof(float)), *after = malloc(NP * sizeof(float));
    CHECK(params_to_host(model, before, NP) == NP);
    if (R == who) accel__hostless_vm_fail_unmap_next(1);
    accel_status st = accel_accelerator_prepare(acc, model, opt, NULL, NULL);
    accel__hostless_vm_fail_unmap_next(0);
    CHECK_MSG(st != ACCEL_OK, "rank %d: prepare went on", R);
    char want[64], self[64];
    snprintf(want, sizeof want, R == who ? "rank %d could not" : "another rank (%d) could not", who);
    CHECK_STR_CONTAINS(accel_last_error(), want);
    /* a rank that did its part does not name itself (the start's agreement, agreed again by prepare) */
    snprintf(self, sizeof self, "rank %d could not", R);
    CHECK_MSG(R == who || !strstr(accel_last_error(), self), "rank %d blames itself: %s", R, accel_last_error());
    accel_clear_error();
    CHECK(params_to_host(model, after, NP) == NP);
    int differ = 0;
    for (int i = 0; i < NP; i++) differ += memcmp(&before[i], &after[i], sizeof(float)) != 0;
    CHECK_MSG(differ == 0, "rank %d: %d of %d weights changed by the failed prepare", R, differ, NP);
    CHECK_MSG(accel_accelerator_prepare(acc, model, opt, NULL, NULL) == ACCEL_OK, "rank %d: the retry: %s", R,
              accel_last_error());
    good_step(acc, model, opt, dev, 0);
    free(before);
    free(after);
    CHECK_MSG(accel_accelerator_clear(acc) == ACCEL_OK, "%s", accel_last_error());
    accel_optimizer_free(opt);
    accel_module_free(model);
    accel_accelerator_free(acc);
}

/* accel_accelerator_clear gives the model plain buffers back unit by unit:
 * the device holds the two plain buffers (parameters, gradients) and one
 * unit gathered at a time beside what it held before, not every unit
 * gathered beside them (3 x the parameters). */
static void test_clear_is_incremental(void) {
    accel_accelerator *acc = accelerator((cfg){0});
    if (!acc) return;
    accel_device dev = accel_accelerator_device(acc);
    accel_manual_seed(7);
    accel_module *model = stack(dev);
    accel_tensor **ps;
    int np = accel_module_parameters(model, &ps);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_SGD, 1e-2); /* no state: clear gives none back */
    accel_optimizer *opt = accel_optimizer_new_params(ACCEL_OPTIM_SGD, np, ps, &h);
    accel_free(ps);
    CHECK_MSG(accel_accelerator_prepare(acc, model, opt, NULL, NULL) == ACCEL_OK, "%s", accel_last_error());
    good_step(acc, model, opt, dev, 0);
    size_t before = in_use();
    accel__hostless_reset_peak(0);
    CHECK_MSG(accel_accelerator_clear(acc) == ACCEL_OK, "%s", accel_last_error());
    double rise = (double)accel__hostless_memory_stats(0).peak - (double)before;
    double allowed = 2 * PARAM_BYTES + 2 * (UNIT_BYTES + 64 * 1024.0);
    if (R == 0) printf("clear world=%d: peak %.0f device bytes above the shards (allowed %.0f; params %.0f)\n", N, rise,
                       allowed, PARAM_BYTES);
    CHECK_MSG(rise <= allowed, "clear: the device peaked %.0f bytes above the shards, want <= %.0f (2 x params + a unit)",
              rise, allowed);
    float *w = malloc(NP * sizeof(float));
    CHECK(params_to_host(model, w, NP) == NP); /* the weights are there, readable */
    free(w);
    accel_optimizer_free(opt);
    accel_module_free(model);
    accel_accelerator_free(acc);
}

/* A mapping that fails while accel_accelerator_clear gathers a unit (on
 * the last rank alone): every rank's clear says so, naming that rank,
 * instead of silently handing the unit back as zeros; the model is still
 * freed cleanly. */
static void test_clear_reports_failed_gather(void) {
    int who = N - 1;
    accel_accelerator *acc = accelerator((cfg){0});
    if (!acc) return;
    accel_optimizer *opt;
    accel_module *model = trained_stack(acc, &opt);
    accel_clear_error();
    if (R == who) accel__hostless_vm_fail_next(1);
    accel_status st = accel_accelerator_clear(acc);
    accel__hostless_vm_fail_next(0);
    char want[32];
    snprintf(want, sizeof want, "rank %d", who);
    CHECK_MSG(st != ACCEL_OK && st == accel_last_status(), "clear: status %d", (int)st);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_accelerator_clear");
    CHECK_STR_CONTAINS(accel_last_error(), want);
    CHECK_STR_CONTAINS(accel_last_error(), "zeros");
    CHECK(accel_accelerator_clear(acc) == ACCEL_OK); /* nothing left prepared */
    float *w = malloc(NP * sizeof(float));
    CHECK(params_to_host(model, w, NP) == NP);
    free(w);
    accel_optimizer_free(opt);
    accel_module_free(model);
    accel_accelerator_free(acc);
}

/* Three Linear units, the last one's weight tied to the first's: the two
 * units share one parameter. Trained with the default wrap policy (a unit
 * per Linear) it equals the same run with the model as one unit (NO_WRAP). */
static void tied_run(const char *wrap, float loss[STEPS], float *w) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.zero_stage = 3;
    o.fsdp_auto_wrap_policy = wrap;
    accel_accelerator *acc = accel_accelerator_new(&o);
    CHECK_MSG(acc != NULL, "%s", accel_last_error());
    if (!acc) return;
    wrap = wrap ? wrap : "default";
    accel_device dev = accel_accelerator_device(acc);
    accel_manual_seed(11);
    accel_module *l[3];
    for (int i = 0; i < 3; i++) l[i] = accel_linear_new(H, H, true, dev, ACCEL_F32);
    accel_module *model = accel_sequential_new(3, l);
    CHECK(accel_module_tie(model, "2.weight", "0.weight") == ACCEL_OK);
    accel_optimizer *opt = adamw(model);
    CHECK_MSG(accel_accelerator_prepare(acc, model, opt, NULL, NULL) == ACCEL_OK, "%s: %s", wrap, accel_last_error());
    for (int s = 0; s < STEPS; s++) {
        accel_tensor *ls = accel_mse_loss(accel_module_call(model, data(R, s, 0, dev)), data(R, s, 1, dev));
        CHECK_MSG(ls != NULL, "%s step %d: %s", wrap, s + 1, accel_last_error());
        if (!ls) break;
        loss[s] = (float)accel_item(ls);
        CHECK_MSG(accel_accelerator_backward(acc, ls) == ACCEL_OK, "%s: %s", wrap, accel_last_error());
        CHECK_MSG(accel_accelerator_optimizer_step(acc, opt) == ACCEL_OK, "%s: %s", wrap, accel_last_error());
        CHECK(accel_accelerator_zero_grad(acc, opt) == ACCEL_OK);
        accel_step_reset();
    }
    CHECK_MSG(accel_accelerator_clear(acc) == ACCEL_OK, "%s", accel_last_error());
    CHECK(params_to_host(model, w, 2 * (H * H + H) + H) == 2 * (H * H + H) + H);
    accel_optimizer_free(opt);
    accel_module_free(model);
    accel_accelerator_free(acc);
}

static void test_tied_weights_across_units(void) {
    enum { W = 2 * (H * H + H) + H };
    float la[STEPS] = {0}, lb[STEPS] = {0};
    float *wa = calloc(W, sizeof(float)), *wb = calloc(W, sizeof(float));
    tied_run("NO_WRAP", la, wa);
    tied_run(NULL, lb, wb); /* the default policy: a unit per Linear */
    for (int s = 0; s < STEPS; s++)
        CHECK_MSG(la[s] == lb[s], "step %d: loss %.9g with a unit per Linear, %.9g as one unit", s + 1, lb[s], la[s]);
    int64_t diff = 0;
    for (int k = 0; k < W; k++) diff += wa[k] != wb[k];
    CHECK_MSG(diff == 0, "%lld of %d final weights differ between a unit per Linear and one unit", (long long)diff, W);
    free(wa);
    free(wb);
}

int main(void) {
    if (!getenv("ACCEL_DEFAULT_DEVICE")) { /* run plainly: one process on hostless:0 */
        CHECK(accel__hostless_register(1) == ACCEL_OK);
        setenv("ACCEL_DEFAULT_DEVICE", "hostless:0", 1);
    }
    const char *n = getenv("WORLD_SIZE"), *r = getenv("RANK");
    N = n ? atoi(n) : 1;
    R = r ? atoi(r) : 0;
    RUN(test_offload_param_f32);
    RUN(test_offload_param_bf16);
    RUN(test_offload_param_accumulation);
    RUN(test_sharded_checkpoint_nvme);
    RUN(test_failure_on_one_rank);
    RUN(test_start_fails_on_one_rank);
    RUN(test_tied_weights_across_units);
    RUN(test_clear_is_incremental);
    RUN(test_clear_reports_failed_gather);
    accel_thread_cleanup();
    return check_summary();
}
