/* Shared between the files of src/accelerator. */
#ifndef ACCEL_ACCELERATOR_INTERNAL_H
#define ACCEL_ACCELERATOR_INTERNAL_H

#include "accel/accelerator.h"
#include "accel/dist.h"
#include "data/data_internal.h"
#include "optim/optim_internal.h"

#define ACCEL__MAX_PREPARED 8

/* A bucket: a contiguous range [lo, hi) of one flat gradient buffer, filled by
 * n_params parameters. */
typedef struct accel__bucket {
    int buffer;            /* dtype index into fp->buffers */
    int64_t lo, hi;
    int n_params, pending;
    bool launched;
    accel_work *work;
} accel__bucket;

/* Leaf lookup: parameter tensor -> bucket, sorted by pointer. */
typedef struct accel__leaf {
    const accel_tensor *t;
    int bucket;
} accel__leaf;

/* A ZeRO wrap unit: a range [lo, lo + world * shard) of the flat f32 buffer
 * whose piece [lo + rank * shard, + shard) this rank owns, stored at zoff of
 * the shard. Stages 1-2 have one unit covering the buffer; stage 3 (zero3.c)
 * one per wrapped module (a transformer block, an embedding, ...), whose
 * parameters are gathered around its forward and backward only. */
typedef enum { ACCEL__UNIT_RELEASED, ACCEL__UNIT_GATHERING, ACCEL__UNIT_GATHERED } accel__unit_state;

typedef struct accel__unit {
    int64_t lo, shard, zoff;
    int first, count;      /* its tensors in the f32 buffer's tensor list */
    bool is_root;          /* stays gathered from forward to the end of backward */
    bool persistent;       /* the tensors under persistence_threshold: always gathered, re-gathered after a step */
    accel__unit_state state;
    accel_work *gather;    /* in flight while GATHERING */
    bool gather16;         /* that gather moves bf16 (widened to f32 in place when it finishes) */
    accel_work *reduce;    /* the gradient reduce-scatter in flight */
    int pending;           /* leaves whose gradient this backward has not finished */
} accel__unit;

typedef struct accel__model {
    accel_module *m;
    accel_flat_params *fp;
    void *orig_grads[ACCEL_DTYPE_COUNT]; /* flatten's own grad buffers, while shared ones are used */
    void *grad_stage[ACCEL_DTYPE_COUNT]; /* device gradients: their host staging buffer (group-shared memory) */
    int n_buckets;
    accel__bucket *buckets;
    int n_leaves;
    accel__leaf *leaves;
    int next_launch;       /* buckets launch in index order on every rank */
    bool no_sync;          /* inside no_sync */
    bool ddp;              /* world > 1 */
    accel_dtype autocast_prev;
    /* ZeRO (zero.c): the f32 flat buffer is padded to a multiple of 16 x world
     * and split evenly; this rank owns [zlo, zhi) of it (stages 1-2). */
    int zero_stage;        /* 0, 1, 2 or 3 */
    int64_t zlo, zhi;
    int n_units;
    accel__unit *units;
    int64_t zn;            /* elements of this rank's shard (the sum of its unit pieces) */
    float *zgrad;          /* stage 2 on > 1 process, stage 3: the averaged gradient shard [zn] */
    float *zparams;        /* stage 3: the f32 parameter shard [zn] (the masters the optimizer updates) */
    uint16_t *zsend16;     /* stage 3 under bf16: the shard rounded to bf16 as each unit's gather sends it [zn] */
    int *order, n_order;   /* stage 3: units in forward execution order (recorded on the first forward) */
    bool order_done;
    int unhooked;          /* stage 3: 1 + a unit whose gradient came while it was not gathered, else 0 */
    int reducing;          /* stage 3: the unit whose reduce-scatter is in flight, or -1 */
    accel_status reduce_status; /* stage 3: the first failure of this backward's reductions */
    int n_hooked;          /* stage 3: the modules whose forward gathers a unit */
    accel_module **hooked;
    int *hooked_unit;
} accel__model;

/* A prepared optimizer re-targeted to its model's shard (zero.c). */
typedef struct accel__zopt {
    accel_module *m;
    int n_user;                 /* the user's tensor segments, restored on release */
    accel_tensor **user_params;
    int *user_groups;
    int64_t *user_off;          /* element offset of each in the flat f32 buffer */
    int n_runs;                 /* shard segments: runs of one group clipped to [zlo, zhi) */
    int64_t *run_lo, *run_hi;
    int *run_group;
} accel__zopt;

/* Stage 3's schedule (FSDP's fsdp_backward_prefetch / fsdp_forward_prefetch /
 * fsdp_reshard_after_forward; defaults as FSDP's: BACKWARD_PRE, false, true). */
typedef enum {
    ACCEL__WRAP_DEFAULT,     /* transformer blocks, and the topmost modules holding parameters */
    ACCEL__WRAP_TRANSFORMER, /* TRANSFORMER_BASED_WRAP: modules of the types in wrap_cls */
    ACCEL__WRAP_SIZE,        /* SIZE_BASED_WRAP: min_num_params */
    ACCEL__WRAP_NONE,        /* NO_WRAP: the whole model is one unit */
} accel__wrap_policy;

typedef struct accel__fsdp_cfg {
    bool backward_prefetch, forward_prefetch, reshard_after_forward;
    accel__wrap_policy wrap;
    char wrap_cls[512];      /* comma-separated module type names */
    int64_t min_num_params;
    int64_t persistence_threshold; /* DeepSpeed stage3_param_persistence_threshold: smaller tensors stay gathered */
    bool activation_checkpointing; /* fsdp_activation_checkpointing: every unit but the root's is checkpointed */
} accel__fsdp_cfg;

struct accel_accelerator {
    accel_accelerator_opts o;
    char *project_dir;
    accel_mixed_precision mp;
    accel_device device;
    accel_pg *pg;
    int rank, world, local_rank, local_world;

    accel__model models[ACCEL__MAX_PREPARED];
    int n_models;
    accel_optimizer *opts[ACCEL__MAX_PREPARED];
    accel__zopt *zopts[ACCEL__MAX_PREPARED]; /* NULL unless ZeRO re-targeted it */
    bool skipped[ACCEL__MAX_PREPARED];
    int n_opts;
    accel_lr_scheduler *scheds[ACCEL__MAX_PREPARED];
    int n_scheds;
    accel_dataloader *dls[ACCEL__MAX_PREPARED];
    int n_dls;

    /* GradientState */
    int accum_steps;
    int64_t step;
    bool sync_gradients;

    /* GradScaler (fp16) */
    double scale;
    int64_t growth_tracker;
    bool unscaled;         /* gradients already unscaled this step */
    bool found_inf;

    int64_t save_iteration; /* save_state calls in this run */

    int zero_stage;         /* 0 (DDP), 1, 2 or 3 */
    /* The ranks ZeRO shards over: every rank, or under HYBRID_SHARD(_ZERO2)
     * the ranks of this machine; replica_pg (NULL unless hybrid on several
     * machines) holds this rank's counterparts on the other machines, whose
     * shards equal this one's (gradients averaged across it). */
    accel_pg *shard_pg, *replica_pg;
    int shard_rank, shard_world;
    accel__fsdp_cfg fsdp;
    double clip;            /* gradient_clipping applied in optimizer_step (0: none) */

    struct accel__tracking *tracking; /* trackers and registered state (tracking.c) */
};

/* ddp.c */
/* True (and the error set, naming fn) when a public entry point got acc == NULL. */
bool accel__acc_null(const accel_accelerator *acc, const char *fn);
accel_status accel__ddp_prepare(accel_accelerator *acc, accel__model *pm);
void accel__ddp_release(accel_accelerator *acc, accel__model *pm);
void accel__ddp_begin_backward(accel_accelerator *acc);
accel_status accel__ddp_end_backward(accel_accelerator *acc);
bool accel__model_syncs(const accel_accelerator *acc, const accel__model *pm);

/* zero.c / zero_config.c */
typedef struct accel__zero_cfg {
    int stage;               /* 0, 1, 2, 3 */
    double clip;             /* 0: none */
    int mp;                  /* -1: no opinion, else accel_mixed_precision */
    int accum;               /* 0: no opinion */
    int64_t bucket_bytes;    /* 0: no opinion */
    bool hybrid;             /* HYBRID_SHARD(_ZERO2): shard within a machine */
    accel__fsdp_cfg fsdp;    /* stage 3 */
} accel__zero_cfg;
accel_status accel__zero_config(const accel_accelerator_opts *o, accel__zero_cfg *out);
/* shard_pg / replica_pg (collective: hybrid splits the group into machines). */
accel_status accel__zero_groups(accel_accelerator *acc, bool hybrid);
void accel__zero_groups_free(accel_accelerator *acc);
/* Shard bounds and the stage-2 gradient shard of a freshly flattened model. */
accel_status accel__zero_model_prepare(accel_accelerator *acc, accel__model *pm);
/* Frees what zero_model_prepare made; under stage 3 the full parameters come
 * back into the flat buffer first (collective). */
void accel__zero_model_release(accel_accelerator *acc, accel__model *pm);
accel_status accel__zero_prepare_optimizer(accel_accelerator *acc, int i);
/* Gives optimizer i back its per-tensor segments with the consolidated state
 * (collective). */
void accel__zero_release(accel_accelerator *acc, int i);
/* Drops optimizer i's shard bookkeeping without touching the optimizer (it is being freed). */
void accel__zero_forget(accel_accelerator *acc, int i);
/* Hybrid sharding: a piece of the gradient shard, averaged in place with the
 * same piece on the other machines (collective over replica_pg; no-op without). */
accel_status accel__zero_replica_average(accel_accelerator *acc, float *piece, int64_t n);
/* Stage 2: reduce-scatter (AVG) of the f32 gradients into zgrad, all-reduce of the rest. */
accel_status accel__zero_reduce(accel_accelerator *acc, accel__model *pm);
/* After the shard step: every rank's updated shard to everyone (in place). */
accel_status accel__zero_gather_params(accel_accelerator *acc, accel__model *pm);
void accel__zero_zero_grad(accel_accelerator *acc, accel__model *pm);
/* Consolidated state in the user's per-tensor vocabulary (collective); *bufs
 * (accel_free each) back the tensors. Returns the count or -1. */
int accel__zero_state(accel_accelerator *acc, int i, accel_named_state **out, float *bufs[2]);
/* Restores consolidated state into this rank's shard (local). */
accel_status accel__zero_load_state(accel_accelerator *acc, int i, int n, const accel_named_state *st);

/* zero3.c: ZeRO-3 / FSDP FULL_SHARD */
/* Lays the flat f32 buffer out unit by unit (each page-aligned, padded to
 * 16 x world) in reserved memory whose pages can be dropped. */
accel_status accel__zero3_layout(accel_accelerator *acc, accel__model *pm);
/* After rank 0's weights reached every rank: keeps this rank's pieces, drops
 * the full parameters, hooks the unit modules (after any autocast hook). */
accel_status accel__zero3_start(accel_accelerator *acc, accel__model *pm);
/* Gathers every unit back (collective), unhooks, returns a plain flat buffer. */
void accel__zero3_release(accel_accelerator *acc, accel__model *pm);
void accel__zero3_begin_backward(accel_accelerator *acc, accel__model *pm);
/* True when leaf belongs to pm (its unit's gradient may then start reducing). */
bool accel__zero3_grad_ready(accel_accelerator *acc, accel__model *pm, const accel_tensor *leaf);
/* Reduce-scatters what is left, adds every unit's piece into zgrad, drops the full buffers. */
accel_status accel__zero3_end_backward(accel_accelerator *acc, accel__model *pm);
/* After the shard step: every unit released, so the next forward gathers the new weights. */
accel_status accel__zero3_after_step(accel_accelerator *acc, accel__model *pm);
/* Refuses what stage 3 does not implement yet (checkpoints), naming fn. */
accel_status accel__zero3_refuse(accel_accelerator *acc, const char *fn);

/* staging.c: collectives on device memory (docs/dist.md "Device buffers").
 * The group reads host memory, so a buffer on a device that is not
 * host-addressable goes through a host copy; on the cpu no copy is made. */
bool accel__needs_staging(accel_device dev);
/* p itself on a host-addressable device; else a host copy of its bytes, in
 * `scratch` when given (e.g. a shared-memory buffer), else a new accel_malloc
 * buffer. NULL + error when the copy fails. */
void *accel__stage_to_host(accel_device dev, const void *p, size_t bytes, void *scratch);
/* Ends a staging: copies host back into p when write_back, frees host when
 * owned (a buffer accel__stage_to_host allocated). No-op when host == p. */
accel_status accel__stage_to_device(accel_device dev, void *p, void *host, size_t bytes, bool write_back,
                                    bool owned);
/* The group's collectives on a buffer of dev (staged when dev needs it). */
accel_status accel__staged_broadcast(accel_pg *pg, accel_device dev, void *p, size_t count, accel_dtype dt,
                                     int root);
accel_status accel__staged_all_reduce(accel_pg *pg, accel_device dev, void *p, size_t count, accel_dtype dt,
                                      accel_reduce_op op);
accel_status accel__staged_all_gather(accel_pg *pg, accel_device dev, const void *send, void *recv, size_t count,
                                      accel_dtype dt, int world);

/* The data loader whose epoch is running (the last prepared one), or NULL. */
accel_dataloader *accel__active_dataloader(const accel_accelerator *acc);
accel__model *accel__find_model(accel_accelerator *acc, const accel_module *m);

/* tracking.c: attach (in accel_accelerator_new: log_with, the logger's
 * process group) and detach (first thing in accel_accelerator_free: trackers
 * finished, registrations dropped). */
accel_status accel__tracking_attach(accel_accelerator *acc);
void accel__tracking_detach(accel_accelerator *acc);
/* project_dir when opts give none: ACCEL_PROJECT_DIR, else ".". */
const char *accel__default_project_dir(void);
/* save.c: registered objects into / out of a checkpoint directory (save_state
 * and load_state call these). */
accel_status accel__custom_save(accel_accelerator *acc, const char *dir);
accel_status accel__custom_load(accel_accelerator *acc, const char *dir);

#endif
