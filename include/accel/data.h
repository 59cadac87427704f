/*
 * accel/data.h — datasets, batch samplers, sharded data loaders.
 *
 * The data layer of Accelerate's DataLoaderShard, in C. A loader walks a
 * map-style dataset in batches of indices; each batch is collated into one
 * step tensor per field ([B, ...sample shape]) in the step arena. Sharding
 * across processes follows accelerate's BatchSamplerShard exactly (see
 * docs/data.md and accelerate/data_loader.py's BatchSamplerShard): pure integer logic over the epoch's
 * list of global batches, so every rank computes its own share without
 * talking to the others.
 *
 *     accel_dataset *ds = accel_tensor_dataset_new(2, (accel_tensor *[]){x, y});
 *     accel_dataloader_opts o = accel_dataloader_opts_default();
 *     o.batch_size = 8; o.shuffle = true;
 *     accel_dataloader *dl = accel_dataloader_new(ds, &o);
 *     accel_batch b;
 *     while (accel_dataloader_next(dl, &b)) {   // b.fields[0] x [8, 1], b.fields[1] y [8, 1]
 *         ... step ...; accel_step_reset();       // batch tensors die with the step
 *     }
 *
 * An epoch starts at the first next() after the previous epoch ended (or after
 * creation); it ends when next() returns false, which advances the epoch
 * counter (accelerate's `iteration`). Shuffling draws a permutation from
 * Philox(seed + epoch): identical on every rank for the same seed and epoch.
 *
 * Ownership: the loader borrows the dataset: free them in either order. A
 * dataset freed first detaches its loaders, which then refuse every call
 * that reads it (next, len, remainder, dataset: ACCEL_ERR_STATE) and can
 * only be freed. Datasets own copies of their tensors. accel_batches arrays are owned by the struct.
 */
#ifndef ACCEL_DATA_H
#define ACCEL_DATA_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------ batch lists */

/* One epoch of batches: batch i is indices[offsets[i] .. offsets[i+1]). */
typedef struct accel_batches {
    int64_t n;          /* number of batches */
    int64_t *offsets;   /* n + 1 entries (accel_malloc) */
    int64_t *indices;   /* offsets[n] entries (accel_malloc) */
    int64_t cap_batches, cap_indices;
} accel_batches;

void accel_batches_init(accel_batches *b);        /* empty */
void accel_batches_free(accel_batches *b);        /* frees the arrays; b becomes empty */
int64_t accel_batches_size(const accel_batches *b, int64_t i); /* length of batch i */
const int64_t *accel_batches_at(const accel_batches *b, int64_t i);
/* Appends one batch of n indices; idx may point into b (re-pushing one of its batches). */
accel_status accel_batches_push(accel_batches *b, int64_t n, const int64_t *idx);
/* torch's BatchSampler over `order` (n indices; NULL = 0..n-1): chunks of
 * batch_size, the short tail kept unless drop_last. Replaces b's contents. */
accel_status accel_batches_from_order(accel_batches *b, int64_t n, const int64_t *order,
                                      int64_t batch_size, bool drop_last);

/* ------------------------------------------------------------ sharding (§4.2) */

/* Every zero field means its default (0 processes: 1); NULL options: all defaults. */
typedef struct accel_shard_opts {
    int num_processes;
    int process_index;
    bool split_batches;   /* cut every global batch into num_processes slices */
    /* even_batches=False: no cycling from the epoch start, so ranks may get
     * fewer batches (by default every rank gets as many). */
    bool no_even_batches;
    /* The wrapped batch sampler's attributes. batch_size <= 0 means "None": a
     * variable-size batch sampler (only without split_batches). */
    int64_t batch_size;
    bool drop_last;
} accel_shard_opts;

/* accelerate's BatchSamplerShard: the batches process_index yields, in order,
 * from the epoch's global batches. Replaces out's contents (out != global).
 * split_batches with batch_size not a multiple of num_processes (batch size 1
 * included) -> ACCEL_ERR_INVALID_ARG, as BatchSamplerShard raises ValueError. */
accel_status accel_batch_sampler_shard(const accel_batches *global, const accel_shard_opts *o,
                                       accel_batches *out);
/* len(BatchSamplerShard) for a batch sampler of n_global batches; 0 with
 * the error set for opts accel_batch_sampler_shard refuses or n_global < 0. */
int64_t accel_batch_sampler_shard_len(int64_t n_global, const accel_shard_opts *o);

/* ------------------------------------------------------------ datasets */

typedef struct accel_dataset accel_dataset;

/* Per-sample layout of one field (the shape of one sample, without batch dim). */
typedef struct accel_field_spec {
    accel_dtype dtype;
    int ndim;
    int64_t shape[ACCEL_MAX_DIMS];
} accel_field_spec;

/* Writes sample `index` into fields[f] (contiguous memory of spec f's dtype and
 * shape) for each field. Returns ACCEL_OK or an error (set with accel_set_error). */
typedef accel_status (*accel_dataset_get_fn)(void *ctx, int64_t index, void *const *fields);

/* TensorDataset: n_fields tensors sharing their first dim N; sample i is
 * row i of each. The tensors are copied into host memory (any strides,
 * dtypes and devices; meta -> error). */
accel_dataset *accel_tensor_dataset_new(int n_fields, accel_tensor *const *tensors);
/* A map-style dataset of `len` samples produced by `get` (ctx borrowed). */
accel_dataset *accel_map_dataset_new(int64_t len, int n_fields, const accel_field_spec *specs,
                                     accel_dataset_get_fn get, void *ctx);
void accel_dataset_free(accel_dataset *ds);
int64_t accel_dataset_len(const accel_dataset *ds);
int accel_dataset_num_fields(const accel_dataset *ds);
const accel_field_spec *accel_dataset_field(const accel_dataset *ds, int f);

/* ------------------------------------------------------------ data loader */

#define ACCEL_BATCH_MAX_FIELDS 8

typedef struct accel_batch {
    int n_fields;
    accel_tensor *fields[ACCEL_BATCH_MAX_FIELDS]; /* step tensors [size, ...] on the cpu, or on
                                                   * the device of the accelerator that prepared
                                                   * the loader (its device placement) */
    int64_t size;                 /* samples in this batch */
    const int64_t *indices;       /* dataset indices (valid until the next call) */
    int64_t index;                /* position of this batch in this rank's epoch */
} accel_batch;

/* A custom batch sampler: fills `out` (empty on entry, every epoch) with the
 * epoch's global batches. Set batch_size in the options to its nominal size,
 * or <= 0 for variable sizes. */
typedef accel_status (*accel_batch_sampler_fn)(void *ctx, int64_t epoch, int64_t dataset_len,
                                               accel_batches *out);

/* Every zero field means its default: `{.batch_size = 8, .shuffle = true}`. */
typedef struct accel_dataloader_opts {
    int64_t batch_size;       /* 0: 1 (with a batch_sampler: <= 0 is variable sizes) */
    bool shuffle;
    bool drop_last;
    uint64_t seed;            /* shuffle seed; 0: the default generator's seed when the loader is made */
    accel_batch_sampler_fn batch_sampler; /* NULL: BatchSampler(Random|Sequential) */
    void *batch_sampler_ctx;
    /* Sharding: what Accelerator.prepare sets. 0 processes: 1. */
    int num_processes;
    int process_index;
    bool split_batches;
    bool no_even_batches;     /* even_batches=False (see accel_shard_opts) */
} accel_dataloader_opts;

/* Every option at its default: the zeroed struct. */
accel_dataloader_opts accel_dataloader_opts_default(void);

typedef struct accel_dataloader accel_dataloader;

/* The loader borrows ds; NULL o = every default (batch size 1, in order, one
 * process). Options are validated: split_batches on several
 * processes needs batch_size % num_processes == 0, batch size 1 included (the
 * BatchSamplerShard that prepare_data_loader builds raises ValueError). */
accel_dataloader *accel_dataloader_new(accel_dataset *ds, const accel_dataloader_opts *o);
void accel_dataloader_free(accel_dataloader *dl);
const accel_dataloader_opts *accel_dataloader_get_opts(const accel_dataloader *dl);
accel_dataset *accel_dataloader_dataset(const accel_dataloader *dl);

/* Re-shards a loader (what Accelerator.prepare does): same validation as
 * accel_dataloader_new. Ends a running epoch. */
accel_status accel_dataloader_shard(accel_dataloader *dl, int num_processes, int process_index,
                                    bool split_batches, bool even_batches);
accel_status accel_dataloader_set_seed(accel_dataloader *dl, uint64_t seed);

/* Batches this rank yields per epoch (len of the sharded loader); -1 + error
 * for a NULL loader or when its batch_sampler fails. */
int64_t accel_dataloader_len(const accel_dataloader *dl);
/* The next batch (collated in the step arena), starting an epoch if none is
 * running. Returns false at the end of the epoch (epoch += 1) or on error
 * (accel_last_status() != ACCEL_OK tells which). On error *out holds no batch
 * (n_fields 0) and the loader stays at the batch that failed (its collation,
 * or its move to a prepared loader's device): the next call makes it again. */
bool accel_dataloader_next(accel_dataloader *dl, accel_batch *out);
/* The epoch used by the next (or running) epoch. */
int64_t accel_dataloader_epoch(const accel_dataloader *dl);
/* Sets the epoch of the next epoch (ends a running one): >= 0 and below
 * INT64_MAX, which has no next (as in accel_dataloader_set_state). */
accel_status accel_dataloader_set_epoch(accel_dataloader *dl, int64_t epoch);
/* True while an epoch is running (between its first next() and its end). */
bool accel_dataloader_active(const accel_dataloader *dl);
/* True when the batch last returned is the last of the epoch (one-batch lookahead). */
bool accel_dataloader_end_of_dataloader(const accel_dataloader *dl);
/* gather_for_metrics' remainder: dataset_len % total_batch_size, or -1 with
 * drop_last (total_batch_size = batch_size with split_batches, else batch_size * N). */
int64_t accel_dataloader_remainder(const accel_dataloader *dl);
/* Batches already returned in the running epoch (0 when none running). */
int64_t accel_dataloader_position(const accel_dataloader *dl);
/* The next epoch started skips its first n batches (skip_first_batches);
 * applies to one epoch only. */
accel_status accel_dataloader_skip_first_batches(accel_dataloader *dl, int64_t n);

/* Iteration state for checkpoints: the epoch, the batches already returned in
 * it, and the shuffle seed. Restoring makes the next next() return the batch
 * an uninterrupted run would have returned. */
typedef struct accel_dataloader_state {
    int64_t epoch;
    int64_t position;
    uint64_t seed;
} accel_dataloader_state;
accel_dataloader_state accel_dataloader_get_state(const accel_dataloader *dl);
accel_status accel_dataloader_set_state(accel_dataloader *dl, const accel_dataloader_state *st);

#ifdef __cplusplus
}
#endif
#endif /* ACCEL_DATA_H */
