/* Accelerator on 1..N processes (run plainly and under `accel launch --num_processes N`):
 * DDP equivalence with single-process training, gradient accumulation, no_sync,
 * gather_for_metrics on uneven datasets, collectives (upstream's test_utils/scripts/test_ops.py), scheduler
 * stepping (§5.2), clipping, split_between_processes, main_process_first. */
#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include "accel/accel.h"
#include "accel/accelerator.h"
#include "accel/dist.h"
#include "check.h"

static int N, R;

static accel_module *mlp(void) {
    accel_module *l[3] = {accel_linear_new(4, 8, true, ACCEL_CPU_DEVICE, ACCEL_F32), accel_relu_module_new(),
                          accel_linear_new(8, 1, true, ACCEL_CPU_DEVICE, ACCEL_F32)};
    return accel_sequential_new(3, l);
}

static accel_optimizer *sgd(accel_module *m, double lr) {
    accel_tensor **ps;
    int n = accel_module_parameters(m, &ps);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_SGD, lr);
    accel_optimizer *o = accel_optimizer_new_params(ACCEL_OPTIM_SGD, n, ps, &h);
    accel_free(ps);
    return o;
}

/* x[i] = sin-ish features, y = a fixed linear function: deterministic everywhere. */
static void make_data(int64_t n, float *x, float *y) {
    for (int64_t i = 0; i < n; i++) {
        for (int j = 0; j < 4; j++) x[i * 4 + j] = (float)((i * 7 + j * 3) % 11) / 11.0f - 0.5f;
        y[i] = 0.3f * x[i * 4] - 0.7f * x[i * 4 + 1] + 0.2f * x[i * 4 + 3] + 0.1f;
    }
}

static double max_param_diff(accel_module *a, accel_module *b) {
    accel_tensor **pa, **pb;
    int n = accel_module_parameters(a, &pa);
    accel_module_parameters(b, &pb);
    double d = 0;
    for (int i = 0; i < n; i++)
        for (int64_t k = 0; k < accel_numel(pa[i]); k++) {
            double e = fabs(((float *)pa[i]->data)[k] - ((float *)pb[i]->data)[k]);
            d = e > d ? e : d;
        }
    accel_free(pa);
    accel_free(pb);
    return d;
}

/* One reference step on samples [lo, hi) of the full data set. */
static void ref_step(accel_module *ref, accel_optimizer *ropt, const float *x, const float *y, int64_t lo,
                     int64_t hi) {
    accel_tensor *xb = accel_from_floats(ACCEL_SHAPE(hi - lo, 4), x + lo * 4);
    accel_tensor *yb = accel_from_floats(ACCEL_SHAPE(hi - lo, 1), y + lo);
    accel_backward(accel_mse_loss(accel_module_call(ref, xb), yb));
    accel_optimizer_step(ropt);
    accel_optimizer_zero_grad(ropt);
    accel_step_reset();
}

/* N ranks with batch b == 1 process with batch N*b (k SGD steps), and with
 * accumulation k x b == batch k*b. Tolerance 1e-5 (float reduction order). */
static void run_equivalence(accel_accelerator *acc, int accum, bool split) {
    const int64_t b = 4, steps = 3, n = (int64_t)N * b * accum * steps;
    float *x = malloc((size_t)n * 4 * sizeof(float)), *y = malloc((size_t)n * sizeof(float));
    make_data(n, x, y);
    accel_manual_seed(100 + (uint64_t)R); /* different init per rank: prepare broadcasts rank 0's */
    accel_module *model = mlp();
    accel_manual_seed(100);
    accel_module *ref = mlp();
    accel_optimizer *opt = sgd(model, 0.1), *ropt = sgd(ref, 0.1);
    accel_tensor *fields[2] = {accel_from_floats(ACCEL_SHAPE(n, 4), x), accel_from_floats(ACCEL_SHAPE(n, 1), y)};
    accel_dataset *ds = accel_tensor_dataset_new(2, fields);
    accel_dataloader_opts o = accel_dataloader_opts_default();
    o.batch_size = split ? b * N : b; /* split_batches: the global batch is cut in N */
    accel_dataloader *dl = accel_dataloader_new(ds, &o);
    accel_step_reset();
    accel_accelerator_set_gradient_accumulation_steps(acc, accum);
    CHECK(accel_accelerator_prepare(acc, model, opt, dl, NULL) == ACCEL_OK);
    if (split) CHECK(accel_dataloader_shard(dl, N, R, true, true) == ACCEL_OK);
    CHECK(max_param_diff(model, ref) == 0.0); /* rank 0's weights everywhere */
    accel_batch batch;
    int64_t micro = 0, synced = 0;
    while (accel_dataloader_next(dl, &batch)) {
        accel_accelerator_accumulate(acc);
        bool sync = accel_accelerator_sync_gradients(acc);
        CHECK(sync == ((micro + 1) % accum == 0));
        accel_tensor *loss = accel_mse_loss(accel_module_call(model, batch.fields[0]), batch.fields[1]);
        CHECK(accel_accelerator_backward(acc, loss) == ACCEL_OK);
        if (!sync && N > 1) {
            /* no all-reduce on a non-sync micro-step: the ranks' gradients differ */
            accel_tensor **ps;
            accel_module_parameters(model, &ps);
            accel_tensor *g = accel_accelerator_gather(acc, ps[0]->grad);
            int64_t half = accel_numel(ps[0]->grad);
            bool differ = false;
            for (int64_t k = 0; k < half; k++) differ |= ((float *)g->data)[k] != ((float *)g->data)[half + k];
            CHECK(differ);
            accel_free(ps);
        }
        CHECK(accel_accelerator_optimizer_step(acc, opt) == ACCEL_OK);
        accel_accelerator_zero_grad(acc, opt);
        accel_step_reset();
        if (sync) {
            ref_step(ref, ropt, x, y, synced * N * b * accum, (synced + 1) * N * b * accum);
            synced++;
            double d = max_param_diff(model, ref);
            CHECK_MSG(d < 1e-5, "accum=%d step %lld: max |ddp - reference| = %g", accum, (long long)synced, d);
        }
        micro++;
    }
    CHECK(synced == steps);
    CHECK(accel_last_status() == ACCEL_OK);
    CHECK_MSG(accel_accelerator_clear(acc) == ACCEL_OK, "%s", accel_last_error());
    accel_accelerator_set_gradient_accumulation_steps(acc, 1);
    accel_optimizer_free(opt);
    accel_optimizer_free(ropt);
    accel_module_free(model);
    accel_module_free(ref);
    accel_dataloader_free(dl);
    accel_dataset_free(ds);
    free(x);
    free(y);
    accel_step_reset();
}

static accel_accelerator *A;

static void test_ddp_equivalence(void) {
    run_equivalence(A, 1, false);
    run_equivalence(A, 1, true);
}
static void test_accumulation_equivalence(void) { run_equivalence(A, 2, false); }

static void gather_epoch(int64_t n, int64_t bs, bool split, bool drop_last, bool shuffle) {
    float *xs = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) xs[i] = (float)i;
    accel_tensor *x = accel_from_floats(ACCEL_SHAPE(n), xs);
    accel_dataset *ds = accel_tensor_dataset_new(1, &x);
    accel_dataloader_opts o = accel_dataloader_opts_default();
    o.batch_size = bs;
    o.drop_last = drop_last;
    o.shuffle = shuffle;
    o.seed = 5 + (uint64_t)R; /* prepare makes every rank use rank 0's seed */
    accel_dataloader *dl = accel_dataloader_new(ds, &o);
    CHECK(accel_accelerator_prepare_dataloader(A, dl) == ACCEL_OK);
    if (split) CHECK(accel_dataloader_shard(dl, N, R, true, true) == ACCEL_OK);
    int *seen = calloc((size_t)n, sizeof(int));
    int64_t total = 0, steps = 0;
    accel_batch b;
    while (accel_dataloader_next(dl, &b)) {
        accel_tensor *g = accel_accelerator_gather_for_metrics(A, b.fields[0]);
        CHECK(g != NULL);
        if (!g) break;
        for (int64_t i = 0; i < g->shape[0]; i++) seen[(int64_t)accel_get(g, &i)]++;
        total += g->shape[0];
        if (drop_last && steps == 1) CHECK(g->shape[0] == bs * N); /* §9.5: no truncation */
        steps++;
        accel_step_reset();
    }
    if (!drop_last) {
        CHECK_MSG(total == n, "n=%lld bs=%lld N=%d split=%d: gathered %lld", (long long)n, (long long)bs, N, split,
                  (long long)total);
        int ok = 1;
        for (int64_t i = 0; i < n; i++) ok &= seen[i] == 1;
        CHECK(ok);
    }
    CHECK_MSG(accel_accelerator_clear(A) == ACCEL_OK, "%s", accel_last_error());
    accel_dataloader_free(dl);
    accel_dataset_free(ds);
    free(seen);
    free(xs);
    accel_step_reset();
}

static void test_gather_for_metrics(void) {
    const int64_t sizes[] = {82, 99, 512};
    for (int s = 0; s < 3; s++)
        for (int split = 0; split < 2; split++)
            if (!split || 16 % N == 0) gather_epoch(sizes[s], 16, split, false, false);
    gather_epoch(22, 4, false, false, false);
    gather_epoch(22, 4, false, false, true);
    gather_epoch(10 * N + 1, 5, false, true, false);
    /* smaller than one round, even_batches: the padding cycles the epoch's start
     * (issue #8: it read freed memory once it outgrew its first allocation) */
    gather_epoch(2, 8, false, false, false);
    if (12 % N == 0) gather_epoch(1, 12, true, false, false);
}

static void test_collectives(void) {
    int64_t v[8];
    for (int i = 0; i < N; i++) v[i] = i + 1 + (int64_t)N * R;
    accel_tensor *t = accel_from_data(ACCEL_I64, ACCEL_SHAPE(N), v);
    accel_tensor *g = accel_accelerator_gather(A, t);
    CHECK(g && g->shape[0] == (int64_t)N * N);
    for (int64_t i = 0; g && i < (int64_t)N * N; i++) CHECK(accel_get(g, &i) == (double)(i + 1));
    accel_tensor *bc = accel_accelerator_broadcast(A, t, 0);
    for (int64_t i = 0; bc && i < N; i++) CHECK(accel_get(bc, &i) == (double)(i + 1));
    accel_tensor *sum = accel_accelerator_reduce(A, t, "sum", 1.0);
    accel_tensor *mean = accel_accelerator_reduce(A, accel_to_dtype(t, ACCEL_F32), "mean", 1.0);
    accel_tensor *max = accel_accelerator_reduce(A, t, "max", 1.0);
    for (int64_t i = 0; i < N; i++) {
        double s = (double)N * (i + 1) + (double)N * N * (N - 1) / 2;
        CHECK(accel_get(sum, &i) == s);
        CHECK_CLOSE(accel_get(mean, &i), s / N, 1e-6, 1e-6);
        CHECK(accel_get(max, &i) == (double)(i + 1 + (int64_t)N * (N - 1)));
    }
    CHECK(accel_get(t, (int64_t[]){0}) == (double)(1 + N * R)); /* input untouched */
    /* An unknown reduction was summed and a broadcast from no process copied,
     * silently (on one process always): both refused on any number. */
    CHECK(accel_accelerator_reduce(A, t, "avg", 1.0) == NULL);
    CHECK(accel_last_status() == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "reduction must be \"sum\", \"mean\" or \"max\", got \"avg\"");
    CHECK(accel_accelerator_reduce(A, t, NULL, 1.0) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "got NULL");
    CHECK(accel_accelerator_broadcast(A, t, N) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "from_process");
    CHECK(accel_accelerator_broadcast(A, t, -1) == NULL);
    CHECK(accel_last_status() == ACCEL_ERR_INVALID_ARG);
    accel_clear_error();
    /* pad_across_processes: rank 0 has arange(N+1), others arange(N) */
    accel_tensor *p = accel_accelerator_pad_across_processes(A, accel_arange(ACCEL_I64, 0, R == 0 ? N + 1 : N), 0,
                                                             0, false);
    CHECK(p && p->shape[0] == N + 1);
    if (p && R != 0) {
        for (int64_t i = 0; i < N; i++) CHECK(accel_get(p, &i) == (double)i);
        CHECK(accel_get(p, (int64_t[]){N}) == 0.0);
    }
    accel_tensor *pf = accel_accelerator_pad_across_processes(A, accel_arange(ACCEL_I64, 0, R == 0 ? N + 1 : N), 0,
                                                              -1, true);
    if (pf && R != 0) CHECK(accel_get(pf, (int64_t[]){0}) == -1.0 && accel_get(pf, (int64_t[]){1}) == 0.0);
    /* 0-d tensors gather into 1-d */
    accel_tensor *s0 = accel_accelerator_gather(A, accel_sum_all(accel_to_dtype(t, ACCEL_F32)));
    CHECK(s0 && s0->ndim == 1 && s0->shape[0] == N);
    /* gather_object: every rank's blob in rank order */
    unsigned char mine = (unsigned char)R;
    void *all = NULL;
    size_t lens[8];
    CHECK(accel_accelerator_gather_object(A, &mine, 1, &all, lens) == ACCEL_OK);
    for (int r = 0; all && r < N; r++) CHECK(((unsigned char *)all)[r] == r && lens[r] == 1);
    accel_free(all);
    void *blob = R == 0 ? "hello" : NULL;
    size_t blen = R == 0 ? 6 : 0;
    CHECK(accel_accelerator_broadcast_object(A, &blob, &blen, 0) == ACCEL_OK);
    CHECK(blen == 6 && !strcmp(blob, "hello"));
    if (R != 0) accel_free(blob);
    if (N > 1 && accel_dist_debug_mode()) {
        /* debug mode: mismatched shapes fail on every rank, naming each rank's shape */
        CHECK(accel_accelerator_gather(A, accel_arange(ACCEL_F32, 0, R + 1)) == NULL);
        CHECK_STR_CONTAINS(accel_last_error(), "shape mismatches");
        CHECK_STR_CONTAINS(accel_last_error(), "Process 1: [2]");
        accel_clear_error();
        CHECK(accel_accelerator_reduce(A, accel_arange(ACCEL_F32, 0, R + 1), "sum", 1.0) == NULL);
        accel_clear_error();
    }
    accel_step_reset();
}

static double inv_sqrt(int64_t step, void *ctx) { return 1.0 / (1.0 + (double)step); }

/* What tools/sweep_collectives.py found against Accelerate under gloo. */
static void test_collectives_torch_edges(void) {
    /* A 0-d int64 travels as its bytes: through a double (2^62 + 1 + R) lost
     * its low bits, silently. */
    int64_t big = ((int64_t)1 << 62) + 1 + R;
    accel_tensor *g = accel_accelerator_gather(A, accel_from_data(ACCEL_I64, 0, NULL, &big));
    CHECK(g && g->ndim == 1 && g->shape[0] == N);
    for (int r = 0; g && r < N; r++) CHECK(((int64_t *)g->data)[r] == ((int64_t)1 << 62) + 1 + r);
    accel_tensor *b0 = accel_accelerator_broadcast(A, accel_from_data(ACCEL_I64, 0, NULL, &big), 0);
    CHECK(b0 && b0->ndim == 0 && *(int64_t *)b0->data == ((int64_t)1 << 62) + 1);
    /* Integer sums wrap as torch's; uint8, int8, int16 reduce (they were refused); a bool
     * sum is any-true, byte 1 (torch's gloo leaves the count in the byte). */
    int32_t i32 = INT32_MAX;
    accel_tensor *s32 = accel_accelerator_reduce(A, accel_from_data(ACCEL_I32, 1, (int64_t[]){1}, &i32), "sum", 1.0);
    CHECK(s32 && ((int32_t *)s32->data)[0] == (int32_t)(uint32_t)((uint64_t)INT32_MAX * (uint64_t)N));
    uint8_t u8[2] = {200, (uint8_t)(10 + R)};
    accel_tensor *su = accel_accelerator_reduce(A, accel_from_data(ACCEL_U8, 1, (int64_t[]){2}, u8), "sum", 1.0);
    CHECK_MSG(su != NULL, "%s", accel_last_error());
    if (su) {
        CHECK(su->dtype == ACCEL_U8 && ((uint8_t *)su->data)[0] == (uint8_t)(200 * N));
        CHECK(((uint8_t *)su->data)[1] == (uint8_t)(10 * N + N * (N - 1) / 2));
    }
    accel_tensor *mu = accel_accelerator_reduce(A, accel_from_data(ACCEL_U8, 1, (int64_t[]){2}, u8), "max", 1.0);
    CHECK(mu && ((uint8_t *)mu->data)[1] == (uint8_t)(10 + N - 1));
    int8_t i8 = (int8_t)(100 + R);
    accel_tensor *s8 = accel_accelerator_reduce(A, accel_from_data(ACCEL_I8, 0, NULL, &i8), "sum", 1.0);
    CHECK(s8 && s8->ndim == 0 && *(int8_t *)s8->data == (int8_t)(uint8_t)(100 * N + N * (N - 1) / 2));
    int16_t i16 = (int16_t)(-30000 - R);
    accel_tensor *m16 = accel_accelerator_reduce(A, accel_from_data(ACCEL_I16, 0, NULL, &i16), "max", 1.0);
    CHECK(m16 && *(int16_t *)m16->data == -30000);
    bool bits[2] = {true, R == N - 1};
    accel_tensor *sb = accel_accelerator_reduce(A, accel_from_data(ACCEL_BOOL, 1, (int64_t[]){2}, bits), "sum", 1.0);
    CHECK(sb && sb->dtype == ACCEL_BOOL && ((uint8_t *)sb->data)[0] == 1 && ((uint8_t *)sb->data)[1] == 1);
    /* torch's `x /= N` and `x *= scale` refuse an integer tensor: refused on
     * every rank (it was truncated), and the group goes on. */
    const char *bad[][2] = {{"mean", "1"}, {"sum", "2"}, {"max", "0.5"}};
    for (int k = 0; k < 3; k++) {
        accel_tensor *t = accel_from_data(ACCEL_I64, 1, (int64_t[]){1}, &big);
        CHECK(accel_accelerator_reduce(A, t, bad[k][0], atof(bad[k][1])) == NULL);
        CHECK(accel_last_status() == ACCEL_ERR_DTYPE);
        CHECK_STR_CONTAINS(accel_last_error(), "of a tensor of int64: the result would be fractional");
        accel_clear_error();
    }
    /* mean and scale round as torch's `x *= scale; x /= N` in float: two
     * roundings, not one multiplication by scale / N in double. */
    float xs[64], xs_all[64] = {0};
    for (int i = 0; i < 64; i++) xs[i] = 0.37f * (float)(i + 1) + (float)R;
    for (int r = 0; r < N; r++)
        for (int i = 0; i < 64; i++) xs_all[i] += 0.37f * (float)(i + 1) + (float)r; /* exact: small sums */
    accel_tensor *m = accel_accelerator_reduce(A, accel_from_floats(ACCEL_SHAPE(64), xs), "mean", 0.1);
    int off = 0;
    for (int i = 0; m && i < 64; i++) off += ((float *)m->data)[i] != (xs_all[i] * 0.1f) / (float)N;
    CHECK_MSG(m && off == 0, "%d of 64 elements differ from (sum * 0.1f) / N", off);
    /* float64 in double (not the f32 of the pointwise kernels); bfloat16
     * rounded after each of the two, as torch's ops store it (the sums of
     * these values are exact) */
    double ds[64], ds_all[64] = {0};
    uint16_t bs[64];
    float bs_all[64] = {0};
    for (int i = 0; i < 64; i++) {
        ds[i] = 0.375 * (i + 1) + R;
        bs[i] = accel_f32_to_bf16((float)(i + 1 + R));
        for (int r = 0; r < N; r++) ds_all[i] += 0.375 * (i + 1) + r, bs_all[i] += (float)(i + 1 + r);
    }
    accel_tensor *md = accel_accelerator_reduce(A, accel_from_data(ACCEL_F64, 1, (int64_t[]){64}, ds), "mean", 0.1);
    accel_tensor *mb = accel_accelerator_reduce(A, accel_from_data(ACCEL_BF16, 1, (int64_t[]){64}, bs), "mean", 0.1);
    int off_d = 0, off_b = 0;
    for (int i = 0; md && mb && i < 64; i++) {
        off_d += ((double *)md->data)[i] != ds_all[i] * 0.1 / N;
        uint16_t times = accel_f32_to_bf16(bs_all[i] * 0.1f);
        off_b += ((uint16_t *)mb->data)[i] != accel_f32_to_bf16(accel_bf16_to_f32(times) / (float)N);
    }
    CHECK_MSG(md && mb && off_d == 0 && off_b == 0, "of 64 elements %d (float64) and %d (bfloat16) differ from "
              "torch's `x *= 0.1; x /= N`", off_d, off_b);
    /* pad_index: what the dtype holds exactly (Accelerate's wraps or turns
     * the padded ranks' result float or int64), and a dim in range, both
     * refused on every rank before the collective, each naming its value. */
    struct { accel_dtype dt; double pad; } nofit[] = {
        {ACCEL_U8, 300}, {ACCEL_U8, -1}, {ACCEL_I32, 0.5}, {ACCEL_I64, NAN}, {ACCEL_BOOL, 2}};
    for (size_t k = 0; k < sizeof nofit / sizeof *nofit; k++) {
        accel_tensor *t = accel_zeros(nofit[k].dt, 1, (int64_t[]){R + 1});
        CHECK(accel_accelerator_pad_across_processes(A, t, 0, nofit[k].pad, false) == NULL);
        CHECK_STR_CONTAINS(accel_last_error(), "does not fit a tensor of");
        accel_clear_error();
    }
    accel_tensor *pb = accel_accelerator_pad_across_processes(A, accel_zeros(ACCEL_BOOL, 1, (int64_t[]){R + 1}), 0,
                                                              1, false);
    CHECK(pb && pb->dtype == ACCEL_BOOL && pb->shape[0] == N && ((uint8_t *)pb->data)[N - 1] == (R + 1 < N));
    CHECK(accel_accelerator_pad_across_processes(A, accel_zeros(ACCEL_F32, 2, (int64_t[]){2, 2}), -3, 0, false) ==
          NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "dim -3 is out of range for a tensor of 2 dims (valid: -2 to 1)");
    accel_clear_error();
    accel_tensor *after = accel_accelerator_gather(A, accel_from_data(ACCEL_I64, 0, NULL, &big));
    CHECK(after && after->shape[0] == N);
    accel_step_reset();
}

static void test_scheduler_and_clip(void) {
    accel_manual_seed(3);
    accel_module *m = mlp();
    accel_optimizer *opt = sgd(m, 0.5);
    accel_lr_scheduler *s = accel_lr_scheduler_lambda(opt, inv_sqrt, NULL);
    CHECK(accel_accelerator_prepare(A, m, opt, NULL, s) == ACCEL_OK);
    accel_accelerator_set_gradient_accumulation_steps(A, 2);
    float xs[8] = {0.1f, -0.2f, 0.3f, 0.4f, 0.5f, 0.6f, -0.7f, 0.8f};
    for (int micro = 0; micro < 4; micro++) {
        accel_accelerator_accumulate(A);
        accel_tensor *x = accel_from_floats(ACCEL_SHAPE(2, 4), xs);
        accel_tensor *loss = accel_sum_all(accel_module_call(m, x));
        CHECK(accel_accelerator_backward(A, loss) == ACCEL_OK);
        if (accel_accelerator_sync_gradients(A)) {
            /* the global norm: gradients are identical on every rank after the all-reduce */
            double norm = accel_accelerator_clip_grad_norm(A, m, 1e-3, 2.0);
            accel_tensor *all = accel_accelerator_gather(A, accel_full(ACCEL_F64, ACCEL_SHAPE(1), norm));
            for (int64_t r = 0; r < N; r++) CHECK(accel_get(all, &r) == norm);
            accel_tensor **ps;
            int np = accel_module_parameters(m, &ps);
            double after = 0;
            for (int i = 0; i < np; i++)
                for (int64_t k = 0; k < accel_numel(ps[i]); k++)
                    after += pow(((float *)ps[i]->grad->data)[k], 2);
            accel_free(ps);
            CHECK(norm > 1e-3);
            CHECK_CLOSE(sqrt(after), 1e-3, 1e-3, 1e-7);
            /* norm_type <= 0 is no norm (it gave 0 here), max_norm < 0 would flip every gradient */
            CHECK(isnan(accel_accelerator_clip_grad_norm(A, m, 1.0, -2.0)));
            CHECK_STR_CONTAINS(accel_last_error(), "norm_type must be > 0");
            CHECK(isnan(accel_accelerator_clip_grad_norm(A, m, -1.0, 2.0)));
            CHECK_STR_CONTAINS(accel_last_error(), "max_norm must be >= 0");
            accel_clear_error();
            CHECK_CLOSE(accel_accelerator_clip_grad_norm(A, m, 1.0, 2.0), 1e-3, 1e-3, 1e-7); /* untouched */
            /* a NaN gradient gives a NaN inf-norm, as torch's (the max dropped it: the others' came back) */
            np = accel_module_parameters(m, &ps);
            float *g0 = (float *)ps[np - 1]->grad->data, keep = g0[0];
            accel_free(ps);
            g0[0] = NAN;
            for (int inf = 0; inf < 2; inf++) {
                CHECK(isnan(accel_accelerator_clip_grad_norm(A, m, 1e30, inf ? INFINITY : 2.0)));
                CHECK(accel_last_status() == ACCEL_ERR_INVALID_ARG);
                CHECK_STR_CONTAINS(accel_last_error(), "the total gradient norm is nan");
            }
            g0[0] = keep;
            accel_clear_error();
        }
        accel_accelerator_optimizer_step(A, opt);
        accel_accelerator_scheduler_step(A, s);
        accel_accelerator_zero_grad(A, opt);
        accel_step_reset();
        /* AcceleratedScheduler: steps num_processes times per sync step, never in between */
        CHECK(accel_lr_scheduler_last_epoch(s) == (int64_t)N * ((micro + 1) / 2));
    }
    CHECK_CLOSE(accel_optimizer_get_lr(opt, 0), 0.5 / (1.0 + 2.0 * N), 1e-12, 0);
    CHECK_MSG(accel_accelerator_clear(A) == ACCEL_OK, "%s", accel_last_error());
    accel_accelerator_set_gradient_accumulation_steps(A, 1);
    accel_lr_scheduler_free(s);
    accel_optimizer_free(opt);
    accel_module_free(m);
}

/* Whether the ranks' gradients of m's first parameter are equal after a
 * backward of a loss that differs by rank (its gradients zeroed first). */
static bool grads_synced(accel_module *m, accel_optimizer *opt) {
    accel_optimizer_zero_grad(opt);
    float xs[4] = {(float)R + 1, 1, 2, 3 - (float)R};
    accel_tensor *y = accel_module_call(m, accel_from_floats(ACCEL_SHAPE(1, 4), xs));
    CHECK(accel_accelerator_backward(A, accel_sum_all(y)) == ACCEL_OK);
    accel_tensor **ps;
    accel_module_parameters(m, &ps);
    accel_tensor *g = accel_accelerator_gather(A, ps[0]->grad);
    int64_t n = accel_numel(ps[0]->grad);
    bool same = g != NULL;
    for (int64_t k = 0; g && k < (int64_t)(N - 1) * n; k++) same &= ((float *)g->data)[k] == ((float *)g->data)[n + k];
    accel_free(ps);
    accel_step_reset();
    return same;
}

/* no_sync contexts nest, as DDP's do: the all-reduce resumes at the outermost
 * end (an inner end turned it back on inside the outer context), and an end
 * without its begin is refused (it returned OK) */
static void test_no_sync_nests(void) {
    accel_manual_seed(7);
    accel_module *m = mlp();
    accel_optimizer *opt = sgd(m, 0.1);
    CHECK(accel_accelerator_prepare(A, m, opt) == ACCEL_OK);
    CHECK(grads_synced(m, opt));
    CHECK(accel_accelerator_no_sync_begin(A, m) == ACCEL_OK);
    CHECK(accel_accelerator_no_sync_begin(A, m) == ACCEL_OK);
    CHECK(accel_accelerator_no_sync_end(A, m) == ACCEL_OK);
    CHECK(grads_synced(m, opt) == (N == 1)); /* still inside the outer no_sync */
    CHECK(accel_accelerator_no_sync_end(A, m) == ACCEL_OK);
    CHECK(grads_synced(m, opt));
    CHECK(accel_accelerator_no_sync_end(A, m) == ACCEL_ERR_STATE);
    CHECK_STR_CONTAINS(accel_last_error(), "not inside no_sync");
    accel_clear_error();
    CHECK(grads_synced(m, opt)); /* the refused end changed nothing */
    CHECK_MSG(accel_accelerator_clear(A) == ACCEL_OK, "%s", accel_last_error());
    accel_optimizer_free(opt);
    accel_module_free(m);
}

/* The first parameter's gradient (the [8, 4] weight: 32 floats) after an accelerator backward of this rank's input. */
static void first_grad(accel_module *m, accel_optimizer *opt, float *out) {
    accel_optimizer_zero_grad(opt);
    float xs[4] = {(float)R + 1, 1, 2, 3 - (float)R};
    accel_tensor *y = accel_module_call(m, accel_from_floats(ACCEL_SHAPE(1, 4), xs));
    CHECK(accel_accelerator_backward(A, accel_sum_all(y)) == ACCEL_OK);
    accel_tensor **ps;
    accel_module_parameters(m, &ps);
    if (ps[0]->grad && accel_numel(ps[0]->grad) == 32) accel_to_floats(ps[0]->grad, out);
    else CHECK_MSG(false, "the first parameter's gradient is not [8, 4]");
    accel_free(ps);
    accel_step_reset();
}

static int user_ready_calls;
static void user_ready(accel_tensor *leaf, void *ctx) {
    (void)leaf;
    user_ready_calls += ctx == &user_ready_calls;
}

/* A hook that changes each leaf's gradient on this rank alone (+ R + 1):
 * what it changes is what the data-parallel reduction averages ((N + 1) / 2
 * more on every element). Not told apart here: the hook run after the
 * strategy's within one leaf's call (that passes this too, measured). */
static void user_ready_shift(accel_tensor *leaf, void *ctx) {
    (void)ctx;
    float *g = leaf->grad->data;
    for (int64_t k = 0; k < accel_numel(leaf->grad); k++) g[k] += (float)(R + 1);
}

/* A grad-ready hook the user set is theirs: the accelerator's backward calls
 * it for every leaf before the data-parallel one (which still syncs, and
 * reduces what the hook changed) and leaves it set (it dropped it: a later
 * plain backward never called it) */
static void test_user_grad_ready_hook_kept(void) {
    accel_manual_seed(7);
    accel_module *m = mlp();
    accel_optimizer *opt = sgd(m, 0.1);
    CHECK(accel_accelerator_prepare(A, m, opt) == ACCEL_OK);
    accel_set_grad_ready_hook(user_ready, &user_ready_calls);
    user_ready_calls = 0;
    CHECK(grads_synced(m, opt));
    CHECK_MSG(user_ready_calls == 4, "the accelerator's backward called the user's hook %d times (4 leaves)",
              user_ready_calls);
    user_ready_calls = 0;
    float xs[4] = {1, 2, 3, 4};
    CHECK(accel_backward(accel_sum_all(accel_module_call(m, accel_from_floats(ACCEL_SHAPE(1, 4), xs)))) == ACCEL_OK);
    accel_step_reset();
    CHECK_MSG(user_ready_calls == 4, "a plain backward after it called the user's hook %d times (4 leaves)",
              user_ready_calls);
    float plain[32] = {0}, shifted[32] = {0};
    first_grad(m, opt, plain);
    accel_set_grad_ready_hook(user_ready_shift, NULL);
    first_grad(m, opt, shifted);
    accel_set_grad_ready_hook(NULL, NULL);
    for (int k = 0; k < 32; k++)
        CHECK_MSG(fabsf(shifted[k] - plain[k] - (float)(N + 1) / 2) < 1e-5f,
                  "element %d: %g, %g without the hook: the hook's change was not the one reduced", k, shifted[k],
                  plain[k]);
    CHECK_MSG(accel_accelerator_clear(A) == ACCEL_OK, "%s", accel_last_error());
    accel_optimizer_free(opt);
    accel_module_free(m);
}

static void test_process_helpers(void) {
    accel_process_split sp = accel_accelerator_split_between_processes(A, 17);
    int64_t q = 17 / N, r = 17 % N;
    CHECK(sp.end - sp.start == q + (R < r ? 1 : 0));
    CHECK(sp.start == R * q + (R < r ? R : r));
    CHECK(sp.padded == q + (r > 0));
    accel_process_split all = accel_accelerator_split_between_processes(A, 2 * N);
    CHECK(all.end - all.start == 2);
    CHECK(accel_accelerator_is_main_process(A) == (R == 0));
    CHECK(accel_accelerator_is_last_process(A) == (R == N - 1));
    char buf[512];
    CHECK_STR_CONTAINS(accel_accelerator_describe(A, buf, sizeof buf), N > 1 ? "MULTI_CPU" : "NO");
    /* main_process_first: the main process writes its line before anyone else */
    char path[64];
    snprintf(path, sizeof path, "/tmp/accel_mpf_%d.txt", (int)getppid());
    if (R == 0) remove(path);
    accel_accelerator_wait_for_everyone(A);
    accel_accelerator_main_process_first_begin(A);
    FILE *f = fopen(path, "a");
    fprintf(f, "%s\n", R == 0 ? "Currently in the main process" : "Now on another process");
    fclose(f);
    accel_accelerator_main_process_first_end(A);
    accel_accelerator_wait_for_everyone(A);
    f = fopen(path, "r");
    char line[64];
    CHECK(fgets(line, sizeof line, f) && !strcmp(line, "Currently in the main process\n"));
    int others = 0;
    while (fgets(line, sizeof line, f)) others += !strcmp(line, "Now on another process\n");
    CHECK(others == N - 1);
    fclose(f);
    accel_accelerator_wait_for_everyone(A);
    if (R == 0) remove(path);
    /* unpaired: refused on every rank (the main process's barrier in _end
     * would meet none), and the pair works after */
    CHECK(accel_accelerator_main_process_first_end(A) == ACCEL_ERR_STATE);
    CHECK_STR_CONTAINS(accel_last_error(), "not inside main_process_first");
    accel_clear_error();
    CHECK(accel_accelerator_main_process_first_begin(A) == ACCEL_OK);
    CHECK(accel_accelerator_main_process_first_begin(A) == ACCEL_ERR_STATE);
    CHECK_STR_CONTAINS(accel_last_error(), "already inside main_process_first");
    accel_clear_error();
    CHECK(accel_accelerator_main_process_first_end(A) == ACCEL_OK);
    /* set_seed: same seed -> same draws; device_specific offsets by rank */
    accel_set_seed(A, 42, false);
    uint64_t a = accel_rng_next_u64(accel_default_rng());
    accel_set_seed(A, 42, false);
    CHECK(accel_rng_next_u64(accel_default_rng()) == a);
    accel_set_seed(A, 42, true);
    CHECK(accel_default_rng()->seed == 42 + (uint64_t)R);
    /* a NULL accelerator is Accelerate's set_seed(7, device_specific=True) before any Accelerator: + the
     * launcher's RANK, so the processes are not seeded alike (tests/test_set_seed.c) */
    CHECK(accel_set_seed(NULL, 7, true) == ACCEL_OK && accel_default_rng()->seed == 7 + (uint64_t)R);
}

int main(void) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.mixed_precision = "no";
    o.bucket_cap_bytes = 64; /* several buckets even for this small model */
    A = accel_accelerator_new(&o);
    if (!A) {
        fprintf(stderr, "%s\n", accel_last_error());
        return 1;
    }
    N = accel_accelerator_num_processes(A);
    R = accel_accelerator_process_index(A);
    RUN(test_ddp_equivalence);
    RUN(test_accumulation_equivalence);
    RUN(test_gather_for_metrics);
    RUN(test_collectives);
    RUN(test_collectives_torch_edges);
    RUN(test_scheduler_and_clip);
    RUN(test_no_sync_nests);
    RUN(test_user_grad_ready_hook_kept);
    RUN(test_process_helpers);
    accel_accelerator_free(A);
    accel_thread_cleanup();
    return check_summary();
}
