/* Moving tensors between devices: a copy between any two registered devices
 * (through their backends), differentiable; to meta a shape-only tensor; a
 * meta tensor has no data to bring back. */
#include "ops_util.h"

/* The gradient goes back to the input's device. */
static accel_status to_device_backward(accel_node *n, accel_tensor *g) {
    accel_tensor *x = n->inputs[0];
    accel_tensor *gx = accel_to_device(g, x->device);
    return gx ? accel_grad_accumulate(x, gx) : accel_last_status();
}

accel_tensor *accel_to_device(accel_tensor *a, accel_device dev) {
    const char *op = "accel_to_device";
    accel_device from;
    if (!accel__op_begin(op, 1, &a, &from)) return NULL;
    char x[32], b[96];
    if (!accel_device_available(dev)) {
        accel_set_error(ACCEL_ERR_DEVICE, "%s: device %s is not available in this build", op,
                        accel_device_str(dev, x, sizeof x));
        return NULL;
    }
    if (accel_device_eq(a->device, dev)) return accel__alias_op("to_device", a);
    if (a->device.type == ACCEL_DEV_META) {
        accel_set_error(ACCEL_ERR_DEVICE,
                        "%s: tensor of shape %s on meta has no data to copy to %s "
                        "(materialize it first)", op, accel_shape_str(a, b, sizeof b),
                        accel_device_str(dev, x, sizeof x));
        return NULL;
    }
    accel_tensor *out = accel_empty_on(a->dtype, a->ndim, a->shape, dev);
    if (!out || dev.type == ACCEL_DEV_META) return out; /* no gradient flows back from meta */
    if (accel_copy_(out, a) != ACCEL_OK) return NULL;
    if (accel_dtype_is_float(a->dtype)) accel_tape_record("to_device", to_device_backward, out, 1, &a);
    return out;
}
