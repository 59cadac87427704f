/* Helpers shared by the pointwise, reduction, shape and device ops (not public API). */
#ifndef ACCEL_OPS_UTIL_H
#define ACCEL_OPS_UTIL_H

#include "core/backend.h"
#include "op_internal.h"

/* A contiguous f32 tensor with t's values: t itself when it already is one,
 * else an arena copy (strided gather, then dtype conversion). CPU tensors only. */
accel_tensor *accel__dense_f32(accel_tensor *t);
/* A contiguous tensor of t's dtype: t itself or an arena copy. */
accel_tensor *accel__dense(accel_tensor *t);
/* A new header sharing a's data, recorded on the tape as an identity op
 * named `op` (the gradient flows straight back to a). */
accel_tensor *accel__alias_op(const char *op, accel_tensor *a);
/* Backward of ops whose output holds the input's elements in the same
 * row-major order (reshape, squeeze, unsqueeze, alias): reshapes the gradient. */
accel_status accel__reshape_backward(accel_node *n, accel_tensor *g);

#endif
