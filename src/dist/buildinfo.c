/* src/dist/buildinfo.c — what `accel env` reports about this build.
 * ACCEL_COMPILER / ACCEL_BUILD_FLAGS are defined on the library target by CMake. */
#include <stdio.h>

#include "accel/dist.h"
#include "backends/cpu/openblas_lazy.h" /* OpenBLAS introspection, loaded on demand */

#ifndef ACCEL_COMPILER
#define ACCEL_COMPILER "unknown"
#endif
#ifndef ACCEL_BUILD_FLAGS
#define ACCEL_BUILD_FLAGS "unknown"
#endif

const char *accel_build_info(accel_build_info_kind which) {
    static _Thread_local char text[1100];
    const char *blas_missing = NULL;
    if (which == ACCEL_INFO_BLAS || which == ACCEL_INFO_BLAS_THREADS) {
        blas_missing = accel__openblas_unavailable();
        if (blas_missing) {
            snprintf(text, sizeof text, "unavailable (%s)", blas_missing);
            return text;
        }
    }
    switch (which) {
    case ACCEL_INFO_VERSION: return ACCEL_VERSION_STRING;
    case ACCEL_INFO_COMPILER: return ACCEL_COMPILER;
    case ACCEL_INFO_FLAGS: return ACCEL_BUILD_FLAGS;
    case ACCEL_INFO_BLAS: return accel__openblas_get_config();
    case ACCEL_INFO_BLAS_THREADS:
        snprintf(text, sizeof text, "%d", accel__openblas_get_num_threads());
        return text;
#ifdef ACCEL_HAVE_MPI
    case ACCEL_INFO_DIST_BACKENDS: return "self, shm, tcp, mpi";
#else
    case ACCEL_INFO_DIST_BACKENDS: return "self, shm, tcp";
#endif
    }
    return "";
}
