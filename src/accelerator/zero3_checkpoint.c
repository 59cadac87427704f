/* Checkpoints of ZeRO-3 (FSDP FULL_SHARD) models: docs/accelerator.md
 * "Checkpoints under ZeRO-3".
 *
 * SHARDED_STATE_DICT (the default): every rank writes its own pieces, with no
 * gather, into <checkpoint>/pytorch_model_fsdp_<i>/shard_<rank>.safetensors
 * (tensor "unit_<k>": this rank's flat range of unit k; under HYBRID_SHARD on
 * several machines, <rank> is the rank within the machine and only machine
 * 0's ranks write, as every machine holds the same shards) and
 * <checkpoint>/optimizer_<i>/shard_<rank>.safetensors ("unit_<k>.exp_avg",
 * ...); rank 0 adds sharded_index.json (which flat ranges of which unit each
 * file holds, and where every named parameter lies in its unit) and
 * replicated.safetensors (buffers and frozen parameters, which every rank
 * holds whole). Loading maps each parameter by name: a rank reads, from the
 * files that hold them, exactly the elements of its own pieces, so a
 * checkpoint loads onto any world size (and any wrap policy).
 *
 * FULL_STATE_DICT: model[_<i>].safetensors as DDP writes it, and save_model's
 * Hugging Face files: rank 0 writes the file tensor by tensor while the unit
 * holding the next tensor is gathered (rank 0 announces which unit, every rank
 * of its machine joins its all-gather), so at most one unit is ever whole;
 * save_model writes 16-bit weights under DeepSpeed's
 * stage3_gather_16bit_weights_on_model_save, one tensor rounded at a time.
 *
 * Under tensor parallelism the checkpoints are FULL_STATE_DICT of whole
 * tensors whatever the setting (loadable on any mesh): every rank gathers
 * all its units, tp.c joins the tp ranks' slices, rank 0 writes; loading
 * reads each rank's slices of them.
 *
 * The files go through checkpoint.c's crash-safe machinery (temporary
 * directory, completion marker listing them, one rename). */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "accel/io.h"
#include "accelerator_internal.h"
#include "zero3.h"
#include "strategy.h"
#include "core/afile.h" /* the writer's scratch file */
#include "core/core_internal.h"
#include "io/io_internal.h"
#include "io/safetensors_internal.h"

#define PATHN 4096
#define INDEX "sharded_index.json"
#define REPLICATED "replicated.safetensors"
#define MODEL_FORMAT "accel.sharded_state_dict"
#define OPTIM_FORMAT "accel.sharded_optimizer_state"
#define FN_SAVE "accel_accelerator_save_state"
#define FN_LOAD "accel_accelerator_load_state"

static void model_subdir(char *out, size_t n, const char *dir, int i) {
    snprintf(out, n, "%s/pytorch_model_fsdp_%d", dir, i);
}

static void optim_subdir(char *out, size_t n, const char *dir, int i) { snprintf(out, n, "%s/optimizer_%d", dir, i); }

static void shard_name(char *out, size_t n, int rank) { snprintf(out, n, "shard_%d.safetensors", rank); }

static int model_index(const accel_accelerator *acc, const accel__model *pm) { return (int)(pm - acc->models); }

static accel_flat_buffer *flat(accel__model *pm) { return &pm->fp->buffers[ACCEL_F32]; }

/* Under HYBRID_SHARD on several machines every machine holds the same shards:
 * machine 0's ranks (replica rank 0) write the sharded files and serve rank
 * 0's gathers; the other machines' ranks only join the collectives. */
static bool on_first_machine(const accel_accelerator *acc) {
    return !acc->replica_pg || accel_pg_rank(acc->replica_pg) == 0;
}

/* ---------------------------------------------------------------- the model's names */

/* The state-dict name of every sharded tensor (b->tensors order), borrowed
 * from sd, and whether each state-dict entry is sharded. */
typedef struct names {
    accel_state_dict *sd;
    const char **of_tensor; /* [b->n] */
    int *unit_of_entry;     /* [sd->n]: the unit of a sharded entry, -1 for the rest */
} names;

static void names_free(names *nm) {
    accel_state_dict_free(nm->sd);
    accel_free(nm->of_tensor);
    accel_free(nm->unit_of_entry);
    memset(nm, 0, sizeof *nm);
}

static accel_status names_of(accel__model *pm, names *nm) {
    accel__zero_model *zm = accel__zero_of(pm);
    accel_flat_buffer *b = flat(pm);
    memset(nm, 0, sizeof *nm);
    nm->sd = accel_module_state_dict(pm->m);
    if (!nm->sd) return accel_last_status();
    nm->of_tensor = accel_calloc((size_t)b->n + 1, sizeof *nm->of_tensor);
    nm->unit_of_entry = accel_calloc((size_t)nm->sd->n + 1, sizeof *nm->unit_of_entry);
    if (!nm->of_tensor || !nm->unit_of_entry) {
        names_free(nm);
        return accel_last_status();
    }
    for (int e = 0; e < nm->sd->n; e++) {
        const accel_state_entry *se = &nm->sd->entries[e];
        nm->unit_of_entry[e] = -1;
        for (int k = 0; k < zm->n_units && !se->is_tied_alias; k++)
            for (int j = 0; j < zm->units[k].count; j++)
                if (b->tensors[zm->units[k].first + j] == se->t) {
                    nm->of_tensor[zm->units[k].first + j] = se->name;
                    nm->unit_of_entry[e] = k;
                }
    }
    return ACCEL_OK;
}

/* The entry an alias repeats. */
static int aliased_entry(const accel_state_dict *sd, int e) {
    for (int a = 0; a < e; a++)
        if (sd->entries[a].t == sd->entries[e].t && !sd->entries[a].is_tied_alias) return a;
    return e;
}

/* ---------------------------------------------------------------- reading pieces */

/* Elements [e0, e1) of the parameter `name` (the model's tensor `like`) into dst. */
typedef accel_status (*read_fn)(void *src, const char *name, const accel_tensor *like, int64_t e0, int64_t e1,
                                float *dst);

/* This rank's pieces of every unit, zero padding included, read from src;
 * check: only what rd checks, dst [zn] never written (no pages). */
static accel_status fill_shard(accel_accelerator *acc, accel__model *pm, const names *nm, read_fn rd, void *src,
                               float *dst, bool check) {
    accel__zero_model *zm = accel__zero_of(pm);
    accel_flat_buffer *b = flat(pm);
    if (!check) memset(dst, 0, (size_t)zm->zn * sizeof(float));
    for (int k = 0; k < zm->n_units; k++) {
        const accel__unit *u = &zm->units[k];
        int64_t plo = u->lo + (int64_t)acc->shard_rank * u->shard, phi = plo + u->shard;
        for (int j = 0; j < u->count; j++) {
            int t = u->first + j;
            int64_t off = b->offsets[t], end = off + accel_numel(b->tensors[t]);
            int64_t a = off > plo ? off : plo, c = end < phi ? end : phi;
            if (a >= c) continue;
            accel_status st = rd(src, nm->of_tensor[t], b->tensors[t], a - off, c - off, dst + u->zoff + (a - plo));
            if (st) return st;
        }
    }
    return ACCEL_OK;
}

/* This rank's parameter shard [zn] as a header on its device (the host under offload_param). */
static accel_tensor *shard_tensor(accel_tensor *h, accel__model *pm) {
    accel__zero_model *zm = accel__zero_of(pm);
    accel__tensor_header(h, zm->zparams, ACCEL_F32, 1, &zm->zn, zm->zdev);
    return h;
}

/* fill_shard into a host copy of the parameter shard (*out: accel_malloc'd,
 * NULL on failure): the shard itself is written only once every rank has
 * read all of its pieces (load_shard). */
static accel_status read_shard(accel_accelerator *acc, accel__model *pm, const names *nm, read_fn rd, void *src,
                               float **out) {
    accel__zero_model *zm = accel__zero_of(pm);
    *out = accel_malloc((size_t)(zm->zn ? zm->zn : 1) * sizeof(float));
    accel_status st = *out ? fill_shard(acc, pm, nm, rd, src, *out, false) : accel_last_status();
    if (st) {
        accel_free(*out);
        *out = NULL;
    }
    return st;
}

/* The parameter shard from this rank's pieces of the checkpoint, agreed on
 * every rank before any shard is written (collective: every rank calls it,
 * `mine` the status of its steps before, src NULL after a failure there): a
 * checkpoint one rank cannot read (a tensor of another shape, one missing, a
 * short file) leaves every rank's weights as they were. Filled in place, a
 * host shard (a cpu model, offload_param) was zeroed and part-read on the
 * ranks whose pieces held the bad tensor, and loaded on the others. */
static accel_status load_shard(accel_accelerator *acc, accel__model *pm, const names *nm, read_fn rd, void *src,
                               accel_status mine) {
    float *fresh = NULL;
    if (!mine) mine = read_shard(acc, pm, nm, rd, src, &fresh);
    accel_status st = accel__ranks_agree(acc, mine, FN_LOAD);
    accel_tensor zt;
    shard_tensor(&zt, pm);
    if (!st) st = accel__tensor_write_bytes(&zt, 0, fresh, (size_t)accel_numel(&zt) * sizeof(float));
    accel_free(fresh);
    return st;
}

/* The units that stay gathered (the persistent one) hold the loaded values in
 * full; every other unit is released, so the next forward gathers the new shards. */
static accel_status refresh_gathered(accel_accelerator *acc, accel__model *pm, const names *nm, read_fn rd,
                                     void *src) {
    accel__zero_model *zm = accel__zero_of(pm);
    accel_flat_buffer *b = flat(pm);
    accel_status st = ACCEL_OK;
    for (int k = 0; k < zm->n_units && !st; k++) {
        accel__unit *u = &zm->units[k];
        if (!u->persistent) {
            st = accel__zero3_release_unit(acc, pm, k);
            continue;
        }
        for (int j = 0; j < u->count && !st; j++) {
            accel_tensor *t = b->tensors[u->first + j];
            int64_t n = accel_numel(t);
            float *buf = accel_malloc((size_t)(n ? n : 1) * sizeof(float));
            st = buf ? rd(src, nm->of_tensor[u->first + j], t, 0, n, buf) : accel_last_status();
            if (!st) st = accel__tensor_write_bytes(t, 0, buf, (size_t)n * sizeof(float));
            accel_free(buf);
        }
    }
    return st;
}

static bool same_shape(int nd, const int64_t *shape, const accel_tensor *t) {
    if (nd != t->ndim) return false;
    for (int d = 0; d < nd; d++)
        if (shape[d] != t->shape[d]) return false;
    return true;
}

static void shape_str(char *out, size_t n, int nd, const int64_t *shape) {
    size_t k = (size_t)snprintf(out, n, "[");
    for (int d = 0; d < nd && k < n; d++)
        k += (size_t)snprintf(out + k, n - k, d ? ", %lld" : "%lld", (long long)shape[d]);
    if (k < n) snprintf(out + k, n - k, "]");
}

/* who: the error's prefix (sharded_index). */
static accel_status shape_mismatch(const char *who, const char *where, const char *name, int nd, const int64_t *shape,
                                   const accel_tensor *like) {
    char a[128], b[128];
    shape_str(a, sizeof a, nd, shape);
    shape_str(b, sizeof b, like->ndim, like->shape);
    return accel_set_error(ACCEL_ERR_SHAPE, "%s%s: parameter %s has shape %s there, %s in this model (the "
                           "checkpoint is of another model)", who, where, name, a, b);
}

/* A FULL_STATE_DICT file (model.safetensors) as a source, with the model's
 * names: under tp the file holds whole tensors, of which a tp-sliced
 * parameter reads this rank's slice (tp.c cuts it as the plan does). */
typedef struct full_src {
    accel_safetensors *f;
    const names *nm;
} full_src;

static accel_status read_full(void *src, const char *name, const accel_tensor *like, int64_t e0, int64_t e1,
                              float *dst) {
    const full_src *fs = src;
    accel_safetensors *f = fs->f;
    const accel_st_info *in = accel_safetensors_find(f, name);
    if (!in)
        return accel_set_error(ACCEL_ERR_FORMAT, FN_LOAD ": %s has no tensor %s", accel_safetensors_path(f), name);
    const accel_state_dict *sd = fs->nm->sd;
    for (int e = 0; e < sd->n; e++) {
        if (sd->entries[e].t != like || sd->entries[e].is_tied_alias) continue;
        bool sliced;
        accel_tensor *cut = accel__tp_read_slice(f, &sd->entries[e], &sliced);
        if (!sliced) break;
        accel_status st = cut ? accel__tensor_read_bytes(cut, (size_t)e0 * sizeof(float), dst,
                                                         (size_t)(e1 - e0) * sizeof(float))
                              : accel_last_status();
        accel_tensor_free(cut);
        return st;
    }
    if (!same_shape(in->ndim, in->shape, like))
        return shape_mismatch(FN_LOAD ": ", accel_safetensors_path(f), name, in->ndim, in->shape, like);
    if (in->dtype != ACCEL_F32)
        return accel_set_error(ACCEL_ERR_DTYPE, FN_LOAD ": %s: %s is %s; ZeRO-3 loads f32 parameters",
                               accel_safetensors_path(f), name, accel_dtype_name(in->dtype));
    memcpy(dst, (const char *)in->bytes + e0 * (int64_t)sizeof(float), (size_t)(e1 - e0) * sizeof(float));
    return ACCEL_OK;
}

/* The non-sharded entries (buffers, frozen parameters) of the state dict from f. */
static accel_status load_replicated(accel_safetensors *f, const names *nm) {
    accel_status st = ACCEL_OK;
    for (int e = 0; e < nm->sd->n && !st; e++) {
        const accel_state_entry *se = &nm->sd->entries[e];
        if (se->is_tied_alias || nm->unit_of_entry[e] >= 0) continue;
        if (!accel_safetensors_find(f, se->name))
            return accel_set_error(ACCEL_ERR_FORMAT, FN_LOAD ": %s has no tensor %s", accel_safetensors_path(f),
                                   se->name);
        st = accel_safetensors_load_into(f, se->name, se->t);
    }
    return st;
}

/* ---------------------------------------------------------------- the sharded index */

typedef struct saved_param {
    const char *name;
    int unit;
    int64_t offset, numel;
    int ndim;
    int64_t shape[ACCEL_MAX_DIMS];
} saved_param;

typedef struct saved_range {
    int unit, file;
    int64_t lo, hi;
    const char *tensor;
} saved_range;

typedef struct sharded_index {
    char path[PATHN + 64];
    const char *who;        /* its errors' prefix: FN_LOAD ": ", or "" for accel merge-weights (which names itself) */
    json_t *root;           /* owns the strings below */
    int world, n_units;
    int n_params, n_ranges, n_files;
    saved_param *params;
    saved_range *ranges;
    const char **files;
    json_t *state_dict;     /* [{"name", "unit"|"replicated"|"alias_of"}] in state-dict order */
    json_t *by_name;        /* {name: index in params, or null for the other entries}: a lookup, not a scan */
} sharded_index;

static void index_free(sharded_index *ix) {
    json_decref(ix->root);
    json_decref(ix->by_name);
    accel_free(ix->params);
    accel_free(ix->ranges);
    accel_free(ix->files);
    memset(ix, 0, sizeof *ix);
}

static accel_status bad_index(const sharded_index *ix, const char *what) {
    return accel_set_error(ACCEL_ERR_FORMAT, "%s%s: %s", ix->who, ix->path, what);
}

static bool get_i64(json_t *o, const char *key, int64_t lo, int64_t hi, int64_t *out) {
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) return false;
    *out = json_integer_value(v);
    return true;
}

static accel_status parse_param(sharded_index *ix, json_t *e, saved_param *p) {
    json_t *shape = json_object_get(e, "shape");
    int64_t unit;
    p->name = json_string_value(json_object_get(e, "name"));
    if (!p->name || !get_i64(e, "unit", 0, ix->n_units - 1, &unit) ||
        !get_i64(e, "offset", 0, INT64_MAX / 2, &p->offset) ||
        !json_is_array(shape) || json_array_size(shape) > ACCEL_MAX_DIMS)
        return bad_index(ix, "a \"state_dict\" entry with a unit needs \"name\", \"unit\" (a unit of \"units\"), "
                             "\"offset\" and \"shape\"");
    p->unit = (int)unit;
    p->ndim = (int)json_array_size(shape);
    p->numel = 1;
    for (int d = 0; d < p->ndim; d++) {
        json_t *v = json_array_get(shape, (size_t)d);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > (1ll << 40))
            return bad_index(ix, "a \"shape\" holds something that is not a dimension");
        p->shape[d] = json_integer_value(v);
        /* dims of 2^40 each multiplied past int64 (signed overflow; [2^32, 2^32]
         * wrapped to 0 elements) */
        if (__builtin_mul_overflow(p->numel, p->shape[d], &p->numel) || p->numel > (1ll << 60))
            return bad_index(ix, "a \"shape\" has more than 2^60 elements");
    }
    return ACCEL_OK;
}

/* A flat span [lo, hi) of a unit: a file's range or a parameter's place (`of` its index). */
typedef struct span {
    int unit, of;
    int64_t lo, hi;
} span;

static int span_order(const void *x, const void *y) {
    const span *a = x, *b = y;
    if (a->unit != b->unit) return a->unit < b->unit ? -1 : 1;
    return a->lo < b->lo ? -1 : a->lo > b->lo;
}

/* Whether two of the n spans s (sorted here) share an element: their `of`s,
 * the one that starts first in *first. Empty spans share nothing. */
static bool spans_overlap(span *s, int n, int *first, int *second) {
    qsort(s, (size_t)n, sizeof *s, span_order);
    const span *prev = NULL; /* the unit's last non-empty span, the one ending last */
    for (int i = 0; i < n; i++) {
        if (s[i].lo == s[i].hi) continue;
        if (prev && prev->unit == s[i].unit && s[i].lo < prev->hi) {
            *first = prev->of;
            *second = s[i].of;
            return true;
        }
        prev = &s[i];
    }
    return false;
}

/* No two ranges of a unit share an element: read_sharded counts the elements
 * it copies, and an overlap would make up for a hole (elements never read,
 * left as they were: a merge would write uninitialised memory). */
static accel_status check_disjoint(const sharded_index *ix) {
    span *s = accel_malloc(((size_t)ix->n_ranges + 1) * sizeof *s);
    if (!s) return accel_last_status();
    for (int i = 0; i < ix->n_ranges; i++) s[i] = (span){ix->ranges[i].unit, i, ix->ranges[i].lo, ix->ranges[i].hi};
    int a, b;
    accel_status st = ACCEL_OK;
    if (spans_overlap(s, ix->n_ranges, &a, &b)) {
        const saved_range *p = &ix->ranges[a], *r = &ix->ranges[b];
        st = accel_set_error(ACCEL_ERR_FORMAT, "%s%s: unit %d's ranges [%lld, %lld) (%s) and [%lld, %lld) (%s) "
                             "overlap", ix->who, ix->path, r->unit, (long long)p->lo, (long long)p->hi,
                             ix->files[p->file], (long long)r->lo, (long long)r->hi, ix->files[r->file]);
    }
    accel_free(s);
    return st;
}

/* No two parameters of a unit share an element: each would be read as the
 * other's (a merge writing copies, a load the same values into both). */
static accel_status check_params_disjoint(const sharded_index *ix) {
    span *s = accel_malloc(((size_t)ix->n_params + 1) * sizeof *s);
    if (!s) return accel_last_status();
    for (int i = 0; i < ix->n_params; i++) {
        const saved_param *p = &ix->params[i];
        s[i] = (span){p->unit, i, p->offset, p->offset + p->numel};
    }
    int a, b;
    accel_status st = ACCEL_OK;
    if (spans_overlap(s, ix->n_params, &a, &b)) {
        const saved_param *p = &ix->params[a], *q = &ix->params[b];
        st = accel_set_error(ACCEL_ERR_FORMAT, "%s%s: parameters %s [%lld, %lld) and %s [%lld, %lld) of unit %d "
                             "overlap", ix->who, ix->path, p->name, (long long)p->offset,
                             (long long)(p->offset + p->numel), q->name, (long long)q->offset,
                             (long long)(q->offset + q->numel), p->unit);
    }
    accel_free(s);
    return st;
}

static accel_status parse_files(sharded_index *ix, json_t *files) {
    size_t n = 0;
    json_t *f;
    size_t i;
    json_array_foreach(files, i, f) n += json_array_size(json_object_get(f, "ranges"));
    ix->n_files = (int)json_array_size(files);
    ix->files = accel_calloc(json_array_size(files) + 1, sizeof *ix->files);
    ix->ranges = accel_calloc(n + 1, sizeof *ix->ranges);
    if (!ix->files || !ix->ranges) return accel_last_status();
    json_array_foreach(files, i, f) {
        ix->files[i] = json_string_value(json_object_get(f, "file"));
        json_t *ranges = json_object_get(f, "ranges"), *r;
        /* a name that is no file of the folder ("", ".", "..": --remove_checkpoint_dir
         * stopped there half done) or is the index itself */
        const char *fn = ix->files[i];
        if (!fn || !*fn || strchr(fn, '/') || !strcmp(fn, ".") || !strcmp(fn, "..") || !strcmp(fn, INDEX) ||
            !json_is_array(ranges))
            return bad_index(ix, "every \"files\" entry needs \"file\" (a plain file name, not the index's) and "
                                 "\"ranges\"");
        size_t j;
        json_array_foreach(ranges, j, r) {
            saved_range *sr = &ix->ranges[ix->n_ranges++];
            int64_t unit;
            sr->file = (int)i;
            sr->tensor = json_string_value(json_object_get(r, "tensor"));
            if (!sr->tensor || !get_i64(r, "unit", 0, ix->n_units - 1, &unit) ||
                !get_i64(r, "lo", 0, INT64_MAX / 2, &sr->lo) ||
                !get_i64(r, "hi", sr->lo, INT64_MAX / 2, &sr->hi))
                return bad_index(ix, "every range needs \"unit\", \"tensor\", \"lo\" and \"hi\" >= lo");
            sr->unit = (int)unit;
        }
    }
    return check_disjoint(ix);
}

/* who: FN_LOAD ": " or "" (sharded_index). */
static accel_status index_open(sharded_index *ix, const char *sub, const char *who) {
    memset(ix, 0, sizeof *ix);
    ix->who = who;
    snprintf(ix->path, sizeof ix->path, "%s/%s", sub, INDEX);
    ix->root = accel__json_load_file(ix->path); /* names the file */
    if (!ix->root) return accel_last_status();
    json_t *units = json_object_get(ix->root, "units"), *files = json_object_get(ix->root, "files");
    ix->state_dict = json_object_get(ix->root, "state_dict");
    const char *format = json_string_value(json_object_get(ix->root, "format"));
    int64_t world;
    if (!format || strcmp(format, MODEL_FORMAT))
        return bad_index(ix, "not an accel sharded model index (its \"format\" is not \"" MODEL_FORMAT "\")");
    if (!get_i64(ix->root, "num_processes", 1, 1 << 20, &world) || !json_is_array(units) || !json_is_array(files) ||
        !json_is_array(ix->state_dict))
        return bad_index(ix, "it needs \"num_processes\", \"units\", \"files\" and \"state_dict\"");
    ix->world = (int)world;
    ix->n_units = (int)json_array_size(units);
    ix->params = accel_calloc(json_array_size(ix->state_dict) + 1, sizeof *ix->params);
    if (!ix->params) return accel_last_status();
    if (!(ix->by_name = json_object())) return accel_set_error(ACCEL_ERR_OOM, "%sout of memory", ix->who);
    size_t i;
    json_t *e;
    json_array_foreach(ix->state_dict, i, e) {
        const char *name = json_string_value(json_object_get(e, "name"));
        if (!name) return bad_index(ix, "every \"state_dict\" entry needs a \"name\"");
        /* a name twice: a load read the first, a merge wrote both */
        if (json_object_get(ix->by_name, name))
            return accel_set_error(ACCEL_ERR_FORMAT, "%s%s: \"state_dict\" names %s twice", ix->who, ix->path, name);
        bool param = json_object_get(e, "unit") != NULL; /* else replicated, or an alias */
        accel_status st = param ? parse_param(ix, e, &ix->params[ix->n_params]) : ACCEL_OK;
        if (st) return st;
        if (json_object_set_new(ix->by_name, name, param ? json_integer(ix->n_params) : json_null()))
            return accel_set_error(ACCEL_ERR_OOM, "%sout of memory", ix->who);
        ix->n_params += param;
    }
    return check_params_disjoint(ix) ? accel_last_status() : parse_files(ix, files);
}

static const saved_param *find_param(const sharded_index *ix, const char *name) {
    json_t *i = json_object_get(ix->by_name, name);
    return json_is_integer(i) ? &ix->params[json_integer_value(i)] : NULL; /* null: a replicated entry, an alias */
}

/* The files of one sharded directory (the model's or an optimizer's), opened
 * when first needed: a rank opens only those holding its pieces. */
typedef struct shard_files {
    const sharded_index *ix;
    const char *dir;
    const char *suffix;     /* appended to a range's tensor name: "" or ".exp_avg", ... */
    accel_safetensors **open;
    bool check;             /* read_piece checks each range's tensor, copies nothing */
} shard_files;

static accel_status files_init(shard_files *fs, const sharded_index *ix, const char *dir, const char *suffix) {
    *fs = (shard_files){ix, dir, suffix, accel_calloc((size_t)ix->n_files + 1, sizeof *fs->open), false};
    return fs->open ? ACCEL_OK : accel_last_status();
}

static void files_close(shard_files *fs) {
    for (int i = 0; fs->open && i < fs->ix->n_files; i++) accel_safetensors_close(fs->open[i]);
    accel_free(fs->open);
    fs->open = NULL;
}

/* Range r's elements [a, c) (unit coordinates) into dst. */
static accel_status read_piece(shard_files *fs, const saved_range *r, int64_t a, int64_t c, float *dst) {
    if (!fs->open[r->file]) {
        char path[2 * PATHN];
        snprintf(path, sizeof path, "%s/%s", fs->dir, fs->ix->files[r->file]);
        if (!accel__is_file(path))
            return accel_set_error(ACCEL_ERR_IO, "%s%s is missing (it holds unit %d's range [%lld, %lld) of "
                                   "the sharded checkpoint)", fs->ix->who, path, r->unit, (long long)r->lo,
                                   (long long)r->hi);
        if (!(fs->open[r->file] = accel_safetensors_open(path))) return accel_last_status();
    }
    accel_safetensors *f = fs->open[r->file];
    /* the index's name whole: cut to a fixed buffer, a long one named another tensor of the file */
    size_t n = strlen(r->tensor) + strlen(fs->suffix) + 1;
    char *name = accel_malloc(n);
    if (!name) return accel_last_status();
    snprintf(name, n, "%s%s", r->tensor, fs->suffix);
    const accel_st_info *in = accel_safetensors_find(f, name);
    accel_status st = ACCEL_OK;
    if (!in || in->dtype != ACCEL_F32 || in->nbytes != (size_t)(r->hi - r->lo) * sizeof(float))
        st = accel_set_error(ACCEL_ERR_FORMAT, "%s%s: the index says it holds unit %d's range [%lld, %lld) as tensor "
                             "%s (f32, %lld elements); it does not", fs->ix->who, accel_safetensors_path(f), r->unit,
                             (long long)r->lo, (long long)r->hi, name, (long long)(r->hi - r->lo));
    else if (!fs->check)
        memcpy(dst, (const char *)in->bytes + (a - r->lo) * (int64_t)sizeof(float), (size_t)(c - a) * sizeof(float));
    accel_free(name);
    return st;
}

/* A SHARDED_STATE_DICT directory as a source: the parameter's elements from
 * whichever files hold them. */
static accel_status read_sharded(void *src, const char *name, const accel_tensor *like, int64_t e0, int64_t e1,
                                 float *dst) {
    shard_files *fs = src;
    const saved_param *p = find_param(fs->ix, name);
    if (!p)
        return accel_set_error(ACCEL_ERR_FORMAT, "%s%s has no parameter %s: the checkpoint does not cover "
                               "this model", fs->ix->who, fs->ix->path, name);
    if (like && !same_shape(p->ndim, p->shape, like))
        return shape_mismatch(fs->ix->who, fs->ix->path, name, p->ndim, p->shape, like);
    int64_t lo = p->offset + e0, hi = p->offset + e1, got = 0;
    for (int i = 0; i < fs->ix->n_ranges; i++) {
        const saved_range *r = &fs->ix->ranges[i];
        int64_t a = lo > r->lo ? lo : r->lo, c = hi < r->hi ? hi : r->hi;
        if (r->unit != p->unit || a >= c) continue;
        accel_status st = read_piece(fs, r, a, c, fs->check ? NULL : dst + (a - lo)); /* a check may pass no dst */
        if (st) return st;
        got += c - a;
    }
    if (got != hi - lo)
        return accel_set_error(ACCEL_ERR_FORMAT, "%s%s: unit %d's elements [%lld, %lld) (parameter %s) are "
                               "in none of its files: the index does not cover the model",
                               fs->ix->who, fs->ix->path, p->unit, (long long)lo, (long long)hi, name);
    return ACCEL_OK;
}

/* ---------------------------------------------------------------- writing shards */

/* Tensors "unit_<k><suffix>" viewing this rank's piece of every unit in src [zn]. */
static accel_status add_unit_views(const accel__model *pm, float *src, const char *suffix, int *n, char **names,
                                   accel_tensor **ts) {
    accel__zero_model *zm = accel__zero_of(pm);
    for (int k = 0; k < zm->n_units; k++) {
        char name[128];
        snprintf(name, sizeof name, "unit_%d%s", k, suffix);
        int64_t len = zm->units[k].shard;
        names[*n] = accel_strdup(name);
        ts[*n] = accel_tensor_wrap(src + zm->units[k].zoff, ACCEL_F32, 1, &len, ACCEL_CPU_DEVICE);
        if (!names[(*n)++] || !ts[*n - 1]) return accel_last_status();
    }
    return ACCEL_OK;
}

static void free_views(int n, char **names, accel_tensor **ts) {
    for (int i = 0; i < n; i++) {
        accel_free(names[i]);
        accel_tensor_free(ts[i]);
    }
    accel_free(names);
    accel_free(ts);
}

/* srcs[k] [zn] as "unit_<j>.<suffix k>" (suffixes NULL: one source, "unit_<j>") into dir/shard_<rank>. */
static accel_status write_rank_file(accel_accelerator *acc, accel__model *pm, const char *dir, int n_src,
                                    float *const *srcs, const char *const *suffixes) {
    accel__zero_model *zm = accel__zero_of(pm);
    int cap = zm->n_units * (n_src ? n_src : 1) + 1, n = 0;
    char **names = accel_calloc((size_t)cap, sizeof *names), file[64], path[2 * PATHN];
    accel_tensor **ts = accel_calloc((size_t)cap, sizeof *ts);
    accel_status st = names && ts ? ACCEL_OK : accel_last_status();
    for (int s = 0; s < n_src && !st; s++) {
        char suffix[64] = "";
        if (suffixes) snprintf(suffix, sizeof suffix, ".%s", suffixes[s]);
        st = add_unit_views(pm, srcs[s], suffix, &n, names, ts);
    }
    shard_name(file, sizeof file, acc->shard_rank);
    snprintf(path, sizeof path, "%s/%s", dir, file);
    if (!st) st = accel_safetensors_save(path, n, (const char *const *)names, ts, 0, NULL);
    free_views(n, names, ts);
    return st;
}

static json_t *shape_json(const accel_tensor *t) {
    json_t *a = json_array();
    for (int d = 0; a && d < t->ndim; d++) json_array_append_new(a, json_integer(t->shape[d]));
    return a;
}

/* Rank 0's index: the units, where each named parameter lies, what every rank's file holds. */
static json_t *model_index_json(accel_accelerator *acc, accel__model *pm, const names *nm) {
    accel__zero_model *zm = accel__zero_of(pm);
    accel_flat_buffer *b = flat(pm);
    json_t *root = json_object(), *sd = json_array(), *units = json_array(), *files = json_array();
    json_object_set_new(root, "format", json_string(MODEL_FORMAT));
    json_object_set_new(root, "version", json_integer(1));
    json_object_set_new(root, "num_processes", json_integer(acc->world));
    json_object_set_new(root, "shard_world_size", json_integer(acc->shard_world));
    json_object_set_new(root, "replicated", json_string(REPLICATED));
    for (int e = 0; e < nm->sd->n; e++) {
        const accel_state_entry *se = &nm->sd->entries[e];
        json_t *o = json_object();
        json_object_set_new(o, "name", json_string(se->name));
        int k = nm->unit_of_entry[e];
        if (se->is_tied_alias) {
            json_object_set_new(o, "alias_of", json_string(nm->sd->entries[aliased_entry(nm->sd, e)].name));
        } else if (k < 0) {
            json_object_set_new(o, "replicated", json_true());
        } else {
            int t = zm->units[k].first;
            while (b->tensors[t] != se->t) t++;
            json_object_set_new(o, "unit", json_integer(k));
            json_object_set_new(o, "offset", json_integer(b->offsets[t] - zm->units[k].lo));
            json_object_set_new(o, "shape", shape_json(se->t));
        }
        json_array_append_new(sd, o);
    }
    for (int k = 0; k < zm->n_units; k++) {
        json_t *u = json_object();
        json_object_set_new(u, "shard", json_integer(zm->units[k].shard));
        json_object_set_new(u, "numel", json_integer(zm->units[k].shard * acc->shard_world));
        json_array_append_new(units, u);
    }
    for (int r = 0; r < acc->shard_world; r++) {
        json_t *f = json_object(), *ranges = json_array();
        char file[64];
        shard_name(file, sizeof file, r);
        json_object_set_new(f, "file", json_string(file));
        json_object_set_new(f, "rank", json_integer(r));
        for (int k = 0; k < zm->n_units; k++) {
            const accel__unit *u = &zm->units[k];
            int64_t lo = (int64_t)r * u->shard, hi = lo + u->shard;
            json_t *rg = json_object(), *covers = json_array();
            char tensor[32];
            snprintf(tensor, sizeof tensor, "unit_%d", k);
            for (int j = 0; j < u->count; j++) {
                int64_t off = b->offsets[u->first + j] - u->lo, end = off + accel_numel(b->tensors[u->first + j]);
                if (off < hi && end > lo) json_array_append_new(covers, json_string(nm->of_tensor[u->first + j]));
            }
            json_object_set_new(rg, "unit", json_integer(k));
            json_object_set_new(rg, "tensor", json_string(tensor));
            json_object_set_new(rg, "lo", json_integer(lo));
            json_object_set_new(rg, "hi", json_integer(hi));
            json_object_set_new(rg, "params", covers);
            json_array_append_new(ranges, rg);
        }
        json_object_set_new(f, "ranges", ranges);
        json_array_append_new(files, f);
    }
    json_object_set_new(root, "state_dict", sd);
    json_object_set_new(root, "units", units);
    json_object_set_new(root, "files", files);
    return root;
}

static accel_status save_json(const char *dir, const char *name, json_t *j) {
    char path[2 * PATHN];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    accel_status st = j ? accel__json_save_file(path, j) : accel_set_error(ACCEL_ERR_OOM, FN_SAVE ": out of memory");
    json_decref(j);
    return st;
}

/* The non-sharded entries of the state dict (buffers, frozen parameters). */
static accel_status save_replicated(const char *dir, const names *nm) {
    int n = 0;
    const char **nms = accel_calloc((size_t)nm->sd->n + 1, sizeof *nms);
    accel_tensor **ts = accel_calloc((size_t)nm->sd->n + 1, sizeof *ts);
    accel_status st = nms && ts ? ACCEL_OK : accel_last_status();
    for (int e = 0; e < nm->sd->n && !st; e++)
        if (!nm->sd->entries[e].is_tied_alias && nm->unit_of_entry[e] < 0) {
            nms[n] = nm->sd->entries[e].name;
            ts[n++] = nm->sd->entries[e].t;
        }
    char path[2 * PATHN];
    snprintf(path, sizeof path, "%s/%s", dir, REPLICATED);
    if (!st) st = accel_safetensors_save(path, n, nms, ts, 0, NULL);
    accel_free(nms);
    accel_free(ts);
    return st;
}

static accel_status save_model_sharded(accel_accelerator *acc, accel__model *pm, const char *dir) {
    char sub[PATHN + 64];
    model_subdir(sub, sizeof sub, dir, model_index(acc, pm));
    accel_status st = accel__mkdir(sub);
    if (!st && on_first_machine(acc)) {
        accel_tensor zt;
        float *host = accel__stage_to_host(shard_tensor(&zt, pm), NULL, true);
        st = host ? accel__stage_end(&zt, host, write_rank_file(acc, pm, sub, 1, &host, NULL), false, true)
                  : accel_last_status();
    }
    if (st || acc->rank != 0) return st;
    names nm;
    if ((st = names_of(pm, &nm))) return st;
    st = save_replicated(sub, &nm);
    if (!st) st = save_json(sub, INDEX, model_index_json(acc, pm, &nm));
    names_free(&nm);
    return st;
}

/* ---------------------------------------------------------------- gathered writes (FULL_STATE_DICT, save_model) */

/* Rank 0 writes; before each tensor it announces the unit holding it and
 * every rank of its machine joins that unit's all-gather. -1 ends. */
typedef struct gathering {
    accel_accelerator *acc;
    accel__model *pm;
    int held;           /* the unit gathered for the writer, or -1 */
    bool held_was_released;
} gathering;

static int unit_of(accel__model *pm, const accel_tensor *t) {
    accel__zero_model *zm = accel__zero_of(pm);
    accel_flat_buffer *b = flat(pm);
    for (int k = 0; k < zm->n_units; k++)
        for (int j = 0; j < zm->units[k].count; j++)
            if (b->tensors[zm->units[k].first + j] == t) return k;
    return -1;
}

/* Holds unit u (-1: none), giving back the one held before unless it was
 * gathered anyway. Only rank 0's machine gathers: the others hold the same
 * shards and only follow the announcements. */
static accel_status hold(gathering *g, int u) {
    if (!on_first_machine(g->acc)) return ACCEL_OK;
    accel_status st = ACCEL_OK;
    if (g->held >= 0 && g->held != u && g->held_was_released) st = accel__zero3_release_unit(g->acc, g->pm, g->held);
    if (g->held != u) g->held = -1;
    if (u < 0 || g->held == u) return st;
    g->held_was_released = accel__zero_of(g->pm)->units[u].state == ACCEL__UNIT_RELEASED;
    accel_status st2 = accel__zero3_gather_unit(g->acc, g->pm, u);
    g->held = st2 ? -1 : u;
    return st ? st : st2;
}

static accel_status announce(gathering *g, int32_t u) {
    if (g->acc->world > 1) {
        accel_status st = accel_pg_broadcast(g->acc->pg, &u, 1, ACCEL_I32, 0);
        if (st) return st;
    }
    return hold(g, u);
}

static accel_status before_tensor(void *ctx, const accel_tensor *t) {
    gathering *g = ctx;
    int u = unit_of(g->pm, t);
    return u < 0 || u == g->held ? ACCEL_OK : announce(g, u);
}

/* Ranks but 0: join the gathers rank 0 announces until it announces -1. */
static accel_status follow(gathering *g) {
    accel_status first = ACCEL_OK;
    for (;;) {
        int32_t u = -1;
        accel_status st = accel_pg_broadcast(g->acc->pg, &u, 1, ACCEL_I32, 0);
        if (st) return st;
        st = hold(g, u);
        if (!first) first = st;
        if (u < 0) return first;
    }
}

/* Writes files on rank 0, calling before_tensor(g, t) before each tensor t
 * of the model is written. */
typedef accel_status (*writer_fn)(void *args, gathering *g);

/* Runs w on rank 0 (unless failed) with the gathers it needs; the other ranks serve them. */
static accel_status gathered_write(accel_accelerator *acc, accel__model *pm, bool failed, writer_fn w, void *args) {
    gathering g = {acc, pm, -1, false};
    if (acc->rank != 0) return follow(&g);
    accel_status st = failed ? ACCEL_OK : w(args, &g);
    accel_status end = announce(&g, -1);
    return st ? st : end;
}

/* Under tensor parallelism the files hold whole tensors, which tp.c gathers
 * from the tp ranks' slices, so each rank first needs its slices whole:
 * every unit is gathered (collective over the shard group, in unit order
 * on every rank, joined after a failure too), fn runs on every rank (write:
 * nothing failed; it joins the tp gathers either way), and the units that
 * were released go again. For the save a rank holds its tp part of the
 * whole model. */
typedef accel_status (*whole_fn)(accel_accelerator *acc, accel__model *pm, void *args, bool write);

static accel_status tp_whole_write(accel_accelerator *acc, accel__model *pm, bool failed, whole_fn fn, void *args) {
    accel__zero_model *zm = accel__zero_of(pm);
    bool *was_released = accel_calloc((size_t)zm->n_units + 1, sizeof *was_released);
    accel_status st = was_released ? ACCEL_OK : accel_last_status();
    for (int k = 0; k < zm->n_units; k++) {
        if (was_released) was_released[k] = zm->units[k].state == ACCEL__UNIT_RELEASED;
        accel_status s2 = accel__zero3_gather_unit(acc, pm, k);
        if (!st) st = s2;
    }
    accel_status s2 = fn(acc, pm, args, !failed && !st);
    if (!st) st = s2;
    for (int k = 0; k < zm->n_units; k++) { /* without the record every unit goes (the persistent one stays) */
        s2 = !was_released || was_released[k] ? accel__zero3_release_unit(acc, pm, k) : ACCEL_OK;
        if (!st) st = s2;
    }
    accel_free(was_released);
    return st;
}

static bool under_tp(const accel_accelerator *acc) { return acc->mesh.size[ACCEL__MESH_TP] > 1; }

/* The dtype save_model writes the f32 tensors in. With
 * stage3_gather_16bit_weights_on_model_save, DeepSpeed's consolidated 16-bit
 * state dict: the engine module's dtype (bf16 or fp16 under that mixed
 * precision, f32 without). Without it Accelerate refuses to save; accel
 * writes the f32 masters. */
accel_dtype accel__zero3_saved_dtype(const accel_accelerator *acc) {
    if (!acc->fsdp.save_16bit) return ACCEL_F32;
    return acc->mp == ACCEL_MP_BF16 ? ACCEL_BF16 : acc->mp == ACCEL_MP_FP16 ? ACCEL_F16 : ACCEL_F32;
}

/* save_model's tensors as the writer sees them: the state dict's own, or in
 * a 16-bit save, stand-ins of their shapes in that dtype over one scratch
 * buffer (the largest tensor's size), each filled from its gathered tensor
 * just before it is written: one tensor is converted at a time. */
typedef struct model_files {
    accel_state_dict *sd;
    const char **names;     /* [sd->n], borrowed from sd */
    accel_tensor **written; /* [sd->n]: sd's tensor or a stand-in (owned by the entry that is no alias) */
    void *scratch;          /* the stand-ins' memory */
    int next;               /* where the search for the tensor being written starts */
    gathering *g;
} model_files;

static bool converted(const accel_tensor *t, accel_dtype dt) { return dt != ACCEL_F32 && t->dtype == ACCEL_F32; }

/* The entry whose tensor entry e shares: an earlier one for a tied alias, else e. */
static int original_of(const accel_state_dict *sd, int e) {
    return sd->entries[e].is_tied_alias ? aliased_entry(sd, e) : e;
}

static void model_files_free(model_files *mf) {
    for (int e = 0; mf->sd && mf->written && e < mf->sd->n; e++)
        if (original_of(mf->sd, e) == e && mf->written[e] != mf->sd->entries[e].t) accel_tensor_free(mf->written[e]);
    accel_free(mf->written);
    accel_free(mf->names);
    accel_free(mf->scratch);
    accel_state_dict_free(mf->sd);
}

static accel_status model_files_of(accel__model *pm, accel_dtype dt, gathering *g, model_files *mf) {
    *mf = (model_files){.sd = accel_module_state_dict(pm->m), .g = g};
    if (!mf->sd) return accel_last_status();
    int n = mf->sd->n;
    int64_t most = 1;
    for (int e = 0; e < n; e++)
        if (converted(mf->sd->entries[e].t, dt) && accel_numel(mf->sd->entries[e].t) > most)
            most = accel_numel(mf->sd->entries[e].t);
    mf->names = accel_calloc((size_t)n + 1, sizeof *mf->names);
    mf->written = accel_calloc((size_t)n + 1, sizeof *mf->written);
    mf->scratch = accel_malloc((size_t)most * accel_dtype_size(dt));
    if (!mf->names || !mf->written || !mf->scratch) return accel_last_status();
    for (int e = 0; e < n; e++) {
        accel_tensor *t = mf->sd->entries[e].t;
        int o = original_of(mf->sd, e);
        mf->names[e] = mf->sd->entries[e].name;
        if (o < e) mf->written[e] = mf->written[o];
        else if (converted(t, dt)) mf->written[e] = accel_tensor_wrap(mf->scratch, dt, t->ndim, t->shape, ACCEL_CPU_DEVICE);
        else mf->written[e] = t;
        if (!mf->written[e]) return accel_last_status();
    }
    return ACCEL_OK;
}

/* The writer's ready hook: the tensor written is entry e's; its unit is
 * gathered, and a stand-in gets its values rounded (to nearest even). */
static accel_status before_model_tensor(void *ctx, const accel_tensor *t) {
    model_files *mf = ctx;
    int n = mf->sd->n, e = mf->next;
    for (int k = 0; k < n && mf->written[e] != t; k++) e = (e + 1) % n;
    mf->next = e;
    accel_tensor *own = mf->sd->entries[e].t;
    accel_status st = before_tensor(mf->g, own);
    return st || mf->written[e] == own ? st : accel_copy_(mf->written[e], own);
}

typedef struct module_args {
    const char *dir;
    accel__model *pm;
    int64_t max;
    accel_dtype dtype;
} module_args;

static accel_status write_module(void *a, gathering *g) {
    module_args *ma = a;
    model_files mf;
    accel_status st = model_files_of(ma->pm, ma->dtype, g, &mf);
    if (!st) st = accel__write_sharded(ma->dir, mf.sd->n, mf.names, mf.written, ma->max, ACCEL_WEIGHTS_SAFETENSORS,
                                           before_model_tensor, &mf);
    model_files_free(&mf);
    return st;
}

/* Under tp: save.c's writer over the whole tensors (rank 0 writes). */
static accel_status write_whole_module(accel_accelerator *acc, accel__model *pm, void *a, bool write) {
    module_args *ma = a;
    return accel__write_model(acc, pm->m, ma->dir, ma->max, ACCEL_WEIGHTS_SAFETENSORS, write && acc->rank == 0);
}

accel_status accel__zero3_save_model(accel_accelerator *acc, accel__model *pm, const char *dir,
                                     int64_t max_shard_bytes, bool failed) {
    module_args a = {dir, pm, max_shard_bytes, accel__zero3_saved_dtype(acc)};
    if (!under_tp(acc)) return gathered_write(acc, pm, failed, write_module, &a);
    if (a.dtype != ACCEL_F32) /* the same on every rank: none joins a gather */
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "accel_accelerator_save_model: "
                               "stage3_gather_16bit_weights_on_model_save under tensor parallelism: the 16-bit "
                               "save is not built there (the f32 weights are written without it)");
    return tp_whole_write(acc, pm, failed, write_whole_module, &a);
}

typedef struct file_args {
    const char *path;
    accel_module *m;
} file_args;

/* model.safetensors as save_state writes it for DDP: tied aliases once. */
static accel_status write_state_file(void *a, gathering *g) {
    file_args *fa = a;
    accel_state_dict *sd = accel_module_state_dict(fa->m);
    if (!sd) return accel_last_status();
    const char **nms = accel_calloc((size_t)sd->n + 1, sizeof *nms);
    accel_tensor **ts = accel_calloc((size_t)sd->n + 1, sizeof *ts);
    accel_status st = nms && ts ? ACCEL_OK : accel_last_status();
    int k = 0;
    for (int i = 0; i < sd->n && !st; i++)
        if (!sd->entries[i].is_tied_alias) {
            nms[k] = sd->entries[i].name;
            ts[k++] = sd->entries[i].t;
        }
    if (!st) st = accel__safetensors_save_with(fa->path, k, nms, ts, 0, NULL, before_tensor, g);
    accel_free(nms);
    accel_free(ts);
    accel_state_dict_free(sd);
    return st;
}

static void full_file(char *out, size_t n, const char *dir, int i) {
    if (i == 0) snprintf(out, n, "%s/model.safetensors", dir);
    else snprintf(out, n, "%s/model_%d.safetensors", dir, i);
}

/* Under tp: checkpoint.c's model file over the whole tensors (rank 0 writes). */
static accel_status write_whole_file(accel_accelerator *acc, accel__model *pm, void *path, bool write) {
    return accel__save_model_file(acc, path, pm->m, write);
}

accel_status accel__zero3_save_model_state(accel_accelerator *acc, int i, const char *dir, bool failed) {
    accel__model *pm = &acc->models[i];
    if (!acc->fsdp.full_state_dict && !under_tp(acc)) return failed ? ACCEL_OK : save_model_sharded(acc, pm, dir);
    char path[PATHN + 64];
    full_file(path, sizeof path, dir, i);
    if (under_tp(acc)) return tp_whole_write(acc, pm, failed, write_whole_file, path);
    file_args a = {path, pm->m};
    return gathered_write(acc, pm, failed, write_state_file, &a);
}

/* ---------------------------------------------------------------- optimizer */

/* "step", "param_groups.*": the optimizer's scalar entries as a JSON object;
 * not the groups' parameter counts (the shard's optimizer counts its runs):
 * "groups" names each group's parameters (groups_json). */
static json_t *scalars_json(accel_optimizer *opt) {
    accel_named_state *st = NULL;
    int n = accel_optimizer_state(opt, &st);
    if (n < 0) return NULL;
    json_t *o = json_object();
    for (int e = 0; e < n && o; e++)
        if (!st[e].t && strncmp(st[e].name, "state.", 6) && !accel__group_size_entry(st[e].name, NULL))
            json_object_set_new(o, st[e].name, json_real(st[e].value));
    accel_named_state_free(st, n);
    return o;
}

/* The model's name of its flattened parameter p, or NULL. By identity: a
 * zero-size parameter shares its offset with the next. */
static const char *name_of(accel__model *pm, const names *nm, const accel_tensor *p) {
    accel_flat_buffer *b = flat(pm);
    for (int t = 0; t < b->n; t++)
        if (b->tensors[t] == p) return nm->of_tensor[t];
    return NULL;
}

/* Optimizer i's param groups as the names of their parameters: [[name,
 * ...], ...] (NULL, error set in fn's name, when a parameter has no name).
 * The state is kept by the model's layout, not by group, so the index says
 * which group each parameter was in: a load into another grouping is
 * refused. */
static json_t *groups_json(accel_accelerator *acc, int i, const char *fn) {
    accel__model *pm = accel__zero_optimizer_model(acc, i);
    names nm;
    if (names_of(pm, &nm)) return NULL;
    const int *grp;
    int n = accel__zero_segments(acc, i, &grp), ng = accel_optimizer_num_groups(acc->opts[i]);
    json_t *gs = json_array();
    accel_status st = gs ? ACCEL_OK : accel_set_error(ACCEL_ERR_OOM, "%s: out of memory", fn);
    for (int g = 0; g < ng && !st; g++) {
        json_t *list = json_array();
        for (int u = 0; u < n && list && !st; u++) {
            if (grp[u] != g) continue;
            const char *name = name_of(pm, &nm, accel__zero_user_param(acc, i, u));
            if (!name)
                st = accel_set_error(ACCEL_ERR_STATE, "%s: optimizer %d: its parameter %d (group %d) is no "
                                     "parameter of its model", fn, i, u, g);
            else if (json_array_append_new(list, json_string(name)))
                st = accel_set_error(ACCEL_ERR_OOM, "%s: out of memory", fn);
        }
        if (!st && (!list || json_array_append_new(gs, list))) /* appending steals list, also on failure */
            st = accel_set_error(ACCEL_ERR_OOM, "%s: out of memory", fn);
        else if (st)
            json_decref(list);
    }
    names_free(&nm);
    if (st) {
        json_decref(gs);
        return NULL;
    }
    return gs;
}

static json_t *optim_index_json(accel_accelerator *acc, int i, int64_t step) {
    json_t *root = json_object(), *kinds = json_array();
    char model[64];
    snprintf(model, sizeof model, "pytorch_model_fsdp_%d", model_index(acc, accel__zero_optimizer_model(acc, i)));
    for (int k = 0; k < accel__zero_kinds(acc, i); k++) json_array_append_new(kinds, json_string(accel__zero_kind_name(acc, i, k)));
    json_object_set_new(root, "format", json_string(OPTIM_FORMAT));
    json_object_set_new(root, "version", json_integer(1));
    json_object_set_new(root, "num_processes", json_integer(acc->world));
    json_object_set_new(root, "shard_world_size", json_integer(acc->shard_world));
    json_object_set_new(root, "model", json_string(model));
    json_object_set_new(root, "step", json_integer(step));
    json_object_set_new(root, "kinds", kinds);
    json_object_set_new(root, "scalars", scalars_json(acc->opts[i]));
    json_t *groups = groups_json(acc, i, FN_SAVE); /* NULL: its error set */
    if (!groups) {
        json_decref(root);
        return NULL;
    }
    if (json_object_set_new(root, "groups", groups)) { /* takes groups, also when it fails (root NULL too) */
        json_decref(root);
        accel_set_error(ACCEL_ERR_OOM, FN_SAVE ": out of memory");
        return NULL;
    }
    return root;
}

accel_status accel__zero3_save_optimizer_state(accel_accelerator *acc, int i, const char *dir, bool failed) {
    float *local[2] = {NULL, NULL};
    int64_t step = 0;
    accel_status st = failed ? ACCEL_OK : accel__zero_local_state(acc, i, local, &step);
    if (acc->world > 1) { /* every rank joins, even after a failure */
        accel_status s2 = accel_pg_all_reduce(acc->pg, &step, 1, ACCEL_I64, ACCEL_REDUCE_MAX);
        if (!st) st = s2;
    }
    char sub[PATHN + 64];
    optim_subdir(sub, sizeof sub, dir, i);
    const char *kinds[2] = {NULL, NULL};
    int nk = accel__zero_kinds(acc, i);
    for (int k = 0; k < nk; k++) kinds[k] = accel__zero_kind_name(acc, i, k);
    if (!st && !failed) st = accel__mkdir(sub);
    if (!st && !failed && on_first_machine(acc))
        st = write_rank_file(acc, accel__zero_optimizer_model(acc, i), sub, nk, local, kinds);
    if (!st && !failed && acc->rank == 0) {
        json_t *index = optim_index_json(acc, i, step); /* NULL: its error set (no name, no memory) */
        st = index ? save_json(sub, INDEX, index) : accel_last_status();
    }
    accel_free(local[0]);
    accel_free(local[1]);
    return st;
}

/* ---------------------------------------------------------------- load */

/* An entry the index lists that the model lacks (a larger model's: a layer
 * more) refused by name, as accel__refuse_unexpected refuses a tensor of a
 * FULL file; searched only when the index lists more entries than sd has
 * (aliases included in both). */
static accel_status refuse_unexpected_entries(const sharded_index *ix, const accel_state_dict *sd) {
    if (json_array_size(ix->state_dict) <= (size_t)sd->n) return ACCEL_OK;
    accel_status st = ACCEL_OK;
    size_t k;
    json_t *e;
    json_array_foreach(ix->state_dict, k, e) {
        const char *name = json_string_value(json_object_get(e, "name"));
        if (!st && name) st = accel__refuse_unexpected_name(sd, ix->path, "lists", name);
    }
    return st;
}

accel_status accel__zero3_load_model_state(accel_accelerator *acc, int i, const char *dir) {
    accel__model *pm = &acc->models[i];
    char sub[PATHN + 64], path[2 * PATHN];
    model_subdir(sub, sizeof sub, dir, i);
    names nm;
    accel_status st = names_of(pm, &nm);
    if (st) return load_shard(acc, pm, &nm, NULL, NULL, st); /* joins the agreement, reads nothing */
    if (accel__is_dir(sub)) {
        sharded_index ix;
        shard_files fs = {0};
        st = index_open(&ix, sub, FN_LOAD ": ");
        if (!st) st = refuse_unexpected_entries(&ix, nm.sd);
        if (!st) st = files_init(&fs, &ix, sub, "");
        st = load_shard(acc, pm, &nm, read_sharded, &fs, st);
        if (!st) st = refresh_gathered(acc, pm, &nm, read_sharded, &fs);
        snprintf(path, sizeof path, "%s/%s", sub, REPLICATED);
        accel_safetensors *rf = st ? NULL : accel_safetensors_open(path);
        if (!st && !rf) st = accel_last_status();
        if (!st) st = load_replicated(rf, &nm);
        accel_safetensors_close(rf);
        files_close(&fs);
        index_free(&ix);
    } else {
        full_file(path, sizeof path, dir, i);
        accel_safetensors *f = accel_safetensors_open(path);
        full_src fs = {f, &nm};
        st = load_shard(acc, pm, &nm, read_full, &fs, f ? accel__refuse_unexpected(f, path, nm.sd) : accel_last_status());
        if (!st) st = refresh_gathered(acc, pm, &nm, read_full, &fs);
        if (!st) st = load_replicated(f, &nm);
        accel_safetensors_close(f);
    }
    names_free(&nm);
    return st;
}

accel_status accel__zero3_refuse_sharded(const char *dir, int i) {
    char sub[PATHN + 64];
    model_subdir(sub, sizeof sub, dir, i);
    if (!accel__is_dir(sub)) return ACCEL_OK;
    return accel_set_error(ACCEL_ERR_FORMAT, FN_LOAD ": %s holds model %d as a SHARDED_STATE_DICT (%s, from ZeRO-3 "
                           "/ FULL_SHARD): load it with ZeRO stage 3, or merge it into a model with `accel "
                           "merge-weights %s OUTPUT`", dir, i, sub, dir);
}

typedef struct optim_index {
    json_t *root;
    const char *model;
    int64_t step;
    json_t *kinds, *scalars;
} optim_index;

/* The number of param groups the scalars "param_groups.<g>.*" name. */
static int scalar_groups(json_t *scalars) {
    const char *key;
    json_t *v;
    int n = 0;
    json_object_foreach(scalars, key, v) {
        static const char PREFIX[] = "param_groups.";
        if (strncmp(key, PREFIX, sizeof PREFIX - 1)) continue;
        const char *p = key + sizeof PREFIX - 1;
        char *end;
        if (*p < '0' || *p > '9') continue;
        long g = strtol(p, &end, 10);
        if (*end != '.') continue;
        if (g >= INT_MAX) return INT_MAX; /* no optimizer has that many */
        if (g >= n) n = (int)g + 1;
    }
    return n;
}

/* The first name of the string array a that b lacks (a non-string:
 * "a non-name") in *missing, NULL when none. By a set of b's names (a
 * pairwise scan was quadratic: a mixture of experts has tens of thousands
 * of parameters). */
static accel_status name_missing(json_t *a, json_t *b, const char **missing) {
    json_t *names = json_object();
    bool oom = !names;
    for (size_t y = 0; y < json_array_size(b) && !oom; y++) {
        const char *name = json_string_value(json_array_get(b, y));
        oom = name && json_object_set(names, name, json_true());
    }
    *missing = NULL;
    for (size_t x = 0; x < json_array_size(a) && !oom && !*missing; x++) {
        const char *name = json_string_value(json_array_get(a, x));
        if (!name || !json_object_get(names, name)) *missing = name ? name : "a non-name";
    }
    json_decref(names);
    return oom ? accel_set_error(ACCEL_ERR_OOM, FN_LOAD ": out of memory") : ACCEL_OK;
}

/* Whether the index's "groups" (groups_json's) are optimizer i's: as many,
 * each of the same parameters (in any order). An index written before the
 * groups were recorded is held to their count (its scalars'). */
static accel_status same_groups(const optim_index *oi, const char *path, accel_accelerator *acc, int i) {
    json_t *saved = json_object_get(oi->root, "groups");
    int ng = accel_optimizer_num_groups(acc->opts[i]);
    int have = saved ? (json_is_array(saved) ? (int)json_array_size(saved) : -1) : scalar_groups(oi->scalars);
    if (have < 0) return accel_set_error(ACCEL_ERR_FORMAT, FN_LOAD ": %s: \"groups\" is not an array", path);
    if (have != ng)
        return accel_set_error(ACCEL_ERR_FORMAT, FN_LOAD ": %s: %d param group%s there, %d in this optimizer", path,
                               have, have == 1 ? "" : "s", ng);
    if (!saved) return ACCEL_OK;
    json_t *mine = groups_json(acc, i, FN_LOAD);
    if (!mine) return accel_last_status();
    accel_status st = ACCEL_OK;
    for (int g = 0; g < ng && !st; g++) {
        json_t *a = json_array_get(saved, (size_t)g), *b = json_array_get(mine, (size_t)g);
        if (!json_is_array(a)) {
            st = accel_set_error(ACCEL_ERR_FORMAT, FN_LOAD ": %s: \"groups\"[%d] is not an array", path, g);
            break;
        }
        /* a's names first: name_missing(b, a) then meets strings only in a */
        const char *name = NULL;
        if (!(st = name_missing(a, b, &name)) && name)
            st = accel_set_error(ACCEL_ERR_FORMAT, FN_LOAD ": %s: param group %d holds %s there, not in this "
                                 "optimizer (its param groups are of other parameters)", path, g, name);
        else if (!st && !(st = name_missing(b, a, &name)) && name)
            st = accel_set_error(ACCEL_ERR_FORMAT, FN_LOAD ": %s: param group %d holds no %s there: the checkpoint "
                                 "does not cover this optimizer's parameters", path, g, name);
    }
    json_decref(mine);
    return st;
}

static accel_status optim_index_open(optim_index *oi, const char *sub, accel_accelerator *acc, int i) {
    char path[2 * PATHN];
    snprintf(path, sizeof path, "%s/%s", sub, INDEX);
    memset(oi, 0, sizeof *oi);
    if (!(oi->root = accel__json_load_file(path))) return accel_last_status();
    const char *format = json_string_value(json_object_get(oi->root, "format"));
    oi->model = json_string_value(json_object_get(oi->root, "model"));
    oi->kinds = json_object_get(oi->root, "kinds");
    oi->scalars = json_object_get(oi->root, "scalars");
    if (!format || strcmp(format, OPTIM_FORMAT) || !oi->model || strchr(oi->model, '/') ||
        !get_i64(oi->root, "step", 0, INT64_MAX, &oi->step) || !json_is_array(oi->kinds) || !json_is_object(oi->scalars))
        return accel_set_error(ACCEL_ERR_FORMAT, FN_LOAD ": %s is not an accel sharded optimizer index (\"format\" "
                               "\"" OPTIM_FORMAT "\", \"model\", \"step\", \"kinds\", \"scalars\")", path);
    bool same = (int)json_array_size(oi->kinds) == accel__zero_kinds(acc, i);
    for (int k = 0; same && k < accel__zero_kinds(acc, i); k++) {
        const char *s = json_string_value(json_array_get(oi->kinds, (size_t)k));
        same = s && !strcmp(s, accel__zero_kind_name(acc, i, k));
    }
    if (!same)
        return accel_set_error(ACCEL_ERR_FORMAT, FN_LOAD ": %s: its state kinds are not this optimizer's (another "
                               "optimizer type saved it)", path);
    return same_groups(oi, path, acc, i);
}

static int scalars_of(json_t *scalars, accel_named_state **out) {
    int n = (int)json_object_size(scalars), m = 0;
    accel_named_state *st = accel_calloc((size_t)n + 1, sizeof *st);
    const char *key;
    json_t *v;
    if (!st) return -1;
    json_object_foreach(scalars, key, v) {
        if (!json_is_number(v)) continue;
        st[m].name = accel_strdup(key);
        st[m].value = json_number_value(v);
        if (!st[m++].name) {
            accel_named_state_free(st, m);
            return -1;
        }
    }
    *out = st;
    return m;
}

bool accel__zero3_has_optimizer_shards(const char *dir, int i) {
    char sub[PATHN + 64];
    optim_subdir(sub, sizeof sub, dir, i);
    return accel__is_dir(sub);
}

/* Optimizer i from dir/optimizer_<i>/ into this rank's shard, or (check)
 * everything the load checks (the index, the optimizer's kinds, every
 * range's file and tensor, the entries the optimizer would get) with no
 * state read and nothing loaded. */
static accel_status optimizer_shards(accel_accelerator *acc, int i, const char *dir, bool check) {
    char sub[PATHN + 64], msub[2 * PATHN];
    optim_subdir(sub, sizeof sub, dir, i);
    accel__model *pm = accel__zero_optimizer_model(acc, i);
    accel__zero_model *zm = accel__zero_of(pm);
    optim_index oi;
    sharded_index ix = {0};
    names nm = {0};
    float *local[2] = {NULL, NULL};
    accel_named_state *sc = NULL;
    int nsc = -1;
    accel_status st = optim_index_open(&oi, sub, acc, i);
    snprintf(msub, sizeof msub, "%s/%s", dir, st ? "" : oi.model);
    if (!st) st = index_open(&ix, msub, FN_LOAD ": ");
    if (!st) st = names_of(pm, &nm);
    for (int k = 0; k < accel__zero_kinds(acc, i) && !st; k++) {
        char suffix[64];
        shard_files fs = {0};
        snprintf(suffix, sizeof suffix, ".%s", accel__zero_kind_name(acc, i, k));
        /* the check's buffers are never touched (no pages): only offset */
        local[k] = check ? accel_malloc((size_t)(zm->zn ? zm->zn : 1) * sizeof(float))
                         : accel_calloc((size_t)(zm->zn ? zm->zn : 1), sizeof(float));
        st = local[k] ? files_init(&fs, &ix, sub, suffix) : accel_last_status();
        fs.check = check; /* read_piece copies nothing */
        if (!st) st = fill_shard(acc, pm, &nm, read_sharded, &fs, local[k], check);
        if (local[k]) files_close(&fs);
    }
    if (!st && (nsc = scalars_of(oi.scalars, &sc)) < 0) st = accel_last_status();
    if (!st)
        st = (check ? accel__zero_check_local : accel__zero_load_local)(acc, i, nsc, sc, local, (double)oi.step);
    if (nsc >= 0) accel_named_state_free(sc, nsc);
    accel_free(local[0]);
    accel_free(local[1]);
    names_free(&nm);
    index_free(&ix);
    json_decref(oi.root);
    return st;
}

accel_status accel__zero3_load_optimizer_state(accel_accelerator *acc, int i, const char *dir, bool *found) {
    *found = accel__zero3_has_optimizer_shards(dir, i);
    return *found ? optimizer_shards(acc, i, dir, false) : ACCEL_OK;
}

accel_status accel__zero3_check_optimizer_shards(accel_accelerator *acc, int i, const char *dir) {
    return optimizer_shards(acc, i, dir, true);
}

/* ---------------------------------------------------------------- merge-weights */

bool accel__zero3_find_sharded(const char *dir, char *sub, size_t n) {
    char path[2 * PATHN];
    snprintf(path, sizeof path, "%s/%s", dir, INDEX);
    if (accel__is_file(path)) {
        snprintf(sub, n, "%s", dir);
        return true;
    }
    snprintf(path, sizeof path, "%s/pytorch_model_fsdp_0/%s", dir, INDEX);
    if (!accel__is_file(path)) return false;
    snprintf(sub, n, "%s/pytorch_model_fsdp_0", dir);
    return true;
}

/* sub/name removed; one already gone (a file the index names twice) is fine. */
static accel_status remove_file(const char *sub, const char *name) {
    char path[2 * PATHN];
    snprintf(path, sizeof path, "%s/%s", sub, name);
    if (unlink(path) == 0 || errno == ENOENT) return ACCEL_OK;
    return accel_set_error(ACCEL_ERR_IO, "cannot remove %s: %s", path, strerror(errno));
}

/* The files the index names, replicated.safetensors, then the index: a
 * file of sub the index does not name (another save's rank file, a user's)
 * was never merged, and is left. */
accel_status accel__zero3_remove_sharded(const char *sub) {
    sharded_index ix;
    accel_status st = index_open(&ix, sub, "");
    for (int i = 0; !st && i < ix.n_files; i++) st = remove_file(sub, ix.files[i]);
    if (!st) st = remove_file(sub, REPLICATED);
    if (!st) st = remove_file(sub, INDEX);
    index_free(&ix);
    if (!st && rmdir(sub)) fprintf(stderr, "accel merge-weights: note: %s not removed: %s\n", sub, strerror(errno));
    return st;
}

/* The saved parameter, whole, in a new tensor. Its pieces are checked in
 * their files first (each range's tensor there, of the range's size), so a
 * shape the files do not hold is refused before memory of its size is
 * asked for (a hostile index's [2^40, 2^19]). */
static accel_tensor *whole_param(shard_files *fs, const saved_param *p) {
    fs->check = true;
    accel_status checked = read_sharded(fs, p->name, NULL, 0, p->numel, NULL);
    fs->check = false;
    if (checked) return NULL;
    accel_tensor *t = accel_tensor_new(ACCEL_F32, p->ndim, p->shape, ACCEL_CPU_DEVICE);
    float *buf = accel_malloc((size_t)(p->numel ? p->numel : 1) * sizeof(float));
    accel_status st = t && buf ? read_sharded(fs, p->name, NULL, 0, p->numel, buf) : accel_last_status();
    if (!st) st = accel__tensor_write_bytes(t, 0, buf, (size_t)p->numel * sizeof(float));
    accel_free(buf);
    if (st) {
        accel_tensor_free(t);
        return NULL;
    }
    return t;
}

/* Entry e of the index's state dict as a tensor: a parameter read whole, a
 * replicated entry viewed in rf, an alias the tensor of its original. */
static accel_tensor *merged_entry(shard_files *fs, accel_safetensors *rf, json_t *e, const char *const *nms,
                                  accel_tensor *const *ts, int e_index, bool *owned) {
    const char *name = json_string_value(json_object_get(e, "name"));
    const char *alias = json_string_value(json_object_get(e, "alias_of"));
    *owned = false;
    if (alias) {
        for (int a = 0; a < e_index; a++)
            if (!strcmp(nms[a], alias)) return ts[a];
        accel_set_error(ACCEL_ERR_FORMAT, "%s: %s is an alias of %s, which comes nowhere before it", fs->ix->path,
                        name, alias);
        return NULL;
    }
    if (!json_object_get(e, "unit")) {
        accel_tensor *t = accel_safetensors_tensor(rf, name, -1);
        if (!t)
            accel_set_error(ACCEL_ERR_FORMAT, "%s: %s has no tensor %s", fs->ix->path, accel_safetensors_path(rf), name);
        *owned = t != NULL;
        return t;
    }
    *owned = true;
    return whole_param(fs, find_param(fs->ix, name));
}

/* A file the merge reads that is out (the merged file: merged into the
 * checkpoint's own folder, a rank file of that name) or its scratch file:
 * the write replaced it (or the writer refused the scratch only after
 * everything was read). Refused naming it. */
static accel_status out_is_read(const sharded_index *ix, const char *sub, const char *out) {
    char target[2 * PATHN], scratch[2 * PATHN + 8], read[2 * PATHN];
    if (accel__afile_target(out, target, sizeof target) || accel__afile_scratch(target, scratch, sizeof scratch))
        return accel_last_status();
    for (int i = 0; i < ix->n_files; i++) {
        snprintf(read, sizeof read, "%s/%s", sub, ix->files[i]);
        if (accel__same_file(read, out) || accel__same_file(read, scratch))
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s, which %s names as a rank file of the checkpoint, is "
                                   "the merge's output %s or its scratch file (written, then renamed over it): "
                                   "merge into another folder", read, ix->path, out);
    }
    return ACCEL_OK;
}

accel_status accel__zero3_merge(const char *sub, const char *out_dir, bool torch_format, int *n_tensors) {
    char path[2 * PATHN];
    sharded_index ix;
    shard_files fs = {0};
    accel_safetensors *rf = NULL;
    snprintf(path, sizeof path, "%s/%s", out_dir, torch_format ? "pytorch_model.bin" : "model.safetensors");
    accel_status st = index_open(&ix, sub, "");
    /* nothing to merge is a broken index, not a success (nor a reason for --remove_checkpoint_dir) */
    if (!st && json_array_size(ix.state_dict) == 0)
        st = bad_index(&ix, "its \"state_dict\" holds no tensors: nothing to merge");
    if (!st) st = out_is_read(&ix, sub, path);
    if (!st) st = files_init(&fs, &ix, sub, "");
    char replicated[2 * PATHN];
    snprintf(replicated, sizeof replicated, "%s/%s", sub, REPLICATED);
    if (!st && !(rf = accel_safetensors_open(replicated))) st = accel_last_status();
    int n = st ? 0 : (int)json_array_size(ix.state_dict), made = 0;
    const char **nms = accel_calloc((size_t)n + 1, sizeof *nms);
    accel_tensor **ts = accel_calloc((size_t)n + 1, sizeof *ts);
    bool *owned = accel_calloc((size_t)n + 1, sizeof *owned);
    if (!st && (!nms || !ts || !owned)) st = accel_last_status();
    for (; made < n && !st; made++) {
        json_t *e = json_array_get(ix.state_dict, (size_t)made);
        nms[made] = json_string_value(json_object_get(e, "name"));
        ts[made] = merged_entry(&fs, rf, e, nms, ts, made, &owned[made]);
        if (!ts[made]) st = accel_last_status();
    }
    if (!st) st = torch_format ? accel_torch_save(path, n, nms, ts) : accel_safetensors_save(path, n, nms, ts, 0, NULL);
    for (int k = 0; k < made; k++)
        if (owned[k]) accel_tensor_free(ts[k]);
    accel_free(nms);
    accel_free(ts);
    accel_free(owned);
    accel_safetensors_close(rf);
    files_close(&fs);
    index_free(&ix);
    if (!st) *n_tensors = n;
    return st;
}
