/* Metrics ops against PyTorch's semantics: argmax (ties, NaN), comparisons
 * (broadcasting, dtype promotion, scalars, NaN), bool sums, where (values,
 * broadcasting, promotion, finite-difference gradients). Runs on the cpu
 * and, through tests/device.cmake, on the hostless test device. */
#include <math.h>
#include <string.h>

#include "accel/accel.h"
#include "check.h"
#include "gradcheck.h"

/* Checks t's dtype, shape and row-major values (read through accel_get). */
static void check_tensor(const accel_tensor *t, accel_dtype dt, int ndim, const int64_t *shape, const double *want) {
    CHECK_MSG(t != NULL, "%s", accel_last_error());
    if (!t) return;
    CHECK_MSG(t->dtype == dt, "dtype %s", accel_dtype_name(t->dtype));
    CHECK(t->ndim == ndim && (ndim == 0 || memcmp(t->shape, shape, (size_t)ndim * sizeof *shape) == 0));
    if (t->ndim != ndim) return;
    int64_t n = accel_numel(t);
    for (int64_t i = 0; i < n; i++) {
        int64_t idx[ACCEL_MAX_DIMS], rest = i;
        for (int d = ndim - 1; d >= 0; d--) {
            idx[d] = rest % t->shape[d];
            rest /= t->shape[d];
        }
        double got = accel_get(t, idx);
        CHECK_MSG(got == want[i] || (isnan(got) && isnan(want[i])), "element %lld: %g, want %g", (long long)i,
                  got, want[i]);
    }
}

static accel_tensor *f32s(int ndim, const int64_t *shape, const float *v) { return accel_from_floats(ndim, shape, v); }
static accel_tensor *i64s(int ndim, const int64_t *shape, const int64_t *v) {
    return accel_from_data(ACCEL_I64, ndim, shape, v);
}

static void test_argmax(void) {
    /* torch.argmax: the first index on ties; NaN is the max (the first NaN). */
    accel_tensor *x = f32s(ACCEL_SHAPE(4, 3), (float[]){1, 3, 3, NAN, 2, NAN, 5, -INFINITY, 5, -1, -2, NAN});
    check_tensor(accel_argmax(x, 1, false), ACCEL_I64, ACCEL_SHAPE(4), (double[]){1, 0, 0, 2});
    check_tensor(accel_argmax(x, -1, true), ACCEL_I64, ACCEL_SHAPE(4, 1), (double[]){1, 0, 0, 2});
    check_tensor(accel_argmax(x, 0, false), ACCEL_I64, ACCEL_SHAPE(3), (double[]){1, 0, 1});
    /* bf16 and integer inputs; a 0-dim input is its own argmax */
    check_tensor(accel_argmax(accel_to_dtype(x, ACCEL_BF16), 1, false), ACCEL_I64, ACCEL_SHAPE(4),
                 (double[]){1, 0, 0, 2});
    check_tensor(accel_argmax(i64s(ACCEL_SHAPE(5), (int64_t[]){4, -1, 9, 9, 0}), 0, false), ACCEL_I64, 0, NULL,
                 (double[]){2});
    check_tensor(accel_argmax(accel_full(ACCEL_F32, 0, NULL, 7), 0, false), ACCEL_I64, 0, NULL, (double[]){0});
    /* not differentiable: nothing on the tape even when the input requires grad */
    accel_tensor *w = gc_randn(3, ACCEL_SHAPE(2, 3));
    accel_tape_clear();
    CHECK(accel_argmax(w, 1, false) && accel_tape_size() == 0);
    accel_tensor_free(w);
    /* errors name the op */
    CHECK(accel_argmax(x, 2, false) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_argmax");
    CHECK(accel_argmax(accel_empty(ACCEL_F32, ACCEL_SHAPE(2, 0)), 1, false) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_argmax: cannot reduce dim 1 of size 0");
    accel_clear_error();
    accel_step_reset();
}

static void test_compare_broadcast(void) {
    accel_tensor *a = f32s(ACCEL_SHAPE(2, 3), (float[]){1, 2, 3, 4, 5, NAN});
    accel_tensor *b = f32s(ACCEL_SHAPE(3), (float[]){1, 5, NAN});
    int64_t s23[] = {2, 3};
    check_tensor(accel_eq(a, b), ACCEL_BOOL, 2, s23, (double[]){1, 0, 0, 0, 1, 0});
    check_tensor(accel_ne(a, b), ACCEL_BOOL, 2, s23, (double[]){0, 1, 1, 1, 0, 1});
    check_tensor(accel_lt(a, b), ACCEL_BOOL, 2, s23, (double[]){0, 1, 0, 0, 0, 0});
    check_tensor(accel_le(a, b), ACCEL_BOOL, 2, s23, (double[]){1, 1, 0, 0, 1, 0});
    check_tensor(accel_gt(a, b), ACCEL_BOOL, 2, s23, (double[]){0, 0, 0, 1, 0, 0});
    check_tensor(accel_ge(a, b), ACCEL_BOOL, 2, s23, (double[]){1, 0, 0, 1, 1, 0});
    /* [2, 1] against [3]: both sides broadcast; a transposed (strided) view */
    accel_tensor *col = f32s(ACCEL_SHAPE(2, 1), (float[]){2, 4});
    check_tensor(accel_gt(col, b), ACCEL_BOOL, 2, s23, (double[]){1, 0, 0, 1, 0, 0});
    check_tensor(accel_lt(accel_transpose(a, 0, 1), accel_reshape(col, 1, (int64_t[]){2})),
                 ACCEL_BOOL, ACCEL_SHAPE(3, 2), (double[]){1, 0, 0, 0, 0, 0});
    CHECK(accel_eq(a, f32s(ACCEL_SHAPE(2), (float[]){1, 2})) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_eq: shapes [2, 3] and [2]");
    CHECK(accel_lt(a, NULL) == NULL);
    accel_clear_error();
    accel_step_reset();
}

static void test_compare_promotion(void) {
    /* i64 with f32 compares as f32 (torch promotes): 2^24 + 1 rounds to 2^24 */
    accel_tensor *big = i64s(ACCEL_SHAPE(2), (int64_t[]){16777217, 3});
    accel_tensor *f = f32s(ACCEL_SHAPE(2), (float[]){16777216.0f, 3.5f});
    check_tensor(accel_eq(big, f), ACCEL_BOOL, ACCEL_SHAPE(2), (double[]){1, 0});
    check_tensor(accel_lt(big, f), ACCEL_BOOL, ACCEL_SHAPE(2), (double[]){0, 1});
    /* integers compare exactly, whatever their widths */
    accel_tensor *i32 = accel_from_data(ACCEL_I32, ACCEL_SHAPE(2), (int32_t[]){16777216, 3});
    check_tensor(accel_eq(big, i32), ACCEL_BOOL, ACCEL_SHAPE(2), (double[]){0, 1});
    accel_tensor *huge = i64s(ACCEL_SHAPE(1), (int64_t[]){(1LL << 53) + 1});
    check_tensor(accel_eq(huge, i64s(ACCEL_SHAPE(1), (int64_t[]){1LL << 53})), ACCEL_BOOL, ACCEL_SHAPE(1),
                 (double[]){0});
    check_tensor(accel_eq_scalar(huge, 0x1p53), ACCEL_BOOL, ACCEL_SHAPE(1), (double[]){0});
    /* bf16 with f32 compares as f32: bf16(0.1) != f32(0.1) */
    accel_tensor *tenth = f32s(ACCEL_SHAPE(1), (float[]){0.1f});
    check_tensor(accel_eq(accel_to_dtype(tenth, ACCEL_BF16), tenth), ACCEL_BOOL, ACCEL_SHAPE(1), (double[]){0});
    /* a float tensor compares with a number in its own dtype (torch: bf16 == 0.1 is True) */
    check_tensor(accel_eq_scalar(accel_to_dtype(tenth, ACCEL_BF16), 0.1), ACCEL_BOOL, ACCEL_SHAPE(1),
                 (double[]){1});
    check_tensor(accel_eq_scalar(tenth, 0.1), ACCEL_BOOL, ACCEL_SHAPE(1), (double[]){1});
    check_tensor(accel_eq_scalar(accel_to_dtype(tenth, ACCEL_F64), 0.1), ACCEL_BOOL, ACCEL_SHAPE(1), (double[]){0});
    /* an integer tensor with a fractional number compares as floats */
    accel_tensor *ints = i64s(ACCEL_SHAPE(3), (int64_t[]){1, 2, 3});
    check_tensor(accel_lt_scalar(ints, 2.5), ACCEL_BOOL, ACCEL_SHAPE(3), (double[]){1, 1, 0});
    check_tensor(accel_ge_scalar(ints, 2), ACCEL_BOOL, ACCEL_SHAPE(3), (double[]){0, 1, 1});
    check_tensor(accel_ne_scalar(ints, 2), ACCEL_BOOL, ACCEL_SHAPE(3), (double[]){1, 0, 1});
    check_tensor(accel_le_scalar(ints, -1), ACCEL_BOOL, ACCEL_SHAPE(3), (double[]){0, 0, 0});
    check_tensor(accel_gt_scalar(ints, 1), ACCEL_BOOL, ACCEL_SHAPE(3), (double[]){0, 1, 1});
    /* NaN: only ne holds */
    accel_tensor *nan = f32s(ACCEL_SHAPE(2), (float[]){NAN, 1});
    check_tensor(accel_eq_scalar(nan, NAN), ACCEL_BOOL, ACCEL_SHAPE(2), (double[]){0, 0});
    check_tensor(accel_ne_scalar(nan, NAN), ACCEL_BOOL, ACCEL_SHAPE(2), (double[]){1, 1});
    check_tensor(accel_ge_scalar(nan, 1), ACCEL_BOOL, ACCEL_SHAPE(2), (double[]){0, 1});
    /* bool operands compare as integers */
    accel_tensor *t = accel_gt_scalar(ints, 1);
    check_tensor(accel_eq(t, accel_lt_scalar(ints, 3)), ACCEL_BOOL, ACCEL_SHAPE(3), (double[]){0, 1, 0});
    check_tensor(accel_eq_scalar(t, 1), ACCEL_BOOL, ACCEL_SHAPE(3), (double[]){0, 1, 1});
    accel_step_reset();
}

static void test_bool_sum_and_accuracy(void) {
    /* accuracy as in a metrics loop: (logits.argmax(-1) == labels).sum() */
    accel_tensor *logits = f32s(ACCEL_SHAPE(4, 3), (float[]){0.1f, 2, 0.3f, 5, 1, 1, 0, 0, 1, 2, 2, 1});
    accel_tensor *labels = i64s(ACCEL_SHAPE(4), (int64_t[]){1, 0, 1, 0});
    accel_tensor *correct = accel_eq(accel_argmax(logits, -1, false), labels);
    check_tensor(correct, ACCEL_BOOL, ACCEL_SHAPE(4), (double[]){1, 1, 0, 1});
    check_tensor(accel_sum_all(correct), ACCEL_I64, 0, NULL, (double[]){3});
    check_tensor(accel_sum(correct, 1, (int[]){0}, true), ACCEL_I64, ACCEL_SHAPE(1), (double[]){3});
    /* torch's mean needs a float input: convert first */
    CHECK(accel_mean_all(correct) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_mean_all");
    accel_clear_error();
    check_tensor(accel_mean_all(accel_to_dtype(correct, ACCEL_F32)), ACCEL_F32, 0, NULL, (double[]){0.75});
    accel_step_reset();
}

static void test_where_values(void) {
    accel_tensor *cond = accel_gt_scalar(f32s(ACCEL_SHAPE(2, 1), (float[]){1, -1}), 0);
    accel_tensor *a = f32s(ACCEL_SHAPE(3), (float[]){1, 2, 3});
    accel_tensor *b = accel_full(ACCEL_F32, 0, NULL, -5);
    check_tensor(accel_where(cond, a, b), ACCEL_F32, ACCEL_SHAPE(2, 3), (double[]){1, 2, 3, -5, -5, -5});
    /* promotion: i64 with f32 -> f32; i64 with i64 stays exact */
    accel_tensor *ia = i64s(ACCEL_SHAPE(3), (int64_t[]){(1LL << 53) + 1, 7, 8});
    check_tensor(accel_where(cond, ia, b), ACCEL_F32, ACCEL_SHAPE(2, 3),
                 (double[]){(double)(float)((1LL << 53) + 1), 7, 8, -5, -5, -5});
    accel_tensor *w = accel_where(cond, ia, i64s(ACCEL_SHAPE(1), (int64_t[]){-1}));
    CHECK(w && w->dtype == ACCEL_I64);
    if (w) {
        int64_t got[6];
        CHECK(accel_to_int64s(w, got) == ACCEL_OK);
        CHECK(got[0] == (1LL << 53) + 1 && got[1] == 7 && got[5] == -1);
    }
    /* bf16 with bf16 stays bf16; NaN passes through */
    accel_tensor *nb = accel_to_dtype(f32s(ACCEL_SHAPE(3), (float[]){NAN, 0.5f, 2}), ACCEL_BF16);
    check_tensor(accel_where(accel_ne_scalar(a, 2), nb, accel_to_dtype(a, ACCEL_BF16)), ACCEL_BF16, ACCEL_SHAPE(3),
                 (double[]){NAN, 2, 2});
    /* errors */
    CHECK(accel_where(accel_ones(ACCEL_F32, ACCEL_SHAPE(3)), a, a) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_where: cond must be bool, got float32");
    CHECK(accel_where(cond, a, f32s(ACCEL_SHAPE(2), (float[]){1, 2})) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_where: shapes [2, 1] (cond), [3] and [2] cannot be broadcast");
    CHECK(accel_where(NULL, a, b) == NULL);
    accel_clear_error();
    accel_step_reset();
}

/* ctx: the persistent bool condition. */
static accel_tensor *l_where(accel_tensor *const *in, int n, void *ctx) {
    (void)n;
    return gc_weighted_sum(accel_where(ctx, in[0], in[1]));
}

static void test_where_grad(void) {
    accel_tensor *cond = accel_tensor_new(ACCEL_BOOL, ACCEL_SHAPE(2, 3), accel_default_device());
    CHECK(cond && accel_copy_(cond, accel_from_data(ACCEL_BOOL, ACCEL_SHAPE(2, 3),
                                                   (uint8_t[]){1, 0, 1, 0, 0, 1})) == ACCEL_OK);
    accel_tensor *a = gc_randn(21, ACCEL_SHAPE(2, 3));
    accel_tensor *rows = gc_randn(22, ACCEL_SHAPE(2, 1));
    accel_tensor *lead = gc_randn(23, ACCEL_SHAPE(3));
    CHECK(gradcheck("where", l_where, cond, 2, (accel_tensor *[]){a, lead}, NULL) == 0);
    CHECK(gradcheck("where_bcast", l_where, cond, 2, (accel_tensor *[]){rows, a}, NULL) == 0);
    /* the gradient is masked: exactly 0 where the other side was picked */
    accel_step_reset();
    accel_zero_(a->grad); /* gradcheck left its analytic gradient there */
    CHECK(accel_backward(accel_sum_all(accel_where(cond, a, lead))) == ACCEL_OK);
    check_tensor(a->grad, ACCEL_F32, ACCEL_SHAPE(2, 3), (double[]){1, 0, 1, 0, 0, 1});
    accel_tensor_free(a);
    accel_tensor_free(rows);
    accel_tensor_free(lead);
    accel_tensor_free(cond);
    accel_step_reset();
}

int main(void) {
    RUN(test_argmax);
    RUN(test_compare_broadcast);
    RUN(test_compare_promotion);
    RUN(test_bool_sum_and_accuracy);
    RUN(test_where_values);
    RUN(test_where_grad);
    accel_thread_cleanup();
    return check_summary();
}
