/* Dense copies and identity aliases shared by the basic ops. */
#include "ops_util.h"

accel_tensor *accel__dense(accel_tensor *t) { return accel__contig(t); }

accel_tensor *accel__dense_f32(accel_tensor *t) { return accel__f32_contig(t); }

accel_status accel__reshape_backward(accel_node *n, accel_tensor *g) {
    accel_tensor *x = n->inputs[0];
    accel_tensor *gx = accel_reshape(g, x->ndim, x->shape);
    if (!gx) return accel_last_status();
    /* g's elements (or their dense copy) pass to x. */
    return accel__grad_move_out(n, x, gx);
}

accel_tensor *accel__alias_op(const char *op, accel_tensor *a) {
    accel_tensor *out = accel_alias(a);
    if (!out) return NULL;
    accel_tape_record(op, accel__reshape_backward, out, 1, &a);
    return out;
}
