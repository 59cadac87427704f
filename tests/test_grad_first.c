/* Where a tensor's first gradient lives (accel__grad_first_is_step,
 * src/core/core_internal.h): one rule through every backward that gives it
 * one - accel_grad_accumulate (mul), accel__grad_move (reshape, add), the
 * gradient buffers written in place (softmax: accel__gbuf_begin; swiglu on
 * bf16: accel__gbuf_begin_native), the fused cross-entropy's hand-over and
 * an activation checkpoint's recompute.
 *   - a parameter's is persistent (it must survive the step's reset);
 *   - a non-leaf's, and an arena leaf's (requires_grad set by hand on a step
 *     tensor an op made under no_grad), is step memory;
 *   - a non-leaf whose requires_grad was turned off after the forward gets
 *     none, and nothing flows through it to the parameter below (the fused
 *     cross-entropy once gave it one, and so the parameter a gradient, where
 *     every other backward gave neither);
 * each with the values the parameter gets. */
#include "accel/accel.h"
#include "check.h"

enum { R = 4, C = 6, N = R * C };

typedef enum { PARAM, NON_LEAF, ARENA_LEAF, NON_LEAF_OFF, KINDS } kind;
static const char *const kind_name[KINDS] = {"parameter", "non-leaf", "arena leaf", "non-leaf turned off"};

static accel_tensor *values(float base) {
    float v[N];
    for (int i = 0; i < N; i++) v[i] = base + 0.125f * (float)((i * 7) % N);
    return accel_from_floats(ACCEL_SHAPE(R, C), v);
}

/* x [R, C] of dtype dt and kind k; *param: the parameter it is (PARAM) or
 * is made from (the non-leaves), NULL for an arena leaf. */
static accel_tensor *make_x(kind k, accel_dtype dt, accel_tensor **param) {
    *param = NULL;
    if (k == ARENA_LEAF) {
        bool prev = accel_set_grad_enabled(false);
        accel_tensor *x = accel_to_dtype(accel_mul_scalar(values(-1), 1.0), dt);
        accel_set_grad_enabled(prev);
        CHECK(x && !x->grad_fn && accel_requires_grad_(x, true) == ACCEL_OK);
        return x;
    }
    accel_tensor *p = accel_tensor_new(dt, ACCEL_SHAPE(R, C), ACCEL_CPU_DEVICE);
    CHECK(p && accel_copy_(p, values(-1)) == ACCEL_OK && accel_requires_grad_(p, true) == ACCEL_OK);
    *param = p;
    if (k == PARAM) return p;
    accel_tensor *x = accel_mul_scalar(p, 1.0);
    CHECK(x && x->grad_fn);
    return x;
}

typedef accel_tensor *(*consumer_fn)(accel_tensor *x);

static accel_tensor *weighted(accel_tensor *y) { return accel_sum_all(accel_mul(y, values(0.5f))); }

static accel_tensor *by_mul(accel_tensor *x) { return weighted(x); }

static accel_tensor *by_reshape(accel_tensor *x) {
    return accel_sum_all(accel_mul(accel_reshape(x, ACCEL_SHAPE(N)), accel_reshape(values(0.5f), ACCEL_SHAPE(N))));
}

static accel_tensor *by_add(accel_tensor *x) { return weighted(accel_add(x, values(2))); }

static accel_tensor *by_softmax(accel_tensor *x) { return weighted(accel_softmax(x, -1)); }

static accel_tensor *by_swiglu(accel_tensor *x) {
    return weighted(accel_to_dtype(accel_swiglu(x, accel_to_dtype(values(0.25f), x->dtype)), ACCEL_F32));
}

static accel_tensor *by_cross_entropy(accel_tensor *x) {
    return accel_cross_entropy(x, accel_from_data(ACCEL_I64, ACCEL_SHAPE(R), (int64_t[]){3, 0, 5, 1}), -100);
}

static accel_tensor *mul_ctx(void *ctx, accel_tensor *x) { return accel_mul(x, ctx); }

static accel_tensor *by_checkpoint(accel_tensor *x) {
    return accel_sum_all(accel_activation_checkpoint(mul_ctx, values(0.5f), x, 0, NULL));
}

/* A checkpoint whose x stopped requiring grad after the forward (and that
 * has no parameters) records nothing in its recompute: its backward hands
 * nothing back (it failed with "does not require grad and has no grad_fn"). */
static const struct {
    const char *name;
    consumer_fn fn;
    accel_dtype dt;
} consumers[] = {
    {"mul", by_mul, ACCEL_F32},
    {"reshape", by_reshape, ACCEL_F32},
    {"add", by_add, ACCEL_F32},
    {"softmax", by_softmax, ACCEL_F32},
    {"swiglu", by_swiglu, ACCEL_BF16},
    {"cross_entropy", by_cross_entropy, ACCEL_F32},
    {"checkpoint", by_checkpoint, ACCEL_F32},
};

/* One backward through consumer c from an x of kind k; want: the
 * parameter's gradient (filled by the PARAM run, checked against after). */
static void run(int c, kind k, float *want) {
    const char *op = consumers[c].name, *kn = kind_name[k];
    accel_tensor *p, *x = make_x(k, consumers[c].dt, &p);
    accel_tensor *loss = consumers[c].fn(x);
    CHECK_MSG(loss, "%s: %s", op, accel_last_error());
    if (k == NON_LEAF_OFF) CHECK(accel_requires_grad_(x, false) == ACCEL_OK);
    CHECK_MSG(accel_backward(loss) == ACCEL_OK, "%s: %s", op, accel_last_error());
    if (k == NON_LEAF_OFF) {
        CHECK_MSG(!x->grad, "%s: a tensor that does not require grad got a gradient", op);
        CHECK_MSG(!p->grad, "%s: a gradient flowed through a tensor that does not require grad", op);
    } else {
        bool step = k != PARAM;
        CHECK_MSG(x->grad && !!(x->grad->flags & ACCEL_TF_ARENA) == step, "%s, %s: the first gradient should be %s",
                  op, kn, step ? "step memory" : "persistent");
        float got[N] = {0};
        CHECK(x->grad && accel_to_floats(x->grad, got) == ACCEL_OK);
        if (k == PARAM) memcpy(want, got, sizeof got);
        for (int i = 0; i < N; i++)
            CHECK_MSG(got[i] == want[i], "%s, %s: element %d %g, not %g", op, kn, i, got[i], want[i]);
        if (p && k != PARAM)
            CHECK_MSG(p->grad && !(p->grad->flags & ACCEL_TF_ARENA), "%s: the parameter's gradient", op);
    }
    accel_step_reset();
    if (p) accel_tensor_free(p);
}

static void test_first_gradient_rule(void) {
    for (int c = 0; c < (int)(sizeof consumers / sizeof consumers[0]); c++) {
        float want[N] = {0};
        for (kind k = PARAM; k < KINDS; k++) run(c, k, want);
    }
}

int main(void) {
    RUN(test_first_gradient_rule);
    accel_thread_cleanup();
    return check_summary();
}
