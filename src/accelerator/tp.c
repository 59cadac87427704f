/* Tensor parallelism under the accelerator (opts.parallelism.tp_size > 1):
 * the mesh's tp group, the plan applied to a model at prepare (the
 * decoder families' own, or the user's accel_module_parallelize over
 * accel_accelerator_tp_group), the gradient norm that counts tp-sharded
 * parameters over the tp group and replicated ones once. DDP and ZeRO run
 * over the data-parallel groups only (dp_pg, shard_pg, replica_pg: the
 * mesh's, which leave tp out), so each tp rank averages its own slices.
 * Under mixed_precision fp8 the plan runs first and fp8's conversion then
 * meets the parallel Linears (nn/fp8_modules.h); their amaxes are reduced
 * over every rank, tp included (fp8_scaling.h). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "accel/io.h"
#include "accel/optim.h"
#include "accel/parallel.h"
#include "accelerator_internal.h"
#include "dist/backend.h"
#include "nn/tp_internal.h"
#include "strategy.h"

#define TP(acc) ((acc)->mesh.size[ACCEL__MESH_TP])

accel_pg *accel_accelerator_tp_group(accel_accelerator *acc) {
    if (accel__acc_null(acc, __func__)) return NULL;
    return accel__mesh_group(&acc->mesh, ACCEL__MESH_TP);
}

/* Whether any module of m's tree is tensor-parallel; *foreign the first one
 * parallelized over another group than pg. */
static bool find_tp(accel_module *m, accel_pg *pg, accel_module **foreign) {
    accel_pg *g;
    bool any = accel_module_tp_info(m, NULL, &g, NULL, NULL);
    if (any && g != pg && !*foreign) *foreign = m;
    for (int i = 0; i < m->n_children; i++) any |= find_tp(m->children[i], pg, foreign);
    return any;
}

accel_status accel__tp_prepare(accel_accelerator *acc, accel_module *m) {
    static const char *FN = "accel_accelerator_prepare";
    if (TP(acc) == 1) return ACCEL_OK;
    accel_pg *tp = accel_accelerator_tp_group(acc);
    if (!tp) return accel_last_status();
    accel__tp_adopt(m, tp); /* prepared before by this accelerator, then let go (accel__tp_release) */
    accel_module *foreign = NULL;
    if (find_tp(m, tp, &foreign)) {
        char path[256];
        if (foreign)
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: %s is parallelized over another group than the "
                                   "accelerator's tp group (accel_accelerator_tp_group)", FN,
                                   accel_module_path(foreign, path, sizeof path));
        if (accel__tp_own_plan_partial(m))
            return accel_set_error(ACCEL_ERR_STATE, "%s: the model's tensor-parallel plan was applied only in part "
                                   "(a plan that failed part-way on this rank, out of memory, left some of its "
                                   "modules sliced, the others whole): build or load the model anew", FN);
        return ACCEL_OK; /* the user's plan, applied already */
    }
    int own = accel__tp_own_plan(m, tp, acc->par.sequence_parallel);
    if (own) return own > 0 ? ACCEL_OK : accel_last_status();
    return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: opts.parallelism.tp_size is %d, but the model (%s) has no "
                           "tensor-parallel plan of its own: parallelize it first with accel_module_parallelize("
                           "model, plan, n, accel_accelerator_tp_group(acc))", FN, TP(acc), m->ops->type_name);
}

void accel__tp_release(accel_accelerator *acc, accel_module *m) {
    accel_pg *tp = acc->mesh.group[ACCEL__MESH_TP];
    /* a subgroup goes with the accelerator; a tp group over every rank is the
     * job's default group, which outlives it while another holder keeps it */
    if (TP(acc) > 1 && tp && (tp != acc->pg || accel__dist_last_reference()))
        accel__tp_orphan(m, tp, "the model is tensor-parallel over the tp group of an accelerator that let it go "
                         "(accel_accelerator_free, _clear or _unprepare_model): its slices compute only while it "
                         "is prepared (prepare it again, or save it with accel_accelerator_save_model before)");
}

/* Whether entry e is a tp slice (a row-parallel bias is whole on every
 * rank: replicated), with which elements of the whole it holds (a Conv1D's
 * columns, a fused projection's parts: accel_module_tp_slice). */
static bool entry_split(const accel_state_entry *e, accel_tp_slice *s) {
    return accel_module_tp_slice(e->owner, e->t, s);
}

/* Adds the partial norms of the gradients of m's parameters and its
 * descendants' into part[0] (replicated) and part[1] (tp slices). Walks the
 * tree itself, not a state dict: clipping runs every step and a steady step
 * allocates nothing. A tied parameter counts once: its one owned entry. */
static void add_grad_partials(accel_module *m, double norm_type, double part[2]) {
    for (int i = 0; i < m->n_tensors; i++) {
        const accel_named_tensor *nt = &m->tensors[i];
        if (nt->is_buffer || !nt->owned || !nt->t->grad) continue;
        bool sharded = accel_module_tp_slice(m, nt->t, NULL);
        double p = accel_grad_norm_partial(nt->t->grad, norm_type);
        part[sharded] = accel_grad_norm_combine(part[sharded], p, norm_type);
    }
    for (int i = 0; i < m->n_children; i++) add_grad_partials(m->children[i], norm_type, part);
}

/* Per-parameter partial norms of m's gradients, tp-sharded ones combined
 * over the tp group. */
accel_status accel__tp_grad_norm_partial(accel_accelerator *acc, accel_module *m, double norm_type, double *out) {
    double part[2] = {0, 0}; /* replicated, sharded */
    add_grad_partials(m, norm_type, part);
    accel_pg *tp = accel_accelerator_tp_group(acc);
    accel_status st = tp ? accel__norm_all_reduce(tp, &part[1], 1, norm_type) : accel_last_status();
    *out = accel_grad_norm_combine(part[0], part[1], norm_type);
    return st;
}

double accel__norm_without(double part, double tied) {
    if (!isfinite(tied)) return part;
    return part - tied < 0 ? 0.0 : part - tied;
}

accel_status accel__norm_all_reduce(accel_pg *pg, double *v, int n, double norm_type) {
    ACCEL_ASSERT(n >= 1 && n <= 4);
    if (!isinf(norm_type)) return accel_pg_all_reduce(pg, v, (size_t)n, ACCEL_F64, ACCEL_REDUCE_SUM);
    double w[8]; /* the values (a NaN as -inf), then 1 for each NaN */
    for (int i = 0; i < n; i++) w[i] = isnan(v[i]) ? -INFINITY : v[i], w[n + i] = isnan(v[i]);
    accel_status st = accel_pg_all_reduce(pg, w, (size_t)(2 * n), ACCEL_F64, ACCEL_REDUCE_MAX);
    for (int i = 0; !st && i < n; i++) v[i] = w[n + i] > 0 ? NAN : w[i];
    return st;
}

/* Whether w, a parameter of m or its descendants, is a tp slice (no
 * allocation: a step's clipping asks it). */
static bool owned_split(accel_module *m, const accel_tensor *w) {
    for (int i = 0; i < m->n_tensors; i++)
        if (m->tensors[i].t == w && m->tensors[i].owned)
            return accel_module_tp_slice(m, w, NULL);
    for (int i = 0; i < m->n_children; i++)
        if (owned_split(m->children[i], w)) return true;
    return false;
}

accel_status accel__tp_param_norm_partial(accel_accelerator *acc, accel_module *m, accel_tensor *w, double norm_type,
                                          double *out) {
    *out = accel_grad_norm_partial(w->grad, norm_type); /* a NAN still joins the sum: no rank left waiting */
    if (TP(acc) == 1 || !owned_split(m, w)) return ACCEL_OK;
    accel_pg *tp = accel_accelerator_tp_group(acc);
    return tp ? accel__norm_all_reduce(tp, out, 1, norm_type) : accel_last_status();
}

accel_status accel__tp_sliced(accel_module *m, accel_tensor *const *ts, int n, bool *sliced, bool *summed) {
    accel_state_dict *sd = accel_module_state_dict(m);
    if (!sd) return accel_last_status();
    for (int j = 0; j < n; j++) {
        const accel_state_entry *e = NULL;
        for (int i = 0; i < sd->n && !e; i++)
            if (sd->entries[i].t == ts[j]) e = &sd->entries[i];
        sliced[j] = e && entry_split(e, NULL);
        if (summed) summed[j] = e && !sliced[j] && !accel__tp_is_replica(e->owner);
    }
    accel_state_dict_free(sd);
    return ACCEL_OK;
}

void accel__tp_data_rank(const accel_accelerator *acc, int *rank, int *world) {
    const accel__mesh *m = &acc->mesh;
    /* the batch a rank gets depends on its data-parallel coordinates only:
     * every rank of a tp group (and of a cp group, which splits the
     * sequence of that batch) sees the same one */
    *world = m->size[ACCEL__MESH_DP_REPLICATE] * m->size[ACCEL__MESH_DP_SHARD];
    *rank = m->coord[ACCEL__MESH_DP_REPLICATE] * m->size[ACCEL__MESH_DP_SHARD] + m->coord[ACCEL__MESH_DP_SHARD];
}

/* The whole tensor's size along slice s's split: its parts' sum. */
static int64_t whole_size(const accel_tp_slice *s) {
    int64_t w = 0;
    for (int p = 0; p < s->n_parts; p++) w += s->full[p];
    return w;
}

/* The whole tensor of t's slices (t: this rank's slice s, its parts
 * concatenated along s->dim), each part joined over the tp ranks in rank
 * order, as a new tensor of shape out (out_ndim dims, as many elements) on
 * t's device (collective over tp). Through the device layer: the staged
 * all-gather into [tp, pre, L, post] (L: t's size along the split, pre and
 * post: the elements before and after it), then one copy per rank and part
 * into the whole's [pre, W, post]. */
static accel_tensor *gather_whole(accel_pg *tp, accel_tensor *t, const accel_tp_slice *s, int out_ndim,
                                  const int64_t *out) {
    int64_t n = accel_pg_size(tp), pre = 1, post = 1, L = t->shape[s->dim], W = whole_size(s);
    for (int d = 0; d < t->ndim; d++)
        if (d != s->dim) *(d < s->dim ? &pre : &post) *= t->shape[d];
    accel_tensor *c = accel_tensor_new(t->dtype, t->ndim, t->shape, t->device);
    accel_tensor *g = accel_tensor_new(t->dtype, 3, (int64_t[]){n * pre, L, post}, t->device);
    accel_tensor *whole = accel_tensor_new(t->dtype, out_ndim, out, t->device);
    bool prev = accel_set_grad_enabled(false);
    bool ok = c && g && whole && accel_copy_(c, t) == ACCEL_OK && accel__staged_all_gather(tp, c, g) == ACCEL_OK;
    accel_tensor *w3 = ok ? accel_reshape(whole, 3, (int64_t[]){pre, W, post}) : NULL;
    ok = ok && w3;
    /* rank r's part p: its rows [loff, loff + local) of L go to rows
     * woff + start + [0, local) of W, start = r local (the plan's equal cut) */
    for (int64_t r = 0; ok && r < n; r++)
        for (int p = 0, loff = 0, woff = 0; ok && p < s->n_parts; loff += (int)s->local[p], woff += (int)s->full[p++]) {
            accel_tensor *src = accel_slice(accel_slice(g, 0, r * pre, (r + 1) * pre, 1), 1, loff, loff + s->local[p], 1);
            int64_t at = woff + r * s->local[p];
            accel_tensor *dst = accel_slice(w3, 1, at, at + s->local[p], 1);
            ok = src && dst && accel_copy_(dst, src) == ACCEL_OK;
        }
    accel_set_grad_enabled(prev);
    accel_tensor_free(c);
    accel_tensor_free(g);
    if (!ok) accel_tensor_free(whole);
    return ok ? whole : NULL;
}

accel_status accel__tp_gather_state(accel_accelerator *acc, const accel_state_dict *sd, accel_tensor ***out) {
    *out = NULL;
    if (acc->mesh.size[ACCEL__MESH_TP] == 1) return ACCEL_OK;
    accel_pg *tp = accel_accelerator_tp_group(acc);
    accel_tensor **whole = tp ? accel_calloc((size_t)sd->n + 1, sizeof *whole) : NULL;
    if (!whole) return accel_last_status();
    accel_status st = ACCEL_OK;
    for (int i = 0; i < sd->n && !st; i++) {
        const accel_state_entry *e = &sd->entries[i];
        accel_tp_slice sl;
        if (e->is_tied_alias) { /* the whole tensor of the name it aliases */
            for (int j = 0; j < i; j++)
                if (sd->entries[j].t == e->t) whole[i] = whole[j];
            continue;
        }
        if (!entry_split(e, &sl)) continue;
        int64_t shape[2] = {e->t->shape[0], e->t->ndim == 2 ? e->t->shape[1] : 1};
        shape[sl.dim] = whole_size(&sl);
        if (!(whole[i] = gather_whole(tp, e->t, &sl, e->t->ndim, shape))) st = accel_last_status();
    }
    if (st) {
        accel__tp_gather_state_free(sd, whole);
        return st;
    }
    *out = whole;
    return ACCEL_OK;
}

void accel__tp_gather_state_free(const accel_state_dict *sd, accel_tensor **whole) {
    for (int i = 0; whole && i < sd->n; i++)
        if (!sd->entries[i].is_tied_alias) accel_tensor_free(whole[i]);
    accel_free(whole);
}

/* ---- checkpoints: whole tensors in the files, this rank's slices in memory */

accel_tensor *accel__tp_read_slice(accel_safetensors *f, const accel_state_entry *e, bool *sliced) {
    accel_tp_slice sl;
    *sliced = entry_split(e, &sl);
    if (!*sliced) return NULL;
    const char *path = accel_safetensors_path(f);
    accel_tensor *whole = accel_safetensors_tensor(f, e->name, e->t->dtype);
    if (!whole) return NULL;
    bool fits = whole->ndim == e->t->ndim && whole->shape[sl.dim] == whole_size(&sl);
    for (int d = 0; fits && d < whole->ndim; d++) fits = d == sl.dim || whole->shape[d] == e->t->shape[d];
    accel_tensor *cut = NULL;
    if (!fits)
        accel_set_error(ACCEL_ERR_FORMAT, "accel_accelerator_load_state: %s: %s has the wrong shape for this rank's "
                        "tensor-parallel slice (%lld of dimension %d's whole %lld, in %d part%s)", path, e->name,
                        (long long)e->t->shape[sl.dim], sl.dim, (long long)whole_size(&sl), sl.n_parts,
                        sl.n_parts > 1 ? "s" : "");
    else
        cut = accel__tp_cut(whole, &sl);
    accel_tensor_free(whole);
    return cut;
}

bool accel__tp_file_shape(const accel_state_entry *e, int64_t *shape) {
    accel_tp_slice sl;
    for (int d = 0; d < e->t->ndim; d++) shape[d] = e->t->shape[d];
    if (!entry_split(e, &sl)) return false;
    shape[sl.dim] = whole_size(&sl);
    return true;
}

accel_status accel__tp_load_entry(accel_safetensors *f, const accel_state_entry *e, bool *sliced) {
    accel_tensor *cut = accel__tp_read_slice(f, e, sliced);
    if (!*sliced) return ACCEL_OK;
    bool prev = accel_set_grad_enabled(false);
    accel_status st = cut ? accel_copy_(e->t, cut) : accel_last_status();
    accel_set_grad_enabled(prev);
    accel_tensor_free(cut);
    return st;
}

/* The prepared models' state dicts, to find an optimizer segment's parameter in. */
typedef struct model_dicts {
    accel_state_dict *sd[ACCEL__MAX_PREPARED];
    int n;
} model_dicts;

static accel_status dicts_open(accel_accelerator *acc, model_dicts *md) {
    md->n = 0;
    for (int i = 0; i < acc->n_models; i++, md->n++)
        if (!(md->sd[i] = accel_module_state_dict(acc->models[i].m))) return accel_last_status();
    return ACCEL_OK;
}

static void dicts_close(model_dicts *md) {
    for (int i = 0; i < md->n; i++) accel_state_dict_free(md->sd[i]);
}

/* The parameter of named state entry e ("state.<u>.<name>", a tensor) of
 * optimizer i when it is a tp slice (with its split), else NULL; *err when
 * parameter u belongs to no prepared model (its split is unknown). u is the
 * user's numbering: under ZeRO the strategy's re-targeted optimizer still
 * names its consolidated state by the user's parameters (user_param); under
 * pp the optimizer as it was built (acc->pp_opt: the other stages'
 * parameters too, on meta here, whose slice is known all the same), in
 * which a pp checkpoint numbers it (a u beyond it: no slice here, the
 * pipeline's load names it). */
static accel_tensor *state_split(accel_accelerator *acc, const model_dicts *md, int oi, const accel_named_state *e,
                                 accel_tp_slice *sl, bool *err) {
    int u, at = 0;
    *err = false;
    /* "state.<u>.step" is a scalar (a one-element tensor once loaded) */
    if (!e->t || sscanf(e->name, "state.%d.%n", &u, &at) != 1 || !at || !strcmp(e->name + at, "step")) return NULL;
    const accel__pp_opt *po = acc->pp_opt[oi];
    if (po && (u < 0 || u >= po->n)) return NULL;
    accel_tensor *p = po                              ? po->params[u]
                      : accel__optimizer_model(acc, oi) ? acc->strat->user_param(acc, oi, u)
                                                        : accel_optimizer_segment_param(acc->opts[oi], u, NULL);
    for (int m = 0; p && m < md->n; m++)
        for (int k = 0; k < md->sd[m]->n; k++)
            if (md->sd[m]->entries[k].t == p)
                return entry_split(&md->sd[m]->entries[k], sl) ? p : NULL;
    *err = true;
    accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: the optimizer's parameter %d is not a parameter of a prepared "
                    "model: its tensor-parallel slice is unknown", e->name, u);
    return NULL;
}

/* What replaces the state t of tp-sliced parameter p (this rank's slice
 * sl of the whole): a new tensor, NULL + error. */
typedef accel_tensor *(*state_map)(accel_accelerator *acc, accel_tensor *p, const accel_named_state *t,
                                   const accel_tp_slice *sl);

/* Every state tensor of a tp-sliced parameter of optimizer i replaced by
 * fn's; the other entries kept. */
static accel_status map_sliced(accel_accelerator *acc, int oi, int n, accel_named_state *st, state_map fn) {
    if (TP(acc) == 1) return ACCEL_OK;
    model_dicts md;
    accel_status s = dicts_open(acc, &md);
    for (int k = 0; k < n && !s; k++) {
        accel_tp_slice sl;
        bool err;
        accel_tensor *p = state_split(acc, &md, oi, &st[k], &sl, &err), *t = NULL;
        if (err || (p && !(t = fn(acc, p, &st[k], &sl)))) s = accel_last_status();
        if (!t) continue;
        accel_tensor_free(st[k].t);
        st[k].t = t;
    }
    dicts_close(&md);
    return s;
}

/* The flat state seen in its parameter's shape, so the slices join along the
 * split; the whole flat again, as a one-process optimizer lists it. */
static accel_tensor *gather_state(accel_accelerator *acc, accel_tensor *p, const accel_named_state *e,
                                  const accel_tp_slice *sl) {
    accel_pg *tp = accel_accelerator_tp_group(acc);
    int64_t flat = accel_numel(e->t) * TP(acc);
    bool prev = accel_set_grad_enabled(false);
    accel_tensor *as_p = tp ? accel_reshape(e->t, p->ndim, p->shape) : NULL;
    accel_set_grad_enabled(prev);
    return as_p ? gather_whole(tp, as_p, sl, 1, &flat) : NULL;
}

/* The whole flat state cut as the plan cuts its parameter. */
static accel_tensor *slice_state(accel_accelerator *acc, accel_tensor *p, const accel_named_state *e,
                                 const accel_tp_slice *sl) {
    (void)acc;
    int64_t shape[2] = {p->shape[0], p->ndim == 2 ? p->shape[1] : 1};
    shape[sl->dim] = whole_size(sl);
    if (accel_numel(e->t) != shape[0] * shape[1]) {
        accel_set_error(ACCEL_ERR_FORMAT, "accel_accelerator_load_state: optimizer state %s has %lld elements; the "
                        "whole parameter has %lld", e->name, (long long)accel_numel(e->t),
                        (long long)(shape[0] * shape[1]));
        return NULL;
    }
    bool prev = accel_set_grad_enabled(false);
    accel_tensor *whole = accel_reshape(e->t, p->ndim, shape);
    accel_tensor *cut = whole ? accel__tp_cut(whole, sl) : NULL;
    accel_set_grad_enabled(prev);
    return cut;
}

accel_status accel__tp_gather_optimizer(accel_accelerator *acc, int oi, int n, accel_named_state *st) {
    return map_sliced(acc, oi, n, st, gather_state);
}

accel_status accel__tp_slice_optimizer(accel_accelerator *acc, int oi, int n, accel_named_state *st) {
    return map_sliced(acc, oi, n, st, slice_state);
}

accel_status accel__tp_sp_reduce(accel_accelerator *acc, accel__model *pm) {
    if (TP(acc) == 1 || !acc->par.sequence_parallel || pm->no_sync) return ACCEL_OK;
    accel_pg *tp = accel_accelerator_tp_group(acc);
    return tp ? accel_module_tp_reduce_grads(pm->m, tp) : accel_last_status();
}

/* ---- an optimizer made over the whole model, prepared in the same call */

accel_status accel__tp_segment_entries(accel_accelerator *acc, accel_module *m, accel_optimizer *opt, int **where) {
    *where = NULL;
    int n = accel_optimizer_num_segments(opt);
    if (TP(acc) == 1 || n == 0) return ACCEL_OK;
    accel_state_dict *sd = accel_module_state_dict(m);
    int *w = sd ? accel_malloc((size_t)n * sizeof *w) : NULL;
    accel_status st = w ? ACCEL_OK : accel_last_status();
    bool any = false, flat = false;
    for (int k = 0; !st && k < n; k++) {
        accel_tensor *p = accel_optimizer_segment_param(opt, k, NULL);
        w[k] = -1;
        flat |= !p; /* a flat run: a strategy re-targeted it already */
        for (int i = 0, q = 0; p && i < sd->n && w[k] < 0; q += !sd->entries[i++].is_buffer)
            if (sd->entries[i].t == p && !sd->entries[i].is_buffer) w[k] = q;
        any |= w[k] >= 0;
    }
    accel_state_dict_free(sd);
    if (!st && any && !flat) *where = w;
    else accel_free(w);
    return st;
}

/* The q-th parameter (buffers not counted) of sd's entries, NULL past the last. */
static accel_tensor *nth_param(const accel_state_dict *sd, int q) {
    for (int i = 0; i < sd->n; i++)
        if (!sd->entries[i].is_buffer && q-- == 0) return sd->entries[i].t;
    return NULL;
}

accel_status accel__tp_retarget_optimizer(accel_module *m, accel_optimizer *opt, const int *where) {
    int n = accel_optimizer_num_segments(opt);
    accel_state_dict *sd = accel_module_state_dict(m);
    accel_tensor **params = sd ? accel_malloc((size_t)n * sizeof *params) : NULL;
    int *groups = params ? accel_malloc((size_t)n * sizeof *groups) : NULL;
    accel_status st = groups ? ACCEL_OK : accel_last_status();
    bool changed = false;
    for (int k = 0; !st && k < n; k++) {
        /* the segment's old pointer is only compared: the plan freed the tensor it names */
        params[k] = accel_optimizer_segment_param(opt, k, &groups[k]);
        accel_tensor *now = where[k] < 0 ? NULL : nth_param(sd, where[k]);
        if (!now || now == params[k]) continue;
        params[k] = now;
        changed = true;
    }
    if (!st && changed) st = accel_optimizer_set_segments(opt, n, params, NULL, NULL, groups);
    accel_free(groups);
    accel_free(params);
    accel_state_dict_free(sd);
    return st;
}

accel_status accel__tp_after_backward(accel_accelerator *acc) {
    if (TP(acc) == 1 || !acc->par.sequence_parallel || !acc->sync_gradients) return ACCEL_OK;
    for (int i = 0; i < acc->n_models; i++)
        if (acc->models[i].strat->sp_reduce(acc, &acc->models[i])) return accel_last_status();
    return ACCEL_OK;
}
