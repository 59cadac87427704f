/* src/accelerator/pipeline.c — pipeline parallelism over the mesh's pp
 * dimension: accel_accelerator_pipeline_step (accel/accelerator.h).
 *
 * The ranks of a pp group (mesh.h: the same coordinates but along pp) are the
 * stages of one model (nn/family.h, the family's stage hooks: stage s runs a range of
 * layers; stage 0 the embeddings too, the last the final norm, lm_head and
 * the loss). A batch ids [B, T] - the same on every stage of a group, as the
 * data loader shards by dp rank only - is cut into m micro-batches of B / m
 * rows, which go through the stages in one of two schedules:
 *
 *   GPipe  every forward, then every backward;
 *   1F1B   stage s runs min(p - 1 - s, m) forwards ("warm-up"), then one
 *          forward and one backward in turn, then the remaining backwards
 *          (Megatron's non-interleaved schedule).
 *
 * Between stages travel the hidden states [B/m, T, C] (forward) and their
 * gradients (backward), point to point (accel_pg_send_recv): a stage's
 * outgoing message is sent together with the next receive it makes, as
 * Megatron's send_forward_recv_backward pairs them, so neighbours that send
 * to each other at once never deadlock.
 *
 * Recompute: a forward runs without a graph and keeps only the stage's input
 * (ids on stage 0); the micro-batch's backward runs its forward again with
 * grad on and back-propagates at once (full activation recomputation, as
 * Megatron's --recompute-granularity full). The tape then never holds two
 * micro-batches, and what a stage holds between its forward and backward of
 * a micro-batch is its input: at most m of them under GPipe, p - s under
 * 1F1B - the memory difference the schedules exist for. The recompute is
 * deterministic (no dropout in these models), so gradients are those of one
 * process's step over the whole batch, within rounding. (The step arena
 * still keeps each micro-batch's intermediates until accel_step_reset: a
 * rewind between micro-batches would free what the step's caches of
 * prepared weights hold. What the schedule bounds is the saved inputs.)
 *
 * The loss of micro-batch i is scaled by 1/m (and by the accelerator's
 * accumulation and fp16 factors, as accel_accelerator_backward does), so the
 * gradients accumulated over the m backwards are the batch's; the reported
 * loss, the mean over the micro-batches, is broadcast from the last stage.
 * DDP (over acc->dp_pg, which excludes pp) reduces only in the last
 * micro-batch's backward; a tied lm_head's gradient (the embedding's, used
 * on the first and the last stage) is summed over the pp group on sync
 * steps. A stage holds only its part of the model (accel__pipeline_release
 * at prepare: the other stages' parameters on meta, the flat buffers and the
 * optimizer over what it kept). */
#include <math.h>
#include <string.h>

#include "accel/parallel.h"
#include "accelerator_internal.h"
#include "nn/family.h"
#include "strategy.h"

#define FN "accel_accelerator_pipeline_step"

typedef struct pp_run {
    accel_accelerator *acc;
    accel_module *model;
    const accel__family_stages *hooks; /* the model's family's (nn/family.h) */
    accel__model *pm;
    accel_pg *pg;             /* the pp group (NULL: one stage) */
    int stage, stages, m, lo, hi;
    bool first, last;
    accel_tensor *ids;        /* [B, T] */
    int64_t rows, T, C;       /* a micro-batch's hidden states [rows, T, C]: T the ids' positions, a
                               * tp rank's share of them under sequence parallelism */
    accel_dtype dt;           /* of the hidden states */
    size_t numel;             /* rows T C */
    void **held;              /* [m]: saved inputs (stages > 0), accel_malloc'd */
    int in_flight;
    void *out_buf;            /* the pending outgoing message's bytes */
    int out_peer;             /* -1: none pending */
    double loss_sum, busy_s;
    accel_pipeline_report rep;
} pp_run;

/* ids rows of micro-batch i: [rows, T]. */
static accel_tensor *micro_ids(pp_run *r, int i) {
    return accel_slice(r->ids, 0, (int64_t)i * r->rows, (int64_t)(i + 1) * r->rows, 1);
}

/* Receives count elements of the hidden states' dtype from peer into buf,
 * sending the pending message (if any) at the same time. */
static accel_status exchange(pp_run *r, void *buf, int peer) {
    accel_status st = accel_pg_send_recv(r->pg, r->out_buf, r->numel, r->out_peer, buf, buf ? r->numel : 0,
                                         buf ? peer : -1, r->dt);
    r->out_peer = -1;
    return st;
}

/* t's values become the pending message to peer. */
static accel_status post(pp_run *r, accel_tensor *t, int peer) {
    if (!t) return accel_last_status();
    if (accel_numel(t) != (int64_t)r->numel || t->dtype != r->dt)
        return accel_set_error(ACCEL_ERR_SHAPE, FN ": stage %d made %lld %s values where %zu %s were expected",
                               r->stage, (long long)accel_numel(t), accel_dtype_name(t->dtype), r->numel,
                               accel_dtype_name(r->dt));
    if (accel_tensor_to_host(accel_contiguous(t), r->out_buf) != ACCEL_OK) return accel_last_status();
    r->out_peer = peer;
    return ACCEL_OK;
}

/* A step tensor [rows, T, C] holding the bytes at src. */
static accel_tensor *hidden_from(pp_run *r, const void *src) {
    accel_tensor *x = accel_empty_on(r->dt, 3, (int64_t[]){r->rows, r->T, r->C}, r->acc->device);
    return x && accel_tensor_from_host(x, src) == ACCEL_OK ? x : NULL;
}

static accel_status forward(pp_run *r, int i) {
    accel_status st = ACCEL_OK;
    accel_tensor *x;
    if (r->first) {
        x = micro_ids(r, i);
        if (r->out_peer >= 0) st = exchange(r, NULL, -1);
    } else {
        if (!(r->held[i] = accel_malloc(r->numel * accel_dtype_size(r->dt)))) return accel_last_status();
        st = exchange(r, r->held[i], r->stage - 1);
        x = st ? NULL : hidden_from(r, r->held[i]);
    }
    if (!st && !x) st = accel_last_status();
    if (!st) {
        r->in_flight++;
        if (r->in_flight > r->rep.peak_in_flight) r->rep.peak_in_flight = r->in_flight;
        double t0 = accel_now_seconds();
        bool was = accel_set_grad_enabled(false);
        accel_tensor *y = r->hooks->forward(r->model, x, r->lo, r->hi, r->first, r->last);
        if (r->last) {
            accel_tensor *loss = r->hooks->loss(r->model, y, micro_ids(r, i));
            if (loss) r->loss_sum += accel_item(loss);
            else st = accel_last_status();
        } else {
            st = post(r, y, r->stage + 1);
        }
        accel_set_grad_enabled(was);
        r->busy_s += accel_now_seconds() - t0;
    }
    return st;
}

static accel_status backward(pp_run *r, int i) {
    accel_status st = ACCEL_OK;
    accel_tensor *grad = NULL, *x = r->first ? micro_ids(r, i) : hidden_from(r, r->held[i]);
    if (!x) st = accel_last_status();
    if (!st && !r->last) {
        void *g = accel_malloc(r->numel * accel_dtype_size(r->dt));
        if (!g) st = accel_last_status();
        else {
            st = exchange(r, g, r->stage + 1);
            grad = st ? NULL : hidden_from(r, g);
            if (!st && !grad) st = accel_last_status();
            accel_free(g);
        }
    } else if (!st && r->out_peer >= 0) {
        st = exchange(r, NULL, -1);
    }
    if (st) return st;
    double t0 = accel_now_seconds();
    if (!r->first) (void)accel_requires_grad_(x, true); /* x is a live tensor (st is OK): cannot fail */
    /* DDP reduces in the last backward of the step only */
    bool no_sync = r->pm->no_sync;
    r->pm->no_sync = no_sync || i != r->m - 1;
    accel__backward_begin(r->acc);
    accel_tensor *y = r->hooks->forward(r->model, x, r->lo, r->hi, r->first, r->last);
    if (r->last) {
        double scale = 1.0 / r->m / r->acc->accum_steps * (r->acc->mp == ACCEL_MP_FP16 ? r->acc->scale : 1.0);
        accel_tensor *loss = accel_mul_scalar(r->hooks->loss(r->model, y, micro_ids(r, i)), scale);
        st = loss ? accel_backward(loss) : accel_last_status();
    } else {
        st = y ? accel_backward_with(y, grad) : accel_last_status();
    }
    accel_status end = accel__backward_end(r->acc);
    r->pm->no_sync = no_sync;
    if (!st) st = end;
    r->busy_s += accel_now_seconds() - t0;
    if (!st && !r->first) st = x->grad ? post(r, x->grad, r->stage - 1)
                                       : accel_set_error(ACCEL_ERR_STATE, FN ": stage %d's input got no gradient",
                                                         r->stage);
    if (!r->first) {
        accel_free(r->held[i]);
        r->held[i] = NULL;
    }
    r->in_flight--;
    return st;
}

/* The schedule: ops[k] = i (forward of micro-batch i) or -1 - i (its backward). */
static int schedule(const pp_run *r, bool gpipe, int *ops) {
    int n = 0, m = r->m;
    if (gpipe) {
        for (int i = 0; i < m; i++) ops[n++] = i;
        for (int i = 0; i < m; i++) ops[n++] = -1 - i;
        return n;
    }
    int warm = r->stages - 1 - r->stage < m ? r->stages - 1 - r->stage : m, f = 0, b = 0;
    while (f < warm) ops[n++] = f++;
    while (f < m) {
        ops[n++] = f++;
        ops[n++] = -1 - b++;
    }
    while (b < m) ops[n++] = -1 - b++;
    return n;
}

/* A tied lm_head's weight is the embedding's: stage 0's and the last stage's
 * gradients of it are summed over the pp group (the middle stages, which do
 * not use it, add zeros and keep none). */
static accel_status sum_tied(pp_run *r) {
    accel_tensor *w = r->stages == 1 ? NULL : r->hooks->tied_embedding(r->model);
    if (!w) return ACCEL_OK;
    bool mine = r->first || r->last;
    size_t n = (size_t)accel_numel(w), bytes = n * accel_dtype_size(w->dtype);
    void *h = accel_calloc(1, bytes ? bytes : 1);
    if (!h) return accel_last_status();
    accel_status st = mine && w->grad ? accel_tensor_to_host(w->grad, h) : ACCEL_OK;
    if (!st) st = accel_pg_all_reduce(r->pg, h, n, w->dtype, ACCEL_REDUCE_SUM);
    if (!st && mine && !w->grad) { /* a stage whose part gave none (cannot happen after a backward) */
        accel_tensor *z = accel_empty_on(w->dtype, w->ndim, w->shape, w->device);
        if (!z || accel_zero_(z) != ACCEL_OK || accel_grad_accumulate(w, z) != ACCEL_OK) st = accel_last_status();
    }
    if (!st && mine) st = accel_tensor_from_host(w->grad, h);
    accel_free(h);
    return st;
}

/* The stage hooks of model's family (nn/family.h); NULL with an error naming
 * fn when the model's family is not cut into stages. */
static const accel__family_stages *hooks_of(accel_module *model, const char *fn) {
    const accel__family *f = accel__family_of(model);
    if (!f || !f->stages) {
        accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: pipeline stages cut the models of a family with stage hooks "
                        "(nn/family.h: the decoder families); this model is %s%s", fn,
                        f ? "of the family " : "of no family", f ? f->name : "");
        return NULL;
    }
    return f->stages;
}

/* The stages' layer ranges (first_layer[0..stages]): Megatron's explicit
 * first / last stage sizes with the other stages sharing the rest evenly,
 * else the balanced split. */
static accel_status stage_split(const accel_accelerator *acc, accel_module *model, int stages, int *first_layer,
                                const char *fn) {
    const accel__family_stages *h = hooks_of(model, fn);
    if (!h) return accel_last_status();
    int first = acc->par.pp_first_layers, last = acc->par.pp_last_layers, L = h->n_layers(model, fn);
    if (L < 0) return accel_last_status();
    if ((!first && !last) || stages == 1) return h->split(model, stages, NULL, first_layer, fn);
    int others = stages - (first > 0) - (last > 0), rest = L - first - last;
    if (others == 0 ? rest != 0 : rest < others || rest % others)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: %d layers with %d on the first stage and %d on the last "
                               "(0: not given) leave %d for %d other stage%s: they must share them evenly, at least "
                               "one each", fn, L, first, last, rest, others, others == 1 ? "" : "s");
    int *counts = accel_malloc((size_t)stages * sizeof *counts);
    if (!counts) return accel_last_status();
    for (int s = 0; s < stages; s++) counts[s] = others ? rest / others : 0;
    if (first) counts[0] = first;
    if (last) counts[stages - 1] = last;
    accel_status st = h->split(model, stages, counts, first_layer, fn);
    accel_free(counts);
    return st;
}

accel_status accel_accelerator_pipeline_set_layers(accel_accelerator *acc, int first_stage_layers,
                                                   int last_stage_layers) {
    if (!acc) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_accelerator_pipeline_set_layers: accelerator is NULL");
    if (first_stage_layers < 0 || last_stage_layers < 0)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_accelerator_pipeline_set_layers: layer counts must be "
                               ">= 0 (0: not given), got %d and %d", first_stage_layers, last_stage_layers);
    if (acc->par.size[ACCEL__MESH_PP] > 1 && acc->n_models > 0)
        return accel_set_error(ACCEL_ERR_STATE, "accel_accelerator_pipeline_set_layers: a model is prepared already "
                               "and its stage kept only its layers: set the split before accel_accelerator_prepare");
    acc->par.pp_first_layers = first_stage_layers;
    acc->par.pp_last_layers = last_stage_layers;
    return ACCEL_OK;
}

static accel_status check(accel_accelerator *acc, accel_module *model, accel_tensor *ids, double *loss,
                          accel__model **pm) {
    if (!acc) return accel_set_error(ACCEL_ERR_INVALID_ARG, FN ": accelerator is NULL");
    if (!model || !loss) return accel_set_error(ACCEL_ERR_INVALID_ARG, FN ": model or loss is NULL");
    if (!accel_tensor_check(ids, FN, "ids")) return accel_last_status();
    if (!(*pm = accel__find_model(acc, model)))
        return accel_set_error(ACCEL_ERR_STATE, FN ": the model was not prepared by this accelerator");
    if (!hooks_of(model, FN)) return accel_last_status();
    if (ids->ndim != 2 || ids->shape[1] < 2 || (ids->dtype != ACCEL_I64 && ids->dtype != ACCEL_I32)) {
        char b[64];
        return accel_set_error(ACCEL_ERR_SHAPE, FN ": ids must be [B, T>=2] int64/int32, got %s %s",
                               accel_dtype_name(ids->dtype), accel_shape_str(ids, b, sizeof b));
    }
    int m = acc->par.micro_batches;
    if (ids->shape[0] % m)
        return accel_set_error(ACCEL_ERR_SHAPE, FN ": a batch of %lld rows does not split into %d micro-batches "
                               "(opts.parallelism.num_micro_batches): make the batch size a multiple of it",
                               (long long)ids->shape[0], m);
    if (acc->mp == ACCEL_MP_FP8)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, FN ": fp8 mixed precision is not built with pipeline "
                               "parallelism (its scaling state follows each forward, which a stage recomputes)");
    if ((*pm)->strat->stage != 0)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, FN ": ZeRO stage %d is not built with pipeline_step (its "
                               "gradient and parameter sharding would see one stage's gradients per micro-batch); "
                               "use DDP (zero_stage 0)", (*pm)->strat->stage);
    return ACCEL_OK;
}

accel_status accel_accelerator_pipeline_step(accel_accelerator *acc, accel_module *model, accel_tensor *ids,
                                             double *loss, accel_pipeline_report *report) {
    accel__model *pm = NULL;
    if (check(acc, model, ids, loss, &pm) != ACCEL_OK) return accel_last_status();
    pp_run r = {.acc = acc, .model = model, .hooks = hooks_of(model, FN), .pm = pm, .ids = ids,
                .m = acc->par.micro_batches, .out_peer = -1};
    r.stages = acc->par.size[ACCEL__MESH_PP];
    if (r.stages > 1 && !(r.pg = accel__mesh_group(&acc->mesh, ACCEL__MESH_PP))) return accel_last_status();
    r.stage = r.pg ? accel_pg_rank(r.pg) : 0;
    r.first = r.stage == 0;
    r.last = r.stage == r.stages - 1;
    int *first_layer = accel_malloc(((size_t)r.stages + 1) * sizeof *first_layer);
    int *ops = accel_malloc(2 * (size_t)r.m * sizeof *ops);
    r.held = accel_calloc((size_t)r.m, sizeof *r.held);
    accel_status st = first_layer && ops && r.held ? ACCEL_OK : accel_last_status();
    if (!st) st = stage_split(acc, model, r.stages, first_layer, FN);
    if (!st) {
        r.lo = first_layer[r.stage];
        r.hi = first_layer[r.stage + 1];
        r.rows = ids->shape[0] / r.m;
        int sp = acc->par.sequence_parallel ? acc->mesh.size[ACCEL__MESH_TP] : 1;
        r.T = ids->shape[1] / sp;
        if (ids->shape[1] % sp)
            st = accel_set_error(ACCEL_ERR_SHAPE, FN ": sequence parallelism splits the %lld positions of ids over "
                                 "the %d ranks of the tp group: make the sequence length a multiple of tp_size",
                                 (long long)ids->shape[1], sp);
        r.hooks->hidden(model, &r.C, &r.dt);
        r.numel = (size_t)(r.rows * r.T * r.C);
        if (!st && !(r.out_buf = accel_malloc(r.numel * accel_dtype_size(r.dt)))) st = accel_last_status();
    }
    double t0 = accel_now_seconds();
    int n = st ? 0 : schedule(&r, acc->par.pp_gpipe, ops);
    for (int k = 0; k < n && !st; k++) st = ops[k] >= 0 ? forward(&r, ops[k]) : backward(&r, -1 - ops[k]);
    if (!st && r.out_peer >= 0) st = exchange(&r, NULL, -1); /* the last gradient to the stage before */
    if (!st && acc->sync_gradients) st = sum_tied(&r);
    /* sequence parallelism: the parameters outside the tp regions (the norms)
     * saw their rank's positions only, as after accelerator_backward */
    if (!st && acc->sync_gradients && acc->par.sequence_parallel)
        st = accel_module_tp_reduce_grads(model, accel_accelerator_tp_group(acc));
    double mean = r.loss_sum / r.m;
    if (!st && r.pg) st = accel_pg_broadcast(r.pg, &mean, 1, ACCEL_F64, r.stages - 1);
    if (!st) *loss = mean;
    if (report && !st) {
        *report = (accel_pipeline_report){.stage = r.stage, .stages = r.stages, .first_layer = r.lo,
                                          .end_layer = r.hi, .micro_batches = r.m,
                                          .wall_s = accel_now_seconds() - t0, .busy_s = r.busy_s,
                                          .peak_in_flight = r.rep.peak_in_flight};
        report->peak_held_bytes = r.first ? 0 : (size_t)report->peak_in_flight * r.numel * accel_dtype_size(r.dt);
    }
    for (int i = 0; r.held && i < r.m; i++) accel_free(r.held[i]);
    accel_free(r.held);
    accel_free(r.out_buf);
    accel_free(ops);
    accel_free(first_layer);
    return st;
}

double accel__pipeline_norm_partial(accel_accelerator *acc, accel_module *model, double local, double norm_type) {
    if (acc->par.size[ACCEL__MESH_PP] == 1) return local;
    accel_pg *pg = accel__mesh_group(&acc->mesh, ACCEL__MESH_PP);
    if (!pg) return NAN;
    bool inf = isinf(norm_type);
    const accel__family *f = accel__family_of(model);
    /* the last stage's copy of a tied embedding's gradient equals stage 0's
     * (sum_tied): counted once, its share taken as `local` counted it (under
     * tp its slices' over the tp group) */
    if (!inf && f && f->stages && accel_pg_rank(pg) == accel_pg_size(pg) - 1) {
        accel_tensor *w = f->stages->tied_embedding(model);
        double tied = w && w->grad ? accel__tp_param_norm_partial(acc, model, w, norm_type) : 0;
        if (isnan(tied)) return NAN;
        local = fmax(0.0, local - tied);
    }
    if (accel_pg_all_reduce(pg, &local, 1, ACCEL_F64, inf ? ACCEL_REDUCE_MAX : ACCEL_REDUCE_SUM) != ACCEL_OK)
        return NAN;
    return local;
}

/* Whether this stage keeps parameter entry e: its part's, and a tied input
 * embedding on the last stage too (its lm_head). */
static bool kept(const accel__family_stages *h, accel_module *model, const accel_state_entry *e,
                 const int *first_layer, int stage, int stages) {
    if (h->owner(e->name, first_layer, stages) == stage) return true;
    return stage == stages - 1 && e->t == h->tied_embedding(model);
}

/* The stage's split and hooks for fn: *first_layer accel_malloc'd. */
static const accel__family_stages *split_of(accel_accelerator *acc, accel_module *model, int stages,
                                            int **first_layer, const char *fn) {
    const accel__family_stages *h = hooks_of(model, fn);
    *first_layer = h ? accel_malloc(((size_t)stages + 1) * sizeof **first_layer) : NULL;
    if (*first_layer && !stage_split(acc, model, stages, *first_layer, fn)) return h;
    accel_free(*first_layer);
    *first_layer = NULL;
    return NULL;
}

accel_status accel__pipeline_release(accel_accelerator *acc, accel_module *model, const char *fn) {
    int stages = acc->par.size[ACCEL__MESH_PP];
    if (stages == 1) return ACCEL_OK;
    if (acc->strat->stage != 0)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: ZeRO stage %d is not built with pipeline parallelism "
                               "(pp_size %d); use DDP (zero_stage 0)", fn, acc->strat->stage, stages);
    accel_pg *pg = accel__mesh_group(&acc->mesh, ACCEL__MESH_PP);
    int *first_layer;
    const accel__family_stages *h = pg ? split_of(acc, model, stages, &first_layer, fn) : NULL;
    accel_state_dict *sd = h ? accel_module_state_dict(model) : NULL;
    if (!sd) {
        if (h) accel_free(first_layer);
        return accel_last_status();
    }
    for (int i = 0; i < sd->n; i++) {
        accel_state_entry *e = &sd->entries[i];
        if (!e->is_buffer && !e->is_tied_alias && !kept(h, model, e, first_layer, accel_pg_rank(pg), stages))
            accel_tensor_to_meta(e->t);
    }
    accel_state_dict_free(sd);
    accel_free(first_layer);
    return ACCEL_OK;
}

accel_status accel__pipeline_prepare_optimizer(accel_accelerator *acc, accel_optimizer *opt) {
    if (acc->par.size[ACCEL__MESH_PP] == 1) return ACCEL_OK;
    int n = accel_optimizer_num_segments(opt), kept_n = 0;
    accel_tensor **params = accel_malloc((size_t)(n ? n : 1) * sizeof *params);
    int *groups = accel_malloc((size_t)(n ? n : 1) * sizeof *groups);
    accel_status st = params && groups ? ACCEL_OK : accel_last_status();
    for (int i = 0; !st && i < n; i++) {
        int g;
        accel_tensor *p = accel_optimizer_segment_param(opt, i, &g);
        if (!p) st = accel_set_error(ACCEL_ERR_STATE, "accel_accelerator_prepare_optimizer: segment %d of the "
                                     "optimizer has no parameter tensor (already re-targeted)", i);
        else if (p->device.type != ACCEL_DEV_META) params[kept_n] = p, groups[kept_n++] = g;
    }
    /* only this stage's parameters: the others were released at the model's prepare */
    if (!st && kept_n < n) st = accel_optimizer_set_segments(opt, kept_n, params, NULL, NULL, groups);
    accel_free(params);
    accel_free(groups);
    return st;
}

accel_status accel__pipeline_gather_weights(accel_accelerator *acc, accel_module *model) {
    int stages = acc->par.size[ACCEL__MESH_PP];
    if (stages == 1) return ACCEL_OK;
    accel_pg *pg = accel__mesh_group(&acc->mesh, ACCEL__MESH_PP);
    if (!pg) return accel_last_status();
    int *first_layer;
    const accel__family_stages *hooks = split_of(acc, model, stages, &first_layer, "accel_accelerator_save_model");
    accel_state_dict *sd = hooks ? accel_module_state_dict(model) : NULL;
    accel_status st = sd ? ACCEL_OK : accel_last_status();
    for (int i = 0; !st && i < sd->n; i++) {
        accel_state_entry *e = &sd->entries[i];
        if (e->is_buffer || e->is_tied_alias) continue;
        /* another stage's, released at prepare: here until accel__pipeline_release after the save */
        if (e->t->device.type == ACCEL_DEV_META && (st = accel_tensor_to_device_(e->t, acc->device))) break;
        size_t bytes = (size_t)accel_numel(e->t) * accel_dtype_size(e->t->dtype);
        int owner = hooks->owner(e->name, first_layer, stages);
        void *h = accel_malloc(bytes ? bytes : 1);
        if (!h) st = accel_last_status();
        if (!st && accel_pg_rank(pg) == owner) st = accel_tensor_to_host(e->t, h);
        if (!st) st = accel_pg_broadcast(pg, h, bytes, ACCEL_U8, owner);
        if (!st && accel_pg_rank(pg) != owner) st = accel_tensor_from_host(e->t, h);
        accel_free(h);
    }
    accel_state_dict_free(sd);
    accel_free(first_layer);
    return st;
}

accel_status accel__pipeline_refuse_checkpoint(const accel_accelerator *acc, const char *fn) {
    int p = acc->par.size[ACCEL__MESH_PP];
    if (p > 1)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: checkpoints of a pipeline (pp_size = %d) are not built "
                               "yet: rank 0's optimizer state would stand for every stage's (save_model writes the "
                               "whole model)", fn, p);
    return ACCEL_OK;
}
