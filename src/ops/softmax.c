/* accel_softmax and accel_log_softmax over any dim, computed in f32 with the
 * row maximum subtracted. The tensor is seen as [outer, D, inner] with the
 * reduced dim in the middle. */
#include "nn_internal.h"

static accel_status softmax_backward(accel_node *node, accel_tensor *grad_out) {
    accel_tensor *gt = accel__f32_contig(grad_out);
    if (!gt) return accel_last_status();
    accel__gbuf gx;
    if (!accel__gbuf_begin(&gx, node->inputs[0])) return accel_last_status();
    if (!gx.dst) return ACCEL_OK;
    accel_k_softmax_backward k = {.dx = gx.dst, .g = gt, .y = node->saved[0], .outer = node->iarg[0],
                                  .D = node->iarg[1], .inner = node->iarg[2], .log = node->iarg[3] != 0,
                                  .beta = gx.beta};
    accel_status st = ACCEL_KERNEL("softmax backward", gt->device, softmax_backward, &k);
    return st == ACCEL_OK ? accel__gbuf_end(&gx) : st;
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
    accel_tensor *y = odt == ACCEL_F32 ? out : accel_empty_on(ACCEL_F32, x->ndim, x->shape, dev);
    if (!xf || !y) return NULL;
    accel_k_softmax k = {.y = y, .x = xf, .outer = outer, .D = D, .inner = inner, .log = use_log};
    if (ACCEL_KERNEL(op, dev, softmax, &k) != ACCEL_OK) return NULL;
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
