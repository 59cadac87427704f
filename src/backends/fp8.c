/* Which devices can run mixed_precision='fp8' (backends/fp8.h). */
#include "backends/fp8.h"

#include <stdio.h>

#ifdef ACCEL_HAVE_CUDA
#include "backends/cuda/cuda_env.h"
#include "backends/cuda/cuda_internal.h"
#endif

accel_status accel__fp8_device_check(accel_device d, const char *op) {
    char dev[32];
    accel_device_str(d, dev, sizeof dev);
#ifdef ACCEL_HAVE_CUDA
    if (d.type == ACCEL_DEV_CUDA) {
        int major = 0, minor = 0;
        char name[128] = "";
        if (!accel__cuda_capability(d.index, &major, &minor, name, sizeof name))
            return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: fp8 mixed precision: %s cannot be queried", op, dev);
        if (major * 10 + minor < 89)
            return accel_set_error(ACCEL_ERR_UNSUPPORTED,
                                   "%s: fp8 mixed precision is not supported on %s (%s, compute capability %d.%d): "
                                   "it needs compute capability >= 8.9 (Ada Lovelace, Hopper); use bf16 or fp16",
                                   op, dev, name, major, minor);
        return ACCEL_OK;
    }
    const char *why = accel_device_count(ACCEL_DEV_CUDA) ? "" : accel__cuda_unavailable_reason();
#else
    const char *why = "this build has no CUDA backend";
#endif
    return accel_set_error(ACCEL_ERR_UNSUPPORTED,
                           "%s: fp8 mixed precision is not supported on %s%s%s%s: it needs a CUDA GPU of compute "
                           "capability >= 8.9 (Ada Lovelace, Hopper); use bf16 or fp16",
                           op, dev, *why ? " (" : "", why, *why ? ")" : "");
}
