/* src/cli/cli.h — the `accel` command: subcommands and shared helpers.
 *
 * main.c holds the dispatch table (one row per subcommand). Each subcommand
 * lives in cli_<name>.c as `int accel_cli_<name>(int argc, char **argv)` where
 * argv[0] is the subcommand name; it returns the process exit code. */
#ifndef ACCEL_CLI_H
#define ACCEL_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "accel/nn.h"

int accel_cli_launch(int argc, char **argv);
int accel_cli_config(int argc, char **argv);
int accel_cli_env(int argc, char **argv);
int accel_cli_estimate_memory(int argc, char **argv);
int accel_cli_test(int argc, char **argv);
int accel_cli_merge_weights(int argc, char **argv);
int accel_cli_to_fsdp2(int argc, char **argv);

/* ---------------------------------------------------------------- estimate-memory
 * cli_estimate_memory.c: Accelerate's convert_bytes and create_ascii_table
 * (nc columns of rows[nr]) into out. cli_estimate_pipeline.c: the per-stage table of
 * a pipeline (pp > 1) with a batch, each stage tensor-parallel over tp
 * ranks, into out; m built from cfg (on meta is enough); 0, or 1 after
 * printing the error. */
enum { CLI_TABLE_MAX_COLS = 8 };
void cli_convert_bytes(double size, bool is_int, char *out, size_t n);
void cli_print_table(FILE *out, const char *title, const char *const *headers, int nc,
                     char rows[][CLI_TABLE_MAX_COLS][32], int nr);
typedef struct cli_pipeline_request {
    int pp, virt, micro;  /* pp_size, pp_virtual_stages (> 1: interleaved 1F1B), num_micro_batches */
    bool gpipe;           /* else 1F1B (virt 1) */
    int64_t batch, seq;   /* a data-parallel rank's batch [batch, seq] */
    int strategy;         /* accel_shard_strategy over dp_shard (x cp): DDP, ZeRO-1 or ZeRO-2 */
    int dp_shard;         /* the ranks ZeRO shards over: dp_shard x cp */
    accel_dtype autocast; /* as accel_activation_opts.autocast */
    int tp;               /* each stage's tp ranks (1: none) */
    bool sp;              /* Megatron's sequence parallelism: T / tp positions between the stages */
    int cp;               /* context parallelism's ranks (1: none): a micro-batch's inputs [B / M, T / cp] */
    const accel_llama_config *cfg; /* m's config, for the tp split (bigmodel/mesh_memory.h) */
} cli_pipeline_request;
int cli_pipeline_table(FILE *out, accel_module *m, const cli_pipeline_request *q);

/* ---------------------------------------------------------------- options
 * Long options are spelled with underscores in the table; `--foo-bar` is
 * accepted for `--foo_bar`; `--name=value` and `--name value` both work;
 * abbreviations are rejected. */
typedef struct cli_opt {
    const char *name;  /* "num_processes" */
    char short_name;   /* 'q' or 0 */
    bool takes_value;
    const char *meta;  /* "N" */
    const char *help;
} cli_opt;

enum { CLI_OK = 0, CLI_HELP = 1, CLI_ERROR = 2 };

/* Parses options until the first positional argument when stop_at_positional
 * (everything after belongs to the program); otherwise a positional is an error.
 * vals[i] is the value of opts[i] ("1" for flags) or NULL. *first_pos is the
 * index of the first positional (argc if none). Prints errors and help. */
int cli_parse(const char *usage, const char *desc, const cli_opt *opts, int nopts, int argc, char **argv,
              const char **vals, int *first_pos, bool stop_at_positional);
void cli_print_help(const char *usage, const char *desc, const cli_opt *opts, int nopts);
/* Index of option `name` in opts (aborts if absent: a programming error). */
int cli_idx(const cli_opt *opts, int nopts, const char *name);

/* ---------------------------------------------------------------- config values
 * A small tree for config files read with libyaml / jansson. */
typedef enum cv_type { CV_NULL, CV_BOOL, CV_INT, CV_FLOAT, CV_STR, CV_SEQ, CV_MAP } cv_type;
typedef struct cv {
    cv_type t;
    bool b;
    long long i;
    double f;
    char *s;            /* CV_STR; a number's text once cli_launch.c's cfg_s asked for it */
    char **keys;        /* CV_MAP */
    struct cv **items;  /* CV_SEQ / CV_MAP values */
    size_t n, cap;      /* entries used / allocated (grown geometrically) */
} cv;

cv *cv_new(cv_type t);
cv *cv_str(const char *s);
cv *cv_bool(bool b);
cv *cv_int(long long i);
void cv_free(cv *v);
cv *cv_get(const cv *map, const char *key);
/* Replaces or adds (takes ownership of val). */
void cv_set(cv *map, const char *key, cv *val);
/* Adds key, which map does not hold, without looking (takes ownership of
 * val): n keys copied from a map are O(n), where cv_set's search is O(n^2). */
void cv_add(cv *map, const char *key, cv *val);
void cv_del(cv *map, const char *key);
/* Appends to a CV_SEQ (takes ownership of val). */
void cv_append(cv *seq, cv *val);
/* Python repr, as `accelerate env` prints values (True, 'x' inside dicts). */
void cv_repr(const cv *v, bool top, char *out, size_t n);

/* mkdir -p dir (mode 0755): false with errno set when a part cannot be made
 * or dir is no directory (ENOTDIR). */
bool cli_mkdirs(const char *dir);
/* Config file location: $HF_HOME or ${XDG_CACHE_HOME:-~/.cache}/huggingface,
 * + /accelerate/default_config.yaml, ~ as accel__home_dir (core/env.h) finds
 * it. False, out "" and err saying why, when none of them gives a directory
 * (Python's expanduser would leave "~" as is, a folder named ~ under the
 * current one). */
bool cfg_default_path(char *out, size_t n, char *err, size_t errn);
/* Reads YAML (or JSON when the name ends in .json). NULL + message in err. */
cv *cfg_read(const char *path, char *err, size_t errn);
/* Accelerate's process_config: defaults, legacy keys, unknown keys, types. */
bool cfg_normalize(cv *root, const char *path, char *err, size_t errn);
/* Writes sorted keys, empty dicts and nulls dropped (like to_dict + safe_dump);
 * JSON when the name ends in .json. Creates the parent directory. */
bool cfg_write(const char *path, const cv *root, char *err, size_t errn);
/* false + err when the file a config write to path would replace (through
 * links) exists and is no regular file (a directory, a FIFO, a device). */
bool cfg_check_write_target(const char *path, char *err, size_t errn);
/* cfg_write keeping null values and empty mappings (yaml.dump of the dict as
 * it was read: `accel to-fsdp2`). */
bool cfg_write_as_is(const char *path, const cv *root, char *err, size_t errn);
/* Whether s is valid UTF-8 (all a config file can hold). */
bool cli_is_utf8(const char *s);

/* ---------------------------------------------------------------- launch (cli_launch_env.c)
 * The FSDP / DeepSpeed settings of `accel launch` and the variables
 * `accelerate launch` exports for them. */
typedef struct env_list {
    char **kv; /* "KEY=value" strings, NULL-terminated; owned */
    size_t n;
} env_list;
void env_add(env_list *e, const char *key, const char *value);
void env_add_kv(env_list *e, const char *kv); /* a copy of "KEY=value" */
void env_free(env_list *e);
/* The environment `base` (NULL-terminated, e.g. environ) with every variable
 * that `over` sets replaced, the last setting winning. The array is malloc'd
 * (free() it); its strings stay base's and over's. */
char **env_merge(char *const *base, const env_list *over);

/* The parsed flags of `accel launch` (vals[i] belongs to opts[i]). */
typedef struct launch_settings {
    const cli_opt *opts;
    int nopts;
    const char *const *vals;
} launch_settings;

#define LAUNCH_MAX_SETTINGS 64
/* Writes the settings' options (--fsdp_*, --zero_stage, --fp8_*, ...) to out; returns how many. */
int launch_setting_opts(cli_opt *out);
/* ACCELERATE_USE_FSDP and FSDP_* (flag > fsdp_config > default). False + err on a bad value. */
bool launch_export_fsdp(env_list *e, const launch_settings *ls, const cv *fsdp_config, bool quiet, char *err,
                        size_t errn);
/* The FSDP settings with the section off (no --use_fsdp, distributed_type
 * not FSDP): nothing is exported but accel's ACCEL_FSDP_SHARDING_STRATEGY
 * (cli_launch.c), so a setting given beside it (--fsdp_offload_params true)
 * would be dropped without a word: each one given that is not Accelerate's
 * default is named on stderr (unless quiet). Values checked as with the
 * section on: false + err on a bad one. */
bool launch_check_fsdp_off(const launch_settings *ls, const cv *fsdp_config, bool quiet, char *err, size_t errn);
/* ACCELERATE_USE_DEEPSPEED, ACCELERATE_CONFIG_DS_FIELDS, ACCELERATE_DEEPSPEED_* (flag > deepspeed_config);
 * unless quiet, a warning for each deepspeed_config key that is no setting. */
bool launch_export_deepspeed(env_list *e, const launch_settings *ls, const cv *ds_config, bool mp_from_config,
                             const char *ds_file_abs, bool quiet, char *err, size_t errn);
/* deepspeed_config's value types (its settings' keys; others are warned about
 * at launch); false + err naming the key. */
bool cfg_check_deepspeed_config(const cv *ds_config, const char *path, char *err, size_t errn);

/* ParallelismConfig's and Megatron-LM's variables (ACCELERATE_USE_PARALLELISM_CONFIG,
 * PARALLELISM_CONFIG_*; ACCELERATE_USE_MEGATRON_LM, MEGATRON_LM_*; each also as
 * ACCEL_<name>), flag > parallelism_config / megatron_lm_config > default,
 * exported when use_pc / use_mega; the flags are checked either way, and the
 * mesh they ask for against procs processes. A setting given to a section
 * that is off is named on stderr (unless quiet). False + err naming the flag. */
bool launch_export_parallelism(env_list *e, const launch_settings *ls, const cv *pc_config, const cv *mega_config,
                               bool use_pc, bool use_mega, int procs, bool quiet, char *err, size_t errn);

/* parallelism_config's and megatron_lm_config's keys (the flags' names) and
 * value types; false + err naming the key. */
bool cfg_check_parallel_config(const cv *root, const char *path, char *err, size_t errn);

/* The device mesh a config's parallelism_config / megatron_lm_config lay out
 * on its num_processes ("pp 1 x dp_replicate 1 x dp_shard 2 x cp 1 x tp 2", or
 * "invalid: why"), for `accel env`; false when the config asks for none. */
bool cfg_describe_mesh(const cv *cfg, char *out, size_t n);

/* ACCELERATE_FP8_* (and ACCEL_FP8_*, same values) as setup_fp8_env writes them
 * (flag > fp8_config > default), only when fp8 (mixed_precision is fp8); the
 * flags are checked either way, as argparse does. False + err on a bad flag. */
bool launch_export_fp8(env_list *e, const launch_settings *ls, const cv *fp8_config, bool fp8, char *err,
                       size_t errn);
/* fp8_config's keys (with or without "fp8_") and value types; false + err naming the key. */
bool cfg_check_fp8_config(const cv *fp8_config, const char *path, char *err, size_t errn);

/* The choices of --fp8_backend, --fp8_format and --fp8_amax_compute_algo
 * (Accelerate 1.16's: MS-AMP and its --fp8_opt_level are gone),
 * NULL-terminated; the config wizard offers the same. */
extern const char *const CLI_FP8_BACKENDS[], *const CLI_FP8_FORMATS[], *const CLI_FP8_ALGOS[];

/* ---------------------------------------------------------------- machine (cli_env.c) */
/* Whether this machine has a GPU (NVIDIA or AMD device nodes / driver
 * entries); what was found, or why none, in `what`. accel itself has no GPU
 * backend: this is for launched PyTorch programs. */
bool cli_machine_gpus(char *what, size_t n);

#endif
