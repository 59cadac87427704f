/* src/bigmodel/sizes.c — module sizes, largest layer, tied parameters
 * (accelerate.utils.modeling: compute_module_sizes, get_max_layer_size,
 * find_tied_parameters). Shapes and dtypes only: works on meta models. */
#include <stdlib.h>
#include <string.h>

#include "accel/bigmodel.h"
#include "bigmodel/bigmodel_internal.h"

/* ------------------------------------------------------------ name -> size table */

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static int sizes_slot(const accel_module_sizes *s, const char *name) {
    uint64_t h = hash_str(name);
    for (int i = 0;; i++) {
        int slot = (int)((h + (uint64_t)i) & (uint64_t)(s->hash_cap - 1));
        if (s->hash[slot] < 0 || strcmp(s->names[s->hash[slot]], name) == 0) return slot;
    }
}

static accel_status sizes_grow(accel_module_sizes *s) {
    int cap = s->cap ? s->cap * 2 : 64;
    char **names = accel_malloc(sizeof(char *) * (size_t)cap);
    int64_t *bytes = accel_malloc(sizeof(int64_t) * (size_t)cap);
    int *hash = accel_malloc(sizeof(int) * (size_t)cap * 2);
    if (!names || !bytes || !hash) {
        accel_free(names);
        accel_free(bytes);
        accel_free(hash);
        return ACCEL_ERR_OOM;
    }
    if (s->n) {
        memcpy(names, s->names, sizeof(char *) * (size_t)s->n);
        memcpy(bytes, s->bytes, sizeof(int64_t) * (size_t)s->n);
    }
    accel_free(s->names);
    accel_free(s->bytes);
    accel_free(s->hash);
    s->names = names;
    s->bytes = bytes;
    s->hash = hash;
    s->cap = cap;
    s->hash_cap = cap * 2;
    for (int i = 0; i < s->hash_cap; i++) s->hash[i] = -1;
    for (int i = 0; i < s->n; i++) s->hash[sizes_slot(s, s->names[i])] = i;
    return ACCEL_OK;
}

/* Adds `bytes` to the entry `name` (len chars of it), creating it.
 * ACCEL_ERR_OOM, or ACCEL_ERR_SHAPE when the sum passes int64. */
static accel_status sizes_add(accel_module_sizes *s, const char *name, size_t len, int64_t bytes) {
    char stackbuf[256];
    char *key = len < sizeof stackbuf ? stackbuf : accel_malloc(len + 1);
    if (!key) return ACCEL_ERR_OOM;
    memcpy(key, name, len);
    key[len] = 0;
    accel_status st = ACCEL_OK;
    if (s->n + 1 > s->cap) st = sizes_grow(s);
    if (!st) {
        int slot = sizes_slot(s, key);
        if (s->hash[slot] >= 0) {
            int64_t *sum = &s->bytes[s->hash[slot]];
            if (__builtin_add_overflow(*sum, bytes, sum)) st = ACCEL_ERR_SHAPE; /* past 2^63 bytes */
        } else {
            s->names[s->n] = accel_strdup(key);
            if (!s->names[s->n]) st = ACCEL_ERR_OOM;
            else {
                s->bytes[s->n] = bytes;
                s->hash[slot] = s->n++;
            }
        }
    }
    if (key != stackbuf) accel_free(key);
    return st;
}

int64_t accel_module_sizes_get(const accel_module_sizes *s, const char *prefix) {
    if (!s || !prefix || s->n == 0) return 0;
    int slot = sizes_slot(s, prefix);
    return s->hash[slot] >= 0 ? s->bytes[s->hash[slot]] : 0;
}

void accel_module_sizes_free(accel_module_sizes *s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++) accel_free(s->names[i]);
    accel_free(s->names);
    accel_free(s->bytes);
    accel_free(s->hash);
    accel_free(s);
}

/* ------------------------------------------------------------ sizes */

static int64_t tensor_size(const accel_tensor *t, const char *name, const accel_device_map_opts *o) {
    int64_t numel = accel_numel(t);
    for (int i = 0; o && i < o->n_special; i++)
        if (strcmp(o->special_dtypes[i].name, name) == 0)
            return numel * (int64_t)accel_dtype_size(o->special_dtypes[i].dtype);
    size_t own = accel_dtype_size(t->dtype);
    if (o && o->has_dtype && accel_dtype_is_float(t->dtype)) {
        size_t target = accel_dtype_size(o->dtype);
        return numel * (int64_t)(target < own ? target : own);
    }
    return numel * (int64_t)own;
}

static accel_status add_tensor(accel_module_sizes *s, const char *name, int64_t size) {
    /* every prefix of the dotted name, "" included */
    accel_status st = sizes_add(s, "", 0, size);
    for (const char *p = name; !st; p++) {
        if (*p == '.' || *p == 0) st = sizes_add(s, name, (size_t)(p - name), size);
        if (*p == 0) break;
    }
    return st;
}

accel_module_sizes *accel_compute_module_sizes(accel_module *root, const accel_device_map_opts *opts,
                                               bool buffers_only) {
    if (!root) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_compute_module_sizes: model is NULL");
        return NULL;
    }
    accel_state_dict *sd = accel_module_state_dict(root);
    accel_module_sizes *s = sd ? accel_calloc(1, sizeof *s) : NULL;
    if (!s) {
        accel_state_dict_free(sd);
        return NULL;
    }
    accel_status st = sizes_grow(s);
    /* named_parameters() then named_buffers(), each without duplicates */
    for (int pass = buffers_only ? 1 : 0; pass < 2 && !st; pass++)
        for (int i = 0; i < sd->n && !st; i++) {
            const accel_state_entry *e = &sd->entries[i];
            if (e->is_tied_alias || e->is_buffer != (pass == 1)) continue;
            st = add_tensor(s, e->name, tensor_size(e->t, e->name, opts));
        }
    accel_state_dict_free(sd);
    if (st) {
        if (st == ACCEL_ERR_SHAPE)
            accel_set_error(st, "accel_compute_module_sizes: the model's tensors take more than 2^63 bytes");
        else
            accel_set_error(ACCEL_ERR_OOM, "accel_compute_module_sizes: out of memory");
        accel_module_sizes_free(s);
        return NULL;
    }
    return s;
}

int64_t accel_module_total_buffer_size(accel_module *root, const accel_device_map_opts *opts) {
    accel_module_sizes *s = accel_compute_module_sizes(root, opts, true);
    int64_t v = accel_module_sizes_get(s, "");
    accel_module_sizes_free(s);
    return v;
}

/* ------------------------------------------------------------ work lists */

void accel__work_free(accel__work *w) {
    for (int i = 0; i < w->n; i++) accel_free(w->items[i].name);
    accel_free(w->items);
    memset(w, 0, sizeof *w);
}

accel_status accel__work_insert(accel__work *w, int at, const char *prefix, const char *local,
                                accel_module *m, accel_tensor *t) {
    if (w->n + 1 > w->cap) {
        int cap = w->cap ? w->cap * 2 : 16;
        accel__work_item *it = accel_malloc(sizeof *it * (size_t)cap);
        if (!it) return ACCEL_ERR_OOM;
        if (w->n) memcpy(it, w->items, sizeof *it * (size_t)w->n);
        accel_free(w->items);
        w->items = it;
        w->cap = cap;
    }
    size_t a = prefix ? strlen(prefix) : 0, b = strlen(local);
    char *name = accel_malloc(a + b + 2);
    if (!name) return ACCEL_ERR_OOM;
    if (a) {
        memcpy(name, prefix, a);
        name[a++] = '.';
    }
    memcpy(name + a, local, b + 1);
    memmove(&w->items[at + 1], &w->items[at], sizeof(accel__work_item) * (size_t)(w->n - at));
    w->items[at] = (accel__work_item){name, m, t};
    w->n++;
    return ACCEL_OK;
}

void accel__work_remove(accel__work *w, int at, accel__work_item *out) {
    if (out) *out = w->items[at];
    else accel_free(w->items[at].name);
    memmove(&w->items[at], &w->items[at + 1], sizeof(accel__work_item) * (size_t)(w->n - at - 1));
    w->n--;
}

int accel__work_find(const accel__work *w, const char *name) {
    for (int i = 0; i < w->n; i++)
        if (strcmp(w->items[i].name, name) == 0) return i;
    return -1;
}

/* Inserts at `at` the direct params (if params), children, and buffers (if
 * buffers) of m, named under prefix. Returns the number inserted, -1 on OOM. */
int accel__work_expand(accel__work *w, int at, const char *prefix, accel_module *m, bool params,
                       bool buffers) {
    int k = at;
    for (int i = 0; params && i < m->n_tensors; i++)
        if (!m->tensors[i].is_buffer &&
            accel__work_insert(w, k++, prefix, m->tensors[i].name, NULL, m->tensors[i].t))
            return -1;
    for (int i = 0; i < m->n_children; i++)
        if (accel__work_insert(w, k++, prefix, m->children[i]->name, m->children[i], NULL)) return -1;
    for (int i = 0; buffers && i < m->n_tensors; i++)
        if (m->tensors[i].is_buffer &&
            accel__work_insert(w, k++, prefix, m->tensors[i].name, NULL, m->tensors[i].t))
            return -1;
    return k - at;
}

bool accel__in_no_split(const accel_module *m, const char *const *no_split, int n) {
    for (int i = 0; m && i < n; i++)
        if (no_split[i] && strcmp(m->ops->type_name, no_split[i]) == 0) return true;
    return false;
}

/* ------------------------------------------------------------ largest layer */

void accel_free_names(char **names, int n) {
    for (int i = 0; names && i < n; i++) accel_free(names[i]);
    accel_free(names);
}

accel_status accel__max_layer_size(const accel__work *start, bool modules_only, const accel_module_sizes *sizes,
                                   const char *const *no_split, int n_no_split, int64_t *max_out,
                                   char ***names, int *n_names) {
    /* depth first, in order: a stack (next item last), so that a ModuleList of
     * N layers costs O(N), not the O(N^2) of taking items off the front */
    accel__work todo = {0};
    accel_status st = ACCEL_OK;
    for (int i = start->n - 1; i >= 0 && !st; i--)
        if (!modules_only || start->items[i].mod)
            st = accel__work_insert(&todo, todo.n, NULL, start->items[i].name, start->items[i].mod,
                                    start->items[i].t);
    int64_t max = 0;
    int n = 0, cap = 0;
    char **out = NULL;
    while (todo.n > 0 && !st) {
        accel__work_item it;
        accel__work_remove(&todo, todo.n - 1, &it);
        accel_module *m = it.mod;
        if (!m || m->n_children == 0 || accel__in_no_split(m, no_split, n_no_split)) {
            int64_t size = accel_module_sizes_get(sizes, it.name);
            if (size > max) {
                max = size;
                for (int i = 0; i < n; i++) accel_free(out[i]);
                n = 0;
            }
            if (size == max) {
                if (n + 1 > cap) {
                    cap = cap ? cap * 2 : 8;
                    char **o = accel_malloc(sizeof(char *) * (size_t)cap);
                    if (!o) {
                        st = ACCEL_ERR_OOM;
                        accel_free(it.name);
                        break;
                    }
                    if (n) memcpy(o, out, sizeof(char *) * (size_t)n);
                    accel_free(out);
                    out = o;
                }
                out[n++] = it.name;
                it.name = NULL;
            }
        } else {
            /* children next, in order (params and buffers are not descended into) */
            for (int i = m->n_children - 1; i >= 0 && !st; i--)
                st = accel__work_insert(&todo, todo.n, it.name, m->children[i]->name, m->children[i], NULL);
        }
        accel_free(it.name);
    }
    accel__work_free(&todo);
    if (st) {
        accel_free_names(out, n);
        return accel_set_error(ACCEL_ERR_OOM, "get_max_layer_size: out of memory");
    }
    *max_out = max;
    if (names) {
        *names = out;
        *n_names = n;
    } else {
        accel_free_names(out, n);
    }
    return ACCEL_OK;
}

int64_t accel_get_max_layer_size(accel_module *root, const accel_module_sizes *sizes,
                                 const char *const *no_split, int n_no_split, char ***names, int *n_names) {
    if (!root || !sizes) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_get_max_layer_size: %s is NULL", root ? "sizes" : "root");
        return -1;
    }
    accel__work w = {0};
    int64_t max = -1;
    if (accel__work_expand(&w, 0, NULL, root, true, true) < 0) {
        accel_set_error(ACCEL_ERR_OOM, "accel_get_max_layer_size: out of memory");
    } else if (accel__max_layer_size(&w, false, sizes, no_split, n_no_split, &max, names, n_names)) {
        max = -1;
    }
    accel__work_free(&w);
    return max;
}

accel_status accel_calculate_maximum_sizes(accel_module *root, const char *const *no_split, int n_no_split,
                                           int64_t *total, int64_t *largest_layer) {
    if (!total || !largest_layer)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_calculate_maximum_sizes: output pointer is NULL");
    accel_module_sizes *s = accel_compute_module_sizes(root, NULL, false);
    if (!s) return accel_last_status();
    *total = accel_module_sizes_get(s, "");
    *largest_layer = accel_get_max_layer_size(root, s, no_split, n_no_split, NULL, NULL);
    accel_module_sizes_free(s);
    return *largest_layer < 0 ? accel_last_status() : ACCEL_OK;
}

/* ------------------------------------------------------------ tied parameters */

void accel_tied_params_free(accel_tied_params *tp) {
    if (!tp) return;
    for (int g = 0; g < tp->n_groups; g++) accel_free_names(tp->groups[g], tp->group_size[g]);
    accel_free(tp->groups);
    accel_free(tp->group_size);
    accel_free(tp);
}

static int cmp_cstr(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }
static int cmp_group(const void *a, const void *b) {
    return strcmp((*(char **const *)a)[0], (*(char **const *)b)[0]);
}

accel_tied_params *accel_find_tied_parameters(accel_module *root) {
    accel_state_dict *sd = accel_module_state_dict(root);
    if (!sd) return NULL;
    accel_tied_params *tp = accel_calloc(1, sizeof *tp);
    int n = sd->n;
    int *group_of = accel_malloc(sizeof(int) * ((size_t)n + 1));
    int *sizes = accel_calloc((size_t)n + 1, sizeof(int));
    bool ok = tp && group_of && sizes;
    /* a parameter listed as an alias joins the group of its first name */
    int ng = 0;
    for (int i = 0; ok && i < n; i++) {
        group_of[i] = -1;
        const accel_state_entry *e = &sd->entries[i];
        if (e->is_buffer || !e->is_tied_alias) continue;
        int first = -1;
        for (int j = 0; j < i && first < 0; j++)
            if (sd->entries[j].t == e->t && !sd->entries[j].is_buffer) first = j;
        if (first < 0) continue;
        if (group_of[first] < 0) {
            group_of[first] = ng++;
            sizes[group_of[first]] = 1;
        }
        group_of[i] = group_of[first];
        sizes[group_of[i]]++;
    }
    if (ok && ng > 0) {
        tp->groups = accel_calloc((size_t)ng, sizeof(char **));
        tp->group_size = accel_calloc((size_t)ng, sizeof(int));
        ok = tp->groups && tp->group_size;
        for (int g = 0; ok && g < ng; g++) {
            tp->groups[g] = accel_calloc((size_t)sizes[g], sizeof(char *));
            ok = tp->groups[g] != NULL;
            tp->n_groups = g + 1;
        }
        for (int i = 0; ok && i < n; i++) {
            if (group_of[i] < 0) continue;
            int g = group_of[i];
            char *s = accel_strdup(sd->entries[i].name);
            if (!s) ok = false;
            else tp->groups[g][tp->group_size[g]++] = s;
        }
        for (int g = 0; ok && g < ng; g++)
            qsort(tp->groups[g], (size_t)tp->group_size[g], sizeof(char *), cmp_cstr);
        if (ok) {
            /* keep group_size aligned with groups while sorting: sort pairs */
            for (int g = 0; g < ng; g++)
                for (int h = g + 1; h < ng; h++)
                    if (cmp_group(&tp->groups[h], &tp->groups[g]) < 0) {
                        char **tg = tp->groups[g];
                        tp->groups[g] = tp->groups[h];
                        tp->groups[h] = tg;
                        int ts = tp->group_size[g];
                        tp->group_size[g] = tp->group_size[h];
                        tp->group_size[h] = ts;
                    }
        }
    }
    accel_free(group_of);
    accel_free(sizes);
    accel_state_dict_free(sd);
    if (!ok) {
        accel_tied_params_free(tp);
        accel_set_error(ACCEL_ERR_OOM, "find_tied_parameters: out of memory");
        return NULL;
    }
    return tp;
}
