/* gather_for_metrics across processes. Under `accel launch --num_processes 2` prints
 *     world=2
 *     device=cpu
 *     gathered=[1, 2, 3, 1, 2, 3]
 * once (accelerator print runs on the main process only). */
#include <stdio.h>

#include "accel/accel.h"
#include "accel/accelerator.h"

int main(void) {
    accel_accelerator *acc = accel_accelerator_new(NULL);
    if (!acc) {
        fprintf(stderr, "gather: %s\n", accel_last_error());
        return 1;
    }
    accel_tensor *x = accel_from_data(ACCEL_I64, ACCEL_SHAPE(3), (const int64_t[]){1, 2, 3});
    accel_tensor *g = accel_accelerator_gather_for_metrics(acc, x);
    if (!g) {
        fprintf(stderr, "gather: %s\n", accel_last_error());
        accel_accelerator_free(acc);
        return 1;
    }
    char list[256];
    size_t k = (size_t)snprintf(list, sizeof list, "[");
    for (int64_t i = 0; i < g->shape[0] && k < sizeof list; i++)
        k += (size_t)snprintf(list + k, sizeof list - k, "%s%lld", i ? ", " : "", (long long)accel_get(g, &i));
    snprintf(list + k, sizeof list - k, "]");
    accel_accelerator_print(acc, "world=%d\n", accel_accelerator_num_processes(acc));
    accel_accelerator_print(acc, "device=%s\n", accel_device_type_name(g->device.type));
    accel_accelerator_print(acc, "gathered=%s\n", list);
    accel_step_reset();
    accel_accelerator_free(acc);
    accel_thread_cleanup();
    return 0;
}
