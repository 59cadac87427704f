/* The built-in backends (core/backend.h's accel__backends_init): the
 * registry in core calls this once; core itself names no backend. */
#include <stdio.h>

#include "backends/registry.h"
#include "core/env.h"

void accel__backends_init(void) {
    accel__backend_register(&accel__cpu_backend);
    long v;
    if (accel__env_long("ACCEL_TEST_DEVICES", 0, 1, 8, &v) != ACCEL_OK ||
        (v && accel__hostless_register((int)v) != ACCEL_OK)) {
        fprintf(stderr, "accel: %s\n", accel_last_error());
        accel_clear_error();
    }
}
