/* The CUDA calls whose failures decide what the backend does next (an
 * allocation's retry and its message, an event's "not ready", cuBLASLt's
 * "no algorithm"), and those of the NCCL backend's staging (dist/nccl_stage.h:
 * which memory its copies touch), reached through one table so that a test
 * can replace them: on a machine without a GPU (or with one) a test sets an
 * entry to a fake that returns the error it wants to see handled (or looks
 * at the pointers it is given), runs the host logic, and puts the entry back
 * (tests/test_cuda_failures.c). Production never changes the table: each
 * entry is the CUDA function itself. Not public API. */
#ifndef ACCEL_BACKENDS_CUDA_CALLS_H
#define ACCEL_BACKENDS_CUDA_CALLS_H

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct accel__cuda_calls {
    cudaError_t (*malloc)(void **p, size_t bytes);
    cudaError_t (*free)(void *p);
    cudaError_t (*host_alloc)(void **p, size_t bytes, unsigned flags);
    cudaError_t (*free_host)(void *p);
    cudaError_t (*pointer_attributes)(struct cudaPointerAttributes *a, const void *p);
    cudaError_t (*memcpy_async)(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t s);
    cudaError_t (*event_query)(cudaEvent_t e);
    /* the runtime's pending error: cudaPeekAtLastError, cudaGetLastError */
    cudaError_t (*peek_error)(void);
    cudaError_t (*take_error)(void);
    cublasStatus_t (*lt_create)(cublasLtHandle_t *h);
    cublasStatus_t (*lt_heuristic)(cublasLtHandle_t h, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,
                                   cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                   cublasLtMatmulPreference_t pref, int requested,
                                   cublasLtMatmulHeuristicResult_t results[], int *found);
} accel__cuda_calls;

extern accel__cuda_calls accel__cuda_call;

/* One look at event e: cudaSuccess when its work is done, cudaErrorNotReady
 * while it runs, else the error that stopped the device. "Not ready" is no
 * error: it is taken off the runtime's pending error (some runtimes leave
 * it there, and the next kernel's launch check would report it), but only
 * when it is what is pending, so another pending error stays for the call
 * it belongs to. */
cudaError_t accel__cuda_event_poll(cudaEvent_t e);

#ifdef __cplusplus
}
#endif

#endif
