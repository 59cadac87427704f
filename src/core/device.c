/* Device names and availability. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/core.h"

const char *accel_device_type_name(accel_device_type t) {
    switch (t) {
    case ACCEL_DEV_CPU: return "cpu";
    case ACCEL_DEV_META: return "meta";
    case ACCEL_DEV_CUDA: return "cuda";
    }
    return "unknown";
}

const char *accel_device_str(accel_device d, char *buf, size_t n) {
    if (d.type == ACCEL_DEV_CUDA) snprintf(buf, n, "cuda:%d", d.index);
    else snprintf(buf, n, "%s", accel_device_type_name(d.type));
    return buf;
}

bool accel_device_eq(accel_device a, accel_device b) {
    return a.type == b.type && (a.type != ACCEL_DEV_CUDA || a.index == b.index);
}

accel_status accel_device_parse(const char *s, accel_device *out) {
    if (!s || !out) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_device_parse: NULL argument");
    if (strcmp(s, "cpu") == 0) { *out = ACCEL_CPU_DEVICE; return ACCEL_OK; }
    if (strcmp(s, "meta") == 0) { *out = ACCEL_META_DEVICE; return ACCEL_OK; }
    if (strncmp(s, "cuda", 4) == 0 && (s[4] == '\0' || s[4] == ':')) {
        int idx = 0;
        if (s[4] == ':') {
            char *end;
            long v = strtol(s + 5, &end, 10);
            if (end == s + 5 || *end || v < 0 || v > 1023)
                return accel_set_error(ACCEL_ERR_INVALID_ARG, "bad device index in '%s'", s);
            idx = (int)v;
        }
        *out = (accel_device){ACCEL_DEV_CUDA, idx};
        return ACCEL_OK;
    }
    return accel_set_error(ACCEL_ERR_DEVICE,
                           "unknown device '%s': this build of accel supports cpu, meta%s", s,
#ifdef ACCEL_WITH_CUDA
                           " and cuda:N"
#else
                           " (cuda:N needs a build with CUDA)"
#endif
    );
}

bool accel_device_available(accel_device d) {
    switch (d.type) {
    case ACCEL_DEV_CPU:
    case ACCEL_DEV_META: return true;
    case ACCEL_DEV_CUDA: return false; /* this build has no CUDA backend */
    }
    return false;
}
