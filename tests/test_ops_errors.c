/* Error behaviour of the basic ops: NULL propagation keeping the first error,
 * shape/dtype errors naming the op and the shapes, and meta tensors. */
#include "accel/accel.h"
#include "check.h"

static bool has_shape(const accel_tensor *t, int ndim, const int64_t *shape) {
    if (!t || t->ndim != ndim) return false;
    for (int i = 0; i < ndim; i++)
        if (t->shape[i] != shape[i]) return false;
    return true;
}

/* Every op, applied to x (and y for binary ops); index k selects the op. */
#define N_OPS 37
static accel_tensor *apply(int k, accel_tensor *x, accel_tensor *y) {
    accel_tensor *parts[2] = {NULL, NULL};
    switch (k) {
    case 0: return accel_add(x, y);
    case 1: return accel_sub(x, y);
    case 2: return accel_mul(x, y);
    case 3: return accel_div(x, y);
    case 4: return accel_add_scalar(x, 1);
    case 5: return accel_mul_scalar(x, 2);
    case 6: return accel_pow_scalar(x, 2);
    case 7: return accel_neg(x);
    case 8: return accel_exp(x);
    case 9: return accel_log(x);
    case 10: return accel_sqrt(x);
    case 11: return accel_rsqrt(x);
    case 12: return accel_tanh(x);
    case 13: return accel_sigmoid(x);
    case 14: return accel_relu(x);
    case 15: return accel_silu(x);
    case 16: return accel_gelu(x, false);
    case 17: return accel_gelu(x, true);
    case 18: return accel_to_dtype(x, ACCEL_BF16);
    case 19: return accel_sum(x, 1, (int[]){0}, false);
    case 20: return accel_mean(x, 1, (int[]){1}, true);
    case 21: return accel_sum_all(x);
    case 22: return accel_mean_all(x);
    case 23: return accel_max(x, 1, false, NULL);
    case 24: return accel_reshape(x, ACCEL_SHAPE(-1));
    case 25: return accel_permute(x, (int[]){1, 0});
    case 26: return accel_transpose(x, 0, 1);
    case 27: return accel_slice(x, 1, 0, 2, 1);
    case 28: return accel_expand(x, ACCEL_SHAPE(2, 2, 3));
    case 29: return accel_contiguous(x);
    case 30: return accel_unsqueeze(x, 0);
    case 31: return accel_squeeze(x, 0);
    case 32: return accel_concat(2, (accel_tensor *[]){x, y}, 0);
    case 33: return accel_split(x, 1, 2, (int64_t[]){1, 2}, parts) == ACCEL_OK ? parts[1] : NULL;
    case 34: return accel_dropout(x, 0.5, true, NULL);
    case 35: return accel_to_device(x, x ? x->device : ACCEL_CPU_DEVICE);
    default: return accel_sum_to_shape(x, ACCEL_SHAPE(3));
    }
}

/* Expected output shape of apply(k) for x, y of shape [2, 3]. */
static int expected_shape(int k, int64_t *s) {
    switch (k) {
    case 19: s[0] = 3; return 1;
    case 20: s[0] = 2; s[1] = 1; return 2;
    case 21: case 22: return 0;
    case 23: s[0] = 2; return 1;
    case 24: s[0] = 6; return 1;
    case 25: case 26: s[0] = 3; s[1] = 2; return 2;
    case 27: s[0] = 2; s[1] = 2; return 2;
    case 28: s[0] = 2; s[1] = 2; s[2] = 3; return 3;
    case 30: s[0] = 1; s[1] = 2; s[2] = 3; return 3;
    case 32: s[0] = 4; s[1] = 3; return 2;
    case 33: s[0] = 2; s[1] = 2; return 2;
    case 36: s[0] = 3; return 1;
    default: s[0] = 2; s[1] = 3; return 2;
    }
}

static void test_null_propagation(void) {
    accel_tensor *x = accel_ones(ACCEL_F32, ACCEL_SHAPE(2, 3));
    for (int k = 0; k < N_OPS; k++) {
        accel_clear_error();
        accel_set_error(ACCEL_ERR_IO, "the first error");
        CHECK_MSG(apply(k, NULL, x) == NULL, "op %d", k);
        CHECK_MSG(accel_last_status() == ACCEL_ERR_IO, "op %d", k);
        CHECK_MSG(strcmp(accel_last_error(), "the first error") == 0, "op %d: %s", k, accel_last_error());
        if (k <= 3 || k == 32) { /* second argument NULL too */
            accel_clear_error();
            accel_set_error(ACCEL_ERR_IO, "the first error");
            CHECK_MSG(apply(k, x, NULL) == NULL && accel_last_status() == ACCEL_ERR_IO, "op %d", k);
        }
        /* and with no pending error, the NULL is itself reported, naming the op */
        accel_clear_error();
        CHECK(apply(k, NULL, x) == NULL);
        CHECK_MSG(accel_last_status() != ACCEL_OK && strstr(accel_last_error(), "accel_"), "op %d", k);
    }
    accel_clear_error();
    accel_step_reset();
}

static void test_meta(void) {
    accel_tensor *m = accel_empty_on(ACCEL_F32, ACCEL_SHAPE(2, 3), ACCEL_META_DEVICE);
    accel_tensor *c = accel_ones(ACCEL_F32, ACCEL_SHAPE(2, 3));
    for (int k = 0; k < N_OPS; k++) {
        int64_t s[8];
        int nd = expected_shape(k, s);
        for (int mix = 0; mix < 2; mix++) {
            accel_tensor *out = apply(k, m, mix ? c : m);
            CHECK_MSG(out && out->device.type == ACCEL_DEV_META && out->data == NULL, "op %d: %s", k,
                      accel_last_error());
            CHECK_MSG(has_shape(out, nd, s), "op %d", k);
        }
    }
    accel_tensor *idx = NULL;
    CHECK(accel_max(m, 0, true, &idx) && idx && idx->device.type == ACCEL_DEV_META && idx->dtype == ACCEL_I64);
    /* meta results allocate no data: 40 GB of f32 would not fit */
    accel_tensor *big = accel_empty_on(ACCEL_F32, ACCEL_SHAPE(100000, 100000), ACCEL_META_DEVICE);
    accel_tensor *r = accel_sum(accel_mul(accel_gelu(big, false), big), 1, (int[]){0}, false);
    CHECK(r && r->device.type == ACCEL_DEV_META && r->shape[0] == 100000);
    CHECK(accel_last_status() == ACCEL_OK);
    accel_step_reset();
}

static void check_shape_error(accel_tensor *r, const char *op, const char *s1, const char *s2) {
    CHECK(r == NULL);
    CHECK(accel_last_status() == ACCEL_ERR_SHAPE);
    CHECK_STR_CONTAINS(accel_last_error(), op);
    CHECK_STR_CONTAINS(accel_last_error(), s1);
    CHECK_STR_CONTAINS(accel_last_error(), s2);
    accel_clear_error();
}

static void test_shape_errors(void) {
    accel_clear_error();
    accel_tensor *a = accel_ones(ACCEL_F32, ACCEL_SHAPE(2, 3));
    accel_tensor *b = accel_ones(ACCEL_F32, ACCEL_SHAPE(4));
    check_shape_error(accel_add(a, b), "accel_add", "[2, 3]", "[4]");
    check_shape_error(accel_sub(a, b), "accel_sub", "[2, 3]", "[4]");
    check_shape_error(accel_mul(b, a), "accel_mul", "[4]", "[2, 3]");
    check_shape_error(accel_div(a, b), "accel_div", "[2, 3]", "[4]");
    accel_tensor *ai = accel_ones(ACCEL_I64, ACCEL_SHAPE(2, 3)), *bi = accel_ones(ACCEL_I32, ACCEL_SHAPE(3, 2));
    check_shape_error(accel_add(ai, bi), "accel_add", "[2, 3]", "[3, 2]");
    check_shape_error(accel_reshape(a, ACCEL_SHAPE(4, 2)), "accel_reshape", "[2, 3]", "[4, 2]");
    check_shape_error(accel_reshape(a, ACCEL_SHAPE(-1, 4)), "accel_reshape", "[2, 3]", "[-1, 4]");
    check_shape_error(accel_reshape(a, ACCEL_SHAPE(-1, -1)), "accel_reshape", "[2, 3]", "[-1, -1]");
    /* a target whose product is past int64 (it overflowed: undefined behaviour;
     * 2 * 467443687 * 39463029637 == 2^65 + 6 wrapped to 6 and was taken) */
    check_shape_error(accel_reshape(a, ACCEL_SHAPE(INT64_MAX, 2)), "accel_reshape", "[2, 3]",
                      "[9223372036854775807, 2]");
    check_shape_error(accel_reshape(a, ACCEL_SHAPE(2, 467443687, 39463029637)), "accel_reshape", "[2, 3]",
                      "[2, 467443687, 39463029637]");
    check_shape_error(accel_expand(a, ACCEL_SHAPE(2, 4)), "accel_expand", "[2, 3]", "[2, 4]");
    check_shape_error(accel_expand(a, ACCEL_SHAPE(3)), "accel_expand", "[2, 3]", "1 dims");
    check_shape_error(accel_concat(2, (accel_tensor *[]){a, b}, 0), "accel_concat", "[2, 3]", "[4]");
    check_shape_error(accel_concat(2, (accel_tensor *[]){a, accel_ones(ACCEL_F32, ACCEL_SHAPE(2, 4))}, 0),
                      "accel_concat", "[2, 3]", "[2, 4]");
    accel_tensor *parts[2];
    CHECK(accel_split(a, 1, 2, (int64_t[]){1, 1}, parts) == ACCEL_ERR_SHAPE && parts[0] == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_split");
    CHECK_STR_CONTAINS(accel_last_error(), "[1, 1]");
    CHECK_STR_CONTAINS(accel_last_error(), "[2, 3]");
    accel_clear_error();
    /* sizes whose sum wraps to the dim's size (2 * INT64_MAX + 5 == 3 mod 2^64) */
    accel_tensor *three[3];
    CHECK(accel_split(a, 1, 3, (int64_t[]){INT64_MAX, INT64_MAX, 5}, three) == ACCEL_ERR_SHAPE);
    CHECK(three[0] == NULL && three[1] == NULL && three[2] == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "do not add up");
    accel_clear_error();
    /* arange's length end - start past int64 (the subtraction overflowed) */
    CHECK(accel_arange(ACCEL_F32, INT64_MIN, INT64_MAX) == NULL);
    CHECK(accel_last_status() == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_arange");
    accel_clear_error();
    check_shape_error(accel_sum_to_shape(a, ACCEL_SHAPE(3, 3)), "accel_sum_to_shape", "[2, 3]", "[3, 3]");
    accel_step_reset();
}

static void expect_error(accel_tensor *r, accel_status st, const char *op) {
    CHECK(r == NULL);
    CHECK_MSG(accel_last_status() == st, "%s: got %s (%s)", op, accel_status_name(accel_last_status()),
              accel_last_error());
    CHECK_STR_CONTAINS(accel_last_error(), op);
    accel_clear_error();
}

static void test_argument_errors(void) {
    accel_clear_error();
    accel_tensor *a = accel_ones(ACCEL_F32, ACCEL_SHAPE(2, 3));
    accel_tensor *i = accel_ones(ACCEL_I32, ACCEL_SHAPE(2, 3));
    accel_tensor *(*float_only[])(accel_tensor *) = {accel_exp, accel_log, accel_sqrt, accel_rsqrt,
                                                     accel_tanh, accel_sigmoid, accel_relu, accel_silu,
                                                     accel_neg, accel_mean_all};
    for (size_t k = 0; k < sizeof float_only / sizeof float_only[0]; k++)
        expect_error(float_only[k](i), ACCEL_ERR_DTYPE, "accel_");
    expect_error(accel_gelu(i, true), ACCEL_ERR_DTYPE, "accel_gelu");
    expect_error(accel_dropout(i, 0.1, true, NULL), ACCEL_ERR_DTYPE, "accel_dropout");
    expect_error(accel_sum(a, 1, (int[]){2}, false), ACCEL_ERR_INVALID_ARG, "accel_sum");
    expect_error(accel_sum(a, 2, (int[]){1, -1}, false), ACCEL_ERR_INVALID_ARG, "accel_sum");
    expect_error(accel_max(a, -3, false, NULL), ACCEL_ERR_INVALID_ARG, "accel_max");
    expect_error(accel_permute(a, (int[]){0, 0}), ACCEL_ERR_INVALID_ARG, "accel_permute");
    expect_error(accel_permute(a, (int[]){0, 2}), ACCEL_ERR_INVALID_ARG, "accel_permute");
    expect_error(accel_transpose(a, 0, 2), ACCEL_ERR_INVALID_ARG, "accel_transpose");
    expect_error(accel_slice(a, 0, 0, 1, 0), ACCEL_ERR_INVALID_ARG, "accel_slice");
    expect_error(accel_slice(a, 2, 0, 1, 1), ACCEL_ERR_INVALID_ARG, "accel_slice");
    expect_error(accel_unsqueeze(a, 3), ACCEL_ERR_INVALID_ARG, "accel_unsqueeze");
    expect_error(accel_unsqueeze(a, -4), ACCEL_ERR_INVALID_ARG, "accel_unsqueeze");
    expect_error(accel_squeeze(a, 2), ACCEL_ERR_INVALID_ARG, "accel_squeeze");
    expect_error(accel_concat(0, NULL, 0), ACCEL_ERR_INVALID_ARG, "accel_concat");
    expect_error(accel_concat(1, &a, 2), ACCEL_ERR_INVALID_ARG, "accel_concat");
    expect_error(accel_to_dtype(a, (accel_dtype)99), ACCEL_ERR_DTYPE, "accel_to_dtype");
    expect_error(accel_dropout(a, -0.1, true, NULL), ACCEL_ERR_INVALID_ARG, "accel_dropout");
    /* Autocast takes bf16 and f16 (f32: off): under int64 a Linear returned
     * truncated integers, under -1 it failed with no error. Refused, unchanged. */
    accel_dtype bad[] = {ACCEL_I64, ACCEL_U8, ACCEL_F64, (accel_dtype)-1, (accel_dtype)99};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        CHECK(accel_autocast_begin(bad[k]) == ACCEL_F32);
        CHECK(accel_last_status() == ACCEL_ERR_DTYPE);
        CHECK_STR_CONTAINS(accel_last_error(), "accel_autocast_begin: cannot autocast to");
        accel_clear_error();
        CHECK(accel_autocast_dtype() == ACCEL_F32);
    }
    accel_dtype prev = accel_autocast_begin(ACCEL_BF16);
    accel_autocast_end(ACCEL_I32);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_autocast_end: cannot autocast to int32");
    accel_clear_error();
    CHECK(accel_autocast_dtype() == ACCEL_BF16);
    accel_autocast_end(prev);
    CHECK(accel_autocast_dtype() == ACCEL_F32 && accel_last_status() == ACCEL_OK);
    /* a step tensor used after its step ended */
    accel_step_reset();
    expect_error(accel_add(a, a), ACCEL_ERR_STATE, "accel_add");
    expect_error(accel_reshape(a, ACCEL_SHAPE(6)), ACCEL_ERR_STATE, "accel_reshape");
    accel_step_reset();
}

int main(void) {
    RUN(test_null_propagation);
    RUN(test_meta);
    RUN(test_shape_errors);
    RUN(test_argument_errors);
    accel_thread_cleanup();
    return check_summary();
}
