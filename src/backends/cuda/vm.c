/* Virtual memory on CUDA (the backend's vm_* entries, backend.h): address
 * ranges from cuMemAddressReserve; vm_map creates physical memory of the
 * range's size on the device (cuMemCreate), maps it (cuMemMap) and makes it
 * readable and writable there (cuMemSetAccess); vm_unmap unmaps it and
 * releases the physical memory to the driver. ZeRO-3 maps a unit's full
 * parameters when it is gathered and unmaps them when it is released.
 *
 * The driver API is reached through cudaGetDriverEntryPointByVersion, so the
 * backend still links cudart alone (static) and needs only the driver at run
 * time, as before. Unmapping first waits for the calling thread's stream: a
 * kernel enqueued there may still read the range.
 *
 * Not run on a GPU yet (none was lent while this was written): compiled only. */
#include <cuda.h>
#include <pthread.h>

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

void *accel__cuda_vm_reserve(int index, size_t bytes) {
    CUdeviceptr p = 0;
    if (!drv(index, "vm_reserve")) return NULL;
    size_t g = accel__cuda_vm_granularity(index);
    if (drv_check(g_drv.reserve(&p, bytes, g, 0, 0), index, "cuMemAddressReserve")) return NULL;
    return (void *)(uintptr_t)p;
}

void accel__cuda_vm_release(int index, void *p, size_t bytes) {
    if (p && drv(index, "vm_release")) g_drv.address_free((CUdeviceptr)(uintptr_t)p, bytes);
}

accel_status accel__cuda_vm_map(int index, void *p, size_t bytes) {
    if (!drv(index, "vm_map")) return accel_last_status();
    CUmemAllocationProp prop = device_prop(index);
    CUmemGenericAllocationHandle h;
    CUdeviceptr at = (CUdeviceptr)(uintptr_t)p;
    accel_status st = drv_check(g_drv.create(&h, bytes, &prop, 0), index, "cuMemCreate");
    if (st) return st;
    st = drv_check(g_drv.map(at, bytes, 0, h, 0), index, "cuMemMap");
    g_drv.release(h); /* the mapping holds the memory from here on; unmapping frees it */
    if (st) return st;
    CUmemAccessDesc access = {.location = prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    st = drv_check(g_drv.set_access(at, bytes, &access, 1), index, "cuMemSetAccess");
    if (st) g_drv.unmap(at, bytes);
    return st;
}

accel_status accel__cuda_vm_unmap(int index, void *p, size_t bytes) {
    if (!drv(index, "vm_unmap")) return accel_last_status();
    accel_status synced = accel__cuda_check(cudaStreamSynchronize(accel__cuda_enter(index)), index, "vm_unmap");
    /* unmapped even when the wait reported an earlier asynchronous error (the
     * stream has stopped then): a range left mapped would make its next map fail */
    accel_status st = drv_check(g_drv.unmap((CUdeviceptr)(uintptr_t)p, bytes), index, "cuMemUnmap");
    return synced ? synced : st;
}
