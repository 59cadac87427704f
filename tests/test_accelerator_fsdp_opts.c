/* The fsdp_config keys as accel_accelerator_opts fields (FullyShardedDataParallelPlugin's
 * arguments): each takes effect, wins over its ACCEL_FSDP_* variable, is
 * refused by name when bad, and zeroed options keep the environment's and
 * the defaults' behaviour; `{.field = false}` and `= true` mean what they
 * say for every boolean; the boolean variables read as Accelerate's
 * str_to_bool, garbage refused by name; sync_module_states=False beside
 * cpu_ram_efficient_loading warned about and forced True. One process: stage 3 over a world
 * of 1. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "accel/accel.h"
#include "accel/accelerator.h"
#include "accelerator/accelerator_internal.h" /* the resolved accel__fsdp_cfg */
#include "check.h"

static const char *const VARS[] = {
    "ACCEL_FSDP_AUTO_WRAP_POLICY",      "ACCEL_FSDP_TRANSFORMER_CLS_TO_WRAP",  "ACCEL_FSDP_MIN_NUM_PARAMS",
    "ACCEL_FSDP_BACKWARD_PREFETCH",     "ACCEL_FSDP_FORWARD_PREFETCH",         "ACCEL_FSDP_RESHARD_AFTER_FORWARD",
    "ACCEL_FSDP_STATE_DICT_TYPE",       "ACCEL_FSDP_ACTIVATION_CHECKPOINTING", "ACCEL_FSDP_CPU_RAM_EFFICIENT_LOADING",
    "ACCEL_FSDP_SYNC_MODULE_STATES",    "ACCEL_FSDP_USE_ORIG_PARAMS",          "ACCEL_FSDP_VERSION",
    "ACCEL_FSDP_SHARDING_STRATEGY",     "ACCEL_ZERO_STAGE",                    "ACCEL_DEEPSPEED_CONFIG_FILE",
};

static void clear_env(void) {
    for (size_t k = 0; k < sizeof VARS / sizeof *VARS; k++) unsetenv(VARS[k]);
}

/* The FSDP settings o resolves to under stage 3 (false when refused). */
static bool resolved(accel_accelerator_opts o, accel__fsdp_cfg *out) {
    if (!o.zero_stage) o.zero_stage = 3;
    accel_accelerator *acc = accel_accelerator_new(&o);
    CHECK_MSG(acc != NULL, "%s", accel_last_error());
    if (!acc) return false;
    *out = acc->fsdp;
    accel_accelerator_free(acc);
    return true;
}

static void refused(accel_accelerator_opts o, const char *needle) {
    if (!o.zero_stage) o.zero_stage = 3;
    accel_accelerator *acc = accel_accelerator_new(&o);
    CHECK_MSG(acc == NULL, "accepted, expected \"%s\"", needle);
    accel_accelerator_free(acc);
    CHECK_STR_CONTAINS(accel_last_error(), needle);
    accel_clear_error();
}

static void check_defaults(const accel__fsdp_cfg *f) {
    CHECK(f->wrap == ACCEL__WRAP_DEFAULT);
    CHECK(!strcmp(f->wrap_cls, "")); /* unset: the model's decoder layer class, found at prepare */
    CHECK(f->min_num_params == 100000000);
    CHECK(f->backward_prefetch && !f->backward_post && !f->forward_prefetch && f->reshard_after_forward);
    CHECK(f->prefetch_bucket == -1);
    CHECK(!f->full_state_dict && !f->activation_checkpointing);
}

/* Every field set: FSDP's non-defaults, as the run reads them. */
static accel_accelerator_opts all_set(void) {
    return (accel_accelerator_opts){
        .fsdp_auto_wrap_policy = "SIZE_BASED_WRAP",
        .fsdp_transformer_layer_cls_to_wrap = "Block,Head",
        .fsdp_min_num_params = 1234,
        .fsdp_backward_prefetch = "NO_PREFETCH",
        .fsdp_forward_prefetch = ACCEL_TRUE,
        .fsdp_no_reshard_after_forward = true,
        .fsdp_state_dict_type = "FULL_STATE_DICT",
        .fsdp_activation_checkpointing = ACCEL_TRUE,
        .fsdp_no_cpu_ram_efficient_loading = true,
        .fsdp_no_sync_module_states = true,
        .fsdp_no_use_orig_params = true,
        .fsdp_version = 2,
    };
}

static void check_all_set(const accel__fsdp_cfg *f) {
    CHECK(f->wrap == ACCEL__WRAP_SIZE);
    CHECK(!strcmp(f->wrap_cls, "Block,Head"));
    CHECK(f->min_num_params == 1234);
    CHECK(!f->backward_prefetch && !f->backward_post && f->forward_prefetch && !f->reshard_after_forward);
    CHECK(f->full_state_dict && f->activation_checkpointing);
}

static void test_zeroed_opts_keep_defaults(void) {
    clear_env();
    accel__fsdp_cfg f;
    if (resolved(accel_accelerator_opts_default(), &f)) check_defaults(&f);
}

static void test_each_field_takes_effect(void) {
    clear_env();
    accel__fsdp_cfg f;
    if (resolved(all_set(), &f)) check_all_set(&f);
    accel_accelerator_opts o = {.fsdp_auto_wrap_policy = "TRANSFORMER_BASED_WRAP"};
    if (resolved(o, &f)) CHECK(f.wrap == ACCEL__WRAP_TRANSFORMER);
    o = (accel_accelerator_opts){.fsdp_auto_wrap_policy = "NO_WRAP", .fsdp_version = 1};
    if (resolved(o, &f)) CHECK(f.wrap == ACCEL__WRAP_NONE);
    o = (accel_accelerator_opts){.fsdp_forward_prefetch = ACCEL_FALSE, .fsdp_no_reshard_after_forward = false,
                                 .fsdp_backward_prefetch = "BACKWARD_PRE", .fsdp_state_dict_type = "SHARDED_STATE_DICT",
                                 .fsdp_activation_checkpointing = ACCEL_FALSE, .fsdp_no_sync_module_states = false,
                                 .fsdp_no_cpu_ram_efficient_loading = false, .fsdp_no_use_orig_params = false};
    if (resolved(o, &f)) check_defaults(&f);
}

/* C's natural initialisers of every boolean field do what they say: a
 * `false` is never read as "unset, so the default True" (the tri-state
 * fsdp_reshard_after_forward = false kept resharding). */
static void test_natural_initializers(void) {
    clear_env();
    accel__fsdp_cfg f;
    if (resolved((accel_accelerator_opts){.fsdp_no_reshard_after_forward = true}, &f)) CHECK(!f.reshard_after_forward);
    if (resolved((accel_accelerator_opts){.fsdp_no_reshard_after_forward = false}, &f)) CHECK(f.reshard_after_forward);
    if (resolved((accel_accelerator_opts){.fsdp_forward_prefetch = true}, &f)) CHECK(f.forward_prefetch);
    if (resolved((accel_accelerator_opts){.fsdp_forward_prefetch = false}, &f)) CHECK(!f.forward_prefetch);
    if (resolved((accel_accelerator_opts){.fsdp_activation_checkpointing = true}, &f))
        CHECK(f.activation_checkpointing);
    if (resolved((accel_accelerator_opts){.fsdp_activation_checkpointing = false}, &f))
        CHECK(!f.activation_checkpointing);
    /* sync_module_states=False with cpu_ram_efficient_loading on: test_sync_forced;
     * with it off accepted; false on both is the default pair */
    accel_accelerator_opts o = {.fsdp_no_sync_module_states = true, .fsdp_no_cpu_ram_efficient_loading = true};
    resolved(o, &f);
    o = (accel_accelerator_opts){.fsdp_no_sync_module_states = false, .fsdp_no_cpu_ram_efficient_loading = false,
                                 .fsdp_no_use_orig_params = true};
    resolved(o, &f);
    /* a set field wins over its variable */
    setenv("ACCEL_FSDP_RESHARD_AFTER_FORWARD", "true", 1);
    if (resolved((accel_accelerator_opts){.fsdp_no_reshard_after_forward = true}, &f)) CHECK(!f.reshard_after_forward);
    clear_env();
}

/* The boolean variables take every spelling of Accelerate's str_to_bool
 * (it accepted only true/false/1/0) and refuse anything else by name:
 * never a silent default. */
static void test_env_bools_as_str_to_bool(void) {
    static const char *const YES[] = {"y", "YES", "t", "True", "on", "1"}, *const NO[] = {"N", "no", "F", "false",
                                                                                       "OFF", "0"};
    accel__fsdp_cfg f;
    for (int i = 0; i < 6; i++) {
        clear_env();
        setenv("ACCEL_FSDP_FORWARD_PREFETCH", YES[i], 1);
        setenv("ACCEL_FSDP_RESHARD_AFTER_FORWARD", NO[i], 1);
        if (resolved(accel_accelerator_opts_default(), &f))
            CHECK_MSG(f.forward_prefetch && !f.reshard_after_forward, "%s / %s", YES[i], NO[i]);
    }
    static const char *const BAD[] = {"maybe", "2", "truee", "yes please", " true"};
    for (int i = 0; i < 5; i++) {
        clear_env();
        char want[96];
        setenv("ACCEL_FSDP_SYNC_MODULE_STATES", BAD[i], 1);
        snprintf(want, sizeof want, "ACCEL_FSDP_SYNC_MODULE_STATES=%s is not a boolean", BAD[i]);
        refused(accel_accelerator_opts_default(), want);
    }
    clear_env();
}

static void set_env(const char *const (*vars)[2]) {
    for (; (*vars)[0]; vars++) setenv((*vars)[0], (*vars)[1], 1);
}

/* The variables alone still decide; a field set beats its variable, a bad
 * variable included. */
static void test_api_beats_env(void) {
    static const char *const GOOD[][2] = {
        {"ACCEL_FSDP_AUTO_WRAP_POLICY", "NO_WRAP"},          {"ACCEL_FSDP_TRANSFORMER_CLS_TO_WRAP", "EnvLayer"},
        {"ACCEL_FSDP_MIN_NUM_PARAMS", "5"},                  {"ACCEL_FSDP_FORWARD_PREFETCH", "true"},
        {"ACCEL_FSDP_RESHARD_AFTER_FORWARD", "SHARD_GRAD_OP"}, {"ACCEL_FSDP_STATE_DICT_TYPE", "FULL_STATE_DICT"},
        {NULL, NULL},
    };
    /* the opposite of all_set, or bad values the options override */
    static const char *const OVERRIDDEN[][2] = {
        {"ACCEL_FSDP_AUTO_WRAP_POLICY", "LAYER_WRAP"},      {"ACCEL_FSDP_MIN_NUM_PARAMS", "lots"},
        {"ACCEL_FSDP_BACKWARD_PREFETCH", "BACKWARD_POST"},  {"ACCEL_FSDP_FORWARD_PREFETCH", "false"},
        {"ACCEL_FSDP_RESHARD_AFTER_FORWARD", "FULL_SHARD"}, {"ACCEL_FSDP_STATE_DICT_TYPE", "LOCAL_STATE_DICT"},
        {"ACCEL_FSDP_ACTIVATION_CHECKPOINTING", "maybe"},   {"ACCEL_FSDP_CPU_RAM_EFFICIENT_LOADING", "true"},
        {"ACCEL_FSDP_SYNC_MODULE_STATES", "maybe"},         {"ACCEL_FSDP_USE_ORIG_PARAMS", "maybe"},
        {"ACCEL_FSDP_VERSION", "3"},                        {NULL, NULL},
    };
    clear_env();
    set_env(GOOD); /* the variables alone decide */
    accel__fsdp_cfg f;
    if (resolved(accel_accelerator_opts_default(), &f)) {
        CHECK(f.wrap == ACCEL__WRAP_NONE && !strcmp(f.wrap_cls, "EnvLayer") && f.min_num_params == 5);
        CHECK(f.forward_prefetch && !f.reshard_after_forward && f.full_state_dict);
    }
    set_env(OVERRIDDEN);
    if (resolved(all_set(), &f)) check_all_set(&f);
    clear_env();
}

static void test_bad_values_named(void) {
    clear_env();
    refused((accel_accelerator_opts){.fsdp_auto_wrap_policy = "LAYER_WRAP"},
            "opts.fsdp_auto_wrap_policy=\"LAYER_WRAP\": unknown policy (TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP, "
            "NO_WRAP)");
    char long_cls[600];
    memset(long_cls, 'x', sizeof long_cls - 1);
    long_cls[sizeof long_cls - 1] = 0;
    refused((accel_accelerator_opts){.fsdp_transformer_layer_cls_to_wrap = long_cls},
            "opts.fsdp_transformer_layer_cls_to_wrap is longer than 511 characters");
    refused((accel_accelerator_opts){.fsdp_min_num_params = -1}, "opts.fsdp_min_num_params=-1 is not a count");
    refused((accel_accelerator_opts){.fsdp_backward_prefetch = "BACKWARD_SIDEWAYS"},
            "opts.fsdp_backward_prefetch=\"BACKWARD_SIDEWAYS\": unknown policy (BACKWARD_PRE, BACKWARD_POST, "
            "NO_PREFETCH)");
    refused((accel_accelerator_opts){.fsdp_forward_prefetch = 2},
            "opts.fsdp_forward_prefetch=2 is not ACCEL_TRUE (1), ACCEL_FALSE (-1) or 0 (unset)");
    refused((accel_accelerator_opts){.fsdp_activation_checkpointing = -2},
            "opts.fsdp_activation_checkpointing=-2 is not");
    refused((accel_accelerator_opts){.fsdp_state_dict_type = "LOCAL_STATE_DICT"},
            "opts.fsdp_state_dict_type=LOCAL_STATE_DICT is not implemented by accel");
    refused((accel_accelerator_opts){.fsdp_version = 3}, "opts.fsdp_version=\"3\" (1 or 2)");
    /* the checks across keys and against the stage hold for the options too */
    refused((accel_accelerator_opts){.zero_stage = 2, .fsdp_activation_checkpointing = ACCEL_TRUE},
            "fsdp_activation_checkpointing=true checkpoints the FULL_SHARD");
    refused((accel_accelerator_opts){.zero_stage = 2, .fsdp_state_dict_type = "SHARDED_STATE_DICT"},
            "fsdp_state_dict_type=SHARDED_STATE_DICT shards the checkpoints of FULL_SHARD");
}

/* What accel_accelerator_new wrote to stderr while resolving o (accepted). */
static void resolved_stderr(accel_accelerator_opts o, char *err, size_t n) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/accel_fsdp_opts_%d.err", (int)getpid());
    fflush(stderr);
    int saved = dup(2), fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(saved >= 0 && fd >= 0);
    dup2(fd, 2);
    close(fd);
    accel__fsdp_cfg f;
    bool ok = resolved(o, &f);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    CHECK_MSG(ok, "refused: %s", accel_last_error());
    FILE *in = fopen(path, "r");
    err[0] = 0;
    if (in) {
        err[fread(err, 1, n - 1, in)] = 0;
        fclose(in);
    }
    remove(path);
}

/* sync_module_states=False while cpu_ram_efficient_loading is on (its
 * default), from the option or the variable: as Accelerate's
 * FullyShardedDataParallelPlugin, a warning and True (only the launcher
 * refuses the pair: test_cli_launch); under FSDP2 the key is obsolete,
 * nothing is said; with the loading off nothing is said either. */
static void test_sync_forced(void) {
    static const char WARN[] = "sync_module_states cannot be False since efficient cpu ram loading enabled. "
                               "Setting sync_module_states to True.";
    char err[1024];
    clear_env();
    resolved_stderr((accel_accelerator_opts){.fsdp_no_sync_module_states = true}, err, sizeof err);
    CHECK_STR_CONTAINS(err, WARN);
    setenv("ACCEL_FSDP_SYNC_MODULE_STATES", "false", 1);
    resolved_stderr((accel_accelerator_opts){0}, err, sizeof err);
    CHECK_STR_CONTAINS(err, WARN);
    clear_env();
    resolved_stderr((accel_accelerator_opts){.fsdp_no_sync_module_states = true, .fsdp_version = 2}, err, sizeof err);
    CHECK_MSG(!strstr(err, "sync_module_states"), "FSDP2 warned: %s", err);
    resolved_stderr((accel_accelerator_opts){.fsdp_no_sync_module_states = true,
                                             .fsdp_no_cpu_ram_efficient_loading = true},
                    err, sizeof err);
    CHECK_MSG(!strstr(err, "sync_module_states"), "warned with the loading off: %s", err);
}

int main(void) {
    RUN(test_zeroed_opts_keep_defaults);
    RUN(test_each_field_takes_effect);
    RUN(test_natural_initializers);
    RUN(test_sync_forced);
    RUN(test_env_bools_as_str_to_bool);
    RUN(test_api_beats_env);
    RUN(test_bad_values_named);
    return check_summary();
}
