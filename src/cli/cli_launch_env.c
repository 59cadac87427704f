/* src/cli/cli_launch_env.c — the FSDP and DeepSpeed settings of `accel launch`
 * and the variables `accelerate launch` exports for them
 * (accelerate/utils/launch.py: prepare_multi_gpu_env, prepare_deepspeed_cmd_env),
 * so that a launched PyTorch script sees the configuration it would see under
 * Accelerate. A value comes from its flag, else its fsdp_config /
 * deepspeed_config key, else Accelerate's default, and is written the way
 * Python's str() writes it (lowercased where Accelerate lowercases). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli/cli.h"

typedef enum kind { K_STR, K_INT, K_FLOAT } kind;

typedef struct setting {
    const char *name; /* flag, and key in fsdp_config / deepspeed_config */
    const char *env;  /* variable Accelerate exports (NULL: none, the flag is the library's only) */
    const char *dflt; /* Accelerate's default; NULL: exported only when set */
    kind type;        /* a flag's argparse type: str(int(v)), str(float(v)) */
    bool lower;       /* Accelerate exports str(v).lower() */
    const char *meta, *help;
} setting;

static const setting FSDP[] = {
    {"fsdp_version", "FSDP_VERSION", "1", K_STR, false, "{1,2}", "FSDP version (FSDP_VERSION)."},
    {"fsdp_sharding_strategy", "FSDP_SHARDING_STRATEGY", "FULL_SHARD", K_STR, false, "STRATEGY",
     "FSDP sharding strategy (FSDP_SHARDING_STRATEGY, ACCEL_FSDP_SHARDING_STRATEGY)."},
    {"fsdp_reshard_after_forward", "FSDP_RESHARD_AFTER_FORWARD", "true", K_STR, true, "VALUE",
     "Reshard after forward (FSDP_RESHARD_AFTER_FORWARD)."},
    {"fsdp_offload_params", "FSDP_OFFLOAD_PARAMS", "false", K_STR, true, "{true,false}",
     "Offload parameters and gradients to CPU (FSDP_OFFLOAD_PARAMS)."},
    {"fsdp_min_num_params", "FSDP_MIN_NUM_PARAMS", "100000000", K_INT, false, "N",
     "Minimum number of parameters for size-based auto wrapping (FSDP_MIN_NUM_PARAMS)."},
    {"fsdp_auto_wrap_policy", "FSDP_AUTO_WRAP_POLICY", NULL, K_STR, false, "POLICY",
     "Auto wrap policy (FSDP_AUTO_WRAP_POLICY)."},
    {"fsdp_transformer_layer_cls_to_wrap", "FSDP_TRANSFORMER_CLS_TO_WRAP", NULL, K_STR, false, "CLASSES",
     "Transformer layer class names to wrap (FSDP_TRANSFORMER_CLS_TO_WRAP)."},
    {"fsdp_backward_prefetch", "FSDP_BACKWARD_PREFETCH", NULL, K_STR, false, "POLICY",
     "Backward prefetch policy (FSDP_BACKWARD_PREFETCH)."},
    {"fsdp_state_dict_type", "FSDP_STATE_DICT_TYPE", NULL, K_STR, false, "TYPE",
     "State dict type (FSDP_STATE_DICT_TYPE)."},
    {"fsdp_forward_prefetch", "FSDP_FORWARD_PREFETCH", "false", K_STR, true, "{true,false}",
     "Prefetch the next all-gather in forward (FSDP_FORWARD_PREFETCH)."},
    {"fsdp_use_orig_params", "FSDP_USE_ORIG_PARAMS", "true", K_STR, true, "{true,false}",
     "Use the original parameters (FSDP_USE_ORIG_PARAMS)."},
    {"fsdp_cpu_ram_efficient_loading", "FSDP_CPU_RAM_EFFICIENT_LOADING", "true", K_STR, true, "{true,false}",
     "Only rank 0 loads the checkpoint (FSDP_CPU_RAM_EFFICIENT_LOADING; needs --fsdp_sync_module_states true)."},
    {"fsdp_sync_module_states", "FSDP_SYNC_MODULE_STATES", "true", K_STR, true, "{true,false}",
     "Broadcast module parameters from rank 0 (FSDP_SYNC_MODULE_STATES)."},
    {"fsdp_activation_checkpointing", "FSDP_ACTIVATION_CHECKPOINTING", "false", K_STR, true, "{true,false}",
     "Activation checkpointing (FSDP_ACTIVATION_CHECKPOINTING)."},
    {"fsdp_activation_checkpointing_offload", "FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD", "false", K_STR, true,
     "{true,false}", "Offload checkpointed activations to CPU (FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD)."},
    {"fsdp_ignored_modules", "FSDP_IGNORED_MODULES", NULL, K_STR, false, "MODULES",
     "Modules FSDP ignores (FSDP_IGNORED_MODULES)."},
};

static const setting DEEPSPEED[] = {
    {"zero_stage", "ACCELERATE_DEEPSPEED_ZERO_STAGE", NULL, K_INT, false, "ZERO_STAGE",
     "DeepSpeed ZeRO optimization stage (ACCEL_ZERO_STAGE; 2 when unset)."},
    {"gradient_accumulation_steps", "ACCELERATE_GRADIENT_ACCUMULATION_STEPS", NULL, K_INT, false, "N",
     "Number of gradient accumulation steps (ACCEL_GRADIENT_ACCUMULATION_STEPS)."},
    {"gradient_clipping", "ACCELERATE_GRADIENT_CLIPPING", NULL, K_FLOAT, true, "NORM",
     "DeepSpeed gradient clipping: clip the global grad norm in optimizer.step (ACCEL_GRADIENT_CLIPPING)."},
    {"offload_optimizer_device", "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE", NULL, K_STR, true,
     "{none,cpu,nvme}",
     "ZeRO-Offload of the optimizer state: cpu (host memory; a no-op for a cpu model), nvme (a file per rank "
     "under --offload_optimizer_nvme_path) (ACCEL_OFFLOAD_OPTIMIZER_DEVICE)."},
    {"offload_param_device", "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE", NULL, K_STR, true, "{none,cpu,nvme}",
     "ZeRO-3 parameter offload: cpu (a no-op for accel: its shards are in host memory), nvme (a shard file per "
     "rank under --offload_param_nvme_path) (ACCEL_OFFLOAD_PARAM_DEVICE)."},
    {"offload_optimizer_nvme_path", NULL, NULL, K_STR, false, "DIR",
     "Directory of the optimizer state files under --offload_optimizer_device nvme "
     "(ACCEL_OFFLOAD_OPTIMIZER_NVME_PATH)."},
    {"offload_param_nvme_path", NULL, NULL, K_STR, false, "DIR",
     "Directory for --offload_param_device nvme (ACCEL_OFFLOAD_PARAM_NVME_PATH)."},
    {"zero3_init_flag", "ACCELERATE_DEEPSPEED_ZERO3_INIT", NULL, K_STR, true, "{true,false}",
     "deepspeed.zero.Init for ZeRO-3 (for launched PyTorch scripts)."},
    {"zero3_save_16bit_model", "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL", NULL, K_STR, true, "{true,false}",
     "Save 16-bit weights with ZeRO-3: save_model writes bf16/fp16 under that mixed precision."},
    {"deepspeed_config_file", "ACCELERATE_DEEPSPEED_CONFIG_FILE", NULL, K_STR, false, "FILE",
     "DeepSpeed JSON config (zero_optimization.stage, bf16/fp16, ...; ACCEL_DEEPSPEED_CONFIG_FILE)."},
    {"deepspeed_moe_layer_cls_names", "ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES", NULL, K_STR, false, "CLASSES",
     "MoE layer class names (for launched PyTorch scripts)."},
};
#define NFSDP (sizeof FSDP / sizeof *FSDP)
#define NDEEPSPEED (sizeof DEEPSPEED / sizeof *DEEPSPEED)

/* fp8 (accelerate/commands/launch.py "FP8 Arguments", utils/launch.py
 * setup_fp8_env): each value is exported as ACCELERATE_<NAME> (and
 * ACCEL_<NAME>, so a flag beats a stray ACCEL_FP8_* of the caller, which the
 * library reads first) when mixed_precision is fp8, with the argparse default
 * when neither flag nor fp8_config sets it. */
typedef enum fp8_kind {
    F_CHOICE,     /* type=str, choices */
    F_INT,        /* type=int */
    F_STORE_TRUE, /* action="store_true": str(True) */
    F_BOOL,       /* type=str_to_bool: "1" / "0" */
    F_BOOL3       /* fp8_override_linear_precision: "b,b,b", one variable per GEMM */
} fp8_kind;

typedef struct fp8_setting {
    const char *name;  /* flag; fp8_config key with or without "fp8_" */
    const char *alias; /* the key Accelerate's `accelerate config` writes instead, or NULL */
    fp8_kind kind;
    const char *dflt;  /* the argparse default through its type; NULL: exported only when set */
    const char *const *choices;
    const char *meta, *help;
} fp8_setting;

static const char *const FP8_BACKENDS[] = {"ao", "te", "msamp", NULL};
static const char *const FP8_FORMATS[] = {"HYBRID", "E4M3", "E5M2", NULL};
static const char *const FP8_ALGOS[] = {"max", "most_recent", NULL};
static const char *const FP8_OPT_LEVELS[] = {"O1", "O2", NULL};

static const fp8_setting FP8[] = {
    {"fp8_backend", NULL, F_CHOICE, NULL, FP8_BACKENDS, "{ao,te,msamp}",
     "FP8 backend (ACCELERATE_FP8_BACKEND; accel runs te, TransformerEngine's recipe, and refuses the others)."},
    {"fp8_use_autocast_during_eval", NULL, F_STORE_TRUE, "False", NULL, NULL,
     "Use fp8 autocast in eval mode too (ACCELERATE_FP8_USE_AUTOCAST_DURING_EVAL)."},
    {"fp8_margin", NULL, F_INT, "0", NULL, "N", "Margin of the fp8 scaling factors (ACCELERATE_FP8_MARGIN)."},
    {"fp8_interval", NULL, F_INT, "1", NULL, "N",
     "Interval of the scaling factor updates (ACCELERATE_FP8_INTERVAL; accel updates every step)."},
    {"fp8_format", NULL, F_CHOICE, "HYBRID", FP8_FORMATS, "{HYBRID,E4M3,E5M2}",
     "fp8 recipe format (ACCELERATE_FP8_FORMAT; E5M2 is refused, as TransformerEngine)."},
    {"fp8_amax_history_len", "amax_history_length", F_INT, "1024", NULL, "N",
     "Length of the amax history (ACCELERATE_FP8_AMAX_HISTORY_LEN)."},
    {"fp8_amax_compute_algo", "amax_compute_algorithm", F_CHOICE, "most_recent", FP8_ALGOS, "{max,most_recent}",
     "How the amax history gives the scale (ACCELERATE_FP8_AMAX_COMPUTE_ALGO)."},
    {"fp8_override_linear_precision", NULL, F_BOOL3, "False,False,False", NULL, "FPROP,DGRAD,WGRAD",
     "Run these GEMMs in higher precision, three booleans (ACCELERATE_FP8_OVERRIDE_FPROP/DGRAD/WGRAD; accel "
     "refuses true)."},
    {"fp8_opt_level", "optimization_level", F_CHOICE, "O2", FP8_OPT_LEVELS, "{O1,O2}",
     "MS-AMP optimization level (ACCELERATE_FP8_OPT_LEVEL; for --fp8_backend msamp)."},
    {"fp8_enable_fsdp_float8_all_gather", NULL, F_BOOL, "1", NULL, "{true,false}",
     "torchao FSDP2 float8 all-gather (ACCELERATE_FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER; for --fp8_backend ao)."},
    {"fp8_pad_inner_dim", NULL, F_BOOL, "1", NULL, "{true,false}",
     "torchao: pad the inner dimension of fp8 GEMMs (ACCELERATE_FP8_PAD_INNER_DIM; for --fp8_backend ao)."},
};
#define NFP8 (sizeof FP8 / sizeof *FP8)

int launch_setting_opts(cli_opt *out) {
    int n = 0;
    for (size_t i = 0; i < NFSDP; i++) out[n++] = (cli_opt){FSDP[i].name, 0, true, FSDP[i].meta, FSDP[i].help};
    for (size_t i = 0; i < NDEEPSPEED; i++)
        out[n++] = (cli_opt){DEEPSPEED[i].name, 0, true, DEEPSPEED[i].meta, DEEPSPEED[i].help};
    for (size_t i = 0; i < NFP8; i++)
        out[n++] = (cli_opt){FP8[i].name, 0, FP8[i].kind != F_STORE_TRUE, FP8[i].meta, FP8[i].help};
    return n;
}

/* ---------------------------------------------------------------- env list */

void env_add(env_list *e, const char *key, const char *value) {
    size_t len = strlen(key) + strlen(value) + 2;
    char *kv = malloc(len);
    char **grown = realloc(e->kv, (e->n + 2) * sizeof *e->kv);
    if (!kv || !grown) {
        fprintf(stderr, "accel: out of memory\n");
        exit(1);
    }
    snprintf(kv, len, "%s=%s", key, value);
    e->kv = grown;
    e->kv[e->n++] = kv;
    e->kv[e->n] = NULL;
}

void env_free(env_list *e) {
    for (size_t i = 0; i < e->n; i++) free(e->kv[i]);
    free(e->kv);
    e->kv = NULL;
    e->n = 0;
}

/* ---------------------------------------------------------------- Python's str() */

/* repr(float): the shortest digits that read back, positional for exponents
 * -4..15, with ".0" on integral values. */
static void py_float(double f, char *out, size_t n) {
    if (isnan(f)) {
        snprintf(out, n, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(out, n, f < 0 ? "-inf" : "inf");
        return;
    }
    int prec = 1;
    char e[40];
    for (; prec <= 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec - 1, f);
        if (strtod(e, NULL) == f) break;
    }
    int exp10 = atoi(strchr(e, 'e') + 1);
    if (exp10 < -4 || exp10 >= 16) { /* 1e+16, 1.5e-07: C's %e with the shortest digits */
        snprintf(out, n, "%.*e", prec - 1, f);
        return;
    }
    int decimals = prec - 1 - exp10;
    snprintf(out, n, "%.*f", decimals > 0 ? decimals : 0, f);
    if (!strchr(out, '.')) snprintf(out + strlen(out), n - strlen(out), ".0");
}

static void py_str(const cv *v, char *out, size_t n) {
    switch (v->t) {
    case CV_BOOL: snprintf(out, n, "%s", v->b ? "True" : "False"); break;
    case CV_INT: snprintf(out, n, "%lld", v->i); break;
    case CV_FLOAT: py_float(v->f, out, n); break;
    case CV_STR: snprintf(out, n, "%s", v->s); break;
    default: cv_repr(v, true, out, n); break; /* None, lists, dicts */
    }
}

/* A flag's text through its argparse type, as str(type(text)) writes it. */
static bool flag_str(const setting *s, const char *text, char *out, size_t n, char *err, size_t errn) {
    char *end;
    if (s->type == K_INT) {
        long long i = strtoll(text, &end, 10);
        if (!*text || *end) goto bad;
        snprintf(out, n, "%lld", i);
    } else if (s->type == K_FLOAT) {
        double f = strtod(text, &end);
        if (!*text || *end) goto bad;
        py_float(f, out, n);
    } else {
        snprintf(out, n, "%s", text);
    }
    return true;
bad:
    snprintf(err, errn, "argument --%s: invalid %s value: '%s'", s->name, s->type == K_INT ? "int" : "float", text);
    return false;
}

static void lower(char *s) {
    for (; *s; s++)
        if (*s >= 'A' && *s <= 'Z') *s = (char)(*s - 'A' + 'a');
}

/* The config value of setting s in section (fsdp_config keys may omit "fsdp_"). */
static const cv *config_value(const cv *section, const setting *s, bool fsdp) {
    const cv *v = cv_get(section, s->name);
    if (!v && fsdp) v = cv_get(section, s->name + strlen("fsdp_"));
    return v && v->t != CV_NULL ? v : NULL;
}

/* Value of s: flag > config > default; false on a bad flag; *out = "" when unset. */
static bool value_of(const setting *s, const launch_settings *ls, const cv *section, bool fsdp, char *out, size_t n,
                     char *err, size_t errn) {
    const char *flag = ls->vals[cli_idx(ls->opts, ls->nopts, s->name)];
    const cv *v = config_value(section, s, fsdp);
    out[0] = 0;
    if (flag) {
        if (!flag_str(s, flag, out, n, err, errn)) return false;
    } else if (v) {
        py_str(v, out, n);
    } else if (s->dflt) {
        snprintf(out, n, "%s", s->dflt);
    }
    if (s->lower) lower(out);
    return true;
}

bool cli_truthy(const char *s) {
    if (!s) return false;
    static const char *const YES[] = {"y", "yes", "t", "true", "on", "1"};
    for (size_t i = 0; i < sizeof YES / sizeof *YES; i++)
        if (!strcasecmp(s, YES[i])) return true;
    return false;
}

/* fsdp_config keys that are none of the settings: Accelerate keeps them on its
 * args without exporting them; say so instead of dropping them silently. */
static void warn_unknown_fsdp_keys(const cv *section) {
    for (size_t i = 0; section && section->t == CV_MAP && i < section->n; i++) {
        const char *k = section->keys[i];
        bool known = false;
        for (size_t j = 0; j < NFSDP && !known; j++)
            known = !strcmp(k, FSDP[j].name) || !strcmp(k, FSDP[j].name + strlen("fsdp_"));
        if (!known) fprintf(stderr, "accel launch: warning: fsdp_config.%s is not an FSDP setting; ignored\n", k);
    }
}

bool launch_export_fsdp(env_list *e, const launch_settings *ls, const cv *fsdp_config, bool quiet, char *err,
                        size_t errn) {
    env_add(e, "ACCELERATE_USE_FSDP", "true");
    char val[1024], cpu_ram[1024] = "", sync[1024] = "";
    for (size_t i = 0; i < NFSDP; i++) {
        if (!value_of(&FSDP[i], ls, fsdp_config, true, val, sizeof val, err, errn)) return false;
        if (!strcmp(FSDP[i].name, "fsdp_cpu_ram_efficient_loading")) snprintf(cpu_ram, sizeof cpu_ram, "%s", val);
        if (!strcmp(FSDP[i].name, "fsdp_sync_module_states")) snprintf(sync, sizeof sync, "%s", val);
        if (val[0] || FSDP[i].dflt) env_add(e, FSDP[i].env, val);
    }
    if (cli_truthy(cpu_ram) && !cli_truthy(sync)) {
        snprintf(err, errn, "When using `--fsdp_cpu_ram_efficient_loading` set `--fsdp_sync_module_states` to `True`");
        return false;
    }
    if (!quiet) warn_unknown_fsdp_keys(fsdp_config);
    return true;
}

bool launch_export_deepspeed(env_list *e, const launch_settings *ls, const cv *ds_config, bool mp_from_config,
                             const char *ds_file_abs, char *err, size_t errn) {
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
        else if (!value_of(&DEEPSPEED[i], ls, ds_config, false, val, sizeof val, err, errn)) return false;
        if (val[0] && DEEPSPEED[i].env) env_add(e, DEEPSPEED[i].env, val);
    }
    return true;
}

/* ---------------------------------------------------------------- fp8 */

/* Accelerate's str_to_bool: 1, 0, or -1 when s is neither. */
static int str_to_bool(const char *s, size_t len) {
    static const char *const YES[] = {"y", "yes", "t", "true", "on", "1"};
    static const char *const NO[] = {"n", "no", "f", "false", "off", "0"};
    for (size_t i = 0; i < sizeof YES / sizeof *YES; i++) {
        if (strlen(YES[i]) == len && !strncasecmp(s, YES[i], len)) return 1;
        if (strlen(NO[i]) == len && !strncasecmp(s, NO[i], len)) return 0;
    }
    return -1;
}

static int choice_of(const char *const *choices, const char *s, bool any_case) {
    for (int i = 0; choices[i]; i++)
        if (!(any_case ? strcasecmp : strcmp)(choices[i], s)) return i;
    return -1;
}

/* A flag's text as argparse's type writes it back (out: the value, for
 * F_BOOL3 "b,b,b" of 1/0); false + argparse's message on a value it refuses. */
static bool fp8_flag_str(const fp8_setting *s, const char *text, char *out, size_t n, char *err, size_t errn) {
    char *end;
    switch (s->kind) {
    case F_STORE_TRUE: snprintf(out, n, "True"); return true;
    case F_INT: {
        long long i = strtoll(text, &end, 10);
        if (!*text || *end) break;
        snprintf(out, n, "%lld", i);
        return true;
    }
    case F_BOOL: {
        int b = str_to_bool(text, strlen(text));
        if (b < 0) break;
        snprintf(out, n, "%d", b);
        return true;
    }
    case F_BOOL3: { /* three booleans; Accelerate fails with an IndexError on fewer */
        out[0] = 0;
        int k = 0;
        for (const char *p = text;; p++, k++) {
            size_t len = strcspn(p, ",");
            int b = str_to_bool(p, len);
            if (b < 0) {
                snprintf(err, errn, "argument --%s: invalid <lambda> value: '%s'", s->name, text);
                return false;
            }
            snprintf(out + strlen(out), n - strlen(out), "%s%d", k ? "," : "", b);
            p += len;
            if (!*p) break;
        }
        if (k == 2) return true;
        snprintf(err, errn, "argument --%s: expected three comma-separated booleans (fprop,dgrad,wgrad): '%s'",
                 s->name, text);
        return false;
    }
    case F_CHOICE: {
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
    snprintf(err, errn, "argument --%s: invalid %s value: '%s'", s->name, s->kind == F_INT ? "int" : "str_to_bool",
             text);
    return false;
}

/* The fp8_config entry of s: "fp8_<x>", "<x>", or the wizard's alias. */
static const cv *fp8_config_value(const cv *section, const fp8_setting *s) {
    const cv *v = cv_get(section, s->name);
    if (!v) v = cv_get(section, s->name + strlen("fp8_"));
    if (!v && s->alias) v = cv_get(section, s->alias);
    return v && v->t != CV_NULL ? v : NULL;
}

static const fp8_setting *fp8_setting_of(const char *key) {
    for (size_t i = 0; i < NFP8; i++)
        if (!strcmp(key, FP8[i].name) || !strcmp(key, FP8[i].name + strlen("fp8_")) ||
            (FP8[i].alias && !strcmp(key, FP8[i].alias)))
            return &FP8[i];
    return NULL;
}

/* Whether a config value fits s (choices in any case: `accelerate config` writes backend TE). */
static bool fp8_config_ok(const fp8_setting *s, const cv *v) {
    switch (s->kind) {
    case F_CHOICE: return v->t == CV_STR && choice_of(s->choices, v->s, true) >= 0;
    case F_INT: return v->t == CV_INT;
    case F_STORE_TRUE:
    case F_BOOL: return v->t == CV_BOOL;
    case F_BOOL3:
        if (v->t != CV_SEQ || v->n != 3) return false;
        for (size_t i = 0; i < 3; i++)
            if (v->items[i]->t != CV_BOOL) return false;
        return true;
    }
    return false;
}

static const char *fp8_expected(const fp8_setting *s) {
    switch (s->kind) {
    case F_CHOICE: return "one of";
    case F_INT: return "an integer";
    case F_BOOL3: return "a list of three booleans (fprop, dgrad, wgrad)";
    default: return "true or false";
    }
}

bool cfg_check_fp8_config(const cv *section, const char *path, char *err, size_t errn) {
    for (size_t i = 0; section && section->t == CV_MAP && i < section->n; i++) {
        const char *k = section->keys[i];
        const cv *v = section->items[i];
        const fp8_setting *s = fp8_setting_of(k);
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
        for (int c = 0; s->kind == F_CHOICE && s->choices[c]; c++)
            snprintf(choices + strlen(choices), sizeof choices - strlen(choices), " %s", s->choices[c]);
        snprintf(err, errn, "The config file at %s has a bad value for `fp8_config.%s`: %s (expected %s%s)", path, k,
                 val, fp8_expected(s), choices);
        return false;
    }
    return true;
}

/* s's value: flag > fp8_config > default, as setup_fp8_env's str() writes it; "" when unset. */
static bool fp8_value(const fp8_setting *s, const launch_settings *ls, const cv *section, char *out, size_t n,
                      char *err, size_t errn) {
    const char *flag = ls->vals[cli_idx(ls->opts, ls->nopts, s->name)];
    const cv *v = fp8_config_value(section, s);
    out[0] = 0;
    if (flag) return fp8_flag_str(s, flag, out, n, err, errn);
    if (v && s->kind == F_BOOL3 && v->t == CV_SEQ && v->n == 3) {
        for (size_t i = 0; i < 3; i++)
            snprintf(out + strlen(out), n - strlen(out), "%s%s", i ? "," : "", v->items[i]->b ? "True" : "False");
    } else if (v) {
        py_str(v, out, n);
    } else if (s->dflt) {
        snprintf(out, n, "%s", s->dflt);
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
    static const char *const GEMM[3] = {"FP8_OVERRIDE_FPROP", "FP8_OVERRIDE_DGRAD", "FP8_OVERRIDE_WGRAD"};
    char val[1024];
    for (size_t i = 0; i < NFP8; i++) {
        if (!fp8_value(&FP8[i], ls, fp8_config, val, sizeof val, err, errn)) return false;
        if (!fp8 || !val[0]) continue;
        if (FP8[i].kind == F_BOOL3) {
            const char *p = val; /* "b,b,b" */
            for (int g = 0; g < 3; g++) {
                char one[8];
                size_t len = strcspn(p, ",");
                snprintf(one, sizeof one, "%.*s", (int)len, p);
                fp8_env_add(e, GEMM[g], one);
                p += len + (p[len] == ',');
            }
            continue;
        }
        char name[64];
        snprintf(name, sizeof name, "%s", FP8[i].name);
        for (char *c = name; *c; c++)
            if (*c >= 'a' && *c <= 'z') *c = (char)(*c - 'a' + 'A');
        fp8_env_add(e, name, val);
    }
    return true;
}
