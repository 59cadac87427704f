/* The CPU backend: host memory (accel_malloc; the step pool is the thread's
 * step arena; virtual memory from mmap) and the table of CPU kernels. Device
 * pointers are host addresses, every copy is a memcpy, and nothing is
 * asynchronous. */
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backends/registry.h"
#include "backends/vm_pool.h"
#include "cpu_kernels.h"

static int cpu_count(void) { return 1; }

static void *cpu_alloc(int index, size_t bytes, size_t align) {
    return accel_malloc_aligned(bytes, align);
}

static void cpu_free(int index, void *p) { accel_free(p); }

static void *cpu_step_alloc(int index, size_t bytes, size_t align) {
    return accel_arena_alloc(accel_step_arena(), bytes, align);
}

/* ---- virtual memory (the rules and the pool: backends/vm_pool.h). A
 * granule is a page. Reserved ranges are address space without access
 * (PROT_NONE, no commit charge). A handle is a count of bytes: the pages are
 * the range's own, so mapping only opens the range (mprotect) and its pages
 * take memory when first touched; unmapping gives them back (MADV_DONTNEED).
 * Unlike a GPU's, an unmapped range keeps its access and reads as zeros: a
 * stray use costs the pages it touches (until the next unmap) instead of a
 * fault, so a caller that checks afterwards (ZeRO-3's unit used without its
 * hooks) reports it with an error rather than the process dying. The
 * hostless backend is the strict one that tests run against. Fences: the
 * work ran when it was called, so every fence is done. */

static size_t cpu_vm_granularity(int index) {
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (size_t)p : 4096;
}

static void *cpu_vm_reserve_space(int index, size_t bytes) {
    void *p = mmap(NULL, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        accel_set_error(ACCEL_ERR_OOM, "cpu: cannot reserve %zu bytes of address space: %s", bytes, strerror(errno));
        return NULL;
    }
    return p;
}

static void cpu_vm_release_space(int index, void *p, size_t bytes) { munmap(p, bytes); }

static accel_status cpu_vm_create(int index, size_t bytes, uint64_t *handle) {
    *handle = bytes;
    return ACCEL_OK;
}

static void cpu_vm_destroy(int index, uint64_t handle) {}

static accel_status cpu_vm_map_pages(int index, void *p, size_t bytes, uint64_t handle) {
    if (mprotect(p, bytes, PROT_READ | PROT_WRITE))
        return accel_set_error(ACCEL_ERR_OOM, "cpu: cannot map %zu bytes at %p: %s", bytes, p, strerror(errno));
    return ACCEL_OK;
}

static accel_status cpu_vm_unmap_pages(int index, void *p, size_t bytes) {
    if (madvise(p, bytes, MADV_DONTNEED))
        return accel_set_error(ACCEL_ERR_DEVICE, "cpu: cannot unmap %zu bytes at %p: %s", bytes, p, strerror(errno));
    return ACCEL_OK;
}

static char g_cpu_fence; /* every fence: there is no work in flight to mark */

static void *cpu_vm_fence_new(int index) { return &g_cpu_fence; }
static accel_status cpu_vm_fence_record(int index, void *f) { return ACCEL_OK; }
static bool cpu_vm_fence_done(int index, void *f) { return true; }
static accel_status cpu_vm_fence_wait(int index, void *f) { return ACCEL_OK; }
static accel_status cpu_vm_fence_order(int index, void *f) { return ACCEL_OK; }
static void cpu_vm_fence_free(int index, void *f) {}
static accel_status cpu_vm_drain(int index) { return ACCEL_OK; }

static const accel__vm_ops cpu_vm_ops = {
    .granularity = cpu_vm_granularity,
    .reserve = cpu_vm_reserve_space,
    .release = cpu_vm_release_space,
    .create = cpu_vm_create,
    .destroy = cpu_vm_destroy,
    .map = cpu_vm_map_pages,
    .unmap = cpu_vm_unmap_pages,
    .fence_new = cpu_vm_fence_new,
    .fence_record = cpu_vm_fence_record,
    .fence_done = cpu_vm_fence_done,
    .fence_wait = cpu_vm_fence_wait,
    .fence_order = cpu_vm_fence_order,
    .fence_free = cpu_vm_fence_free,
    .drain = cpu_vm_drain,
};

static void *cpu_vm_reserve(int index, size_t bytes) {
    return accel__vm_reserve(&cpu_vm_ops, ACCEL_DEV_CPU, index, bytes);
}

static void cpu_vm_release(int index, void *p, size_t bytes) {
    accel__vm_release(&cpu_vm_ops, ACCEL_DEV_CPU, index, p, bytes);
}

static accel_status cpu_vm_map(int index, void *p, size_t bytes) {
    return accel__vm_map(&cpu_vm_ops, ACCEL_DEV_CPU, index, p, bytes);
}

static accel_status cpu_vm_unmap(int index, void *p, size_t bytes) {
    return accel__vm_unmap(&cpu_vm_ops, ACCEL_DEV_CPU, index, p, bytes);
}

/* The step arena holds the headers of every step tensor too: accel_step_reset
 * resets it itself, after the backends. The pool's step boundary is ours. */
static void cpu_step_reset(int index) { accel__vm_step(ACCEL_DEV_CPU, index); }

static accel_status cpu_memset(int index, void *p, int byte, size_t n) {
    if (n) memset(p, byte, n);
    return ACCEL_OK;
}

/* memset_cold: streamed (stream_zero.c) from 1 MiB, about half a core's L2
 * here: a small model's gradients, which an ordinary memset leaves in the
 * caches for the next backward, keep memset. */
static accel_status cpu_memset_cold(int index, void *p, size_t n) {
    (void)index;
    if (n >= ((size_t)1 << 20)) accel__cpu_zero_streamed(p, n);
    else if (n) memset(p, 0, n);
    return ACCEL_OK;
}

static accel_status cpu_copy_to_device(int index, void *dst, const void *src, size_t n) {
    if (n) memcpy(dst, src, n);
    return ACCEL_OK;
}

static accel_status cpu_copy_device(int dst_index, void *dst, int src_index, const void *src, size_t n) {
    if (n && dst != src) memmove(dst, src, n);
    return ACCEL_OK;
}

accel_status accel__cpu_mem_info(size_t *free_bytes, size_t *total_bytes) {
    long page = sysconf(_SC_PAGESIZE), total = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES);
    if (page <= 0 || total <= 0 || avail < 0)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "cpu: cannot read the memory size of this machine");
    *total_bytes = (size_t)total * (size_t)page;
    *free_bytes = (size_t)avail * (size_t)page;
    return ACCEL_OK;
}

static accel_status cpu_mem_info(int index, size_t *free_bytes, size_t *total_bytes) {
    return accel__cpu_mem_info(free_bytes, total_bytes);
}

const accel_backend accel__cpu_backend = {
    .name = "cpu",
    .type = ACCEL_DEV_CPU,
    .device_count = cpu_count,
    .host_addressable = true,
    .sdpa_strided = true,
    .sdpa_key_range = true,
    .sdpa_key_start = true,
    .gemm_c16 = ACCEL_GEMM_C16_ANY,
    .mem = {
        .alloc = cpu_alloc,
        .free = cpu_free,
        .step_alloc = cpu_step_alloc,
        .step_reset = cpu_step_reset,
        .memset = cpu_memset,
        .memset_cold = cpu_memset_cold,
        .copy_to_device = cpu_copy_to_device,
        .copy_to_host = cpu_copy_to_device,
        .copy_device = cpu_copy_device,
        .mem_info = cpu_mem_info,
        .vm_granularity = cpu_vm_granularity,
        .vm_reserve = cpu_vm_reserve,
        .vm_release = cpu_vm_release,
        .vm_map = cpu_vm_map,
        .vm_unmap = cpu_vm_unmap,
    },
    .kernels = {
#define CPU_KERNEL(name, T) .name = accel__cpuk_##name,
        ACCEL_KERNELS(CPU_KERNEL)
#undef CPU_KERNEL
    },
};
