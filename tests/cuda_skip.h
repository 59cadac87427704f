/* The GPU tests' skip: without a CUDA device (or in a build without the
 * CUDA backend) a GPU test prints the reason and exits 77, which ctest
 * reports as skipped (SKIP_RETURN_CODE 77, label gpu). */
#ifndef ACCEL_TESTS_CUDA_SKIP_H
#define ACCEL_TESTS_CUDA_SKIP_H

#include <stdbool.h>
#include <stdio.h>

#include "accel/accel.h"
#ifdef ACCEL_HAVE_CUDA
#include "backends/cuda/cuda_internal.h"
#endif

enum { CUDA_SKIP = 77 };

/* True (the reason printed, "SKIP: ...") when there is no CUDA device to test. */
static inline bool cuda_skip(void) {
    if (accel_device_count(ACCEL_DEV_CUDA) > 0) return false;
#ifdef ACCEL_HAVE_CUDA
    printf("SKIP: no CUDA device: %s\n", accel__cuda_unavailable_reason());
#else
    printf("SKIP: this build has no CUDA backend (ACCEL_CUDA=OFF or no CUDA toolkit)\n");
#endif
    return true;
}

#endif
