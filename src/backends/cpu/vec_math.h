/* Vectorisable float math for the CPU kernels (not public API): an expf and
 * a tanhf that GCC turns into SIMD code of each kernel variant (baseline,
 * AVX2, AVX-512: cpu_variants.h) inside `omp simd` loops, where a call to
 * libm keeps the loop scalar. */
#ifndef ACCEL_BACKENDS_CPU_VEC_MATH_H
#define ACCEL_BACKENDS_CPU_VEC_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* GCC keeps loops with float selects scalar under its default -ftrapping-math
 * ("control flow in loop"); functions marked with this opt out so that `omp
 * simd` loops over accel__expf vectorise (about 7x faster than libm's scalar
 * expf). */
#if defined(__GNUC__) && !defined(__clang__)
#define ACCEL__VEC_MATH __attribute__((optimize("no-trapping-math")))
#else
#define ACCEL__VEC_MATH
#endif

/* expf without a call: x = n ln2 + r (Cody-Waite), Cephes' degree-6
 * polynomial for e^r, 2^n from the exponent bits. Relative error < 1e-7
 * (libm's is 0.5 ulp = 6e-8) up to x = 88.38; between 88.38 and 88.72 it
 * stays at e^88.38 (up to 12% low, near FLT_MAX); +inf above 88.72 and for
 * +inf, 0 below -87.34 (no denormals) and for -inf, nan for nan. The callers
 * take exp of values <= 0 (x - max, x - logsumexp) or feed 1 / (1 + e). */
ACCEL__VEC_MATH static inline float accel__expf(float x) {
    /* Clamped so that n fits the exponent; a nan becomes a finite value here
     * (no float-to-int conversion of a nan) and is passed through at the end. */
    float xc = x < 88.3762626647949f ? x : 88.3762626647949f;
    xc = xc > -87.3365447504f ? xc : -87.3365447504f;
    float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest */
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float y = p * r * r + r + 1.0f;
    int32_t e = ((int32_t)n + 127) * (1 << 23);
    float s;
    memcpy(&s, &e, sizeof s);
    float res = y * s;
    res = x > 88.7228394f ? INFINITY : res;
    res = x < -87.3365447504f ? 0.0f : res;
    return x == x ? res : x;
}

/* tanhf without a call, for `omp simd` loops (libm's scalar tanhf kept the
 * Gemma2 soft-capping and GELU-tanh loops scalar). On |x|: below 0.625
 * Cephes' odd polynomial x + x^3 P(x^2); above, 1 - 2 / (e^2|x| + 1) with
 * accel__expf (no cancellation there: the result is > 0.55), rounding to 1
 * from |x| near 9 on as tanhf does (e^2|x| saturating, or +inf); then x's
 * sign put back, so -0 stays -0, +-inf give +-1, nan stays nan. Within 2 ulp of
 * libm's tanhf over every float (tests/test_cpu_dispatch.c sweeps them). */
ACCEL__VEC_MATH static inline float accel__tanhf(float x) {
    uint32_t u, sign;
    memcpy(&u, &x, sizeof u);
    sign = u & 0x80000000u;
    u &= 0x7fffffffu;
    float a;
    memcpy(&a, &u, sizeof a);
    float z = a * a;
    float p = -5.70498872745e-3f;
    p = p * z + 2.06390887954e-2f;
    p = p * z - 5.37397155531e-2f;
    p = p * z + 1.33314422036e-1f;
    p = p * z - 3.33332819422e-1f;
    float small = p * z * a + a;
    float large = 1.0f - 2.0f / (accel__expf(a + a) + 1.0f);
    float r = a < 0.625f ? small : large;
    memcpy(&u, &r, sizeof u);
    u |= sign;
    memcpy(&r, &u, sizeof r);
    return r;
}

/* bf16 bits of f rounded to nearest even, NaN kept quiet: the same bits as
 * accel_f32_to_bf16, written with integer selects only so that `omp simd`
 * loops over it vectorise. ACCEL__VEC_MATH as its callers: GCC does not
 * inline between functions whose optimize attributes differ. */
ACCEL__VEC_MATH static inline uint16_t accel__bf16_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : r);
}

ACCEL__VEC_MATH static inline float accel__bf16_float(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* f rounded to bf16 and widened back (accel__bf16_float(accel__bf16_bits(f))'s
 * bits: nearest even, a NaN kept quiet), in 32-bit integer operations: a
 * loop that rounds in registers between f32 operations then stays at the
 * floats' width (through a uint16_t GCC vectorises it at twice as many lanes,
 * in pairs of registers). */
ACCEL__VEC_MATH static inline float accel__bf16_round(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    r = (u & 0x7fffffffu) > 0x7f800000u ? (u | 0x400000u) & 0xffff0000u : r;
    memcpy(&f, &r, sizeof f);
    return f;
}

/* f rounded to f16 and widened back: accel_f16_to_f32(accel_f32_to_f16(f))'s
 * bits (nearest even; from 65520 on +-inf; a NaN becomes the quiet NaN with
 * f's sign) with selects only, so that `omp simd` loops over it vectorise
 * (the scalar conversion's branches and nearbyintf keep a loop scalar). */
ACCEL__VEC_MATH static inline float accel__f16_round(float f) {
    uint32_t u, sub;
    memcpy(&u, &f, sizeof u);
    uint32_t sign = u & 0x80000000u, ax = u & 0x7fffffffu;
    /* normal results: the mantissa rounded to 10 bits (a carry moves into the exponent) */
    uint32_t r = (ax + 0xfffu + ((ax >> 13) & 1u)) & ~0x1fffu;
    /* below 2^-14, subnormal results: |f| 2^24 rounded to an integer (the
     * 1.5 2^23 shift rounds to nearest even below 2^22), times 2^-24; both
     * products exact */
    float a;
    memcpy(&a, &ax, sizeof a);
    float s = ((a * 16777216.0f + 12582912.0f) - 12582912.0f) * 5.9604644775390625e-8f;
    memcpy(&sub, &s, sizeof sub);
    r = ax < 0x38800000u ? sub : r;
    r = ax >= 0x477ff000u ? 0x7f800000u : r;
    r = ax > 0x7f800000u ? 0x7fc00000u : r;
    r |= sign;
    memcpy(&f, &r, sizeof f);
    return f;
}

/* The max of x[0..n) (-inf when n == 0; NaNs not propagated) through eight
 * running maxima: one AVX register once vectorised (a `simd
 * reduction(max)` over a float select does not vectorise with clang). */
ACCEL__VEC_MATH static inline float accel__vec_row_max(const float *x, int64_t n) {
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

#endif
