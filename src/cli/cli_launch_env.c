/* src/cli/cli_launch_env.c — the FSDP and DeepSpeed settings of `accel launch`
 * and the variables `accelerate launch` exports for them
 * (accelerate/utils/launch.py: prepare_multi_gpu_env, prepare_deepspeed_cmd_env),
 * so that a launched PyTorch script sees the configuration it would see under
 * Accelerate. A value comes from its flag, else its fsdp_config /
 * deepspeed_config key, else Accelerate's default, and is written the way
 * Python's str() writes it (lowercased where Accelerate lowercases). */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli/cli.h"
#include "core/core_internal.h"
#include "core/env.h"
#include "core/str_to_bool.h"

/* A flag's argparse type or action, which also says what a config value must be. */
typedef enum kind {
    K_STR,         /* type=str */
    K_INT,         /* type=int: str(int(v)) */
    K_FLOAT,       /* type=float: str(float(v)) */
    K_BOOL,        /* type=str that the variable's reader takes through str_to_bool: refused here when it is none */
    K_CHOICE,      /* type=str, choices */
    K_STORE_TRUE,  /* action="store_true": str(True) */
    K_STR_TO_BOOL, /* type=str_to_bool: "1" / "0" */
    K_BOOL3        /* fp8_override_linear_precision: "b,b,b", one variable per GEMM */
} kind;

typedef struct setting {
    const char *name;  /* flag, and key in fsdp_config / deepspeed_config / fp8_config */
    const char *env;   /* variable Accelerate exports (NULL: none, the flag is the library's only) */
    const char *dflt;  /* Accelerate's default through the flag's type; NULL: exported only when set */
    kind type;
    bool lower;        /* Accelerate exports str(v).lower() */
    const char *meta, *help;
    const char *alias; /* the key Accelerate's `accelerate config` writes instead, or NULL */
    const char *const *choices; /* K_CHOICE: NULL-terminated */
} setting;

static const setting FSDP[] = {
    {"fsdp_version", "FSDP_VERSION", "1", K_STR, false, "{1,2}", "FSDP version (FSDP_VERSION).", NULL, NULL},
    {"fsdp_sharding_strategy", "FSDP_SHARDING_STRATEGY", "FULL_SHARD", K_STR, false, "STRATEGY",
     "FSDP sharding strategy (FSDP_SHARDING_STRATEGY, ACCEL_FSDP_SHARDING_STRATEGY).", NULL, NULL},
    {"fsdp_reshard_after_forward", "FSDP_RESHARD_AFTER_FORWARD", "true", K_STR, true, "VALUE",
     "Reshard after forward (FSDP_RESHARD_AFTER_FORWARD).", NULL, NULL},
    {"fsdp_offload_params", "FSDP_OFFLOAD_PARAMS", "false", K_BOOL, true, "{true,false}",
     "Offload parameters and gradients to CPU (FSDP_OFFLOAD_PARAMS).", NULL, NULL},
    {"fsdp_min_num_params", "FSDP_MIN_NUM_PARAMS", "100000000", K_INT, false, "N",
     "Minimum number of parameters for size-based auto wrapping (FSDP_MIN_NUM_PARAMS).", NULL, NULL},
    {"fsdp_auto_wrap_policy", "FSDP_AUTO_WRAP_POLICY", NULL, K_STR, false, "POLICY",
     "Auto wrap policy (FSDP_AUTO_WRAP_POLICY).", NULL, NULL},
    {"fsdp_transformer_layer_cls_to_wrap", "FSDP_TRANSFORMER_CLS_TO_WRAP", NULL, K_STR, false, "CLASSES",
     "Transformer layer class names to wrap (FSDP_TRANSFORMER_CLS_TO_WRAP).", NULL, NULL},
    {"fsdp_backward_prefetch", "FSDP_BACKWARD_PREFETCH", NULL, K_STR, false, "POLICY",
     "Backward prefetch policy (FSDP_BACKWARD_PREFETCH).", NULL, NULL},
    {"fsdp_state_dict_type", "FSDP_STATE_DICT_TYPE", NULL, K_STR, false, "TYPE",
     "State dict type (FSDP_STATE_DICT_TYPE).", NULL, NULL},
    {"fsdp_forward_prefetch", "FSDP_FORWARD_PREFETCH", "false", K_BOOL, true, "{true,false}",
     "Prefetch the next all-gather in forward (FSDP_FORWARD_PREFETCH).", NULL, NULL},
    {"fsdp_use_orig_params", "FSDP_USE_ORIG_PARAMS", "true", K_BOOL, true, "{true,false}",
     "Use the original parameters (FSDP_USE_ORIG_PARAMS).", NULL, NULL},
    {"fsdp_cpu_ram_efficient_loading", "FSDP_CPU_RAM_EFFICIENT_LOADING", "true", K_BOOL, true, "{true,false}",
     "Only rank 0 loads the checkpoint (FSDP_CPU_RAM_EFFICIENT_LOADING; needs --fsdp_sync_module_states true).",
     NULL, NULL},
    {"fsdp_sync_module_states", "FSDP_SYNC_MODULE_STATES", "true", K_BOOL, true, "{true,false}",
     "Broadcast module parameters from rank 0 (FSDP_SYNC_MODULE_STATES).", NULL, NULL},
    {"fsdp_activation_checkpointing", "FSDP_ACTIVATION_CHECKPOINTING", "false", K_BOOL, true, "{true,false}",
     "Activation checkpointing (FSDP_ACTIVATION_CHECKPOINTING).", NULL, NULL},
    {"fsdp_activation_checkpointing_offload", "FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD", "false", K_BOOL, true,
     "{true,false}", "Offload checkpointed activations to CPU (FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD).", NULL, NULL},
    {"fsdp_ignored_modules", "FSDP_IGNORED_MODULES", NULL, K_STR, false, "MODULES",
     "Modules FSDP ignores (FSDP_IGNORED_MODULES).", NULL, NULL},
};

static const setting DEEPSPEED[] = {
    {"zero_stage", "ACCELERATE_DEEPSPEED_ZERO_STAGE", NULL, K_INT, false, "ZERO_STAGE",
     "DeepSpeed ZeRO optimization stage (ACCEL_ZERO_STAGE; 2 when unset).", NULL, NULL},
    {"gradient_accumulation_steps", "ACCELERATE_GRADIENT_ACCUMULATION_STEPS", NULL, K_INT, false, "N",
     "Number of gradient accumulation steps (ACCEL_GRADIENT_ACCUMULATION_STEPS).", NULL, NULL},
    {"gradient_clipping", "ACCELERATE_GRADIENT_CLIPPING", NULL, K_FLOAT, true, "NORM",
     "DeepSpeed gradient clipping: clip the global grad norm in optimizer.step (ACCEL_GRADIENT_CLIPPING).", NULL, NULL},
    {"offload_optimizer_device", "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE", NULL, K_STR, true,
     "{none,cpu,nvme}",
     "ZeRO-Offload of the optimizer state: cpu (host memory; a no-op for a cpu model), nvme (a file per rank "
     "under --offload_optimizer_nvme_path) (ACCEL_OFFLOAD_OPTIMIZER_DEVICE).", NULL, NULL},
    {"offload_param_device", "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE", NULL, K_STR, true, "{none,cpu,nvme}",
     "ZeRO-3 parameter offload: cpu (a no-op for accel: its shards are in host memory), nvme (a shard file per "
     "rank under --offload_param_nvme_path) (ACCEL_OFFLOAD_PARAM_DEVICE).", NULL, NULL},
    {"offload_optimizer_nvme_path", NULL, NULL, K_STR, false, "DIR",
     "Directory of the optimizer state files under --offload_optimizer_device nvme "
     "(ACCEL_OFFLOAD_OPTIMIZER_NVME_PATH).", NULL, NULL},
    {"offload_param_nvme_path", NULL, NULL, K_STR, false, "DIR",
     "Directory for --offload_param_device nvme (ACCEL_OFFLOAD_PARAM_NVME_PATH).", NULL, NULL},
    {"zero3_init_flag", "ACCELERATE_DEEPSPEED_ZERO3_INIT", NULL, K_BOOL, true, "{true,false}",
     "deepspeed.zero.Init for ZeRO-3 (for launched PyTorch scripts).", NULL, NULL},
    {"zero3_save_16bit_model", "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL", NULL, K_BOOL, true, "{true,false}",
     "Save 16-bit weights with ZeRO-3: save_model writes bf16/fp16 under that mixed precision.", NULL, NULL},
    {"deepspeed_config_file", "ACCELERATE_DEEPSPEED_CONFIG_FILE", NULL, K_STR, false, "FILE",
     "DeepSpeed JSON config (zero_optimization.stage, bf16/fp16, ...; ACCEL_DEEPSPEED_CONFIG_FILE).", NULL, NULL},
    {"deepspeed_moe_layer_cls_names", "ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES", NULL, K_STR, false, "CLASSES",
     "MoE layer class names (for launched PyTorch scripts).", NULL, NULL},
};
#define NFSDP (sizeof FSDP / sizeof *FSDP)
#define NDEEPSPEED (sizeof DEEPSPEED / sizeof *DEEPSPEED)

/* fp8 (accelerate/commands/launch.py "FP8 Arguments", utils/launch.py
 * setup_fp8_env): each value is exported as ACCELERATE_<env> (and
 * ACCEL_<env>, so a flag beats a stray ACCEL_FP8_* of the caller, which the
 * library reads first) when mixed_precision is fp8, with the argparse default
 * when neither flag nor fp8_config sets it. The config wizard asks the same
 * choices (cli.h). */
const char *const CLI_FP8_BACKENDS[] = {"ao", "te", NULL};
const char *const CLI_FP8_FORMATS[] = {"HYBRID", "E4M3", "E5M2", NULL};
const char *const CLI_FP8_ALGOS[] = {"max", "most_recent", NULL};

static const setting FP8[] = {
    {"fp8_backend", "FP8_BACKEND", NULL, K_CHOICE, false, "{ao,te}",
     "FP8 backend (ACCELERATE_FP8_BACKEND; accel runs te, TransformerEngine's recipe, and refuses the others).",
     NULL, CLI_FP8_BACKENDS},
    {"fp8_use_autocast_during_eval", "FP8_USE_AUTOCAST_DURING_EVAL", "False", K_STORE_TRUE, false, NULL,
     "Use fp8 autocast in eval mode too (ACCELERATE_FP8_USE_AUTOCAST_DURING_EVAL).", NULL, NULL},
    {"fp8_margin", "FP8_MARGIN", "0", K_INT, false, "N", "Margin of the fp8 scaling factors (ACCELERATE_FP8_MARGIN).",
     NULL, NULL},
    {"fp8_interval", "FP8_INTERVAL", "1", K_INT, false, "N",
     "Interval of the scaling factor updates (ACCELERATE_FP8_INTERVAL; accel updates every step).", NULL, NULL},
    {"fp8_format", "FP8_FORMAT", "HYBRID", K_CHOICE, false, "{HYBRID,E4M3,E5M2}",
     "fp8 recipe format (ACCELERATE_FP8_FORMAT; E5M2 is refused, as TransformerEngine).", NULL, CLI_FP8_FORMATS},
    {"fp8_amax_history_len", "FP8_AMAX_HISTORY_LEN", "1024", K_INT, false, "N",
     "Length of the amax history (ACCELERATE_FP8_AMAX_HISTORY_LEN).", "amax_history_length", NULL},
    {"fp8_amax_compute_algo", "FP8_AMAX_COMPUTE_ALGO", "most_recent", K_CHOICE, false, "{max,most_recent}",
     "How the amax history gives the scale (ACCELERATE_FP8_AMAX_COMPUTE_ALGO).", "amax_compute_algorithm",
     CLI_FP8_ALGOS},
    {"fp8_override_linear_precision", "FP8_OVERRIDE", "False,False,False", K_BOOL3, false, "FPROP,DGRAD,WGRAD",
     "Run these GEMMs in higher precision, three booleans (ACCELERATE_FP8_OVERRIDE_FPROP/DGRAD/WGRAD; accel "
     "refuses true).", NULL, NULL},
    {"fp8_enable_fsdp_float8_all_gather", "FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER", "1", K_STR_TO_BOOL, false,
     "{true,false}",
     "torchao FSDP2 float8 all-gather (ACCELERATE_FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER; for --fp8_backend ao).", NULL,
     NULL},
    {"fp8_pad_inner_dim", "FP8_PAD_INNER_DIM", "1", K_STR_TO_BOOL, false, "{true,false}",
     "torchao: pad the inner dimension of fp8 GEMMs (ACCELERATE_FP8_PAD_INNER_DIM; for --fp8_backend ao).", NULL, NULL},
};
#define NFP8 (sizeof FP8 / sizeof *FP8)

/* ParallelismConfig (accelerate/commands/launch.py "ParallelismConfig
 * Arguments", utils/launch.py prepare_extend_env_parallelism_config) and
 * Megatron-LM ("Megatron-LM Arguments", prepare_multi_gpu_env): the keys of
 * the config's parallelism_config and megatron_lm_config are the flags'
 * names. Each variable is also exported as ACCEL_<name>, which the library
 * reads first (src/accelerator/parallelism_env.h). */
static const char *const CP_BACKENDS[] = {"torch", NULL}, *const SP_BACKENDS[] = {"deepspeed", NULL},
                  *const CP_STRATEGIES[] = {"allgather", "alltoall", NULL};

static const setting PARALLELISM[] = {
    {"parallelism_config_dp_replicate_size", "PARALLELISM_CONFIG_DP_REPLICATE_SIZE", "1", K_INT, false, "N",
     "Replicas the gradients are averaged across (DDP / HSDP's outer dimension).", NULL, NULL},
    {"parallelism_config_dp_shard_size", "PARALLELISM_CONFIG_DP_SHARD_SIZE", "1", K_INT, false, "N",
     "Ranks the ZeRO / FSDP shards spread over.", NULL, NULL},
    {"parallelism_config_tp_size", "PARALLELISM_CONFIG_TP_SIZE", "1", K_INT, false, "N", "Tensor parallelism.", NULL,
     NULL},
    {"parallelism_config_cp_size", "PARALLELISM_CONFIG_CP_SIZE", "1", K_INT, false, "N",
     "Context parallelism: the sequence split for attention.", NULL, NULL},
    {"parallelism_config_cp_backend", "PARALLELISM_CONFIG_CP_BACKEND", "torch", K_CHOICE, false, "{torch}",
     "Context parallelism backend (only torch).", NULL, CP_BACKENDS},
    {"parallelism_config_cp_comm_strategy", "PARALLELISM_CONFIG_CP_COMM_STRATEGY", "allgather", K_CHOICE, false,
     "{allgather,alltoall}", "How context parallelism exchanges K/V (exported when cp_size > 1).", NULL,
     CP_STRATEGIES},
    {"parallelism_config_sp_size", "PARALLELISM_CONFIG_SP_SIZE", "1", K_INT, false, "N",
     "DeepSpeed-style (Ulysses) sequence parallelism.", NULL, NULL},
    {"parallelism_config_sp_backend", "PARALLELISM_CONFIG_SP_BACKEND", "deepspeed", K_CHOICE, false, "{deepspeed}",
     "Sequence parallelism backend (only deepspeed).", NULL, SP_BACKENDS},
};
#define NPARALLELISM (sizeof PARALLELISM / sizeof *PARALLELISM)

static const setting MEGATRON[] = {
    {"megatron_lm_tp_degree", "MEGATRON_LM_TP_DEGREE", "1", K_INT, false, "N",
     "Megatron-LM's tensor parallelism degree (opts.parallelism.tp_size).", NULL, NULL},
    {"megatron_lm_pp_degree", "MEGATRON_LM_PP_DEGREE", "1", K_INT, false, "N",
     "Megatron-LM's pipeline parallelism degree (opts.parallelism.pp_size).", NULL, NULL},
    {"megatron_lm_num_micro_batches", "MEGATRON_LM_NUM_MICRO_BATCHES", NULL, K_INT, false, "N",
     "Micro-batches per step when pp_degree > 1.", NULL, NULL},
    {"megatron_lm_sequence_parallelism", "MEGATRON_LM_SEQUENCE_PARALLELISM", NULL, K_BOOL, false, "{true,false}",
     "Sequence parallelism inside the tensor-parallel group.", NULL, NULL},
    {"megatron_lm_recompute_activations", "MEGATRON_LM_RECOMPUTE_ACTIVATIONS", NULL, K_BOOL, false, "{true,false}",
     "Recompute activations: every decoder layer checkpointed.", NULL, NULL},
    {"megatron_lm_use_distributed_optimizer", "MEGATRON_LM_USE_DISTRIBUTED_OPTIMIZER", NULL, K_BOOL, false,
     "{true,false}", "Shard the optimizer state over the data-parallel ranks (ZeRO-1).", NULL, NULL},
    {"megatron_lm_gradient_clipping", "MEGATRON_LM_GRADIENT_CLIPPING", "1.0", K_FLOAT, false, "NORM",
     "Clip the global L2 norm of the gradients (0: none).", NULL, NULL},
};
#define NMEGATRON (sizeof MEGATRON / sizeof *MEGATRON)

int launch_setting_opts(cli_opt *out) {
    int n = 0;
    for (size_t i = 0; i < NPARALLELISM; i++)
        out[n++] = (cli_opt){PARALLELISM[i].name, 0, true, PARALLELISM[i].meta, PARALLELISM[i].help};
    for (size_t i = 0; i < NMEGATRON; i++)
        out[n++] = (cli_opt){MEGATRON[i].name, 0, true, MEGATRON[i].meta, MEGATRON[i].help};
    for (size_t i = 0; i < NFSDP; i++) out[n++] = (cli_opt){FSDP[i].name, 0, true, FSDP[i].meta, FSDP[i].help};
    for (size_t i = 0; i < NDEEPSPEED; i++)
        out[n++] = (cli_opt){DEEPSPEED[i].name, 0, true, DEEPSPEED[i].meta, DEEPSPEED[i].help};
    for (size_t i = 0; i < NFP8; i++)
        out[n++] = (cli_opt){FP8[i].name, 0, FP8[i].type != K_STORE_TRUE, FP8[i].meta, FP8[i].help};
    return n;
}

/* ---------------------------------------------------------------- env list */

/* Appends kv (owned from now on; NULL: out of memory). */
static void env_append(env_list *e, char *kv) {
    char **grown = kv ? realloc(e->kv, (e->n + 2) * sizeof *e->kv) : NULL;
    if (!grown) {
        fprintf(stderr, "accel: out of memory\n");
        exit(1);
    }
    e->kv = grown;
    e->kv[e->n++] = kv;
    e->kv[e->n] = NULL;
}

void env_add(env_list *e, const char *key, const char *value) {
    size_t len = strlen(key) + strlen(value) + 2;
    char *kv = malloc(len);
    if (kv) snprintf(kv, len, "%s=%s", key, value);
    env_append(e, kv);
}

void env_add_kv(env_list *e, const char *kv) { env_append(e, strdup(kv)); }

/* Whether "KEY=..." strings a and b set the same variable. */
static bool same_key(const char *a, const char *b) {
    size_t ka = strcspn(a, "="), kb = strcspn(b, "=");
    return ka == kb && !memcmp(a, b, ka);
}

char **env_merge(char *const *base, const env_list *over) {
    size_t nb = 0;
    while (base && base[nb]) nb++;
    char **out = malloc((nb + over->n + 1) * sizeof *out);
    if (!out) {
        fprintf(stderr, "accel: out of memory\n");
        exit(1);
    }
    size_t n = 0;
    for (size_t i = 0; i < nb; i++) {
        bool replaced = false;
        for (size_t j = 0; j < over->n && !replaced; j++) replaced = same_key(base[i], over->kv[j]);
        if (!replaced) out[n++] = base[i];
    }
    for (size_t j = 0; j < over->n; j++) {
        bool later = false; /* a later entry of `over` sets it again: that one wins */
        for (size_t k = j + 1; k < over->n && !later; k++) later = same_key(over->kv[j], over->kv[k]);
        if (!later) out[n++] = over->kv[j];
    }
    out[n] = NULL;
    return out;
}

void env_free(env_list *e) {
    for (size_t i = 0; i < e->n; i++) free(e->kv[i]);
    free(e->kv);
    e->kv = NULL;
    e->n = 0;
}

/* ---------------------------------------------------------------- Python's str() */

static void py_str(const cv *v, char *out, size_t n) {
    switch (v->t) {
    case CV_BOOL: snprintf(out, n, "%s", v->b ? "True" : "False"); break;
    case CV_INT: snprintf(out, n, "%lld", v->i); break;
    case CV_FLOAT: accel__float_repr(out, n, v->f); break;
    case CV_STR: snprintf(out, n, "%s", v->s); break;
    default: cv_repr(v, true, out, n); break; /* None, lists, dicts */
    }
}

static int choice_of(const char *const *choices, const char *s, bool any_case) {
    for (int i = 0; choices[i]; i++)
        if (!(any_case ? strcasecmp : strcmp)(choices[i], s)) return i;
    return -1;
}

/* fp8_override_linear_precision's "b,b,b" as "1,0,0"; false + argparse's message. */
static bool bool3_str(const setting *s, const char *text, char *out, size_t n, char *err, size_t errn) {
    out[0] = 0;
    int k = 0;
    for (const char *p = text;; p++, k++) {
        size_t len = strcspn(p, ",");
        int b = accel__str_to_bool(p, len);
        if (b < 0) {
            snprintf(err, errn, "argument --%s: invalid <lambda> value: '%s'", s->name, text);
            return false;
        }
        snprintf(out + strlen(out), n - strlen(out), "%s%d", k ? "," : "", b);
        p += len;
        if (!*p) break;
    }
    if (k == 2) return true; /* three booleans; Accelerate fails with an IndexError on fewer */
    snprintf(err, errn, "argument --%s: expected three comma-separated booleans (fprop,dgrad,wgrad): '%s'", s->name,
             text);
    return false;
}

/* A flag's text through its argparse type, as str(type(text)) writes it;
 * false + argparse's message on a value it refuses. */
static bool flag_str(const setting *s, const char *text, char *out, size_t n, char *err, size_t errn) {
    char *end;
    const char *type = s->type == K_INT ? "int" : s->type == K_FLOAT ? "float" : "str_to_bool";
    switch (s->type) {
    case K_STR: snprintf(out, n, "%s", text); return true;
    case K_STORE_TRUE: snprintf(out, n, "True"); return true;
    case K_BOOL3: return bool3_str(s, text, out, n, err, errn);
    case K_INT: { /* beyond 64 bits: refused (strtoll's saturated value was exported: --fp8_margin 1e20's digits became 2^63 - 1) */
        errno = 0;
        long long i = strtoll(text, &end, 10);
        if (!*text || *end) break;
        if (errno == ERANGE) {
            snprintf(err, errn, "argument --%s: invalid int value: '%s' (beyond 64 bits)", s->name, text);
            return false;
        }
        snprintf(out, n, "%lld", i);
        return true;
    }
    case K_FLOAT: { /* argparse's float(): strtod's hex and "nan(...)" are none ('0x10' was exported as 16.0) */
        double f;
        if (!accel__python_float(text, &f)) break;
        accel__float_repr(out, n, f);
        return true;
    }
    case K_BOOL:
    case K_STR_TO_BOOL: {
        int b = accel__str_to_bool(text, strlen(text));
        if (b < 0) break;
        if (s->type == K_BOOL) snprintf(out, n, "%s", text);
        else snprintf(out, n, "%d", b);
        return true;
    }
    case K_CHOICE: {
        if (choice_of(s->choices, text, false) >= 0) {
            snprintf(out, n, "%s", text);
            return true;
        }
        char list[256] = "";
        for (int i = 0; s->choices[i]; i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s'%s'", i ? ", " : "", s->choices[i]);
        snprintf(err, errn, "argument --%s: invalid choice: '%s' (choose from %s)", s->name, text, list);
        return false;
    }
    }
    snprintf(err, errn, "argument --%s: invalid %s value: '%s'", s->name, type, text);
    return false;
}

static void lower(char *s) {
    for (; *s; s++)
        if (*s >= 'A' && *s <= 'Z') *s = (char)(*s - 'A' + 'a');
}

/* The section's key for s as the config file spells it: its name, the name
 * without `prefix` ("fsdp_", "fp8_": the keys may omit it), or the wizard's
 * alias; NULL when the section has none. Messages name this key, so that
 * `offload_params: maybe` is not reported as fsdp_offload_params. */
static const char *config_key(const cv *section, const setting *s, const char *prefix) {
    if (cv_get(section, s->name)) return s->name;
    if (prefix && cv_get(section, s->name + strlen(prefix))) return s->name + strlen(prefix);
    if (s->alias && cv_get(section, s->alias)) return s->alias;
    return NULL;
}

/* The section's entry for s (config_key's), NULL when absent or None. */
static const cv *config_value(const cv *section, const setting *s, const char *prefix) {
    const char *key = config_key(section, s, prefix);
    const cv *v = key ? cv_get(section, key) : NULL;
    return v && v->t != CV_NULL ? v : NULL;
}

/* A config value as setup_fp8_env / prepare_*_env's str() writes it. */
static void config_str(const setting *s, const cv *v, char *out, size_t n) {
    out[0] = 0;
    if (s->type != K_BOOL3 || v->t != CV_SEQ || v->n != 3) {
        py_str(v, out, n);
        return;
    }
    for (size_t i = 0; i < 3; i++)
        snprintf(out + strlen(out), n - strlen(out), "%s%s", i ? "," : "", v->items[i]->b ? "True" : "False");
}

/* Value of s: flag > config (section, keys maybe without prefix) > default;
 * false on a bad flag, or a K_BOOL config value str_to_bool refuses (the
 * launched program would fail on it); *out = "" when unset. */
static bool value_of(const setting *s, const launch_settings *ls, const cv *section, const char *prefix, char *out,
                     size_t n, char *err, size_t errn) {
    const char *flag = ls->vals[cli_idx(ls->opts, ls->nopts, s->name)];
    const cv *v = config_value(section, s, prefix);
    out[0] = 0;
    if (flag) {
        if (!flag_str(s, flag, out, n, err, errn)) return false;
    } else if (v) {
        config_str(s, v, out, n);
        if (s->type == K_BOOL && accel__str_to_bool(out, strlen(out)) < 0) {
            snprintf(err, errn, "config key %s: '%s' is not a boolean (true or false)", config_key(section, s, prefix),
                     out);
            return false;
        }
    } else if (s->dflt) {
        snprintf(out, n, "%s", s->dflt);
    }
    if (s->lower) lower(out);
    return true;
}

/* The setting of table[0..n) a config section's key names, as config_value
 * finds it: its name, the name without `prefix` (NULL: none) or its alias;
 * NULL when none. */
static const setting *setting_named(const setting *table, size_t n, const char *prefix, const char *key) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(key, table[i].name) ||
            (prefix && !strncmp(table[i].name, prefix, strlen(prefix)) && !strcmp(key, table[i].name + strlen(prefix))) ||
            (table[i].alias && !strcmp(key, table[i].alias)))
            return &table[i];
    return NULL;
}

/* A section's keys that name none of its settings (nor of `also`, NULL
 * terminated): Accelerate keeps them on its args without exporting them; say
 * so instead of dropping them silently (a typo such as `zero_stag` ran with
 * the default without a word). */
static void warn_unknown_keys(const cv *section, const setting *table, size_t n, const char *prefix,
                              const char *const *also, const char *section_name, const char *what) {
    for (size_t i = 0; section && section->t == CV_MAP && i < section->n; i++) {
        const char *k = section->keys[i];
        bool known = setting_named(table, n, prefix, k) != NULL;
        for (size_t j = 0; also && also[j] && !known; j++) known = !strcmp(k, also[j]);
        if (!known) fprintf(stderr, "accel launch: warning: %s.%s is not %s; ignored\n", section_name, k, what);
    }
}

/* Python's bool() of the value Accelerate's launcher holds for s: the flag's
 * string (any non-empty one is true, 'false' too), else the config's value as
 * read (0, false and '' are false; 'no' is true), else the default. */
static bool py_truthy(const setting *s, const launch_settings *ls, const cv *section, const char *prefix) {
    const char *flag = ls->vals[cli_idx(ls->opts, ls->nopts, s->name)];
    if (flag) return flag[0] != 0;
    const cv *v = config_value(section, s, prefix);
    if (!v) return s->dflt && accel__str_to_bool(s->dflt, strlen(s->dflt)) == 1;
    switch (v->t) {
    case CV_BOOL: return v->b;
    case CV_INT: return v->i != 0;
    case CV_FLOAT: return v->f != 0;
    case CV_STR: return v->s[0] != 0;
    default: return v->n != 0;
    }
}

bool launch_export_fsdp(env_list *e, const launch_settings *ls, const cv *fsdp_config, bool quiet, char *err,
                        size_t errn) {
    env_add(e, "ACCELERATE_USE_FSDP", "true");
    char val[1024], cpu_ram[1024] = "", sync[1024] = "";
    bool py_cpu_ram = false, py_sync = false;
    for (size_t i = 0; i < NFSDP; i++) {
        if (!value_of(&FSDP[i], ls, fsdp_config, "fsdp_", val, sizeof val, err, errn)) return false;
        if (!strcmp(FSDP[i].name, "fsdp_cpu_ram_efficient_loading")) {
            snprintf(cpu_ram, sizeof cpu_ram, "%s", val);
            py_cpu_ram = py_truthy(&FSDP[i], ls, fsdp_config, "fsdp_");
        }
        if (!strcmp(FSDP[i].name, "fsdp_sync_module_states")) {
            snprintf(sync, sizeof sync, "%s", val);
            py_sync = py_truthy(&FSDP[i], ls, fsdp_config, "fsdp_");
        }
        if (val[0] || FSDP[i].dflt) env_add(e, FSDP[i].env, val);
    }
    /* Refused where the script's FSDP plugin would refuse it (the values as
     * str_to_bool reads them), and where Accelerate's launcher does (its
     * check is Python's truth of the raw values: a config's 'no' is true) */
    if ((accel__str_to_bool(cpu_ram, strlen(cpu_ram)) == 1 && accel__str_to_bool(sync, strlen(sync)) == 0) ||
        (py_cpu_ram && !py_sync)) {
        snprintf(err, errn, "When using `--fsdp_cpu_ram_efficient_loading` set `--fsdp_sync_module_states` to `True`");
        return false;
    }
    if (!quiet) warn_unknown_keys(fsdp_config, FSDP, NFSDP, "fsdp_", NULL, "fsdp_config", "an FSDP setting");
    return true;
}

/* deepspeed_config keys `accelerate config` may write that accel's launcher
 * has no setting for (DeepSpeed's own multi-node launcher): known, unused. */
static const char *const DS_LAUNCHER_KEYS[] = {"deepspeed_multinode_launcher", "deepspeed_hostfile",
                                               "deepspeed_exclusion_filter", "deepspeed_inclusion_filter", NULL};

bool launch_export_deepspeed(env_list *e, const launch_settings *ls, const cv *ds_config, bool mp_from_config,
                             const char *ds_file_abs, bool quiet, char *err, size_t errn) {
    if (!quiet)
        warn_unknown_keys(ds_config, DEEPSPEED, NDEEPSPEED, NULL, DS_LAUNCHER_KEYS, "deepspeed_config",
                          "a DeepSpeed setting");
    /* ACCELERATE_CONFIG_DS_FIELDS: the deepspeed_config keys (and mixed_precision when the
     * config file chose it), which Accelerate refuses to combine with a DeepSpeed JSON. */
    char fields[4096] = "";
    for (size_t i = 0; ds_config && ds_config->t == CV_MAP && i < ds_config->n; i++)
        snprintf(fields + strlen(fields), sizeof fields - strlen(fields), "%s%s", i ? "," : "", ds_config->keys[i]);
    if (mp_from_config)
        snprintf(fields + strlen(fields), sizeof fields - strlen(fields), "%smixed_precision", fields[0] ? "," : "");
    lower(fields);
    env_add(e, "ACCELERATE_CONFIG_DS_FIELDS", fields);
    env_add(e, "ACCELERATE_USE_DEEPSPEED", "true");
    char val[1024];
    for (size_t i = 0; i < NDEEPSPEED; i++) {
        bool is_file = !strcmp(DEEPSPEED[i].name, "deepspeed_config_file");
        if (is_file) snprintf(val, sizeof val, "%s", ds_file_abs ? ds_file_abs : "");
        else if (!value_of(&DEEPSPEED[i], ls, ds_config, NULL, val, sizeof val, err, errn)) return false;
        if (val[0] && DEEPSPEED[i].env) env_add(e, DEEPSPEED[i].env, val);
    }
    return true;
}

/* A deepspeed_config value its variable's reader takes: Accelerate exports
 * str(value) and the reader applies int() / float() / str_to_bool(), so
 * `zero_stage: '3'`, `gradient_clipping: "1.0"` and `zero3_init_flag: 1` run
 * there and here; a list or mapping, or a value whose text the reader
 * refuses, does not: unchecked, `zero_stage: [3]` ran stage 2 (the
 * default), `zero_stage: true` stage 1, `gradient_clipping: true` clipped at
 * 1.0. A string setting takes what str() writes of a number, not a YAML
 * boolean: `offload_optimizer_device: no` offloaded nothing (DeepSpeed
 * refuses "False"). */
static bool ds_config_ok(const setting *s, const cv *v) {
    if (v->t == CV_SEQ || v->t == CV_MAP) return false;
    if (s->type == K_STR) return v->t != CV_BOOL;
    char text[512], out[512], err[512];
    config_str(s, v, text, sizeof text);
    return flag_str(s, text, out, sizeof out, err, sizeof err);
}

bool cfg_check_deepspeed_config(const cv *section, const char *path, char *err, size_t errn) {
    for (size_t i = 0; section && section->t == CV_MAP && i < section->n; i++) {
        const setting *s = setting_named(DEEPSPEED, NDEEPSPEED, NULL, section->keys[i]);
        const cv *v = section->items[i];
        if (!s || v->t == CV_NULL || ds_config_ok(s, v)) continue; /* unknown keys: warned about at launch */
        char val[256] = "";
        cv_repr(v, false, val, sizeof val);
        snprintf(err, errn, "The config file at %s has a bad value for `deepspeed_config.%s`: %s (expected %s)", path,
                 s->name, val, s->type == K_INT ? "an integer" : s->type == K_FLOAT ? "a number"
                 : s->type == K_BOOL ? "true or false" : "a string");
        return false;
    }
    return true;
}

/* ---------------------------------------------------------------- fp8 */

/* Whether a config value fits s (choices in any case: `accelerate config` writes backend TE). */
static bool fp8_config_ok(const setting *s, const cv *v) {
    switch (s->type) {
    case K_CHOICE: return v->t == CV_STR && choice_of(s->choices, v->s, true) >= 0;
    case K_INT: return v->t == CV_INT;
    case K_STORE_TRUE:
    case K_STR_TO_BOOL: return v->t == CV_BOOL;
    case K_BOOL3:
        if (v->t != CV_SEQ || v->n != 3) return false;
        for (size_t i = 0; i < 3; i++)
            if (v->items[i]->t != CV_BOOL) return false;
        return true;
    default: return false; /* no fp8 setting has the other kinds */
    }
}

static const char *fp8_expected(const setting *s) {
    switch (s->type) {
    case K_CHOICE: return "one of";
    case K_INT: return "an integer";
    case K_BOOL3: return "a list of three booleans (fprop, dgrad, wgrad)";
    default: return "true or false";
    }
}

bool cfg_check_fp8_config(const cv *section, const char *path, char *err, size_t errn) {
    for (size_t i = 0; section && section->t == CV_MAP && i < section->n; i++) {
        const char *k = section->keys[i];
        const cv *v = section->items[i];
        const setting *s = setting_named(FP8, NFP8, "fp8_", k);
        if (!s && (!strcmp(k, "optimization_level") || !strcmp(k, "fp8_opt_level") || !strcmp(k, "opt_level"))) {
            snprintf(err, errn, "The config file at %s has `fp8_config.%s`, MS-AMP's optimization level: MS-AMP is no "
                     "fp8 backend any more (Accelerate 1.16 dropped it; its launcher passes the key on unread): remove "
                     "the key", path, k);
            return false;
        }
        if (!s) {
            char known[1024] = "";
            for (size_t j = 0; j < NFP8; j++)
                snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", j ? ", " : "",
                         FP8[j].name + strlen("fp8_"));
            snprintf(err, errn, "The config file at %s has an unknown key `fp8_config.%s` (known: %s)", path, k, known);
            return false;
        }
        if (v->t == CV_NULL || fp8_config_ok(s, v)) continue;
        char val[256] = "", choices[256] = "";
        cv_repr(v, false, val, sizeof val);
        for (int c = 0; s->type == K_CHOICE && s->choices[c]; c++)
            snprintf(choices + strlen(choices), sizeof choices - strlen(choices), " %s", s->choices[c]);
        snprintf(err, errn, "The config file at %s has a bad value for `fp8_config.%s`: %s (expected %s%s)", path, k,
                 val, fp8_expected(s), choices);
        return false;
    }
    return true;
}

/* ACCELERATE_<name> and ACCEL_<name> (name: FP8_...). */
static void fp8_env_add(env_list *e, const char *name, const char *value) {
    char key[96];
    snprintf(key, sizeof key, "ACCELERATE_%s", name);
    env_add(e, key, value);
    snprintf(key, sizeof key, "ACCEL_%s", name);
    env_add(e, key, value);
}

bool launch_export_fp8(env_list *e, const launch_settings *ls, const cv *fp8_config, bool fp8, char *err,
                       size_t errn) {
    static const char *const GEMM[3] = {"FPROP", "DGRAD", "WGRAD"};
    char val[1024];
    for (size_t i = 0; i < NFP8; i++) {
        if (!value_of(&FP8[i], ls, fp8_config, "fp8_", val, sizeof val, err, errn)) return false;
        if (!fp8 || !val[0]) continue;
        if (FP8[i].type != K_BOOL3) {
            fp8_env_add(e, FP8[i].env, val);
            continue;
        }
        const char *p = val; /* "b,b,b": FP8_OVERRIDE_FPROP, ... */
        for (int g = 0; g < 3; g++) {
            char one[8], name[64];
            size_t len = strcspn(p, ",");
            snprintf(one, sizeof one, "%.*s", (int)len, p);
            snprintf(name, sizeof name, "%s_%s", FP8[i].env, GEMM[g]);
            fp8_env_add(e, name, one);
            p += len + (p[len] == ',');
        }
    }
    return true;
}

/* ---------------------------------------------------------------- parallelism, Megatron-LM */

/* NAME and ACCEL_NAME (ACCELERATE_USE_X: ACCEL_USE_X), the same value. */
static void both_env_add(env_list *e, const char *name, const char *value) {
    char key[96];
    snprintf(key, sizeof key, "ACCEL_%s", strncmp(name, "ACCELERATE_", 11) ? name : name + 11);
    env_add(e, name, value);
    env_add(e, key, value);
}

/* Where s's value came from, for the errors: "argument --X" or "config key
 * section_name.X", X as the file spells it (config_key). */
static void source_of(const setting *s, const launch_settings *ls, const cv *section, const char *prefix,
                      const char *section_name, char *out, size_t n) {
    const char *key = config_key(section, s, prefix);
    if (ls->vals[cli_idx(ls->opts, ls->nopts, s->name)]) snprintf(out, n, "argument --%s", s->name);
    else snprintf(out, n, "config key %s.%s", section_name, key ? key : s->name);
}

/* The values of a table (flag > config > default) into vals[i]; sizes and
 * counts checked >= 1, the norm finite >= 0, in ints[i] / *norm. */
static bool parallel_values(const setting *tab, size_t n, const launch_settings *ls, const cv *section,
                            const char *section_name, char (*vals)[64], long *ints, double *norm, char *err,
                            size_t errn) {
    for (size_t i = 0; i < n; i++) {
        const setting *s = &tab[i];
        if (!value_of(s, ls, section, NULL, vals[i], 64, err, errn)) return false;
        ints[i] = 1;
        /* the choices are checked already: a flag's by flag_str, a key's by cfg_check_parallel_config */
        if (!vals[i][0] || (s->type != K_INT && s->type != K_FLOAT)) continue;
        char from[160], *end;
        source_of(s, ls, section, NULL, section_name, from, sizeof from);
        errno = 0;
        if (s->type == K_INT && ((ints[i] = strtol(vals[i], &end, 10)) < 1 || *end || errno || ints[i] > 1 << 20)) {
            snprintf(err, errn, "%s: '%s' is not a size (an integer from 1 to %d)", from, vals[i], 1 << 20);
            return false;
        }
        if (s->type == K_FLOAT && (!accel__python_float(vals[i], norm) || !isfinite(*norm) || *norm < 0)) {
            snprintf(err, errn, "%s: '%s' is not a gradient norm (a finite number >= 0; 0: no clipping)", from,
                     vals[i]);
            return false;
        }
    }
    return true;
}

enum { P_DP_REPLICATE, P_DP_SHARD, P_TP, P_CP, P_CP_BACKEND, P_CP_STRATEGY, P_SP, P_SP_BACKEND };
enum { M_TP, M_PP };

/* The sizes the two ask for (1 where neither does); tp_flag names the flag tp came from. */
typedef struct mesh_sizes {
    long tp, pp, cp, sp, dr, ds;
    const char *tp_flag;
} mesh_sizes;

static mesh_sizes mesh_of(const long *pc, const long *mega, bool use_pc, bool use_mega) {
    bool pc_tp = use_pc && pc[P_TP] > 1;
    return (mesh_sizes){.tp = pc_tp ? pc[P_TP] : use_mega ? mega[M_TP] : 1,
                        .pp = use_mega ? mega[M_PP] : 1,
                        .cp = use_pc ? pc[P_CP] : 1,
                        .sp = use_pc ? pc[P_SP] : 1,
                        .dr = use_pc ? pc[P_DP_REPLICATE] : 1,
                        .ds = use_pc ? pc[P_DP_SHARD] : 1,
                        .tp_flag = use_mega && !pc_tp ? "--megatron_lm_tp_degree" : "--parallelism_config_tp_size"};
}

/* Under Megatron with neither dp size given, dp_shard is what the model's ranks leave (docs/parallelism.md). */
static bool dp_derived(const mesh_sizes *m, bool use_mega) {
    return m->dr == 1 && m->ds == 1 && (use_mega || m->tp * m->pp * m->cp * m->sp == 1);
}

/* The mesh the two ask for on `procs` processes, checked as the library
 * will check it (docs/parallelism.md), so a bad one fails before any worker
 * starts, naming the flags. */
static bool check_mesh(const long *pc, const long *mega, bool use_pc, bool use_mega, int procs, char *err,
                       size_t errn) {
    if (use_pc && use_mega && pc[P_TP] > 1 && mega[M_TP] > 1 && pc[P_TP] != mega[M_TP]) {
        snprintf(err, errn, "--parallelism_config_tp_size %ld and --megatron_lm_tp_degree %ld disagree on the "
                 "tensor-parallel size: give one of them, or the same size", pc[P_TP], mega[M_TP]);
        return false;
    }
    mesh_sizes m = mesh_of(pc, mega, use_pc, use_mega);
    double model = (double)m.tp * m.pp * m.cp * m.sp, total = model * m.dr * m.ds;
    if (use_mega && dp_derived(&m, use_mega)) {
        if (fmod(procs, model) == 0) return true;
        snprintf(err, errn, "--megatron_lm_tp_degree %ld x --megatron_lm_pp_degree %ld%s = %.0f does not divide "
                 "--num_processes %d (Megatron's data-parallel size is what they leave)", m.tp, m.pp,
                 m.cp * m.sp > 1 ? " x the context / sequence-parallel size" : "", model, procs);
        return false;
    }
    if (total == 1 || total == procs) return true; /* all 1: the default mesh, as Accelerate's total_size 1 */
    size_t at = (size_t)snprintf(err, errn, "--parallelism_config_dp_replicate_size %ld x "
                                 "--parallelism_config_dp_shard_size %ld x %s %ld x --parallelism_config_cp_size %ld "
                                 "x --parallelism_config_sp_size %ld", m.dr, m.ds, m.tp_flag, m.tp, m.cp, m.sp);
    if (m.pp > 1 && at < errn) at += (size_t)snprintf(err + at, errn - at, " x --megatron_lm_pp_degree %ld", m.pp);
    if (at < errn) snprintf(err + at, errn - at, " = %.0f, not --num_processes %d", total, procs);
    return false;
}

/* Both sections' values (flag > config > default): each setting's text,
 * the sizes as integers (1 where unset), Megatron's clipping norm. */
typedef struct parallel_vals {
    char pv[NPARALLELISM][64], mv[NMEGATRON][64];
    long pc[NPARALLELISM], mega[NMEGATRON];
    double norm;
} parallel_vals;

static bool parallel_read(const launch_settings *ls, const cv *pc_config, const cv *mega_config, parallel_vals *v,
                          char *err, size_t errn) {
    v->norm = 0;
    return parallel_values(PARALLELISM, NPARALLELISM, ls, pc_config, "parallelism_config", v->pv, v->pc, &v->norm,
                           err, errn) &&
           parallel_values(MEGATRON, NMEGATRON, ls, mega_config, "megatron_lm_config", v->mv, v->mega, &v->norm, err,
                           errn);
}

/* A section that is off exports nothing (as Accelerate's launcher), so a
 * setting given to it (a flag, or a key of its config section) would change
 * nothing without a word: each is named, with where it came from and what
 * turns the section on. A size of 1 and a false switch ask for nothing. */
static void warn_unused_settings(const setting *tab, size_t n, const launch_settings *ls, const cv *section,
                                 const char *prefix, const char *section_name, char (*vals)[64],
                                 const char *turn_on) {
    for (size_t i = 0; i < n; i++) {
        const setting *s = &tab[i];
        bool given = ls->vals[cli_idx(ls->opts, ls->nopts, s->name)] || config_value(section, s, prefix);
        if (!given || !vals[i][0] || (s->type == K_INT && !strcmp(vals[i], "1")) ||
            (s->type == K_BOOL && accel__str_to_bool(vals[i], strlen(vals[i])) == 0))
            continue;
        char from[160];
        source_of(s, ls, section, prefix, section_name, from, sizeof from);
        fprintf(stderr, "accel launch: warning: %s (%s) is ignored: the %s section is off (as Accelerate's launcher, "
                        "accel exports it only when %s)\n", from, vals[i], section_name, turn_on);
    }
}

bool launch_export_parallelism(env_list *e, const launch_settings *ls, const cv *pc_config, const cv *mega_config,
                               bool use_pc, bool use_mega, int procs, bool quiet, char *err, size_t errn) {
    parallel_vals v;
    if (!parallel_read(ls, pc_config, mega_config, &v, err, errn) ||
        ((use_pc || use_mega) && !check_mesh(v.pc, v.mega, use_pc, use_mega, procs, err, errn)))
        return false;
    if (!use_pc && !quiet)
        warn_unused_settings(PARALLELISM, NPARALLELISM, ls, pc_config, NULL, "parallelism_config", v.pv,
                             "--use_parallelism_config is given, or the config file's parallelism_config has keys and "
                             "no other paradigm flag is given, and not --cpu");
    if (!use_mega && !quiet)
        warn_unused_settings(MEGATRON, NMEGATRON, ls, mega_config, NULL, "megatron_lm_config", v.mv,
                             "--use_megatron_lm is given, or the config file says distributed_type: MEGATRON_LM, "
                             "and not --cpu");
    /* each section used: its switch, then every setting that has a value
     * (the cp comm strategy only where there is context parallelism) */
    const struct {
        bool on;
        const char *use;
        const setting *tab;
        size_t n;
        char (*vals)[64];
    } sections[] = {
        {use_pc, "ACCELERATE_USE_PARALLELISM_CONFIG", PARALLELISM, NPARALLELISM, v.pv},
        {use_mega, "ACCELERATE_USE_MEGATRON_LM", MEGATRON, NMEGATRON, v.mv},
    };
    for (size_t k = 0; k < sizeof sections / sizeof *sections; k++) {
        if (!sections[k].on) continue;
        both_env_add(e, sections[k].use, "true");
        for (size_t i = 0; i < sections[k].n; i++) {
            bool idle = sections[k].tab == PARALLELISM && i == P_CP_STRATEGY && v.pc[P_CP] <= 1;
            if (sections[k].vals[i][0] && !idle) both_env_add(e, sections[k].tab[i].env, sections[k].vals[i]);
        }
    }
    /* Accelerate 1.16's Megatron-LM switches that accel has no flag for
     * (megatron_lm_use_custom_fsdp, ...: type=bool, default False, so always
     * exported); giving one is refused as an unknown flag or config key. */
    static const char *const MEGATRON_OFF[] = {"MEGATRON_LM_USE_CUSTOM_FSDP",
                                               "MEGATRON_LM_NO_LOAD_OPTIM",
                                               "MEGATRON_LM_EOD_MASK_LOSS",
                                               "MEGATRON_LM_NO_SAVE_OPTIM",
                                               "MEGATRON_LM_OPTIMIZER_CPU_OFFLOAD",
                                               "MEGATRON_LM_USE_PRECISION_AWARE_OPTIMIZER",
                                               "MEGATRON_LM_OVERLAP_CPU_OPTIMIZER_D2H_H2D"};
    for (size_t i = 0; use_mega && i < sizeof MEGATRON_OFF / sizeof *MEGATRON_OFF; i++)
        env_add(e, MEGATRON_OFF[i], "False");
    return true;
}

bool launch_check_fsdp_off(const launch_settings *ls, const cv *fsdp_config, bool quiet, char *err, size_t errn) {
    char vals[NFSDP][64];
    for (size_t i = 0; i < NFSDP; i++) {
        const setting *s = &FSDP[i];
        if (!value_of(s, ls, fsdp_config, "fsdp_", vals[i], sizeof vals[i], err, errn)) return false;
        /* Accelerate's default asks for nothing; the strategy is read with the section off too */
        if ((s->dflt && !strcmp(vals[i], s->dflt)) || !strcmp(s->name, "fsdp_sharding_strategy")) vals[i][0] = 0;
    }
    if (!quiet)
        warn_unused_settings(FSDP, NFSDP, ls, fsdp_config, "fsdp_", "fsdp_config", vals,
                             "--use_fsdp is given, or the config file says distributed_type: FSDP; "
                             "--fsdp_sharding_strategy alone turns on accel's ZeRO without it");
    return true;
}

/* A config value of s's type (K_BOOL: a YAML boolean, or text str_to_bool reads). */
static bool parallel_config_ok(const setting *s, const cv *v) {
    switch (s->type) {
    case K_INT: return v->t == CV_INT;
    case K_FLOAT: return v->t == CV_INT || v->t == CV_FLOAT;
    case K_CHOICE: return v->t == CV_STR && choice_of(s->choices, v->s, false) >= 0;
    case K_BOOL: return v->t == CV_BOOL || (v->t == CV_STR && accel__str_to_bool(v->s, strlen(v->s)) >= 0);
    default: return false; /* no such setting has the other kinds */
    }
}

/* One section's keys (the flags' names) and value types. */
static bool check_parallel_section(const setting *tab, size_t n, const cv *section, const char *name,
                                   const char *path, char *err, size_t errn) {
    for (size_t i = 0; section && section->t == CV_MAP && i < section->n; i++) {
        const char *k = section->keys[i];
        const cv *v = section->items[i];
        const setting *s = NULL;
        for (size_t j = 0; j < n && !s; j++)
            if (!strcmp(k, tab[j].name)) s = &tab[j];
        if (!s) {
            char known[1024] = "";
            for (size_t j = 0; j < n; j++)
                snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", j ? ", " : "", tab[j].name);
            snprintf(err, errn, "The config file at %s has an unknown key `%s.%s` (accel knows: %s)", path, name, k,
                     known);
            return false;
        }
        if (v->t == CV_NULL || parallel_config_ok(s, v)) continue;
        char val[256] = "";
        cv_repr(v, false, val, sizeof val);
        snprintf(err, errn, "The config file at %s has a bad value for `%s.%s`: %s (expected %s)", path, name, k, val,
                 s->type == K_INT ? "an integer" : s->type == K_FLOAT ? "a number" : s->type == K_BOOL
                 ? "true or false" : s->meta);
        return false;
    }
    return true;
}

bool cfg_check_parallel_config(const cv *root, const char *path, char *err, size_t errn) {
    return check_parallel_section(PARALLELISM, NPARALLELISM, cv_get(root, "parallelism_config"),
                                  "parallelism_config", path, err, errn) &&
           check_parallel_section(MEGATRON, NMEGATRON, cv_get(root, "megatron_lm_config"), "megatron_lm_config",
                                  path, err, errn);
}

bool cfg_describe_mesh(const cv *cfg, char *out, size_t n) {
    const cv *pcfg = cv_get(cfg, "parallelism_config"), *dt = cv_get(cfg, "distributed_type");
    const cv *np = cv_get(cfg, "num_processes");
    bool use_pc = pcfg && pcfg->t == CV_MAP && pcfg->n;
    bool use_mega = dt && dt->t == CV_STR && !strcmp(dt->s, "MEGATRON_LM");
    if (!use_pc && !use_mega) return false;
    cli_opt opts[LAUNCH_MAX_SETTINGS];
    const char *vals[LAUNCH_MAX_SETTINGS] = {0}; /* no flags: the config's values, else the defaults */
    launch_settings ls = {opts, launch_setting_opts(opts), vals};
    char err[512];
    parallel_vals v;
    int procs = np && np->t == CV_INT && np->i >= 1 && np->i <= INT_MAX ? (int)np->i : 0;
    if (!parallel_read(&ls, pcfg, cv_get(cfg, "megatron_lm_config"), &v, err, sizeof err) ||
        (procs && !check_mesh(v.pc, v.mega, use_pc, use_mega, procs, err, sizeof err))) {
        snprintf(out, n, "invalid: %s", err);
        return true;
    }
    mesh_sizes m = mesh_of(v.pc, v.mega, use_pc, use_mega);
    long model = m.tp * m.pp * m.cp * m.sp;
    char dp[32];
    if (dp_derived(&m, use_mega) && procs) snprintf(dp, sizeof dp, "%ld", procs / model);
    else if (dp_derived(&m, use_mega)) snprintf(dp, sizeof dp, "num_processes / %ld", model);
    else snprintf(dp, sizeof dp, "%ld", m.ds);
    snprintf(out, n, "pp %ld x dp_replicate %ld x dp_shard %s x %s %ld x tp %ld", m.pp, m.dr, dp,
             m.sp > 1 ? "sp" : "cp", m.sp > 1 ? m.sp : m.cp, m.tp);
    return true;
}
