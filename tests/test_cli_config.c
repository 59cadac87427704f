/* `accel config` (default, update, interactive through a pipe), config-file
 * validation through `accel launch`, a real Accelerate-written YAML and a JSON
 * file, and the fields of `accel env`. Runs build/bin/accel next to itself. */
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "accel/core.h"
#include "check.h"
#include "core/afile.h"
#include "cli_run.h"
#include "sibling_exe.h"

static char ACCEL[PATH_MAX + 32], TMP[PATH_MAX], CFG[PATH_MAX + 64];
static char OUT[1 << 16], ERR[1 << 16];

static void spit(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

static const cli_io IO = {TMP, OUT, ERR, sizeof OUT, sizeof ERR};

/* Runs accel with args, stdin from `input` (or nothing). */
static int run(const char *const *args, const char *input) {
    char in[PATH_MAX + 16];
    snprintf(in, sizeof in, "%s/in", TMP);
    spit(in, input ? input : "");
    return cli_run(&IO, ACCEL, args, NULL, in);
}

static void test_default_and_update(void) {
    const char *d[] = {"config", "default", "--mixed_precision", "bf16", NULL};
    CHECK(run(d, NULL) == 0);
    char path[PATH_MAX + 64], buf[4096];
    snprintf(path, sizeof path, "%s/accelerate/default_config.yaml", TMP);
    CHECK_STR_CONTAINS(OUT, "accelerate configuration saved at");
    CHECK_STR_CONTAINS(OUT, path);
    cli_slurp(path, buf, sizeof buf);
    CHECK(strcmp(buf, "compute_environment: LOCAL_MACHINE\ndebug: false\ndistributed_type: 'NO'\n"
                      "enable_cpu_affinity: false\nmixed_precision: bf16\nnum_processes: 1\nuse_cpu: true\n") == 0);
    CHECK(run(d, NULL) == 1); /* never overwrites */
    CHECK_STR_CONTAINS(OUT, "will not override");
    /* update: legacy fp16 key normalised, sorted, defaults filled */
    spit(CFG, "fp16: true\nnum_processes: 2\ndistributed_type: MULTI_CPU\nmain_process_ip: null\n");
    const char *u[] = {"config", "update", "--config-file", CFG, NULL};
    CHECK(run(u, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "Successfully updated the configuration file at");
    cli_slurp(CFG, buf, sizeof buf);
    CHECK(strcmp(buf, "compute_environment: LOCAL_MACHINE\ndebug: false\ndistributed_type: MULTI_CPU\n"
                      "enable_cpu_affinity: false\nmixed_precision: fp16\nnum_processes: 2\nuse_cpu: false\n") == 0);
    const char *missing[] = {"config", "update", "--config_file", "/nonexistent.yaml", NULL};
    CHECK(run(missing, NULL) == 1);
    CHECK_STR_CONTAINS(ERR, "doesn't exist");
}

static void test_interactive(void) {
    /* This machine, multi-CPU, 1 machine, no debug, no mpirun, no DeepSpeed, no FSDP, 4 processes, bf16 (by text) */
    const char *a[] = {"config", "--config_file", CFG, NULL};
    CHECK(run(a, "0\nmulti-CPU\n\nno\nno\nno\nno\n4\nbf16\n") == 0);
    CHECK_STR_CONTAINS(OUT, "Do you want accelerate to launch mpirun? [yes/NO]: ");
    CHECK_STR_CONTAINS(OUT, "How many processes should be used for distributed training? [1]:");
    /* Accelerate's launcher starts one process from this file: said once it is saved */
    CHECK_STR_CONTAINS(OUT, "Accelerate's own `accelerate launch` starts one process for a MULTI_CPU config without "
                            "mpirun");
    char buf[4096];
    cli_slurp(CFG, buf, sizeof buf);
    CHECK_STR_CONTAINS(buf, "distributed_type: MULTI_CPU\n");
    CHECK_STR_CONTAINS(buf, "num_processes: 4\n");
    CHECK_STR_CONTAINS(buf, "mixed_precision: bf16\n");
    CHECK_STR_CONTAINS(buf, "use_cpu: true\n");
    CHECK_STR_CONTAINS(buf, "downcast_bf16: 'no'\n");
    CHECK_STR_CONTAINS(buf, "tpu_env: []\n");
    /* fp8 (issue #14): cluster.py's TE questions, then a launch that reads the file back */
    CHECK(run(a, "0\nmulti-CPU\n\nno\nno\nno\nno\n2\nfp8\nte\nyes\n1\n\nE4M3\n16\n\nyes\nno\nno\nyes\n") == 0);
    cli_slurp(CFG, buf, sizeof buf);
    CHECK_STR_CONTAINS(buf, "mixed_precision: fp8\n");
    CHECK_STR_CONTAINS(buf, "  backend: TE\n");
    CHECK_STR_CONTAINS(buf, "  amax_history_length: 16\n");
    CHECK_STR_CONTAINS(buf, "  amax_compute_algorithm: max\n");
    CHECK_STR_CONTAINS(buf, "  fp8_format: E4M3\n");
    CHECK_STR_CONTAINS(buf, "  margin: 1\n");
    CHECK_STR_CONTAINS(buf, "  use_autocast_during_eval: true\n");
    const char *l[] = {"launch", "--config_file", CFG, "--num_processes", "1", "/usr/bin/env", NULL};
    CHECK(run(l, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "ACCELERATE_FP8_AMAX_HISTORY_LEN=16\n");
    CHECK_STR_CONTAINS(OUT, "ACCELERATE_FP8_OVERRIDE_WGRAD=True\n");
    CHECK_STR_CONTAINS(OUT, "ACCELERATE_FP8_BACKEND=TE\n");
    /* a bad answer is asked again; DeepSpeed stage 3 */
    CHECK(run(a, "0\n1\n1\nmaybe\nno\nno\nyes\n3\n2\n2\nno\n") == 0);
    CHECK_STR_CONTAINS(OUT, "Please enter yes or no.");
    cli_slurp(CFG, buf, sizeof buf);
    CHECK_STR_CONTAINS(buf, "distributed_type: DEEPSPEED\n");
    CHECK_STR_CONTAINS(buf, "  zero_stage: 3\n");
    CHECK_STR_CONTAINS(buf, "  gradient_accumulation_steps: 2\n");
    CHECK(run(a, "0\n1\n") == 1); /* input ends */
    /* mpirun: Accelerate's mpirun_config, ~ expanded as os.path.expanduser */
    CHECK(run(a, "0\nmulti-CPU\n\nno\nyes\n~/hosts\nno\nno\n2\nno\n") == 0);
    cli_slurp(CFG, buf, sizeof buf);
    char want[PATH_MAX + 64];
    snprintf(want, sizeof want, "mpirun_config:\n  mpirun_hostfile: %s/hosts\n", getenv("HOME") ? getenv("HOME") : "~");
    CHECK_STR_CONTAINS(buf, want);
    CHECK_STR_CONTAINS(buf, "num_processes: 2\n");
    CHECK(!strstr(OUT, "Note: "));
    /* Two machines: the answer is the total, written as given (as Accelerate
     * writes it, and as accel launch reads it); it was multiplied by the
     * machines (4 became 8). One that is not a multiple of the machines,
     * which accel launch refuses, is asked again. */
    CHECK(run(a, "0\nmulti-CPU\n2\n0\n127.0.0.1\n29600\n\nno\nno\nno\nno\n3\n4\nno\n") == 0);
    CHECK_STR_CONTAINS(OUT, "Please enter a multiple of the number of machines (2)");
    cli_slurp(CFG, buf, sizeof buf);
    CHECK_STR_CONTAINS(buf, "num_machines: 2\n");
    CHECK_STR_CONTAINS(buf, "num_processes: 4\n");
}

/* A --config_file that is a directory: the wizard asked every question and
 * only then failed on the rename; `default` said a configuration already
 * existed there. Both now refuse it first, naming it, as `update` does. */
static void test_config_file_is_directory(void) {
    const char *wizard[] = {"config", "--config_file", TMP, NULL};
    CHECK(run(wizard, "0\n0\nno\nno\nno\n\n") == 1);
    CHECK_STR_CONTAINS(ERR, "is a directory, not a config file");
    CHECK_STR_CONTAINS(ERR, TMP);
    CHECK(!strstr(OUT, "In which compute environment"));
    const char *dflt[] = {"config", "default", "--config_file", TMP, NULL};
    CHECK(run(dflt, "") == 1);
    CHECK_STR_CONTAINS(ERR, "is a directory, not a config file");
    CHECK(!strstr(OUT, "already exists"));
}

static void launch_rejects(const char *yaml, const char *name, const char *want) {
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", TMP, name);
    spit(path, yaml);
    const char *a[] = {"launch", "--config_file", path, "/bin/true", NULL};
    CHECK(run(a, NULL) == 2);
    CHECK_STR_CONTAINS(ERR, want);
}

static void test_rejections(void) {
    launch_rejects("distributed_type: NO\nfoo: 1\nbar: 2\n", "u.yaml", "had unknown keys (['bar', 'foo'])");
    launch_rejects("distributed_type: MULTI_CPU\nnum_processes: many\n", "v.yaml",
                   "bad value for `num_processes`: 'many'");
    launch_rejects("distributed_type: MULTI_TPU\n", "w.yaml", "bad value for `distributed_type`: 'MULTI_TPU'");
    launch_rejects("num_processes: 2\n", "x.yaml", "A `distributed_type` must be specified in the config file (");
    /* an empty file (Accelerate: a traceback, 'NoneType' object has no attribute 'get') says it is empty */
    launch_rejects("", "empty.yaml", "empty.yaml is empty: a `distributed_type` must be specified in it.");
    launch_rejects("{}\n", "empty.json", "empty.json is empty: a `distributed_type` must be specified in it.");
    launch_rejects("distributed_type: MULTI_CPU\n", "y.yaml", "You need to manually pass in `--num_processes`");
    launch_rejects("distributed_type: [unclosed\n", "z.yaml", "could not be parsed");
    /* a second document used to be dropped in silence (the job ran on 2 processes, not 7) */
    launch_rejects("distributed_type: MULTI_CPU\nnum_processes: 2\n---\nnum_processes: 7\n", "multi.yaml",
                   "multi.yaml could not be parsed: line 3: expected a single document in the stream, but found "
                   "another document");
    launch_rejects("distributed_type: NO\n---\n", "multi_empty.yaml", "multi_empty.yaml could not be parsed");
    /* fp8_config (issue #14): keys with or without fp8_, and their types */
    launch_rejects("distributed_type: MULTI_CPU\nmixed_precision: fp8\nfp8_config:\n  amax_histroy_len: 16\n", "f1.yaml",
                   "unknown key `fp8_config.amax_histroy_len` (known: backend, use_autocast_during_eval,");
    launch_rejects("distributed_type: MULTI_CPU\nmixed_precision: fp8\nfp8_config:\n  backend: TE\n  optimization_level: O2\n",
                   "f1b.yaml", "has `fp8_config.optimization_level`, MS-AMP's optimization level: MS-AMP is no fp8 "
                   "backend any more");
    /* read only under fp8 (an older config's MS-AMP keys beside mixed_precision no run, as under Accelerate 1.16),
     * and then by the flag's fp8 too */
    char f1c[PATH_MAX + 64];
    snprintf(f1c, sizeof f1c, "%s/f1c.yaml", TMP);
    spit(f1c, "distributed_type: 'NO'\nmixed_precision: 'no'\nfp8_config:\n  backend: MSAMP\n  optimization_level: O2\n");
    const char *msamp[] = {"launch", "--config_file", f1c, "/bin/true", NULL};
    CHECK_MSG(run(msamp, NULL) == 0, "%s", ERR);
    const char *msamp_fp8[] = {"launch", "--config_file", f1c, "--mixed_precision", "fp8", "/bin/true", NULL};
    CHECK(run(msamp_fp8, NULL) == 2);
    CHECK_STR_CONTAINS(ERR, "bad value for `fp8_config.backend`: 'MSAMP'");
    launch_rejects("distributed_type: MULTI_CPU\nmixed_precision: fp8\nfp8_config:\n  fp8_margin: two\n", "f2.yaml",
                   "bad value for `fp8_config.fp8_margin`: 'two' (expected an integer)");
    launch_rejects("distributed_type: MULTI_CPU\nmixed_precision: fp8\nfp8_config:\n  fp8_format: E3M4\n", "f3.yaml",
                   "bad value for `fp8_config.fp8_format`: 'E3M4' (expected one of HYBRID E4M3 E5M2)");
    launch_rejects("distributed_type: MULTI_CPU\nmixed_precision: fp8\nfp8_config:\n  override_linear_precision: [true, false]\n", "f4.yaml",
                   "bad value for `fp8_config.override_linear_precision`: [True, False] (expected a list of three "
                   "booleans");
    launch_rejects("distributed_type: MULTI_CPU\nmixed_precision: fp8\nfp8_config:\n  use_autocast_during_eval: maybe\n", "f5.yaml",
                   "bad value for `fp8_config.use_autocast_during_eval`: 'maybe' (expected true or false)");
    /* hostile values: integers at the int64 limits and floats where integers go */
    launch_rejects("distributed_type: MULTI_CPU\nnum_processes: 9223372036854775807\n", "i1.yaml",
                   "invalid value '9223372036854775807' (expected an integer from -1 to 2147483647)");
    launch_rejects("distributed_type: MULTI_CPU\nnum_processes: -9223372036854775808\n", "i2.yaml",
                   "invalid value '-9223372036854775808' (expected an integer from -1 to 2147483647)");
    launch_rejects("distributed_type: MULTI_CPU\nnum_processes: 2.0\n", "i3.yaml",
                   "bad value for `num_processes`: 2.0 (expected an integer)");
    /* "billion laughs": nine levels of nine aliases each would be 9^9 strings
     * if aliases were expanded; the reader refuses the first alias */
    char laughs[1024] = "distributed_type: MULTI_CPU\nl0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n";
    for (int i = 1; i < 10; i++) {
        size_t n = strlen(laughs);
        snprintf(laughs + n, sizeof laughs - n, "l%d: &l%d [*l%d, *l%d, *l%d, *l%d, *l%d, *l%d, *l%d, *l%d, *l%d]\n",
                 i, i, i - 1, i - 1, i - 1, i - 1, i - 1, i - 1, i - 1, i - 1, i - 1);
    }
    launch_rejects(laughs, "laughs.yaml", "laughs.yaml could not be parsed: line 3: unsupported YAML (anchors/aliases?)");
    const char *a[] = {"launch", "--config_file", "/nonexistent.yaml", "/bin/true", NULL};
    CHECK(run(a, NULL) == 2);
    CHECK_STR_CONTAINS(ERR, "does not exist");
    /* one that exists but is no file says so (a FIFO used to block launch) */
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/fifo.yaml", TMP);
    CHECK(mkfifo(path, 0644) == 0);
    const char *b[] = {"launch", "--config_file", path, "/bin/true", NULL};
    CHECK(run(b, NULL) == 2);
    CHECK_STR_CONTAINS(ERR, "fifo.yaml` is a FIFO, not a config file.");
    const char *c[] = {"launch", "--config_file", TMP, "/bin/true", NULL};
    CHECK(run(c, NULL) == 2);
    CHECK_STR_CONTAINS(ERR, "is a directory, not a config file.");
    unlink(path);
}

/* Text of `prefix` + `open` n times + `close` n times + `suffix` (caller frees). */
static char *nested(const char *prefix, const char *open, const char *close, int n, const char *suffix) {
    size_t lo = strlen(open), lc = strlen(close), lp = strlen(prefix);
    char *t = malloc(lp + (lo + lc) * (size_t)n + strlen(suffix) + 1), *p = t;
    memcpy(p, prefix, lp);
    p += lp;
    for (int i = 0; i < n; i++, p += lo) memcpy(p, open, lo);
    for (int i = 0; i < n; i++, p += lc) memcpy(p, close, lc);
    strcpy(p, suffix);
    return t;
}

/* Issue #16: a config nested 50,000 deep crashed the launcher (recursion);
 * 80k keys (1 MB) took seconds (a duplicate check per key, quadratic). Depth and
 * size are bounded, parsing is n log n, and duplicate keys keep the last value
 * at the first key's place (PyYAML's dict). */
static void test_config_limits(void) {
    char *deep = nested("distributed_type: MULTI_CPU\nfsdp_config: ", "[", "]", 50000, "\n");
    launch_rejects(deep, "deep.yaml", "line 2: nested deeper than 64 levels");
    free(deep);
    /* block style: a mapping per indented line, 500 deep */
    deep = malloc(500 * 512);
    size_t n = (size_t)sprintf(deep, "distributed_type: MULTI_CPU\n");
    for (int i = 0; i < 500; i++) n += (size_t)sprintf(deep + n, "%*sk%d:\n", i, "", i);
    launch_rejects(deep, "deep_block.yaml", "line 66: nested deeper than 64 levels");
    free(deep);
    deep = nested("{\"distributed_type\": \"MULTI_CPU\", \"fsdp_config\": ", "[", "]", 100, "}");
    launch_rejects(deep, "deep.json", "nested deeper than 64 levels");
    free(deep);
    /* linear in the number of keys: 4x the keys may take at most 8x the time
     * (quadratic parsing took 16x; a ratio, so a loaded machine cannot decide it) */
    size_t cap = 1 << 21;
    char *wide = malloc(cap);
    const char *e[] = {"env", "--config_file", CFG, NULL};
    double took[2];
    for (int round = 0; round < 2; round++) {
        int keys = round ? 80000 : 20000;
        size_t len = (size_t)snprintf(wide, cap, "distributed_type: MULTI_CPU\nnum_processes: 2\ndeepspeed_config:\n");
        for (int i = 0; i < keys; i++) len += (size_t)snprintf(wide + len, cap - len, "  k%d: %d\n", i, i % 10);
        snprintf(CFG, sizeof CFG, "%s/wide.yaml", TMP);
        spit(CFG, wide);
        double t0 = accel_now_seconds();
        CHECK(run(e, NULL) == 0);
        took[round] = accel_now_seconds() - t0;
    }
    CHECK_MSG(took[1] < 8 * took[0], "20k keys took %.2f s, 80k keys %.2f s: not linear", took[0], took[1]);
    CHECK_STR_CONTAINS(OUT, "\t- deepspeed_config: {'k0': 0, 'k1': 1, 'k10': 0, ");
    spit(CFG, "distributed_type: MULTI_CPU\nnum_processes: 2\nnum_processes: 3\n"
              "fsdp_config:\n  b: 1\n  a: 2\n  b: 3\n");
    CHECK(run(e, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "\t- distributed_type: MULTI_CPU\n\t- num_processes: 3\n\t- fsdp_config: {'a': 2, 'b': 3}\n");
    for (size_t i = 0; i < cap - 1; i++) wide[i] = i % 64 ? ' ' : '\n';
    wide[cap - 1] = 0;
    snprintf(CFG, sizeof CFG, "%s/huge.yaml", TMP);
    spit(CFG, wide);
    free(wide);
    const char *h[] = {"launch", "--config_file", CFG, "/bin/true", NULL};
    CHECK(run(h, NULL) == 2);
    CHECK_STR_CONTAINS(ERR, "it is 2097151 bytes, over the limit of 1048576");
    snprintf(CFG, sizeof CFG, "%s/cfg.yaml", TMP);
}

static void test_accelerate_yaml_and_json(void) {
    /* ClusterConfig (accelerate/commands/config/config_args.py): as written by the Python wizard (4 GPUs, fp16) */
    spit(CFG, "compute_environment: LOCAL_MACHINE\ndebug: false\ndistributed_type: MULTI_GPU\ndowncast_bf16: 'no'\n"
              "enable_cpu_affinity: false\ngpu_ids: all\nmachine_rank: 0\nmain_training_function: main\n"
              "mixed_precision: fp16\nnum_machines: 1\nnum_processes: 4\nrdzv_backend: static\nsame_network: true\n"
              "tpu_env: []\ntpu_use_cluster: false\ntpu_use_sudo: false\nuse_cpu: false\n");
    const char *e[] = {"env", "--config_file", CFG, NULL};
    CHECK(run(e, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "- `Accel` config passed:\n");
    CHECK_STR_CONTAINS(OUT, "\t- distributed_type: MULTI_GPU\n");
    CHECK_STR_CONTAINS(OUT, "\t- num_processes: 4\n");
    CHECK_STR_CONTAINS(OUT, "\t- same_network: True\n");
    CHECK_STR_CONTAINS(OUT, "\t- tpu_env: []\n");
    const char *l[] = {"launch", "--config_file", CFG, "/bin/sh", "-c", "echo ws=$WORLD_SIZE mp=$ACCEL_MIXED_PRECISION", NULL};
    CHECK(run(l, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "ws=4 mp=fp16");
    char js[PATH_MAX + 64];
    snprintf(js, sizeof js, "%s/c.json", TMP);
    spit(js, "{\"distributed_type\": \"MULTI_CPU\", \"num_processes\": 2, \"mixed_precision\": \"bf16\"}");
    const char *j[] = {"launch", "--config_file", js, "/bin/sh", "-c", "echo ws=$WORLD_SIZE mp=$ACCEL_MIXED_PRECISION", NULL};
    CHECK(run(j, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "ws=2 mp=bf16");
    /* one document with explicit start and end markers is one document */
    spit(CFG, "---\ndistributed_type: MULTI_CPU\nnum_processes: 3\n...\n");
    CHECK(run(l, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "ws=3 mp=no");
}

static void test_env_fields(void) {
    const char *e[] = {"env", NULL};
    CHECK(run(e, NULL) == 0);
    const char *want[] = {"\nCopy-and-paste the text below in your GitHub issue\n\n- `Accel` version: ",
                          "- Platform: Linux", "- `accel` bash location: /", "- Compiler: ", "- Build flags: ",
                          "- BLAS: OpenBLAS", "- BLAS threads: ", "- MPI available: ", "- CUDA available: ",
                          "- NCCL available: ", "- Accel accelerator: ", "- CPU: ", "- System RAM: ", " GB\n",
                          "- `Accel` default config:\n"};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) CHECK_STR_CONTAINS(OUT, want[i]);
    /* Issue #13: the build's real flags (the line was empty), and what accel can
     * use: a loadable libcudart is no CUDA support in a build without a CUDA backend. */
    const char *flags = strstr(OUT, "- Build flags: ");
    CHECK(flags && strstr(flags, "-Wall") && strstr(flags, "-Wall") < strchr(flags, '\n'));
    /* the cuda plug-in says what it finds, or why it did not load (no GPU on a CI machine) */
    if (access("/dev/nvidia0", F_OK) != 0) {
        CHECK_STR_CONTAINS(OUT, "- CUDA available: False (");
        CHECK_STR_CONTAINS(OUT, "- NCCL available: False (");
    }
    CHECK_STR_CONTAINS(OUT, "- GPUs on this machine: ");
    /* the device an accelerator made here takes (it said CPU whatever the
     * machine and the environment held): the cpu without a GPU, the one
     * ACCEL_DEFAULT_DEVICE names, and why none when a variable is refused */
    if (access("/dev/nvidia0", F_OK) != 0) CHECK_STR_CONTAINS(OUT, "- Accel accelerator: CPU\n");
    setenv("ACCEL_DEFAULT_DEVICE", "meta", 1);
    CHECK(run(e, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "- Accel accelerator: meta\n");
    unsetenv("ACCEL_DEFAULT_DEVICE");
    setenv("ACCEL_USE_CPU", "maybe", 1);
    CHECK(run(e, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "- Accel accelerator: none (the environment: ACCEL_USE_CPU=maybe is not a boolean");
    unsetenv("ACCEL_USE_CPU");
    /* a config file given but missing is an error, not "Not found" (a typo
     * looked like no config); nothing is printed */
    const char *missing[] = {"env", "--config_file", "/nonexistent/cfg.yaml", NULL};
    CHECK(run(missing, NULL) == 1);
    CHECK_STR_CONTAINS(ERR, "The passed configuration file `/nonexistent/cfg.yaml` does not exist");
    CHECK(OUT[0] == '\0');
    /* a directory is no config file either (Accelerate's os.path.isfile); it printed the report, exit 0 */
    const char *dir[] = {"env", "--config_file", TMP, NULL};
    CHECK(run(dir, NULL) == 1);
    CHECK_STR_CONTAINS(ERR, "is a directory");
    CHECK(OUT[0] == '\0');
    const char *h[] = {"env", "--help", NULL};
    CHECK(run(h, NULL) == 0);
    const char *c[] = {"config", "--help", NULL};
    CHECK(run(c, NULL) == 0);
    CHECK_STR_CONTAINS(OUT, "--config_file");
}

/* `accel config update` beside the user's own <config>.tmp (not made by
 * accel: no mark), `mine`: refused, the error naming it; it keeps every
 * byte and the config its text (the writer truncated it, then renamed it
 * over the config). */
static void check_config_user_tmp_kept(const char *what, const char *mine) {
    char tmp[PATH_MAX + 80], buf[4096];
    spit(CFG, "distributed_type: MULTI_CPU\nnum_processes: 2\n");
    snprintf(tmp, sizeof tmp, "%s.tmp", CFG);
    spit(tmp, mine);
    const char *u[] = {"config", "update", "--config-file", CFG, NULL};
    CHECK_MSG(run(u, NULL) == 1, "%s: updated through the user's %s", what, tmp);
    CHECK_STR_CONTAINS(ERR, "accel config update: error: cannot write ");
    CHECK_STR_CONTAINS(ERR, tmp);
    CHECK_STR_CONTAINS(ERR, "is not a scratch file of this user's accel");
    cli_slurp(tmp, buf, sizeof buf);
    CHECK_MSG(!strcmp(buf, mine), "%s: the user's tmp now %s", what, buf);
    cli_slurp(CFG, buf, sizeof buf);
    CHECK_MSG(!strcmp(buf, "distributed_type: MULTI_CPU\nnum_processes: 2\n"), "%s: the config now %s", what, buf);
    CHECK(unlink(tmp) == 0);
}

static void test_config_keeps_user_tmp(void) {
    check_config_user_tmp_kept("3 bytes", "abc");
    check_config_user_tmp_kept("empty", "");
}

/* A <config>.tmp left by an accel writer killed -9 mid-write (marked as
 * accel's) is reused: the update succeeds, leaves no tmp, and the config
 * keeps its 0600 without the mark. */
static void test_config_reuses_killed_writers_tmp(void) {
    char tmp[PATH_MAX + 80], buf[4096];
    spit(CFG, "distributed_type: MULTI_CPU\nnum_processes: 2\n");
    CHECK(chmod(CFG, 0600) == 0);
    snprintf(tmp, sizeof tmp, "%s.tmp", CFG);
    pid_t kid = fork();
    if (kid == 0) {
        accel__afile f;
        if (accel__afile_open(&f, CFG) != ACCEL_OK || accel__afile_write(&f, "num_", 4) != ACCEL_OK) _exit(1);
        raise(SIGKILL);
    }
    int ws = 0;
    CHECK(waitpid(kid, &ws, 0) == kid && WIFSIGNALED(ws));
    CHECK(access(tmp, F_OK) == 0);
    const char *u[] = {"config", "update", "--config-file", CFG, NULL};
    CHECK_MSG(run(u, NULL) == 0, "%s", ERR);
    CHECK(access(tmp, F_OK) != 0);
    cli_slurp(CFG, buf, sizeof buf);
    CHECK_STR_CONTAINS(buf, "enable_cpu_affinity: false\n"); /* the update's defaults, filled */
    struct stat sb;
    CHECK_MSG(stat(CFG, &sb) == 0 && (sb.st_mode & 07777) == 0600, "the config's mode is now %o", (unsigned)sb.st_mode);
}

/* Without HOME (a service: systemd, cron), the default config lives in the
 * passwd entry's home, where Python's os.path.expanduser finds ~ and so
 * Accelerate's config looks (accel wrote /.cache/huggingface/...); with no
 * home at all, an error saying so, nothing written. The passwd entry is
 * tests/passwd_shim.c's (home: $ACCEL_TEST_PW_DIR). */
static void test_default_path_without_home(void) {
    const char *shim = getenv("ACCEL_TEST_PASSWD_SHIM");
    CHECK_MSG(shim != NULL, "ACCEL_TEST_PASSWD_SHIM (tests/passwd_shim.c's path) is not set");
    if (!shim) return;
    char home[PATH_MAX + 16], preload[PATH_MAX + 16], pw_dir[PATH_MAX + 64], want[PATH_MAX + 96], asan[512];
    snprintf(home, sizeof home, "%s/pwhome", TMP);
    CHECK(mkdir(home, 0700) == 0);
    snprintf(preload, sizeof preload, "LD_PRELOAD=%s", shim);
    snprintf(pw_dir, sizeof pw_dir, "ACCEL_TEST_PW_DIR=%s", home);
    const char *a = getenv("ASAN_OPTIONS"); /* the shim comes before an ASan runtime */
    snprintf(asan, sizeof asan, "ASAN_OPTIONS=%s%sverify_asan_link_order=0", a ? a : "", a && *a ? ":" : "");
    char *saved[3];
    const char *vars[3] = {"HOME", "HF_HOME", "XDG_CACHE_HOME"};
    for (int i = 0; i < 3; i++) {
        saved[i] = getenv(vars[i]) ? strdup(getenv(vars[i])) : NULL;
        unsetenv(vars[i]);
    }
    const char *d[] = {"config", "default", NULL};
    const cli_io io = {TMP, OUT, ERR, sizeof OUT, sizeof ERR};
    const char *env[] = {preload, pw_dir, asan, NULL};
    CHECK_MSG(cli_run(&io, ACCEL, d, env, NULL) == 0, "%s", ERR);
    snprintf(want, sizeof want, "%s/.cache/huggingface/accelerate/default_config.yaml", home);
    CHECK_MSG(access(want, F_OK) == 0, "%s not written: %s%s", want, OUT, ERR);
    const char *no_home[] = {preload, asan, NULL}; /* no passwd entry either */
    CHECK(cli_run(&io, ACCEL, d, no_home, NULL) == 1);
    CHECK_STR_CONTAINS(ERR, "no home directory");
    CHECK(access("/.cache/huggingface/accelerate/default_config.yaml", F_OK) != 0);
    for (int i = 0; i < 3; i++) {
        if (saved[i]) setenv(vars[i], saved[i], 1);
        free(saved[i]);
    }
}

int main(void) {
    if (!sibling_exe("accel", ACCEL, sizeof ACCEL)) return 1;
    if (!cli_scratch("config", TMP, sizeof TMP)) return 1;
    snprintf(CFG, sizeof CFG, "%s/cfg.yaml", TMP);
    RUN(test_env_fields); /* first: no default config yet */
    CHECK_STR_CONTAINS(OUT, "");
    RUN(test_default_and_update);
    RUN(test_interactive);
    RUN(test_config_file_is_directory);
    RUN(test_rejections);
    RUN(test_accelerate_yaml_and_json);
    RUN(test_config_limits);
    RUN(test_config_keeps_user_tmp);
    RUN(test_config_reuses_killed_writers_tmp);
    RUN(test_default_path_without_home);
    cli_scratch_remove(TMP);
    return check_summary();
}
