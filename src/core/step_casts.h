/* Conversions of step tensors, made once per step (internal).
 *
 * Under autocast every GEMM op converts its activation operand to the
 * autocast dtype (accel__mm_operand). One activation often feeds several
 * projections: a decoder layer's normed input feeds q, k and v (and gate and
 * up), and each used to convert it again and save its own copy for the
 * backward. Here the calling thread remembers the last few conversions of
 * its step tensors, so the projections after the first read the first's
 * conversion: one conversion pass and one saved copy per activation and
 * dtype. (A persistent tensor's conversion is a prepared form instead,
 * core/prepared.h.)
 *
 * A conversion is handed out again only while it is sure to hold the
 * source's values:
 *   - the source's elements lie in the calling thread's step arena (the CPU),
 *     and the same elements in the same layout (data, dtype, shape, strides)
 *     are asked for: a view with another header of the same elements hits;
 *   - no rewind or reset of the step arena has gone below the conversion
 *     since it was made (arena watch ACCEL__WATCH_STEP_CASTS): the source is
 *     older than its conversion, so both are still the tensors they were;
 *   - no write was reported to the source's or the conversion's bytes since
 *     (accel__storage_written: every library write into a tensor, and
 *     accel_tensor_increment_version for the caller's own).
 * Memory: the conversions are step tensors (freed with the step), the table
 * a few entries per thread. Off with the prepared weights
 * (accel__prepared_set_enabled(false), ACCEL_WEIGHT_CACHE=0): every call
 * converts again, the uncached reference of the tests. */
#ifndef ACCEL_CORE_STEP_CASTS_H
#define ACCEL_CORE_STEP_CASTS_H

#include <stddef.h>

#include "accel/core.h"

/* Makes src's conversion of `kind` (an ACCEL__FORM_* of core/prepared.h)
 * to dtype dt: a new step tensor, or NULL with the error set. */
typedef accel_tensor *(*accel__step_cast_make)(accel_tensor *src, int kind, accel_dtype dt);

/* src's conversion of (kind, dt) made earlier in this step, or else make's,
 * remembered when src is a step tensor of this thread's. NULL + error when
 * make fails. */
accel_tensor *accel__step_cast(accel_tensor *src, int kind, accel_dtype dt, accel__step_cast_make make);

/* Remembers cast (a step tensor of src's shape, dtype dt, holding exactly
 * what src's conversion of (kind, dt) would: an op that made it in the
 * pass that wrote src, as the RMSNorm before the projections) as src's
 * conversion, in place of any remembered before; nothing where src's
 * conversions are not remembered. Call it after src's and cast's last
 * writes (a write reported to either forgets it). */
void accel__step_cast_offer(accel_tensor *src, int kind, accel_dtype dt, accel_tensor *cast);

/* src's conversion of (kind, dt) that an op offered and no one was handed
 * (accel__step_cast shares what it hands out: a GEMM saves it), forgotten
 * here: the caller's alone from now on (it may write it, as a gradient it
 * becomes); NULL (no error) when there is none. */
accel_tensor *accel__step_cast_take(const accel_tensor *src, int kind, accel_dtype dt);
/* The calling thread's conversions taken so far (the tests' evidence). */
uint64_t accel__step_cast_takes(void);

/* Forgets the calling thread's conversions of, or into, bytes [p, p + n)
 * (they were written). Called by accel__storage_written. */
void accel__step_casts_written(const void *p, size_t n);
/* Whether the calling thread remembers any conversion (a write must then be
 * reported even where no storage is tracked). */
bool accel__step_casts_held(void);

#endif
