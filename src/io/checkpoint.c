/* src/io/checkpoint.c — checkpoints made of one file (safetensors, or
 * torch.save's pytorch_model.bin) or of shards listed by an index
 * (model.safetensors.index.json, pytorch_model.bin.index.json); opened lazily. */
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "accel/io.h"
#include "io/io_internal.h"
#include "io/safetensors_internal.h"

struct accel_checkpoint {
    char *dir;                    /* folder of the shards */
    accel__st_index ix;
    accel_safetensors **open;     /* [n_shards], lazily */
    int *by_name;                 /* indices into ix.names sorted by name */
};

/* ------------------------------------------------------------ index parsing */

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

void accel__st_index_free(accel__st_index *ix) {
    for (int i = 0; i < ix->n_names; i++) accel_free(ix->names[i]);
    for (int i = 0; i < ix->n_shards; i++) accel_free(ix->shards[i]);
    accel_free(ix->names);
    accel_free(ix->shard_of);
    accel_free(ix->shards);
    memset(ix, 0, sizeof *ix);
}

/* A shard must be a plain file name next to the index. */
static bool shard_name_ok(const char *f) {
    return f[0] && strcmp(f, ".") && strcmp(f, "..") && !strchr(f, '/') && !strchr(f, '\\');
}

static int find_sorted(char **arr, int n, const char *s) {
    char **hit = bsearch(&s, arr, (size_t)n, sizeof(char *), cmp_str);
    return hit ? (int)(hit - arr) : -1;
}

/* ix->shards[0, count) holds every entry's shard name, borrowed from the
 * JSON (n_shards is still 0): sorts them once (sorting after each new name
 * was quadratic: an index of 20,000 shards took minutes) and keeps owned
 * copies of the distinct ones, n_shards of them. */
static accel_status unique_shards(accel__st_index *ix, int count) {
    qsort(ix->shards, (size_t)count, sizeof(char *), cmp_str);
    int n = 0;
    for (int i = 0; i < count; i++)
        if (n == 0 || strcmp(ix->shards[i], ix->shards[n - 1])) ix->shards[n++] = ix->shards[i];
    for (int i = 0; i < n; i++) {
        if (!(ix->shards[i] = accel_strdup(ix->shards[i]))) return accel_last_status();
        ix->n_shards++;
    }
    return ACCEL_OK;
}

accel_status accel__st_index_parse(const char *index_path, const char *text, size_t len,
                                   accel__st_index *ix) {
    memset(ix, 0, sizeof *ix);
    ix->total_size = -1;
    json_t *root = accel__json_parse(index_path, text, len);
    if (!root) return accel_last_status();
    accel_status st = ACCEL_OK;
    json_t *wm = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    json_t *md = json_is_object(root) ? json_object_get(root, "metadata") : NULL;
    if (!json_is_object(root)) {
        st = accel_set_error(ACCEL_ERR_FORMAT, "%s: index must be a JSON object", index_path);
        goto done;
    }
    if (!wm) wm = root; /* accelerate: the whole dict when there is no weight_map */
    if (!json_is_object(wm)) {
        st = accel_set_error(ACCEL_ERR_FORMAT, "%s: 'weight_map' must be an object", index_path);
        goto done;
    }
    if (json_is_object(md)) {
        json_t *ts = json_object_get(md, "total_size");
        if (ts && (!json_is_integer(ts) || json_integer_value(ts) < 0)) {
            st = accel_set_error(ACCEL_ERR_FORMAT, "%s: metadata.total_size must be a non-negative integer",
                                 index_path);
            goto done;
        }
        if (ts) ix->total_size = json_integer_value(ts);
    }
    size_t n = json_object_size(wm);
    ix->names = accel_calloc(n + 1, sizeof(char *));
    ix->shard_of = accel_calloc(n + 1, sizeof(int));
    ix->shards = accel_calloc(n + 1, sizeof(char *));
    if (!ix->names || !ix->shard_of || !ix->shards) {
        st = accel_last_status();
        goto done;
    }
    const char *k;
    json_t *v;
    int borrowed = 0;
    json_object_foreach(wm, k, v) {
        if (wm == root && (strcmp(k, "metadata") == 0)) continue;
        if (!json_is_string(v)) {
            st = accel_set_error(ACCEL_ERR_FORMAT, "%s: weight_map entry '%s' must be a file name",
                                 index_path, k);
            goto done;
        }
        const char *f = json_string_value(v);
        if (!shard_name_ok(f)) {
            st = accel_set_error(ACCEL_ERR_FORMAT,
                                 "%s: weight_map entry '%s' names shard '%s': shard names must be plain "
                                 "file names in the index's folder (no '/', '..' or absolute paths)",
                                 index_path, k, f);
            goto done;
        }
        ix->shards[borrowed++] = (char *)f;
        ix->names[ix->n_names] = accel_strdup(k);
        if (!ix->names[ix->n_names]) {
            st = accel_last_status();
            goto done;
        }
        ix->n_names++;
    }
    if (unique_shards(ix, borrowed)) {
        st = accel_last_status();
        goto done;
    }
    /* shard_of after all shards are known (sorting moved them). */
    int i = 0;
    json_object_foreach(wm, k, v) {
        if (wm == root && strcmp(k, "metadata") == 0) continue;
        ix->shard_of[i++] = find_sorted(ix->shards, ix->n_shards, json_string_value(v));
    }
done:
    json_decref(root);
    if (st) accel__st_index_free(ix);
    return st;
}

/* ------------------------------------------------------------ opening */

/* qsort_r's comparison of two indices into the name array ctx. */
static int cmp_name_idx(const void *a, const void *b, void *ctx) {
    char *const *names = ctx;
    return strcmp(names[*(const int *)a], names[*(const int *)b]);
}

static bool ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

static char *dirname_of(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return accel_strdup(".");
    size_t n = slash == path ? 1 : (size_t)(slash - path);
    char *d = accel_malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, path, n);
    d[n] = 0;
    return d;
}

static const char *basename_of(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* The `.index.json` files of dir (io_internal.h). */
char *accel__checkpoint_find_index(const char *dir, int *count) {
    *count = 0;
    DIR *d = opendir(dir);
    if (!d) {
        *count = -1;
        accel_set_error(ACCEL_ERR_IO, "%s: cannot list directory", dir);
        return NULL;
    }
    char *found = NULL;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!ends_with(e->d_name, ".index.json")) continue;
        if ((*count)++ == 0) found = accel__path_join(dir, e->d_name);
    }
    closedir(d);
    return found;
}

/* Whether dir's two indexes are transformers' two names, the Hub's usual
 * pair (Llama 2's repositories hold both): the safetensors one is then the
 * index meant, as transformers takes it. */
static bool hub_pair(const char *dir, char **safetensors_index) {
    char *st = accel__path_join(dir, "model.safetensors.index.json");
    char *bin = accel__path_join(dir, "pytorch_model.bin.index.json");
    bool pair = st && bin && accel__is_file(st) && accel__is_file(bin);
    accel_free(bin);
    if (pair) *safetensors_index = st;
    else accel_free(st);
    return pair;
}

/* transformers' order: model.safetensors, then an index (exactly one
 * `*.index.json`, as Accelerate's load_checkpoint_in_model finds it, or
 * model.safetensors.index.json beside pytorch_model.bin.index.json), then
 * pytorch_model.bin — which transformers prefers to pytorch_model.bin.index.json
 * when both are there. */
char *accel__checkpoint_resolve(const char *dir) {
    char *single = accel__path_join(dir, "model.safetensors");
    if (!single || accel__is_file(single)) return single;
    accel_free(single);
    int count;
    char *found = accel__checkpoint_find_index(dir, &count), *pair;
    if (count < 0) return NULL;
    if (count == 2 && hub_pair(dir, &pair)) {
        accel_free(found);
        return pair;
    }
    if (count > 1) {
        accel_free(found);
        accel_set_error(ACCEL_ERR_INVALID_ARG,
                        "%s containing more than one `.index.json` file, delete the irrelevant ones.", dir);
        return NULL;
    }
    if (count == 1 && strcmp(basename_of(found), "pytorch_model.bin.index.json")) return found;
    char *bin = accel__path_join(dir, "pytorch_model.bin");
    if (bin && accel__is_file(bin)) {
        accel_free(found);
        return bin;
    }
    accel_free(bin);
    if (count == 0)
        accel_set_error(ACCEL_ERR_INVALID_ARG,
                        "%s is not a folder containing a `.index.json` file or a model.safetensors file", dir);
    return found;
}

static accel_checkpoint *ck_fail(accel_checkpoint *ck) {
    accel_checkpoint_close(ck);
    return NULL;
}

static accel_status open_index(accel_checkpoint *ck, const char *path) {
    json_t *j = accel__json_load_file(path); /* IO / JSON errors named by file */
    if (!j) return accel_last_status();
    char *text = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(j);
    if (!text) return accel_set_error(ACCEL_ERR_OOM, "%s: out of memory", path);
    accel_status st = accel__st_index_parse(path, text, strlen(text), &ck->ix);
    free(text);
    if (st) return st;
    for (int i = 0; i < ck->ix.n_shards; i++) {
        char *p = accel__path_join(ck->dir, ck->ix.shards[i]);
        if (!p) return accel_last_status();
        /* a name that is there but no regular file (a directory, a FIFO, a device) is not "missing", nor is
         * one stat cannot follow (a symbolic link loop, a folder it may not search): the error is said */
        struct stat sb;
        bool there = stat(p, &sb) == 0, ok = there && S_ISREG(sb.st_mode);
        if (!there && errno != ENOENT)
            accel_set_error(ACCEL_ERR_IO, "%s: shard '%s' cannot be read: %s (%s)", path, ck->ix.shards[i],
                            strerror(errno), p);
        else if (!ok)
            accel_set_error(ACCEL_ERR_IO, "%s: shard '%s' %s (%s)", path, ck->ix.shards[i],
                            !there ? "is missing" : S_ISDIR(sb.st_mode) ? "is a directory" : "is not a regular file", p);
        accel_free(p);
        if (!ok) return accel_last_status();
    }
    return ACCEL_OK;
}

static accel_status open_single(accel_checkpoint *ck, const char *path) {
    accel_safetensors *st = accel_safetensors_open(path);
    if (!st) return accel_last_status();
    int n = accel_safetensors_count(st);
    accel__st_index *ix = &ck->ix;
    ix->total_size = -1;
    ix->names = accel_calloc((size_t)n + 1, sizeof(char *));
    ix->shard_of = accel_calloc((size_t)n + 1, sizeof(int));
    ix->shards = accel_calloc(1, sizeof(char *));
    if (!ix->names || !ix->shard_of || !ix->shards) {
        accel_safetensors_close(st);
        return accel_last_status();
    }
    ix->shards[0] = accel_strdup(basename_of(path));
    ix->n_shards = ix->shards[0] ? 1 : 0;
    for (int i = 0; i < n; i++) {
        ix->names[i] = accel_strdup(accel_safetensors_at(st, i)->name);
        if (!ix->names[i]) break;
        ix->n_names++;
    }
    ck->open = accel_calloc(1, sizeof(accel_safetensors *));
    if (!ck->open || ix->n_names != n || ix->n_shards != 1) {
        accel_safetensors_close(st);
        return accel_last_status();
    }
    ck->open[0] = st;
    return ACCEL_OK;
}

accel_checkpoint *accel_checkpoint_open(const char *path) {
    if (!path) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_checkpoint_open: path is NULL");
        return NULL;
    }
    accel_checkpoint *ck = accel_calloc(1, sizeof *ck);
    if (!ck) return NULL;
    char *file = accel__is_dir(path) ? accel__checkpoint_resolve(path) : accel_strdup(path);
    if (!file) return ck_fail(ck);
    ck->dir = dirname_of(file);
    accel_status st = !ck->dir ? accel_last_status()
                      : ends_with(file, ".json") ? open_index(ck, file)
                                                 : open_single(ck, file);
    accel_free(file);
    if (st) return ck_fail(ck);
    if (!ck->open) ck->open = accel_calloc((size_t)ck->ix.n_shards + 1, sizeof(accel_safetensors *));
    ck->by_name = accel_malloc(sizeof(int) * ((size_t)ck->ix.n_names + 1));
    if (!ck->open || !ck->by_name) return ck_fail(ck);
    for (int i = 0; i < ck->ix.n_names; i++) ck->by_name[i] = i;
    qsort_r(ck->by_name, (size_t)ck->ix.n_names, sizeof(int), cmp_name_idx, ck->ix.names);
    return ck;
}

void accel_checkpoint_close(accel_checkpoint *ck) {
    if (!ck) return;
    for (int i = 0; ck->open && i < ck->ix.n_shards; i++) accel_safetensors_close(ck->open[i]);
    accel__st_index_free(&ck->ix);
    accel_free(ck->open);
    accel_free(ck->by_name);
    accel_free(ck->dir);
    accel_free(ck);
}

int accel_checkpoint_count(const accel_checkpoint *ck) { return ck ? ck->ix.n_names : 0; }
int accel_checkpoint_num_shards(const accel_checkpoint *ck) { return ck ? ck->ix.n_shards : 0; }
int64_t accel_checkpoint_total_size(const accel_checkpoint *ck) { return ck ? ck->ix.total_size : -1; }

const char *accel_checkpoint_name(const accel_checkpoint *ck, int i) {
    return ck && i >= 0 && i < ck->ix.n_names ? ck->ix.names[i] : NULL;
}

const char *accel_checkpoint_shard_path(const accel_checkpoint *ck, int shard) {
    return ck && shard >= 0 && shard < ck->ix.n_shards ? ck->ix.shards[shard] : NULL;
}

int accel_checkpoint_shard_of(const accel_checkpoint *ck, const char *name) {
    if (!ck || !name) return -1;
    int lo = 0, hi = ck->ix.n_names - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2, k = ck->by_name[mid];
        int r = strcmp(name, ck->ix.names[k]);
        if (r == 0) return ck->ix.shard_of[k];
        if (r < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    return -1;
}

bool accel__checkpoint_in_file_map(accel_checkpoint *ck, const char *name, const accel_st_info *in) {
    int s = accel_checkpoint_shard_of(ck, name);
    return s >= 0 && in && accel__safetensors_in_file_map(ck->open[s], in->bytes, in->nbytes);
}

accel_safetensors *accel_checkpoint_shard(accel_checkpoint *ck, int shard) {
    if (!ck || shard < 0 || shard >= ck->ix.n_shards) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_checkpoint_shard: shard %d out of range", shard);
        return NULL;
    }
    if (!ck->open[shard]) {
        char *p = accel__path_join(ck->dir, ck->ix.shards[shard]);
        if (!p) return NULL;
        ck->open[shard] = accel_safetensors_open(p);
        accel_free(p);
    }
    return ck->open[shard];
}

void accel_checkpoint_release_shard(accel_checkpoint *ck, int shard) {
    if (!ck || shard < 0 || shard >= ck->ix.n_shards) return;
    accel_safetensors_close(ck->open[shard]);
    ck->open[shard] = NULL;
}

const accel_st_info *accel_checkpoint_find(accel_checkpoint *ck, const char *name,
                                           accel_safetensors **shard_out) {
    if (!ck || !name) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_checkpoint_find: NULL argument");
        return NULL;
    }
    int s = accel_checkpoint_shard_of(ck, name);
    if (s < 0) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "checkpoint in %s has no tensor '%s'", ck->dir, name);
        return NULL;
    }
    accel_safetensors *st = accel_checkpoint_shard(ck, s);
    if (!st) return NULL;
    const accel_st_info *in = accel_safetensors_find(st, name);
    if (!in) {
        accel_set_error(ACCEL_ERR_FORMAT, "%s: the index places tensor '%s' in this shard but it is not there",
                        accel_safetensors_path(st), name);
        return NULL;
    }
    if (shard_out) *shard_out = st;
    return in;
}

accel_tensor *accel_checkpoint_tensor(accel_checkpoint *ck, const char *name, int want) {
    const accel_st_info *in = accel_checkpoint_find(ck, name, NULL);
    return in ? accel__st_tensor(in, want, "accel_checkpoint_tensor") : NULL;
}

accel_status accel_checkpoint_load_into(accel_checkpoint *ck, const char *name, accel_tensor *dst) {
    accel_safetensors *st = NULL;
    const accel_st_info *in = accel_checkpoint_find(ck, name, &st);
    if (!in) return accel_last_status();
    return accel__st_load_into(in, accel_safetensors_path(st), dst, "accel_checkpoint_load_into");
}
