/* src/cli/cli_launch.c — `accel launch`: resolve flags + config, start this
 * machine's workers with vfork+exec, supervise them like torchrun's agent.
 *
 * Supervision: each worker runs in its own process group with
 * PR_SET_PDEATHSIG(SIGKILL) as a backstop, and a watchdog process kills those
 * groups if the launcher itself is killed (see start_watchdog). Its stderr always goes through a
 * pipe (forwarded live, last lines kept for the failure report); stdout is
 * inherited unless --tee/--log_dir need it. SIGCHLD/SIGINT/SIGTERM wake the
 * poll loop through a self-pipe. The first worker to fail ends the others
 * (SIGTERM, SIGKILL after 3 s); the group restarts up to --max_restarts. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "accel/core.h"
#include "cli/cli.h"
#include "core/core_internal.h"
#include "core/env.h"
#include "dist/backend.h"
#include "dist/slurm.h"

static const cli_opt OPTS[] = {
    {"config_file", 0, true, "CONFIG_FILE", "The config file to use for the default values in the launching script."},
    {"quiet", 'q', false, NULL, "Only report a failure with the exit code (no root-cause block)."},
    {"cpu", 0, false, NULL, "Force the training on the CPU (also what a machine without a GPU gets)."},
    {"multi_gpu", 0, false, NULL, "Whether or not this should launch a distributed GPU training."},
    {"mixed_precision", 0, true, "{no,fp16,bf16,fp8}", "Whether or not to use mixed precision training."},
    {"num_processes", 0, true, "NUM_PROCESSES", "The total number of processes to be launched in parallel."},
    {"num_machines", 0, true, "NUM_MACHINES", "The total number of machines used in this training."},
    {"machine_rank", 0, true, "MACHINE_RANK", "The rank of the machine on which this script is launched."},
    {"main_process_ip", 0, true, "MAIN_PROCESS_IP", "The IP address of the machine of rank 0."},
    {"main_process_port", 0, true, "MAIN_PROCESS_PORT", "The port used to communicate with rank 0 (0: pick a free one)."},
    {"num_cpu_threads_per_process", 0, true, "N", "The number of CPU threads per process (OMP_NUM_THREADS)."},
    {"max_restarts", 0, true, "MAX_RESTARTS", "Maximum number of worker group restarts before failing."},
    {"monitor_interval", 0, true, "SECONDS", "Interval, in seconds, to monitor the state of workers (0.1)."},
    {"tee", 't', true, "TEE", "Tee std streams into a log file and also to console (0 none, 1 stdout, 2 stderr, 3 both)."},
    {"log_dir", 0, true, "LOG_DIR", "Base directory for per-rank log files."},
    {"debug", 0, false, NULL, "Check that every rank calls the same collectives (ACCELERATE_DEBUG_MODE)."},
    {"gpu_ids", 0, true, "GPU_IDS", "What GPUs (by id) should be used for training on this machine."},
    {"same_network", 0, false, NULL, "Accepted for Accelerate compatibility; no effect: workers always connect to main_process_ip:main_process_port directly (what `true` means)."},
    {"rdzv_backend", 0, true, "RDZV_BACKEND", "Accepted for Accelerate compatibility; no effect: accel always uses its own store at main_process_ip:main_process_port."},
    {"rdzv_conf", 0, true, "RDZV_CONF", "Additional rendezvous configuration (<key1>=<value1>,...); accepted, unused."},
    {"role", 0, true, "ROLE", "User-defined role for the workers (ROLE_NAME)."},
    {"dynamo_backend", 0, true, "DYNAMO_BACKEND", "Only `no` (torch dynamo does not exist in accel)."},
    {"dynamo_mode", 0, true, "{default,reduce-overhead,max-autotune}",
     "Exported for a launched PyTorch script (ACCELERATE_DYNAMO_MODE); accel compiles nothing."},
    {"dynamo_use_fullgraph", 0, false, NULL, "Exported for a launched PyTorch script (ACCELERATE_DYNAMO_USE_FULLGRAPH)."},
    {"dynamo_use_dynamic", 0, false, NULL, "Exported for a launched PyTorch script (ACCELERATE_DYNAMO_USE_DYNAMIC)."},
    {"dynamo_use_regional_compilation", 0, false, NULL,
     "Exported for a launched PyTorch script (ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION)."},
    {"enable_cpu_affinity", 0, false, NULL, "Pin workers to cores (ACCELERATE_CPU_AFFINITY=1)."},
    {"use_deepspeed", 0, false, NULL, "Use ZeRO sharding (accel's DeepSpeed-compatible implementation)."},
    {"use_fsdp", 0, false, NULL, "Use fully sharded data parallelism."},
    {"use_parallelism_config", 0, false, NULL, "Lay the ranks out with the --parallelism_config_* sizes (docs/parallelism.md)."},
    {"use_megatron_lm", 0, false, NULL, "Use Megatron-LM's parallelism: the --megatron_lm_* settings (docs/parallelism.md)."},
    {"log_with", 0, true, "{tensorboard,jsonl,csv,all}", "Trackers for init_trackers, a comma list (ACCEL_LOG_WITH)."},
    {"project_dir", 0, true, "DIR", "Project directory: trackers' logs and automatic checkpoints (ACCEL_PROJECT_DIR)."},
    {"module", 'm', false, NULL, "Run PROGRAM as a Python module (PYTHON -m)."},
    {"no_python", 0, false, NULL, "Execute PROGRAM directly instead of through Python."},
    {"python", 0, true, "PYTHON", "Interpreter of a .py PROGRAM or --module (default: $PYTHON, else $VIRTUAL_ENV/bin/python, else python3 on PATH)."},
};
/* + the FSDP / DeepSpeed settings of cli_launch_env.c */
#define NOPTS ((int)(sizeof OPTS / sizeof *OPTS))
#define USAGE "accel launch [options] PROGRAM [ARGS...]"
#define DESC "Launch PROGRAM on this machine's share of --num_processes workers, torchrun style."

/* The fsdp_config keys (and flags) passed to the library, as Accelerate's FSDP_* variables. */
static const struct { const char *key, *env; } FSDP_KEYS[] = {
    {"fsdp_auto_wrap_policy", "ACCEL_FSDP_AUTO_WRAP_POLICY"},
    {"fsdp_transformer_layer_cls_to_wrap", "ACCEL_FSDP_TRANSFORMER_CLS_TO_WRAP"},
    {"fsdp_min_num_params", "ACCEL_FSDP_MIN_NUM_PARAMS"},
    {"fsdp_backward_prefetch", "ACCEL_FSDP_BACKWARD_PREFETCH"},
    {"fsdp_forward_prefetch", "ACCEL_FSDP_FORWARD_PREFETCH"},
    {"fsdp_reshard_after_forward", "ACCEL_FSDP_RESHARD_AFTER_FORWARD"},
    {"fsdp_state_dict_type", "ACCEL_FSDP_STATE_DICT_TYPE"},
    {"fsdp_offload_params", "ACCEL_FSDP_OFFLOAD_PARAMS"},
    {"fsdp_cpu_ram_efficient_loading", "ACCEL_FSDP_CPU_RAM_EFFICIENT_LOADING"},
    {"fsdp_sync_module_states", "ACCEL_FSDP_SYNC_MODULE_STATES"},
    {"fsdp_use_orig_params", "ACCEL_FSDP_USE_ORIG_PARAMS"},
    {"fsdp_activation_checkpointing", "ACCEL_FSDP_ACTIVATION_CHECKPOINTING"},
    {"fsdp_version", "ACCEL_FSDP_VERSION"},
};
#define N_FSDP_KEYS ((int)(sizeof FSDP_KEYS / sizeof *FSDP_KEYS))

typedef struct launch_cfg {
    int num_processes, num_machines, machine_rank, port, threads, grad_accum, max_restarts, tee;
    bool port_given, cpu, debug, quiet, deepspeed, fsdp, affinity, module, no_python;
    bool parallelism, megatron; /* --use_parallelism_config, --use_megatron_lm (or the config's) */
    bool insecure; /* ACCEL_INSECURE_NO_SECRET */
    double monitor_interval;
    char mixed_precision[8]; /* lower case, as Accelerate reads it */
    const char *ip, *log_dir, *gpu_ids, *role, *zero_stage, *fsdp_strategy;
    const char *ds_file, *offload_opt, *log_with, *project_dir;
    char grad_clip[32]; /* the norm as str(float()) writes it, as the library reads it back; "" when none */
    const char *offload_param, *offload_opt_path, *offload_param_path;
    char python[PATH_MAX];   /* interpreter of a Python PROGRAM ("" when PROGRAM runs directly) */
    const char *python_from; /* where that choice came from, for error messages */
    const char *fsdp_vals[N_FSDP_KEYS]; /* flag, else fsdp_config key, else NULL */
    env_list env;            /* the job-wide worker environment (owned) */
    char **prog_argv;
} launch_cfg;

/* ---------------------------------------------------------------- parsing */

/* The library's integer rule (core/env.h), with argparse's message. */
static bool parse_int(const char *name, const char *s, int lo, int hi, int *out) {
    long v;
    if (accel__parse_long(name, s, lo, hi, &v) != ACCEL_OK) {
        accel_clear_error();
        fprintf(stderr, "accel launch: error: argument --%s: invalid value '%s' (expected an integer from %d to %d)\n",
                name, s, lo, hi);
        return false;
    }
    *out = (int)v;
    return true;
}

/* Value of config key as string (for numbers too); NULL when absent/None/false.
 * A number's text is cached in its node (freed with the tree), so the string
 * lives as long as the config: `gpu_ids: 0`, `fsdp_sharding_strategy: 2` and
 * `gradient_clipping: 1.0` are as valid as their quoted forms. */
static const char *cfg_s(const cv *c, const char *key) {
    cv *v = cv_get(c, key);
    if (!v) return NULL;
    char buf[64];
    switch (v->t) {
    case CV_STR: return v->s;
    case CV_INT: snprintf(buf, sizeof buf, "%lld", v->i); break;
    case CV_FLOAT:
        snprintf(buf, sizeof buf, "%.15g", v->f);
        if (strtod(buf, NULL) != v->f) snprintf(buf, sizeof buf, "%.17g", v->f);
        break;
    case CV_BOOL:
        if (!v->b) return NULL;
        snprintf(buf, sizeof buf, "1");
        break;
    default: return NULL;
    }
    if (!v->s && !(v->s = strdup(buf))) {
        fprintf(stderr, "accel: out of memory\n");
        exit(1);
    }
    return v->s;
}

/* The fsdp_config key that sets `key` ("fsdp_..."): the key itself, else
 * the key without its fsdp_, which Accelerate's launcher adds back (so
 * `offload_params: true` offloads as `fsdp_offload_params: true` does). */
static const char *fsdp_key(const cv *fsdp_config, const char *key) {
    return cv_get(fsdp_config, key) ? key : key + strlen("fsdp_");
}

/* The interpreter of a .py PROGRAM or --module: Accelerate runs them with the
 * Python it runs under; accel has none, so --python, else $PYTHON, else the
 * active virtualenv's, else python3 on PATH (made absolute for the reports).
 * PYTHON set but empty is refused as every variable of accel (it was read as
 * unset); VIRTUAL_ENV empty is no virtualenv, as Python's tools read it
 * (deactivate unsets it; an empty one names no folder). false after saying so. */
static bool choose_python(launch_cfg *L, const char *flag) {
    const char *prog = L->prog_argv[0];
    size_t pl = strlen(prog);
    L->python[0] = 0;
    if (!L->module && (L->no_python || pl <= 3 || strcmp(prog + pl - 3, ".py"))) return true;
    const char *venv = getenv("VIRTUAL_ENV"), *env = getenv("PYTHON");
    if (!flag && env && !*env) {
        fprintf(stderr, "accel launch: error: the environment: PYTHON is set but empty: unset it (then "
                        "$VIRTUAL_ENV/bin/python, else python3 on PATH runs %s), set it to an interpreter, or pass "
                        "--python\n", L->module ? "the module" : prog);
        return false;
    }
    if (flag) {
        snprintf(L->python, sizeof L->python, "%s", flag);
        L->python_from = "--python";
    } else if (env) {
        snprintf(L->python, sizeof L->python, "%s", env);
        L->python_from = "$PYTHON";
    } else if (venv && *venv) {
        snprintf(L->python, sizeof L->python, "%s/bin/python", venv);
        L->python_from = "$VIRTUAL_ENV";
    } else {
        snprintf(L->python, sizeof L->python, "python3");
        L->python_from = "PATH";
    }
    if (strchr(L->python, '/')) return true;
    const char *path = getenv("PATH");
    for (const char *dir = path; dir && *dir;) {
        size_t dl = strcspn(dir, ":");
        char cand[PATH_MAX];
        if (dl && snprintf(cand, sizeof cand, "%.*s/%s", (int)dl, dir, L->python) < (int)sizeof cand &&
            access(cand, X_OK) == 0) {
            snprintf(L->python, sizeof L->python, "%s", cand);
            return true;
        }
        dir += dl + (dir[dl] == ':');
    }
    return true;
}

static void env_int(env_list *e, const char *key, long v) {
    char b[32];
    snprintf(b, sizeof b, "%ld", v);
    env_add(e, key, b);
}

/* The value of flag `name` (NULL: not given). */
#define FLAG(ls, name) ((ls)->vals[cli_idx((ls)->opts, (ls)->nopts, name)])

/* The variables every worker of the job gets (the per-rank ones are added by
 * plan_worker): accel's ACCEL_* contract and what `accelerate launch` exports. */
static bool job_env(launch_cfg *L, const launch_settings *ls, const cv *cfg, bool mp_from_config) {
    env_list *e = &L->env;
    int local_n = L->num_processes / L->num_machines;
    if (L->threads) env_int(e, "OMP_NUM_THREADS", L->threads);
    else if (!getenv("OMP_NUM_THREADS")) env_int(e, "OMP_NUM_THREADS", accel__node_thread_share(local_n));
    /* libgomp's default spin-wait after each parallel region keeps an OpenMP
     * thread busy beside OpenBLAS's own threads: measured 2x slower Llama steps
     * on a shared 2-core machine (load 2-18) (bench/results/llama_step_profile.md). OpenMP reads this at
     * load time, so only the launcher can set it; the user's value wins. */
    if (!getenv("OMP_WAIT_POLICY")) env_add(e, "OMP_WAIT_POLICY", "PASSIVE");
    env_add(e, "ACCELERATE_MIXED_PRECISION", L->mixed_precision);
    env_add(e, "ACCEL_MIXED_PRECISION", L->mixed_precision);
    env_int(e, "ACCEL_GRADIENT_ACCUMULATION_STEPS", L->grad_accum);
    env_add(e, "ACCEL_USE_CPU", L->cpu ? "1" : "0");
    env_add(e, "ACCELERATE_USE_CPU", L->cpu ? "True" : "False");
    if (L->cpu) { /* Intel OpenMP's pinning, as Accelerate's simple launcher sets it for CPU training */
        env_add(e, "KMP_AFFINITY", "granularity=fine,compact,1,0");
        env_add(e, "KMP_BLOCKTIME", "1");
    }
    /* torchrun's agent: an NCCL error tears the worker down (the caller's value wins) */
    if (!getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING")) env_add(e, "TORCH_NCCL_ASYNC_ERROR_HANDLING", "1");
    if (L->debug) {
        env_add(e, "ACCEL_DEBUG_MODE", "1");
        env_add(e, "ACCELERATE_DEBUG_MODE", "true");
    }
    if (L->affinity) env_add(e, "ACCELERATE_CPU_AFFINITY", "1");
    if (L->gpu_ids && strcmp(L->gpu_ids, "all")) env_add(e, "CUDA_VISIBLE_DEVICES", L->gpu_ids);
    if (L->zero_stage) env_add(e, "ACCEL_ZERO_STAGE", L->zero_stage);
    if (L->fsdp_strategy) env_add(e, "ACCEL_FSDP_SHARDING_STRATEGY", L->fsdp_strategy);
    for (int k = 0; k < N_FSDP_KEYS && L->fsdp; k++)
        if (L->fsdp_vals[k]) env_add(e, FSDP_KEYS[k].env, L->fsdp_vals[k]);
    char abs[PATH_MAX]; /* workers may run elsewhere (--log_dir, chdir): pass an absolute path */
    const char *ds_abs = L->ds_file ? (realpath(L->ds_file, abs) ? abs : L->ds_file) : NULL;
    if (ds_abs) env_add(e, "ACCEL_DEEPSPEED_CONFIG_FILE", ds_abs);
    if (L->grad_clip[0]) env_add(e, "ACCEL_GRADIENT_CLIPPING", L->grad_clip);
    if (L->offload_opt) env_add(e, "ACCEL_OFFLOAD_OPTIMIZER_DEVICE", L->offload_opt);
    if (L->offload_param) env_add(e, "ACCEL_OFFLOAD_PARAM_DEVICE", L->offload_param);
    const char *paths[2] = {L->offload_opt_path, L->offload_param_path};
    const char *path_envs[2] = {"ACCEL_OFFLOAD_OPTIMIZER_NVME_PATH", "ACCEL_OFFLOAD_PARAM_NVME_PATH"};
    char dir[PATH_MAX];
    for (int k = 0; k < 2; k++) /* absolute too; a missing directory is the library's to name */
        if (paths[k]) env_add(e, path_envs[k], realpath(paths[k], dir) ? dir : paths[k]);
    if (!L->deepspeed) {
        /* What Accelerate's launchers (all but its DeepSpeed one) export for
         * the program's Accelerator: accel has no dynamo, so the backend is
         * NO; the mode and switches are passed as given (flag, else
         * dynamo_config), and _USE_DYNAMIC only when set (its flag's default is None). */
        static const struct {
            const char *key, *env;
            bool when_unset; /* exported (False) without the key: the flag's default is False, not None */
        } SWITCHES[] = {{"dynamo_use_fullgraph", "ACCELERATE_DYNAMO_USE_FULLGRAPH", true},
                        {"dynamo_use_dynamic", "ACCELERATE_DYNAMO_USE_DYNAMIC", false},
                        {"dynamo_use_regional_compilation", "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION", true}};
        const cv *dc = cv_get(cfg, "dynamo_config");
        env_add(e, "ACCELERATE_DYNAMO_BACKEND", "NO");
        const char *mode = FLAG(ls, "dynamo_mode") ? FLAG(ls, "dynamo_mode") : cfg_s(dc, "dynamo_mode");
        env_add(e, "ACCELERATE_DYNAMO_MODE", mode ? mode : "default");
        for (size_t k = 0; k < sizeof SWITCHES / sizeof *SWITCHES; k++) {
            const cv *b = cv_get(dc, SWITCHES[k].key);
            bool flag = FLAG(ls, SWITCHES[k].key), set = flag || (b && b->t == CV_BOOL);
            if (set || SWITCHES[k].when_unset) env_add(e, SWITCHES[k].env, flag || (set && b->b) ? "True" : "False");
        }
    }
    if (L->log_with) env_add(e, "ACCEL_LOG_WITH", L->log_with);
    if (L->project_dir) env_add(e, "ACCEL_PROJECT_DIR", L->project_dir);
    char err[1024];
    if (!launch_export_fp8(e, ls, cv_get(cfg, "fp8_config"), !strcmp(L->mixed_precision, "fp8"), err, sizeof err)) {
        fprintf(stderr, "accel launch: error: %s\n", err);
        return false;
    }
    if (!launch_export_parallelism(e, ls, cv_get(cfg, "parallelism_config"), cv_get(cfg, "megatron_lm_config"),
                                   L->parallelism, L->megatron, L->num_processes, L->quiet, err, sizeof err)) {
        fprintf(stderr, "accel launch: error: %s\n", err);
        return false;
    }
    if (!L->fsdp && !launch_check_fsdp_off(ls, cv_get(cfg, "fsdp_config"), L->quiet, err, sizeof err)) {
        fprintf(stderr, "accel launch: error: %s\n", err);
        return false;
    }
    if (L->fsdp && !launch_export_fsdp(e, ls, cv_get(cfg, "fsdp_config"), L->quiet, err, sizeof err)) {
        fprintf(stderr, "accel launch: error: %s\n", err);
        return false;
    }
    if (L->deepspeed) {
        if (!launch_export_deepspeed(e, ls, cv_get(cfg, "deepspeed_config"), mp_from_config, ds_abs, L->quiet, err,
                                     sizeof err)) {
            fprintf(stderr, "accel launch: error: %s\n", err);
            return false;
        }
        /* prepare_deepspeed_cmd_env: the working directory is importable
         * (env_var_path_add: the old entries, empty ones dropped, then it) */
        char cwd[PATH_MAX], path[4 * PATH_MAX] = "";
        const char *old = getenv("PYTHONPATH");
        for (const char *p = old ? old : ""; *p;) {
            size_t len = strcspn(p, ":");
            if (len) snprintf(path + strlen(path), sizeof path - strlen(path), "%.*s:", (int)len, p);
            p += len + (p[len] == ':');
        }
        if (getcwd(cwd, sizeof cwd)) {
            snprintf(path + strlen(path), sizeof path - strlen(path), "%s", cwd);
            env_add(e, "PYTHONPATH", path);
        }
    }
    return true;
}


/* Inside a SLURM job step (`srun accel launch ...`, one launcher per node),
 * the machines of the job come from SLURM where no flag names them: it
 * knows them better than a config file, whose machine_rank cannot be right
 * on every node. Values live in static storage (the environment). */
static bool slurm_machines(const char *nm_flag, const char *mr_flag, const char *ip_flag, const char **nm,
                           const char **mr, const char **ip) {
    static char host[256];
    const char *nodes = getenv("SLURM_STEP_NUM_NODES"), *node_id = getenv("SLURM_NODEID");
    const char *tasks = getenv("SLURM_STEP_NUM_TASKS");
    /* set but empty is refused as every variable (it was read as unset: a
     * launcher per node each ran a one-machine job of its own) */
    const char *empty = nodes && !*nodes ? "SLURM_STEP_NUM_NODES" : node_id && !*node_id ? "SLURM_NODEID" : NULL;
    if (empty) {
        fprintf(stderr, "accel launch: error: the environment: %s is set but empty (SLURM sets it to a number in a "
                        "job step): unset it, or run inside the job step that sets it\n",
                empty);
        return false;
    }
    if (!nodes || !node_id) return true;
    /* `srun -n 2 accel launch --num_processes 2`: every task is a launcher of
     * its own job (two jobs of 2 on one node, or two launchers claiming one
     * machine_rank): one launcher per node, or none. */
    long n_tasks, n_nodes;
    if (tasks && accel__slurm_in_step() &&
        accel__parse_long("SLURM_STEP_NUM_TASKS", tasks, 1, INT_MAX, &n_tasks) == ACCEL_OK &&
        accel__parse_long("SLURM_STEP_NUM_NODES", nodes, 1, INT_MAX, &n_nodes) == ACCEL_OK && n_tasks > n_nodes) {
        fprintf(stderr, "accel launch: error: this is one of %ld tasks of an srun step on %ld node%s "
                        "(SLURM_STEP_NUM_TASKS=%ld, SLURM_STEP_NUM_NODES=%ld): each task would start its own "
                        "workers, as separate jobs. Start one `accel launch` per node (srun --ntasks-per-node=1 "
                        "accel launch --num_processes N ...), or let srun start the ranks without it (srun "
                        "--ntasks-per-node=K PROGRAM)\n",
                n_tasks, n_nodes, n_nodes == 1 ? "" : "s", n_tasks, n_nodes);
        return false;
    }
    accel_clear_error();
    if (!nm_flag) *nm = nodes;
    if (!mr_flag) *mr = node_id;
    if (!ip_flag && strcmp(nodes, "1")) {
        if (accel__slurm_main_host(host, sizeof host) != ACCEL_OK) {
            fprintf(stderr, "accel launch: error: %s\n", accel_last_error());
            accel_clear_error();
            return false;
        }
        *ip = host;
    }
    return true;
}

/* The caller's boolean variable `name` (unset: *out kept), read as
 * Accelerate's parse_flag_from_env does; false after saying why on garbage. */
static bool env_flag(const char *name, bool *out) {
    if (!accel__env_bool(name, *out, out)) return true;
    fprintf(stderr, "accel launch: error: %s\n", accel_last_error());
    accel_clear_error();
    return false;
}

static int resolve(int argc, char **argv, launch_cfg *L, cv **cfg_out) {
    cli_opt opts[NOPTS + LAUNCH_MAX_SETTINGS];
    memcpy(opts, OPTS, sizeof OPTS);
    int nopts = NOPTS + launch_setting_opts(opts + NOPTS);
    const char *v[NOPTS + LAUNCH_MAX_SETTINGS];
    int first;
    int r = cli_parse(USAGE, DESC, opts, nopts, argc, argv, v, &first, true);
    if (r == CLI_HELP) return 0;
    if (r == CLI_ERROR) return 2;
    if (first >= argc) {
        fprintf(stderr, "usage: %s\naccel launch: error: the following arguments are required: PROGRAM\n", USAGE);
        return 2;
    }
#define V(name) v[cli_idx(opts, nopts, name)]
    /* Config: an explicit file, or the default one unless --cpu (Accelerate's precedence quirk). */
    char def[4096], err[2048];
    (void)cfg_default_path(def, sizeof def, err, sizeof err); /* none: no default config */
    const char *cfg_path = V("config_file");
    if (!cfg_path && !V("cpu") && access(def, R_OK) == 0) cfg_path = def;
    cv *cfg = NULL;
    const char *ds_as_config = NULL;
    if (cfg_path) {
        cfg = cfg_read(cfg_path, err, sizeof err);
        if (cfg && cv_get(cfg, "zero_optimization")) {
            /* A DeepSpeed JSON given as --config_file: use it as --deepspeed_config_file. */
            ds_as_config = cfg_path;
            cv_free(cfg);
            cfg = cv_new(CV_MAP);
            cv_set(cfg, "distributed_type", cv_str("DEEPSPEED"));
        }
        if (!cfg || !cfg_normalize(cfg, cfg_path, err, sizeof err)) {
            fprintf(stderr, "accel launch: error: %s\n", err);
            cv_free(cfg);
            return 2;
        }
    }
    *cfg_out = cfg;
    /* flags > config > defaults (top-level keys fill only what the CLI left unset) */
    const char *np = V("num_processes") ? V("num_processes") : cfg_s(cfg, "num_processes");
    const char *nm = V("num_machines") ? V("num_machines") : cfg_s(cfg, "num_machines");
    const char *mr = V("machine_rank") ? V("machine_rank") : cfg_s(cfg, "machine_rank");
    const char *port = V("main_process_port") ? V("main_process_port") : cfg_s(cfg, "main_process_port");
    L->ip = V("main_process_ip") ? V("main_process_ip") : cfg_s(cfg, "main_process_ip");
    /* an empty address would reach the workers as MASTER_ADDR=, which they refuse */
    if (V("main_process_ip") && !*L->ip) {
        fprintf(stderr, "accel launch: error: argument --main_process_ip: expected an address, got ''\n");
        cv_free(cfg);
        return 2;
    }
    if (L->ip && !*L->ip) L->ip = NULL; /* a config's '' is no address, as null */
    const char *mp = V("mixed_precision") ? V("mixed_precision") : cfg_s(cfg, "mixed_precision");
    bool mp_from_config = !V("mixed_precision") && mp;
    if (!mp) mp = "no";
    L->gpu_ids = V("gpu_ids") ? V("gpu_ids") : cfg_s(cfg, "gpu_ids");
    L->debug = V("debug") || (cfg && cv_get(cfg, "debug") && cv_get(cfg, "debug")->b);
    /* CPU training: asked for (flag, config, or the caller's own ACCELERATE_USE_CPU /
     * ACCEL_USE_CPU), or nothing else there: on a machine without a GPU a
     * launched Accelerate program must form one world over gloo, not train
     * alone on every rank. */
    char gpus[128];
    bool env_cpu = false, env_cpu2 = false;
    L->insecure = false;
    if (!env_flag("ACCELERATE_USE_CPU", &env_cpu) || !env_flag("ACCEL_USE_CPU", &env_cpu2) ||
        !env_flag("ACCEL_INSECURE_NO_SECRET", &L->insecure)) {
        cv_free(cfg);
        return 2;
    }
    /* An empty OMP_NUM_THREADS would reach every worker as it is: libgomp
     * ignores it and runs each worker as wide as the machine, and accel's
     * own per-rank cap takes it for the user's choice. */
    const char *omp = getenv("OMP_NUM_THREADS");
    if (omp && !*omp && !V("num_cpu_threads_per_process")) {
        fprintf(stderr, "accel launch: error: the environment: OMP_NUM_THREADS is set but empty (OpenMP would ignore "
                        "it and run every worker on all cores): unset it to give each worker cores / local processes, "
                        "or set a number, or pass --num_cpu_threads_per_process\n");
        cv_free(cfg);
        return 2;
    }
    L->cpu = V("cpu") || (cfg && cv_get(cfg, "use_cpu") && cv_get(cfg, "use_cpu")->b) || env_cpu || env_cpu2 ||
             !cli_machine_gpus(gpus, sizeof gpus);
    L->affinity = V("enable_cpu_affinity") || (cfg && cv_get(cfg, "enable_cpu_affinity") && cv_get(cfg, "enable_cpu_affinity")->b);
    L->quiet = V("quiet");
    L->module = V("module");
    L->no_python = V("no_python");
    L->log_dir = V("log_dir");
    L->role = V("role") ? V("role") : "default";
    const char *dtype = cfg ? cfg_s(cfg, "distributed_type") : NULL;
    bool paradigm_flag = V("cpu") || V("multi_gpu") || V("use_deepspeed") || V("use_fsdp") || V("use_megatron_lm");
    L->deepspeed = V("use_deepspeed") || (!paradigm_flag && dtype && !strcmp(dtype, "DEEPSPEED"));
    L->fsdp = V("use_fsdp") || (!paradigm_flag && dtype && !strcmp(dtype, "FSDP"));
    /* Accelerate takes these two from the config unless a paradigm flag
     * (--cpu is none) was given: a non-empty parallelism_config, and
     * distributed_type MEGATRON_LM; but --cpu then runs its simple launcher,
     * which exports neither (the sweep's find: accel exported both) */
    bool config_paradigm = !V("multi_gpu") && !V("use_deepspeed") && !V("use_fsdp") && !V("use_megatron_lm");
    const cv *pcfg = cfg ? cv_get(cfg, "parallelism_config") : NULL;
    L->parallelism = V("use_parallelism_config") || (config_paradigm && pcfg && pcfg->t == CV_MAP && pcfg->n);
    L->megatron = V("use_megatron_lm") || (config_paradigm && dtype && !strcmp(dtype, "MEGATRON_LM"));
    if (V("cpu") && (L->parallelism || L->megatron)) {
        if (!L->quiet)
            fprintf(stderr, "accel launch: warning: --cpu: %s is off, as under Accelerate's launcher (its simple "
                            "launcher, which --cpu chooses, exports no %s variables)\n",
                    L->megatron ? "Megatron-LM" : "the parallelism config",
                    L->megatron ? "MEGATRON_LM_*" : "PARALLELISM_CONFIG_*");
        L->parallelism = L->megatron = false;
    }
    /* nested dicts: copied unless the flag was given */
    const cv *ds = cfg ? cv_get(cfg, "deepspeed_config") : NULL, *fs = cfg ? cv_get(cfg, "fsdp_config") : NULL;
    L->ds_file = V("deepspeed_config_file") ? V("deepspeed_config_file")
                 : ds_as_config                ? ds_as_config
                                               : cfg_s(ds, "deepspeed_config_file");
    const char *clip = V("gradient_clipping") ? V("gradient_clipping") : cfg_s(ds, "gradient_clipping");
    L->offload_opt = V("offload_optimizer_device") ? V("offload_optimizer_device")
                                                   : cfg_s(ds, "offload_optimizer_device");
    L->offload_param = V("offload_param_device") ? V("offload_param_device") : cfg_s(ds, "offload_param_device");
    L->offload_opt_path = V("offload_optimizer_nvme_path") ? V("offload_optimizer_nvme_path")
                                                           : cfg_s(ds, "offload_optimizer_nvme_path");
    L->offload_param_path = V("offload_param_nvme_path") ? V("offload_param_nvme_path")
                                                         : cfg_s(ds, "offload_param_nvme_path");
    L->log_with = V("log_with") ? V("log_with") : cfg_s(cfg, "log_with");
    L->project_dir = V("project_dir") ? V("project_dir") : cfg_s(cfg, "project_dir");
    if (L->ds_file) L->deepspeed = true;
    L->zero_stage = V("zero_stage") ? V("zero_stage") : cfg_s(ds, "zero_stage");
    /* With a JSON file its zero_optimization.stage decides. */
    if (L->deepspeed && !L->zero_stage && !L->ds_file) L->zero_stage = "2";
    L->fsdp_strategy = V("fsdp_sharding_strategy") ? V("fsdp_sharding_strategy")
                                                   : cfg_s(fs, fsdp_key(fs, "fsdp_sharding_strategy"));
    if (L->fsdp && !L->fsdp_strategy) L->fsdp_strategy = "FULL_SHARD";
    for (int k = 0; k < N_FSDP_KEYS; k++) {
        const char *key = FSDP_KEYS[k].key;
        const cv *b = cv_get(fs, fsdp_key(fs, key));
        L->fsdp_vals[k] = V(key)                  ? V(key)
                          : b && b->t == CV_BOOL ? (b->b ? "true" : "false") /* cfg_s drops false */
                                                 : cfg_s(fs, fsdp_key(fs, key));
    }
    const char *gas = V("gradient_accumulation_steps") ? V("gradient_accumulation_steps")
                                                         : cfg_s(ds, "gradient_accumulation_steps");

    /* validation (accelerate/commands/launch.py's _validate_launch_command) */
    int paradigms = !!V("cpu") + !!V("multi_gpu") + !!V("use_deepspeed") + !!V("use_fsdp");
    if (paradigms > 1) {
        fprintf(stderr, "accel launch: error: You can only use one of `--cpu`, `--multi_gpu`, `--tpu`, "
                        "`--use_deepspeed`, `--use_fsdp` at a time.\n");
        return 2;
    }
    if (L->module && L->no_python) {
        fprintf(stderr, "accel launch: error: --module and --no_python cannot be used together\n");
        return 2;
    }
    /* The config's value in any case, as Accelerate's mixed_precision.lower();
     * the flag's exactly, as its argparse choices (it refuses `--mixed_precision FP16`) */
    static const char *const PRECISIONS[] = {"no", "fp16", "bf16", "fp8"};
    L->mixed_precision[0] = 0;
    for (size_t i = 0; i < sizeof PRECISIONS / sizeof *PRECISIONS; i++)
        if (!(mp_from_config ? strcasecmp : strcmp)(mp, PRECISIONS[i]))
            snprintf(L->mixed_precision, sizeof L->mixed_precision, "%s", PRECISIONS[i]);
    if (!L->mixed_precision[0] && !mp_from_config) {
        fprintf(stderr, "usage: %s\naccel launch: error: argument --mixed_precision/--mixed-precision: invalid choice: "
                        "'%s' (choose from 'no', 'fp16', 'bf16', 'fp8')\n", USAGE, mp);
        return 2;
    }
    if (!L->mixed_precision[0]) {
        fprintf(stderr, "accel launch: error: Unknown mixed_precision mode: %s. Choose between ['no', 'fp8', 'fp16', 'bf16'].\n",
                mp);
        return 2;
    }
    /* the flag's fp8 over a config of another precision reads its fp8_config: checked now (cfg_normalize) */
    if (cfg && !mp_from_config && !strcmp(L->mixed_precision, "fp8") &&
        !cfg_check_fp8_config(cv_get(cfg, "fp8_config"), cfg_path, err, sizeof err)) {
        fprintf(stderr, "accel launch: error: %s\n", err);
        return 2;
    }
    static const char *const DYNAMO_MODES[] = {"default", "reduce-overhead", "max-autotune"};
    bool mode_ok = !V("dynamo_mode");
    for (size_t i = 0; i < sizeof DYNAMO_MODES / sizeof *DYNAMO_MODES && !mode_ok; i++)
        mode_ok = !strcmp(V("dynamo_mode"), DYNAMO_MODES[i]);
    if (!mode_ok) {
        fprintf(stderr, "usage: %s\naccel launch: error: argument --dynamo_mode/--dynamo-mode: invalid choice: '%s' "
                        "(choose from 'default', 'reduce-overhead', 'max-autotune')\n", USAGE, V("dynamo_mode"));
        return 2;
    }
    /* exactly `no`: Accelerate's argparse refuses `NO` too (its choices are lower case) */
    if (V("dynamo_backend") && strcmp(V("dynamo_backend"), "no")) {
        fprintf(stderr, "accel launch: error: --dynamo_backend %s is not supported: accel has no torch dynamo; "
                        "only `no` is accepted\n", V("dynamo_backend"));
        return 2;
    }
    if (!slurm_machines(V("num_machines"), V("machine_rank"), V("main_process_ip"), &nm, &mr, &L->ip)) return 2;
    L->num_processes = 1;
    L->num_machines = 1;
    L->machine_rank = 0;
    if (np && !parse_int("num_processes", np, -1, INT_MAX, &L->num_processes)) return 2;
    if (L->num_processes == -1 && !V("num_processes")) { /* the config's "ask on the command line" */
        fprintf(stderr, "accel launch: error: You need to manually pass in `--num_processes` using this config yaml.\n");
        return 2;
    }
    if (L->num_processes < 1) {
        fprintf(stderr, "accel launch: error: --num_processes must be at least 1\n");
        return 2;
    }
    if (nm && !parse_int("num_machines", nm, 1, INT_MAX, &L->num_machines)) return 2;
    if (mr && !parse_int("machine_rank", mr, 0, INT_MAX, &L->machine_rank)) return 2;
    if (L->machine_rank >= L->num_machines) {
        fprintf(stderr, "accel launch: error: --machine_rank %d must be below --num_machines %d\n", L->machine_rank,
                L->num_machines);
        return 2;
    }
    if (L->num_processes % L->num_machines) {
        fprintf(stderr, "accel launch: error: --num_processes %d (the total) is not a multiple of --num_machines %d\n",
                L->num_processes, L->num_machines);
        return 2;
    }
    if (V("multi_gpu") && L->num_processes < 2) {
        fprintf(stderr, "accel launch: error: You need to use at least 2 processes to use `--multi_gpu`.\n");
        return 2;
    }
    /* Accelerate's check (made where it reads a config file; accel makes it always): each local
     * rank of a multi-GPU job takes a GPU of its own among those --gpu_ids leaves visible */
    bool multi_gpu = V("multi_gpu") || (!paradigm_flag && dtype && !strcmp(dtype, "MULTI_GPU"));
    if (multi_gpu && L->num_machines <= 1 && L->gpu_ids && strcmp(L->gpu_ids, "all") && !strchr(L->gpu_ids, ',')) {
        fprintf(stderr, "accel launch: error: Less than two GPU ids were configured and tried to run on multiple "
                        "GPUs. Please ensure at least two are specified for `--gpu_ids`, or use `--gpu_ids='all'`.\n");
        return 2;
    }
    if (L->num_machines > 1 && !L->ip) {
        fprintf(stderr, "accel launch: error: --main_process_ip is required with --num_machines > 1\n");
        return 2;
    }
    L->port = 29500;
    L->port_given = port != NULL;
    if (port && !parse_int("main_process_port", port, 0, 65535, &L->port)) return 2;
    long slurm_port; /* two jobs of several machines sharing a node must not both take 29500 */
    if (!port && L->num_machines > 1 && accel__slurm_in_step()) {
        if (accel__slurm_job_port(&slurm_port) != ACCEL_OK) {
            fprintf(stderr, "accel launch: error: %s\n", accel_last_error());
            accel_clear_error();
            return 2;
        }
        L->port = (int)slurm_port;
    }
    L->threads = 0;
    if (V("num_cpu_threads_per_process") && !parse_int("num_cpu_threads_per_process", V("num_cpu_threads_per_process"), 1, INT_MAX, &L->threads))
        return 2;
    L->grad_accum = 1;
    if (gas && !parse_int("gradient_accumulation_steps", gas, 1, INT_MAX, &L->grad_accum)) return 2;
    L->max_restarts = 0;
    if (V("max_restarts") && !parse_int("max_restarts", V("max_restarts"), 0, INT_MAX, &L->max_restarts)) return 2;
    L->tee = 0;
    if (V("tee") && !parse_int("tee", V("tee"), 0, 3, &L->tee)) return 2;
    L->grad_clip[0] = 0;
    if (clip) { /* passed on normalised: " 1_0 " reached the workers as written */
        double norm;
        if (!accel__python_float(clip, &norm) || !isfinite(norm) || norm < 0) {
            fprintf(stderr, "accel launch: error: %s: invalid value '%s' (expected a finite number >= 0)\n",
                    V("gradient_clipping") ? "argument --gradient_clipping"
                                           : "config key deepspeed_config.gradient_clipping",
                    clip);
            return 2;
        }
        accel__float_repr(L->grad_clip, sizeof L->grad_clip, norm);
    }
    L->monitor_interval = 0.1;
    if (V("monitor_interval")) { /* argparse's type=float */
        if (!accel__python_float(V("monitor_interval"), &L->monitor_interval) || !(L->monitor_interval > 0) ||
            !isfinite(L->monitor_interval)) {
            fprintf(stderr, "accel launch: error: --monitor_interval '%s' is not a positive number\n", V("monitor_interval"));
            return 2;
        }
    }
    if (cfg) {
        const cv *dc = cv_get(cfg, "dynamo_config");
        const cv *db = cv_get(dc, "dynamo_backend");
        if (db && db->t == CV_STR && strcasecmp(db->s, "no") && !L->quiet)
            fprintf(stderr, "accel launch: ignoring dynamo_config.dynamo_backend: %s (accel has no torch dynamo)\n", db->s);
    }
    if (!cfg && !V("num_processes") && !L->quiet)
        fprintf(stderr, "The following values were not passed to `accel launch` and had defaults used instead:\n"
                        "\t`--num_processes` was set to a value of `1`\n"
                        "To avoid this warning pass in values for each of the problematic parameters or run `accel config`.\n");
    L->prog_argv = argv + first;
    /* argparse takes a "--" right after the script as its end of options and
     * drops it: `accelerate launch s.py -- --x` runs `s.py --x` (the sweep's find) */
    if (L->prog_argv[1] && !strcmp(L->prog_argv[1], "--"))
        memmove(L->prog_argv + 1, L->prog_argv + 2, (size_t)(argc - first - 1) * sizeof *argv);
    if (!choose_python(L, V("python"))) return 2;
    launch_settings ls = {opts, nopts, v};
    if (!job_env(L, &ls, cfg, mp_from_config)) return 2;
#undef V
    return -1; /* resolved: go on */
}

/* ---------------------------------------------------------------- workers */

typedef struct worker {
    pid_t pid;
    int rank, local_rank;
    int err_fd, out_fd;     /* pipes (-1 when closed / not piped) */
    int log_out, log_err;   /* files under --log_dir (-1 when none) */
    bool exited;
    int status;
    char ring[8192];        /* last bytes of stderr */
    size_t ring_len, ring_pos;
    char line[2][1024];     /* partial lines for prefixing (stdout, stderr) */
    size_t line_len[2];
} worker;

static int g_sigpipe[2] = {-1, -1};

static pid_t g_launcher_pid;

static void on_signal(int sig) {
    if (getpid() != g_launcher_pid) return; /* a just-forked worker before it reset its handlers */
    int saved = errno;
    char c = sig == SIGCHLD ? 'C' : sig == SIGINT ? 'I' : 'T';
    if (write(g_sigpipe[1], &c, 1) < 0) { /* the pipe is full: a wake-up is pending anyway */ }
    errno = saved;
}

/* Picks a free loopback port and keeps it reserved: the socket stays bound
 * (SO_REUSEADDR, never listening) until the job ends, so rank 0's store can
 * still bind and listen there (SO_REUSEADDR both sides) while the kernel
 * hands the port to nobody else asking for a free one. Closing it at once
 * let two parallel launches pick the same port and join each other's store.
 * Returns the port (-1 on failure); *hold gets the descriptor to close. */
static int reserve_free_port(int *hold) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    int port = -1;
    if (fd >= 0 && setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0 &&
        bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 && getsockname(fd, (struct sockaddr *)&sa, &len) == 0)
        port = ntohs(sa.sin_port);
    if (port < 0 && fd >= 0) close(fd);
    *hold = port < 0 ? -1 : fd;
    return port;
}

static bool port_in_use(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_ANY)};
    bool used = fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0;
    if (fd >= 0) close(fd);
    return used;
}

/* nbytes (<= 32) random bytes in hex: getrandom(), not a buffered read of
 * /dev/urandom (which drew 4 KiB for each call). */
static void random_hex(char *out, size_t nbytes) {
    unsigned char b[32];
    if (getrandom(b, nbytes, 0) != (ssize_t)nbytes)
        for (size_t i = 0; i < nbytes; i++) b[i] = (unsigned char)(rand() ^ (int)getpid() ^ (int)(accel_now_seconds() * 1e6));
    for (size_t i = 0; i < nbytes; i++) sprintf(out + 2 * i, "%02x", b[i]);
}

/* ---------------------------------------------------------------- watchdog
 * After `kill -9` of the launcher its workers die of PDEATHSIG, but what they
 * started does not (a wrapper script's real trainer): PDEATHSIG covers the
 * direct child only, and a subreaper is no help once it is dead itself. So
 * before any worker starts, the launcher forks a watchdog: in its own session
 * (a signal to the launcher's process group does not reach it), holding the
 * read end of a pipe whose only write end is the launcher's. The launcher
 * sends each worker's process group on it (+pgid at fork, -pgid once the
 * worker is reaped and its group killed). End of file means the launcher is
 * gone, however it died: the watchdog SIGKILLs every group still listed and
 * removes the launcher's temporary error-file directory (in /dev/shm it
 * would otherwise hold memory until reboot). A launcher that ends normally
 * sends 0 first: it removes the directory itself. */

static int g_watchdog_fd = -1; /* the launcher's write end */
static pid_t g_watchdog_pid = -1;

/* The files in dir, then dir. */
static void remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) unlinkat(dirfd(d), e->d_name, 0);
    closedir(d);
    rmdir(dir);
}

static _Noreturn void watchdog_main(int rd, int wr, const char *tmp_dir) {
    setsid();
    prctl(PR_SET_NAME, "accel-watchdog");
    close(wr); /* else the end of file would never come */
    dup2(rd, 3);
    int null = open("/dev/null", O_RDWR);
    dup2(null, 0);
    dup2(null, 1); /* stderr stays: the one message below */
    close_range(4, ~0U, 0); /* nothing else of the launcher's: no pipe stays open because of us */
    pid_t *groups = NULL;
    size_t n = 0, cap = 0;
    int32_t rec;
    for (;;) {
        ssize_t r = read(3, &rec, sizeof rec);
        if (r < 0 && errno == EINTR) continue;
        if (r != (ssize_t)sizeof rec) break; /* EOF: the launcher is gone */
        if (rec == 0) tmp_dir = NULL;        /* a normal end follows */
        else if (rec > 0) {
            if (n == cap) {
                cap = cap ? 2 * cap : 16;
                pid_t *g = realloc(groups, cap * sizeof *g);
                if (!g) break; /* cannot track more: act now rather than lose a group */
                groups = g;
            }
            groups[n++] = rec;
        } else {
            for (size_t i = 0; i < n; i++)
                if (groups[i] == -rec) {
                    groups[i] = groups[--n];
                    break;
                }
        }
    }
    for (size_t i = 0; i < n; i++) kill(-groups[i], SIGKILL);
    if (n) fprintf(stderr, "accel launch: the launcher died; killed the process groups of its %zu workers\n", n);
    if (tmp_dir) remove_tree(tmp_dir);
    _exit(0);
}

/* tmp_dir: the directory to remove should the launcher die, or NULL. */
static bool start_watchdog(const char *tmp_dir) {
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) return false;
    pid_t pid = fork();
    if (pid < 0) {
        close(p[0]);
        close(p[1]);
        return false;
    }
    if (pid == 0) watchdog_main(p[0], p[1], tmp_dir);
    close(p[0]);
    g_watchdog_fd = p[1];
    g_watchdog_pid = pid;
    return true;
}

static void watchdog_track(pid_t pgid, bool add) {
    int32_t rec = add ? (int32_t)pgid : -(int32_t)pgid;
    if (write(g_watchdog_fd, &rec, sizeof rec) < 0) { /* the watchdog is gone: the workers' PDEATHSIG remains */ }
}

/* A normal end: every group is already dead; the watchdog exits at EOF,
 * leaving the directory to the launcher. */
static void stop_watchdog(void) {
    int32_t done = 0;
    if (write(g_watchdog_fd, &done, sizeof done) < 0) { /* the watchdog is gone */ }
    close(g_watchdog_fd);
    waitpid(g_watchdog_pid, NULL, 0);
}

typedef struct job {
    launch_cfg *L;
    int local_n;
    char secret[65], run_id[17], master_addr[256];
    int port;
    pid_t launcher;
    int attempt;             /* the restart being run */
    char err_dir[PATH_MAX];  /* the workers' TORCHELASTIC_ERROR_FILEs */
    bool err_dir_ours;       /* a temporary directory, removed at the end */
} job;

/* The error file of `rank` in this attempt: torchrun gives each worker one in
 * TORCHELASTIC_ERROR_FILE, where torch's @record (and Accelerate's scripts
 * through it) writes the exception that ended it, for the failure report. */
static void error_file(const job *J, int rank, char *out, size_t n) {
    snprintf(out, n, "%s/attempt%d_rank%d_error.json", J->err_dir, J->attempt, rank);
}

/* --log_dir/RUN_ID when logs are kept (as torchrun keeps them beside its
 * logs), else a private temporary directory. False after saying why. */
static bool make_err_dir(job *J) {
    if (J->L->log_dir) {
        /* made with its parents, as torchrun makes it; a directory that cannot
         * be made stops the launch (the workers ran without their logs) */
        snprintf(J->err_dir, sizeof J->err_dir, "%s/%s", J->L->log_dir, J->run_id);
        if (!cli_mkdirs(J->err_dir)) {
            fprintf(stderr, "accel launch: error: cannot create the log directory %s: %s\n", J->err_dir,
                    strerror(errno));
            return false;
        }
        return true;
    }
    /* $TMPDIR when set; else /dev/shm before /tmp: every launch makes and
     * removes this directory, and on a disk mounted with discard (ext4 /tmp
     * here) the rmdir alone waits for the device (0.4-6 ms measured here,
     * against a 6 ms `accel launch -n 2 /bin/true`); in memory both take
     * microseconds. */
    const char *tmp = getenv("TMPDIR");
    bool given = tmp && *tmp, made = false;
    const char *where[] = {given ? tmp : "/dev/shm", "/tmp"};
    for (int i = 0; i < (given ? 1 : 2) && !made; i++) {
        snprintf(J->err_dir, sizeof J->err_dir, "%s/accel-launch-XXXXXX", where[i]);
        made = mkdtemp(J->err_dir) != NULL;
    }
    if (!made) {
        fprintf(stderr, "accel launch: error: cannot create a directory for the workers' error files (%s): %s\n",
                J->err_dir, strerror(errno));
        return false;
    }
    J->err_dir_ours = true;
    return true;
}

/* Removes the temporary directory and the error files in it. */
static void remove_err_dir(const job *J) {
    if (!J->err_dir_ours) return;
    char path[PATH_MAX + 64];
    for (int a = 0; a <= J->attempt; a++)
        for (int i = 0; i < J->local_n; i++) {
            snprintf(path, sizeof path, "%s/attempt%d_rank%d_error.json", J->err_dir, a,
                     J->L->machine_rank * J->local_n + i);
            unlink(path);
        }
    if (rmdir(J->err_dir) != 0 && errno != ENOENT)
        fprintf(stderr, "accel launch: warning: cannot remove %s: %s\n", J->err_dir, strerror(errno));
}

/* What a worker runs: argv (PROGRAM directly, or through the interpreter for
 * .py / --module) and its environment, built before vfork so that the
 * child only makes system calls. Free with spawn_free. */
typedef struct spawn_plan {
    char **argv, **envp;
    env_list over; /* the variables envp sets for this worker (owned) */
} spawn_plan;

static void spawn_free(spawn_plan *p) {
    free(p->argv);
    free(p->envp);
    env_free(&p->over);
}

static void plan_worker(const job *J, const worker *w, int restart, spawn_plan *p) {
    const launch_cfg *L = J->L;
    env_list *e = &p->over;
    int world = L->num_processes;
    memset(p, 0, sizeof *p);
    env_int(e, "RANK", w->rank);
    env_int(e, "LOCAL_RANK", w->local_rank);
    env_int(e, "WORLD_SIZE", world);
    env_int(e, "LOCAL_WORLD_SIZE", J->local_n);
    env_int(e, "GROUP_RANK", L->machine_rank);
    env_int(e, "GROUP_WORLD_SIZE", L->num_machines);
    env_int(e, "ROLE_RANK", w->rank);
    env_add(e, "ROLE_NAME", L->role);
    env_int(e, "ROLE_WORLD_SIZE", world);
    env_add(e, "MASTER_ADDR", J->master_addr);
    env_int(e, "MASTER_PORT", J->port);
    env_int(e, "TORCHELASTIC_RESTART_COUNT", restart);
    env_int(e, "TORCHELASTIC_MAX_RESTARTS", L->max_restarts);
    env_add(e, "TORCHELASTIC_RUN_ID", J->run_id);
    char err_file[PATH_MAX + 64];
    error_file(J, w->rank, err_file, sizeof err_file);
    env_add(e, "TORCHELASTIC_ERROR_FILE", err_file);
    for (size_t i = 0; i < L->env.n; i++) env_add_kv(e, L->env.kv[i]);
    env_add(e, "ACCEL_JOB_SECRET", J->secret);
    p->envp = env_merge(environ, e);
    int n = 0;
    while (L->prog_argv[n]) n++;
    p->argv = calloc((size_t)n + 3, sizeof *p->argv);
    if (!p->argv) {
        fprintf(stderr, "accel launch: out of memory\n");
        exit(1);
    }
    int a = 0;
    if (L->python[0]) p->argv[a++] = (char *)L->python;
    if (L->module) p->argv[a++] = "-m";
    for (int i = 0; i < n; i++) p->argv[a++] = L->prog_argv[i];
}

static void say(const char *s) {
    if (write(2, s, strlen(s)) < 0) { /* nowhere left to say it */ }
}

/* In the child of vfork(), until exec: it borrows the launcher's memory and
 * stack (the launcher waits meanwhile), so it only makes system calls and
 * writes nothing but its own descriptors and signal state; no stdio, no
 * malloc. vfork instead of fork: no copy of the launcher's page tables to
 * build and tear down again at exec (about 0.2 ms of CPU per worker here). */
static _Noreturn void child_exec(const job *J, const spawn_plan *p, int out_w, int err_w) {
    const launch_cfg *L = J->L;
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != J->launcher) _exit(1); /* the launcher died before prctl */
    struct sigaction sa = {.sa_handler = SIG_DFL};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGCHLD, &sa, NULL);
    sigaction(SIGPIPE, &sa, NULL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    if (out_w >= 0) dup2(out_w, 1);
    dup2(err_w, 2);
    execvpe(p->argv[0], p->argv, p->envp);
    const char *why = strerror(errno); /* glibc: a constant string for every errno exec gives */
    if (L->python[0]) {
        say("accel launch: cannot run the Python interpreter '");
        say(p->argv[0]);
        say("' (chosen by ");
        say(L->python_from);
        say("): ");
    } else {
        say("accel launch: cannot run '");
        say(p->argv[0]);
        say("': ");
    }
    say(why);
    say("\n");
    _exit(127);
}

/* Starts a worker by plan; SIGCHLD/SIGINT/SIGTERM stay blocked across vfork
 * until the child has reset its handlers. Its own function: the child never
 * returns from it, and the caller's variables stay out of vfork's way. */
static pid_t spawn_worker(const job *J, const spawn_plan *p, int out_w, int err_w) {
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGCHLD);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    sigprocmask(SIG_BLOCK, &block, &old);
    pid_t pid = vfork();
    if (pid == 0) child_exec(J, p, out_w, err_w);
    sigprocmask(SIG_SETMASK, &old, NULL);
    return pid;
}

/* Writes `n` bytes of a worker stream to the terminal (prefixed by rank when
 * --tee selects the stream) and to its log file. */
static void forward(const job *J, worker *w, int stream, const char *buf, size_t n) {
    int term = stream == 0 ? 1 : 2;
    int logfd = stream == 0 ? w->log_out : w->log_err;
    if (logfd >= 0 && write(logfd, buf, n) < 0) { /* a full disk must not stop the job */ }
    if (stream == 1) { /* keep the tail of stderr for the report */
        for (size_t i = 0; i < n; i++) {
            w->ring[w->ring_pos] = buf[i];
            w->ring_pos = (w->ring_pos + 1) % sizeof w->ring;
        }
        w->ring_len = w->ring_len + n > sizeof w->ring ? sizeof w->ring : w->ring_len + n;
    }
    bool prefix = J->L->tee & (stream == 0 ? 1 : 2);
    if (!prefix) {
        if (write(term, buf, n) < 0) { /* terminal gone: keep supervising */ }
        return;
    }
    for (size_t i = 0; i < n; i++) {
        char c = buf[i];
        if (w->line_len[stream] < sizeof w->line[stream] - 1) w->line[stream][w->line_len[stream]++] = c;
        if (c == '\n' || w->line_len[stream] == sizeof w->line[stream] - 1) {
            char out[1100];
            int m = snprintf(out, sizeof out, "[rank%d]: %.*s", w->rank, (int)w->line_len[stream], w->line[stream]);
            if (write(term, out, (size_t)m) < 0) { /* terminal gone */ }
            w->line_len[stream] = 0;
        }
    }
}

/* Reads what is available on fd; false at EOF. */
static bool drain_fd(const job *J, worker *w, int stream) {
    int *fd = stream == 0 ? &w->out_fd : &w->err_fd;
    char buf[65536];
    ssize_t r = read(*fd, buf, sizeof buf);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) return true;
    if (r <= 0) {
        close(*fd);
        *fd = -1;
        if (w->line_len[stream]) forward(J, w, stream, "\n", 1);
        return false;
    }
    forward(J, w, stream, buf, (size_t)r);
    return true;
}

static void describe_status(int status, char *out, size_t n) {
    if (WIFEXITED(status)) snprintf(out, n, "exitcode  : %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status)) {
        const char *abbrev = sigabbrev_np(WTERMSIG(status));
        snprintf(out, n, "exitcode  : -%d (signal: SIG%s)", WTERMSIG(status), abbrev ? abbrev : "?");
    } else snprintf(out, n, "status %d", status);
}

/* The last bytes of a worker's stderr, as one string. */
static void stderr_tail(const worker *w, char *tail) {
    size_t n = w->ring_len, start = (w->ring_pos + sizeof w->ring - n) % sizeof w->ring;
    for (size_t i = 0; i < n; i++) tail[i] = w->ring[(start + i) % sizeof w->ring];
    while (n && tail[n - 1] == '\n') n--;
    tail[n] = 0;
}

/* "PYTHON (chosen by HOW) could not import 'MOD'" when a Python worker's
 * stderr ends in a ModuleNotFoundError: the usual cause is the wrong
 * interpreter (not the virtualenv that has torch / accelerate). "" otherwise. */
static void import_failure(const launch_cfg *L, const char *tail, char *out, size_t n) {
    static const char NEEDLE[] = "No module named '";
    out[0] = 0;
    if (!L->python[0]) return;
    const char *m = NULL;
    for (const char *p = tail; (p = strstr(p, NEEDLE)); p++) m = p + strlen(NEEDLE);
    if (!m) return;
    snprintf(out, n, "%s (chosen by %s) could not import '%.*s'; choose the interpreter with --python, $PYTHON or "
             "$VIRTUAL_ENV", L->python, L->python_from, (int)strcspn(m, "'\n"), m);
}

/* The exception torch's @record wrote into the worker's error file, if any:
 * {"message": {"message": "ValueError: ...", "extraInfo": {...}}} (or a
 * plain string message). */
static void report_error_file(const job *J, const worker *w) {
    char path[PATH_MAX + 64];
    error_file(J, w->rank, path, sizeof path);
    json_t *root = json_load_file(path, 0, NULL);
    if (!root) return;
    json_t *m = json_object_get(root, "message");
    const char *text = json_is_string(m) ? json_string_value(m) : json_string_value(json_object_get(m, "message"));
    fprintf(stderr, "  error_file: %s\n", path);
    if (text) fprintf(stderr, "  exception : %.*s\n", (int)strcspn(text, "\n"), text);
    json_decref(root);
}

static void report(const job *J, const worker *w, double when) {
    char st[96], host[256] = "";
    describe_status(w->status, st, sizeof st);
    gethostname(host, sizeof host - 1);
    time_t t = (time_t)when;
    char ts[64];
    strftime(ts, sizeof ts, "%Y-%m-%d_%H:%M:%S", localtime(&t));
    fprintf(stderr, "============================================================\n"
                    "accel launch: FAILED (%s)\n"
                    "Root Cause (first observed failure):\n"
                    "  time      : %s\n  host      : %s\n  rank      : %d (local_rank: %d)\n  pid       : %d\n  %s\n",
            J->L->prog_argv[0], ts, host, w->rank, w->local_rank, (int)w->pid, st);
    char tail[sizeof w->ring + 1], hint[PATH_MAX + 256];
    stderr_tail(w, tail);
    import_failure(J->L, tail, hint, sizeof hint);
    if (hint[0]) fprintf(stderr, "  python    : %s\n", hint);
    report_error_file(J, w);
    /* last 10 lines of its stderr */
    size_t n = strlen(tail), from = n;
    for (int lines = 0; from > 0; from--)
        if (tail[from - 1] == '\n' && ++lines == 10) break;
    fprintf(stderr, "  stderr (last lines):\n");
    if (!n) fprintf(stderr, "    <empty>\n");
    for (char *line = tail + from, *nl; n && line; line = nl ? nl + 1 : NULL) {
        nl = strchr(line, '\n');
        if (nl) *nl = 0;
        fprintf(stderr, "    %s\n", line);
    }
    fprintf(stderr, "============================================================\n");
}

/* -q: one line, with the import failure when there is one. */
static void report_quiet(const job *J, const worker *w) {
    char st[96], tail[sizeof w->ring + 1], hint[PATH_MAX + 256];
    describe_status(w->status, st, sizeof st);
    stderr_tail(w, tail);
    import_failure(J->L, tail, hint, sizeof hint);
    fprintf(stderr, "accel launch: rank %d failed (%s)%s%s\n", w->rank, st, hint[0] ? "; " : "", hint);
}

static void open_logs(const job *J, worker *w, bool append) {
    w->log_out = w->log_err = -1;
    if (!J->L->log_dir) return;
    char dir[4096], path[4200];
    snprintf(dir, sizeof dir, "%s/%s", J->L->log_dir, J->run_id); /* made by make_err_dir */
    int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (append ? O_APPEND : O_TRUNC);
    snprintf(path, sizeof path, "%s/rank%d.stdout", dir, w->rank);
    w->log_out = open(path, flags, 0644);
    snprintf(path, sizeof path, "%s/rank%d.stderr", dir, w->rank);
    w->log_err = open(path, flags, 0644);
    if (w->log_out < 0 || w->log_err < 0)
        fprintf(stderr, "accel launch: warning: cannot write rank %d's logs in %s: %s\n", w->rank, dir, strerror(errno));
}

static void signal_all(worker *ws, int n, int sig) {
    for (int i = 0; i < n; i++)
        if (!ws[i].exited && ws[i].pid > 0) kill(-ws[i].pid, sig);
}

/* How long the supervision loop may sleep: --monitor_interval, but never past
 * the SIGKILL deadline (the documented 3 s escalation must not wait for a
 * slow monitor), computed in double so that huge intervals cannot overflow. */
static int poll_timeout_ms(double monitor_interval, double kill_deadline) {
    double ms = monitor_interval * 1000;
    if (kill_deadline > 0) {
        double left = (kill_deadline - accel_now_seconds()) * 1000 + 1;
        if (left < ms) ms = left;
    }
    if (ms < 1) return 1;
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

/* Runs one attempt of the group. Returns 0 on success, 1 on a worker
 * failure, 128+signal when the launcher was interrupted. */
static int run_group(job *J, int restart) {
    const launch_cfg *L = J->L;
    int n = J->local_n;
    worker *ws = calloc((size_t)n, sizeof *ws);
    struct pollfd *pf = calloc((size_t)(2 * n + 1), sizeof *pf);
    if (!ws || !pf) {
        fprintf(stderr, "accel launch: error: cannot allocate the state of %d local workers\n", n);
        exit(1);
    }
    int ret = 0, interrupted = 0;
    J->attempt = restart;
    for (int i = 0; i < n; i++) {
        worker *w = &ws[i];
        w->local_rank = i;
        w->rank = L->machine_rank * n + i;
        char err_file[PATH_MAX + 64];
        error_file(J, w->rank, err_file, sizeof err_file);
        unlink(err_file); /* a stale one would be reported as this attempt's */
        w->out_fd = w->err_fd = -1;
        open_logs(J, w, restart > 0);
        int ep[2], op[2] = {-1, -1};
        bool pipe_out = (L->tee & 1) || L->log_dir;
        if (pipe2(ep, O_CLOEXEC) != 0 || (pipe_out && pipe2(op, O_CLOEXEC) != 0)) {
            fprintf(stderr, "accel launch: pipe: %s\n", strerror(errno));
            exit(1);
        }
        spawn_plan plan;
        plan_worker(J, w, restart, &plan);
        pid_t pid = spawn_worker(J, &plan, op[1], ep[1]);
        spawn_free(&plan);
        if (pid < 0) {
            fprintf(stderr, "accel launch: fork: %s\n", strerror(errno));
            signal_all(ws, i, SIGKILL);
            exit(1);
        }
        watchdog_track(pid, true);
        setpgid(pid, pid);
        w->pid = pid;
        close(ep[1]);
        w->err_fd = ep[0];
        if (pipe_out) {
            close(op[1]);
            w->out_fd = op[0];
        }
    }
    int alive = n;
    worker *first_fail = NULL;
    double fail_time = 0, kill_deadline = 0;
    for (;;) {
        int np = 0;
        pf[np++] = (struct pollfd){.fd = g_sigpipe[0], .events = POLLIN};
        for (int i = 0; i < n; i++) {
            if (ws[i].err_fd >= 0) pf[np++] = (struct pollfd){.fd = ws[i].err_fd, .events = POLLIN};
            if (ws[i].out_fd >= 0) pf[np++] = (struct pollfd){.fd = ws[i].out_fd, .events = POLLIN};
        }
        bool pipes_open = np > 1;
        if (!alive && !pipes_open) break;
        /* Once every worker exited, only leftover output (a grandchild may hold a pipe) is read, briefly. */
        int pr = poll(pf, (nfds_t)np, alive ? poll_timeout_ms(L->monitor_interval, kill_deadline) : 50);
        if (pr == 0 && !alive) break;
        for (int k = 1; k < np; k++) {
            if (!pf[k].revents) continue;
            for (int i = 0; i < n; i++) {
                if (pf[k].fd == ws[i].err_fd) drain_fd(J, &ws[i], 1);
                else if (pf[k].fd == ws[i].out_fd) drain_fd(J, &ws[i], 0);
            }
        }
        if (pf[0].revents & POLLIN) {
            char sigs[64];
            ssize_t r = read(g_sigpipe[0], sigs, sizeof sigs);
            for (ssize_t i = 0; i < r; i++) {
                if (sigs[i] == 'C' || interrupted) continue;
                interrupted = sigs[i] == 'I' ? SIGINT : SIGTERM;
                fprintf(stderr, "accel launch: received %s, stopping the workers\n",
                        interrupted == SIGINT ? "SIGINT" : "SIGTERM");
                signal_all(ws, n, interrupted);
                kill_deadline = accel_now_seconds() + 3.0;
            }
        }
        int status;
        pid_t pid;
        while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
            for (int i = 0; i < n; i++) {
                if (ws[i].pid != pid) continue;
                ws[i].exited = true;
                ws[i].status = status;
                alive--;
                /* Its process group may still hold grandchildren: end them with it. */
                kill(-pid, SIGKILL);
                watchdog_track(pid, false);
                bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
                if (!ok && !first_fail && !interrupted) {
                    first_fail = &ws[i];
                    fail_time = (double)time(NULL);
                    signal_all(ws, n, SIGTERM);
                    kill_deadline = accel_now_seconds() + 3.0;
                }
            }
        }
        if (kill_deadline > 0 && alive && accel_now_seconds() > kill_deadline) {
            signal_all(ws, n, SIGKILL);
            kill_deadline = 0;
        }
    }
    for (int i = 0; i < n; i++) {
        if (ws[i].err_fd >= 0) close(ws[i].err_fd);
        if (ws[i].out_fd >= 0) close(ws[i].out_fd);
        if (ws[i].log_out >= 0) close(ws[i].log_out);
        if (ws[i].log_err >= 0) close(ws[i].log_err);
    }
    if (interrupted) ret = 128 + interrupted;
    else if (first_fail) {
        ret = 1;
        if (L->quiet) report_quiet(J, first_fail);
        else report(J, first_fail, fail_time);
    }
    free(pf);
    free(ws);
    return ret;
}

/* The launcher holds descriptors for each local worker while it runs (its
 * stderr pipe; its stdout pipe when teed or logged; its two log files with
 * --log_dir): a group that needs more than the open-file limit would fail
 * part-way ("pipe: Too many open files") with thousands of workers started.
 * Refused before any starts, naming the limit. */
static bool descriptors_suffice(const launch_cfg *L, int local_n) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return true;
    int each = 1 + (((L->tee & 1) || L->log_dir) ? 1 : 0) + (L->log_dir ? 2 : 0);
    /* + the launcher's own, 9 measured with one worker (the standard streams, /dev/null, the port's socket,
     * pipes), and a worker's pipes while it starts: 32 refused every launch under ulimit -n 32, though one
     * worker runs in 10 */
    unsigned long long need = (unsigned long long)local_n * (unsigned long long)each + 16;
    if (need <= (unsigned long long)rl.rlim_cur) return true;
    fprintf(stderr, "accel launch: error: %d processes on this machine need about %llu open files in the launcher "
                    "(%d each), over its limit of %llu (ulimit -n): %s\n",
            local_n, need, each, (unsigned long long)rl.rlim_cur,
            local_n > 1 ? "start fewer, or raise the limit" : "raise the limit");
    return false;
}

/* Frees what resolve() built and returns rc. */
static int finish(launch_cfg *L, cv *cfg, int rc) {
    env_free(&L->env);
    cv_free(cfg);
    return rc;
}

int accel_cli_launch(int argc, char **argv) {
    launch_cfg L;
    memset(&L, 0, sizeof L);
    cv *cfg = NULL;
    int r = resolve(argc, argv, &L, &cfg);
    if (r >= 0) {
        return finish(&L, cfg, r);
    }
    job J;
    memset(&J, 0, sizeof J);
    J.L = &L;
    J.local_n = L.num_processes / L.num_machines;
    if (!descriptors_suffice(&L, J.local_n)) return finish(&L, cfg, 1);
    J.launcher = g_launcher_pid = getpid();
    /* The job secret authenticates connections to the store and between
     * workers. Machines of one job cannot agree on a random one: they share
     * ACCEL_JOB_SECRET from the environment (required unless
     * ACCEL_INSECURE_NO_SECRET=1). */
    const char *given_secret = getenv("ACCEL_JOB_SECRET");
    if (given_secret && *given_secret) snprintf(J.secret, sizeof J.secret, "%s", given_secret);
    else if (L.num_machines == 1) random_hex(J.secret, 32);
    else if (!L.insecure) {
        /* the workers would refuse it too (src/dist/dist.c): say so before starting any */
        fprintf(stderr, "accel launch: error: --num_machines %d needs ACCEL_JOB_SECRET%s: export the same non-empty "
                        "secret on every machine, e.g. export ACCEL_JOB_SECRET=$(od -An -N16 -tx1 /dev/urandom | tr -d "
                        "' \\n'), or set ACCEL_INSECURE_NO_SECRET=1 to run without one (anyone who can reach the ports "
                        "could join the job)\n", L.num_machines,
                given_secret ? " (it is set but empty: an empty secret is none)" : "");
        return finish(&L, cfg, 1);
    }
    random_hex(J.run_id, 8);
    snprintf(J.master_addr, sizeof J.master_addr, "%s", L.ip ? L.ip : "127.0.0.1");
    J.port = L.port;
    int port_hold = -1; /* closed by every return below */
    /* One machine and no port asked for: pick a free port, as torchrun's
     * --standalone does, so parallel jobs never race for 29500. */
    bool standalone = L.num_machines == 1 && !L.port_given;
    if (L.machine_rank == 0 && (L.port == 0 || standalone || port_in_use(L.port))) {
        if (L.port != 0 && L.num_machines > 1) {
            fprintf(stderr, "accel launch: error: Tried to launch distributed communication on port `%d`, but another "
                            "process is utilizing it. Please specify a different port (such as using the "
                            "`--main_process_port` flag or specifying a different `main_process_port` in your config "
                            "file) and rerun your script. To automatically use the next open port (on a single node), "
                            "you can set this to `0`.\n", L.port);
            return finish(&L, cfg, 1);
        }
        if (L.port != 0 && L.port_given && !L.quiet)
            fprintf(stderr, "accel launch: port %d is in use; using a free port instead\n", L.port);
        J.port = reserve_free_port(&port_hold);
        if (J.port < 0) {
            fprintf(stderr, "accel launch: error: cannot reserve a free port on 127.0.0.1: %s\n", strerror(errno));
            return finish(&L, cfg, 1);
        }
    }
    if (!make_err_dir(&J)) {
        if (port_hold >= 0) close(port_hold);
        return finish(&L, cfg, 1);
    }
    signal(SIGPIPE, SIG_IGN);
    if (!start_watchdog(J.err_dir_ours ? J.err_dir : NULL)) {
        remove_err_dir(&J);
        fprintf(stderr, "accel launch: cannot start the watchdog: %s\n", strerror(errno));
        if (port_hold >= 0) close(port_hold);
        return finish(&L, cfg, 1);
    }
    if (pipe2(g_sigpipe, O_CLOEXEC | O_NONBLOCK) != 0) {
        fprintf(stderr, "accel launch: pipe: %s\n", strerror(errno));
        stop_watchdog();
        remove_err_dir(&J);
        if (port_hold >= 0) close(port_hold);
        return finish(&L, cfg, 1);
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGCHLD, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    int ret = 0;
    for (int restart = 0;; restart++) {
        ret = run_group(&J, restart);
        if (ret != 1 || restart >= L.max_restarts) break;
        fprintf(stderr, "accel launch: worker group failed; restarting (restart %d of %d)\n", restart + 1, L.max_restarts);
    }
    signal(SIGCHLD, SIG_DFL);
    close(g_sigpipe[0]);
    close(g_sigpipe[1]);
    stop_watchdog();
    remove_err_dir(&J);
    if (port_hold >= 0) close(port_hold);
    return finish(&L, cfg, ret);
}
