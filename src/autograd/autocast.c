/* The calling thread's autocast dtype (autograd.h): a mode the thread scopes
 * around its own calls, as grad mode is. Ops read it; it lives below them
 * because activation checkpointing (tape.c) replays a forward under the
 * autocast that forward first ran in. */
#include "accel/autograd.h"

static _Thread_local accel_dtype tl_autocast = ACCEL_F32;

accel_dtype accel_autocast_begin(accel_dtype dt) {
    accel_dtype prev = tl_autocast;
    tl_autocast = dt;
    return prev;
}

void accel_autocast_end(accel_dtype previous) { tl_autocast = previous; }
accel_dtype accel_autocast_dtype(void) { return tl_autocast; }
