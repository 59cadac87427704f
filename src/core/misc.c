/* Clock and thread count. */
#include <omp.h>
#include <time.h>

#include "accel/core.h"

double accel_now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int accel_num_threads(void) { return omp_get_max_threads(); }

void accel_set_num_threads(int n) {
    if (n > 0) omp_set_num_threads(n);
}
