/* Accelerate's str_to_bool (str_to_bool.h). */
#include "core/str_to_bool.h"

#include <string.h>
#include <strings.h>

int accel__str_to_bool(const char *s, size_t len) {
    static const char *const YES[] = {"y", "yes", "t", "true", "on", "1"};
    static const char *const NO[] = {"n", "no", "f", "false", "off", "0"};
    for (size_t i = 0; i < sizeof YES / sizeof *YES; i++) {
        if (strlen(YES[i]) == len && !strncasecmp(s, YES[i], len)) return 1;
        if (strlen(NO[i]) == len && !strncasecmp(s, NO[i], len)) return 0;
    }
    return -1;
}

accel_status accel__parse_bool(const char *fn, const char *name, const char *value, bool *out) {
    if (!value) return ACCEL_OK;
    int b = accel__str_to_bool(value, strlen(value));
    if (b < 0)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: %s=%s is not a boolean (y, yes, t, true, on, 1 or n, "
                               "no, f, false, off, 0)", fn, name, value);
    *out = b == 1;
    return ACCEL_OK;
}
