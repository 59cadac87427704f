/* Device-side helpers of the CUDA kernels: element loads (the conversions of
 * core/dtype_elem.h, shared with the host), strided indexing, and launch
 * helpers. Included by the .cu files only. */
#ifndef ACCEL_BACKENDS_CUDA_COMMON_CUH
#define ACCEL_BACKENDS_CUDA_COMMON_CUH

#include <math.h>
#include <stdint.h>

#include "core/dtype_elem.h"
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

/* Element loads and stores in every dtype are core/dtype_elem.h's
 * (accel__elem_get/set, accel__load_i64/store_i64), the host's own functions;
 * load_f keeps f32 loads free of the dtype switch's double round trip. */
__device__ inline float load_f(const void *p, accel_dtype dt, int64_t i) {
    return dt == ACCEL_F32 ? ((const float *)p)[i] : (float)accel__elem_get(p, dt, i);
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
