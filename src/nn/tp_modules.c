/* Tensor-parallel modules (accel/parallel.h): a Linear or Embedding whose
 * weights are cut to this rank's slice, with Megatron-LM's forwards, and
 * accel_module_parallelize, which applies a plan of path patterns to a tree
 * (PyTorch's parallelize_module). */
#include <stdio.h>
#include <string.h>

#include "nn_internal.h"
#include "tp_internal.h"

typedef struct tp_impl {
    accel_tp_style style;
    accel_pg *pg;
    int64_t start, local, full; /* the split dimension: this rank's [start, start + local) of full */
    bool sp;                    /* sequence parallelism: activations outside split along dim 1 */
    double eps;                 /* a replicated norm's */
} tp_impl;

/* Into a column-parallel region: the replicated input, or the whole
 * sequence gathered from its slices. */
static accel_tensor *enter(const tp_impl *t, accel_tensor *x) {
    return t->sp ? accel_tp_gather_seq(x, t->pg) : accel_tp_copy_to_region(x, t->pg);
}

/* Out of a row-parallel region: the sum, or this rank's sequence slice of it. */
static accel_tensor *leave(const tp_impl *t, accel_tensor *y) {
    return t->sp ? accel_tp_scatter_seq(y, t->pg) : accel_tp_reduce_from_region(y, t->pg);
}

/* ---- forwards */

/* x [.., in] replicated -> [.., out / tp]: this rank's output features. */
static accel_tensor *colwise_forward(accel_module *m, accel_tensor *x) {
    const tp_impl *t = m->impl;
    return accel_linear(enter(t, x), accel__module_tensor(m, "weight"), accel__module_tensor(m, "bias"));
}

/* x [.., in / tp] (or [.., in], sliced here) -> [.., out], summed over the
 * ranks; the bias, whole on every rank, added once after the sum. */
static accel_tensor *rowwise_forward(accel_module *m, accel_tensor *x) {
    const tp_impl *t = m->impl;
    if (x && x->ndim && x->shape[x->ndim - 1] == t->full && t->local != t->full)
        x = accel_slice(enter(t, x), x->ndim - 1, t->start, t->start + t->local, 1);
    accel_tensor *y = leave(t, accel_linear(x, accel__module_tensor(m, "weight"), NULL));
    accel_tensor *b = accel__module_tensor(m, "bias");
    return b && y ? accel_add(y, b) : y;
}

/* ids [...] of the full vocabulary -> [..., D]: rows this rank holds looked
 * up, zeros for the others, summed over the ranks. */
static accel_tensor *vocab_forward(accel_module *m, accel_tensor *ids) {
    const tp_impl *t = m->impl;
    accel_tensor *w = accel__module_tensor(m, "weight");
    if (!accel_tensor_check(ids, "VocabParallelEmbedding", "ids")) return NULL;
    if (ids->dtype != ACCEL_I64 && ids->dtype != ACCEL_I32) {
        accel_set_error(ACCEL_ERR_DTYPE, "VocabParallelEmbedding: ids must be int64 or int32, got %s",
                        accel_dtype_name(ids->dtype));
        return NULL;
    }
    if (ids->device.type != ACCEL_DEV_CPU) {
        char d[32];
        accel_set_error(ACCEL_ERR_UNSUPPORTED, "VocabParallelEmbedding: ids on %s: tensor parallelism runs on cpu "
                        "tensors", accel_device_str(ids->device, d, sizeof d));
        return NULL;
    }
    accel_tensor *i64 = accel_contiguous(accel_to_dtype(ids, ACCEL_I64));
    if (!i64) return NULL;
    int64_t n = accel_numel(i64), mshape[ACCEL_MAX_DIMS];
    if (ids->ndim + 1 > ACCEL_MAX_DIMS) {
        accel_set_error(ACCEL_ERR_SHAPE, "VocabParallelEmbedding: ids have %d dims (at most %d)", ids->ndim,
                        ACCEL_MAX_DIMS - 1);
        return NULL;
    }
    memcpy(mshape, ids->shape, sizeof(int64_t) * (size_t)ids->ndim);
    mshape[ids->ndim] = 1;
    accel_tensor *local = accel_empty_on(ACCEL_I64, ids->ndim, ids->shape, i64->device);
    accel_tensor *mask = accel_empty_on(ACCEL_F32, ids->ndim + 1, mshape, i64->device);
    if (!local || !mask) return NULL;
    const int64_t *id = i64->data;
    int64_t *li = local->data;
    float *mk = mask->data;
    for (int64_t i = 0; i < n; i++) {
        bool mine = id[i] >= t->start && id[i] < t->start + t->local;
        li[i] = mine ? id[i] - t->start : 0;
        mk[i] = mine ? 1.0f : 0.0f;
    }
    accel_tensor *e = accel_embedding(local, w);
    return leave(t, accel_mul(e, accel_to_dtype(mask, w->dtype)));
}

/* The whole weight through copy_to_region, then this rank's rows. */
static accel_tensor *replica_rows(accel_tensor *w, const tp_impl *t) {
    return w ? accel_slice(accel_tp_copy_to_region(w, t->pg), 0, t->start, t->start + t->local, 1) : NULL;
}

static accel_tensor *replica_forward(accel_module *m, accel_tensor *x) {
    const tp_impl *t = m->impl;
    accel_tensor *b = accel__module_tensor(m, "bias");
    accel_tensor *w = replica_rows(accel__module_tensor(m, "weight"), t);
    return accel_linear(enter(t, x), w, b ? replica_rows(b, t) : NULL);
}

static accel_tensor *replica_norm_forward(accel_module *m, accel_tensor *x) {
    const tp_impl *t = m->impl;
    return accel_rms_norm(x, accel_tp_copy_to_region(accel__module_tensor(m, "weight"), t->pg), t->eps);
}

static const accel_module_ops COLWISE_OPS = {"ColwiseParallelLinear", colwise_forward, NULL};
static const accel_module_ops ROWWISE_OPS = {"RowwiseParallelLinear", rowwise_forward, NULL};
static const accel_module_ops VOCAB_OPS = {"VocabParallelEmbedding", vocab_forward, NULL};
static const accel_module_ops REPLICA_OPS = {"ReplicatedRowsLinear", replica_forward, NULL};
static const accel_module_ops REPLICA_NORM_OPS = {"TensorParallelRMSNorm", replica_norm_forward, NULL};

/* Modules whose whole parameters get their gradients summed in the graph. */
static bool is_replica(const accel_module *m) { return m->ops == &REPLICA_OPS || m->ops == &REPLICA_NORM_OPS; }

static bool is_tp(const accel_module *m) {
    return m->ops == &COLWISE_OPS || m->ops == &ROWWISE_OPS || m->ops == &VOCAB_OPS || is_replica(m);
}

/* Replicated rows hold whole tensors: not a slice to report. */
bool accel_module_tp_info(const accel_module *m, accel_tp_style *style, accel_pg **pg, int64_t *start,
                          int64_t *full) {
    if (!m || !is_tp(m) || is_replica(m)) return false;
    const tp_impl *t = m->impl;
    if (style) *style = t->style;
    if (pg) *pg = t->pg;
    if (start) *start = t->start;
    if (full) *full = t->full;
    return true;
}

/* ---- cutting the weights */

static const char *style_name(accel_tp_style s) {
    return s == ACCEL_TP_COLWISE ? "ACCEL_TP_COLWISE"
           : s == ACCEL_TP_ROWWISE ? "ACCEL_TP_ROWWISE"
           : s == ACCEL_TP_VOCAB_EMBEDDING ? "ACCEL_TP_VOCAB_EMBEDDING"
           : s == ACCEL__TP_REPLICA_ROWS ? "replicated rows"
                                         : NULL;
}

/* The dimension of the weight a style splits. */
static int split_dim(accel_tp_style s) { return s == ACCEL_TP_ROWWISE ? 1 : 0; }

static void replace_in(accel_module *m, const accel_tensor *old, accel_tensor *neu) {
    for (int i = 0; i < m->n_tensors; i++)
        if (m->tensors[i].t == old) m->tensors[i].t = neu;
    for (int i = 0; i < m->n_children; i++) replace_in(m->children[i], old, neu);
}

/* Replaces every reference to `old` in the tree holding m by `neu` (tied
 * names keep sharing), then frees old. */
static void replace_tensor(accel_module *m, accel_tensor *old, accel_tensor *neu) {
    accel_module *top = m;
    while (top->parent) top = top->parent;
    replace_in(top, old, neu);
    accel_tensor_free(old);
}

accel_tensor *accel__tp_cut(accel_tensor *w, int dim, int64_t start, int64_t n) {
    int64_t shape[2] = {w->shape[0], w->ndim == 2 ? w->shape[1] : 0};
    shape[dim] = n;
    accel_tensor *s = accel_tensor_new(w->dtype, w->ndim, shape, w->device);
    bool prev = accel_set_grad_enabled(false);
    accel_status st = s ? accel_copy_(s, accel_slice(w, dim, start, start + n, 1)) : accel_last_status();
    accel_set_grad_enabled(prev);
    if (st != ACCEL_OK) {
        accel_tensor_free(s);
        return NULL;
    }
    (void)accel_requires_grad_(s, w->requires_grad); /* s is a live tensor: cannot fail */
    return s;
}

/* Why m cannot take style over `parts` ranks, as an error naming path; ACCEL_OK when it can. */
static accel_status check_one(accel_module *m, accel_tp_style style, int parts, const char *path) {
    accel_tensor *w = accel__module_tensor(m, "weight"), *b = accel__module_tensor(m, "bias");
    bool embedding = style == ACCEL_TP_VOCAB_EMBEDDING;
    const char *want = embedding ? "Embedding" : "Linear", *sn = style_name(style);
    if (!sn) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_module_parallelize: %s: unknown style %d", path,
                                    (int)style);
    if (is_tp(m))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_module_parallelize: %s is already parallelized (%s)", path,
                               m->ops->type_name);
    if (strcmp(m->ops->type_name, want) != 0 || m->impl || !w || w->ndim != 2)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_module_parallelize: %s is a %s: %s takes a %s", path,
                               m->ops->type_name, sn, want);
    if (w->device.type == ACCEL_DEV_META || (b && b->device.type == ACCEL_DEV_META))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_module_parallelize: %s has its weights on meta: "
                               "materialize or load them first (each rank cuts its slice from the whole)", path);
    int d = split_dim(style);
    if (w->shape[d] % parts)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_module_parallelize: %s: %s splits %s %lld, which %d "
                               "ranks cannot share equally", path, sn,
                               d ? "in_features" : embedding ? "num_embeddings" : "out_features",
                               (long long)w->shape[d], parts);
    return ACCEL_OK;
}

/* Makes m (checked) the style's module; cut: its weight (and a COLWISE
 * bias) are replaced by this rank's slice, else they already are that slice
 * (a tied tensor cut by another module) or stay whole (replicated rows). */
static accel_status apply_one(accel_module *m, accel_tp_style style, accel_pg *pg, int part, int parts, bool cut_w,
                              bool sp) {
    accel_tensor *w = accel__module_tensor(m, "weight"), *b = accel__module_tensor(m, "bias");
    int d = split_dim(style);
    int64_t full = cut_w || style == ACCEL__TP_REPLICA_ROWS ? w->shape[d] : w->shape[d] * parts;
    tp_impl *t = accel_malloc(sizeof *t);
    if (!t) return accel_last_status();
    *t = (tp_impl){.style = style, .pg = pg, .local = full / parts, .start = full / parts * part, .full = full,
                   .sp = sp};
    if (cut_w && style != ACCEL__TP_REPLICA_ROWS) {
        bool cut_b = b && style == ACCEL_TP_COLWISE;
        accel_tensor *nw = accel__tp_cut(w, d, t->start, t->local),
                     *nb = nw && cut_b ? accel__tp_cut(b, 0, t->start, t->local) : NULL;
        if (!nw || (cut_b && !nb)) {
            accel_tensor_free(nw);
            accel_free(t);
            return accel_last_status();
        }
        replace_tensor(m, w, nw);
        if (nb) replace_tensor(m, b, nb);
    }
    m->ops = style == ACCEL_TP_COLWISE                ? &COLWISE_OPS
             : style == ACCEL_TP_ROWWISE              ? &ROWWISE_OPS
             : style == ACCEL_TP_VOCAB_EMBEDDING      ? &VOCAB_OPS
                                                      : &REPLICA_OPS;
    m->impl = t;
    return ACCEL_OK;
}

accel_status accel__tp_parallelize_one(accel_module *m, accel_tp_style style, accel_pg *pg, int part, int parts,
                                       bool sp, const char *path) {
    if (check_one(m, style, parts, path)) return accel_last_status();
    return apply_one(m, style, pg, part, parts, true, sp);
}

accel_status accel__tp_replica_norm(accel_module *m, accel_pg *pg, double eps) {
    tp_impl *t = accel_malloc(sizeof *t);
    if (!t) return accel_last_status();
    *t = (tp_impl){.pg = pg, .eps = eps};
    accel_free(m->impl); /* the norm's own (its eps): the norms' ops free theirs so */
    m->ops = &REPLICA_NORM_OPS;
    m->impl = t;
    return ACCEL_OK;
}

/* ---- plans */

/* '*' matches a run of characters without '.'; everything else itself. */
static bool glob_match(const char *p, const char *s) {
    if (!*p) return !*s;
    if (*p == '*') {
        for (;; s++) {
            if (glob_match(p + 1, s)) return true;
            if (!*s || *s == '.') return false;
        }
    }
    return *p == *s && glob_match(p + 1, s + 1);
}

typedef struct plan_walk {
    const accel_tp_plan_entry *plan;
    int n;
    int *hits;           /* per entry */
    accel_module **mods; /* matched modules, in tree order */
    int *entry;          /* their entries */
    int n_mods;          /* the arrays have room for every module of the tree */
} plan_walk;

static int count_modules(const accel_module *m) {
    int n = 1;
    for (int i = 0; i < m->n_children; i++) n += count_modules(m->children[i]);
    return n;
}

static accel_status walk(accel_module *m, char *path, size_t len, size_t cap, plan_walk *w) {
    for (int e = 0; e < w->n && len; e++) {
        if (!glob_match(w->plan[e].pattern, path)) continue;
        w->mods[w->n_mods] = m;
        w->entry[w->n_mods++] = e;
        w->hits[e]++;
        break;
    }
    for (int i = 0; i < m->n_children; i++) {
        int k = snprintf(path + len, cap - len, "%s%s", len ? "." : "", m->children[i]->name);
        if (k < 0 || (size_t)k >= cap - len)
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_module_parallelize: a module path is longer than "
                                   "%zu characters", cap - 1);
        if (walk(m->children[i], path, len + (size_t)k, cap, w)) return accel_last_status();
        path[len] = 0;
    }
    return ACCEL_OK;
}

/* The tensors a module will cut (weight, and a COLWISE bias), which no
 * module outside the plan, or one cutting another way, may share. */
static accel_status check_ties(accel_module *root, plan_walk *w) {
    accel_state_dict *sd = accel_module_state_dict(root);
    if (!sd) return accel_last_status();
    accel_status st = ACCEL_OK;
    for (int i = 0; i < sd->n && st == ACCEL_OK; i++) {
        int k = 0;
        while (k < w->n_mods && w->mods[k] != sd->entries[i].owner) k++;
        for (int j = 0; j < sd->n && st == ACCEL_OK; j++) {
            if (j == i || sd->entries[j].t != sd->entries[i].t) continue;
            int l = 0;
            while (l < w->n_mods && w->mods[l] != sd->entries[j].owner) l++;
            bool in_i = k < w->n_mods, in_j = l < w->n_mods;
            if (!in_i && !in_j) continue;
            if (in_i && in_j && split_dim(w->plan[w->entry[k]].style) == split_dim(w->plan[w->entry[l]].style))
                continue;
            st = accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_module_parallelize: %s and %s are tied, but the plan "
                                 "%s: a tied tensor must be cut the same way by both", sd->entries[i].name,
                                 sd->entries[j].name, in_i && in_j ? "splits them along different dims"
                                                                    : "parallelizes only one of them");
        }
    }
    accel_state_dict_free(sd);
    return st;
}

accel_status accel_module_parallelize(accel_module *root, const accel_tp_plan_entry *plan, int n_entries,
                                      accel_pg *pg) {
    static const char *FN = "accel_module_parallelize";
    if (!root || !pg || (n_entries > 0 && !plan) || n_entries < 0)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: %s", FN, !root ? "module is NULL" : !pg ? "process group is NULL"
                               : "plan is NULL or n_entries negative");
    if (root->links)
        return accel_set_error(ACCEL_ERR_STATE, "%s: the model is already prepared or dispatched: parallelize it "
                               "before accel_accelerator_prepare", FN);
    for (int e = 0; e < n_entries; e++)
        if (!plan[e].pattern || !*plan[e].pattern)
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: plan entry %d has no pattern", FN, e);
    size_t n_tree = (size_t)count_modules(root);
    plan_walk w = {.plan = plan, .n = n_entries, .hits = accel_calloc((size_t)n_entries + 1, sizeof(int)),
                   .mods = accel_calloc(n_tree, sizeof(accel_module *)), .entry = accel_calloc(n_tree, sizeof(int))};
    char path[1024] = "";
    accel_status st = w.hits && w.mods && w.entry ? walk(root, path, 0, sizeof path, &w) : accel_last_status();
    for (int e = 0; e < n_entries && st == ACCEL_OK; e++)
        if (!w.hits[e])
            st = accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: plan entry %d (\"%s\") matches no module", FN, e,
                                 plan[e].pattern);
    if (st == ACCEL_OK) st = check_ties(root, &w);
    int rank = accel_pg_rank(pg), parts = accel_pg_size(pg);
    /* everything checked before the first cut, so a refused plan leaves the model whole */
    for (int k = 0; k < w.n_mods && st == ACCEL_OK; k++) {
        accel_module_path(w.mods[k], path, sizeof path);
        st = check_one(w.mods[k], plan[w.entry[k]].style, parts, path);
    }
    /* a tied tensor is cut once: its second module finds it already this rank's slice */
    accel_tensor **done = st == ACCEL_OK ? accel_calloc((size_t)w.n_mods + 1, sizeof *done) : NULL;
    if (st == ACCEL_OK && !done) st = accel_last_status();
    for (int k = 0; k < w.n_mods && st == ACCEL_OK; k++) {
        accel_tensor *wt = accel__module_tensor(w.mods[k], "weight");
        bool cut_before = false;
        for (int j = 0; j < k; j++) cut_before = cut_before || done[j] == wt;
        st = apply_one(w.mods[k], plan[w.entry[k]].style, pg, rank, parts, !cut_before, plan[w.entry[k]].sequence_parallel);
        done[k] = accel__module_tensor(w.mods[k], "weight");
    }
    accel_free(done);
    accel_free(w.hits);
    accel_free(w.mods);
    accel_free(w.entry);
    return st;
}

accel_status accel_module_tp_reduce_grads(accel_module *root, accel_pg *pg) {
    if (!root || !pg)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_module_tp_reduce_grads: %s is NULL",
                               root ? "process group" : "module");
    accel_state_dict *sd = accel_module_state_dict(root);
    if (!sd) return accel_last_status();
    accel_status st = ACCEL_OK;
    for (int i = 0; i < sd->n && !st; i++) {
        const accel_state_entry *e = &sd->entries[i];
        accel_tp_style style;
        accel_tensor *g = e->t->grad;
        if (e->is_buffer || e->is_tied_alias || !g) continue;
        /* slices are this rank's own; replicated rows were summed by their copy */
        if ((accel_module_tp_info(e->owner, &style, NULL, NULL, NULL) && (style != ACCEL_TP_ROWWISE || e->t->ndim == 2)) ||
            is_replica(e->owner))
            continue;
        if (!accel_is_contiguous(g) || g->device.type != ACCEL_DEV_CPU)
            st = accel_set_error(ACCEL_ERR_UNSUPPORTED, "accel_module_tp_reduce_grads: the gradient of %s is not a "
                                 "contiguous cpu tensor", e->name);
        else
            st = accel_pg_all_reduce(pg, g->data, (size_t)accel_numel(g), g->dtype, ACCEL_REDUCE_SUM);
    }
    accel_state_dict_free(sd);
    return st;
}
