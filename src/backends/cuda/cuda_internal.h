/* Internals of the CUDA backend shared by its host code (.c, gcc) and its
 * kernels (.cu, nvcc). Not public API. */
#ifndef ACCEL_BACKENDS_CUDA_INTERNAL_H
#define ACCEL_BACKENDS_CUDA_INTERNAL_H

#include <cuda_runtime_api.h>

#include "backends/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { ACCEL_CUDA_MAX_DEVICES = 16 };

/* Sets the thread's error "cuda:<index>: <op>: <CUDA's message>" and returns
 * it when e is an error; ACCEL_OK otherwise. */
accel_status accel__cuda_check(cudaError_t e, int index, const char *op);

/* Makes `index` the calling thread's current CUDA device and returns the
 * thread's current stream on it (set_stream; 0, the legacy default stream,
 * when none was set). */
cudaStream_t accel__cuda_enter(int index);

/* The caching allocator (allocator.c): device memory handed out in size
 * classes and kept on free for reuse, so that steady-state steps never call
 * cudaMalloc. Freed blocks are reused in the order of the stream they are
 * used on (as PyTorch's allocator without record_stream). */
void *accel__cuda_alloc(int index, size_t bytes, size_t align);
void accel__cuda_free(int index, void *p);
/* The calling thread's step pool of device `index` (bump allocation from
 * chunks of the caching allocator; reset keeps one chunk of the high water). */
void *accel__cuda_step_alloc(int index, size_t bytes, size_t align);
void accel__cuda_step_reset(int index);
/* Bytes cudaMalloc'd and held (in use or cached) on device index. */
size_t accel__cuda_reserved_bytes(int index);

/* The kernels this backend has (one per file of kernels; the table in
 * cuda_backend.c lists them). */
#define ACCEL__CUDA_KERNELS(X)                                                             \
    X(copy, accel_k_copy) X(fill, accel_k_fill) X(accumulate, accel_k_accumulate)           \
    X(rng, accel_k_rng) X(binary, accel_k_binary) X(unary, accel_k_unary)                  \
    X(unary_grad, accel_k_unary_grad) X(mask_scale, accel_k_mask_scale) X(sum, accel_k_sum) \
    X(max, accel_k_max) X(max_backward, accel_k_max_backward) X(gemm, accel_k_gemm)         \
    X(bias_rows, accel_k_bias_rows) X(col_sum, accel_k_col_sum) X(softmax, accel_k_softmax)  \
    X(softmax_backward, accel_k_softmax_backward) X(rope_tables, accel_k_rope_tables)       \
    X(rope, accel_k_rope) X(embedding, accel_k_embedding)                                   \
    X(embedding_backward, accel_k_embedding_backward) X(rms_norm, accel_k_rms_norm)         \
    X(rms_norm_backward, accel_k_rms_norm_backward) X(layer_norm, accel_k_layer_norm)       \
    X(layer_norm_backward, accel_k_layer_norm_backward)                                     \
    X(cross_entropy, accel_k_cross_entropy)                                                 \
    X(cross_entropy_backward, accel_k_cross_entropy_backward) X(mse, accel_k_mse)           \
    X(mse_backward, accel_k_mse_backward)
#define ACCEL__CUDA_KERNEL_DECL(name, T) accel_status accel__cudak_##name(T *args);
ACCEL__CUDA_KERNELS(ACCEL__CUDA_KERNEL_DECL)
#undef ACCEL__CUDA_KERNEL_DECL

/* C[M, N] (leading dim ldc, f32) *= beta (0 overwrites NaNs): a GEMM with K = 0. */
accel_status accel__cuda_scale_rows(int index, float *c, int64_t M, int64_t N, int64_t ldc, float beta);

/* Why there is no usable CUDA device ("" when there is one): for accel env. */
const char *accel__cuda_unavailable_reason(void);
/* Registers the backend when a GPU is present (device.c, at start-up). */
void accel__cuda_register(void);

#ifdef __cplusplus
}
#endif

#endif
