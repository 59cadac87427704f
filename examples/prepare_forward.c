/* accelerator.prepare(model) and one forward: prints
 *     device=cpu
 *     shape=[1, 1]
 * prepare places the model on the accelerator's device; inputs are placed explicitly. */
#include <stdio.h>

#include "accel/accel.h"
#include "accel/accelerator.h"

int main(void) {
    accel_accelerator *acc = accel_accelerator_new(NULL);
    if (!acc) {
        fprintf(stderr, "prepare_forward: %s\n", accel_last_error());
        return 1;
    }
    accel_module *model = accel_linear_new(1, 1, true, accel_accelerator_device(acc), ACCEL_F32);
    int rc = 0;
    if (accel_accelerator_prepare_model(acc, model) != ACCEL_OK) {
        rc = 1;
    } else {
        accel_tensor *x = accel_to_device(accel_full(ACCEL_F32, ACCEL_SHAPE(1, 1), 0.5), accel_accelerator_device(acc));
        accel_tensor *y = accel_module_call(model, x);
        char shape[64];
        if (!y) {
            rc = 1;
        } else {
            printf("device=%s\n", accel_device_type_name(y->device.type));
            printf("shape=%s\n", accel_shape_str(y, shape, sizeof shape));
        }
    }
    if (rc) fprintf(stderr, "prepare_forward: %s\n", accel_last_error());
    accel_step_reset();
    accel_accelerator_free(acc);
    accel_module_free(model);
    accel_thread_cleanup();
    return rc;
}
