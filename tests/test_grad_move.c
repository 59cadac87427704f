/* First gradients taken over instead of copied (accel__grad_move,
 * src/core/core_internal.h): reshape, contiguous and alias pass their
 * output's gradient to their input, add to one of its inputs, permute its
 * transposed copy, a unary op its f32 result.
 *   - the input's gradient is the output's buffer itself, and the output's
 *     gradient is dropped (NULL), so no later accumulation into the input can
 *     show through it;
 *   - an input used again (its other use's gradient added later into the
 *     taken buffer) gets the exact sum; add's two inputs never share one
 *     buffer;
 *   - a persistent leaf keeps its own persistent gradient. */
#include "accel/accel.h"
#include "check.h"

enum { N = 24 };

static accel_tensor *leaf(float base) {
    float v[N];
    for (int i = 0; i < N; i++) v[i] = base + 0.25f * (float)i;
    accel_tensor *t = accel_from_floats(ACCEL_SHAPE(4, 6), v);
    CHECK(t && accel_requires_grad_(t, true) == ACCEL_OK);
    return t;
}

static bool grad_is(const accel_tensor *t, const float *want) {
    float got[N];
    return t->grad && accel_numel(t->grad) == N && accel_to_floats(t->grad, got) == ACCEL_OK &&
           !memcmp(got, want, sizeof got);
}

static void host(const accel_tensor *t, float *out) { CHECK(accel_to_floats(t, out) == ACCEL_OK); }

/* x used by a mul recorded before a reshape of it: the reshape's backward
 * runs first and x takes y's gradient; the mul then adds into that buffer. */
static void test_reshape_then_more(void) {
    accel_tensor *x = leaf(1), *c1 = leaf(-2), *c2 = leaf(0.5f);
    CHECK(accel_requires_grad_(c1, false) == ACCEL_OK && accel_requires_grad_(c2, false) == ACCEL_OK);
    accel_tensor *m2 = accel_mul(x, c2);
    accel_tensor *y = accel_reshape(x, ACCEL_SHAPE(N));
    accel_tensor *m1 = accel_mul(y, accel_reshape(c1, ACCEL_SHAPE(N)));
    CHECK(accel_backward(accel_add(accel_sum_all(m1), accel_sum_all(m2))) == ACCEL_OK);
    float a[N], b[N], want[N];
    host(c1, a);
    host(c2, b);
    for (int i = 0; i < N; i++) want[i] = a[i] + b[i];
    CHECK_MSG(grad_is(x, want), "x's gradient should be c1 + c2");
    CHECK_MSG(y->grad == NULL, "the reshape's output gradient should have moved to x");
    accel_step_reset();
}

/* h = x + b with x also used before: x or b takes h's gradient, never both. */
static void test_add_one_takes(void) {
    accel_tensor *x = leaf(1), *b = leaf(3), *c = leaf(-1), *d = leaf(2);
    CHECK(accel_requires_grad_(c, false) == ACCEL_OK && accel_requires_grad_(d, false) == ACCEL_OK);
    accel_tensor *xd = accel_mul(x, d);
    accel_tensor *h = accel_add(x, b);
    CHECK(accel_backward(accel_add(accel_sum_all(accel_mul(h, c)), accel_sum_all(xd))) == ACCEL_OK);
    float cv[N], dv[N], want[N];
    host(c, cv);
    host(d, dv);
    for (int i = 0; i < N; i++) want[i] = cv[i] + dv[i];
    CHECK_MSG(grad_is(x, want), "x's gradient should be c + d");
    CHECK_MSG(grad_is(b, cv), "b's gradient should be c (x's later add must not show in it)");
    CHECK(x->grad && b->grad && x->grad->data != b->grad->data);
    CHECK_MSG(h->grad == NULL, "the add's output gradient should have moved to an input");
    accel_step_reset();
}

/* x + x: the second half adds into the buffer the first took. */
static void test_add_same_input(void) {
    accel_tensor *x = leaf(1), *c = leaf(-1);
    CHECK(accel_requires_grad_(c, false) == ACCEL_OK);
    CHECK(accel_backward(accel_sum_all(accel_mul(accel_add(x, x), c))) == ACCEL_OK);
    float cv[N], want[N];
    host(c, cv);
    for (int i = 0; i < N; i++) want[i] = 2 * cv[i];
    CHECK(grad_is(x, want));
    accel_step_reset();
}

/* A transpose used again after: the transposed copy is x's, then added into. */
static void test_permute_then_more(void) {
    accel_tensor *x = leaf(1), *c = leaf(-3), *d = leaf(0.75f);
    CHECK(accel_requires_grad_(c, false) == ACCEL_OK && accel_requires_grad_(d, false) == ACCEL_OK);
    accel_tensor *xd = accel_mul(x, d);
    accel_tensor *t = accel_transpose(x, 0, 1); /* [6, 4] */
    accel_tensor *ct = accel_contiguous(accel_transpose(c, 0, 1));
    CHECK(accel_backward(accel_add(accel_sum_all(accel_mul(t, ct)), accel_sum_all(xd))) == ACCEL_OK);
    float cv[N], dv[N], want[N];
    host(c, cv);
    host(d, dv);
    for (int i = 0; i < N; i++) want[i] = cv[i] + dv[i];
    CHECK_MSG(grad_is(x, want), "x's gradient should be c + d");
    CHECK(t->grad && x->grad && t->grad->data != x->grad->data);
    accel_step_reset();
}

/* A parameter's gradient stays its persistent one (a step reset frees the
 * arena: the values must survive it). */
static void test_persistent_leaf(void) {
    accel_tensor *w = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(4, 6), ACCEL_CPU_DEVICE);
    CHECK(w && accel_fill_(w, 1.5) == ACCEL_OK && accel_requires_grad_(w, true) == ACCEL_OK);
    accel_tensor *c = leaf(-1);
    CHECK(accel_requires_grad_(c, false) == ACCEL_OK);
    CHECK(accel_backward(accel_sum_all(accel_mul(accel_reshape(w, ACCEL_SHAPE(N)), accel_reshape(c, ACCEL_SHAPE(N))))) ==
          ACCEL_OK);
    float want[N];
    host(c, want);
    accel_step_reset();
    CHECK(w->grad && !(w->grad->flags & ACCEL_TF_ARENA) && grad_is(w, want));
    accel_tensor_free(w);
}

int main(void) {
    RUN(test_reshape_then_more);
    RUN(test_add_one_takes);
    RUN(test_add_same_input);
    RUN(test_permute_then_more);
    RUN(test_persistent_leaf);
    accel_thread_cleanup();
    return check_summary();
}
