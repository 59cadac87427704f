/* The RMSNorm variant for the norms whose output the projections read next
 * (src/nn/layers.c: a decoder layer's input norms, the final norm). */
#ifndef ACCEL_OPS_NORM_H
#define ACCEL_OPS_NORM_H

#include "accel/ops.h"

/* accel_rms_norm, whose output (f32 under autocast) is the activation
 * operand of the GEMMs that read it next. Under autocast on the CPU, where
 * the GEMMs multiply the autocast dtype itself (oneDNN on bf16 units), the
 * kernel also rounds each row to that dtype while the row is in L1, and the
 * copy is the step's conversion of the output (core/step_casts.h): the first
 * projection finds it made instead of reading the output again to convert
 * it. The same values and gradients as accel_rms_norm. The copy is made
 * whether or not a GEMM then reads this very tensor (a sequence-parallel
 * projection gathers it first; a prefill slices the final norm's output):
 * there it is written and not read. */
accel_tensor *accel__rms_norm_gemm_input(accel_tensor *x, accel_tensor *w, double eps);

#endif
