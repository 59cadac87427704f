/* The liveness check of the handles other than tensors (handle.h). */
#include "core/handle.h"

bool accel__handle_dead(uint32_t magic, uint32_t want, const char *fn, const char *what) {
    if (magic == want) return false;
    accel_set_error(ACCEL_ERR_STATE, "%s: the %s is not a live one (freed already, or corrupt)", fn, what);
    return true;
}
