/* The NCCL backend's staging of host buffers (nccl_stage.h). */
#include "nccl_stage.h"

#include <string.h>

#include "backends/cuda/cuda_calls.h"

bool accel__nccl_on_device(const void *p) {
    struct cudaPointerAttributes a;
    if (!p || accel__cuda_call.pointer_attributes(&a, p) != cudaSuccess) {
        accel__cuda_call.take_error();
        return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

cudaError_t accel__nccl_stage_reserve(accel__nccl_stage *st, size_t bytes) {
    if (st->dev && bytes <= st->bytes) return cudaSuccess;
    accel__nccl_stage_free(st);
    cudaError_t e = accel__cuda_call.malloc((void **)&st->dev, bytes ? bytes : 1);
    if (e == cudaSuccess) e = accel__cuda_call.host_alloc((void **)&st->host, bytes ? bytes : 1, cudaHostAllocDefault);
    if (e != cudaSuccess) {
        accel__nccl_stage_free(st);
        return e;
    }
    st->bytes = bytes;
    return cudaSuccess;
}

void accel__nccl_stage_free(accel__nccl_stage *st) {
    if (st->dev) accel__cuda_call.free(st->dev);
    if (st->host) accel__cuda_call.free_host(st->host);
    *st = (accel__nccl_stage){0};
}

cudaError_t accel__nccl_copy(cudaStream_t s, void *dst, const void *src, size_t n) {
    return n ? accel__cuda_call.memcpy_async(dst, src, n, cudaMemcpyDefault, s) : cudaSuccess;
}

cudaError_t accel__nccl_put(const accel__nccl_stage *st, cudaStream_t s, size_t off, const void *src, size_t n) {
    if (accel__nccl_on_device(src)) return accel__nccl_copy(s, st->dev + off, src, n);
    if (n) memcpy(st->host + off, src, n);
    return accel__nccl_copy(s, st->dev + off, st->host + off, n);
}

cudaError_t accel__nccl_get(const accel__nccl_stage *st, cudaStream_t s, void *dst, size_t off, size_t n) {
    return accel__nccl_copy(s, accel__nccl_on_device(dst) ? dst : st->host + off, st->dev + off, n);
}

void accel__nccl_take(const accel__nccl_stage *st, void *dst, size_t off, size_t n) {
    if (n && !accel__nccl_on_device(dst)) memcpy(dst, st->host + off, n);
}
