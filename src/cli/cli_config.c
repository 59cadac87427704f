/* src/cli/cli_config.c — `accel config` (interactive), `accel config default`,
 * `accel config update`. Answers are read from stdin line by line, so the
 * wizard can be driven through a pipe: menus accept the option index or its
 * text, empty lines take the default, bad answers are asked again. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "cli/cli.h"
#include "core/env.h"

static const cli_opt OPTS[] = {
    {"config_file", 0, true, "CONFIG_FILE", "The path to the config file to write (default: the accelerate cache)."},
    {"mixed_precision", 0, true, "{no,fp16,bf16}", "(default only) Mixed precision of the default config."},
};
#define NOPTS ((int)(sizeof OPTS / sizeof *OPTS))

/* ---------------------------------------------------------------- prompts */

/* A line from stdin without the newline; exits 1 at EOF (no answer possible).
 * A line that does not fit out is asked again: cut to fit, its rest became
 * the next question's answer (64 GPU ids were written as the first 46). */
static void ask_line(const char *prompt, char *out, size_t n) {
    for (;;) {
        fputs(prompt, stdout);
        fflush(stdout);
        if (!fgets(out, (int)n, stdin)) {
            fprintf(stderr, "\naccel config: error: no answer (end of input)\n");
            exit(1);
        }
        size_t len = strlen(out);
        if (len < n - 1 || out[len - 1] == '\n' || feof(stdin)) break;
        int c;
        while ((c = getchar()) != EOF && c != '\n') {} /* the rest of that line */
        printf("\nThat answer is too long: at most %zu characters, please.\n", n - 2);
    }
    out[strcspn(out, "\r\n")] = 0;
    char *s = out;
    while (*s == ' ' || *s == '\t') s++;
    memmove(out, s, strlen(s) + 1);
    for (size_t l = strlen(out); l && (out[l - 1] == ' ' || out[l - 1] == '\t'); l--) out[l - 1] = 0;
}

static int ask_menu(const char *q, const char *const *opts, int nopts, int dflt) {
    for (;;) {
        printf("%s\n", q);
        for (int i = 0; i < nopts; i++) printf("  [%d] %s%s\n", i, opts[i], i == dflt ? " (default)" : "");
        char a[256];
        ask_line("Please select a choice: ", a, sizeof a);
        if (!*a) return dflt;
        char *end;
        long k = strtol(a, &end, 10);
        if (!*end && k >= 0 && k < nopts) return (int)k;
        for (int i = 0; i < nopts; i++)
            if (!strcasecmp(a, opts[i])) return i;
        printf("Please select one of the %d choices by index or text.\n", nopts);
    }
}

static bool ask_yes_no(const char *q, bool dflt) {
    for (;;) {
        char a[64];
        ask_line(q, a, sizeof a);
        if (!*a) return dflt;
        if (!strcasecmp(a, "yes")) return true;
        if (!strcasecmp(a, "no")) return false;
        printf("Please enter yes or no.\n");
    }
}

static long ask_int(const char *q, long dflt, long lo, long hi) {
    for (;;) {
        char a[64];
        ask_line(q, a, sizeof a);
        if (!*a) return dflt;
        char *end;
        errno = 0;
        long v = strtol(a, &end, 10);
        if (!*end && !errno && v >= lo && v <= hi) return v;
        printf("Please enter an integer from %ld to %ld.\n", lo, hi);
    }
}

/* num_processes is the total over all machines (as Accelerate writes the
 * answer and accel launch reads it), so it must split evenly between them:
 * accel launch refuses any other. */
static long ask_total_processes(bool cpu_type, long machines) {
    for (;;) {
        long n = ask_int(cpu_type ? "How many processes should be used for distributed training? [1]: "
                                  : "How many GPU(s) should be used for distributed training? [1]: ", 1, 1, INT_MAX);
        if (n % machines == 0) return n;
        printf("Please enter a multiple of the number of machines (%ld): the total over all machines.\n", machines);
    }
}

/* A finite number >= 0 (a gradient norm), as Python's float() reads it
 * (Accelerate's wizard asks with _ask_field(..., float)). */
static double ask_norm(const char *q, double dflt) {
    for (;;) {
        char a[64];
        ask_line(q, a, sizeof a);
        if (!*a) return dflt;
        double v;
        if (accel__python_float(a, &v) && v >= 0 && isfinite(v)) return v;
        printf("Please enter a number >= 0.\n");
    }
}

static void ask_str(const char *q, const char *dflt, char *out, size_t n) {
    for (;;) {
        ask_line(q, out, n);
        if (!*out && dflt) snprintf(out, n, "%s", dflt);
        if (*out && cli_is_utf8(out)) return;
        printf(*out ? "Please enter UTF-8 text (config files hold UTF-8 only).\n" : "Please enter a value.\n");
    }
}

/* ---------------------------------------------------------------- wizard */

/* The length of a NULL-terminated list. */
static int choices(const char *const *list) {
    int n = 0;
    while (list[n]) n++;
    return n;
}

/* cluster.py's fp8 questions: fp8_config with the keys Accelerate's wizard
 * writes (amax_history_length, ...; `accel launch` reads them too). */
static cv *ask_fp8(void) {
    static const char *const GEMMS[] = {"fprop", "dgrad", "wgrad"};
    cv *f = cv_new(CV_MAP);
    int b = ask_menu("Which FP8 backend do you want to use?", CLI_FP8_BACKENDS, choices(CLI_FP8_BACKENDS), 0);
    char name[16]; /* the wizard writes the backend in upper case: AO, TE */
    snprintf(name, sizeof name, "%s", CLI_FP8_BACKENDS[b]);
    for (char *c = name; *c; c++)
        if (*c >= 'a' && *c <= 'z') *c = (char)(*c - 'a' + 'A');
    cv_set(f, "backend", cv_str(name));
    if (!strcmp(CLI_FP8_BACKENDS[b], "te")) {
        cv_set(f, "use_autocast_during_eval",
               cv_bool(ask_yes_no("Do you want to use FP8 autocast during eval mode? Generally better metrics are "
                                  "found when this is disabled [yes/NO]: ", false)));
        cv_set(f, "margin", cv_int(ask_int("What margin should be used for gradient scaling? [0]: ", 0, 0, INT_MAX)));
        cv_set(f, "interval", cv_int(ask_int("What interval should be used for how often the scaling factor is "
                                             "recomputed? [1]: ", 1, 1, INT_MAX)));
        int fmt = ask_menu("Which weight format should be used?", CLI_FP8_FORMATS, choices(CLI_FP8_FORMATS), 0);
        cv_set(f, "fp8_format", cv_str(CLI_FP8_FORMATS[fmt]));
        cv_set(f, "amax_history_length", cv_int(ask_int("What length of history should be used for the amax scaling "
                                                        "factor computation? [1024]: ", 1024, 1, INT_MAX)));
        int algo = ask_menu("Which algorithm should be used for the amax scaling factor computation?", CLI_FP8_ALGOS,
                            choices(CLI_FP8_ALGOS), 0);
        cv_set(f, "amax_compute_algorithm", cv_str(CLI_FP8_ALGOS[algo]));
        cv *o = cv_new(CV_SEQ);
        bool any = ask_yes_no("Do you want to execute `fprop`, `dgrad`, and `wgrad` GEMMS in higher precision? "
                              "[yes/NO]: ", false);
        for (int g = 0; g < 3; g++) {
            char q[96];
            snprintf(q, sizeof q, "Should `%s` be executed in higher precision? [yes/NO]: ", GEMMS[g]);
            cv_append(o, cv_bool(any && ask_yes_no(q, false)));
        }
        cv_set(f, "override_linear_precision", o);
    } else {
        cv_set(f, "enable_fsdp_float8_all_gather",
               cv_bool(ask_yes_no("Do you want to enable FSDP2 float8 all gather? This is recommended for better "
                                  "performance if using FSDP2. [YES/no]: ", true)));
        cv_set(f, "pad_inner_dim",
               cv_bool(ask_yes_no("Do you want to pad the inner dimension of weight matrices before float8 matmuls? "
                                  "This is required for _scaled_mm which has strict alignment requirements. Note: "
                                  "padding may cause memory spikes. [YES/no]: ", true)));
    }
    return f;
}

/* cluster.py's parallelism_config questions (Accelerate asks them under
 * FSDP2; accel's mesh runs under any sharding, so under FSDP). */
static cv *ask_parallelism(void) {
    static const char *const STRATEGIES[] = {"allgather", "alltoall"};
    cv *p = cv_new(CV_MAP);
    cv_set(p, "parallelism_config_dp_replicate_size",
           cv_int(ask_int("What is the data parallelism replicate size? [1]: ", 1, 1, 1 << 20)));
    cv_set(p, "parallelism_config_dp_shard_size", cv_int(ask_int("What is the FSDP shard size? [1]: ", 1, 1, 1 << 20)));
    cv_set(p, "parallelism_config_tp_size", cv_int(ask_int("What is the tensor parallelism size? [1]: ", 1, 1, 1 << 20)));
    long cp = ask_int("What is the context parallelism size? [1]: ", 1, 1, 1 << 20);
    cv_set(p, "parallelism_config_cp_size", cv_int(cp));
    if (cp > 1)
        cv_set(p, "parallelism_config_cp_comm_strategy",
               cv_str(STRATEGIES[ask_menu("What is the compute parallelism communication strategy?", STRATEGIES, 2,
                                          0)]));
    return p;
}

/* cluster.py's Megatron-LM questions (multi-GPU machines). */
static cv *ask_megatron(void) {
    cv *m = cv_new(CV_MAP);
    long tp = ask_int("What is the Tensor Parallelism degree/size? [1]:", 1, 1, 1 << 20);
    cv_set(m, "megatron_lm_tp_degree", cv_int(tp));
    if (tp > 1)
        cv_set(m, "megatron_lm_sequence_parallelism",
               cv_bool(ask_yes_no("Do you want to enable Sequence Parallelism? [YES/no]: ", true)));
    long pp = ask_int("What is the Pipeline Parallelism degree/size? [1]:", 1, 1, 1 << 20);
    cv_set(m, "megatron_lm_pp_degree", cv_int(pp));
    if (pp > 1)
        cv_set(m, "megatron_lm_num_micro_batches",
               cv_int(ask_int("What is the number of micro-batches? [1]:", 1, 1, 1 << 20)));
    cv_set(m, "megatron_lm_recompute_activations",
           cv_bool(ask_yes_no("Do you want to enable selective activation recomputation? [YES/no]: ", true)));
    cv_set(m, "megatron_lm_use_distributed_optimizer",
           cv_bool(ask_yes_no("Do you want to use distributed optimizer which shards optimizer state and gradients "
                              "across data parallel ranks? [YES/no]: ", true)));
    cv *clip = cv_new(CV_FLOAT);
    clip->f = ask_norm("What is the gradient clipping value based on global L2 Norm (0 to disable)? [1.0]: ", 1.0);
    cv_set(m, "megatron_lm_gradient_clipping", clip);
    return m;
}

static cv *wizard(void) {
    static const char *const ENVS[] = {"This machine", "AWS (Amazon SageMaker)"};
    static const char *const MACHINES[] = {"No distributed training", "multi-CPU", "multi-XPU", "multi-HPU", "multi-GPU",
                                           "multi-NPU", "multi-MLU", "multi-SDAA", "multi-MUSA", "multi-NEURON", "TPU"};
    static const char *const PRECISION[] = {"no", "fp16", "bf16", "fp8"};
    static const char *const STAGES[] = {"0", "1", "2", "3"};
    static const char *const FSDP[] = {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2"};
    while (ask_menu("In which compute environment are you running?", ENVS, 2, 0) != 0)
        printf("accel supports only `This machine` (no SageMaker).\n");
    int m;
    for (;;) {
        m = ask_menu("Which type of machine are you using?", MACHINES, 11, 0);
        if (m == 0 || m == 1 || m == 4) break;
        printf("accel supports `No distributed training`, `multi-CPU` and `multi-GPU` only.\n");
    }
    bool multi = m != 0, cpu_type = m == 1;
    cv *c = cv_new(CV_MAP);
    cv_set(c, "compute_environment", cv_str("LOCAL_MACHINE"));
    const char *dtype = m == 0 ? "NO" : m == 1 ? "MULTI_CPU" : "MULTI_GPU";
    long machines = 1;
    bool debug = false, use_cpu = cpu_type;
    if (multi) {
        machines = ask_int("How many different machines will you use (use more than 1 for multi-node training)? [1]: ", 1, 1, INT_MAX);
        if (machines > 1) {
            char q[128], ip[256];
            snprintf(q, sizeof q, "What is the rank of this machine? (0..%ld) [0]: ", machines - 1);
            long rank;
            while ((rank = ask_int(q, 0, 0, INT_MAX)) >= machines) printf("The rank must be below %ld.\n", machines);
            cv_set(c, "machine_rank", cv_int(rank));
            ask_str("What is the IP address of the machine that will host the main process? ", NULL, ip, sizeof ip);
            cv_set(c, "main_process_ip", cv_str(ip));
            cv_set(c, "main_process_port",
                   cv_int(ask_int("What is the port you will use to communicate with the main process? ", 29500, 0, 65535)));
            bool same = ask_yes_no("Are all the machines on the same local network? Answer `no` if nodes are on the "
                                   "cloud and/or on different network hosts [YES/no]: ", true);
            cv_set(c, "same_network", cv_bool(same));
            char rb[64] = "static";
            if (!same)
                ask_str("What rendezvous backend will you use? ('static', 'c10d', ...): ", "static", rb, sizeof rb);
            cv_set(c, "rdzv_backend", cv_str(rb));
        }
        debug = ask_yes_no("Should distributed operations be checked while running for errors? This can avoid timeout "
                           "issues but will be slower. [yes/NO]: ", false);
        /* Accelerate's launcher starts the processes of a MULTI_CPU config only
         * through mpirun (else one process): its question, its mpirun_config */
        if (cpu_type && ask_yes_no("Do you want accelerate to launch mpirun? [yes/NO]: ", false)) {
            char host[2048], expanded[4096];
            ask_str("Please enter the path to the hostfile to use with mpirun [~/hostfile]: ", "~/hostfile", host,
                    sizeof host);
            const char *home = accel__home_dir();
            if (host[0] == '~' && (host[1] == '/' || !host[1]) && home) /* os.path.expanduser */
                snprintf(expanded, sizeof expanded, "%s%s", home, host + 1);
            else snprintf(expanded, sizeof expanded, "%s", host);
            cv *mpi = cv_new(CV_MAP);
            cv_set(mpi, "mpirun_hostfile", cv_str(expanded));
            cv_set(c, "mpirun_config", mpi);
        }
    } else {
        use_cpu = ask_yes_no("Do you want to run your training on CPU only (even if a GPU / Apple Silicon / Ascend NPU "
                             "device is available)? [yes/NO]:", false);
    }
    if (ask_yes_no("Do you want to use DeepSpeed? [yes/NO]: ", false)) {
        dtype = "DEEPSPEED";
        cv *ds = cv_new(CV_MAP);
        int stage = ask_menu("What should be your DeepSpeed's ZeRO optimization stage?", STAGES, 4, 2);
        cv_set(ds, "zero_stage", cv_int(stage));
        if (stage >= 2) {
            cv_set(ds, "offload_optimizer_device", cv_str("none"));
            cv_set(ds, "offload_param_device", cv_str("none"));
        }
        cv_set(ds, "gradient_accumulation_steps",
               cv_int(ask_int("How many gradient accumulation steps you're passing in your script? [1]: ", 1, 1, INT_MAX)));
        cv_set(ds, "zero3_init_flag", cv_bool(false));
        cv_set(c, "deepspeed_config", ds);
    } else if (multi && ask_yes_no("Do you want to use FullyShardedDataParallel? [yes/NO]: ", false)) {
        dtype = "FSDP";
        cv *fs = cv_new(CV_MAP);
        cv_set(fs, "fsdp_sharding_strategy", cv_str(FSDP[ask_menu("What should be your sharding strategy?", FSDP, 5, 0)]));
        cv_set(fs, "fsdp_version", cv_int(1));
        cv_set(c, "fsdp_config", fs);
        if (ask_yes_no("Do you want to use the parallelism config? [yes/NO]: ", false))
            cv_set(c, "parallelism_config", ask_parallelism());
    } else if (multi && !cpu_type && ask_yes_no("Do you want to use Megatron-LM ? [yes/NO]: ", false)) {
        dtype = "MEGATRON_LM";
        cv_set(c, "megatron_lm_config", ask_megatron());
    }
    long procs = 1;
    if (multi) procs = ask_total_processes(cpu_type, machines);
    if (!strcmp(dtype, "MULTI_GPU") && machines == 1 && procs == 1) {
        fprintf(stderr, "accel config: error: Specified distributed type MULTI_GPU but only using 1 GPU on a single "
                        "machine. Please select `No distributed training` for the type of machine you are using.\n");
        cv_free(c);
        exit(1);
    }
    if (!cpu_type && !use_cpu) {
        char ids[1024];
        ask_str("What GPU(s) (by id) should be used for training on this machine as a comma-separated list? [all]:",
                "all", ids, sizeof ids);
        cv_set(c, "gpu_ids", cv_str(ids));
    }
    int mp = ask_menu("Do you wish to use mixed precision?", PRECISION, 4, 0);
    if (mp == 3) cv_set(c, "fp8_config", ask_fp8());
    cv_set(c, "distributed_type", cv_str(dtype));
    cv_set(c, "debug", cv_bool(debug));
    cv_set(c, "downcast_bf16", cv_str("no"));
    cv_set(c, "enable_cpu_affinity", cv_bool(false));
    if (!cv_get(c, "machine_rank")) cv_set(c, "machine_rank", cv_int(0));
    cv_set(c, "main_training_function", cv_str("main"));
    cv_set(c, "mixed_precision", cv_str(PRECISION[mp]));
    cv_set(c, "num_machines", cv_int(machines));
    cv_set(c, "num_processes", cv_int(procs));
    if (!cv_get(c, "rdzv_backend")) cv_set(c, "rdzv_backend", cv_str("static"));
    if (!cv_get(c, "same_network")) cv_set(c, "same_network", cv_bool(true));
    cv_set(c, "tpu_env", cv_new(CV_SEQ));
    cv_set(c, "tpu_use_cluster", cv_bool(false));
    cv_set(c, "tpu_use_sudo", cv_bool(false));
    cv_set(c, "use_cpu", cv_bool(use_cpu));
    return c;
}

/* ---------------------------------------------------------------- entry */

int accel_cli_config(int argc, char **argv) {
    const char *sub = argc > 1 && argv[1][0] != '-' ? argv[1] : NULL;
    if (sub && strcmp(sub, "default") && strcmp(sub, "update")) {
        fprintf(stderr, "accel config: error: invalid choice: '%s' (choose from 'default', 'update')\n", sub);
        return 2;
    }
    char usage[128];
    snprintf(usage, sizeof usage, "accel config%s%s [--config_file CONFIG_FILE]%s", sub ? " " : " [{default,update}]",
             sub ? sub : "", sub && !strcmp(sub, "default") ? " [--mixed_precision {no,fp16,bf16}]" : "");
    const char *desc = !sub ? "Ask questions about this machine and write a config file for `accel launch`."
                     : !strcmp(sub, "default") ? "Write a basic config file without questions (never overwrites one)."
                     : "Rewrite an existing config file in the current format (legacy keys converted).";
    const char *v[NOPTS];
    int first;
    int r = cli_parse(usage, desc, OPTS, sub && !strcmp(sub, "default") ? NOPTS : 1, argc - (sub ? 1 : 0),
                      argv + (sub ? 1 : 0), v, &first, false);
    if (r == CLI_HELP) return 0;
    if (r == CLI_ERROR) return 2;
    char path[4096], err[2048];
    if (v[0]) snprintf(path, sizeof path, "%s", v[0]);
    else if (!cfg_default_path(path, sizeof path, err, sizeof err)) {
        fprintf(stderr, "accel config%s%s: error: %s\n", sub ? " " : "", sub ? sub : "", err);
        return 1;
    }
    if (!cfg_check_write_target(path, err, sizeof err)) { /* before any question is asked */
        fprintf(stderr, "accel config%s%s: error: %s\n", sub ? " " : "", sub ? sub : "", err);
        return 1;
    }
    if (!sub) {
        cv *c = wizard();
        bool ok = cfg_write(path, c, err, sizeof err);
        const cv *dt = cv_get(c, "distributed_type"), *np = cv_get(c, "num_processes");
        bool cpu_no_mpirun = dt && !strcmp(dt->s, "MULTI_CPU") && np && np->i > 1 && !cv_get(c, "mpirun_config");
        cv_free(c);
        if (!ok) {
            fprintf(stderr, "accel config: error: %s\n", err);
            return 1;
        }
        printf("accelerate configuration saved at %s\n", path);
        if (cpu_no_mpirun) /* the file is Accelerate's; its launcher reads it differently */
            printf("Note: `accel launch` starts num_processes processes from this file; Accelerate's own `accelerate "
                   "launch` starts one process for a MULTI_CPU config without mpirun (answer yes to the mpirun "
                   "question for both to start them all).\n");
        return 0;
    }
    if (!strcmp(sub, "default")) {
        const char *mp = v[1] ? v[1] : "no";
        if (strcmp(mp, "no") && strcmp(mp, "fp16") && strcmp(mp, "bf16")) {
            fprintf(stderr, "accel config default: error: argument --mixed_precision: invalid choice: '%s' "
                            "(choose from 'no', 'fp16', 'bf16')\n", mp);
            return 2;
        }
        if (access(path, F_OK) == 0) {
            printf("Configuration already exists at %s, will not override. Run `accel config` manually or pass a "
                   "different `save_location`.\n", path);
            return 1;
        }
        /* No accelerator in this build: a single CPU process, like Accelerate on a CPU-only box. */
        cv *c = cv_new(CV_MAP);
        cv_set(c, "compute_environment", cv_str("LOCAL_MACHINE"));
        cv_set(c, "debug", cv_bool(false));
        cv_set(c, "distributed_type", cv_str("NO"));
        cv_set(c, "enable_cpu_affinity", cv_bool(false));
        cv_set(c, "mixed_precision", cv_str(mp));
        cv_set(c, "num_processes", cv_int(1));
        cv_set(c, "use_cpu", cv_bool(true));
        bool ok = cfg_write(path, c, err, sizeof err);
        cv_free(c);
        if (!ok) {
            fprintf(stderr, "accel config default: error: %s\n", err);
            return 1;
        }
        printf("accelerate configuration saved at %s\n", path);
        return 0;
    }
    if (access(path, F_OK) != 0) {
        fprintf(stderr, "accel config update: error: The passed config file located at %s doesn't exist.\n", path);
        return 1;
    }
    cv *c = cfg_read(path, err, sizeof err);
    if (!c || !cfg_normalize(c, path, err, sizeof err) || !cfg_write(path, c, err, sizeof err)) {
        fprintf(stderr, "accel config update: error: %s\n", err);
        cv_free(c);
        return 1;
    }
    cv_free(c);
    printf("Successfully updated the configuration file at %s.\n", path);
    return 0;
}
