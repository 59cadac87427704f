/* Moving tensors between devices. This build has cpu and meta: a tensor goes
 * to meta as a shape-only tensor; a meta tensor has no data to bring back. */
#include "ops_util.h"

accel_tensor *accel_to_device(accel_tensor *a, accel_device dev) {
    const char *op = "accel_to_device";
    accel_device from;
    if (!accel__op_begin(op, 1, &a, &from)) return NULL;
    char x[32], y[32], b[96];
    if (!accel_device_available(dev)) {
        accel_set_error(ACCEL_ERR_DEVICE, "%s: device %s is not available in this build (cpu, meta)",
                        op, accel_device_str(dev, x, sizeof x));
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
    if (dev.type == ACCEL_DEV_META) /* shape and dtype only; no gradient can flow back from meta */
        return accel_empty_on(a->dtype, a->ndim, a->shape, dev);
    accel_set_error(ACCEL_ERR_DEVICE, "%s: no copy from %s to %s in this build", op,
                    accel_device_str(a->device, x, sizeof x), accel_device_str(dev, y, sizeof y));
    return NULL;
}
