/* accel_conv2d, accel_conv1d, accel_batch_norm, accel_max_pool2d,
 * accel_avg_pool2d, accel_adaptive_avg_pool2d, accel_flatten: PyTorch
 * fixtures over generated cases (tools/gen_conv_fixtures.py; fast and
 * reference kernels), finite differences, autocast, meta, bad arguments. */
#include "accel/accel.h"
#include "check.h"
#include "gradcheck.h"
#include "ops_fixture.h"

/* The fixture's tensor called name, or NULL (no failed CHECK: the case
 * loops stop at the first absent case). */
static accel_tensor *find(fx_file *f, const char *fmt, int i, const char *what) {
    char key[64];
    snprintf(key, sizeof key, fmt, i, what);
    return fx_find(f, key);
}

/* The case's parameter vector p as integers. */
static int params(fx_file *f, const char *fmt, int i, int64_t *p, int n) {
    accel_tensor *t = find(f, fmt, i, "p");
    if (!t) return 0;
    float v[16];
    CHECK(accel_numel(t) == n && accel_to_floats(t, v) == ACCEL_OK);
    for (int k = 0; k < n; k++) p[k] = (int64_t)v[k];
    return 1;
}

/* Zeroes the gradients of the non-NULL ins and makes them require grad. */
static void fresh(int n, accel_tensor **in) {
    for (int i = 0; i < n; i++)
        if (in[i]) {
            accel_requires_grad_(in[i], true);
            if (in[i]->grad) accel_zero_(in[i]->grad);
        }
}

/* y against fmt's "y", then its backward of "gy" against "d<name>" for the
 * non-NULL ins. */
static void compare_case(fx_file *f, const char *fmt, int i, accel_tensor *y, int n, accel_tensor **in,
                         const char *const *names) {
    char what[64];
    snprintf(what, sizeof what, fmt, i, "y");
    CHECK_FX(what, y, find(f, fmt, i, "y"), 1e-4, 1e-5);
    CHECK(y && accel_backward_with(y, find(f, fmt, i, "gy")) == ACCEL_OK);
    for (int k = 0; k < n; k++) {
        if (!in[k]) continue;
        char d[16];
        snprintf(d, sizeof d, "d%s", names[k]);
        snprintf(what, sizeof what, fmt, i, d);
        CHECK_FX(what, in[k]->grad, find(f, fmt, i, d), 1e-4, 1e-4);
    }
    accel_step_reset();
}

static void test_conv_vs_torch(void) {
    fx_file f;
    if (fx_load(&f, "data/ops_conv.bin")) {
        CHECK(0);
        return;
    }
    static const char *const names[3] = {"x", "w", "b"};
    int cases = 0;
    for (int ref = 0; ref < 2; ref++) {
        bool prev = accel_set_reference_kernels(ref);
        int64_t p[8];
        for (int i = 0; params(&f, "c%d.%s", i, p, 8); i++, cases++) {
            accel_tensor *in[3] = {find(&f, "c%d.%s", i, "x"), find(&f, "c%d.%s", i, "w"), find(&f, "c%d.%s", i, "b")};
            CHECK(!p[7] == !in[2]);
            fresh(3, in);
            accel_tensor *y = accel_conv2d(in[0], in[1], in[2], p, p + 2, p + 4, p[6]);
            CHECK_MSG(y, "conv2d case %d: %s", i, accel_last_error());
            compare_case(&f, "c%d.%s", i, y, 3, in, names);
        }
        for (int i = 0; params(&f, "l%d.%s", i, p, 5); i++, cases++) {
            accel_tensor *in[3] = {find(&f, "l%d.%s", i, "x"), find(&f, "l%d.%s", i, "w"), find(&f, "l%d.%s", i, "b")};
            fresh(3, in);
            accel_tensor *y = accel_conv1d(in[0], in[1], in[2], p[0], p[1], p[2], p[3]);
            CHECK_MSG(y, "conv1d case %d: %s", i, accel_last_error());
            compare_case(&f, "l%d.%s", i, y, 3, in, names);
        }
        /* padding="same": p = dilation, groups, bias */
        for (int i = 0; params(&f, "s%d.%s", i, p, 4); i++, cases++) {
            accel_tensor *in[3] = {find(&f, "s%d.%s", i, "x"), find(&f, "s%d.%s", i, "w"), find(&f, "s%d.%s", i, "b")};
            fresh(3, in);
            accel_tensor *y = accel_conv2d(in[0], in[1], in[2], NULL, (int64_t[]){ACCEL_PADDING_SAME, ACCEL_PADDING_SAME},
                                           p, p[2]);
            CHECK_MSG(y, "conv2d same case %d: %s", i, accel_last_error());
            compare_case(&f, "s%d.%s", i, y, 3, in, names);
        }
        for (int i = 0; params(&f, "t%d.%s", i, p, 3); i++, cases++) {
            accel_tensor *in[3] = {find(&f, "t%d.%s", i, "x"), find(&f, "t%d.%s", i, "w"), find(&f, "t%d.%s", i, "b")};
            fresh(3, in);
            accel_tensor *y = accel_conv1d(in[0], in[1], in[2], 1, ACCEL_PADDING_SAME, p[0], p[1]);
            CHECK_MSG(y, "conv1d same case %d: %s", i, accel_last_error());
            compare_case(&f, "t%d.%s", i, y, 3, in, names);
        }
        accel_set_reference_kernels(prev);
    }
    CHECK(cases == 2 * (15 + 5 + 3));
    /* inputs that are not leaves (their first gradients are fresh buffers,
     * written, not added to): case 0 again through x * 1, w * 1, b * 1 */
    accel_tensor *leaf[3] = {find(&f, "c%d.%s", 0, "x"), find(&f, "c%d.%s", 0, "w"), find(&f, "c%d.%s", 0, "b")};
    fresh(3, leaf);
    accel_tensor *y = accel_conv2d(accel_mul_scalar(leaf[0], 1.0), accel_mul_scalar(leaf[1], 1.0),
                                   accel_mul_scalar(leaf[2], 1.0), (int64_t[]){1, 1}, (int64_t[]){1, 1},
                                   (int64_t[]){1, 1}, 1);
    compare_case(&f, "c%d.%s", 0, y, 3, leaf, names);
    fx_free(&f);
}

static accel_tensor *pool_case(const int64_t *p, accel_tensor *x) {
    switch (p[0]) {
    case 0: return accel_max_pool2d(x, p + 1, p + 3, p + 5, p + 7, p[9]);
    case 1: return accel_avg_pool2d(x, p + 1, p + 3, p + 5, p[9], p[10]);
    default: return accel_adaptive_avg_pool2d(x, p + 1);
    }
}

static void test_pool_vs_torch(void) {
    fx_file f;
    if (fx_load(&f, "data/ops_pool.bin")) {
        CHECK(0);
        return;
    }
    static const char *const names[1] = {"x"};
    int cases = 0, kinds[3] = {0};
    int64_t p[11];
    for (int i = 0; params(&f, "p%d.%s", i, p, 11); i++, cases++) {
        accel_tensor *x = find(&f, "p%d.%s", i, "x");
        fresh(1, &x);
        accel_tensor *y = pool_case(p, x);
        CHECK_MSG(y, "pool case %d: %s", i, accel_last_error());
        compare_case(&f, "p%d.%s", i, y, 1, &x, names);
        kinds[p[0]]++;
    }
    CHECK(cases == 17 && kinds[0] == 7 && kinds[1] == 6 && kinds[2] == 4);
    fx_free(&f);
}

/* BatchNorm1d/2d's steps as torch ran them: three training steps (the
 * first one's gradients), the running stats after them, then eval. */
static void test_batch_norm_vs_torch(void) {
    fx_file f;
    if (fx_load(&f, "data/ops_bn.bin")) {
        CHECK(0);
        return;
    }
    int cases = 0;
    for (int i = 0; find(&f, "b%d.%s", i, "p"); i++, cases++) {
        float p[3];
        accel_to_floats(find(&f, "b%d.%s", i, "p"), p);
        bool affine = p[1] != 0, track = p[2] != 0;
        accel_tensor *x0 = find(&f, "b%d.%s", i, "x0");
        int64_t C = x0->shape[1];
        /* torch's initial running stats: mean 0, var 1 */
        accel_tensor *rm = track ? accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(C), accel_default_device()) : NULL;
        accel_tensor *rv = track ? accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(C), accel_default_device()) : NULL;
        if (rv) accel_fill_(rv, 1.0);
        accel_tensor *w = affine ? find(&f, "b%d.%s", i, "w") : NULL, *b = affine ? find(&f, "b%d.%s", i, "bias") : NULL;
        accel_tensor *in[3] = {NULL, w, b};
        for (int s = 0; s < 3; s++) {
            char key[16];
            snprintf(key, sizeof key, "x%d", s);
            in[0] = find(&f, "b%d.%s", i, key);
            fresh(3, in);
            /* momentum None: the cumulative average, 1 / num_batches_tracked */
            double mom = p[0] < 0 ? 1.0 / (s + 1) : p[0];
            accel_tensor *y = accel_batch_norm(in[0], rm, rv, w, b, true, mom, 1e-5);
            snprintf(key, sizeof key, "y%d", s);
            CHECK_FX(key, y, find(&f, "b%d.%s", i, key), 1e-4, 1e-5);
            if (s == 0) {
                CHECK(accel_backward_with(y, find(&f, "b%d.%s", i, "gy")) == ACCEL_OK);
                CHECK_FX("bn dx", in[0]->grad, find(&f, "b%d.%s", i, "dx"), 1e-4, 1e-4);
                if (affine) {
                    CHECK_FX("bn dw", w->grad, find(&f, "b%d.%s", i, "dw"), 1e-4, 1e-4);
                    CHECK_FX("bn db", b->grad, find(&f, "b%d.%s", i, "db"), 1e-4, 1e-4);
                }
            }
            accel_step_reset();
        }
        if (track) {
            CHECK_FX("running_mean", rm, find(&f, "b%d.%s", i, "rm"), 1e-5, 1e-6);
            CHECK_FX("running_var", rv, find(&f, "b%d.%s", i, "rv"), 1e-5, 1e-6);
            in[0] = find(&f, "b%d.%s", i, "xe");
            fresh(3, in);
            accel_tensor *y = accel_batch_norm(in[0], rm, rv, w, b, false, 0.1, 1e-5);
            CHECK_FX("bn eval y", y, find(&f, "b%d.%s", i, "ye"), 1e-4, 1e-5);
            CHECK(y && accel_backward_with(y, find(&f, "b%d.%s", i, "gye")) == ACCEL_OK);
            CHECK_FX("bn eval dx", in[0]->grad, find(&f, "b%d.%s", i, "dxe"), 1e-4, 1e-4);
            accel_step_reset();
        }
        accel_tensor_free(rm);
        accel_tensor_free(rv);
    }
    CHECK(cases == 5);
    fx_free(&f);
}

/* ---- finite differences */

typedef struct conv_args {
    int64_t s[2], p[2], d[2], g;
} conv_args;

/* A second backward into an input's existing gradient adds to it (the
 * kernel's dx_beta 1 path): twice the first's, in training and eval. */
static void test_batch_norm_accumulates(void) {
    accel_tensor *x = gc_randn(21, ACCEL_SHAPE(3, 4, 5, 6)), *w = gc_randn(22, ACCEL_SHAPE(4));
    accel_tensor *rm = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(4), accel_default_device());
    accel_tensor *rv = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(4), accel_default_device());
    CHECK(rm && rv && accel_fill_(rm, 0.0) == ACCEL_OK && accel_fill_(rv, 1.0) == ACCEL_OK);
    for (int t = 0; t < 2; t++) {
        float first[360], second[360];
        for (int pass = 0; pass < 2; pass++) {
            accel_tensor *y = accel_batch_norm(x, rm, rv, w, NULL, t, 0.1, 1e-5);
            CHECK(y && accel_backward(gc_weighted_sum(y)) == ACCEL_OK);
            CHECK(x->grad && accel_to_floats(x->grad, pass ? second : first) == ACCEL_OK);
            accel_step_reset();
        }
        int bad = 0;
        for (int i = 0; i < 360; i++) bad += !(fabsf(second[i] - 2.0f * first[i]) <= 1e-5f + 1e-5f * fabsf(first[i]));
        CHECK_MSG(!bad, "training %d: %d of 360 elements are not twice the first backward's", t, bad);
        accel_zero_(x->grad);
    }
    accel_tensor *all[] = {x, w, rm, rv};
    for (int i = 0; i < 4; i++) accel_tensor_free(all[i]);
}

static accel_tensor *loss_conv(accel_tensor *const *in, int n, void *ctx) {
    const conv_args *a = ctx;
    return gc_weighted_sum(accel_conv2d(in[0], in[1], n > 2 ? in[2] : NULL, a->s, a->p, a->d, a->g));
}

static accel_tensor *loss_conv1d(accel_tensor *const *in, int n, void *ctx) {
    return gc_weighted_sum(accel_conv1d(in[0], in[1], in[2], 2, 1, 2, 1));
}

static accel_tensor *loss_bn(accel_tensor *const *in, int n, void *ctx) {
    bool training = *(const bool *)ctx;
    /* fixed running stats (updated in a copy: each evaluation starts alike) */
    accel_tensor *rm = accel_from_floats(ACCEL_SHAPE(3), (float[]){0.1f, -0.2f, 0.3f});
    accel_tensor *rv = accel_from_floats(ACCEL_SHAPE(3), (float[]){1.5f, 0.7f, 1.1f});
    return gc_weighted_sum(accel_batch_norm(in[0], rm, rv, in[1], in[2], training, 0.1, 1e-5));
}

static accel_tensor *loss_pool(accel_tensor *const *in, int n, void *ctx) {
    return gc_weighted_sum(pool_case(ctx, in[0]));
}

static void test_gradcheck(void) {
    static const conv_args convs[] = {
        {{1, 1}, {1, 1}, {1, 1}, 1}, {{2, 1}, {0, 2}, {1, 2}, 2}, {{1, 2}, {1, 0}, {2, 1}, 4}, {{3, 2}, {1, 1}, {1, 1}, 1}};
    accel_tensor *x = gc_randn(1, ACCEL_SHAPE(2, 4, 6, 5)), *b = gc_randn(3, ACCEL_SHAPE(4));
    /* a convolution is linear in each input: a large step is exact, and
     * keeps the f32 loss's rounding (~1e-5 of a loss of ~50) out of it */
    const gradcheck_opts linear = {.eps = 0.25};
    for (int i = 0; i < 4; i++) {
        accel_tensor *w = gc_randn(2 + i, ACCEL_SHAPE(4, 4 / convs[i].g, 3, 2));
        CHECK_MSG(gradcheck("conv2d", loss_conv, (void *)&convs[i], 3, (accel_tensor *[]){x, w, b}, &linear) == 0,
                  "case %d", i);
        CHECK_MSG(gradcheck("conv2d no bias", loss_conv, (void *)&convs[i], 2, (accel_tensor *[]){x, w}, &linear) == 0,
                  "case %d", i);
        accel_tensor_free(w);
    }
    accel_tensor *x1 = gc_randn(7, ACCEL_SHAPE(2, 3, 9)), *w1 = gc_randn(8, ACCEL_SHAPE(4, 3, 3));
    CHECK(gradcheck("conv1d", loss_conv1d, NULL, 3, (accel_tensor *[]){x1, w1, b}, &linear) == 0);
    accel_tensor *xb = gc_randn(9, ACCEL_SHAPE(4, 3, 5)), *wb = gc_randn(10, ACCEL_SHAPE(3)),
                 *bb = gc_randn(11, ACCEL_SHAPE(3));
    for (int t = 0; t < 2; t++) {
        bool training = t;
        CHECK_MSG(gradcheck("batch_norm", loss_bn, &training, 3, (accel_tensor *[]){xb, wb, bb}, NULL) == 0,
                  "training %d", t);
    }
    static const int64_t pools[][11] = {{0, 3, 2, 2, 1, 1, 1, 1, 1, 1, 0}, {0, 2, 2, 2, 3, 1, 0, 2, 1, 1, 0},
                                        {1, 3, 3, 2, 2, 1, 1, 1, 1, 1, 0}, {1, 2, 3, 2, 2, 1, 1, 1, 1, 0, 1},
                                        {2, 3, 4, 0, 0, 0, 0, 0, 0, 0, 0}};
    for (int i = 0; i < 5; i++)
        CHECK_MSG(gradcheck("pool", loss_pool, (void *)pools[i], 1, (accel_tensor *[]){x}, NULL) == 0, "case %d", i);
    accel_tensor *all[] = {x, b, x1, w1, xb, wb, bb};
    for (int i = 0; i < 7; i++) accel_tensor_free(all[i]);
}

/* ---- dtypes, meta, flatten */

static void test_autocast_meta_flatten(void) {
    accel_rng r;
    accel_rng_init(&r, 3);
    accel_tensor *x = accel_empty(ACCEL_F32, ACCEL_SHAPE(2, 3, 8, 8)), *w = accel_empty(ACCEL_F32, ACCEL_SHAPE(5, 3, 3, 3));
    accel_rng_normal_(&r, x, 0.0, 1.0);
    accel_rng_normal_(&r, w, 0.0, 0.2);
    const int64_t one[2] = {1, 1};
    accel_tensor *y32 = accel_conv2d(x, w, NULL, one, one, one, 1);
    accel_dtype prev = accel_autocast_begin(ACCEL_BF16);
    accel_tensor *y16 = accel_conv2d(x, w, NULL, one, one, one, 1);
    accel_tensor *bn = accel_batch_norm(y16, NULL, NULL, NULL, NULL, true, 0.1, 1e-5);
    accel_autocast_end(prev);
    CHECK(y16 && y16->dtype == ACCEL_BF16 && bn && bn->dtype == ACCEL_F32);
    CHECK_FX("conv2d under autocast", y16, y32, 2e-2, 2e-2);
    /* a NaN in a window wins, as in torch */
    accel_tensor *xn = accel_from_floats(ACCEL_SHAPE(1, 1, 2, 2), (float[]){1.0f, NAN, 3.0f, 2.0f});
    accel_tensor *mn = accel_max_pool2d(xn, (int64_t[]){2, 2}, NULL, (int64_t[]){0, 0}, one, false);
    CHECK(mn && isnan(accel_item(mn)));
    /* pools keep the dtype */
    accel_tensor *p16 = accel_max_pool2d(accel_to_dtype(x, ACCEL_BF16), (int64_t[]){2, 2}, NULL, (int64_t[]){0, 0}, one, false);
    CHECK(p16 && p16->dtype == ACCEL_BF16 && p16->shape[3] == 4);
    /* meta: shapes only */
    accel_tensor *xm = accel_empty_on(ACCEL_F32, ACCEL_SHAPE(4, 3, 33, 17), ACCEL_META_DEVICE);
    accel_tensor *wm = accel_empty_on(ACCEL_F32, ACCEL_SHAPE(8, 3, 5, 3), ACCEL_META_DEVICE);
    accel_tensor *ym = accel_conv2d(xm, wm, NULL, (int64_t[]){2, 3}, (int64_t[]){2, 1}, (int64_t[]){1, 2}, 1);
    CHECK(ym && ym->shape[1] == 8 && ym->shape[2] == 17 && ym->shape[3] == 5);
    accel_tensor *pm = accel_max_pool2d(xm, (int64_t[]){3, 3}, (int64_t[]){2, 2}, one, one, true);
    CHECK(pm && pm->shape[2] == 17 && pm->shape[3] == 9);
    /* flatten: a view of dims 1.. as one */
    accel_tensor *fl = accel_flatten(x, 1, -1), *mid = accel_flatten(x, 1, 2);
    CHECK(fl && fl->ndim == 2 && fl->shape[1] == 192 && fl->data == x->data);
    CHECK(mid && mid->ndim == 3 && mid->shape[1] == 24 && mid->shape[2] == 8);
    CHECK(!accel_flatten(x, 2, 1) && strstr(accel_last_error(), "start_dim"));
    accel_step_reset();
}

/* ---- bad arguments: refused with an error that names the problem */

static void expect_error(const accel_tensor *y, const char *needle) {
    CHECK_MSG(!y && strstr(accel_last_error(), needle), "wanted an error naming '%s', got %s", needle,
              y ? "a result" : accel_last_error());
    accel_clear_error();
}

/* No input channels, or no images: the output is the bias alone (or empty), its gradient the
 * output gradient's sums, as torch gives; whichever convolution path the machine chose (oneDNN
 * refuses such descriptions: the im2col path takes them). */
static void test_empty_convolutions(void) {
    const int64_t one[2] = {1, 1};
    accel_tensor *b = accel_from_floats(ACCEL_SHAPE(4), (float[]){1, 2, 3, 4});
    CHECK(accel_requires_grad_(b, true) == ACCEL_OK);
    accel_tensor *x = accel_zeros(ACCEL_F32, ACCEL_SHAPE(2, 0, 5, 5)), *w = accel_zeros(ACCEL_F32, ACCEL_SHAPE(4, 0, 3, 3));
    accel_tensor *y = accel_conv2d(x, w, b, one, one, one, 1);
    CHECK_MSG(y && y->shape[0] == 2 && y->shape[1] == 4 && y->shape[2] == 5 && y->shape[3] == 5, "%s",
              accel_last_error());
    for (int64_t c = 0; y && c < 4; c++) CHECK(accel_get(y, (int64_t[]){1, c, 4, 0}) == (double)(c + 1));
    CHECK(y && accel_backward(accel_sum_all(y)) == ACCEL_OK);
    for (int64_t c = 0; b->grad && c < 4; c++) CHECK(accel_get(b->grad, &c) == 50.0); /* 2 images x 25 */
    accel_tensor *none = accel_conv2d(accel_zeros(ACCEL_F32, ACCEL_SHAPE(0, 3, 5, 5)),
                                      accel_zeros(ACCEL_F32, ACCEL_SHAPE(4, 3, 3, 3)), NULL, one, one, one, 1);
    CHECK_MSG(none && none->shape[0] == 0 && none->shape[1] == 4, "%s", accel_last_error());
    accel_step_reset();
}

static void test_errors(void) {
    accel_tensor *x = accel_zeros(ACCEL_F32, ACCEL_SHAPE(2, 4, 6, 6)), *w = accel_zeros(ACCEL_F32, ACCEL_SHAPE(6, 2, 3, 3));
    const int64_t one[2] = {1, 1}, zero[2] = {0, 0};
    expect_error(accel_conv2d(x, w, NULL, (int64_t[]){0, 1}, zero, one, 2), "stride[0] = 0");
    expect_error(accel_conv2d(x, w, NULL, (int64_t[]){1, -2}, zero, one, 2), "stride[1] = -2");
    expect_error(accel_conv2d(x, w, NULL, one, (int64_t[]){0, -1}, one, 2), "padding[1] = -1");
    expect_error(accel_conv2d(x, w, NULL, one, zero, (int64_t[]){0, 1}, 2), "dilation[0] = 0");
    expect_error(accel_conv2d(x, w, NULL, one, zero, one, 3), "groups = 3");
    expect_error(accel_conv2d(x, w, NULL, one, zero, one, 0), "groups = 0");
    expect_error(accel_conv2d(x, w, NULL, one, zero, one, 1), "x has 4 channels, weight expects 2");
    expect_error(accel_conv2d(x, w, NULL, one, zero, (int64_t[]){4, 1}, 2), "larger than the padded input");
    accel_tensor *big = accel_zeros(ACCEL_F32, ACCEL_SHAPE(6, 2, 9, 3));
    expect_error(accel_conv2d(x, big, NULL, one, one, one, 2), "kernel size 9");
    expect_error(accel_conv2d(accel_reshape(x, ACCEL_SHAPE(8, 36)), w, NULL, one, zero, one, 2), "[N, C, H, W]");
    expect_error(accel_conv2d(x, accel_reshape(w, ACCEL_SHAPE(6, 18)), NULL, one, zero, one, 2), "weight must be");
    expect_error(accel_conv2d(x, w, accel_zeros(ACCEL_F32, ACCEL_SHAPE(5)), one, zero, one, 2), "bias must be [out]");
    expect_error(accel_conv2d(accel_zeros(ACCEL_I64, ACCEL_SHAPE(2, 4, 6, 6)), w, NULL, one, zero, one, 2), "must be a floating tensor");
    expect_error(accel_conv1d(x, w, NULL, 1, 0, 1, 1), "[N, C, L]");
    expect_error(accel_conv1d(accel_zeros(ACCEL_F32, ACCEL_SHAPE(2, 3, 5)), accel_zeros(ACCEL_F32, ACCEL_SHAPE(4, 3, 3)),
                              NULL, 0, 0, 1, 1),
                 "stride[1] = 0");
    expect_error(accel_conv2d(NULL, w, NULL, one, zero, one, 2), "argument 1");
    /* shapes as the caller gave them (they were the 4-D views: [2, 3, 1, 5] for a conv1d x [2, 3, 5]) */
    expect_error(accel_conv1d(accel_zeros(ACCEL_F32, ACCEL_SHAPE(2, 3, 5)), accel_zeros(ACCEL_F32, ACCEL_SHAPE(4, 2, 3)),
                              NULL, 1, 0, 1, 1),
                 "shapes [2, 3, 5] and [4, 2, 3] do not fit (x has 3 channels");
    expect_error(accel_conv1d(accel_zeros(ACCEL_F32, ACCEL_SHAPE(2, 3, 5)), accel_zeros(ACCEL_F32, ACCEL_SHAPE(4, 3, 3)),
                              accel_zeros(ACCEL_F32, ACCEL_SHAPE(5)), 1, 0, 1, 1),
                 "shapes [4, 3, 3] and [5] do not fit (bias");
    expect_error(accel_conv2d(accel_zeros(ACCEL_F32, ACCEL_SHAPE(4, 6, 6)), w, NULL, one, zero, one, 1),
                 "shapes [4, 6, 6] and [6, 2, 3, 3] do not fit (x has 4 channels");
    /* pools */
    expect_error(accel_max_pool2d(x, (int64_t[]){2, 2}, (int64_t[]){0, 2}, zero, one, false), "stride[0] = 0");
    expect_error(accel_max_pool2d(x, (int64_t[]){2, 2}, NULL, (int64_t[]){2, 0}, one, false), "at most half");
    expect_error(accel_max_pool2d(x, (int64_t[]){7, 2}, NULL, zero, one, false), "larger than the padded input");
    expect_error(accel_avg_pool2d(accel_zeros(ACCEL_F32, ACCEL_SHAPE(6, 6)), (int64_t[]){2, 2}, NULL, zero, false, true),
                 "got 2 dims");
    expect_error(accel_adaptive_avg_pool2d(x, (int64_t[]){0, 2}), "output_size (0, 2)");
    /* an empty plane padded: its windows held no value (max -inf, avg 0 / 0); torch refuses it */
    accel_tensor *flat = accel_zeros(ACCEL_F32, ACCEL_SHAPE(2, 4, 0, 6));
    expect_error(accel_max_pool2d(flat, (int64_t[]){2, 2}, NULL, one, one, false), "empty dim 2");
    expect_error(accel_avg_pool2d(flat, (int64_t[]){2, 2}, NULL, one, false, false), "empty dim 2");
    expect_error(accel_adaptive_avg_pool2d(flat, (int64_t[]){1, 1}), "empty dim 2");
    expect_error(accel_max_pool2d(accel_zeros(ACCEL_F32, ACCEL_SHAPE(0, 6, 6)), (int64_t[]){2, 2}, NULL, one, one, false),
                 "empty dim 0");
    accel_tensor *none = accel_max_pool2d(accel_zeros(ACCEL_F32, ACCEL_SHAPE(0, 4, 6, 6)), (int64_t[]){2, 2}, NULL,
                                          one, one, false);
    CHECK_MSG(none && none->shape[0] == 0 && none->shape[2] == 4, "%s", accel_last_error());
    /* the adaptive pool takes empty channels too, as torch's ([2, 0, 4, 4] -> [2, 0, 2, 2]; [0, 4, 4] -> [0, 2, 2]) */
    accel_tensor *no_c = accel_adaptive_avg_pool2d(accel_zeros(ACCEL_F32, ACCEL_SHAPE(2, 0, 4, 4)), (int64_t[]){2, 2});
    CHECK_MSG(no_c && no_c->shape[1] == 0 && no_c->shape[2] == 2, "%s", accel_last_error());
    no_c = accel_adaptive_avg_pool2d(accel_zeros(ACCEL_F32, ACCEL_SHAPE(0, 4, 4)), (int64_t[]){2, 2});
    CHECK_MSG(no_c && no_c->shape[0] == 0 && no_c->shape[1] == 2, "%s", accel_last_error());
    /* batch norm */
    accel_tensor *rm = accel_zeros(ACCEL_F32, ACCEL_SHAPE(4)), *r3 = accel_zeros(ACCEL_F32, ACCEL_SHAPE(3));
    expect_error(accel_batch_norm(x, rm, NULL, NULL, NULL, true, 0.1, 1e-5), "given together");
    expect_error(accel_batch_norm(x, NULL, NULL, NULL, NULL, false, 0.1, 1e-5), "eval mode");
    expect_error(accel_batch_norm(x, r3, r3, NULL, NULL, true, 0.1, 1e-5), "running_mean must be [4]");
    expect_error(accel_batch_norm(x, NULL, NULL, r3, NULL, true, 0.1, 1e-5), "weight must be [4]");
    expect_error(accel_batch_norm(x, rm, accel_zeros(ACCEL_BF16, ACCEL_SHAPE(4)), NULL, NULL, true, 0.1, 1e-5),
                 "running_var must be a contiguous f32");
    expect_error(accel_batch_norm(accel_zeros(ACCEL_F32, ACCEL_SHAPE(1, 4)), NULL, NULL, NULL, NULL, true, 0.1, 1e-5),
                 "more than 1 value per channel");
    expect_error(accel_batch_norm(accel_zeros(ACCEL_F32, ACCEL_SHAPE(4)), NULL, NULL, NULL, NULL, true, 0.1, 1e-5),
                 "2 dims or more");
    expect_error(accel_batch_norm(x, NULL, NULL, NULL, NULL, true, 1.5, 1e-5), "momentum = 1.5");
    accel_step_reset();
}

/* padding="same" (ACCEL_PADDING_SAME): the output keeps the input's size, odd totals padded after the end
 * (the fixture's cases hold the values); finite differences through the asymmetric path (x padded by accel_pad
 * first); torch's refusals; unbatched inputs; an error, then more calls. */
static void test_same_padding(void) {
    const int64_t same[2] = {ACCEL_PADDING_SAME, ACCEL_PADDING_SAME}, one[2] = {1, 1};
    accel_tensor *x = gc_randn(21, ACCEL_SHAPE(2, 4, 5, 6)), *w = gc_randn(22, ACCEL_SHAPE(4, 2, 4, 3)),
                 *b = gc_randn(23, ACCEL_SHAPE(4));
    const gradcheck_opts linear = {.eps = 0.25};
    static const conv_args asym = {{1, 1}, {ACCEL_PADDING_SAME, ACCEL_PADDING_SAME}, {1, 2}, 2};
    CHECK(gradcheck("conv2d same", loss_conv, (void *)&asym, 3, (accel_tensor *[]){x, w, b}, &linear) == 0);
    accel_tensor *y = accel_conv2d(x, w, b, NULL, same, (int64_t[]){1, 2}, 2);
    CHECK_MSG(y && y->shape[1] == 4 && y->shape[2] == 5 && y->shape[3] == 6, "%s", accel_last_error());
    /* unbatched [C, H, W] -> [O, H, W] */
    y = accel_conv2d(accel_slice(x, 0, 0, 1, 1), w, b, one, same, NULL, 2);
    CHECK(y && y->ndim == 4);
    y = accel_conv2d(accel_squeeze(accel_slice(x, 0, 0, 1, 1), 0), w, b, one, same, NULL, 2);
    CHECK_MSG(y && y->ndim == 3 && y->shape[0] == 4 && y->shape[1] == 5 && y->shape[2] == 6, "%s", accel_last_error());
    expect_error(accel_conv2d(x, w, b, (int64_t[]){2, 1}, same, NULL, 2),
                 "padding=\"same\" (ACCEL_PADDING_SAME) is not supported for strided convolutions (stride 2)");
    expect_error(accel_conv2d(x, w, b, NULL, (int64_t[]){1, ACCEL_PADDING_SAME}, NULL, 2),
                 "ACCEL_PADDING_SAME in padding[1] alone");
    expect_error(accel_conv2d(x, w, b, NULL, same, (int64_t[]){0, 1}, 2), "dilation[0] = 0");
    expect_error(accel_conv2d(x, accel_reshape(w, ACCEL_SHAPE(4, 24)), b, NULL, same, NULL, 2), "weight must be");
    expect_error(accel_conv2d(x, w, b, NULL, same, (int64_t[]){INT64_MAX / 2, 1}, 2), "past int64");
    accel_tensor *x1 = gc_randn(24, ACCEL_SHAPE(2, 3, 7)), *w1 = gc_randn(25, ACCEL_SHAPE(4, 3, 4));
    y = accel_conv1d(x1, w1, NULL, 1, ACCEL_PADDING_SAME, 1, 1);
    CHECK_MSG(y && y->shape[2] == 7, "%s", accel_last_error());
    expect_error(accel_conv1d(x1, w1, NULL, 3, ACCEL_PADDING_SAME, 1, 1), "strided convolutions (stride 3)");
    /* after the errors: the same call as before, the same values */
    accel_tensor *again = accel_conv1d(x1, w1, NULL, 1, ACCEL_PADDING_SAME, 1, 1);
    CHECK_FX("conv1d same again", again, y, 0, 0);
    accel_tensor *all[] = {x, w, b, x1, w1};
    for (int i = 0; i < 5; i++) accel_tensor_free(all[i]);
    accel_step_reset();
}

/* NULL per-dim arguments are torch's defaults (stride 1, a pool's its kernel; padding 0; dilation 1): the
 * same result as spelled out (they were read through: a crash); a NULL kernel or output size is refused. */
static void test_null_arguments(void) {
    const int64_t one[2] = {1, 1}, zero[2] = {0, 0}, k2[2] = {2, 2};
    accel_tensor *x = accel_zeros(ACCEL_F32, ACCEL_SHAPE(2, 4, 6, 6)), *w = accel_zeros(ACCEL_F32, ACCEL_SHAPE(6, 2, 3, 3));
    CHECK(accel_rng_normal_(accel_default_rng(), x, 0, 1) == ACCEL_OK);
    CHECK(accel_rng_normal_(accel_default_rng(), w, 0, 1) == ACCEL_OK);
    accel_tensor *pairs[][2] = {
        {accel_conv2d(x, w, NULL, NULL, NULL, NULL, 2), accel_conv2d(x, w, NULL, one, zero, one, 2)},
        {accel_max_pool2d(x, k2, NULL, NULL, NULL, false), accel_max_pool2d(x, k2, k2, zero, one, false)},
        {accel_avg_pool2d(x, k2, NULL, NULL, false, true), accel_avg_pool2d(x, k2, k2, zero, false, true)},
    };
    for (int i = 0; i < 3; i++) {
        CHECK_MSG(pairs[i][0] && pairs[i][1], "case %d: %s", i, accel_last_error());
        if (pairs[i][0] && pairs[i][1]) CHECK_FX("null arguments", pairs[i][0], pairs[i][1], 0, 0);
    }
    expect_error(accel_max_pool2d(x, NULL, NULL, NULL, NULL, false), "kernel size is NULL");
    expect_error(accel_avg_pool2d(x, NULL, k2, zero, false, true), "kernel size is NULL");
    expect_error(accel_adaptive_avg_pool2d(x, NULL), "output_size is NULL");
    accel_step_reset();
}

/* A stride or dilation past INT32_MAX (torch takes them): the result of a small one with the same windows,
 * gradients too (oneDNN refused the description, "invalid_arguments"; im2col's tap range wrapped at a stride
 * near INT64_MAX: zeros). */
static void test_huge_strides(void) {
    accel_tensor *x = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(2, 4, 5, 5), ACCEL_CPU_DEVICE);
    accel_tensor *w = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(6, 2, 3, 3), ACCEL_CPU_DEVICE);
    CHECK(accel_rng_normal_(accel_default_rng(), x, 0, 1) == ACCEL_OK);
    CHECK(accel_rng_normal_(accel_default_rng(), w, 0, 1) == ACCEL_OK);
    CHECK(accel_requires_grad_(x, true) == ACCEL_OK && accel_requires_grad_(w, true) == ACCEL_OK);
    const int64_t huge[2] = {INT64_C(1) << 32, INT64_MAX}, five[2] = {5, 5};
    accel_tensor *wk1 = accel_slice(accel_slice(w, 2, 1, 2, 1), 3, 1, 2, 1); /* [6, 2, 1, 1] */
    struct {
        accel_tensor *w;
        const int64_t *stride, *dilation;
    } cases[][2] = {{{w, huge, NULL}, {w, five, NULL}}, {{wk1, NULL, huge}, {wk1, NULL, NULL}}};
    for (int i = 0; i < 2; i++) {
        accel_tensor *gx[2] = {NULL, NULL}, *gw[2] = {NULL, NULL}, *y[2];
        for (int j = 0; j < 2; j++) {
            if (x->grad) CHECK(accel_zero_(x->grad) == ACCEL_OK);
            if (w->grad) CHECK(accel_zero_(w->grad) == ACCEL_OK);
            y[j] = accel_conv2d(x, cases[i][j].w, NULL, cases[i][j].stride, NULL, cases[i][j].dilation, 2);
            CHECK_MSG(y[j] && accel_backward(accel_sum_all(accel_mul(y[j], y[j]))) == ACCEL_OK, "case %d: %s", i,
                      accel_last_error());
            gx[j] = x->grad ? accel_mul_scalar(x->grad, 1.0) : NULL; /* copies: the next backward adds to them */
            gw[j] = w->grad ? accel_mul_scalar(w->grad, 1.0) : NULL;
        }
        CHECK_FX("huge stride: y", y[0], y[1], 1e-5, 1e-5); /* im2col's sums beside oneDNN's */
        CHECK_FX("huge stride: dx", gx[0], gx[1], 1e-5, 1e-5);
        CHECK_FX("huge stride: dw", gw[0], gw[1], 1e-5, 1e-5);
    }
    /* each argument within INT32_MAX, the padded plane (5 + 2 p) past it: oneDNN refuses the description,
     * im2col runs it; both windows lie in the padding (torch: zeros) */
    const int64_t s31[2] = {INT32_MAX, INT32_MAX}, p30[2] = {INT64_C(1) << 30, INT64_C(1) << 30};
    accel_tensor *pad = accel_conv2d(x, w, NULL, s31, p30, NULL, 2);
    CHECK_MSG(pad && pad->shape[2] == 2 && pad->shape[3] == 2, "%s", pad ? "shape" : accel_last_error());
    if (pad) CHECK_FX("padded plane past INT32_MAX", pad, accel_zeros(ACCEL_F32, ACCEL_SHAPE(2, 6, 2, 2)), 0, 0);
    accel_tensor_free(x);
    accel_tensor_free(w);
    accel_step_reset();
}

/* Under ceil_mode a window may overhang the padded input by less than the stride, as torch's output size
 * (its ceil) allows: F.avg_pool2d / max_pool2d's values (they were refused as "larger than the padded input"). */
static void test_ceil_mode_overhang(void) {
    accel_tensor *row = accel_from_floats(ACCEL_SHAPE(1, 1, 1, 3), (float[]){1, 2, 3});
    accel_tensor *x = accel_from_floats(ACCEL_SHAPE(1, 1, 2, 3), (float[]){1, 2, 3, 4, 5, 6});
    const int64_t k3[2] = {3, 3};
    accel_tensor *got[3] = {accel_avg_pool2d(row, k3, k3, NULL, true, true),
                            accel_max_pool2d(row, k3, k3, NULL, NULL, true),
                            accel_max_pool2d(x, k3, (int64_t[]){4, 2}, (int64_t[]){1, 1}, (int64_t[]){2, 1}, true)};
    accel_tensor *want[3] = {accel_from_floats(ACCEL_SHAPE(1, 1, 1, 1), (float[]){2}),
                             accel_from_floats(ACCEL_SHAPE(1, 1, 1, 1), (float[]){3}),
                             accel_from_floats(ACCEL_SHAPE(1, 1, 1, 2), (float[]){5, 6})};
    for (int i = 0; i < 3; i++) CHECK_FX("ceil_mode overhang", got[i], want[i], 0, 0);
    /* by the stride or more: torch's "Output size is too small"; without ceil_mode: any overhang */
    expect_error(accel_max_pool2d(row, k3, (int64_t[]){2, 2}, NULL, NULL, true), "by the stride or more");
    expect_error(accel_max_pool2d(row, k3, k3, NULL, NULL, false), "larger than the padded input");
    accel_step_reset();
}

int main(void) {
    RUN(test_conv_vs_torch);
    RUN(test_pool_vs_torch);
    RUN(test_batch_norm_vs_torch);
    RUN(test_batch_norm_accumulates);
    RUN(test_gradcheck);
    RUN(test_autocast_meta_flatten);
    RUN(test_empty_convolutions);
    RUN(test_errors);
    RUN(test_same_padding);
    RUN(test_null_arguments);
    RUN(test_huge_strides);
    RUN(test_ceil_mode_overhang);
    accel_thread_cleanup();
    return check_summary();
}
