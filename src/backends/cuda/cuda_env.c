/* `accel env`'s CUDA lines: what the CUDA backend of this build finds. */
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#ifdef ACCEL_HAVE_NCCL
#include <nccl.h>
#endif

#include "cuda_env.h"
#include "cuda_internal.h"

/* CUDA's version integers: 1000 major + 10 minor. */
static void print_version(FILE *out, const char *what, int v) {
    fprintf(out, "- %s: %d.%d\n", what, v / 1000, (v % 1000) / 10);
}

/* n: the GPUs the backend found; NCCL is usable only with one. */
static void print_libraries(FILE *out, int n) {
    size_t lt = cublasLtGetVersion(); /* major * 10000 + minor * 100 + patch */
    fprintf(out, "- cuBLASLt version: %zu.%zu.%zu\n", lt / 10000, (lt / 100) % 100, lt % 100);
#ifdef ACCEL_HAVE_NCCL
    int nv = 0;
    if (ncclGetVersion(&nv) != ncclSuccess) /* major * 10000 + minor * 100 + patch (NCCL >= 2.9) */
        fprintf(out, "- NCCL available: False (ncclGetVersion failed)\n");
    else
        fprintf(out, "- NCCL available: %s (version %d.%d.%d%s)\n", n > 0 ? "True" : "False", nv / 10000,
                (nv / 100) % 100, nv % 100, n > 0 ? "" : "; no GPU to run it on");
#else
    fprintf(out, "- NCCL available: False (this build found no NCCL)\n");
#endif
}

void accel__cuda_env_print(FILE *out) {
    int n = accel_device_count(ACCEL_DEV_CUDA), drv = 0, rt = 0;
    if (n > 0) fprintf(out, "- CUDA available: True (%d GPU%s)\n", n, n == 1 ? "" : "s");
    else fprintf(out, "- CUDA available: False (%s)\n", accel__cuda_unavailable_reason());
    if (cudaDriverGetVersion(&drv) == cudaSuccess && drv) print_version(out, "CUDA driver version", drv);
    else fprintf(out, "- CUDA driver version: none (no NVIDIA driver loaded)\n");
    cudaGetLastError();
    if (cudaRuntimeGetVersion(&rt) == cudaSuccess) print_version(out, "CUDA runtime version", rt);
    print_libraries(out, n);
    for (int i = 0; i < n; i++) {
        struct cudaDeviceProp p;
        if (cudaGetDeviceProperties(&p, i) != cudaSuccess) {
            cudaGetLastError();
            continue;
        }
        fprintf(out, "- GPU %d: %s, %.1f GiB, compute capability %d.%d\n", i, p.name,
                (double)p.totalGlobalMem / (1024.0 * 1024.0 * 1024.0), p.major, p.minor);
    }
}

bool accel__cuda_capability(int index, int *major, int *minor, char *name, size_t name_len) {
    struct cudaDeviceProp p;
    if (index < 0 || index >= accel_device_count(ACCEL_DEV_CUDA) || cudaGetDeviceProperties(&p, index) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    *major = p.major;
    *minor = p.minor;
    if (name_len) snprintf(name, name_len, "%s", p.name);
    return true;
}
