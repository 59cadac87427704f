/* src/bigmodel/bigmodel_internal.h — shared by the bigmodel files. */
#ifndef ACCEL_BIGMODEL_INTERNAL_H
#define ACCEL_BIGMODEL_INTERNAL_H

#include "accel/bigmodel.h"
#include "accel/io.h"

/* Accelerate's "modules_to_treat": (name, module or tensor) in order. */
typedef struct accel__work_item {
    char *name;           /* owned, full dotted name */
    accel_module *mod;    /* a module, or */
    accel_tensor *t;      /* a direct parameter/buffer */
} accel__work_item;

typedef struct accel__work {
    int n, cap;
    accel__work_item *items;
} accel__work;

void accel__work_free(accel__work *w);
/* Inserts "prefix.local" (or local when prefix is NULL/"") at position at. */
accel_status accel__work_insert(accel__work *w, int at, const char *prefix, const char *local,
                                accel_module *m, accel_tensor *t);
/* Removes item at; its name moves to *out (or is freed when out is NULL). */
void accel__work_remove(accel__work *w, int at, accel__work_item *out);
int accel__work_find(const accel__work *w, const char *name);
/* Inserts named_parameters(recurse=False) (if params) + named_children() +
 * named_buffers(recurse=False) (if buffers) of m at position at. Count or -1. */
int accel__work_expand(accel__work *w, int at, const char *prefix, accel_module *m, bool params,
                       bool buffers);
bool accel__in_no_split(const accel_module *m, const char *const *no_split, int n);
/* get_max_layer_size over a work list (only its modules when modules_only). */
accel_status accel__max_layer_size(const accel__work *start, bool modules_only,
                                   const accel_module_sizes *sizes, const char *const *no_split,
                                   int n_no_split, int64_t *max_out, char ***names, int *n_names);

/* Warnings (always; to o->log or stderr) and info lines (to o->log, or stderr when verbose). */
void accel__bm_log(const accel_device_map_opts *o, bool warning, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* save_pretrained, as transformers writes it: m's state dict into dir as
 * safetensors (sharded with an index past max_shard_bytes; 0: transformers'
 * 5 GB), but the entries skip(sd, i) leaves out (the tied copies transformers
 * drops), and config(dir, cfg) (its config.json) beside them, the two swapped
 * in together, crash-safe (io_internal.h accel__save_staged: what else dir
 * holds is kept, the weights of either format replaced). Refused
 * (ACCEL_ERR_STATE, nothing written) where m's tensors hold only this
 * process's part (accel__module_values_away: ZeRO-3 / FSDP FULL_SHARD pieces,
 * tensor-parallel slices), and for a weight on meta (ACCEL_ERR_DEVICE).
 * *torch_dtype (inside cfg): set to the dtype of the floating-point weights
 * (the last one's) before config runs; left as it was without any. fn names
 * the caller in errors. */
typedef accel_status (*accel__config_writer)(const char *dir, const void *cfg);
accel_status accel__save_pretrained(const char *fn, accel_module *m, const char *dir, int64_t max_shard_bytes,
                                    bool (*skip)(const accel_state_dict *sd, int i), accel_dtype *torch_dtype,
                                    accel__config_writer config, const void *cfg);

/* What from_pretrained adds to load_checkpoint_in_model (transformers'
 * loading, not Accelerate's). Checkpoint names are read through transformers'
 * "legacy" renames first (LayerNorm.gamma / LayerNorm.beta, the original
 * Google BERT checkpoints' names, as LayerNorm.weight / LayerNorm.bias);
 * init_missing, when set, is offered each model tensor the checkpoint lacks
 * that is still on meta, with the device and dtype it would have been loaded
 * to (a tensor mapped to disk or offloaded: the main device, as it has no
 * file to be read from): it returns 1 when it materialised and initialised
 * it there (a task head the checkpoint was not trained with, which
 * transformers initialises and names in a warning), 0 when the tensor must
 * come from the checkpoint, -1 on an error it set. */
typedef struct accel__pretrained_load {
    int (*init_missing)(accel_tensor *t, const char *name, accel_device dev, accel_dtype dt, void *ctx);
    void *ctx;
    /* NULL-terminated POSIX extended regexes (or NULL): checkpoint tensors
     * the model has no place for whose name one matches (searched anywhere in
     * the name, as Python's re.search) are skipped silently, strict or not:
     * the family's old non-persistent buffers (accel__unexpected_to_ignore) */
    const char *const *ignore_unexpected;
} accel__pretrained_load;

/* transformers 5.25's patterns of checkpoint names from_pretrained skips
 * without a word for m's family (its class's _keys_to_ignore_on_load_unexpected,
 * plus rotary_emb.inv_freq where the model has such a buffer and
 * position_ids where it has that one), NULL-terminated; never NULL. */
const char *const *accel__unexpected_to_ignore(accel_module *m);
/* Whether name matches one of patterns (NULL-terminated, or NULL: none). */
bool accel__unexpected_ignored(const char *const *patterns, const char *name);

/* transformers' from_pretrained ties a tied pair only when the checkpoint
 * holds at most one of its names or both with equal values (as loaded: in
 * the parameter's dtype, or opts' dtype): for each tied tensor of root the
 * checkpoint holds under two names with different values, gives the
 * alias a tensor of its own (accel__module_untie, on the tensor's device,
 * values unset: the load fills it) and warns naming both, in transformers'
 * words. Checkpoint names map to root's as the load's (pl non-NULL: the
 * legacy renames; opts' base_model_prefix). */
accel_status accel__untie_stored_twice(accel_module *root, accel_checkpoint *ck, const accel_load_opts *opts,
                                       const accel__pretrained_load *pl);

/* accel_load_checkpoint_in_model / accel_load_checkpoint_and_dispatch with
 * from_pretrained's additions (pl NULL: the public calls, Accelerate's). */
accel_dispatched *accel__load_checkpoint_in_model(accel_module *root, const char *checkpoint,
                                                  const accel_device_map *map, const accel_load_opts *opts,
                                                  const accel__pretrained_load *pl);
accel_dispatched *accel__load_checkpoint_and_dispatch(accel_module *root, const char *checkpoint,
                                                      const accel_device_map *map, const char *strategy,
                                                      const accel_max_memory *max_memory,
                                                      const accel_load_opts *opts, const accel__pretrained_load *pl);

/* from_pretrained's second half for a model m (built on meta from dir's
 * config.json; NULL passes through): accel__load_checkpoint_and_dispatch with
 * m's block class as no_split and its body's name as base_model_prefix (where
 * opts leaves them unset) and the legacy renames, init_missing (may be NULL)
 * for the tensors the checkpoint may lack, then m in eval mode (transformers'
 * from_pretrained). Frees m on failure. */
accel_module *accel__dispatch_pretrained(accel_module *m, const char *dir, const accel_device_map *map,
                                         const char *strategy, const accel_max_memory *max_memory,
                                         const accel_load_opts *opts, const accel__pretrained_load *pl,
                                         accel_dispatched **out);

/* Is the string a GPU index key ("0", "12")? */
bool accel__is_gpu_key(const char *s);

#endif
