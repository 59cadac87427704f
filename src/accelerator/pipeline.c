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
 *          (Megatron's non-interleaved schedule);
 *   interleaved 1F1B  with v chunks of the model per stage (virtual stages:
 *          stage s holds chunks s, s + p, ...), Megatron's interleaved
 *          order, planned in ticks (pipeline_schedule.h) and run below.
 *
 * Between stages travel the hidden states [B/m, T, C] (forward) and their
 * gradients (backward), point to point (accel_pg_send_recv): a stage's
 * outgoing message is sent together with the next receive it makes, as
 * Megatron's send_forward_recv_backward pairs them, so neighbours that send
 * to each other at once never deadlock. Under tp a pp group is one tp rank of
 * every stage, under cp one cp rank: a cp rank's stages run its two chunks
 * of the sequence (T / cp positions, accel_cp_shard of ids on the first
 * stage), their attention exchanging over the stage's cp group, and the last
 * stage's loss is the whole sequence's (the family's loss hook).
 *
 * Recompute: a forward runs without a graph and keeps only the stage's input
 * (ids on stage 0); the micro-batch's backward runs its forward again with
 * grad on and back-propagates at once (full activation recomputation, as
 * Megatron's --recompute-granularity full). The tape then never holds two
 * micro-batches, and what a stage holds between its forward and backward of
 * a micro-batch is its input: at most m of them under GPipe, p - s under
 * 1F1B - the memory difference the schedules exist for. The recompute is
 * deterministic (dropout while training is refused: the family's
 * recomputable), so gradients are those of one process's step over the
 * whole batch, within rounding. (The step arena still keeps each
 * micro-batch's intermediates until accel_step_reset: a rewind between
 * micro-batches would free what the step's caches of prepared weights
 * hold. What the schedule bounds is the saved inputs.)
 *
 * The loss of micro-batch i is scaled by 1/m (and by the accelerator's
 * accumulation, fp16 and cp factors, as accel_accelerator_backward does), so the
 * gradients accumulated over the m backwards are the batch's; the reported
 * loss, the mean over the micro-batches, is broadcast from the last stage.
 * The strategy (DDP, ZeRO-1 or ZeRO-2, over the stage's data-parallel group:
 * dp_pg and shard_pg exclude pp) reduces only in the last micro-batch's
 * backward, so ZeRO-2 reduce-scatters the step's accumulated gradients once;
 * a tied lm_head's gradient (the embedding's, used on the first and the last
 * stage) is summed over the pp group on sync steps, and then the strategy
 * reduces after the schedule instead (reduce_grads): a reduce-scatter leaves
 * no whole gradient to sum. A stage holds only its part of the model
 * (accel__pipeline_keep_stage at prepare: the split every rank agrees on, the other stages' parameters
 * on meta, the flat buffers and the optimizer over what it kept). A step's
 * buffers (saved inputs, messages, the schedule) live in the step arena: a
 * steady step allocates nothing. Checkpoints are one process's (the end of
 * this file). */
#include <limits.h>
#include <math.h>
#include <string.h>

#include "accel/cp.h"
#include "accel/parallel.h"
#include "accelerator_internal.h"
#include "nn/family.h"
#include "pipeline_schedule.h"
#include "strategy.h"

#define FN "accel_accelerator_pipeline_step"
/* Why a strategy without the table's pipeline flag (ZeRO-3) is refused. */
#define NOT_PP "its parameters are gathered and its gradients reduce-scattered unit by unit around every " \
               "forward and backward, which a stage runs for each micro-batch and again to recompute it"

typedef struct pp_run {
    accel_accelerator *acc;
    accel_module *model;
    const accel__family_stages *hooks; /* the model's family's (nn/family.h) */
    accel__model *pm;
    accel_pg *pg;             /* the pp group (NULL: one stage) */
    int stage, stages, m, lo, hi;
    int virt;                 /* model chunks per stage: > 1 under interleaved 1F1B */
    const int *split;         /* the chunks' layer ranges, first_layer[0..stages x virt] */
    bool first, last;         /* this stage holds the embeddings / the head and the loss */
    bool tied;                /* a tied lm_head over several stages: the reduction waits for sum_tied */
    accel_tensor *ids;        /* [B, T]: the loss's labels */
    accel_tensor *in_ids;     /* the first chunk's input: ids, or under cp this rank's chunks of them
                               * (accel_cp_shard) [B, T / cp] */
    int64_t rows, T, C;       /* a micro-batch's hidden states [rows, T, C]: T the positions of in_ids, a
                               * tp rank's share of them under sequence parallelism */
    accel_dtype dt;           /* of the hidden states */
    size_t numel, bytes;      /* rows T C, and their bytes */
    /* The step's buffers, in the step arena (a steady step allocates nothing):
     * held: [slots][bytes], the saved inputs (stages > 0), micro-batch i's in
     * slot i % slots - the micro-batches in flight are consecutive and at most
     * slots of them (m under GPipe, p - s under 1F1B); under interleaved 1F1B
     * the plan's slots (pipeline_schedule.h: saved inputs and gradients that
     * arrived); grad_buf: the incoming gradient; out_buf: the outgoing
     * message (pending until the next exchange but under interleaved 1F1B). */
    char *held;
    void *grad_buf, *out_buf;
    int slots, in_flight;
    int out_peer;             /* -1: none pending */
    double loss_sum, busy_s;
    accel_pipeline_report rep;
} pp_run;

/* Micro-batch i's saved input: [bytes]. */
static void *held_slot(const pp_run *r, int i) { return r->held + (size_t)(i % r->slots) * r->bytes; }

/* Rows of micro-batch i of ids [B, ...]: [rows, ...]. */
static accel_tensor *micro_rows(pp_run *r, accel_tensor *ids, int i) {
    return accel_slice(ids, 0, (int64_t)i * r->rows, (int64_t)(i + 1) * r->rows, 1);
}

/* Micro-batch i's ids, whole (for the loss): [rows, T]. */
static accel_tensor *micro_ids(pp_run *r, int i) { return micro_rows(r, r->ids, i); }

/* Micro-batch i's input to the first chunk: [rows, T / cp]. */
static accel_tensor *micro_in(pp_run *r, int i) { return micro_rows(r, r->in_ids, i); }

/* Receives count elements of the hidden states' dtype from peer into buf,
 * sending the pending message (if any) at the same time. */
static accel_status exchange(pp_run *r, void *buf, int peer) {
    accel_status st = accel_pg_send_recv(r->pg, r->out_buf, r->numel, r->out_peer, buf, buf ? r->numel : 0,
                                         buf ? peer : -1, r->dt);
    r->out_peer = -1;
    return st;
}

/* t's values become the outgoing message (out_buf). */
static accel_status put_out(pp_run *r, accel_tensor *t) {
    if (!t) return accel_last_status();
    if (accel_numel(t) != (int64_t)r->numel || t->dtype != r->dt)
        return accel_set_error(ACCEL_ERR_SHAPE, FN ": stage %d made %lld %s values where %zu %s were expected",
                               r->stage, (long long)accel_numel(t), accel_dtype_name(t->dtype), r->numel,
                               accel_dtype_name(r->dt));
    return accel_tensor_to_host(accel_contiguous(t), r->out_buf);
}

/* A step tensor [rows, T, C] holding the bytes at src. */
static accel_tensor *hidden_from(pp_run *r, const void *src) {
    accel_tensor *x = accel_empty_on(r->dt, 3, (int64_t[]){r->rows, r->T, r->C}, r->acc->device);
    return x && accel_tensor_from_host(x, src) == ACCEL_OK ? x : NULL;
}

/* A part of the model a stage runs: layers [lo, hi), the embeddings before
 * them (first) or the final norm, lm_head and loss after them (last). */
typedef struct pp_chunk {
    int lo, hi;
    bool first, last;
} pp_chunk;

/* Micro-batch i's forward through ch without a graph, x its input (ids for
 * the first chunk): the last chunk adds its loss to loss_sum, another's
 * output becomes out_buf's. */
static accel_status run_forward(pp_run *r, const pp_chunk *ch, accel_tensor *x, int i) {
    accel_status st = ACCEL_OK;
    r->in_flight++;
    if (r->in_flight > r->rep.peak_in_flight) r->rep.peak_in_flight = r->in_flight;
    double t0 = accel_now_seconds();
    bool was = accel_set_grad_enabled(false);
    accel_tensor *y = r->hooks->forward(r->model, x, ch->lo, ch->hi, ch->first, ch->last);
    if (ch->last) {
        accel_tensor *loss = r->hooks->loss(r->model, y, micro_ids(r, i));
        if (loss) r->loss_sum += accel_item(loss);
        else st = accel_last_status();
    } else {
        st = put_out(r, y);
    }
    accel_set_grad_enabled(was);
    r->busy_s += accel_now_seconds() - t0;
    return st;
}

/* Micro-batch i's backward through ch: its forward again with grad on, then
 * back from the loss (the last chunk) or from grad, the gradient of its
 * output; the gradient of x (not the first chunk's ids) becomes out_buf's.
 * reduce: the stage's last backward of the step, where the strategy
 * reduces (unless a tied embedding makes it wait: reduce_grads). */
static accel_status run_backward(pp_run *r, const pp_chunk *ch, accel_tensor *x, accel_tensor *grad, int i,
                                 bool reduce) {
    double t0 = accel_now_seconds();
    if (!ch->first) (void)accel_requires_grad_(x, true); /* x is a live tensor: cannot fail */
    bool no_sync = r->pm->no_sync;
    r->pm->no_sync = no_sync || !reduce || r->tied;
    accel__backward_begin(r->acc);
    accel_tensor *y = r->hooks->forward(r->model, x, ch->lo, ch->hi, ch->first, ch->last);
    accel_status st;
    if (ch->last) {
        /* under cp x cp_grad_factor: the dp group's average spans the cp ranks, whose gradients add up (cp.c) */
        double scale = 1.0 / r->m / r->acc->accum_steps * (r->acc->mp == ACCEL_MP_FP16 ? r->acc->scale : 1.0) *
                       accel__cp_grad_factor(r->acc);
        accel_tensor *loss = accel_mul_scalar(r->hooks->loss(r->model, y, micro_ids(r, i)), scale);
        st = loss ? accel_backward(loss) : accel_last_status();
    } else {
        st = y ? accel_backward_with(y, grad) : accel_last_status();
    }
    accel_status end = accel__backward_end(r->acc);
    r->pm->no_sync = no_sync;
    if (!st) st = end;
    r->busy_s += accel_now_seconds() - t0;
    if (!st && !ch->first) st = x->grad ? put_out(r, x->grad)
                                        : accel_set_error(ACCEL_ERR_STATE, FN ": stage %d's input got no gradient",
                                                          r->stage);
    r->in_flight--; /* its slot is free: x copied the saved input */
    return st;
}

/* ---------------------------------------------------------------- GPipe and 1F1B
 * One chunk per stage; a stage's outgoing message waits in out_buf for its
 * next exchange (exchange). */

static pp_chunk stage_chunk(const pp_run *r) { return (pp_chunk){r->lo, r->hi, r->first, r->last}; }

static accel_status forward(pp_run *r, int i) {
    accel_status st = ACCEL_OK;
    accel_tensor *x;
    if (r->first) {
        x = micro_in(r, i);
        if (r->out_peer >= 0) st = exchange(r, NULL, -1);
    } else {
        st = exchange(r, held_slot(r, i), r->stage - 1);
        x = st ? NULL : hidden_from(r, held_slot(r, i));
    }
    if (!st && !x) st = accel_last_status();
    pp_chunk ch = stage_chunk(r);
    if (!st) st = run_forward(r, &ch, x, i);
    if (!st && !r->last) r->out_peer = r->stage + 1;
    return st;
}

static accel_status backward(pp_run *r, int i) {
    accel_status st = ACCEL_OK;
    accel_tensor *grad = NULL, *x = r->first ? micro_in(r, i) : hidden_from(r, held_slot(r, i));
    if (!x) st = accel_last_status();
    if (!st && !r->last) {
        st = exchange(r, r->grad_buf, r->stage + 1);
        grad = st ? NULL : hidden_from(r, r->grad_buf);
        if (!st && !grad) st = accel_last_status();
    } else if (!st && r->out_peer >= 0) {
        st = exchange(r, NULL, -1);
    }
    if (st) return st;
    pp_chunk ch = stage_chunk(r);
    st = run_backward(r, &ch, x, grad, i, i == r->m - 1);
    if (!st && !r->first) r->out_peer = r->stage - 1;
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

/* bytes of the step arena (64-byte aligned): the step's buffers, freed by
 * accel_step_reset; once the arena has grown to a step's size, a step of the
 * same shapes allocates nothing. */
static void *step_buffer(size_t bytes) { return accel_arena_alloc(accel_step_arena(), bytes ? bytes : 1, 64); }

/* ---------------------------------------------------------------- interleaved 1F1B
 * virt chunks per stage (pipeline_schedule.h): the plan's ticks; after the
 * last tick of an op, the hidden state this stage made goes to the next stage
 * or the gradient to the previous one (round the ring: the last stage feeds
 * stage 0's next chunk), while what the neighbours made arrives in the
 * plan's slots. */

static accel_status run_interleaved(pp_run *r) {
    accel__pp_plan plan;
    if (accel__pp_interleaved_plan(r->stages, r->virt, r->m, r->stage, &plan)) return accel_last_status();
    r->slots = plan.slots;
    if (!(r->held = step_buffer((size_t)plan.slots * r->bytes))) return accel_last_status();
    int chunks = r->stages * r->virt, next = (r->stage + 1) % r->stages, prev = (r->stage + r->stages - 1) % r->stages;
    accel_status st = ACCEL_OK;
    for (int t = 0; t < plan.n_ticks && !st; t++) {
        int k = plan.tick_op[t];
        if (k >= 0) { /* the op whole; out_buf keeps its output until it goes out, after its last tick */
            const accel__pp_op *o = &plan.ops[k];
            int c = o->chunk * r->stages + r->stage;
            pp_chunk ch = {r->split[c], r->split[c + 1], c == 0, c == chunks - 1};
            accel_tensor *x = ch.first ? micro_in(r, o->micro) : hidden_from(r, held_slot(r, o->in_slot));
            accel_tensor *grad = o->backward && !ch.last ? hidden_from(r, held_slot(r, o->grad_slot)) : NULL;
            if (!x || (o->backward && !ch.last && !grad)) st = accel_last_status();
            else if (o->backward) st = run_backward(r, &ch, x, grad, o->micro, k == plan.n_ops - 1);
            else st = run_forward(r, &ch, x, o->micro);
        }
        int h = plan.hidden_in[t], g = plan.grad_in[t], to_next = plan.sends[t] == 0 ? next : -1;
        int to_prev = plan.sends[t] == 1 ? prev : -1;
        if (!st) st = accel_pg_send_recv(r->pg, r->out_buf, r->numel, to_next, h >= 0 ? held_slot(r, h) : NULL,
                                         h >= 0 ? r->numel : 0, h >= 0 ? prev : -1, r->dt);
        if (!st) st = accel_pg_send_recv(r->pg, r->out_buf, r->numel, to_prev, g >= 0 ? held_slot(r, g) : NULL,
                                         g >= 0 ? r->numel : 0, g >= 0 ? next : -1, r->dt);
    }
    return st;
}

/* A tied lm_head's weight is the embedding's: stage 0's and the last stage's
 * gradients of it are summed over the pp group (the middle stages, which do
 * not use it, add zeros and keep none), before the data-parallel reduction
 * (reduce_grads). */
static accel_status sum_tied(pp_run *r) {
    accel_tensor *w = r->stages == 1 ? NULL : r->hooks->tied_embedding(r->model);
    if (!w) return ACCEL_OK;
    bool mine = r->first || r->last;
    size_t n = (size_t)accel_numel(w), bytes = n * accel_dtype_size(w->dtype);
    void *h = step_buffer(bytes);
    if (!h) return accel_last_status();
    memset(h, 0, bytes);
    accel_status st = mine && w->grad ? accel_tensor_to_host(w->grad, h) : ACCEL_OK;
    if (!st) st = accel_pg_all_reduce(r->pg, h, n, w->dtype, ACCEL_REDUCE_SUM);
    if (!st && mine && !w->grad) { /* a stage whose part gave none (cannot happen after a backward) */
        accel_tensor *z = accel_empty_on(w->dtype, w->ndim, w->shape, w->device);
        if (!z || accel_zero_(z) != ACCEL_OK || accel_grad_accumulate(w, z) != ACCEL_OK) st = accel_last_status();
    }
    if (!st && mine) st = accel_tensor_from_host(w->grad, h);
    return st;
}

/* With a tied embedding, the step's data-parallel reduction, after sum_tied:
 * the strategy's, as at the end of a backward (DDP's all-reduce, ZeRO-2's
 * reduce-scatter into its shard; none while gradients accumulate). */
static accel_status reduce_grads(pp_run *r) {
    accel__backward_begin(r->acc);
    return accel__backward_end(r->acc);
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

/* The chunks the model is cut into: a chunk per stage, or pp_virtual_stages
 * per stage under interleaved 1F1B (chunk c is stage c mod pp_size's). */
static int n_chunks(const accel_accelerator *acc) { return acc->par.size[ACCEL__MESH_PP] * acc->par.pp_virtual; }

/* The stage whose chunks hold state-dict entry name of model (split: its
 * chunks' layer ranges). */
static int owner_stage(const accel_accelerator *acc, const accel__family_stages *h, const char *name,
                       const int *split) {
    return h->owner(name, split, n_chunks(acc)) % acc->par.size[ACCEL__MESH_PP];
}

/* The chunks' layer ranges (first_layer[0..chunks]): under interleaved 1F1B
 * equal chunks (Megatron's num_layers_per_virtual_pipeline_stage); else
 * Megatron's explicit first / last stage sizes with the other stages sharing
 * the rest evenly, or the balanced split. */
static accel_status stage_split(const accel_accelerator *acc, accel_module *model, int chunks, int *first_layer,
                                const char *fn) {
    const accel__family_stages *h = hooks_of(model, fn);
    if (!h) return accel_last_status();
    int first = acc->par.pp_first_layers, last = acc->par.pp_last_layers, L = h->n_layers(model, fn);
    if (L < 0) return accel_last_status();
    int v = acc->par.pp_virtual, stages = acc->par.size[ACCEL__MESH_PP];
    if (v == 1 && !first && !last) return h->split(model, chunks, NULL, first_layer, fn);
    if (v > 1 && L % chunks)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: interleaved 1F1B cuts the model's %d layers into pp_size "
                               "%d x pp_virtual_stages %d = %d chunks of as many layers (Megatron's "
                               "num_layers_per_virtual_pipeline_stage): %d is not a multiple of %d", fn, L, stages, v,
                               chunks, L, chunks);
    int others = stages - (first > 0) - (last > 0), rest = L - first - last;
    if (v == 1 && (others == 0 ? rest != 0 : rest < others || rest % others))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: %d layers with %d on the first stage and %d on the last "
                               "(0: not given) leave %d for %d other stage%s: they must share them evenly, at least "
                               "one each", fn, L, first, last, rest, others, others == 1 ? "" : "s");
    int *counts = accel_malloc((size_t)chunks * sizeof *counts);
    if (!counts) return accel_last_status();
    for (int s = 0; s < chunks; s++) counts[s] = v > 1 ? L / chunks : others ? rest / others : 0;
    if (first) counts[0] = first;
    if (last) counts[chunks - 1] = last;
    accel_status st = h->split(model, chunks, counts, first_layer, fn);
    accel_free(counts);
    return st;
}

accel_status accel_accelerator_pipeline_set_layers(accel_accelerator *acc, int first_stage_layers,
                                                   int last_stage_layers) {
    if (accel__acc_null(acc, "accel_accelerator_pipeline_set_layers")) return accel_last_status();
    if (first_stage_layers < 0 || last_stage_layers < 0)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_accelerator_pipeline_set_layers: layer counts must be "
                               ">= 0 (0: not given), got %d and %d", first_stage_layers, last_stage_layers);
    if (acc->par.size[ACCEL__MESH_PP] <= 1 && (first_stage_layers || last_stage_layers)) /* else ignored unseen */
        return accel_set_error(ACCEL_ERR_STATE, "accel_accelerator_pipeline_set_layers: pp_size is 1: there is no "
                               "pipeline to set the first and last stages' layers of (%d and %d given)",
                               first_stage_layers, last_stage_layers);
    if (acc->par.size[ACCEL__MESH_PP] > 1 && acc->n_models > 0)
        return accel_set_error(ACCEL_ERR_STATE, "accel_accelerator_pipeline_set_layers: a model is prepared already "
                               "and its stage kept only its layers: set the split before accel_accelerator_prepare");
    if (acc->par.pp_virtual > 1 && (first_stage_layers || last_stage_layers))
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "accel_accelerator_pipeline_set_layers: interleaved 1F1B "
                               "(pp_virtual_stages %d) cuts the layers into equal chunks; an explicit first or last "
                               "stage is not built with it", acc->par.pp_virtual);
    acc->par.pp_first_layers = first_stage_layers;
    acc->par.pp_last_layers = last_stage_layers;
    return ACCEL_OK;
}

static accel_status check(accel_accelerator *acc, accel_module *model, accel_tensor *ids, double *loss,
                          accel__model **pm) {
    if (accel__acc_null(acc, FN)) return accel_last_status();
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
    if (!(*pm)->strat->pipeline)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, FN ": ZeRO stage %d is not built with pipeline_step (" NOT_PP
                               "); use DDP or ZeRO stage 1 or 2", (*pm)->strat->stage);
    return hooks_of(model, FN)->recomputable(model, FN); /* no dropout drawing other masks in the recompute */
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
    r.virt = acc->par.pp_virtual;
    r.split = pm->pp_split;
    r.tied = r.stages > 1 && r.hooks->tied_embedding(model);
    if (r.stages > 1) { /* the split every rank agreed on at prepare (interleaved: the stage's first chunk) */
        r.lo = pm->pp_split[r.stage];
        r.hi = pm->pp_split[r.stage + 1];
    } else if ((r.hi = r.hooks->n_layers(model, FN)) < 0) {
        return accel_last_status();
    }
    r.rows = ids->shape[0] / r.m;
    /* context parallelism: every stage runs this cp rank's two chunks of the
     * sequence (the load-balanced split), which its layers attend over the cp
     * group; the last stage's loss is the whole sequence's (decoder_cp.c) */
    int cp = acc->cp_pg ? accel_pg_size(acc->cp_pg) : 1;
    if (cp > 1 && ids->shape[1] % (2 * cp))
        return accel_set_error(ACCEL_ERR_SHAPE, FN ": context parallelism (cp group of %d ranks) splits the %lld "
                               "positions of ids into 2*cp = %d equal chunks: make the sequence length a multiple of "
                               "%d", cp, (long long)ids->shape[1], 2 * cp, 2 * cp);
    r.in_ids = cp > 1 ? accel_cp_shard(ids, cp, accel_pg_rank(acc->cp_pg)) : ids;
    if (!r.in_ids) return accel_last_status();
    int sp = acc->par.sequence_parallel ? acc->mesh.size[ACCEL__MESH_TP] : 1;
    if (r.in_ids->shape[1] % sp)
        return accel_set_error(ACCEL_ERR_SHAPE, FN ": sequence parallelism splits the %lld positions of ids%s over "
                               "the %d ranks of the tp group: make the sequence length a multiple of tp_size%s",
                               (long long)r.in_ids->shape[1], cp > 1 ? " that a cp rank holds" : "", sp,
                               cp > 1 ? " x cp_size" : "");
    r.T = r.in_ids->shape[1] / sp;
    r.hooks->hidden(model, &r.C, &r.dt);
    r.numel = (size_t)(r.rows * r.T * r.C);
    r.bytes = r.numel * accel_dtype_size(r.dt);
    double t0 = accel_now_seconds();
    accel_status st = (r.out_buf = step_buffer(r.bytes)) ? ACCEL_OK : accel_last_status();
    if (!st && r.virt > 1) {
        st = run_interleaved(&r);
    } else if (!st) {
        r.slots = acc->par.pp_gpipe || r.stages - r.stage > r.m ? r.m : r.stages - r.stage;
        int *ops = step_buffer(2 * (size_t)r.m * sizeof *ops);
        r.grad_buf = r.last ? NULL : step_buffer(r.bytes);
        r.held = r.first ? NULL : step_buffer((size_t)r.slots * r.bytes);
        if (!ops || (!r.last && !r.grad_buf) || (!r.first && !r.held)) return accel_last_status();
        int n = schedule(&r, acc->par.pp_gpipe, ops);
        for (int k = 0; k < n && !st; k++) st = ops[k] >= 0 ? forward(&r, ops[k]) : backward(&r, -1 - ops[k]);
        if (!st && r.out_peer >= 0) st = exchange(&r, NULL, -1); /* the last gradient to the stage before */
    }
    if (!st && acc->sync_gradients) st = sum_tied(&r);
    if (!st && r.tied) st = reduce_grads(&r);
    /* sequence parallelism: the parameters outside the tp regions (the norms)
     * saw their rank's positions only, as after accelerator_backward (where
     * the strategy holds them: ZeRO-2 summed them before its reduce-scatter) */
    if (!st && acc->sync_gradients && acc->par.sequence_parallel) st = pm->strat->sp_reduce(acc, pm);
    double mean = r.loss_sum / r.m;
    if (!st && r.pg) st = accel_pg_broadcast(r.pg, &mean, 1, ACCEL_F64, r.stages - 1);
    if (!st) *loss = mean;
    if (report && !st) {
        *report = (accel_pipeline_report){.stage = r.stage, .stages = r.stages, .first_layer = r.lo,
                                          .end_layer = r.hi, .virtual_stages = r.virt, .micro_batches = r.m,
                                          .wall_s = accel_now_seconds() - t0, .busy_s = r.busy_s,
                                          .peak_in_flight = r.rep.peak_in_flight};
        /* interleaved: the plan's slots, on stage 0 too (its later chunks' inputs) */
        report->peak_held_bytes = r.virt > 1 ? (size_t)r.slots * r.bytes
                                             : r.first ? 0 : (size_t)report->peak_in_flight * r.bytes;
    }
    return st;
}

accel_tensor *accel__pipeline_tied_copy(const accel_accelerator *acc, accel_module *model) {
    int stages = acc->par.size[ACCEL__MESH_PP];
    const accel__family *f = accel__family_of(model);
    if (stages == 1 || acc->mesh.coord[ACCEL__MESH_PP] != stages - 1 || !f || !f->stages) return NULL;
    return f->stages->tied_embedding(model);
}

accel_status accel__pipeline_norm_reduce(accel_accelerator *acc, double *local, double norm_type) {
    if (acc->par.size[ACCEL__MESH_PP] == 1) return ACCEL_OK;
    accel_pg *pg = accel__mesh_group(&acc->mesh, ACCEL__MESH_PP);
    return pg ? accel__norm_all_reduce(pg, local, 1, norm_type) : accel_last_status();
}

accel_status accel__pipeline_norm_partial(accel_accelerator *acc, accel_module *model, double *local, double norm_type) {
    /* the last stage's copy of a tied embedding's gradient equals stage 0's
     * (sum_tied): counted once, its share taken as `local` counted it (under
     * tp its slices' over the tp group) */
    accel_tensor *w = isinf(norm_type) ? NULL : accel__pipeline_tied_copy(acc, model);
    if (w && w->grad) {
        double tied;
        accel_status st = accel__tp_param_norm_partial(acc, model, w, norm_type, &tied);
        if (st) return st; /* the tp group failed: its ranks all see it */
        *local = accel__norm_without(*local, tied);
    }
    return accel__pipeline_norm_reduce(acc, local, norm_type);
}

/* Whether this stage keeps parameter entry e: its chunks', and a tied input
 * embedding on the last stage too (its lm_head). */
static bool kept(const accel_accelerator *acc, const accel__family_stages *h, accel_module *model,
                 const accel_state_entry *e, const int *first_layer, int stage) {
    if (owner_stage(acc, h, e->name, first_layer) == stage) return true;
    return stage == acc->par.size[ACCEL__MESH_PP] - 1 && e->t == h->tied_embedding(model);
}

/* The split model was prepared with (pp_size > 1; agreed by every rank at
 * prepare), or NULL + error naming fn. */
static const int *split_of(accel_accelerator *acc, accel_module *model, const char *fn) {
    const accel__model *pm = accel__find_model(acc, model);
    if (!pm || !pm->pp_split)
        accel_set_error(ACCEL_ERR_STATE, "%s: the model was not prepared by this accelerator under pipeline "
                        "parallelism (its stages' split is fixed at prepare)", fn);
    return pm ? pm->pp_split : NULL;
}

/* Moves the parameters this stage does not keep to meta. */
static accel_status release_others(accel_accelerator *acc, accel_module *model, const int *split, accel_pg *pg,
                                   const char *fn) {
    const accel__family_stages *h = hooks_of(model, fn);
    accel_state_dict *sd = h ? accel_module_state_dict(model) : NULL;
    if (!sd) return accel_last_status();
    for (int i = 0; i < sd->n; i++) {
        accel_state_entry *e = &sd->entries[i];
        if (!e->is_buffer && !e->is_tied_alias && !kept(acc, h, model, e, split, accel_pg_rank(pg)))
            (void)accel_tensor_to_meta(e->t); /* a persistent parameter: cannot fail */
    }
    accel_state_dict_free(sd);
    h->released(model, accel_pg_rank(pg), accel_pg_size(pg));
    return ACCEL_OK;
}

/* "3 + 1": the stages' layer counts of first_layer[0..stages]. */
static void split_str(const int32_t *first_layer, int chunks, char *out, size_t n) {
    size_t at = 0;
    out[0] = 0;
    for (int s = 0; s < chunks && at < n; s++)
        at += (size_t)snprintf(out + at, n - at, "%s%d", s ? " + " : "", (int)(first_layer[s + 1] - first_layer[s]));
}

/* Every rank's split compared (all-gathered over the world, so the dp
 * replicas' pp groups agree too): the same on every rank, else an error on
 * every rank naming two that differ, or the rank whose own split failed or
 * whose stage lacks a parameter it would keep (mine: this rank's status,
 * lacks: that it failed for the latter; its error stays its own). The split
 * is set per rank and a model may be built differently on each, so a rank's
 * split alone proves nothing: stages that disagreed would exchange hidden
 * states of the wrong layers. */
static accel_status agree_split(accel_accelerator *acc, int stage, const int *split, int chunks, accel_status mine,
                                bool lacks, const char *fn) {
    /* a record: stage, failed (0 no, 1 the split, 2 a kept parameter missing), first_layer[0..chunks] */
    size_t k = (size_t)chunks + 3, world = (size_t)acc->world;
    int32_t *all = accel_malloc((world + 1) * k * sizeof *all), *rec = all ? all + world * k : NULL;
    /* every rank into the all-gather, or none */
    accel_status got = accel__prepare_agree(acc, all ? ACCEL_OK : accel_last_status(), "record the pipeline split");
    if (got) {
        accel_free(all);
        return got;
    }
    rec[0] = stage;
    rec[1] = mine == ACCEL_OK ? 0 : lacks ? 2 : 1;
    for (int s = 0; s <= chunks; s++) rec[2 + s] = mine ? 0 : split[s];
    accel_status st = accel_pg_all_gather(acc->pg, rec, all, k, ACCEL_I32);
    size_t bad = world, differs = world;
    for (size_t r = 0; r < world && !st; r++) {
        if (all[r * k + 1] && bad == world) bad = r;
        if (memcmp(all + r * k + 2, all + 2, (k - 2) * sizeof *all) && differs == world) differs = r;
    }
    if (!st && mine) {
        st = mine;
    } else if (!st && bad < world && all[bad * k + 1] == 2) {
        st = accel_set_error(ACCEL_ERR_STATE, "%s: rank %zu (pipeline stage %d) lacks parameters its stage keeps "
                             "under this split (on meta: released by an earlier prepare under another split; its "
                             "error is reported there)", fn, bad, (int)all[bad * k]);
    } else if (!st && bad < world) {
        st = accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: rank %zu (pipeline stage %d) could not split the model's "
                             "layers into %d chunks (its error is reported there)", fn, bad,
                             (int)all[bad * k], chunks);
    } else if (!st && differs < world) {
        char a[256], b[256];
        split_str(all + 2, chunks, a, sizeof a);
        split_str(all + differs * k + 2, chunks, b, sizeof b);
        st = accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: the ranks split the model's layers differently into %d "
                             "chunks (a chunk per pipeline stage and virtual stage): rank 0 (stage %d) as %s, rank "
                             "%zu (stage %d) as %s; give every rank the same accel_accelerator_pipeline_set_layers "
                             "and the same model", fn, chunks,
                             (int)all[0], a, differs, (int)all[differs * k], b);
    }
    accel_free(all);
    return st;
}

/* ACCEL_OK when stage holds every parameter it keeps under split, else an
 * error naming the first it lacks (on meta; *lacks set) or why the model's
 * entries could not be listed. A prepare releases the other stages'
 * parameters and an unprepare does not bring them back (their values are on
 * the stages that kept them), so a model prepared again under another split
 * (accel_accelerator_pipeline_set_layers between) would train layers with no
 * data: refused here, before any of them runs. */
static accel_status holds_kept(accel_accelerator *acc, accel_module *model, const int *split, int stage,
                               const char *fn, bool *lacks) {
    const accel__family_stages *h = hooks_of(model, fn);
    accel_state_dict *sd = h ? accel_module_state_dict(model) : NULL;
    if (!sd) return accel_last_status();
    accel_status st = ACCEL_OK;
    for (int i = 0; i < sd->n && !st; i++) {
        accel_state_entry *e = &sd->entries[i];
        if (e->is_buffer || e->is_tied_alias || e->t->device.type != ACCEL_DEV_META ||
            !kept(acc, h, model, e, split, stage))
            continue;
        *lacks = true;
        st = accel_set_error(ACCEL_ERR_STATE, "%s: pipeline stage %d keeps %s under this split, and it has no data "
                             "(on meta): a prepare releases the other stages' parameters and an unprepare does not "
                             "bring them back, so a model is prepared again only under the split it had (the same "
                             "accel_accelerator_pipeline_set_layers); build it anew for another", fn, stage, e->name);
    }
    accel_state_dict_free(sd);
    return st;
}

accel_status accel__pipeline_split_model(accel_accelerator *acc, accel__model *pm) {
    static const char fn[] = "accel_accelerator_prepare";
    int stages = acc->par.size[ACCEL__MESH_PP];
    if (stages == 1) return ACCEL_OK;
    if (!acc->strat->pipeline)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "%s: ZeRO stage %d is not built with pipeline parallelism "
                               "(pp_size %d: " NOT_PP "); use DDP or ZeRO stage 1 or 2", fn, acc->strat->stage,
                               stages);
    accel_pg *pg = accel__mesh_group(&acc->mesh, ACCEL__MESH_PP);
    int chunks = n_chunks(acc), *split = pg ? accel_malloc(((size_t)chunks + 1) * sizeof *split) : NULL;
    accel_status got = accel__prepare_agree(acc, split ? ACCEL_OK : accel_last_status(), "split the model into stages");
    if (got) {
        accel_free(split);
        return got;
    }
    accel_status mine = stage_split(acc, pm->m, chunks, split, fn);
    bool lacks = false;
    if (!mine) mine = holds_kept(acc, pm->m, split, accel_pg_rank(pg), fn, &lacks);
    accel_status st = agree_split(acc, accel_pg_rank(pg), split, chunks, mine, lacks, fn);
    if (st) accel_free(split);
    else pm->pp_split = split;
    return st;
}

accel_status accel__pipeline_keep_stage(accel_accelerator *acc, accel__model *pm) {
    if (!pm->pp_split) return ACCEL_OK;
    accel_pg *pg = accel__mesh_group(&acc->mesh, ACCEL__MESH_PP);
    return pg ? release_others(acc, pm->m, pm->pp_split, pg, "accel_accelerator_prepare") : accel_last_status();
}

accel_status accel__pipeline_release(accel_accelerator *acc, accel_module *model, const char *fn) {
    if (acc->par.size[ACCEL__MESH_PP] == 1) return ACCEL_OK;
    accel_pg *pg = accel__mesh_group(&acc->mesh, ACCEL__MESH_PP);
    const int *split = pg ? split_of(acc, model, fn) : NULL;
    return split ? release_others(acc, model, split, pg, fn) : accel_last_status();
}

accel_status accel__pipeline_prepare_optimizer(accel_accelerator *acc, int i) {
    acc->pp_opt[i] = NULL;
    if (acc->par.size[ACCEL__MESH_PP] == 1) return ACCEL_OK;
    accel_optimizer *opt = acc->opts[i];
    int n = accel_optimizer_num_segments(opt), kept_n = 0;
    /* the record, then its params [n] and groups [n] in one block */
    accel__pp_opt *po = accel_malloc(sizeof *po + (size_t)n * (sizeof po->params[0] + sizeof po->groups[0]));
    accel_tensor **params = accel_malloc((size_t)(n ? n : 1) * sizeof *params);
    int *groups = accel_malloc((size_t)(n ? n : 1) * sizeof *groups);
    accel_status st = po && params && groups ? ACCEL_OK : accel_last_status();
    if (po) {
        po->params = (accel_tensor **)(po + 1);
        po->groups = (int *)(po->params + n);
    }
    for (int k = 0; !st && k < n; k++) {
        int g;
        accel_tensor *p = accel_optimizer_segment_param(opt, k, &g);
        if (!p) st = accel_set_error(ACCEL_ERR_STATE, "accel_accelerator_prepare_optimizer: segment %d of the "
                                     "optimizer has no parameter tensor (already re-targeted)", k);
        else if ((po->params[k] = p, po->groups[k] = g, p->device.type != ACCEL_DEV_META))
            params[kept_n] = p, groups[kept_n++] = g;
    }
    /* only this stage's parameters: the others were released at the model's prepare */
    if (!st && kept_n < n) st = accel_optimizer_set_segments(opt, kept_n, params, NULL, NULL, groups);
    accel_free(params);
    accel_free(groups);
    if (st) {
        accel_free(po);
        return st;
    }
    po->n = n;
    acc->pp_opt[i] = po;
    return ACCEL_OK;
}

void accel__pipeline_unprepare_optimizer(accel_accelerator *acc, int i) {
    accel__pp_opt *po = acc->pp_opt[i];
    if (!po) return;
    /* back to every parameter, as built (out of memory only); said, as the undo returns nothing */
    if (accel_optimizer_set_segments(acc->opts[i], po->n, po->params, NULL, NULL, po->groups))
        fprintf(stderr, "accel: warning: accel_accelerator_prepare_optimizer: the optimizer keeps only this pipeline "
                "stage's parameters (%s)\n", accel_last_error());
    accel_free(po);
    acc->pp_opt[i] = NULL;
}

accel_status accel__pipeline_gather_weights(accel_accelerator *acc, accel_module *model) {
    int stages = acc->par.size[ACCEL__MESH_PP];
    if (stages == 1) return ACCEL_OK;
    static const char fn[] = "accel_accelerator_save_model";
    accel_pg *pg = accel__mesh_group(&acc->mesh, ACCEL__MESH_PP);
    const int *split = pg ? split_of(acc, model, fn) : NULL;
    const accel__family_stages *hooks = split ? hooks_of(model, fn) : NULL;
    accel_state_dict *sd = hooks ? accel_module_state_dict(model) : NULL;
    accel_status st = sd ? ACCEL_OK : accel_last_status();
    for (int i = 0; !st && i < sd->n; i++) {
        accel_state_entry *e = &sd->entries[i];
        if (e->is_buffer || e->is_tied_alias) continue;
        /* another stage's, released at prepare: here until accel__pipeline_release after the save */
        if (e->t->device.type == ACCEL_DEV_META && (st = accel_tensor_to_device_(e->t, acc->device))) break;
        size_t bytes = (size_t)accel_numel(e->t) * accel_dtype_size(e->t->dtype);
        int owner = owner_stage(acc, hooks, e->name, split);
        void *h = accel_malloc(bytes ? bytes : 1);
        if (!h) st = accel_last_status();
        if (!st && accel_pg_rank(pg) == owner) st = accel_tensor_to_host(e->t, h);
        if (!st) st = accel_pg_broadcast(pg, h, bytes, ACCEL_U8, owner);
        if (!st && accel_pg_rank(pg) != owner) st = accel_tensor_from_host(e->t, h);
        accel_free(h);
    }
    accel_state_dict_free(sd);
    return st;
}

/* ---------------------------------------------------------------- checkpoints
 * A pipeline's checkpoint is a one-process one: save_state gathers the whole
 * model (accel__pipeline_gather_weights) and the whole optimizer state, in
 * the numbering of the optimizer as it was built (acc->pp_opt: every
 * parameter, the other stages' too), to rank 0; load_state gives each stage
 * its part of both. Under tp x pp a pp group is one tp rank's: its stage 0
 * collects that rank's slices, which the stage-0 tp group then joins into
 * whole states (tp.c, accel__tp_gather_optimizer); load_state cuts them to
 * the rank's slices before keeping the stage's. */

/* Parameter k of optimizer i in the stage's numbering (its state's
 * "state.<k>.*"): its segment k's, or under ZeRO, whose segments are runs of
 * the shard, the parameter k it was re-targeted from (user_param); NULL past
 * the last. */
static accel_tensor *stage_param(accel_accelerator *acc, int i, int k) {
    if (accel__optimizer_model(acc, i)) return acc->strat->user_param(acc, i, k);
    return accel_optimizer_segment_param(acc->opts[i], k, NULL);
}

/* p's number in the stage's numbering of optimizer i, or -1. */
static int stage_index(accel_accelerator *acc, int i, const accel_tensor *p) {
    accel_tensor *q;
    for (int k = 0; (q = stage_param(acc, i, k)); k++)
        if (q == p) return k;
    return -1;
}

/* The stage that writes p's optimizer state: the one whose part holds it
 * (stage 0 for a tied embedding, which the last stage holds too), by its name
 * in the prepared model it belongs to; stage 0 for a parameter of no
 * prepared model (every stage holds it). */
static int owner_of(accel_accelerator *acc, accel_state_dict *const *sds, const accel_tensor *p) {
    for (int m = 0; m < acc->n_models; m++)
        for (int j = 0; j < sds[m]->n; j++)
            if (sds[m]->entries[j].t == p && !sds[m]->entries[j].is_tied_alias)
                return owner_stage(acc, hooks_of(acc->models[m].m, "accel_accelerator_save_state"),
                                   sds[m]->entries[j].name, acc->models[m].pp_split);
    return 0;
}

/* Keeps the entries of st[0..n) (optimizer i's, this stage's numbering) that
 * this stage writes, renamed to the optimizer's whole numbering, in st[0..k);
 * frees the others. Returns k, or -1 + error (every entry freed). */
static int keep_own(accel_accelerator *acc, int i, int stage, accel_named_state *st, int n) {
    accel_state_dict *sds[ACCEL__MAX_PREPARED] = {0};
    accel_status bad = ACCEL_OK;
    for (int m = 0; m < acc->n_models; m++)
        if (!(sds[m] = accel_module_state_dict(acc->models[m].m))) bad = accel_last_status();
    const accel__pp_opt *po = acc->pp_opt[i];
    int ng = accel_optimizer_num_groups(acc->opts[i]), *sizes = accel__group_sizes(po->groups, po->n, ng);
    if (!sizes) bad = accel_last_status();
    int k = 0;
    for (int j = 0; j < n; j++) {
        const char *rest;
        long seg = accel__parse_indexed(st[j].name, "state.", &rest);
        bool keep = stage == 0; /* "step", "param_groups.*": the same on every stage */
        char *name = NULL;
        if (!bad && seg >= 0) {
            accel_tensor *p = seg < INT_MAX ? stage_param(acc, i, (int)seg) : NULL;
            int g = 0;
            while (g < po->n && po->params[g] != p) g++;
            keep = g < po->n && owner_of(acc, sds, p) == stage;
            if (keep && (name = accel_malloc(strlen(st[j].name) + 16)))
                snprintf(name, strlen(st[j].name) + 16, "state.%d.%s", g, rest);
            else if (keep) bad = accel_last_status();
        }
        int g;
        if (keep && !name && accel__group_size_entry(st[j].name, &g)) /* the stage's count: the whole optimizer's */
            st[j].value = sizes && g < ng ? sizes[g] : 0;
        if (!keep || bad) {
            accel_free(st[j].name);
            accel_tensor_free(st[j].t);
            continue;
        }
        if (name) {
            accel_free(st[j].name);
            st[j].name = name;
        }
        st[k++] = st[j];
    }
    for (int m = 0; m < acc->n_models; m++) accel_state_dict_free(sds[m]);
    accel_free(sizes);
    if (bad) {
        accel_named_state_free(st, k);
        return -1;
    }
    return k;
}

/* Named state on the wire, entry after entry: int64 name length, the name,
 * int64 dtype (-1: a scalar, its double follows), else int64 numel and the
 * tensor's bytes. A message is an int64 entry count and its entries. */
static size_t wire_size(const accel_named_state *e) {
    size_t n = 2 * sizeof(int64_t) + strlen(e->name);
    return n + (e->t ? sizeof(int64_t) + (size_t)accel_numel(e->t) * accel_dtype_size(e->t->dtype) : sizeof(double));
}

static char *put(char *at, const void *src, size_t n) {
    memcpy(at, src, n);
    return at + n;
}

/* The message of st[0..n) (accel_malloc'd, *bytes long), or NULL + error. */
static char *wire_pack(const accel_named_state *st, int n, int64_t *bytes) {
    size_t size = sizeof(int64_t);
    for (int j = 0; j < n; j++) size += wire_size(&st[j]);
    char *msg = accel_malloc(size), *at = msg;
    if (!msg) return NULL;
    at = put(at, &(int64_t){n}, sizeof(int64_t));
    for (int j = 0; j < n; j++) {
        int64_t len = (int64_t)strlen(st[j].name), dt = st[j].t ? (int64_t)st[j].t->dtype : -1;
        at = put(put(put(at, &len, sizeof len), st[j].name, (size_t)len), &dt, sizeof dt);
        if (!st[j].t) {
            at = put(at, &st[j].value, sizeof(double));
            continue;
        }
        int64_t numel = accel_numel(st[j].t);
        at = put(at, &numel, sizeof numel);
        if (accel_tensor_to_host(st[j].t, at) != ACCEL_OK) {
            accel_free(msg);
            return NULL;
        }
        at += (size_t)numel * accel_dtype_size(st[j].t->dtype);
    }
    *bytes = (int64_t)size;
    return msg;
}

/* Reads n bytes at *at into dst, unless the message (ending at end) is shorter. */
static bool take(const char **at, const char *end, void *dst, size_t n) {
    if ((size_t)(end - *at) < n) return false;
    memcpy(dst, *at, n);
    *at += n;
    return true;
}

/* Appends message msg[0..bytes) from stage `from` to out[*n..], room for
 * which the caller made (its count: the message's first int64). */
static accel_status wire_unpack(const char *msg, int64_t bytes, accel_named_state *out, int *n, int from) {
    const char *at = msg + sizeof(int64_t), *end = msg + bytes;
    int64_t count;
    memcpy(&count, msg, sizeof count);
    for (int64_t j = 0; j < count; j++) {
        int64_t len, dt, numel = 1;
        bool ok = take(&at, end, &len, sizeof len) && len >= 0 && len < end - at;
        accel_named_state *e = &out[*n];
        *e = (accel_named_state){0};
        if (ok && (e->name = accel_malloc((size_t)len + 1))) {
            (*n)++;
            ok = take(&at, end, e->name, (size_t)len) && take(&at, end, &dt, sizeof dt);
            e->name[len] = 0;
        } else if (ok) {
            return accel_last_status();
        }
        if (ok && dt < 0) {
            ok = take(&at, end, &e->value, sizeof e->value);
        } else if (ok) {
            ok = dt < ACCEL_DTYPE_COUNT && take(&at, end, &numel, sizeof numel) && numel >= 0 &&
                 (size_t)numel * accel_dtype_size((accel_dtype)dt) <= (size_t)(end - at);
            if (ok && !(e->t = accel_tensor_new((accel_dtype)dt, 1, &numel, ACCEL_CPU_DEVICE)))
                return accel_last_status();
            if (ok && accel_tensor_from_host(e->t, at) != ACCEL_OK) return accel_last_status();
            if (ok) at += (size_t)numel * accel_dtype_size((accel_dtype)dt);
        }
        if (!ok)
            return accel_set_error(ACCEL_ERR_STATE, "accel_accelerator_save_state: pipeline stage %d's optimizer "
                                   "state arrived cut short (entry %lld)", from, (long long)j);
    }
    return ACCEL_OK;
}

int accel__pipeline_optimizer_state(accel_accelerator *acc, int i, accel_named_state **out, float *bufs[2]) {
    *out = NULL;
    bufs[0] = bufs[1] = NULL;
    accel_pg *pg = accel__mesh_group(&acc->mesh, ACCEL__MESH_PP);
    if (!pg) return -1;
    int stage = accel_pg_rank(pg), stages = accel_pg_size(pg);
    accel_named_state *st = NULL;
    /* under ZeRO the stage's state consolidated over its shard group (collective), in the stage's numbering */
    int n = accel__optimizer_model(acc, i) ? acc->strat->optimizer_state(acc, i, &st, bufs)
                                           : accel_optimizer_state(acc->opts[i], &st);
    if (n >= 0 && (n = keep_own(acc, i, stage, st, n)) < 0) st = NULL; /* freed */
    if (stage > 0) { /* this stage's entries to stage 0; a size of -1 says it failed */
        int64_t bytes = -1;
        char *msg = n >= 0 ? wire_pack(st, n, &bytes) : NULL;
        accel_status s = accel_pg_send(pg, &bytes, 1, ACCEL_I64, 0);
        if (!s && msg) s = accel_pg_send(pg, msg, (size_t)bytes, ACCEL_U8, 0);
        accel_free(msg);
        if (n >= 0) accel_named_state_free(st, n);
        accel_free(bufs[0]);
        accel_free(bufs[1]);
        bufs[0] = bufs[1] = NULL;
        return msg && !s ? 0 : -1;
    }
    /* stage 0: every stage's message (each is received, whatever failed, so none waits) */
    char **msgs = accel_calloc((size_t)stages, sizeof *msgs);
    int64_t *sizes = accel_calloc((size_t)stages, sizeof *sizes), total = n;
    accel_status s = n >= 0 && msgs && sizes ? ACCEL_OK : accel_last_status();
    for (int from = 1; from < stages; from++) {
        int64_t bytes = -1;
        accel_status r = accel_pg_recv(pg, &bytes, 1, ACCEL_I64, from);
        if (!r && bytes < (int64_t)sizeof(int64_t))
            r = accel_set_error(ACCEL_ERR_STATE, "accel_accelerator_save_state: pipeline stage %d could not list its "
                                "optimizer state (its error is reported there)", from);
        if (!r && !(msgs && sizes && (msgs[from] = accel_malloc((size_t)bytes)))) r = accel_last_status();
        if (!r) r = accel_pg_recv(pg, msgs[from], (size_t)bytes, ACCEL_U8, from);
        if (!r) {
            int64_t count;
            memcpy(&count, msgs[from], sizeof count);
            sizes[from] = bytes;
            total += count;
        }
        if (!s) s = r;
    }
    accel_named_state *all = s ? NULL : accel_calloc((size_t)(total ? total : 1), sizeof *all);
    if (!s && !all) s = accel_last_status();
    int k = 0;
    if (!s) { /* stage 0's entries, then the others' in stage order */
        memcpy(all, st, (size_t)n * sizeof *st);
        k = n;
        accel_free(st);
        st = NULL;
    }
    for (int from = 1; !s && from < stages; from++) s = wire_unpack(msgs[from], sizes[from], all, &k, from);
    for (int from = 0; msgs && from < stages; from++) accel_free(msgs[from]);
    accel_free(msgs);
    accel_free(sizes);
    if (st) accel_named_state_free(st, n);
    if (s) {
        accel_named_state_free(all, k);
        accel_free(bufs[0]);
        accel_free(bufs[1]);
        bufs[0] = bufs[1] = NULL;
        return -1;
    }
    *out = all;
    return k;
}

/* The optimizer's parameter g of "state.<g>.*" entry e past the last (the
 * optimizer as it was built: every stage's), said; ACCEL_OK otherwise. */
static accel_status state_in_range(const accel__pp_opt *po, const accel_named_state *e) {
    const char *rest;
    if (accel__parse_indexed(e->name, "state.", &rest) >= po->n)
        return accel_set_error(ACCEL_ERR_FORMAT, "accel_accelerator_load_state: optimizer state %s: the "
                               "optimizer has %d parameters", e->name, po->n);
    return ACCEL_OK;
}

accel_status accel__pipeline_check_optimizer(accel_accelerator *acc, int i, int n, const accel_named_state *st) {
    const accel__pp_opt *po = acc->pp_opt[i];
    for (int j = 0; j < n; j++) /* the entries' parameters first, as the optimizer checks them */
        if (state_in_range(po, &st[j])) return accel_last_status();
    return accel__check_group_sizes("accel_accelerator_load_state", n, st, accel_optimizer_num_groups(acc->opts[i]),
                                    po->groups, po->n);
}

accel_status accel__pipeline_load_optimizer(accel_accelerator *acc, int i, int n, const accel_named_state *st) {
    accel_optimizer *opt = acc->opts[i];
    const accel__pp_opt *po = acc->pp_opt[i];
    accel_named_state *mine = accel_calloc((size_t)(n ? n : 1), sizeof *mine); /* names owned, tensors borrowed */
    accel_status s = mine ? accel__pipeline_check_optimizer(acc, i, n, st) : accel_last_status();
    int k = 0;
    for (int j = 0; j < n && !s; j++) {
        const char *rest;
        long g = accel__parse_indexed(st[j].name, "state.", &rest); /* < po->n: checked above */
        size_t len = strlen(st[j].name) + 16;
        /* the groups' parameter counts are the whole optimizer's, checked above: the stage holds its part */
        if (accel__group_size_entry(st[j].name, NULL)) continue;
        if (g >= 0) {
            int seg = stage_index(acc, i, po->params[g]);
            if (seg < 0) continue; /* another stage's parameter */
            if ((mine[k].name = accel_malloc(len))) snprintf(mine[k].name, len, "state.%d.%s", seg, rest);
        } else {
            mine[k].name = accel_strdup(st[j].name);
        }
        if (!mine[k].name) s = accel_last_status();
        mine[k].t = st[j].t;
        mine[k++].value = st[j].value;
    }
    /* under ZeRO into the shard of the stage's state */
    if (!s) s = accel__optimizer_model(acc, i) ? acc->strat->load_optimizer_state(acc, i, k, mine)
                                               : accel_optimizer_load_state(opt, k, mine);
    for (int j = 0; j < k; j++) accel_free(mine[j].name);
    accel_free(mine);
    return s;
}
