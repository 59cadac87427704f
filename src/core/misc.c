/* Clock and thread count. */
#include <omp.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "core/core_internal.h"

double accel_now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static atomic_bool g_chosen; /* accel_set_num_threads was called */
static atomic_int g_cap;     /* accel__cap_num_threads's (0: none) */

int accel_num_threads(void) {
    int n = omp_get_max_threads(), cap = atomic_load(&g_cap);
    return cap > 0 && cap < n ? cap : n;
}

accel_status accel_set_num_threads(int n) {
    if (n <= 0) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_set_num_threads: n must be >= 1, got %d", n);
    atomic_store(&g_chosen, true);
    atomic_store(&g_cap, 0);
    omp_set_num_threads(n);
    return ACCEL_OK;
}

/* The reference-kernel switch (core.h). Read by the backends' kernels and by
 * ops, so it lives in core, below both; per thread, as a test's comparison runs
 * the two paths on one thread while others run the fast one. */
static _Thread_local bool tl_reference;

bool accel_set_reference_kernels(bool on) {
    bool prev = tl_reference;
    tl_reference = on;
    return prev;
}

bool accel_reference_kernels(void) { return tl_reference; }

/* An OMP_NUM_THREADS that is set but empty is no choice: OpenMP ignores it. */
bool accel__num_threads_chosen(void) {
    const char *omp = getenv("OMP_NUM_THREADS");
    return atomic_load(&g_chosen) || (omp && *omp);
}

void accel__cap_num_threads(int n) {
    atomic_store(&g_cap, n);
    omp_set_num_threads(n);
}
