/* Ranks that disagree about the parallelism, on 2 forked processes: every
 * rank fails with an error that names the disagreement, and then goes on.
 *
 * accel_accelerator_new: one rank given other opts.parallelism (another
 * mesh, sequence parallelism, cp_comm_strategy, pp_schedule or
 * num_micro_batches), another zero_stage, or a PARALLELISM_CONFIG_*
 * variable the other lacks
 * fails on both, each naming its own mesh and the knobs that differ; a rank
 * whose own sizes are wrong keeps its own message and the other names it.
 * Before, the ranks that laid out no subgroup returned an accelerator whose
 * first collective met the others' mesh ("mismatched collectives"), the
 * failing rank's message was replaced by its teardown's, and a pipeline
 * whose ranks chose 1F1B and GPipe trained without a word.
 *
 * accel_accelerator_prepare: ranks whose models differ (intermediate_size,
 * vocab_size) fail on both under tp 2, pp 2, cp 2 and DDP, naming the
 * counts, and each rank's model stays whole: its loss is the one it had
 * before the prepare (before, the comparison came after the tp plan's cut
 * and the pipeline's release of the other stages, which left the refused
 * model sliced or staged, its forward refused). Before, a tp group or a pipeline's stages broadcast nothing
 * between them and trained apart (each rank its own widths) without an
 * error; DDP's broadcast failed in mismatched collectives that left the
 * process group unusable.
 *
 * accel_accelerator_prepare_model: a refusal of one rank's before the
 * prepare's first collective (Megatron's recompute_activations refused for
 * a module without a forward) fails on both at once, naming it. Before,
 * the others went on into the models' comparison, alone. The same for
 * accel_accelerator_prepare_optimizer (one rank's optimizer made over a
 * model it freed) and accel_accelerator_prepare_dataloader (one rank's
 * ninth loader, more than it may hold): before, the others waited in the
 * registration's agreement and the sharding's.
 *
 * After each refusal the same process makes an agreeing accelerator, and
 * models alike train a step to the same loss on both ranks.
 *
 * Free order under tp 2 (the job's default group, the accelerator holding
 * its last reference) and dp_shard 2 x tp 2 (a subgroup of the
 * accelerator's, the test holding a reference to the job's group too):
 * the accelerator freed before its tensor-parallel
 * model (the decoders' own plan, and a plan of the user's over
 * accel_accelerator_tp_group), the model's forward fails with
 * ACCEL_ERR_STATE naming why, and the model and optimizer free after it;
 * a model unprepared and prepared again by the same accelerator trains on.
 * Before, the model's modules kept the freed tp group and the forward read
 * it (a segfault). */
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"
#include "check.h"
#include "dist_group.h"
#include "tiny_llama.h"

enum { B = 2, T = 8 };

/* The case the forked ranks run (set before the fork). */
static struct {
    accel_parallelism_opts agreed; /* every rank's, once they agree */
    accel_parallelism_opts last;   /* the last rank's in the disagreeing new (the others: agreed) */
    const char *env_last;          /* a PARALLELISM_CONFIG_TP_SIZE the last rank alone sees, or NULL */
    const char *want;              /* what new's error says on every rank */
    const char *want_last;         /* ... on the last rank instead, or NULL */
    int64_t ffn_last, vocab_last;  /* the last rank's model in prepare (0: the others') */
    int zero_last;                 /* the last rank's zero_stage in the disagreeing new (the others: 1); 0: none */
    const char *fsdp_last;         /* the last rank's fsdp_sharding_strategy (the others: FULL_SHARD), or NULL */
} CASE;

static accel_accelerator *make_fsdp(const accel_parallelism_opts *p, int zero_stage, const char *fsdp) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.parallelism = *p;
    o.zero_stage = zero_stage;
    o.fsdp_sharding_strategy = fsdp;
    return accel_accelerator_new(&o);
}

static accel_accelerator *make_zero(const accel_parallelism_opts *p, int zero_stage) {
    return make_fsdp(p, zero_stage, NULL);
}

static accel_accelerator *make(const accel_parallelism_opts *p) { return make_zero(p, 0); }

static accel_module *model(int64_t ffn, int64_t vocab) {
    accel_llama_config c = tiny_llama_config();
    if (ffn) c.intermediate_size = ffn;
    if (vocab) c.vocab_size = vocab;
    accel_manual_seed(3);
    return accel_llama_new(&c, ACCEL_CPU_DEVICE);
}

static accel_tensor *ids(void) {
    int64_t v[B * T];
    for (int i = 0; i < B * T; i++) v[i] = (i * 7 + 3) % 40;
    return accel_from_data(ACCEL_I64, 2, (int64_t[]){B, T}, v);
}

/* One step of a model alike on every rank: its loss, the same on both. */
static void trains(accel_accelerator *acc, int rank) {
    accel_module *m = model(0, 0);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_SGD, 0.1);
    accel_optimizer *opt = accel_optimizer_new_module(ACCEL_OPTIM_SGD, m, &h);
    CHECK_MSG(accel_accelerator_prepare(acc, m, opt) == ACCEL_OK, "rank %d: %s", rank, accel_last_error());
    double loss = -1;
    if (CASE.agreed.pp_size > 1) {
        CHECK_MSG(accel_accelerator_pipeline_step(acc, m, ids(), &loss, NULL) == ACCEL_OK, "rank %d: %s", rank,
                  accel_last_error());
    } else {
        accel_tensor *l = accel_llama_loss(m, ids());
        CHECK_MSG(l && accel_accelerator_backward(acc, l) == ACCEL_OK, "rank %d: %s", rank, accel_last_error());
        loss = l ? accel_item(l) : -1;
    }
    CHECK(accel_accelerator_optimizer_step(acc, opt) == ACCEL_OK);
    double both[2] = {0};
    CHECK(accel_pg_all_gather(accel_dist_default_group(), &loss, both, 1, ACCEL_F64) == ACCEL_OK);
    CHECK_MSG(loss > 0 && both[0] == both[1], "rank %d: losses %g and %g", rank, both[0], both[1]);
    accel_step_reset();
    accel_optimizer_free(opt);
    accel_module_free(m);
}

static int new_body(int rank, int world) {
    bool last = rank == world - 1;
    if (last && CASE.env_last) {
        setenv("ACCELERATE_USE_PARALLELISM_CONFIG", "true", 1);
        setenv("PARALLELISM_CONFIG_TP_SIZE", CASE.env_last, 1);
    }
    int zero = !CASE.zero_last ? 0 : last ? CASE.zero_last : 1;
    const char *fsdp = !CASE.fsdp_last ? NULL : last ? CASE.fsdp_last : "FULL_SHARD";
    accel_accelerator *acc = make_fsdp(last ? &CASE.last : &CASE.agreed, zero, fsdp);
    CHECK_MSG(acc == NULL && accel_last_status() == ACCEL_ERR_INVALID_ARG, "rank %d: new -> %p (%d)", rank,
              (void *)acc, (int)accel_last_status());
    CHECK_STR_CONTAINS(accel_last_error(), last && CASE.want_last ? CASE.want_last : CASE.want);
    accel_accelerator_free(acc);
    unsetenv("ACCELERATE_USE_PARALLELISM_CONFIG");
    unsetenv("PARALLELISM_CONFIG_TP_SIZE");
    /* the group is still usable: an agreeing accelerator trains */
    acc = make(&CASE.agreed);
    CHECK_MSG(acc != NULL, "rank %d: %s", rank, accel_last_error());
    if (acc) trains(acc, rank);
    accel_accelerator_free(acc);
    return check_summary();
}

static int prepare_body(int rank, int world) {
    bool last = rank == world - 1;
    accel_accelerator *acc = make(&CASE.agreed);
    CHECK_MSG(acc != NULL, "rank %d: %s", rank, accel_last_error());
    if (!acc) return check_summary();
    accel_module *m = last ? model(CASE.ffn_last, CASE.vocab_last) : model(0, 0);
    accel_tensor *before = accel_llama_loss(m, ids());
    double loss = before ? accel_item(before) : -1;
    accel_step_reset();
    CHECK(accel_accelerator_prepare(acc, m) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "the ranks' models differ in their tensors' names, shapes or dtypes");
    CHECK_STR_CONTAINS(accel_last_error(), "every rank must build the same model");
    /* refused before the tp plan cut it or a stage released the others' layers: whole, its loss as before */
    accel_tensor *after = accel_llama_loss(m, ids());
    CHECK_MSG(after && accel_item(after) == loss, "rank %d: loss %g before the prepare, %g after (%s)", rank, loss,
              after ? accel_item(after) : -1, after ? "" : accel_last_error());
    accel_step_reset();
    accel_module_free(m);
    trains(acc, rank); /* models alike, on the same accelerator */
    accel_accelerator_free(acc);
    return check_summary();
}

/* Megatron's recompute_activations on every rank, and the last rank given a module without a forward to
 * recompute (its model's ModuleList): refused there before the prepare's first collective, the others
 * told at once. Before, they waited in the models' comparison until ACCEL_DIST_TIMEOUT. */
static int recompute_body(int rank, int world) {
    setenv("ACCELERATE_USE_MEGATRON_LM", "true", 1);
    setenv("MEGATRON_LM_RECOMPUTE_ACTIVATIONS", "true", 1);
    accel_accelerator *acc = make(&CASE.agreed);
    unsetenv("ACCELERATE_USE_MEGATRON_LM");
    unsetenv("MEGATRON_LM_RECOMPUTE_ACTIVATIONS");
    CHECK_MSG(acc != NULL, "rank %d: %s", rank, accel_last_error());
    if (!acc) return check_summary();
    accel_module *m = model(0, 0);
    bool last = rank == world - 1;
    CHECK(accel_accelerator_prepare_model(acc, last ? accel_module_find(m, "model.layers") : m) ==
          ACCEL_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(accel_last_error(), last ? "rank 1 could not accept the model, so it fails on every rank"
                                                : "another rank (1) could not accept the model");
    if (last) CHECK_STR_CONTAINS(accel_last_error(), "ModuleList has no single-tensor forward to recompute");
    accel_module_free(m);
    trains(acc, rank); /* the same models, checkpointed */
    accel_accelerator_free(acc);
    return check_summary();
}

/* The last rank's optimizer made over a model freed before it: refused there before the optimizer
 * prepare's first collective, the others told at once. Before, they waited in that collective (its
 * agreement on the optimizer's registration) until ACCEL_DIST_TIMEOUT. */
static int optimizer_body(int rank, int world) {
    accel_accelerator *acc = make(&CASE.agreed);
    CHECK_MSG(acc != NULL, "rank %d: %s", rank, accel_last_error());
    if (!acc) return check_summary();
    accel_module *m = model(0, 0);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_SGD, 0.1);
    accel_optimizer *opt = accel_optimizer_new_module(ACCEL_OPTIM_SGD, m, &h);
    bool last = rank == world - 1;
    if (last) accel_module_free(m);
    CHECK(accel_accelerator_prepare_optimizer(acc, opt) == ACCEL_ERR_STATE);
    CHECK_STR_CONTAINS(accel_last_error(), last ? "rank 1 could not accept the optimizer, so it fails on every rank"
                                                : "another rank (1) could not accept the optimizer");
    if (last) CHECK_STR_CONTAINS(accel_last_error(), "the optimizer's model was freed before it");
    accel_optimizer_free(opt);
    if (!last) accel_module_free(m);
    trains(acc, rank);
    accel_accelerator_free(acc);
    return check_summary();
}

/* Every rank prepares ACCEL__MAX_PREPARED (8) data loaders, the first rank frees one, and a ninth is
 * refused on the last rank alone (too many): both fail at once, naming it. Before, the first rank waited
 * in the sharding's agreement until ACCEL_DIST_TIMEOUT. */
static int dataloader_body(int rank, int world) {
    enum { MAX = 8 };
    accel_accelerator *acc = make(&CASE.agreed);
    CHECK_MSG(acc != NULL, "rank %d: %s", rank, accel_last_error());
    if (!acc) return check_summary();
    accel_tensor *x = accel_ones(ACCEL_F32, 2, (int64_t[]){8, 2});
    accel_dataset *ds = accel_tensor_dataset_new(1, &x);
    accel_dataloader_opts o = accel_dataloader_opts_default();
    o.batch_size = 2;
    accel_dataloader *dls[MAX + 1];
    for (int i = 0; i <= MAX; i++) dls[i] = accel_dataloader_new(ds, &o);
    for (int i = 0; i < MAX; i++)
        CHECK_MSG(accel_accelerator_prepare_dataloader(acc, dls[i]) == ACCEL_OK, "rank %d: %s", rank,
                  accel_last_error());
    bool last = rank == world - 1;
    if (!last) { /* one freed here: this rank takes a ninth */
        accel_dataloader_free(dls[0]);
        dls[0] = NULL;
    }
    CHECK(accel_accelerator_prepare_dataloader(acc, dls[MAX]) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), last ? "rank 1 could not accept the data loader, so it fails on every "
                                                  "rank: accel_accelerator_prepare: more than 8 data loaders"
                                                : "another rank (1) could not accept the data loader");
    for (int i = 0; i <= MAX; i++) accel_dataloader_free(dls[i]);
    accel_dataset_free(ds);
    trains(acc, rank);
    accel_accelerator_free(acc);
    return check_summary();
}

static const char GONE[] = "the model is tensor-parallel over the tp group of an accelerator that let it go";

static int free_order_body(int rank, int world) {
    /* tp over every rank (the default group, which this accelerator's free tears down), or a subgroup */
    accel_parallelism_opts tp2 = {.tp_size = 2, .dp_shard_size = world / 2};
    /* a subgroup goes with its accelerator whoever else holds the job's group */
    bool held = world > 2 && accel_dist_init() == ACCEL_OK;
    accel_accelerator *acc = make(&tp2);
    CHECK_MSG(acc != NULL, "rank %d: %s", rank, accel_last_error());
    if (!acc) return check_summary();
    /* unprepared and prepared again: the same slices over the same group */
    accel_module *m = model(0, 0);
    CHECK(accel_accelerator_prepare(acc, m) == ACCEL_OK);
    CHECK(accel_accelerator_unprepare_model(acc, m) == ACCEL_OK);
    CHECK(accel_llama_loss(m, ids()) == NULL && accel_last_status() == ACCEL_ERR_STATE);
    CHECK_STR_CONTAINS(accel_last_error(), GONE);
    accel_step_reset();
    CHECK_MSG(accel_accelerator_prepare(acc, m) == ACCEL_OK, "rank %d: %s", rank, accel_last_error());
    accel_tensor *l = accel_llama_loss(m, ids());
    CHECK_MSG(l && accel_accelerator_backward(acc, l) == ACCEL_OK, "rank %d: %s", rank, accel_last_error());
    accel_step_reset();
    /* a plan of the user's over the accelerator's tp group */
    accel_module *lin[2] = {accel_linear_new(4, 8, true, ACCEL_CPU_DEVICE, ACCEL_F32),
                            accel_linear_new(8, 4, true, ACCEL_CPU_DEVICE, ACCEL_F32)};
    accel_module *own = accel_sequential_new(2, lin);
    accel_tp_plan_entry plan[] = {{"0", ACCEL_TP_COLWISE, false}, {"1", ACCEL_TP_ROWWISE, false}};
    CHECK(accel_module_parallelize(own, plan, 2, accel_accelerator_tp_group(acc)) == ACCEL_OK);
    CHECK(accel_accelerator_prepare_model(acc, own) == ACCEL_OK);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_SGD, 0.1);
    accel_optimizer *opt = accel_optimizer_new_module(ACCEL_OPTIM_SGD, m, &h);
    CHECK(accel_accelerator_prepare_optimizer(acc, opt) == ACCEL_OK);
    /* the accelerator first: its models are let go, their forwards refused */
    accel_accelerator_free(acc);
    CHECK(accel_llama_loss(m, ids()) == NULL && accel_last_status() == ACCEL_ERR_STATE);
    CHECK_STR_CONTAINS(accel_last_error(), GONE);
    CHECK(accel_module_call(own, accel_ones(ACCEL_F32, 2, (int64_t[]){3, 4})) == NULL &&
          accel_last_status() == ACCEL_ERR_STATE);
    CHECK_STR_CONTAINS(accel_last_error(), GONE);
    accel_step_reset();
    accel_optimizer_free(opt);
    accel_module_free(m);
    accel_module_free(own);
    if (held) accel_dist_finalize();
    return check_summary();
}

static void run_on(int world, const char *what, dist_body_fn body) {
    dist_group g = {.world = world, .one_machine = true, .timeout = "30", .kill_after_s = 120};
    CHECK(dist_group_runs_ok(&g, body, "%s", what));
    memset(&CASE, 0, sizeof CASE);
}

static void run(const char *what, dist_body_fn body) { run_on(2, what, body); }

static const char NAMES_IT[] = "(every rank must be given the same opts.parallelism, zero_stage / "
                               "fsdp_sharding_strategy / DeepSpeed config, and the same PARALLELISM_CONFIG_* / "
                               "MEGATRON_LM_* / ACCEL_ZERO_STAGE / ACCEL_FSDP_* variables)";

static void test_new_disagrees(void) {
    CASE.agreed = (accel_parallelism_opts){.tp_size = 2};
    CASE.last = (accel_parallelism_opts){.dp_shard_size = 2};
    CASE.want = "over the ranks dp_shard_size from 1 to 2, tp_size from 1 to 2";
    run("tp 2 / dp_shard 2", new_body);

    CASE.agreed = (accel_parallelism_opts){.tp_size = 2};
    CASE.last = (accel_parallelism_opts){.tp_size = 2, .sequence_parallelism = ACCEL_TRUE};
    CASE.want = "over the ranks sequence_parallelism on some, not on others";
    run("sequence parallelism on one rank", new_body);

    CASE.agreed = (accel_parallelism_opts){.cp_size = 2};
    CASE.last = (accel_parallelism_opts){.cp_size = 2, .cp_comm_strategy = "alltoall"};
    CASE.want = "cp_comm_strategy \"alltoall\" (or sp_size) on some, not on others";
    run("cp_comm_strategy on one rank", new_body);

    CASE.agreed = (accel_parallelism_opts){.pp_size = 2};
    CASE.last = (accel_parallelism_opts){.pp_size = 2, .pp_schedule = "gpipe"};
    CASE.want = "pp_schedule \"gpipe\" on some, not on others";
    run("pp_schedule on one rank", new_body);

    CASE.agreed = (accel_parallelism_opts){.pp_size = 2, .num_micro_batches = 2};
    CASE.last = (accel_parallelism_opts){.pp_size = 2};
    CASE.want = "pp 2 x dp_replicate 1 x dp_shard 1 x cp 1 x tp 1 on rank";
    CASE.want_last = "num_micro_batches from 1 to 2";
    run("num_micro_batches on one rank", new_body);

    /* the ZeRO stage that shards over the mesh: ZeRO-1 on one, ZeRO-2 on the other */
    CASE.agreed = (accel_parallelism_opts){.dp_shard_size = 2};
    CASE.last = CASE.agreed;
    CASE.zero_last = 2;
    CASE.want = "over the ranks the ZeRO stage (zero_stage, FSDP's sharding, DeepSpeed's) from 1 to 2";
    run("zero_stage on one rank", new_body);

    /* both ZeRO-3, FSDP's HYBRID_SHARD on one rank only: it split into its replica groups alone (the other
     * rank's new returned, to meet it in mismatched collectives at its first step) */
    CASE.agreed = CASE.last = (accel_parallelism_opts){0};
    CASE.zero_last = 0;
    CASE.fsdp_last = "HYBRID_SHARD";
    CASE.want = "FSDP's HYBRID_SHARD sharding (fsdp_sharding_strategy) on some, not on others";
    run("HYBRID_SHARD on one rank", new_body);

    /* the default mesh on one, a variable's tp on the other */
    CASE.env_last = "2";
    CASE.want = NAMES_IT;
    run("PARALLELISM_CONFIG_TP_SIZE on one rank", new_body);

    /* a rank's own error stays its own; the other names it */
    CASE.agreed = (accel_parallelism_opts){.tp_size = 2};
    CASE.last = (accel_parallelism_opts){.tp_size = 3};
    CASE.want = "rank 1 could not lay out the device mesh (its error is reported there), so it fails on every rank";
    CASE.want_last = "tp_size 3 = 3, not the 2 processes of the job";
    run("tp 3 on one rank", new_body);
}

static void test_models_disagree(void) {
    static const struct {
        const char *what;
        accel_parallelism_opts p;
    } meshes[] = {{"tp 2", {.tp_size = 2}}, {"pp 2", {.pp_size = 2}}, {"cp 2", {.cp_size = 2}}, {"DDP", {0}}};
    for (size_t k = 0; k < sizeof meshes / sizeof *meshes; k++) {
        CASE.agreed = meshes[k].p;
        CASE.ffn_last = 32; /* 24 on the other */
        run(meshes[k].what, prepare_body);
    }
    CASE.agreed = (accel_parallelism_opts){.tp_size = 2};
    CASE.vocab_last = 48; /* 40 on the other */
    run("tp 2, another vocabulary", prepare_body);
}

static void test_recompute_refused_on_one_rank(void) { run("recompute refused on one rank", recompute_body); }

static void test_optimizer_refused_on_one_rank(void) { run("optimizer refused on one rank", optimizer_body); }

static void test_dataloader_refused_on_one_rank(void) { run("data loader refused on one rank", dataloader_body); }

static void test_free_order(void) {
    run("free order under tp 2", free_order_body);
    run_on(4, "free order under dp_shard 2 x tp 2", free_order_body);
}

int main(void) {
    setenv("OMP_NUM_THREADS", "1", 0);
    RUN(test_new_disagrees);
    RUN(test_models_disagree);
    RUN(test_recompute_refused_on_one_rank);
    RUN(test_optimizer_refused_on_one_rank);
    RUN(test_dataloader_refused_on_one_rank);
    RUN(test_free_order);
    return check_summary();
}
