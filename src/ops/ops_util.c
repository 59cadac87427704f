/* Dense copies and identity aliases shared by the basic ops. */
#include "ops_util.h"

accel_tensor *accel__dense(accel_tensor *t) {
    if (accel_is_contiguous(t)) return t;
    accel_tensor *c = accel_empty_on(t->dtype, t->ndim, t->shape, t->device);
    if (c && c->data) accel__cpu_copy_strided(c->data, t);
    return c;
}

accel_tensor *accel__dense_f32(accel_tensor *t) {
    accel_tensor *d = accel__dense(t);
    if (!d || d->dtype == ACCEL_F32) return d;
    accel_tensor *c = accel_empty_on(ACCEL_F32, t->ndim, t->shape, t->device);
    if (c && c->data) accel_convert(c->data, ACCEL_F32, d->data, d->dtype, (size_t)accel_numel(d));
    return c;
}

accel_status accel__reshape_backward(accel_node *n, accel_tensor *g) {
    accel_tensor *x = n->inputs[0];
    accel_tensor *gx = accel_reshape(g, x->ndim, x->shape);
    return gx ? accel_grad_accumulate(x, gx) : accel_last_status();
}

accel_tensor *accel__alias_op(const char *op, accel_tensor *a) {
    accel_tensor *out = accel_alias(a);
    if (!out) return NULL;
    accel_tape_record(op, accel__reshape_backward, out, 1, &a);
    return out;
}
