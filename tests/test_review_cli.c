/* The outside review's findings in the `accel` binary, one test each (every
 * one failed before its fix):
 *   `accel config` given an answer that is not UTF-8 said "cannot write
 *     ...: Success" (libyaml refused the string, errno was 0) for a YAML
 *     file, and for a JSON file dropped that key without a word (jansson
 *     refuses the string); the wizard now asks again, and cfg_write names
 *     the key;
 *   `accel estimate-memory`'s table (Accelerate's) counted lm_head, which
 *     Accelerate's AutoModel (LlamaModel) does not have: 325.08 MB for the
 *     seed's config where Accelerate 1.15 prints 262.58 MB; and it printed
 *     sizes from 1 PB up as "1.00 PB" where convert_bytes prints round(x, 2),
 *     "1.0 PB";
 *   `accel launch -h` said offload_param nvme "is refused" (it works). */
#include <fcntl.h>
#include <limits.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "accel/core.h"
#include "check.h"
#include "sibling_exe.h"

extern char **environ;

static char ACCEL[PATH_MAX + 32], TMP[PATH_MAX];
static char OUT[1 << 16];

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

static void read_file(const char *path, char *buf, size_t n) {
    FILE *f = fopen(path, "r");
    size_t r = f ? fread(buf, 1, n - 1, f) : 0;
    buf[r] = 0;
    if (f) fclose(f);
}

/* accel args... with stdin from `input`; its stdout and stderr together in OUT. Returns its exit code. */
static int accel(const char *input, const char *const *args) {
    char in[PATH_MAX + 8], out[PATH_MAX + 8];
    snprintf(in, sizeof in, "%s/in", TMP);
    snprintf(out, sizeof out, "%s/out", TMP);
    write_file(in, input);
    const char *argv[16] = {ACCEL};
    for (int i = 0; args[i] && i < 14; i++) argv[i + 1] = args[i];
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, in, O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid;
    int st = -1;
    if (posix_spawn(&pid, ACCEL, &fa, NULL, (char *const *)argv, environ) == 0) waitpid(pid, &st, 0);
    posix_spawn_file_actions_destroy(&fa);
    read_file(out, OUT, sizeof OUT);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* No distributed training, not CPU only, no DeepSpeed, GPU ids "\xff\xfe"
 * (then "all" when asked again), no mixed precision. */
static void check_wizard_non_utf8(const char *name) {
    char cfg[PATH_MAX + 16], buf[4096];
    snprintf(cfg, sizeof cfg, "%s/%s", TMP, name);
    const char *a[] = {"config", "--config_file", cfg, NULL};
    CHECK_MSG(accel("0\n0\nno\nno\n\xff\xfe\nall\nno\n", a) == 0, "%s: %s", name, OUT);
    CHECK_STR_CONTAINS(OUT, "Please enter UTF-8 text");
    CHECK(strstr(OUT, "Success") == NULL);
    read_file(cfg, buf, sizeof buf);
    CHECK_STR_CONTAINS(buf, "gpu_ids");
    CHECK_STR_CONTAINS(buf, "all");
    /* the input ends after the bad answer: no file, and no "Success" */
    unlink(cfg);
    CHECK(accel("0\n0\nno\nno\n\xff\xfe\n", a) == 1);
    CHECK(strstr(OUT, "Success") == NULL);
    CHECK(access(cfg, F_OK) != 0);
}

static void test_config_wizard_non_utf8(void) {
    check_wizard_non_utf8("cfg.yaml");
    check_wizard_non_utf8("cfg.json");
}

/* A config whose weights without lm_head are 4080 x 0.25 TiB (the layers)
 * + 4 TiB (the embedding) + norms = 1024.00 TiB: convert_bytes says "1.0 PB". */
static void test_estimate_memory_petabytes(void) {
    char dir[PATH_MAX + 8], path[PATH_MAX + 32];
    snprintf(dir, sizeof dir, "%s/pb", TMP);
    CHECK(mkdir(dir, 0700) == 0);
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_file(path, "{\"model_type\": \"llama\", \"hidden_size\": 65536, \"intermediate_size\": 262144, "
                     "\"num_attention_heads\": 512, \"num_key_value_heads\": 512, \"head_dim\": 128, "
                     "\"vocab_size\": 16777216, \"num_hidden_layers\": 4080, \"tie_word_embeddings\": false, "
                     "\"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-6}");
    const char *a[] = {"estimate-memory", dir, "--dtypes", "float32", NULL};
    CHECK_MSG(accel("", a) == 0, "%s", OUT);
    CHECK_STR_CONTAINS(OUT, "  1.0 PB  ");
    CHECK_STR_CONTAINS(OUT, " 4.0 PB ");
    CHECK(strstr(OUT, ".00 PB") == NULL);
    unlink(path);
    rmdir(dir);
}

/* The launcher's help tells what the library does: offload_param nvme works
 * (a shard file per rank under --offload_param_nvme_path). */
static void test_launch_help_offload_param(void) {
    const char *a[] = {"launch", "--use_deepspeed", "-h", NULL};
    CHECK(accel("", a) == 0);
    const char *h = strstr(OUT, "--offload_param_device {none,cpu,nvme}");
    CHECK(h != NULL);
    if (!h) return;
    const char *next = strstr(h + 1, "\n  --"); /* the next option */
    char line[512];
    snprintf(line, sizeof line, "%.*s", next ? (int)(next - h) : 0, h);
    CHECK_MSG(strstr(line, "refused") == NULL, "the help says: %s", line);
    CHECK_STR_CONTAINS(line, "--offload_param_nvme_path");
}

int main(void) {
    if (!sibling_exe("accel", ACCEL, sizeof ACCEL)) return 1;
    snprintf(TMP, sizeof TMP, "/tmp/accel_review_cli_XXXXXX");
    CHECK(mkdtemp(TMP) != NULL);
    setenv("HF_HOME", TMP, 1);
    RUN(test_config_wizard_non_utf8);
    RUN(test_estimate_memory_petabytes);
    RUN(test_launch_help_offload_param);
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf %s", TMP);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", TMP);
    return check_summary();
}
