/* tests/gradcheck.h — finite-difference gradient checker for the op tests.
 *
 * Usage:
 *
 *     // Builds a scalar (one-element) loss from the inputs. Called many times:
 *     // once with grad on (analytic gradients via accel_backward), then twice
 *     // per input element with grad off (central differences).
 *     static accel_tensor *loss_fn(accel_tensor *const *in, int n, void *ctx) {
 *         return gc_weighted_sum(accel_mul(in[0], in[1]));   // sum(out * fixed weights)
 *     }
 *     ...
 *     accel_tensor *a = gc_randn(1, ACCEL_SHAPE(2, 3));     // persistent f32, requires grad
 *     accel_tensor *b = gc_randn(2, ACCEL_SHAPE(3));
 *     CHECK(gradcheck("mul", loss_fn, NULL, 2, (accel_tensor *[]){a, b}, NULL) == 0);
 *     accel_tensor_free(a);
 *     accel_tensor_free(b);
 *
 * Rules:
 *   - Inputs must be persistent, contiguous f32 (or f64) tensors (accel_tensor_new /
 *     gc_randn / gc_from_floats). Inputs with requires_grad false are held fixed
 *     and not checked (e.g. integer targets, masks).
 *   - gradcheck calls accel_step_reset() before and after every evaluation, so
 *     the loss function must build everything it needs (constants, targets,
 *     weights) inside itself or keep it in persistent tensors passed through ctx.
 *   - Leaf gradients of the inputs are zeroed first and left holding the
 *     analytic gradient afterwards.
 *   - gc_weighted_sum(t) reduces an op's output with fixed, non-uniform weights
 *     (so a wrong index in a backward shows up, which sum() would hide).
 *
 * Returns the number of mismatching elements (0 = pass) and prints the first
 * few as "gradcheck NAME: input i elem j: analytic A vs numeric N". An element
 * passes when |A - N| <= atol + rtol * |N|. The default options (opts NULL or
 * zero fields) suit f32 losses of magnitude ~1-10: eps 1e-3, atol 2e-3, rtol 2e-2.
 * Kinks (relu at 0, max ties) must be avoided by the test's choice of inputs.
 */
#ifndef ACCEL_TESTS_GRADCHECK_H
#define ACCEL_TESTS_GRADCHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "accel/accel.h"

typedef accel_tensor *(*gradcheck_fn)(accel_tensor *const *inputs, int n, void *ctx);

typedef struct gradcheck_opts {
    double eps;  /* finite-difference step (default 1e-3) */
    double atol; /* default 2e-3 */
    double rtol; /* default 2e-2 */
    int max_report; /* mismatches printed (default 5) */
} gradcheck_opts;

/* Inputs live on the default device (accel_default_device()), so that the op
 * tests run unchanged on the hostless test device; elements are read and
 * written through accel_get/accel_set. */

/* A persistent f32 tensor of N(0, 1) values from `seed`, requiring grad. */
static inline accel_tensor *gc_randn(uint64_t seed, int ndim, const int64_t *shape) {
    accel_tensor *t = accel_tensor_new(ACCEL_F32, ndim, shape, accel_default_device());
    if (!t) return NULL;
    accel_rng r;
    accel_rng_init(&r, seed);
    accel_rng_normal_(&r, t, 0.0, 1.0);
    accel_requires_grad_(t, true);
    return t;
}

/* A persistent f32 tensor with the given values, requiring grad. */
static inline accel_tensor *gc_from_floats(int ndim, const int64_t *shape, const float *v) {
    accel_tensor *t = accel_tensor_new(ACCEL_F32, ndim, shape, accel_default_device());
    if (!t) return NULL;
    accel_tensor_from_host(t, v);
    accel_requires_grad_(t, true);
    return t;
}

/* sum(t * w) with w[i] = 0.5 + 0.8*sin(1.7*i + 0.3) (fixed, distinct, non-zero);
 * 0-dim f32 loss. NULL in, NULL out. Works for any dtype (w in t's float dtype). */
static inline accel_tensor *gc_weighted_sum(accel_tensor *t) {
    if (!t) return NULL;
    int64_t n = accel_numel(t);
    float *v = malloc(sizeof(float) * (size_t)(n ? n : 1));
    if (!v) return NULL;
    for (int64_t i = 0; i < n; i++) v[i] = (float)(0.5 + 0.8 * sin(1.7 * (double)i + 0.3));
    accel_tensor *w = accel_empty_on(ACCEL_F32, t->ndim, t->shape, t->device);
    if (w && accel_tensor_from_host(w, v) != ACCEL_OK) w = NULL;
    free(v);
    return accel_sum_all(accel_mul(t, w));
}

/* The index of row-major element i of a contiguous t. */
static inline void gc_index_(const accel_tensor *t, int64_t i, int64_t *idx) {
    for (int d = t->ndim - 1; d >= 0; d--) {
        idx[d] = i % t->shape[d];
        i /= t->shape[d];
    }
}

static inline double gc_elem_(const accel_tensor *t, int64_t i) {
    int64_t idx[ACCEL_MAX_DIMS];
    gc_index_(t, i, idx);
    return accel_get(t, idx);
}

static inline void gc_set_elem_(accel_tensor *t, int64_t i, double v) {
    int64_t idx[ACCEL_MAX_DIMS];
    gc_index_(t, i, idx);
    accel_set(t, idx, v);
}

/* Loss value with grad off; NAN (after printing the error) on failure. */
static inline double gc_eval_(const char *name, gradcheck_fn fn, void *ctx, int n,
                              accel_tensor *const *in) {
    bool prev = accel_set_grad_enabled(false);
    accel_tensor *loss = fn(in, n, ctx);
    double v = NAN;
    if (!loss) fprintf(stderr, "gradcheck %s: loss function failed: %s\n", name, accel_last_error());
    else v = accel_item(loss);
    accel_set_grad_enabled(prev);
    accel_step_reset();
    return v;
}

static inline int gradcheck(const char *name, gradcheck_fn fn, void *ctx, int n,
                            accel_tensor *const *inputs, const gradcheck_opts *opts) {
    double eps = opts && opts->eps > 0 ? opts->eps : 1e-3;
    double atol = opts && opts->atol > 0 ? opts->atol : 2e-3;
    double rtol = opts && opts->rtol > 0 ? opts->rtol : 2e-2;
    int max_report = opts && opts->max_report > 0 ? opts->max_report : 5;

    for (int i = 0; i < n; i++) {
        accel_tensor *t = inputs[i];
        if (!t || (t->flags & ACCEL_TF_ARENA) || !accel_is_contiguous(t) ||
            (t->requires_grad && t->dtype != ACCEL_F32 && t->dtype != ACCEL_F64)) {
            fprintf(stderr, "gradcheck %s: input %d must be a persistent contiguous tensor "
                            "(f32/f64 when it requires grad)\n", name, i);
            return 1;
        }
        if (t->grad) accel_zero_(t->grad);
    }
    accel_clear_error();
    accel_step_reset();

    /* Analytic gradients. */
    accel_tensor *loss = fn(inputs, n, ctx);
    if (!loss || accel_backward(loss) != ACCEL_OK) {
        fprintf(stderr, "gradcheck %s: forward/backward failed: %s\n", name, accel_last_error());
        accel_clear_error();
        accel_step_reset();
        return 1;
    }
    accel_step_reset();

    int bad = 0;
    for (int i = 0; i < n; i++) {
        accel_tensor *t = inputs[i];
        if (!t->requires_grad) continue;
        int64_t ne = accel_numel(t);
        for (int64_t j = 0; j < ne; j++) {
            double a = t->grad ? gc_elem_(t->grad, j) : 0.0;
            double x = gc_elem_(t, j);
            gc_set_elem_(t, j, x + eps);
            double lp = gc_eval_(name, fn, ctx, n, inputs);
            gc_set_elem_(t, j, x - eps);
            double lm = gc_eval_(name, fn, ctx, n, inputs);
            gc_set_elem_(t, j, x);
            /* The perturbation actually applied (x +- eps rounded to f32). */
            double h = t->dtype == ACCEL_F32 ? (double)(float)(x + eps) - (double)(float)(x - eps)
                                             : 2 * eps;
            double num = (lp - lm) / h;
            if (!(fabs(a - num) <= atol + rtol * fabs(num))) {
                if (bad < max_report)
                    fprintf(stderr, "gradcheck %s: input %d elem %lld: analytic %.6g vs numeric %.6g\n",
                            name, i, (long long)j, a, num);
                bad++;
            }
        }
    }
    if (accel_last_status() != ACCEL_OK) {
        fprintf(stderr, "gradcheck %s: error during check: %s\n", name, accel_last_error());
        accel_clear_error();
        bad++;
    }
    return bad;
}

#endif
