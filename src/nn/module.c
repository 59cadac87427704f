/* The module tree: building, freeing, naming, hooks, state dicts. */
#include <stdio.h>
#include <string.h>

#include "accel/nn.h"
#include "core/core_internal.h"
#include "core/handle.h"
#include "core/link.h"
#include "family.h"
#include "nn_internal.h"
#include "tp_internal.h"

accel_module *accel_module_new(const accel_module_ops *ops, void *impl) {
    if (!ops || !ops->type_name) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_module_new: ops or ops->type_name is NULL");
        return NULL;
    }
    accel_module *m = accel_calloc(1, sizeof *m);
    if (!m) return NULL;
    m->name = accel_strdup("");
    if (!m->name) {
        accel_free(m);
        return NULL;
    }
    m->ops = ops;
    m->impl = impl;
    m->training = true;
    m->magic = ACCEL__MAGIC_MODULE;
    return m;
}

/* ---- member names
 *
 * Adding a member refuses a duplicate name, and dotted names are resolved one
 * member at a time: with a linear scan a ModuleList of N layers costs O(N^2) to
 * build and to address. A module with more than INDEX_FROM members keeps an
 * open-addressing table of its member ids (2*i: children[i]; 2*i+1: tensors[i]). */
enum { INDEX_FROM = 8 };

typedef struct accel__member_index {
    int cap;   /* power of two, more than twice the members */
    int *slot; /* 0: empty, else id + 1 */
} accel__member_index;

static const char *member_name(const accel_module *m, int id) {
    return id & 1 ? m->tensors[id >> 1].name : m->children[id >> 1]->name;
}

static bool name_is(const char *s, const char *name, size_t len) {
    return strncmp(s, name, len) == 0 && s[len] == 0;
}

static uint64_t name_hash(const char *s, size_t len) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

/* The id of the member called name[0, len), or -1. */
static int member_lookup(const accel_module *m, const char *name, size_t len) {
    const accel__member_index *ix = m->member_index;
    if (!ix) {
        for (int i = 0; i < m->n_children; i++)
            if (name_is(m->children[i]->name, name, len)) return 2 * i;
        for (int i = 0; i < m->n_tensors; i++)
            if (name_is(m->tensors[i].name, name, len)) return 2 * i + 1;
        return -1;
    }
    for (uint64_t h = name_hash(name, len);; h++) {
        int id = ix->slot[h & (uint64_t)(ix->cap - 1)] - 1;
        if (id < 0 || name_is(member_name(m, id), name, len)) return id;
    }
}

static void index_put(accel__member_index *ix, const accel_module *m, int id) {
    const char *name = member_name(m, id);
    uint64_t h = name_hash(name, strlen(name));
    while (ix->slot[h & (uint64_t)(ix->cap - 1)]) h++;
    ix->slot[h & (uint64_t)(ix->cap - 1)] = id + 1;
}

/* Makes room in the index for one more member (building it when the module
 * grows past INDEX_FROM). false on OOM. */
static bool index_reserve(accel_module *m) {
    int members = m->n_children + m->n_tensors + 1;
    accel__member_index *ix = m->member_index;
    if (members <= INDEX_FROM || (ix && 2 * members < ix->cap)) return true;
    int cap = ix ? ix->cap : 32;
    while (2 * members >= cap) cap *= 2;
    int *slot = accel_calloc((size_t)cap, sizeof *slot);
    if (!ix) ix = accel_calloc(1, sizeof *ix);
    if (!slot || !ix) {
        accel_free(slot);
        if (ix != m->member_index) accel_free(ix);
        return false;
    }
    accel_free(ix->slot);
    ix->cap = cap;
    ix->slot = slot;
    m->member_index = ix;
    for (int i = 0; i < m->n_children; i++) index_put(ix, m, 2 * i);
    for (int i = 0; i < m->n_tensors; i++) index_put(ix, m, 2 * i + 1);
    return true;
}

static void free_hook(accel_module *m) {
    if (m->hook && m->hook->free_ctx) m->hook->free_ctx(m->hook->ctx);
    accel_free(m->hook);
    m->hook = NULL;
}

/* The tensors the tree of m owns and their gradients of their own (freed
 * with them), appended to ts[*n..) (room for 2 count_tensors(m)). */
static void owned_tensors(const accel_module *m, accel_tensor **ts, int *n) {
    for (int i = 0; i < 2 * m->n_tensors; i++) {
        const accel_named_tensor *e = &m->tensors[i / 2];
        accel_tensor *t = !e->owned || !e->t ? NULL : i % 2 == 0 ? e->t : e->t->grad;
        if (t && !(i % 2 && (t->flags & ACCEL_TF_ARENA))) ts[(*n)++] = t;
    }
    for (int i = 0; i < m->n_children; i++) owned_tensors(m->children[i], ts, n);
}

static int count_tensors(const accel_module *m);
static void module_free(accel_module *m, bool taped);

/* A module freed between a forward and its backward: the tape forgets its
 * tensors (accel__tape_forget), all in one pass over the tape. */
void accel_module_free(accel_module *m) {
    if (!m || ACCEL__DEAD(m, ACCEL__MAGIC_MODULE, "accel_module_free", "module")) return;
    if (m->parent) {
        /* Its parent owns it (as it owns a parameter, which accel_tensor_free
         * refuses): freed here, the parent's next forward or free read it. */
        accel_set_error(ACCEL_ERR_STATE,
                        "accel_module_free: module %s \"%s\" is a child of %s, which owns it: free the root of "
                        "its tree (accel_module_free(root) frees every child)",
                        m->ops->type_name, m->name, m->parent->ops->type_name);
        return;
    }
    bool live = accel__tape_live();
    accel_tensor **ts = live ? accel_malloc(2 * (size_t)count_tensors(m) * sizeof *ts + sizeof *ts) : NULL;
    int n = 0;
    if (ts) owned_tensors(m, ts, &n);
    bool one_pass = !live || ts;
    if (one_pass) accel__tape_forget(ts, n);
    accel_free(ts);
    module_free(m, !one_pass);
}

/* taped: each tensor is forgotten on the tape as it goes (the one pass had no memory). */
static void module_free(accel_module *m, bool taped) {
    if (!m) return;
    accel__link_detach_all(&m->links, m); /* dependants let go while it is whole */
    for (int i = 0; i < m->n_children; i++) module_free(m->children[i], taped);
    accel_free(m->children);
    for (int i = 0; i < m->n_tensors; i++) {
        if (m->tensors[i].owned) accel__tensor_free_member(m->tensors[i].t, taped);
        accel_free(m->tensors[i].name);
    }
    accel_free(m->tensors);
    if (m->member_index) accel_free(m->member_index->slot);
    accel_free(m->member_index);
    free_hook(m);
    if (m->ops->free_impl)
        m->ops->free_impl(m);
    else
        accel_free(m->impl);
    accel_free(m->name);
    m->magic = 0;
    accel_free(m);
}

static bool valid_local_name(const char *fn, const char *name) {
    if (!name || !*name || strchr(name, '.')) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: invalid name \"%s\" (empty, NULL or contains '.')",
                        fn, name ? name : "(null)");
        return false;
    }
    return true;
}

static bool name_taken(const accel_module *m, const char *name) {
    return member_lookup(m, name, strlen(name)) >= 0;
}

/* Grows *arr (of elem bytes) so that it holds at least n+1 elements. */
static bool grow(void **arr, int *cap, int n, size_t elem) {
    if (n < *cap) return true;
    int nc = *cap ? 2 * *cap : 4;
    void *p = accel_malloc((size_t)nc * elem);
    if (!p) return false;
    if (n) memcpy(p, *arr, (size_t)n * elem);
    accel_free(*arr);
    *arr = p;
    *cap = nc;
    return true;
}

/* Is a the module m or one of m's ancestors? */
static bool is_self_or_ancestor(const accel_module *a, const accel_module *m) {
    for (; m; m = m->parent)
        if (m == a) return true;
    return false;
}

accel_module *accel_module_add_child(accel_module *m, const char *name, accel_module *child) {
    const char *fn = "accel_module_add_child";
    /* A child that already has a parent, or that m descends from, belongs to a
     * tree: a refusal must not free it (its parent frees it; freeing m's own
     * ancestor would free m), and adding it would free it twice or make a
     * cycle that every recursive walk (free, forward, state dict) overflows. */
    bool in_tree = child && (child->parent || (m && is_self_or_ancestor(child, m)));
    bool ok = false;
    if (!m || !child) /* a failed constructor's NULL: its error is the cause (docs/contract.md) */
        accel_propagate_error(ACCEL_ERR_INVALID_ARG, "%s: %s is NULL", fn, m ? "child" : "module");
    else if (child->parent)
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: module %s \"%s\" already has a parent (%s)", fn,
                        child->ops->type_name, child->name, child->parent->ops->type_name);
    else if (in_tree)
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: module %s is %s itself or one of its ancestors "
                        "(a module tree cannot hold a cycle)", fn, child->ops->type_name, m->ops->type_name);
    else if (!valid_local_name(fn, name))
        ;
    else if (name_taken(m, name))
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: %s already has a member \"%s\"", fn, m->ops->type_name, name);
    else
        ok = true;
    if (!ok) {
        if (!in_tree) accel_module_free(child);
        return NULL;
    }
    char *nm = accel_strdup(name);
    if (!nm || !grow((void **)&m->children, &m->cap_children, m->n_children, sizeof *m->children) ||
        !index_reserve(m)) {
        accel_free(nm);
        accel_module_free(child);
        return NULL;
    }
    accel_free(child->name);
    child->name = nm;
    child->parent = m;
    m->children[m->n_children++] = child;
    if (m->member_index) index_put(m->member_index, m, 2 * (m->n_children - 1));
    return child;
}

static accel_tensor *add_tensor(accel_module *m, const char *name, accel_tensor *t, bool buffer) {
    const char *fn = buffer ? "accel_module_add_buffer" : "accel_module_add_param";
    bool persistent = t && t->magic == ACCEL_TENSOR_MAGIC && !(t->flags & ACCEL_TF_ARENA);
    /* A parameter or buffer already belongs to a module (this one under
     * another name, or another): a second owner would free it twice. A
     * refusal leaves it to its owner. */
    bool held = persistent && (t->flags & (ACCEL_TF_PARAM | ACCEL_TF_BUFFER));
    bool ok = false;
    if (!m) /* a failed constructor's NULL (m or t): its error is the cause */
        accel_propagate_error(ACCEL_ERR_INVALID_ARG, "%s: module is NULL", fn);
    else if (!t)
        accel_propagate_error(ACCEL_ERR_INVALID_ARG, "%s: \"%s\" is NULL", fn, name ? name : "(null)");
    else if (!persistent)
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: \"%s\" is not a live persistent tensor "
                        "(NULL, freed, or a step tensor)", fn, name ? name : "(null)");
    else if (held)
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: \"%s\": the tensor is already a %s of a module (\"%s\"); "
                        "share one tensor under two names with accel_module_tie", fn, name ? name : "(null)",
                        t->flags & ACCEL_TF_PARAM ? "parameter" : "buffer", t->name ? t->name : "?");
    else if (!buffer && !accel_dtype_is_float(t->dtype)) /* as accel_requires_grad_ and torch's nn.Parameter */
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: \"%s\" is %s: only a floating-point tensor can be a parameter "
                        "(it requires grad); keep integer or bool state as a buffer (accel_module_add_buffer)", fn,
                        name ? name : "(null)", accel_dtype_name(t->dtype));
    else if (!valid_local_name(fn, name))
        ;
    else if (name_taken(m, name))
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: %s already has a member \"%s\"", fn,
                        m->ops->type_name, name);
    else
        ok = true;
    if (!ok) {
        if (persistent && !held) accel_tensor_free(t);
        return NULL;
    }
    char *nm = accel_strdup(name);
    if (!nm || !grow((void **)&m->tensors, &m->cap_tensors, m->n_tensors, sizeof *m->tensors) ||
        !index_reserve(m)) {
        accel_free(nm);
        accel_tensor_free(t);
        return NULL;
    }
    accel_named_tensor *e = &m->tensors[m->n_tensors++];
    e->name = nm;
    if (m->member_index) index_put(m->member_index, m, 2 * (m->n_tensors - 1) + 1);
    e->t = t;
    e->is_buffer = buffer;
    e->owned = true;
    t->flags |= buffer ? ACCEL_TF_BUFFER : ACCEL_TF_PARAM;
    t->requires_grad = !buffer;
    t->name = nm;
    return t;
}

accel_tensor *accel_module_add_param(accel_module *m, const char *name, accel_tensor *t) {
    return add_tensor(m, name, t, false);
}

accel_tensor *accel_module_add_buffer(accel_module *m, const char *name, accel_tensor *t) {
    return add_tensor(m, name, t, true);
}

/* The entry of a full dotted tensor name, or NULL (no error). */
static accel_named_tensor *find_entry(accel_module *root, const char *full) {
    const char *dot = strrchr(full, '.');
    accel_module *m = root;
    if (dot) {
        size_t len = (size_t)(dot - full);
        char path[512];
        if (len >= sizeof path) return NULL;
        memcpy(path, full, len);
        path[len] = 0;
        m = accel_module_find(root, path);
        if (!m) return NULL;
    }
    const char *local = dot ? dot + 1 : full;
    int id = member_lookup(m, local, strlen(local));
    return id >= 0 && (id & 1) ? &m->tensors[id >> 1] : NULL;
}

/* An entry other than `except` that refers to t, or NULL. */
static accel_named_tensor *find_alias(accel_module *m, const accel_tensor *t,
                                      const accel_named_tensor *except) {
    for (int i = 0; i < m->n_tensors; i++)
        if (m->tensors[i].t == t && &m->tensors[i] != except) return &m->tensors[i];
    for (int i = 0; i < m->n_children; i++) {
        accel_named_tensor *e = find_alias(m->children[i], t, except);
        if (e) return e;
    }
    return NULL;
}

/* Gives one of a and b (full names of one tied tensor) a tensor of its own:
 * the one that does not own the shared tensor (accel_module_tie's dst), so
 * the other keeps it. The new tensor has the shape, dtype, device and kind
 * (parameter or buffer) of the shared one, its values unset (zeros; on
 * meta, none). *untied: the name that got it. */
accel_status accel__module_untie(accel_module *root, const char *a, const char *b, const char **untied) {
    accel_named_tensor *ea = find_entry(root, a), *eb = find_entry(root, b);
    if (!ea || !eb || ea == eb || ea->t != eb->t)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel__module_untie: %s and %s are not one tied tensor", a, b);
    bool a_keeps = ea->owned || !eb->owned; /* neither owns it: a third name does; a keeps it */
    accel_named_tensor *e = a_keeps ? eb : ea;
    accel_tensor *old = e->t, *t = accel_tensor_new(old->dtype, old->ndim, old->shape, old->device);
    if (!t) return accel_last_status();
    t->flags |= e->is_buffer ? ACCEL_TF_BUFFER : ACCEL_TF_PARAM;
    t->requires_grad = old->requires_grad;
    t->name = e->name;
    e->t = t;
    e->owned = true;
    *untied = a_keeps ? b : a;
    return ACCEL_OK;
}

accel_status accel_module_tie(accel_module *root, const char *dst_name, const char *src_name) {
    if (!root || !dst_name || !src_name)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_module_tie: NULL argument");
    accel_named_tensor *dst = find_entry(root, dst_name), *src = find_entry(root, src_name);
    if (!dst || !src)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_module_tie: no tensor named \"%s\"",
                               dst ? src_name : dst_name);
    if (dst == src || dst->t == src->t) return ACCEL_OK;
    if (!accel_same_shape(dst->t, src->t)) {
        char a[64], b[64];
        return accel_set_error(ACCEL_ERR_SHAPE, "accel_module_tie: %s %s and %s %s differ in shape",
                               dst_name, accel_shape_str(dst->t, a, sizeof a), src_name,
                               accel_shape_str(src->t, b, sizeof b));
    }
    if (dst->owned) {
        /* Another alias of the old tensor inherits it; else it goes. */
        accel_named_tensor *heir = find_alias(root, dst->t, dst);
        if (heir)
            heir->owned = true;
        else
            accel__tensor_free_member(dst->t, true);
    }
    dst->t = src->t;
    dst->owned = false;
    dst->is_buffer = src->is_buffer;
    return ACCEL_OK;
}

/* ---- running */

/* The pre hook is handed the input to read and replace: a NULL x, a NULL *x
 * (what an earlier failure left) or a dead tensor reached it, and a hook that
 * read through it crashed. op names the caller's entry point. */
static accel_status enter(accel_module *m, accel_tensor **x, const char *op) {
    char what[96];
    snprintf(what, sizeof what, "%s (%s)", op, m->ops->type_name);
    if (!x) return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: x is NULL (the address of the input tensor)", what);
    if (!accel_tensor_check(*x, what, "the input tensor")) return accel_last_status();
    if (!m->hook || !m->hook->pre_forward) return ACCEL_OK;
    accel_status st = m->hook->pre_forward(m, x, m->hook->ctx);
    if (st || *x) return st;
    /* A hook that said OK and dropped the input: the forward ran on NULL and
     * the model returned NULL with no error. The caller makes no exit call
     * after a failed enter, so the post hook undoes the pre hook's work here,
     * as after a failed forward. */
    accel_tensor *none = NULL;
    if (m->hook->post_forward) (void)m->hook->post_forward(m, &none, m->hook->ctx);
    return accel_set_error(ACCEL_ERR_STATE, "%s: the pre_forward hook returned OK and left no input (*x NULL)", what);
}

accel_status accel_module_enter(accel_module *m, accel_tensor **x) {
    if (!m) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_module_enter: module is NULL");
    return enter(m, x, __func__);
}

static _Thread_local accel_module *tl_keep_outputs;

accel_module *accel__module_keep_outputs(accel_module *m) {
    accel_module *prev = tl_keep_outputs;
    tl_keep_outputs = m;
    return prev;
}

bool accel__module_outputs_kept(const accel_module *m) { return m && m == tl_keep_outputs; }

accel_status accel_module_exit(accel_module *m, accel_tensor **y) {
    if (!m) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_module_exit: module is NULL");
    /* With no y the post hook still runs, with no output (as after a failed
     * call), so that what the pre hook set up is undone; a NULL y reached it. */
    accel_tensor *none = NULL, **out = y ? y : &none;
    bool had = *out != NULL;
    accel_status st = m->hook && m->hook->post_forward ? m->hook->post_forward(m, out, m->hook->ctx) : ACCEL_OK;
    if (!y)
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "accel_module_exit (%s): y is NULL (the address of the output tensor; *y may be "
                               "NULL after a failed call)",
                               m->ops->type_name);
    if (!st && had && !*y)
        return accel_set_error(ACCEL_ERR_STATE,
                               "accel_module_exit (%s): the post_forward hook returned OK and dropped the output "
                               "(*y NULL)",
                               m->ops->type_name);
    return st;
}

static accel_tensor *ops_forward(void *m, accel_tensor *x) {
    return ((accel_module *)m)->ops->forward(m, x);
}

static int count_tensors(const accel_module *m) {
    int n = m->n_tensors;
    for (int i = 0; i < m->n_children; i++) n += count_tensors(m->children[i]);
    return n;
}

/* Appends m's tensors not in arr[0..n) yet (a tied one once), m's own
 * first, then its children's, as the state dict orders them: the checkpoint
 * node's parameters. Frozen ones and buffers ride along, which the walk
 * passes over (no gradient), so that the module freed before the backward
 * makes the tape forget the node (accel__tape_forget) instead of replaying
 * a freed module. */
static int collect_params(const accel_module *m, accel_tensor **arr, int n) {
    for (int i = 0; i < m->n_tensors; i++) {
        accel_tensor *t = m->tensors[i].t;
        if (!t) continue;
        bool seen = false;
        for (int k = 0; k < n && !seen; k++) seen = arr[k] == t;
        if (!seen) arr[n++] = t;
    }
    for (int i = 0; i < m->n_children; i++) n = collect_params(m->children[i], arr, n);
    return n;
}

/* The parameter list goes in the step arena: a checkpointed module runs
 * every step, and a step allocates nothing from the system after the first. */
accel_tensor *accel__module_run(accel_module *m, accel_activation_checkpoint_fn body, void *ctx, accel_tensor *x) {
    if (!m->gradient_checkpointing || !x) return body(ctx, x);
    int cap = count_tensors(m);
    accel_tensor **params = accel_arena_alloc(accel_step_arena(), (size_t)(cap ? cap : 1) * sizeof *params, 8);
    if (!params) return NULL;
    return accel_activation_checkpoint(body, ctx, x, collect_params(m, params, 0), params);
}

accel_tensor *accel__module_forward(accel_module *m, accel_tensor *x) { return accel__module_run(m, ops_forward, m, x); }

accel_status accel_module_set_gradient_checkpointing(accel_module *m, bool enable) {
    if (!m) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_module_set_gradient_checkpointing: module is NULL");
    /* a model checkpoints its blocks (the family table), any other module itself */
    const accel__family *f = accel__family_of(m);
    if (f && f->checkpoint_layers(m, enable)) return ACCEL_OK;
    if (!m->ops->forward)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED,
                               "accel_module_set_gradient_checkpointing: %s has no single-tensor forward to "
                               "recompute (checkpoint the module that calls it)", m->ops->type_name);
    m->gradient_checkpointing = enable;
    return ACCEL_OK;
}

accel_tensor *accel_module_call(accel_module *m, accel_tensor *x) {
    if (!m) { /* a failed constructor's NULL: its error is the cause (the chain rule, docs/contract.md) */
        accel_propagate_error(ACCEL_ERR_INVALID_ARG, "accel_module_call: module is NULL");
        return NULL;
    }
    if (ACCEL__DEAD(m, ACCEL__MAGIC_MODULE, "accel_module_call", "module")) return NULL;
    if (!m->ops->forward) {
        accel_set_error(ACCEL_ERR_UNSUPPORTED,
                        "accel_module_call: %s has no single-tensor forward (use its own entry point)",
                        m->ops->type_name);
        return NULL;
    }
    if (enter(m, &x, __func__) != ACCEL_OK) return NULL;
    accel_tensor *y = accel__module_forward(m, x);
    /* Even after a failed forward: the post hook undoes what the pre hook set
     * up (autocast, brought-in weights), which later calls must not inherit. */
    return accel_module_exit(m, &y) == ACCEL_OK ? y : NULL;
}

accel_status accel_module_set_hook(accel_module *m, const accel_module_hook *hook) {
    if (!m) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_module_set_hook: m is NULL");
    free_hook(m);
    if (!hook) return ACCEL_OK;
    m->hook = accel_malloc(sizeof *m->hook);
    if (!m->hook) return accel_last_status();
    *m->hook = *hook;
    return ACCEL_OK;
}

void accel_module_train(accel_module *m, bool training) {
    if (!m) return;
    m->training = training;
    for (int i = 0; i < m->n_children; i++) accel_module_train(m->children[i], training);
}

/* ---- naming */

const char *accel_module_path(const accel_module *m, char *buf, size_t n) {
    if (!buf || !n) return buf;
    buf[0] = 0;
    if (!m) return buf;
    /* Collect the chain up to the root, then write it top-down. */
    const accel_module *chain[128];
    int depth = 0;
    for (const accel_module *p = m; p->parent && depth < 128; p = p->parent) chain[depth++] = p;
    size_t off = 0;
    for (int i = depth - 1; i >= 0 && off < n; i--)
        off += (size_t)snprintf(buf + off, n - off, "%s%s", i == depth - 1 ? "" : ".", chain[i]->name);
    return buf;
}

accel_module *accel_module_find(accel_module *root, const char *path) {
    if (!root || !path) return NULL;
    accel_module *m = root;
    const char *p = path;
    while (*p) {
        const char *dot = strchr(p, '.');
        size_t len = dot ? (size_t)(dot - p) : strlen(p);
        int id = member_lookup(m, p, len);
        if (id < 0 || (id & 1)) return NULL;
        m = m->children[id >> 1];
        p = dot ? dot + 1 : p + len;
    }
    return m;
}

accel_tensor *accel_module_get_tensor(accel_module *root, const char *full_name) {
    if (!root || !full_name) return NULL;
    accel_named_tensor *e = find_entry(root, full_name);
    return e ? e->t : NULL;
}

/* ---- state dict */

static void sd_count(const accel_module *m, size_t prefix_len, int *n, size_t *bytes) {
    *bytes += prefix_len + 1; /* room for prefixes of modules without tensors */
    for (int i = 0; i < m->n_tensors; i++) {
        (*n)++;
        *bytes += prefix_len + strlen(m->tensors[i].name) + 1;
    }
    for (int i = 0; i < m->n_children; i++)
        sd_count(m->children[i], prefix_len + strlen(m->children[i]->name) + 1, n, bytes);
}

/* The tensors listed so far, hashed by address: marking tied aliases stays
 * linear in the number of tensors. */
typedef struct seen_set {
    size_t cap; /* power of two, more than twice the entries */
    const accel_tensor **slot;
} seen_set;

/* Adds t; true when it was already there. */
static bool seen_before(seen_set *s, const accel_tensor *t) {
    uint64_t h = (uint64_t)(uintptr_t)t * 0x9E3779B97F4A7C15ull;
    for (size_t i = (size_t)(h >> 32);; i++) {
        const accel_tensor **e = &s->slot[i & (s->cap - 1)];
        if (*e == t) return true;
        if (!*e) {
            *e = t;
            return false;
        }
    }
}

/* prefix: "a.b." (with the trailing dot), or "" at the root. */
static void sd_fill(accel_state_dict *sd, seen_set *seen, size_t *name_off, accel_module *m,
                    const char *prefix, size_t plen, bool buffers) {
    for (int i = 0; i < m->n_tensors; i++) {
        accel_named_tensor *e = &m->tensors[i];
        if (e->is_buffer != buffers) continue;
        char *dst = sd->names + *name_off;
        memcpy(dst, prefix, plen);
        strcpy(dst + plen, e->name);
        *name_off += plen + strlen(e->name) + 1;
        accel_state_entry *se = &sd->entries[sd->n];
        se->name = dst;
        se->t = e->t;
        se->owner = m;
        se->is_buffer = e->is_buffer;
        se->is_tied_alias = seen_before(seen, e->t);
        sd->n++;
    }
}

static void sd_walk(accel_state_dict *sd, seen_set *seen, size_t *name_off, accel_module *m,
                    char *prefix, size_t plen) {
    sd_fill(sd, seen, name_off, m, prefix, plen, false);
    sd_fill(sd, seen, name_off, m, prefix, plen, true);
    for (int i = 0; i < m->n_children; i++) {
        size_t cl = strlen(m->children[i]->name);
        memcpy(prefix + plen, m->children[i]->name, cl);
        prefix[plen + cl] = '.';
        prefix[plen + cl + 1] = 0;
        sd_walk(sd, seen, name_off, m->children[i], prefix, plen + cl + 1);
        prefix[plen] = 0;
    }
}

accel_state_dict *accel_module_state_dict(accel_module *root) {
    if (!root) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_module_state_dict: module is NULL");
        return NULL;
    }
    if (ACCEL__DEAD(root, ACCEL__MAGIC_MODULE, "accel_module_state_dict", "module")) return NULL;
    int n = 0;
    size_t bytes = 0;
    sd_count(root, 0, &n, &bytes);
    accel_state_dict *sd = accel_calloc(1, sizeof *sd);
    char *prefix = accel_malloc(bytes + 2);
    if (!sd || !prefix) {
        accel_free(sd);
        accel_free(prefix);
        return NULL;
    }
    seen_set seen = {16, NULL};
    while (seen.cap <= 2 * (size_t)n) seen.cap *= 2;
    seen.slot = accel_calloc(seen.cap, sizeof *seen.slot);
    sd->entries = accel_calloc((size_t)(n ? n : 1), sizeof *sd->entries);
    sd->names = accel_malloc(bytes + 1);
    if (!seen.slot || !sd->entries || !sd->names) {
        accel_free(seen.slot);
        accel_free(prefix);
        accel_state_dict_free(sd);
        return NULL;
    }
    /* `bytes` counts every module's prefix, so it bounds the longest one. */
    prefix[0] = 0;
    size_t off = 0;
    sd_walk(sd, &seen, &off, root, prefix, 0);
    accel_free(seen.slot);
    accel_free(prefix);
    return sd;
}

void accel_state_dict_free(accel_state_dict *sd) {
    if (!sd) return;
    accel_free(sd->entries);
    accel_free(sd->names);
    accel_free(sd);
}

/* Unique tensors of the tree in state_dict order; params_only keeps parameters
 * that require grad. Returns the count (or -1); *out is caller-freed. */
int accel__module_unique_tensors(accel_module *root, bool params_only, accel_tensor ***out) {
    *out = NULL;
    accel_state_dict *sd = accel_module_state_dict(root);
    if (!sd) return -1;
    accel_tensor **arr = accel_malloc((size_t)(sd->n ? sd->n : 1) * sizeof *arr);
    if (!arr) {
        accel_state_dict_free(sd);
        return -1;
    }
    int k = 0;
    for (int i = 0; i < sd->n; i++) {
        const accel_state_entry *e = &sd->entries[i];
        if (e->is_tied_alias) continue;
        if (params_only && (e->is_buffer || !e->t->requires_grad)) continue;
        arr[k++] = e->t;
    }
    accel_state_dict_free(sd);
    *out = arr;
    return k;
}

int accel_module_parameters(accel_module *root, accel_tensor ***out) {
    if (out) *out = NULL;
    if (!root || !out) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_module_parameters: %s is NULL", root ? "out" : "module");
        return -1;
    }
    return accel__module_unique_tensors(root, true, out);
}

int64_t accel_module_num_params(accel_module *root) {
    if (!root) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_module_num_params: module is NULL");
        return -1;
    }
    accel_tensor **ts;
    int n = accel__module_unique_tensors(root, false, &ts);
    if (n < 0) return -1;
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += accel_numel(ts[i]);
    accel_free(ts);
    return total;
}

/* ---- empty weights */

static _Thread_local int tl_empty_depth;

void accel_init_empty_weights_begin(void) { tl_empty_depth++; }

accel_status accel_init_empty_weights_end(void) {
    /* an end with no open begin was ignored silently: the caller's pairing is off */
    if (tl_empty_depth == 0)
        return accel_set_error(ACCEL_ERR_STATE, "accel_init_empty_weights_end: not inside init_empty_weights "
                               "(no accel_init_empty_weights_begin before it on this thread)");
    tl_empty_depth--;
    return ACCEL_OK;
}

accel_device accel_default_param_device(accel_device requested) {
    return tl_empty_depth > 0 ? ACCEL_META_DEVICE : requested;
}

/* accel__module_values_away's walk over m's subtree. */
static const char *subtree_away(const accel_module *m) {
    const char *why = accel__link_away(m->links, m);
    if (why) return why;
    accel_pg *pg = accel__tp_group(m);
    if (pg && accel_pg_size(pg) > 1 && !accel__tp_is_replica(m))
        return "the model's weights are this rank's tensor-parallel slices: save it with "
               "accel_accelerator_save_model, which gathers the whole tensors";
    for (int i = 0; i < m->n_children; i++)
        if ((why = subtree_away(m->children[i]))) return why;
    return NULL;
}

const char *accel__module_values_away(const accel_module *m) {
    for (const accel_module *p = m ? m->parent : NULL; p; p = p->parent) {
        const char *why = accel__link_away(p->links, p);
        if (why) return why;
    }
    return m ? subtree_away(m) : NULL;
}
