/* The hostless test backend's test hooks: the counters of its pinned host
 * memory (host_alloc/host_free), for tests of the staging paths (how much
 * host staging a copy uses, and that it is allocated once and reused), and
 * the knobs of its virtual memory (the vm_* entries; its counters are
 * backends/vm_pool.h's accel__vm_stats_of). */
#ifndef ACCEL_BACKENDS_HOSTLESS_H
#define ACCEL_BACKENDS_HOSTLESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backends/registry.h" /* accel__hostless_memory */

typedef struct accel__hostless_host_counts {
    int64_t allocs, frees; /* host_alloc / host_free calls that succeeded, since start-up */
    int64_t live_bytes;    /* allocated and not yet freed */
    int64_t peak_bytes;    /* most live_bytes at once since start-up or the last peak reset */
} accel__hostless_host_counts;

void accel__hostless_host_stats(accel__hostless_host_counts *out);

/* What a device's callers asked of it, since start-up: the host-side
 * figures of a training step that a GPU's would have (docs/cuda.md, "A step's
 * host-side figures"). */
typedef struct accel__hostless_calls {
    int64_t kernels;    /* kernel launches (calls of the kernel table) */
    int64_t allocs;     /* persistent allocations (mem.alloc: cudaMalloc's place) */
    int64_t host_reads; /* device-to-host copies (copy_to_host): on a GPU the host waits for the stream */
} accel__hostless_calls;

void accel__hostless_call_counts(int index, accel__hostless_calls *out);
/* The k-th persistent allocation (mem.alloc, cudaMalloc's place) from now on
 * fails with ACCEL_ERR_OOM, as on a full GPU (k 1: the next; 0: none): a
 * failure half-way through moving a model. */
void accel__hostless_alloc_fail_at(int k);
/* Restarts the peak from the bytes live now. */
void accel__hostless_host_peak_reset(void);
/* The next n host_alloc calls fail with ACCEL_ERR_OOM (0: none), as
 * cudaMallocHost does when pinned memory runs out. */
void accel__hostless_host_fail_next(int n);
/* The next n vm_map calls fail with ACCEL_ERR_OOM (0: none), as cuMemCreate
 * does when the device is full (tests of ZeRO-3's agreement on a failed mapping). */
void accel__hostless_vm_fail_next(int n);
/* The next n unmaps of a range's pages (the pool's primitive, cuMemUnmap's
 * place) fail with ACCEL_ERR_DEVICE, the range left mapped (0: none). */
void accel__hostless_vm_fail_unmap_next(int n);
/* The next n fence records (cudaEventRecord's place) fail with ACCEL_ERR_DEVICE (0: none). */
void accel__hostless_vm_fail_record_next(int n);
/* The next n copies between host and device (copy_to_host, copy_to_device:
 * cudaMemcpy's place) fail with ACCEL_ERR_DEVICE, nothing copied (0: none). */
void accel__hostless_copy_fail_next(int n);

/* Physical memory for virtual memory fails with ACCEL_ERR_OOM once the
 * handles of every hostless device would hold more than `bytes` (0, the
 * default: no limit), as cuMemCreate does on a full GPU. */
void accel__hostless_vm_set_limit(size_t bytes);
/* `bytes` of idle device memory held elsewhere (a caching allocator's free
 * blocks, as CUDA's beside its virtual memory): counted against the limit
 * above until the pool asks for it back (vm_pool.h's release_idle), which
 * empties it and counts one release. */
void accel__hostless_vm_set_idle_cache(size_t bytes);
int64_t accel__hostless_vm_idle_releases(void);
/* on: fences recorded from now on stay pending until waited for, as a GPU's
 * stream still running the work (unmapped ranges then retire: vm_pool.h);
 * off (the default): done when recorded, the device having run the work
 * (turning it off makes every pending fence done: the device caught up). */
void accel__hostless_vm_lag_fences(bool on);
/* The plug-in's side of the hooks above and of backend.h's
 * accel__hostless_register / _memory_stats / _reset_peak: the hostless
 * backend is a plug-in (libaccel-hostless.so, backends/plugin.h) whose init
 * hands this table to the loader; the functions of those names live in the
 * core (backends/hostless_hooks.c) and forward here. */
typedef struct accel__hostless_hooks {
    accel_status (*register_devices)(int n);
    accel__hostless_memory (*memory_stats)(int index);
    void (*reset_peak)(int index);
    void (*host_stats)(accel__hostless_host_counts *out);
    void (*host_peak_reset)(void);
    void (*host_fail_next)(int n);
    void (*vm_fail_next)(int n);
    void (*vm_fail_unmap_next)(int n);
    void (*vm_fail_record_next)(int n);
    void (*vm_set_limit)(size_t bytes);
    void (*vm_lag_fences)(bool on);
    void (*vm_set_idle_cache)(size_t bytes);
    int64_t (*vm_idle_releases)(void);
    void (*call_counts)(int index, accel__hostless_calls *out);
    void (*alloc_fail_at)(int k);
    void (*copy_fail_next)(int n);
} accel__hostless_hooks;

/* The granule is 64 KiB, or ACCEL_TEST_VM_GRANULE bytes (a power of two from
 * the page size to 1 GiB: 2097152 is CUDA's), read at the first use. */

#endif
