/* TransformerEngine's amax reduction (reduce_amax): the Accelerator's
 * accel__fp8_reduce_and_update, the function its forward hook and its
 * backward call, on an fp8-converted model under a deferred-update recipe
 * (as the Accelerator's). Run plainly (one process: each rank's own amaxes
 * decide) and under `accel launch --num_processes 2` (ctest fp8_amax_2),
 * where every rank sees different inputs and gradients, hence different
 * amaxes: after the reduction every rank holds the same metas, their scales
 * those of the MAX over the ranks' amaxes (gathered separately with
 * all_gather). On the cpu (here and in CI) the model runs the fp8 Linear's
 * CPU reference; with ACCEL_DEFAULT_DEVICE=cuda:0 (tools/gpu_check.sh, both
 * ranks on one GPU) the GPU's kernels, and the reduction stages device
 * buffers. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "accel/dist.h"
#include "accel/nn.h"
#include "accelerator/fp8_scaling.h"
#include "check.h"
#include "nn/fp8_modules.h"
#include "nn/nn_internal.h"
#include "ops/fp8_linear.h"

enum { LEN = 4, S = ACCEL__FP8_SLOTS, ROWS = ACCEL__FP8_META_ROWS(LEN), MAXW = 8, N_META = 2 };

static uint64_t g_rng;
static accel_device g_dev; /* accel_default_device() */
static float rnd(void) { /* uniform in [-1, 1) */
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((g_rng >> 40) / (double)(1u << 24)) * 2.0f - 1.0f;
}

static void fill(accel_tensor *t, float amp) {
    float v[64 * 64];
    for (int64_t i = 0; i < accel_numel(t); i++) v[i] = amp * rnd();
    CHECK(accel_tensor_from_host(t, v) == ACCEL_OK);
}

/* Two fp8 Linears (32 -> 48 -> 32) and one that stays bf16 (odd dims), the
 * same weights on every rank (as DDP's broadcast leaves them). */
static accel_module *model_new(accel__fp8_recipe r) {
    accel_module *kids[3] = {accel_linear_new(32, 48, true, g_dev, ACCEL_F32),
                             accel_linear_new(48, 32, false, g_dev, ACCEL_F32),
                             accel_linear_new(32, 17, true, g_dev, ACCEL_F32)};
    accel_module *m = accel_sequential_new(3, kids);
    g_rng = 12345;
    for (int k = 0; k < 3; k++) fill(accel__module_tensor(kids[k], "weight"), 0.2f);
    CHECK(accel__fp8_convert_model(m, r) == ACCEL_OK);
    return m;
}

/* meta k of the model (0, 1), f32 [ROWS, S] on the host. */
static void meta_host(accel_module *m, int k, float *out) {
    accel_tensor *meta = accel__module_tensor(m->children[k], "fp8_meta");
    CHECK(meta && accel_numel(meta) == ROWS * S && accel_tensor_to_host(meta, out) == ACCEL_OK);
}

/* The current amaxes of every meta's slots [first, first + n), each rank's,
 * as all_gather sees them: got[rank][k][slot]. */
static void gather_amaxes(accel_pg *pg, accel_module *m, float got[MAXW][N_META][S]) {
    float mine[N_META][S], meta[ROWS * S];
    for (int k = 0; k < N_META; k++) {
        meta_host(m, k, meta);
        memcpy(mine[k], meta + 2 * S, sizeof mine[k]);
    }
    CHECK(accel_pg_all_gather(pg, mine, got, N_META * S, ACCEL_F32) == ACCEL_OK);
}

/* After the reduction of slots [first, first + n): each meta's scales are
 * fp8_max / (the MAX over the ranks' amaxes), that MAX is the history's
 * newest row, and the metas are identical on every rank. */
static void check_reduced(accel_pg *pg, accel_module *m, float seen[MAXW][N_META][S], int first, int n,
                          accel__fp8_recipe r) {
    int world = accel_pg_size(pg);
    for (int k = 0; k < N_META; k++) {
        float meta[ROWS * S];
        meta_host(m, k, meta);
        for (int s = first; s < first + n; s++) {
            float want = 0.0f;
            for (int q = 0; q < world; q++) want = fmaxf(want, seen[q][k][s]);
            float scale = accel__fp8_max(accel__fp8_slot_format(r, s)) / want;
            const float newest = meta[2 * S + (LEN - 1) * S + s];
            CHECK_MSG(newest == want && meta[2 * S + s] == 0.0f, "meta %d slot %d: newest history %g, want the MAX %g",
                      k, s, newest, want);
            CHECK_MSG(meta[s] == scale && meta[S + s] == 1.0f / scale, "meta %d slot %d: scale %g, want %g", k, s,
                      meta[s], scale);
        }
        float all[MAXW][ROWS * S];
        CHECK(accel_pg_all_gather(pg, meta, all, ROWS * S, ACCEL_F32) == ACCEL_OK);
        for (int q = 1; q < world; q++)
            CHECK_MSG(!memcmp(all[0], all[q], sizeof all[0]), "meta %d differs between ranks 0 and %d", k, q);
    }
}

/* On world > 1 the ranks' amaxes of slot s differ (else the test would not see a missing reduction). */
static void check_ranks_differ(accel_pg *pg, float seen[MAXW][N_META][S], int s) {
    for (int q = 1; q < accel_pg_size(pg); q++) CHECK(seen[q][0][s] != seen[0][0][s]);
}

/* Two steps: forward under the fp8 autocast (deferred: the casts only record
 * their amaxes), the forward's reduction (X, W), backward with this rank's
 * gradient, the backward's reduction (DY). Inputs and gradients scale with
 * the rank, so the ranks' amaxes differ. */
static void test_reduce_two_steps(accel_pg *pg) {
    const int rank = accel_pg_rank(pg);
    accel__fp8_recipe r = accel__fp8_recipe_default();
    r.history_len = LEN, r.use_max = false, r.deferred_update = true;
    accel_module *m = model_new(r);
    accel__fp8_state *fs;
    CHECK(accel__fp8_state_new(m, &fs) == ACCEL_OK && fs->n == N_META);
    g_rng = 777 + 31 * (uint64_t)rank;
    for (int step = 0; step < 2; step++) {
        accel_tensor *x = accel_empty(ACCEL_F32, ACCEL_SHAPE(2, 16, 32));
        fill(x, 1.0f + (float)rank + (float)step);
        const accel__fp8_recipe *prev = accel__fp8_autocast_begin(&r);
        accel_tensor *h = accel_module_call(m->children[0], x);
        accel_tensor *y = h ? accel_module_call(m->children[1], h) : NULL;
        accel__fp8_autocast_end(prev);
        CHECK_MSG(y != NULL, "%s", accel_last_error());
        if (!y) break;
        float seen[MAXW][N_META][S], meta[ROWS * S];
        gather_amaxes(pg, m, seen);
        meta_host(m, 0, meta);
        if (step == 0) CHECK(meta[ACCEL__FP8_X] == 1.0f && meta[ACCEL__FP8_W] == 1.0f); /* deferred: not yet */
        check_ranks_differ(pg, seen, ACCEL__FP8_X);
        CHECK(accel__fp8_reduce_and_update(pg, fs, ACCEL__FP8_X, 2, r, NULL) == ACCEL_OK);
        check_reduced(pg, m, seen, ACCEL__FP8_X, 2, r);

        accel_tensor *g = accel_empty(ACCEL_F32, 3, y->shape);
        fill(g, 1e-3f * (float)(1 + 3 * rank));
        CHECK(accel_backward_with(y, g) == ACCEL_OK);
        gather_amaxes(pg, m, seen);
        meta_host(m, 0, meta);
        if (step == 0) CHECK(meta[ACCEL__FP8_DY] == 1.0f);
        check_ranks_differ(pg, seen, ACCEL__FP8_DY);
        CHECK(accel__fp8_reduce_and_update(pg, fs, ACCEL__FP8_DY, 1, r, NULL) == ACCEL_OK);
        check_reduced(pg, m, seen, ACCEL__FP8_DY, 1, r);
        accel_step_reset();
    }
    accel__fp8_state_free(fs);
    accel_module_free(m);
}

/* The metas depth first (the order of the reduced buffer on every rank), none
 * under a Linear that stayed bf16; bad slots are refused. */
static void test_metas_and_errors(accel_pg *pg) {
    accel__fp8_recipe r = accel__fp8_recipe_default();
    r.history_len = LEN;
    accel_module *m = model_new(r);
    accel_tensor **metas, **weights;
    int n;
    CHECK(accel__fp8_model_metas(m, &metas, &weights, &n) == ACCEL_OK && n == 2);
    CHECK(n == 2 && metas[0] == accel__module_tensor(m->children[0], "fp8_meta") &&
          metas[1] == accel__module_tensor(m->children[1], "fp8_meta"));
    CHECK(n == 2 && weights[1] == accel__module_tensor(m->children[1], "weight"));
    accel_free(metas);
    accel_free(weights);
    CHECK(accel__fp8_model_metas(m->children[2], &metas, &weights, &n) == ACCEL_OK && n == 0 && !metas && !weights);
    accel__fp8_state *fs;
    CHECK(accel__fp8_state_new(m, &fs) == ACCEL_OK);
    CHECK(accel__fp8_reduce_and_update(pg, fs, 2, 2, r, NULL) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "slots within 0..2");
    accel_clear_error();
    accel__fp8_state_free(fs);
    accel_module_free(m);
}

int main(void) {
    g_dev = accel_default_device();
    if (g_dev.type != ACCEL_DEV_CPU && accel__fp8_device_check(g_dev, "test_fp8_amax") != ACCEL_OK) {
        printf("SKIP: %s\n", accel_last_error());
        return 77;
    }
    CHECK(accel_dist_init() == ACCEL_OK);
    accel_pg *pg = accel_dist_default_group();
    CHECK(pg && accel_pg_size(pg) <= MAXW);
    if (pg && accel_pg_size(pg) <= MAXW) {
        test_reduce_two_steps(pg);
        test_metas_and_errors(pg);
    }
    accel_dist_finalize();
    return check_summary();
}
