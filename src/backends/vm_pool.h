/* Virtual memory with pooled physical memory, shared by the backends that
 * have virtual memory (cpu, cuda, hostless): the bookkeeping and the rules behind
 * backend.h's vm_* entries, on top of a backend's primitives (accel__vm_ops).
 * Internal.
 *
 * Why a pool. ZeRO-3 maps a unit's range at each gather and unmaps it at each
 * release, several times a step. On CUDA creating physical memory
 * (cuMemCreate) and releasing it (cuMemRelease) costs a driver allocation each
 * time, and unmapping safely needs the work that reads the range to be done:
 * done as a host-blocking stream synchronisation per unmap, it stalls the
 * host at every release. So physical memory ("handles", each a multiple of the
 * granule) is kept in a per-device pool and reused, and unmapping is deferred
 * until the work is done instead of waited for.
 *
 * The rules (docs/cuda.md "Memory"):
 * - vm_map of [p, p + n): p and n multiples of the granule, inside one range
 *   vm_reserve gave, overlapping no mapped range (else an error naming both
 *   ranges). Its memory is, in this order: the range's own handle when the
 *   range is still retiring (below: the mapping is kept, and the calling
 *   thread's stream waits for the retiring work, no host wait); a free pooled
 *   handle of exactly n bytes; the oldest retiring handle of n bytes, once
 *   the host has waited for its work (so the pool holds, per size, as many
 *   handles as ranges of that size were mapped at once: an unmap never makes
 *   the next map create memory, as FSDP's limit_all_gathers bounds memory);
 *   else a new handle. When creating fails with ACCEL_ERR_OOM, the pool
 *   waits for every retiring handle, releases every pooled one, has the
 *   backend release its other idle memory (ops->release_idle: the caching
 *   allocator's cache) and tries once more. Contents are undefined (a pooled handle holds what it held).
 * - vm_unmap of exactly a range vm_map mapped (else an error naming it): the
 *   range retires. A fence is recorded on the calling thread's stream; once
 *   it is done (checked at each vm call of the device, waited for only as
 *   above, at vm_release and at trimming) the range is unmapped and its
 *   handle pooled. So a freed handle is reused only after the work enqueued
 *   before its unmap is done. Until then a stray access to the range reads or
 *   writes the retiring handle, which nobody else has; after it, it faults.
 *   ACCEL_VM_SYNC_UNMAP=1 makes vm_unmap wait for the fence and unmap at
 *   once (every access after vm_unmap then faults: for finding stray uses).
 *   When no fence can be recorded the host waits for the stream (ops->drain)
 *   and the range is unmapped at once. vm_unmap unmaps its range even when
 *   it meets another retiring range's failure (reported: the first failure).
 * - A failed unmap never pools its handle (it may still be mapped): the
 *   handle is released and the error reported.
 * - vm_release of exactly a reserved range: its retiring ranges are waited
 *   for and unmapped; ranges still mapped there are an error (set on the
 *   thread: the entry returns nothing) and are unmapped too. When the
 *   device's last reservation goes, the pool releases every handle.
 * - At each step boundary (the backend's step_reset, accel_step_reset) the
 *   pool releases the pooled handles that no map took since the previous
 *   one: between steps alike the pool holds what a step maps at once, and a
 *   burst (prepare maps a whole model once) is given back after a step.
 *
 * Thread-safe: one lock per device, held across the backend's primitives
 * (a host wait for a fence holds it too). */
#ifndef ACCEL_BACKENDS_VM_POOL_H
#define ACCEL_BACKENDS_VM_POOL_H

#include <stdint.h>

#include "core/backend.h"

enum { ACCEL__VM_MAX_DEVICES = 16 };

/* A backend's virtual-memory primitives, for device `index`. Errors are set
 * on the thread with a message naming the device (accel_set_error). */
typedef struct accel__vm_ops {
    size_t (*granularity)(int index); /* a power of two */
    /* An address range of `bytes` without memory or access; NULL on failure. */
    void *(*reserve)(int index, size_t bytes);
    void (*release)(int index, void *p, size_t bytes);
    /* Physical memory of `bytes` (a granule multiple): *handle. ACCEL_ERR_OOM when the device is full. */
    accel_status (*create)(int index, size_t bytes, uint64_t *handle);
    void (*destroy)(int index, uint64_t handle);
    /* handle's memory (of exactly `bytes`) behind [p, p + bytes), readable
     * and writable on the device; the range is reserved and not mapped. */
    accel_status (*map)(int index, void *p, size_t bytes, uint64_t handle);
    /* Takes the memory and the access away from [p, p + bytes), which no
     * work still uses. */
    accel_status (*unmap)(int index, void *p, size_t bytes);
    /* Fences: a point in the calling thread's stream of work. A synchronous
     * device's fences are done when recorded. new: NULL on failure; record:
     * the fence now marks the work enqueued so far on the calling thread's
     * stream; done: that work has finished (an error counts as done: the
     * unmap then reports it); wait: the host waits for it; order: work
     * enqueued later on the calling thread's stream waits for it. */
    void *(*fence_new)(int index);
    accel_status (*fence_record)(int index, void *fence);
    bool (*fence_done)(int index, void *fence);
    accel_status (*fence_wait)(int index, void *fence);
    accel_status (*fence_order)(int index, void *fence);
    void (*fence_free)(int index, void *fence);
    /* The host waits for the work enqueued so far on the calling thread's
     * stream of the device: an unmap whose fence could not be recorded. */
    accel_status (*drain)(int index);
    /* Optional: told of every change of the bytes mapped (vm_map'd and not
     * vm_unmap'd), under the pool's lock (hostless's memory counters). */
    void (*mapped)(int index, size_t bytes, bool more);
    /* Optional: gives the device memory the backend keeps idle elsewhere (a
     * caching allocator's free blocks) back to the device, when creating
     * physical memory ran out. Called under the pool's lock: it must not
     * call the pool (the backend's allocator calls accel__vm_trim without
     * its own lock held). */
    void (*release_idle)(int index);
} accel__vm_ops;

/* The counters of one device's pool (since start-up unless said). */
typedef struct accel__vm_stats {
    size_t mapped;      /* bytes mapped now (vm_map'd and not vm_unmap'd) */
    size_t mapped_peak; /* the most mapped at once since accel__vm_reset_peak */
    size_t pooled;      /* bytes of handles not mapped: free, or retiring (work in flight) */
    size_t held;        /* bytes of every handle the device holds: mapped + pooled */
    int64_t maps, unmaps;
    int64_t creates, destroys; /* handles created / released to the device */
    size_t created_bytes;
    int64_t reused;  /* maps served by a pooled handle */
    int64_t revived; /* maps of a range still retiring: its mapping kept */
    int64_t waits;   /* host waits for a retiring handle's fence (or its stream: no fence recorded) */
    int64_t trims;   /* pool emptied after a failed creation (or on the allocator's request) */
} accel__vm_stats;

/* The backend's vm_* entries (backend.h) but vm_granularity, on the pool of
 * device (type, index) over `ops` (one table per device type). */
void *accel__vm_reserve(const accel__vm_ops *ops, accel_device_type type, int index, size_t bytes);
void accel__vm_release(const accel__vm_ops *ops, accel_device_type type, int index, void *p, size_t bytes);
accel_status accel__vm_map(const accel__vm_ops *ops, accel_device_type type, int index, void *p, size_t bytes);
accel_status accel__vm_unmap(const accel__vm_ops *ops, accel_device_type type, int index, void *p, size_t bytes);
/* The step boundary: releases the pooled handles no map took since the last one. */
void accel__vm_step(accel_device_type type, int index);
/* Waits for every retiring handle and releases every pooled one (an
 * allocator out of memory calls it before retrying). */
void accel__vm_trim(accel_device_type type, int index);

/* Device d's counters (zeros when it never used virtual memory). */
accel__vm_stats accel__vm_stats_of(accel_device d);
/* Restarts mapped_peak from the bytes mapped now. */
void accel__vm_reset_peak(accel_device d);

#endif
