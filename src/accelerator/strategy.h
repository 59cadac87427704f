/* How a prepared model's parameters, gradients and optimizer state are laid
 * out over the processes and kept in step: one interface, several strategies.
 *
 *   DDP        (ddp.c)   every rank holds everything; gradients all-reduced
 *                        in buckets that overlap backward.
 *   ZeRO-1     (zero.c)  DDP's backward; the optimizer state and step
 *                        sharded, the updated shards all-gathered.
 *   ZeRO-2     (zero.c)  as ZeRO-1, gradients reduce-scattered into a shard
 *                        after backward instead of all-reduced.
 *   ZeRO-3     (zero3.c) parameters sharded too, per wrap unit, gathered
 *                        around each unit's forward and backward (FSDP
 *                        FULL_SHARD; offload_param included).
 *
 * The accelerator picks one at accel_accelerator_new (accel__strategy_of) and
 * every model it prepares keeps that pointer (accel__model.strat); the rest
 * of src/accelerator calls through it and never asks which one it is. A
 * strategy's per-model state is its own (DDP's shared gradient memory and
 * buckets, struct accel__ddp; ZeRO's shards and units,
 * accel__model.strat_state: zero_state.h).
 * Mixed precision (the autocast hook, model.c) and fp8 scaling
 * (fp8_scaling.c) sit beside the strategies: model.c installs them the same
 * way under each.
 *
 * Under hybrid sharding (HYBRID_SHARD) the sharding strategies shard over the
 * mesh's dp_shard group and average the shards over its dp_replicate group
 * (mesh.h): DDP over dp_replicate composed with the sharding over dp_shard. */
#ifndef ACCEL_ACCELERATOR_STRATEGY_H
#define ACCEL_ACCELERATOR_STRATEGY_H

#include "accelerator_internal.h"

struct accel__strategy {
    const char *name; /* "ddp", "zero1", "zero2", "zero3" */
    int stage;        /* what accel_accelerator_zero_stage reports: 0 (DDP), 1, 2, 3 */
    bool shards;      /* the flat buffers are padded to 16 x world elements, so every shard starts 64-byte aligned */
    bool fp8;         /* runs mixed_precision='fp8' (its scaling metas reduced beside whole gradients: DDP only) */
    bool pipeline;    /* runs under pipeline parallelism: DDP and ZeRO-1/2, whose shards are a stage's (its dp
                       * group's) and whose reduction waits for the step's last micro-batch; not ZeRO-3, whose
                       * per-unit gathers and reduce-scatters would run for every micro-batch's recompute */

    /* Model, in the order model.c calls them at prepare. layout: after the
     * flatten, before rank 0's weights are broadcast (shard bounds, shared
     * gradient memory). start: once every rank holds rank 0's weights and the
     * autocast hook is on (buckets; stage 3 keeps its pieces and hooks its
     * units). release: undoes both, whatever part of them ran (collective
     * under stage 3: the full parameters come back into the flat buffer);
     * it frees everything whatever fails, and returns the first failure
     * (what the model lost: stale gradients, a unit back as zeros). */
    accel_status (*layout)(accel_accelerator *acc, accel__model *pm);
    accel_status (*start)(accel_accelerator *acc, accel__model *pm);
    accel_status (*release)(accel_accelerator *acc, accel__model *pm);

    /* Backward. begin: true when the model wants grad_ready for its leaves
     * during this backward. grad_ready: true when leaf is the model's (its
     * reduction may start). end_backward: the reductions finished (or, for
     * DDP and ZeRO-1/2, skipped while gradients accumulate). */
    bool (*begin_backward)(accel_accelerator *acc, accel__model *pm);
    bool (*grad_ready)(accel_accelerator *acc, accel__model *pm, const accel_tensor *leaf);
    accel_status (*end_backward)(accel_accelerator *acc, accel__model *pm);
    /* Optional: the walk that fires grad_ready begins; accel__leaf_in_pass
     * says which leaves it reaches (the others fire nothing). */
    void (*pass_begin)(accel_accelerator *acc, accel__model *pm);

    /* Optimizer i, at prepare: NULL keeps the user's optimizer as it is;
     * else it is re-targeted to the model's shard (its state the strategy's
     * own, in acc->strat_opt[i]). release_optimizer gives it back its own
     * segments, with the consolidated state when consolidate (collective),
     * else only forgets; like release it always lets go, and returns the
     * first failure (the state could not be consolidated). optimizer_model:
     * the prepared model optimizer i was re-targeted to, NULL (or no entry)
     * while it is the user's as it was: what the rest of the Accelerator asks
     * (accel__optimizer_model). */
    accel_status (*prepare_optimizer)(accel_accelerator *acc, int i);
    accel_status (*release_optimizer)(accel_accelerator *acc, int i, bool consolidate);
    accel__model *(*optimizer_model)(accel_accelerator *acc, int i);
    /* The user's parameter u of re-targeted optimizer i (what its
     * consolidated state calls "state.<u>.*"), NULL when there is none. */
    accel_tensor *(*user_param)(accel_accelerator *acc, int i, int u);
    /* After the shard's optimizer step: every rank's updated parameters
     * where the next forward reads them (collective). */
    accel_status (*after_step)(accel_accelerator *acc, accel__model *pm);
    /* zero_grad of a re-targeted optimizer: the model's gradients, full and
     * shard. Its status: a device that fails the clearing. */
    accel_status (*zero_grad)(accel_accelerator *acc, accel__model *pm);
    /* The gradients the optimizer step reads. grad_shard: the f32 gradient
     * shard this rank holds, as a 1-d header in *h (returned); NULL (or no
     * entry) where the rank holds the model's full flat gradient buffers
     * (fp16's unscale goes over whichever, the ranks agreeing on inf when
     * sharded). clip: clip_grad_norm over what this rank holds: the global
     * norm (reduced over the group holding the other parts: the shard group;
     * none when every rank holds everything), every part scaled by
     * min(1, max_norm / norm); *norm gets the norm (NaN where a gradient is:
     * nothing scaled); an error status when a step of it failed. */
    accel_tensor *(*grad_shard)(accel__model *pm, accel_tensor *h);
    /* Megatron's sequence parallelism, after a backward that syncs: the
     * gradients of the parameters outside the tp regions (each tp rank's
     * from its positions only) summed over the tp group where this strategy
     * holds them: the whole gradients (accel__tp_sp_reduce), or the pieces
     * of the gradient shard (ZeRO-3); nothing
     * where the strategy summed them before its own reduction (ZeRO-2). */
    accel_status (*sp_reduce)(accel_accelerator *acc, accel__model *pm);
    accel_status (*clip)(accel_accelerator *acc, accel__model *pm, double max_norm, double norm_type, double *norm);
    /* accel_accelerator_zero_shard: this rank's range of the f32 flat buffer. */
    accel_status (*shard_range)(accel_accelerator *acc, accel__model *pm, int64_t *lo, int64_t *hi);

    /* Checkpoints of model i, NULL where rank 0 writes (and every rank reads)
     * the module's own state dict: save_state / load_state's model file,
     * save_model's weights (and the dtype it writes them in). */
    accel_status (*save_state)(accel_accelerator *acc, int i, const char *dir, bool failed);
    accel_status (*load_state)(accel_accelerator *acc, int i, const char *dir);
    accel_status (*save_model)(accel_accelerator *acc, accel__model *pm, const char *dir, int64_t max_shard_bytes,
                               bool failed);
    accel_dtype (*saved_dtype)(const accel_accelerator *acc);
    /* An error naming what to do when dir holds model i in this strategy's
     * own format (which its load_state reads) and a strategy without that
     * load_state is loading it; NULL where the strategy writes the plain
     * format. */
    accel_status (*refuse_foreign)(const char *dir, int i);

    /* Checkpoints of optimizer i, when prepare_optimizer re-targeted it
     * (accel__optimizer_model; the user's optimizer saves itself otherwise).
     * optimizer_state: its state consolidated into the user's per-tensor
     * vocabulary (collective; *bufs, accel_free each, back the tensors),
     * the count or -1; rank 0 writes it as optimizer[_<i>].safetensors, the
     * file DDP writes. load_optimizer_state: such state back into this
     * rank's shard (local). save_optimizer / load_optimizer (NULL: none): a
     * format of the strategy's own, written instead when it sets *own
     * (collective, joined after a local failure: `failed`), read when dir
     * holds it (*own; local). */
    int (*optimizer_state)(accel_accelerator *acc, int i, accel_named_state **out, float *bufs[2]);
    accel_status (*load_optimizer_state)(accel_accelerator *acc, int i, int n, const accel_named_state *st);
    /* load_optimizer_state's check of such state, nothing written (load_state
     * checks every file before loading any); NULL: checked as it loads. */
    accel_status (*check_optimizer_state)(accel_accelerator *acc, int i, int n, const accel_named_state *st);
    accel_status (*save_optimizer)(accel_accelerator *acc, int i, const char *dir, bool failed, bool *own);
    accel_status (*load_optimizer)(accel_accelerator *acc, int i, const char *dir, bool *own);
    /* Whether dir holds optimizer i in the strategy's own format (what
     * load_optimizer reads); NULL: never. */
    bool (*has_own_optimizer)(const char *dir, int i);
    /* load_optimizer's check of that format, nothing loaded (load_state
     * checks it before loading any model; local). */
    accel_status (*check_own_optimizer)(accel_accelerator *acc, int i, const char *dir);
};

extern const accel__strategy accel__strategy_ddp;   /* ddp.c */
extern const accel__strategy accel__strategy_zero1; /* zero.c */
extern const accel__strategy accel__strategy_zero2; /* zero.c */
extern const accel__strategy accel__strategy_zero3; /* zero3.c */

/* The strategy's optimizer_model of optimizer i (NULL without one). */
static inline accel__model *accel__optimizer_model(accel_accelerator *acc, int i) {
    return acc->strat->optimizer_model ? acc->strat->optimizer_model(acc, i) : NULL;
}

/* The strategy of a ZeRO stage (0: DDP), 0 .. ACCEL__STAGES - 1. strategy.c */
enum { ACCEL__STAGES = 4 };
const accel__strategy *accel__strategy_of(int stage);

/* ddp.c: the pieces ZeRO-1/2 compose with. share_grads: the flat gradient
 * buffers into memory the local ranks share (host_copy: a device buffer
 * keeps a host staging copy even where the group reduces device memory,
 * for ZeRO-2's reduce-scatter). */
accel_status accel__ddp_share_grads(accel_accelerator *acc, accel__model *pm, bool host_copy);
/* The host staging buffer share_grads made for flat gradient buffer d (a
 * device the host cannot address), NULL where there is none. */
void *accel__ddp_grad_stage(const accel__model *pm, int d);
accel_status accel__ddp_start(accel_accelerator *acc, accel__model *pm);
accel_status accel__ddp_release(accel_accelerator *acc, accel__model *pm);
bool accel__ddp_begin_backward(accel_accelerator *acc, accel__model *pm);
bool accel__ddp_grad_ready(accel_accelerator *acc, accel__model *pm, const accel_tensor *leaf);
accel_status accel__ddp_end_backward(accel_accelerator *acc, accel__model *pm);
/* clip over the full flat buffers (no collective). */
accel_status accel__ddp_clip(accel_accelerator *acc, accel__model *pm, double max_norm, double norm_type,
                             double *norm);

/* zero.c: the pieces ZeRO-3 composes with (the sharded optimizer). */
accel_status accel__zero_prepare_optimizer(accel_accelerator *acc, int i);
accel_status accel__zero_release_optimizer(accel_accelerator *acc, int i, bool consolidate);
accel__model *accel__zero_optimizer_model(accel_accelerator *acc, int i);
accel_tensor *accel__zero_user_param(accel_accelerator *acc, int i, int u);
/* Consolidated state in the user's per-tensor vocabulary (collective); *bufs
 * (accel_free each) back the tensors. Returns the count or -1. */
int accel__zero_state(accel_accelerator *acc, int i, accel_named_state **out, float *bufs[2]);
/* Restores consolidated state into this rank's shard (local). */
accel_status accel__zero_load_state(accel_accelerator *acc, int i, int n, const accel_named_state *st);
/* accel__zero_load_state's checks of st, nothing read or written (local). */
accel_status accel__zero_check_state(accel_accelerator *acc, int i, int n, const accel_named_state *st);
/* Optimizer i's state kinds (0, 1 or 2) and their names ("exp_avg", "exp_avg_sq", "momentum_buffer"). */
int accel__zero_kinds(accel_accelerator *acc, int i);
const char *accel__zero_kind_name(accel_accelerator *acc, int i, int k);
/* Optimizer i's tensor segments (the user's parameters, accel__zero_user_param):
 * their count, and each one's param group (*groups: the optimizer's, valid
 * while it is prepared). */
int accel__zero_segments(accel_accelerator *acc, int i, const int **groups);
/* This rank's optimizer state laid out like its parameter shard: local[k]
 * [zn] for each kind (accel_free each; NULL past the kinds) and the most steps
 * a run of this rank took (local: no collective). */
accel_status accel__zero_local_state(accel_accelerator *acc, int i, float *local[2], int64_t *step);
/* Restores optimizer i from shard-shaped state local[k] [zn] taken `step`
 * steps, and its scalar entries ("step", "param_groups.*"). Local. */
accel_status accel__zero_load_local(accel_accelerator *acc, int i, int n, const accel_named_state *scalars,
                                    float *const local[2], double step);
/* accel__zero_load_local's check, nothing loaded: the entries it would give
 * the optimizer, checked by it (local[k] only offset, never read). */
accel_status accel__zero_check_local(accel_accelerator *acc, int i, int n, const accel_named_state *scalars,
                                     float *const local[2], double step);
/* grad_shard and clip of every ZeRO stage: the gradient shard when there is one (zgrad), else as DDP. */
accel_tensor *accel__zero_grad_shard(accel__model *pm, accel_tensor *h);
accel_status accel__zero_clip(accel_accelerator *acc, accel__model *pm, double max_norm, double norm_type,
                              double *norm);
/* The sp_reduce of ZeRO-3 (stages 1-2 have theirs in zero.c). */
accel_status accel__zero3_sp_reduce(accel_accelerator *acc, accel__model *pm);
/* The ZeRO state (zero_state.h) with the single unit stages 1-2 shard (no
 * gradient shard: stage 2 adds it); accel__zero_model_free frees it. */
accel_status accel__zero_units(accel_accelerator *acc, accel__model *pm);

#endif
