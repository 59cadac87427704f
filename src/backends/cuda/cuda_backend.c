/* The CUDA backend: devices "cuda:0".."cuda:N-1".
 *
 * Memory comes from the caching allocator (allocator.c); copies and memsets
 * are enqueued on the calling thread's current stream, and the synchronous
 * copies of the table wait for that stream. Kernels (*.cu, gemm.c) are
 * enqueued on the same stream and return.
 *
 * Part of the cuda plug-in (cuda_plugin.c), whose init registers it
 * (accel__cuda_register) only when cudaGetDeviceCount() finds a device: on
 * a machine without a GPU the plug-in registers no device. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "cuda_internal.h"

static int g_count;
static char g_reason[160]; /* why g_count is 0 */
static pthread_once_t g_count_once = PTHREAD_ONCE_INIT;

static void count_devices(void) {
    int n = 0, driver = 0, runtime = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError();
        cudaDriverGetVersion(&driver);
        cudaRuntimeGetVersion(&runtime);
        if (driver == 0)
            snprintf(g_reason, sizeof g_reason, "no NVIDIA driver is loaded (no GPU on this machine?)");
        else if (e == cudaErrorInsufficientDriver)
            snprintf(g_reason, sizeof g_reason, "the driver supports CUDA %d.%d, this build needs CUDA %d.%d",
                     driver / 1000, driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10);
        else snprintf(g_reason, sizeof g_reason, "%s", cudaGetErrorString(e));
        n = 0;
    } else if (n == 0) {
        snprintf(g_reason, sizeof g_reason, "no CUDA device found");
    }
    g_count = n < ACCEL_CUDA_MAX_DEVICES ? n : ACCEL_CUDA_MAX_DEVICES;
}

static int cuda_count(void) {
    pthread_once(&g_count_once, count_devices);
    return g_count;
}

const char *accel__cuda_unavailable_reason(void) {
    cuda_count();
    return g_reason;
}

accel_status accel__cuda_check(cudaError_t e, int index, const char *op) {
    if (e == cudaSuccess) return ACCEL_OK;
    cudaGetLastError(); /* clears a non-sticky error so that later calls do not report it */
    accel_status code = e == cudaErrorMemoryAllocation ? ACCEL_ERR_OOM : ACCEL_ERR_DEVICE;
    return accel_set_error(code, "cuda:%d: %s: %s", index, op, cudaGetErrorString(e));
}

/* ---- streams: the thread's current stream per device */

static _Thread_local cudaStream_t tl_stream[ACCEL_CUDA_MAX_DEVICES];

cudaStream_t accel__cuda_enter(int index) {
    cudaSetDevice(index);
    return tl_stream[index];
}

static accel_stream *cuda_stream_new(int index) {
    cudaStream_t s;
    cudaSetDevice(index);
    if (accel__cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), index, "stream_new") != ACCEL_OK)
        return NULL;
    return (accel_stream *)s;
}

static void cuda_stream_free(int index, accel_stream *s) {
    if (!s) return;
    cudaSetDevice(index);
    if (tl_stream[index] == (cudaStream_t)s) tl_stream[index] = 0;
    cudaStreamDestroy((cudaStream_t)s);
}

static void cuda_set_stream(int index, accel_stream *s) { tl_stream[index] = (cudaStream_t)s; }

/* The stream of an explicit argument, else the thread's current one. */
static cudaStream_t stream_or_current(int index, accel_stream *s) {
    cudaStream_t cur = accel__cuda_enter(index);
    return s ? (cudaStream_t)s : cur;
}

/* Freed events are kept per device and recorded again (an event is
 * reusable once freed: a later record replaces what it marked), so steady
 * steps create none; the pool holds the most events live at once. created
 * counts every event the backend made on the device (the virtual memory's
 * fences too), for the tests of steady steps. */
typedef struct event_pool {
    cudaEvent_t *spare;
    int n, cap;
    long created;
} event_pool;

static event_pool g_events[ACCEL_CUDA_MAX_DEVICES];
static pthread_mutex_t g_events_lock = PTHREAD_MUTEX_INITIALIZER;

accel_status accel__cuda_event_new(int index, cudaEvent_t *e, const char *op) {
    accel__cuda_enter(index);
    if (accel__cuda_check(cudaEventCreateWithFlags(e, cudaEventDisableTiming), index, op) != ACCEL_OK)
        return accel_last_status();
    pthread_mutex_lock(&g_events_lock);
    g_events[index].created++;
    pthread_mutex_unlock(&g_events_lock);
    return ACCEL_OK;
}

long accel__cuda_events_created(int index) {
    pthread_mutex_lock(&g_events_lock);
    long n = g_events[index].created;
    pthread_mutex_unlock(&g_events_lock);
    return n;
}

static cudaEvent_t event_take(int index) {
    cudaEvent_t e = NULL;
    pthread_mutex_lock(&g_events_lock);
    if (g_events[index].n) e = g_events[index].spare[--g_events[index].n];
    pthread_mutex_unlock(&g_events_lock);
    if (!e && accel__cuda_event_new(index, &e, "event_record") != ACCEL_OK) return NULL;
    return e;
}

/* Back into the pool (destroyed when the pool cannot grow). */
static void event_give(int index, cudaEvent_t e) {
    pthread_mutex_lock(&g_events_lock);
    event_pool *p = &g_events[index];
    if (p->n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 16;
        cudaEvent_t *grown = accel_malloc((size_t)cap * sizeof *grown);
        if (grown) {
            if (p->n) memcpy(grown, p->spare, (size_t)p->n * sizeof *grown);
            accel_free(p->spare);
            p->spare = grown;
            p->cap = cap;
        }
    }
    bool kept = p->n < p->cap;
    if (kept) p->spare[p->n++] = e;
    pthread_mutex_unlock(&g_events_lock);
    if (!kept) cudaEventDestroy(e);
}

static accel_event *cuda_event_record(int index, accel_stream *s) {
    cudaStream_t st = stream_or_current(index, s);
    cudaEvent_t e = event_take(index);
    if (!e) return NULL;
    if (accel__cuda_check(cudaEventRecord(e, st), index, "event_record") != ACCEL_OK) {
        event_give(index, e);
        return NULL;
    }
    return (accel_event *)e;
}

static accel_status cuda_event_wait(int index, accel_stream *s, accel_event *e) {
    cudaStream_t st = stream_or_current(index, s);
    return accel__cuda_check(cudaStreamWaitEvent(st, (cudaEvent_t)e, 0), index, "event_wait");
}

/* Each synchronisation also reports the bad ids and targets found since
 * the previous one (accel__cuda_check_pending). */
static accel_status cuda_event_synchronize(int index, accel_event *e) {
    cudaSetDevice(index);
    if (accel__cuda_check(cudaEventSynchronize((cudaEvent_t)e), index, "event_synchronize")) return accel_last_status();
    return accel__cuda_check_pending(index);
}

static void cuda_event_free(int index, accel_event *e) {
    if (e) event_give(index, (cudaEvent_t)e);
}

static accel_status cuda_synchronize(int index) {
    cudaSetDevice(index);
    if (accel__cuda_check(cudaDeviceSynchronize(), index, "synchronize")) return accel_last_status();
    return accel__cuda_check_pending(index);
}

/* ---- copies */

static accel_status copy_async(int index, void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                               cudaStream_t s, const char *op) {
    if (!n) return ACCEL_OK;
    return accel__cuda_check(cudaMemcpyAsync(dst, src, n, kind, s), index, op);
}

/* Enqueues on the thread's stream and waits for it (the table's synchronous copies). */
static accel_status copy_sync(int index, void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                              const char *op) {
    cudaStream_t s = accel__cuda_enter(index);
    accel_status st = copy_async(index, dst, src, n, kind, s, op);
    if (st != ACCEL_OK || !n) return st;
    if (accel__cuda_check(cudaStreamSynchronize(s), index, op)) return accel_last_status();
    return accel__cuda_check_pending(index);
}

static accel_status cuda_copy_to_device(int index, void *dst, const void *src, size_t n) {
    return copy_sync(index, dst, src, n, cudaMemcpyHostToDevice, "copy_to_device");
}

static accel_status cuda_copy_to_host(int index, void *dst, const void *src, size_t n) {
    return copy_sync(index, dst, src, n, cudaMemcpyDeviceToHost, "copy_to_host");
}

/* A copy between two GPUs runs on the destination's stream, which does not
 * wait for work on the source GPU (cudaMemcpyPeerAsync is asynchronous with
 * respect to other devices): the source's stream is drained first, so the
 * copy reads what the kernels enqueued there wrote. */
static accel_status cuda_copy_device(int dst_index, void *dst, int src_index, const void *src, size_t n) {
    if (!n || dst == src) return ACCEL_OK;
    if (dst_index != src_index &&
        accel__cuda_check(cudaStreamSynchronize(accel__cuda_enter(src_index)), src_index, "copy_device") != ACCEL_OK)
        return accel_last_status();
    cudaStream_t s = accel__cuda_enter(dst_index);
    accel_status st = dst_index == src_index
                          ? copy_async(dst_index, dst, src, n, cudaMemcpyDeviceToDevice, s, "copy_device")
                          : accel__cuda_check(cudaMemcpyPeerAsync(dst, dst_index, src, src_index, n, s),
                                              dst_index, "copy_device");
    if (st != ACCEL_OK) return st;
    return accel__cuda_check(cudaStreamSynchronize(s), dst_index, "copy_device");
}

static accel_status cuda_copy_to_device_async(int index, void *dst, const void *src, size_t n, accel_stream *s) {
    return copy_async(index, dst, src, n, cudaMemcpyHostToDevice, stream_or_current(index, s),
                      "copy_to_device_async");
}

static accel_status cuda_copy_to_host_async(int index, void *dst, const void *src, size_t n, accel_stream *s) {
    return copy_async(index, dst, src, n, cudaMemcpyDeviceToHost, stream_or_current(index, s),
                      "copy_to_host_async");
}

static accel_status cuda_memset(int index, void *p, int byte, size_t n) {
    if (!n) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    return accel__cuda_check(cudaMemsetAsync(p, byte, n, s), index, "memset");
}

static accel_status cuda_mem_info(int index, size_t *free_bytes, size_t *total_bytes) {
    cudaSetDevice(index);
    return accel__cuda_check(cudaMemGetInfo(free_bytes, total_bytes), index, "mem_info");
}

/* Pinned host memory for the staging buffers (core/host_stage.h): copies
 * from it run at full PCIe/NVLink speed and asynchronously. Portable: one
 * buffer serves every device of the process. A failure (pinned memory is a
 * limited resource) is an error naming the size; the staging pool then falls
 * back to pageable memory with a warning. */
static void *cuda_host_alloc(size_t bytes) {
    void *p = NULL;
    cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
    if (e == cudaSuccess) return p;
    cudaGetLastError(); /* not sticky: later calls must not report it */
    accel_set_error(e == cudaErrorMemoryAllocation ? ACCEL_ERR_OOM : ACCEL_ERR_DEVICE,
                    "cuda: host_alloc: cudaHostAlloc of %zu pinned bytes failed: %s", bytes, cudaGetErrorString(e));
    return NULL;
}

/* At process exit the runtime may be unloading already: the error it then
 * returns means the memory goes with the process, nothing to report. */
static void cuda_host_free(void *p) {
    if (p && cudaFreeHost(p) != cudaSuccess) cudaGetLastError();
}

static const accel_backend cuda_backend = {
    .name = "cuda",
    .type = ACCEL_DEV_CUDA,
    .device_count = cuda_count,
    .host_addressable = false,
    .gemm_c16 = ACCEL_GEMM_C16_SAME,
    .mem = {
        .alloc = accel__cuda_alloc,
        .free = accel__cuda_free,
        .step_alloc = accel__cuda_step_alloc,
        .step_reset = accel__cuda_step_reset,
        .memset = cuda_memset,
        .copy_to_device = cuda_copy_to_device,
        .copy_to_host = cuda_copy_to_host,
        .copy_device = cuda_copy_device,
        .mem_info = cuda_mem_info,
        .host_alloc = cuda_host_alloc,
        .host_free = cuda_host_free,
        .vm_granularity = accel__cuda_vm_granularity,
        .vm_reserve = accel__cuda_vm_reserve,
        .vm_release = accel__cuda_vm_release,
        .vm_map = accel__cuda_vm_map,
        .vm_unmap = accel__cuda_vm_unmap,
    },
    .async = {
        .stream_new = cuda_stream_new,
        .stream_free = cuda_stream_free,
        .set_stream = cuda_set_stream,
        .copy_to_device_async = cuda_copy_to_device_async,
        .copy_to_host_async = cuda_copy_to_host_async,
        .event_record = cuda_event_record,
        .event_wait = cuda_event_wait,
        .event_synchronize = cuda_event_synchronize,
        .event_free = cuda_event_free,
        .synchronize = cuda_synchronize,
    },
    /* Slots missing from ACCEL__CUDA_KERNELS stay NULL: the op reports
     * "kernel <name> is not implemented on cuda:N". */
    .kernels = {
#define CUDA_SLOT(name, T) .name = accel__cudak_##name,
        ACCEL__CUDA_KERNELS(CUDA_SLOT)
#undef CUDA_SLOT
    },
    .sdpa_strided = true, /* attention.cu reads and writes every operand at its strides */
    .fp8 = &accel__cuda_fp8_ops,
};

void accel__cuda_register(void) {
    if (cuda_count() > 0) accel__backend_register(&cuda_backend);
}
