/* Virtual memory on CUDA (the backend's vm_* entries, backend.h) through the
 * pool of backends/vm_pool.h, which has the rules: address ranges from
 * cuMemAddressReserve; physical memory from cuMemCreate, pooled per device
 * and reused by later maps; a map is cuMemMap plus cuMemSetAccess (readable
 * and writable on the device); an unmap records an event on the calling
 * thread's stream and the pool calls cuMemUnmap once that event is done (a
 * kernel enqueued before the unmap may still read the range), without a
 * host-blocking synchronisation per unmap. ZeRO-3 maps a unit's full
 * parameters when it is gathered and unmaps them when it is released.
 *
 * Work on another stream that uses a range must be joined to the unmapping
 * thread's stream (an event) before the unmap, as for the caching
 * allocator: the event covers that stream only.
 *
 * The driver API is reached through cudaGetDriverEntryPointByVersion, so the
 * backend still links cudart alone (static) and needs only the driver at run
 * time, as before.
 *
 * Not run on a GPU yet (none was lent while this was written): compiled only;
 * the pool's logic runs in the tests on the hostless device. */
#include <cuda.h>
#include <pthread.h>

#include "backends/vm_pool.h"
#include "cuda_calls.h"
#include "cuda_internal.h"

typedef CUresult (*reserve_fn)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
typedef CUresult (*address_free_fn)(CUdeviceptr, size_t);
typedef CUresult (*create_fn)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
typedef CUresult (*release_fn)(CUmemGenericAllocationHandle);
typedef CUresult (*map_fn)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
typedef CUresult (*unmap_fn)(CUdeviceptr, size_t);
typedef CUresult (*set_access_fn)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
typedef CUresult (*granularity_fn)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags);

static struct {
    reserve_fn reserve;
    address_free_fn address_free;
    create_fn create;
    release_fn release;
    map_fn map;
    unmap_fn unmap;
    set_access_fn set_access;
    granularity_fn granularity;
    bool ok; /* every entry found */
} g_drv;

static pthread_once_t g_drv_once = PTHREAD_ONCE_INIT;

static void *entry(const char *name) {
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
        return NULL;
    return fn;
}

static void drv_load(void) {
    g_drv.reserve = (reserve_fn)entry("cuMemAddressReserve");
    g_drv.address_free = (address_free_fn)entry("cuMemAddressFree");
    g_drv.create = (create_fn)entry("cuMemCreate");
    g_drv.release = (release_fn)entry("cuMemRelease");
    g_drv.map = (map_fn)entry("cuMemMap");
    g_drv.unmap = (unmap_fn)entry("cuMemUnmap");
    g_drv.set_access = (set_access_fn)entry("cuMemSetAccess");
    g_drv.granularity = (granularity_fn)entry("cuMemGetAllocationGranularity");
    g_drv.ok = g_drv.reserve && g_drv.address_free && g_drv.create && g_drv.release && g_drv.map && g_drv.unmap &&
               g_drv.set_access && g_drv.granularity;
}

static bool drv(int index, const char *op) {
    pthread_once(&g_drv_once, drv_load);
    if (!g_drv.ok) accel_set_error(ACCEL_ERR_DEVICE, "cuda:%d: %s: the driver lacks the virtual memory API", index, op);
    return g_drv.ok;
}

static accel_status drv_check(CUresult r, int index, const char *op) {
    if (r == CUDA_SUCCESS) return ACCEL_OK;
    return accel_set_error(r == CUDA_ERROR_OUT_OF_MEMORY ? ACCEL_ERR_OOM : ACCEL_ERR_DEVICE,
                           "cuda:%d: %s failed (CUresult %d)", index, op, (int)r);
}

static CUmemAllocationProp device_prop(int index) {
    CUmemAllocationProp p = {0};
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = index;
    return p;
}

size_t accel__cuda_vm_granularity(int index) {
    size_t g = 0;
    CUmemAllocationProp p = device_prop(index);
    if (!drv(index, "vm_granularity") ||
        drv_check(g_drv.granularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED), index, "cuMemGetAllocationGranularity"))
        return 2u << 20; /* the granule of every current GPU; vm_reserve reports the error */
    return g;
}

/* ---- the pool's primitives (vm_pool.h's accel__vm_ops) */

static void *reserve(int index, size_t bytes) {
    CUdeviceptr p = 0;
    accel__cuda_enter(index);
    if (drv_check(g_drv.reserve(&p, bytes, accel__cuda_vm_granularity(index), 0, 0), index, "cuMemAddressReserve"))
        return NULL;
    return (void *)(uintptr_t)p;
}

static void release(int index, void *p, size_t bytes) {
    accel__cuda_enter(index);
    g_drv.address_free((CUdeviceptr)(uintptr_t)p, bytes);
}

static accel_status create(int index, size_t bytes, uint64_t *handle) {
    CUmemAllocationProp prop = device_prop(index);
    CUmemGenericAllocationHandle h;
    accel__cuda_enter(index);
    accel_status st = drv_check(g_drv.create(&h, bytes, &prop, 0), index, "cuMemCreate");
    if (!st) *handle = (uint64_t)h;
    return st;
}

static void destroy(int index, uint64_t handle) {
    accel__cuda_enter(index);
    g_drv.release((CUmemGenericAllocationHandle)handle);
}

static accel_status map(int index, void *p, size_t bytes, uint64_t handle) {
    CUdeviceptr at = (CUdeviceptr)(uintptr_t)p;
    accel__cuda_enter(index);
    accel_status st = drv_check(g_drv.map(at, bytes, 0, (CUmemGenericAllocationHandle)handle, 0), index, "cuMemMap");
    if (st) return st;
    CUmemAccessDesc access = {.location = device_prop(index).location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    st = drv_check(g_drv.set_access(at, bytes, &access, 1), index, "cuMemSetAccess");
    if (st) g_drv.unmap(at, bytes);
    return st;
}

static accel_status unmap(int index, void *p, size_t bytes) {
    accel__cuda_enter(index);
    return drv_check(g_drv.unmap((CUdeviceptr)(uintptr_t)p, bytes), index, "cuMemUnmap");
}

static void *fence_new(int index) {
    cudaEvent_t e;
    return accel__cuda_event_new(index, &e, "vm_unmap: event") == ACCEL_OK ? e : NULL;
}

static accel_status fence_record(int index, void *fence) {
    return accel__cuda_check(cudaEventRecord((cudaEvent_t)fence, accel__cuda_enter(index)), index, "vm_unmap");
}

/* An error (the device's work has stopped) counts as done: the unmap
 * reports it. */
static bool fence_done(int index, void *fence) { return accel__cuda_event_poll((cudaEvent_t)fence) != cudaErrorNotReady; }

static accel_status fence_wait(int index, void *fence) {
    accel__cuda_enter(index);
    return accel__cuda_check(cudaEventSynchronize((cudaEvent_t)fence), index, "vm_map: waiting for a retired range");
}

static accel_status fence_order(int index, void *fence) {
    return accel__cuda_check(cudaStreamWaitEvent(accel__cuda_enter(index), (cudaEvent_t)fence, 0), index,
                             "vm_map: ordering after a retired range");
}

static accel_status drain(int index) {
    return accel__cuda_check(cudaStreamSynchronize(accel__cuda_enter(index)), index,
                             "vm_unmap: waiting for the stream (no event recorded)");
}

/* At process exit the runtime may be unloading already: nothing to report. */
static void fence_free(int index, void *fence) {
    if (cudaEventDestroy((cudaEvent_t)fence) != cudaSuccess) cudaGetLastError();
}

static const accel__vm_ops cuda_vm_ops = {
    .granularity = accel__cuda_vm_granularity,
    .reserve = reserve,
    .release = release,
    .create = create,
    .destroy = destroy,
    .map = map,
    .unmap = unmap,
    .fence_new = fence_new,
    .fence_record = fence_record,
    .fence_done = fence_done,
    .fence_wait = fence_wait,
    .fence_order = fence_order,
    .fence_free = fence_free,
    .drain = drain,
    .release_idle = accel__cuda_release_cached,
};

/* ---- the backend's entries */

void *accel__cuda_vm_reserve(int index, size_t bytes) {
    if (!drv(index, "vm_reserve")) return NULL;
    return accel__vm_reserve(&cuda_vm_ops, ACCEL_DEV_CUDA, index, bytes);
}

void accel__cuda_vm_release(int index, void *p, size_t bytes) {
    if (p && drv(index, "vm_release")) accel__vm_release(&cuda_vm_ops, ACCEL_DEV_CUDA, index, p, bytes);
}

accel_status accel__cuda_vm_map(int index, void *p, size_t bytes) {
    if (!drv(index, "vm_map")) return accel_last_status();
    return accel__vm_map(&cuda_vm_ops, ACCEL_DEV_CUDA, index, p, bytes);
}

accel_status accel__cuda_vm_unmap(int index, void *p, size_t bytes) {
    if (!drv(index, "vm_unmap")) return accel_last_status();
    return accel__vm_unmap(&cuda_vm_ops, ACCEL_DEV_CUDA, index, p, bytes);
}
