/* mixed_precision='fp8' in the Accelerator: TransformerEngine's recipe
 * (DelayedScaling) from the options and the environment, and its
 * reduce_and_update_fp8_tensors across ranks (reduce_amax, on by default,
 * over the data-parallel group). Internal. */
#ifndef ACCEL_ACCELERATOR_FP8_SCALING_H
#define ACCEL_ACCELERATOR_FP8_SCALING_H

#include "accel/accelerator.h"
#include "accel/dist.h"
#include "accel/nn.h"
#include "backends/fp8.h"

/* The recipe of o's fp8_* fields, each unset one from its ACCEL_FP8_<NAME> /
 * ACCELERATE_FP8_<NAME> variable, else Accelerate's default (the field wins,
 * as an explicit TERecipeKwargs over the launcher's variables); a bad value
 * is an error naming the field or the variable and the value (INVALID_ARG;
 * UNSUPPORTED for values Accelerate takes and accel does not run: backends
 * other than TE, fp8_format E5M2, an overridden GEMM precision). Called by
 * accel_accelerator_new before its device check, and by the tests. */
accel_status accel__fp8_recipe_resolve(const accel_accelerator_opts *o, accel__fp8_recipe *r);

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
