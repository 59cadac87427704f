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
/* The count chosen for every thread (accel_set_num_threads's n, or the cap;
 * 0: none, each thread keeps OpenMP's own) and its generation: OpenMP's
 * count is a per-thread setting, so each thread applies a new choice itself
 * at its next library call that asks (accel__threads_follow), as PyTorch's
 * count holds for every thread of the process. */
static atomic_int g_count;
static atomic_uint g_gen;
static _Thread_local unsigned tl_gen;

void accel__threads_follow(void) {
    unsigned gen = atomic_load_explicit(&g_gen, memory_order_acquire);
    if (tl_gen == gen || omp_in_parallel()) return; /* inside a region: its team's size is set */
    tl_gen = gen;
    int n = atomic_load(&g_count);
    if (n > 0) omp_set_num_threads(n);
}

static void threads_choose(int n) {
    atomic_store(&g_count, n);
    atomic_fetch_add_explicit(&g_gen, 1, memory_order_release);
    accel__threads_follow();
}

int accel_num_threads(void) {
    accel__threads_follow();
    int n = omp_get_max_threads(), cap = atomic_load(&g_cap);
    return cap > 0 && cap < n ? cap : n;
}

accel_status accel_set_num_threads(int n) {
    if (n <= 0) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_set_num_threads: n must be >= 1, got %d", n);
    atomic_store(&g_chosen, true);
    atomic_store(&g_cap, 0);
    threads_choose(n);
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
    threads_choose(n);
}
