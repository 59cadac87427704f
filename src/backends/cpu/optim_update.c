/* The Adam / AdamW update loop, compiled once per ISA variant
 * (cpu_variants.h): sqrt and the two divisions of every parameter run 16
 * wide on AVX-512 and 8 on AVX2, where the library's baseline compile runs
 * them 4 wide. No multiply-add is fused (GCC fuses none in ISO C mode;
 * clang's default would, in the variants with FMA, hence the pragma): every
 * variant computes each element with the same IEEE operations in the same
 * order and gives the same bits (test_optim checks the kernel against a
 * scalar loop under every ISA cap). AdamW was ~2% of the bf16 Llama step's
 * CPU on Zen 5, its baseline loop bound by the divisions rather than memory
 * (bench/results/bf16_step_ab.md). */
#include "cpu_kernels.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

void accel__cpu_adam_update(const accel__adam_coef *c, float *p, float *m, float *v, const float *g, int64_t n) {
    const float step_size = c->step_size, bc2_sqrt = c->bc2_sqrt, w1 = c->w1, b2 = c->b2, w2 = c->w2;
    const float eps = c->eps, decay = c->decay, l2 = c->l2;
    /* Branch-free so the loop vectorises: AdamW decays the parameter
     * (p *= 1 - lr*wd), Adam adds wd*p to the gradient (L2). */
#pragma omp parallel for simd if (n > 65536) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float pi = p[i];
        float gi = g[i] + l2 * pi;
        pi *= decay;
        m[i] += w1 * (gi - m[i]); /* lerp(m, g, 1 - beta1) as PyTorch computes it */
        v[i] = v[i] * b2 + w2 * gi * gi;
        float denom = sqrtf(v[i]) / bc2_sqrt + eps;
        p[i] = pi + -step_size * (m[i] / denom);
    }
}
