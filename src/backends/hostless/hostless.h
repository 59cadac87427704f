/* The hostless test backend's counters of its pinned host memory
 * (host_alloc/host_free), for tests of the staging paths: how much host
 * staging a copy uses, and that it is allocated once and reused. */
#ifndef ACCEL_BACKENDS_HOSTLESS_H
#define ACCEL_BACKENDS_HOSTLESS_H

#include <stdint.h>

typedef struct accel__hostless_host_counts {
    int64_t allocs, frees; /* host_alloc / host_free calls that succeeded, since start-up */
    int64_t live_bytes;    /* allocated and not yet freed */
    int64_t peak_bytes;    /* most live_bytes at once since start-up or the last peak reset */
} accel__hostless_host_counts;

void accel__hostless_host_stats(accel__hostless_host_counts *out);
/* Restarts the peak from the bytes live now. */
void accel__hostless_host_peak_reset(void);
/* The next n host_alloc calls fail with ACCEL_ERR_OOM (0: none), as
 * cudaMallocHost does when pinned memory runs out. */
void accel__hostless_host_fail_next(int n);
/* The next n vm_map calls fail with ACCEL_ERR_OOM (0: none), as cuMemCreate
 * does when the device is full (tests of ZeRO-3's agreement on a failed mapping). */
void accel__hostless_vm_fail_next(int n);

#endif
