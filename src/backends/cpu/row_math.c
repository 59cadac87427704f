/* Vectorised row math shared by the softmax, attention and cross-entropy kernels. */
#include <math.h>

#include "cpu_kernels.h"
#include "vec_math.h"

/* Eight running maxima (one AVX register once vectorised; a `simd
 * reduction(max)` over a float select does not vectorise with clang). */
ACCEL__VEC_MATH float accel__row_max(const float *x, int64_t n) {
    float m8[8];
    for (int k = 0; k < 8; k++) m8[k] = -INFINITY;
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (int k = 0; k < 8; k++) m8[k] = x[j + k] > m8[k] ? x[j + k] : m8[k];
    float m = -INFINITY;
    for (int k = 0; k < 8; k++) m = m8[k] > m ? m8[k] : m;
    for (; j < n; j++) m = x[j] > m ? x[j] : m;
    return m;
}

ACCEL__VEC_MATH float accel__row_exp(float *y, const float *x, int64_t n, float m) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < n; j++) {
        float e = accel__expf(x[j] - m);
        y[j] = e;
        s += e;
    }
    return s;
}

ACCEL__VEC_MATH float accel__row_sum_exp(const float *x, int64_t n, float m) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < n; j++) s += accel__expf(x[j] - m);
    return s;
}
