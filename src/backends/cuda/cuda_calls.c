/* The table of cuda_calls.h: the CUDA functions themselves. */
#include "cuda_calls.h"

accel__cuda_calls accel__cuda_call = {
    .malloc = cudaMalloc,
    .free = cudaFree,
    .host_alloc = cudaHostAlloc,
    .free_host = cudaFreeHost,
    .pointer_attributes = cudaPointerGetAttributes,
    .memcpy_async = cudaMemcpyAsync,
    .event_query = cudaEventQuery,
    .peek_error = cudaPeekAtLastError,
    .take_error = cudaGetLastError,
    .lt_create = cublasLtCreate,
    .lt_heuristic = cublasLtMatmulAlgoGetHeuristic,
};

cudaError_t accel__cuda_event_poll(cudaEvent_t e) {
    cudaError_t r = accel__cuda_call.event_query(e);
    if (r == cudaErrorNotReady && accel__cuda_call.peek_error() == cudaErrorNotReady) accel__cuda_call.take_error();
    return r;
}
