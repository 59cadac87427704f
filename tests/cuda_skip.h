/* The skip of the gpu tests (ctest label gpu): without a CUDA device, or in
 * a build without the CUDA backend, a gpu test prints the reason and exits
 * with CUDA_SKIP (77), which ctest reports as skipped. */
#ifndef ACCEL_TESTS_CUDA_SKIP_H
#define ACCEL_TESTS_CUDA_SKIP_H

#include <stdbool.h>
#include <stdio.h>

#include "accel/core.h"
#ifdef ACCEL_HAVE_CUDA
#include "backends/cuda/cuda_internal.h" /* accel__cuda_unavailable_reason */
#endif

enum { CUDA_SKIP = 77 };

/* Whether cuda:0 is there; false after printing why it is not. */
static inline bool cuda_present_or_say_why(void) {
    if (accel_device_count(ACCEL_DEV_CUDA) > 0) return true;
#ifdef ACCEL_HAVE_CUDA
    printf("SKIP: no CUDA device: %s\n", accel__cuda_unavailable_reason());
#else
    printf("SKIP: this build has no CUDA backend (ACCEL_CUDA=OFF or no CUDA toolkit)\n");
#endif
    return false;
}

#endif
