/* find_executable_batch_size: retry with a smaller batch after an OOM. */
#include "accel/accelerator.h"

accel_status accel_find_executable_batch_size(accel_batch_size_fn fn, void *ctx, int64_t starting_batch_size,
                                              accel_reduce_batch_size_fn reduce, int64_t *found) {
    if (!fn) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_find_executable_batch_size: fn is NULL");
    if (starting_batch_size < 0)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_find_executable_batch_size: starting_batch_size %lld < 0",
                               (long long)starting_batch_size);
    for (int64_t bs = starting_batch_size;;) {
        if (bs <= 0) return accel_set_error(ACCEL_ERR_OOM, "No executable batch size found, reached zero.");
        accel_status st = fn(ctx, bs);
        if (st != ACCEL_ERR_OOM) {
            if (!st && found) *found = bs;
            return st;
        }
        /* clear_device_cache: the failed attempt's step tensors and the
         * arena's high-water chunk go back before the smaller try. */
        accel_clear_error();
        accel_thread_cleanup();
        bs = reduce ? reduce(ctx, bs) : (int64_t)((double)bs * 0.9);
    }
}
