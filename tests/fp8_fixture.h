/* The tests' stand-in for a prepared fp8 model's forward hook (src/accelerator/
 * ddp.c), on the cpu where the Accelerator refuses fp8: m(x) under the fp8
 * autocast of r with fs's forward log and weight cache, then the forward's X
 * and W updates for the Linears that ran. NULL (error set) on failure. */
#ifndef ACCEL_TESTS_FP8_FIXTURE_H
#define ACCEL_TESTS_FP8_FIXTURE_H

#include "accelerator/fp8_scaling.h"
#include "ops/fp8_linear.h"

static inline accel_tensor *fp8_hooked_forward(accel_module *m, accel_tensor *x, const accel__fp8_recipe *r,
                                               accel__fp8_state *fs) {
    const accel__fp8_recipe *prev = accel__fp8_autocast_begin(r);
    accel__fp8_log *lp = accel__fp8_log_begin(&fs->forward);
    accel__fp8_cache *cp = accel__fp8_cache_begin(&fs->cache);
    accel_tensor *y = accel_module_call(m, x);
    accel__fp8_cache_end(cp);
    accel__fp8_log_end(lp);
    accel__fp8_autocast_end(prev);
    if (y && accel__fp8_reduce_and_update(NULL, fs, ACCEL__FP8_X, 2, *r, &fs->forward) != ACCEL_OK) return NULL;
    return y;
}

#endif
