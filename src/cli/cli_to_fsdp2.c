/* src/cli/cli_to_fsdp2.c — `accel to-fsdp2 --config_file IN [--output_file OUT]
 * [--overwrite]`: a config written for FSDP1 rewritten for
 * FSDP2 (docs/cli.md).
 *
 * Only `fsdp_config` changes, key by key in the file's order:
 * fsdp_sharding_strategy becomes fsdp_reshard_after_forward (FULL_SHARD and
 * HYBRID_SHARD: true; SHARD_GRAD_OP, HYBRID_SHARD_ZERO2, NO_SHARD: false; an
 * FSDP1 strategy name already under fsdp_reshard_after_forward is mapped
 * alike), fsdp_backward_prefetch, fsdp_sync_module_states and
 * fsdp_use_orig_params are dropped (gone in FSDP2), fsdp_forward_prefetch is
 * dropped (not in FSDP2 yet), each with a warning; the keys FSDP2 shares and
 * any other key are kept, and fsdp_version becomes 2. A config without
 * fsdp_config, or already at fsdp_version 2, is written unchanged (with a
 * warning for the second). The whole config is written back, sorted, keeping its null
 * values and empty mappings as they were; a name ending in .json gets JSON. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"

typedef enum { KEEP, REMOVED, NOT_YET } key_fate;

/* FSDP1's keys, what FSDP2 calls them (or why they go). */
static const struct {
    const char *from, *to;
    key_fate fate;
} KEYS[] = {
    {"fsdp_version", "fsdp_version", KEEP},
    {"fsdp_reshard_after_forward", "fsdp_reshard_after_forward", KEEP},
    {"fsdp_auto_wrap_policy", "fsdp_auto_wrap_policy", KEEP},
    {"fsdp_backward_prefetch", NULL, REMOVED},
    {"fsdp_forward_prefetch", NULL, NOT_YET},
    {"fsdp_cpu_ram_efficient_loading", "fsdp_cpu_ram_efficient_loading", KEEP},
    {"fsdp_offload_params", "fsdp_offload_params", KEEP},
    {"fsdp_sharding_strategy", "fsdp_reshard_after_forward", KEEP},
    {"fsdp_state_dict_type", "fsdp_state_dict_type", KEEP},
    {"fsdp_sync_module_states", NULL, REMOVED},
    {"fsdp_transformer_layer_cls_to_wrap", "fsdp_transformer_layer_cls_to_wrap", KEEP},
    {"fsdp_min_num_params", "fsdp_min_num_params", KEEP},
    {"fsdp_use_orig_params", NULL, REMOVED},
    {"fsdp_activation_checkpointing", "fsdp_activation_checkpointing", KEEP},
};
enum { NKEYS = sizeof KEYS / sizeof *KEYS };

static int key_row(const char *k) {
    for (int i = 0; i < NKEYS; i++)
        if (!strcmp(KEYS[i].from, k)) return i;
    return -1;
}

/* An FSDP1 sharding strategy's reshard_after_forward (its name under
 * fsdp_sharding_strategy or fsdp_reshard_after_forward); v itself otherwise. */
static cv *reshard_value(const char *key, cv *v) {
    static const struct {
        const char *name;
        bool reshard;
    } STRATEGIES[] = {{"FULL_SHARD", true},
                      {"SHARD_GRAD_OP", false},
                      {"HYBRID_SHARD", true},
                      {"HYBRID_SHARD_ZERO2", false},
                      {"NO_SHARD", false}};
    if (v->t != CV_STR || (strcmp(key, "fsdp_sharding_strategy") && strcmp(key, "fsdp_reshard_after_forward")))
        return v;
    for (size_t i = 0; i < sizeof STRATEGIES / sizeof *STRATEGIES; i++)
        if (!strcmp(v->s, STRATEGIES[i].name)) {
            cv_free(v);
            return cv_bool(STRATEGIES[i].reshard);
        }
    return v;
}

static bool is_version_2(const cv *v) {
    return v && ((v->t == CV_INT && v->i == 2) || (v->t == CV_FLOAT && v->f == 2.0));
}

/* Python's truth of a config value: what `if not fsdp_config` skips. */
static bool truthy(const cv *v) {
    switch (v ? v->t : CV_NULL) {
    case CV_NULL: return false;
    case CV_BOOL: return v->b;
    case CV_INT: return v->i != 0;
    case CV_FLOAT: return v->f != 0;
    case CV_STR: return v->s[0] != 0;
    case CV_SEQ:
    case CV_MAP: return v->n > 0;
    }
    return false;
}

/* fsdp's entries rewritten into a new mapping (fsdp emptied: its values
 * moved), in time linear in its keys (a 1 MB config of 65,000 keys took 33
 * s in the sanitizer build when each was looked up in the new mapping). */
static cv *convert(cv *fsdp) {
    cv *out = cv_new(CV_MAP);
    for (size_t i = 0; i < fsdp->n; i++) {
        const char *k = fsdp->keys[i];
        cv *v = fsdp->items[i];
        fsdp->items[i] = NULL;
        int r = key_row(k);
        if (r < 0) { /* fsdp's keys are distinct (the reader merges repeats) and none is a rename's target */
            cv_add(out, k, v);
        } else if (KEYS[r].fate != KEEP) {
            fprintf(stderr, "Argument %s %s in FSDP2, skipping this key...\n", k,
                    KEYS[r].fate == REMOVED ? "has been removed" : "is not yet implemented");
            cv_free(v);
        } else {
            cv_set(out, KEYS[r].to, reshard_value(k, v));
        }
    }
    cv_set(out, "fsdp_version", cv_int(2));
    return out;
}

int accel_cli_to_fsdp2(int argc, char **argv) {
    static const cli_opt OPTS[] = {
        {"config_file", 0, true, "CONFIG_FILE", "The config file to convert to FSDP2"},
        {"overwrite", 0, false, NULL, "Overwrite the config file if it exists"},
        {"output_file", 0, true, "OUTPUT_FILE",
         "The path to write the converted config to. If not provided, the input file is overwritten (with "
         "--overwrite)"},
    };
    enum { NOPTS = sizeof OPTS / sizeof *OPTS };
    const char *usage = "accel to-fsdp2 [-h] --config_file CONFIG_FILE [--overwrite] [--output_file OUTPUT_FILE]";
    const char *desc = "Convert an Accelerate config from FSDP1 to FSDP2";
    const char *vals[NOPTS] = {0};
    int first = 0;
    int rc = cli_parse(usage, desc, OPTS, NOPTS, argc, argv, vals, &first, false);
    if (rc == CLI_HELP) return 0;
    if (rc != CLI_OK) return 2;
    const char *in = vals[cli_idx(OPTS, NOPTS, "config_file")], *out = vals[cli_idx(OPTS, NOPTS, "output_file")];
    bool overwrite = vals[cli_idx(OPTS, NOPTS, "overwrite")] != NULL;
    if (!in) {
        fprintf(stderr, "usage: %s\naccel to-fsdp2: error: the following arguments are required: --config_file\n",
                usage);
        return 2;
    }
    if (access(in, F_OK) != 0) {
        fprintf(stderr, "accel to-fsdp2: error: Config file %s not found\n", in);
        return 1;
    }
    if (!overwrite && !out) {
        fprintf(stderr, "accel to-fsdp2: error: If --overwrite is not set, --output_file must be provided\n");
        return 1;
    }
    if (!overwrite && access(out, F_OK) == 0) {
        fprintf(stderr, "accel to-fsdp2: error: Output file %s already exists and --overwrite is not set\n", out);
        return 1;
    }
    if (!out) out = in;
    char err[1024];
    cv *config = cfg_read(in, err, sizeof err);
    if (!config) {
        fprintf(stderr, "accel to-fsdp2: error: %s\n", err);
        return 1;
    }
    if (!config->n) {
        fprintf(stderr, "accel to-fsdp2: error: Config file is empty\n");
        cv_free(config);
        return 1;
    }
    cv *fsdp = cv_get(config, "fsdp_config");
    if (truthy(fsdp) && fsdp->t != CV_MAP) {
        fprintf(stderr, "accel to-fsdp2: error: %s: fsdp_config must be a mapping of keys to values\n", in);
        cv_free(config);
        return 1;
    }
    if (truthy(fsdp) && is_version_2(cv_get(fsdp, "fsdp_version"))) {
        fprintf(stderr, "Config already specifies FSDP2, skipping conversion...\n"
                        "If the config doesn't use new argument names, change `fsdp_version` to `1` and rerun the "
                        "command.\n");
    } else if (truthy(fsdp)) {
        cv_set(config, "fsdp_config", convert(fsdp));
    }
    bool ok = cfg_write_as_is(out, config, err, sizeof err);
    cv_free(config);
    if (!ok) fprintf(stderr, "accel to-fsdp2: error: %s\n", err);
    return ok ? 0 : 1;
}
