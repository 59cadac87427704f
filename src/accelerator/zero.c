/* ZeRO-1/2 (FSDP SHARD_GRAD_OP): each rank keeps optimizer state for, and
 * updates, only its contiguous shard [zlo, zhi) of the model's flat f32
 * parameter buffer (padded to a multiple of 16 x world, split evenly); the
 * updated shards are then all-gathered in place. Stage 2 reduce-scatters the
 * gradients into a shard-sized buffer instead of all-reducing them.
 *
 * The user's optimizer object is re-targeted: its per-tensor segments are
 * replaced by flat runs (maximal runs of one param group, clipped to the
 * shard), so its groups, lr and schedulers keep working and its state shrinks
 * to 1/N. Saved state is consolidated into the user's per-tensor vocabulary
 * (the same file DDP writes), so checkpoints load at any world size.
 *
 * Every stage runs on any device: the shard's parameters, gradients and
 * state live on the model's device and are updated by its backend's kernels
 * (under stage 3's offload_param in host memory, updated there: zero3.c);
 * the collectives stage through host memory where the device needs it
 * (staging.c; stage 3's own in zero3.c), and the consolidated state is host
 * memory. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accelerator_internal.h"
#include "strategy.h"
#include "zero_state.h"

static const char *KIND_NAMES[2][2] = {{"momentum_buffer", NULL}, {"exp_avg", "exp_avg_sq"}};

/* ---------------------------------------------------------------- model */

accel_status accel__zero_model_new(accel__model *pm) {
    accel__zero_model *zm = accel_calloc(1, sizeof *zm);
    if (!zm) return accel_last_status();
    zm->zdev = pm->fp->buffers[ACCEL_F32].device;
    pm->strat_state = zm;
    return ACCEL_OK;
}

void accel__zero_model_free(accel__model *pm) {
    accel__zero_model *zm = accel__zero_of(pm);
    if (!zm) return;
    accel_free(zm->units);
    accel_free(zm->tp_flags);
    accel__device_free(pm->fp->buffers[ACCEL_F32].device, zm->zgrad);
    accel_free(zm);
    pm->strat_state = NULL;
}

accel_status accel__zero_units(accel_accelerator *acc, accel__model *pm) {
    accel_status st = accel__zero_model_new(pm);
    if (st) return st;
    accel__zero_model *zm = accel__zero_of(pm);
    accel_flat_buffer *b = &pm->fp->buffers[ACCEL_F32];
    int64_t shard = b->n ? b->numel / acc->shard_world : 0;
    zm->units = accel_calloc(1, sizeof *zm->units);
    if (!zm->units) return accel_last_status();
    zm->n_units = 1;
    zm->units[0] = (accel__unit){.shard = shard, .count = b->n, .state = ACCEL__UNIT_GATHERED};
    zm->zlo = (int64_t)acc->shard_rank * shard;
    zm->zhi = zm->zlo + shard;
    zm->zn = shard;
    return ACCEL_OK;
}

static accel_status zero1_layout(accel_accelerator *acc, accel__model *pm) {
    accel_status st = accel__zero_units(acc, pm);
    return st ? st : accel__ddp_share_grads(acc, pm, false);
}

/* Stage 2 sharded over > 1 rank: the averaged gradient shard, zgrad. Over
 * one rank (one process, or HYBRID_SHARD_ZERO2 with one process a machine:
 * only replicas) the shard would be the whole buffer again: the gradients
 * are averaged in place, as stage 1 does, and the step reads them there. */
static accel_status zero2_layout(accel_accelerator *acc, accel__model *pm) {
    accel_status st = accel__zero_units(acc, pm);
    if (st) return st;
    accel__zero_model *zm = accel__zero_of(pm);
    if (pm->ddp && zm->zn && acc->shard_world > 1) {
        zm->zgrad = accel__device_alloc(zm->zdev, (size_t)zm->zn * sizeof(float), true, "accel_accelerator_prepare");
        if (!zm->zgrad) return accel_last_status();
    }
    return accel__ddp_share_grads(acc, pm, zm->zgrad != NULL);
}

static accel_status zero12_release(accel_accelerator *acc, accel__model *pm) {
    accel_status st = accel__ddp_release(acc, pm);
    accel__zero_model_free(pm);
    return st;
}

/* Start of this rank's piece of unit u in the flat buffer. */
static int64_t piece_lo(const accel_accelerator *acc, const accel__unit *u) {
    return u->lo + (int64_t)acc->shard_rank * u->shard;
}

/* Where flat-buffer element pos lives in this rank's shard, or -1 (another rank's). */
static int64_t shard_pos(const accel_accelerator *acc, const accel__model *pm, int64_t pos) {
    accel__zero_model *zm = accel__zero_of(pm);
    for (int k = 0; k < zm->n_units; k++) {
        int64_t lo = piece_lo(acc, &zm->units[k]);
        if (pos >= lo && pos < lo + zm->units[k].shard) return zm->units[k].zoff + (pos - lo);
    }
    return -1;
}

/* The shard's gradients, wherever this stage keeps them (memory of pm->zdev). */
static float *shard_grad(accel__model *pm) {
    accel__zero_model *zm = accel__zero_of(pm);
    return zm->zgrad ? zm->zgrad : (float *)pm->fp->buffers[ACCEL_F32].grads + zm->zlo;
}

/* The shard's parameters: stage 3's own buffer, else this rank's range of the flat buffer. */
static float *shard_params(accel__model *pm) {
    accel__zero_model *zm = accel__zero_of(pm);
    return zm->zparams ? zm->zparams : (float *)pm->fp->buffers[ACCEL_F32].params + zm->zlo;
}

/* n elements at position pos of the shard (from shard_params or shard_grad) as a header in *h. */
static accel_tensor *shard_view(accel_tensor *h, accel__model *pm, float *shard, int64_t pos, int64_t n) {
    accel__zero_model *zm = accel__zero_of(pm);
    accel__tensor_header(h, shard + pos, ACCEL_F32, 1, &n, zm->zdev);
    return h;
}

/* Every rank's shard of `local` into its place in `full` (collective). */
static accel_status gather_shards(accel_accelerator *acc, accel__model *pm, const float *local, float *full) {
    accel__zero_model *zm = accel__zero_of(pm);
    accel_status st = ACCEL_OK;
    for (int k = 0; k < zm->n_units && !st; k++) {
        const accel__unit *u = &zm->units[k];
        if (acc->shard_world > 1) {
            /* the collective reports its receive buffer written (dist.c) */
            st = accel_pg_all_gather(acc->shard_pg, local + u->zoff, full + u->lo, (size_t)u->shard, ACCEL_F32);
        } else {
            memcpy(full + u->lo, local + u->zoff, (size_t)u->shard * sizeof(float));
            /* the parameters' memory: what was prepared from it is stale (core/prepared.h) */
            accel__storage_written(full + u->lo, (size_t)u->shard * sizeof(float));
        }
    }
    return st;
}

accel_status accel__zero_replica_average(accel_accelerator *acc, float *piece, int64_t n) {
    if (!acc->replica_pg || !n) return ACCEL_OK;
    return accel_pg_all_reduce(acc->replica_pg, piece, (size_t)n, ACCEL_F32, ACCEL_REDUCE_AVG);
}

/* Stage 2: the f32 gradients reduce-scattered (AVG) in place, so this rank's
 * block [zlo, zhi) of `full` holds its averaged shard. On a staged device the
 * group works on the shared host buffer ddp.c made (accel__ddp_grad_stage),
 * and only the block comes back. Under hybrid sharding the block is then
 * averaged across the machines. */
static accel_status reduce_scatter_block(accel_accelerator *acc, accel__model *pm, accel_tensor *full,
                                         accel_tensor *mine) {
    accel__zero_model *zm = accel__zero_of(pm);
    void *stage = accel__ddp_grad_stage(pm, ACCEL_F32);
    ACCEL_ASSERT(stage || !accel__needs_staging(full->device));
    float *host = accel__stage_to_host(full, stage, true);
    if (!host) return accel_last_status();
    accel_status st =
        accel_pg_reduce_scatter(acc->shard_pg, host, host + zm->zlo, (size_t)accel_numel(mine), ACCEL_F32,
                                ACCEL_REDUCE_AVG);
    if (!st) st = accel__zero_replica_average(acc, host + zm->zlo, accel_numel(mine));
    return accel__stage_end(mine, host + zm->zlo, st, true, false);
}

/* Stage 2's reduction after backward (while gradients accumulate, none). */
static accel_status zero2_end_backward(accel_accelerator *acc, accel__model *pm) {
    accel__zero_model *zm = accel__zero_of(pm);
    if (!accel__model_syncs(acc, pm)) return ACCEL_OK;
    /* sequence parallelism: the tp ranks' parts of the replicated parameters'
     * gradients summed while the full buffer still holds them */
    accel_status st = zm->zgrad ? accel__tp_sp_reduce(acc, pm) : ACCEL_OK;
    for (int d = 0; d < ACCEL_DTYPE_COUNT && !st; d++) {
        accel_flat_buffer *b = &pm->fp->buffers[d];
        if (!b->n) continue;
        accel_tensor full, mine, shard;
        accel__flat_view(&full, b, b->grads, 0, b->numel);
        if (d != ACCEL_F32 || !zm->zgrad) {
            st = accel__staged_all_reduce(acc->dp_pg, &full, ACCEL_REDUCE_AVG);
            continue;
        }
        /* Added to the shard (several reductions per step, e.g.
         * sync_each_batch, accumulate there), then the full buffer restarts
         * from zero so the next reduction only carries new gradients. */
        accel__flat_view(&mine, b, b->grads, zm->zlo, zm->zhi - zm->zlo);
        st = reduce_scatter_block(acc, pm, &full, &mine);
        if (st) break;
        accel_k_accumulate k = {.out = shard_view(&shard, pm, zm->zgrad, 0, zm->zn), .in = &mine};
        st = ACCEL_KERNEL("accel_accelerator_backward", b->device, accumulate, &k);
        if (!st) st = accel_zero_(&full);
    }
    return st;
}

static accel_status zero12_after_step(accel_accelerator *acc, accel__model *pm) {
    accel__zero_model *zm = accel__zero_of(pm);
    accel_flat_buffer *b = &pm->fp->buffers[ACCEL_F32];
    if (!b->n || acc->shard_world == 1) return ACCEL_OK;
    accel_tensor mine, full;
    return accel__staged_all_gather(acc->shard_pg, accel__flat_view(&mine, b, b->params, zm->zlo, zm->zhi - zm->zlo),
                                    accel__flat_view(&full, b, b->params, 0, b->numel));
}

static accel_status zero12_zero_grad(accel_accelerator *acc, accel__model *pm) {
    accel__zero_model *zm = accel__zero_of(pm);
    (void)acc;
    accel_status st = ACCEL_OK;
    for (int d = 0; d < ACCEL_DTYPE_COUNT && !st; d++) {
        accel_flat_buffer *b = &pm->fp->buffers[d];
        accel_tensor h;
        /* read next by the next backward, a forward later: out of the caches */
        if (b->n) st = accel__zero_cold_(accel__flat_view(&h, b, b->grads, 0, b->numel));
    }
    accel_tensor h;
    if (!st && zm->zgrad) st = accel__zero_cold_(shard_view(&h, pm, zm->zgrad, 0, zm->zn));
    return st;
}

static accel_status zero12_shard_range(accel_accelerator *acc, accel__model *pm, int64_t *lo, int64_t *hi) {
    accel__zero_model *zm = accel__zero_of(pm);
    (void)acc;
    *lo = zm->zlo;
    *hi = zm->zhi;
    return ACCEL_OK;
}

/* ---------------------------------------------------------------- gradients */

accel_tensor *accel__zero_grad_shard(accel__model *pm, accel_tensor *h) {
    accel__zero_model *zm = accel__zero_of(pm);
    if (!zm->zgrad) return NULL;
    int64_t n = zm->zn;
    accel__tensor_header(h, zm->zgrad, ACCEL_F32, 1, &n, zm->zdev);
    return h;
}

/* Under tp: the partial norms of this rank's gradient shard (zgrad: each
 * unit's piece [lo + shard_rank shard, + shard) of the f32 flat buffer at
 * zoff; stages 1-2 have one unit) over the whole parameters' elements
 * (part[0]) and the tp slices' (part[1]); padding holds no gradient. */
/* The f32 buffer's tensors' tp flags (zero_state.h: tp_flags), made on the
 * first call: clipping and sequence parallelism ask them every step, and a
 * steady step allocates nothing. */
static const bool *tp_flags(accel__model *pm) {
    accel__zero_model *zm = accel__zero_of(pm);
    const accel_flat_buffer *b = &pm->fp->buffers[ACCEL_F32];
    if (zm->tp_flags) return zm->tp_flags;
    bool *f = accel_malloc(2 * (size_t)b->n + 1);
    if (f && accel__tp_sliced(pm->m, b->tensors, b->n, f, f + b->n)) {
        accel_free(f);
        return NULL;
    }
    return zm->tp_flags = f;
}

/* The partial norm of tensor j's elements in this rank's gradient shard
 * (zgrad; 0 where it holds none of them). */
static double piece_partial(accel_accelerator *acc, accel__model *pm, int j, double norm_type) {
    accel__zero_model *zm = accel__zero_of(pm);
    const accel_flat_buffer *b = &pm->fp->buffers[ACCEL_F32];
    double part = 0;
    for (int k = 0; k < zm->n_units; k++) {
        const accel__unit *u = &zm->units[k];
        if (j < u->first || j >= u->first + u->count) continue;
        int64_t plo = piece_lo(acc, u), phi = plo + u->shard;
        int64_t lo = b->offsets[j] > plo ? b->offsets[j] : plo;
        int64_t hi = b->offsets[j] + accel_numel(b->tensors[j]);
        if (hi > phi) hi = phi;
        if (lo >= hi) continue;
        accel_tensor h;
        double p = accel_grad_norm_partial(shard_view(&h, pm, zm->zgrad, u->zoff + (lo - plo), hi - lo), norm_type);
        part = accel_grad_norm_combine(part, p, norm_type);
    }
    return part;
}

static accel_status tp_shard_partial(accel_accelerator *acc, accel__model *pm, double norm_type, double *part) {
    const accel_flat_buffer *b = &pm->fp->buffers[ACCEL_F32];
    const bool *sliced = tp_flags(pm);
    if (!sliced) return accel_last_status();
    for (int j = 0; j < b->n; j++) {
        double p = piece_partial(acc, pm, j, norm_type);
        part[sliced[j]] = accel_grad_norm_combine(part[sliced[j]], p, norm_type);
    }
    return ACCEL_OK;
}

/* Under pipeline parallelism, the last stage's pieces of a tied lm_head
 * (accel__pipeline_tied_copy: stage 0 counts that gradient) taken out of
 * part (sums only: a max counts it harmlessly twice). */
static accel_status drop_tied_copy(accel_accelerator *acc, accel__model *pm, double norm_type, double *part) {
    const accel_tensor *w = isinf(norm_type) ? NULL : accel__pipeline_tied_copy(acc, pm->m);
    const accel_flat_buffer *b = &pm->fp->buffers[ACCEL_F32];
    const bool *sliced = w && acc->mesh.size[ACCEL__MESH_TP] > 1 ? tp_flags(pm) : NULL;
    if (w && acc->mesh.size[ACCEL__MESH_TP] > 1 && !sliced) return accel_last_status();
    for (int j = 0; w && j < b->n; j++)
        if (b->tensors[j] == w) {
            int at = sliced ? sliced[j] : 1;
            part[at] = accel__norm_without(part[at], piece_partial(acc, pm, j, norm_type));
        }
    return ACCEL_OK;
}

/* ZeRO-3 under sequence parallelism, once per synced step: the pieces of
 * this rank's gradient shard that belong to parameters whole on every tp
 * rank (not a slice, not replicated rows: each rank's gradient a part, from
 * its positions) summed over the tp group (collective over tp). */
static accel_status tp_sum_shard(accel_accelerator *acc, accel__model *pm) {
    accel__zero_model *zm = accel__zero_of(pm);
    const accel_flat_buffer *b = &pm->fp->buffers[ACCEL_F32];
    accel_pg *tp = accel_accelerator_tp_group(acc);
    const bool *sliced = tp ? tp_flags(pm) : NULL;
    if (!sliced) return accel_last_status();
    accel_status st = ACCEL_OK;
    /* the tp ranks of one shard rank hold the same pieces of the same layout */
    for (int k = 0; k < zm->n_units && !st; k++) {
        const accel__unit *u = &zm->units[k];
        int64_t plo = piece_lo(acc, u), phi = plo + u->shard;
        for (int j = u->first; j < u->first + u->count && !st; j++) {
            int64_t lo = b->offsets[j] > plo ? b->offsets[j] : plo;
            int64_t hi = b->offsets[j] + accel_numel(b->tensors[j]);
            if (hi > phi) hi = phi;
            if (lo >= hi || !sliced[b->n + j]) continue;
            accel_tensor h;
            st = accel__staged_all_reduce(tp, shard_view(&h, pm, zm->zgrad, u->zoff + (lo - plo), hi - lo),
                                          ACCEL_REDUCE_SUM);
        }
    }
    return st;
}

/* sp_reduce of stages 1-2: ZeRO-1's gradients are whole; ZeRO-2 with a
 * shard summed them before its reduce-scatter (zero2_end_backward). */
static accel_status zero12_sp_reduce(accel_accelerator *acc, accel__model *pm) {
    return accel__zero_of(pm)->zgrad ? ACCEL_OK : accel__tp_sp_reduce(acc, pm);
}

/* sp_reduce of stage 3: its units reduce-scattered during the backward, so
 * the pieces of the shard are summed now; one process holds whole gradients. */
accel_status accel__zero3_sp_reduce(accel_accelerator *acc, accel__model *pm) {
    return accel__zero_of(pm)->zgrad ? tp_sum_shard(acc, pm) : accel__tp_sp_reduce(acc, pm);
}

/* A gradient shard (stage 2 on > 1 process, stage 3): the global norm from
 * every rank's shard (sum of |g|^p, or max), then each clips its own; under
 * tp the tp slices' part also summed over the tp group, the whole
 * parameters' part counted once; under pp summed over the stages, a tied
 * lm_head's gradient once. Without a shard, every rank holds the full
 * averaged gradients, as under DDP. */
accel_status accel__zero_clip(accel_accelerator *acc, accel__model *pm, double max_norm, double norm_type,
                              double *norm) {
    *norm = NAN;
    accel_tensor h;
    accel_tensor *g = accel__zero_grad_shard(pm, &h);
    if (!g) return accel__ddp_clip(acc, pm, max_norm, norm_type, norm);
    bool tp = acc->mesh.size[ACCEL__MESH_TP] > 1;
    for (int d = 0; d < ACCEL_DTYPE_COUNT; d++)
        if (d != ACCEL_F32 && pm->fp->buffers[d].n) {
            return accel_set_error(ACCEL_ERR_DTYPE,
                                   "accel_accelerator_clip_grad_norm: %s parameters (needs f32 master weights)",
                                   accel_dtype_name(pm->fp->buffers[d].dtype));
        }
    /* part[0] whole parameters', part[1] tp slices' (all of it without tp) */
    double part[2] = {0, tp ? 0 : accel_grad_norm_partial(g, norm_type)};
    if ((tp && tp_shard_partial(acc, pm, norm_type, part)) || drop_tied_copy(acc, pm, norm_type, part))
        return accel_last_status();
    /* over the shard group: under hybrid sharding the other machines hold the same shards */
    if (accel__norm_all_reduce(acc->shard_pg, part, 2, norm_type)) return accel_last_status();
    /* the slices of the tp ranks make the whole parameters; the whole ones are the same on each */
    if (tp && accel__norm_all_reduce(accel_accelerator_tp_group(acc), &part[1], 1, norm_type))
        return accel_last_status();
    double stages = accel_grad_norm_combine(part[0], part[1], norm_type);
    if (accel__pipeline_norm_reduce(acc, &stages, norm_type)) return accel_last_status();
    *norm = accel_grad_norm_finish(stages, norm_type);
    double coef = accel_clip_coef(*norm, max_norm);
    return coef < 1.0 ? accel__grad_scale(g, (float)coef) : ACCEL_OK;
}

/* ---------------------------------------------------------------- optimizer */

/* A prepared optimizer re-targeted to its model's shard (acc->strat_opt[i]). */
typedef struct accel__zopt {
    accel_module *m;
    int n_user;                 /* the user's tensor segments, restored on release */
    accel_tensor **user_params;
    int *user_groups;
    int64_t *user_off;          /* element offset of each in the flat f32 buffer */
    int n_runs;                 /* shard segments: runs of one group clipped to [zlo, zhi) */
    int64_t *run_lo, *run_hi;
    int *run_group;
} accel__zopt;

static void zopt_free(accel__zopt *z) {
    if (!z) return;
    accel_free(z->user_params);
    accel_free(z->user_groups);
    accel_free(z->user_off);
    accel_free(z->run_lo);
    accel_free(z->run_hi);
    accel_free(z->run_group);
    accel_free(z);
}

/* How many state buffers group g keeps (as optim.h allocates them). */
static int n_kinds(accel_optimizer *opt, int g) {
    if (accel_optimizer_kind(opt) != ACCEL_OPTIM_SGD) return 2;
    return accel_optimizer_hparams(opt, g)->momentum != 0.0 ? 1 : 0;
}

static int max_kinds(accel_optimizer *opt) {
    int k = 0;
    for (int g = 0; g < accel_optimizer_num_groups(opt); g++) k = n_kinds(opt, g) > k ? n_kinds(opt, g) : k;
    return k;
}

static const char *kind_name(accel_optimizer *opt, int k) {
    return KIND_NAMES[accel_optimizer_kind(opt) != ACCEL_OPTIM_SGD][k];
}

/* The user's segments -> the model whose f32 flat buffer holds them, offsets,
 * and the runs of this rank's shard. */
static accel_status plan(accel_accelerator *acc, accel_optimizer *opt, accel__zopt *z) {
    const char *fn = "accel_accelerator_prepare_optimizer";
    int n = accel_optimizer_num_segments(opt);
    z->n_user = n;
    z->user_params = accel_calloc((size_t)(n ? n : 1), sizeof *z->user_params);
    z->user_groups = accel_calloc((size_t)(n ? n : 1), sizeof *z->user_groups);
    z->user_off = accel_calloc((size_t)(n ? n : 1), sizeof *z->user_off);
    if (!z->user_params || !z->user_groups || !z->user_off) return accel_last_status();
    accel__model *pm = NULL;
    for (int i = 0; i < n; i++) {
        accel_tensor *p = accel_optimizer_segment_param(opt, i, &z->user_groups[i]);
        if (!p)
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: ZeRO shards optimizers over a model's parameters; "
                                   "segment %d is a flat range (accel_optimizer_add_flat)", fn, i);
        accel__model *found = NULL;
        for (int m = 0; m < acc->n_models && !found; m++) {
            const accel_flat_buffer *b = &acc->models[m].fp->buffers[ACCEL_F32];
            for (int t = 0; t < b->n && !found; t++)
                if (b->tensors[t] == p) {
                    found = &acc->models[m];
                    z->user_off[i] = b->offsets[t];
                }
        }
        if (!found || (pm && found != pm))
            return accel_set_error(ACCEL_ERR_STATE,
                                   "%s: under ZeRO stage %d the optimizer's parameter %d (\"%s\") must belong to "
                                   "one model prepared before the optimizer (prepare(model, opt, ...) does that)",
                                   fn, acc->strat->stage, i, p->name ? p->name : "?");
        pm = found;
        z->user_params[i] = p;
    }
    if (!pm) return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: the optimizer has no parameters", fn);
    z->m = pm->m;
    accel__zero_model *zm = accel__zero_of(pm);
    /* Walk the flat buffer in order: consecutive tensors of one group form a
     * run (the alignment padding between them has zero grads and stays zero). */
    accel_flat_buffer *b = &pm->fp->buffers[ACCEL_F32];
    z->run_lo = accel_calloc((size_t)b->n, sizeof *z->run_lo);
    z->run_hi = accel_calloc((size_t)b->n, sizeof *z->run_hi);
    z->run_group = accel_calloc((size_t)b->n, sizeof *z->run_group);
    if (!z->run_lo || !z->run_hi || !z->run_group) return accel_last_status();
    int64_t prev_end = -1;
    int prev_group = -1;
    for (int t = 0; t < b->n; t++) {
        int g = -1;
        for (int i = 0; i < n && g < 0; i++)
            if (z->user_params[i] == b->tensors[t]) g = z->user_groups[i];
        ACCEL_ASSERT(b->offsets[t] >= prev_end);
        int64_t lo = b->offsets[t], hi = lo + accel_numel(b->tensors[t]);
        prev_end = hi;
        if (g >= 0 && g == prev_group) {
            z->run_hi[z->n_runs - 1] = hi;
        } else if (g >= 0) {
            z->run_lo[z->n_runs] = lo;
            z->run_hi[z->n_runs] = hi;
            z->run_group[z->n_runs++] = g;
        }
        prev_group = g;
    }
    /* Clip to each unit's piece of this rank; drop empty runs. A run may
     * span several units (stage 3), so the clipped runs get arrays of their own. */
    int cap = z->n_runs + zm->n_units;
    int64_t *lo_ = accel_calloc((size_t)cap, sizeof *lo_), *hi_ = accel_calloc((size_t)cap, sizeof *hi_);
    int *group_ = accel_calloc((size_t)cap, sizeof *group_);
    if (!lo_ || !hi_ || !group_) {
        accel_free(lo_);
        accel_free(hi_);
        accel_free(group_);
        return accel_last_status();
    }
    int k = 0;
    for (int r = 0; r < z->n_runs; r++)
        for (int u = 0; u < zm->n_units; u++) {
            int64_t plo = piece_lo(acc, &zm->units[u]), phi = plo + zm->units[u].shard;
            int64_t lo = z->run_lo[r] > plo ? z->run_lo[r] : plo;
            int64_t hi = z->run_hi[r] < phi ? z->run_hi[r] : phi;
            if (lo >= hi) continue;
            lo_[k] = lo;
            hi_[k] = hi;
            group_[k++] = z->run_group[r];
        }
    accel_free(z->run_lo);
    accel_free(z->run_hi);
    accel_free(z->run_group);
    z->run_lo = lo_;
    z->run_hi = hi_;
    z->run_group = group_;
    z->n_runs = k;
    return ACCEL_OK;
}

/* Re-targets optimizer i to the runs of its model's shard: one flat segment
 * per run, viewing the shard's parameters and gradients where they live (zdev). */
static accel_status retarget(accel_accelerator *acc, accel_optimizer *opt, const accel__zopt *z) {
    int nr = z->n_runs;
    accel_tensor *views = accel_calloc((size_t)(2 * nr + 1), sizeof *views);
    const accel_tensor **data = accel_calloc((size_t)(nr + 1), sizeof *data);
    const accel_tensor **grads = accel_calloc((size_t)(nr + 1), sizeof *grads);
    accel_status st = views && data && grads ? ACCEL_OK : accel_last_status();
    if (!st) {
        accel__model *pm = accel__find_model(acc, z->m);
        for (int r = 0; r < nr; r++) {
            int64_t pos = shard_pos(acc, pm, z->run_lo[r]), n = z->run_hi[r] - z->run_lo[r];
            data[r] = shard_view(&views[2 * r], pm, shard_params(pm), pos, n);
            grads[r] = shard_view(&views[2 * r + 1], pm, shard_grad(pm), pos, n);
        }
        st = accel_optimizer_set_segments(opt, nr, NULL, data, grads, z->run_group);
    }
    accel_free(views);
    accel_free(data);
    accel_free(grads);
    return st;
}

/* The optimizer's state with every tensor copied to host memory of its own:
 * the listing's views die when retarget replaces the state buffers. */
static int state_snapshot(accel_optimizer *opt, accel_named_state **out) {
    int n = accel_optimizer_state(opt, out);
    for (int e = 0; e < n; e++) {
        accel_named_state *s = &(*out)[e];
        if (!s->t) continue;
        accel_tensor *copy = accel_tensor_clone_persistent(s->t, ACCEL_CPU_DEVICE);
        if (!copy) {
            accel_named_state_free(*out, n);
            *out = NULL;
            return -1;
        }
        accel_tensor_free(s->t);
        s->t = copy;
    }
    return n;
}

/* ZeRO-Offload (docs/accelerator.md "Offload"): the shard's optimizer state
 * goes to a file under nvme_path, or to host memory when the model is on a
 * device the host cannot address (offload_optimizer cpu, or
 * fsdp_offload_params below stage 3, which steps on the host as torch's
 * CPUOffload does); elsewhere it stays with the shard, in host memory. */
static accel_status offload_optimizer(accel_accelerator *acc, accel_optimizer *opt, const accel__zopt *z) {
    const accel__offload_cfg *c = &acc->offload;
    bool staged = accel__needs_staging(accel__zero_of(accel__find_model(acc, z->m))->zdev); /* the shard is on a device */
    bool to_host = c->optimizer == ACCEL__OFFLOAD_CPU || (c->fsdp_params && acc->strat->stage < 3);
    accel__state_home home = c->optimizer == ACCEL__OFFLOAD_NVME ? ACCEL__HOME_FILE
                             : staged && to_host                 ? ACCEL__HOME_HOST
                                                                 : ACCEL__HOME_DEVICE;
    if (home == ACCEL__HOME_DEVICE) return ACCEL_OK;
    char tag[32];
    snprintf(tag, sizeof tag, "rank%d", acc->rank);
    /* buffer_count blocks hold the paged state; a device's parameters and gradients are staged in two more */
    int blocks = (home == ACCEL__HOME_FILE ? c->buffer_count : 0) + (staged ? 2 : 0);
    accel__offload_opts o = {home, c->optimizer_path, tag, c->block_bytes, blocks ? blocks : 1};
    return accel__optimizer_set_offload(opt, &o);
}

/* The optimizer's own segments and state again, after a failed prepare
 * (st: its failure, whose message stays, saying when they could not come
 * back: out of memory, the optimizer may be left without its state). */
static accel_status restore_user(accel_optimizer *opt, const accel__zopt *z, int n_prior,
                                 const accel_named_state *prior, accel_status st) {
    char why[1024];
    snprintf(why, sizeof why, "%s", accel_last_error());
    accel_status rst = accel_optimizer_set_segments(opt, z->n_user, z->user_params, NULL, NULL, z->user_groups);
    if (!rst && n_prior > 0) rst = accel_optimizer_load_state(opt, n_prior, prior);
    if (rst)
        return accel_set_error(st, "%s; and the optimizer's own parameters and state could not be restored (%s)", why,
                               accel_last_error());
    return accel_set_error(st, "%s", why);
}

accel__model *accel__zero_optimizer_model(accel_accelerator *acc, int i) {
    const accel__zopt *z = acc->strat_opt[i];
    return z ? accel__find_model(acc, z->m) : NULL;
}

accel_tensor *accel__zero_user_param(accel_accelerator *acc, int i, int u) {
    const accel__zopt *z = acc->strat_opt[i];
    return z && u >= 0 && u < z->n_user ? z->user_params[u] : NULL;
}

accel_status accel__zero_prepare_optimizer(accel_accelerator *acc, int i) {
    accel_optimizer *opt = acc->opts[i];
    accel__zopt *z = accel_calloc(1, sizeof *z);
    accel_status st = z ? plan(acc, opt, z) : accel_last_status();
    accel_named_state *prior = NULL;
    int n_prior = st ? -1 : state_snapshot(opt, &prior);
    if (!st && n_prior < 0) st = accel_last_status();
    if (!st) st = retarget(acc, opt, z);
    bool retargeted = !st;
    if (!st && (st = offload_optimizer(acc, opt, z))) { /* e.g. no room under nvme_path: nothing changed */
        accel_set_error(st, "accel_accelerator_prepare: %s", accel_last_error());
        restore_user(opt, z, n_prior, prior, st);
        retargeted = false;
    }
    if (!st) {
        acc->strat_opt[i] = z;
        /* Whatever state the optimizer had (it may have stepped before prepare) moves to the shard. */
        st = accel__zero_load_state(acc, i, n_prior, prior);
        if (st) acc->strat_opt[i] = NULL;
    }
    /* The shard's segments and state are this rank's allocations: a rank
     * that could not make them fails every rank's prepare, and every rank
     * whose optimizer was moved onto the shard (the failing one too, when it
     * failed after that) gives it its own segments and state back here,
     * from the snapshot (a release would consolidate: a collective the
     * failed rank does not join). Else the ranks' optimizers would differ:
     * the next prepare of the model would prepare the optimizer on some
     * ranks only (a hang), and the failing rank's would name the freed
     * flat buffer's memory. */
    accel_status all = accel__prepare_agree(acc, st, "shard the optimizer's state");
    if (all && retargeted) {
        acc->strat_opt[i] = NULL;
        restore_user(opt, z, n_prior, prior, all);
    }
    st = all;
    if (n_prior >= 0) accel_named_state_free(prior, n_prior);
    if (st) zopt_free(z);
    return st;
}

/* ---------------------------------------------------------------- state */

static accel_named_state *add(accel_named_state *out, int *n, const char *name, accel_tensor *t, double v) {
    accel_named_state *e = &out[(*n)++];
    e->name = accel_strdup(name);
    e->t = t;
    e->value = v;
    return e->name ? e : NULL;
}

static accel_tensor *view(float *p, int64_t n) { return accel_tensor_wrap(p, ACCEL_F32, 1, &n, ACCEL_CPU_DEVICE); }

/* "state.<i>.<rest>": i, or -1. */
static long state_index(const char *name, const char **rest) {
    if (strncmp(name, "state.", 6)) return -1;
    char *end;
    long i = strtol(name + 6, &end, 10);
    if (end == name + 6 || *end != '.' || i < 0) return -1;
    *rest = end + 1;
    return i;
}

int accel__zero_kinds(accel_accelerator *acc, int i) { return max_kinds(acc->opts[i]); }

const char *accel__zero_kind_name(accel_accelerator *acc, int i, int k) { return kind_name(acc->opts[i], k); }

int accel__zero_segments(accel_accelerator *acc, int i, const int **groups) {
    const accel__zopt *z = acc->strat_opt[i];
    *groups = z->user_groups;
    return z->n_user;
}

accel_status accel__zero_local_state(accel_accelerator *acc, int i, float *local[2], int64_t *step) {
    accel_optimizer *opt = acc->opts[i];
    accel__zopt *z = acc->strat_opt[i];
    accel__model *pm = accel__find_model(acc, z->m);
    accel__zero_model *zm = accel__zero_of(pm);
    int64_t shard = zm->zn;
    accel_named_state *st = NULL;
    int n = accel_optimizer_state(opt, &st), nk = max_kinds(opt);
    accel_status s = n < 0 ? accel_last_status() : ACCEL_OK;
    local[0] = local[1] = NULL;
    *step = 0;
    for (int k = 0; k < n; k++) {
        const char *rest;
        if (state_index(st[k].name, &rest) >= 0 && !strcmp(rest, "step") && st[k].value > *step)
            *step = (int64_t)st[k].value;
    }
    for (int k = 0; k < nk && !s; k++) {
        if (!(local[k] = accel_calloc((size_t)(shard ? shard : 1), sizeof(float)))) s = accel_last_status();
        for (int e = 0; e < n && !s; e++) {
            const char *rest;
            long r = state_index(st[e].name, &rest);
            if (r >= 0 && r < z->n_runs && st[e].t && !strcmp(rest, kind_name(opt, k)))
                s = accel__tensor_read_bytes(st[e].t, 0, local[k] + shard_pos(acc, pm, z->run_lo[r]),
                                             (size_t)(z->run_hi[r] - z->run_lo[r]) * sizeof(float));
        }
    }
    if (n >= 0) accel_named_state_free(st, n);
    if (s) {
        accel_free(local[0]);
        accel_free(local[1]);
        local[0] = local[1] = NULL;
    }
    return s;
}

int accel__zero_state(accel_accelerator *acc, int i, accel_named_state **out, float *bufs[2]) {
    accel_optimizer *opt = acc->opts[i];
    accel__zopt *z = acc->strat_opt[i];
    accel__model *pm = accel__find_model(acc, z->m);
    accel_flat_buffer *b = &pm->fp->buffers[ACCEL_F32];
    bufs[0] = bufs[1] = NULL;
    *out = NULL;
    accel_named_state *st = NULL, *res = NULL;
    float *local[2] = {NULL, NULL};
    int n = accel_optimizer_state(opt, &st), nk = max_kinds(opt), m = 0;
    accel_status s = n < 0 ? accel_last_status() : ACCEL_OK;
    /* Every run steps together; a rank whose shard has no run learns the count from the others. */
    int64_t step = 0;
    if (!s) s = accel__zero_local_state(acc, i, local, &step);
    for (int k = 0; k < nk && !s; k++)
        if (!(bufs[k] = accel_calloc((size_t)(b->numel ? b->numel : 1), sizeof(float)))) s = accel_last_status();
    if (acc->world > 1) {
        /* collective: every rank reaches it, and learns whether every rank
         * made its part (the local copies, the full buffers), so the
         * gathers run on every rank or on none: a rank that went past them
         * alone met the others' gathers with its next collective, and the
         * group broke (under ZeRO-3 a clear then gathered every unit as zeros) */
        int64_t v[2] = {step, (int64_t)s};
        accel_status s2 = accel_pg_all_reduce(acc->pg, v, 2, ACCEL_I64, ACCEL_REDUCE_MAX);
        if (!s) s = s2;
        step = v[0];
        if (!s && v[1])
            s = accel_set_error((accel_status)v[1], "ZeRO: another rank could not make its part of optimizer %d's "
                                "consolidated state (its error is reported there)", i);
    }
    for (int k = 0; k < nk && !s; k++) s = gather_shards(acc, pm, local[k], bufs[k]);
    if (s) goto fail;
    res = accel_calloc((size_t)(n + z->n_user * 3 + 1), sizeof *res);
    if (!res) {
        s = accel_last_status();
        goto fail;
    }
    char name[96];
    bool ok = true;
    /* "step" and "param_groups.*" as they are, but the groups' parameter
     * counts: the shard's optimizer holds runs, the state the user's
     * parameters (what a state saved under another strategy or mesh has) */
    for (int e = 0; e < n && ok; e++)
        if ((!strncmp(st[e].name, "step", 5) || !strncmp(st[e].name, "param_groups.", 13)) &&
            !accel__group_size_entry(st[e].name, NULL))
            ok = add(res, &m, st[e].name, NULL, st[e].value) != NULL;
    int ng = accel_optimizer_num_groups(opt), *sizes = ok ? accel__group_sizes(z->user_groups, z->n_user, ng) : NULL;
    ok = ok && sizes;
    for (int g = 0; g < ng && ok; g++) {
        snprintf(name, sizeof name, "param_groups.%d." ACCEL__GROUP_SIZE, g);
        ok = add(res, &m, name, NULL, sizes[g]) != NULL;
    }
    accel_free(sizes);
    for (int u = 0; u < z->n_user && step > 0 && ok; u++) {
        snprintf(name, sizeof name, "state.%d.step", u);
        ok = add(res, &m, name, NULL, (double)step) != NULL;
        for (int k = 0; k < n_kinds(opt, z->user_groups[u]) && ok; k++) {
            snprintf(name, sizeof name, "state.%d.%s", u, kind_name(opt, k));
            accel_named_state *e = add(res, &m, name, view(bufs[k] + z->user_off[u], accel_numel(z->user_params[u])), 0);
            ok = e && e->t;
        }
    }
    if (!ok) {
        s = accel_last_status();
        goto fail;
    }
    accel_named_state_free(st, n);
    accel_free(local[0]);
    accel_free(local[1]);
    *out = res;
    return m;
fail:
    if (n >= 0) accel_named_state_free(st, n);
    if (res) accel_named_state_free(res, m);
    accel_free(local[0]);
    accel_free(local[1]);
    accel_free(bufs[0]);
    accel_free(bufs[1]);
    bufs[0] = bufs[1] = NULL;
    {
        char why[512];
        snprintf(why, sizeof why, "%s", accel_last_error());
        accel_set_error(s ? s : ACCEL_ERR_DIST, "accel_accelerator: consolidating the ZeRO optimizer state failed: %s",
                        why);
    }
    return -1;
}

/* A scalar entry, or a one-element tensor as a file gives it back; NAN otherwise. */
static double scalar_of(const accel_named_state *e) {
    const accel_tensor *t = e->t;
    if (!t) return e->value;
    if (accel_numel(t) != 1) return NAN;
    switch (t->dtype) {
    case ACCEL_F64:
    case ACCEL_F32:
    case ACCEL_I64: return accel_item(t);
    default: return NAN;
    }
}

/* accel__zero_load_local, or (check) accel__optimizer_check_state of the same entries. */
static accel_status load_local(accel_accelerator *acc, int i, int n, const accel_named_state *scalars,
                               float *const local[2], double step, bool check) {
    accel_optimizer *opt = acc->opts[i];
    accel__zopt *z = acc->strat_opt[i];
    accel__model *pm = accel__find_model(acc, z->m);
    accel_named_state *res = accel_calloc((size_t)(n + z->n_runs * 3 + 1), sizeof *res);
    accel_status s = res ? ACCEL_OK : accel_last_status();
    int m = 0;
    /* the groups' parameter counts are the user's (accel__zero_state), checked
     * by zero_load or ZeRO-3's index: the shard's optimizer holds runs */
    for (int e = 0; e < n && !s; e++)
        if (!accel__group_size_entry(scalars[e].name, NULL) && !add(res, &m, scalars[e].name, NULL, scalars[e].value))
            s = accel_last_status();
    char name[96];
    for (int r = 0; r < z->n_runs && step > 0 && !s; r++) {
        snprintf(name, sizeof name, "state.%d.step", r);
        if (!add(res, &m, name, NULL, step)) s = accel_last_status();
        for (int k = 0; k < n_kinds(opt, z->run_group[r]) && !s; k++) {
            snprintf(name, sizeof name, "state.%d.%s", r, kind_name(opt, k));
            accel_named_state *e = add(res, &m, name, view(local[k] + shard_pos(acc, pm, z->run_lo[r]),
                                                           z->run_hi[r] - z->run_lo[r]), 0);
            if (!e || !e->t) s = accel_last_status();
        }
    }
    if (!s) s = check ? accel__optimizer_check_state(opt, m, res) : accel_optimizer_load_state(opt, m, res);
    if (res) accel_named_state_free(res, m);
    return s;
}

accel_status accel__zero_load_local(accel_accelerator *acc, int i, int n, const accel_named_state *scalars,
                                    float *const local[2], double step) {
    return load_local(acc, i, n, scalars, local, step, false);
}

accel_status accel__zero_check_local(accel_accelerator *acc, int i, int n, const accel_named_state *scalars,
                                     float *const local[2], double step) {
    return load_local(acc, i, n, scalars, local, step, true);
}

/* The "param_groups.<g>.num_params" entries of st against the user's
 * grouping of optimizer i's parameters (accel__check_group_sizes). */
static accel_status check_user_groups(accel_accelerator *acc, int i, int n, const accel_named_state *st,
                                      const char *fn) {
    const accel__zopt *z = acc->strat_opt[i];
    return accel__check_group_sizes(fn, n, st, accel_optimizer_num_groups(acc->opts[i]), z->user_groups, z->n_user);
}

/* accel__zero_load_state, or (check) its check: every entry against the
 * optimizer, then the shard's state as load_local would give it checked
 * by the optimizer (accel__optimizer_check_state), nothing read into it and
 * nothing loaded. */
static accel_status zero_load(accel_accelerator *acc, int i, int n, const accel_named_state *st, bool check) {
    const char *fn = "accel_accelerator_load_state";
    accel_optimizer *opt = acc->opts[i];
    accel__zopt *z = acc->strat_opt[i];
    accel__model *pm = accel__find_model(acc, z->m);
    accel__zero_model *zm = accel__zero_of(pm);
    int64_t shard = zm->zn;
    int nk = max_kinds(opt);
    float *local[2] = {NULL, NULL};
    accel_named_state *res = accel_calloc((size_t)(n + 1), sizeof *res); /* its scalar entries */
    accel_status s = res ? ACCEL_OK : accel_last_status();
    /* the check reads the shard's sizes only: its buffers are never touched (no pages) */
    for (int k = 0; k < nk && !s; k++)
        if (!(local[k] = check ? accel_malloc((size_t)(shard ? shard : 1) * sizeof(float))
                               : accel_calloc((size_t)(shard ? shard : 1), sizeof(float))))
            s = accel_last_status();
    int m = 0;
    double step = 0;
    for (int e = 0; e < n && !s; e++) {
        const char *rest;
        long u = state_index(st[e].name, &rest);
        if (u < 0) { /* "step", "param_groups.*", or a bad name the optimizer will reject */
            double v = scalar_of(&st[e]);
            if (isnan(v)) s = accel_set_error(ACCEL_ERR_FORMAT, "%s: entry \"%s\" must be a scalar", fn, st[e].name);
            else if (!add(res, &m, st[e].name, NULL, v)) s = accel_last_status();
            continue;
        }
        if (u >= z->n_user) {
            s = accel_set_error(ACCEL_ERR_FORMAT, "%s: entry \"%s\": no such parameter in this optimizer", fn,
                                st[e].name);
            break;
        }
        if (!strcmp(rest, "step")) {
            double v = scalar_of(&st[e]);
            if (!(v >= 0)) s = accel_set_error(ACCEL_ERR_FORMAT, "%s: entry \"%s\": bad step", fn, st[e].name);
            else step = v > step ? v : step;
            continue;
        }
        int k = 0;
        while (k < nk && strcmp(rest, kind_name(opt, k))) k++;
        const accel_tensor *t = st[e].t;
        int64_t numel = accel_numel(z->user_params[u]);
        if (k == nk || !t || t->dtype != ACCEL_F32 || !accel_is_contiguous(t) || accel_numel(t) != numel) {
            s = accel_set_error(ACCEL_ERR_FORMAT, "%s: entry \"%s\": expected an f32 state of %lld elements", fn,
                                st[e].name, (long long)numel);
            break;
        }
        int64_t lo = z->user_off[u], hi = lo + numel;
        for (int v = 0; v < zm->n_units; v++) {
            int64_t plo = piece_lo(acc, &zm->units[v]), phi = plo + zm->units[v].shard;
            int64_t a = lo > plo ? lo : plo, c = hi < phi ? hi : phi;
            if (a < c && !s && !check)
                s = accel__tensor_read_bytes(t, (size_t)(a - lo) * sizeof(float), local[k] + zm->units[v].zoff + (a - plo),
                                             (size_t)(c - a) * sizeof(float));
        }
    }
    if (!s) s = check_user_groups(acc, i, n, st, fn); /* after the entries, as the optimizer checks them */
    if (!s) s = load_local(acc, i, m, res, local, step, check);
    if (res) accel_named_state_free(res, m);
    accel_free(local[0]);
    accel_free(local[1]);
    return s;
}

accel_status accel__zero_load_state(accel_accelerator *acc, int i, int n, const accel_named_state *st) {
    return zero_load(acc, i, n, st, false);
}

accel_status accel__zero_check_state(accel_accelerator *acc, int i, int n, const accel_named_state *st) {
    return zero_load(acc, i, n, st, true);
}

accel_status accel__zero_release_optimizer(accel_accelerator *acc, int i, bool consolidate) {
    accel__zopt *z = acc->strat_opt[i];
    if (!z) return ACCEL_OK;
    if (!consolidate) { /* the optimizer is being freed */
        zopt_free(z);
        acc->strat_opt[i] = NULL;
        return ACCEL_OK;
    }
    accel_optimizer *opt = acc->opts[i];
    float *bufs[2];
    accel_named_state *st = NULL;
    /* The full state is gathered while the flat buffers still exist; if that
     * fails (a broken group) the user's parameters come back with fresh
     * state, and the release says so. */
    accel__first_error first = {0};
    int n = accel__zero_state(acc, i, &st, bufs);
    if (n < 0)
        accel__first_error_note(&first, accel_set_error(accel_last_status(),
                                                        "ZeRO release: rank %d: optimizer %d's state could not be "
                                                        "consolidated (%s): it comes back with fresh state",
                                                        acc->rank, i, accel_last_error()));
    accel__optimizer_set_offload(opt, NULL); /* the state file goes: the user's optimizer holds its state again */
    accel_status rs = accel_optimizer_set_segments(opt, z->n_user, z->user_params, NULL, NULL, z->user_groups);
    if (!rs && n >= 0) rs = accel_optimizer_load_state(opt, n, st);
    if (rs) /* out of memory */
        accel__first_error_note(&first, accel_set_error(accel_last_status(),
                                                        "ZeRO release: rank %d: optimizer %d could not get its own "
                                                        "parameters and state back (%s)",
                                                        acc->rank, i, accel_last_error()));
    if (n >= 0) accel_named_state_free(st, n);
    accel_free(bufs[0]);
    accel_free(bufs[1]);
    zopt_free(z);
    acc->strat_opt[i] = NULL;
    return accel__first_error_return(&first);
}

/* ---------------------------------------------------------------- the strategies */

const accel__strategy accel__strategy_zero1 = {
    .name = "zero1",
    .stage = 1,
    .shards = true,
    .pipeline = true,
    .layout = zero1_layout,
    .start = accel__ddp_start,
    .release = zero12_release,
    .begin_backward = accel__ddp_begin_backward,
    .grad_ready = accel__ddp_grad_ready,
    .end_backward = accel__ddp_end_backward,
    .prepare_optimizer = accel__zero_prepare_optimizer,
    .optimizer_model = accel__zero_optimizer_model,
    .user_param = accel__zero_user_param,
    .release_optimizer = accel__zero_release_optimizer,
    .after_step = zero12_after_step,
    .zero_grad = zero12_zero_grad,
    .shard_range = zero12_shard_range,
    .grad_shard = accel__zero_grad_shard,
    .sp_reduce = zero12_sp_reduce,
    .clip = accel__zero_clip,
    .optimizer_state = accel__zero_state,
    .load_optimizer_state = accel__zero_load_state,
    .check_optimizer_state = accel__zero_check_state,
};

static accel_status no_start(accel_accelerator *acc, accel__model *pm) {
    (void)acc, (void)pm;
    return ACCEL_OK;
}

static bool no_hook(accel_accelerator *acc, accel__model *pm) {
    (void)acc, (void)pm;
    return false;
}

static bool not_mine(accel_accelerator *acc, accel__model *pm, const accel_tensor *leaf) {
    (void)acc, (void)pm, (void)leaf;
    return false;
}

const accel__strategy accel__strategy_zero2 = {
    .name = "zero2",
    .stage = 2,
    .shards = true,
    .pipeline = true,
    .layout = zero2_layout,
    .start = no_start,
    .release = zero12_release,
    .begin_backward = no_hook,
    .grad_ready = not_mine,
    .end_backward = zero2_end_backward,
    .prepare_optimizer = accel__zero_prepare_optimizer,
    .optimizer_model = accel__zero_optimizer_model,
    .user_param = accel__zero_user_param,
    .release_optimizer = accel__zero_release_optimizer,
    .after_step = zero12_after_step,
    .zero_grad = zero12_zero_grad,
    .shard_range = zero12_shard_range,
    .grad_shard = accel__zero_grad_shard,
    .sp_reduce = zero12_sp_reduce,
    .clip = accel__zero_clip,
    .optimizer_state = accel__zero_state,
    .load_optimizer_state = accel__zero_load_state,
    .check_optimizer_state = accel__zero_check_state,
};
