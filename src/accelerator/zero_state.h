/* The ZeRO strategies' state of a prepared model (accel__model.strat_state
 * under ZeRO-1, -2 and -3): the shard this rank owns, the wrap units, and
 * stage 3's gathers, reductions and hooks. Private to the strategy files
 * (zero.c, zero3.c, zero3_checkpoint.c, zero3_strategy.c; tests that watch
 * the schedule read it too); the rest of src/accelerator reaches it only
 * through the strategy interface (strategy.h). */
#ifndef ACCEL_ACCELERATOR_ZERO_STATE_H
#define ACCEL_ACCELERATOR_ZERO_STATE_H

#include "accelerator_internal.h"

/* A ZeRO wrap unit: a range [lo, lo + world * shard) of the flat f32 buffer
 * whose piece [lo + rank * shard, + shard) this rank owns, stored at zoff of
 * the shard. Stages 1-2 have one unit covering the buffer; stage 3 (zero3.c)
 * one per wrapped module (a transformer block, an embedding, ...), whose
 * parameters are gathered around its forward and backward only. */
typedef enum { ACCEL__UNIT_RELEASED, ACCEL__UNIT_GATHERING, ACCEL__UNIT_GATHERED } accel__unit_state;

typedef struct accel__unit {
    int64_t lo, shard, zoff;
    int first, count;      /* its tensors in the f32 buffer's tensor list */
    int64_t numel;         /* their elements (no padding): what stage3_prefetch_bucket_size bounds */
    bool is_root;          /* stays gathered from forward to the end of backward */
    bool persistent;       /* the tensors under persistence_threshold: always gathered, re-gathered after a step */
    accel__unit_state state;
    accel_work *gather;    /* in flight while GATHERING */
    bool gather16;         /* that gather moves bf16 (widened to f32 in place when it finishes) */
    bool params_mapped, grads_mapped; /* stage 3: memory is behind its full parameters / gradients */
    accel_work *reduce;    /* the gradient reduce-scatter in flight */
    bool grads_staged;     /* a device reduce-scatter through host memory: in the model's zstage_grads */
    int pending;           /* leaves whose gradient this backward has not finished */
    bool reduced;          /* its reduce-scatter of this backward has started */
} accel__unit;

typedef struct accel__zero_model {
    /* Stages 1-2: the f32 flat buffer is padded to a multiple of 16 x world
     * and split evenly; this rank owns [zlo, zhi) of it. */
    int64_t zlo, zhi;
    int n_units;
    accel__unit *units;
    int64_t zn;            /* elements of this rank's shard (the sum of its unit pieces) */
    bool *tp_flags;        /* under tp, per tensor j of the f32 buffer: [j] it is a tp slice, [n + j] its gradient
                            * is summed over tp under sequence parallelism (accel__tp_sliced); made on first use */
    float *zgrad;          /* stage 2 on > 1 process, stage 3: the averaged gradient shard [zn] (memory of zdev) */
    float *zparams;        /* stage 3: the f32 parameter shard [zn] (the masters the optimizer updates; memory of zdev) */
    accel_device zdev;     /* where the shards (and so the optimizer's step) live: the f32 buffer's device, or the
                            * cpu under stage 3's offload_param for a model on a device (zero3.c) */
    bool sharded;          /* stage 3: the start took the shards, which hold the masters from then on (before it,
                            * after a layout that a prepare undid, the full buffer still holds the weights) */
    char *zpath;           /* stage 3 under offload_param nvme: the file zparams maps (MAP_SHARED), else NULL */
    int zfd;               /* its descriptor, while zpath is set */
    uint16_t *zsend16;     /* stage 3 under bf16: the shard rounded to bf16 as each unit's gather sends it [zn] (device memory) */
    /* Stage 3 on a device: buffers for the largest unit, made at layout so a
     * step allocates nothing; one device gather and one reduction use them at a time. */
    void *zland16;         /* under bf16: the device buffer a gather lands in [world * shard] */
    void *zstage_send, *zstage_recv; /* host copies of a gather's sides, for a group that takes host memory only */
    float *zstage_grads;   /* host copy of a reduce-scatter's gradients [world * shard], likewise */
    int gathering;         /* the unit whose device gather holds zland16 / zstage_send / zstage_recv, or -1 */
    int *order, n_order;   /* stage 3: units in forward execution order (recorded on the first forward) */
    int64_t prefetches;    /* stage 3: prefetch all-gathers started (tests observe the schedule) */
    bool order_done;
    int unhooked;          /* stage 3: 1 + a unit whose gradient came while it was not gathered, else 0 */
    int reducing;          /* stage 3: the unit whose reduce-scatter is in flight, or -1 */
    accel_status reduce_status; /* stage 3: the first failure of this backward's reductions */
    bool owing;            /* stage 3 a mapping ran that the ranks have not agreed on yet ... */
    accel_status owed;     /* ... and its failure on this rank (zero3.c "Agreeing on a failed mapping") */
    int n_hooked;          /* stage 3: the modules whose forward gathers a unit */
    accel_module **hooked;
    int *hooked_unit;
} accel__zero_model;

/* pm's ZeRO state, or NULL (pm NULL, or its layout has not made it). */
static inline accel__zero_model *accel__zero_of(const accel__model *pm) {
    return pm ? (accel__zero_model *)pm->strat_state : NULL;
}

/* zero.c: pm's state, made at the start of each ZeRO layout (the shards on
 * the f32 buffer's device), and freed, with the units and the gradient
 * shard, at the end of each ZeRO release (a no-op when never made). */
accel_status accel__zero_model_new(accel__model *pm);
void accel__zero_model_free(accel__model *pm);

#endif
