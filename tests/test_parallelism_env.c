/* ParallelismConfig's and Megatron-LM's environment variables
 * (src/accelerator/parallelism_env.c): each reaches its opts.parallelism
 * field (or the ZeRO stage, the clipping, the layers' checkpointing), a
 * field set in the code wins, ACCEL_* beats Accelerate's name, bad values
 * and conflicts are refused naming the variables; end to end on 2
 * processes, the mesh they ask for is laid out, or refused naming them. */
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"
#include "accel/accelerator.h"
#include "accelerator/accelerator_internal.h"
#include "accelerator/parallelism_env.h"
#include "check.h"
#include "dist_group.h"
#include "tiny_llama.h"

static const char *const VARS[] = {
    "ACCELERATE_USE_PARALLELISM_CONFIG", "PARALLELISM_CONFIG_DP_REPLICATE_SIZE", "PARALLELISM_CONFIG_DP_SHARD_SIZE",
    "PARALLELISM_CONFIG_TP_SIZE", "PARALLELISM_CONFIG_CP_SIZE", "PARALLELISM_CONFIG_SP_SIZE",
    "PARALLELISM_CONFIG_CP_COMM_STRATEGY", "PARALLELISM_CONFIG_CP_BACKEND", "PARALLELISM_CONFIG_SP_BACKEND",
    "ACCELERATE_USE_MEGATRON_LM", "MEGATRON_LM_TP_DEGREE", "MEGATRON_LM_PP_DEGREE", "MEGATRON_LM_NUM_MICRO_BATCHES",
    "MEGATRON_LM_SEQUENCE_PARALLELISM", "MEGATRON_LM_RECOMPUTE_ACTIVATIONS", "MEGATRON_LM_USE_DISTRIBUTED_OPTIMIZER",
    "MEGATRON_LM_GRADIENT_CLIPPING", "ACCEL_ZERO_STAGE", "ACCEL_GRADIENT_CLIPPING", "ACCEL_DEEPSPEED_CONFIG_FILE",
};

static void clear_env(void) {
    for (size_t i = 0; i < sizeof VARS / sizeof *VARS; i++) {
        char accel[96];
        const char *name = VARS[i], *bare = strncmp(name, "ACCELERATE_", 11) ? name : name + 11;
        snprintf(accel, sizeof accel, "ACCEL_%s", bare);
        unsetenv(name);
        if (strncmp(name, "ACCEL_", 6)) unsetenv(accel);
    }
}

/* o read from the environment; the status it gave. */
static accel_status read_env(accel_accelerator_opts *o, accel__parallelism_env *pe) {
    accel_clear_error();
    return accel__parallelism_env_read(o, pe);
}

static void refused(const char *why) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    accel__parallelism_env pe;
    CHECK_MSG(read_env(&o, &pe) == ACCEL_ERR_INVALID_ARG, "accepted (expected: %s)", why);
    CHECK_STR_CONTAINS(accel_last_error(), why);
}

/* A variable set to a bad value, refused naming it (then unset again). */
typedef struct bad_var {
    const char *name, *value, *why;
} bad_var;

static void refused_each(const bad_var *bad, size_t n) {
    for (size_t i = 0; i < n; i++) {
        setenv(bad[i].name, bad[i].value, 1);
        refused(bad[i].why);
        unsetenv(bad[i].name);
    }
}

static void test_parallelism_config_vars(void) {
    clear_env();
    setenv("PARALLELISM_CONFIG_DP_REPLICATE_SIZE", "2", 1);
    setenv("PARALLELISM_CONFIG_DP_SHARD_SIZE", "3", 1);
    setenv("PARALLELISM_CONFIG_TP_SIZE", "4", 1);
    setenv("PARALLELISM_CONFIG_CP_SIZE", "5", 1);
    setenv("PARALLELISM_CONFIG_SP_SIZE", "6", 1);
    setenv("PARALLELISM_CONFIG_CP_COMM_STRATEGY", "alltoall", 1);
    setenv("PARALLELISM_CONFIG_CP_BACKEND", "torch", 1);
    setenv("PARALLELISM_CONFIG_SP_BACKEND", "deepspeed", 1);
    accel_accelerator_opts o = accel_accelerator_opts_default();
    accel__parallelism_env pe;
    /* not asked for: Accelerate builds no ParallelismConfig, nothing is read */
    CHECK(read_env(&o, &pe) == ACCEL_OK && o.parallelism.tp_size == 0 && !pe.from[0]);
    setenv("ACCELERATE_USE_PARALLELISM_CONFIG", "true", 1);
    CHECK_MSG(read_env(&o, &pe) == ACCEL_OK, "%s", accel_last_error());
    const accel_parallelism_opts *p = &o.parallelism;
    CHECK(p->dp_replicate_size == 2 && p->dp_shard_size == 3 && p->tp_size == 4 && p->cp_size == 5 &&
          p->sp_size == 6);
    CHECK(p->cp_comm_strategy && !strcmp(p->cp_comm_strategy, "alltoall"));
    CHECK_STR_CONTAINS(pe.from, "PARALLELISM_CONFIG_DP_REPLICATE_SIZE=2");
    CHECK_STR_CONTAINS(pe.from, "PARALLELISM_CONFIG_SP_SIZE=6");
    CHECK_STR_CONTAINS(pe.from, "PARALLELISM_CONFIG_CP_COMM_STRATEGY=alltoall");
    /* a field set in the code wins over its variable; ACCEL_* over Accelerate's name */
    o = accel_accelerator_opts_default();
    o.parallelism.tp_size = 8;
    o.parallelism.cp_comm_strategy = "allgather";
    setenv("ACCEL_PARALLELISM_CONFIG_DP_SHARD_SIZE", "7", 1);
    CHECK(read_env(&o, &pe) == ACCEL_OK);
    CHECK(p->tp_size == 8 && !strcmp(p->cp_comm_strategy, "allgather") && p->dp_shard_size == 7);
    CHECK_STR_CONTAINS(pe.from, "ACCEL_PARALLELISM_CONFIG_DP_SHARD_SIZE=7");
    CHECK(!strstr(pe.from, "TP_SIZE"));
    /* the code set a size: the variables fill the others, as ParallelismConfig(tp_size=8) does */
    unsetenv("ACCELERATE_USE_PARALLELISM_CONFIG");
    o = accel_accelerator_opts_default();
    o.parallelism.tp_size = 8;
    CHECK(read_env(&o, &pe) == ACCEL_OK && p->dp_replicate_size == 2 && p->tp_size == 8);
    /* 1 is every size's default: it sets nothing (the launcher exports all of them) */
    clear_env();
    setenv("ACCELERATE_USE_PARALLELISM_CONFIG", "yes", 1);
    setenv("PARALLELISM_CONFIG_TP_SIZE", "1", 1);
    o = accel_accelerator_opts_default();
    CHECK(read_env(&o, &pe) == ACCEL_OK && p->tp_size == 0 && !pe.from[0]);
    clear_env();
}

static void test_parallelism_config_refusals(void) {
    clear_env();
    setenv("ACCELERATE_USE_PARALLELISM_CONFIG", "maybe", 1);
    refused("ACCELERATE_USE_PARALLELISM_CONFIG=maybe is not a boolean");
    setenv("ACCELERATE_USE_PARALLELISM_CONFIG", "true", 1);
    static const bad_var BAD[] = {
        {"PARALLELISM_CONFIG_TP_SIZE", "0", "PARALLELISM_CONFIG_TP_SIZE='0' is not a size"},
        {"PARALLELISM_CONFIG_TP_SIZE", "-2", "PARALLELISM_CONFIG_TP_SIZE='-2' is not a size"},
        {"PARALLELISM_CONFIG_TP_SIZE", "x", "PARALLELISM_CONFIG_TP_SIZE='x' is not a size"},
        {"PARALLELISM_CONFIG_TP_SIZE", "", "PARALLELISM_CONFIG_TP_SIZE='' is not a size"},
        {"PARALLELISM_CONFIG_TP_SIZE", " 2", "PARALLELISM_CONFIG_TP_SIZE=' 2' is not a size"},
        {"PARALLELISM_CONFIG_TP_SIZE", "2.0", "PARALLELISM_CONFIG_TP_SIZE='2.0' is not a size"},
        {"PARALLELISM_CONFIG_TP_SIZE", "1048577", "PARALLELISM_CONFIG_TP_SIZE='1048577' is not a size"},
        {"ACCEL_PARALLELISM_CONFIG_DP_SHARD_SIZE", "two", "ACCEL_PARALLELISM_CONFIG_DP_SHARD_SIZE='two' is not a size"},
        {"PARALLELISM_CONFIG_CP_COMM_STRATEGY", "ring",
         "PARALLELISM_CONFIG_CP_COMM_STRATEGY='ring' must be 'allgather' or 'alltoall'"},
        {"PARALLELISM_CONFIG_CP_BACKEND", "deepspeed", "PARALLELISM_CONFIG_CP_BACKEND='deepspeed' must be 'torch'"},
        {"PARALLELISM_CONFIG_SP_BACKEND", "torch", "PARALLELISM_CONFIG_SP_BACKEND='torch' must be 'deepspeed'"},
    };
    refused_each(BAD, sizeof BAD / sizeof *BAD);
    clear_env();
}

static void test_megatron_vars(void) {
    clear_env();
    setenv("MEGATRON_LM_TP_DEGREE", "2", 1);
    setenv("MEGATRON_LM_PP_DEGREE", "3", 1);
    setenv("MEGATRON_LM_NUM_MICRO_BATCHES", "4", 1);
    setenv("MEGATRON_LM_SEQUENCE_PARALLELISM", "True", 1);
    setenv("MEGATRON_LM_RECOMPUTE_ACTIVATIONS", "true", 1);
    setenv("MEGATRON_LM_USE_DISTRIBUTED_OPTIMIZER", "on", 1);
    accel_accelerator_opts o = accel_accelerator_opts_default();
    const accel_parallelism_opts *p = &o.parallelism;
    accel__parallelism_env pe;
    CHECK(read_env(&o, &pe) == ACCEL_OK && p->tp_size == 0 && o.zero_stage == 0 && !pe.megatron); /* not asked for */
    setenv("ACCELERATE_USE_MEGATRON_LM", "true", 1);
    CHECK_MSG(read_env(&o, &pe) == ACCEL_OK, "%s", accel_last_error());
    CHECK(pe.megatron && pe.recompute_activations);
    CHECK(p->tp_size == 2 && p->pp_size == 3 && p->num_micro_batches == 4 && p->sequence_parallelism == ACCEL_TRUE);
    CHECK(o.zero_stage == 1);             /* the distributed optimizer: ZeRO-1 */
    CHECK(o.gradient_clipping == 1.0);    /* MegatronLMPlugin's default */
    CHECK_STR_CONTAINS(pe.from, "MEGATRON_LM_TP_DEGREE=2, MEGATRON_LM_PP_DEGREE=3");
    CHECK_STR_CONTAINS(pe.from, "MEGATRON_LM_SEQUENCE_PARALLELISM=True");
    setenv("MEGATRON_LM_GRADIENT_CLIPPING", "0.5", 1);
    setenv("ACCEL_MEGATRON_LM_PP_DEGREE", "5", 1);
    o = accel_accelerator_opts_default();
    CHECK(read_env(&o, &pe) == ACCEL_OK && o.gradient_clipping == 0.5 && p->pp_size == 5);
    /* what Python's float() takes (MegatronLMPlugin reads it so): blanks around it, '_' between digits */
    static const struct {
        const char *text;
        double norm;
    } FLOATS[] = {{" 1.5\n", 1.5}, {"1_000", 1000}, {"1e3", 1000}, {"2.", 2}, {".25", 0.25}, {"+1_0.5_0e0_1", 105}};
    for (size_t i = 0; i < sizeof FLOATS / sizeof *FLOATS; i++) {
        setenv("MEGATRON_LM_GRADIENT_CLIPPING", FLOATS[i].text, 1);
        o = accel_accelerator_opts_default();
        CHECK_MSG(read_env(&o, &pe) == ACCEL_OK && o.gradient_clipping == FLOATS[i].norm, "'%s': %s", FLOATS[i].text,
                  accel_last_error());
        accel_clear_error();
    }
    setenv("MEGATRON_LM_GRADIENT_CLIPPING", "0.5", 1);
    /* the code's fields win */
    o = accel_accelerator_opts_default();
    o.zero_stage = 2;
    o.gradient_clipping = 3;
    o.parallelism.tp_size = 4;
    o.parallelism.sequence_parallelism = ACCEL_FALSE;
    CHECK(read_env(&o, &pe) == ACCEL_OK && o.zero_stage == 2 && o.gradient_clipping == 3 && p->tp_size == 4 &&
          p->sequence_parallelism == ACCEL_FALSE);
    /* false: none of them */
    setenv("MEGATRON_LM_SEQUENCE_PARALLELISM", "false", 1);
    setenv("MEGATRON_LM_RECOMPUTE_ACTIVATIONS", "0", 1);
    setenv("MEGATRON_LM_USE_DISTRIBUTED_OPTIMIZER", "no", 1);
    setenv("MEGATRON_LM_GRADIENT_CLIPPING", "0", 1);
    o = accel_accelerator_opts_default();
    CHECK(read_env(&o, &pe) == ACCEL_OK && !p->sequence_parallelism && !pe.recompute_activations && !o.zero_stage &&
          o.gradient_clipping == 0);
    clear_env();
}

static void test_megatron_refusals(void) {
    clear_env();
    setenv("ACCELERATE_USE_MEGATRON_LM", "true", 1);
    static const bad_var BAD[] = {
        {"MEGATRON_LM_PP_DEGREE", "0", "MEGATRON_LM_PP_DEGREE='0' is not a size"},
        {"MEGATRON_LM_NUM_MICRO_BATCHES", "many", "MEGATRON_LM_NUM_MICRO_BATCHES='many' is not a size"},
        {"MEGATRON_LM_RECOMPUTE_ACTIVATIONS", "sometimes", "MEGATRON_LM_RECOMPUTE_ACTIVATIONS=sometimes is not a boolean"},
        {"MEGATRON_LM_GRADIENT_CLIPPING", "-1", "MEGATRON_LM_GRADIENT_CLIPPING='-1' is not a gradient norm"},
        {"MEGATRON_LM_GRADIENT_CLIPPING", "nan", "MEGATRON_LM_GRADIENT_CLIPPING='nan' is not a gradient norm"},
        {"MEGATRON_LM_GRADIENT_CLIPPING", "inf", "MEGATRON_LM_GRADIENT_CLIPPING='inf' is not a gradient norm"},
        {"MEGATRON_LM_GRADIENT_CLIPPING", "", "MEGATRON_LM_GRADIENT_CLIPPING='' is not a gradient norm"},
        {"MEGATRON_LM_GRADIENT_CLIPPING", "1.0x", "MEGATRON_LM_GRADIENT_CLIPPING='1.0x' is not a gradient norm"},
        /* Python's float() refuses these, though strtod takes the hex ones */
        {"MEGATRON_LM_GRADIENT_CLIPPING", "0x10", "MEGATRON_LM_GRADIENT_CLIPPING='0x10' is not a gradient norm"},
        {"MEGATRON_LM_GRADIENT_CLIPPING", "0x1p3", "MEGATRON_LM_GRADIENT_CLIPPING='0x1p3' is not a gradient norm"},
        {"MEGATRON_LM_GRADIENT_CLIPPING", "1__0", "MEGATRON_LM_GRADIENT_CLIPPING='1__0' is not a gradient norm"},
        {"MEGATRON_LM_GRADIENT_CLIPPING", "1_", "MEGATRON_LM_GRADIENT_CLIPPING='1_' is not a gradient norm"},
        {"MEGATRON_LM_GRADIENT_CLIPPING", "1e", "MEGATRON_LM_GRADIENT_CLIPPING='1e' is not a gradient norm"},
        {"MEGATRON_LM_GRADIENT_CLIPPING", " ", "MEGATRON_LM_GRADIENT_CLIPPING=' ' is not a gradient norm"},
        {"MEGATRON_LM_GRADIENT_CLIPPING", "INFINITY", "MEGATRON_LM_GRADIENT_CLIPPING='INFINITY' is not a gradient norm"},
    };
    refused_each(BAD, sizeof BAD / sizeof *BAD);
    setenv("MEGATRON_LM_GRADIENT_CLIPPING", "1.0", 1);
    setenv("ACCEL_GRADIENT_CLIPPING", "2", 1);
    refused("MEGATRON_LM_GRADIENT_CLIPPING='1.0' and ACCEL_GRADIENT_CLIPPING='2' disagree");
    unsetenv("MEGATRON_LM_GRADIENT_CLIPPING"); /* Megatron's default gives way to the launcher's clipping */
    accel_accelerator_opts o = accel_accelerator_opts_default();
    accel__parallelism_env pe;
    CHECK(read_env(&o, &pe) == ACCEL_OK && o.gradient_clipping == 0);
    unsetenv("ACCEL_GRADIENT_CLIPPING");
    /* so does it to a DeepSpeed config's; an explicit one beside it is refused */
    setenv("ACCEL_DEEPSPEED_CONFIG_FILE", "/nonexistent/ds.json", 1);
    o = accel_accelerator_opts_default();
    CHECK(read_env(&o, &pe) == ACCEL_OK && o.gradient_clipping == 0);
    setenv("MEGATRON_LM_GRADIENT_CLIPPING", "0.5", 1);
    refused("MEGATRON_LM_GRADIENT_CLIPPING='0.5' and the DeepSpeed config (ACCEL_DEEPSPEED_CONFIG_FILE) both set");
    unsetenv("ACCEL_DEEPSPEED_CONFIG_FILE");
    setenv("ACCEL_GRADIENT_CLIPPING", "lots", 1);
    refused("ACCEL_GRADIENT_CLIPPING='lots' is not a number >= 0");
    setenv("ACCEL_GRADIENT_CLIPPING", "0x10", 1); /* Python's float() refuses hex: strtod took it as 16 */
    refused("ACCEL_GRADIENT_CLIPPING='0x10' is not a number >= 0");
    setenv("ACCEL_GRADIENT_CLIPPING", " 2_0\t", 1); /* and takes blanks around and '_' between digits: 20 */
    setenv("MEGATRON_LM_GRADIENT_CLIPPING", "20", 1);
    o = accel_accelerator_opts_default();
    CHECK_MSG(read_env(&o, &pe) == ACCEL_OK && o.gradient_clipping == 20, "%s", accel_last_error());
    unsetenv("ACCEL_GRADIENT_CLIPPING");
    unsetenv("MEGATRON_LM_GRADIENT_CLIPPING");
    setenv("MEGATRON_LM_USE_DISTRIBUTED_OPTIMIZER", "true", 1);
    setenv("ACCEL_ZERO_STAGE", "3", 1);
    refused("MEGATRON_LM_USE_DISTRIBUTED_OPTIMIZER=true (ZeRO-1 over the data-parallel ranks) and ACCEL_ZERO_STAGE "
            "both choose the sharding");
    unsetenv("ACCEL_ZERO_STAGE");
    /* tp from both: the same size is one size; different sizes are refused naming both */
    setenv("ACCELERATE_USE_PARALLELISM_CONFIG", "true", 1);
    setenv("PARALLELISM_CONFIG_TP_SIZE", "2", 1);
    setenv("MEGATRON_LM_TP_DEGREE", "2", 1);
    o = accel_accelerator_opts_default();
    CHECK(read_env(&o, &pe) == ACCEL_OK && o.parallelism.tp_size == 2);
    setenv("MEGATRON_LM_TP_DEGREE", "4", 1);
    refused("PARALLELISM_CONFIG_TP_SIZE=2 and MEGATRON_LM_TP_DEGREE=4 disagree on the tensor-parallel size");
    setenv("ACCEL_MEGATRON_LM_TP_DEGREE", "8", 1);
    refused("PARALLELISM_CONFIG_TP_SIZE=2 and ACCEL_MEGATRON_LM_TP_DEGREE=8 disagree");
    clear_env();
}

/* The mesh's product, one computation for the options and the variables
 * (parallelism.c): sizes that multiply past what an int holds are refused as
 * such however they arrive (never multiplied in a type they overflow), the
 * others named against the world. */
static void test_mesh_product(void) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    accel__parallelism par;
    o.parallelism = (accel_parallelism_opts){.dp_replicate_size = 1 << 30, .dp_shard_size = 1 << 30, .tp_size = 1 << 30};
    accel_clear_error();
    CHECK(accel__parallelism_config(&o, 4, &par) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "the sizes multiply to 1.24e+27, more than the 4 processes of the job");
    o.parallelism = (accel_parallelism_opts){.dp_shard_size = 2, .tp_size = 3};
    CHECK(accel__parallelism_config(&o, 4, &par) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "dp_shard_size 2 x cp_size 1 x tp_size 3 = 6, not the 4 processes of the job");
    o.parallelism = (accel_parallelism_opts){.dp_shard_size = 2, .tp_size = 2};
    CHECK_MSG(accel__parallelism_config(&o, 4, &par) == ACCEL_OK, "%s", accel_last_error());
    CHECK(par.set && par.size[ACCEL__MESH_DP_SHARD] == 2 && par.size[ACCEL__MESH_TP] == 2);
    /* Megatron's data-parallel size from the same product: what tp x pp leave of 8 */
    clear_env();
    setenv("ACCELERATE_USE_MEGATRON_LM", "true", 1);
    setenv("MEGATRON_LM_TP_DEGREE", "2", 1);
    o = accel_accelerator_opts_default();
    accel__parallelism_env pe;
    CHECK(read_env(&o, &pe) == ACCEL_OK);
    CHECK_MSG(accel__parallelism_env_resolve(&o, &pe, 8, &par) == ACCEL_OK, "%s", accel_last_error());
    CHECK(par.size[ACCEL__MESH_DP_SHARD] == 4 && par.size[ACCEL__MESH_TP] == 2);
    clear_env();
}

/* ---------------------------------------------------------------- end to end, 2 processes */

static int g_case;

/* The mesh the variables asked for is laid out (acc->par) or refused naming
 * the field, its value and the variable; a dimension another issue builds
 * may be either, never silently something else. */
static void tp_arrived(accel_accelerator *acc, const char *var) {
    if (acc) {
        CHECK(acc->par.size[ACCEL__MESH_TP] == 2);
        return;
    }
    CHECK_STR_CONTAINS(accel_last_error(), "tp_size = 2");
    CHECK_STR_CONTAINS(accel_last_error(), var);
}

static int e2e_body(int rank, int world) {
    (void)world;
    int failed_before = check_failures_; /* the parent's, inherited */
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.mixed_precision = "no";
    if (g_case == 0) { /* HSDP's replicas from the launcher's variables */
        setenv("ACCELERATE_USE_PARALLELISM_CONFIG", "true", 1);
        setenv("PARALLELISM_CONFIG_DP_REPLICATE_SIZE", "2", 1);
        setenv("PARALLELISM_CONFIG_DP_SHARD_SIZE", "1", 1);
        accel_accelerator *acc = accel_accelerator_new(&o);
        CHECK_MSG(acc != NULL, "rank %d: %s", rank, accel_last_error());
        if (acc) CHECK(acc->par.set && acc->par.size[ACCEL__MESH_DP_REPLICATE] == 2);
        accel_accelerator_free(acc);
        setenv("PARALLELISM_CONFIG_DP_SHARD_SIZE", "2", 1); /* 2 x 2 on 2 processes */
        acc = accel_accelerator_new(&o);
        CHECK(acc == NULL);
        /* the mesh's own message (parallelism.c), then the variables */
        CHECK_STR_CONTAINS(accel_last_error(), "dp_shard_size 2");
        CHECK_STR_CONTAINS(accel_last_error(), " (set from the environment: PARALLELISM_CONFIG_DP_REPLICATE_SIZE=2, "
                                               "PARALLELISM_CONFIG_DP_SHARD_SIZE=2)");
        unsetenv("PARALLELISM_CONFIG_DP_REPLICATE_SIZE");
        unsetenv("PARALLELISM_CONFIG_DP_SHARD_SIZE");
        setenv("PARALLELISM_CONFIG_TP_SIZE", "2", 1);
        acc = accel_accelerator_new(&o);
        tp_arrived(acc, "(set from the environment: PARALLELISM_CONFIG_TP_SIZE=2)");
        accel_accelerator_free(acc);
    } else if (g_case == 1) { /* Megatron: ZeRO-1 over the data-parallel ranks, clipping, recomputation */
        setenv("ACCELERATE_USE_MEGATRON_LM", "true", 1);
        setenv("MEGATRON_LM_USE_DISTRIBUTED_OPTIMIZER", "true", 1);
        setenv("MEGATRON_LM_RECOMPUTE_ACTIVATIONS", "true", 1);
        setenv("MEGATRON_LM_GRADIENT_CLIPPING", "0.25", 1);
        accel_accelerator *acc = accel_accelerator_new(&o);
        CHECK_MSG(acc != NULL, "rank %d: %s", rank, accel_last_error());
        if (acc) {
            CHECK(accel_accelerator_zero_stage(acc) == 1 && acc->shard_world == 2);
            CHECK(accel_accelerator_gradient_clipping(acc) == 0.25);
            accel_module *m = tiny_llama(1);
            CHECK(accel_accelerator_prepare_model(acc, m) == ACCEL_OK);
            for (int l = 0; l < 2; l++) {
                char name[32];
                snprintf(name, sizeof name, "model.layers.%d", l);
                accel_module *layer = accel_module_find(m, name);
                CHECK_MSG(layer && layer->gradient_checkpointing, "%s not checkpointed", name);
            }
            accel_accelerator_free(acc);
            accel_module_free(m);
        }
        /* the tensor-parallel degree: the data-parallel size is what it leaves (1 here) */
        setenv("MEGATRON_LM_TP_DEGREE", "2", 1);
        acc = accel_accelerator_new(&o);
        tp_arrived(acc, "(set from the environment: MEGATRON_LM_TP_DEGREE=2)");
        accel_accelerator_free(acc);
        setenv("MEGATRON_LM_TP_DEGREE", "3", 1); /* does not divide the world */
        acc = accel_accelerator_new(&o);
        CHECK(acc == NULL);
        CHECK_STR_CONTAINS(accel_last_error(), "tp_size 3");
        CHECK_STR_CONTAINS(accel_last_error(), " (set from the environment: MEGATRON_LM_TP_DEGREE=3)");
    }
    accel_dist_finalize();
    accel_thread_cleanup();
    return check_failures_ > failed_before ? 1 : 0;
}

static void test_end_to_end(void) {
    clear_env();
    for (g_case = 0; g_case < 2; g_case++) {
        dist_group g = {.world = 2, .timeout = "30"};
        CHECK(dist_group_runs_ok(&g, e2e_body, "case %d", g_case));
    }
}

int main(void) {
    RUN(test_parallelism_config_vars);
    RUN(test_parallelism_config_refusals);
    RUN(test_megatron_vars);
    RUN(test_megatron_refusals);
    RUN(test_mesh_product);
    RUN(test_end_to_end);
    return check_summary();
}
