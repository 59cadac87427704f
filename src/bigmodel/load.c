/* src/bigmodel/load.c — load_checkpoint_in_model (accelerate/utils/modeling.py).
 *
 * Every weight goes from the mapped safetensors file straight to where the
 * device map puts it, with no full copy of the checkpoint in between:
 *   execution device -> read (and converted) into the parameter's own memory
 *                       (off the cpu through the pinned staging chunk:
 *                       core/host_stage.h);
 *   "cpu" offload    -> converted into a host copy kept by the weights map;
 *   "disk"           -> nothing is read: the weights map keeps a view of the
 *                       mapping and the pages come in when the module runs.
 * Pages of the mapping that were read are released from the process right
 * after use, so peak RSS stays at what was materialised. */
#include <regex.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bigmodel/bigmodel_internal.h"
#include "bigmodel/offload_internal.h"
#include "tracking/tracking_internal.h"
#include "core/core_internal.h"
#include "io/io_internal.h"
#include "nn/nn_internal.h"

typedef enum { PLACE_RESIDENT, PLACE_HOST, PLACE_DISK } place_kind;

typedef struct plan {
    accel_tensor *t;
    const char *name;   /* first name (borrowed from the state dict) */
    place_kind kind;
    accel_device dev;   /* PLACE_RESIDENT */
    bool loaded;
} plan;

static void warn(const accel_load_opts *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void warn(const accel_load_opts *o, const char *fmt, ...) {
    FILE *f = o && o->log ? o->log : stderr;
    va_list ap;
    va_start(ap, fmt);
    if (f == stderr) { /* no stream of the caller's: the library's logger */
        accel__warnv(fmt, ap);
        va_end(ap);
        return;
    }
    fputs("accel: warning: ", f);
    vfprintf(f, fmt, ap);
    fputc('\n', f);
    va_end(ap);
}

/* What a map value means for loading. */
static accel_status classify(const char *entry, const char *value, accel_device main, bool offload_cpu,
                             place_kind *kind, accel_device *dev) {
    if (strcmp(value, "disk") == 0) {
        *kind = PLACE_DISK;
        return ACCEL_OK;
    }
    accel_device dv;
    if (accel_device_map_device(value, &dv) != ACCEL_OK) {
        char prev[512];
        snprintf(prev, sizeof prev, "%s", accel_last_error());
        return accel_set_error(ACCEL_ERR_DEVICE,
                               "accel_load_checkpoint_in_model: device_map entry '%s' -> '%s': %s", entry,
                               value, prev);
    }
    if (dv.type == ACCEL_DEV_META)
        return accel_set_error(ACCEL_ERR_DEVICE,
                               "accel_load_checkpoint_in_model: device_map entry '%s' -> 'meta': weights cannot be "
                               "loaded onto meta",
                               entry);
    if (!accel_device_available(dv))
        return accel_set_error(ACCEL_ERR_DEVICE,
                               "accel_load_checkpoint_in_model: device_map entry '%s' -> '%s': this device is not "
                               "available in this build of accel or on this machine (available: cpu, disk)",
                               entry, value);
    *dev = dv;
    *kind = dv.type == ACCEL_DEV_CPU && (main.type != ACCEL_DEV_CPU || offload_cpu) ? PLACE_HOST
                                                                                     : PLACE_RESIDENT;
    return ACCEL_OK;
}

/* Every map value must be a device this build and machine has (or disk). */
static accel_status check_devices(const accel_device_map *map) {
    for (int i = 0; i < map->n; i++) {
        place_kind k;
        accel_device dv;
        if (classify(map->e[i].prefix[0] ? map->e[i].prefix : "\"\"", map->e[i].device, ACCEL_CPU_DEVICE, false,
                     &k, &dv) != ACCEL_OK)
            return accel_last_status();
    }
    return ACCEL_OK;
}

static accel_status resolve_main(const accel_device_map *map, const accel_load_opts *o, accel_device *main) {
    *main = ACCEL_CPU_DEVICE;
    if (o && o->main_device) {
        if (accel_device_map_device(o->main_device, main) != ACCEL_OK) return accel_last_status();
    } else {
        for (int i = 0; map && i < map->n; i++) {
            const char *v = map->e[i].device;
            if (strcmp(v, "cpu") != 0 && strcmp(v, "disk") != 0) {
                if (accel_device_map_device(v, main) != ACCEL_OK) return accel_last_status();
                break;
            }
        }
    }
    if (!accel_device_available(*main) || main->type == ACCEL_DEV_META) {
        char b[32];
        return accel_set_error(ACCEL_ERR_DEVICE,
                               "accel_load_checkpoint_in_model: main device %s is not available in this build of "
                               "accel or on this machine",
                               accel_device_str(*main, b, sizeof b));
    }
    return ACCEL_OK;
}

/* Whether root has a module at exactly path. */
static bool has_module(accel_module *root, const char *path) {
    accel_module *m = accel_module_find(root, path);
    char buf[1024];
    bool found = m && strcmp(accel_module_path(m, buf, sizeof buf), path) == 0;
    accel_clear_error(); /* the lookup of an absent name may have left one */
    return found;
}

/* Whether key names a module transformers has and accel's model lacks on
 * purpose, none of them holding a weight: the rotary embedding's buffers
 * (accel computes the tables; transformers' hf_device_map names
 * model.rotary_emb wherever it splits the model), dropouts and activations
 * (functions in accel). A map json.dump(model.hf_device_map) wrote holds
 * them; they place nothing. The parent must be a module of root (the root
 * itself for a name without a dot: BertForSequenceClassification's dropout,
 * a bare model's rotary_emb), so a typo above such a name is still refused. */
static bool weightless_key(accel_module *root, const char *key) {
    static const char *const NAMES[] = {"rotary_emb", "act", "act_fn", "activation", "activation_fn",
                                        "intermediate_act_fn", "transform_act_fn"};
    const char *dot = strrchr(key, '.'), *last = dot ? dot + 1 : key;
    size_t n = strlen(last);
    bool weightless = (n >= 4 && !strcmp(last + n - 4, "drop")) || (n >= 7 && !strcmp(last + n - 7, "dropout"));
    for (size_t i = 0; !weightless && i < sizeof NAMES / sizeof *NAMES; i++) weightless = !strcmp(last, NAMES[i]);
    if (!weightless || has_module(root, key)) return false;
    char parent[1024];
    size_t n_parent = dot ? (size_t)(dot - key) : 0; /* "": the root */
    if (n_parent >= sizeof parent) return false;
    memcpy(parent, key, n_parent);
    parent[n_parent] = 0;
    return has_module(root, parent);
}

/* The key of d's map for a key of the caller's: transformers 5 calls
 * GPT-NeoX's head module lm_head, where its checkpoints (and accel's model)
 * say embed_out; NULL for a weightless module's (weightless_key); else key. */
static const char *map_key(accel_module *root, const char *key, char *buf, size_t n) {
    if (weightless_key(root, key)) return NULL;
    if (!strncmp(key, "lm_head", 7) && (!key[7] || key[7] == '.') && !has_module(root, "lm_head") &&
        has_module(root, "embed_out") && (size_t)snprintf(buf, n, "embed_out%s", key + 7) < n)
        return buf;
    return key;
}

/* The caller's keys in d's map (map_key): a key and another the translation
 * turns into it (GPT-NeoX's lm_head and embed_out) must not ask for two
 * devices, or the later one would win without a word. */
static accel_status translate_keys(accel_module *root, const accel_device_map *map, accel_device_map *out) {
    for (int i = 0; i < map->n; i++) {
        char buf[1024];
        const char *key = map->e[i].prefix, *k = map_key(root, key, buf, sizeof buf);
        if (!k) continue;
        for (int j = 0; k != key && j < map->n; j++)
            if (!strcmp(map->e[j].prefix, k) && strcmp(map->e[j].device, map->e[i].device))
                return accel_set_error(ACCEL_ERR_INVALID_ARG,
                                       "accel_load_checkpoint_in_model: device_map keys '%s' -> '%s' and '%s' -> "
                                       "'%s' name the same module (transformers' '%s' is '%s' in this model) on "
                                       "two devices",
                                       key, map->e[i].device, k, map->e[j].device, key, k);
        if (accel_device_map_set(out, k, map->e[i].device) != ACCEL_OK) return accel_last_status();
    }
    return ACCEL_OK;
}

/* Map keys must name a module or a tensor of the model (an error, where
 * Accelerate only warns: a typo would otherwise silently change placement). */
static accel_status check_keys(accel_module *root, const accel_device_map *map) {
    char *msg = NULL;
    size_t len = 0;
    FILE *ms = open_memstream(&msg, &len);
    if (!ms) return accel_set_error(ACCEL_ERR_OOM, "accel_load_checkpoint_in_model: out of memory");
    int bad = 0;
    for (int i = 0; i < map->n; i++) {
        const char *k = map->e[i].prefix;
        if (!k[0] || accel_module_get_tensor(root, k) || has_module(root, k)) continue;
        fprintf(ms, "%s'%s'", bad++ ? ", " : "", k);
    }
    fclose(ms);
    accel_clear_error(); /* lookups of absent names may have left one */
    accel_status st = ACCEL_OK;
    if (bad)
        st = accel_set_error(ACCEL_ERR_INVALID_ARG,
                             "accel_load_checkpoint_in_model: the following device_map keys do not match any "
                             "submodule or tensor of the model: [%s]",
                             msg);
    free(msg);
    return st;
}

static accel_status add_placed(accel_dispatched *d, int cap, const char *name, const char *where) {
    if (d->n_placed == cap) return ACCEL_OK;
    accel__placed *p = &d->placed[d->n_placed];
    p->name = accel_strdup(name);
    if (!p->name) return accel_last_status();
    snprintf(p->where, sizeof p->where, "%s", where);
    d->n_placed++;
    return ACCEL_OK;
}

/* State-dict entries sorted by tensor or by name: the lookups below must stay
 * O(n log n) for models of many layers, not O(n^2). */
typedef struct entry_key {
    uintptr_t t;
    const char *name;
    int i;
} entry_key;

static int cmp_key_tensor(const void *a, const void *b) {
    const entry_key *x = a, *y = b;
    if (x->t != y->t) return x->t < y->t ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

static int cmp_key_name(const void *a, const void *b) {
    return strcmp(((const entry_key *)a)->name, ((const entry_key *)b)->name);
}

/* The entries sorted with cmp; caller frees. */
static entry_key *sorted_entries(const accel_state_dict *sd, int (*cmp)(const void *, const void *)) {
    entry_key *k = accel_malloc(sizeof *k * ((size_t)sd->n + 1));
    if (!k) return NULL;
    for (int i = 0; i < sd->n; i++) k[i] = (entry_key){(uintptr_t)sd->entries[i].t, sd->entries[i].name, i};
    qsort(k, (size_t)sd->n, sizeof *k, cmp);
    return k;
}

/* Decides each unique tensor's place: resident when any of its names maps to
 * an execution device (a tied weight must stay usable there), else a host
 * copy when any name maps to an offloaded cpu, else disk. */
static accel_status make_plans(accel_dispatched *d, const accel_state_dict *sd, const accel_device_map *map,
                               bool offload_cpu, plan *plans, int *n_plans, int *plan_of) {
    /* next_name[i]: the next entry naming entry i's tensor (a tied alias), or -1 */
    entry_key *by_t = sorted_entries(sd, cmp_key_tensor);
    int *next_name = accel_malloc(sizeof(int) * ((size_t)sd->n + 1));
    if (!by_t || !next_name) {
        accel_free(by_t);
        accel_free(next_name);
        return accel_last_status();
    }
    for (int k = 0; k < sd->n; k++)
        next_name[by_t[k].i] = k + 1 < sd->n && by_t[k + 1].t == by_t[k].t ? by_t[k + 1].i : -1;
    accel_free(by_t);
    accel_status st = ACCEL_OK;
    int np = 0;
    for (int i = 0; i < sd->n && !st; i++) {
        const accel_state_entry *e = &sd->entries[i];
        if (e->is_tied_alias) continue;
        plan p = {.t = e->t, .name = e->name, .kind = PLACE_DISK};
        bool any_host = false, any_res = false;
        int first = i; /* a tied weight's names must execute on one device: its first's */
        accel_device first_exec = d->main;
        for (int j = i; j >= 0; j = next_name[j]) {
            plan_of[j] = np;
            const char *v = map ? accel_device_map_lookup(map, sd->entries[j].name) : "cpu";
            if (!v) {
                st = accel_set_error(ACCEL_ERR_INVALID_ARG,
                                     "accel_load_checkpoint_in_model: %s doesn't have any device set.",
                                     sd->entries[j].name);
                break;
            }
            place_kind k;
            accel_device dv = ACCEL_CPU_DEVICE;
            st = classify(sd->entries[j].name, v, d->main, offload_cpu, &k, &dv);
            if (st) break;
            accel_device exec = k == PLACE_RESIDENT ? dv : d->main; /* offloaded: brought to main */
            if (j == i) first_exec = exec;
            if (!accel_device_eq(exec, first_exec)) {
                char a[32], b[32];
                st = accel_set_error(ACCEL_ERR_INVALID_ARG,
                                     "accel_load_checkpoint_in_model: %s and %s are one tied weight, but the device "
                                     "map runs them on %s and %s: map both to one device (Accelerate keeps tied "
                                     "parameters together)",
                                     sd->entries[first].name, sd->entries[j].name,
                                     accel_device_str(first_exec, a, sizeof a), accel_device_str(exec, b, sizeof b));
                break;
            }
            if (k == PLACE_RESIDENT && !any_res) {
                any_res = true;
                p.dev = dv;
            }
            any_host |= k == PLACE_HOST;
        }
        p.kind = any_res ? PLACE_RESIDENT : any_host ? PLACE_HOST : PLACE_DISK;
        plans[np++] = p;
    }
    accel_free(next_name);
    if (st) return st;
    *n_plans = np;
    for (int i = 0; i < sd->n; i++) {
        const plan *p = &plans[plan_of[i]];
        char b[32];
        const char *w = p->kind == PLACE_DISK ? "disk"
                        : p->kind == PLACE_HOST ? "cpu-offload"
                                                : accel_device_str(p->dev, b, sizeof b);
        if (add_placed(d, sd->n, sd->entries[i].name, w) != ACCEL_OK) return accel_last_status();
    }
    return ACCEL_OK;
}

/* Where init_missing materialised a tensor planned for disk or a host copy
 * (the main device): its placement says so. */
static void placed_on(accel_dispatched *d, const char *name, accel_device dev) {
    for (int i = 0; i < d->n_placed; i++)
        if (!strcmp(d->placed[i].name, name)) accel_device_str(dev, d->placed[i].where, sizeof d->placed[i].where);
}

/* The dtype checkpoint tensor in is loaded into t as: t's, or opts' dtype
 * for a floating tensor of a floating parameter. */
static accel_dtype load_dtype(const accel_load_opts *o, const accel_st_info *in, const accel_tensor *t) {
    return o && o->has_dtype && accel_dtype_is_float(in->dtype) && accel_dtype_is_float(t->dtype) ? o->dtype
                                                                                                  : t->dtype;
}

/* Lets the pages of checkpoint tensor name that the load read leave the
 * process where they are the file's (they come back from it if read again);
 * a copy the reader made (a torch file's strided tensor) is heap memory the
 * checkpoint keeps: released, its allocator's headers went too. */
static void release_read(accel_dispatched *d, const char *name, const accel_st_info *in) {
    if (accel__checkpoint_in_file_map(d->ck, name, in)) accel__release_pages(in->bytes, in->nbytes);
}

/* Checkpoint tensor name (in) against its place t: another shape is an
 * error naming both, Accelerate's words. */
static accel_status check_shape(accel_dispatched *d, const accel_tensor *t, const char *name,
                                const accel_st_info *in, const char *checkpoint) {
    if (accel__st_shape_is(in, t)) return ACCEL_OK;
    char a[128], b[128];
    return accel_set_error(ACCEL_ERR_SHAPE,
                           "Trying to set a tensor of shape %s in \"%s\" (which has shape %s), this looks "
                           "incorrect. (checkpoint %s, file %s)",
                           accel_shape_str_n(in->ndim, in->shape, a, sizeof a), name,
                           accel_shape_str_n(t->ndim, t->shape, b, sizeof b), checkpoint,
                           accel_checkpoint_shard_path(d->ck, accel_checkpoint_shard_of(d->ck, name)));
}

/* Reads one checkpoint tensor into its place. */
static accel_status load_one(accel_dispatched *d, plan *p, const char *name, const accel_st_info *in,
                             const char *checkpoint, const accel_load_opts *o) {
    accel_tensor *t = p->t;
    if (check_shape(d, t, name, in, checkpoint) != ACCEL_OK) return accel_last_status();
    accel_dtype target = load_dtype(o, in, t);
    size_t nb = (size_t)accel_numel(t) * accel_dtype_size(target);
    if (p->kind == PLACE_DISK) {
        accel_tensor_to_meta(t);
        t->dtype = target;
        accel__contiguous_strides(t->ndim, t->shape, t->stride);
        int i = accel__off_add(d, t, name, ACCEL__OFF_DISK, in->bytes, in->dtype, in->nbytes);
        if (i < 0) return accel_last_status();
        d->off[i].src_file_pages = accel__checkpoint_in_file_map(d->ck, name, in);
        return ACCEL_OK;
    }
    if (p->kind == PLACE_HOST) {
        void *copy = accel_malloc(nb ? nb : 1);
        if (!copy) return accel_last_status();
        accel_convert(copy, target, in->bytes, in->dtype, (size_t)accel_numel(t));
        release_read(d, name, in);
        accel_tensor_to_meta(t);
        t->dtype = target;
        accel__contiguous_strides(t->ndim, t->shape, t->stride);
        if (accel__off_add(d, t, name, ACCEL__OFF_HOST, copy, target, nb) < 0) {
            accel_free(copy);
            return accel_last_status();
        }
        return ACCEL_OK;
    }
    if (!accel_device_eq(t->device, p->dev) || t->dtype != target || !(t->flags & ACCEL_TF_OWNS_DATA) ||
        !accel_is_contiguous(t)) {
        /* fresh memory on the target device, not zero-filled: every byte is
         * written by the load */
        if (accel__tensor_alloc_uninit(t, p->dev, target) != ACCEL_OK) return accel_last_status();
    }
    accel_status st = accel_checkpoint_load_into(d->ck, name, t);
    release_read(d, name, in);
    if (st == ACCEL_OK) {
        d->stats.n_loaded++;
        d->stats.bytes_resident += (int64_t)nb;
    }
    return st;
}

/* Lists names into a memstream-built string. */
typedef struct name_list {
    char *s;
    size_t len;
    FILE *f;
    int n;
} name_list;

static void list_add(name_list *l, const char *name) {
    if (!l->f) l->f = open_memstream(&l->s, &l->len);
    if (l->f) fprintf(l->f, "%s'%s'", l->n ? ", " : "", name);
    l->n++;
}

static const char *list_str(name_list *l) {
    if (l->f) {
        fclose(l->f);
        l->f = NULL;
    }
    return l->s ? l->s : "";
}

static void list_free(name_list *l) {
    if (l->f) fclose(l->f);
    free(l->s);
}

/* transformers' "legacy" renames (conversion_mapping.py): the name with
 * "LayerNorm.gamma" / "LayerNorm.beta" read as LayerNorm.weight / .bias, in
 * buf; NULL when name has neither (or does not fit buf). */
static const char *legacy_name(const char *name, char *buf, size_t n) {
    static const char *const FROM[] = {"LayerNorm.gamma", "LayerNorm.beta"}, *const TO[] = {"weight", "bias"};
    for (int i = 0; i < 2; i++) {
        const char *at = strstr(name, FROM[i]);
        if (!at) continue;
        size_t keep = (size_t)(at - name) + strlen("LayerNorm."), tail = strlen(at + strlen(FROM[i]));
        if (keep + strlen(TO[i]) + tail + 1 > n) return NULL;
        snprintf(buf, n, "%.*s%s%s", (int)keep, name, TO[i], at + strlen(FROM[i]));
        return buf;
    }
    return NULL;
}

/* The state-dict entry a checkpoint name loads into: the name itself (with
 * from_pretrained: after the legacy renames), else "<base_model_prefix>.<name>"
 * (a checkpoint of the body); NULL when neither is in the model. */
static const entry_key *entry_for(const char *name, const entry_key *by_name, int n, const accel_load_opts *o,
                                  const accel__pretrained_load *pl) {
    char renamed[1024], full[1280];
    const char *key = pl ? legacy_name(name, renamed, sizeof renamed) : NULL;
    if (!key) key = name;
    entry_key k = {.name = key};
    const entry_key *hit = bsearch(&k, by_name, (size_t)n, sizeof k, cmp_key_name);
    if (!hit && o && o->base_model_prefix && *o->base_model_prefix &&
        (size_t)snprintf(full, sizeof full, "%s.%s", o->base_model_prefix, key) < sizeof full) {
        k.name = full;
        hit = bsearch(&k, by_name, (size_t)n, sizeof k, cmp_key_name);
    }
    return hit;
}

bool accel__unexpected_ignored(const char *const *patterns, const char *name) {
    for (int i = 0; patterns && patterns[i]; i++) {
        regex_t re;
        if (regcomp(&re, patterns[i], REG_EXTENDED | REG_NOSUB) != 0) continue; /* the list is accel's own */
        bool hit = regexec(&re, name, 0, NULL, 0) == 0;
        regfree(&re);
        if (hit) return true;
    }
    return false;
}

/* Whether checkpoint tensors x and y (of one shape) hold the same values
 * once converted to dt, as two parameters of dt loaded from them would
 * (torch.equal: NaN equals nothing, -0 equals 0). Chunk by chunk: no copy
 * of the whole tensor. -1: out of memory (error set). */
static int same_values(const accel_st_info *x, const accel_st_info *y, int64_t numel, accel_dtype dt) {
    enum { CHUNK = 4096 };
    size_t es = accel_dtype_size(dt);
    unsigned char *a = accel_malloc(CHUNK * es), *b = accel_malloc(CHUNK * es);
    double *da = accel_malloc(CHUNK * sizeof *da), *db = accel_malloc(CHUNK * sizeof *db);
    int same = a && b && da && db ? 1 : -1;
    bool fl = accel_dtype_is_float(dt);
    for (int64_t at = 0; same == 1 && at < numel; at += CHUNK) {
        size_t n = (size_t)(numel - at < CHUNK ? numel - at : CHUNK);
        accel_convert(a, dt, (const char *)x->bytes + (size_t)at * accel_dtype_size(x->dtype), x->dtype, n);
        accel_convert(b, dt, (const char *)y->bytes + (size_t)at * accel_dtype_size(y->dtype), y->dtype, n);
        if (!fl) {
            same = memcmp(a, b, n * es) == 0;
            continue;
        }
        accel_convert(da, ACCEL_F64, a, dt, n);
        accel_convert(db, ACCEL_F64, b, dt, n);
        for (size_t i = 0; i < n && same == 1; i++) same = da[i] == db[i];
    }
    accel_free(a);
    accel_free(b);
    accel_free(da);
    accel_free(db);
    return same;
}

/* Entry i and j name one tensor and the checkpoint holds both, under ni and
 * nj: with different values (as loaded) they are untied, as transformers'
 * tie_weights does in from_pretrained, with its warning; with equal values
 * (or shapes the load will refuse) they stay tied. */
static accel_status untie_if_differ(accel_module *root, accel_checkpoint *ck, const accel_state_entry *ei,
                                    const accel_state_entry *ej, const char *ni, const char *nj,
                                    const accel_load_opts *o) {
    const accel_st_info *x = accel_checkpoint_find(ck, ni, NULL), *y = accel_checkpoint_find(ck, nj, NULL);
    if (!x || !y) return accel_last_status();
    /* a name another untie already gave a tensor of its own (three names of one tensor) */
    if (accel_module_get_tensor(root, ei->name) != accel_module_get_tensor(root, ej->name)) return ACCEL_OK;
    if (!accel__st_shape_is(x, ei->t) || !accel__st_shape_is(y, ei->t)) return ACCEL_OK;
    /* the pages stay: the load reads them next (and a .bin's strided tensor is
     * a heap copy, not a mapping whose pages could be dropped) */
    int same = same_values(x, y, accel_numel(ei->t), load_dtype(o, x, ei->t));
    if (same != 0) return same < 0 ? accel_last_status() : ACCEL_OK;
    const char *target = NULL;
    if (accel__module_untie(root, ei->name, ej->name, &target) != ACCEL_OK) return accel_last_status();
    warn(o, "The tied weights mapping and config for this model specifies to tie %s to %s, but both are present in "
            "the checkpoints with different values, so we will NOT tie them. You should update the config with "
            "`tie_word_embeddings=False` to silence this warning.",
         target == ej->name ? ei->name : ej->name, target);
    return ACCEL_OK;
}

accel_status accel__untie_stored_twice(accel_module *root, accel_checkpoint *ck, const accel_load_opts *o,
                                       const accel__pretrained_load *pl) {
    accel_state_dict *sd = accel_module_state_dict(root);
    entry_key *by_name = sd ? sorted_entries(sd, cmp_key_name) : NULL;
    const char **ck_name = by_name ? accel_calloc((size_t)sd->n + 1, sizeof *ck_name) : NULL;
    accel_status st = ck_name ? ACCEL_OK : accel_last_status();
    for (int k = 0; st == ACCEL_OK && k < accel_checkpoint_count(ck); k++) {
        const char *name = accel_checkpoint_name(ck, k);
        const entry_key *hit = entry_for(name, by_name, sd->n, o, pl);
        if (hit && !ck_name[hit->i]) ck_name[hit->i] = name;
    }
    /* each alias the checkpoint holds, against the first name of its tensor it holds */
    for (int i = 0; st == ACCEL_OK && i < sd->n; i++) {
        if (!sd->entries[i].is_tied_alias || !ck_name[i]) continue;
        int j = 0;
        while (j < i && (sd->entries[j].t != sd->entries[i].t || !ck_name[j])) j++;
        if (j < i) st = untie_if_differ(root, ck, &sd->entries[j], &sd->entries[i], ck_name[j], ck_name[i], o);
    }
    accel_free(ck_name);
    accel_free(by_name);
    accel_state_dict_free(sd);
    return st;
}

static accel_status load_all(accel_dispatched *d, const char *checkpoint, const accel_state_dict *sd,
                             plan *plans, const int *plan_of, int np, const accel_load_opts *o,
                             const accel__pretrained_load *pl) {
    bool strict = o && o->strict;
    name_list unexpected = {0}, missing = {0}, fresh = {0};
    accel_status st = ACCEL_OK;
    entry_key *by_name = sorted_entries(sd, cmp_key_name);
    if (!by_name) return accel_last_status();
    int nck = accel_checkpoint_count(d->ck);
    accel_progress *bar =
        accel_progress_new(nck, &(accel_progress_opts){.desc = "Loading weights", .unit = "tensor", .delay = 1});
    for (int i = 0; i < nck && st == ACCEL_OK; i++) {
        accel_progress_update(bar, 1);
        const char *name = accel_checkpoint_name(d->ck, i);
        const entry_key *hit = entry_for(name, by_name, sd->n, o, pl);
        plan *p = hit ? &plans[plan_of[hit->i]] : NULL;
        if (!p) {
            /* the family's old non-persistent buffers (transformers' _keys_to_ignore_on_load_unexpected) */
            if (!pl || !accel__unexpected_ignored(pl->ignore_unexpected, name)) list_add(&unexpected, name);
            continue;
        }
        const accel_st_info *in = accel_checkpoint_find(d->ck, name, NULL);
        if (!in) {
            st = accel_last_status();
            break;
        }
        /* a tied alias saved under both names (equal values: untied otherwise): its shape checked too, as
         * transformers refuses a mismatched one */
        if (p->loaded) st = check_shape(d, p->t, name, in, checkpoint);
        else st = load_one(d, p, name, in, checkpoint, o);
        p->loaded = st == ACCEL_OK;
    }
    accel_progress_close(bar);
    if (st == ACCEL_OK) {
        for (int k = 0; k < np && st == ACCEL_OK; k++) {
            plan *p = &plans[k];
            if (p->loaded) continue;
            int made = 0;
            if (pl && pl->init_missing && p->t->device.type == ACCEL_DEV_META) {
                accel_dtype dt = o && o->has_dtype && accel_dtype_is_float(p->t->dtype) ? o->dtype : p->t->dtype;
                made = pl->init_missing(p->t, p->name, p->kind == PLACE_RESIDENT ? p->dev : d->main, dt, pl->ctx);
                if (made < 0) st = accel_last_status();
                if (made > 0 && p->kind != PLACE_RESIDENT) placed_on(d, p->name, d->main);
            }
            list_add(made ? &fresh : &missing, p->name);
            if (!made && (p->t->device.type == ACCEL_DEV_META || p->kind != PLACE_RESIDENT)) strict = true;
        }
    }
    if (st == ACCEL_OK) {
        d->stats.n_unexpected = unexpected.n;
        d->stats.n_missing = missing.n + fresh.n;
        const char *u = list_str(&unexpected), *m = list_str(&missing), *nw = list_str(&fresh);
        if (strict && (unexpected.n || missing.n || fresh.n)) {
            char *msg = NULL;
            size_t ml = 0;
            FILE *f = open_memstream(&msg, &ml);
            if (f) {
                if (missing.n) fprintf(f, " missing key(s) (not in the checkpoint): [%s]", m);
                if (fresh.n) fprintf(f, " missing key(s) newly initialised: [%s]", nw);
                if (unexpected.n) fprintf(f, " unexpected key(s): [%s]", u);
                fclose(f);
            }
            st = accel_set_error(ACCEL_ERR_FORMAT,
                                 "accel_load_checkpoint_in_model: error(s) in loading the state dict from %s:%s",
                                 checkpoint, msg ? msg : " (out of memory)");
            free(msg);
        } else {
            if (unexpected.n)
                warn(o, "Some weights of the checkpoint at %s were not used when initializing the model: [%s]",
                     checkpoint, u);
            if (missing.n)
                warn(o, "Some weights of the model were not initialized from the checkpoint at %s and keep their "
                        "current values: [%s]",
                     checkpoint, m);
            if (fresh.n)
                warn(o, "Some weights of the model were not initialized from the checkpoint at %s and are newly "
                        "initialized: [%s]; train the model before using its predictions",
                     checkpoint, nw);
        }
    }
    accel_free(by_name);
    list_free(&unexpected);
    list_free(&missing);
    list_free(&fresh);
    return st;
}

accel_dispatched *accel_load_checkpoint_in_model(accel_module *root, const char *checkpoint,
                                                 const accel_device_map *map,
                                                 const accel_load_opts *opts) {
    return accel__load_checkpoint_in_model(root, checkpoint, map, opts, NULL);
}

accel_dispatched *accel__load_checkpoint_in_model(accel_module *root, const char *checkpoint,
                                                  const accel_device_map *map, const accel_load_opts *opts,
                                                  const accel__pretrained_load *pl) {
    if (!root || !checkpoint) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_load_checkpoint_in_model: NULL model or checkpoint");
        return NULL;
    }
    accel_dispatched *d = accel_calloc(1, sizeof *d);
    if (!d) return NULL;
    accel_state_dict *sd = NULL;
    plan *plans = NULL;
    int *plan_of = NULL;
    accel_status st = ACCEL_OK;
    if (accel__dispatched_attach(d, root) != ACCEL_OK) goto fail;
    d->map = accel_device_map_new();
    if (!d->map) goto fail;
    if (map) {
        if (translate_keys(root, map, d->map) != ACCEL_OK) goto fail;
    } else if (accel_device_map_set(d->map, "", "cpu") != ACCEL_OK) {
        goto fail;
    }
    if (check_devices(d->map) != ACCEL_OK || resolve_main(d->map, opts, &d->main) != ACCEL_OK) goto fail;
    if (check_keys(root, d->map) != ACCEL_OK) goto fail;
    if (accel_check_device_map(root, d->map, opts ? opts->map_opts : NULL) != ACCEL_OK) goto fail;
    const char *const *pre = opts && opts->preload_classes ? opts->preload_classes
                             : opts && opts->map_opts      ? opts->map_opts->no_split
                                                           : NULL;
    int npre = opts && opts->preload_classes ? opts->n_preload
               : opts && opts->map_opts      ? opts->map_opts->n_no_split
                                             : 0;
    if (npre > 0) {
        d->preload = accel_calloc((size_t)npre, sizeof(char *));
        if (!d->preload) goto fail;
        for (int i = 0; i < npre; i++) {
            d->preload[i] = accel_strdup(pre[i]);
            if (!d->preload[i]) goto fail;
            d->n_preload++;
        }
    }
    d->ck = accel_checkpoint_open(checkpoint);
    if (!d->ck) goto fail;
    if (accel__untie_stored_twice(root, d->ck, opts, pl) != ACCEL_OK) goto fail;
    sd = accel_module_state_dict(root);
    if (!sd) goto fail;
    plans = accel_calloc((size_t)sd->n + 1, sizeof *plans);
    plan_of = accel_calloc((size_t)sd->n + 1, sizeof *plan_of);
    d->placed = accel_calloc((size_t)sd->n + 1, sizeof *d->placed);
    if (!plans || !plan_of || !d->placed) goto fail;
    int np = 0;
    if (make_plans(d, sd, d->map, opts && opts->offload_cpu, plans, &np, plan_of) != ACCEL_OK) goto fail;
    st = load_all(d, checkpoint, sd, plans, plan_of, np, opts, pl);
    if (st != ACCEL_OK) goto fail;
    /* Shards that no disk-offloaded weight reads from are unmapped now. */
    for (int s = 0; s < accel_checkpoint_num_shards(d->ck); s++) {
        bool used = false;
        for (int i = 0; i < d->n_off && !used; i++)
            used = d->off[i].kind == ACCEL__OFF_DISK && accel_checkpoint_shard_of(d->ck, d->off[i].name) == s;
        if (!used) accel_checkpoint_release_shard(d->ck, s);
    }
    accel_free(plans);
    accel_free(plan_of);
    accel_state_dict_free(sd);
    return d;
fail:
    accel_free(plans);
    accel_free(plan_of);
    accel_state_dict_free(sd);
    accel_dispatched_free(d);
    return NULL;
}
