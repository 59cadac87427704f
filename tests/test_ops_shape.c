/* Shape ops (views and copies), their gradients, and device moves. */
#include "accel/accel.h"
#include "check.h"
#include "gradcheck.h"

static void check_values(const accel_tensor *t, const float *want, int64_t n) {
    CHECK(t && accel_numel(t) == n);
    if (!t || accel_numel(t) != n) return;
    float got[64];
    accel_to_floats(t, got);
    for (int64_t i = 0; i < n; i++) CHECK_MSG(got[i] == want[i], "elem %lld: %g vs %g", (long long)i, got[i], want[i]);
}

static bool has_shape(const accel_tensor *t, int ndim, const int64_t *shape) {
    if (!t || t->ndim != ndim) return false;
    for (int i = 0; i < ndim; i++)
        if (t->shape[i] != shape[i]) return false;
    return true;
}

static void test_reshape(void) {
    accel_tensor *x = accel_arange(ACCEL_F32, 0, 24);
    accel_tensor *r = accel_reshape(x, ACCEL_SHAPE(2, -1, 4));
    CHECK(has_shape(r, ACCEL_SHAPE(2, 3, 4)) && r->data == x->data); /* a view */
    CHECK(accel_get(r, (int64_t[]){1, 2, 3}) == 23);
    r = accel_reshape(x, ACCEL_SHAPE(-1));
    CHECK(has_shape(r, ACCEL_SHAPE(24)));
    /* non-contiguous: a copy with the right element order */
    accel_tensor *t = accel_transpose(accel_reshape(x, ACCEL_SHAPE(4, 6)), 0, 1); /* [6, 4] */
    r = accel_reshape(t, ACCEL_SHAPE(24));
    CHECK(r && r->data != x->data && accel_is_contiguous(r));
    CHECK(accel_get(r, (int64_t[]){1}) == 6 && accel_get(r, (int64_t[]){4}) == 1);
    /* 0-dim <-> [1] */
    accel_tensor *s = accel_reshape(accel_full(ACCEL_F32, 0, NULL, 5), ACCEL_SHAPE(1, 1));
    CHECK(has_shape(s, ACCEL_SHAPE(1, 1)) && accel_item(s) == 5);
    CHECK(accel_reshape(s, 0, NULL)->ndim == 0);
    /* any dtype */
    accel_tensor *xi = accel_arange(ACCEL_I64, 0, 6);
    CHECK(accel_reshape(xi, ACCEL_SHAPE(3, 2))->dtype == ACCEL_I64);
    accel_step_reset();
}

static void test_permute_transpose(void) {
    accel_tensor *x = accel_reshape(accel_arange(ACCEL_F32, 0, 24), ACCEL_SHAPE(2, 3, 4));
    accel_tensor *p = accel_permute(x, (int[]){2, 0, 1});
    CHECK(has_shape(p, ACCEL_SHAPE(4, 2, 3)) && p->data == x->data && !accel_is_contiguous(p));
    CHECK(accel_get(p, (int64_t[]){3, 1, 2}) == 12 + 8 + 3);
    accel_tensor *t = accel_transpose(x, -1, 0);
    CHECK(has_shape(t, ACCEL_SHAPE(4, 3, 2)) && accel_get(t, (int64_t[]){1, 2, 1}) == 12 + 8 + 1);
    accel_tensor *c = accel_contiguous(t);
    CHECK(c && accel_is_contiguous(c) && c->data != x->data);
    CHECK(accel_get(c, (int64_t[]){1, 2, 1}) == 21);
    accel_tensor *c2 = accel_contiguous(x);
    CHECK(c2 && c2->data == x->data); /* alias */
    /* u8 and bf16 transposes copy correctly */
    accel_tensor *xb = accel_to_dtype(x, ACCEL_BF16);
    CHECK(accel_get(accel_contiguous(accel_transpose(xb, 0, 2)), (int64_t[]){3, 2, 1}) == 23);
    accel_step_reset();
}

static void test_slice(void) {
    accel_tensor *x = accel_reshape(accel_arange(ACCEL_F32, 0, 20), ACCEL_SHAPE(4, 5));
    accel_tensor *s = accel_slice(x, 1, 1, 4, 1);
    CHECK(has_shape(s, ACCEL_SHAPE(4, 3)));
    check_values(accel_contiguous(s), (float[]){1, 2, 3, 6, 7, 8, 11, 12, 13, 16, 17, 18}, 12);
    s = accel_slice(x, -1, -3, INT64_MAX, 2); /* columns 2, 4 */
    CHECK(has_shape(s, ACCEL_SHAPE(4, 2)));
    check_values(accel_contiguous(s), (float[]){2, 4, 7, 9, 12, 14, 17, 19}, 8);
    s = accel_slice(x, 0, 1, -1, 1); /* rows 1, 2 */
    check_values(accel_contiguous(s), (float[]){5, 6, 7, 8, 9, 10, 11, 12, 13, 14}, 10);
    s = accel_slice(x, 0, 3, 1, 1); /* empty */
    CHECK(has_shape(s, ACCEL_SHAPE(0, 5)));
    s = accel_slice(x, 0, -100, 100, 3); /* clamped: rows 0, 3 */
    check_values(accel_contiguous(s), (float[]){0, 1, 2, 3, 4, 15, 16, 17, 18, 19}, 10);
    /* a step past the dim takes its first element (x[1::2**63-1], as PyTorch);
     * end - start + step - 1 overflowed and the slice came out empty */
    s = accel_slice(x, 0, 1, INT64_MAX, INT64_MAX);
    CHECK(has_shape(s, ACCEL_SHAPE(1, 5)));
    check_values(accel_contiguous(s), (float[]){5, 6, 7, 8, 9}, 5);
    s = accel_slice(x, 1, INT64_MIN, INT64_MAX, INT64_MAX - 1);
    CHECK(has_shape(s, ACCEL_SHAPE(4, 1)));
    check_values(accel_contiguous(s), (float[]){0, 5, 10, 15}, 4);
    /* slice of a slice shares the base */
    accel_tensor *ss = accel_slice(accel_slice(x, 1, 1, 5, 1), 1, 1, 3, 1);
    CHECK(accel_get(ss, (int64_t[]){2, 1}) == 13);
    accel_set(ss, (int64_t[]){0, 0}, 100);
    CHECK(accel_get(x, (int64_t[]){0, 2}) == 100);
    accel_step_reset();
}

static void test_expand_squeeze(void) {
    accel_tensor *x = accel_from_floats(ACCEL_SHAPE(3, 1), (float[]){1, 2, 3});
    accel_tensor *e = accel_expand(x, ACCEL_SHAPE(2, 3, 4));
    CHECK(has_shape(e, ACCEL_SHAPE(2, 3, 4)) && e->stride[0] == 0 && e->stride[2] == 0);
    CHECK(accel_item(accel_sum_all(e)) == 48);
    e = accel_expand(x, ACCEL_SHAPE(-1, 2));
    check_values(accel_contiguous(e), (float[]){1, 1, 2, 2, 3, 3}, 6);
    accel_tensor *u = accel_unsqueeze(x, 0);
    CHECK(has_shape(u, ACCEL_SHAPE(1, 3, 1)) && u->data == x->data);
    u = accel_unsqueeze(x, -1);
    CHECK(has_shape(u, ACCEL_SHAPE(3, 1, 1)));
    u = accel_unsqueeze(x, 1);
    CHECK(has_shape(u, ACCEL_SHAPE(3, 1, 1)));
    accel_tensor *q = accel_squeeze(x, 1);
    CHECK(has_shape(q, ACCEL_SHAPE(3)) && q->data == x->data);
    q = accel_squeeze(x, 0); /* size 3: unchanged, as PyTorch */
    CHECK(has_shape(q, ACCEL_SHAPE(3, 1)));
    q = accel_squeeze(accel_unsqueeze(accel_full(ACCEL_F32, 0, NULL, 1), 0), 0);
    CHECK(q && q->ndim == 0);
    accel_step_reset();
}

static void test_concat_split(void) {
    accel_tensor *a = accel_from_floats(ACCEL_SHAPE(2, 2), (float[]){1, 2, 3, 4});
    accel_tensor *b = accel_from_floats(ACCEL_SHAPE(2, 1), (float[]){5, 6});
    accel_tensor *c = accel_concat(2, (accel_tensor *[]){a, b}, -1);
    CHECK(has_shape(c, ACCEL_SHAPE(2, 3)));
    check_values(c, (float[]){1, 2, 5, 3, 4, 6}, 6);
    c = accel_concat(2, (accel_tensor *[]){a, accel_transpose(a, 0, 1)}, 0);
    check_values(c, (float[]){1, 2, 3, 4, 1, 3, 2, 4}, 8);
    /* dtype promotion: bf16 with f32 -> f32 */
    c = accel_concat(2, (accel_tensor *[]){accel_to_dtype(a, ACCEL_BF16), a}, 0);
    CHECK(c && c->dtype == ACCEL_F32);
    /* integers */
    accel_tensor *i = accel_arange(ACCEL_I64, 0, 3);
    c = accel_concat(3, (accel_tensor *[]){i, i, i}, 0);
    CHECK(c && c->dtype == ACCEL_I64 && accel_numel(c) == 9 && accel_get(c, (int64_t[]){5}) == 2);
    accel_tensor *parts[3];
    accel_tensor *x = accel_reshape(accel_arange(ACCEL_F32, 0, 12), ACCEL_SHAPE(2, 6));
    CHECK(accel_split(x, 1, 3, (int64_t[]){1, 3, 2}, parts) == ACCEL_OK);
    CHECK(has_shape(parts[0], ACCEL_SHAPE(2, 1)) && has_shape(parts[1], ACCEL_SHAPE(2, 3)) &&
          has_shape(parts[2], ACCEL_SHAPE(2, 2)));
    check_values(accel_contiguous(parts[1]), (float[]){1, 2, 3, 7, 8, 9}, 6);
    CHECK(parts[2]->data == (float *)x->data + 4); /* views */
    accel_step_reset();
}

static void test_to_device(void) {
    accel_tensor *x = accel_ones(ACCEL_F32, ACCEL_SHAPE(2, 3));
    accel_tensor *y = accel_to_device(x, x->device);
    CHECK(y && y->data == x->data);
    accel_tensor *m = accel_to_device(x, ACCEL_META_DEVICE);
    CHECK(m && m->device.type == ACCEL_DEV_META && m->data == NULL && has_shape(m, ACCEL_SHAPE(2, 3)));
    CHECK(accel_to_device(m, ACCEL_META_DEVICE) != NULL);
    accel_clear_error();
    CHECK(accel_to_device(m, ACCEL_CPU_DEVICE) == NULL);
    CHECK(accel_last_status() == ACCEL_ERR_DEVICE);
    CHECK_STR_CONTAINS(accel_last_error(), "has no data");
    CHECK_STR_CONTAINS(accel_last_error(), "[2, 3]");
    accel_clear_error();
    accel_device cuda = {ACCEL_DEV_CUDA, 0};
    if (!accel_device_available(cuda)) {
        CHECK(accel_to_device(x, cuda) == NULL);
        CHECK_STR_CONTAINS(accel_last_error(), "cuda");
        accel_clear_error();
    }
    /* the same-device alias carries the gradient */
    accel_tensor *w = gc_randn(1, ACCEL_SHAPE(3));
    CHECK(accel_backward(accel_sum_all(accel_mul_scalar(accel_to_device(w, ACCEL_CPU_DEVICE), 2))) == ACCEL_OK);
    check_values(w->grad, (float[]){2, 2, 2}, 3);
    accel_tensor_free(w);
    accel_step_reset();
}

/* ---- gradients (each view op, with a non-uniform downstream weight) */

#define LOSS1(NAME, EXPR)                                                \
    static accel_tensor *NAME(accel_tensor *const *in, int n, void *c) { \
        accel_tensor *x = in[0];                                         \
        return gc_weighted_sum(EXPR);                                    \
    }

LOSS1(l_reshape, accel_reshape(x, ACCEL_SHAPE(4, -1)))
LOSS1(l_reshape_copy, accel_reshape(accel_transpose(x, 0, 2), ACCEL_SHAPE(-1)))
LOSS1(l_permute, accel_permute(x, (int[]){1, 2, 0}))
LOSS1(l_transpose, accel_mul(accel_transpose(x, 1, 2), accel_transpose(x, 1, 2)))
LOSS1(l_slice, accel_slice(x, 2, 3, 0, 1))
LOSS1(l_slice_step, accel_slice(accel_slice(x, 2, -1, -5, 1), 2, 0, 4, 2))
LOSS1(l_slice_neg, accel_slice(x, 1, -2, INT64_MAX, 2))
LOSS1(l_expand, accel_expand(accel_slice(x, 0, 0, 1, 1), ACCEL_SHAPE(3, 2, 3, 4)))
LOSS1(l_contiguous, accel_contiguous(accel_permute(x, (int[]){2, 1, 0})))
LOSS1(l_unsqueeze, accel_mul(accel_unsqueeze(x, 1), accel_unsqueeze(x, 0)))
LOSS1(l_squeeze, accel_squeeze(accel_slice(x, 1, 1, 2, 1), 1))
LOSS1(l_concat, accel_concat(3, (accel_tensor *[]){x, accel_exp(x), accel_slice(x, 0, 1, 2, 1)}, 0))
LOSS1(l_concat6, accel_concat(6, (accel_tensor *[]){x, x, accel_neg(x), x, accel_tanh(x), x}, 2))
LOSS1(l_slices, accel_mul(accel_slice(x, 2, 1, 3, 1), accel_add(accel_slice(x, 2, 0, 2, 1), accel_slice(x, 2, 2, 4, 1))))

static accel_tensor *l_split(accel_tensor *const *in, int n, void *c) {
    accel_tensor *parts[3];
    if (accel_split(in[0], -1, 3, (int64_t[]){1, 2, 1}, parts) != ACCEL_OK) return NULL;
    return gc_weighted_sum(accel_concat(3, (accel_tensor *[]){accel_exp(parts[2]), parts[0],
                                                               accel_mul(parts[1], parts[1])}, -1));
}

/* Slices of a step tensor (y = 1.5 x): y's first gradient is made by the
 * first slice's backward, the others add into their places; the middle
 * slice overlaps both others. */
static accel_tensor *l_slices_of_step(accel_tensor *const *in, int n, void *c) {
    accel_tensor *y = accel_mul_scalar(in[0], 1.5);
    return gc_weighted_sum(accel_mul(accel_slice(y, 2, 1, 3, 1),
                                     accel_add(accel_slice(y, 2, 0, 2, 1), accel_exp(accel_slice(y, 2, 2, 4, 1)))));
}

/* A step tensor cut by split (a fused projection's q, k and v), one part
 * empty, one used through a slice of its own. */
static accel_tensor *l_split_of_step(accel_tensor *const *in, int n, void *c) {
    accel_tensor *parts[4];
    if (accel_split(accel_tanh(in[0]), 2, 4, (int64_t[]){1, 0, 2, 1}, parts) != ACCEL_OK) return NULL;
    return gc_weighted_sum(accel_concat(4, (accel_tensor *[]){accel_exp(parts[1]), accel_slice(parts[2], 2, 1, 2, 1),
                                                               accel_mul(parts[3], parts[3]), parts[0]}, -1));
}

static accel_tensor *l_concat_two(accel_tensor *const *in, int n, void *c) {
    return gc_weighted_sum(accel_concat(2, in, 1));
}

static void test_gradients(void) {
    accel_tensor *x = gc_randn(31, ACCEL_SHAPE(2, 3, 4));
    struct { const char *name; gradcheck_fn fn; } cases[] = {
        {"reshape", l_reshape},       {"reshape_copy", l_reshape_copy}, {"permute", l_permute},
        {"transpose", l_transpose},   {"slice", l_slice},               {"slice_step", l_slice_step},
        {"slice_neg", l_slice_neg},   {"expand", l_expand},             {"contiguous", l_contiguous},
        {"unsqueeze", l_unsqueeze},   {"squeeze", l_squeeze},           {"concat", l_concat},
        {"concat6", l_concat6},       {"slices", l_slices},       {"split", l_split},
        {"slices_of_step", l_slices_of_step}, {"split_of_step", l_split_of_step},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        CHECK_MSG(gradcheck(cases[i].name, cases[i].fn, NULL, 1, &x, NULL) == 0, "%s", cases[i].name);
    accel_tensor *y = gc_randn(32, ACCEL_SHAPE(2, 1, 4));
    CHECK(gradcheck("concat_two", l_concat_two, NULL, 2, (accel_tensor *[]){x, y}, NULL) == 0);
    accel_tensor_free(x);
    accel_tensor_free(y);
}

/* Concat with more than four inputs records one node per group: every input gets its gradient. */
static void test_concat_many_grad(void) {
    accel_tensor *w[9];
    accel_tensor *ws[9];
    for (int i = 0; i < 9; i++) {
        w[i] = gc_randn((uint64_t)i, ACCEL_SHAPE(2));
        ws[i] = w[i];
    }
    accel_tensor *c = accel_concat(9, ws, 0);
    CHECK(c && accel_numel(c) == 18);
    accel_tensor *weights = accel_arange(ACCEL_F32, 0, 18);
    CHECK(accel_backward(accel_sum_all(accel_mul(c, weights))) == ACCEL_OK);
    for (int i = 0; i < 9; i++) {
        CHECK(w[i]->grad != NULL);
        if (w[i]->grad) check_values(w[i]->grad, (float[]){(float)(2 * i), (float)(2 * i + 1)}, 2);
        accel_tensor_free(w[i]);
    }
    accel_step_reset();
}

/* A bf16 step tensor cut in three, the parts concatenated in another order
 * and one part also used alone: its gradient (bf16, made by the slices'
 * backward in its place) carries each position's exact weights. */
static void test_split_grad_bf16(void) {
    accel_tensor *x = gc_randn(5, ACCEL_SHAPE(3, 8)), *p[3];
    CHECK(accel_split(accel_to_dtype(x, ACCEL_BF16), 1, 3, (int64_t[]){2, 4, 2}, p) == ACCEL_OK);
    accel_tensor *cat = accel_to_dtype(accel_concat(3, (accel_tensor *[]){p[2], p[0], p[1]}, 1), ACCEL_F32);
    accel_tensor *loss = accel_add(accel_sum_all(accel_mul(cat, accel_reshape(accel_arange(ACCEL_F32, 0, 24), ACCEL_SHAPE(3, 8)))),
                                   accel_sum_all(accel_mul_scalar(accel_to_dtype(p[1], ACCEL_F32), 3)));
    CHECK(accel_backward(loss) == ACCEL_OK);
    float want[24];
    for (int r = 0; r < 3; r++)
        for (int c = 0; c < 8; c++) /* cat's columns: p2 (x's 6, 7), p0 (0, 1), p1 (2..5) */
            want[r * 8 + c] = (float)(r * 8) + (c < 2 ? c + 2 : c < 6 ? c + 2 + 3 : c - 6);
    CHECK(x->grad != NULL);
    if (x->grad) check_values(x->grad, want, 24);
    accel_tensor_free(x);
    accel_step_reset();
}

/* Two slices of a leaf whose gradient exists, the leaf's requires_grad
 * turned off between the forward and the backward: its gradient stays as
 * it was (PyTorch leaves x.grad alone), the slices' backward adds nothing. */
static void test_slice_grad_after_requires_off(void) {
    accel_tensor *x = gc_randn(7, ACCEL_SHAPE(2, 6));
    CHECK(accel_backward(accel_sum_all(accel_mul(accel_slice(x, 1, 0, 3, 1), accel_slice(x, 1, 3, 6, 1)))) ==
          ACCEL_OK);
    float before[12], after[12];
    CHECK(x->grad && accel_to_floats(x->grad, before) == ACCEL_OK);
    accel_tensor *loss = accel_sum_all(accel_add(accel_slice(x, 1, 0, 3, 1), accel_slice(x, 1, 3, 6, 1)));
    CHECK(accel_requires_grad_(x, false) == ACCEL_OK);
    CHECK(accel_backward(loss) == ACCEL_OK);
    CHECK(x->grad && accel_to_floats(x->grad, after) == ACCEL_OK);
    CHECK(memcmp(before, after, sizeof before) == 0);
    accel_tensor_free(x);
    accel_step_reset();
}

int main(void) {
    RUN(test_reshape);
    RUN(test_permute_transpose);
    RUN(test_slice);
    RUN(test_expand_squeeze);
    RUN(test_concat_split);
    RUN(test_to_device);
    RUN(test_gradients);
    RUN(test_concat_many_grad);
    RUN(test_split_grad_bf16);
    RUN(test_slice_grad_after_requires_off);
    accel_thread_cleanup();
    return check_summary();
}
