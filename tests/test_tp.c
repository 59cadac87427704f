/* Tensor parallelism (accel/parallel.h) on 2 and 4 forked processes: the
 * copy-to / reduce-from collectives and their gradients against what they
 * must be, the vocabulary-parallel cross-entropy against accel_cross_entropy
 * on the whole logits, and a user's model (vocab-parallel embedding,
 * column- and row-parallel MLP, column-parallel head) whose loss and every
 * gradient equal, within 1e-5, those of the same model on one process. And
 * the step memory the ops keep against the bytes their shapes give: the
 * fused loss its gradient, the sequence-parallel gather and scatter their
 * results (their staging freed). */
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "accel/accel.h"
#include "accel/parallel.h"
#include "check.h"
#include "dist_group.h"
#include "tp_fixture.h"

/* ---- the collectives */

static void test_copy_and_reduce(accel_pg *pg, int rank, int world) {
    /* copy: forward x itself; backward the sum of every rank's gradient */
    float xv[6] = {1, -2, 3, 0.5f, 4, -1}, cv[6];
    for (int i = 0; i < 6; i++) cv[i] = (float)(i + 1) * (float)(rank + 1);
    accel_tensor *x = pf32(ACCEL_SHAPE(2, 3), xv);
    accel_requires_grad_(x, true);
    accel_tensor *c = pf32(ACCEL_SHAPE(2, 3), cv);
    accel_tensor *y = accel_tp_copy_to_region(x, pg);
    CHECK_MSG(y != NULL, "%s", accel_last_error());
    float *yf = floats_of(y);
    close_all("copy_to_region forward", yf, xv, 6);
    CHECK(accel_backward(accel_sum_all(accel_mul(y, c))) == ACCEL_OK);
    float want[6], *gx = floats_of(x->grad);
    for (int i = 0; i < 6; i++) want[i] = (float)(i + 1) * (float)(world * (world + 1) / 2);
    close_all("copy_to_region backward", gx, want, 6);
    free(yf), free(gx);
    accel_step_reset();

    /* reduce: forward the sum of every rank's x; backward the gradient as it is */
    accel_tensor *xr = pf32(ACCEL_SHAPE(2, 3), cv); /* (i + 1)(rank + 1) */
    accel_requires_grad_(xr, true);
    accel_tensor *r = accel_tp_reduce_from_region(xr, pg);
    CHECK_MSG(r != NULL, "%s", accel_last_error());
    float *rf = floats_of(r);
    close_all("reduce_from_region forward", rf, want, 6);
    CHECK(accel_backward(accel_sum_all(accel_mul(r, x))) == ACCEL_OK);
    float *gr = floats_of(xr->grad);
    close_all("reduce_from_region backward", gr, xv, 6);
    free(rf), free(gr);
    accel_step_reset();
    accel_tensor_free(x), accel_tensor_free(c), accel_tensor_free(xr);

    /* gather from region: forward every rank's columns in rank order; backward its own columns */
    float gv[4] = {(float)rank, (float)rank + 0.5f, (float)-rank, 2.0f * (float)rank};
    accel_tensor *xg = pf32(ACCEL_SHAPE(2, 2), gv);
    accel_requires_grad_(xg, true);
    accel_tensor *g = accel_tp_gather_from_region(xg, pg);
    CHECK_MSG(g && g->shape[0] == 2 && g->shape[1] == 2 * world, "%s", accel_last_error());
    if (g) {
        float *gf = floats_of(g), wantg[2 * 2 * 4], weights[2 * 2 * 4];
        for (int i = 0; i < 2; i++)
            for (int r = 0; r < world; r++)
                for (int j = 0; j < 2; j++) {
                    float v[4] = {(float)r, (float)r + 0.5f, (float)-r, 2.0f * (float)r};
                    wantg[i * 2 * world + r * 2 + j] = v[i * 2 + j];
                    weights[i * 2 * world + r * 2 + j] = (float)(i * 2 * world + r * 2 + j);
                }
        close_all("gather_from_region forward", gf, wantg, 4 * world);
        accel_tensor *wt = pf32(ACCEL_SHAPE(2, 2 * world), weights);
        CHECK(accel_backward(accel_sum_all(accel_mul(g, wt))) == ACCEL_OK);
        float *gg = floats_of(xg->grad), wantgg[4];
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 2; j++) wantgg[i * 2 + j] = (float)(i * 2 * world + rank * 2 + j);
        close_all("gather_from_region backward", gg, wantgg, 4);
        free(gf), free(gg);
        accel_tensor_free(wt);
    }
    accel_step_reset();
    accel_tensor_free(xg);

    /* accel_tp_slice_of: two parts' ranges joined; a slice the whole does not fit refused */
    float wv[6] = {0, 1, 2, 3, 4, 5};
    accel_tensor *whole = pf32(ACCEL_SHAPE(6), wv);
    accel_tp_slice sl = {.dim = 0, .n_parts = 2, .full = {4, 2}, .start = {1, 1}, .local = {2, 1}};
    accel_tensor *cut = accel_tp_slice_of(whole, &sl);
    CHECK_MSG(cut && cut->shape[0] == 3, "%s", accel_last_error());
    if (cut) CHECK(accel_get(cut, (int64_t[]){0}) == 1 && accel_get(cut, (int64_t[]){1}) == 2 &&
                   accel_get(cut, (int64_t[]){2}) == 5);
    sl.full[1] = 3;
    CHECK(accel_tp_slice_of(whole, &sl) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_tp_slice_of: whole [6] does not fit the slice");
    accel_step_reset();
    accel_tensor_free(whole);
}

/* The vocab-parallel loss and gradient against the whole logits' (bf16 too:
 * the gradient in the logits' dtype, compared after rounding). */
static void test_vocab_cross_entropy(accel_pg *pg, int rank, int world) {
    enum { N = 6, V = 12 };
    int64_t Vl = V / world;
    float full[N * V];
    for (int i = 0; i < N * V; i++) full[i] = (float)sin(0.37 * i) * 3.0f;
    int64_t tv[N] = {0, 11, -100, 5, 7, 3};
    accel_tensor *lf = pf32(ACCEL_SHAPE(N, V), full);
    accel_requires_grad_(lf, true);
    accel_tensor *t = pi64(ACCEL_SHAPE(N), tv);
    accel_tensor *ref = accel_cross_entropy(lf, t, -100);
    CHECK(accel_backward(ref) == ACCEL_OK);
    float ref_loss = (float)accel_item(ref), *ref_g = floats_of(lf->grad);
    accel_step_reset();

    float part[N * V];
    for (int i = 0; i < N; i++)
        for (int j = 0; j < Vl; j++) part[i * Vl + j] = full[i * V + rank * Vl + j];
    accel_tensor *ll = pf32(ACCEL_SHAPE(N, Vl), part);
    accel_requires_grad_(ll, true);
    accel_tensor *loss = accel_tp_cross_entropy(ll, t, rank * Vl, -100, pg);
    CHECK_MSG(loss != NULL, "%s", accel_last_error());
    if (loss) {
        CHECK_CLOSE(accel_item(loss), ref_loss, 1e-5, 1e-6);
        CHECK(accel_backward(loss) == ACCEL_OK);
        float *g = floats_of(ll->grad), want[N * V];
        for (int i = 0; i < N; i++)
            for (int j = 0; j < Vl; j++) want[i * Vl + j] = ref_g[i * V + rank * Vl + j];
        close_all("vocab cross-entropy gradient", g, want, N * Vl);
        free(g);
    }
    accel_step_reset();
    /* a target past the vocabulary fails on every rank, naming it */
    int64_t bad[N] = {0, 1, 2, V, 4, 5};
    accel_tensor *tb = pi64(ACCEL_SHAPE(N), bad);
    CHECK(accel_tp_cross_entropy(ll, tb, rank * Vl, -100, pg) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "target 12 (row 3) is in no rank's vocabulary slice");
    accel_step_reset();
    /* overlapping slices (rank r from r Vl / 2): the overlap named, on every rank */
    if (world > 1) {
        int64_t half = Vl / 2, mid[N];
        for (int i = 0; i < N; i++) mid[i] = half;
        accel_tensor *tm = pi64(ACCEL_SHAPE(N), mid);
        CHECK(accel_tp_cross_entropy(ll, tm, rank * half, -100, pg) == NULL);
        char want_msg[160];
        snprintf(want_msg, sizeof want_msg, "target %lld (row 0) is in 2 ranks' vocabulary slices: the slices "
                 "overlap (rank 0 holds [0, %lld), rank 1 holds [%lld, %lld))", (long long)half, (long long)Vl,
                 (long long)half, (long long)(half + Vl));
        CHECK_STR_CONTAINS(accel_last_error(), want_msg);
        accel_step_reset();
        accel_tensor_free(tm);
    }
    free(ref_g);
    accel_tensor_free(lf), accel_tensor_free(t), accel_tensor_free(ll), accel_tensor_free(tb);
}

/* ---- step memory: what the ops keep, against the bytes the shapes give
 * (the ops' headers, tape nodes and [N] row numbers within SLACK). A loss
 * composed of ops again (it kept ~14 [N, V / tp] tensors) or collectives
 * whose staging stays in the step arena (a whole send or receive buffer
 * each) go past the bounds. */

enum { SLACK = 8192 };

/* An arena tensor requiring grad (an intermediate's stand-in: its gradient
 * is made in the step arena, as lm_head's output's is). */
static accel_tensor *arena_leaf(int ndim, const int64_t *shape) {
    accel_tensor *t = accel_empty(ACCEL_F32, ndim, shape);
    int64_t n = accel_numel(t);
    float *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = (float)sin(0.11 * (double)i) * 2.0f;
    accel_tensor_from_host(t, v);
    free(v);
    accel_requires_grad_(t, true);
    return t;
}

/* What the step arena took from `used0` to its high-water mark. */
static size_t arena_gain(size_t used0) { return accel_arena_peak(accel_step_arena()) - used0; }

static void test_step_memory(accel_pg *pg, int rank, int world) {
    accel_arena *a = accel_step_arena();
    /* the vocabulary-parallel loss and its backward: the logits' gradient, [N, VL] f32 */
    enum { N = 64, VL = 256 };
    accel_step_reset();
    accel_tensor *logits = arena_leaf(ACCEL_SHAPE(N, VL));
    int64_t tv[N];
    for (int i = 0; i < N; i++) tv[i] = i % 5 == 4 ? -100 : (i * 37) % (VL * world);
    accel_tensor *t = accel_from_data(ACCEL_I64, ACCEL_SHAPE(N), tv);
    size_t used0 = accel_arena_used(a), grad = (size_t)N * VL * sizeof(float);
    accel_tensor *loss = accel_tp_cross_entropy(logits, t, rank * VL, -100, pg);
    CHECK_MSG(loss && accel_backward(loss) == ACCEL_OK, "%s", accel_last_error());
    size_t gain = arena_gain(used0);
    CHECK_MSG(gain >= grad && gain <= grad + 128 * N + SLACK, "vocab-parallel loss: the step arena took %zu bytes, "
              "want the gradient's %zu + [N] rows (%d) + headers", gain, grad, 128 * N);
    CHECK(logits->grad && logits->grad->dtype == ACCEL_F32);

    /* sequence parallelism: x [SB, ST, SC] per rank gathered and scattered
     * back, and the backward. Kept: the results and gradients, 2 whole + 3
     * local; the staging of one collective at a time on top (a whole buffer) */
    enum { SB = 2, ST = 16, SC = 64 };
    accel_step_reset();
    accel_tensor *x = arena_leaf(ACCEL_SHAPE(SB, ST, SC));
    accel_tensor *seed = accel_ones(ACCEL_F32, ACCEL_SHAPE(SB, ST, SC));
    size_t local = (size_t)SB * ST * SC * sizeof(float), whole = local * (size_t)world;
    used0 = accel_arena_used(a);
    accel_tensor *y = accel_tp_gather_seq(x, pg);
    size_t kept = accel_arena_used(a) - used0;
    CHECK_MSG(y && kept >= whole && kept <= whole + SLACK, "gather_seq kept %zu bytes for a %zu-byte result", kept,
              whole);
    accel_tensor *z = accel_tp_scatter_seq(y, pg);
    kept = accel_arena_used(a) - used0;
    CHECK_MSG(z && kept <= whole + local + SLACK, "scatter_seq: %zu bytes kept for results of %zu", kept,
              whole + local);
    CHECK_MSG(accel_backward_with(z, seed) == ACCEL_OK, "%s", accel_last_error());
    kept = accel_arena_used(a) - used0;
    CHECK_MSG(kept >= 2 * whole + 3 * local && kept <= 2 * whole + 3 * local + SLACK,
              "sequence-parallel round trip: %zu bytes kept, want %zu (y, z and their gradients, x's) + headers", kept,
              2 * whole + 3 * local);
    CHECK_MSG(arena_gain(used0) <= kept + whole + SLACK, "sequence-parallel round trip: peak %zu bytes over %zu kept",
              arena_gain(used0), kept);
    /* z = x summed over the ranks: its gradient, the seed gathered and scattered back, is world */
    float *gx = x->grad ? floats_of(x->grad) : NULL, want[SB * ST * SC];
    for (int i = 0; i < SB * ST * SC; i++) want[i] = (float)world;
    if (gx) close_all("sequence-parallel round trip gradient", gx, want, SB * ST * SC);
    CHECK(gx != NULL);
    free(gx);
    accel_step_reset();
}

/* ---- a user's model */

enum { VOCAB = 16, C = 8, H = 24, B = 2, T = 5 };

/* embed -> fc1 -> gelu -> fc2 (+ residual) -> head */
static accel_tensor *mlp_forward(accel_module *m, accel_tensor *ids) {
    accel_module **p = m->children;
    accel_tensor *h = accel_module_call(p[0], ids);
    accel_tensor *u = accel_module_call(p[2], accel_gelu(accel_module_call(p[1], h), true));
    return accel_module_call(p[3], accel_add(h, u));
}

static const accel_module_ops MLP_OPS = {"TinyLM", mlp_forward, NULL};

static accel_module *tiny_lm(void) {
    accel_manual_seed(7);
    accel_module *m = accel_module_new(&MLP_OPS, NULL);
    accel_module_add_child(m, "embed", accel_embedding_new(VOCAB, C, ACCEL_CPU_DEVICE, ACCEL_F32));
    accel_module_add_child(m, "fc1", accel_linear_new(C, H, true, ACCEL_CPU_DEVICE, ACCEL_F32));
    accel_module_add_child(m, "fc2", accel_linear_new(H, C, true, ACCEL_CPU_DEVICE, ACCEL_F32));
    accel_module_add_child(m, "head", accel_linear_new(C, VOCAB, false, ACCEL_CPU_DEVICE, ACCEL_F32));
    return m;
}

static accel_tensor *lm_loss(accel_module *m, accel_tensor *ids, accel_tensor *labels) {
    accel_tensor *logits = accel_module_call(m, ids);
    accel_pg *pg;
    int64_t start;
    if (accel_module_tp_info(m->children[3], NULL, &pg, &start, NULL))
        return accel_tp_cross_entropy(logits, labels, start, -100, pg);
    return accel_cross_entropy(logits, labels, -100);
}

static void test_user_model(accel_pg *pg, int rank, int world) {
    int64_t idv[B * T], lv[B * T];
    for (int i = 0; i < B * T; i++) idv[i] = (i * 7 + 3) % VOCAB, lv[i] = i % 4 == 3 ? -100 : (i * 5 + 1) % VOCAB;
    accel_tensor *ids = pi64(ACCEL_SHAPE(B, T), idv);
    accel_tensor *labels = pi64(ACCEL_SHAPE(B, T), lv);
    accel_module *ref = tiny_lm(), *tp = tiny_lm();
    accel_tp_plan_entry plan[] = {
        {"embed", ACCEL_TP_VOCAB_EMBEDDING, false},
        {"fc1", ACCEL_TP_COLWISE, false},
        {"fc2", ACCEL_TP_ROWWISE, false},
        {"head", ACCEL_TP_COLWISE, false},
    };
    CHECK_MSG(accel_module_parallelize(tp, plan, 4, pg) == ACCEL_OK, "%s", accel_last_error());
    CHECK(accel_module_get_tensor(tp, "fc1.weight")->shape[0] == H / world);
    CHECK(accel_module_get_tensor(tp, "fc2.weight")->shape[1] == H / world);
    CHECK(accel_module_get_tensor(tp, "fc2.bias")->shape[0] == C);
    CHECK(accel_module_get_tensor(tp, "embed.weight")->shape[0] == VOCAB / world);

    accel_tensor *lr = lm_loss(ref, ids, labels);
    CHECK(lr && accel_backward(lr) == ACCEL_OK);
    float ref_loss = lr ? (float)accel_item(lr) : NAN;
    accel_step_reset();
    accel_tensor *lt = lm_loss(tp, ids, labels);
    CHECK_MSG(lt != NULL, "%s", accel_last_error());
    if (lt) {
        CHECK_CLOSE(accel_item(lt), ref_loss, 1e-5, 1e-5);
        CHECK(accel_backward(lt) == ACCEL_OK);
        grads_match(tp, ref);
    }
    accel_step_reset();
    (void)rank;

    /* refusals name the problem and leave the model as it was */
    accel_module *fresh = tiny_lm();
    accel_tp_plan_entry nothing[] = {{"fc9", ACCEL_TP_COLWISE, false}};
    CHECK(accel_module_parallelize(fresh, nothing, 1, pg) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "plan entry 0 (\"fc9\") matches no module");
    accel_tp_plan_entry wrong[] = {{"fc1", ACCEL_TP_COLWISE, false}, {"embed", ACCEL_TP_ROWWISE, false}};
    CHECK(accel_module_parallelize(fresh, wrong, 2, pg) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "embed is a Embedding: ACCEL_TP_ROWWISE takes a Linear");
    CHECK(accel_module_get_tensor(fresh, "fc1.weight")->shape[0] == H);
    if (world > 1) {
        accel_module *odd = accel_module_new(&MLP_OPS, NULL);
        accel_module_add_child(odd, "fc", accel_linear_new(C, 3, true, ACCEL_CPU_DEVICE, ACCEL_F32));
        accel_tp_plan_entry one[] = {{"f*", ACCEL_TP_COLWISE, false}};
        CHECK(accel_module_parallelize(odd, one, 1, pg) == ACCEL_ERR_INVALID_ARG);
        CHECK_STR_CONTAINS(accel_last_error(), "splits out_features 3, which");
        accel_module_free(odd);
    }
    CHECK(accel_module_parallelize(tp, plan + 1, 1, pg) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "fc1 is already parallelized");
    /* a model still tied to the handle its load returned: refused, naming the
     * handle to free; freed, the same plan cuts it */
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/accel_test_tp_%d_%d", (int)getpid(), world);
    CHECK(accel_save_module(dir, fresh, 0) == ACCEL_OK);
    accel_module *loaded = tiny_lm();
    accel_dispatched *d = accel_load_checkpoint_in_model(loaded, dir, NULL, NULL);
    CHECK_MSG(d != NULL, "%s", accel_last_error());
    CHECK(accel_module_parallelize(loaded, plan, 4, pg) == ACCEL_ERR_STATE);
    CHECK_STR_CONTAINS(accel_last_error(), "only once that handle is freed (accel_dispatched_free");
    accel_dispatched_free(d);
    CHECK_MSG(accel_module_parallelize(loaded, plan, 4, pg) == ACCEL_OK, "%s", accel_last_error());
    CHECK(accel_module_get_tensor(loaded, "fc1.weight")->shape[0] == H / world);
    accel_module_free(loaded);
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    accel_module_free(fresh), accel_module_free(ref), accel_module_free(tp);
    accel_tensor_free(ids), accel_tensor_free(labels);
}

/* A head tied to the embedding stays tied: one slice, both gradients in it. */
static void test_tied(accel_pg *pg, int world) {
    int64_t idv[B * T], lv[B * T];
    for (int i = 0; i < B * T; i++) idv[i] = (i * 3 + 1) % VOCAB, lv[i] = (i * 11 + 2) % VOCAB;
    accel_tensor *ids = pi64(ACCEL_SHAPE(B, T), idv);
    accel_tensor *labels = pi64(ACCEL_SHAPE(B, T), lv);
    accel_module *ref = tiny_lm(), *tp = tiny_lm();
    CHECK(accel_module_tie(ref, "head.weight", "embed.weight") == ACCEL_OK);
    CHECK(accel_module_tie(tp, "head.weight", "embed.weight") == ACCEL_OK);
    accel_tp_plan_entry half[] = {{"embed", ACCEL_TP_VOCAB_EMBEDDING, false}};
    CHECK(accel_module_parallelize(tp, half, 1, pg) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "parallelizes only one of them");
    accel_tp_plan_entry plan[] = {{"embed", ACCEL_TP_VOCAB_EMBEDDING, false}, {"head", ACCEL_TP_COLWISE, false}};
    CHECK_MSG(accel_module_parallelize(tp, plan, 2, pg) == ACCEL_OK, "%s", accel_last_error());
    CHECK(accel_module_get_tensor(tp, "head.weight") == accel_module_get_tensor(tp, "embed.weight"));
    CHECK(accel_module_get_tensor(tp, "head.weight")->shape[0] == VOCAB / world);
    accel_tensor *lr = lm_loss(ref, ids, labels);
    CHECK(lr && accel_backward(lr) == ACCEL_OK);
    float ref_loss = lr ? (float)accel_item(lr) : NAN;
    accel_step_reset();
    accel_tensor *lt = lm_loss(tp, ids, labels);
    CHECK(lt && accel_backward(lt) == ACCEL_OK);
    if (lt) CHECK_CLOSE(accel_item(lt), ref_loss, 1e-5, 1e-5);
    grads_match(tp, ref);
    accel_step_reset();
    accel_module_free(ref), accel_module_free(tp);
    accel_tensor_free(ids), accel_tensor_free(labels);
}

/* Two column-parallel Linears sharing weight and bias: both cut once, the
 * same slices on both (the bias was cut a second time: "does not fit the
 * slice", the model left half cut). */
static void test_tied_bias(accel_pg *pg, int rank, int world) {
    accel_module *m = accel_module_new(&MLP_OPS, NULL);
    CHECK(accel_module_add_child(m, "a", accel_linear_new(4, 8, true, ACCEL_CPU_DEVICE, ACCEL_F32)) &&
          accel_module_add_child(m, "b", accel_linear_new(4, 8, true, ACCEL_CPU_DEVICE, ACCEL_F32)));
    CHECK(accel_module_tie(m, "b.weight", "a.weight") == ACCEL_OK && accel_module_tie(m, "b.bias", "a.bias") == ACCEL_OK);
    float whole[8], got[8];
    accel_to_floats(accel_module_get_tensor(m, "a.bias"), whole);
    accel_tp_plan_entry plan[] = {{"a", ACCEL_TP_COLWISE, false}, {"b", ACCEL_TP_COLWISE, false}};
    CHECK_MSG(accel_module_parallelize(m, plan, 2, pg) == ACCEL_OK, "%s", accel_last_error());
    accel_tensor *ab = accel_module_get_tensor(m, "a.bias");
    CHECK(ab == accel_module_get_tensor(m, "b.bias") && ab->shape[0] == 8 / world);
    CHECK(accel_module_get_tensor(m, "a.weight")->shape[0] == 8 / world);
    accel_to_floats(ab, got);
    CHECK(!memcmp(got, whole + rank * (8 / world), sizeof(float) * (size_t)(8 / world)));
    accel_module_free(m);
}

static int body(int rank, int world) {
    if (accel_dist_init() != ACCEL_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, accel_last_error());
        return 1;
    }
    accel_pg *pg = accel_dist_default_group();
    test_copy_and_reduce(pg, rank, world);
    test_vocab_cross_entropy(pg, rank, world);
    test_step_memory(pg, rank, world);
    test_user_model(pg, rank, world);
    test_tied(pg, world);
    test_tied_bias(pg, rank, world);
    accel_dist_finalize();
    return check_summary();
}

int main(void) {
    int worlds[] = {1, 2, 4};
    for (int k = 0; k < 3; k++) {
        dist_group g = {.world = worlds[k], .one_machine = true, .timeout = "60", .kill_after_s = 120};
        CHECK(dist_group_runs_ok(&g, body, "world %d", g.world));
    }
    return check_summary();
}
