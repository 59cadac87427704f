/* Runs a check in every CPU kernel variant this machine can run
 * (core/cpuinfo.h: baseline, avx2, avx512), then restores the variant in
 * use: the fast kernels' tests compare each variant with the reference. */
#ifndef ACCEL_TESTS_EACH_CPU_VARIANT_H
#define ACCEL_TESTS_EACH_CPU_VARIANT_H

#include <stdio.h>

#include "check.h"
#include "core/cpuinfo.h"

/* fn(name): the check, with the variant's name for its messages. */
static inline void each_cpu_variant(void (*fn)(const char *name)) {
    accel__cpu_variant start = accel__cpu_variant_current();
    for (int v = 0; v < ACCEL__CPU_N_VARIANTS; v++) {
        if (!accel__cpu_variant_runnable((accel__cpu_variant)v)) continue;
        CHECK(accel__cpu_variant_use((accel__cpu_variant)v) == ACCEL_OK);
        const char *name = accel__cpu_variant_name((accel__cpu_variant)v);
        fprintf(stderr, "variant %s\n", name);
        fn(name);
    }
    CHECK(accel__cpu_variant_use(start) == ACCEL_OK);
}

#endif
