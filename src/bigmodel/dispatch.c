/* src/bigmodel/dispatch.c — dispatch_model and load_checkpoint_and_dispatch
 * (accelerate/big_modeling.py's load_checkpoint_and_dispatch and dispatch_model, accelerate/hooks.py): one accel_module_hook per module that needs one.
 *
 * A hook (Accelerate's AlignDevicesHook) does, around its module's forward:
 *   pre:  remember the input's device (root only: io_same_device), bring in
 *         the module's offloaded weights (offload.c), move the input to the
 *         execution device;
 *   post: drop the weights (params back to meta), move the output back to
 *         the input's device (root only).
 * Every module below a map entry (down to the next entry) has a hook
 * moving its input to the entry's execution device. Which module carries
 * an offloaded weight: the outermost module of a
 * preload class (default: the no_split classes, e.g. LlamaDecoderLayer) at or
 * below the weight's map entry — its whole block comes in at once — else the
 * module that owns the weight (Accelerate's per-submodule hooks). */
#include <stdio.h>
#include <string.h>

#include "bigmodel/bigmodel_internal.h"
#include "bigmodel/offload_internal.h"

typedef struct hook_ctx {
    accel_dispatched *d;
    accel_device exec;
    bool io_same_device;
    bool have_in;
    accel_device in_dev;
    int n, cap;
    int *idx;               /* offload entries brought in around the forward */
} hook_ctx;

static accel_status hook_pre(accel_module *m, accel_tensor **x, void *ctx) {
    hook_ctx *c = ctx;
    c->have_in = false;
    if (c->io_same_device && x && *x) {
        c->in_dev = (*x)->device;
        c->have_in = true;
    }
    for (int i = 0; i < c->n; i++) {
        if (accel__off_bring_in(c->d, c->idx[i], c->exec) != ACCEL_OK) {
            accel__off_drop(c->d, c->idx, i);
            return accel_last_status();
        }
    }
    if (x && *x && !accel_device_eq((*x)->device, c->exec)) {
        accel_tensor *moved = accel_to_device(*x, c->exec);
        if (!moved) return accel_last_status();
        *x = moved;
    }
    return ACCEL_OK;
}

static accel_status hook_post(accel_module *m, accel_tensor **y, void *ctx) {
    hook_ctx *c = ctx;
    accel__off_drop(c->d, c->idx, c->n);
    if (c->have_in && y && *y && !accel_device_eq((*y)->device, c->in_dev)) {
        accel_tensor *moved = accel_to_device(*y, c->in_dev);
        if (!moved) return accel_last_status();
        *y = moved;
    }
    return ACCEL_OK;
}

static void hook_free(void *ctx) {
    hook_ctx *c = ctx;
    if (!c) return;
    accel_free(c->idx);
    accel_free(c);
}

static bool is_ours(const accel_module *m, const accel_dispatched *d) {
    return m->hook && m->hook->pre_forward == hook_pre && ((hook_ctx *)m->hook->ctx)->d == d;
}

/* The module's hook context, created (replacing any other hook) on first use. */
static hook_ctx *ctx_of(accel_dispatched *d, accel_module *m) {
    if (is_ours(m, d)) return m->hook->ctx;
    if (d->n_hooked == d->cap_hooked) {
        int cap = d->cap_hooked ? d->cap_hooked * 2 : 32;
        accel_module **h = accel_malloc(sizeof *h * (size_t)cap);
        if (!h) return NULL;
        if (d->n_hooked) memcpy(h, d->hooked, sizeof *h * (size_t)d->n_hooked);
        accel_free(d->hooked);
        d->hooked = h;
        d->cap_hooked = cap;
    }
    hook_ctx *c = accel_calloc(1, sizeof *c);
    if (!c) return NULL;
    c->d = d;
    c->exec = d->main;
    accel_module_hook h = {hook_pre, hook_post, hook_free, c};
    if (accel_module_set_hook(m, &h) != ACCEL_OK) {
        hook_free(c);
        return NULL;
    }
    d->hooked[d->n_hooked++] = m;
    return c;
}

static bool is_entry(const accel_device_map *map, const char *name) {
    for (int i = 0; i < map->n; i++)
        if (strcmp(map->e[i].prefix, name) == 0) return true;
    return false;
}

/* m (named name) runs on dv, and so does every module below it down to the
 * next map entry: each one's hook moves its input there (Accelerate's
 * attach_execution_device_hook), so a block whose parent calls its
 * children one by one (a ModuleList's layers, a head's decoder after a
 * transform mapped elsewhere) gets its input where its weights are. */
static accel_status hook_subtree(accel_dispatched *d, accel_module *m, const char *name, accel_device dv) {
    hook_ctx *c = ctx_of(d, m);
    if (!c) return accel_last_status();
    c->exec = dv;
    for (int i = 0; i < m->n_children; i++) {
        size_t n = strlen(name) + strlen(m->children[i]->name) + 2;
        char *child = accel_malloc(n);
        if (!child) return accel_last_status();
        snprintf(child, n, "%s%s%s", name, *name ? "." : "", m->children[i]->name);
        accel_status st = is_entry(d->map, child) ? ACCEL_OK : hook_subtree(d, m->children[i], child, dv);
        accel_free(child);
        if (st != ACCEL_OK) return st;
    }
    return ACCEL_OK;
}

static accel_status ctx_add(hook_ctx *c, int idx) {
    for (int i = 0; i < c->n; i++)
        if (c->idx[i] == idx) return ACCEL_OK;
    if (c->n == c->cap) {
        int cap = c->cap ? c->cap * 2 : 8;
        int *p = accel_malloc(sizeof *p * (size_t)cap);
        if (!p) return accel_last_status();
        if (c->n) memcpy(p, c->idx, sizeof *p * (size_t)c->n);
        accel_free(c->idx);
        c->idx = p;
        c->cap = cap;
    }
    c->idx[c->n++] = idx;
    return ACCEL_OK;
}

static bool covers(const char *prefix, const char *name) {
    size_t n = strlen(prefix);
    return n == 0 || (strncmp(name, prefix, n) == 0 && (name[n] == 0 || name[n] == '.'));
}

static const char *entry_prefix(const accel_device_map *map, const char *name) {
    const char *best = NULL;
    for (int i = 0; i < map->n; i++)
        if (covers(map->e[i].prefix, name) && (!best || strlen(map->e[i].prefix) > strlen(best)))
            best = map->e[i].prefix;
    return best;
}

static bool is_preload(const accel_dispatched *d, const accel_module *m) {
    for (int i = 0; i < d->n_preload; i++)
        if (strcmp(d->preload[i], m->ops->type_name) == 0) return true;
    return false;
}

static accel_module *child_named(accel_module *m, const char *name, size_t len) {
    for (int i = 0; i < m->n_children; i++)
        if (strlen(m->children[i]->name) == len && strncmp(m->children[i]->name, name, len) == 0)
            return m->children[i];
    return NULL;
}

/* The module whose hook brings in the tensor `name` (see the file comment). */
static accel_module *unit_for(accel_dispatched *d, accel_module *root, const char *name) {
    const char *prefix = entry_prefix(d->map, name);
    accel_module *m = root;
    const char *rest = name;
    /* descend to the map entry's module (a tensor-name entry stops at its owner) */
    size_t plen = prefix ? strlen(prefix) : 0;
    while (m && (size_t)(rest - name) < plen) {
        const char *dot = strchr(rest, '.');
        if (!dot) break;
        accel_module *c = child_named(m, rest, (size_t)(dot - rest));
        if (!c) break;
        m = c;
        rest = dot + 1;
    }
    for (;;) {
        if (is_preload(d, m)) return m;
        const char *dot = strchr(rest, '.');
        if (!dot) return m;
        accel_module *c = child_named(m, rest, (size_t)(dot - rest));
        if (!c) return m;
        m = c;
        rest = dot + 1;
    }
}

accel_status accel_dispatch_model(accel_module *root, accel_dispatched *d) {
    if (!root || !d) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_dispatch_model: NULL argument");
    bool one_device = d->n_off == 0;
    for (int i = 0; i < d->map->n && one_device; i++) {
        accel_device dv;
        one_device = accel_device_map_device(d->map->e[i].device, &dv) == ACCEL_OK &&
                     accel_device_eq(dv, d->main);
    }
    accel_clear_error();
    if (one_device) return ACCEL_OK; /* Accelerate: model.to(device), no hooks */
    /* every entry's modules run on its device, main included (the block
     * before may have run elsewhere): inputs move there; disk entries, and
     * cpu entries while main is another device (host copies), run on main,
     * their weights brought in by the offload hooks below */
    for (int i = 0; i < d->map->n; i++) {
        accel_device dv;
        if (accel_device_map_device(d->map->e[i].device, &dv) != ACCEL_OK ||
            (dv.type == ACCEL_DEV_CPU && d->main.type != ACCEL_DEV_CPU))
            dv = d->main;
        accel_clear_error();
        accel_module *m = accel_module_find(root, d->map->e[i].prefix);
        accel_clear_error();
        if (m && hook_subtree(d, m, d->map->e[i].prefix, dv) != ACCEL_OK) return accel_last_status();
    }
    accel_state_dict *sd = accel_module_state_dict(root);
    if (!sd) return accel_last_status();
    accel_status st = ACCEL_OK;
    for (int i = 0; i < sd->n && st == ACCEL_OK; i++) {
        int idx = accel__off_find(d, sd->entries[i].t);
        if (idx < 0) continue;
        hook_ctx *c = ctx_of(d, unit_for(d, root, sd->entries[i].name));
        st = c ? ctx_add(c, idx) : accel_last_status();
    }
    accel_state_dict_free(sd);
    if (st != ACCEL_OK) return st;
    hook_ctx *c = ctx_of(d, root);
    if (!c) return accel_last_status();
    c->io_same_device = true;
    return ACCEL_OK;
}

accel_dispatched *accel_load_checkpoint_and_dispatch(accel_module *root, const char *checkpoint,
                                                     const accel_device_map *map, const char *strategy,
                                                     const accel_max_memory *max_memory,
                                                     const accel_load_opts *opts) {
    return accel__load_checkpoint_and_dispatch(root, checkpoint, map, strategy, max_memory, opts, NULL);
}

accel_dispatched *accel__load_checkpoint_and_dispatch(accel_module *root, const char *checkpoint,
                                                      const accel_device_map *map, const char *strategy,
                                                      const accel_max_memory *max_memory,
                                                      const accel_load_opts *opts, const accel__pretrained_load *pl) {
    accel_device_map *built = NULL;
    if (!map && strategy) {
        built = accel_device_map_from_string(root, strategy, max_memory, opts ? opts->map_opts : NULL);
        if (!built) return NULL;
        map = built;
    }
    accel_dispatched *d = accel__load_checkpoint_in_model(root, checkpoint, map, opts, pl);
    accel_device_map_free(built);
    if (d && accel_dispatch_model(root, d) != ACCEL_OK) {
        accel_dispatched_free(d);
        return NULL;
    }
    return d;
}

/* Removes d's hooks and gives its offloaded tensors back to meta. */
static void release_model(accel_dispatched *d) {
    for (int i = 0; i < d->n_hooked; i++)
        if (is_ours(d->hooked[i], d)) (void)accel_module_set_hook(d->hooked[i], NULL); /* a removal: cannot fail */
    accel_free(d->hooked);
    d->hooked = NULL;
    d->n_hooked = d->cap_hooked = 0;
    accel__off_free_all(d);
}

/* The model is being freed before d: let go of it while it is whole. */
static void model_detached(void *owner, void *root) {
    accel_dispatched *d = owner;
    (void)root;
    release_model(d);
    d->root = NULL;
}

accel_status accel__dispatched_attach(accel_dispatched *d, accel_module *root) {
    accel_status st = accel__link_add(&root->links, model_detached, d);
    if (st == ACCEL_OK) d->root = root;
    return st;
}

void accel_dispatched_free(accel_dispatched *d) {
    if (!d) return;
    if (d->root) accel__link_remove(&d->root->links, d);
    release_model(d);
    accel_checkpoint_close(d->ck);
    accel_device_map_free(d->map);
    for (int i = 0; i < d->n_placed; i++) accel_free(d->placed[i].name);
    accel_free(d->placed);
    for (int i = 0; i < d->n_preload; i++) accel_free(d->preload[i]);
    accel_free(d->preload);
    accel_free(d);
}

void accel_dispatched_stats(const accel_dispatched *d, accel_dispatch_stats *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (d) *out = d->stats;
}

const accel_device_map *accel_dispatched_map(const accel_dispatched *d) { return d ? d->map : NULL; }

accel_device accel_dispatched_main_device(const accel_dispatched *d) {
    return d ? d->main : ACCEL_CPU_DEVICE;
}

const char *accel_dispatched_placement(const accel_dispatched *d, const char *tensor_name) {
    for (int i = 0; d && tensor_name && i < d->n_placed; i++)
        if (strcmp(d->placed[i].name, tensor_name) == 0) return d->placed[i].where;
    return NULL;
}
