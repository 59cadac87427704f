/* OpenBLAS, loaded on the first call that needs it, not at start-up.
 *
 * Linked, libopenblas.so.0 is mapped and relocated (with libgfortran and
 * libquadmath) and starts its thread pool in its constructor in every
 * process, `accel --help` and `accel launch` included, ~3 ms before main.
 * So the core does not link it: the few OpenBLAS functions it calls (gemm.c,
 * buildinfo.c) are defined here as accel__cblas_* / accel__openblas_*
 * (openblas_lazy.h), and the first call of
 * any of them dlopens the library and binds all of them at once: the file
 * CMake found (ACCEL_OPENBLAS_DIR/ACCEL_OPENBLAS_SONAME: not linked, its
 * directory is in no RUNPATH, so an OpenBLAS outside the system directories
 * is found only by its full path), else the soname as the loader finds it.
 *
 * OpenBLAS is a dependency of the build: without it no GEMM can run, so a
 * GEMM's failure to load it is reported once on stderr and aborts, as the
 * dynamic loader refused to start the program when it was linked. What only
 * describes it (accel_build_info, `accel env`) asks
 * accel__openblas_unavailable first and reports why instead. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "backends/cpu/openblas_lazy.h"

#ifndef ACCEL_OPENBLAS_SONAME
#define ACCEL_OPENBLAS_SONAME "libopenblas.so.0"
#endif
#ifndef ACCEL_OPENBLAS_DIR
#define ACCEL_OPENBLAS_DIR "" /* only the soname */
#endif

typedef struct blas_fns {
    __typeof__(cblas_sgemm) *sgemm;
    __typeof__(cblas_sgemv) *sgemv;
    __typeof__(openblas_set_num_threads) *set_num_threads;
    __typeof__(openblas_get_num_threads) *get_num_threads;
    __typeof__(openblas_get_config) *get_config;
    char *(*get_corename)(void); /* NULL where the library lacks it */
} blas_fns;
static blas_fns g_blas;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static bool g_loaded;
static char g_why[1024]; /* !g_loaded: dlerror's words */

static bool bind(void *h, void **f, const char *name) {
    *f = dlsym(h, name);
    if (!*f) snprintf(g_why, sizeof g_why, "%s", dlerror());
    return *f != NULL;
}

static void load(void) {
    void *h = NULL;
    if (ACCEL_OPENBLAS_DIR[0]) h = dlopen(ACCEL_OPENBLAS_DIR "/" ACCEL_OPENBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen(ACCEL_OPENBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(g_why, sizeof g_why, "%s", dlerror());
        return;
    }
    g_loaded = bind(h, (void **)&g_blas.sgemm, "cblas_sgemm") && bind(h, (void **)&g_blas.sgemv, "cblas_sgemv") &&
               bind(h, (void **)&g_blas.set_num_threads, "openblas_set_num_threads") &&
               bind(h, (void **)&g_blas.get_num_threads, "openblas_get_num_threads") &&
               bind(h, (void **)&g_blas.get_config, "openblas_get_config");
    /* optional: an OpenBLAS without it runs, its core unknown */
    *(void **)&g_blas.get_corename = dlsym(h, "openblas_get_corename");
}

const char *accel__openblas_unavailable(void) {
    pthread_once(&g_once, load);
    return g_loaded ? NULL : g_why;
}

static const blas_fns *blas(void) {
    const char *why = accel__openblas_unavailable();
    if (why) {
        fprintf(stderr, "accel: cannot use OpenBLAS (%s): %s\n", ACCEL_OPENBLAS_SONAME, why);
        abort();
    }
    return &g_blas;
}

#define BLAS blas()

void accel__cblas_sgemm(OPENBLAS_CONST enum CBLAS_ORDER Order, OPENBLAS_CONST enum CBLAS_TRANSPOSE TransA,
                 OPENBLAS_CONST enum CBLAS_TRANSPOSE TransB, OPENBLAS_CONST blasint M, OPENBLAS_CONST blasint N,
                 OPENBLAS_CONST blasint K, OPENBLAS_CONST float alpha, OPENBLAS_CONST float *A,
                 OPENBLAS_CONST blasint lda, OPENBLAS_CONST float *B, OPENBLAS_CONST blasint ldb,
                 OPENBLAS_CONST float beta, float *C, OPENBLAS_CONST blasint ldc) {
    BLAS->sgemm(Order, TransA, TransB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void accel__cblas_sgemv(OPENBLAS_CONST enum CBLAS_ORDER order, OPENBLAS_CONST enum CBLAS_TRANSPOSE trans,
                 OPENBLAS_CONST blasint m, OPENBLAS_CONST blasint n, OPENBLAS_CONST float alpha,
                 OPENBLAS_CONST float *a, OPENBLAS_CONST blasint lda, OPENBLAS_CONST float *x,
                 OPENBLAS_CONST blasint incx, OPENBLAS_CONST float beta, float *y, OPENBLAS_CONST blasint incy) {
    BLAS->sgemv(order, trans, m, n, alpha, a, lda, x, incx, beta, y, incy);
}

void accel__openblas_set_num_threads(int num_threads) { BLAS->set_num_threads(num_threads); }
int accel__openblas_get_num_threads(void) { return BLAS->get_num_threads(); }
char *accel__openblas_get_config(void) { return BLAS->get_config(); }

const char *accel__openblas_corename(void) {
    if (accel__openblas_unavailable() || !g_blas.get_corename) return NULL;
    return g_blas.get_corename();
}
