/* fp8 casts with their amax, and the delayed-scaling update on the device
 * (backends/fp8.h). The casts use the GPU's conversion instructions
 * (saturating, round to nearest even); the GPU test checks them against
 * fp8.h's software conversions. */
#include <cuda_fp8.h>

#include "cuda_common.cuh"

__device__ inline uint8_t to_fp8(float v, accel__fp8_format f) {
    return (uint8_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, f == ACCEL_FP8_E4M3 ? __NV_E4M3 : __NV_E5M2);
}

/* amax: one integer atomicMax per warp on the f32 bits (they order as
 * integers for values >= 0); a NaN of x is not counted. Thread 0 also keeps
 * the scale_inv this cast used (*inv_out). */
__global__ void fp8_quantize_k(uint8_t *q, uint8_t *qt, const float *x, int64_t rows, int64_t cols,
                               accel__fp8_format f, const float *scale, const float *scale_inv, float *amax,
                               float *inv_out) {
    const float s = *scale;
    float m = 0.0f;
    GRID_STRIDE(i, rows * cols) {
        float v = x[i];
        m = fmaxf(m, fabsf(v));
        uint8_t b = to_fp8(v * s, f);
        if (q) q[i] = b;
        if (qt) qt[(i % cols) * rows + i / cols] = b;
    }
    m = warp_max(m);
    if ((threadIdx.x & 31) == 0) atomicMax((unsigned int *)amax, __float_as_uint(m));
    if (inv_out && blockIdx.x == 0 && threadIdx.x == 0) *inv_out = *scale_inv;
}

extern "C" accel_status accel__cuda_fp8_quantize(int index, uint8_t *q, uint8_t *q_t, const float *x, int64_t rows,
                                                 int64_t cols, accel__fp8_format f, const float *scale,
                                                 const float *scale_inv, float *amax, float *inv_out) {
    if (!rows || !cols) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    fp8_quantize_k<<<blocks_for(rows * cols), KTHREADS, 0, s>>>(q, q_t, x, rows, cols, f, scale, scale_inv, amax,
                                                                inv_out);
    return launched(index, "fp8_quantize");
}

/* A cached weight cast (backends/fp8.h): every block decides from the scale
 * (cache[0] is only written by the commit after it), a recast's amax is
 * gathered in the scratch cache[2]; the commit, one thread after it in
 * stream order, keeps the new scale and amax, clears the scratch and records
 * the cached amax and the scale_inv as an uncached cast would. */
__global__ void fp8_cached_cast_k(uint8_t *q, uint8_t *qt, const float *x, int64_t rows, int64_t cols,
                                  accel__fp8_format f, const float *scale, float *cache, bool fresh) {
    const float s = *scale;
    if (!fresh && s == cache[0]) return;
    float m = 0.0f;
    GRID_STRIDE(i, rows * cols) {
        float v = x[i];
        m = fmaxf(m, fabsf(v));
        uint8_t b = to_fp8(v * s, f);
        q[i] = b;
        qt[(i % cols) * rows + i / cols] = b;
    }
    m = warp_max(m);
    if ((threadIdx.x & 31) == 0) atomicMax((unsigned int *)(cache + 2), __float_as_uint(m));
}

__global__ void fp8_cached_commit_k(const float *scale, const float *scale_inv, float *amax, float *inv_out,
                                    float *cache, bool fresh) {
    if (fresh || *scale != cache[0]) cache[0] = *scale, cache[1] = cache[2];
    cache[2] = 0.0f;
    *amax = fmaxf(*amax, cache[1]);
    *inv_out = *scale_inv;
}

extern "C" accel_status accel__cuda_fp8_quantize_cached(int index, uint8_t *q, uint8_t *q_t, const float *x,
                                                        int64_t rows, int64_t cols, accel__fp8_format f,
                                                        const float *scale, const float *scale_inv, float *amax,
                                                        float *inv_out, float *cache, bool fresh) {
    if (!rows || !cols) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    fp8_cached_cast_k<<<blocks_for(rows * cols), KTHREADS, 0, s>>>(q, q_t, x, rows, cols, f, scale, cache, fresh);
    accel_status st = launched(index, "fp8_cached_cast");
    if (st != ACCEL_OK) return st;
    fp8_cached_commit_k<<<1, 1, 0, s>>>(scale, scale_inv, amax, inv_out, cache, fresh);
    return launched(index, "fp8_cached_commit");
}

/* One thread per slot: a history is at most a few thousand floats. */
__global__ void fp8_update_k(float *meta, int first, int n, accel__fp8_recipe r) {
    int slot = first + (int)threadIdx.x;
    if ((int)threadIdx.x < n) accel__fp8_update(meta, slot, r);
}

extern "C" accel_status accel__cuda_fp8_update(int index, float *meta, int first, int n, accel__fp8_recipe r) {
    if (n <= 0) return ACCEL_OK;
    cudaStream_t st = accel__cuda_enter(index);
    fp8_update_k<<<1, ACCEL__FP8_SLOTS, 0, st>>>(meta, first, n, r);
    return launched(index, "fp8_update");
}
