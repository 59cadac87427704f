/* The OpenBLAS functions accel calls (openblas_lazy.c loads the library on
 * the first of them). Named apart from OpenBLAS's own: libaccel.a defines no
 * cblas_* or openblas_* symbol, which a program linking its own BLAS (MKL,
 * BLIS) would find defined twice or, worse, bound to accel's forwarders. */
#ifndef ACCEL_BACKENDS_CPU_OPENBLAS_LAZY_H
#define ACCEL_BACKENDS_CPU_OPENBLAS_LAZY_H

#include <cblas.h>

extern __typeof__(cblas_sgemm) accel__cblas_sgemm;
extern __typeof__(cblas_sgemv) accel__cblas_sgemv;
extern __typeof__(openblas_set_num_threads) accel__openblas_set_num_threads;
extern __typeof__(openblas_get_num_threads) accel__openblas_get_num_threads;
extern __typeof__(openblas_get_config) accel__openblas_get_config;

/* The name of the core whose kernels OpenBLAS runs ("Haswell", "Prescott":
 * its openblas_get_corename, chosen at load from cpuid or
 * OPENBLAS_CORETYPE), loading it first; NULL when it cannot be loaded or
 * has no such function. Static string of OpenBLAS's. */
const char *accel__openblas_corename(void);

/* NULL when OpenBLAS is loaded (loading it first), else why it cannot be
 * (dlerror's words): for what describes the build, which must not abort as
 * the functions above do without it. */
const char *accel__openblas_unavailable(void);

#endif
