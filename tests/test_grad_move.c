/* First gradients taken over instead of copied (accel__grad_move,
 * src/core/core_internal.h): reshape, contiguous and alias pass their
 * output's gradient to their input, add to one of its inputs, permute its
 * transposed copy, a unary op its f32 result.
 *   - the input's gradient is the output's buffer itself, and the output's
 *     gradient is dropped (NULL), so no later accumulation into the input can
 *     show through it;
 *   - an input used again (its other use's gradient added later into the
 *     taken buffer) gets the exact sum;
 *   - add's second input holds the buffer its first took (no copy); a later
 *     addition into either holder's gradient goes to fresh memory, never
 *     showing in the other's, and once a holder's node has read it the
 *     other holds it alone (added into in place);
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

/* h = x + b and nothing else: both inputs hold h's gradient, one buffer. */
static void test_add_both_hold(void) {
    accel_tensor *x = leaf(1), *b = leaf(3), *c = leaf(-1);
    CHECK(accel_requires_grad_(c, false) == ACCEL_OK);
    CHECK(accel_backward(accel_sum_all(accel_mul(accel_add(x, b), c))) == ACCEL_OK);
    float cv[N];
    host(c, cv);
    CHECK(grad_is(x, cv) && grad_is(b, cv));
    CHECK_MSG(x->grad == b->grad, "b should hold the gradient x took, not a copy");
    accel_step_reset();
}

/* A residual block: x = p * c0, y = x * c1, e = x * c3 recorded after y,
 * h = x + branch with branch y (or, reshaped, its reshape, recorded after
 * e). x and the branch hold h's gradient g. y: e's backward adds into x's
 * (fresh memory: the branch still reads g), then y's node reads g, adds its
 * part into x's and drops its gradient. Reshaped: the reshape's backward
 * reads g and must copy it into y's, not hand its elements over (x, then
 * g's one holder, adds e's part into them in place before y's node reads
 * its gradient). The exact float sums either way. */
static void residual_case(bool reshaped) {
    accel_tensor *p = leaf(0.5f), *c0 = leaf(-2), *c1 = leaf(0.75f), *c2 = leaf(1.5f), *c3 = leaf(-0.25f);
    accel_tensor *consts[] = {c0, c1, c2, c3};
    for (int i = 0; i < 4; i++) CHECK(accel_requires_grad_(consts[i], false) == ACCEL_OK);
    accel_tensor *x = accel_mul(p, c0);
    accel_tensor *y = accel_mul(x, c1);
    accel_tensor *e = accel_mul(x, c3);
    accel_tensor *branch = reshaped ? accel_reshape(y, ACCEL_SHAPE(4, 6)) : y;
    CHECK(branch && branch->grad_fn);
    accel_tensor *h = accel_add(x, branch);
    CHECK(accel_backward(accel_add(accel_sum_all(accel_mul(h, c2)), accel_sum_all(e))) == ACCEL_OK);
    float v0[N], v1[N], v2[N], v3[N], want[N];
    host(c0, v0);
    host(c1, v1);
    host(c2, v2);
    host(c3, v3);
    for (int i = 0; i < N; i++) {
        float gx = v2[i] + v3[i]; /* e's part into x's gradient */
        gx += v2[i] * v1[i];      /* then y's */
        want[i] = gx * v0[i];
    }
    CHECK_MSG(grad_is(p, want), "p's gradient should be (c2 + c3 + c2 c1) c0");
    CHECK_MSG(branch->grad == NULL, "the branch's gradient, read, should be dropped");
    accel_step_reset();
}

static void test_residual_shared(void) { residual_case(false); }

static void test_shared_not_passed_on(void) { residual_case(true); }

/* x used by a matmul recorded before h = x + b: the matmul's backward, whose
 * GEMM would add into x's gradient in place (beta 1), must stage it while b
 * holds that gradient too. Values exact in float whatever the order. */
static void test_add_then_gemm(void) {
    accel_tensor *x = leaf(1), *b = leaf(3), *c = leaf(-1);
    float wv[18];
    for (int i = 0; i < 18; i++) wv[i] = 0.5f * (float)(i % 5) - 1;
    accel_tensor *w = accel_from_floats(ACCEL_SHAPE(6, 3), wv);
    CHECK(w && accel_requires_grad_(c, false) == ACCEL_OK);
    accel_tensor *m = accel_matmul(x, w);
    accel_tensor *h = accel_add(x, b);
    CHECK(accel_backward(accel_add(accel_sum_all(accel_mul(h, c)), accel_sum_all(m))) == ACCEL_OK);
    float cv[N], want[N];
    host(c, cv);
    for (int i = 0; i < N; i++) want[i] = cv[i] + wv[(i % 6) * 3] + wv[(i % 6) * 3 + 1] + wv[(i % 6) * 3 + 2];
    CHECK_MSG(grad_is(b, cv), "b's gradient should be c (the GEMM's part must not show in it)");
    CHECK_MSG(grad_is(x, want), "x's gradient should be c + the row sums of w");
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
    RUN(test_add_both_hold);
    RUN(test_residual_shared);
    RUN(test_shared_not_passed_on);
    RUN(test_add_then_gemm);
    RUN(test_add_same_input);
    RUN(test_permute_then_more);
    RUN(test_persistent_leaf);
    accel_thread_cleanup();
    return check_summary();
}
