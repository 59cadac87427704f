/* What the fused-attention tests share (test_sdpa_padded.c, test_sdpa_packed.c):
 * a double-precision reference attention under a mask the test states, host
 * copies of tensors, and the gradients of a weighted sum of an output. */
#ifndef ACCEL_TESTS_SDPA_REFERENCE_H
#define ACCEL_TESTS_SDPA_REFERENCE_H

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

#include "accel/accel.h"
#include "check.h"
#include "gradcheck.h"
#include "ops_fixture.h"

/* The shapes of a case: q [B, H, Tq, D], k and v [B, Hkv, Tk, D]. */
typedef struct sdpa_dims {
    int64_t B, H, Hkv, Tq, Tk, D;
} sdpa_dims;

/* Whether query i of batch row b, at position qpos (Tk - Tq + i), sees key j. */
typedef bool (*sdpa_sees_fn)(const void *ctx, int64_t b, int64_t i, int64_t qpos, int64_t j);

/* The attention of q, k, v (host floats, shapes d) with each query seeing the
 * keys sees says, in double: o [B, H, Tq, D]; a row that sees no key gives 0
 * (unseen_zero) or the mean of all Tk values. */
static inline void sdpa_reference(sdpa_dims d, const float *q, const float *k, const float *v, sdpa_sees_fn sees,
                                  const void *ctx, bool unseen_zero, float *o) {
    int64_t G = d.H / d.Hkv, D = d.D;
    double *p = malloc(sizeof(double) * (size_t)d.Tk);
    for (int64_t b = 0; b < d.B; b++)
        for (int64_t h = 0; h < d.H; h++)
            for (int64_t i = 0; i < d.Tq; i++) {
                const float *qi = q + ((b * d.H + h) * d.Tq + i) * D;
                const float *kh = k + (b * d.Hkv + h / G) * d.Tk * D, *vh = v + (b * d.Hkv + h / G) * d.Tk * D;
                int64_t qpos = d.Tk - d.Tq + i;
                double m = -INFINITY, s = 0.0;
                for (int64_t j = 0; j < d.Tk; j++) {
                    double dot = 0.0;
                    for (int64_t e = 0; e < D; e++) dot += (double)qi[e] * kh[j * D + e];
                    p[j] = sees(ctx, b, i, qpos, j) ? dot / sqrt((double)D) : -INFINITY;
                    m = fmax(m, p[j]);
                }
                bool none = m == -INFINITY;
                for (int64_t j = 0; j < d.Tk; j++) s += p[j] = none ? 1.0 : exp(p[j] - m);
                float *oi = o + ((b * d.H + h) * d.Tq + i) * D;
                for (int64_t e = 0; e < D; e++) {
                    double acc = 0.0;
                    for (int64_t j = 0; j < d.Tk; j++) acc += p[j] / s * vh[j * D + e];
                    oi[e] = none && unseen_zero ? 0.0f : (float)acc;
                }
            }
    free(p);
}

/* t's elements as host floats (malloc'd: the caller frees). */
static inline float *floats_of(const accel_tensor *t) {
    float *f = malloc(sizeof(float) * (size_t)accel_numel(t));
    accel_to_floats(t, f);
    return f;
}

/* out [0..2]: persistent copies of q, k, v's gradients of gc_weighted_sum(o),
 * their grads zeroed after. */
static inline void grads_of(accel_tensor *o, accel_tensor *const *in, accel_tensor **out) {
    CHECK(o && accel_backward(gc_weighted_sum(o)) == ACCEL_OK);
    for (int i = 0; i < 3; i++) {
        out[i] = in[i]->grad ? accel_tensor_clone_persistent(in[i]->grad, ACCEL_CPU_DEVICE) : NULL;
        if (in[i]->grad) accel_zero_(in[i]->grad);
    }
}

/* o (a fused op's output run just now) against want, then its gradients into
 * g (grads_of) against g_want: the checks labelled what and `of`. */
static inline void sdpa_check_against(const char *what, const char *of, accel_tensor *o, accel_tensor *want,
                                      accel_tensor *const *in, accel_tensor **g, accel_tensor *const *g_want) {
    CHECK_MSG(fx_compare(what, o, want, 1e-5, 1e-6) == 0, "%s: %s", what, of);
    grads_of(o, in, g);
    for (int i = 0; i < 3; i++)
        CHECK_MSG(fx_compare(what, g[i], g_want[i], 1e-4, 1e-5) == 0, "%s: %s, grad %d", what, of, i);
}

static inline void free3(accel_tensor **t) {
    for (int i = 0; i < 3; i++) accel_tensor_free(t[i]);
}

#endif
