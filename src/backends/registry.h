/* The backends layer's side of the device registry (core/backend.h): the
 * built-in tables it registers and the hostless test devices. Internal to
 * src/backends and the tests. */
#ifndef ACCEL_BACKENDS_REGISTRY_H
#define ACCEL_BACKENDS_REGISTRY_H

#include "core/backend.h"

/* The CPU backend's table (the reference every other backend is tested against). */
extern const accel_backend accel__cpu_backend;

/* The registered test backend with non-host pointers (src/backends/hostless):
 * registers `n` devices "hostless:0".."hostless:n-1". Also done at start-up
 * when the environment has ACCEL_TEST_DEVICES=n. Returns an error if a
 * different count was registered before. */
accel_status accel__hostless_register(int n);
/* Device memory of hostless:index in bytes (persistent allocations and
 * mapped virtual memory; the step pools are not counted): now, and the most
 * since the last accel__hostless_reset_peak (tests measure ZeRO-3 with it). */
typedef struct accel__hostless_memory {
    size_t in_use, peak;
} accel__hostless_memory;
accel__hostless_memory accel__hostless_memory_stats(int index);
void accel__hostless_reset_peak(int index);

#endif
