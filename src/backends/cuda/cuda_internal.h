/* Internals of the CUDA backend shared by its host code (.c, gcc) and its
 * kernels (.cu, nvcc). Not public API. */
#ifndef ACCEL_BACKENDS_CUDA_INTERNAL_H
#define ACCEL_BACKENDS_CUDA_INTERNAL_H

#include <cuda_runtime_api.h>

#include "core/backend.h"
#include "backends/fp8.h"

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

/* A new event on device index (made current), without timing, counted in
 * accel__cuda_events_created; on failure the error names op. */
accel_status accel__cuda_event_new(int index, cudaEvent_t *e, const char *op);
/* Events made on device index so far (the event pool's and the virtual
 * memory's fences): steady steps make none. */
long accel__cuda_events_created(int index);

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
/* Releases device index's cached (free) blocks to the device: the virtual
 * memory's cuMemCreate ran out of memory. Takes the allocator's lock. */
void accel__cuda_release_cached(int index);
/* Bytes cudaMalloc'd and held (in use or cached) on device index. */
size_t accel__cuda_reserved_bytes(int index);
/* Virtual memory (vm.c): the backend's vm_* entries (backend.h). */
size_t accel__cuda_vm_granularity(int index);
void *accel__cuda_vm_reserve(int index, size_t bytes);
void accel__cuda_vm_release(int index, void *p, size_t bytes);
accel_status accel__cuda_vm_map(int index, void *p, size_t bytes);
accel_status accel__cuda_vm_unmap(int index, void *p, size_t bytes);

/* The kernels this backend has (the table in cuda_backend.c lists them):
 * every entry of core/kernels.h but the convolution, BatchNorm and pooling
 * ones (test_cuda_kernels' test_missing_reported lists them). An entry
 * added there stays NULL here until its kernel exists (the op then names it
 * as missing). */
#define ACCEL__CUDA_KERNELS(X)                                                             \
    X(copy, accel_k_copy) X(fill, accel_k_fill) X(accumulate, accel_k_accumulate)           \
    X(rng, accel_k_rng) X(binary, accel_k_binary) X(unary, accel_k_unary)                  \
    X(unary_grad, accel_k_unary_grad) X(swiglu, accel_k_swiglu)                            \
    X(swiglu_backward, accel_k_swiglu_backward) X(mask_scale, accel_k_mask_scale) X(sum, accel_k_sum) \
    X(max, accel_k_max) X(max_backward, accel_k_max_backward) X(gemm, accel_k_gemm)         \
    X(bias_rows, accel_k_bias_rows) X(col_sum, accel_k_col_sum) X(softmax, accel_k_softmax)  \
    X(softmax_backward, accel_k_softmax_backward) X(rope_tables, accel_k_rope_tables)       \
    X(rope, accel_k_rope) X(embedding, accel_k_embedding)                                   \
    X(embedding_backward, accel_k_embedding_backward) X(rms_norm, accel_k_rms_norm)         \
    X(rms_norm_backward, accel_k_rms_norm_backward) X(layer_norm, accel_k_layer_norm)       \
    X(layer_norm_backward, accel_k_layer_norm_backward)                                     \
    X(cross_entropy, accel_k_cross_entropy)                                                 \
    X(cross_entropy_backward, accel_k_cross_entropy_backward)                               \
    X(cross_entropy_fused, accel_k_cross_entropy_fused) X(mse, accel_k_mse)                 \
    X(mse_backward, accel_k_mse_backward) X(compare, accel_k_compare) X(where, accel_k_where)     \
    X(sdpa, accel_k_sdpa) X(sdpa_backward, accel_k_sdpa_backward) X(sgd, accel_k_sgd)        \
    X(adam, accel_k_adam) X(norm_partial, accel_k_norm_partial) X(unscale, accel_k_unscale)
#define ACCEL__CUDA_KERNEL_DECL(name, T) accel_status accel__cudak_##name(T *args);
ACCEL__CUDA_KERNELS(ACCEL__CUDA_KERNEL_DECL)
#undef ACCEL__CUDA_KERNEL_DECL

/* Input checks without a host synchronisation (checks.cu): the ops whose
 * kernels skip bad ids or targets and report the first one. */
typedef enum accel__cuda_check_op {
    ACCEL_CUDA_CHECK_EMBEDDING = 1,
    ACCEL_CUDA_CHECK_CROSS_ENTROPY,
    ACCEL_CUDA_CHECK_CROSS_ENTROPY_FUSED,
} accel__cuda_check_op;
const char *accel__cuda_check_op_name(accel__cuda_check_op op);
/* Enqueued on s after the op's kernels: *bad (device) is the first bad
 * position they found (INT64_MAX: none), values[*bad] the bad value, limit
 * the bound it broke; the first report of the device is kept and mirrored
 * to the host, without a host wait. */
accel_status accel__cuda_check_report(int index, cudaStream_t s, accel__cuda_check_op op, const long long *bad,
                                      const int64_t *values, int64_t limit);
/* Called after each synchronisation of device index through the backend:
 * the error of the first bad input reported since the last call (naming the
 * op, position, value and bound; the report is then cleared), else ACCEL_OK. */
accel_status accel__cuda_check_pending(int index);

/* C[M, N] (leading dim ldc, of dtype dt: f32, bf16 or f16) = beta C (0
 * overwrites NaNs), + bias[N] (f32, device) in every row unless NULL, in
 * f32 rounded once into C: a GEMM with K = 0. */
accel_status accel__cuda_scale_rows(int index, void *c, accel_dtype dt, int64_t M, int64_t N, int64_t ldc, float beta,
                                    const float *bias);
/* GEMM signatures whose cuBLASLt plan (descriptors, layouts, algorithm)
 * gemm.c keeps, over all devices (tests check repeats reuse them). */
int accel__cuda_gemm_plans(void);

/* ---- fp8 (fp8.cu, gemm.c): the backend's accel__fp8_ops (backends/fp8.h
 * says what each does; cuda_plugin.c fills the table). */
accel_status accel__cuda_fp8_quantize(int index, uint8_t *q, uint8_t *q_t, const float *x, int64_t rows,
                                      int64_t cols, accel__fp8_format f, const float *scale, const float *scale_inv,
                                      float *amax, float *inv_out);
accel_status accel__cuda_fp8_quantize_cached(int index, uint8_t *q, uint8_t *q_t, const float *x, int64_t rows,
                                             int64_t cols, accel__fp8_format f, const float *scale,
                                             const float *scale_inv, float *amax, float *inv_out, float *cache,
                                             bool fresh);
accel_status accel__cuda_fp8_update(int index, float *meta, int first, int n, accel__fp8_recipe r);
typedef accel__fp8_gemm_args accel__cuda_fp8_args;
accel_status accel__cuda_fp8_gemm(int index, const accel__cuda_fp8_args *g);
extern const accel__fp8_ops accel__cuda_fp8_ops; /* cuda_plugin.c */

/* Why there is no usable CUDA device ("" when there is one): for accel env. */
const char *accel__cuda_unavailable_reason(void);
/* Registers the backend when a GPU is present (the plug-in's init,
 * cuda_plugin.c). */
void accel__cuda_register(void);

#ifdef __cplusplus
}
#endif

#endif
