/* Configure-time probe of tests/gemm.cmake: prints openblas_get_config() of
 * the OpenBLAS the build links. It names DYNAMIC_ARCH where OpenBLAS picks
 * its core at load, the one build where OPENBLAS_CORETYPE can force a core. */
#include <stdio.h>

char *openblas_get_config(void);

int main(void) {
    puts(openblas_get_config());
    return 0;
}
