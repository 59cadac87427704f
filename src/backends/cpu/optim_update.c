/* The Adam / AdamW update loop, compiled once per ISA variant
 * (cpu_variants.h): sqrt and the two divisions of every parameter run 16
 * wide on AVX-512 and 8 on AVX2, where the library's baseline compile runs
 * them 4 wide. No multiply-add is fused (GCC fuses none in ISO C mode;
 * clang's default would, in the variants with FMA, hence the pragma) but
 * Adam's L2 term, which torch fuses, computed in double: every
 * variant computes each element with the same IEEE operations in the same
 * order and gives the same bits (test_optim checks the kernel against a
 * scalar loop under every ISA cap). AdamW was ~2% of the bf16 Llama step's
 * CPU on Zen 5, its baseline loop bound by the divisions rather than memory
 * (bench/results/bf16_step_ab.md). The update also refreshes the weight's
 * autocast copy when asked (kernels.h: accel_k_adam's cast), block by block
 * while the block is in cache: one pass over the weight where a conversion
 * at the next forward read it again from memory. */
#include "cpu_kernels.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* Elements a thread updates before rounding them into the cast: the
 * block is still in L1 when it is read again. */
enum { CAST_BLOCK = 2048 };

static void adam_run(const accel__adam_coef *c, float *p, float *m, float *v, const float *g, int64_t n) {
    const float step_size = c->step_size, bc2_sqrt = c->bc2_sqrt, w1 = c->w1, b2 = c->b2, w2 = c->w2;
    const float eps = c->eps, decay = c->decay, l2 = c->l2;
    /* lerp(m, g, w1) as PyTorch computes it: m + w1 * (g - m) for w1 < 0.5,
     * else g - (g - m) * (1 - w1), which differs beyond rounding where g is
     * infinite (beta1 0: inf - inf * 0 is NaN, the other form inf). */
    const bool lerp_from_m = w1 < 0.5f;
    const float lerp_coef = lerp_from_m ? w1 : w1 - 1.0f;
    /* Branch-free so the loop vectorises: AdamW decays the parameter
     * (p *= 1 - lr*wd), Adam adds wd*p to the gradient (L2), only for a weight
     * decay (as torch: 0 * an infinite parameter would be NaN). */
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        float pi = p[i];
        float gi = l2 != 0.0f ? (float)((double)l2 * pi + g[i]) : g[i]; /* fused, as SGD's (optim_kernels.c) */
        pi *= decay;
        m[i] = (lerp_from_m ? m[i] : gi) + lerp_coef * (gi - m[i]);
        v[i] = v[i] * b2 + w2 * gi * gi;
        float denom = sqrtf(v[i]) / bc2_sqrt + eps;
        p[i] = pi + -step_size * m[i] / denom; /* addcdiv_: (value * m) / denom, as torch */
    }
}

/* p[0, n) rounded to cast_dt into cast from element off (cast_store: cast_dt,
 * or f32 holding the rounded values), through the conversions accel_copy_
 * uses, so the bits are a conversion's. */
static void round_into(void *cast, accel_dtype cast_store, accel_dtype cast_dt, int64_t off, const float *p,
                       int64_t n) {
    if (cast_store != ACCEL_F32) {
        accel__cpu_from_f32((char *)cast + off * (int64_t)accel_dtype_size(cast_store), cast_store, p, n);
        return;
    }
    uint16_t r[CAST_BLOCK];
    accel__cpu_from_f32(r, cast_dt, p, n);
    accel__cpu_to_f32((float *)cast + off, r, cast_dt, n);
}

void accel__cpu_adam_update(const accel__adam_coef *c, float *p, float *m, float *v, const float *g, int64_t n,
                            void *cast, accel_dtype cast_store, accel_dtype cast_dt) {
    int64_t blocks = (n + CAST_BLOCK - 1) / CAST_BLOCK;
#pragma omp parallel for if (n > 65536) schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        int64_t off = b * CAST_BLOCK, len = n - off < CAST_BLOCK ? n - off : CAST_BLOCK;
        adam_run(c, p + off, m + off, v + off, g + off, len);
        if (cast) round_into(cast, cast_store, cast_dt, off, p + off, len);
    }
}
