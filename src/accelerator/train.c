/* The training step: backward with accumulation and loss scaling, accumulate /
 * no_sync, the prepared optimizer and scheduler (Accelerate's GradientState, AcceleratedOptimizer, AcceleratedScheduler), clipping. */
#include <math.h>

#include "accelerator_internal.h"
#include "strategy.h"
#include "fp8_scaling.h"

accel_status accel_accelerator_backward(accel_accelerator *acc, accel_tensor *loss) {
    if (accel__acc_null(acc, "accel_accelerator_backward")) return accel_last_status();
    if (!loss) return accel_propagate_error(ACCEL_ERR_INVALID_ARG, "accel_accelerator_backward: loss is NULL");
    /* Under pp a stage holds only its layers (the others are on meta): a
     * loss of the model's own forward is no loss of the model, and would
     * train nothing (a meta loss backpropagates without data). */
    if (acc->par.size[ACCEL__MESH_PP] > 1)
        return accel_set_error(ACCEL_ERR_STATE, "accel_accelerator_backward: the accelerator has pipeline parallelism "
                               "(pp_size %d): a stage holds only its layers, so train with "
                               "accel_accelerator_pipeline_step, which runs every micro-batch's forward and backward "
                               "(docs/parallelism.md)", acc->par.size[ACCEL__MESH_PP]);
    accel_tensor *l = loss;
    if (acc->accum_steps > 1) l = accel_mul_scalar(l, 1.0 / acc->accum_steps);
    if (acc->mp == ACCEL_MP_FP16) l = accel_mul_scalar(l, acc->scale);
    if (acc->cp_pg) l = accel_mul_scalar(l, accel__cp_grad_factor(acc));
    if (!l) return accel_last_status();
    accel__backward_begin(acc);
    const bool fp8 = acc->mp == ACCEL_MP_FP8;
    accel__fp8_log *fp8_prev = fp8 ? accel__fp8_log_begin(&acc->fp8_backward) : NULL;
    accel_status st = accel_backward(l);
    if (fp8) accel__fp8_log_end(fp8_prev);
    accel_status st2 = accel__backward_end(acc);
    if (!st && !st2) st2 = accel__tp_after_backward(acc);
    /* fp8: after TE's backward, the gradients' amaxes reduced and their
     * scales updated, for the Linears this backward ran */
    for (int i = 0; !st && !st2 && i < acc->n_models; i++)
        if (acc->models[i].fp8)
            st2 = accel__fp8_reduce_and_update(acc->pg, acc->models[i].fp8, ACCEL__FP8_DY, 1, acc->fp8,
                                               &acc->fp8_backward);
    return st ? st : st2;
}

accel_status accel_accelerator_accumulate(accel_accelerator *acc) {
    if (accel__acc_null(acc, __func__)) return accel_last_status();
    accel_dataloader *dl = accel__active_dataloader(acc);
    if (!acc->o.no_sync_with_dataloader && dl && accel_dataloader_end_of_dataloader(dl)) {
        acc->step = 0;
        acc->sync_gradients = true;
    } else {
        acc->step++;
        acc->sync_gradients = acc->step % acc->accum_steps == 0;
    }
    return ACCEL_OK;
}

/* no_sync is a context (DDP's no_sync): begin and end pair, and nest (sync
 * resumes at the outermost end, as the inner context restores the outer's
 * off). An end without its begin is refused: it returned OK, and an end of
 * an inner context turned the all-reduce back on inside the outer one. */
static accel_status set_no_sync(accel_accelerator *acc, accel_module *model, int delta, const char *fn) {
    accel__model *pm = accel__find_model(acc, model);
    if (!pm) return accel_set_error(ACCEL_ERR_STATE, "%s: the model was not prepared", fn);
    if (pm->no_sync_depth + delta < 0)
        return accel_set_error(ACCEL_ERR_STATE, "%s: the model is not inside no_sync (no no_sync_begin before it)",
                               fn);
    pm->no_sync_depth += delta;
    pm->no_sync = pm->no_sync_depth > 0;
    return ACCEL_OK;
}

accel_status accel_accelerator_no_sync_begin(accel_accelerator *acc, accel_module *model) {
    return set_no_sync(acc, model, 1, __func__);
}

accel_status accel_accelerator_no_sync_end(accel_accelerator *acc, accel_module *model) {
    return set_no_sync(acc, model, -1, __func__);
}

static int find_opt(const accel_accelerator *acc, const accel_optimizer *opt) {
    for (int i = 0; i < acc->n_opts; i++)
        if (acc->opts[i] == opt) return i;
    return -1;
}

/* The inf/nan check of gradients unscaled one after another: found, a 0-dim
 * f32 flag on the device of the gradients being checked, which the kernels
 * set and which is read once per device, not once per gradient (a read
 * waits for the device). */
typedef struct inf_check {
    accel_tensor *found;
    bool inf; /* an inf or nan seen, or a kernel or an allocation failed */
} inf_check;

static void inf_check_read(inf_check *c) {
    if (c->found) c->inf |= accel_item(c->found) != 0.0;
    c->found = NULL;
}

/* g *= inv on its device, an inf or nan of the result noted in c. */
static void unscale(inf_check *c, accel_tensor *g, float inv) {
    if (c->found && !accel_device_eq(c->found->device, g->device)) inf_check_read(c);
    if (!c->found) {
        c->found = accel_empty_on(ACCEL_F32, 0, NULL, g->device);
        if (c->found && accel_fill_(c->found, 0.0)) c->found = NULL;
    }
    accel_k_unscale k = {.g = g, .found = c->found, .inv = inv};
    if (!c->found || ACCEL_KERNEL("accel_accelerator_unscale_gradients", g->device, unscale, &k)) c->inf = true;
}

/* The unscaled state of optimizer i's gradients, and of every other
 * optimizer's that shares them (those of pm, i's ZeRO model: one buffer). */
static void set_unscaled(accel_accelerator *acc, int i, const accel__model *pm, bool unscaled, bool found_inf) {
    for (int j = 0; j < acc->n_opts; j++)
        if (j == i || (pm && accel__optimizer_model(acc, j) == pm))
            acc->scaler_of[j].unscaled = unscaled, acc->scaler_of[j].found_inf = found_inf;
}

/* GradScaler.unscale_(optimizer i): its gradients divided by the scale their
 * backward multiplied them by, once until its step (torch's per-optimizer
 * stage: the unscale or step of another optimizer leaves them alone, where
 * dividing every prepared model's gradients at each optimizer's step divided
 * a GAN's twice); an inf/nan noted for its step. The gradients of an
 * optimizer re-targeted to a ZeRO model are that model's (the shard this
 * rank holds, where the strategy shards them), else its parameters'; the
 * ZeRO model's every optimizer then counts them unscaled, with one inf/nan
 * verdict (an overflow in either half of one flat buffer skips both). A rank
 * that holds only a gradient shard, a tp slice or a pipeline stage's
 * gradients cannot tell alone, so the ranks agree on inf (a stage that
 * stepped while another skipped drifted apart, its loss scale too; Megatron
 * agrees likewise). */
static accel_status unscale_optimizer(accel_accelerator *acc, int i) {
    accel__opt_scaler *sc = &acc->scaler_of[i];
    if (acc->mp != ACCEL_MP_FP16 || sc->unscaled) return ACCEL_OK;
    if (!accel__optimizer_usable(acc->opts[i], "accel_accelerator_unscale_gradients")) return accel_last_status();
    float inv = (float)(1.0 / acc->backward_scale);
    inf_check c = {0};
    bool sharded = false;
    accel__model *pm = accel__optimizer_model(acc, i);
    accel_tensor h;
    if (pm && pm->strat->grad_shard && pm->strat->grad_shard(pm, &h)) {
        sharded = true;
        unscale(&c, &h, inv);
    } else if (pm) {
        for (int d = 0; d < ACCEL_DTYPE_COUNT; d++) {
            accel_flat_buffer *b = &pm->fp->buffers[d];
            if (b->n && b->dtype == ACCEL_F32) unscale(&c, accel__flat_view(&h, b, b->grads, 0, b->numel), inv);
        }
    } else {
        accel_optimizer *opt = acc->opts[i];
        for (int k = 0; k < opt->n_segs; k++) {
            accel_tensor *p, *g;
            accel__seg_tensors(&opt->segs[k], &p, &g);
            if (g && g->dtype == ACCEL_F32 && accel_is_contiguous(g)) unscale(&c, g, inv); /* else the step refuses */
        }
    }
    inf_check_read(&c);
    accel_status st = ACCEL_OK;
    if (sharded || acc->mesh.size[ACCEL__MESH_TP] > 1 || acc->par.size[ACCEL__MESH_PP] > 1) {
        int32_t v = c.inf;
        st = accel_pg_all_reduce(acc->pg, &v, 1, ACCEL_I32, ACCEL_REDUCE_MAX);
        c.inf = st || v != 0; /* a broken group: no step rather than diverge, and say why */
    }
    /* the gradients divided are the model's, all of them, under ZeRO: every optimizer of that model (a
     * module holding a GAN's two halves) takes the verdict, so none divides them again */
    set_unscaled(acc, i, pm, true, c.inf);
    return st;
}

/* Accelerate's unscale_gradients(): every prepared optimizer's gradients.
 * None prepared under fp16 is refused: nothing would be divided, and the
 * caller would read (or step with) gradients 65536 times too large. An
 * optimizer whose model was freed holds none and is passed over. */
static accel_status unscale_all(accel_accelerator *acc, const char *fn) {
    if (acc->mp == ACCEL_MP_FP16 && !acc->n_opts)
        return accel_set_error(ACCEL_ERR_STATE, "%s: fp16 unscales the gradients of the prepared optimizers "
                               "(GradScaler.unscale_(optimizer)), and none was prepared: prepare the optimizer "
                               "that steps them", fn);
    accel_status st = ACCEL_OK;
    for (int i = 0; i < acc->n_opts && !st; i++)
        if (!acc->opts[i]->gone) st = unscale_optimizer(acc, i); /* a freed model's: no gradients left */
    return st;
}

accel_status accel_accelerator_unscale_gradients(accel_accelerator *acc) {
    if (accel__acc_null(acc, __func__)) return accel_last_status();
    return unscale_all(acc, __func__);
}

/* GradScaler.update (torch's _amp_update_scale_) after a step that found_inf
 * or not: the scale is a float32, each product rounded to it, and a growth
 * that would make it inf is not taken (the tracker restarts all the same).
 * A double scale drifted from torch's by its roundings (growth 1.5) and grew
 * past FLT_MAX. */
static void update_scale(accel_accelerator *acc, bool found_inf) {
    if (found_inf) {
        acc->scale = (float)(acc->scale * acc->o.backoff_factor);
        acc->growth_tracker = 0;
    } else if (++acc->growth_tracker >= acc->o.growth_interval) {
        float grown = (float)(acc->scale * acc->o.growth_factor);
        if (isfinite(grown)) acc->scale = grown;
        acc->growth_tracker = 0;
    }
}

/* gradient_clipping (DeepSpeed config): the optimizer's model under ZeRO,
 * else every prepared model. A NaN norm without an error is a model whose
 * overflow skips another optimizer's step (fp16, clip_grad_norm's rule):
 * passed over, the slot cleared first so that only this call's error counts. */
static accel_status clip_for(accel_accelerator *acc, int i) {
    accel__model *om = accel__optimizer_model(acc, i);
    for (int m = 0; m < acc->n_models; m++) {
        accel__model *pm = &acc->models[m];
        if (om && om != pm) continue;
        accel_clear_error();
        if (isnan(accel_accelerator_clip_grad_norm(acc, pm->m, acc->clip, 2.0)) && accel_last_status())
            return accel_last_status();
    }
    return ACCEL_OK;
}

/* The step proper: the shard's update then its all-gather under ZeRO. */
static accel_status step(accel_accelerator *acc, int i) {
    accel_status st = acc->clip > 0 ? clip_for(acc, i) : ACCEL_OK;
    if (!st) st = accel_optimizer_step(acc->opts[i]);
    accel__model *pm = accel__optimizer_model(acc, i);
    if (pm) { /* every rank gathers, even after a local failure, so the collectives stay matched */
        accel_status st2 = pm->strat->after_step(acc, pm);
        if (!st) st = st2;
    }
    return st;
}

accel_status accel_accelerator_optimizer_step(accel_accelerator *acc, accel_optimizer *opt) {
    int i = acc ? find_opt(acc, opt) : -1;
    if (i < 0)
        return accel_set_error(ACCEL_ERR_STATE, "accel_accelerator_optimizer_step: the optimizer was not prepared");
    if (!acc->sync_gradients) return ACCEL_OK;
    accel__opt_scaler *sc = &acc->scaler_of[i];
    if (acc->mp != ACCEL_MP_FP16) {
        sc->skipped = false;
        return step(acc, i);
    }
    /* GradScaler.step then update, as Accelerate's AcceleratedOptimizer.step
     * calls them: a failure (the ranks' agreement on inf, the step) leaves
     * the gradients unscaled and the scale as they were, as torch's
     * exception leaves them, so the retry steps with the gradients as they
     * are (it divided them again, and the scale moved for a step not made) */
    accel_status st = unscale_optimizer(acc, i);
    if (!st && !sc->found_inf) st = step(acc, i);
    if (st) return st;
    sc->skipped = sc->found_inf;
    update_scale(acc, sc->found_inf);
    sc->unscaled = sc->found_inf = false;
    return ACCEL_OK;
}

accel_status accel_accelerator_zero_grad(accel_accelerator *acc, accel_optimizer *opt) {
    int i = acc ? find_opt(acc, opt) : -1;
    if (i < 0) return accel_set_error(ACCEL_ERR_STATE, "accel_accelerator_zero_grad: the optimizer was not prepared");
    if (!acc->sync_gradients) return ACCEL_OK;
    /* Under ZeRO the optimizer sees only its shard: clear the model's whole gradient buffers. */
    accel_status st;
    accel__model *pm = accel__optimizer_model(acc, i);
    if (pm) {
        st = pm->strat->zero_grad(acc, pm);
    } else {
        st = accel_optimizer_zero_grad(opt);
    }
    if (st) return st;
    set_unscaled(acc, i, pm, false, false); /* nothing of them is unscaled now: a ZeRO model's, all its optimizers' */
    return ACCEL_OK;
}

accel_status accel_accelerator_scheduler_step(accel_accelerator *acc, accel_lr_scheduler *s) {
    if (!acc || !s) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_accelerator_scheduler_step: NULL argument");
    bool prepared = false;
    for (int i = 0; i < acc->n_scheds && !prepared; i++) prepared = acc->scheds[i] == s;
    if (!prepared)
        return accel_set_error(ACCEL_ERR_STATE, "accel_accelerator_scheduler_step: the scheduler was not prepared");
    if (!accel__scheduler_alive(s, "accel_accelerator_scheduler_step")) return accel_last_status();
    if (acc->o.no_step_scheduler_with_optimizer) return accel_lr_scheduler_step(s);
    /* AcceleratedScheduler: its own optimizer's skip (any prepared one's when its optimizer is not prepared) */
    int oi = find_opt(acc, accel__scheduler_optimizer(s));
    bool skipped = oi >= 0 ? acc->scaler_of[oi].skipped : accel_accelerator_optimizer_step_was_skipped(acc);
    if (!acc->sync_gradients || skipped) return ACCEL_OK;
    int n = acc->o.split_batches ? 1 : acc->world;
    accel_status st = ACCEL_OK;
    for (int k = 0; k < n && !st; k++) st = accel_lr_scheduler_step(s);
    return st;
}

/* fp16: an unscale since the last step found an inf or nan (an overflow). */
static bool found_inf(const accel_accelerator *acc) {
    for (int i = 0; acc->mp == ACCEL_MP_FP16 && i < acc->n_opts; i++)
        if (acc->scaler_of[i].found_inf) return true;
    return false;
}

double accel_accelerator_clip_grad_norm(accel_accelerator *acc, accel_module *model, double max_norm,
                                        double norm_type) {
    accel__model *pm = acc ? accel__find_model(acc, model) : NULL;
    if (!pm) {
        accel_set_error(ACCEL_ERR_STATE, "accel_accelerator_clip_grad_norm: the model was not prepared");
        return NAN;
    }
    /* The strategies' norm kernels take any p: a p <= 0 gave a made-up norm. */
    if (!accel__check_clip_args("accel_accelerator_clip_grad_norm", max_norm, norm_type)) return NAN;
    if (unscale_all(acc, "accel_accelerator_clip_grad_norm")) return NAN; /* no optimizer, or no agreement on inf */
    double total;
    if (pm->strat->clip(acc, pm, max_norm, norm_type, &total) != ACCEL_OK) return NAN;
    /* A NaN gradient: the norm is NaN on every rank and nothing was clipped.
     * Under fp16 an overflow step (inf/nan found) is skipped, as torch's
     * GradScaler skips it: no error; otherwise the NaN says the training is
     * broken, and the NaN return is an error as everywhere in the library. */
    if (isnan(total) && !found_inf(acc))
        return accel__nan_norm_error("accel_accelerator_clip_grad_norm");
    return total;
}
