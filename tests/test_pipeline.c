/* Pipeline parallelism (accel_accelerator_pipeline_step).
 *
 * `test_pipeline PP DP SCHEDULE TIED ACCUM FIRST TP SP VIRT ZERO` under `accel launch`
 * (PP x DP x TP processes; tests/pipeline.cmake): a 4-layer tiny Llama, split into
 * PP stages, DP data-parallel replicas of each (DDP over the stage's replicas,
 * or with ZERO 1 or 2 ZeRO-1 / ZeRO-2 over them as dp_shard: the stage's
 * optimizer state, and gradients under ZeRO-2, sharded over its DP ranks),
 * each stage tensor-parallel over TP ranks when TP > 1 (the decoder's plan,
 * applied at prepare, with the optimizer made before it: a rank's gradients
 * are compared with its slices of the single process's), with Megatron's
 * sequence parallelism when SP is 1,
 * 4 micro-batches, ACCUM batches accumulated per optimizer step (the
 * accelerator's gradient_accumulation_steps), FIRST layers on stage 0 when
 * not 0 (accel_accelerator_pipeline_set_layers; else the balanced split),
 * trained 5 SGD steps with the
 * gradients clipped at 0.5; every rank also trains the same model
 * alone on the whole batch (all replicas' rows). Each step the loss (this
 * replica's rows) and every gradient of the stage's own parameters must equal
 * the single process's within 1e-5 (under ZeRO-2, whose reduce-scatter
 * leaves no whole gradient, the parameters after each step instead), the
 * other stages' parameters must have no gradient, the clipped global norm
 * (max 0.5) must be the single process's, and the weights after each step
 * must agree; under ZeRO a rank's optimizer state is its shard of the stage's
 * (padded / DP elements), and ZeRO-3 is refused at prepare; the accelerator's calls
 * of the steps after the first must make no allocation (a counting
 * allocator). At pp = 2 the ranks are first given different splits (3 + 1
 * and 1 + 3 layers, then one that fails on stage 1 only): prepare must fail
 * on every rank, naming them. With SCHEDULE interleaved, VIRT chunks per
 * stage (Megatron's virtual stages) of a model of PP x VIRT layers, 8
 * micro-batches at PP = 4; an explicit split and a model of one layer more
 * are refused. With three more fields CP STRATEGY FAMILY (PP x DP x CP x TP
 * processes), each stage's sequence is split over CP ranks (context
 * parallelism: STRATEGY allgather or alltoall as cp_comm_strategy, sp as
 * Ulysses' sp_size; the replicas then dp_shard ranks, DDP or ZeRO over
 * dp_shard x cp), the ranks of a cp group given the same rows, for FAMILY
 * llama, gemma2, gemma3_text, starcoder2 (pipeline_model.h: their windows bite at T = 12), phi,
 * gpt_neox or stablelm (CP 1: pipeline parallelism alone): the same
 * checks against one process, the held bytes a cp rank's T / CP positions',
 * and a sequence that 2 CP does not divide refused by name. Prints "pipeline
 * pp=.. dp=.. tp=.. sp=.. <schedule> accum=.. zero=.. cp=.. <strategy>
 * <family> ok" on rank 0.
 *
 * Run plainly (ctest's pipeline): one process - the stage split (balanced by
 * parameter count, explicit, refused), pp = 1 with micro-batches equal to a
 * plain step, the refusals of pipeline_step, the interleaved plan and the
 * refusals of its options. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "accel/accel.h"
#include "accelerator/pipeline_schedule.h"
#include "check.h"
#include "count_alloc.h"
#include "nn/decoder_pipeline.h"
#include "pipeline_model.h"
#include "tp_fixture.h"

#define LAYERS 4
#define T 12
#define ROWS 16 /* per replica: 4 micro-batches of 4 rows */
#define STEPS 5

static const char *g_family; /* pipeline_model's family: NULL (Llama), "gemma2", "gemma3_text", "phi", "gpt_neox",
                               * "stablelm" or "starcoder2" */

static accel_module *tiny_of(bool tied, int64_t vocab, int64_t hidden, int layers) {
    return pipeline_llama((pipeline_model){.seed = 7, .vocab = vocab, .hidden = hidden, .ffn = 2 * hidden,
                                           .positions = 32, .layers = layers, .heads = 4, .kv_heads = 2,
                                           .tied = tied, .family = g_family});
}

static accel_module *tiny(bool tied, int64_t vocab, int64_t hidden) { return tiny_of(tied, vocab, hidden, LAYERS); }

static accel_optimizer *sgd(accel_module *m) {
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_SGD, 0.1);
    h.momentum = 0.9;
    return accel_optimizer_new_module(ACCEL_OPTIM_SGD, m, &h);
}

/* Rows [row0, row0 + rows) of step s's batch. */
static accel_tensor *batch(int s, int row0, int rows) { return pipeline_batch(s, row0, rows, T, 40); }

/* Whether parameter `name` is the stage's: layers [first_layer, end_layer),
 * and under interleaved 1F1B those of its chunks after the first, stages x
 * the chunk's layers apart. */
static bool owned(const char *name, const accel_pipeline_report *rep, bool tied) {
    int layer, period = rep->stages * (rep->end_layer - rep->first_layer);
    bool is_layer = sscanf(name, "model.layers.%d.", &layer) == 1 || sscanf(name, "gpt_neox.layers.%d.", &layer) == 1;
    if (is_layer && rep->virtual_stages == 1) return layer >= rep->first_layer && layer < rep->end_layer;
    if (is_layer)
        return layer / period < rep->virtual_stages && layer % period >= rep->first_layer &&
               layer % period < rep->end_layer;
    bool first = rep->stage == 0, last = rep->stage == rep->stages - 1;
    if (!strcmp(name, "model.embed_tokens.weight") || !strcmp(name, "gpt_neox.embed_in.weight"))
        return first || (tied && last);
    return last; /* model.norm.weight, lm_head.weight (GPT-NeoX's final_layer_norm, embed_out) */
}

static double max_abs_diff(const accel_tensor *a, const accel_tensor *b) {
    int64_t n = accel_numel(a);
    float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
    accel_tensor_to_host(a, x);
    accel_tensor_to_host(b, y);
    double d = 0;
    for (int64_t i = 0; i < n; i++) d = fmax(d, fabs((double)x[i] - y[i]));
    free(x);
    free(y);
    return d;
}

static bool all_zero(const accel_tensor *g) {
    if (!g) return true;
    int64_t n = accel_numel(g);
    float *x = malloc((size_t)n * sizeof *x);
    accel_tensor_to_host(g, x);
    bool z = true;
    for (int64_t i = 0; i < n; i++) z = z && x[i] == 0;
    free(x);
    return z;
}

/* ---------------------------------------------------------------- several processes */

/* max_abs_diff of a against its part (tp_part) of the reference's whole b. */
static double part_diff(const accel_state_entry *e, const accel_tensor *a, accel_tensor *b) {
    accel_tensor *want = accel_contiguous(tp_part(e->owner, e->t, b));
    CHECK_MSG(want && accel_same_shape(a, want), "%s: not the shape of the reference's part", e->name);
    return want && accel_same_shape(a, want) ? max_abs_diff(a, want) : INFINITY;
}

/* Floats of optimizer state this rank holds. */
static int64_t state_floats(accel_optimizer *o) {
    accel_named_state *st;
    int n = accel_optimizer_state(o, &st);
    int64_t f = 0;
    for (int i = 0; i < n; i++)
        if (st[i].t) f += accel_numel(st[i].t);
    accel_named_state_free(st, n);
    return f;
}

static int run_mesh(int pp, int dp, const char *sched, bool tied, int accum, int first_stage_layers, int tp,
                    bool sp, int virt, int zero, int cp, const char *cp_strategy) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.parallelism.pp_size = pp;
    if (cp > 1 && !strcmp(cp_strategy, "sp")) { /* Ulysses: sp_size, cp with the all-to-all exchange */
        o.parallelism.sp_size = cp;
    } else if (cp > 1) {
        o.parallelism.cp_size = cp;
        o.parallelism.cp_comm_strategy = cp_strategy;
    }
    if (zero || cp > 1) { /* ZeRO shards over each stage's replicas: dp_shard (x cp); cp composes with dp_shard */
        o.zero_stage = zero ? zero : -1;
        o.parallelism.dp_replicate_size = 1;
        o.parallelism.dp_shard_size = dp;
    } else {
        o.parallelism.dp_replicate_size = dp; /* DDP over each stage's replicas */
    }
    o.parallelism.tp_size = tp;
    o.parallelism.sequence_parallelism = sp ? ACCEL_TRUE : 0;
    /* interleaved at pp 4: 8 micro-batches, past Megatron's all-forwards-first m = pp */
    int micro = virt > 1 && pp == 4 ? 8 : 4;
    o.parallelism.num_micro_batches = micro;
    o.parallelism.pp_schedule = sched;
    o.parallelism.pp_virtual_stages = virt;
    o.gradient_accumulation_steps = accum;
    accel_accelerator *acc = accel_accelerator_new(&o);
    if (!acc) {
        fprintf(stderr, "accelerator: %s\n", accel_last_error());
        return 2;
    }
    /* ranks: pp-major, then dp, cp, tp; the ranks of a cp group share the replica's batch */
    int rank = accel_accelerator_process_index(acc), replica = rank / (tp * cp) % dp, cp_rank = rank / tp % cp;
    /* interleaved: a layer per chunk */
    int layers = virt > 1 ? pp * virt : LAYERS;
    accel_module *model = tiny_of(tied, 40, 32, layers), *ref = tiny_of(tied, 40, 32, layers);
    /* made over the whole model: prepare re-targets it to the stage's parameters (tp: their slices) */
    accel_optimizer *opt = sgd(model), *ref_opt = sgd(ref);
    if (virt > 1) { /* equal chunks only: no explicit split, and the layers must fill pp x virt chunks */
        CHECK(accel_accelerator_pipeline_set_layers(acc, 1, 0) == ACCEL_ERR_UNSUPPORTED);
        CHECK_STR_CONTAINS(accel_last_error(), "an explicit first or last stage is not built with it");
        accel_module *odd = tiny_of(tied, 40, 32, layers + 1);
        CHECK(accel_accelerator_prepare(acc, odd) == ACCEL_ERR_INVALID_ARG);
        char why[160];
        snprintf(why, sizeof why, "interleaved 1F1B cuts the model's %d layers into pp_size %d x pp_virtual_stages "
                 "%d = %d chunks", layers + 1, pp, virt, layers);
        CHECK_STR_CONTAINS(accel_last_error(), why);
        accel_module_free(odd);
    } else if (pp == 2) { /* each rank sets its own split: prepare compares them, failing on every rank when they differ */
        int stage = rank / (dp * cp * tp);
        CHECK(accel_accelerator_pipeline_set_layers(acc, stage == 0 ? 3 : 1, 0) == ACCEL_OK);
        CHECK(accel_accelerator_prepare(acc, model, opt) == ACCEL_ERR_INVALID_ARG);
        CHECK_STR_CONTAINS(accel_last_error(), "rank 0 (stage 0) as 3 + 1");
        CHECK_STR_CONTAINS(accel_last_error(), "(stage 1) as 1 + 3");
        /* a rank whose own split fails (5 of 4 layers on stage 0) fails the others too, naming it */
        CHECK(accel_accelerator_pipeline_set_layers(acc, stage == 0 ? 0 : 5, 0) == ACCEL_OK);
        CHECK(accel_accelerator_prepare(acc, model, opt) == ACCEL_ERR_INVALID_ARG);
        CHECK_STR_CONTAINS(accel_last_error(), stage == 0 ? "(pipeline stage 1) could not split" : "leave -1 for 1");
    }
    if (pp == 4 && virt == 1) { /* 2 + 2 of the 4 layers on the ends leave none for the 2 middle stages: refused on every rank */
        CHECK(accel_accelerator_pipeline_set_layers(acc, 2, 2) == ACCEL_OK);
        CHECK(accel_accelerator_prepare(acc, model, opt) == ACCEL_ERR_INVALID_ARG);
        CHECK_STR_CONTAINS(accel_last_error(), "leave 0 for 2 other stages");
    }
    CHECK(accel_accelerator_pipeline_set_layers(acc, first_stage_layers, 0) == ACCEL_OK);
    CHECK_MSG(accel_accelerator_prepare(acc, model, opt) == ACCEL_OK, "%s", accel_last_error());
    /* the split is fixed at prepare: the stage kept only its part */
    CHECK(accel_accelerator_pipeline_set_layers(acc, 1, 0) == ACCEL_ERR_STATE);
    accel_state_dict *sd = accel_module_state_dict(model), *ref_sd = accel_module_state_dict(ref);
    CHECK(sd->n == ref_sd->n);
    accel_pipeline_report rep = {0};
    /* the model's own forward and accel_accelerator_backward: refused, naming pipeline_step (a
     * stage's loss of its own forward runs on the other stages' meta layers and trains nothing) */
    CHECK(accel_accelerator_backward(acc, accel_full(ACCEL_F32, 1, (int64_t[]){1}, 1.0)) == ACCEL_ERR_STATE);
    CHECK_STR_CONTAINS(accel_last_error(), "train with accel_accelerator_pipeline_step");
    if (sp || cp > 1) { /* positions the tp or cp ranks cannot share: refused on every rank, before any exchange
                         * (at cp 2 x tp 2 a multiple of 2 cp leaves the tp ranks an even share: only cp's refusal) */
        double l;
        int bad = cp > 1 ? T - 2 : T - 1;
        CHECK(accel_accelerator_pipeline_step(acc, model, accel_slice(batch(0, 0, ROWS), 1, 0, bad, 1), &l, NULL) ==
              ACCEL_ERR_SHAPE);
        char why[128];
        if (cp > 1)
            snprintf(why, sizeof why, "splits the %d positions of ids into 2*cp = %d equal chunks", bad, 2 * cp);
        else
            snprintf(why, sizeof why, "the %d positions of ids over the %d ranks of the tp group", bad, tp);
        CHECK_STR_CONTAINS(accel_last_error(), why);
    }
    double worst = 0, first_norm = 0;
    /* allocations in the accelerator's calls of the steps after the first (which grows the step arena and
     * makes the gradients): none, the pipeline's buffers in the arena (the one process's calls not counted) */
    long steady = 0, mark;
    for (int s = 0; s < STEPS; s++) {
        for (int a = 0; a < accum; a++) { /* accumulation: one batch per micro-step, averaged */
            int b = s * accum + a;
            double loss = 0;
            accel_tensor *ids = batch(b, replica * ROWS, ROWS);
            mark = n_allocs;
            CHECK(accel_accelerator_accumulate(acc) == ACCEL_OK);
            CHECK(accel_accelerator_pipeline_step(acc, model, ids, &loss, &rep) == ACCEL_OK);
            if (s > 0) steady += n_allocs - mark;
            /* one process: the replica's loss, and the gradients of the mean over every replica's rows */
            bool was = accel_set_grad_enabled(false);
            double ref_loss = accel_item(accel_llama_loss(ref, batch(b, replica * ROWS, ROWS)));
            accel_set_grad_enabled(was);
            CHECK(accel_backward(accel_mul_scalar(accel_llama_loss(ref, batch(b, 0, dp * ROWS)), 1.0 / accum)) ==
                  ACCEL_OK);
            CHECK_MSG(fabs(loss - ref_loss) <= 1e-5, "rank %d batch %d: loss %.9g, one process %.9g", rank, b, loss,
                      ref_loss);
        }
        for (int i = 0; i < sd->n; i++) {
            accel_state_entry *e = &sd->entries[i];
            const char *name = e->name;
            if (e->is_buffer || e->is_tied_alias) continue;
            if (owned(name, &rep, tied) && zero < 2) {
                double d = part_diff(e, e->t->grad, ref_sd->entries[i].t->grad);
                worst = fmax(worst, d);
                CHECK_MSG(d <= 1e-5, "rank %d (stage %d) step %d: %s's gradient differs by %.3g", rank, rep.stage,
                          s, name, d);
            } else if (!owned(name, &rep, tied)) {
                CHECK_MSG(all_zero(e->t->grad), "rank %d (stage %d): %s (another stage's) has a gradient",
                          rank, rep.stage, name);
            }
        }
        /* the global norm over every stage's gradients (the tied embedding's once), then clipped alike */
        accel_tensor **rp = NULL;
        int rn = accel_module_parameters(ref, &rp);
        mark = n_allocs;
        double norm = accel_accelerator_clip_grad_norm(acc, model, 0.5, 2.0);
        if (s > 0) steady += n_allocs - mark;
        double ref_norm = accel_clip_grad_norm(rn, rp, 0.5, 2.0);
        free(rp);
        if (s == 0) first_norm = norm;
        CHECK_MSG(fabs(norm - ref_norm) <= 1e-5 * ref_norm, "rank %d step %d: gradient norm %.9g, one process %.9g",
                  rank, s, norm, ref_norm);
        mark = n_allocs;
        CHECK(accel_accelerator_optimizer_step(acc, opt) == ACCEL_OK);
        CHECK(accel_accelerator_zero_grad(acc, opt) == ACCEL_OK);
        if (s > 0) steady += n_allocs - mark;
        CHECK(accel_optimizer_step(ref_opt) == ACCEL_OK);
        accel_optimizer_zero_grad(ref_opt);
        accel_step_reset();
        /* the stage's weights after the step (under ZeRO its shards' updates, all-gathered over the stage's ranks) */
        for (int i = 0; i < sd->n; i++) {
            accel_state_entry *e = &sd->entries[i];
            if (!e->is_buffer && !e->is_tied_alias && owned(e->name, &rep, tied))
                CHECK_MSG(part_diff(e, e->t, ref_sd->entries[i].t) <= 1e-5, "rank %d: %s after step %d", rank,
                          e->name, s);
        }
    }
    CHECK(n_allocs > 0); /* the counting allocator is the library's */
    CHECK_MSG(steady == 0, "rank %d stage %d: %ld allocations in steps 2 to %d", rank, rep.stage, steady, STEPS);
    { /* memory divided: this stage's parameters (hence its gradients) and optimizer state only */
        int64_t held = 0, own = 0, all = 0, in_opt = 0;
        for (int i = 0; i < sd->n; i++) {
            accel_state_entry *e = &sd->entries[i];
            if (e->is_buffer || e->is_tied_alias) continue;
            all += accel_numel(e->t);
            if (owned(e->name, &rep, tied)) own += accel_numel(e->t);
            if (e->t->device.type != ACCEL_DEV_META) held += accel_numel(e->t);
        }
        int64_t lo, hi, padded, mine = state_floats(opt); /* SGD: a momentum float per element of its part */
        CHECK(accel_accelerator_zero_shard(acc, model, &lo, &hi, &padded) == ACCEL_OK);
        if (zero) { /* the optimizer steps the rank's shard, padded / (dp cp) elements of the stage's part */
            in_opt = own;
            int64_t tensors = 0;
            for (int i = 0; i < sd->n; i++)
                tensors += !sd->entries[i].is_buffer && !sd->entries[i].is_tied_alias && owned(sd->entries[i].name,
                                                                                               &rep, tied);
            /* the part aligned to 16 elements a tensor, padded to 16 x world */
            int shards = dp * cp, shard = replica * cp + cp_rank; /* ZeRO shards over dp_shard x cp */
            CHECK_MSG(hi - lo == padded / shards && lo == shard * (padded / shards) && mine <= hi - lo &&
                      padded >= own && padded < own + 16 * (tensors + pp * dp * cp * tp),
                      "rank %d stage %d: shard [%lld, %lld) of %lld, %lld state floats, its part %lld", rank,
                      rep.stage, (long long)lo, (long long)hi, (long long)padded, (long long)mine, (long long)own);
        } else {
            for (int i = 0; i < accel_optimizer_num_segments(opt); i++)
                in_opt += accel_numel(accel_optimizer_segment_param(opt, i, NULL));
            CHECK(mine == own);
        }
        CHECK_MSG(held == own && in_opt == own && (pp == 1 || own < all),
                  "rank %d stage %d: %lld parameters held, %lld in the optimizer, %lld its part's, %lld in all",
                  rank, rep.stage, (long long)held, (long long)in_opt, (long long)own, (long long)all);
        fprintf(stderr, "rank %d stage %d: parameters + gradients %lld bytes, SGD momentum %lld, %.3f and %.3f of "
                "one process's %lld each\n", rank, rep.stage, (long long)(2 * 4 * own), (long long)(4 * mine),
                (double)own / (double)all, (double)mine / (double)all, (long long)(4 * all));
    }
    /* save_model gathers every stage's layers: rank 0's checkpoint is the whole trained model */
    char dir[256];
    snprintf(dir, sizeof dir, "%s/accel_pipeline_%d_%s_%d_%d", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
             (int)getppid(), sched, pp, dp);
    CHECK(accel_accelerator_save_model(acc, model, dir, NULL) == ACCEL_OK);
    for (int i = 0; i < sd->n; i++) /* and the other stages' parameters went again */
        if (!sd->entries[i].is_buffer && !sd->entries[i].is_tied_alias)
            CHECK_MSG((sd->entries[i].t->device.type == ACCEL_DEV_META) != owned(sd->entries[i].name, &rep, tied),
                      "rank %d: %s after save_model", rank, sd->entries[i].name);
    if (rank == 0) {
        accel_dispatched *disp = NULL;
        accel_module *back = accel_llama_from_pretrained(dir, NULL, NULL, NULL, NULL, &disp);
        CHECK_MSG(back != NULL, "%s", accel_last_error());
        accel_state_dict *bsd = back ? accel_module_state_dict(back) : NULL;
        for (int i = 0; bsd && i < bsd->n && i < ref_sd->n; i++)
            if (!ref_sd->entries[i].is_buffer && !ref_sd->entries[i].is_tied_alias)
                CHECK_MSG(max_abs_diff(bsd->entries[i].t, ref_sd->entries[i].t) <= 1e-5, "saved %s differs",
                          ref_sd->entries[i].name);
        accel_state_dict_free(bsd);
        accel_dispatched_free(disp);
        accel_module_free(back);
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        CHECK(system(cmd) == 0);
    }
    CHECK(rep.stages == pp && rep.micro_batches == micro && rep.virtual_stages == virt);
    if (first_stage_layers) /* Megatron's explicit first stage; the others share the rest */
        CHECK_MSG(rep.stage == 0 ? rep.end_layer == first_stage_layers
                                 : rep.end_layer - rep.first_layer == (LAYERS - first_stage_layers) / (pp - 1),
                  "stage %d: layers [%d, %d) with %d on the first stage", rep.stage, rep.first_layer, rep.end_layer,
                  first_stage_layers);
    /* 1F1B holds at most pp - stage micro-batches' inputs, GPipe all of them; interleaved 1F1B Megatron's
     * warm-up + 1 (chunk, micro-batch) pairs: (pp - stage - 1) 2 + (virt - 1) pp + 1, at most micro x virt */
    int interleaved_want = (pp - rep.stage - 1) * 2 + (virt - 1) * pp + 1;
    int want = virt > 1 ? (interleaved_want < micro * virt ? interleaved_want : micro * virt)
               : !strcmp(sched, "gpipe") ? 4 : (pp - rep.stage < 4 ? pp - rep.stage : 4);
    CHECK_MSG(rep.peak_in_flight == want, "rank %d stage %d: %d micro-batches in flight, not %d", rank, rep.stage,
              rep.peak_in_flight, want);
    /* each held input is a micro-batch's hidden states [ROWS / micro, T, 32]: a tp rank's T / tp positions under
     * sequence parallelism. Interleaved: the plan's slots (check_plan bounds them) */
    accel__pp_plan plan = {0};
    CHECK(virt == 1 || accel__pp_interleaved_plan(pp, virt, micro, rep.stage, &plan) == ACCEL_OK);
    size_t held_bytes = (size_t)(virt > 1 ? plan.slots : rep.stage ? want : 0) * (ROWS / micro) *
                        (T / cp / (sp ? tp : 1)) * 32 * sizeof(float);
    CHECK_MSG(rep.peak_held_bytes == held_bytes, "rank %d stage %d: %zu bytes held, not %zu", rank, rep.stage,
              rep.peak_held_bytes, held_bytes);
    fprintf(stderr, "rank %d stage %d layers [%d, %d): largest gradient difference %.3g, in flight %d, first "
            "norm %.4g\n", rank, rep.stage, rep.first_layer, rep.end_layer, worst, rep.peak_in_flight, first_norm);
    accel_state_dict_free(sd);
    accel_state_dict_free(ref_sd);
    accel_optimizer_free(opt);
    accel_optimizer_free(ref_opt);
    accel_accelerator_free(acc);
    accel_module_free(model);
    accel_module_free(ref);
    if (zero == 2 && !strcmp(sched, "1f1b")) { /* ZeRO-3 is refused at prepare, on every rank, saying why */
        o.zero_stage = 3;
        accel_accelerator *z3 = accel_accelerator_new(&o);
        accel_module *m3 = tiny(tied, 40, 32);
        CHECK_MSG(z3 && accel_accelerator_prepare(z3, m3) == ACCEL_ERR_UNSUPPORTED, "%s", accel_last_error());
        CHECK_STR_CONTAINS(accel_last_error(), "ZeRO stage 3 is not built with pipeline parallelism (pp_size 2: its "
                           "parameters are gathered and its gradients reduce-scattered unit by unit");
        accel_accelerator_free(z3);
        accel_module_free(m3);
    }
    if (rank == 0 && !check_failures_)
        printf("pipeline pp=%d dp=%d tp=%d sp=%d %s accum=%d zero=%d cp=%d %s %s ok\n", pp, dp, tp, sp, sched, accum,
               zero, cp, cp_strategy, g_family ? g_family : "llama");
    return check_summary();
}

/* ---------------------------------------------------------------- one process */

static void test_split(void) {
    int first[5];
    /* vocab 512 x hidden 32: the tied embedding (16 K) outweighs a layer (~10 K) */
    accel_module *tied = tiny(true, 512, 32), *untied = tiny(false, 512, 32);
    CHECK(accel__decoder_stage_split(tied, 2, NULL, first, "t") == ACCEL_OK);
    CHECK_MSG(first[0] == 0 && first[1] == 1 && first[2] == 4, "tied: stage 1 from layer %d", first[1]);
    CHECK(accel__decoder_stage_split(untied, 2, NULL, first, "t") == ACCEL_OK);
    CHECK_MSG(first[1] == 2 && first[2] == 4, "untied: stage 1 from layer %d", first[1]);
    CHECK(accel__decoder_stage_split(untied, 4, NULL, first, "t") == ACCEL_OK);
    CHECK(first[1] == 1 && first[2] == 2 && first[3] == 3 && first[4] == 4);
    CHECK(accel__decoder_stage_split(untied, 2, (int[]){3, 1}, first, "t") == ACCEL_OK && first[1] == 3);
    CHECK(accel__decoder_stage_split(untied, 2, (int[]){3, 2}, first, "t") == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "do not add up to the model's 4 layers");
    CHECK(accel__decoder_stage_split(untied, 2, (int[]){4, 0}, first, "t") == ACCEL_ERR_INVALID_ARG);
    CHECK(accel__decoder_stage_split(untied, 5, NULL, first, "t") == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "5 pipeline stages for a model of 4 layers");
    accel_module_free(tied);
    accel_module_free(untied);
}

/* The interleaved plan (pipeline_schedule.h) for p ranks x v chunks x m
 * micro-batches: each rank forwards and backwards every (chunk, micro-batch)
 * once, a backward after its forward, within Megatron's in-flight bound;
 * every op's input slot is set where it receives one; at most two slots per
 * pair in flight (its input and its gradient), as many whatever m beyond 2 p
 * (slots_2p: rank r's at m = 2 p, 0: not known yet); and what a rank sends
 * after a tick is what its neighbour expects then (the same tick count on
 * every rank). */
static void check_plan(int p, int v, int m, int *slots_2p) {
    accel__pp_plan plan[8];
    for (int r = 0; r < p; r++) {
        CHECK_MSG(accel__pp_interleaved_plan(p, v, m, r, &plan[r]) == ACCEL_OK, "%s", accel_last_error());
        CHECK(plan[r].n_ops == 2 * m * v && plan[r].n_ticks == plan[0].n_ticks);
        int seen[2][4 * 16] = {{0}};
        for (int k = 0; k < plan[r].n_ops; k++) {
            const accel__pp_op *o = &plan[r].ops[k];
            int at = o->chunk * m + o->micro, c = o->chunk * p + r;
            CHECK(o->backward ? seen[0][at] == 1 : seen[0][at] == 0);
            seen[o->backward][at]++;
            CHECK((c == 0) == (o->in_slot < 0) && o->in_slot < plan[r].slots);
            CHECK((o->backward && c < p * v - 1) == (o->grad_slot >= 0) && o->grad_slot < plan[r].slots);
        }
        for (int at = 0; at < v * m; at++) CHECK(seen[0][at] == 1 && seen[1][at] == 1);
        CHECK_MSG(plan[r].peak_in_flight == accel__pp_interleaved_in_flight(p, v, m, r) &&
                  plan[r].peak_in_flight <= m * v, "p %d v %d m %d rank %d: %d in flight", p, v, m, r,
                  plan[r].peak_in_flight);
        CHECK_MSG(plan[r].slots <= 2 * plan[r].peak_in_flight, "p %d v %d m %d rank %d: %d slots for %d in flight",
                  p, v, m, r, plan[r].slots, plan[r].peak_in_flight);
        if (m == 2 * p) slots_2p[r] = plan[r].slots;
        CHECK_MSG(m <= 2 * p || plan[r].slots == slots_2p[r], "p %d v %d m %d rank %d: %d slots, %d at m = %d", p, v,
                  m, r, plan[r].slots, slots_2p[r], 2 * p);
    }
    for (int r = 0; r < p; r++)
        for (int t = 0; t < plan[r].n_ticks; t++) {
            int next = (r + 1) % p, prev = (r + p - 1) % p;
            CHECK_MSG((plan[r].sends[t] == 0) == (plan[next].hidden_in[t] >= 0),
                      "p %d v %d m %d: rank %d's hidden state after tick %d", p, v, m, r, t);
            CHECK_MSG((plan[r].sends[t] == 1) == (plan[prev].grad_in[t] >= 0),
                      "p %d v %d m %d: rank %d's gradient after tick %d", p, v, m, r, t);
        }
    for (int r = 0; r < p; r++) { /* every forward but the last chunk's sends once, every backward but chunk 0's */
        int hidden = 0, grads = 0;
        for (int t = 0; t < plan[r].n_ticks; t++) hidden += plan[r].sends[t] == 0, grads += plan[r].sends[t] == 1;
        CHECK_MSG(hidden == m * v - (r == p - 1 ? m : 0) && grads == m * v - (r == 0 ? m : 0),
                  "p %d v %d m %d rank %d: %d hidden states and %d gradients sent", p, v, m, r, hidden, grads);
    }
    accel_step_reset();
}

static void test_interleaved_plan(void) {
    for (int p = 2; p <= 4; p++)
        for (int v = 2; v <= 4; v++) {
            int slots_2p[4] = {0};
            for (int m = p; m <= 4 * p; m += p) check_plan(p, v, m, slots_2p);
        }
    /* Megatron's bound: rank 0 of 2 x 2 chunks x 4 micro-batches warms up with (2 - 1) 2 + (2 - 1) 2 = 4
     * forwards, then a fifth before its first backward; with m = p every forward comes first */
    CHECK(accel__pp_interleaved_in_flight(2, 2, 4, 0) == 5 && accel__pp_interleaved_in_flight(2, 2, 4, 1) == 3);
    CHECK(accel__pp_interleaved_in_flight(2, 2, 2, 1) == 4);
    accel__pp_plan plan;
    CHECK(accel__pp_interleaved_plan(2, 2, 3, 0, &plan) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "micro-batches a multiple of the ranks");
}

/* The interleaved schedule's options, refused naming the field. */
static void test_interleaved_refusals(void) {
    struct { accel_parallelism_opts p; const char *why; } bad[] = {
        {{.pp_schedule = "interleaved", .num_micro_batches = 4}, "needs pp_size >= 2 and pp_virtual_stages >= 2"},
        {{.pp_virtual_stages = 2, .pp_schedule = "1f1b"}, "pp_virtual_stages = 2 with pp_schedule \"1f1b\""},
        {{.pp_size = 2, .pp_virtual_stages = 2, .num_micro_batches = 3}, "num_micro_batches = 3 is not a multiple of"},
        {{.pp_size = 2, .pp_virtual_stages = -1}, "pp_virtual_stages must be >= 1"},
        {{.pp_schedule = "zb"}, "is not \"1f1b\", \"gpipe\" or \"interleaved\""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        accel_accelerator_opts o = accel_accelerator_opts_default();
        o.parallelism = bad[i].p;
        CHECK(accel_accelerator_new(&o) == NULL);
        CHECK_STR_CONTAINS(accel_last_error(), bad[i].why);
    }
}

/* pp = 1, 4 micro-batches: the gradients of one plain step over the batch. */
static void test_one_stage_micro_batches(void) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.parallelism.num_micro_batches = 4;
    accel_accelerator *acc = accel_accelerator_new(&o);
    CHECK(acc != NULL);
    accel_module *model = tiny(true, 40, 32), *ref = tiny(true, 40, 32);
    accel_optimizer *opt = sgd(model);
    /* no pipeline: an explicit split would be ignored unseen, so it is refused; none given is taken */
    CHECK(accel_accelerator_pipeline_set_layers(acc, 1, 0) == ACCEL_ERR_STATE);
    CHECK_STR_CONTAINS(accel_last_error(), "pp_size is 1: there is no pipeline");
    accel_clear_error();
    CHECK(accel_accelerator_pipeline_set_layers(acc, 0, 2) == ACCEL_ERR_STATE);
    accel_clear_error();
    CHECK(accel_accelerator_pipeline_set_layers(acc, 0, 0) == ACCEL_OK);
    CHECK(accel_accelerator_prepare(acc, model, opt) == ACCEL_OK);
    double loss = 0;
    accel_pipeline_report rep;
    accel_status st = accel_accelerator_pipeline_step(acc, model, batch(0, 0, ROWS), &loss, &rep);
    CHECK_MSG(st == ACCEL_OK, "%s", accel_last_error());
    CHECK(rep.stages == 1 && rep.first_layer == 0 && rep.end_layer == LAYERS && rep.peak_in_flight == 1);
    accel_tensor *l = accel_llama_loss(ref, batch(0, 0, ROWS));
    CHECK_CLOSE(loss, accel_item(l), 1e-6, 1e-6);
    CHECK(accel_backward(l) == ACCEL_OK);
    accel_tensor **p = NULL, **q = NULL;
    int n = accel_module_parameters(model, &p);
    accel_module_parameters(ref, &q);
    double worst = 0;
    for (int i = 0; i < n; i++) worst = fmax(worst, max_abs_diff(p[i]->grad, q[i]->grad));
    CHECK_MSG(worst <= 1e-6, "micro-batched gradients differ by %.3g", worst);
    /* refusals */
    CHECK(accel_accelerator_pipeline_step(acc, model, batch(0, 0, 6), &loss, NULL) == ACCEL_ERR_SHAPE);
    CHECK_STR_CONTAINS(accel_last_error(), "a batch of 6 rows does not split into 4 micro-batches");
    CHECK(accel_accelerator_pipeline_step(acc, ref, batch(0, 0, 4), &loss, NULL) == ACCEL_ERR_STATE);
    accel_clear_error(); /* a NULL tensor keeps an earlier error (it usually comes from a failed op) */
    CHECK(accel_accelerator_pipeline_step(acc, model, NULL, &loss, NULL) == ACCEL_ERR_INVALID_ARG);
    /* a prepared model of no family: no stage hooks in the family table */
    accel_module *lin = accel_linear_new(4, 4, true, ACCEL_CPU_DEVICE, ACCEL_F32);
    accel_optimizer *lin_opt = sgd(lin);
    CHECK(accel_accelerator_prepare(acc, lin, lin_opt) == ACCEL_OK);
    CHECK(accel_accelerator_pipeline_step(acc, lin, batch(0, 0, 4), &loss, NULL) == ACCEL_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(accel_last_error(), "this model is of no family");
    free(p);
    free(q);
    accel_optimizer_free(opt);
    accel_optimizer_free(lin_opt);
    accel_accelerator_free(acc);
    accel_module_free(model);
    accel_module_free(ref);
    accel_module_free(lin);
    accel_step_reset();
}

int main(int argc, char **argv) {
    count_alloc_install(); /* before anything allocates */
    if (argc == 11 || argc == 14) {
        g_family = argc == 14 && strcmp(argv[13], "llama") ? argv[13] : NULL;
        return run_mesh(atoi(argv[1]), atoi(argv[2]), argv[3], atoi(argv[4]) != 0, atoi(argv[5]), atoi(argv[6]),
                        atoi(argv[7]), atoi(argv[8]) != 0, atoi(argv[9]), atoi(argv[10]), argc == 14 ? atoi(argv[11]) : 1,
                        argc == 14 ? argv[12] : "allgather");
    }
    RUN(test_split);
    RUN(test_one_stage_micro_batches);
    RUN(test_interleaved_plan);
    RUN(test_interleaved_refusals);
    return check_summary();
}
