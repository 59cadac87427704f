/*
 * accel/bigmodel.h — big model inference: sizes, device maps, (dispatch, offload).
 *
 * Port of accelerate.utils.modeling (and of accelerate/big_modeling.py, accelerate/hooks.py). Everything here works
 * on the module tree only (shapes and dtypes), so models built on the meta
 * device (accel_init_empty_weights_begin) cost no memory.
 *
 * Device strings. A device map assigns a device string to a module prefix:
 *   "0", "1", ...   accelerator (GPU) index, as Accelerate's integer keys;
 *   "cuda:N"        the same, spelled as a device;
 *   "cpu", "meta", "disk".
 * Prefixes are dotted module (or tensor) names; "" is the whole model. A tensor
 * belongs to the longest prefix p with name == p or name starting with p + ".".
 *
 * Messages. Warnings (keys matching no module; buffers that will not fit a GPU)
 * go to opts->log, or stderr. Info lines (devices that got nothing) go to
 * opts->log, or stderr when opts->verbose.
 */
#ifndef ACCEL_BIGMODEL_H
#define ACCEL_BIGMODEL_H

#include <stdio.h>

#include "core.h"
#include "nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------ device maps */

typedef struct accel_device_map_entry {
    char *prefix;     /* owned */
    char device[24];  /* "0", "cpu", "disk", "meta", "cuda:1" */
} accel_device_map_entry;

/* Ordered (insertion order, like a Python dict). */
typedef struct accel_device_map {
    int n, cap;
    accel_device_map_entry *e;
} accel_device_map;

accel_device_map *accel_device_map_new(void);
void accel_device_map_free(accel_device_map *m); /* NULL is a no-op */
/* Replaces the device of an existing prefix in place, else appends. The value
 * is checked here from its spelling: an integer GPU index ("0", up to 1023),
 * "disk", "cpu", "meta", or cuda/npu/hostless with an optional ":N" (N in
 * 0..1023); anything else ("gpu:9", "mps", "cuda:x") is ACCEL_ERR_INVALID_ARG
 * and leaves m as it was. Whether a backend serves the type and the machine
 * has the device is checked when the map is used (accel_load_checkpoint_in_model). */
accel_status accel_device_map_set(accel_device_map *m, const char *prefix, const char *device);
void accel_device_map_remove(accel_device_map *m, const char *prefix);
/* Exact prefix -> device, NULL when absent. */
const char *accel_device_map_get(const accel_device_map *m, const char *prefix);
/* Longest matching prefix for a tensor/module name -> device, NULL when none. */
const char *accel_device_map_lookup(const accel_device_map *m, const char *name);
/* Parses "a:0,b:cpu,c:cuda:1,d:hostless:0" ("" key written as ":0"; a value
 * "type:N" keeps its colon) — for tests and the CLI. Each value is checked as
 * accel_device_map_set checks it; NULL + error on the first bad one. */
accel_device_map *accel_device_map_parse(const char *spec);
/* Reads a device map saved as JSON, as `json.dump(model.hf_device_map)`
 * writes it: one object of prefix -> device, a string ("cpu", "disk",
 * "cuda:1") or a GPU index (an integer), in the file's order. Each value is
 * checked as accel_device_map_set checks it; NULL + error naming the file
 * and the key when the file cannot be read, is not such an object, holds a
 * key twice, or a value of another type. The caller frees the map. */
accel_device_map *accel_device_map_load(const char *path);
/* Writes {"a": 0, "b": "cpu"} (integers unquoted, like Python) into buf. */
const char *accel_device_map_str(const accel_device_map *m, char *buf, size_t n);
/* The device a map value denotes: "0" -> cuda:0, "cpu", "meta", "cuda:1".
 * "disk" -> ACCEL_ERR_INVALID_ARG (it is a storage, not a device). */
accel_status accel_device_map_device(const char *value, accel_device *out);
/* clean_device_map: collapses every prefix whose entries share one device. */
void accel_clean_device_map(accel_device_map *m);

/* ------------------------------------------------------------ memory budgets */

#define ACCEL_MAX_MEMORY_DEVICES 16

typedef struct accel_max_memory {
    int n;
    struct {
        char device[24]; /* "0", "1", ..., "cpu", "disk" */
        int64_t bytes;
    } e[ACCEL_MAX_MEMORY_DEVICES];
} accel_max_memory;

/* Adds (or replaces) a budget. device: a GPU index ("0", "1", ...; no
 * leading zero), "cpu" or "disk"; another key -> ACCEL_ERR_INVALID_ARG
 * naming it. size: bytes as an integer string or "10GB", "2GiB", ...
 * (accel_parse_size). */
accel_status accel_max_memory_set(accel_max_memory *mm, const char *device, const char *size);
accel_status accel_max_memory_set_bytes(accel_max_memory *mm, const char *device, int64_t bytes);
/* -1 when the device has no budget. */
int64_t accel_max_memory_get(const accel_max_memory *mm, const char *device);
/* get_max_memory: in == NULL -> this machine: {"0": free bytes of cuda:0, ...,
 * "cpu": MemAvailable} (the GPUs' free memory from the driver; just "cpu"
 * without a GPU); else a copy of `in` validated (unknown
 * key -> ACCEL_ERR_INVALID_ARG "Device X is not recognized, ...") and ordered:
 * integer keys ascending, then "cpu", then "disk". */
accel_status accel_get_max_memory(const accel_max_memory *in, accel_max_memory *out);

/* ------------------------------------------------------------ sizes */

typedef struct accel_name_dtype {
    const char *name;
    accel_dtype dtype;
} accel_name_dtype;

/* Options shared by the size and device-map functions. Zero-init = Accelerate's defaults. */
typedef struct accel_device_map_opts {
    const char *const *no_split;       /* module type names never split (e.g. "LlamaDecoderLayer") */
    int n_no_split;
    bool has_dtype;                    /* weights will be loaded in `dtype` (floating tensors) */
    accel_dtype dtype;
    const accel_name_dtype *special_dtypes; /* per full tensor name, overrides dtype */
    int n_special;
    bool verbose;                      /* print each step of the allocation to log */
    bool keep_raw;                     /* skip clean_device_map (Accelerate: clean_result=False) */
    bool offload_buffers;
    bool fallback_allocation;
    FILE *log;                         /* NULL: stderr */
} accel_device_map_opts;

/* Per-prefix sizes in bytes ("" = total), in Accelerate's insertion order
 * (parameters, then buffers; each tensor counted once even if tied).
 * Deviation: bool tensors count 1 byte per element (their real size in accel);
 * Accelerate's dtype_byte_size counts 1/8. */
typedef struct accel_module_sizes {
    int n, cap;
    char **names;
    int64_t *bytes;
    int *hash;      /* open addressing over names */
    int hash_cap;
} accel_module_sizes;

/* compute_module_sizes(model, dtype, special_dtypes, buffers_only). opts may be NULL. */
accel_module_sizes *accel_compute_module_sizes(accel_module *root, const accel_device_map_opts *opts,
                                               bool buffers_only);
void accel_module_sizes_free(accel_module_sizes *s);
/* 0 when the prefix has no tensors (like the defaultdict). */
int64_t accel_module_sizes_get(const accel_module_sizes *s, const char *prefix);
/* compute_module_total_buffer_size. */
int64_t accel_module_total_buffer_size(accel_module *root, const accel_device_map_opts *opts);

/* get_max_layer_size over the root's direct params, children and buffers:
 * a layer is a leaf module or a module whose type is in no_split (a direct
 * tensor is a layer of its own). names (optional) receives a malloc'd ("accel_free")
 * array of accel_malloc'd names achieving the max; *n_names their count. */
int64_t accel_get_max_layer_size(accel_module *root, const accel_module_sizes *sizes,
                                 const char *const *no_split, int n_no_split, char ***names,
                                 int *n_names);
void accel_free_names(char **names, int n);

/* calculate_maximum_sizes: total size and largest layer. */
accel_status accel_calculate_maximum_sizes(accel_module *root, const char *const *no_split,
                                           int n_no_split, int64_t *total, int64_t *largest_layer);

/* ------------------------------------------------------------ tied parameters */

typedef struct accel_tied_params {
    int n_groups;
    int *group_size;
    char ***groups;   /* each group's names sorted; groups sorted by first name */
} accel_tied_params;

/* find_tied_parameters: parameters registered under several names. */
accel_tied_params *accel_find_tied_parameters(accel_module *root);
void accel_tied_params_free(accel_tied_params *tp);

/* ------------------------------------------------------------ training memory
 * What a training step of accel's Llama holds, counted from the tensors its
 * ops allocate (docs/bigmodel.md "Training memory"; src/bigmodel/
 * training_memory.c). accel estimate-memory prints these. */

typedef struct accel_activation_opts {
    int64_t batch_size;   /* per rank, >= 1 */
    int64_t seq_len;      /* >= 2 (the loss shifts the labels by one) */
    accel_dtype autocast; /* ACCEL_F32 (no autocast), ACCEL_BF16 or ACCEL_F16 */
    bool checkpointing;   /* activation checkpointing of every decoder layer */
    bool zero3;           /* ZeRO-3 with the default wrap (the embedding, each decoder layer, the final
                           * norm, lm_head): each unit's output gradient is copied once more by the
                           * node that gathers the unit for its backward */
    int tp_size;          /* one rank of tensor parallelism over tp_size ranks (accel_llama_parallelize's
                           * plan: heads, the MLP's hidden and the vocabulary split); 0 or 1: none */
    bool sequence_parallel; /* with tp_size > 1: Megatron's sequence parallelism (the norms' and
                             * residual adds' activations split along the sequence) */
    int cp_size;          /* one rank of context parallelism over cp_size ranks (accel/cp.h: its
                           * seq_len / cp_size positions, seq_len a multiple of 2 cp_size); 0 or 1:
                           * none. Decoders only, not GPT-2 (as the runtime), and not a layer that
                           * attends through explicit scores (a window that bites, soft-capping) */
    bool cp_alltoall;     /* with cp_size > 1 (refused otherwise): the all-to-all (Ulysses) strategy, else all-gather */
    int64_t num_choices;  /* BERT's multiple choice only (required there, >= 1; 0 elsewhere): each of the
                           * batch_size examples is num_choices rows of seq_len through the encoder */
} accel_activation_opts;

/* Bytes of the step arena (the CPU step tensors: activations, their
 * gradients; not the weights' autocast copies, which are persistent:
 * accel_rank_memory.prepared). */
typedef struct accel_activation_bytes {
    int64_t peak;           /* the high-water mark over one step (accel_arena_peak) */
    int64_t layer_forward;  /* one decoder layer's forward with grad */
    int64_t layer_backward; /* its backward */
    int64_t kept_per_layer; /* what a layer holds until the step ends: all of the above,
                             * or checkpointed its output and its input's gradient */
    int64_t outer;          /* ids, embedding, final norm, head, loss, and their backward */
} accel_activation_bytes;

/* The step arena of a steady-state training step (parameter gradients already
 * allocated, as after the first step or under an Accelerator) of the decoder
 * cfg (any family of the architecture table: its own blocks, windows,
 * soft-capping, GPT-2's dropouts while training, the sparse layers' experts
 * on a balanced routing: each expert n k / E of the tokens' rows) on this machine's CPU (whether its GEMM multiplies autocast's dtype
 * itself is read from it). Errors: bad cfg or options, sizes past 2^62 bytes,
 * tp_size above 1 with experts (ACCEL_ERR_UNSUPPORTED: their tensor-parallel region is not modelled).
 * The one options pointer of the API that may not be NULL: the batch and
 * sequence sizes have no default. */
accel_status accel_llama_activation_bytes(const accel_llama_config *cfg, const accel_activation_opts *o,
                                          accel_activation_bytes *out);
/* The same for a BERT, RoBERTa or XLM-RoBERTa of cfg (accel/bert.h) with
 * cfg->head's head (any), trained with that head's loss (accel_bert_loss,
 * _token_loss, _qa_loss, _mlm_loss, _pretraining_loss, _nsp_loss,
 * _multiple_choice_loss) on padded batches with token_type_ids (its
 * dropouts acting): every layer attends through explicit [B, H, T, T]
 * scores. seq_len at most max_position_embeddings (RoBERTa's:
 * max_position_embeddings - pad_token_id - 1, its positions starting at
 * pad_token_id + 1); multiple choice needs
 * o->num_choices (batch_size counts examples), the other heads refuse it. */
struct accel_bert_config;
accel_status accel_bert_activation_bytes(const struct accel_bert_config *cfg, const accel_activation_opts *o,
                                         accel_activation_bytes *out);

typedef enum accel_shard_strategy {
    ACCEL_SHARD_DDP,   /* NO_SHARD */
    ACCEL_SHARD_ZERO1, /* optimizer state sharded */
    ACCEL_SHARD_ZERO2, /* SHARD_GRAD_OP: and gradients */
    ACCEL_SHARD_ZERO3, /* FULL_SHARD: and parameters */
    ACCEL_SHARD_STRATEGIES
} accel_shard_strategy;

/* "DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3". */
const char *accel_shard_strategy_name(accel_shard_strategy s);

/* Per-rank bytes of training with Adam on f32 parameters. */
typedef struct accel_rank_memory {
    int64_t weights;     /* parameters (a shard under ZeRO-3) */
    int64_t grads;       /* the gradient buffer, and ZeRO-2's reduced shard (world > 1) */
    int64_t optimizer;   /* exp_avg + exp_avg_sq */
    int64_t gathered;    /* ZeRO-3: two units' full parameters and two units' full gradients */
    int64_t prepared;    /* bf16 / fp16: autocast's copy of every weight, made once per step (2
                          * bytes a parameter where the CPU multiplies that dtype, else 4: the
                          * rounded values widened to f32); where oneDNN runs the linears' GEMMs,
                          * up to two more copies in its layout (f32 too); docs/cpu.md,
                          * "Prepared weights" */
    int64_t activations; /* as passed (accel_llama_activation_bytes().peak) */
    int64_t total;
} accel_rank_memory;

/* param_bytes: the f32 parameters' bytes; largest_unit_bytes: the largest wrap
 * unit's (a decoder layer, or the embedding); autocast: the mixed precision's
 * compute dtype, ACCEL_F32 (mixed_precision "no"), ACCEL_BF16 or ACCEL_F16
 * (anything else is refused), as accel_activation_opts.autocast; world: the
 * ranks ZeRO shards over (dp_shard x cp). DDP's buckets are ranges of the
 * gradient buffer itself (no copy on the CPU); ZeRO-2 over one rank keeps no
 * reduced shard (its gradients are averaged in place). */
accel_status accel_rank_memory_estimate(accel_shard_strategy s, int64_t param_bytes, int64_t largest_unit_bytes,
                                        int world, accel_dtype autocast, int64_t activation_bytes,
                                        accel_rank_memory *out);

/* ------------------------------------------------------------ device maps from budgets */

/* infer_auto_device_map (accelerate/utils/modeling.py), step by step. max_memory NULL ->
 * accel_get_max_memory(NULL). Returns a new map (NULL + error). */
accel_device_map *accel_infer_auto_device_map(accel_module *root, const accel_max_memory *max_memory,
                                              const accel_device_map_opts *opts);

/* get_balanced_memory (§7.5): writes the balanced budgets into out. */
accel_status accel_get_balanced_memory(accel_module *root, const accel_max_memory *max_memory,
                                       const accel_device_map_opts *opts, bool low_zero,
                                       accel_max_memory *out);

/* A device_map string: "auto" == "balanced", "balanced_low_0", "sequential".
 * Anything else -> ACCEL_ERR_INVALID_ARG naming the accepted values. */
accel_device_map *accel_device_map_from_string(accel_module *root, const char *strategy,
                                               const accel_max_memory *max_memory,
                                               const accel_device_map_opts *opts);

/* check_device_map (§7.6): keys matching no submodule are a warning (to
 * opts->log / stderr, opts may be NULL); tensors not covered are an
 * ACCEL_ERR_INVALID_ARG error listing them. */
accel_status accel_check_device_map(accel_module *root, const accel_device_map *map,
                                    const accel_device_map_opts *opts);

/* ================================================================
 * Dispatch, hooks and offload (§7.8–7.11) — declared below by
 * src/bigmodel/dispatch*.c and offload*.c.
 * ================================================================ */

/* ------------------------------------------------------------ loading + dispatch
 *
 * Where each tensor goes (device of its longest map prefix):
 *   - a device (cpu, cuda:N in a CUDA build, any registered backend's
 *     device): materialised there from its allocator, read straight from the
 *     mapped checkpoint (through the backend's copies off the cpu; converted
 *     to the param dtype);
 *   - "disk": offloaded. The parameter stays on meta; the weights map keeps a
 *     zero-copy view of the mapped checkpoint. A hook points the parameter at
 *     the mapped bytes just before its module runs (pages fault in on use;
 *     converted into a scratch buffer when the param dtype differs) and drops
 *     it afterwards (params back to meta, the pages released from this
 *     process with MADV_DONTNEED);
 *   - "cpu" when the main device is not the cpu (or opts->offload_cpu):
 *     offloaded to a host copy, pointed at by the hook during the forward.
 * Offloaded weights are used in place when the execution device is the cpu;
 * on another device the hook copies them in through its backend (through
 * pinned host chunks, converted chunk by chunk: no host copy of a tensor) and
 * frees the copy after the forward.
 * The main (execution) device for offloaded modules is opts->main_device, or
 * the first map device that is neither cpu nor disk, or cpu (Accelerate's
 * dispatch_model). The root module gets io_same_device semantics: its output
 * comes back to the device its input came from; every block runs on its
 * entry's device (offloaded ones on the main device), its input moved there.
 * A tied weight whose names the map runs on two devices (a tied head apart
 * from its embeddings) is refused, ACCEL_ERR_INVALID_ARG naming both.
 * Backward through offloaded weights is refused (ACCEL_ERR_STATE naming the
 * weight: they went back to meta after their forward).
 * A device this build or machine lacks (npu:0, cuda:1) fails at load time
 * with an ACCEL_ERR_DEVICE message naming the map entry. */

typedef struct accel_load_opts {
    bool has_dtype;            /* cast floating tensors to dtype (non-floating keep theirs) */
    accel_dtype dtype;
    bool strict;               /* unexpected or missing keys are errors (else warnings) */
    const char *main_device;   /* execution device of offloaded modules; NULL: see above */
    bool offload_cpu;          /* "cpu" entries are offloaded (host copy) even when main is cpu */
    /* Module types whose hook brings in every offloaded weight below them at
     * once (Accelerate's preload_module_classes); leaves always do. NULL: the
     * map options' no_split classes. */
    const char *const *preload_classes;
    int n_preload;
    const accel_device_map_opts *map_opts; /* for string maps and check_device_map; may be NULL */
    FILE *log;                 /* warnings (unexpected/missing keys); NULL: stderr */
    /* transformers' base_model_prefix ("transformer", "model"): a checkpoint
     * tensor the model lacks is looked up again as "<prefix>.<name>", so a
     * checkpoint of the body (GPT2Model's "h.0.ln_1.weight", as the Hub's
     * gpt2 has) loads into the causal LM. NULL: none (from_pretrained: the
     * name of the root's body). */
    const char *base_model_prefix;
} accel_load_opts;

/* The loaded state of a dispatched model: the mapped checkpoint, host copies
 * of cpu-offloaded weights, and the hooks' bookkeeping. Free it and the model
 * in either order: freeing the model first makes it let go of the model's
 * hooks and tensors (docs/contract.md "Lifetimes"). */
typedef struct accel_dispatched accel_dispatched;

typedef struct accel_dispatch_stats {
    int64_t n_loaded;          /* tensors materialised on their device at load */
    int64_t n_offloaded_disk;  /* tensors left on meta, read from the mapping on use */
    int64_t n_offloaded_cpu;   /* tensors left on meta, read from host copies on use */
    int64_t bytes_resident;    /* bytes materialised at load (execution devices) */
    int64_t bytes_host_copies; /* bytes of host copies (cpu offload) */
    int64_t bytes_disk;        /* bytes left in the mapped checkpoint */
    int64_t peak_onload_bytes; /* most offloaded bytes brought in at once during forwards */
    int64_t scratch_bytes;     /* of which converted host copies (cpu execution, dtype differs from the file) */
    int n_unexpected;          /* checkpoint tensors the model lacks */
    int n_missing;             /* model tensors the checkpoint lacks */
} accel_dispatch_stats;

/* load_checkpoint_in_model (§7.7). checkpoint: a *.safetensors file, a
 * *.index.json, or a directory (accel_checkpoint_open). map NULL: every
 * tensor on cpu. Checks the map first (unknown devices, uncovered tensors:
 * accel_check_device_map). The model's tensors may be on meta (built under
 * accel_init_empty_weights) or materialised (they are overwritten). No hooks
 * are attached: accel_dispatch_model does that. NULL + error. */
accel_dispatched *accel_load_checkpoint_in_model(accel_module *root, const char *checkpoint,
                                                 const accel_device_map *map,
                                                 const accel_load_opts *opts);
/* dispatch_model (§7.9): attaches the hooks for d's map. */
accel_status accel_dispatch_model(accel_module *root, accel_dispatched *d);
/* load_checkpoint_and_dispatch (§7.8): map, or strategy ("auto", "balanced",
 * "balanced_low_0", "sequential") with max_memory (NULL: this machine) when
 * map is NULL; both NULL: everything on cpu. */
accel_dispatched *accel_load_checkpoint_and_dispatch(accel_module *root, const char *checkpoint,
                                                     const accel_device_map *map,
                                                     const char *strategy,
                                                     const accel_max_memory *max_memory,
                                                     const accel_load_opts *opts);
/* Removes the hooks, puts offloaded parameters back on meta, frees host
 * copies and unmaps the checkpoint. Materialised weights stay with the model.
 * NULL is a no-op. */
void accel_dispatched_free(accel_dispatched *d);
void accel_dispatched_stats(const accel_dispatched *d, accel_dispatch_stats *out);
/* The resolved device map (owned by d) and main device. */
const accel_device_map *accel_dispatched_map(const accel_dispatched *d);
accel_device accel_dispatched_main_device(const accel_dispatched *d);
/* Where a tensor lives: "cpu", "cuda:0", "disk", or "cpu-offload"
 * (a host copy brought to the main device on use). NULL when unknown. */
const char *accel_dispatched_placement(const accel_dispatched *d, const char *tensor_name);

/* ------------------------------------------------------------ save_pretrained / from_pretrained */

/* config.json + safetensors (model.safetensors, or shards of at most
 * max_shard_bytes with model.safetensors.index.json; <= 0: 5 GB, the
 * transformers default) that transformers.LlamaForCausalLM.from_pretrained
 * loads. Tied aliases (lm_head.weight with tie_word_embeddings) are dropped
 * as transformers does. Every tensor must be materialised; a model whose
 * tensors hold only this process's part (FSDP FULL_SHARD / ZeRO-3 shards,
 * tensor-parallel slices: accel_save_module's refusal) is refused with
 * ACCEL_ERR_STATE, nothing written (accel_accelerator_save_model gathers
 * them). Crash-safe as accel_save_sharded (io.h): the weights and
 * config.json are swapped in together, the rest of dir kept (a dir that is
 * itself a mount point: written in place, config.json after the weights). */
accel_status accel_save_pretrained(accel_module *llama, const char *dir, int64_t max_shard_bytes);
/* from_pretrained: dir's config.json, the model built on meta, then
 * accel_load_checkpoint_and_dispatch(dir, map, strategy, max_memory, opts)
 * (no_split defaults to the family's decoder layer class; checkpoint names
 * read through transformers' legacy renames, LayerNorm.gamma/beta as
 * weight/bias, as every from_pretrained does). The model comes
 * back in eval mode, as transformers' from_pretrained returns it (GPT-2's
 * dropout off): accel_module_train(m, true) before training. *out gets the
 * dispatch state (free it and the model in either order). NULL + error.
 * The family is config.json's model_type; a config without that key is a
 * Llama, as LlamaForCausalLM.from_pretrained loads it. */
accel_module *accel_llama_from_pretrained(const char *dir, const accel_device_map *map,
                                          const char *strategy, const accel_max_memory *max_memory,
                                          const accel_load_opts *opts, accel_dispatched **out);

/* BERT's (accel/bert.h) from_pretrained with a device map: dir's
 * config.json (model_type "bert", "roberta" or "xlm-roberta"), the
 * BertFor<head> (RobertaFor<head>, ...) of its head built on meta, then
 * accel_load_checkpoint_and_dispatch as above (no_split BertLayer /
 * RobertaLayer, base_model_prefix "bert" / "roberta": a bare BertModel's or
 * RobertaModel's checkpoint names load too). It takes what accel_bert_from_pretrained takes: the original
 * Google checkpoints' LayerNorm gamma/beta names (transformers' legacy
 * renames, which every from_pretrained applies), and a checkpoint without
 * the head (a BertModel's): the missing pooler / classifier / qa_outputs
 * weights are
 * newly initialised (weight N(0, initializer_range), bias 0) on the device
 * they map to, or the main device where the map says disk or cpu offload (no
 * file holds them), named in a warning and counted in
 * accel_dispatch_stats.n_missing (an error with opts->strict). Any other
 * missing weight is an error naming it; checkpoint weights the model has no
 * place for (another head's) are unexpected keys (a warning, counted in
 * n_unexpected; an error with opts->strict). Returns the model in eval mode;
 * NULL + error. */
accel_module *accel_bert_from_pretrained_dispatched(const char *dir, const accel_device_map *map,
                                                   const char *strategy, const accel_max_memory *max_memory,
                                                   const accel_load_opts *opts, accel_dispatched **out);

/* The same with the head (an accel_bert_head) and num_labels (> 0; else
 * the config's) chosen by the caller (accel_bert_from_pretrained_head). */
accel_module *accel_bert_from_pretrained_head_dispatched(const char *dir, int head, int64_t num_labels,
                                                        const accel_device_map *map,
                                                        const char *strategy, const accel_max_memory *max_memory,
                                                        const accel_load_opts *opts, accel_dispatched **out);

/* ------------------------------------------------------------ generation */

typedef struct accel_generate_opts {
    int64_t max_new_tokens;
    bool do_sample;            /* false: greedy (argmax, first index on ties); the three
                                * below are used (and checked) only when sampling: */
    double temperature;        /* > 0; 0: the default, 1.0 (unchanged) */
    int64_t top_k;             /* >= 0 (0: off) */
    double top_p;              /* in (0, 1]; 0: the default, 1.0 (off) */
    uint64_t seed;             /* sampling RNG (Philox; same seed, same tokens) */
    bool has_eos;              /* stop after eos_token_id is generated */
    int64_t eos_token_id;
    /* accel_generate_batch: a finished row's next tokens (transformers'
     * pad_token_id); without it eos_token_id, as transformers pads */
    bool has_pad;
    int64_t pad_token_id;
    accel_tensor *prompt_logits; /* optional persistent tensor of vocab elements (any device and
                                  * shape, float dtype, contiguous; else refused before the
                                  * forward): gets the logits at the prompt's last position
                                  * (accel_generate only: accel_generate_batch refuses it) */
} accel_generate_opts;

/* A zero-initialised struct (and NULL options) is greedy decoding; with do_sample, plain draws
 * from the softmax (transformers' GenerationConfig has top_k 50). When
 * sampling, a value out of range (negative or NaN temperature, top_k < 0,
 * top_p outside [0, 1]) is ACCEL_ERR_INVALID_ARG naming the parameter, as
 * transformers' warpers raise. */
/* What accel_generate checks before it runs: max_new_tokens >= 0 (and the
 * n_prompt + max_new_tokens slots of out addressable), then the sampling
 * parameters above. ACCEL_ERR_INVALID_ARG naming the parameter. */
accel_status accel_generate_opts_check(const accel_generate_opts *opts, int64_t n_prompt);

/* Decodes with the KV cache (batch 1): one forward over the prompt, then one
 * per new token. out needs n_prompt + max_new_tokens slots; *n_out gets the
 * count written (prompt included). Resets the calling thread's step arena
 * after every forward (step tensors of the caller become invalid). */
accel_status accel_generate(accel_module *llama, const int64_t *prompt, int64_t n_prompt,
                            const accel_generate_opts *opts, int64_t *out, int64_t *n_out);
/* transformers' generate on a batch: ids and attention_mask [B, T] (host,
 * row-major; left-padded, as decoder-only models need: a row whose last
 * column is a pad, a row of pads only, a mask value other than 0/1 or an id
 * outside the vocabulary, a pad's too (every column is embedded), is
 * ACCEL_ERR_INVALID_ARG). Position ids from the
 * mask (its cumulative sum - 1, 0 at the pads), then one more a step; every
 * step's forward takes the whole mask (a new column of ones a step) and the
 * KV cache. A row that generated eos_token_id (opts->has_eos) is finished:
 * its next tokens are pad_token_id (opts->has_pad, else eos_token_id).
 * Stops when every row has finished or after max_new_tokens. Sampling:
 * one generator (opts->seed); each step draws one token per row in row
 * order 0 .. B-1, finished rows included (their draws thrown away), so the
 * same seed gives the same tokens, and a batch of one the tokens of
 * accel_generate. out needs B (T + max_new_tokens) slots: it gets the
 * sequences [B, *n_cols] row-major (the prompt's columns first, pads
 * included; *n_cols = T + the steps run). Resets the calling thread's step
 * arena after every forward. */
accel_status accel_generate_batch(accel_module *llama, const int64_t *ids, const int64_t *attention_mask, int64_t B,
                                  int64_t T, const accel_generate_opts *opts, int64_t *out, int64_t *n_cols);
/* One token from logits [V] (any device and float dtype; not modified: a
 * host copy goes through temperature, top-k, top-p filtering as
 * transformers' warpers, in that order); greedy unless opts->do_sample.
 * -1 + error on bad arguments, and when sampling from logits holding NaN or
 * +inf (torch.multinomial raises there too). */
int64_t accel_sample_logits(const accel_tensor *logits, const accel_generate_opts *opts, accel_rng *rng);

#ifdef __cplusplus
}
#endif
#endif /* ACCEL_BIGMODEL_H */
