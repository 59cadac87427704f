/* SyncBatchNorm (accel_convert_sync_batchnorm, accel_sync_batch_norm): each
 * rank normalises its slice of one batch, and outputs, running stats and
 * gradients (x's per rank, weight's and bias's summed over ranks) equal
 * plain BatchNorm over the whole batch, the ranks' slices of unequal sizes
 * (one empty too). On 1 process (ctest's plain run) it is BatchNorm bit for
 * bit; tests/syncbn.cmake runs it on 2 under accel launch. Also: eval issues
 * no collective, a group of one (accel_pg_split) is the rank's own batch,
 * conversion keeps names and tensors and loads a BatchNorm checkpoint, a
 * tree without BatchNorm is left as it is, and the errors. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "accel/accel.h"
#include "accel/parallel.h"
#include "check.h"
#include "test_files.h"

static accel_pg *pg;
static int rank, world;

/* x [N, C, S] of the whole batch: channel c offset by c (a mean to
 * subtract); gy the gradient fed back */
static float xval(int64_t i, int64_t C, int64_t S) { return 2.0f * sinf(0.37f * (float)i) + (float)((i / S) % C); }
static float gyval(int64_t i) { return cosf(0.11f * (float)i); }

/* BatchNorm{1,2}d(C) with weight 1 + 0.1 c, bias 0.2 c - 0.1 */
static accel_module *bn_new(int ndim, int64_t C) {
    accel_module *m = ndim == 4 ? accel_batch_norm2d_new(C, 1e-5, 0.1, true, true, ACCEL_CPU_DEVICE, ACCEL_F32)
                                : accel_batch_norm1d_new(C, 1e-5, 0.1, true, true, ACCEL_CPU_DEVICE, ACCEL_F32);
    float w[16], b[16];
    for (int64_t c = 0; c < C; c++) {
        w[c] = 1.0f + 0.1f * (float)c;
        b[c] = 0.2f * (float)c - 0.1f;
    }
    CHECK(m && accel_tensor_from_host(accel_module_get_tensor(m, "weight"), w) == ACCEL_OK &&
          accel_tensor_from_host(accel_module_get_tensor(m, "bias"), b) == ACCEL_OK);
    accel_module_train(m, true);
    return m;
}

typedef struct result {
    float *y, *dx, dw[16], db[16], rm[16], rv[16];
    int64_t batches;
} result;

/* One training step of m on rows [off, off + N) of the whole batch (shape
 * [N, C, rest...]): y, x's gradient, weight's and bias's, the buffers. */
static void step(accel_module *m, int ndim, const int64_t *shape, int64_t off, result *r) {
    int64_t sh[4], S = 1;
    memcpy(sh, shape, sizeof sh);
    for (int d = 2; d < ndim; d++) S *= shape[d];
    int64_t C = shape[1], n = shape[0] * C * S;
    float *x = malloc((size_t)(n + 1) * sizeof *x), *gy = malloc((size_t)(n + 1) * sizeof *gy);
    for (int64_t i = 0; i < n; i++) {
        x[i] = xval(off * C * S + i, C, S);
        gy[i] = gyval(off * C * S + i);
    }
    accel_tensor *xt = accel_from_floats(ndim, sh, x), *gt = accel_from_floats(ndim, sh, gy);
    accel_requires_grad_(xt, true);
    accel_tensor *y = accel_module_call(m, xt);
    CHECK_MSG(y && accel_backward_with(y, gt) == ACCEL_OK, "%s", accel_last_error());
    r->y = malloc((size_t)(n + 1) * sizeof *r->y);
    r->dx = malloc((size_t)(n + 1) * sizeof *r->dx);
    accel_tensor *w = accel_module_get_tensor(m, "weight"), *b = accel_module_get_tensor(m, "bias");
    if (y && xt->grad && w->grad && b->grad) {
        accel_to_floats(y, r->y);
        accel_to_floats(xt->grad, r->dx);
        accel_to_floats(w->grad, r->dw);
        accel_to_floats(b->grad, r->db);
    }
    accel_to_floats(accel_module_get_tensor(m, "running_mean"), r->rm);
    accel_to_floats(accel_module_get_tensor(m, "running_var"), r->rv);
    r->batches = (int64_t)accel_item(accel_module_get_tensor(m, "num_batches_tracked"));
    free(x);
    free(gy);
    accel_step_reset();
}

static float maxdiff(const float *a, const float *b, int64_t n) {
    float d = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float e = fabsf(a[i] - b[i]) / (1.0f + fabsf(b[i]));
        d = e > d || isnan(e) ? e : d;
    }
    return d;
}

/* Rank r holds rows[r] rows of x [sum rows, C, rest...]: the converted
 * model's results against BatchNorm over the whole batch (tol 0: bit for
 * bit). */
static void compare_case(const char *what, int ndim, const int64_t *rows, int64_t C, const int64_t *rest,
                         float tol) {
    int64_t total = 0, off = 0, S = 1;
    for (int r = 0; r < world; r++) {
        if (r < rank) off += rows[r];
        total += rows[r];
    }
    for (int d = 0; d < ndim - 2; d++) S *= rest[d];
    int64_t full[4] = {total, C, rest[0], rest[1]}, mine[4] = {rows[rank], C, rest[0], rest[1]};
    accel_module *ref = bn_new(ndim, C), *sync = bn_new(ndim, C);
    CHECK(accel_convert_sync_batchnorm(sync, NULL) == ACCEL_OK && !strcmp(sync->ops->type_name, "SyncBatchNorm"));
    result a = {0}, b = {0};
    step(ref, ndim, full, 0, &a);
    step(sync, ndim, mine, off, &b);
    /* DDP's sum of the local weight and bias gradients */
    float wb[32];
    memcpy(wb, b.dw, (size_t)C * sizeof *wb);
    memcpy(wb + C, b.db, (size_t)C * sizeof *wb);
    CHECK(accel_pg_all_reduce(pg, wb, 2 * (size_t)C, ACCEL_F32, ACCEL_REDUCE_SUM) == ACCEL_OK);
    int64_t n = rows[rank] * C * S, o = off * C * S;
    CHECK_MSG(maxdiff(b.y, a.y + o, n) <= tol, "%s y: %g", what, maxdiff(b.y, a.y + o, n));
    CHECK_MSG(maxdiff(b.dx, a.dx + o, n) <= tol, "%s dx: %g", what, maxdiff(b.dx, a.dx + o, n));
    CHECK_MSG(maxdiff(wb, a.dw, C) <= tol, "%s dweight: %g", what, maxdiff(wb, a.dw, C));
    CHECK_MSG(maxdiff(wb + C, a.db, C) <= tol, "%s dbias: %g", what, maxdiff(wb + C, a.db, C));
    CHECK_MSG(maxdiff(b.rm, a.rm, C) <= tol, "%s running_mean: %g", what, maxdiff(b.rm, a.rm, C));
    CHECK_MSG(maxdiff(b.rv, a.rv, C) <= tol, "%s running_var: %g", what, maxdiff(b.rv, a.rv, C));
    CHECK(b.batches == 1 && a.batches == 1);
    free(a.y);
    free(a.dx);
    free(b.y);
    free(b.dx);
    accel_module_free(ref);
    accel_module_free(sync);
}

static void test_matches_whole_batch(void) {
    float tol = world == 1 ? 0.0f : 1e-5f;
    /* unequal slices of an image batch, of a [N, C] one, one rank's empty */
    compare_case("2d unequal", 4, (int64_t[]){2, 5}, 3, (int64_t[]){3, 2}, tol);
    compare_case("1d [N, C]", 2, (int64_t[]){6, 4}, 5, (int64_t[]){1, 1}, tol);
    compare_case("1d [N, C, L], one empty", 3, (int64_t[]){3, 0}, 2, (int64_t[]){4, 1}, tol);
}

/* Activations whose mean is large beside their spread, the ranks' means
 * 0.006 apart: the group's variance is made of small differences of large
 * means. The running stats (momentum 1: the batch's) against the whole
 * batch's in double (in f32 sums the running variance was 13% off here;
 * plain BatchNorm, whose own f32 sums lose digits too, is 2.6e-4 off over
 * the 2 processes' whole batch: on one process the test allows that). */
static void test_large_mean(void) {
    enum { C = 2, S = 1000 };
    int64_t N = 2 * world, half = N / 2;
    float *x = malloc((size_t)(N * C * S) * sizeof *x);
    for (int64_t i = 0; i < N * C * S; i++)
        x[i] = 1000.0f + (i / (C * S) < half ? -0.003f : 0.003f) + 0.01f * sinf(0.37f * (float)i);
    accel_tensor *all = accel_from_floats(ACCEL_SHAPE(N, C, S), x);
    accel_tensor *mine = accel_contiguous(accel_slice(all, 0, 2 * rank, 2 * rank + 2, 1));
    accel_tensor *rm = accel_zeros(ACCEL_F32, ACCEL_SHAPE(C)), *rv = accel_ones(ACCEL_F32, ACCEL_SHAPE(C));
    CHECK_MSG(accel_sync_batch_norm(mine, rm, rv, NULL, NULL, true, 1.0, 1e-5, pg) != NULL, "%s",
              accel_last_error());
    for (int64_t c = 0; c < C; c++) {
        double m = 0.0, v = 0.0;
        for (int64_t n = 0; n < N; n++)
            for (int64_t j = 0; j < S; j++) m += x[(n * C + c) * S + j];
        m /= (double)(N * S);
        for (int64_t n = 0; n < N; n++)
            for (int64_t j = 0; j < S; j++) v += (x[(n * C + c) * S + j] - m) * (x[(n * C + c) * S + j] - m);
        v /= (double)(N * S - 1);
        double got = accel_get(rv, &c), tol = world == 1 ? 2e-3 : 1e-5; /* 1 process: plain BatchNorm's f32 sums */
        CHECK_MSG(fabs(got - v) <= tol * v, "channel %lld: running_var %.9g, the batch's %.9g", (long long)c, got, v);
        CHECK_MSG(fabs(accel_get(rm, &c) - m) <= 1e-4, "channel %lld: running_mean %.9g, the batch's %.9g",
                  (long long)c, accel_get(rm, &c), m);
    }
    free(x);
    accel_step_reset();
}

/* Gradient accumulation: a second backward without zero_grad adds to the
 * weight's and bias's gradients, and its dx is the first's (the same batch):
 * the sums all-reduced are this backward's alone, not the gradient the
 * parameters already hold. */
static void test_accumulates(void) {
    accel_module *sync = bn_new(4, 3);
    CHECK(accel_convert_sync_batchnorm(sync, NULL) == ACCEL_OK);
    const int64_t shape[4] = {2, 3, 3, 2};
    result a = {0}, b = {0};
    step(sync, 4, shape, 2 * rank, &a);
    step(sync, 4, shape, 2 * rank, &b);
    int64_t n = 2 * 3 * 3 * 2;
    CHECK_MSG(maxdiff(b.dx, a.dx, n) <= 1e-6f, "dx of the second backward: %g", maxdiff(b.dx, a.dx, n));
    for (int c = 0; c < 3; c++) {
        CHECK_MSG(fabsf(b.dw[c] - 2 * a.dw[c]) <= 1e-5f * (1 + fabsf(a.dw[c])), "dweight[%d] %g, first %g", c, b.dw[c],
                  a.dw[c]);
        CHECK_MSG(fabsf(b.db[c] - 2 * a.db[c]) <= 1e-5f * (1 + fabsf(a.db[c])), "dbias[%d] %g, first %g", c, b.db[c],
                  a.db[c]);
    }
    free(a.y), free(a.dx), free(b.y), free(b.dx);
    accel_module_free(sync);
}

/* A second conversion binds the new group (torch converts a SyncBatchNorm
 * again): converted with the world's, then with a group of one, a step
 * uses the rank's own batch. */
static void test_convert_again(void) {
    accel_pg *self = accel_pg_split(pg, rank, 0);
    accel_module *ref = bn_new(2, 3), *sync = bn_new(2, 3);
    CHECK(accel_convert_sync_batchnorm(sync, NULL) == ACCEL_OK && accel_convert_sync_batchnorm(sync, self) == ACCEL_OK);
    result a = {0}, b = {0};
    step(ref, 2, (int64_t[]){4, 3, 1, 1}, 4 * rank, &a);
    step(sync, 2, (int64_t[]){4, 3, 1, 1}, 4 * rank, &b);
    CHECK(!memcmp(a.rm, b.rm, 3 * sizeof *a.rm) && !memcmp(a.rv, b.rv, 3 * sizeof *a.rv));
    free(a.y), free(a.dx), free(b.y), free(b.dx);
    accel_module_free(ref);
    accel_module_free(sync);
    accel_pg_free(self);
}

/* eval: the running stats, no collective (rank 0 alone calls it: a
 * collective would wait for the others until the group's timeout) */
static void test_eval_no_collective(void) {
    accel_module *ref = bn_new(4, 2), *sync = bn_new(4, 2);
    CHECK(accel_convert_sync_batchnorm(sync, pg) == ACCEL_OK);
    float rm[2] = {0.5f, -1.0f}, rv[2] = {2.0f, 0.25f};
    for (int k = 0; k < 2; k++) {
        accel_module *m = k ? sync : ref;
        accel_module_train(m, false);
        CHECK(accel_tensor_from_host(accel_module_get_tensor(m, "running_mean"), rm) == ACCEL_OK &&
              accel_tensor_from_host(accel_module_get_tensor(m, "running_var"), rv) == ACCEL_OK);
    }
    if (rank == 0) {
        float x[16], y[2][16];
        for (int i = 0; i < 16; i++) x[i] = xval(i, 2, 4);
        for (int k = 0; k < 2; k++) {
            accel_tensor *t = accel_module_call(k ? sync : ref, accel_from_floats(ACCEL_SHAPE(2, 2, 2, 2), x));
            CHECK_MSG(t, "%s", accel_last_error());
            if (t) accel_to_floats(t, y[k]);
        }
        CHECK(!memcmp(y[0], y[1], sizeof y[0]));
        /* the functional form in eval as well */
        accel_tensor *t = accel_sync_batch_norm(accel_from_floats(ACCEL_SHAPE(2, 2, 2, 2), x),
                                                accel_module_get_tensor(sync, "running_mean"),
                                                accel_module_get_tensor(sync, "running_var"),
                                                accel_module_get_tensor(sync, "weight"),
                                                accel_module_get_tensor(sync, "bias"), false, 0.1, 1e-5, pg);
        CHECK_MSG(t, "%s", accel_last_error());
        if (t) accel_to_floats(t, y[1]);
        CHECK(!memcmp(y[0], y[1], sizeof y[0]));
    }
    CHECK(accel_pg_barrier(pg) == ACCEL_OK);
    accel_module_free(ref);
    accel_module_free(sync);
    accel_step_reset();
}

/* the accelerator's data-parallel group: every rank without parallelism,
 * the one SyncBatchNorm's NULL group stands for (as the default group) */
static void test_accelerator_dp_group(void) {
    accel_accelerator *acc = accel_accelerator_new(NULL);
    accel_pg *dp = accel_accelerator_dp_group(acc);
    CHECK_MSG(dp && accel_pg_size(dp) == world && accel_pg_rank(dp) == rank, "%s", accel_last_error());
    accel_module *ref = bn_new(2, 3), *sync = bn_new(2, 3);
    CHECK(accel_convert_sync_batchnorm(sync, dp) == ACCEL_OK);
    result a = {0}, b = {0};
    step(ref, 2, (int64_t[]){4 * world, 3, 1, 1}, 0, &a);
    step(sync, 2, (int64_t[]){4, 3, 1, 1}, 4 * rank, &b);
    CHECK_MSG(maxdiff(b.y, a.y + 12 * rank, 12) <= 1e-5f && maxdiff(b.rv, a.rv, 3) <= 1e-5f, "%g %g",
              maxdiff(b.y, a.y + 12 * rank, 12), maxdiff(b.rv, a.rv, 3));
    free(a.y);
    free(a.dx);
    free(b.y);
    free(b.dx);
    accel_module_free(ref);
    accel_module_free(sync);
    accel_accelerator_free(acc);
}

/* running_var of BatchNorm1d(4) (module "0" of m) after a training
 * forward and backward of m on 8 rows of x, the same on every rank */
static void running_var_after(accel_module *m, const char *name, float *rv) {
    float x[32];
    for (int i = 0; i < 32; i++) x[i] = xval(i, 4, 1);
    accel_tensor *y = accel_module_call(m, accel_from_floats(ACCEL_SHAPE(8, 4), x));
    CHECK_MSG(y && accel_backward(accel_sum_all(y)) == ACCEL_OK, "%s", accel_last_error());
    accel_to_floats(accel_module_get_tensor(m, name), rv);
    accel_step_reset();
}

/* A SyncBatchNorm converted with a NULL group synchronises over the data-
 * parallel group of the accelerator that prepared it: under tp (one batch
 * per tp group, tp = every rank here) that is this rank alone, BatchNorm bit
 * for bit (the default group counted the batch once per rank: n / (2n - 1)
 * in the running variance). The model outlives the accelerator: the default
 * group again, the two ranks' (equal) batches as one. */
static void test_prepare_binds_dp_group(void) {
    accel_accelerator *acc = accel_accelerator_new(&(accel_accelerator_opts){.parallelism = {.tp_size = world}});
    CHECK_MSG(acc, "%s", accel_last_error());
    accel_module *m = accel_sequential_new(
        3, (accel_module *[]){bn_new(2, 4), accel_linear_new(4, 8, true, ACCEL_CPU_DEVICE, ACCEL_F32),
                              accel_linear_new(8, 4, true, ACCEL_CPU_DEVICE, ACCEL_F32)});
    accel_tp_plan_entry plan[] = {{"1", ACCEL_TP_COLWISE, false}, {"2", ACCEL_TP_ROWWISE, false}};
    CHECK(m && accel_convert_sync_batchnorm(m, NULL) == ACCEL_OK);
    CHECK(world == 1 || accel_module_parallelize(m, plan, 2, accel_accelerator_tp_group(acc)) == ACCEL_OK);
    CHECK_MSG(accel_accelerator_prepare_model(acc, m) == ACCEL_OK, "%s", accel_last_error());
    accel_module_train(m, true);
    accel_module *ref = bn_new(2, 4);
    float want[4], got[4], whole[4];
    running_var_after(ref, "running_var", want);
    running_var_after(m, "0.running_var", got);
    CHECK_MSG(!memcmp(want, got, sizeof want), "running_var[0] %.9g, BatchNorm on the rank's batch %.9g", got[0],
              want[0]);
    accel_accelerator_free(acc);
    running_var_after(m, "0.running_var", whole); /* the default group (freed dp group: ASan) */
    float n = 8.0f * (float)world, v = (whole[0] - 0.9f * got[0]) / 0.1f, local = (got[0] - 0.9f) / 0.1f;
    CHECK_MSG(fabsf(v - local * 7.0f / 8.0f * n / (n - 1.0f)) <= 1e-4f * v, "after the accelerator: batch variance "
              "%g, the rank's unbiased %g", v, local);
    accel_module_free(ref);
    accel_module_free(m);
}

/* a group of one (this rank alone): the rank's own batch statistics */
static void test_group_of_one(void) {
    accel_pg *self = accel_pg_split(pg, rank, 0);
    CHECK(self && accel_pg_size(self) == 1);
    accel_module *ref = bn_new(2, 3), *sync = bn_new(2, 3);
    CHECK(accel_convert_sync_batchnorm(sync, self) == ACCEL_OK);
    result a = {0}, b = {0};
    step(ref, 2, (int64_t[]){4, 3, 1, 1}, 4 * rank, &a);
    step(sync, 2, (int64_t[]){4, 3, 1, 1}, 4 * rank, &b);
    CHECK(!memcmp(a.y, b.y, 12 * sizeof *a.y) && !memcmp(a.dx, b.dx, 12 * sizeof *a.dx));
    CHECK(!memcmp(a.rm, b.rm, 3 * sizeof *a.rm) && !memcmp(a.rv, b.rv, 3 * sizeof *a.rv));
    free(a.y);
    free(a.dx);
    free(b.y);
    free(b.dx);
    accel_module_free(ref);
    accel_module_free(sync);
    accel_pg_free(self);
}

/* names, tensors and training mode kept; a BatchNorm checkpoint loads; a
 * tree without BatchNorm is itself */
static void test_convert(void) {
    accel_module *plain = accel_sequential_new(
        3, (accel_module *[]){accel_conv2d_new(3, 4, (int64_t[]){3, 3}, NULL, (int64_t[]){1, 1}, NULL, 1, false,
                                               ACCEL_CPU_DEVICE, ACCEL_F32),
                              bn_new(4, 4), accel_sequential_new(1, (accel_module *[]){bn_new(2, 4)})});
    accel_module *conv = accel_sequential_new(
        3, (accel_module *[]){accel_conv2d_new(3, 4, (int64_t[]){3, 3}, NULL, (int64_t[]){1, 1}, NULL, 1, false,
                                               ACCEL_CPU_DEVICE, ACCEL_F32),
                              bn_new(4, 4), accel_sequential_new(1, (accel_module *[]){bn_new(2, 4)})});
    CHECK(plain && conv);
    accel_module_train(conv, false);
    accel_state_dict *before = accel_module_state_dict(conv);
    CHECK(accel_convert_sync_batchnorm(conv, pg) == ACCEL_OK);
    accel_state_dict *after = accel_module_state_dict(conv);
    CHECK(before && after && before->n == after->n && after->n == 11);
    for (int i = 0; before && after && i < before->n && i < after->n; i++)
        CHECK(!strcmp(before->entries[i].name, after->entries[i].name) && before->entries[i].t == after->entries[i].t);
    CHECK(!strcmp(conv->children[0]->ops->type_name, "Conv2d") &&
          !strcmp(conv->children[1]->ops->type_name, "SyncBatchNorm") &&
          !strcmp(conv->children[2]->children[0]->ops->type_name, "SyncBatchNorm") && !conv->children[1]->training);
    accel_state_dict_free(before);
    /* a checkpoint of the BatchNorm model, its stats moved by a step */
    if (rank == 0) {
        accel_module_train(plain, true);
        accel_tensor *x = accel_empty(ACCEL_F32, ACCEL_SHAPE(2, 3, 4, 4));
        accel_rng r;
        accel_rng_init(&r, 3);
        accel_rng_normal_(&r, x, 1.0, 2.0);
        accel_tensor *y = accel_module_call(plain->children[0], x);
        CHECK(y && accel_module_call(plain->children[1], y));
        accel_step_reset();
        char dir[] = "/tmp/accel_syncbn_XXXXXX";
        CHECK(mkdtemp(dir) != NULL);
        CHECK(accel_save_module(dir, plain, 0) == ACCEL_OK);
        accel_checkpoint *ck = accel_checkpoint_open(dir);
        accel_state_dict *want = accel_module_state_dict(plain);
        CHECK(ck && want);
        for (int i = 0; ck && want && after && i < after->n; i++) {
            CHECK_MSG(accel_checkpoint_load_into(ck, after->entries[i].name, after->entries[i].t) == ACCEL_OK,
                      "%s: %s", after->entries[i].name, accel_last_error());
            float a[128], b[128];
            int64_t n = accel_numel(want->entries[i].t);
            if (want->entries[i].t->dtype == ACCEL_F32 && n <= 128) {
                accel_to_floats(want->entries[i].t, a);
                accel_to_floats(after->entries[i].t, b);
                CHECK_MSG(!memcmp(a, b, (size_t)n * sizeof *a), "%s", after->entries[i].name);
            }
        }
        CHECK(accel_item(accel_module_get_tensor(conv, "1.num_batches_tracked")) == 1);
        accel_state_dict_free(want);
        accel_checkpoint_close(ck);
        rm_rf(dir);
    }
    accel_state_dict_free(after);
    accel_module *none = accel_sequential_new(1, (accel_module *[]){accel_flatten_new(1, -1)});
    const accel_module_ops *ops = none ? none->children[0]->ops : NULL;
    CHECK(accel_convert_sync_batchnorm(none, NULL) == ACCEL_OK && none->children[0]->ops == ops);
    accel_module_free(none);
    accel_module_free(plain);
    accel_module_free(conv);
    accel_step_reset();
}

/* bf16 input as BatchNorm takes it: its result dtype, near the f32 one */
static void test_bf16(void) {
    accel_module *m = bn_new(2, 2);
    CHECK(accel_convert_sync_batchnorm(m, NULL) == ACCEL_OK);
    float x[8], y32[8], y16[8];
    for (int i = 0; i < 8; i++) x[i] = xval(8 * rank + i, 2, 1);
    accel_tensor *xf = accel_from_floats(ACCEL_SHAPE(4, 2), x), *xb = accel_to_dtype(xf, ACCEL_BF16);
    accel_tensor *a = accel_module_call(m, xf), *b = accel_module_call(m, xb);
    accel_tensor *plain = accel_batch_norm(xb, NULL, NULL, accel_module_get_tensor(m, "weight"), NULL, true, 0.1, 1e-5);
    CHECK(a && b && plain && b->dtype == plain->dtype);
    if (a && b) {
        accel_to_floats(a, y32);
        accel_to_floats(b, y16);
        CHECK_MSG(maxdiff(y16, y32, 8) < 2e-2f, "bf16: %g", maxdiff(y16, y32, 8));
    }
    accel_module_free(m);
    accel_step_reset();
}

static void test_errors(void) {
    accel_clear_error();
    CHECK(accel_convert_sync_batchnorm(NULL, NULL) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_convert_sync_batchnorm: module is NULL");
    /* a failed constructor's NULL: its reason stays the message (it read "module is NULL") */
    CHECK(accel_convert_sync_batchnorm(accel_batch_norm2d_new(0, 1e-5, 0.1, true, true, ACCEL_CPU_DEVICE, ACCEL_F32),
                                       NULL) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_batch_norm2d_new: num_features 0 must be >= 1");
    accel_clear_error();
    accel_tensor *x = accel_from_floats(ACCEL_SHAPE(2, 2), (float[]){1, 2, 3, 4});
    accel_clear_error();
    CHECK(!accel_sync_batch_norm(x, NULL, NULL, NULL, NULL, true, 0.1, 1e-5, NULL));
    CHECK_STR_CONTAINS(accel_last_error(), "accel_sync_batch_norm: process group is NULL");
    /* a failed split chained into the call keeps its cause */
    CHECK(!accel_sync_batch_norm(x, NULL, NULL, NULL, NULL, true, 0.1, 1e-5, accel_pg_split(NULL, 0, 0)));
    CHECK_STR_CONTAINS(accel_last_error(), "accel_pg_split: process group is NULL");
    accel_module *m = bn_new(2, 2);
    CHECK(accel_convert_sync_batchnorm(m, NULL) == ACCEL_OK);
    CHECK(!accel_module_call(m, accel_from_floats(ACCEL_SHAPE(2), (float[]){1, 2})));
    CHECK_STR_CONTAINS(accel_last_error(), "SyncBatchNorm: expected at least 2D input with a non-zero number of "
                                           "channels (got 1D input");
    CHECK(!accel_module_call(m, accel_zeros(ACCEL_F32, ACCEL_SHAPE(2, 0))));
    CHECK_STR_CONTAINS(accel_last_error(), "(got 2D input, 0 channels)");
    /* one value per channel over the whole group (rank 0's one row, the
     * others' none) is refused on every rank */
    float one[2] = {1, 2};
    CHECK(!accel_module_call(m, accel_from_floats(2, (int64_t[]){rank == 0, 2}, one)));
    CHECK_STR_CONTAINS(accel_last_error(), "expected more than 1 value per channel when training");
    /* eval (and a group of one) runs BatchNorm, still under the op's name */
    accel_tensor *rm = accel_module_get_tensor(m, "running_mean"), *rv = accel_module_get_tensor(m, "running_var");
    CHECK(!accel_sync_batch_norm(x, rm, rv, NULL, NULL, false, 0.1, -1.0, pg));
    CHECK_STR_CONTAINS(accel_last_error(), "accel_sync_batch_norm: eps = -1 must be >= 0");
    accel_module_free(m);
    accel_step_reset();
}

/* a peer gone before the collective: an error on the others (the group's
 * timeout, ACCEL_DIST_TIMEOUT), not a hang. Last: the group is unusable after. */
static void test_dead_peer(void) {
    if (world == 1) return;
    if (rank == 1) {
        fprintf(stderr, "ok   test_dead_peer (rank 1 leaves)\n");
        fflush(stderr);
        _exit(check_failures_ != 0);
    }
    accel_module *m = bn_new(2, 2);
    CHECK(accel_convert_sync_batchnorm(m, NULL) == ACCEL_OK);
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    CHECK(!accel_module_call(m, accel_from_floats(ACCEL_SHAPE(4, 2), x)));
    fprintf(stderr, "dead peer: %s\n", accel_last_error());
    CHECK(accel_last_status() != ACCEL_OK);
    CHECK_STR_CONTAINS(accel_last_error(), "rank 1"); /* the peer that left, by name */
    accel_module_free(m);
    accel_step_reset();
}

int main(void) {
    if (accel_dist_init() != ACCEL_OK) {
        fprintf(stderr, "accel_dist_init: %s\n", accel_last_error());
        return 1;
    }
    pg = accel_dist_default_group();
    rank = accel_pg_rank(pg);
    world = accel_pg_size(pg);
    if (world > 2) {
        fprintf(stderr, "test_sync_batch_norm: 1 or 2 processes, got %d\n", world);
        return 1;
    }
    RUN(test_matches_whole_batch);
    RUN(test_eval_no_collective);
    RUN(test_group_of_one);
    RUN(test_accelerator_dp_group);
    RUN(test_prepare_binds_dp_group);
    RUN(test_convert);
    RUN(test_convert_again);
    RUN(test_accumulates);
    RUN(test_large_mean);
    RUN(test_bf16);
    RUN(test_errors);
    RUN(test_dead_peer);
    accel_dist_finalize();
    accel_thread_cleanup();
    return check_summary();
}
