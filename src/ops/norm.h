/* The RMSNorm variant for a decoder's norms (src/nn/layers.c): their output
 * the projections' input, their input a residual stream. */
#ifndef ACCEL_OPS_NORM_H
#define ACCEL_OPS_NORM_H

#include "accel/ops.h"

/* What a norm's output and input are to the ops around it (a mask). */
enum {
    /* its output is the activation operand of the GEMMs that read it next */
    ACCEL__NORM_OUT_TO_GEMMS = 1,
    /* its input is a residual stream: an f32 sum whose other term is a
     * branch of the autocast dtype (a projection's output) */
    ACCEL__NORM_IN_RESIDUAL = 2
};

/* accel_rms_norm of a norm with these roles. Under autocast on the CPU, with
 * the step's conversions remembered (core/step_casts.h):
 *   - OUT_TO_GEMMS, where the GEMMs multiply the autocast dtype itself
 *     (oneDNN on bf16 units): the kernel also rounds each output row to
 *     that dtype while the row is in L1, offered as the output's
 *     conversion: the first projection finds it made instead of reading the
 *     output again to convert it;
 *   - IN_RESIDUAL: the backward's kernel rounds the input's gradient (where
 *     it writes x's gradient itself) the same way, offered as that
 *     gradient's conversion: the sum's backward takes it as the branch's
 *     gradient (accel_grad_accumulate) instead of converting it.
 * The same values and gradients as accel_rms_norm. A copy is made whether
 * or not it is then read (a sequence-parallel projection gathers the
 * output first; a prefill slices the final norm's output; activation
 * checkpointing hands a layer's input through a copy; a pipeline stage's
 * first input is received, no sum): there it is written and not read. A
 * conversion is taken only while it holds the gradient's current values:
 * a later write into it (accel_grad_accumulate, accel__gbuf_end) forgets it. */
accel_tensor *accel__rms_norm_with_roles(accel_tensor *x, accel_tensor *w, double eps, unsigned roles);

#endif
