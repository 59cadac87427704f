/* src/io/save_sharded.c — save_pretrained-style sharded checkpoints (safetensors or torch.save files),
 * crash-safe: the directory is written aside and swapped in whole (weights_save.c, core/staged_dir.h), so
 * that a save killed or failing at any point leaves the previous weights or the new ones, never a mix of
 * shards; on a mount point, which cannot be swapped, written in place (io_internal.h accel__weights_save). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "accel/io.h"
#include "accel/nn.h"
#include "core/afile.h"
#include "io/io_internal.h"
#include "io/safetensors_internal.h"
#include "nn/nn_internal.h"

/* File names of one weights format (transformers' SAFE_WEIGHTS_NAME and
 * WEIGHTS_NAME families). */
typedef struct weights_names {
    const char *single;  /* "model.safetensors" */
    const char *index;   /* "model.safetensors.index.json" */
    const char *stem;    /* shards: "<stem>-00001-of-00003<ext>" */
    const char *ext;
} weights_names;

static const weights_names NAMES[] = {
    [ACCEL_WEIGHTS_SAFETENSORS] = {"model.safetensors", "model.safetensors.index.json", "model", ".safetensors"},
    [ACCEL_WEIGHTS_PYTORCH] = {"pytorch_model.bin", "pytorch_model.bin.index.json", "pytorch_model", ".bin"},
};

/* "<stem>-00001-of-00003<ext>" (any 5-digit numbers): its two numbers. */
static bool is_shard_name(const weights_names *w, const char *f, int *a, int *b) {
    size_t stem = strlen(w->stem), ext = strlen(w->ext), len = strlen(f);
    if (len != stem + 15 + ext || strncmp(f, w->stem, stem) || strcmp(f + len - ext, w->ext)) return false;
    static const char *pat = "-#####-of-#####";
    for (size_t i = 0; pat[i]; i++) {
        char c = f[stem + i];
        if (pat[i] == '#' ? (c < '0' || c > '9') : c != pat[i]) return false;
    }
    *a = atoi(f + stem + 1);
    *b = atoi(f + stem + 10);
    return true;
}

bool accel__is_weights_file(accel_weights_format format, const char *name) {
    if (format != ACCEL_WEIGHTS_SAFETENSORS && format != ACCEL_WEIGHTS_PYTORCH) return false;
    const weights_names *w = &NAMES[format];
    int a, b;
    return !strcmp(name, w->single) || !strcmp(name, w->index) || is_shard_name(w, name, &a, &b);
}

/* Shard assignment (huggingface_hub.split_state_dict_into_shards_factory). */
static int split(int n, accel_tensor *const *t, int64_t max, int *shard_of, int64_t *total) {
    int n_closed = 0, cur = -1; /* cur: shard id of the open shard, -1 none */
    int64_t cur_size = 0;
    /* Shard ids are given in creation order; an oversized tensor's shard is
     * "appended before the open shard", so ids are renumbered by list order. */
    int *order = shard_of + n; /* scratch: list position of shard id */
    int next_id = 0;
    *total = 0;
    for (int i = 0; i < n; i++) {
        int first = -1;
        for (int j = 0; j < i && first < 0; j++)
            if (t[j] == t[i]) first = j;
        if (first >= 0) {
            shard_of[i] = shard_of[first];
            continue;
        }
        int64_t sz = (int64_t)accel_nbytes(t[i]);
        if (sz > max) {
            *total += sz;
            order[next_id] = n_closed++;
            shard_of[i] = next_id++;
            continue;
        }
        if (cur >= 0 && cur_size + sz > max) {
            order[cur] = n_closed++;
            cur = -1;
            cur_size = 0;
        }
        if (cur < 0) cur = next_id++;
        shard_of[i] = cur;
        cur_size += sz;
        *total += sz;
    }
    if (cur >= 0) order[cur] = n_closed++;
    for (int i = 0; i < n; i++) shard_of[i] = order[shard_of[i]];
    return n_closed;
}

/* Where the tensors come from: accel_save_sharded's callers may gather each first. */
typedef struct tensor_source {
    accel__tensor_ready_fn ready;
    void *ctx;
} tensor_source;

static accel_status write_shard(accel_weights_format format, const char *dir, const char *fname, int n,
                                const char *const *names, accel_tensor *const *tensors, const int *shard_of, int k,
                                const char **sub_names, accel_tensor **sub_t, tensor_source src) {
    int m = 0;
    for (int i = 0; i < n; i++)
        if (shard_of[i] == k) {
            sub_names[m] = names[i];
            sub_t[m++] = tensors[i];
        }
    char *p = accel__path_join(dir, fname);
    if (!p) return accel_last_status();
    /* PyTorch files are written from tensors at hand (src is for ZeRO-3's safetensors save_model) */
    accel_status st = format == ACCEL_WEIGHTS_PYTORCH
                          ? accel_torch_save(p, m, sub_names, sub_t)
                          : accel__safetensors_save_with(p, m, sub_names, sub_t, 0, NULL, src.ready, src.ctx);
    accel_free(p);
    return st;
}

/* After a save's own files (k shards of w's format, 1: the single file):
 * every other weights file of either format in dir removed, an older save's
 * (shards of another count, the single file a sharded save replaces, the
 * other format's files a load would read first). A staged directory holds
 * none (they are not carried over); written in place (a mount point), they
 * go only now, the new index written: until then the old index finds its
 * own shards. A file that stays is an error: a load could read it instead. */
static accel_status remove_stale(const char *dir, const weights_names *w, int k) {
    DIR *d = opendir(dir);
    if (!d) return accel_set_error(ACCEL_ERR_IO, "cannot list %s: %s", dir, strerror(errno));
    accel_status st = ACCEL_OK;
    for (struct dirent *e; !st && (e = readdir(d));) {
        int a, b;
        const char *f = e->d_name;
        bool ours = k <= 1 ? !strcmp(f, w->single)
                           : !strcmp(f, w->index) || (is_shard_name(w, f, &a, &b) && b == k && a >= 1 && a <= k);
        bool weights = accel__is_weights_file(ACCEL_WEIGHTS_SAFETENSORS, f) ||
                       accel__is_weights_file(ACCEL_WEIGHTS_PYTORCH, f); /* not a scratch file: the writer's */
        if (ours || !weights || unlinkat(dirfd(d), f, 0) == 0 || errno == ENOENT) continue;
        st = accel_set_error(ACCEL_ERR_IO, "cannot remove %s/%s, a previous save's weights file "
                             "(a load could read it instead of the new save's): %s", dir, f, strerror(errno));
    }
    closedir(d);
    return st;
}

accel_status accel__write_sharded(const char *dir, int n, const char *const *names, accel_tensor *const *tensors,
                                  int64_t max_shard_bytes, accel_weights_format format, accel__tensor_ready_fn ready,
                                  void *ctx) {
    const weights_names *w = &NAMES[format];
    tensor_source src = {ready, ctx};
    for (int i = 0; i < n; i++)
        if (!accel_tensor_check(tensors[i], "accel_save_sharded", names[i] ? names[i] : "tensor"))
            return accel_last_status();
    int *shard_of = accel_malloc(sizeof(int) * (2 * (size_t)n + 1));
    const char **sub_names = accel_malloc(sizeof(char *) * ((size_t)n + 1));
    accel_tensor **sub_t = accel_malloc(sizeof(accel_tensor *) * ((size_t)n + 1));
    accel_status st = ACCEL_OK;
    if (!shard_of || !sub_names || !sub_t) {
        st = ACCEL_ERR_OOM;
        goto out;
    }
    int64_t total;
    int k = split(n, tensors, max_shard_bytes, shard_of, &total);
    if (k <= 1) {
        for (int i = 0; i < n; i++) shard_of[i] = 0;
        st = write_shard(format, dir, w->single, n, names, tensors, shard_of, 0, sub_names, sub_t, src);
        if (!st) st = remove_stale(dir, w, k);
        goto out;
    }
    json_t *wm = json_object();
    for (int s = 0; s < k && !st; s++) {
        char fname[64];
        snprintf(fname, sizeof fname, "%s-%05d-of-%05d%s", w->stem, s + 1, k, w->ext);
        st = write_shard(format, dir, fname, n, names, tensors, shard_of, s, sub_names, sub_t, src);
        for (int i = 0; i < n && !st; i++)
            if (shard_of[i] == s) json_object_set_new(wm, names[i], json_string(fname));
    }
    if (!st) {
        json_t *root = json_object(), *md = json_object();
        json_object_set_new(md, "total_size", json_integer(total));
        json_object_set_new(root, "metadata", md);
        json_object_set(root, "weight_map", wm);
        char *ip = accel__path_join(dir, w->index);
        st = ip ? accel__json_save_file(ip, root) : accel_last_status();
        accel_free(ip);
        json_decref(root);
    }
    if (!st) st = remove_stale(dir, w, k);
    json_decref(wm);
out:
    accel_free(shard_of);
    accel_free(sub_names);
    accel_free(sub_t);
    return st;
}

bool accel__not_weights(const char *name, void *ctx) {
    (void)ctx;
    size_t n = strlen(name), t = strlen(ACCEL__AFILE_TMP_SUFFIX);
    char base[NAME_MAX + 1];
    if (n > t && n - t <= NAME_MAX && !strcmp(name + n - t, ACCEL__AFILE_TMP_SUFFIX)) { /* a killed write's scratch file */
        snprintf(base, sizeof base, "%.*s", (int)(n - t), name);
        name = base;
    }
    return !accel__is_weights_file(ACCEL_WEIGHTS_SAFETENSORS, name) &&
           !accel__is_weights_file(ACCEL_WEIGHTS_PYTORCH, name);
}

/* accel_save_sharded's arguments, for the staged writer. */
typedef struct sharded_args {
    int n;
    const char *const *names;
    accel_tensor *const *tensors;
    int64_t max;
    accel_weights_format format;
} sharded_args;

static accel_status write_args(void *ctx, const char *dir) {
    const sharded_args *a = ctx;
    return accel__write_sharded(dir, a->n, a->names, a->tensors, a->max, a->format, NULL, NULL);
}

static accel_status save_sharded(const char *dir, int n, const char *const *names, accel_tensor *const *tensors,
                                 int64_t max_shard_bytes, accel_weights_format format) {
    if (!dir || n < 0 || (n > 0 && (!names || !tensors)) || max_shard_bytes < 0 ||
        (format != ACCEL_WEIGHTS_SAFETENSORS && format != ACCEL_WEIGHTS_PYTORCH))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_save_sharded: bad arguments");
    for (int i = 0; i < n; i++) /* before the staging: a bad tensor touches nothing (accel__write_sharded checks again) */
        if (!accel_tensor_check(tensors[i], "accel_save_sharded", names[i] ? names[i] : "tensor"))
            return accel_last_status();
    sharded_args a = {n, names, tensors, max_shard_bytes, format};
    return accel__save_staged(dir, "accel_save_sharded", write_args, &a);
}

accel_status accel_save_sharded(const char *dir, int n, const char *const *names,
                                accel_tensor *const *tensors, int64_t max_shard_bytes) {
    return save_sharded(dir, n, names, tensors, max_shard_bytes, ACCEL_WEIGHTS_SAFETENSORS);
}

accel_status accel_save_sharded_as(const char *dir, int n, const char *const *names,
                                   accel_tensor *const *tensors, int64_t max_shard_bytes,
                                   accel_weights_format format) {
    return save_sharded(dir, n, names, tensors, max_shard_bytes, format);
}
accel_status accel_save_module(const char *dir, accel_module *root, int64_t max_shard_bytes) {
    if (!root || !dir) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_save_module: NULL argument");
    const char *away = accel__module_values_away(root); /* (ZeRO-3's pieces, tensor-parallel slices) */
    if (away) return accel_set_error(ACCEL_ERR_STATE, "accel_save_module: %s", away);
    accel_state_dict *sd = accel_module_state_dict(root);
    if (!sd) return accel_last_status();
    const char **names = accel_malloc(sizeof(char *) * ((size_t)sd->n + 1));
    accel_tensor **ts = accel_malloc(sizeof(accel_tensor *) * ((size_t)sd->n + 1));
    accel_status st = ACCEL_ERR_OOM;
    if (names && ts) {
        for (int i = 0; i < sd->n; i++) {
            names[i] = sd->entries[i].name;
            ts[i] = sd->entries[i].t;
        }
        st = accel_save_sharded(dir, sd->n, names, ts, max_shard_bytes);
    }
    accel_free(names);
    accel_free(ts);
    accel_state_dict_free(sd);
    return st;
}
