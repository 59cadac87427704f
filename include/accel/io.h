/*
 * accel/io.h — safetensors files, PyTorch (torch.save) files, sharded checkpoints,
 * size strings, HF config.json.
 *
 * safetensors (https://github.com/huggingface/safetensors) layout:
 *     [u64 little-endian N][N bytes JSON header][data section]
 * header: {"__metadata__": {"format": "pt", ...},
 *          "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...}
 * with offsets relative to the data section. The reader checks everything before
 * handing out a byte (see docs/io.md, "What the reader checks"); every failure is
 * ACCEL_ERR_FORMAT with a message naming the file and the tensor.
 *
 * Zero-copy. accel_safetensors_open maps the file privately (copy-on-write):
 * tensors returned by accel_safetensors_tensor in their stored dtype point
 * straight into the mapping (flag ACCEL_TF_MMAP). Writing to them never changes
 * the file. OWNERSHIP: such tensors borrow the mapping — free them (or rebind
 * them) BEFORE accel_safetensors_close. Converted copies own their memory.
 *
 * PyTorch files. accel_safetensors_open also reads torch.save's zip files
 * (torch >= 1.6: pytorch_model.bin and its shards) into the same handle:
 * data.pkl through a restricted unpickler that executes nothing (state dicts
 * of tensors only; other globals and opcodes refused by name), tensors
 * zero-copy in the mapping (docs/io.md, "Reading PyTorch files").
 */
#ifndef ACCEL_IO_H
#define ACCEL_IO_H

#include "core.h"
#include "nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------ size strings */

/* accelerate's convert_file_size_to_int: "10GB" (decimal), "2GiB" (binary),
 * "1.5GB", "500" (bytes, exact up to INT64_MAX), "100Mb" (lowercase b = bits, /8);
 * the number before the unit as Python's float() reads it, of any length (" 5 GB",
 * "1_000MB", "1e3KB").
 * "5MBB", "5k0MB", "-1GB", "" -> ACCEL_ERR_INVALID_ARG naming the string; so is a
 * size past int64 ("1e30GB"), named as too large. */
accel_status accel_parse_size(const char *s, int64_t *out);

/* ------------------------------------------------------------ safetensors reader */

typedef struct accel_safetensors accel_safetensors;

typedef struct accel_st_info {
    const char *name;             /* owned by the file object */
    accel_dtype dtype;
    int ndim;
    int64_t shape[ACCEL_MAX_DIMS];
    const void *bytes;            /* the stored bytes, in the file mapping (host memory) */
    size_t nbytes;
    uint64_t begin, end;          /* data_offsets (relative to the data section) */
} accel_st_info;

/* Maps and validates `path`: a safetensors file, or a torch.save zip file
 * (then begin/end are offsets in the file, tensors sharing a storage point to
 * the same bytes, a strided tensor is an owned gathered copy whose begin/end
 * are its storage record's: the bytes it was gathered from; the copies
 * together at most the file's size). NULL + error
 * (ACCEL_ERR_IO / ACCEL_ERR_FORMAT / ACCEL_ERR_UNSUPPORTED for dtypes accel
 * lacks, e.g. F8_E4M3, a compressed zip record, a pickle global outside a
 * state dict's, torch's legacy pre-1.6 format). */
accel_safetensors *accel_safetensors_open(const char *path);
/* Unmaps. Zero-copy tensors from this file must be freed first. NULL is a no-op. */
void accel_safetensors_close(accel_safetensors *st);
const char *accel_safetensors_path(const accel_safetensors *st);
int accel_safetensors_count(const accel_safetensors *st);
/* i-th tensor in file order (by data offset), 0 <= i < count. */
const accel_st_info *accel_safetensors_at(const accel_safetensors *st, int i);
/* Lookup by name: NULL without error when absent. */
const accel_st_info *accel_safetensors_find(const accel_safetensors *st, const char *name);
/* __metadata__ value for key, NULL when absent. */
const char *accel_safetensors_metadata(const accel_safetensors *st, const char *key);

/* A persistent tensor for `name` (CPU). want = -1 or the stored dtype: zero-copy
 * view of the mapping when the bytes are aligned to the element size (else an
 * owned copy); another dtype: an owned, converted copy. Free with accel_tensor_free. */
accel_tensor *accel_safetensors_tensor(accel_safetensors *st, const char *name, int want);
/* Copies (converting dtype) the tensor `name` into dst's memory; dst must be a
 * contiguous tensor of the same shape (error names both shapes) on any device
 * with memory: a CPU dst is filled from the mapping directly, another device's
 * through its backend, straight from the mapping when the dtypes match and
 * through a small conversion buffer (chunks, never a whole host copy) when
 * they differ. */
accel_status accel_safetensors_load_into(accel_safetensors *st, const char *name,
                                         accel_tensor *dst);

/* ------------------------------------------------------------ safetensors writer */

typedef struct accel_kv {
    const char *key;
    const char *value;
} accel_kv;

/* Writes n tensors (any device with memory, any strides; meta -> error; a
 * device tensor is staged through host memory in chunks) in the given order, with
 * metadata {"format": "pt"} plus `meta` pairs (a "format" pair replaces "pt").
 * The header is padded with spaces to a multiple of 8 as the Python library
 * does. Written to "<path>.tmp", fsynced, then renamed: readers never see a
 * half-written file. A "<path>.tmp" that accel did not create (the user's
 * own) is never overwritten: ACCEL_ERR_IO naming it (docs/io.md). Tied weights are written under every name given: dropping
 * an alias (transformers drops lm_head.weight when tied) is the caller's policy.
 * Duplicate names, or a name or metadata that is not UTF-8 (JSON) -> error. */
accel_status accel_safetensors_save(const char *path, int n, const char *const *names,
                                    accel_tensor *const *tensors, int n_meta,
                                    const accel_kv *meta);

/* ------------------------------------------------------------ PyTorch format writer */

/* Writes {names[i]: tensors[i]} as torch.save writes a state dict (the zip
 * archive of torch >= 1.6: data.pkl in pickle protocol 2 with each tensor as
 * torch._utils._rebuild_tensor_v2 over a persistent storage, data/<k> records
 * 64-byte aligned, version, byteorder; docs/io.md "PyTorch files"), in the
 * given order, loadable by torch.load(path, weights_only=True). The same
 * accel_tensor under several names is one storage, written once (tied weights,
 * as torch writes them); tensors on any device with memory, any strides (a
 * strided one is written dense). A file past 4 GiB (ZIP64) is refused: shard.
 * Atomic like accel_safetensors_save. Duplicate or non-UTF-8 names, meta
 * tensors -> error. accel_safetensors_open and the checkpoint loaders read
 * these files back. */
accel_status accel_torch_save(const char *path, int n, const char *const *names,
                              accel_tensor *const *tensors);

/* ------------------------------------------------------------ checkpoints */

/* A checkpoint: one safetensors (or torch.save .bin) file, or shards listed by
 * an index ({"metadata": {...}, "weight_map": {name: file}}). Opened from
 *   - a *.safetensors or PyTorch *.bin file,
 *   - a *.index.json file,
 *   - a directory, in transformers' order: model.safetensors, else exactly one
 *     *.index.json (or, of model.safetensors.index.json and
 *     pytorch_model.bin.index.json together, the first), else
 *     pytorch_model.bin (also preferred to pytorch_model.bin.index.json).
 * Shard names with '/', "..", or absolute paths are refused (naming the index
 * and the entry); missing shards are refused at open (naming the file). Shards
 * are mapped lazily on first lookup and may be released to bound memory. */
typedef struct accel_checkpoint accel_checkpoint;

accel_checkpoint *accel_checkpoint_open(const char *path);
void accel_checkpoint_close(accel_checkpoint *ck); /* NULL is a no-op */
/* Tensor names (index order / file order). */
int accel_checkpoint_count(const accel_checkpoint *ck);
const char *accel_checkpoint_name(const accel_checkpoint *ck, int i);
int accel_checkpoint_num_shards(const accel_checkpoint *ck);
const char *accel_checkpoint_shard_path(const accel_checkpoint *ck, int shard);
/* Shard index of a tensor name, -1 when absent (no error). */
int accel_checkpoint_shard_of(const accel_checkpoint *ck, const char *name);
/* The opened shard (mapped on first use). NULL + error. */
accel_safetensors *accel_checkpoint_shard(accel_checkpoint *ck, int shard);
/* Unmaps one shard (tensors borrowed from it must be freed first). */
void accel_checkpoint_release_shard(accel_checkpoint *ck, int shard);
/* Info for `name`, mapping its shard if needed; *shard_out (optional) gets the
 * shard. NULL + error naming the tensor (and shard, when the index lies). */
const accel_st_info *accel_checkpoint_find(accel_checkpoint *ck, const char *name,
                                           accel_safetensors **shard_out);
/* Like accel_safetensors_tensor / _load_into through the index. */
accel_tensor *accel_checkpoint_tensor(accel_checkpoint *ck, const char *name, int want);
accel_status accel_checkpoint_load_into(accel_checkpoint *ck, const char *name,
                                        accel_tensor *dst);
/* "total_size" of the index metadata (-1 when absent or not sharded). */
int64_t accel_checkpoint_total_size(const accel_checkpoint *ck);

/* The two weight formats of save_pretrained / save_model. */
typedef enum accel_weights_format {
    ACCEL_WEIGHTS_SAFETENSORS = 0, /* model.safetensors, model-0000i-of-0000K.safetensors */
    ACCEL_WEIGHTS_PYTORCH,         /* pytorch_model.bin, pytorch_model-0000i-of-0000K.bin (torch.save) */
} accel_weights_format;

/* Writes tensors into directory `dir` (created if missing) split with the Hub's
 * rule (huggingface_hub.split_torch_state_dict_into_shards): in order; a tensor
 * larger than max_shard_bytes gets its own shard; otherwise a new shard starts
 * when current + size > max. The same accel_tensor under several names goes to
 * its first name's shard and counts once. One shard -> "model.safetensors", no
 * index; K shards -> "model-0000i-of-0000K.safetensors" + "model.safetensors.index.json"
 * (2-space indent, sorted keys, trailing newline). The weights files of an
 * earlier save (either format) are gone afterwards; the rest of dir is kept.
 * Crash-safe: dir is written as a hidden sibling ".<name>.accel-staging"
 * and swapped in with one rename, so that killed or out of space at any
 * point it holds the previous save or the new one, never a mix of shards
 * (docs/io.md). Hence refused, before anything is written: dir being the
 * working directory or holding it (ACCEL_ERR_INVALID_ARG), or holding a mount
 * point (ACCEL_ERR_IO). A dir that is itself a mount point (a Docker volume's
 * root), which no rename replaces, is written in place instead, as
 * transformers writes it: each file whole, the index last, then the earlier
 * save's weights files removed; not crash-safe as a whole (a kill mid-save
 * can leave a mix of shards: docs/io.md says what it leaves). */
accel_status accel_save_sharded(const char *dir, int n, const char *const *names,
                                accel_tensor *const *tensors, int64_t max_shard_bytes);
/* The same in either format: ACCEL_WEIGHTS_PYTORCH writes "pytorch_model.bin" or
 * "pytorch_model-0000i-of-0000K.bin" + "pytorch_model.bin.index.json" (each
 * shard a torch.save file: accel_torch_save), crash-safe likewise. */
accel_status accel_save_sharded_as(const char *dir, int n, const char *const *names,
                                   accel_tensor *const *tensors, int64_t max_shard_bytes,
                                   accel_weights_format format);
/* Convenience: the module's state dict (tied aliases included, as named).
 * Refused (ACCEL_ERR_STATE, nothing written) where its tensors hold only
 * this process's part: an Accelerator holds the parameters of it (or of a
 * module above it) sharded across processes (FSDP FULL_SHARD / ZeRO-3), or
 * a module in it is a tensor-parallel slice; accel_accelerator_save_model
 * gathers them. */
accel_status accel_save_module(const char *dir, accel_module *root, int64_t max_shard_bytes);

/* ------------------------------------------------------------ HF config.json (Llama) */

/* Loads config.json (a file, or a directory containing one). Missing keys take
 * transformers' defaults of its model_type's family (XConfig(); "llama"
 * without one); num_key_value_heads defaults to num_attention_heads; head_dim
 * is kept 0 unless given. Wrong types -> ACCEL_ERR_FORMAT naming key and file;
 * what accel does not build -> ACCEL_ERR_UNSUPPORTED naming it (docs/nn.md). */
accel_status accel_llama_config_load(const char *path_or_dir, accel_llama_config *out);
/* transformers' AutoConfig.for_model(model_type): the family's defaults, as a
 * config.json holding only {"model_type": model_type} loads ("" as one without
 * it: Llama's), so that a model built from it has the biases the family's
 * default model has (attention_bias on for Qwen2-MoE and Starcoder2, whose
 * config keys it holds; Qwen2's, Phi's and GPT-2's biases come with the family
 * whatever the field says). A model_type accel does not build ->
 * ACCEL_ERR_UNSUPPORTED naming the ones it does; *out is written only on
 * success. */
accel_status accel_llama_config_for(const char *model_type, accel_llama_config *out);
/* dir/generation_config.json's bos_token_id, eos_token_id and pad_token_id
 * (each as config.json takes it) over c's, the keys it has: what
 * transformers' generate reads first. No such file: c unchanged, ACCEL_OK;
 * a bad value: ACCEL_ERR_FORMAT naming the file and the key. */
accel_status accel_generation_config_load(const char *dir, accel_llama_config *c);
/* Writes what transformers writes (architectures, model_type, hidden_act, ...)
 * to dir/config.json (or to the path if it ends in ".json"), 2-space indent.
 * What load would refuse is not written: rms_norm_eps and rope_theta must be
 * finite and > 0, initializer_range finite and >= 0 (ACCEL_ERR_INVALID_ARG
 * naming the key). Nor is a config accel_llama_config_check refuses (its
 * error and status, prefixed accel_llama_config_save): a field of another family
 * (GPT-2's unscaled_attention, scale_attn_by_inverse_layer_idx or
 * reorder_and_upcast_attn on a Llama, a bias the family has no key for)
 * would be missing from the file; nothing is written. */
accel_status accel_llama_config_save(const char *dir_or_path, const accel_llama_config *cfg);

#ifdef __cplusplus
}
#endif
#endif /* ACCEL_IO_H */
