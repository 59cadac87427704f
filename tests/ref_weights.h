/* The weights of the tests that train a model under the Accelerator beside a
 * reference trained by hand (DDP by hand: tests/test_accelerator_zero.c,
 * test_accelerator_zero3.c, test_accelerator_moe.c): how far apart two
 * models' parameters are, the reference's bf16 view of its f32 weights, and
 * DDP by hand's backward and gradient average. Header-only; include after
 * check.h. */
#ifndef ACCEL_TESTS_REF_WEIGHTS_H
#define ACCEL_TESTS_REF_WEIGHTS_H

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"
#include "accel/dist.h"

/* The largest relative difference between a's and b's f32 parameters, in
 * order (relative to |b|, or to 1e-2 where |b| is smaller). */
static inline double rel_diff(accel_module *a, accel_module *b) {
    accel_tensor **pa, **pb;
    int n = accel_module_parameters(a, &pa);
    CHECK(accel_module_parameters(b, &pb) == n);
    double d = 0;
    for (int i = 0; i < n; i++)
        for (int64_t k = 0; k < accel_numel(pa[i]); k++) {
            double u = ((float *)pa[i]->data)[k], v = ((float *)pb[i]->data)[k];
            double e = fabs(u - v) / (fabs(v) > 1e-2 ? fabs(v) : 1e-2);
            d = e > d ? e : d;
        }
    accel_free(pa);
    accel_free(pb);
    return d;
}

/* Rounds m's f32 weights to bf16 values in place (what a bf16 gather or
 * autocast lets forward and backward see) and returns the masters, which
 * restore_weights puts back (and frees) before the optimizer step. */
static inline float *round_weights_bf16(accel_module *m) {
    accel_tensor **ps;
    int n = accel_module_parameters(m, &ps);
    int64_t total = 0, at = 0;
    for (int i = 0; i < n; i++) total += accel_numel(ps[i]);
    float *masters = malloc((size_t)total * sizeof(float));
    CHECK(masters != NULL);
    for (int i = 0; masters && i < n; i++) {
        float *w = ps[i]->data;
        for (int64_t k = 0; k < accel_numel(ps[i]); k++, at++) {
            masters[at] = w[k];
            w[k] = accel_bf16_to_f32(accel_f32_to_bf16(w[k]));
        }
    }
    accel_free(ps);
    return masters;
}

static inline void restore_weights(accel_module *m, float *masters) {
    accel_tensor **ps;
    int n = accel_module_parameters(m, &ps);
    int64_t at = 0;
    for (int i = 0; masters && i < n; i++) {
        memcpy(ps[i]->data, masters + at, (size_t)accel_numel(ps[i]) * sizeof(float));
        at += accel_numel(ps[i]);
    }
    accel_free(ps);
    free(masters);
}

/* The loss of micro-batch `micro` of step `step` on m (ctx: the test's). */
typedef accel_tensor *(*ref_loss_fn)(accel_module *m, int64_t step, int micro, void *ctx);

/* DDP by hand's backward of one step: each of `accum` micro-batches' loss
 * (divided by accum) backward, under bf16 autocast where bf16, with m's
 * weights rounded to bf16 meanwhile where round16 (what a bf16 gather lets
 * forward and backward see); the last micro-batch's loss. */
static inline double ref_backward(accel_module *m, int accum, bool bf16, bool round16, int64_t step, ref_loss_fn loss_of,
                                  void *ctx) {
    float *masters = round16 ? round_weights_bf16(m) : NULL;
    double l = NAN;
    for (int k = 0; k < accum; k++) {
        accel_dtype prev = bf16 ? accel_autocast_begin(ACCEL_BF16) : ACCEL_F32;
        accel_tensor *loss = loss_of(m, step, k, ctx);
        if (bf16) accel_autocast_end(prev);
        l = loss ? accel_item(loss) : NAN;
        CHECK(accel_backward(accum > 1 ? accel_mul_scalar(loss, 1.0 / accum) : loss) == ACCEL_OK);
        accel_step_reset();
    }
    if (masters) restore_weights(m, masters);
    return l;
}

/* DDP by hand's reduction: each of the n gradients averaged over the
 * default group of `world` ranks, tensor by tensor; a parameter without one
 * (an expert no token of this rank chose) joins the average with zeros.
 * false at the first failure (after a failed collective the group is
 * unusable: the caller reports once). */
static inline bool ref_average_grads(int n, accel_tensor **ps, int world) {
    bool ok = true;
    for (int i = 0; ok && i < n; i++) {
        if (!ps[i]->grad)
            ok = accel_grad_accumulate(ps[i], accel_zeros(ACCEL_F32, ps[i]->ndim, ps[i]->shape)) == ACCEL_OK;
        if (ok && world > 1)
            ok = accel_pg_all_reduce(accel_dist_default_group(), ps[i]->grad->data, (size_t)accel_numel(ps[i]),
                                     ACCEL_F32, ACCEL_REDUCE_AVG) == ACCEL_OK;
    }
    return ok;
}

#endif
