/* The NCCL backend's staging of host buffers (nccl.c): NCCL reads and writes
 * device memory, so a host buffer goes through a device buffer and a pinned
 * host buffer of the same layout. Every copy enqueued on the communication
 * stream has a device side and a device or pinned side: a copy between
 * device and pageable memory is synchronous, the host waiting inside
 * cudaMemcpyAsync for the stream (after the collective's kernel: forever
 * when a peer is dead), where it must instead poll the collective, which
 * sees the timeout and a peer's failure. The host side (user buffer <->
 * pinned) is a memcpy before the enqueue and after the poll. The CUDA calls
 * go through the backend's call table (backends/cuda/cuda_calls.h), so that
 * tests/test_cuda_failures.c checks, without a GPU, that no copy has a
 * pageable side. Not public API. */
#ifndef ACCEL_DIST_NCCL_STAGE_H
#define ACCEL_DIST_NCCL_STAGE_H

#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct accel__nccl_stage {
    char *dev;    /* device staging buffer */
    char *host;   /* pinned host staging of the same bytes, same offsets */
    size_t bytes; /* of each */
} accel__nccl_stage;

/* p is device (or managed) memory of the CUDA runtime. */
bool accel__nccl_on_device(const void *p);
/* Both buffers of at least `bytes` on the current device (kept when large
 * enough); on failure both are freed and the error returned. */
cudaError_t accel__nccl_stage_reserve(accel__nccl_stage *st, size_t bytes);
void accel__nccl_stage_free(accel__nccl_stage *st);
/* n bytes between device or pinned buffers, enqueued on stream s.
 * cudaMemcpyDefault: one side of a collective may be on the device and the
 * other on the host (a device send and a host recv stage both), and a kind
 * that does not match the pointers is undefined behaviour; with unified
 * addressing CUDA finds the direction itself. */
cudaError_t accel__nccl_copy(cudaStream_t s, void *dst, const void *src, size_t n);
/* Input: n bytes of src (host or device) into the device stage at off; a
 * host src through the pinned stage. */
cudaError_t accel__nccl_put(const accel__nccl_stage *st, cudaStream_t s, size_t off, const void *src, size_t n);
/* Output, enqueued: n bytes of the device stage at off to dst when dst is
 * device memory, else to the pinned stage, from which accel__nccl_take
 * copies them to dst once the collective is done. */
cudaError_t accel__nccl_get(const accel__nccl_stage *st, cudaStream_t s, void *dst, size_t off, size_t n);
void accel__nccl_take(const accel__nccl_stage *st, void *dst, size_t off, size_t n);

#endif
