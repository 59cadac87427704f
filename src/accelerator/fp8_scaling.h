/* mixed_precision='fp8' in the Accelerator: TransformerEngine's recipe
 * (DelayedScaling) from the options and the environment, and its
 * reduce_and_update_fp8_tensors across ranks (reduce_amax, on by default,
 * over every rank of the job: the data-parallel ranks, and the tensor-
 * parallel ones, whose slices' amaxes MAX to the whole tensor's, as TE's
 * amax reduction group and Megatron's dp x tp group). Internal. */
#ifndef ACCEL_ACCELERATOR_FP8_SCALING_H
#define ACCEL_ACCELERATOR_FP8_SCALING_H

#include "accel/accelerator.h"
#include "accel/dist.h"
#include "accel/nn.h"
#include "backends/fp8.h"
#include "ops/fp8_linear.h"

/* The recipe of o's fp8_* fields, each unset one from its ACCEL_FP8_<NAME> /
 * ACCELERATE_FP8_<NAME> variable, else Accelerate's default (the field wins,
 * as an explicit TERecipeKwargs over the launcher's variables); a bad value
 * is an error naming the field or the variable and the value (INVALID_ARG;
 * UNSUPPORTED for values Accelerate takes and accel does not run: backends
 * other than TE, fp8_format E5M2). read_env false checks the fields alone:
 * accel_accelerator_new refuses a bad fp8_* field whatever mixed_precision
 * says (as TERecipeKwargs does when made) but reads the variables only for
 * "fp8" (a stray ACCELERATE_FP8_* does not fail a bf16 run). Called by
 * accel_accelerator_new before its device check, and by the tests. */
accel_status accel__fp8_recipe_resolve(const accel_accelerator_opts *o, bool read_env, accel__fp8_recipe *r);

/* A prepared fp8 model's scaling state, made once at prepare and freed with
 * the model's preparation (no allocation in a step): its metas, the buffer
 * their amaxes are reduced in, the log of the metas its forward ran, and
 * its weights' fp8 casts kept across calls. */
typedef struct accel__fp8_state {
    int n;
    accel_tensor **metas;   /* [n]: the tree's metas depth first (nn/fp8_modules.h), the modules' */
    accel_tensor *buf;      /* f32 [n * ACCEL__FP8_SLOTS] on the metas' device, owned; NULL when n is 0 */
    accel__fp8_log forward; /* the metas of the forward running now (ops/fp8_linear.h), room for n */
    accel__fp8_cache cache; /* the weight casts (ops/fp8_linear.h), begun with the forward's log */
} accel__fp8_state;

/* *out: root's state (accel__fp8_convert_model already ran), freed with
 * accel__fp8_state_free. */
accel_status accel__fp8_state_new(accel_module *root, accel__fp8_state **out);
void accel__fp8_state_free(accel__fp8_state *s); /* NULL: nothing */

/* prepare's fp8 part for pm (its devices already checked): TE's
 * convert_model (nn/fp8_modules.h), pm->fp8 made, and acc's backward log
 * grown to hold every prepared model's metas. */
struct accel__model;
accel_status accel__fp8_prepare(accel_accelerator *acc, struct accel__model *pm);

/* A log with room for cap metas (grows, keeping nothing; at prepare), and its release. */
accel_status accel__fp8_log_reserve(accel__fp8_log *log, int cap);
void accel__fp8_log_free(accel__fp8_log *log);

/* Slots [first, first + n) of the metas of s that ran (those in `ran`; every
 * one when ran is NULL), as TransformerEngine updates the modules that ran
 * in an fp8_autocast: the current amaxes of all of s's metas MAX-reduced
 * over pg in one all_reduce (none when pg is NULL or has one rank; a meta
 * that did not run adds its zeros), then each meta that ran has its scales
 * updated and its history rotated (accel__fp8_meta_update), so that every
 * rank ends with the same scales and histories. Nothing (no collective)
 * when none of them ran. Every rank of pg calls it with the same model
 * structure, and the same metas ran on each (as under TE). The Accelerator
 * calls it after each forward of a prepared fp8 model (slots X and W, the
 * forward's log) and after each backward (DY, the backward's log: a model
 * outside that loss keeps its scales); tests call it directly on cpu metas
 * (the primitives' CPU reference). */
accel_status accel__fp8_reduce_and_update(accel_pg *pg, accel__fp8_state *s, int first, int n, accel__fp8_recipe r,
                                          const accel__fp8_log *ran);

#endif
