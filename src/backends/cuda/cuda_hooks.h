/* The cuda plug-in's test hooks (plain C: no CUDA headers), reached with
 * accel__plugin_hooks(ACCEL_DEV_CUDA) (backends/plugin.h): the tests of the
 * kernels and of ZeRO-3 on a GPU read the backend's internals through them,
 * since the backend lives in libaccel-cuda.so, not in the program. */
#ifndef ACCEL_BACKENDS_CUDA_HOOKS_H
#define ACCEL_BACKENDS_CUDA_HOOKS_H

#include <stdbool.h>
#include <stddef.h>

typedef struct accel__cuda_hooks {
    size_t (*reserved_bytes)(int index); /* the caching allocator's device memory (allocator.c) */
    int (*gemm_plans)(void);             /* cuBLASLt plans built so far (gemm.c) */
    bool (*host_pinned)(const void *p);  /* p is page-locked host memory of the CUDA runtime */
    long (*events_created)(int index);   /* CUDA events the backend made so far (cuda_backend.c) */
} accel__cuda_hooks;

#endif
