/* A local step of prepare failing on one rank alone (out of memory there:
 * tests/refuse_band.h refuses the step's allocation on the last rank),
 * under `accel launch --num_processes 2` on the cpu (accelerator.cmake;
 * plainly one process has no other rank and returns): prepare fails on
 * every rank with ACCEL_ERR_OOM, the failing rank naming what it could not
 * do, the others naming that rank and step; after it, a retry on every rank
 * prepares and trains, and a free in any order (without the retry) leaks
 * nothing. The steps: DDP's flat parameter buffers, ZeRO-2's gradient
 * shard, ZeRO-3's parameter and gradient shards, ZeRO-1/2/3's optimizer
 * state shard, the tensor-parallel plan's first cut (a retry works) and a
 * later one (that rank's model is left sliced in part: every retry is
 * refused, naming it), a data loader that one rank cannot shard (its batch
 * size), and every allocation of a prepare of a Linear, its AdamW and a
 * data loader refused in turn; and at clear, the buffer a ZeRO optimizer's
 * state is consolidated into refused on one rank. Before, the failing rank returned while the others
 * went on into the next collective (the weights' broadcast, a training
 * step), where they waited for the distributed timeout, and a retry met
 * them there: "mismatched collectives", or a sharded optimizer that one
 * rank did not have. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "accel/accel.h"
#include "accel/accelerator.h"
#include "accelerator/accelerator_internal.h" /* accel__prepare_agree */
#include "check.h"
#include "refuse_band.h"
#include "tiny_llama.h"

enum { KIB = 1024, MIB = 1024 * 1024 };

/* Prepares (m, opt) with the last rank refusing one allocation of band:
 * every rank fails with ACCEL_ERR_OOM, the failing one saying it could not
 * do `what`, the others that it could not. */
static void prepare_fails(accel_accelerator *acc, accel_module *m, accel_optimizer *opt, refuse_band band,
                          const char *what) {
    int rank = accel_accelerator_process_index(acc), world = accel_accelerator_num_processes(acc);
    bool refusing = rank == world - 1;
    if (refusing) refuse_band_install(&band);
    accel_status st = accel_accelerator_prepare(acc, m, opt);
    if (refusing) refuse_band_install(NULL);
    CHECK_MSG(!refusing || band.refused, "rank %d: the allocation of %zu to %zu bytes (skipping %d) never came: %s",
              rank, band.min, band.max, band.skip, what);
    CHECK_MSG(st == ACCEL_ERR_OOM, "rank %d: prepare -> %d: %s", rank, (int)st, accel_last_error());
    char want[256];
    if (refusing) snprintf(want, sizeof want, "rank %d could not %s", rank, what);
    else snprintf(want, sizeof want, "another rank (%d) could not %s", world - 1, what);
    CHECK_MSG(strstr(accel_last_error(), want) != NULL, "rank %d: wanted \"%s\" in: %s", rank, want,
              accel_last_error());
    /* a rank that did its part never names itself (a step agreed inside, as
     * the ZeRO optimizer's shard, agreed again by prepare: each rank once did) */
    char self[64];
    snprintf(self, sizeof self, "rank %d could not", rank);
    CHECK_MSG(refusing || !strstr(accel_last_error(), self), "rank %d blames itself: %s", rank, accel_last_error());
}

/* An accelerator of opts o over the 2 ranks of prepare_rankfail_cpu_2; NULL
 * when run as one process (ctest's plain run: no group of 2 to make). */
static accel_accelerator *accelerator_of_two(const accel_accelerator_opts *o) {
    accel_accelerator *one = accel_accelerator_new(NULL);
    bool alone = one && accel_accelerator_num_processes(one) == 1;
    accel_accelerator_free(one);
    accel_accelerator *acc = alone ? NULL : accel_accelerator_new(o);
    CHECK_MSG(alone || acc, "%s", accel_last_error());
    return acc;
}

/* A step agreed inside another (ZeRO-3's start fills its shard and agrees,
 * prepare agrees on the start): the failure the inner agreement gave every
 * rank goes through the outer one as it is, so the rank that did its part
 * names the failing one, never itself; the failing rank names its inner
 * step. A success after it agrees to success. */
static void test_agreement_inside_an_agreement(void) {
    accel_accelerator *acc = accelerator_of_two(NULL);
    if (!acc) return;
    int rank = accel_accelerator_process_index(acc), world = accel_accelerator_num_processes(acc);
    accel_status mine = rank == world - 1 ? accel_set_error(ACCEL_ERR_OOM, "no memory here") : ACCEL_OK;
    accel_status st = accel__prepare_agree(acc, accel__prepare_agree(acc, mine, "do the inner step"), "do the outer step");
    char want[128], self[64];
    if (rank == world - 1) snprintf(want, sizeof want, "rank %d could not do the inner step", rank);
    else snprintf(want, sizeof want, "another rank (%d) could not do the inner step", world - 1);
    snprintf(self, sizeof self, "rank %d could not do the outer step", rank);
    CHECK_MSG(st == ACCEL_ERR_OOM && strstr(accel_last_error(), want) && !strstr(accel_last_error(), self),
              "rank %d: %d: %s", rank, (int)st, accel_last_error());
    accel_clear_error();
    CHECK(accel__prepare_agree(acc, ACCEL_OK, "do a later step") == ACCEL_OK);
    accel_accelerator_free(acc);
}

/* ---------------------------------------------------------------- DDP and ZeRO */

/* The Linear's f32 flat buffers are 262656 elements each (1 MiB and more),
 * a shard of 2 ranks 525312 bytes: the shards' allocations come in this
 * order (stage 2: the gradient shard, then AdamW's two state shards; stage
 * 3: the parameter shard, the gradient shard, then the state). */
static const struct shard_case {
    int stage;
    refuse_band band;
    const char *what;
} SHARD_CASES[] = {
    {0, {.min = MIB, .max = SIZE_MAX}, "make the model's flat parameter buffers"},
    {1, {.min = 256 * KIB, .max = MIB}, "shard the optimizer's state"},
    {2, {.min = 256 * KIB, .max = MIB}, "lay out the model's parameters, gradients and shards"},
    {2, {.min = 256 * KIB, .max = MIB, .skip = 1}, "shard the optimizer's state"},
    {3, {.min = 256 * KIB, .max = MIB}, "lay out the model's parameters, gradients and shards"},
    {3, {.min = 256 * KIB, .max = MIB, .skip = 1}, "lay out the model's parameters, gradients and shards"},
    {3, {.min = 256 * KIB, .max = MIB, .skip = 2}, "shard the optimizer's state"},
};

/* The sum of m's weight's elements (in host memory): whatever a failed
 * prepare gave back must be what it was given. */
static double weight_sum(accel_module *m) {
    const accel_tensor *w = accel_module_get_tensor(m, "weight");
    double s = 0;
    for (int64_t i = 0; w && i < accel_numel(w); i++) s += ((const float *)w->data)[i];
    return s;
}

static void shard_case(const struct shard_case *c, bool retry) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.zero_stage = c->stage;
    accel_accelerator *acc = accel_accelerator_new(&o);
    CHECK(acc != NULL);
    if (!acc) return;
    if (accel_accelerator_num_processes(acc) == 1) {
        accel_accelerator_free(acc);
        return;
    }
    accel_manual_seed(3);
    accel_module *m = accel_linear_new(512, 512, true, ACCEL_CPU_DEVICE, ACCEL_F32);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 0.01);
    accel_optimizer *opt = accel_optimizer_new_module(ACCEL_OPTIM_ADAMW, m, &h);
    double before = weight_sum(m);
    prepare_fails(acc, m, opt, c->band, c->what);
    /* the model as it was: given back by the failed prepare, or (the optimizer's step failed) unprepared */
    accel_status un = accel_accelerator_unprepare_model(acc, m);
    CHECK_MSG(un == ACCEL_OK || un == ACCEL_ERR_STATE, "stage %d: %s", c->stage, accel_last_error());
    CHECK_MSG(weight_sum(m) == before, "stage %d: the failed prepare changed the weights", c->stage);
    if (!retry) { /* the handled failure, then the frees: model first */
        accel_module_free(m);
        accel_optimizer_free(opt);
        accel_accelerator_free(acc);
        return;
    }
    int rank = accel_accelerator_process_index(acc);
    CHECK_MSG(accel_accelerator_prepare(acc, m, opt) == ACCEL_OK, "stage %d, rank %d: the retry: %s", c->stage, rank,
              accel_last_error());
    CHECK(accel_accelerator_zero_stage(acc) == c->stage);
    float xs[1024];
    for (int i = 0; i < 1024; i++) xs[i] = (float)((i + rank) % 7) * 0.1f;
    accel_tensor *loss = accel_mean_all(accel_module_call(m, accel_from_floats(ACCEL_SHAPE(2, 512), xs)));
    CHECK_MSG(loss && accel_accelerator_backward(acc, loss) == ACCEL_OK &&
                  accel_accelerator_optimizer_step(acc, opt) == ACCEL_OK,
              "stage %d, rank %d: a step after the retry: %s", c->stage, rank, accel_last_error());
    accel_step_reset();
    accel_accelerator_free(acc);
    accel_optimizer_free(opt);
    accel_module_free(m);
}

static void test_one_rank_buffers_fail(void) {
    for (size_t i = 0; i < sizeof SHARD_CASES / sizeof SHARD_CASES[0]; i++) {
        shard_case(&SHARD_CASES[i], true);
        shard_case(&SHARD_CASES[i], false);
    }
}

/* ---------------------------------------------------------------- tensor parallelism */

/* The tiny Llama widened: its embedding (vocab 4096 x 64) and MLP weights
 * (4096 x 64) are cut, at tp 2, into slices of 512 KiB, the plan's only
 * allocations of that size: the embedding first, then each layer's gate,
 * up and down. */
static accel_module *wide_llama(void) {
    accel_manual_seed(5);
    accel_llama_config c = tiny_llama_config();
    c.vocab_size = 4096;
    c.hidden_size = 64;
    c.intermediate_size = 4096;
    return accel_llama_new(&c, ACCEL_CPU_DEVICE);
}

/* skip 0: the embedding's cut fails, nothing of the model is cut on that
 * rank (the others' plan ran whole) and a retry cuts it and trains. skip 2:
 * layer 0's up_proj, after the embedding, its attention and its gate_proj were cut: that rank's
 * model is sliced in part, so every retry fails, that rank saying why. */
static void tp_case(int skip) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.parallelism.tp_size = 2;
    accel_accelerator *acc = accelerator_of_two(&o);
    if (!acc) return;
    accel_module *m = wide_llama();
    CHECK(m != NULL);
    prepare_fails(acc, m, NULL, (refuse_band){.min = 512 * KIB, .max = 512 * KIB + 1, .skip = skip},
                  "slice the model for tensor parallelism");
    int rank = accel_accelerator_process_index(acc), world = accel_accelerator_num_processes(acc);
    accel_status st = accel_accelerator_prepare(acc, m, NULL);
    if (skip) {
        CHECK_MSG(st == ACCEL_ERR_STATE, "rank %d: the retry -> %d: %s", rank, (int)st, accel_last_error());
        CHECK_MSG(strstr(accel_last_error(), rank == world - 1 ? "applied only in part" : "another rank (1) could not "
                         "slice") != NULL, "rank %d: %s", rank, accel_last_error());
    } else {
        CHECK_MSG(st == ACCEL_OK, "rank %d: the retry: %s", rank, accel_last_error());
        int64_t ids[4] = {1, 2, 3, 4000};
        accel_tensor *logits = accel_llama_forward(m, accel_from_data(ACCEL_I64, ACCEL_SHAPE(1, 4), ids), NULL);
        CHECK_MSG(logits && logits->shape[2] == 2048, "rank %d: %s", rank, accel_last_error());
        CHECK_MSG(logits && accel_accelerator_backward(acc, accel_mean_all(logits)) == ACCEL_OK, "rank %d: %s", rank,
                  accel_last_error());
        accel_step_reset();
    }
    accel_module_free(m); /* before the accelerator: it lets the model go first */
    accel_accelerator_free(acc);
}

static void test_one_rank_tp_cut_fails(void) {
    tp_case(0);
    tp_case(2);
}

/* tp 2 with an optimizer: the plan cuts the model on every rank, then the
 * last rank cannot make its flat buffers (the prepare's first allocation of
 * 2 MiB or more). The optimizer must follow the slices that replaced the
 * whole weights it was made over (freed by the plan): a retry prepares both
 * and trains (under ASan a use after free before). */
static void test_one_rank_fails_after_tp_cut(void) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.parallelism.tp_size = 2;
    accel_accelerator *acc = accelerator_of_two(&o);
    if (!acc) return;
    accel_module *m = wide_llama();
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 0.01);
    accel_optimizer *opt = m ? accel_optimizer_new_module(ACCEL_OPTIM_ADAMW, m, &h) : NULL;
    CHECK(m && opt);
    prepare_fails(acc, m, opt, (refuse_band){.min = 2 * MIB, .max = SIZE_MAX}, "make the model's flat parameter buffers");
    int rank = accel_accelerator_process_index(acc);
    CHECK_MSG(accel_accelerator_prepare(acc, m, opt) == ACCEL_OK, "rank %d: the retry: %s", rank, accel_last_error());
    int64_t ids[4] = {1, 2, 3, 4000};
    accel_tensor *logits = accel_llama_forward(m, accel_from_data(ACCEL_I64, ACCEL_SHAPE(1, 4), ids), NULL);
    CHECK_MSG(logits && accel_accelerator_backward(acc, accel_mean_all(logits)) == ACCEL_OK &&
                  accel_accelerator_optimizer_step(acc, opt) == ACCEL_OK,
              "rank %d: a step after the retry: %s", rank, accel_last_error());
    accel_step_reset();
    accel_optimizer_free(opt);
    accel_module_free(m);
    accel_accelerator_free(acc);
}

/* A plan of the user's own that leaves attention whole (Megatron's MLP
 * split) is not a plan "applied in part": prepared under tp 2, it runs. */
static void test_user_plan_of_the_mlp_alone(void) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.parallelism.tp_size = 2;
    accel_accelerator *acc = accelerator_of_two(&o);
    if (!acc) return;
    accel_module *m = tiny_llama(1);
    accel_tp_plan_entry plan[] = {
        {"model.layers.*.mlp.gate_proj", ACCEL_TP_COLWISE, false},
        {"model.layers.*.mlp.up_proj", ACCEL_TP_COLWISE, false},
        {"model.layers.*.mlp.down_proj", ACCEL_TP_ROWWISE, false},
    };
    CHECK_MSG(m && accel_module_parallelize(m, plan, 3, accel_accelerator_tp_group(acc)) == ACCEL_OK, "%s",
              accel_last_error());
    CHECK_MSG(accel_accelerator_prepare_model(acc, m) == ACCEL_OK, "%s", accel_last_error());
    int64_t ids[4] = {1, 2, 3, 4};
    CHECK_MSG(accel_llama_forward(m, accel_from_data(ACCEL_I64, ACCEL_SHAPE(1, 4), ids), NULL) != NULL, "%s",
              accel_last_error());
    accel_step_reset();
    accel_module_free(m);
    accel_accelerator_free(acc);
}

/* ---------------------------------------------------------------- ZeRO optimizer after a step */

/* ZeRO-1: prepared, a step, the model unprepared (the optimizer stays
 * prepared), then prepared again with the last rank refusing the 3rd
 * allocation of 256 KiB to 1 MiB (the optimizer's re-shard, after its
 * segments were moved onto the shard): every rank fails, every rank's
 * optimizer gets its own segments back (the failing one's named the shard's
 * views before: a later prepare of the model prepared the optimizer on one
 * rank only, a hang), and a retry trains. */
static accel_status linear_step(accel_accelerator *acc, accel_module *m, accel_optimizer *opt, int rank) {
    float xs[1024];
    for (int i = 0; i < 1024; i++) xs[i] = (float)((i + rank) % 7) * 0.1f;
    accel_tensor *loss = accel_mean_all(accel_module_call(m, accel_from_floats(ACCEL_SHAPE(2, 512), xs)));
    accel_status st = loss ? accel_accelerator_backward(acc, loss) : accel_last_status();
    if (!st) st = accel_accelerator_optimizer_step(acc, opt);
    accel_step_reset();
    return st;
}

static void test_one_rank_reshard_fails(void) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.zero_stage = 1;
    accel_accelerator *acc = accel_accelerator_new(&o);
    CHECK(acc != NULL);
    if (!acc || accel_accelerator_num_processes(acc) == 1) {
        accel_accelerator_free(acc);
        return;
    }
    int rank = accel_accelerator_process_index(acc), world = accel_accelerator_num_processes(acc);
    accel_manual_seed(3);
    accel_module *m = accel_linear_new(512, 512, true, ACCEL_CPU_DEVICE, ACCEL_F32);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 0.01);
    accel_optimizer *opt = accel_optimizer_new_module(ACCEL_OPTIM_ADAMW, m, &h);
    CHECK(accel_accelerator_prepare(acc, m, opt) == ACCEL_OK && linear_step(acc, m, opt, rank) == ACCEL_OK);
    CHECK(accel_accelerator_unprepare_model(acc, m) == ACCEL_OK);
    refuse_band band = {.min = 256 * KIB, .max = MIB, .skip = 2};
    if (rank == world - 1) refuse_band_install(&band);
    accel_status st = accel_accelerator_prepare_model(acc, m);
    if (rank == world - 1) refuse_band_install(NULL);
    CHECK_MSG(st == ACCEL_ERR_OOM && (rank != world - 1 || band.refused), "rank %d: -> %d: %s", rank, (int)st,
              accel_last_error());
    CHECK_MSG(accel_optimizer_segment_param(opt, 0, NULL) == accel_module_get_tensor(m, "weight") ||
                  accel_optimizer_segment_param(opt, 0, NULL) == accel_module_get_tensor(m, "bias"),
              "rank %d: the optimizer's first segment is not the model's parameter again", rank);
    CHECK_MSG(accel_accelerator_prepare_model(acc, m) == ACCEL_OK, "rank %d: the retry: %s", rank, accel_last_error());
    CHECK_MSG(linear_step(acc, m, opt, rank) == ACCEL_OK, "rank %d: a step after the retry: %s", rank,
              accel_last_error());
    accel_accelerator_free(acc);
    accel_optimizer_free(opt);
    accel_module_free(m);
}

/* ---------------------------------------------------------------- pipeline parallelism */

/* pp 2 over the 2 ranks: the split of the layers into stages (chunks + 1
 * ints: 12 bytes, the prepare's first allocation of that size) and its
 * record for the all-gather that compares the ranks' splits ((world + 1) x
 * (chunks + 3) ints: 60 bytes) failing on the last rank alone; every rank
 * fails at once, and a retry prepares and trains. */
static void pp_case(size_t bytes, const char *what) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.parallelism.pp_size = 2;
    o.parallelism.num_micro_batches = 2;
    accel_accelerator *acc = accelerator_of_two(&o);
    if (!acc) return;
    accel_module *m = tiny_llama(9);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 0.01);
    accel_optimizer *opt = m ? accel_optimizer_new_module(ACCEL_OPTIM_ADAMW, m, &h) : NULL;
    CHECK(m && opt);
    prepare_fails(acc, m, opt, (refuse_band){.min = bytes, .max = bytes + 1}, what);
    int rank = accel_accelerator_process_index(acc);
    CHECK_MSG(accel_accelerator_prepare(acc, m, opt) == ACCEL_OK, "rank %d: the retry: %s", rank, accel_last_error());
    int64_t ids[16];
    for (int i = 0; i < 16; i++) ids[i] = (i * 7 + 3) % 40;
    double loss;
    CHECK_MSG(accel_accelerator_pipeline_step(acc, m, accel_from_data(ACCEL_I64, ACCEL_SHAPE(2, 8), ids), &loss,
                                              NULL) == ACCEL_OK,
              "rank %d: a step after the retry: %s", rank, accel_last_error());
    accel_step_reset();
    accel_accelerator_free(acc);
    accel_optimizer_free(opt);
    accel_module_free(m);
}

static void test_one_rank_pipeline_split_fails(void) {
    pp_case(12, "split the model into stages");
    pp_case(60, "record the pipeline split");
}

/* ---------------------------------------------------------------- every allocation in turn */

/* A data loader of 8 rows of one field, batch size b (shuffled: its seed
 * is broadcast by prepare). */
static accel_dataloader *loader_of(accel_dataset **ds, int64_t b) {
    float x[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    *ds = accel_tensor_dataset_new(1, (accel_tensor *[]){accel_from_floats(ACCEL_SHAPE(8, 1), x)});
    accel_dataloader_opts o = accel_dataloader_opts_default();
    o.batch_size = b;
    o.shuffle = true;
    o.seed = 11;
    return *ds ? accel_dataloader_new(*ds, &o) : NULL;
}

/* split_batches with a batch size the last rank's loader cannot split over
 * 2 ranks (3): every rank's prepare fails, naming the step; the loaders are
 * as they came (one process, their own seed); a retry with a batch of 4
 * there prepares every rank's loader and each gets its half. */
static void test_one_rank_loader_fails(void) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.split_batches = true;
    accel_accelerator *acc = accelerator_of_two(&o);
    if (!acc) return;
    int rank = accel_accelerator_process_index(acc), world = accel_accelerator_num_processes(acc);
    accel_dataset *ds;
    accel_dataloader *dl = loader_of(&ds, rank == world - 1 ? 3 : 4);
    CHECK(dl != NULL);
    accel_status st = accel_accelerator_prepare(acc, dl);
    char want[256];
    if (rank == world - 1) snprintf(want, sizeof want, "rank %d could not shard the data loader", rank);
    else snprintf(want, sizeof want, "another rank (%d) could not shard the data loader", world - 1);
    CHECK_MSG(st == ACCEL_ERR_INVALID_ARG && strstr(accel_last_error(), want), "rank %d: %d: %s", rank, (int)st,
              accel_last_error());
    const accel_dataloader_opts *lo = accel_dataloader_get_opts(dl);
    CHECK_MSG(lo->num_processes <= 1 && lo->process_index == 0 && lo->seed == 11 && !lo->split_batches,
              "rank %d: the loader kept the failed prepare's sharding (%d processes, index %d)", rank,
              lo->num_processes, lo->process_index);
    accel_dataloader_free(dl);
    accel_dataset_free(ds);
    dl = loader_of(&ds, 4);
    CHECK_MSG(accel_accelerator_prepare(acc, dl) == ACCEL_OK, "rank %d: the retry: %s", rank, accel_last_error());
    CHECK(accel_dataloader_get_opts(dl)->num_processes == world);
    accel_accelerator_free(acc);
    accel_dataloader_free(dl);
    accel_dataset_free(ds);
}

/* The accelerator of ZeRO `stage` over 2 ranks (NULL as one process), a
 * Linear(64, 64) (seed 3) and its AdamW, not prepared. */
static accel_accelerator *linear_under_zero(int stage, accel_module **m, accel_optimizer **opt) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.zero_stage = stage;
    accel_accelerator *acc = accelerator_of_two(&o);
    if (!acc) return NULL;
    accel_manual_seed(3);
    *m = accel_linear_new(64, 64, true, ACCEL_CPU_DEVICE, ACCEL_F32);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 0.01);
    *opt = accel_optimizer_new_module(ACCEL_OPTIM_ADAMW, *m, &h);
    return acc;
}

/* A Linear(64, 64) and AdamW trained one step under ZeRO `stage` on 2 ranks,
 * then cleared, the last rank refusing (`refuse`) the full-size buffer its
 * optimizer state is consolidated into: the model's weights after the clear
 * into w (4160 floats), the clear's status into *st. False when run as one
 * process (nothing done). */
static bool clear_after_a_step(int stage, bool refuse, float *w, accel_status *st) {
    accel_module *m;
    accel_optimizer *opt;
    accel_accelerator *acc = linear_under_zero(stage, &m, &opt);
    if (!acc) return false;
    int rank = accel_accelerator_process_index(acc), world = accel_accelerator_num_processes(acc);
    CHECK_MSG(accel_accelerator_prepare(acc, m, opt) == ACCEL_OK, "%s", accel_last_error());
    float xs[128];
    for (int i = 0; i < 128; i++) xs[i] = (float)((i + rank) % 7) * 0.1f;
    accel_tensor *loss = accel_mean_all(accel_module_call(m, accel_from_floats(ACCEL_SHAPE(2, 64), xs)));
    CHECK(loss && accel_accelerator_backward(acc, loss) == ACCEL_OK && accel_accelerator_optimizer_step(acc, opt) == ACCEL_OK);
    accel_step_reset();
    /* the flat f32 buffer: 4160 floats, padded to the shards (a few KiB more at most) */
    refuse_band band = {.min = 4160 * sizeof(float), .max = 4160 * sizeof(float) + 4096};
    if (refuse && rank == world - 1) refuse_band_install(&band);
    *st = accel_accelerator_clear(acc);
    if (refuse && rank == world - 1) refuse_band_install(NULL);
    CHECK_MSG(!refuse || rank != world - 1 || band.refused, "stage %d: the consolidation's buffer never came", stage);
    char why[512];
    snprintf(why, sizeof why, "%s", accel_last_error());
    accel_clear_error();
    const accel_tensor *wt = accel_module_get_tensor(m, "weight"), *bt = accel_module_get_tensor(m, "bias");
    CHECK(wt && bt && accel_to_floats(wt, w) == ACCEL_OK && accel_to_floats(bt, w + 4096) == ACCEL_OK);
    /* the group still works after it */
    CHECK_MSG(accel_accelerator_reduce_scalar(acc, 1.0, "sum") == (double)world, "stage %d, rank %d: the group after the "
              "clear: %s (the clear: %s)", stage, rank, accel_last_error(), why);
    if (*st) accel_set_error(*st, "%s", why);
    accel_accelerator_free(acc);
    accel_optimizer_free(opt);
    accel_module_free(m);
    return true;
}

/* ZeRO 1-3: one rank cannot allocate the buffer its optimizer's state is
 * consolidated into at clear: every rank's clear fails saying so (the
 * optimizer comes back with fresh state), the weights are the ones a clear
 * without the failure gives, to the bit, and the group still works. Before,
 * that rank went on alone into the model's release while the others
 * gathered: "mismatched collectives", a broken group, and under ZeRO-3 every
 * unit's weights came back as zeros. */
static void test_one_rank_consolidation_fails(void) {
    for (int stage = 1; stage <= 3; stage++) {
        float good[4160], got[4160];
        accel_status st;
        if (!clear_after_a_step(stage, false, good, &st)) return; /* one process */
        CHECK_MSG(st == ACCEL_OK, "stage %d: the clear: %s", stage, accel_last_error());
        CHECK(clear_after_a_step(stage, true, got, &st));
        CHECK_MSG(st != ACCEL_OK && strstr(accel_last_error(), "consolidated"), "stage %d: the clear -> %d: %s", stage,
                  (int)st, accel_last_error());
        accel_clear_error();
        CHECK_MSG(memcmp(good, got, sizeof good) == 0, "stage %d: the weights after the failed consolidation differ",
                  stage);
    }
}

/* The last rank refuses the k-th allocation (any size) of its prepare of a
 * Linear, its AdamW and a data loader, for every k its prepare makes, under
 * DDP and ZeRO 1, 2 and 3: each prepare either works on every rank or fails
 * on every rank with a status, and then a retry prepares and trains a step
 * (a local step not agreed on would leave the others in a collective: a
 * hang, then "mismatched collectives" and a broken group). */
typedef struct refuse_kth {
    long count, k;
    bool refused;
} refuse_kth;

static void *refuse_kth_alloc(void *ctx, size_t bytes, size_t align) {
    refuse_kth *r = ctx;
    if (r->count++ == r->k) {
        r->refused = true;
        return NULL;
    }
    void *p = NULL;
    return posix_memalign(&p, align < sizeof(void *) ? sizeof(void *) : align, bytes ? bytes : 1) ? NULL : p;
}

/* One k at ZeRO stage `stage`; whether the last rank refused (every rank learns it). */
static bool sweep_one(int stage, long k) {
    accel_module *m;
    accel_optimizer *opt;
    accel_accelerator *acc = linear_under_zero(stage, &m, &opt);
    if (!acc) return false;
    int rank = accel_accelerator_process_index(acc), world = accel_accelerator_num_processes(acc);
    accel_dataset *ds;
    accel_dataloader *dl = loader_of(&ds, 2);
    refuse_kth r = {.k = k};
    if (rank == world - 1) accel_set_allocator(&(accel_allocator){refuse_kth_alloc, refuse_band_free, &r});
    accel_status st = accel_accelerator_prepare(acc, m, opt, dl);
    if (rank == world - 1) accel_set_allocator(NULL);
    CHECK_MSG(st == ACCEL_OK || strstr(accel_last_error(), "could not"), "stage %d, allocation %ld, rank %d: %s",
              stage, k, rank, accel_last_error());
    if (st) { /* failed on every rank: undone, so a retry prepares */
        accel_accelerator_unprepare_model(acc, m);
        st = accel_accelerator_prepare(acc, m, opt, dl);
        CHECK_MSG(st == ACCEL_OK, "stage %d, allocation %ld, rank %d: the retry: %s", stage, k, rank,
                  accel_last_error());
    }
    if (st == ACCEL_OK) {
        float xs[128];
        for (int i = 0; i < 128; i++) xs[i] = (float)((i + rank) % 7) * 0.1f;
        accel_tensor *loss = accel_mean_all(accel_module_call(m, accel_from_floats(ACCEL_SHAPE(2, 64), xs)));
        CHECK_MSG(loss && accel_accelerator_backward(acc, loss) == ACCEL_OK &&
                      accel_accelerator_optimizer_step(acc, opt) == ACCEL_OK,
                  "stage %d, allocation %ld, rank %d: a step: %s", stage, k, rank, accel_last_error());
        accel_step_reset();
    }
    bool refused = accel_accelerator_reduce_scalar(acc, r.refused ? 1.0 : 0.0, "max") == 1.0;
    accel_accelerator_free(acc);
    accel_optimizer_free(opt);
    accel_module_free(m);
    accel_dataloader_free(dl);
    accel_dataset_free(ds);
    return refused;
}

static void test_every_allocation_refused_in_turn(void) {
    for (int stage = 0; stage <= 3; stage++)
        for (long k = 0; sweep_one(stage, k); k++) continue;
}

int main(void) {
    RUN(test_every_allocation_refused_in_turn);
    RUN(test_one_rank_loader_fails);
    RUN(test_agreement_inside_an_agreement);
    RUN(test_one_rank_consolidation_fails);
    RUN(test_one_rank_pipeline_split_fails);
    RUN(test_user_plan_of_the_mlp_alone);
    RUN(test_one_rank_reshard_fails);
    RUN(test_one_rank_tp_cut_fails);
    RUN(test_one_rank_fails_after_tp_cut);
    RUN(test_one_rank_buffers_fail);
    return check_summary();
}
