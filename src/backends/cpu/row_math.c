/* Vectorised row math of the cross-entropy kernels (loss_kernels.c and the fused one). */
#include <math.h>

#include "cpu_kernels.h"
#include "vec_math.h"

ACCEL__VEC_MATH float accel__row_max(const float *x, int64_t n) { return accel__vec_row_max(x, n); }

ACCEL__VEC_MATH float accel__row_sum_exp(const float *x, int64_t n, float m) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < n; j++) s += accel__expf(x[j] - m);
    return s;
}
