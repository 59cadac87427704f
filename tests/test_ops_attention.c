/* accel_sdpa: PyTorch fixtures (GQA, bottom-right causal with Tq < Tk),
 * finite differences, fast (small and large heads) vs reference, autocast,
 * meta, errors. */
#include "accel/accel.h"
#include "check.h"
#include "gradcheck.h"
#include "ops_fixture.h"

static void check_fixture(fx_file *f, const char *p, bool causal) {
    char k[64];
    const char *names[3] = {"q", "k", "v"};
    for (int ref = 0; ref < 2; ref++) {
        bool prev = accel_set_reference_kernels(ref);
        accel_tensor *in[3];
        for (int i = 0; i < 3; i++) {
            snprintf(k, sizeof k, "%s.%s", p, names[i]);
            in[i] = fx_get(f, k);
            accel_requires_grad_(in[i], true);
            if (in[i]->grad) accel_zero_(in[i]->grad);
        }
        accel_tensor *y = accel_sdpa(in[0], in[1], in[2], causal, 0.0);
        snprintf(k, sizeof k, "%s.y", p);
        CHECK_FX(k, y, fx_get(f, k), 1e-5, 1e-6);
        snprintf(k, sizeof k, "%s.gy", p);
        CHECK(y && accel_backward_with(y, fx_get(f, k)) == ACCEL_OK);
        for (int i = 0; i < 3; i++) {
            snprintf(k, sizeof k, "%s.d%s", p, names[i]);
            CHECK_FX(k, in[i]->grad, fx_get(f, k), 1e-5, 1e-5);
        }
        accel_set_reference_kernels(prev);
        accel_step_reset();
    }
}

static void test_vs_torch(void) {
    fx_file f;
    if (fx_load(&f, "data/ops_attention.bin")) {
        CHECK(0);
        return;
    }
    check_fixture(&f, "sdpa_causal", true);
    check_fixture(&f, "sdpa_full", false);
    fx_free(&f);
}

typedef struct sdpa_case { bool causal; double scale; } sdpa_case;

static accel_tensor *loss_sdpa(accel_tensor *const *in, int n, void *ctx) {
    const sdpa_case *c = ctx;
    return gc_weighted_sum(accel_sdpa(in[0], in[1], in[2], c->causal, c->scale));
}

static void test_gradcheck(void) {
    struct { int64_t B, H, Hkv, Tq, Tk, D, Dv; sdpa_case c; } cases[] = {
        {2, 4, 2, 3, 5, 4, 4, {true, 0.0}},  /* GQA, causal, Tq < Tk */
        {1, 2, 2, 4, 4, 3, 5, {false, 0.7}}, /* MHA, explicit scale, Dv != D */
        {1, 3, 1, 5, 3, 4, 4, {true, 0.0}},  /* MQA, Tq > Tk: first rows see no key */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        accel_tensor *q = gc_randn(10 + i, ACCEL_SHAPE(cases[i].B, cases[i].H, cases[i].Tq, cases[i].D));
        accel_tensor *k = gc_randn(20 + i, ACCEL_SHAPE(cases[i].B, cases[i].Hkv, cases[i].Tk, cases[i].D));
        accel_tensor *v = gc_randn(30 + i, ACCEL_SHAPE(cases[i].B, cases[i].Hkv, cases[i].Tk, cases[i].Dv));
        CHECK_MSG(gradcheck("sdpa", loss_sdpa, &cases[i].c, 3, (accel_tensor *[]){q, k, v}, NULL) == 0, "case %zu", i);
        accel_tensor_free(q);
        accel_tensor_free(k);
        accel_tensor_free(v);
    }
}

static accel_tensor *randn_leaf(uint64_t seed, int ndim, const int64_t *shape) {
    accel_tensor *t = gc_randn(seed, ndim, shape);
    return t;
}

/* Forward and gradients of the fast path == reference path. */
static void check_fast_vs_ref(int64_t B, int64_t H, int64_t Hkv, int64_t Tq, int64_t Tk, int64_t D) {
    accel_tensor *q = randn_leaf(1, ACCEL_SHAPE(B, H, Tq, D)), *k = randn_leaf(2, ACCEL_SHAPE(B, Hkv, Tk, D)),
                 *v = randn_leaf(3, ACCEL_SHAPE(B, Hkv, Tk, D));
    accel_tensor *y[2], *g[2][3];
    for (int ref = 0; ref < 2; ref++) {
        bool prev = accel_set_reference_kernels(ref);
        accel_tensor *o = accel_sdpa(q, k, v, true, 0.0);
        CHECK(o && accel_backward(accel_sum_all(accel_mul(o, o))) == ACCEL_OK);
        y[ref] = accel_tensor_clone_persistent(o, ACCEL_CPU_DEVICE);
        accel_tensor *in[3] = {q, k, v};
        for (int i = 0; i < 3; i++) {
            g[ref][i] = accel_tensor_clone_persistent(in[i]->grad, ACCEL_CPU_DEVICE);
            accel_zero_(in[i]->grad);
        }
        accel_set_reference_kernels(prev);
        accel_step_reset();
    }
    CHECK(fx_compare("sdpa fast vs ref", y[0], y[1], 1e-4, 1e-5) == 0);
    for (int i = 0; i < 3; i++) CHECK_MSG(fx_compare("sdpa grad fast vs ref", g[0][i], g[1][i], 1e-4, 1e-4) == 0, "input %d", i);
    accel_tensor_free(y[0]);
    accel_tensor_free(y[1]);
    for (int i = 0; i < 3; i++) {
        accel_tensor_free(g[0][i]);
        accel_tensor_free(g[1][i]);
    }
    accel_tensor_free(q);
    accel_tensor_free(k);
    accel_tensor_free(v);
}

static void test_fast_vs_reference(void) {
    check_fast_vs_ref(2, 4, 2, 7, 9, 8);     /* small heads: one thread per head */
    check_fast_vs_ref(1, 2, 1, 64, 64, 64);  /* large heads: threaded BLAS per head */
}

static void test_dtypes_meta_errors(void) {
    accel_tensor *q = accel_ones(ACCEL_F32, ACCEL_SHAPE(1, 2, 3, 4)), *k = accel_ones(ACCEL_F32, ACCEL_SHAPE(1, 1, 3, 4));
    accel_dtype prev = accel_autocast_begin(ACCEL_BF16);
    accel_tensor *o = accel_sdpa(q, k, k, true, 0.0);
    accel_autocast_end(prev);
    CHECK(o && o->dtype == ACCEL_BF16 && accel_get(o, (int64_t[]){0, 1, 2, 3}) == 1.0);
    o = accel_sdpa(accel_to_dtype(q, ACCEL_F16), accel_to_dtype(k, ACCEL_F16), accel_to_dtype(k, ACCEL_F16), false, 0.0);
    CHECK(o && o->dtype == ACCEL_F16);
    /* Tq > Tk causal: a row that sees no key is zero */
    accel_tensor *q5 = accel_ones(ACCEL_F32, ACCEL_SHAPE(1, 1, 5, 4)), *k2 = accel_ones(ACCEL_F32, ACCEL_SHAPE(1, 1, 2, 4));
    o = accel_sdpa(q5, k2, k2, true, 0.0);
    CHECK(o && accel_get(o, (int64_t[]){0, 0, 0, 0}) == 0.0 && accel_get(o, (int64_t[]){0, 0, 4, 0}) == 1.0);
    /* meta */
    accel_tensor *mq = accel_tensor_new(ACCEL_BF16, ACCEL_SHAPE(8, 64, 8192, 128), ACCEL_META_DEVICE);
    accel_tensor *mk = accel_tensor_new(ACCEL_BF16, ACCEL_SHAPE(8, 8, 8192, 128), ACCEL_META_DEVICE);
    o = accel_sdpa(mq, mk, mk, true, 0.0);
    CHECK(o && o->data == NULL && o->shape[1] == 64 && o->shape[2] == 8192);
    accel_tensor_free(mq);
    accel_tensor_free(mk);
    /* errors */
    accel_clear_error();
    CHECK(accel_sdpa(q, accel_ones(ACCEL_F32, ACCEL_SHAPE(1, 3, 3, 4)), accel_ones(ACCEL_F32, ACCEL_SHAPE(1, 3, 3, 4)), false, 0) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_sdpa: shapes [1, 2, 3, 4] and [1, 3, 3, 4]");
    accel_clear_error();
    CHECK(accel_sdpa(q, k, accel_ones(ACCEL_F32, ACCEL_SHAPE(1, 1, 2, 4)), false, 0) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "k and v");
    accel_clear_error();
    CHECK(accel_sdpa(q, NULL, k, false, 0) == NULL && accel_last_status() == ACCEL_ERR_INVALID_ARG);
    accel_clear_error();
    accel_step_reset();
}

/* No query (Tq = 0): the keys and values still get their gradients, zeros
 * (their first ones in the step, which the kernels may write without
 * reading: the op asks that only where a query exists). */
static void test_no_queries(void) {
    for (int causal = 0; causal < 2; causal++) {
        accel_tensor *q = accel_ones(ACCEL_F32, ACCEL_SHAPE(1, 2, 0, 8));
        accel_tensor *kl = accel_full(ACCEL_F32, ACCEL_SHAPE(1, 1, 5, 8), 0.5), *vl = accel_full(ACCEL_F32, ACCEL_SHAPE(1, 1, 5, 8), 2);
        accel_requires_grad_(q, true);
        accel_requires_grad_(kl, true);
        accel_requires_grad_(vl, true);
        /* k and v not leaves: their gradients are fresh step memory */
        accel_tensor *o = accel_sdpa(q, accel_mul_scalar(kl, 3.0), accel_mul_scalar(vl, 3.0), causal, 0.0);
        CHECK(o && o->shape[2] == 0);
        accel_tensor *loss = o ? accel_sum(o, 0, NULL, false) : NULL;
        CHECK_MSG(loss && accel_backward(loss) == ACCEL_OK, "%s", accel_last_error());
        for (int i = 0; i < 2; i++) {
            accel_tensor *g = (i ? vl : kl)->grad;
            float got[40] = {1.0f};
            CHECK(g && accel_numel(g) == 40 && accel_to_floats(g, got) == ACCEL_OK);
            for (int e = 0; e < 40; e++) CHECK_MSG(got[e] == 0.0f, "%s's gradient [%d] = %g", i ? "v" : "k", e, (double)got[e]);
        }
        accel_step_reset();
    }
}

int main(void) {
    RUN(test_vs_torch);
    RUN(test_gradcheck);
    RUN(test_fast_vs_reference);
    RUN(test_dtypes_meta_errors);
    RUN(test_no_queries);
    accel_thread_cleanup();
    return check_summary();
}
