/* Device-side helpers of the CUDA kernels: element loads and stores in every
 * dtype (the conversions of src/core/dtype.c: through double, round to
 * nearest even, integer stores truncate), strided indexing, and launch
 * helpers. Included by the .cu files only. */
#ifndef ACCEL_BACKENDS_CUDA_COMMON_CUH
#define ACCEL_BACKENDS_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "cuda_internal.h"

/* A tensor's shape and element strides, passed to kernels by value. */
struct kview {
    int ndim;
    int64_t shape[ACCEL_MAX_DIMS];
    int64_t stride[ACCEL_MAX_DIMS];
};

static inline kview view_of(const accel_tensor *t) {
    kview v;
    v.ndim = t->ndim;
    for (int d = 0; d < t->ndim; d++) {
        v.shape[d] = t->shape[d];
        v.stride[d] = t->stride[d];
    }
    return v;
}

/* t seen through an output shape of `ndim` dims: right-aligned, stride 0 on
 * broadcast (size-1 or missing) dims. */
static inline kview broadcast_view(const accel_tensor *t, int ndim, const int64_t *shape) {
    kview v;
    v.ndim = ndim;
    for (int d = 0; d < ndim; d++) {
        int td = d - (ndim - t->ndim);
        v.shape[d] = shape[d];
        v.stride[d] = td >= 0 && t->shape[td] != 1 ? t->stride[td] : 0;
    }
    return v;
}

/* Element offset of the i-th element (row-major order) of a view. */
__device__ inline int64_t offset_of(const kview &v, int64_t i) {
    int64_t off = 0;
    for (int d = v.ndim - 1; d >= 0; d--) {
        int64_t s = v.shape[d];
        off += (i % s) * v.stride[d];
        i /= s;
    }
    return off;
}

__device__ inline double load_d(const void *p, accel_dtype dt, int64_t i) {
    switch (dt) {
    case ACCEL_F32: return ((const float *)p)[i];
    case ACCEL_BF16: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    case ACCEL_F16: return __half2float(((const __half *)p)[i]);
    case ACCEL_F64: return ((const double *)p)[i];
    case ACCEL_I64: return (double)((const int64_t *)p)[i];
    case ACCEL_I32: return ((const int32_t *)p)[i];
    case ACCEL_U8: return ((const uint8_t *)p)[i];
    case ACCEL_BOOL: return ((const uint8_t *)p)[i] != 0;
    case ACCEL_I8: return ((const int8_t *)p)[i];
    case ACCEL_I16: return ((const int16_t *)p)[i];
    default: return 0;
    }
}

__device__ inline float load_f(const void *p, accel_dtype dt, int64_t i) {
    return dt == ACCEL_F32 ? ((const float *)p)[i] : (float)load_d(p, dt, i);
}

__device__ inline void store_d(void *p, accel_dtype dt, int64_t i, double v) {
    switch (dt) {
    case ACCEL_F32: ((float *)p)[i] = (float)v; break;
    case ACCEL_BF16: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn((float)v); break;
    case ACCEL_F16: ((__half *)p)[i] = __float2half_rn((float)v); break;
    case ACCEL_F64: ((double *)p)[i] = v; break;
    case ACCEL_I64: ((int64_t *)p)[i] = (int64_t)v; break;
    case ACCEL_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case ACCEL_U8: ((uint8_t *)p)[i] = (uint8_t)(int64_t)v; break;
    case ACCEL_BOOL: ((uint8_t *)p)[i] = v != 0; break;
    case ACCEL_I8: ((int8_t *)p)[i] = (int8_t)(int64_t)v; break;
    case ACCEL_I16: ((int16_t *)p)[i] = (int16_t)(int64_t)v; break;
    default: break;
    }
}

__device__ inline int64_t load_i64(const void *p, accel_dtype dt, int64_t i) {
    switch (dt) {
    case ACCEL_I64: return ((const int64_t *)p)[i];
    case ACCEL_I32: return ((const int32_t *)p)[i];
    case ACCEL_I16: return ((const int16_t *)p)[i];
    case ACCEL_I8: return ((const int8_t *)p)[i];
    case ACCEL_U8: return ((const uint8_t *)p)[i];
    case ACCEL_BOOL: return ((const uint8_t *)p)[i] != 0;
    default: return (int64_t)load_d(p, dt, i);
    }
}

__device__ inline void store_i64(void *p, accel_dtype dt, int64_t i, int64_t v) {
    switch (dt) {
    case ACCEL_I64: ((int64_t *)p)[i] = v; break;
    case ACCEL_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case ACCEL_I16: ((int16_t *)p)[i] = (int16_t)v; break;
    case ACCEL_I8: ((int8_t *)p)[i] = (int8_t)v; break;
    case ACCEL_U8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    case ACCEL_BOOL: ((uint8_t *)p)[i] = v != 0; break;
    default: store_d(p, dt, i, (double)v); break;
    }
}

/* ---- launches */

enum { KTHREADS = 256 };

/* Blocks for a grid-stride loop over n items. */
static inline unsigned blocks_for(int64_t n) {
    int64_t b = (n + KTHREADS - 1) / KTHREADS;
    return (unsigned)(b < 65535 * 8 ? (b > 0 ? b : 1) : 65535 * 8);
}

#define GRID_STRIDE(i, n) \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

/* Block-wide reductions (blockDim.x a multiple of 32, at most 1024). Every
 * thread of the block must call them; every thread gets the result. */
__device__ inline float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ inline float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ inline float block_sum(float v) {
    __shared__ float part[32];
    __syncthreads(); /* part[] may still be read by a previous call */
    v = warp_sum(v);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
    __syncthreads();
    int nw = (int)(blockDim.x >> 5);
    v = (int)threadIdx.x < nw ? part[threadIdx.x] : 0.0f;
    if (threadIdx.x < 32) part[threadIdx.x] = warp_sum(v);
    __syncthreads();
    return part[0];
}

__device__ inline float block_max(float v) {
    __shared__ float part[32];
    __syncthreads();
    v = warp_max(v);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
    __syncthreads();
    int nw = (int)(blockDim.x >> 5);
    v = (int)threadIdx.x < nw ? part[threadIdx.x] : -INFINITY;
    if (threadIdx.x < 32) part[threadIdx.x] = warp_max(v);
    __syncthreads();
    return part[0];
}

/* Blocks of one row each: rows beyond the grid limit loop. */
#define ROW_LOOP(r, rows) for (int64_t r = blockIdx.x; r < (rows); r += gridDim.x)

static inline unsigned row_blocks(int64_t rows) { return (unsigned)(rows < 65535 * 8 ? (rows > 0 ? rows : 1) : 65535 * 8); }

/* The status of the kernel just launched by `op` on device index. */
static inline accel_status launched(int index, const char *op) {
    return accel__cuda_check(cudaGetLastError(), index, op);
}

#endif
