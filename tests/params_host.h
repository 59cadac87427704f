/* Every parameter of a module copied to host floats, for tests that compare
 * weights across runs and devices. */
#ifndef ACCEL_TESTS_PARAMS_HOST_H
#define ACCEL_TESTS_PARAMS_HOST_H

#include "accel/accel.h"
#include "check.h"

/* Every parameter of m as host floats, concatenated into out (room for cap);
 * returns the count. */
static inline int64_t params_to_host(accel_module *m, float *out, int64_t cap) {
    accel_tensor **ps;
    int n = accel_module_parameters(m, &ps);
    int64_t k = 0;
    for (int i = 0; i < n; i++) {
        int64_t c = accel_numel(ps[i]);
        CHECK(k + c <= cap);
        if (k + c <= cap) CHECK(accel_to_floats(ps[i], out + k) == ACCEL_OK);
        k += c;
    }
    accel_free(ps);
    return k;
}

#endif
