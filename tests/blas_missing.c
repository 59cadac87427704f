/* accel_build_info's OpenBLAS lines (src/dist/buildinfo.c) where OpenBLAS
 * cannot be loaded: openblas_lazy.c built here (tests/blas.cmake) to look
 * for a library that does not exist. What describes the build says why,
 * "unavailable (<dlerror>)", and does not abort as a GEMM would. */
#include <string.h>

#include "accel/dist.h"
#include "check.h"

static void test_blas_lines_say_why(void) {
    const char *blas = accel_build_info(ACCEL_INFO_BLAS);
    CHECK_MSG(!strncmp(blas, "unavailable (", 13) && strstr(blas, "libaccel-no-such-blas.so.0"), "%s", blas);
    const char *threads = accel_build_info(ACCEL_INFO_BLAS_THREADS);
    CHECK_MSG(!strncmp(threads, "unavailable (", 13), "%s", threads);
    CHECK(!strcmp(accel_build_info(ACCEL_INFO_VERSION), ACCEL_VERSION_STRING));
}

int main(void) {
    RUN(test_blas_lines_say_why);
    return check_summary();
}
