/* Shared between the files of src/accelerator. */
#ifndef ACCEL_ACCELERATOR_INTERNAL_H
#define ACCEL_ACCELERATOR_INTERNAL_H

#include <stdio.h>

#include "accel/accelerator.h"
#include "accel/dist.h"
#include "accel/io.h"
#include "backends/fp8.h"
#include "ops/fp8_linear.h"
#include "data/data_internal.h"
#include "optim/optim_internal.h"
#include "mesh.h"

#define ACCEL__MAX_PREPARED 8

/* The first failure of a sequence that goes on after a failure (a release
 * must free everything it holds, whatever failed before): note each step's
 * status; the first failure's status and message become the thread's error
 * again at the end (accel__first_error_return), whatever later steps left. */
typedef struct accel__first_error {
    accel_status st;
    char msg[1024];
} accel__first_error;
static inline void accel__first_error_note(accel__first_error *f, accel_status st) {
    if (!st || f->st) return;
    f->st = st;
    snprintf(f->msg, sizeof f->msg, "%s", accel_last_error());
}
static inline accel_status accel__first_error_return(const accel__first_error *f) {
    return f->st ? accel_set_error(f->st, "%s", f->msg) : ACCEL_OK;
}

typedef struct accel__strategy accel__strategy; /* strategy.h */

/* A prepared model (model.c). */
typedef struct accel__model {
    accel_module *m;
    accel_flat_params *fp;
    const accel__strategy *strat; /* the accelerator's, chosen at accel_accelerator_new */
    bool no_sync;          /* inside no_sync */
    int no_sync_depth;     /* open no_sync_begin calls (train.c): they nest, as DDP's no_sync does */
    bool ddp;              /* world > 1 */
    bool hooked;           /* model.c set its hook (autocast, DDP's buffer broadcast) on m */
    /* DDP's state (private to ddp.c): the gradient memory the local ranks
     * share (DDP and ZeRO-1/2) and the buckets; NULL on one process */
    struct accel__ddp *ddps;
    /* The strategy's own state of this model (its layout makes it, its
     * release frees it; NULL under DDP, whose buckets are above): ZeRO's
     * shards and units (zero_state.h). */
    void *strat_state;
    struct accel__fp8_state *fp8; /* mixed_precision='fp8': its metas and reduction buffer (fp8_scaling.h) */
    /* pp_size > 1: the chunks' layer ranges, first_layer[0..pp_size x
     * pp_virtual] (chunk c is stage c mod pp_size's), agreed by every rank at
     * prepare (pipeline.c; accel_malloc'd, freed by
     * accel__model_release); NULL with one stage. */
    int *pp_split;
} accel__model;

/* pp_size > 1: a prepared optimizer's parameters as it was built, before its
 * stage kept its own (pipeline.c): the numbering of its state in a
 * checkpoint, the one-process one. */
typedef struct accel__pp_opt {
    int n;
    accel_tensor **params; /* [n], borrowed: the model's (the other stages' on meta) */
    int *groups;           /* [n]: their param groups (accel__pipeline_unprepare_optimizer restores both) */
} accel__pp_opt;

/* Stage 3's schedule (FSDP's fsdp_backward_prefetch / fsdp_forward_prefetch /
 * fsdp_reshard_after_forward; defaults as FSDP's: BACKWARD_PRE, false, true;
 * DeepSpeed's stage3_prefetch_bucket_size). */
typedef enum {
    ACCEL__WRAP_DEFAULT,     /* transformer blocks, and the topmost modules holding parameters */
    ACCEL__WRAP_TRANSFORMER, /* TRANSFORMER_BASED_WRAP: modules of the types in wrap_cls */
    ACCEL__WRAP_SIZE,        /* SIZE_BASED_WRAP: min_num_params */
    ACCEL__WRAP_NONE,        /* NO_WRAP: the whole model is one unit */
} accel__wrap_policy;

typedef struct accel__fsdp_cfg {
    bool backward_prefetch, forward_prefetch, reshard_after_forward;
    bool backward_post;      /* BACKWARD_POST: the backward prefetch starts once the unit's gradients exist */
    int64_t prefetch_bucket; /* stage3_prefetch_bucket_size: prefetch a unit of at most this many elements; -1: any */
    accel__wrap_policy wrap;
    char wrap_cls[512];      /* comma-separated module type names */
    int64_t min_num_params;
    int64_t persistence_threshold; /* DeepSpeed stage3_param_persistence_threshold: smaller tensors stay gathered */
    bool activation_checkpointing; /* fsdp_activation_checkpointing: every unit but the root's is checkpointed */
    bool full_state_dict;    /* fsdp_state_dict_type=FULL_STATE_DICT (else SHARDED_STATE_DICT) */
    /* DeepSpeed's stage3_gather_16bit_weights_on_model_save (Accelerate's
     * zero3_save_16bit_model): save_model writes the mixed-precision dtype */
    bool save_16bit;
} accel__fsdp_cfg;

/* DeepSpeed's offload_optimizer / offload_param and FSDP's
 * fsdp_offload_params (zero_config.c; docs/accelerator.md "Offload"). */
typedef enum { ACCEL__OFFLOAD_NONE, ACCEL__OFFLOAD_CPU, ACCEL__OFFLOAD_NVME } accel__offload_device;

typedef struct accel__offload_cfg {
    accel__offload_device optimizer, param;
    char optimizer_path[1024]; /* nvme_path of offload_optimizer (a directory) */
    char param_path[1024];     /* nvme_path of offload_param (a directory) */
    int buffer_count;          /* offload_optimizer.buffer_count: blocks of the host paging buffer (4) */
    int64_t block_bytes;       /* aio.block_size: bytes of a block (1 MiB) */
    bool fsdp_params;          /* fsdp_offload_params: the step on the host, as torch's CPUOffload */
} accel__offload_cfg;

/* The mesh's sizes and the parallelism knobs from opts.parallelism
 * (parallelism.c). set: a size was given (else the mesh is dp_shard over the
 * world, or HYBRID_SHARD's machines x local ranks). */
typedef struct accel__parallelism {
    bool set;
    int size[ACCEL__MESH_DIMS];
    bool cp_alltoall;       /* K/V exchanged all-to-all over heads (Ulysses; sp_size), else all-gathered */
    int micro_batches;      /* pipeline micro-batches per step (>= 1) */
    bool pp_gpipe;          /* GPipe's schedule, else 1F1B */
    int pp_virtual;         /* model chunks per stage (>= 1): > 1 is interleaved 1F1B */
    bool sequence_parallel; /* Megatron's sequence parallelism inside the tp group */
    /* accel_accelerator_pipeline_set_layers (pipeline.c): the first and last
     * stages' layer counts, 0: the balanced split */
    int pp_first_layers, pp_last_layers;
} accel__parallelism;

/* A prepared optimizer's GradScaler state (torch's _per_optimizer_states):
 * unscaled, its gradients were divided by the loss scale since its last step
 * (its stage UNSCALED: a step that failed leaves it so, and the retry does
 * not divide again); found_inf, that division met an inf or nan; skipped,
 * its last step was skipped for it (any precision: false but under fp16). */
typedef struct accel__opt_scaler {
    bool unscaled, found_inf, skipped;
} accel__opt_scaler;

struct accel_accelerator {
    uint32_t magic; /* ACCEL__MAGIC_ACCELERATOR while alive (core/handle.h) */
    accel_accelerator_opts o;
    char *project_dir;
    accel_mixed_precision mp;
    accel__fp8_recipe fp8; /* mp == ACCEL_MP_FP8: its recipe (state.c) */
    accel__fp8_log fp8_backward; /* fp8: the metas a backward ran, room for every prepared model's (fp8_scaling.h) */
    accel_device device;
    accel_pg *pg;
    int rank, world, local_rank, local_world;
    /* the failure the last agreement of prepare gave this rank (status,
     * message, and the rank it names: its own, or the failing one), so an
     * agreement over it (a step that agreed inside, such as ZeRO-3's start
     * or a data-parallel group's staged broadcast, agreed again by its
     * caller over every rank) passes it on as it is, naming that rank to
     * the ranks that learn of it only there */
    accel_status agreed_st;
    char agreed_msg[1024];
    int agreed_rank;

    accel__model models[ACCEL__MAX_PREPARED];
    int n_models;
    /* the grad-ready hook the user had set (accel_set_grad_ready_hook) when
     * the backward now running began: called after the strategies' for every
     * leaf, and set back at its end (model.c) */
    accel_grad_ready_fn user_ready;
    void *user_ready_ctx;
    accel_optimizer *opts[ACCEL__MAX_PREPARED];
    /* optimizer i's state private to the strategy, NULL while the optimizer
     * is the user's as it was (strategy.h: prepare_optimizer, optimizer_model) */
    void *strat_opt[ACCEL__MAX_PREPARED];
    accel__opt_scaler scaler_of[ACCEL__MAX_PREPARED]; /* optimizer i's GradScaler state (fp16) and skip */
    accel__pp_opt *pp_opt[ACCEL__MAX_PREPARED]; /* optimizer i's whole numbering under pp (owned), else NULL */
    int n_opts;
    accel_lr_scheduler *scheds[ACCEL__MAX_PREPARED];
    int n_scheds;
    accel_dataloader *dls[ACCEL__MAX_PREPARED];
    int n_dls;

    /* GradientState */
    int accum_steps;
    int64_t step;
    bool sync_gradients;
    bool main_first_open; /* inside main_process_first_begin .. _end (state.c) */

    /* GradScaler (fp16): scale, updated after each optimizer's step (as
     * Accelerate's AcceleratedOptimizer.step calls update()); backward_scale,
     * the scale the last backward multiplied its loss by, which the
     * gradients carry until unscaled (another optimizer's step may have
     * updated scale since) */
    double scale;
    double backward_scale;
    int64_t growth_tracker;

    int64_t save_iteration; /* save_state calls in this run */

    const accel__strategy *strat; /* DDP, ZeRO-1, -2 or -3 (strategy.h), from the config's stage */
    /* The ranks laid out over dp_replicate x dp_shard (mesh.h). ZeRO shards
     * over dp_shard (shard_pg: every rank, or under HYBRID_SHARD(_ZERO2) the
     * ranks of this machine); replica_pg, the dp_replicate group (NULL unless
     * hybrid on several machines), holds this rank's counterparts on the
     * other machines, whose shards equal this one's (gradients averaged
     * across it). Both belong to the mesh. */
    accel__mesh mesh;
    accel__parallelism par; /* what opts.parallelism asked for (parallelism.c) */
    accel_pg *shard_pg, *replica_pg;
    /* The data-parallel group: the ranks that differ only along dp_replicate,
     * dp_shard and cp, which hold the same parameters and average their
     * gradients (DDP's all-reduce). The world's group unless tp or pp split
     * it; the mesh's. */
    accel_pg *dp_pg;
    /* Context parallelism (cp.c): the cp group, the mesh's, recorded on the
     * prepared decoder models (accel_llama_context_parallelize) while they
     * are the accelerator's; NULL when cp_size (sp_size) is 1. */
    accel_pg *cp_pg;
    int shard_rank, shard_world;
    accel__fsdp_cfg fsdp;
    accel__offload_cfg offload;
    double clip;            /* gradient_clipping applied in optimizer_step (0: none) */
    bool recompute_layers;  /* MEGATRON_LM_RECOMPUTE_ACTIVATIONS: prepare checkpoints the decoder layers */

    struct accel__tracking *tracking; /* trackers and registered state (tracking.c) */
};

/* lookup.c */
/* True (and the error set, naming fn) when a public entry point got acc ==
 * NULL, or an accelerator that is not live (freed: ACCEL_ERR_STATE). */
bool accel__acc_null(const accel_accelerator *acc, const char *fn);
/* The dtype the model's forward autocasts to: bf16 (also under fp8, as
 * Accelerate's native_amp with bf16), f16, or f32 (none). */
accel_dtype accel__acc_autocast_dtype(const accel_accelerator *acc);
/* Whether this backward synchronises pm's gradients (> 1 process, not in
 * no_sync, at the end of an accumulation or under sync_each_batch). */
bool accel__model_syncs(const accel_accelerator *acc, const accel__model *pm);
/* The data loader whose epoch is running (the last prepared one), or NULL. */
accel_dataloader *accel__active_dataloader(const accel_accelerator *acc);
accel__model *accel__find_model(accel_accelerator *acc, const accel_module *m);

/* model.c: prepare a model (fp8's conversion, flatten, rank 0's weights, the
 * autocast hook, its strategy's layout and start) and release it (always
 * let go; the status is its strategy release's first failure); the
 * backward's strategy calls for every prepared model (grad_ready among them),
 * begin noting the loss scale the backward's gradients carry (backward_scale). */
accel_status accel__model_prepare(accel_accelerator *acc, accel__model *pm);
accel_status accel__model_release(accel_accelerator *acc, accel__model *pm);
/* model.c: a local step of prepare (an allocation, a slicing) that failed on
 * one rank alone (its memory full) fails on every rank before the
 * collectives that follow it: the others would go on into them without it
 * (waiting there for the distributed timeout), and its retry, or its undo's
 * collectives, would meet them there. One 4-byte all-reduce over every rank,
 * called by all of them at the same point; mine: this rank's status. The
 * failing rank keeps its message and adds `what` it could not do; the
 * others get its status and "another rank (r) could not <what>". A `mine`
 * that is the failure an earlier agreement gave (acc->agreed_*) is passed
 * on unchanged, naming the rank that failed: the ranks of that agreement
 * would each name themselves otherwise. */
accel_status accel__prepare_agree(accel_accelerator *acc, accel_status mine, const char *what);
/* What the ranks' prepares compare of model m (model.c): v[0] a CRC-32C of
 * its state_dict's names, dtypes and whole shapes in order, v[1] its count
 * of tensors, v[2] of elements; fp8's metas (buffers accel adds, left on
 * some ranks only by a prepare that failed there) left out. */
accel_status accel__model_architecture(accel_module *m, int64_t v[3]);
void accel__backward_begin(accel_accelerator *acc);
accel_status accel__backward_end(accel_accelerator *acc);

/* pipeline.c: a stage's partial gradient norm (sum |g|^p, or max |g|), *local,
 * made the pp group's in place, every stage's parameters counted once (a
 * tied embedding's on stage 0 only); as it is with one stage. A NaN partial
 * (a NaN gradient) is no failure: it joins the collective and comes back
 * NaN on every stage. Collective over the pp group. */
accel_status accel__pipeline_norm_partial(accel_accelerator *acc, accel_module *model, double *local, double norm_type);
/* pipeline.c: the pieces of accel__pipeline_norm_partial for a strategy that
 * holds the gradients otherwise (ZeRO-2's shard). tied_copy: the parameter
 * of model whose gradient on this stage copies another stage's (a tied
 * lm_head on the last stage of several: stage 0's embedding, summed over the
 * stages), which a norm over the stages leaves out here; NULL where none.
 * norm_reduce: a stage's partial norm without it, *local, summed (max under
 * inf) over the pp group in place (accel__norm_all_reduce); as it is with one stage. */
accel_tensor *accel__pipeline_tied_copy(const accel_accelerator *acc, accel_module *model);
accel_status accel__pipeline_norm_reduce(accel_accelerator *acc, double *local, double norm_type);
/* pipeline.c: every stage's parameters from the stage that trains them to
 * every rank of the pp group (save_model then writes the whole model from
 * rank 0). Collective over the pp group; no-op with one stage. */
accel_status accel__pipeline_gather_weights(accel_accelerator *acc, accel_module *model);
/* pipeline.c: with pp_size > 1, the stages' split of pm's whole model (the
 * family's balanced one, or accel_accelerator_pipeline_set_layers'),
 * compared over every rank (a difference fails on all of them, naming two
 * splits) and kept in pm->pp_split, before the tp plan slices the model.
 * Refuses a model whose family is not cut, and a strategy without the
 * table's pipeline flag (ZeRO-3). Collective. */
accel_status accel__pipeline_split_model(accel_accelerator *acc, accel__model *pm);
/* pipeline.c: the parameters of the other stages' parts of pm's model (by
 * pm->pp_split) move to meta, so this stage keeps its own (memory divided
 * between the stages); after the tp plan, before the flat buffers. No-op
 * with one stage. */
accel_status accel__pipeline_keep_stage(accel_accelerator *acc, accel__model *pm);
/* pipeline.c: with pp_size > 1, the other stages' parameters of a prepared
 * model to meta again (after save_model's or save_state's gather). */
accel_status accel__pipeline_release(accel_accelerator *acc, accel_module *model, const char *fn);
/* pipeline.c: with pp_size > 1, re-targets optimizer i to the parameters its
 * stage kept (those not on meta), freeing the others' optimizer state, and
 * records its whole numbering in acc->pp_opt[i] (NULL with one stage).
 * Before the strategy's prepare_optimizer, which shards what the stage
 * kept (ZeRO-1/2); unprepare gives the optimizer every parameter again, with
 * fresh state, and forgets the numbering (after the strategy's failed). */
accel_status accel__pipeline_prepare_optimizer(accel_accelerator *acc, int i);
void accel__pipeline_unprepare_optimizer(accel_accelerator *acc, int i);
/* pipeline.c, pp_size > 1, collective over the pp group (and the stage's
 * shard group under ZeRO, which consolidates the stage's state first):
 * optimizer i's state as one process's (the whole numbering, every stage's
 * entries) on stage 0, which returns their count and *out
 * (accel_named_state_free it; *bufs, accel_free each, back ZeRO's tensors);
 * the other stages send theirs and return 0, *out NULL. -1 + error. */
int accel__pipeline_optimizer_state(accel_accelerator *acc, int i, accel_named_state **out, float *bufs[2]);
/* pipeline.c, pp_size > 1: loads into optimizer i this stage's part of a
 * one-process state st[0..n) (the others' entries skipped). */
accel_status accel__pipeline_load_optimizer(accel_accelerator *acc, int i, int n, const accel_named_state *st);
/* Its check of st against the optimizer as it was built (the whole
 * model's: a stage holds its part), nothing written: each "state.<u>.*"
 * entry's u, then the param groups' parameter counts; the rest (sizes,
 * hyperparameters) is checked as the stage's part loads. */
accel_status accel__pipeline_check_optimizer(accel_accelerator *acc, int i, int n, const accel_named_state *st);

/* zero.c / zero_config.c */
typedef struct accel__zero_cfg {
    int stage;               /* 0, 1, 2, 3 */
    double clip;             /* 0: none */
    int mp;                  /* -1: no opinion, else accel_mixed_precision */
    int accum;               /* 0: no opinion */
    int64_t bucket_bytes;    /* 0: no opinion */
    bool hybrid;             /* HYBRID_SHARD(_ZERO2): shard within a machine */
    accel__fsdp_cfg fsdp;    /* stage 3 */
    accel__offload_cfg offload;
} accel__zero_cfg;
accel_status accel__zero_config(const accel_accelerator_opts *o, accel__zero_cfg *out);
/* The offload settings against the accelerator's device (known after the config is read). */
accel_status accel__offload_check_device(const accel_accelerator *acc);
/* Tensor parallelism (tp.c). Before a model is flattened: the decoder
 * families' plan applied over the tp group, or the user's checked to be over
 * it; nothing when tp_size is 1. */
accel_status accel__tp_prepare(accel_accelerator *acc, accel_module *m);
/* When the accelerator lets m go (un-prepared, or the accelerator freed):
 * m's modules over the tp group get a tombstone of it (nn/tp_internal.h,
 * accel__tp_orphan), so a forward after the group is freed fails naming
 * why instead of reading freed memory; accel__tp_prepare gives the group
 * back to a model prepared again by this accelerator. Not when the tp group
 * is the job's default group (tp over every rank) and another holder
 * (accel_dist_init) keeps it: the model computes over it still. */
void accel__tp_release(accel_accelerator *acc, accel_module *m);
/* The combined partial gradient norm of m (accel_grad_norm_partial's sum or
 * max) in *out, the tp-sharded parameters' reduced over the tp group
 * (collective over it), the replicated ones counted once. A NaN gradient
 * gives a NaN *out, no failure: every rank of the group sees it. */
accel_status accel__tp_grad_norm_partial(accel_accelerator *acc, accel_module *m, double norm_type, double *out);
/* The partial norm of parameter w's gradient (w one of m's) as
 * accel__tp_grad_norm_partial counts it, in *out: a tp slice's summed over
 * the tp group (collective over it), a replicated one this rank's. */
accel_status accel__tp_param_norm_partial(accel_accelerator *acc, accel_module *m, accel_tensor *w, double norm_type,
                                          double *out);
/* Partial gradient norms v[0..n) (n <= 4) summed, or for norm_type INFINITY
 * maxed, over pg in place. A NaN stays NaN on every rank: NCCL's and MPI's
 * MAX drop it (fmax), so under inf a flag beside each value says so. */
accel_status accel__norm_all_reduce(accel_pg *pg, double *v, int n, double norm_type);
/* A sum's partial norm without a tied copy's part counted in it twice:
 * rounding below 0 clamped, a NaN kept (fmax dropped it), an inf (or NaN)
 * tied part left in (inf - inf was a NaN norm where torch's is inf). */
double accel__norm_without(double part, double tied);
/* prepare(model, opt) under tp: the plan replaces the model's parameters
 * with their slices (freeing the whole ones) at the model's prepare, so an
 * optimizer made over the whole model is re-targeted to them. Before the
 * model's prepare, *where (accel_malloc'd; NULL: nothing to re-target, as
 * without tp or when opt holds none of m's parameters) gets the parameter
 * of m's state dict holding each segment's parameter, counted among the
 * parameters only (-1: not m's): prepare adds buffers (fp8's metas under
 * mixed_precision fp8), which would shift an entry's index; after it,
 * accel__tp_retarget_optimizer gives the segments whose entry changed its
 * new tensor (fresh state), leaving opt as it was when none did. */
accel_status accel__tp_segment_entries(accel_accelerator *acc, accel_module *m, accel_optimizer *opt, int **where);
accel_status accel__tp_retarget_optimizer(accel_module *m, accel_optimizer *opt, const int *where);
/* This rank's place among the ranks that get different batches
 * (dp_replicate x dp_shard): the ranks of a tp group share one. */
/* Sequence parallelism: after a backward that syncs gradients, the
 * replicated parameters' gradients summed over the tp group, for each
 * model where its strategy holds them (accel__strategy.sp_reduce). */
accel_status accel__tp_after_backward(accel_accelerator *acc);
/* The same for model pm alone, unless it runs no_sync: what a strategy that
 * reduces into a gradient shard (ZeRO-2) calls before that reduction. */
accel_status accel__tp_sp_reduce(accel_accelerator *acc, accel__model *pm);
/* sliced[j]: whether ts[j] (n tensors of m) is a tp slice (its gradient
 * norm sums over the tp group) rather than whole on every tp rank;
 * summed[j] (when not NULL): whether it is whole and of no replicated-rows
 * module, so under sequence parallelism each tp rank holds a part of its
 * gradient (accel_module_tp_reduce_grads' tensors). */
accel_status accel__tp_sliced(accel_module *m, accel_tensor *const *ts, int n, bool *sliced, bool *summed);
void accel__tp_data_rank(const accel_accelerator *acc, int *rank, int *world);
/* The whole tensors of sd's tp-sharded entries, gathered over the tp group
 * (collective): *whole[i] the whole tensor of entry i (a tied alias shares
 * its first name's), NULL for the entries not sharded; *whole NULL without
 * tp. Freed with accel__tp_gather_state_free. */
accel_status accel__tp_gather_state(accel_accelerator *acc, const accel_state_dict *sd, accel_tensor ***whole);
/* When e is a tp slice (*sliced): this rank's slice of the whole tensor f
 * holds under e's name (the plan's cut), a new tensor (NULL + error when
 * it is missing or of the wrong shape); NULL, no error, when it is not. */
accel_tensor *accel__tp_read_slice(accel_safetensors *f, const accel_state_entry *e, bool *sliced);
/* load_state of a model entry under tp: accel__tp_read_slice's slice
 * copied into e's tensor; nothing when e is not a slice. */
accel_status accel__tp_load_entry(accel_safetensors *f, const accel_state_entry *e, bool *sliced);
/* The shape model entry e has in a checkpoint's file (a tp slice's whole
 * tensor; else e's own) into shape (e->t->ndim dims); true for a slice. */
bool accel__tp_file_shape(const accel_state_entry *e, int64_t *shape);
/* save_state of optimizer i under tp (collective over the tp group): the
 * state st (n entries in the user's per-tensor vocabulary: the optimizer's
 * own, a ZeRO strategy's consolidated, or under pp the whole numbering
 * accel__pipeline_optimizer_state collected on stage 0, whose tp group then
 * gathers every stage's slices; the other stages pass none) of every
 * tp-sliced parameter replaced by the whole, gathered over the tp group,
 * flat as a one-process optimizer lists it. Nothing without tp. */
accel_status accel__tp_gather_optimizer(accel_accelerator *acc, int i, int n, accel_named_state *st);
/* load_state's inverse: each whole state of a tp-sliced parameter replaced
 * by this rank's slice (the plan's cut of the parameter's shape); under pp
 * in the whole numbering, every stage's (accel__pipeline_load_optimizer
 * then keeps this stage's). */
accel_status accel__tp_slice_optimizer(accel_accelerator *acc, int i, int n, accel_named_state *st);
void accel__tp_gather_state_free(const accel_state_dict *sd, accel_tensor **whole);
/* parallelism.c: the mesh's sizes from o->parallelism, checked (a product
 * past INT_MAX, then the rules, then a product that is not the world,
 * refused naming the fields); the product of the model-parallel sizes tp x
 * pp x cp x sp (0: 1), in double (never overflows), for Megatron's
 * data-parallel size (parallelism_env.c). */
accel_status accel__parallelism_config(const accel_accelerator_opts *o, int world, accel__parallelism *out);
double accel__parallelism_model_size(const accel_parallelism_opts *p);
/* Collective over pg (the world): every rank's mesh (par, and the ZeRO
 * stage that shards over it, FSDP's HYBRID_SHARD or not; or mine: this rank's failure to lay it out)
 * compared, so that ranks given different options or variables fail
 * accel_accelerator_new together, each naming its mesh and what differs
 * over the ranks (or the rank that failed), rather than meeting in
 * mismatched collectives, or training apart where the collectives happen to
 * fit. mine's own message is kept. */
accel_status accel__parallelism_agree(accel_pg *pg, accel_status mine, const accel__parallelism *par,
                                      int zero_stage, bool hybrid);
/* The mesh (from par, or under HYBRID_SHARD from the machines), shard_pg and
 * replica_pg (collective: subgroups are split off the world). */
accel_status accel__zero_groups(accel_accelerator *acc, bool hybrid, const accel__parallelism *par);
void accel__zero_groups_free(accel_accelerator *acc);
/* Hybrid sharding: a piece of the gradient shard, averaged in place with the
 * same piece on the other machines (collective over replica_pg; no-op without). */
accel_status accel__zero_replica_average(accel_accelerator *acc, float *piece, int64_t n);
/* zero3_checkpoint.c, for accel merge-weights: find_sharded is true when dir
 * is a SHARDED_STATE_DICT model directory or a checkpoint holding
 * pytorch_model_fsdp_0/, which goes into sub. merge writes that model whole
 * (Hugging Face names, tied aliases included) into out_dir/model.safetensors
 * (torch_format: out_dir/pytorch_model.bin, as torch.save writes it) and says
 * how many tensors; an index of no tensors, or a rank file that is that file
 * or its scratch file, is refused. remove deletes the rank files sub's index
 * names, replicated.safetensors and the index, then sub when empty. */
bool accel__zero3_find_sharded(const char *dir, char *sub, size_t n);
accel_status accel__zero3_merge(const char *sub, const char *out_dir, bool torch_format, int *n_tensors);
accel_status accel__zero3_remove_sharded(const char *sub);
/* Every rank's status becomes the worst one (one all-reduce; `mine` as is on
 * one process): a rank whose own part succeeded gets ACCEL_ERR_IO "<op>:
 * another rank failed (its error is reported there)". Collective. */
accel_status accel__ranks_agree(accel_accelerator *acc, accel_status mine, const char *op);

/* name, which path holds (verb "holds": a tensor of a model file) or lists
 * ("lists": an entry of ZeRO-3's sharded index), refused by name
 * (ACCEL_ERR_FORMAT: "<path> <verb> <name>, which the model does not have")
 * when no entry of sd has it: a checkpoint of a larger model (a layer more),
 * as torch's load_state_dict(strict) refuses unexpected keys. */
accel_status accel__refuse_unexpected_name(const accel_state_dict *sd, const char *path, const char *verb,
                                           const char *name);
/* Each tensor of f (path) through accel__refuse_unexpected_name. Counted
 * first (f holds one tensor per entry that is no tied alias), searched only
 * when f holds more. */
accel_status accel__refuse_unexpected(accel_safetensors *f, const char *path, const accel_state_dict *sd);

/* staging.c: collectives on device memory (docs/dist.md "Device buffers").
 * The group reads host memory, so a tensor on a device that is not
 * host-addressable goes through a host copy; on the cpu no copy is made.
 * Tensors are contiguous. */
bool accel__needs_staging(accel_device dev);
/* Whether pg's collectives take memory of dev directly (NCCL on cuda). */
bool accel__pg_takes_device(const accel_pg *pg, accel_device dev);
/* The host bytes the group reads and writes for t: t's own memory on a
 * host-addressable device; else `scratch` when given (e.g. a shared-memory
 * buffer) or a lease of the pinned staging pool (core/host_stage.h: reused
 * from call to call, so alike steps allocate nothing), holding t's bytes
 * when `fill` (an output skips the copy). NULL + error when the copy fails. */
void *accel__stage_to_host(const accel_tensor *t, void *scratch, bool fill);
/* Ends the staging of t in `host` after a collective that returned st: on a
 * staged device, host's bytes go back into t when st is ACCEL_OK and
 * write_back, and host's lease goes back to the pool when owned
 * (stage_to_host leased it: no scratch). Returns st, else the copy's status. */
accel_status accel__stage_end(accel_tensor *t, void *host, accel_status st, bool write_back, bool owned);
/* The group's collectives on tensors of any device (staged when it needs it).
 * all_gather: recv holds world x numel(send) elements (send may lie in it). */
accel_status accel__staged_broadcast(accel_pg *pg, accel_tensor *t, int root);
accel_status accel__staged_all_reduce(accel_pg *pg, accel_tensor *t, accel_reduce_op op);
accel_status accel__staged_all_gather(accel_pg *pg, const accel_tensor *send, accel_tensor *recv);
/* A 1-d header (on the caller's stack, in *h) over elements [off, off + n) of
 * the flat buffer memory `base` (b->params or b->grads, device pointers of
 * b->device); returns h. */
accel_tensor *accel__flat_view(accel_tensor *h, const accel_flat_buffer *b, void *base, int64_t off, int64_t n);

/* tracking.c: attach (in accel_accelerator_new: log_with, the logger's
 * process group) and detach (first thing in accel_accelerator_free: trackers
 * finished, registrations dropped). */
accel_status accel__tracking_attach(accel_accelerator *acc);
void accel__tracking_detach(accel_accelerator *acc);
/* load_state resumed from checkpoint dir at `at`: the jsonl log gets a line
 * saying so (now, or when init_trackers opens it), so the lines a killed run
 * wrote past that checkpoint can be told apart. */
void accel__tracking_resumed(accel_accelerator *acc, const char *dir, const accel_resume_point *at);
/* project_dir when opts give none: ACCEL_PROJECT_DIR, else ".". */
const char *accel__default_project_dir(void);
/* checkpoint.c: model m's file as save_state writes it, by rank 0 (with
 * write); under tp every rank calls it, even after a failure (write
 * false), for the gather of the whole tensors over its tp group
 * (collective), so the file is a one-process model's. */
accel_status accel__save_model_file(accel_accelerator *acc, const char *path, accel_module *m, bool write);
/* save.c: model's state dict as save_model writes it into dir (max bytes a
 * shard, fmt), by this rank when write; under tp every rank calls it, even
 * after a failure, for the gather of the whole tensors (collective). */
accel_status accel__write_model(accel_accelerator *acc, accel_module *model, const char *dir, int64_t max,
                               accel_weights_format fmt, bool write);
/* save.c: registered objects into / out of a checkpoint directory (save_state
 * and load_state call these). check: what load can tell before anything is
 * loaded (as many files as objects, each blob's file of the blob's size), so
 * a refused checkpoint changes nothing. A callback's failure is named. */
accel_status accel__custom_save(accel_accelerator *acc, const char *dir);
accel_status accel__custom_check(accel_accelerator *acc, const char *dir);
accel_status accel__custom_load(accel_accelerator *acc, const char *dir);

/* Context parallelism (cp.c). setup: after accel__zero_groups, the cp group
 * of the mesh (collective over the world when cp > 1) set as the thread's
 * with the strategy; teardown unsets it. grad_factor: what the loss is
 * multiplied by before backward: the cp size, since the data-parallel
 * average (over dp_pg, which includes cp) divides by it while the ranks'
 * shares of one sequence's loss must be summed. */
accel_status accel__cp_setup(accel_accelerator *acc);
/* The cp group onto a decoder model at prepare (others are refused under
 * cp); undone when the accelerator lets it go. */
accel_status accel__cp_prepare(accel_accelerator *acc, accel_module *m);
void accel__cp_release(accel_accelerator *acc, accel_module *m);
double accel__cp_grad_factor(const accel_accelerator *acc);

#endif
