/* The fp8 Linear (mixed_precision='fp8', TransformerEngine's te.Linear under
 * fp8_autocast with delayed scaling) and the thread's fp8 autocast. Not
 * public API: the Accelerator turns it on for the Linears it converted
 * (nn/fp8_modules.h). */
#ifndef ACCEL_OPS_FP8_LINEAR_H
#define ACCEL_OPS_FP8_LINEAR_H

#include "accel/core.h"
#include "backends/fp8.h"

/* The recipe of the calling thread's fp8 autocast, NULL when off. begin
 * returns the previous one for end (nests like accel_autocast_begin); the
 * recipe must outlive the autocast. */
const accel__fp8_recipe *accel__fp8_autocast(void);
const accel__fp8_recipe *accel__fp8_autocast_begin(const accel__fp8_recipe *r);
void accel__fp8_autocast_end(const accel__fp8_recipe *previous);

/* Which fp8 metas took part in a region of the calling thread (a forward
 * of a prepared model, a backward): while a log is begun, each fp8 Linear
 * notes its meta once when it runs forward or backward. The owner gives the
 * storage (metas [cap], no allocation here); a meta past cap sets
 * overflow. begin empties log and returns the previous one for end (nests
 * like the autocast; NULL begins none). */
typedef struct accel__fp8_log {
    accel_tensor **metas;
    int n, cap;
    bool overflow;
} accel__fp8_log;
accel__fp8_log *accel__fp8_log_begin(accel__fp8_log *log);
void accel__fp8_log_end(accel__fp8_log *previous);
/* Whether meta is in log (an overflowed log holds every meta). */
bool accel__fp8_log_has(const accel__fp8_log *log, const accel_tensor *meta);

/* A prepared model's fp8 weight casts, kept across calls (TransformerEngine's
 * weight caching under is_first_microbatch): while begun on the calling
 * thread, the fp8 Linear whose meta is metas[i] casts its weight into the
 * weight's prepared forms (core/prepared.h, ACCEL__FORM_FP8 / _FP8_T: made
 * once per version of the weight, freed with it) through cache row i of
 * `state` (backends/fp8.h's accel__fp8_quantize_cached): the cast is redone
 * only when the weight was written or its scale moved, and a reused cast
 * records the amax its cast measured, so forward, backward and the results
 * are those of a cast per call. The forms are row i's own (their key's tag
 * is &use[i]): a weight that two Linears share, in one model or in two
 * prepared models' states, has a cast per row, each made with that row's
 * scale, never the other's. A Linear called again in the same step
 * (accel_step_reset to accel_step_reset) casts into the step arena instead,
 * as the prepared weights do, since its earlier call's backward may still
 * read the cast. The owner (the Accelerator's accel__fp8_state) holds the
 * storage; no allocation here. */
typedef struct accel__fp8_cache_use {
    const accel_arena *arena; /* the step that last read row i: its generation */
    uint32_t gen;
} accel__fp8_cache_use;
typedef struct accel__fp8_cache {
    int n;
    accel_tensor **metas;       /* [n] */
    accel_tensor *state;        /* f32 [n, ACCEL__FP8_CACHE_WORDS] on the metas' device (accel__fp8_cache_state_new) */
    accel__fp8_cache_use *use;  /* [n] */
    int *rows, mask;            /* [mask + 1]: the row of a meta, open-addressed by its address (-1: empty) */
} accel__fp8_cache;
/* The slot of meta in c->rows: its row's, or the empty one where it would go. */
int accel__fp8_cache_slot(const accel__fp8_cache *c, const accel_tensor *meta);
accel__fp8_cache *accel__fp8_cache_begin(accel__fp8_cache *cache); /* returns the previous one for end */
void accel__fp8_cache_end(accel__fp8_cache *previous);

/* y = x W^T + b as accel_linear, with the GEMMs in fp8 (backends/fp8.h):
 * x [..., in] and W [out, in] cast to E4M3 with the scales of `meta`'s
 * slots X and W, y in f32 from the fp8 GEMM (bias added in f32), returned in
 * the autocast dtype (f32 without one); backward casts dY to E5M2 (E4M3
 * unless r.hybrid) with slot DY's scale, dX = dY W and dW = dY^T X in fp8,
 * the bias gradient from the unquantised dY. Each cast records its amax in
 * meta's history and the slot's scale is updated after it (forward: X and
 * W; backward: DY), so the next step uses scales of this one (delayed
 * scaling); under r.deferred_update the casts only record their amaxes and
 * the recipe's owner updates the scales (accelerator/fp8_scaling.h).
 * r.high_precision[g] runs GEMM g (ACCEL__FP8_FPROP, _DGRAD, _WGRAD) as
 * accel_linear does instead (the autocast dtype's operands, f32
 * accumulation), and only the tensors an fp8 GEMM reads are cast (and raise
 * their amax, and have their slot updated). The rows (product of x's dims
 * but the last), in and out must be multiples of 16 (the fp8 GEMMs' rule, as TransformerEngine's). meta: an
 * fp8 meta on x's device (accel__fp8_meta_new); a cpu meta runs the CPU
 * reference. */
accel_tensor *accel__fp8_linear(accel_tensor *x, accel_tensor *w, accel_tensor *b, accel_tensor *meta,
                                accel__fp8_recipe r);

#endif
