/* Which ZeRO stage, and the DeepSpeed JSON's other settings: from the
 * options, ACCEL_ZERO_STAGE / ACCEL_FSDP_SHARDING_STRATEGY and
 * ACCEL_DEEPSPEED_CONFIG_FILE (what `accel launch` sets). */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "accelerator_internal.h"
#include "strategy.h"
#include "core/env.h"
#include "core/str_to_bool.h"
#include "io/io_internal.h"

#define FN "accel_accelerator_new"

/* Set, even empty: an empty value is refused as any bad one (core/env.h). */
static const char *env(const char *name) { return getenv(name); }

static accel_status check_stage(long v, const char *how, int *out) {
    if (v < 0 || v > 3)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, FN ": %s: ZeRO stage must be 0, 1, 2 or 3 (got %ld)", how, v);
    *out = (int)v;
    return ACCEL_OK;
}

static accel_status parse_stage(const char *s, const char *how, int *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, FN ": %s=\"%s\" is not a ZeRO stage (0, 1, 2, 3)", how, s);
    return check_stage(v, how, out);
}

/* FSDP's ShardingStrategy by name or by torch's enum value (1..5); the
 * HYBRID ones shard within a machine and replicate across machines. */
static accel_status parse_fsdp(const char *s, const char *how, int *out, bool *hybrid) {
    static const struct { const char *name; int stage; bool hybrid; } MAP[] = {
        {"FULL_SHARD", 3, false}, {"SHARD_GRAD_OP", 2, false}, {"NO_SHARD", 0, false},
        {"HYBRID_SHARD", 3, true}, {"HYBRID_SHARD_ZERO2", 2, true},
    };
    for (int k = 0; k < 5; k++) {
        char num[2] = {(char)('1' + k), 0};
        if (strcasecmp(s, MAP[k].name) && strcmp(s, num)) continue;
        *out = MAP[k].stage;
        *hybrid = MAP[k].hybrid;
        return ACCEL_OK;
    }
    return accel_set_error(ACCEL_ERR_INVALID_ARG,
                           FN ": %s=\"%s\": unknown FSDP sharding strategy (FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, "
                           "HYBRID_SHARD, HYBRID_SHARD_ZERO2)",
                           how, s);
}

/* A boolean variable, read as Accelerate's str_to_bool; unset leaves *out. */
static accel_status env_bool(const char *name, bool *out) { return accel__parse_bool(FN, name, env(name), out); }

/* ---------------------------------------------------------------- offload */

/* The offload settings as given, before they are checked against the stage. */
typedef struct offload_given {
    char opt_dev[16], param_dev[16]; /* "" when absent */
    char opt_path[1024], param_path[1024];
    int buffer_count;                /* 0: absent */
    int64_t block_bytes;             /* 0: absent */
} offload_given;

/* Copies a JSON string value into out (n bytes); false + error when it is not a string or too long. */
static bool json_str(json_t *v, const char *path, const char *key, char *out, size_t n) {
    if (!v || json_is_null(v)) return true; /* Accelerate writes nvme_path: null when unused */
    if (!json_is_string(v) || strlen(json_string_value(v)) >= n) {
        accel_set_error(ACCEL_ERR_FORMAT, FN ": %s: zero_optimization.%s must be a string of fewer than %zu "
                        "characters", path, key, n);
        return false;
    }
    snprintf(out, n, "%s", json_string_value(v));
    return true;
}

/* zero_optimization.offload_optimizer / offload_param: DeepSpeed's keys. The
 * ones accel has no use for (pinned memory, pipelined or asynchronous I/O)
 * are accepted; an unknown key or a partial offload (ratio < 1) is refused. */
static accel_status read_json_offload(json_t *root, json_t *zo, const char *path, offload_given *g) {
    static const char *OPT_KEYS[] = {"device", "nvme_path", "buffer_count", "pin_memory", "pipeline_read",
                                     "pipeline_write", "fast_init", "ratio", NULL};
    static const char *PARAM_KEYS[] = {"device", "nvme_path", "buffer_count", "buffer_size", "max_in_cpu",
                                       "pin_memory", NULL};
    const char *sections[2] = {"offload_optimizer", "offload_param"};
    const char *const *keys[2] = {OPT_KEYS, PARAM_KEYS};
    for (int k = 0; k < 2; k++) {
        json_t *sec = json_object_get(zo, sections[k]);
        if (!sec || json_is_null(sec)) continue;
        if (!json_is_object(sec))
            return accel_set_error(ACCEL_ERR_FORMAT, FN ": %s: zero_optimization.%s must be an object", path,
                                   sections[k]);
        const char *key;
        json_t *v;
        json_object_foreach(sec, key, v) {
            int i = 0;
            while (keys[k][i] && strcmp(keys[k][i], key)) i++;
            if (!keys[k][i])
                return accel_set_error(ACCEL_ERR_UNSUPPORTED, FN ": %s: zero_optimization.%s.%s is not a DeepSpeed "
                                       "key accel knows", path, sections[k], key);
        }
        char dk[64];
        snprintf(dk, sizeof dk, "%s.device", sections[k]);
        if (!json_str(json_object_get(sec, "device"), path, dk, k ? g->param_dev : g->opt_dev, sizeof g->opt_dev))
            return accel_last_status();
    }
    json_t *opt = json_object_get(zo, "offload_optimizer");
    if (!json_str(json_object_get(opt, "nvme_path"), path, "offload_optimizer.nvme_path", g->opt_path,
                  sizeof g->opt_path) ||
        !json_str(json_object_get(json_object_get(zo, "offload_param"), "nvme_path"), path,
                  "offload_param.nvme_path", g->param_path, sizeof g->param_path))
        return accel_last_status();
    json_t *bc = json_object_get(opt, "buffer_count"), *ratio = json_object_get(opt, "ratio");
    if (bc && (!json_is_integer(bc) || json_integer_value(bc) < 1 || json_integer_value(bc) > 1024))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, FN ": %s: zero_optimization.offload_optimizer.buffer_count must "
                               "be an integer from 1 to 1024", path);
    if (bc) g->buffer_count = (int)json_integer_value(bc);
    if (ratio && (!json_is_number(ratio) || json_number_value(ratio) != 1.0))
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, FN ": %s: zero_optimization.offload_optimizer.ratio: accel "
                               "offloads all of the optimizer state or none (only 1 is accepted)", path);
    json_t *bs = json_object_get(json_object_get(root, "aio"), "block_size");
    if (bs && (!json_is_integer(bs) || json_integer_value(bs) < 4 || json_integer_value(bs) % 4 ||
               json_integer_value(bs) > ((json_int_t)1 << 34)))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, FN ": %s: aio.block_size must be a multiple of 4 bytes from 4 "
                               "to 2^34", path);
    if (bs) g->block_bytes = (int64_t)json_integer_value(bs);
    return ACCEL_OK;
}

static accel_status offload_parse(const char *dev, const char *what, accel__offload_device *out) {
    if (!dev || !*dev || !strcasecmp(dev, "none")) *out = ACCEL__OFFLOAD_NONE;
    else if (!strcasecmp(dev, "cpu")) *out = ACCEL__OFFLOAD_CPU;
    else if (!strcasecmp(dev, "nvme")) *out = ACCEL__OFFLOAD_NVME;
    else return accel_set_error(ACCEL_ERR_INVALID_ARG, FN ": %s=\"%s\": offload device must be none, cpu or nvme",
                                what, dev);
    return ACCEL_OK;
}

/* One setting from the code, else the JSON, else the environment; the JSON
 * and the environment (the launcher's flags) must agree when both give it:
 * a device name in any case, a path exactly. */
static accel_status pick(const char *api, const char *json, const char *env_name, const char *what, bool exact,
                         const char **out) {
    const char *e = env(env_name);
    json = json && *json ? json : NULL;
    *out = api ? api : json ? json : e;
    if (!api && json && e && (exact ? strcmp(json, e) : strcasecmp(json, e)))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, FN ": %s: the DeepSpeed config says \"%s\", %s says \"%s\"",
                               what, json, env_name, e);
    return ACCEL_OK;
}

static const char *DEV_NAMES[] = {"none", "cpu", "nvme"};

/* nvme_path: an existing directory this process can create files in. */
static accel_status check_nvme_dir(const char *dir, const char *section) {
    struct stat sb;
    if (stat(dir, &sb))
        return accel_set_error(ACCEL_ERR_IO, FN ": %s.nvme_path \"%s\": %s", section, dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return accel_set_error(ACCEL_ERR_IO, FN ": %s.nvme_path \"%s\" is not a directory", section, dir);
    if (access(dir, W_OK | X_OK))
        return accel_set_error(ACCEL_ERR_IO, FN ": %s.nvme_path \"%s\" is not writable: %s", section, dir,
                               strerror(errno));
    return ACCEL_OK;
}

/* An nvme device's path (dir, from pick) into out, checked; section and whose name it in errors. */
static accel_status nvme_path(const char *dir, const char *section, const char *whose, char *out, size_t n) {
    if (!dir)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, FN ": %s.device=nvme needs nvme_path (a directory for each "
                               "rank's %s file; launcher flag --%s_nvme_path)", section, whose, section);
    if (strlen(dir) >= n)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, FN ": %s.nvme_path is longer than %d characters", section,
                               (int)n - 1);
    snprintf(out, n, "%s", dir);
    return check_nvme_dir(dir, section);
}

/* The offload settings of every source, checked against the stage. */
static accel_status read_offload(const accel_accelerator_opts *o, const offload_given *g, int stage,
                                 accel__offload_cfg *c) {
    const char *od, *op, *pd, *pp;
    accel_status st = pick(o->offload_optimizer_device, g->opt_dev, "ACCEL_OFFLOAD_OPTIMIZER_DEVICE",
                           "offload_optimizer.device", false, &od);
    if (!st) st = pick(o->offload_optimizer_nvme_path, g->opt_path, "ACCEL_OFFLOAD_OPTIMIZER_NVME_PATH",
                       "offload_optimizer.nvme_path", true, &op);
    if (!st)
        st = pick(o->offload_param_device, g->param_dev, "ACCEL_OFFLOAD_PARAM_DEVICE", "offload_param.device", false, &pd);
    if (!st) st = pick(o->offload_param_nvme_path, g->param_path, "ACCEL_OFFLOAD_PARAM_NVME_PATH",
                       "offload_param.nvme_path", true, &pp);
    if (!st) st = offload_parse(od, "offload_optimizer.device", &c->optimizer);
    if (!st) st = offload_parse(pd, "offload_param.device", &c->param);
    c->fsdp_params = o->fsdp_offload_params;
    if (!st && !c->fsdp_params) st = env_bool("ACCEL_FSDP_OFFLOAD_PARAMS", &c->fsdp_params);
    if (st) return st;
    c->buffer_count = g->buffer_count ? g->buffer_count : 4;      /* DeepSpeed's default */
    c->block_bytes = g->block_bytes ? g->block_bytes : 1 << 20;   /* aio.block_size's default */
    if (c->optimizer != ACCEL__OFFLOAD_NONE && stage == 0)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, FN ": offload_optimizer.device=%s offloads the optimizer state "
                               "of ZeRO (DeepSpeed's ZeRO-Offload): it needs ZeRO stage 1, 2 or 3, and this run is "
                               "stage 0", DEV_NAMES[c->optimizer]);
    if (c->param != ACCEL__OFFLOAD_NONE && stage != 3)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, FN ": offload_param.device=%s offloads the parameter shards of "
                               "ZeRO stage 3 (as in DeepSpeed), and this run is stage %d: use offload_optimizer",
                               DEV_NAMES[c->param], stage);
    if (c->param == ACCEL__OFFLOAD_NVME &&
        (st = nvme_path(pp, "offload_param", "parameter shard", c->param_path, sizeof c->param_path)))
        return st;
    if (c->optimizer == ACCEL__OFFLOAD_NVME) {
        if ((st = nvme_path(op, "offload_optimizer", "optimizer state", c->optimizer_path, sizeof c->optimizer_path)))
            return st;
        int kinds = 2; /* Adam's: the optimizer is not known yet */
        if (c->buffer_count < kinds)
            return accel_set_error(ACCEL_ERR_INVALID_ARG, FN ": offload_optimizer.buffer_count=%d: the nvme step "
                                   "needs a buffer per state kind (%d for Adam)", c->buffer_count, kinds);
    }
    if (c->fsdp_params && stage == 3 && c->param == ACCEL__OFFLOAD_NONE) c->param = ACCEL__OFFLOAD_CPU;
    return ACCEL_OK;
}

accel_status accel__offload_check_device(const accel_accelerator *acc) {
    const accel__offload_cfg *c = &acc->offload;
    char dev[32];
    if (c->fsdp_params && !acc->strat->shards && accel__needs_staging(acc->device))
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, FN ": fsdp_offload_params=true with NO_SHARD on %s: accel "
                               "offloads the sharded strategies' state; use SHARD_GRAD_OP",
                               accel_device_str(acc->device, dev, sizeof dev));
    return ACCEL_OK;
}

/* A section "bf16": {"enabled": true|false|"auto"} into *out: 1, 0, or -1
 * (absent, "auto": no opinion); anything else is refused (DeepSpeed reads 1
 * or "yes" as true: ignoring it would train without the precision asked). */
static accel_status enabled(json_t *root, const char *section, const char *path, int *out) {
    json_t *sec = json_object_get(root, section), *e = json_object_get(sec, "enabled");
    *out = json_is_boolean(e) ? json_is_true(e) : -1;
    if (sec && !json_is_object(sec))
        return accel_set_error(ACCEL_ERR_FORMAT, FN ": %s: %s must be an object ({\"enabled\": true})", path, section);
    if (e && !json_is_boolean(e) && !(json_is_string(e) && !strcmp(json_string_value(e), "auto")))
        return accel_set_error(ACCEL_ERR_FORMAT, FN ": %s: %s.enabled must be true, false or \"auto\"", path, section);
    return ACCEL_OK;
}

/* zero_optimization.reduce_bucket_size: elements (DeepSpeed counts fp32
 * elements, hence x4 bytes) or "auto" (no opinion). Bounded before the
 * conversion: a double beyond int64 is undefined behaviour, not a big bucket. */
#define MAX_BUCKET_ELEMS ((double)((int64_t)1 << 40))
static accel_status read_bucket_size(const json_t *rb, const char *path, accel__zero_cfg *c) {
    if (!rb || (json_is_string(rb) && !strcmp(json_string_value(rb), "auto"))) return ACCEL_OK;
    if (!json_is_number(rb))
        return accel_set_error(ACCEL_ERR_FORMAT, FN ": %s: zero_optimization.reduce_bucket_size must be a number or "
                               "\"auto\"", path);
    double v = json_number_value(rb);
    if (!(v >= 1 && v <= MAX_BUCKET_ELEMS))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, FN ": %s: zero_optimization.reduce_bucket_size=%g must be "
                               "between 1 and 2^40 elements", path, v);
    c->bucket_bytes = (int64_t)v * 4;
    return ACCEL_OK;
}

/* The DeepSpeed JSON at path, read once for every setting taken from it (a
 * regular file: a FIFO would block; no duplicate keys); NULL + error. */
static json_t *load_ds_json(const char *path) {
    json_t *root = accel__json_load_file(path);
    if (!root) {
        char why[1024];
        snprintf(why, sizeof why, "%s", accel_last_error());
        accel_set_error(accel_last_status(), FN ": cannot read the DeepSpeed config %s", why);
        return NULL;
    }
    if (!json_is_object(root) || !json_is_object(json_object_get(root, "zero_optimization"))) {
        json_decref(root);
        accel_set_error(ACCEL_ERR_FORMAT, FN ": the DeepSpeed config %s has no \"zero_optimization\" section", path);
        return NULL;
    }
    return root;
}

/* root: the DeepSpeed JSON read from path (load_ds_json). */
static accel_status read_json(const char *path, json_t *root, accel__zero_cfg *c, int *stage, offload_given *og) {
    accel_status st = ACCEL_OK;
    json_t *zo = json_object_get(root, "zero_optimization");
    json_t *sv = json_object_get(zo, "stage");
    if (sv) {
        char how[512];
        snprintf(how, sizeof how, "%s: zero_optimization.stage", path);
        if (!json_is_integer(sv)) return accel_set_error(ACCEL_ERR_FORMAT, FN ": %s must be an integer", how);
        if ((st = check_stage((long)json_integer_value(sv), how, stage))) return st;
    } else {
        *stage = 0; /* DeepSpeed's default */
    }
    if ((st = read_json_offload(root, zo, path, og))) return st;
    if ((st = read_bucket_size(json_object_get(zo, "reduce_bucket_size"), path, c))) return st;
    int bf, fp;
    if ((st = enabled(root, "bf16", path, &bf)) || (st = enabled(root, "fp16", path, &fp))) return st;
    if (bf == 1 && fp == 1) return accel_set_error(ACCEL_ERR_INVALID_ARG, FN ": %s enables both bf16 and fp16", path);
    c->mp = bf == 1 ? ACCEL_MP_BF16 : fp == 1 ? ACCEL_MP_FP16 : (bf == 0 || fp == 0) ? ACCEL_MP_NO : -1;
    json_t *ga = json_object_get(root, "gradient_accumulation_steps");
    if (json_is_integer(ga)) {
        if (json_integer_value(ga) < 1 || json_integer_value(ga) > INT_MAX)
            return accel_set_error(ACCEL_ERR_INVALID_ARG, FN ": %s: gradient_accumulation_steps must be from 1 to %d "
                                   "(got %lld)", path, INT_MAX, (long long)json_integer_value(ga));
        c->accum = (int)json_integer_value(ga);
    } else if (ga && !(json_is_string(ga) && !strcmp(json_string_value(ga), "auto"))) {
        return accel_set_error(ACCEL_ERR_FORMAT,
                               FN ": %s: gradient_accumulation_steps must be an integer or \"auto\"", path);
    }
    json_t *gc = json_object_get(root, "gradient_clipping");
    if (json_is_number(gc)) {
        if (json_number_value(gc) < 0)
            return accel_set_error(ACCEL_ERR_INVALID_ARG, FN ": %s: gradient_clipping must be >= 0", path);
        c->clip = json_number_value(gc);
    } else if (gc && !(json_is_string(gc) && !strcmp(json_string_value(gc), "auto"))) {
        return accel_set_error(ACCEL_ERR_FORMAT, FN ": %s: gradient_clipping must be a number or \"auto\"", path);
    }
    return ACCEL_OK;
}

/* zero_optimization.stage3_prefetch_bucket_size: a count of elements (the
 * most a prefetched unit may hold; 0: no prefetch), or "auto"/absent: no bound. */
static accel_status read_prefetch_bucket(const char *path, json_t *zo, accel__fsdp_cfg *f) {
    json_t *v = json_object_get(zo, "stage3_prefetch_bucket_size");
    double x = json_number_value(v);
    if (json_is_number(v) && x >= 0 && x <= 9e18 && x == (double)(int64_t)x) f->prefetch_bucket = (int64_t)x;
    else if (v && !(json_is_string(v) && !strcmp(json_string_value(v), "auto")))
        return accel_set_error(ACCEL_ERR_FORMAT, FN ": %s: zero_optimization.stage3_prefetch_bucket_size must be a "
                               "count of elements >= 0 (at most 9e18) or \"auto\"", path);
    return ACCEL_OK;
}

/* Stage 3's knobs in the DeepSpeed JSON: stage3_prefetch_bucket_size and
 * stage3_param_persistence_threshold are read; the ones accel does not
 * implement are refused unless left to "auto" (never ignored). */
static accel_status read_json_stage3(const char *path, json_t *root, accel__fsdp_cfg *f) {
    static const char *KEYS[] = {"stage3_max_live_parameters", "stage3_max_reuse_distance"};
    json_t *zo = json_object_get(root, "zero_optimization");
    accel_status st = read_prefetch_bucket(path, zo, f);
    for (size_t k = 0; k < sizeof KEYS / sizeof *KEYS && !st; k++) {
        json_t *v = json_object_get(zo, KEYS[k]);
        if (v && !(json_is_string(v) && !strcmp(json_string_value(v), "auto")))
            st = accel_set_error(ACCEL_ERR_UNSUPPORTED,
                                 FN ": %s: zero_optimization.%s is not implemented by accel's stage 3 yet "
                                 "(it prefetches one wrap unit ahead); remove it or set it to \"auto\"",
                                 path, KEYS[k]);
    }
    json_t *pt = json_object_get(zo, "stage3_param_persistence_threshold");
    if (!st && json_is_number(pt) && json_number_value(pt) >= 0 && json_number_value(pt) < 9e18)
        f->persistence_threshold = (int64_t)json_number_value(pt);
    else if (!st && pt && !(json_is_string(pt) && !strcmp(json_string_value(pt), "auto")))
        st = accel_set_error(ACCEL_ERR_FORMAT, FN ": %s: zero_optimization.stage3_param_persistence_threshold must "
                             "be a count >= 0 or \"auto\"", path);
    json_t *g16 = json_object_get(zo, "stage3_gather_16bit_weights_on_model_save"); /* "auto": the launcher's */
    if (!st && json_is_boolean(g16)) f->save_16bit = json_is_true(g16);
    else if (!st && g16 && !(json_is_string(g16) && !strcmp(json_string_value(g16), "auto")))
        st = accel_set_error(ACCEL_ERR_FORMAT, FN ": %s: zero_optimization.stage3_gather_16bit_weights_on_model_save "
                             "must be true, false or \"auto\"", path);
    return st;
}


/* An fsdp_config setting given as a string: the option when set (*how names
 * it), else its ACCEL_FSDP_* variable (NULL when neither). */
static const char *fsdp_setting(const char *api, const char *opt_name, const char *env_name, const char **how) {
    *how = api ? opt_name : env_name;
    return api ? api : env(env_name);
}

/* A default-False boolean: the option's tri-state when set, else the variable. */
static accel_status fsdp_bool(int api, const char *opt_name, const char *env_name, bool *out) {
    if (api == ACCEL_TRUE || api == ACCEL_FALSE) {
        *out = api == ACCEL_TRUE;
        return ACCEL_OK;
    }
    if (api)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, FN ": %s=%d is not ACCEL_TRUE (1), ACCEL_FALSE (-1) or 0 "
                               "(unset)", opt_name, api);
    return env_bool(env_name, out);
}

/* A default-True one, negated in the options (fsdp_no_X): X=False when
 * set, else X's variable. */
static accel_status fsdp_negated(bool no, const char *env_name, bool *out) {
    if (!no) return env_bool(env_name, out);
    *out = false;
    return ACCEL_OK;
}

/* fsdp_state_dict_type, the option's else the variable's; *prefix (when
 * asked): "opts." for the option, for the errors that name the key. */
static const char *state_dict_type(const accel_accelerator_opts *o, const char **prefix) {
    if (prefix) *prefix = o->fsdp_state_dict_type ? "opts." : "";
    return o->fsdp_state_dict_type ? o->fsdp_state_dict_type : env("ACCEL_FSDP_STATE_DICT_TYPE");
}

/* fsdp_version "1" or "2"; prefix: "opts." when it came from the options. */
static accel_status check_version(const char *ver, const char *prefix) {
    if (strcmp(ver, "1") && strcmp(ver, "2"))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, FN ": %sfsdp_version=\"%s\" (1 or 2)", prefix, ver);
    return ACCEL_OK;
}

/* fsdp_version (the option's, else the variable's) into *v: 1 when unset,
 * Accelerate's default. */
static accel_status read_version(const accel_accelerator_opts *o, int *v) {
    char given[16];
    snprintf(given, sizeof given, "%d", o->fsdp_version);
    const char *ver = o->fsdp_version ? given : env("ACCEL_FSDP_VERSION");
    accel_status st = ver ? check_version(ver, o->fsdp_version ? "opts." : "") : ACCEL_OK;
    *v = ver && !strcmp(ver, "2") ? 2 : 1;
    return st;
}

/* sync_module_states=False beside cpu_ram_efficient_loading (FSDP1): as
 * FullyShardedDataParallelPlugin.__post_init__, a warning and True (only
 * Accelerate's launcher refuses the pair: cli/cli_launch_env.c does too).
 * Under FSDP2 the key is obsolete: nothing to say. True is what prepare does
 * anyway (rank 0's weights reach every rank), so nothing else changes. */
static void warn_sync_forced(bool ram_efficient, bool sync, int version) {
    if (version == 1 && ram_efficient && !sync)
        fprintf(stderr, "accel: warning: " FN ": sync_module_states cannot be False since efficient cpu ram loading "
                        "enabled. Setting sync_module_states to True.\n");
}

/* The other fsdp_config keys: checked, and refused where accel does not do
 * what they ask (never ignored). */
static accel_status read_fsdp_rest(const accel_accelerator_opts *o, accel__fsdp_cfg *f) {
    bool ram_efficient = true, sync = true, orig = true; /* fsdp_offload_params: read_offload */
    accel_status st = fsdp_bool(o->fsdp_activation_checkpointing, "opts.fsdp_activation_checkpointing",
                                "ACCEL_FSDP_ACTIVATION_CHECKPOINTING", &f->activation_checkpointing);
    if (!st)
        st = fsdp_negated(o->fsdp_no_cpu_ram_efficient_loading, "ACCEL_FSDP_CPU_RAM_EFFICIENT_LOADING", &ram_efficient);
    if (!st) st = fsdp_negated(o->fsdp_no_sync_module_states, "ACCEL_FSDP_SYNC_MODULE_STATES", &sync);
    if (!st) /* either way: the parameters stay the user's tensors */
        st = fsdp_negated(o->fsdp_no_use_orig_params, "ACCEL_FSDP_USE_ORIG_PARAMS", &orig);
    int version;
    if (!st) st = read_version(o, &version);
    if (st) return st;
    warn_sync_forced(ram_efficient, sync, version);
    const char *prefix, *sdt = state_dict_type(o, &prefix);
    f->full_state_dict = sdt && !strcasecmp(sdt, "FULL_STATE_DICT");
    if (sdt && !f->full_state_dict && strcasecmp(sdt, "SHARDED_STATE_DICT"))
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, FN ": %sfsdp_state_dict_type=%s is not implemented by accel "
                               "(SHARDED_STATE_DICT and FULL_STATE_DICT are)", prefix, sdt);
    return ACCEL_OK;
}

static accel_status read_min_num_params(const accel_accelerator_opts *o, accel__fsdp_cfg *f) {
    const char *min = env("ACCEL_FSDP_MIN_NUM_PARAMS");
    f->min_num_params = 100000000; /* Accelerate's default, 1e8 */
    if (o->fsdp_min_num_params < 0)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, FN ": opts.fsdp_min_num_params=%lld is not a count",
                               (long long)o->fsdp_min_num_params);
    if (o->fsdp_min_num_params > 0) {
        f->min_num_params = o->fsdp_min_num_params;
    } else if (min) { /* a count, written as Python's float() reads it: 1e8 as the docs write it, no hex */
        double v;
        if (!accel__python_float(min, &v) || !(v >= 0) || v > 9e18 || v != floor(v))
            return accel_set_error(ACCEL_ERR_INVALID_ARG, FN ": ACCEL_FSDP_MIN_NUM_PARAMS=\"%s\" is not a count", min);
        f->min_num_params = (int64_t)v;
    }
    return ACCEL_OK;
}

/* fsdp_auto_wrap_policy and its parameters. */
static accel_status read_wrap(const accel_accelerator_opts *o, accel__fsdp_cfg *f) {
    const char *hp, *hc;
    const char *p = fsdp_setting(o->fsdp_auto_wrap_policy, "opts.fsdp_auto_wrap_policy",
                                 "ACCEL_FSDP_AUTO_WRAP_POLICY", &hp);
    const char *cls = fsdp_setting(o->fsdp_transformer_layer_cls_to_wrap, "opts.fsdp_transformer_layer_cls_to_wrap",
                                   "ACCEL_FSDP_TRANSFORMER_CLS_TO_WRAP", &hc);
    accel_status st = read_min_num_params(o, f);
    if (st) return st;
    if (cls && strlen(cls) >= sizeof f->wrap_cls)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, FN ": %s is longer than %d characters", hc,
                               (int)sizeof f->wrap_cls - 1);
    /* empty: the model's decoder layer class, found at prepare (its _no_split_modules) */
    snprintf(f->wrap_cls, sizeof f->wrap_cls, "%s", cls ? cls : "");
    if (!p) f->wrap = ACCEL__WRAP_DEFAULT;
    else if (!strcasecmp(p, "TRANSFORMER_BASED_WRAP")) f->wrap = ACCEL__WRAP_TRANSFORMER;
    else if (!strcasecmp(p, "SIZE_BASED_WRAP")) f->wrap = ACCEL__WRAP_SIZE;
    else if (!strcasecmp(p, "NO_WRAP")) f->wrap = ACCEL__WRAP_NONE;
    else
        return accel_set_error(ACCEL_ERR_INVALID_ARG, FN ": %s=\"%s\": unknown policy "
                               "(TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP, NO_WRAP)", hp, p);
    return ACCEL_OK;
}

/* fsdp_reshard_after_forward: a bool, or from the variable FSDP1's strategy name. */
static accel_status read_reshard(const accel_accelerator_opts *o, accel__fsdp_cfg *f) {
    const char *raf = env("ACCEL_FSDP_RESHARD_AFTER_FORWARD");
    if (!o->fsdp_no_reshard_after_forward && raf &&
        (!strcasecmp(raf, "FULL_SHARD") || !strcasecmp(raf, "SHARD_GRAD_OP"))) {
        f->reshard_after_forward = !strcasecmp(raf, "FULL_SHARD");
        return ACCEL_OK;
    }
    return fsdp_negated(o->fsdp_no_reshard_after_forward, "ACCEL_FSDP_RESHARD_AFTER_FORWARD",
                        &f->reshard_after_forward);
}

/* FSDP's prefetch, reshard and wrap settings: the options, else as `accel
 * launch` passes them. */
static accel_status read_fsdp(const accel_accelerator_opts *o, accel__fsdp_cfg *f) {
    *f = (accel__fsdp_cfg){.backward_prefetch = true, .reshard_after_forward = true, .prefetch_bucket = -1};
    accel_status wst = read_wrap(o, f);
    if (wst) return wst;
    const char *how, *bp = fsdp_setting(o->fsdp_backward_prefetch, "opts.fsdp_backward_prefetch",
                                        "ACCEL_FSDP_BACKWARD_PREFETCH", &how);
    if (bp && !strcasecmp(bp, "NO_PREFETCH")) f->backward_prefetch = false;
    else if (bp && !strcasecmp(bp, "BACKWARD_POST")) f->backward_post = true;
    else if (bp && strcasecmp(bp, "BACKWARD_PRE"))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, FN ": %s=\"%s\": unknown policy (BACKWARD_PRE, BACKWARD_POST, "
                               "NO_PREFETCH)", how, bp);
    accel_status st = fsdp_bool(o->fsdp_forward_prefetch, "opts.fsdp_forward_prefetch", "ACCEL_FSDP_FORWARD_PREFETCH",
                                &f->forward_prefetch);
    if (!st) st = read_reshard(o, f);
    return st ? st : read_fsdp_rest(o, f);
}

/* The configuration from the options, the environment and the DeepSpeed
 * JSON (root, read from ds; both NULL without one). */
static accel_status zero_config(const accel_accelerator_opts *o, const char *ds, json_t *root, accel__zero_cfg *c) {
    accel_status st = ACCEL_OK;
    int json_stage = -1, stage = 0;
    offload_given og = {0};
    if (root && (st = read_json(ds, root, c, &json_stage, &og))) return st;
    if ((st = read_fsdp(o, &c->fsdp))) return st;
    /* DeepSpeedPlugin's zero3_save_16bit_model (`accel launch --zero3_save_16bit_model`); the JSON's value wins */
    if ((st = env_bool("ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL", &c->fsdp.save_16bit))) return st;
    const char *fsdp_env = env("ACCEL_FSDP_SHARDING_STRATEGY"), *zs_env = env("ACCEL_ZERO_STAGE");
    if (o->zero_stage < -1) /* -1 is off; -5 was off too, silently */
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               FN ": opts.zero_stage must be -1 (off), 0 (from the environment) or 1, 2, 3 (got %d)",
                               o->zero_stage);
    if (o->zero_stage < 0) stage = 0;
    else if (o->zero_stage > 0) st = check_stage(o->zero_stage, "opts.zero_stage", &stage);
    else if (o->fsdp_sharding_strategy)
        st = parse_fsdp(o->fsdp_sharding_strategy, "opts.fsdp_sharding_strategy", &stage, &c->hybrid);
    else if (json_stage >= 0) stage = json_stage;
    else if (zs_env) st = parse_stage(zs_env, "ACCEL_ZERO_STAGE", &stage);
    else if (fsdp_env) st = parse_fsdp(fsdp_env, "ACCEL_FSDP_SHARDING_STRATEGY", &stage, &c->hybrid);
    if (st) return st;
    c->stage = stage;
    /* the JSON's stage-3 keys, whoever chose stage 3 (the code may, over the JSON's stage) */
    if (stage == 3 && root && (st = read_json_stage3(ds, root, &c->fsdp))) return st;
    /* Stages 1-2 write the full model and consolidated optimizer state, not
     * the shards asked for (stage 0 has nothing sharded). */
    const char *sdt = state_dict_type(o, NULL);
    if ((stage == 1 || stage == 2) && sdt && !strcasecmp(sdt, "SHARDED_STATE_DICT"))
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, FN ": fsdp_state_dict_type=SHARDED_STATE_DICT shards the "
                               "checkpoints of FULL_SHARD (ZeRO stage 3); this run is stage %d, whose checkpoints "
                               "hold the full model: use FULL_STATE_DICT", stage);
    /* Its units are FULL_SHARD's wrap units: elsewhere it would do nothing. */
    if (c->fsdp.activation_checkpointing && stage != 3)
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, FN ": fsdp_activation_checkpointing=true checkpoints the "
                               "FULL_SHARD (ZeRO-3) wrap units, and this run is stage %d: checkpoint the model's "
                               "layers with accel_module_set_gradient_checkpointing instead", stage);
    if (!(o->gradient_clipping >= 0)) /* NaN too */
        return accel_set_error(ACCEL_ERR_INVALID_ARG, FN ": gradient_clipping=%g must be a norm >= 0 (0: none)",
                               o->gradient_clipping);
    if (o->gradient_clipping > 0) {
        c->clip = o->gradient_clipping;
    } else if (!ds && accel__env_nonneg("ACCEL_GRADIENT_CLIPPING", 0, &c->clip) != ACCEL_OK) {
        return accel_last_status();
    }
    return read_offload(o, &og, stage, &c->offload);
}

accel_status accel__zero_config(const accel_accelerator_opts *o, accel__zero_cfg *c) {
    memset(c, 0, sizeof *c);
    c->mp = -1;
    const char *ds = o->deepspeed_config_file ? o->deepspeed_config_file : env("ACCEL_DEEPSPEED_CONFIG_FILE");
    json_t *root = NULL;
    if (ds && !(root = load_ds_json(ds))) return accel_last_status();
    accel_status st = zero_config(o, ds, root, c);
    json_decref(root);
    return st;
}

/* ---------------------------------------------------------------- groups */

accel_status accel__zero_groups(accel_accelerator *acc, bool hybrid, const accel__parallelism *par) {
    /* The mesh: the sizes opts.parallelism gave; else dp_shard over every
     * rank, and under hybrid sharding on several machines, dp_shard within a
     * machine and dp_replicate across them. One machine: nothing to
     * replicate across, HYBRID is FULL_SHARD / SHARD_GRAD_OP (as in torch). */
    if (par->set && hybrid)
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               FN ": HYBRID_SHARD and opts.parallelism's sizes both lay out the mesh: give "
                               "dp_replicate_size and dp_shard_size with FULL_SHARD (or SHARD_GRAD_OP) instead");
    int size[ACCEL__MESH_DIMS];
    memcpy(size, par->size, sizeof size);
    if (hybrid && acc->local_world < acc->world) {
        if (acc->local_world < 1 || acc->world % acc->local_world)
            return accel_set_error(ACCEL_ERR_INVALID_ARG,
                                   FN ": HYBRID_SHARD needs the same number of processes on every machine (%d "
                                   "processes, %d on this machine)", acc->world, acc->local_world);
        size[ACCEL__MESH_DP_REPLICATE] = acc->world / acc->local_world;
        size[ACCEL__MESH_DP_SHARD] = acc->local_world;
    }
    accel_pg *within = NULL, *across = NULL;
    accel_status st = accel__mesh_init(&acc->mesh, acc->pg, size);
    if (!st && hybrid) {
        /* The mesh puts rank r on machine r / local_world as its local rank
         * r % local_world: the launcher must agree, else a "machine" of the
         * mesh spans machines. Every rank learns whether one disagrees (or
         * counts another LOCAL_WORLD_SIZE: asked by every hybrid rank, one
         * machine or several), so all fail together. */
        bool moved = size[ACCEL__MESH_DP_REPLICATE] > 1 && acc->local_rank != acc->mesh.coord[ACCEL__MESH_DP_SHARD];
        int32_t v[3] = {moved, acc->local_world, -acc->local_world};
        st = accel_pg_all_reduce(acc->pg, v, 3, ACCEL_I32, ACCEL_REDUCE_MAX);
        if (!st && (v[0] || v[1] != -v[2])) {
            accel__mesh_free(&acc->mesh);
            return accel_set_error(ACCEL_ERR_INVALID_ARG,
                                   FN ": HYBRID_SHARD: the ranks of a machine must be consecutive, and "
                                   "LOCAL_WORLD_SIZE the same on every machine (rank %d is local rank %d of %d, the "
                                   "mesh expects local rank %d%s)", acc->rank, acc->local_rank, acc->local_world,
                                   acc->mesh.coord[ACCEL__MESH_DP_SHARD],
                                   v[1] != -v[2] ? "; LOCAL_WORLD_SIZE differs between ranks" : "");
        }
    }
    /* the ranks a shard spreads over (a machine's under hybrid), then each
     * shard rank's counterparts in the other replicas */
    /* ZeRO shards over dp_shard x cp (torch's dp_shard_cp): the cp ranks
     * hold the same parameters, so they share the shards too */
    const unsigned shard_dims = ACCEL__MESH_BIT(ACCEL__MESH_DP_SHARD) | ACCEL__MESH_BIT(ACCEL__MESH_CP);
    const int shard_world = size[ACCEL__MESH_DP_SHARD] * size[ACCEL__MESH_CP];
    if (!st && ((shard_world != acc->world && !(within = accel__mesh_group_over(&acc->mesh, shard_dims))) ||
                (size[ACCEL__MESH_DP_REPLICATE] > 1 &&
                 !(across = accel__mesh_group(&acc->mesh, ACCEL__MESH_DP_REPLICATE)))))
        st = accel_last_status();
    if (st) {
        char why[1024];
        snprintf(why, sizeof why, "%s", accel_last_error());
        accel__mesh_free(&acc->mesh);
        return accel_set_error(st, FN ": %s%s", why,
                               hybrid ? " (HYBRID_SHARD: the ranks of a machine must be consecutive, and "
                                        "LOCAL_WORLD_SIZE the same on every machine)" : "");
    }
    acc->dp_pg = accel__mesh_group_over(&acc->mesh, ACCEL__MESH_BIT(ACCEL__MESH_DP_REPLICATE) |
                                                        ACCEL__MESH_BIT(ACCEL__MESH_DP_SHARD) |
                                                        ACCEL__MESH_BIT(ACCEL__MESH_CP));
    if (!acc->dp_pg) {
        char why[1024];
        snprintf(why, sizeof why, "%s", accel_last_error());
        accel__mesh_free(&acc->mesh);
        return accel_set_error(ACCEL_ERR_DIST, FN ": the data-parallel group: %s", why);
    }
    acc->shard_pg = within ? within : acc->pg;
    acc->shard_rank = acc->mesh.coord[ACCEL__MESH_DP_SHARD] * size[ACCEL__MESH_CP] + acc->mesh.coord[ACCEL__MESH_CP];
    acc->shard_world = shard_world;
    acc->replica_pg = across;
    return ACCEL_OK;
}

void accel__zero_groups_free(accel_accelerator *acc) {
    accel__mesh_free(&acc->mesh);
    acc->shard_pg = acc->dp_pg = acc->pg;
    acc->replica_pg = NULL;
}
