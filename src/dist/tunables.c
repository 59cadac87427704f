/* src/dist/tunables.c — the backends' integer environment tunables. */
#include <errno.h>
#include <stdlib.h>

#include "dist/backend.h"

accel_status accel__env_long(const char *name, long dflt, long lo, long hi, long *out) {
    const char *v = getenv(name);
    if (!v || !*v) {
        *out = dflt;
        return ACCEL_OK;
    }
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (end == v || *end || errno == ERANGE || x < lo || x > hi)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_dist_init: %s='%s' is not an integer between %ld and %ld",
                               name, v, lo, hi);
    *out = x;
    return ACCEL_OK;
}
