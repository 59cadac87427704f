/* Helpers shared by the op implementations (not public API).
 *
 * The shape of every op:
 *
 *   accel_tensor *accel_foo(accel_tensor *a, accel_tensor *b) {
 *       accel_tensor *in[2] = {a, b};
 *       accel_device dev;
 *       if (!accel__op_begin("accel_foo", 2, in, &dev)) return NULL;   // NULLs, dead tensors, devices
 *       ... shape / dtype checks with errors naming the op and both shapes ...
 *       accel_tensor *out = accel__op_out(dt, ndim, shape, dev);         // header only on meta
 *       if (!out || dev.type == ACCEL_DEV_META) return accel__op_record_meta(...) or out;
 *       ... kernel (fast path, and the reference path under accel_reference_kernels()) ...
 *       accel_node *n = accel_tape_record("foo", foo_backward, out, 2, in);
 *       if (n) { n->saved[0] = ...; }
 *       return out;
 *   }
 *
 * Backward functions run with grad mode off and call accel_grad_accumulate
 * for each input that requires grad.
 */
#ifndef ACCEL_OP_INTERNAL_H
#define ACCEL_OP_INTERNAL_H

#include "accel/autograd.h"
#include "accel/ops.h"
#include "core/core_internal.h"

/* Checks inputs (NULL entries are errors unless optional_mask has bit i set),
 * liveness, and that all non-NULL inputs share one device (meta counts as
 * compatible with anything: an op with a meta input runs on meta). Writes the
 * op's device to *dev. */
bool accel__op_begin(const char *op, int n, accel_tensor *const *in, accel_device *dev);
bool accel__op_begin_opt(const char *op, int n, accel_tensor *const *in, unsigned optional_mask,
                         accel_device *dev);

/* Requires a floating dtype. */
bool accel__op_check_float(const char *op, const accel_tensor *t, const char *arg);

/* PyTorch type promotion among floats (f64 > f32 > {bf16,f16}; bf16+f16 -> f32). */
accel_dtype accel__promote(accel_dtype a, accel_dtype b);

/* Broadcast shape of a and b (error names the op and both shapes). */
bool accel__broadcast_shape(const char *op, const accel_tensor *a, const accel_tensor *b,
                            int *ndim, int64_t *shape);

/* Output tensor of the op: arena tensor on dev (no data on meta). */
accel_tensor *accel__op_out(accel_dtype dt, int ndim, const int64_t *shape, accel_device dev);

/* A contiguous f32 version of t for a kernel to read: t itself when it is
 * already contiguous f32, else a converted arena copy. */
accel_tensor *accel__f32_contig(accel_tensor *t);
/* Contiguous copy/alias of t in its own dtype. */
accel_tensor *accel__contig(accel_tensor *t);
/* A contiguous t in dtype dt: t itself when it already is, else a converted
 * (rounded) arena copy. accel__contig and accel__f32_contig are its two
 * common cases. */
accel_tensor *accel__contig_as(accel_tensor *t, accel_dtype dt);
/* Converts an f32 contiguous result into a new tensor of dtype dt (alias when
 * dt is f32). */
accel_tensor *accel__from_f32(accel_tensor *f32, accel_dtype dt);

/* Normalises a possibly negative dim; error names the op. */
bool accel__norm_dim(const char *op, int dim, int ndim, int *out);

/* Formats "op: shapes [..] and [..] ..." errors. */
accel_status accel__shape_error2(const char *op, const accel_tensor *a, const accel_tensor *b,
                                 const char *why);

#endif
