/* src/io/io_internal.h — helpers shared by the io files (and by bigmodel's
 * offload code, which writes index.json files the same way).
 * Internal: prefix accel__, not installed. */
#ifndef ACCEL_IO_INTERNAL_H
#define ACCEL_IO_INTERNAL_H

#include <jansson.h>
#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "accel/core.h"
#include "accel/io.h"

#include "core/afile.h"
#include "core/staged_dir.h"

/* Hands t's bytes (row-major, dense) to sink in order: a contiguous CPU
 * tensor's straight from its memory, another device's through a host staging
 * buffer one chunk at a time, a strided one through a dense clone on its own
 * device. Nothing for an empty tensor. `op` names the caller in errors. */
typedef accel_status (*accel__byte_sink)(void *ctx, const void *p, size_t n);
accel_status accel__tensor_stream(const accel_tensor *t, accel__byte_sink sink, void *ctx, const char *op);

/* name is one of the files a sharded save of `format` writes or removes as
 * stale ("model.safetensors", its index, "model-00001-of-00003.safetensors";
 * the pytorch_model.bin family). */
bool accel__is_weights_file(accel_weights_format format, const char *name);
/* Whether a staged save of weights carries the entry name of the directory
 * it replaces over (core/staged_dir.h's carry): all but the weights files of
 * either format and a killed write's scratch file of one (a save rewrites
 * those of its format, and an older save's model.safetensors beside a new
 * pytorch_model.bin would be the one a load reads). */
bool accel__not_weights(const char *name, void *ctx);
/* A save of weights into dir (weights_save.c): accel_save_sharded's family
 * and save_pretrained (accel__save_staged), accel_accelerator_save_model.
 * Staged: written into dir's staged sibling and swapped in whole
 * (core/staged_dir.h: dir created when missing; the refusals of
 * accel__staged_begin; the lock on dir's parent), carrying over all but the
 * weights (accel__not_weights), so that a save killed or failing at any point
 * leaves dir as it was or as the save made it. In place, where the caller
 * allows it and dir is itself a mount point (a Docker volume's root: no
 * rename replaces it, and transformers' save_pretrained writes there): the
 * files are written into dir one by one, each whole (the atomic writer), the
 * index last, then the previous save's other weights files removed
 * (accel__write_sharded); the lock is taken, nothing else refused (a mount
 * inside dir is never touched). Not crash-safe as a whole: docs/io.md says
 * what a kill leaves. */
typedef struct accel__weights_save {
    char dir[PATH_MAX];     /* dir resolved (accel__staged_resolve): a link to it kept, the directory replaced */
    char to[PATH_MAX + 32]; /* where the files go: dir's staged sibling, or dir itself when in_place */
    bool in_place;
    accel__staging sg;
} accel__weights_save;
/* ws for dir, and with `stage` (the process that writes: a job's rank 0)
 * begun; without it only the names (the other ranks write into `to` too).
 * in_place_on_mount: a mount point is written in place instead of refused. */
accel_status accel__weights_begin(accel__weights_save *ws, const char *dir, bool stage, bool in_place_on_mount,
                                  const char *op);
/* The staged save swapped in (accel__staged_commit), or the in-place one's
 * directory fsynced and its lock released; on failure: abort. */
accel_status accel__weights_commit(accel__weights_save *ws, const char *op);
/* A failed save's staged directory removed, the lock released (an in-place
 * save's files stay as written). */
void accel__weights_abort(accel__weights_save *ws);
/* What write(ctx, to) writes (the weights, a config.json), as dir's whole
 * new content beside what accel__not_weights carries over, through
 * accel__weights_begin (in place on a mount point) and commit. op names the
 * caller in errors. */
typedef accel_status (*accel__dir_writer)(void *ctx, const char *dir);
accel_status accel__save_staged(const char *dir, const char *op, accel__dir_writer write, void *ctx);

/* config.json of m into dir with torch_dtype dt, by m's family f
 * (family_config.c): m is a root whose f->config_dtype said it has one. */
struct accel__family;
accel_status accel__family_config_save(const struct accel__family *f, const accel_module *m, const char *dir,
                                       accel_dtype dt);
/* path opened for reading (O_CLOEXEC; a FIFO does not block the open), with
 * its fstat in *sb: a regular file, else -1 and an error naming the path and
 * what it is instead of `what` ("a JSON file"). The caller closes the fd. */
int accel__open_regular(const char *path, const char *what, struct stat *sb);
/* The whole regular file at path (accel_malloc'd, its length in *len; `what`
 * names it in the error when path is something else), or NULL + ACCEL_ERR_IO /
 * ACCEL_ERR_OOM naming the path. */
char *accel__read_regular_file(const char *path, const char *what, size_t *len);
/* Reads and parses a JSON file. NULL + ACCEL_ERR_IO / ACCEL_ERR_FORMAT naming
 * the file, line and column. Caller json_decref()s. */
json_t *accel__json_load_file(const char *path);
/* The `.index.json` files of dir (a sharded checkpoint's index: the first one
 * listed, owned by the caller, NULL when none) and their number into *count;
 * NULL and -1, the error set, when dir cannot be listed. */
char *accel__checkpoint_find_index(const char *dir, int *count);
/* The file accel_checkpoint_open opens for folder dir, in transformers'
 * order (model.safetensors, one index or the Hub's safetensors/bin pair,
 * pytorch_model.bin), owned by the caller; NULL + error when none. */
char *accel__checkpoint_resolve(const char *dir);
/* Whether checkpoint tensor in has t's shape (its dims, in order). */
static inline bool accel__st_shape_is(const accel_st_info *in, const accel_tensor *t) {
    bool same = in->ndim == t->ndim;
    for (int i = 0; same && i < in->ndim; i++) same = in->shape[i] == t->shape[i];
    return same;
}

/* Whether checkpoint tensor name's bytes (in, as accel_checkpoint_find gave
 * them) are pages of its shard's file mapping, which may be released and
 * read again from the file; false for a copy the reader made (a torch
 * file's strided tensor). */
bool accel__checkpoint_in_file_map(accel_checkpoint *ck, const char *name, const accel_st_info *in);
/* JSON text from memory (duplicate keys refused); NULL + ACCEL_ERR_FORMAT naming
 * `name`, the line and column. Strings with \u0000 are refused: their readers
 * take json_string_value as a C string. */
json_t *accel__json_parse(const char *name, const char *text, size_t len);
/* The same with jansson's JSON_ALLOW_NUL: for a reader that takes each string with
 * its json_string_length (a NUL in an object key is still refused). */
json_t *accel__json_parse_nul(const char *name, const char *text, size_t len);
/* Writes json.dumps(j, indent=2, sort_keys=True) + "\n" atomically. */
accel_status accel__json_save_file(const char *path, const json_t *j);

/* config.json keys (hf_config.c): absent or null keeps *out; a wrong type or
 * range is ACCEL_ERR_FORMAT naming file and key. get_int: a positive (or,
 * with allow_zero, non-negative) integer; get_dtype: a float dtype name. */
accel_status accel__config_get_int(json_t *root, const char *file, const char *key, int64_t *out, bool allow_zero);
accel_status accel__config_get_real(json_t *root, const char *file, const char *key, double *out);
accel_status accel__config_get_bool(json_t *root, const char *file, const char *key, bool *out);
accel_status accel__config_get_dtype(json_t *root, const char *file, const char *key, accel_dtype *out);
/* A token id (bos_token_id, pad_token_id): a non-negative integer, or null
 * for none (*out -1); absent keeps *out. */
accel_status accel__config_get_token_id(json_t *root, const char *file, const char *key, int64_t *out);
/* The accel_bert_model_type whose name ("bert", "roberta", "xlm-roberta")
 * root's model_type is, or -1 when it is none of them (or not a string). */
int accel__bert_model_type_of(json_t *root);

/* "dir/name" in accel_malloc'd memory (dir "" -> name). */
char *accel__path_join(const char *dir, const char *name);
bool accel__is_dir(const char *path);
bool accel__is_file(const char *path);
/* Whether a and b both exist and are one file (device and inode: a link,
 * another spelling of the path). */
bool accel__same_file(const char *a, const char *b);
/* mkdir -p of one level (existing directory is fine). */
accel_status accel__mkdir(const char *path);

#endif
