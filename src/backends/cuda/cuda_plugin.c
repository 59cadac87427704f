/* The cuda plug-in's entry (backends/plugin.h): libaccel-cuda.so holds the CUDA
 * device backend and the NCCL process-group backend, and registers both
 * through the core's tables when the loader calls accel_backend_cuda_init:
 * the device backend only when a GPU is present (cuda_backend.c), nccl
 * always (its init names the missing GPU). */
#include <stdio.h>

#include "backends/cuda/cuda_env.h"
#include "backends/cuda/cuda_hooks.h"
#include "cuda_internal.h"
#include "backends/plugin.h"

/* fp8 needs compute capability 8.9 (Ada Lovelace, Hopper) and later. */
static accel_status fp8_check(int index, const char *op) {
    int major = 0, minor = 0;
    char name[128] = "";
    if (!accel__cuda_capability(index, &major, &minor, name, sizeof name))
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: fp8 mixed precision: cuda:%d cannot be queried", op, index);
    if (major * 10 + minor < 89)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED,
                               "%s: fp8 mixed precision is not supported on cuda:%d (%s, compute capability %d.%d): "
                               "it needs compute capability >= 8.9 (Ada Lovelace, Hopper); use bf16 or fp16",
                               op, index, name, major, minor);
    return ACCEL_OK;
}

const accel__fp8_ops accel__cuda_fp8_ops = {
    .check = fp8_check,
    .quantize = accel__cuda_fp8_quantize,
    .quantize_cached = accel__cuda_fp8_quantize_cached,
    .update = accel__cuda_fp8_update,
    .gemm = accel__cuda_fp8_gemm,
};

static bool host_pinned(const void *p) {
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return a.type == cudaMemoryTypeHost;
}

static const accel__cuda_hooks hooks = {
    .reserved_bytes = accel__cuda_reserved_bytes,
    .gemm_plans = accel__cuda_gemm_plans,
    .host_pinned = host_pinned,
    .events_created = accel__cuda_events_created,
};

ACCEL__PLUGIN_EXPORT const accel__plugin_abi accel_backend_cuda_abi = {
    ACCEL__PLUGIN_ABI_VERSION, ACCEL__PLUGIN_LAYOUT, ACCEL_VERSION_STRING};

ACCEL__PLUGIN_EXPORT accel_status accel_backend_cuda_init(const accel__plugin_host *host, accel__plugin_info *info) {
    ACCEL__PLUGIN_SHIMS_INIT(host);
#ifdef ACCEL_HAVE_NCCL
    if (accel__pg_backend_register(&accel__backend_nccl) != ACCEL_OK) return accel_last_status();
#endif
    accel__cuda_register(); /* when a GPU is present */
    *info = (accel__plugin_info){
        .unavailable = accel__cuda_unavailable_reason, .describe = accel__cuda_env_print, .hooks = &hooks};
    return ACCEL_OK;
}
