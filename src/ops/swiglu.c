/* accel_swiglu: silu(gate) * up, the Llama MLP's activation, in one kernel
 * forward and one backward. Unfused, PyTorch's eager mode (and accel's
 * accel_mul(accel_silu(gate), up)) writes silu(gate) out, reads it back for
 * the product, and in backward makes g * up, g * silu(gate) and silu' in
 * three more passes over [tokens, ffn]. */
#include "nn_internal.h"

static accel_status swiglu_backward(accel_node *node, accel_tensor *grad_out) {
    accel_tensor *g = accel__contig(grad_out);
    if (!g) return accel_last_status();
    accel__gbuf gg, gu;
    /* gate and up may be one tensor: the second buffer then adds into the first. */
    if (!accel__gbuf_begin_native(&gg, node->inputs[0]) || !accel__gbuf_begin_native(&gu, node->inputs[1]))
        return accel_last_status();
    if (!gg.dst && !gu.dst) return ACCEL_OK;
    accel_k_swiglu_backward k = {.dgate = gg.dst, .dup = gu.dst, .g = g, .gate = node->saved[0],
                                 .up = node->saved[1], .dgate_beta = gg.beta, .dup_beta = gu.beta};
    accel_status st = ACCEL_KERNEL("swiglu backward", g->device, swiglu_backward, &k);
    if (st == ACCEL_OK) st = accel__gbuf_end(&gg);
    return st == ACCEL_OK ? accel__gbuf_end(&gu) : st;
}

accel_tensor *accel_swiglu(accel_tensor *gate, accel_tensor *up) {
    static const char *OP = "accel_swiglu";
    accel_tensor *in[2] = {gate, up};
    accel_device dev;
    if (!accel__op_begin(OP, 2, in, &dev) || !accel__op_check_float(OP, gate, "gate") ||
        !accel__op_check_float(OP, up, "up"))
        return NULL;
    if (!accel_same_shape(gate, up)) {
        accel__shape_error2(OP, gate, up, "differ (swiglu needs equal shapes)");
        return NULL;
    }
    if (dev.type != ACCEL_DEV_META) {
        const accel_kernel_table *kt = accel__kernel_table_of(dev, OP);
        if (!kt) return NULL;
        /* A device without the fused kernels runs the two ops. */
        if (!kt->swiglu || !kt->swiglu_backward) return accel_mul(accel_silu(gate), up);
    }
    accel_tensor *out = accel__op_out(accel__promote(gate->dtype, up->dtype), gate->ndim, gate->shape, dev);
    if (!out || dev.type == ACCEL_DEV_META) return out;
    accel_tensor *gc = accel__contig(gate), *uc = accel__contig(up);
    if (!gc || !uc) return NULL;
    accel_k_swiglu k = {.out = out, .gate = gc, .up = uc};
    if (ACCEL_KERNEL(OP, dev, swiglu, &k) != ACCEL_OK) return NULL;
    accel_node *n = accel_tape_record("swiglu", swiglu_backward, out, 2, in);
    if (n) {
        n->saved[0] = gc;
        n->saved[1] = uc;
    }
    return out;
}
