/* Tensor parallelism under the accelerator (opts.parallelism.tp_size > 1):
 * the mesh's tp group, the plan applied to a model at prepare (the
 * decoder families' own, or the user's accel_module_parallelize over
 * accel_accelerator_tp_group), the gradient norm that counts tp-sharded
 * parameters over the tp group and replicated ones once. DDP and ZeRO run
 * over the data-parallel groups only (dp_pg, shard_pg, replica_pg: the
 * mesh's, which leave tp out), so each tp rank averages its own slices. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "accel/io.h"
#include "accel/optim.h"
#include "accel/parallel.h"
#include "accelerator_internal.h"
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
    if (acc->mp == ACCEL_MP_FP8)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: mixed_precision fp8 with opts.parallelism.tp_size %d: fp8 "
                               "Linears are not tensor-parallel yet", FN, TP(acc));
    if (acc->par.sequence_parallel && acc->strat->stage > 0)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: opts.parallelism.sequence_parallelism with ZeRO stage %d: "
                               "sequence parallelism runs with DDP (zero_stage 0) only yet", FN, acc->strat->stage);
    accel_pg *tp = accel_accelerator_tp_group(acc);
    if (!tp) return accel_last_status();
    accel_module *foreign = NULL;
    if (find_tp(m, tp, &foreign)) {
        char path[256];
        if (foreign)
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: %s is parallelized over another group than the "
                                   "accelerator's tp group (accel_accelerator_tp_group)", FN,
                                   accel_module_path(foreign, path, sizeof path));
        return ACCEL_OK; /* the user's plan, applied already */
    }
    int own = accel__tp_own_plan(m, tp, acc->par.sequence_parallel);
    if (own) return own > 0 ? ACCEL_OK : accel_last_status();
    return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: opts.parallelism.tp_size is %d, but the model (%s) has no "
                           "tensor-parallel plan of its own: parallelize it first with accel_module_parallelize("
                           "model, plan, n, accel_accelerator_tp_group(acc))", FN, TP(acc), m->ops->type_name);
}

/* Whether entry e is a tp slice (a row-parallel bias is whole on every
 * rank: replicated), with the split dimension and its slice
 * [*start, *start + *local). */
static bool entry_split(const accel_state_entry *e, int *dim, int64_t *start, int64_t *local) {
    accel_tp_style style;
    accel_pg *pg;
    int64_t s, full;
    if (!accel_module_tp_info(e->owner, &style, &pg, &s, &full) || (style == ACCEL_TP_ROWWISE && e->t->ndim != 2))
        return false;
    if (dim) *dim = style == ACCEL_TP_ROWWISE;
    if (start) *start = s;
    if (local) *local = full / accel_pg_size(pg);
    return true;
}

/* Per-parameter partial norms of m's gradients, tp-sharded ones combined
 * over the tp group. */
double accel__tp_grad_norm_partial(accel_accelerator *acc, accel_module *m, double norm_type) {
    accel_state_dict *sd = accel_module_state_dict(m);
    if (!sd) return NAN;
    bool inf = isinf(norm_type);
    double part[2] = {0, 0}; /* replicated, sharded */
    for (int i = 0; i < sd->n; i++) {
        const accel_state_entry *e = &sd->entries[i];
        if (e->is_buffer || e->is_tied_alias || !e->t->grad) continue;
        bool sharded = entry_split(e, NULL, NULL, NULL);
        double p = accel_grad_norm_partial(e->t->grad, norm_type);
        part[sharded] = inf ? fmax(part[sharded], p) : part[sharded] + p;
    }
    accel_state_dict_free(sd);
    accel_pg *tp = accel_accelerator_tp_group(acc);
    if (!tp || accel_pg_all_reduce(tp, &part[1], 1, ACCEL_F64, inf ? ACCEL_REDUCE_MAX : ACCEL_REDUCE_SUM))
        return NAN;
    return inf ? fmax(part[0], part[1]) : part[0] + part[1];
}

double accel__tp_param_norm_partial(accel_accelerator *acc, accel_module *m, accel_tensor *w, double norm_type) {
    double p = accel_grad_norm_partial(w->grad, norm_type); /* a NAN still joins the sum: no rank left waiting */
    bool sliced = false;
    if (TP(acc) == 1) return p;
    if (accel__tp_sliced(m, &w, 1, &sliced)) return NAN;
    if (!sliced) return p;
    accel_pg *tp = accel_accelerator_tp_group(acc);
    if (!tp || accel_pg_all_reduce(tp, &p, 1, ACCEL_F64, isinf(norm_type) ? ACCEL_REDUCE_MAX : ACCEL_REDUCE_SUM))
        return NAN;
    return p;
}

accel_status accel__tp_sliced(accel_module *m, accel_tensor *const *ts, int n, bool *sliced) {
    accel_state_dict *sd = accel_module_state_dict(m);
    if (!sd) return accel_last_status();
    for (int j = 0; j < n; j++) {
        sliced[j] = false;
        for (int i = 0; i < sd->n && !sliced[j]; i++)
            sliced[j] = sd->entries[i].t == ts[j] && entry_split(&sd->entries[i], NULL, NULL, NULL);
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

/* The whole tensor t (this rank's slice of `dim`, tp ranks' slices in rank
 * order), gathered over the tp group into a new tensor (collective); flat:
 * as one dimension (the optimizer's state of a parameter). */
static accel_tensor *gather_whole(accel_pg *tp, accel_tensor *t, int dim, bool flat) {
    int n = accel_pg_size(tp);
    int64_t shape[2] = {t->shape[0], t->ndim == 2 ? t->shape[1] : 1};
    size_t es = accel_dtype_size(t->dtype), numel = (size_t)accel_numel(t);
    int64_t whole_shape[2] = {dim ? shape[0] : shape[0] * n, dim ? shape[1] * n : shape[1]};
    if (flat) whole_shape[0] = (int64_t)numel * n;
    accel_tensor *whole = accel_tensor_new(t->dtype, flat ? 1 : t->ndim, whole_shape, ACCEL_CPU_DEVICE);
    char *recv = accel_malloc(numel * (size_t)n * es + 1);
    accel_tensor *c = accel_is_contiguous(t) ? t : NULL;
    bool ok = whole && recv && (c || (c = accel_tensor_new(t->dtype, t->ndim, t->shape, ACCEL_CPU_DEVICE)));
    ok = ok && (c == t || accel_copy_(c, t) == ACCEL_OK) &&
         accel_pg_all_gather(tp, c->data, recv, numel, t->dtype) == ACCEL_OK;
    if (ok && dim == 0) memcpy(whole->data, recv, numel * (size_t)n * es);
    /* columns: rank r's [rows, cols] block goes to columns [r cols, (r + 1) cols) of every row */
    size_t row = (size_t)shape[1] * es;
    for (int64_t i = 0; ok && dim == 1 && i < shape[0]; i++)
        for (int r = 0; r < n; r++)
            memcpy((char *)whole->data + ((size_t)i * (size_t)n + (size_t)r) * row,
                   recv + (size_t)r * numel * es + (size_t)i * row, row);
    if (c != t) accel_tensor_free(c);
    accel_free(recv);
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
        int dim;
        if (e->is_tied_alias) { /* the whole tensor of the name it aliases */
            for (int j = 0; j < i; j++)
                if (sd->entries[j].t == e->t) whole[i] = whole[j];
            continue;
        }
        if (!entry_split(e, &dim, NULL, NULL)) continue;
        if (e->t->device.type != ACCEL_DEV_CPU)
            st = accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s is not on the cpu: gathering tensor-parallel slices "
                                 "runs on host memory", e->name);
        else if (!(whole[i] = gather_whole(tp, e->t, dim, false)))
            st = accel_last_status();
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

accel_status accel__tp_load_entry(accel_safetensors *f, const accel_state_entry *e, bool *sliced) {
    int dim;
    int64_t start, local;
    *sliced = entry_split(e, &dim, &start, &local);
    if (!*sliced) return ACCEL_OK;
    const char *path = accel_safetensors_path(f);
    accel_tensor *whole = accel_safetensors_tensor(f, e->name, e->t->dtype);
    if (!whole) return accel_last_status();
    int64_t full;
    accel_module_tp_info(e->owner, NULL, NULL, NULL, &full);
    bool fits = whole->ndim == e->t->ndim && whole->shape[dim] == full;
    for (int d = 0; fits && d < whole->ndim; d++) fits = d == dim || whole->shape[d] == e->t->shape[d];
    accel_status st = ACCEL_OK;
    if (!fits) {
        st = accel_set_error(ACCEL_ERR_FORMAT, "accel_accelerator_load_state: %s: %s has the wrong shape for this "
                             "rank's tensor-parallel slice (rows or columns [%lld, %lld) of dimension %d)", path,
                             e->name, (long long)start, (long long)(start + local), dim);
    } else {
        accel_tensor *cut = accel__tp_cut(whole, dim, start, local);
        bool prev = accel_set_grad_enabled(false);
        st = cut ? accel_copy_(e->t, cut) : accel_last_status();
        accel_set_grad_enabled(prev);
        accel_tensor_free(cut);
    }
    accel_tensor_free(whole);
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

/* The parameter of named state entry e ("state.<i>.<name>", a tensor) of opt
 * when it is a tp slice (with its split), else NULL; *err when segment i's
 * parameter belongs to no prepared model (its split is unknown). */
static accel_tensor *state_split(const model_dicts *md, accel_optimizer *opt, const accel_named_state *e, int *dim,
                                 int64_t *start, int64_t *local, bool *err) {
    int i, at = 0;
    *err = false;
    /* "state.<i>.step" is a scalar (a one-element tensor once loaded) */
    if (!e->t || sscanf(e->name, "state.%d.%n", &i, &at) != 1 || !at || !strcmp(e->name + at, "step")) return NULL;
    accel_tensor *p = accel_optimizer_segment_param(opt, i, NULL);
    for (int m = 0; p && m < md->n; m++)
        for (int k = 0; k < md->sd[m]->n; k++)
            if (md->sd[m]->entries[k].t == p)
                return entry_split(&md->sd[m]->entries[k], dim, start, local) ? p : NULL;
    *err = true;
    accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: the optimizer's parameter %d is not a parameter of a prepared "
                    "model: its tensor-parallel slice is unknown", e->name, i);
    return NULL;
}

accel_status accel__tp_gather_optimizer(accel_accelerator *acc, accel_optimizer *opt, int n, accel_named_state *st) {
    if (TP(acc) == 1) return ACCEL_OK;
    accel_pg *tp = accel_accelerator_tp_group(acc);
    model_dicts md;
    accel_status s = tp ? dicts_open(acc, &md) : accel_last_status();
    for (int k = 0; k < n && !s; k++) {
        int dim;
        bool err;
        accel_tensor *p = state_split(&md, opt, &st[k], &dim, NULL, NULL, &err);
        if (err) s = accel_last_status();
        if (!p || s) continue;
        if (st[k].t->device.type != ACCEL_DEV_CPU || !accel_is_contiguous(st[k].t)) {
            s = accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s is not contiguous on the cpu: gathering tensor-parallel "
                                "slices runs on host memory", st[k].name);
            break;
        }
        /* the flat state seen in its parameter's shape, so the slices join along the split */
        accel_tensor *view = accel_tensor_wrap(st[k].t->data, st[k].t->dtype, p->ndim, p->shape, ACCEL_CPU_DEVICE);
        accel_tensor *whole = view ? gather_whole(tp, view, dim, true) : NULL;
        accel_tensor_free(view);
        if (!whole) {
            s = accel_last_status();
            break;
        }
        accel_tensor_free(st[k].t);
        st[k].t = whole;
    }
    if (tp) dicts_close(&md);
    return s;
}

accel_status accel__tp_slice_optimizer(accel_accelerator *acc, accel_optimizer *opt, int n, accel_named_state *st) {
    if (TP(acc) == 1) return ACCEL_OK;
    model_dicts md;
    accel_status s = dicts_open(acc, &md);
    for (int k = 0; k < n && !s; k++) {
        int dim;
        int64_t start, local;
        bool err;
        accel_tensor *p = state_split(&md, opt, &st[k], &dim, &start, &local, &err);
        if (err) s = accel_last_status();
        if (!p || s) continue;
        int64_t shape[2] = {p->shape[0], p->ndim == 2 ? p->shape[1] : 1};
        shape[dim] *= TP(acc);
        if (accel_numel(st[k].t) != shape[0] * shape[1]) {
            s = accel_set_error(ACCEL_ERR_FORMAT, "accel_accelerator_load_state: optimizer state %s has %lld "
                                "elements; the whole parameter has %lld", st[k].name,
                                (long long)accel_numel(st[k].t), (long long)(shape[0] * shape[1]));
            break;
        }
        bool prev = accel_set_grad_enabled(false);
        accel_tensor *whole = accel_reshape(st[k].t, p->ndim, shape);
        accel_tensor *cut = whole ? accel__tp_cut(whole, dim, start, local) : NULL;
        accel_set_grad_enabled(prev);
        if (!cut) {
            s = accel_last_status();
            break;
        }
        accel_tensor_free(st[k].t);
        st[k].t = cut;
    }
    dicts_close(&md);
    return s;
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
        for (int i = 0; p && i < sd->n && w[k] < 0; i++)
            if (sd->entries[i].t == p && !sd->entries[i].is_buffer) w[k] = i;
        any |= w[k] >= 0;
    }
    accel_state_dict_free(sd);
    if (!st && any && !flat) *where = w;
    else accel_free(w);
    return st;
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
        if (where[k] < 0 || sd->entries[where[k]].t == params[k]) continue;
        params[k] = sd->entries[where[k]].t;
        changed = true;
    }
    if (!st && changed) st = accel_optimizer_set_segments(opt, n, params, NULL, NULL, groups);
    accel_free(groups);
    accel_free(params);
    accel_state_dict_free(sd);
    return st;
}

accel_status accel__tp_refused(const accel_accelerator *acc, const char *fn, const char *what) {
    if (TP(acc) == 1) return ACCEL_OK;
    return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: opts.parallelism.tp_size is %d: %s", fn, TP(acc), what);
}

accel_status accel__tp_after_backward(accel_accelerator *acc) {
    if (TP(acc) == 1 || !acc->par.sequence_parallel || !acc->sync_gradients) return ACCEL_OK;
    accel_pg *tp = accel_accelerator_tp_group(acc);
    if (!tp) return accel_last_status();
    for (int i = 0; i < acc->n_models; i++)
        if (!acc->models[i].no_sync && accel_module_tp_reduce_grads(acc->models[i].m, tp)) return accel_last_status();
    return ACCEL_OK;
}
