/* ZeRO-1/2 in the Accelerator (run plainly: stage 2 on one process; under
 * `accel launch` the stage comes from the launcher's environment). Each run
 * is checked against DDP done by hand on the same process group (a second
 * model whose gradients are all-reduced tensor by tensor): same weights,
 * same clipped norms, same lr schedule, optimizer state ~1/N per rank, the
 * user's optimizer restored with the full state after clear(), and
 * save_state/load_state resuming bit for bit. Prints one line the launcher
 * tests match: "zero_stage=S world=N shard=K padded=P state_floats=F mp=M accum=A clip=C". */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "accel/accel.h"
#include "accel/accelerator.h"
#include "accel/dist.h"
#include "accelerator/accelerator_internal.h" /* whether stage 2 keeps a reduced shard */
#include "accelerator/strategy.h"
#include "check.h"
#include "ref_weights.h"
#include "optim_groups.h"

static int N, R;
static int S, SR; /* the ranks the shards spread over (under HYBRID_SHARD_ZERO2: this machine's), this one's place */
static accel_accelerator *A;

/* 5 -> 7 -> 3: 66 parameters, not a multiple of 2, 3 or 16. */
static accel_module *mlp(uint64_t seed) {
    accel_manual_seed(seed);
    accel_module *l[3] = {accel_linear_new(5, 7, true, ACCEL_CPU_DEVICE, ACCEL_F32), accel_relu_module_new(),
                          accel_linear_new(7, 3, true, ACCEL_CPU_DEVICE, ACCEL_F32)};
    return accel_sequential_new(3, l);
}

/* AdamW with two groups: weights (decay) and biases (none). */
static accel_optimizer *adamw(accel_module *m) {
    accel_tensor **ps;
    int n = accel_module_parameters(m, &ps);
    accel_tensor *w[8], *b[8];
    int nw = 0, nb = 0;
    for (int i = 0; i < n; i++) {
        if (ps[i]->ndim == 2) w[nw++] = ps[i];
        else b[nb++] = ps[i];
    }
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 0.02);
    accel_optimizer *o = accel_optimizer_new_params(ACCEL_OPTIM_ADAMW, nw, w, &h);
    h.weight_decay = 0;
    accel_optimizer_add_params(o, nb, b, &h);
    accel_free(ps);
    return o;
}

/* The batch of (step, micro-batch, rank): deterministic everywhere. */
static void batch(int64_t step, int micro, int rank, accel_tensor **x, accel_tensor **y) {
    float xs[4 * 5], ys[4 * 3];
    for (int i = 0; i < 4; i++) {
        for (int j = 0; j < 5; j++) xs[i * 5 + j] = (float)sin((double)(step * 31 + micro * 7 + rank * 13 + i * 5 + j));
        for (int j = 0; j < 3; j++) ys[i * 3 + j] = 0.5f * xs[i * 5 + j] - 0.25f * xs[i * 5 + 4 - j] + 0.1f * (float)j;
    }
    *x = accel_from_floats(ACCEL_SHAPE(4, 5), xs);
    *y = accel_from_floats(ACCEL_SHAPE(4, 3), ys);
}

typedef struct run {
    accel_module *model;
    accel_optimizer *opt;
    accel_lr_scheduler *sched;
} run;

static void run_make(run *r, uint64_t seed) {
    r->model = mlp(seed);
    r->opt = adamw(r->model);
    r->sched = accel_lr_scheduler_new(r->opt, ACCEL_SCHED_LINEAR, 2, 40);
}

static void run_free(run *r) {
    accel_lr_scheduler_free(r->sched);
    accel_optimizer_free(r->opt);
    accel_module_free(r->model);
}

static accel_tensor *forward(accel_module *m, accel_tensor *x, bool autocast) {
    if (!autocast) return accel_module_call(m, x);
    accel_dtype prev = accel_autocast_begin(ACCEL_BF16);
    accel_tensor *y = accel_module_call(m, x);
    accel_autocast_end(prev);
    return accel_to_dtype(y, ACCEL_F32);
}

/* One optimizer step through the accelerator (accum micro-batches); returns the clipped norm (or 0). */
static double acc_step(run *r, int64_t step, double user_clip) {
    int accum = accel_accelerator_gradient_accumulation_steps(A);
    double norm = 0;
    for (int k = 0; k < accum; k++) {
        accel_accelerator_accumulate(A);
        accel_tensor *x, *y;
        batch(step, k, R, &x, &y);
        CHECK(accel_accelerator_backward(A, accel_mse_loss(accel_module_call(r->model, x), y)) == ACCEL_OK);
        if (user_clip > 0 && accel_accelerator_sync_gradients(A))
            norm = accel_accelerator_clip_grad_norm(A, r->model, user_clip, 2.0);
        CHECK(accel_accelerator_optimizer_step(A, r->opt) == ACCEL_OK);
        accel_accelerator_scheduler_step(A, r->sched);
        accel_accelerator_zero_grad(A, r->opt);
        accel_step_reset();
    }
    return norm;
}

/* The same step as plain DDP by hand: local grads, an all-reduce (AVG) per tensor. */
static double ref_step(run *r, int64_t step, double user_clip) {
    int accum = accel_accelerator_gradient_accumulation_steps(A);
    bool bf16 = accel_accelerator_mixed_precision(A) == ACCEL_MP_BF16;
    accel_tensor **ps;
    int n = accel_module_parameters(r->model, &ps);
    for (int k = 0; k < accum; k++) {
        accel_tensor *x, *y;
        batch(step, k, R, &x, &y);
        accel_tensor *loss = accel_mse_loss(forward(r->model, x, bf16), y);
        CHECK(accel_backward(accum > 1 ? accel_mul_scalar(loss, 1.0 / accum) : loss) == ACCEL_OK);
        accel_step_reset();
    }
    CHECK_MSG(ref_average_grads(n, ps, N), "DDP by hand, step %lld: %s", (long long)step, accel_last_error());
    double norm = user_clip > 0 ? accel_clip_grad_norm(n, ps, user_clip, 2.0) : 0;
    if (accel_accelerator_gradient_clipping(A) > 0) accel_clip_grad_norm(n, ps, accel_accelerator_gradient_clipping(A), 2.0);
    CHECK(accel_optimizer_step(r->opt) == ACCEL_OK);
    for (int k = 0; k < N; k++) accel_lr_scheduler_step(r->sched);
    accel_optimizer_zero_grad(r->opt);
    accel_free(ps);
    return norm;
}

/* Floats of optimizer state (exp_avg + exp_avg_sq) this rank holds. */
static int64_t state_floats(accel_optimizer *o) {
    accel_named_state *st;
    int n = accel_optimizer_state(o, &st);
    int64_t f = 0;
    for (int i = 0; i < n; i++)
        if (st[i].t) f += accel_numel(st[i].t);
    accel_named_state_free(st, n);
    return f;
}

/* reversed: prepare(sched, opt, model), which Accelerate's two passes take
 * as prepare(model, opt, sched) (it was refused: the optimizer's model not
 * prepared yet) */
static void test_equivalence(double user_clip, bool reversed) {
    run z, ref;
    run_make(&z, 100 + (uint64_t)R); /* prepare gives every rank rank 0's weights */
    run_make(&ref, 100);
    accel_status st = reversed ? accel_accelerator_prepare(A, z.sched, z.opt, NULL, z.model)
                               : accel_accelerator_prepare(A, z.model, z.opt, NULL, z.sched);
    CHECK_MSG(st == ACCEL_OK, "%s", accel_last_error());
    for (int64_t s = 0; s < 4; s++) {
        double a = acc_step(&z, s, user_clip), b = ref_step(&ref, s, user_clip);
        CHECK_CLOSE(a, b, 1e-6, 0);
        CHECK(accel_optimizer_get_lr(z.opt, 0) == accel_optimizer_get_lr(ref.opt, 0)); /* the scheduler drives the shard */
    }
    double d = rel_diff(z.model, ref.model);
    CHECK_MSG(d <= 1e-6, "stage %d, clip %g: weights differ from DDP by %.3g (relative)",
              accel_accelerator_zero_stage(A), user_clip, d);
    int64_t lo, hi, padded, full = state_floats(ref.opt), mine = state_floats(z.opt);
    CHECK(accel_accelerator_zero_shard(A, z.model, &lo, &hi, &padded) == ACCEL_OK);
    if (accel_accelerator_zero_stage(A)) {
        CHECK(padded % (16 * N) == 0 && padded >= 99 && padded < 99 + 16 * N); /* 99: the last tensor's end, aligned */
        CHECK(hi - lo == padded / S && lo == SR * (padded / S));
        CHECK(mine <= 2 * (hi - lo)); /* ~1/N: exp_avg + exp_avg_sq of the shard only */
        CHECK(S == 1 || mine < full); /* (shards over one rank: all of the state) */
        /* stage 2 reduces into a shard of its own only where there is one to
         * cut: over one rank (HYBRID_SHARD_ZERO2 with a process a machine) the
         * gradients are averaged in place, no second copy of them */
        accel_tensor h;
        bool kept = accel__zero_grad_shard(accel__find_model(A, z.model), &h) != NULL;
        CHECK_MSG(accel_accelerator_zero_stage(A) != 2 || kept == (N > 1 && S > 1),
                  "stage 2 over %d rank(s) of %d: reduced shard %s", S, N, kept ? "kept" : "not kept");
    } else {
        CHECK(mine == full);
    }
    if (user_clip == 0 && R == 0)
        printf("zero_stage=%d world=%d shard=%lld padded=%lld state_floats=%lld/%lld mp=%s accum=%d clip=%g\n",
               accel_accelerator_zero_stage(A), N, (long long)(hi - lo), (long long)padded, (long long)mine,
               (long long)full, accel_mixed_precision_name(accel_accelerator_mixed_precision(A)),
               accel_accelerator_gradient_accumulation_steps(A), accel_accelerator_gradient_clipping(A));
    fflush(stdout);
    /* clear(): the user's optimizer gets its per-tensor segments and the whole state back */
    CHECK_MSG(accel_accelerator_clear(A) == ACCEL_OK, "%s", accel_last_error());
    CHECK(accel_optimizer_num_segments(z.opt) == 4);
    CHECK(state_floats(z.opt) == full);
    accel_named_state *sa, *sb;
    int na = accel_optimizer_state(z.opt, &sa), nb = accel_optimizer_state(ref.opt, &sb);
    CHECK(na == nb);
    for (int i = 0; i < na && i < nb; i++) {
        CHECK(!strcmp(sa[i].name, sb[i].name));
        if (sa[i].t && sb[i].t)
            for (int64_t k = 0; k < accel_numel(sa[i].t); k++)
                CHECK_CLOSE(((float *)sa[i].t->data)[k], ((float *)sb[i].t->data)[k], 1e-4, 1e-9);
        else
            CHECK(sa[i].value == sb[i].value);
    }
    accel_named_state_free(sa, na);
    accel_named_state_free(sb, nb);
    run_free(&z);
    run_free(&ref);
}

static void test_plain(void) { test_equivalence(0, false); }
static void test_clipped(void) { test_equivalence(0.05, false); }
static void test_any_order(void) { test_equivalence(0, true); }

static void params_of(accel_module *m, float *out) {
    accel_tensor **ps;
    int n = accel_module_parameters(m, &ps);
    for (int i = 0; i < n; i++) {
        memcpy(out, ps[i]->data, (size_t)accel_numel(ps[i]) * sizeof(float));
        out += accel_numel(ps[i]);
    }
    accel_free(ps);
}

/* rank 0 removes dir once every rank is done with it */
static void remove_dir(const char *dir) {
    accel_accelerator_wait_for_everyone(A);
    if (R == 0) {
        char cmd[160];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        CHECK(system(cmd) == 0);
    }
}

static void test_checkpoint_resume(void) {
    int64_t id = getpid();
    CHECK(accel_pg_broadcast(accel_dist_default_group(), &id, 1, ACCEL_I64, 0) == ACCEL_OK);
    char dir[128];
    snprintf(dir, sizeof dir, "/tmp/accel_zero_ckpt_%lld", (long long)id);
    float want[66], got[66];
    run a, b;
    run_make(&a, 5);
    CHECK(accel_accelerator_prepare(A, a.model, a.opt, NULL, a.sched) == ACCEL_OK);
    for (int64_t s = 0; s < 2; s++) acc_step(&a, s, 0.5);
    CHECK(accel_accelerator_save_state(A, dir, NULL, 0) == ACCEL_OK);
    for (int64_t s = 2; s < 5; s++) acc_step(&a, s, 0.5);
    params_of(a.model, want);
    CHECK_MSG(accel_accelerator_clear(A) == ACCEL_OK, "%s", accel_last_error());
    run_free(&a);

    run_make(&b, 77); /* other weights: all restored */
    CHECK(accel_accelerator_prepare(A, b.model, b.opt, NULL, b.sched) == ACCEL_OK);
    CHECK(accel_accelerator_load_state(A, dir, NULL) == ACCEL_OK);
    for (int64_t s = 2; s < 5; s++) acc_step(&b, s, 0.5);
    params_of(b.model, got);
    CHECK(memcmp(want, got, sizeof want) == 0);
    CHECK_MSG(accel_accelerator_clear(A) == ACCEL_OK, "%s", accel_last_error());
    run_free(&b);
    remove_dir(dir);
}

/* load_state of dir into m, prepared with opt, fails naming `what` and
 * leaves m's weights as they were (`why`: what a change would mean); then
 * clears the accelerator. */
static void expect_load_fails_keeping_model(accel_module *m, accel_optimizer *opt, const char *dir, const char *what,
                                            const char *why) {
    CHECK(accel_accelerator_prepare(A, m, opt) == ACCEL_OK);
    float before[66], after[66];
    params_of(m, before);
    accel_status st = accel_accelerator_load_state(A, dir, NULL);
    CHECK_MSG(st != ACCEL_OK, "the load of a checkpoint whose optimizer does not fit succeeded (%s)", why);
    CHECK_STR_CONTAINS(accel_last_error(), what);
    accel_clear_error();
    params_of(m, after);
    CHECK_MSG(!memcmp(before, after, sizeof before), "the model was loaded before its optimizer failed (%s)", why);
    CHECK_MSG(accel_accelerator_clear(A) == ACCEL_OK, "%s", accel_last_error());
}

/* A checkpoint whose optimizer does not fit the prepared one (an unlucky
 * user's other run: here over both groups, the prepared one over the
 * weights alone): load_state fails before it loads anything, and the model
 * keeps its weights. ZeRO-1/2 check the optimizer's file against the shard
 * first (accel__zero_check_state); ZeRO-3's own shards are read, and
 * checked, as they load. */
static void test_load_of_other_optimizer_changes_nothing(void) {
    if (accel_accelerator_zero_stage(A) == 3) {
        printf("(ZeRO-3: its optimizer shards are checked as they load)\n");
        return;
    }
    int64_t id = getpid();
    CHECK(accel_pg_broadcast(accel_dist_default_group(), &id, 1, ACCEL_I64, 0) == ACCEL_OK);
    char dir[128];
    snprintf(dir, sizeof dir, "/tmp/accel_zero_other_%lld", (long long)id);
    run a;
    run_make(&a, 5);
    CHECK(accel_accelerator_prepare(A, a.model, a.opt, NULL, a.sched) == ACCEL_OK);
    for (int64_t s = 0; s < 2; s++) acc_step(&a, s, 0);
    CHECK_MSG(accel_accelerator_save_state(A, dir, NULL, 0) == ACCEL_OK, "%s", accel_last_error());
    CHECK_MSG(accel_accelerator_clear(A) == ACCEL_OK, "%s", accel_last_error());
    run_free(&a);

    accel_module *m = mlp(77);
    accel_tensor **ps, *w[2];
    int n = accel_module_parameters(m, &ps), nw = 0;
    for (int i = 0; i < n; i++)
        if (ps[i]->ndim == 2) w[nw++] = ps[i];
    accel_free(ps);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 0.02);
    accel_optimizer *weights_only = accel_optimizer_new_params(ACCEL_OPTIM_ADAMW, nw, w, &h);
    expect_load_fails_keeping_model(m, weights_only, dir, "no such parameter in this optimizer",
                                    "an optimizer over 2 of 4 parameters, the file's over 4");
    accel_optimizer_free(weights_only);
    /* every parameter, the file's order, in one group where the file has
     * two: the entries fit, the shard's state is refused by the optimizer's
     * own check (accel__optimizer_check_state), still before any model */
    accel_tensor **all;
    n = accel_module_parameters(m, &all);
    accel_tensor *order[4] = {w[0], w[1], NULL, NULL};
    for (int i = 0, k = 2; i < n; i++)
        if (all[i]->ndim == 1 && k < 4) order[k++] = all[i];
    accel_free(all);
    accel_optimizer *one_group = accel_optimizer_new_params(ACCEL_OPTIM_ADAMW, 4, order, &h);
    expect_load_fails_keeping_model(m, one_group, dir, "param group", "an optimizer of one group, the file's of two");
    accel_optimizer_free(one_group);
    accel_module_free(m);
    remove_dir(dir);
}

/* The value of scalar entry `name` of o's state, or -1. */
static double state_scalar(accel_optimizer *o, const char *name) {
    accel_named_state *st;
    int n = accel_optimizer_state(o, &st);
    double v = -1;
    for (int i = 0; i < n; i++)
        if (!strcmp(st[i].name, name)) v = st[i].value;
    accel_named_state_free(st, n);
    return v;
}

/* A checkpoint of groups [A, B], [C] loaded into [A], [B, C] (same shapes):
 * refused naming the group and both counts, before the model changes. The
 * counts are the user's in the consolidated state (the shard's optimizer
 * holds runs: on one process one per group), so the same grouping loads, and
 * clear() gives the user's optimizer its state back. */
static void test_load_of_other_grouping(void) {
    bool z3 = accel_accelerator_zero_stage(A) == 3;
    int64_t id = getpid();
    CHECK(accel_pg_broadcast(accel_dist_default_group(), &id, 1, ACCEL_I64, 0) == ACCEL_OK);
    char dir[128];
    snprintf(dir, sizeof dir, "/tmp/accel_zero_grouping_%lld", (long long)id);
    accel_module *m = squares(21);
    accel_optimizer *opt = grouped(m, 2, 0.01, 0.02);
    prepare_and_step(A, m, opt);
    CHECK_MSG(accel_accelerator_save_state(A, dir, NULL, 0) == ACCEL_OK, "%s", accel_last_error());
    CHECK_MSG(accel_accelerator_clear(A) == ACCEL_OK, "%s", accel_last_error());
    CHECK(state_scalar(opt, "param_groups.0.num_params") == 2 && state_scalar(opt, "param_groups.1.num_params") == 1);

    accel_module *m2 = squares(22);
    accel_optimizer *other = grouped(m2, 1, 0.03, 0.04);
    CHECK(accel_accelerator_prepare(A, m2, other) == ACCEL_OK);
    float before[48], after[48];
    params_of(m2, before);
    accel_status st = accel_accelerator_load_state(A, dir, NULL);
    CHECK_MSG(st == ACCEL_ERR_FORMAT, "load_state -> %d: %s", (int)st, accel_last_error());
    /* ZeRO-3's own shards are refused by their index's names */
    CHECK_STR_CONTAINS(accel_last_error(), z3 ? "param group 0 holds" : "param group 0 holds 2 parameters in the saved "
                                                                      "state, 1 in this optimizer");
    accel_clear_error();
    if (!z3) { /* (ZeRO-3's parameters are shards while prepared) */
        params_of(m2, after);
        CHECK_MSG(!memcmp(before, after, sizeof before), "the model was loaded before its optimizer failed");
    }
    CHECK(accel_optimizer_get_lr(other, 0) == 0.03 && accel_optimizer_get_lr(other, 1) == 0.04);
    CHECK_MSG(accel_accelerator_clear(A) == ACCEL_OK, "%s", accel_last_error());

    accel_optimizer *same = grouped(m2, 2, 0.05, 0.06);
    CHECK(accel_accelerator_prepare(A, m2, same) == ACCEL_OK);
    CHECK_MSG(accel_accelerator_load_state(A, dir, NULL) == ACCEL_OK, "%s", accel_last_error());
    CHECK(accel_optimizer_get_lr(same, 0) == 0.01 && accel_optimizer_get_lr(same, 1) == 0.02);
    CHECK_MSG(accel_accelerator_clear(A) == ACCEL_OK, "%s", accel_last_error());
    CHECK(state_scalar(same, "param_groups.0.num_params") == 2 && state_scalar(same, "state.2.step") == 1);
    accel_optimizer_free(opt);
    accel_optimizer_free(other);
    accel_optimizer_free(same);
    accel_module_free(m);
    accel_module_free(m2);
    remove_dir(dir);
}

/* The tensor state of o (exp_avg, exp_avg_sq) as host floats, in listing order; returns the count. */
static int64_t state_values(accel_optimizer *o, float *out, int64_t cap) {
    accel_named_state *st;
    int n = accel_optimizer_state(o, &st);
    int64_t k = 0;
    for (int i = 0; i < n; i++) {
        if (!st[i].t) continue;
        int64_t c = accel_numel(st[i].t);
        CHECK(k + c <= cap);
        if (k + c <= cap) CHECK(accel_to_floats(st[i].t, out + k) == ACCEL_OK);
        k += c;
    }
    accel_named_state_free(st, n);
    return k;
}

/* An optimizer that stepped before prepare keeps its state: prepare moves it
 * into the shard (after the optimizer's own state buffers were replaced), and
 * clear() gives it back whole. */
static void test_state_from_before_prepare(void) {
    run r;
    run_make(&r, 9);
    accel_tensor *x, *y;
    batch(0, 0, 0, &x, &y); /* one batch on every rank: the same state everywhere, consolidated or not */
    CHECK(accel_backward(accel_mse_loss(accel_module_call(r.model, x), y)) == ACCEL_OK);
    CHECK(accel_optimizer_step(r.opt) == ACCEL_OK);
    accel_optimizer_zero_grad(r.opt);
    accel_step_reset();
    float before[132], after[132];
    int64_t n = state_values(r.opt, before, 132);
    CHECK(n == 132); /* exp_avg and exp_avg_sq of 66 parameters */
    CHECK(accel_accelerator_prepare(A, r.model, r.opt, NULL, r.sched) == ACCEL_OK);
    CHECK_MSG(accel_accelerator_clear(A) == ACCEL_OK, "%s", accel_last_error());
    CHECK(state_values(r.opt, after, 132) == n);
    CHECK_MSG(memcmp(before, after, sizeof before) == 0, "the state of the step before prepare was lost");
    run_free(&r);
}

/* What accel does not implement is refused before any rendezvous, with a message saying what to use. */
static void test_refusals(void) {
    accel_clear_error();
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.fsdp_sharding_strategy = "bogus";
    CHECK(accel_accelerator_new(&o) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "unknown FSDP sharding strategy");
    accel_clear_error();
    o = accel_accelerator_opts_default();
    o.deepspeed_config_file = "/nonexistent/ds.json";
    CHECK(accel_accelerator_new(&o) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "DeepSpeed config");
    accel_clear_error();
    char path[96];
    snprintf(path, sizeof path, "/tmp/accel_zero3_prefetch_%d_%d.json", (int)getpid(), R);
    /* stage3_prefetch_bucket_size: a count of elements, else named; the knobs accel does not implement: refused */
    static const char *BAD[][2] = {{"\"stage3_prefetch_bucket_size\": -1", "stage3_prefetch_bucket_size must be a count"},
                                   {"\"stage3_prefetch_bucket_size\": 1.5", "stage3_prefetch_bucket_size must be a count"},
                                   {"\"stage3_prefetch_bucket_size\": 1e19", "stage3_prefetch_bucket_size must be a count"},
                                   {"\"stage3_prefetch_bucket_size\": \"big\"", "stage3_prefetch_bucket_size must be a count"},
                                   {"\"stage3_max_live_parameters\": 1000", "stage3_max_live_parameters is not implemented"},
                                   {"\"stage3_prefetch_bucket_size\": 50000000", NULL}};
    for (size_t k = 0; k < sizeof BAD / sizeof *BAD; k++) {
        FILE *f = fopen(path, "w");
        CHECK(f != NULL);
        if (!f) break;
        fprintf(f, "{\"zero_optimization\": {\"stage\": 3, %s}}\n", BAD[k][0]);
        fclose(f);
        o.deepspeed_config_file = path;
        accel_accelerator *a = accel_accelerator_new(&o);
        CHECK_MSG((a != NULL) == !BAD[k][1], "%s: %s", BAD[k][0], a ? "accepted" : accel_last_error());
        if (BAD[k][1]) CHECK_STR_CONTAINS(accel_last_error(), BAD[k][1]);
        accel_accelerator_free(a);
        accel_clear_error();
    }
    unlink(path);
    o = accel_accelerator_opts_default();
    o.zero_stage = 3;
    setenv("ACCEL_FSDP_BACKWARD_PREFETCH", "BACKWARD_SIDEWAYS", 1);
    CHECK(accel_accelerator_new(&o) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "BACKWARD_SIDEWAYS\": unknown policy (BACKWARD_PRE, BACKWARD_POST, NO_PREFETCH)");
    unsetenv("ACCEL_FSDP_BACKWARD_PREFETCH");
    accel_clear_error();
    setenv("ACCEL_FSDP_FORWARD_PREFETCH", "maybe", 1);
    CHECK(accel_accelerator_new(&o) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "ACCEL_FSDP_FORWARD_PREFETCH=maybe is not a boolean");
    unsetenv("ACCEL_FSDP_FORWARD_PREFETCH");
    accel_clear_error();
    setenv("ACCEL_FSDP_AUTO_WRAP_POLICY", "LAYER_WRAP", 1);
    CHECK(accel_accelerator_new(&o) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "unknown policy (TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP, NO_WRAP)");
    unsetenv("ACCEL_FSDP_AUTO_WRAP_POLICY");
    accel_clear_error();
    /* the two numbers as Python's float() reads them: blanks around, '_' between digits, no hex (strtod's
     * 0x10 was 16) */
    static const char *const BAD_MIN[] = {"1e8x", "0x10", "1.5", "-1", "1__0", "nan", "1e19"};
    for (size_t k = 0; k < sizeof BAD_MIN / sizeof *BAD_MIN; k++) {
        setenv("ACCEL_FSDP_MIN_NUM_PARAMS", BAD_MIN[k], 1);
        CHECK_MSG(accel_accelerator_new(&o) == NULL, "%s", BAD_MIN[k]);
        char want[64];
        snprintf(want, sizeof want, "ACCEL_FSDP_MIN_NUM_PARAMS=\"%s\" is not a count", BAD_MIN[k]);
        CHECK_STR_CONTAINS(accel_last_error(), want);
        accel_clear_error();
    }
    static const struct {
        const char *text;
        int64_t count;
    } MIN[] = {{" 1_000\t", 1000}, {"1e8", 100000000}, {"2.0", 2}};
    for (size_t k = 0; k < sizeof MIN / sizeof *MIN; k++) {
        setenv("ACCEL_FSDP_MIN_NUM_PARAMS", MIN[k].text, 1);
        accel__zero_cfg zc;
        CHECK_MSG(accel__zero_config(&o, &zc) == ACCEL_OK && zc.fsdp.min_num_params == MIN[k].count, "'%s': %s",
                  MIN[k].text, accel_last_error());
    }
    unsetenv("ACCEL_FSDP_MIN_NUM_PARAMS");
    /* ACCEL_GRADIENT_CLIPPING is read without a DeepSpeed config: the launcher's (some runs of this test
     * have one, or a clipping of their own) set aside meanwhile */
    static const char *const ASIDE[] = {"ACCEL_DEEPSPEED_CONFIG_FILE", "ACCEL_GRADIENT_CLIPPING"};
    char *kept[2];
    for (int k = 0; k < 2; k++) {
        kept[k] = getenv(ASIDE[k]) ? strdup(getenv(ASIDE[k])) : NULL;
        unsetenv(ASIDE[k]);
    }
    accel__zero_cfg zc;
    setenv("ACCEL_GRADIENT_CLIPPING", "0x10", 1);
    CHECK(accel__zero_config(&o, &zc) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "ACCEL_GRADIENT_CLIPPING='0x10' is not a number >= 0");
    accel_clear_error();
    setenv("ACCEL_GRADIENT_CLIPPING", " 2_0\n", 1);
    CHECK_MSG(accel__zero_config(&o, &zc) == ACCEL_OK && zc.clip == 20, "%s", accel_last_error());
    for (int k = 0; k < 2; k++) {
        if (kept[k]) setenv(ASIDE[k], kept[k], 1);
        else unsetenv(ASIDE[k]);
        free(kept[k]);
    }
    setenv("ACCEL_FSDP_OFFLOAD_PARAMS", "true", 1); /* FULL_SHARD on the cpu: the shards are in host memory already */
    accel_accelerator *offloaded = accel_accelerator_new(&o);
    CHECK_MSG(offloaded != NULL, "%s", accel_last_error());
    accel_accelerator_free(offloaded);
    unsetenv("ACCEL_FSDP_OFFLOAD_PARAMS");
    accel_clear_error();
    setenv("ACCEL_FSDP_SYNC_MODULE_STATES", "false", 1); /* with cpu_ram_efficient_loading's default true: */
    accel_accelerator *synced = accel_accelerator_new(&o); /* forced True with a warning (test_accelerator_fsdp_opts) */
    CHECK_MSG(synced != NULL, "%s", accel_last_error());
    accel_accelerator_free(synced);
    unsetenv("ACCEL_FSDP_SYNC_MODULE_STATES");
    accel_clear_error();
    o.zero_stage = 2; /* without wrap units it would do nothing: refused, not ignored */
    setenv("ACCEL_FSDP_ACTIVATION_CHECKPOINTING", "true", 1);
    CHECK(accel_accelerator_new(&o) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "fsdp_activation_checkpointing=true checkpoints the FULL_SHARD");
    unsetenv("ACCEL_FSDP_ACTIVATION_CHECKPOINTING");
    accel_clear_error();
    o.zero_stage = 3;
    setenv("ACCEL_FSDP_VERSION", "3", 1);
    CHECK(accel_accelerator_new(&o) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "fsdp_version=\"3\" (1 or 2)");
    unsetenv("ACCEL_FSDP_VERSION");
    accel_clear_error();
}

/* reduce_bucket_size out of range (1e30 was undefined behaviour in the
 * int64 conversion, -5 was silently ignored) or of the wrong type is an
 * error naming the field. */
static void test_bad_reduce_bucket_size(void) {
    const char *bad[] = {"1e30", "-5", "0", "\"big\""};
    char path[64];
    snprintf(path, sizeof path, "/tmp/accel_zero_ds_%d.json", (int)getpid());
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        FILE *f = fopen(path, "w");
        CHECK(f != NULL);
        if (!f) return;
        fprintf(f, "{\"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": %s}}", bad[i]);
        fclose(f);
        accel_clear_error();
        accel_accelerator_opts o = accel_accelerator_opts_default();
        o.deepspeed_config_file = path;
        accel_accelerator *B = accel_accelerator_new(&o);
        CHECK_MSG(B == NULL, "reduce_bucket_size %s was accepted", bad[i]);
        accel_accelerator_free(B);
        CHECK_STR_CONTAINS(accel_last_error(), "reduce_bucket_size");
    }
    accel_clear_error();
    remove(path);
}

int main(void) {
    bool from_env = getenv("ACCEL_ZERO_STAGE") || getenv("ACCEL_DEEPSPEED_CONFIG_FILE") ||
                    getenv("ACCEL_FSDP_SHARDING_STRATEGY");
    accel_accelerator_opts o = accel_accelerator_opts_default();
    if (!from_env) o.zero_stage = 2; /* run plainly: ZeRO-2 on one process */
    A = accel_accelerator_new(&o);
    if (!A) {
        fprintf(stderr, "error: %s\n", accel_last_error());
        return 1;
    }
    N = accel_accelerator_num_processes(A);
    R = accel_accelerator_process_index(A);
    const char *strategy = getenv("ACCEL_FSDP_SHARDING_STRATEGY");
    bool hybrid = strategy && !strncmp(strategy, "HYBRID", 6) && accel_dist_local_world_size() < N;
    S = hybrid ? accel_dist_local_world_size() : N;
    SR = hybrid ? accel_dist_local_rank() : R;
    RUN(test_plain);
    RUN(test_clipped); /* clipping bites: the norm is well above 0.05 */
    RUN(test_any_order);
    RUN(test_checkpoint_resume);
    RUN(test_load_of_other_optimizer_changes_nothing);
    RUN(test_load_of_other_grouping);
    RUN(test_state_from_before_prepare);
    RUN(test_refusals);
    RUN(test_bad_reduce_bucket_size);
    accel_accelerator_free(A);
    return check_summary();
}
