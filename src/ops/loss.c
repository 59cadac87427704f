/* accel_cross_entropy (mean over targets != ignore_index) and accel_mse_loss.
 * Both compute in f32 and return a 0-dim f32 tensor. */
#include "nn_internal.h"

/* ------------------------------------------------------------------ cross_entropy */

static accel_status ce_backward(accel_node *node, accel_tensor *grad_out) {
    accel__gbuf gx;
    if (!accel__gbuf_begin(&gx, node->inputs[0])) return accel_last_status();
    if (!gx.dst) return ACCEL_OK;
    accel_tensor *g = accel__f32_contig(grad_out);
    if (!g) return accel_last_status();
    accel_k_cross_entropy_backward k = {.dx = gx.dst, .g = g, .x = node->saved[0], .lse = node->saved[1],
                                        .targets = node->saved[2], .count = node->saved[3], .N = node->iarg[0],
                                        .C = node->iarg[1], .ignore = node->iarg[2], .beta = gx.beta};
    accel_status st = ACCEL_KERNEL("cross_entropy backward", g->device, cross_entropy_backward, &k);
    return st == ACCEL_OK ? accel__gbuf_end(&gx) : st;
}

/* The fused forward saved the gradient for g = 1: with that g (the loss's
 * own backward) it becomes the logits' gradient as it is, else its scaled
 * form does (gradient accumulation, a loss scale, context parallelism's
 * loss share: ce_scaled_grad): one logits-sized buffer, not a second for
 * the accumulation.
 * g is known to be 1 when it is accel_backward's seed; else it is read only
 * where reading it is free (host memory): on a device a read would wait for
 * the stream at every step, so g is multiplied in there. */
static bool grad_is_one(const accel_node *node, accel_tensor *g) {
    if (accel__grad_is_implicit_one(node->out)) return true;
    return accel__device_host_addressable(g->device) && accel_item(g) == 1.0;
}

/* Runs cross_entropy_fused: out, count, dx of x [N, C] and targets tt [N]
 * (nci: N, C, ignore_index), dx times g when g is given. */
static accel_status ce_fused_run(accel_tensor *out, accel_tensor *count, accel_tensor *dx, accel_tensor *x,
                                 accel_tensor *tt, accel_tensor *g, const int64_t *nci) {
    accel_k_cross_entropy_fused k = {.out = out, .count = count, .dx = dx, .x = x, .targets = tt, .g = g,
                                     .N = nci[0], .C = nci[1], .ignore = nci[2]};
    return ACCEL_KERNEL("accel_cross_entropy", out->device, cross_entropy_fused, &k);
}

/* The gradient for g != 1. An f32 dx: its copy times g. A 16-bit one was
 * rounded for g = 1, and scaled after that it would be rounded twice: f32
 * logits (transformers' logits.float()) get the f32 gradient times g rounded
 * once (the cast's backward), so the kernel runs again with g, into dx (the
 * node's own, read no more), the same f32 rows scaled before the rounding.
 * Its loss and count are new tensors: the forward's loss is the caller's. */
static accel_tensor *ce_scaled_grad(accel_node *node, accel_tensor *g) {
    accel_tensor *dx = node->saved[0];
    if (dx->dtype == ACCEL_F32) return accel_mul(dx, g);
    accel_device dev = dx->device;
    accel_tensor *gf = accel__f32_contig(g);
    accel_tensor *out = accel_empty_on(ACCEL_F32, 0, NULL, dev), *count = accel_empty_on(ACCEL_I64, 0, NULL, dev);
    if (!gf || !out || !count) return NULL;
    return ce_fused_run(out, count, dx, node->saved[1], node->saved[2], gf, node->iarg) == ACCEL_OK ? dx : NULL;
}

static accel_status ce_fused_backward(accel_node *node, accel_tensor *grad_out) {
    accel_tensor *x = node->inputs[0], *dx = node->saved[0];
    if (!grad_is_one(node, grad_out) && !(dx = ce_scaled_grad(node, grad_out))) return accel_last_status();
    if (x->dtype == dx->dtype && accel__grad_first_is_step(x)) {
        x->grad = dx;
        return ACCEL_OK;
    }
    return accel_grad_accumulate(x, dx);
}

/* Loss and gradient in one pass over the logits (f32 or bf16: bf16 has f32's
 * range, so the gradient rounded before it is scaled by a loss scale cannot
 * underflow; f16 logits take the two kernels). The reference kernels take
 * the two kernels too: they are this kernel's reference. */
static bool ce_fuses(accel_tensor *logits, accel_device dev) {
    if (accel_reference_kernels() || !accel_needs_grad(1, &logits)) return false;
    if (logits->dtype != ACCEL_F32 && logits->dtype != ACCEL_BF16) return false;
    const accel_kernel_table *kt = accel__kernel_table_of(dev, "accel_cross_entropy");
    return kt && kt->cross_entropy_fused;
}

/* in: logits, targets; tt the targets as [N] i64. */
static accel_tensor *ce_fused(accel_tensor *const *in, accel_tensor *tt, accel_tensor *out, int64_t N, int64_t C,
                              int64_t ignore_index) {
    accel_tensor *logits = in[0];
    accel_device dev = out->device;
    accel_tensor *xc = accel__contig(logits);
    accel_tensor *dx = accel_empty_on(logits->dtype, logits->ndim, logits->shape, dev);
    accel_tensor *count = accel_empty_on(ACCEL_I64, 0, NULL, dev);
    if (!xc || !dx || !count) return NULL;
    const int64_t nci[3] = {N, C, ignore_index};
    if (ce_fused_run(out, count, dx, xc, tt, NULL, nci) != ACCEL_OK) return NULL;
    accel_node *n = accel_tape_record("cross_entropy", ce_fused_backward, out, 2, in);
    if (n) {
        n->saved[0] = dx;
        n->saved[1] = xc;
        n->saved[2] = tt;
        n->iarg[0] = N;
        n->iarg[1] = C;
        n->iarg[2] = ignore_index;
    }
    return out;
}

/* Targets of the logits' shape less the class dim (PyTorch's rule), or the
 * same N targets flat: [4, 1] for logits [4, 3] has the right count but is
 * neither, and is refused as PyTorch refuses it. */
static bool targets_fit(const accel_tensor *logits, const accel_tensor *targets, int64_t N) {
    if (targets->ndim == 1 && targets->shape[0] == N) return true;
    if (targets->ndim != logits->ndim - 1) return false;
    for (int i = 0; i < targets->ndim; i++)
        if (targets->shape[i] != logits->shape[i]) return false;
    return true;
}

accel_tensor *accel_cross_entropy(accel_tensor *logits, accel_tensor *targets, int64_t ignore_index) {
    static const char *OP = "accel_cross_entropy";
    accel_tensor *in[2] = {logits, targets};
    accel_device dev;
    if (!accel__op_begin(OP, 2, in, &dev) || !accel__op_check_float(OP, logits, "logits")) return NULL;
    if (targets->dtype != ACCEL_I64 && targets->dtype != ACCEL_I32) {
        accel_set_error(ACCEL_ERR_DTYPE, "%s: targets must be int64 or int32, got %s", OP,
                        accel_dtype_name(targets->dtype));
        return NULL;
    }
    int64_t C = logits->ndim ? logits->shape[logits->ndim - 1] : 0;
    int64_t N = C ? accel_numel(logits) / C : 0;
    if (logits->ndim < 1 || C == 0 || !targets_fit(logits, targets, N)) {
        accel__shape_error2(OP, logits, targets,
                            "do not fit (logits [..., C]; targets of the logits' shape without C, or [N] flat)");
        return NULL;
    }
    accel_tensor *out = accel__op_out(ACCEL_F32, 0, NULL, dev);
    if (!out || dev.type == ACCEL_DEV_META) return out;
    accel_tensor *tt = accel_empty_on(ACCEL_I64, ACCEL_SHAPE(N), dev);
    if (!tt || accel_copy_(tt, accel_reshape(targets, 1, &N)) != ACCEL_OK) return NULL;
    if (ce_fuses(logits, dev)) return ce_fused(in, tt, out, N, C, ignore_index);
    accel_tensor *xf = accel__f32_contig(logits);
    accel_tensor *lse = accel_empty_on(ACCEL_F32, ACCEL_SHAPE(N), dev);
    accel_tensor *count = accel_empty_on(ACCEL_I64, 0, NULL, dev);
    if (!xf || !lse || !count) return NULL;
    accel_k_cross_entropy k = {.out = out, .lse = lse, .count = count, .x = xf, .targets = tt, .N = N, .C = C,
                               .ignore = ignore_index};
    if (ACCEL_KERNEL(OP, dev, cross_entropy, &k) != ACCEL_OK) return NULL;
    accel_node *n = accel_tape_record("cross_entropy", ce_backward, out, 2, in);
    if (n) {
        n->saved[0] = xf;
        n->saved[1] = lse;
        n->saved[2] = tt;
        n->saved[3] = count;
        n->iarg[0] = N;
        n->iarg[1] = C;
        n->iarg[2] = ignore_index;
    }
    return out;
}

/* ------------------------------------------------------------------ mse_loss */

static accel_status mse_backward(accel_node *node, accel_tensor *grad_out) {
    accel_tensor *g = accel__f32_contig(grad_out);
    if (!g) return accel_last_status();
    for (int k = 0; k < 2; k++) {
        accel__gbuf gb;
        if (!accel__gbuf_begin(&gb, node->inputs[k])) return accel_last_status();
        if (!gb.dst) continue;
        accel_k_mse_backward kb = {.d = gb.dst, .g = g, .pred = node->saved[0], .target = node->saved[1],
                                   .sign = k == 0 ? 1.0f : -1.0f, .beta = gb.beta};
        accel_status st = ACCEL_KERNEL("mse_loss backward", g->device, mse_backward, &kb);
        if (st == ACCEL_OK) st = accel__gbuf_end(&gb);
        if (st != ACCEL_OK) return st;
    }
    return ACCEL_OK;
}

accel_tensor *accel_mse_loss(accel_tensor *pred, accel_tensor *target) {
    static const char *OP = "accel_mse_loss";
    accel_tensor *in[2] = {pred, target};
    accel_device dev;
    if (!accel__op_begin(OP, 2, in, &dev) || !accel__op_check_float(OP, pred, "pred") ||
        !accel__op_check_float(OP, target, "target"))
        return NULL;
    if (!accel_same_shape(pred, target)) {
        accel__shape_error2(OP, pred, target, "differ (mse_loss needs equal shapes)");
        return NULL;
    }
    accel_tensor *out = accel__op_out(ACCEL_F32, 0, NULL, dev);
    if (!out || dev.type == ACCEL_DEV_META) return out;
    accel_tensor *pf = accel__f32_contig(pred), *tf = accel__f32_contig(target);
    if (!pf || !tf) return NULL;
    accel_k_mse k = {.out = out, .pred = pf, .target = tf};
    if (ACCEL_KERNEL(OP, dev, mse, &k) != ACCEL_OK) return NULL;
    accel_node *nd = accel_tape_record("mse_loss", mse_backward, out, 2, in);
    if (nd) {
        nd->saved[0] = pf;
        nd->saved[1] = tf;
    }
    return out;
}
