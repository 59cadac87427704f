/* OpenBLAS, loaded on the first call that needs it, not at start-up.
 *
 * Linked, libopenblas.so.0 is mapped and relocated (with libgfortran and
 * libquadmath) and starts its thread pool in its constructor in every
 * process, `accel --help` and `accel launch` included, ~3 ms before main.
 * So the core does not link it: the few OpenBLAS functions it calls (gemm.c,
 * buildinfo.c) are defined here under their own names, and the first call of
 * any of them dlopens the library (its soname, found as when linked:
 * ACCEL_OPENBLAS_SONAME from CMake) and binds all of them at once.
 *
 * OpenBLAS is a dependency of the build: without it no GEMM can run, so a
 * failure to load it is reported once on stderr and aborts, as the dynamic
 * loader refused to start the program when it was linked. */
#include <cblas.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#ifndef ACCEL_OPENBLAS_SONAME
#define ACCEL_OPENBLAS_SONAME "libopenblas.so.0"
#endif

static struct {
    __typeof__(cblas_sgemm) *sgemm;
    __typeof__(cblas_sgemv) *sgemv;
    __typeof__(openblas_set_num_threads) *set_num_threads;
    __typeof__(openblas_get_num_threads) *get_num_threads;
    __typeof__(openblas_get_config) *get_config;
} g_blas;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void *bind(void *h, const char *name) {
    void *f = h ? dlsym(h, name) : NULL;
    if (!f) {
        fprintf(stderr, "accel: cannot use OpenBLAS (%s): %s\n", ACCEL_OPENBLAS_SONAME, dlerror());
        abort();
    }
    return f;
}

static void load(void) {
    void *h = dlopen(ACCEL_OPENBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
    g_blas.sgemm = (__typeof__(g_blas.sgemm))bind(h, "cblas_sgemm");
    g_blas.sgemv = (__typeof__(g_blas.sgemv))bind(h, "cblas_sgemv");
    g_blas.set_num_threads = (__typeof__(g_blas.set_num_threads))bind(h, "openblas_set_num_threads");
    g_blas.get_num_threads = (__typeof__(g_blas.get_num_threads))bind(h, "openblas_get_num_threads");
    g_blas.get_config = (__typeof__(g_blas.get_config))bind(h, "openblas_get_config");
}

#define BLAS (pthread_once(&g_once, load), &g_blas)

void cblas_sgemm(OPENBLAS_CONST enum CBLAS_ORDER Order, OPENBLAS_CONST enum CBLAS_TRANSPOSE TransA,
                 OPENBLAS_CONST enum CBLAS_TRANSPOSE TransB, OPENBLAS_CONST blasint M, OPENBLAS_CONST blasint N,
                 OPENBLAS_CONST blasint K, OPENBLAS_CONST float alpha, OPENBLAS_CONST float *A,
                 OPENBLAS_CONST blasint lda, OPENBLAS_CONST float *B, OPENBLAS_CONST blasint ldb,
                 OPENBLAS_CONST float beta, float *C, OPENBLAS_CONST blasint ldc) {
    BLAS->sgemm(Order, TransA, TransB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void cblas_sgemv(OPENBLAS_CONST enum CBLAS_ORDER order, OPENBLAS_CONST enum CBLAS_TRANSPOSE trans,
                 OPENBLAS_CONST blasint m, OPENBLAS_CONST blasint n, OPENBLAS_CONST float alpha,
                 OPENBLAS_CONST float *a, OPENBLAS_CONST blasint lda, OPENBLAS_CONST float *x,
                 OPENBLAS_CONST blasint incx, OPENBLAS_CONST float beta, float *y, OPENBLAS_CONST blasint incy) {
    BLAS->sgemv(order, trans, m, n, alpha, a, lda, x, incx, beta, y, incy);
}

void openblas_set_num_threads(int num_threads) { BLAS->set_num_threads(num_threads); }
int openblas_get_num_threads(void) { return BLAS->get_num_threads(); }
char *openblas_get_config(void) { return BLAS->get_config(); }
