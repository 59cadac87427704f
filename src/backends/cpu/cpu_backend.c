/* The CPU backend: host memory (accel_malloc; the step pool is the thread's
 * step arena) and the table of CPU kernels. Device pointers are host
 * addresses, every copy is a memcpy, and nothing is asynchronous. */
#include <string.h>
#include <unistd.h>

#include "backends/registry.h"
#include "cpu_kernels.h"

static int cpu_count(void) { return 1; }

static void *cpu_alloc(int index, size_t bytes, size_t align) {
    return accel_malloc_aligned(bytes, align);
}

static void cpu_free(int index, void *p) { accel_free(p); }

static void *cpu_step_alloc(int index, size_t bytes, size_t align) {
    return accel_arena_alloc(accel_step_arena(), bytes, align);
}

/* The step arena holds the headers of every step tensor too: accel_step_reset
 * resets it itself, after the backends. */
static void cpu_step_reset(int index) {}

static accel_status cpu_memset(int index, void *p, int byte, size_t n) {
    if (n) memset(p, byte, n);
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
    .mem = {
        .alloc = cpu_alloc,
        .free = cpu_free,
        .step_alloc = cpu_step_alloc,
        .step_reset = cpu_step_reset,
        .memset = cpu_memset,
        .copy_to_device = cpu_copy_to_device,
        .copy_to_host = cpu_copy_to_device,
        .copy_device = cpu_copy_device,
        .mem_info = cpu_mem_info,
    },
    .kernels = {
#define CPU_KERNEL(name, T) .name = accel__cpuk_##name,
        ACCEL_KERNELS(CPU_KERNEL)
#undef CPU_KERNEL
    },
};
