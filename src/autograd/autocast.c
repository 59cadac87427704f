/* The calling thread's autocast dtype (autograd.h): a mode the thread scopes
 * around its own calls, as grad mode is. Ops read it; it lives below them
 * because activation checkpointing (tape.c) replays a forward under the
 * autocast that forward first ran in. */
#include "accel/autograd.h"

static _Thread_local accel_dtype tl_autocast = ACCEL_F32;

/* An autocast dtype the ops can take (ops.h): f32 (off), bf16 or f16. An
 * integer one made a Linear return truncated integers, and one out of the
 * enum made ops fail, some without an error. False + error naming fn. */
static bool autocast_dtype_ok(const char *fn, accel_dtype dt) {
    if (dt == ACCEL_F32 || dt == ACCEL_BF16 || dt == ACCEL_F16) return true;
    accel_set_error(ACCEL_ERR_DTYPE, "%s: cannot autocast to %s (%d): bfloat16 or float16, or float32 for off", fn,
                    accel_dtype_name(dt), (int)dt);
    return false;
}

accel_dtype accel_autocast_begin(accel_dtype dt) {
    accel_dtype prev = tl_autocast;
    if (autocast_dtype_ok("accel_autocast_begin", dt)) tl_autocast = dt;
    return prev;
}

void accel_autocast_end(accel_dtype previous) {
    if (autocast_dtype_ok("accel_autocast_end", previous)) tl_autocast = previous;
}
accel_dtype accel_autocast_dtype(void) { return tl_autocast; }
