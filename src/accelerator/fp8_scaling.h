/* mixed_precision='fp8' across ranks: TransformerEngine's
 * reduce_and_update_fp8_tensors (DelayedScaling's reduce_amax, on by default,
 * over the data-parallel group). Internal. */
#ifndef ACCEL_ACCELERATOR_FP8_SCALING_H
#define ACCEL_ACCELERATOR_FP8_SCALING_H

#include "accel/dist.h"
#include "accel/nn.h"
#include "backends/fp8.h"

/* Slots [first, first + n) of every fp8 meta of root's tree
 * (nn/fp8_modules.h): their current amaxes MAX-reduced over pg in one
 * all_reduce (none when pg is NULL or has one rank), then each meta's scales
 * updated and its history rotated (accel__fp8_meta_update), so that every
 * rank ends with the same scales and histories. Every rank of pg calls it
 * with the same model structure. The Accelerator calls it after each
 * forward of a prepared fp8 model (slots X and W) and after each backward
 * (DY); tests call it directly on cpu metas (the primitives' CPU reference). */
accel_status accel__fp8_reduce_and_update(accel_pg *pg, accel_module *root, int first, int n, accel__fp8_recipe r);

#endif
