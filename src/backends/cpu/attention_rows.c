/* The row loops of attention's softmax and of its gradient, compiled once per
 * ISA variant (cpu_variants.h): the exponentials of vec_math.h's accel__expf
 * run 16 wide on AVX-512 and 8 on AVX2 with FMA, where the library's
 * baseline compile (row_math.c) runs them 4 wide without FMA. A score row is
 * 64 to a few thousand floats, so a dispatch per row costs nothing that
 * shows; the exponentials were ~2% of the bf16 Llama step's CPU on Zen 5
 * (bench/results/bf16_step_ab.md). */
#include "cpu_kernels.h"
#include "vec_math.h"

/* dst = softmax(scale src), scale > 0 (so scale max(src) is the scaled
 * row's max), *lse = max + log(sum); dst may be src. With scale 1 the same
 * values as without one. */
ACCEL__VEC_MATH void accel__cpu_softmax_row(float *dst, const float *src, int64_t n, float scale, float *lse) {
    float m = scale * accel__vec_row_max(src, n), s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < n; j++) {
        float e = accel__expf(scale * src[j] - m);
        dst[j] = e;
        s += e;
    }
    float inv = 1.0f / s;
#pragma omp simd
    for (int64_t j = 0; j < n; j++) dst[j] *= inv;
    *lse = m + logf(s);
}

/* dst = exp(scale src - lse): the backward's probabilities from the
 * forward's lse (the max is in lse, so no exponent exceeds ~0). */
ACCEL__VEC_MATH void accel__cpu_probs_row(float *dst, const float *src, int64_t n, float scale, float lse) {
#pragma omp simd
    for (int64_t j = 0; j < n; j++) dst[j] = accel__expf(scale * src[j] - lse);
}

void accel__cpu_softmax_grad_row(const float *p, float *g, int64_t n, float delta, float scale) {
#pragma omp simd
    for (int64_t j = 0; j < n; j++) g[j] = p[j] * (g[j] - delta) * scale;
}
