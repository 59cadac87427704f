/* src/bigmodel/infer.c — infer_auto_device_map, fallback_allocate,
 * get_balanced_memory and the device_map strings (accelerate/utils/modeling.py's infer_auto_device_map and get_balanced_memory).
 *
 * A line-by-line port of accelerate.utils.modeling, quirks included (the tied
 * group test `name + "." in k + "."` is a substring test upstream, kept so the
 * maps match). One deliberate difference: a tied parameter that is itself an
 * item of the work list (its module was split) is matched by equality, where
 * upstream raises IndexError. */
#include <stdlib.h>
#include <string.h>

#include "accel/bigmodel.h"
#include "bigmodel/bigmodel_internal.h"

#define INF_SIZE INT64_MAX

typedef struct ctx {
    const accel_device_map_opts *o;
    accel_module_sizes *sizes;
    accel_tied_params *tied;
} ctx;

/* `name + "." in k + "."` (Python substring test) */
static bool in_module(const char *name, const char *k) {
    size_t a = strlen(name), b = strlen(k);
    char *nd = accel_malloc(a + 2), *kd = accel_malloc(b + 2);
    bool r = false;
    if (nd && kd) {
        memcpy(nd, name, a);
        memcpy(nd + a, ".", 2);
        memcpy(kd, k, b);
        memcpy(kd + b, ".", 2);
        r = strstr(kd, nd) != NULL;
    }
    accel_free(nd);
    accel_free(kd);
    return r;
}

/* tied_params: members outside `name` of the groups partly inside it. Borrowed names. */
static int tied_outside(const ctx *c, const char *name, const char **out, int cap) {
    int n = 0;
    for (int g = 0; g < c->tied->n_groups; g++) {
        int inside = 0, sz = c->tied->group_size[g];
        for (int i = 0; i < sz; i++) inside += in_module(name, c->tied->groups[g][i]);
        if (inside == 0 || inside == sz) continue;
        for (int i = 0; i < sz && n < cap; i++)
            if (!in_module(name, c->tied->groups[g][i])) out[n++] = c->tied->groups[g][i];
    }
    return n;
}

static int tied_count(const ctx *c) {
    int n = 0;
    for (int g = 0; g < c->tied->n_groups; g++) n += c->tied->group_size[g];
    return n;
}

/* get_module_size_with_ties: tied_idx[i] = work index of the item holding tied[i] (-1 none). */
static int64_t size_with_ties(const ctx *c, const char **tied, int n_tied, int64_t size, const accel__work *w,
                              int *tied_idx) {
    for (int i = 0; i < n_tied; i++) {
        tied_idx[i] = -1;
        size_t tl = strlen(tied[i]);
        for (int j = 0; j < w->n && tied_idx[i] < 0; j++) {
            const char *n = w->items[j].name;
            size_t nl = strlen(n);
            if ((nl < tl && strncmp(tied[i], n, nl) == 0 && tied[i][nl] == '.') || strcmp(n, tied[i]) == 0)
                tied_idx[i] = j;
        }
        if (tied_idx[i] >= 0)
            size += accel_module_sizes_get(c->sizes, w->items[tied_idx[i]].name) -
                    accel_module_sizes_get(c->sizes, tied[i]);
    }
    return size;
}

static accel_status work_copy(const accel__work *src, accel__work *dst) {
    *dst = (accel__work){0};
    for (int i = 0; i < src->n; i++)
        if (accel__work_insert(dst, i, NULL, src->items[i].name, src->items[i].mod, src->items[i].t))
            return ACCEL_ERR_OOM;
    return ACCEL_OK;
}

/* Replaces item `at` by its direct params and children (Accelerate's split). */
static accel_status split_at(accel__work *w, int at) {
    accel__work_item it;
    accel__work_remove(w, at, &it);
    int k = accel__work_expand(w, at, it.name, it.mod, true, false);
    accel_free(it.name);
    return k < 0 ? ACCEL_ERR_OOM : ACCEL_OK;
}

/* fallback_allocate: BFS for a module fitting in limit. On success, *w is the
 * remaining list and *found the module (name owned by the caller). */
static bool fallback_allocate(const ctx *c, accel__work *w, int64_t limit, accel__work_item *found,
                              accel_status *st) {
    if (limit < 0) return false;
    accel__work search;
    if ((*st = work_copy(w, &search))) return false;
    int cap = tied_count(c) + 1;
    const char **tied = accel_malloc(sizeof(char *) * (size_t)cap);
    int *tied_idx = accel_malloc(sizeof(int) * (size_t)cap);
    char *hit = NULL;
    while (search.n > 0 && tied && tied_idx && !hit) {
        accel__work_item it;
        accel__work_remove(&search, 0, &it);
        int nt = tied_outside(c, it.name, tied, cap);
        int64_t s = size_with_ties(c, tied, nt, accel_module_sizes_get(c->sizes, it.name), &search, tied_idx);
        if (s <= limit) {
            hit = it.name;
            break;
        }
        if (it.mod && it.mod->n_children > 0 && !accel__in_no_split(it.mod, c->o->no_split, c->o->n_no_split) &&
            accel__work_expand(&search, 0, it.name, it.mod, true, false) < 0)
            *st = ACCEL_ERR_OOM;
        accel_free(it.name);
        if (*st) break;
    }
    accel_free(tied);
    accel_free(tied_idx);
    accel__work_free(&search);
    if (!hit) return false;
    /* expand every ancestor of hit present in the list, outermost first */
    for (char *p = hit; *p && !*st; p++) {
        if (*p != '.') continue;
        *p = 0;
        int idx = accel__work_find(w, hit);
        if (idx >= 0 && w->items[idx].mod) *st = split_at(w, idx);
        *p = '.';
    }
    int idx = *st ? -1 : accel__work_find(w, hit);
    accel_free(hit);
    if (idx < 0) return false;
    accel__work_remove(w, idx, found);
    return true;
}

typedef struct devstate {
    int n;
    char dev[ACCEL_MAX_MEMORY_DEVICES + 1][24];
    int64_t max[ACCEL_MAX_MEMORY_DEVICES + 1]; /* INF_SIZE for disk */
    int64_t used[ACCEL_MAX_MEMORY_DEVICES + 1];
    int64_t buffers[ACCEL_MAX_MEMORY_DEVICES + 1];
    int64_t min_needed[ACCEL_MAX_MEMORY_DEVICES + 1]; /* -1: got something */
    bool main[ACCEL_MAX_MEMORY_DEVICES + 1];
} devstate;

static int dev_index(const devstate *d, const char *name) {
    for (int i = 0; i < d->n; i++)
        if (strcmp(d->dev[i], name) == 0) return i;
    return -1;
}

static accel_status recompute_max(const ctx *c, const accel__work *w, int64_t *max, char ***names, int *n) {
    accel_free_names(*names, *n);
    *names = NULL;
    *n = 0;
    return accel__max_layer_size(w, true, c->sizes, c->o->no_split, c->o->n_no_split, max, names, n);
}

static void final_messages(const ctx *c, const devstate *d, bool any_gpu) {
    int cpu = dev_index(d, "cpu"), disk = dev_index(d, "disk");
    int64_t non_gpu = (cpu >= 0 ? d->buffers[cpu] : 0) + (disk >= 0 ? d->buffers[disk] : 0);
    if (non_gpu > 0 && !c->o->offload_buffers && any_gpu) {
        bool fits = false;
        for (int i = 0; i < d->n && !fits; i++)
            if (strcmp(d->dev[i], "cpu") && strcmp(d->dev[i], "disk"))
                fits = d->max[i] >= non_gpu + d->used[i];
        if (!fits)
            accel__bm_log(c->o, true,
                          "Current model requires %lld bytes of buffer for offloaded layers, which seems does "
                          "not fit any GPU's remaining memory. If you are experiencing a OOM later, please "
                          "consider using offload_buffers=True.",
                          (long long)non_gpu);
    }
    for (int i = 0; i < d->n; i++)
        if (d->min_needed[i] >= 0)
            accel__bm_log(c->o, false,
                          "no modules could be assigned to device %s due to insufficient memory: %lld bytes "
                          "required (specific to this allocation attempt)",
                          d->dev[i], (long long)d->min_needed[i]);
}

accel_device_map *accel_infer_auto_device_map(accel_module *root, const accel_max_memory *max_memory,
                                              const accel_device_map_opts *opts) {
    static const accel_device_map_opts defaults = {0};
    ctx c = {opts ? opts : &defaults, NULL, NULL};
    const accel_device_map_opts *o = c.o;
    accel_max_memory mm;
    if (!root) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_infer_auto_device_map: model is NULL");
        return NULL;
    }
    if (accel_get_max_memory(max_memory, &mm)) return NULL;
    devstate d = {0};
    bool any_gpu = false;
    for (int i = 0; i < mm.n; i++) {
        snprintf(d.dev[d.n], sizeof d.dev[0], "%s", mm.e[i].device);
        d.max[d.n++] = strcmp(mm.e[i].device, "disk") == 0 ? INF_SIZE : mm.e[i].bytes;
    }
    if (dev_index(&d, "disk") < 0) {
        snprintf(d.dev[d.n], sizeof d.dev[0], "disk");
        d.max[d.n++] = INF_SIZE;
    }
    /* disk has no budget even when given one */
    d.max[dev_index(&d, "disk")] = INF_SIZE;
    for (int i = 0; i < d.n; i++) {
        d.min_needed[i] = -1;
        bool gpu = strcmp(d.dev[i], "cpu") && strcmp(d.dev[i], "disk");
        if (gpu && !any_gpu) d.main[i] = true;
        any_gpu |= gpu;
    }
    d.main[dev_index(&d, "cpu") >= 0 ? dev_index(&d, "cpu") : 0] |= dev_index(&d, "cpu") >= 0;

    accel__work w = {0};
    accel_device_map *map = accel_device_map_new();
    c.sizes = accel_compute_module_sizes(root, o, false);
    c.tied = accel_find_tied_parameters(root);
    int cap = c.tied ? tied_count(&c) + 1 : 1;
    const char **tied = accel_malloc(sizeof(char *) * (size_t)cap);
    int *tied_idx = accel_malloc(sizeof(int) * (size_t)cap);
    char **max_names = NULL;
    int n_max_names = 0;
    int64_t max_layer = 0;
    accel_status st = (!map || !c.sizes || !c.tied || !tied || !tied_idx) ? ACCEL_ERR_OOM : ACCEL_OK;
    if (!st && accel__work_expand(&w, 0, NULL, root, true, true) < 0) st = ACCEL_ERR_OOM;
    if (!st) st = accel__max_layer_size(&w, false, c.sizes, o->no_split, o->n_no_split, &max_layer, &max_names,
                                        &n_max_names);
    int cur = 0;
    while (!st && w.n > 0) {
        accel__work_item it;
        accel__work_remove(&w, 0, &it);
        const char *name = it.name;
        if (o->verbose) accel__bm_log(o, false, "Treating module %s.", name);
        /* the largest layer may have just been taken */
        int keep = 0;
        for (int i = 0; i < n_max_names; i++) {
            const char *n = max_names[i];
            size_t l = strlen(name);
            if (strcmp(n, name) == 0 || (strncmp(n, name, l) == 0 && n[l] == '.')) accel_free(max_names[i]);
            else max_names[keep++] = max_names[i];
        }
        n_max_names = keep;
        if (n_max_names == 0 && (st = recompute_max(&c, &w, &max_layer, &max_names, &n_max_names))) {
            accel_free(it.name);
            break;
        }
        int64_t size = accel_module_sizes_get(c.sizes, name);
        int nt = tied_outside(&c, name, tied, cap);
        const char *dev = d.dev[cur];
        int64_t cur_max = d.max[cur], reserved = 0;
        if (d.main[cur]) {
            cur_max -= max_layer;
            reserved = max_layer;
        }
        int64_t with_ties = size_with_ties(&c, tied, nt, size, &w, tied_idx);
        bool disk = cur_max == INF_SIZE;

        if (disk || d.used[cur] + with_ties <= cur_max) {
            if (o->verbose)
                accel__bm_log(o, false, "Putting %s (size=%lld) on %s.", name, (long long)with_ties, dev);
            d.used[cur] += with_ties;
            d.min_needed[cur] = -1;
            st = accel_device_map_set(map, name, dev);
            /* tied modules come along; remove them from the work list (highest index first) */
            for (int i = 0; i < nt && !st; i++) {
                if (tied_idx[i] < 0) continue;
                char *tn = accel_strdup(w.items[tied_idx[i]].name);
                if (!tn) { st = ACCEL_ERR_OOM; break; }
                int idx = accel__work_find(&w, tn);
                if (idx >= 0) {
                    accel__work_remove(&w, idx, NULL);
                    for (int j = 0; j < nt; j++)
                        if (tied_idx[j] > idx) tied_idx[j]--;
                        else if (tied_idx[j] == idx && j != i) tied_idx[j] = -1;
                }
                st = accel_device_map_set(map, tn, dev);
                accel_free(tn);
            }
            if (!st && !o->offload_buffers && it.mod)
                d.buffers[cur] += accel_module_total_buffer_size(it.mod, o);
            accel_free(it.name);
            continue;
        }
        /* the module fits alone: try splitting a tied module */
        if (nt > 0 && d.used[cur] + size <= cur_max) {
            bool split = false;
            for (int i = 0; i < nt && !split; i++) {
                if (tied_idx[i] < 0) continue;
                accel__work_item *tm = &w.items[tied_idx[i]];
                if (!tm->mod || tm->mod->n_children == 0 || accel__in_no_split(tm->mod, o->no_split, o->n_no_split))
                    continue;
                if (o->verbose) accel__bm_log(o, false, "Splitting %s.", tm->name);
                st = split_at(&w, tied_idx[i]);
                if (!st) st = accel__work_insert(&w, 0, NULL, it.name, it.mod, it.t);
                if (!st) st = recompute_max(&c, &w, &max_layer, &max_names, &n_max_names);
                split = true;
            }
            if (split) {
                accel_free(it.name);
                continue;
            }
        }
        /* the module itself does not fit: split it or go to the next device */
        if (d.used[cur] + size >= cur_max) {
            if (it.mod && it.mod->n_children > 0 && !accel__in_no_split(it.mod, o->no_split, o->n_no_split)) {
                if (o->verbose) accel__bm_log(o, false, "Splitting %s.", name);
                if (accel__work_expand(&w, 0, name, it.mod, true, false) < 0) st = ACCEL_ERR_OOM;
                if (!st) st = recompute_max(&c, &w, &max_layer, &max_names, &n_max_names);
                accel_free(it.name);
                continue;
            }
        }
        if (d.used[cur] == 0 && o->fallback_allocation && !disk) {
            int64_t limit = d.max[cur] - (max_layer > with_ties ? max_layer : with_ties);
            accel__work_item fb;
            if (fallback_allocate(&c, &w, limit - d.used[cur], &fb, &st)) {
                st = accel__work_insert(&w, 0, NULL, it.name, it.mod, it.t);
                if (!st) st = accel__work_insert(&w, 0, NULL, fb.name, fb.mod, fb.t);
                accel_free(fb.name);
                accel_free(it.name);
                continue;
            }
            if (st) {
                accel_free(it.name);
                break;
            }
        }
        if (d.used[cur] == 0) d.min_needed[cur] = with_ties + reserved;
        d.used[cur] += reserved;
        if (o->verbose) accel__bm_log(o, false, "Not enough space on %s for %s, moving on.", dev, name);
        cur++;
        st = accel__work_insert(&w, 0, NULL, it.name, it.mod, it.t);
        accel_free(it.name);
    }
    if (!st && !o->keep_raw) accel_clean_device_map(map);
    if (!st) final_messages(&c, &d, any_gpu);
    accel_free_names(max_names, n_max_names);
    accel_free(tied);
    accel_free(tied_idx);
    accel__work_free(&w);
    accel_module_sizes_free(c.sizes);
    accel_tied_params_free(c.tied);
    if (st) {
        accel_set_error(st, "accel_infer_auto_device_map: out of memory");
        accel_device_map_free(map);
        return NULL;
    }
    return map;
}

/* ------------------------------------------------------------ balanced memory */

static bool is_leaf(const accel_module_sizes *s, const bool *removed, int i) {
    /* get_module_leaves: no other (kept) name has it as its parent */
    size_t l = strlen(s->names[i]);
    for (int j = 0; j < s->n; j++) {
        if (removed && removed[j]) continue;
        const char *n = s->names[j];
        const char *dot = strrchr(n, '.');
        if (dot && (size_t)(dot - n) == l && strncmp(n, s->names[i], l) == 0) return false;
    }
    return true;
}

accel_status accel_get_balanced_memory(accel_module *root, const accel_max_memory *max_memory,
                                       const accel_device_map_opts *opts, bool low_zero,
                                       accel_max_memory *out) {
    static const accel_device_map_opts defaults = {0};
    const accel_device_map_opts *o = opts ? opts : &defaults;
    if (!root || !out) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_get_balanced_memory: NULL argument");
    accel_max_memory mm;
    if (accel_get_max_memory(max_memory, &mm)) return accel_last_status();
    int num = 0;
    for (int i = 0; i < mm.n; i++) num += accel__is_gpu_key(mm.e[i].device) && mm.e[i].bytes > 0;
    if (num == 0) {
        *out = mm;
        return ACCEL_OK;
    }
    if (num == 1) {
        low_zero = false;
        for (int i = 0; !max_memory && i < mm.n; i++)
            if (accel__is_gpu_key(mm.e[i].device)) {
                mm.e[i].bytes = (int64_t)((double)mm.e[i].bytes * 0.9);
                break;
            }
    }
    accel_module_sizes *s = accel_compute_module_sizes(root, o, false);
    bool *removed = s ? accel_calloc((size_t)s->n + 1, sizeof(bool)) : NULL;
    if (!removed) {
        accel_module_sizes_free(s);
        return accel_last_status();
    }
    int64_t total = accel_module_sizes_get(s, "");
    int64_t per_gpu = total / (low_zero ? num - 1 : num);
    /* the first module of each no_split class, in size-table order */
    int64_t buffer = 0;
    int found = 0;
    char *seen = accel_calloc((size_t)o->n_no_split + 1, 1);
    for (int i = 1; seen && i < s->n && found < o->n_no_split; i++) {
        accel_module *m = accel_module_find(root, s->names[i]);
        char buf[1024];
        if (!m || strcmp(accel_module_path(m, buf, sizeof buf), s->names[i]) != 0) continue;
        for (int k = 0; k < o->n_no_split; k++)
            if (!seen[k] && strcmp(m->ops->type_name, o->no_split[k]) == 0) {
                /* a class listed twice counts once */
                for (int j = 0; j < o->n_no_split; j++)
                    if (strcmp(o->no_split[j], o->no_split[k]) == 0 && !seen[j]) {
                        seen[j] = 1;
                        found++;
                    }
                if (s->bytes[i] > buffer) buffer = s->bytes[i];
            }
    }
    accel_free(seen);
    /* mean size of the "final modules": leaves once parameter leaves are removed */
    for (int i = 1; i < s->n; i++) removed[i] = is_leaf(s, NULL, i);
    int64_t sum = 0;
    int n_leaves = 0;
    for (int i = 1; i < s->n; i++)
        if (!removed[i] && is_leaf(s, removed, i)) {
            sum += s->bytes[i];
            n_leaves++;
        }
    int64_t mean = (int64_t)((double)sum / (n_leaves > 0 ? n_leaves : 1));
    buffer = (int64_t)(1.25 * (double)(buffer > mean ? buffer : mean));
    per_gpu += buffer;
    accel_free(removed);
    accel_module_sizes_free(s);

    int gpu_idx[ACCEL_MAX_MEMORY_DEVICES], ng = 0; /* mm is already sorted */
    for (int i = 0; i < mm.n; i++)
        if (accel__is_gpu_key(mm.e[i].device) && mm.e[i].bytes > 0) gpu_idx[ng++] = i;
    int zero = -1;
    for (int i = 0; i < mm.n; i++)
        if (strcmp(mm.e[i].device, "0") == 0) zero = i;
    for (int k = 0; k < ng - 1; k++) {
        int i = gpu_idx[k];
        int64_t cap = (low_zero && i == zero) ? mm.e[zero].bytes : per_gpu;
        if (cap < mm.e[i].bytes) mm.e[i].bytes = cap;
    }
    if (low_zero) {
        int64_t others = 0;
        for (int k = 1; k < num; k++) {
            char key[16];
            snprintf(key, sizeof key, "%d", k);
            int64_t v = accel_max_memory_get(&mm, key);
            if (v > 0) others += v;
        }
        int64_t min_zero = total - others > 0 ? total - others : 0;
        if (zero >= 0 && min_zero < mm.e[zero].bytes) mm.e[zero].bytes = min_zero;
    }
    *out = mm;
    return ACCEL_OK;
}

accel_device_map *accel_device_map_from_string(accel_module *root, const char *strategy,
                                               const accel_max_memory *max_memory,
                                               const accel_device_map_opts *opts) {
    if (!strategy || (strcmp(strategy, "auto") && strcmp(strategy, "balanced") &&
                      strcmp(strategy, "balanced_low_0") && strcmp(strategy, "sequential"))) {
        accel_set_error(ACCEL_ERR_INVALID_ARG,
                        "If passing a string for `device_map`, please choose 'auto', 'balanced', "
                        "'balanced_low_0' or 'sequential' (got '%s').",
                        strategy ? strategy : "(null)");
        return NULL;
    }
    accel_max_memory mm;
    if (strcmp(strategy, "sequential") == 0) {
        if (accel_get_max_memory(max_memory, &mm)) return NULL;
    } else if (accel_get_balanced_memory(root, max_memory, opts, strcmp(strategy, "balanced_low_0") == 0, &mm)) {
        return NULL;
    }
    return accel_infer_auto_device_map(root, &mm, opts);
}
