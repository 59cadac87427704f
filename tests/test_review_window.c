/* Hostile sizes for the window ops and the padded batches' positions, found
 * by the review of the convolution and padded-batch work (each failed under
 * UBSan before its fix):
 *   a dilation, padding or stride near INT64_MAX wrapped the window's
 *     arithmetic (d (k - 1) + 1, H + 2 p, ceil_mode's + s - 1): signed
 *     overflow, and a wrapped span looked like a small window;
 *   a padding of 2^31 on a 1x1 image made output planes of (2^32 + 1)^2
 *     elements, whose count Ho Wo wrapped before any tensor was made;
 *   position_ids holding INT64_MAX: the run detection of
 *     accel__rope_positions computed INT64_MAX + 1;
 *   Conv2d's fan_in (in / groups * kh * kw) was multiplied out before the
 *     weight's shape was checked: a kernel of 2^40 x 2^40 wrapped it;
 *   BatchNorm's momentum NaN was taken at construction (momentum > 1 is
 *     false for NaN) and refused only at the first forward;
 *   batch norm in training on an empty batch was refused as "more than 1
 *     value per channel" where torch gives an empty result and keeps the
 *     running statistics (a 0 / 0 mean must not reach them). */
#include <math.h>
#include <stdint.h>

#include "accel/accel.h"
#include "accel/autograd.h"
#include "accel/nn.h"
#include "check.h"

static void expect_error(accel_tensor *t, const char *needle) {
    CHECK(t == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), needle);
    accel_clear_error();
}

static void test_conv_window_past_int64(void) {
    accel_tensor *x = accel_zeros(ACCEL_F32, ACCEL_SHAPE(1, 1, 4, 4)), *w = accel_zeros(ACCEL_F32, ACCEL_SHAPE(1, 1, 3, 3));
    const int64_t one[2] = {1, 1}, zero[2] = {0, 0};
    /* span = INT64_MAX * 2 + 1 */
    expect_error(accel_conv2d(x, w, NULL, one, zero, (int64_t[]){INT64_MAX, 1}, 1), "past int64");
    /* 4 + 2 p */
    expect_error(accel_conv2d(x, w, NULL, one, (int64_t[]){0, INT64_MAX / 2}, one, 1), "past int64");
    expect_error(accel_conv1d(accel_zeros(ACCEL_F32, ACCEL_SHAPE(1, 1, 4)), accel_zeros(ACCEL_F32, ACCEL_SHAPE(1, 1, 2)),
                              NULL, 1, 0, INT64_MAX, 1),
                 "past int64");
    /* a 1x1 image padded by 2^31: planes [2^32 + 1, 2^32 + 1] */
    accel_tensor *x1 = accel_zeros(ACCEL_F32, ACCEL_SHAPE(1, 1, 1, 1)), *w1 = accel_zeros(ACCEL_F32, ACCEL_SHAPE(1, 1, 1, 1));
    expect_error(accel_conv2d(x1, w1, NULL, one, (int64_t[]){INT64_C(1) << 31, INT64_C(1) << 31}, one, 1),
                 "more elements than int64");
}

static void test_pool_window_past_int64(void) {
    float v[25];
    for (int i = 0; i < 25; i++) v[i] = (float)i;
    accel_tensor *x = accel_from_floats(ACCEL_SHAPE(1, 1, 5, 5), v);
    const int64_t zero[2] = {0, 0}, one[2] = {1, 1}, k2[2] = {2, 2};
    /* ceil_mode with a stride of INT64_MAX: one window down (rows 0-1),
     * four across (stride 1), as torch's max_pool2d(ceil_mode=True) */
    accel_tensor *y = accel_max_pool2d(x, k2, (int64_t[]){INT64_MAX, 1}, zero, one, true);
    CHECK_MSG(y != NULL, "%s", accel_last_error());
    if (y) {
        CHECK(y->shape[2] == 1 && y->shape[3] == 4);
        float out[4];
        CHECK(accel_to_floats(y, out) == ACCEL_OK);
        for (int j = 0; j < 4; j++) CHECK_CLOSE(out[j], 6.0f + (float)j, 0, 0);
    }
    expect_error(accel_max_pool2d(x, k2, NULL, zero, (int64_t[]){1, INT64_MAX}, false), "past int64");
    expect_error(accel_avg_pool2d(x, k2, (int64_t[]){1, 1}, (int64_t[]){0, INT64_MAX}, true, true), "past int64");
    /* ceil_mode still adds the partial last window: 5 rows, k 2, s 2 -> 3 */
    y = accel_avg_pool2d(x, k2, NULL, zero, true, false);
    CHECK(y && y->shape[2] == 3 && y->shape[3] == 3);
}

/* A dilated max window whose taps all fall in the padding: -inf, and its
 * gradient lands where torch 2.15's lands (max_pool2d of zeros [1, 1, 2, 2],
 * kernel (1, 2), stride 1, padding (0, 1), dilation (1, 3): y -inf twice,
 * x.grad after y.sum().backward() [[0, 0], [1, 0]]). */
static void test_max_pool_window_without_taps(void) {
    accel_tensor *x = accel_zeros(ACCEL_F32, ACCEL_SHAPE(1, 1, 2, 2));
    accel_requires_grad_(x, true);
    accel_tensor *y = accel_max_pool2d(x, (int64_t[]){1, 2}, (int64_t[]){1, 1}, (int64_t[]){0, 1}, (int64_t[]){1, 3},
                                       false);
    CHECK_MSG(y != NULL, "%s", accel_last_error());
    if (!y) return;
    float v[2], g[4];
    CHECK(accel_numel(y) == 2 && accel_to_floats(y, v) == ACCEL_OK);
    CHECK(isinf(v[0]) && v[0] < 0 && isinf(v[1]) && v[1] < 0);
    CHECK(accel_backward(accel_sum_all(y)) == ACCEL_OK);
    CHECK(x->grad && accel_to_floats(x->grad, g) == ACCEL_OK);
    const float want[4] = {0, 0, 1, 0};
    for (int i = 0; i < 4; i++) CHECK_CLOSE(g[i], want[i], 0, 0);
}

static void test_positions_at_int64_max(void) {
    accel_llama_config c = accel_llama_config_default();
    c.vocab_size = 16;
    c.hidden_size = 16;
    c.intermediate_size = 32;
    c.num_hidden_layers = 1;
    c.num_attention_heads = 2;
    c.num_key_value_heads = 1;
    c.max_position_embeddings = 64;
    accel_module *m = accel_llama_new(&c, ACCEL_CPU_DEVICE);
    CHECK_MSG(m != NULL, "%s", accel_last_error());
    if (!m) return;
    int64_t ids[2] = {1, 2}, pos[2] = {INT64_MAX, INT64_MAX};
    accel_llama_inputs in = {.ids = accel_from_data(ACCEL_I64, ACCEL_SHAPE(1, 2), ids),
                             .position_ids = accel_from_data(ACCEL_I64, ACCEL_SHAPE(1, 2), pos)};
    bool grad = accel_set_grad_enabled(false); /* no tape left behind the module freed below */
    accel_tensor *logits = accel_llama_forward_ex(m, &in);
    accel_set_grad_enabled(grad);
    CHECK_MSG(logits != NULL, "%s", accel_last_error());
    if (logits) {
        float out[32];
        CHECK(accel_to_floats(logits, out) == ACCEL_OK);
        for (int i = 0; i < 32; i++) CHECK(isfinite(out[i]));
    }
    accel_module_free(m);
}

static void test_layers_hostile_args(void) {
    const int64_t huge[2] = {INT64_C(1) << 40, INT64_C(1) << 40};
    CHECK(accel_conv2d_new(3, 4, huge, NULL, NULL, NULL, 1, true, ACCEL_CPU_DEVICE, ACCEL_F32) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "too many elements");
    accel_clear_error();
    CHECK(accel_batch_norm2d_new(4, 1e-5, NAN, true, true, ACCEL_CPU_DEVICE, ACCEL_F32) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "momentum nan");
    accel_clear_error();
    accel_module *m = accel_batch_norm2d_new(4, 1e-5, -1.0, true, true, ACCEL_CPU_DEVICE, ACCEL_F32); /* torch's None */
    CHECK(m != NULL);
    accel_module_free(m);
}

static void test_batch_norm_empty_batch(void) {
    float mean0[2] = {0.5f, -1.0f}, var0[2] = {2.0f, 3.0f};
    const int64_t shapes[2][3] = {{0, 2, 3}, {2, 2, 0}};
    for (int i = 0; i < 2; i++) { /* step tensors: made again after each backward */
        accel_tensor *rm = accel_from_floats(ACCEL_SHAPE(2), mean0), *rv = accel_from_floats(ACCEL_SHAPE(2), var0);
        accel_tensor *w = accel_ones(ACCEL_F32, ACCEL_SHAPE(2));
        accel_requires_grad_(w, true);
        accel_tensor *y = accel_batch_norm(accel_zeros(ACCEL_F32, 3, shapes[i]), rm, rv, w, NULL, true, 0.1, 1e-5);
        CHECK_MSG(y != NULL, "%s", accel_last_error());
        accel_clear_error();
        if (!y) continue;
        CHECK(accel_numel(y) == 0 && y->ndim == 3);
        float m[2], v[2];
        CHECK(accel_to_floats(rm, m) == ACCEL_OK && accel_to_floats(rv, v) == ACCEL_OK);
        for (int c = 0; c < 2; c++) {
            CHECK_CLOSE(m[c], mean0[c], 0, 0);
            CHECK_CLOSE(v[c], var0[c], 0, 0);
        }
        CHECK(accel_backward(accel_sum_all(y)) == ACCEL_OK);
    }
    accel_tensor *rm = accel_from_floats(ACCEL_SHAPE(2), mean0), *rv = accel_from_floats(ACCEL_SHAPE(2), var0);
    /* one value per channel stays refused, as torch */
    CHECK(accel_batch_norm(accel_zeros(ACCEL_F32, ACCEL_SHAPE(1, 2)), rm, rv, NULL, NULL, true, 0.1, 1e-5) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "more than 1 value per channel");
    accel_clear_error();
}

int main(void) {
    RUN(test_conv_window_past_int64);
    RUN(test_pool_window_past_int64);
    RUN(test_max_pool_window_without_taps);
    RUN(test_positions_at_int64_max);
    RUN(test_layers_hostile_args);
    RUN(test_batch_norm_empty_batch);
    accel_thread_cleanup();
    return check_summary();
}
