/* accel_softmax and accel_log_softmax over any dim, computed in f32 with the
 * row maximum subtracted. The tensor is seen as [outer, D, inner] with the
 * reduced dim in the middle. */
#include <math.h>

#include "nn_internal.h"

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

static accel_status softmax_backward(accel_node *node, accel_tensor *grad_out) {
    int64_t outer = node->iarg[0], D = node->iarg[1], inner = node->iarg[2];
    bool use_log = node->iarg[3] != 0;
    const float *y = node->saved[0]->data;
    accel_tensor *gt = accel__f32_contig(grad_out);
    if (!gt) return accel_last_status();
    const float *g = gt->data;
    accel__gbuf gx;
    if (!accel__gbuf_begin(&gx, node->inputs[0])) return accel_last_status();
    if (!gx.p) return ACCEL_OK;
    float *dx = gx.p;
    float beta = gx.beta;
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
    return accel__gbuf_end(&gx);
}

static accel_tensor *softmax_op(const char *op, accel_tensor *x, int dim, bool use_log) {
    accel_tensor *in[1] = {x};
    accel_device dev;
    if (!accel__op_begin(op, 1, in, &dev) || !accel__op_check_float(op, x, "x")) return NULL;
    int d;
    if (!accel__norm_dim(op, dim, x->ndim, &d)) return NULL;
    accel_dtype odt = accel_autocast_dtype() != ACCEL_F32 ? ACCEL_F32 : x->dtype;
    accel_tensor *out = accel__op_out(odt, x->ndim, x->shape, dev);
    if (!out || dev.type == ACCEL_DEV_META) return out;
    int64_t D = x->ndim ? x->shape[d] : 1;
    int64_t outer = accel__prod(x->shape, 0, d), inner = x->ndim ? accel__prod(x->shape, d + 1, x->ndim) : 1;
    accel_tensor *xf = accel__f32_contig(x);
    accel_tensor *y = odt == ACCEL_F32 ? out : accel_empty(ACCEL_F32, x->ndim, x->shape);
    if (!xf || !y) return NULL;
    const float *xp = xf->data;
    float *yp = y->data;
    bool ref = accel_reference_kernels();
#pragma omp parallel for if (!ref && outer * D * inner > 16384) schedule(static)
    for (int64_t l = 0; l < outer * inner; l++) {
        int64_t base = (l / inner) * D * inner + l % inner;
        softmax_line(xp + base, yp + base, D, inner, use_log, ref);
    }
    if (y != out && accel_copy_(out, y) != ACCEL_OK) return NULL;
    accel_node *n = accel_tape_record(use_log ? "log_softmax" : "softmax", softmax_backward, out, 1, in);
    if (n) {
        n->saved[0] = y;
        n->iarg[0] = outer;
        n->iarg[1] = D;
        n->iarg[2] = inner;
        n->iarg[3] = use_log;
    }
    return out;
}

accel_tensor *accel_softmax(accel_tensor *x, int dim) { return softmax_op("accel_softmax", x, dim, false); }

accel_tensor *accel_log_softmax(accel_tensor *x, int dim) {
    return softmax_op("accel_log_softmax", x, dim, true);
}
