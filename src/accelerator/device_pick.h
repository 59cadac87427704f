/* The device an accelerator runs on (state.c), for those that report it
 * without making one (`accel env`). */
#ifndef ACCEL_ACCELERATOR_DEVICE_PICK_H
#define ACCEL_ACCELERATOR_DEVICE_PICK_H

#include "accel/core.h"

/* The device accel_accelerator_new with default options would pick on
 * local rank local_rank: ACCEL_DEFAULT_DEVICE's, else the cpu when
 * ACCELERATE_USE_CPU / ACCEL_USE_CPU say so, else cuda:<local_rank> where
 * there is one, else the cpu. ACCEL_OK, or the error of a variable that
 * holds no boolean. */
accel_status accel__accelerator_device(int local_rank, accel_device *out);

#endif
