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

int launch_setting_opts(cli_opt *out) {
    int n = 0;
    for (size_t i = 0; i < NFSDP; i++) out[n++] = (cli_opt){FSDP[i].name, 0, true, FSDP[i].meta, FSDP[i].help};
    for (size_t i = 0; i < NDEEPSPEED; i++)
        out[n++] = (cli_opt){DEEPSPEED[i].name, 0, true, DEEPSPEED[i].meta, DEEPSPEED[i].help};
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
