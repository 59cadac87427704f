/* accel_pad (torch.nn.functional.pad, every mode): PyTorch fixtures
 * (tools/gen_conv_fixtures.py: constant padding and cropping, every dim,
 * values; reflect, replicate, circular over 2-5-D inputs), finite
 * differences, dtypes, empty results, views, meta, bad arguments followed
 * by more calls. */
#include "accel/accel.h"
#include "check.h"
#include "gradcheck.h"
#include "ops_fixture.h"

static accel_tensor *find(fx_file *f, int i, const char *what) {
    char key[64];
    snprintf(key, sizeof key, "d%d.%s", i, what);
    return fx_find(f, key);
}

static void test_pad_vs_torch(void) {
    fx_file f;
    if (fx_load(&f, "data/ops_pad.bin")) {
        CHECK(0);
        return;
    }
    int cases = 0;
    for (int i = 0; find(&f, i, "p"); i++, cases++) {
        float p[16];
        accel_tensor *pt = find(&f, i, "p"), *x = find(&f, i, "x");
        CHECK(accel_numel(pt) <= 16 && accel_to_floats(pt, p) == ACCEL_OK);
        int npad = (int)p[0];
        int64_t pad[8];
        for (int k = 0; k < npad; k++) pad[k] = (int64_t)p[1 + k];
        accel_requires_grad_(x, true);
        accel_tensor *y = accel_pad(x, npad, pad, (accel_pad_mode)p[2 + npad], p[1 + npad]);
        CHECK_MSG(y, "case %d: %s", i, accel_last_error());
        char what[32];
        snprintf(what, sizeof what, "pad case %d", i);
        CHECK_FX(what, y, find(&f, i, "y"), 0, 0);
        CHECK(y && accel_backward_with(y, find(&f, i, "gy")) == ACCEL_OK);
        snprintf(what, sizeof what, "pad case %d dx", i);
        /* exact but where a border repeats an element: its gradients summed in another order */
        CHECK_FX(what, x->grad, find(&f, i, "dx"), 1e-6, 1e-6);
        accel_step_reset();
    }
    CHECK(cases == 13);
    fx_free(&f);
}

typedef struct pad_args {
    accel_pad_mode mode;
    int npad;
    int64_t pad[6];
} pad_args;

static accel_tensor *loss_pad(accel_tensor *const *in, int n, void *ctx) {
    (void)n;
    const pad_args *a = ctx;
    return gc_weighted_sum(accel_pad(in[0], a->npad, a->pad, a->mode, 0.75));
}

static void test_gradcheck(void) {
    accel_tensor *x = gc_randn(1, ACCEL_SHAPE(2, 3, 4));
    static const pad_args cases[] = {{ACCEL_PAD_CONSTANT, 2, {1, 2}},
                                     {ACCEL_PAD_CONSTANT, 4, {-1, 1, 2, -1}},
                                     {ACCEL_PAD_CONSTANT, 6, {0, -3, 1, 0, 1, 1}},
                                     {ACCEL_PAD_REFLECT, 4, {3, 1, 2, 2}},
                                     {ACCEL_PAD_REPLICATE, 4, {2, 0, 1, 3}},
                                     {ACCEL_PAD_CIRCULAR, 4, {4, 2, 1, 3}}};
    const gradcheck_opts linear = {.eps = 0.25};
    for (int i = 0; i < 6; i++)
        CHECK_MSG(gradcheck("pad", loss_pad, (void *)&cases[i], 1, (accel_tensor *[]){x}, &linear) == 0, "case %d", i);
    accel_tensor_free(x);
}

/* x's dtype kept, the value cast to it (an integer tensor's truncated, as torch's); a transposed view read as it
 * stands; npad 0 a copy, not x; results with nothing in them; meta shapes. */
static void test_dtypes_views_empty(void) {
    accel_tensor *i = accel_from_floats(ACCEL_SHAPE(3), (float[]){0, 1, 2});
    accel_tensor *ii = accel_to_dtype(i, ACCEL_I64), *yi = accel_pad(ii, 2, (int64_t[]){1, 1}, ACCEL_PAD_CONSTANT, 2.7);
    float v[16];
    CHECK(yi && yi->dtype == ACCEL_I64 && accel_to_floats(yi, v) == ACCEL_OK);
    CHECK(v[0] == 2 && v[1] == 0 && v[2] == 1 && v[3] == 2 && v[4] == 2);
    accel_tensor *b = accel_to_dtype(i, ACCEL_BF16), *yb = accel_pad(b, 2, (int64_t[]){0, 2}, ACCEL_PAD_CONSTANT, -1.5);
    CHECK(yb && yb->dtype == ACCEL_BF16 && accel_to_floats(yb, v) == ACCEL_OK && v[2] == 2 && v[3] == -1.5f &&
          v[4] == -1.5f);
    /* [[0, 1, 2], [3, 4, 5]] transposed: [[0, 3], [1, 4], [2, 5]], one column of 9 after */
    accel_tensor *m = accel_from_floats(ACCEL_SHAPE(2, 3), (float[]){0, 1, 2, 3, 4, 5});
    accel_tensor *t = accel_pad(accel_transpose(m, 0, 1), 2, (int64_t[]){0, 1}, ACCEL_PAD_CONSTANT, 9);
    CHECK(t && t->shape[0] == 3 && t->shape[1] == 3 && accel_to_floats(t, v) == ACCEL_OK);
    CHECK(v[0] == 0 && v[1] == 3 && v[2] == 9 && v[3] == 1 && v[4] == 4 && v[5] == 9 && v[8] == 9);
    accel_tensor *copy = accel_pad(m, 0, NULL, ACCEL_PAD_CONSTANT, 0);
    CHECK(copy && copy != m && accel_fill_(copy, 7) == ACCEL_OK && accel_to_floats(m, v) == ACCEL_OK && v[5] == 5);
    /* cropped to nothing (torch allows a size of 0), and an empty x padded: all value */
    accel_tensor *none = accel_pad(m, 2, (int64_t[]){-2, -1}, ACCEL_PAD_CONSTANT, 0);
    CHECK(none && none->shape[0] == 2 && none->shape[1] == 0);
    accel_tensor *e = accel_pad(accel_zeros(ACCEL_F32, ACCEL_SHAPE(2, 0)), 2, (int64_t[]){1, 1}, ACCEL_PAD_CONSTANT, 4);
    CHECK(e && e->shape[1] == 2 && accel_to_floats(e, v) == ACCEL_OK && v[0] == 4 && v[3] == 4);
    /* the gradient of a cropped-to-nothing result: zeros of x's shape */
    accel_tensor *x = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(2, 3), ACCEL_CPU_DEVICE);
    CHECK(x && accel_fill_(x, 1) == ACCEL_OK);
    accel_requires_grad_(x, true);
    accel_tensor *s = accel_sum(accel_pad(x, 2, (int64_t[]){-3, 0}, ACCEL_PAD_CONSTANT, 5), 0, NULL, false);
    CHECK(s && accel_backward(s) == ACCEL_OK && x->grad && accel_to_floats(x->grad, v) == ACCEL_OK && v[0] == 0 &&
          v[5] == 0);
    accel_tensor_free(x);
    accel_tensor *meta = accel_pad(accel_empty_on(ACCEL_F32, ACCEL_SHAPE(2, 3), ACCEL_META_DEVICE), 4,
                                   (int64_t[]){1, 1, 2, 0}, ACCEL_PAD_CONSTANT, 0);
    CHECK(meta && meta->shape[0] == 4 && meta->shape[1] == 5 && meta->device.type == ACCEL_DEV_META);
    meta = accel_pad(accel_empty_on(ACCEL_F32, ACCEL_SHAPE(2, 3, 4), ACCEL_META_DEVICE), 2, (int64_t[]){3, 2},
                     ACCEL_PAD_REFLECT, 0);
    CHECK(meta && meta->shape[2] == 9 && meta->device.type == ACCEL_DEV_META);
    /* the other modes on a transposed view, a bf16 x, an empty batch, zero pads (a copy) */
    accel_tensor *r = accel_pad(accel_unsqueeze(accel_transpose(m, 0, 1), 0), 2, (int64_t[]){1, 1}, ACCEL_PAD_REFLECT, 0);
    CHECK(r && r->shape[2] == 4 && accel_to_floats(r, v) == ACCEL_OK && v[0] == 3 && v[1] == 0 && v[3] == 0 &&
          v[4] == 4 && v[8] == 5);
    accel_tensor *rb = accel_pad(accel_unsqueeze(b, 0), 2, (int64_t[]){2, 1}, ACCEL_PAD_CIRCULAR, 0);
    CHECK(rb && rb->dtype == ACCEL_BF16 && accel_to_floats(rb, v) == ACCEL_OK && v[0] == 1 && v[1] == 2 && v[2] == 0 &&
          v[5] == 0);
    accel_tensor *eb = accel_pad(accel_zeros(ACCEL_F32, ACCEL_SHAPE(0, 2, 3)), 2, (int64_t[]){1, 1}, ACCEL_PAD_REPLICATE, 0);
    CHECK(eb && eb->shape[0] == 0 && eb->shape[2] == 5);
    accel_tensor *same = accel_pad(accel_unsqueeze(m, 0), 2, (int64_t[]){0, 0}, ACCEL_PAD_REPLICATE, 0);
    CHECK(same && same->shape[2] == 3 && accel_fill_(same, 8) == ACCEL_OK && accel_to_floats(m, v) == ACCEL_OK &&
          v[5] == 5);
    accel_step_reset();
}

static void expect_error(const accel_tensor *y, const char *needle) {
    CHECK_MSG(!y && strstr(accel_last_error(), needle), "wanted an error naming '%s', got %s", needle,
              y ? "a result" : accel_last_error());
    accel_clear_error();
}

static void test_errors(void) {
    accel_tensor *x = accel_zeros(ACCEL_F32, ACCEL_SHAPE(2, 3));
    expect_error(accel_pad(x, 3, (int64_t[]){1, 1, 1}, ACCEL_PAD_CONSTANT, 0), "padding length must be divisible by 2 (got 3)");
    expect_error(accel_pad(x, -2, (int64_t[]){1, 1}, ACCEL_PAD_CONSTANT, 0), "divisible by 2 (got -2)");
    expect_error(accel_pad(x, 2, NULL, ACCEL_PAD_CONSTANT, 0), "a NULL pad");
    expect_error(accel_pad(x, 6, (int64_t[]){1, 1, 1, 1, 1, 1}, ACCEL_PAD_CONSTANT, 0),
                 "padding length 6 and an input of dimension 2");
    expect_error(accel_pad(x, 2, (int64_t[]){-3, -1}, ACCEL_PAD_CONSTANT, 0), "dim 1 of size 3 padded by -3 and -1 is cropped by more than its size");
    expect_error(accel_pad(x, 4, (int64_t[]){0, 0, INT64_MAX, 1}, ACCEL_PAD_CONSTANT, 0),
                 "dim 0 of size 2 padded by 9223372036854775807 and 1 would have a size past int64");
    /* torch narrows x to what the crops leave first: more cropped than there is, refused (it gave zeros) */
    expect_error(accel_pad(x, 2, (int64_t[]){-5, 4}, ACCEL_PAD_CONSTANT, 0), "is cropped by more than its size");
    expect_error(accel_pad(x, 2, (int64_t[]){INT64_MIN, -1}, ACCEL_PAD_CONSTANT, 0), "dim 1 of size 3");
    /* a result past 2^60 elements, refused before anything is gathered (replicate's pads have no cap: it wrote
     * past a wrapped allocation) */
    expect_error(accel_pad(x, 2, (int64_t[]){(int64_t)1 << 61, 0}, ACCEL_PAD_REPLICATE, 0),
                 "accel_pad: shape [2, 2305843009213693955] has too many elements");
    expect_error(accel_pad(x, 2, (int64_t[]){(int64_t)1 << 61, 0}, ACCEL_PAD_CONSTANT, 0), "too many elements");
    expect_error(accel_pad(NULL, 2, (int64_t[]){1, 1}, ACCEL_PAD_CONSTANT, 0), "accel_pad");
    /* the other modes: torch's rules */
    accel_tensor *x3 = accel_zeros(ACCEL_F32, ACCEL_SHAPE(2, 3, 4));
    expect_error(accel_pad(x3, 2, (int64_t[]){4, 0}, ACCEL_PAD_REFLECT, 0),
                 "reflect padding (4, 0) of dim 2 of size 4 is not below the dim's size");
    expect_error(accel_pad(x3, 2, (int64_t[]){1, 5}, ACCEL_PAD_CIRCULAR, 0), "would wrap around more than once");
    expect_error(accel_pad(x3, 2, (int64_t[]){-1, 1}, ACCEL_PAD_REPLICATE, 0), "negative (it crops in constant mode only)");
    expect_error(accel_pad(x3, 6, (int64_t[]){1, 1, 1, 1, 1, 1}, ACCEL_PAD_REFLECT, 0),
                 "reflect padding of 6 values is not built for a 3-D input");
    expect_error(accel_pad(accel_zeros(ACCEL_F32, ACCEL_SHAPE(4)), 2, (int64_t[]){1, 1}, ACCEL_PAD_REPLICATE, 0),
                 "for a 1-D input");
    expect_error(accel_pad(accel_zeros(ACCEL_F32, ACCEL_SHAPE(2, 0, 4)), 2, (int64_t[]){1, 1}, ACCEL_PAD_REFLECT, 0),
                 "non-empty, got [2, 0, 4]");
    expect_error(accel_pad(accel_zeros(ACCEL_I64, ACCEL_SHAPE(2, 3)), 2, (int64_t[]){1, 1}, ACCEL_PAD_REFLECT, 0),
                 "reflect padding of a int64 tensor is not built");
    expect_error(accel_pad(x3, 2, (int64_t[]){1, 1}, (accel_pad_mode)7, 0), "mode 7 is none of accel_pad_mode's");
    /* after the errors: a call that works */
    accel_tensor *y = accel_pad(x, 2, (int64_t[]){1, 0}, ACCEL_PAD_CONSTANT, 3);
    float v[8];
    CHECK(y && y->shape[1] == 4 && accel_to_floats(y, v) == ACCEL_OK && v[0] == 3 && v[1] == 0 && v[4] == 3);
    accel_step_reset();
}

int main(void) {
    RUN(test_pad_vs_torch);
    RUN(test_gradcheck);
    RUN(test_dtypes_views_empty);
    RUN(test_errors);
    accel_thread_cleanup();
    return check_summary();
}
