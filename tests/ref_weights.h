/* The weights of the tests that train a model under the Accelerator beside a
 * reference trained by hand (DDP by hand: tests/test_accelerator_zero.c,
 * test_accelerator_zero3.c, test_accelerator_moe.c): how far apart two
 * models' parameters are, and the reference's bf16 view of its f32 weights.
 * Header-only; include after check.h. */
#ifndef ACCEL_TESTS_REF_WEIGHTS_H
#define ACCEL_TESTS_REF_WEIGHTS_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"

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

#endif
