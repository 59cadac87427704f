/* Shared between the files of src/accelerator. */
#ifndef ACCEL_ACCELERATOR_INTERNAL_H
#define ACCEL_ACCELERATOR_INTERNAL_H

#include "accel/accelerator.h"
#include "accel/dist.h"

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

typedef struct accel__model {
    accel_module *m;
    accel_flat_params *fp;
    void *orig_grads[ACCEL_DTYPE_COUNT]; /* flatten's own grad buffers, while shared ones are used */
    int n_buckets;
    accel__bucket *buckets;
    int n_leaves;
    accel__leaf *leaves;
    int next_launch;       /* buckets launch in index order on every rank */
    bool no_sync;          /* inside no_sync */
    bool ddp;              /* world > 1 */
    accel_dtype autocast_prev;
} accel__model;

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
};

/* ddp.c */
accel_status accel__ddp_prepare(accel_accelerator *acc, accel__model *pm);
void accel__ddp_release(accel_accelerator *acc, accel__model *pm);
void accel__ddp_begin_backward(accel_accelerator *acc);
accel_status accel__ddp_end_backward(accel_accelerator *acc);
bool accel__model_syncs(const accel_accelerator *acc, const accel__model *pm);

/* The data loader whose epoch is running (the last prepared one), or NULL. */
accel_dataloader *accel__active_dataloader(const accel_accelerator *acc);
accel__model *accel__find_model(accel_accelerator *acc, const accel_module *m);

#endif
