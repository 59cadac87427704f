/* src/dist/buildinfo.c — what `accel env` reports about this build.
 * ACCEL_COMPILER / ACCEL_BUILD_FLAGS are defined on the library target by CMake. */
#include <stdio.h>

#include "accel/dist.h"

#ifndef ACCEL_COMPILER
#define ACCEL_COMPILER "unknown"
#endif
#ifndef ACCEL_BUILD_FLAGS
#define ACCEL_BUILD_FLAGS "unknown"
#endif

/* OpenBLAS introspection (the library links OpenBLAS). */
char *openblas_get_config(void);
int openblas_get_num_threads(void);

const char *accel_build_info(accel_build_info_kind which) {
    static _Thread_local char threads[16];
    switch (which) {
    case ACCEL_INFO_VERSION: return ACCEL_VERSION_STRING;
    case ACCEL_INFO_COMPILER: return ACCEL_COMPILER;
    case ACCEL_INFO_FLAGS: return ACCEL_BUILD_FLAGS;
    case ACCEL_INFO_BLAS: return openblas_get_config();
    case ACCEL_INFO_BLAS_THREADS:
        snprintf(threads, sizeof threads, "%d", openblas_get_num_threads());
        return threads;
#ifdef ACCEL_HAVE_MPI
    case ACCEL_INFO_DIST_BACKENDS: return "self, shm, tcp, mpi";
#else
    case ACCEL_INFO_DIST_BACKENDS: return "self, shm, tcp";
#endif
    }
    return "";
}
