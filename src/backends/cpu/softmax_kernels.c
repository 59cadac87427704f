/* Softmax and log-softmax over the middle dim of [outer, D, inner], in f32
 * with the row maximum subtracted, and their backward. */
#include <math.h>

#include "cpu_kernels.h"

/* One line of D elements at stride `inc`. */
static void softmax_line(const float *x, float *y, int64_t D, int64_t inc, bool use_log, bool ref) {
    if (ref) {
        double m = -INFINITY, s = 0.0;
        for (int64_t j = 0; j < D; j++) m = fmax(m, x[j * inc]);
        for (int64_t j = 0; j < D; j++) s += exp((double)x[j * inc] - m);
        for (int64_t j = 0; j < D; j++)
            y[j * inc] = use_log ? (float)((double)x[j * inc] - m - log(s)) : (float)(exp((double)x[j * inc] - m) / s);
        return;
    }
    float m = -INFINITY, s = 0.0f;
    for (int64_t j = 0; j < D; j++) m = fmaxf(m, x[j * inc]);
    if (use_log) {
        for (int64_t j = 0; j < D; j++) s += expf(x[j * inc] - m);
        float lse = m + logf(s);
        for (int64_t j = 0; j < D; j++) y[j * inc] = x[j * inc] - lse;
    } else {
        for (int64_t j = 0; j < D; j++) {
            float e = expf(x[j * inc] - m);
            y[j * inc] = e;
            s += e;
        }
        float inv = 1.0f / s;
        for (int64_t j = 0; j < D; j++) y[j * inc] *= inv;
    }
}

accel_status accel__cpuk_softmax(accel_k_softmax *k) {
    int64_t outer = k->outer, D = k->D, inner = k->inner;
    const float *xp = k->x->data;
    float *yp = k->y->data;
    bool ref = accel_reference_kernels(), use_log = k->log;
#pragma omp parallel for if (!ref && outer * D * inner > 16384) schedule(static)
    for (int64_t l = 0; l < outer * inner; l++) {
        int64_t base = (l / inner) * D * inner + l % inner;
        softmax_line(xp + base, yp + base, D, inner, use_log, ref);
    }
    return ACCEL_OK;
}

accel_status accel__cpuk_softmax_backward(accel_k_softmax_backward *k) {
    int64_t outer = k->outer, D = k->D, inner = k->inner;
    bool use_log = k->log;
    const float *y = k->y->data, *g = k->g->data;
    float *dx = k->dx->data, beta = k->beta;
#pragma omp parallel for if (outer * D * inner > 16384) schedule(static)
    for (int64_t l = 0; l < outer * inner; l++) {
        int64_t base = (l / inner) * D * inner + l % inner;
        const float *yl = y + base, *gl = g + base;
        float *dl = dx + base;
        float s = 0.0f;
        /* softmax: dx = y (g - sum(g y));  log_softmax: dx = g - exp(y) sum(g) */
        for (int64_t j = 0; j < D; j++) s += use_log ? gl[j * inner] : gl[j * inner] * yl[j * inner];
        for (int64_t j = 0; j < D; j++) {
            int64_t o = j * inner;
            float v = use_log ? gl[o] - expf(yl[o]) * s : yl[o] * (gl[o] - s);
            dl[o] = beta == 0.0f ? v : dl[o] + v;
        }
    }
    return ACCEL_OK;
}
