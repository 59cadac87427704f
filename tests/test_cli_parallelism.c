/* ParallelismConfig and Megatron-LM in the CLI: `accel launch`'s
 * --use_parallelism_config / --parallelism_config_* and --use_megatron_lm /
 * --megatron_lm_* flags and the config's parallelism_config /
 * megatron_lm_config reach the workers as Accelerate exports them (and as
 * ACCEL_*), bad values and meshes are refused naming the flag or key, the
 * workers' Accelerator gets the mesh (or names it in its refusal), `accel
 * config update` keeps the sections, `accel env` prints the mesh, `accel
 * estimate-memory` counts a rank of a mesh. Runs
 * build/bin/accel and build/bin/test_dist_faults next to itself. */
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "accel/core.h"
#include "check.h"
#include "cli_run.h"
#include "sibling_exe.h"

static char ACCEL[PATH_MAX + 32], WORKER[PATH_MAX + 32], TMP[PATH_MAX];
static char OUT[1 << 17], ERR[1 << 16];

static const char *write_file(const char *name, const char *text) {
    static char path[4][PATH_MAX + 32];
    static int next;
    char *p = path[next++ % 4];
    snprintf(p, PATH_MAX + 32, "%s/%s", TMP, name);
    FILE *f = fopen(p, "w");
    fputs(text, f);
    fclose(f);
    return p;
}

static const cli_io IO = {TMP, OUT, ERR, sizeof OUT, sizeof ERR};

/* Runs accel with args (NULL-terminated) and extra "K=V" env entries; stdout/stderr into OUT/ERR. */
static int run(const char *const *args, const char *const *env) { return cli_run(&IO, ACCEL, args, env, NULL); }

/* run with these answers on stdin (`accel config`'s questions). */
static int run_answering(const char *const *args, const char *answers) {
    return cli_run(&IO, ACCEL, args, NULL, write_file("in", answers));
}

static void all_in_out(const char *const *want, size_t n) {
    for (size_t i = 0; i < n; i++) CHECK_STR_CONTAINS(OUT, want[i]);
}

static void test_parallelism_flags_env(void) {
    const char *a[] = {"launch", "--num_processes", "4", "--use_parallelism_config",
                       "--parallelism_config_dp_shard_size", "2", "--parallelism_config-cp-size=2",
                       "--parallelism_config_cp_comm_strategy", "alltoall", "/usr/bin/env", NULL};
    const char *stale[] = {"ACCEL_PARALLELISM_CONFIG_CP_SIZE=8", NULL}; /* the flag beats the caller's */
    CHECK(run(a, stale) == 0);
    const char *want[] = {"ACCELERATE_USE_PARALLELISM_CONFIG=true\n", "PARALLELISM_CONFIG_DP_REPLICATE_SIZE=1\n",
                          "PARALLELISM_CONFIG_DP_SHARD_SIZE=2\n", "PARALLELISM_CONFIG_TP_SIZE=1\n",
                          "PARALLELISM_CONFIG_CP_SIZE=2\n", "PARALLELISM_CONFIG_CP_BACKEND=torch\n",
                          "PARALLELISM_CONFIG_CP_COMM_STRATEGY=alltoall\n", "PARALLELISM_CONFIG_SP_SIZE=1\n",
                          "PARALLELISM_CONFIG_SP_BACKEND=deepspeed\n", "ACCEL_USE_PARALLELISM_CONFIG=true\n",
                          "ACCEL_PARALLELISM_CONFIG_CP_SIZE=2\n", "ACCEL_PARALLELISM_CONFIG_DP_SHARD_SIZE=2\n"};
    all_in_out(want, sizeof want / sizeof *want);
    CHECK(!strstr(OUT, "=8\n") && !strstr(OUT, "MEGATRON"));
    /* cp_comm_strategy only with cp_size > 1 (prepare_extend_env_parallelism_config) */
    const char *b[] = {"launch", "--num_processes", "2", "--use_parallelism_config",
                       "--parallelism_config_dp_replicate_size", "2", "--parallelism_config_cp_comm_strategy",
                       "alltoall", "/usr/bin/env", NULL};
    CHECK(run(b, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "PARALLELISM_CONFIG_DP_REPLICATE_SIZE=2\n");
    CHECK(!strstr(OUT, "CP_COMM_STRATEGY"));
    /* without --use_parallelism_config nothing is exported, but the flags are still checked,
     * and a size given for nothing is named */
    const char *c[] = {"launch", "--parallelism_config_tp_size", "2", "/usr/bin/env", NULL};
    CHECK(run(c, NULL) == 0);
    CHECK(!strstr(OUT, "PARALLELISM_CONFIG"));
    CHECK_STR_CONTAINS(ERR, "warning: argument --parallelism_config_tp_size (2) is ignored: the parallelism_config "
                            "section is off");
    const char *d[] = {"launch", "--megatron_lm_pp_degree", "2", "/usr/bin/env", NULL};
    CHECK(run(d, NULL) == 0);
    CHECK(!strstr(OUT, "MEGATRON"));
    CHECK_STR_CONTAINS(ERR, "warning: argument --megatron_lm_pp_degree (2) is ignored: the megatron_lm_config section "
                            "is off");
    CHECK(run(a, NULL) == 0 && !strstr(ERR, "is ignored")); /* a section in use: no word */
    /* a switch of the section that is off, beside one that is on: named too (tp ran without its sp) */
    const char *sw[] = {"launch", "--num_processes", "2", "--use_parallelism_config", "--parallelism_config_tp_size",
                        "2", "--megatron_lm_sequence_parallelism", "true", "/usr/bin/env", NULL};
    CHECK(run(sw, NULL) == 0);
    CHECK(!strstr(OUT, "MEGATRON_LM_SEQUENCE_PARALLELISM"));
    CHECK_STR_CONTAINS(ERR, "argument --megatron_lm_sequence_parallelism (true) is ignored");
    /* a size of 1 and a false switch ask for nothing: no word; -q: no word either */
    const char *none[] = {"launch", "--parallelism_config_tp_size", "1", "--megatron_lm_sequence_parallelism", "false",
                          "/usr/bin/env", NULL};
    CHECK(run(none, NULL) == 0 && !strstr(ERR, "is ignored"));
    const char *quiet[] = {"launch", "-q", "--parallelism_config_tp_size", "2", "/usr/bin/env", NULL};
    CHECK(run(quiet, NULL) == 0 && !strstr(ERR, "is ignored"));
}

static void test_megatron_flags_env(void) {
    const char *a[] = {"launch", "--num_processes", "8", "--use_megatron_lm", "--megatron_lm_tp_degree", "2",
                       "--megatron_lm_pp_degree", "2", "--megatron_lm_num_micro_batches", "4",
                       "--megatron_lm_sequence_parallelism", "true", "--megatron_lm_recompute_activations", "True",
                       "--megatron_lm_use_distributed_optimizer", "yes", "--megatron_lm_gradient_clipping", "0.5",
                       "/usr/bin/env", NULL};
    CHECK(run(a, NULL) == 0);
    const char *want[] = {"ACCELERATE_USE_MEGATRON_LM=true\n", "MEGATRON_LM_TP_DEGREE=2\n", "MEGATRON_LM_PP_DEGREE=2\n",
                          "MEGATRON_LM_NUM_MICRO_BATCHES=4\n", "MEGATRON_LM_SEQUENCE_PARALLELISM=true\n",
                          "MEGATRON_LM_RECOMPUTE_ACTIVATIONS=True\n", "MEGATRON_LM_USE_DISTRIBUTED_OPTIMIZER=yes\n",
                          "MEGATRON_LM_GRADIENT_CLIPPING=0.5\n", "ACCEL_USE_MEGATRON_LM=true\n",
                          "ACCEL_MEGATRON_LM_TP_DEGREE=2\n"};
    all_in_out(want, sizeof want / sizeof *want);
    CHECK(!strstr(OUT, "PARALLELISM_CONFIG"));
    /* defaults: the degrees 1 and clipping 1.0 always, the rest only when given */
    const char *b[] = {"launch", "--use_megatron_lm", "/usr/bin/env", NULL};
    CHECK(run(b, NULL) == 0);
    const char *dflt[] = {"MEGATRON_LM_TP_DEGREE=1\n", "MEGATRON_LM_PP_DEGREE=1\n", "MEGATRON_LM_GRADIENT_CLIPPING=1.0\n"};
    all_in_out(dflt, sizeof dflt / sizeof *dflt);
    CHECK(!strstr(OUT, "NUM_MICRO_BATCHES") && !strstr(OUT, "SEQUENCE_PARALLELISM") &&
          !strstr(OUT, "RECOMPUTE_ACTIVATIONS"));
    /* what argparse's float() takes: blanks around, '_' between digits; exported as str(float(v)) */
    const char *c[] = {"launch", "--use_megatron_lm", "--megatron_lm_gradient_clipping", " 2_5\t", "/usr/bin/env", NULL};
    CHECK(run(c, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "MEGATRON_LM_GRADIENT_CLIPPING=25.0\n");
}

/* Accelerate's argparse refusals, and the values its dataclasses refuse later, named at launch. */
static void test_flag_errors(void) {
    static const char *const BAD[][3] = {
        {"--parallelism_config_tp_size", "two", "argument --parallelism_config_tp_size: invalid int value: 'two'"},
        {"--parallelism_config_dp_shard_size", "0", "argument --parallelism_config_dp_shard_size: '0' is not a size"},
        {"--parallelism_config_sp_size", "-1", "argument --parallelism_config_sp_size: '-1' is not a size"},
        {"--parallelism_config_cp_comm_strategy", "ring",
         "argument --parallelism_config_cp_comm_strategy: invalid choice: 'ring' (choose from 'allgather', 'alltoall')"},
        {"--parallelism_config_cp_backend", "deepspeed",
         "argument --parallelism_config_cp_backend: invalid choice: 'deepspeed' (choose from 'torch')"},
        {"--megatron_lm_pp_degree", "0", "argument --megatron_lm_pp_degree: '0' is not a size"},
        {"--megatron_lm_num_micro_batches", "x", "argument --megatron_lm_num_micro_batches: invalid int value: 'x'"},
        {"--megatron_lm_recompute_activations", "maybe",
         "argument --megatron_lm_recompute_activations: invalid str_to_bool value: 'maybe'"},
        {"--megatron_lm_gradient_clipping", "-1", "argument --megatron_lm_gradient_clipping: '-1.0' is not a gradient norm"},
        {"--megatron_lm_gradient_clipping", "inf", "argument --megatron_lm_gradient_clipping: 'inf' is not a gradient norm"},
        /* argparse's float() refuses hex (strtod took it) and a '_' not between two digits */
        {"--megatron_lm_gradient_clipping", "0x10", "argument --megatron_lm_gradient_clipping: invalid float value: '0x10'"},
        {"--megatron_lm_gradient_clipping", "1_", "argument --megatron_lm_gradient_clipping: invalid float value: '1_'"},
    };
    for (size_t i = 0; i < sizeof BAD / sizeof *BAD; i++) {
        const char *a[] = {"launch", i % 2 ? "--use_megatron_lm" : "--use_parallelism_config", BAD[i][0], BAD[i][1],
                           "/usr/bin/env", NULL};
        CHECK_MSG(run(a, NULL) == 2, "%s %s accepted", BAD[i][0], BAD[i][1]);
        CHECK_STR_CONTAINS(ERR, BAD[i][2]);
        CHECK(!strstr(OUT, "RANK="));
    }
}

/* The mesh against --num_processes, before any worker starts. */
static void test_mesh_errors(void) {
    const char *a[] = {"launch", "--num_processes", "4", "--use_parallelism_config",
                       "--parallelism_config_dp_shard_size", "3", "/usr/bin/env", NULL};
    CHECK(run(a, NULL) == 2);
    CHECK_STR_CONTAINS(ERR, "--parallelism_config_dp_replicate_size 1 x --parallelism_config_dp_shard_size 3 x "
                            "--parallelism_config_tp_size 1 x --parallelism_config_cp_size 1 x "
                            "--parallelism_config_sp_size 1 = 3, not --num_processes 4");
    const char *b[] = {"launch", "--num_processes", "4", "--use_megatron_lm", "--megatron_lm_tp_degree", "3",
                       "/usr/bin/env", NULL};
    CHECK(run(b, NULL) == 2);
    CHECK_STR_CONTAINS(ERR, "--megatron_lm_tp_degree 3 x --megatron_lm_pp_degree 1 = 3 does not divide "
                            "--num_processes 4");
    const char *c[] = {"launch", "--num_processes", "4", "--use_megatron_lm", "--use_parallelism_config",
                       "--megatron_lm_tp_degree", "4", "--parallelism_config_tp_size", "2", "/usr/bin/env", NULL};
    CHECK(run(c, NULL) == 2);
    CHECK_STR_CONTAINS(ERR, "--parallelism_config_tp_size 2 and --megatron_lm_tp_degree 4 disagree on the "
                            "tensor-parallel size");
    /* Megatron's pipeline with explicit data-parallel sizes: their product */
    const char *d[] = {"launch", "--num_processes", "4", "--use_megatron_lm", "--megatron_lm_pp_degree", "2",
                       "--use_parallelism_config", "--parallelism_config_dp_shard_size", "3", "/usr/bin/env", NULL};
    CHECK(run(d, NULL) == 2);
    CHECK_STR_CONTAINS(ERR, "x --megatron_lm_pp_degree 2 = 6, not --num_processes 4");
    /* all 1: the default mesh (Accelerate's total_size 1); Megatron's tp 2 on 4: dp 2 */
    const char *e[] = {"launch", "--num_processes", "2", "--use_parallelism_config", "/bin/true", NULL};
    CHECK(run(e, NULL) == 0);
    const char *f[] = {"launch", "--num_processes", "4", "--use_megatron_lm", "--megatron_lm_tp_degree", "2",
                       "/bin/true", NULL};
    CHECK(run(f, NULL) == 0);
}

/* The config's sections as Accelerate's wizard writes them: flags win,
 * distributed_type MEGATRON_LM turns Megatron on, a non-empty
 * parallelism_config the parallelism config, unless a paradigm flag was given. */
static void test_config_sections(void) {
    const char *cfg = write_file("pc.yaml", "compute_environment: LOCAL_MACHINE\ndistributed_type: MEGATRON_LM\n"
                                 "num_processes: 4\nmegatron_lm_config:\n  megatron_lm_tp_degree: 2\n"
                                 "  megatron_lm_pp_degree: 1\n  megatron_lm_sequence_parallelism: true\n"
                                 "  megatron_lm_recompute_activations: true\n"
                                 "  megatron_lm_use_distributed_optimizer: true\n"
                                 "  megatron_lm_gradient_clipping: 1.0\nparallelism_config:\n"
                                 "  parallelism_config_dp_shard_size: 2\n  parallelism_config_tp_size: 2\n"
                                 "  parallelism_config_cp_size: 1\n");
    const char *a[] = {"launch", "--config_file", cfg, "--megatron_lm_gradient_clipping", "2", "/usr/bin/env", NULL};
    CHECK(run(a, NULL) == 0);
    const char *want[] = {"ACCELERATE_USE_MEGATRON_LM=true\n", "MEGATRON_LM_TP_DEGREE=2\n",
                          "MEGATRON_LM_SEQUENCE_PARALLELISM=True\n", "MEGATRON_LM_RECOMPUTE_ACTIVATIONS=True\n",
                          "MEGATRON_LM_USE_DISTRIBUTED_OPTIMIZER=True\n", "MEGATRON_LM_GRADIENT_CLIPPING=2.0\n",
                          "ACCELERATE_USE_PARALLELISM_CONFIG=true\n", "PARALLELISM_CONFIG_DP_SHARD_SIZE=2\n",
                          "PARALLELISM_CONFIG_TP_SIZE=2\n", "WORLD_SIZE=4\n"};
    all_in_out(want, sizeof want / sizeof *want);
    /* a paradigm flag: the config's distributed_type and parallelism_config are not used */
    const char *b[] = {"launch", "--config_file", cfg, "--use_fsdp", "/usr/bin/env", NULL};
    CHECK(run(b, NULL) == 0);
    CHECK(!strstr(OUT, "MEGATRON_LM_") && !strstr(OUT, "PARALLELISM_CONFIG_"));
    CHECK_STR_CONTAINS(OUT, "ACCELERATE_USE_FSDP=true\n");
    /* ... and their keys are named as the config's, not as flags never given */
    CHECK_STR_CONTAINS(ERR, "config key megatron_lm_config.megatron_lm_tp_degree (2) is ignored");
    CHECK_STR_CONTAINS(ERR, "config key parallelism_config.parallelism_config_tp_size (2) is ignored");
    CHECK(!strstr(ERR, "argument --megatron_lm_tp_degree"));
    /* keys and types checked, naming the key */
    static const char *const BAD[][2] = {
        {"distributed_type: MEGATRON_LM\nmegatron_lm_config:\n  megatron_lm_tp_degre: 2\n",
         "unknown key `megatron_lm_config.megatron_lm_tp_degre` (accel knows: megatron_lm_tp_degree,"},
        {"distributed_type: MEGATRON_LM\nmegatron_lm_config:\n  megatron_lm_pp_degree: two\n",
         "bad value for `megatron_lm_config.megatron_lm_pp_degree`: 'two' (expected an integer)"},
        {"distributed_type: MEGATRON_LM\nmegatron_lm_config:\n  megatron_lm_recompute_activations: sometimes\n",
         "bad value for `megatron_lm_config.megatron_lm_recompute_activations`: 'sometimes' (expected true or false)"},
        {"distributed_type: MULTI_CPU\nparallelism_config:\n  tp_size: 2\n",
         "unknown key `parallelism_config.tp_size`"},
        {"distributed_type: MULTI_CPU\nparallelism_config:\n  parallelism_config_cp_comm_strategy: ring\n",
         "bad value for `parallelism_config.parallelism_config_cp_comm_strategy`: 'ring'"},
        {"distributed_type: MULTI_CPU\nnum_processes: 2\nparallelism_config:\n  parallelism_config_tp_size: 0\n",
         "config key parallelism_config.parallelism_config_tp_size: '0' is not a size"},
        {"distributed_type: MULTI_CPU\nnum_processes: 2\nparallelism_config:\n  parallelism_config_tp_size: 4\n",
         "--parallelism_config_tp_size 4 x --parallelism_config_cp_size 1 x --parallelism_config_sp_size 1 = 4, not "
         "--num_processes 2"},
    };
    for (size_t i = 0; i < sizeof BAD / sizeof *BAD; i++) {
        const char *c[] = {"launch", "--config_file", write_file("bad.yaml", BAD[i][0]), "/usr/bin/env", NULL};
        CHECK_MSG(run(c, NULL) == 2, "accepted: %s", BAD[i][0]);
        CHECK_STR_CONTAINS(ERR, BAD[i][1]);
    }
}

/* `accel config update` keeps both sections (sorted, the float a float) and
 * `accel env` prints them and the mesh they lay out. */
static void test_config_round_trip(void) {
    const char *cfg = write_file("rt.yaml", "distributed_type: MEGATRON_LM\nnum_processes: 8\nmegatron_lm_config:\n"
                                 "  megatron_lm_tp_degree: 2\n  megatron_lm_pp_degree: 2\n"
                                 "  megatron_lm_num_micro_batches: 4\n  megatron_lm_gradient_clipping: 1.0\n"
                                 "  megatron_lm_use_distributed_optimizer: true\n");
    const char *u[] = {"config", "update", "--config_file", cfg, NULL};
    CHECK(run(u, NULL) == 0);
    char buf[4096];
    cli_slurp(cfg, buf, sizeof buf);
    CHECK_MSG(!strcmp(buf, "compute_environment: LOCAL_MACHINE\ndebug: false\ndistributed_type: MEGATRON_LM\n"
                           "enable_cpu_affinity: false\nmegatron_lm_config:\n  megatron_lm_gradient_clipping: 1.0\n"
                           "  megatron_lm_num_micro_batches: 4\n  megatron_lm_pp_degree: 2\n"
                           "  megatron_lm_tp_degree: 2\n  megatron_lm_use_distributed_optimizer: true\n"
                           "num_processes: 8\nuse_cpu: false\n"),
              "%s", buf);
    CHECK(run(u, NULL) == 0); /* a fixed point */
    char again[4096];
    cli_slurp(cfg, again, sizeof again);
    CHECK(!strcmp(buf, again));
    const char *e[] = {"env", "--config_file", cfg, NULL};
    CHECK(run(e, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "\t- megatron_lm_config: {'megatron_lm_gradient_clipping': 1.0, "
                            "'megatron_lm_num_micro_batches': 4, 'megatron_lm_pp_degree': 2, "
                            "'megatron_lm_tp_degree': 2, 'megatron_lm_use_distributed_optimizer': True}\n");
    CHECK_STR_CONTAINS(OUT, "\t- mesh: pp 2 x dp_replicate 1 x dp_shard 2 x cp 1 x tp 2\n");
    const char *pc = write_file("hsdp.yaml", "distributed_type: MULTI_CPU\nnum_processes: 4\nparallelism_config:\n"
                                "  parallelism_config_dp_replicate_size: 2\n  parallelism_config_dp_shard_size: 2\n");
    const char *e2[] = {"env", "--config_file", pc, NULL};
    CHECK(run(e2, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "\t- mesh: pp 1 x dp_replicate 2 x dp_shard 2 x cp 1 x tp 1\n");
    const char *bad = write_file("bad_mesh.yaml", "distributed_type: MEGATRON_LM\nnum_processes: 6\n"
                                 "megatron_lm_config:\n  megatron_lm_tp_degree: 4\n");
    const char *e3[] = {"env", "--config_file", bad, NULL};
    CHECK(run(e3, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "\t- mesh: invalid: --megatron_lm_tp_degree 4 x --megatron_lm_pp_degree 1 = 4 does not "
                            "divide --num_processes 6");
    const char *plain = write_file("plain.yaml", "distributed_type: MULTI_CPU\nnum_processes: 2\n");
    const char *e4[] = {"env", "--config_file", plain, NULL};
    CHECK(run(e4, NULL) == 0);
    CHECK(!strstr(OUT, "mesh:"));
}

/* `accel config` asks cluster.py's questions: Megatron-LM on a multi-GPU
 * machine, the parallelism config under FSDP; the file launches. */
static void test_config_wizard(void) {
    char path[PATH_MAX + 32], buf[4096];
    snprintf(path, sizeof path, "%s/wizard.yaml", TMP);
    const char *a[] = {"config", "--config_file", path, NULL};
    /* This machine, multi-GPU, 1 machine, no debug, no DeepSpeed, no FSDP, Megatron: tp 2, sequence parallelism
     * (default yes), pp 2, 4 micro-batches, recompute (default yes), no distributed optimizer, clipping 0.5; 8 GPUs,
     * all, no mixed precision; the clipping asked again after 0x10, which Python's float() refuses (strtod took
     * it as 16), and 0_0.5 taken as float() takes it */
    CHECK(run_answering(a, "0\nmulti-GPU\n\nno\nno\nno\nyes\n2\n\n2\n4\n\nno\n0x10\n0_0.5\n8\n\nno\n") == 0);
    CHECK_STR_CONTAINS(OUT, "Do you want to use Megatron-LM ? [yes/NO]: ");
    CHECK_STR_CONTAINS(OUT, "(0 to disable)? [1.0]: Please enter a number >= 0.\n");
    cli_slurp(path, buf, sizeof buf);
    CHECK_STR_CONTAINS(buf, "distributed_type: MEGATRON_LM\n");
    CHECK_STR_CONTAINS(buf, "megatron_lm_config:\n  megatron_lm_gradient_clipping: 0.5\n  megatron_lm_num_micro_batches: "
                            "4\n  megatron_lm_pp_degree: 2\n  megatron_lm_recompute_activations: true\n"
                            "  megatron_lm_sequence_parallelism: true\n  megatron_lm_tp_degree: 2\n"
                            "  megatron_lm_use_distributed_optimizer: false\n");
    const char *l[] = {"launch", "--config_file", path, "/usr/bin/env", NULL};
    CHECK(run(l, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "MEGATRON_LM_NUM_MICRO_BATCHES=4\n");
    CHECK_STR_CONTAINS(OUT, "MEGATRON_LM_USE_DISTRIBUTED_OPTIMIZER=False\n");
    /* multi-CPU, FSDP (FULL_SHARD), the parallelism config: 2 x 2 x cp 2 all-to-all on 8 processes */
    CHECK(run_answering(a, "0\nmulti-CPU\n\nno\nno\nno\nyes\n\nyes\n2\n2\n\n2\nalltoall\n8\nno\n") == 0);
    cli_slurp(path, buf, sizeof buf);
    CHECK_STR_CONTAINS(buf, "parallelism_config:\n  parallelism_config_cp_comm_strategy: alltoall\n"
                            "  parallelism_config_cp_size: 2\n  parallelism_config_dp_replicate_size: 2\n"
                            "  parallelism_config_dp_shard_size: 2\n  parallelism_config_tp_size: 1\n");
    const char *e[] = {"env", "--config_file", path, NULL};
    CHECK(run(e, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "\t- mesh: pp 1 x dp_replicate 2 x dp_shard 2 x cp 2 x tp 1\n");
    /* multi-CPU without FSDP: neither question (Accelerate asks Megatron-LM on GPUs only) */
    CHECK(run_answering(a, "0\nmulti-CPU\n\nno\nno\nno\nno\n2\nno\n") == 0);
    CHECK(!strstr(OUT, "Megatron") && !strstr(OUT, "parallelism config"));
}

/* The workers' Accelerator receives what the flags asked for: the mesh is
 * laid out, or refused naming the field, its value and the variable. A
 * dimension not built yet is refused by name; once built it runs. */
static void test_reaches_accelerator(void) {
    const char *a[] = {"launch", "--num_processes", "2", "--use_parallelism_config",
                       "--parallelism_config_dp_replicate_size", "2", WORKER, "accelerator", NULL};
    CHECK(run(a, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "accelerator: ok\naccelerator: ok\n");
    const char *b[] = {"launch", "--num_processes", "2", "--use_megatron_lm", "--megatron_lm_tp_degree", "2",
                       "--megatron_lm_use_distributed_optimizer", "true", "-q", WORKER, "accelerator", NULL};
    if (run(b, NULL) != 0) {
        CHECK_STR_CONTAINS(OUT, "accelerator: accel_accelerator_new: opts.parallelism.tp_size = 2");
        CHECK_STR_CONTAINS(OUT, "(set from the environment: ACCEL_MEGATRON_LM_TP_DEGREE=2)");
    }
    const char *c[] = {"launch", "--num_processes", "2", "--use_megatron_lm", "--megatron_lm_pp_degree", "2",
                       "--megatron_lm_num_micro_batches", "4", "-q", WORKER, "accelerator", NULL};
    if (run(c, NULL) != 0) {
        CHECK_STR_CONTAINS(OUT, "accelerator: accel_accelerator_new: opts.parallelism.pp_size = 2");
        CHECK_STR_CONTAINS(OUT, "ACCEL_MEGATRON_LM_PP_DEGREE=2, ACCEL_MEGATRON_LM_NUM_MICRO_BATCHES=4)");
    }
    const char *d[] = {"launch", "--num_processes", "2", "--use_parallelism_config",
                       "--parallelism_config_cp_size", "2", "--parallelism_config_cp_comm_strategy", "alltoall", "-q",
                       WORKER, "accelerator", NULL};
    if (run(d, NULL) != 0) {
        CHECK_STR_CONTAINS(OUT, "accelerator: accel_accelerator_new: opts.parallelism.cp_size = 2");
        CHECK_STR_CONTAINS(OUT, "ACCEL_PARALLELISM_CONFIG_CP_COMM_STRATEGY=alltoall)");
    }
    /* a bad value the launcher cannot see (the caller's), refused by the worker naming the variable */
    const char *e[] = {"launch", "--num_processes", "1", WORKER, "accelerator", NULL};
    const char *env[] = {"ACCELERATE_USE_MEGATRON_LM=true", "MEGATRON_LM_NUM_MICRO_BATCHES=0", NULL};
    CHECK(run(e, env) != 0);
    CHECK_STR_CONTAINS(OUT, "accelerator: accel_accelerator_new: MEGATRON_LM_NUM_MICRO_BATCHES='0' is not a size");
}

/* `accel estimate-memory` per mesh on the committed 20-layer Llama config
 * (hidden 512, ffn 1024, vocab 32000, untied: 340871168 f32 bytes): a rank of
 * tp 2 x pp 2 holds layers 10-19 at half their weights (5246976 bytes each:
 * the norms whole), half of lm_head (32768000) and the final norm
 * (2048): 85239808 bytes, 81.29 MB; ZeRO shards that over dp_shard 2. */
static void test_estimate_memory_mesh(void) {
    const char *a[] = {"estimate-memory", "data/llama_seed_config", "--tp_size", "2", "--megatron_lm_pp_degree", "2",
                       "--dp_shard_size", "2", NULL};
    CHECK(run(a, NULL) == 0);
    const char *want[] = {"Training using Adam on 8 processes, per rank",
                          "│    DDP (NO_SHARD)    │81.29 MB│ 81.29 MB│162.58 MB│   0 bytes    │325.16 MB│",
                          "│        ZeRO-1        │81.29 MB│ 81.29 MB│ 81.29 MB│   0 bytes    │243.87 MB│",
                          "│ ZeRO-3 (FULL_SHARD)  │40.65 MB│ 40.65 MB│ 81.29 MB│   125.0 MB   │287.58 MB│",
                          ("Mesh: pp 2 x dp_replicate 1 x dp_shard 2 x tp 2; ZeRO shards over dp_shard (2); the rank "
                           "of pipeline stage 1 (decoder layers 10-19); 1/2 of each layer's weights")};
    all_in_out(want, sizeof want / sizeof *want);
    /* dp sizes alone: the whole model, ZeRO over dp_shard only (not the 4 processes) */
    const char *b[] = {"estimate-memory", "data/llama_seed_config", "--num_processes", "4",
                       "--parallelism_config_dp_replicate_size", "2", "--strategy", "ZERO1", NULL};
    CHECK(run(b, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "│ ZeRO-1 │325.08 MB│325.08 MB│325.08 MB│   0 bytes    │975.24 MB│");
    CHECK_STR_CONTAINS(OUT, "Mesh: pp 1 x dp_replicate 2 x dp_shard 2 x tp 1; ZeRO shards over dp_shard (2)");
    static const char *const BAD[][5] = {
        {"--tp_size", "2", "--num_processes", "3", "tp x pp x dp_replicate = 2 does not divide --num_processes 3"},
        {"--tp_size", "2", "--megatron_lm_tp_degree", "4", "--tp_size 2 and --megatron_lm_tp_degree 4 disagree"},
        {"--pp_size", "21", "--strategy", "DDP", "pp_size at most the 20 decoder layers"},
        {"--tp_size", "0", "--strategy", "DDP", "argument --tp_size: expected a count >= 1"},
        {"--sequence_parallelism", "true", "--strategy", "DDP", "--sequence_parallelism splits the sequence over "
                                                                    "the tp ranks: give it with --tp_size above 1"},
        {"--tp_size", "3", "--batch_size", "1", "num_attention_heads"},
    };
    for (size_t i = 0; i < sizeof BAD / sizeof *BAD; i++) {
        const char *c[] = {"estimate-memory", "data/llama_seed_config", BAD[i][0], BAD[i][1], BAD[i][2], BAD[i][3],
                           "--seq_len", "8", NULL};
        if (strcmp(BAD[i][2], "--batch_size")) c[6] = NULL;
        CHECK_MSG(run(c, NULL) != 0, "accepted: %s %s %s %s", BAD[i][0], BAD[i][1], BAD[i][2], BAD[i][3]);
        CHECK_STR_CONTAINS(ERR, BAD[i][4]);
    }
    /* GPT-2 runs under tp, its Conv1D weights cut as the plan cuts them (bigmodel/mesh_memory.h): a rank of
     * tp 2 holds each of the 2 layers' 6448 parameters (c_attn [32, 48] + 48, attn.c_proj [16, 32] + 32, c_fc
     * [32, 64] + 64, mlp.c_proj [64, 32] + 32, two LayerNorms of 64), half of wte's 900 rows (14400), wpe
     * (32 x 32) and ln_f (64): 28384 f32, 110.88 KB (test_tp_llama checks such figures against the runtime) */
    const char *g[] = {"estimate-memory", "data/hf_arch_gpt2", "--tp_size", "2", "--batch_size", "1", "--seq_len", "8",
                       NULL};
    CHECK_MSG(run(g, NULL) == 0, "GPT-2 under tp: %s", ERR);
    CHECK_STR_CONTAINS(OUT, "│    DDP (NO_SHARD)    │110.88 KB│110.88 KB│221.75 KB│");
    /* sequence parallelism's flag takes str_to_bool's words, by "=" too; another word given by "=" is refused
     * by name (it was taken for the model, or left over as an unrecognized argument) */
    const char *sp[] = {"estimate-memory", "data/llama_seed_config", "--tp_size", "2", "--sequence-parallelism=yes",
                        "--batch_size", "1", "--seq_len", "8", NULL};
    CHECK_MSG(run(sp, NULL) == 0, "--sequence-parallelism=yes: %s", ERR);
    CHECK_STR_CONTAINS(OUT, "per rank (batch 1 x 8, f32, sequence parallel)");
    static const char *const SP_BAD[][3] = {
        {"--sequence_parallelism=maybe", "data/llama_seed_config", "argument --sequence_parallelism: invalid str_to_bool "
                                                                   "value: 'maybe'"},
        {"data/llama_seed_config", "--sequence-parallelism=maybe", "argument --sequence_parallelism: invalid "
                                                                   "str_to_bool value: 'maybe'"},
        {"--megatron_lm_sequence_parallelism=2", "data/llama_seed_config", "argument "
                                                 "--megatron_lm_sequence_parallelism: invalid str_to_bool value: '2'"},
    };
    for (size_t i = 0; i < sizeof SP_BAD / sizeof *SP_BAD; i++) {
        const char *c[] = {"estimate-memory", SP_BAD[i][0], SP_BAD[i][1], "--tp_size", "2", NULL};
        CHECK_MSG(run(c, NULL) == 2, "accepted: %s %s", SP_BAD[i][0], SP_BAD[i][1]);
        CHECK_STR_CONTAINS(ERR, SP_BAD[i][2]);
    }
    /* the activations of one tp rank (f32: the same figure on every CPU; tests/test_training_memory.c checks
     * the estimate against measured steps of every family): tp 2 holds less than one process (770.27 MB), Megatron's
     * sequence parallelism less again; a sequence it cannot split, and tp x pp with a batch, refused by name */
    const char *e[] = {"estimate-memory", "data/llama_seed_config", "--tp_size", "2", "--batch_size", "8",
                       "--seq_len", "64", "--strategy", "DDP", NULL, NULL, NULL};
    CHECK(run(e, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "│DDP (NO_SHARD)│162.58 MB│162.58 MB│325.16 MB│   0 bytes    │ 593.41 MB │1.21 GB│");
    CHECK_STR_CONTAINS(OUT, "1/2 of each layer's weights and of the vocabulary, activations of one tp rank (");
    e[10] = "--megatron_lm_sequence_parallelism";
    CHECK(run(e, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "per rank (batch 8 x 64, f32, sequence parallel)");
    CHECK_STR_CONTAINS(OUT, "│DDP (NO_SHARD)│162.58 MB│162.58 MB│325.16 MB│   0 bytes    │ 552.37 MB │  1.17 GB  │");
    e[11] = "false"; /* Accelerate's {true,false} value, read as str_to_bool reads it */
    CHECK(run(e, NULL) == 0);
    CHECK(!strstr(OUT, "sequence parallel"));
    CHECK_STR_CONTAINS(OUT, "│DDP (NO_SHARD)│162.58 MB│162.58 MB│325.16 MB│   0 bytes    │ 593.41 MB │1.21 GB│");
    e[11] = "on";
    CHECK(run(e, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "per rank (batch 8 x 64, f32, sequence parallel)");
    e[11] = NULL;
    e[7] = "63";
    CHECK(run(e, NULL) != 0);
    CHECK_STR_CONTAINS(ERR, "--seq_len 63 is not a multiple of --tp_size 2: sequence parallelism splits the "
                            "sequence over the tp ranks");

    /* four sizes of 2^20 each: 2^80 processes, refused (their product once wrapped past 64 bits) */
    const char *d[] = {"estimate-memory", "data/llama_seed_config", "--tp_size", "1048576", "--pp_size", "20",
                       "--dp_replicate_size", "1048576", "--dp_shard_size", "1048576", NULL};
    CHECK(run(d, NULL) != 0);
    CHECK_STR_CONTAINS(ERR, "processes (at most 2^20)");
}

/* `accel estimate-memory --cp_size C` (and --parallelism_config_cp_size, --cp_comm_strategy) on the seed config:
 * the weights whole on every cp rank, ZeRO's shards over dp_shard x cp (ZeRO-1's Adam state over 4 ranks: a
 * quarter of 2 x 325.08 MB); with a batch the activations of one cp rank's 32 of 64 positions (f32: the same
 * figure on every CPU; tests/test_training_memory.c checks the estimate against measured cp steps), below one
 * process's 770.27 MB, the all-gather's and the all-to-all's apart; the refusals, by name. */
static void test_estimate_memory_cp(void) {
    const char *a[] = {"estimate-memory", "data/llama_seed_config", "--num_processes", "4", "--cp_size", "2",
                       "--strategy", "ZERO1", NULL};
    CHECK(run(a, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "│ ZeRO-1 │325.08 MB│325.08 MB│162.54 MB│   0 bytes    │812.7 MB│");
    CHECK_STR_CONTAINS(OUT, "Mesh: pp 1 x dp_replicate 1 x dp_shard 2 x cp 2 x tp 1; ZeRO shards over dp_shard x cp "
                            "(4); the same weights on each of the 2 cp ranks (");
    const char *e[] = {"estimate-memory", "data/llama_seed_config", "--parallelism_config_cp_size", "2",
                       "--batch_size", "8", "--seq_len", "64", "--strategy", "DDP", NULL, NULL, NULL, NULL};
    CHECK(run(e, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "per rank (batch 8 x 64, f32, cp all-gather)");
    CHECK_STR_CONTAINS(OUT, "│DDP (NO_SHARD)│325.08 MB│325.08 MB│650.16 MB│   0 bytes    │ 485.77 MB │  1.74 GB  │");
    e[10] = "--cp_comm_strategy", e[11] = "alltoall";
    CHECK(run(e, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "per rank (batch 8 x 64, f32, cp all-to-all)");
    CHECK_STR_CONTAINS(OUT, "│DDP (NO_SHARD)│325.08 MB│325.08 MB│650.16 MB│   0 bytes    │ 598.02 MB │  1.85 GB  │");
    e[10] = "--tp_size", e[11] = "2"; /* composed with tp: one tp rank's heads of a cp rank's positions */
    CHECK(run(e, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "│DDP (NO_SHARD)│162.58 MB│162.58 MB│325.16 MB│   0 bytes    │ 330.59 MB │    980.91 MB    │");
    static const char *const BAD[][7] = {
        {"--cp_size", "3", "--batch_size", "1", "--seq_len", "64",
         "--seq_len 64 is not a multiple of 2 x --cp_size = 6: each of the cp ranks holds 2 of the 2 x cp equal chunks"},
        {"--cp_comm_strategy", "alltoall", "--strategy", "DDP", NULL, NULL,
         "--cp_comm_strategy chooses how context parallelism's ranks exchange K and V: give it with --cp_size above 1"},
        {"--cp_size", "2", "--parallelism_config_cp_comm_strategy", "ring", NULL, NULL,
         "argument --parallelism_config_cp_comm_strategy: invalid choice: 'ring' (choose from 'allgather', 'alltoall')"},
        {"--cp_size", "3", "--cp_comm_strategy", "alltoall", NULL, NULL,
         "data/llama_seed_config: --cp_size: the all-to-all strategy splits a rank's 8 query heads "
         "(num_attention_heads 8 / tp 1) over cp 3 ranks: not a multiple"},
        {"--cp_size", "0", NULL, NULL, NULL, NULL, "argument --cp_size: expected a count >= 1"},
        {"--cp_size", "2", "--parallelism_config_cp_size", "4", NULL, NULL,
         "--cp_size 2 and --parallelism_config_cp_size 4 disagree"},
        {"--cp_size", "2", "--num_processes", "3", NULL, NULL,
         "tp x pp x dp_replicate x cp = 2 does not divide --num_processes 3"},
        {"--cp_size", "1048576", "--tp_size", "1048576", NULL, NULL, "the mesh makes 1099511627776 processes"},
    };
    for (size_t i = 0; i < sizeof BAD / sizeof *BAD; i++) {
        const char *c[] = {"estimate-memory", "data/llama_seed_config", BAD[i][0], BAD[i][1], BAD[i][2], BAD[i][3],
                           BAD[i][4], BAD[i][5], NULL};
        CHECK_MSG(run(c, NULL) != 0, "accepted: %s %s %s %s", BAD[i][0], BAD[i][1], BAD[i][2], BAD[i][3]);
        CHECK_STR_CONTAINS(ERR, BAD[i][6]);
    }
    /* models cp does not run, and layers whose explicit scores the estimate does not count under cp */
    static const char *const MODELS[][2] = {
        {"data/hf_arch_gpt2", "data/hf_arch_gpt2: --cp_size: context parallelism does not run gpt2 models (learned "
                              "position embeddings)"},
        {"data/hf_bert_base", "tensor, pipeline and context parallelism of bert models are not implemented"},
        {"data/hf_arch_gemma2", "layer 0 attends through explicit scores (attention soft-capping), whose memory under "
                                "context parallelism is not modelled here"},
    };
    for (size_t i = 0; i < sizeof MODELS / sizeof *MODELS; i++) {
        const char *c[] = {"estimate-memory", MODELS[i][0], "--cp_size", "2", "--batch_size", "1", "--seq_len", "16",
                           NULL};
        CHECK_MSG(run(c, NULL) != 0, "accepted: %s under cp", MODELS[i][0]);
        CHECK_STR_CONTAINS(ERR, MODELS[i][1]);
    }
}

/* `accel estimate-memory --pp_size P --batch_size B --seq_len T` per stage, on bench/bench_pipeline.c's model
 * (8 layers, hidden 128, vocab 2048, untied; f32) and batch (16 x 32, 4 micro-batches: 4 x 32 x 128 f32 =
 * 64 KiB a micro-batch input): the stages' layers, micro-batches in flight and held inputs are those
 * bench_pipeline measured (bench/results/pipeline.md: peak_in_flight, held_kib) and test_pipeline checks
 * against accel_pipeline_report (1F1B 2 / 1 in flight, 0 / 64 KiB held; GPipe 4 / 4, 0 / 256 KiB;
 * interleaved 1F1B with 2 virtual stages 5 / 3, 192 / 320 KiB - the plan's slots; pp 4 1F1B layers 0,
 * 1-3, 4-6, 7, 0 / 192 / 128 / 64 KiB). A stage's weights at pp 2: 4 layers of 213248 f32 (4 x 128 x 128 +
 * 3 x 128 x 384 + 2 x 128) and the 2048 x 128 embedding (stage 0) or lm_head and final norm (the last):
 * 4.25 MB, Adam twice that; ZeRO-1 over dp_shard 2 halves the optimizer. Each stage tensor-parallel over
 * tp 2: half of each layer's projections (4 x 128 x 64 + 3 x 128 x 192, the norms whole) and of the
 * vocabulary: 2.13 MB; the held inputs whole on each tp rank, or with sequence parallelism their T / 2
 * positions (test_pipeline checks the bytes a stage holds per micro-batch at tp 2, with and without). */
static void test_estimate_memory_pipeline(void) {
    const char *cfg = write_file("pp_config.json",
                                 "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", "
                                 "\"vocab_size\": 2048, \"hidden_size\": 128, \"intermediate_size\": 384, "
                                 "\"num_hidden_layers\": 8, \"num_attention_heads\": 8, \"num_key_value_heads\": 8, "
                                 "\"max_position_embeddings\": 32, \"tie_word_embeddings\": false, "
                                 "\"torch_dtype\": \"float32\"}");
    static const struct { const char *args[6]; const char *want[4]; } CASES[] = {
        {{"--num_micro_batches", "4"},
         {"pp 2, 4 micro-batches of 4 x 32 (1F1B), DDP over dp_shard 1, per rank",
          "│  0  │ 0-3  │4.25 MB│ 4.25 MB │ 8.51 MB │    2    │  0 bytes  │",
          "│  1  │ 4-7  │4.25 MB│ 4.25 MB │ 8.51 MB │    1    │  64.0 KB  │",
          "inputs [4, 32, 128] float32 (65536 bytes each)"}},
        {{"--megatron_lm_num_micro_batches", "4", "--pp_schedule", "gpipe"},
         {"(GPipe)", "│  0  │ 0-3  │4.25 MB│ 4.25 MB │ 8.51 MB │    4    │  0 bytes  │",
          "│  1  │ 4-7  │4.25 MB│ 4.25 MB │ 8.51 MB │    4    │  256.0 KB │"}},
        {{"--num_micro_batches", "4", "--pp_virtual_stages", "2"},
         {"pp 2 x 2 virtual, 4 micro-batches of 4 x 32 (interleaved 1F1B)",
          "│  0  │0-1, 4-5│4.25 MB│ 4.25 MB │ 8.51 MB │    5    │  192.0 KB │",
          "│  1  │2-3, 6-7│4.25 MB│ 4.25 MB │ 8.51 MB │    3    │  320.0 KB │"}},
        {{"--num_micro_batches", "4", "--strategy", "ZERO1", "--dp_shard_size", "2"},
         {"ZeRO-1 over dp_shard 2", "│  1  │ 4-7  │4.25 MB│ 4.25 MB │ 4.25 MB │    1    │  64.0 KB  │"}},
        {{"--num_micro_batches", "4", "--tp_size", "2"},
         {"pp 2, tp 2, 4 micro-batches", "│  0  │ 0-3  │2.13 MB│ 2.13 MB │ 4.26 MB │    2    │  0 bytes  │",
          "│  1  │ 4-7  │2.13 MB│ 2.13 MB │ 4.26 MB │    1    │  64.0 KB  │"}},
        {{"--num_micro_batches", "4", "--megatron_lm_tp_degree", "2", "--megatron_lm_sequence_parallelism", "true"},
         {"pp 2, tp 2 sequence parallel,", "│  1  │ 4-7  │2.13 MB│ 2.13 MB │ 4.26 MB │    1    │  32.0 KB  │",
          "inputs [4, 16, 128] float32 (32768 bytes each)"}},
        /* cp 2: a cp rank's 16 of the 32 positions (accelerator/pipeline.c: its chunks of the ids) */
        {{"--num_micro_batches", "4", "--cp_size", "2", "--strategy", "ZERO1"},
         {"pp 2, cp 2, 4 micro-batches of 4 x 32 (1F1B), ZeRO-1 over dp_shard x cp 2",
          "│  1  │ 4-7  │4.25 MB│ 4.25 MB │ 4.25 MB │    1    │  32.0 KB  │",
          "inputs [4, 16, 128] float32 (32768 bytes each)"}},
    };
    for (size_t i = 0; i < sizeof CASES / sizeof *CASES; i++) {
        const char *c[16] = {"estimate-memory", cfg, "--pp_size", "2", "--batch_size", "16", "--seq_len", "32"};
        int n = 8;
        for (int k = 0; k < 6 && CASES[i].args[k]; k++) c[n++] = CASES[i].args[k];
        CHECK_MSG(run(c, NULL) == 0, "case %zu: %s", i, ERR);
        for (int k = 0; k < 4 && CASES[i].want[k]; k++) CHECK_STR_CONTAINS(OUT, CASES[i].want[k]);
    }
    const char *four[] = {"estimate-memory", cfg, "--pp_size", "4", "--batch_size", "16", "--seq_len", "32",
                          "--num_micro_batches", "4", NULL};
    CHECK(run(four, NULL) == 0);
    const char *want4[] = {"│  0  │  0   │", "│    4    │  0 bytes  │", "│  1  │ 1-3  │", "│    3    │  192.0 KB │",
                           "│  2  │ 4-6  │", "│    2    │  128.0 KB │", "│  3  │  7   │", "│    1    │  64.0 KB  │"};
    all_in_out(want4, sizeof want4 / sizeof *want4);
    static const char *const BAD[][5] = {
        {"--pp_size", "3", "--pp_virtual_stages", "2", "8 layers into pp_size 3 x pp_virtual_stages 2 = 6 chunks"},
        {"--pp_size", "2", "--num_micro_batches", "3", "a batch of 16 rows does not split into 3 micro-batches"},
        {"--pp_size", "2", "--strategy", "ZERO3", "ZeRO-3 is not built with pipeline parallelism"},
        {"--pp_size", "2", "--pp_schedule", "zb", "argument --pp_schedule: invalid choice: 'zb'"},
        {"--pp_size", "2", "--pp_schedule", "interleaved", "virtual stages are the interleaved schedule's"},
        {"--pp_size", "1", "--num_micro_batches", "4", "shape the pipeline's per-stage table"},
    };
    for (size_t i = 0; i < sizeof BAD / sizeof *BAD; i++) {
        const char *c[] = {"estimate-memory", cfg, BAD[i][0], BAD[i][1], BAD[i][2], BAD[i][3], "--batch_size", "16",
                           "--seq_len", "32", NULL};
        CHECK_MSG(run(c, NULL) != 0, "accepted: %s %s %s %s", BAD[i][0], BAD[i][1], BAD[i][2], BAD[i][3]);
        CHECK_STR_CONTAINS(ERR, BAD[i][4]);
    }
}

int main(void) {
    if (!sibling_exe("accel", ACCEL, sizeof ACCEL) || !sibling_exe("test_dist_faults", WORKER, sizeof WORKER)) return 1;
    if (!cli_scratch("parallelism", TMP, sizeof TMP)) return 1;
    RUN(test_parallelism_flags_env);
    RUN(test_megatron_flags_env);
    RUN(test_flag_errors);
    RUN(test_mesh_errors);
    RUN(test_config_sections);
    RUN(test_config_round_trip);
    RUN(test_config_wizard);
    RUN(test_reaches_accelerator);
    RUN(test_estimate_memory_mesh);
    RUN(test_estimate_memory_pipeline);
    RUN(test_estimate_memory_cp);
    cli_scratch_remove(TMP);
    return check_summary();
}
