/* ParallelismConfig's and Megatron-LM's variables into the options
 * (parallelism_env.h): what accelerate/parallelism_config.py
 * (ParallelismConfig.__post_init__, TorchContextParallelConfig) and
 * utils/dataclasses.py (MegatronLMPlugin.__post_init__) read, read as
 * strictly as every variable of accel (core/env.h). */
#include "parallelism_env.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/env.h"
#include "core/str_to_bool.h"

#define FN "accel_accelerator_new"

enum { NAME_MAX_LEN = 64, SIZE_MAX_VALUE = 1 << 20 };

/* The text of Accelerate's variable `name`: ACCEL_<name> (without its
 * ACCELERATE_ prefix) when set, else name itself; *who gets the one read.
 * NULL when neither is set. */
static const char *var(const char *name, char who[NAME_MAX_LEN]) {
    const char *bare = strncmp(name, "ACCELERATE_", 11) ? name : name + 11;
    snprintf(who, NAME_MAX_LEN, "ACCEL_%s", bare);
    const char *v = getenv(who);
    if (v) return v; /* empty too: refused by the readers below */
    snprintf(who, NAME_MAX_LEN, "%s", name);
    return getenv(name);
}

static accel_status read_bool(const char *name, bool *out, char who[NAME_MAX_LEN]) {
    *out = false;
    return accel__parse_bool(FN, who, var(name, who), out);
}

/* Records "who=text" for the errors of the mesh (parallelism_env.h). */
static void note(accel__parallelism_env *pe, const char *who, const char *text) {
    size_t at = strlen(pe->from);
    snprintf(pe->from + at, sizeof pe->from - at, "%s%s=%s", at ? ", " : "", who, text);
}

/* A size variable into *field when the field is unset: 0 when the variable
 * is unset or 1 (the default, nothing set); *value gets what it said. */
static accel_status read_size(accel__parallelism_env *pe, const char *name, int *field, int *value) {
    char who[NAME_MAX_LEN];
    const char *v = var(name, who);
    *value = 0;
    if (!v) return ACCEL_OK;
    long n;
    if (accel__parse_long(who, v, 1, SIZE_MAX_VALUE, &n) != ACCEL_OK)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, FN ": %s='%s' is not a size (an integer from 1 to %d)", who, v,
                               SIZE_MAX_VALUE);
    *value = (int)n;
    if (*field || n == 1) return ACCEL_OK;
    *field = (int)n;
    note(pe, who, v);
    return ACCEL_OK;
}

/* A string variable that must be one of `a` and `b` (b may be NULL). */
static accel_status read_choice(const char *name, const char *a, const char *b, const char **out) {
    char who[NAME_MAX_LEN];
    const char *v = var(name, who);
    *out = v;
    if (!v || !strcmp(v, a) || (b && !strcmp(v, b))) return ACCEL_OK;
    return accel_set_error(ACCEL_ERR_INVALID_ARG, FN ": %s='%s' must be '%s'%s%s%s", who, v, a, b ? " or '" : "",
                           b ? b : "", b ? "'" : "");
}

/* ParallelismConfig's fields (the variables `accel launch
 * --use_parallelism_config` exports). */
static accel_status read_parallelism_config(accel_accelerator_opts *o, accel__parallelism_env *pe, int *tp_given) {
    accel_parallelism_opts *p = &o->parallelism;
    int unused;
    accel_status st = read_size(pe, "PARALLELISM_CONFIG_DP_REPLICATE_SIZE", &p->dp_replicate_size, &unused);
    if (!st) st = read_size(pe, "PARALLELISM_CONFIG_DP_SHARD_SIZE", &p->dp_shard_size, &unused);
    if (!st) st = read_size(pe, "PARALLELISM_CONFIG_TP_SIZE", &p->tp_size, tp_given);
    if (!st) st = read_size(pe, "PARALLELISM_CONFIG_CP_SIZE", &p->cp_size, &unused);
    if (!st) st = read_size(pe, "PARALLELISM_CONFIG_SP_SIZE", &p->sp_size, &unused);
    const char *backend, *strategy;
    if (!st) st = read_choice("PARALLELISM_CONFIG_CP_BACKEND", "torch", NULL, &backend);
    if (!st) st = read_choice("PARALLELISM_CONFIG_SP_BACKEND", "deepspeed", NULL, &backend);
    if (!st) st = read_choice("PARALLELISM_CONFIG_CP_COMM_STRATEGY", "allgather", "alltoall", &strategy);
    if (st) return st;
    if (!p->cp_comm_strategy && strategy) {
        /* a literal, not the environment's text (a later setenv may free that) */
        p->cp_comm_strategy = strcmp(strategy, "alltoall") ? "allgather" : "alltoall";
        char who[NAME_MAX_LEN];
        var("PARALLELISM_CONFIG_CP_COMM_STRATEGY", who);
        note(pe, who, strategy);
    }
    return ACCEL_OK;
}

/* The ZeRO stage Megatron's distributed optimizer asks for: 1, sharding the
 * optimizer state over the data-parallel ranks, unless the code chose a
 * stage; another choice of sharding in the variables is a conflict. */
static accel_status distributed_optimizer(accel_accelerator_opts *o, const char *who) {
    if (o->zero_stage) return ACCEL_OK; /* the field wins */
    static const char *const OTHERS[] = {"ACCEL_ZERO_STAGE", "ACCEL_FSDP_SHARDING_STRATEGY",
                                         "ACCEL_DEEPSPEED_CONFIG_FILE"};
    const char *other = o->fsdp_sharding_strategy ? "opts.fsdp_sharding_strategy"
                        : o->deepspeed_config_file ? "opts.deepspeed_config_file"
                                                   : NULL;
    for (size_t i = 0; i < sizeof OTHERS / sizeof *OTHERS && !other; i++)
        if (getenv(OTHERS[i])) other = OTHERS[i];
    if (other)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, FN ": %s=true (ZeRO-1 over the data-parallel ranks) and %s "
                               "both choose the sharding: give one of them", who, other);
    o->zero_stage = 1;
    return ACCEL_OK;
}

/* MEGATRON_LM_GRADIENT_CLIPPING (1.0 when unset, as MegatronLMPlugin; 0:
 * none) as o->gradient_clipping, unless the code gave one. */
static accel_status megatron_clipping(accel_accelerator_opts *o) {
    if (o->gradient_clipping != 0) return ACCEL_OK; /* the field wins */
    char who[NAME_MAX_LEN];
    const char *v = var("MEGATRON_LM_GRADIENT_CLIPPING", who), *other = getenv("ACCEL_GRADIENT_CLIPPING");
    const char *ds = o->deepspeed_config_file ? "opts.deepspeed_config_file"
                     : getenv("ACCEL_DEEPSPEED_CONFIG_FILE") ? "ACCEL_DEEPSPEED_CONFIG_FILE"
                                                             : NULL;
    double norm = 1.0;
    if (v) { /* MegatronLMPlugin reads it with float(): not strtod's hex */
        if (!accel__python_float(v, &norm) || !isfinite(norm) || norm < 0)
            return accel_set_error(ACCEL_ERR_INVALID_ARG, FN ": %s='%s' is not a gradient norm (a finite number "
                                   ">= 0; 0: no clipping)", who, v);
    }
    /* Megatron's default gives way to the launcher's --gradient_clipping and to a DeepSpeed config's */
    if (!v && (other || ds)) return ACCEL_OK;
    if (v && ds)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, FN ": %s='%s' and the DeepSpeed config (%s) both set the "
                               "gradient clipping: give one of them", who, v, ds);
    if (other) {
        double given;
        if (accel__env_nonneg("ACCEL_GRADIENT_CLIPPING", 0, &given) != ACCEL_OK) return accel_last_status();
        if (given != norm)
            return accel_set_error(ACCEL_ERR_INVALID_ARG, FN ": %s='%s' and ACCEL_GRADIENT_CLIPPING='%s' disagree "
                                   "on the gradient clipping: give one of them", who, v, other);
    }
    o->gradient_clipping = norm;
    return ACCEL_OK;
}

/* MegatronLMPlugin's fields that accel runs: the tensor- and pipeline-
 * parallel degrees, micro-batches, sequence parallelism, activation
 * recomputation, the distributed optimizer and gradient clipping. code_tp:
 * the code set opts.parallelism.tp_size (it wins over both variables); pc_tp:
 * PARALLELISM_CONFIG_TP_SIZE's value (0: unset). */
static accel_status read_megatron(accel_accelerator_opts *o, accel__parallelism_env *pe, bool code_tp, int pc_tp) {
    accel_parallelism_opts *p = &o->parallelism;
    int tp = 0, unused;
    accel_status st = read_size(pe, "MEGATRON_LM_TP_DEGREE", &p->tp_size, &tp);
    if (!st && !code_tp && pc_tp > 1 && tp > 1 && pc_tp != tp) {
        char a[NAME_MAX_LEN], b[NAME_MAX_LEN];
        var("PARALLELISM_CONFIG_TP_SIZE", a);
        var("MEGATRON_LM_TP_DEGREE", b);
        return accel_set_error(ACCEL_ERR_INVALID_ARG, FN ": %s=%d and %s=%d disagree on the tensor-parallel size: "
                               "give one of them, or the same size", a, pc_tp, b, tp);
    }
    if (!st) st = read_size(pe, "MEGATRON_LM_PP_DEGREE", &p->pp_size, &unused);
    if (!st) st = read_size(pe, "MEGATRON_LM_NUM_MICRO_BATCHES", &p->num_micro_batches, &unused);
    char who[NAME_MAX_LEN];
    bool sp = false, dist_opt = false;
    if (!st) st = read_bool("MEGATRON_LM_SEQUENCE_PARALLELISM", &sp, who);
    if (!st && sp && !p->sequence_parallelism) {
        p->sequence_parallelism = ACCEL_TRUE;
        note(pe, who, getenv(who));
    }
    if (!st) st = read_bool("MEGATRON_LM_RECOMPUTE_ACTIVATIONS", &pe->recompute_activations, who);
    if (!st) st = read_bool("MEGATRON_LM_USE_DISTRIBUTED_OPTIMIZER", &dist_opt, who);
    if (!st && dist_opt) st = distributed_optimizer(o, who);
    return st ? st : megatron_clipping(o);
}

accel_status accel__parallelism_env_read(accel_accelerator_opts *o, accel__parallelism_env *pe) {
    memset(pe, 0, sizeof *pe);
    const accel_parallelism_opts *p = &o->parallelism;
    char who[NAME_MAX_LEN];
    bool use_pc = false;
    if (read_bool("ACCELERATE_USE_PARALLELISM_CONFIG", &use_pc, who) ||
        read_bool("ACCELERATE_USE_MEGATRON_LM", &pe->megatron, who))
        return accel_last_status();
    /* Accelerate's ParallelismConfig() reads the variables of the fields it was not given */
    use_pc = use_pc || p->dp_replicate_size || p->dp_shard_size || p->tp_size || p->cp_size || p->sp_size;
    bool code_tp = p->tp_size != 0;
    int pc_tp = 0;
    if (use_pc && read_parallelism_config(o, pe, &pc_tp)) return accel_last_status();
    return pe->megatron ? read_megatron(o, pe, code_tp, pc_tp) : ACCEL_OK;
}

accel_status accel__parallelism_env_resolve(accel_accelerator_opts *o, const accel__parallelism_env *pe, int world,
                                            accel__parallelism *out) {
    accel_parallelism_opts *p = &o->parallelism;
    double model = accel__parallelism_model_size(p);
    /* Megatron's data-parallel size is what the model-parallel ranks leave */
    if (pe->megatron && !p->dp_replicate_size && !p->dp_shard_size && model > 1 && fmod(world, model) == 0)
        p->dp_shard_size = (int)(world / model);
    accel_status st = accel__parallelism_config(o, world, out);
    if (!st || !pe->from[0]) return st;
    char inner[1024];
    snprintf(inner, sizeof inner, "%s", accel_last_error());
    return accel_set_error(st, "%s (set from the environment: %s)", inner, pe->from);
}
