/* accel_cross_entropy and accel_mse_loss: PyTorch fixtures (with
 * ignore_index), finite differences, fast vs reference, errors, meta. */
#include "accel/accel.h"
#include "check.h"
#include "gradcheck.h"
#include "ops_fixture.h"

static accel_tensor *fixture_targets(fx_file *f) {
    accel_tensor *tf = fx_get(f, "ce.t");
    int64_t n = accel_numel(tf), ids[16];
    CHECK(n <= 16 && accel_to_int64s(tf, ids) == ACCEL_OK);
    return accel_from_data(ACCEL_I64, ACCEL_SHAPE(n), ids);
}

static void test_vs_torch(void) {
    fx_file f;
    if (fx_load(&f, "data/ops_loss.bin")) {
        CHECK(0);
        return;
    }
    accel_tensor *x = fx_get(&f, "ce.x"), *p = fx_get(&f, "mse.p"), *q = fx_get(&f, "mse.q");
    accel_requires_grad_(x, true);
    accel_requires_grad_(p, true);
    accel_requires_grad_(q, true);
    for (int ref = 0; ref < 2; ref++) {
        bool prev = accel_set_reference_kernels(ref);
        accel_tensor *l = accel_cross_entropy(x, fixture_targets(&f), -100);
        CHECK_FX("ce.y", l, fx_get(&f, "ce.y"), 1e-5, 1e-6);
        CHECK(accel_backward_with(l, fx_get(&f, "ce.gy")) == ACCEL_OK);
        CHECK_FX("ce.dx", x->grad, fx_get(&f, "ce.dx"), 1e-5, 1e-6);
        l = accel_mse_loss(p, q);
        CHECK_FX("mse.y", l, fx_get(&f, "mse.y"), 1e-5, 1e-6);
        CHECK(accel_backward_with(l, fx_get(&f, "mse.gy")) == ACCEL_OK);
        CHECK_FX("mse.dp", p->grad, fx_get(&f, "mse.dp"), 1e-5, 1e-6);
        CHECK_FX("mse.dq", q->grad, fx_get(&f, "mse.dq"), 1e-5, 1e-6);
        accel_zero_(x->grad);
        accel_zero_(p->grad);
        accel_zero_(q->grad);
        accel_set_reference_kernels(prev);
        accel_step_reset();
    }
    fx_free(&f);
}

static accel_tensor *loss_ce(accel_tensor *const *in, int n, void *ctx) {
    /* logits [2, 3, 4] flattened to [6, 4]; i32 targets with two ignored */
    accel_tensor *t = accel_from_data(ACCEL_I32, ACCEL_SHAPE(6), (int32_t[]){3, -1, 0, 2, -1, 1});
    return accel_mul_scalar(accel_cross_entropy(in[0], t, -1), 3.0);
}

static accel_tensor *loss_mse(accel_tensor *const *in, int n, void *ctx) { return accel_mse_loss(in[0], in[1]); }

static void test_gradcheck(void) {
    accel_tensor *x = gc_randn(1, ACCEL_SHAPE(2, 3, 4));
    CHECK(gradcheck("cross_entropy", loss_ce, NULL, 1, (accel_tensor *[]){x}, NULL) == 0);
    accel_tensor *p = gc_randn(2, ACCEL_SHAPE(3, 5)), *q = gc_randn(3, ACCEL_SHAPE(3, 5));
    CHECK(gradcheck("mse", loss_mse, NULL, 2, (accel_tensor *[]){p, q}, NULL) == 0);
    accel_tensor_free(x);
    accel_tensor_free(p);
    accel_tensor_free(q);
}

static void test_values_and_errors(void) {
    /* uniform logits: loss = log(C) */
    accel_tensor *x = accel_zeros(ACCEL_F32, ACCEL_SHAPE(300, 100));
    accel_tensor *t = accel_zeros(ACCEL_I64, ACCEL_SHAPE(300));
    accel_tensor *l = accel_cross_entropy(x, t, -100);
    CHECK(l && l->ndim == 0 && l->dtype == ACCEL_F32);
    CHECK_CLOSE(accel_item(l), log(100.0), 1e-6, 0);
    /* large logits stay finite (max subtraction); bf16 logits give f32 loss */
    accel_tensor *big = accel_from_floats(ACCEL_SHAPE(1, 2), (float[]){1000.0f, 0.0f});
    CHECK_CLOSE(accel_item(accel_cross_entropy(big, accel_zeros(ACCEL_I64, ACCEL_SHAPE(1)), -100)), 0.0, 0, 1e-6);
    CHECK(accel_cross_entropy(accel_to_dtype(big, ACCEL_BF16), accel_zeros(ACCEL_I64, ACCEL_SHAPE(1)), -100)->dtype ==
          ACCEL_F32);
    /* all ignored: nan, like torch */
    accel_tensor *ign = accel_full(ACCEL_I64, ACCEL_SHAPE(300), -100);
    CHECK(isnan(accel_item(accel_cross_entropy(x, ign, -100))));
    /* errors */
    accel_clear_error();
    CHECK(refused_now_or_at_sync(accel_cross_entropy(x, accel_full(ACCEL_I64, ACCEL_SHAPE(300), 100), -100)));
    CHECK_STR_CONTAINS(accel_last_error(), "target 100");
    accel_clear_error();
    CHECK(accel_cross_entropy(x, accel_zeros(ACCEL_I64, ACCEL_SHAPE(299)), -100) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_cross_entropy: shapes [300, 100] and [299]");
    accel_clear_error();
    /* the right count in the wrong shape: refused, as torch refuses it */
    accel_tensor *x43 = accel_zeros(ACCEL_F32, ACCEL_SHAPE(4, 3));
    CHECK(accel_cross_entropy(x43, accel_zeros(ACCEL_I64, ACCEL_SHAPE(4, 1)), -100) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_cross_entropy: shapes [4, 3] and [4, 1] do not fit");
    accel_clear_error();
    accel_tensor *x243 = accel_zeros(ACCEL_F32, ACCEL_SHAPE(2, 4, 3));
    CHECK(accel_cross_entropy(x243, accel_zeros(ACCEL_I64, ACCEL_SHAPE(4, 2)), -100) == NULL);
    accel_clear_error();
    CHECK(accel_cross_entropy(x243, accel_zeros(ACCEL_I64, ACCEL_SHAPE(2, 4)), -100) != NULL); /* torch's shape */
    CHECK(accel_cross_entropy(x243, accel_zeros(ACCEL_I64, ACCEL_SHAPE(8)), -100) != NULL);    /* flat */
    CHECK(accel_cross_entropy(accel_zeros(ACCEL_F32, ACCEL_SHAPE(3)), accel_zeros(ACCEL_I64, 0, NULL), -100) != NULL);
    CHECK(accel_cross_entropy(x, x, -100) == NULL && accel_last_status() == ACCEL_ERR_DTYPE);
    accel_clear_error();
    CHECK(accel_mse_loss(x, t) == NULL && accel_last_status() == ACCEL_ERR_DTYPE);
    accel_clear_error();
    CHECK(accel_mse_loss(x, accel_zeros(ACCEL_F32, ACCEL_SHAPE(3))) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_mse_loss: shapes [300, 100] and [3]");
    accel_clear_error();
    /* mse value; fast (parallel) == reference */
    accel_tensor *a = accel_full(ACCEL_F32, ACCEL_SHAPE(400, 400), 1.5), *b = accel_zeros(ACCEL_F32, ACCEL_SHAPE(400, 400));
    CHECK_CLOSE(accel_item(accel_mse_loss(a, b)), 2.25, 1e-6, 0);
    accel_tensor *r = accel_empty(ACCEL_F32, ACCEL_SHAPE(200, 512));
    accel_rng g;
    accel_rng_init(&g, 3);
    accel_rng_normal_(&g, r, 0.0, 3.0);
    int64_t ids[200];
    for (int i = 0; i < 200; i++) ids[i] = (i * 37) % 512;
    accel_tensor *tt = accel_from_data(ACCEL_I64, ACCEL_SHAPE(200), ids);
    double fast = accel_item(accel_cross_entropy(r, tt, -100));
    bool prev = accel_set_reference_kernels(true);
    double ref = accel_item(accel_cross_entropy(r, tt, -100));
    accel_set_reference_kernels(prev);
    CHECK_CLOSE(fast, ref, 1e-5, 0);
    /* meta */
    accel_tensor *ml = accel_tensor_new(ACCEL_BF16, ACCEL_SHAPE(8, 4096, 128000), ACCEL_META_DEVICE);
    accel_tensor *mt = accel_tensor_new(ACCEL_I64, ACCEL_SHAPE(8 * 4096), ACCEL_META_DEVICE);
    accel_tensor *ce = accel_cross_entropy(ml, mt, -100);
    CHECK(ce && ce->data == NULL && ce->ndim == 0);
    accel_tensor_free(ml);
    accel_tensor_free(mt);
    accel_step_reset();
}

int main(void) {
    RUN(test_vs_torch);
    RUN(test_gradcheck);
    RUN(test_values_and_errors);
    accel_thread_cleanup();
    return check_summary();
}
