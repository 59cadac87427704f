/* src/io/safetensors_internal.h — shared by the safetensors reader, the
 * checkpoint index and the fuzz target. Internal: prefix accel__. */
#ifndef ACCEL_SAFETENSORS_INTERNAL_H
#define ACCEL_SAFETENSORS_INTERNAL_H

#include "accel/io.h"

/* The Python library refuses headers over 100 MB; so do accel's reader and writer. */
#define ACCEL__ST_MAX_HEADER (100u * 1000u * 1000u)

/* "F32" -> ACCEL_F32; -1 when accel has no such dtype. */
int accel__st_dtype_parse(const char *s);
/* Validates `size` bytes at `buf` as a safetensors file named `path` (for
 * messages). The object borrows buf (not unmapped by close). NULL + error. */
accel_safetensors *accel__safetensors_parse(const char *path, void *buf, size_t size);
/* A torch.save zip file (torch >= 1.6) of `size` bytes at map, named `path`
 * in messages (torch_load.c): *info gets its n tensors in the dict's order,
 * names owned, bytes in the mapping (zero-copy) or, for a strided tensor, in
 * one of the n_copies owned buffers of *copies. begin/end are offsets in the
 * file. Named errors (ACCEL_ERR_FORMAT / ACCEL_ERR_UNSUPPORTED); what was
 * built so far is handed over even then, for the caller to free. */
accel_status accel__torch_read(const char *path, const unsigned char *map, size_t size, accel_st_info **info, int *n,
                               void ***copies, int *n_copies);
accel_tensor *accel__st_tensor(const accel_st_info *in, int want, const char *op);
/* Whether the n bytes at p lie in f's file mapping: pages that may leave the
 * process and come back from the file. False for a torch file's gathered
 * strided tensor (heap memory f owns) and a caller's buffer. */
bool accel__safetensors_in_file_map(const accel_safetensors *f, const void *p, size_t n);
accel_status accel__st_load_into(const accel_st_info *in, const char *file, accel_tensor *dst,
                                 const char *op);
/* Parses an index.json document (already loaded) for `index_path`: fills
 * names/shards. Used by accel_checkpoint_open and the fuzz target. */
typedef struct accel__st_index {
    int n_names;
    char **names;       /* weight_map keys, document order */
    int *shard_of;      /* names[i] -> shard index */
    int n_shards;
    char **shards;      /* unique shard file names, sorted */
    int64_t total_size; /* -1 when absent */
} accel__st_index;
accel_status accel__st_index_parse(const char *index_path, const char *text, size_t len,
                                   accel__st_index *out);
void accel__st_index_free(accel__st_index *ix);

/* Called before each tensor's bytes are written, e.g. to gather a sharded
 * parameter into it first (ZeRO-3's save_model); a failure aborts the file. */
typedef accel_status (*accel__tensor_ready_fn)(void *ctx, const accel_tensor *t);
/* accel_safetensors_save with `ready` (NULL: none) run
 * before each tensor is written; the files are the same. */
accel_status accel__safetensors_save_with(const char *path, int n, const char *const *names,
                                          accel_tensor *const *tensors, int n_meta, const accel_kv *meta,
                                          accel__tensor_ready_fn ready, void *ctx);
/* accel_save_sharded_as's files written into dir, with `ready` as above:
 * each file whole (the atomic writer), the index last, then every other
 * weights file of either format in dir removed (a previous save's: none in
 * a staged directory; on a mount point written in place, those of the save
 * it replaces). Callers stage dir (accel__weights_begin). */
accel_status accel__write_sharded(const char *dir, int n, const char *const *names, accel_tensor *const *tensors,
                                  int64_t max_shard_bytes, accel_weights_format format, accel__tensor_ready_fn ready,
                                  void *ctx);

#endif
