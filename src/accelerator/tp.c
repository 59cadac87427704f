/* Tensor parallelism under the accelerator (opts.parallelism.tp_size > 1):
 * the mesh's tp group, the plan applied to a model at prepare (the
 * decoder families' own, or the user's accel_module_parallelize over
 * accel_accelerator_tp_group), the gradient norm that counts tp-sharded
 * parameters over the tp group and replicated ones once. DDP and ZeRO run
 * over the data-parallel groups only (dp_pg, shard_pg, replica_pg: the
 * mesh's, which leave tp out), so each tp rank averages its own slices. */
#include <math.h>
#include <string.h>

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
        accel_tp_style style;
        /* a row-parallel bias is whole on every rank: replicated */
        bool sharded = accel_module_tp_info(e->owner, &style, NULL, NULL, NULL) &&
                       (style != ACCEL_TP_ROWWISE || e->t->ndim == 2);
        double p = accel_grad_norm_partial(e->t->grad, norm_type);
        part[sharded] = inf ? fmax(part[sharded], p) : part[sharded] + p;
    }
    accel_state_dict_free(sd);
    accel_pg *tp = accel_accelerator_tp_group(acc);
    if (!tp || accel_pg_all_reduce(tp, &part[1], 1, ACCEL_F64, inf ? ACCEL_REDUCE_MAX : ACCEL_REDUCE_SUM))
        return NAN;
    return inf ? fmax(part[0], part[1]) : part[0] + part[1];
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
 * order), gathered over the tp group into a new tensor (collective). */
static accel_tensor *gather_whole(accel_pg *tp, accel_tensor *t, int dim) {
    int n = accel_pg_size(tp);
    int64_t shape[2] = {t->shape[0], t->ndim == 2 ? t->shape[1] : 1};
    size_t es = accel_dtype_size(t->dtype), numel = (size_t)accel_numel(t);
    accel_tensor *whole = accel_tensor_new(t->dtype, t->ndim, (int64_t[]){dim ? shape[0] : shape[0] * n,
                                                                         dim ? shape[1] * n : shape[1]},
                                           ACCEL_CPU_DEVICE);
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
        accel_tp_style style;
        if (e->is_tied_alias) { /* the whole tensor of the name it aliases */
            for (int j = 0; j < i; j++)
                if (sd->entries[j].t == e->t) whole[i] = whole[j];
            continue;
        }
        if (!accel_module_tp_info(e->owner, &style, NULL, NULL, NULL) || (style == ACCEL_TP_ROWWISE && e->t->ndim != 2))
            continue;
        if (e->t->device.type != ACCEL_DEV_CPU)
            st = accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s is not on the cpu: gathering tensor-parallel slices "
                                 "runs on host memory", e->name);
        else if (!(whole[i] = gather_whole(tp, e->t, style == ACCEL_TP_ROWWISE)))
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
