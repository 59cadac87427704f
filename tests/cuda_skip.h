/* The skip of the gpu tests (ctest label gpu): without a CUDA device, or in
 * a build without the cuda plug-in, a gpu test prints the reason and exits
 * with CUDA_SKIP (77), which ctest reports as skipped. */
#ifndef ACCEL_TESTS_CUDA_SKIP_H
#define ACCEL_TESTS_CUDA_SKIP_H

#include <stdbool.h>
#include <stdio.h>

#include "accel/core.h"
#include "backends/cuda/cuda_hooks.h"
#include "backends/plugin.h"

enum { CUDA_SKIP = 77 };

/* Whether cuda:0 is there; false after printing why it is not. */
static inline bool cuda_present_or_say_why(void) {
    if (accel_device_count(ACCEL_DEV_CUDA) > 0) return true;
    printf("SKIP: no CUDA device: %s\n", accel__plugin_unavailable_reason(ACCEL_DEV_CUDA));
    return false;
}

/* The cuda plug-in's test hooks (loaded: cuda_present_or_say_why() was true). */
static inline const accel__cuda_hooks *cuda_hooks(void) { return accel__plugin_hooks(ACCEL_DEV_CUDA); }

#endif
