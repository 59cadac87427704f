/* Reductions: sum/mean over dims, sum_all/mean_all, max with indices,
 * sum_to_shape; fast vs reference; finite-difference gradients. */
#include "accel/accel.h"
#include "check.h"
#include "gradcheck.h"

static void check_values(const accel_tensor *t, const float *want, int64_t n, double tol) {
    CHECK(t && accel_numel(t) == n);
    if (!t || accel_numel(t) != n) return;
    float got[64];
    accel_to_floats(t, got);
    for (int64_t i = 0; i < n; i++) CHECK_CLOSE(got[i], want[i], tol, tol);
}

static bool has_shape(const accel_tensor *t, int ndim, const int64_t *shape) {
    if (!t || t->ndim != ndim) return false;
    for (int i = 0; i < ndim; i++)
        if (t->shape[i] != shape[i]) return false;
    return true;
}

static void test_sum_mean_values(void) {
    /* x[i][j][k] = 12i + 4j + k over [2, 3, 4] */
    accel_tensor *x = accel_arange(ACCEL_F32, 0, 24);
    x = accel_reshape(x, ACCEL_SHAPE(2, 3, 4));
    accel_tensor *s = accel_sum(x, 1, (int[]){1}, false);
    CHECK(has_shape(s, ACCEL_SHAPE(2, 4)));
    check_values(s, (float[]){12, 15, 18, 21, 48, 51, 54, 57}, 8, 0);
    s = accel_sum(x, 2, (int[]){0, -1}, true);
    CHECK(has_shape(s, ACCEL_SHAPE(1, 3, 1)));
    check_values(s, (float[]){60, 92, 124}, 3, 0);
    s = accel_sum(x, 0, NULL, false);
    CHECK(s && s->ndim == 0 && accel_item(s) == 276);
    s = accel_sum(x, 0, NULL, true);
    CHECK(has_shape(s, ACCEL_SHAPE(1, 1, 1)) && accel_item(s) == 276);
    CHECK(accel_item(accel_sum_all(x)) == 276);
    CHECK(accel_sum_all(x)->ndim == 0);
    CHECK_CLOSE(accel_item(accel_mean_all(x)), 11.5, 1e-7, 0);
    accel_tensor *m = accel_mean(x, 1, (int[]){2}, false);
    CHECK(has_shape(m, ACCEL_SHAPE(2, 3)));
    check_values(m, (float[]){1.5f, 5.5f, 9.5f, 13.5f, 17.5f, 21.5f}, 6, 1e-7);
    /* over a transposed view */
    accel_tensor *t = accel_transpose(x, 0, 2); /* [4, 3, 2] */
    s = accel_sum(t, 1, (int[]){2}, false);
    CHECK(has_shape(s, ACCEL_SHAPE(4, 3)));
    check_values(s, (float[]){12, 20, 28, 14, 22, 30, 16, 24, 32, 18, 26, 34}, 12, 0);
    /* integer sums are int64 */
    accel_tensor *xi = accel_arange(ACCEL_I32, 0, 5);
    accel_tensor *si = accel_sum_all(xi);
    CHECK(si && si->dtype == ACCEL_I64 && accel_item(si) == 10);
    /* bf16 keeps its dtype, accumulates in wide precision */
    accel_tensor *ones = accel_ones(ACCEL_BF16, ACCEL_SHAPE(1000));
    accel_tensor *sb = accel_sum_all(ones);
    CHECK(sb && sb->dtype == ACCEL_BF16 && accel_item(sb) == 1000);
    /* a 0-dim input */
    accel_tensor *z = accel_full(ACCEL_F32, 0, NULL, 3.0);
    CHECK(accel_item(accel_sum(z, 1, (int[]){0}, false)) == 3.0);
    CHECK(accel_item(accel_mean_all(z)) == 3.0);
    accel_step_reset();
}

static void test_max(void) {
    accel_tensor *x = accel_from_floats(ACCEL_SHAPE(2, 4), (float[]){1, 5, 5, -2, -1, -3, 7, 7});
    accel_tensor *idx = NULL;
    accel_tensor *m = accel_max(x, 1, false, &idx);
    CHECK(has_shape(m, ACCEL_SHAPE(2)) && has_shape(idx, ACCEL_SHAPE(2)) && idx->dtype == ACCEL_I64);
    check_values(m, (float[]){5, 7}, 2, 0);
    int64_t iv[4];
    accel_to_int64s(idx, iv);
    CHECK(iv[0] == 1 && iv[1] == 2); /* first of ties */
    m = accel_max(x, 0, true, &idx);
    CHECK(has_shape(m, ACCEL_SHAPE(1, 4)));
    check_values(m, (float[]){1, 5, 7, 7}, 4, 0);
    accel_to_int64s(idx, iv);
    CHECK(iv[0] == 0 && iv[1] == 0 && iv[2] == 1 && iv[3] == 1);
    /* NaN wins, as in PyTorch */
    accel_tensor *n = accel_from_floats(ACCEL_SHAPE(3), (float[]){1, NAN, 3});
    m = accel_max(n, -1, false, &idx);
    CHECK(isnan(accel_item(m)) && accel_item(idx) == 1);
    /* integers and strided inputs */
    accel_tensor *xi = accel_from_data(ACCEL_I64, ACCEL_SHAPE(2, 2), (int64_t[]){4, 9, 8, 2});
    m = accel_max(accel_transpose(xi, 0, 1), 1, false, &idx);
    CHECK(m && m->dtype == ACCEL_I64);
    accel_to_int64s(m, iv);
    CHECK(iv[0] == 8 && iv[1] == 9);
    accel_to_int64s(idx, iv);
    CHECK(iv[0] == 1 && iv[1] == 0);
    /* scalar input */
    m = accel_max(accel_full(ACCEL_F32, 0, NULL, 2.5), 0, false, &idx);
    CHECK(m && m->ndim == 0 && accel_item(m) == 2.5 && accel_item(idx) == 0);
    /* empty dim */
    accel_clear_error();
    CHECK(accel_max(accel_zeros(ACCEL_F32, ACCEL_SHAPE(2, 0)), 1, false, &idx) == NULL && idx == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_max");
    CHECK_STR_CONTAINS(accel_last_error(), "[2, 0]");
    accel_clear_error();
    accel_step_reset();
}

static void test_sum_to_shape(void) {
    accel_tensor *g = accel_arange(ACCEL_F32, 0, 24);
    g = accel_reshape(g, ACCEL_SHAPE(2, 3, 4));
    CHECK(accel_sum_to_shape(g, ACCEL_SHAPE(2, 3, 4)) == g);
    accel_tensor *r = accel_sum_to_shape(g, ACCEL_SHAPE(4));
    CHECK(has_shape(r, ACCEL_SHAPE(4)));
    check_values(r, (float[]){60, 66, 72, 78}, 4, 0);
    r = accel_sum_to_shape(g, ACCEL_SHAPE(3, 1));
    CHECK(has_shape(r, ACCEL_SHAPE(3, 1)));
    check_values(r, (float[]){60, 92, 124}, 3, 0);
    r = accel_sum_to_shape(g, ACCEL_SHAPE(1, 3, 4));
    CHECK(has_shape(r, ACCEL_SHAPE(1, 3, 4)));
    CHECK(accel_item(accel_sum_all(r)) == 276);
    r = accel_sum_to_shape(g, 0, NULL);
    CHECK(r && r->ndim == 0 && accel_item(r) == 276);
    accel_clear_error();
    CHECK(accel_sum_to_shape(g, ACCEL_SHAPE(2, 4)) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "[2, 3, 4]");
    CHECK_STR_CONTAINS(accel_last_error(), "[2, 4]");
    accel_clear_error();
    accel_step_reset();
}

static void test_fast_vs_reference(void) {
    accel_dtype dts[3] = {ACCEL_F32, ACCEL_BF16, ACCEL_F16};
    int dimsets[][3] = {{0, 0, 0}, {1, 0, 0}, {2, 0, 0}, {0, 2, 0}, {1, 2, 0}, {0, 1, 2}, {0, 1, 0}};
    int ndims[] = {1, 1, 1, 2, 2, 3, 2};
    for (int k = 0; k < 3; k++) {
        accel_tensor *x = accel_empty(dts[k], ACCEL_SHAPE(30, 40, 50));
        accel_rng r;
        accel_rng_init(&r, (uint64_t)k + 1);
        accel_rng_normal_(&r, x, 0, 1);
        accel_tensor *views[3] = {x, accel_permute(x, (int[]){2, 0, 1}), accel_slice(x, 1, 3, 40, 3)};
        for (int v = 0; v < 3; v++)
            for (int s = 0; s < 7; s++)
                for (int mean = 0; mean < 2; mean++) {
                    accel_tensor *out[2];
                    for (int ref = 0; ref < 2; ref++) {
                        accel_set_reference_kernels(ref);
                        out[ref] = mean ? accel_mean(views[v], ndims[s], dimsets[s], s % 2)
                                        : accel_sum(views[v], ndims[s], dimsets[s], s % 2);
                    }
                    accel_set_reference_kernels(false);
                    CHECK(out[0] && out[1] && accel_same_shape(out[0], out[1]));
                    int64_t n = accel_numel(out[0]);
                    float *a = malloc(sizeof(float) * (size_t)n), *b = malloc(sizeof(float) * (size_t)n);
                    accel_to_floats(out[0], a);
                    accel_to_floats(out[1], b);
                    double worst = 0;
                    for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs(a[i] - b[i]) / (1 + fabs(b[i])));
                    CHECK_MSG(worst <= (dts[k] == ACCEL_F32 ? 1e-6 : 1e-2), "dtype %d view %d dims %d mean %d: %g",
                              (int)dts[k], v, s, mean, worst);
                    free(a);
                    free(b);
                }
        accel_step_reset();
    }
}

/* ---- gradients */

static accel_tensor *l_sum_dim(accel_tensor *const *in, int n, void *c) {
    return gc_weighted_sum(accel_sum(in[0], 1, (int[]){1}, false));
}
static accel_tensor *l_sum_keep(accel_tensor *const *in, int n, void *c) {
    return gc_weighted_sum(accel_sum(in[0], 2, (int[]){0, 2}, true));
}
static accel_tensor *l_mean_dim(accel_tensor *const *in, int n, void *c) {
    return gc_weighted_sum(accel_mean(in[0], 1, (int[]){-1}, false));
}
static accel_tensor *l_sum_all(accel_tensor *const *in, int n, void *c) {
    return accel_sum_all(accel_mul(in[0], in[0]));
}
static accel_tensor *l_mean_all(accel_tensor *const *in, int n, void *c) {
    return accel_mul_scalar(accel_mean_all(accel_exp(in[0])), 3.0);
}
static accel_tensor *l_max0(accel_tensor *const *in, int n, void *c) {
    return gc_weighted_sum(accel_max(in[0], 0, false, NULL));
}
static accel_tensor *l_max2(accel_tensor *const *in, int n, void *c) {
    return gc_weighted_sum(accel_max(in[0], 2, true, NULL));
}
static accel_tensor *l_sum_to_shape(accel_tensor *const *in, int n, void *c) {
    return gc_weighted_sum(accel_sum_to_shape(in[0], ACCEL_SHAPE(3, 1)));
}
static accel_tensor *l_sum_strided(accel_tensor *const *in, int n, void *c) {
    return gc_weighted_sum(accel_mean(accel_transpose(in[0], 0, 2), 2, (int[]){0, 1}, false));
}

static void test_gradients(void) {
    accel_tensor *x = gc_randn(21, ACCEL_SHAPE(2, 3, 4));
    struct { const char *name; gradcheck_fn fn; } cases[] = {
        {"sum_dim", l_sum_dim},   {"sum_keep", l_sum_keep}, {"mean_dim", l_mean_dim},
        {"sum_all", l_sum_all},   {"mean_all", l_mean_all}, {"max0", l_max0},
        {"max2", l_max2},         {"sum_to_shape", l_sum_to_shape}, {"sum_strided", l_sum_strided},
    };
    for (int ref = 0; ref < 2; ref++) {
        accel_set_reference_kernels(ref);
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            CHECK_MSG(gradcheck(cases[i].name, cases[i].fn, NULL, 1, &x, NULL) == 0, "%s ref %d",
                      cases[i].name, ref);
    }
    accel_set_reference_kernels(false);
    /* max routes the gradient only to the argmax */
    accel_tensor *w = gc_from_floats(ACCEL_SHAPE(2, 3), (float[]){1, 9, 2, 8, 3, 4});
    CHECK(accel_backward(accel_sum_all(accel_max(w, 1, false, NULL))) == ACCEL_OK);
    check_values(w->grad, (float[]){0, 1, 0, 1, 0, 0}, 6, 0);
    accel_tensor_free(w);
    accel_tensor_free(x);
    accel_step_reset();
}

int main(void) {
    RUN(test_sum_mean_values);
    RUN(test_max);
    RUN(test_sum_to_shape);
    RUN(test_fast_vs_reference);
    RUN(test_gradients);
    accel_thread_cleanup();
    return check_summary();
}
