/* The row loops of RMSNorm forward and backward (norm_kernels.c spreads the
 * rows over the threads), compiled once per ISA variant (cpu_variants.h): 16
 * floats a step on AVX-512, 8 on AVX2, 4 on the baseline. A row's sum runs in
 * LANES running sums added in a fixed order, and no multiply-add is fused
 * (GCC fuses none in ISO C mode; clang's default would, hence the pragma), so
 * every variant gives the same bits (tests/test_ops_perf_paths.c compares
 * them). The baseline-only compile these loops had before ran at 4 lanes and
 * was the larger part of RMSNorm backward's time in the Llama step. */
#include "cpu_kernels.h"
#include "vec_math.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

enum { LANES = 16 };

/* The LANES running sums of a row added pairwise: lane k + h into lane k. */
ACCEL__VEC_MATH static inline float lanes_sum(float *acc) {
    for (int h = LANES / 2; h > 0; h /= 2)
        for (int k = 0; k < h; k++) acc[k] += acc[k + h];
    return acc[0];
}

/* sum of a[j] * b[j] over n. */
ACCEL__VEC_MATH static inline float row_dot(const float *a, const float *b, int64_t n) {
    float acc[LANES] = {0};
    int64_t j = 0;
    for (; j + LANES <= n; j += LANES)
#pragma omp simd
        for (int k = 0; k < LANES; k++) acc[k] += a[j + k] * b[j + k];
    for (int k = 0; j + k < n; k++) acc[k] += a[j + k] * b[j + k];
    return lanes_sum(acc);
}

/* sum of (a[j] * w[j]) * b[j] over n. */
ACCEL__VEC_MATH static inline float row_dot_w(const float *a, const float *w, const float *b, int64_t n) {
    float acc[LANES] = {0};
    int64_t j = 0;
    for (; j + LANES <= n; j += LANES)
#pragma omp simd
        for (int k = 0; k < LANES; k++) acc[k] += a[j + k] * w[j + k] * b[j + k];
    for (int k = 0; j + k < n; k++) acc[k] += a[j + k] * w[j + k] * b[j + k];
    return lanes_sum(acc);
}

/* v rounded to dtype dt and back (identity for f32). */
ACCEL__VEC_MATH static inline float round_to(float v, accel_dtype dt) {
    if (dt == ACCEL_BF16) return accel__bf16_float(accel__bf16_bits(v));
    if (dt == ACCEL_F16) return accel_f16_to_f32(accel_f32_to_f16(v));
    return v;
}

ACCEL__VEC_MATH void accel__cpu_rms_norm_row(const float *x, const float *w, float *y, float *rstd, int64_t D,
                                             float eps, accel_dtype xdt) {
    float s = 1.0f / sqrtf(row_dot(x, x, D) / (float)D + eps);
    *rstd = s;
    if (xdt == ACCEL_F32 && w) {
#pragma omp simd
        for (int64_t j = 0; j < D; j++) y[j] = w[j] * (x[j] * s);
    } else if (xdt == ACCEL_BF16) {
#pragma omp simd
        for (int64_t j = 0; j < D; j++) y[j] = round_to(x[j] * s, ACCEL_BF16);
        if (w)
#pragma omp simd
            for (int64_t j = 0; j < D; j++) y[j] *= w[j];
    } else {
        for (int64_t j = 0; j < D; j++) {
            float v = round_to(x[j] * s, xdt);
            y[j] = w ? w[j] * v : v;
        }
    }
}

ACCEL__VEC_MATH void accel__cpu_rms_norm_dx_row(const float *x, const float *g, const float *w, float s, float *dx,
                                                float beta, int64_t D) {
    float c = s * s * (w ? row_dot_w(g, w, x, D) : row_dot(g, x, D)) / (float)D, sc = s * c;
    if (w && beta == 0.0f) {
#pragma omp simd
        for (int64_t j = 0; j < D; j++) dx[j] = s * (g[j] * w[j]) - x[j] * sc;
    } else if (w) {
#pragma omp simd
        for (int64_t j = 0; j < D; j++) dx[j] += s * (g[j] * w[j]) - x[j] * sc;
    } else if (beta == 0.0f) {
#pragma omp simd
        for (int64_t j = 0; j < D; j++) dx[j] = s * g[j] - x[j] * sc;
    } else {
#pragma omp simd
        for (int64_t j = 0; j < D; j++) dx[j] += s * g[j] - x[j] * sc;
    }
}

ACCEL__VEC_MATH void accel__cpu_rms_norm_dw_row(const float *x, const float *g, float s, float *dw, int64_t n,
                                                accel_dtype xdt) {
    if (xdt == ACCEL_F32) {
#pragma omp simd
        for (int64_t j = 0; j < n; j++) dw[j] += g[j] * (x[j] * s);
    } else if (xdt == ACCEL_BF16) {
#pragma omp simd
        for (int64_t j = 0; j < n; j++) dw[j] += g[j] * round_to(x[j] * s, ACCEL_BF16);
    } else {
        for (int64_t j = 0; j < n; j++) dw[j] += g[j] * round_to(x[j] * s, xdt);
    }
}
